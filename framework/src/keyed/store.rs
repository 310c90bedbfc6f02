//! The choice of keyed-state backend ([`KeyedBackend`], set per job in
//! `JobConfig::keyed_backend`), the store a keyed operator holds
//! ([`KeyedStore`]: the in-memory [`KeyedState`], its copy-on-write form
//! [`CowKeyedState`] for large state, or, with cargo feature `spill`, the
//! spilling backend of [`super::spill`]), and what a checkpoint asks of
//! each ([`KeyGroupSnapshots`]).
//!
//! This module owns the dispatch between the backends: one `match` per
//! batch or per snapshot, never a call through a pointer per record, so the
//! in-memory hot path compiles to the same loop as before the choice
//! existed. It also owns the adaptive rule of the in-memory backend
//! ([`KeyedStore::convert_if_large`]): a subtask's state starts flat and
//! moves to the copy-on-write layout, once and for good (until a restore),
//! when it holds at least the job's threshold of keys
//! (`JobConfig::copy_on_write_threshold_keys`, default
//! [`DEFAULT_COPY_ON_WRITE_THRESHOLD_KEYS`]). Small state keeps the flat
//! table's faster lookups and snapshots synchronously in a few
//! milliseconds; large state, whose lookups miss cache anyway, pays one
//! dependent load more per lookup and snapshots in time proportional to
//! its key groups. It never decides when to snapshot and never does I/O.

use std::path::PathBuf;

use super::backend::{KeyGroupPart, KeyedState};
use super::cow_state::CowKeyedState;
use super::key_group::{KeyGroupRange, MaxParallelism};
use super::StateKey;
use crate::state::Snapshot;

/// The runtime's error box (`crate::runtime::BoxError`), named here so that
/// the keyed layer does not reach up into the runtime.
type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The default `JobConfig::copy_on_write_threshold_keys`: 65,536 keys per
/// subtask. Below it the flat table's synchronous snapshot takes a few
/// milliseconds (about 1-6 ms at 50 k keys, under issue 16's 10 ms) and
/// its lookups are the fastest; above it a synchronous snapshot grows with
/// the state (about 50 ms at 1 M keys) while the copy-on-write layout's
/// extra load per lookup costs little, the table being out of cache.
pub const DEFAULT_COPY_ON_WRITE_THRESHOLD_KEYS: usize = 65_536;

/// Where a job's keyed operators (`process`, `reduce`, `aggregate`) keep
/// their per-key state.
///
/// Both backends write exactly the same parts per key group, so a
/// checkpoint written with one restores into the other, at any
/// parallelism, and incremental checkpoints work the same.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyedBackend {
    /// Every key in one hash table per subtask (the default and the
    /// fastest).
    #[default]
    Memory,
    /// At most `memory_entries` keys per subtask in memory, the others on
    /// local disk in an embedded LSM store, for state larger than memory.
    /// Needs snapflow's cargo feature `spill`; without it the job is
    /// refused with `JobError::InvalidConfig`.
    Spilling {
        /// A local working directory. Each operator instance uses a
        /// directory of its own inside it and deletes it when it ends; it
        /// is never part of a checkpoint (the checkpoint store holds the
        /// durable copy).
        dir: PathBuf,
        /// How many keys each subtask keeps in memory; at least 1.
        memory_entries: usize,
    },
}

impl KeyedBackend {
    /// Why this choice cannot run in this build, if it cannot.
    pub(crate) fn check(&self) -> Result<(), String> {
        match self {
            KeyedBackend::Memory => Ok(()),
            KeyedBackend::Spilling { memory_entries, .. } => {
                if !cfg!(feature = "spill") {
                    return Err(
                        "KeyedBackend::Spilling needs snapflow's cargo feature `spill`".into(),
                    );
                }
                if *memory_entries == 0 {
                    return Err("KeyedBackend::Spilling needs memory_entries of at least 1".into());
                }
                Ok(())
            }
        }
    }
}

/// What a checkpoint needs of a keyed-state backend: its key groups, which
/// of them changed, and their parts. Called per snapshot, never per record.
pub(crate) trait KeyGroupSnapshots {
    /// The key groups owned.
    fn key_groups(&self) -> KeyGroupRange;
    /// The key groups changed since [`Self::forget_changes`], ascending.
    fn changed_key_groups(&self) -> Vec<u32>;
    /// Marks every key group unchanged.
    fn forget_changes(&mut self);
    /// The parts of the key groups `include` picks, ascending, in
    /// [`super::part`]'s format.
    fn parts_of(
        &mut self,
        include: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Vec<KeyGroupPart>, BoxError>;
    /// The parts of every key group, ascending.
    fn all_parts(&mut self) -> Result<Vec<(u32, Vec<u8>)>, BoxError> {
        Ok(self
            .parts_of(&mut |_| true)?
            .into_iter()
            .map(|part| (part.key_group, part.bytes))
            .collect())
    }
}

impl<K: StateKey, S: Snapshot> KeyGroupSnapshots for KeyedState<K, S> {
    fn key_groups(&self) -> KeyGroupRange {
        self.range()
    }

    fn changed_key_groups(&self) -> Vec<u32> {
        self.dirty_key_groups().collect()
    }

    fn forget_changes(&mut self) {
        self.clear_dirty();
    }

    fn parts_of(
        &mut self,
        include: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Vec<KeyGroupPart>, BoxError> {
        Ok(self.snapshot_key_groups(include)?)
    }

    fn all_parts(&mut self) -> Result<Vec<(u32, Vec<u8>)>, BoxError> {
        Ok(self.snapshot()?.into_parts().collect())
    }
}

impl<K: StateKey, S: Snapshot> KeyGroupSnapshots for CowKeyedState<K, S> {
    fn key_groups(&self) -> KeyGroupRange {
        self.range()
    }

    fn changed_key_groups(&self) -> Vec<u32> {
        self.dirty_key_groups().collect()
    }

    fn forget_changes(&mut self) {
        self.clear_dirty();
    }

    fn parts_of(
        &mut self,
        include: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Vec<KeyGroupPart>, BoxError> {
        Ok(self.snapshot_key_groups(include)?)
    }
}

/// Moves every entry of `state` (left empty, same range) into a
/// copy-on-write state, with its slices' changed flags: the adaptive
/// rule's one switch, for the keyed core's store and the timed core's
/// tables alike.
pub(crate) fn take_into_cow<K: StateKey, S: Snapshot + Default>(
    state: &mut KeyedState<K, S>,
) -> CowKeyedState<K, S> {
    let empty = KeyedState::new(state.max_parallelism(), state.range())
        .unwrap_or_else(|error| panic!("bug: a keyed state's own range: {error}"));
    CowKeyedState::from_flat(std::mem::replace(state, empty))
}

/// How many keys `parts` claim (each part's claim capped by its length,
/// so hostile headers cannot inflate it): what a restore compares with the
/// copy-on-write threshold to pick its layout.
pub(crate) fn claimed_keys(parts: &[(u32, Vec<u8>)]) -> usize {
    parts
        .iter()
        .map(|(_, bytes)| super::part::plausible_entries(bytes))
        .sum()
}

/// The keyed state a keyed operator holds, in the backend its job chose.
#[derive(Debug)]
pub(crate) enum KeyedStore<K, S> {
    /// [`KeyedBackend::Memory`] while the subtask holds fewer keys than
    /// the copy-on-write threshold.
    Memory(KeyedState<K, S>),
    /// [`KeyedBackend::Memory`] from the copy-on-write threshold on.
    CopyOnWrite(CowKeyedState<K, S>),
    /// [`KeyedBackend::Spilling`].
    #[cfg(feature = "spill")]
    Spilling(Box<super::spill::SpillingState<K, S>>),
}

impl<K: StateKey, S: Snapshot + Default> KeyedStore<K, S> {
    /// Empty state for `subtask` of `parallelism` in `backend`;
    /// `operator` names the spilling backend's directory. The in-memory
    /// backend starts copy-on-write when `copy_on_write_threshold_keys` is
    /// 0.
    pub(crate) fn for_subtask(
        backend: &KeyedBackend,
        operator: &str,
        max_parallelism: MaxParallelism,
        parallelism: u32,
        subtask: u32,
        copy_on_write_threshold_keys: usize,
    ) -> Result<Self, BoxError> {
        let range = max_parallelism.range_for_subtask(parallelism, subtask)?;
        match backend {
            KeyedBackend::Memory if copy_on_write_threshold_keys == 0 => Ok(
                KeyedStore::CopyOnWrite(CowKeyedState::new(max_parallelism, range)?),
            ),
            KeyedBackend::Memory => {
                Ok(KeyedStore::Memory(KeyedState::new(max_parallelism, range)?))
            }
            #[cfg(feature = "spill")]
            KeyedBackend::Spilling {
                dir,
                memory_entries,
            } => {
                let dir = super::spill::instance_dir(dir, operator, subtask);
                Ok(KeyedStore::Spilling(Box::new(
                    super::spill::SpillingState::new(max_parallelism, range, dir, *memory_entries)?,
                )))
            }
            #[cfg(not(feature = "spill"))]
            KeyedBackend::Spilling { .. } => {
                let _ = operator;
                Err(KeyedBackend::check(backend)
                    .err()
                    .unwrap_or_default()
                    .into())
            }
        }
    }

    /// Moves flat in-memory state holding at least
    /// `copy_on_write_threshold_keys` keys to the copy-on-write layout;
    /// anything else stays as it is. Called between batches: one
    /// comparison when nothing moves, every key hashed once when it does
    /// (once per subtask, a few milliseconds at the default threshold).
    #[inline]
    pub(crate) fn convert_if_large(&mut self, copy_on_write_threshold_keys: usize) {
        if let KeyedStore::Memory(state) = self {
            if state.len() >= copy_on_write_threshold_keys {
                self.convert();
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn convert(&mut self) {
        if let KeyedStore::Memory(state) = self {
            *self = KeyedStore::CopyOnWrite(take_into_cow(state));
        }
    }

    /// Replaces the state with the key groups of its range found in
    /// `parts` (written by any backend or layout, at any parallelism). The
    /// in-memory backend restores straight into the copy-on-write layout
    /// when the parts claim at least `copy_on_write_threshold_keys` keys,
    /// and flat otherwise, whatever layout it had before.
    pub(crate) fn restore(
        &mut self,
        parts: Vec<(u32, Vec<u8>)>,
        copy_on_write_threshold_keys: usize,
    ) -> Result<(), BoxError> {
        let range = self.key_groups();
        let parts: Vec<(u32, Vec<u8>)> = super::parts_in_range(range, parts).collect();
        match self.in_memory_max_parallelism() {
            Some(max_parallelism) => {
                *self = if claimed_keys(&parts) >= copy_on_write_threshold_keys {
                    KeyedStore::CopyOnWrite(CowKeyedState::restore(max_parallelism, range, parts)?)
                } else {
                    KeyedStore::Memory(KeyedState::restore(max_parallelism, range, parts)?)
                };
            }
            #[cfg(feature = "spill")]
            None => {
                if let KeyedStore::Spilling(state) = self {
                    state.restore(parts)?;
                }
            }
            #[cfg(not(feature = "spill"))]
            None => {}
        }
        Ok(())
    }

    /// The job's max parallelism, for the in-memory layouts.
    fn in_memory_max_parallelism(&self) -> Option<MaxParallelism> {
        match self {
            KeyedStore::Memory(state) => Some(state.max_parallelism()),
            KeyedStore::CopyOnWrite(state) => Some(state.max_parallelism()),
            #[cfg(feature = "spill")]
            KeyedStore::Spilling(_) => None,
        }
    }

    /// Calls `f` with every key and its state (the spilling backend reads
    /// its disk too), in unspecified order.
    pub(crate) fn for_each(&mut self, mut f: impl FnMut(&K, &S)) -> Result<(), BoxError> {
        match self {
            KeyedStore::Memory(state) => {
                state.iter().for_each(|(key, value)| f(key, value));
                Ok(())
            }
            KeyedStore::CopyOnWrite(state) => {
                state.iter().for_each(|(key, value)| f(key, value));
                Ok(())
            }
            #[cfg(feature = "spill")]
            KeyedStore::Spilling(state) => Ok(state.for_each(f)?),
        }
    }
}

impl<K: StateKey, S: Snapshot + Default> KeyGroupSnapshots for KeyedStore<K, S> {
    fn key_groups(&self) -> KeyGroupRange {
        match self {
            KeyedStore::Memory(state) => state.range(),
            KeyedStore::CopyOnWrite(state) => state.range(),
            #[cfg(feature = "spill")]
            KeyedStore::Spilling(state) => state.key_groups(),
        }
    }

    fn changed_key_groups(&self) -> Vec<u32> {
        match self {
            KeyedStore::Memory(state) => state.changed_key_groups(),
            KeyedStore::CopyOnWrite(state) => state.changed_key_groups(),
            #[cfg(feature = "spill")]
            KeyedStore::Spilling(state) => state.changed_key_groups(),
        }
    }

    fn forget_changes(&mut self) {
        match self {
            KeyedStore::Memory(state) => state.forget_changes(),
            KeyedStore::CopyOnWrite(state) => state.forget_changes(),
            #[cfg(feature = "spill")]
            KeyedStore::Spilling(state) => state.forget_changes(),
        }
    }

    fn parts_of(
        &mut self,
        include: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Vec<KeyGroupPart>, BoxError> {
        match self {
            KeyedStore::Memory(state) => state.parts_of(include),
            KeyedStore::CopyOnWrite(state) => state.parts_of(include),
            #[cfg(feature = "spill")]
            KeyedStore::Spilling(state) => state.parts_of(include),
        }
    }

    fn all_parts(&mut self) -> Result<Vec<(u32, Vec<u8>)>, BoxError> {
        match self {
            KeyedStore::Memory(state) => state.all_parts(),
            KeyedStore::CopyOnWrite(state) => state.all_parts(),
            #[cfg(feature = "spill")]
            KeyedStore::Spilling(state) => state.all_parts(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyed::test_support::Count;

    fn store(threshold_keys: usize) -> KeyedStore<u64, Count> {
        let max_parallelism = MaxParallelism::new(16).unwrap();
        KeyedStore::for_subtask(
            &KeyedBackend::Memory,
            "count",
            max_parallelism,
            2,
            1,
            threshold_keys,
        )
        .unwrap()
    }

    /// Counts `key` once, on whichever layout the store has, as the keyed
    /// core's batch loops do.
    fn count(store: &mut KeyedStore<u64, Count>, key: u64) {
        let hash = super::super::key_hash(&key);
        match store {
            KeyedStore::Memory(state) => state.get_or_default_routed(&key, hash).count += 1,
            KeyedStore::CopyOnWrite(state) => state.get_or_default_routed(&key, hash).count += 1,
            #[cfg(feature = "spill")]
            KeyedStore::Spilling(_) => unreachable!("the in-memory backend"),
        }
    }

    fn owned_keys(count: usize) -> Vec<u64> {
        let range = store(1).key_groups();
        let max_parallelism = MaxParallelism::new(16).unwrap();
        (0..u64::MAX)
            .filter(|key| range.contains(max_parallelism.key_group_of(super::super::key_hash(key))))
            .take(count)
            .collect()
    }

    /// The keys and counts `parts` hold. Parts hold a group's entries in
    /// table order, which differs between the layouts, so parts are
    /// compared decoded.
    fn decoded(parts: &[(u32, Vec<u8>)]) -> std::collections::BTreeMap<u64, u64> {
        let range = store(1).key_groups();
        let state: KeyedState<u64, Count> =
            KeyedState::restore(MaxParallelism::new(16).unwrap(), range, parts.to_vec()).unwrap();
        state
            .iter()
            .map(|(key, value)| (*key, value.count))
            .collect()
    }

    fn groups(parts: &[KeyGroupPart]) -> Vec<u32> {
        parts.iter().map(|part| part.key_group).collect()
    }

    #[test]
    fn the_store_turns_copy_on_write_exactly_at_the_threshold_with_equal_state() {
        const THRESHOLD: usize = 50;
        let keys = owned_keys(THRESHOLD + 20);
        let mut adaptive = store(THRESHOLD);
        let mut flat = store(usize::MAX);
        for (index, key) in keys.iter().enumerate() {
            count(&mut adaptive, *key);
            count(&mut flat, *key);
            // Every key twice, so that the values are not all defaults.
            count(&mut flat, *key);
            count(&mut adaptive, *key);
            adaptive.convert_if_large(THRESHOLD);
            flat.convert_if_large(usize::MAX);
            let keys_held = index + 1;
            assert_eq!(
                matches!(adaptive, KeyedStore::CopyOnWrite(_)),
                keys_held >= THRESHOLD,
                "at {keys_held} keys"
            );
            assert!(matches!(flat, KeyedStore::Memory(_)));
            if keys_held + 1 == THRESHOLD || keys_held == THRESHOLD {
                // Either side of the switch: the same changed groups and
                // the same parts.
                assert_eq!(adaptive.changed_key_groups(), flat.changed_key_groups());
                let (got, want) = (adaptive.all_parts().unwrap(), flat.all_parts().unwrap());
                assert_eq!(decoded(&got), decoded(&want), "at {keys_held} keys");
            }
        }
        let want = flat.all_parts().unwrap();
        assert_eq!(decoded(&adaptive.all_parts().unwrap()), decoded(&want));
        assert_eq!(decoded(&want).len(), keys.len());
        let picked = |key_group: u32| key_group % 2 == 0;
        assert_eq!(
            groups(&adaptive.parts_of(&mut { picked }).unwrap()),
            groups(&flat.parts_of(&mut { picked }).unwrap())
        );
        // Never back: a store that shrinks stays copy-on-write.
        adaptive.convert_if_large(usize::MAX);
        assert!(matches!(adaptive, KeyedStore::CopyOnWrite(_)));

        // A restore picks the layout by the keys it restores.
        let parts = flat.all_parts().unwrap();
        let mut restored = store(THRESHOLD);
        restored.restore(parts.clone(), keys.len()).unwrap();
        assert!(matches!(restored, KeyedStore::CopyOnWrite(_)));
        assert_eq!(decoded(&restored.all_parts().unwrap()), decoded(&parts));
        restored.restore(parts.clone(), keys.len() + 1).unwrap();
        assert!(matches!(restored, KeyedStore::Memory(_)));
        assert_eq!(decoded(&restored.all_parts().unwrap()), decoded(&parts));
        assert!(restored.changed_key_groups().is_empty());
    }

    #[test]
    fn a_threshold_of_zero_is_copy_on_write_from_the_start() {
        assert!(matches!(store(0), KeyedStore::CopyOnWrite(_)));
        assert!(matches!(store(1), KeyedStore::Memory(_)));
    }
}
