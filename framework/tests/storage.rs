//! Behaviour of the checkpoint stores through their public API: round trip,
//! listing, retention and pins, savepoints that move, corruption fallback,
//! name validation, concurrent part writes, discard and retryable errors.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use proptest::prelude::*;
use snapflow::storage::fault::{AfterFault, FaultPlan, FaultyIo};
use snapflow::storage::io::Io;
use snapflow::storage::memory::MemFs;
use snapflow::storage::names::{self, MAX_NAME_BYTES};
use snapflow::storage::{
    load_checkpoint_dir, CheckpointKind, CheckpointStore, CommitRequest, FsCheckpointStore,
    KeyGroupLayout, MemoryCheckpointStore, PartId, StoreError, StoreOptions,
};

const JOB: &str = "wordcount";

fn part_bytes(checkpoint: u64, part: &PartId) -> Vec<u8> {
    format!("checkpoint {checkpoint} of {part}")
        .repeat(1 + part.subtask as usize)
        .into_bytes()
}

fn parts(operators: &[&str], parallelism: u32) -> Vec<PartId> {
    operators
        .iter()
        .flat_map(|operator| (0..parallelism).map(move |subtask| PartId::new(*operator, subtask)))
        .collect()
}

fn request(checkpoint: u64) -> CommitRequest {
    CommitRequest {
        created_unix_ms: 1_000 + checkpoint,
        source_positions: BTreeMap::from([(
            PartId::new("source", 0),
            (checkpoint * 100).to_le_bytes().to_vec(),
        )]),
        key_groups: KeyGroupLayout {
            max_parallelism: 128,
            operator_parallelism: BTreeMap::from([("counter".to_string(), 2)]),
        },
        user: BTreeMap::from([("commit".to_string(), format!("c{checkpoint}"))]),
        expected_parts: None,
    }
}

/// Begins, writes the standard parts of, and commits `checkpoint`.
fn commit(store: &dyn CheckpointStore, checkpoint: u64, kind: CheckpointKind) {
    store.begin(checkpoint, kind).unwrap();
    for part in parts(&["source", "counter"], 2) {
        store
            .write_part(checkpoint, &part, &part_bytes(checkpoint, &part))
            .unwrap();
    }
    store.commit(checkpoint, request(checkpoint)).unwrap();
}

fn listed(store: &dyn CheckpointStore) -> Vec<u64> {
    store
        .list()
        .unwrap()
        .iter()
        .map(|entry| entry.checkpoint)
        .collect()
}

/// Loads the latest checkpoint and checks every part's bytes and the
/// metadata against what [`commit`] wrote.
fn check_latest(store: &dyn CheckpointStore, expected: u64) {
    let report = store.load_latest().unwrap();
    let loaded = report.checkpoint.expect("a checkpoint");
    assert_eq!(loaded.metadata.checkpoint, expected);
    assert_eq!(loaded.metadata.job, JOB);
    assert_eq!(
        loaded.metadata.source_positions,
        request(expected).source_positions
    );
    assert_eq!(loaded.metadata.key_groups, request(expected).key_groups);
    assert_eq!(loaded.metadata.user, request(expected).user);
    assert_eq!(loaded.metadata.created_unix_ms, 1_000 + expected);
    assert_eq!(loaded.parts.len(), 4);
    for (part, bytes) in &loaded.parts {
        assert_eq!(bytes, &part_bytes(expected, part), "{part}");
    }
}

fn fs_store(dir: &Path, retained_checkpoints: usize) -> FsCheckpointStore {
    let options = StoreOptions {
        retained_checkpoints,
    };
    FsCheckpointStore::open_with(dir, JOB, options).unwrap()
}

fn part_path(store: &FsCheckpointStore, checkpoint: u64, operator: &str, subtask: u32) -> PathBuf {
    store
        .entry_dir(checkpoint, CheckpointKind::Checkpoint)
        .join(format!("op-{}", names::encode_component(operator)))
        .join(format!("{subtask}.part"))
}

// ----- round trip and listing -----

#[test]
fn fs_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(dir.path(), 3);
    commit(&store, 1, CheckpointKind::Checkpoint);
    check_latest(&store, 1);
    // A fresh store on the same directory sees the same checkpoint, once
    // the first lets go of it (one owner at a time).
    drop(store);
    check_latest(&fs_store(dir.path(), 3), 1);
}

#[test]
fn memory_round_trip() {
    let store = MemoryCheckpointStore::new(JOB).unwrap();
    commit(&store, 1, CheckpointKind::Checkpoint);
    check_latest(&store, 1);
}

#[test]
fn empty_store_loads_nothing() {
    let store = MemoryCheckpointStore::new(JOB).unwrap();
    let report = store.load_latest().unwrap();
    assert!(report.checkpoint.is_none() && report.skipped.is_empty());
    assert!(matches!(store.load(1), Err(StoreError::NotFound(1))));
}

#[test]
fn listing_shows_complete_checkpoints_and_savepoints_oldest_first() {
    let store = MemoryCheckpointStore::new(JOB).unwrap();
    commit(&store, 1, CheckpointKind::Checkpoint);
    commit(&store, 2, CheckpointKind::Savepoint);
    commit(&store, 3, CheckpointKind::Checkpoint);
    store.begin(4, CheckpointKind::Checkpoint).unwrap();
    store
        .write_part(4, &PartId::new("counter", 0), b"x")
        .unwrap();
    let list = store.list().unwrap();
    let kinds: Vec<_> = list
        .iter()
        .map(|entry| (entry.checkpoint, entry.kind))
        .collect();
    assert_eq!(
        kinds,
        [
            (1, CheckpointKind::Checkpoint),
            (2, CheckpointKind::Savepoint),
            (3, CheckpointKind::Checkpoint)
        ]
    );
    let expected_bytes: u64 = parts(&["source", "counter"], 2)
        .iter()
        .map(|part| part_bytes(3, part).len() as u64)
        .sum();
    assert_eq!(
        (list[2].part_count, list[2].total_bytes),
        (4, expected_bytes)
    );
    check_latest(&store, 3);
}

// ----- retention and pins -----

#[test]
fn retention_keeps_the_last_three() {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(dir.path(), 3);
    for checkpoint in 1..=6 {
        commit(&store, checkpoint, CheckpointKind::Checkpoint);
    }
    assert_eq!(listed(&store), [4, 5, 6]);
    for deleted in 1..=3 {
        let path = store.entry_dir(deleted, CheckpointKind::Checkpoint);
        assert!(!path.exists(), "{path:?} must be deleted");
    }
}

#[test]
fn default_retention_is_three() {
    let store = MemoryCheckpointStore::new(JOB).unwrap();
    for checkpoint in 1..=5 {
        commit(&store, checkpoint, CheckpointKind::Checkpoint);
    }
    assert_eq!(listed(&store), [3, 4, 5]);
}

#[test]
fn pinned_checkpoint_survives_retention_until_released() {
    let store = MemoryCheckpointStore::new(JOB).unwrap();
    commit(&store, 1, CheckpointKind::Checkpoint);
    commit(&store, 2, CheckpointKind::Checkpoint);
    let pin = store.pin(2).unwrap();
    for checkpoint in 3..=6 {
        commit(&store, checkpoint, CheckpointKind::Checkpoint);
    }
    assert_eq!(listed(&store), [2, 4, 5, 6]);
    assert_eq!(pin.checkpoint(), 2);
    drop(pin);
    commit(&store, 7, CheckpointKind::Checkpoint);
    assert_eq!(listed(&store), [5, 6, 7]);
}

#[test]
fn the_checkpoint_being_restored_is_pinned_by_its_load() {
    let store = MemoryCheckpointStore::new(JOB).unwrap();
    commit(&store, 1, CheckpointKind::Checkpoint);
    let loaded = store.load_latest().unwrap().checkpoint.unwrap();
    let second_pin = loaded.pin.clone();
    for checkpoint in 2..=5 {
        commit(&store, checkpoint, CheckpointKind::Checkpoint);
    }
    assert_eq!(listed(&store), [1, 3, 4, 5]);
    drop(loaded);
    commit(&store, 6, CheckpointKind::Checkpoint);
    assert_eq!(listed(&store), [1, 4, 5, 6], "the clone still pins 1");
    drop(second_pin);
    commit(&store, 7, CheckpointKind::Checkpoint);
    assert_eq!(listed(&store), [5, 6, 7]);
}

#[test]
fn pinning_a_missing_checkpoint_fails() {
    let store = MemoryCheckpointStore::new(JOB).unwrap();
    assert!(matches!(store.pin(9), Err(StoreError::NotFound(9))));
}

#[test]
fn zero_retention_is_rejected() {
    let options = StoreOptions {
        retained_checkpoints: 0,
    };
    let error = MemoryCheckpointStore::on_fs(Default::default(), JOB, options).unwrap_err();
    assert!(matches!(error, StoreError::InvalidOptions(_)), "{error}");
}

// ----- savepoints -----

#[test]
fn savepoints_are_never_deleted_by_retention() {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(dir.path(), 1);
    commit(&store, 1, CheckpointKind::Savepoint);
    for checkpoint in 2..=5 {
        commit(&store, checkpoint, CheckpointKind::Checkpoint);
    }
    assert_eq!(listed(&store), [1, 5]);
    assert_eq!(
        store.load(1).unwrap().metadata.kind,
        CheckpointKind::Savepoint
    );
}

#[test]
fn moved_savepoint_restores() {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(dir.path(), 3);
    commit(&store, 7, CheckpointKind::Savepoint);
    let elsewhere = tempfile::tempdir().unwrap();
    let moved = elsewhere.path().join("my-savepoint");
    std::fs::rename(store.entry_dir(7, CheckpointKind::Savepoint), &moved).unwrap();
    drop(store);
    std::fs::remove_dir_all(dir.path()).unwrap();

    let loaded = load_checkpoint_dir(&moved).unwrap();
    assert_eq!(loaded.metadata.checkpoint, 7);
    assert_eq!(loaded.metadata.kind, CheckpointKind::Savepoint);
    assert_eq!(loaded.metadata.user, request(7).user);
    for part in parts(&["source", "counter"], 2) {
        assert_eq!(loaded.parts[&part], part_bytes(7, &part));
    }
}

// ----- corruption -----

/// Commits 1 and 2, damages checkpoint 2 with `damage`, and checks that
/// loading falls back to 1 and reports 2 with a reason containing `reason`.
fn check_fallback(damage: impl FnOnce(&FsCheckpointStore), reason: &str) {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(dir.path(), 3);
    commit(&store, 1, CheckpointKind::Checkpoint);
    commit(&store, 2, CheckpointKind::Checkpoint);
    damage(&store);
    // One store object owns a directory at a time.
    drop(store);
    let reopened = fs_store(dir.path(), 3);
    check_latest(&reopened, 1);
    let report = reopened.load_latest().unwrap();
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].checkpoint, 2);
    let error = report.skipped[0].reason.to_string();
    assert!(error.contains(reason), "{error:?} should say {reason:?}");
    assert!(!report.skipped[0].reason.is_retryable());
    assert!(reopened.load(2).unwrap_err().is_corruption());
}

fn flip_byte(path: &Path, index: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[index] ^= 0x20;
    std::fs::write(path, bytes).unwrap();
}

fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

#[test]
fn flipped_byte_in_a_part_falls_back() {
    check_fallback(
        |store| flip_byte(&part_path(store, 2, "counter", 1), 5),
        "CRC-32",
    );
}

#[test]
fn truncated_part_falls_back() {
    check_fallback(
        |store| truncate(&part_path(store, 2, "source", 0), 3),
        "size is 3 bytes",
    );
}

#[test]
fn grown_part_falls_back() {
    check_fallback(
        |store| {
            let path = part_path(store, 2, "source", 0);
            let mut bytes = std::fs::read(&path).unwrap();
            bytes.push(b'!');
            std::fs::write(path, bytes).unwrap();
        },
        "size is",
    );
}

#[test]
fn missing_part_falls_back() {
    check_fallback(
        |store| std::fs::remove_file(part_path(store, 2, "counter", 0)).unwrap(),
        "missing",
    );
}

#[test]
fn truncated_metadata_is_ignored() {
    check_fallback(
        |store| {
            let path = store
                .entry_dir(2, CheckpointKind::Checkpoint)
                .join("_metadata");
            let len = std::fs::metadata(&path).unwrap().len();
            truncate(&path, len - 1);
        },
        "the file has",
    );
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(dir.path(), 3);
    commit(&store, 1, CheckpointKind::Checkpoint);
    commit(&store, 2, CheckpointKind::Checkpoint);
    truncate(
        &store
            .entry_dir(2, CheckpointKind::Checkpoint)
            .join("_metadata"),
        10,
    );
    assert_eq!(
        listed(&store),
        [1],
        "a checkpoint without valid metadata is not listed"
    );
}

#[test]
fn flipped_metadata_byte_is_ignored() {
    check_fallback(
        |store| {
            flip_byte(
                &store
                    .entry_dir(2, CheckpointKind::Checkpoint)
                    .join("_metadata"),
                40,
            )
        },
        "checksum",
    );
}

#[test]
fn metadata_of_another_checkpoint_is_rejected() {
    check_fallback(
        |store| {
            let source = store
                .entry_dir(1, CheckpointKind::Checkpoint)
                .join("_metadata");
            let target = store
                .entry_dir(2, CheckpointKind::Checkpoint)
                .join("_metadata");
            std::fs::copy(source, target).unwrap();
        },
        "describes checkpoint 1",
    );
}

#[test]
fn all_corrupt_loads_nothing_and_reports_all() {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(dir.path(), 3);
    commit(&store, 1, CheckpointKind::Checkpoint);
    commit(&store, 2, CheckpointKind::Checkpoint);
    flip_byte(&part_path(&store, 1, "counter", 0), 0);
    flip_byte(&part_path(&store, 2, "counter", 0), 0);
    let report = store.load_latest().unwrap();
    assert!(report.checkpoint.is_none());
    let skipped: Vec<u64> = report.skipped.iter().map(|skip| skip.checkpoint).collect();
    assert_eq!(skipped, [2, 1]);
}

// ----- names -----

/// Opens a store for `job` and writes a part of operator `operator`;
/// returns the first error.
fn use_names(job: &str, operator: &str) -> Result<(), StoreError> {
    let store = MemoryCheckpointStore::new(job)?;
    store.begin(1, CheckpointKind::Checkpoint)?;
    store.write_part(1, &PartId::new(operator, 0), b"x")?;
    store.commit(1, CommitRequest::default())?;
    let loaded = store.load_latest()?.checkpoint.expect("committed");
    assert_eq!(loaded.parts[&PartId::new(operator, 0)], b"x");
    Ok(())
}

fn check_name(name: &str, accepted: bool) {
    for result in [use_names(name, "op"), use_names("job", name)] {
        match result {
            Ok(()) => assert!(accepted, "{name:?} must be rejected"),
            Err(StoreError::InvalidName { .. }) => assert!(!accepted, "{name:?} must be accepted"),
            Err(other) => panic!("{name:?}: unexpected error {other}"),
        }
    }
}

#[test]
fn empty_name_is_rejected() {
    check_name("", false);
}

#[test]
fn nul_and_control_characters_are_rejected() {
    check_name("a\0b", false);
    check_name("line\nbreak", false);
}

#[test]
fn very_long_names_are_rejected() {
    check_name(&"a".repeat(MAX_NAME_BYTES + 1), false);
    check_name(&"a".repeat(MAX_NAME_BYTES), true);
}

#[test]
fn path_characters_are_escaped_not_rejected() {
    for name in [
        "..",
        ".",
        "/",
        "a/b",
        "\\",
        "..\\..\\x",
        "/etc/passwd",
        "C:",
    ] {
        check_name(name, true);
    }
}

#[test]
fn non_ascii_and_mixed_case_names_are_escaped() {
    for name in ["快照", "Zähler", "Map", "map", "%4dap", "con", "nul"] {
        check_name(name, true);
    }
}

#[test]
fn hostile_names_stay_inside_the_job_directory() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let store = FsCheckpointStore::open(&root, "../../escape").unwrap();
    assert_eq!(store.job_dir().parent(), Some(root.as_path()));
    store.begin(1, CheckpointKind::Checkpoint).unwrap();
    store
        .write_part(1, &PartId::new("../../../x", 0), b"x")
        .unwrap();
    store.commit(1, CommitRequest::default()).unwrap();
    let outside: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(outside.len(), 1, "only root/ may exist next to it");
}

#[test]
fn names_differing_only_in_case_get_separate_parts() {
    let store = MemoryCheckpointStore::new(JOB).unwrap();
    store.begin(1, CheckpointKind::Checkpoint).unwrap();
    for (name, bytes) in [("Map", b"upper"), ("map", b"lower"), ("%4dap", b"escap")] {
        store.write_part(1, &PartId::new(name, 0), bytes).unwrap();
    }
    store.commit(1, CommitRequest::default()).unwrap();
    let loaded = store.load(1).unwrap();
    assert_eq!(loaded.parts[&PartId::new("Map", 0)], b"upper");
    assert_eq!(loaded.parts[&PartId::new("map", 0)], b"lower");
    assert_eq!(loaded.parts[&PartId::new("%4dap", 0)], b"escap");
}

proptest! {
    #[test]
    fn escaping_is_injective(first in "\\PC{1,20}", second in "\\PC{1,20}") {
        let (first_encoded, second_encoded) =
            (names::encode_component(&first), names::encode_component(&second));
        prop_assert_eq!(names::decode_component(&first_encoded), Some(first.clone()));
        prop_assert_eq!(first == second, first_encoded == second_encoded);
        // Case-insensitive file systems: the encodings differ even then.
        prop_assert_eq!(first == second, first_encoded.to_lowercase() == second_encoded.to_lowercase());
        prop_assert!(first_encoded
            .bytes()
            .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || b"_-%".contains(&byte)));
    }
}

// ----- concurrency, discard, misuse -----

#[test]
fn parts_written_concurrently_from_eight_threads() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(fs_store(dir.path(), 3));
    store.begin(1, CheckpointKind::Checkpoint).unwrap();
    let threads: Vec<_> = (0..8u32)
        .map(|thread| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for subtask in 0..8 {
                    let part = PartId::new(format!("op{thread}"), subtask);
                    let bytes = part_bytes(1, &part);
                    store.write_part(1, &part, &bytes).unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let expected: BTreeSet<PartId> = (0..8)
        .flat_map(|thread| (0..8).map(move |subtask| PartId::new(format!("op{thread}"), subtask)))
        .collect();
    let request = CommitRequest {
        expected_parts: Some(expected.clone()),
        ..CommitRequest::default()
    };
    store.commit(1, request).unwrap();
    let loaded = store.load(1).unwrap();
    assert_eq!(
        loaded.parts.keys().cloned().collect::<BTreeSet<_>>(),
        expected
    );
    for (part, bytes) in loaded.parts {
        assert_eq!(bytes, part_bytes(1, &part));
    }
}

#[test]
fn discard_removes_an_uncommitted_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(dir.path(), 3);
    commit(&store, 1, CheckpointKind::Checkpoint);
    store.begin(2, CheckpointKind::Checkpoint).unwrap();
    store
        .write_part(2, &PartId::new("counter", 0), b"x")
        .unwrap();
    store.discard(2).unwrap();
    assert!(!store.entry_dir(2, CheckpointKind::Checkpoint).exists());
    assert_eq!(listed(&store), [1]);
    let error = store
        .write_part(2, &PartId::new("counter", 1), b"x")
        .unwrap_err();
    assert!(matches!(error, StoreError::NotInProgress(2)), "{error}");
    assert!(matches!(
        store.commit(2, CommitRequest::default()),
        Err(StoreError::NotInProgress(2))
    ));
    // The id can be used again.
    commit(&store, 2, CheckpointKind::Checkpoint);
    check_latest(&store, 2);
}

#[test]
fn discard_of_a_leftover_from_an_earlier_process() {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(dir.path(), 3);
    store.begin(1, CheckpointKind::Checkpoint).unwrap();
    store
        .write_part(1, &PartId::new("counter", 0), b"x")
        .unwrap();
    drop(store);
    let reopened = fs_store(dir.path(), 3);
    reopened.discard(1).unwrap();
    assert!(!reopened.entry_dir(1, CheckpointKind::Checkpoint).exists());
    assert!(matches!(
        reopened.discard(1),
        Err(StoreError::NotInProgress(1))
    ));
}

#[test]
fn discard_of_a_committed_checkpoint_is_refused() {
    let store = MemoryCheckpointStore::new(JOB).unwrap();
    commit(&store, 1, CheckpointKind::Checkpoint);
    assert!(matches!(
        store.discard(1),
        Err(StoreError::AlreadyCommitted(1))
    ));
    check_latest(&store, 1);
}

#[test]
fn begin_twice_and_duplicate_parts_are_refused() {
    let store = MemoryCheckpointStore::new(JOB).unwrap();
    store.begin(1, CheckpointKind::Checkpoint).unwrap();
    assert!(matches!(
        store.begin(1, CheckpointKind::Savepoint),
        Err(StoreError::AlreadyExists(1))
    ));
    let part = PartId::new("counter", 0);
    store.write_part(1, &part, b"x").unwrap();
    let error = store.write_part(1, &part, b"y").unwrap_err();
    assert!(matches!(error, StoreError::DuplicatePart { .. }), "{error}");
    store.commit(1, CommitRequest::default()).unwrap();
    assert!(matches!(
        store.begin(1, CheckpointKind::Checkpoint),
        Err(StoreError::AlreadyExists(1))
    ));
}

#[test]
fn begin_replaces_a_leftover_of_a_crashed_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(dir.path(), 3);
    commit(&store, 1, CheckpointKind::Checkpoint);
    store.begin(2, CheckpointKind::Checkpoint).unwrap();
    store
        .write_part(2, &PartId::new("stale", 0), b"old")
        .unwrap();
    drop(store);
    let reopened = fs_store(dir.path(), 3);
    commit(&reopened, 2, CheckpointKind::Checkpoint);
    check_latest(&reopened, 2);
    let stale = reopened
        .entry_dir(2, CheckpointKind::Checkpoint)
        .join(format!("op-{}", names::encode_component("stale")));
    assert!(!stale.exists(), "the earlier attempt's parts are gone");
}

#[test]
fn commit_with_missing_parts_is_refused() {
    let store = MemoryCheckpointStore::new(JOB).unwrap();
    store.begin(1, CheckpointKind::Checkpoint).unwrap();
    store.write_part(1, &PartId::new("a", 0), b"x").unwrap();
    store.write_part(1, &PartId::new("b", 0), b"x").unwrap();
    let request = CommitRequest {
        expected_parts: Some(BTreeSet::from([PartId::new("a", 0), PartId::new("a", 1)])),
        ..CommitRequest::default()
    };
    match store.commit(1, request) {
        Err(StoreError::PartsMismatch {
            missing,
            unexpected,
            ..
        }) => {
            assert_eq!(missing, [PartId::new("a", 1)]);
            assert_eq!(unexpected, [PartId::new("b", 0)]);
        }
        other => panic!("expected PartsMismatch, got {other:?}"),
    }
    assert!(listed(&store).is_empty());
}

// ----- retryable errors -----

/// Begins checkpoint 1 on a fresh [`MemFs`] through `io`, writes one part
/// and commits; returns the store and the results of the part write and the
/// commit.
fn write_and_commit(
    plan: FaultPlan,
) -> (
    Arc<FaultyIo>,
    FsCheckpointStore,
    Result<(), StoreError>,
    Result<(), StoreError>,
) {
    let io: Arc<dyn Io> = Arc::new(MemFs::new());
    let faulty = Arc::new(FaultyIo::new(io, plan));
    let store =
        FsCheckpointStore::with_io(faulty.clone(), "/", JOB, StoreOptions::default()).unwrap();
    store.begin(1, CheckpointKind::Checkpoint).unwrap();
    let written = store
        .write_part(1, &PartId::new("a", 0), b"bytes")
        .map(drop);
    let committed = store.commit(1, CommitRequest::default()).map(drop);
    (faulty, store, written, committed)
}

/// The index of the first mutating operation named `name` whose path ends
/// with `suffix`, in a fault-free run of [`write_and_commit`].
fn operation_index(name: &str, suffix: &str) -> u64 {
    let (probe, ..) = write_and_commit(FaultPlan::Never);
    probe
        .log()
        .iter()
        .find(|operation| operation.name == name && operation.path.ends_with(suffix))
        .map(|operation| operation.index)
        .expect("the operation happens")
}

#[test]
fn a_transient_part_write_error_is_retryable_and_a_retry_succeeds() {
    let plan = FaultPlan::FailAt {
        operation: operation_index("write_file", "0.part.tmp"),
        after: AfterFault::Continue,
    };
    let (faulty, store, written, committed) = write_and_commit(plan);
    let error = written.unwrap_err();
    assert!(error.is_retryable(), "{error}");
    assert!(
        matches!(
            error,
            StoreError::Io {
                operation: "write_file",
                ..
            }
        ),
        "{error}"
    );
    assert!(faulty.fault_hit());
    // Nothing was written, so the commit succeeded with no parts.
    committed.unwrap();
    assert!(store.load(1).unwrap().parts.is_empty());
}

#[test]
fn a_failed_commit_can_be_retried() {
    let plan = FaultPlan::FailAt {
        operation: operation_index("rename", "_metadata.tmp"),
        after: AfterFault::Continue,
    };
    let (_, store, written, committed) = write_and_commit(plan);
    written.unwrap();
    let error = committed.unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::Io {
                operation: "rename",
                ..
            }
        ),
        "{error}"
    );
    assert!(error.is_retryable());
    assert!(listed(&store).is_empty());
    store.commit(1, CommitRequest::default()).unwrap();
    assert_eq!(store.load(1).unwrap().parts[&PartId::new("a", 0)], b"bytes");
}

#[test]
fn corruption_is_not_retryable() {
    let error = StoreError::CorruptPart {
        checkpoint: 1,
        part: PartId::new("a", 0),
        reason: "test".to_string(),
    };
    assert!(!error.is_retryable() && error.is_corruption());
}

/// An [`Io`] over a [`MemFs`] whose part writes wait until the test opens
/// the gate, so a write can be held in flight.
#[derive(Debug, Default)]
struct GateIo {
    fs: MemFs,
    /// (gate open, a part write is waiting)
    state: std::sync::Mutex<(bool, bool)>,
    changed: std::sync::Condvar,
}

impl GateIo {
    fn wait_for_a_waiting_write(&self) {
        let state = self.state.lock().unwrap();
        drop(
            self.changed
                .wait_while(state, |(_, waiting)| !*waiting)
                .unwrap(),
        );
    }

    fn open_gate(&self) {
        self.state.lock().unwrap().0 = true;
        self.changed.notify_all();
    }
}

impl Io for GateIo {
    fn create_dir_all(&self, path: &Path) -> std::io::Result<()> {
        self.fs.create_dir_all(path)
    }
    fn write_file(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        if path.to_string_lossy().ends_with(".part.tmp") {
            let mut state = self.state.lock().unwrap();
            state.1 = true;
            self.changed.notify_all();
            drop(self.changed.wait_while(state, |(open, _)| !*open).unwrap());
        }
        self.fs.write_file(path, bytes)
    }
    fn sync_file(&self, path: &Path) -> std::io::Result<()> {
        self.fs.sync_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.fs.rename(from, to)
    }
    fn sync_dir(&self, path: &Path) -> std::io::Result<()> {
        self.fs.sync_dir(path)
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        self.fs.remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> std::io::Result<()> {
        self.fs.remove_dir_all(path)
    }
    fn read_file(&self, path: &Path, limit_bytes: u64) -> std::io::Result<Vec<u8>> {
        self.fs.read_file(path, limit_bytes)
    }
    fn list_dir(&self, path: &Path) -> std::io::Result<Vec<snapflow::storage::io::DirEntry>> {
        self.fs.list_dir(path)
    }
    fn try_lock_owner(
        &self,
        path: &Path,
    ) -> std::io::Result<snapflow::storage::owner::LockAttempt> {
        self.fs.try_lock_owner(path)
    }
}

#[test]
fn commit_and_discard_wait_for_part_writes_in_flight() {
    let gate = Arc::new(GateIo::default());
    let store = Arc::new(
        FsCheckpointStore::with_io(gate.clone(), "/", JOB, StoreOptions::default()).unwrap(),
    );
    store.begin(1, CheckpointKind::Checkpoint).unwrap();
    let writer = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || store.write_part(1, &PartId::new("a", 0), b"held"))
    };
    gate.wait_for_a_waiting_write();
    for error in [
        store.commit(1, CommitRequest::default()).unwrap_err(),
        store.discard(1).unwrap_err(),
    ] {
        assert!(
            matches!(error, StoreError::PartsInFlight { count: 1, .. }),
            "{error}"
        );
        assert!(error.is_retryable());
    }
    gate.open_gate();
    writer.join().unwrap().unwrap();
    store.commit(1, CommitRequest::default()).unwrap();
    assert_eq!(store.load(1).unwrap().parts[&PartId::new("a", 0)], b"held");
}

#[test]
fn a_read_error_is_returned_not_skipped() {
    let fs = Arc::new(MemFs::new());
    let store = MemoryCheckpointStore::on_fs(fs.clone(), JOB, StoreOptions::default()).unwrap();
    commit(&store, 1, CheckpointKind::Checkpoint);
    commit(&store, 2, CheckpointKind::Checkpoint);
    let faulty = FaultyIo::new(fs.clone(), FaultPlan::Never)
        .failing_reads_of("chk-00000000000000000002/op-counter/1.part");
    let store =
        FsCheckpointStore::with_io(Arc::new(faulty), "/", JOB, StoreOptions::default()).unwrap();
    // A transient fault must not silently roll the job back to checkpoint 1.
    let error = store.load_latest().unwrap_err();
    assert!(error.is_retryable(), "{error}");
    assert!(
        matches!(
            error,
            StoreError::Io {
                operation: "read_file",
                ..
            }
        ),
        "{error}"
    );
    // Without the fault, checkpoint 2 is whole.
    let healthy = MemoryCheckpointStore::on_fs(fs, JOB, StoreOptions::default()).unwrap();
    check_latest(&healthy, 2);
}

// ------------------------------------- damaged checkpoints and the id floor

/// A file-system store (real disk) and a memory store, so the set-aside
/// rename is checked on both.
fn both_stores(dir: &Path) -> Vec<Box<dyn CheckpointStore>> {
    vec![
        Box::new(FsCheckpointStore::open(dir, JOB).unwrap()),
        Box::new(MemoryCheckpointStore::new(JOB).unwrap()),
    ]
}

#[test]
fn a_damaged_checkpoint_is_set_aside_and_its_id_is_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    for store in both_stores(dir.path()) {
        let store = store.as_ref();
        for checkpoint in 1..=3 {
            commit(store, checkpoint, CheckpointKind::Checkpoint);
        }
        // A checkpoint that never committed still takes its id.
        store.begin(5, CheckpointKind::Checkpoint).unwrap();
        store.discard(5).unwrap();
        store.begin(4, CheckpointKind::Checkpoint).unwrap();
        assert_eq!(store.highest_id().unwrap(), Some(4));
        store.discard(4).unwrap();
        let moved = store
            .set_aside(3, "part counter[1] is corrupt")
            .unwrap()
            .expect("checkpoint 3 has a directory");
        let name = moved.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with("chk-00000000000000000003.damaged-"),
            "{name}"
        );
        assert_eq!(listed(store), [1, 2]);
        assert_eq!(store.damaged_ids().unwrap(), [3]);
        assert_eq!(store.highest_id().unwrap(), Some(3));
        check_latest(store, 2);
        assert_eq!(store.set_aside(3, "again").unwrap(), None);
    }
}

#[test]
fn loading_below_an_id_skips_newer_checkpoints() {
    let store = MemoryCheckpointStore::new(JOB).unwrap();
    for checkpoint in 1..=3 {
        commit(&store, checkpoint, CheckpointKind::Checkpoint);
    }
    let below_3 = store.load_latest_before(3).unwrap();
    assert_eq!(below_3.checkpoint.unwrap().metadata.checkpoint, 2);
    assert!(below_3.skipped.is_empty());
    assert!(store.load_latest_before(1).unwrap().checkpoint.is_none());
}

#[test]
fn the_file_store_names_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let store = FsCheckpointStore::open(dir.path(), JOB).unwrap();
    assert_eq!(store.location(), Some(store.job_dir()));
    assert!(store.job_dir().starts_with(dir.path()));
}

// ----- one owner per directory -----

/// A second store object on an owned job directory (in another process
/// or, as here, in this one) is refused with `StoreInUse`, naming the
/// directory and the owner, and is not retryable; a read-only store reads
/// what the owner committed and refuses every write; once the owner is
/// dropped the directory can be owned again.
#[test]
fn a_job_directory_has_one_owner_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let owner = fs_store(dir.path(), 3);
    commit(&owner, 1, CheckpointKind::Checkpoint);
    match FsCheckpointStore::open(dir.path(), JOB) {
        Err(error @ StoreError::StoreInUse { .. }) => {
            assert!(!error.is_retryable());
            let message = error.to_string();
            assert!(
                message.contains(&format!("pid {} ", std::process::id())),
                "{message}"
            );
            let StoreError::StoreInUse { dir: job_dir, .. } = error else {
                unreachable!()
            };
            assert_eq!(job_dir, owner.job_dir());
        }
        other => panic!("a second owner was not refused: {other:?}"),
    }
    let reader = FsCheckpointStore::open_read_only(dir.path(), JOB).unwrap();
    check_latest(&reader, 1);
    for refused in [
        reader.begin(2, CheckpointKind::Checkpoint).err(),
        reader.discard(1).err(),
        reader.delete(1).err(),
        reader.prune(1).err(),
        reader.set_aside(1, "test").err(),
    ] {
        assert!(
            matches!(refused, Some(StoreError::ReadOnly { .. })),
            "{refused:?}"
        );
    }
    assert_eq!(listed(&owner), [1], "the refused calls changed nothing");
    drop(owner);
    let next = fs_store(dir.path(), 3);
    commit(&next, 2, CheckpointKind::Checkpoint);
    check_latest(&next, 2);
}
