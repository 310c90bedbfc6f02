//! Recovery benchmark: the keyed count of DESIGN.md section 5 with a large
//! state (default 1 M keys), one injected failure, and a restart from the
//! last completed checkpoint.
//!
//! It prints, per run and as medians: the job report's recovery time (from
//! the failure report to the new generation's start), the time from the
//! injected failure to the first record processed by the new generation
//! (which includes restoring the keyed state and replaying the source from
//! the checkpoint), the restored checkpoint's size and the job's total
//! throughput. Every run checks that the per-key counts are exact despite
//! the failure, and fails otherwise. It asserts nothing about speed.
//!
//! With `--backend spilling` (cargo feature `spill`) the count keeps its
//! state in the spilling backend, `--memory-entries` keys per subtask in
//! memory and the rest on local disk under `--dir`, and the restore reads
//! the checkpoint's chains back into that backend's disk table (issue 16:
//! recovery at 10 M keys under 2 s, on both backends).
//!
//! Known gap: the time to restore the state alone (decoding the parts into
//! `KeyedState`) is not reported separately; the job report has no such
//! figure, and it is included in "failure to processing again".
//!
//! Run: `cargo bench -p snapflow --bench recovery -- --parallelism 2`.

mod support;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use snapflow::job::{Job, JobConfig, JobReport, KeyedBackend, RestartStrategy};
use snapflow::runtime::BoxError;
use snapflow::source::{
    split_range, Source, SourceError, SourceFactory, SourcePoll, SourcePosition,
};

use support::{
    bench_main, expected_count, median, number, positive, CargoBench, Count, DiscardSink,
};

/// Where the count keeps its keyed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    /// In memory (the default backend).
    Memory,
    /// The spilling backend, with this many keys per subtask in memory.
    Spilling { memory_entries: usize },
}

/// The keyed count with a large state, one injected failure and a
/// restart from the last completed checkpoint: the recovery times, per
/// run and as medians.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "recovery", args_override_self = true)]
struct Options {
    /// Records.
    #[arg(long, value_name = "N", value_parser = number::<u64>, default_value_t = 20_000_000)]
    records: u64,
    /// Distinct keys.
    #[arg(long, value_name = "K", value_parser = positive::<u64>, default_value_t = 1_000_000)]
    keys: u64,
    /// The record at which the job fails once (below --records); late
    /// enough that checkpoints have completed before it.
    #[arg(long, value_name = "I", value_parser = number::<u64>, default_value_t = 16_000_000)]
    fail_at: u64,
    /// Parallelism of every operator.
    #[arg(long, value_name = "P", value_parser = positive::<usize>, default_value_t = 2)]
    parallelism: usize,
    /// Time between periodic checkpoints.
    #[arg(long = "checkpoint-interval-ms", value_name = "MS", value_parser = number::<u64>,
          default_value_t = 200)]
    interval_ms: u64,
    /// Runs (medians are printed).
    #[arg(long, value_name = "R", value_parser = positive::<usize>, default_value_t = 3)]
    runs: usize,
    /// Where the keyed state lives: memory or spilling.
    #[arg(long, value_name = "memory|spilling", value_parser = backend, default_value = "memory")]
    backend: Backend,
    /// Keys per subtask the spilling backend keeps in memory (needs
    /// --backend spilling) [default: a tenth of the keys].
    #[arg(long, value_name = "M", value_parser = number::<usize>)]
    memory_entries: Option<usize>,
    /// Where each run's checkpoints (and spilled state) go: a fresh
    /// temporary directory in it per run [default: the system's temporary
    /// directory].
    #[arg(long, value_name = "DIR", default_value_os_t = std::env::temp_dir(), hide_default_value = true)]
    dir: std::path::PathBuf,
    #[command(flatten)]
    cargo: CargoBench,
}

/// `--backend`: memory or spilling (its memory entries are settled later).
fn backend(text: &str) -> Result<Backend, String> {
    match text {
        "memory" => Ok(Backend::Memory),
        "spilling" => Ok(Backend::Spilling { memory_entries: 0 }),
        other => Err(format!("memory or spilling, not {other:?}")),
    }
}

/// Checks the rules between flags and gives the spilling backend its
/// memory entries.
fn settle(mut options: Options) -> Result<Options, String> {
    if options.fail_at >= options.records {
        return Err("--fail-at must be below --records".to_string());
    }
    match &mut options.backend {
        Backend::Spilling { memory_entries } => {
            // A tenth of the keys in memory, as the spill bench's runs.
            *memory_entries = options
                .memory_entries
                .unwrap_or((options.keys / 10).max(1) as usize);
        }
        Backend::Memory if options.memory_entries.is_some() => {
            return Err("--memory-entries needs --backend spilling".to_string());
        }
        Backend::Memory => {}
    }
    Ok(options)
}

/// A record: its index in the sequence and the generation of the reader
/// that produced it, so the count can tell replayed records apart from
/// the failed generation's last ones.
type Record = (u64, u64);

/// The sequence 0..records, like the keyed count's (a contiguous share per
/// subtask), tagging each record with its split's generation: how many
/// times `parallelism` splits were made before it.
struct GenerationSource {
    records: u64,
    splits_made: Arc<AtomicU64>,
}

impl SourceFactory for GenerationSource {
    type Source = GenerationSplit;

    fn split(&self, subtask: usize, parallelism: usize) -> Result<GenerationSplit, SourceError> {
        let range = split_range(0..self.records, subtask, parallelism)?;
        let made = self.splits_made.fetch_add(1, Ordering::Relaxed);
        Ok(GenerationSplit {
            next: range.start,
            end: range.end,
            generation: made / parallelism as u64,
        })
    }
}

struct GenerationSplit {
    next: u64,
    end: u64,
    generation: u64,
}

impl Source for GenerationSplit {
    type Item = Record;

    fn poll_batch(
        &mut self,
        out: &mut Vec<Record>,
        max_records: usize,
    ) -> Result<SourcePoll, SourceError> {
        if self.next >= self.end {
            return Ok(SourcePoll::Ended);
        }
        let stop = self.end.min(self.next.saturating_add(max_records as u64));
        let generation = self.generation;
        out.extend((self.next..stop).map(|index| (index, generation)));
        let produced = (stop - self.next) as usize;
        self.next = stop;
        Ok(SourcePoll::Produced(produced))
    }

    fn position(&self) -> SourcePosition {
        SourcePosition::from_index(self.next)
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), SourceError> {
        self.next = position.to_index()?;
        Ok(())
    }
}

/// The injected failure and when processing started again.
#[derive(Default)]
struct Failure {
    fired: AtomicBool,
    failed_at: Mutex<Option<Instant>>,
    resumed_at: Mutex<Option<Instant>>,
}

impl Failure {
    /// Fails the record `fail_at` of the first generation, once; notes the
    /// first record of a later generation.
    fn on_record(&self, (index, generation): Record, fail_at: u64) -> Result<(), BoxError> {
        if generation > 0 {
            let mut resumed = self.resumed_at.lock().unwrap_or_else(|e| e.into_inner());
            resumed.get_or_insert_with(Instant::now);
        } else if index == fail_at && !self.fired.swap(true, Ordering::Relaxed) {
            *self.failed_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
            return Err(format!("injected failure at record {index}").into());
        }
        Ok(())
    }

    fn failure_to_processing(&self) -> Option<Duration> {
        let failed = (*self.failed_at.lock().unwrap_or_else(|e| e.into_inner()))?;
        let resumed = (*self.resumed_at.lock().unwrap_or_else(|e| e.into_inner()))?;
        Some(resumed.saturating_duration_since(failed))
    }
}

/// One run's figures.
struct RecoveryRun {
    elapsed: Duration,
    report: JobReport,
    failure_to_processing: Duration,
}

/// The keyed backend of a run whose files go under `directory`.
fn keyed_backend(backend: Backend, directory: &std::path::Path) -> Result<KeyedBackend, String> {
    match backend {
        Backend::Memory => Ok(KeyedBackend::Memory),
        #[cfg(feature = "spill")]
        Backend::Spilling { memory_entries } => Ok(KeyedBackend::Spilling {
            dir: directory.join("spill"),
            memory_entries,
        }),
        #[cfg(not(feature = "spill"))]
        Backend::Spilling { .. } => {
            let _ = directory;
            Err("--backend spilling needs cargo feature `spill`".to_string())
        }
    }
}

fn run_once(options: &Options) -> Result<RecoveryRun, String> {
    let directory = tempfile::tempdir_in(&options.dir)
        .map_err(|error| format!("a directory in {}: {error}", options.dir.display()))?;
    let config = JobConfig {
        checkpoint_interval_ms: Some(options.interval_ms),
        default_parallelism: options.parallelism,
        restart: RestartStrategy::FixedDelay {
            attempts_max: 1,
            delay_ms: 0,
        },
        keyed_backend: keyed_backend(options.backend, directory.path())?,
        ..JobConfig::default()
    }
    .with_store_dir(directory.path().join("checkpoints"), "recovery")
    .map_err(|error| format!("store: {error}"))?;
    let job = Job::new("recovery", config);
    let failure = Arc::new(Failure::default());
    let in_function = Arc::clone(&failure);
    let (keys, fail_at) = (options.keys, options.fail_at);
    let sink = DiscardSink::default();
    let source = GenerationSource {
        records: options.records,
        splits_made: Arc::default(),
    };
    let (counts, state) = job
        .source("sequence", source)
        .key_by(move |record: &Record| record.0 % keys)
        .process_with_state("count", move |key: &u64, state: &mut Count, record, out| {
            in_function.on_record(record, fail_at)?;
            state.count += 1;
            out.emit((*key, state.count));
            Ok(())
        });
    counts.sink("discard", sink.clone());
    let started = Instant::now();
    let report = job
        .run()
        .map_err(|error| format!("the job failed: {error}"))?;
    let elapsed = started.elapsed();
    let counts = state.snapshot();
    if counts.len() as u64 != options.keys.min(options.records) {
        return Err(format!("{} keys in the final state", counts.len()));
    }
    for (key, count) in counts {
        let want = expected_count(options.records, options.keys, key);
        if count.count != want {
            return Err(format!(
                "key {key}: count {} after recovery, want {want}",
                count.count
            ));
        }
    }
    if sink.committed() != options.records {
        return Err(format!("the sink committed {} records", sink.committed()));
    }
    let failure_to_processing = failure
        .failure_to_processing()
        .ok_or("the injected failure did not fire or the job never resumed")?;
    Ok(RecoveryRun {
        elapsed,
        report,
        failure_to_processing,
    })
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Where a run restored from: a checkpoint and its size, or the beginning
/// (no checkpoint completed before the failure, so no state was restored).
fn restored_from(report: &JobReport) -> String {
    let restored = report
        .restarts
        .first()
        .and_then(|restart| restart.restored_from);
    let Some(id) = restored else {
        return "the beginning (no checkpoint before the failure: nothing restored)".to_string();
    };
    let checkpoint = report.checkpoints.iter().find(|c| c.checkpoint == id);
    match checkpoint {
        Some(checkpoint) => format!("checkpoint {id} ({} bytes)", checkpoint.size_bytes),
        None => format!("checkpoint {id} (size unknown)"),
    }
}

fn print_run(options: &Options, number: usize, run: &RecoveryRun) {
    let restart = run.report.restarts.first();
    println!(
        "run {number}: {:.2} M records/s overall, restarts {}, restored from {}, \
         report recovery {} ms, failure to processing again {:.1} ms",
        options.records as f64 / run.elapsed.as_secs_f64() / 1e6,
        run.report.restarts.len(),
        restored_from(&run.report),
        restart.map_or(0, |restart| restart.recovery_ms),
        millis(run.failure_to_processing),
    );
}

fn summary(label: &str, values: &mut [f64], unit: &str) {
    let middle = median(values);
    println!(
        "{label}: median {middle:.1} {unit} (min {:.1}, max {:.1}, {} runs)",
        values[0],
        values[values.len() - 1],
        values.len()
    );
}

fn run(options: &Options) -> Result<(), String> {
    println!(
        "recovery: {} records, {} keys, failure at record {}, parallelism {}, checkpoint every {} ms, file store, keyed state {:?}",
        options.records, options.keys, options.fail_at, options.parallelism, options.interval_ms, options.backend
    );
    let mut runs = Vec::with_capacity(options.runs);
    for number in 1..=options.runs {
        let run = run_once(options)?;
        print_run(options, number, &run);
        runs.push(run);
    }
    let mut report_ms: Vec<f64> = runs
        .iter()
        .filter_map(|run| run.report.restarts.first())
        .map(|restart| restart.recovery_ms as f64)
        .collect();
    let mut processing_ms: Vec<f64> = runs
        .iter()
        .map(|run| millis(run.failure_to_processing))
        .collect();
    summary(
        "report recovery (failure report to generation start)",
        &mut report_ms,
        "ms",
    );
    summary(
        "failure to first record of the new generation",
        &mut processing_ms,
        "ms",
    );
    println!("per-key counts exact after recovery in every run");
    Ok(())
}

fn main() -> ExitCode {
    bench_main("recovery", settle, run)
}
