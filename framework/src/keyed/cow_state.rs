//! [`CowKeyedState`]: the per-key state of one subtask in one hash table
//! per key group, each copy-on-write ([`super::cow`]), so that a snapshot
//! takes the key groups it writes in constant time per group and the
//! checkpoint writer encodes them off the operator's thread.
//!
//! This module owns that layout, its lookups, the hand-off and the
//! conversion from the flat [`KeyedState`] ([`CowKeyedState::from_flat`]).
//! It never decides when to convert (the keyed store does, see
//! `store.rs`), never routes records and never does I/O.
//!
//! # Why a second layout, and when it is used
//!
//! A lookup here loads the group's table header before it can probe: one
//! dependent load more than the flat table, whose header sits at a fixed
//! place. While the state is small (it fits in cache) that load is a
//! large share of a lookup and measured 5-10 % of the keyed count's
//! throughput and enough of the window count's to miss its target
//! (issue 16's two reverted attempts); but then the flat table's
//! synchronous snapshot is cheap too (about 1-6 ms at 50 k keys per
//! subtask). Once the state is large, each lookup misses cache anyway and
//! the extra load is a small share, while a synchronous snapshot would
//! take time proportional to the whole state. So the keyed store starts
//! flat and converts to this layout at a threshold of keys
//! (`JobConfig::copy_on_write_threshold_keys`).
//!
//! [`CowKeyedState::get_or_default_routed`] derives the key group with
//! `KeyGroupOf` (a shift at a power-of-two max parallelism), which takes
//! a dependent multiply off the lookup's chain.
//!
//! # Slices
//!
//! Each key group's table is split into [`SLICES_PER_KEY_GROUP`] slices,
//! each its own copy-on-write table with its own dirty flag, so that an
//! incremental checkpoint writes again only the slices written since the
//! last one (bytes proportional to the keys touched, not to the groups
//! they fall in). The slice is the six bits of the mixed hash right below
//! the key group's (`KeyGroupOf::key_group_slice_of`), so one shift finds
//! the slot (`group * 64 + slice`) and a lookup still indexes one array
//! once. A key group's part lists its entries slice by slice, with the
//! schema section as the start of slice 0's bytes, so each slice is one
//! contiguous byte range of the part's body and a part assembled from
//! fresh and earlier slices is byte for byte a full part
//! (`job::incremental`). The flat layout ([`KeyedState`]) flags the same
//! slots and writes its incremental checkpoints in the same units,
//! encoded on the operator's thread, so [`CowKeyedState::from_flat`]
//! carries the flags over slot by slot and the checkpoints' ledger stays
//! valid across the switch.
//!
//! Why 64: 8 hot keys then dirty at most 8 slices of 8,192 (0.1 % of the
//! state) at the default 128 key groups, while the slots take 64 × about
//! 48 bytes per key group (3 KiB, under 200 KiB for a subtask's 64
//! groups, which holds at least 65,536 keys when this layout is used);
//! the ledger's record is 32 bytes per slice (and one more per group, for
//! its part's header). More slices would shrink the written bytes
//! further only when a handful of keys changes, and add per-checkpoint
//! work (a plan and a CRC combine per slice). Known gap: 64 was chosen
//! so, not by a sweep; only 64 was measured (BENCHMARKS.md at 07a44e5).

use super::backend::{parts_covering, KeyGroupPart, KeyedState};
#[cfg(feature = "spill")]
use super::cow::{EncodeScope, EncodeTable, FrozenSlices};
use super::cow::{
    GroupCells, GroupSlices, GroupTable, HandedGroup, KeyGroupHandoff, SliceHandoff, TakeBacks,
};
use super::hash::key_hash;
use super::key_group::{
    KeyGroupError, KeyGroupOf, KeyGroupRange, MaxParallelism, SLICES_PER_KEY_GROUP, SLICE_BITS,
};
use super::part;
use super::slice_table::SliceTable;
use super::{KeyedError, StateKey};
use crate::state::{Snapshot, StateError};
use hashbrown::hash_table::Entry;

/// The per-key state of one subtask of a keyed operator: a value `S` per
/// key `K`, for the keys whose key group is in this subtask's range.
#[derive(Debug)]
pub struct CowKeyedState<K, S> {
    max_parallelism: MaxParallelism,
    /// `max_parallelism`'s key-group formula with its scaling chosen once:
    /// the group picks the table, so it is on every lookup's critical path.
    key_group_of: KeyGroupOf,
    range: KeyGroupRange,
    /// `range.start << SLICE_BITS`: the slot number of the first slot.
    first_slot: u32,
    /// One slot per slice of each owned key group, in order
    /// (`group * SLICES_PER_KEY_GROUP + slice`): its copy-on-write table
    /// (so that a snapshot can take slices away in constant time, see
    /// [`super::cow`]) and its dirty flag, side by side so that a lookup
    /// touches one cache line for both.
    groups: Vec<Slot<K, S>>,
    /// Slice tables copied because a snapshot still held them when the
    /// state wrote them, and frozen slices encoded at their first write
    /// for a snapshot that had not read them yet.
    take_backs: TakeBacks,
}

/// One slice of a key group of a [`CowKeyedState`].
#[derive(Debug)]
struct Slot<K, S> {
    table: GroupTable<K, S>,
    /// Whether the slice may have changed since [`CowKeyedState::clear_dirty`].
    /// Set on every mutable access, so it over-approximates: reading
    /// through `get_or_default` without writing still marks the group.
    dirty: bool,
}

/// A routed key of a key group this state does not own: a routing bug.
#[cold]
#[inline(never)]
fn misrouted_panic(max_parallelism: MaxParallelism, range: KeyGroupRange, hash: u64) -> ! {
    panic!(
        "bug: a key of key group {} was routed to the state of {:?}: a record was routed to \
         the wrong subtask",
        max_parallelism.key_group_of(hash),
        range
    )
}

impl<K: StateKey, S> CowKeyedState<K, S> {
    /// Empty state owning the key groups in `range`.
    pub fn new(
        max_parallelism: MaxParallelism,
        range: KeyGroupRange,
    ) -> Result<Self, KeyGroupError> {
        max_parallelism.check_range(range)?;
        Ok(CowKeyedState {
            max_parallelism,
            key_group_of: KeyGroupOf::new(max_parallelism),
            range,
            first_slot: range.start << SLICE_BITS,
            groups: (0..range.len() * SLICES_PER_KEY_GROUP)
                .map(|_| Slot {
                    table: GroupTable::default(),
                    dirty: false,
                })
                .collect(),
            take_backs: TakeBacks::default(),
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

    /// The state of `flat`, moved into one table per key group, with its
    /// dirty flags: what the keyed store does once a subtask holds enough
    /// keys. Every key is hashed again once, to find its group; no key or
    /// state is cloned.
    ///
    /// # Panics
    ///
    /// If `flat` holds a key of a key group it does not own, which its
    /// ways in refuse (a routing bug, as in [`KeyedState::snapshot`]).
    pub fn from_flat(flat: KeyedState<K, S>) -> Self {
        let (max_parallelism, range) = (flat.max_parallelism(), flat.range());
        let mut state = Self::new(max_parallelism, range)
            .unwrap_or_else(|error| panic!("bug: a keyed state's own range is invalid: {error}"));
        // Both layouts flag the same slots, so the slices an incremental
        // checkpoint writes next are the same as if the state had not
        // moved, and the ledger's references stay valid.
        let (table, dirty) = flat.into_table();
        assert_eq!(
            dirty.len(),
            state.groups.len(),
            "bug: the flat state flags other slots than the copy-on-write one"
        );
        for (slot, dirty) in state.groups.iter_mut().zip(dirty) {
            slot.dirty = dirty;
        }
        for (key, value) in table {
            let hash = key_hash(&key);
            let index = state.routed_index(hash);
            let Some(slot) = state.groups.get_mut(index) else {
                misrouted_panic(max_parallelism, range, hash)
            };
            slot.table.get_mut(&mut state.take_backs).insert_unique(
                hash,
                (key, value),
                |(k, _)| key_hash(k),
            );
        }
        state
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

    /// The hash of `key` and its slice's index in `groups`, or the key
    /// group of a key this state does not own. The error is a bare `u32` so
    /// that the hot path carries no large error value.
    #[inline]
    fn locate(&self, key: &K) -> Result<(u64, usize), u32> {
        let hash = key_hash(key);
        self.locate_hash(hash).map(|index| (hash, index))
    }

    /// The index in `groups` of the slice of a key with hash `hash`, or
    /// its key group when this state does not own it.
    #[inline]
    fn locate_hash(&self, hash: u64) -> Result<usize, u32> {
        self.key_group_of
            .locate_slot(hash, self.first_slot, self.groups.len())
    }

    /// The index of the slot of a routed key's slice (see
    /// [`Self::get_or_default_routed`]): computed ahead, for a whole batch
    /// before its records, it takes the key-group arithmetic off each
    /// lookup's chain of dependent loads. The index of a foreign group
    /// is out of bounds and panics when used.
    #[inline(always)]
    pub(crate) fn routed_index(&self, hash: u64) -> usize {
        self.key_group_of.slot_index(hash, self.first_slot)
    }

    /// The slot (`group index * SLICES_PER_KEY_GROUP + slice`, from 0 at
    /// the range's first group) of `key`, or `None` for a key of a group
    /// this state does not own. For tests and tools: what
    /// [`Self::dirty_slots`] names.
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

    /// Whether the group at `index` holds `key`, read without taking a
    /// shared group back: an update of a key that is not there must not
    /// copy its group.
    fn holds(&self, index: usize, hash: u64, key: &K) -> bool {
        self.groups[index]
            .table
            .get()
            .find(hash, |(other, _)| other == key)
            .is_some()
    }

    /// The state of `key`, if it has one here.
    pub fn get(&self, key: &K) -> Option<&S> {
        let (hash, index) = self.locate(key).ok()?;
        self.groups[index]
            .table
            .get()
            .find(hash, |(other, _)| other == key)
            .map(|(_, state)| state)
    }

    /// The state of `key` for update, if it has one here.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut S> {
        let (hash, index) = self.locate(key).ok()?;
        if !self.holds(index, hash, key) {
            return None;
        }
        self.groups[index].dirty = true;
        self.groups[index]
            .table
            .get_mut(&mut self.take_backs)
            .find_mut(hash, |(other, _)| other == key)
            .map(|(_, state)| state)
    }

    /// Sets the state of `key`, returning the previous one. Fails for a key
    /// this subtask does not own.
    pub fn insert(&mut self, key: K, state: S) -> Result<Option<S>, KeyedError> {
        let (hash, index) = self
            .locate(&key)
            .map_err(|key_group| self.foreign_key(key_group))?;
        self.groups[index].dirty = true;
        let entry = self.groups[index]
            .table
            .get_mut(&mut self.take_backs)
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
        if !self.holds(index, hash, key) {
            return None;
        }
        let entry = self.groups[index]
            .table
            .get_mut(&mut self.take_backs)
            .find_entry(hash, |(other, _)| other == key)
            .ok()?;
        let ((_, state), _) = entry.remove();
        self.groups[index].dirty = true;
        Some(state)
    }

    /// The number of keys with state.
    pub fn len(&self) -> usize {
        self.groups.iter().map(|slot| slot.table.get().len()).sum()
    }

    /// Whether no key has state.
    pub fn is_empty(&self) -> bool {
        self.groups.iter().all(|slot| slot.table.get().is_empty())
    }

    /// Every key and its state, in unspecified order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &S)> + '_ {
        self.groups
            .iter()
            .flat_map(|slot| slot.table.get().iter().map(|(key, state)| (key, state)))
    }

    /// Every key and its state for update. Marks every key group dirty
    /// (and so takes back, copying if need be, every group a snapshot
    /// still holds).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut S)> + '_ {
        let take_backs = &mut self.take_backs;
        self.groups
            .iter_mut()
            .map(|slot| {
                slot.dirty = true;
                slot.table.get_mut(take_backs)
            })
            .collect::<Vec<_>>()
            .into_iter()
            .flat_map(|table| table.iter_mut().map(|(key, state)| (&*key, state)))
    }

    /// How many slice tables were copied so far because a snapshot still
    /// held them when this state wrote them: the extra memory of
    /// asynchronous snapshots (see [`super::cow`]). Each is one slice of a
    /// key group ([`SLICES_PER_KEY_GROUP`] per group).
    pub fn copied_key_groups(&self) -> u64 {
        self.take_backs.copies
    }

    /// How many frozen slices of incremental snapshots this state encoded
    /// at its first write to them, because a snapshot had not read them
    /// yet (instead of copying them, see [`super::cow`]'s `FrozenSlot`).
    pub fn encoded_at_write(&self) -> u64 {
        self.take_backs.encodings
    }

    /// How many slice tables are still shared with a snapshot they were
    /// handed to (not written since).
    pub fn shared_key_groups(&self) -> usize {
        self.groups
            .iter()
            .filter(|slot| slot.table.is_shared())
            .count()
    }

    /// The slots whose tables are still shared with a snapshot, for tests.
    #[cfg(test)]
    pub(crate) fn shared_slots(&self) -> std::collections::BTreeSet<usize> {
        (0..self.groups.len())
            .filter(|index| self.groups[*index].table.is_shared())
            .collect()
    }

    /// The key groups accessed mutably since the last [`Self::clear_dirty`]
    /// (or since creation), ascending: what an incremental checkpoint
    /// writes again ([`Self::snapshot_key_groups`]).
    pub fn dirty_key_groups(&self) -> impl Iterator<Item = u32> + '_ {
        let start = self.range.start;
        self.groups
            .chunks(SLICES_PER_KEY_GROUP)
            .enumerate()
            .filter(|(_, slots)| slots.iter().any(|slot| slot.dirty))
            .map(move |(index, _)| start + index as u32)
    }

    /// The slots (see [`Self::slot_of`]) accessed mutably since the last
    /// [`Self::clear_dirty`], ascending: the slices an incremental
    /// checkpoint writes again.
    pub fn dirty_slots(&self) -> impl Iterator<Item = usize> + '_ {
        self.groups
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.dirty)
            .map(|(index, _)| index)
    }

    /// Marks every key group clean, after a checkpoint has captured them.
    pub fn clear_dirty(&mut self) {
        self.groups.iter_mut().for_each(|slot| slot.dirty = false);
    }

    /// Whether `key` (with [`key_hash`] `hash`, of an owned key group) has
    /// state here, without marking anything dirty or taking a shared
    /// slice back: the spilling backend asks before it looks on disk.
    #[cfg(feature = "spill")]
    #[inline]
    pub(crate) fn contains_hashed(&self, key: &K, hash: u64) -> bool {
        self.groups
            .get(self.routed_index(hash))
            .is_some_and(|slot| {
                slot.table
                    .get()
                    .find(hash, |(other, _)| other == key)
                    .is_some()
            })
    }

    /// The entries of the owned key group `key_group` (none for another),
    /// in memory order.
    #[cfg(feature = "spill")]
    pub(crate) fn iter_key_group(&self, key_group: u32) -> impl Iterator<Item = (&K, &S)> + '_ {
        let slots = if self.range.contains(key_group) {
            let first = (key_group - self.range.start) as usize * SLICES_PER_KEY_GROUP;
            &self.groups[first..first + SLICES_PER_KEY_GROUP]
        } else {
            &self.groups[..0]
        };
        slots
            .iter()
            .flat_map(|slot| slot.table.get().iter().map(|(key, state)| (key, state)))
    }

    /// Takes up to `count` entries for which `evict` says yes out of the
    /// slices from slot `from` on (wrapping around, at most one lap), in
    /// memory order, without marking anything dirty: the spilling backend
    /// moves them to disk, so the logical state does not change. `evict`
    /// may change an entry it keeps (the spilling backend's eviction
    /// clears a reference bit beside the state, `keyed/spill/evict.rs`),
    /// which is no change of the logical state either; it is called on
    /// the entries visited until `count` were taken, so its caller bounds
    /// the work by saying yes to everything past its own limit. A slice a
    /// snapshot still holds is copied first (the copy-on-write rule of
    /// [`super::cow`]), so the snapshot keeps its entries. Returns the
    /// entries and the slot to start from next time, so that successive
    /// evictions sweep the whole table rather than always emptying the
    /// first key groups.
    #[cfg(feature = "spill")]
    pub(crate) fn take_entries_from(
        &mut self,
        from: usize,
        count: usize,
        mut evict: impl FnMut(&mut (K, S)) -> bool,
    ) -> (Vec<(K, S)>, usize) {
        let slots = self.groups.len();
        let mut taken = Vec::with_capacity(count);
        let mut next = from % slots.max(1);
        for step in 0..slots {
            if taken.len() >= count {
                break;
            }
            let index = (from + step) % slots;
            next = (index + 1) % slots;
            let slot = &mut self.groups[index];
            if slot.table.get().is_empty() {
                continue;
            }
            let wanted = count - taken.len();
            // `extract_if` is lazy and keeps what it has not visited.
            taken.extend(
                slot.table
                    .get_mut(&mut self.take_backs)
                    .extract_if(&mut evict)
                    .take(wanted),
            );
            if taken.len() >= count && !slot.table.get().is_empty() {
                // Stopped inside this slice: start here next time.
                next = index;
            }
        }
        (taken, next)
    }
}

impl<K: StateKey, S: Default> CowKeyedState<K, S> {
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

    /// [`Self::routed_index`] of a key the caller routed here, whose
    /// ownership is asserted in debug builds only (a foreign key here is a
    /// routing bug; see [`Self::get_or_default_routed`]).
    #[inline(always)]
    fn owned_routed_index(&self, hash: u64) -> usize {
        debug_assert!(
            self.locate_hash(hash).is_ok(),
            "bug: a key of key group {} was routed to the state of {:?}",
            self.max_parallelism.key_group_of(hash),
            self.range
        );
        self.routed_index(hash)
    }

    /// Asks the CPU for the memory a lookup of the key with hash `hash`
    /// will touch (see [`super::slice_table`]) and returns the key's
    /// [`Self::routed_index`], for the lookup's
    /// [`Self::get_or_default_at`]; reads and changes nothing. A batch
    /// loop calls it a few records before it looks the key up.
    #[inline(always)]
    pub(crate) fn prefetch_routed(&self, hash: u64) -> usize {
        let index = self.owned_routed_index(hash);
        if let Some(slot) = self.groups.get(index) {
            super::slice_table::prefetch(slot.table.get(), hash);
        }
        index
    }

    /// The state of `key`, created with `S::default()` if it has none, for
    /// a caller that routed the key here by its key group with this
    /// state's [`key_hash`] and max parallelism: the job's keyed operator,
    /// fed by a hash partitioner. `hash` must be `key_hash(key)`.
    ///
    /// Unlike [`Self::try_get_or_default_hashed`], it does not refuse a
    /// key of a foreign key group: ownership is asserted in debug builds
    /// only, because such a key here is a routing bug, and in a release
    /// build the index of the key's group is still checked (a key of a
    /// foreign group has no table here) and panics. It marks exactly the
    /// key's group dirty, from the hash it is given (a multiply, a shift
    /// and one byte store), which is what an incremental checkpoint reads
    /// through [`Self::dirty_key_groups`].
    #[inline]
    pub fn get_or_default_routed(&mut self, key: &K, hash: u64) -> &mut S {
        debug_assert_eq!(hash, key_hash(key), "the hash given is not the key's");
        let index = self.owned_routed_index(hash);
        self.get_or_default_at(key, hash, index)
    }

    /// [`Self::get_or_default_routed`] with the key's
    /// [`Self::routed_index`] computed ahead: `hash` must be
    /// `key_hash(key)` and `index` its `routed_index` (debug builds
    /// assert both), or the key lands in another group's table.
    #[inline(always)]
    pub(crate) fn get_or_default_at(&mut self, key: &K, hash: u64, index: usize) -> &mut S {
        debug_assert_eq!(hash, key_hash(key), "the hash given is not the key's");
        debug_assert_eq!(
            index,
            self.routed_index(hash),
            "the index is not the hash's"
        );
        let Some(slot) = self.groups.get_mut(index) else {
            misrouted_panic(self.max_parallelism, self.range, hash)
        };
        slot.dirty = true;
        Self::find_or_insert_default(slot.table.get_mut(&mut self.take_backs), key, hash)
    }

    #[inline(always)]
    fn slot_or_default(&mut self, key: &K, hash: u64, index: usize) -> &mut S {
        self.groups[index].dirty = true;
        Self::find_or_insert_default(
            self.groups[index].table.get_mut(&mut self.take_backs),
            key,
            hash,
        )
    }

    /// The state of `key` (with hash `hash`) in `table`, inserted as
    /// `S::default()` when absent. Marks nothing dirty.
    //
    // `find_entry` then, on a miss only, `insert_unique`: `HashTable::entry`
    // checks spare capacity and tracks an insert slot on every lookup, which
    // measured about 5-10% slower on the count benchmark.
    #[inline(always)]
    fn find_or_insert_default<'table>(
        table: &'table mut SliceTable<K, S>,
        key: &K,
        hash: u64,
    ) -> &'table mut S {
        match table.find_entry(hash, |(other, _)| other == key) {
            Ok(occupied) => &mut occupied.into_mut().1,
            Err(absent) => Self::insert_default(absent.into_table(), key, hash),
        }
    }

    #[cold]
    #[inline(never)]
    fn insert_default<'table>(
        table: &'table mut SliceTable<K, S>,
        key: &K,
        hash: u64,
    ) -> &'table mut S {
        let entry = table.insert_unique(hash, (key.clone(), S::default()), |(k, _)| key_hash(k));
        &mut entry.into_mut().1
    }
}

impl<K: StateKey + Clone, S: Clone> CowKeyedState<K, S> {
    /// The slice tables of the owned key groups that `include` picks,
    /// ascending by key group, shared in constant time per slice (see
    /// [`Self::hand_off_key_groups`]).
    pub(crate) fn share_key_groups(
        &mut self,
        mut include: impl FnMut(u32) -> bool,
    ) -> Vec<(u32, GroupSlices<K, S>)> {
        self.range
            .iter()
            .zip(self.groups.chunks_mut(SLICES_PER_KEY_GROUP))
            .filter(|(key_group, _)| include(*key_group))
            .map(|(key_group, slots)| {
                let tables = slots.iter_mut().map(|slot| slot.table.share()).collect();
                (key_group, tables)
            })
            .collect()
    }
}

impl<K: StateKey + Clone, S: Clone> CowKeyedState<K, S> {
    /// The slices of the owned key groups that `scope` gives a scope,
    /// ascending by key group, frozen in constant time per slice: a write
    /// to one while a snapshot still holds it encodes it with `encode`
    /// as its scope says, and takes it back without a copy
    /// ([`GroupTable::freeze_with`]). The spilling backend's snapshot
    /// freezes its in-memory entries so.
    #[cfg(feature = "spill")]
    pub(crate) fn freeze_key_groups(
        &mut self,
        mut scope: impl FnMut(u32) -> Option<EncodeScope>,
        encode: EncodeTable<K, S>,
    ) -> Vec<(u32, FrozenSlices<K, S>)> {
        self.range
            .iter()
            .zip(self.groups.chunks_mut(SLICES_PER_KEY_GROUP))
            .filter_map(|(key_group, slots)| {
                let scope = scope(key_group)?;
                let mut cells = GroupCells::new(slots.len());
                let refs = slots
                    .iter_mut()
                    .enumerate()
                    .map(|(slice, slot)| slot.table.freeze_with(encode, scope, &mut cells, slice))
                    .collect();
                Some((key_group, refs))
            })
            .collect()
    }
}

impl<K: StateKey + Clone, S: Snapshot + Clone> CowKeyedState<K, S> {
    /// Hands the owned key groups that `include` picks to a snapshot, in
    /// ascending key group order, in time proportional to the number of
    /// key groups (no entry is read or copied): the synchronous part of an
    /// asynchronous snapshot. Encode the result later, on any thread, with
    /// [`KeyGroupHandoff::encode`]; what this state is given after the
    /// handoff never reaches it (see [`super::cow`] for the copy-on-write
    /// rule and its memory bound). Dirty flags are left as they are.
    pub fn hand_off_key_groups(
        &mut self,
        include: impl FnMut(u32) -> bool,
    ) -> KeyGroupHandoff<K, S> {
        KeyGroupHandoff::new(self.max_parallelism, self.share_key_groups(include))
    }

    /// Hands the slices that `writes` picks (by slot, see
    /// [`Self::slot_of`]) to an incremental snapshot, with, per key group,
    /// the entry count of the others: constant time per slice, no entry
    /// read or copied. Every key group of the range is in the result, in
    /// order, also those whose slices are all left out. Dirty flags are
    /// left as they are.
    pub(crate) fn hand_off_slices(
        &mut self,
        mut writes: impl FnMut(usize) -> bool,
    ) -> SliceHandoff<K, S> {
        let mut groups = Vec::with_capacity(self.range.len());
        for (index, (key_group, slots)) in self
            .range
            .iter()
            .zip(self.groups.chunks_mut(SLICES_PER_KEY_GROUP))
            .enumerate()
        {
            let mut group = HandedGroup {
                key_group,
                fresh: Vec::new(),
                reused_entries: 0,
            };
            let mut cells = GroupCells::new(slots.len());
            for (slice, slot) in slots.iter_mut().enumerate() {
                if writes(index * SLICES_PER_KEY_GROUP + slice) {
                    let frozen = slot.table.freeze(&mut cells, slice);
                    group.fresh.push((slice as u32, frozen));
                } else {
                    group.reused_entries += slot.table.get().len() as u64;
                }
            }
            groups.push(group);
        }
        SliceHandoff::new(self.max_parallelism, groups)
    }

    /// Hands every owned key group to a snapshot; see
    /// [`Self::hand_off_key_groups`].
    pub fn hand_off(&mut self) -> KeyGroupHandoff<K, S> {
        self.hand_off_key_groups(|_| true)
    }
}

impl<K: StateKey, S: Snapshot> CowKeyedState<K, S> {
    /// Encodes the owned key groups that `include` picks (by key group) as
    /// parts, in ascending key group order, reading only their tables.
    pub fn snapshot_key_groups(
        &self,
        mut include: impl FnMut(u32) -> bool,
    ) -> Result<Vec<KeyGroupPart>, StateError> {
        let schema = part::schema_section::<S>()?;
        let mut parts = Vec::new();
        for (key_group, slots) in self
            .range
            .iter()
            .zip(self.groups.chunks(SLICES_PER_KEY_GROUP))
        {
            if include(key_group) {
                let tables = slots.iter().map(|slot| slot.table.get());
                let bytes = part::encode_tables(tables, &schema, self.max_parallelism, key_group)?;
                parts.push(KeyGroupPart { key_group, bytes });
            }
        }
        Ok(parts)
    }

    /// Encodes one owned key group as a part.
    pub fn snapshot_key_group(&self, key_group: u32) -> Result<Vec<u8>, KeyedError> {
        if !self.range.contains(key_group) {
            return Err(KeyedError::ForeignKeyGroup {
                key_group,
                range: self.range,
            });
        }
        let state_error = |source| KeyedError::State { key_group, source };
        let mut parts = self
            .snapshot_key_groups(|picked| picked == key_group)
            .map_err(state_error)?;
        Ok(parts.pop().map(|part| part.bytes).unwrap_or_default())
    }

    /// Rebuilds the state of the key groups in `range` from their parts,
    /// which may have been written at any parallelism (with the same max
    /// parallelism). Exactly one part per key group of `range` is required;
    /// a part outside `range` is [`KeyedError::ForeignKeyGroup`] (filter
    /// with [`parts_in_range`](super::parts_in_range) first when feeding all parts of a snapshot).
    ///
    /// The restored state starts with every key group clean.
    pub fn restore<B: AsRef<[u8]>>(
        max_parallelism: MaxParallelism,
        range: KeyGroupRange,
        parts: impl IntoIterator<Item = (u32, B)>,
    ) -> Result<Self, KeyedError> {
        let mut state = Self::new(max_parallelism, range)?;
        let owned_parts = parts_covering(range, parts)?;
        let key_group_of = state.key_group_of;
        // Restored tables are owned: nothing is ever copied here.
        let mut take_backs = TakeBacks::default();
        for (key_group, bytes) in &owned_parts {
            let first = (key_group - range.start) as usize * SLICES_PER_KEY_GROUP;
            let slots = &mut state.groups[first..first + SLICES_PER_KEY_GROUP];
            // Each slice's table is sized once from the part's entry
            // count (capped by its length, so hostile headers cannot
            // inflate it), spread evenly over the slices.
            let per_slice = part::plausible_entries(bytes.as_ref()) / SLICES_PER_KEY_GROUP;
            for slot in slots.iter_mut() {
                slot.table
                    .get_mut(&mut take_backs)
                    .reserve(per_slice, |(key, _)| key_hash(key));
            }
            part::decode_entries(
                bytes.as_ref(),
                max_parallelism,
                *key_group,
                |hash, key, value, replaces| {
                    let slice =
                        key_group_of.key_group_slice_of(hash) as usize % SLICES_PER_KEY_GROUP;
                    let table = slots[slice].table.get_mut(&mut take_backs);
                    part::insert_entry(table, *key_group, hash, key, value, replaces)
                },
            )?;
        }
        Ok(state)
    }
}
