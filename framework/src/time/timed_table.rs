//! The keyed tables of the timed keyed core (`timers.rs`): the user's
//! per-key state and the timers, each in one of the in-memory backend's
//! two layouts, flat ([`KeyedState`]) or copy-on-write key groups
//! ([`CowKeyedState`]), and how each is taken at a checkpoint.
//!
//! This module owns that dispatch and the timed core's use of the
//! adaptive rule of `keyed::store` (start flat, move to copy-on-write for
//! good once the table holds `JobConfig::copy_on_write_threshold_keys`
//! keys, checked between batches; a restore picks the layout by the keys
//! its parts claim), so that a small window state keeps the flat table's
//! lookups and a large one snapshots in time proportional to its key
//! groups or to what changed. The layouts, the hand-offs and the ledger
//! are the keyed core's own (`keyed::cow_state`, `job::incremental`);
//! nothing here copies, encodes or plans by itself. It never fires
//! timers, never decides when to snapshot and never does I/O. The timed
//! core never spills: the spilling backend is for `process`, `reduce`
//! and `aggregate`.

use crate::job::{
    encode_keyed_state, full_segments, KeyGroupLedger, KeyedSnapshotParts, KeyedSnapshotSlices,
    SnapshotPlan,
};
use crate::keyed::store::{claimed_keys, take_into_cow, KeyGroupSnapshots};
use crate::keyed::{
    CowKeyedState, KeyGroupRange, KeyedError, KeyedState, MaxParallelism, StateKey,
};
use crate::protocol::CheckpointId;
use crate::runtime::BoxError;
use crate::state::Snapshot;
use crate::storage::Segment;

/// One keyed table of the timed core, in the layout its size chose.
#[derive(Debug)]
pub(crate) enum TimedTable<K, V> {
    /// Below the copy-on-write threshold: one hash table, the fastest
    /// lookups, a synchronous snapshot.
    Flat(KeyedState<K, V>),
    /// From the threshold on: per key-group slice tables, handed off to
    /// the checkpoint writer at a snapshot.
    CopyOnWrite(CowKeyedState<K, V>),
}

/// A key's state found by the hash the partitioner routed it by, in
/// either layout: what the timed core's per-record loop is generic over,
/// so that each layout gets its own loop without a call through a
/// pointer per record.
pub(crate) trait RoutedLookup<K, V> {
    /// The state of `key` (hashed to `hash`), inserted as the default
    /// when absent; marks its slice changed.
    fn get_or_default_routed(&mut self, key: &K, hash: u64) -> &mut V;
}

impl<K: StateKey, V: Snapshot + Default> RoutedLookup<K, V> for KeyedState<K, V> {
    #[inline(always)]
    fn get_or_default_routed(&mut self, key: &K, hash: u64) -> &mut V {
        KeyedState::get_or_default_routed(self, key, hash)
    }
}

impl<K: StateKey, V: Snapshot + Default> RoutedLookup<K, V> for CowKeyedState<K, V> {
    #[inline(always)]
    fn get_or_default_routed(&mut self, key: &K, hash: u64) -> &mut V {
        CowKeyedState::get_or_default_routed(self, key, hash)
    }
}

impl<K: StateKey, V: Snapshot + Default> TimedTable<K, V> {
    /// An empty table for `subtask` of `parallelism`: copy-on-write from
    /// the start when `copy_on_write_threshold_keys` is 0, flat otherwise.
    pub(crate) fn for_subtask(
        max_parallelism: MaxParallelism,
        (parallelism, subtask): (u32, u32),
        copy_on_write_threshold_keys: usize,
    ) -> Result<Self, KeyedError> {
        let range = max_parallelism.range_for_subtask(parallelism, subtask)?;
        Ok(if copy_on_write_threshold_keys == 0 {
            TimedTable::CopyOnWrite(CowKeyedState::new(max_parallelism, range)?)
        } else {
            TimedTable::Flat(KeyedState::new(max_parallelism, range)?)
        })
    }

    /// The key groups this table owns.
    pub(crate) fn range(&self) -> KeyGroupRange {
        match self {
            TimedTable::Flat(state) => state.range(),
            TimedTable::CopyOnWrite(state) => state.range(),
        }
    }

    fn max_parallelism(&self) -> MaxParallelism {
        match self {
            TimedTable::Flat(state) => state.max_parallelism(),
            TimedTable::CopyOnWrite(state) => state.max_parallelism(),
        }
    }

    /// The state of `key`, if it has one.
    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        match self {
            TimedTable::Flat(state) => state.get(key),
            TimedTable::CopyOnWrite(state) => state.get(key),
        }
    }

    /// The state of `key` to change, if it has one (taken back from a
    /// snapshot first in the copy-on-write layout).
    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        match self {
            TimedTable::Flat(state) => state.get_mut(key),
            TimedTable::CopyOnWrite(state) => state.get_mut(key),
        }
    }

    /// The state of `key`, inserted as the default when absent.
    pub(crate) fn get_or_default(&mut self, key: &K) -> &mut V {
        match self {
            TimedTable::Flat(state) => state.get_or_default(key),
            TimedTable::CopyOnWrite(state) => state.get_or_default(key),
        }
    }

    /// Removes `key`'s state.
    pub(crate) fn remove(&mut self, key: &K) {
        match self {
            TimedTable::Flat(state) => {
                state.remove(key);
            }
            TimedTable::CopyOnWrite(state) => {
                state.remove(key);
            }
        }
    }

    /// Calls `f` with every key and its state, in unspecified order.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&K, &V)) {
        match self {
            TimedTable::Flat(state) => state.iter().for_each(|(key, value)| f(key, value)),
            TimedTable::CopyOnWrite(state) => state.iter().for_each(|(key, value)| f(key, value)),
        }
    }

    /// Moves a flat table holding at least `copy_on_write_threshold_keys`
    /// keys to the copy-on-write layout (keeping every entry and every
    /// slice's changed flag, so the ledger's references stay valid).
    /// Called between batches: one comparison when nothing moves.
    #[inline]
    pub(crate) fn convert_if_large(&mut self, copy_on_write_threshold_keys: usize) {
        if let TimedTable::Flat(state) = self {
            if state.len() >= copy_on_write_threshold_keys {
                self.convert();
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn convert(&mut self) {
        if let TimedTable::Flat(state) = self {
            *self = TimedTable::CopyOnWrite(take_into_cow(state));
        }
    }

    /// Replaces the table with the key groups of its range found in
    /// `parts` (written by either layout, at any parallelism): in the
    /// copy-on-write layout when they claim at least
    /// `copy_on_write_threshold_keys` keys, flat otherwise.
    pub(crate) fn restore(
        &mut self,
        parts: Vec<(u32, Vec<u8>)>,
        copy_on_write_threshold_keys: usize,
    ) -> Result<(), BoxError> {
        let (max_parallelism, range) = (self.max_parallelism(), self.range());
        let parts: Vec<(u32, Vec<u8>)> = crate::keyed::parts_in_range(range, parts).collect();
        *self = if claimed_keys(&parts) >= copy_on_write_threshold_keys {
            TimedTable::CopyOnWrite(CowKeyedState::restore(max_parallelism, range, parts)?)
        } else {
            TimedTable::Flat(KeyedState::restore(max_parallelism, range, parts)?)
        };
        Ok(())
    }

    /// The whole table in the keyed-state envelope, encoded now (for
    /// snapshots that are not checkpoints).
    pub(crate) fn encode_now(&mut self) -> Result<Vec<u8>, BoxError> {
        let parts = match self {
            TimedTable::Flat(state) => state.all_parts()?,
            TimedTable::CopyOnWrite(state) => state.all_parts()?,
        };
        Ok(encode_keyed_state(&parts)?)
    }
}

impl<K, V> TimedTable<K, V>
where
    K: StateKey + Send + Sync,
    V: Snapshot + Default + Clone + Send + Sync + 'static,
{
    /// Takes the table for checkpoint `checkpoint`: with `ledger`
    /// (incremental), only the slices it plans to write, and their changed
    /// flags cleared; without (a savepoint, or incremental checkpoints
    /// off), the whole table, flags untouched (the next incremental
    /// checkpoint still writes what changed). The flat layout encodes
    /// here, on the operator's thread (it is small); the copy-on-write
    /// layout hands its tables off in constant time per slice or key
    /// group and leaves the encoding to the writer.
    pub(crate) fn take(
        &mut self,
        checkpoint: CheckpointId,
        ledger: Option<&mut KeyGroupLedger>,
    ) -> Result<TakenTable, BoxError> {
        Ok(match (self, ledger) {
            (TimedTable::Flat(state), None) => TakenTable::Ready(full_segments(state)?),
            (TimedTable::Flat(state), Some(ledger)) => {
                TakenTable::Slices(ledger.snapshot_flat(checkpoint, state)?)
            }
            (TimedTable::CopyOnWrite(state), Some(ledger)) => {
                TakenTable::Slices(ledger.hand_off_cow(checkpoint, state))
            }
            (TimedTable::CopyOnWrite(state), None) => {
                let handoff = state.hand_off_key_groups(|_| true);
                TakenTable::Parts(SnapshotPlan::full(state.range()).with_parts(Box::new(handoff)))
            }
        })
    }
}

/// One table as taken at a snapshot.
pub(crate) enum TakenTable {
    /// Encoded already: the flat layout's full snapshot.
    Ready(Vec<Segment>),
    /// An incremental snapshot in slices (encoded already by the flat
    /// layout, handed off by the copy-on-write one), assembled on the
    /// writer's thread.
    Slices(KeyedSnapshotSlices),
    /// The copy-on-write layout's full hand-off, encoded on the writer's
    /// thread.
    Parts(KeyedSnapshotParts),
}

impl TakenTable {
    /// Whether the table is encoded already.
    pub(crate) fn is_ready(&self) -> bool {
        matches!(self, TakenTable::Ready(_))
    }

    /// The table in the keyed-state envelope's segments, its shared bytes
    /// (if any) landing in the part's shared file from `shared_offset`.
    pub(crate) fn encode_at(self, shared_offset: u64) -> Result<Vec<Segment>, BoxError> {
        match self {
            TakenTable::Ready(segments) => Ok(segments),
            TakenTable::Slices(slices) => slices.encode_at(shared_offset),
            // A full hand-off writes own bytes only.
            TakenTable::Parts(parts) => parts.encode(),
        }
    }
}
