//! Checks of a file checkpoint store's shared files (incremental
//! checkpoints): every listed checkpoint loads, so no file one refers to
//! was deleted, and no shared file is left that none refers to.

use std::collections::BTreeSet;

use snapflow::storage::{names, CheckpointStore, FsCheckpointStore};

/// What [`check`] found: how many listed checkpoints refer to shared
/// files of earlier checkpoints, and how many shared files exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedFiles {
    /// Listed checkpoints that refer to at least one earlier
    /// checkpoint's shared file.
    pub incremental_checkpoints: usize,
    /// Shared files on disk, all of them referenced.
    pub files: usize,
}

/// Loads every listed checkpoint of `store` and compares the shared files
/// on disk with those the checkpoints refer to; the error says which
/// differ.
pub fn check(store: &FsCheckpointStore) -> Result<SharedFiles, String> {
    let mut referenced = BTreeSet::new();
    let mut incremental_checkpoints = 0;
    for entry in store.list().map_err(|error| error.to_string())? {
        let loaded = store.load(entry.checkpoint).map_err(|error| {
            format!(
                "listed checkpoint {} does not load: {error}",
                entry.checkpoint
            )
        })?;
        let metadata = &loaded.metadata;
        if metadata
            .shared_files()
            .any(|(_, shared)| shared < metadata.checkpoint)
        {
            incremental_checkpoints += 1;
        }
        for (part, shared) in metadata.shared_files() {
            let operator = names::operator_dir_name(&part.operator).map_err(|e| e.to_string())?;
            referenced.insert(format!("{operator}/{}-{shared:020}.shared", part.subtask));
        }
    }
    let shared_dir = store.job_dir().join("shared");
    let mut on_disk = BTreeSet::new();
    if let Ok(operators) = std::fs::read_dir(&shared_dir) {
        for operator in operators.flatten() {
            let files = std::fs::read_dir(operator.path()).map_err(|error| error.to_string())?;
            for file in files.flatten() {
                on_disk.insert(format!(
                    "{}/{}",
                    operator.file_name().to_string_lossy(),
                    file.file_name().to_string_lossy()
                ));
            }
        }
    }
    if on_disk != referenced {
        return Err(format!(
            "shared files on disk {on_disk:?} differ from those referenced {referenced:?}"
        ));
    }
    Ok(SharedFiles {
        incremental_checkpoints,
        files: on_disk.len(),
    })
}
