//! End-to-end benchmark of the tumbling event-time window count of issue
//! 12 (the second Flink anchor): a replayable sequence source of N
//! records, key `i % K`, event time `i / 1_000` ms (so 1,000 records per
//! millisecond), 1 s tumbling windows of event time counted
//! incrementally, results `(key, window_end, count)` to a discarding sink,
//! run as a real job with checkpoints.
//!
//! In one run it prints the job's throughput, its checkpoint figures, the
//! process's peak RSS, and the throughput of a hand-written single-threaded
//! loop doing the same windowed count (per-key open windows, a timer per
//! window, fired as the watermark passes) as a ratio. Every job run checks
//! every window's count against the closed form and that the counts add
//! up to N; `--smoke` runs a tiny N. It asserts nothing about speed.
//!
//! The watermark strategy is monotonous (each source subtask reads a
//! rising part of the sequence) and sends a risen watermark at most every
//! `--watermark-interval-ms`, by default 1. `200` is Flink's
//! `autoWatermarkInterval`, but it is an interval of processing time: at
//! Flink's 1 M records/s it lets the watermark lag 200 ms of event time,
//! while at 100 M records/s it lags 20 s, so every key holds about 20
//! windows open and the window state no longer fits the cache. 1 ms at
//! 100 M records/s is a lag of about 100 ms of event time, close to what
//! Flink's default gives Flink; `0` (the strategy's own default) sends a
//! watermark after every batch, which costs a control message per batch.
//! BENCHMARKS.md gives all three.
//!
//! By default the source subtasks read the sequence interleaved (subtask
//! `s` of `p` reads `s, s + p, s + 2p, ...`), so their event times advance
//! together, as the partitions of a real stream do. `--split contiguous`
//! gives each subtask a contiguous share instead: then subtask 1 starts
//! `N / p / 1000` ms of event time ahead of subtask 0, the operator's
//! watermark (the minimum) lags it by that much, and every key holds that
//! many windows open until the end.
//!
//! Run: `cargo bench -p snapflow --bench window_count -- --parallelism 2
//! --checkpoint-interval-ms 1000` (see `--help`).

mod support;

use std::collections::{BTreeMap, HashMap};
use std::hint::black_box;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use snapflow::job::{Job, JobConfig, JobReport};
use snapflow::keyed::BuildStableHasher;
use snapflow::source::GeneratorSourceFactory;
use snapflow::time::{WatermarkStrategy, Windowed, Windows};

use support::{
    bench_main, describe, interval, median, mega_per_second, number, peak_rss_kb, periodic_figures,
    positive, print_optional, quantile, reset_peak_rss, run_with_metrics, summary, sync_parts_us,
    CargoBench, DiscardSink,
};

/// Records per millisecond of event time.
const RECORDS_PER_MS: u64 = 1_000;
/// The tumbling window's size.
const WINDOW_MS: u64 = 1_000;

/// The tumbling event-time window count per key as a real job with
/// checkpoints: throughput, checkpoint figures and peak RSS.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "window_count", args_override_self = true)]
struct Options {
    /// Records (N) [with --smoke: at most 3000000].
    #[arg(long, value_name = "N", value_parser = number::<u64>, default_value_t = 20_000_000)]
    records: u64,
    /// Distinct keys (K) [with --smoke: at most 1000].
    #[arg(long, value_name = "K", value_parser = positive::<u64>, default_value_t = 10_000)]
    keys: u64,
    /// Parallelism of every operator.
    #[arg(long, value_name = "P", value_parser = positive::<usize>, default_value_t = 2)]
    parallelism: usize,
    /// Time between periodic checkpoints, or `off` [with --smoke: 5].
    #[arg(long = "checkpoint-interval-ms", value_name = "MS|off", value_parser = interval,
          default_value = "1000")]
    interval_ms: std::option::Option<u64>,
    /// Time between watermarks.
    #[arg(long, value_name = "MS", value_parser = number::<u64>, default_value_t = 1)]
    watermark_interval_ms: u64,
    /// How the source subtasks share the records: interleaved (subtask s
    /// reads s, s + p, ...; --records must be a multiple of
    /// --parallelism) or contiguous.
    #[arg(long = "split", value_name = "interleaved|contiguous", value_parser = split,
          default_value = "interleaved", action = clap::ArgAction::Set)]
    interleaved: bool,
    /// `JobConfig::copy_on_write_threshold_keys`.
    #[arg(long, value_name = "N", value_parser = number::<usize>,
          default_value_t = snapflow::job::DEFAULT_COPY_ON_WRITE_THRESHOLD_KEYS)]
    copy_on_write_threshold_keys: usize,
    /// Turn incremental checkpoints off (every checkpoint full).
    #[arg(long)]
    full_checkpoints: bool,
    /// Runs (medians are printed).
    #[arg(long, value_name = "R", value_parser = positive::<usize>, default_value_t = 1)]
    runs: usize,
    /// A tiny run that checks the counts.
    #[arg(long)]
    smoke: bool,
    /// Print a progress line per second to stderr while each job runs.
    #[arg(long)]
    progress: bool,
    #[command(flatten)]
    cargo: CargoBench,
}

/// `--split`: whether the sources interleave.
fn split(text: &str) -> Result<bool, String> {
    match text {
        "interleaved" => Ok(true),
        "contiguous" => Ok(false),
        other => Err(format!(
            "unknown split {other:?} (interleaved or contiguous)"
        )),
    }
}

/// Applies `--smoke` (a tiny N, few keys, frequent checkpoints) and
/// checks that an interleaved split divides the records evenly.
fn settle(mut options: Options) -> Result<Options, String> {
    if options.smoke {
        options.records = options.records.min(3_000_000);
        options.keys = options.keys.min(1_000);
        options.interval_ms = options.interval_ms.map(|_| 5);
    }
    if options.interleaved && options.records % options.parallelism as u64 != 0 {
        return Err("--split interleaved needs --records to be a multiple of --parallelism".into());
    }
    Ok(options)
}

/// The event time of record `i`.
fn event_time_ms(i: u64) -> u64 {
    i / RECORDS_PER_MS
}

/// The record at `index` of the generator's range `0..records`, which
/// gives source subtask `s` of `parallelism` the indexes of the `s`-th
/// contiguous share: interleaved, that share holds `s, s + p, s + 2p,
/// ...` (`records` is a multiple of `parallelism`).
fn record_at(index: u64, records: u64, parallelism: u64, interleaved: bool) -> u64 {
    if !interleaved {
        return index;
    }
    let share = records / parallelism;
    (index % share) * parallelism + index / share
}

/// How many of the records `0..below` have key `key`.
fn with_key_below(below: u64, keys: u64, key: u64) -> u64 {
    below / keys + u64::from(key < below % keys)
}

/// The exact count of key `key` in the window `[start_ms, end_ms)` over
/// `records` records.
fn expected_window_count(records: u64, keys: u64, key: u64, start_ms: u64, end_ms: u64) -> u64 {
    let first = (start_ms * RECORDS_PER_MS).min(records);
    let end = (end_ms * RECORDS_PER_MS).min(records);
    with_key_below(end, keys, key) - with_key_below(first, keys, key)
}

/// What the job's output check saw, filled by a map in front of the sink
/// (there are no failures in the benchmark, so nothing is replayed).
#[derive(Default)]
struct Seen {
    results: AtomicU64,
    counted: AtomicU64,
    wrong: AtomicU64,
}

/// One job run's figures.
struct JobRun {
    elapsed: Duration,
    report: JobReport,
    peak_rss_kb: Option<u64>,
    /// The window operator's synchronous parts (every subtask, every
    /// completed checkpoint), microseconds, from the live metrics.
    sync_parts_us: Vec<u64>,
}

fn job_config(options: &Options) -> JobConfig {
    JobConfig {
        checkpoint_interval_ms: support::periodic_interval_ms(options.interval_ms),
        default_parallelism: options.parallelism,
        copy_on_write_threshold_keys: options.copy_on_write_threshold_keys,
        incremental_checkpoints: snapflow::job::IncrementalCheckpoints {
            enabled: !options.full_checkpoints,
            ..Default::default()
        },
        ..JobConfig::default()
    }
}

/// Runs the job once and checks its output; the store directory lives
/// until the run is measured.
fn run_job(options: &Options) -> Result<JobRun, String> {
    let directory = tempfile::tempdir().map_err(|error| format!("temporary directory: {error}"))?;
    let config = job_config(options)
        .with_store_dir(directory.path(), "window-count")
        .map_err(|error| format!("store: {error}"))?;
    let job = Job::new("window-count", config);
    let sink = DiscardSink::default();
    let seen = Arc::new(Seen::default());
    let (keys, records) = (options.keys, options.records);
    let windows = Windows::tumbling(WINDOW_MS).map_err(|error| error.to_string())?;
    let strategy = WatermarkStrategy::monotonous(|i: &u64| event_time_ms(*i))
        .with_emit_interval_ms(options.watermark_interval_ms);
    let (parallelism, interleaved) = (options.parallelism as u64, options.interleaved);
    let source = GeneratorSourceFactory::new(0..records, move |index| {
        record_at(index, records, parallelism, interleaved)
    });
    let (counts, late) = job
        .source("sequence", source)
        .assign_timestamps(strategy)
        .key_by(move |i: &u64| i % keys)
        .window(windows, |i: &u64| event_time_ms(*i))
        .count("count");
    let check = Arc::clone(&seen);
    counts
        .map("check", move |window: Windowed<u64, u64>| {
            let want =
                expected_window_count(records, keys, window.key, window.start_ms, window.end_ms);
            check.results.fetch_add(1, Ordering::Relaxed);
            check.counted.fetch_add(window.result, Ordering::Relaxed);
            if window.result != want {
                check.wrong.fetch_add(1, Ordering::Relaxed);
            }
            (window.key, window.end_ms, window.result)
        })
        .sink("discard", sink.clone());
    let peak_rss_reset = reset_peak_rss();
    let started = Instant::now();
    let (report, metrics) = run_with_metrics(job, options.progress)
        .map_err(|error| format!("the job failed: {error}"))?;
    let elapsed = started.elapsed();
    let sync_parts_us = sync_parts_us(&metrics, "count");
    let peak_rss_kb = peak_rss_reset.then(peak_rss_kb).flatten();
    check_output(options, &seen, sink.committed(), late.dropped())?;
    Ok(JobRun {
        elapsed,
        report,
        peak_rss_kb,
        sync_parts_us,
    })
}

fn check_output(options: &Options, seen: &Seen, committed: u64, late: u64) -> Result<(), String> {
    let wrong = seen.wrong.load(Ordering::Relaxed);
    let counted = seen.counted.load(Ordering::Relaxed);
    let results = seen.results.load(Ordering::Relaxed);
    if wrong != 0 {
        return Err(format!("{wrong} windows have a wrong count"));
    }
    if counted != options.records || late != 0 {
        return Err(format!(
            "the windows counted {counted} records and dropped {late} as late, want {}",
            options.records
        ));
    }
    if committed != results {
        return Err(format!(
            "the sink committed {committed} results, the job emitted {results}"
        ));
    }
    Ok(())
}

/// The physical bound: the same windowed count on one thread, as a user
/// would write it by hand. Per key its open windows (start, count); a
/// timer per (window end, key) in a `BTreeMap`; the watermark
/// `max_ts - 1` fires every timer at or below it; each result goes to
/// `black_box` in place of a sink. Returns the elapsed time, the results
/// and the records counted.
fn hand_written_loop(records: u64, keys: u64) -> (Duration, u64, u64) {
    let started = Instant::now();
    let mut open: HashMap<u64, Vec<(u64, u64)>, BuildStableHasher> =
        HashMap::with_hasher(BuildStableHasher);
    let mut timers: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let (mut results, mut counted) = (0u64, 0u64);
    let mut fire = |open: &mut HashMap<u64, Vec<(u64, u64)>, BuildStableHasher>,
                    timers: &mut BTreeMap<u64, Vec<u64>>,
                    watermark_ms: u64| {
        while let Some(entry) = timers.first_entry() {
            if *entry.key() > watermark_ms {
                break;
            }
            let (last_ms, keys) = entry.remove_entry();
            let start_ms = last_ms + 1 - WINDOW_MS;
            for key in keys {
                let windows = open.get_mut(&key).expect("a timer's key has open windows");
                let index = windows.iter().position(|(start, _)| *start == start_ms);
                let (_, count) = windows.remove(index.expect("a timer's window is open"));
                results += 1;
                counted += count;
                black_box((key, start_ms + WINDOW_MS, count));
            }
        }
    };
    let mut watermark_ms = 0;
    for i in 0..records {
        let (key, timestamp_ms) = (black_box(i) % keys, event_time_ms(i));
        let start_ms = timestamp_ms - timestamp_ms % WINDOW_MS;
        let windows = open.entry(key).or_default();
        match windows.iter_mut().find(|(start, _)| *start == start_ms) {
            Some((_, count)) => *count += 1,
            None => {
                windows.push((start_ms, 1));
                timers
                    .entry(start_ms + WINDOW_MS - 1)
                    .or_default()
                    .push(key);
            }
        }
        if timestamp_ms > watermark_ms + 1 {
            watermark_ms = timestamp_ms - 1;
            fire(&mut open, &mut timers, watermark_ms);
        }
    }
    fire(&mut open, &mut timers, u64::MAX);
    (started.elapsed(), results, counted)
}

/// Prints the job's figures; returns its median records/s in millions.
fn print_job_runs(options: &Options, runs: &[JobRun]) -> f64 {
    let mut rates: Vec<f64> = runs
        .iter()
        .map(|run| mega_per_second(options.records, run.elapsed))
        .collect();
    println!("job, {}", describe(options.interval_ms));
    println!("  {}", summary("records/s", &rates, "M"));
    let completed: Vec<f64> = runs
        .iter()
        .map(|run| run.report.checkpoints.len() as f64)
        .collect();
    let label = "checkpoints completed (incl. the final one)";
    println!("  {}", summary(label, &completed, ""));
    let durations = periodic_figures(runs.iter().map(|run| &run.report), |c| c.duration_ms);
    print_optional("checkpoint duration p50", quantile(&durations, 0.5), "ms");
    print_optional("checkpoint duration p99", quantile(&durations, 0.99), "ms");
    print_sync_parts(runs);
    let sizes = periodic_figures(runs.iter().map(|run| &run.report), |c| c.size_bytes);
    print_optional("bytes per checkpoint p50", quantile(&sizes, 0.5), "B");
    print_optional("bytes per checkpoint max", sizes.last().copied(), "B");
    let failed: usize = runs.iter().map(|r| r.report.failed_checkpoints.len()).sum();
    let restarts: usize = runs.iter().map(|r| r.report.restarts.len()).sum();
    println!("  failed checkpoints: {failed}, restarts: {restarts} (all runs)");
    let rss: Vec<f64> = runs
        .iter()
        .filter_map(|run| run.peak_rss_kb)
        .map(|kb| kb as f64 / 1024.0)
        .collect();
    if rss.len() == runs.len() {
        let title = "peak RSS (VmHWM, reset before each run)";
        println!("  {}", summary(title, &rss, "MiB"));
    } else {
        println!("  peak RSS: unavailable (the kernel cannot reset VmHWM)");
    }
    median(&mut rates)
}

/// Prints the quantiles of the window operator's synchronous parts: the
/// share of each checkpoint that ran on the operator's own thread.
fn print_sync_parts(runs: &[JobRun]) {
    let mut sync_parts: Vec<u64> = runs
        .iter()
        .flat_map(|run| run.sync_parts_us.iter().copied())
        .collect();
    sync_parts.sort_unstable();
    if sync_parts.is_empty() {
        return;
    }
    let label = "synchronous part (per subtask, all checkpoints)";
    print_optional(&format!("{label} p50"), quantile(&sync_parts, 0.5), "us");
    print_optional(&format!("{label} p99"), quantile(&sync_parts, 0.99), "us");
    print_optional(&format!("{label} max"), sync_parts.last().copied(), "us");
}

fn run_loop(options: &Options) -> Result<f64, String> {
    let mut rates = Vec::with_capacity(options.runs);
    for _ in 0..options.runs {
        let (elapsed, _results, counted) = hand_written_loop(options.records, options.keys);
        if counted != options.records {
            return Err(format!("the hand-written loop counted {counted} records"));
        }
        rates.push(mega_per_second(options.records, elapsed));
    }
    println!("hand-written loop (1 thread, same stable hasher)");
    println!("  {}", summary("records/s", &rates, "M"));
    Ok(median(&mut rates))
}

fn run(options: &Options) -> Result<(), String> {
    println!(
        "window count: {} records, {} keys, {WINDOW_MS} ms tumbling event-time windows, \
         {RECORDS_PER_MS} records per ms, parallelism {}, watermark every {} ms, split {}, {} runs",
        options.records,
        options.keys,
        options.parallelism,
        options.watermark_interval_ms,
        if options.interleaved {
            "interleaved"
        } else {
            "contiguous"
        },
        options.runs
    );
    let runs = (0..options.runs)
        .map(|_| run_job(options))
        .collect::<Result<Vec<_>, _>>()?;
    let job_rate = print_job_runs(options, &runs);
    let loop_rate = run_loop(options)?;
    println!("ratio job/loop: {:.4}", job_rate / loop_rate);
    if options.smoke {
        println!("smoke: every window's count is exact and the sink committed every result");
    }
    Ok(())
}

fn main() -> ExitCode {
    bench_main("window_count", settle, run)
}
