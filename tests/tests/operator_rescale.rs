//! A custom operator's state restored at another parallelism through
//! `Operator::rescale`: a job stopped with a savepoint mid-stream at one
//! parallelism resumes at another, and the operator's totals still count
//! every record exactly once. An operator that does not implement
//! `rescale` is refused with a typed error.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use snapflow::job::inspect::CheckpointView;
use snapflow::job::{
    Collector, Job, JobConfig, JobError, JobReport, Operator, OperatorContext, RestartStrategy,
};
use snapflow::runtime::BoxError;
use snapflow::sink::CollectHandle;
use snapflow::storage::{CheckpointStore, MemoryCheckpointStore};
use snapflow::Snapshot;
use snapflow_tests::pipeline::{PacedSourceFactory, Pacing};

const RECORDS: u64 = 2_000;
const PACING: Pacing = Pacing {
    records_per_read: 8,
};
/// The first run is stopped with a savepoint once its operator has seen
/// this many records (or after `FIRST_RUN_WAIT_MS_MAX`).
const FIRST_RUN_RECORDS: u64 = 100;
const FIRST_RUN_WAIT_MS_MAX: u64 = 10_000;

/// Counts and sums its records; emits `(subtask, seen, sum)` at the end.
/// Totals add up, so `rescale` puts them all on the new subtask 0.
#[derive(Snapshot, Default)]
struct Total {
    seen: u64,
    sum: u64,
    #[snapshot(skip)]
    subtask: usize,
    /// Records seen by every instance of the run, for the test to wait on.
    #[snapshot(skip)]
    progress: Option<Arc<AtomicU64>>,
}

impl Operator for Total {
    type In = u64;
    type Out = (usize, u64, u64);

    fn on_record(&mut self, id: u64, _: &mut Collector<'_, Self::Out>) -> Result<(), BoxError> {
        self.seen += 1;
        self.sum += id;
        if let Some(progress) = &self.progress {
            progress.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn restore_from(&mut self, restored: Self) {
        (self.seen, self.sum) = (restored.seen, restored.sum);
    }

    fn on_end_of_input(&mut self, out: &mut Collector<'_, Self::Out>) -> Result<(), BoxError> {
        out.emit((self.subtask, self.seen, self.sum));
        Ok(())
    }

    fn rescale(old: Vec<Self>, parallelism: usize) -> Option<Vec<Self>> {
        let mut new: Vec<Self> = (0..parallelism).map(|_| Total::default()).collect();
        let first = new.first_mut()?;
        for total in old {
            first.seen += total.seen;
            first.sum += total.sum;
        }
        Some(new)
    }
}

/// The same state without `rescale`: its parallelism must not change.
#[derive(Snapshot, Default)]
struct FixedTotal {
    seen: u64,
    #[snapshot(skip)]
    progress: Option<Arc<AtomicU64>>,
}

impl Operator for FixedTotal {
    type In = u64;
    type Out = u64;

    fn on_record(&mut self, _: u64, _: &mut Collector<'_, u64>) -> Result<(), BoxError> {
        self.seen += 1;
        if let Some(progress) = &self.progress {
            progress.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

fn config(store: &Arc<dyn CheckpointStore>) -> JobConfig {
    JobConfig {
        checkpoint_interval_ms: Some(5),
        max_parallelism: 16,
        batch_size_max: 16,
        arbiters: Some(2),
        store: Some(Arc::clone(store)),
        restart: RestartStrategy::FixedDelay {
            attempts_max: 3,
            delay_ms: 0,
        },
        ..JobConfig::default()
    }
}

/// A paced source at parallelism 1, `operator` at `parallelism`, and a
/// collecting sink at parallelism 1 (sources and sinks keep theirs).
fn declare<O: Operator<In = u64>>(
    job: &Job,
    parallelism: usize,
    operator: impl Fn(&OperatorContext) -> O + Send + Sync + 'static,
    output: &CollectHandle<O::Out>,
) {
    job.source("ids", PacedSourceFactory::new(RECORDS, PACING))
        .parallelism(1)
        .operator("total", operator)
        .parallelism(parallelism)
        .sink("collect", output.clone())
        .parallelism(1);
}

/// Runs the job at `from` until `progress` reaches `FIRST_RUN_RECORDS`,
/// stops it with a savepoint, then resumes it at `to`. Returns the
/// savepoint's report and the resumed run's.
fn stop_then_resume<O: Operator<In = u64>>(
    store: &Arc<dyn CheckpointStore>,
    (from, to): (usize, usize),
    operator: impl Fn(&OperatorContext) -> O + Clone + Send + Sync + 'static,
    progress: &AtomicU64,
    output: &CollectHandle<O::Out>,
) -> (JobReport, Result<JobReport, JobError>) {
    let first = Job::new("rescale", config(store));
    declare(&first, from, operator.clone(), output);
    let running = first.start().expect("the first run starts");
    let started = Instant::now();
    while progress.load(Ordering::Relaxed) < FIRST_RUN_RECORDS
        && started.elapsed() < Duration::from_millis(FIRST_RUN_WAIT_MS_MAX)
    {
        thread::sleep(Duration::from_millis(1));
    }
    running.stop_with_savepoint();
    let stopped = running.wait().expect("the first run stops");
    let second = Job::new("rescale", config(store));
    declare(&second, to, operator, output);
    (stopped, second.run())
}

/// Makes `Total`s that count their records into `progress`.
fn total(
    progress: &Arc<AtomicU64>,
) -> impl Fn(&OperatorContext) -> Total + Clone + Send + Sync + 'static {
    let progress = Arc::clone(progress);
    move |context: &OperatorContext| Total {
        subtask: context.subtask,
        progress: Some(Arc::clone(&progress)),
        ..Total::default()
    }
}

/// Stops at `from` mid-stream, resumes at `to`: the ends of the resumed
/// subtasks add up to every record once, and the savepoint carried a
/// partial total across the change.
fn check(from: usize, to: usize) {
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("rescale").expect("a memory store"));
    let output = CollectHandle::new();
    let progress = Arc::new(AtomicU64::new(0));
    let (stopped, resumed) =
        stop_then_resume(&store, (from, to), total(&progress), &progress, &output);
    let savepoint = stopped.savepoint.expect("the first run took a savepoint");
    let resumed = resumed.expect("the job resumes at the new parallelism");
    assert_eq!(resumed.resumed_from, Some(savepoint), "{from} -> {to}");

    let view = CheckpointView::load(store.as_ref(), savepoint).expect("the savepoint loads");
    let carried: u64 = view
        .operator_states::<Total>("total")
        .expect("the savepoint's states decode")
        .iter()
        .map(|total| total.seen)
        .sum();
    assert!(
        carried > 0 && carried < RECORDS,
        "{from} -> {to}: the savepoint should hold a partial total, held {carried}"
    );

    let ends = output.committed();
    assert_eq!(
        ends.len(),
        to,
        "{from} -> {to}: one end per new subtask: {ends:?}"
    );
    let seen: u64 = ends.iter().map(|&(_, seen, _)| seen).sum();
    let sum: u64 = ends.iter().map(|&(_, _, sum)| sum).sum();
    assert_eq!(
        (seen, sum),
        (RECORDS, (0..RECORDS).sum()),
        "{from} -> {to}: {ends:?}"
    );
}

#[test]
fn operator_state_follows_its_rescale_up_and_down() {
    check(2, 3);
    check(3, 1);
    check(1, 2);
}

#[test]
fn operator_state_without_rescale_keeps_its_parallelism() {
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("fixed").expect("a memory store"));
    let output = CollectHandle::new();
    let progress = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&progress);
    let fixed = move |_: &OperatorContext| FixedTotal {
        seen: 0,
        progress: Some(Arc::clone(&counted)),
    };
    let (stopped, resumed) = stop_then_resume(&store, (2, 3), fixed, &progress, &output);
    assert!(
        stopped.savepoint.is_some(),
        "the first run took a savepoint"
    );
    let error = resumed.expect_err("the rescale is refused");
    assert!(
        matches!(error, JobError::RescaleUnsupported { ref operator, ref reason }
            if operator == "total" && reason.contains("Operator::rescale")),
        "{error}"
    );
    assert!(!error.is_retryable());
}
