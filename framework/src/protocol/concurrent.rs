//! The concurrent snapshot machine: Chandy-Lamport in full, for one node.
//!
//! [`ConcurrentMachine`] owns, for one node, its part in any number of
//! snapshots at once, each started by any node and named by a
//! [`SnapshotId`] (the node that started it and that node's own sequence
//! number), so snapshots need no global order. For each snapshot it decides
//! when the local state is taken (the first marker of that snapshot, or a
//! local start), which inputs are recorded and what they recorded (every
//! input, from the local snapshot until that snapshot's marker arrives on
//! it), when the node's part is done (that snapshot's marker arrived on every
//! input, or the input ended), and when a snapshot must be declined because
//! the bound on concurrent snapshots is reached. It never does I/O, never
//! reads a clock, never touches operator state, never sends anything and
//! never holds a message back: every input is RECORD, so every message is
//! processed the moment it arrives.
//!
//! It is deliberately a different machine from the coordinated
//! [`NodeMachine`](super::NodeMachine): that one runs the totally ordered
//! checkpoints of one coordinator ([`CheckpointId`](super::CheckpointId),
//! barriers that may overtake and subsume older ones, holding of aligned
//! channels), which the runtime uses for recovery. This one has its own id
//! type, token, part and action types, so a driver cannot feed a marker to a
//! coordinated node or a barrier to a concurrent one by mistake.
//!
//! Driving contract: after every input call (`on_marker`, `on_end_of_input`,
//! `start_snapshot`, `state_recorded`) drain [`ConcurrentMachine::poll_action`]
//! until it returns `None` and carry out the actions in order before the next
//! input. Hand every data message to [`ConcurrentMachine::on_data`] when it
//! arrives, before processing it; with no snapshot in flight that is one
//! branch and no allocation.
//!
//! ```
//! use snapflow::protocol::{ConcurrentAction, ConcurrentConfig, ConcurrentMachine, SnapshotId};
//!
//! // Node 1 with two inputs; node 0 started snapshot (0, 0) and node 2
//! // started snapshot (2, 0) at about the same time.
//! let mut node: ConcurrentMachine<&str> = ConcurrentMachine::new(ConcurrentConfig::new(1, 2)).unwrap();
//! let from_zero = SnapshotId { initiator: 0, sequence: 0 };
//! let from_two = SnapshotId { initiator: 2, sequence: 0 };
//! let mut log = Vec::new();
//! let mut drive = |node: &mut ConcurrentMachine<&str>, log: &mut Vec<String>| {
//!     while let Some(action) = node.poll_action() {
//!         match action {
//!             ConcurrentAction::TakeSnapshot(token) => {
//!                 log.push(format!("state for {}", token.snapshot()));
//!                 node.state_recorded(token); // State captured synchronously here.
//!             }
//!             ConcurrentAction::EmitMarker(id) => log.push(format!("markers of {id} out")),
//!             ConcurrentAction::ReportPart(part) => {
//!                 let recorded: Vec<_> = part.channel_states.iter().map(|c| c.messages.clone()).collect();
//!                 log.push(format!("report {} {recorded:?}", part.snapshot));
//!             }
//!             ConcurrentAction::Decline { snapshot, .. } => log.push(format!("decline {snapshot}")),
//!         }
//!     }
//! };
//! node.on_marker(1, from_two); // Snapshot (2, 0) reaches this node first, on input 1.
//! drive(&mut node, &mut log);
//! node.on_data(0, &"a"); // In flight on input 0 for (2, 0); the driver processes it now.
//! node.on_marker(0, from_zero); // Then (0, 0), on input 0.
//! drive(&mut node, &mut log);
//! node.on_data(1, &"b"); // In flight on input 1 for (0, 0).
//! node.on_marker(0, from_two); // (2, 0) has its markers on both inputs: done.
//! drive(&mut node, &mut log);
//! node.on_marker(1, from_zero); // So has (0, 0).
//! drive(&mut node, &mut log);
//! assert_eq!(log, [
//!     "state for snapshot 2/0", "markers of snapshot 2/0 out",
//!     "state for snapshot 0/0", "markers of snapshot 0/0 out",
//!     "report snapshot 2/0 [[\"a\"], []]",
//!     "report snapshot 0/0 [[], [\"b\"]]",
//! ]);
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use serde::{Deserialize, Serialize};

use super::ChannelState;

/// The identity of one concurrent snapshot: the node that started it and
/// that node's own sequence number for it. Two nodes may start snapshots
/// with the same sequence number; the pair is still unique, and no order
/// between snapshots of different initiators is implied or needed.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct SnapshotId {
    /// The node (its index in the graph) that started the snapshot.
    pub initiator: usize,
    /// The initiator's sequence number: its snapshots are numbered in the
    /// order it started them.
    pub sequence: u64,
}

impl fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "snapshot {}/{}", self.initiator, self.sequence)
    }
}

/// How one node of a concurrent-snapshot graph is configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConcurrentConfig {
    /// This node's index in the graph; it is the `initiator` of the
    /// snapshots it starts.
    pub node: usize,
    /// The number of input channels; channel `i` is index `i` everywhere.
    pub inputs: usize,
    /// How many snapshots this node may take part in at once (at least 1).
    /// Each one records its own copy of the in-flight messages, so this
    /// bounds the node's memory. One more is declined with
    /// [`ConcurrentDeclineReason::TooManyConcurrent`].
    pub max_concurrent: usize,
    /// The sequence number of the first snapshot this node starts.
    pub first_sequence: u64,
}

impl ConcurrentConfig {
    /// Node `node` with `inputs` input channels, at most four snapshots at
    /// once, numbering its own snapshots from 0.
    pub fn new(node: usize, inputs: usize) -> ConcurrentConfig {
        ConcurrentConfig {
            node,
            inputs,
            max_concurrent: 4,
            first_sequence: 0,
        }
    }

    /// Sets how many snapshots may be in flight at this node at once.
    pub fn with_max_concurrent(mut self, max_concurrent: usize) -> ConcurrentConfig {
        self.max_concurrent = max_concurrent;
        self
    }

    /// Sets the sequence number of the first snapshot this node starts (for
    /// example one past the last sequence used before a restart).
    pub fn with_first_sequence(mut self, first_sequence: u64) -> ConcurrentConfig {
        self.first_sequence = first_sequence;
        self
    }
}

/// A [`ConcurrentConfig`] the machine cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConcurrentConfigError {
    /// `max_concurrent` was 0, so no snapshot could ever be taken.
    #[error("max_concurrent must be at least 1")]
    ZeroConcurrency,
}

impl ConcurrentConfigError {
    /// Whether trying again could succeed: never, the configuration is wrong.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

/// Why a node declined a concurrent snapshot; whoever collects the
/// snapshot's parts discards it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConcurrentDeclineReason {
    /// The node already took part in `max_concurrent` snapshots that were
    /// still in flight.
    TooManyConcurrent {
        /// The configured bound.
        max_concurrent: usize,
    },
}

/// The obligation to capture the node's local state for one concurrent
/// snapshot.
///
/// The driver captures (at least synchronously copies) the operator state
/// when it receives this token, before carrying out any later action, and
/// hands it back with [`ConcurrentMachine::state_recorded`] once the state is
/// safe. Until then the node's part of that snapshot cannot be reported.
#[must_use = "hand the token back with ConcurrentMachine::state_recorded once the state is captured"]
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ConcurrentToken {
    snapshot: SnapshotId,
}

impl ConcurrentToken {
    /// The snapshot whose local state must be captured.
    pub fn snapshot(&self) -> SnapshotId {
        self.snapshot
    }
}

/// A node's finished part of one concurrent snapshot: its local state was
/// recorded and the snapshot's marker arrived on every input (or it ended).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConcurrentPart<T> {
    /// The snapshot.
    pub snapshot: SnapshotId,
    /// One entry per input channel (possibly empty), in channel order: the
    /// messages that arrived on it after the local snapshot and before the
    /// snapshot's marker, oldest first.
    pub channel_states: Vec<ChannelState<T>>,
}

/// What the driver must do, in this order.
#[derive(Debug, PartialEq, Eq)]
pub enum ConcurrentAction<T> {
    /// Capture the local state for the token's snapshot now, before any
    /// further output.
    TakeSnapshot(ConcurrentToken),
    /// Send the marker of this snapshot on every output channel (except
    /// outputs already ended), before any further output.
    EmitMarker(SnapshotId),
    /// This node's part of a snapshot is done; hand it to the snapshot's
    /// collector together with the captured state.
    ReportPart(ConcurrentPart<T>),
    /// The node declined a snapshot; tell the snapshot's collector, which
    /// discards it. A snapshot declined at its first marker still has its
    /// markers sent on (an [`ConcurrentAction::EmitMarker`] follows), so
    /// every other node's part of it ends normally.
    Decline {
        /// The snapshot declined.
        snapshot: SnapshotId,
        /// Why.
        reason: ConcurrentDeclineReason,
    },
}

/// The concurrent per-node machine. See the module documentation for the
/// contract.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConcurrentMachine<T> {
    node: usize,
    max_concurrent: usize,
    next_sequence: u64,
    channels: Vec<Input>,
    /// Snapshots this node knows of and whose markers have not all arrived
    /// (or whose state is not yet recorded), in the order they started here.
    entries: Vec<Entry<T>>,
    /// How many entries take part (are not declined); at most
    /// `max_concurrent`.
    taking: usize,
    /// Per initiator, the newest sequence this node joined through
    /// [`ConcurrentMachine::join_snapshot`]; at most one entry per node.
    joined: BTreeMap<usize, u64>,
    /// Actions not yet drained; the driver drains them after every input.
    /// Kept as [`Pending`] so the machine stays `Clone` and `Hash` (for
    /// exhaustive exploration) while the token it hands out is neither.
    actions: VecDeque<Pending<T>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Pending<T> {
    TakeSnapshot(SnapshotId),
    EmitMarker(SnapshotId),
    ReportPart(ConcurrentPart<T>),
    Decline(SnapshotId, ConcurrentDeclineReason),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Input {
    ended: bool,
    /// Per initiator, the sequence of the newest marker that arrived here.
    /// Markers of one initiator arrive on a channel in the order it started
    /// them (every node forwards a snapshot's markers when it first hears of
    /// it), so this catches a repeated marker even after its snapshot is
    /// forgotten. It holds one entry per initiator that ever sent a marker
    /// here, at most the number of nodes.
    newest_marker: BTreeMap<usize, u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Entry<T> {
    id: SnapshotId,
    /// Per channel: the snapshot's marker arrived, or the channel ended.
    delivered: Vec<bool>,
    /// Channels not yet delivered.
    missing: usize,
    /// `None` for a declined snapshot, which records nothing and is only
    /// tracked until its markers have arrived, so that they are not taken
    /// for the start of a new snapshot.
    taking: Option<Taking<T>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Taking<T> {
    state_recorded: bool,
    /// Per channel, the messages recorded for this snapshot. Not bounded
    /// here: the runtime bounds in-flight messages with its credit window,
    /// and `max_concurrent` bounds how many copies are kept.
    records: Vec<Vec<T>>,
}

impl<T: Clone> ConcurrentMachine<T> {
    /// A machine for one node.
    pub fn new(config: ConcurrentConfig) -> Result<ConcurrentMachine<T>, ConcurrentConfigError> {
        if config.max_concurrent == 0 {
            return Err(ConcurrentConfigError::ZeroConcurrency);
        }
        let input = Input {
            ended: false,
            newest_marker: BTreeMap::new(),
        };
        Ok(ConcurrentMachine {
            node: config.node,
            max_concurrent: config.max_concurrent,
            next_sequence: config.first_sequence,
            channels: vec![input; config.inputs],
            entries: Vec::new(),
            taking: 0,
            joined: BTreeMap::new(),
            actions: VecDeque::new(),
        })
    }

    /// A data message arrived on `channel`; the driver processes it right
    /// after this call (nothing is ever held). It is recorded for every
    /// snapshot in flight here whose marker has not yet arrived on
    /// `channel`. With no snapshot in flight this is one branch.
    ///
    /// # Panics
    ///
    /// On data after the channel's end of input, while a snapshot is in
    /// flight (with none in flight the hot path does not look).
    #[inline]
    pub fn on_data(&mut self, channel: usize, message: &T) {
        debug_assert!(
            self.actions.is_empty(),
            "drain ConcurrentMachine::poll_action before the next input"
        );
        if self.entries.is_empty() {
            return;
        }
        self.record(channel, message);
    }

    fn record(&mut self, channel: usize, message: &T) {
        assert!(
            !self.channels[channel].ended,
            "data message on input channel {channel} after its end of input"
        );
        for entry in &mut self.entries {
            if let Some(taking) = entry.taking.as_mut() {
                if !entry.delivered[channel] {
                    taking.records[channel].push(message.clone());
                }
            }
        }
    }

    /// The marker of `snapshot` arrived on `channel`. The first marker of a
    /// snapshot takes the local snapshot (or declines it when the bound is
    /// reached) and sends its markers on; any marker ends the recording of
    /// `channel` for that snapshot.
    ///
    /// # Panics
    ///
    /// On driver bugs: the same marker twice on a channel, markers of one
    /// initiator out of the order it started them, a marker after end of
    /// input, a marker of a snapshot of this node that it never started, or
    /// an input before the actions were drained.
    pub fn on_marker(&mut self, channel: usize, snapshot: SnapshotId) {
        self.assert_drained();
        self.check_marker(channel, snapshot);
        self.channels[channel]
            .newest_marker
            .insert(snapshot.initiator, snapshot.sequence);
        let index = match self.position(snapshot) {
            Some(index) => index,
            None => self.join(snapshot),
        };
        self.mark_delivered(index, channel);
        self.maybe_finish(index);
    }

    fn check_marker(&self, channel: usize, snapshot: SnapshotId) {
        let input = &self.channels[channel];
        assert!(
            !input.ended,
            "marker of {snapshot} on input channel {channel} after its end of input"
        );
        if let Some(&newest) = input.newest_marker.get(&snapshot.initiator) {
            assert!(
                snapshot.sequence != newest,
                "marker of {snapshot} arrived twice on input channel {channel}"
            );
            assert!(
                snapshot.sequence > newest,
                "marker of {snapshot} on input channel {channel} after the marker of snapshot \
                 {}/{newest}; markers of one initiator must arrive in the order it started them",
                snapshot.initiator
            );
        }
        assert!(
            snapshot.initiator != self.node || snapshot.sequence < self.next_sequence,
            "marker of {snapshot} on input channel {channel}, a snapshot of this node that it \
             never started"
        );
    }

    /// `channel` ended: no more messages or markers will come on it. It
    /// counts as having delivered the marker of every snapshot in flight and
    /// of every later one.
    ///
    /// # Panics
    ///
    /// If the channel already ended, or before the actions were drained.
    pub fn on_end_of_input(&mut self, channel: usize) {
        self.assert_drained();
        assert!(
            !self.channels[channel].ended,
            "end of input arrived twice on input channel {channel}"
        );
        self.channels[channel].ended = true;
        let open: Vec<SnapshotId> = self
            .entries
            .iter()
            .filter(|entry| !entry.delivered[channel])
            .map(|entry| entry.id)
            .collect();
        for snapshot in open {
            if let Some(index) = self.position(snapshot) {
                self.mark_delivered(index, channel);
                self.maybe_finish(index);
            }
        }
    }

    /// Starts a new snapshot at this node, as its initiator, and returns its
    /// id. The local snapshot is taken and markers go out at once, unless the
    /// bound is reached: then the snapshot is declined at once (a
    /// [`ConcurrentAction::Decline`] and nothing else, so no other node ever
    /// hears of it); its sequence number is used up either way.
    #[must_use = "the id names the snapshot whose parts are to be collected"]
    pub fn start_snapshot(&mut self) -> SnapshotId {
        self.assert_drained();
        let snapshot = SnapshotId {
            initiator: self.node,
            sequence: self.next_sequence,
        };
        self.next_sequence += 1;
        if self.taking == self.max_concurrent {
            self.actions.push_back(self.decline(snapshot));
            return snapshot;
        }
        let index = self.take_part(snapshot);
        self.maybe_finish(index);
        snapshot
    }

    /// Takes part in `snapshot`, started by another node, as if its first
    /// marker had arrived on no channel: the local state is taken and
    /// markers go out (or it is declined over the bound, and its markers
    /// still go out). A snapshot may be joined this way at any number of
    /// nodes (Chandy-Lamport allows several processes to record
    /// spontaneously for one snapshot); the runtime joins every node that
    /// the initiator's markers might not reach, so that every channel
    /// carries the marker.
    ///
    /// Returns `false`, and does nothing, when this node already knows of
    /// the snapshot: it is in flight here, a marker of it (or of a later
    /// snapshot of the same initiator) arrived on some input, it was
    /// joined before, or it is this node's own.
    pub fn join_snapshot(&mut self, snapshot: SnapshotId) -> bool {
        self.assert_drained();
        let heard = self.position(snapshot).is_some()
            || snapshot.initiator == self.node
            || self.joined.get(&snapshot.initiator).copied() >= Some(snapshot.sequence)
            || self.channels.iter().any(|input| {
                input.newest_marker.get(&snapshot.initiator).copied() >= Some(snapshot.sequence)
            });
        if heard {
            return false;
        }
        self.joined.insert(snapshot.initiator, snapshot.sequence);
        let index = self.join(snapshot);
        self.maybe_finish(index);
        true
    }

    /// The driver captured the state for the token's snapshot.
    ///
    /// Unlike the other inputs, this may be called while actions are still
    /// queued (for example from inside the handler of
    /// [`ConcurrentAction::TakeSnapshot`]); the report it may cause is queued
    /// last.
    pub fn state_recorded(&mut self, token: ConcurrentToken) {
        let index = self.position(token.snapshot).unwrap_or_else(|| {
            // Entries that take part are removed only after their state was
            // recorded, so a token without an entry was handed back twice
            // (it cannot be cloned, so it came from another machine).
            panic!(
                "snapshot token of {} handed back, but this node has no such snapshot in \
                 flight (was it handed back twice, or to another node?)",
                token.snapshot
            )
        });
        let taking = self.entries[index]
            .taking
            .as_mut()
            .expect("a token is only issued for a snapshot this node takes part in");
        assert!(
            !taking.state_recorded,
            "snapshot token of {} handed back twice",
            token.snapshot
        );
        taking.state_recorded = true;
        self.maybe_finish(index);
    }

    /// The next action to carry out, in order.
    pub fn poll_action(&mut self) -> Option<ConcurrentAction<T>> {
        self.actions.pop_front().map(|action| match action {
            Pending::TakeSnapshot(snapshot) => {
                ConcurrentAction::TakeSnapshot(ConcurrentToken { snapshot })
            }
            Pending::EmitMarker(snapshot) => ConcurrentAction::EmitMarker(snapshot),
            Pending::ReportPart(part) => ConcurrentAction::ReportPart(part),
            Pending::Decline(snapshot, reason) => ConcurrentAction::Decline { snapshot, reason },
        })
    }

    /// The snapshots this node takes part in that are not finished here, in
    /// the order they started here.
    pub fn snapshots_in_flight(&self) -> impl Iterator<Item = SnapshotId> + '_ {
        self.entries
            .iter()
            .filter(|entry| entry.taking.is_some())
            .map(|entry| entry.id)
    }

    /// The snapshots this node declined whose markers have not yet arrived on
    /// every input.
    pub fn declined_in_flight(&self) -> impl Iterator<Item = SnapshotId> + '_ {
        self.entries
            .iter()
            .filter(|entry| entry.taking.is_none())
            .map(|entry| entry.id)
    }

    /// Whether this node tracks no snapshot at all (taking part or declined).
    pub fn is_idle(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many messages are recorded here, over all snapshots and channels;
    /// the runtime can account for them as memory.
    pub fn recorded_len(&self) -> usize {
        self.entries
            .iter()
            .filter_map(|entry| entry.taking.as_ref())
            .flat_map(|taking| taking.records.iter())
            .map(Vec::len)
            .sum()
    }

    /// This node's index, the `initiator` of the snapshots it starts.
    pub fn node(&self) -> usize {
        self.node
    }

    /// The sequence number the next [`ConcurrentMachine::start_snapshot`]
    /// will use.
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// The number of input channels.
    pub fn input_count(&self) -> usize {
        self.channels.len()
    }

    /// Whether input `channel` has ended (`false` for an unknown channel).
    pub fn input_ended(&self, channel: usize) -> bool {
        self.channels.get(channel).is_some_and(|input| input.ended)
    }

    /// Whether every input channel has ended (true for a node without
    /// inputs).
    pub fn all_inputs_ended(&self) -> bool {
        self.channels.iter().all(|input| input.ended)
    }

    fn assert_drained(&self) {
        assert!(
            self.actions.is_empty(),
            "drain ConcurrentMachine::poll_action before the next input"
        );
    }

    fn position(&self, snapshot: SnapshotId) -> Option<usize> {
        self.entries.iter().position(|entry| entry.id == snapshot)
    }

    fn decline(&self, snapshot: SnapshotId) -> Pending<T> {
        let reason = ConcurrentDeclineReason::TooManyConcurrent {
            max_concurrent: self.max_concurrent,
        };
        Pending::Decline(snapshot, reason)
    }

    /// The first marker of `snapshot` arrived: take part, or decline when the
    /// bound is reached. A declined snapshot's markers are still sent on, so
    /// that the nodes after this one finish their parts of it instead of
    /// waiting forever. Returns the new entry's index.
    fn join(&mut self, snapshot: SnapshotId) -> usize {
        if self.taking < self.max_concurrent {
            return self.take_part(snapshot);
        }
        self.actions.push_back(self.decline(snapshot));
        self.actions.push_back(Pending::EmitMarker(snapshot));
        self.push_entry(snapshot, None)
    }

    /// Records the local state and sends markers: rule 4 of DESIGN §3, with
    /// every open input recorded from now until its marker (rule 5).
    fn take_part(&mut self, snapshot: SnapshotId) -> usize {
        self.taking += 1;
        self.actions.push_back(Pending::TakeSnapshot(snapshot));
        self.actions.push_back(Pending::EmitMarker(snapshot));
        let taking = Taking {
            state_recorded: false,
            records: vec![Vec::new(); self.channels.len()],
        };
        self.push_entry(snapshot, Some(taking))
    }

    fn push_entry(&mut self, snapshot: SnapshotId, taking: Option<Taking<T>>) -> usize {
        let delivered: Vec<bool> = self.channels.iter().map(|input| input.ended).collect();
        let missing = delivered.iter().filter(|&&done| !done).count();
        self.entries.push(Entry {
            id: snapshot,
            delivered,
            missing,
            taking,
        });
        self.entries.len() - 1
    }

    fn mark_delivered(&mut self, index: usize, channel: usize) {
        let entry = &mut self.entries[index];
        debug_assert!(
            !entry.delivered[channel],
            "the newest-marker check lets no marker arrive twice"
        );
        entry.delivered[channel] = true;
        entry.missing -= 1;
    }

    /// Rule 6: the part is done when the state is recorded and every input
    /// delivered the marker. A declined snapshot is forgotten silently once
    /// its markers have all arrived.
    fn maybe_finish(&mut self, index: usize) {
        let entry = &self.entries[index];
        if entry.missing > 0 {
            return;
        }
        if entry
            .taking
            .as_ref()
            .is_some_and(|taking| !taking.state_recorded)
        {
            return;
        }
        let entry = self.entries.remove(index);
        let Some(taking) = entry.taking else {
            return;
        };
        self.taking -= 1;
        let channel_states = taking
            .records
            .into_iter()
            .enumerate()
            .map(|(channel, messages)| ChannelState { channel, messages })
            .collect();
        self.actions.push_back(Pending::ReportPart(ConcurrentPart {
            snapshot: entry.id,
            channel_states,
        }));
    }
}

#[cfg(test)]
mod join_tests {
    use super::*;

    fn id(initiator: usize, sequence: u64) -> SnapshotId {
        SnapshotId {
            initiator,
            sequence,
        }
    }

    fn drain(machine: &mut ConcurrentMachine<u32>) -> Vec<String> {
        let mut log = Vec::new();
        while let Some(action) = machine.poll_action() {
            match action {
                ConcurrentAction::TakeSnapshot(token) => {
                    log.push(format!("take {}", token.snapshot()));
                    machine.state_recorded(token);
                }
                ConcurrentAction::EmitMarker(s) => log.push(format!("marker {s}")),
                ConcurrentAction::ReportPart(part) => {
                    let recorded: Vec<Vec<u32>> = part
                        .channel_states
                        .into_iter()
                        .map(|c| c.messages)
                        .collect();
                    log.push(format!("report {} {recorded:?}", part.snapshot));
                }
                ConcurrentAction::Decline { snapshot, .. } => {
                    log.push(format!("decline {snapshot}"))
                }
            }
        }
        log
    }

    fn machine(inputs: usize) -> ConcurrentMachine<u32> {
        ConcurrentMachine::new(ConcurrentConfig::new(1, inputs).with_max_concurrent(1))
            .expect("a valid config")
    }

    #[test]
    fn a_joined_snapshot_records_until_its_markers_arrive() {
        let mut node = machine(2);
        assert!(node.join_snapshot(id(0, 0)));
        assert_eq!(
            drain(&mut node),
            ["take snapshot 0/0", "marker snapshot 0/0"]
        );
        node.on_data(0, &7);
        node.on_marker(0, id(0, 0));
        assert!(drain(&mut node).is_empty());
        node.on_data(1, &8);
        node.on_marker(1, id(0, 0));
        assert_eq!(drain(&mut node), ["report snapshot 0/0 [[7], [8]]"]);
    }

    #[test]
    fn a_node_without_inputs_reports_at_once() {
        let mut node = machine(0);
        assert!(node.join_snapshot(id(3, 5)));
        assert_eq!(
            drain(&mut node),
            [
                "take snapshot 3/5",
                "marker snapshot 3/5",
                "report snapshot 3/5 []"
            ]
        );
        assert!(!node.join_snapshot(id(3, 5)), "joined before");
        assert!(!node.join_snapshot(id(3, 4)), "older than one joined");
        assert!(drain(&mut node).is_empty());
    }

    #[test]
    fn a_known_snapshot_is_not_joined_again() {
        let mut node = machine(1);
        node.on_marker(0, id(0, 2));
        let _ = drain(&mut node);
        assert!(!node.join_snapshot(id(0, 2)), "its marker arrived");
        assert!(
            !node.join_snapshot(id(0, 1)),
            "a later marker of its initiator arrived"
        );
        assert!(!node.join_snapshot(id(1, 0)), "this node's own");
        assert!(drain(&mut node).is_empty());
    }

    #[test]
    fn a_join_over_the_bound_declines_and_sends_markers_on() {
        let mut node = machine(1);
        assert!(node.join_snapshot(id(0, 0)));
        let _ = drain(&mut node);
        assert!(node.join_snapshot(id(2, 0)));
        assert_eq!(
            drain(&mut node),
            ["decline snapshot 2/0", "marker snapshot 2/0"]
        );
        assert!(!node.input_ended(0) && !node.input_ended(9));
    }
}
