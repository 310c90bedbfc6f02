//! What travels between shells and the supervisor: the bound on record
//! types, the in-band and injected control items, and the events a shell
//! reports. Types only; no shell logic lives here.

use actix::Message;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::job::snapshots::SnapshotReply;
use crate::protocol::{CheckpointId, CheckpointKind, DeclineReason, SnapshotId};

use super::pending::PendingPart;
use super::snapshot::PartActivity;
use crate::runtime::Generation;

/// Bound on the serde-friendly record types that flow between operators:
/// they are cloned for fan-out and recorded channel state, and serialized
/// into checkpoints (recorded channel state of unaligned checkpoints).
pub trait Data: Clone + Send + Unpin + Serialize + DeserializeOwned + 'static {}

impl<T: Clone + Send + Unpin + Serialize + DeserializeOwned + 'static> Data for T {}

/// One protocol message on a stage's input channel, as the node machine
/// sees it: a batch of records or a time mark. Time marks go through the
/// machine like batches, so a channel it records keeps them in their
/// place among the records and a restore replays them in that order
/// (DESIGN.md §7); barriers, ends and markers are the machine's own
/// inputs and never appear here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum InputItem<T> {
    /// A batch of records.
    Records(Vec<T>),
    /// [`Control::Watermark`].
    Watermark(u64),
    /// [`Control::Idle`].
    Idle,
}

/// The in-band and injected control items of the job layer: plain data,
/// so that they could cross a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Control {
    /// In-band: barrier of a checkpoint, with its kind (a savepoint is
    /// written whole), so that every node learns the kind from the
    /// barrier itself.
    Barrier(CheckpointId, CheckpointKind),
    /// In-band: no more items on this channel.
    End,
    /// Injected: the coordinator triggers this node for a checkpoint of
    /// this kind.
    Trigger(CheckpointId, CheckpointKind),
    /// Injected: the checkpoint is complete and durable.
    Complete(CheckpointId),
    /// Injected: the checkpoint was aborted.
    Abort(CheckpointId),
    /// Injected into a loop head: time passed (it may end its loop).
    Tick,
    /// In-band: no record with event time at or below this follows on
    /// this channel (DESIGN.md §7).
    Watermark(u64),
    /// In-band: the channel is idle and drops out of the watermark
    /// minimum until it carries a batch or a watermark again.
    Idle,
    /// In-band: the marker of a snapshot that is not a checkpoint (see
    /// [`crate::job::snapshots`]); only the concurrent machine sees it.
    Marker(SnapshotId),
    /// Injected: start a snapshot here for the supervisor.
    StartSnapshot,
    /// Injected: take part in this snapshot as if its marker had come.
    JoinSnapshot(SnapshotId),
    /// Injected into a loop head: a snapshot proved the loop quiescent,
    /// end its feedback inputs now.
    EndLoop,
}

/// What a subtask tells the supervisor.
#[derive(Debug)]
pub(crate) struct NodeEvent {
    pub(crate) generation: Generation,
    pub(crate) node: usize,
    pub(crate) kind: NodeEventKind,
}

#[derive(Debug)]
pub(crate) enum NodeEventKind {
    /// The node's part of a checkpoint: a [`PartBytes`] in the store's
    /// segments (one own segment unless it is incremental), or a state the
    /// writer encodes into them.
    Ack {
        checkpoint: CheckpointId,
        part: PendingPart,
        /// Barrier alignment at this node: from its first barrier of the
        /// checkpoint to its snapshot (0 without a barrier, e.g. a source).
        alignment_us: u64,
    },
    Decline {
        checkpoint: CheckpointId,
        reason: DeclineReason,
    },
    /// Every input ended (a source: it is exhausted); no barrier can reach
    /// the node any more, so it must be triggered directly.
    InputsEnded,
    /// The node processed the completion of `checkpoint`: a sink
    /// committed its output up to it.
    Committed { checkpoint: CheckpointId },
    /// The node started `snapshot` (`declined`: over its bound, so no
    /// other node hears of it); `reply` is the operator's own request, or
    /// `None` for the supervisor's oldest start injected into this node.
    SnapshotStarted {
        snapshot: SnapshotId,
        reply: Option<SnapshotReply>,
        declined: Option<usize>,
    },
    /// The node's part of `snapshot`, encoded as a [`PartBytes`](super::PartBytes).
    SnapshotPart {
        snapshot: SnapshotId,
        part: Vec<u8>,
        activity: Box<PartActivity>,
    },
    /// The node declined `snapshot`.
    SnapshotDeclined {
        snapshot: SnapshotId,
        max_concurrent: usize,
    },
}

impl Message for NodeEvent {
    type Result = ();
}
