//! Support code for `#[derive(Snapshot)]`. Not a public API: only generated
//! code calls these items, through `::snapflow::__private` paths, and they may
//! change in any release.
//!
//! The payload of a derived type is its stored fields, each encoded with
//! postcard one after another (an enum first writes its variant index as a
//! varint). This is exactly postcard's encoding of the equivalent tuple, but
//! it needs no serde derive on the user's type and has no arity limit.
//!
//! Generated code names every item it needs through this module (even `Vec`,
//! `Result` and `u8`), so it compiles in modules that shadow prelude names or
//! use `#![no_implicit_prelude]`. This module never does I/O and holds no
//! state; it only moves bytes between values and buffers.

use crate::state::{blob, check_exact_schema};

pub use crate::state::{
    FieldSchema, Schema, SchemaShape, Snapshot, StateError, StoredSchema, VariantSchema,
};
pub use core::convert::From;
pub use core::default::Default;
pub use core::primitive::{str, u32, u8};
pub use core::result::Result;
pub use serde::{de::DeserializeOwned, Serialize};
pub use std::vec::Vec;

/// Appends one serde field to the payload.
pub fn encode_field<T: Serialize + ?Sized>(
    type_name: &'static str,
    value: &T,
    out: &mut Vec<u8>,
) -> Result<(), StateError> {
    crate::state::append_postcard(value, out).map_err(|error| StateError::Encode {
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
    // The same bytes postcard writes for a `Vec<u8>` (varint length, then the
    // bytes), without serializing the blob one byte at a time.
    encode_field(type_name, &(bytes.len() as u64), out)?;
    out.extend_from_slice(&bytes);
    Ok(())
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
    // The derive checks this at compile time too; this guard keeps a bad
    // declaration (e.g. `upgrade_from = Self`) from recursing forever.
    if Old::SCHEMA.version >= New::SCHEMA.version {
        return Err(StateError::VersionMismatch {
            type_name: New::SCHEMA.type_name.to_string(),
            stored: stored.version,
            expected: New::SCHEMA.version,
        });
    }
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

/// Fails compilation (when evaluated in a `const` block) unless the type an
/// `upgrade_from` names has a lower version than the type upgrading from it.
/// Strictly falling versions are what make every upgrade chain finite.
pub const fn check_upgrade_versions(old_version: u32, new_version: u32) {
    if old_version >= new_version {
        panic!(
            "#[snapshot(upgrade_from = ..)] names a type whose version is not lower than \
             this type's version; each step of an upgrade chain must raise the version"
        );
    }
}

#[cfg(test)]
mod tests {
    //! The helpers' own contracts, and the derive used inside this crate
    //! (`crate = "crate"`), which is how framework modules must spell it.

    use super::*;

    #[derive(crate::Snapshot, Debug, PartialEq)]
    #[snapshot(crate = "crate")]
    struct Internal {
        count: u64,
    }

    #[derive(crate::Snapshot, Debug, PartialEq)]
    #[snapshot(crate = "crate")]
    struct Wrapper {
        #[snapshot(nested)]
        inner: Internal,
        tail: u8,
    }

    #[test]
    fn derive_works_inside_the_crate() {
        let value = Wrapper {
            inner: Internal { count: 3 },
            tail: 9,
        };
        let back: Wrapper = blob::decode(&blob::encode(&value).unwrap()).unwrap();
        assert_eq!(back, value);
    }

    #[test]
    fn nested_encoding_is_postcard_bytes_of_the_blob() {
        let value = Internal { count: 3 };
        let mut by_helper = Vec::new();
        encode_nested("Wrapper", &value, &mut by_helper).unwrap();
        let by_postcard = postcard::to_allocvec(&blob::encode(&value).unwrap()).unwrap();
        assert_eq!(by_helper, by_postcard);
        let mut input = by_helper.as_slice();
        let back: Internal = decode_nested("Wrapper", &mut input).unwrap();
        assert_eq!((back, input.len()), (value, 0));
    }

    /// Declares itself as its own older version, which the derive rejects at
    /// compile time; written by hand to reach the runtime guard.
    struct SelfUpgrade;

    impl Snapshot for SelfUpgrade {
        const SCHEMA: Schema = Schema {
            type_name: "SelfUpgrade",
            version: 2,
            shape: SchemaShape::Unit,
        };

        fn encode_payload(&self, _out: &mut Vec<u8>) -> Result<(), StateError> {
            Ok(())
        }

        fn decode_payload(payload: &[u8]) -> Result<Self, StateError> {
            finish("SelfUpgrade", payload).map(|()| SelfUpgrade)
        }

        fn decode_stored(stored: &StoredSchema, payload: &[u8]) -> Result<Self, StateError> {
            decode_with_upgrade::<Self, Self>(stored, payload)
        }
    }

    #[test]
    fn upgrade_to_itself_is_an_error_not_endless_recursion() {
        let mut stored = StoredSchema::of(&SelfUpgrade::SCHEMA);
        stored.version = 1;
        let error = SelfUpgrade::decode_stored(&stored, &[]).err().unwrap();
        assert!(
            matches!(
                error,
                StateError::VersionMismatch {
                    stored: 1,
                    expected: 2,
                    ..
                }
            ),
            "{error:?}"
        );
    }
}
