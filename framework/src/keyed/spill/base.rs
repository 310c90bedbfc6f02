//! [`Bases`]: the contents of the spilling state's disk table as its last
//! completed snapshot saw them, kept as one sorted local file (a "base"),
//! from which the next snapshot is built by merging in the changes since
//! ([`super::changes`]) instead of reading the disk table back.
//!
//! This module owns the base files' layout, their directory, and which
//! base is the newest complete one. It never reads the disk table, never
//! builds a part and never decides what a snapshot contains.
//!
//! # Why a base is right
//!
//! Snapshot `e` of a state either reads the disk table's view `e` (the
//! fallback) or merges base `e - 1` with every entry written to the disk
//! table between the views `e - 1` and `e`; both give the table's content
//! at view `e`, which it writes as base `e`. A base is used only by the
//! snapshot of the very next epoch, and only if it was finished: a
//! snapshot dropped half-way, a restore or an overflowing change log
//! leaves the next snapshot on the fallback, which starts a new chain.
//!
//! # Layout
//!
//! One file per base, `base-<epoch>`, in the state's own directory beside
//! its disk table: every entry of the table, ascending by key, as the
//! key's and the value's lengths (`u32` little-endian), the key (key group
//! big-endian, then postcard) and the value (the state's payload). It is
//! not durable, as the disk table is not: the checkpoint store holds the
//! durable copy. The directory is deleted when the last holder of the
//! [`Bases`] is dropped (the state and any snapshot still being written).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::changes::EntryRef;
use super::SpillError;

/// The buffer of a base file's reader and writer: large enough that a
/// sequential pass costs few system calls, small next to a part.
const BUFFER_BYTES: usize = 256 * 1024;

/// The base files of one spilling state, shared with its snapshots.
#[derive(Debug)]
pub(crate) struct Bases {
    dir: PathBuf,
    /// The newest finished base: its epoch and file.
    newest: Mutex<Option<(u64, PathBuf)>>,
}

impl Bases {
    /// Bases kept in `dir` (created with the first base).
    pub(crate) fn new(dir: PathBuf) -> Arc<Self> {
        Arc::new(Bases {
            dir,
            newest: Mutex::new(None),
        })
    }

    fn newest(&self) -> std::sync::MutexGuard<'_, Option<(u64, PathBuf)>> {
        // A panic while holding it leaves a consistent value (one
        // assignment), so a poisoned lock is still usable.
        self.newest
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A reader of base `epoch`, if it is the newest finished one. The
    /// file stays readable even if a newer base replaces it meanwhile (it
    /// is open, and only unlinked).
    pub(crate) fn open(&self, epoch: u64) -> Result<Option<BaseReader>, SpillError> {
        let newest = self.newest();
        match &*newest {
            Some((newest_epoch, path)) if *newest_epoch == epoch => {
                let file = File::open(path).map_err(|source| io_error(path, source))?;
                Ok(Some(BaseReader {
                    path: path.clone(),
                    file: BufReader::with_capacity(BUFFER_BYTES, file),
                    key: Vec::new(),
                    value: Vec::new(),
                    loaded: false,
                    ended: false,
                }))
            }
            _ => Ok(None),
        }
    }

    /// A writer of base `epoch`, published by [`BaseWriter::finish`].
    pub(crate) fn writer(self: &Arc<Self>, epoch: u64) -> Result<BaseWriter, SpillError> {
        std::fs::create_dir_all(&self.dir).map_err(|source| io_error(&self.dir, source))?;
        let path = self.dir.join(format!("base-{epoch}"));
        let file = File::create(&path).map_err(|source| io_error(&path, source))?;
        Ok(BaseWriter {
            bases: Arc::clone(self),
            epoch,
            file: Some(BufWriter::with_capacity(BUFFER_BYTES, file)),
            path,
            entries: 0,
        })
    }

    /// Makes `path` base `epoch` unless a newer one is finished already;
    /// the file that loses is deleted.
    fn publish(&self, epoch: u64, path: PathBuf) {
        let mut newest = self.newest();
        let stale = match &*newest {
            Some((newest_epoch, _)) if *newest_epoch > epoch => Some(path),
            _ => newest.replace((epoch, path)).map(|(_, old)| old),
        };
        drop(newest);
        if let Some(stale) = stale {
            // A file left behind costs disk until the directory goes.
            let _ = std::fs::remove_file(stale);
        }
    }

    /// Makes base `from`, if it is the newest, base `to` as well: for a
    /// snapshot that saw no change since the one before.
    pub(crate) fn relabel(&self, from: u64, to: u64) {
        let mut newest = self.newest();
        if let Some((epoch, _)) = &mut *newest {
            if *epoch == from {
                *epoch = to;
            }
        }
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

/// Writes one base file; deleted unless [`Self::finish`]ed.
#[derive(Debug)]
pub(crate) struct BaseWriter {
    bases: Arc<Bases>,
    epoch: u64,
    file: Option<BufWriter<File>>,
    path: PathBuf,
    entries: u64,
}

impl BaseWriter {
    /// Appends one entry; entries must come in ascending key order.
    pub(crate) fn push(&mut self, key: &[u8], value: &[u8]) -> Result<(), SpillError> {
        let (Ok(key_len), Ok(value_len)) = (u32::try_from(key.len()), u32::try_from(value.len()))
        else {
            return Err(SpillError::Internal(
                "an entry over 4 GiB does not fit a base file".into(),
            ));
        };
        let Some(file) = &mut self.file else {
            return Err(SpillError::Internal(
                "a base file written after its end".into(),
            ));
        };
        let result = file
            .write_all(&key_len.to_le_bytes())
            .and_then(|()| file.write_all(&value_len.to_le_bytes()))
            .and_then(|()| file.write_all(key))
            .and_then(|()| file.write_all(value));
        self.entries += 1;
        result.map_err(|source| io_error(&self.path, source))
    }

    /// Flushes the file and makes it the newest base (unless a newer one
    /// is finished already). Returns how many entries it holds.
    pub(crate) fn finish(mut self) -> Result<u64, SpillError> {
        if let Some(file) = self.file.take() {
            file.into_inner()
                .map_err(|error| io_error(&self.path, error.into_error()))?;
        }
        self.bases.publish(self.epoch, self.path.clone());
        // Published: not to be deleted by `drop`.
        self.path = PathBuf::new();
        Ok(self.entries)
    }
}

impl Drop for BaseWriter {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Reads one base file entry by entry, ascending.
#[derive(Debug)]
pub(crate) struct BaseReader {
    path: PathBuf,
    file: BufReader<File>,
    key: Vec<u8>,
    value: Vec<u8>,
    /// Whether `key` and `value` hold the entry [`Self::peek`] shows.
    loaded: bool,
    ended: bool,
}

impl BaseReader {
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
        let mut header = [0; 8];
        match read_or_end(&mut self.file, &mut header) {
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
        self.file
            .read_exact(&mut self.key)
            .and_then(|()| self.file.read_exact(&mut self.value))
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

    #[test]
    fn a_finished_base_reads_back_and_only_as_the_newest_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let bases = Bases::new(dir.path().join("bases"));
        assert!(bases.open(1).unwrap().is_none());
        let mut writer = bases.writer(1).unwrap();
        writer.push(b"a", b"1").unwrap();
        writer.push(b"bb", b"").unwrap();
        assert!(bases.open(1).unwrap().is_none(), "not finished yet");
        assert_eq!(writer.finish().unwrap(), 2);
        assert_eq!(
            read_all(bases.open(1).unwrap().unwrap()),
            vec![(b"a".to_vec(), b"1".to_vec()), (b"bb".to_vec(), Vec::new())]
        );
        assert!(bases.open(0).unwrap().is_none());
        assert!(bases.open(2).unwrap().is_none());
    }

    #[test]
    fn an_unfinished_base_is_deleted_and_an_older_one_never_replaces_a_newer() {
        let dir = tempfile::tempdir().unwrap();
        let bases = Bases::new(dir.path().join("bases"));
        let mut dropped = bases.writer(5).unwrap();
        dropped.push(b"a", b"1").unwrap();
        drop(dropped);
        assert!(!dir.path().join("bases").join("base-5").exists());
        let older = bases.writer(6).unwrap();
        bases.writer(7).unwrap().finish().unwrap();
        older.finish().unwrap();
        assert_eq!(bases.newest_epoch(), Some(7));
        assert!(!dir.path().join("bases").join("base-6").exists());
        drop(bases);
        assert!(!dir.path().join("bases").exists());
    }

    #[test]
    fn a_truncated_base_is_an_error_not_an_end() {
        let dir = tempfile::tempdir().unwrap();
        let bases = Bases::new(dir.path().join("bases"));
        let mut writer = bases.writer(1).unwrap();
        writer.push(b"key", b"value").unwrap();
        writer.finish().unwrap();
        let path = dir.path().join("bases").join("base-1");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        let mut reader = bases.open(1).unwrap().unwrap();
        assert!(reader.peek().is_err());
    }
}
