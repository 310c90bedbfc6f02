//! Finding and reading what a store holds, without ever creating or
//! changing anything in it unless asked to delete.
//!
//! A store (the `root` a job's `JobConfig::with_store_dir` or
//! `with_store_location` names) is a directory or, with the `s3` feature,
//! an object-storage location `s3://bucket/prefix` (endpoint and
//! credentials from the `AWS_*` variables). It holds one
//! `job-<escaped name>` directory (or prefix) per job. This module turns a
//! root into the jobs it holds and a job into its entries, and refuses
//! roots that are not a store with a typed error. It prints nothing:
//! `report` does.

use std::path::{Path, PathBuf};

use snapflow::storage::names::decode_component;
use snapflow::storage::{
    load_checkpoint_dir, CheckpointId, CheckpointKind, CheckpointStore, CheckpointSummary,
    FsCheckpointStore, Leftover, LoadedCheckpoint, StoreError,
};

/// One job's store, on a directory or on object storage.
#[derive(Debug)]
pub enum Store {
    /// A job directory.
    Fs(FsCheckpointStore),
    /// A job's prefix on object storage.
    #[cfg(feature = "s3")]
    Object(snapflow::storage::ObjectCheckpointStore),
}

impl Store {
    /// The store through the common trait.
    pub fn as_store(&self) -> &dyn CheckpointStore {
        match self {
            Store::Fs(store) => store,
            #[cfg(feature = "s3")]
            Store::Object(store) => store,
        }
    }

    /// What the job holds besides its complete entries.
    pub fn leftovers(&self) -> Result<Vec<Leftover>, StoreError> {
        match self {
            Store::Fs(store) => store.leftovers(),
            #[cfg(feature = "s3")]
            Store::Object(store) => store.leftovers(),
        }
    }

    /// Deletes every complete checkpoint but the newest `keep`.
    pub fn prune(&self, keep: usize) -> Result<Vec<CheckpointId>, StoreError> {
        match self {
            Store::Fs(store) => store.prune(keep),
            #[cfg(feature = "s3")]
            Store::Object(store) => store.prune(keep),
        }
    }

    /// Deletes complete entry `checkpoint`.
    pub fn delete(&self, checkpoint: CheckpointId) -> Result<CheckpointKind, StoreError> {
        match self {
            Store::Fs(store) => store.delete(checkpoint),
            #[cfg(feature = "s3")]
            Store::Object(store) => store.delete(checkpoint),
        }
    }

    /// Where entry `checkpoint` of `kind` lives.
    pub fn entry_dir(&self, checkpoint: CheckpointId, kind: CheckpointKind) -> PathBuf {
        match self {
            Store::Fs(store) => store.entry_dir(checkpoint, kind),
            #[cfg(feature = "s3")]
            Store::Object(store) => store.entry_dir(checkpoint, kind),
        }
    }
}

/// Whether `root` names object storage rather than a directory.
fn is_object(root: &Path) -> bool {
    root.to_str().is_some_and(|root| root.starts_with("s3://"))
}

#[cfg(feature = "s3")]
mod object {
    use std::path::Path;

    use snapflow::storage::{ObjectCheckpointStore, S3Settings};

    use super::{CliError, Store};

    fn location(root: &Path) -> &str {
        root.to_str().unwrap_or_default()
    }

    pub(super) fn jobs(root: &Path) -> Result<Vec<String>, CliError> {
        let jobs = ObjectCheckpointStore::jobs_at(location(root), &S3Settings::from_env())?;
        if jobs.is_empty() {
            return Err(CliError::NotAStore {
                path: root.to_path_buf(),
            });
        }
        Ok(jobs)
    }

    pub(super) fn open(root: &Path, job: &str) -> Result<Store, CliError> {
        Ok(Store::Object(ObjectCheckpointStore::open_read_only(
            location(root),
            job,
        )?))
    }

    /// Opening as owner on object storage takes the store over: a job
    /// that runs on it can no longer commit. The tool says so.
    pub(super) fn open_owned(root: &Path, job: &str) -> Result<Store, CliError> {
        eprintln!(
            "snapflow: taking the store of job {job:?} over; a job running on it now fails \
             at its next checkpoint (stop it first)"
        );
        Ok(Store::Object(ObjectCheckpointStore::open(
            location(root),
            job,
        )?))
    }
}

#[cfg(not(feature = "s3"))]
mod object {
    use std::path::Path;

    use super::{CliError, Store};

    fn unsupported(root: &Path) -> CliError {
        CliError::Usage(format!(
            "{} is on object storage, and this build has no `s3` feature",
            root.display()
        ))
    }

    pub(super) fn jobs(root: &Path) -> Result<Vec<String>, CliError> {
        Err(unsupported(root))
    }

    pub(super) fn open(root: &Path, _job: &str) -> Result<Store, CliError> {
        Err(unsupported(root))
    }

    pub(super) fn open_owned(root: &Path, _job: &str) -> Result<Store, CliError> {
        Err(unsupported(root))
    }
}

/// Why the tool could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The command line was wrong.
    #[error("{0}")]
    Usage(String),
    /// The path does not exist or is not a directory.
    #[error("{path}: no such directory")]
    NoDirectory {
        /// The path given.
        path: PathBuf,
    },
    /// The directory holds no job's checkpoints.
    #[error("{path} is not a snapflow store: it holds no job-* directory")]
    NotAStore {
        /// The path given.
        path: PathBuf,
    },
    /// The store has no job of this name.
    #[error("the store {root} has no job {job:?} (it has: {known})")]
    NoSuchJob {
        /// The store directory.
        root: PathBuf,
        /// The job asked for.
        job: String,
        /// The jobs it has, comma-separated.
        known: String,
    },
    /// Reading the directory failed.
    #[error("{path}: {source}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The store refused or failed (a damaged checkpoint among them).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The names of the jobs in the store directory `root`, sorted.
///
/// # Errors
///
/// [`CliError::NoDirectory`], [`CliError::NotAStore`] or
/// [`CliError::Io`].
pub fn jobs(root: &Path) -> Result<Vec<String>, CliError> {
    if is_object(root) {
        return object::jobs(root);
    }
    if !root.is_dir() {
        return Err(CliError::NoDirectory {
            path: root.to_path_buf(),
        });
    }
    let io = |source| CliError::Io {
        path: root.to_path_buf(),
        source,
    };
    let mut jobs = Vec::new();
    for entry in std::fs::read_dir(root).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name();
        let job = name
            .to_str()
            .and_then(|name| name.strip_prefix("job-"))
            .and_then(decode_component);
        if let (Some(job), true) = (job, entry.path().is_dir()) {
            jobs.push(job);
        }
    }
    if jobs.is_empty() {
        return Err(CliError::NotAStore {
            path: root.to_path_buf(),
        });
    }
    jobs.sort();
    Ok(jobs)
}

/// Opens job `job` of the store `root`, which must exist, to read it: no
/// lock is taken and nothing is created, so it works while the job runs
/// (and owns the store), and every write through it is refused.
///
/// # Errors
///
/// [`CliError::NoSuchJob`] and the errors of [`jobs`] and of opening.
pub fn open(root: &Path, job: &str) -> Result<Store, CliError> {
    check_exists(root, job)?;
    if is_object(root) {
        return object::open(root, job);
    }
    Ok(Store::Fs(FsCheckpointStore::open_read_only(root, job)?))
}

/// Opens job `job` of the store `root`, which must exist, as its owner,
/// to delete from it: refused with the store's `StoreInUse` while a job
/// (or another tool) owns it.
///
/// # Errors
///
/// As [`open`], and `StoreInUse`.
pub fn open_owned(root: &Path, job: &str) -> Result<Store, CliError> {
    check_exists(root, job)?;
    if is_object(root) {
        return object::open_owned(root, job);
    }
    Ok(Store::Fs(FsCheckpointStore::open(root, job)?))
}

/// Opening a store that does not exist would create it.
fn check_exists(root: &Path, job: &str) -> Result<(), CliError> {
    let known = jobs(root)?;
    if !known.iter().any(|name| name == job) {
        return Err(CliError::NoSuchJob {
            root: root.to_path_buf(),
            job: job.to_string(),
            known: known.join(", "),
        });
    }
    Ok(())
}

/// What one job's directory holds.
pub struct JobEntries {
    /// The job's name.
    pub job: String,
    /// Checkpoints and savepoints whose metadata is valid, oldest first.
    pub entries: Vec<CheckpointSummary>,
    /// Checkpoints set aside as damaged by a recovery.
    pub damaged: Vec<u64>,
}

/// The entries of `job`.
///
/// # Errors
///
/// The store's, when it cannot list.
pub fn entries(store: &Store, job: &str) -> Result<JobEntries, CliError> {
    let store = store.as_store();
    Ok(JobEntries {
        job: job.to_string(),
        entries: store.list()?,
        damaged: store.damaged_ids()?,
    })
}

/// Loads checkpoint `checkpoint` of `store` and verifies every part's size
/// and checksum against its metadata (the store does both).
///
/// # Errors
///
/// The store's typed error when anything is missing or damaged.
pub fn load(store: &Store, checkpoint: u64) -> Result<LoadedCheckpoint, CliError> {
    Ok(store.as_store().load(checkpoint)?)
}

/// Loads the checkpoint or savepoint whose own directory is `dir` (one
/// holding `_metadata`, wherever it was moved).
///
/// # Errors
///
/// As [`load`].
pub fn load_dir(dir: &Path) -> Result<LoadedCheckpoint, CliError> {
    if !dir.is_dir() {
        return Err(CliError::NoDirectory {
            path: dir.to_path_buf(),
        });
    }
    Ok(load_checkpoint_dir(dir)?)
}
