//! The storage layer: durable parts, the atomic commit of a checkpoint,
//! listing, retention and savepoints.
//!
//! This module moves opaque bytes. A *part* is the bytes one subtask of one
//! operator produced for checkpoint `n`; the store never looks inside a part
//! (it does not call the state layer), it only records each part's size and
//! CRC-32 in the checkpoint's metadata and checks both when it reads the part
//! back. It never knows about actors, barriers or the protocol: the runtime
//! tells it which checkpoint to begin, which parts to write and when to
//! commit.
//!
//! # Guarantees
//!
//! - A checkpoint exists only once its metadata file is durable and valid
//!   (magic, format version, CRC). Everything written before that is
//!   invisible to [`CheckpointStore::list`] and to loading.
//! - Commit is atomic: every file is written to a temporary name, fsynced and
//!   renamed, and the directory is fsynced after the renames, in an order that
//!   makes all parts durable before the metadata can be.
//! - Loading checks every part's size and checksum; if any part fails, the
//!   whole checkpoint is skipped, [`CheckpointStore::load_latest`] falls back
//!   to the previous complete one, logs a `tracing::warn!` and reports every
//!   skipped checkpoint and why in its [`LoadReport`].
//! - Retention keeps the newest [`StoreOptions::retained_checkpoints`]
//!   checkpoints and never deletes a pinned one ([`CheckpointPin`]).
//!   Savepoints are never deleted automatically.
//! - Metadata holds no paths: a part's file is derived from its
//!   [`PartId`], relative to the checkpoint's own directory, so a savepoint
//!   directory can be moved and still restores ([`load_checkpoint_dir`]).
//! - Incremental checkpoints: a part may be written as [`Segment`]s, some
//!   of them ranges of shared files that earlier checkpoints wrote
//!   ([`CheckpointStore::write_part_segments`]). Loading assembles the
//!   part, so a reader sees the same bytes as a whole part. A damaged or
//!   missing shared file makes every checkpoint that refers to it invalid;
//!   retention keeps every shared file a remaining checkpoint refers to and
//!   deletes the others. Savepoints are always written self-contained.
//!
//! All I/O goes through the [`io::Io`] trait so that [`fault::FaultyIo`] can
//! fail any single operation and [`memory::MemFs`] can simulate losing what
//! was not fsynced.
//!
//! # Known limits
//!
//! - One owner per job directory: [`FsCheckpointStore::open`] takes an OS
//!   lock on `<job dir>/_lock` before it reads anything and holds it while
//!   the store lives, so a second process (or a second store object) on the
//!   same job fails with [`StoreError::StoreInUse`], which names the owner
//!   (see [`owner`]). [`FsCheckpointStore::open_read_only`] takes no lock
//!   and refuses every write, for tools that look at a running job's store.
//!   Pins are held in memory and protect a checkpoint only from the
//!   retention of the same store object.
//! - Retention counts checkpoints by valid metadata, without re-reading their
//!   parts (that would mean reading every byte after every commit), so a part
//!   that rots on disk is noticed only when it is loaded.
//!
//! # Example
//!
//! ```
//! use snapflow::storage::{
//!     CheckpointKind, CheckpointStore, CommitRequest, MemoryCheckpointStore, PartId,
//! };
//!
//! # fn main() -> Result<(), snapflow::storage::StoreError> {
//! let store = MemoryCheckpointStore::new("wordcount")?;
//! store.begin(1, CheckpointKind::Checkpoint)?;
//! store.write_part(1, &PartId::new("counter", 0), b"state of subtask 0")?;
//! store.commit(1, CommitRequest::default())?;
//!
//! let report = store.load_latest()?;
//! let loaded = report.checkpoint.expect("checkpoint 1 is complete");
//! assert_eq!(loaded.metadata.checkpoint, 1);
//! assert_eq!(loaded.parts[&PartId::new("counter", 0)], b"state of subtask 0");
//! # Ok(())
//! # }
//! ```

mod engine;
mod error;
pub mod fault;
mod fs;
pub mod io;
pub mod memory;
pub mod metadata;
pub mod names;
#[cfg(feature = "s3")]
mod object;
pub mod owner;
mod pin;
pub mod segment;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

pub use engine::Leftover;
pub use error::{ObjectStoreProblem, StoreError};
pub use fs::{load_checkpoint_dir, load_checkpoint_dir_with_io, FsCheckpointStore};
pub use memory::MemoryCheckpointStore;
pub use metadata::{CheckpointMetadata, KeyGroupLayout, PartInfo};
#[cfg(feature = "s3")]
pub use object::{is_object_location, ObjectCheckpointStore, S3Settings, S3_SCHEME};
pub use pin::CheckpointPin;
pub use segment::{Segment, SegmentInfo, SegmentSource, SharedRange};

/// The id of a checkpoint or savepoint. Checkpoints and savepoints of one
/// job share one id sequence, as in Flink.
pub type CheckpointId = u64;

/// The number of completed checkpoints kept by default.
pub const DEFAULT_RETAINED_CHECKPOINTS: usize = 3;

/// Identifies one part of a checkpoint: the state of one subtask of one
/// operator.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PartId {
    /// The operator's name, unique within the job. It becomes a directory
    /// name, so it is validated (see [`names`]).
    pub operator: String,
    /// The subtask index, `0..parallelism`.
    pub subtask: u32,
}

impl PartId {
    /// A part id for `operator`'s subtask `subtask`.
    pub fn new(operator: impl Into<String>, subtask: u32) -> Self {
        Self {
            operator: operator.into(),
            subtask,
        }
    }
}

impl fmt::Display for PartId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}[{}]", self.operator, self.subtask)
    }
}

/// Whether an entry is a periodic checkpoint or a user-triggered savepoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CheckpointKind {
    /// A periodic checkpoint, subject to retention.
    Checkpoint,
    /// A savepoint: stored in its own directory, never deleted automatically.
    Savepoint,
}

/// What the caller supplies when it commits a checkpoint. The store adds the
/// job name, the id, the kind and the list of parts it wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitRequest {
    /// When the checkpoint was triggered, in milliseconds since the Unix
    /// epoch. The protocol layer has no clock, so the runtime supplies it.
    pub created_unix_ms: u64,
    /// Each source subtask's position, as opaque bytes (an offset, a file
    /// name and offset, a Kafka-style map...). Sources decode their own.
    pub source_positions: BTreeMap<PartId, Vec<u8>>,
    /// How keyed state is split into key groups.
    pub key_groups: KeyGroupLayout,
    /// Free user metadata, stored as is.
    pub user: BTreeMap<String, String>,
    /// When set, commit fails with [`StoreError::PartsMismatch`] unless the
    /// written parts are exactly this set. The coordinator knows which
    /// subtasks exist; this catches a part that was never written.
    pub expected_parts: Option<BTreeSet<PartId>>,
}

impl Default for CommitRequest {
    fn default() -> Self {
        Self {
            created_unix_ms: now_unix_ms(),
            source_positions: BTreeMap::new(),
            key_groups: KeyGroupLayout::default(),
            user: BTreeMap::new(),
            expected_parts: None,
        }
    }
}

/// The current wall-clock time in milliseconds since the Unix epoch (0 if the
/// clock is before the epoch).
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// One entry of [`CheckpointStore::list`]: a checkpoint or savepoint whose
/// metadata is valid. Its parts have not been read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointSummary {
    /// The checkpoint's id.
    pub checkpoint: CheckpointId,
    /// Checkpoint or savepoint.
    pub kind: CheckpointKind,
    /// When it was triggered, in milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// The number of parts.
    pub part_count: usize,
    /// The sum of all part sizes.
    pub total_bytes: u64,
}

/// A checkpoint read back in full, every part verified.
#[derive(Debug)]
pub struct LoadedCheckpoint {
    /// The checkpoint's metadata.
    pub metadata: CheckpointMetadata,
    /// Every part's bytes, keyed by part id.
    pub parts: BTreeMap<PartId, Vec<u8>>,
    /// Keeps retention from deleting this checkpoint while the caller
    /// restores from it. Drop it once the restore is done.
    pub pin: CheckpointPin,
}

/// A checkpoint that loading skipped, and why.
#[derive(Debug)]
pub struct SkippedCheckpoint {
    /// The skipped checkpoint's id.
    pub checkpoint: CheckpointId,
    /// Why it was skipped (corrupt metadata, a corrupt or missing part...).
    pub reason: StoreError,
}

/// The result of [`CheckpointStore::load_latest`].
#[derive(Debug)]
pub struct LoadReport {
    /// The newest checkpoint or savepoint that loaded and verified in full,
    /// or `None` when there is none.
    pub checkpoint: Option<LoadedCheckpoint>,
    /// Newer entries that were skipped, newest first. Directories without
    /// any metadata file (checkpoints that never committed) are not listed:
    /// they do not exist.
    pub skipped: Vec<SkippedCheckpoint>,
}

/// Options of a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// How many completed checkpoints retention keeps (at least 1).
    pub retained_checkpoints: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            retained_checkpoints: DEFAULT_RETAINED_CHECKPOINTS,
        }
    }
}

/// Durable storage of checkpoints. Every method takes `&self`; parts of one
/// checkpoint may be written concurrently from several threads.
///
/// The life of a checkpoint: [`begin`](Self::begin), then
/// [`write_part`](Self::write_part) once per part (from any thread), then
/// either [`commit`](Self::commit) or [`discard`](Self::discard).
pub trait CheckpointStore: Send + Sync + fmt::Debug {
    /// The job this store holds checkpoints of.
    fn job(&self) -> &str;

    /// Starts checkpoint `checkpoint` of the given kind. Fails with
    /// [`StoreError::AlreadyExists`] if it is in progress or complete.
    /// Leftovers of an earlier attempt with the same id that never committed
    /// (for example before a crash) are removed first.
    fn begin(&self, checkpoint: CheckpointId, kind: CheckpointKind) -> Result<(), StoreError>;

    /// Writes one part of an in-progress checkpoint durably and returns its
    /// size and checksum. A part may be written once; after a retryable
    /// error it may be written again.
    fn write_part(
        &self,
        checkpoint: CheckpointId,
        part: &PartId,
        bytes: &[u8],
    ) -> Result<PartInfo, StoreError>;

    /// Writes one part as segments (see [`segment`]): its assembled bytes
    /// are the concatenation of `segments`, some of which may refer to
    /// earlier checkpoints' shared files. A savepoint is written
    /// self-contained. Fails with [`StoreError::MissingShared`] for a
    /// reference to a shared file that does not exist.
    ///
    /// The default writes the concatenation whole with
    /// [`write_part`](Self::write_part) and refuses a
    /// [`Segment::Reuse`] with [`StoreError::SegmentsUnsupported`]; a
    /// store that overrides it returns `true` from
    /// [`supports_segments`](Self::supports_segments).
    fn write_part_segments(
        &self,
        checkpoint: CheckpointId,
        part: &PartId,
        segments: &[Segment],
    ) -> Result<PartInfo, StoreError> {
        let mut bytes =
            Vec::with_capacity(usize::try_from(segment::total_len(segments)).unwrap_or(0));
        for piece in segments {
            match piece {
                Segment::Own(own) | Segment::Shared(own) => bytes.extend_from_slice(own),
                Segment::Reuse(_) => return Err(StoreError::SegmentsUnsupported),
            }
        }
        self.write_part(checkpoint, part, &bytes)
    }

    /// Whether [`write_part_segments`](Self::write_part_segments) can refer
    /// to earlier checkpoints (the built-in stores can; the default cannot).
    fn supports_segments(&self) -> bool {
        false
    }

    /// Commits an in-progress checkpoint: writes its metadata atomically and
    /// then applies retention. Once this returns `Ok`, the checkpoint
    /// survives a crash. After a retryable error the commit may be retried.
    fn commit(
        &self,
        checkpoint: CheckpointId,
        request: CommitRequest,
    ) -> Result<CheckpointMetadata, StoreError>;

    /// Removes a checkpoint that did not commit (aborted). Fails with
    /// [`StoreError::AlreadyCommitted`] for a complete one.
    fn discard(&self, checkpoint: CheckpointId) -> Result<(), StoreError>;

    /// Every checkpoint and savepoint with valid metadata, oldest first.
    fn list(&self) -> Result<Vec<CheckpointSummary>, StoreError>;

    /// Loads and verifies one complete checkpoint or savepoint.
    fn load(&self, checkpoint: CheckpointId) -> Result<LoadedCheckpoint, StoreError>;

    /// Loads the newest checkpoint or savepoint that verifies in full,
    /// skipping (with a warning) every newer one that does not.
    /// A retryable error (I/O) is returned rather than skipped, so a
    /// transient fault never silently rolls the job back.
    fn load_latest(&self) -> Result<LoadReport, StoreError>;

    /// Pins a complete checkpoint so that retention keeps it until the pin is
    /// dropped.
    fn pin(&self, checkpoint: CheckpointId) -> Result<CheckpointPin, StoreError>;

    /// [`load_latest`](Self::load_latest) among the checkpoints with an id
    /// below `before`: the job layer calls it to fall back past a
    /// checkpoint that loads but that a sink found damaged.
    ///
    /// The default lists the complete checkpoints and loads the newest
    /// one below `before` that verifies; a store should override it to
    /// report corrupt metadata as skipped too, as the built-in stores do.
    fn load_latest_before(&self, before: CheckpointId) -> Result<LoadReport, StoreError> {
        let mut skipped = Vec::new();
        let summaries = self.list()?;
        let candidates = summaries
            .iter()
            .rev()
            .filter(|summary| summary.checkpoint < before);
        for summary in candidates {
            match self.load(summary.checkpoint) {
                Ok(loaded) => {
                    return Ok(LoadReport {
                        checkpoint: Some(loaded),
                        skipped,
                    })
                }
                Err(error) if error.is_retryable() => return Err(error),
                Err(reason) => skipped.push(SkippedCheckpoint {
                    checkpoint: summary.checkpoint,
                    reason,
                }),
            }
        }
        Ok(LoadReport {
            checkpoint: None,
            skipped,
        })
    }

    /// The highest id this store holds in any form: complete, in
    /// progress, never committed, corrupt or set aside. The job layer
    /// numbers new checkpoints above it, so an id is never used twice.
    ///
    /// The default is the newest listed (complete) checkpoint; a store
    /// should override it to count the other forms too, as the built-in
    /// stores do.
    fn highest_id(&self) -> Result<Option<CheckpointId>, StoreError> {
        Ok(self.list()?.last().map(|summary| summary.checkpoint))
    }

    /// Moves a damaged checkpoint out of the way, keeping it for
    /// inspection under a name that is never listed or loaded, and
    /// returns where it went; `None` when the store has no such
    /// checkpoint or cannot move it (the default: it stays, and loading
    /// keeps skipping it).
    ///
    /// The built-in stores rename `chk-<id>` to `chk-<id>.damaged-<unix
    /// ms>` and write the reason into a `_damaged` file inside it.
    fn set_aside(
        &self,
        checkpoint: CheckpointId,
        reason: &str,
    ) -> Result<Option<PathBuf>, StoreError> {
        let _ = (checkpoint, reason);
        Ok(None)
    }

    /// The ids of the checkpoints [`set_aside`](Self::set_aside) moved
    /// away, ascending (the default: none).
    fn damaged_ids(&self) -> Result<Vec<CheckpointId>, StoreError> {
        Ok(Vec::new())
    }

    /// The directory this store keeps the job's checkpoints in, when it
    /// has one (shown when a job starts).
    fn location(&self) -> Option<&Path> {
        None
    }
}
