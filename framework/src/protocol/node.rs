//! The per-node snapshot machine: DESIGN §3's rule for one operator instance.
//!
//! [`NodeMachine`] decides, for every input the runtime feeds it (a data
//! message, a barrier, an end of input, a trigger, an abort, a completion),
//! whether a message is processed now or held, what is recorded as channel
//! state, when the local snapshot is taken, when barriers go out and when the
//! node's part of a checkpoint is done. It keeps held messages in its own
//! per-channel FIFO buffers and records channel state itself, so the runtime
//! only carries out [`NodeAction`]s in the order they come.
//!
//! It never does I/O, never reads a clock, never touches operator state and
//! never sends anything: it only says what to do. The one obligation it
//! hands out is the [`SnapshotToken`]: the driver gives it back through
//! [`NodeMachine::state_recorded`] once the local state of that checkpoint
//! is safely captured.
//!
//! Driving contract: after every input call, drain [`NodeMachine::poll_action`]
//! until it returns `None` and carry out the actions in order before the
//! next input. A data message on a node with no checkpoint in flight costs
//! one branch in [`NodeMachine::on_data`] and no allocation.
//!
//! ```
//! use snapflow::protocol::{ChannelPolicy, CheckpointId, Delivery, NodeAction, NodeConfig, NodeMachine};
//!
//! // A node with two aligned inputs, as in an exactly-once DAG.
//! let config = NodeConfig::new(vec![ChannelPolicy::Align, ChannelPolicy::Align]);
//! let mut node: NodeMachine<&str> = NodeMachine::new(config).unwrap();
//! let mut log = Vec::new();
//! let mut drive = |node: &mut NodeMachine<&str>, log: &mut Vec<String>| {
//!     while let Some(action) = node.poll_action() {
//!         match action {
//!             NodeAction::Process { message, .. } => log.push(format!("process {message}")),
//!             NodeAction::TakeSnapshot(token) => {
//!                 log.push(format!("snapshot {}", token.checkpoint().0));
//!                 node.state_recorded(token); // State captured synchronously here.
//!             }
//!             NodeAction::EmitBarrier(n) => log.push(format!("barrier {} out", n.0)),
//!             NodeAction::ReportPart(part) => log.push(format!("report {}", part.checkpoint.0)),
//!             NodeAction::Decline { checkpoint, .. } => log.push(format!("decline {}", checkpoint.0)),
//!         }
//!     }
//! };
//! assert_eq!(node.on_data(0, "a"), Delivery::Process("a")); // No checkpoint: process.
//! node.on_barrier(0, CheckpointId(1));
//! drive(&mut node, &mut log);
//! assert_eq!(node.on_data(0, "b"), Delivery::Held); // Channel 0 is aligned: held.
//! assert_eq!(node.on_data(1, "c"), Delivery::Process("c"));
//! node.on_barrier(1, CheckpointId(1));
//! drive(&mut node, &mut log);
//! assert_eq!(log, ["snapshot 1", "barrier 1 out", "process b", "report 1"]);
//! ```

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::{ChannelPolicy, CheckpointId};

/// How one node is configured: one policy per input channel (in the order
/// the runtime numbers them), whether it initiates checkpoints, and how many
/// checkpoints may be in flight at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// One policy per input channel; channel `i` is index `i` everywhere.
    pub policies: Vec<ChannelPolicy>,
    /// Whether the coordinator triggers this node directly (a source, or the
    /// chosen node of a strongly connected component no source reaches).
    pub initiator: bool,
    /// How many checkpoints may be in flight at this node at once (at least
    /// 1). Starting one more makes the node decline the oldest, as Flink
    /// does when a newer barrier overtakes a pending checkpoint.
    pub max_concurrent: usize,
    /// One flag per input channel: whether it is a back edge of a cycle.
    /// Empty means no back edges. Used only to tell when the node must be
    /// triggered directly ([`NodeMachine::needs_trigger`]).
    pub feedback: Vec<bool>,
}

impl NodeConfig {
    /// A non-initiator with the given input policies and one checkpoint at a
    /// time.
    pub fn new(policies: Vec<ChannelPolicy>) -> NodeConfig {
        NodeConfig {
            policies,
            initiator: false,
            max_concurrent: 1,
            feedback: Vec::new(),
        }
    }

    /// A source: no inputs, triggered by the coordinator.
    pub fn source() -> NodeConfig {
        NodeConfig::new(Vec::new()).with_initiator(true)
    }

    /// Sets whether the node initiates checkpoints.
    pub fn with_initiator(mut self, initiator: bool) -> NodeConfig {
        self.initiator = initiator;
        self
    }

    /// Sets how many checkpoints may be in flight at once.
    pub fn with_max_concurrent(mut self, max_concurrent: usize) -> NodeConfig {
        self.max_concurrent = max_concurrent;
        self
    }

    /// Marks which input channels are back edges (one flag per channel).
    pub fn with_feedback(mut self, feedback: Vec<bool>) -> NodeConfig {
        self.feedback = feedback;
        self
    }
}

/// A [`NodeConfig`] that the machine cannot run correctly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NodeConfigError {
    /// `max_concurrent` was 0, so no checkpoint could ever start.
    #[error("max_concurrent must be at least 1")]
    ZeroConcurrency,
    /// `feedback` is neither empty nor one flag per input channel.
    #[error("feedback has {flags} flags for {channels} input channels")]
    FeedbackLength {
        /// Flags given.
        flags: usize,
        /// Input channels.
        channels: usize,
    },
    /// An initiator snapshots when triggered, before any barrier; an input
    /// that is not RECORD would then lose its in-flight messages.
    #[error(
        "input channel {channel} of an initiator has policy {policy:?}; an initiator snapshots \
         before its barriers arrive, so every input it has must be RECORD"
    )]
    InitiatorWithAlignedInput {
        /// The offending input channel.
        channel: usize,
        /// Its policy.
        policy: ChannelPolicy,
    },
}

impl NodeConfigError {
    /// Whether trying again could succeed: never, the configuration is wrong.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

/// What to do with a data message handed to [`NodeMachine::on_data`].
#[must_use = "a message returned for processing must be processed now"]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery<T> {
    /// Process the message now, before the next input.
    Process(T),
    /// The machine keeps the message; it comes back later as a
    /// [`NodeAction::Process`] in FIFO order for its channel.
    Held,
}

/// Why a node gave up a checkpoint on its own; the driver tells the
/// coordinator, which aborts the checkpoint everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeclineReason {
    /// A barrier of a newer checkpoint arrived on a channel before this
    /// checkpoint's barrier, so this one can never be aligned (its upstream
    /// gave it up).
    BarrierOvertaken,
    /// A newer checkpoint started while `max_concurrent` were in flight.
    Subsumed,
}

/// The obligation to capture the node's local state for one checkpoint.
///
/// The driver captures (at least synchronously copies) the operator state
/// when it receives this token, before carrying out any later action, and
/// hands the token back with [`NodeMachine::state_recorded`] once the state
/// is safe (for example after an asynchronous upload). Until then the
/// node's part cannot be reported. Dropping it leaves the checkpoint to time
/// out at the coordinator.
#[must_use = "hand the token back with NodeMachine::state_recorded once the state is captured"]
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SnapshotToken {
    checkpoint: CheckpointId,
}

impl SnapshotToken {
    /// The checkpoint whose local state must be captured.
    pub fn checkpoint(&self) -> CheckpointId {
        self.checkpoint
    }
}

/// The recorded state of one input channel for one checkpoint: the messages
/// that were in flight on it at the cut, in arrival order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChannelState<T> {
    /// The input channel's index at this node.
    pub channel: usize,
    /// The recorded messages, oldest first.
    pub messages: Vec<T>,
}

/// A node's finished part of one checkpoint: its local state was recorded
/// and every input delivered the checkpoint's barrier (or ended).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodePart<T> {
    /// The checkpoint.
    pub checkpoint: CheckpointId,
    /// One entry per RECORD input channel (possibly empty), in channel order.
    /// Channels of other policies never have channel state.
    pub channel_states: Vec<ChannelState<T>>,
}

/// What the driver must do, in this order.
#[derive(Debug, PartialEq, Eq)]
pub enum NodeAction<T> {
    /// Process this previously held message now.
    Process {
        /// The input channel it arrived on.
        channel: usize,
        /// The message.
        message: T,
    },
    /// Capture the local state for the token's checkpoint now.
    TakeSnapshot(SnapshotToken),
    /// Send barrier `n` on every output channel (except outputs already
    /// ended), before any further output.
    EmitBarrier(CheckpointId),
    /// This node's part of a checkpoint is done; report it to the
    /// coordinator together with the captured state.
    ReportPart(NodePart<T>),
    /// The node gave up a checkpoint; tell the coordinator.
    Decline {
        /// The checkpoint given up.
        checkpoint: CheckpointId,
        /// Why.
        reason: DeclineReason,
    },
}

/// The per-node machine. See the module documentation for the contract.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeMachine<T> {
    initiator: bool,
    max_concurrent: usize,
    channels: Vec<InputChannel<T>>,
    /// Checkpoints in flight at this node, ascending by id. At most
    /// `max_concurrent` entries.
    in_flight: Vec<InFlight<T>>,
    /// The highest checkpoint this node started, was triggered for, or was
    /// told about; a barrier at or below it that is not in flight is stale.
    highest_seen: Option<CheckpointId>,
    last_completed: Option<CheckpointId>,
    ended_count: usize,
    /// Actions not yet drained. The driver drains them after every input,
    /// so the queue stays short (bounded by one release of held buffers).
    actions: VecDeque<PendingAction<T>>,
    /// Channels whose held buffers must be replayed; empty between calls.
    release_queue: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum PendingAction<T> {
    Process { channel: usize, message: T },
    TakeSnapshot(CheckpointId),
    EmitBarrier(CheckpointId),
    ReportPart(NodePart<T>),
    Decline(CheckpointId, DeclineReason),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Item<T> {
    Data(T),
    Barrier(CheckpointId),
    End,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct InputChannel<T> {
    policy: ChannelPolicy,
    feedback: bool,
    /// Held for the unique unsnapshotted checkpoint whose barrier this
    /// channel delivered last. While held, everything that arrives goes to
    /// `buffer`. Invariant: `buffer` is empty unless `held`.
    held: bool,
    /// Not bounded here: the runtime bounds it with its per-channel credit
    /// window (a held channel grants no new credits), except on back edges
    /// of cycles, which DESIGN §4 leaves unbounded to avoid deadlock.
    buffer: VecDeque<Item<T>>,
    /// The newest barrier that arrived (held or not), to catch misuse.
    last_barrier_arrived: Option<CheckpointId>,
    end_arrived: bool,
    /// End of input was delivered (not just buffered).
    ended: bool,
    /// How many in-flight checkpoints record this channel right now.
    recording: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct InFlight<T> {
    id: CheckpointId,
    snapshotted: bool,
    state_recorded: bool,
    /// Per channel: its barrier was delivered, or the channel ended.
    delivered: Vec<bool>,
    /// Channels not yet delivered.
    missing: usize,
    /// Channels whose policy waits for the barrier and not yet delivered.
    waiting: usize,
    /// Per channel: recording right now (after the snapshot, before the
    /// barrier, RECORD channels only).
    recording: Vec<bool>,
    /// Per channel: the recorded messages; always empty for channels that
    /// are not RECORD. Not bounded here, for the same reason as `buffer`:
    /// these are messages the runtime already accepted under its credits.
    records: Vec<Vec<T>>,
}

impl<T: Clone> NodeMachine<T> {
    /// A machine for one node.
    pub fn new(config: NodeConfig) -> Result<NodeMachine<T>, NodeConfigError> {
        if config.max_concurrent == 0 {
            return Err(NodeConfigError::ZeroConcurrency);
        }
        if !config.feedback.is_empty() && config.feedback.len() != config.policies.len() {
            return Err(NodeConfigError::FeedbackLength {
                flags: config.feedback.len(),
                channels: config.policies.len(),
            });
        }
        if config.initiator {
            if let Some((channel, &policy)) = config
                .policies
                .iter()
                .enumerate()
                .find(|(_, policy)| **policy != ChannelPolicy::Record)
            {
                return Err(NodeConfigError::InitiatorWithAlignedInput { channel, policy });
            }
        }
        let channels = config
            .policies
            .iter()
            .enumerate()
            .map(|(channel, &policy)| InputChannel {
                policy,
                feedback: config.feedback.get(channel).copied().unwrap_or(false),
                held: false,
                buffer: VecDeque::new(),
                last_barrier_arrived: None,
                end_arrived: false,
                ended: false,
                recording: 0,
            })
            .collect();
        Ok(NodeMachine {
            initiator: config.initiator,
            max_concurrent: config.max_concurrent,
            channels,
            in_flight: Vec::new(),
            highest_seen: None,
            last_completed: None,
            ended_count: 0,
            actions: VecDeque::new(),
            release_queue: Vec::new(),
        })
    }

    /// A machine that resumes after a restore from `last_completed`: older
    /// barriers are then misuse, exactly as if it had completed it.
    pub fn resumed(
        config: NodeConfig,
        last_completed: CheckpointId,
    ) -> Result<NodeMachine<T>, NodeConfigError> {
        let mut machine = NodeMachine::new(config)?;
        machine.last_completed = Some(last_completed);
        machine.highest_seen = Some(last_completed);
        Ok(machine)
    }

    /// A data message arrived on `channel`. The hot path: with no checkpoint
    /// in flight this is one branch and returns the message to process.
    #[inline]
    pub fn on_data(&mut self, channel: usize, message: T) -> Delivery<T> {
        debug_assert!(
            self.actions.is_empty(),
            "drain NodeMachine::poll_action before the next input"
        );
        if self.in_flight.is_empty() {
            return Delivery::Process(message);
        }
        self.on_data_during_checkpoint(channel, message)
    }

    fn on_data_during_checkpoint(&mut self, channel: usize, message: T) -> Delivery<T> {
        let input = &mut self.channels[channel];
        assert!(
            !input.end_arrived,
            "data message on input channel {channel} after its end of input"
        );
        if input.held {
            input.buffer.push_back(Item::Data(message));
            return Delivery::Held;
        }
        if input.recording > 0 {
            self.record(channel, &message);
        }
        Delivery::Process(message)
    }

    /// Barrier `checkpoint` arrived on `channel`.
    ///
    /// # Panics
    ///
    /// On driver bugs: the same barrier twice on a channel, barriers out of
    /// order, a barrier after end of input, or a barrier not newer than the
    /// last completed checkpoint.
    pub fn on_barrier(&mut self, channel: usize, checkpoint: CheckpointId) {
        self.assert_drained();
        let last_completed = self.last_completed;
        let input = &mut self.channels[channel];
        assert!(
            !input.end_arrived,
            "barrier of {checkpoint} on input channel {channel} after its end of input"
        );
        if let Some(last) = input.last_barrier_arrived {
            assert!(
                checkpoint != last,
                "barrier of {checkpoint} arrived twice on input channel {channel}"
            );
            assert!(
                checkpoint > last,
                "barrier of {checkpoint} on input channel {channel} after the newer barrier of \
                 {last}; barriers must arrive in increasing order"
            );
        }
        if let Some(done) = last_completed {
            assert!(
                checkpoint > done,
                "barrier of {checkpoint} on input channel {channel} is not newer than the last \
                 completed {done}"
            );
        }
        input.last_barrier_arrived = Some(checkpoint);
        if input.held {
            input.buffer.push_back(Item::Barrier(checkpoint));
            return;
        }
        self.deliver_barrier(channel, checkpoint);
        self.run_releases();
    }

    /// `channel` ended: no more messages or barriers will come on it. It
    /// counts as having delivered every later barrier.
    pub fn on_end_of_input(&mut self, channel: usize) {
        self.assert_drained();
        let input = &mut self.channels[channel];
        assert!(
            !input.end_arrived,
            "end of input arrived twice on input channel {channel}"
        );
        input.end_arrived = true;
        if input.held {
            input.buffer.push_back(Item::End);
            return;
        }
        self.deliver_end(channel);
        self.run_releases();
    }

    /// The coordinator triggers `checkpoint` at this node, which must be an
    /// initiator or have only RECORD inputs left open (see
    /// [`NodeMachine::needs_trigger`]); snapshotting then is safe because
    /// every open input is recorded until its barrier. A trigger for a checkpoint
    /// already aborted, reported or completed here is ignored: triggers race
    /// with barriers and completions (a node whose inputs just ended may be
    /// triggered for a checkpoint whose barrier it already had).
    pub fn on_trigger(&mut self, checkpoint: CheckpointId) {
        self.assert_drained();
        assert!(
            self.initiator || self.open_inputs_all_record(),
            "trigger of {checkpoint} at a node that is not an initiator and still has an open \
             input that is not RECORD"
        );
        let index = match self.position(checkpoint) {
            Some(index) => index,
            None if self.is_stale(checkpoint) => return,
            None => self.start(checkpoint),
        };
        if !self.in_flight[index].snapshotted {
            self.snapshot(index);
        }
        self.run_releases();
    }

    /// The driver captured the state for the token's checkpoint. Returns
    /// whether the checkpoint was still in flight (false if it was aborted
    /// meanwhile; the captured state can then be discarded).
    ///
    /// Unlike the other inputs, this may be called while actions are still
    /// queued (for example from inside the handler of
    /// [`NodeAction::TakeSnapshot`]); the report it may cause is queued last.
    pub fn state_recorded(&mut self, token: SnapshotToken) -> bool {
        let Some(index) = self.position(token.checkpoint) else {
            return false;
        };
        let entry = &mut self.in_flight[index];
        assert!(
            entry.snapshotted && !entry.state_recorded,
            "snapshot token of {} handed back twice",
            token.checkpoint
        );
        entry.state_recorded = true;
        self.maybe_report(index);
        true
    }

    /// The coordinator aborted `checkpoint`: release what it holds and drop
    /// its records. Its late barriers are ignored.
    pub fn on_abort(&mut self, checkpoint: CheckpointId) {
        self.assert_drained();
        self.highest_seen = self.highest_seen.max(Some(checkpoint));
        if let Some(index) = self.position(checkpoint) {
            let entry = self.in_flight.remove(index);
            self.drop_entry(&entry);
        }
        self.run_releases();
    }

    /// The coordinator completed `checkpoint` (sinks commit on it). Older
    /// checkpoints still in flight here are subsumed and dropped silently;
    /// the coordinator aborts them on its side too.
    ///
    /// # Panics
    ///
    /// If `checkpoint` itself is still in flight here: it cannot be
    /// complete without this node's part.
    pub fn on_complete(&mut self, checkpoint: CheckpointId) {
        self.assert_drained();
        assert!(
            self.position(checkpoint).is_none(),
            "{checkpoint} completed before this node reported its part"
        );
        self.last_completed = self.last_completed.max(Some(checkpoint));
        self.highest_seen = self.highest_seen.max(Some(checkpoint));
        while self
            .in_flight
            .first()
            .is_some_and(|entry| entry.id < checkpoint)
        {
            let entry = self.in_flight.remove(0);
            self.drop_entry(&entry);
        }
        self.run_releases();
    }

    /// The next action to carry out, in order.
    pub fn poll_action(&mut self) -> Option<NodeAction<T>> {
        self.actions.pop_front().map(|action| match action {
            PendingAction::Process { channel, message } => NodeAction::Process { channel, message },
            PendingAction::TakeSnapshot(checkpoint) => {
                NodeAction::TakeSnapshot(SnapshotToken { checkpoint })
            }
            PendingAction::EmitBarrier(checkpoint) => NodeAction::EmitBarrier(checkpoint),
            PendingAction::ReportPart(part) => NodeAction::ReportPart(part),
            PendingAction::Decline(checkpoint, reason) => {
                NodeAction::Decline { checkpoint, reason }
            }
        })
    }

    /// Whether any checkpoint is in flight at this node.
    pub fn has_checkpoint_in_flight(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// The checkpoints in flight here, ascending.
    pub fn checkpoints_in_flight(&self) -> impl Iterator<Item = CheckpointId> + '_ {
        self.in_flight.iter().map(|entry| entry.id)
    }

    /// Whether `channel` is held (its messages are being buffered).
    pub fn is_held(&self, channel: usize) -> bool {
        self.channels[channel].held
    }

    /// How many items (messages, barriers, end) are buffered on `channel`;
    /// the runtime uses it to stop granting credits.
    pub fn held_len(&self, channel: usize) -> usize {
        self.channels[channel].buffer.len()
    }

    /// The number of input channels.
    pub fn input_count(&self) -> usize {
        self.channels.len()
    }

    /// Whether this node is configured as an initiator.
    pub fn is_initiator(&self) -> bool {
        self.initiator
    }

    /// Whether the coordinator must trigger this node directly: it is an
    /// initiator, or it has inputs and every one that is not a back edge has
    /// ended, so the only barriers that could still reach it would have to
    /// pass through itself first. The driver then calls
    /// [`Coordinator::add_initiator`](super::Coordinator::add_initiator).
    pub fn needs_trigger(&self) -> bool {
        self.initiator
            || (!self.channels.is_empty()
                && self
                    .channels
                    .iter()
                    .all(|input| input.ended || input.feedback))
    }

    fn open_inputs_all_record(&self) -> bool {
        self.channels
            .iter()
            .all(|input| input.ended || input.policy == ChannelPolicy::Record)
    }

    /// Whether every input channel has delivered its end of input (true for
    /// a node without inputs).
    pub fn all_inputs_ended(&self) -> bool {
        self.ended_count == self.channels.len()
    }

    /// The newest checkpoint completed here, if any.
    pub fn last_completed(&self) -> Option<CheckpointId> {
        self.last_completed
    }

    fn assert_drained(&self) {
        assert!(
            self.actions.is_empty(),
            "drain NodeMachine::poll_action before the next input"
        );
    }

    fn position(&self, checkpoint: CheckpointId) -> Option<usize> {
        self.in_flight
            .iter()
            .position(|entry| entry.id == checkpoint)
    }

    fn is_stale(&self, checkpoint: CheckpointId) -> bool {
        self.highest_seen.is_some_and(|seen| checkpoint <= seen)
    }

    /// Starts tracking `checkpoint`, newer than all in flight; returns its
    /// index.
    fn start(&mut self, checkpoint: CheckpointId) -> usize {
        if self.in_flight.len() == self.max_concurrent {
            let oldest = self.in_flight.remove(0);
            self.drop_entry(&oldest);
            self.actions
                .push_back(PendingAction::Decline(oldest.id, DeclineReason::Subsumed));
        }
        self.highest_seen = Some(checkpoint);
        let delivered: Vec<bool> = self.channels.iter().map(|input| input.ended).collect();
        let open = self.channels.iter().filter(|input| !input.ended);
        let missing = open.clone().count();
        let waiting = open
            .filter(|input| input.policy.waits_for_barrier())
            .count();
        self.in_flight.push(InFlight {
            id: checkpoint,
            snapshotted: false,
            state_recorded: false,
            delivered,
            missing,
            waiting,
            recording: vec![false; self.channels.len()],
            records: vec![Vec::new(); self.channels.len()],
        });
        self.in_flight.len() - 1
    }

    /// Delivers barrier `checkpoint` of `channel` (not held) to the rule.
    fn deliver_barrier(&mut self, channel: usize, checkpoint: CheckpointId) {
        self.decline_overtaken(channel, checkpoint);
        let index = match self.position(checkpoint) {
            Some(index) => index,
            None if self.is_stale(checkpoint) => return,
            None => self.start(checkpoint),
        };
        self.mark_delivered(index, channel);
        let policy = self.channels[channel].policy;
        if self.in_flight[index].snapshotted {
            self.maybe_report(index);
            return;
        }
        if policy.holds() {
            self.channels[channel].held = true;
        }
        if self.in_flight[index].waiting == 0 {
            self.snapshot(index);
        }
    }

    /// Older checkpoints whose barrier was skipped on `channel` can never be
    /// aligned here: their upstream gave them up. Decline them.
    fn decline_overtaken(&mut self, channel: usize, checkpoint: CheckpointId) {
        while let Some(index) = self
            .in_flight
            .iter()
            .position(|entry| entry.id < checkpoint && !entry.delivered[channel])
        {
            let entry = self.in_flight.remove(index);
            self.drop_entry(&entry);
            self.actions.push_back(PendingAction::Decline(
                entry.id,
                DeclineReason::BarrierOvertaken,
            ));
        }
    }

    fn mark_delivered(&mut self, index: usize, channel: usize) {
        let entry = &mut self.in_flight[index];
        debug_assert!(!entry.delivered[channel]);
        entry.delivered[channel] = true;
        entry.missing -= 1;
        if self.channels[channel].policy.waits_for_barrier() {
            entry.waiting -= 1;
        }
        if entry.recording[channel] {
            entry.recording[channel] = false;
            self.channels[channel].recording -= 1;
        }
    }

    fn deliver_end(&mut self, channel: usize) {
        self.channels[channel].ended = true;
        self.ended_count += 1;
        let open: Vec<CheckpointId> = self
            .in_flight
            .iter()
            .filter(|entry| !entry.delivered[channel])
            .map(|entry| entry.id)
            .collect();
        for checkpoint in open {
            let Some(index) = self.position(checkpoint) else {
                continue;
            };
            self.mark_delivered(index, channel);
            if !self.in_flight[index].snapshotted && self.in_flight[index].waiting == 0 {
                self.snapshot(index);
            }
            self.maybe_report(index);
        }
    }

    /// Rule 4 and 5: record the local state, send barriers, start recording
    /// RECORD inputs whose barrier is still missing, release held inputs.
    fn snapshot(&mut self, index: usize) {
        debug_assert!(
            self.in_flight[..index]
                .iter()
                .all(|entry| entry.snapshotted),
            "snapshots must be taken in checkpoint order"
        );
        let entry = &mut self.in_flight[index];
        entry.snapshotted = true;
        self.actions
            .push_back(PendingAction::TakeSnapshot(entry.id));
        self.actions.push_back(PendingAction::EmitBarrier(entry.id));
        for (channel, input) in self.channels.iter_mut().enumerate() {
            if entry.delivered[channel] {
                if input.held {
                    input.held = false;
                    self.release_queue.push(channel);
                }
            } else if input.policy == ChannelPolicy::Record {
                entry.recording[channel] = true;
                input.recording += 1;
            }
        }
    }

    fn maybe_report(&mut self, index: usize) {
        let entry = &self.in_flight[index];
        if !(entry.snapshotted && entry.state_recorded && entry.missing == 0) {
            return;
        }
        let entry = self.in_flight.remove(index);
        let channel_states = entry
            .records
            .into_iter()
            .enumerate()
            .filter(|(channel, _)| self.channels[*channel].policy == ChannelPolicy::Record)
            .map(|(channel, messages)| ChannelState { channel, messages })
            .collect();
        self.actions.push_back(PendingAction::ReportPart(NodePart {
            checkpoint: entry.id,
            channel_states,
        }));
    }

    /// Forgets an entry already removed from `in_flight`: stops its
    /// recordings and releases the channels it holds.
    fn drop_entry(&mut self, entry: &InFlight<T>) {
        for (channel, input) in self.channels.iter_mut().enumerate() {
            if entry.recording[channel] {
                input.recording -= 1;
            }
            // A held channel is held by exactly the unsnapshotted checkpoint
            // whose barrier it delivered last, so this entry owns the hold.
            if !entry.snapshotted && entry.delivered[channel] && input.held {
                input.held = false;
                self.release_queue.push(channel);
            }
        }
    }

    fn record(&mut self, channel: usize, message: &T) {
        for entry in &mut self.in_flight {
            if entry.recording[channel] {
                entry.records[channel].push(message.clone());
            }
        }
    }

    /// Replays the buffers of released channels in FIFO order per channel.
    /// A replayed barrier may hold its channel again, and the rest of that
    /// buffer then stays held.
    fn run_releases(&mut self) {
        while let Some(channel) = self.release_queue.pop() {
            while !self.channels[channel].held {
                let Some(item) = self.channels[channel].buffer.pop_front() else {
                    break;
                };
                match item {
                    Item::Data(message) => {
                        if self.channels[channel].recording > 0 {
                            self.record(channel, &message);
                        }
                        self.actions
                            .push_back(PendingAction::Process { channel, message });
                    }
                    Item::Barrier(checkpoint) => self.deliver_barrier(channel, checkpoint),
                    Item::End => self.deliver_end(channel),
                }
            }
        }
    }
}
