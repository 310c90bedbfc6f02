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
    bench_main, expected_count, mode, number, peak_rss_kb, positive, quantile, reset_peak_rss,
    sequence, CargoBench, Count, DiscardSink,
};

/// The keyed count into a slow sink at growing record counts: the
/// throughput, the peak RSS, the batches in flight and the checkpoint
/// durations under backpressure.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "backpressure", args_override_self = true)]
struct Options {
    /// The record counts to run, one job each.
    #[arg(long, value_name = "N,N,...", value_delimiter = ',', value_parser = number::<u64>,
          default_value = "1000000,3000000,10000000")]
    sizes: Vec<u64>,
    /// Distinct keys.
    #[arg(long, value_name = "K", value_parser = positive::<u64>, default_value_t = 10_000)]
    keys: u64,
    /// The sink's pause per batch, in microseconds.
    #[arg(long = "pause-per-batch-us", value_name = "US", value_parser = micros, default_value = "500")]
    pause_per_batch: Duration,
    /// Parallelism of every operator.
    #[arg(long, value_name = "P", value_parser = positive::<usize>, default_value_t = 1)]
    parallelism: usize,
    /// Time between periodic checkpoints.
    #[arg(long = "checkpoint-interval-ms", value_name = "MS", value_parser = number::<u64>,
          default_value_t = 1000)]
    interval_ms: u64,
    /// The snapshot mode: aligned, unaligned or at-least-once.
    #[arg(long, value_parser = mode, default_value = "aligned")]
    mode: SnapshotMode,
    #[command(flatten)]
    cargo: CargoBench,
}

/// A pause in microseconds.
fn micros(text: &str) -> Result<Duration, String> {
    number(text).map(Duration::from_micros)
}

/// Checks what no single flag can: at least one size.
fn settle(options: Options) -> Result<Options, String> {
    match options.sizes.is_empty() {
        true => Err("--sizes needs at least one size".to_string()),
        false => Ok(options),
    }
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
    bench_main("backpressure", settle, run)
}
