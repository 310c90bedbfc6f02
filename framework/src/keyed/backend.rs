//! [`KeyedState`]: the per-key state of one subtask, snapshotted and restored
//! per key group.
//!
//! This module owns the in-memory layout, the hot-path lookup, and turning
//! the whole store into per-key-group parts and back. It never routes
//! records (the partitioner does, with the same [`key_hash`] and
//! [`MaxParallelism::key_group_of`]) and never does I/O.
//!
//! # Layout, and why
//!
//! One `hashbrown::HashTable<(K, S)>` for the whole subtask. A lookup hashes
//! the key once with the stable hash, derives the key group and its slice
//! from that hash (to refuse keys of foreign key groups and to mark the
//! slice dirty, see "Dirty slices" below), and
//! probes the table with the same hash (`HashTable` takes a precomputed
//! hash; std's `HashMap` cannot, which is why we depend on hashbrown). An
//! existing key costs one hash and no allocation; a new key is cloned once.
//! Snapshots compute each key's group again and bucket the entries. The
//! job's keyed operator, whose records a hash partitioner routed by the
//! same key groups, uses [`KeyedState::get_or_default_routed`], which skips
//! the per-call key group (checked in debug builds and again at snapshot).
//!
//! The alternative was one table per key group, in a `Vec` indexed by
//! `key_group - range.start`, which makes snapshot and restore per group
//! direct. `benches/keyed.rs` measures both on the count workload (50 M
//! records, 10,000 keys, 128 key groups; 2 cores shared with other builds,
//! so figures move by 10-20% between runs). In one run: the bare
//! `HashMap<u64, u64>` with the same hasher 330 M records/s; a hand-written
//! single table with the key group check 268 M (0.81x); `KeyedState` 241 M
//! (0.73x; it also marks the group dirty and keeps its fields in memory
//! rather than registers); hand-written per-group tables 223 M (0.68x:
//! 128 small tables add a dependent load and spread the hot entries over
//! more cache lines), and an earlier `KeyedState` built on per-group tables
//! was slower still. std's `HashMap` with SipHash ran at 94 M (0.29x). The
//! hot path matters more than the snapshot's one-hash-per-key bucketing
//! pass (1 M keys snapshot in about 50 ms).
//!
//! # Dirty slices
//!
//! The dirty flags are per slice of a key group, the copy-on-write
//! layout's unit ([`SLICES_PER_KEY_GROUP`] per group, the six hash bits
//! right below the group's, see [`super::cow_state`]'s "Slices"), not per
//! group: a lookup finds its flag with the same shift that gives the
//! group, so marking a slice costs what marking a group did (one shift,
//! one subtraction, one byte store). An incremental checkpoint then writes
//! only the slices touched since the last one ([`KeyedState::encode_slices`]),
//! in the form the copy-on-write hand-off gives, and refers to the rest;
//! and because both layouts flag the same slots, a state that moves to
//! the copy-on-write layout keeps its flags and its checkpoints' ledger
//! (`job::incremental`) stays valid. The flags take 64 bytes per key
//! group. The sliced encoding is synchronous, on the operator's thread:
//! it hashes every key once to find its slice, orders the written
//! slices' entries by slot (a counting sort of references) and encodes
//! them; the flat layout holds at most the copy-on-write threshold of
//! keys by default, so that stays a few milliseconds.

use super::cow::{encode_group_slices, EncodedSlices};
pub(crate) use super::group_part::KeyGroupPart;
use super::hash::key_hash;
use super::key_group::{
    KeyGroupError, KeyGroupOf, KeyGroupRange, MaxParallelism, SLICES_PER_KEY_GROUP, SLICE_BITS,
};
use super::part::{self, PartWriter};
use super::{KeyedError, StateKey};
use crate::state::{Snapshot, StateError};
use hashbrown::hash_table::Entry;
use hashbrown::HashTable;

/// The per-key state of one subtask of a keyed operator: a value `S` per
/// key `K`, for the keys whose key group is in this subtask's range.
#[derive(Debug)]
pub struct KeyedState<K, S> {
    max_parallelism: MaxParallelism,
    /// `max_parallelism`'s key-group formula with its scaling chosen once,
    /// for the slot of each lookup.
    key_group_of: KeyGroupOf,
    range: KeyGroupRange,
    /// `range.start << SLICE_BITS`: the slot number of the first slot.
    first_slot: u32,
    /// Every key of every owned key group.
    table: HashTable<(K, S)>,
    /// Whether each slot (`group index * SLICES_PER_KEY_GROUP + slice`, see
    /// "Dirty slices" in the module docs) may have changed since
    /// [`Self::clear_dirty`]. Set on every mutable access, so it
    /// over-approximates: reading through `get_or_default` without writing
    /// still marks the slice.
    dirty: Vec<bool>,
}

/// The snapshot of one subtask's keyed state: one part per key group of its
/// range, empty key groups included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedSnapshot {
    /// The job's max parallelism the parts were written with.
    pub max_parallelism: MaxParallelism,
    /// The key groups the snapshot covers.
    pub range: KeyGroupRange,
    /// One part per key group, in ascending key group order.
    pub parts: Vec<KeyGroupPart>,
}

impl KeyedSnapshot {
    /// The parts as `(key_group, bytes)` pairs, the form
    /// [`KeyedState::restore`] takes.
    pub fn into_parts(self) -> impl Iterator<Item = (u32, Vec<u8>)> {
        self.parts
            .into_iter()
            .map(|part| (part.key_group, part.bytes))
    }

    /// The parts as borrowed `(key_group, bytes)` pairs.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &[u8])> + '_ {
        self.parts
            .iter()
            .map(|part| (part.key_group, part.bytes.as_slice()))
    }

    /// The total size of all parts in bytes.
    pub fn total_bytes(&self) -> usize {
        self.parts.iter().map(|part| part.bytes.len()).sum()
    }
}

/// Keeps the parts whose key group is in `range`: what a subtask takes from
/// the union of the parts of every old subtask when restoring at another
/// parallelism.
pub fn parts_in_range<B>(
    range: KeyGroupRange,
    parts: impl IntoIterator<Item = (u32, B)>,
) -> impl Iterator<Item = (u32, B)> {
    parts
        .into_iter()
        .filter(move |(key_group, _)| range.contains(*key_group))
}

/// The parts of `parts`, checked to hold exactly one part per key group of
/// `range` and nothing else: what every restore of keyed state, in memory
/// or spilling, requires before it decodes anything.
pub(crate) fn parts_covering<B>(
    range: KeyGroupRange,
    parts: impl IntoIterator<Item = (u32, B)>,
) -> Result<Vec<(u32, B)>, KeyedError> {
    // Checked while collecting, so at most one part per owned key group
    // is ever held, whatever the iterator yields.
    let mut seen = vec![false; range.len()];
    let mut owned_parts: Vec<(u32, B)> = Vec::with_capacity(range.len());
    for (key_group, bytes) in parts {
        if !range.contains(key_group) {
            return Err(KeyedError::ForeignKeyGroup { key_group, range });
        }
        if std::mem::replace(&mut seen[(key_group - range.start) as usize], true) {
            return Err(KeyedError::DuplicateKeyGroup { key_group });
        }
        owned_parts.push((key_group, bytes));
    }
    let missing = seen.iter().filter(|seen| !**seen).count();
    if let Some(first) = seen.iter().position(|seen| !*seen) {
        return Err(KeyedError::MissingKeyGroups {
            range,
            missing,
            first_missing: range.start + first as u32,
        });
    }
    Ok(owned_parts)
}

impl<K: StateKey, S> KeyedState<K, S> {
    /// Empty state owning the key groups in `range`.
    pub fn new(
        max_parallelism: MaxParallelism,
        range: KeyGroupRange,
    ) -> Result<Self, KeyGroupError> {
        max_parallelism.check_range(range)?;
        Ok(KeyedState {
            max_parallelism,
            key_group_of: KeyGroupOf::new(max_parallelism),
            range,
            first_slot: range.start << SLICE_BITS,
            table: HashTable::new(),
            dirty: vec![false; range.len() * SLICES_PER_KEY_GROUP],
        })
    }

    /// Empty state for `subtask` of `parallelism` subtasks.
    pub fn for_subtask(
        max_parallelism: MaxParallelism,
        parallelism: u32,
        subtask: u32,
    ) -> Result<Self, KeyGroupError> {
        Self::new(
            max_parallelism,
            max_parallelism.range_for_subtask(parallelism, subtask)?,
        )
    }

    /// The job's max parallelism.
    pub fn max_parallelism(&self) -> MaxParallelism {
        self.max_parallelism
    }

    /// The key groups this state owns.
    pub fn range(&self) -> KeyGroupRange {
        self.range
    }

    /// The key group of `key`.
    pub fn key_group_of(&self, key: &K) -> u32 {
        self.max_parallelism.key_group_of(key_hash(key))
    }

    /// Whether `key`'s key group is owned by this state.
    pub fn owns(&self, key: &K) -> bool {
        self.range.contains(self.key_group_of(key))
    }

    /// The hash of `key` and its slot's index in `dirty`, or the key group
    /// of a key this state does not own. The error is a bare `u32` so that
    /// the hot path carries no large error value.
    #[inline]
    fn locate(&self, key: &K) -> Result<(u64, usize), u32> {
        let hash = key_hash(key);
        self.locate_hash(hash).map(|index| (hash, index))
    }

    /// The index in `dirty` of the slot of a key with hash `hash`, or its
    /// key group when this state does not own it.
    #[inline]
    fn locate_hash(&self, hash: u64) -> Result<usize, u32> {
        self.key_group_of
            .locate_slot(hash, self.first_slot, self.dirty.len())
    }

    /// The index in `dirty` of the slot of a key with hash `hash`, out of
    /// bounds for a key of a group this state does not own.
    #[inline(always)]
    fn routed_index(&self, hash: u64) -> usize {
        self.key_group_of.slot_index(hash, self.first_slot)
    }

    /// The slot (`group index * SLICES_PER_KEY_GROUP + slice`, from 0 at
    /// the range's first group) of `key`, or `None` for a key of a group
    /// this state does not own: what [`Self::dirty_slots`] names, the same
    /// as [`CowKeyedState::slot_of`](super::CowKeyedState::slot_of).
    pub fn slot_of(&self, key: &K) -> Option<usize> {
        self.locate(key).ok().map(|(_, index)| index)
    }

    /// Out of line so that the formatting machinery stays out of the
    /// force-inlined hot path.
    #[cold]
    #[inline(never)]
    fn foreign_key_panic(&self, key_group: u32) -> ! {
        panic!("{}", self.foreign_key(key_group))
    }

    #[cold]
    fn foreign_key(&self, key_group: u32) -> KeyedError {
        KeyedError::ForeignKey {
            key_group,
            range: self.range,
        }
    }

    /// The state of `key`, if it has one here.
    pub fn get(&self, key: &K) -> Option<&S> {
        let (hash, _) = self.locate(key).ok()?;
        self.table
            .find(hash, |(other, _)| other == key)
            .map(|(_, state)| state)
    }

    /// The state of `key` for update, if it has one here.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut S> {
        let (hash, index) = self.locate(key).ok()?;
        self.dirty[index] = true;
        self.table
            .find_mut(hash, |(other, _)| other == key)
            .map(|(_, state)| state)
    }

    /// Sets the state of `key`, returning the previous one. Fails for a key
    /// this subtask does not own.
    pub fn insert(&mut self, key: K, state: S) -> Result<Option<S>, KeyedError> {
        let (hash, index) = self
            .locate(&key)
            .map_err(|key_group| self.foreign_key(key_group))?;
        self.dirty[index] = true;
        let entry = self
            .table
            .entry(hash, |(other, _)| *other == key, |(k, _)| key_hash(k));
        match entry {
            Entry::Occupied(mut occupied) => {
                Ok(Some(std::mem::replace(&mut occupied.get_mut().1, state)))
            }
            Entry::Vacant(vacant) => {
                vacant.insert((key, state));
                Ok(None)
            }
        }
    }

    /// Removes the state of `key` and returns it.
    pub fn remove(&mut self, key: &K) -> Option<S> {
        let (hash, index) = self.locate(key).ok()?;
        let entry = self
            .table
            .find_entry(hash, |(other, _)| other == key)
            .ok()?;
        let ((_, state), _) = entry.remove();
        self.dirty[index] = true;
        Some(state)
    }

    /// The number of keys with state.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no key has state.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Every key and its state, in unspecified order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &S)> + '_ {
        self.table.iter().map(|(key, state)| (key, state))
    }

    /// Every key and its state for update. Marks every slice dirty.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut S)> + '_ {
        self.dirty.iter_mut().for_each(|dirty| *dirty = true);
        self.table.iter_mut().map(|(key, state)| (&*key, state))
    }

    /// The key groups with a slice accessed mutably since the last
    /// [`Self::clear_dirty`] (or since creation), ascending.
    pub fn dirty_key_groups(&self) -> impl Iterator<Item = u32> + '_ {
        let start = self.range.start;
        self.dirty
            .chunks(SLICES_PER_KEY_GROUP)
            .enumerate()
            .filter(|(_, slots)| slots.contains(&true))
            .map(move |(index, _)| start + index as u32)
    }

    /// The slots (see [`Self::slot_of`]) accessed mutably since the last
    /// [`Self::clear_dirty`], ascending: the slices an incremental
    /// checkpoint writes again ([`Self::encode_slices`]).
    pub fn dirty_slots(&self) -> impl Iterator<Item = usize> + '_ {
        self.dirty
            .iter()
            .enumerate()
            .filter(|(_, dirty)| **dirty)
            .map(|(index, _)| index)
    }

    /// Marks every slice clean, after a checkpoint has captured them.
    pub fn clear_dirty(&mut self) {
        self.dirty.iter_mut().for_each(|dirty| *dirty = false);
    }

    /// The table and the dirty flags (per slot), taken apart: what
    /// [`CowKeyedState::from_flat`](super::cow_state::CowKeyedState::from_flat)
    /// builds the copy-on-write layout from. Off the hot path.
    pub(crate) fn into_table(self) -> (HashTable<(K, S)>, Vec<bool>) {
        (self.table, self.dirty)
    }
}

impl<K: StateKey, S: Default> KeyedState<K, S> {
    /// The state of `key`, created with `S::default()` if it has none. This
    /// is the hot path: one hash, no allocation for an existing key.
    ///
    /// # Panics
    ///
    /// If this subtask does not own `key`'s key group. That is a routing bug
    /// (the partitioner must use [`key_hash`] and the same max parallelism),
    /// not bad input; use [`Self::try_get_or_default`] to handle it.
    // `inline(always)`: with a plain hint LLVM kept this out of line in the
    // benchmark's loop (hashbrown's probe makes it look large), and the call
    // cost a fifth of the throughput.
    #[inline(always)]
    pub fn get_or_default(&mut self, key: &K) -> &mut S {
        match self.locate(key) {
            Ok((hash, index)) => self.slot_or_default(key, hash, index),
            Err(key_group) => self.foreign_key_panic(key_group),
        }
    }

    /// [`Self::get_or_default`] that reports a key of a foreign key group
    /// as [`KeyedError::ForeignKey`] instead of panicking.
    #[inline]
    pub fn try_get_or_default(&mut self, key: &K) -> Result<&mut S, KeyedError> {
        match self.locate(key) {
            Ok((hash, index)) => Ok(self.slot_or_default(key, hash, index)),
            Err(key_group) => Err(self.foreign_key(key_group)),
        }
    }

    /// [`Self::try_get_or_default`] for a caller that already has the key's
    /// [`key_hash`] (a keyed operator that hashed a whole batch in one
    /// pass): the key is not hashed again. `hash` must be `key_hash(key)`;
    /// a wrong hash finds no state and creates a stray entry under it, so
    /// debug builds assert it.
    #[inline]
    pub fn try_get_or_default_hashed(&mut self, key: &K, hash: u64) -> Result<&mut S, KeyedError> {
        debug_assert_eq!(hash, key_hash(key), "the hash given is not the key's");
        match self.locate_hash(hash) {
            Ok(index) => Ok(self.slot_or_default(key, hash, index)),
            Err(key_group) => Err(self.foreign_key(key_group)),
        }
    }

    /// The state of `key`, created with `S::default()` if it has none, for
    /// a caller that routed the key here by its key group with this
    /// state's [`key_hash`] and max parallelism: the job's keyed operator,
    /// fed by a hash partitioner. `hash` must be `key_hash(key)`.
    ///
    /// Unlike [`Self::try_get_or_default_hashed`], it does not refuse a
    /// key of a foreign key group: ownership is asserted in debug builds
    /// only, because such a key here is a routing bug, and in a release
    /// build [`Self::snapshot`] catches it. It marks exactly the key's
    /// slice dirty, from the hash it is given (a multiply, a shift and one
    /// byte store; a foreign group's index is out of range and marks
    /// nothing, so the bug costs no panic here), which is what an
    /// incremental checkpoint reads through [`Self::dirty_slots`].
    #[inline]
    pub fn get_or_default_routed(&mut self, key: &K, hash: u64) -> &mut S {
        debug_assert_eq!(hash, key_hash(key), "the hash given is not the key's");
        debug_assert!(
            self.locate_hash(hash).is_ok(),
            "bug: a key of key group {} was routed to the state of {:?}",
            self.max_parallelism.key_group_of(hash),
            self.range
        );
        let index = self.routed_index(hash);
        if let Some(dirty) = self.dirty.get_mut(index) {
            *dirty = true;
        }
        self.find_or_insert_default(key, hash)
    }

    #[inline(always)]
    fn slot_or_default(&mut self, key: &K, hash: u64, index: usize) -> &mut S {
        self.dirty[index] = true;
        self.find_or_insert_default(key, hash)
    }

    /// The state of `key` (with hash `hash`) in the table, inserted as
    /// `S::default()` when absent. Marks nothing dirty.
    //
    // `find_entry` then, on a miss only, `insert_unique`: `HashTable::entry`
    // checks spare capacity and tracks an insert slot on every lookup, which
    // measured about 5-10% slower on the count benchmark.
    #[inline(always)]
    fn find_or_insert_default(&mut self, key: &K, hash: u64) -> &mut S {
        match self.table.find_entry(hash, |(other, _)| other == key) {
            Ok(occupied) => &mut occupied.into_mut().1,
            Err(absent) => Self::insert_default(absent.into_table(), key, hash),
        }
    }

    #[cold]
    #[inline(never)]
    fn insert_default<'table>(
        table: &'table mut HashTable<(K, S)>,
        key: &K,
        hash: u64,
    ) -> &'table mut S {
        let entry = table.insert_unique(hash, (key.clone(), S::default()), |(k, _)| key_hash(k));
        &mut entry.into_mut().1
    }
}

impl<K: StateKey, S: Snapshot> KeyedState<K, S> {
    /// Encodes every owned key group as one part, empty groups included, so
    /// that a restore can tell a lost part from an empty group.
    ///
    /// Known gap: this is synchronous and full; see the module docs of
    /// [`super`].
    pub fn snapshot(&self) -> Result<KeyedSnapshot, StateError> {
        let schema = part::schema_section::<S>()?;
        let mut writers: Vec<PartWriter> = self
            .range
            .iter()
            .map(|_| PartWriter::new(&schema))
            .collect();
        // One pass over the table in memory order, appending each entry to
        // its key group's part: one sequential write stream per key group. Gathering the
        // entries per group first and then encoding them read the table in
        // random order and was several times slower for 1 M keys.
        for (key, state) in self.table.iter() {
            // Every stored key is owned: the ways in check it (`locate`
            // and restore always, `get_or_default_routed` in debug builds,
            // trusting the partitioner), so a foreign key is a bug.
            let key_group = self.key_group_of(key);
            let index = key_group.wrapping_sub(self.range.start) as usize;
            let Some(writer) = writers.get_mut(index) else {
                panic!(
                    "bug: a key of key group {key_group} is stored in the state of {:?}: \
                     a record was routed to the wrong subtask",
                    self.range
                );
            };
            writer.push(key, state)?;
        }
        let parts = self
            .range
            .iter()
            .zip(writers)
            .map(|(key_group, writer)| KeyGroupPart {
                key_group,
                bytes: writer.finish(self.max_parallelism, key_group),
            })
            .collect();
        Ok(KeyedSnapshot {
            max_parallelism: self.max_parallelism,
            range: self.range,
            parts,
        })
    }

    /// Encodes the owned key groups that `include` picks (by key group) as
    /// parts, in ascending key group order, in one pass over the table:
    /// what an incremental checkpoint writes for the groups that changed.
    /// Nothing is encoded, and the table is not read, when it picks none.
    pub fn snapshot_key_groups(
        &self,
        mut include: impl FnMut(u32) -> bool,
    ) -> Result<Vec<KeyGroupPart>, StateError> {
        let schema = part::schema_section::<S>()?;
        let mut writers: Vec<Option<PartWriter>> = self
            .range
            .iter()
            .map(|key_group| include(key_group).then(|| PartWriter::new(&schema)))
            .collect();
        if writers.iter().all(Option::is_none) {
            return Ok(Vec::new());
        }
        for (key, state) in self.table.iter() {
            let key_group = self.key_group_of(key);
            let index = key_group.wrapping_sub(self.range.start) as usize;
            match writers.get_mut(index) {
                Some(Some(writer)) => writer.push(key, state)?,
                Some(None) => {}
                None => panic!(
                    "bug: a key of key group {key_group} is stored in the state of {:?}: \
                     a record was routed to the wrong subtask",
                    self.range
                ),
            }
        }
        Ok(self
            .range
            .iter()
            .zip(writers)
            .filter_map(|(key_group, writer)| {
                writer.map(|writer| KeyGroupPart {
                    key_group,
                    bytes: writer.finish(self.max_parallelism, key_group),
                })
            })
            .collect())
    }

    /// Encodes one owned key group as a part. It scans the whole table, so
    /// it suits writing a few dirty groups, not all of them one by one.
    pub fn snapshot_key_group(&self, key_group: u32) -> Result<Vec<u8>, KeyedError> {
        if !self.range.contains(key_group) {
            return Err(KeyedError::ForeignKeyGroup {
                key_group,
                range: self.range,
            });
        }
        let state_error = |source| KeyedError::State { key_group, source };
        let schema = part::schema_section::<S>().map_err(state_error)?;
        let mut writer = PartWriter::new(&schema);
        for (key, state) in self.table.iter() {
            if self.key_group_of(key) == key_group {
                writer.push(key, state).map_err(state_error)?;
            }
        }
        Ok(writer.finish(self.max_parallelism, key_group))
    }

    /// The fresh slices of every owned key group, ascending by key group
    /// (also the groups that write none), encoded now, in the form the
    /// copy-on-write hand-off gives ([`EncodedSlices`], by the same
    /// encoding): the slots `writes` picks (see [`Self::slot_of`]) written
    /// again, each slice's entries contiguous and the slices ascending,
    /// and per group the entry count of the others. What an incremental
    /// checkpoint of the flat layout writes; dirty flags are left as they
    /// are.
    ///
    /// It hashes every key once to find its slot (the others' entry counts
    /// need it too), so it takes time in the state's size, a few
    /// milliseconds at the copy-on-write threshold; see "Dirty slices" in
    /// the module docs.
    ///
    /// # Errors
    ///
    /// A state type without a schema, or a key or state that does not
    /// encode.
    pub(crate) fn encode_slices(
        &self,
        writes: impl FnMut(usize) -> bool,
    ) -> Result<Vec<EncodedSlices>, StateError> {
        let schema = part::schema_section::<S>()?;
        let fresh: Vec<bool> = (0..self.dirty.len()).map(writes).collect();
        let order = SlotOrder::of(self, &fresh);
        let mut groups = Vec::with_capacity(self.range.len());
        for (index, key_group) in self.range.iter().enumerate() {
            let slots = index * SLICES_PER_KEY_GROUP..(index + 1) * SLICES_PER_KEY_GROUP;
            let reused_entries = slots
                .clone()
                .filter(|slot| !fresh[*slot])
                .map(|slot| order.counts[slot])
                .sum();
            let written = slots.filter(|slot| fresh[*slot]).map(|slot| {
                let entries = order
                    .entries_of(slot)
                    .iter()
                    .map(|(key, state)| (key, state));
                ((slot % SLICES_PER_KEY_GROUP) as u32, entries)
            });
            groups.push(encode_group_slices(
                key_group,
                written,
                reused_entries,
                &schema,
                self.max_parallelism,
            )?);
        }
        Ok(groups)
    }

    /// Rebuilds the state of the key groups in `range` from their parts,
    /// which may have been written at any parallelism (with the same max
    /// parallelism). Exactly one part per key group of `range` is required;
    /// a part outside `range` is [`KeyedError::ForeignKeyGroup`] (filter
    /// with [`parts_in_range`] first when feeding all parts of a snapshot).
    ///
    /// The restored state starts with every key group clean.
    pub fn restore<B: AsRef<[u8]>>(
        max_parallelism: MaxParallelism,
        range: KeyGroupRange,
        parts: impl IntoIterator<Item = (u32, B)>,
    ) -> Result<Self, KeyedError> {
        let mut state = Self::new(max_parallelism, range)?;
        let parts = parts_covering(range, parts)?;
        // Size the table once instead of growing it through every power of
        // two; the claim of each part is capped by its length (see
        // `part::plausible_entries`), so hostile headers cannot inflate it.
        let plausible: usize = parts
            .iter()
            .map(|(_, bytes)| part::plausible_entries(bytes.as_ref()))
            .sum();
        state.table.reserve(plausible, |(key, _)| key_hash(key));
        for (key_group, bytes) in &parts {
            part::decode_into(
                bytes.as_ref(),
                max_parallelism,
                *key_group,
                &mut state.table,
            )?;
        }
        Ok(state)
    }
}

/// The entries of a [`KeyedState`]'s table ordered by slot, for the
/// slices a snapshot writes, and every slot's entry count: one pass over
/// the table that hashes each key once, then a counting sort of
/// references to the written slots' entries (no entry copied; when few
/// slots are written, little is sorted).
struct SlotOrder<'a, K, S> {
    /// Per slot, its entries in the table (written or not).
    counts: Vec<u64>,
    /// Per slot, where its entries start in `ordered`, and one past the
    /// last slot; a slot not written has none.
    starts: Vec<usize>,
    /// The written slots' entries, slot by slot.
    ordered: Vec<&'a (K, S)>,
}

impl<'a, K: StateKey, S> SlotOrder<'a, K, S> {
    /// The entries of `state` in the slots `fresh` marks (one flag per
    /// slot), ordered by slot.
    ///
    /// # Panics
    ///
    /// On a key of a key group `state` does not own, which its ways in
    /// refuse (a routing bug, as in [`KeyedState::snapshot`]).
    fn of(state: &'a KeyedState<K, S>, fresh: &[bool]) -> Self {
        let mut counts = vec![0u64; fresh.len()];
        // Sized once for the entries the written slots are expected to
        // hold (keys spread evenly over slots), an eighth more for the
        // spread: at a full snapshot, growing by doubling instead copied
        // the list several times and touched fresh pages on the
        // operator's thread.
        let written = fresh.iter().filter(|fresh| **fresh).count();
        let expected = state.table.len() * written / fresh.len().max(1);
        let mut picked: Vec<(usize, &'a (K, S))> = Vec::with_capacity(expected + expected / 8);
        for entry in state.table.iter() {
            let slot = state.routed_index(key_hash(&entry.0));
            let Some(count) = counts.get_mut(slot) else {
                panic!(
                    "bug: a key of key group {} is stored in the state of {:?}: a record was \
                     routed to the wrong subtask",
                    state.key_group_of(&entry.0),
                    state.range
                );
            };
            *count += 1;
            if fresh[slot] {
                picked.push((slot, entry));
            }
        }
        let mut starts = Vec::with_capacity(fresh.len() + 1);
        let mut total = 0usize;
        for (count, fresh) in counts.iter().zip(fresh) {
            starts.push(total);
            if *fresh {
                total += *count as usize;
            }
        }
        starts.push(total);
        // Every place is filled below (`total` counts exactly the picked
        // entries), so any of them serves as the placeholder.
        let mut ordered = match picked.first() {
            Some((_, any)) => vec![*any; total],
            None => Vec::new(),
        };
        let mut next = starts.clone();
        for (slot, entry) in picked {
            ordered[next[slot]] = entry;
            next[slot] += 1;
        }
        SlotOrder {
            counts,
            starts,
            ordered,
        }
    }

    /// The entries of a written slot, in the table's order.
    fn entries_of(&self, slot: usize) -> &[&'a (K, S)] {
        &self.ordered[self.starts[slot]..self.starts[slot + 1]]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyed::test_support::Count;

    fn state(parallelism: u32, subtask: u32) -> KeyedState<u64, u64> {
        KeyedState::for_subtask(MaxParallelism::default(), parallelism, subtask).unwrap()
    }

    /// The lookup with a given hash finds and creates the same entries as
    /// the one that hashes the key itself.
    fn check(keys: &[u64]) {
        let (mut hashed, mut plain) = (state(1, 0), state(1, 0));
        let mut routed = state(1, 0);
        for key in keys {
            *hashed
                .try_get_or_default_hashed(key, key_hash(key))
                .unwrap() += 1;
            *plain.get_or_default(key) += 1;
            *routed.get_or_default_routed(key, key_hash(key)) += 1;
        }
        assert_eq!(hashed.len(), plain.len());
        assert_eq!(routed.len(), plain.len());
        for (key, count) in plain.iter() {
            assert_eq!(hashed.get(key), Some(count), "key {key}");
            assert_eq!(routed.get(key), Some(count), "key {key}");
        }
    }

    #[test]
    fn hashed_lookup_matches_the_plain_one() {
        check(&[]);
        check(&[7, 7, 7]);
        check(&(0..1000).map(|i| i % 37).collect::<Vec<_>>());
    }

    /// The sorted, deduplicated values of `items`.
    fn set<T: Ord>(items: impl IntoIterator<Item = T>) -> Vec<T> {
        let mut items: Vec<T> = items.into_iter().collect();
        items.sort_unstable();
        items.dedup();
        items
    }

    /// The first `count` keys `state` owns.
    fn owned<S>(state: &KeyedState<u64, S>, count: usize) -> Vec<u64> {
        (0..u64::MAX)
            .filter(|key| state.owns(key))
            .take(count)
            .collect()
    }

    #[test]
    fn a_routed_lookup_marks_only_its_slice_dirty_until_cleared() {
        let mut routed = state(2, 1);
        let keys = owned(&routed, 3);
        for key in &keys {
            *routed.get_or_default_routed(key, key_hash(key)) += 1;
        }
        let slots = set(keys.iter().map(|key| routed.slot_of(key).unwrap()));
        assert_eq!(routed.dirty_slots().collect::<Vec<_>>(), slots);
        // The groups are derived from the slots.
        let groups = set(keys.iter().map(|key| routed.key_group_of(key)));
        assert_eq!(routed.dirty_key_groups().collect::<Vec<_>>(), groups);
        let start = routed.range().start;
        let of_slots = set(slots
            .iter()
            .map(|slot| start + (slot / SLICES_PER_KEY_GROUP) as u32));
        assert_eq!(groups, of_slots);
        assert!(groups.len() < routed.range().len());
        routed.clear_dirty();
        assert_eq!(routed.dirty_slots().count(), 0);
        assert_eq!(routed.dirty_key_groups().count(), 0);
    }

    #[test]
    fn every_way_of_writing_marks_the_keys_slice_and_reading_marks_none() {
        let mut state = state(3, 2);
        let keys = owned(&state, 6);
        *state.get_or_default(&keys[0]) += 1;
        *state.try_get_or_default(&keys[1]).unwrap() += 1;
        *state
            .try_get_or_default_hashed(&keys[2], key_hash(&keys[2]))
            .unwrap() += 1;
        state.insert(keys[3], 4).unwrap();
        state.insert(keys[4], 5).unwrap();
        state.clear_dirty();
        // A read, and the removal of an absent key, mark nothing.
        assert_eq!(state.get(&keys[0]), Some(&1));
        assert!(state.remove(&keys[5]).is_none());
        assert_eq!(state.dirty_slots().count(), 0);
        for (index, key) in keys[..5].iter().enumerate() {
            match index {
                0 => *state.get_mut(key).unwrap() += 1,
                1 => *state.get_or_default(key) += 1,
                2 => assert!(state.remove(key).is_some()),
                _ => assert!(state.insert(*key, 9).unwrap().is_some()),
            }
            let slot = state.slot_of(key).unwrap();
            assert_eq!(
                state.dirty_slots().collect::<Vec<_>>(),
                vec![slot],
                "write {index}"
            );
            state.clear_dirty();
        }
        let _ = state.iter_mut().count();
        assert_eq!(
            state.dirty_slots().count(),
            state.range().len() * SLICES_PER_KEY_GROUP
        );
    }

    /// A flat state of `keys` keys (of subtask 1 of 2), each counting its
    /// own number.
    fn counted(keys: u64) -> KeyedState<u64, Count> {
        let mut state: KeyedState<u64, Count> =
            KeyedState::for_subtask(MaxParallelism::default(), 2, 1).unwrap();
        for key in owned(&state, keys as usize) {
            state.get_or_default(&key).count = key;
        }
        state
    }

    /// The entries of `slot` (a slice's bytes, without the header's room
    /// and, for slice 0, the schema) in `groups`.
    fn slice_bytes(groups: &[EncodedSlices], slot: usize) -> Option<Vec<u8>> {
        let group = &groups[slot / SLICES_PER_KEY_GROUP];
        let slice = (slot % SLICES_PER_KEY_GROUP) as u32;
        let mut start = part::PART_HEADER_LEN;
        for (fresh, end, _) in &group.slices {
            if *fresh == slice {
                let skip = if slice == 0 {
                    group.schema_len as usize
                } else {
                    0
                };
                return Some(group.bytes[start + skip..*end].to_vec());
            }
            start = *end;
        }
        None
    }

    #[test]
    fn the_written_slices_hold_exactly_their_keys_each_contiguous_and_ascending() {
        let state = counted(20_000);
        let range = state.range();
        let slots = range.len() * SLICES_PER_KEY_GROUP;
        let mut per_slot = vec![0u64; slots];
        for (key, _) in state.iter() {
            per_slot[state.slot_of(key).unwrap()] += 1;
        }
        // Every slice: the parts restore to the state, and each slice
        // lists exactly its keys.
        let all = state.encode_slices(|_| true).unwrap();
        assert_eq!(all.len(), range.len());
        let restored: KeyedState<u64, Count> = KeyedState::restore(
            state.max_parallelism(),
            range,
            all.iter().map(|group| (group.key_group, group.to_part())),
        )
        .unwrap();
        assert_eq!(restored.len(), state.len());
        for (key, count) in state.iter() {
            assert_eq!(restored.get(key), Some(count));
        }
        for (index, group) in all.iter().enumerate() {
            assert_eq!(group.key_group, range.start + index as u32);
            assert_eq!(group.reused_entries, 0);
            let listed: Vec<u32> = group.slices.iter().map(|(slice, ..)| *slice).collect();
            assert_eq!(listed, (0..SLICES_PER_KEY_GROUP as u32).collect::<Vec<_>>());
            for (slice, _, entries) in &group.slices {
                assert_eq!(
                    *entries,
                    per_slot[index * SLICES_PER_KEY_GROUP + *slice as usize]
                );
            }
        }
        // Some slots alone: the same bytes as in the whole encoding (so a
        // slice's entries are one contiguous run), and the others counted
        // as reused.
        let picked: Vec<usize> = (0..slots).step_by(37).collect();
        let some = state.encode_slices(|slot| picked.contains(&slot)).unwrap();
        for slot in 0..slots {
            let alone = slice_bytes(&some, slot);
            assert_eq!(alone.is_some(), picked.contains(&slot), "slot {slot}");
            if let Some(alone) = alone {
                assert_eq!(Some(alone), slice_bytes(&all, slot), "slot {slot}");
            }
        }
        for (index, group) in some.iter().enumerate() {
            let group_slots = index * SLICES_PER_KEY_GROUP..(index + 1) * SLICES_PER_KEY_GROUP;
            let reused: u64 = group_slots
                .filter(|slot| !picked.contains(slot))
                .map(|slot| per_slot[slot])
                .sum();
            assert_eq!(group.reused_entries, reused);
        }
        // None: header room only, every entry reused.
        let none = state.encode_slices(|_| false).unwrap();
        assert!(none
            .iter()
            .all(|group| group.slices.is_empty() && group.bytes.len() == part::PART_HEADER_LEN));
        let reused: u64 = none.iter().map(|group| group.reused_entries).sum();
        assert_eq!(reused, state.len() as u64);
    }

    #[test]
    fn snapshotting_some_key_groups_gives_the_same_parts_as_a_full_snapshot() {
        let mut full: KeyedState<u64, Count> =
            KeyedState::for_subtask(MaxParallelism::default(), 2, 1).unwrap();
        let keys: Vec<u64> = (0..5_000u64).filter(|key| full.owns(key)).collect();
        for key in keys {
            full.get_or_default(&key).count += key;
        }
        let snapshot = full.snapshot().unwrap();
        let picked = full
            .snapshot_key_groups(|key_group| key_group % 3 == 0)
            .unwrap();
        let expected: Vec<&KeyGroupPart> = snapshot
            .parts
            .iter()
            .filter(|part| part.key_group % 3 == 0)
            .collect();
        assert_eq!(picked.iter().collect::<Vec<_>>(), expected);
        assert!(full.snapshot_key_groups(|_| false).unwrap().is_empty());
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "was routed to the state of")]
    fn a_routed_lookup_asserts_ownership_in_debug_builds() {
        let mut first_half = state(2, 0);
        let foreign = (0..u64::MAX).find(|key| !first_half.owns(key)).unwrap();
        first_half.get_or_default_routed(&foreign, key_hash(&foreign));
    }

    #[test]
    fn hashed_lookup_refuses_a_foreign_key() {
        let mut first_half = state(2, 0);
        let foreign = (0..u64::MAX).find(|key| !first_half.owns(key)).unwrap();
        let result = first_half.try_get_or_default_hashed(&foreign, key_hash(&foreign));
        assert!(matches!(result, Err(KeyedError::ForeignKey { .. })));
    }
}
