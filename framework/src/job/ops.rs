//! The built-in operator cores: stateless functions (map, filter,
//! flat_map), the keyed process function with per-key state (which also
//! carries reduce and aggregate), the core of a user [`Operator`], and the
//! sink core that drives a [`SinkWriter`]'s two-phase commit.
//!
//! This module owns what each operator does with a batch and how its state
//! becomes bytes. It never sees the protocol or the transport: the shell in
//! [`super::shell`] calls these cores.
//!
//! Keyed state is [`crate::keyed::KeyedState`], snapshotted per key group,
//! so a restore at another parallelism takes its key groups from the union
//! of the old subtasks' parts ([`merge_keyed_states`]). A user operator's
//! state is spread over the new subtasks by its own [`Operator::rescale`]
//! ([`rescale_operator_states`]).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::keyed::deferred::DeferredParts;
use crate::keyed::store::{KeyGroupSnapshots, KeyedStore};
use crate::keyed::{key_hash, KeyedBackend, MaxParallelism};
use crate::protocol::{CheckpointId, CheckpointKind};
use crate::runtime::BoxError;
use crate::state::{blob, Snapshot, StateError};

use super::incremental::{full_segments, IncrementalCheckpoints, KeyGroupLedger, SnapshotPlan};
use super::operator::Operator;
use super::route::Collector;
use super::shell::{Core, Data, DeferredState, TakenState};
use super::snapshots::{Requests, Waiting};
use crate::sink::{Sink, SinkError, SinkState};
use crate::source::Guarantee;
use crate::storage::Segment;

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
    pub(crate) states: KeyedStore<K, S>,
    pub(crate) publish: Option<FinalStates<K, S>>,
    /// Where its key groups were last written, when checkpoints are
    /// incremental.
    pub(crate) incremental: Option<Incremental>,
    /// From how many keys the subtask's in-memory state moves to the
    /// copy-on-write layout (`JobConfig::copy_on_write_threshold_keys`).
    pub(crate) copy_on_write_threshold_keys: usize,
    pub(crate) _records: PhantomData<fn(In) -> Out>,
}

/// A keyed core's incremental checkpoints: its ledger. (Which checkpoints
/// are savepoints, written whole, the barrier says.)
#[derive(Debug)]
pub(crate) struct Incremental {
    pub(crate) ledger: KeyGroupLedger,
}

/// The stored form of one subtask's keyed state: one part per key group,
/// `(key group, keyed part bytes)`.
pub(crate) type KeyGroupParts = Vec<(u32, Vec<u8>)>;

/// The stored bytes of a keyed operator's state: the envelope (a postcard
/// list) around its key groups' parts. This and [`decode_keyed_state`]
/// are the only places that know the envelope; the keyed core, rescaling
/// ([`merge_keyed_states`]) and `job::inspect` go through them. The parts
/// inside are [`crate::keyed`]'s own format.
pub(crate) fn encode_keyed_state(parts: &[(u32, Vec<u8>)]) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_allocvec(parts)
}

/// Reads a keyed operator's state written by [`encode_keyed_state`].
pub(crate) fn decode_keyed_state(bytes: &[u8]) -> Result<KeyGroupParts, postcard::Error> {
    postcard::from_bytes(bytes)
}

/// The union of the key-group parts of several subtasks' keyed states, in
/// the same stored form; a subtask restoring from it keeps the key groups
/// of its own range.
pub(crate) fn merge_keyed_states(states: &[Vec<u8>]) -> Result<Vec<u8>, String> {
    let mut merged: KeyGroupParts = Vec::new();
    for state in states {
        merged.extend(decode_keyed_state(state).map_err(|error| error.to_string())?);
    }
    encode_keyed_state(&merged).map_err(|error| error.to_string())
}

/// Where a keyed core keeps its state: the job's backend and the
/// operator's name (which names the spilling backend's directory).
#[derive(Debug, Clone)]
pub(crate) struct StatePlan {
    pub(crate) backend: KeyedBackend,
    pub(crate) operator: String,
    /// `JobConfig::copy_on_write_threshold_keys`.
    pub(crate) copy_on_write_threshold_keys: usize,
}

impl<K: Key, S: Snapshot + Default, In: 'static, Out: Send + 'static, F: ?Sized, KF: ?Sized>
    KeyedCore<K, S, In, Out, F, KF>
{
    /// Empty state for `subtask` of `parallelism`.
    ///
    /// # Panics
    ///
    /// If `subtask` or `parallelism` do not fit `max_parallelism`: the plan
    /// checked both before anything started, so this is a bug. (The
    /// spilling backend opens its disk table only when it first needs it,
    /// so no I/O happens here.)
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        max_parallelism: MaxParallelism,
        parallelism: usize,
        subtask: usize,
        key_of: Arc<KF>,
        function: Arc<F>,
        publish: Option<FinalStates<K, S>>,
        incremental: Option<IncrementalCheckpoints>,
        plan: &StatePlan,
    ) -> Self {
        let states = KeyedStore::for_subtask(
            &plan.backend,
            &plan.operator,
            max_parallelism,
            parallelism as u32,
            subtask as u32,
            plan.copy_on_write_threshold_keys,
        )
        .unwrap_or_else(|error| panic!("bug: the plan let through {error}"));
        let incremental = incremental.map(|settings| Incremental {
            ledger: KeyGroupLedger::new(settings, states.key_groups().len()),
        });
        KeyedCore {
            subtask,
            key_of,
            function,
            states,
            publish,
            incremental,
            copy_on_write_threshold_keys: plan.copy_on_write_threshold_keys,
            _records: PhantomData,
        }
    }
}

impl<K, S, In, Out, F, KF> Core<In, Out> for KeyedCore<K, S, In, Out, F, KF>
where
    K: Key,
    S: Snapshot + Default + Clone + Send + Sync + 'static,
    In: Data,
    Out: Data,
    F: Fn(&K, &mut S, In, &mut Collector<'_, Out>) -> Result<(), BoxError> + ?Sized + 'static,
    KF: Fn(&In) -> K + ?Sized + 'static,
{
    fn process(&mut self, batch: Vec<In>, out: &mut Collector<'_, Out>) -> Result<(), BoxError> {
        // One match per batch, and a loop per backend: the in-memory loop
        // is the one it was before the spilling backend existed.
        match &mut self.states {
            KeyedStore::Memory(states) => {
                for record in batch {
                    let key = (self.key_of)(&record);
                    // The hash partitioner upstream routed this record here
                    // by the key group of this very hash, so the lookup need
                    // not check it.
                    let state = states.get_or_default_routed(&key, key_hash(&key));
                    (self.function)(&key, state, record, out)?;
                }
                // Between batches, and one comparison when nothing moves.
                if states.len() >= self.copy_on_write_threshold_keys {
                    self.states
                        .convert_if_large(self.copy_on_write_threshold_keys);
                }
            }
            KeyedStore::CopyOnWrite(states) => {
                cow_batch(states, &*self.key_of, &*self.function, batch, out)?;
            }
            #[cfg(feature = "spill")]
            KeyedStore::Spilling(states) => {
                spilling_batch(states, &*self.key_of, &*self.function, batch, out)?;
            }
        }
        Ok(())
    }

    fn snapshot(&mut self, _checkpoint: CheckpointId) -> Result<Vec<u8>, BoxError> {
        let parts: KeyGroupParts = self.states.all_parts()?;
        Ok(encode_keyed_state(&parts)?)
    }

    /// What [`Self::take_state`] takes, encoded at once.
    fn snapshot_segments(
        &mut self,
        checkpoint: CheckpointId,
        kind: CheckpointKind,
    ) -> Result<Vec<Segment>, BoxError> {
        match self.take_state(checkpoint, kind)? {
            TakenState::Segments(segments) => Ok(segments),
            TakenState::Deferred(state) => state.encode(),
        }
    }

    /// The copy-on-write and the spilling state's snapshots are
    /// asynchronous: the copy-on-write key groups to write are handed off
    /// (constant time per group), the spilling state freezes its in-memory
    /// tables of those groups the same way and takes a view of its disk
    /// store and its change log, and the checkpoint writer encodes (or
    /// reads and merges) the parts; the flat state encodes here, on the
    /// operator's thread (its state is small), and with incremental
    /// checkpoints leaves the assembly of its sliced parts (CRCs, segments)
    /// to the writer. Both in-memory layouts write incremental checkpoints
    /// in the same units (the slices of each key group), so a state that
    /// moves from flat to copy-on-write keeps referring to what it wrote.
    fn take_state(
        &mut self,
        checkpoint: CheckpointId,
        kind: CheckpointKind,
    ) -> Result<TakenState, BoxError> {
        let savepoint = kind == CheckpointKind::Savepoint;
        let (plan, parts): (SnapshotPlan, Box<dyn DeferredParts>) = match &mut self.states {
            KeyedStore::Memory(states) => {
                let Some(incremental) = incremental_of(&mut self.incremental, savepoint) else {
                    return Ok(TakenState::Segments(full_segments(states)?));
                };
                let slices = incremental.ledger.snapshot_flat(checkpoint, states)?;
                return Ok(TakenState::Deferred(Box::new(slices)));
            }
            KeyedStore::CopyOnWrite(states) => {
                if let Some(incremental) = incremental_of(&mut self.incremental, savepoint) {
                    // Incremental: planned and handed off per slice.
                    let slices = incremental.ledger.hand_off_cow(checkpoint, states);
                    return Ok(TakenState::Deferred(Box::new(slices)));
                }
                let plan = plan_of(&mut self.incremental, checkpoint, savepoint, &*states);
                let handoff = states.hand_off_key_groups(|key_group| plan.writes(key_group));
                // With incremental checkpoints on, this full snapshot is
                // a savepoint's, which must leave the flags to the next
                // incremental checkpoint.
                if forgets_changes(&self.incremental, savepoint) {
                    states.clear_dirty();
                }
                (plan, Box::new(handoff))
            }
            #[cfg(feature = "spill")]
            KeyedStore::Spilling(states) => {
                let plan = match incremental_of(&mut self.incremental, savepoint) {
                    // Incremental: changed groups as delta parts on their
                    // chains where the ledger allows it.
                    Some(incremental) => incremental.ledger.plan_chained(
                        checkpoint,
                        states.key_groups(),
                        states.changed_key_groups(),
                        states.epoch(),
                    ),
                    None => SnapshotPlan::full(states.key_groups()),
                };
                let snapshot = states.snapshot_with_deltas(
                    &mut |key_group| plan.writes(key_group),
                    &mut |key_group| plan.writes_delta(key_group),
                )?;
                if forgets_changes(&self.incremental, savepoint) {
                    states.forget_changes();
                }
                (plan, Box::new(snapshot))
            }
        };
        let state: Box<dyn DeferredState> = Box::new(plan.with_parts(parts));
        Ok(TakenState::Deferred(state))
    }

    fn on_complete(&mut self, checkpoint: CheckpointId) -> Result<(), BoxError> {
        if let Some(incremental) = &mut self.incremental {
            incremental.ledger.on_complete(checkpoint);
        }
        Ok(())
    }

    fn capture(&mut self) -> Result<Vec<u8>, BoxError> {
        // Encoding keyed state has no side effect.
        self.snapshot(CheckpointId(0))
    }

    fn restore(&mut self, state: Option<&[u8]>) -> Result<(), BoxError> {
        if let Some(incremental) = &mut self.incremental {
            // Restored state was written by another instance: nothing of
            // it may be referred to, so the first checkpoint is full.
            incremental.ledger.reset();
        }
        let Some(state) = state else {
            return Ok(());
        };
        self.states.restore(
            decode_keyed_state(state)?,
            self.copy_on_write_threshold_keys,
        )
    }

    fn on_end(&mut self, _out: &mut Collector<'_, Out>) -> Result<(), BoxError> {
        if let Some(publish) = &self.publish {
            let mut published = publish
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let mut states = HashMap::new();
            self.states.for_each(|key, state| {
                states.insert(key.clone(), state.clone());
            })?;
            published.insert(self.subtask, states);
        }
        Ok(())
    }
}

/// The incremental bookkeeping when a snapshot is written incrementally
/// (incremental checkpoints on, and not a `savepoint`).
fn incremental_of(
    incremental: &mut Option<Incremental>,
    savepoint: bool,
) -> Option<&mut Incremental> {
    incremental.as_mut().filter(|_| !savepoint)
}

/// Whether a snapshot (a `savepoint` or not) may clear the state's dirty
/// flags (forget which key groups and slices changed). Not for a savepoint
/// while incremental checkpoints are on: a savepoint is written whole and
/// is not part of the incremental chain, so the ledger still holds the
/// last checkpoint's ranges, and the next incremental checkpoint must
/// write everything that changed since that checkpoint, including what
/// changed before the savepoint. Clearing the flags there would make it
/// refer to older bytes of those key groups, and a job resumed from it
/// would lose their updates. The flat layout's full snapshot
/// (`full_segments`) never clears them.
fn forgets_changes(incremental: &Option<Incremental>, savepoint: bool) -> bool {
    !(savepoint && incremental.is_some())
}

/// What a snapshot of `states` for `checkpoint` writes and what it refers
/// to: the changed key groups (and those not yet confirmed) with
/// incremental checkpoints, every group for a full one or a savepoint.
fn plan_of(
    incremental: &mut Option<Incremental>,
    checkpoint: CheckpointId,
    savepoint: bool,
    states: &impl KeyGroupSnapshots,
) -> SnapshotPlan {
    match incremental_of(incremental, savepoint) {
        Some(incremental) => {
            let changed = states.changed_key_groups();
            incremental
                .ledger
                .plan(checkpoint, states.key_groups(), changed)
        }
        _ => SnapshotPlan::full(states.key_groups()),
    }
}

/// The copy-on-write state's batch loop, out of line so that the keyed
/// core's `process` keeps only the flat table's loop inline (as the
/// spilling backend's below).
#[inline(never)]
fn cow_batch<K, S, In, Out, F, KF>(
    states: &mut crate::keyed::CowKeyedState<K, S>,
    key_of: &KF,
    function: &F,
    batch: Vec<In>,
    out: &mut Collector<'_, Out>,
) -> Result<(), BoxError>
where
    K: Key,
    S: Snapshot + Default,
    Out: Send + 'static,
    F: Fn(&K, &mut S, In, &mut Collector<'_, Out>) -> Result<(), BoxError> + ?Sized,
    KF: Fn(&In) -> K + ?Sized,
{
    // Each record's key is taken and its lookup's memory asked for
    // `PREFETCH_DISTANCE` records before the record is processed, so that
    // the lookups' cache misses overlap (keyed/slice_table.rs says why).
    let mut ahead = VecDeque::with_capacity(PREFETCH_DISTANCE);
    for record in batch {
        let key = key_of(&record);
        let hash = key_hash(&key);
        let index = states.prefetch_routed(hash);
        if ahead.len() == PREFETCH_DISTANCE {
            if let Some((record, key, hash, index)) = ahead.pop_front() {
                let state = states.get_or_default_at(&key, hash, index);
                function(&key, state, record, out)?;
            }
        }
        ahead.push_back((record, key, hash, index));
    }
    for (record, key, hash, index) in ahead {
        let state = states.get_or_default_at(&key, hash, index);
        function(&key, state, record, out)?;
    }
    Ok(())
}

/// How many records ahead the copy-on-write batch loop prefetches: enough
/// to overlap several lookups' cache misses, few enough that the lines
/// are still cached when their record comes.
const PREFETCH_DISTANCE: usize = 8;

/// The spilling backend's batch loop, out of line so that the keyed core's
/// `process` keeps only the in-memory loop inline (a second loop in it
/// measured slower on the keyed count, by code layout).
#[cfg(feature = "spill")]
#[inline(never)]
fn spilling_batch<K, S, In, Out, F, KF>(
    states: &mut crate::keyed::spill::SpillingState<K, S>,
    key_of: &KF,
    function: &F,
    batch: Vec<In>,
    out: &mut Collector<'_, Out>,
) -> Result<(), BoxError>
where
    K: Key,
    S: Snapshot + Default,
    Out: Send + 'static,
    F: Fn(&K, &mut S, In, &mut Collector<'_, Out>) -> Result<(), BoxError> + ?Sized,
    KF: Fn(&In) -> K + ?Sized,
{
    for record in batch {
        let key = key_of(&record);
        let state = states.get_or_default_routed(&key, key_hash(&key))?;
        function(&key, state, record, out)?;
    }
    Ok(states.enforce_budget()?)
}

/// The per-key state of [`KeyedStream::reduce`](super::KeyedStream::reduce):
/// the reduced value so far, `None` before the key's first record.
#[derive(crate::Snapshot, Clone)]
#[snapshot(crate = "crate")]
pub(crate) struct Reduced<T> {
    pub(crate) value: Option<T>,
}

impl<T> Default for Reduced<T> {
    fn default() -> Self {
        Reduced { value: None }
    }
}

/// The length of the header that precedes an [`Operator`]'s state blob in
/// its part: the checkpoint id and the ended flag.
const OPERATOR_HEADER_LEN: usize = 9;

/// Why an [`Operator`]'s stored state does not split into its header and
/// its blob. Never retryable: the bytes stay what they are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum OperatorPartError {
    /// Fewer bytes than the header.
    #[error("an operator's state part is shorter than its header ({length} bytes)")]
    TooShort {
        /// How many bytes there were.
        length: usize,
    },
    /// The ended flag is neither 0 nor 1.
    #[error("an operator's state part has a bad ended flag {flag}")]
    BadEndedFlag {
        /// The byte found.
        flag: u8,
    },
}

/// An [`Operator`]'s stored state, split: the header, and the blob of the
/// instance (not decoded yet, so that the caller picks the type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OperatorPart<'a> {
    /// The checkpoint the state belongs to.
    pub(crate) checkpoint: u64,
    /// Whether the input had ended (so `on_end_of_input` already ran).
    pub(crate) ended: bool,
    /// The instance as a [`blob`].
    pub(crate) blob: &'a [u8],
}

/// The stored bytes of an [`Operator`]'s state: the checkpoint id
/// (little-endian `u64`), the ended flag (one byte) and the instance's
/// blob. This and [`decode_operator_part`] are the only places that know
/// this layout; the operator core and `job::inspect` go through them.
pub(crate) fn encode_operator_part<O: Operator>(
    checkpoint: u64,
    ended: bool,
    operator: &O,
) -> Result<Vec<u8>, StateError> {
    let mut bytes = checkpoint.to_le_bytes().to_vec();
    bytes.push(u8::from(ended));
    bytes.extend_from_slice(&blob::encode(operator)?);
    Ok(bytes)
}

/// Splits bytes written by [`encode_operator_part`] into header and blob.
pub(crate) fn decode_operator_part(bytes: &[u8]) -> Result<OperatorPart<'_>, OperatorPartError> {
    let (header, blob_bytes) =
        bytes
            .split_first_chunk::<OPERATOR_HEADER_LEN>()
            .ok_or(OperatorPartError::TooShort {
                length: bytes.len(),
            })?;
    let [checkpoint @ .., flag] = header;
    let ended = match *flag {
        0 => false,
        1 => true,
        flag => return Err(OperatorPartError::BadEndedFlag { flag }),
    };
    Ok(OperatorPart {
        checkpoint: u64::from_le_bytes(*checkpoint),
        ended,
        blob: blob_bytes,
    })
}

/// The stored states (as written by [`encode_operator_part`]) of the old
/// subtasks of operator `O`, in subtask order, redistributed over
/// `parallelism` new subtasks by [`Operator::rescale`]. The new parts keep
/// the old parts' checkpoint id and ended flag. The error says why the
/// state cannot be redistributed.
pub(crate) fn rescale_operator_states<O: Operator>(
    states: &[Vec<u8>],
    parallelism: usize,
) -> Result<Vec<Vec<u8>>, String> {
    let mut instances = Vec::with_capacity(states.len());
    let (mut checkpoint, mut ended) = (0, None);
    for state in states {
        let part = decode_operator_part(state).map_err(|error| error.to_string())?;
        if *ended.get_or_insert(part.ended) != part.ended {
            return Err(
                "some old subtasks had seen the end of their input and some had not".into(),
            );
        }
        instances.push(blob::decode::<O>(part.blob).map_err(|error| error.to_string())?);
        checkpoint = part.checkpoint;
    }
    let ended = ended.unwrap_or(false);
    let rescaled = O::rescale(instances, parallelism)
        .ok_or("its operator does not redistribute its state (`Operator::rescale`)")?;
    if rescaled.len() != parallelism {
        return Err(format!(
            "`Operator::rescale` returned {} instances for {parallelism} subtasks",
            rescaled.len()
        ));
    }
    rescaled
        .iter()
        .map(|instance| {
            encode_operator_part(checkpoint, ended, instance).map_err(|error| error.to_string())
        })
        .collect()
}

/// The core of a user [`Operator`]: its state is the instance itself,
/// stored after a header (see [`encode_operator_part`]): the checkpoint id,
/// so that [`Operator::on_restore`] learns it, and whether the input had
/// ended. A restore from a checkpoint taken after the end of
/// input does not call [`Operator::on_end_of_input`] again: what it
/// emitted reached every downstream snapshot of that checkpoint, so a
/// second call would emit it twice.
pub(crate) struct OperatorCore<O> {
    pub(crate) operator: O,
    pub(crate) ended: bool,
    /// The requests of the operator's [`SnapshotStarter`](crate::job::snapshots::SnapshotStarter).
    pub(crate) requests: Option<Arc<Requests>>,
}

impl<O: Operator> Core<O::In, O::Out> for OperatorCore<O> {
    fn process(
        &mut self,
        batch: Vec<O::In>,
        out: &mut Collector<'_, O::Out>,
    ) -> Result<(), BoxError> {
        for record in batch {
            self.operator.on_record(record, out)?;
        }
        Ok(())
    }

    fn snapshot(&mut self, checkpoint: CheckpointId) -> Result<Vec<u8>, BoxError> {
        self.operator.on_checkpoint(checkpoint.0)?;
        Ok(encode_operator_part(
            checkpoint.0,
            self.ended,
            &self.operator,
        )?)
    }

    fn restore(&mut self, state: Option<&[u8]>) -> Result<(), BoxError> {
        let Some(state) = state else {
            return Ok(());
        };
        let part = decode_operator_part(state)?;
        self.ended = part.ended;
        let restored: O = blob::decode(part.blob)?;
        self.operator.restore_from(restored);
        self.operator.on_restore(part.checkpoint)
    }

    fn on_complete(&mut self, checkpoint: CheckpointId) -> Result<(), BoxError> {
        self.operator.on_checkpoint_complete(checkpoint.0)
    }

    fn capture(&mut self) -> Result<Vec<u8>, BoxError> {
        // Checkpoint id 0: no checkpoint; `on_checkpoint` does not run.
        Ok(encode_operator_part(0, self.ended, &self.operator)?)
    }

    fn waiting(&self) -> Waiting {
        self.operator.waiting()
    }

    fn snapshot_requests(&self) -> Option<Arc<Requests>> {
        self.requests.clone()
    }

    fn on_end(&mut self, out: &mut Collector<'_, O::Out>) -> Result<(), BoxError> {
        if self.ended {
            return Ok(());
        }
        self.ended = true;
        self.operator.on_end_of_input(out)
    }

    fn on_watermark(
        &mut self,
        watermark_ms: u64,
        out: &mut Collector<'_, O::Out>,
    ) -> Result<(), BoxError> {
        self.operator.on_watermark(watermark_ms, out)
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

    fn bytes_written(&self) -> Option<u64> {
        self.sink.as_ref().and_then(|sink| sink.bytes_written())
    }
}

#[cfg(test)]
mod tests {
    //! The stored form of an [`Operator`]'s part: a round trip keeps the
    //! state, the checkpoint id and the ended flag; a damaged header is an
    //! error, not a panic. The keyed envelope merges across subtasks.

    use super::*;

    #[derive(crate::Snapshot, Default, Debug, PartialEq)]
    #[snapshot(crate = "crate")]
    struct Counter {
        count: u64,
        restored_from: Option<u64>,
    }

    impl Operator for Counter {
        type In = u64;
        type Out = u64;

        fn on_record(&mut self, _: u64, _: &mut Collector<'_, u64>) -> Result<(), BoxError> {
            self.count += 1;
            Ok(())
        }

        fn on_restore(&mut self, checkpoint: u64) -> Result<(), BoxError> {
            self.restored_from = Some(checkpoint);
            Ok(())
        }

        /// Counts add up: all of them go to the new subtask 0.
        fn rescale(old: Vec<Self>, parallelism: usize) -> Option<Vec<Self>> {
            let mut new: Vec<Self> = (0..parallelism).map(|_| Counter::default()).collect();
            new.first_mut()?.count = old.iter().map(|counter| counter.count).sum();
            Some(new)
        }
    }

    /// The stored states of subtasks with these counts and ended flags, at
    /// checkpoint 42.
    fn stored(subtasks: &[(u64, bool)]) -> Vec<Vec<u8>> {
        subtasks
            .iter()
            .map(|&(count, ended)| {
                core(count, ended)
                    .snapshot(CheckpointId(42))
                    .expect("a snapshot")
            })
            .collect()
    }

    /// Each rescaled part as (count, checkpoint id, ended).
    fn rescaled(states: &[Vec<u8>], parallelism: usize) -> Result<Vec<(u64, u64, bool)>, String> {
        let parts = rescale_operator_states::<Counter>(states, parallelism)?;
        Ok(parts
            .iter()
            .map(|bytes| {
                let part = decode_operator_part(bytes).expect("a rescaled part decodes");
                let counter: Counter = blob::decode(part.blob).expect("its blob decodes");
                (counter.count, part.checkpoint, part.ended)
            })
            .collect())
    }

    #[test]
    fn rescaling_keeps_the_checkpoint_and_the_ended_flag() {
        let running = stored(&[(3, false), (4, false)]);
        assert_eq!(
            rescaled(&running, 3),
            Ok(vec![(7, 42, false), (0, 42, false), (0, 42, false)])
        );
        let ended = stored(&[(3, true), (4, true), (5, true)]);
        assert_eq!(rescaled(&ended, 1), Ok(vec![(12, 42, true)]));
    }

    #[test]
    fn rescaling_refuses_mixed_ends_of_input() {
        let mixed = stored(&[(3, true), (4, false)]);
        let error = rescaled(&mixed, 3).expect_err("mixed ends are refused");
        assert!(error.contains("end of their input"), "{error}");
    }

    fn core(count: u64, ended: bool) -> OperatorCore<Counter> {
        OperatorCore {
            operator: Counter {
                count,
                restored_from: None,
            },
            ended,
            requests: None,
        }
    }

    fn check_round_trip(ended: bool) {
        let bytes = core(7, ended)
            .snapshot(CheckpointId(42))
            .expect("a snapshot");
        let mut restored = core(0, false);
        restored.restore(Some(&bytes)).expect("a restore");
        assert_eq!(restored.operator.count, 7);
        assert_eq!(restored.operator.restored_from, Some(42));
        assert_eq!(restored.ended, ended);
    }

    fn check_damaged(bytes: &[u8]) {
        let error = core(0, false)
            .restore(Some(bytes))
            .expect_err("a damaged part is rejected");
        assert!(!error.to_string().is_empty());
    }

    #[test]
    fn a_running_operator_round_trips() {
        check_round_trip(false);
    }

    #[test]
    fn an_ended_operator_round_trips() {
        check_round_trip(true);
    }

    #[test]
    fn a_part_shorter_than_its_header_is_an_error() {
        check_damaged(&[1, 2, 3]);
    }

    #[test]
    fn a_bad_ended_flag_is_an_error() {
        let mut bytes = core(1, false)
            .snapshot(CheckpointId(1))
            .expect("a snapshot");
        bytes[OPERATOR_HEADER_LEN - 1] = 2;
        check_damaged(&bytes);
        assert_eq!(
            decode_operator_part(&bytes),
            Err(OperatorPartError::BadEndedFlag { flag: 2 })
        );
    }

    #[test]
    fn the_operator_part_decoder_reads_what_the_core_wrote() {
        let bytes = core(5, true).snapshot(CheckpointId(9)).expect("a snapshot");
        let part = decode_operator_part(&bytes).expect("splits");
        assert_eq!((part.checkpoint, part.ended), (9, true));
        let counter: Counter = blob::decode(part.blob).expect("a Counter");
        assert_eq!(counter.count, 5);
        assert_eq!(
            decode_operator_part(&bytes[..3]),
            Err(OperatorPartError::TooShort { length: 3 })
        );
    }

    #[test]
    fn merged_keyed_states_hold_every_key_group_once() {
        let first = encode_keyed_state(&[(0, vec![1]), (1, vec![2])]).expect("encodes");
        let second = encode_keyed_state(&[(2, vec![3])]).expect("encodes");
        let merged = merge_keyed_states(&[first, second]).expect("merges");
        assert_eq!(
            decode_keyed_state(&merged).expect("decodes"),
            [(0, vec![1]), (1, vec![2]), (2, vec![3])]
        );
        assert!(merge_keyed_states(&[vec![0xff]]).is_err());
    }

    #[test]
    fn a_damaged_state_blob_is_an_error() {
        let mut bytes = core(1, false)
            .snapshot(CheckpointId(1))
            .expect("a snapshot");
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        check_damaged(&bytes);
    }
}
