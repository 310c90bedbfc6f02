//! Decoding and checking a part's (or a chain's) entries: into a table
//! ([`decode_into`]), to a callback with each decoded state
//! ([`decode_entries`]), or as each entry's bytes ([`decode_entry_bytes`],
//! for the spilling backend's restore). Every check the format promises
//! against hostile bytes past the header is here (`mod.rs`, "Decoding
//! hostile bytes"). It never encodes a part.

use super::header::{plausible_entries, split_chain, PartHeader, PART_HEADER_LEN};
use crate::keyed::hash::key_hash;
use crate::keyed::key_group::MaxParallelism;
use crate::keyed::KeyedError;
use crate::state::{Snapshot, StateError, StoredSchema};
use allocator_api2::alloc::Allocator;
use hashbrown::HashTable;
use serde::de::DeserializeOwned;

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
        decode_part_entries::<K, S>(
            part,
            &header,
            replaces,
            max_parallelism,
            key_group,
            &mut insert,
        )?;
    }
    Ok(())
}

/// [`decode_entries`] of one part of a chain, whose header is `header`
/// (`replaces`: a delta part's).
fn decode_part_entries<K, S>(
    bytes: &[u8],
    header: &PartHeader,
    replaces: bool,
    max_parallelism: MaxParallelism,
    key_group: u32,
    insert: &mut impl FnMut(u64, K, S, bool) -> Result<(), KeyedError>,
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
    for_each_entry(
        entries,
        header,
        replaces,
        max_parallelism,
        key_group,
        |entry| {
            let state = if exact {
                S::decode_payload(entry.payload)
            } else {
                S::decode_stored(&stored, entry.payload)
            }
            .map_err(state_error)?;
            insert(entry.hash, entry.key, state, entry.replaces)
        },
    )
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
        let replaces = index > 0;
        for_each_entry(
            entries,
            header,
            replaces,
            max_parallelism,
            key_group,
            |entry| {
                // Decoded only to be checked: a forged payload past the CRC
                // fails here, not at a later read of the key.
                S::decode_payload(entry.payload).map_err(state_error)?;
                take(entry)
            },
        )?;
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
/// and then checks that nothing follows the last. Each entry `replaces`
/// earlier ones of its key if the part is a delta of its chain.
fn for_each_entry<'b, K>(
    mut entries: &'b [u8],
    header: &PartHeader,
    replaces: bool,
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
            replaces,
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
