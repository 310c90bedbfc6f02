//! The graph of subtasks and its wiring: which channels connect which
//! subtasks, the protocol plan on that graph, and the start of one
//! generation of actors.
//!
//! This module owns type erasure between the typed builder and the actors:
//! every logical operator keeps a [`Template`] that knows its record types;
//! at each generation the template makes one [`SubtaskSlot`] per subtask
//! (an actix mailbox whose address exists before the actor does), channels
//! are made by the sending slot from the receiving slot's address (a
//! `Recipient<Delivery<T, Control>>` erased as `Box<dyn Any>` and downcast
//! once, here), and then every actor starts on its arbiter. It never runs
//! the protocol and never touches the store.

use std::any::Any;
use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::sync::Arc;

use actix::{Addr, Recipient};

use crate::keyed::MaxParallelism;
use crate::metrics::{MetricsRegistry, SubtaskRecorder};
use crate::protocol::{
    CheckpointId, GraphBuilder, GraphError, NodeConfig, NodeMachine, SnapshotMode, SnapshotPlan,
};
use crate::runtime::channel::{
    channel, ChannelConfig, ChannelId, ChannelReceiver, ChannelSender, ChannelStats, Credit,
    Delivery, Window,
};
use crate::runtime::failure::FailureSink;
use crate::runtime::pool::{ActorSlot, ArbiterPool, Placement};
use crate::runtime::source::{SourceActor, SourceConfig};
use crate::runtime::stage::{Inject, StageActor, StageConfig};
use crate::runtime::{ActorTag, Generation};
use crate::storage::{KeyGroupLayout, PartId};
use crate::watermark::{SourceWatermarks, WatermarkStrategy};

use super::ops::merge_keyed_states;
use super::recovery::SinkHooks;
use super::route::{EdgeRoute, KeyHash, RouteKind, Router};
use super::shell::{
    is_empty_channel, Control, Core, Data, InputItem, NodeEvent, OperatorCounters, PartBytes,
    ShellEnv, SourceMaker, SourceShell, StageShell,
};
use super::{JobConfig, JobError};

/// How the records of a logical edge are partitioned, once parallelisms are
/// known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Partition {
    /// Subtask i to subtask i (same parallelism).
    Forward,
    /// Round robin to every downstream subtask.
    Rebalance,
    /// By key group.
    Hash,
    /// Every record to every downstream subtask.
    Broadcast,
}

/// Makes the subtask slots of one logical operator; knows its types.
pub(crate) trait Template: Send + Sync + 'static {
    /// A fresh slot for one subtask of one generation.
    fn slot(&self) -> Box<dyn SubtaskSlot>;

    /// Gives a source its [`WatermarkStrategy`] (boxed, as the template
    /// is erased). False when this is not a source of that record type.
    fn set_watermarks(&mut self, strategy: Box<dyn Any>) -> bool {
        let _ = strategy;
        false
    }
}

/// Everything a slot needs to start its actor.
pub(crate) struct SlotStart<'a> {
    pub(crate) pool: &'a ArbiterPool,
    pub(crate) tag: ActorTag,
    pub(crate) env: ShellEnv,
    pub(crate) node_config: NodeConfig,
    pub(crate) last_completed: Option<CheckpointId>,
    pub(crate) failures: FailureSink,
    pub(crate) subtask: usize,
    pub(crate) parallelism: usize,
    pub(crate) read_batch: usize,
}

/// One subtask of one generation, before and at its start.
pub(crate) trait SubtaskSlot {
    /// The address deliveries go to, erased (`Recipient<Delivery<In, Control>>`).
    fn delivery_target(&self) -> Result<Box<dyn Any>, JobError>;
    /// The address the supervisor injects controls into.
    fn inject_target(&self) -> Recipient<Inject<Control>>;
    /// Starts a new logical output edge; the next `connect` calls add its
    /// channels in downstream subtask order.
    fn begin_edge(
        &mut self,
        partition: Partition,
        key_hash: Option<&(dyn Any + Send + Sync)>,
        max_parallelism: u32,
        subtask: usize,
    ) -> Result<(), JobError>;
    /// Makes an output channel to `target` and returns its receiving half.
    fn connect(
        &mut self,
        target: Box<dyn Any>,
        id: ChannelId,
        generation: Generation,
        config: ChannelConfig,
    ) -> Result<ChannelReceiver, JobError>;
    /// Adds the next input channel.
    fn add_input(&mut self, receiver: ChannelReceiver) -> Result<(), JobError>;
    /// Starts the actor.
    fn start(self: Box<Self>, start: SlotStart<'_>) -> Result<(), JobError>;
}

/// The output side shared by both slot kinds.
struct OutputSide<Out: Data> {
    senders: Vec<ChannelSender<Out, Control>>,
    routes: Vec<EdgeRoute<Out>>,
}

impl<Out: Data> OutputSide<Out> {
    fn new() -> Self {
        OutputSide {
            senders: Vec::new(),
            routes: Vec::new(),
        }
    }

    fn begin_edge(
        &mut self,
        partition: Partition,
        key_hash: Option<&(dyn Any + Send + Sync)>,
        max_parallelism: u32,
        subtask: usize,
    ) -> Result<(), JobError> {
        let kind = match partition {
            Partition::Forward => RouteKind::Forward,
            Partition::Rebalance => RouteKind::Rebalance,
            Partition::Broadcast => RouteKind::Broadcast,
            Partition::Hash => {
                let key_hash = key_hash
                    .and_then(|any| any.downcast_ref::<KeyHash<Out>>())
                    .ok_or_else(|| {
                        JobError::Internal("a hash edge without a key function".into())
                    })?;
                RouteKind::Hash {
                    key_hash: Arc::clone(key_hash),
                    max_parallelism: MaxParallelism::new(max_parallelism)
                        .map_err(|error| JobError::InvalidConfig(error.to_string()))?,
                }
            }
        };
        self.routes
            .push(EdgeRoute::new(self.senders.len(), 0, kind, subtask));
        Ok(())
    }

    fn connect(
        &mut self,
        target: Box<dyn Any>,
        credit: Recipient<Credit>,
        id: ChannelId,
        generation: Generation,
        config: ChannelConfig,
    ) -> Result<ChannelReceiver, JobError> {
        let target = target
            .downcast::<Recipient<Delivery<Out, Control>>>()
            .map_err(|_| JobError::Internal(format!("channel {} joins mismatched types", id.0)))?;
        let route = self
            .routes
            .last_mut()
            .ok_or_else(|| JobError::Internal("a channel outside any edge".into()))?;
        route
            .add_channel()
            .map_err(|error| JobError::Internal(format!("channel {}: {error}", id.0)))?;
        let (sender, receiver) = channel(id, generation, config, *target, credit);
        self.senders.push(sender);
        Ok(receiver)
    }
}

/// A stage operator: makes its core on the actor's thread.
pub(crate) type CoreFactory<In, Out> =
    Arc<dyn Fn(usize, usize) -> Box<dyn Core<In, Out>> + Send + Sync>;

pub(crate) struct StageTemplate<In, Out> {
    pub(crate) make_core: CoreFactory<In, Out>,
}

impl<In: Data, Out: Data> Template for StageTemplate<In, Out> {
    fn slot(&self) -> Box<dyn SubtaskSlot> {
        Box::new(StageSlot {
            slot: ActorSlot::new(),
            outputs: OutputSide::new(),
            inputs: Vec::new(),
            make_core: Arc::clone(&self.make_core),
        })
    }
}

struct StageSlot<In: Data, Out: Data> {
    slot: ActorSlot<StageActor<StageShell<In, Out>>>,
    outputs: OutputSide<Out>,
    inputs: Vec<ChannelReceiver>,
    make_core: CoreFactory<In, Out>,
}

impl<In: Data, Out: Data> SubtaskSlot for StageSlot<In, Out> {
    fn delivery_target(&self) -> Result<Box<dyn Any>, JobError> {
        let recipient: Recipient<Delivery<In, Control>> = self.slot.address().recipient();
        Ok(Box::new(recipient))
    }

    fn inject_target(&self) -> Recipient<Inject<Control>> {
        self.slot.address().recipient()
    }

    fn begin_edge(
        &mut self,
        partition: Partition,
        key_hash: Option<&(dyn Any + Send + Sync)>,
        max_parallelism: u32,
        subtask: usize,
    ) -> Result<(), JobError> {
        self.outputs
            .begin_edge(partition, key_hash, max_parallelism, subtask)
    }

    fn connect(
        &mut self,
        target: Box<dyn Any>,
        id: ChannelId,
        generation: Generation,
        config: ChannelConfig,
    ) -> Result<ChannelReceiver, JobError> {
        let address: Addr<StageActor<StageShell<In, Out>>> = self.slot.address();
        self.outputs
            .connect(target, address.recipient(), id, generation, config)
    }

    fn add_input(&mut self, receiver: ChannelReceiver) -> Result<(), JobError> {
        self.inputs.push(receiver);
        Ok(())
    }

    fn start(self: Box<Self>, start: SlotStart<'_>) -> Result<(), JobError> {
        let StageSlot {
            slot,
            outputs,
            inputs,
            make_core,
        } = *self;
        let feedback = start.node_config.feedback.clone();
        let machine = new_machine::<InputItem<In>>(start.node_config, start.last_completed)?;
        let router = Router::new(outputs.routes);
        let senders = outputs.senders;
        let (tag, env, failures) = (start.tag, start.env, start.failures);
        let (subtask, parallelism) = (start.subtask, start.parallelism);
        let recorder = env.metrics.clone().map(SubtaskRecorder::new);
        let actor_tag = tag.clone();
        start.pool.start_in_slot(
            slot,
            Placement::RoundRobin,
            tag,
            failures.clone(),
            move |_| {
                let core = make_core(subtask, parallelism);
                let shell = StageShell::new(env, machine, core, router, feedback);
                StageActor::new(
                    actor_tag,
                    shell,
                    inputs,
                    senders,
                    StageConfig::default(),
                    failures,
                )
                .with_metrics(recorder)
            },
        )?;
        Ok(())
    }
}

pub(crate) struct SourceTemplate<T> {
    pub(crate) make: SourceMaker<T>,
    /// Set by [`Stream::assign_timestamps`](super::Stream::assign_timestamps).
    pub(crate) watermarks: Option<WatermarkStrategy<T>>,
}

impl<T: Data> Template for SourceTemplate<T> {
    fn slot(&self) -> Box<dyn SubtaskSlot> {
        Box::new(SourceSlot {
            slot: ActorSlot::new(),
            outputs: OutputSide::new(),
            make: Arc::clone(&self.make),
            watermarks: self.watermarks.clone(),
        })
    }

    fn set_watermarks(&mut self, strategy: Box<dyn Any>) -> bool {
        match strategy.downcast::<WatermarkStrategy<T>>() {
            Ok(strategy) => {
                self.watermarks = Some(*strategy);
                true
            }
            Err(_) => false,
        }
    }
}

struct SourceSlot<T: Data> {
    slot: ActorSlot<SourceActor<SourceShell<T>>>,
    outputs: OutputSide<T>,
    make: SourceMaker<T>,
    watermarks: Option<WatermarkStrategy<T>>,
}

impl<T: Data> SubtaskSlot for SourceSlot<T> {
    fn delivery_target(&self) -> Result<Box<dyn Any>, JobError> {
        Err(JobError::Internal("a source has no inputs".into()))
    }

    fn inject_target(&self) -> Recipient<Inject<Control>> {
        self.slot.address().recipient()
    }

    fn begin_edge(
        &mut self,
        partition: Partition,
        key_hash: Option<&(dyn Any + Send + Sync)>,
        max_parallelism: u32,
        subtask: usize,
    ) -> Result<(), JobError> {
        self.outputs
            .begin_edge(partition, key_hash, max_parallelism, subtask)
    }

    fn connect(
        &mut self,
        target: Box<dyn Any>,
        id: ChannelId,
        generation: Generation,
        config: ChannelConfig,
    ) -> Result<ChannelReceiver, JobError> {
        let address: Addr<SourceActor<SourceShell<T>>> = self.slot.address();
        self.outputs
            .connect(target, address.recipient(), id, generation, config)
    }

    fn add_input(&mut self, _receiver: ChannelReceiver) -> Result<(), JobError> {
        Err(JobError::Internal("a source has no inputs".into()))
    }

    fn start(self: Box<Self>, start: SlotStart<'_>) -> Result<(), JobError> {
        let SourceSlot {
            slot,
            outputs,
            make,
            watermarks,
        } = *self;
        let machine = new_machine::<Vec<T>>(start.node_config, start.last_completed)?;
        let router = Router::new(outputs.routes);
        let senders = outputs.senders;
        let (tag, env, failures) = (start.tag, start.env, start.failures);
        let recorder = env.metrics.clone().map(SubtaskRecorder::new);
        let (subtask, parallelism, read_batch) =
            (start.subtask, start.parallelism, start.read_batch);
        let actor_tag = tag.clone();
        start.pool.start_in_slot(
            slot,
            Placement::RoundRobin,
            tag,
            failures.clone(),
            move |_| {
                let shell = SourceShell::new(
                    env,
                    machine,
                    make,
                    (subtask, parallelism),
                    router,
                    read_batch,
                    watermarks.map(SourceWatermarks::new),
                );
                SourceActor::new(actor_tag, shell, senders, SourceConfig::default(), failures)
                    .with_metrics(recorder)
            },
        )?;
        Ok(())
    }
}

fn new_machine<M: Clone>(
    config: NodeConfig,
    last_completed: Option<CheckpointId>,
) -> Result<NodeMachine<M>, JobError> {
    let machine = match last_completed {
        Some(checkpoint) => NodeMachine::resumed(config, checkpoint),
        None => NodeMachine::new(config),
    };
    machine.map_err(|error| JobError::Internal(format!("node configuration: {error}")))
}

/// One logical operator, resolved.
pub(crate) struct PlannedOperator {
    pub(crate) name: String,
    pub(crate) parallelism: usize,
    pub(crate) first_node: usize,
    pub(crate) template: Box<dyn Template>,
    pub(crate) counters: Arc<OperatorCounters>,
    /// For an iteration head: its idle timeout.
    pub(crate) loop_idle_ms: Option<u64>,
    /// Whether its state can be restored at another parallelism.
    pub(crate) rescale: Rescale,
    /// A sink's recovery hooks.
    pub(crate) sink: Option<SinkHooks>,
    /// A keyed operator with a state handle: how it publishes the states
    /// of a final checkpoint when the job had already finished.
    pub(crate) publish_restored: Option<PublishRestored>,
}

/// Publishes a keyed operator's final per-key states from the parts of
/// the final checkpoint a job resumed from (per subtask, at the job's
/// parallelism): a job that had already finished runs nothing, so no
/// subtask publishes them at the end of its input. The error says why a
/// part did not decode.
pub(crate) type PublishRestored =
    Arc<dyn Fn(&BTreeMap<PartId, Vec<u8>>, MaxParallelism) -> Result<(), String> + Send + Sync>;

/// Redistributes the stored states of a user operator's old subtasks (in
/// subtask order) over a new parallelism; see
/// [`super::ops::rescale_operator_states`].
pub(crate) type OperatorRescale =
    Arc<dyn Fn(&[Vec<u8>], usize) -> Result<Vec<Vec<u8>>, String> + Send + Sync>;

/// How an operator's checkpointed state follows a change of parallelism.
#[derive(Clone)]
pub(crate) enum Rescale {
    /// It has no state of its own: new subtasks start empty.
    Stateless,
    /// Keyed state: every new subtask takes its key groups from the union
    /// of the old subtasks' parts.
    Keyed,
    /// Sources and sinks: positions and transactions belong to one split,
    /// so the parallelism must not change.
    No,
    /// A user operator's state: its `Operator::rescale` spreads the old
    /// subtasks' instances over the new ones (or refuses).
    Operator(OperatorRescale),
}

/// One logical edge, resolved.
pub(crate) struct PlannedEdge {
    pub(crate) partition: Partition,
    pub(crate) key_hash: Option<Arc<dyn Any + Send + Sync>>,
    /// A feedback edge closing an iteration (a back edge of a cycle).
    pub(crate) feedback: bool,
}

/// The idle timeout of the head of a loop that ends when a snapshot shows
/// it quiescent (`Stream::iterate_until_quiescent`): never reached, so
/// only the supervisor's `EndLoop` ends such a loop.
pub(crate) const QUIESCENT_LOOP_IDLE_MS: u64 = u64::MAX;

/// One physical channel.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PhysicalEdge {
    pub(crate) from: usize,
    pub(crate) to: usize,
    pub(crate) logical: usize,
}

/// The graph of subtasks and its protocol plan.
pub(crate) struct PhysicalPlan {
    pub(crate) operators: Vec<PlannedOperator>,
    /// Per node: (operator, subtask).
    pub(crate) nodes: Vec<(usize, usize)>,
    pub(crate) edges: Vec<PhysicalEdge>,
    pub(crate) logical_edges: Vec<PlannedEdge>,
    pub(crate) snapshot: SnapshotPlan,
    pub(crate) config: JobConfig,
    /// The job's live metrics (set when the job starts).
    pub(crate) metrics: Option<Arc<MetricsRegistry>>,
}

impl PhysicalPlan {
    /// Builds the subtask graph from resolved operators and logical edges
    /// `(from operator, to operator)`, and plans the protocol on it.
    pub(crate) fn new(
        operators: Vec<PlannedOperator>,
        sources: &[bool],
        logical: Vec<(usize, usize, PlannedEdge)>,
        config: JobConfig,
    ) -> Result<PhysicalPlan, JobError> {
        let nodes: Vec<(usize, usize)> = operators
            .iter()
            .enumerate()
            .flat_map(|(index, operator)| (0..operator.parallelism).map(move |s| (index, s)))
            .collect();
        let mut edges = Vec::new();
        let mut logical_edges = Vec::new();
        for (index, (from, to, edge)) in logical.into_iter().enumerate() {
            let (up, down) = (&operators[from], &operators[to]);
            for i in 0..up.parallelism {
                if edge.partition == Partition::Forward {
                    edges.push(PhysicalEdge {
                        from: up.first_node + i,
                        to: down.first_node + i,
                        logical: index,
                    });
                    continue;
                }
                for j in 0..down.parallelism {
                    edges.push(PhysicalEdge {
                        from: up.first_node + i,
                        to: down.first_node + j,
                        logical: index,
                    });
                }
            }
            logical_edges.push(edge);
        }
        let name = |node: usize| {
            let (operator, subtask) = nodes[node];
            format!("{}[{subtask}]", operators[operator].name)
        };
        let mut builder = GraphBuilder::new();
        for (node, &(operator, _)) in nodes.iter().enumerate() {
            builder = if sources[operator] {
                builder.source(&name(node))
            } else {
                builder.node(&name(node))
            };
        }
        for edge in &edges {
            builder = builder.edge(&name(edge.from), &name(edge.to));
        }
        let graph = builder.build()?;
        let has_loops = logical_edges.iter().any(|edge| edge.feedback);
        // Aligned on a DAG is Cyclic on a DAG; with loops, Cyclic is the
        // exactly-once aligned mode (forward ALIGN, back edges RECORD).
        let mode = match config.mode {
            SnapshotMode::Aligned if has_loops => SnapshotMode::Cyclic,
            mode => mode,
        };
        // The back edges are exactly the declared feedback channels: the
        // loop heads end their loops by them, and only they are unbounded.
        let feedback: Vec<usize> = edges
            .iter()
            .enumerate()
            .filter(|(_, edge)| logical_edges[edge.logical].feedback)
            .map(|(id, _)| id)
            .collect();
        let snapshot =
            graph
                .plan_with_back_edges(mode, &feedback)
                .map_err(|error| match error {
                    GraphError::BadBackEdges { .. } => JobError::UnsupportedLoop,
                    other => JobError::Graph(other),
                })?;
        Ok(PhysicalPlan {
            operators,
            nodes,
            edges,
            logical_edges,
            snapshot,
            config,
            metrics: None,
        })
    }

    /// The node count.
    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Fills the state handles of the keyed operators that have one from
    /// `parts` (a final checkpoint `checkpoint`, mapped onto this plan's
    /// subtasks by [`Self::redistribute`]), for a job that had already
    /// finished and so runs nothing.
    pub(crate) fn publish_restored(
        &self,
        checkpoint: u64,
        parts: &BTreeMap<PartId, Vec<u8>>,
    ) -> Result<(), JobError> {
        let max_parallelism = MaxParallelism::new(self.config.max_parallelism)
            .map_err(|error| JobError::InvalidConfig(error.to_string()))?;
        for operator in &self.operators {
            if let Some(publish) = &operator.publish_restored {
                publish(parts, max_parallelism).map_err(|reason| {
                    JobError::FinalStateUnreadable {
                        operator: operator.name.clone(),
                        checkpoint,
                        reason,
                    }
                })?;
            }
        }
        Ok(())
    }

    /// Maps the parts of a restored checkpoint onto this plan's subtasks.
    /// An operator whose parallelism changed since the checkpoint
    /// (`layout`) is rescaled: a keyed operator's subtasks each get the
    /// union of the old key-group parts (each keeps its own key groups), a
    /// user operator's state is spread by its `Operator::rescale`, a
    /// stateless one starts empty; sources, sinks and recorded channel
    /// state cannot be rescaled (typed errors). The max parallelism must
    /// not change.
    pub(crate) fn redistribute(
        &self,
        mut parts: BTreeMap<PartId, Vec<u8>>,
        layout: &KeyGroupLayout,
    ) -> Result<BTreeMap<PartId, Vec<u8>>, JobError> {
        if layout.max_parallelism != 0 && layout.max_parallelism != self.config.max_parallelism {
            return Err(JobError::MaxParallelismChanged {
                stored: layout.max_parallelism,
                configured: self.config.max_parallelism,
            });
        }
        for operator in &self.operators {
            let Some(&old) = layout.operator_parallelism.get(&operator.name) else {
                continue; // A new operator starts empty.
            };
            if old as usize == operator.parallelism {
                continue;
            }
            let rescale_error = |reason: &str| JobError::RescaleUnsupported {
                operator: operator.name.clone(),
                reason: reason.to_owned(),
            };
            if matches!(operator.rescale, Rescale::No) {
                return Err(rescale_error("sources and sinks keep their parallelism"));
            }
            // Bounded by the parts really there, never by the stored
            // number alone (`restore_check` has compared the two already).
            let mut states = Vec::with_capacity((old as usize).min(parts.len()));
            for subtask in 0..old {
                let Some(bytes) = parts.remove(&PartId::new(operator.name.clone(), subtask)) else {
                    if matches!(operator.rescale, Rescale::Operator(_)) {
                        // Its states are handed over by subtask index.
                        return Err(rescale_error(&format!(
                            "the part of subtask {subtask} is missing"
                        )));
                    }
                    continue;
                };
                let part = PartBytes::decode(&bytes)
                    .map_err(|error| rescale_error(&format!("a part does not decode: {error}")))?;
                if part
                    .channels
                    .iter()
                    .any(|(_, messages)| !is_empty_channel(messages))
                {
                    return Err(rescale_error("it has recorded channel state"));
                }
                states.push(part.state);
            }
            let encode = |state: Vec<u8>| {
                // A rescaled operator's inputs are other channels: its
                // watermarks start afresh (docs/design/time-and-windows.md).
                let part = PartBytes {
                    state,
                    channels: Vec::new(),
                    time: None,
                };
                part.encode()
                    .map_err(|error| rescale_error(&error.to_string()))
            };
            let new_parts = match &operator.rescale {
                Rescale::Stateless | Rescale::No => continue,
                // Every new subtask gets the same union and keeps its own
                // key groups from it: encoded once.
                Rescale::Keyed => {
                    let merged =
                        merge_keyed_states(&states).map_err(|error| rescale_error(&error))?;
                    vec![encode(merged)?; operator.parallelism]
                }
                Rescale::Operator(rescale) => rescale(&states, operator.parallelism)
                    .map_err(|error| rescale_error(&error))?
                    .into_iter()
                    .map(encode)
                    .collect::<Result<_, _>>()?,
            };
            for (subtask, bytes) in new_parts.into_iter().enumerate() {
                parts.insert(PartId::new(operator.name.clone(), subtask as u32), bytes);
            }
        }
        Ok(parts)
    }

    /// Whether `node` is the head of an iteration.
    pub(crate) fn is_loop_head(&self, node: usize) -> Option<u64> {
        self.operators[self.nodes[node].0].loop_idle_ms
    }

    /// Whether `node` heads a loop that a snapshot ends
    /// ([`QUIESCENT_LOOP_IDLE_MS`]).
    pub(crate) fn is_quiescent_loop_head(&self, node: usize) -> bool {
        self.is_loop_head(node) == Some(QUIESCENT_LOOP_IDLE_MS)
    }

    /// The store's part id of a node.
    pub(crate) fn part_id(&self, node: usize) -> PartId {
        let (operator, subtask) = self.nodes[node];
        PartId::new(self.operators[operator].name.clone(), subtask as u32)
    }

    pub(crate) fn channel_config(&self) -> ChannelConfig {
        let config = &self.config;
        ChannelConfig {
            batch_size_max: NonZeroUsize::new(config.batch_size_max).unwrap_or(NonZeroUsize::MIN),
            batch_linger_ms: config.batch_linger_ms,
            window: Window::Bounded(
                NonZeroUsize::new(config.window_batches).unwrap_or(NonZeroUsize::MIN),
            ),
        }
    }
}

/// The slot of a node that starts in this generation.
fn started(
    slots: &mut [Option<Box<dyn SubtaskSlot>>],
    node: usize,
) -> Result<&mut Box<dyn SubtaskSlot>, JobError> {
    slots[node]
        .as_mut()
        .ok_or_else(|| JobError::Internal(format!("node {node} does not start here")))
}

/// What the supervisor keeps of one running generation.
pub(crate) struct GenerationHandles {
    /// Per node, where to inject controls (`None`: not started here).
    pub(crate) injects: Vec<Option<Recipient<Inject<Control>>>>,
    /// (operator, stats) of every channel, by its sending operator.
    pub(crate) channel_stats: Vec<(usize, ChannelStats)>,
}

/// Where the subtasks of a generation report to.
pub(crate) struct SupervisorLinks {
    /// Acks, declines, ends and finishes.
    pub(crate) events: Recipient<NodeEvent>,
    /// Failures caught by the transport.
    pub(crate) failures: FailureSink,
    /// The job's span, parent of every subtask's span.
    pub(crate) span: tracing::Span,
}

/// Wires and starts one generation of the subtasks in `members` (per
/// node: whether it starts), which must be a union of failover regions: a
/// channel with one end outside is an internal error.
pub(crate) fn start_generation(
    plan: &PhysicalPlan,
    pool: &ArbiterPool,
    generation: Generation,
    links: &SupervisorLinks,
    restore: &BTreeMap<PartId, Vec<u8>>,
    last_completed: Option<CheckpointId>,
    members: &[bool],
) -> Result<GenerationHandles, JobError> {
    let SupervisorLinks {
        events: supervisor,
        failures,
        span: job_span,
    } = links;
    let mut slots: Vec<Option<Box<dyn SubtaskSlot>>> = plan
        .nodes
        .iter()
        .zip(members)
        .map(|(&(operator, _), &member)| member.then(|| plan.operators[operator].template.slot()))
        .collect();
    let config = plan.channel_config();
    let mut channel_stats = Vec::with_capacity(plan.edges.len());
    let mut previous: Option<(usize, usize)> = None;
    for (id, edge) in plan.edges.iter().enumerate() {
        if members[edge.from] != members[edge.to] {
            return Err(JobError::Internal(format!(
                "channel {id} crosses the border of a failover region"
            )));
        }
        if !members[edge.from] {
            continue;
        }
        if previous != Some((edge.from, edge.logical)) {
            let logical = &plan.logical_edges[edge.logical];
            let subtask = plan.nodes[edge.from].1;
            started(&mut slots, edge.from)?.begin_edge(
                logical.partition,
                logical.key_hash.as_deref(),
                plan.config.max_parallelism,
                subtask,
            )?;
            previous = Some((edge.from, edge.logical));
        }
        let target = started(&mut slots, edge.to)?.delivery_target()?;
        // Feedback edges are unbounded: a bounded back edge can deadlock
        // the loop (see `Window::Unbounded`).
        let config = if plan.logical_edges[edge.logical].feedback {
            config.unbounded()
        } else {
            config
        };
        let receiver = started(&mut slots, edge.from)?.connect(
            target,
            ChannelId(id as u64),
            generation,
            config,
        )?;
        channel_stats.push((plan.nodes[edge.from].0, receiver.stats().clone()));
        if let Some(metrics) = &plan.metrics {
            register_channel(metrics, plan, id, edge, &config, receiver.stats());
        }
        started(&mut slots, edge.to)?.add_input(receiver)?;
    }
    let injects = slots
        .iter()
        .map(|slot| slot.as_ref().map(|slot| slot.inject_target()))
        .collect();
    for (node, slot) in slots.into_iter().enumerate() {
        let Some(slot) = slot else {
            continue;
        };
        let (operator, subtask) = plan.nodes[node];
        let planned = &plan.operators[operator];
        let tag = ActorTag::new(planned.name.as_str(), subtask, generation);
        let span = tracing::info_span!(
            parent: job_span,
            "subtask",
            operator = %planned.name,
            subtask,
            generation = generation.0
        );
        let env = ShellEnv {
            node,
            generation,
            supervisor: supervisor.clone(),
            counters: Arc::clone(&planned.counters),
            restore: restore.get(&plan.part_id(node)).cloned(),
            span,
            loop_idle_ms: planned.loop_idle_ms,
            metrics: plan
                .metrics
                .as_ref()
                .and_then(|metrics| metrics.cell(operator, subtask)),
        };
        slot.start(SlotStart {
            pool,
            tag,
            env,
            node_config: plan
                .snapshot
                .node_config(node, plan.config.max_concurrent_checkpoints),
            last_completed,
            failures: failures.clone(),
            subtask,
            parallelism: planned.parallelism,
            read_batch: plan.config.batch_size_max,
        })?;
    }
    Ok(GenerationHandles {
        injects,
        channel_stats,
    })
}

/// Shows channel `id` in the live metrics (replacing the previous
/// generation's, which has the same id).
fn register_channel(
    metrics: &MetricsRegistry,
    plan: &PhysicalPlan,
    id: usize,
    edge: &PhysicalEdge,
    config: &ChannelConfig,
    stats: &ChannelStats,
) {
    let window_batches = match config.window {
        Window::Bounded(max) => Some(max.get() as u64),
        Window::Unbounded => None,
    };
    metrics.register_channel(
        id as u64,
        plan.nodes[edge.from],
        plan.nodes[edge.to],
        window_batches,
        Arc::new(stats.clone()),
    );
}
