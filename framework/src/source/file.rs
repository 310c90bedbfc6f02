//! A source over the lines of a file, with the byte offset of the next line
//! as its position, so a restore in the middle of the file resumes exactly.
//!
//! It owns one open file per subtask and a reusable line buffer. It never
//! follows a growing file: the file must not change while a job reads it
//! (the split boundaries are computed once, from its length at split time).
//!
//! Lines end with `\n`; a `\r` just before the `\n` is removed too (CRLF).
//! A final line without a newline is still a line. A lone `\r` at the very
//! end of the file stays part of the last line, as in
//! [`std::io::BufRead::lines`].

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::{
    split_range, Source, SourceError, SourceFactory, SourceFigures, SourcePoll, SourcePosition,
    SplitPosition,
};

/// The default bound on one line's length, without its line ending: 1 MiB.
pub const DEFAULT_MAX_LINE_BYTES: usize = 1 << 20;

/// Splits a file by byte ranges; a line belongs to the subtask whose range
/// holds the line's first byte (as Hadoop's text input splits do).
///
/// ```no_run
/// use snapflow::source::{FileLinesSourceFactory, Source, SourceFactory};
///
/// let factory = FileLinesSourceFactory::new("input.txt").max_line_bytes(4096);
/// let mut source = factory.split(0, 1)?;
/// let mut lines = Vec::new();
/// source.poll_batch(&mut lines, 1024)?;
/// # Ok::<(), snapflow::source::SourceError>(())
/// ```
#[derive(Debug, Clone)]
pub struct FileLinesSourceFactory {
    path: PathBuf,
    max_line_bytes: usize,
}

impl FileLinesSourceFactory {
    /// A factory over the file at `path`, with lines of at most
    /// [`DEFAULT_MAX_LINE_BYTES`].
    pub fn new(path: impl AsRef<Path>) -> Self {
        FileLinesSourceFactory {
            path: path.as_ref().to_path_buf(),
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
        }
    }

    /// Sets the longest line accepted (bytes, without the line ending). A
    /// longer line makes `poll_batch` return [`SourceError::LineTooLong`].
    pub fn max_line_bytes(mut self, max_line_bytes: usize) -> Self {
        self.max_line_bytes = max_line_bytes;
        self
    }
}

impl SourceFactory for FileLinesSourceFactory {
    type Source = FileLinesSource;

    fn split(&self, subtask: usize, parallelism: usize) -> Result<FileLinesSource, SourceError> {
        let io_error = |operation| io_error(&self.path, operation);
        let file = File::open(&self.path).map_err(io_error("opening"))?;
        let length_bytes = file
            .metadata()
            .map_err(io_error("reading metadata of"))?
            .len();
        let mut reader = BufReader::with_capacity(64 * 1024, file);
        let range = split_range(0..length_bytes, subtask, parallelism)?;
        let start = next_line_start(&mut reader, range.start).map_err(io_error("reading"))?;
        let end = next_line_start(&mut reader, range.end).map_err(io_error("reading"))?;
        reader
            .seek(SeekFrom::Start(start))
            .map_err(io_error("seeking in"))?;
        Ok(FileLinesSource {
            path: self.path.clone(),
            reader,
            start,
            end,
            next: start,
            max_line_bytes: self.max_line_bytes,
            line: Vec::new(),
            bytes_read: 0,
        })
    }
}

/// The first line start at or after `offset`: `offset` itself if it is 0 or
/// follows a `\n`, else the byte after the next `\n` (or the end of the
/// file). It scans without keeping the bytes, so no line bound is needed.
fn next_line_start(reader: &mut BufReader<File>, offset: u64) -> std::io::Result<u64> {
    if offset == 0 {
        return Ok(0);
    }
    reader.seek(SeekFrom::Start(offset - 1))?;
    let mut position = offset - 1;
    loop {
        let available = reader.fill_buf()?;
        if available.is_empty() {
            return Ok(position);
        }
        if let Some(index) = available.iter().position(|byte| *byte == b'\n') {
            return Ok(position + index as u64 + 1);
        }
        let length = available.len();
        reader.consume(length);
        position += length as u64;
    }
}

/// One subtask's lines of a file.
#[derive(Debug)]
pub struct FileLinesSource {
    path: PathBuf,
    reader: BufReader<File>,
    /// The first line start of this split.
    start: u64,
    /// The first line start after this split (or the file's length).
    end: u64,
    /// The offset of the next line; the reader is positioned there.
    next: u64,
    max_line_bytes: usize,
    /// Reused for every line, so reading costs no allocation per line
    /// beyond the `String` handed out.
    line: Vec<u8>,
    /// Bytes of the lines handed out, line endings included (a line read
    /// again after a seek back counts again, as a re-read does).
    bytes_read: u64,
}

impl FileLinesSource {
    /// Reads the line at `self.next` into `self.line` (without its ending)
    /// and returns the offset of the line after it.
    fn read_line(&mut self) -> Result<u64, SourceError> {
        self.line.clear();
        // A line may grow to the bound plus a `\r` before its `\n`.
        let limit = self.max_line_bytes.saturating_add(1);
        let mut consumed = 0_u64;
        loop {
            let available = self
                .reader
                .fill_buf()
                .map_err(io_error(&self.path, "reading"))?;
            if available.is_empty() {
                break;
            }
            let newline = available.iter().position(|byte| *byte == b'\n');
            let take = newline.unwrap_or(available.len());
            if self.line.len() + take > limit {
                return Err(self.too_long());
            }
            self.line.extend_from_slice(&available[..take]);
            let used = newline.map_or(take, |index| index + 1);
            self.reader.consume(used);
            consumed += used as u64;
            if newline.is_some() {
                if self.line.last() == Some(&b'\r') {
                    self.line.pop();
                }
                break;
            }
        }
        if consumed == 0 {
            // The split's end was computed from the file's length at split
            // time, so the file got shorter since. Yielding empty lines here
            // would never reach the end.
            return Err(SourceError::FileChanged {
                offset_bytes: self.next,
            });
        }
        if self.line.len() > self.max_line_bytes {
            return Err(self.too_long());
        }
        Ok(self.next + consumed)
    }

    fn too_long(&self) -> SourceError {
        SourceError::LineTooLong {
            offset_bytes: self.next,
            max_line_bytes: self.max_line_bytes,
        }
    }

    /// Puts the reader back at `self.next` after a failed line, so the next
    /// poll reads the same line again and fails the same way.
    fn rewind_reader(&mut self) -> Result<(), SourceError> {
        self.reader
            .seek(SeekFrom::Start(self.next))
            .map_err(io_error(&self.path, "seeking in"))?;
        Ok(())
    }

    /// Whether `offset` is the first byte of a line (or this split's end).
    fn is_line_start(&mut self, offset: u64) -> Result<bool, SourceError> {
        if offset == 0 || offset == self.end {
            return Ok(true);
        }
        self.reader
            .seek(SeekFrom::Start(offset - 1))
            .map_err(io_error(&self.path, "seeking in"))?;
        let mut byte = [0_u8; 1];
        self.reader
            .read_exact(&mut byte)
            .map_err(io_error(&self.path, "reading"))?;
        Ok(byte[0] == b'\n')
    }
}

impl Source for FileLinesSource {
    type Item = String;

    fn poll_batch(
        &mut self,
        out: &mut Vec<String>,
        max_records: usize,
    ) -> Result<SourcePoll, SourceError> {
        if self.next >= self.end {
            return Ok(SourcePoll::Ended);
        }
        let mut produced = 0;
        while produced < max_records && self.next < self.end {
            let line = self.read_line().and_then(|after| {
                let text =
                    std::str::from_utf8(&self.line).map_err(|_| SourceError::InvalidUtf8 {
                        offset_bytes: self.next,
                    })?;
                Ok((text.to_owned(), after))
            });
            match line {
                Ok((text, after)) => {
                    out.push(text);
                    produced += 1;
                    self.bytes_read += after - self.next;
                    self.next = after;
                }
                Err(error) => {
                    self.rewind_reader()?;
                    // Hand out the good lines first; the next call meets the
                    // same bad line again and returns the error then.
                    if produced > 0 {
                        break;
                    }
                    return Err(error);
                }
            }
        }
        Ok(SourcePoll::Produced(produced))
    }

    fn position(&self) -> SourcePosition {
        SourcePosition::from_index(self.next)
    }

    /// The bytes of the lines read, and the bytes of this split not read
    /// yet (the split's end is fixed when the source is made).
    fn figures(&mut self) -> SourceFigures {
        SourceFigures {
            bytes_read: Some(self.bytes_read),
            pending_records: None,
            pending_bytes: Some(self.end.saturating_sub(self.next)),
        }
    }

    /// One split: the file, at the byte offset of its next line.
    fn split_positions(&self, out: &mut Vec<SplitPosition>) {
        out.push(SplitPosition {
            split: self.path.display().to_string(),
            position: self.next,
            pending_records: None,
        });
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), SourceError> {
        let offset = position.to_index()?;
        if offset < self.start || offset > self.end {
            return Err(SourceError::PositionOutOfSplit {
                position: offset,
                start: self.start,
                end: self.end,
            });
        }
        if !self.is_line_start(offset)? {
            self.rewind_reader()?;
            return Err(SourceError::NotLineStart {
                offset_bytes: offset,
            });
        }
        self.next = offset;
        self.rewind_reader()
    }
}

fn io_error(path: &Path, operation: &'static str) -> impl FnOnce(std::io::Error) -> SourceError {
    let path = path.to_path_buf();
    move |source| SourceError::Io {
        operation,
        path,
        source,
    }
}
