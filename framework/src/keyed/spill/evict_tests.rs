//! Tests of the spilling backend's eviction choice (`evict.rs`) through
//! [`SpillingState`]: keys used between every batch stay in memory under
//! second chance (and do not under the order-based choice it replaced),
//! a table where every key is referenced still meets its budget, and a
//! seeded random workload of reads, writes, deletions, evictions and
//! snapshots (live ones too) keeps every value exact against a
//! `BTreeMap` model and marks no key group dirty by evicting. Compiled
//! for tests only; `SNAPFLOW_SEED` replays a failing run (its seed is
//! printed).

use std::collections::BTreeMap;

use super::evict::Policy;
use super::overlay_tests::{drain, expected};
use super::state::tests::{owned_keys, spilling};
use super::{SpillSnapshot, SpillingState};
use crate::keyed::store::KeyGroupSnapshots;
use crate::keyed::test_support::{with_seed, Count, Rng};

type Model = BTreeMap<u64, u64>;

/// Checks that every snapshot part and every entry `for_each` visits
/// match `model`.
fn assert_exact(state: &mut SpillingState<u64, Count>, model: &Model) {
    let hashed = model.iter().map(|(key, count)| (*key, *count)).collect();
    assert_eq!(
        drain(state.snapshot(&mut |_| true).unwrap()),
        expected(&hashed, |_| true)
    );
    let mut visited = Model::new();
    state
        .for_each(|key, count| {
            visited.insert(*key, count.count);
        })
        .unwrap();
    assert_eq!(&visited, model);
}

/// What [`hot_set_workload`] saw.
#[derive(Debug)]
struct HotSetRun {
    /// Accesses to a hot key, after warm-up, that found it only on disk.
    hot_misses: u64,
    /// Entries read back from disk after warm-up (hot and cold).
    loads_after_warm_up: u64,
}

/// A budget of 1,000 keys; 50 hot keys accessed between every batch of
/// 100 accesses to a pool of 20,000 cold keys (so cold keys are read back
/// too), 400 rounds, the first 50 of them warm-up. Checks exactness at
/// the end.
fn hot_set_workload(policy: Policy) -> HotSetRun {
    const BUDGET: usize = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let mut state = spilling(dir.path(), BUDGET).with_policy(policy);
    let keys = owned_keys(20_050);
    let (hot, cold) = keys.split_at(50);
    let (mut model, mut rng) = (Model::new(), Rng(7));
    let (mut hot_misses, mut loads_at_warm_up) = (0, 0);
    for round in 0..400 {
        if round == 50 {
            loads_at_warm_up = state.loaded_entries();
        }
        for _ in 0..100 {
            let key = cold[rng.below(cold.len() as u64) as usize];
            state.get_or_default(&key).unwrap().count += 1;
            *model.entry(key).or_default() += 1;
        }
        state.enforce_budget().unwrap();
        assert!(state.len_in_memory() <= BUDGET);
        for key in hot {
            if round >= 50 && !state.in_memory(key) {
                hot_misses += 1;
            }
            state.get_or_default(key).unwrap().count += 1;
            *model.entry(*key).or_default() += 1;
        }
        state.enforce_budget().unwrap();
    }
    let run = HotSetRun {
        hot_misses,
        loads_after_warm_up: state.loaded_entries() - loads_at_warm_up,
    };
    assert_exact(&mut state, &model);
    run
}

#[test]
fn keys_used_between_every_batch_are_never_read_back_after_warm_up() {
    let clock = hot_set_workload(Policy::SecondChance);
    assert_eq!(clock.hot_misses, 0, "{clock:?}");
    // The order-based choice (main before second chance) evicts hot keys
    // as readily as cold ones, so the same workload reads them back. Seen
    // (the workload is deterministic): second chance 0 hot misses and
    // 20,697 entries read back after warm-up, order 1,007 hot misses and
    // 21,658 read back (the cold pool's misses dominate both). With the
    // reference bit never set, the first assertion fails (checked once by
    // hand).
    let order = hot_set_workload(Policy::Order);
    eprintln!("second chance: {clock:?}; order: {order:?}");
    assert!(order.hot_misses > 0, "{order:?}");
    assert!(
        order.loads_after_warm_up > clock.loads_after_warm_up,
        "{order:?} {clock:?}"
    );
}

#[test]
fn a_table_where_every_key_was_used_again_still_meets_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let mut state = spilling(dir.path(), 100);
    let keys = owned_keys(130);
    for _ in 0..2 {
        for key in &keys {
            state.get_or_default(key).unwrap().count += 1;
        }
    }
    // All 130 are referenced: the first lap clears every bit, the second
    // takes what it needs.
    state.enforce_budget().unwrap();
    assert_eq!(state.len_in_memory(), 75);
    assert_eq!(state.evicted_entries(), 55);
    let model = keys.iter().map(|key| (*key, 2)).collect();
    assert_exact(&mut state, &model);
}

/// A live snapshot and the model as of its taking.
type Live = (SpillSnapshot, Model);

/// Random reads, writes, deletions, evictions and snapshots over a
/// random budget, half of the accesses to a few hot keys, checked against
/// the model throughout.
fn random_workload(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(seed);
    let budget = 8 + rng.below(40) as usize;
    let policy = match rng.below(4) {
        0 => Policy::Order,
        _ => Policy::SecondChance,
    };
    let mut state = spilling(dir.path(), budget).with_policy(policy);
    let keys = owned_keys(300);
    let hot = &keys[..budget / 2];
    let mut model = Model::new();
    let mut live: Option<Live> = None;
    for _ in 0..4_000 {
        let key = match rng.below(2) {
            0 => hot[rng.below(hot.len() as u64) as usize],
            _ => keys[rng.below(keys.len() as u64) as usize],
        };
        match rng.below(20) {
            0 | 1 => {
                let removed = state.remove(&key).unwrap().map(|count| count.count);
                assert_eq!(removed, model.remove(&key), "removing {key}");
            }
            2..=4 => {
                // A read creates the key's default state, as an access does.
                let got = state.get_or_default(&key).unwrap().count;
                assert_eq!(got, *model.entry(key).or_default(), "reading {key}");
            }
            5..=7 => evict_and_check(&mut state),
            8 => live = snapshot_step(&mut state, &model, live),
            9 if rng.below(20) == 0 => assert_exact(&mut state, &model),
            _ => {
                let amount = 1 + rng.below(5);
                state.get_or_default(&key).unwrap().count += amount;
                *model.entry(key).or_default() += amount;
            }
        }
    }
    if let Some((snapshot, then)) = live {
        check_live(snapshot, &then);
    }
    assert_exact(&mut state, &model);
}

/// Enforces the budget and checks it held and that no key group became
/// dirty by evicting (an evicted entry moves to disk unchanged).
fn evict_and_check(state: &mut SpillingState<u64, Count>) {
    let dirty = state.changed_key_groups();
    state.enforce_budget().unwrap();
    assert_eq!(
        state.changed_key_groups(),
        dirty,
        "evicting marked groups dirty"
    );
}

/// Takes a snapshot to read later, or reads the live one (which must hold
/// the model as of its taking) and forgets the changes, as a checkpoint
/// does.
fn snapshot_step(
    state: &mut SpillingState<u64, Count>,
    model: &Model,
    live: Option<Live>,
) -> Option<Live> {
    match live {
        None => Some((state.snapshot(&mut |_| true).unwrap(), model.clone())),
        Some((snapshot, then)) => {
            check_live(snapshot, &then);
            state.forget_changes();
            None
        }
    }
}

fn check_live(snapshot: SpillSnapshot, then: &Model) {
    let hashed = then.iter().map(|(key, count)| (*key, *count)).collect();
    assert_eq!(drain(snapshot), expected(&hashed, |_| true));
}

#[test]
fn a_random_workload_keeps_every_value_exact_under_either_choice() {
    for _ in 0..4 {
        with_seed("random_workload", random_workload);
    }
}
