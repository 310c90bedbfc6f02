//! Fuzz target for the state blob decoder: arbitrary bytes must never make
//! `decode`, `verify` or `decode_header` panic, and whatever decodes must
//! survive a re-encode.
//!
//! Random bytes almost never pass the magic and two CRC-32 checks, so the
//! first input byte picks a mode, and two modes wrap the rest of the input in
//! an envelope with honest lengths and correct checksums, which sends the
//! fuzzer's bytes straight into the schema-section and payload decoders.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use snapflow::state::blob::{self, HEADER_LEN, MAGIC};
use snapflow::state::{FieldSchema, Schema, SchemaShape, Snapshot, StateError, StoredSchema};
use std::collections::BTreeMap;

/// A state type with a byte vector, a string and nested collections, with a
/// hand-written `Snapshot` impl so the target does not depend on the derive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Journal {
    raw: Vec<u8>,
    title: String,
    batches: Vec<Vec<u32>>,
    index: BTreeMap<String, Vec<u64>>,
    cursor: Option<(i64, bool)>,
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
        let extended =
            postcard::to_extend(self, std::mem::take(out)).map_err(|error| StateError::Encode {
                type_name: "Journal",
                reason: error.to_string(),
            })?;
        *out = extended;
        Ok(())
    }

    fn decode_payload(payload: &[u8]) -> Result<Self, StateError> {
        decode_exactly(payload)
    }
}

fn decode_exactly<T: DeserializeOwned>(payload: &[u8]) -> Result<T, StateError> {
    let payload_error = |reason: String| StateError::Payload {
        type_name: "Journal",
        reason,
    };
    let (value, rest) =
        postcard::take_from_bytes(payload).map_err(|error| payload_error(error.to_string()))?;
    if !rest.is_empty() {
        return Err(payload_error(format!("{} trailing bytes", rest.len())));
    }
    Ok(value)
}

/// Wraps `schema` and `payload` in a header with honest lengths, `Journal`'s
/// version and fingerprint, and correct checksums.
fn seal(schema: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + schema.len() + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&Journal::SCHEMA.version.to_le_bytes());
    out.extend_from_slice(&Journal::fingerprint().to_le_bytes());
    out.extend_from_slice(&(schema.len() as u32).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    let mut body = schema.to_vec();
    body.extend_from_slice(payload);
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    let header_crc = crc32fast::hash(&out);
    out.extend_from_slice(&header_crc.to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// Runs every decoder on `bytes` and checks the properties that must hold
/// whatever the bytes are.
fn check(bytes: &[u8]) {
    let header = blob::decode_header(bytes);
    let verified = blob::verify(bytes);
    let decoded = blob::decode::<Journal>(bytes);
    if verified.is_ok() {
        assert!(header.is_ok(), "verify passed a blob whose header fails");
    }
    if let Ok(value) = decoded {
        assert!(verified.is_ok(), "decode passed a blob that verify rejects");
        let again = blob::encode(&value).expect("a decoded value re-encodes");
        let back = blob::decode::<Journal>(&again).expect("a re-encoded value decodes");
        assert_eq!(back, value, "decode(encode(value)) changed the value");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        check(data);
        return;
    };
    match mode % 3 {
        // The raw bytes, as storage would hand them over.
        0 => check(rest),
        // A real schema section and a fuzzed payload.
        1 => {
            let schema = postcard::to_allocvec(&StoredSchema::of(&Journal::SCHEMA))
                .expect("a schema serializes");
            check(&seal(&schema, rest));
        }
        // A fuzzed body split into schema section and payload at a point the
        // fuzzer picks.
        _ => {
            let split = usize::from(mode / 3).min(rest.len());
            let (schema, payload) = rest.split_at(split);
            check(&seal(schema, payload));
        }
    }
});
