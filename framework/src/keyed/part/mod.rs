//! The byte format of one key group's snapshot (a *part*): a fixed header,
//! the state type's schema once, then every (key, state) entry.
//!
//! This module owns encoding and decoding of parts. It never decides which
//! key groups a subtask owns and never does I/O; storage moves parts as
//! opaque bytes.
//!
//! # Layout (format version 1, integers little-endian)
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0      | 4    | magic `b"SFKG"` |
//! | 4      | 2    | format version, `1` |
//! | 6      | 2    | flags: `0`, or [`PART_FLAG_DELTA`] on a delta part (below); any other bit is rejected |
//! | 8      | 4    | max parallelism of the job |
//! | 12     | 4    | key group |
//! | 16     | 8    | entry count `N` |
//! | 24     | 4    | schema section length `S` (at most [`MAX_SCHEMA_LEN`](crate::state::blob::MAX_SCHEMA_LEN)) |
//! | 28     | 8    | body length `B` (schema section and entries) |
//! | 36     | 4    | body CRC: CRC-32 (IEEE) of bytes `44..44 + B` |
//! | 40     | 4    | header CRC: CRC-32 (IEEE) of bytes `0..40` |
//! | 44     | S    | postcard of the state type's [`StoredSchema`](crate::state::StoredSchema) |
//! | 44 + S | ...  | `N` entries, then nothing |
//!
//! An entry is the key in postcard, then the state's payload length as a
//! postcard varint, then the payload as written by
//! [`Snapshot::encode_payload`](crate::state::Snapshot::encode_payload). The schema is written once per part, not
//! per entry, and each payload is decoded with
//! [`Snapshot::decode_stored`](crate::state::Snapshot::decode_stored), so a part written by an older version of the
//! state type goes through that type's upgrade chain.
//!
//! # Delta chains
//!
//! A key group's bytes may also be a *chain*: one part as above (flags
//! `0`), then any number of delta parts, each a complete part of the same
//! layout and key group with flag [`PART_FLAG_DELTA`] set, back to back.
//! A delta's entries replace the entries of the same key before it (last
//! wins); keys it does not hold keep their earlier value. A delta cannot
//! delete a key: a writer that deleted one writes the group whole. The
//! spilling backend writes chains so that an incremental checkpoint
//! writes only the entries changed since the last one and refers to the
//! earlier parts. A lone part is the chain of length one, so every part
//! written before chains existed reads as before.
//!
//! # Decoding hostile bytes
//!
//! Every length is checked against the bytes present before it is used;
//! nothing is preallocated beyond one table slot per remaining input byte
//! (each entry takes at least one byte, its payload length). A flipped bit
//! is always caught by one of the two CRCs. Past the CRCs (forged parts),
//! the entry count, trailing bytes, duplicate keys and each key's key group
//! are checked, so a forged part decodes into an error, never a panic.
//!
//! # Files
//!
//! `header.rs` holds the layout's constants, the fixed header and chains
//! (reading and writing headers, splitting a chain, describing a part);
//! `writer.rs` encodes parts; `entries.rs` decodes and checks their
//! entries.

mod entries;
mod header;
mod writer;

pub(crate) use entries::{decode_entries, decode_into, insert_entry};
#[cfg(feature = "spill")]
pub(crate) use entries::{decode_entry_bytes, EntryBytes};
#[cfg(all(test, feature = "spill"))]
pub(crate) use header::split_chain;
pub use header::{
    describe, PartDescription, PART_FLAG_DELTA, PART_FORMAT_VERSION, PART_HEADER_LEN, PART_MAGIC,
};
pub(crate) use header::{header_for, is_delta, plausible_entries};
pub(crate) use writer::{encode_tables, schema_section, PartWriter};
