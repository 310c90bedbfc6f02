//! Tests of the state blob format (`snapflow::state::blob`): header fields,
//! round trips, and rejection of damaged or hostile bytes (truncation, every
//! single-bit flip, forged length fields, bad magic, versions and flags).
//!
//! Randomised cases use proptest; a failure prints the minimal input, and
//! `PROPTEST_RNG_SEED=<n>` replays a run. Allocation bounds are tested in
//! `blob_alloc.rs`, which needs its own binary for a global allocator.

mod blob_support;

use blob_support::{
    journal_strategy, sample_journal, schema_section_of, seal_for, seal_payload_for, Counter,
    Forge, Journal,
};
use proptest::prelude::*;
use snapflow::state::blob::{self, BlobHeader, FORMAT_VERSION, HEADER_LEN, MAGIC, MAX_SCHEMA_LEN};
use snapflow::state::{Snapshot, StateError, StoredSchema};

fn sample_blob() -> Vec<u8> {
    blob::encode(&sample_journal()).expect("the sample encodes")
}

/// Asserts that `bytes` is rejected by `decode::<Journal>` and by `verify`
/// as corrupt, with a reason containing `reason`.
fn check_corrupt(bytes: &[u8], reason: &str) {
    let decoded = blob::decode::<Journal>(bytes);
    match &decoded {
        Err(StateError::Corrupt(text)) => assert!(
            text.contains(reason),
            "expected a reason containing {reason:?}, got {text:?}"
        ),
        other => panic!("expected Corrupt({reason:?}), got {other:?}"),
    }
    assert!(!decoded.unwrap_err().is_retryable());
    assert!(
        blob::verify(bytes).is_err(),
        "verify accepted what decode rejected"
    );
}

/// A forge that describes the sample journal's blob honestly.
fn sample_forge() -> (Forge, Vec<u8>, Vec<u8>) {
    let schema = schema_section_of::<Journal>();
    let mut payload = Vec::new();
    sample_journal().encode_payload(&mut payload).unwrap();
    let forge = Forge::honest(&schema, &payload, 3, Journal::fingerprint());
    (forge, schema, payload)
}

#[test]
fn forge_reproduces_the_encoder_byte_for_byte() {
    let (forge, schema, payload) = sample_forge();
    assert_eq!(forge.seal(&schema, &payload), sample_blob());
}

#[test]
fn decode_header_reports_every_field() {
    let bytes = sample_blob();
    let schema_len = schema_section_of::<Journal>().len();
    let header = blob::decode_header(&bytes).unwrap();
    let expected = BlobHeader {
        format_version: FORMAT_VERSION,
        user_version: 3,
        fingerprint: Journal::fingerprint(),
        schema_len: schema_len as u32,
        payload_len: (bytes.len() - HEADER_LEN - schema_len) as u64,
        body_crc: crc32fast::hash(&bytes[HEADER_LEN..]),
    };
    assert_eq!(header, expected);
    assert_eq!(bytes[0..4], MAGIC);
}

#[test]
fn verify_returns_the_stored_schema() {
    let stored = blob::verify(&sample_blob()).unwrap();
    assert_eq!(stored, StoredSchema::of(&Journal::SCHEMA));
    assert_eq!(stored.fields[0], "raw: Vec<u8>");
}

#[test]
fn sample_round_trips() {
    assert_eq!(
        blob::decode::<Journal>(&sample_blob()).unwrap(),
        sample_journal()
    );
}

#[test]
fn another_type_is_a_schema_error_not_corruption() {
    let counter = blob::encode(&Counter { count: 9 }).unwrap();
    assert!(matches!(
        blob::decode::<Journal>(&counter),
        Err(StateError::VersionMismatch {
            stored: 1,
            expected: 3,
            ..
        })
    ));
}

#[test]
fn same_version_different_fields_is_schema_mismatch() {
    let schema = StoredSchema {
        type_name: "Counter".to_string(),
        version: 1,
        fingerprint: 42,
        fields: vec!["total: u64".to_string()],
    };
    let section = postcard::to_allocvec(&schema).unwrap();
    let bytes = Forge::honest(&section, &[9], 1, 42).seal(&section, &[9]);
    match blob::decode::<Counter>(&bytes) {
        Err(StateError::SchemaMismatch(details)) => {
            assert_eq!(details.stored_fields, ["total: u64"]);
            assert_eq!(details.expected_fields, ["count: u64"]);
        }
        other => panic!("expected SchemaMismatch, got {other:?}"),
    }
}

#[test]
fn truncation_at_every_offset_is_rejected() {
    let bytes = sample_blob();
    for len in 0..bytes.len() {
        let reason = if len < HEADER_LEN {
            "shorter than the 40-byte header"
        } else {
            "bytes follow the header"
        };
        check_corrupt(&bytes[..len], reason);
    }
}

#[test]
fn appended_bytes_are_rejected() {
    let mut bytes = sample_blob();
    bytes.push(0);
    check_corrupt(&bytes, "bytes follow the header");
}

#[test]
fn every_single_bit_flip_is_rejected() {
    let bytes = sample_blob();
    for bit in 0..bytes.len() * 8 {
        let mut damaged = bytes.clone();
        damaged[bit / 8] ^= 1 << (bit % 8);
        let decoded = blob::decode::<Journal>(&damaged);
        assert!(
            matches!(decoded, Err(StateError::Corrupt(_))),
            "flipping bit {bit} gave {decoded:?}"
        );
        assert!(
            blob::verify(&damaged).is_err(),
            "verify accepted flip {bit}"
        );
    }
}

#[test]
fn wrong_magic_is_rejected() {
    let (mut forge, schema, payload) = sample_forge();
    forge.magic = *b"SFB2";
    check_corrupt(&forge.seal(&schema, &payload), "bad magic");
    check_corrupt(&[0u8; 64], "bad magic");
}

#[test]
fn unsupported_format_version_is_rejected() {
    let (mut forge, schema, payload) = sample_forge();
    for version in [0, 2, u16::MAX] {
        forge.format_version = version;
        check_corrupt(
            &forge.seal(&schema, &payload),
            &format!("format version {version} is not supported"),
        );
    }
}

#[test]
fn reserved_flags_are_rejected() {
    let (mut forge, schema, payload) = sample_forge();
    for flags in [1, 0x8000, u16::MAX] {
        forge.flags = flags;
        check_corrupt(&forge.seal(&schema, &payload), "reserved flags");
    }
}

#[test]
fn header_checksum_is_checked() {
    let mut bytes = sample_blob();
    bytes[36] ^= 0xff;
    check_corrupt(&bytes, "header checksum mismatch");
}

#[test]
fn body_checksum_is_checked() {
    let (mut forge, schema, payload) = sample_forge();
    let correct = crc32fast::hash(&sample_blob()[HEADER_LEN..]);
    forge.body_crc = Some(correct ^ 1);
    check_corrupt(&forge.seal(&schema, &payload), "body checksum mismatch");
}

/// Forges a header whose lengths claim `schema_len` and `payload_len` over
/// the sample's real body, with a valid header CRC.
fn check_claimed_lengths(schema_len: u32, payload_len: u64, reason: &str) {
    let (mut forge, schema, payload) = sample_forge();
    forge.schema_len = schema_len;
    forge.payload_len = payload_len;
    check_corrupt(&forge.seal(&schema, &payload), reason);
}

#[test]
fn schema_length_over_the_limit() {
    check_claimed_lengths(MAX_SCHEMA_LEN + 1, 0, "more than the limit");
    check_claimed_lengths(u32::MAX, 10, "more than the limit");
}

#[test]
fn gigabyte_payload_claims() {
    check_claimed_lengths(10, 1 << 30, "bytes follow the header");
    check_claimed_lengths(10, 1 << 40, "bytes follow the header");
    check_claimed_lengths(MAX_SCHEMA_LEN, u64::MAX, "bytes follow the header");
    check_claimed_lengths(0, u64::MAX - 5, "bytes follow the header");
}

#[test]
fn lengths_that_split_the_body_elsewhere() {
    let (forge, schema, payload) = sample_forge();
    let total = (schema.len() + payload.len()) as u64;
    let schema_len = forge.schema_len;
    // The sum is right but the split is wrong: the schema section then ends
    // early (or takes payload bytes) and must not decode as a valid schema.
    check_claimed_lengths(
        schema_len - 1,
        total - u64::from(schema_len) + 1,
        "schema section",
    );
    check_claimed_lengths(
        schema_len + 1,
        total - u64::from(schema_len) - 1,
        "schema section",
    );
    check_claimed_lengths(0, total, "schema section does not decode");
}

#[test]
fn schema_section_claiming_huge_lengths() {
    // Type name of 2^62 bytes; then a field list of 2^62 strings.
    let huge = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f];
    check_corrupt(
        &seal_for::<Journal>(&huge, &[]),
        "schema section does not decode",
    );
    let mut section = vec![1, b'J', 3];
    section.extend_from_slice(&postcard::to_allocvec(&Journal::fingerprint()).unwrap());
    section.extend_from_slice(&huge);
    check_corrupt(
        &seal_for::<Journal>(&section, &[]),
        "schema section does not decode",
    );
}

#[test]
fn schema_section_with_trailing_bytes() {
    let mut section = schema_section_of::<Journal>();
    section.push(0);
    check_corrupt(&seal_for::<Journal>(&section, &[]), "trailing bytes");
}

#[test]
fn schema_section_disagreeing_with_header() {
    let schema = schema_section_of::<Journal>();
    let bytes = Forge::honest(&schema, &[], 4, Journal::fingerprint()).seal(&schema, &[]);
    check_corrupt(&bytes, "disagrees with the header");
    let bytes = Forge::honest(&schema, &[], 3, 1).seal(&schema, &[]);
    check_corrupt(&bytes, "disagrees with the header");
}

#[test]
fn payload_errors_come_from_the_type() {
    let mut payload = Vec::new();
    sample_journal().encode_payload(&mut payload).unwrap();
    payload.push(7);
    let bytes = seal_payload_for::<Journal>(&payload);
    assert!(
        blob::verify(&bytes).is_ok(),
        "verify does not read payloads"
    );
    assert!(matches!(
        blob::decode::<Journal>(&bytes),
        Err(StateError::Payload {
            type_name: "Journal",
            ..
        })
    ));
}

/// A type whose `encode_payload` breaks the contract by clearing the buffer.
struct Clobber;

impl Snapshot for Clobber {
    const SCHEMA: snapflow::state::Schema = snapflow::state::Schema {
        type_name: "Clobber",
        version: 1,
        shape: snapflow::state::SchemaShape::Unit,
    };

    fn encode_payload(&self, out: &mut Vec<u8>) -> Result<(), StateError> {
        out.clear();
        Ok(())
    }

    fn decode_payload(_payload: &[u8]) -> Result<Self, StateError> {
        Ok(Clobber)
    }
}

#[test]
fn encoder_refuses_a_payload_writer_that_clobbers_the_buffer() {
    assert!(matches!(
        blob::encode(&Clobber),
        Err(StateError::Encode {
            type_name: "Clobber",
            ..
        })
    ));
}

proptest! {
    #![proptest_config(blob_support::proptest_config())]

    #[test]
    fn random_values_round_trip(value in journal_strategy()) {
        let bytes = blob::encode(&value).unwrap();
        prop_assert_eq!(blob::decode::<Journal>(&bytes).unwrap(), value);
        prop_assert_eq!(blob::verify(&bytes).unwrap(), StoredSchema::of(&Journal::SCHEMA));
        let header = blob::decode_header(&bytes).unwrap();
        prop_assert_eq!(HEADER_LEN as u64 + u64::from(header.schema_len) + header.payload_len,
            bytes.len() as u64);
    }

    #[test]
    fn random_bytes_are_rejected(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        prop_assert!(blob::decode::<Journal>(&bytes).is_err());
        prop_assert!(blob::verify(&bytes).is_err());
    }

    #[test]
    fn random_bytes_after_a_valid_magic_are_rejected(
        tail in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&1u16.to_le_bytes());
        bytes.extend_from_slice(&tail);
        prop_assert!(blob::decode::<Journal>(&bytes).is_err());
        prop_assert!(blob::verify(&bytes).is_err());
    }

    /// Past both checksums with an arbitrary schema section: decoding must
    /// fail cleanly, since the fingerprint then cannot match by chance.
    #[test]
    fn random_schema_sections_are_rejected(
        section in proptest::collection::vec(any::<u8>(), 0..128),
        payload in proptest::collection::vec(any::<u8>(), 0..32),
    ) {
        let bytes = seal_for::<Journal>(&section, &payload);
        prop_assert!(blob::decode::<Journal>(&bytes).is_err());
    }

    /// Past every envelope check with an arbitrary payload: whatever decodes
    /// must re-encode to a blob that decodes to the same value.
    #[test]
    fn random_payloads_decode_stably(payload in proptest::collection::vec(any::<u8>(), 0..128)) {
        let bytes = seal_payload_for::<Journal>(&payload);
        prop_assert!(blob::verify(&bytes).is_ok());
        if let Ok(value) = blob::decode::<Journal>(&bytes) {
            let again = blob::encode(&value).unwrap();
            prop_assert_eq!(blob::decode::<Journal>(&again).unwrap(), value);
        }
    }

    /// A random single-byte change to a random valid blob is always caught.
    #[test]
    fn random_byte_changes_are_rejected(
        value in journal_strategy(),
        position in any::<prop::sample::Index>(),
        change in 1u8..=255,
    ) {
        let mut bytes = blob::encode(&value).unwrap();
        let at = position.index(bytes.len());
        bytes[at] ^= change;
        prop_assert!(blob::decode::<Journal>(&bytes).is_err());
    }
}

/// A type that overrides `Snapshot::fingerprint`, as a hand-written impl
/// that pins its fingerprint across a rename might.
#[derive(Debug, PartialEq)]
struct Pinned(u8);

impl Snapshot for Pinned {
    const SCHEMA: snapflow::state::Schema = snapflow::state::Schema {
        type_name: "Pinned",
        version: 1,
        shape: snapflow::state::SchemaShape::Unit,
    };

    fn fingerprint() -> u64 {
        0x5eed
    }

    fn encode_payload(&self, out: &mut Vec<u8>) -> Result<(), StateError> {
        out.push(self.0);
        Ok(())
    }

    fn decode_payload(payload: &[u8]) -> Result<Self, StateError> {
        match payload {
            [byte] => Ok(Pinned(*byte)),
            _ => Err(StateError::Payload {
                type_name: "Pinned",
                reason: format!("{} bytes, expected 1", payload.len()),
            }),
        }
    }
}

#[test]
fn an_overridden_fingerprint_round_trips() {
    let bytes = blob::encode(&Pinned(4)).unwrap();
    assert_eq!(blob::decode_header(&bytes).unwrap().fingerprint, 0x5eed);
    assert_eq!(blob::verify(&bytes).unwrap().fingerprint, 0x5eed);
    assert_eq!(blob::decode::<Pinned>(&bytes).unwrap(), Pinned(4));
}
