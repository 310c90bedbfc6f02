//! The byte format of one state blob: a fixed header, the writer's schema,
//! and the payload.
//!
//! This module owns the envelope around a state value: magic, versions,
//! lengths and checksums. It never does I/O (the storage layer moves blobs
//! around as opaque bytes) and never interprets the payload itself; that is
//! the job of the type's [`Snapshot`] implementation.
//!
//! A blob is self-describing and self-checking. Decoding hostile bytes
//! returns [`StateError::Corrupt`] (or, past the checksums, the type's own
//! payload error) and never panics. A single flipped bit anywhere in a blob
//! is always detected: the header and the body each carry a CRC-32, and
//! CRC-32 catches every single-bit error.
//!
//! # Layout (format version 1, all integers little-endian)
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0      | 4    | magic `b"SFB1"` |
//! | 4      | 2    | format version, `1` |
//! | 6      | 2    | flags, `0` (reserved; any other value is rejected) |
//! | 8      | 4    | user version (`#[snapshot(version = N)]`) |
//! | 12     | 8    | schema fingerprint |
//! | 20     | 4    | schema section length `S` (at most [`MAX_SCHEMA_LEN`]) |
//! | 24     | 8    | payload length `P` |
//! | 32     | 4    | body CRC: CRC-32 (IEEE) of bytes `40..40 + S + P` |
//! | 36     | 4    | header CRC: CRC-32 (IEEE) of bytes `0..36` |
//! | 40     | S    | schema section: postcard of [`StoredSchema`], nothing after it |
//! | 40 + S | P    | payload, as written by [`Snapshot::encode_payload`] |
//!
//! The input's length must be exactly `40 + S + P`. The user version and
//! fingerprint appear twice, in the header and in the schema section; the
//! two copies must agree.
//!
//! # Order of checks
//!
//! Length of at least 40 bytes, magic, format version, header CRC, flags,
//! schema length limit, `40 + S + P == input length`, body CRC, schema
//! section, then the payload through the type's upgrade chain. The format
//! version is checked before the header CRC because a future format may
//! move or widen the checksum; bytes 0..6 are the only part every format
//! version must keep. The cost is that a corrupted version field is reported
//! as an unsupported version rather than as a checksum mismatch.
//!
//! # Allocation bound
//!
//! Nothing is allocated from a length field until that length has been
//! checked against the bytes actually present: the header lengths must add
//! up to the input's length, and inside the schema section postcard refuses
//! a string or sequence whose claimed length exceeds the remaining bytes
//! (`Flavor::try_take_n`, and `SeqAccess::size_hint` returns `None` in that
//! case so serde preallocates nothing). Where the claim does fit, serde's
//! `size_hint::cautious` caps any preallocation at 1 MiB. So decoding the
//! header and the schema section of an `L`-byte input allocates at most
//! about `24 * L` bytes (one 24-byte `String` per one-byte empty string in
//! the field list) plus error text. The payload is decoded by the type's own
//! code; for postcard payloads the same bounds hold, except that postcard's
//! map access reports a map's claimed length unchecked, so a `HashMap` field
//! may preallocate up to serde's 1 MiB cap for each map being decoded.

use super::{Snapshot, StateError, StoredSchema};

/// The four bytes every blob starts with.
pub const MAGIC: [u8; 4] = *b"SFB1";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u16 = 1;
/// The length of the fixed header.
pub const HEADER_LEN: usize = 40;
/// The largest schema section accepted. Schemas are field lists; 64 KiB is
/// far beyond any real type and bounds what a hostile header can claim.
pub const MAX_SCHEMA_LEN: u32 = 64 * 1024;

/// The fixed header of a blob, as decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobHeader {
    /// The format version.
    pub format_version: u16,
    /// The user version of the stored type.
    pub user_version: u32,
    /// The stored schema fingerprint.
    pub fingerprint: u64,
    /// The schema section's length.
    pub schema_len: u32,
    /// The payload's length.
    pub payload_len: u64,
    /// CRC-32 of schema section and payload.
    pub body_crc: u32,
}

/// Encodes `value` as a complete blob.
///
/// Fails with [`StateError::Encode`] when the value cannot be serialized,
/// when the schema section would exceed [`MAX_SCHEMA_LEN`], or when the
/// type's [`Snapshot::encode_payload`] did not simply append to its buffer.
pub fn encode<T: Snapshot>(value: &T) -> Result<Vec<u8>, StateError> {
    let encode_error = |reason: String| StateError::Encode {
        type_name: T::SCHEMA.type_name,
        reason,
    };
    // The header copies its version and fingerprint from the schema section
    // so the two always agree, even if an impl overrides
    // `Snapshot::fingerprint`; readers compare against `T::fingerprint()`.
    let stored = StoredSchema {
        fingerprint: T::fingerprint(),
        ..StoredSchema::of(&T::SCHEMA)
    };
    let schema = postcard::to_allocvec(&stored).map_err(|error| encode_error(error.to_string()))?;
    let schema_len = u32::try_from(schema.len())
        .ok()
        .filter(|len| *len <= MAX_SCHEMA_LEN)
        .ok_or_else(|| {
            encode_error(format!(
                "schema section of {} bytes is larger than the limit {MAX_SCHEMA_LEN}",
                schema.len()
            ))
        })?;
    let prefix_len = HEADER_LEN + schema.len();
    let mut out = vec![0u8; HEADER_LEN];
    out.extend_from_slice(&schema);
    value.encode_payload(&mut out)?;
    // `encode_payload` is user code (hand-written impls exist); one that
    // truncated or rewrote the buffer would otherwise produce a blob whose
    // schema section is wrong, or make the length below underflow.
    if out.len() < prefix_len || out[HEADER_LEN..prefix_len] != schema[..] {
        return Err(encode_error(
            "encode_payload changed bytes it did not append".to_string(),
        ));
    }
    let header = BlobHeader {
        format_version: FORMAT_VERSION,
        user_version: stored.version,
        fingerprint: stored.fingerprint,
        schema_len,
        payload_len: (out.len() - prefix_len) as u64,
        body_crc: crc32fast::hash(&out[HEADER_LEN..]),
    };
    write_header(&header, &mut out[..HEADER_LEN]);
    // A blob this build cannot read back is a bug in this module, not bad
    // input, so it is an assertion; it only runs in debug builds because it
    // re-hashes the header.
    debug_assert_eq!(decode_header(&out).ok(), Some(header));
    Ok(out)
}

/// Decodes a blob into `T`: checks the envelope (see the module docs for the
/// order), then the schema against `T`'s (following `T`'s upgrade chain),
/// then decodes the payload.
pub fn decode<T: Snapshot>(bytes: &[u8]) -> Result<T, StateError> {
    let (stored, payload) = decode_parts(bytes)?;
    T::decode_stored(&stored, payload)
}

/// Verifies a blob's structure and both checksums without knowing its type,
/// and returns the stored schema. The storage layer uses it to check parts.
/// It does not decode the payload, so a blob that passes may still fail
/// [`decode`] for a given type.
pub fn verify(bytes: &[u8]) -> Result<StoredSchema, StateError> {
    decode_parts(bytes).map(|(stored, _)| stored)
}

/// Decodes and checks the fixed header: magic, format version, header
/// checksum, reserved flags, the schema length limit, and that the lengths
/// add up to exactly `bytes.len()`. It does not check the body checksum.
pub fn decode_header(bytes: &[u8]) -> Result<BlobHeader, StateError> {
    if bytes.len() < HEADER_LEN {
        return Err(corrupt(format!(
            "{} bytes is shorter than the {HEADER_LEN}-byte header",
            bytes.len()
        )));
    }
    if bytes[0..4] != MAGIC {
        return Err(corrupt(format!("bad magic {:02x?}", &bytes[0..4])));
    }
    let format_version = read_u16(bytes, 4);
    if format_version != FORMAT_VERSION {
        return Err(corrupt(format!(
            "format version {format_version} is not supported (this build reads \
             {FORMAT_VERSION}), or the header is damaged"
        )));
    }
    if crc32fast::hash(&bytes[..36]) != read_u32(bytes, 36) {
        return Err(corrupt("header checksum mismatch".to_string()));
    }
    let flags = read_u16(bytes, 6);
    if flags != 0 {
        return Err(corrupt(format!(
            "reserved flags {flags:#06x} are set; this build knows no flags"
        )));
    }
    let header = BlobHeader {
        format_version,
        user_version: read_u32(bytes, 8),
        fingerprint: read_u64(bytes, 12),
        schema_len: read_u32(bytes, 20),
        payload_len: read_u64(bytes, 24),
        body_crc: read_u32(bytes, 32),
    };
    if header.schema_len > MAX_SCHEMA_LEN {
        return Err(corrupt(format!(
            "schema section claims {} bytes, more than the limit {MAX_SCHEMA_LEN}",
            header.schema_len
        )));
    }
    let body_len = (bytes.len() - HEADER_LEN) as u64;
    let claimed = u64::from(header.schema_len).checked_add(header.payload_len);
    if claimed != Some(body_len) {
        return Err(corrupt(format!(
            "header claims {} schema bytes and {} payload bytes, but {body_len} bytes \
             follow the header",
            header.schema_len, header.payload_len
        )));
    }
    Ok(header)
}

/// Checks everything but the payload and splits the body into the decoded
/// schema section and the raw payload.
fn decode_parts(bytes: &[u8]) -> Result<(StoredSchema, &[u8]), StateError> {
    let header = decode_header(bytes)?;
    let body = &bytes[HEADER_LEN..];
    if crc32fast::hash(body) != header.body_crc {
        return Err(corrupt("body checksum mismatch".to_string()));
    }
    // `decode_header` proved `schema_len + payload_len == body.len()`, so
    // the split point is in range.
    let (schema_bytes, payload) = body.split_at(header.schema_len as usize);
    let stored = decode_schema_section(schema_bytes)?;
    if stored.version != header.user_version || stored.fingerprint != header.fingerprint {
        return Err(corrupt(format!(
            "schema section (version {}, fingerprint {:#018x}) disagrees with the header \
             (version {}, fingerprint {:#018x})",
            stored.version, stored.fingerprint, header.user_version, header.fingerprint
        )));
    }
    Ok((stored, payload))
}

/// Decodes the schema section, which must be exactly one [`StoredSchema`]:
/// trailing bytes would make two different byte strings decode to the same
/// blob, so they are rejected.
fn decode_schema_section(bytes: &[u8]) -> Result<StoredSchema, StateError> {
    let (stored, rest) = postcard::take_from_bytes::<StoredSchema>(bytes)
        .map_err(|error| corrupt(format!("schema section does not decode: {error}")))?;
    if !rest.is_empty() {
        return Err(corrupt(format!(
            "{} trailing bytes after the schema section's contents",
            rest.len()
        )));
    }
    Ok(stored)
}

fn corrupt(reason: String) -> StateError {
    StateError::Corrupt(reason)
}

fn write_header(header: &BlobHeader, out: &mut [u8]) {
    out[0..4].copy_from_slice(&MAGIC);
    out[4..6].copy_from_slice(&header.format_version.to_le_bytes());
    out[6..8].copy_from_slice(&0u16.to_le_bytes());
    out[8..12].copy_from_slice(&header.user_version.to_le_bytes());
    out[12..20].copy_from_slice(&header.fingerprint.to_le_bytes());
    out[20..24].copy_from_slice(&header.schema_len.to_le_bytes());
    out[24..32].copy_from_slice(&header.payload_len.to_le_bytes());
    out[32..36].copy_from_slice(&header.body_crc.to_le_bytes());
    let header_crc = crc32fast::hash(&out[..36]);
    out[36..40].copy_from_slice(&header_crc.to_le_bytes());
}

// Little-endian readers for fixed headers, shared with the keyed part format
// (`crate::keyed`). Callers pass only offsets inside a header whose length
// they have already checked, so the slicing cannot go out of range.

pub(crate) fn read_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

pub(crate) fn read_u32(bytes: &[u8], at: usize) -> u32 {
    let mut buffer = [0u8; 4];
    buffer.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(buffer)
}

pub(crate) fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut buffer = [0u8; 8];
    buffer.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(buffer)
}
