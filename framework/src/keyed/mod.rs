//! The keyed state backend: per-key state of a keyed operator's subtask,
//! split into key groups so that it can be snapshotted per key group and
//! restored at a different parallelism.
//!
//! This module owns the key groups arithmetic ([`key_group`]), the stable
//! key hash ([`hash`]), the in-memory store [`KeyedState`], the byte format
//! of one key group's snapshot ([`part`]), and collection types for large
//! per-key values ([`MapState`], [`ListState`]). It is pure data structures:
//! it never does I/O, never talks to actors, and never decides when to
//! snapshot. A keyed operator's subtask starts with the flat
//! [`KeyedState`] (one table, synchronous snapshots, the fastest lookups)
//! and, once it holds enough keys, moves to [`CowKeyedState`] (one
//! copy-on-write table per key group, see [`cow`]), whose snapshot hands
//! the key groups to the checkpoint writer in constant time per group and
//! is encoded there, off the operator's thread (`deferred.rs`).
//!
//! ```
//! use snapflow::keyed::{KeyedState, MaxParallelism};
//! # use snapflow::state::{Schema, SchemaShape, FieldSchema, Snapshot, StateError};
//! # #[derive(Default, Debug, PartialEq)]
//! # struct Count { count: u64 }
//! # impl Snapshot for Count {
//! #     const SCHEMA: Schema = Schema { type_name: "Count", version: 1,
//! #         shape: SchemaShape::Named(&[FieldSchema { name: "count", type_name: "u64" }]) };
//! #     fn encode_payload(&self, out: &mut Vec<u8>) -> Result<(), StateError> {
//! #         out.extend_from_slice(&self.count.to_le_bytes()); Ok(())
//! #     }
//! #     fn decode_payload(payload: &[u8]) -> Result<Self, StateError> {
//! #         let bytes: [u8; 8] = payload.try_into().map_err(|_| StateError::Payload {
//! #             type_name: "Count", reason: "not 8 bytes".into() })?;
//! #         Ok(Count { count: u64::from_le_bytes(bytes) })
//! #     }
//! # }
//! let max = MaxParallelism::default(); // 128 key groups
//! // Subtask 0 of 1 owns every key group.
//! let mut state: KeyedState<String, Count> = KeyedState::for_subtask(max, 1, 0).unwrap();
//! state.get_or_default(&"apple".to_string()).count += 1;
//! let snapshot = state.snapshot().unwrap();
//!
//! // Restore the same key groups elsewhere (here: the same single subtask).
//! let range = max.range_for_subtask(1, 0).unwrap();
//! let restored: KeyedState<String, Count> =
//!     KeyedState::restore(max, range, snapshot.into_parts()).unwrap();
//! assert_eq!(restored.get(&"apple".to_string()), Some(&Count { count: 1 }));
//! ```
//!
//! # Known gaps
//!
//! - Below the copy-on-write threshold a snapshot is synchronous and full
//!   on the operator's thread (about 1-6 ms at 50 k keys); incremental
//!   checkpoints (`job/incremental.rs`) encode only the groups they need
//!   with [`KeyedState::snapshot_key_groups`], but that pass still hashes
//!   every key to find its group.
//! - Copy-on-write is per key group ([`cow`]), not per entry as in
//!   Flink's heap backend: a group written while a snapshot holds it is
//!   copied whole, so with every group written between checkpoints the
//!   operator's thread copies up to its whole state once per checkpoint
//!   (spread over the records that first touch each group, never in the
//!   synchronous part; a group the writer has encoded already is taken
//!   back without a copy).
//! - State cannot be read from other threads while the job runs (Flink's
//!   queryable state); that would need a concurrent map such as dashmap.
//! - The key hash runs over what the key's `std::hash::Hash` impl feeds
//!   it, which std does not promise to keep across compiler versions or
//!   byte orders (see [`hash`]); restore detects a drift as
//!   [`KeyedError::KeyGroupMismatch`] instead of splitting a key's state.
//! - Dirty tracking is one byte store per access (the routed lookup also
//!   derives the key group from the hash it has), measured at roughly 5%
//!   of the count benchmark's throughput.
//! - A part does not record the key's type; a part of another key type
//!   usually fails to decode or lands in the wrong key group (both errors),
//!   but a key type with the same encoding and hash would be accepted.

pub mod collections;
pub mod cow;
pub mod cow_state;
pub(crate) mod deferred;
pub mod hash;
pub mod key_group;
pub mod part;
#[cfg(all(test, feature = "spill"))]
mod part_chain_tests;

mod backend;
mod group_part;
pub(crate) mod slice_table;
#[cfg(feature = "spill")]
pub mod spill;
pub(crate) mod store;
#[cfg(test)]
pub(crate) mod test_support;

pub use backend::{parts_in_range, KeyedSnapshot, KeyedState};
pub use collections::{ListState, MapState};
pub use cow::KeyGroupHandoff;
pub use cow_state::CowKeyedState;
pub(crate) use group_part::EncodedSlices;
pub use group_part::KeyGroupPart;
pub use hash::{key_hash, BuildStableHasher, StableHasher};
pub use key_group::SLICES_PER_KEY_GROUP;
pub use key_group::{
    key_group_of, range_for_subtask, subtask_for_key_group, KeyGroupError, KeyGroupRange,
    MaxParallelism, DEFAULT_MAX_PARALLELISM, UPPER_BOUND_MAX_PARALLELISM,
};
pub use store::{KeyedBackend, DEFAULT_COPY_ON_WRITE_THRESHOLD_KEYS};

use crate::state::StateError;
use serde::{de::DeserializeOwned, Serialize};
use std::hash::Hash;

/// A type usable as the key of keyed state: hashable with the stable hash,
/// comparable, cloneable (a key is cloned once, when its state is created),
/// and serializable (keys are written into snapshots).
pub trait StateKey: Hash + Eq + Clone + Serialize + DeserializeOwned + 'static {}

impl<T> StateKey for T where T: Hash + Eq + Clone + Serialize + DeserializeOwned + 'static {}

/// Why keyed state could not be accessed, snapshotted or restored.
///
/// None is retryable: each is a property of the inputs (the bytes, the
/// ranges, the types), and the same inputs fail the same way again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyedError {
    /// An invalid max parallelism, parallelism, subtask or range.
    #[error(transparent)]
    KeyGroup(#[from] KeyGroupError),
    /// A key was accessed on a subtask that does not own its key group: the
    /// records were routed by another hash or max parallelism, or the code
    /// touched a key other than the current record's.
    #[error("key in key group {key_group} accessed on the subtask that owns key groups {range}")]
    ForeignKey {
        /// The key's key group.
        key_group: u32,
        /// The key groups this state owns.
        range: KeyGroupRange,
    },
    /// Restore was given a part of a key group outside its range.
    #[error("restore of key groups {range} was given a part of key group {key_group}")]
    ForeignKeyGroup {
        /// The part's key group.
        key_group: u32,
        /// The key groups being restored.
        range: KeyGroupRange,
    },
    /// Restore was given two parts of the same key group.
    #[error("restore was given key group {key_group} twice")]
    DuplicateKeyGroup {
        /// The repeated key group.
        key_group: u32,
    },
    /// Restore was not given a part for every key group in its range. A
    /// snapshot writes a part for every key group, empty or not, so a
    /// missing part means a lost or unselected part, never an empty group.
    #[error(
        "restore of key groups {range} is missing {missing} key group(s), the first is \
         {first_missing}"
    )]
    MissingKeyGroups {
        /// The key groups being restored.
        range: KeyGroupRange,
        /// How many key groups had no part.
        missing: usize,
        /// The lowest key group without a part.
        first_missing: u32,
    },
    /// A part's bytes are not a valid key group part.
    #[error("key group {key_group}: corrupt part: {reason}")]
    CorruptPart {
        /// The key group the part was given for.
        key_group: u32,
        /// What is wrong.
        reason: String,
    },
    /// A part was written with another max parallelism, so its key groups
    /// mean something else.
    #[error(
        "key group {key_group}: part was written with max parallelism {stored}, this job has \
         {expected}; the max parallelism of a job cannot change"
    )]
    MaxParallelismMismatch {
        /// The key group the part was given for.
        key_group: u32,
        /// The max parallelism in the part.
        stored: u32,
        /// The max parallelism restoring.
        expected: u32,
    },
    /// A restored key hashes to another key group than the one it was
    /// stored under: the key hash changed between writer and reader (for
    /// example a new compiler changed a std `Hash` impl), or the part holds
    /// keys of another type.
    #[error(
        "a key stored in key group {stored} now hashes to key group {computed}; the key hash \
         or the key type differs from the writer's"
    )]
    KeyGroupMismatch {
        /// The key group the key was stored under.
        stored: u32,
        /// The key group its hash gives now.
        computed: u32,
    },
    /// A part holds the same key twice.
    #[error("key group {key_group}: part holds a key twice")]
    DuplicateKey {
        /// The part's key group.
        key_group: u32,
    },
    /// A key or a state value could not be decoded, or its stored schema
    /// does not fit this build's state type.
    #[error("key group {key_group}: {source}")]
    State {
        /// The part's key group.
        key_group: u32,
        /// What the state layer said.
        #[source]
        source: StateError,
    },
}

impl KeyedError {
    /// Whether trying again with the same input could succeed: never.
    pub fn is_retryable(&self) -> bool {
        false
    }
}
