//! End-to-end benchmark of the keyed count of DESIGN.md section 5 (the
//! Flink anchor): a replayable sequence source of N records, key = i % K, a
//! keyed per-key count emitting `(key, count)` per record, and a discarding
//! sink, run as a real job with checkpoints.
//!
//! In one run it prints the job's throughput, its checkpoint figures
//! (count, duration p50/p99, bytes), the process's peak RSS, and the
//! throughput of a hand-written single-threaded loop doing the same count
//! with the same stable hasher, as a ratio. `--compare-off` also runs the
//! same job with periodic checkpoints off. Each run is also repeated with
//! the live metrics off (`JobConfig::metrics`), interleaved, and the
//! metrics overhead is printed from the adjacent on/off pairs
//! (`--no-compare-metrics` skips that). Every job run checks that the
//! per-key counts are exact; `--smoke` runs a tiny N and exits non-zero if
//! they are not. It asserts nothing about speed.
//!
//! Checkpoint duration, alignment time and size are over the periodic
//! checkpoints only; the final checkpoint of a bounded job (triggered after
//! every input ended, without barriers) is printed apart. Alignment time
//! is per checkpoint the longest of any subtask, from its first barrier to
//! its snapshot.
//!
//! Run: `cargo bench -p snapflow --bench keyed_count -- --parallelism 2
//! --checkpoint-interval-ms 1000` (see `--help`). With checkpoints on
//! S3 (moto on loopback, see BENCHMARKS.md): `--features s3` and
//! `--store s3://bucket/prefix`.

mod support;

use std::collections::HashMap;
use std::hint::black_box;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use snapflow::job::{
    CheckpointReport, IncrementalCheckpoints, Job, JobConfig, JobReport, KeyedStateHandle,
};
use snapflow::keyed::BuildStableHasher;
use snapflow::metrics::{SubtaskCell, SubtaskRecorder};
use snapflow::protocol::SnapshotMode;

use support::{
    bench_main, cross_core_round_trip_ns, describe, expected_count, interval, median,
    mega_per_second, mode, number, on_off, peak_rss_kb, periodic_figures, positive, print_optional,
    quantile, reset_peak_rss, run_with_metrics, sequence, summary, sync_parts_us, ArbiterPinner,
    CargoBench, Count, DiscardSink,
};

/// Round trips of the probe taken right before and after each job run
/// (3-17 ms).
const RUN_ROUND_TRIPS: u64 = 50_000;
/// How long a per-run probe waits for the previous job's threads to exit.
const PROBE_SETTLE_MS: u64 = 30;
/// A probe at or above this many nanoseconds means the host placed the
/// two vCPUs on cores without a shared cache (about 340 ns; about 80 with
/// one).
const FAR_PLACEMENT_NS: f64 = 200.0;
/// A probe below this many nanoseconds means the two vCPUs are SMT
/// siblings of one core (about 30 ns), sharing its execution units.
const SMT_PLACEMENT_NS: f64 = 50.0;

/// Where checkpoints go.
#[derive(Debug, Clone, PartialEq, Eq)]
enum StoreKind {
    /// A fresh in-memory store per run.
    Memory,
    /// A file-system store in a fresh temporary directory per run (like the
    /// Flink anchor's local checkpoint directory).
    Fs,
    /// Object storage at this `s3://bucket/prefix` location (feature
    /// `s3`; endpoint and credentials from the `AWS_*` variables), under
    /// a fresh job name per run. The bucket must exist.
    Location(String),
}

/// The keyed count of DESIGN.md section 5 as a real job with checkpoints:
/// throughput, checkpoint figures and peak RSS, against a hand-written
/// loop doing the same count. Every run checks the per-key counts.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "keyed_count", args_override_self = true)]
struct Options {
    /// Records (N) [with --smoke: at most 200003].
    #[arg(long, value_name = "N", value_parser = number::<u64>, default_value_t = 50_000_000)]
    records: u64,
    /// Distinct keys (K); key = i % K [with --smoke: at most 1000].
    #[arg(long, value_name = "K", value_parser = positive::<u64>, default_value_t = 10_000)]
    keys: u64,
    /// Parallelism of every operator.
    #[arg(long, value_name = "P", value_parser = positive::<usize>, default_value_t = 1)]
    parallelism: usize,
    /// Time between periodic checkpoints, or `off` [with --smoke: 5].
    #[arg(long = "checkpoint-interval-ms", value_name = "MS|off", value_parser = interval,
          default_value = "1000")]
    interval_ms: std::option::Option<u64>,
    /// The snapshot mode: aligned, unaligned or at-least-once.
    #[arg(long, value_parser = mode, default_value = "aligned")]
    mode: SnapshotMode,
    /// Runs of each configuration (medians are printed).
    #[arg(long, value_name = "R", value_parser = positive::<usize>, default_value_t = 1)]
    runs: usize,
    /// Where checkpoints go: memory, fs (a fresh temporary directory) or
    /// an `s3://bucket/prefix` location (feature `s3`; the `AWS_*`
    /// variables give the endpoint and credentials).
    #[arg(long, value_name = "memory|fs|s3://BUCKET/PREFIX", value_parser = store_kind, default_value = "fs")]
    store: StoreKind,
    /// Also run the same job with periodic checkpoints off.
    #[arg(long)]
    compare_off: bool,
    /// Skip the runs with the live metrics off (and the metrics overhead).
    #[arg(long = "no-compare-metrics", action = clap::ArgAction::SetFalse)]
    compare_metrics: bool,
    /// Print a progress line per second to stderr while each job runs.
    #[arg(long)]
    progress: bool,
    /// A tiny run that checks the counts (exit code 1 if one is wrong).
    #[arg(long)]
    smoke: bool,
    /// Batches in flight per channel [default: the job's].
    #[arg(long, value_name = "W", value_parser = positive::<usize>)]
    window_batches: Option<usize>,
    /// Pin the job's arbiter threads to CPUs (with `taskset`).
    #[arg(long)]
    pin_arbiters: bool,
    /// Arbiter threads [default: the job's, one per core]; `--arbiters 1`
    /// runs every subtask on one thread, so the job/loop ratio is the
    /// inverse of the job's CPU cost per record in loop units.
    #[arg(long, value_name = "A", value_parser = number::<usize>)]
    arbiters: Option<usize>,
    /// Incremental checkpoints of the keyed state: on or off.
    #[arg(long, value_name = "on|off", value_parser = on_off, default_value = "on",
          action = clap::ArgAction::Set)]
    incremental: bool,
    /// After the first K records (one per key), records touch only keys
    /// 0..H, so that checkpoints after the first see few key groups
    /// change; 0 keeps key = i % K throughout.
    #[arg(long, value_name = "H", value_parser = number::<u64>, default_value_t = 0)]
    hot_keys: u64,
    /// `JobConfig::copy_on_write_threshold_keys` [default: the job's].
    #[arg(long, value_name = "T", value_parser = number::<usize>)]
    copy_on_write_threshold_keys: Option<usize>,
    #[command(flatten)]
    cargo: CargoBench,
}

/// `--store`: memory, fs or an `s3://` location.
fn store_kind(text: &str) -> Result<StoreKind, String> {
    match text {
        "memory" => Ok(StoreKind::Memory),
        "fs" => Ok(StoreKind::Fs),
        location if location.starts_with("s3://") => Ok(StoreKind::Location(location.to_owned())),
        other => Err(format!(
            "unknown store {other:?} (memory, fs or s3://bucket/prefix)"
        )),
    }
}

/// A job name of its own for each run on object storage, so that no run
/// resumes an earlier one's checkpoints.
fn fresh_job_name() -> String {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("keyed-count-{stamp}-{run}")
}

/// Applies `--smoke` (a tiny N, few keys, frequent checkpoints) and
/// checks that the hot keys are among the keys.
fn settle(mut options: Options) -> Result<Options, String> {
    if options.smoke {
        options.records = options.records.min(200_003);
        options.keys = options.keys.min(1_000);
        options.interval_ms = options.interval_ms.map(|_| 5);
    }
    if options.hot_keys > options.keys {
        return Err("--hot-keys must not exceed --keys".to_string());
    }
    Ok(options)
}

/// One job run's figures.
struct JobRun {
    elapsed: Duration,
    report: JobReport,
    peak_rss_kb: Option<u64>,
    /// Whether the peak was reset before the run (else it is the process's).
    peak_rss_reset: bool,
    /// The cross-core round trip right before and right after the run, ns.
    probes_ns: [f64; 2],
    /// The count operator's synchronous parts (every subtask, every
    /// completed checkpoint), microseconds, from the live metrics (empty
    /// when they are off).
    sync_parts_us: Vec<u64>,
}

impl JobRun {
    /// Where the host had placed the two vCPUs during the run, judged by
    /// the probes right before and after it; "mixed" when they disagree.
    fn placement(&self) -> &'static str {
        let [before, after] = self.probes_ns.map(placement_of);
        if before == after {
            before
        } else {
            "mixed"
        }
    }

    /// The run time less the final checkpoint's duration (from its
    /// trigger, once every input ended, to its durable commit): about the
    /// time the job took to process its records. With periodic
    /// checkpoints the final one also waits for the persist of any
    /// periodic checkpoint still in flight (the writer persists in order),
    /// which this leaves out.
    fn until_inputs_ended(&self) -> Duration {
        let final_ms = self
            .report
            .checkpoints
            .last()
            .map_or(0, |checkpoint| checkpoint.duration_ms);
        self.elapsed.saturating_sub(Duration::from_millis(final_ms))
    }
}

/// The placement of the two vCPUs that a cross-core round trip of
/// `probe_ns` indicates (inferred; see BENCHMARKS.md).
fn placement_of(probe_ns: f64) -> &'static str {
    if probe_ns < SMT_PLACEMENT_NS {
        "SMT-sibling"
    } else if probe_ns < FAR_PLACEMENT_NS {
        "near"
    } else {
        "far"
    }
}

/// Every placement a run can be judged to have run in, in print order.
const PLACEMENTS: [&str; 4] = ["near", "SMT-sibling", "far", "mixed"];

fn job_config(options: &Options, interval_ms: Option<u64>, metrics: bool) -> JobConfig {
    let defaults = JobConfig::default();
    JobConfig {
        metrics,
        checkpoint_interval_ms: support::periodic_interval_ms(interval_ms),
        mode: options.mode,
        default_parallelism: options.parallelism,
        window_batches: options.window_batches.unwrap_or(defaults.window_batches),
        arbiters: options.arbiters.or(defaults.arbiters),
        incremental_checkpoints: IncrementalCheckpoints {
            enabled: options.incremental,
            ..defaults.incremental_checkpoints
        },
        copy_on_write_threshold_keys: options
            .copy_on_write_threshold_keys
            .unwrap_or(defaults.copy_on_write_threshold_keys),
        ..defaults
    }
}

/// Runs the job once and checks its output; the store directory (if any)
/// lives until the run is measured.
fn run_job(options: &Options, interval_ms: Option<u64>, metrics: bool) -> Result<JobRun, String> {
    let directory = tempfile::tempdir().map_err(|error| format!("temporary directory: {error}"))?;
    let mut config = job_config(options, interval_ms, metrics);
    match &options.store {
        StoreKind::Memory => {}
        StoreKind::Fs => {
            config = config
                .with_store_dir(directory.path(), "keyed-count")
                .map_err(|error| format!("store: {error}"))?;
        }
        StoreKind::Location(location) => {
            config = config
                .with_store_location(location, &fresh_job_name())
                .map_err(|error| format!("store: {error}"))?;
        }
    }
    let job = Job::new("keyed-count", config);
    let sink = DiscardSink::default();
    let (keys, hot) = (options.keys, options.hot_keys);
    let (counts, state) = job
        .source("sequence", sequence(options.records))
        .key_by(move |i: &u64| {
            if hot == 0 || *i < keys {
                i % keys
            } else {
                (i - keys) % hot
            }
        })
        .process_with_state("count", |key: &u64, state: &mut Count, _i: u64, out| {
            state.count += 1;
            out.emit((*key, state.count));
            Ok(())
        });
    counts.sink("discard", sink.clone());
    let probe_before_ns = settled_probe_ns();
    let peak_rss_reset = reset_peak_rss();
    let pinner = options.pin_arbiters.then(ArbiterPinner::start);
    let started = Instant::now();
    let (report, metrics) = run_with_metrics(job, options.progress)
        .map_err(|error| format!("the job failed: {error}"))?;
    let sync_parts_us = sync_parts_us(&metrics, "count");
    let elapsed = started.elapsed();
    let probes_ns = [probe_before_ns, settled_probe_ns()];
    if let Some(pinner) = pinner {
        let pinned = pinner.finish()?;
        if pinned == 0 {
            return Err("--pin-arbiters found no arbiter thread to pin".to_string());
        }
    }
    let peak_rss_kb = peak_rss_kb();
    check_output(options, &state, &sink)?;
    Ok(JobRun {
        elapsed,
        report,
        peak_rss_kb,
        peak_rss_reset,
        probes_ns,
        sync_parts_us,
    })
}

/// The cross-core probe, after a pause that lets the previous job's
/// threads wind down (a probe taken while they exit reads several times
/// too high).
fn settled_probe_ns() -> f64 {
    std::thread::sleep(Duration::from_millis(PROBE_SETTLE_MS));
    cross_core_round_trip_ns(RUN_ROUND_TRIPS)
}

fn check_output(
    options: &Options,
    state: &KeyedStateHandle<u64, Count>,
    sink: &DiscardSink,
) -> Result<(), String> {
    let counts = state.snapshot();
    let distinct = options.keys.min(options.records);
    if counts.len() as u64 != distinct {
        return Err(format!("{} keys in state, want {distinct}", counts.len()));
    }
    for (key, count) in &counts {
        let want = expected(options, *key);
        if count.count != want {
            return Err(format!("key {key}: count {}, want {want}", count.count));
        }
    }
    let committed = sink.committed();
    if committed != options.records {
        return Err(format!(
            "the sink committed {committed} records, want {}",
            options.records
        ));
    }
    Ok(())
}

/// The physical bound: the same count with the same hasher, one thread,
/// every `(key, count)` handed to `black_box` in place of a sink.
fn hand_written_loop(records: u64, keys: u64) -> (Duration, HashMap<u64, u64, BuildStableHasher>) {
    let started = Instant::now();
    let mut counts: HashMap<u64, u64, BuildStableHasher> = HashMap::with_hasher(BuildStableHasher);
    for i in 0..records {
        let key = black_box(i) % keys;
        let count = counts.entry(key).or_insert(0);
        *count += 1;
        black_box((key, *count));
    }
    (started.elapsed(), counts)
}

/// The records/s of the runs judged to have run in `placement`.
fn rates_in_placement(options: &Options, runs: &[JobRun], placement: &str) -> Vec<f64> {
    runs.iter()
        .filter(|run| run.placement() == placement)
        .map(|run| mega_per_second(options.records, run.elapsed))
        .collect()
}

/// Each run's records/s with its probes, then the runs' records/s split
/// by the placement their probes saw.
fn print_by_placement(options: &Options, runs: &[JobRun]) {
    for (index, run) in runs.iter().enumerate() {
        let [before, after] = run.probes_ns;
        println!(
            "    run {}: {:.2} M records/s, probes {before:.0}/{after:.0} ns ({})",
            index + 1,
            mega_per_second(options.records, run.elapsed),
            run.placement()
        );
    }
    for placement in PLACEMENTS {
        let rates = rates_in_placement(options, runs, placement);
        if !rates.is_empty() {
            let title = format!("records/s, runs in the {placement} placement");
            println!("    {}", summary(&title, &rates, "M"));
        }
    }
}

/// The job/loop ratio over all runs and per placement of the vCPUs.
fn print_ratios(options: &Options, runs: &[JobRun], job_rate: f64, loop_rate: f64) {
    let mut line = format!("ratio job/loop: {:.4}", job_rate / loop_rate);
    for placement in PLACEMENTS {
        let mut rates = rates_in_placement(options, runs, placement);
        if !rates.is_empty() {
            let count = rates.len();
            let ratio = median(&mut rates) / loop_rate;
            line.push_str(&format!("; {placement} {ratio:.4} ({count} runs)"));
        }
    }
    println!("{line}");
    println!(
        "  (placement of the vCPUs by a cache-line round trip probed right before and after each \
         run: SMT-sibling below {SMT_PLACEMENT_NS:.0} ns, near below {FAR_PLACEMENT_NS:.0}, far \
         above, mixed when the two disagree; BENCHMARKS.md \"Machine and conditions\")"
    );
}

/// Prints the figures of one configuration over its runs; returns the
/// median records/s in millions.
fn print_job_runs(title: &str, options: &Options, runs: &[JobRun]) -> f64 {
    println!("{title}");
    let rates: Vec<f64> = runs
        .iter()
        .map(|run| mega_per_second(options.records, run.elapsed))
        .collect();
    println!("  {}", summary("records/s", &rates, "M"));
    print_by_placement(options, runs);
    let completed: Vec<f64> = runs
        .iter()
        .map(|run| run.report.checkpoints.len() as f64)
        .collect();
    println!(
        "  {}",
        summary(
            "checkpoints completed (incl. the final one)",
            &completed,
            ""
        )
    );
    let periodic = |figure: fn(&CheckpointReport) -> u64| {
        periodic_figures(runs.iter().map(|run| &run.report), figure)
    };
    let durations = periodic(|c| c.duration_ms);
    print_optional("checkpoint duration p50", quantile(&durations, 0.5), "ms");
    print_optional("checkpoint duration p99", quantile(&durations, 0.99), "ms");
    let alignments = periodic(|c| c.alignment_max_us);
    let label = "alignment time (max over subtasks)";
    print_optional(&format!("{label} p50"), quantile(&alignments, 0.5), "us");
    print_optional(&format!("{label} p99"), quantile(&alignments, 0.99), "us");
    // The part of each checkpoint on the operator's own thread, per
    // subtask (issue 16: under 10 ms at p99 at every size).
    let mut sync_parts: Vec<u64> = runs
        .iter()
        .flat_map(|run| run.sync_parts_us.iter().copied())
        .collect();
    sync_parts.sort_unstable();
    if !sync_parts.is_empty() {
        let label = "synchronous part (per subtask, all checkpoints)";
        print_optional(&format!("{label} p50"), quantile(&sync_parts, 0.5), "us");
        print_optional(&format!("{label} p99"), quantile(&sync_parts, 0.99), "us");
        print_optional(&format!("{label} max"), sync_parts.last().copied(), "us");
    }
    let sizes = periodic(|c| c.size_bytes);
    print_optional("state bytes per checkpoint p50", quantile(&sizes, 0.5), "B");
    print_optional("state bytes per checkpoint max", sizes.last().copied(), "B");
    // Beside the state: what each checkpoint wrote itself (with
    // incremental checkpoints, the key groups that changed since the last
    // completed one).
    let written = periodic(|c| c.written_bytes);
    print_optional(
        "bytes written per checkpoint p50",
        quantile(&written, 0.5),
        "B",
    );
    print_optional(
        "bytes written per checkpoint max",
        written.last().copied(),
        "B",
    );
    let finals: Vec<f64> = runs
        .iter()
        .filter_map(|run| run.report.checkpoints.last())
        .map(|c| c.duration_ms as f64)
        .collect();
    if !finals.is_empty() {
        println!("  {}", summary("final checkpoint duration", &finals, "ms"));
    }
    let failed: usize = runs
        .iter()
        .map(|run| run.report.failed_checkpoints.len())
        .sum();
    let restarts: usize = runs.iter().map(|run| run.report.restarts.len()).sum();
    let subsumed: usize = runs
        .iter()
        .map(|run| run.report.subsumed_checkpoints.len())
        .sum();
    println!(
        "  failed checkpoints: {failed}, subsumed by the final one: {subsumed}, \
         restarts: {restarts} (all runs)"
    );
    let rss: Vec<f64> = runs
        .iter()
        .filter_map(|run| run.peak_rss_kb)
        .map(|kb| kb as f64 / 1024.0)
        .collect();
    if rss.is_empty() {
        println!("  peak RSS: unavailable");
    } else {
        let scope = if runs.iter().all(|run| run.peak_rss_reset) {
            "VmHWM, reset before each run"
        } else {
            "VmHWM since the process started"
        };
        println!("  {}", summary(&format!("peak RSS ({scope})"), &rss, "MiB"));
    }
    let mut rates = rates;
    median(&mut rates)
}

/// The runs of the configuration in `options`; with `compare_off`, as
/// many runs with periodic checkpoints off; with `--compare-metrics`, as
/// many with the live metrics off; interleaved (on, off, metrics off, on,
/// ...) so that all see the same changes in the host's condition (see
/// BENCHMARKS.md, "Machine and conditions").
fn run_configs(options: &Options, compare_off: bool) -> Result<[Vec<JobRun>; 3], String> {
    let (mut on, mut off, mut unmetered) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..options.runs {
        // Every other round runs the metrics-off job first, so that an
        // effect of the order (the previous run's threads winding down)
        // falls on both sides of the metrics comparison alike.
        let unmetered_first = options.compare_metrics && round % 2 == 1;
        if unmetered_first {
            unmetered.push(run_job(options, options.interval_ms, false)?);
        }
        on.push(run_job(options, options.interval_ms, true)?);
        if compare_off {
            off.push(run_job(options, None, true)?);
        }
        if options.compare_metrics && !unmetered_first {
            unmetered.push(run_job(options, options.interval_ms, false)?);
        }
    }
    Ok([on, off, unmetered])
}

/// The median over adjacent pairs of `with`'s run time over `without`'s
/// (above 1: `with` is slower).
fn paired_slowdown(with: &[JobRun], without: &[JobRun]) -> f64 {
    let mut pairs: Vec<f64> = with
        .iter()
        .zip(without)
        .map(|(with, without)| with.elapsed.as_secs_f64() / without.elapsed.as_secs_f64())
        .collect();
    median(&mut pairs)
}

/// The exact count of `key` under `options` (see `--hot-keys`).
fn expected(options: &Options, key: u64) -> u64 {
    let (records, keys, hot) = (options.records, options.keys, options.hot_keys);
    if hot == 0 {
        return expected_count(records, keys, key);
    }
    let first = u64::from(key < records.min(keys));
    let rest = records.saturating_sub(keys);
    first
        + if key < hot {
            expected_count(rest, hot, key)
        } else {
            0
        }
}

fn run_loop(options: &Options) -> Result<f64, String> {
    let mut rates = Vec::with_capacity(options.runs);
    for _ in 0..options.runs {
        let (elapsed, counts) = hand_written_loop(options.records, options.keys);
        for (key, count) in &counts {
            if *count != expected_count(options.records, options.keys, *key) {
                return Err(format!("the hand-written loop miscounted key {key}"));
            }
        }
        rates.push(mega_per_second(options.records, elapsed));
    }
    println!("hand-written loop (1 thread, same stable hasher)");
    println!("  {}", summary("records/s", &rates, "M"));
    Ok(median(&mut rates))
}

/// What the live metrics cost one actor per slice of work on this
/// machine, in nanoseconds: the end of a slice as `runtime::stage` does it
/// (two clock reads, the busy time, a flush into the cell) plus one
/// backpressure period's start and end (a third clock read), and a
/// source's connector figures (a lag stored, bytes added), which is the
/// most a slice adds.
/// Timed alone, so the machine's load barely moves it.
fn metrics_ns_per_slice() -> f64 {
    const SLICES: u64 = 2_000_000;
    let cell = Arc::new(SubtaskCell::new(Instant::now()));
    let mut recorder = SubtaskRecorder::new(Arc::clone(&cell));
    let started = Instant::now();
    for slice in 0..SLICES {
        let begin = Instant::now();
        recorder.on_batch(1024);
        let end = Instant::now();
        recorder.busy(begin, end);
        recorder.backpressure_started(end);
        recorder.backpressure_ended(Instant::now());
        recorder.flush(black_box(slice * 1024));
        cell.set_pending(black_box(Some(SLICES - slice)), None);
        cell.add_bytes_in(black_box(1024 * 16));
    }
    started.elapsed().as_nanos() as f64 / SLICES as f64
}

/// The part of [`metrics_ns_per_slice`] that a source's connector figures
/// add (issue 17's bytes and lag): a lag stored and bytes added, timed
/// alone (the once-a-second split positions reuse the slice's clock
/// read).
fn connector_ns_per_slice() -> f64 {
    const SLICES: u64 = 2_000_000;
    let cell = SubtaskCell::new(Instant::now());
    let started = Instant::now();
    for slice in 0..SLICES {
        cell.set_pending(black_box(Some(SLICES - slice)), None);
        cell.add_bytes_in(black_box(1024 * 16));
    }
    started.elapsed().as_nanos() as f64 / SLICES as f64
}

/// The cost model of the live metrics for `runs`: at most two recorder
/// events (a slice end and a credit) per batch of each actor, each as
/// dear as [`metrics_ns_per_slice`], against the run's CPU time (its
/// wall time on every arbiter).
fn print_metrics_model(options: &Options, runs: &[JobRun]) {
    let slice_ns = metrics_ns_per_slice();
    let batch = job_config(options, None, true).batch_size_max as f64;
    // The source's output, the count's input and output, the sink's input.
    let batches = 3.0 * options.records as f64 / batch;
    let mut shares: Vec<f64> = runs
        .iter()
        .map(|run| {
            let threads = options.arbiters.unwrap_or(2).min(2 * options.parallelism) as f64;
            2.0 * batches * slice_ns / (run.elapsed.as_nanos() as f64 * threads)
        })
        .collect();
    println!(
        "metrics cost model: {slice_ns:.0} ns per slice (timed alone; {:.0} ns of it a source's \
         bytes and lag); at most 2 per batch of each actor ({batches:.0} batches): at most \
         {:.2} % of the runs' CPU time",
        connector_ns_per_slice(),
        median(&mut shares) * 100.0
    );
}

fn run(options: &Options) -> Result<(), String> {
    let window = job_config(options, None, true).window_batches;
    println!(
        "keyed count: {} records, {} keys, parallelism {}, mode {:?}, store {:?}, window {} batches, \
         arbiters {} ({}), {} runs, incremental checkpoints {}, hot keys {}, copy-on-write from {} keys",
        options.records,
        options.keys,
        options.parallelism,
        options.mode,
        options.store,
        window,
        options.arbiters.map_or("one per core".to_string(), |count| count.to_string()),
        if options.pin_arbiters { "pinned" } else { "not pinned" },
        options.runs,
        if options.incremental { "on" } else { "off" },
        options.hot_keys,
        job_config(options, None, true).copy_on_write_threshold_keys
    );
    let compare_off = options.compare_off && options.interval_ms.is_some();
    let [runs, off, unmetered] = run_configs(options, compare_off)?;
    let title = format!("job, {}", describe(options.interval_ms));
    let job_rate = print_job_runs(&title, options, &runs);
    if compare_off {
        let off_rate = print_job_runs("job, periodic checkpoints off", options, &off);
        // Each run with checkpoints against the run without right after
        // it: a change of host condition between the two sets then moves
        // one pair, not the whole comparison.
        let mut pairs: Vec<f64> = runs
            .iter()
            .zip(&off)
            .map(|(on, off)| off.elapsed.as_secs_f64() / on.elapsed.as_secs_f64())
            .collect();
        println!(
            "checkpoint overhead: on/off throughput {:.3} (of the medians), {:.3} (median of \
             {} adjacent on/off pairs)",
            job_rate / off_rate,
            median(&mut pairs),
            pairs.len()
        );
        let mut processing: Vec<f64> = runs
            .iter()
            .zip(&off)
            .map(|(on, off)| {
                off.until_inputs_ended().as_secs_f64() / on.until_inputs_ended().as_secs_f64()
            })
            .collect();
        println!(
            "checkpoint overhead until every input ended (each run less its final \
             checkpoint): {:.3} (median of {} adjacent on/off pairs)",
            median(&mut processing),
            processing.len()
        );
    }
    if options.compare_metrics {
        print_metrics_model(options, &runs);
        let unmetered_rate = print_job_runs("job, live metrics off", options, &unmetered);
        let slowdown = paired_slowdown(&runs, &unmetered);
        println!(
            "metrics overhead: {:+.2} % (median of {} adjacent on/off pairs; {:+.2} % of the \
             medians' throughput)",
            (slowdown - 1.0) * 100.0,
            runs.len(),
            (unmetered_rate / job_rate - 1.0) * 100.0
        );
    }
    if options.hot_keys > 0 {
        // The hand-written loop counts key = i % K only.
        println!("hand-written loop: not run with --hot-keys");
    } else {
        let loop_rate = run_loop(options)?;
        print_ratios(options, &runs, job_rate, loop_rate);
    }
    if options.smoke {
        println!("smoke: per-key counts and committed record counts are exact");
    }
    Ok(())
}

fn main() -> ExitCode {
    bench_main("keyed_count", settle, run)
}
