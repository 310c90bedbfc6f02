//! The source shell: one source instance, an initiator of checkpoints,
//! which reads, assigns watermarks and reports its position.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::protocol::{NodeAction, NodeMachine};
use crate::runtime::channel::Outputs;
use crate::runtime::source::{SourceLogic, SourcePoll};
use crate::runtime::BoxError;

use super::env::ShellEnv;
use super::event::{Control, Data, NodeEventKind};
use super::part::PartBytes;
use super::pending::PendingPart;
use super::snapshot::{SnapshotDriver, SnapshotHost};
use super::taken::{BarrierKinds, TakenStates};
use crate::job::route::Router;
use crate::metrics::{BytesSeen, SourceMeter};
use crate::source::{Source, SourceError, SourcePoll as ReadStatus, SourcePosition, SplitId};
use crate::storage::Segment;
use crate::watermark::{SourceSignal, SourceWatermarks};

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
    /// The kind of each checkpoint in flight, as its trigger carried it.
    kinds: BarrierKinds,
    /// The subtask's watermark generator, when the stream has a
    /// [`crate::time::WatermarkStrategy`].
    watermarks: Option<SourceWatermarks<T>>,
    /// The splits the source reports, reused between polls.
    splits: Vec<SplitId>,
    /// Snapshots that are not checkpoints (see `snapshot.rs`); a source
    /// has no inputs, so it only starts and joins them.
    snapshots: SnapshotDriver<T>,
    /// The source's own figures on their way to the live metrics.
    meter: SourceMeter,
    /// The source's dropped records already added to the counters (its
    /// running total, which a new source object starts again at 0).
    dropped: BytesSeen,
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
            snapshots: SnapshotDriver::new(&env, 0, None),
            taken_time: TakenStates::default(),
            kinds: BarrierKinds::default(),
            watermarks,
            splits: Vec::new(),
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
            meter: SourceMeter::default(),
            dropped: BytesSeen::default(),
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
            if let Some(cell) = &self.env.metrics {
                // A source shows its dropped records from the start, 0
                // included.
                cell.add_records_dropped(0);
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
                    if let Some(cell) = &self.env.metrics {
                        cell.set_position(&position);
                    }
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
                        let kind = self.kinds.kind(checkpoint);
                        outputs.broadcast_control(Control::Barrier(checkpoint, kind));
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
                        part: PendingPart::Ready(vec![Segment::Own(bytes)]),
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

impl<T: Data> SourceShell<T> {
    /// Adds `records` the source dropped to the report's counter and the
    /// live metrics.
    fn note_dropped(&self, records: u64) {
        self.env
            .counters
            .records_dropped
            .fetch_add(records, Ordering::Relaxed);
        if let Some(cell) = &self.env.metrics {
            cell.add_records_dropped(records);
        }
    }

    /// What the watermark machinery says after a poll that read `records`:
    /// it asks the source which splits it reads and which one the records
    /// came from.
    fn watermark_signal(&mut self, records: &[T]) -> Result<SourceSignal, BoxError> {
        let mut splits = std::mem::take(&mut self.splits);
        splits.clear();
        let reader = self.reader()?;
        reader.current_splits(&mut splits);
        let split = reader.last_split();
        let signal = match &mut self.watermarks {
            Some(watermarks) => {
                let before = watermarks.regressions();
                let signal = watermarks.on_poll(records, split, &splits);
                // A generator that went back is ignored there; the report
                // shows how often.
                let regressed = watermarks.regressions() - before;
                if regressed > 0 {
                    self.env
                        .counters
                        .watermark_regressions
                        .fetch_add(regressed, Ordering::Relaxed);
                }
                signal
            }
            None => SourceSignal::None,
        };
        self.splits = splits;
        Ok(signal)
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
        let reader = self.reader()?;
        let status = reader.poll_batch(&mut buffer, read_batch);
        let dropped_total = reader.records_dropped();
        let dropped = self.dropped.delta(dropped_total);
        if dropped > 0 {
            self.note_dropped(dropped);
        }
        let records = buffer.len() as u64;
        // One branch per poll without a watermark strategy.
        let signal = match status.is_ok() && self.watermarks.is_some() {
            true => self.watermark_signal(&buffer)?,
            false => SourceSignal::None,
        };
        self.router.route_batch(&mut buffer, outputs);
        self.buffer = buffer;
        match signal {
            SourceSignal::None => {}
            SourceSignal::Watermark(watermark_ms) => {
                self.env.note_watermark(watermark_ms);
                outputs.broadcast_control(Control::Watermark(watermark_ms));
            }
            SourceSignal::Idle => outputs.broadcast_control(Control::Idle),
        }
        self.snapshots.records_out += records;
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

    /// The source's bytes read, lag and (at most once a second, and at
    /// its end) split positions, into the subtask's cell.
    fn record_metrics(&mut self, now: Instant) {
        let (Some(cell), Some(reader)) = (&self.env.metrics, self.reader.as_deref_mut()) else {
            return;
        };
        let figures = reader.figures();
        self.meter
            .record(cell, figures, now, self.exhausted, |out| {
                reader.split_positions(out);
            });
    }

    fn on_injected(
        &mut self,
        control: Control,
        outputs: &mut Outputs<T, Control>,
    ) -> Result<(), BoxError> {
        let _entered = self.env.enter();
        match control {
            Control::Trigger(checkpoint, kind) => {
                self.kinds.note(checkpoint, kind);
                self.machine.on_trigger(checkpoint);
            }
            Control::Abort(checkpoint) => {
                self.kinds.forget_up_to(checkpoint);
                self.taken.forget_up_to(checkpoint);
                self.taken_time.forget_up_to(checkpoint);
                self.machine.on_abort(checkpoint);
            }
            Control::Complete(checkpoint) => {
                self.machine.on_complete(checkpoint);
                self.kinds.forget_up_to(checkpoint);
                self.taken.forget_up_to(checkpoint);
                self.taken_time.forget_up_to(checkpoint);
                self.env.tell(NodeEventKind::Committed { checkpoint });
            }
            Control::StartSnapshot | Control::JoinSnapshot(_) => {
                return self.on_snapshot_control(control, outputs);
            }
            other => return Err(format!("{other:?} was injected into a source").into()),
        }
        self.drive(outputs)
    }
}

/// The source as the snapshot driver sees it: its state is its position.
struct SourceHost<'a, T: Data> {
    reader: &'a mut dyn Source<Item = T>,
    exhausted: bool,
    outputs: &'a mut Outputs<T, Control>,
}

impl<T: Data> SnapshotHost for SourceHost<'_, T> {
    fn capture(&mut self) -> Result<Vec<u8>, BoxError> {
        Ok(self.reader.position().as_bytes().to_vec())
    }

    fn waiting(&self) -> crate::job::snapshots::Waiting {
        crate::job::snapshots::Waiting::default()
    }

    fn emit_marker(&mut self, snapshot: crate::protocol::SnapshotId) {
        // An exhausted source's outputs ended; the end counts as the marker.
        if !self.exhausted {
            self.outputs.broadcast_control(Control::Marker(snapshot));
        }
    }

    fn records_accepted(&mut self) -> Vec<u64> {
        self.outputs.records_accepted()
    }
}

impl<T: Data> SourceShell<T> {
    fn on_snapshot_control(
        &mut self,
        control: Control,
        outputs: &mut Outputs<T, Control>,
    ) -> Result<(), BoxError> {
        // Opened (and sought) first, so the position is the restored one.
        self.reader()?;
        let Some(reader) = self.reader.as_deref_mut() else {
            return Err("the source reader was just made".into());
        };
        let mut host = SourceHost {
            reader,
            exhausted: self.exhausted,
            outputs,
        };
        match control {
            Control::JoinSnapshot(snapshot) => self.snapshots.join(snapshot, &self.env, &mut host),
            _ => self.snapshots.start(None, &self.env, &mut host),
        }
    }
}
