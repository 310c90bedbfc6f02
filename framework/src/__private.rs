//! Support code for `#[derive(Snapshot)]`. Not a public API: only generated
//! code calls these items, through `::snapflow::__private` paths, and they may
//! change in any release.
//!
//! The payload of a derived type is its stored fields, each encoded with
//! postcard one after another (an enum first writes its variant index as a
//! varint). This is exactly postcard's encoding of the equivalent tuple, but
//! it needs no serde derive on the user's type and has no arity limit.

use crate::state::{blob, check_exact_schema, Snapshot, StateError, StoredSchema};
use serde::{de::DeserializeOwned, Serialize};

pub use crate::state::{FieldSchema, Schema, SchemaShape, VariantSchema};
pub use core::convert::From;
pub use core::default::Default;
pub use core::result::Result;
pub use std::vec::Vec;

/// Appends one serde field to the payload.
pub fn encode_field<T: Serialize + ?Sized>(
    type_name: &'static str,
    value: &T,
    out: &mut Vec<u8>,
) -> Result<(), StateError> {
    postcard::to_extend(value, core::mem::take(out))
        .map(|extended| *out = extended)
        .map_err(|error| StateError::Encode {
            type_name,
            reason: error.to_string(),
        })
}

/// Decodes one serde field from the front of `input` and advances it.
pub fn decode_field<T: DeserializeOwned>(
    type_name: &'static str,
    input: &mut &[u8],
) -> Result<T, StateError> {
    let (value, rest) =
        postcard::take_from_bytes::<T>(input).map_err(|error| StateError::Payload {
            type_name,
            reason: error.to_string(),
        })?;
    *input = rest;
    Ok(value)
}

/// Appends a nested `Snapshot` field as a complete, length-prefixed blob, so
/// that the nested type keeps its own version and upgrade chain.
pub fn encode_nested<T: Snapshot>(
    type_name: &'static str,
    value: &T,
    out: &mut Vec<u8>,
) -> Result<(), StateError> {
    let bytes = blob::encode(value)?;
    encode_field(type_name, &bytes, out)
}

/// Decodes a nested `Snapshot` field written by [`encode_nested`].
pub fn decode_nested<T: Snapshot>(
    type_name: &'static str,
    input: &mut &[u8],
) -> Result<T, StateError> {
    let (length, rest) =
        postcard::take_from_bytes::<u64>(input).map_err(|error| StateError::Payload {
            type_name,
            reason: error.to_string(),
        })?;
    let length = usize::try_from(length)
        .ok()
        .filter(|length| *length <= rest.len())
        .ok_or_else(|| StateError::Payload {
            type_name,
            reason: format!(
                "nested blob claims {length} bytes but only {} remain",
                rest.len()
            ),
        })?;
    let (nested, rest) = rest.split_at(length);
    *input = rest;
    blob::decode(nested)
}

/// Encodes an enum variant index.
pub fn encode_variant(
    type_name: &'static str,
    index: u32,
    out: &mut Vec<u8>,
) -> Result<(), StateError> {
    encode_field(type_name, &index, out)
}

/// Decodes an enum variant index.
pub fn decode_variant(type_name: &'static str, input: &mut &[u8]) -> Result<u32, StateError> {
    decode_field::<u32>(type_name, input)
}

/// The error for a variant index that the type does not have.
pub fn unknown_variant(type_name: &'static str, index: u32) -> StateError {
    StateError::Payload {
        type_name,
        reason: format!("unknown variant index {index}"),
    }
}

/// Checks that a payload was consumed to its end.
pub fn finish(type_name: &'static str, rest: &[u8]) -> Result<(), StateError> {
    if rest.is_empty() {
        Ok(())
    } else {
        Err(StateError::Payload {
            type_name,
            reason: format!("{} trailing bytes after the last field", rest.len()),
        })
    }
}

/// `decode_stored` for a type declared with `upgrade_from = Old`: the current
/// version decodes directly; an older one is decoded as `Old` (which follows
/// its own chain) and converted with `From`. A version mismatch reported deep
/// in the chain is reworded to name the newest type and version, because that
/// is what the user asked to restore.
pub fn decode_with_upgrade<New, Old>(
    stored: &StoredSchema,
    payload: &[u8],
) -> Result<New, StateError>
where
    New: Snapshot + From<Old>,
    Old: Snapshot,
{
    if stored.version >= New::SCHEMA.version {
        check_exact_schema::<New>(stored)?;
        return New::decode_payload(payload);
    }
    match Old::decode_stored(stored, payload) {
        Ok(old) => Ok(New::from(old)),
        Err(StateError::VersionMismatch { stored, .. }) => Err(StateError::VersionMismatch {
            type_name: New::SCHEMA.type_name.to_string(),
            stored,
            expected: New::SCHEMA.version,
        }),
        Err(other) => Err(other),
    }
}
