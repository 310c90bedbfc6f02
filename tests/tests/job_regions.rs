//! Regional failover: a job with two independent pipelines A and B (no
//! channel between them, so two failover regions). B's keyed operator
//! fails once (a panic, or an `Err`); only B's region restarts, A keeps
//! running without a restart (its source is split exactly once per
//! subtask), both outputs are exactly-once, and the report names B's
//! region in its one restart. Also when A has already read all its input
//! before B fails, when both fail, and a stop with a savepoint or a cancel
//! while B restarts (the savepoint then resumes both exactly-once). At
//! parallelism 1, 2 and 3.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use std::thread;
use std::time::Duration;

use snapflow::job::{Job, JobConfig, JobError, JobReport, RestartStrategy};
use snapflow::sink::CollectHandle;
use snapflow::source::{Source, SourceError, SourceFactory, SourcePoll, SourcePosition};
use snapflow::storage::{CheckpointStore, MemoryCheckpointStore};
use snapflow::Snapshot;
use snapflow_tests::pipeline::{PacedSource, PacedSourceFactory, Pacing};
use snapflow_tests::{FaultKind, Faults};

const KEYS: u64 = 11;

/// A paced source factory that counts its splits (one per subtask start,
/// restarts included) and flags when every split has read all its input.
struct CountedSource {
    inner: PacedSourceFactory,
    splits: Arc<AtomicUsize>,
    exhausted: Arc<AtomicUsize>,
}

struct CountedReader {
    inner: PacedSource,
    exhausted: Arc<AtomicUsize>,
    ended: bool,
}

impl SourceFactory for CountedSource {
    type Source = CountedReader;
    fn split(&self, subtask: usize, parallelism: usize) -> Result<CountedReader, SourceError> {
        self.splits.fetch_add(1, Ordering::SeqCst);
        Ok(CountedReader {
            inner: self.inner.split(subtask, parallelism)?,
            exhausted: Arc::clone(&self.exhausted),
            ended: false,
        })
    }
}

impl Source for CountedReader {
    type Item = u64;
    fn poll_batch(&mut self, out: &mut Vec<u64>, max: usize) -> Result<SourcePoll, SourceError> {
        let poll = self.inner.poll_batch(out, max)?;
        if poll == SourcePoll::Ended && !self.ended {
            self.ended = true;
            self.exhausted.fetch_add(1, Ordering::SeqCst);
        }
        Ok(poll)
    }
    fn position(&self) -> SourcePosition {
        self.inner.position()
    }
    fn seek(&mut self, position: &SourcePosition) -> Result<(), SourceError> {
        self.inner.seek(position)
    }
}

#[derive(Snapshot, Default, Clone, Debug)]
struct Seen {
    count: u64,
}

/// What one pipeline leaves to check.
struct Pipeline {
    output: CollectHandle<(u64, u64)>,
    splits: Arc<AtomicUsize>,
    exhausted: Arc<AtomicUsize>,
}

/// Declares `prefix`-numbers → key_by(id % KEYS) → `prefix`-count (emits
/// (key, running count); fails per `faults` once `gate` holds) →
/// `prefix`-collect.
fn pipeline(
    job: &Job,
    prefix: &str,
    records: u64,
    faults: &Faults,
    gate: impl Fn() -> bool + Send + Sync + 'static,
) -> Pipeline {
    pipeline_into(job, prefix, records, faults, gate, CollectHandle::new())
}

/// [`pipeline`] into an existing output (a resumed job continues the
/// sink's transactions).
fn pipeline_into(
    job: &Job,
    prefix: &str,
    records: u64,
    faults: &Faults,
    gate: impl Fn() -> bool + Send + Sync + 'static,
    output: CollectHandle<(u64, u64)>,
) -> Pipeline {
    let (splits, exhausted) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let source = CountedSource {
        inner: PacedSourceFactory::new(
            records,
            Pacing {
                records_per_read: 16,
            },
        ),
        splits: Arc::clone(&splits),
        exhausted: Arc::clone(&exhausted),
    };
    let (faults, stage) = (faults.clone(), format!("{prefix}-count"));
    let stage_name: &'static str = if prefix == "a" { "a-count" } else { "b-count" };
    job.source(&format!("{prefix}-numbers"), source)
        .key_by(|id: &u64| id % KEYS)
        .process(&stage, move |key: &u64, seen: &mut Seen, id: u64, out| {
            if gate() {
                faults.check(stage_name, id)?;
            }
            seen.count += 1;
            out.emit((*key, seen.count));
            Ok(())
        })
        .sink(&format!("{prefix}-collect"), output.clone());
    Pipeline {
        output,
        splits,
        exhausted,
    }
}

/// Every (key, running count) of ids `0..records`, sorted.
fn expected(records: u64) -> Vec<(u64, u64)> {
    let mut expected: Vec<(u64, u64)> = (0..KEYS)
        .flat_map(|key| {
            let count = (0..records).filter(|id| id % KEYS == key).count() as u64;
            (1..=count).map(move |n| (key, n))
        })
        .collect();
    expected.sort_unstable();
    expected
}

fn sorted(output: &CollectHandle<(u64, u64)>) -> Vec<(u64, u64)> {
    let mut committed = output.committed();
    committed.sort_unstable();
    committed
}

/// Runs A and B at `parallelism`; B's count fails on one record (`kind`).
/// With `a_finishes_first`, B fails only on a record it sees after every
/// subtask of A's source has read all its input.
fn check(parallelism: usize, kind: FaultKind, a_finishes_first: bool) {
    let (a_records, b_records) = if a_finishes_first {
        (300, 3_000)
    } else {
        (2_000, 2_000)
    };
    let job = Job::new("regions", config(parallelism, 0));
    let b_failure = if a_finishes_first { 2_500 } else { 1_000 };
    let faults = Faults::new(vec![("b-count", b_failure, kind)]);
    let a = pipeline(&job, "a", a_records, &Faults::none(), || true);
    let a_exhausted = Arc::clone(&a.exhausted);
    let gate = move || !a_finishes_first || a_exhausted.load(Ordering::SeqCst) == parallelism;
    let b = pipeline(&job, "b", b_records, &faults, gate);
    let report = job.run().expect("the job recovers");
    assert_eq!(faults.fired(), 1, "the failure was injected");
    assert_eq!(sorted(&a.output), expected(a_records), "A is exactly-once");
    assert_eq!(sorted(&b.output), expected(b_records), "B is exactly-once");
    check_restarts(&report, parallelism);
    assert_eq!(
        a.splits.load(Ordering::SeqCst),
        parallelism,
        "A's subtasks were started once and never restarted"
    );
    assert_eq!(
        b.splits.load(Ordering::SeqCst),
        2 * parallelism,
        "B's subtasks were started twice"
    );
}

fn config(parallelism: usize, delay_ms: u64) -> JobConfig {
    JobConfig {
        checkpoint_interval_ms: Some(10),
        default_parallelism: parallelism,
        restart: RestartStrategy::FixedDelay {
            attempts_max: 2,
            delay_ms,
        },
        batch_size_max: 16,
        arbiters: Some(2),
        ..JobConfig::default()
    }
}

fn check_restarts(report: &JobReport, parallelism: usize) {
    assert_eq!(report.restarts.len(), 1, "{:?}", report.restarts);
    let restart = &report.restarts[0];
    assert_eq!(restart.region, ["b-numbers", "b-count", "b-collect"]);
    let failure = restart.failure.as_ref().expect("an operator failed");
    assert_eq!(&*failure.tag.operator, "b-count");
    assert!(failure.tag.subtask < parallelism);
    assert!(
        restart.cause.contains("injected fault in b-count"),
        "{}",
        restart.cause
    );
    assert!(
        restart.generation > 1,
        "the restarted region runs a new generation: {restart:?}"
    );
}

#[test]
fn panic_in_b_restarts_only_b_parallelism_1() {
    check(1, FaultKind::Panic, false);
}

#[test]
fn panic_in_b_restarts_only_b_parallelism_2() {
    check(2, FaultKind::Panic, false);
}

#[test]
fn panic_in_b_restarts_only_b_parallelism_3() {
    check(3, FaultKind::Panic, false);
}

#[test]
fn error_in_b_restarts_only_b_parallelism_1() {
    check(1, FaultKind::Error, false);
}

#[test]
fn error_in_b_restarts_only_b_parallelism_2() {
    check(2, FaultKind::Error, false);
}

#[test]
fn error_in_b_restarts_only_b_parallelism_3() {
    check(3, FaultKind::Error, false);
}

#[test]
fn a_finished_before_b_fails_parallelism_1() {
    check(1, FaultKind::Panic, true);
}

#[test]
fn a_finished_before_b_fails_parallelism_2() {
    check(2, FaultKind::Error, true);
}

#[test]
fn a_finished_before_b_fails_parallelism_3() {
    check(3, FaultKind::Panic, true);
}

#[test]
fn both_regions_fail_and_each_restarts_alone() {
    let job = Job::new("regions", config(2, 0));
    let a_faults = Faults::new(vec![("a-count", 700, FaultKind::Panic)]);
    let b_faults = Faults::new(vec![("b-count", 1_300, FaultKind::Error)]);
    let a = pipeline(&job, "a", 2_000, &a_faults, || true);
    let b = pipeline(&job, "b", 2_000, &b_faults, || true);
    let report = job.run().expect("the job recovers");
    assert_eq!(a_faults.fired() + b_faults.fired(), 2);
    assert_eq!(sorted(&a.output), expected(2_000));
    assert_eq!(sorted(&b.output), expected(2_000));
    let mut regions: Vec<String> = report
        .restarts
        .iter()
        .map(|restart| restart.region.join(","))
        .collect();
    regions.sort();
    assert_eq!(
        regions,
        ["a-numbers,a-count,a-collect", "b-numbers,b-count,b-collect"]
    );
    assert_eq!(a.splits.load(Ordering::SeqCst), 4);
    assert_eq!(b.splits.load(Ordering::SeqCst), 4);
}

/// B fails once A's output reached a few records; the test waits for the
/// failure, then acts on the job while B waits out its restart delay.
fn during_b_restart(
    store: &Arc<dyn CheckpointStore>,
    act: impl FnOnce(&snapflow::job::RunningJob),
) -> (Result<JobReport, JobError>, Pipeline, Pipeline) {
    let job = Job::new(
        "regions",
        JobConfig {
            store: Some(Arc::clone(store)),
            ..config(2, 300)
        },
    );
    let faults = Faults::new(vec![("b-count", 500, FaultKind::Panic)]);
    let a = pipeline(&job, "a", 10_000, &Faults::none(), || true);
    let b = pipeline(&job, "b", 10_000, &faults, || true);
    let running = job.start().expect("the job starts");
    while faults.fired() == 0 {
        thread::sleep(Duration::from_millis(1));
    }
    act(&running);
    (running.wait(), a, b)
}

#[test]
fn stop_with_savepoint_while_a_region_restarts_then_resume() {
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("regions").expect("a memory store"));
    let (stopped, a, b) = during_b_restart(&store, |running| running.stop_with_savepoint());
    let stopped = stopped.expect("the job stops with a savepoint");
    let savepoint = stopped.savepoint.expect("a savepoint was taken");
    assert_eq!(
        stopped.restarts.len(),
        1,
        "B restarted before the savepoint"
    );
    assert!(
        a.output.committed().len() < expected(10_000).len(),
        "the job stopped before the end"
    );
    // A new run on the same store resumes both regions from the savepoint.
    let job = Job::new(
        "regions",
        JobConfig {
            store: Some(Arc::clone(&store)),
            ..config(2, 0)
        },
    );
    let none = Faults::none();
    let a_again = pipeline_into(&job, "a", 10_000, &none, || true, a.output.clone());
    let b_again = pipeline_into(&job, "b", 10_000, &none, || true, b.output.clone());
    let resumed = job.run().expect("the job resumes");
    assert_eq!(resumed.resumed_from, Some(savepoint));
    assert!(resumed.restarts.is_empty());
    assert_eq!(a_again.splits.load(Ordering::SeqCst), 2);
    assert_eq!(b_again.splits.load(Ordering::SeqCst), 2);
    assert_eq!(
        sorted(&a.output),
        expected(10_000),
        "A is exactly-once across the stop"
    );
    assert_eq!(
        sorted(&b.output),
        expected(10_000),
        "B is exactly-once across the stop"
    );
}

#[test]
fn cancel_while_a_region_restarts() {
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("regions").expect("a memory store"));
    let (result, _, _) = during_b_restart(&store, |running| running.cancel());
    let error = result.expect_err("cancelled");
    assert!(matches!(error, JobError::Cancelled), "{error}");
}
