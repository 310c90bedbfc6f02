//! A deterministic simulator that drives the protocol machines the way the
//! runtime will: FIFO channels per edge, one [`NodeMachine`] per node, the
//! real [`Coordinator`], and bank-style payloads (every data message carries
//! tokens that move from the sender's balance to the receiver's).
//!
//! Every step is explicit, so the exhaustive explorer, the random scheduler
//! and the scripted seed examples share it. Each completed checkpoint is
//! checked on the spot: the oracle on the trace so far, token conservation,
//! zero channel state where the mode promises it, and assembly of the
//! global snapshot.

use std::collections::{BTreeMap, VecDeque};
use std::hash::{Hash, Hasher};

use snapflow::protocol::coordinator::CoordinatorAction;
use snapflow::protocol::graph::LogicalGraph;
use snapflow::protocol::oracle::{self, ChannelEnds, RecordedChannels, Trace, TraceEvent};
use snapflow::protocol::{
    ChannelPolicy, CheckpointId, CheckpointKind, Coordinator, CoordinatorConfig, DeclineReason,
    Delivery, GlobalSnapshot, NodeAction, NodeMachine, NodePart, SnapshotMode, SnapshotPlan,
    SnapshotToken,
};

/// A bank transfer: `amount` tokens, with a trace-wide unique id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Token {
    pub id: u64,
    pub amount: i64,
}

/// What travels on a channel.
/// A message from the coordinator to one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Control {
    Abort(CheckpointId),
    Complete(CheckpointId),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Item {
    Data(Token),
    Barrier(CheckpointId),
    End,
}

/// One checkpoint being collected.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Collected {
    /// Per node, its balance at its snapshot point.
    pub balances: Vec<Option<i64>>,
    /// Per node, its reported part.
    pub parts: Vec<Option<NodePart<Token>>>,
    /// Per node, the ids it had sent and received at its snapshot point.
    /// Not needed for checking (the oracle reads the trace), but part of
    /// the hashed state so that the explorer never merges two histories
    /// whose cuts differ.
    pub cut_ids: Vec<Option<(Vec<u64>, Vec<u64>)>>,
}

/// Static facts of one simulated job.
#[derive(Debug, Clone)]
pub struct Setup {
    pub graph: LogicalGraph,
    pub plan: SnapshotPlan,
    pub max_concurrent: usize,
    /// Hand snapshot tokens back later (a random step) instead of at once.
    pub delay_tokens: bool,
    /// Deliver the coordinator's aborts and completions to each node through
    /// its own FIFO queue (a random step) instead of at once.
    pub delay_control: bool,
}

impl Setup {
    pub fn new(graph: LogicalGraph, mode: SnapshotMode, preferred: &[&str]) -> Setup {
        let plan = graph.plan(mode, preferred).expect("plannable graph");
        Setup {
            graph,
            plan,
            max_concurrent: 1,
            delay_tokens: false,
            delay_control: false,
        }
    }

    pub fn edge(&self, from: &str, to: &str) -> usize {
        let (from, to) = (self.node(from), self.node(to));
        self.graph
            .edges()
            .iter()
            .position(|edge| edge.from == from && edge.to == to)
            .expect("edge exists")
    }

    pub fn node(&self, name: &str) -> usize {
        self.graph.find(name).expect("node exists")
    }

    fn records_nothing(&self) -> bool {
        self.plan
            .policies
            .iter()
            .flatten()
            .all(|&policy| policy != ChannelPolicy::Record)
    }
}

/// Counters over a run; not part of the hashed state.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub completed: usize,
    pub aborted: usize,
    pub recorded_messages: usize,
}

/// The mutable surroundings of a world: its trace and counters.
pub struct Ctx<'a> {
    pub setup: &'a Setup,
    pub trace: Trace,
    pub tokens: Vec<(usize, SnapshotToken)>,
    pub stats: Stats,
    pub now_ms: u64,
    pub total: i64,
    /// Completed snapshots, for the scripted examples to inspect.
    pub snapshots: Vec<GlobalSnapshot<i64, Token, ()>>,
    pub keep_snapshots: bool,
}

impl<'a> Ctx<'a> {
    pub fn new(setup: &'a Setup, total: i64) -> Ctx<'a> {
        let channels = setup
            .graph
            .edges()
            .iter()
            .map(|edge| ChannelEnds {
                from: edge.from,
                to: edge.to,
            })
            .collect();
        Ctx {
            setup,
            trace: Trace {
                processes: setup.graph.node_count(),
                channels,
                events: Vec::new(),
            },
            tokens: Vec::new(),
            stats: Stats::default(),
            now_ms: 0,
            total,
            snapshots: Vec::new(),
            keep_snapshots: false,
        }
    }
}

enum ToCoordinator {
    Report(usize, NodePart<Token>),
    Decline(usize, CheckpointId, DeclineReason),
}

/// Everything that changes during a run. Hashing skips the coordinator: its
/// state is a function of `requested`, `collecting` and the aborted count.
#[derive(Clone)]
pub struct World {
    pub machines: Vec<NodeMachine<Token>>,
    pub balances: Vec<i64>,
    pub channels: Vec<VecDeque<Item>>,
    pub output_ended: Vec<bool>,
    pub sent_ids: Vec<Vec<u64>>,
    pub received_ids: Vec<Vec<u64>>,
    pub next_message: u64,
    pub sends_left: u32,
    pub requested: u32,
    pub triggers: Vec<(CheckpointId, usize)>,
    pub collecting: BTreeMap<CheckpointId, Collected>,
    pub completed: Vec<CheckpointId>,
    pub aborted: Vec<CheckpointId>,
    pub coordinator: Coordinator<()>,
    pub known_initiators: Vec<bool>,
    pub failed: bool,
    /// How many times the driver aborted everything (exhaustive abort step).
    pub driver_aborts: u32,
    /// Per node, aborts and completions not yet delivered (FIFO).
    pub control: Vec<VecDeque<Control>>,
}

impl Hash for World {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.machines.hash(state);
        self.balances.hash(state);
        self.channels.hash(state);
        self.output_ended.hash(state);
        self.sent_ids.hash(state);
        self.received_ids.hash(state);
        self.sends_left.hash(state);
        self.requested.hash(state);
        self.triggers.hash(state);
        self.collecting.hash(state);
        self.completed.hash(state);
        self.aborted.hash(state);
        self.known_initiators.hash(state);
        self.driver_aborts.hash(state);
        self.control.hash(state);
    }
}

impl World {
    pub fn new(setup: &Setup, balances: Vec<i64>, sends: u32, config: CoordinatorConfig) -> World {
        let graph = &setup.graph;
        let count = graph.node_count();
        assert_eq!(balances.len(), count);
        let machines = (0..count)
            .map(|node| {
                NodeMachine::new(setup.plan.node_config(node, setup.max_concurrent))
                    .expect("planned configs are valid")
            })
            .collect();
        let config = CoordinatorConfig {
            max_concurrent: setup.max_concurrent,
            ..config
        };
        let coordinator = Coordinator::new(config, count, setup.plan.initiators.clone(), 0)
            .expect("valid coordinator");
        let mut known_initiators = vec![false; count];
        for &node in &setup.plan.initiators {
            known_initiators[node] = true;
        }
        World {
            machines,
            balances,
            channels: vec![VecDeque::new(); graph.edges().len()],
            output_ended: vec![false; graph.edges().len()],
            sent_ids: vec![Vec::new(); count],
            received_ids: vec![Vec::new(); count],
            next_message: 0,
            sends_left: sends,
            requested: 0,
            triggers: Vec::new(),
            collecting: BTreeMap::new(),
            completed: Vec::new(),
            aborted: Vec::new(),
            coordinator,
            known_initiators,
            failed: false,
            driver_aborts: 0,
            control: vec![VecDeque::new(); count],
        }
    }

    pub fn data_in_flight(&self) -> usize {
        self.channels
            .iter()
            .flatten()
            .filter(|item| matches!(item, Item::Data(_)))
            .count()
    }

    pub fn digest(&self) -> u64 {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.hash(&mut hasher);
        hasher.finish()
    }

    /// `node` sends `amount` tokens on `edge`.
    pub fn send(&mut self, ctx: &mut Ctx<'_>, edge: usize, amount: i64) {
        let node = ctx.setup.graph.edges()[edge].from;
        assert!(!self.output_ended[edge], "send on an ended output");
        let id = self.next_message;
        self.next_message += 1;
        self.balances[node] -= amount;
        self.sent_ids[node].push(id);
        ctx.trace.events.push(TraceEvent::Send {
            process: node,
            channel: edge,
            message: id,
        });
        self.channels[edge].push_back(Item::Data(Token { id, amount }));
    }

    /// A step of `node` that neither sends nor receives.
    pub fn local_step(&mut self, ctx: &mut Ctx<'_>, node: usize) {
        ctx.trace.events.push(TraceEvent::Local { process: node });
    }

    /// `node` ends all its outputs.
    pub fn end_outputs(&mut self, ctx: &mut Ctx<'_>, node: usize) {
        for &edge in ctx.setup.graph.outputs(node) {
            if !self.output_ended[edge] {
                self.output_ended[edge] = true;
                self.channels[edge].push_back(Item::End);
            }
        }
    }

    /// Delivers the oldest item of `edge` to its receiver.
    pub fn deliver(&mut self, ctx: &mut Ctx<'_>, edge: usize) -> Result<(), String> {
        let item = self.channels[edge].pop_front().expect("non-empty channel");
        let node = ctx.setup.graph.edges()[edge].to;
        let channel = ctx.setup.graph.channel_of(edge);
        match item {
            Item::Data(token) => {
                if let Delivery::Process(token) = self.machines[node].on_data(channel, token) {
                    self.receive(ctx, node, token);
                }
            }
            Item::Barrier(checkpoint) => self.machines[node].on_barrier(channel, checkpoint),
            Item::End => self.machines[node].on_end_of_input(channel),
        }
        self.settle(ctx, vec![node])
    }

    /// Asks the coordinator for a checkpoint now.
    pub fn request(&mut self, ctx: &mut Ctx<'_>) -> Result<(), String> {
        self.requested += 1;
        self.coordinator
            .request_checkpoint(ctx.now_ms, CheckpointKind::Requested);
        self.settle(ctx, Vec::new())
    }

    /// The driver aborts every checkpoint in flight (as before a restart).
    pub fn abort_all(&mut self, ctx: &mut Ctx<'_>) -> Result<(), String> {
        self.driver_aborts += 1;
        self.coordinator.abort_all(ctx.now_ms);
        self.settle(ctx, Vec::new())
    }

    /// Delivers the pending trigger at `index` to its initiator.
    pub fn deliver_trigger(&mut self, ctx: &mut Ctx<'_>, index: usize) -> Result<(), String> {
        let (checkpoint, node) = self.triggers.remove(index);
        self.machines[node].on_trigger(checkpoint);
        self.settle(ctx, vec![node])
    }

    /// Delivers the oldest control message of `node`.
    pub fn deliver_control(&mut self, ctx: &mut Ctx<'_>, node: usize) -> Result<(), String> {
        match self.control[node]
            .pop_front()
            .expect("a pending control message")
        {
            Control::Abort(checkpoint) => self.machines[node].on_abort(checkpoint),
            Control::Complete(checkpoint) => self.machines[node].on_complete(checkpoint),
        }
        self.settle(ctx, vec![node])
    }

    /// Hands back the delayed snapshot token at `index`.
    pub fn return_token(&mut self, ctx: &mut Ctx<'_>, index: usize) -> Result<(), String> {
        let (node, token) = ctx.tokens.remove(index);
        let _still_in_flight = self.machines[node].state_recorded(token);
        self.settle(ctx, vec![node])
    }

    /// Lets time pass at the coordinator.
    pub fn advance_to(&mut self, ctx: &mut Ctx<'_>, now_ms: u64) -> Result<(), String> {
        ctx.now_ms = now_ms;
        self.coordinator.handle_timeout(now_ms);
        self.settle(ctx, Vec::new())
    }

    /// Whether nothing can happen any more without new sends or triggers.
    pub fn is_quiet(&self, ctx: &Ctx<'_>) -> bool {
        self.channels.iter().all(VecDeque::is_empty)
            && self.triggers.is_empty()
            && ctx.tokens.is_empty()
            && self.control.iter().all(VecDeque::is_empty)
    }

    /// Every checkpoint ever triggered has finished everywhere.
    pub fn check_terminated(&self) -> Result<(), String> {
        if let Some(checkpoint) = self.coordinator.in_flight().next() {
            return Err(format!(
                "{checkpoint} never terminated at the coordinator; collected: {:?}; \
                 machines: {:#?}",
                self.collecting, self.machines
            ));
        }
        if !self.collecting.is_empty() {
            return Err(format!("still collecting {:?}", self.collecting.keys()));
        }
        for (node, machine) in self.machines.iter().enumerate() {
            if machine.has_checkpoint_in_flight() {
                let ids: Vec<_> = machine.checkpoints_in_flight().collect();
                return Err(format!("node {node} still has {ids:?} in flight"));
            }
        }
        Ok(())
    }

    fn receive(&mut self, ctx: &mut Ctx<'_>, node: usize, token: Token) {
        self.balances[node] += token.amount;
        self.received_ids[node].push(token.id);
        ctx.trace.events.push(TraceEvent::Receive {
            process: node,
            message: token.id,
        });
    }

    /// Drains the given nodes, then the coordinator, until nothing moves.
    fn settle(&mut self, ctx: &mut Ctx<'_>, nodes: Vec<usize>) -> Result<(), String> {
        let mut outbox = Vec::new();
        for node in nodes {
            self.drain_node(ctx, node, &mut outbox);
        }
        loop {
            for message in outbox.drain(..) {
                match message {
                    ToCoordinator::Report(node, part) => self.report(ctx, node, part),
                    ToCoordinator::Decline(node, checkpoint, reason) => {
                        self.coordinator
                            .on_decline(ctx.now_ms, node, checkpoint, reason);
                    }
                }
            }
            let Some(action) = self.coordinator.poll_action() else {
                return Ok(());
            };
            self.carry_out(ctx, action, &mut outbox)?;
        }
    }

    fn report(&mut self, ctx: &mut Ctx<'_>, node: usize, part: NodePart<Token>) {
        let checkpoint = part.checkpoint;
        if let Some(collected) = self.collecting.get_mut(&checkpoint) {
            collected.parts[node] = Some(part);
        }
        let _outcome = self.coordinator.on_ack(ctx.now_ms, node, checkpoint, ());
    }

    fn carry_out(
        &mut self,
        ctx: &mut Ctx<'_>,
        action: CoordinatorAction<()>,
        outbox: &mut Vec<ToCoordinator>,
    ) -> Result<(), String> {
        let count = self.machines.len();
        match action {
            CoordinatorAction::Trigger { checkpoint, .. } => {
                self.collecting.insert(
                    checkpoint,
                    Collected {
                        balances: vec![None; count],
                        parts: vec![None; count],
                        cut_ids: vec![None; count],
                    },
                );
                for &node in self.coordinator.initiators() {
                    self.triggers.push((checkpoint, node));
                }
            }
            CoordinatorAction::Complete(done) => {
                let collected = self
                    .collecting
                    .remove(&done.checkpoint)
                    .expect("a completed checkpoint was collected");
                self.check_completed(ctx, done.checkpoint, collected)?;
                self.completed.push(done.checkpoint);
                ctx.stats.completed += 1;
                for node in 0..count {
                    self.control_to(ctx, node, Control::Complete(done.checkpoint), outbox);
                }
                // Older checkpoints were subsumed; the coordinator sends
                // their aborts right after.
            }
            CoordinatorAction::Abort { checkpoint, .. } => {
                self.collecting.remove(&checkpoint);
                self.aborted.push(checkpoint);
                ctx.stats.aborted += 1;
                self.triggers.retain(|&(pending, _)| pending != checkpoint);
                for node in 0..count {
                    self.control_to(ctx, node, Control::Abort(checkpoint), outbox);
                }
            }
            CoordinatorAction::FailJob { .. } => self.failed = true,
        }
        Ok(())
    }

    fn control_to(
        &mut self,
        ctx: &mut Ctx<'_>,
        node: usize,
        control: Control,
        outbox: &mut Vec<ToCoordinator>,
    ) {
        if ctx.setup.delay_control {
            self.control[node].push_back(control);
            return;
        }
        match control {
            Control::Abort(checkpoint) => self.machines[node].on_abort(checkpoint),
            Control::Complete(checkpoint) => self.machines[node].on_complete(checkpoint),
        }
        self.drain_node(ctx, node, outbox);
    }

    fn drain_node(&mut self, ctx: &mut Ctx<'_>, node: usize, outbox: &mut Vec<ToCoordinator>) {
        while let Some(action) = self.machines[node].poll_action() {
            match action {
                NodeAction::Process { message, .. } => self.receive(ctx, node, message),
                NodeAction::TakeSnapshot(token) => {
                    let checkpoint = token.checkpoint();
                    ctx.trace.events.push(TraceEvent::Snapshot {
                        process: node,
                        checkpoint,
                    });
                    if let Some(collected) = self.collecting.get_mut(&checkpoint) {
                        collected.balances[node] = Some(self.balances[node]);
                        collected.cut_ids[node] =
                            Some((self.sent_ids[node].clone(), self.received_ids[node].clone()));
                    }
                    if ctx.setup.delay_tokens {
                        ctx.tokens.push((node, token));
                    } else {
                        let _in_flight = self.machines[node].state_recorded(token);
                    }
                }
                NodeAction::EmitBarrier(checkpoint) => {
                    for &edge in ctx.setup.graph.outputs(node) {
                        if !self.output_ended[edge] {
                            self.channels[edge].push_back(Item::Barrier(checkpoint));
                        }
                    }
                }
                NodeAction::ReportPart(part) => outbox.push(ToCoordinator::Report(node, part)),
                NodeAction::Decline { checkpoint, reason } => {
                    outbox.push(ToCoordinator::Decline(node, checkpoint, reason));
                }
            }
        }
        if !self.known_initiators[node] && self.machines[node].needs_trigger() {
            // Barriers will never reach this node again; the coordinator
            // triggers it directly from now on.
            self.known_initiators[node] = true;
            for (checkpoint, _) in self.coordinator.add_initiator(node) {
                self.triggers.push((checkpoint, node));
            }
        }
    }

    /// The checks every completed checkpoint must pass.
    fn check_completed(
        &self,
        ctx: &mut Ctx<'_>,
        checkpoint: CheckpointId,
        collected: Collected,
    ) -> Result<(), String> {
        let setup = ctx.setup;
        let mut parts = Vec::new();
        for (node, (balance, part)) in collected
            .balances
            .into_iter()
            .zip(collected.parts)
            .enumerate()
        {
            let balance = balance.ok_or(format!("{checkpoint}: node {node} never snapshotted"))?;
            let part = part.ok_or(format!("{checkpoint}: node {node} never reported"))?;
            parts.push((node, balance, part));
        }
        let snapshot =
            GlobalSnapshot::<i64, Token, ()>::assemble(&setup.graph, checkpoint, parts, [])
                .map_err(|error| error.to_string())?;
        let recorded = RecordedChannels {
            channels: snapshot
                .channels
                .iter()
                .map(|entry| {
                    let ids = entry.messages.iter().map(|token| token.id).collect();
                    (entry.edge, ids)
                })
                .collect(),
        };
        let in_channels: i64 = snapshot
            .channels
            .iter()
            .flat_map(|entry| entry.messages.iter().map(|token| token.amount))
            .sum();
        let in_states: i64 = snapshot.nodes.iter().map(|entry| entry.state).sum();
        ctx.stats.recorded_messages += snapshot.channel_message_count();
        if setup.plan.mode == SnapshotMode::AtLeastOnce {
            oracle::verify_at_least_once(&ctx.trace, checkpoint, &recorded)
                .map_err(|e| e.to_string())?;
            if in_states + in_channels < ctx.total {
                return Err(format!(
                    "{checkpoint}: at-least-once snapshot lost tokens: {in_states} + {in_channels} < {}",
                    ctx.total
                ));
            }
        } else {
            oracle::verify(&ctx.trace, checkpoint, &recorded).map_err(|e| e.to_string())?;
            if in_states + in_channels != ctx.total {
                return Err(format!(
                    "{checkpoint}: tokens not conserved: states {in_states} + channels \
                     {in_channels} != {}",
                    ctx.total
                ));
            }
        }
        if setup.records_nothing() && snapshot.channel_message_count() != 0 {
            return Err(format!("{checkpoint}: aligned snapshot has channel state"));
        }
        if ctx.keep_snapshots {
            ctx.snapshots.push(snapshot);
        }
        Ok(())
    }
}
