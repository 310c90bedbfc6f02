//! [`FsCheckpointStore`]: checkpoints in a local directory, the embedded
//! default, and [`load_checkpoint_dir`] for savepoints that were moved.
//!
//! This module only chooses the real file system ([`StdIo`]) or a caller's
//! [`Io`]; the layout, write order and retention live in the engine. It
//! never looks inside a part.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::engine::{delegate_store, read_metadata, read_parts, Engine};
use super::io::{Io, StdIo};
use super::pin::CheckpointPin;
use super::{CheckpointId, CheckpointKind, Leftover, LoadedCheckpoint, StoreError, StoreOptions};

/// A [`CheckpointStore`](super::CheckpointStore) in a local directory.
///
/// `root` may hold several jobs; each gets `root/job-<escaped name>/` with
/// `checkpoints/` and `savepoints/` inside. One store object owns a job's
/// directory at a time: opening takes an OS lock on `<job dir>/_lock` and
/// holds it until the store is dropped (see [`super::owner`]), so a second
/// process on the same job fails with
/// [`StoreError::StoreInUse`](super::StoreError::StoreInUse) before it
/// reads anything. The lock dies with its process, so a killed job never
/// blocks the next.
#[derive(Debug)]
pub struct FsCheckpointStore {
    engine: Engine,
}

impl FsCheckpointStore {
    /// Opens (creating if needed) the checkpoints of `job` under `root`, with
    /// default options, as their one owner.
    ///
    /// # Errors
    ///
    /// [`StoreError::StoreInUse`](super::StoreError::StoreInUse) when
    /// another process (or another store object of this one) owns the
    /// job's directory; the errors of creating its directories.
    pub fn open(root: impl AsRef<Path>, job: &str) -> Result<Self, StoreError> {
        Self::open_with(root, job, StoreOptions::default())
    }

    /// Opens the checkpoints of `job` under `root` with `options`.
    pub fn open_with(
        root: impl AsRef<Path>,
        job: &str,
        options: StoreOptions,
    ) -> Result<Self, StoreError> {
        Self::with_io(Arc::new(StdIo), root, job, options)
    }

    /// Opens a store that does its I/O through `io`: a
    /// [`FaultyIo`](super::fault::FaultyIo) in fault-injection tests, or a
    /// [`MemFs`](super::memory::MemFs).
    pub fn with_io(
        io: Arc<dyn Io>,
        root: impl AsRef<Path>,
        job: &str,
        options: StoreOptions,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            engine: Engine::open(io, root.as_ref(), job, options)?,
        })
    }

    /// Opens the checkpoints of `job` under `root` without owning them: no
    /// lock, nothing created, and every write (begin, discard, delete,
    /// prune, setting aside) refused with
    /// [`StoreError::ReadOnly`](super::StoreError::ReadOnly). For tools
    /// that list, load and verify a store while its job runs; what they
    /// read is what the owner has committed, and a checkpoint the owner's
    /// retention deletes meanwhile reads as not found or incomplete.
    pub fn open_read_only(root: impl AsRef<Path>, job: &str) -> Result<Self, StoreError> {
        Ok(Self {
            engine: Engine::open_read_only(
                Arc::new(StdIo),
                root.as_ref(),
                job,
                StoreOptions::default(),
            )?,
        })
    }

    /// Deletes complete checkpoint or savepoint `checkpoint` (its
    /// metadata first, so a crash never leaves a listed entry without its
    /// parts) and says which kind it was. Retention does this on its own;
    /// this is for tools.
    ///
    /// # Errors
    ///
    /// [`StoreError::NotFound`] when there is no such complete entry,
    /// [`StoreError::Pinned`] while a restore in this process reads it,
    /// [`StoreError::Io`].
    pub fn delete(&self, checkpoint: u64) -> Result<CheckpointKind, StoreError> {
        self.engine.delete(checkpoint)
    }

    /// Deletes every complete checkpoint but the newest `keep`; savepoints
    /// stay. Returns the deleted ids, oldest first.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidOptions`] for `keep == 0`, and those of
    /// [`FsCheckpointStore::delete`].
    pub fn prune(&self, keep: usize) -> Result<Vec<u64>, StoreError> {
        self.engine.prune(keep)
    }

    /// Where the job's checkpoints are, for [`CheckpointStore::location`](super::CheckpointStore::location).
    /// What the job's directory holds besides its complete checkpoints
    /// and savepoints (see [`Leftover`]), for `snapflow verify`. It only
    /// reads.
    pub fn leftovers(&self) -> Result<Vec<Leftover>, StoreError> {
        self.engine.leftovers()
    }

    fn directory(&self) -> Option<&Path> {
        Some(self.engine.job_dir())
    }

    /// The job's directory, `root/job-<escaped name>`.
    pub fn job_dir(&self) -> &Path {
        self.engine.job_dir()
    }

    /// The directory of checkpoint (or savepoint) `checkpoint`, whether or
    /// not it exists. A savepoint's directory is self-contained and can be
    /// moved and loaded with [`load_checkpoint_dir`].
    pub fn entry_dir(&self, checkpoint: CheckpointId, kind: CheckpointKind) -> PathBuf {
        self.engine.entry_dir(checkpoint, kind)
    }
}

delegate_store!(FsCheckpointStore);

/// Loads and verifies the checkpoint or savepoint whose directory is `dir`
/// (the one holding `_metadata`), wherever it has been moved to. The job
/// name inside is not checked, so a savepoint can start a job of another
/// name. The returned pin protects nothing: no store owns `dir`.
pub fn load_checkpoint_dir(dir: impl AsRef<Path>) -> Result<LoadedCheckpoint, StoreError> {
    load_checkpoint_dir_with_io(&StdIo, dir)
}

/// [`load_checkpoint_dir`] through a caller's [`Io`].
pub fn load_checkpoint_dir_with_io(
    io: &dyn Io,
    dir: impl AsRef<Path>,
) -> Result<LoadedCheckpoint, StoreError> {
    let dir = dir.as_ref();
    let metadata = read_metadata(io, dir, None)?.ok_or_else(|| StoreError::CorruptMetadata {
        checkpoint: None,
        path: dir.join(super::engine::METADATA_FILE),
        reason: "the directory has no metadata file".to_string(),
    })?;
    // A checkpoint (not a savepoint) may refer to shared files; they are
    // looked for where the store keeps them, two levels up.
    let shared_dir = dir
        .parent()
        .and_then(Path::parent)
        .map_or_else(|| dir.join("shared"), |job_dir| job_dir.join("shared"));
    let parts = read_parts(io, dir, &shared_dir, &metadata)?;
    Ok(LoadedCheckpoint {
        pin: CheckpointPin::detached(metadata.checkpoint),
        metadata,
        parts,
    })
}
