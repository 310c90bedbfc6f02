//! [`Bases`]: the contents of the spilling state's disk table as its last
//! completed snapshot saw them, kept as one sorted local file per key
//! group (together, a "base"), from which the next snapshot is built by
//! merging in the changes since ([`super::changes`]) instead of reading the
//! disk table back.
//!
//! This module owns the base files' layout, their directory, which base is
//! the newest complete one, and when a file is deleted. It never reads
//! the disk table, never builds a part and never decides what a snapshot
//! contains.
//!
//! # Why a base is right
//!
//! Snapshot `e` of a state either reads the disk table's view `e` (the
//! fallback) or merges base `e - 1` with every entry written to (or
//! deleted from) the disk table between the views `e - 1` and `e`; both
//! give the table's content at view `e`, which it writes as base `e`. A
//! key group with no change since keeps its file of base `e - 1` in base
//! `e` (the file is shared, not copied), so a snapshot rewrites only the
//! groups that changed on disk. A base is used only by the snapshot of
//! the very next epoch, and only if it was finished: a snapshot dropped
//! half-way, a restore or a change log that gave up leaves the next
//! snapshot on the fallback, which starts a new chain.
//!
//! # Layout
//!
//! One file per key group and base that wrote it, `base-<epoch>-<group>`
//! (none for an empty group), in the state's own directory beside its
//! disk table: every entry of the group, ascending by key, as the key's
//! and the value's lengths (`u32` little-endian), the key (key group
//! big-endian, then postcard) and the value (the state's payload). A file
//! is deleted when the last base (or snapshot reading one) that refers to
//! it is dropped. It is not durable, as the disk table is not: the
//! checkpoint store holds the durable copy. The directory is deleted when
//! the last holder of the [`Bases`] is dropped (the state and any snapshot
//! still being written).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::changes::EntryRef;
use super::SpillError;

/// The buffer of a base file's reader and writer: large enough that a
/// sequential pass costs few system calls, small next to a part.
const BUFFER_BYTES: usize = 256 * 1024;

/// One key group's file of a base, shared by every base that kept it;
/// deleted when the last of them is dropped.
#[derive(Debug)]
pub(crate) struct GroupFile {
    path: PathBuf,
    entries: u64,
}

impl Drop for GroupFile {
    fn drop(&mut self) {
        // A file left behind costs disk until the directory goes.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A finished base: each key group's file, if the group had entries.
#[derive(Debug, Default)]
pub(crate) struct Base {
    groups: BTreeMap<u32, Arc<GroupFile>>,
}

impl Base {
    /// The file of `key_group`, `None` if the group was empty.
    pub(crate) fn file(&self, key_group: u32) -> Option<&Arc<GroupFile>> {
        self.groups.get(&key_group)
    }

    /// A reader of `key_group`'s entries (none for an empty group). The
    /// file stays readable even if every base drops it meanwhile (it is
    /// open, and only unlinked).
    pub(crate) fn reader(&self, key_group: u32) -> Result<BaseReader, SpillError> {
        let Some(group) = self.groups.get(&key_group) else {
            return Ok(BaseReader::empty());
        };
        let file = File::open(&group.path).map_err(|source| io_error(&group.path, source))?;
        Ok(BaseReader {
            path: group.path.clone(),
            file: Some(BufReader::with_capacity(BUFFER_BYTES, file)),
            key: Vec::new(),
            value: Vec::new(),
            loaded: false,
            ended: false,
        })
    }
}

/// The bases of one spilling state, shared with its snapshots.
#[derive(Debug)]
pub(crate) struct Bases {
    dir: PathBuf,
    /// The newest finished base and its epoch.
    newest: Mutex<Option<(u64, Arc<Base>)>>,
}

impl Bases {
    /// Bases kept in `dir` (created with the first base file).
    pub(crate) fn new(dir: PathBuf) -> Arc<Self> {
        Arc::new(Bases {
            dir,
            newest: Mutex::new(None),
        })
    }

    fn newest(&self) -> std::sync::MutexGuard<'_, Option<(u64, Arc<Base>)>> {
        // A panic while holding it leaves a consistent value (one
        // assignment), so a poisoned lock is still usable.
        self.newest
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Base `epoch`, if it is the newest finished one. Holding it keeps
    /// its files even if a newer base replaces it meanwhile.
    pub(crate) fn open(&self, epoch: u64) -> Option<Arc<Base>> {
        match &*self.newest() {
            Some((newest_epoch, base)) if *newest_epoch == epoch => Some(Arc::clone(base)),
            _ => None,
        }
    }

    /// A writer of base `epoch`, published by [`BaseWriter::finish`].
    pub(crate) fn writer(self: &Arc<Self>, epoch: u64) -> Result<BaseWriter, SpillError> {
        std::fs::create_dir_all(&self.dir).map_err(|source| io_error(&self.dir, source))?;
        Ok(BaseWriter {
            bases: Arc::clone(self),
            epoch,
            base: Base::default(),
            current: None,
        })
    }

    /// Makes `base` base `epoch` unless a newer one is finished already
    /// (the loser's own files are deleted as it drops).
    fn publish(&self, epoch: u64, base: Base) {
        let mut newest = self.newest();
        let replaced = match &*newest {
            Some((newest_epoch, _)) if *newest_epoch > epoch => None,
            _ => newest.replace((epoch, Arc::new(base))),
        };
        // Dropped outside the lock: it may delete files.
        drop(newest);
        drop(replaced);
    }

    /// The epoch of the newest finished base, if any.
    #[cfg(test)]
    pub(crate) fn newest_epoch(&self) -> Option<u64> {
        self.newest().as_ref().map(|(epoch, _)| *epoch)
    }
}

impl Drop for Bases {
    fn drop(&mut self) {
        // Nothing to report to: a directory left behind only costs disk.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn io_error(path: &Path, source: std::io::Error) -> SpillError {
    SpillError::Dir {
        dir: path.to_path_buf(),
        source,
    }
}

/// One key group's file being written.
#[derive(Debug)]
struct OpenGroup {
    key_group: u32,
    /// Created at the first entry: an empty group has no file.
    file: Option<(BufWriter<File>, GroupFile)>,
    entries: u64,
}

/// Writes one base, key group by key group, ascending; its files are
/// deleted unless [`Self::finish`]ed (a kept file stays with the bases
/// that hold it).
#[derive(Debug)]
pub(crate) struct BaseWriter {
    bases: Arc<Bases>,
    epoch: u64,
    base: Base,
    current: Option<OpenGroup>,
}

impl BaseWriter {
    /// Starts writing `key_group`'s file (ending the one before).
    pub(crate) fn begin_group(&mut self, key_group: u32) -> Result<(), SpillError> {
        self.end_group()?;
        self.current = Some(OpenGroup {
            key_group,
            file: None,
            entries: 0,
        });
        Ok(())
    }

    /// Keeps `file` (of the previous base) as `key_group`'s, unchanged;
    /// `None` keeps the group empty.
    pub(crate) fn keep_group(
        &mut self,
        key_group: u32,
        file: Option<Arc<GroupFile>>,
    ) -> Result<(), SpillError> {
        self.end_group()?;
        if let Some(file) = file {
            self.base.groups.insert(key_group, file);
        }
        Ok(())
    }

    /// Appends one entry to the group begun last; entries must come in
    /// ascending key order.
    pub(crate) fn push(&mut self, key: &[u8], value: &[u8]) -> Result<(), SpillError> {
        let (Ok(key_len), Ok(value_len)) = (u32::try_from(key.len()), u32::try_from(value.len()))
        else {
            return Err(SpillError::Internal(
                "an entry over 4 GiB does not fit a base file".into(),
            ));
        };
        let Some(group) = &mut self.current else {
            return Err(SpillError::Internal(
                "a base entry written outside a key group".into(),
            ));
        };
        if group.file.is_none() {
            let path = self
                .bases
                .dir
                .join(format!("base-{}-{}", self.epoch, group.key_group));
            let file = File::create(&path).map_err(|source| io_error(&path, source))?;
            group.file = Some((
                BufWriter::with_capacity(BUFFER_BYTES, file),
                GroupFile { path, entries: 0 },
            ));
        }
        let Some((file, group_file)) = &mut group.file else {
            return Err(SpillError::Internal("a base file did not open".into()));
        };
        let result = file
            .write_all(&key_len.to_le_bytes())
            .and_then(|()| file.write_all(&value_len.to_le_bytes()))
            .and_then(|()| file.write_all(key))
            .and_then(|()| file.write_all(value));
        group.entries += 1;
        result.map_err(|source| io_error(&group_file.path, source))
    }

    /// Flushes the group being written, if any, into the base.
    fn end_group(&mut self) -> Result<(), SpillError> {
        let Some(group) = self.current.take() else {
            return Ok(());
        };
        if let Some((file, mut group_file)) = group.file {
            // `group_file` deletes its file if this fails.
            file.into_inner()
                .map_err(|error| io_error(&group_file.path, error.into_error()))?;
            group_file.entries = group.entries;
            self.base
                .groups
                .insert(group.key_group, Arc::new(group_file));
        }
        Ok(())
    }

    /// Flushes the last group and makes this base the newest (unless a
    /// newer one is finished already). Returns how many entries it holds.
    pub(crate) fn finish(mut self) -> Result<u64, SpillError> {
        self.end_group()?;
        let base = std::mem::take(&mut self.base);
        let entries = base.groups.values().map(|group| group.entries).sum();
        self.bases.publish(self.epoch, base);
        Ok(entries)
    }
}

/// Reads one key group's base file entry by entry, ascending.
#[derive(Debug)]
pub(crate) struct BaseReader {
    path: PathBuf,
    /// `None` for an empty group.
    file: Option<BufReader<File>>,
    key: Vec<u8>,
    value: Vec<u8>,
    /// Whether `key` and `value` hold the entry [`Self::peek`] shows.
    loaded: bool,
    ended: bool,
}

impl BaseReader {
    /// A reader of an empty group.
    pub(crate) fn empty() -> Self {
        BaseReader {
            path: PathBuf::new(),
            file: None,
            key: Vec::new(),
            value: Vec::new(),
            loaded: false,
            ended: true,
        }
    }

    /// The next entry, without moving past it; `None` at the end.
    pub(crate) fn peek(&mut self) -> Result<Option<EntryRef<'_>>, SpillError> {
        if !self.loaded && !self.ended {
            self.load()?;
        }
        Ok((self.loaded).then_some((self.key.as_slice(), self.value.as_slice())))
    }

    /// Moves past the entry [`Self::peek`] shows.
    pub(crate) fn advance(&mut self) {
        self.loaded = false;
    }

    fn load(&mut self) -> Result<(), SpillError> {
        let Some(file) = &mut self.file else {
            self.ended = true;
            return Ok(());
        };
        let mut header = [0; 8];
        match read_or_end(file, &mut header) {
            Ok(false) => {
                self.ended = true;
                return Ok(());
            }
            Ok(true) => {}
            Err(source) => return Err(io_error(&self.path, source)),
        }
        let length = |at: usize| {
            let mut word = [0; 4];
            word.copy_from_slice(&header[at..at + 4]);
            u32::from_le_bytes(word) as usize
        };
        self.key.resize(length(0), 0);
        self.value.resize(length(4), 0);
        file.read_exact(&mut self.key)
            .and_then(|()| file.read_exact(&mut self.value))
            .map_err(|source| io_error(&self.path, source))?;
        self.loaded = true;
        Ok(())
    }
}

/// Fills `buffer`, or returns `false` at a clean end of the file (no byte
/// of `buffer` read); a file that ends inside `buffer` is an error.
fn read_or_end(file: &mut impl Read, buffer: &mut [u8]) -> std::io::Result<bool> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read(&mut buffer[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(read) => filled += read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(mut reader: BaseReader) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some((key, value)) = reader.peek().unwrap() {
            out.push((key.to_vec(), value.to_vec()));
            reader.advance();
        }
        out
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    #[test]
    fn a_finished_base_reads_back_per_group_and_only_as_the_newest_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let bases = Bases::new(dir.path().join("bases"));
        assert!(bases.open(1).is_none());
        let mut writer = bases.writer(1).unwrap();
        writer.begin_group(3).unwrap();
        writer.push(b"a", b"1").unwrap();
        writer.push(b"bb", b"").unwrap();
        writer.begin_group(4).unwrap();
        writer.begin_group(5).unwrap();
        writer.push(b"c", b"2").unwrap();
        assert!(bases.open(1).is_none(), "not finished yet");
        assert_eq!(writer.finish().unwrap(), 3);
        let base = bases.open(1).unwrap();
        assert_eq!(
            read_all(base.reader(3).unwrap()),
            vec![(b"a".to_vec(), b"1".to_vec()), (b"bb".to_vec(), Vec::new())]
        );
        assert_eq!(read_all(base.reader(4).unwrap()), Vec::new());
        assert_eq!(read_all(base.reader(5).unwrap()).len(), 1);
        // An empty group has no file.
        assert_eq!(
            files(&dir.path().join("bases")),
            vec!["base-1-3", "base-1-5"]
        );
        assert!(bases.open(0).is_none());
        assert!(bases.open(2).is_none());
    }

    #[test]
    fn a_kept_group_file_is_shared_and_deleted_with_its_last_base() {
        let dir = tempfile::tempdir().unwrap();
        let bases = Bases::new(dir.path().join("bases"));
        let mut writer = bases.writer(1).unwrap();
        for key_group in [1, 2] {
            writer.begin_group(key_group).unwrap();
            writer.push(&[key_group as u8], b"old").unwrap();
        }
        writer.finish().unwrap();
        let first = bases.open(1).unwrap();
        let mut writer = bases.writer(2).unwrap();
        writer.keep_group(1, first.file(1).cloned()).unwrap();
        writer.begin_group(2).unwrap();
        writer.push(&[2], b"new").unwrap();
        assert_eq!(writer.finish().unwrap(), 2);
        let second = bases.open(2).unwrap();
        assert_eq!(
            read_all(second.reader(1).unwrap()),
            vec![(vec![1], b"old".to_vec())]
        );
        assert_eq!(
            read_all(second.reader(2).unwrap()),
            vec![(vec![2], b"new".to_vec())]
        );
        // Base 1 is still held here: its group 2 file is still there.
        let bases_dir = dir.path().join("bases");
        assert_eq!(files(&bases_dir), vec!["base-1-1", "base-1-2", "base-2-2"]);
        drop(first);
        assert_eq!(files(&bases_dir), vec!["base-1-1", "base-2-2"]);
        drop(second);
        drop(bases);
        assert!(!bases_dir.exists());
    }

    #[test]
    fn an_unfinished_base_is_deleted_and_an_older_one_never_replaces_a_newer() {
        let dir = tempfile::tempdir().unwrap();
        let bases = Bases::new(dir.path().join("bases"));
        let mut dropped = bases.writer(5).unwrap();
        dropped.begin_group(0).unwrap();
        dropped.push(b"a", b"1").unwrap();
        drop(dropped);
        assert!(files(&dir.path().join("bases")).is_empty());
        let mut older = bases.writer(6).unwrap();
        older.begin_group(0).unwrap();
        older.push(b"a", b"1").unwrap();
        bases.writer(7).unwrap().finish().unwrap();
        older.finish().unwrap();
        assert_eq!(bases.newest_epoch(), Some(7));
        assert!(files(&dir.path().join("bases")).is_empty());
        drop(bases);
        assert!(!dir.path().join("bases").exists());
    }

    #[test]
    fn a_truncated_base_is_an_error_not_an_end() {
        let dir = tempfile::tempdir().unwrap();
        let bases = Bases::new(dir.path().join("bases"));
        let mut writer = bases.writer(1).unwrap();
        writer.begin_group(0).unwrap();
        writer.push(b"key", b"value").unwrap();
        writer.finish().unwrap();
        let path = dir.path().join("bases").join("base-1-0");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        let mut reader = bases.open(1).unwrap().reader(0).unwrap();
        assert!(reader.peek().is_err());
    }
}
