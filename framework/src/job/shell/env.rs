//! What every shell is given: the user's logic as a [`Core`], the
//! operator's counters and the [`ShellEnv`] through which it reports to
//! the supervisor. It drives nothing itself.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use actix::Recipient;

use crate::job::snapshots::{Requests, Waiting};
use crate::protocol::{CheckpointId, CheckpointKind};
use crate::runtime::{BoxError, Generation};
use crate::storage::Segment;

use super::event::{NodeEvent, NodeEventKind};
use super::pending::TakenState;
use crate::job::route::Collector;
use crate::source::Guarantee;

/// Counters of one logical operator, summed over subtasks and generations.
#[derive(Debug, Default)]
pub(crate) struct OperatorCounters {
    pub(crate) records_in: AtomicU64,
    pub(crate) records_out: AtomicU64,
    /// A subtask's connector guarantees only at-least-once (a source that
    /// cannot seek, a sink that cannot roll back).
    pub(crate) at_least_once: AtomicBool,
    /// Records a window operator dropped as later than its allowed
    /// lateness (shared with its [`crate::time::LateRecords`]).
    pub(crate) late_dropped: Arc<AtomicU64>,
    /// Watermarks that arrived lower than their channel's previous one
    /// (ignored, DESIGN.md §7).
    pub(crate) watermark_regressions: AtomicU64,
    /// Records a source dropped ([`crate::source::Source::records_dropped`]).
    pub(crate) records_dropped: AtomicU64,
}

/// The user-facing logic of one stage instance.
pub(crate) trait Core<In, Out: Send + 'static>: 'static {
    /// Processes one batch.
    fn process(&mut self, batch: Vec<In>, out: &mut Collector<'_, Out>) -> Result<(), BoxError>;
    /// The synchronous part of a checkpoint: the state as bytes.
    fn snapshot(&mut self, checkpoint: CheckpointId) -> Result<Vec<u8>, BoxError>;
    /// The state of a checkpoint as the store's segments, whose
    /// concatenation is what [`Core::snapshot`] would return; a core with
    /// incremental checkpoints refers to earlier checkpoints in them. The
    /// default is the whole snapshot as one segment. `kind` is what the
    /// checkpoint's barrier carried: a savepoint is written whole.
    fn snapshot_segments(
        &mut self,
        checkpoint: CheckpointId,
        kind: CheckpointKind,
    ) -> Result<Vec<Segment>, BoxError> {
        let _ = kind;
        Ok(vec![Segment::Own(self.snapshot(checkpoint)?)])
    }
    /// The synchronous part of a checkpoint as the shell calls it: the
    /// state as [`Core::snapshot_segments`] gives it, or a
    /// [`TakenState::Deferred`] that the checkpoint writer encodes into
    /// those segments later (a core overriding this must make sure nothing
    /// it does afterwards changes what is encoded). The default is the
    /// segments, encoded now.
    fn take_state(
        &mut self,
        checkpoint: CheckpointId,
        kind: CheckpointKind,
    ) -> Result<TakenState, BoxError> {
        Ok(TakenState::Segments(
            self.snapshot_segments(checkpoint, kind)?,
        ))
    }
    /// Starts the core: from bytes [`Core::snapshot`] returned, or fresh
    /// (`None`). Called once, before any batch.
    fn restore(&mut self, state: Option<&[u8]>) -> Result<(), BoxError>;
    /// What this core guarantees after a restore.
    fn guarantee(&self) -> Guarantee {
        Guarantee::ExactlyOnce
    }
    /// Bytes a sink wrote outside the job so far ([`crate::sink::Sink::bytes_written`]);
    /// `None` for every other core.
    fn bytes_written(&self) -> Option<u64> {
        None
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
    /// The state as bytes for a snapshot that is not a checkpoint (see
    /// [`crate::job::snapshots`]): read without side effects, so no hook
    /// runs and a sink pre-commits nothing. Empty unless overridden.
    fn capture(&mut self) -> Result<Vec<u8>, BoxError> {
        Ok(Vec::new())
    }
    /// What the operator declares it waits for (nothing unless overridden).
    fn waiting(&self) -> Waiting {
        Waiting::default()
    }
    /// Where the operator's own snapshot requests queue up (custom
    /// operators only).
    fn snapshot_requests(&self) -> Option<Arc<Requests>> {
        None
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
    /// How often the shell calls [`Core::on_processing_time`]; `None`
    /// (the default): never, and the operator has no tick at all.
    fn processing_tick_ms(&self) -> Option<u64> {
        None
    }
    /// Processing time passed: fire what the clock made due. Runs on the
    /// operator's actor, between batches.
    fn on_processing_time(&mut self, out: &mut Collector<'_, Out>) -> Result<(), BoxError> {
        let _ = out;
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
    /// This subtask's live metrics (`None` when they are off): the shell
    /// sets its watermark, source position and synchronous parts there.
    pub(crate) metrics: Option<Arc<crate::metrics::SubtaskCell>>,
}

impl ShellEnv {
    /// Enters this operator instance's span for the rest of a handler, so
    /// that every event of the shell and of user code (process functions,
    /// sources, sinks, snapshots) is recorded inside it. Done once per
    /// delivered message, not per record; the clone is a reference count
    /// (nothing at all when no subscriber wants the span).
    pub(super) fn enter(&self) -> tracing::span::EnteredSpan {
        self.span.clone().entered()
    }

    /// Notes the watermark sent on, for the live metrics.
    pub(super) fn note_watermark(&self, watermark_ms: u64) {
        if let Some(cell) = &self.metrics {
            cell.set_watermark(watermark_ms);
        }
    }

    /// Notes how long the synchronous part of `checkpoint` took since
    /// `started`, for the live metrics.
    pub(super) fn note_sync_part(&self, checkpoint: CheckpointId, started: std::time::Instant) {
        if let Some(cell) = &self.metrics {
            let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            cell.set_sync_part(checkpoint.0, micros);
        }
    }

    pub(super) fn tell(&self, kind: NodeEventKind) {
        self.supervisor.do_send(NodeEvent {
            generation: self.generation,
            node: self.node,
            kind,
        });
    }
}
