//! Unit tests of delta chains in the part format (`part/mod.rs`, "Delta
//! chains"): last wins on restore, lone parts read as before, and hostile
//! chains are refused. Compiled for tests only.

use super::key_group::MaxParallelism;
use super::part::{describe, split_chain, PartWriter};
use super::test_support::Count;
use super::{KeyGroupRange, KeyedError, KeyedState};
use crate::state::Snapshot;

fn max() -> MaxParallelism {
    MaxParallelism::new(16).unwrap()
}

/// A part (or, with `delta`, a delta part) of `entries` of key group
/// `key_group`.
fn part(key_group: u32, entries: &[(u64, u64)], delta: bool) -> Vec<u8> {
    let schema = super::part::schema_section::<Count>().unwrap();
    let mut writer = PartWriter::new(&schema);
    for (key, count) in entries {
        let mut payload = Vec::new();
        Count { count: *count }
            .encode_payload(&mut payload)
            .unwrap();
        writer
            .push_encoded(&postcard::to_allocvec(key).unwrap(), &payload)
            .unwrap();
    }
    if delta {
        writer.finish_delta(max(), key_group)
    } else {
        writer.finish(max(), key_group)
    }
}

/// Keys of `key_group`, in order.
fn keys_of(key_group: u32, n: usize) -> Vec<u64> {
    (0..10_000u64)
        .filter(|key| max().key_group_of(super::key_hash(key)) == key_group)
        .take(n)
        .collect()
}

/// The entries `bytes` restore to, sorted, as the table backend reads
/// them; the spilling backend (with the `spill` feature) must read the
/// same entries, or fail with the same kind of error.
fn restore(key_group: u32, bytes: &[u8]) -> Result<Vec<(u64, u64)>, KeyedError> {
    let range = KeyGroupRange::new(key_group, key_group + 1);
    let restored: Result<KeyedState<u64, Count>, KeyedError> =
        KeyedState::restore(max(), range, [(key_group, bytes)]);
    let entries = restored.map(|state| {
        let mut entries: Vec<(u64, u64)> = state.iter().map(|(k, c)| (*k, c.count)).collect();
        entries.sort();
        entries
    });
    #[cfg(feature = "spill")]
    check_spilling(key_group, bytes, &entries);
    entries
}

/// Restores `bytes` into the spilling backend, which reads a part's
/// entries as bytes (`spill/restore.rs`), and checks it against what the
/// table backend read.
#[cfg(feature = "spill")]
fn check_spilling(key_group: u32, bytes: &[u8], want: &Result<Vec<(u64, u64)>, KeyedError>) {
    let range = KeyGroupRange::new(key_group, key_group + 1);
    let dir = tempfile::tempdir().unwrap();
    let mut state: super::spill::SpillingState<u64, Count> =
        super::spill::SpillingState::new(max(), range, dir.path().join("instance"), 4).unwrap();
    let restored = state.restore([(key_group, bytes)]);
    match (restored, want) {
        (Ok(()), Ok(want)) => {
            let mut got = Vec::new();
            state.for_each(|k, c| got.push((*k, c.count))).unwrap();
            got.sort();
            assert_eq!(&got, want, "the spilling backend read other entries");
        }
        (Err(super::spill::SpillError::Keyed(error)), Err(want)) => assert_eq!(
            std::mem::discriminant(&error),
            std::mem::discriminant(want),
            "the spilling backend failed otherwise: {error} against {want}"
        ),
        (got, want) => panic!("the spilling backend gave {got:?}; the table gave {want:?}"),
    }
}

#[test]
fn the_last_part_of_a_chain_wins_and_keeps_the_other_keys() {
    let keys = keys_of(3, 4);
    let mut chain = part(3, &[(keys[0], 1), (keys[1], 2), (keys[2], 3)], false);
    chain.extend(part(3, &[(keys[1], 20), (keys[3], 40)], true));
    chain.extend(part(3, &[(keys[1], 200)], true));
    let mut want = vec![(keys[0], 1), (keys[1], 200), (keys[2], 3), (keys[3], 40)];
    want.sort();
    assert_eq!(restore(3, &chain).unwrap(), want);
    assert_eq!(split_chain(&chain).unwrap().len(), 3);
    // `describe` counts every part's entries.
    assert_eq!(describe(&chain).unwrap().entries, 6);
    // The copy-on-write layout reads it alike.
    let cow: crate::keyed::CowKeyedState<u64, Count> =
        crate::keyed::CowKeyedState::restore(max(), KeyGroupRange::new(3, 4), [(3, &chain)])
            .unwrap();
    let mut got: Vec<(u64, u64)> = cow.iter().map(|(k, c)| (*k, c.count)).collect();
    got.sort();
    assert_eq!(got, want);
}

#[test]
fn a_lone_part_reads_as_before_and_duplicates_in_it_are_refused() {
    let keys = keys_of(5, 2);
    let lone = part(5, &[(keys[0], 7), (keys[1], 8)], false);
    assert_eq!(split_chain(&lone).unwrap().len(), 1);
    assert_eq!(restore(5, &lone).unwrap().len(), 2);
    let twice = part(5, &[(keys[0], 7), (keys[0], 8)], false);
    assert!(matches!(
        restore(5, &twice),
        Err(KeyedError::DuplicateKey { .. })
    ));
}

#[test]
fn hostile_chains_are_refused() {
    let keys = keys_of(2, 2);
    let base = part(2, &[(keys[0], 1)], false);
    let delta = part(2, &[(keys[1], 2)], true);
    // A chain that starts with a delta, two bases, a truncated tail, a
    // flipped bit in the delta's body, a delta of another key group.
    let mut starts_with_delta = delta.clone();
    starts_with_delta.extend(&base);
    let mut two_bases = base.clone();
    two_bases.extend(&base);
    let mut truncated = base.clone();
    truncated.extend(&delta[..delta.len() - 1]);
    let mut flipped = base.clone();
    flipped.extend(&delta);
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    let mut foreign = base.clone();
    foreign.extend(part(4, &[(keys_of(4, 1)[0], 1)], true));
    for (name, bytes) in [
        ("starts with a delta", starts_with_delta),
        ("two bases", two_bases),
        ("truncated", truncated),
        ("flipped", flipped),
        ("foreign", foreign),
        ("empty", Vec::new()),
    ] {
        assert!(restore(2, &bytes).is_err(), "{name} was accepted");
    }
}
