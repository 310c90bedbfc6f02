//! Tests of the spilling snapshot's sorted change runs (`runs.rs`,
//! `source.rs`, "The bound on runs"): a delta snapshot appends runs and
//! rewrites no base file, and a seeded model test of many snapshot
//! epochs, mixing delta and whole parts, partial snapshots, evictions and
//! deletions, whose parts laid over each other (as a restore reads a delta
//! chain) must give the model's state. Compiled for tests only;
//! `SNAPFLOW_SEED` replays a failing run (its seed is printed).

use std::collections::{BTreeMap, BTreeSet};

use super::state::tests::{owned_keys, range, spilling, MAX};
use super::{SpillSnapshot, SpillingState};
use crate::keyed::backend::{KeyGroupPart, KeyedState};
use crate::keyed::key_group::MaxParallelism;
use crate::keyed::key_hash;
use crate::keyed::part::{is_delta, PartWriter};
use crate::keyed::store::KeyGroupSnapshots;
use crate::keyed::test_support::{with_seed, Count, Rng};

type Model = BTreeMap<u64, u64>;

fn key_group_of(key: u64) -> u32 {
    MaxParallelism::new(MAX)
        .unwrap()
        .key_group_of(key_hash(&key))
}

/// The names of the files in the state's bases directory.
fn base_dir_files(dir: &std::path::Path) -> BTreeSet<String> {
    std::fs::read_dir(dir.join("instance.bases"))
        .map(|entries| {
            entries
                .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Each key group's chain of parts, as a restore reads them.
#[derive(Default)]
struct Chains {
    chains: BTreeMap<u32, Vec<u8>>,
}

impl Chains {
    /// Lays `parts` over the chains: a whole part replaces its group's, a
    /// delta part extends it. Returns how many were deltas.
    fn apply(&mut self, parts: Vec<KeyGroupPart>) -> usize {
        let mut deltas = 0;
        for part in parts {
            if is_delta(&part.bytes) {
                deltas += 1;
                let chain = self.chains.get_mut(&part.key_group);
                chain.expect("a delta on no chain").extend(part.bytes);
            } else {
                self.chains.insert(part.key_group, part.bytes);
            }
        }
        deltas
    }

    /// The counts the chains hold, in the groups `keep` picks.
    fn restored(&self, keep: impl Fn(u32) -> bool) -> Model {
        // A group never written yet restores empty (and is not compared).
        let max_parallelism = MaxParallelism::new(MAX).unwrap();
        let schema = crate::keyed::part::schema_section::<Count>().unwrap();
        let parts = range(2, 1)
            .iter()
            .map(|key_group| match self.chains.get(&key_group) {
                Some(bytes) => (key_group, bytes.clone()),
                None => (
                    key_group,
                    PartWriter::new(&schema).finish(max_parallelism, key_group),
                ),
            });
        let state: KeyedState<u64, Count> =
            KeyedState::restore(MaxParallelism::new(MAX).unwrap(), range(2, 1), parts).unwrap();
        state
            .iter()
            .filter(|(key, _)| keep(key_group_of(**key)))
            .map(|(key, count)| (*key, count.count))
            .collect()
    }
}

fn add(state: &mut SpillingState<u64, Count>, model: &mut Model, key: u64, amount: u64) {
    state.get_or_default(&key).unwrap().count += amount;
    *model.entry(key).or_default() += amount;
}

/// A snapshot of the groups `picked` holds, those in `deltas` as delta
/// parts where the state can; then the state's changes are forgotten, as
/// the keyed core does after an incremental snapshot.
fn snapshot(
    state: &mut SpillingState<u64, Count>,
    picked: &BTreeSet<u32>,
    deltas: &BTreeSet<u32>,
) -> Vec<KeyGroupPart> {
    take(state, picked, deltas).collect_parts().unwrap()
}

/// Takes a snapshot of the groups `picked` holds, those in `deltas` as
/// delta parts where the state can, and forgets the state's changes, as
/// the keyed core does after an incremental snapshot; nothing is read yet.
fn take(
    state: &mut SpillingState<u64, Count>,
    picked: &BTreeSet<u32>,
    deltas: &BTreeSet<u32>,
) -> SpillSnapshot {
    let snapshot = state
        .snapshot_with_deltas(
            &mut |key_group| picked.contains(&key_group),
            &mut |key_group| deltas.contains(&key_group),
        )
        .unwrap();
    state.forget_changes();
    snapshot
}

/// A state with a budget of 8 entries after one write to each of 400
/// keys (most of them evicted, so it has a disk table), its model and
/// the keys.
fn spilled_state(dir: &std::path::Path) -> (SpillingState<u64, Count>, Model, Vec<u64>) {
    let (mut state, mut model) = (spilling(dir, 8), Model::new());
    let keys = owned_keys(400);
    for key in &keys {
        add(&mut state, &mut model, *key, 1);
        state.enforce_budget().unwrap();
    }
    (state, model, keys)
}

#[test]
fn a_delta_snapshot_appends_runs_and_rewrites_no_base_file() {
    let dir = tempfile::tempdir().unwrap();
    let (mut state, mut model, keys) = spilled_state(dir.path());
    let all: BTreeSet<u32> = range(2, 1).iter().collect();
    let mut chains = Chains::default();
    assert_eq!(
        chains.apply(snapshot(&mut state, &all, &BTreeSet::new())),
        0
    );
    let first = base_dir_files(dir.path());
    assert!(first.iter().all(|name| name.starts_with("base-1-")));
    // A few updates, each evicting a key to disk: a handful of changes
    // in some groups, far under half of each group's file.
    for key in &keys[..12] {
        add(&mut state, &mut model, *key, 5);
        state.enforce_budget().unwrap();
    }
    let changed: BTreeSet<u32> = state.changed_key_groups().into_iter().collect();
    assert!(!changed.is_empty());
    let deltas = chains.apply(snapshot(&mut state, &changed, &all));
    assert_eq!(deltas, changed.len(), "every changed group was a delta");
    let second = base_dir_files(dir.path());
    assert!(second.contains("run-2"), "{second:?}");
    assert_eq!(
        second
            .iter()
            .filter(|name| name.starts_with("base-"))
            .count(),
        first.len(),
        "no base file was rewritten: {second:?}"
    );
    assert!(second.iter().all(|name| !name.starts_with("base-2-")));
    assert_eq!(chains.restored(|_| true), model);
    // A whole snapshot of every group reads the runs back, and rewrites
    // the groups that changed on disk since.
    for key in &keys[100..110] {
        add(&mut state, &mut model, *key, 7);
        state.enforce_budget().unwrap();
    }
    assert_eq!(
        chains.apply(snapshot(&mut state, &all, &BTreeSet::new())),
        0
    );
    assert_eq!(chains.restored(|_| true), model);
    assert!(base_dir_files(dir.path())
        .iter()
        .any(|name| name.starts_with("base-3-")));
}

#[test]
fn a_delta_snapshot_dropped_half_way_leaves_no_run_file_and_the_next_reads_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let (mut state, mut model, keys) = spilled_state(dir.path());
    let all: BTreeSet<u32> = range(2, 1).iter().collect();
    let mut chains = Chains::default();
    chains.apply(snapshot(&mut state, &all, &BTreeSet::new()));
    for key in &keys[..40] {
        add(&mut state, &mut model, *key, 3);
        state.enforce_budget().unwrap();
    }
    let changed: BTreeSet<u32> = state.changed_key_groups().into_iter().collect();
    let mut dropped = take(&mut state, &changed, &all);
    let part = dropped.next_part().unwrap().unwrap();
    assert!(is_delta(&part.bytes));
    assert!(dropped.parts_left() > 0, "dropped half-way");
    assert!(dropped.merged());
    drop(dropped);
    let files = base_dir_files(dir.path());
    assert!(!files.contains("run-2"), "{files:?}");
    assert!(files.iter().all(|name| name.starts_with("base-1-")));
    // The next snapshot has no base to merge: it reads the store whole.
    let mut next = state.snapshot(&mut |_| true).unwrap();
    let first = next.next_part().unwrap().unwrap();
    assert!(!next.merged());
    let mut parts = vec![first];
    parts.extend(next.collect_parts().unwrap());
    chains.apply(parts);
    assert_eq!(chains.restored(|_| true), model);
}

/// After a snapshot dropped half-way there is no base to merge, so the
/// next one reads the disk table's view; its delta parts still come from
/// the changes (the state settles deltas when a snapshot is taken, and
/// the hot entries it freezes may be only those a delta needs).
#[test]
fn after_a_dropped_snapshot_the_view_still_writes_deltas_from_the_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut state, mut model, keys) = spilled_state(dir.path());
    let all: BTreeSet<u32> = range(2, 1).iter().collect();
    let mut chains = Chains::default();
    chains.apply(snapshot(&mut state, &all, &BTreeSet::new()));
    // Writes to two key groups only.
    let two: BTreeSet<u32> = all.iter().copied().take(2).collect();
    for key in keys.iter().filter(|key| two.contains(&key_group_of(**key))) {
        add(&mut state, &mut model, *key, 3);
        state.enforce_budget().unwrap();
    }
    // The dropped snapshot took these groups' changes: their chains miss
    // them, so the next snapshot must write them whole.
    let lost: BTreeSet<u32> = state.changed_key_groups().into_iter().collect();
    assert_eq!(lost, two);
    let mut dropped = take(&mut state, &lost, &all);
    dropped.next_part().unwrap().unwrap();
    assert!(dropped.parts_left() > 0, "dropped half-way");
    drop(dropped);
    // Writes that reach the disk (evictions) in groups the dropped
    // snapshot did not take.
    let later: Vec<u64> = keys[100..]
        .iter()
        .copied()
        .filter(|key| !lost.contains(&key_group_of(*key)))
        .take(40)
        .collect();
    for key in &later {
        add(&mut state, &mut model, *key, 11);
        state.enforce_budget().unwrap();
    }
    let deltas: BTreeSet<u32> = all.difference(&lost).copied().collect();
    assert!(!deltas.is_empty());
    let mut next = take(&mut state, &all, &deltas);
    let first = next.next_part().unwrap().unwrap();
    assert!(!next.merged(), "no base to merge after the drop");
    let mut parts = vec![first];
    parts.extend(next.collect_parts().unwrap());
    let written_as_deltas = chains.apply(parts);
    assert_eq!(written_as_deltas, deltas.len(), "every asked delta is one");
    assert_eq!(chains.restored(|_| true), model);
}

/// One random operation: mostly updates, some deletions, evictions now and
/// then.
fn random_op(
    rng: &mut Rng,
    keys: &[u64],
    state: &mut SpillingState<u64, Count>,
    model: &mut Model,
) {
    let key = keys[rng.below(keys.len() as u64) as usize];
    match rng.below(16) {
        0 => {
            let removed = state.remove(&key).unwrap().map(|count| count.count);
            assert_eq!(removed, model.remove(&key), "removing {key}");
        }
        1..=3 => state.enforce_budget().unwrap(),
        _ => add(state, model, key, 1 + rng.below(9)),
    }
}

/// Many snapshot epochs of a state with a small budget: each picks the
/// changed groups (sometimes leaving some out, which then need a whole
/// part) and some unchanged ones, as deltas where the chain allows; the
/// chains must restore to the model in every group that is current.
fn epochs_against_model(seed: u64) {
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let (mut state, mut model) = (spilling(dir.path(), 24), Model::new());
    let keys = owned_keys(600);
    let all: BTreeSet<u32> = range(2, 1).iter().collect();
    let mut chains = Chains::default();
    // Groups whose chain misses changes (left out of a snapshot).
    let mut stale = all.clone();
    let (mut deltas, mut with_runs, mut dropped) = (0, 0, 0);
    for epoch in 1..=60 {
        for _ in 0..rng.below(300) {
            random_op(&mut rng, &keys, &mut state, &mut model);
        }
        state.enforce_budget().unwrap();
        let changed: BTreeSet<u32> = state.changed_key_groups().into_iter().collect();
        let mut picked: BTreeSet<u32> = all.iter().copied().filter(|_| rng.below(4) == 0).collect();
        if rng.below(8) != 0 {
            picked.extend(&changed);
        }
        let delta: BTreeSet<u32> = picked
            .iter()
            .copied()
            .filter(|key_group| !stale.contains(key_group) && rng.below(5) != 0)
            .collect();
        if rng.below(8) == 0 {
            // Dropped half-way: its groups' changes are lost to the chains,
            // and the next snapshot has no base to merge (it reads the
            // view, and writes its deltas from the changes).
            drop_half_way(&mut state, &picked, &delta);
            stale.extend(&changed);
            dropped += 1;
            continue;
        }
        let (parts, taken) =
            snapshot_while_writing(&mut state, &picked, &delta, &mut rng, &keys, &mut model);
        deltas += chains.apply(parts);
        stale.retain(|key_group| !picked.contains(key_group));
        stale.extend(changed.difference(&picked));
        if base_dir_files(dir.path())
            .iter()
            .any(|name| name.starts_with("run-"))
        {
            with_runs += 1;
        }
        if stale.len() < all.len() {
            let current = |key_group: u32| !stale.contains(&key_group);
            let want: Model = taken
                .iter()
                .filter(|(key, _)| current(key_group_of(**key)))
                .map(|(key, count)| (*key, *count))
                .collect();
            assert_eq!(chains.restored(current), want, "epoch {epoch}");
        }
    }
    // A whole snapshot reads every group's base file and runs.
    chains.apply(snapshot(&mut state, &all, &BTreeSet::new()));
    assert_eq!(chains.restored(|_| true), model);
    assert!(deltas > 0, "no delta part was written");
    assert!(with_runs > 0, "no run was appended");
    assert!(dropped > 0, "no snapshot was dropped");
    assert!(
        state.encoded_slices() > 0,
        "no frozen slice was written before the writer read it"
    );
}

/// [`snapshot`], read part by part while the operator goes on writing,
/// loading, evicting and deleting, so that it writes frozen slices the
/// snapshot has not read yet (each then encodes what the snapshot takes of
/// it first). Returns the parts and the model as of the taking.
fn snapshot_while_writing(
    state: &mut SpillingState<u64, Count>,
    picked: &BTreeSet<u32>,
    deltas: &BTreeSet<u32>,
    rng: &mut Rng,
    keys: &[u64],
    model: &mut Model,
) -> (Vec<KeyGroupPart>, Model) {
    let taken = model.clone();
    let mut snapshot = take(state, picked, deltas);
    let mut parts = Vec::new();
    loop {
        for _ in 0..rng.below(40) {
            random_op(rng, keys, state, model);
        }
        match snapshot.next_part() {
            Some(part) => parts.push(part.unwrap()),
            None => return (parts, taken),
        }
    }
}

/// Takes a snapshot as [`snapshot`] does, reads at most one part of it
/// and drops it.
fn drop_half_way(
    state: &mut SpillingState<u64, Count>,
    picked: &BTreeSet<u32>,
    deltas: &BTreeSet<u32>,
) {
    let mut snapshot = take(state, picked, deltas);
    if let Some(part) = snapshot.next_part() {
        part.unwrap();
    }
}

#[test]
fn many_epochs_of_delta_and_whole_snapshots_restore_the_model() {
    for _ in 0..3 {
        with_seed("the runs' model test", epochs_against_model);
    }
}
