//! The shells' side of snapshots that are not checkpoints: one
//! [`ConcurrentMachine`] per subtask, beside the coordinated
//! [`NodeMachine`](crate::protocol::NodeMachine) that runs recovery
//! checkpoints, and the carrying out of its actions.
//!
//! It owns the translation between the in-band [`Control::Marker`] items,
//! the injected starts and joins, the operator's own requests
//! ([`SnapshotStarter`](crate::job::snapshots::SnapshotStarter)) and the
//! machine, and the encoding of a finished part for the supervisor. The
//! two machines never see each other's items: barriers go only to the
//! coordinated machine, markers only to this one, so a snapshot never
//! holds a channel, never delays a checkpoint and is never stored.
//!
//! Cost for a job that never starts such a snapshot: per batch, one call
//! of [`ConcurrentMachine::on_data`] (one branch), two additions, and for
//! custom operators one atomic load; no allocation, nothing per record.
//! It never decides a protocol question (the machine does).

use std::sync::Arc;

use crate::job::snapshots::{Requests, SnapshotReply, Waiting, CONCURRENT_PER_SUBTASK_MAX};
use crate::protocol::{
    ConcurrentAction, ConcurrentConfig, ConcurrentDeclineReason, ConcurrentMachine, SnapshotId,
};
use crate::runtime::BoxError;

use super::env::ShellEnv;
use super::event::{Data, NodeEventKind};
use super::part::{encode_batches, PartBytes};

/// The bits of a sequence number left for one generation's snapshots: a
/// generation starts numbering at `generation << 32`, so ids stay unique
/// over the job's restarts.
const SEQUENCE_BITS_PER_GENERATION: u32 = 32;

/// What the driver needs from the shell while it carries out actions.
pub(crate) trait SnapshotHost {
    /// The local state as bytes, read without side effects.
    fn capture(&mut self) -> Result<Vec<u8>, BoxError>;
    /// What the operator declares it waits for.
    fn waiting(&self) -> Waiting;
    /// Sends the marker on every open output.
    fn emit_marker(&mut self, snapshot: SnapshotId);
    /// Per output, the records pushed into it so far, read right after
    /// the marker (so: every record ahead of it).
    fn records_accepted(&mut self) -> Vec<u64>;
}

/// A local state taken and not yet reported.
struct Taken {
    snapshot: SnapshotId,
    state: Vec<u8>,
    records_in: u64,
    records_out: u64,
    inputs_ended: Vec<bool>,
    waiting: Waiting,
    /// Per input, the records processed before the local state was taken.
    processed: Vec<u64>,
    /// Per output, the records ahead of the snapshot's marker.
    sent: Vec<u64>,
}

/// One subtask's concurrent-snapshot driver.
pub(crate) struct SnapshotDriver<In> {
    machine: ConcurrentMachine<Vec<In>>,
    /// The operator's own requests (custom operators only).
    requests: Option<Arc<Requests>>,
    /// At most [`CONCURRENT_PER_SUBTASK_MAX`] entries: one per snapshot
    /// the machine takes part in.
    taken: Vec<Taken>,
    /// Records processed and emitted by this subtask in this generation.
    pub(crate) records_in: u64,
    pub(crate) records_out: u64,
    /// Per input, the records processed from it in this generation, for
    /// the supervisor's check of every channel of a snapshot.
    processed: Vec<u64>,
}

impl<In: Data> SnapshotDriver<In> {
    pub(crate) fn new(env: &ShellEnv, inputs: usize, requests: Option<Arc<Requests>>) -> Self {
        let first_sequence = env.generation.0 << SEQUENCE_BITS_PER_GENERATION;
        let config = ConcurrentConfig::new(env.node, inputs)
            .with_max_concurrent(CONCURRENT_PER_SUBTASK_MAX)
            .with_first_sequence(first_sequence);
        let machine = match ConcurrentMachine::new(config) {
            Ok(machine) => machine,
            // The bound above is a positive constant.
            Err(error) => unreachable!("{error}"),
        };
        SnapshotDriver {
            machine,
            requests,
            taken: Vec::new(),
            records_in: 0,
            records_out: 0,
            processed: vec![0; inputs],
        }
    }

    /// A batch arrived on `input` and is processed right after.
    #[inline]
    pub(crate) fn on_data(&mut self, input: usize, batch: &Vec<In>) {
        self.machine.on_data(input, batch);
        if let Some(processed) = self.processed.get_mut(input) {
            *processed += batch.len() as u64;
        }
    }

    /// Forgets the records counted as taken in so far (those a restore
    /// replayed from recorded channel state, which no sender of this
    /// generation pushed). What they made the subtask emit stays counted:
    /// it went out on this generation's channels.
    pub(crate) fn forget_processed(&mut self) {
        self.processed
            .iter_mut()
            .for_each(|processed| *processed = 0);
        self.records_in = 0;
    }

    /// Whether the operator asked for a snapshot (one atomic load, custom
    /// operators only).
    #[inline]
    pub(crate) fn has_requests(&self) -> bool {
        self.requests
            .as_ref()
            .is_some_and(|requests| requests.is_pending())
    }

    pub(crate) fn on_marker(
        &mut self,
        input: usize,
        snapshot: SnapshotId,
        env: &ShellEnv,
        host: &mut dyn SnapshotHost,
    ) -> Result<(), BoxError> {
        self.machine.on_marker(input, snapshot);
        self.drive(env, host)
    }

    pub(crate) fn on_end(
        &mut self,
        input: usize,
        env: &ShellEnv,
        host: &mut dyn SnapshotHost,
    ) -> Result<(), BoxError> {
        if self.machine.input_ended(input) {
            return Ok(());
        }
        self.machine.on_end_of_input(input);
        self.drive(env, host)
    }

    pub(crate) fn join(
        &mut self,
        snapshot: SnapshotId,
        env: &ShellEnv,
        host: &mut dyn SnapshotHost,
    ) -> Result<(), BoxError> {
        if self.machine.join_snapshot(snapshot) {
            self.drive(env, host)?;
        }
        Ok(())
    }

    /// Starts one snapshot per pending request of the operator (or one for
    /// the supervisor when `reply` is `None` and there are none).
    pub(crate) fn start_requested(
        &mut self,
        env: &ShellEnv,
        host: &mut dyn SnapshotHost,
    ) -> Result<(), BoxError> {
        let replies = match &self.requests {
            Some(requests) => requests.take(),
            None => Vec::new(),
        };
        for reply in replies {
            self.start(Some(reply), env, host)?;
        }
        Ok(())
    }

    /// Starts a snapshot here. The supervisor hears of it before any marker
    /// leaves, so it knows the snapshot before any part of it arrives.
    pub(crate) fn start(
        &mut self,
        reply: Option<SnapshotReply>,
        env: &ShellEnv,
        host: &mut dyn SnapshotHost,
    ) -> Result<(), BoxError> {
        let snapshot = self.machine.start_snapshot();
        // A start over the bound gives exactly one action, its decline.
        let first = self.machine.poll_action();
        let declined = match &first {
            Some(ConcurrentAction::Decline {
                reason: ConcurrentDeclineReason::TooManyConcurrent { max_concurrent },
                ..
            }) => Some(*max_concurrent),
            _ => None,
        };
        env.tell(NodeEventKind::SnapshotStarted {
            snapshot,
            reply,
            declined,
        });
        if declined.is_some() {
            return self.drive(env, host);
        }
        if let Some(action) = first {
            self.act(action, env, host)?;
        }
        self.drive(env, host)
    }

    fn drive(&mut self, env: &ShellEnv, host: &mut dyn SnapshotHost) -> Result<(), BoxError> {
        while let Some(action) = self.machine.poll_action() {
            self.act(action, env, host)?;
        }
        Ok(())
    }

    fn act(
        &mut self,
        action: ConcurrentAction<Vec<In>>,
        env: &ShellEnv,
        host: &mut dyn SnapshotHost,
    ) -> Result<(), BoxError> {
        match action {
            ConcurrentAction::TakeSnapshot(token) => {
                let inputs_ended = (0..self.machine.input_count())
                    .map(|input| self.machine.input_ended(input))
                    .collect();
                self.taken.push(Taken {
                    snapshot: token.snapshot(),
                    state: host.capture()?,
                    records_in: self.records_in,
                    records_out: self.records_out,
                    inputs_ended,
                    waiting: host.waiting(),
                    processed: self.processed.clone(),
                    // Nothing is pushed between the state and the marker;
                    // read again after the marker, for certainty.
                    sent: host.records_accepted(),
                });
                self.machine.state_recorded(token);
            }
            ConcurrentAction::EmitMarker(snapshot) => {
                host.emit_marker(snapshot);
                let sent = host.records_accepted();
                if let Some(taken) = self.taken.iter_mut().find(|t| t.snapshot == snapshot) {
                    taken.sent = sent;
                }
            }
            ConcurrentAction::ReportPart(part) => {
                let index = self
                    .taken
                    .iter()
                    .position(|taken| taken.snapshot == part.snapshot)
                    .ok_or_else(|| format!("no state taken for {}", part.snapshot))?;
                let taken = self.taken.swap_remove(index);
                let mut channels = Vec::with_capacity(part.channel_states.len());
                let mut in_flight = Vec::with_capacity(part.channel_states.len());
                for channel in part.channel_states {
                    in_flight.push(channel.messages.iter().map(Vec::len).sum::<usize>() as u64);
                    channels.push((channel.channel as u32, encode_batches(&channel.messages)?));
                }
                let bytes = PartBytes {
                    state: taken.state,
                    channels,
                    time: None,
                }
                .encode()?;
                env.tell(NodeEventKind::SnapshotPart {
                    snapshot: part.snapshot,
                    part: bytes,
                    activity: Box::new(PartActivity {
                        records_in: taken.records_in,
                        records_out: taken.records_out,
                        inputs_ended: taken.inputs_ended,
                        waiting: taken.waiting,
                        in_flight,
                        processed: taken.processed,
                        sent: taken.sent,
                    }),
                });
            }
            ConcurrentAction::Decline { snapshot, reason } => {
                let ConcurrentDeclineReason::TooManyConcurrent { max_concurrent } = reason;
                env.tell(NodeEventKind::SnapshotDeclined {
                    snapshot,
                    max_concurrent,
                });
            }
        }
        Ok(())
    }
}

/// What a part says of its subtask besides state and records.
#[derive(Debug)]
pub(crate) struct PartActivity {
    pub(crate) records_in: u64,
    pub(crate) records_out: u64,
    pub(crate) inputs_ended: Vec<bool>,
    pub(crate) waiting: Waiting,
    /// Per input: the records recorded in flight on it.
    pub(crate) in_flight: Vec<u64>,
    /// Per input: the records processed from it before the local state.
    pub(crate) processed: Vec<u64>,
    /// Per output: the records ahead of the snapshot's marker.
    pub(crate) sent: Vec<u64>,
}
