//! Tests of `KeyedState::restore` against wrong, damaged and hostile parts:
//! foreign, duplicate and missing key groups, another max parallelism,
//! schema changes (rejected, or upgraded through the chain), truncation,
//! every single-bit flip, random bytes, and forged parts with valid
//! checksums around bad contents. Every case must return a typed error and
//! never panic.
//!
//! Randomised cases use proptest; `PROPTEST_RNG_SEED=<n>` replays a run.

mod keyed_support;

use keyed_support::{
    count_payload, entry_bytes, fill, keys_in_group, max128, restore_all, schema_section,
    snapshot_all, Count, CountV2, PartForge, Renamed,
};
use proptest::prelude::*;
use snapflow::keyed::{KeyGroupRange, KeyedError, KeyedState, MaxParallelism};
use snapflow::state::StateError;
use std::collections::BTreeMap;

/// Parts of subtasks at parallelism 2 holding keys 0..300 with count = key.
fn sample_parts() -> Vec<(u32, Vec<u8>)> {
    let entries: BTreeMap<u64, Count> = (0..300).map(|key| (key, Count { count: key })).collect();
    snapshot_all(&fill(max128(), 2, &entries))
}

/// The sample's largest part (several entries), and its key group.
fn sample_part() -> (u32, Vec<u8>) {
    let part = sample_parts()
        .into_iter()
        .max_by_key(|(_, bytes)| bytes.len())
        .unwrap();
    assert!(part.1.len() > 80, "the sample part has too few entries");
    part
}

fn restore_one(key_group: u32, bytes: &[u8]) -> Result<KeyedState<u64, Count>, KeyedError> {
    KeyedState::restore(
        max128(),
        KeyGroupRange::new(key_group, key_group + 1),
        [(key_group, bytes)],
    )
}

/// Asserts that restoring `parts` into `range` fails with an error that
/// `matches` accepts and that is not retryable.
fn check_rejected(
    range: KeyGroupRange,
    parts: Vec<(u32, Vec<u8>)>,
    matches: impl Fn(&KeyedError) -> bool,
) {
    let result = KeyedState::<u64, Count>::restore(max128(), range, parts);
    let error = result.expect_err("restore accepted bad parts");
    assert!(matches(&error), "unexpected error: {error}");
    assert!(!error.is_retryable());
}

fn check_corrupt(key_group: u32, bytes: &[u8], reason: &str) {
    match restore_one(key_group, bytes) {
        Err(KeyedError::CorruptPart { reason: text, .. }) => {
            assert!(text.contains(reason), "expected {reason:?}, got {text:?}")
        }
        other => panic!("expected CorruptPart({reason:?}), got {other:?}"),
    }
}

// ------------------------------------------------------------ key groups

#[test]
fn foreign_key_group_is_rejected() {
    let parts = sample_parts();
    check_rejected(KeyGroupRange::new(0, 64), parts, |error| {
        matches!(error, KeyedError::ForeignKeyGroup { key_group: 64, .. })
    });
}

#[test]
fn duplicate_key_group_is_rejected() {
    let mut parts: Vec<_> = sample_parts()
        .into_iter()
        .filter(|(group, _)| *group < 64)
        .collect();
    parts.push(parts[5].clone());
    check_rejected(KeyGroupRange::new(0, 64), parts, |error| {
        matches!(error, KeyedError::DuplicateKeyGroup { key_group: 5 })
    });
}

#[test]
fn missing_key_group_is_rejected() {
    let parts: Vec<_> = sample_parts()
        .into_iter()
        .filter(|(group, _)| *group != 10)
        .collect();
    check_rejected(KeyGroupRange::new(0, 128), parts, |error| {
        matches!(
            error,
            KeyedError::MissingKeyGroups {
                missing: 1,
                first_missing: 10,
                ..
            }
        )
    });
}

#[test]
fn another_max_parallelism_is_rejected() {
    let parts: Vec<_> = sample_parts()
        .into_iter()
        .filter(|(group, _)| *group < 64)
        .collect();
    let max = MaxParallelism::new(256).unwrap();
    let result = KeyedState::<u64, Count>::restore(max, KeyGroupRange::new(0, 64), parts);
    assert!(matches!(
        result,
        Err(KeyedError::MaxParallelismMismatch {
            stored: 128,
            expected: 256,
            ..
        })
    ));
}

#[test]
fn mislabelled_part_is_rejected() {
    let (key_group, bytes) = sample_part();
    check_corrupt(key_group + 1, &bytes, "labelled");
}

#[test]
fn restore_at_parallelism_above_max_is_rejected() {
    let result = restore_all::<u64, Count>(max128(), 129, &sample_parts());
    assert!(matches!(result, Err(KeyedError::KeyGroup(_))));
}

// ------------------------------------------------------------ schemas

#[test]
fn another_schema_of_the_same_version_is_rejected() {
    let (key_group, bytes) = sample_part();
    let range = KeyGroupRange::new(key_group, key_group + 1);
    match KeyedState::<u64, Renamed>::restore(max128(), range, [(key_group, bytes)]) {
        Err(KeyedError::State {
            source: StateError::SchemaMismatch(details),
            ..
        }) => {
            assert_eq!(details.stored_fields, vec!["count: u64".to_string()]);
        }
        other => panic!("expected a schema mismatch, got {other:?}"),
    }
}

#[test]
fn older_version_goes_through_the_upgrade_chain() {
    let parts = sample_parts();
    let restored = restore_all::<u64, CountV2>(max128(), 3, &parts).unwrap();
    let total: usize = restored.iter().map(|subtask| subtask.len()).sum();
    assert_eq!(total, 300);
    for subtask in &restored {
        for (key, state) in subtask.iter() {
            assert_eq!(
                state,
                &CountV2 {
                    count: *key,
                    last_seen: None
                }
            );
        }
    }
}

#[test]
fn newer_version_is_rejected_by_an_older_build() {
    let entries: BTreeMap<u64, CountV2> = (0..50)
        .map(|key| {
            (
                key,
                CountV2 {
                    count: key,
                    last_seen: Some(1),
                },
            )
        })
        .collect();
    let parts = snapshot_all(&fill(max128(), 1, &entries));
    match restore_all::<u64, Count>(max128(), 1, &parts) {
        Err(KeyedError::State {
            source:
                StateError::VersionMismatch {
                    stored: 2,
                    expected: 1,
                    ..
                },
            ..
        }) => {}
        other => panic!("expected a version mismatch, got {other:?}"),
    }
}

// ------------------------------------------------------------ damage

#[test]
fn every_truncation_is_rejected() {
    let (key_group, bytes) = sample_part();
    for length in 0..bytes.len() {
        assert!(
            restore_one(key_group, &bytes[..length]).is_err(),
            "accepted {length} bytes"
        );
    }
}

#[test]
fn every_single_bit_flip_is_rejected() {
    let (key_group, bytes) = sample_part();
    for bit in 0..bytes.len() * 8 {
        let mut damaged = bytes.clone();
        damaged[bit / 8] ^= 1 << (bit % 8);
        assert!(
            restore_one(key_group, &damaged).is_err(),
            "accepted a flip of bit {bit}"
        );
    }
}

#[test]
fn appended_bytes_are_rejected() {
    let (key_group, mut bytes) = sample_part();
    bytes.push(0);
    // A key group's bytes may be a chain of parts (the spilling backend's
    // delta parts), so bytes after a whole part are read as the next
    // part's header, which one byte cannot be.
    check_corrupt(key_group, &bytes, "shorter than the 44-byte header");
}

#[test]
fn bad_magic_version_and_flags_are_rejected() {
    let body = schema_section::<Count>();
    let honest = PartForge::honest(128, 0, 0);
    assert!(restore_one(0, &honest.seal(&body)).is_ok());
    check_corrupt(
        0,
        &PartForge {
            magic: *b"SFKX",
            ..honest
        }
        .seal(&body),
        "magic",
    );
    check_corrupt(
        0,
        &PartForge {
            version: 2,
            ..honest
        }
        .seal(&body),
        "version 2",
    );
    check_corrupt(0, &PartForge { flags: 2, ..honest }.seal(&body), "flags");
    check_corrupt(
        0,
        &PartForge {
            flags: 0x8000,
            ..honest
        }
        .seal(&body),
        "flags",
    );
    // Flag 1 marks a delta part, valid only after a whole part of its group.
    check_corrupt(
        0,
        &PartForge { flags: 1, ..honest }.seal(&body),
        "starts with a delta part",
    );
    let huge = PartForge {
        schema_len: u32::MAX,
        ..honest
    };
    check_corrupt(0, &huge.seal(&body), "schema section claims");
}

// ------------------------------------------------------------ forged parts

#[test]
fn forge_reproduces_a_snapshot_part_byte_for_byte() {
    let max = max128();
    let keys = keys_in_group(max, 9, 1);
    let mut state: KeyedState<u64, Count> = KeyedState::for_subtask(max, 1, 0).unwrap();
    state.get_or_default(&keys[0]).count = 41;
    let mut body = schema_section::<Count>();
    body.extend(entry_bytes(&keys[0], &count_payload(41)));
    assert_eq!(
        PartForge::honest(128, 9, 1).seal(&body),
        state.snapshot_key_group(9).unwrap()
    );
}

/// A body of `Count`'s schema and the given entries.
fn body_of(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut body = schema_section::<Count>();
    entries
        .iter()
        .for_each(|entry| body.extend_from_slice(entry));
    body
}

#[test]
fn entry_count_must_match_the_entries() {
    let keys = keys_in_group(max128(), 3, 2);
    let entries = [
        entry_bytes(&keys[0], &count_payload(1)),
        entry_bytes(&keys[1], &count_payload(2)),
    ];
    let body = body_of(&entries);
    assert_eq!(
        restore_one(3, &PartForge::honest(128, 3, 2).seal(&body))
            .unwrap()
            .len(),
        2
    );
    check_corrupt(
        3,
        &PartForge::honest(128, 3, 1).seal(&body),
        "trailing bytes",
    );
    check_corrupt(3, &PartForge::honest(128, 3, 3).seal(&body), "ends early");
    check_corrupt(
        3,
        &PartForge::honest(128, 3, u64::MAX).seal(&body),
        "ends early",
    );
}

#[test]
fn duplicate_key_in_a_part_is_rejected() {
    let keys = keys_in_group(max128(), 3, 1);
    let entry = entry_bytes(&keys[0], &count_payload(1));
    let bytes = PartForge::honest(128, 3, 2).seal(&body_of(&[entry.clone(), entry]));
    assert!(matches!(
        restore_one(3, &bytes),
        Err(KeyedError::DuplicateKey { key_group: 3 })
    ));
}

#[test]
fn key_of_another_group_is_rejected() {
    let keys = keys_in_group(max128(), 4, 1);
    let bytes =
        PartForge::honest(128, 3, 1).seal(&body_of(&[entry_bytes(&keys[0], &count_payload(1))]));
    assert!(matches!(
        restore_one(3, &bytes),
        Err(KeyedError::KeyGroupMismatch {
            stored: 3,
            computed: 4
        })
    ));
}

#[test]
fn payload_length_beyond_the_part_is_rejected() {
    let keys = keys_in_group(max128(), 3, 1);
    let mut entry = postcard::to_allocvec(&keys[0]).unwrap();
    entry.extend(postcard::to_allocvec(&u64::MAX).unwrap());
    let bytes = PartForge::honest(128, 3, 1).seal(&body_of(&[entry]));
    check_corrupt(3, &bytes, "payload claims");
}

#[test]
fn undecodable_payload_is_a_state_error() {
    let keys = keys_in_group(max128(), 3, 1);
    let bytes = PartForge::honest(128, 3, 1).seal(&body_of(&[entry_bytes(&keys[0], &[0xff; 3])]));
    assert!(matches!(
        restore_one(3, &bytes),
        Err(KeyedError::State {
            key_group: 3,
            source: StateError::Payload { .. }
        })
    ));
}

#[test]
fn garbage_schema_section_is_rejected() {
    let honest = PartForge::honest(128, 0, 0);
    let garbage = vec![0xff; honest.schema_len as usize];
    check_corrupt(0, &honest.seal(&garbage), "schema section");
}

proptest! {
    #![proptest_config(keyed_support::proptest_config(2000))]

    #[test]
    fn random_bytes_are_rejected_without_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        prop_assert!(restore_one(0, &bytes).is_err());
    }

    #[test]
    fn random_bodies_behind_valid_checksums_never_panic(
        body_tail in prop::collection::vec(any::<u8>(), 0..120),
        entry_count in 0u64..6,
    ) {
        let mut body = schema_section::<Count>();
        body.extend(body_tail);
        let bytes = PartForge::honest(128, 0, entry_count).seal(&body);
        // Random entries may, rarely, be valid; the point is no panic and
        // that whatever is accepted belongs to key group 0.
        if let Ok(state) = restore_one(0, &bytes) {
            prop_assert_eq!(state.len() as u64, entry_count);
            prop_assert!(state.iter().all(|(key, _)| state.key_group_of(key) == 0));
        }
    }

    #[test]
    fn random_damage_to_a_valid_part_is_rejected(
        position in any::<prop::sample::Index>(),
        value in 1u8..=255,
    ) {
        let (key_group, mut bytes) = sample_part();
        let at = position.index(bytes.len());
        bytes[at] ^= value;
        prop_assert!(restore_one(key_group, &bytes).is_err());
    }
}
