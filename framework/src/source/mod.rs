//! Replayable sources: the [`Source`] trait a runtime drives, the
//! [`SourceFactory`] that gives each parallel subtask its split, opaque
//! [`SourcePosition`]s for checkpoint metadata, and the built-in sources.
//!
//! This module owns reading input in batches and rewinding it to a recorded
//! position. It never spawns actors, never blocks waiting for input that is
//! not there yet (a source with nothing ready says [`SourcePoll::Idle`]),
//! never decides when a checkpoint happens, and never interprets another
//! source's position bytes.
//!
//! # Contract between a runtime and a source
//!
//! - A runtime calls [`Source::poll_batch`] repeatedly, one call per batch;
//!   the source appends up to `max_records` records to the caller's vector.
//!   There is no per-record virtual call: a batch is one call, and built-in
//!   sources fill it with a monomorphised loop.
//! - At a checkpoint the runtime stores [`Source::position`] (the position
//!   of the *next* record, after everything appended so far) in the
//!   checkpoint's metadata. Its bytes are opaque to everyone but the source.
//! - On restore the runtime builds a fresh source from the same factory with
//!   the same subtask index and parallelism, and calls [`Source::seek`] with
//!   the stored position; from then on `poll_batch` yields exactly the
//!   records that followed the position the first time.
//! - A source that cannot seek ([`Source::can_seek`] is false) is accepted;
//!   its [`Guarantee`] is then [`Guarantee::AtLeastOnce`], because snapflow
//!   cannot replay what it read after the last checkpoint.
//!
//! # How a runtime drives a source and a sink
//!
//! One subtask, without actors: read a batch, write it, and at a checkpoint
//! store the source's position with the sink's pre-commit state; commit
//! when the checkpoint is complete. A restore seeks and restores from what
//! was stored.
//!
//! ```
//! use snapflow::sink::{CollectHandle, Sink};
//! use snapflow::source::{GeneratorSourceFactory, Source, SourceFactory, SourcePoll};
//!
//! let handle = CollectHandle::new();
//! let factory = GeneratorSourceFactory::new(0..10, |index| index * index);
//! let mut source = factory.split(0, 1)?;
//! let mut sink = handle.sink(0);
//! sink.restore(None)?;
//!
//! let mut batch = Vec::with_capacity(4);
//! let mut stored = None;
//! for checkpoint_id in 1.. {
//!     batch.clear();
//!     let ended = source.poll_batch(&mut batch, 4)? == SourcePoll::Ended;
//!     sink.write_batch(&batch)?;
//!     if ended {
//!         sink.finish()?;
//!     }
//!     // Here every batch ends with a checkpoint; a runtime takes one when
//!     // the coordinator's barrier arrives.
//!     let position = source.position();
//!     let state = sink.pre_commit(checkpoint_id)?;
//!     stored = Some((position, state)); // the checkpoint is complete
//!     sink.commit(checkpoint_id)?;
//!     if ended {
//!         break;
//!     }
//! }
//! assert_eq!(handle.committed(), [0, 1, 4, 9, 16, 25, 36, 49, 64, 81]);
//!
//! // A restore: a new source and sink, rewound to what was stored.
//! let (position, state) = stored.expect("a checkpoint completed");
//! let mut source = factory.split(0, 1)?;
//! source.seek(&position)?;
//! let mut sink = handle.sink(0);
//! sink.restore(Some(&state))?;
//! assert_eq!(source.poll_batch(&mut batch, 4)?, SourcePoll::Ended);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Positions are per subtask. Restoring a checkpoint at a different
//! parallelism is not supported by these sources: a split's position only
//! makes sense for the same split (a known gap; it gives a typed error when
//! the position falls outside the new split, not a silent misread). A
//! source whose splits can move between subtasks (the Kafka source's
//! partitions) says so with [`SourceFactory::rescales`] and spreads its
//! positions in [`SourceFactory::rescale_positions`].

mod file;
mod generator;
mod iter;
mod progress;
mod vec;

pub use file::{FileLinesSource, FileLinesSourceFactory, DEFAULT_MAX_LINE_BYTES};
pub use generator::{GeneratorSource, GeneratorSourceFactory};
pub use iter::{IterSource, IterSourceFactory};
pub use progress::{SourceFigures, SplitPosition};
pub use vec::{VecSource, VecSourceFactory};

use std::io;
use std::ops::Range;
use std::path::PathBuf;

/// What one [`Source::poll_batch`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourcePoll {
    /// This many records were appended to the caller's vector. It is at
    /// least 1, except when the caller asked for `max_records == 0`.
    Produced(usize),
    /// Nothing is available now, but more may come later. The runtime should
    /// poll again later (after other work or a timer), not in a busy loop.
    Idle,
    /// The source is exhausted; every later call also returns `Ended`.
    Ended,
}

/// The delivery guarantee a connector can give on its own, for the job
/// report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Guarantee {
    /// After a restore, every record affects the result exactly once.
    ExactlyOnce,
    /// After a restore, records since the last checkpoint may be seen again
    /// (a sink that cannot roll back), or are not replayed by snapflow at all
    /// (a source that cannot seek: whether the external system redelivers
    /// them decides between "at least once" and loss).
    AtLeastOnce,
}

impl Guarantee {
    /// The weaker of two guarantees: what a job made of both can promise.
    pub fn weakest(self, other: Guarantee) -> Guarantee {
        match (self, other) {
            (Guarantee::ExactlyOnce, Guarantee::ExactlyOnce) => Guarantee::ExactlyOnce,
            _ => Guarantee::AtLeastOnce,
        }
    }
}

/// An opaque, source-defined position, stored in checkpoint metadata.
///
/// The built-in sources store a little-endian `u64` (a record index or a
/// byte offset); a user source may store anything it can read back.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct SourcePosition(Vec<u8>);

impl SourcePosition {
    /// A position made of the given bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        SourcePosition(bytes)
    }

    /// The position's bytes, to be written into checkpoint metadata.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// A position that holds one index or offset, as the built-ins use.
    pub fn from_index(index: u64) -> Self {
        SourcePosition(index.to_le_bytes().to_vec())
    }

    /// Reads back a position made by [`SourcePosition::from_index`].
    ///
    /// # Errors
    ///
    /// [`SourceError::MalformedPosition`] when the bytes are not exactly
    /// eight long.
    pub fn to_index(&self) -> Result<u64, SourceError> {
        let bytes: [u8; 8] =
            self.0
                .as_slice()
                .try_into()
                .map_err(|_| SourceError::MalformedPosition {
                    length_bytes: self.0.len(),
                })?;
        Ok(u64::from_le_bytes(bytes))
    }
}

/// Names one split of a source subtask's input (a Kafka partition, a
/// file), unique within the subtask.
pub type SplitId = u32;

/// A replayable source of records for one subtask.
///
/// See the [module documentation](self) for the contract with the runtime.
/// Calls are synchronous and must not block for long: a source with nothing
/// ready returns [`SourcePoll::Idle`].
pub trait Source {
    /// The record type.
    type Item;

    /// Appends up to `max_records` records to `out` (it never clears `out`)
    /// and says how many it appended.
    ///
    /// When it returns an error, the records it appended before the error
    /// are still valid and [`Source::position`] is just after them, so a
    /// runtime may keep them; the built-ins instead report such a batch as
    /// `Produced` and return the error on the next call.
    ///
    /// # Errors
    ///
    /// A [`SourceError`]; [`SourceError::is_retryable`] says whether polling
    /// again may succeed.
    fn poll_batch(
        &mut self,
        out: &mut Vec<Self::Item>,
        max_records: usize,
    ) -> Result<SourcePoll, SourceError>;

    /// The position of the next record this source will produce.
    fn position(&self) -> SourcePosition;

    /// Rewinds (or advances) to a position this source's split returned
    /// earlier from [`Source::position`].
    ///
    /// # Errors
    ///
    /// A typed error when the position is malformed, outside this split, or
    /// not a valid record boundary; [`SourceError::SeekUnsupported`] from a
    /// source that cannot seek.
    fn seek(&mut self, position: &SourcePosition) -> Result<(), SourceError>;

    /// Whether [`Source::seek`] works. A runtime does not call `seek` on a
    /// source that says false.
    fn can_seek(&self) -> bool {
        true
    }

    /// Appends the splits this subtask reads now to `out`: the partitions
    /// of a Kafka subtask, the one share of a built-in source (the
    /// default, split 0). With event time on, each split gets its own
    /// watermark generator and the subtask's watermark is the minimum over
    /// its active splits. An empty list says the subtask has no split (it
    /// has more subtasks than its input has splits): it marks itself idle
    /// at once, so it never holds the job's watermark back.
    ///
    /// The runtime asks after every poll, and only when the stream has a
    /// watermark strategy; a list that changes (a partition added or
    /// taken away) is followed.
    fn current_splits(&self, out: &mut Vec<SplitId>) {
        out.push(0);
    }

    /// The split whose records the last [`Source::poll_batch`] appended. A
    /// source that reads several splits appends one split's records per
    /// call, so that each split's generator sees only its own. Default 0.
    fn last_split(&self) -> SplitId {
        0
    }

    /// This source's own figures for the live metrics: the bytes it read
    /// from outside and its lag (see [`SourceFigures`]). The runtime asks
    /// once per slice of polls (a few dozen batches) while metrics are on,
    /// so it must be cheap: return counters the source keeps anyway. The
    /// default knows nothing.
    fn figures(&mut self) -> SourceFigures {
        SourceFigures::default()
    }

    /// Records this source object read and dropped since it was made
    /// (records its user chose to skip, such as the Kafka source's
    /// undecodable ones with `BadRecords::Drop`). The runtime asks after
    /// every poll and adds what is new to the operator's
    /// [`OperatorReport::records_dropped`](crate::job::OperatorReport::records_dropped)
    /// and the live metrics, so it must be cheap: return a counter. The
    /// default drops nothing.
    fn records_dropped(&self) -> u64 {
        0
    }

    /// Appends where each of this source's splits is, as numbers, to
    /// `out`. The runtime asks at most once a second and when the source
    /// ends, while metrics are on. The default appends nothing (the
    /// metrics then show the position stored at the newest checkpoint).
    fn split_positions(&self, out: &mut Vec<SplitPosition>) {
        let _ = out;
    }

    /// What this source can guarantee after a restore.
    fn guarantee(&self) -> Guarantee {
        if self.can_seek() {
            Guarantee::ExactlyOnce
        } else {
            Guarantee::AtLeastOnce
        }
    }
}

/// Builds the source of one parallel subtask.
///
/// The splits of all subtasks `0..parallelism` together produce every input
/// record exactly once. A factory is called again with the same arguments on
/// restore, and must give the same split.
pub trait SourceFactory {
    /// The source each subtask gets.
    type Source: Source;

    /// The source of subtask `subtask` out of `parallelism`.
    ///
    /// # Errors
    ///
    /// [`SourceError::InvalidSplit`] when `parallelism` is 0 or `subtask` is
    /// not below it; I/O errors from sources that open files.
    fn split(&self, subtask: usize, parallelism: usize) -> Result<Self::Source, SourceError>;

    /// Whether [`SourceFactory::rescale_positions`] can spread this
    /// source's positions over another parallelism. The default is false:
    /// a restore at another parallelism is then refused with
    /// [`JobError::RescaleUnsupported`](crate::job::JobError::RescaleUnsupported).
    fn rescales(&self) -> bool {
        false
    }

    /// The positions of `parallelism` new subtasks made from `positions`,
    /// the stored positions of every old subtask in subtask order, for a
    /// restore at another parallelism. Only called when
    /// [`SourceFactory::rescales`] says true; a source whose splits are
    /// units it can reassign (Kafka partitions) implements it.
    ///
    /// # Errors
    ///
    /// A message saying why these positions cannot be spread (for
    /// example bytes this source did not write); the job then refuses to
    /// start with
    /// [`JobError::RescaleUnsupported`](crate::job::JobError::RescaleUnsupported).
    fn rescale_positions(
        &self,
        positions: &[SourcePosition],
        parallelism: usize,
    ) -> Result<Vec<SourcePosition>, String> {
        let _ = (positions, parallelism);
        Err("this source's positions belong to one split each".to_owned())
    }
}

/// The contiguous share of `range` that subtask `subtask` of `parallelism`
/// owns. Shares differ in length by at most one, and concatenated in
/// subtask order they are `range` again.
///
/// # Errors
///
/// [`SourceError::InvalidSplit`] when `parallelism` is 0 or `subtask` is not
/// below it.
pub fn split_range(
    range: Range<u64>,
    subtask: usize,
    parallelism: usize,
) -> Result<Range<u64>, SourceError> {
    check_split(subtask, parallelism)?;
    let length = u128::from(range.end.saturating_sub(range.start));
    // u128 keeps `length * subtask` from overflowing for any u64 range.
    let boundary = |index: usize| {
        let offset = length * index as u128 / parallelism as u128;
        range.start + offset as u64
    };
    Ok(boundary(subtask)..boundary(subtask + 1))
}

/// Checks that `subtask` is a valid index for `parallelism`.
///
/// # Errors
///
/// [`SourceError::InvalidSplit`] when it is not.
pub fn check_split(subtask: usize, parallelism: usize) -> Result<(), SourceError> {
    if parallelism == 0 || subtask >= parallelism {
        return Err(SourceError::InvalidSplit {
            subtask,
            parallelism,
        });
    }
    Ok(())
}

/// Why a source could not split, poll or seek.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// Reading or opening the input failed.
    #[error("source I/O failed while {operation} `{path}`: {source}")]
    Io {
        /// What the source was doing, e.g. "reading".
        operation: &'static str,
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Position bytes that no built-in source writes.
    #[error("source position is {length_bytes} bytes long, expected 8")]
    MalformedPosition {
        /// The length of the bytes given.
        length_bytes: usize,
    },
    /// A position outside this subtask's split.
    #[error("source position {position} is outside this split ({start}..={end})")]
    PositionOutOfSplit {
        /// The position asked for.
        position: u64,
        /// The first valid position of the split.
        start: u64,
        /// The last valid position of the split (its end).
        end: u64,
    },
    /// A position that another subtask's split produced (a striding
    /// split, where subtask `s` of `p` owns the indices `s + k * p`).
    #[error("source position {position} does not belong to subtask {subtask} of {parallelism}")]
    ForeignPosition {
        /// The position asked for.
        position: u64,
        /// This source's subtask.
        subtask: usize,
        /// This source's parallelism.
        parallelism: usize,
    },
    /// A file position that is not the first byte of a line.
    #[error("byte offset {offset_bytes} is not the start of a line")]
    NotLineStart {
        /// The offset asked for.
        offset_bytes: u64,
    },
    /// A line longer than the configured bound.
    #[error("the line at byte offset {offset_bytes} is longer than {max_line_bytes} bytes")]
    LineTooLong {
        /// Where the line starts.
        offset_bytes: u64,
        /// The configured bound.
        max_line_bytes: usize,
    },
    /// The file ended before the split did: it changed after the split was
    /// made (sources never follow a changing file).
    #[error("the file ended early at byte offset {offset_bytes}; it changed while being read")]
    FileChanged {
        /// Where the next line should have started.
        offset_bytes: u64,
    },
    /// A line that is not UTF-8.
    #[error("the line at byte offset {offset_bytes} is not valid UTF-8")]
    InvalidUtf8 {
        /// Where the line starts.
        offset_bytes: u64,
    },
    /// `seek` on a source that cannot seek.
    #[error("this source cannot seek")]
    SeekUnsupported,
    /// A subtask index that does not fit the parallelism.
    #[error("subtask {subtask} does not exist at parallelism {parallelism}")]
    InvalidSplit {
        /// The subtask asked for.
        subtask: usize,
        /// The parallelism asked for.
        parallelism: usize,
    },
    /// An error of a user-written source.
    #[error("{message}")]
    Custom {
        /// What went wrong.
        message: String,
        /// Whether polling again may succeed.
        retryable: bool,
    },
}

impl SourceError {
    /// Whether trying the same call again may succeed. Transient I/O errors
    /// (interrupted, would block, timed out) are retryable; bad positions,
    /// bad input and misuse are not.
    pub fn is_retryable(&self) -> bool {
        match self {
            SourceError::Io { source, .. } => is_transient(source),
            SourceError::Custom { retryable, .. } => *retryable,
            SourceError::MalformedPosition { .. }
            | SourceError::PositionOutOfSplit { .. }
            | SourceError::ForeignPosition { .. }
            | SourceError::NotLineStart { .. }
            | SourceError::LineTooLong { .. }
            | SourceError::InvalidUtf8 { .. }
            | SourceError::FileChanged { .. }
            | SourceError::SeekUnsupported
            | SourceError::InvalidSplit { .. } => false,
        }
    }
}

/// Whether an I/O error is worth retrying. Shared with the sinks.
pub(crate) fn is_transient(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}
