//! Shared fixtures for the keyed state tests: per-key state types with
//! hand-written `Snapshot` impls (the derive macro is developed separately,
//! and these tests must not depend on it), a forge that builds key group
//! parts with correct checksums around arbitrary contents, and helpers to
//! fill, snapshot and restore subtasks.
//!
//! This module never asserts anything itself; the test binaries that
//! include it do. Each binary uses a different subset, hence the
//! `dead_code` allow.

#![allow(dead_code)]

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use snapflow::keyed::{
    parts_in_range, KeyedError, KeyedState, ListState, MapState, MaxParallelism, StateKey,
};
use snapflow::state::{FieldSchema, Schema, SchemaShape, Snapshot, StateError, StoredSchema};
use std::collections::BTreeMap;
use std::fmt::Debug;

/// `cases` cases per property. Failures are persisted next to the test
/// file (`<file>.regressions`), because proptest's default location expects
/// a `lib.rs` and integration tests have none.
pub fn proptest_config(cases: u32) -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("regressions"),
        )),
        ..proptest::test_runner::Config::with_cases(cases)
    }
}

/// A counter, the state of the keyed-count benchmark.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Count {
    pub count: u64,
}

impl Snapshot for Count {
    const SCHEMA: Schema = Schema {
        type_name: "Count",
        version: 1,
        shape: SchemaShape::Named(&[FieldSchema {
            name: "count",
            type_name: "u64",
        }]),
    };

    fn encode_payload(&self, out: &mut Vec<u8>) -> Result<(), StateError> {
        snapflow::__private::encode_field("Count", self, out)
    }

    fn decode_payload(payload: &[u8]) -> Result<Self, StateError> {
        decode_with_postcard("Count", payload)
    }
}

/// Version 2 of `Count`: it adds a field and upgrades from version 1, as
/// `#[snapshot(version = 2, upgrade_from = Count)]` would.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountV2 {
    pub count: u64,
    pub last_seen: Option<u64>,
}

impl From<Count> for CountV2 {
    fn from(old: Count) -> Self {
        CountV2 {
            count: old.count,
            last_seen: None,
        }
    }
}

impl Snapshot for CountV2 {
    const SCHEMA: Schema = Schema {
        type_name: "Count",
        version: 2,
        shape: SchemaShape::Named(&[
            FieldSchema {
                name: "count",
                type_name: "u64",
            },
            FieldSchema {
                name: "last_seen",
                type_name: "Option<u64>",
            },
        ]),
    };

    fn encode_payload(&self, out: &mut Vec<u8>) -> Result<(), StateError> {
        snapflow::__private::encode_field("Count", self, out)
    }

    fn decode_payload(payload: &[u8]) -> Result<Self, StateError> {
        decode_with_postcard("Count", payload)
    }

    fn decode_stored(stored: &StoredSchema, payload: &[u8]) -> Result<Self, StateError> {
        if stored.version < 2 {
            return Count::decode_stored(stored, payload).map(CountV2::from);
        }
        snapflow::state::check_exact_schema::<Self>(stored)?;
        Self::decode_payload(payload)
    }
}

/// `Count`'s version with a different field: same version, other schema.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Renamed {
    pub total: u64,
}

impl Snapshot for Renamed {
    const SCHEMA: Schema = Schema {
        type_name: "Count",
        version: 1,
        shape: SchemaShape::Named(&[FieldSchema {
            name: "total",
            type_name: "u64",
        }]),
    };

    fn encode_payload(&self, out: &mut Vec<u8>) -> Result<(), StateError> {
        snapflow::__private::encode_field("Count", self, out)
    }

    fn decode_payload(payload: &[u8]) -> Result<Self, StateError> {
        decode_with_postcard("Count", payload)
    }
}

/// A richer per-key state with the collection types as fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    pub count: u64,
    pub by_word: MapState<String, u64>,
    pub recent: ListState<i64>,
}

impl Snapshot for Tally {
    const SCHEMA: Schema = Schema {
        type_name: "Tally",
        version: 1,
        shape: SchemaShape::Named(&[
            FieldSchema {
                name: "count",
                type_name: "u64",
            },
            FieldSchema {
                name: "by_word",
                type_name: "MapState<String, u64>",
            },
            FieldSchema {
                name: "recent",
                type_name: "ListState<i64>",
            },
        ]),
    };

    fn encode_payload(&self, out: &mut Vec<u8>) -> Result<(), StateError> {
        snapflow::__private::encode_field("Tally", self, out)
    }

    fn decode_payload(payload: &[u8]) -> Result<Self, StateError> {
        decode_with_postcard("Tally", payload)
    }
}

/// Decodes a whole payload as one serde value, the way derived code
/// decodes its fields (the framework's own helpers, not a copy).
fn decode_with_postcard<T: DeserializeOwned>(
    type_name: &'static str,
    mut payload: &[u8],
) -> Result<T, StateError> {
    let value = snapflow::__private::decode_field(type_name, &mut payload)?;
    snapflow::__private::finish(type_name, payload)?;
    Ok(value)
}

/// The default max parallelism, 128.
pub fn max128() -> MaxParallelism {
    MaxParallelism::default()
}

/// Subtasks of one parallelism, filled by routing every entry to the
/// subtask that owns its key group, as a partitioner would.
pub fn fill<K: StateKey, S: Clone>(
    max: MaxParallelism,
    parallelism: u32,
    entries: &BTreeMap<K, S>,
) -> Vec<KeyedState<K, S>> {
    let mut subtasks: Vec<KeyedState<K, S>> = (0..parallelism)
        .map(|subtask| KeyedState::for_subtask(max, parallelism, subtask).unwrap())
        .collect();
    for (key, state) in entries {
        let key_group = max.key_group_of(snapflow::keyed::key_hash(key));
        let subtask = max.subtask_for_key_group(parallelism, key_group).unwrap();
        let previous = subtasks[subtask as usize]
            .insert(key.clone(), state.clone())
            .expect("routed to the owner");
        assert!(previous.is_none());
    }
    subtasks
}

/// Every part of every subtask's snapshot.
pub fn snapshot_all<K: StateKey, S: Snapshot>(
    subtasks: &[KeyedState<K, S>],
) -> Vec<(u32, Vec<u8>)> {
    subtasks
        .iter()
        .flat_map(|subtask| subtask.snapshot().expect("snapshot").into_parts())
        .collect()
}

/// Restores `parallelism` subtasks, each from the parts in its range.
pub fn restore_all<K: StateKey, S: Snapshot>(
    max: MaxParallelism,
    parallelism: u32,
    parts: &[(u32, Vec<u8>)],
) -> Result<Vec<KeyedState<K, S>>, KeyedError> {
    (0..parallelism)
        .map(|subtask| {
            let range = max.range_for_subtask(parallelism, subtask)?;
            let mine = parts_in_range(range, parts.iter().map(|(group, bytes)| (*group, bytes)));
            KeyedState::restore(max, range, mine)
        })
        .collect()
}

/// The union of the subtasks' contents, checking no key appears twice.
pub fn merged<K: StateKey + Ord + Debug, S: Clone>(
    subtasks: &[KeyedState<K, S>],
) -> BTreeMap<K, S> {
    let mut all = BTreeMap::new();
    for subtask in subtasks {
        for (key, state) in subtask.iter() {
            assert!(subtask.owns(key), "{key:?} is outside {}", subtask.range());
            assert!(
                all.insert(key.clone(), state.clone()).is_none(),
                "{key:?} twice"
            );
        }
    }
    all
}

/// The fields of a part's header, for forging parts.
#[derive(Debug, Clone, Copy)]
pub struct PartForge {
    pub magic: [u8; 4],
    pub version: u16,
    pub flags: u16,
    pub max_parallelism: u32,
    pub key_group: u32,
    pub entry_count: u64,
    pub schema_len: u32,
}

impl PartForge {
    /// An honest header for `entry_count` entries with `Count`'s schema.
    pub fn honest(max_parallelism: u32, key_group: u32, entry_count: u64) -> Self {
        PartForge {
            magic: *b"SFKG",
            version: 1,
            flags: 0,
            max_parallelism,
            key_group,
            entry_count,
            schema_len: schema_section::<Count>().len() as u32,
        }
    }

    /// The part: this header with correct checksums around `body` (the
    /// schema section followed by the entries).
    pub fn seal(&self, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.magic);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.max_parallelism.to_le_bytes());
        out.extend_from_slice(&self.key_group.to_le_bytes());
        out.extend_from_slice(&self.entry_count.to_le_bytes());
        out.extend_from_slice(&self.schema_len.to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
        let header_crc = crc32fast::hash(&out);
        out.extend_from_slice(&header_crc.to_le_bytes());
        out.extend_from_slice(body);
        out
    }
}

/// The schema section parts of `S` carry.
pub fn schema_section<S: Snapshot>() -> Vec<u8> {
    let stored = StoredSchema::of(&S::SCHEMA);
    postcard::to_allocvec(&stored).unwrap()
}

/// One encoded entry: the key in postcard, the payload length, the payload.
pub fn entry_bytes<K: Serialize>(key: &K, payload: &[u8]) -> Vec<u8> {
    let mut out = postcard::to_allocvec(key).unwrap();
    out.extend_from_slice(&postcard::to_allocvec(&(payload.len() as u64)).unwrap());
    out.extend_from_slice(payload);
    out
}

/// A `Count` payload.
pub fn count_payload(count: u64) -> Vec<u8> {
    let mut out = Vec::new();
    Count { count }.encode_payload(&mut out).unwrap();
    out
}

/// `count` keys (u64) that all fall into `key_group` of `max`, smallest first.
pub fn keys_in_group(max: MaxParallelism, key_group: u32, count: usize) -> Vec<u64> {
    (0u64..)
        .filter(|key| max.key_group_of(snapflow::keyed::key_hash(key)) == key_group)
        .take(count)
        .collect()
}
