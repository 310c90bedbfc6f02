//! A deterministic simulator for concurrent Chandy-Lamport snapshots: FIFO
//! channels per edge, one [`ConcurrentMachine`] per node, bank payloads
//! (every data message carries money from the sender's balance to the
//! receiver's), and a collector per snapshot that gathers one answer (a part
//! or a decline) from every node.
//!
//! Every step is explicit, so the exhaustive explorer, the random scheduler
//! and the scripted ring case share it. Each snapshot whose parts are all in
//! is checked on the spot: the oracle on the trace so far under the
//! snapshot's own label, and conservation of money (balances at the
//! snapshot points plus recorded channel money equal the initial total).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::hash::{Hash, Hasher};

use snapflow::protocol::graph::LogicalGraph;
use snapflow::protocol::oracle::{self, ChannelEnds, RecordedChannels, Trace, TraceEvent};
use snapflow::protocol::{
    CheckpointId, ConcurrentAction, ConcurrentConfig, ConcurrentMachine, ConcurrentPart,
    ConcurrentToken, SnapshotId,
};

/// A bank transfer: `amount` of money, with a trace-wide unique id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Token {
    pub id: u64,
    pub amount: i64,
}

/// What travels on a channel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Item {
    Data(Token),
    Marker(SnapshotId),
    End,
}

/// The oracle's label of a snapshot: injective for the small initiators and
/// sequences of these tests, and implying no order between snapshots.
pub fn label(id: SnapshotId) -> CheckpointId {
    CheckpointId(((id.initiator as u64) << 32) | id.sequence)
}

/// One node's answer to a snapshot's collector.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Answer {
    Part(ConcurrentPart<Token>),
    Declined,
}

/// One snapshot being collected.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Collected {
    /// Per node, its balance at its snapshot point.
    pub balances: Vec<Option<i64>>,
    /// Per node, its answer.
    pub answers: Vec<Option<Answer>>,
    /// Per node, the ids it had sent and received at its snapshot point.
    /// Not needed for checking (the oracle reads the trace), but part of the
    /// hashed state so that the explorer never merges two histories whose
    /// cuts differ.
    pub cut_ids: Vec<Option<(Vec<u64>, Vec<u64>)>>,
}

/// A checked snapshot, kept for the scripted tests to inspect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub id: SnapshotId,
    /// Per node, its balance at its snapshot point.
    pub balances: Vec<i64>,
    /// Per edge, the recorded money in order.
    pub channels: Vec<Vec<i64>>,
    /// The recorded message ids, as the oracle takes them.
    pub recorded: RecordedChannels,
}

/// What one completed snapshot recorded: the balance of every node at its
/// snapshot point and, per edge, the ids of the recorded messages in order.
/// The exhaustive explorer collects these to compare its full and reduced
/// explorations.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Outcome {
    pub id: SnapshotId,
    pub balances: Vec<i64>,
    pub channels: Vec<Vec<u64>>,
}

/// Static facts of one simulated graph.
#[derive(Debug, Clone)]
pub struct Setup {
    pub graph: LogicalGraph,
    pub max_concurrent: usize,
    /// Hand snapshot tokens back later (a step of their own) instead of at
    /// once.
    pub delay_tokens: bool,
}

impl Setup {
    pub fn new(graph: LogicalGraph, max_concurrent: usize) -> Setup {
        Setup {
            graph,
            max_concurrent,
            delay_tokens: false,
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
}

/// Counters over a run; not part of the hashed state.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub completed: usize,
    pub declined: usize,
    pub recorded_messages: usize,
}

/// The mutable surroundings of a world: its trace, delayed tokens and
/// counters.
pub struct Ctx<'a> {
    pub setup: &'a Setup,
    pub trace: Trace,
    pub tokens: Vec<(usize, ConcurrentToken)>,
    pub stats: Stats,
    pub total: i64,
    pub finished: Vec<Finished>,
    pub keep_finished: bool,
    /// When set, the outcome of every completed snapshot is added here.
    pub outcomes: Option<BTreeSet<Outcome>>,
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
            total,
            finished: Vec::new(),
            keep_finished: false,
            outcomes: None,
        }
    }
}

/// Everything that changes during a run.
#[derive(Debug, Clone, Hash)]
pub struct World {
    pub machines: Vec<ConcurrentMachine<Token>>,
    pub balances: Vec<i64>,
    pub channels: Vec<VecDeque<Item>>,
    pub output_ended: Vec<bool>,
    pub sent_ids: Vec<Vec<u64>>,
    pub received_ids: Vec<Vec<u64>>,
    /// Per node, how many messages it has sent. A message's id is its
    /// sender and this count, so that sends at different nodes, in either
    /// order, reach the same world.
    pub next_message: Vec<u64>,
    pub sends_left: u32,
    /// Per node, how many snapshots it may still start.
    pub starts_left: Vec<u32>,
    /// Per node, whether it may still end its outputs (exhaustive step).
    pub may_end: Vec<bool>,
    pub collecting: BTreeMap<SnapshotId, Collected>,
    /// Sorted, so that the order in which independent snapshots finish
    /// does not tell two worlds apart.
    pub completed: Vec<SnapshotId>,
    /// Sorted, likewise.
    pub declined: Vec<SnapshotId>,
}

impl World {
    pub fn new(setup: &Setup, balances: Vec<i64>, sends: u32, starts: Vec<u32>) -> World {
        let graph = &setup.graph;
        let count = graph.node_count();
        assert_eq!(balances.len(), count);
        assert_eq!(starts.len(), count);
        let machines = (0..count)
            .map(|node| {
                let config = ConcurrentConfig::new(node, graph.inputs(node).len())
                    .with_max_concurrent(setup.max_concurrent);
                ConcurrentMachine::new(config).expect("valid config")
            })
            .collect();
        World {
            machines,
            balances,
            channels: vec![VecDeque::new(); graph.edges().len()],
            output_ended: vec![false; graph.edges().len()],
            sent_ids: vec![Vec::new(); count],
            received_ids: vec![Vec::new(); count],
            next_message: vec![0; count],
            sends_left: sends,
            starts_left: starts,
            may_end: vec![false; count],
            collecting: BTreeMap::new(),
            completed: Vec::new(),
            declined: Vec::new(),
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

    /// The sender of `edge` sends `amount` of money on it.
    pub fn send(&mut self, ctx: &mut Ctx<'_>, edge: usize, amount: i64) {
        let node = ctx.setup.graph.edges()[edge].from;
        assert!(!self.output_ended[edge], "send on an ended output");
        let id = ((node as u64) << 32) | self.next_message[node];
        self.next_message[node] += 1;
        self.balances[node] -= amount;
        self.sent_ids[node].push(id);
        ctx.trace.events.push(TraceEvent::Send {
            process: node,
            channel: edge,
            message: id,
        });
        self.channels[edge].push_back(Item::Data(Token { id, amount }));
    }

    /// `node` starts a snapshot of its own; returns its id.
    pub fn start(&mut self, ctx: &mut Ctx<'_>, node: usize) -> Result<SnapshotId, String> {
        self.starts_left[node] -= 1;
        let count = self.machines.len();
        let id = SnapshotId {
            initiator: node,
            sequence: self.machines[node].next_sequence(),
        };
        self.collecting.insert(
            id,
            Collected {
                balances: vec![None; count],
                answers: vec![None; count],
                cut_ids: vec![None; count],
            },
        );
        let started = self.machines[node].start_snapshot();
        assert_eq!(started, id, "start_snapshot uses next_sequence");
        self.drain(ctx, node)?;
        Ok(id)
    }

    /// `node` ends all its outputs; it sends nothing on them afterwards.
    pub fn end_outputs(&mut self, ctx: &mut Ctx<'_>, node: usize) {
        self.may_end[node] = false;
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
                self.machines[node].on_data(channel, &token);
                self.receive(ctx, node, token);
            }
            Item::Marker(id) => self.machines[node].on_marker(channel, id),
            Item::End => self.machines[node].on_end_of_input(channel),
        }
        self.drain(ctx, node)
    }

    /// Hands back the delayed snapshot token at `index`.
    pub fn return_token(&mut self, ctx: &mut Ctx<'_>, index: usize) -> Result<(), String> {
        let (node, token) = ctx.tokens.remove(index);
        self.machines[node].state_recorded(token);
        self.drain(ctx, node)
    }

    /// Whether nothing can happen any more without new sends or starts.
    pub fn is_quiet(&self, ctx: &Ctx<'_>) -> bool {
        self.channels.iter().all(VecDeque::is_empty) && ctx.tokens.is_empty()
    }

    /// Every snapshot ever started has finished everywhere; with
    /// `may_decline` false none was declined.
    pub fn check_terminated(&self, may_decline: bool) -> Result<(), String> {
        if let Some((id, collected)) = self.collecting.iter().next() {
            return Err(format!("{id} never finished: {collected:?}"));
        }
        for (node, machine) in self.machines.iter().enumerate() {
            if !machine.is_idle() {
                let taking: Vec<_> = machine.snapshots_in_flight().collect();
                let declined: Vec<_> = machine.declined_in_flight().collect();
                return Err(format!(
                    "node {node} still tracks {taking:?} and declined {declined:?}"
                ));
            }
        }
        if !may_decline && !self.declined.is_empty() {
            return Err(format!("declined below the bound: {:?}", self.declined));
        }
        Ok(())
    }

    /// Checks every completed snapshot again, all at once, against the whole
    /// trace of the run.
    pub fn verify_all(&self, ctx: &Ctx<'_>) -> Result<(), String> {
        let snapshots: Vec<_> = ctx
            .finished
            .iter()
            .map(|done| (label(done.id), done.recorded.clone()))
            .collect();
        let reports = oracle::verify_each(&ctx.trace, &snapshots).map_err(|e| e.to_string())?;
        if reports.len() != self.completed.len() {
            return Err(format!(
                "{} reports for {} completed snapshots",
                reports.len(),
                self.completed.len()
            ));
        }
        Ok(())
    }

    fn receive(&mut self, ctx: &mut Ctx<'_>, node: usize, token: Token) {
        self.balances[node] += token.amount;
        // Sorted, not in arrival order: only the set enters a cut, and the
        // reduced explorer needs two orders of independent deliveries to
        // reach the same world (see `reduction.rs`).
        insert_sorted(&mut self.received_ids[node], token.id);
        ctx.trace.events.push(TraceEvent::Receive {
            process: node,
            message: token.id,
        });
    }

    fn drain(&mut self, ctx: &mut Ctx<'_>, node: usize) -> Result<(), String> {
        while let Some(action) = self.machines[node].poll_action() {
            match action {
                ConcurrentAction::TakeSnapshot(token) => self.snapshot_point(ctx, node, token),
                ConcurrentAction::EmitMarker(id) => {
                    for &edge in ctx.setup.graph.outputs(node) {
                        if !self.output_ended[edge] {
                            self.channels[edge].push_back(Item::Marker(id));
                        }
                    }
                }
                ConcurrentAction::ReportPart(part) => {
                    self.answer(ctx, node, part.snapshot, Answer::Part(part))?;
                }
                ConcurrentAction::Decline { snapshot, .. } => {
                    self.answer(ctx, node, snapshot, Answer::Declined)?;
                }
            }
        }
        Ok(())
    }

    fn snapshot_point(&mut self, ctx: &mut Ctx<'_>, node: usize, token: ConcurrentToken) {
        let id = token.snapshot();
        ctx.trace.events.push(TraceEvent::Snapshot {
            process: node,
            checkpoint: label(id),
        });
        let collected = self
            .collecting
            .get_mut(&id)
            .expect("a snapshot is collected until every node answered");
        collected.balances[node] = Some(self.balances[node]);
        collected.cut_ids[node] =
            Some((self.sent_ids[node].clone(), self.received_ids[node].clone()));
        if ctx.setup.delay_tokens {
            ctx.tokens.push((node, token));
        } else {
            self.machines[node].state_recorded(token);
        }
    }

    /// One node answered snapshot `id`. It is finished when every node has
    /// answered, or at once when its initiator declined its own start (then
    /// no other node ever hears of it).
    fn answer(
        &mut self,
        ctx: &mut Ctx<'_>,
        node: usize,
        id: SnapshotId,
        answer: Answer,
    ) -> Result<(), String> {
        let collected = self
            .collecting
            .get_mut(&id)
            .ok_or(format!("node {node} answered {id} after it finished"))?;
        if collected.answers[node].is_some() {
            return Err(format!("node {node} answered {id} twice"));
        }
        let declined_at_start = answer == Answer::Declined && node == id.initiator;
        collected.answers[node] = Some(answer);
        if !declined_at_start && collected.answers.iter().any(Option::is_none) {
            return Ok(());
        }
        let collected = self.collecting.remove(&id).expect("collected");
        if collected.answers.contains(&Some(Answer::Declined)) {
            insert_sorted(&mut self.declined, id);
            ctx.stats.declined += 1;
            return Ok(());
        }
        self.check_completed(ctx, id, collected)?;
        insert_sorted(&mut self.completed, id);
        ctx.stats.completed += 1;
        Ok(())
    }

    /// The checks every completed snapshot must pass: the oracle on the trace
    /// so far, and conservation of money.
    fn check_completed(
        &self,
        ctx: &mut Ctx<'_>,
        id: SnapshotId,
        collected: Collected,
    ) -> Result<(), String> {
        let graph = &ctx.setup.graph;
        let mut done = Finished {
            id,
            balances: Vec::new(),
            channels: vec![Vec::new(); graph.edges().len()],
            recorded: RecordedChannels::default(),
        };
        let mut recorded_ids = vec![Vec::new(); graph.edges().len()];
        for (node, (balance, answer)) in collected
            .balances
            .into_iter()
            .zip(collected.answers)
            .enumerate()
        {
            done.balances
                .push(balance.ok_or(format!("{id}: node {node} never snapshotted"))?);
            let Some(Answer::Part(part)) = answer else {
                return Err(format!("{id}: node {node} has no part"));
            };
            if part.channel_states.len() != graph.inputs(node).len() {
                return Err(format!("{id}: node {node} did not list every input"));
            }
            for state in part.channel_states {
                let edge = graph.inputs(node)[state.channel];
                recorded_ids[edge] = state.messages.iter().map(|token| token.id).collect();
                done.channels[edge] = state.messages.iter().map(|token| token.amount).collect();
            }
        }
        done.recorded = RecordedChannels {
            channels: recorded_ids.into_iter().enumerate().collect(),
        };
        let recorded_messages: usize = done.recorded.channels.iter().map(|(_, m)| m.len()).sum();
        ctx.stats.recorded_messages += recorded_messages;
        oracle::verify(&ctx.trace, label(id), &done.recorded).map_err(|e| format!("{id}: {e}"))?;
        let in_states: i64 = done.balances.iter().sum();
        let in_channels: i64 = done.channels.iter().flatten().sum();
        if in_states + in_channels != ctx.total {
            return Err(format!(
                "{id}: money not conserved: balances {in_states} + channels {in_channels} != {}",
                ctx.total
            ));
        }
        if let Some(outcomes) = ctx.outcomes.as_mut() {
            outcomes.insert(Outcome {
                id,
                balances: done.balances.clone(),
                channels: done
                    .recorded
                    .channels
                    .iter()
                    .map(|(_, m)| m.clone())
                    .collect(),
            });
        }
        if ctx.keep_finished {
            ctx.finished.push(done);
        }
        Ok(())
    }
}

/// Inserts `value` into the sorted `list`, keeping it sorted.
fn insert_sorted<T: Ord>(list: &mut Vec<T>, value: T) {
    let at = list.partition_point(|present| *present < value);
    list.insert(at, value);
}
