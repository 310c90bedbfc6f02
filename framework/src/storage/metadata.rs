//! The metadata of one checkpoint and its byte format.
//!
//! The metadata file is what makes a checkpoint exist: it lists every part
//! with its size and checksum, the source positions, the key-group layout
//! and the user's own entries. This module encodes and checks it; it never
//! does I/O and never holds a path (part locations are derived from part
//! ids, so a checkpoint directory can be moved).
//!
//! # Layout (format versions 1 and 2, integers little-endian)
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
//!
//! Version 2 (written only when some part is segmented, see
//! [`super::segment`]) appends to the version 1 payload the postcard of
//! [`CheckpointMetadata::segments`]; a checkpoint without segmented parts
//! is written as version 1, byte for byte as before, so older builds still
//! read it. A file of another version is refused with
//! [`MetadataError::UnsupportedVersion`], never guessed at.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::segment::{SegmentInfo, SegmentSource};
use super::{names, CheckpointId, CheckpointKind, PartId};

/// The four bytes every metadata file starts with.
pub const MAGIC: [u8; 4] = *b"SFCM";
/// The newest format version this build writes and reads: 2, with
/// segmented parts. Version 1 (no segmented part) is written whenever it
/// suffices.
pub const FORMAT_VERSION: u16 = 2;
/// The format version of metadata without segmented parts.
pub const FORMAT_VERSION_PLAIN: u16 = 1;

/// Why metadata bytes do not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    /// The header is intact but names a format version this build does
    /// not read (a newer build wrote it).
    #[error(
        "format version {version}, this build reads {FORMAT_VERSION_PLAIN} and {FORMAT_VERSION}"
    )]
    UnsupportedVersion {
        /// The version found.
        version: u16,
    },
    /// The bytes are damaged or not metadata at all.
    #[error("{0}")]
    Corrupt(String),
}
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
    /// The segments of each segmented part, in order (incremental
    /// checkpoints); a part not listed here is its own file, whole. For a
    /// segmented part the [`PartInfo`] describes the assembled bytes.
    /// Encoded after the other fields (format version 2), so it is skipped
    /// by serde here.
    #[serde(skip)]
    pub segments: BTreeMap<PartId, Vec<SegmentInfo>>,
}

impl CheckpointMetadata {
    /// The sum of all part sizes.
    pub fn total_bytes(&self) -> u64 {
        self.parts.iter().map(|part| part.size_bytes).sum()
    }

    /// The bytes this checkpoint wrote itself: whole parts, and of
    /// segmented parts the segments in its own part file and in its own
    /// shared files (not the ranges it refers to in earlier checkpoints).
    pub fn written_bytes(&self) -> u64 {
        self.parts
            .iter()
            .map(|info| match self.segments.get(&info.part) {
                None => info.size_bytes,
                Some(segments) => segments
                    .iter()
                    .filter(|segment| match segment.source {
                        SegmentSource::Own => true,
                        SegmentSource::Shared(checkpoint) => checkpoint == self.checkpoint,
                    })
                    .map(|segment| segment.len)
                    .sum(),
            })
            .sum()
    }

    /// Every shared file a segmented part of this checkpoint reads, as
    /// `(part, checkpoint that wrote it)`.
    pub fn shared_files(&self) -> impl Iterator<Item = (&PartId, CheckpointId)> + '_ {
        self.segments.iter().flat_map(|(part, segments)| {
            segments
                .iter()
                .filter_map(move |segment| segment.shared_checkpoint().map(|id| (part, id)))
        })
    }

    /// Encodes the metadata as a complete file: format version 1 when no
    /// part is segmented, 2 otherwise.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let mut out = vec![0u8; HEADER_LEN];
        postcard::to_io(self, &mut out).map_err(|error| error.to_string())?;
        let version = if self.segments.is_empty() {
            FORMAT_VERSION_PLAIN
        } else {
            postcard::to_io(&self.segments, &mut out).map_err(|error| error.to_string())?;
            FORMAT_VERSION
        };
        let payload_len = (out.len() - HEADER_LEN) as u64;
        if payload_len > MAX_METADATA_BYTES {
            return Err(format!(
                "{payload_len} bytes exceed the limit of {MAX_METADATA_BYTES}"
            ));
        }
        let payload_crc = crc32fast::hash(&out[HEADER_LEN..]);
        out[0..4].copy_from_slice(&MAGIC);
        out[4..6].copy_from_slice(&version.to_le_bytes());
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
        Self::decode_typed(bytes).map_err(|error| error.to_string())
    }

    /// [`Self::decode`] with the reason typed, so that a caller can tell a
    /// file of an unknown format version from a damaged one.
    pub fn decode_typed(bytes: &[u8]) -> Result<Self, MetadataError> {
        let (version, payload) = check_header(bytes)?;
        let corrupt = |error: postcard::Error| MetadataError::Corrupt(format!("payload: {error}"));
        let (mut metadata, rest): (Self, &[u8]) =
            postcard::take_from_bytes(payload).map_err(corrupt)?;
        if version == FORMAT_VERSION {
            metadata.segments = postcard::from_bytes(rest).map_err(corrupt)?;
            if metadata.segments.is_empty() {
                return Err(MetadataError::Corrupt(
                    "format version 2 without a segmented part".to_string(),
                ));
            }
        } else if !rest.is_empty() {
            return Err(MetadataError::Corrupt(format!(
                "{} bytes after the payload",
                rest.len()
            )));
        }
        metadata.check_parts().map_err(MetadataError::Corrupt)?;
        metadata.check_segments().map_err(MetadataError::Corrupt)?;
        Ok(metadata)
    }

    /// Every segmented part is a listed part, its segments add up to its
    /// size, and it refers to no shared file of a later checkpoint.
    fn check_segments(&self) -> Result<(), String> {
        for (part, segments) in &self.segments {
            let info = self
                .parts
                .iter()
                .find(|info| info.part == *part)
                .ok_or_else(|| format!("segments of {part}, which is not a part"))?;
            let total = segments
                .iter()
                .try_fold(0u64, |total, segment| total.checked_add(segment.len));
            if total != Some(info.size_bytes) {
                return Err(format!(
                    "the segments of {part} do not add up to its {} bytes",
                    info.size_bytes
                ));
            }
            if let Some(later) = segments
                .iter()
                .filter_map(SegmentInfo::shared_checkpoint)
                .find(|id| *id > self.checkpoint)
            {
                return Err(format!(
                    "{part} refers to the shared file of checkpoint {later}, which is later"
                ));
            }
        }
        Ok(())
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

fn check_header(bytes: &[u8]) -> Result<(u16, &[u8]), MetadataError> {
    check_header_plain(bytes).map_err(|error| match error {
        HeaderError::Version(version) => MetadataError::UnsupportedVersion { version },
        HeaderError::Corrupt(reason) => MetadataError::Corrupt(reason),
    })
}

enum HeaderError {
    Version(u16),
    Corrupt(String),
}

impl From<String> for HeaderError {
    fn from(reason: String) -> Self {
        HeaderError::Corrupt(reason)
    }
}

fn check_header_plain(bytes: &[u8]) -> Result<(u16, &[u8]), HeaderError> {
    if bytes.len() < HEADER_LEN {
        return Err(HeaderError::Corrupt(format!(
            "{} bytes is shorter than the {HEADER_LEN}-byte header",
            bytes.len()
        )));
    }
    if bytes[0..4] != MAGIC {
        return Err(format!("bad magic {:02x?}", &bytes[0..4]).into());
    }
    let header_crc = u32::from_le_bytes([bytes[20], bytes[21], bytes[22], bytes[23]]);
    if crc32fast::hash(&bytes[0..20]) != header_crc {
        return Err("header checksum mismatch".to_string().into());
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != FORMAT_VERSION && version != FORMAT_VERSION_PLAIN {
        return Err(HeaderError::Version(version));
    }
    let mut length = [0u8; 8];
    length.copy_from_slice(&bytes[8..16]);
    let payload_len = u64::from_le_bytes(length);
    let actual_len = (bytes.len() - HEADER_LEN) as u64;
    if payload_len > MAX_METADATA_BYTES || payload_len != actual_len {
        return Err(
            format!("header says {payload_len} payload bytes, the file has {actual_len}").into(),
        );
    }
    let payload = &bytes[HEADER_LEN..];
    let payload_crc = u32::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
    if crc32fast::hash(payload) != payload_crc {
        return Err("payload checksum mismatch".to_string().into());
    }
    Ok((version, payload))
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
            segments: BTreeMap::new(),
        }
    }

    /// `sample` with part `a[1]` (2 bytes) segmented: one byte of its own
    /// and one byte in the shared file of checkpoint 5.
    fn segmented() -> CheckpointMetadata {
        let mut metadata = sample();
        let segment = |source, offset| SegmentInfo {
            source,
            offset,
            len: 1,
            crc32: 0,
        };
        metadata.segments.insert(
            PartId::new("a", 1),
            vec![
                segment(SegmentSource::Own, 0),
                segment(SegmentSource::Shared(5), 3),
            ],
        );
        metadata
    }

    #[test]
    fn a_plain_checkpoint_is_version_1_and_a_segmented_one_version_2() {
        let plain = sample().encode().unwrap();
        assert_eq!(u16::from_le_bytes([plain[4], plain[5]]), 1);
        let metadata = segmented();
        let bytes = metadata.encode().unwrap();
        assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), 2);
        let back = CheckpointMetadata::decode(&bytes).unwrap();
        assert_eq!(back, metadata);
        assert_eq!(back.written_bytes(), 1 + 1);
        assert_eq!(
            back.shared_files().collect::<Vec<_>>(),
            vec![(&PartId::new("a", 1), 5)]
        );
    }

    #[test]
    fn an_unknown_version_is_a_typed_error() {
        let mut bytes = sample().encode().unwrap();
        bytes[4..6].copy_from_slice(&3u16.to_le_bytes());
        let header_crc = crc32fast::hash(&bytes[0..20]);
        bytes[20..24].copy_from_slice(&header_crc.to_le_bytes());
        assert_eq!(
            CheckpointMetadata::decode_typed(&bytes),
            Err(MetadataError::UnsupportedVersion { version: 3 })
        );
    }

    #[test]
    fn segments_that_do_not_add_up_or_look_ahead_are_rejected() {
        let mut metadata = segmented();
        metadata.segments.get_mut(&PartId::new("a", 1)).unwrap()[0].len = 2;
        check_rejected(&metadata.encode().unwrap(), "do not add up");
        let mut metadata = segmented();
        metadata.segments.get_mut(&PartId::new("a", 1)).unwrap()[1].source =
            SegmentSource::Shared(8);
        check_rejected(&metadata.encode().unwrap(), "which is later");
    }

    #[test]
    fn every_single_bit_flip_of_a_segmented_file_is_rejected() {
        let bytes = segmented().encode().unwrap();
        for bit in 0..bytes.len() * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(CheckpointMetadata::decode(&damaged).is_err(), "bit {bit}");
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
        bytes[4..6].copy_from_slice(&FORMAT_VERSION_PLAIN.to_le_bytes());
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
