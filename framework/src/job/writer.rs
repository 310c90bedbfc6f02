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
use super::JobError;

/// Work for the writer thread.
pub(crate) enum WriterJob {
    /// Write and commit one completed checkpoint.
    Persist {
        /// The coordinator (counted from 1 per job) that completed it.
        epoch: u64,
        checkpoint: CheckpointId,
        kind: storage::CheckpointKind,
        parts: Vec<(PartId, Vec<Segment>)>,
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
#[derive(Debug, Clone, Copy)]
pub(crate) struct PersistedSize {
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
                        let result = persist(store.as_ref(), checkpoint.0, kind, &parts, request);
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

/// Writes every part and commits; on any error the partial checkpoint is
/// discarded, and it could never be loaded anyway: a checkpoint exists only
/// once its metadata is committed.
fn persist(
    store: &dyn CheckpointStore,
    checkpoint: u64,
    kind: storage::CheckpointKind,
    parts: &[(PartId, Vec<Segment>)],
    request: CommitRequest,
) -> Result<PersistedSize, StoreError> {
    store.begin(checkpoint, kind)?;
    let written = parts
        .iter()
        .try_for_each(|(part, segments)| match segments.as_slice() {
            // A whole part goes the plain way, which every store has.
            [Segment::Own(bytes)] => store.write_part(checkpoint, part, bytes).map(|_| ()),
            segments => store
                .write_part_segments(checkpoint, part, segments)
                .map(|_| ()),
        })
        .and_then(|()| store.commit(checkpoint, request));
    match written {
        Ok(metadata) => Ok(PersistedSize {
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
