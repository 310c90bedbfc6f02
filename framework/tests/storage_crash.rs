//! Crash at every mutating I/O operation of a sequence of commits, reopen
//! with a fresh store, and check that the latest checkpoint is either the
//! last one committed or the one whose commit was running, never a partial
//! one, and that every part of every listed checkpoint verifies.
//!
//! Two models, both from `storage::fault` and `storage::memory`:
//! - process crash on the real file system (`FaultyIo` over `StdIo`, the
//!   process "stops" at operation k; what the kernel accepted stays);
//! - power loss on the simulated `MemFs` (`FaultyIo` over `MemFs`, then
//!   `MemFs::crash` drops what was not fsynced: all of it, none of it, or a
//!   seeded random part of it).
//!
//! Random crash modes take their seed from `SNAPFLOW_SEED` when set; the
//! seed is printed so a failure can be replayed.
//!
//! Every model runs twice: with whole parts, and incrementally, where the
//! `Count` parts of every checkpoint after the first refer to the shared
//! file checkpoint 1 wrote (the savepoint copies it in). After each crash
//! the shared files on disk must be exactly those the listed checkpoints
//! refer to, once the reopened store has committed again.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use snapflow::storage::fault::{AfterFault, FaultPlan, FaultyIo};
use snapflow::storage::io::{Io, StdIo};
use snapflow::storage::memory::{CrashMode, MemFs};
use snapflow::storage::{
    CheckpointKind, CheckpointStore, CommitRequest, FsCheckpointStore, PartId, Segment,
    SharedRange, StoreError, StoreOptions,
};

const JOB: &str = "crash-job";
const RETAINED: usize = 2;
/// Checkpoint 3 is a savepoint, checkpoint 4 is begun and discarded.
const LAST_CHECKPOINT: u64 = 6;
const SAVEPOINT: u64 = 3;
const DISCARDED: u64 = 4;
/// A checkpoint id the reopened store commits to show it can carry on.
const RESUMED: u64 = 100;
/// No sequence here has more mutating operations than this; a loop that
/// reaches it has a bug.
const MAX_OPERATIONS: u64 = 10_000;

fn options() -> StoreOptions {
    StoreOptions {
        retained_checkpoints: RETAINED,
    }
}

fn parts() -> Vec<PartId> {
    vec![
        PartId::new("source", 0),
        PartId::new("Count", 0),
        PartId::new("Count", 1),
    ]
}

fn part_bytes(checkpoint: u64, part: &PartId) -> Vec<u8> {
    format!("{checkpoint}/{part}/")
        .repeat(10 + part.subtask as usize * 7)
        .into_bytes()
}

/// How the sequence writes its parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Every part whole, with `write_part`.
    Whole,
    /// `Count` parts as segments: their own bytes, then the body that
    /// checkpoint 1 wrote shared and every later one reuses.
    Incremental,
}

/// The shared body of an incremental `Count` part.
fn shared_body(part: &PartId) -> Vec<u8> {
    format!("body of {part};").repeat(5).into_bytes()
}

/// Whether `part` of `checkpoint` is written as segments in `mode`.
fn segmented(mode: Mode, checkpoint: u64, part: &PartId) -> bool {
    mode == Mode::Incremental && part.operator == "Count" && checkpoint != RESUMED
}

/// The bytes `part` of `checkpoint` must load as.
fn expected_bytes(mode: Mode, checkpoint: u64, part: &PartId) -> Vec<u8> {
    let mut bytes = part_bytes(checkpoint, part);
    if segmented(mode, checkpoint, part) {
        bytes.extend(shared_body(part));
    }
    bytes
}

/// Writes `part` of `checkpoint` as `mode` says.
fn write(
    store: &FsCheckpointStore,
    mode: Mode,
    checkpoint: u64,
    part: &PartId,
) -> Result<(), StoreError> {
    if !segmented(mode, checkpoint, part) {
        return store
            .write_part(checkpoint, part, &part_bytes(checkpoint, part))
            .map(|_| ());
    }
    let body = shared_body(part);
    let tail = if checkpoint == 1 {
        Segment::Shared(body)
    } else {
        Segment::Reuse(SharedRange {
            checkpoint: 1,
            offset: 0,
            len: body.len() as u64,
            crc32: crc32fast::hash(&body),
        })
    };
    let segments = [Segment::Own(part_bytes(checkpoint, part)), tail];
    store
        .write_part_segments(checkpoint, part, &segments)
        .map(|_| ())
}

/// What the sequence achieved before the fault.
#[derive(Debug, Default)]
struct Progress {
    /// The last checkpoint whose commit returned `Ok`.
    committed: Option<u64>,
    /// The checkpoint whose commit call was running when the fault hit.
    committing: Option<u64>,
}

/// Opens a store through `io` and commits checkpoints 1..=last (3 a
/// savepoint, 4 discarded instead), stopping at the first error.
fn run_sequence(
    io: Arc<dyn Io>,
    root: &Path,
    last: u64,
    mode: Mode,
    progress: &mut Progress,
) -> Result<(), StoreError> {
    let store = FsCheckpointStore::with_io(io, root, JOB, options())?;
    for checkpoint in 1..=last {
        let kind = if checkpoint == SAVEPOINT {
            CheckpointKind::Savepoint
        } else {
            CheckpointKind::Checkpoint
        };
        store.begin(checkpoint, kind)?;
        for part in parts() {
            write(&store, mode, checkpoint, &part)?;
        }
        if checkpoint == DISCARDED {
            store.discard(checkpoint)?;
            continue;
        }
        progress.committing = Some(checkpoint);
        store.commit(checkpoint, CommitRequest::default())?;
        progress.committing = None;
        progress.committed = Some(checkpoint);
    }
    Ok(())
}

/// Reopens the directory with a fault-free store and checks everything the
/// module documentation promises; `context` names the crash point.
fn check_after_crash(io: Arc<dyn Io>, root: &Path, mode: Mode, progress: &Progress, context: &str) {
    let store = FsCheckpointStore::with_io(io.clone(), root, JOB, options())
        .unwrap_or_else(|error| panic!("{context}: reopening failed: {error}"));
    let report = store.load_latest().unwrap();
    assert!(
        report.skipped.is_empty(),
        "{context}: a crash left an invalid checkpoint: {:?}",
        report.skipped
    );
    let latest = report
        .checkpoint
        .as_ref()
        .map(|loaded| loaded.metadata.checkpoint);
    assert!(
        latest == progress.committed || (latest.is_some() && latest == progress.committing),
        "{context}: latest is {latest:?}, progress {progress:?}"
    );
    drop(report);
    check_every_listed(&store, mode, progress, context);
    check_resume(&store, io.as_ref(), mode, context);
}

/// Every listed checkpoint loads with exactly the bytes written, the
/// discarded one never appears, the savepoint survives once committed, and
/// retention never keeps more than one extra checkpoint.
fn check_every_listed(store: &FsCheckpointStore, mode: Mode, progress: &Progress, context: &str) {
    let list = store.list().unwrap();
    for entry in &list {
        assert_ne!(
            entry.checkpoint, DISCARDED,
            "{context}: a discarded checkpoint exists"
        );
        let loaded = store.load(entry.checkpoint).unwrap_or_else(|error| {
            panic!("{context}: {} does not load: {error}", entry.checkpoint)
        });
        assert_eq!(loaded.parts.len(), parts().len(), "{context}");
        for (part, bytes) in &loaded.parts {
            assert_eq!(
                bytes,
                &expected_bytes(mode, entry.checkpoint, part),
                "{context}: {part}"
            );
        }
    }
    if progress.committed >= Some(SAVEPOINT) {
        assert!(
            list.iter().any(|entry| entry.checkpoint == SAVEPOINT),
            "{context}: the savepoint is gone"
        );
    }
    let checkpoints = list
        .iter()
        .filter(|entry| entry.kind == CheckpointKind::Checkpoint)
        .count();
    assert!(checkpoints <= RETAINED + 1, "{context}: {list:?}");
}

/// The reopened store can commit a new checkpoint over whatever the crash
/// left, and its retention then removes every leftover directory.
fn check_resume(store: &FsCheckpointStore, io: &dyn Io, mode: Mode, context: &str) {
    store.begin(RESUMED, CheckpointKind::Checkpoint).unwrap();
    for part in parts() {
        store
            .write_part(RESUMED, &part, &part_bytes(RESUMED, &part))
            .unwrap();
    }
    store.commit(RESUMED, CommitRequest::default()).unwrap();
    let latest = store.load_latest().unwrap().checkpoint.unwrap();
    assert_eq!(latest.metadata.checkpoint, RESUMED, "{context}");
    let on_disk = io.list_dir(&store.job_dir().join("checkpoints")).unwrap();
    let complete = store
        .list()
        .unwrap()
        .iter()
        .filter(|entry| entry.kind == CheckpointKind::Checkpoint)
        .count();
    assert_eq!(
        on_disk.len(),
        complete,
        "{context}: leftovers in {on_disk:?}"
    );
    assert!(complete <= RETAINED, "{context}: {on_disk:?}");
    check_shared_files(store, io, mode, context);
}

/// The shared files on disk are exactly those the listed checkpoints
/// refer to: none deleted that one needs (every listed one loaded above),
/// none left that nothing needs.
fn check_shared_files(store: &FsCheckpointStore, io: &dyn Io, mode: Mode, context: &str) {
    let shared_dir = store.job_dir().join("shared");
    let mut on_disk = Vec::new();
    if let Ok(operators) = io.list_dir(&shared_dir) {
        for operator in operators {
            for file in io.list_dir(&shared_dir.join(&operator.name)).unwrap() {
                on_disk.push(format!("{}/{}", operator.name, file.name));
            }
        }
    }
    let mut referenced = Vec::new();
    for entry in store.list().unwrap() {
        let loaded = store.load(entry.checkpoint).unwrap();
        for (part, shared) in loaded.metadata.shared_files() {
            let operator = snapflow::storage::names::operator_dir_name(&part.operator).unwrap();
            let name = format!("{operator}/{}-{shared:020}.shared", part.subtask);
            if !referenced.contains(&name) {
                referenced.push(name);
            }
        }
    }
    on_disk.sort();
    referenced.sort();
    assert_eq!(on_disk, referenced, "{context}: shared files");
    let lists_six = store
        .list()
        .unwrap()
        .iter()
        .any(|entry| entry.checkpoint == LAST_CHECKPOINT);
    if mode == Mode::Incremental && lists_six {
        assert!(
            !referenced.is_empty(),
            "{context}: checkpoint 6 still refers to checkpoint 1's files"
        );
    }
}

/// Runs the sequence on a fresh environment from `setup` failing at
/// operation 0, 1, 2, ... until it completes without reaching the fault;
/// `after_crash` applies the crash model and checks the result. Returns the
/// number of crash points and the environment of the complete run.
fn for_every_crash_point<Env>(
    last: u64,
    mode: Mode,
    wrap: impl Fn(FaultyIo) -> FaultyIo,
    mut setup: impl FnMut() -> (Env, Arc<dyn Io>, PathBuf),
    mut after_crash: impl FnMut(&Env, u64, &Progress),
) -> (u64, Env) {
    for operation in 0..MAX_OPERATIONS {
        let (env, io, root) = setup();
        let plan = FaultPlan::FailAt {
            operation,
            after: AfterFault::Crash,
        };
        let faulty = Arc::new(wrap(FaultyIo::new(io, plan)));
        let mut progress = Progress::default();
        let result = run_sequence(faulty.clone(), &root, last, mode, &mut progress);
        if !faulty.fault_hit() {
            result.unwrap();
            return (operation, env);
        }
        // A fault in the retention after the last commit is logged, not
        // returned: the commit itself had succeeded.
        if let Err(error) = result {
            assert!(error.is_retryable(), "operation {operation}: {error}");
        }
        after_crash(&env, operation, &progress);
    }
    panic!("the sequence did not finish within {MAX_OPERATIONS} operations");
}

fn seed() -> u64 {
    let seed = std::env::var("SNAPFLOW_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|elapsed| elapsed.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("storage_crash: seed {seed} (replay with SNAPFLOW_SEED={seed})");
    seed
}

fn fresh_memfs() -> (Arc<MemFs>, Arc<dyn Io>, PathBuf) {
    let fs = Arc::new(MemFs::new());
    (fs.clone(), fs, PathBuf::from("/"))
}

/// Runs every crash point on a fresh `MemFs`, crashing with `mode_for(k)`,
/// whole and incrementally; returns the smaller number of crash points.
fn check_memfs(mode_for: impl Fn(u64) -> CrashMode) -> u64 {
    [Mode::Whole, Mode::Incremental]
        .into_iter()
        .map(|mode| check_memfs_in(mode, &mode_for))
        .min()
        .unwrap_or(0)
}

fn check_memfs_in(write_mode: Mode, mode_for: &impl Fn(u64) -> CrashMode) -> u64 {
    let (points, fs) = for_every_crash_point(
        LAST_CHECKPOINT,
        write_mode,
        |io| io,
        fresh_memfs,
        |fs, operation, progress| {
            let mode = mode_for(operation);
            fs.crash(mode);
            let context = format!("{write_mode:?}: crash at operation {operation} with {mode:?}");
            check_after_crash(fs.clone(), Path::new("/"), write_mode, progress, &context);
        },
    );
    // After a complete run, even losing everything unsynced keeps it all.
    fs.crash(CrashMode::LoseUnsynced);
    let progress = Progress {
        committed: Some(LAST_CHECKPOINT),
        committing: None,
    };
    check_after_crash(
        fs,
        Path::new("/"),
        write_mode,
        &progress,
        "power loss after the last commit",
    );
    points
}

#[test]
fn process_crash_at_every_operation_on_memfs() {
    let points = check_memfs(|_| CrashMode::KeepAll);
    assert!(
        points > 50,
        "only {points} crash points: the sequence is too short"
    );
}

#[test]
fn power_loss_at_every_operation_on_memfs() {
    check_memfs(|_| CrashMode::LoseUnsynced);
}

#[test]
fn random_power_loss_at_every_operation_on_memfs() {
    let base = seed();
    for round in 0..32u64 {
        check_memfs(|operation| CrashMode::Random {
            seed: base ^ (round << 40) ^ operation.wrapping_mul(0x9e37_79b9),
        });
    }
}

#[test]
fn process_crash_at_every_operation_on_disk() {
    let fresh = || {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        (dir, Arc::new(StdIo) as Arc<dyn Io>, root)
    };
    // A process crash loses nothing the kernel accepted, so fsyncs do not
    // change what this model sees; they are counted as crash points but
    // skipped, which keeps the test fast on a busy disk.
    let no_syncs = |io: FaultyIo| io.skipping_syncs();
    for mode in [Mode::Whole, Mode::Incremental] {
        let (points, _) = for_every_crash_point(
            LAST_CHECKPOINT,
            mode,
            no_syncs,
            fresh,
            |dir, operation, progress| {
                let context = format!("{mode:?}: crash at operation {operation} on disk");
                let io = no_syncs(FaultyIo::new(Arc::new(StdIo), FaultPlan::Never));
                check_after_crash(Arc::new(io), dir.path(), mode, progress, &context);
            },
        );
        assert!(points > 50, "only {points} crash points");
    }
}
