//! Finding and reading what a store directory holds, without ever
//! creating or changing anything in it.
//!
//! A store directory (the `root` a job's `JobConfig::with_store_dir`
//! names) holds one `job-<escaped name>` directory per job. This module
//! turns a path into the jobs it holds and a job into its entries, and
//! refuses paths that are not a store with a typed error. It prints
//! nothing: `report` does.

use std::path::{Path, PathBuf};

use snapflow::storage::names::decode_component;
use snapflow::storage::{
    load_checkpoint_dir, CheckpointStore, CheckpointSummary, FsCheckpointStore, LoadedCheckpoint,
    StoreError,
};

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
pub fn open(root: &Path, job: &str) -> Result<FsCheckpointStore, CliError> {
    check_exists(root, job)?;
    Ok(FsCheckpointStore::open_read_only(root, job)?)
}

/// Opens job `job` of the store `root`, which must exist, as its owner,
/// to delete from it: refused with the store's `StoreInUse` while a job
/// (or another tool) owns it.
///
/// # Errors
///
/// As [`open`], and `StoreInUse`.
pub fn open_owned(root: &Path, job: &str) -> Result<FsCheckpointStore, CliError> {
    check_exists(root, job)?;
    Ok(FsCheckpointStore::open(root, job)?)
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
pub fn entries(store: &FsCheckpointStore, job: &str) -> Result<JobEntries, CliError> {
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
pub fn load(store: &FsCheckpointStore, checkpoint: u64) -> Result<LoadedCheckpoint, CliError> {
    Ok(store.load(checkpoint)?)
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
