//! The job API end to end without injected chaos: a bounded job's output
//! and keyed state are exact at parallelism 1, 2 and 3 in every snapshot
//! mode, bad graphs are rejected before anything starts, a failure without
//! restarts fails the job with its cause, and a slow sink is throttled by
//! the credit window.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use snapflow::job::{Job, JobConfig, JobError, RestartStrategy};
use snapflow::protocol::SnapshotMode;
use snapflow::sink::{CollectHandle, CollectSink, Sink, SinkError, SinkFactory, SinkState};
use snapflow::source::{Guarantee, VecSourceFactory};
use snapflow::storage::{CheckpointStore, MemoryCheckpointStore};
use snapflow_tests::pipeline::{
    declare, expected, faulty_collect, FaultyCommitSink, Pacing, Shape,
};
use snapflow_tests::{FaultKind, Faults};

const RECORDS: u64 = 3_000;
const PACING: Pacing = Pacing {
    records_per_read: 64,
};

fn config(parallelism: usize, mode: SnapshotMode, interval_ms: Option<u64>) -> JobConfig {
    JobConfig {
        checkpoint_interval_ms: interval_ms,
        mode,
        default_parallelism: parallelism,
        batch_size_max: 16,
        arbiters: Some(2),
        ..JobConfig::default()
    }
}

fn check(shape: Shape, mode: SnapshotMode, interval_ms: Option<u64>) {
    let job = Job::new("pipeline", config(1, mode, interval_ms));
    let (sink, output) = faulty_collect(&Faults::none());
    let state = declare(&job, RECORDS, shape, PACING, &Faults::none(), sink);
    let report = job.run().expect("the job runs");
    let (expected_output, expected_state) = expected(RECORDS);
    let mut committed = output.committed();
    committed.sort_unstable();
    assert_eq!(committed, expected_output);
    assert_eq!(state.snapshot(), expected_state);
    let kept = expected_output.len() as u64;
    let operator = |name: &str| report.operator(name).expect("reported").clone();
    assert_eq!(operator("numbers").records_out, RECORDS);
    assert_eq!(operator("keep").records_in, RECORDS);
    assert_eq!(operator("count").records_in, kept);
    assert_eq!(operator("collect").records_in, kept);
    assert!(report.restarts.is_empty());
    let guarantee = match mode {
        SnapshotMode::AtLeastOnce => Guarantee::AtLeastOnce,
        _ => Guarantee::ExactlyOnce,
    };
    assert_eq!(report.guarantee, guarantee);
    assert!(
        !report.checkpoints.is_empty(),
        "the final checkpoint commits the sinks"
    );
}

#[test]
fn aligned_parallelism_1() {
    check([1; 6], SnapshotMode::Aligned, Some(5));
}

#[test]
fn aligned_parallelism_2() {
    check([2; 6], SnapshotMode::Aligned, Some(5));
}

#[test]
fn aligned_parallelism_3() {
    check([3; 6], SnapshotMode::Aligned, Some(5));
}

#[test]
fn aligned_mixed_parallelism_rebalances() {
    check([2, 3, 1, 3, 2, 1], SnapshotMode::Aligned, Some(5));
}

#[test]
fn unaligned_parallelism_2() {
    check([2; 6], SnapshotMode::Unaligned, Some(3));
}

#[test]
fn unaligned_mixed_parallelism() {
    check([1, 2, 3, 2, 3, 2], SnapshotMode::Unaligned, Some(3));
}

#[test]
fn at_least_once_without_failures_is_exact() {
    check([2; 6], SnapshotMode::AtLeastOnce, Some(5));
}

#[test]
fn without_periodic_checkpoints_the_final_one_commits() {
    check([2; 6], SnapshotMode::Aligned, None);
}

fn build_error(declare: impl FnOnce(&Job)) -> JobError {
    let job = Job::new("bad", JobConfig::default());
    declare(&job);
    job.run().expect_err("the graph is rejected")
}

#[test]
fn duplicate_names_are_rejected_before_start() {
    let error = build_error(|job| {
        job.source("twice", VecSourceFactory::new(vec![1_u64]))
            .map("twice", |n| n)
            .sink("out", CollectHandle::new());
    });
    assert!(matches!(error, JobError::DuplicateName { ref name } if name == "twice"));
    assert!(!error.is_retryable());
}

#[test]
fn zero_parallelism_is_rejected_before_start() {
    let error = build_error(|job| {
        job.source("numbers", VecSourceFactory::new(vec![1_u64]))
            .parallelism(0)
            .sink("out", CollectHandle::new());
    });
    assert!(matches!(
        error,
        JobError::BadParallelism { parallelism: 0, .. }
    ));
}

#[test]
fn parallelism_above_the_key_groups_is_rejected() {
    let job = Job::new(
        "bad",
        JobConfig {
            max_parallelism: 2,
            ..JobConfig::default()
        },
    );
    job.source("numbers", VecSourceFactory::new(vec![1_u64]))
        .parallelism(3)
        .sink("out", CollectHandle::<u64>::new());
    let error = job.run().expect_err("rejected");
    assert!(matches!(error, JobError::BadParallelism { max: 2, .. }));
}

#[test]
fn a_failure_without_restarts_fails_the_job_with_its_cause() {
    let job = Job::new(
        "fragile",
        JobConfig {
            restart: RestartStrategy::None,
            ..config(2, SnapshotMode::Aligned, Some(5))
        },
    );
    let faults = Faults::new(vec![("count", 100, FaultKind::Error)]);
    let (sink, output) = faulty_collect(&faults);
    let _state = declare(&job, RECORDS, [2; 6], PACING, &faults, sink);
    let error = job.run().expect_err("the job fails");
    let JobError::RestartsExhausted {
        restarts, cause, ..
    } = error
    else {
        panic!("unexpected error {error}");
    };
    assert_eq!(restarts, 0);
    assert!(cause.contains("count"), "{cause}");
    assert!(
        cause.contains("injected fault in count at record 100"),
        "{cause}"
    );
    assert!(output.committed().is_empty() || output.committed().len() < RECORDS as usize);
}

/// A sink that sleeps per batch, in front of a collect sink.
struct SlowSink(CollectHandle<u64>);

struct SlowWriter(CollectSink<u64>);

impl SinkFactory for SlowSink {
    type Sink = SlowWriter;
    fn create(&self, subtask: usize, parallelism: usize) -> Result<SlowWriter, SinkError> {
        Ok(SlowWriter(self.0.create(subtask, parallelism)?))
    }
}

impl Sink for SlowWriter {
    type Item = u64;
    fn write_batch(&mut self, batch: &[u64]) -> Result<(), SinkError> {
        thread::sleep(Duration::from_millis(1));
        self.0.write_batch(batch)
    }
    fn pre_commit(&mut self, checkpoint_id: u64) -> Result<SinkState, SinkError> {
        self.0.pre_commit(checkpoint_id)
    }
    fn commit(&mut self, checkpoint_id: u64) -> Result<(), SinkError> {
        self.0.commit(checkpoint_id)
    }
    fn abort(&mut self) -> Result<(), SinkError> {
        self.0.abort()
    }
    fn restore(&mut self, state: Option<&SinkState>) -> Result<(), SinkError> {
        self.0.restore(state)
    }
}

#[test]
fn a_slow_sink_throttles_the_source_within_the_window() {
    let window_batches = 2;
    let job = Job::new(
        "slow",
        JobConfig {
            batch_size_max: 4,
            window_batches,
            checkpoint_interval_ms: Some(10),
            arbiters: Some(2),
            ..JobConfig::default()
        },
    );
    let output = CollectHandle::new();
    job.source("numbers", VecSourceFactory::new((0..400_u64).collect()))
        .sink("slow", SlowSink(output.clone()));
    let report = job.run().expect("the job runs");
    let source = report.operator("numbers").expect("reported");
    assert!(source.in_flight_batches_peak <= window_batches as u64);
    assert!(source.credit_stalls > 0, "the source waited for credit");
    let mut committed = output.committed();
    committed.sort_unstable();
    assert_eq!(committed, (0..400).collect::<Vec<_>>());
}

fn slow_pipeline(job: &Job, sink: FaultyCommitSink) {
    let pacing = Pacing {
        records_per_read: 8,
    };
    let _state = declare(job, RECORDS, [1; 6], pacing, &Faults::none(), sink);
}

#[test]
fn a_cancelled_job_stops_with_a_typed_error() {
    let job = Job::new("cancelled", config(1, SnapshotMode::Aligned, Some(5)));
    let (sink, _output) = faulty_collect(&Faults::none());
    slow_pipeline(&job, sink);
    let running = job.start().expect("the job starts");
    thread::sleep(Duration::from_millis(30));
    running.cancel();
    let error = running.wait().expect_err("cancelled");
    assert!(matches!(error, JobError::Cancelled), "{error}");
}

#[test]
fn stop_with_savepoint_then_resume_is_exactly_once() {
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("stopped").expect("a memory store"));
    let config = JobConfig {
        store: Some(Arc::clone(&store)),
        ..config(1, SnapshotMode::Aligned, Some(20))
    };
    let (sink, output) = faulty_collect(&Faults::none());
    let first = Job::new("stopped", config.clone());
    slow_pipeline(&first, sink.clone());
    let running = first.start().expect("the job starts");
    thread::sleep(Duration::from_millis(40));
    running.stop_with_savepoint();
    let stopped = running.wait().expect("the job stops");
    let second = Job::new("stopped", config);
    slow_pipeline(&second, sink);
    let resumed = second.run().expect("the job resumes");
    eprintln!(
        "stopped with savepoint {:?}, resumed from {:?}",
        stopped.savepoint, resumed.resumed_from
    );
    assert!(resumed.resumed_from >= stopped.savepoint);
    if let Some(savepoint) = stopped.savepoint {
        let listed = store.list().expect("the store lists");
        assert!(listed.iter().any(|entry| entry.checkpoint == savepoint
            && entry.kind == snapflow::storage::CheckpointKind::Savepoint));
    }
    let mut committed = output.committed();
    committed.sort_unstable();
    assert_eq!(committed, expected(RECORDS).0);
}

#[test]
fn union_and_flat_map_deliver_every_record_once() {
    let job = Job::new("union", config(2, SnapshotMode::Aligned, Some(5)));
    let output = CollectHandle::new();
    let low = job.source("low", VecSourceFactory::new((0..100_u64).collect()));
    let high = job
        .source("high", VecSourceFactory::new((100..200_u64).collect()))
        .parallelism(3);
    low.union(high)
        .flat_map("twice", |n: u64| [n, n])
        .sink("collect", output.clone());
    job.run().expect("the job runs");
    let mut committed = output.committed();
    committed.sort_unstable();
    let expected: Vec<u64> = (0..200).flat_map(|n| [n, n]).collect();
    assert_eq!(committed, expected);
}

/// Stops the pipeline with a savepoint at `first` parallelism and resumes
/// it at `second`: the keyed operator takes its key groups from the old
/// subtasks' parts, stateless ones start empty.
fn check_rescale(first: Shape, second: Shape) -> Result<(), JobError> {
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("rescaled").expect("a memory store"));
    let config = JobConfig {
        store: Some(Arc::clone(&store)),
        ..config(1, SnapshotMode::Aligned, Some(20))
    };
    let pacing = Pacing {
        records_per_read: 8,
    };
    let (sink, output) = faulty_collect(&Faults::none());
    let job = Job::new("rescaled", config.clone());
    let _state = declare(&job, RECORDS, first, pacing, &Faults::none(), sink.clone());
    let running = job.start().expect("the job starts");
    thread::sleep(Duration::from_millis(40));
    running.stop_with_savepoint();
    running.wait().expect("the job stops");
    let job = Job::new("rescaled", config);
    let state = declare(&job, RECORDS, second, pacing, &Faults::none(), sink);
    job.run()?;
    let (expected_output, expected_state) = expected(RECORDS);
    let mut committed = output.committed();
    committed.sort_unstable();
    assert_eq!(committed, expected_output);
    assert_eq!(state.snapshot(), expected_state);
    Ok(())
}

#[test]
fn keyed_state_restores_at_a_higher_parallelism() {
    check_rescale([1, 2, 2, 2, 2, 1], [1, 1, 3, 3, 1, 1]).expect("rescaled");
}

#[test]
fn keyed_state_restores_at_a_lower_parallelism() {
    check_rescale([1, 2, 2, 2, 2, 1], [1, 1, 1, 1, 1, 1]).expect("rescaled");
}

#[test]
fn a_sink_cannot_change_its_parallelism_on_restore() {
    let error = check_rescale([1, 1, 1, 2, 1, 1], [1, 1, 1, 2, 1, 2]).expect_err("rejected");
    assert!(
        matches!(error, JobError::RescaleUnsupported { ref operator, .. } if operator == "collect"),
        "{error}"
    );
}
