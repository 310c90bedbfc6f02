//! A file's lines with the byte offset each starts at, through snapflow's
//! file source: the examples that read a file name their planned crashes
//! by those offsets, which stay the same across restarts.
//!
//! It knows nothing of any example's records; it only reads lines.

use std::path::Path;

use snapflow::source::{
    FileLinesSource, FileLinesSourceFactory, Source, SourceError, SourceFactory, SourcePoll,
    SourcePosition,
};

use crate::common::{Pacer, Pacing};

/// The lines of a file through snapflow's file source
/// ([`FileLinesSourceFactory`]: splits by byte range, positions are byte
/// offsets, so a restart resumes at the exact line), each tagged with the
/// byte offset it starts at, read at the example's pace.
pub struct FileWithOffsets {
    inner: FileLinesSourceFactory,
    pacing: Pacing,
}

impl FileWithOffsets {
    /// The lines of `path`, read at `pacing`.
    pub fn new(path: &Path, pacing: Pacing) -> FileWithOffsets {
        FileWithOffsets {
            inner: FileLinesSourceFactory::new(path),
            pacing,
        }
    }
}

impl SourceFactory for FileWithOffsets {
    type Source = FileWithOffsetsReader;

    fn split(&self, subtask: usize, parallelism: usize) -> Result<Self::Source, SourceError> {
        Ok(FileWithOffsetsReader {
            inner: self.inner.split(subtask, parallelism)?,
            pacer: Pacer::new(self.pacing),
            line: Vec::with_capacity(1),
        })
    }
}

/// One subtask's lines with their offsets. Its position and seek are the
/// file source's own.
pub struct FileWithOffsetsReader {
    inner: FileLinesSource,
    pacer: Pacer,
    /// Reused for one line at a time.
    line: Vec<String>,
}

impl Source for FileWithOffsetsReader {
    type Item = (u64, String);

    fn poll_batch(
        &mut self,
        out: &mut Vec<(u64, String)>,
        max_records: usize,
    ) -> Result<SourcePoll, SourceError> {
        let Some(budget) = self.pacer.budget(max_records) else {
            return Ok(SourcePoll::Idle);
        };
        let mut produced = 0;
        // One line per inner poll, so that each line's offset is the inner
        // position just before it.
        while produced < budget {
            let offset = self.inner.position().to_index()?;
            let status = match self.inner.poll_batch(&mut self.line, 1) {
                // Hand out the good lines first: the same bad line fails
                // again on the next poll.
                Err(_) if produced > 0 => break,
                status => status?,
            };
            match (status, self.line.pop()) {
                (SourcePoll::Produced(_), Some(line)) => out.push((offset, line)),
                (SourcePoll::Ended, _) if produced == 0 => return Ok(SourcePoll::Ended),
                _ => break,
            }
            produced += 1;
        }
        Ok(SourcePoll::Produced(produced))
    }

    fn position(&self) -> SourcePosition {
        self.inner.position()
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), SourceError> {
        self.inner.seek(position)
    }

    fn figures(&mut self) -> snapflow::source::SourceFigures {
        self.inner.figures()
    }

    fn split_positions(&self, out: &mut Vec<snapflow::source::SplitPosition>) {
        self.inner.split_positions(out);
    }
}
