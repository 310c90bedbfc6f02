//! Shared fixtures for the blob tests: state types with hand-written
//! `Snapshot` impls (the derive macro is developed separately, and these
//! tests must not depend on it), proptest strategies for them, and helpers
//! that forge blobs with correct checksums around arbitrary contents.
//!
//! This module never asserts anything itself; the test binaries that include
//! it do. Each binary uses a different subset, hence the `dead_code` allow.

#![allow(dead_code)]

use proptest::prelude::*;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use snapflow::state::blob::{HEADER_LEN, MAGIC};
use snapflow::state::{FieldSchema, Schema, SchemaShape, Snapshot, StateError, StoredSchema};
use std::collections::{BTreeMap, HashMap};

/// A state type with a byte vector, a string and nested collections.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Journal {
    pub raw: Vec<u8>,
    pub title: String,
    pub batches: Vec<Vec<u32>>,
    pub index: BTreeMap<String, Vec<u64>>,
    pub cursor: Option<(i64, bool)>,
}

impl Snapshot for Journal {
    const SCHEMA: Schema = Schema {
        type_name: "Journal",
        version: 3,
        shape: SchemaShape::Named(&[
            FieldSchema {
                name: "raw",
                type_name: "Vec<u8>",
            },
            FieldSchema {
                name: "title",
                type_name: "String",
            },
            FieldSchema {
                name: "batches",
                type_name: "Vec<Vec<u32>>",
            },
            FieldSchema {
                name: "index",
                type_name: "BTreeMap<String, Vec<u64>>",
            },
            FieldSchema {
                name: "cursor",
                type_name: "Option<(i64, bool)>",
            },
        ]),
    };

    fn encode_payload(&self, out: &mut Vec<u8>) -> Result<(), StateError> {
        snapflow::__private::encode_field(Self::SCHEMA.type_name, self, out)
    }

    fn decode_payload(payload: &[u8]) -> Result<Self, StateError> {
        decode_with_postcard(Self::SCHEMA.type_name, payload)
    }
}

/// A one-field state type, used where a second, different schema is needed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Counter {
    pub count: u64,
}

impl Snapshot for Counter {
    const SCHEMA: Schema = Schema {
        type_name: "Counter",
        version: 1,
        shape: SchemaShape::Named(&[FieldSchema {
            name: "count",
            type_name: "u64",
        }]),
    };

    fn encode_payload(&self, out: &mut Vec<u8>) -> Result<(), StateError> {
        snapflow::__private::encode_field(Self::SCHEMA.type_name, self, out)
    }

    fn decode_payload(payload: &[u8]) -> Result<Self, StateError> {
        decode_with_postcard(Self::SCHEMA.type_name, payload)
    }
}

/// A state type holding a `HashMap`, whose decoding preallocates from a
/// claimed length that postcard does not check against the input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table {
    pub rows: HashMap<u64, u64>,
}

impl Snapshot for Table {
    const SCHEMA: Schema = Schema {
        type_name: "Table",
        version: 1,
        shape: SchemaShape::Named(&[FieldSchema {
            name: "rows",
            type_name: "HashMap<u64, u64>",
        }]),
    };

    fn encode_payload(&self, out: &mut Vec<u8>) -> Result<(), StateError> {
        snapflow::__private::encode_field(Self::SCHEMA.type_name, self, out)
    }

    fn decode_payload(payload: &[u8]) -> Result<Self, StateError> {
        decode_with_postcard(Self::SCHEMA.type_name, payload)
    }
}

/// Decodes a whole payload as one serde value, the way derived code
/// decodes its fields (the framework's own helpers, not a copy).
fn decode_with_postcard<T: DeserializeOwned>(
    type_name: &'static str,
    mut payload: &[u8],
) -> Result<T, StateError> {
    let value = snapflow::__private::decode_field(type_name, &mut payload)?;
    snapflow::__private::finish(type_name, payload)?;
    Ok(value)
}

/// 10,000 cases per property. Failures are persisted next to the test file
/// (`<file>.regressions`), because proptest's default location expects a
/// `lib.rs` and integration tests have none.
pub fn proptest_config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("regressions"),
        )),
        ..ProptestConfig::with_cases(10_000)
    }
}

/// A small but non-trivial `Journal`, whose blob the exhaustive tests mutate.
pub fn sample_journal() -> Journal {
    Journal {
        raw: vec![0, 1, 2, 255],
        title: "orders-ü".to_string(),
        batches: vec![vec![1, 2], vec![], vec![u32::MAX]],
        index: BTreeMap::from([
            ("a".to_string(), vec![7]),
            ("b".to_string(), vec![u64::MAX, 0]),
        ]),
        cursor: Some((-5, true)),
    }
}

/// Random `Journal`s, kept small so that 10,000 cases run in about a second.
pub fn journal_strategy() -> impl Strategy<Value = Journal> {
    (
        proptest::collection::vec(any::<u8>(), 0..64),
        ".{0,16}",
        proptest::collection::vec(proptest::collection::vec(any::<u32>(), 0..8), 0..8),
        proptest::collection::btree_map(
            ".{0,8}",
            proptest::collection::vec(any::<u64>(), 0..4),
            0..6,
        ),
        any::<Option<(i64, bool)>>(),
    )
        .prop_map(|(raw, title, batches, index, cursor)| Journal {
            raw,
            title,
            batches,
            index,
            cursor,
        })
}

/// The raw fields of a forged header; `seal` turns them into a blob whose
/// header CRC is correct, so the checks behind the CRC are reached.
#[derive(Debug, Clone)]
pub struct Forge {
    pub magic: [u8; 4],
    pub format_version: u16,
    pub flags: u16,
    pub user_version: u32,
    pub fingerprint: u64,
    pub schema_len: u32,
    pub payload_len: u64,
    /// `None` computes the correct body CRC.
    pub body_crc: Option<u32>,
}

impl Forge {
    /// A forge whose lengths and versions describe `schema` and `payload`
    /// honestly, with the given stored version and fingerprint.
    pub fn honest(schema: &[u8], payload: &[u8], user_version: u32, fingerprint: u64) -> Self {
        Forge {
            magic: MAGIC,
            format_version: 1,
            flags: 0,
            user_version,
            fingerprint,
            schema_len: schema.len() as u32,
            payload_len: payload.len() as u64,
            body_crc: None,
        }
    }

    /// The header, with a correct header CRC, followed by `schema` and
    /// `payload` (whatever the length fields claim).
    pub fn seal(&self, schema: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut body = schema.to_vec();
        body.extend_from_slice(payload);
        let body_crc = self.body_crc.unwrap_or_else(|| crc32fast::hash(&body));
        let mut out = Vec::with_capacity(HEADER_LEN + body.len());
        out.extend_from_slice(&self.magic);
        out.extend_from_slice(&self.format_version.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.user_version.to_le_bytes());
        out.extend_from_slice(&self.fingerprint.to_le_bytes());
        out.extend_from_slice(&self.schema_len.to_le_bytes());
        out.extend_from_slice(&self.payload_len.to_le_bytes());
        out.extend_from_slice(&body_crc.to_le_bytes());
        let header_crc = crc32fast::hash(&out);
        out.extend_from_slice(&header_crc.to_le_bytes());
        out.extend_from_slice(&body);
        out
    }
}

/// The postcard bytes of `T`'s stored schema, as the encoder writes them.
pub fn schema_section_of<T: Snapshot>() -> Vec<u8> {
    postcard::to_allocvec(&StoredSchema::of(&T::SCHEMA)).expect("a schema always serializes")
}

/// A blob around an arbitrary schema section and payload, with honest
/// lengths and correct checksums; the version and fingerprint are `T`'s.
pub fn seal_for<T: Snapshot>(schema: &[u8], payload: &[u8]) -> Vec<u8> {
    Forge::honest(schema, payload, T::SCHEMA.version, T::fingerprint()).seal(schema, payload)
}

/// A blob carrying `T`'s real schema section and an arbitrary payload.
pub fn seal_payload_for<T: Snapshot>(payload: &[u8]) -> Vec<u8> {
    seal_for::<T>(&schema_section_of::<T>(), payload)
}
