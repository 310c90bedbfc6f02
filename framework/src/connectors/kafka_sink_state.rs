//! The exactly-once Kafka sink's state in a checkpoint: the name of the
//! next transaction and every pre-committed transaction with its
//! records, so that a restore in a new process can write them again when
//! the dead process never committed them.
//!
//! This module owns the byte layout, its bounds-checked decoding, and the
//! record type it holds ([`KafkaOut`], re-exported as
//! `connectors::kafka::KafkaOut`). It is compiled without the `kafka`
//! feature, so that a reader of stored checkpoints (`job::inspect`, the
//! `snapflow` tool) lists a Kafka sink's pending transactions without
//! building librdkafka. It never talks to the broker and never decides
//! what to commit (`kafka/sink.rs` and `kafka/recover.rs` do).

use std::collections::BTreeMap;

use super::bytes::{put_str, Reader};
use crate::sink::{SinkError, SinkState};

/// One record to produce: `KafkaOut { key: Some(key), timestamp_ms:
/// Some(ms), ..KafkaOut::new(value) }` sets what a record needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KafkaOut {
    /// The key (it also chooses the partition when `partition` is None).
    pub key: Option<Vec<u8>>,
    /// The value.
    pub value: Vec<u8>,
    /// A partition to write to, or `None` for the producer's partitioner.
    pub partition: Option<i32>,
    /// The record's timestamp in milliseconds since the epoch (Kafka's
    /// `CreateTime`), e.g. its event time; `None`: the sink factory's
    /// event-time function gives it (`KafkaSinkFactory::with_event_time`),
    /// else the producer stamps the time it sends the record. A topic
    /// set to `LogAppendTime` replaces it with the broker's time.
    pub timestamp_ms: Option<u64>,
}

impl KafkaOut {
    /// A record of `value` without key, partition or timestamp.
    // Without the `kafka` feature this module only serves readers of
    // stored states, which never build a record.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub fn new(value: Vec<u8>) -> KafkaOut {
        KafkaOut {
            value,
            ..KafkaOut::default()
        }
    }
}

/// The state's format byte (`M`; `L` was the layout without timestamps,
/// still read; `K` the layout without records).
pub(crate) const STATE_FORMAT: u8 = b'M';
/// The layout before records had timestamps: its key flag is 0 or 1.
const STATE_FORMAT_UNTIMED: u8 = b'L';
/// Bits of a record's flags byte: a key follows; a timestamp follows.
const HAS_KEY: u8 = 1;
const HAS_TIMESTAMP: u8 = 2;

/// One pre-committed transaction as the state lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingTxn {
    /// Its transactional id.
    pub(crate) id: String,
    /// The `snapflow-txn` header value its records carry.
    pub(crate) header: String,
    /// Its records, in the order they were sent.
    pub(crate) records: Vec<KafkaOut>,
}

/// What the state holds: the checkpoint the next transaction is named
/// after, and the pending transactions by the checkpoint they were
/// pre-committed at.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct TxnState {
    pub(crate) opened_after: u64,
    pub(crate) pending: BTreeMap<u64, PendingTxn>,
}

/// Layout (little-endian): `L`, subtask `u32`, next name `u64`, count
/// `u32`, then per pending transaction its checkpoint id `u64`, id and
/// header (`u16` length and UTF-8 bytes each), record count `u32`, and
/// per record its partition `i32` (-1: none), flags `u8` (bit 0: a
/// key, bit 1: a timestamp), the timestamp `u64` (when bit 1), the key
/// (`u32` length and bytes, when bit 0) and the value (`u32` length and
/// bytes). Layout `L` is the same without timestamps (flags 0 or 1).
// The sink writes and reads it; without the feature only `decode_any` runs.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub(crate) fn encode(
    subtask: usize,
    opened_after: u64,
    pending: &BTreeMap<u64, PendingTxn>,
) -> SinkState {
    let records: usize = pending
        .values()
        .flat_map(|txn| &txn.records)
        .map(|out| 13 + out.key.as_ref().map_or(0, Vec::len) + out.value.len())
        .sum();
    let mut bytes = Vec::with_capacity(17 + pending.len() * 128 + records);
    bytes.push(STATE_FORMAT);
    bytes.extend_from_slice(&u32::try_from(subtask).unwrap_or(u32::MAX).to_le_bytes());
    bytes.extend_from_slice(&opened_after.to_le_bytes());
    put_u32_len(&mut bytes, pending.len());
    for (checkpoint_id, txn) in pending {
        bytes.extend_from_slice(&checkpoint_id.to_le_bytes());
        put_str(&mut bytes, &txn.id);
        put_str(&mut bytes, &txn.header);
        put_u32_len(&mut bytes, txn.records.len());
        for out in &txn.records {
            bytes.extend_from_slice(&out.partition.unwrap_or(-1).to_le_bytes());
            let key_flag = if out.key.is_some() { HAS_KEY } else { 0 };
            let timestamp_flag = if out.timestamp_ms.is_some() {
                HAS_TIMESTAMP
            } else {
                0
            };
            bytes.push(key_flag | timestamp_flag);
            if let Some(timestamp_ms) = out.timestamp_ms {
                bytes.extend_from_slice(&timestamp_ms.to_le_bytes());
            }
            if let Some(key) = &out.key {
                put_bytes(&mut bytes, key);
            }
            put_bytes(&mut bytes, &out.value);
        }
    }
    SinkState::from_bytes(bytes)
}

#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
fn put_u32_len(bytes: &mut Vec<u8>, length: usize) {
    // A length past u32::MAX cannot occur: a record or a transaction that
    // large does not fit a Kafka request, and the state would be refused
    // long before by the store.
    bytes.extend_from_slice(&u32::try_from(length).unwrap_or(u32::MAX).to_le_bytes());
}

#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
fn put_bytes(bytes: &mut Vec<u8>, value: &[u8]) {
    put_u32_len(bytes, value.len());
    bytes.extend_from_slice(value);
}

/// Reads [`encode`]'s bytes; checks every length against the bytes that
/// remain before it allocates.
///
/// # Errors
///
/// [`SinkError::MalformedState`] for bytes this sink did not write,
/// [`SinkError::WrongSubtask`] for another subtask's state.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub(crate) fn decode(state: &SinkState, subtask: usize) -> Result<TxnState, SinkError> {
    let (found, decoded) = decode_any(state.as_bytes())?;
    if found as usize != subtask {
        return Err(SinkError::WrongSubtask {
            expected: subtask,
            found,
        });
    }
    Ok(decoded)
}

/// Reads [`encode`]'s bytes, whichever subtask wrote them: that subtask
/// and the state.
///
/// # Errors
///
/// [`SinkError::MalformedState`] for bytes this sink did not write.
pub(crate) fn decode_any(state: &[u8]) -> Result<(u32, TxnState), SinkError> {
    let malformed = |reason: &str| SinkError::MalformedState {
        reason: format!("Kafka sink state: {reason}"),
    };
    let mut reader = Reader::new(state);
    let flags_allowed = match reader.u8().map_err(malformed)? {
        STATE_FORMAT => HAS_KEY | HAS_TIMESTAMP,
        STATE_FORMAT_UNTIMED => HAS_KEY,
        b'K' => {
            return Err(malformed(
                "written by an older snapflow whose Kafka sink kept no records",
            ))
        }
        _ => return Err(malformed("not written by the Kafka sink")),
    };
    let found = reader.u32().map_err(malformed)?;
    let opened_after = reader.u64().map_err(malformed)?;
    let count = reader.u32().map_err(malformed)?;
    let mut pending = BTreeMap::new();
    for _ in 0..count {
        let checkpoint_id = reader.u64().map_err(malformed)?;
        let id = reader.str().map_err(malformed)?;
        let header = reader.str().map_err(malformed)?;
        let records = read_records(&mut reader, flags_allowed).map_err(malformed)?;
        pending.insert(
            checkpoint_id,
            PendingTxn {
                id,
                header,
                records,
            },
        );
    }
    reader.finish().map_err(malformed)?;
    Ok((
        found,
        TxnState {
            opened_after,
            pending,
        },
    ))
}

fn read_records(reader: &mut Reader<'_>, flags_allowed: u8) -> Result<Vec<KafkaOut>, &'static str> {
    let count = reader.u32()? as usize;
    // Each record takes at least 9 bytes, so the count cannot make this
    // allocate more than the input justifies.
    if count > reader.remaining() / 9 {
        return Err("more records than bytes");
    }
    let mut records = Vec::with_capacity(count);
    for _ in 0..count {
        let partition = reader.i32()?;
        let flags = reader.u8()?;
        if flags & !flags_allowed != 0 {
            return Err("a record's flags have unknown bits");
        }
        let timestamp_ms = match flags & HAS_TIMESTAMP {
            0 => None,
            _ => Some(reader.u64()?),
        };
        let key = match flags & HAS_KEY {
            0 => None,
            _ => Some(reader.bytes()?),
        };
        records.push(KafkaOut {
            key,
            value: reader.bytes()?,
            partition: (partition >= 0).then_some(partition),
            timestamp_ms,
        });
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TxnState {
        let mut pending = BTreeMap::new();
        pending.insert(
            4,
            PendingTxn {
                id: "snapflow.j.out-1-2".to_owned(),
                header: "snapflow.j.out-1-2#7.0".to_owned(),
                records: vec![
                    KafkaOut {
                        key: Some(b"k".to_vec()),
                        value: b"v".to_vec(),
                        partition: None,
                        timestamp_ms: Some(1_700_000_000_123),
                    },
                    KafkaOut {
                        key: None,
                        value: Vec::new(),
                        partition: Some(2),
                        timestamp_ms: None,
                    },
                ],
            },
        );
        pending.insert(
            5,
            PendingTxn {
                id: "snapflow.j.out-1-4".to_owned(),
                header: "snapflow.j.out-1-4#7.1".to_owned(),
                records: Vec::new(),
            },
        );
        TxnState {
            opened_after: 5,
            pending,
        }
    }

    #[test]
    fn the_state_round_trips_and_hostile_bytes_are_typed_errors() {
        let sample = sample();
        let state = encode(1, sample.opened_after, &sample.pending);
        assert_eq!(decode(&state, 1).expect("decodes"), sample);
        assert!(matches!(
            decode(&state, 0),
            Err(SinkError::WrongSubtask { .. })
        ));
        let bytes = state.as_bytes();
        for cut in 0..bytes.len() {
            let cut_state = SinkState::from_bytes(bytes[..cut].to_vec());
            assert!(decode(&cut_state, 1).is_err(), "cut at {cut}");
        }
        let huge = [
            vec![STATE_FORMAT],
            vec![1, 0, 0, 0],
            vec![0; 8],
            u32::MAX.to_le_bytes().to_vec(),
        ]
        .concat();
        assert!(decode(&SinkState::from_bytes(huge), 1).is_err());
        let mut old = bytes.to_vec();
        old[0] = b'K';
        let error = decode(&SinkState::from_bytes(old), 1).expect_err("the old layout");
        assert!(error.to_string().contains("older"), "{error}");
    }

    /// A state of layout `L` (before timestamps) still reads, with no
    /// timestamps; a timestamp flag in it is refused.
    #[test]
    fn a_state_written_before_timestamps_still_reads() {
        let mut untimed = sample();
        for txn in untimed.pending.values_mut() {
            for out in &mut txn.records {
                out.timestamp_ms = None;
            }
        }
        let state = encode(1, untimed.opened_after, &untimed.pending);
        let mut old = state.as_bytes().to_vec();
        old[0] = STATE_FORMAT_UNTIMED;
        assert_eq!(
            decode(&SinkState::from_bytes(old), 1).expect("layout L"),
            untimed
        );
        let timed = sample();
        let mut forged = encode(1, timed.opened_after, &timed.pending)
            .as_bytes()
            .to_vec();
        forged[0] = STATE_FORMAT_UNTIMED;
        assert!(decode(&SinkState::from_bytes(forged), 1).is_err());
    }
}
