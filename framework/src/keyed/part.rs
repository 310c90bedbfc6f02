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
//! | 24     | 4    | schema section length `S` (at most [`MAX_SCHEMA_LEN`]) |
//! | 28     | 8    | body length `B` (schema section and entries) |
//! | 36     | 4    | body CRC: CRC-32 (IEEE) of bytes `44..44 + B` |
//! | 40     | 4    | header CRC: CRC-32 (IEEE) of bytes `0..40` |
//! | 44     | S    | postcard of the state type's [`StoredSchema`] |
//! | 44 + S | ...  | `N` entries, then nothing |
//!
//! An entry is the key in postcard, then the state's payload length as a
//! postcard varint, then the payload as written by
//! [`Snapshot::encode_payload`]. The schema is written once per part, not
//! per entry, and each payload is decoded with
//! [`Snapshot::decode_stored`], so a part written by an older version of the
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

use super::hash::key_hash;
use super::key_group::MaxParallelism;
use super::slice_table::prefetch_scan_ahead;
use super::KeyedError;
use crate::state::blob::{read_u16, read_u32, read_u64, MAX_SCHEMA_LEN};
use crate::state::{append_postcard, Snapshot, StateError, StoredSchema};
use allocator_api2::alloc::Allocator;
use hashbrown::HashTable;
use serde::{de::DeserializeOwned, Serialize};

/// The four bytes every part starts with.
pub const PART_MAGIC: [u8; 4] = *b"SFKG";
/// The part format version this build writes and reads.
pub const PART_FORMAT_VERSION: u16 = 1;
/// The length of a part's fixed header.
pub const PART_HEADER_LEN: usize = 44;
/// The flag of a delta part: its entries replace those of the same keys
/// in the parts before it in its key group's chain (module doc).
pub const PART_FLAG_DELTA: u16 = 1;

/// The fixed header of a part, as decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartHeader {
    /// The job's max parallelism.
    pub max_parallelism: u32,
    /// The key group.
    pub key_group: u32,
    /// The number of entries.
    pub entry_count: u64,
    /// The schema section's length.
    pub schema_len: u32,
    /// The length of everything after the header.
    pub body_len: u64,
    /// CRC-32 of everything after the header.
    pub body_crc: u32,
}

/// The schema section of parts of state type `S`, computed once per
/// snapshot and copied into every part.
pub(crate) fn schema_section<S: Snapshot>() -> Result<Vec<u8>, StateError> {
    let stored = StoredSchema {
        fingerprint: S::fingerprint(),
        ..StoredSchema::of(&S::SCHEMA)
    };
    let bytes = postcard::to_allocvec(&stored).map_err(|error| StateError::Encode {
        type_name: S::SCHEMA.type_name,
        reason: error.to_string(),
    })?;
    if bytes.len() > MAX_SCHEMA_LEN as usize {
        return Err(StateError::Encode {
            type_name: S::SCHEMA.type_name,
            reason: format!(
                "schema section of {} bytes is larger than the limit {MAX_SCHEMA_LEN}",
                bytes.len()
            ),
        });
    }
    Ok(bytes)
}

/// Builds one key group's part entry by entry. Entries are appended as
/// they come, so a snapshot can fill every key group's part in one pass
/// over its table.
pub(crate) struct PartWriter {
    out: Vec<u8>,
    entry_count: u64,
    schema_len: u32,
}

impl PartWriter {
    /// A part with no entries yet; `schema` comes from [`schema_section`].
    pub(crate) fn new(schema: &[u8]) -> Self {
        let mut out = Vec::with_capacity(PART_HEADER_LEN + schema.len());
        out.resize(PART_HEADER_LEN, 0);
        out.extend_from_slice(schema);
        PartWriter {
            out,
            entry_count: 0,
            // `schema_section` refused anything over MAX_SCHEMA_LEN.
            schema_len: schema.len() as u32,
        }
    }

    /// Appends one entry.
    ///
    /// The payload is encoded straight after a one-byte placeholder for its
    /// length, which is then written in place: nearly every payload of a
    /// small state is under 128 bytes, whose length is one varint byte, so
    /// the payload is written once and never copied. A longer one is moved
    /// up by the extra length bytes.
    #[inline(always)]
    pub(crate) fn push<K: Serialize, S: Snapshot>(
        &mut self,
        key: &K,
        state: &S,
    ) -> Result<(), StateError> {
        append_postcard(key, &mut self.out).map_err(|error| StateError::Encode {
            type_name: std::any::type_name::<K>(),
            reason: error.to_string(),
        })?;
        let length_at = self.out.len();
        self.out.push(0);
        state.encode_payload(&mut self.out)?;
        // `encode_payload` only appends (its contract); a shorter buffer
        // would be a broken implementation, caught here rather than as a
        // corrupt part.
        let payload_len =
            self.out
                .len()
                .checked_sub(length_at + 1)
                .ok_or_else(|| StateError::Encode {
                    type_name: S::SCHEMA.type_name,
                    reason: "encode_payload removed bytes it did not write".to_string(),
                })?;
        write_length_in_place(&mut self.out, length_at, payload_len);
        self.entry_count += 1;
        Ok(())
    }

    /// Appends one entry whose key is already in postcard (`key`) and whose
    /// state is already a payload (`payload`): the spilling backend keeps
    /// both forms on disk, so its snapshot copies them without decoding.
    #[cfg(feature = "spill")]
    pub(crate) fn push_encoded(&mut self, key: &[u8], payload: &[u8]) -> Result<(), StateError> {
        self.out.extend_from_slice(key);
        append_postcard(&(payload.len() as u64), &mut self.out).map_err(|error| {
            StateError::Encode {
                type_name: "payload length",
                reason: error.to_string(),
            }
        })?;
        self.out.extend_from_slice(payload);
        self.entry_count += 1;
        Ok(())
    }

    /// Writes the header and returns the part's bytes.
    pub(crate) fn finish(self, max_parallelism: MaxParallelism, key_group: u32) -> Vec<u8> {
        self.finish_with_flags(max_parallelism, key_group, 0)
    }

    /// Writes the header of a delta part ([`PART_FLAG_DELTA`]: its entries
    /// replace those of the same keys in the parts before it) and returns
    /// its bytes.
    #[cfg(feature = "spill")]
    pub(crate) fn finish_delta(self, max_parallelism: MaxParallelism, key_group: u32) -> Vec<u8> {
        self.finish_with_flags(max_parallelism, key_group, PART_FLAG_DELTA)
    }

    fn finish_with_flags(
        mut self,
        max_parallelism: MaxParallelism,
        key_group: u32,
        flags: u16,
    ) -> Vec<u8> {
        let header = PartHeader {
            max_parallelism: max_parallelism.get(),
            key_group,
            entry_count: self.entry_count,
            schema_len: self.schema_len,
            body_len: (self.out.len() - PART_HEADER_LEN) as u64,
            body_crc: crc32fast::hash(&self.out[PART_HEADER_LEN..]),
        };
        write_header(&header, flags, &mut self.out[..PART_HEADER_LEN]);
        self.out
    }

    /// A writer of bare entries appended to `out`, with no header and no
    /// schema of its own: the slices of a part assembled from pieces
    /// ([`header_for`]).
    pub(crate) fn entries_into(out: Vec<u8>) -> Self {
        PartWriter {
            out,
            entry_count: 0,
            schema_len: 0,
        }
    }

    /// The bytes and the number of entries pushed, of a writer made by
    /// [`Self::entries_into`].
    pub(crate) fn into_entries(self) -> (Vec<u8>, u64) {
        (self.out, self.entry_count)
    }
}

/// The header of a part of `key_group` whose body (the schema section of
/// `schema_len` bytes, then the entries) is `body_len` bytes long with
/// CRC `body_crc` and holds `entry_count` entries: exactly the header a
/// [`PartWriter`] writes for the same body. An incremental checkpoint of
/// the copy-on-write state writes it in front of a body made of fresh and
/// reused slices, whose CRC it combines from theirs.
pub(crate) fn header_for(
    max_parallelism: MaxParallelism,
    key_group: u32,
    entry_count: u64,
    schema_len: u32,
    body_len: u64,
    body_crc: u32,
) -> [u8; PART_HEADER_LEN] {
    let header = PartHeader {
        max_parallelism: max_parallelism.get(),
        key_group,
        entry_count,
        schema_len,
        body_len,
        body_crc,
    };
    let mut out = [0u8; PART_HEADER_LEN];
    write_header(&header, 0, &mut out);
    out
}

/// Encodes one key group held in one or several tables (the
/// copy-on-write state's slices) as one part, the tables' entries one
/// table after the other, checked before it is returned: its header must
/// decode and name `key_group` and exactly the tables' entries. `schema`
/// comes from [`schema_section`].
pub(crate) fn encode_tables<'t, K: Serialize + 't, S: Snapshot + 't, A: Allocator + 't>(
    tables: impl IntoIterator<Item = &'t HashTable<(K, S), A>>,
    schema: &[u8],
    max_parallelism: MaxParallelism,
    key_group: u32,
) -> Result<Vec<u8>, StateError> {
    let mut writer = PartWriter::new(schema);
    let mut expected = 0u64;
    for table in tables {
        for pair in table.iter() {
            prefetch_scan_ahead(pair);
            writer.push(&pair.0, &pair.1)?;
        }
        expected += table.len() as u64;
    }
    let bytes = writer.finish(max_parallelism, key_group);
    check_part::<S>(&bytes, key_group, expected)?;
    Ok(bytes)
}

/// Checks an encoded part: its header must decode and name `key_group`
/// and `expected` entries.
fn check_part<S: Snapshot>(bytes: &[u8], key_group: u32, expected: u64) -> Result<(), StateError> {
    let fail = |reason: String| StateError::Encode {
        type_name: S::SCHEMA.type_name,
        reason: format!("the part of key group {key_group} fails its check: {reason}"),
    };
    let header = decode_header(bytes).map_err(fail)?;
    if header.key_group != key_group || header.entry_count != expected {
        return Err(fail(format!(
            "it claims key group {} with {} entries; its table held {expected}",
            header.key_group, header.entry_count,
        )));
    }
    Ok(())
}

/// How many entries a part can really hold: its header's count, capped by
/// its length (each entry takes at least one byte), or 0 when the header
/// does not decode. Used only to size tables before decoding.
pub(crate) fn plausible_entries(bytes: &[u8]) -> usize {
    split_chain(bytes)
        .map(|chain| {
            let claimed: u64 = chain.iter().map(|(header, _)| header.entry_count).sum();
            claimed.min(bytes.len() as u64) as usize
        })
        .unwrap_or(0)
}

/// Decodes and checks a part's fixed header: magic, format version, header
/// CRC, flags (none set), the schema length limit and that the lengths add
/// up to the input's length. It does not check the body CRC, the max
/// parallelism or the key group; [`decode_into`] does. A chain (module
/// doc) is refused here; [`split_chain`] reads one.
pub(crate) fn decode_header(bytes: &[u8]) -> Result<PartHeader, String> {
    let (header, flags, len) = decode_header_prefix(bytes)?;
    if flags != 0 {
        return Err(format!("reserved flags {flags:#06x} are set"));
    }
    if len != bytes.len() {
        return Err(format!(
            "header claims a {}-byte body but {} bytes follow the header",
            header.body_len,
            bytes.len() - PART_HEADER_LEN
        ));
    }
    Ok(header)
}

/// Decodes and checks the header of the part `bytes` starts with (magic,
/// version, header CRC, no flag but [`PART_FLAG_DELTA`], schema length,
/// a body that fits in `bytes`): the header, its flags and the part's
/// whole length.
fn decode_header_prefix(bytes: &[u8]) -> Result<(PartHeader, u16, usize), String> {
    if bytes.len() < PART_HEADER_LEN {
        return Err(format!(
            "{} bytes is shorter than the {PART_HEADER_LEN}-byte header",
            bytes.len()
        ));
    }
    if bytes[0..4] != PART_MAGIC {
        return Err(format!("bad magic {:02x?}", &bytes[0..4]));
    }
    let version = read_u16(bytes, 4);
    if version != PART_FORMAT_VERSION {
        return Err(format!(
            "part format version {version} is not supported (this build reads \
             {PART_FORMAT_VERSION}), or the header is damaged"
        ));
    }
    if crc32fast::hash(&bytes[..40]) != read_u32(bytes, 40) {
        return Err("header checksum mismatch".to_string());
    }
    let flags = read_u16(bytes, 6);
    if flags & !PART_FLAG_DELTA != 0 {
        return Err(format!("reserved flags {flags:#06x} are set"));
    }
    let header = PartHeader {
        max_parallelism: read_u32(bytes, 8),
        key_group: read_u32(bytes, 12),
        entry_count: read_u64(bytes, 16),
        schema_len: read_u32(bytes, 24),
        body_len: read_u64(bytes, 28),
        body_crc: read_u32(bytes, 36),
    };
    let available = (bytes.len() - PART_HEADER_LEN) as u64;
    if header.body_len > available {
        return Err(format!(
            "header claims a {}-byte body but {available} bytes follow the header",
            header.body_len
        ));
    }
    if header.schema_len > MAX_SCHEMA_LEN || u64::from(header.schema_len) > header.body_len {
        return Err(format!(
            "schema section claims {} bytes; the limit is {MAX_SCHEMA_LEN} and the body has \
             {}",
            header.schema_len, header.body_len
        ));
    }
    // `body_len <= available`, so it fits in usize.
    Ok((header, flags, PART_HEADER_LEN + header.body_len as usize))
}

/// Whether `bytes` start with a delta part ([`PART_FLAG_DELTA`]), read
/// from its flags without checking anything else: a writer's own part,
/// never input.
pub(crate) fn is_delta(bytes: &[u8]) -> bool {
    bytes.len() >= PART_HEADER_LEN && read_u16(bytes, 6) & PART_FLAG_DELTA != 0
}

/// Splits a key group's bytes into its chain (module doc): the first part
/// (no flag) and the delta parts after it, each with its header (checked
/// as [`decode_header`] does; bodies are not). A lone part is a chain of
/// one. At most one entry per 44 input bytes, so hostile input cannot
/// inflate it.
pub(crate) fn split_chain(bytes: &[u8]) -> Result<Vec<(PartHeader, &[u8])>, String> {
    let mut chain = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() || chain.is_empty() {
        let (header, flags, len) = decode_header_prefix(rest)?;
        let delta = flags & PART_FLAG_DELTA != 0;
        if delta == chain.is_empty() {
            return Err(if delta {
                "the chain starts with a delta part".to_string()
            } else {
                format!("part {} of the chain is not a delta part", chain.len() + 1)
            });
        }
        let (part, after) = rest.split_at(len);
        chain.push((header, part));
        rest = after;
    }
    Ok(chain)
}

/// What a part holds, read without knowing its key or state type: its
/// key group, entry count and the stored schema of its states. For tools
/// that show a checkpoint (the `snapflow` command-line tool).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartDescription {
    /// The job's max parallelism the part was written with.
    pub max_parallelism: u32,
    /// The key group.
    pub key_group: u32,
    /// The number of (key, state) entries.
    pub entries: u64,
    /// The schema every state of the part was written with.
    pub schema: StoredSchema,
}

/// Describes the part `bytes` after checking its header and body CRCs.
///
/// # Errors
///
/// Why the bytes are not a valid part.
///
/// For a delta chain (module doc), every part's CRCs are checked, the
/// schema is the first part's, and `entries` counts every part's entries,
/// so a key a delta replaced is counted once per part that holds it.
pub fn describe(bytes: &[u8]) -> Result<PartDescription, String> {
    let chain = split_chain(bytes)?;
    for (header, part) in &chain {
        if crc32fast::hash(&part[PART_HEADER_LEN..]) != header.body_crc {
            return Err("body checksum mismatch".to_string());
        }
    }
    let (header, first) = chain[0];
    let body = &first[PART_HEADER_LEN..];
    // `decode_header` proved `schema_len <= body.len()`.
    let schema_bytes = &body[..header.schema_len as usize];
    let schema = match postcard::take_from_bytes::<StoredSchema>(schema_bytes) {
        Ok((schema, [])) => schema,
        Ok((_, rest)) => return Err(format!("{} bytes after the schema", rest.len())),
        Err(error) => return Err(format!("the schema does not decode: {error}")),
    };
    Ok(PartDescription {
        max_parallelism: header.max_parallelism,
        key_group: header.key_group,
        entries: chain.iter().map(|(header, _)| header.entry_count).sum(),
        schema,
    })
}

/// Decodes a part (or a delta chain, module doc) of `key_group` and
/// inserts its entries into `table`, which may hold other key groups'
/// entries. On error `table` may hold some of the part's entries; callers
/// discard it.
pub(crate) fn decode_into<K, S, A>(
    bytes: &[u8],
    max_parallelism: MaxParallelism,
    key_group: u32,
    table: &mut HashTable<(K, S), A>,
) -> Result<(), KeyedError>
where
    K: DeserializeOwned + Eq + std::hash::Hash,
    S: Snapshot,
    A: Allocator,
{
    // Each entry takes at least one byte (its payload length), so the
    // input bounds how many entries can really follow. Restore usually
    // reserved for all parts already, and then this is a no-op.
    table.reserve(plausible_entries(bytes), |(key, _)| key_hash(key));
    decode_entries(
        bytes,
        max_parallelism,
        key_group,
        |hash, key, state, replaces| insert_entry(table, key_group, hash, key, state, replaces),
    )
}

/// Inserts a restored entry with hash `hash` into `table`: a key already
/// there is refused, unless the entry `replaces` (it comes from a delta
/// part), when its value replaces the earlier one.
pub(crate) fn insert_entry<K, S, A>(
    table: &mut HashTable<(K, S), A>,
    key_group: u32,
    hash: u64,
    key: K,
    state: S,
    replaces: bool,
) -> Result<(), KeyedError>
where
    K: Eq + std::hash::Hash,
    A: Allocator,
{
    match table.entry(hash, |(other, _)| *other == key, |(k, _)| key_hash(k)) {
        hashbrown::hash_table::Entry::Occupied(mut occupied) if replaces => {
            occupied.get_mut().1 = state;
            Ok(())
        }
        hashbrown::hash_table::Entry::Occupied(_) => Err(KeyedError::DuplicateKey { key_group }),
        hashbrown::hash_table::Entry::Vacant(vacant) => {
            vacant.insert((key, state));
            Ok(())
        }
    }
}

/// Decodes and checks a part (or a delta chain) of `key_group` and hands
/// each entry, with its key's hash and whether it comes from a delta part
/// (so replaces an earlier value of its key), to `insert`, in chain order;
/// each key's key group is checked first. On error `insert` may have been
/// given some of the entries; callers discard what they built.
pub(crate) fn decode_entries<K, S>(
    bytes: &[u8],
    max_parallelism: MaxParallelism,
    key_group: u32,
    mut insert: impl FnMut(u64, K, S, bool) -> Result<(), KeyedError>,
) -> Result<(), KeyedError>
where
    K: DeserializeOwned + Eq + std::hash::Hash,
    S: Snapshot,
{
    let corrupt = |reason: String| KeyedError::CorruptPart { key_group, reason };
    let chain = split_chain(bytes).map_err(corrupt)?;
    for (index, (header, part)) in chain.into_iter().enumerate() {
        let replaces = index > 0;
        decode_part_entries::<K, S>(part, &header, max_parallelism, key_group, |h, k, s| {
            insert(h, k, s, replaces)
        })?;
    }
    Ok(())
}

/// [`decode_entries`] of one part of a chain, whose header is `header`.
fn decode_part_entries<K, S>(
    bytes: &[u8],
    header: &PartHeader,
    max_parallelism: MaxParallelism,
    key_group: u32,
    mut insert: impl FnMut(u64, K, S) -> Result<(), KeyedError>,
) -> Result<(), KeyedError>
where
    K: DeserializeOwned + Eq + std::hash::Hash,
    S: Snapshot,
{
    let (stored, entries) = check_body(bytes, header, max_parallelism, key_group)?;
    let state_error = |source: StateError| KeyedError::State { key_group, source };
    // When the writer's schema is exactly this build's, every payload can be
    // decoded directly; otherwise each goes through `decode_stored`, which
    // checks the schema and follows the upgrade chain. The check is made
    // once per part because `Snapshot::fingerprint` rebuilds the schema
    // text on each call, which made a per-entry check dominate restore.
    let exact = is_exact::<S>(&stored);
    for_each_entry(entries, header, max_parallelism, key_group, |entry| {
        let state = if exact {
            S::decode_payload(entry.payload)
        } else {
            S::decode_stored(&stored, entry.payload)
        }
        .map_err(state_error)?;
        insert(entry.hash, entry.key, state)
    })
}

/// One entry of a part as [`decode_entry_bytes`] hands it out: its key
/// decoded and hashed, and the bytes of its key (postcard) and of its
/// state's payload, both borrowed from the part. Without the `spill`
/// feature only the hash, key and payload are read.
#[cfg_attr(not(feature = "spill"), allow(dead_code))]
pub(crate) struct EntryBytes<'b, K> {
    /// [`key_hash`] of `key`.
    pub hash: u64,
    /// The key, decoded.
    pub key: K,
    /// The key's postcard bytes.
    pub key_bytes: &'b [u8],
    /// The state's payload, as [`Snapshot::encode_payload`] wrote it.
    pub payload: &'b [u8],
    /// Whether the entry comes from a delta part, so replaces an earlier
    /// entry of its key.
    pub replaces: bool,
}

/// Decodes and checks a part (or a delta chain) of `key_group` exactly as
/// [`decode_entries`] does, every payload included, but hands each entry's
/// bytes to `take` instead of its decoded state, in chain order: for a
/// reader that stores the entries in their encoded form (the spilling
/// backend's restore). Returns `Ok(false)` without calling `take` when a
/// part of the chain was written with another schema than this build's:
/// its payloads then need the upgrade chain, and their bytes are not what
/// this build would write. On error `take` may have been given some of
/// the entries.
#[cfg(feature = "spill")]
pub(crate) fn decode_entry_bytes<'b, K, S>(
    bytes: &'b [u8],
    max_parallelism: MaxParallelism,
    key_group: u32,
    mut take: impl FnMut(EntryBytes<'b, K>) -> Result<(), KeyedError>,
) -> Result<bool, KeyedError>
where
    K: DeserializeOwned + Eq + std::hash::Hash,
    S: Snapshot,
{
    let corrupt = |reason: String| KeyedError::CorruptPart { key_group, reason };
    let chain = split_chain(bytes).map_err(corrupt)?;
    let mut bodies = Vec::with_capacity(chain.len());
    for (header, part) in &chain {
        let (stored, entries) = check_body(part, header, max_parallelism, key_group)?;
        if !is_exact::<S>(&stored) {
            return Ok(false);
        }
        bodies.push((header, entries));
    }
    let state_error = |source: StateError| KeyedError::State { key_group, source };
    for (index, (header, entries)) in bodies.into_iter().enumerate() {
        for_each_entry(entries, header, max_parallelism, key_group, |mut entry| {
            // Decoded only to be checked: a forged payload past the CRC
            // fails here, not at a later read of the key.
            S::decode_payload(entry.payload).map_err(state_error)?;
            entry.replaces = index > 0;
            take(entry)
        })?;
    }
    Ok(true)
}

/// Whether parts written with `stored` hold exactly this build's payloads.
fn is_exact<S: Snapshot>(stored: &StoredSchema) -> bool {
    stored.version == S::SCHEMA.version && stored.fingerprint == S::fingerprint()
}

/// Checks one part of a chain (`bytes`, whose header is `header`) against
/// the job's max parallelism, the key group it is restored as and its body
/// CRC, and decodes its schema section: the stored schema and the bytes of
/// its entries.
fn check_body<'b>(
    bytes: &'b [u8],
    header: &PartHeader,
    max_parallelism: MaxParallelism,
    key_group: u32,
) -> Result<(StoredSchema, &'b [u8]), KeyedError> {
    let corrupt = |reason: String| KeyedError::CorruptPart { key_group, reason };
    if header.max_parallelism != max_parallelism.get() {
        return Err(KeyedError::MaxParallelismMismatch {
            key_group,
            stored: header.max_parallelism,
            expected: max_parallelism.get(),
        });
    }
    if header.key_group != key_group {
        return Err(corrupt(format!(
            "the part is labelled key group {key_group} but holds key group {}",
            header.key_group
        )));
    }
    let body = &bytes[PART_HEADER_LEN..];
    if crc32fast::hash(body) != header.body_crc {
        return Err(corrupt("body checksum mismatch".to_string()));
    }
    // `decode_header` proved `schema_len <= body.len()`.
    let (schema_bytes, entries) = body.split_at(header.schema_len as usize);
    match postcard::take_from_bytes::<StoredSchema>(schema_bytes) {
        Ok((stored, [])) => Ok((stored, entries)),
        Ok((_, rest)) => Err(corrupt(format!(
            "{} trailing bytes after the schema section",
            rest.len()
        ))),
        Err(error) => Err(corrupt(format!("schema section does not decode: {error}"))),
    }
}

/// Calls `f` with each of the `header.entry_count` entries of `entries` (a
/// checked part's entries section), each key's key group checked first,
/// and then checks that nothing follows the last. `replaces` is `false`.
fn for_each_entry<'b, K>(
    mut entries: &'b [u8],
    header: &PartHeader,
    max_parallelism: MaxParallelism,
    key_group: u32,
    mut f: impl FnMut(EntryBytes<'b, K>) -> Result<(), KeyedError>,
) -> Result<(), KeyedError>
where
    K: DeserializeOwned + Eq + std::hash::Hash,
{
    let corrupt = |reason: String| KeyedError::CorruptPart { key_group, reason };
    for _ in 0..header.entry_count {
        if entries.is_empty() {
            return Err(corrupt(format!(
                "the header claims {} entries but the part ends early",
                header.entry_count
            )));
        }
        let (key, key_bytes, payload, rest) = take_entry::<K>(entries).map_err(corrupt)?;
        entries = rest;
        let hash = key_hash(&key);
        let computed = max_parallelism.key_group_of(hash);
        if computed != key_group {
            return Err(KeyedError::KeyGroupMismatch {
                stored: key_group,
                computed,
            });
        }
        f(EntryBytes {
            hash,
            key,
            key_bytes,
            payload,
            replaces: false,
        })?;
    }
    if !entries.is_empty() {
        return Err(corrupt(format!(
            "{} trailing bytes after the last of {} entries",
            entries.len(),
            header.entry_count
        )));
    }
    Ok(())
}

/// Splits one entry off the front of `input`: the decoded key, its bytes,
/// the raw payload, and the rest.
#[allow(clippy::type_complexity)]
fn take_entry<K: DeserializeOwned>(input: &[u8]) -> Result<(K, &[u8], &[u8], &[u8]), String> {
    let (key, rest) = postcard::take_from_bytes::<K>(input)
        .map_err(|error| format!("a key does not decode: {error}"))?;
    let key_bytes = &input[..input.len() - rest.len()];
    let (length, rest) = postcard::take_from_bytes::<u64>(rest)
        .map_err(|error| format!("a payload length does not decode: {error}"))?;
    let length = usize::try_from(length)
        .ok()
        .filter(|length| *length <= rest.len())
        .ok_or_else(|| format!("a payload claims {length} bytes but {} remain", rest.len()))?;
    let (payload, rest) = rest.split_at(length);
    Ok((key, key_bytes, payload, rest))
}

/// Writes `payload_len` as a postcard (LEB128) varint at `at`, where one
/// placeholder byte stands before a payload of that length that ends `out`;
/// a varint longer than one byte moves the payload up to make room.
#[inline]
fn write_length_in_place(out: &mut Vec<u8>, at: usize, payload_len: usize) {
    // The common case, a payload under 128 bytes, is one byte stored into
    // the placeholder; the loop below handles the rest out of line.
    if payload_len < 0x80 {
        out[at] = payload_len as u8;
        return;
    }
    write_long_length_in_place(out, at, payload_len);
}

#[cold]
#[inline(never)]
fn write_long_length_in_place(out: &mut Vec<u8>, at: usize, payload_len: usize) {
    let mut varint = [0u8; 10];
    let mut value = payload_len as u64;
    let mut len = 0;
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            varint[len] = byte;
            len += 1;
            break;
        }
        varint[len] = byte | 0x80;
        len += 1;
    }
    if len > 1 {
        let end = out.len();
        out.resize(end + len - 1, 0);
        out.copy_within(at + 1..end, at + len);
    }
    out[at..at + len].copy_from_slice(&varint[..len]);
}

fn write_header(header: &PartHeader, flags: u16, out: &mut [u8]) {
    out[0..4].copy_from_slice(&PART_MAGIC);
    out[4..6].copy_from_slice(&PART_FORMAT_VERSION.to_le_bytes());
    out[6..8].copy_from_slice(&flags.to_le_bytes());
    out[8..12].copy_from_slice(&header.max_parallelism.to_le_bytes());
    out[12..16].copy_from_slice(&header.key_group.to_le_bytes());
    out[16..24].copy_from_slice(&header.entry_count.to_le_bytes());
    out[24..28].copy_from_slice(&header.schema_len.to_le_bytes());
    out[28..36].copy_from_slice(&header.body_len.to_le_bytes());
    out[36..40].copy_from_slice(&header.body_crc.to_le_bytes());
    let header_crc = crc32fast::hash(&out[..40]);
    out[40..44].copy_from_slice(&header_crc.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::write_length_in_place;

    /// The length written in place equals postcard's varint of it, and the
    /// payload after it is intact, at every varint width up to four bytes.
    #[test]
    fn a_length_written_in_place_is_postcards_varint() {
        for payload_len in [0usize, 1, 127, 128, 300, 16_383, 16_384, 2_097_152] {
            let payload: Vec<u8> = (0..payload_len).map(|i| (i % 251) as u8).collect();
            let mut out = vec![0xAA, 0xBB, 0];
            out.extend_from_slice(&payload);
            write_length_in_place(&mut out, 2, payload_len);
            let mut want = vec![0xAA, 0xBB];
            want.extend_from_slice(&postcard::to_allocvec(&(payload_len as u64)).expect("encodes"));
            want.extend_from_slice(&payload);
            assert!(out == want, "payload length {payload_len}");
        }
    }
}
