//! Parts written as segments, for incremental checkpoints: what a caller
//! hands the store ([`Segment`]) and what the metadata records of each
//! piece ([`SegmentInfo`]).
//!
//! This module only defines the values and their arithmetic (lengths,
//! checksums); it never does I/O and never looks inside the bytes. A
//! segmented part is, byte for byte, the concatenation of its segments:
//! loading assembles it, so whoever reads a part sees the same bytes as if
//! it had been written whole.
//!
//! # Where each segment goes
//!
//! - [`Segment::Own`] bytes go into the checkpoint's own part file
//!   (`chk-<n>/op-<x>/<s>.part`), one after the other. No other checkpoint
//!   ever refers to them.
//! - [`Segment::Shared`] bytes go into the part's shared file of this
//!   checkpoint (`shared/op-<x>/<s>-<n, 20 digits>.shared`), one after the
//!   other from offset 0, so the caller knows each one's [`SharedRange`]
//!   without asking the store: the offset is the sum of the lengths of the
//!   part's earlier `Shared` segments.
//! - [`Segment::Reuse`] writes nothing: it names a range of the same
//!   part's shared file of an earlier checkpoint, which must still be
//!   referenced by a complete checkpoint (the store checks that the file
//!   exists when the part is written).
//!
//! A savepoint is always written self-contained: `Shared` bytes go into its
//! own part file and `Reuse` ranges are read and copied in, so a savepoint
//! never refers to a file outside its directory.

use serde::{Deserialize, Serialize};

use super::CheckpointId;

/// A range of a part's shared file written by an earlier checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SharedRange {
    /// The checkpoint that wrote the shared file.
    pub checkpoint: CheckpointId,
    /// Where the range starts in that file.
    pub offset: u64,
    /// Its length in bytes.
    pub len: u64,
    /// CRC-32 (IEEE) of the range's bytes.
    pub crc32: u32,
}

/// One piece of a part as written through
/// [`CheckpointStore::write_part_segments`](super::CheckpointStore::write_part_segments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Bytes for this checkpoint only.
    Own(Vec<u8>),
    /// Bytes that later checkpoints of the same part may refer to.
    Shared(Vec<u8>),
    /// Bytes an earlier checkpoint wrote as [`Segment::Shared`].
    Reuse(SharedRange),
}

impl Segment {
    /// The segment's length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Segment::Own(bytes) | Segment::Shared(bytes) => bytes.len() as u64,
            Segment::Reuse(range) => range.len,
        }
    }

    /// Whether the segment holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The sum of the segments' lengths: the assembled part's length.
pub fn total_len(segments: &[Segment]) -> u64 {
    segments.iter().map(Segment::len).sum()
}

/// Where the bytes of one recorded segment are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SegmentSource {
    /// In the checkpoint's own part file.
    Own,
    /// In the part's shared file written by this checkpoint (this one or
    /// an earlier one).
    Shared(CheckpointId),
}

/// One segment of a part as the metadata records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SegmentInfo {
    /// Which file holds it.
    pub source: SegmentSource,
    /// Where it starts in that file.
    pub offset: u64,
    /// Its length in bytes.
    pub len: u64,
    /// CRC-32 (IEEE) of its bytes.
    pub crc32: u32,
}

impl SegmentInfo {
    /// The shared file's checkpoint, for a segment in a shared file.
    pub fn shared_checkpoint(&self) -> Option<CheckpointId> {
        match self.source {
            SegmentSource::Own => None,
            SegmentSource::Shared(checkpoint) => Some(checkpoint),
        }
    }
}

/// The CRC-32 of the concatenation of pieces with the given `(crc32, len)`,
/// computed without their bytes.
pub fn combined_crc32(pieces: impl IntoIterator<Item = (u32, u64)>) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    for (crc32, len) in pieces {
        hasher.combine(&crc32fast::Hasher::new_with_initial_len(crc32, len));
    }
    hasher.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_crc_equals_the_crc_of_the_concatenation() {
        let pieces: [&[u8]; 4] = [b"", b"abc", b"defgh", b"i"];
        let whole: Vec<u8> = pieces.concat();
        let combined = combined_crc32(
            pieces
                .iter()
                .map(|piece| (crc32fast::hash(piece), piece.len() as u64)),
        );
        assert_eq!(combined, crc32fast::hash(&whole));
    }
}
