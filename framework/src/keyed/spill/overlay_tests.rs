//! Seed-driven tests of the spilling snapshot's overlay of frozen hot
//! entries on the disk table's (see `state.rs`, "The rule"): each runs a
//! random workload of updates, deletions and evictions against a plain
//! map as the model and checks every snapshot's parts byte for byte
//! against parts built from the model. Compiled for tests only; `SNAPFLOW_SEED`
//! replays a failing run (its seed is printed).

use std::collections::{BTreeMap, HashMap};

use super::state::tests::{entries_of, owned_keys, spilling, MAX};
use super::{SpillSnapshot, SpillingState};
use crate::keyed::backend::KeyGroupPart;
use crate::keyed::key_group::MaxParallelism;
use crate::keyed::key_hash;
use crate::keyed::part::PartWriter;
use crate::keyed::store::KeyGroupSnapshots;
use crate::keyed::test_support::{seed, with_seed, Count, Rng};

pub(super) type Model = HashMap<u64, u64>;

/// The parts of the groups `include` picks that the model's state must
/// give: the in-memory backend's part format, entries ascending by their
/// disk keys (key group, then postcard), built without the spilling code.
pub(super) fn expected(model: &Model, include: impl Fn(u32) -> bool) -> Vec<KeyGroupPart> {
    let max_parallelism = MaxParallelism::new(MAX).unwrap();
    let range = super::state::tests::range(2, 1);
    let mut groups: BTreeMap<u32, BTreeMap<Vec<u8>, u64>> = range
        .iter()
        .filter(|key_group| include(*key_group))
        .map(|key_group| (key_group, BTreeMap::new()))
        .collect();
    for (key, count) in model {
        let key_group = max_parallelism.key_group_of(key_hash(key));
        if let Some(group) = groups.get_mut(&key_group) {
            group.insert(postcard::to_allocvec(key).unwrap(), *count);
        }
    }
    let schema = crate::keyed::part::schema_section::<Count>().unwrap();
    groups
        .into_iter()
        .map(|(key_group, entries)| {
            let mut writer = PartWriter::new(&schema);
            for (key, count) in entries {
                let mut payload = Vec::new();
                crate::state::Snapshot::encode_payload(&Count { count }, &mut payload).unwrap();
                writer.push_encoded(&key, &payload).unwrap();
            }
            KeyGroupPart {
                key_group,
                bytes: writer.finish(max_parallelism, key_group),
            }
        })
        .collect()
}

pub(super) fn drain(mut snapshot: SpillSnapshot) -> Vec<KeyGroupPart> {
    std::iter::from_fn(|| snapshot.next_part().map(Result::unwrap)).collect()
}

/// Adds `amount` (at least 1, so a present key never looks absent) to
/// `key` in both.
fn add(state: &mut SpillingState<u64, Count>, model: &mut Model, key: u64, amount: u64) {
    state.get_or_default(&key).unwrap().count += amount;
    *model.entry(key).or_default() += amount;
}

fn remove(state: &mut SpillingState<u64, Count>, model: &mut Model, key: u64) {
    let removed = state.remove(&key).unwrap().map(|count| count.count);
    assert_eq!(removed, model.remove(&key), "removing {key}");
}

/// One random operation: mostly updates, some deletions, evictions now
/// and then (so the hot table goes over its budget between them, as
/// between batches).
fn random_op(
    rng: &mut Rng,
    keys: &[u64],
    state: &mut SpillingState<u64, Count>,
    model: &mut Model,
) {
    let key = keys[rng.below(keys.len() as u64) as usize];
    match rng.below(10) {
        0 => remove(state, model, key),
        1 | 2 => state.enforce_budget().unwrap(),
        _ => add(state, model, key, 1 + rng.below(5)),
    }
}

/// Every key on disk and in the first base, then rounds in which random
/// keys are read back and updated while hot (never evicted before the
/// snapshot): each snapshot merges the stale base and must show the new
/// values.
fn updated_while_hot(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(seed);
    let (mut state, mut model) = (spilling(dir.path(), 32), Model::new());
    let keys = owned_keys(400);
    for key in &keys {
        add(&mut state, &mut model, *key, 1);
        state.enforce_budget().unwrap();
    }
    assert_eq!(
        drain(state.snapshot(&mut |_| true).unwrap()),
        expected(&model, |_| true)
    );
    for round in 0..12 {
        // At most the budget, so none of them is evicted again.
        for _ in 0..rng.below(32) {
            let key = keys[rng.below(keys.len() as u64) as usize];
            add(&mut state, &mut model, key, 10 + rng.below(100));
        }
        let mut snapshot = state.snapshot(&mut |_| true).unwrap();
        let first = snapshot.next_part().unwrap().unwrap();
        assert!(snapshot.merged(), "round {round}: merged the previous base");
        let mut parts = vec![first];
        parts.extend(drain(snapshot));
        assert_eq!(parts, expected(&model, |_| true), "round {round}");
        // Then a random stretch with evictions and deletions, and a
        // snapshot of some groups only.
        for _ in 0..rng.below(200) {
            random_op(&mut rng, &keys, &mut state, &mut model);
        }
        let odd = |key_group: u32| key_group % 2 == 1;
        let parts = drain(state.snapshot(&mut |key_group| odd(key_group)).unwrap());
        assert_eq!(parts, expected(&model, odd), "round {round}: odd groups");
    }
    // The synchronous path agrees.
    assert_eq!(state.snapshot_parts().unwrap(), expected(&model, |_| true));
}

#[test]
fn a_key_updated_while_hot_after_being_on_disk_shows_its_new_value() {
    with_seed("updated_while_hot", updated_while_hot);
}

/// Keys on disk and in the base deleted while hot (read back first) or
/// while only on disk, some created again: no snapshot, base or restore
/// may bring an old value back.
fn deleted_while_hot(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(seed);
    let (mut state, mut model) = (spilling(dir.path(), 32), Model::new());
    let keys = owned_keys(400);
    for key in &keys {
        add(&mut state, &mut model, *key, 1);
        state.enforce_budget().unwrap();
    }
    assert_eq!(
        drain(state.snapshot(&mut |_| true).unwrap()),
        expected(&model, |_| true)
    );
    for round in 0..12 {
        let mut deleted = Vec::new();
        for _ in 0..1 + rng.below(16) {
            let key = keys[rng.below(keys.len() as u64) as usize];
            if rng.below(2) == 0 {
                // Read back into memory first: deleted while hot.
                add(&mut state, &mut model, key, 1);
            }
            remove(&mut state, &mut model, key);
            deleted.push(key);
        }
        // Some come back with a fresh value.
        for key in deleted.iter().filter(|_| rng.below(4) == 0) {
            add(&mut state, &mut model, *key, 1_000);
        }
        for _ in 0..rng.below(100) {
            random_op(&mut rng, &keys, &mut state, &mut model);
        }
        let mut snapshot = state.snapshot(&mut |_| true).unwrap();
        let first = snapshot.next_part().unwrap().unwrap();
        let merged = snapshot.merged();
        let mut parts = vec![first];
        parts.extend(drain(snapshot));
        assert_eq!(
            parts,
            expected(&model, |_| true),
            "round {round} (merged: {merged})"
        );
        for key in &deleted {
            let live = state.get_or_default(key).unwrap().count;
            let want = *model.entry(*key).or_default();
            assert_eq!(live, want, "round {round}: key {key} read live");
        }
    }
    // A restore of the last snapshot holds exactly the model.
    let parts = state.snapshot_parts().unwrap();
    assert_eq!(parts, expected(&model, |_| true));
    let mut restored = spilling(dir.path(), 32);
    restored
        .restore(parts.iter().map(|part| (part.key_group, &part.bytes)))
        .unwrap();
    let visited: HashMap<u64, u64> = entries_of(&mut restored).into_iter().collect();
    assert_eq!(visited, model);
}

#[test]
fn a_key_deleted_while_hot_stays_deleted_though_on_disk_and_in_the_base() {
    with_seed("deleted_while_hot", deleted_while_hot);
}

/// A snapshot read part by part while the operator goes on with a random
/// workload that evicts (from slices the snapshot still holds), loads and
/// deletes: it must give the state as of its taking, and the next one the
/// state as of its own.
fn evicted_during_a_snapshot(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(seed);
    let (mut state, mut model) = (spilling(dir.path(), 64), Model::new());
    let keys = owned_keys(600);
    for _ in 0..2_000 {
        random_op(&mut rng, &keys, &mut state, &mut model);
    }
    let mut taken_back = 0;
    for round in 0..8 {
        // Fill memory over the budget without evicting, so the snapshot
        // freezes many hot entries.
        for _ in 0..64 {
            let key = keys[rng.below(keys.len() as u64) as usize];
            add(&mut state, &mut model, key, 1 + rng.below(5));
        }
        let include = |key_group: u32| (u64::from(key_group) + round) % 4 != 0;
        let want = expected(&model, include);
        let taken_back_before = state.copied_slices() + state.encoded_slices();
        let mut snapshot = state.snapshot(&mut |key_group| include(key_group)).unwrap();
        state.forget_changes();
        let mut parts = Vec::new();
        loop {
            for _ in 0..rng.below(60) {
                random_op(&mut rng, &keys, &mut state, &mut model);
            }
            state.enforce_budget().unwrap();
            match snapshot.next_part() {
                Some(part) => parts.push(part.unwrap()),
                None => break,
            }
        }
        assert_eq!(parts, want, "round {round}: the state as of the snapshot");
        taken_back += state.copied_slices() + state.encoded_slices() - taken_back_before;
    }
    // Evictions from frozen slices encoded (or copied) them first, so the
    // snapshot kept their entries: what the check above exercised.
    assert!(taken_back > 0, "no frozen slice was evicted from");
    assert_eq!(
        drain(state.snapshot(&mut |_| true).unwrap()),
        expected(&model, |_| true)
    );
}

#[test]
fn an_eviction_during_a_live_snapshot_leaves_it_the_values_as_of_its_taking() {
    with_seed("evicted_during_a_snapshot", evicted_during_a_snapshot);
}

#[test]
fn the_synchronous_and_the_frozen_paths_write_the_same_parts() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(seed());
    let (mut state, mut model) = (spilling(dir.path(), 16), Model::new());
    let keys = owned_keys(200);
    for _ in 0..1_000 {
        random_op(&mut rng, &keys, &mut state, &mut model);
    }
    let frozen = drain(state.snapshot(&mut |_| true).unwrap());
    assert_eq!(frozen, expected(&model, |_| true));
    assert_eq!(state.parts_of(&mut |_| true).unwrap(), frozen);
    // Neither writes the hot entries to disk: a state that never spilled
    // still has no disk table after both.
    let small_dir = tempfile::tempdir().unwrap();
    let (mut small, mut small_model) = (spilling(small_dir.path(), 1_000), Model::new());
    for key in &keys[..50] {
        add(&mut small, &mut small_model, *key, 3);
    }
    remove(&mut small, &mut small_model, keys[0]);
    let frozen = drain(small.snapshot(&mut |_| true).unwrap());
    assert_eq!(frozen, expected(&small_model, |_| true));
    assert_eq!(small.snapshot_parts().unwrap(), frozen);
    assert!(!small_dir.path().join("instance").exists());
}
