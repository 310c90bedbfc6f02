//! Encoding parts: the schema section, [`PartWriter`] (entry by entry)
//! and [`encode_tables`] (a copy-on-write state's tables), each part
//! checked before it is returned. It never decodes an entry.

#[cfg(feature = "spill")]
use super::header::PART_FLAG_DELTA;
use super::header::{decode_header, write_header, PartHeader, PART_HEADER_LEN};
use crate::keyed::key_group::MaxParallelism;
use crate::keyed::slice_table::prefetch_scan_ahead;
use crate::state::blob::MAX_SCHEMA_LEN;
use crate::state::{append_postcard, Snapshot, StateError, StoredSchema};
use allocator_api2::alloc::Allocator;
use hashbrown::HashTable;
use serde::Serialize;

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
    /// ([`header_for`](super::header_for)).
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
