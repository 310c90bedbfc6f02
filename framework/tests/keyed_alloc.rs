//! Allocation bounds of keyed state restore: restoring an `L`-byte hostile
//! part must never hold more than `64 * L + 16 KiB` bytes at once, nor
//! allocate more than that in total. The table is sized from the part's
//! entry count only up to one entry per input byte, and a `u64 -> Count`
//! entry costs 16 bytes plus hashbrown's control byte and its rounding up
//! to a power of two, hence the constant. Without the cap a forged count
//! would allocate whatever it claims.
//!
//! This file is its own test binary because it installs a counting global
//! allocator, which applies to the whole binary. Counters are per thread,
//! so tests running in parallel do not see each other's allocations.
//!
//! Randomised cases use proptest; `PROPTEST_RNG_SEED=<n>` replays a run.

mod alloc_support;
mod keyed_support;

use alloc_support::measure;
use keyed_support::{
    count_payload, entry_bytes, keys_in_group, max128, schema_section, Count, PartForge,
};
use proptest::prelude::*;
use snapflow::keyed::{KeyGroupRange, KeyedState};

/// The promised bound for an input of `input_len` bytes.
fn bound_bytes(input_len: usize) -> usize {
    64 * input_len + 16 * 1024
}

/// Restores `bytes` as key group 0's only part into `KeyedState<K, Count>`,
/// asserts the bound, and returns the peak and whether restore succeeded.
fn check_bounded<K: snapflow::keyed::StateKey>(bytes: &[u8]) -> (usize, bool) {
    let (result, usage) = measure(|| {
        KeyedState::<K, Count>::restore(max128(), KeyGroupRange::new(0, 1), [(0, bytes)]).is_ok()
    });
    let limit = bound_bytes(bytes.len());
    assert!(
        usage.peak_bytes <= limit && usage.total_bytes <= limit,
        "restore of {} bytes used {usage:?}, over the bound of {limit} bytes",
        bytes.len()
    );
    (usage.peak_bytes, result)
}

fn body_of(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut body = schema_section::<Count>();
    entries
        .iter()
        .for_each(|entry| body.extend_from_slice(entry));
    body
}

#[test]
fn the_counter_sees_allocations() {
    let (buffer, usage) = measure(|| vec![7u8; 100_000]);
    assert_eq!(buffer.len(), 100_000);
    assert!(usage.peak_bytes >= 100_000, "{usage:?}");
}

#[test]
fn a_valid_part_restores_within_the_bound() {
    let keys = keys_in_group(max128(), 0, 200);
    let entries: Vec<Vec<u8>> = keys
        .iter()
        .map(|key| entry_bytes(key, &count_payload(*key)))
        .collect();
    let bytes = PartForge::honest(128, 0, entries.len() as u64).seal(&body_of(&entries));
    let (peak_bytes, restored) = check_bounded::<u64>(&bytes);
    assert!(restored);
    println!(
        "200 entries in {} bytes: peak {peak_bytes} bytes",
        bytes.len()
    );
}

#[test]
fn an_entry_count_of_u64_max() {
    let keys = keys_in_group(max128(), 0, 1);
    let body = body_of(&[entry_bytes(&keys[0], &count_payload(1))]);
    let (_, restored) = check_bounded::<u64>(&PartForge::honest(128, 0, u64::MAX).seal(&body));
    assert!(!restored);
}

#[test]
fn an_entry_count_as_large_as_a_big_input() {
    // 64 KiB of zero bytes claims 64 Ki entries: key 0 with an empty
    // payload would be two bytes, so at most half of them can be real.
    let mut body = body_of(&[]);
    body.extend(vec![0u8; 64 * 1024]);
    let (peak_bytes, restored) =
        check_bounded::<u64>(&PartForge::honest(128, 0, 1 << 16).seal(&body));
    assert!(!restored);
    println!("64 Ki claimed entries in 64 KiB: peak {peak_bytes} bytes");
}

#[test]
fn a_string_key_claiming_a_huge_length() {
    let mut entry = postcard::to_allocvec(&(u64::MAX >> 2)).unwrap();
    entry.extend_from_slice(b"short");
    let bytes = PartForge::honest(128, 0, 1).seal(&body_of(&[entry]));
    let (_, restored) = check_bounded::<String>(&bytes);
    assert!(!restored);
}

#[test]
fn a_payload_claiming_a_huge_length() {
    let keys = keys_in_group(max128(), 0, 1);
    let mut entry = postcard::to_allocvec(&keys[0]).unwrap();
    entry.extend(postcard::to_allocvec(&(u64::MAX >> 1)).unwrap());
    let (_, restored) =
        check_bounded::<u64>(&PartForge::honest(128, 0, 1).seal(&body_of(&[entry])));
    assert!(!restored);
}

#[test]
fn get_or_default_allocates_nothing_for_an_existing_key() {
    let mut state: KeyedState<String, Count> = KeyedState::for_subtask(max128(), 1, 0).unwrap();
    let keys: Vec<String> = (0..100).map(|index| format!("key-{index}")).collect();
    for key in &keys {
        state.get_or_default(key).count += 1;
    }
    let (_, usage) = measure(|| {
        for key in &keys {
            state.get_or_default(key).count += 1;
        }
    });
    assert_eq!(usage.total_bytes, 0, "{usage:?}");
    let (_, usage) = measure(|| state.get_or_default(&"new".to_string()).count += 1);
    assert!(usage.total_bytes > 0, "a new key is cloned: {usage:?}");
}

proptest! {
    #![proptest_config(keyed_support::proptest_config(256))]

    #[test]
    fn random_bodies_behind_valid_checksums_stay_bounded(
        tail in prop::collection::vec(any::<u8>(), 0..256),
        entry_count in any::<u64>(),
    ) {
        let mut body = body_of(&[]);
        body.extend(tail);
        check_bounded::<u64>(&PartForge::honest(128, 0, entry_count).seal(&body));
        check_bounded::<String>(&PartForge::honest(128, 0, entry_count).seal(&body));
    }
}
