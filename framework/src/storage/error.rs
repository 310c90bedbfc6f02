//! The errors of the storage layer. This module only defines them; it never
//! decides what a caller should do beyond saying whether a retry can help.

use std::io;
use std::path::PathBuf;

use super::{CheckpointId, PartId};

/// An error of a [`CheckpointStore`](super::CheckpointStore).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An I/O operation failed. Retryable: the disk may be full or a network
    /// file system may be away for a moment.
    #[error("I/O error during {operation} of {path:?}: {source}")]
    Io {
        /// The operation, e.g. `"rename"`.
        operation: &'static str,
        /// The path it was applied to.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A job or operator name cannot be used (see [`names`](super::names)).
    #[error("invalid {kind} name {name:?}: {reason}")]
    InvalidName {
        /// `"job"` or `"operator"`.
        kind: &'static str,
        /// The rejected name (possibly cut short if it was very long).
        name: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A checkpoint's metadata file is unreadable: bad magic, version,
    /// length or checksum, or it describes a different checkpoint or job.
    #[error("metadata of checkpoint {checkpoint:?} at {path:?} is corrupt: {reason}")]
    CorruptMetadata {
        /// The checkpoint whose directory holds the file, when known.
        checkpoint: Option<CheckpointId>,
        /// The metadata file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A part is missing, has the wrong size or fails its checksum. The
    /// whole checkpoint is invalid.
    #[error("part {part} of checkpoint {checkpoint} is corrupt: {reason}")]
    CorruptPart {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The part.
        part: PartId,
        /// What is wrong, naming the part's file.
        reason: String,
    },
    /// No complete checkpoint with this id exists.
    #[error("checkpoint {0} does not exist or is not complete")]
    NotFound(CheckpointId),
    /// `begin` was called for an id that is in progress or complete.
    #[error("checkpoint {0} already exists")]
    AlreadyExists(CheckpointId),
    /// A checkpoint to delete is pinned: a restore in this process is
    /// reading it.
    #[error("checkpoint {0} is being restored from and cannot be deleted now")]
    Pinned(CheckpointId),
    /// `discard` was called for a complete checkpoint.
    #[error("checkpoint {0} is already committed and cannot be discarded")]
    AlreadyCommitted(CheckpointId),
    /// A part was written or a commit requested for a checkpoint that was
    /// never begun (or was already committed or discarded).
    #[error("checkpoint {0} is not in progress")]
    NotInProgress(CheckpointId),
    /// The same part was written twice.
    #[error("part {part} of checkpoint {checkpoint} was already written")]
    DuplicatePart {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The part.
        part: PartId,
    },
    /// Commit was requested while parts were still being written. Retryable
    /// once those writes finish.
    #[error("checkpoint {checkpoint} cannot commit while {count} part writes are in flight")]
    PartsInFlight {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// How many writes are still running.
        count: usize,
    },
    /// The written parts differ from [`CommitRequest::expected_parts`](super::CommitRequest::expected_parts).
    #[error("checkpoint {checkpoint}: parts missing {missing:?}, unexpected {unexpected:?}")]
    PartsMismatch {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// Expected but not written.
        missing: Vec<PartId>,
        /// Written but not expected.
        unexpected: Vec<PartId>,
    },
    /// The metadata could not be encoded (for example, it is too large).
    #[error("metadata of checkpoint {checkpoint} cannot be encoded: {reason}")]
    Encode {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// Why.
        reason: String,
    },
    /// The store's options are unusable.
    #[error("invalid store options: {0}")]
    InvalidOptions(String),
    /// A checkpoint's metadata is intact but of a format version this
    /// build does not read (a newer build wrote it). Loading skips the
    /// checkpoint like a corrupt one and says so.
    #[error("metadata of checkpoint {checkpoint:?} at {path:?} has format version {version}, which this build does not read")]
    UnsupportedFormat {
        /// The checkpoint whose directory holds the file, when known.
        checkpoint: Option<CheckpointId>,
        /// The metadata file.
        path: PathBuf,
        /// The version found.
        version: u16,
    },
    /// A segmented part refers to a shared file that no longer exists
    /// (it was never committed, or nothing referenced it and it was
    /// deleted). Not retryable: the caller must write those bytes again.
    #[error("part {part} of checkpoint {checkpoint} refers to the shared file of checkpoint {shared}, which does not exist")]
    MissingShared {
        /// The checkpoint being written.
        checkpoint: CheckpointId,
        /// The part.
        part: PartId,
        /// The checkpoint whose shared file was named.
        shared: CheckpointId,
    },
    /// This store cannot write segmented parts that refer to earlier
    /// checkpoints (see [`CheckpointStore::supports_segments`](super::CheckpointStore::supports_segments)).
    #[error("this checkpoint store cannot refer to earlier checkpoints' files")]
    SegmentsUnsupported,
    /// Another process (or another store object in this one) owns the
    /// job's directory: it holds the lock on `<job dir>/_lock`. Not
    /// retryable: two writers on one store would set each other's
    /// checkpoints aside and commit output twice, so the second one stops
    /// before it reads anything.
    #[error(
        "the checkpoint store {dir:?} is in use by another process ({}); \
         one process owns a job's store at a time: stop the other one, or give this job another \
         directory or job name",
        owner.as_deref().unwrap_or("owner unknown")
    )]
    StoreInUse {
        /// The job's directory.
        dir: PathBuf,
        /// What the owner wrote into the lock file (pid, host, since
        /// when), when it could be read.
        owner: Option<String>,
    },
    /// A write (begin, delete, prune, setting aside) through a store
    /// opened with [`FsCheckpointStore::open_read_only`](super::FsCheckpointStore::open_read_only),
    /// which does not own the directory. Not retryable.
    #[error(
        "the checkpoint store {dir:?} was opened read-only; {operation} needs the owner's store"
    )]
    ReadOnly {
        /// The job's directory.
        dir: PathBuf,
        /// The refused operation, e.g. `"begin"`.
        operation: &'static str,
    },
    /// A part's bytes could not be produced for writing: its owner hands
    /// the store a state to encode after the snapshot (asynchronous
    /// snapshots), and encoding or checking it failed. Nothing of the
    /// checkpoint is committed. Not retryable: the same state fails again.
    #[error("part {part} of checkpoint {checkpoint} could not be encoded: {reason}")]
    PartNotEncoded {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The part.
        part: PartId,
        /// Why.
        reason: String,
    },
    /// The object store that holds the checkpoints (an `s3://` location)
    /// refused a request or could not be reached. [`ObjectStoreProblem`]
    /// says what to fix and whether a retry can help.
    #[error("object store {location}: {problem}: {detail}")]
    ObjectStore {
        /// The bucket and key (or the location) the request was for.
        location: String,
        /// What kind of failure it was.
        problem: ObjectStoreProblem,
        /// The object store's own message.
        detail: String,
    },
}

/// What went wrong with an object store, in the terms of what to fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ObjectStoreProblem {
    /// The endpoint did not answer (wrong address, server down, network
    /// away). Retryable.
    Unreachable,
    /// The server refused the credentials. Not retryable.
    BadCredentials,
    /// The bucket does not exist. Not retryable.
    NoSuchBucket,
    /// The location or the environment is incomplete or malformed (no
    /// credentials, a location that is not `s3://bucket/prefix`). Not
    /// retryable.
    Configuration,
    /// The server does not support what the commit protocol needs
    /// (conditional writes). Not retryable.
    Unsupported,
    /// Any other failed request (a server error, a throttled request).
    /// Retryable.
    Request,
}

impl ObjectStoreProblem {
    /// Whether retrying the same request may succeed.
    pub fn is_retryable(self) -> bool {
        matches!(self, Self::Unreachable | Self::Request)
    }
}

impl std::fmt::Display for ObjectStoreProblem {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            Self::Unreachable => {
                "the endpoint cannot be reached; check AWS_ENDPOINT_URL and that the server runs"
            }
            Self::BadCredentials => {
                "the credentials were refused; check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            }
            Self::NoSuchBucket => "the bucket does not exist; create it or fix the location",
            Self::Configuration => "the location or the AWS_* environment is incomplete",
            Self::Unsupported => {
                "the server does not support conditional writes (If-None-Match, If-Match), \
                 which the commit needs"
            }
            Self::Request => "a request failed",
        })
    }
}

impl StoreError {
    /// Whether retrying the same call may succeed: true for I/O errors and
    /// for a commit that raced part writes, false for corruption, bad names
    /// and misuse.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Io { .. } | Self::PartsInFlight { .. } => true,
            Self::ObjectStore { problem, .. } => problem.is_retryable(),
            _ => false,
        }
    }

    /// Whether this error says stored bytes are damaged or unreadable by
    /// this build (as opposed to an I/O failure or a misuse of the API).
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            Self::CorruptMetadata { .. }
                | Self::CorruptPart { .. }
                | Self::UnsupportedFormat { .. }
        )
    }

    /// An I/O error of `operation` on `path`. An [`Io`](super::io::Io)
    /// that knows more than an I/O error can say (an object store that
    /// found another owner, or refused the credentials) wraps a
    /// `StoreError` inside the `io::Error` (`StoreError::into_io`);
    /// that error is returned as it is.
    pub(crate) fn io(operation: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        if source
            .get_ref()
            .is_some_and(|inner| inner.is::<StoreError>())
        {
            if let Some(inner) = source.into_inner() {
                if let Ok(typed) = inner.downcast::<StoreError>() {
                    return *typed;
                }
            }
            unreachable_io(operation, path.into())
        } else {
            Self::Io {
                operation,
                path: path.into(),
                source,
            }
        }
    }

    /// This error inside an `io::Error`, for an [`Io`](super::io::Io) to
    /// return; [`StoreError::io`] takes it out again.
    #[cfg(feature = "s3")]
    pub(crate) fn into_io(self) -> io::Error {
        let kind = if self.is_retryable() {
            io::ErrorKind::Other
        } else {
            io::ErrorKind::PermissionDenied
        };
        io::Error::new(kind, self)
    }
}

/// The error of a wrapped `StoreError` that could not be taken out, which
/// `is` just ruled out; kept so the conversion has no panic.
fn unreachable_io(operation: &'static str, path: PathBuf) -> StoreError {
    StoreError::Io {
        operation,
        path,
        source: io::Error::other("a wrapped store error was lost"),
    }
}
