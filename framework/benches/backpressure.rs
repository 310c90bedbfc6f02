//! Backpressure benchmark: the keyed count of DESIGN.md section 5 into a
//! slow sink (a pause per batch), at growing record counts.
//!
//! Credit-based flow control should make the source wait for the sink, so
//! memory must not grow with the input: the peak RSS at 10 M records should
//! match the one at 1 M. It prints per size the throughput (set by the
//! sink), the peak RSS (`VmHWM`, reset before each run), the most batches
//! in flight on the source's and the count's output channels, how often
//! they ran out of credit, and the checkpoint durations under backpressure.
//! Every run checks the per-key counts. It asserts nothing about speed or
//! memory.
//!
//! Run: `cargo bench -p snapflow --bench backpressure`.

mod support;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use snapflow::job::{Job, JobConfig, JobReport, OperatorReport};
use snapflow::protocol::SnapshotMode;

use support::{
    bench_main, expected_count, parse_mode, parse_number, peak_rss_kb, quantile, reset_peak_rss,
    sequence, Count, DiscardSink,
};

const USAGE: &str = "backpressure [--sizes N,N,...] [--keys K] [--pause-per-batch-us US] \
[--parallelism P] [--checkpoint-interval-ms MS] [--mode aligned|unaligned|at-least-once]";

/// The command line.
#[derive(Debug, Clone)]
struct Options {
    sizes: Vec<u64>,
    keys: u64,
    pause_per_batch: Duration,
    parallelism: usize,
    interval_ms: u64,
    mode: SnapshotMode,
}

fn apply(options: &mut Options, flag: &str, value: &str) -> Result<(), String> {
    match flag {
        "--sizes" => {
            let sizes: Result<Vec<u64>, String> = value
                .split(',')
                .map(|size| parse_number(flag, Some(size)))
                .collect();
            options.sizes = sizes?;
        }
        "--keys" => options.keys = parse_number(flag, Some(value))?,
        "--pause-per-batch-us" => {
            options.pause_per_batch = Duration::from_micros(parse_number(flag, Some(value))?);
        }
        "--parallelism" => options.parallelism = parse_number(flag, Some(value))?,
        "--checkpoint-interval-ms" => options.interval_ms = parse_number(flag, Some(value))?,
        "--mode" => options.mode = parse_mode(Some(value))?,
        other => return Err(format!("unknown flag `{other}`\nusage: {USAGE}")),
    }
    Ok(())
}

/// Parses the flags; cargo's own `--bench` flag is ignored.
fn parse(arguments: impl IntoIterator<Item = String>) -> Result<Options, String> {
    let mut options = Options {
        sizes: vec![1_000_000, 3_000_000, 10_000_000],
        keys: 10_000,
        pause_per_batch: Duration::from_micros(500),
        parallelism: 1,
        interval_ms: 1000,
        mode: SnapshotMode::Aligned,
    };
    let mut arguments = arguments.into_iter();
    while let Some(flag) = arguments.next() {
        match flag.as_str() {
            "--bench" => {}
            "--help" | "-h" => return Err(USAGE.to_string()),
            _ => {
                let value = arguments
                    .next()
                    .ok_or_else(|| format!("{flag} needs a value"))?;
                apply(&mut options, &flag, &value)?;
            }
        }
    }
    if options.keys == 0 || options.parallelism == 0 || options.sizes.is_empty() {
        return Err("--keys and --parallelism must be at least 1, --sizes not empty".to_string());
    }
    Ok(options)
}

fn run_size(options: &Options, records: u64) -> Result<(Duration, JobReport, Option<u64>), String> {
    let config = JobConfig {
        checkpoint_interval_ms: Some(options.interval_ms),
        mode: options.mode,
        default_parallelism: options.parallelism,
        ..JobConfig::default()
    };
    let job = Job::new("backpressure", config);
    let sink = DiscardSink::slow(options.pause_per_batch);
    let keys = options.keys;
    let (counts, state) = job
        .source("sequence", sequence(records))
        .key_by(move |i: &u64| i % keys)
        .process_with_state("count", |key: &u64, state: &mut Count, _i: u64, out| {
            state.count += 1;
            out.emit((*key, state.count));
            Ok(())
        });
    counts.sink("slow", sink.clone());
    reset_peak_rss();
    let started = Instant::now();
    let report = job
        .run()
        .map_err(|error| format!("the job failed: {error}"))?;
    let elapsed = started.elapsed();
    let peak = peak_rss_kb();
    for (key, count) in state.snapshot() {
        let want = expected_count(records, options.keys, key);
        if count.count != want {
            return Err(format!("key {key}: count {}, want {want}", count.count));
        }
    }
    if sink.committed() != records {
        return Err(format!("the sink committed {} records", sink.committed()));
    }
    Ok((elapsed, report, peak))
}

fn channel_figures(report: &JobReport, name: &str) -> String {
    let default = OperatorReport::default();
    let operator = report.operator(name).unwrap_or(&default);
    format!(
        "{name}: peak {} batches in flight, {} credit stalls",
        operator.in_flight_batches_peak, operator.credit_stalls
    )
}

fn print_size(records: u64, elapsed: Duration, report: &JobReport, peak_kb: Option<u64>) {
    let periodic = report.checkpoints.len().saturating_sub(1);
    let mut durations: Vec<u64> = report.checkpoints[..periodic]
        .iter()
        .map(|checkpoint| checkpoint.duration_ms)
        .collect();
    durations.sort_unstable();
    let show = |value: Option<u64>| value.map_or("none".to_string(), |ms| format!("{ms} ms"));
    println!(
        "{records} records: {:.2} M records/s, peak RSS {}, periodic checkpoints: {periodic} \
         (duration p50 {}, p99 {})",
        records as f64 / elapsed.as_secs_f64() / 1e6,
        peak_kb.map_or("unavailable".to_string(), |kb| format!(
            "{:.2} MiB",
            kb as f64 / 1024.0
        )),
        show(quantile(&durations, 0.5)),
        show(quantile(&durations, 0.99)),
    );
    println!(
        "  {}; {}",
        channel_figures(report, "sequence"),
        channel_figures(report, "count")
    );
}

fn run(options: &Options) -> Result<(), String> {
    println!(
        "backpressure: {} keys, sink pause {} us per batch, parallelism {}, mode {:?}, \
         checkpoint every {} ms, in-memory store",
        options.keys,
        options.pause_per_batch.as_micros(),
        options.parallelism,
        options.mode,
        options.interval_ms
    );
    for &records in &options.sizes {
        let (elapsed, report, peak_kb) = run_size(options, records)?;
        print_size(records, elapsed, &report, peak_kb);
    }
    println!("per-key counts and committed record counts exact at every size");
    Ok(())
}

fn main() -> ExitCode {
    bench_main("backpressure", parse, run)
}
