//! Deleting complete checkpoints and savepoints on request (the
//! `snapflow` tool's `delete` and `prune`), the way retention deletes:
//! the metadata first, so that no crash leaves a directory that lists
//! parts it no longer has, then the shared files nothing refers to any
//! more. It never decides which entries are safe to
//! delete; the caller does (the tool keeps the newest checkpoint unless
//! told otherwise).

use super::{lock, read_metadata, Engine};
use crate::storage::{CheckpointId, CheckpointKind, StoreError};

impl Engine {
    /// Deletes complete checkpoint or savepoint `checkpoint`.
    ///
    /// Only the store's owner deletes: a running job in another process
    /// holds the directory's lock, so a tool cannot open the store for
    /// this while the job runs, and a read-only store refuses.
    pub(crate) fn delete(&self, checkpoint: CheckpointId) -> Result<CheckpointKind, StoreError> {
        self.check_writable("delete")?;
        let _serial = lock(&self.retention);
        let (_, kind, dir) = self
            .entries()?
            .into_iter()
            .find(|(id, _, _)| *id == checkpoint)
            .ok_or(StoreError::NotFound(checkpoint))?;
        if read_metadata(self.io.as_ref(), &dir, Some((checkpoint, &self.job)))?.is_none() {
            return Err(StoreError::NotFound(checkpoint));
        }
        let pins = self.pins.lock();
        if pins.contains_key(&checkpoint) {
            return Err(StoreError::Pinned(checkpoint));
        }
        self.delete_dir(&dir)?;
        drop(pins);
        // Shared files only this checkpoint referred to go with it.
        self.collect_shared()?;
        Ok(kind)
    }

    /// Deletes every complete checkpoint but the newest `keep` (at least
    /// one), as retention would with `keep` retained; savepoints stay.
    /// Returns the deleted ids, oldest first.
    pub(crate) fn prune(&self, keep: usize) -> Result<Vec<CheckpointId>, StoreError> {
        self.check_writable("prune")?;
        if keep == 0 {
            return Err(StoreError::InvalidOptions(
                "prune keeps at least 1 checkpoint".to_string(),
            ));
        }
        let complete: Vec<CheckpointId> = self
            .list()?
            .into_iter()
            .filter(|entry| entry.kind == CheckpointKind::Checkpoint)
            .map(|entry| entry.checkpoint)
            .collect();
        let doomed = &complete[..complete.len().saturating_sub(keep)];
        for &checkpoint in doomed {
            self.delete(checkpoint)?;
        }
        Ok(doomed.to_vec())
    }
}
