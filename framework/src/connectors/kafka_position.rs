//! The byte layout of the Kafka source's position: for each partition a
//! subtask owns, the offset of the next record to read and, for a
//! bounded source, the offset it stops at.
//!
//! This module owns the layout and its hostile-input checks, and it is
//! compiled without the `kafka` feature, so that a reader of stored
//! checkpoints (`job::inspect`, the `snapflow` tool) shows Kafka offsets
//! without building librdkafka. It never talks to a broker and never
//! decides which subtask owns a partition (`kafka/position.rs` and the
//! source do, with this layout).
//!
//! Layout (little-endian): format byte `1`, entry count `u32`, then per
//! entry the topic's length `u16` and UTF-8 bytes, the partition `i32`,
//! the next offset `i64` and the end offset `i64` (`-1`: unbounded).
//! Decoding checks every length against the bytes that remain before it
//! allocates, so hostile bytes cannot make it allocate more than they
//! are long.

use std::collections::BTreeMap;

use super::bytes::{put_str, Reader};

/// The layout's format byte.
pub(crate) const FORMAT: u8 = 1;

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
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub(crate) fn encode(offsets: &Offsets) -> Vec<u8> {
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
    bytes
}

/// Reads bytes written by [`encode`].
///
/// # Errors
///
/// What is wrong with any other bytes (the caller wraps it in its own
/// typed error).
pub(crate) fn decode(bytes: &[u8]) -> Result<Offsets, &'static str> {
    let mut reader = Reader::new(bytes);
    if reader.u8()? != FORMAT {
        return Err("unknown format byte");
    }
    let count = reader.u32()?;
    let mut offsets = Offsets::new();
    for _ in 0..count {
        let topic = reader.str()?;
        let partition = reader.i32()?;
        let next = reader.i64()?;
        let end = reader.i64()?;
        if partition < 0 || next < 0 || end < -1 {
            return Err("a negative partition or offset");
        }
        let place = PartitionOffsets {
            next,
            end: (end >= 0).then_some(end),
        };
        if offsets.insert((topic, partition), place).is_some() {
            return Err("a partition is listed twice");
        }
    }
    reader.finish()?;
    Ok(offsets)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Two partitions, one bounded.
    pub(crate) fn sample() -> Offsets {
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
    fn positions_round_trip() {
        let offsets = sample();
        assert_eq!(decode(&encode(&offsets)).expect("decodes"), offsets);
        // An eight-byte index of the built-in sources is never read as one.
        assert!(decode(&1_u64.to_le_bytes()).is_err());
    }

    #[test]
    fn every_cut_and_flipped_byte_is_an_error_or_a_valid_position() {
        let bytes = encode(&sample());
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for index in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[index] ^= 0xFF;
            // Either an error or some position; never a panic.
            let _ = decode(&flipped);
        }
        let huge = [vec![FORMAT], u32::MAX.to_le_bytes().to_vec()].concat();
        assert!(decode(&huge).is_err());
    }
}
