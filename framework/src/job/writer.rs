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

use std::collections::BTreeMap;
use std::sync::{mpsc, Arc};
use std::thread;

use actix::{Message, Recipient};

use crate::protocol::CheckpointId;
use crate::runtime::Generation;
use crate::storage::{
    self, CheckpointStore, CommitRequest, KeyGroupLayout, PartId, Segment, StoreError,
};

use super::recovery::{recover, Recovery, RecoveryOptions, SinkHooks};
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

/// The answer to [`WriterJob::Persist`]: the checkpoint's sizes.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Persisted {
    pub(crate) epoch: u64,
    pub(crate) checkpoint: CheckpointId,
    pub(crate) result: Result<PersistedSize, StoreError>,
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
pub(crate) fn spawn_writer(
    store: Arc<dyn CheckpointStore>,
    sinks: Vec<SinkHooks>,
    accept_duplicates: bool,
    persisted: Recipient<Persisted>,
    loaded: Recipient<Loaded>,
) -> Result<(mpsc::Sender<WriterJob>, thread::JoinHandle<()>), JobError> {
    let (sender, receiver) = mpsc::channel::<WriterJob>();
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
                        let result = persist(store.as_ref(), checkpoint.0, kind, parts, request);
                        persisted.do_send(Persisted {
                            epoch,
                            checkpoint,
                            result,
                        });
                    }
                    WriterJob::Load { region, generation } => {
                        let options = RecoveryOptions {
                            accept_duplicates,
                            first_start: region.is_none(),
                        };
                        let result = recover(store.as_ref(), &sinks, options);
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
    Ok((sender, thread))
}

/// Encodes and writes every part, then commits; on any error (a part that
/// does not encode included) the partial checkpoint is discarded, and it
/// could never be loaded anyway: a checkpoint exists only once its
/// metadata is committed. Each part is encoded just before it is written
/// and dropped after, so at most one encoded part is held at a time.
fn persist(
    store: &dyn CheckpointStore,
    checkpoint: u64,
    kind: storage::CheckpointKind,
    parts: Vec<(PartId, PendingPart)>,
    request: CommitRequest,
) -> Result<PersistedSize, StoreError> {
    store.begin(checkpoint, kind)?;
    let mut part_bytes = Vec::with_capacity(parts.len());
    let written = parts
        .into_iter()
        .try_for_each(|(part, pending)| {
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
                [Segment::Own(bytes)] => store.write_part(checkpoint, &part, bytes).map(|_| ()),
                segments => store
                    .write_part_segments(checkpoint, &part, segments)
                    .map(|_| ()),
            }
        })
        .and_then(|()| store.commit(checkpoint, request));
    match written {
        Ok(metadata) => Ok(PersistedSize {
            part_bytes,
            size_bytes: metadata.total_bytes(),
            written_bytes: metadata.written_bytes(),
        }),
        Err(error) => {
            // Best effort: a leftover is removed by the next `begin` anyway.
            if let Err(discard) = store.discard(checkpoint) {
                tracing::warn!(checkpoint, "discarding a failed checkpoint: {discard}");
            }
            Err(error)
        }
    }
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

    #[test]
    fn a_state_that_fails_to_encode_off_thread_fails_its_checkpoint_and_commits_nothing() {
        let store = MemoryCheckpointStore::new("writer-test").unwrap();
        let kind = storage::CheckpointKind::Checkpoint;
        let good = parts(deferred(Fixed(b"state".to_vec())));
        let good_request = request(&good);
        persist(&store, 1, kind, good, good_request).expect("checkpoint 1 persists");

        let bad = parts(deferred(Failing));
        let bad_request = request(&bad);
        let error = persist(&store, 2, kind, bad, bad_request).unwrap_err();
        match &error {
            StoreError::PartNotEncoded { part, reason, .. } => {
                assert_eq!(part, &PartId::new("count", 0));
                assert!(reason.contains("does not encode"), "{reason}");
            }
            other => panic!("expected PartNotEncoded, got {other:?}"),
        }
        // Nothing of checkpoint 2 exists: the latest is still 1, whole.
        let latest = store
            .load_latest()
            .unwrap()
            .checkpoint
            .expect("a checkpoint");
        assert_eq!(latest.metadata.checkpoint, 1);
        assert_eq!(store.list().unwrap().len(), 1);
        // The id is free again for the next attempt.
        let retry = parts(deferred(Fixed(b"state 3".to_vec())));
        let retry_request = request(&retry);
        persist(&store, 3, kind, retry, retry_request).expect("checkpoint 3 persists");
    }
}
