//! The operator API end to end, at parallelism 1, 2 and 3 with periodic
//! checkpoints and injected failures: `reduce` and `aggregate` per key
//! emit exactly one running result per record and end at the direct
//! computation; a custom [`Operator`]'s hooks run in the documented order
//! and its state survives restarts exactly-once (and cannot change its
//! parallelism on restore); a broadcast edge delivers every record to every
//! downstream subtask exactly once; and bad graphs are typed errors before
//! anything starts.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use snapflow::job::{
    Aggregator, Collector, Job, JobConfig, JobError, JobReport, Operator, OperatorContext,
    RestartStrategy,
};
use snapflow::protocol::SnapshotMode;
use snapflow::runtime::BoxError;
use snapflow::sink::CollectHandle;
use snapflow::source::VecSourceFactory;
use snapflow::storage::{CheckpointStore, MemoryCheckpointStore};
use snapflow::Snapshot;
use snapflow_tests::pipeline::{PacedSourceFactory, Pacing};
use snapflow_tests::{quiet_injected_panics, FaultKind, Faults};

const RECORDS: u64 = 1_500;
const KEYS: u64 = 7;
const PACING: Pacing = Pacing {
    records_per_read: 32,
};

/// The value of record `id` (positive, so running sums strictly grow).
fn value(id: u64) -> u64 {
    id + 1
}

fn config(parallelism: usize) -> JobConfig {
    JobConfig {
        checkpoint_interval_ms: Some(5),
        default_parallelism: parallelism,
        max_parallelism: 16,
        batch_size_max: 16,
        arbiters: Some(2),
        restart: RestartStrategy::FixedDelay {
            attempts_max: 5,
            delay_ms: 0,
        },
        ..JobConfig::default()
    }
}

/// Per key: how many records and their total value.
fn direct_totals() -> BTreeMap<u64, (u64, u64)> {
    let mut totals = BTreeMap::new();
    for id in 0..RECORDS {
        let entry = totals.entry(id % KEYS).or_insert((0, 0));
        entry.0 += 1;
        entry.1 += value(id);
    }
    totals
}

/// Runs a job and checks that every planned fault fired and restarted it.
fn run(job: Job, faults: &Faults) -> JobReport {
    quiet_injected_panics();
    let report = job.run().expect("the job runs");
    assert_eq!(faults.fired(), faults.planned(), "every fault fired");
    assert_eq!(
        report.restarts.len(),
        faults.planned(),
        "one restart per fault"
    );
    report
}

fn two_faults(stage: &'static str) -> Faults {
    Faults::new(vec![
        (stage, 400, FaultKind::Error),
        (stage, 1_100, FaultKind::Panic),
    ])
}

// ---------------------------------------------------------------- reduce

fn check_reduce(parallelism: usize, faults: Faults) {
    let job = Job::new("reduce", config(parallelism));
    let output = CollectHandle::new();
    let in_reduce = faults.clone();
    job.source("ids", PacedSourceFactory::new(RECORDS, PACING))
        .map("pair", |id: u64| (id % KEYS, value(id)))
        .key_by(|&(key, _): &(u64, u64)| key)
        .reduce(
            "sum",
            move |&(key, sum): &(u64, u64), (_, value): (u64, u64)| {
                in_reduce.check_or_panic("sum", value - 1);
                (key, sum + value)
            },
        )
        .sink("collect", output.clone());
    run(job, &faults);
    let mut emitted: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (key, sum) in output.committed() {
        emitted.entry(key).or_default().push(sum);
    }
    for (key, (count, total)) in direct_totals() {
        let mut sums = emitted.remove(&key).unwrap_or_default();
        sums.sort_unstable();
        sums.dedup();
        assert_eq!(
            sums.len() as u64,
            count,
            "key {key}: one distinct sum per record"
        );
        assert_eq!(sums.last().copied(), Some(total), "key {key}: final sum");
    }
    assert!(emitted.is_empty(), "unexpected keys {emitted:?}");
}

#[test]
fn reduce_parallelism_1() {
    check_reduce(1, two_faults("sum"));
}

#[test]
fn reduce_parallelism_2() {
    check_reduce(2, two_faults("sum"));
}

#[test]
fn reduce_parallelism_3() {
    check_reduce(3, two_faults("sum"));
}

// ------------------------------------------------------------- aggregate

/// Counts and sums the values per key; fails on planned record ids.
struct CountSum {
    faults: Faults,
}

#[derive(Snapshot, Default, Clone)]
struct CountSumState {
    count: u64,
    sum: u64,
}

impl Aggregator<u64> for CountSum {
    type Accumulator = CountSumState;
    type Output = (u64, u64);

    fn add(&self, accumulator: &mut CountSumState, id: u64) -> Result<(), BoxError> {
        self.faults.check("count", id)?;
        accumulator.count += 1;
        accumulator.sum += value(id);
        Ok(())
    }

    fn result(&self, accumulator: &CountSumState) -> (u64, u64) {
        (accumulator.count, accumulator.sum)
    }
}

fn check_aggregate(parallelism: usize, faults: Faults) {
    let job = Job::new("aggregate", config(parallelism));
    let output = CollectHandle::new();
    let aggregator = CountSum {
        faults: faults.clone(),
    };
    job.source("ids", PacedSourceFactory::new(RECORDS, PACING))
        .key_by(|id: &u64| id % KEYS)
        .aggregate("count", aggregator)
        .sink("collect", output.clone());
    run(job, &faults);
    let mut emitted: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for (key, result) in output.committed() {
        emitted.entry(key).or_default().push(result);
    }
    for (key, (count, total)) in direct_totals() {
        let mut results = emitted.remove(&key).unwrap_or_default();
        results.sort_unstable();
        let counts: Vec<u64> = results.iter().map(|&(count, _)| count).collect();
        let expected: Vec<u64> = (1..=count).collect();
        assert_eq!(counts, expected, "key {key}: one result per record");
        assert_eq!(results.last(), Some(&(count, total)), "key {key}: final");
    }
    assert!(emitted.is_empty(), "unexpected keys {emitted:?}");
}

#[test]
fn aggregate_parallelism_1() {
    check_aggregate(1, two_faults("count"));
}

#[test]
fn aggregate_parallelism_2() {
    check_aggregate(2, two_faults("count"));
}

#[test]
fn aggregate_parallelism_3() {
    check_aggregate(3, two_faults("count"));
}

// -------------------------------------------------------------- Operator

/// A hook call, as the operator saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hook {
    Created,
    /// `on_restore(checkpoint)`, with the `last_checkpoint` field as
    /// restored (set by `on_checkpoint`, so it must equal `checkpoint`).
    Restored {
        checkpoint: u64,
        last_checkpoint: u64,
    },
    Record,
    Checkpoint(u64),
    Complete(u64),
    End,
}

/// Every hook call of every instance: (instance, hook).
type HookLog = Arc<Mutex<Vec<(u64, Hook)>>>;

/// What a `Summer` instance gets from its test, not part of its state.
struct Probe {
    instance: u64,
    subtask: usize,
    log: HookLog,
    faults: Faults,
    /// The first `on_checkpoint_complete` of the job fails once, so that a
    /// restart restores a checkpoint whatever the timing.
    fail_complete: Arc<AtomicBool>,
}

impl Probe {
    fn record(&self, hook: Hook) {
        let mut log = self
            .log
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        log.push((self.instance, hook));
    }
}

/// Sums its input; emits `(subtask, seen, sum)` at the end of input.
#[derive(Snapshot, Default)]
struct Summer {
    seen: u64,
    sum: u64,
    last_checkpoint: u64,
    #[snapshot(skip)]
    probe: Option<Probe>,
}

impl Summer {
    fn probe(&self) -> Result<&Probe, BoxError> {
        self.probe
            .as_ref()
            .ok_or_else(|| "the probe was lost".into())
    }
}

impl Operator for Summer {
    type In = u64;
    type Out = (usize, u64, u64);

    fn on_record(&mut self, id: u64, _out: &mut Collector<'_, Self::Out>) -> Result<(), BoxError> {
        let probe = self.probe()?;
        probe.faults.check("summer", id)?;
        probe.record(Hook::Record);
        self.seen += 1;
        self.sum += value(id);
        Ok(())
    }

    fn on_checkpoint(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        self.probe()?.record(Hook::Checkpoint(checkpoint));
        self.last_checkpoint = checkpoint;
        Ok(())
    }

    fn on_checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        let probe = self.probe()?;
        probe.record(Hook::Complete(checkpoint));
        if probe.fail_complete.swap(false, Ordering::SeqCst) {
            return Err(format!("injected failure on completing checkpoint {checkpoint}").into());
        }
        Ok(())
    }

    fn restore_from(&mut self, restored: Self) {
        let probe = self.probe.take();
        *self = restored;
        self.probe = probe;
    }

    fn on_restore(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        self.probe()?.record(Hook::Restored {
            checkpoint,
            last_checkpoint: self.last_checkpoint,
        });
        Ok(())
    }

    fn on_end_of_input(&mut self, out: &mut Collector<'_, Self::Out>) -> Result<(), BoxError> {
        let probe = self.probe()?;
        probe.record(Hook::End);
        out.emit((probe.subtask, self.seen, self.sum));
        Ok(())
    }
}

/// The shared side of a `Summer` job.
#[derive(Clone, Default)]
struct SummerProbes {
    log: HookLog,
    instances: Arc<AtomicU64>,
    faults: Faults,
    fail_complete: Arc<AtomicBool>,
}

/// ids (parallelism 1) → summer (`parallelism`) → collect (parallelism 1).
fn declare_summer(
    job: &Job,
    parallelism: usize,
    probes: &SummerProbes,
    output: &CollectHandle<(usize, u64, u64)>,
) {
    let probes = probes.clone();
    job.source("ids", PacedSourceFactory::new(RECORDS, PACING))
        .parallelism(1)
        .operator("summer", move |context: &OperatorContext| {
            let probe = Probe {
                instance: probes.instances.fetch_add(1, Ordering::SeqCst),
                subtask: context.subtask,
                log: Arc::clone(&probes.log),
                faults: probes.faults.clone(),
                fail_complete: Arc::clone(&probes.fail_complete),
            };
            probe.record(Hook::Created);
            Summer {
                probe: Some(probe),
                ..Summer::default()
            }
        })
        .parallelism(parallelism)
        .sink("collect", output.clone())
        .parallelism(1);
}

/// Checks one instance's hooks against the documented order.
fn check_instance_hooks(instance: u64, hooks: &[Hook], restored_from: &[u64]) {
    let context = format!("instance {instance}: {hooks:?}");
    assert_eq!(hooks.first(), Some(&Hook::Created), "{context}");
    let (mut last, mut snapshotted, mut ended) = (None, Vec::new(), false);
    for (index, hook) in hooks.iter().enumerate().skip(1) {
        match *hook {
            Hook::Created => panic!("{context}: created twice"),
            Hook::Restored {
                checkpoint,
                last_checkpoint,
            } => {
                assert_eq!(index, 1, "{context}: restored after other hooks");
                assert!(restored_from.contains(&checkpoint), "{context}");
                assert_eq!(
                    last_checkpoint, checkpoint,
                    "{context}: on_checkpoint state"
                );
                last = Some(checkpoint);
            }
            Hook::Record => assert!(!ended, "{context}: a record after the end"),
            Hook::Checkpoint(checkpoint) => {
                assert!(
                    last < Some(checkpoint),
                    "{context}: checkpoints out of order"
                );
                last = Some(checkpoint);
                snapshotted.push(checkpoint);
            }
            Hook::Complete(checkpoint) => assert!(
                snapshotted.contains(&checkpoint),
                "{context}: completed {checkpoint} without its on_checkpoint"
            ),
            Hook::End => {
                assert!(!ended, "{context}: ended twice");
                ended = true;
            }
        }
    }
}

fn check_hooks(log: &HookLog, report: &JobReport) {
    let restored_from: Vec<u64> = report
        .restarts
        .iter()
        .filter_map(|restart| restart.restored_from)
        .chain(report.resumed_from)
        .collect();
    let log = log.lock().expect("the log").clone();
    let mut by_instance: BTreeMap<u64, Vec<Hook>> = BTreeMap::new();
    for (instance, hook) in log {
        by_instance.entry(instance).or_default().push(hook);
    }
    for (instance, hooks) in &by_instance {
        check_instance_hooks(*instance, hooks, &restored_from);
    }
}

fn check_operator(parallelism: usize, mode: SnapshotMode) {
    let probes = SummerProbes {
        faults: Faults::new(vec![("summer", 700, FaultKind::Error)]),
        fail_complete: Arc::new(AtomicBool::new(true)),
        ..SummerProbes::default()
    };
    let job = Job::new(
        "operator",
        JobConfig {
            mode,
            ..config(parallelism)
        },
    );
    let output = CollectHandle::new();
    declare_summer(&job, parallelism, &probes, &output);
    quiet_injected_panics();
    let report = job.run().expect("the job runs");
    assert_eq!(probes.faults.fired(), 1);
    assert!(!probes.fail_complete.load(Ordering::SeqCst));
    assert_eq!(report.restarts.len(), 2, "{:?}", report.restarts);
    assert!(
        report
            .restarts
            .iter()
            .any(|restart| restart.restored_from.is_some()),
        "the failure on completion restores a checkpoint: {:?}",
        report.restarts
    );
    let mut ends = output.committed();
    ends.sort_unstable();
    let subtasks: Vec<usize> = ends.iter().map(|&(subtask, ..)| subtask).collect();
    assert_eq!(subtasks, (0..parallelism).collect::<Vec<_>>());
    let seen: u64 = ends.iter().map(|&(_, seen, _)| seen).sum();
    let sum: u64 = ends.iter().map(|&(.., sum)| sum).sum();
    assert_eq!((seen, sum), (RECORDS, (1..=RECORDS).sum()));
    check_hooks(&probes.log, &report);
}

#[test]
fn operator_parallelism_1() {
    check_operator(1, SnapshotMode::Aligned);
}

#[test]
fn operator_parallelism_2() {
    check_operator(2, SnapshotMode::Aligned);
}

#[test]
fn operator_parallelism_3() {
    check_operator(3, SnapshotMode::Aligned);
}

#[test]
fn operator_unaligned_parallelism_2() {
    check_operator(2, SnapshotMode::Unaligned);
}

/// What a `Summer` job commits: `(subtask, seen, sum)`.
type Ends = Vec<(usize, u64, u64)>;

/// Runs the summer job to its end on a store, then again on the same store
/// at `resumed` parallelism.
fn resume_summer(resumed: usize) -> Result<(JobReport, SummerProbes, Ends), JobError> {
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("summer").expect("a memory store"));
    let config = JobConfig {
        store: Some(store),
        ..config(2)
    };
    // The collect sink's transactions live in its handle: both runs share
    // it, as a file sink's would share a directory.
    let output = CollectHandle::new();
    let job = Job::new("summer", config.clone());
    declare_summer(&job, 2, &SummerProbes::default(), &output);
    job.run().expect("the first run");
    assert_eq!(output.committed().len(), 2);
    let probes = SummerProbes::default();
    let job = Job::new("summer", config);
    declare_summer(&job, resumed, &probes, &output);
    let report = job.run()?;
    Ok((report, probes, output.committed()))
}

#[test]
fn a_finished_job_resumes_as_finished_and_runs_nothing() {
    let (report, probes, output) = resume_summer(2).expect("resumed");
    assert!(report.resumed_from.is_some());
    assert!(report.already_finished, "{report:?}");
    assert!(report.checkpoints.is_empty(), "{:?}", report.checkpoints);
    assert_eq!(output.len(), 2, "emitted again: {output:?}");
    // Its final checkpoint says every input ended: no operator is even
    // restored, so none can end twice.
    let log = probes.log.lock().expect("the log").clone();
    assert!(log.is_empty(), "{log:?}");
}

#[test]
fn operator_state_cannot_change_its_parallelism_on_restore() {
    let Err(error) = resume_summer(3) else {
        panic!("a rescaled operator state was accepted");
    };
    assert!(
        matches!(error, JobError::RescaleUnsupported { ref operator, .. } if operator == "summer"),
        "{error}"
    );
    assert!(!error.is_retryable());
}

// ------------------------------------------------------------- broadcast

/// Tags each record with the subtask that saw it.
#[derive(Snapshot, Default)]
struct Tagger {
    seen: u64,
    #[snapshot(skip)]
    subtask: usize,
    #[snapshot(skip)]
    faults: Faults,
}

impl Operator for Tagger {
    type In = u64;
    type Out = (usize, u64);

    fn on_record(
        &mut self,
        id: u64,
        out: &mut Collector<'_, (usize, u64)>,
    ) -> Result<(), BoxError> {
        self.faults.check("tag", id)?;
        self.seen += 1;
        out.emit((self.subtask, id));
        Ok(())
    }

    fn restore_from(&mut self, restored: Self) {
        self.seen = restored.seen;
    }
}

fn tagger(faults: &Faults) -> impl Fn(&OperatorContext) -> Tagger + Send + Sync + 'static {
    let faults = faults.clone();
    move |context: &OperatorContext| Tagger {
        seen: 0,
        subtask: context.subtask,
        faults: faults.clone(),
    }
}

fn check_broadcast(parallelism: usize, mode: SnapshotMode) {
    let faults = two_faults("tag");
    let job = Job::new(
        "broadcast",
        JobConfig {
            mode,
            ..config(parallelism)
        },
    );
    let output = CollectHandle::new();
    let tags = parallelism + 1;
    job.source("ids", PacedSourceFactory::new(RECORDS, PACING))
        .broadcast()
        .operator("tag", tagger(&faults))
        .parallelism(tags)
        .sink("collect", output.clone());
    let report = run(job, &faults);
    let mut committed = output.committed();
    committed.sort_unstable();
    let expected: Vec<(usize, u64)> = (0..tags)
        .flat_map(|subtask| (0..RECORDS).map(move |id| (subtask, id)))
        .collect();
    assert!(
        committed == expected,
        "{} committed, {} expected",
        committed.len(),
        expected.len()
    );
    let tag = report.operator("tag").expect("reported");
    assert!(tag.records_in >= RECORDS * tags as u64);
}

#[test]
fn broadcast_parallelism_1() {
    check_broadcast(1, SnapshotMode::Aligned);
}

#[test]
fn broadcast_parallelism_2() {
    check_broadcast(2, SnapshotMode::Aligned);
}

#[test]
fn broadcast_parallelism_3() {
    check_broadcast(3, SnapshotMode::Aligned);
}

#[test]
fn broadcast_unaligned_parallelism_2() {
    check_broadcast(2, SnapshotMode::Unaligned);
}

/// Which halves of the input (split over two source subtasks) each of two
/// tag subtasks saw.
fn halves_seen(
    partition: fn(snapflow::job::Stream<'_, u64>) -> snapflow::job::Stream<'_, u64>,
) -> HashMap<usize, Vec<bool>> {
    let job = Job::new("partition", config(2));
    let output = CollectHandle::new();
    let stream = job.source("ids", VecSourceFactory::new((0..200_u64).collect()));
    partition(stream)
        .operator("tag", tagger(&Faults::none()))
        .sink("collect", output.clone());
    job.run().expect("the job runs");
    let mut halves: HashMap<usize, Vec<bool>> = HashMap::new();
    for (subtask, id) in output.committed() {
        let seen = halves.entry(subtask).or_insert_with(|| vec![false, false]);
        seen[usize::from(id >= 100)] = true;
    }
    halves
}

#[test]
fn forward_keeps_subtasks_and_rebalance_spreads() {
    let forward = halves_seen(|stream| stream.forward());
    assert_eq!(forward[&0], [true, false]);
    assert_eq!(forward[&1], [false, true]);
    let rebalance = halves_seen(|stream| stream.rebalance());
    assert_eq!(rebalance[&0], [true, true]);
    assert_eq!(rebalance[&1], [true, true]);
}

// ------------------------------------------------------------ bad graphs

fn build_error(declare: impl FnOnce(&Job)) -> JobError {
    let job = Job::new("bad", JobConfig::default());
    declare(&job);
    job.run().expect_err("the graph is rejected")
}

fn numbers(job: &Job) -> snapflow::job::Stream<'_, u64> {
    job.source("numbers", VecSourceFactory::new(vec![1_u64, 2, 3]))
}

#[test]
fn a_forward_edge_between_different_parallelisms_is_rejected() {
    let error = build_error(|job| {
        numbers(job)
            .forward()
            .map("double", |n| n * 2)
            .parallelism(2)
            .sink("out", CollectHandle::new());
    });
    assert!(
        matches!(
            error,
            JobError::ForwardParallelismMismatch { ref from, ref to, from_parallelism: 1, to_parallelism: 2 }
                if from == "numbers" && to == "double"
        ),
        "{error}"
    );
}

#[test]
fn a_reduce_named_like_another_operator_is_rejected() {
    let error = build_error(|job| {
        numbers(job)
            .key_by(|n: &u64| n % 2)
            .reduce("numbers", |a, b| a + b)
            .sink("out", CollectHandle::new());
    });
    assert!(
        matches!(error, JobError::DuplicateName { ref name } if name == "numbers"),
        "{error}"
    );
}

#[test]
fn an_operator_named_like_a_sink_is_rejected() {
    let error = build_error(|job| {
        numbers(job)
            .operator("out", tagger(&Faults::none()))
            .sink("out", CollectHandle::new());
    });
    assert!(
        matches!(error, JobError::DuplicateName { ref name } if name == "out"),
        "{error}"
    );
}

#[test]
fn an_iteration_never_closed_is_rejected() {
    let error = build_error(|job| {
        let (head, _feedback) = numbers(job).iterate("loop", 10);
        head.sink("out", CollectHandle::new());
    });
    assert!(
        matches!(error, JobError::LoopNotClosed { ref name } if name == "loop"),
        "{error}"
    );
}

#[test]
fn streams_of_two_jobs_cannot_be_joined() {
    let other = Job::new("other", JobConfig::default());
    let error = build_error(|job| {
        numbers(job)
            .union(numbers(&other))
            .sink("out", CollectHandle::new());
    });
    assert!(matches!(error, JobError::MixedJobs), "{error}");
    let error = build_error(|job| {
        let (head, feedback) = numbers(job).iterate("loop", 10);
        numbers(&other).close_loop(feedback);
        head.sink("out", CollectHandle::new());
    });
    assert!(matches!(error, JobError::MixedJobs), "{error}");
}
