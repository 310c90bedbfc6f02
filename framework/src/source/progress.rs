//! What a source tells the live metrics about itself: the bytes it read
//! from outside the job, how much input is still waiting for it (its
//! lag), and where each of its splits is, as numbers.
//!
//! This module owns those plain figures ([`SourceFigures`],
//! [`SplitPosition`]). It never counts anything itself and never reads a
//! clock: a source keeps its own counters, and the runtime asks for them
//! once per slice of polls (the figures) or at most once a second (the
//! split positions), never per record.
//!
//! The bytes follow Flink's `numBytesIn` of a source: what the source
//! read from the system outside (a file's bytes, line endings included;
//! a Kafka record's key, value and headers), not the size of the records
//! it made of them. The lag follows Flink's `pendingRecords` and
//! `pendingBytes` (FLIP-33): input that exists and is not read yet.

use serde::Serialize;

/// A source's own figures, as [`Source::figures`](super::Source::figures)
/// returns them. `None` is "this source does not know".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceFigures {
    /// Bytes this source object read from outside the job since it was
    /// made (a restore makes a new one, which starts at 0 again).
    pub bytes_read: Option<u64>,
    /// Records not read yet that the source knows exist (a Kafka
    /// partition's high watermark, or its end when bounded, minus its
    /// next offset, summed over the subtask's partitions; offsets, so
    /// transaction markers ahead of the consumer count).
    pub pending_records: Option<u64>,
    /// Bytes not read yet (a file split's end minus its next line).
    pub pending_bytes: Option<u64>,
}

/// Where one split of a source is, as a number.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SplitPosition {
    /// The split's name: `topic/partition` for a Kafka partition, the
    /// path for a file.
    pub split: String,
    /// The position of the next record: a Kafka offset, a file's byte
    /// offset, a record index.
    pub position: u64,
    /// Records of this split not read yet, when known (Kafka: the high
    /// watermark asked once a second, minus `position`).
    pub pending_records: Option<u64>,
}
