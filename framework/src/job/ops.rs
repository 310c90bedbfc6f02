//! The built-in operator cores: stateless functions (map, filter,
//! flat_map), the keyed process function with per-key state, and the sink
//! core that drives a [`SinkWriter`]'s two-phase commit.
//!
//! This module owns what each operator does with a batch and how its state
//! becomes bytes. It never sees the protocol or the transport: the shell in
//! [`super::shell`] calls these cores.
//!
//! Keyed state here is a private, simple form (a `HashMap` per subtask,
//! snapshotted with each entry's key group so a later rescale can split it);
//! the richer `snapflow::keyed` module replaces it when it lands.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::protocol::CheckpointId;
use crate::runtime::BoxError;
use crate::state::{blob, Snapshot};

use super::connectors::SinkWriter;
use super::route::{key_group, stable_hash, Collector};
use super::shell::{Core, Data};

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

    fn restore(&mut self, _state: &[u8]) -> Result<(), BoxError> {
        Ok(())
    }
}

/// A key type: hashable with a stable hash, and serializable.
pub trait Key: Hash + Eq + Clone + Send + Sync + Serialize + DeserializeOwned + 'static {}

impl<K: Hash + Eq + Clone + Send + Sync + Serialize + DeserializeOwned + 'static> Key for K {}

/// A keyed process function.
pub(crate) type ProcessFn<K, S, In, Out> =
    Arc<dyn Fn(&K, &mut S, In, &mut Collector<'_, Out>) -> Result<(), BoxError> + Send + Sync>;

/// Where a keyed operator publishes its final per-key state at end of input.
pub(crate) type FinalStates<K, S> = Arc<Mutex<HashMap<usize, HashMap<K, S>>>>;

/// The keyed process function with per-key state.
pub(crate) struct KeyedCore<K, S, In, Out: Send + 'static> {
    pub(crate) subtask: usize,
    pub(crate) max_parallelism: u32,
    pub(crate) key_of: Arc<dyn Fn(&In) -> K + Send + Sync>,
    pub(crate) function: ProcessFn<K, S, In, Out>,
    pub(crate) states: HashMap<K, S>,
    pub(crate) publish: Option<FinalStates<K, S>>,
}

/// The stored form of one subtask's keyed state: (key group, key, state
/// blob) per key.
type KeyedEntries<K> = Vec<(u32, K, Vec<u8>)>;

impl<K, S, In, Out> Core<In, Out> for KeyedCore<K, S, In, Out>
where
    K: Key,
    S: Snapshot + Default + Clone + 'static,
    In: Data,
    Out: Data,
{
    fn process(&mut self, batch: Vec<In>, out: &mut Collector<'_, Out>) -> Result<(), BoxError> {
        for record in batch {
            let key = (self.key_of)(&record);
            // Two lookups for a new key, one for a known key: the key is
            // cloned only when it is inserted.
            if !self.states.contains_key(&key) {
                self.states.insert(key.clone(), S::default());
            }
            let Some(state) = self.states.get_mut(&key) else {
                return Err("a key inserted a moment ago is missing".into());
            };
            (self.function)(&key, state, record, out)?;
        }
        Ok(())
    }

    fn snapshot(&mut self, _checkpoint: CheckpointId) -> Result<Vec<u8>, BoxError> {
        let mut entries: KeyedEntries<K> = Vec::with_capacity(self.states.len());
        for (key, state) in &self.states {
            let group = key_group(stable_hash(key), self.max_parallelism);
            entries.push((group, key.clone(), blob::encode(state)?));
        }
        Ok(postcard::to_allocvec(&entries)?)
    }

    fn restore(&mut self, state: &[u8]) -> Result<(), BoxError> {
        let entries: KeyedEntries<K> = postcard::from_bytes(state)?;
        self.states.clear();
        for (_group, key, bytes) in entries {
            self.states.insert(key, blob::decode(&bytes)?);
        }
        Ok(())
    }

    fn on_end(&mut self, _out: &mut Collector<'_, Out>) -> Result<(), BoxError> {
        if let Some(publish) = &self.publish {
            let mut published = publish
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            published.insert(self.subtask, self.states.clone());
        }
        Ok(())
    }
}

/// The sink core: writes batches, pre-commits at the snapshot, commits on
/// completion, recovers on restore.
pub(crate) struct SinkCore<T> {
    pub(crate) writer: Box<dyn SinkWriter<T>>,
}

impl<T: Data> Core<T, ()> for SinkCore<T> {
    fn process(&mut self, batch: Vec<T>, _out: &mut Collector<'_, ()>) -> Result<(), BoxError> {
        self.writer.write(batch)
    }

    fn snapshot(&mut self, checkpoint: CheckpointId) -> Result<Vec<u8>, BoxError> {
        self.writer.pre_commit(checkpoint.0)
    }

    fn restore(&mut self, state: &[u8]) -> Result<(), BoxError> {
        self.writer.recover(state)
    }

    fn on_complete(&mut self, checkpoint: CheckpointId) -> Result<(), BoxError> {
        self.writer.commit(checkpoint.0)
    }
}
