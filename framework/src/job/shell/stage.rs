//! The stage shell: one operator instance with inputs, its barrier
//! alignments and, at the head of an iteration, the loop-ending rule.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::protocol::{CheckpointId, Delivery, NodeAction, NodeMachine};
use crate::runtime::channel::Outputs;
use crate::runtime::stage::{StageIo, StageLogic};
use crate::runtime::BoxError;

use super::env::{Core, ShellEnv};
use super::event::{Control, Data, InputItem, NodeEventKind};
use super::part::{decode_channel, encode_channel, PartBytes};
use super::pending::{PendingPart, TakenState};
use super::snapshot::{SnapshotDriver, SnapshotHost};
use super::taken::{BarrierKinds, TakenStates};
use crate::job::route::{Collector, Router};
use crate::metrics::BytesSeen;
use crate::source::Guarantee;
use crate::watermark::{Advance, InputWatermarks, WATERMARK_MAX_MS};

/// Barrier alignment per checkpoint in flight: when the first barrier
/// arrived, then how long it took until the snapshot. Bounded like
/// [`TakenStates`]: entries go when reported, aborted or subsumed.
#[derive(Default)]
struct Alignments {
    entries: Vec<(CheckpointId, Instant, Option<u64>)>,
}

impl Alignments {
    fn barrier(&mut self, checkpoint: CheckpointId) {
        if !self.entries.iter().any(|(id, ..)| *id == checkpoint) {
            self.entries.push((checkpoint, Instant::now(), None));
        }
    }

    fn snapshot(&mut self, checkpoint: CheckpointId) {
        if let Some((_, first, aligned)) =
            self.entries.iter_mut().find(|(id, ..)| *id == checkpoint)
        {
            let micros = first.elapsed().as_micros();
            *aligned = Some(u64::try_from(micros).unwrap_or(u64::MAX));
        }
    }

    fn take(&mut self, checkpoint: CheckpointId) -> u64 {
        let index = self.entries.iter().position(|(id, ..)| *id == checkpoint);
        index
            .and_then(|index| self.entries.remove(index).2)
            .unwrap_or(0)
    }

    fn forget_up_to(&mut self, checkpoint: CheckpointId) {
        self.entries.retain(|(id, ..)| *id > checkpoint);
    }
}

/// The loop-ending rule of an iteration head (as Flink's bounded
/// iterations): once every input that is not a feedback edge has ended,
/// and no feedback batch arrived for `idle_ms`, the feedback inputs are
/// ended by the head itself (the machine sees an end of input on them), so
/// the end of input can flow around the loop. Whatever still arrives on a
/// feedback input afterwards is dropped: choose `idle_ms` above the loop's
/// latency.
struct LoopHead {
    /// Per input channel: whether it is a feedback edge.
    feedback: Vec<bool>,
    idle_ms: u64,
    last_feedback: Instant,
    ended: bool,
}

impl LoopHead {
    /// Whether an item on `input` is dropped because the loop has ended;
    /// a record batch on a feedback input also counts as loop activity
    /// (barriers do not: they circulate as long as checkpoints run).
    fn is_dropped(&mut self, input: usize, records: bool) -> bool {
        if !self.feedback.get(input).copied().unwrap_or(false) {
            return false;
        }
        if records {
            self.last_feedback = Instant::now();
        }
        self.ended
    }
}

/// The stage shell: one operator instance with inputs.
pub(crate) struct StageShell<In: Data, Out: Data> {
    loop_head: Option<LoopHead>,
    env: ShellEnv,
    machine: NodeMachine<InputItem<In>>,
    core: Box<dyn Core<In, Out>>,
    router: Router<Out>,
    /// States as taken at the snapshot ([`Core::take_state`]).
    taken: TakenStates<TakenState>,
    /// The watermarks taken with each state in `taken` (empty: none).
    taken_time: TakenStates,
    alignments: Alignments,
    /// The kind of each checkpoint in flight, as its barrier or trigger
    /// carried it.
    kinds: BarrierKinds,
    watermarks: InputWatermarks,
    inputs_ended: bool,
    trigger_requested: bool,
    /// Snapshots that are not checkpoints (see `snapshot.rs`).
    snapshots: SnapshotDriver<In>,
    /// A sink's bytes written on their way to the live metrics.
    bytes_out: BytesSeen,
}

impl<In: Data, Out: Data> StageShell<In, Out> {
    pub(crate) fn new(
        env: ShellEnv,
        machine: NodeMachine<InputItem<In>>,
        core: Box<dyn Core<In, Out>>,
        router: Router<Out>,
        feedback: Vec<bool>,
    ) -> Self {
        // No flags (a graph without loops) means no back edges.
        let back_edge = (0..machine.input_count())
            .map(|input| feedback.get(input).copied().unwrap_or(false))
            .collect();
        let loop_head = env.loop_idle_ms.map(|idle_ms| LoopHead {
            feedback,
            idle_ms,
            last_feedback: Instant::now(),
            ended: false,
        });
        let snapshots = SnapshotDriver::new(&env, machine.input_count(), core.snapshot_requests());
        StageShell {
            snapshots,
            loop_head,
            env,
            machine,
            core,
            router,
            taken: TakenStates::default(),
            taken_time: TakenStates::default(),
            alignments: Alignments::default(),
            kinds: BarrierKinds::default(),
            watermarks: InputWatermarks::new(back_edge),
            inputs_ended: false,
            trigger_requested: false,
            bytes_out: BytesSeen::default(),
        }
    }

    fn process(
        &mut self,
        batch: Vec<In>,
        outputs: &mut Outputs<Out, Control>,
    ) -> Result<(), BoxError> {
        let records = batch.len() as u64;
        let mut collector = Collector::new(outputs, &mut self.router);
        let result = self.core.process(batch, &mut collector);
        let emitted = collector.finish();
        self.snapshots.records_in += records;
        self.snapshots.records_out += emitted;
        let counters = &self.env.counters;
        counters.records_in.fetch_add(records, Ordering::Relaxed);
        counters.records_out.fetch_add(emitted, Ordering::Relaxed);
        result
    }

    /// Carries out the machine's actions in order, then mirrors its holds
    /// onto the stage's inputs and reports what changed.
    fn drive(&mut self, io: &mut StageIo<'_, Out, Control>) -> Result<(), BoxError> {
        while let Some(action) = self.machine.poll_action() {
            match action {
                NodeAction::Process { message, channel } => {
                    self.apply(channel, message, io)?;
                }
                NodeAction::TakeSnapshot(token) => {
                    let checkpoint = token.checkpoint();
                    self.alignments.snapshot(checkpoint);
                    let started = Instant::now();
                    let state = self
                        .core
                        .take_state(checkpoint, self.kinds.kind(checkpoint))?;
                    self.env.note_sync_part(checkpoint, started);
                    self.taken.insert(checkpoint, state);
                    let time = if self.watermarks.is_pristine() {
                        Vec::new()
                    } else {
                        self.watermarks.state().encode()?
                    };
                    self.taken_time.insert(checkpoint, time);
                    // The state is captured (as bytes, or handed off
                    // immutable): safe for the protocol.
                    self.machine.state_recorded(token);
                }
                NodeAction::EmitBarrier(checkpoint) => {
                    if !self.inputs_ended {
                        let kind = self.kinds.kind(checkpoint);
                        io.outputs()
                            .broadcast_control(Control::Barrier(checkpoint, kind));
                    }
                }
                NodeAction::ReportPart(part) => {
                    let state = self.taken.take(part.checkpoint)?;
                    let mut channels = Vec::with_capacity(part.channel_states.len());
                    for channel_state in part.channel_states {
                        channels.push((
                            channel_state.channel as u32,
                            encode_channel(&channel_state.messages)?,
                        ));
                    }
                    let time =
                        Some(self.taken_time.take(part.checkpoint)?).filter(|t| !t.is_empty());
                    let part_bytes = PendingPart::new(state, channels, time)?;
                    self.env.tell(NodeEventKind::Ack {
                        checkpoint: part.checkpoint,
                        part: part_bytes,
                        alignment_us: self.alignments.take(part.checkpoint),
                    });
                }
                NodeAction::Decline { checkpoint, reason } => {
                    self.forget_up_to(checkpoint);
                    self.env.tell(NodeEventKind::Decline { checkpoint, reason });
                }
            }
        }
        for input in 0..self.machine.input_count() {
            if self.machine.is_held(input) {
                io.hold_input(input);
            } else {
                io.release_input(input);
            }
        }
        self.after_input(io)
    }

    /// Forgets what was taken for `checkpoint` and older ones.
    fn forget_up_to(&mut self, checkpoint: CheckpointId) {
        self.taken.forget_up_to(checkpoint);
        self.taken_time.forget_up_to(checkpoint);
        self.alignments.forget_up_to(checkpoint);
        self.kinds.forget_up_to(checkpoint);
    }

    /// Carries out what a change of the input watermarks asks for: fires
    /// what is due, then sends the watermark (or the idleness mark) on
    /// every output, so the output comes first.
    fn on_time(
        &mut self,
        advance: Advance,
        io: &mut StageIo<'_, Out, Control>,
    ) -> Result<(), BoxError> {
        let control = match advance {
            Advance::None => return Ok(()),
            Advance::Idle => Control::Idle,
            Advance::To(watermark_ms) => {
                let mut collector = Collector::new(io.outputs(), &mut self.router);
                let result = self.core.on_watermark(watermark_ms, &mut collector);
                let emitted = collector.finish();
                self.env
                    .counters
                    .records_out
                    .fetch_add(emitted, Ordering::Relaxed);
                result?;
                if watermark_ms == WATERMARK_MAX_MS {
                    // +infinity travels as the end of input that follows.
                    return Ok(());
                }
                self.env.note_watermark(watermark_ms);
                Control::Watermark(watermark_ms)
            }
        };
        if !self.inputs_ended {
            io.outputs().broadcast_control(control);
        }
        Ok(())
    }

    /// A watermark or idleness mark arrived on `input`: it passes the
    /// machine like a batch, so a recorded channel keeps it in order.
    fn on_mark(
        &mut self,
        input: usize,
        mark: InputItem<In>,
        io: &mut StageIo<'_, Out, Control>,
    ) -> Result<(), BoxError> {
        if let Delivery::Process(mark) = self.machine.on_data(input, mark) {
            self.apply(input, mark, io)?;
        }
        if self.machine.has_checkpoint_in_flight() {
            self.drive(io)?;
        }
        Ok(())
    }

    /// Processes one item the machine released (or a restore replays):
    /// records go to the core, time marks to the input watermarks, whose
    /// advance fires what is due before the mark travels on.
    fn apply(
        &mut self,
        input: usize,
        item: InputItem<In>,
        io: &mut StageIo<'_, Out, Control>,
    ) -> Result<(), BoxError> {
        let advance = match item {
            InputItem::Records(batch) => {
                self.snapshots.on_data(input, &batch);
                return self.process(batch, io.outputs());
            }
            InputItem::Watermark(watermark_ms) => {
                let regressions = self.watermarks.regressions();
                let advance = self.watermarks.on_watermark(input, watermark_ms);
                if self.watermarks.regressions() != regressions {
                    self.env
                        .counters
                        .watermark_regressions
                        .fetch_add(1, Ordering::Relaxed);
                }
                advance
            }
            InputItem::Idle => self.watermarks.on_idle(input),
        };
        self.on_time(advance, io)
    }

    fn note_guarantee(&self) {
        if self.core.guarantee() == Guarantee::AtLeastOnce {
            self.env
                .counters
                .at_least_once
                .store(true, Ordering::Relaxed);
        }
    }

    fn after_input(&mut self, io: &mut StageIo<'_, Out, Control>) -> Result<(), BoxError> {
        if !self.inputs_ended && self.machine.all_inputs_ended() {
            self.inputs_ended = true;
            let mut collector = Collector::new(io.outputs(), &mut self.router);
            self.core.on_end(&mut collector)?;
            let emitted = collector.finish();
            drop(collector);
            self.env
                .counters
                .records_out
                .fetch_add(emitted, Ordering::Relaxed);
            io.outputs().broadcast_control(Control::End);
            io.outputs().flush_all();
        }
        if !self.trigger_requested && self.machine.needs_trigger() {
            self.trigger_requested = true;
            self.env.tell(NodeEventKind::InputsEnded);
        }
        Ok(())
    }

    fn restore(&mut self, io: &mut StageIo<'_, Out, Control>) -> Result<(), BoxError> {
        let Some(bytes) = self.env.restore.take() else {
            self.core.restore(None)?;
            self.note_guarantee();
            return Ok(());
        };
        let part = PartBytes::decode(&bytes)?;
        self.core.restore(Some(&part.state))?;
        self.note_guarantee();
        // The watermarks resume from the snapshot, never from the minimum.
        if let Some(watermarks) = part.watermarks()? {
            self.watermarks.restore(watermarks);
        }
        // Recorded channel state is delivered before any new input: this
        // runs before the stage processes its first delivery. Its time
        // marks are applied in their place among its records, as they
        // were before the failure.
        for (channel, messages) in part.channels {
            let input = channel as usize;
            for item in decode_channel::<In>(&messages)? {
                if matches!(item, InputItem::Records(_)) {
                    self.watermarks.on_batch(input);
                }
                self.apply(input, item, io)?;
            }
        }
        // The replayed records came from the checkpoint, not from this
        // generation's channels: a snapshot's check counts only the latter.
        self.snapshots.forget_processed();
        // Sent again, after the replay: downstream has it already (it came
        // before this stage's barrier, or in the replay) and ignores an
        // equal watermark; a checkpoint written before recorded channel
        // state kept its time marks lost the in-flight one, and this
        // sends it on. An idle output sends its idleness again instead: a
        // watermark would make it active downstream, where it would hold
        // the minimum back until its inputs wake up (an idle input that
        // stays idle sends nothing new).
        if self.watermarks.output_is_idle() {
            io.outputs().broadcast_control(Control::Idle);
        } else if let Some(watermark_ms) = self.watermarks.output_ms() {
            io.outputs()
                .broadcast_control(Control::Watermark(watermark_ms));
        }
        // Processing-time timers that came due while the job was down
        // fire now, before any new input.
        self.on_processing_time(io)
    }
}

impl<In: Data, Out: Data> StageLogic for StageShell<In, Out> {
    type In = In;
    type Out = Out;
    type Control = Control;

    /// A sink's bytes written, into the subtask's cell (other cores
    /// count none: records are not serialized between operators).
    fn record_metrics(&mut self, _now: Instant) {
        if let (Some(cell), Some(total)) = (&self.env.metrics, self.core.bytes_written()) {
            cell.add_bytes_out(self.bytes_out.delta(total));
        }
    }

    fn on_batch(
        &mut self,
        input: usize,
        batch: Vec<In>,
        io: &mut StageIo<'_, Out, Control>,
    ) -> Result<(), BoxError> {
        let _entered = self.env.enter();
        if let Some(head) = &mut self.loop_head {
            if head.is_dropped(input, true) {
                return Ok(());
            }
        }
        self.watermarks.on_batch(input);
        // The machine hands back what it was given or holds it.
        if let Delivery::Process(InputItem::Records(batch)) =
            self.machine.on_data(input, InputItem::Records(batch))
        {
            self.snapshots.on_data(input, &batch);
            self.process(batch, io.outputs())?;
            if self.snapshots.has_requests() {
                self.start_requested(io)?;
            }
        }
        // No action can be queued after a plain data message (a held one
        // comes back as `Process`), but the contract says drain.
        if self.machine.has_checkpoint_in_flight() {
            self.drive(io)?;
        }
        Ok(())
    }

    fn on_control(
        &mut self,
        input: usize,
        control: Control,
        io: &mut StageIo<'_, Out, Control>,
    ) -> Result<(), BoxError> {
        let _entered = self.env.enter();
        if let Some(head) = &mut self.loop_head {
            if head.is_dropped(input, false) {
                return Ok(());
            }
        }
        match control {
            Control::Barrier(checkpoint, kind) => {
                self.kinds.note(checkpoint, kind);
                self.alignments.barrier(checkpoint);
                self.machine.on_barrier(input, checkpoint);
            }
            Control::End => {
                // End of input is watermark +infinity on the channel: what
                // it makes due fires before the end travels on.
                let advance = self.watermarks.on_end(input);
                self.on_time(advance, io)?;
                self.machine.on_end_of_input(input);
                self.snapshot_end(input, io)?;
            }
            Control::Marker(snapshot) => {
                // A held input delivers nothing, so the coordinated machine
                // holds no batch of this input that came before the marker.
                debug_assert_eq!(self.machine.held_len(input), 0);
                let (snapshots, mut host) = self.snapshot_host(io);
                return snapshots.on_marker(input, snapshot, host.env, &mut host);
            }
            Control::Watermark(watermark_ms) => {
                return self.on_mark(input, InputItem::Watermark(watermark_ms), io);
            }
            Control::Idle => return self.on_mark(input, InputItem::Idle, io),
            other => return Err(format!("{other:?} arrived in-band").into()),
        }
        self.drive(io)
    }

    fn tick_interval_ms(&self) -> Option<u64> {
        self.core.processing_tick_ms()
    }

    fn on_tick(&mut self, io: &mut StageIo<'_, Out, Control>) -> Result<(), BoxError> {
        let _entered = self.env.enter();
        self.on_processing_time(io)
    }

    fn on_started(&mut self, io: &mut StageIo<'_, Out, Control>) -> Result<(), BoxError> {
        let _entered = self.env.enter();
        self.restore(io)?;
        // A stage without inputs has ended at once.
        self.after_input(io)
    }

    fn on_injected(
        &mut self,
        control: Control,
        io: &mut StageIo<'_, Out, Control>,
    ) -> Result<(), BoxError> {
        let _entered = self.env.enter();
        match control {
            Control::Trigger(checkpoint, kind) => {
                self.kinds.note(checkpoint, kind);
                self.machine.on_trigger(checkpoint);
            }
            Control::Abort(checkpoint) => {
                self.forget_up_to(checkpoint);
                self.machine.on_abort(checkpoint);
            }
            Control::Complete(checkpoint) => {
                self.machine.on_complete(checkpoint);
                self.forget_up_to(checkpoint);
                self.core.on_complete(checkpoint)?;
                self.env.tell(NodeEventKind::Committed { checkpoint });
            }
            Control::Tick => self.maybe_end_loop(io, false)?,
            Control::EndLoop => self.maybe_end_loop(io, true)?,
            Control::StartSnapshot => {
                let (snapshots, mut host) = self.snapshot_host(io);
                snapshots.start(None, host.env, &mut host)?;
            }
            Control::JoinSnapshot(snapshot) => {
                let (snapshots, mut host) = self.snapshot_host(io);
                snapshots.join(snapshot, host.env, &mut host)?;
            }
            other => return Err(format!("{other:?} was injected").into()),
        }
        self.drive(io)
    }
}

impl<In: Data, Out: Data> StageShell<In, Out> {
    /// Fires the processing-time timers the clock made due. Nothing after
    /// end of input: the core fired every pending one then.
    fn on_processing_time(&mut self, io: &mut StageIo<'_, Out, Control>) -> Result<(), BoxError> {
        if self.inputs_ended || self.core.processing_tick_ms().is_none() {
            return Ok(());
        }
        let mut collector = Collector::new(io.outputs(), &mut self.router);
        let result = self.core.on_processing_time(&mut collector);
        let emitted = collector.finish();
        self.env
            .counters
            .records_out
            .fetch_add(emitted, Ordering::Relaxed);
        result
    }

    /// The loop head's rule (see [`LoopHead`]): ends the feedback inputs
    /// once the loop has been idle long enough (or at once when `proved`: a
    /// snapshot showed the loop quiescent), driving the machine after
    /// each end as the contract says.
    fn maybe_end_loop(
        &mut self,
        io: &mut StageIo<'_, Out, Control>,
        proved: bool,
    ) -> Result<(), BoxError> {
        let Some(head) = &mut self.loop_head else {
            return Ok(());
        };
        let idle = proved || head.last_feedback.elapsed() >= Duration::from_millis(head.idle_ms);
        if head.ended || !idle || !self.machine.needs_trigger() {
            return Ok(());
        }
        head.ended = true;
        let feedback: Vec<usize> = (0..head.feedback.len())
            .filter(|&input| head.feedback[input])
            .collect();
        tracing::debug!(node = self.env.node, "iteration idle: ending its feedback");
        for input in feedback {
            self.machine.on_end_of_input(input);
            self.snapshot_end(input, io)?;
            self.drive(io)?;
        }
        Ok(())
    }
}

/// The stage as the snapshot driver sees it while it carries out actions.
struct StageHost<'a, 'io, In, Out: Data> {
    env: &'a super::env::ShellEnv,
    core: &'a mut Box<dyn Core<In, Out>>,
    io: &'a mut StageIo<'io, Out, Control>,
    inputs_ended: bool,
}

impl<In: Data, Out: Data> SnapshotHost for StageHost<'_, '_, In, Out> {
    fn capture(&mut self) -> Result<Vec<u8>, BoxError> {
        self.core.capture()
    }

    fn waiting(&self) -> crate::job::snapshots::Waiting {
        self.core.waiting()
    }

    fn emit_marker(&mut self, snapshot: crate::protocol::SnapshotId) {
        // Ended outputs carry nothing more; their end counts as the marker.
        if !self.inputs_ended {
            self.io
                .outputs()
                .broadcast_control(Control::Marker(snapshot));
        }
    }

    fn records_accepted(&mut self) -> Vec<u64> {
        self.io.outputs().records_accepted()
    }
}

impl<In: Data, Out: Data> StageShell<In, Out> {
    fn snapshot_host<'a, 'io>(
        &'a mut self,
        io: &'a mut StageIo<'io, Out, Control>,
    ) -> (&'a mut SnapshotDriver<In>, StageHost<'a, 'io, In, Out>) {
        let host = StageHost {
            env: &self.env,
            core: &mut self.core,
            io,
            inputs_ended: self.inputs_ended,
        };
        (&mut self.snapshots, host)
    }

    fn snapshot_end(
        &mut self,
        input: usize,
        io: &mut StageIo<'_, Out, Control>,
    ) -> Result<(), BoxError> {
        let (snapshots, mut host) = self.snapshot_host(io);
        snapshots.on_end(input, host.env, &mut host)
    }

    fn start_requested(&mut self, io: &mut StageIo<'_, Out, Control>) -> Result<(), BoxError> {
        let (snapshots, mut host) = self.snapshot_host(io);
        snapshots.start_requested(host.env, &mut host)
    }
}

#[cfg(test)]
mod alignment_tests {
    use super::*;

    fn check(steps: &[(&str, u64)], take: u64, want_some: bool) {
        let mut alignments = Alignments::default();
        for &(step, checkpoint) in steps {
            match step {
                "barrier" => alignments.barrier(CheckpointId(checkpoint)),
                "snapshot" => alignments.snapshot(CheckpointId(checkpoint)),
                "forget" => alignments.forget_up_to(CheckpointId(checkpoint)),
                other => panic!("bug in the test: step {other}"),
            }
        }
        let recorded = alignments
            .entries
            .iter()
            .any(|(id, _, aligned)| *id == CheckpointId(take) && aligned.is_some());
        assert_eq!(recorded, want_some, "steps {steps:?}");
        let _ = alignments.take(CheckpointId(take));
        assert!(
            alignments
                .entries
                .iter()
                .all(|(id, ..)| *id != CheckpointId(take)),
            "take removes the entry"
        );
    }

    #[test]
    fn barrier_then_snapshot_is_measured() {
        check(&[("barrier", 1), ("snapshot", 1)], 1, true);
    }

    #[test]
    fn a_second_barrier_keeps_the_first_arrival() {
        check(&[("barrier", 1), ("barrier", 1), ("snapshot", 1)], 1, true);
        let mut alignments = Alignments::default();
        alignments.barrier(CheckpointId(1));
        let first = alignments.entries[0].1;
        alignments.barrier(CheckpointId(1));
        assert_eq!(alignments.entries.len(), 1);
        assert_eq!(alignments.entries[0].1, first);
    }

    #[test]
    fn snapshot_without_barrier_is_not_measured() {
        check(&[("snapshot", 2)], 2, false);
    }

    #[test]
    fn forgotten_checkpoints_are_not_measured() {
        check(
            &[
                ("barrier", 1),
                ("barrier", 2),
                ("forget", 1),
                ("snapshot", 1),
            ],
            1,
            false,
        );
    }

    #[test]
    fn take_of_an_unknown_checkpoint_is_zero() {
        assert_eq!(Alignments::default().take(CheckpointId(7)), 0);
    }
}
