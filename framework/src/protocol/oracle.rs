//! The consistency oracle: checks a recorded snapshot against a trace.
//!
//! Given a trace of events (send, receive, local step, snapshot point) of
//! processes connected by FIFO channels, and what a checkpoint recorded as
//! channel states, [`verify`] checks the seed's definition of a globally
//! consistent snapshot: if event `a` happened before event `b` and `b` is in
//! the cut, then `a` is in the cut. Happened-before is computed with vector
//! clocks. It also checks that each channel's recorded state is exactly the
//! messages sent before the sender's cut point and not received before the
//! receiver's cut point, in send order. [`verify_at_least_once`] checks the
//! weaker promise of at-least-once snapshots: no message is lost.
//! [`verify_each`] checks several snapshots of one trace, each under its own
//! label, as concurrent Chandy-Lamport snapshots overlap in one run.
//!
//! This module is public so that users can run it on traces of their own
//! jobs. It never changes anything and never panics on a malformed trace:
//! every problem is a typed [`OracleError`] naming the events involved.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::CheckpointId;

/// A process (node) of a trace, numbered from 0.
pub type ProcessId = usize;
/// A message, unique within a trace.
pub type MessageId = u64;
/// A channel of a trace: its index in [`Trace::channels`].
pub type ChannelId = usize;

/// One event of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TraceEvent {
    /// `process` sent `message` on `channel` (it must be the sender).
    Send {
        /// The sender.
        process: ProcessId,
        /// The channel.
        channel: ChannelId,
        /// The message.
        message: MessageId,
    },
    /// `process` received (processed) `message`.
    Receive {
        /// The receiver.
        process: ProcessId,
        /// The message.
        message: MessageId,
    },
    /// A step of `process` that neither sends nor receives.
    Local {
        /// The process.
        process: ProcessId,
    },
    /// `process` took its local snapshot for `checkpoint` here: its events
    /// before this point are in the cut, its later events are not.
    Snapshot {
        /// The process.
        process: ProcessId,
        /// The checkpoint.
        checkpoint: CheckpointId,
    },
}

/// The ends of one channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChannelEnds {
    /// The sender.
    pub from: ProcessId,
    /// The receiver.
    pub to: ProcessId,
}

/// A trace: processes, channels, and events in an order consistent with
/// causality (a message's send before its receive; each process's events in
/// its own order).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trace {
    /// The number of processes.
    pub processes: usize,
    /// The channels; a channel's id is its index.
    pub channels: Vec<ChannelEnds>,
    /// The events.
    pub events: Vec<TraceEvent>,
}

/// What a checkpoint recorded as channel states. Channels not listed count
/// as recorded empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedChannels {
    /// Per channel, the recorded messages in order.
    pub channels: Vec<(ChannelId, Vec<MessageId>)>,
}

/// What [`verify`] found when the snapshot is consistent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutReport {
    /// The checkpoint.
    pub checkpoint: CheckpointId,
    /// Events (sends, receives, local steps) inside the cut.
    pub events_in_cut: usize,
    /// Messages in the recorded channel states.
    pub messages_in_flight: usize,
}

/// Why a trace is not well formed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TraceProblem {
    /// A process id is not below [`Trace::processes`].
    UnknownProcess,
    /// A channel id is not in [`Trace::channels`], or has an unknown end.
    UnknownChannel,
    /// The sending process is not the channel's sender.
    WrongSender,
    /// A message id was sent twice.
    DuplicateMessage,
    /// A receive of a message never sent before it.
    ReceiveBeforeSend,
    /// The receiving process is not the channel's receiver.
    WrongReceiver,
    /// A message was received twice.
    DuplicateReceive,
    /// Messages of one channel were received out of send order.
    NotFifo,
}

/// A snapshot that is not consistent, or a trace that cannot be checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OracleError {
    /// The trace itself is malformed at event index `event`.
    #[error("trace event #{event} is malformed: {problem:?}")]
    MalformedTrace {
        /// The event's index in [`Trace::events`].
        event: usize,
        /// What is wrong.
        problem: TraceProblem,
    },
    /// A recorded channel state names a channel not in the trace.
    #[error("recorded channel state for unknown channel {channel}")]
    UnknownRecordedChannel {
        /// The channel id.
        channel: ChannelId,
    },
    /// A process has no snapshot point for the checkpoint.
    #[error("process {process} has no snapshot point for {checkpoint}")]
    MissingSnapshot {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The process.
        process: ProcessId,
    },
    /// A process has two snapshot points for the checkpoint.
    #[error(
        "process {process} has two snapshot points for {checkpoint}: events #{first} and #{second}"
    )]
    DuplicateSnapshot {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The process.
        process: ProcessId,
        /// The first snapshot event's index.
        first: usize,
        /// The second's.
        second: usize,
    },
    /// Event `before` happened before event `after`, `after` is in the cut
    /// and `before` is not.
    #[error(
        "{checkpoint} is not a consistent cut: event #{before} ({before_event:?}) happened before \
         event #{after} ({after_event:?}), which is in the cut, but #{before} is not"
    )]
    NotACut {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The event outside the cut.
        before: usize,
        /// It, for the message.
        before_event: TraceEvent,
        /// The event inside the cut.
        after: usize,
        /// It, for the message.
        after_event: TraceEvent,
    },
    /// A channel's recorded state differs from the messages in flight at the
    /// cut.
    #[error(
        "{checkpoint}: channel {channel} recorded {recorded:?}, but the messages in flight at the \
         cut were {expected:?}"
    )]
    ChannelStateMismatch {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The channel.
        channel: ChannelId,
        /// What was in flight.
        expected: Vec<MessageId>,
        /// What was recorded.
        recorded: Vec<MessageId>,
    },
    /// At-least-once: a message sent before the sender's cut was neither
    /// received before the receiver's cut nor recorded, so recovery would
    /// lose it.
    #[error(
        "{checkpoint}: message {message} (sent at event #{send}) is in the sender's cut but was \
         neither received in the receiver's cut nor recorded; recovery would lose it"
    )]
    LostMessage {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The message.
        message: MessageId,
        /// Its send event's index.
        send: usize,
    },
}

impl OracleError {
    /// Whether trying again could succeed: never, the trace is what it is.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

/// Checks that `checkpoint` is a consistent cut of `trace` and that
/// `recorded` holds exactly the messages in flight at the cut.
///
/// ```
/// use snapflow::protocol::oracle::{verify, ChannelEnds, RecordedChannels, Trace, TraceEvent};
/// use snapflow::protocol::CheckpointId;
///
/// let one = CheckpointId(1);
/// // P0 sends message 7 to P1, snapshots; P1 snapshots, then receives it.
/// let trace = Trace {
///     processes: 2,
///     channels: vec![ChannelEnds { from: 0, to: 1 }],
///     events: vec![
///         TraceEvent::Send { process: 0, channel: 0, message: 7 },
///         TraceEvent::Snapshot { process: 0, checkpoint: one },
///         TraceEvent::Snapshot { process: 1, checkpoint: one },
///         TraceEvent::Receive { process: 1, message: 7 },
///     ],
/// };
/// // Message 7 was in flight at the cut, so it must be the channel's state.
/// let recorded = RecordedChannels { channels: vec![(0, vec![7])] };
/// assert!(verify(&trace, one, &recorded).is_ok());
/// assert!(verify(&trace, one, &RecordedChannels::default()).is_err());
/// ```
pub fn verify(
    trace: &Trace,
    checkpoint: CheckpointId,
    recorded: &RecordedChannels,
) -> Result<CutReport, OracleError> {
    let analysis = Analysis::new(trace)?;
    analysis.check_snapshot(trace, checkpoint, recorded)
}

/// Checks every snapshot in `snapshots` against the same trace, as
/// [`verify`] checks one: each label's snapshot points must form a
/// consistent cut, and its recorded channel states must be exactly the
/// messages in flight at that cut. The trace is analysed once, so checking
/// many snapshots of one run costs little more than checking one. Returns
/// one report per snapshot, in the given order, or the first error.
///
/// This is how concurrent snapshots are checked: several snapshots overlap
/// in one trace, each process has one snapshot point per snapshot, and each
/// snapshot has its own label (the `checkpoint` of its
/// [`TraceEvent::Snapshot`] points). A label only names a snapshot here; it
/// implies no order, so any injective naming of
/// [`SnapshotId`](super::SnapshotId)s works (for example numbering them in
/// the order they first appear).
///
/// ```
/// use snapflow::protocol::oracle::{verify_each, ChannelEnds, RecordedChannels, Trace, TraceEvent};
/// use snapflow::protocol::CheckpointId;
///
/// // Two snapshots overlap: P0 starts "a" and P1 starts "b", while message
/// // 7 goes from P0 to P1 and message 8 from P1 to P0.
/// let (a, b) = (CheckpointId(1), CheckpointId(2));
/// let point = |process, checkpoint| TraceEvent::Snapshot { process, checkpoint };
/// let trace = Trace {
///     processes: 2,
///     channels: vec![ChannelEnds { from: 0, to: 1 }, ChannelEnds { from: 1, to: 0 }],
///     events: vec![
///         TraceEvent::Send { process: 0, channel: 0, message: 7 },
///         point(0, a),
///         TraceEvent::Send { process: 1, channel: 1, message: 8 },
///         point(1, b),
///         TraceEvent::Receive { process: 0, message: 8 },
///         point(0, b), // P1's marker of "b" arrives after message 8.
///         TraceEvent::Receive { process: 1, message: 7 },
///         point(1, a), // P0's marker of "a" arrives after message 7.
///     ],
/// };
/// // In "a", P0 snapshotted before receiving 8 and P1 after receiving 7.
/// let in_a = RecordedChannels { channels: vec![(1, vec![8])] };
/// // In "b", P1 snapshotted before receiving 7 and P0 after receiving 8.
/// let in_b = RecordedChannels { channels: vec![(0, vec![7])] };
/// let reports = verify_each(&trace, &[(a, in_a.clone()), (b, in_b)]).unwrap();
/// assert_eq!(reports.len(), 2);
/// assert!(verify_each(&trace, &[(b, in_a)]).is_err());
/// ```
pub fn verify_each(
    trace: &Trace,
    snapshots: &[(CheckpointId, RecordedChannels)],
) -> Result<Vec<CutReport>, OracleError> {
    let analysis = Analysis::new(trace)?;
    snapshots
        .iter()
        .map(|(checkpoint, recorded)| analysis.check_snapshot(trace, *checkpoint, recorded))
        .collect()
}

/// Checks the at-least-once promise for `checkpoint`: every message sent
/// before its sender's cut point was received before its receiver's cut
/// point or is in `recorded`, so nothing is lost after recovery (duplicates
/// are allowed, so the cut need not be consistent).
pub fn verify_at_least_once(
    trace: &Trace,
    checkpoint: CheckpointId,
    recorded: &RecordedChannels,
) -> Result<CutReport, OracleError> {
    let analysis = Analysis::new(trace)?;
    let cut = analysis.cut(trace, checkpoint)?;
    let mut saved: HashMap<ChannelId, &[MessageId]> = HashMap::new();
    for (channel, messages) in &recorded.channels {
        if *channel >= trace.channels.len() {
            return Err(OracleError::UnknownRecordedChannel { channel: *channel });
        }
        saved.insert(*channel, messages);
    }
    for channel in 0..trace.channels.len() {
        let saved = saved.get(&channel).copied().unwrap_or(&[]);
        let lost = analysis
            .in_flight(trace, channel, &cut)
            .into_iter()
            .find(|message| !saved.contains(message));
        if let Some(message) = lost {
            return Err(OracleError::LostMessage {
                checkpoint,
                message,
                send: analysis.sends[&message].event,
            });
        }
    }
    Ok(CutReport {
        checkpoint,
        events_in_cut: cut.events.iter().sum(),
        messages_in_flight: recorded.channels.iter().map(|(_, m)| m.len()).sum(),
    })
}

struct SendInfo {
    event: usize,
    channel: ChannelId,
    /// 1-based position among the sender's events.
    local: usize,
}

/// Per-event facts computed in one pass.
struct Analysis {
    /// Per process, the trace index of each of its events (1-based local
    /// index `i` is `events_of[p][i - 1]`); snapshot points excluded.
    events_of: Vec<Vec<usize>>,
    /// The vector clock after each non-snapshot event, by trace index.
    clocks: HashMap<usize, Vec<usize>>,
    /// The vector clock of each process at each of its snapshot points.
    snapshot_clocks: HashMap<usize, Vec<usize>>,
    sends: HashMap<MessageId, SendInfo>,
    /// Per received message, the receiver's 1-based local index.
    receives: HashMap<MessageId, usize>,
}

/// Per process, how many of its events are in the cut.
struct Cut {
    events: Vec<usize>,
    /// Per process, the trace index of its snapshot point.
    points: Vec<usize>,
}

impl Analysis {
    fn new(trace: &Trace) -> Result<Analysis, OracleError> {
        let malformed = |event, problem| OracleError::MalformedTrace { event, problem };
        for ends in &trace.channels {
            if ends.from >= trace.processes || ends.to >= trace.processes {
                return Err(malformed(0, TraceProblem::UnknownChannel));
            }
        }
        let mut analysis = Analysis {
            events_of: vec![Vec::new(); trace.processes],
            clocks: HashMap::new(),
            snapshot_clocks: HashMap::new(),
            sends: HashMap::new(),
            receives: HashMap::new(),
        };
        let mut clock = vec![vec![0usize; trace.processes]; trace.processes];
        let mut received_per_channel = vec![0usize; trace.channels.len()];
        let mut sent_per_channel: Vec<Vec<MessageId>> = vec![Vec::new(); trace.channels.len()];
        let mut message_clocks: HashMap<MessageId, Vec<usize>> = HashMap::new();
        for (index, event) in trace.events.iter().enumerate() {
            let process = event_process(event);
            if process >= trace.processes {
                return Err(malformed(index, TraceProblem::UnknownProcess));
            }
            match *event {
                TraceEvent::Snapshot { .. } => {
                    analysis
                        .snapshot_clocks
                        .insert(index, clock[process].clone());
                    continue;
                }
                TraceEvent::Send {
                    channel, message, ..
                } => {
                    let ends = trace
                        .channels
                        .get(channel)
                        .ok_or(malformed(index, TraceProblem::UnknownChannel))?;
                    if ends.from != process {
                        return Err(malformed(index, TraceProblem::WrongSender));
                    }
                    if analysis.sends.contains_key(&message) {
                        return Err(malformed(index, TraceProblem::DuplicateMessage));
                    }
                    clock[process][process] += 1;
                    message_clocks.insert(message, clock[process].clone());
                    sent_per_channel[channel].push(message);
                    let local = clock[process][process];
                    analysis.sends.insert(
                        message,
                        SendInfo {
                            event: index,
                            channel,
                            local,
                        },
                    );
                }
                TraceEvent::Receive { message, .. } => {
                    let send = analysis
                        .sends
                        .get(&message)
                        .ok_or(malformed(index, TraceProblem::ReceiveBeforeSend))?;
                    if trace.channels[send.channel].to != process {
                        return Err(malformed(index, TraceProblem::WrongReceiver));
                    }
                    if analysis.receives.contains_key(&message) {
                        return Err(malformed(index, TraceProblem::DuplicateReceive));
                    }
                    let position = &mut received_per_channel[send.channel];
                    if sent_per_channel[send.channel][*position] != message {
                        return Err(malformed(index, TraceProblem::NotFifo));
                    }
                    *position += 1;
                    let sent_clock = &message_clocks[&message];
                    for (mine, theirs) in clock[process].iter_mut().zip(sent_clock) {
                        *mine = (*mine).max(*theirs);
                    }
                    clock[process][process] += 1;
                    analysis.receives.insert(message, clock[process][process]);
                }
                TraceEvent::Local { .. } => clock[process][process] += 1,
            }
            analysis.events_of[process].push(index);
            analysis.clocks.insert(index, clock[process].clone());
        }
        Ok(analysis)
    }

    /// [`verify`]'s checks of one snapshot on an analysed trace.
    fn check_snapshot(
        &self,
        trace: &Trace,
        checkpoint: CheckpointId,
        recorded: &RecordedChannels,
    ) -> Result<CutReport, OracleError> {
        let cut = self.cut(trace, checkpoint)?;
        self.check_closed_under_happened_before(trace, checkpoint, &cut)?;
        let mut by_channel: HashMap<ChannelId, &[MessageId]> = HashMap::new();
        for (channel, messages) in &recorded.channels {
            if *channel >= trace.channels.len() {
                return Err(OracleError::UnknownRecordedChannel { channel: *channel });
            }
            by_channel.insert(*channel, messages);
        }
        for channel in 0..trace.channels.len() {
            let expected = self.in_flight(trace, channel, &cut);
            let recorded = by_channel.get(&channel).copied().unwrap_or(&[]);
            if expected != recorded {
                return Err(OracleError::ChannelStateMismatch {
                    checkpoint,
                    channel,
                    expected,
                    recorded: recorded.to_vec(),
                });
            }
        }
        Ok(CutReport {
            checkpoint,
            events_in_cut: cut.events.iter().sum(),
            messages_in_flight: recorded.channels.iter().map(|(_, m)| m.len()).sum(),
        })
    }

    fn cut(&self, trace: &Trace, checkpoint: CheckpointId) -> Result<Cut, OracleError> {
        let mut points: Vec<Option<usize>> = vec![None; trace.processes];
        for (index, event) in trace.events.iter().enumerate() {
            if let TraceEvent::Snapshot {
                process,
                checkpoint: at,
            } = *event
            {
                if at != checkpoint {
                    continue;
                }
                if let Some(first) = points[process].replace(index) {
                    return Err(OracleError::DuplicateSnapshot {
                        checkpoint,
                        process,
                        first,
                        second: index,
                    });
                }
            }
        }
        let mut cut = Cut {
            events: Vec::with_capacity(trace.processes),
            points: Vec::with_capacity(trace.processes),
        };
        for (process, point) in points.into_iter().enumerate() {
            let point = point.ok_or(OracleError::MissingSnapshot {
                checkpoint,
                process,
            })?;
            cut.events.push(self.snapshot_clocks[&point][process]);
            cut.points.push(point);
        }
        Ok(cut)
    }

    /// For each process p, its clock at its cut point says how many events
    /// of every other process q happened before p's last event in the cut;
    /// the cut is closed under happened-before iff that never exceeds q's
    /// events in the cut.
    fn check_closed_under_happened_before(
        &self,
        trace: &Trace,
        checkpoint: CheckpointId,
        cut: &Cut,
    ) -> Result<(), OracleError> {
        for process in 0..trace.processes {
            let known = &self.snapshot_clocks[&cut.points[process]];
            for (other, &happened_before) in known.iter().enumerate() {
                if happened_before <= cut.events[other] {
                    continue;
                }
                // Event number events[other] + 1 of `other` is outside the
                // cut and happened before `process`'s last event in it.
                let before = self.events_of[other][cut.events[other]];
                let after = self.events_of[process][cut.events[process] - 1];
                return Err(OracleError::NotACut {
                    checkpoint,
                    before,
                    before_event: trace.events[before],
                    after,
                    after_event: trace.events[after],
                });
            }
        }
        Ok(())
    }

    /// The messages of `channel` sent inside the sender's cut and not
    /// received inside the receiver's cut, in send order.
    fn in_flight(&self, trace: &Trace, channel: ChannelId, cut: &Cut) -> Vec<MessageId> {
        let ends = trace.channels[channel];
        let mut messages: Vec<(usize, MessageId)> = self
            .sends
            .iter()
            .filter(|(_, send)| send.channel == channel && send.local <= cut.events[ends.from])
            .filter(|(message, _)| {
                self.receives
                    .get(message)
                    .map_or(true, |&local| local > cut.events[ends.to])
            })
            .map(|(&message, send)| (send.event, message))
            .collect();
        messages.sort_unstable();
        messages.into_iter().map(|(_, message)| message).collect()
    }
}

fn event_process(event: &TraceEvent) -> ProcessId {
    match *event {
        TraceEvent::Send { process, .. }
        | TraceEvent::Receive { process, .. }
        | TraceEvent::Local { process }
        | TraceEvent::Snapshot { process, .. } => process,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: CheckpointId = CheckpointId(1);

    fn two_processes(events: Vec<TraceEvent>) -> Trace {
        Trace {
            processes: 2,
            channels: vec![
                ChannelEnds { from: 0, to: 1 },
                ChannelEnds { from: 1, to: 0 },
            ],
            events,
        }
    }

    fn send(process: ProcessId, channel: ChannelId, message: MessageId) -> TraceEvent {
        TraceEvent::Send {
            process,
            channel,
            message,
        }
    }

    fn receive(process: ProcessId, message: MessageId) -> TraceEvent {
        TraceEvent::Receive { process, message }
    }

    fn snap(process: ProcessId) -> TraceEvent {
        TraceEvent::Snapshot {
            process,
            checkpoint: ONE,
        }
    }

    fn check(
        events: Vec<TraceEvent>,
        recorded: &[(ChannelId, Vec<MessageId>)],
    ) -> Result<CutReport, OracleError> {
        let recorded = RecordedChannels {
            channels: recorded.to_vec(),
        };
        verify(&two_processes(events), ONE, &recorded)
    }

    #[test]
    fn in_flight_message_recorded_is_consistent() {
        let report = check(
            vec![send(0, 0, 1), snap(0), snap(1), receive(1, 1)],
            &[(0, vec![1])],
        );
        assert_eq!(report.expect("consistent").messages_in_flight, 1);
    }

    #[test]
    fn verify_each_checks_every_label_and_names_the_failing_one() {
        // Snapshot 1 takes P1 after it received message 1, snapshot 2 before.
        let two = CheckpointId(2);
        let snap_two = |process| TraceEvent::Snapshot {
            process,
            checkpoint: two,
        };
        let events = vec![send(0, 0, 1), snap(0), snap_two(1), snap_two(0)];
        let trace = two_processes([events, vec![receive(1, 1), snap(1)]].concat());
        let (empty, in_flight) = (RecordedChannels::default(), vec![(0, vec![1])]);
        let two_ok = RecordedChannels {
            channels: in_flight,
        };
        let reports = verify_each(&trace, &[(ONE, empty.clone()), (two, two_ok)]).unwrap();
        assert_eq!(
            (reports[1].checkpoint, reports[1].messages_in_flight),
            (two, 1)
        );
        let error = verify_each(&trace, &[(ONE, empty.clone()), (two, empty)]).unwrap_err();
        let names_two = matches!(error, OracleError::ChannelStateMismatch { checkpoint, .. } if checkpoint == two);
        assert!(names_two, "{error}");
    }

    #[test]
    fn in_flight_message_not_recorded_is_a_mismatch() {
        let error = check(vec![send(0, 0, 1), snap(0), snap(1), receive(1, 1)], &[]).unwrap_err();
        assert!(
            matches!(error, OracleError::ChannelStateMismatch { channel: 0, .. }),
            "{error}"
        );
    }

    #[test]
    fn receive_in_cut_of_send_outside_is_not_a_cut() {
        let error = check(vec![snap(0), send(0, 0, 1), receive(1, 1), snap(1)], &[]).unwrap_err();
        let want = OracleError::NotACut {
            checkpoint: ONE,
            before: 1,
            before_event: send(0, 0, 1),
            after: 2,
            after_event: receive(1, 1),
        };
        assert_eq!(error, want);
    }

    #[test]
    fn transitive_happened_before_is_caught() {
        // P0 sends m1 after its cut; P1 receives it, then sends m2 to P0
        // before P1's cut point... P1's cut includes the receive, so m1's
        // send (outside P0's cut) happened before an event in the cut.
        let events = vec![
            snap(0),
            send(0, 0, 1),
            receive(1, 1),
            send(1, 1, 2),
            snap(1),
            receive(0, 2),
        ];
        assert!(matches!(
            check(events, &[]).unwrap_err(),
            OracleError::NotACut { before: 1, .. }
        ));
    }

    #[test]
    fn missing_snapshot_is_reported() {
        let error = check(vec![snap(0)], &[]).unwrap_err();
        assert_eq!(
            error,
            OracleError::MissingSnapshot {
                checkpoint: ONE,
                process: 1
            }
        );
    }

    #[test]
    fn duplicate_snapshot_is_reported() {
        let error = check(vec![snap(0), snap(0), snap(1)], &[]).unwrap_err();
        assert!(matches!(
            error,
            OracleError::DuplicateSnapshot {
                first: 0,
                second: 1,
                ..
            }
        ));
    }

    #[test]
    fn non_fifo_receive_is_malformed() {
        let events = vec![send(0, 0, 1), send(0, 0, 2), receive(1, 2)];
        let error = check(events, &[]).unwrap_err();
        assert_eq!(
            error,
            OracleError::MalformedTrace {
                event: 2,
                problem: TraceProblem::NotFifo
            }
        );
    }

    #[test]
    fn receive_by_the_wrong_process_is_malformed() {
        let error = check(vec![send(0, 0, 1), receive(0, 1)], &[]).unwrap_err();
        assert_eq!(
            error,
            OracleError::MalformedTrace {
                event: 1,
                problem: TraceProblem::WrongReceiver
            }
        );
    }

    #[test]
    fn at_least_once_reports_a_lost_message() {
        let trace = two_processes(vec![send(0, 0, 1), snap(0), snap(1), receive(1, 1)]);
        let error = verify_at_least_once(&trace, ONE, &RecordedChannels::default()).unwrap_err();
        assert_eq!(
            error,
            OracleError::LostMessage {
                checkpoint: ONE,
                message: 1,
                send: 0
            }
        );
    }

    #[test]
    fn at_least_once_accepts_duplicates() {
        let trace = two_processes(vec![snap(0), send(0, 0, 1), receive(1, 1), snap(1)]);
        assert!(verify_at_least_once(&trace, ONE, &RecordedChannels::default()).is_ok());
    }

    #[test]
    fn at_least_once_accepts_a_recorded_message() {
        let trace = two_processes(vec![send(0, 0, 1), snap(0), snap(1), receive(1, 1)]);
        let recorded = RecordedChannels {
            channels: vec![(0, vec![1])],
        };
        assert!(verify_at_least_once(&trace, ONE, &recorded).is_ok());
    }
}
