//! The engine's shared files, the storage side of incremental checkpoints:
//! writing a segmented part (its own file, its shared file, references to
//! earlier shared files), reading one back assembled and verified, making
//! a savepoint self-contained, and deleting the shared files nothing
//! refers to. It never decides what is shared; the caller's segments do.
//!
//! # Which shared files exist (the retention rule)
//!
//! A shared file `shared/op-x/s-k.shared` is kept while the metadata of a
//! complete checkpoint in `checkpoints/` names it, or checkpoint `k` is in
//! progress in this store object, or a checkpoint in progress registered a
//! reference to it. Every other shared file is deleted after each commit
//! (with retention), discard and delete. Metadata is read, never guessed:
//! a checkpoint with corrupt metadata or set aside as damaged keeps
//! nothing (it cannot be restored), so its own shared files go once no
//! valid checkpoint refers to them.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use super::{lock, names, parent, part_file_name, read_metadata, Engine, TEMP_SUFFIX};
use crate::storage::io::Io;
use crate::storage::metadata::{CheckpointMetadata, PartInfo};
use crate::storage::segment::{combined_crc32, Segment, SegmentInfo, SegmentSource, SharedRange};
use crate::storage::{CheckpointId, CheckpointKind, PartId, StoreError};

const SHARED_SUFFIX: &str = ".shared";

/// The name of part `subtask`'s shared file written by `checkpoint`.
fn shared_file_name(subtask: u32, checkpoint: CheckpointId) -> String {
    format!("{subtask}-{checkpoint:020}{SHARED_SUFFIX}")
}

/// `(subtask, checkpoint)` of a shared file's name, `None` for any other
/// name (temporary files included).
pub(super) fn parse_shared_file_name(name: &str) -> Option<(u32, CheckpointId)> {
    let stem = name.strip_suffix(SHARED_SUFFIX)?;
    let (subtask, digits) = stem.split_once('-')?;
    if digits.len() != 20 || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    Some((subtask.parse().ok()?, digits.parse().ok()?))
}

/// Where part `part`'s shared file of `checkpoint` lives under `shared_dir`.
pub(crate) fn shared_path(
    shared_dir: &Path,
    part: &PartId,
    checkpoint: CheckpointId,
) -> Result<PathBuf, StoreError> {
    Ok(shared_dir
        .join(names::operator_dir_name(&part.operator)?)
        .join(shared_file_name(part.subtask, checkpoint)))
}

impl Engine {
    /// Writes a segmented part of checkpoint `checkpoint` into `dir` (its
    /// operator directory) and the part's shared file, and returns the
    /// assembled part's info and its segments. A part with nothing shared
    /// and nothing reused is written plain, as [`Engine::write_part`] does.
    pub(super) fn write_segmented(
        &self,
        checkpoint: CheckpointId,
        dir: &Path,
        part: &PartId,
        segments: &[Segment],
    ) -> Result<(PartInfo, Option<Vec<SegmentInfo>>), StoreError> {
        // The shared file is written as the segments' own slices, one
        // after the other: copying a large part into one buffer first
        // cost a pass over it and its size again in memory.
        // The own file is sized once: growing it by doubling copied a
        // large part again (a tenth of the spilling backend's checkpoint
        // writer at 10 M keys: BENCHMARKS.md at 07a44e5, "Fewer whole reads").
        let own_len = segments
            .iter()
            .map(|segment| match segment {
                Segment::Own(bytes) => bytes.len(),
                _ => 0,
            })
            .sum();
        let (mut own, mut shared) = (Vec::with_capacity(own_len), SharedPieces::default());
        let mut infos = Vec::with_capacity(segments.len());
        let mut referenced = BTreeSet::new();
        for segment in segments {
            let info = match segment {
                Segment::Own(bytes) => append(&mut own, bytes, SegmentSource::Own),
                Segment::Shared(bytes) => shared.push(bytes, SegmentSource::Shared(checkpoint)),
                Segment::Reuse(range) => {
                    self.check_reuse(checkpoint, part, range)?;
                    referenced.insert(range.checkpoint);
                    SegmentInfo {
                        source: SegmentSource::Shared(range.checkpoint),
                        offset: range.offset,
                        len: range.len,
                        crc32: range.crc32,
                    }
                }
            };
            infos.push(info);
        }
        for shared_checkpoint in referenced {
            let path = shared_path(&self.shared_dir, part, shared_checkpoint)?;
            if !self.file_exists(&path)? {
                return Err(StoreError::MissingShared {
                    checkpoint,
                    part: part.clone(),
                    shared: shared_checkpoint,
                });
            }
        }
        self.write_part_file(dir, part.subtask, &own)?;
        let plain = infos.iter().all(|info| info.source == SegmentSource::Own);
        if plain {
            return Ok((PartInfo::of(part.clone(), &own), None));
        }
        if !shared.is_empty() {
            let path = shared_path(&self.shared_dir, part, checkpoint)?;
            let shared_operator_dir = parent(&path);
            self.io
                .create_dir_all(shared_operator_dir)
                .map_err(|error| StoreError::io("create_dir_all", shared_operator_dir, error))?;
            self.write_pieces_durably(&path, &shared.pieces)?;
        }
        let info = PartInfo {
            part: part.clone(),
            size_bytes: infos.iter().map(|info| info.len).sum(),
            crc32: combined_crc32(infos.iter().map(|info| (info.crc32, info.len))),
        };
        Ok((info, Some(infos)))
    }

    /// A reference must name an earlier checkpoint's shared file.
    fn check_reuse(
        &self,
        checkpoint: CheckpointId,
        part: &PartId,
        range: &SharedRange,
    ) -> Result<(), StoreError> {
        if range.checkpoint >= checkpoint {
            return Err(StoreError::MissingShared {
                checkpoint,
                part: part.clone(),
                shared: range.checkpoint,
            });
        }
        Ok(())
    }

    /// The assembled bytes of a part written as `segments` for a
    /// savepoint: referenced ranges are read (and verified) from their
    /// shared files, so the savepoint refers to nothing outside itself.
    pub(super) fn self_contained(
        &self,
        checkpoint: CheckpointId,
        part: &PartId,
        segments: &[Segment],
    ) -> Result<Vec<u8>, StoreError> {
        let mut out = Vec::new();
        let mut files = SharedFiles::default();
        for segment in segments {
            match segment {
                Segment::Own(bytes) | Segment::Shared(bytes) => out.extend_from_slice(bytes),
                Segment::Reuse(range) => {
                    self.check_reuse(checkpoint, part, range)?;
                    let info = SegmentInfo {
                        source: SegmentSource::Shared(range.checkpoint),
                        offset: range.offset,
                        len: range.len,
                        crc32: range.crc32,
                    };
                    let bytes = files.range(
                        self.io.as_ref(),
                        &self.shared_dir,
                        checkpoint,
                        part,
                        &info,
                        u64::MAX,
                    )?;
                    out.extend_from_slice(bytes);
                }
            }
        }
        Ok(out)
    }

    /// Makes the names of the shared files `metadata`'s checkpoint wrote
    /// durable: their operator directories, `shared/` and the job
    /// directory are fsynced.
    pub(super) fn sync_shared_dirs(&self, metadata: &CheckpointMetadata) -> Result<(), StoreError> {
        let mut operator_dirs = BTreeSet::new();
        for (part, shared) in metadata.shared_files() {
            if shared == metadata.checkpoint {
                operator_dirs.insert(names::operator_dir_name(&part.operator)?);
            }
        }
        if operator_dirs.is_empty() {
            return Ok(());
        }
        for operator_dir in &operator_dirs {
            self.sync_dir(&self.shared_dir.join(operator_dir))?;
        }
        self.sync_dir(&self.shared_dir)?;
        self.sync_dir(&self.job_dir)
    }

    /// [`Engine::collect_shared`] for callers that do not hold the
    /// retention lock.
    pub(super) fn collect_shared_serial(&self) -> Result<(), StoreError> {
        let _serial = lock(&self.retention);
        self.collect_shared()
    }

    /// Deletes every shared file the retention rule (module docs) does
    /// not keep. The caller holds the retention lock; the pending lock is
    /// held throughout, so a part cannot register a reference between the
    /// reading of what is kept and the deletion.
    pub(super) fn collect_shared(&self) -> Result<(), StoreError> {
        let pending = lock(&self.pending);
        let mut keep: BTreeSet<(PartId, CheckpointId)> = pending
            .values()
            .flat_map(|entry| entry.reuses.iter().cloned())
            .collect();
        for (checkpoint, kind, dir) in self.entries()? {
            if kind != CheckpointKind::Checkpoint {
                continue;
            }
            match read_metadata(self.io.as_ref(), &dir, Some((checkpoint, &self.job))) {
                Ok(Some(metadata)) => keep.extend(
                    metadata
                        .shared_files()
                        .map(|(part, shared)| (part.clone(), shared)),
                ),
                Ok(None) => {}
                Err(error) if error.is_corruption() => {}
                Err(error) => return Err(error),
            }
        }
        let mut removed_from = BTreeSet::new();
        for file in self.shared_files()? {
            if pending.contains_key(&file.shared) || keep.contains(&(file.part, file.shared)) {
                continue;
            }
            match self.io.remove_file(&file.path) {
                Ok(()) => {
                    removed_from.insert(parent(&file.path).to_path_buf());
                }
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => return Err(StoreError::io("remove_file", &file.path, error)),
            }
        }
        for dir in &removed_from {
            self.sync_dir(dir)?;
        }
        Ok(())
    }

    /// Every file under `shared/` whose name a shared file (or its
    /// temporary) has, with what the name says; none when `shared/` does
    /// not exist. Unknown directories and files are left alone (and
    /// logged at debug level). Retention deletes from this listing and
    /// `leftovers` reports from it.
    pub(super) fn shared_files(&self) -> Result<Vec<SharedFile>, StoreError> {
        let operator_dirs = match self.io.list_dir(&self.shared_dir) {
            Ok(listing) => listing,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(StoreError::io("list_dir", &self.shared_dir, error)),
        };
        let mut files = Vec::new();
        for operator_entry in operator_dirs.into_iter().filter(|entry| entry.is_dir) {
            let Some(operator) = operator_entry
                .name
                .strip_prefix("op-")
                .and_then(names::decode_component)
            else {
                tracing::debug!(name = %operator_entry.name, "leaving an unknown directory in shared/");
                continue;
            };
            let operator_dir = self.shared_dir.join(&operator_entry.name);
            let listing = self
                .io
                .list_dir(&operator_dir)
                .map_err(|error| StoreError::io("list_dir", &operator_dir, error))?;
            for file in listing.into_iter().filter(|entry| !entry.is_dir) {
                let temporary = file.name.ends_with(TEMP_SUFFIX);
                let name = file.name.strip_suffix(TEMP_SUFFIX).unwrap_or(&file.name);
                let Some((subtask, shared)) = parse_shared_file_name(name) else {
                    tracing::debug!(name = %file.name, "leaving an unknown file in shared/");
                    continue;
                };
                files.push(SharedFile {
                    path: operator_dir.join(&file.name),
                    part: PartId::new(operator.clone(), subtask),
                    shared,
                    temporary,
                });
            }
        }
        Ok(files)
    }

    fn file_exists(&self, path: &Path) -> Result<bool, StoreError> {
        let dir = parent(path);
        let name = path.file_name().unwrap_or_default();
        match self.io.list_dir(dir) {
            Ok(listing) => Ok(listing
                .iter()
                .any(|entry| !entry.is_dir && std::ffi::OsStr::new(&entry.name) == name)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(error) => Err(StoreError::io("list_dir", dir, error)),
        }
    }
}

/// One file under `shared/`, as [`Engine::shared_files`] lists it.
pub(super) struct SharedFile {
    /// Where it is.
    pub(super) path: PathBuf,
    /// The part whose bytes it holds.
    pub(super) part: PartId,
    /// The checkpoint that wrote it.
    pub(super) shared: CheckpointId,
    /// Whether it is a temporary (`.tmp`) name, never committed.
    pub(super) temporary: bool,
}

/// Appends `bytes` to `file` and describes them as a segment of it.
/// The pieces of a shared file being written, and its length so far.
#[derive(Default)]
struct SharedPieces<'a> {
    pieces: Vec<&'a [u8]>,
    len: u64,
}

impl<'a> SharedPieces<'a> {
    /// No bytes (zero-length pieces write no file, as before).
    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `bytes` and says where they land.
    fn push(&mut self, bytes: &'a [u8], source: SegmentSource) -> SegmentInfo {
        let info = SegmentInfo {
            source,
            offset: self.len,
            len: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
        };
        self.pieces.push(bytes);
        self.len += bytes.len() as u64;
        info
    }
}

fn append(file: &mut Vec<u8>, bytes: &[u8], source: SegmentSource) -> SegmentInfo {
    let info = SegmentInfo {
        source,
        offset: file.len() as u64,
        len: bytes.len() as u64,
        crc32: crc32fast::hash(bytes),
    };
    file.extend_from_slice(bytes);
    info
}

/// Shared files read while assembling parts, each read once.
#[derive(Default)]
struct SharedFiles {
    files: BTreeMap<CheckpointId, Vec<u8>>,
}

impl SharedFiles {
    /// The verified bytes of `segment`, a range of `part`'s shared file,
    /// reading the file (at most `limit_bytes` of it) the first time.
    fn range(
        &mut self,
        io: &dyn Io,
        shared_dir: &Path,
        checkpoint: CheckpointId,
        part: &PartId,
        segment: &SegmentInfo,
        limit_bytes: u64,
    ) -> Result<&[u8], StoreError> {
        let Some(shared) = segment.shared_checkpoint() else {
            return Err(StoreError::CorruptPart {
                checkpoint,
                part: part.clone(),
                reason: "bug: an own segment read as shared".to_string(),
            });
        };
        let path = shared_path(shared_dir, part, shared)?;
        let corrupt = |reason: String| StoreError::CorruptPart {
            checkpoint,
            part: part.clone(),
            reason: format!(
                "shared file {} (written by checkpoint {shared}): {reason}",
                path.display()
            ),
        };
        let file = match self.files.entry(shared) {
            std::collections::btree_map::Entry::Occupied(occupied) => occupied.into_mut(),
            std::collections::btree_map::Entry::Vacant(vacant) => {
                match io.read_file(&path, limit_bytes) {
                    Ok(bytes) => vacant.insert(bytes),
                    Err(error) if error.kind() == io::ErrorKind::NotFound => {
                        return Err(corrupt("the file is missing".to_string()))
                    }
                    Err(error) => return Err(StoreError::io("read_file", path, error)),
                }
            }
        };
        slice_verified(file, segment).map_err(corrupt)
    }
}

/// The bytes of `segment` in `file`, checked against its length and CRC.
fn slice_verified<'a>(file: &'a [u8], segment: &SegmentInfo) -> Result<&'a [u8], String> {
    let end = segment.offset.checked_add(segment.len);
    let bytes = end
        .and_then(|end| file.get(usize::try_from(segment.offset).ok()?..usize::try_from(end).ok()?))
        .ok_or_else(|| {
            format!(
                "the range {}+{} ends past the file's {} bytes",
                segment.offset,
                segment.len,
                file.len()
            )
        })?;
    let crc32 = crc32fast::hash(bytes);
    if crc32 != segment.crc32 {
        return Err(format!(
            "CRC-32 of the range {}+{} is {crc32:08x}, metadata says {:08x}",
            segment.offset, segment.len, segment.crc32
        ));
    }
    Ok(bytes)
}

/// Reads a segmented part: its own file from `dir`, its shared ranges
/// from the files under `shared_dir`, each segment verified, then the
/// assembled bytes against the part's size and CRC.
pub(crate) fn read_segmented(
    io: &dyn Io,
    dir: &Path,
    shared_dir: &Path,
    metadata: &CheckpointMetadata,
    info: &PartInfo,
    segments: &[SegmentInfo],
) -> Result<Vec<u8>, StoreError> {
    let checkpoint = metadata.checkpoint;
    let part = &info.part;
    let own_path = dir
        .join(names::operator_dir_name(&part.operator)?)
        .join(part_file_name(part.subtask));
    let corrupt_own = |reason: String| StoreError::CorruptPart {
        checkpoint,
        part: part.clone(),
        reason: format!("{}: {reason}", own_path.display()),
    };
    let own_len: u64 = segments
        .iter()
        .filter(|segment| segment.source == SegmentSource::Own)
        .map(|segment| segment.len)
        .sum();
    let own = match io.read_file(&own_path, own_len.saturating_add(1)) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            return Err(corrupt_own("the file is missing".to_string()))
        }
        Err(error) => return Err(StoreError::io("read_file", own_path, error)),
    };
    if own.len() as u64 != own_len {
        return Err(corrupt_own(format!(
            "size is {} bytes, metadata says {own_len}",
            own.len()
        )));
    }
    // Each shared file is read up to the end of the last range any
    // segment takes from it, which bounds the read by the metadata.
    let mut limits: BTreeMap<CheckpointId, u64> = BTreeMap::new();
    for segment in segments {
        if let Some(shared) = segment.shared_checkpoint() {
            let end = segment.offset.saturating_add(segment.len);
            let limit = limits.entry(shared).or_default();
            *limit = (*limit).max(end);
        }
    }
    let mut files = SharedFiles::default();
    let mut out = Vec::with_capacity(usize::try_from(info.size_bytes.min(1 << 32)).unwrap_or(0));
    for segment in segments {
        match segment.shared_checkpoint() {
            None => out.extend_from_slice(slice_verified(&own, segment).map_err(corrupt_own)?),
            Some(shared) => {
                let limit = limits.get(&shared).copied().unwrap_or(0);
                out.extend_from_slice(
                    files.range(io, shared_dir, checkpoint, part, segment, limit)?,
                );
            }
        }
    }
    info.verify(&out)
        .map_err(|reason| StoreError::CorruptPart {
            checkpoint,
            part: part.clone(),
            reason: format!("assembled from its segments: {reason}"),
        })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_file_names_round_trip_and_refuse_others() {
        let name = shared_file_name(3, 42);
        assert_eq!(name, "3-00000000000000000042.shared");
        assert_eq!(parse_shared_file_name(&name), Some((3, 42)));
        assert_eq!(parse_shared_file_name("3-42.shared"), None);
        assert_eq!(parse_shared_file_name("0.part"), None);
        assert_eq!(
            parse_shared_file_name("x-00000000000000000042.shared"),
            None
        );
    }
}
