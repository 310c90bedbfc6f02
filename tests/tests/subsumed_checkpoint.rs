//! A periodic checkpoint still being written when every input ends is
//! subsumed by the final checkpoint: its writing stops before its next
//! part, nothing of it is stored or committed, the final checkpoint does
//! not wait behind it, and state and committed output are exactly those of
//! a run without it.
//!
//! The store holds the first checkpoint's first part until the test sees
//! the final checkpoint triggered (the supervisor marks older checkpoints
//! subsumed just before), so the order is fixed, not raced.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use snapflow::job::{Job, JobConfig, JobReport};
use snapflow::storage::{CheckpointId, CheckpointStore, StoreError};
use snapflow_tests::hooked_store::{HookedStore, StoreHooks};
use snapflow_tests::pipeline::{declare, expected, faulty_collect, Pacing};
use snapflow_tests::Faults;

const RECORDS: u64 = 2_000;

/// How long the held part waits for the gate at most, so that a broken
/// run fails its assertions instead of hanging.
const HOLD_MAX: Duration = Duration::from_secs(30);

/// A memory store that holds the first part of the first checkpoint it
/// is asked to write until [`Gate::open`], and records what it
/// committed.
type GatedStore = HookedStore<Gate>;

#[derive(Debug, Default)]
struct Gate {
    open: AtomicBool,
    /// The first checkpoint begun (0: none yet).
    held: AtomicU64,
    parts_of_held: AtomicU64,
    committed: Mutex<Vec<u64>>,
}

impl Gate {
    fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
    }

    fn wait_for_gate(&self) {
        let started = Instant::now();
        while !self.open.load(Ordering::SeqCst) && started.elapsed() < HOLD_MAX {
            thread::sleep(Duration::from_millis(1));
        }
    }
}

impl StoreHooks for Gate {
    fn on_begin(&self, checkpoint: CheckpointId) {
        let _ = self
            .held
            .compare_exchange(0, checkpoint, Ordering::SeqCst, Ordering::SeqCst);
    }

    fn before_write_part(&self, checkpoint: CheckpointId) -> Result<(), StoreError> {
        if checkpoint == self.held.load(Ordering::SeqCst)
            && self.parts_of_held.fetch_add(1, Ordering::SeqCst) == 0
        {
            self.wait_for_gate();
        }
        Ok(())
    }

    fn before_commit(&self, checkpoint: CheckpointId) {
        self.committed.lock().unwrap().push(checkpoint);
    }
}

/// Runs the keyed pipeline at `parallelism` against a [`GatedStore`],
/// opening the gate once a checkpoint newer than the held one is
/// triggered, and checks exactly-once state and output.
fn check(parallelism: usize) -> (Arc<GatedStore>, JobReport) {
    let store = Arc::new(HookedStore::new("gated", Gate::default()));
    let config = JobConfig {
        checkpoint_interval_ms: Some(5),
        store: Some(Arc::clone(&store) as Arc<dyn CheckpointStore>),
        default_parallelism: parallelism,
        batch_size_max: 16,
        arbiters: Some(2),
        ..JobConfig::default()
    };
    let job = Job::new("subsumed", config);
    let faults = Faults::none();
    let (sink, output) = faulty_collect(&faults);
    let pacing = Pacing {
        records_per_read: 16,
    };
    let state = declare(&job, RECORDS, [parallelism; 6], pacing, &faults, sink);
    let running = job.start().expect("the job starts");
    let started = Instant::now();
    while started.elapsed() < HOLD_MAX {
        let held = store.hooks.held.load(Ordering::SeqCst);
        let newer = held != 0
            && running
                .metrics()
                .checkpoints
                .iter()
                .any(|checkpoint| checkpoint.id > held);
        if newer {
            break;
        }
        thread::sleep(Duration::from_millis(1));
    }
    store.hooks.open();
    let report = running.wait().expect("the job completes");
    let (expected_output, expected_state) = expected(RECORDS);
    let mut committed = output.committed();
    committed.sort_unstable();
    assert_eq!(committed, expected_output, "exactly-once output");
    assert_eq!(state.snapshot(), expected_state, "exactly-once state");
    (store, report)
}

fn check_subsumed(parallelism: usize) {
    let (store, report) = check(parallelism);
    let held = store.hooks.held.load(Ordering::SeqCst);
    assert_eq!(report.subsumed_checkpoints, vec![held], "{report:?}");
    assert!(report.failed_checkpoints.is_empty(), "{report:?}");
    let committed = store.hooks.committed.lock().unwrap().clone();
    assert!(
        !committed.contains(&held),
        "the subsumed checkpoint {held} was committed: {committed:?}"
    );
    let stored: Vec<u64> = store
        .list()
        .expect("the store lists")
        .iter()
        .map(|summary| summary.checkpoint)
        .collect();
    assert!(!stored.contains(&held), "{held} is stored: {stored:?}");
    let last = report.checkpoints.last().expect("the final checkpoint");
    assert!(last.checkpoint > held, "{report:?}");
    assert_eq!(stored.last(), Some(&last.checkpoint));
}

#[test]
fn a_checkpoint_written_when_the_inputs_end_is_subsumed_at_parallelism_1() {
    check_subsumed(1);
}

#[test]
fn a_checkpoint_written_when_the_inputs_end_is_subsumed_at_parallelism_2() {
    check_subsumed(2);
}

#[test]
fn a_checkpoint_written_when_the_inputs_end_is_subsumed_at_parallelism_3() {
    check_subsumed(3);
}
