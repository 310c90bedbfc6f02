//! The choice of keyed-state backend ([`KeyedBackend`], set per job in
//! `JobConfig::keyed_backend`), the store a keyed operator holds
//! ([`KeyedStore`]: the in-memory [`KeyedState`] or, with cargo feature
//! `spill`, the spilling backend of [`super::spill`]), and what a
//! checkpoint asks of either ([`KeyGroupSnapshots`]).
//!
//! This module owns the dispatch between the backends: one `match` per
//! batch or per snapshot, never a call through a pointer per record, so the
//! in-memory hot path compiles to the same loop as before the choice
//! existed. It never decides when to snapshot and never does I/O itself.

use std::path::PathBuf;

use super::backend::{KeyGroupPart, KeyedState};
use super::key_group::{KeyGroupRange, MaxParallelism};
use super::StateKey;
use crate::state::Snapshot;

/// The runtime's error box (`crate::runtime::BoxError`), named here so that
/// the keyed layer does not reach up into the runtime.
type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

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

/// The keyed state a keyed operator holds, in the backend its job chose.
#[derive(Debug)]
pub(crate) enum KeyedStore<K, S> {
    /// [`KeyedBackend::Memory`].
    Memory(KeyedState<K, S>),
    /// [`KeyedBackend::Spilling`].
    #[cfg(feature = "spill")]
    Spilling(Box<super::spill::SpillingState<K, S>>),
}

impl<K: StateKey, S: Snapshot + Default> KeyedStore<K, S> {
    /// Empty state for `subtask` of `parallelism` in `backend`;
    /// `operator` names the spilling backend's directory.
    pub(crate) fn for_subtask(
        backend: &KeyedBackend,
        operator: &str,
        max_parallelism: MaxParallelism,
        parallelism: u32,
        subtask: u32,
    ) -> Result<Self, BoxError> {
        let range = max_parallelism.range_for_subtask(parallelism, subtask)?;
        match backend {
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

    /// Replaces the state with the key groups of its range found in
    /// `parts` (written by either backend, at any parallelism).
    pub(crate) fn restore(&mut self, parts: Vec<(u32, Vec<u8>)>) -> Result<(), BoxError> {
        let parts = super::parts_in_range(self.key_groups(), parts);
        match self {
            KeyedStore::Memory(state) => {
                let (max_parallelism, range) = (state.max_parallelism(), state.range());
                *state = KeyedState::restore(max_parallelism, range, parts)?;
            }
            #[cfg(feature = "spill")]
            KeyedStore::Spilling(state) => state.restore(parts)?,
        }
        Ok(())
    }

    /// Calls `f` with every key and its state (the spilling backend reads
    /// its disk too), in unspecified order.
    pub(crate) fn for_each(&mut self, mut f: impl FnMut(&K, &S)) -> Result<(), BoxError> {
        match self {
            KeyedStore::Memory(state) => {
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
            #[cfg(feature = "spill")]
            KeyedStore::Spilling(state) => state.key_groups(),
        }
    }

    fn changed_key_groups(&self) -> Vec<u32> {
        match self {
            KeyedStore::Memory(state) => state.changed_key_groups(),
            #[cfg(feature = "spill")]
            KeyedStore::Spilling(state) => state.changed_key_groups(),
        }
    }

    fn forget_changes(&mut self) {
        match self {
            KeyedStore::Memory(state) => state.forget_changes(),
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
            #[cfg(feature = "spill")]
            KeyedStore::Spilling(state) => state.parts_of(include),
        }
    }

    fn all_parts(&mut self) -> Result<Vec<(u32, Vec<u8>)>, BoxError> {
        match self {
            KeyedStore::Memory(state) => state.all_parts(),
            #[cfg(feature = "spill")]
            KeyedStore::Spilling(state) => state.all_parts(),
        }
    }
}
