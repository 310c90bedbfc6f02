//! A generic source actor: polls a pluggable [`SourceLogic`] while every
//! output has credit.
//!
//! The source owns the pull loop of one source instance: it polls in bounded
//! slices and yields the arbiter between slices, stops polling while an
//! output is out of credit and resumes when a credit arrives, waits when the
//! logic says it is idle, flushes its outputs when the logic is exhausted,
//! and runs every callback under [`super::failure::guard`].
//!
//! It never reads input channels and never knows what a control item means
//! (a checkpoint trigger arrives as an [`Inject`] and the logic decides what
//! to emit).

use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use actix::{Actor, ActorContext, AsyncContext, Context, Handler};

use super::channel::{ChannelSender, Credit, Outputs};
use super::failure::{guard, FailureSink};
use super::scheduling::{schedule, LingerTimer, Turn};
use super::stage::{credit_restored, record_slice, Inject};
use super::{ActorTag, BoxError};
use crate::metrics::SubtaskRecorder;

/// What one poll of a source produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourcePoll {
    /// It emitted something (or may have more right away): poll again.
    Ready,
    /// Nothing to read now: poll again after this long.
    Idle {
        /// How long to wait before the next poll.
        retry_after_ms: u64,
    },
    /// The source is finished and will never be polled again. The logic
    /// emits its own end-of-input control item if the graph needs one.
    Exhausted,
}

/// What a source does. Runs on the source's arbiter thread, so it need not be
/// `Send`. The `Unpin` bounds are actix's: an actor must be `Unpin`.
pub trait SourceLogic: Unpin + 'static {
    /// The record type of every output.
    type Out: Send + Unpin + 'static;
    /// The control item type of the outputs.
    type Control: Send + Unpin + 'static;

    /// Reads some input and emits it. One poll should emit about one batch;
    /// what it emits beyond the window waits in the channel's pending queue.
    fn poll(
        &mut self,
        outputs: &mut Outputs<Self::Out, Self::Control>,
    ) -> Result<SourcePoll, BoxError>;

    /// The end of a slice of work at `now` while live metrics are on:
    /// the logic adds what it counts itself (a connector's bytes, a
    /// source's lag) to its subtask's cell. Once per slice, never per
    /// batch; does nothing unless overridden.
    fn record_metrics(&mut self, now: Instant) {
        let _ = now;
    }

    /// Handles a control item injected from outside the graph (e.g. a
    /// checkpoint trigger). Ignores it unless overridden.
    fn on_injected(
        &mut self,
        control: Self::Control,
        outputs: &mut Outputs<Self::Out, Self::Control>,
    ) -> Result<(), BoxError> {
        let _ = (control, outputs);
        Ok(())
    }
}

/// Tuning of a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceConfig {
    /// Polls before the source yields its arbiter thread.
    pub slice_polls_max: NonZeroUsize,
}

impl Default for SourceConfig {
    /// 16 polls per slice.
    fn default() -> Self {
        Self {
            slice_polls_max: NonZeroUsize::new(16).unwrap_or(NonZeroUsize::MIN),
        }
    }
}

/// The source actor. Build it inside the factory given to
/// [`super::pool::ArbiterPool::start_in_slot`].
pub struct SourceActor<L: SourceLogic> {
    tag: ActorTag,
    logic: L,
    outputs: Outputs<L::Out, L::Control>,
    config: SourceConfig,
    failures: FailureSink,
    /// A poll is scheduled (now, after a yield, or after an idle wait).
    scheduled: bool,
    exhausted: bool,
    failed: bool,
    linger: LingerTimer,
    /// The live metrics of this subtask, when they are on.
    metrics: Option<SubtaskRecorder>,
}

impl<L: SourceLogic> SourceActor<L> {
    /// The same source, recording its figures into `metrics` (busy time
    /// per slice of polls, output records, time out of credit).
    pub fn with_metrics(mut self, metrics: Option<SubtaskRecorder>) -> Self {
        self.metrics = metrics;
        self
    }

    /// A source writing `outputs` (output index = position).
    pub fn new(
        tag: ActorTag,
        logic: L,
        outputs: Vec<ChannelSender<L::Out, L::Control>>,
        config: SourceConfig,
        failures: FailureSink,
    ) -> Self {
        Self {
            tag,
            logic,
            outputs: Outputs::new(outputs),
            config,
            failures,
            scheduled: false,
            exhausted: false,
            failed: false,
            linger: LingerTimer::default(),
            metrics: None,
        }
    }

    fn schedule_run(&mut self, context: &mut Context<Self>, turn: Turn) {
        if !self.scheduled && !self.exhausted && !self.failed {
            self.scheduled = true;
            schedule(context, turn, Self::run);
        }
    }

    fn run(&mut self, context: &mut Context<Self>) {
        self.scheduled = false;
        let started = self.metrics.as_ref().map(|_| Instant::now());
        let mut next = None;
        for _ in 0..self.config.slice_polls_max.get() {
            if !self.outputs.has_credit() {
                break; // A credit arrival schedules the next run.
            }
            let logic = &mut self.logic;
            let outputs = &mut self.outputs;
            match guard(&self.tag, &self.failures, || logic.poll(outputs)) {
                None => {
                    self.failed = true;
                    context.stop();
                    return;
                }
                Some(SourcePoll::Ready) => next = Some(Turn::AfterYield),
                Some(SourcePoll::Idle { retry_after_ms }) => {
                    next = None;
                    self.scheduled = true;
                    context.run_later(Duration::from_millis(retry_after_ms), |actor, context| {
                        actor.scheduled = false;
                        actor.schedule_run(context, Turn::Now);
                    });
                    break;
                }
                Some(SourcePoll::Exhausted) => {
                    next = None;
                    self.exhausted = true;
                    self.outputs.flush_all();
                    break;
                }
            }
        }
        if let (Some(metrics), Some(started)) = (&mut self.metrics, started) {
            let now = record_slice(metrics, &self.outputs, started);
            self.logic.record_metrics(now);
        }
        self.linger.arm(&self.outputs, context, Self::linger_fired);
        self.stop_if_done(context);
        if let Some(turn) = next {
            if self.outputs.has_credit() {
                self.schedule_run(context, turn);
            }
        }
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

impl<L: SourceLogic> Actor for SourceActor<L> {
    type Context = Context<Self>;

    fn started(&mut self, context: &mut Context<Self>) {
        self.schedule_run(context, Turn::Now);
    }
}

impl<L: SourceLogic> Handler<Credit> for SourceActor<L> {
    type Result = ();

    fn handle(&mut self, credit: Credit, context: &mut Context<Self>) {
        if self.outputs.on_credit(&credit) {
            self.stop_if_done(context);
            if self.outputs.has_credit() {
                credit_restored(&mut self.metrics, &self.outputs);
                self.schedule_run(context, Turn::Now);
            }
        }
    }
}

impl<L: SourceLogic> Handler<Inject<L::Control>> for SourceActor<L> {
    type Result = ();

    fn handle(&mut self, inject: Inject<L::Control>, context: &mut Context<Self>) {
        if self.failed {
            return;
        }
        let logic = &mut self.logic;
        let outputs = &mut self.outputs;
        if guard(&self.tag, &self.failures, || {
            logic.on_injected(inject.0, outputs)
        })
        .is_none()
        {
            self.failed = true;
            context.stop();
            return;
        }
        self.linger.arm(&self.outputs, context, Self::linger_fired);
        self.stop_if_done(context);
    }
}
