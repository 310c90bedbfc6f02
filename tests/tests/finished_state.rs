//! A job run again on the store of a run that finished resumes from that
//! run's final checkpoint and runs nothing (`JobReport::already_finished`);
//! its keyed state handle must still show the final per-key state, read
//! from that checkpoint, at the parallelism the job declares now, with
//! both keyed-state layouts (flat, and copy-on-write from the first key)
//! and with incremental checkpoints. Before, the handle came back empty.

use std::collections::HashMap;
use std::sync::Arc;

use snapflow::job::{Job, JobConfig, JobError, KeyedStateHandle};
use snapflow::sink::CollectHandle;
use snapflow::source::VecSourceFactory;
use snapflow::storage::{CheckpointStore, MemoryCheckpointStore};

const RECORDS: u64 = 5_003;
const KEYS: u64 = 97;

#[derive(snapflow::Snapshot, Default, Clone, Debug, PartialEq)]
struct Count {
    count: u64,
}

/// The keyed count on `store`, committing to `output`, with the count at
/// `parallelism` (the source and the sink at 2: they keep theirs), and
/// its state handle.
fn declare(
    store: &Arc<dyn CheckpointStore>,
    output: &CollectHandle<(u64, u64)>,
    parallelism: usize,
    copy_on_write_threshold_keys: usize,
) -> (Job, KeyedStateHandle<u64, Count>) {
    let config = JobConfig {
        store: Some(Arc::clone(store)),
        checkpoint_interval_ms: Some(20),
        default_parallelism: 2,
        copy_on_write_threshold_keys,
        ..JobConfig::default()
    };
    let job = Job::new("finished-state", config);
    let (counts, state) = job
        .source("sequence", VecSourceFactory::new((0..RECORDS).collect()))
        .key_by(|i: &u64| i % KEYS)
        .process_with_state("count", |key: &u64, state: &mut Count, _i: u64, out| {
            state.count += 1;
            out.emit((*key, state.count));
            Ok(())
        });
    let counts = counts.parallelism(parallelism);
    counts.sink("collect", output.clone());
    (job, state)
}

fn expected() -> HashMap<u64, Count> {
    (0..KEYS)
        .map(|key| {
            let count = RECORDS / KEYS + u64::from(key < RECORDS % KEYS);
            (key, Count { count })
        })
        .collect()
}

/// Runs the count to its end at `first`, then again on the same store at
/// `second`; returns the second run's report and state.
fn run_twice(
    first: usize,
    second: usize,
    copy_on_write_threshold_keys: usize,
) -> Result<(snapflow::job::JobReport, HashMap<u64, Count>, usize), JobError> {
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("finished-state").expect("a memory store"));
    // The collect sink's transactions live in its handle: both runs share
    // it, as a file sink's would share a directory.
    let output = CollectHandle::new();
    let (job, state) = declare(&store, &output, first, copy_on_write_threshold_keys);
    let report = job.run().expect("the first run");
    assert!(!report.already_finished);
    assert_eq!(state.snapshot(), expected(), "the first run's final state");
    let committed = output.committed().len();
    assert_eq!(committed as u64, RECORDS);
    let (job, state) = declare(&store, &output, second, copy_on_write_threshold_keys);
    let report = job.run()?;
    Ok((
        report,
        state.snapshot(),
        output.committed().len() - committed,
    ))
}

fn check(first: usize, second: usize, copy_on_write_threshold_keys: usize) {
    let (report, state, emitted_again) =
        run_twice(first, second, copy_on_write_threshold_keys).expect("the second run");
    assert!(report.already_finished, "{report:?}");
    assert!(report.checkpoints.is_empty(), "{:?}", report.checkpoints);
    assert_eq!(emitted_again, 0, "a finished job commits nothing again");
    assert_eq!(
        state,
        expected(),
        "the handle shows the final checkpoint's state"
    );
}

#[test]
fn flat_parallelism_1() {
    check(1, 1, 65_536);
}

#[test]
fn flat_parallelism_2() {
    check(2, 2, 65_536);
}

#[test]
fn flat_parallelism_3() {
    check(3, 3, 65_536);
}

#[test]
fn copy_on_write_parallelism_2() {
    check(2, 2, 0);
}

#[test]
fn copy_on_write_parallelism_3() {
    check(3, 3, 0);
}

#[test]
fn rescaled_2_to_3() {
    check(2, 3, 0);
}

#[test]
fn rescaled_3_to_1() {
    check(3, 1, 65_536);
}
