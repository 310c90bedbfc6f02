//! Operator shells: the logic plugged into the runtime's stage and source
//! actors that drives one [`NodeMachine`] per subtask around the user's
//! code.
//!
//! A shell owns the translation between transport and protocol: data
//! batches go through [`NodeMachine::on_data`] (one batch is one protocol
//! message), barriers and end of input are in-band [`Control`] items, held
//! channels are held in the stage (`hold_input`) so their batches keep their
//! credits and the upstream stalls; `TakeSnapshot` serializes the operator
//! state on the actor (the synchronous part) and the part goes to the
//! supervisor with the node's report. Triggers, completions and aborts come
//! from the supervisor as injected controls.
//!
//! The head of an iteration also ends its loop: once its other inputs
//! ended and its feedback stayed idle long enough, it ends the feedback
//! inputs itself (see `LoopHead`).
//!
//! It never decides a protocol question (the machine does), never does I/O
//! (the supervisor's writer thread does) and never restarts anything.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Message, Recipient};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::protocol::{CheckpointId, DeclineReason, Delivery, NodeAction, NodeMachine};
use crate::runtime::channel::Outputs;
use crate::runtime::source::{SourceLogic, SourcePoll};
use crate::runtime::stage::{StageIo, StageLogic};
use crate::runtime::{BoxError, Generation};

use super::route::{Collector, Router};
use crate::source::{Guarantee, Source, SourceError, SourcePoll as ReadStatus, SourcePosition};
use crate::time::{
    Advance, InputWatermarks, SourceSignal, SourceWatermarks, WatermarkState, WATERMARK_MAX_MS,
};

/// Bound on the serde-friendly record types that flow between operators:
/// they are cloned for fan-out and recorded channel state, and serialized
/// into checkpoints (recorded channel state of unaligned checkpoints).
pub trait Data: Clone + Send + Unpin + Serialize + DeserializeOwned + 'static {}

impl<T: Clone + Send + Unpin + Serialize + DeserializeOwned + 'static> Data for T {}

/// The in-band and injected control items of the job layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// In-band: barrier of a checkpoint.
    Barrier(CheckpointId),
    /// In-band: no more items on this channel.
    End,
    /// Injected: the coordinator triggers this node.
    Trigger(CheckpointId),
    /// Injected: the checkpoint is complete and durable.
    Complete(CheckpointId),
    /// Injected: the checkpoint was aborted.
    Abort(CheckpointId),
    /// Injected into a loop head: time passed (it may end its loop).
    Tick,
    /// In-band: no record with event time at or below this follows on
    /// this channel (DESIGN.md §7).
    Watermark(u64),
    /// In-band: the channel is idle and drops out of the watermark
    /// minimum until it carries a batch or a watermark again.
    Idle,
}

/// What a subtask tells the supervisor.
#[derive(Debug)]
pub(crate) struct NodeEvent {
    pub(crate) generation: Generation,
    pub(crate) node: usize,
    pub(crate) kind: NodeEventKind,
}

#[derive(Debug)]
pub(crate) enum NodeEventKind {
    /// The node's part of a checkpoint, encoded as a [`PartBytes`].
    Ack {
        checkpoint: CheckpointId,
        part: Vec<u8>,
        /// Barrier alignment at this node: from its first barrier of the
        /// checkpoint to its snapshot (0 without a barrier, e.g. a source).
        alignment_us: u64,
    },
    Decline {
        checkpoint: CheckpointId,
        reason: DeclineReason,
    },
    /// Every input ended (a source: it is exhausted); no barrier can reach
    /// the node any more, so it must be triggered directly.
    InputsEnded,
    /// The node processed the completion of `checkpoint`: a sink
    /// committed its output up to it.
    Committed { checkpoint: CheckpointId },
}

impl Message for NodeEvent {
    type Result = ();
}

/// One subtask's part of a checkpoint, as stored.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct PartBytes {
    /// The operator state (or a source's position).
    pub(crate) state: Vec<u8>,
    /// Recorded channel states: (input channel, postcard `Vec<Vec<In>>`).
    pub(crate) channels: Vec<(u32, Vec<u8>)>,
    /// The subtask's watermarks ([`WatermarkState`] bytes), if it ever had
    /// one. Stored after the other two fields, and only when present, so
    /// that parts without event time keep their old bytes and old parts
    /// still decode.
    #[serde(skip)]
    pub(crate) time: Option<Vec<u8>>,
}

impl PartBytes {
    /// The stored bytes of this part. This, [`PartBytes::decode`],
    /// [`encode_channel`] and [`decode_channel`] hold the part layout;
    /// the shells, rescaling in `physical.rs` and `job::inspect` all go
    /// through them.
    pub(crate) fn encode(&self) -> Result<Vec<u8>, postcard::Error> {
        let mut bytes = postcard::to_allocvec(self)?;
        if let Some(time) = &self.time {
            bytes.extend_from_slice(&postcard::to_allocvec(time)?);
        }
        Ok(bytes)
    }

    /// Reads bytes written by [`PartBytes::encode`], with or without the
    /// watermarks after the fields.
    pub(crate) fn decode(bytes: &[u8]) -> Result<PartBytes, postcard::Error> {
        let (mut part, rest): (PartBytes, &[u8]) = postcard::take_from_bytes(bytes)?;
        if !rest.is_empty() {
            part.time = Some(postcard::from_bytes(rest)?);
        }
        Ok(part)
    }

    /// The watermarks stored in this part, if any.
    pub(crate) fn watermarks(&self) -> Result<Option<WatermarkState>, postcard::Error> {
        self.time.as_deref().map(WatermarkState::decode).transpose()
    }
}

/// The stored bytes of one recorded channel state: its batches in order.
pub(crate) fn encode_channel<T: Serialize>(batches: &[Vec<T>]) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_allocvec(batches)
}

/// Reads a recorded channel state written by [`encode_channel`].
pub(crate) fn decode_channel<T: DeserializeOwned>(
    bytes: &[u8],
) -> Result<Vec<Vec<T>>, postcard::Error> {
    postcard::from_bytes(bytes)
}

/// Whether a recorded channel state (postcard of a list of batches) holds
/// no batch: a postcard sequence starts with its length, so the empty
/// list is the single byte 0.
pub(crate) fn is_empty_channel(messages: &[u8]) -> bool {
    messages == [0]
}

/// Counters of one logical operator, summed over subtasks and generations.
#[derive(Debug, Default)]
pub(crate) struct OperatorCounters {
    pub(crate) records_in: AtomicU64,
    pub(crate) records_out: AtomicU64,
    /// A subtask's connector guarantees only at-least-once (a source that
    /// cannot seek, a sink that cannot roll back).
    pub(crate) at_least_once: AtomicBool,
}

/// The user-facing logic of one stage instance.
pub(crate) trait Core<In, Out: Send + 'static>: 'static {
    /// Processes one batch.
    fn process(&mut self, batch: Vec<In>, out: &mut Collector<'_, Out>) -> Result<(), BoxError>;
    /// The synchronous part of a checkpoint: the state as bytes.
    fn snapshot(&mut self, checkpoint: CheckpointId) -> Result<Vec<u8>, BoxError>;
    /// Starts the core: from bytes [`Core::snapshot`] returned, or fresh
    /// (`None`). Called once, before any batch.
    fn restore(&mut self, state: Option<&[u8]>) -> Result<(), BoxError>;
    /// What this core guarantees after a restore.
    fn guarantee(&self) -> Guarantee {
        Guarantee::ExactlyOnce
    }
    /// A checkpoint is complete (sinks commit).
    fn on_complete(&mut self, checkpoint: CheckpointId) -> Result<(), BoxError> {
        let _ = checkpoint;
        Ok(())
    }
    /// Every input ended; the last chance to emit.
    fn on_end(&mut self, out: &mut Collector<'_, Out>) -> Result<(), BoxError> {
        let _ = out;
        Ok(())
    }
    /// The operator's watermark rose to `watermark_ms`: fire what is due.
    /// The shell sends the watermark on after this returns, so what it
    /// emits comes before the watermark downstream.
    fn on_watermark(
        &mut self,
        watermark_ms: u64,
        out: &mut Collector<'_, Out>,
    ) -> Result<(), BoxError> {
        let _ = (watermark_ms, out);
        Ok(())
    }
}

/// What a shell needs besides its logic.
pub(crate) struct ShellEnv {
    pub(crate) node: usize,
    pub(crate) generation: Generation,
    pub(crate) supervisor: Recipient<NodeEvent>,
    pub(crate) counters: Arc<OperatorCounters>,
    /// The part of the restored checkpoint, if any.
    pub(crate) restore: Option<Vec<u8>>,
    pub(crate) span: tracing::Span,
    /// For the head of an iteration: how long its feedback must be idle,
    /// after its other inputs ended, before it ends the loop.
    pub(crate) loop_idle_ms: Option<u64>,
}

impl ShellEnv {
    /// Enters this operator instance's span for the rest of a handler, so
    /// that every event of the shell and of user code (process functions,
    /// sources, sinks, snapshots) is recorded inside it. Done once per
    /// delivered message, not per record; the clone is a reference count
    /// (nothing at all when no subscriber wants the span).
    fn enter(&self) -> tracing::span::EnteredSpan {
        self.span.clone().entered()
    }

    fn tell(&self, kind: NodeEventKind) {
        self.supervisor.do_send(NodeEvent {
            generation: self.generation,
            node: self.node,
            kind,
        });
    }
}

/// Snapshot states taken but not yet reported, per checkpoint. Bounded by
/// the checkpoints in flight at the node (`max_concurrent`): every entry is
/// removed when its part is reported or its checkpoint aborted or
/// subsumed.
#[derive(Default)]
struct TakenStates {
    entries: Vec<(CheckpointId, Vec<u8>)>,
}

impl TakenStates {
    fn insert(&mut self, checkpoint: CheckpointId, state: Vec<u8>) {
        self.entries.push((checkpoint, state));
    }

    /// The state taken for `checkpoint`. The machine reports a part only
    /// after its snapshot, so a missing state is a bug in this shell; it
    /// fails the subtask (and restarts the job) rather than acking an
    /// empty state.
    fn take(&mut self, checkpoint: CheckpointId) -> Result<Vec<u8>, BoxError> {
        match self.entries.iter().position(|(id, _)| *id == checkpoint) {
            Some(index) => Ok(self.entries.remove(index).1),
            None => Err(format!("no state was taken for {checkpoint}").into()),
        }
    }

    /// Forgets `checkpoint` and everything older (aborted or subsumed).
    fn forget_up_to(&mut self, checkpoint: CheckpointId) {
        self.entries.retain(|(id, _)| *id > checkpoint);
    }
}

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
    machine: NodeMachine<Vec<In>>,
    core: Box<dyn Core<In, Out>>,
    router: Router<Out>,
    taken: TakenStates,
    /// The watermarks taken with each state in `taken` (empty: none).
    taken_time: TakenStates,
    alignments: Alignments,
    watermarks: InputWatermarks,
    inputs_ended: bool,
    trigger_requested: bool,
}

impl<In: Data, Out: Data> StageShell<In, Out> {
    pub(crate) fn new(
        env: ShellEnv,
        machine: NodeMachine<Vec<In>>,
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
        StageShell {
            loop_head,
            env,
            machine,
            core,
            router,
            taken: TakenStates::default(),
            taken_time: TakenStates::default(),
            alignments: Alignments::default(),
            watermarks: InputWatermarks::new(back_edge),
            inputs_ended: false,
            trigger_requested: false,
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
                NodeAction::Process { message, .. } => self.process(message, io.outputs())?,
                NodeAction::TakeSnapshot(token) => {
                    let checkpoint = token.checkpoint();
                    self.alignments.snapshot(checkpoint);
                    let state = self.core.snapshot(checkpoint)?;
                    self.taken.insert(checkpoint, state);
                    let time = if self.watermarks.is_pristine() {
                        Vec::new()
                    } else {
                        self.watermarks.state().encode()?
                    };
                    self.taken_time.insert(checkpoint, time);
                    // The state is captured as bytes: safe for the protocol.
                    self.machine.state_recorded(token);
                }
                NodeAction::EmitBarrier(checkpoint) => {
                    if !self.inputs_ended {
                        io.outputs().broadcast_control(Control::Barrier(checkpoint));
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
                    let bytes = PartBytes {
                        state,
                        channels,
                        time,
                    }
                    .encode()?;
                    self.env.tell(NodeEventKind::Ack {
                        checkpoint: part.checkpoint,
                        part: bytes,
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
                Control::Watermark(watermark_ms)
            }
        };
        if !self.inputs_ended {
            io.outputs().broadcast_control(control);
        }
        Ok(())
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
        // runs before the stage processes its first delivery.
        for (_channel, messages) in part.channels {
            let batches: Vec<Vec<In>> = decode_channel(&messages)?;
            for batch in batches {
                self.process(batch, io.outputs())?;
            }
        }
        // Sent again, after the replayed records: downstream ignores it if
        // it has it, and a watermark that was in flight in a recorded
        // channel (not kept there yet) is not lost.
        if let Some(watermark_ms) = self.watermarks.output_ms() {
            io.outputs()
                .broadcast_control(Control::Watermark(watermark_ms));
        }
        Ok(())
    }
}

impl<In: Data, Out: Data> StageLogic for StageShell<In, Out> {
    type In = In;
    type Out = Out;
    type Control = Control;

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
        if let Delivery::Process(batch) = self.machine.on_data(input, batch) {
            self.process(batch, io.outputs())?;
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
            Control::Barrier(checkpoint) => {
                self.alignments.barrier(checkpoint);
                self.machine.on_barrier(input, checkpoint);
            }
            Control::End => {
                // End of input is watermark +infinity on the channel: what
                // it makes due fires before the end travels on.
                let advance = self.watermarks.on_end(input);
                self.on_time(advance, io)?;
                self.machine.on_end_of_input(input);
            }
            Control::Watermark(watermark_ms) => {
                let advance = self.watermarks.on_watermark(input, watermark_ms);
                return self.on_time(advance, io);
            }
            Control::Idle => {
                let advance = self.watermarks.on_idle(input);
                return self.on_time(advance, io);
            }
            other => return Err(format!("{other:?} arrived in-band").into()),
        }
        self.drive(io)
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
            Control::Trigger(checkpoint) => self.machine.on_trigger(checkpoint),
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
            Control::Tick => self.maybe_end_loop(io)?,
            other => return Err(format!("{other:?} was injected").into()),
        }
        self.drive(io)
    }
}

impl<In: Data, Out: Data> StageShell<In, Out> {
    /// The loop head's rule (see [`LoopHead`]): ends the feedback inputs
    /// once the loop has been idle long enough, driving the machine after
    /// each end as the contract says.
    fn maybe_end_loop(&mut self, io: &mut StageIo<'_, Out, Control>) -> Result<(), BoxError> {
        let Some(head) = &mut self.loop_head else {
            return Ok(());
        };
        let idle = head.last_feedback.elapsed() >= Duration::from_millis(head.idle_ms);
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
            self.drive(io)?;
        }
        Ok(())
    }
}

/// Makes the source of one subtask (subtask, parallelism).
pub(crate) type SourceMaker<T> =
    Arc<dyn Fn(usize, usize) -> Result<Box<dyn Source<Item = T>>, SourceError> + Send + Sync>;

/// How long a source that said [`ReadStatus::Idle`] waits before the next
/// poll.
const IDLE_RETRY_MS: u64 = 1;

/// The source shell: one source instance, an initiator.
pub(crate) struct SourceShell<T: Data> {
    env: ShellEnv,
    machine: NodeMachine<Vec<T>>,
    make: SourceMaker<T>,
    subtask: usize,
    parallelism: usize,
    /// Made (and sought to the restored position) on first use, on the
    /// actor's thread, so that a failure to open it is a typed failure
    /// report, not a panic in the actor's constructor.
    reader: Option<Box<dyn Source<Item = T>>>,
    router: Router<T>,
    buffer: Vec<T>,
    read_batch: usize,
    exhausted: bool,
    taken: TakenStates,
    /// The watermarks taken with each position in `taken` (empty: none).
    taken_time: TakenStates,
    /// The subtask's watermark generator, when the stream has a
    /// [`crate::time::WatermarkStrategy`].
    watermarks: Option<SourceWatermarks<T>>,
}

impl<T: Data> SourceShell<T> {
    pub(crate) fn new(
        env: ShellEnv,
        machine: NodeMachine<Vec<T>>,
        make: SourceMaker<T>,
        (subtask, parallelism): (usize, usize),
        router: Router<T>,
        read_batch: usize,
        watermarks: Option<SourceWatermarks<T>>,
    ) -> Self {
        SourceShell {
            taken_time: TakenStates::default(),
            watermarks,
            env,
            machine,
            make,
            subtask,
            parallelism,
            reader: None,
            router,
            buffer: Vec::with_capacity(read_batch),
            read_batch: read_batch.max(1),
            exhausted: false,
            taken: TakenStates::default(),
        }
    }

    /// The reader, opened and sought to the restored position on first use.
    fn reader(&mut self) -> Result<&mut Box<dyn Source<Item = T>>, BoxError> {
        if self.reader.is_none() {
            let mut reader = (self.make)(self.subtask, self.parallelism)?;
            if !reader.can_seek() {
                // Documented: such a source is at-least-once at best.
                self.env
                    .counters
                    .at_least_once
                    .store(true, Ordering::Relaxed);
            }
            if let Some(bytes) = self.env.restore.take() {
                let part = PartBytes::decode(&bytes)?;
                if let (Some(watermarks), Some(state)) = (&mut self.watermarks, part.watermarks()?)
                {
                    watermarks.restore(&state);
                }
                if reader.can_seek() {
                    reader.seek(&SourcePosition::from_bytes(part.state))?;
                }
            }
            self.reader = Some(reader);
        }
        self.reader
            .as_mut()
            .ok_or_else(|| "the source reader was just made".into())
    }

    fn drive(&mut self, outputs: &mut Outputs<T, Control>) -> Result<(), BoxError> {
        while let Some(action) = self.machine.poll_action() {
            match action {
                NodeAction::Process { .. } => {
                    return Err("a source has no inputs to process".into());
                }
                NodeAction::TakeSnapshot(token) => {
                    let position = self.reader()?.position().as_bytes().to_vec();
                    self.taken.insert(token.checkpoint(), position);
                    let time = match &self.watermarks {
                        Some(watermarks) => watermarks.state().encode()?,
                        None => Vec::new(),
                    };
                    self.taken_time.insert(token.checkpoint(), time);
                    self.machine.state_recorded(token);
                }
                NodeAction::EmitBarrier(checkpoint) => {
                    if !self.exhausted {
                        outputs.broadcast_control(Control::Barrier(checkpoint));
                    }
                }
                NodeAction::ReportPart(part) => {
                    let state = self.taken.take(part.checkpoint)?;
                    let time =
                        Some(self.taken_time.take(part.checkpoint)?).filter(|t| !t.is_empty());
                    let bytes = PartBytes {
                        state,
                        channels: Vec::new(),
                        time,
                    }
                    .encode()?;
                    self.env.tell(NodeEventKind::Ack {
                        checkpoint: part.checkpoint,
                        part: bytes,
                        alignment_us: 0,
                    });
                }
                NodeAction::Decline { checkpoint, reason } => {
                    self.taken.forget_up_to(checkpoint);
                    self.taken_time.forget_up_to(checkpoint);
                    self.env.tell(NodeEventKind::Decline { checkpoint, reason });
                }
            }
        }
        Ok(())
    }
}

impl<T: Data> SourceLogic for SourceShell<T> {
    type Out = T;
    type Control = Control;

    fn poll(&mut self, outputs: &mut Outputs<T, Control>) -> Result<SourcePoll, BoxError> {
        if self.exhausted {
            return Ok(SourcePoll::Exhausted);
        }
        let _entered = self.env.enter();
        let read_batch = self.read_batch;
        let mut buffer = std::mem::take(&mut self.buffer);
        let status = self.reader()?.poll_batch(&mut buffer, read_batch);
        let records = buffer.len() as u64;
        // One branch per poll without a watermark strategy.
        let signal = match &mut self.watermarks {
            Some(watermarks) if status.is_ok() => watermarks.on_records(&buffer),
            _ => SourceSignal::None,
        };
        self.router.route_batch(&mut buffer, outputs);
        self.buffer = buffer;
        match signal {
            SourceSignal::None => {}
            SourceSignal::Watermark(watermark_ms) => {
                outputs.broadcast_control(Control::Watermark(watermark_ms));
            }
            SourceSignal::Idle => outputs.broadcast_control(Control::Idle),
        }
        self.env
            .counters
            .records_out
            .fetch_add(records, Ordering::Relaxed);
        Ok(match status? {
            ReadStatus::Produced(_) => SourcePoll::Ready,
            ReadStatus::Idle => SourcePoll::Idle {
                retry_after_ms: IDLE_RETRY_MS,
            },
            ReadStatus::Ended => {
                self.exhausted = true;
                outputs.broadcast_control(Control::End);
                self.env.tell(NodeEventKind::InputsEnded);
                SourcePoll::Exhausted
            }
        })
    }

    fn on_injected(
        &mut self,
        control: Control,
        outputs: &mut Outputs<T, Control>,
    ) -> Result<(), BoxError> {
        let _entered = self.env.enter();
        match control {
            Control::Trigger(checkpoint) => self.machine.on_trigger(checkpoint),
            Control::Abort(checkpoint) => {
                self.taken.forget_up_to(checkpoint);
                self.taken_time.forget_up_to(checkpoint);
                self.machine.on_abort(checkpoint);
            }
            Control::Complete(checkpoint) => {
                self.machine.on_complete(checkpoint);
                self.taken.forget_up_to(checkpoint);
                self.taken_time.forget_up_to(checkpoint);
                self.env.tell(NodeEventKind::Committed { checkpoint });
            }
            other => return Err(format!("{other:?} was injected into a source").into()),
        }
        self.drive(outputs)
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

#[cfg(test)]
mod part_tests {
    use super::*;

    #[test]
    fn parts_without_watermarks_keep_their_old_bytes_and_decode() {
        #[derive(Serialize)]
        struct OldPart {
            state: Vec<u8>,
            channels: Vec<(u32, Vec<u8>)>,
        }
        let old = postcard::to_allocvec(&OldPart {
            state: vec![1, 2, 3],
            channels: vec![(0, vec![0])],
        })
        .expect("encodes");
        let part = PartBytes::decode(&old).expect("an old part decodes");
        assert_eq!(part.state, [1, 2, 3]);
        assert!(part.watermarks().expect("no watermarks").is_none());
        assert_eq!(
            part.encode().expect("encodes"),
            old,
            "same bytes without event time"
        );
    }

    #[test]
    fn watermarks_round_trip_after_the_fields() {
        let mut marks = InputWatermarks::new(vec![false, false]);
        let _ = marks.on_watermark(0, 7);
        let _ = marks.on_watermark(1, 9);
        let part = PartBytes {
            state: vec![4],
            channels: Vec::new(),
            time: Some(marks.state().encode().expect("encodes")),
        };
        let back = PartBytes::decode(&part.encode().expect("encodes")).expect("decodes");
        assert_eq!(back.state, [4]);
        assert_eq!(back.watermarks().expect("decodes"), Some(marks.state()));
        let truncated = part.encode().expect("encodes");
        let cut = &truncated[..truncated.len() - 1];
        assert!(
            PartBytes::decode(cut).is_err(),
            "a cut part is an error, not a panic"
        );
    }
}
