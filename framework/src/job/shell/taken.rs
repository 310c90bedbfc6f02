//! Snapshot states taken but not yet reported, shared by the stage and
//! source shells. Bounded by the checkpoints in flight at a node.

use crate::protocol::{CheckpointId, CheckpointKind};
use crate::runtime::BoxError;

/// Snapshot states taken but not yet reported, per checkpoint. Bounded by
/// the checkpoints in flight at the node (`max_concurrent`): every entry is
/// removed when its part is reported or its checkpoint aborted or
/// subsumed.
pub(super) struct TakenStates<T = Vec<u8>> {
    entries: Vec<(CheckpointId, T)>,
}

impl<T> Default for TakenStates<T> {
    fn default() -> Self {
        TakenStates {
            entries: Vec::new(),
        }
    }
}

impl<T> TakenStates<T> {
    pub(super) fn insert(&mut self, checkpoint: CheckpointId, state: T) {
        self.entries.push((checkpoint, state));
    }

    /// The state taken for `checkpoint`. The machine reports a part only
    /// after its snapshot, so a missing state is a bug in this shell; it
    /// fails the subtask (and restarts the job) rather than acking an
    /// empty state.
    pub(super) fn take(&mut self, checkpoint: CheckpointId) -> Result<T, BoxError> {
        match self.entries.iter().position(|(id, _)| *id == checkpoint) {
            Some(index) => Ok(self.entries.remove(index).1),
            None => Err(format!("no state was taken for {checkpoint}").into()),
        }
    }

    /// Forgets `checkpoint` and everything older (aborted or subsumed).
    pub(super) fn forget_up_to(&mut self, checkpoint: CheckpointId) {
        self.entries.retain(|(id, _)| *id > checkpoint);
    }
}

/// The kind of each checkpoint whose trigger or first barrier reached the
/// node, until it is completed, aborted or subsumed. The kind travels with
/// the trigger and every barrier, so the node learns it before its
/// snapshot (it snapshots only after a trigger or a barrier) and sends it
/// on with its own barriers; nothing job-wide is shared. Bounded: beyond
/// [`BarrierKinds::CAPACITY`] entries the oldest goes, which only makes an
/// old checkpoint's snapshot a whole one (see [`BarrierKinds::kind`]).
#[derive(Default)]
pub(super) struct BarrierKinds {
    entries: Vec<(CheckpointId, CheckpointKind)>,
}

impl BarrierKinds {
    /// More checkpoints than this are never in flight at one node.
    const CAPACITY: usize = 64;

    /// Records the kind `checkpoint`'s trigger or barrier carried.
    pub(super) fn note(&mut self, checkpoint: CheckpointId, kind: CheckpointKind) {
        if self.entries.iter().any(|(id, _)| *id == checkpoint) {
            return;
        }
        if self.entries.len() >= Self::CAPACITY {
            self.entries.remove(0);
        }
        self.entries.push((checkpoint, kind));
    }

    /// The kind of `checkpoint`. One never heard of is taken for a
    /// savepoint: a savepoint is written whole and changes no incremental
    /// bookkeeping, so that is the safe reading.
    pub(super) fn kind(&self, checkpoint: CheckpointId) -> CheckpointKind {
        self.entries
            .iter()
            .find(|(id, _)| *id == checkpoint)
            .map_or(CheckpointKind::Savepoint, |(_, kind)| *kind)
    }

    /// Forgets `checkpoint` and everything older (complete, aborted or
    /// subsumed).
    pub(super) fn forget_up_to(&mut self, checkpoint: CheckpointId) {
        self.entries.retain(|(id, _)| *id > checkpoint);
    }
}
