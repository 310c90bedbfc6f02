//! The live metrics (`snapflow::metrics`) of running jobs at parallelism
//! 1, 2 and 3: the counts at the end equal what the job processed (as its
//! report counts it), a slow sink shows as backpressure on the source and
//! a fast one does not, queue fill and rates show while the job runs, the
//! checkpoint history grows with Flink's figures, watermarks appear with
//! event time, and the switch turns the per-subtask figures off.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use snapflow::job::{Job, JobConfig, JobReport, RestartStrategy};
use snapflow::metrics::{CheckpointStatus, JobMetrics, OperatorKind};
use snapflow::sink::CollectHandle;
use snapflow::source::VecSourceFactory;
use snapflow::time::WatermarkStrategy;
use snapflow_tests::slow_commit::SlowCommits;
use snapflow_tests::tenths;

struct Run {
    report: JobReport,
    /// Snapshots taken while the job ran, every 20 ms.
    during: Vec<JobMetrics>,
    /// The snapshot after the job ended.
    last: JobMetrics,
}

/// Runs numbers → map → keyed count → sink at `parallelism`, the sink
/// sleeping `sleep_ms` per batch of 4 records.
fn run(parallelism: usize, records: u64, sleep_ms: u64, config: JobConfig) -> Run {
    let job = Job::new(
        "metrics",
        JobConfig {
            default_parallelism: parallelism,
            checkpoint_interval_ms: Some(20),
            batch_size_max: 4,
            window_batches: 2,
            arbiters: Some(2),
            ..config
        },
    );
    let output = CollectHandle::new();
    tenths::declare(
        &job,
        records,
        SlowCommits::new(output, 0, false).with_write_delay_ms(sleep_ms),
    );
    let running = job.start().expect("the job starts");
    let registry = running.metrics_registry();
    let ended = Arc::new(AtomicBool::new(false));
    let sampler = thread::spawn({
        let ended = Arc::clone(&ended);
        move || {
            let mut during = Vec::new();
            // Bounded by the job's end (the main thread sets `ended`) and,
            // should that never come, by a minute.
            let deadline = Instant::now() + Duration::from_secs(60);
            while !ended.load(Ordering::Acquire) && Instant::now() < deadline {
                during.push(registry.snapshot());
                thread::sleep(Duration::from_millis(20));
            }
            (during, registry)
        }
    });
    let report = running.wait();
    ended.store(true, Ordering::Release);
    let report = report.expect("the job runs");
    let (during, registry) = sampler.join().expect("the sampler ran");
    Run {
        report,
        during,
        last: registry.snapshot(),
    }
}

fn check_counts(parallelism: usize) {
    let records = 3_000;
    let Run { report, last, .. } = run(parallelism, records, 0, JobConfig::default());
    assert!(last.enabled);
    let names: Vec<&str> = last.operators.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["numbers", "tenths", "count", "out"]);
    assert_eq!(last.operators[0].kind, OperatorKind::Source);
    assert_eq!(last.operators[2].kind, OperatorKind::Operator);
    assert_eq!(last.operators[3].kind, OperatorKind::Sink);
    for operator in &last.operators {
        assert_eq!(operator.parallelism, parallelism);
        assert_eq!(operator.subtasks.len(), parallelism);
        let reported = report.operator(&operator.name).expect("reported");
        assert_eq!(
            operator.records_in, reported.records_in,
            "{}: records in at p={parallelism}",
            operator.name
        );
        let subtasks_in: u64 = operator.subtasks.iter().map(|s| s.records_in).sum();
        assert_eq!(subtasks_in, operator.records_in);
    }
    let operator = |name: &str| last.operator(name).expect("listed");
    assert_eq!(operator("numbers").records_out, records);
    assert_eq!(operator("tenths").records_in, records);
    assert_eq!(operator("tenths").records_out, records);
    assert_eq!(operator("count").records_in, records);
    assert_eq!(operator("count").records_out, records);
    assert_eq!(operator("out").records_in, records);
    assert_eq!(operator("out").records_out, 0, "a sink sends nothing");
    assert_eq!(last.edges.len(), 3);
    assert_eq!(last.edges[1].partition, "hash");
    // Every completed checkpoint of the report is in the history.
    let completed: Vec<u64> = last
        .checkpoints
        .iter()
        .filter(|c| c.status == CheckpointStatus::Completed)
        .map(|c| c.id)
        .collect();
    let reported: Vec<u64> = report.checkpoints.iter().map(|c| c.checkpoint).collect();
    assert_eq!(completed, reported);
    assert_eq!(last.checkpoints_completed, reported.len() as u64);
    assert_eq!(last.restarts_total, 0);
    assert!(last.last_failure.is_none());
}

#[test]
fn counts_equal_what_the_job_processed_at_parallelism_1() {
    check_counts(1);
}

#[test]
fn counts_equal_what_the_job_processed_at_parallelism_2() {
    check_counts(2);
}

#[test]
fn counts_equal_what_the_job_processed_at_parallelism_3() {
    check_counts(3);
}

fn source_backpressured_ms(metrics: &JobMetrics) -> u64 {
    let source = metrics.operator("numbers").expect("listed");
    source.subtasks.iter().map(|s| s.backpressured_ms).sum()
}

fn check_backpressure(parallelism: usize) {
    let slow = run(parallelism, 2_000, 1, JobConfig::default());
    let fast = run(parallelism, 2_000, 0, JobConfig::default());
    let slow_ms = source_backpressured_ms(&slow.last);
    let fast_ms = source_backpressured_ms(&fast.last);
    println!("p={parallelism}: source backpressured {slow_ms} ms behind the slow sink, {fast_ms} ms behind the fast one");
    // 500 batches of 4 at 1 ms each over `parallelism` sinks: the source
    // waits for credit most of that time.
    assert!(slow_ms >= 100, "slow sink: {slow_ms} ms backpressured");
    assert!(
        fast_ms * 10 <= slow_ms,
        "fast sink: {fast_ms} ms backpressured against {slow_ms} ms"
    );
    // While the slow job ran, the rates showed it: the source was
    // backpressured and the sink busy, and a channel into it was full.
    let source_rate = slow
        .during
        .iter()
        .map(|m| {
            m.operator("numbers")
                .map_or(0.0, |o| o.backpressured_ms_per_second_max)
        })
        .fold(0.0, f64::max);
    assert!(
        source_rate > 100.0,
        "the source's backpressured ms/s peaked at {source_rate}"
    );
    let sink_busy = slow
        .during
        .iter()
        .map(|m| m.operator("out").map_or(0.0, |o| o.busy_ms_per_second_max))
        .fold(0.0, f64::max);
    assert!(
        sink_busy > 100.0,
        "the sink's busy ms/s peaked at {sink_busy}"
    );
    let full = slow.during.iter().any(|m| {
        m.channels
            .iter()
            .any(|c| c.to.0 == "out" && c.fill >= 1.0 && c.window_batches == Some(2))
    });
    assert!(full, "a channel into the slow sink was seen full");
    let rates = slow.during.iter().any(|m| {
        m.operator("out")
            .is_some_and(|o| o.records_in_per_second > 0.0)
    });
    assert!(rates, "the sink's input rate was seen");
}

#[test]
fn backpressure_shows_behind_a_slow_sink_only_at_parallelism_1() {
    check_backpressure(1);
}

#[test]
fn backpressure_shows_behind_a_slow_sink_only_at_parallelism_2() {
    check_backpressure(2);
}

#[test]
fn backpressure_shows_behind_a_slow_sink_only_at_parallelism_3() {
    check_backpressure(3);
}

#[test]
fn the_checkpoint_history_grows_while_the_job_runs() {
    let slow = run(2, 2_000, 1, JobConfig::default());
    let counts: Vec<u64> = slow
        .during
        .iter()
        .map(|m| m.checkpoints_completed)
        .collect();
    let rises = counts.windows(2).filter(|pair| pair[1] > pair[0]).count();
    assert!(
        rises >= 2,
        "completed checkpoints while running: {counts:?}"
    );
    let completed: Vec<_> = slow
        .last
        .checkpoints
        .iter()
        .filter(|c| c.status == CheckpointStatus::Completed)
        .collect();
    assert!(completed.len() >= 3);
    let nodes = 4 * 2;
    for checkpoint in completed {
        assert_eq!(checkpoint.kind, "checkpoint");
        assert!(checkpoint.trigger_time_unix_ms > 1_600_000_000_000);
        assert_eq!(checkpoint.acked_subtasks, nodes);
        assert_eq!(checkpoint.total_subtasks, nodes);
        assert_eq!(checkpoint.subtasks.len(), nodes);
        assert!(checkpoint.size_bytes > 0);
        let parts: u64 = checkpoint.subtasks.iter().map(|s| s.size_bytes).sum();
        assert!(parts > 0 && parts <= checkpoint.size_bytes * 2);
        assert!(checkpoint.duration_ms >= checkpoint.sync_duration_ms);
        // Each part is rounded down to a millisecond on its own.
        let parts_ms = checkpoint.sync_duration_ms + checkpoint.async_duration_ms;
        assert!(
            checkpoint.duration_ms.abs_diff(parts_ms) <= 1,
            "{checkpoint:?}"
        );
    }
    let ids: Vec<u64> = slow.last.checkpoints.iter().map(|c| c.id).collect();
    assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "{ids:?}");
}

#[test]
fn watermarks_show_per_operator_with_event_time() {
    let job = Job::new(
        "watermarks",
        JobConfig {
            batch_size_max: 16,
            arbiters: Some(2),
            ..JobConfig::default()
        },
    );
    let output = CollectHandle::new();
    job.source("events", VecSourceFactory::new((0..1_000_u64).collect()))
        .assign_timestamps(WatermarkStrategy::bounded_out_of_orderness(
            10,
            |n: &u64| *n,
        ))
        .map("same", |n: u64| n)
        .sink("out", output);
    let running = job.start().expect("starts");
    let registry = running.metrics_registry();
    running.wait().expect("runs");
    let metrics = registry.snapshot();
    let source = metrics.operator("events").expect("listed");
    let watermark = source.watermark_ms.expect("the source sent watermarks");
    assert!((900..1_000).contains(&watermark), "{watermark}");
    let mapped = metrics.operator("same").expect("listed");
    assert!(mapped.watermark_ms.is_some(), "the map sent watermarks on");
    assert!(metrics
        .operator("out")
        .expect("listed")
        .watermark_ms
        .is_some());
}

#[test]
fn switched_off_the_subtasks_record_nothing_but_checkpoints_are_kept() {
    let off = JobConfig {
        metrics: false,
        ..JobConfig::default()
    };
    let Run { report, last, .. } = run(2, 1_000, 0, off);
    assert!(!last.enabled);
    assert!(last
        .operators
        .iter()
        .all(|o| o.records_in == 0 && o.records_out == 0));
    assert!(last
        .channels
        .iter()
        .all(|c| c.records_sent > 0 || c.in_flight_batches == 0));
    assert_eq!(last.checkpoints_completed, report.checkpoints.len() as u64);
    assert!(report.operator("out").expect("reported").records_in > 0);
}

#[test]
fn a_restart_shows_with_its_cause() {
    let failed = Arc::new(AtomicBool::new(false));
    let job = Job::new(
        "restarts",
        JobConfig {
            checkpoint_interval_ms: Some(10),
            batch_size_max: 8,
            arbiters: Some(2),
            restart: RestartStrategy::FixedDelay {
                attempts_max: 3,
                delay_ms: 10,
            },
            ..JobConfig::default()
        },
    );
    let output = CollectHandle::new();
    job.source("numbers", VecSourceFactory::new((0..2_000_u64).collect()))
        .map("fails once", {
            let failed = Arc::clone(&failed);
            move |n: u64| {
                if n == 1_500 && !failed.swap(true, Ordering::SeqCst) {
                    panic!("injected fault at 1500");
                }
                n
            }
        })
        .sink("out", output);
    snapflow_tests::quiet_injected_panics();
    let running = job.start().expect("starts");
    let registry = running.metrics_registry();
    let report = running.wait().expect("runs after one restart");
    let metrics = registry.snapshot();
    assert_eq!(report.restarts.len(), 1);
    assert_eq!(metrics.restarts_total, 1);
    let restart = &metrics.restarts[0];
    assert!(
        restart.cause.contains("injected fault at 1500"),
        "{}",
        restart.cause
    );
    assert_eq!(restart.generation, report.restarts[0].generation);
    assert!(restart.region.contains(&"fails once".to_string()));
    assert!(restart.time_unix_ms > 1_600_000_000_000);
    let failure = metrics.last_failure.clone().expect("the failure is kept");
    assert!(failure.contains("injected fault"), "{failure}");
    // Records replayed after the restart are counted again: at least all.
    assert!(metrics.operator("out").expect("listed").records_in >= 2_000);
}
