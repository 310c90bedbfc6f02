//! A part's fixed header and delta chains: the layout's constants,
//! reading and checking a header, writing one, splitting a key group's
//! bytes into its chain and describing a part without its types
//! (`mod.rs` has the layout). It never decodes an entry.

use crate::keyed::key_group::MaxParallelism;
use crate::state::blob::{read_u16, read_u32, read_u64, MAX_SCHEMA_LEN};
use crate::state::StoredSchema;

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

/// The header of a part of `key_group` whose body (the schema section of
/// `schema_len` bytes, then the entries) is `body_len` bytes long with
/// CRC `body_crc` and holds `entry_count` entries: exactly the header a
/// [`PartWriter`](super::PartWriter) writes for the same body. An incremental checkpoint of
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
/// parallelism or the key group; [`decode_into`](super::decode_into) does. A chain (module
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

pub(super) fn write_header(header: &PartHeader, flags: u16, out: &mut [u8]) {
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
