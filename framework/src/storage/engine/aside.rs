//! The engine's damaged checkpoints: setting one aside under a name no
//! listing parses, listing those set aside, and the highest id the job's
//! directories hold in any form (the floor of new ids). It never decides
//! that a checkpoint is damaged; the caller (the job layer's recovery)
//! does.

use std::path::PathBuf;

use super::{lock, parent, parse_entry_name, Engine};
use crate::storage::{CheckpointId, CheckpointKind, StoreError};

/// What a damaged checkpoint's directory name gets, before a timestamp.
const DAMAGED_SUFFIX: &str = ".damaged-";
/// The note inside a directory set aside, saying what was wrong.
const DAMAGED_NOTE_FILE: &str = "_damaged";

impl Engine {
    /// Every directory of this job whose name starts like a checkpoint's
    /// or savepoint's (`chk-`/`sp-` and 20 digits), as `(id, set aside)`.
    fn named_ids(&self) -> Result<Vec<(CheckpointId, bool)>, StoreError> {
        let mut ids = Vec::new();
        for (dir, prefix) in [
            (&self.checkpoints_dir, "chk-"),
            (&self.savepoints_dir, "sp-"),
        ] {
            let listing = self
                .io
                .list_dir(dir)
                .map_err(|error| StoreError::io("list_dir", dir, error))?;
            for entry in listing.into_iter().filter(|entry| entry.is_dir) {
                let Some(rest) = entry.name.strip_prefix(prefix) else {
                    continue;
                };
                let id = rest
                    .get(..20)
                    .and_then(|digits| parse_entry_name(digits, ""));
                let damaged = rest
                    .get(20..)
                    .is_some_and(|tail| tail.starts_with(DAMAGED_SUFFIX));
                ids.extend(id.map(|id| (id, damaged)));
            }
        }
        Ok(ids)
    }

    /// The ids of the directories [`Engine::set_aside`] renamed, ascending.
    pub(crate) fn damaged_ids(&self) -> Result<Vec<CheckpointId>, StoreError> {
        let mut ids: Vec<CheckpointId> = self
            .named_ids()?
            .into_iter()
            .filter_map(|(id, damaged)| damaged.then_some(id))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    /// The highest id of any directory of this job that names a
    /// checkpoint or savepoint: complete, never committed, corrupt or set
    /// aside, or of a checkpoint in progress. A new checkpoint must take a
    /// higher one.
    pub(crate) fn highest_id(&self) -> Result<Option<CheckpointId>, StoreError> {
        let pending = lock(&self.pending).keys().next_back().copied();
        let named = self.named_ids()?.into_iter().map(|(id, _)| id).max();
        Ok(pending.max(named))
    }

    /// Renames a damaged checkpoint's directory to
    /// `<name>.damaged-<unix ms>`, which no listing or loading parses, and
    /// writes `reason` into a `_damaged` file inside it for whoever
    /// inspects it. Returns the new path, or `None` when no directory has
    /// that id.
    pub(crate) fn set_aside(
        &self,
        checkpoint: CheckpointId,
        reason: &str,
    ) -> Result<Option<PathBuf>, StoreError> {
        self.check_writable("set_aside")?;
        for kind in [CheckpointKind::Checkpoint, CheckpointKind::Savepoint] {
            let dir = self.entry_dir(checkpoint, kind);
            if !self.exists(&dir)? {
                continue;
            }
            let mut name = dir.file_name().unwrap_or_default().to_os_string();
            name.push(format!("{DAMAGED_SUFFIX}{}", crate::storage::now_unix_ms()));
            let target = dir.with_file_name(name);
            self.io
                .rename(&dir, &target)
                .map_err(|error| StoreError::io("rename", &dir, error))?;
            self.sync_dir(parent(&dir))?;
            // The note is for people; losing it loses no data.
            let note = target.join(DAMAGED_NOTE_FILE);
            if let Err(error) = self.io.write_file(&note, reason.as_bytes()) {
                tracing::debug!(?note, %error, "could not write the damage note");
            }
            return Ok(Some(target));
        }
        Ok(None)
    }
}
