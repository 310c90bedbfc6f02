//! Snapshot states taken but not yet reported, shared by the stage and
//! source shells. Bounded by the checkpoints in flight at a node.

use crate::protocol::CheckpointId;
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
