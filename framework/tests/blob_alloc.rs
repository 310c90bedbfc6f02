//! Allocation bounds of blob decoding: decoding an `L`-byte hostile input
//! must never hold more than `32 * L + 16 KiB` bytes at once, nor allocate
//! more than that in total. Without postcard's length checks a single forged
//! length would preallocate serde's 1 MiB cap or more, so the constant is
//! well below what a missing check would cost.
//!
//! This file is its own test binary because it installs a counting global
//! allocator, which applies to the whole binary. Counters are per thread, so
//! tests running in parallel do not see each other's allocations.
//!
//! Randomised cases use proptest; `PROPTEST_RNG_SEED=<n>` replays a run.

mod alloc_support;
mod blob_support;

use alloc_support::measure;
use blob_support::{
    journal_strategy, sample_journal, schema_section_of, seal_for, seal_payload_for, Journal, Table,
};
use proptest::prelude::*;
use snapflow::state::blob;
use snapflow::state::Snapshot;
/// The promised bound for an input of `input_len` bytes.
fn bound_bytes(input_len: usize) -> usize {
    32 * input_len + 16 * 1024
}

/// Decodes `bytes` as `T` and through `verify`, asserting the bound on
/// both, and returns the larger peak for callers that report it.
fn check_bounded<T: Snapshot + std::fmt::Debug>(bytes: &[u8]) -> usize {
    let (_, decode_usage) = measure(|| blob::decode::<T>(bytes));
    let (_, verify_usage) = measure(|| blob::verify(bytes));
    let limit = bound_bytes(bytes.len());
    for (what, usage) in [("decode", decode_usage), ("verify", verify_usage)] {
        assert!(
            usage.peak_bytes <= limit && usage.total_bytes <= limit,
            "{what} of {} bytes used {usage:?}, over the bound of {limit} bytes",
            bytes.len()
        );
    }
    decode_usage.peak_bytes.max(verify_usage.peak_bytes)
}

#[test]
fn the_counter_sees_allocations() {
    let (buffer, usage) = measure(|| vec![7u8; 100_000]);
    assert_eq!(buffer.len(), 100_000);
    assert!(usage.peak_bytes >= 100_000, "{usage:?}");
    assert!(usage.total_bytes >= 100_000, "{usage:?}");
}

#[test]
fn a_valid_blob_decodes_within_the_bound() {
    check_bounded::<Journal>(&blob::encode(&sample_journal()).unwrap());
}

#[test]
fn a_field_list_claiming_a_billion_strings() {
    let mut section = vec![1, b'J', 3];
    section.extend_from_slice(&postcard::to_allocvec(&Journal::fingerprint()).unwrap());
    section.extend_from_slice(&postcard::to_allocvec(&(1u64 << 30)).unwrap());
    section.extend_from_slice(&[0; 8]);
    let bytes = seal_for::<Journal>(&section, &[]);
    assert!(blob::verify(&bytes).is_err());
    check_bounded::<Journal>(&bytes);
}

#[test]
fn a_field_list_of_many_empty_strings_costs_a_string_each() {
    // The worst honest case: each one-byte empty string becomes a 24-byte
    // `String` in the decoded field list, so the multiplier is real.
    let mut section = vec![1, b'J', 3];
    section.extend_from_slice(&postcard::to_allocvec(&Journal::fingerprint()).unwrap());
    section.extend_from_slice(&postcard::to_allocvec(&20_000u64).unwrap());
    section.extend_from_slice(&[0; 20_000]);
    let bytes = seal_for::<Journal>(&section, &[]);
    let peak_bytes = check_bounded::<Journal>(&bytes);
    println!(
        "20,000 empty field names in {} bytes: peak {peak_bytes} bytes ({:.1} per input byte)",
        bytes.len(),
        peak_bytes as f64 / bytes.len() as f64
    );
}

#[test]
fn payload_collections_claiming_huge_lengths() {
    let huge = postcard::to_allocvec(&(u64::MAX >> 2)).unwrap();
    // `raw: Vec<u8>` claims 2^62 bytes.
    check_bounded::<Journal>(&seal_payload_for::<Journal>(&huge));
    // `raw` and `title` empty, then `batches: Vec<Vec<u32>>` claims 2^62.
    let mut payload = vec![0, 0];
    payload.extend_from_slice(&huge);
    check_bounded::<Journal>(&seal_payload_for::<Journal>(&payload));
    // One batch that itself claims 2^62 numbers.
    let mut payload = vec![0, 0, 1];
    payload.extend_from_slice(&huge);
    check_bounded::<Journal>(&seal_payload_for::<Journal>(&payload));
}

#[test]
fn a_hash_map_claim_is_capped_but_not_proportional() {
    // Known gap: postcard's map access passes the claimed length to serde
    // unchecked, and serde preallocates up to its 1 MiB cap of entries
    // (hashbrown then rounds the table up). This pins the cap so that it
    // cannot grow unnoticed; it is far above `bound_bytes` for this input.
    let payload = postcard::to_allocvec(&(1u64 << 40)).unwrap();
    let bytes = seal_payload_for::<Table>(&payload);
    let (result, usage) = measure(|| blob::decode::<Table>(&bytes));
    assert!(result.is_err());
    println!(
        "HashMap claiming 2^40 entries in {} bytes: {usage:?}",
        bytes.len()
    );
    assert!(usage.peak_bytes <= 3 * 1024 * 1024, "{usage:?}");
}

proptest! {
    #![proptest_config(blob_support::proptest_config())]

    #[test]
    fn random_bytes_stay_bounded(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        check_bounded::<Journal>(&bytes);
    }

    #[test]
    fn random_schema_sections_stay_bounded(
        section in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        check_bounded::<Journal>(&seal_for::<Journal>(&section, &[]));
    }

    #[test]
    fn random_payloads_stay_bounded(payload in proptest::collection::vec(any::<u8>(), 0..256)) {
        check_bounded::<Journal>(&seal_payload_for::<Journal>(&payload));
    }

    #[test]
    fn valid_blobs_stay_bounded(value in journal_strategy()) {
        check_bounded::<Journal>(&blob::encode(&value).unwrap());
    }
}

#[test]
fn schema_section_of_the_sample_is_small() {
    // Keeps the constant in `bound_bytes` meaningful: a real schema section
    // is tiny next to it.
    assert!(schema_section_of::<Journal>().len() < 256);
}
