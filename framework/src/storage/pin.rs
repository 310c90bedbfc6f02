//! Pins: in-memory leases that keep retention from deleting a checkpoint
//! while someone restores from it.
//!
//! This module only counts pins per checkpoint id. It never deletes
//! anything and knows nothing of files; the store's retention consults it.
//! Pins live in one process: they do not protect a checkpoint from another
//! process writing the same directory (which the store does not support).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::CheckpointId;

/// The pin counts of one store.
#[derive(Debug, Default)]
pub(crate) struct PinTable {
    counts: Mutex<BTreeMap<CheckpointId, usize>>,
}

impl PinTable {
    /// Locks the table. Retention holds this lock while it deletes, so a pin
    /// taken concurrently either comes first (and the checkpoint is kept)
    /// or comes after the deletion (and the pinning call sees it gone).
    pub(crate) fn lock(&self) -> MutexGuard<'_, BTreeMap<CheckpointId, usize>> {
        // Counts are updated in single statements; a poisoned lock still
        // holds consistent counts.
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a pin on `checkpoint`.
    pub(crate) fn pin(self: &Arc<Self>, checkpoint: CheckpointId) -> CheckpointPin {
        *self.lock().entry(checkpoint).or_insert(0) += 1;
        CheckpointPin {
            checkpoint,
            table: Some(Arc::clone(self)),
        }
    }

    fn unpin(&self, checkpoint: CheckpointId) {
        let mut counts = self.lock();
        if let Some(count) = counts.get_mut(&checkpoint) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&checkpoint);
            }
        }
    }
}

/// A lease on a checkpoint: while it lives, retention of the store that
/// issued it does not delete the checkpoint. Dropping it releases the lease;
/// cloning it takes another.
#[derive(Debug)]
pub struct CheckpointPin {
    checkpoint: CheckpointId,
    table: Option<Arc<PinTable>>,
}

impl CheckpointPin {
    /// A pin that protects nothing, for checkpoints loaded from a directory
    /// outside any store (a moved savepoint).
    pub(crate) fn detached(checkpoint: CheckpointId) -> Self {
        Self {
            checkpoint,
            table: None,
        }
    }

    /// The pinned checkpoint's id.
    pub fn checkpoint(&self) -> CheckpointId {
        self.checkpoint
    }
}

impl Clone for CheckpointPin {
    fn clone(&self) -> Self {
        match &self.table {
            Some(table) => table.pin(self.checkpoint),
            None => Self::detached(self.checkpoint),
        }
    }
}

impl Drop for CheckpointPin {
    fn drop(&mut self) {
        if let Some(table) = &self.table {
            table.unpin(self.checkpoint);
        }
    }
}
