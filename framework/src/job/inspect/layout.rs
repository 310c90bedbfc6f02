//! An operator state described without its types: what a tool that has
//! no access to the job's code (the `snapflow` command-line tool) can
//! still say about a part, such as the stored schema of every state
//! blob, which is self-describing.
//!
//! It only reads bytes the store already verified, through the decoders
//! next to their writers; it never decodes a user's state.

use crate::keyed::part::{describe, PartDescription};
use crate::state::{blob, StoredSchema};

use crate::job::ops::{decode_keyed_state, decode_operator_part};
use crate::job::timed_layout::timed_state_pieces;

/// What an operator's state bytes hold, as far as they describe
/// themselves.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoredState {
    /// No bytes (map, filter, flat_map).
    Empty,
    /// One state blob.
    Blob(StoredSchema),
    /// Keyed state: one part per key group of the subtask's range.
    Keyed(Vec<PartDescription>),
    /// A timed keyed operator's state (`process_with_timers`, windows,
    /// state time-to-live): the user's keyed state (for a window operator,
    /// each key's open windows), the timers as keyed state of their own
    /// (an entry is one key's timers; how many timers a key has is inside
    /// the entry, which needs the key's type to read), and the watermark
    /// the operator last saw.
    Timed {
        /// The user's keyed state: one part per key group.
        state: Vec<PartDescription>,
        /// The timers: one part per key group, one entry per key that has
        /// a timer.
        timers: Vec<PartDescription>,
        /// The watermark the operator last saw, if any.
        watermark_ms: Option<u64>,
    },
    /// A custom operator's instance, as a blob behind its header.
    Operator {
        /// Whether its input had ended.
        ended: bool,
        /// The instance's stored schema.
        schema: StoredSchema,
    },
    /// Bytes in a layout only their writer reads: a source's position, a
    /// sink's pre-commit state.
    Opaque {
        /// Their length.
        bytes: usize,
    },
}

/// Describes `state`, trying each layout that carries its own checks (a
/// blob's header and CRC, a key-group part's magic and CRCs), so that no
/// other layout is mistaken for one of them.
pub fn describe_state(state: &[u8]) -> StoredState {
    if state.is_empty() {
        return StoredState::Empty;
    }
    if let Ok(schema) = blob::verify(state) {
        return StoredState::Blob(schema);
    }
    if let Some(groups) = keyed(state) {
        return StoredState::Keyed(groups);
    }
    if let Some(timed) = timed(state) {
        return timed;
    }
    let operator = decode_operator_part(state).ok().and_then(|part| {
        let schema = blob::verify(part.blob).ok()?;
        Some(StoredState::Operator {
            ended: part.ended,
            schema,
        })
    });
    operator.unwrap_or(StoredState::Opaque { bytes: state.len() })
}

/// A timed operator's state, when it is exactly one and both its keyed
/// states describe (every part carries its magic and CRCs).
fn timed(state: &[u8]) -> Option<StoredState> {
    let (user, timers, watermark_ms) = timed_state_pieces(state)?;
    Some(StoredState::Timed {
        state: keyed(&user)?,
        timers: keyed(&timers)?,
        watermark_ms,
    })
}

/// The key-group parts of a keyed state, when every one describes.
fn keyed(state: &[u8]) -> Option<Vec<PartDescription>> {
    let groups = decode_keyed_state(state).ok()?;
    if groups.is_empty() {
        return None;
    }
    groups
        .iter()
        .map(|(_, bytes)| describe(bytes).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyed::{KeyedState, MaxParallelism};

    #[derive(crate::Snapshot, Clone, Default, Debug, PartialEq)]
    #[snapshot(crate = "crate")]
    struct Count {
        seen: u64,
    }

    #[test]
    fn layouts_describe_themselves() {
        assert_eq!(describe_state(&[]), StoredState::Empty);
        let bytes = blob::encode(&Count { seen: 3 }).expect("encodes");
        let StoredState::Blob(schema) = describe_state(&bytes) else {
            panic!("a blob");
        };
        assert!(schema.type_name.ends_with("Count"), "{}", schema.type_name);
        assert_eq!(schema.fields, ["seen: u64"]);
        let position = 42_u64.to_le_bytes();
        assert_eq!(describe_state(&position), StoredState::Opaque { bytes: 8 });
    }

    #[test]
    fn keyed_state_lists_its_key_groups() {
        let max = MaxParallelism::new(4).expect("valid");
        let mut state: KeyedState<u64, Count> = KeyedState::for_subtask(max, 1, 0).expect("valid");
        for key in 0..10 {
            state.get_or_default(&key).seen = key;
        }
        let parts: Vec<(u32, Vec<u8>)> =
            state.snapshot().expect("snapshots").into_parts().collect();
        let bytes = crate::job::ops::encode_keyed_state(&parts).expect("encodes");
        let StoredState::Keyed(groups) = describe_state(&bytes) else {
            panic!("keyed state");
        };
        assert_eq!(groups.len(), 4);
        assert_eq!(groups.iter().map(|group| group.entries).sum::<u64>(), 10);
        assert!(groups
            .iter()
            .all(|group| group.schema.fields == ["seen: u64"]));
    }

    fn keyed_bytes(max: MaxParallelism, keys: u64) -> Vec<u8> {
        let mut state: KeyedState<u64, Count> = KeyedState::for_subtask(max, 1, 0).expect("valid");
        for key in 0..keys {
            state.get_or_default(&key).seen = key;
        }
        let parts: Vec<(u32, Vec<u8>)> =
            state.snapshot().expect("snapshots").into_parts().collect();
        crate::job::ops::encode_keyed_state(&parts).expect("encodes")
    }

    #[test]
    fn a_timed_state_shows_its_keys_timers_and_watermark() {
        let max = MaxParallelism::new(4).expect("valid");
        let bytes = crate::job::timed_layout::timed_state_of_pieces(
            keyed_bytes(max, 6),
            keyed_bytes(max, 2),
            Some(41),
        );
        let StoredState::Timed {
            state,
            timers,
            watermark_ms,
        } = describe_state(&bytes)
        else {
            panic!("a timed state: {:?}", describe_state(&bytes));
        };
        assert_eq!((state.len(), timers.len()), (4, 4), "every key group");
        assert_eq!(state.iter().map(|group| group.entries).sum::<u64>(), 6);
        assert_eq!(timers.iter().map(|group| group.entries).sum::<u64>(), 2);
        assert_eq!(watermark_ms, Some(41));
        let mut damaged = bytes.clone();
        let last = damaged.len() - 3;
        damaged[last] ^= 0x40;
        assert!(
            !matches!(describe_state(&damaged), StoredState::Timed { .. }),
            "a part that fails its CRC is not described as timed"
        );
        let mut longer = bytes;
        longer.push(0);
        assert!(matches!(
            describe_state(&longer),
            StoredState::Opaque { .. }
        ));
    }
}
