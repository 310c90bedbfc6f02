//! The metadata of one checkpoint and its byte format.
//!
//! The metadata file is what makes a checkpoint exist: it lists every part
//! with its size and checksum, the source positions, the key-group layout
//! and the user's own entries. This module encodes and checks it; it never
//! does I/O and never holds a path (part locations are derived from part
//! ids, so a checkpoint directory can be moved).
//!
//! # Layout (format version 1, integers little-endian)
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0      | 4    | magic `b"SFCM"` |
//! | 4      | 2    | format version, `1` |
//! | 6      | 2    | flags, `0` (reserved) |
//! | 8      | 8    | payload length `P` (at most [`MAX_METADATA_BYTES`]) |
//! | 16     | 4    | CRC-32 (IEEE) of the payload |
//! | 20     | 4    | CRC-32 (IEEE) of bytes 0..20 |
//! | 24     | P    | postcard of [`CheckpointMetadata`] |
//!
//! The file's length must be exactly `24 + P`; a truncated or extended file
//! is corrupt.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{names, CheckpointId, CheckpointKind, PartId};

/// The four bytes every metadata file starts with.
pub const MAGIC: [u8; 4] = *b"SFCM";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u16 = 1;
/// The length of the fixed header.
pub const HEADER_LEN: usize = 24;
/// The largest metadata payload accepted. Metadata lists parts and source
/// positions; 64 MiB is far beyond any real job and bounds what a damaged
/// header can make a reader allocate.
pub const MAX_METADATA_BYTES: u64 = 64 * 1024 * 1024;

/// One part as recorded in the metadata.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PartInfo {
    /// Which operator subtask wrote it.
    pub part: PartId,
    /// Its length in bytes.
    pub size_bytes: u64,
    /// CRC-32 (IEEE, as `crc32fast` computes it) of its bytes.
    pub crc32: u32,
}

impl PartInfo {
    /// The size and checksum of `bytes` as part `part`.
    pub fn of(part: PartId, bytes: &[u8]) -> Self {
        Self {
            part,
            size_bytes: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
        }
    }

    /// Checks `bytes` against the recorded size and checksum; the error
    /// says which one differs.
    pub fn verify(&self, bytes: &[u8]) -> Result<(), String> {
        if bytes.len() as u64 != self.size_bytes {
            return Err(format!(
                "size is {} bytes, metadata says {}",
                bytes.len(),
                self.size_bytes
            ));
        }
        let crc32 = crc32fast::hash(bytes);
        if crc32 != self.crc32 {
            return Err(format!(
                "CRC-32 is {crc32:08x}, metadata says {:08x}",
                self.crc32
            ));
        }
        Ok(())
    }
}

/// How keyed state is split into key groups. The maximum parallelism is
/// fixed when a job is first created; restoring at a different parallelism
/// reassigns whole key groups.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyGroupLayout {
    /// The number of key groups (Flink's max parallelism); 0 when the job
    /// has no keyed state.
    pub max_parallelism: u32,
    /// Each operator's parallelism when the checkpoint was taken.
    pub operator_parallelism: BTreeMap<String, u32>,
}

/// Everything recorded about one complete checkpoint or savepoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointMetadata {
    /// The job's name.
    pub job: String,
    /// The checkpoint's id.
    pub checkpoint: CheckpointId,
    /// Checkpoint or savepoint.
    pub kind: CheckpointKind,
    /// When it was triggered, in milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Every part, sorted by part id.
    pub parts: Vec<PartInfo>,
    /// Each source subtask's position, as opaque bytes.
    pub source_positions: BTreeMap<PartId, Vec<u8>>,
    /// The key-group layout.
    pub key_groups: KeyGroupLayout,
    /// Free user metadata.
    pub user: BTreeMap<String, String>,
}

impl CheckpointMetadata {
    /// The sum of all part sizes.
    pub fn total_bytes(&self) -> u64 {
        self.parts.iter().map(|part| part.size_bytes).sum()
    }

    /// Encodes the metadata as a complete file.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let mut out = vec![0u8; HEADER_LEN];
        postcard::to_io(self, &mut out).map_err(|error| error.to_string())?;
        let payload_len = (out.len() - HEADER_LEN) as u64;
        if payload_len > MAX_METADATA_BYTES {
            return Err(format!(
                "{payload_len} bytes exceed the limit of {MAX_METADATA_BYTES}"
            ));
        }
        let payload_crc = crc32fast::hash(&out[HEADER_LEN..]);
        out[0..4].copy_from_slice(&MAGIC);
        out[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[6..8].copy_from_slice(&0u16.to_le_bytes());
        out[8..16].copy_from_slice(&payload_len.to_le_bytes());
        out[16..20].copy_from_slice(&payload_crc.to_le_bytes());
        let header_crc = crc32fast::hash(&out[0..20]);
        out[20..24].copy_from_slice(&header_crc.to_le_bytes());
        Ok(out)
    }

    /// Decodes and checks a metadata file: header, lengths, both checksums,
    /// the payload, and that every part's operator name is valid and every
    /// part is listed once. Hostile bytes give an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let payload = check_header(bytes)?;
        let metadata: Self =
            postcard::from_bytes(payload).map_err(|error| format!("payload: {error}"))?;
        metadata.check_parts()?;
        Ok(metadata)
    }

    fn check_parts(&self) -> Result<(), String> {
        for pair in self.parts.windows(2) {
            if pair[0].part >= pair[1].part {
                return Err(format!(
                    "parts are not sorted and unique at {}",
                    pair[1].part
                ));
            }
        }
        for info in &self.parts {
            names::validate("operator", &info.part.operator).map_err(|error| error.to_string())?;
        }
        Ok(())
    }
}

fn check_header(bytes: &[u8]) -> Result<&[u8], String> {
    if bytes.len() < HEADER_LEN {
        return Err(format!(
            "{} bytes is shorter than the {HEADER_LEN}-byte header",
            bytes.len()
        ));
    }
    if bytes[0..4] != MAGIC {
        return Err(format!("bad magic {:02x?}", &bytes[0..4]));
    }
    let header_crc = u32::from_le_bytes([bytes[20], bytes[21], bytes[22], bytes[23]]);
    if crc32fast::hash(&bytes[0..20]) != header_crc {
        return Err("header checksum mismatch".to_string());
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version}, this build reads {FORMAT_VERSION}"
        ));
    }
    let mut length = [0u8; 8];
    length.copy_from_slice(&bytes[8..16]);
    let payload_len = u64::from_le_bytes(length);
    let actual_len = (bytes.len() - HEADER_LEN) as u64;
    if payload_len > MAX_METADATA_BYTES || payload_len != actual_len {
        return Err(format!(
            "header says {payload_len} payload bytes, the file has {actual_len}"
        ));
    }
    let payload = &bytes[HEADER_LEN..];
    let payload_crc = u32::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
    if crc32fast::hash(payload) != payload_crc {
        return Err("payload checksum mismatch".to_string());
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CheckpointMetadata {
        CheckpointMetadata {
            job: "job".into(),
            checkpoint: 7,
            kind: CheckpointKind::Checkpoint,
            created_unix_ms: 1_700_000_000_000,
            parts: vec![
                PartInfo::of(PartId::new("a", 0), b"x"),
                PartInfo::of(PartId::new("a", 1), b"yy"),
            ],
            source_positions: BTreeMap::from([(PartId::new("src", 0), vec![1, 2, 3])]),
            key_groups: KeyGroupLayout {
                max_parallelism: 128,
                operator_parallelism: BTreeMap::from([("a".to_string(), 2)]),
            },
            user: BTreeMap::from([("k".to_string(), "v".to_string())]),
        }
    }

    fn check_rejected(bytes: &[u8], expected_reason: &str) {
        let error = CheckpointMetadata::decode(bytes).expect_err("must be rejected");
        assert!(error.contains(expected_reason), "{error}");
    }

    #[test]
    fn round_trip() {
        let metadata = sample();
        let bytes = metadata.encode().unwrap();
        assert_eq!(CheckpointMetadata::decode(&bytes).unwrap(), metadata);
    }

    #[test]
    fn every_truncation_is_rejected() {
        let bytes = sample().encode().unwrap();
        for len in 0..bytes.len() {
            assert!(
                CheckpointMetadata::decode(&bytes[..len]).is_err(),
                "len {len}"
            );
        }
    }

    #[test]
    fn every_single_bit_flip_is_rejected() {
        let bytes = sample().encode().unwrap();
        for bit in 0..bytes.len() * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(CheckpointMetadata::decode(&damaged).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn extra_bytes_are_rejected() {
        let mut bytes = sample().encode().unwrap();
        bytes.push(0);
        check_rejected(&bytes, "payload bytes");
    }

    #[test]
    fn unsorted_parts_are_rejected() {
        let mut metadata = sample();
        metadata.parts.reverse();
        check_rejected(&metadata.encode().unwrap(), "not sorted");
    }

    /// Wraps `payload` in a valid header, so the checksums pass and the
    /// payload decoder itself meets the hostile bytes.
    fn with_valid_header(payload: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0u8; HEADER_LEN];
        bytes.extend_from_slice(payload);
        bytes[0..4].copy_from_slice(&MAGIC);
        bytes[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        bytes[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        bytes[16..20].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
        let header_crc = crc32fast::hash(&bytes[0..20]);
        bytes[20..24].copy_from_slice(&header_crc.to_le_bytes());
        bytes
    }

    proptest::proptest! {
        #[test]
        fn hostile_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = CheckpointMetadata::decode(&bytes);
            let _ = CheckpointMetadata::decode(&with_valid_header(&bytes));
        }

        #[test]
        fn damaged_payloads_behind_a_valid_header_never_panic(index in 0usize..4096, byte in proptest::num::u8::ANY) {
            let payload = sample().encode().unwrap()[HEADER_LEN..].to_vec();
            let mut damaged = payload.clone();
            let index = index % damaged.len();
            damaged[index] = byte;
            let _ = CheckpointMetadata::decode(&with_valid_header(&damaged));
            // Cut short too: every prefix of a valid payload.
            let _ = CheckpointMetadata::decode(&with_valid_header(&payload[..index]));
        }
    }

    #[test]
    fn a_huge_claimed_length_allocates_nothing_large() {
        // A payload claiming a vector of 2^60 parts: postcard reads the
        // length as a varint and must fail on the missing bytes, not
        // allocate for the claim.
        let mut payload = vec![3, b'j', b'o', b'b', 1, 0, 0];
        payload.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert!(CheckpointMetadata::decode(&with_valid_header(&payload)).is_err());
    }

    #[test]
    fn part_verify_names_the_difference() {
        let info = PartInfo::of(PartId::new("a", 0), b"abc");
        assert!(info.verify(b"abc").is_ok());
        assert!(info.verify(b"ab").unwrap_err().contains("size"));
        assert!(info.verify(b"abd").unwrap_err().contains("CRC-32"));
    }
}
