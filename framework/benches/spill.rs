//! The keyed count with state larger than memory (issue 16, part 3): the
//! keyed count of `keyed_count.rs` (key = i % K) over many keys, with the
//! spilling keyed-state backend (`KeyedBackend::Spilling`) or, for
//! comparison, the in-memory one. Run it under a memory limit (see
//! BENCHMARKS.md, "spill") to show that the spilling
//! backend completes where the in-memory one cannot.
//!
//! It prints throughput, peak RSS, the checkpoints' figures (with each
//! subtask's synchronous part, from the live metrics) and how much
//! the working directory held at its largest (sampled). Exactness is
//! checked without holding every key: each key emits one record when its
//! count reaches the exact final count, so the sink must commit exactly K
//! records (a key whose state was lost on the way to disk would end below
//! its count and emit nothing). It asserts nothing about speed.
//!
//! With `--hot-keys H --hot-share P`, P % of the records go to H hot keys
//! and the rest spread evenly over the other K - H keys (a skewed
//! workload, where the eviction choice decides how often hot keys are
//! read back from disk); it prints the entries read back from disk per
//! record (`snapflow::keyed::spill::disk_loads_total`). Setting
//! `SNAPFLOW_SPILL_EVICTION=order` selects the eviction choice before
//! second chance (the table's memory order), for comparison.
//!
//! The two (or P) source subtasks interleave: subtask s of P emits the
//! positions s, s + P, s + 2P, ... of `0..N` (see `Interleave`), and the
//! keys follow the positions. Each key's successive touches are therefore
//! K positions apart, and how many of them find the key still in memory
//! does not depend on the subtasks' relative pace. (With contiguous
//! halves, both subtasks walked the keys in the same order, and the
//! entries read back from disk went from 0.03 to 0.36 per record with
//! which subtask ran ahead, which swamped the checkpoints' cost.)
//!
//! Run: `cargo bench -p snapflow --features spill --bench spill --
//! --keys 10000000 --records 20000000 --memory-entries 1000000 --dir DIR`
//! (see `--help`).

mod support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use snapflow::job::{Job, JobConfig, KeyedBackend};

use snapflow::source::GeneratorSourceFactory;
use support::{
    bench_main, expected_count, interval, mega_per_second, number, peak_rss_kb, periodic_figures,
    positive, print_optional, quantile, run_with_metrics, sync_parts_us, CargoBench, Count,
    DiscardSink,
};

/// The keyed count with more keys than memory holds, on the spilling
/// backend (or, for comparison, the in-memory one): throughput, peak RSS
/// and checkpoint figures.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "spill", args_override_self = true)]
struct Options {
    /// Records (a multiple of --parallelism: the sources interleave).
    #[arg(long, value_name = "N", value_parser = number::<u64>, default_value_t = 20_000_000)]
    records: u64,
    /// Distinct keys.
    #[arg(long, value_name = "K", value_parser = positive::<u64>, default_value_t = 10_000_000)]
    keys: u64,
    /// Parallelism of every operator.
    #[arg(long, value_name = "P", value_parser = positive::<usize>, default_value_t = 2)]
    parallelism: usize,
    /// The keyed-state backend: spilling or memory.
    #[arg(long = "backend", value_name = "spilling|memory", value_parser = spilling,
          default_value = "spilling", action = clap::ArgAction::Set)]
    spilling: bool,
    /// Keys per subtask the spilling backend keeps in memory.
    #[arg(long, value_name = "M", value_parser = positive::<usize>, default_value_t = 1_000_000)]
    memory_entries: usize,
    /// Time between periodic checkpoints, or `off`.
    #[arg(long = "checkpoint-interval-ms", value_name = "MS|off", value_parser = interval,
          default_value = "off")]
    interval_ms: std::option::Option<u64>,
    /// How many keys get --hot-share % of the records (1 to K - 1, with
    /// --hot-share); 0 for uniform keys.
    #[arg(long, value_name = "H", value_parser = number::<u64>, default_value_t = 0)]
    hot_keys: u64,
    /// The percentage of records that go to the hot keys (1 to 99, with
    /// --hot-keys).
    #[arg(long, value_name = "PERCENT", value_parser = number::<u64>, default_value_t = 0)]
    hot_share: u64,
    /// `IncrementalCheckpoints::full_every`.
    #[arg(long, value_name = "N", value_parser = number::<u32>,
          default_value_t = snapflow::job::DEFAULT_FULL_EVERY)]
    full_every: u32,
    /// The working directory's parent (the spilling backend's and the
    /// checkpoint store's); a temporary directory inside it is used
    /// [default: the system's temporary directory].
    #[arg(long, value_name = "DIR", default_value_os_t = std::env::temp_dir(), hide_default_value = true)]
    dir: PathBuf,
    /// A tiny run: 200000 records, 50000 keys, 1000 memory entries and a
    /// checkpoint every 50 ms (in place of those flags).
    #[arg(long)]
    smoke: bool,
    #[command(flatten)]
    cargo: CargoBench,
}

/// `--backend`: spilling or memory.
fn spilling(text: &str) -> Result<bool, String> {
    match text {
        "spilling" => Ok(true),
        "memory" => Ok(false),
        other => Err(format!("spilling or memory, got {other:?}")),
    }
}

/// Applies `--smoke` and checks the rules between flags.
fn settle(mut options: Options) -> Result<Options, String> {
    if options.smoke {
        options.records = 200_000;
        options.keys = 50_000;
        options.memory_entries = 1_000;
        options.interval_ms = Some(50);
    }
    if options.records % options.parallelism as u64 != 0 {
        return Err(
            "--records must be a multiple of --parallelism (the sources interleave)".into(),
        );
    }
    let skewed = options.hot_keys > 0 || options.hot_share > 0;
    if skewed
        && (options.hot_share == 0
            || options.hot_share >= 100
            || options.hot_keys == 0
            || options.hot_keys >= options.keys)
    {
        return Err("--hot-keys must be 1 to K - 1 and --hot-share 1 to 99, together".into());
    }
    Ok(options)
}

/// Which key record `i` counts for, and each key's exact final count.
///
/// Uniform: key = i % K. Skewed: in each block of 100 consecutive records
/// the first `hot_share` go to the hot keys `0..H` in turn and the others
/// to the cold keys `H..K` in turn, so every count is known without
/// holding the keys.
#[derive(Debug, Clone, Copy)]
struct KeyChoice {
    records: u64,
    keys: u64,
    hot_keys: u64,
    hot_share: u64,
}

impl KeyChoice {
    fn new(options: &Options) -> Self {
        KeyChoice {
            records: options.records,
            keys: options.keys,
            hot_keys: options.hot_keys,
            hot_share: options.hot_share,
        }
    }

    fn key_of(&self, i: u64) -> u64 {
        if self.hot_keys == 0 {
            return i % self.keys;
        }
        let (block, place) = (i / 100, i % 100);
        if place < self.hot_share {
            (block * self.hot_share + place) % self.hot_keys
        } else {
            let cold = block * (100 - self.hot_share) + place - self.hot_share;
            self.hot_keys + cold % (self.keys - self.hot_keys)
        }
    }

    /// The records that go to the hot keys.
    fn hot_records(&self) -> u64 {
        (self.records / 100) * self.hot_share + (self.records % 100).min(self.hot_share)
    }

    fn expected(&self, key: u64) -> u64 {
        if self.hot_keys == 0 {
            return expected_count(self.records, self.keys, key);
        }
        let hot = self.hot_records();
        if key < self.hot_keys {
            expected_count(hot, self.hot_keys, key)
        } else {
            expected_count(
                self.records - hot,
                self.keys - self.hot_keys,
                key - self.hot_keys,
            )
        }
    }

    /// How many keys get at least one record.
    fn distinct(&self) -> u64 {
        if self.hot_keys == 0 {
            return self.keys.min(self.records);
        }
        let hot = self.hot_records();
        self.hot_keys.min(hot) + (self.keys - self.hot_keys).min(self.records - hot)
    }
}

/// Maps the generator's index `i` to the position the record stands for,
/// so that the P source subtasks, which split `0..N` into contiguous
/// equal ranges (`split_range`), emit interleaved positions: subtask s
/// emits s, s + P, s + 2P, ... It is a bijection on `0..N` when P divides
/// N (checked by `parse`), so every key's exact count is unchanged.
#[derive(Debug, Clone, Copy)]
struct Interleave {
    share: u64,
    parallelism: u64,
}

impl Interleave {
    fn new(options: &Options) -> Self {
        let parallelism = options.parallelism as u64;
        Interleave {
            share: options.records / parallelism,
            parallelism,
        }
    }

    fn position(&self, index: u64) -> u64 {
        let (subtask, offset) = (index / self.share, index % self.share);
        offset * self.parallelism + subtask
    }
}

/// The bytes under `dir`, recursively (files that vanish meanwhile count 0).
fn disk_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(metadata) if metadata.is_dir() => disk_bytes(&entry.path()),
            Ok(metadata) => metadata.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Samples `disk_bytes(dir)` every 500 ms until `done`, keeping the largest.
fn sample_disk(dir: PathBuf, done: Arc<AtomicBool>, largest: Arc<AtomicU64>) {
    while !done.load(Ordering::Relaxed) {
        largest.fetch_max(disk_bytes(&dir), Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn run(options: &Options) -> Result<(), String> {
    let work = tempfile::tempdir_in(&options.dir)
        .map_err(|error| format!("a directory in {}: {error}", options.dir.display()))?;
    let spill_dir = work.path().join("spill");
    let backend = if options.spilling {
        KeyedBackend::Spilling {
            dir: spill_dir.clone(),
            memory_entries: options.memory_entries,
        }
    } else {
        KeyedBackend::Memory
    };
    let mut config = JobConfig {
        checkpoint_interval_ms: options.interval_ms,
        default_parallelism: options.parallelism,
        keyed_backend: backend.clone(),
        ..JobConfig::default()
    };
    config.incremental_checkpoints.full_every = options.full_every;
    if options.interval_ms.is_some() {
        config = config
            .with_store_dir(work.path().join("checkpoints"), "spill")
            .map_err(|error| format!("store: {error}"))?;
    }
    let job = Job::new("spill", config);
    let sink = DiscardSink::<(u64, u64)>::default();
    let (records, keys) = (options.records, options.keys);
    let choice = KeyChoice::new(options);
    let interleave = Interleave::new(options);
    let source = GeneratorSourceFactory::new(0..records, move |i| interleave.position(i));
    job.source("sequence", source)
        .key_by(move |i: &u64| choice.key_of(*i))
        .process(
            "count",
            move |key: &u64, state: &mut Count, _i: u64, out| {
                state.count += 1;
                if state.count == choice.expected(*key) {
                    out.emit((*key, state.count));
                }
                Ok(())
            },
        )
        .sink("discard", sink.clone());
    let done = Arc::new(AtomicBool::new(false));
    let largest = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (dir, done, largest) = (spill_dir, Arc::clone(&done), Arc::clone(&largest));
        std::thread::spawn(move || sample_disk(dir, done, largest))
    };
    let loads_before = snapflow::keyed::spill::disk_loads_total();
    let started = Instant::now();
    let run = run_with_metrics(job, false);
    let elapsed = started.elapsed();
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let (report, metrics) = run.map_err(|error| format!("the job failed: {error}"))?;
    let loads = snapflow::keyed::spill::disk_loads_total() - loads_before;
    let distinct = choice.distinct();
    if sink.committed() != distinct {
        return Err(format!(
            "{} keys reached their exact count, expected {distinct}",
            sink.committed()
        ));
    }
    println!("spill: {backend:?}");
    println!(
        "records {records}, keys {keys}, parallelism {}, {}",
        options.parallelism,
        support::describe(options.interval_ms)
    );
    if options.hot_keys > 0 {
        println!(
            "skewed: {} % of the records to {} hot keys",
            options.hot_share, options.hot_keys
        );
    }
    println!(
        "a full checkpoint every {} (incremental)",
        options.full_every
    );
    println!(
        "eviction: {}",
        std::env::var("SNAPFLOW_SPILL_EVICTION").unwrap_or_else(|_| "second chance".into())
    );
    println!(
        "entries read back from disk: {loads} ({:.4} per record)",
        loads as f64 / records.max(1) as f64
    );
    println!(
        "throughput: {:.2} M records/s ({:.1} s)",
        mega_per_second(records, elapsed),
        elapsed.as_secs_f64()
    );
    print_optional("peak RSS", peak_rss_kb().map(|kb| kb / 1024), "MB");
    println!(
        "spill directory at its largest (sampled): {:.1} MB",
        largest.load(Ordering::Relaxed) as f64 / 1e6
    );
    let durations = periodic_figures([&report], |checkpoint| checkpoint.duration_ms);
    let written = periodic_figures([&report], |checkpoint| checkpoint.written_bytes);
    println!(
        "periodic checkpoints: {}, duration p50 {:?} ms / p99 {:?} ms, written p50 {:?} bytes, mean {} bytes",
        durations.len(),
        quantile(&durations, 0.5),
        quantile(&durations, 0.99),
        quantile(&written, 0.5),
        written.iter().sum::<u64>() / (written.len().max(1) as u64)
    );
    // The part of each checkpoint on the operator's own thread, per
    // subtask (issue 16: under 10 ms at p99 at every size).
    let sync_parts = sync_parts_us(&metrics, "count");
    println!(
        "synchronous part per subtask: p50 {:?} us / p99 {:?} us / max {:?} us",
        quantile(&sync_parts, 0.5),
        quantile(&sync_parts, 0.99),
        sync_parts.last()
    );
    println!("every key's count exact: {distinct} keys");
    Ok(())
}

fn main() -> std::process::ExitCode {
    bench_main("spill", settle, run)
}
