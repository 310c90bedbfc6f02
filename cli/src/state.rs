//! One part's state as `show` prints it: what the state bytes hold as far
//! as they describe themselves (the stored schema of every state blob,
//! key groups, timers), a source's position (a built-in source's index,
//! the Kafka source's next offset per partition) and a sink's state (its
//! pending transactions, the file sink's staged files), as text and as
//! JSON. Bytes in a layout nobody here knows are shown by their length
//! and CRC-32.
//!
//! It only renders what `job::inspect` describes; it never decodes a
//! layout itself, so the tool reads Kafka positions without librdkafka.

use std::fmt::Write as _;

use serde::Serialize;
use snapflow::job::inspect::{
    describe_position, OperatorRole, PartView, StoredPosition, StoredSinkState, StoredState,
};
use snapflow::keyed::part::PartDescription;
use snapflow::state::StoredSchema;

/// An operator state described without its types.
#[derive(Debug, Serialize)]
#[serde(tag = "layout", rename_all = "snake_case")]
pub enum StateRow {
    /// No state (map, filter, flat_map, the print sink).
    Empty,
    /// One state blob.
    Blob {
        /// Its stored schema.
        schema: SchemaRow,
    },
    /// Keyed state.
    Keyed {
        /// Key groups in the part.
        key_groups: usize,
        /// (key, state) entries over them.
        entries: u64,
        /// The distinct schemas of the key groups (one, unless the part
        /// is corrupt or mixes writers).
        schemas: Vec<SchemaRow>,
    },
    /// A timed keyed operator (timers, windows, state time-to-live).
    Timed {
        /// Key groups in the part.
        key_groups: usize,
        /// (key, state) entries over them: for windows, keys with open
        /// windows.
        entries: u64,
        /// Keys that have at least one timer.
        keys_with_timers: u64,
        /// The watermark the operator last saw.
        watermark_ms: Option<u64>,
        /// The distinct schemas of the user state's key groups.
        schemas: Vec<SchemaRow>,
    },
    /// A custom operator's instance.
    Operator {
        /// Whether its input had ended.
        ended: bool,
        /// The instance's stored schema.
        schema: SchemaRow,
    },
    /// A source's position.
    Source {
        /// Where the source resumes.
        position: PositionRow,
    },
    /// A sink's pending transactions (the collect and PostgreSQL sinks).
    SinkPending {
        /// The subtask that wrote it.
        subtask: u32,
        /// The checkpoints whose transactions are pre-committed and not
        /// yet committed.
        pending_checkpoints: Vec<u64>,
    },
    /// The file sink's staged files.
    SinkStagedFiles {
        /// The subtask that wrote it.
        subtask: u32,
        /// Per pending checkpoint, its staged file.
        files: Vec<StagedFileRow>,
    },
    /// The exactly-once Kafka sink's state: its pre-committed
    /// transactions, whose records it holds.
    SinkKafka {
        /// The subtask that wrote it.
        subtask: u32,
        /// The checkpoint its next transaction's id is derived from.
        opened_after: u64,
        /// The pending transactions, by checkpoint ascending.
        pending: Vec<KafkaTransactionRow>,
    },
    /// A layout this tool does not know.
    Unknown {
        /// Its length.
        bytes: usize,
        /// Its CRC-32.
        crc32: String,
    },
}

/// One pre-committed transaction of the Kafka sink.
#[derive(Debug, Serialize)]
pub struct KafkaTransactionRow {
    /// The checkpoint it was pre-committed at.
    pub checkpoint: u64,
    /// Its transactional id.
    pub transactional_id: String,
    /// The `snapflow-txn` header its records carry.
    pub header: String,
    /// How many records it holds.
    pub records: usize,
    /// Their keys' and values' bytes.
    pub record_bytes: u64,
}

/// One staged file of the file sink.
#[derive(Debug, Serialize)]
pub struct StagedFileRow {
    /// The checkpoint it was staged at.
    pub checkpoint: u64,
    /// Its size.
    pub bytes: u64,
    /// Its CRC-32.
    pub crc32: String,
}

/// A source's stored position.
#[derive(Debug, Serialize)]
#[serde(tag = "format", rename_all = "snake_case")]
pub enum PositionRow {
    /// A built-in source's one number: the next record's index (vector,
    /// iterator, generator) or the next line's byte offset (file).
    Index {
        /// The number.
        next: u64,
    },
    /// The Kafka source's partitions.
    Kafka {
        /// Per partition, the next offset (and the end, when bounded).
        partitions: Vec<KafkaPartitionRow>,
    },
    /// A layout this tool does not know (a user's source).
    Unknown {
        /// Its length.
        bytes: usize,
        /// Its CRC-32.
        crc32: String,
    },
}

/// One Kafka partition's place.
#[derive(Debug, Serialize)]
pub struct KafkaPartitionRow {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset the source reads next.
    pub next_offset: i64,
    /// A bounded source's end.
    pub end_offset: Option<i64>,
}

fn crc(crc32: u32) -> String {
    format!("{crc32:08x}")
}

fn unknown_text(bytes: usize, crc32: &str) -> String {
    format!("unknown format, {bytes} bytes, crc32 {crc32}")
}

impl PositionRow {
    /// The row of a source subtask's stored position `bytes`.
    pub fn of(bytes: &[u8]) -> PositionRow {
        match describe_position(bytes) {
            StoredPosition::Index(next) => PositionRow::Index { next },
            StoredPosition::Kafka(partitions) => PositionRow::Kafka {
                partitions: partitions
                    .into_iter()
                    .map(|place| KafkaPartitionRow {
                        topic: place.topic,
                        partition: place.partition,
                        next_offset: place.next_offset,
                        end_offset: place.end_offset,
                    })
                    .collect(),
            },
            StoredPosition::Unknown { bytes, crc32 } => PositionRow::Unknown {
                bytes,
                crc32: crc(crc32),
            },
            // `StoredPosition` may grow; what this tool does not know
            // yet is shown as unknown.
            _ => PositionRow::Unknown {
                bytes: bytes.len(),
                crc32: crc(crc32fast::hash(bytes)),
            },
        }
    }

    /// The position as text.
    pub fn text(&self) -> String {
        match self {
            PositionRow::Index { next } => format!("next record or offset {next}"),
            PositionRow::Kafka { partitions } if partitions.is_empty() => {
                "kafka: no partitions".to_string()
            }
            PositionRow::Kafka { partitions } => {
                let places: Vec<String> = partitions
                    .iter()
                    .map(|place| {
                        let mut text = format!(
                            "{}/{} -> next offset {}",
                            place.topic, place.partition, place.next_offset
                        );
                        if let Some(end) = place.end_offset {
                            let _ = write!(text, " (end {end})");
                        }
                        text
                    })
                    .collect();
                format!("kafka: {}", places.join(", "))
            }
            PositionRow::Unknown { bytes, crc32 } => unknown_text(*bytes, crc32),
        }
    }
}

impl StateRow {
    /// The row of `part`, whose operator has `role` as the checkpoint
    /// records it: a source's state is its position, a sink's its
    /// pre-committed state, any other what the bytes describe.
    pub fn of(part: &PartView, role: Option<OperatorRole>) -> StateRow {
        match role {
            Some(OperatorRole::Source) => StateRow::Source {
                position: PositionRow::of(part.state_bytes()),
            },
            Some(OperatorRole::Sink) => {
                StateRow::of_sink(part).unwrap_or_else(|| Self::stored(part))
            }
            _ => Self::stored(part),
        }
    }

    /// What the bytes describe of themselves.
    fn stored(part: &PartView) -> StateRow {
        match part.stored_state() {
            StoredState::Empty => StateRow::Empty,
            StoredState::Blob(schema) => StateRow::Blob {
                schema: SchemaRow::of(schema),
            },
            StoredState::Keyed(groups) => StateRow::Keyed {
                key_groups: groups.len(),
                entries: entries(&groups),
                schemas: schemas(&groups),
            },
            StoredState::Timed {
                state,
                timers,
                watermark_ms,
            } => StateRow::Timed {
                key_groups: state.len(),
                entries: entries(&state),
                keys_with_timers: entries(&timers),
                watermark_ms,
                schemas: schemas(&state),
            },
            StoredState::Operator { ended, schema } => StateRow::Operator {
                ended,
                schema: SchemaRow::of(schema),
            },
            // Opaque bytes, and what `StoredState` may grow to.
            _ => {
                let bytes = part.state_bytes();
                StateRow::Unknown {
                    bytes: bytes.len(),
                    crc32: crc(crc32fast::hash(bytes)),
                }
            }
        }
    }

    /// A sink's state in a layout of the built-in sinks; `None` for no
    /// bytes or another layout (a user's sink may store a blob).
    fn of_sink(part: &PartView) -> Option<StateRow> {
        Some(match part.stored_sink_state()? {
            StoredSinkState::Pending {
                subtask,
                checkpoint_ids,
            } => StateRow::SinkPending {
                subtask,
                pending_checkpoints: checkpoint_ids,
            },
            StoredSinkState::StagedFiles { subtask, files } => StateRow::SinkStagedFiles {
                subtask,
                files: files
                    .into_iter()
                    .map(|file| StagedFileRow {
                        checkpoint: file.checkpoint_id,
                        bytes: file.size_bytes,
                        crc32: crc(file.crc32),
                    })
                    .collect(),
            },
            StoredSinkState::Kafka {
                subtask,
                opened_after,
                pending,
            } => StateRow::SinkKafka {
                subtask,
                opened_after,
                pending: pending
                    .into_iter()
                    .map(|txn| KafkaTransactionRow {
                        checkpoint: txn.checkpoint_id,
                        transactional_id: txn.transactional_id,
                        header: txn.header,
                        records: txn.records,
                        record_bytes: txn.record_bytes,
                    })
                    .collect(),
            },
            _ => return None,
        })
    }

    /// The state as text.
    pub fn text(&self) -> String {
        match self {
            StateRow::Empty => "no state".to_string(),
            StateRow::Blob { schema } => format!("blob {}", schema.text()),
            StateRow::Keyed {
                key_groups,
                entries,
                schemas,
            } => format!(
                "keyed: {key_groups} key groups, {entries} entries, {}",
                schemas_text(schemas)
            ),
            StateRow::Timed {
                key_groups,
                entries,
                keys_with_timers,
                watermark_ms,
                schemas,
            } => {
                let watermark = watermark_ms.map_or("none".to_string(), |ms| ms.to_string());
                format!(
                    "timed: {key_groups} key groups, {entries} entries, {keys_with_timers} keys \
                     with timers, watermark {watermark}, {}",
                    schemas_text(schemas)
                )
            }
            StateRow::Operator { ended, schema } => {
                format!("operator (input ended: {ended}) {}", schema.text())
            }
            StateRow::Source { position } => format!("source position: {}", position.text()),
            StateRow::SinkPending {
                subtask,
                pending_checkpoints,
            } => format!(
                "sink state of subtask {subtask}: pending checkpoints {}",
                ids_text(pending_checkpoints)
            ),
            StateRow::SinkStagedFiles { subtask, files } => {
                let files: Vec<String> = files
                    .iter()
                    .map(|file| {
                        format!(
                            "checkpoint {} ({} bytes, crc32 {})",
                            file.checkpoint, file.bytes, file.crc32
                        )
                    })
                    .collect();
                let files = match files.is_empty() {
                    true => "none".to_string(),
                    false => files.join(", "),
                };
                format!("file sink state of subtask {subtask}: staged files {files}")
            }
            StateRow::SinkKafka {
                subtask,
                opened_after,
                pending,
            } => {
                let pending: Vec<String> = pending
                    .iter()
                    .map(|txn| {
                        format!(
                            "checkpoint {} as {} ({} records, {} bytes)",
                            txn.checkpoint, txn.header, txn.records, txn.record_bytes
                        )
                    })
                    .collect();
                let pending = match pending.is_empty() {
                    true => "none".to_string(),
                    false => pending.join(", "),
                };
                format!(
                    "Kafka sink state of subtask {subtask}: next transaction after checkpoint \
                     {opened_after}, pending transactions {pending}"
                )
            }
            StateRow::Unknown { bytes, crc32 } => unknown_text(*bytes, crc32),
        }
    }
}

fn ids_text(ids: &[u64]) -> String {
    if ids.is_empty() {
        return "none".to_string();
    }
    let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
    ids.join(", ")
}

fn schemas_text(schemas: &[SchemaRow]) -> String {
    let schemas: Vec<String> = schemas.iter().map(SchemaRow::text).collect();
    schemas.join("; ")
}

/// The entries over key groups.
fn entries(groups: &[PartDescription]) -> u64 {
    groups.iter().map(|group| group.entries).sum()
}

/// The distinct schemas of key groups, in order of first appearance (one,
/// unless the part is corrupt or mixes writers).
fn schemas(groups: &[PartDescription]) -> Vec<SchemaRow> {
    let mut schemas: Vec<SchemaRow> = Vec::new();
    for group in groups {
        let schema = SchemaRow::of(group.schema.clone());
        if !schemas.contains(&schema) {
            schemas.push(schema);
        }
    }
    schemas
}

/// A state blob's stored schema.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct SchemaRow {
    /// The writer's type name.
    pub type_name: String,
    /// The writer's version.
    pub version: u32,
    /// `name: type` lines.
    pub fields: Vec<String>,
}

impl SchemaRow {
    fn of(schema: StoredSchema) -> SchemaRow {
        SchemaRow {
            type_name: schema.type_name,
            version: schema.version,
            fields: schema.fields,
        }
    }

    fn text(&self) -> String {
        format!(
            "{} v{} {{ {} }}",
            self.type_name,
            self.version,
            self.fields.join(", ")
        )
    }
}
