//! Collection values for per-key state: [`MapState`] (Flink's `MapState`)
//! and [`ListState`] (Flink's `ListState`), used as fields of a per-key
//! state struct.
//!
//! This module owns two thin wrappers with serde encodings. They never
//! touch key groups or snapshots themselves: a state struct holding them is
//! encoded like any other field (postcard through serde), so they are as
//! large in a snapshot as their contents.
//!
//! Known gap: unlike Flink's RocksDB backend, a whole map or list is
//! serialized with its key's state; there is no per-entry storage and no
//! spilling to disk, so very large per-key collections cost memory and
//! snapshot time in proportion to their size.

use super::hash::BuildStableHasher;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::hash::Hash;

/// A map per key, for large per-key collections; iteration order is
/// unspecified (but deterministic, because the hasher is fixed).
///
/// Decoding a hostile map allocates at most what serde's cautious size hint
/// allows (1 MiB per map) before the entries are actually read.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(
    transparent,
    bound(
        serialize = "UK: Serialize + Eq + Hash, UV: Serialize",
        deserialize = "UK: Deserialize<'de> + Eq + Hash, UV: Deserialize<'de>"
    )
)]
pub struct MapState<UK, UV> {
    entries: HashMap<UK, UV, BuildStableHasher>,
}

impl<UK, UV> Default for MapState<UK, UV> {
    fn default() -> Self {
        MapState {
            entries: HashMap::with_hasher(BuildStableHasher),
        }
    }
}

// Derived equality would ask only `UK: PartialEq`, but map equality needs
// `UK: Eq + Hash`.
impl<UK: Eq + Hash, UV: PartialEq> PartialEq for MapState<UK, UV> {
    fn eq(&self, other: &Self) -> bool {
        self.entries == other.entries
    }
}

impl<UK: Eq + Hash, UV: Eq> Eq for MapState<UK, UV> {}

impl<UK: Eq + Hash, UV> MapState<UK, UV> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value of `key`.
    pub fn get(&self, key: &UK) -> Option<&UV> {
        self.entries.get(key)
    }

    /// The value of `key` for update.
    pub fn get_mut(&mut self, key: &UK) -> Option<&mut UV> {
        self.entries.get_mut(key)
    }

    /// The value of `key`, inserting `UV::default()` if absent.
    pub fn get_or_default(&mut self, key: UK) -> &mut UV
    where
        UV: Default,
    {
        self.entries.entry(key).or_default()
    }

    /// Sets the value of `key`, returning the previous value.
    pub fn insert(&mut self, key: UK, value: UV) -> Option<UV> {
        self.entries.insert(key, value)
    }

    /// Removes `key` and returns its value.
    pub fn remove(&mut self, key: &UK) -> Option<UV> {
        self.entries.remove(key)
    }

    /// Whether `key` has a value.
    pub fn contains_key(&self, key: &UK) -> bool {
        self.entries.contains_key(key)
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Every entry.
    pub fn iter(&self) -> impl Iterator<Item = (&UK, &UV)> + '_ {
        self.entries.iter()
    }

    /// Every entry, values for update.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&UK, &mut UV)> + '_ {
        self.entries.iter_mut()
    }

    /// Every key.
    pub fn keys(&self) -> impl Iterator<Item = &UK> + '_ {
        self.entries.keys()
    }

    /// Every value.
    pub fn values(&self) -> impl Iterator<Item = &UV> + '_ {
        self.entries.values()
    }

    /// Keeps only the entries for which `keep` returns true.
    pub fn retain(&mut self, keep: impl FnMut(&UK, &mut UV) -> bool) {
        self.entries.retain(keep);
    }
}

impl<UK: Eq + Hash, UV> FromIterator<(UK, UV)> for MapState<UK, UV> {
    fn from_iter<I: IntoIterator<Item = (UK, UV)>>(iter: I) -> Self {
        MapState {
            entries: iter.into_iter().collect(),
        }
    }
}

impl<UK: Eq + Hash, UV> Extend<(UK, UV)> for MapState<UK, UV> {
    fn extend<I: IntoIterator<Item = (UK, UV)>>(&mut self, iter: I) {
        self.entries.extend(iter);
    }
}

/// A list per key, in insertion order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ListState<T> {
    items: Vec<T>,
}

impl<T> Default for ListState<T> {
    fn default() -> Self {
        ListState { items: Vec::new() }
    }
}

impl<T> ListState<T> {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one item.
    pub fn push(&mut self, item: T) {
        self.items.push(item);
    }

    /// Replaces the whole list (Flink's `ListState.update`).
    pub fn update(&mut self, items: impl IntoIterator<Item = T>) {
        self.items.clear();
        self.items.extend(items);
    }

    /// The item at `index`.
    pub fn get(&self, index: usize) -> Option<&T> {
        self.items.get(index)
    }

    /// The items as a slice.
    pub fn as_slice(&self) -> &[T] {
        &self.items
    }

    /// The number of items.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Removes every item.
    pub fn clear(&mut self) {
        self.items.clear();
    }

    /// Removes and returns every item, leaving the list empty.
    pub fn take(&mut self) -> Vec<T> {
        std::mem::take(&mut self.items)
    }

    /// Every item in order.
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.items.iter()
    }

    /// Keeps only the items for which `keep` returns true.
    pub fn retain(&mut self, keep: impl FnMut(&T) -> bool) {
        self.items.retain(keep);
    }
}

impl<T> FromIterator<T> for ListState<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        ListState {
            items: iter.into_iter().collect(),
        }
    }
}

impl<T> Extend<T> for ListState<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, iter: I) {
        self.items.extend(iter);
    }
}

impl<'a, T> IntoIterator for &'a ListState<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}
