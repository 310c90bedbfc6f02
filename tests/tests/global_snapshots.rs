//! Snapshots that are not checkpoints, in running jobs (issue 15, parts 2
//! and 3): snapshots asked for by the caller beside periodic checkpoints
//! and a restart, consistent and leaving the checkpoints undisturbed;
//! loops ended by a snapshot that proves them quiescent (connected
//! components by label propagation, and a loop whose records sit on its
//! back edge while candidate snapshots are taken); and the stuck detector
//! on a planted wait-for cycle, a planted stalled operator and a busy
//! healthy job. Each case runs at parallelism 1, 2 and 3.
//!
//! Seeds: the graphs of the label propagation come from `TestRng` with the
//! seed printed on failure; `SNAPFLOW_SEED=n` replays seed n.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use snapflow::job::snapshots::detect::Finding;
use snapflow::job::snapshots::{SnapshotError, Waiting};
use snapflow::job::{
    Collector, Job, JobConfig, JobError, JobStatus, Operator, RestartStrategy, RunningJob,
    StuckDetection,
};
use snapflow::protocol::SnapshotMode;
use snapflow::runtime::BoxError;
use snapflow::sink::CollectHandle;
use snapflow::source::{
    Source, SourceError, SourceFactory, SourcePoll, SourcePosition, VecSourceFactory,
};
use snapflow::storage::PartId;
use snapflow::Snapshot;
use snapflow_tests::pipeline::{PacedSourceFactory, Pacing};
use snapflow_tests::{quiet_injected_panics, seeds, FaultKind, Faults, TestRng};

fn config(parallelism: usize) -> JobConfig {
    JobConfig {
        checkpoint_interval_ms: Some(5),
        default_parallelism: parallelism,
        arbiters: Some(2),
        restart: RestartStrategy::FixedDelay {
            attempts_max: 5,
            delay_ms: 0,
        },
        ..JobConfig::default()
    }
}

/// Polls the status until `done` holds, for at most `limit`.
fn await_status(
    running: &RunningJob,
    limit: Duration,
    done: impl Fn(&JobStatus) -> bool,
) -> JobStatus {
    let started = Instant::now();
    loop {
        let status = running.status();
        if done(&status) || started.elapsed() > limit {
            return status;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

#[derive(Snapshot, Debug, Clone, Default, PartialEq, Eq)]
struct Count {
    seen: u64,
}

/// A keyed count with one planned crash, while a thread asks for snapshots
/// of `count` without pause: the output is exactly-once, checkpoints keep
/// completing, and every snapshot is a consistent cut (what the sources
/// sent equals what `count` processed plus what was in flight to it).
fn check_beside_checkpoints(parallelism: usize) {
    check_beside_checkpoints_in(parallelism, SnapshotMode::Aligned);
}

/// [`check_beside_checkpoints`] in `mode`; unaligned checkpoints record
/// `count`'s inputs, so the restart replays records into it.
fn check_beside_checkpoints_in(parallelism: usize, mode: SnapshotMode) {
    quiet_injected_panics();
    let records = 6_000;
    let faults = Faults::new(vec![("count", 2_500, FaultKind::Panic)]);
    let config = JobConfig {
        mode,
        ..config(parallelism)
    };
    let job = Job::new("snapshots-beside-checkpoints", config);
    let output = CollectHandle::new();
    let fault = faults.clone();
    job.source(
        "ids",
        PacedSourceFactory::new(
            records,
            Pacing {
                records_per_read: 16,
            },
        ),
    )
    .key_by(|id: &u64| id % 7)
    .process(
        "count",
        move |_key: &u64, count: &mut Count, id: u64, out| {
            fault.check("count", id)?;
            count.seen += 1;
            out.emit(id);
            Ok(())
        },
    )
    .sink("out", output.clone());
    let running = job.start().expect("the job starts");
    // One snapshot after another, for as long as the job runs.
    let mut answers = Vec::new();
    while !running.status().ended && answers.len() < 2_000 {
        let receiver = running.snapshot("count", answers.len() % parallelism);
        let answer = receiver.wait(Duration::from_secs(30));
        // While the job loads a checkpoint (at the start, and in the
        // restart) the answer comes at once: counted, such answers could
        // use up every try on a loaded machine before a snapshot ran.
        if matches!(answer, Err(SnapshotError::NotRunning { .. })) {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        answers.push(answer);
    }
    let report = running.wait().expect("the job finishes");
    let mut ids = output.committed();
    ids.sort_unstable();
    assert_eq!(ids, (0..records).collect::<Vec<_>>(), "exactly-once output");
    assert_eq!(
        report.restarts.len(),
        1,
        "the planned crash restarted the job once"
    );
    assert!(
        report.failed_checkpoints.is_empty(),
        "{:?}",
        report.failed_checkpoints
    );
    assert!(report.checkpoints.len() > 2, "checkpoints kept completing");
    let mut complete = 0;
    for answer in &answers {
        let snapshot = match answer {
            Ok(snapshot) => snapshot,
            Err(error) => {
                // The restart aborts what is in flight; the end of the job
                // ends the last ones. Nothing else may go wrong.
                assert!(
                    matches!(
                        error,
                        SnapshotError::Aborted { .. }
                            | SnapshotError::NotRunning { .. }
                            | SnapshotError::JobEnded
                    ),
                    "{error}"
                );
                continue;
            }
        };
        complete += 1;
        let sent: u64 = (0..parallelism as u32)
            .filter_map(|subtask| snapshot.subtask("ids", subtask))
            .map(|activity| activity.records_out)
            .sum();
        let processed: u64 = (0..parallelism as u32)
            .filter_map(|subtask| snapshot.subtask("count", subtask))
            .map(|activity| activity.records_in)
            .sum();
        let in_flight: u64 = snapshot
            .channels()
            .iter()
            .filter(|channel| channel.to.operator == "count")
            .map(|channel| channel.records_in_flight)
            .sum();
        assert_eq!(
            sent,
            processed + in_flight,
            "{} is a consistent cut",
            snapshot.id()
        );
        assert_eq!(
            snapshot.subtasks().len(),
            3 * parallelism,
            "every subtask has a part"
        );
        let counts = snapshot
            .view()
            .keyed_state::<u64, Count>("count")
            .expect("the keyed state decodes");
        assert!(counts.len() <= 7);
    }
    assert!(
        complete > 0,
        "some snapshot completed among {}",
        answers.len()
    );
}

#[test]
fn snapshots_beside_checkpoints_and_a_restart_parallelism_1() {
    check_beside_checkpoints(1);
}

#[test]
fn snapshots_beside_checkpoints_and_a_restart_parallelism_2() {
    check_beside_checkpoints(2);
}

#[test]
fn snapshots_beside_checkpoints_and_a_restart_parallelism_3() {
    check_beside_checkpoints(3);
}

#[test]
fn snapshots_beside_unaligned_checkpoints_and_a_restart_parallelism_2() {
    check_beside_checkpoints_in(2, SnapshotMode::Unaligned);
}

#[test]
fn snapshots_beside_unaligned_checkpoints_and_a_restart_parallelism_3() {
    check_beside_checkpoints_in(3, SnapshotMode::Unaligned);
}

#[test]
fn a_snapshot_of_an_unknown_operator_is_a_typed_error() {
    let job = Job::new("unknown-operator", config(1));
    job.source("ids", VecSourceFactory::new((0..10_u64).collect()))
        .sink("out", CollectHandle::new());
    let running = job.start().expect("the job starts");
    let answer = running.snapshot("nope", 0).wait(Duration::from_secs(10));
    assert!(
        matches!(answer, Err(SnapshotError::UnknownOperator { .. })),
        "{answer:?}"
    );
    let answer = running.snapshot("ids", 5).wait(Duration::from_secs(10));
    assert!(
        matches!(answer, Err(SnapshotError::UnknownSubtask { .. })),
        "{answer:?}"
    );
    running.wait().expect("the job finishes");
}

/// A job of `parallelism` independent chains (forward edges only, so
/// each chain is a failover region of its own): a snapshot started at
/// one chain's `map` covers every chain, and each chain's cut is
/// consistent (what its source sent is what its map processed plus what
/// was in flight to it).
fn check_whole_graph(parallelism: usize) {
    let records = 4_000;
    let job = Job::new("whole-graph-snapshots", config(parallelism));
    let output = CollectHandle::new();
    job.source(
        "ids",
        PacedSourceFactory::new(
            records,
            Pacing {
                records_per_read: 16,
            },
        ),
    )
    .map("double", |id: u64| id * 2)
    .sink("out", output.clone());
    let running = job.start().expect("the job starts");
    let mut complete = 0;
    while !running.status().ended && complete < 50 {
        let started_at = complete % parallelism;
        let Ok(snapshot) = running
            .snapshot("double", started_at)
            .wait(Duration::from_secs(30))
        else {
            continue;
        };
        complete += 1;
        assert_eq!(
            snapshot.subtasks().len(),
            3 * parallelism,
            "a snapshot started in one chain covers every chain"
        );
        for subtask in 0..parallelism as u32 {
            let sent = snapshot
                .subtask("ids", subtask)
                .expect("covered")
                .records_out;
            let mapped = snapshot
                .subtask("double", subtask)
                .expect("covered")
                .records_in;
            let in_flight: u64 = snapshot
                .channels()
                .iter()
                .filter(|channel| channel.to.operator == "double" && channel.to.subtask == subtask)
                .map(|channel| channel.records_in_flight)
                .sum();
            assert_eq!(
                sent,
                mapped + in_flight,
                "chain {subtask} of {}",
                snapshot.id()
            );
        }
    }
    running.wait().expect("the job finishes");
    assert!(complete > 0, "some snapshot completed");
    let mut doubled = output.committed();
    doubled.sort_unstable();
    assert_eq!(doubled, (0..records).map(|id| id * 2).collect::<Vec<_>>());
}

#[test]
fn a_snapshot_covers_every_region_parallelism_1() {
    check_whole_graph(1);
}

#[test]
fn a_snapshot_covers_every_region_parallelism_2() {
    check_whole_graph(2);
}

#[test]
fn a_snapshot_covers_every_region_parallelism_3() {
    check_whole_graph(3);
}

/// A vertex and a label it may take (the smallest vertex id reached).
type Label = (u64, u64);

/// What the propagation emits: a new label of a vertex (to the output), or
/// a label proposed to a neighbour (around the loop).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Step {
    Labelled(Label),
    Propose(Label),
}

#[derive(Snapshot, Debug, Clone, Default, PartialEq, Eq)]
struct Component {
    label: u64,
    known: bool,
}

/// Connected components of a random graph by label propagation in a loop
/// that ends when a snapshot proves it quiescent: each vertex's final label
/// is the smallest vertex of its component, as a union-find computes it.
fn check_components(seed: u64, parallelism: usize) {
    let replay = format!("seed {seed} (replay with SNAPFLOW_SEED={seed})");
    let mut rng = TestRng::new(seed);
    let vertices = rng.between(20, 60);
    let mut neighbours = vec![Vec::new(); vertices as usize];
    let mut parent: Vec<u64> = (0..vertices).collect();
    fn root(parent: &mut [u64], v: u64) -> u64 {
        let mut v = v;
        while parent[v as usize] != v {
            v = parent[v as usize];
        }
        v
    }
    for _ in 0..rng.between(vertices / 2, vertices) {
        let (a, b) = (rng.between(0, vertices - 1), rng.between(0, vertices - 1));
        neighbours[a as usize].push(b);
        neighbours[b as usize].push(a);
        let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
        parent[ra.max(rb) as usize] = ra.min(rb);
    }
    let expected: BTreeMap<u64, u64> = (0..vertices).map(|v| (v, root(&mut parent, v))).collect();
    let neighbours = Arc::new(neighbours);
    let job = Job::new("components", config(parallelism));
    let output = CollectHandle::new();
    let (head, feedback) = job
        .source(
            "vertices",
            VecSourceFactory::new((0..vertices).map(|v| (v, v)).collect()),
        )
        .iterate_until_quiescent("propagate");
    let steps = head.key_by(|&(vertex, _): &Label| vertex).process(
        "label",
        move |&vertex: &u64, component: &mut Component, (_, label): Label, out| {
            if component.known && component.label <= label {
                return Ok(());
            }
            component.known = true;
            component.label = label;
            out.emit(Step::Labelled((vertex, label)));
            for &next in &neighbours[vertex as usize] {
                out.emit(Step::Propose((next, label)));
            }
            Ok(())
        },
    );
    steps
        .clone()
        .flat_map("proposals", |step: Step| match step {
            Step::Propose(label) => Some(label),
            Step::Labelled(_) => None,
        })
        .close_loop(feedback);
    steps
        .flat_map("labels", |step: Step| match step {
            Step::Labelled(label) => Some(label),
            Step::Propose(_) => None,
        })
        .sink("out", output.clone());
    let running = job
        .start()
        .unwrap_or_else(|error| panic!("{replay}: {error}"));
    let status = await_status(&running, Duration::from_secs(60), |status| status.ended);
    running
        .wait()
        .unwrap_or_else(|error| panic!("{replay}: {error}"));
    let mut labels: BTreeMap<u64, u64> = BTreeMap::new();
    for (vertex, label) in output.committed() {
        let entry = labels.entry(vertex).or_insert(label);
        *entry = (*entry).min(label);
    }
    assert_eq!(
        labels, expected,
        "{replay}: labels at parallelism {parallelism}"
    );
    assert!(status.ended, "{replay}: the job ended by itself");
}

fn check_components_seeds(parallelism: usize) {
    for seed in seeds("SNAPFLOW_COMPONENTS_SEEDS", 3) {
        check_components(seed, parallelism);
    }
}

#[test]
fn connected_components_end_when_converged_parallelism_1() {
    check_components_seeds(1);
}

#[test]
fn connected_components_end_when_converged_parallelism_2() {
    check_components_seeds(2);
}

#[test]
fn connected_components_end_when_converged_parallelism_3() {
    check_components_seeds(3);
}

/// Every record passes a slow loop body `HOPS` times, so that records sit
/// on the back edge while the loop's candidate snapshots are taken: the
/// loop must not end while any is left, and the snapshots must have seen
/// it busy.
fn check_parked(parallelism: usize) {
    const HOPS: u64 = 12;
    let records = 24;
    let job = Job::new("parked", config(parallelism));
    let output = CollectHandle::new();
    let (head, feedback) = job
        .source(
            "ids",
            VecSourceFactory::new((0..records).map(|id| (id, HOPS)).collect()),
        )
        .iterate_until_quiescent("loop");
    let hopped = head.map("slow", |(id, left): (u64, u64)| {
        thread::sleep(Duration::from_millis(1));
        (id, left - 1)
    });
    hopped
        .clone()
        .filter("again", |&(_, left): &(u64, u64)| left > 0)
        .close_loop(feedback);
    hopped
        .filter("done", |&(_, left): &(u64, u64)| left == 0)
        .sink("out", output.clone());
    let running = job.start().expect("the job starts");
    let status = await_status(&running, Duration::from_secs(60), |status| status.ended);
    running.wait().expect("the job finishes");
    let mut done: Vec<u64> = output.committed().into_iter().map(|(id, _)| id).collect();
    done.sort_unstable();
    assert_eq!(
        done,
        (0..records).collect::<Vec<_>>(),
        "no record was cut off"
    );
    assert!(
        status.loop_checks_busy > 0,
        "candidate snapshots saw the loop busy: {status:?}"
    );
    assert_eq!(status.loops_ended_by_snapshot, parallelism as u64);
}

#[test]
fn a_loop_with_records_on_its_back_edge_does_not_end_parallelism_1() {
    check_parked(1);
}

#[test]
fn a_loop_with_records_on_its_back_edge_does_not_end_parallelism_2() {
    check_parked(2);
}

#[test]
fn a_loop_with_records_on_its_back_edge_does_not_end_parallelism_3() {
    check_parked(3);
}

/// Holds every record and declares that it waits for `upstream` (like a
/// join waiting for its other side that never comes).
#[derive(Snapshot, Default)]
struct Hold {
    held: u64,
    #[snapshot(skip)]
    upstream: String,
    /// Let every `release`-th record go on (0: none), to be a busy
    /// operator that also holds records.
    #[snapshot(skip)]
    release: u64,
}

impl Operator for Hold {
    type In = u64;
    type Out = u64;

    fn on_record(&mut self, record: u64, out: &mut Collector<'_, u64>) -> Result<(), BoxError> {
        self.held += 1;
        if self.release > 0 && self.held >= self.release {
            self.held = 0;
            out.emit(record);
        }
        Ok(())
    }

    fn restore_from(&mut self, restored: Self) {
        self.held = restored.held;
    }

    /// A busy operator (one that lets records go) lets the rest go when
    /// its input ends, as a batching operator flushes: a subtask whose
    /// source split ended before the others' would otherwise hold its last
    /// few records while the job runs on, which the detector rightly calls
    /// a stall (seen at parallelism 3 on a loaded machine). The planted
    /// stalls (`release` 0) keep holding.
    fn on_end_of_input(&mut self, _out: &mut Collector<'_, u64>) -> Result<(), BoxError> {
        if self.release > 0 {
            self.held = 0;
        }
        Ok(())
    }

    fn waiting(&self) -> Waiting {
        let for_operators = if self.upstream.is_empty() {
            Vec::new()
        } else {
            vec![self.upstream.clone()]
        };
        Waiting {
            holding: self.held,
            for_operators,
        }
    }
}

fn detection() -> StuckDetection {
    StuckDetection {
        interval_ms: 10,
        stalled_after_snapshots: 3,
        timeout_ms: 5_000,
    }
}

/// A loop whose body holds every record waiting for the loop head, which
/// waits for the body: a wait-for cycle with nothing in flight.
fn check_deadlock(parallelism: usize) {
    let job = Job::new("deadlock", config(parallelism));
    let (head, feedback) = job
        .source("ids", VecSourceFactory::new((0..20_u64).collect()))
        .iterate("loop", 60_000);
    head.operator("hold", |_| Hold {
        upstream: "loop".into(),
        ..Hold::default()
    })
    .close_loop(feedback);
    let running = job.start().expect("the job starts");
    running.detect_stuck(detection());
    // Forward edges: each subtask's loop is a region of its own, with a
    // deadlock of its own.
    let deadlocks = |status: &JobStatus| -> Vec<Vec<PartId>> {
        status
            .stuck
            .iter()
            .filter_map(|finding| match finding {
                Finding::Deadlock { subtasks } => Some(subtasks.clone()),
                _ => None,
            })
            .collect()
    };
    let status = await_status(&running, Duration::from_secs(30), |status| {
        deadlocks(status).len() == parallelism
    });
    running.cancel();
    assert!(matches!(running.wait(), Err(JobError::Cancelled)));
    let mut found = deadlocks(&status);
    found.sort();
    let expected: Vec<Vec<PartId>> = (0..parallelism as u32)
        .map(|subtask| vec![PartId::new("hold", subtask), PartId::new("loop", subtask)])
        .collect();
    assert_eq!(found, expected, "{status:?}");
}

/// A chain whose last map is slow: its upstream `relay` fills its output
/// window and waits for credit. Detector snapshots then time out, and the
/// finding says who waits for whom: `relay[i]` for `slow[i]`.
fn check_backpressured(parallelism: usize) {
    let config = JobConfig {
        batch_size_max: 16,
        window_batches: 2,
        // One thread per subtask of a chain, so that the slow map blocks
        // nobody else's thread.
        arbiters: Some(4),
        ..config(parallelism)
    };
    let job = Job::new("backpressured", config);
    job.source("ids", VecSourceFactory::new((0..100_000_u64).collect()))
        .map("relay", |id: u64| id)
        .map("slow", |id: u64| {
            thread::sleep(Duration::from_millis(20));
            id
        })
        .sink("out", CollectHandle::new());
    let running = job.start().expect("the job starts");
    running.detect_stuck(StuckDetection {
        interval_ms: 10,
        stalled_after_snapshots: 3,
        timeout_ms: 200,
    });
    let waits = |status: &JobStatus| -> Vec<(PartId, Vec<PartId>)> {
        let mut waits: Vec<_> = status
            .stuck
            .iter()
            .filter_map(|finding| match finding {
                Finding::Backpressured {
                    subtask,
                    waiting_for,
                } if subtask.operator == "relay" => Some((subtask.clone(), waiting_for.clone())),
                _ => None,
            })
            .collect();
        waits.sort();
        waits
    };
    let status = await_status(&running, Duration::from_secs(30), |status| {
        waits(status).len() == parallelism
    });
    running.cancel();
    assert!(matches!(running.wait(), Err(JobError::Cancelled)));
    let expected: Vec<(PartId, Vec<PartId>)> = (0..parallelism as u32)
        .map(|subtask| {
            (
                PartId::new("relay", subtask),
                vec![PartId::new("slow", subtask)],
            )
        })
        .collect();
    assert_eq!(waits(&status), expected, "{status:?}");
}

#[test]
fn a_subtask_blocked_on_credits_is_found_waiting_for_its_receiver_parallelism_1() {
    check_backpressured(1);
}

#[test]
fn a_subtask_blocked_on_credits_is_found_waiting_for_its_receiver_parallelism_2() {
    check_backpressured(2);
}

#[test]
fn a_subtask_blocked_on_credits_is_found_waiting_for_its_receiver_parallelism_3() {
    check_backpressured(3);
}

#[test]
fn a_planted_wait_for_cycle_is_found_parallelism_1() {
    check_deadlock(1);
}

#[test]
fn a_planted_wait_for_cycle_is_found_parallelism_2() {
    check_deadlock(2);
}

#[test]
fn a_planted_wait_for_cycle_is_found_parallelism_3() {
    check_deadlock(3);
}

/// Produces `records` ids, then never ends and never produces again (a
/// live source gone quiet).
struct QuietAfter {
    records: u64,
}

struct QuietSource {
    next: u64,
    end: u64,
}

impl SourceFactory for QuietAfter {
    type Source = QuietSource;

    fn split(&self, subtask: usize, _parallelism: usize) -> Result<QuietSource, SourceError> {
        let start = subtask as u64 * self.records;
        Ok(QuietSource {
            next: start,
            end: start + self.records,
        })
    }
}

impl Source for QuietSource {
    type Item = u64;

    fn poll_batch(
        &mut self,
        out: &mut Vec<u64>,
        max_records: usize,
    ) -> Result<SourcePoll, SourceError> {
        if self.next >= self.end || max_records == 0 {
            return Ok(SourcePoll::Idle);
        }
        out.push(self.next);
        self.next += 1;
        Ok(SourcePoll::Produced(1))
    }

    fn position(&self) -> SourcePosition {
        SourcePosition::from_bytes(self.next.to_le_bytes().to_vec())
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), SourceError> {
        let bytes: [u8; 8] =
            position
                .as_bytes()
                .try_into()
                .map_err(|_| SourceError::MalformedPosition {
                    length_bytes: position.as_bytes().len(),
                })?;
        self.next = u64::from_le_bytes(bytes);
        Ok(())
    }
}

/// An operator that holds what it got from a quiet live source and makes
/// no progress: a stall (not a deadlock: the source could still produce).
fn check_stall(parallelism: usize) {
    let job = Job::new("stall", config(parallelism));
    job.source("quiet", QuietAfter { records: 5 })
        .operator("stuck", |_| Hold::default())
        .sink("out", CollectHandle::new());
    let running = job.start().expect("the job starts");
    running.detect_stuck(detection());
    let status = await_status(&running, Duration::from_secs(30), |status| {
        let stalled = status
            .stuck
            .iter()
            .filter(|finding| matches!(finding, Finding::Stalled { .. }))
            .count();
        stalled == parallelism
    });
    running.cancel();
    assert!(matches!(running.wait(), Err(JobError::Cancelled)));
    for finding in &status.stuck {
        let Finding::Stalled {
            subtask,
            holding,
            snapshots,
        } = finding
        else {
            panic!("only stalls: {status:?}");
        };
        assert_eq!(subtask.operator, "stuck");
        assert!(*holding > 0 && *snapshots >= 3, "{finding}");
    }
    assert_eq!(status.stuck.len(), parallelism, "{status:?}");
}

#[test]
fn a_planted_stalled_operator_is_found_parallelism_1() {
    check_stall(1);
}

#[test]
fn a_planted_stalled_operator_is_found_parallelism_2() {
    check_stall(2);
}

#[test]
fn a_planted_stalled_operator_is_found_parallelism_3() {
    check_stall(3);
}

/// A busy job whose operator holds records most of the time (it lets every
/// tenth go) and declares that it waits for its upstream: the detector
/// reports nothing while it runs. Its threshold is 20 snapshots 10 ms
/// apart, not [`detection`]'s 3: on a loaded 2-core machine the paced
/// source was once starved for the 30 ms in which three snapshots saw the
/// same records held, and a stall is a lack of progress over time, which
/// the planted cases show with the short threshold.
fn check_healthy(parallelism: usize) {
    let job = Job::new("healthy", config(parallelism));
    job.source(
        "ids",
        PacedSourceFactory::new(
            8_000,
            Pacing {
                records_per_read: 8,
            },
        ),
    )
    .operator("batching", |_| Hold {
        upstream: "ids".into(),
        release: 10,
        ..Hold::default()
    })
    .key_by(|id: &u64| id % 5)
    .process("count", |_key: &u64, count: &mut Count, _id: u64, out| {
        count.seen += 1;
        out.emit(count.seen);
        Ok(())
    })
    .sink("out", CollectHandle::new());
    let running = job.start().expect("the job starts");
    running.detect_stuck(StuckDetection {
        stalled_after_snapshots: 20,
        ..detection()
    });
    let mut rounds = 0;
    let started = Instant::now();
    loop {
        let status = running.status();
        assert!(
            status.stuck.is_empty(),
            "a healthy job has no findings: {status:?}"
        );
        if status.ended || started.elapsed() > Duration::from_secs(60) {
            break;
        }
        rounds = status.snapshots_completed;
        thread::sleep(Duration::from_millis(2));
    }
    running.wait().expect("the job finishes");
    assert!(
        rounds >= 3,
        "the detector took snapshots while the job ran ({rounds})"
    );
}

#[test]
fn a_busy_job_has_no_findings_parallelism_1() {
    check_healthy(1);
}

#[test]
fn a_busy_job_has_no_findings_parallelism_2() {
    check_healthy(2);
}

#[test]
fn a_busy_job_has_no_findings_parallelism_3() {
    check_healthy(3);
}
