//! What a job's directory holds besides its complete checkpoints and
//! savepoints: directories that never committed, directories whose
//! metadata does not read, checkpoints set aside as damaged, and shared
//! files no complete checkpoint refers to. It only lists (for `snapflow
//! verify`); retention and recovery decide what goes.

use std::collections::BTreeSet;
use std::path::PathBuf;

use super::{lock, read_metadata, Engine};
use crate::storage::{CheckpointId, CheckpointKind, PartId, StoreError};

/// Something in a job's store directory that no complete checkpoint or
/// savepoint accounts for ([`FsCheckpointStore::leftovers`]).
///
/// [`FsCheckpointStore::leftovers`]: crate::storage::FsCheckpointStore::leftovers
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Leftover {
    /// A checkpoint or savepoint directory without metadata: a write
    /// that never committed (a crash, a kill). Loading ignores it;
    /// retention removes it once a newer checkpoint completes.
    Incomplete {
        /// Its id.
        checkpoint: CheckpointId,
        /// Checkpoint or savepoint.
        kind: CheckpointKind,
        /// Its directory.
        path: PathBuf,
    },
    /// A directory whose metadata does not read (damaged, or of a newer
    /// format): loading skips it.
    Unreadable {
        /// Its id.
        checkpoint: CheckpointId,
        /// Checkpoint or savepoint, by the directory it is in.
        kind: CheckpointKind,
        /// Its directory.
        path: PathBuf,
        /// Why its metadata does not read.
        reason: String,
    },
    /// A damaged checkpoint a recovery set aside, kept for inspection.
    SetAside {
        /// Its id.
        checkpoint: CheckpointId,
        /// Its directory.
        path: PathBuf,
    },
    /// A shared file (or a temporary one) that no complete checkpoint
    /// refers to; the next retention deletes it.
    UnreferencedShared {
        /// The file.
        path: PathBuf,
    },
}

impl Engine {
    /// Every [`Leftover`] of this job, in the order: entries by id, then
    /// shared files by path. Checkpoints this store object is writing
    /// are not leftovers.
    pub(crate) fn leftovers(&self) -> Result<Vec<Leftover>, StoreError> {
        let pending: BTreeSet<CheckpointId> = lock(&self.pending).keys().copied().collect();
        let mut found = Vec::new();
        let mut referenced: BTreeSet<(PartId, CheckpointId)> = BTreeSet::new();
        for (checkpoint, kind, dir) in self.entries()? {
            if pending.contains(&checkpoint) {
                continue;
            }
            match read_metadata(self.io.as_ref(), &dir, Some((checkpoint, &self.job))) {
                Ok(Some(metadata)) => referenced.extend(
                    metadata
                        .shared_files()
                        .map(|(part, shared)| (part.clone(), shared)),
                ),
                Ok(None) => found.push(Leftover::Incomplete {
                    checkpoint,
                    kind,
                    path: dir,
                }),
                Err(error) if error.is_corruption() => found.push(Leftover::Unreadable {
                    checkpoint,
                    kind,
                    path: dir,
                    reason: error.to_string(),
                }),
                Err(error) => return Err(error),
            }
        }
        for checkpoint in self.damaged_ids()? {
            for kind in [CheckpointKind::Checkpoint, CheckpointKind::Savepoint] {
                found.extend(
                    self.set_aside_dirs(checkpoint, kind)?
                        .into_iter()
                        .map(|path| Leftover::SetAside { checkpoint, path }),
                );
            }
        }
        self.unreferenced_shared(&pending, &referenced, &mut found)?;
        Ok(found)
    }

    /// The directories of `checkpoint` of `kind` that were set aside.
    fn set_aside_dirs(
        &self,
        checkpoint: CheckpointId,
        kind: CheckpointKind,
    ) -> Result<Vec<PathBuf>, StoreError> {
        let dir = self.entry_dir(checkpoint, kind);
        let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
            return Ok(Vec::new());
        };
        let prefix = format!("{}.damaged-", name.to_string_lossy());
        let listing = self
            .io
            .list_dir(parent)
            .map_err(|error| StoreError::io("list_dir", parent, error))?;
        Ok(listing
            .into_iter()
            .filter(|entry| entry.is_dir && entry.name.starts_with(&prefix))
            .map(|entry| parent.join(entry.name))
            .collect())
    }

    /// Adds every file under `shared/` that no complete entry refers to
    /// and no checkpoint in progress here wrote.
    fn unreferenced_shared(
        &self,
        pending: &BTreeSet<CheckpointId>,
        referenced: &BTreeSet<(PartId, CheckpointId)>,
        found: &mut Vec<Leftover>,
    ) -> Result<(), StoreError> {
        for file in self.shared_files()? {
            let kept = !file.temporary && referenced.contains(&(file.part, file.shared));
            if kept || pending.contains(&file.shared) {
                continue;
            }
            found.push(Leftover::UnreferencedShared { path: file.path });
        }
        Ok(())
    }
}
