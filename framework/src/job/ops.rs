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

/// Where a keyed operator publishes its final per-key state at end of input.
pub(crate) type FinalStates<K, S> = Arc<Mutex<HashMap<usize, HashMap<K, S>>>>;

/// The keyed process function with per-key state. `F` is the process
/// function and `KF` the key function: concrete closure types on the job
/// builder's path, so that a batch runs as one loop (key, stable hash,
/// state lookup, user function) without an indirect call per record, or
/// `dyn` (the defaults) where they are erased.
///
/// One loop matters: the key function's latency (the benchmark's key is a
/// 64-bit division) then overlaps with the state lookup of neighbouring
/// records. Computing the keys of a batch in a pass of its own cost 9.7% of
/// the keyed count's cycles; a fused loop with the key function behind an
/// indirect call per record cost more than that.
pub(crate) struct KeyedCore<
    K,
    S,
    In,
    Out: Send + 'static,
    F: ?Sized = DynProcess<K, S, In, Out>,
    KF: ?Sized = dyn Fn(&In) -> K + Send + Sync,
> {
    pub(crate) subtask: usize,
    pub(crate) key_of: Arc<KF>,
    pub(crate) function: Arc<F>,
    pub(crate) states: KeyedState<K, S>,
    pub(crate) publish: Option<FinalStates<K, S>>,
    pub(crate) _records: PhantomData<fn(In) -> Out>,
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

impl<K: Key, S, In: 'static, Out: Send + 'static, F: ?Sized, KF: ?Sized>
    KeyedCore<K, S, In, Out, F, KF>
{
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
        key_of: Arc<KF>,
        function: Arc<F>,
        publish: Option<FinalStates<K, S>>,
    ) -> Self {
        let states = KeyedState::for_subtask(max_parallelism, parallelism as u32, subtask as u32)
            .unwrap_or_else(|error| panic!("bug: the plan let through {error}"));
        KeyedCore {
            subtask,
            key_of,
            function,
            states,
            publish,
            _records: PhantomData,
        }
    }
}

impl<K, S, In, Out, F, KF> Core<In, Out> for KeyedCore<K, S, In, Out, F, KF>
where
    K: Key,
    S: Snapshot + Default + Clone + 'static,
    In: Data,
    Out: Data,
    F: Fn(&K, &mut S, In, &mut Collector<'_, Out>) -> Result<(), BoxError> + ?Sized + 'static,
    KF: Fn(&In) -> K + ?Sized + 'static,
{
    fn process(&mut self, batch: Vec<In>, out: &mut Collector<'_, Out>) -> Result<(), BoxError> {
        for record in batch {
            let key = (self.key_of)(&record);
            let state = self
                .states
                .try_get_or_default_hashed(&key, key_hash(&key))?;
            (self.function)(&key, state, record, out)?;
        }
        Ok(())
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
