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
//! the next offset `i64` and the end offset `i64` (`-1`: unbounded;
//! `-2`: bounded, but the end the broker gave proved wrong, so the
//! partition is read until the broker has nothing more; a reader older
//! than this value rejects it rather than misread it).
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
    /// Whether a record at or past `end` came, which proves the broker's
    /// end wrong (tansu's latest offset counts batches): the partition is
    /// then read until the broker says it has nothing more, and `end`
    /// no longer bounds it.
    pub(crate) reads_on: bool,
}

/// The stored end of a partition that reads on past a wrong end.
const READS_ON: i64 = -2;

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
        let end = match (place.reads_on, place.end) {
            (true, _) => READS_ON,
            (false, Some(end)) => end,
            (false, None) => -1,
        };
        bytes.extend_from_slice(&end.to_le_bytes());
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
        if partition < 0 || next < 0 || end < READS_ON {
            return Err("a negative partition or offset");
        }
        let place = PartitionOffsets {
            next,
            end: match end {
                -1 => None,
                READS_ON => Some(next),
                _ => Some(end),
            },
            reads_on: end == READS_ON,
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
        offsets.insert(
            ("in".into(), 0),
            PartitionOffsets {
                next: 7,
                end: None,
                reads_on: false,
            },
        );
        offsets.insert(
            ("in".into(), 3),
            PartitionOffsets {
                next: 0,
                end: Some(12),
                reads_on: false,
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

    /// A partition reading on past a wrong end keeps doing so after a
    /// restore, and its stored end is one an older reader rejects.
    #[test]
    fn a_partition_reading_on_round_trips() {
        let mut offsets = sample();
        let on = PartitionOffsets {
            next: 30,
            end: Some(30),
            reads_on: true,
        };
        offsets.insert(("in".into(), 4), on);
        let bytes = encode(&offsets);
        assert_eq!(decode(&bytes).expect("decodes")[&("in".into(), 4)], on);
        assert_eq!(&bytes[bytes.len() - 8..], &(-2_i64).to_le_bytes());
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
