//! Sorted change runs: the changes a snapshot wrote to a key group's base
//! without rewriting the group's base file, one file per snapshot that
//! wrote any ([`RunFile`]), each group's run a byte range of it ([`Run`]).
//!
//! This module owns the run files' layout, writing one ([`RunWriter`]),
//! reading a range back ([`RecordReader`], shared with the base files,
//! whose records have the same layout without deletions) and when a run
//! file is deleted. It never decides whether a group gets a run or a new
//! base file ([`super::source`] does), never merges runs and never reads
//! the disk table.
//!
//! # Layout
//!
//! `run-<epoch>` in the bases' directory holds the runs of every key group
//! that snapshot `epoch` appended to, one after the other in ascending key
//! group order, each ascending by key: the key's and the value's lengths
//! (`u32` little-endian; a value length of `u32::MAX` marks a deletion and
//! no value follows), the key, the value. The file is deleted when the
//! last [`Run`] referring to it is dropped, i.e. when no base (or snapshot
//! reading one) still lists one of its runs.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::changes::ChangeRef;
use super::SpillError;

/// The value length that marks a record as a deletion.
const TOMBSTONE: u32 = u32::MAX;

/// The bytes of a record's header: the key's and the value's lengths.
const HEADER_LEN: usize = 8;

/// The buffer of a run's writer and of each run's reader: a group's merge
/// may read several runs at once, so smaller than a base file's.
const RUN_BUFFER_BYTES: usize = 64 * 1024;

/// One snapshot's run file, shared by the runs in it; deleted when the
/// last of them is dropped.
#[derive(Debug)]
pub(crate) struct RunFile {
    path: PathBuf,
}

impl Drop for RunFile {
    fn drop(&mut self) {
        // A file left behind costs disk until the directory goes.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One key group's run: a byte range of a run file.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    file: Arc<RunFile>,
    start: u64,
    end: u64,
    entries: u64,
}

impl Run {
    /// How many records (values and deletions) the run holds.
    pub(crate) fn entries(&self) -> u64 {
        self.entries
    }

    /// A reader of the run's records, ascending. The file stays readable
    /// even if every base drops it meanwhile (it is open, only unlinked).
    pub(crate) fn reader(&self) -> Result<RecordReader, SpillError> {
        RecordReader::open(
            &self.file.path,
            self.start,
            self.end - self.start,
            RUN_BUFFER_BYTES,
        )
    }
}

/// Writes one snapshot's run file, group by group, ascending. The file is
/// created at the first record; its runs are readable only after
/// [`Self::finish`] (the buffer is flushed there), and it is deleted if
/// the writer and every run handed out are dropped.
#[derive(Debug)]
pub(crate) struct RunWriter {
    path: PathBuf,
    file: Option<(BufWriter<File>, Arc<RunFile>)>,
    /// Bytes written so far.
    offset: u64,
    /// Where the group being written started, and its records.
    group_start: u64,
    group_entries: u64,
}

impl RunWriter {
    /// A writer of `run-<epoch>` in `dir` (which must exist).
    pub(crate) fn new(dir: &Path, epoch: u64) -> Self {
        RunWriter {
            path: dir.join(format!("run-{epoch}")),
            file: None,
            offset: 0,
            group_start: 0,
            group_entries: 0,
        }
    }

    /// Starts the next group's run.
    pub(crate) fn begin(&mut self) {
        self.group_start = self.offset;
        self.group_entries = 0;
    }

    /// Appends one record to the group's run; records must come in
    /// ascending key order.
    pub(crate) fn push(&mut self, (key, value): ChangeRef<'_>) -> Result<(), SpillError> {
        let (Ok(key_len), Ok(value_len)) = (
            u32::try_from(key.len()),
            u32::try_from(value.map_or(0, <[u8]>::len)),
        ) else {
            return Err(SpillError::Internal(
                "an entry over 4 GiB does not fit a run file".into(),
            ));
        };
        if value_len == TOMBSTONE {
            return Err(SpillError::Internal(
                "a value of 4 GiB does not fit a run file".into(),
            ));
        }
        let value_word = if value.is_some() {
            value_len
        } else {
            TOMBSTONE
        };
        if self.file.is_none() {
            let file = File::create(&self.path).map_err(|source| io_error(&self.path, source))?;
            let run_file = Arc::new(RunFile {
                path: self.path.clone(),
            });
            self.file = Some((BufWriter::with_capacity(RUN_BUFFER_BYTES, file), run_file));
        }
        let Some((file, _)) = &mut self.file else {
            return Err(SpillError::Internal("a run file did not open".into()));
        };
        file.write_all(&key_len.to_le_bytes())
            .and_then(|()| file.write_all(&value_word.to_le_bytes()))
            .and_then(|()| file.write_all(key))
            .and_then(|()| file.write_all(value.unwrap_or_default()))
            .map_err(|source| io_error(&self.path, source))?;
        self.offset += 8 + u64::from(key_len) + u64::from(value_len);
        self.group_entries += 1;
        Ok(())
    }

    /// Ends the group's run: `None` if it holds no record.
    pub(crate) fn end(&mut self) -> Option<Run> {
        let (_, run_file) = self.file.as_ref()?;
        (self.group_entries > 0).then(|| Run {
            file: Arc::clone(run_file),
            start: self.group_start,
            end: self.offset,
            entries: self.group_entries,
        })
    }

    /// Flushes the file, making its runs readable.
    pub(crate) fn finish(self) -> Result<(), SpillError> {
        if let Some((file, _run_file)) = self.file {
            // `_run_file` deletes the file if this fails and no run holds it.
            file.into_inner()
                .map_err(|error| io_error(&self.path, error.into_error()))?;
        }
        Ok(())
    }
}

pub(crate) fn io_error(path: &Path, source: std::io::Error) -> SpillError {
    SpillError::Dir {
        dir: path.to_path_buf(),
        source,
    }
}

/// Reads records (a base file's or a run's) one by one, ascending.
#[derive(Debug)]
pub(crate) struct RecordReader {
    path: PathBuf,
    /// `None` for an empty group.
    file: Option<BufReader<std::io::Take<File>>>,
    key: Vec<u8>,
    value: Vec<u8>,
    deleted: bool,
    /// Whether a record is loaded for [`Self::current`]: in `key` and
    /// `value`, or (see `buffered`) in the file's buffer.
    loaded: bool,
    /// The loaded record's key and value lengths when it is still in the
    /// file's buffer, header first, and consumed at [`Self::advance`]:
    /// nearly every record, since a record is far smaller than the
    /// buffer. Reading it in place saves the copies into `key` and
    /// `value` (three calls to copy a few bytes each per record, a tenth
    /// of a whole read's CPU at 10 M keys: BENCHMARKS.md at 07a44e5, "Sorting by
    /// kept prefixes").
    buffered: Option<(usize, usize)>,
    ended: bool,
}

impl RecordReader {
    /// A reader of nothing.
    pub(crate) fn empty() -> Self {
        RecordReader {
            path: PathBuf::new(),
            file: None,
            key: Vec::new(),
            value: Vec::new(),
            deleted: false,
            loaded: false,
            buffered: None,
            ended: true,
        }
    }

    /// A reader of `len` bytes of `path` from `start` on.
    pub(crate) fn open(
        path: &Path,
        start: u64,
        len: u64,
        buffer: usize,
    ) -> Result<Self, SpillError> {
        let mut file = File::open(path).map_err(|source| io_error(path, source))?;
        if start > 0 {
            file.seek(SeekFrom::Start(start))
                .map_err(|source| io_error(path, source))?;
        }
        Ok(RecordReader {
            path: path.to_path_buf(),
            file: Some(BufReader::with_capacity(buffer, file.take(len))),
            key: Vec::new(),
            value: Vec::new(),
            deleted: false,
            loaded: false,
            buffered: None,
            ended: false,
        })
    }

    /// Reads the next record unless one is loaded already.
    pub(crate) fn fill(&mut self) -> Result<(), SpillError> {
        if !self.loaded && !self.ended {
            self.load()?;
        }
        Ok(())
    }

    /// The record loaded by [`Self::fill`] (`None` inside for a
    /// deletion); `None` at the end or before a fill.
    pub(crate) fn current(&self) -> Option<ChangeRef<'_>> {
        if !self.loaded {
            return None;
        }
        let (key, value) = match (self.buffered, &self.file) {
            (Some((key_len, value_len)), Some(file)) => {
                let record = &file.buffer()[HEADER_LEN..HEADER_LEN + key_len + value_len];
                record.split_at(key_len)
            }
            _ => (self.key.as_slice(), self.value.as_slice()),
        };
        Some((key, (!self.deleted).then_some(value)))
    }

    /// The next record, without moving past it; `None` at the end.
    #[cfg(test)]
    pub(crate) fn peek(&mut self) -> Result<Option<ChangeRef<'_>>, SpillError> {
        self.fill()?;
        Ok(self.current())
    }

    /// Moves past the record [`Self::current`] shows.
    pub(crate) fn advance(&mut self) {
        if let (Some((key_len, value_len)), Some(file)) = (self.buffered.take(), &mut self.file) {
            file.consume(HEADER_LEN + key_len + value_len);
        }
        self.loaded = false;
    }

    fn load(&mut self) -> Result<(), SpillError> {
        let Some(file) = &mut self.file else {
            self.ended = true;
            return Ok(());
        };
        let buffer = file
            .fill_buf()
            .map_err(|source| io_error(&self.path, source))?;
        if buffer.is_empty() {
            self.ended = true;
            return Ok(());
        }
        if let Some((key_len, value_word)) = buffer.first_chunk::<HEADER_LEN>().map(lengths) {
            let deleted = value_word == TOMBSTONE;
            let value_len = if deleted { 0 } else { value_word as usize };
            let fits = (key_len as usize)
                .checked_add(value_len)
                .is_some_and(|len| len <= buffer.len() - HEADER_LEN);
            if fits {
                self.deleted = deleted;
                self.buffered = Some((key_len as usize, value_len));
                self.loaded = true;
                return Ok(());
            }
        }
        // The record runs past the buffer's end: copied out piece by
        // piece (the buffer refills on the way).
        let mut header = [0; HEADER_LEN];
        match read_or_end(file, &mut header) {
            Ok(false) => {
                self.ended = true;
                return Ok(());
            }
            Ok(true) => {}
            Err(source) => return Err(io_error(&self.path, source)),
        }
        let (key_len, value_word) = lengths(&header);
        self.deleted = value_word == TOMBSTONE;
        self.key.resize(key_len as usize, 0);
        self.value
            .resize(if self.deleted { 0 } else { value_word as usize }, 0);
        file.read_exact(&mut self.key)
            .and_then(|()| file.read_exact(&mut self.value))
            .map_err(|source| io_error(&self.path, source))?;
        self.loaded = true;
        Ok(())
    }
}

/// A record header's key length and value word (the value's length, or
/// [`TOMBSTONE`]).
fn lengths(header: &[u8; HEADER_LEN]) -> (u32, u32) {
    let word = |at: usize| {
        u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    (word(0), word(4))
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

    type Record = (Vec<u8>, Option<Vec<u8>>);

    fn read_all(mut reader: RecordReader) -> Vec<Record> {
        let mut out = Vec::new();
        while let Some((key, value)) = reader.peek().unwrap() {
            out.push((key.to_vec(), value.map(<[u8]>::to_vec)));
            reader.advance();
        }
        out
    }

    #[test]
    fn each_groups_run_reads_back_its_own_range_with_deletions() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = RunWriter::new(dir.path(), 3);
        writer.begin();
        assert!(writer.end().is_none(), "no file, no run");
        writer.begin();
        writer.push((b"a", Some(b"1"))).unwrap();
        writer.push((b"b", None)).unwrap();
        let first = writer.end().unwrap();
        writer.begin();
        assert!(writer.end().is_none(), "an empty group has no run");
        writer.begin();
        writer.push((b"c", Some(b""))).unwrap();
        let second = writer.end().unwrap();
        writer.finish().unwrap();
        assert_eq!((first.entries(), second.entries()), (2, 1));
        assert_eq!(
            read_all(first.reader().unwrap()),
            vec![(b"a".to_vec(), Some(b"1".to_vec())), (b"b".to_vec(), None)]
        );
        assert_eq!(
            read_all(second.reader().unwrap()),
            vec![(b"c".to_vec(), Some(Vec::new()))]
        );
        let path = dir.path().join("run-3");
        assert!(path.exists());
        drop(first);
        assert!(path.exists(), "the second run still refers to it");
        drop(second);
        assert!(!path.exists(), "deleted with its last run");
    }

    #[test]
    fn an_unfinished_run_file_is_deleted_with_its_writer() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = RunWriter::new(dir.path(), 1);
        writer.begin();
        writer.push((b"a", Some(b"1"))).unwrap();
        let run = writer.end().unwrap();
        drop(writer);
        drop(run);
        assert!(!dir.path().join("run-1").exists());
    }

    #[test]
    fn a_truncated_run_is_an_error_not_an_end() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = RunWriter::new(dir.path(), 1);
        writer.begin();
        writer.push((b"key", Some(b"value"))).unwrap();
        let run = writer.end().unwrap();
        writer.finish().unwrap();
        let path = dir.path().join("run-1");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        assert!(run.reader().unwrap().peek().is_err());
    }

    /// Writes random records (empty to longer than the reader's buffer,
    /// some deletions) after some leading bytes, and reads them back
    /// through a small random buffer, so that records lie inside it, run
    /// past its end, or are longer than it.
    fn check_records_across_buffer_ends(seed: u64) {
        use crate::keyed::test_support::Rng;
        let mut rng = Rng(seed);
        let buffer = 8 + rng.below(40) as usize;
        let lead = rng.below(5);
        let mut bytes = vec![7_u8; lead as usize];
        let mut want = Vec::new();
        for index in 0..rng.below(300) {
            let key: Vec<u8> = (0..rng.below(12))
                .map(|byte| byte as u8 ^ index as u8)
                .collect();
            let value = (rng.below(4) > 0).then(|| vec![index as u8; rng.below(70) as usize]);
            bytes.extend_from_slice(&(key.len() as u32).to_le_bytes());
            let value_word = value.as_ref().map_or(TOMBSTONE, |value| value.len() as u32);
            bytes.extend_from_slice(&value_word.to_le_bytes());
            bytes.extend_from_slice(&key);
            bytes.extend_from_slice(value.as_deref().unwrap_or_default());
            want.push((key, value));
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("records");
        std::fs::write(&path, &bytes).unwrap();
        let reader = RecordReader::open(&path, lead, u64::MAX, buffer).unwrap();
        assert_eq!(read_all(reader), want, "buffer {buffer}");
    }

    #[test]
    fn records_read_back_whether_or_not_they_fit_the_buffer() {
        crate::keyed::test_support::with_seed(
            "records_read_back_whether_or_not_they_fit_the_buffer",
            |seed| {
                for round in 0..30 {
                    check_records_across_buffer_ends(seed.wrapping_add(round));
                }
            },
        );
    }
}
