//! The directory-backed store shared by [`FsCheckpointStore`] and
//! [`MemoryCheckpointStore`]: the layout on disk, the order of writes and
//! fsyncs that makes a commit atomic, loading with fallback, and retention.
//!
//! It works through an [`Io`] and never touches `std::fs` itself, so the
//! same code runs on a real disk, on the simulated [`MemFs`] and under fault
//! injection. It never looks inside a part.
//!
//! # Layout
//!
//! ```text
//! <root>/job-<job>/checkpoints/chk-<id, 20 digits>/_metadata
//!                                                 /op-<operator>/<subtask>.part
//! <root>/job-<job>/savepoints/sp-<id, 20 digits>/...   (same inside)
//! <root>/job-<job>/shared/op-<operator>/<subtask>-<id, 20 digits>.shared
//! ```
//!
//! A shared file holds the [`Segment::Shared`] bytes that checkpoint `id`
//! wrote for one part; later checkpoints of the same part refer to ranges
//! of it (see [`super::segment`] and `engine/shared.rs`, which also holds
//! the rule that deletes shared files).
//!
//! Names are escaped by [`names`]. Temporary files end in `.tmp` and sit
//! next to their final name, so a rename never crosses directories.
//!
//! # Write order (why a crash never leaves a partial checkpoint)
//!
//! 1. `begin`: create `chk-n`, fsync `checkpoints/` (the directory exists).
//! 2. `write_part`: create `op-x`, write `s.part.tmp`, fsync it, rename it
//!    to `s.part` (the bytes are durable before the name points at them).
//! 3. `commit`: fsync every `op-x` and then `chk-n` (every part's name is
//!    durable), write `_metadata.tmp`, fsync it, rename it to `_metadata`,
//!    fsync `chk-n`. Only the last rename makes the checkpoint exist, and
//!    everything it refers to was durable before it.
//!    A segmented part also writes `shared/op-x/s-n.shared` the same way
//!    (temporary name, fsync, rename); commit fsyncs `shared/op-x`,
//!    `shared/` and the job directory before the metadata, so the metadata
//!    never names a shared file whose name could be lost.
//! 4. Deletion (retention, discard) removes `_metadata` and fsyncs `chk-n`
//!    first, so a crash in the middle of removing parts leaves a directory
//!    without metadata, which does not exist, never one with missing parts.
//!    Shared files are deleted after that, and only those no remaining
//!    metadata names, so a crash leaves at worst an unreferenced file,
//!    which the next deletion removes.
//!
//! [`FsCheckpointStore`]: super::FsCheckpointStore
//! [`MemoryCheckpointStore`]: super::MemoryCheckpointStore
//! [`MemFs`]: super::memory::MemFs

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

mod aside;
mod delegate;
mod delete;
mod leftovers;
mod shared;

pub(crate) use delegate::delegate_store;
pub use leftovers::Leftover;

use super::io::Io;
use super::metadata::{CheckpointMetadata, MetadataError, PartInfo, MAX_METADATA_BYTES};
use super::owner::{LockAttempt, OwnerLock};
use super::pin::{CheckpointPin, PinTable};
use super::segment::{Segment, SegmentInfo};
use super::{
    names, CheckpointId, CheckpointKind, CheckpointSummary, CommitRequest, LoadReport,
    LoadedCheckpoint, PartId, SkippedCheckpoint, StoreError, StoreOptions,
};

/// The metadata file's name inside a checkpoint directory.
pub(crate) const METADATA_FILE: &str = "_metadata";
const TEMP_SUFFIX: &str = ".tmp";
const CHECKPOINTS_DIR: &str = "checkpoints";
const SAVEPOINTS_DIR: &str = "savepoints";
const SHARED_DIR: &str = "shared";
/// The file in the job's directory whose OS lock makes one store object
/// (one process) the owner of the job's checkpoints; see
/// [`super::owner`].
pub(crate) const LOCK_FILE: &str = "_lock";

/// A part's state while its checkpoint is in progress.
#[derive(Debug)]
enum PartSlot {
    Writing,
    /// Written: its info and, for a segmented part, its segments.
    Written(PartInfo, Option<Vec<SegmentInfo>>),
}

/// A checkpoint begun by this store object and not yet committed.
#[derive(Debug)]
struct Pending {
    kind: CheckpointKind,
    dir: PathBuf,
    parts: BTreeMap<PartId, PartSlot>,
    /// The earlier shared files its parts refer to, registered before the
    /// part is written so that deleting shared files never races a write
    /// that refers to one.
    reuses: BTreeSet<(PartId, CheckpointId)>,
    committing: bool,
}

impl Pending {
    fn writes_in_flight(&self) -> usize {
        self.parts
            .values()
            .filter(|slot| matches!(slot, PartSlot::Writing))
            .count()
    }
}

/// The shared implementation; see the module documentation.
#[derive(Debug)]
pub(crate) struct Engine {
    io: Arc<dyn Io>,
    job: String,
    job_dir: PathBuf,
    checkpoints_dir: PathBuf,
    savepoints_dir: PathBuf,
    shared_dir: PathBuf,
    options: StoreOptions,
    /// One entry per begun, not yet committed or discarded checkpoint. Its
    /// size is bounded by the caller: the coordinator limits how many
    /// checkpoints run at once and discards the ones it aborts.
    pending: Mutex<BTreeMap<CheckpointId, Pending>>,
    pins: Arc<PinTable>,
    /// Serialises retention so two commits never delete the same directory.
    retention: Mutex<()>,
    /// The lock that makes this store the job directory's one owner,
    /// held while the store lives; `None` for a read-only store, which
    /// refuses every write ([`StoreError::ReadOnly`]).
    owner: Option<OwnerLock>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section below leaves its map consistent after each
    // statement, so a lock poisoned by a panicking caller is still usable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Engine {
    /// Opens (creating if needed) the store of `job` under `root`.
    pub(crate) fn open(
        io: Arc<dyn Io>,
        root: &Path,
        job: &str,
        options: StoreOptions,
    ) -> Result<Self, StoreError> {
        let mut engine = Self::unlocked(io, root, job, options)?;
        engine.create_dirs(root)?;
        // The lock comes before anything of the job is read: a second
        // process must not even set a checkpoint aside.
        engine.owner = Some(engine.take_ownership()?);
        Ok(engine)
    }

    /// Opens the store of `job` under `root` without owning it: it takes
    /// no lock, creates nothing and refuses every write, so that a tool
    /// can list and read a store a running job owns.
    pub(crate) fn open_read_only(
        io: Arc<dyn Io>,
        root: &Path,
        job: &str,
        options: StoreOptions,
    ) -> Result<Self, StoreError> {
        Self::unlocked(io, root, job, options)
    }

    fn unlocked(
        io: Arc<dyn Io>,
        root: &Path,
        job: &str,
        options: StoreOptions,
    ) -> Result<Self, StoreError> {
        if options.retained_checkpoints == 0 {
            return Err(StoreError::InvalidOptions(
                "retained_checkpoints must be at least 1".to_string(),
            ));
        }
        let job_dir = root.join(names::job_dir_name(job)?);
        Ok(Self {
            checkpoints_dir: job_dir.join(CHECKPOINTS_DIR),
            savepoints_dir: job_dir.join(SAVEPOINTS_DIR),
            shared_dir: job_dir.join(SHARED_DIR),
            job_dir,
            io,
            job: job.to_string(),
            options,
            pending: Mutex::new(BTreeMap::new()),
            pins: Arc::new(PinTable::default()),
            retention: Mutex::new(()),
            owner: None,
        })
    }

    fn take_ownership(&self) -> Result<OwnerLock, StoreError> {
        let path = self.job_dir.join(LOCK_FILE);
        match self.io.try_lock_owner(&path) {
            Ok(LockAttempt::Acquired(lock)) => Ok(lock),
            Ok(LockAttempt::Refused { owner }) => Err(StoreError::StoreInUse {
                dir: self.job_dir.clone(),
                owner,
            }),
            Err(error) => Err(StoreError::io("lock", &path, error)),
        }
    }

    /// Refuses `operation` on a read-only store.
    pub(crate) fn check_writable(&self, operation: &'static str) -> Result<(), StoreError> {
        match self.owner {
            Some(_) => Ok(()),
            None => Err(StoreError::ReadOnly {
                dir: self.job_dir.clone(),
                operation,
            }),
        }
    }

    fn create_dirs(&self, root: &Path) -> Result<(), StoreError> {
        for dir in [&self.checkpoints_dir, &self.savepoints_dir] {
            self.io
                .create_dir_all(dir)
                .map_err(|error| StoreError::io("create_dir_all", dir, error))?;
        }
        self.sync_dir(&self.job_dir)?;
        self.sync_dir(root)
    }

    pub(crate) fn job(&self) -> &str {
        &self.job
    }

    pub(crate) fn job_dir(&self) -> &Path {
        &self.job_dir
    }

    /// The directory checkpoint `checkpoint` of `kind` lives in.
    pub(crate) fn entry_dir(&self, checkpoint: CheckpointId, kind: CheckpointKind) -> PathBuf {
        match kind {
            CheckpointKind::Checkpoint => {
                self.checkpoints_dir.join(format!("chk-{checkpoint:020}"))
            }
            CheckpointKind::Savepoint => self.savepoints_dir.join(format!("sp-{checkpoint:020}")),
        }
    }

    // ----- begin / write / commit / discard -----

    pub(crate) fn begin(
        &self,
        checkpoint: CheckpointId,
        kind: CheckpointKind,
    ) -> Result<(), StoreError> {
        self.check_writable("begin")?;
        // The lock is held across the I/O of `begin` (a few small
        // operations) so two callers cannot begin the same id at once.
        let mut pending = lock(&self.pending);
        if pending.contains_key(&checkpoint) {
            return Err(StoreError::AlreadyExists(checkpoint));
        }
        for existing_kind in [CheckpointKind::Checkpoint, CheckpointKind::Savepoint] {
            let dir = self.entry_dir(checkpoint, existing_kind);
            match read_metadata(self.io.as_ref(), &dir, Some((checkpoint, &self.job))) {
                Ok(Some(_)) => return Err(StoreError::AlreadyExists(checkpoint)),
                Ok(None) => {}
                Err(error) if error.is_corruption() => {
                    tracing::warn!(checkpoint, %error, "replacing a corrupt checkpoint with the same id");
                }
                Err(error) => return Err(error),
            }
            if self.exists(&dir)? {
                self.delete_dir(&dir)?;
            }
        }
        let dir = self.entry_dir(checkpoint, kind);
        self.io
            .create_dir_all(&dir)
            .map_err(|error| StoreError::io("create_dir_all", &dir, error))?;
        self.sync_dir(parent(&dir))?;
        pending.insert(
            checkpoint,
            Pending {
                kind,
                dir,
                parts: BTreeMap::new(),
                reuses: BTreeSet::new(),
                committing: false,
            },
        );
        Ok(())
    }

    pub(crate) fn write_part(
        &self,
        checkpoint: CheckpointId,
        part: &PartId,
        bytes: &[u8],
    ) -> Result<PartInfo, StoreError> {
        self.write_slot(checkpoint, part, &[], |dir, _| {
            self.write_part_file(dir, part.subtask, bytes)?;
            Ok((PartInfo::of(part.clone(), bytes), None))
        })
    }

    /// Writes one part as segments (see [`super::segment`]): a savepoint
    /// self-contained, a checkpoint with its own file, its shared file and
    /// references to earlier shared files.
    pub(crate) fn write_part_segments(
        &self,
        checkpoint: CheckpointId,
        part: &PartId,
        segments: &[Segment],
    ) -> Result<PartInfo, StoreError> {
        let reuses: Vec<CheckpointId> = segments
            .iter()
            .filter_map(|segment| match segment {
                Segment::Reuse(range) => Some(range.checkpoint),
                _ => None,
            })
            .collect();
        self.write_slot(checkpoint, part, &reuses, |dir, kind| match kind {
            CheckpointKind::Savepoint => {
                let bytes = self.self_contained(checkpoint, part, segments)?;
                self.write_part_file(dir, part.subtask, &bytes)?;
                Ok((PartInfo::of(part.clone(), &bytes), None))
            }
            CheckpointKind::Checkpoint => self.write_segmented(checkpoint, dir, part, segments),
        })
    }

    /// Registers `part` of `checkpoint` as being written (with the shared
    /// files it refers to), runs `write` without holding any lock, and
    /// records what it wrote.
    fn write_slot(
        &self,
        checkpoint: CheckpointId,
        part: &PartId,
        reuses: &[CheckpointId],
        write: impl FnOnce(
            &Path,
            CheckpointKind,
        ) -> Result<(PartInfo, Option<Vec<SegmentInfo>>), StoreError>,
    ) -> Result<PartInfo, StoreError> {
        let operator_dir = names::operator_dir_name(&part.operator)?;
        let (dir, kind) = {
            let mut pending = lock(&self.pending);
            let entry = pending
                .get_mut(&checkpoint)
                .filter(|entry| !entry.committing)
                .ok_or(StoreError::NotInProgress(checkpoint))?;
            if entry.parts.contains_key(part) {
                return Err(StoreError::DuplicatePart {
                    checkpoint,
                    part: part.clone(),
                });
            }
            entry.parts.insert(part.clone(), PartSlot::Writing);
            entry
                .reuses
                .extend(reuses.iter().map(|&shared| (part.clone(), shared)));
            (entry.dir.join(operator_dir), entry.kind)
        };
        // The bytes are written without holding any lock, so parts of one
        // checkpoint are written in parallel.
        let result = write(&dir, kind);
        let mut pending = lock(&self.pending);
        let slot = pending
            .get_mut(&checkpoint)
            .and_then(|entry| entry.parts.get_mut(part));
        match (result, slot) {
            (Ok((info, segments)), Some(slot)) => {
                *slot = PartSlot::Written(info.clone(), segments);
                Ok(info)
            }
            (Err(error), Some(_)) => {
                if let Some(entry) = pending.get_mut(&checkpoint) {
                    entry.parts.remove(part);
                }
                Err(error)
            }
            // Discard refuses while writes are in flight, so the slot is
            // always still there; this arm only guards that invariant.
            (result, None) => result.and(Err(StoreError::NotInProgress(checkpoint))),
        }
    }

    fn write_part_file(&self, dir: &Path, subtask: u32, bytes: &[u8]) -> Result<(), StoreError> {
        self.io
            .create_dir_all(dir)
            .map_err(|error| StoreError::io("create_dir_all", dir, error))?;
        self.write_durably(&dir.join(part_file_name(subtask)), bytes)
    }

    pub(crate) fn commit(
        &self,
        checkpoint: CheckpointId,
        request: CommitRequest,
    ) -> Result<CheckpointMetadata, StoreError> {
        let (kind, dir, parts, segments) =
            self.start_commit(checkpoint, request.expected_parts.as_ref())?;
        let metadata = CheckpointMetadata {
            job: self.job.clone(),
            checkpoint,
            kind,
            created_unix_ms: request.created_unix_ms,
            parts,
            source_positions: request.source_positions,
            key_groups: request.key_groups,
            user: request.user,
            segments,
        };
        let result = self.write_metadata(&dir, &metadata);
        let mut pending = lock(&self.pending);
        if let Err(error) = result {
            // The checkpoint stays pending so the commit can be retried.
            if let Some(entry) = pending.get_mut(&checkpoint) {
                entry.committing = false;
            }
            return Err(error);
        }
        pending.remove(&checkpoint);
        drop(pending);
        if kind == CheckpointKind::Checkpoint {
            // The checkpoint is durable whatever retention does; a failure
            // to delete old ones is logged and retried after the next
            // commit.
            if let Err(error) = self.apply_retention() {
                tracing::warn!(checkpoint, %error, "retention failed after commit");
            }
        }
        Ok(metadata)
    }

    /// Checks that `checkpoint` can commit, marks it committing and returns
    /// its kind, directory, parts and the segments of its segmented parts.
    #[allow(clippy::type_complexity)]
    fn start_commit(
        &self,
        checkpoint: CheckpointId,
        expected: Option<&BTreeSet<PartId>>,
    ) -> Result<
        (
            CheckpointKind,
            PathBuf,
            Vec<PartInfo>,
            BTreeMap<PartId, Vec<SegmentInfo>>,
        ),
        StoreError,
    > {
        let mut pending = lock(&self.pending);
        let entry = pending
            .get_mut(&checkpoint)
            .filter(|entry| !entry.committing)
            .ok_or(StoreError::NotInProgress(checkpoint))?;
        let count = entry.writes_in_flight();
        if count > 0 {
            return Err(StoreError::PartsInFlight { checkpoint, count });
        }
        if let Some(expected) = expected {
            check_expected(checkpoint, expected, entry.parts.keys())?;
        }
        let mut parts = Vec::with_capacity(entry.parts.len());
        let mut segments = BTreeMap::new();
        for slot in entry.parts.values() {
            if let PartSlot::Written(info, part_segments) = slot {
                parts.push(info.clone());
                if let Some(part_segments) = part_segments {
                    segments.insert(info.part.clone(), part_segments.clone());
                }
            }
        }
        entry.committing = true;
        Ok((entry.kind, entry.dir.clone(), parts, segments))
    }

    fn write_metadata(&self, dir: &Path, metadata: &CheckpointMetadata) -> Result<(), StoreError> {
        let bytes = metadata.encode().map_err(|reason| StoreError::Encode {
            checkpoint: metadata.checkpoint,
            reason,
        })?;
        let operator_dirs: BTreeSet<String> = metadata
            .parts
            .iter()
            .map(|info| names::operator_dir_name(&info.part.operator))
            .collect::<Result<_, _>>()?;
        for operator_dir in &operator_dirs {
            self.sync_dir(&dir.join(operator_dir))?;
        }
        self.sync_dir(dir)?;
        self.sync_shared_dirs(metadata)?;
        self.write_durably(&dir.join(METADATA_FILE), &bytes)
    }

    pub(crate) fn discard(&self, checkpoint: CheckpointId) -> Result<(), StoreError> {
        self.check_writable("discard")?;
        let removed = {
            let mut pending = lock(&self.pending);
            if let Some(entry) = pending.get(&checkpoint) {
                let count = entry.writes_in_flight();
                if count > 0 || entry.committing {
                    return Err(StoreError::PartsInFlight {
                        checkpoint,
                        count: count.max(1),
                    });
                }
            }
            pending.remove(&checkpoint)
        };
        if let Some(entry) = removed {
            self.delete_dir(&entry.dir)?;
            return self.collect_shared_serial();
        }
        let mut found = false;
        for kind in [CheckpointKind::Checkpoint, CheckpointKind::Savepoint] {
            let dir = self.entry_dir(checkpoint, kind);
            match read_metadata(self.io.as_ref(), &dir, Some((checkpoint, &self.job))) {
                Ok(Some(_)) => return Err(StoreError::AlreadyCommitted(checkpoint)),
                Ok(None) | Err(StoreError::CorruptMetadata { .. }) => {}
                Err(error) => return Err(error),
            }
            if self.exists(&dir)? {
                self.delete_dir(&dir)?;
                found = true;
            }
        }
        if found {
            self.collect_shared_serial()
        } else {
            Err(StoreError::NotInProgress(checkpoint))
        }
    }

    // ----- listing and loading -----

    /// Every directory that looks like a checkpoint or savepoint, as
    /// `(id, kind, dir)`, sorted by id.
    fn entries(&self) -> Result<Vec<(CheckpointId, CheckpointKind, PathBuf)>, StoreError> {
        let mut entries = Vec::new();
        for (kind, dir, prefix) in [
            (CheckpointKind::Checkpoint, &self.checkpoints_dir, "chk-"),
            (CheckpointKind::Savepoint, &self.savepoints_dir, "sp-"),
        ] {
            let listing = self
                .io
                .list_dir(dir)
                .map_err(|error| StoreError::io("list_dir", dir, error))?;
            for entry in listing.into_iter().filter(|entry| entry.is_dir) {
                if let Some(id) = parse_entry_name(&entry.name, prefix) {
                    entries.push((id, kind, dir.join(&entry.name)));
                }
            }
        }
        entries.sort();
        Ok(entries)
    }

    pub(crate) fn list(&self) -> Result<Vec<CheckpointSummary>, StoreError> {
        let mut summaries = Vec::new();
        for (checkpoint, _, dir) in self.entries()? {
            match read_metadata(self.io.as_ref(), &dir, Some((checkpoint, &self.job))) {
                Ok(Some(metadata)) => summaries.push(CheckpointSummary {
                    checkpoint,
                    kind: metadata.kind,
                    created_unix_ms: metadata.created_unix_ms,
                    part_count: metadata.parts.len(),
                    total_bytes: metadata.total_bytes(),
                }),
                Ok(None) => {}
                Err(error) if error.is_corruption() => {
                    tracing::debug!(checkpoint, %error, "not listing a corrupt checkpoint");
                }
                Err(error) => return Err(error),
            }
        }
        Ok(summaries)
    }

    pub(crate) fn load(&self, checkpoint: CheckpointId) -> Result<LoadedCheckpoint, StoreError> {
        let dir = self
            .entries()?
            .into_iter()
            .find(|(id, _, _)| *id == checkpoint)
            .map(|(_, _, dir)| dir)
            .ok_or(StoreError::NotFound(checkpoint))?;
        let pin = self.pins.pin(checkpoint);
        let metadata = read_metadata(self.io.as_ref(), &dir, Some((checkpoint, &self.job)))?
            .ok_or(StoreError::NotFound(checkpoint))?;
        let parts = read_parts(self.io.as_ref(), &dir, &self.shared_dir, &metadata)?;
        Ok(LoadedCheckpoint {
            metadata,
            parts,
            pin,
        })
    }

    pub(crate) fn load_latest_before(
        &self,
        before: Option<CheckpointId>,
    ) -> Result<LoadReport, StoreError> {
        let mut skipped = Vec::new();
        let below = |id: &CheckpointId| before.map_or(true, |before| *id < before);
        let candidates = self.entries()?.into_iter().rev();
        for (checkpoint, _, _) in candidates.filter(|(id, _, _)| below(id)) {
            match self.load(checkpoint) {
                Ok(loaded) => {
                    return Ok(LoadReport {
                        checkpoint: Some(loaded),
                        skipped,
                    })
                }
                Err(StoreError::NotFound(_)) => {
                    tracing::debug!(checkpoint, "ignoring a checkpoint that never committed");
                }
                Err(error) if error.is_retryable() => return Err(error),
                Err(error) => {
                    tracing::warn!(
                        checkpoint,
                        %error,
                        "skipping an invalid checkpoint; falling back to an older one"
                    );
                    skipped.push(SkippedCheckpoint {
                        checkpoint,
                        reason: error,
                    });
                }
            }
        }
        Ok(LoadReport {
            checkpoint: None,
            skipped,
        })
    }

    pub(crate) fn pin(&self, checkpoint: CheckpointId) -> Result<CheckpointPin, StoreError> {
        // Pin first, then check: retention either sees the pin or has
        // already deleted the checkpoint, which the check then reports.
        let pin = self.pins.pin(checkpoint);
        for kind in [CheckpointKind::Checkpoint, CheckpointKind::Savepoint] {
            let dir = self.entry_dir(checkpoint, kind);
            if read_metadata(self.io.as_ref(), &dir, Some((checkpoint, &self.job)))?.is_some() {
                return Ok(pin);
            }
        }
        Err(StoreError::NotFound(checkpoint))
    }

    // ----- retention -----

    /// Keeps the newest `retained_checkpoints` complete checkpoints and every
    /// pinned one; deletes older complete ones and older leftovers without
    /// valid metadata. A savepoint directory without metadata older than a
    /// complete checkpoint (a savepoint interrupted by a crash) goes as an
    /// interrupted checkpoint does; complete savepoints, and savepoints
    /// whose metadata is damaged (the user's to judge), are untouched, as
    /// are checkpoints and savepoints in progress.
    fn apply_retention(&self) -> Result<(), StoreError> {
        let _serial = lock(&self.retention);
        let pending: BTreeSet<CheckpointId> = lock(&self.pending).keys().copied().collect();
        let mut complete_seen = 0usize;
        let mut doomed = Vec::new();
        for (checkpoint, kind, dir) in self.entries()?.into_iter().rev() {
            if pending.contains(&checkpoint) {
                continue;
            }
            if kind == CheckpointKind::Savepoint {
                let never_committed = complete_seen > 0
                    && read_metadata(self.io.as_ref(), &dir, Some((checkpoint, &self.job)))
                        .is_ok_and(|metadata| metadata.is_none());
                if never_committed {
                    doomed.push((checkpoint, dir));
                }
                continue;
            }
            match read_metadata(self.io.as_ref(), &dir, Some((checkpoint, &self.job))) {
                Ok(Some(_)) => {
                    complete_seen += 1;
                    if complete_seen > self.options.retained_checkpoints {
                        doomed.push((checkpoint, dir));
                    }
                }
                // Leftovers (never committed, or corrupt) older than a
                // complete checkpoint can never be restored. Checkpoints of
                // this store still in progress were skipped above; ids are
                // expected to grow, so a checkpoint begun after the snapshot
                // of `pending` is newer than every complete one.
                Ok(None) | Err(StoreError::CorruptMetadata { .. }) if complete_seen > 0 => {
                    doomed.push((checkpoint, dir));
                }
                Ok(None) | Err(StoreError::CorruptMetadata { .. }) => {}
                Err(error) => return Err(error),
            }
        }
        for (checkpoint, dir) in doomed {
            let pins = self.pins.lock();
            if pins.contains_key(&checkpoint) {
                tracing::debug!(checkpoint, "retention keeps a pinned checkpoint");
                continue;
            }
            self.delete_dir(&dir)?;
            drop(pins);
        }
        self.collect_shared()
    }

    // ----- I/O helpers -----

    /// Writes `path` as a temporary file, fsyncs it and renames it into
    /// place. The containing directory is fsynced by the caller when the
    /// name has to be durable.
    fn write_durably(&self, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
        self.write_pieces_durably(path, &[bytes])
    }

    /// [`Self::write_durably`] of the concatenation of `pieces`, without
    /// building it.
    fn write_pieces_durably(&self, path: &Path, pieces: &[&[u8]]) -> Result<(), StoreError> {
        let is_metadata = path.file_name().is_some_and(|name| name == METADATA_FILE);
        if is_metadata {
            if let Some(result) = self.io.publish_metadata(path, &pieces.concat()) {
                return result.map_err(|error| StoreError::io("publish_metadata", path, error));
            }
        }
        if self.io.atomic_writes() {
            return self
                .io
                .write_file_pieces(path, pieces)
                .map_err(|error| StoreError::io("write_file", path, error));
        }
        let temp = temp_path(path);
        self.io
            .write_file_pieces(&temp, pieces)
            .map_err(|error| StoreError::io("write_file", &temp, error))?;
        self.io
            .sync_file(&temp)
            .map_err(|error| StoreError::io("sync_file", &temp, error))?;
        self.io
            .rename(&temp, path)
            .map_err(|error| StoreError::io("rename", &temp, error))?;
        if is_metadata {
            self.sync_dir(parent(path))?;
        }
        Ok(())
    }

    /// Deletes a checkpoint directory so that no crash point leaves a
    /// directory with metadata but missing parts: metadata goes first.
    fn delete_dir(&self, dir: &Path) -> Result<(), StoreError> {
        let metadata = dir.join(METADATA_FILE);
        match self.io.remove_file(&metadata) {
            Ok(()) => self.sync_dir(dir)?,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(StoreError::io("remove_file", &metadata, error)),
        }
        match self.io.remove_dir_all(dir) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(StoreError::io("remove_dir_all", dir, error)),
        }
        self.sync_dir(parent(dir))
    }

    fn sync_dir(&self, dir: &Path) -> Result<(), StoreError> {
        self.io
            .sync_dir(dir)
            .map_err(|error| StoreError::io("sync_dir", dir, error))
    }

    fn exists(&self, dir: &Path) -> Result<bool, StoreError> {
        self.io
            .dir_exists(dir)
            .map_err(|error| StoreError::io("list_dir", dir, error))
    }
}

fn check_expected<'a>(
    checkpoint: CheckpointId,
    expected: &BTreeSet<PartId>,
    written: impl Iterator<Item = &'a PartId>,
) -> Result<(), StoreError> {
    let written: BTreeSet<&PartId> = written.collect();
    let missing: Vec<PartId> = expected
        .iter()
        .filter(|part| !written.contains(part))
        .cloned()
        .collect();
    let unexpected: Vec<PartId> = written
        .into_iter()
        .filter(|part| !expected.contains(*part))
        .cloned()
        .collect();
    if missing.is_empty() && unexpected.is_empty() {
        Ok(())
    } else {
        Err(StoreError::PartsMismatch {
            checkpoint,
            missing,
            unexpected,
        })
    }
}

/// Reads and checks `dir/_metadata`. `Ok(None)` when there is no metadata
/// file (the checkpoint never committed). With `expect`, the metadata must
/// name that checkpoint id and job.
pub(crate) fn read_metadata(
    io: &dyn Io,
    dir: &Path,
    expect: Option<(CheckpointId, &str)>,
) -> Result<Option<CheckpointMetadata>, StoreError> {
    let path = dir.join(METADATA_FILE);
    let bytes = match io.read_file(&path, MAX_METADATA_BYTES + metadata_header_len()) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(StoreError::io("read_file", path, error)),
    };
    let corrupt = |reason: String| StoreError::CorruptMetadata {
        checkpoint: expect.map(|(checkpoint, _)| checkpoint),
        path: path.clone(),
        reason,
    };
    let metadata = CheckpointMetadata::decode_typed(&bytes).map_err(|error| match error {
        MetadataError::UnsupportedVersion { version } => StoreError::UnsupportedFormat {
            checkpoint: expect.map(|(checkpoint, _)| checkpoint),
            path: path.clone(),
            version,
        },
        MetadataError::Corrupt(reason) => corrupt(reason),
    })?;
    if let Some((checkpoint, job)) = expect {
        if metadata.checkpoint != checkpoint || metadata.job != job {
            return Err(corrupt(format!(
                "it describes checkpoint {} of job {:?}, expected {checkpoint} of {job:?}",
                metadata.checkpoint, metadata.job
            )));
        }
    }
    Ok(Some(metadata))
}

fn metadata_header_len() -> u64 {
    super::metadata::HEADER_LEN as u64
}

/// Reads every part listed in `metadata` from `dir` (a segmented part also
/// from the shared files under `shared_dir`) and checks its size and
/// checksum. The first bad part makes the whole checkpoint invalid.
pub(crate) fn read_parts(
    io: &dyn Io,
    dir: &Path,
    shared_dir: &Path,
    metadata: &CheckpointMetadata,
) -> Result<BTreeMap<PartId, Vec<u8>>, StoreError> {
    let mut parts = BTreeMap::new();
    for info in &metadata.parts {
        if let Some(segments) = metadata.segments.get(&info.part) {
            let bytes = shared::read_segmented(io, dir, shared_dir, metadata, info, segments)?;
            parts.insert(info.part.clone(), bytes);
            continue;
        }
        let path = dir
            .join(names::operator_dir_name(&info.part.operator)?)
            .join(part_file_name(info.part.subtask));
        let corrupt = |reason: String| StoreError::CorruptPart {
            checkpoint: metadata.checkpoint,
            part: info.part.clone(),
            reason: format!("{}: {reason}", path.display()),
        };
        // One byte more than expected, to notice a file that grew.
        let bytes = match io.read_file(&path, info.size_bytes.saturating_add(1)) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Err(corrupt("the file is missing".to_string()))
            }
            Err(error) => return Err(StoreError::io("read_file", path, error)),
        };
        info.verify(&bytes).map_err(corrupt)?;
        parts.insert(info.part.clone(), bytes);
    }
    Ok(parts)
}

pub(crate) fn part_file_name(subtask: u32) -> String {
    format!("{subtask}.part")
}

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(TEMP_SUFFIX);
    path.with_file_name(name)
}

fn parent(path: &Path) -> &Path {
    path.parent().unwrap_or(path)
}

fn parse_entry_name(name: &str, prefix: &str) -> Option<CheckpointId> {
    let digits = name.strip_prefix(prefix)?;
    if digits.len() == 20 && digits.bytes().all(|byte| byte.is_ascii_digit()) {
        digits.parse().ok()
    } else {
        None
    }
}
