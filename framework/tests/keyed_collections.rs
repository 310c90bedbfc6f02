//! Tests of the per-key collection types `MapState` and `ListState`: their
//! methods, their serde round trip, their round trip as fields of a per-key
//! state through a keyed snapshot, and rejection of hostile bytes.
//!
//! Randomised cases use proptest; `PROPTEST_RNG_SEED=<n>` replays a run.

mod keyed_support;

use keyed_support::{max128, Tally};
use proptest::prelude::*;
use snapflow::keyed::{KeyedState, ListState, MapState};

#[test]
fn map_state_methods() {
    let mut map: MapState<String, u64> = MapState::new();
    assert!(map.is_empty());
    assert_eq!(map.insert("a".into(), 1), None);
    assert_eq!(map.insert("a".into(), 2), Some(1));
    *map.get_or_default("b".into()) += 5;
    *map.get_mut(&"a".to_string()).unwrap() += 1;
    assert_eq!(map.get(&"a".to_string()), Some(&3));
    assert!(map.contains_key(&"b".to_string()));
    assert_eq!(map.len(), 2);
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    assert_eq!(keys, ["a", "b"]);
    assert_eq!(map.values().sum::<u64>(), 8);
    map.retain(|_, value| *value > 3);
    assert_eq!(map.iter().collect::<Vec<_>>(), [(&"b".to_string(), &5)]);
    assert_eq!(map.remove(&"b".to_string()), Some(5));
    map.extend([("c".to_string(), 1)]);
    map.clear();
    assert!(map.is_empty());
}

#[test]
fn list_state_methods() {
    let mut list: ListState<u32> = ListState::new();
    list.push(1);
    list.extend([2, 3, 4]);
    assert_eq!(list.as_slice(), [1, 2, 3, 4]);
    assert_eq!(list.get(2), Some(&3));
    list.retain(|item| item % 2 == 0);
    assert_eq!(list.iter().copied().collect::<Vec<_>>(), [2, 4]);
    list.update([9, 8]);
    assert_eq!((&list).into_iter().copied().collect::<Vec<_>>(), [9, 8]);
    assert_eq!(list.take(), vec![9, 8]);
    assert!(list.is_empty());
    list.push(7);
    list.clear();
    assert_eq!(list.len(), 0);
}

fn check_serde_round_trip(map: MapState<String, u64>, list: ListState<i64>) {
    let bytes = postcard::to_allocvec(&(&map, &list)).unwrap();
    let (map_back, list_back): (MapState<String, u64>, ListState<i64>) =
        postcard::from_bytes(&bytes).unwrap();
    assert_eq!(map_back, map);
    assert_eq!(list_back, list);
}

#[test]
fn empty_collections_round_trip() {
    check_serde_round_trip(MapState::new(), ListState::new());
}

proptest! {
    #![proptest_config(keyed_support::proptest_config(256))]

    #[test]
    fn collections_round_trip(
        entries in prop::collection::hash_map(".{0,8}", any::<u64>(), 0..20),
        items in prop::collection::vec(any::<i64>(), 0..20),
    ) {
        check_serde_round_trip(entries.into_iter().collect(), items.into_iter().collect());
    }

    #[test]
    fn hostile_bytes_into_collections_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        // Errors or small values are both fine; panics and huge
        // allocations are not (postcard checks claimed lengths).
        let _ = postcard::from_bytes::<MapState<String, u64>>(&bytes);
        let _ = postcard::from_bytes::<ListState<String>>(&bytes);
    }
}

#[test]
fn collections_round_trip_inside_keyed_state() {
    let mut state: KeyedState<String, Tally> = KeyedState::for_subtask(max128(), 1, 0).unwrap();
    for (index, word) in ["x", "y", "x", "z", "x"].iter().enumerate() {
        let tally = state.get_or_default(&format!("user-{}", index % 2));
        tally.count += 1;
        *tally.by_word.get_or_default(word.to_string()) += 1;
        tally.recent.push(index as i64);
    }
    let snapshot = state.snapshot().unwrap();
    let restored: KeyedState<String, Tally> =
        KeyedState::restore(max128(), state.range(), snapshot.into_parts()).unwrap();
    let user0 = restored.get(&"user-0".to_string()).unwrap();
    assert_eq!(user0.count, 3);
    assert_eq!(user0.by_word.get(&"x".to_string()), Some(&3));
    assert_eq!(user0.recent.as_slice(), [0, 2, 4]);
    assert_eq!(
        restored.get(&"user-1".to_string()),
        state.get(&"user-1".to_string())
    );
}
