//! The two shapes of a key group's encoded state that the flat backend
//! (`backend.rs`), the copy-on-write tables (`cow.rs`) and their deferred
//! hand-offs (`deferred.rs`) pass between them: a whole part
//! ([`KeyGroupPart`]) and a part's fresh slices ([`EncodedSlices`]).
//!
//! This file owns only these two types, so that those files need not
//! import each other for them. It never encodes, decodes or does I/O.

use super::key_group::MaxParallelism;

/// The bytes of one key group's state; the format is in [`super::part`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyGroupPart {
    /// The key group.
    pub key_group: u32,
    /// The encoded entries of the key group.
    pub bytes: Vec<u8>,
}

/// What `cow::SliceHandoff` (and the flat state's `KeyedState::encode_slices`)
/// gives per key group: room for the part's header
/// (`part::PART_HEADER_LEN` zero bytes, filled in by the caller once it
/// knows the body's CRC), then the fresh slices' entries encoded one
/// after the other, in slice order, with the schema section in front of
/// slice 0's when slice 0 is among them (a part's schema belongs to its
/// first slice's bytes, see `cow_state`'s "Slices").
#[derive(Debug)]
pub(crate) struct EncodedSlices {
    pub(crate) key_group: u32,
    /// The header's room, then the fresh slices' bytes, back to back.
    pub(crate) bytes: Vec<u8>,
    /// `(slice, end of its bytes in `bytes`, its entries)`, ascending.
    pub(crate) slices: Vec<(u32, usize, u64)>,
    /// As `cow::HandedGroup::reused_entries`.
    pub(crate) reused_entries: u64,
    /// The schema section's length, for the part's header.
    pub(crate) schema_len: u32,
    /// The job's max parallelism, for the part's header.
    pub(crate) max_parallelism: MaxParallelism,
}
