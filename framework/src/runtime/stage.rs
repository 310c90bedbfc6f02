//! A generic actor with input channels and output channels, driven by a
//! pluggable [`StageLogic`].
//!
//! The stage owns the transport side of one operator instance: it takes
//! deliveries off its mailbox into one queue per input channel, hands batches
//! and control items to the logic in bounded slices (yielding the arbiter
//! between slices, so timers on the same thread keep pace), returns a credit
//! for every batch the logic has processed, stops taking input while an
//! output has no credit, runs every callback under
//! [`super::failure::guard`], and stops itself after a failure. The logic can
//! hold an input (its queue is kept but not processed), which is what barrier
//! alignment needs.
//!
//! It never knows what a control item means: barrier alignment, snapshots and
//! end of input are the logic's business (later, an operator shell that
//! drives the protocol machine).
//!
//! Bounds: an input's queue holds at most its channel's window of batches,
//! because credits go back only after processing, plus the control items the
//! sender emitted in between (a few per checkpoint). Unbounded channels (back
//! edges) have unbounded queues, by design (see [`super::channel::Window`]).

use std::collections::{HashMap, VecDeque};
use std::num::NonZeroUsize;
use std::time::Instant;

use actix::{Actor, ActorContext, AsyncContext, Context, Handler, Message};

use super::channel::{ChannelId, ChannelReceiver, ChannelSender, Credit, Delivery, Item, Outputs};
use super::failure::{guard, FailureSink};
use super::scheduling::{schedule, LingerTimer, Turn};
use super::{ActorTag, BoxError};
use crate::metrics::SubtaskRecorder;

/// What a stage does with its input. Runs on the stage's arbiter thread, so
/// it need not be `Send`. The `Unpin` bounds are actix's: an actor (which
/// holds the logic and queues of its record types) must be `Unpin`.
pub trait StageLogic: Unpin + 'static {
    /// The record type of every input.
    type In: Send + Unpin + 'static;
    /// The record type of every output.
    type Out: Send + Unpin + 'static;
    /// The control item type of inputs and outputs.
    type Control: Send + Unpin + 'static;

    /// Processes one batch from input `input`.
    fn on_batch(
        &mut self,
        input: usize,
        batch: Vec<Self::In>,
        io: &mut StageIo<'_, Self::Out, Self::Control>,
    ) -> Result<(), BoxError>;

    /// Processes one control item from input `input`.
    fn on_control(
        &mut self,
        input: usize,
        control: Self::Control,
        io: &mut StageIo<'_, Self::Out, Self::Control>,
    ) -> Result<(), BoxError>;

    /// Runs once when the actor starts, before any input is processed (e.g.
    /// to replay recorded channel state after a restore). Does nothing
    /// unless overridden.
    fn on_started(
        &mut self,
        io: &mut StageIo<'_, Self::Out, Self::Control>,
    ) -> Result<(), BoxError> {
        let _ = io;
        Ok(())
    }

    /// Processes a control item injected from outside the graph (see
    /// [`Inject`]), e.g. a checkpoint trigger from a coordinator. Ignores it
    /// unless overridden.
    fn on_injected(
        &mut self,
        control: Self::Control,
        io: &mut StageIo<'_, Self::Out, Self::Control>,
    ) -> Result<(), BoxError> {
        let _ = (control, io);
        Ok(())
    }

    /// The end of a slice of work at `now` while live metrics are on:
    /// the logic adds what it counts itself (a connector's bytes, a
    /// source's lag) to its subtask's cell. Once per slice, never per
    /// batch; does nothing unless overridden.
    fn record_metrics(&mut self, now: Instant) {
        let _ = now;
    }

    /// How often the stage calls [`StageLogic::on_tick`], asked once at
    /// start. `None` (the default): never, and the stage has no timer at
    /// all, so a logic without ticks pays nothing for them.
    fn tick_interval_ms(&self) -> Option<u64> {
        None
    }

    /// Time passed (see [`StageLogic::tick_interval_ms`]). Runs on the
    /// actor between deliveries, never during another callback.
    fn on_tick(&mut self, io: &mut StageIo<'_, Self::Out, Self::Control>) -> Result<(), BoxError> {
        let _ = io;
        Ok(())
    }
}

/// What a callback may do: emit on outputs, hold or release inputs, ask the
/// stage to stop.
pub struct StageIo<'a, T: Send + 'static, C: Send + 'static> {
    outputs: &'a mut Outputs<T, C>,
    held: &'a mut [bool],
}

impl<T: Send + 'static, C: Send + 'static> StageIo<'_, T, C> {
    /// The output channels.
    pub fn outputs(&mut self) -> &mut Outputs<T, C> {
        self.outputs
    }

    /// Stops processing input `input` until it is released; its items stay
    /// queued in order (and its sender runs out of credit). Out-of-range
    /// indices are ignored.
    pub fn hold_input(&mut self, input: usize) {
        if let Some(held) = self.held.get_mut(input) {
            *held = true;
        }
    }

    /// Resumes processing input `input`.
    pub fn release_input(&mut self, input: usize) {
        if let Some(held) = self.held.get_mut(input) {
            *held = false;
        }
    }

    /// Whether input `input` is held.
    pub fn is_held(&self, input: usize) -> bool {
        self.held.get(input).copied().unwrap_or(false)
    }

    /// The number of inputs.
    pub fn inputs(&self) -> usize {
        self.held.len()
    }
}

/// A control item injected into an actor from outside the channel graph.
#[derive(Debug, Clone)]
pub struct Inject<C>(pub C);

impl<C: 'static> Message for Inject<C> {
    type Result = ();
}

/// Tuning of a stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageConfig {
    /// Items (batches or control items) processed before the stage yields
    /// its arbiter thread.
    pub slice_items_max: NonZeroUsize,
}

impl Default for StageConfig {
    /// 32 items per slice (about 32 K records with 1024-record batches).
    fn default() -> Self {
        Self {
            slice_items_max: NonZeroUsize::new(32).unwrap_or(NonZeroUsize::MIN),
        }
    }
}

struct Input<T, C> {
    receiver: ChannelReceiver,
    queue: VecDeque<Item<T, C>>,
}

/// The stage actor. Build it inside the factory given to
/// [`super::pool::ArbiterPool::start_in_slot`].
pub struct StageActor<L: StageLogic> {
    tag: ActorTag,
    logic: L,
    inputs: Vec<Input<L::In, L::Control>>,
    held: Vec<bool>,
    input_by_channel: HashMap<ChannelId, usize>,
    outputs: Outputs<L::Out, L::Control>,
    config: StageConfig,
    failures: FailureSink,
    drain_scheduled: bool,
    next_input: usize,
    linger: LingerTimer,
    failed: bool,
    /// The live metrics of this subtask, when they are on.
    metrics: Option<SubtaskRecorder>,
}

impl<L: StageLogic> StageActor<L> {
    /// The same stage, recording its figures into `metrics` (busy time
    /// per slice, input batches, output records, time out of credit).
    pub fn with_metrics(mut self, metrics: Option<SubtaskRecorder>) -> Self {
        self.metrics = metrics;
        self
    }

    /// A stage reading `inputs` (input index = position) and writing
    /// `outputs` (output index = position).
    pub fn new(
        tag: ActorTag,
        logic: L,
        inputs: Vec<ChannelReceiver>,
        outputs: Vec<ChannelSender<L::Out, L::Control>>,
        config: StageConfig,
        failures: FailureSink,
    ) -> Self {
        let input_by_channel = inputs
            .iter()
            .enumerate()
            .map(|(index, receiver)| (receiver.id(), index))
            .collect();
        let held = vec![false; inputs.len()];
        let inputs = inputs
            .into_iter()
            .map(|receiver| Input {
                receiver,
                queue: VecDeque::new(),
            })
            .collect();
        Self {
            tag,
            logic,
            inputs,
            held,
            input_by_channel,
            outputs: Outputs::new(outputs),
            config,
            failures,
            drain_scheduled: false,
            next_input: 0,
            linger: LingerTimer::default(),
            failed: false,
            metrics: None,
        }
    }

    fn schedule_drain(&mut self, context: &mut Context<Self>, turn: Turn) {
        if !self.drain_scheduled && !self.failed {
            self.drain_scheduled = true;
            schedule(context, turn, Self::drain);
        }
    }

    /// Processes up to one slice of queued items, then yields if work is
    /// left and the outputs can take it.
    fn drain(&mut self, context: &mut Context<Self>) {
        self.drain_scheduled = false;
        let started = self.metrics.as_ref().map(|_| Instant::now());
        let mut processed = 0;
        while processed < self.config.slice_items_max.get() && !self.failed {
            if !self.outputs.has_credit() {
                break; // A credit arrival schedules the next drain.
            }
            let Some(input) = self.next_ready_input() else {
                break;
            };
            self.process_one(input);
            processed += 1;
        }
        if let (Some(metrics), Some(started)) = (&mut self.metrics, started) {
            let now = record_slice(metrics, &self.outputs, started);
            self.logic.record_metrics(now);
        }
        if self.failed {
            context.stop();
            return;
        }
        self.linger.arm(&self.outputs, context, Self::linger_fired);
        self.stop_if_done(context);
        if self.outputs.has_credit() && self.has_ready_input() {
            self.schedule_drain(context, Turn::AfterYield);
        }
    }

    fn process_one(&mut self, input: usize) {
        let Some(item) = self.inputs[input].queue.pop_front() else {
            return;
        };
        let mut io = StageIo {
            outputs: &mut self.outputs,
            held: &mut self.held,
        };
        let logic = &mut self.logic;
        let succeeded = match item {
            Item::Batch(batch) => {
                if let Some(metrics) = &mut self.metrics {
                    metrics.on_batch(batch.len());
                }
                let done = guard(&self.tag, &self.failures, || {
                    logic.on_batch(input, batch, &mut io)
                });
                self.inputs[input].receiver.release_batch();
                done.is_some()
            }
            Item::Control(control) => guard(&self.tag, &self.failures, || {
                logic.on_control(input, control, &mut io)
            })
            .is_some(),
        };
        self.failed |= !succeeded;
    }

    fn has_ready_input(&self) -> bool {
        (0..self.inputs.len())
            .any(|index| !self.held[index] && !self.inputs[index].queue.is_empty())
    }

    /// The next input (round-robin from the last one served) that is not
    /// held and has queued items.
    fn next_ready_input(&mut self) -> Option<usize> {
        let count = self.inputs.len();
        for step in 0..count {
            let index = (self.next_input + step) % count;
            if !self.held[index] && !self.inputs[index].queue.is_empty() {
                self.next_input = (index + 1) % count;
                return Some(index);
            }
        }
        None
    }

    fn linger_fired(&mut self, context: &mut Context<Self>) {
        self.linger.fired();
        self.outputs.flush_lingered(Instant::now());
        if let Some(metrics) = &mut self.metrics {
            metrics.flush(self.outputs.records_sent());
        }
        self.linger.arm(&self.outputs, context, Self::linger_fired);
        self.stop_if_done(context);
    }

    fn stop_if_done(&mut self, context: &mut Context<Self>) {
        if self.outputs.stop_requested() && self.outputs.is_drained() {
            context.stop();
        }
    }
}

/// The end of a slice of work that began at `started`: its busy time, the
/// output records, and the start of a backpressure period if an output
/// is out of credit now. Two clock reads per slice, not per batch; the
/// second (the slice's end) is returned for the logic's own figures.
pub(super) fn record_slice<T: Send + 'static, C: Send + 'static>(
    metrics: &mut SubtaskRecorder,
    outputs: &Outputs<T, C>,
    started: Instant,
) -> Instant {
    let now = Instant::now();
    metrics.busy(started, now);
    if !outputs.has_credit() {
        metrics.backpressure_started(now);
    }
    metrics.flush(outputs.records_sent());
    now
}

/// Every output has credit again: a running backpressure period ends,
/// and what waited for credit and has now been sent is counted (a source
/// that is exhausted runs no more slices).
pub(super) fn credit_restored<T: Send + 'static, C: Send + 'static>(
    metrics: &mut Option<SubtaskRecorder>,
    outputs: &Outputs<T, C>,
) {
    if let Some(metrics) = metrics {
        if metrics.is_backpressured() {
            metrics.backpressure_ended(Instant::now());
            metrics.flush(outputs.records_sent());
        }
    }
}

impl<L: StageLogic> Actor for StageActor<L> {
    type Context = Context<Self>;

    fn started(&mut self, context: &mut Context<Self>) {
        let mut io = StageIo {
            outputs: &mut self.outputs,
            held: &mut self.held,
        };
        let logic = &mut self.logic;
        if guard(&self.tag, &self.failures, || logic.on_started(&mut io)).is_none() {
            self.failed = true;
            context.stop();
            return;
        }
        self.linger.arm(&self.outputs, context, Self::linger_fired);
        if let Some(interval_ms) = self.logic.tick_interval_ms() {
            let period = std::time::Duration::from_millis(interval_ms.max(1));
            context.run_interval(period, |stage, context| {
                stage.run_outside(context, |logic, io| logic.on_tick(io));
            });
        }
        self.stop_if_done(context);
    }
}

impl<L: StageLogic> StageActor<L> {
    /// Runs a callback that did not come with input (an injected control
    /// item, a tick) under the failure guard, then carries on as after
    /// any callback.
    fn run_outside(
        &mut self,
        context: &mut Context<Self>,
        call: impl FnOnce(&mut L, &mut StageIo<'_, L::Out, L::Control>) -> Result<(), BoxError>,
    ) {
        if self.failed {
            return;
        }
        let mut io = StageIo {
            outputs: &mut self.outputs,
            held: &mut self.held,
        };
        let logic = &mut self.logic;
        let done = guard(&self.tag, &self.failures, || call(logic, &mut io));
        if done.is_none() {
            self.failed = true;
            context.stop();
            return;
        }
        self.linger.arm(&self.outputs, context, Self::linger_fired);
        self.stop_if_done(context);
        // The logic may have released a held input.
        self.schedule_drain(context, Turn::Now);
    }
}

impl<L: StageLogic> Handler<Delivery<L::In, L::Control>> for StageActor<L> {
    type Result = ();

    fn handle(&mut self, delivery: Delivery<L::In, L::Control>, context: &mut Context<Self>) {
        // A delivery for a channel this stage does not have is counted as
        // stale on the first input (there is no better place to count it).
        let index = self
            .input_by_channel
            .get(&delivery.channel)
            .copied()
            .unwrap_or(0);
        let Some(input) = self.inputs.get_mut(index) else {
            return;
        };
        if let Some(item) = input.receiver.accept(delivery) {
            input.queue.push_back(item);
            self.schedule_drain(context, Turn::Now);
        }
    }
}

impl<L: StageLogic> Handler<Credit> for StageActor<L> {
    type Result = ();

    fn handle(&mut self, credit: Credit, context: &mut Context<Self>) {
        if self.outputs.on_credit(&credit) {
            self.stop_if_done(context);
            if self.outputs.has_credit() {
                credit_restored(&mut self.metrics, &self.outputs);
                self.schedule_drain(context, Turn::Now);
            }
        }
    }
}

impl<L: StageLogic> Handler<Inject<L::Control>> for StageActor<L> {
    type Result = ();

    fn handle(&mut self, inject: Inject<L::Control>, context: &mut Context<Self>) {
        self.run_outside(context, |logic, io| logic.on_injected(inject.0, io));
    }
}
