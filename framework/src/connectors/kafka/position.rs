//! The Kafka source's position bytes: for each partition a subtask owns,
//! the offset of the next record to read and, for a bounded source, the
//! offset it stops at.
//!
//! This module owns the byte layout and its hostile-input checks. It
//! never talks to a broker and never decides which subtask owns a
//! partition.
//!
//! Layout (little-endian): format byte `1`, entry count `u32`, then per
//! entry the topic's length `u16` and UTF-8 bytes, the partition `i32`,
//! the next offset `i64` and the end offset `i64` (`-1`: unbounded).
//! Decoding checks every length against the bytes that remain before it
//! allocates, so hostile bytes cannot make it allocate more than they
//! are long.

use std::collections::BTreeMap;

use super::bytes::{put_str, Reader};
use super::error::KafkaError;
use crate::source::SourcePosition;

const FORMAT: u8 = 1;

/// One partition's place: `(topic, partition)` → offsets.
pub(crate) type Offsets = BTreeMap<(String, i32), PartitionOffsets>;

/// Where one partition is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartitionOffsets {
    /// The offset of the next record to read.
    pub(crate) next: i64,
    /// A bounded source's end: records at this offset and later are not
    /// read. `None`: unbounded.
    pub(crate) end: Option<i64>,
}

/// The position bytes of `offsets`.
pub(crate) fn encode(offsets: &Offsets) -> SourcePosition {
    let mut bytes = Vec::with_capacity(5 + offsets.len() * 32);
    bytes.push(FORMAT);
    // A subtask owns far fewer than 2^32 partitions; saturating would make
    // decoding fail loudly, not misread.
    let count = u32::try_from(offsets.len()).unwrap_or(u32::MAX);
    bytes.extend_from_slice(&count.to_le_bytes());
    for ((topic, partition), place) in offsets {
        put_str(&mut bytes, topic);
        bytes.extend_from_slice(&partition.to_le_bytes());
        bytes.extend_from_slice(&place.next.to_le_bytes());
        bytes.extend_from_slice(&place.end.unwrap_or(-1).to_le_bytes());
    }
    SourcePosition::from_bytes(bytes)
}

/// Reads bytes written by [`encode`].
///
/// # Errors
///
/// [`KafkaError::MalformedState`] for anything else.
pub(crate) fn decode(position: &SourcePosition) -> Result<Offsets, KafkaError> {
    let malformed = |reason: &str| KafkaError::MalformedState {
        reason: format!("source position: {reason}"),
    };
    let mut reader = Reader::new(position.as_bytes());
    if reader.u8().map_err(malformed)? != FORMAT {
        return Err(malformed("unknown format byte"));
    }
    let count = reader.u32().map_err(malformed)?;
    let mut offsets = Offsets::new();
    for _ in 0..count {
        let topic = reader.str().map_err(malformed)?;
        let partition = reader.i32().map_err(malformed)?;
        let next = reader.i64().map_err(malformed)?;
        let end = reader.i64().map_err(malformed)?;
        if partition < 0 || next < 0 || end < -1 {
            return Err(malformed("a negative partition or offset"));
        }
        let place = PartitionOffsets {
            next,
            end: (end >= 0).then_some(end),
        };
        if offsets.insert((topic, partition), place).is_some() {
            return Err(malformed("a partition is listed twice"));
        }
    }
    reader.finish().map_err(malformed)?;
    Ok(offsets)
}

/// One position holding every partition of `positions` (the old
/// subtasks' positions), for every new subtask: each keeps the
/// partitions it owns at its parallelism and ignores the others.
///
/// # Errors
///
/// A message when a position does not decode or a partition appears in
/// two of them.
pub(crate) fn merge(positions: &[SourcePosition]) -> Result<SourcePosition, String> {
    let mut merged = Offsets::new();
    for position in positions {
        for (key, place) in decode(position).map_err(|error| error.to_string())? {
            let (topic, partition) = (key.0.clone(), key.1);
            if merged.insert(key, place).is_some() {
                return Err(format!(
                    "partition {topic}/{partition} is in the positions of two subtasks"
                ));
            }
        }
    }
    Ok(encode(&merged))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Offsets {
        let mut offsets = Offsets::new();
        offsets.insert(("in".into(), 0), PartitionOffsets { next: 7, end: None });
        offsets.insert(
            ("in".into(), 3),
            PartitionOffsets {
                next: 0,
                end: Some(12),
            },
        );
        offsets
    }

    #[test]
    fn positions_round_trip_and_merge() {
        let offsets = sample();
        assert_eq!(decode(&encode(&offsets)).expect("decodes"), offsets);
        let mut other = Offsets::new();
        other.insert(("in".into(), 1), PartitionOffsets { next: 2, end: None });
        let merged = merge(&[encode(&offsets), encode(&other)]).expect("merges");
        assert_eq!(decode(&merged).expect("decodes").len(), 3);
        let twice = merge(&[encode(&offsets), encode(&offsets)]);
        assert!(twice
            .expect_err("a partition twice")
            .contains("two subtasks"));
    }

    #[test]
    fn every_cut_and_flipped_byte_is_a_typed_error_or_a_valid_position() {
        let bytes = encode(&sample()).as_bytes().to_vec();
        for cut in 0..bytes.len() {
            let position = SourcePosition::from_bytes(bytes[..cut].to_vec());
            assert!(decode(&position).is_err(), "cut at {cut}");
        }
        for index in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[index] ^= 0xFF;
            // Either an error or some position; never a panic.
            let _ = decode(&SourcePosition::from_bytes(flipped));
        }
        let huge = [vec![FORMAT], u32::MAX.to_le_bytes().to_vec()].concat();
        assert!(decode(&SourcePosition::from_bytes(huge)).is_err());
    }
}
