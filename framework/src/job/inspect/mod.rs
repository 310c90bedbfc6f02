//! Reading a completed checkpoint or savepoint of a job: per operator and
//! subtask, its state decoded as the user's types, a source's position,
//! and recorded channel states decoded as records.
//!
//! This module owns the public, typed view of what the job layer stores in
//! a checkpoint. It knows the part layout only through the job shell's own
//! encode and decode functions (`PartBytes`, `decode_channel`), so the
//! layout is written down once. It never writes, commits or deletes a
//! checkpoint, and it never restores a running job: it only reads.
//!
//! What each operator stores, and how to read it:
//!
//! | operator | state bytes | read with |
//! |---|---|---|
//! | keyed process | per-key states by key group | [`CheckpointView::keyed_state`] |
//! | source | the next record's position | [`CheckpointView::source_positions`] |
//! | sink | its pre-commit state | [`PartView::sink_state`] |
//! | custom [`Operator`] | a header (checkpoint id, ended flag), then the instance as a blob | [`CheckpointView::operator_states`], [`PartView::operator_state`] |
//! | map, filter, flat_map | nothing | — |
//! | a state written with [`crate::state::blob::encode`] | a blob | [`PartView::state`] |
//!
//! Tools without the job's types describe a part instead:
//! [`PartView::stored_state`] (the stored schema of every state blob,
//! key groups, timers), [`PartView::stored_position`] (a built-in
//! source's index, the Kafka source's offsets per partition) and
//! [`PartView::stored_sink_state`] (the built-in sinks' pending
//! transactions).
//!
//! Recorded channel states (unaligned checkpoints, and the feedback edges
//! of loops) are per receiving subtask and input channel:
//! [`PartView::channel_records`] and [`CheckpointView::channel_records`].
//!
//! The state layouts inside a part are likewise read only through the
//! decoders next to their writers in `ops.rs`: the keyed operator's
//! envelope around its key-group parts, and a custom operator's header.
//!
//! Every decoding step returns a typed [`InspectError`] on bad bytes; none
//! panics. Parts read through the store are already verified by its
//! checksums, so a damaged file shows as [`InspectError::Store`].
//!
//! ```
//! use std::sync::Arc;
//! use snapflow::job::inspect::CheckpointView;
//! use snapflow::job::{Job, JobConfig};
//! use snapflow::sink::CollectHandle;
//! use snapflow::source::VecSourceFactory;
//! use snapflow::storage::{CheckpointStore, MemoryCheckpointStore};
//!
//! #[derive(snapflow::Snapshot, Default, Clone, Debug, PartialEq)]
//! struct Count {
//!     seen: u64,
//! }
//!
//! let store = Arc::new(MemoryCheckpointStore::new("inspect-doc")?);
//! let config = JobConfig { store: Some(store.clone()), ..JobConfig::default() };
//! let job = Job::new("inspect-doc", config);
//! job.source("numbers", VecSourceFactory::new((0..30_u64).collect()))
//!     .key_by(|n: &u64| n % 3)
//!     .process("count", |_key: &u64, state: &mut Count, _n: u64, out| {
//!         state.seen += 1;
//!         out.emit(state.seen);
//!         Ok(())
//!     })
//!     .sink("out", CollectHandle::new());
//! job.run()?;
//!
//! // The final checkpoint of the bounded job holds every key's count.
//! let view = CheckpointView::latest(store.as_ref())?;
//! let counts = view.keyed_state::<u64, Count>("count")?;
//! assert_eq!(counts.len(), 3);
//! assert!(counts.values().all(|count| count.seen == 10));
//! // The source's position is the index of its next record: the end.
//! assert_eq!(view.source_positions("numbers")?[0].to_index()?, 30);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::de::DeserializeOwned;

use crate::keyed::{parts_in_range, KeyedError, KeyedState, MaxParallelism, StateKey};
use crate::sink::SinkState;
use crate::source::SourcePosition;
use crate::state::{blob, Snapshot, StateError};
use crate::storage::{
    load_checkpoint_dir, CheckpointId, CheckpointKind, CheckpointMetadata, CheckpointStore,
    LoadedCheckpoint, PartId, StoreError,
};

mod connector_state;
mod layout;

pub(crate) use connector_state::role_key;
pub use connector_state::{
    describe_position, describe_sink_state, KafkaPartitionPosition, KafkaPendingTransaction,
    OperatorRole, StagedFile, StoredPosition, StoredSinkState,
};
pub use layout::{describe_state, StoredState};

use super::operator::Operator;
use super::ops::{decode_keyed_state, decode_operator_part, OperatorPart};
use super::shell::{decode_channel, InputItem, PartBytes};

/// Why a checkpoint could not be read or decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InspectError {
    /// The store could not load the checkpoint (I/O, or a part or the
    /// metadata fails its checksum).
    #[error("checkpoint store: {0}")]
    Store(#[from] StoreError),
    /// The store holds no complete checkpoint.
    #[error("the store holds no complete checkpoint")]
    NoCheckpoint,
    /// The checkpoint has no part of this operator.
    #[error("checkpoint {checkpoint} has no operator `{operator}`")]
    UnknownOperator {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The operator asked for.
        operator: String,
    },
    /// The checkpoint has no such part (subtask).
    #[error("checkpoint {checkpoint} has no part {part}")]
    UnknownPart {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The part asked for.
        part: PartId,
    },
    /// A part's bytes are not a part of the job layer.
    #[error("part {part} does not decode: {reason}")]
    MalformedPart {
        /// The part.
        part: PartId,
        /// What the decoder said.
        reason: String,
    },
    /// A part has no recorded state for this input channel.
    #[error("part {part} recorded no input channel {channel}")]
    UnknownChannel {
        /// The part.
        part: PartId,
        /// The channel asked for.
        channel: u32,
    },
    /// A recorded channel state does not decode as the records asked for.
    #[error("part {part}, input channel {channel}: the records do not decode: {reason}")]
    MalformedChannel {
        /// The part.
        part: PartId,
        /// The input channel.
        channel: u32,
        /// What the decoder said.
        reason: String,
    },
    /// [`PartView::state`] was asked for a part that holds a custom
    /// [`Operator`]'s state, which is stored after a header of its own.
    #[error(
        "part {part} holds a custom operator's state: read it with \
         `PartView::operator_state` or `CheckpointView::operator_states`"
    )]
    OperatorPart {
        /// The part.
        part: PartId,
    },
    /// A state blob does not decode as the type asked for (corrupt, or
    /// another type or version without an upgrade path).
    #[error("part {part}: {source}")]
    State {
        /// The part.
        part: PartId,
        /// What the state layer said.
        #[source]
        source: StateError,
    },
    /// A keyed state does not decode as the key and state types asked for,
    /// or its key groups do not fit the checkpoint's layout.
    #[error("part {part}: keyed state: {source}")]
    Keyed {
        /// The part.
        part: PartId,
        /// What the keyed layer said.
        #[source]
        source: KeyedError,
    },
    /// The checkpoint's metadata does not describe its key groups (no or
    /// an invalid max parallelism), so keyed state cannot be placed.
    #[error("checkpoint {checkpoint} records an invalid max parallelism {max_parallelism}")]
    NoKeyGroupLayout {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// What the metadata says.
        max_parallelism: u32,
    },
}

impl InspectError {
    /// Whether reading again could succeed: only a transient store error.
    /// Bad bytes stay bad.
    pub fn is_retryable(&self) -> bool {
        match self {
            InspectError::Store(error) => error.is_retryable(),
            _ => false,
        }
    }
}

/// One subtask's part of a checkpoint, decoded from the stored layout but
/// not yet into the user's types.
#[derive(Debug, Clone)]
pub struct PartView {
    id: PartId,
    /// The operator state (a source's position, a sink's pre-commit state).
    state: Vec<u8>,
    /// Recorded channel states: (input channel, stored batches).
    channels: Vec<(u32, Vec<u8>)>,
}

impl PartView {
    fn decode(id: PartId, bytes: &[u8]) -> Result<PartView, InspectError> {
        let part = PartBytes::decode(bytes).map_err(|error| InspectError::MalformedPart {
            part: id.clone(),
            reason: error.to_string(),
        })?;
        Ok(PartView {
            id,
            state: part.state,
            channels: part.channels,
        })
    }

    /// The operator and subtask this part belongs to.
    pub fn id(&self) -> &PartId {
        &self.id
    }

    /// The operator state as stored (see the [module docs](self) for what
    /// each operator writes).
    pub fn state_bytes(&self) -> &[u8] {
        &self.state
    }

    /// The operator state decoded as a state blob of type `S`, checked
    /// against `S`'s schema (or upgraded along its declared chain).
    ///
    /// # Errors
    ///
    /// [`InspectError::OperatorPart`] when the part is a custom
    /// [`Operator`]'s (read it with [`PartView::operator_state`]);
    /// [`InspectError::State`] when the bytes are not a blob of `S`.
    pub fn state<S: Snapshot>(&self) -> Result<S, InspectError> {
        blob::decode(&self.state).map_err(|source| {
            if self.is_operator_part() {
                InspectError::OperatorPart {
                    part: self.id.clone(),
                }
            } else {
                InspectError::State {
                    part: self.id.clone(),
                    source,
                }
            }
        })
    }

    /// Whether the state looks like a custom [`Operator`]'s: its header
    /// decodes and a state blob (by its magic) follows it. Asked only after
    /// the bytes failed to decode as a plain blob, which starts with the
    /// magic itself.
    fn is_operator_part(&self) -> bool {
        decode_operator_part(&self.state).is_ok_and(|part| part.blob.starts_with(&blob::MAGIC))
    }

    /// The state of a custom [`Operator`] subtask: the instance as it was
    /// encoded at the checkpoint, checked against `O`'s schema (or
    /// upgraded along its declared chain). Its `#[snapshot(skip)]` fields
    /// hold their defaults, as in the instance a restore decodes before
    /// [`Operator::restore_from`].
    ///
    /// # Errors
    ///
    /// [`InspectError::MalformedPart`] when the state is not an operator's
    /// (its header is short or damaged); [`InspectError::State`] when the
    /// instance does not decode as `O`.
    pub fn operator_state<O: Operator>(&self) -> Result<O, InspectError> {
        let part = self.operator_part()?;
        blob::decode(part.blob).map_err(|source| InspectError::State {
            part: self.id.clone(),
            source,
        })
    }

    /// Whether a custom [`Operator`] subtask's input had ended when the
    /// checkpoint was taken (so a restore from it does not call
    /// [`Operator::on_end_of_input`] again).
    ///
    /// # Errors
    ///
    /// [`InspectError::MalformedPart`] when the state is not an operator's.
    pub fn operator_ended(&self) -> Result<bool, InspectError> {
        Ok(self.operator_part()?.ended)
    }

    fn operator_part(&self) -> Result<OperatorPart<'_>, InspectError> {
        decode_operator_part(&self.state).map_err(|error| InspectError::MalformedPart {
            part: self.id.clone(),
            reason: error.to_string(),
        })
    }

    /// What the state bytes hold, described without their types (see
    /// [`StoredState`]): for tools that show a checkpoint.
    pub fn stored_state(&self) -> StoredState {
        describe_state(&self.state)
    }

    /// The position a source subtask stored: the position of the next
    /// record it would have read. Only meaningful for a source's part;
    /// the built-in sources' positions read back with
    /// [`SourcePosition::to_index`].
    pub fn source_position(&self) -> SourcePosition {
        SourcePosition::from_bytes(self.state.clone())
    }

    /// A source subtask's position described without its type (see
    /// [`StoredPosition`]): for tools that show a checkpoint. Only
    /// meaningful for a source's part.
    pub fn stored_position(&self) -> StoredPosition {
        describe_position(&self.state)
    }

    /// A sink subtask's state described without its type (see
    /// [`StoredSinkState`]); `None` when it stored no bytes. Only
    /// meaningful for a sink's part.
    pub fn stored_sink_state(&self) -> Option<StoredSinkState> {
        describe_sink_state(&self.state)
    }

    /// The state a sink subtask pre-committed. Only meaningful for a
    /// sink's part; the built-in sinks' state reads back with
    /// [`crate::sink::PendingTransactions::decode`].
    pub fn sink_state(&self) -> SinkState {
        SinkState::from_bytes(self.state.clone())
    }

    /// The input channels with a recorded state (possibly empty), in the
    /// order stored.
    pub fn channels(&self) -> impl Iterator<Item = u32> + '_ {
        self.channels.iter().map(|(channel, _)| *channel)
    }

    /// The records recorded on input `channel`, oldest first. The records
    /// were in flight when the snapshot was taken; a restore delivers them
    /// before any new input. Watermarks and idleness marks recorded among
    /// them (a restore applies those in their place too) are left out.
    ///
    /// # Errors
    ///
    /// [`InspectError::UnknownChannel`] when nothing was recorded for
    /// `channel`; [`InspectError::MalformedChannel`] when the records do not
    /// decode as `T`.
    pub fn channel_records<T: DeserializeOwned>(
        &self,
        channel: u32,
    ) -> Result<Vec<T>, InspectError> {
        let (_, bytes) = self
            .channels
            .iter()
            .find(|(stored, _)| *stored == channel)
            .ok_or_else(|| InspectError::UnknownChannel {
                part: self.id.clone(),
                channel,
            })?;
        let items = decode_channel::<T>(bytes).map_err(|error| InspectError::MalformedChannel {
            part: self.id.clone(),
            channel,
            reason: error.to_string(),
        })?;
        // The time marks recorded among the records are not records.
        Ok(items
            .into_iter()
            .flat_map(|item| match item {
                InputItem::Records(batch) => batch,
                InputItem::Watermark(_) | InputItem::Idle => Vec::new(),
            })
            .collect())
    }

    /// Every recorded record of every input channel, channel by channel in
    /// the order stored.
    ///
    /// # Errors
    ///
    /// As [`PartView::channel_records`].
    pub fn all_channel_records<T: DeserializeOwned>(&self) -> Result<Vec<T>, InspectError> {
        let mut records = Vec::new();
        for channel in self.channels() {
            records.extend(self.channel_records::<T>(channel)?);
        }
        Ok(records)
    }

    /// The keyed state of this subtask, as the keyed operator writes it,
    /// restored for the key groups its subtask's range covers. With
    /// `Groups::InRange`, groups outside that range are skipped (the parts
    /// a rescale maps onto a subtask hold every overlapping old subtask's
    /// groups); with `Groups::Exact` they are an error, as in a stored part.
    fn keyed_state<K: StateKey, S: Snapshot>(
        &self,
        max_parallelism: MaxParallelism,
        parallelism: u32,
        groups: Groups,
    ) -> Result<KeyedState<K, S>, InspectError> {
        let keyed = |source| InspectError::Keyed {
            part: self.id.clone(),
            source,
        };
        let key_groups =
            decode_keyed_state(&self.state).map_err(|error| InspectError::MalformedPart {
                part: self.id.clone(),
                reason: format!("keyed state: {error}"),
            })?;
        let range = max_parallelism
            .range_for_subtask(parallelism, self.id.subtask)
            .map_err(|error| keyed(KeyedError::from(error)))?;
        match groups {
            Groups::Exact => KeyedState::restore(max_parallelism, range, key_groups),
            Groups::InRange => {
                KeyedState::restore(max_parallelism, range, parts_in_range(range, key_groups))
            }
        }
        .map_err(keyed)
    }
}

/// Which key groups a part's keyed state may hold (see
/// [`PartView::keyed_state`]).
#[derive(Clone, Copy)]
enum Groups {
    /// Exactly its subtask's range: a part as the store holds it.
    Exact,
    /// At least its range: a part as a rescaling restore maps it.
    InRange,
}

/// Per subtask index, every key's state.
pub(crate) type SubtaskStates<K, S> = Vec<(u32, HashMap<K, S>)>;

/// Every key's state in each of `parts` (one keyed operator's parts, one
/// per subtask), by subtask index, each checked against the key groups
/// its subtask owns.
fn keyed_states_by_subtask<K: StateKey, S: Snapshot>(
    parts: &[&PartView],
    max_parallelism: MaxParallelism,
    groups: Groups,
) -> Result<SubtaskStates<K, S>, InspectError> {
    // Every subtask writes one part, so the parts are the parallelism (a
    // subtask index beyond it fails the range check).
    let parallelism = u32::try_from(parts.len()).unwrap_or(u32::MAX);
    parts
        .iter()
        .map(|part| {
            let mut keyed: KeyedState<K, S> =
                part.keyed_state(max_parallelism, parallelism, groups)?;
            let keys: Vec<K> = keyed.iter().map(|(key, _)| key.clone()).collect();
            let states = keys
                .into_iter()
                .filter_map(|key| keyed.remove(&key).map(|state| (key, state)))
                .collect();
            Ok((part.id.subtask, states))
        })
        .collect()
}

/// Every key's state of keyed operator `operator` in `parts`, the parts
/// of a restored checkpoint as the job's plan maps them onto its subtasks,
/// by subtask: what each subtask would publish at the end of its input.
/// A job that resumes from its own final checkpoint runs nothing, so its
/// state handles are filled from here (`job::physical::PublishRestored`).
pub(crate) fn restored_keyed_states<K: StateKey, S: Snapshot>(
    operator: &str,
    parts: &BTreeMap<PartId, Vec<u8>>,
    max_parallelism: MaxParallelism,
) -> Result<SubtaskStates<K, S>, InspectError> {
    let views = parts
        .iter()
        .filter(|(id, _)| id.operator == operator)
        .map(|(id, bytes)| PartView::decode(id.clone(), bytes))
        .collect::<Result<Vec<PartView>, InspectError>>()?;
    let views: Vec<&PartView> = views.iter().collect();
    keyed_states_by_subtask(&views, max_parallelism, Groups::InRange)
}

/// A completed checkpoint or savepoint, read back and split into its
/// subtasks' parts. Build it with [`CheckpointView::latest`],
/// [`CheckpointView::load`], [`CheckpointView::open_dir`] (a moved
/// savepoint directory) or [`CheckpointView::from_parts`].
#[derive(Debug, Clone)]
pub struct CheckpointView {
    metadata: CheckpointMetadata,
    parts: BTreeMap<PartId, PartView>,
}

impl CheckpointView {
    /// The newest checkpoint or savepoint in `store` that verifies in full
    /// (the one a restarted job would restore).
    ///
    /// # Errors
    ///
    /// [`InspectError::NoCheckpoint`] when there is none; store and decode
    /// errors otherwise.
    pub fn latest(store: &dyn CheckpointStore) -> Result<CheckpointView, InspectError> {
        let loaded = store
            .load_latest()?
            .checkpoint
            .ok_or(InspectError::NoCheckpoint)?;
        CheckpointView::from_loaded(loaded)
    }

    /// Checkpoint or savepoint `checkpoint` of `store`.
    ///
    /// # Errors
    ///
    /// [`InspectError::Store`] when it does not exist or does not verify.
    pub fn load(
        store: &dyn CheckpointStore,
        checkpoint: CheckpointId,
    ) -> Result<CheckpointView, InspectError> {
        CheckpointView::from_loaded(store.load(checkpoint)?)
    }

    /// The checkpoint or savepoint in directory `dir` (for example a
    /// savepoint directory moved elsewhere).
    ///
    /// # Errors
    ///
    /// [`InspectError::Store`] when it does not load or verify.
    pub fn open_dir(dir: impl AsRef<Path>) -> Result<CheckpointView, InspectError> {
        CheckpointView::from_loaded(load_checkpoint_dir(dir.as_ref())?)
    }

    /// A checkpoint loaded through the store API.
    ///
    /// # Errors
    ///
    /// [`InspectError::MalformedPart`] when a part is not a part of the job
    /// layer.
    pub fn from_loaded(loaded: LoadedCheckpoint) -> Result<CheckpointView, InspectError> {
        CheckpointView::from_parts(loaded.metadata, loaded.parts)
    }

    /// A checkpoint from its metadata and its parts' bytes, as a
    /// [`CheckpointStore`] wrapper sees them when they are written.
    ///
    /// # Errors
    ///
    /// [`InspectError::MalformedPart`] when a part is not a part of the job
    /// layer.
    pub fn from_parts(
        metadata: CheckpointMetadata,
        parts: BTreeMap<PartId, Vec<u8>>,
    ) -> Result<CheckpointView, InspectError> {
        let parts = parts
            .into_iter()
            .map(|(id, bytes)| Ok((id.clone(), PartView::decode(id, &bytes)?)))
            .collect::<Result<_, InspectError>>()?;
        Ok(CheckpointView { metadata, parts })
    }

    /// The checkpoint's id.
    pub fn checkpoint(&self) -> CheckpointId {
        self.metadata.checkpoint
    }

    /// Checkpoint or savepoint.
    pub fn kind(&self) -> CheckpointKind {
        self.metadata.kind
    }

    /// The checkpoint's metadata as stored.
    pub fn metadata(&self) -> &CheckpointMetadata {
        &self.metadata
    }

    /// Whether `operator` is a source or a sink, as the checkpoint
    /// records it; `None` for an operator in between, and for every
    /// operator of a checkpoint written before snapflow recorded roles.
    pub fn operator_role(&self, operator: &str) -> Option<OperatorRole> {
        self.metadata
            .user
            .get(&role_key(operator))
            .and_then(|name| OperatorRole::parse(name))
    }

    /// The names of the operators with parts, in name order.
    pub fn operators(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .parts
            .keys()
            .map(|part| part.operator.as_str())
            .collect();
        names.dedup();
        names
    }

    /// Every part, by operator name then subtask.
    pub fn parts(&self) -> impl Iterator<Item = &PartView> + '_ {
        self.parts.values()
    }

    /// The parts of `operator`, by subtask.
    ///
    /// # Errors
    ///
    /// [`InspectError::UnknownOperator`] when the checkpoint has none.
    pub fn operator_parts(&self, operator: &str) -> Result<Vec<&PartView>, InspectError> {
        let parts: Vec<&PartView> = self
            .parts
            .values()
            .filter(|part| part.id.operator == operator)
            .collect();
        if parts.is_empty() {
            return Err(InspectError::UnknownOperator {
                checkpoint: self.checkpoint(),
                operator: operator.to_owned(),
            });
        }
        Ok(parts)
    }

    /// The part of `operator`'s subtask `subtask`.
    ///
    /// # Errors
    ///
    /// [`InspectError::UnknownPart`] when the checkpoint has no such part.
    pub fn part(&self, operator: &str, subtask: u32) -> Result<&PartView, InspectError> {
        let id = PartId::new(operator, subtask);
        self.parts
            .get(&id)
            .ok_or_else(|| InspectError::UnknownPart {
                checkpoint: self.checkpoint(),
                part: id,
            })
    }

    /// The operator state of `operator`'s subtask `subtask` decoded as a
    /// state blob of type `S` (see [`PartView::state`]).
    ///
    /// # Errors
    ///
    /// [`InspectError::UnknownPart`] or [`InspectError::State`].
    pub fn state<S: Snapshot>(&self, operator: &str, subtask: u32) -> Result<S, InspectError> {
        self.part(operator, subtask)?.state()
    }

    /// The states of custom [`Operator`] `operator`, by subtask (see
    /// [`PartView::operator_state`]).
    ///
    /// # Errors
    ///
    /// [`InspectError::UnknownOperator`], [`InspectError::MalformedPart`]
    /// or [`InspectError::State`].
    pub fn operator_states<O: Operator>(&self, operator: &str) -> Result<Vec<O>, InspectError> {
        self.operator_parts(operator)?
            .into_iter()
            .map(PartView::operator_state)
            .collect()
    }

    /// Every key's state of keyed operator `operator`, across all its
    /// subtasks and key groups. Each subtask's key groups are checked
    /// against the range it owns, and every key against its key group.
    ///
    /// # Errors
    ///
    /// [`InspectError::UnknownOperator`], [`InspectError::NoKeyGroupLayout`],
    /// [`InspectError::MalformedPart`] when the state is not keyed state,
    /// [`InspectError::Keyed`] when it does not decode as `K` and `S` or
    /// its key groups are missing, repeated or misplaced.
    pub fn keyed_state<K: StateKey, S: Snapshot>(
        &self,
        operator: &str,
    ) -> Result<HashMap<K, S>, InspectError> {
        let parts = self.operator_parts(operator)?;
        let stored = self.metadata.key_groups.max_parallelism;
        let max_parallelism =
            MaxParallelism::new(stored).map_err(|_| InspectError::NoKeyGroupLayout {
                checkpoint: self.checkpoint(),
                max_parallelism: stored,
            })?;
        let mut states = HashMap::new();
        for (_, subtask) in keyed_states_by_subtask(&parts, max_parallelism, Groups::Exact)? {
            // Disjoint ranges: a key can only come from the subtask that
            // owns its key group, so no key is overwritten here.
            states.extend(subtask);
        }
        Ok(states)
    }

    /// The positions of `operator`'s source subtasks, by subtask.
    ///
    /// # Errors
    ///
    /// [`InspectError::UnknownOperator`].
    pub fn source_positions(&self, operator: &str) -> Result<Vec<SourcePosition>, InspectError> {
        Ok(self
            .operator_parts(operator)?
            .into_iter()
            .map(PartView::source_position)
            .collect())
    }

    /// Every record recorded in flight towards `operator`, subtask by
    /// subtask and channel by channel. Empty in aligned checkpoints of a
    /// graph without loops.
    ///
    /// # Errors
    ///
    /// [`InspectError::UnknownOperator`] or
    /// [`InspectError::MalformedChannel`].
    pub fn channel_records<T: DeserializeOwned>(
        &self,
        operator: &str,
    ) -> Result<Vec<T>, InspectError> {
        let mut records = Vec::new();
        for part in self.operator_parts(operator)? {
            records.extend(part.all_channel_records::<T>()?);
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::ops::encode_keyed_state;
    use crate::job::shell::{encode_batches, encode_channel, InputItem};
    use crate::storage::KeyGroupLayout;

    #[derive(crate::Snapshot, Debug, Clone, Default, PartialEq)]
    #[snapshot(crate = "crate")]
    struct Total {
        sum: i64,
    }

    fn metadata(max_parallelism: u32) -> CheckpointMetadata {
        CheckpointMetadata {
            job: "job".into(),
            checkpoint: 4,
            kind: CheckpointKind::Checkpoint,
            created_unix_ms: 0,
            parts: Vec::new(),
            source_positions: BTreeMap::new(),
            key_groups: KeyGroupLayout {
                max_parallelism,
                operator_parallelism: BTreeMap::new(),
            },
            user: BTreeMap::new(),
            segments: BTreeMap::new(),
        }
    }

    fn view(parts: Vec<(PartId, PartBytes)>) -> Result<CheckpointView, InspectError> {
        let parts = parts
            .into_iter()
            .map(|(id, part)| (id, part.encode().expect("encodes")))
            .collect();
        CheckpointView::from_parts(metadata(4), parts)
    }

    fn part(state: Vec<u8>, channels: Vec<(u32, Vec<u8>)>) -> PartBytes {
        PartBytes {
            state,
            channels,
            time: None,
        }
    }

    #[test]
    fn a_blob_state_decodes_as_its_type() {
        let state = blob::encode(&Total { sum: -7 }).expect("encodes");
        let view = view(vec![(PartId::new("op", 0), part(state, Vec::new()))]).expect("decodes");
        assert_eq!(
            view.state::<Total>("op", 0).expect("a Total"),
            Total { sum: -7 }
        );
        let error = view.state::<Total>("op", 1).expect_err("no subtask 1");
        assert!(matches!(error, InspectError::UnknownPart { .. }));
    }

    #[test]
    fn a_state_that_is_not_a_blob_is_a_state_error() {
        let view = view(vec![(
            PartId::new("op", 0),
            part(vec![1, 2, 3], Vec::new()),
        )])
        .expect("decodes");
        let error = view.state::<Total>("op", 0).expect_err("not a blob");
        assert!(matches!(error, InspectError::State { .. }));
        assert!(!error.is_retryable());
    }

    #[test]
    fn recorded_channels_decode_as_records_in_order() {
        // Time marks recorded among the records are skipped.
        let channel = encode_channel(&[
            InputItem::Records(vec![1_u64, 2]),
            InputItem::Watermark(7),
            InputItem::Records(vec![3]),
        ])
        .expect("encodes");
        let empty = encode_batches::<u64>(&[]).expect("encodes");
        let view = view(vec![(
            PartId::new("head", 0),
            part(Vec::new(), vec![(0, empty), (2, channel)]),
        )])
        .expect("decodes");
        let head = view.part("head", 0).expect("present");
        assert_eq!(head.channels().collect::<Vec<_>>(), [0, 2]);
        assert_eq!(head.channel_records::<u64>(2).expect("u64s"), [1, 2, 3]);
        assert_eq!(
            view.channel_records::<u64>("head").expect("u64s"),
            [1, 2, 3]
        );
        let error = head.channel_records::<u64>(1).expect_err("not recorded");
        assert!(matches!(
            error,
            InspectError::UnknownChannel { channel: 1, .. }
        ));
    }

    #[test]
    fn records_of_another_type_are_a_channel_error() {
        let channel = encode_batches(&[vec![u64::MAX]]).expect("encodes");
        let view = view(vec![(
            PartId::new("head", 0),
            part(Vec::new(), vec![(0, channel)]),
        )])
        .expect("decodes");
        let error = view.channel_records::<bool>("head").expect_err("not bools");
        assert!(matches!(error, InspectError::MalformedChannel { .. }));
    }

    #[test]
    fn keyed_state_is_read_across_subtasks() {
        let max_parallelism = MaxParallelism::new(4).expect("valid");
        let mut parts = Vec::new();
        for subtask in 0..2 {
            let mut state: KeyedState<u64, Total> =
                KeyedState::for_subtask(max_parallelism, 2, subtask).expect("valid");
            for key in 0..40_u64 {
                if state.owns(&key) {
                    state.get_or_default(&key).sum = key as i64;
                }
            }
            let groups: Vec<(u32, Vec<u8>)> =
                state.snapshot().expect("encodes").into_parts().collect();
            let bytes = encode_keyed_state(&groups).expect("encodes");
            parts.push((PartId::new("count", subtask), part(bytes, Vec::new())));
        }
        let view = view(parts).expect("decodes");
        let states = view.keyed_state::<u64, Total>("count").expect("keyed");
        assert_eq!(states.len(), 40);
        assert!(states.iter().all(|(key, total)| total.sum == *key as i64));
        let error = view.keyed_state::<u64, Total>("other").expect_err("absent");
        assert!(matches!(error, InspectError::UnknownOperator { .. }));
    }

    #[test]
    fn a_missing_subtask_of_keyed_state_is_a_keyed_error() {
        let max_parallelism = MaxParallelism::new(4).expect("valid");
        let state: KeyedState<u64, Total> =
            KeyedState::for_subtask(max_parallelism, 2, 0).expect("valid");
        let groups: Vec<(u32, Vec<u8>)> = state.snapshot().expect("encodes").into_parts().collect();
        let bytes = encode_keyed_state(&groups).expect("encodes");
        // Subtask 0 of 2 alone looks like parallelism 1: its range misses
        // key groups 2 and 3.
        let view = view(vec![(PartId::new("count", 0), part(bytes, Vec::new()))]).expect("decodes");
        let error = view
            .keyed_state::<u64, Total>("count")
            .expect_err("incomplete");
        assert!(matches!(error, InspectError::Keyed { .. }), "{error}");
    }

    #[test]
    fn garbage_parts_are_malformed() {
        let parts = [(PartId::new("op", 0), vec![0xff; 5])].into();
        let error = CheckpointView::from_parts(metadata(4), parts).expect_err("garbage");
        assert!(
            matches!(error, InspectError::MalformedPart { .. }),
            "{error}"
        );
    }

    #[test]
    fn keyed_state_without_a_layout_is_an_error() {
        let parts = [(
            PartId::new("count", 0),
            part(Vec::new(), Vec::new()).encode().expect("encodes"),
        )]
        .into();
        let view = CheckpointView::from_parts(metadata(0), parts).expect("decodes");
        let error = view
            .keyed_state::<u64, Total>("count")
            .expect_err("no layout");
        assert!(matches!(error, InspectError::NoKeyGroupLayout { .. }));
    }
}
