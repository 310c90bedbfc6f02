//! The byte format of one state blob: a fixed header, the writer's schema,
//! and the payload.
//!
//! A blob is self-describing and self-checking. It is checked when it is
//! written (the encoder re-reads its own header) and again when it is read;
//! decoding hostile bytes returns [`StateError::Corrupt`] and never panics.
//! Decoding never allocates more than the input's length justifies, because
//! every length in the header must add up to exactly the input's length
//! before anything is read.
//!
//! This module never does I/O; the storage layer moves blobs around as
//! opaque bytes.
//!
//! # Layout (format version 1, all integers little-endian)
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0      | 4    | magic `b"SFB1"` |
//! | 4      | 2    | format version, `1` |
//! | 6      | 2    | flags, `0` (reserved) |
//! | 8      | 4    | user version (`#[snapshot(version = N)]`) |
//! | 12     | 8    | schema fingerprint |
//! | 20     | 4    | schema section length `S` (at most [`MAX_SCHEMA_LEN`]) |
//! | 24     | 8    | payload length `P` |
//! | 32     | 4    | CRC-32 (IEEE) of schema section and payload |
//! | 36     | 4    | CRC-32 (IEEE) of bytes 0..36 |
//! | 40     | S    | schema section: postcard of [`StoredSchema`] |
//! | 40 + S | P    | payload, as written by [`Snapshot::encode_payload`] |
//!
//! The input's length must be exactly `40 + S + P`.

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
pub fn encode<T: Snapshot>(value: &T) -> Result<Vec<u8>, StateError> {
    let schema = postcard::to_allocvec(&StoredSchema::of(&T::SCHEMA)).map_err(|error| {
        StateError::Encode {
            type_name: T::SCHEMA.type_name,
            reason: error.to_string(),
        }
    })?;
    let schema_len = u32::try_from(schema.len())
        .ok()
        .filter(|len| *len <= MAX_SCHEMA_LEN)
        .ok_or_else(|| StateError::Encode {
            type_name: T::SCHEMA.type_name,
            reason: format!("schema section of {} bytes is too large", schema.len()),
        })?;
    let mut out = vec![0u8; HEADER_LEN];
    out.extend_from_slice(&schema);
    value.encode_payload(&mut out)?;
    let payload_len = (out.len() - HEADER_LEN - schema.len()) as u64;
    let header = BlobHeader {
        format_version: FORMAT_VERSION,
        user_version: T::SCHEMA.version,
        fingerprint: T::fingerprint(),
        schema_len,
        payload_len,
        body_crc: crc32fast::hash(&out[HEADER_LEN..]),
    };
    write_header(&header, &mut out[..HEADER_LEN]);
    // Checked before it is written: a blob we cannot read back is a bug.
    debug_assert!(
        decode_header(&out).is_ok(),
        "encoder wrote an unreadable header"
    );
    Ok(out)
}

/// Decodes a blob into `T`, checking magic, lengths and checksums first, then
/// the schema (following `T`'s upgrade chain), then the payload.
pub fn decode<T: Snapshot>(bytes: &[u8]) -> Result<T, StateError> {
    let (stored, payload) = decode_parts(bytes)?;
    T::decode_stored(&stored, payload)
}

/// Verifies a blob's structure and checksums without knowing its type, and
/// returns the stored schema. The storage layer uses it to check parts.
pub fn verify(bytes: &[u8]) -> Result<StoredSchema, StateError> {
    decode_parts(bytes).map(|(stored, _)| stored)
}

/// Decodes and checks the fixed header: magic, format version, header
/// checksum, and that the lengths add up to exactly `bytes.len()`.
pub fn decode_header(bytes: &[u8]) -> Result<BlobHeader, StateError> {
    let corrupt = |reason: String| StateError::Corrupt(reason);
    if bytes.len() < HEADER_LEN {
        return Err(corrupt(format!(
            "{} bytes is shorter than the {HEADER_LEN}-byte header",
            bytes.len()
        )));
    }
    if bytes[0..4] != MAGIC {
        return Err(corrupt(format!("bad magic {:02x?}", &bytes[0..4])));
    }
    let header_crc = read_u32(bytes, 36);
    if crc32fast::hash(&bytes[..36]) != header_crc {
        return Err(corrupt("header checksum mismatch".to_string()));
    }
    let header = BlobHeader {
        format_version: u16::from_le_bytes([bytes[4], bytes[5]]),
        user_version: read_u32(bytes, 8),
        fingerprint: read_u64(bytes, 12),
        schema_len: read_u32(bytes, 20),
        payload_len: read_u64(bytes, 24),
        body_crc: read_u32(bytes, 32),
    };
    if header.format_version != FORMAT_VERSION {
        return Err(corrupt(format!(
            "format version {} is not supported (this build reads {FORMAT_VERSION})",
            header.format_version
        )));
    }
    if u16::from_le_bytes([bytes[6], bytes[7]]) != 0 {
        return Err(corrupt("reserved flags are set".to_string()));
    }
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
            "header claims {} schema bytes and {} payload bytes, but {body_len} bytes follow the header",
            header.schema_len, header.payload_len
        )));
    }
    Ok(header)
}

fn decode_parts(bytes: &[u8]) -> Result<(StoredSchema, &[u8]), StateError> {
    let header = decode_header(bytes)?;
    let body = &bytes[HEADER_LEN..];
    if crc32fast::hash(body) != header.body_crc {
        return Err(StateError::Corrupt("body checksum mismatch".to_string()));
    }
    let (schema_bytes, payload) = body.split_at(header.schema_len as usize);
    let stored: StoredSchema = postcard::from_bytes(schema_bytes)
        .map_err(|error| StateError::Corrupt(format!("schema section does not decode: {error}")))?;
    if stored.version != header.user_version || stored.fingerprint != header.fingerprint {
        return Err(StateError::Corrupt(
            "schema section disagrees with the header".to_string(),
        ));
    }
    Ok((stored, payload))
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

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    let mut buffer = [0u8; 4];
    buffer.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(buffer)
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut buffer = [0u8; 8];
    buffer.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(buffer)
}
