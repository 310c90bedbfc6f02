//! The spilling keyed-state backend (`KeyedBackend::Spilling`, feature
//! `spill`) against the in-memory one, through the public API:
//!
//! - the keyed test pipeline is exact on both backends at parallelism 1, 2
//!   and 3, failure-free and with injected failures (each restart restores
//!   the spilling backend from a checkpoint), and so is the in-memory
//!   backend copy-on-write from the start and switching to it mid-run
//!   (`JobConfig::copy_on_write_threshold_keys`);
//! - a job cancelled after checkpoints of one backend resumes on the other
//!   (and on the same) at another parallelism, 2 -> 3 and 3 -> 1, with every
//!   key's state exact, and so between the flat and the copy-on-write
//!   in-memory layouts;
//! - a job with a budget of a few keys per subtask, so that nearly all of
//!   its thousands of keys live on disk, commits exactly the output of the
//!   in-memory run and leaves its working directory empty.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use snapflow::job::{Job, JobConfig, JobError, KeyedBackend};
use snapflow::sink::CollectHandle;
use snapflow::source::VecSourceFactory;
use snapflow::storage::{CheckpointStore, MemoryCheckpointStore};
use snapflow::Snapshot;
use snapflow_tests::pipeline::{declare, expected, faulty_collect, Pacing};
use snapflow_tests::touch;
use snapflow_tests::{FaultKind, Faults};

const RECORDS: u64 = 3_000;
const PACING: Pacing = Pacing {
    records_per_read: 16,
};

/// Which backend a run uses; the spilling one keeps `memory_entries` keys
/// per subtask in memory. The in-memory one runs flat (`Memory`, the
/// default threshold is far above these tests' keys), copy-on-write from
/// the start (`CopyOnWrite`, threshold 0) or switching to copy-on-write
/// mid-run (`Adaptive`, at a threshold below the pipeline's keys per
/// subtask).
#[derive(Debug, Clone, Copy)]
enum Backend {
    Memory,
    CopyOnWrite,
    Adaptive { threshold_keys: usize },
    Spilling { memory_entries: usize },
}

/// Switches each subtask of the 37-key pipeline to copy-on-write after a
/// handful of keys.
const ADAPTIVE: Backend = Backend::Adaptive { threshold_keys: 6 };

/// The pipeline's 37 keys over at most 3 subtasks: 2 in memory leaves most
/// of each subtask's keys on disk.
const TINY: Backend = Backend::Spilling { memory_entries: 2 };

impl Backend {
    /// The job's settings for this backend, over `config`.
    fn apply(self, dir: &Path, config: JobConfig) -> JobConfig {
        JobConfig {
            keyed_backend: self.config(dir),
            copy_on_write_threshold_keys: match self {
                Backend::CopyOnWrite => 0,
                Backend::Adaptive { threshold_keys } => threshold_keys,
                _ => config.copy_on_write_threshold_keys,
            },
            ..config
        }
    }

    fn config(self, dir: &Path) -> KeyedBackend {
        match self {
            Backend::Memory | Backend::CopyOnWrite | Backend::Adaptive { .. } => {
                KeyedBackend::Memory
            }
            Backend::Spilling { memory_entries } => KeyedBackend::Spilling {
                dir: dir.to_path_buf(),
                memory_entries,
            },
        }
    }
}

/// Every entry of `dir`, for the check that nothing is left behind.
fn entries(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|read| read.flatten().map(|entry| entry.path()).collect())
        .unwrap_or_default()
}

/// Runs the keyed pipeline on `backend` with every operator at
/// `parallelism`, checkpointing, with `faults`; checks the committed
/// output and every key's final state against the direct computation.
fn check(backend: Backend, parallelism: usize, faults: Faults) {
    let work = tempfile::tempdir().expect("a temporary directory");
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("spill").expect("a memory store"));
    let config = backend.apply(
        work.path(),
        JobConfig {
            checkpoint_interval_ms: Some(10),
            store: Some(store),
            ..JobConfig::default()
        },
    );
    let job = Job::new("spill", config);
    let (sink, output) = faulty_collect(&faults);
    let state = declare(&job, RECORDS, [parallelism; 6], PACING, &faults, sink);
    let report = job
        .run()
        .unwrap_or_else(|error| panic!("{backend:?} at {parallelism}: the job fails: {error}"));
    let (want_output, want_state) = expected(RECORDS);
    let mut got = output.committed();
    got.sort_unstable();
    assert!(
        got == want_output,
        "{backend:?} at {parallelism}: the committed output differs"
    );
    assert_eq!(
        state.snapshot(),
        want_state,
        "{backend:?} at {parallelism}: the final states differ"
    );
    assert_eq!(
        report.restarts.len(),
        faults.fired(),
        "{backend:?} at {parallelism}: one restart per injected failure"
    );
    assert!(
        entries(work.path()).is_empty(),
        "{backend:?} at {parallelism}: the working directory is left with {:?}",
        entries(work.path())
    );
}

#[test]
fn the_keyed_pipeline_is_exact_on_both_backends() {
    for backend in [Backend::Memory, Backend::CopyOnWrite, ADAPTIVE, TINY] {
        for parallelism in 1..=3 {
            check(backend, parallelism, Faults::none());
        }
    }
}

#[test]
fn the_spilling_backend_restores_after_injected_failures() {
    for parallelism in 1..=3 {
        let faults = Faults::new(vec![
            ("count", 700, FaultKind::Error),
            ("count", 1_900, FaultKind::Panic),
        ]);
        check(TINY, parallelism, faults);
    }
}

#[test]
fn the_copy_on_write_state_restores_after_injected_failures() {
    for backend in [Backend::CopyOnWrite, ADAPTIVE] {
        for parallelism in 1..=3 {
            let faults = Faults::new(vec![
                ("count", 700, FaultKind::Error),
                ("count", 1_900, FaultKind::Panic),
            ]);
            check(backend, parallelism, faults);
        }
    }
}

// ----- a checkpoint of one backend restored into another -----

const RESCALE_RECORDS: u64 = 3_000;
const LIMIT: Duration = Duration::from_secs(60);

/// Runs the pipeline on `first` at `from` until a checkpoint completed,
/// cancels it, and resumes on `second` at `to` from that checkpoint.
fn cancel_then_resume(first: Backend, from: usize, second: Backend, to: usize) {
    let work = tempfile::tempdir().expect("a temporary directory");
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("switch").expect("a memory store"));
    let config = |backend: Backend| {
        backend.apply(
            work.path(),
            JobConfig {
                checkpoint_interval_ms: Some(5),
                store: Some(Arc::clone(&store)),
                ..JobConfig::default()
            },
        )
    };
    let pacing = Pacing {
        records_per_read: 4,
    };
    let output = CollectHandle::new();
    let job = Job::new("switch", config(first));
    declare(
        &job,
        RESCALE_RECORDS,
        [1, 1, 1, from, 1, 1],
        pacing,
        &Faults::none(),
        output.clone(),
    );
    let running = job.start().expect("the first run starts");
    let started = Instant::now();
    // Two checkpoints, so that the keyed state has changed since the
    // first and the restored one holds keys on disk.
    while store.list().map_or(0, |list| list.len()) < 2 && started.elapsed() < LIMIT {
        thread::sleep(Duration::from_millis(2));
    }
    running.cancel();
    match running.wait() {
        Err(JobError::Cancelled) | Ok(_) => {}
        Err(other) => panic!("{first:?} {from} -> {second:?} {to}: the first run failed: {other}"),
    }
    let restored = store
        .list()
        .expect("the store lists")
        .last()
        .map(|entry| entry.checkpoint)
        .expect("a checkpoint completed");
    let job = Job::new("switch", config(second));
    let state = declare(
        &job,
        RESCALE_RECORDS,
        [1, 1, 1, to, 1, 1],
        pacing,
        &Faults::none(),
        output.clone(),
    );
    let report = job.run().expect("the job resumes on the other backend");
    let case = format!("{first:?} at {from} -> {second:?} at {to}");
    assert_eq!(report.resumed_from, Some(restored), "{case}");
    let (want_output, want_state) = expected(RESCALE_RECORDS);
    let mut got = output.committed();
    got.sort_unstable();
    assert!(got == want_output, "{case}: the committed output differs");
    assert_eq!(
        state.snapshot(),
        want_state,
        "{case}: the final states differ"
    );
}

#[test]
fn a_checkpoint_restores_into_the_other_backend_and_rescales() {
    for (first, second) in [
        (Backend::Memory, TINY),
        (TINY, Backend::Memory),
        (TINY, TINY),
        (Backend::Memory, Backend::CopyOnWrite),
        (Backend::CopyOnWrite, Backend::Memory),
        (ADAPTIVE, TINY),
    ] {
        cancel_then_resume(first, 2, second, 3);
        cancel_then_resume(first, 3, second, 1);
    }
}

// ----- most keys on disk -----

#[derive(Snapshot, Default, Clone, Debug, PartialEq)]
struct Seen {
    count: u64,
    last: u64,
}

/// What the count emits: key, count so far, record.
type Emitted = (u64, u64, u64);

const MANY_KEYS: u64 = 4_000;
const MANY_RECORDS: u64 = 20_000;

/// A count over `MANY_KEYS` keys at parallelism 2 with checkpoints: the
/// sorted output and the final states.
fn many_keys_run(backend: Backend) -> (Vec<Emitted>, HashMap<u64, Seen>) {
    let work = tempfile::tempdir().expect("a temporary directory");
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("many").expect("a memory store"));
    let config = JobConfig {
        checkpoint_interval_ms: Some(20),
        store: Some(store),
        default_parallelism: 2,
        keyed_backend: backend.config(work.path()),
        ..JobConfig::default()
    };
    let job = Job::new("many", config);
    let output = CollectHandle::new();
    // A multiplicative spread, so that consecutive records hit keys far
    // apart and the budget is exceeded at once.
    let records: Vec<u64> = (0..MANY_RECORDS).collect();
    let (counted, state) = job
        .source("numbers", VecSourceFactory::new(records))
        .parallelism(1)
        .key_by(|&id: &u64| id.wrapping_mul(2_654_435_761) % MANY_KEYS)
        .process_with_state("count", |key: &u64, seen: &mut Seen, id: u64, out| {
            seen.count += 1;
            seen.last = id;
            out.emit((*key, seen.count, id));
            Ok(())
        });
    counted.sink("collect", output.clone()).parallelism(1);
    job.run().expect("the job runs");
    assert!(
        entries(work.path()).is_empty(),
        "{backend:?}: the working directory is left with {:?}",
        entries(work.path())
    );
    let mut got = output.committed();
    got.sort_unstable();
    (got, state.snapshot())
}

#[test]
fn a_tiny_memory_budget_gives_the_output_of_the_in_memory_run() {
    let (want_output, want_state) = many_keys_run(Backend::Memory);
    assert_eq!(want_state.len() as u64, MANY_KEYS);
    let (got_output, got_state) = many_keys_run(Backend::Spilling { memory_entries: 16 });
    assert!(got_output == want_output, "the committed output differs");
    assert!(got_state == want_state, "the final states differ");
}

#[test]
fn a_spilling_backend_without_budget_is_refused() {
    let work = tempfile::tempdir().expect("a temporary directory");
    let config = JobConfig {
        keyed_backend: KeyedBackend::Spilling {
            dir: work.path().to_path_buf(),
            memory_entries: 0,
        },
        ..JobConfig::default()
    };
    let job = Job::new("refused", config);
    declare(
        &job,
        10,
        [1; 6],
        PACING,
        &Faults::none(),
        CollectHandle::new(),
    );
    match job.run() {
        Err(JobError::InvalidConfig(message)) => {
            assert!(message.contains("memory_entries"), "{message}")
        }
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

// ----- bytes written follow the keys touched -----

/// Keys in the first phase (one record each), most of them on disk.
const TOUCH_KEYS: u64 = 100_000;
/// Keys of the second phase: enough to touch every key group.
const TOUCH_HOT: u64 = 512;
const TOUCH_RECORDS: u64 = 8_000;

/// On the spilling backend, once the state holds 100 k keys (most on
/// disk), a checkpoint after which only a few hundred keys changed, in
/// every key group, writes under 5 % of the state: delta parts of the
/// keys touched, not the key groups (which would be all of it).
#[test]
fn bytes_written_follow_the_keys_touched_on_the_spilling_backend() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let work = tempfile::tempdir().expect("a working directory");
    let store = touch::retaining_store(dir.path(), "touch");
    let config = JobConfig {
        checkpoint_interval_ms: Some(30),
        // Persisted and confirmed before the next one: deltas extend only
        // confirmed chains.
        min_pause_ms: 30,
        store: Some(store),
        incremental_checkpoints: snapflow::job::IncrementalCheckpoints {
            enabled: true,
            full_every: 1_000,
        },
        default_parallelism: 2,
        batch_size_max: 32,
        keyed_backend: KeyedBackend::Spilling {
            dir: work.path().to_path_buf(),
            memory_entries: 4_000,
        },
        ..JobConfig::default()
    };
    let job = Job::new("touch", config);
    let output = touch::declare_touch(&job, TOUCH_KEYS + TOUCH_RECORDS, TOUCH_KEYS, |id| {
        if id < TOUCH_KEYS {
            id
        } else {
            id % TOUCH_HOT
        }
    });
    let report = job.run().expect("the job runs");
    let sizes: Vec<(u64, u64)> = report
        .checkpoints
        .iter()
        .map(|checkpoint| (checkpoint.written_bytes, checkpoint.size_bytes))
        .collect();
    eprintln!("written/size per checkpoint: {sizes:?}");
    let small = sizes
        .iter()
        .filter(|(written, size)| *size > 500_000 && written * 20 < *size)
        .count();
    assert!(
        small >= 2,
        "at least two checkpoints of the whole state write under 5 % of it: {sizes:?}"
    );
    assert_eq!(
        output.committed().len() as u64,
        TOUCH_KEYS + TOUCH_RECORDS,
        "every record once"
    );
}
