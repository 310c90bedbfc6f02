//! The built-in operator cores: stateless functions (map, filter,
//! flat_map), the keyed process function with per-key state, and the sink
//! core that drives a [`SinkWriter`]'s two-phase commit.
//!
//! This module owns what each operator does with a batch and how its state
//! becomes bytes. It never sees the protocol or the transport: the shell in
//! [`super::shell`] calls these cores.
//!
//! Keyed state is [`crate::keyed::KeyedState`], snapshotted per key group
//! (so a restore at another parallelism could take its key groups from any
//! old subtask's part; the job layer does not rescale yet).

use std::collections::HashMap;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::keyed::{key_hash, parts_in_range, KeyedState, MaxParallelism};
use crate::protocol::CheckpointId;
use crate::runtime::BoxError;
use crate::state::Snapshot;

use super::route::Collector;
use super::shell::{Core, Data};
use crate::sink::{Sink, SinkError, SinkState};
use crate::source::Guarantee;

/// A stateless per-record function.
pub(crate) type RecordFn<In, Out> = Arc<dyn Fn(In, &mut Collector<'_, Out>) + Send + Sync>;

/// Map, filter and flat_map: a per-record function without state.
pub(crate) struct StatelessCore<In, Out: Send + 'static> {
    pub(crate) function: RecordFn<In, Out>,
}

impl<In: Data, Out: Data> Core<In, Out> for StatelessCore<In, Out> {
    fn process(&mut self, batch: Vec<In>, out: &mut Collector<'_, Out>) -> Result<(), BoxError> {
        for record in batch {
            (self.function)(record, out);
        }
        Ok(())
    }

    fn snapshot(&mut self, _checkpoint: CheckpointId) -> Result<Vec<u8>, BoxError> {
        Ok(Vec::new())
    }

    fn restore(&mut self, _state: Option<&[u8]>) -> Result<(), BoxError> {
        Ok(())
    }
}

/// A key type: hashable with a stable hash, and serializable.
pub trait Key: Hash + Eq + Clone + Send + Sync + Serialize + DeserializeOwned + 'static {}

impl<K: Hash + Eq + Clone + Send + Sync + Serialize + DeserializeOwned + 'static> Key for K {}

/// A keyed process function, erased.
pub(crate) type DynProcess<K, S, In, Out> =
    dyn Fn(&K, &mut S, In, &mut Collector<'_, Out>) -> Result<(), BoxError> + Send + Sync;

/// The key and key hash of every record of a batch, appended in order: one
/// indirect call per batch, with the user's key function and the stable
/// hash monomorphised inside (see [`key_batch_fn`]).
///
/// The keyed core then looks the keys up in a second loop. Fusing the two
/// loops (so that the key function's latency, a 64-bit division in the
/// benchmark, overlaps with the lookup) needs both the key function and the
/// process function concrete in one loop; with the key function erased
/// that costs an indirect call per record, which measured slower than two
/// passes (46.7% of the keyed count's cycles against 36.6%).
pub(crate) type KeyBatchFn<K, In> = Arc<dyn Fn(&[In], &mut Vec<(K, u64)>) + Send + Sync>;

/// The batch form of `key_of`. With a concrete (not `dyn`) `F`, the key
/// function is inlined into the loop.
pub(crate) fn key_batch_fn<K, In, F>(key_of: Arc<F>) -> KeyBatchFn<K, In>
where
    K: Key,
    In: 'static,
    F: Fn(&In) -> K + Send + Sync + ?Sized + 'static,
{
    Arc::new(move |records: &[In], keys: &mut Vec<(K, u64)>| {
        keys.extend(records.iter().map(|record| {
            let key = key_of(record);
            let hash = key_hash(&key);
            (key, hash)
        }));
    })
}

/// Where a keyed operator publishes its final per-key state at end of input.
pub(crate) type FinalStates<K, S> = Arc<Mutex<HashMap<usize, HashMap<K, S>>>>;

/// The keyed process function with per-key state. `F` is the process
/// function: a concrete closure type on the job builder's path, so that a
/// batch runs without an indirect call per record, or `dyn` (the default)
/// where it is erased.
pub(crate) struct KeyedCore<K, S, In, Out: Send + 'static, F: ?Sized = DynProcess<K, S, In, Out>> {
    pub(crate) subtask: usize,
    /// The keys and key hashes of a batch.
    pub(crate) keys_of: KeyBatchFn<K, In>,
    /// Scratch for `keys_of`, reused from batch to batch (its capacity stays
    /// at the largest batch seen).
    pub(crate) keys: Vec<(K, u64)>,
    pub(crate) function: Arc<F>,
    pub(crate) states: KeyedState<K, S>,
    pub(crate) publish: Option<FinalStates<K, S>>,
    pub(crate) _records: PhantomData<fn() -> Out>,
}

/// The stored form of one subtask's keyed state: one part per key group.
type KeyGroupParts = Vec<(u32, Vec<u8>)>;

/// The union of the key-group parts of several subtasks' keyed states, in
/// the same stored form; a subtask restoring from it keeps the key groups
/// of its own range.
pub(crate) fn merge_keyed_states(states: &[Vec<u8>]) -> Result<Vec<u8>, String> {
    let mut merged: KeyGroupParts = Vec::new();
    for state in states {
        let parts: KeyGroupParts =
            postcard::from_bytes(state).map_err(|error| error.to_string())?;
        merged.extend(parts);
    }
    postcard::to_allocvec(&merged).map_err(|error| error.to_string())
}

impl<K: Key, S, In: 'static, Out: Send + 'static, F: ?Sized> KeyedCore<K, S, In, Out, F> {
    /// Empty state for `subtask` of `parallelism`.
    ///
    /// # Panics
    ///
    /// If `subtask` or `parallelism` do not fit `max_parallelism`: the plan
    /// checked both before anything started, so this is a bug.
    pub(crate) fn new(
        max_parallelism: MaxParallelism,
        parallelism: usize,
        subtask: usize,
        key_of: Arc<dyn Fn(&In) -> K + Send + Sync>,
        function: Arc<F>,
        publish: Option<FinalStates<K, S>>,
    ) -> Self {
        let states = KeyedState::for_subtask(max_parallelism, parallelism as u32, subtask as u32)
            .unwrap_or_else(|error| panic!("bug: the plan let through {error}"));
        KeyedCore {
            subtask,
            keys_of: key_batch_fn(key_of),
            keys: Vec::new(),
            function,
            states,
            publish,
            _records: PhantomData,
        }
    }

    /// Replaces the batch key function made from the erased `key_of` by
    /// one with the key function inlined (see [`key_batch_fn`]); it must
    /// compute the same keys.
    pub(crate) fn with_keys_of(mut self, keys_of: KeyBatchFn<K, In>) -> Self {
        self.keys_of = keys_of;
        self
    }
}

impl<K, S, In, Out, F> Core<In, Out> for KeyedCore<K, S, In, Out, F>
where
    K: Key,
    S: Snapshot + Default + Clone + 'static,
    In: Data,
    Out: Data,
    F: Fn(&K, &mut S, In, &mut Collector<'_, Out>) -> Result<(), BoxError> + ?Sized + 'static,
{
    fn process(&mut self, batch: Vec<In>, out: &mut Collector<'_, Out>) -> Result<(), BoxError> {
        let mut keys = std::mem::take(&mut self.keys);
        keys.clear();
        (self.keys_of)(&batch, &mut keys);
        debug_assert_eq!(keys.len(), batch.len(), "one key per record");
        let mut result = Ok(());
        // Both sides are exact-size and random-access, so the zip is one
        // counted loop.
        for ((key, hash), record) in keys.iter().zip(batch) {
            let state = match self.states.try_get_or_default_hashed(key, *hash) {
                Ok(state) => state,
                Err(error) => {
                    result = Err(error.into());
                    break;
                }
            };
            if let Err(error) = (self.function)(key, state, record, out) {
                result = Err(error);
                break;
            }
        }
        keys.clear();
        self.keys = keys;
        result
    }

    fn snapshot(&mut self, _checkpoint: CheckpointId) -> Result<Vec<u8>, BoxError> {
        let parts: KeyGroupParts = self.states.snapshot()?.into_parts().collect();
        Ok(postcard::to_allocvec(&parts)?)
    }

    fn restore(&mut self, state: Option<&[u8]>) -> Result<(), BoxError> {
        let Some(state) = state else {
            return Ok(());
        };
        let parts: KeyGroupParts = postcard::from_bytes(state)?;
        let (max_parallelism, range) = (self.states.max_parallelism(), self.states.range());
        self.states = KeyedState::restore(max_parallelism, range, parts_in_range(range, parts))?;
        Ok(())
    }

    fn on_end(&mut self, _out: &mut Collector<'_, Out>) -> Result<(), BoxError> {
        if let Some(publish) = &self.publish {
            let mut published = publish
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let states = self
                .states
                .iter()
                .map(|(key, state)| (key.clone(), state.clone()))
                .collect();
            published.insert(self.subtask, states);
        }
        Ok(())
    }
}

/// Makes the sink of one subtask (subtask, parallelism).
pub(crate) type SinkMaker<T> =
    Arc<dyn Fn(usize, usize) -> Result<Box<dyn Sink<Item = T>>, SinkError> + Send + Sync>;

/// The sink core: writes batches, pre-commits at the snapshot, commits on
/// completion, restores (committing what the checkpoint lists and aborting
/// the rest) before the first batch.
pub(crate) struct SinkCore<T> {
    pub(crate) make: SinkMaker<T>,
    pub(crate) subtask: usize,
    pub(crate) parallelism: usize,
    /// Made in `restore`, on the actor's thread, so that a failure to open
    /// it is a typed failure report.
    pub(crate) sink: Option<Box<dyn Sink<Item = T>>>,
}

impl<T> SinkCore<T> {
    fn sink(&mut self) -> Result<&mut Box<dyn Sink<Item = T>>, BoxError> {
        self.sink
            .as_mut()
            .ok_or_else(|| "the sink was used before it was restored".into())
    }
}

impl<T: Data> Core<T, ()> for SinkCore<T> {
    fn process(&mut self, batch: Vec<T>, _out: &mut Collector<'_, ()>) -> Result<(), BoxError> {
        Ok(self.sink()?.write_batch(&batch)?)
    }

    fn snapshot(&mut self, checkpoint: CheckpointId) -> Result<Vec<u8>, BoxError> {
        Ok(self.sink()?.pre_commit(checkpoint.0)?.as_bytes().to_vec())
    }

    fn restore(&mut self, state: Option<&[u8]>) -> Result<(), BoxError> {
        let mut sink = (self.make)(self.subtask, self.parallelism)?;
        let state = state.map(|bytes| SinkState::from_bytes(bytes.to_vec()));
        sink.restore(state.as_ref())?;
        self.sink = Some(sink);
        Ok(())
    }

    fn on_complete(&mut self, checkpoint: CheckpointId) -> Result<(), BoxError> {
        Ok(self.sink()?.commit(checkpoint.0)?)
    }

    fn on_end(&mut self, _out: &mut Collector<'_, ()>) -> Result<(), BoxError> {
        Ok(self.sink()?.finish()?)
    }

    fn guarantee(&self) -> Guarantee {
        self.sink
            .as_ref()
            .map_or(Guarantee::ExactlyOnce, |sink| sink.guarantee())
    }
}
