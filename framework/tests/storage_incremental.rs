//! Incremental checkpoints in the store, through its public API: parts
//! written as segments that refer to earlier checkpoints' shared files
//! load assembled, retention keeps exactly the shared files a remaining
//! checkpoint refers to, a damaged shared file invalidates every
//! checkpoint that refers to it (loading falls back and says why), a
//! reference to a missing file is refused, savepoints are self-contained,
//! and a store without segments refuses references.

use std::path::{Path, PathBuf};

use snapflow::storage::names;
use snapflow::storage::{
    load_checkpoint_dir, CheckpointKind, CheckpointStore, CommitRequest, FsCheckpointStore,
    MemoryCheckpointStore, PartId, Segment, SharedRange, StoreError, StoreOptions,
};

const JOB: &str = "incremental";

fn store(dir: &Path, retained_checkpoints: usize) -> FsCheckpointStore {
    FsCheckpointStore::open_with(
        dir,
        JOB,
        StoreOptions {
            retained_checkpoints,
        },
    )
    .unwrap()
}

fn part() -> PartId {
    PartId::new("Count", 0)
}

fn body(checkpoint: u64) -> Vec<u8> {
    format!("key group state written by {checkpoint};")
        .repeat(20)
        .into_bytes()
}

fn range_of(checkpoint: u64, offset: u64) -> SharedRange {
    let bytes = body(checkpoint);
    SharedRange {
        checkpoint,
        offset,
        len: bytes.len() as u64,
        crc32: crc32fast::hash(&bytes),
    }
}

/// Commits `checkpoint` with one part: a header of its own, a fresh body
/// (shared), and the bodies of `reused` earlier checkpoints. Returns the
/// bytes the part must load as.
fn commit(
    store: &dyn CheckpointStore,
    checkpoint: u64,
    kind: CheckpointKind,
    reused: &[u64],
) -> Vec<u8> {
    store.begin(checkpoint, kind).unwrap();
    let header = format!("header {checkpoint}").into_bytes();
    let mut segments = vec![
        Segment::Own(header.clone()),
        Segment::Shared(body(checkpoint)),
    ];
    let mut expected = header;
    expected.extend(body(checkpoint));
    for &earlier in reused {
        // Each earlier checkpoint wrote its body as its only shared
        // segment, at offset 0.
        segments.push(Segment::Reuse(range_of(earlier, 0)));
        expected.extend(body(earlier));
    }
    store
        .write_part_segments(checkpoint, &part(), &segments)
        .unwrap();
    store.commit(checkpoint, CommitRequest::default()).unwrap();
    expected
}

fn shared_path(store: &FsCheckpointStore, checkpoint: u64) -> PathBuf {
    store
        .job_dir()
        .join("shared")
        .join(names::operator_dir_name("Count").unwrap())
        .join(format!("0-{checkpoint:020}.shared"))
}

/// The checkpoints whose shared files exist, ascending.
fn shared_on_disk(store: &FsCheckpointStore) -> Vec<u64> {
    let dir = store
        .job_dir()
        .join("shared")
        .join(names::operator_dir_name("Count").unwrap());
    let mut ids: Vec<u64> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|entry| entry.unwrap().file_name().into_string().unwrap())
                .map(|name| name[2..22].parse().unwrap())
                .collect()
        })
        .unwrap_or_default();
    ids.sort_unstable();
    ids
}

#[test]
fn a_chain_loads_assembled_and_writes_only_what_is_new() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), 3);
    commit(&store, 1, CheckpointKind::Checkpoint, &[]);
    commit(&store, 2, CheckpointKind::Checkpoint, &[1]);
    let expected = commit(&store, 3, CheckpointKind::Checkpoint, &[1, 2]);
    let loaded = store.load_latest().unwrap().checkpoint.unwrap();
    assert_eq!(loaded.metadata.checkpoint, 3);
    assert_eq!(loaded.parts[&part()], expected);
    let header = format!("header {}", 3).len() as u64;
    assert_eq!(
        loaded.metadata.written_bytes(),
        header + body(3).len() as u64
    );
    assert_eq!(loaded.metadata.total_bytes(), expected.len() as u64);
}

#[test]
fn retention_keeps_referenced_shared_files_and_deletes_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), 2);
    commit(&store, 1, CheckpointKind::Checkpoint, &[]);
    commit(&store, 2, CheckpointKind::Checkpoint, &[1]);
    commit(&store, 3, CheckpointKind::Checkpoint, &[1]);
    // 1 is gone, but 2 and 3 still refer to its shared file.
    let listed: Vec<u64> = store.list().unwrap().iter().map(|e| e.checkpoint).collect();
    assert_eq!(listed, [2, 3]);
    assert_eq!(shared_on_disk(&store), [1, 2, 3]);
    // 4 refers to 3 only: 2 goes, and with it the files only 2 and 3 used
    // that 4 does not (2's), while 1's stays for 3.
    commit(&store, 4, CheckpointKind::Checkpoint, &[3]);
    assert_eq!(shared_on_disk(&store), [1, 3, 4]);
    // 5 is full: once 3 and 4 are gone nothing refers to 1, 3 or 4.
    commit(&store, 5, CheckpointKind::Checkpoint, &[]);
    assert_eq!(shared_on_disk(&store), [3, 4, 5]);
    commit(&store, 6, CheckpointKind::Checkpoint, &[]);
    assert_eq!(shared_on_disk(&store), [5, 6]);
    for entry in store.list().unwrap() {
        store.load(entry.checkpoint).unwrap();
    }
}

#[test]
fn a_damaged_shared_file_invalidates_every_checkpoint_that_refers_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), 5);
    commit(&store, 1, CheckpointKind::Checkpoint, &[]);
    commit(&store, 2, CheckpointKind::Checkpoint, &[]);
    commit(&store, 3, CheckpointKind::Checkpoint, &[2]);
    commit(&store, 4, CheckpointKind::Checkpoint, &[2, 3]);
    // Checkpoint 2's shared file is referenced by 2, 3 and 4.
    let path = shared_path(&store, 2);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[5] ^= 0x01;
    std::fs::write(&path, bytes).unwrap();
    let report = store.load_latest().unwrap();
    assert_eq!(report.checkpoint.unwrap().metadata.checkpoint, 1);
    let skipped: Vec<u64> = report.skipped.iter().map(|s| s.checkpoint).collect();
    assert_eq!(skipped, [4, 3, 2]);
    for skipped in &report.skipped {
        let reason = skipped.reason.to_string();
        assert!(skipped.reason.is_corruption(), "{reason}");
        assert!(
            reason.contains("written by checkpoint 2") && reason.contains("CRC-32"),
            "the reason names the shared file and what is wrong: {reason}"
        );
    }
}

#[test]
fn a_missing_shared_file_falls_back_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), 5);
    commit(&store, 1, CheckpointKind::Checkpoint, &[]);
    commit(&store, 2, CheckpointKind::Checkpoint, &[]);
    commit(&store, 3, CheckpointKind::Checkpoint, &[2]);
    std::fs::remove_file(shared_path(&store, 2)).unwrap();
    let report = store.load_latest().unwrap();
    assert_eq!(report.checkpoint.unwrap().metadata.checkpoint, 1);
    let reason = report.skipped[0].reason.to_string();
    assert!(reason.contains("missing"), "{reason}");
}

#[test]
fn a_reference_to_a_file_that_does_not_exist_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), 3);
    commit(&store, 1, CheckpointKind::Checkpoint, &[]);
    store.begin(2, CheckpointKind::Checkpoint).unwrap();
    // Checkpoint 7 never wrote anything; 2 cannot refer to itself either.
    for shared in [7, 2, 0] {
        let error = store
            .write_part_segments(2, &part(), &[Segment::Reuse(range_of(shared, 0))])
            .unwrap_err();
        assert!(
            matches!(error, StoreError::MissingShared { shared: s, .. } if s == shared),
            "{error}"
        );
        assert!(!error.is_retryable());
    }
    store.discard(2).unwrap();
}

#[test]
fn a_savepoint_is_self_contained_and_restores_after_moving() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), 1);
    commit(&store, 1, CheckpointKind::Checkpoint, &[]);
    let expected = commit(&store, 2, CheckpointKind::Savepoint, &[1]);
    // The savepoint wrote no shared file; later checkpoints drop 1's.
    assert_eq!(shared_on_disk(&store), [1]);
    commit(&store, 3, CheckpointKind::Checkpoint, &[]);
    assert_eq!(shared_on_disk(&store), [3]);
    let elsewhere = tempfile::tempdir().unwrap();
    let moved = elsewhere.path().join("moved");
    std::fs::rename(store.entry_dir(2, CheckpointKind::Savepoint), &moved).unwrap();
    drop(store);
    std::fs::remove_dir_all(dir.path()).unwrap();
    let loaded = load_checkpoint_dir(&moved).unwrap();
    assert!(loaded.metadata.segments.is_empty());
    assert_eq!(loaded.parts[&part()], expected);
}

#[test]
fn the_memory_store_writes_segments_too() {
    let store = MemoryCheckpointStore::new(JOB).unwrap();
    assert!(store.supports_segments());
    commit(&store, 1, CheckpointKind::Checkpoint, &[]);
    let expected = commit(&store, 2, CheckpointKind::Checkpoint, &[1]);
    let loaded = store.load_latest().unwrap().checkpoint.unwrap();
    assert_eq!(loaded.parts[&part()], expected);
}

#[test]
fn deleting_a_checkpoint_keeps_the_files_others_refer_to() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), 5);
    commit(&store, 1, CheckpointKind::Checkpoint, &[]);
    commit(&store, 2, CheckpointKind::Checkpoint, &[1]);
    commit(&store, 3, CheckpointKind::Checkpoint, &[]);
    store.delete(1).unwrap();
    assert_eq!(shared_on_disk(&store), [1, 2, 3]);
    store.prune(1).unwrap();
    assert_eq!(shared_on_disk(&store), [3]);
    store.load(3).unwrap();
}

/// A store that keeps the trait's defaults for segments.
#[derive(Debug)]
struct Plain(MemoryCheckpointStore);

impl CheckpointStore for Plain {
    fn job(&self) -> &str {
        self.0.job()
    }
    fn begin(&self, checkpoint: u64, kind: CheckpointKind) -> Result<(), StoreError> {
        self.0.begin(checkpoint, kind)
    }
    fn write_part(
        &self,
        checkpoint: u64,
        part: &PartId,
        bytes: &[u8],
    ) -> Result<snapflow::storage::PartInfo, StoreError> {
        self.0.write_part(checkpoint, part, bytes)
    }
    fn commit(
        &self,
        checkpoint: u64,
        request: CommitRequest,
    ) -> Result<snapflow::storage::CheckpointMetadata, StoreError> {
        self.0.commit(checkpoint, request)
    }
    fn discard(&self, checkpoint: u64) -> Result<(), StoreError> {
        self.0.discard(checkpoint)
    }
    fn list(&self) -> Result<Vec<snapflow::storage::CheckpointSummary>, StoreError> {
        self.0.list()
    }
    fn load(&self, checkpoint: u64) -> Result<snapflow::storage::LoadedCheckpoint, StoreError> {
        self.0.load(checkpoint)
    }
    fn load_latest(&self) -> Result<snapflow::storage::LoadReport, StoreError> {
        self.0.load_latest()
    }
    fn pin(&self, checkpoint: u64) -> Result<snapflow::storage::CheckpointPin, StoreError> {
        self.0.pin(checkpoint)
    }
}

#[test]
fn a_store_without_segments_writes_them_whole_and_refuses_references() {
    let store = Plain(MemoryCheckpointStore::new(JOB).unwrap());
    assert!(!store.supports_segments());
    let expected = commit(&store, 1, CheckpointKind::Checkpoint, &[]);
    let loaded = store.load(1).unwrap();
    assert_eq!(loaded.parts[&part()], expected);
    store.begin(2, CheckpointKind::Checkpoint).unwrap();
    let error = store
        .write_part_segments(2, &part(), &[Segment::Reuse(range_of(1, 0))])
        .unwrap_err();
    assert!(matches!(error, StoreError::SegmentsUnsupported), "{error}");
}
