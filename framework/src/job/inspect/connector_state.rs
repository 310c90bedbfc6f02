//! A source's position and a sink's state described without their types,
//! for tools that show a checkpoint (the `snapflow` command-line tool):
//! the built-in sources' index or offset, the Kafka source's offsets per
//! partition, and the built-in sinks' pending transactions.
//!
//! It reads each layout only through the decoder next to its writer
//! (`SourcePosition::to_index`, `connectors::kafka_position`,
//! `PendingTransactions::decode`, the file sink's staged-files state,
//! `connectors::kafka_sink_state`), so
//! a layout is written down once, and it needs no connector feature:
//! Kafka positions read without librdkafka. Bytes in a layout it does
//! not know are described by their length and CRC-32, never guessed at.
//! It never decodes a user's state.

use crate::connectors::{kafka_position, kafka_sink_state};
use crate::sink::{decode_staged, PendingTransactions, SinkState};
use crate::source::SourcePosition;

/// What an operator is to a tool reading its parts: a source (its state
/// is its position) or a sink (its state is what it pre-committed).
/// Every checkpoint records its sources and sinks in its user metadata,
/// under `snapflow.role.<operator>`; an operator in between has no role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OperatorRole {
    /// It has no input.
    Source,
    /// It has inputs and no output.
    Sink,
}

impl OperatorRole {
    /// `source` or `sink`, as the metadata stores it.
    pub fn name(self) -> &'static str {
        match self {
            OperatorRole::Source => "source",
            OperatorRole::Sink => "sink",
        }
    }

    /// The role a metadata value names.
    pub fn parse(name: &str) -> Option<OperatorRole> {
        match name {
            "source" => Some(OperatorRole::Source),
            "sink" => Some(OperatorRole::Sink),
            _ => None,
        }
    }
}

/// The user-metadata key of `operator`'s role.
pub(crate) fn role_key(operator: &str) -> String {
    format!("snapflow.role.{operator}")
}

/// One Kafka partition's place in a stored source position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaPartitionPosition {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset of the next record the source reads.
    pub next_offset: i64,
    /// A bounded source's end offset (records from it on are not read).
    pub end_offset: Option<i64>,
}

/// What a source subtask's stored position holds, as far as its layout
/// is known.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoredPosition {
    /// One number, as the built-in sources store it
    /// ([`SourcePosition::from_index`]): the index of the next record
    /// (vector, iterator and generator sources) or the byte offset of the
    /// next line (the file source).
    Index(u64),
    /// The Kafka source's next offset (and end, when bounded) per
    /// partition, in topic and partition order.
    Kafka(Vec<KafkaPartitionPosition>),
    /// A layout this reader does not know (a user's source).
    Unknown {
        /// The length of the bytes.
        bytes: usize,
        /// Their CRC-32.
        crc32: u32,
    },
}

/// What a sink subtask's stored state holds, as far as its layout is
/// known.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoredSinkState {
    /// The ids of the checkpoints whose transactions were pre-committed
    /// and not yet committed ([`PendingTransactions`]: the collect and
    /// PostgreSQL sinks).
    Pending {
        /// The subtask that wrote it.
        subtask: u32,
        /// The pending checkpoints' ids, ascending.
        checkpoint_ids: Vec<u64>,
    },
    /// The file sink's staged files: per pending checkpoint the size and
    /// CRC-32 of its file.
    StagedFiles {
        /// The subtask that wrote it.
        subtask: u32,
        /// The staged files, by checkpoint id ascending.
        files: Vec<StagedFile>,
    },
    /// The exactly-once Kafka sink's state: the checkpoint its next
    /// transaction is named after, and its pre-committed transactions
    /// (whose records it holds, to write them again after a crash).
    Kafka {
        /// The subtask that wrote it.
        subtask: u32,
        /// The checkpoint the next transaction's id is derived from.
        opened_after: u64,
        /// The pending transactions, by checkpoint id ascending.
        pending: Vec<KafkaPendingTransaction>,
    },
    /// A layout this reader does not know (a user's sink).
    Unknown {
        /// The length of the bytes.
        bytes: usize,
        /// Their CRC-32.
        crc32: u32,
    },
}

/// One pre-committed transaction in the Kafka sink's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaPendingTransaction {
    /// The checkpoint it was pre-committed at.
    pub checkpoint_id: u64,
    /// Its transactional id.
    pub transactional_id: String,
    /// The `snapflow-txn` header its records carry.
    pub header: String,
    /// How many records it holds.
    pub records: usize,
    /// Their keys' and values' bytes.
    pub record_bytes: u64,
}

/// One staged file of the file sink's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagedFile {
    /// The checkpoint it was staged at.
    pub checkpoint_id: u64,
    /// Its size as staged.
    pub size_bytes: u64,
    /// Its CRC-32 as staged.
    pub crc32: u32,
}

/// Describes a source subtask's stored position.
pub fn describe_position(position: &[u8]) -> StoredPosition {
    if let Ok(index) = SourcePosition::from_bytes(position.to_vec()).to_index() {
        return StoredPosition::Index(index);
    }
    if let Ok(offsets) = kafka_position::decode(position) {
        return StoredPosition::Kafka(
            offsets
                .into_iter()
                .map(|((topic, partition), place)| KafkaPartitionPosition {
                    topic,
                    partition,
                    next_offset: place.next,
                    end_offset: place.end,
                })
                .collect(),
        );
    }
    StoredPosition::Unknown {
        bytes: position.len(),
        crc32: crc32fast::hash(position),
    }
}

/// Describes a sink subtask's stored state; `None` for no bytes (a sink
/// that keeps nothing, such as the print sink).
pub fn describe_sink_state(state: &[u8]) -> Option<StoredSinkState> {
    if state.is_empty() {
        return None;
    }
    let sink_state = SinkState::from_bytes(state.to_vec());
    if let Ok(staged) = decode_staged(&sink_state) {
        return Some(StoredSinkState::StagedFiles {
            subtask: staged.subtask,
            files: staged
                .files
                .into_iter()
                .map(|(checkpoint_id, digest)| {
                    let digest = digest.unwrap_or_default();
                    StagedFile {
                        checkpoint_id,
                        size_bytes: digest.size_bytes,
                        crc32: digest.crc32,
                    }
                })
                .collect(),
        });
    }
    if let Ok(pending) = PendingTransactions::decode(&sink_state) {
        return Some(StoredSinkState::Pending {
            subtask: pending.subtask,
            checkpoint_ids: pending.checkpoint_ids,
        });
    }
    if let Ok((subtask, decoded)) = kafka_sink_state::decode_any(state) {
        return Some(StoredSinkState::Kafka {
            subtask,
            opened_after: decoded.opened_after,
            pending: decoded
                .pending
                .into_iter()
                .map(|(checkpoint_id, txn)| KafkaPendingTransaction {
                    checkpoint_id,
                    records: txn.records.len(),
                    record_bytes: txn
                        .records
                        .iter()
                        .map(|out| (out.key.as_ref().map_or(0, Vec::len) + out.value.len()) as u64)
                        .sum(),
                    transactional_id: txn.id,
                    header: txn.header,
                })
                .collect(),
        });
    }
    Some(StoredSinkState::Unknown {
        bytes: state.len(),
        crc32: crc32fast::hash(state),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::{encode_staged, Digest, StagedFiles};

    #[test]
    fn positions_of_every_layout_describe_themselves() {
        assert_eq!(
            describe_position(SourcePosition::from_index(42).as_bytes()),
            StoredPosition::Index(42)
        );
        let kafka = kafka_position::encode(&kafka_position::tests::sample());
        let StoredPosition::Kafka(partitions) = describe_position(&kafka) else {
            panic!("a Kafka position");
        };
        assert_eq!(partitions.len(), 2);
        assert_eq!(
            partitions[1],
            KafkaPartitionPosition {
                topic: "in".into(),
                partition: 3,
                next_offset: 0,
                end_offset: Some(12),
            }
        );
        let other = [7_u8; 5];
        assert_eq!(
            describe_position(&other),
            StoredPosition::Unknown {
                bytes: 5,
                crc32: crc32fast::hash(&other),
            }
        );
    }

    #[test]
    fn sink_states_of_every_layout_describe_themselves() {
        assert_eq!(describe_sink_state(&[]), None);
        let pending = PendingTransactions {
            subtask: 2,
            checkpoint_ids: vec![4, 5],
        }
        .encode();
        assert_eq!(
            describe_sink_state(pending.as_bytes()),
            Some(StoredSinkState::Pending {
                subtask: 2,
                checkpoint_ids: vec![4, 5],
            })
        );
        let digest = Digest {
            size_bytes: 10,
            crc32: 0xabcd,
        };
        let staged = encode_staged(&StagedFiles {
            subtask: 1,
            files: vec![(9, Some(digest))],
        });
        assert_eq!(
            describe_sink_state(staged.as_bytes()),
            Some(StoredSinkState::StagedFiles {
                subtask: 1,
                files: vec![StagedFile {
                    checkpoint_id: 9,
                    size_bytes: 10,
                    crc32: 0xabcd,
                }],
            })
        );
        let mut pending = std::collections::BTreeMap::new();
        pending.insert(
            4,
            kafka_sink_state::PendingTxn {
                id: "snapflow.j.out-1-3".to_owned(),
                header: "snapflow.j.out-1-3#9".to_owned(),
                records: vec![kafka_sink_state::KafkaOut {
                    key: Some(b"k".to_vec()),
                    value: b"v:1".to_vec(),
                    partition: None,
                    timestamp_ms: None,
                }],
            },
        );
        let kafka = kafka_sink_state::encode(1, 4, &pending);
        assert_eq!(
            describe_sink_state(kafka.as_bytes()),
            Some(StoredSinkState::Kafka {
                subtask: 1,
                opened_after: 4,
                pending: vec![KafkaPendingTransaction {
                    checkpoint_id: 4,
                    transactional_id: "snapflow.j.out-1-3".to_owned(),
                    header: "snapflow.j.out-1-3#9".to_owned(),
                    records: 1,
                    record_bytes: 4,
                }],
            })
        );
        // A cut Kafka state is not guessed at.
        assert!(matches!(
            describe_sink_state(&kafka.as_bytes()[..kafka.as_bytes().len() - 1]),
            Some(StoredSinkState::Unknown { .. })
        ));
        assert!(matches!(
            describe_sink_state(&[0xff; 4]),
            Some(StoredSinkState::Unknown { bytes: 4, .. })
        ));
    }
}
