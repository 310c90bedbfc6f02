//! Regional failover: a job with two independent pipelines A and B (no
//! channel between them, so two failover regions). B's keyed operator
//! fails once (a panic, or an `Err`); only B's region restarts, A keeps
//! running without a restart (its source is split exactly once per
//! subtask), both outputs are exactly-once, and the report names B's
//! region in its one restart. Also when A has already read all its input
//! before B fails, when both fail, and a stop with a savepoint or a cancel
//! while B restarts (the savepoint then resumes both exactly-once). At
//! parallelism 1, 2 and 3. A loop (its feedback edge joins its region)
//! next to a pipeline restarts alone too. A seeded run (`SNAPFLOW_REGION_SEEDS`, default
//! 20; `SNAPFLOW_SEED=n` replays seed n) puts random faults into two or
//! three independent pipelines at random parallelism and checkpoint
//! interval.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use snapflow::job::{Job, JobConfig, JobError, JobReport, RestartStrategy};
use snapflow::sink::CollectHandle;
use snapflow::source::{Source, SourceError, SourceFactory, SourcePoll, SourcePosition};
use snapflow::storage::{CheckpointStore, MemoryCheckpointStore};
use snapflow::Snapshot;
use snapflow_tests::pipeline::{PacedSourceFactory, Pacing};
use snapflow_tests::{seeds, FaultKind, Faults, TestRng};

const KEYS: u64 = 11;

/// The pipelines' name prefixes and the names of their keyed operators
/// (fault plans name stages with static strings).
const PREFIXES: [&str; 3] = ["a", "b", "c"];
const COUNTS: [&str; 3] = ["a-count", "b-count", "c-count"];
const A: usize = 0;
const B: usize = 1;

/// A paced source factory that counts its splits (one per subtask start,
/// restarts included) and flags when every split has read all its input.
struct CountedSource {
    inner: PacedSourceFactory,
    splits: Arc<AtomicUsize>,
    exhausted: Arc<AtomicUsize>,
}

struct CountedReader {
    inner: <PacedSourceFactory as SourceFactory>::Source,
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

/// Declares pipeline `index` (prefix p): p-numbers → key_by(id % KEYS) →
/// p-count (emits (key, running count); fails per `faults` once `gate`
/// holds) → p-collect.
fn pipeline(
    job: &Job,
    index: usize,
    records: u64,
    faults: &Faults,
    gate: impl Fn() -> bool + Send + Sync + 'static,
) -> Pipeline {
    pipeline_into(job, index, records, faults, gate, CollectHandle::new())
}

/// [`pipeline`] into an existing output (a resumed job continues the
/// sink's transactions).
fn pipeline_into(
    job: &Job,
    index: usize,
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
    let (prefix, stage) = (PREFIXES[index], COUNTS[index]);
    let faults = faults.clone();
    job.source(&format!("{prefix}-numbers"), source)
        .key_by(|id: &u64| id % KEYS)
        .process(stage, move |key: &u64, seen: &mut Seen, id: u64, out| {
            if gate() {
                faults.check(stage, id)?;
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
/// With `a_finishes_first`, B processes nothing before every subtask of
/// A's source has read all its input, so B fails after that.
fn check(parallelism: usize, kind: FaultKind, a_finishes_first: bool) {
    let (a_records, b_records) = if a_finishes_first {
        (300, 2_000)
    } else {
        (2_000, 2_000)
    };
    let job = Job::new("regions", config(parallelism, 0));
    let b_failure = if a_finishes_first { 1_500 } else { 1_000 };
    let faults = Faults::new(vec![("b-count", b_failure, kind)]);
    let a = pipeline(&job, A, a_records, &Faults::none(), || true);
    let a_exhausted = Arc::clone(&a.exhausted);
    // B's count waits (on its own region's threads) until every subtask
    // of A's source has read all its input, so A has finished its input
    // whatever the machine's load. Bounded, so a bug cannot hang the test.
    // The extra 50 ms once A's sources are done let its end of input flow
    // to its sink, so A's subtasks have all ended when B fails (likely, not
    // asserted).
    let waited = std::sync::atomic::AtomicBool::new(!a_finishes_first);
    let gate = move || {
        if waited.load(Ordering::SeqCst) {
            return true;
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while a_exhausted.load(Ordering::SeqCst) < parallelism
            && std::time::Instant::now() < deadline
        {
            thread::sleep(Duration::from_millis(1));
        }
        thread::sleep(Duration::from_millis(50));
        waited.store(true, Ordering::SeqCst);
        true
    };
    let b = pipeline(&job, B, b_records, &faults, gate);
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
    let a = pipeline(&job, A, 2_000, &a_faults, || true);
    let b = pipeline(&job, B, 2_000, &b_faults, || true);
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
    let a = pipeline(&job, A, 10_000, &Faults::none(), || true);
    let b = pipeline(&job, B, 10_000, &faults, || true);
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
    let a_again = pipeline_into(&job, A, 10_000, &none, || true, a.output.clone());
    let b_again = pipeline_into(&job, B, 10_000, &none, || true, b.output.clone());
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

/// One seed: 2 or 3 pipelines of 300 to 1,500 records at parallelism 1 to
/// 3, checkpoints every 2 to 20 ms, and 0 to 2 faults (panic or error) per
/// pipeline on random records. `Err` says what diverged.
fn run_seed(seed: u64) -> Result<(), String> {
    let mut rng = TestRng::new(seed);
    let parallelism = rng.between(1, 3) as usize;
    let pipelines = rng.between(2, 3) as usize;
    let interval_ms = rng.between(2, 20);
    let job = Job::new(
        "regions",
        JobConfig {
            checkpoint_interval_ms: Some(interval_ms),
            restart: RestartStrategy::FixedDelay {
                attempts_max: 10,
                delay_ms: 0,
            },
            ..config(parallelism, 0)
        },
    );
    let mut declared = Vec::new();
    for (index, &stage) in COUNTS.iter().enumerate().take(pipelines) {
        let records = rng.between(300, 1_500);
        let planned: Vec<(&'static str, u64, FaultKind)> = (0..rng.between(0, 2))
            .map(|_| {
                let kind = if rng.chance(50) {
                    FaultKind::Panic
                } else {
                    FaultKind::Error
                };
                (stage, rng.between(0, records - 1), kind)
            })
            .collect();
        let faults = Faults::new(planned);
        let pipeline = pipeline(&job, index, records, &faults, || true);
        declared.push((records, faults, pipeline));
    }
    let plan = format!("p={parallelism}, interval {interval_ms} ms, {pipelines} pipelines");
    let report = job.run().map_err(|error| format!("{plan}: {error}"))?;
    for (index, (records, faults, pipeline)) in declared.iter().enumerate() {
        let prefix = PREFIXES[index];
        if sorted(&pipeline.output) != expected(*records) {
            return Err(format!("{plan}: pipeline {prefix} is not exactly-once"));
        }
        let region = [
            format!("{prefix}-numbers"),
            format!("{prefix}-count"),
            format!("{prefix}-collect"),
        ];
        let restarts = report
            .restarts
            .iter()
            .filter(|r| r.region == region)
            .count();
        // Faults in two subtasks of one generation can both fire before
        // the region stops: one restart for both.
        let fired = faults.fired();
        if fired != faults.planned() || restarts > fired || (restarts == 0) != (fired == 0) {
            return Err(format!(
                "{plan}: pipeline {prefix} planned {} faults, fired {fired}, restarted {restarts} times",
                faults.planned(),
            ));
        }
        let splits = pipeline.splits.load(Ordering::SeqCst);
        if splits != parallelism * (1 + restarts) {
            return Err(format!(
                "{plan}: pipeline {prefix} started {splits} source subtasks for {restarts} restarts"
            ));
        }
    }
    let named: usize = (0..pipelines)
        .map(|index| {
            let prefix = PREFIXES[index];
            let count = format!("{prefix}-count");
            report
                .restarts
                .iter()
                .filter(|restart| restart.region.contains(&count))
                .count()
        })
        .sum();
    if named != report.restarts.len() {
        return Err(format!("{plan}: restarts {:?}", report.restarts));
    }
    Ok(())
}

#[test]
fn random_faults_restart_only_their_pipeline() {
    for seed in seeds("SNAPFLOW_REGION_SEEDS", 20) {
        let (sender, receiver) = mpsc::channel();
        thread::spawn(move || {
            let _ = sender.send(run_seed(seed));
        });
        // A hang is a failure too; the watchdog names the seed.
        let replay = format!("seed {seed} (replay with SNAPFLOW_SEED={seed})");
        match receiver.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(())) => {}
            Ok(Err(divergence)) => panic!("{replay}: {divergence}"),
            Err(_) => panic!("{replay} did not finish in 60 s"),
        }
    }
}

#[derive(Snapshot, Default, Clone, Debug)]
struct Hops {
    count: u64,
}

/// l-ids → l-loop (iteration head) → l-hop (keyed; each id passes it
/// `id % 3 + 1` times, failing per `faults`) → l-again (back to the head)
/// and l-exit → l-collect.
fn loop_pipeline(job: &Job, records: u64, faults: &Faults) -> CollectHandle<u64> {
    let output = CollectHandle::new();
    let pacing = Pacing {
        records_per_read: 16,
    };
    let (head, feedback) = job
        .source("l-ids", PacedSourceFactory::new(records, pacing))
        .map("l-hops", |id: u64| (id, id % 3 + 1))
        .iterate("l-loop", 100);
    let faults = faults.clone();
    let hopped = head.key_by(|&(id, _): &(u64, u64)| id).process(
        "l-hop",
        move |&id: &u64, hops: &mut Hops, (_, remaining): (u64, u64), out| {
            faults.check("l-hop", id * 10 + remaining)?;
            hops.count += 1;
            out.emit((id, remaining - 1));
            Ok(())
        },
    );
    hopped
        .clone()
        .filter("l-again", |&(_, remaining): &(u64, u64)| remaining > 0)
        .close_loop(feedback);
    hopped
        .filter("l-exit", |&(_, remaining): &(u64, u64)| remaining == 0)
        .map("l-done", |(id, _): (u64, u64)| id)
        .sink("l-collect", output.clone());
    output
}

#[test]
fn a_failure_inside_a_loop_restarts_only_the_loop() {
    let job = Job::new("regions", config(2, 0));
    let a = pipeline(&job, A, 2_000, &Faults::none(), || true);
    let faults = Faults::new(vec![("l-hop", 300 * 10 + 1, FaultKind::Panic)]);
    let loop_output = loop_pipeline(&job, 600, &faults);
    let report = job.run().expect("the job recovers");
    assert_eq!(faults.fired(), 1);
    assert_eq!(sorted(&a.output), expected(2_000));
    let mut ids = loop_output.committed();
    ids.sort_unstable();
    assert_eq!(ids, (0..600).collect::<Vec<_>>(), "every id leaves once");
    assert_eq!(report.restarts.len(), 1, "{:?}", report.restarts);
    let region = &report.restarts[0].region;
    assert!(region.iter().any(|name| name == "l-hop"), "{region:?}");
    assert!(region.iter().any(|name| name == "l-again"), "{region:?}");
    assert!(
        region.iter().all(|name| name.starts_with("l-")),
        "{region:?}"
    );
    assert_eq!(a.splits.load(Ordering::SeqCst), 2, "A never restarted");
}
