//! The checkpoint writer thread: the asynchronous part of every checkpoint
//! (writing its parts, fsync, committing its metadata through the
//! [`CheckpointStore`]) and the loading of the checkpoint to restore.
//!
//! It owns nothing but the store handle and the sinks' recovery hooks. It
//! never decides anything itself (the fallback rule is `recovery`'s): the
//! supervisor sends it jobs and gets one answer message per job. Jobs run
//! strictly in order, which the supervisor relies on: a load requested
//! after a persist sees that persist's outcome, so a failover region that
//! restarts after a checkpoint completed restores that checkpoint if it
//! became durable.
//!
//! # Subsumed checkpoints
//!
//! Once every input has ended, the supervisor asks for the final
//! checkpoint, which holds everything an earlier checkpoint holds. A
//! periodic checkpoint still being written then only delays the final
//! one behind it (the jobs run in order), so the supervisor marks every
//! checkpoint below the final one as subsumed ([`WriterHandle::subsume_below`])
//! and the writer stops writing such a checkpoint before its next part,
//! discards what it wrote and answers [`PersistOutcome::Subsumed`]. At 10 M
//! keys that was about 176 ms of a 7 s run (BENCHMARKS.md at 07a44e5). Only a
//! checkpoint of kind `Checkpoint` is subsumed: a savepoint is written
//! whole, always. A subsumed checkpoint was never complete, so no sink
//! committed anything for it; the final checkpoint's completion commits
//! its transactions (every pending one up to the final's id). If the
//! final checkpoint then fails too, a restart restores the checkpoint
//! before the subsumed one and replays more input: correct, only slower.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;

use actix::{Message, Recipient};

use crate::protocol::CheckpointId;
use crate::runtime::Generation;
use crate::storage::{
    self, CheckpointStore, CommitRequest, KeyGroupLayout, PartId, Segment, StoreError,
};

use super::recovery::{recover, Recovery, RecoveryOptions, SinkHooks};
use super::restore_check::JobShape;
use super::shell::PendingPart;
use super::JobError;
use crate::storage::segment::total_len;

/// Work for the writer thread.
pub(crate) enum WriterJob {
    /// Write and commit one completed checkpoint.
    Persist {
        /// The coordinator (counted from 1 per job) that completed it.
        epoch: u64,
        checkpoint: CheckpointId,
        kind: storage::CheckpointKind,
        /// Encoded here, each just before it is written, when its state
        /// was handed off at the snapshot (asynchronous snapshots).
        parts: Vec<(PartId, PendingPart)>,
        request: CommitRequest,
    },
    /// Load the newest complete checkpoint for the start of `region`
    /// (`None`: every region, the job's first start) in `generation`.
    Load {
        region: Option<usize>,
        generation: Generation,
    },
}

/// A restored checkpoint: its id, every part, and the layout of its key
/// groups.
pub(crate) type Restored = Option<(CheckpointId, BTreeMap<PartId, Vec<u8>>, KeyGroupLayout)>;

/// The answer to [`WriterJob::Persist`].
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Persisted {
    pub(crate) epoch: u64,
    pub(crate) checkpoint: CheckpointId,
    pub(crate) outcome: PersistOutcome,
}

/// How a [`WriterJob::Persist`] ended.
#[derive(Debug)]
pub(crate) enum PersistOutcome {
    /// Committed: the checkpoint's sizes.
    Persisted(PersistedSize),
    /// Stopped before it was committed because the final checkpoint
    /// subsumes it (module doc); nothing of it remains.
    Subsumed,
    /// Not committed: the store's error. Nothing of it remains either.
    Failed(StoreError),
}

/// The writer thread has stopped: a job sent to it is dropped.
#[derive(Debug)]
pub(crate) struct WriterGone;

/// The supervisor's side of the writer thread: its job queue and the
/// subsumption mark (module doc, "Subsumed checkpoints").
#[derive(Debug)]
pub(crate) struct WriterHandle {
    jobs: mpsc::Sender<WriterJob>,
    subsumed_below: Arc<AtomicU64>,
}

impl WriterHandle {
    /// Queues `job`; `Err` when the writer thread is gone (the job is
    /// dropped).
    pub(crate) fn send(&self, job: WriterJob) -> Result<(), WriterGone> {
        self.jobs.send(job).map_err(|_| WriterGone)
    }

    /// Marks every checkpoint (not savepoint) below `checkpoint` as
    /// subsumed: one still being written stops before its next part. The
    /// mark only rises.
    pub(crate) fn subsume_below(&self, checkpoint: CheckpointId) {
        self.subsumed_below
            .fetch_max(checkpoint.0, Ordering::Relaxed);
    }
}

/// How large a persisted checkpoint is.
#[derive(Debug, Clone)]
pub(crate) struct PersistedSize {
    /// Each part's assembled size, in the order the parts were given:
    /// known only here for a part encoded off the operator's thread.
    pub(crate) part_bytes: Vec<u64>,
    /// All its parts, assembled: the state it holds.
    pub(crate) size_bytes: u64,
    /// What it wrote itself (see [`CheckpointMetadata::written_bytes`]).
    ///
    /// [`CheckpointMetadata::written_bytes`]: storage::CheckpointMetadata::written_bytes
    pub(crate) written_bytes: u64,
}

/// The answer to [`WriterJob::Load`].
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Loaded {
    pub(crate) region: Option<usize>,
    pub(crate) generation: Generation,
    pub(crate) result: Result<Recovery, JobError>,
}

/// Starts the writer thread. Its queue is unbounded, but the supervisor
/// sends at most one persist per completed checkpoint (and pauses periodic
/// checkpoints while one is persisted) and one load per region start.
/// Every checkpoint it loads must fit `shape` (see `restore_check`).
pub(crate) fn spawn_writer(
    store: Arc<dyn CheckpointStore>,
    sinks: Vec<SinkHooks>,
    shape: JobShape,
    accept_duplicates: bool,
    persisted: Recipient<Persisted>,
    loaded: Recipient<Loaded>,
) -> Result<(WriterHandle, thread::JoinHandle<()>), JobError> {
    let (sender, receiver) = mpsc::channel::<WriterJob>();
    let subsumed_below = Arc::new(AtomicU64::new(0));
    let handle = WriterHandle {
        jobs: sender,
        subsumed_below: Arc::clone(&subsumed_below),
    };
    let thread = thread::Builder::new()
        .name("snapflow-writer".into())
        .spawn(move || {
            for job in receiver {
                match job {
                    WriterJob::Persist {
                        epoch,
                        checkpoint,
                        kind,
                        parts,
                        request,
                    } => {
                        let subsumed = || subsumed_below.load(Ordering::Relaxed) > checkpoint.0;
                        let target = PersistTarget {
                            checkpoint: checkpoint.0,
                            kind,
                            subsumed: &subsumed,
                        };
                        let outcome = persist(store.as_ref(), target, parts, request);
                        persisted.do_send(Persisted {
                            epoch,
                            checkpoint,
                            outcome,
                        });
                    }
                    WriterJob::Load { region, generation } => {
                        let options = RecoveryOptions {
                            accept_duplicates,
                            first_start: region.is_none(),
                        };
                        let result = recover(store.as_ref(), &sinks, &shape, options);
                        loaded.do_send(Loaded {
                            region,
                            generation,
                            result,
                        });
                    }
                }
            }
        })
        .map_err(|error| JobError::Runtime(crate::runtime::RuntimeError::ThreadStart(error)))?;
    Ok((handle, thread))
}

/// The checkpoint a [`persist`] writes, and whether the final checkpoint
/// subsumes it by now (asked before each part and before the commit).
struct PersistTarget<'a> {
    checkpoint: u64,
    kind: storage::CheckpointKind,
    subsumed: &'a dyn Fn() -> bool,
}

impl PersistTarget<'_> {
    /// Whether to stop writing: only a checkpoint is ever subsumed.
    fn stop(&self) -> bool {
        self.kind == storage::CheckpointKind::Checkpoint && (self.subsumed)()
    }
}

/// Why [`persist`] stopped before its commit.
enum Stopped {
    Subsumed,
    Failed(StoreError),
}

impl From<StoreError> for Stopped {
    fn from(error: StoreError) -> Self {
        Stopped::Failed(error)
    }
}

/// Encodes and writes every part, then commits; on any error (a part that
/// does not encode included), or when the target is subsumed before its
/// commit, the partial checkpoint is discarded, and it could never be
/// loaded anyway: a checkpoint exists only once its metadata is committed.
/// Each part is encoded just before it is written and dropped after, so at
/// most one encoded part is held at a time.
fn persist(
    store: &dyn CheckpointStore,
    target: PersistTarget<'_>,
    parts: Vec<(PartId, PendingPart)>,
    request: CommitRequest,
) -> PersistOutcome {
    let checkpoint = target.checkpoint;
    if target.stop() {
        // Nothing of it exists yet.
        return PersistOutcome::Subsumed;
    }
    match write_and_commit(store, &target, parts, request) {
        Ok(size) => PersistOutcome::Persisted(size),
        Err(stopped) => {
            // Best effort: a leftover is removed by the next `begin` anyway.
            if let Err(discard) = store.discard(checkpoint) {
                tracing::warn!(checkpoint, "discarding a stopped checkpoint: {discard}");
            }
            match stopped {
                Stopped::Subsumed => PersistOutcome::Subsumed,
                Stopped::Failed(error) => PersistOutcome::Failed(error),
            }
        }
    }
}

/// [`persist`]'s work, stopping at the first error or subsumption.
fn write_and_commit(
    store: &dyn CheckpointStore,
    target: &PersistTarget<'_>,
    parts: Vec<(PartId, PendingPart)>,
    request: CommitRequest,
) -> Result<PersistedSize, Stopped> {
    let checkpoint = target.checkpoint;
    store.begin(checkpoint, target.kind)?;
    let mut part_bytes = Vec::with_capacity(parts.len());
    for (part, pending) in parts {
        if target.stop() {
            return Err(Stopped::Subsumed);
        }
        let segments = pending
            .encode()
            .map_err(|error| StoreError::PartNotEncoded {
                checkpoint,
                part: part.clone(),
                reason: error.to_string(),
            })?;
        part_bytes.push(total_len(&segments));
        match segments.as_slice() {
            // A whole part goes the plain way, which every store has.
            [Segment::Own(bytes)] => store.write_part(checkpoint, &part, bytes)?,
            segments => store.write_part_segments(checkpoint, &part, segments)?,
        };
    }
    if target.stop() {
        return Err(Stopped::Subsumed);
    }
    let metadata = store.commit(checkpoint, request)?;
    Ok(PersistedSize {
        part_bytes,
        size_bytes: metadata.total_bytes(),
        written_bytes: metadata.written_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::shell::{DeferredState, PendingPart};
    use crate::runtime::BoxError;
    use crate::storage::MemoryCheckpointStore;

    /// A handed-off state whose encoding fails, as a key or state that
    /// does not encode would.
    struct Failing;

    impl DeferredState for Failing {
        fn encode(self: Box<Self>) -> Result<Vec<Segment>, BoxError> {
            Err("the state does not encode".into())
        }
    }

    /// A handed-off state that encodes to fixed bytes.
    struct Fixed(Vec<u8>);

    impl DeferredState for Fixed {
        fn encode(self: Box<Self>) -> Result<Vec<Segment>, BoxError> {
            Ok(vec![Segment::Own(self.0)])
        }
    }

    fn deferred(state: impl DeferredState) -> PendingPart {
        PendingPart::Deferred {
            state: Box::new(state),
            channels: Vec::new(),
            time: None,
        }
    }

    fn parts(second: PendingPart) -> Vec<(PartId, PendingPart)> {
        vec![
            (
                PartId::new("source", 0),
                PendingPart::Ready(vec![Segment::Own(b"position".to_vec())]),
            ),
            (PartId::new("count", 0), second),
        ]
    }

    fn request(parts: &[(PartId, PendingPart)]) -> CommitRequest {
        CommitRequest {
            expected_parts: Some(parts.iter().map(|(part, _)| part.clone()).collect()),
            ..CommitRequest::default()
        }
    }

    /// Persists `parts` as `checkpoint` of `kind`, subsumed when
    /// `subsumed` says so.
    fn persist_as(
        store: &MemoryCheckpointStore,
        checkpoint: u64,
        kind: storage::CheckpointKind,
        parts: Vec<(PartId, PendingPart)>,
        subsumed: &dyn Fn() -> bool,
    ) -> PersistOutcome {
        let request = request(&parts);
        let target = PersistTarget {
            checkpoint,
            kind,
            subsumed,
        };
        persist(store, target, parts, request)
    }

    fn assert_persisted(outcome: &PersistOutcome) {
        assert!(
            matches!(outcome, PersistOutcome::Persisted(_)),
            "{outcome:?}"
        );
    }

    fn never() -> bool {
        false
    }

    fn newest(store: &MemoryCheckpointStore) -> u64 {
        let latest = store
            .load_latest()
            .unwrap()
            .checkpoint
            .expect("a checkpoint");
        latest.metadata.checkpoint
    }

    #[test]
    fn a_state_that_fails_to_encode_off_thread_fails_its_checkpoint_and_commits_nothing() {
        let store = MemoryCheckpointStore::new("writer-test").unwrap();
        let kind = storage::CheckpointKind::Checkpoint;
        let good = parts(deferred(Fixed(b"state".to_vec())));
        let outcome = persist_as(&store, 1, kind, good, &never);
        assert_persisted(&outcome);

        let bad = parts(deferred(Failing));
        match persist_as(&store, 2, kind, bad, &never) {
            PersistOutcome::Failed(StoreError::PartNotEncoded { part, reason, .. }) => {
                assert_eq!(part, PartId::new("count", 0));
                assert!(reason.contains("does not encode"), "{reason}");
            }
            other => panic!("expected PartNotEncoded, got {other:?}"),
        }
        // Nothing of checkpoint 2 exists: the latest is still 1, whole.
        assert_eq!(newest(&store), 1);
        assert_eq!(store.list().unwrap().len(), 1);
        // The id is free again for the next attempt.
        let retry = parts(deferred(Fixed(b"state 3".to_vec())));
        let outcome = persist_as(&store, 3, kind, retry, &never);
        assert_persisted(&outcome);
    }

    /// A handed-off state that marks the writer's target subsumed while it
    /// is encoded, as the supervisor does when every input ends while the
    /// checkpoint is being written.
    struct Subsuming(Arc<AtomicU64>);

    impl DeferredState for Subsuming {
        fn encode(self: Box<Self>) -> Result<Vec<Segment>, BoxError> {
            self.0.store(u64::MAX, Ordering::Relaxed);
            Ok(vec![Segment::Own(b"state".to_vec())])
        }
    }

    /// Three parts: the source's, one that marks the target subsumed as it
    /// is encoded, and one that must then never be encoded.
    fn subsumed_midway(mark: &Arc<AtomicU64>) -> Vec<(PartId, PendingPart)> {
        let mut parts = parts(deferred(Subsuming(Arc::clone(mark))));
        parts.push((PartId::new("count", 1), deferred(Failing)));
        parts
    }

    #[test]
    fn a_checkpoint_subsumed_while_it_is_written_stops_before_its_next_part_and_commits_nothing() {
        let store = MemoryCheckpointStore::new("writer-test").unwrap();
        let kind = storage::CheckpointKind::Checkpoint;
        let first = parts(deferred(Fixed(b"state".to_vec())));
        let outcome = persist_as(&store, 1, kind, first, &never);
        assert_persisted(&outcome);

        let mark = Arc::new(AtomicU64::new(0));
        let subsumed = || mark.load(Ordering::Relaxed) > 2;
        let outcome = persist_as(&store, 2, kind, subsumed_midway(&mark), &subsumed);
        // `Failing`, the third part, was never encoded: it would have
        // failed the checkpoint instead.
        assert!(matches!(outcome, PersistOutcome::Subsumed), "{outcome:?}");
        assert_eq!(newest(&store), 1);
        assert_eq!(store.list().unwrap().len(), 1);

        // Marked before it starts: nothing is written at all.
        let later = parts(deferred(Failing));
        let outcome = persist_as(&store, 3, kind, later, &subsumed);
        assert!(matches!(outcome, PersistOutcome::Subsumed), "{outcome:?}");
        assert_eq!(store.list().unwrap().len(), 1);
    }

    #[test]
    fn a_savepoint_is_never_subsumed() {
        let store = MemoryCheckpointStore::new("writer-test").unwrap();
        let kind = storage::CheckpointKind::Savepoint;
        let always = || true;
        let savepoint = parts(deferred(Fixed(b"state".to_vec())));
        let outcome = persist_as(&store, 1, kind, savepoint, &always);
        assert_persisted(&outcome);
        assert_eq!(newest(&store), 1);
    }
}
