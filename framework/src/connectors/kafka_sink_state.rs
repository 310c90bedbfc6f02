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

/// One record to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaOut {
    /// The key (it also chooses the partition when `partition` is None).
    pub key: Option<Vec<u8>>,
    /// The value.
    pub value: Vec<u8>,
    /// A partition to write to, or `None` for the producer's partitioner.
    pub partition: Option<i32>,
}

/// The state's format byte (`L`; `K` was the layout without records).
pub(crate) const STATE_FORMAT: u8 = b'L';

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
/// per record its partition `i32` (-1: none), key flag `u8`, key (`u32`
/// length and bytes, when the flag is 1) and value (`u32` length and
/// bytes).
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
            match &out.key {
                Some(key) => {
                    bytes.push(1);
                    put_bytes(&mut bytes, key);
                }
                None => bytes.push(0),
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
    match reader.u8().map_err(malformed)? {
        STATE_FORMAT => {}
        b'K' => {
            return Err(malformed(
                "written by an older snapflow whose Kafka sink kept no records",
            ))
        }
        _ => return Err(malformed("not written by the Kafka sink")),
    }
    let found = reader.u32().map_err(malformed)?;
    let opened_after = reader.u64().map_err(malformed)?;
    let count = reader.u32().map_err(malformed)?;
    let mut pending = BTreeMap::new();
    for _ in 0..count {
        let checkpoint_id = reader.u64().map_err(malformed)?;
        let id = reader.str().map_err(malformed)?;
        let header = reader.str().map_err(malformed)?;
        let records = read_records(&mut reader).map_err(malformed)?;
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

fn read_records(reader: &mut Reader<'_>) -> Result<Vec<KafkaOut>, &'static str> {
    let count = reader.u32()? as usize;
    // Each record takes at least 9 bytes, so the count cannot make this
    // allocate more than the input justifies.
    if count > reader.remaining() / 9 {
        return Err("more records than bytes");
    }
    let mut records = Vec::with_capacity(count);
    for _ in 0..count {
        let partition = reader.i32()?;
        let key = match reader.u8()? {
            0 => None,
            1 => Some(reader.bytes()?),
            _ => return Err("a key flag is neither 0 nor 1"),
        };
        records.push(KafkaOut {
            key,
            value: reader.bytes()?,
            partition: (partition >= 0).then_some(partition),
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
                    },
                    KafkaOut {
                        key: None,
                        value: Vec::new(),
                        partition: Some(2),
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
}
