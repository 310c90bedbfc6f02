//! The supervisor actor: drives the checkpoint coordinator, persists
//! checkpoints through a writer thread, detects failures and restarts the
//! job from the last completed checkpoint.
//!
//! The supervisor owns the life of a running job: the generations of
//! subtask actors (each on its own arbiter pool, so stopping a generation
//! is shutting its pool down), the [`Coordinator`] (fed acks, declines and
//! time; its triggers, completions and aborts are carried out here), the
//! restart decisions, and the [`JobReport`]. It never blocks its actor:
//! every store operation runs on the writer thread, the shutdown of a
//! failed generation's pool on a helper thread, and both answer with
//! messages. It never panics on an operator's failure: failures arrive as
//! [`FailureReport`]s and become restarts or a typed error.
//!
//! Order of a checkpoint: trigger at the initiators → every subtask acks
//! with its part → the coordinator completes → the writer writes every
//! part and commits the metadata → only then are the subtasks told the
//! checkpoint is complete (sinks commit). A bounded job ends with one more
//! checkpoint after every subtask's input ended, so the sinks commit
//! everything; the job is done when every subtask has processed that
//! completion.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::num::NonZeroUsize;
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use actix::{Actor, ActorContext, Addr, AsyncContext, Context, Handler, Message, SpawnHandle};

use crate::protocol::{
    AckOutcome, CheckpointId, CheckpointKind, Coordinator, CoordinatorAction, CoordinatorConfig,
};
use crate::runtime::failure::{FailureReport, FailureSink};
use crate::runtime::pool::{ActorSlot, ArbiterPool, Placement, PoolConfig};
use crate::runtime::stage::Inject;
use crate::runtime::{ActorTag, Generation};
use crate::storage::{
    self, CheckpointStore, CommitRequest, KeyGroupLayout, MemoryCheckpointStore, PartId, StoreError,
};

use super::physical::{start_generation, GenerationHandles, PhysicalPlan, SupervisorLinks};
use super::shell::{Control, NodeEvent, NodeEventKind};
use super::{
    CheckpointReport, FailedCheckpoint, JobError, JobReport, OperatorReport, RestartReport,
};
use crate::restart::{RestartDecision, RestartTracker};
use crate::source::Guarantee;

type Outcome = (Result<JobReport, JobError>, Option<ArbiterPool>);

/// A job running on its own threads: cancel it, stop it with a savepoint,
/// or wait for it to finish.
pub struct RunningJob {
    supervisor: Addr<Supervisor>,
    done: mpsc::Receiver<Outcome>,
    control: ArbiterPool,
    writer_thread: thread::JoinHandle<()>,
}

impl RunningJob {
    /// Stops the job as soon as possible, without a savepoint; [`RunningJob::wait`]
    /// then returns [`JobError::Cancelled`]. Output not yet committed is
    /// dropped (sinks roll it back when the job resumes).
    pub fn cancel(&self) {
        self.supervisor.do_send(Stop { savepoint: false });
    }

    /// Takes a savepoint and stops the job once every subtask has processed
    /// its completion (sinks committed everything before it). The job can
    /// resume from it later: a new run on the same store starts from the
    /// newest checkpoint or savepoint. [`RunningJob::wait`] then reports the
    /// savepoint's id in [`JobReport::savepoint`]. A bounded job that ends
    /// first simply finishes.
    pub fn stop_with_savepoint(&self) {
        self.supervisor.do_send(Stop { savepoint: true });
    }

    /// Blocks until the job finishes, fails, or is stopped.
    pub fn wait(self) -> Result<JobReport, JobError> {
        let (result, pool) = match self.done.recv() {
            Ok(outcome) => outcome,
            Err(_) => (
                Err(JobError::Internal(
                    "the supervisor stopped without a result".into(),
                )),
                None,
            ),
        };
        if let Some(pool) = pool {
            pool.shutdown()?;
        }
        self.control.shutdown()?;
        // The writer ends when the supervisor (its only sender) is dropped.
        if self.writer_thread.join().is_err() {
            return Err(JobError::Internal("the checkpoint writer panicked".into()));
        }
        result
    }
}

/// Starts a planned job on its own threads.
pub(crate) fn start(name: String, plan: PhysicalPlan) -> Result<RunningJob, JobError> {
    let span = tracing::info_span!("job", job = %name);
    let restarts = RestartTracker::new(plan.config.restart.clone())?;
    let store: Arc<dyn CheckpointStore> = match &plan.config.store {
        Some(store) => Arc::clone(store),
        None => Arc::new(MemoryCheckpointStore::new(&name)?),
    };
    let control = ArbiterPool::new(PoolConfig {
        arbiters: NonZeroUsize::MIN,
    })?;
    let slot: ActorSlot<Supervisor> = ActorSlot::new();
    let supervisor = slot.address();
    let (writer, writer_thread) = spawn_writer(store, supervisor.clone())?;
    let (done_sender, done) = mpsc::channel::<Outcome>();
    let tag = ActorTag::new("supervisor", 0, Generation(0));
    control.start_in_slot(
        slot,
        Placement::Arbiter(0),
        tag,
        FailureSink::log_only(),
        move |_| Supervisor::new(name, plan, writer, done_sender, span, restarts),
    )?;
    Ok(RunningJob {
        supervisor,
        done,
        control,
        writer_thread,
    })
}

#[derive(Message)]
#[rtype(result = "()")]
struct Stop {
    savepoint: bool,
}

/// Work for the writer thread.
enum WriterJob {
    Persist {
        generation: Generation,
        checkpoint: CheckpointId,
        kind: storage::CheckpointKind,
        parts: Vec<(PartId, Vec<u8>)>,
        request: CommitRequest,
    },
    Load {
        generation: Generation,
    },
}

/// A restored checkpoint: its id and every part.
type Restored = Option<(CheckpointId, BTreeMap<PartId, Vec<u8>>, KeyGroupLayout)>;

#[derive(Message)]
#[rtype(result = "()")]
struct Persisted {
    generation: Generation,
    checkpoint: CheckpointId,
    result: Result<u64, StoreError>,
}

#[derive(Message)]
#[rtype(result = "()")]
struct Loaded {
    generation: Generation,
    result: Result<Restored, StoreError>,
}

#[derive(Message)]
#[rtype(result = "()")]
struct PoolStopped {
    generation: Generation,
}

/// The writer thread: the asynchronous part of every checkpoint, and
/// loading on restore. Its queue is unbounded, but the supervisor sends at
/// most one persist per completed checkpoint and one load per generation.
fn spawn_writer(
    store: Arc<dyn CheckpointStore>,
    supervisor: Addr<Supervisor>,
) -> Result<(mpsc::Sender<WriterJob>, thread::JoinHandle<()>), JobError> {
    let (sender, receiver) = mpsc::channel::<WriterJob>();
    let thread = thread::Builder::new()
        .name("snapflow-writer".into())
        .spawn(move || {
            for job in receiver {
                match job {
                    WriterJob::Persist {
                        generation,
                        checkpoint,
                        kind,
                        parts,
                        request,
                    } => {
                        let result = persist(store.as_ref(), checkpoint.0, kind, &parts, request);
                        supervisor.do_send(Persisted {
                            generation,
                            checkpoint,
                            result,
                        });
                    }
                    WriterJob::Load { generation } => {
                        let result = load(store.as_ref());
                        supervisor.do_send(Loaded { generation, result });
                    }
                }
            }
        })
        .map_err(|error| JobError::Runtime(crate::runtime::RuntimeError::ThreadStart(error)))?;
    Ok((sender, thread))
}

fn persist(
    store: &dyn CheckpointStore,
    checkpoint: u64,
    kind: storage::CheckpointKind,
    parts: &[(PartId, Vec<u8>)],
    request: CommitRequest,
) -> Result<u64, StoreError> {
    store.begin(checkpoint, kind)?;
    let written = parts
        .iter()
        .try_for_each(|(part, bytes)| store.write_part(checkpoint, part, bytes).map(|_| ()))
        .and_then(|()| store.commit(checkpoint, request));
    match written {
        Ok(metadata) => Ok(metadata.total_bytes()),
        Err(error) => {
            // Best effort: a leftover is removed by the next `begin` anyway.
            if let Err(discard) = store.discard(checkpoint) {
                tracing::warn!(checkpoint, "discarding a failed checkpoint: {discard}");
            }
            Err(error)
        }
    }
}

fn load(store: &dyn CheckpointStore) -> Result<Restored, StoreError> {
    let report = store.load_latest()?;
    for skipped in &report.skipped {
        tracing::warn!(
            checkpoint = skipped.checkpoint,
            "skipped a checkpoint that does not verify: {}",
            skipped.reason
        );
    }
    Ok(report.checkpoint.map(|loaded| {
        (
            CheckpointId(loaded.metadata.checkpoint),
            loaded.parts,
            loaded.metadata.key_groups,
        )
    }))
}

/// Why a generation failed.
enum Failure {
    /// An operator instance failed while `checkpoint_in_flight` was the
    /// newest checkpoint triggered and neither complete nor aborted.
    Operator {
        report: FailureReport,
        checkpoint_in_flight: Option<CheckpointId>,
    },
    /// More checkpoints failed in a row than tolerated; `persist` is the
    /// store error when the last of them could not be persisted.
    Checkpoints {
        consecutive_failures: u32,
        persist: Option<(CheckpointId, StoreError)>,
    },
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Operator {
                report,
                checkpoint_in_flight,
            } => {
                write!(f, "{report}; ")?;
                match checkpoint_in_flight {
                    Some(checkpoint) => write!(f, "{checkpoint} in flight"),
                    None => f.write_str("no checkpoint in flight"),
                }
            }
            Failure::Checkpoints {
                consecutive_failures,
                persist,
            } => {
                write!(f, "{consecutive_failures} checkpoints failed in a row")?;
                match persist {
                    Some((checkpoint, error)) => {
                        write!(f, "; {checkpoint} could not be persisted: {error}")
                    }
                    None => Ok(()),
                }
            }
        }
    }
}

/// A failure being recovered from, until the restart is reported.
struct PendingRestart {
    cause: String,
    report: Option<FailureReport>,
    checkpoint_in_flight: Option<u64>,
    /// When the failure was reported.
    since: Instant,
}

impl PendingRestart {
    fn new(cause: String, failure: Failure) -> PendingRestart {
        let (report, checkpoint_in_flight) = match failure {
            Failure::Operator {
                report,
                checkpoint_in_flight,
            } => (
                Some(report),
                checkpoint_in_flight.map(|checkpoint| checkpoint.0),
            ),
            Failure::Checkpoints { .. } => (None, None),
        };
        PendingRestart {
            cause,
            report,
            checkpoint_in_flight,
            since: Instant::now(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the checkpoint to restore from.
    Loading,
    Running,
    /// A failure stopped the generation; waiting for its pool to stop and
    /// the restart delay.
    Restarting,
    Done,
}

/// What the supervisor knows of one running generation.
struct Running {
    handles: GenerationHandles,
    coordinator: Coordinator<Vec<u8>>,
    /// Per node: its input ended (a source: exhausted).
    ended: Vec<bool>,
    /// Per node: the newest completion it processed (sinks committed).
    committed: Vec<Option<CheckpointId>>,
    /// The first checkpoint triggered after every input ended.
    final_from: Option<CheckpointId>,
}

pub(crate) struct Supervisor {
    name: String,
    plan: Arc<PhysicalPlan>,
    writer: mpsc::Sender<WriterJob>,
    done: Option<mpsc::Sender<Outcome>>,
    span: tracing::Span,
    phase: Phase,
    generation: Generation,
    pool: Option<ArbiterPool>,
    running: Option<Running>,
    clock: Instant,
    timer: Option<SpawnHandle>,
    /// The newest checkpoint id ever triggered, across generations.
    highest_triggered: CheckpointId,
    triggered_at: HashMap<CheckpointId, Instant>,
    /// The longest alignment acked so far per triggered checkpoint; same
    /// lifetime as `triggered_at`.
    alignment_max_us: HashMap<CheckpointId, u64>,
    restarts: RestartTracker,
    /// The failure being recovered from, and when it was reported.
    failure: Option<PendingRestart>,
    /// The wait before the pending restart.
    restart_delay_ms: u64,
    /// Completed checkpoints sent to the writer and not yet persisted.
    /// Their trigger times survive a restart, so a checkpoint that becomes
    /// durable after a failure still reports its real duration.
    persisting: BTreeSet<CheckpointId>,
    /// The user asked to stop with a savepoint.
    stop_requested: bool,
    /// The store error of the persist failure being counted, for the
    /// `FailJob` it may cause (see `count_persist_failure`).
    persist_failure: Option<(CheckpointId, StoreError)>,
    /// The stop savepoint, while it is triggered and not yet persisted.
    savepoint_in_flight: Option<CheckpointId>,
    /// Timers ticking the iteration heads of the running generation.
    tickers: Vec<SpawnHandle>,
    report: JobReport,
}

impl Supervisor {
    fn new(
        name: String,
        plan: PhysicalPlan,
        writer: mpsc::Sender<WriterJob>,
        done: mpsc::Sender<Outcome>,
        span: tracing::Span,
        restarts: RestartTracker,
    ) -> Supervisor {
        let report = JobReport {
            guarantee: Guarantee::ExactlyOnce,
            job: name.clone(),
            operators: plan
                .operators
                .iter()
                .map(|operator| OperatorReport {
                    name: operator.name.clone(),
                    parallelism: operator.parallelism,
                    ..OperatorReport::default()
                })
                .collect(),
            checkpoints: Vec::new(),
            failed_checkpoints: Vec::new(),
            restarts: Vec::new(),
            resumed_from: None,
            savepoint: None,
        };
        Supervisor {
            name,
            plan: Arc::new(plan),
            writer,
            done: Some(done),
            span,
            phase: Phase::Loading,
            generation: Generation(1),
            pool: None,
            running: None,
            clock: Instant::now(),
            timer: None,
            highest_triggered: CheckpointId(0),
            triggered_at: HashMap::new(),
            alignment_max_us: HashMap::new(),
            restarts,
            failure: None,
            restart_delay_ms: 0,
            persisting: BTreeSet::new(),
            stop_requested: false,
            persist_failure: None,
            savepoint_in_flight: None,
            tickers: Vec::new(),
            report,
        }
    }

    /// The span of one checkpoint's events, under the job's span.
    fn checkpoint_span(&self, checkpoint: CheckpointId) -> tracing::Span {
        tracing::info_span!(parent: &self.span, "checkpoint", checkpoint = checkpoint.0)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.clock.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn request_load(&mut self, context: &mut Context<Self>) {
        self.phase = Phase::Loading;
        let job = WriterJob::Load {
            generation: self.generation,
        };
        if self.writer.send(job).is_err() {
            self.finish(
                Err(JobError::Internal("the checkpoint writer stopped".into())),
                context,
            );
        }
    }

    fn start(&mut self, restored: Restored, context: &mut Context<Self>) -> Result<(), JobError> {
        let span = self.span.clone();
        let _entered = span.enter();
        let (last_completed, parts) = match restored {
            Some((checkpoint, parts, layout)) => {
                (Some(checkpoint), self.plan.redistribute(parts, &layout)?)
            }
            None => (None, BTreeMap::new()),
        };
        if let Some(checkpoint) = last_completed {
            self.highest_triggered = self.highest_triggered.max(checkpoint);
        }
        let arbiters = self
            .plan
            .config
            .arbiters
            .and_then(NonZeroUsize::new)
            .map_or_else(PoolConfig::default, |arbiters| PoolConfig { arbiters });
        let pool = ArbiterPool::new(arbiters)?;
        let config = &self.plan.config;
        let coordinator = Coordinator::new(
            CoordinatorConfig {
                interval_ms: config.checkpoint_interval_ms,
                min_pause_ms: config.min_pause_ms,
                max_concurrent: config.max_concurrent_checkpoints,
                timeout_ms: config.checkpoint_timeout_ms,
                tolerable_failures: config.tolerable_checkpoint_failures,
                first_checkpoint: self.highest_triggered.next(),
            },
            self.plan.node_count(),
            self.plan.snapshot.initiators.clone(),
            self.now_ms(),
        )?;
        let address = context.address();
        let failures = FailureSink::from_recipient(address.clone().recipient());
        let links = SupervisorLinks {
            events: address.recipient(),
            failures,
            span: self.span.clone(),
        };
        let handles = start_generation(
            &self.plan,
            &pool,
            self.generation,
            &links,
            &parts,
            last_completed,
        )?;
        let nodes = self.plan.node_count();
        self.pool = Some(pool);
        self.running = Some(Running {
            handles,
            coordinator,
            ended: vec![false; nodes],
            committed: vec![None; nodes],
            final_from: None,
        });
        self.phase = Phase::Running;
        self.restarts.on_running(self.now_ms());
        tracing::info!(
            generation = self.generation.0,
            restored_from = last_completed.map(|checkpoint| checkpoint.0),
            "generation started"
        );
        if let Some(pending) = self.failure.take() {
            self.report.restarts.push(RestartReport {
                generation: self.generation.0,
                cause: pending.cause,
                failure: pending.report,
                checkpoint_in_flight: pending.checkpoint_in_flight,
                restored_from: last_completed.map(|checkpoint| checkpoint.0),
                recovery_ms: millis(pending.since.elapsed()),
            });
        } else {
            self.report.resumed_from = last_completed.map(|checkpoint| checkpoint.0);
        }
        self.reschedule(context);
        self.request_savepoint(context);
        Ok(())
    }

    fn broadcast(&self, control: Control) {
        if let Some(running) = &self.running {
            for inject in &running.handles.injects {
                inject.do_send(Inject(control));
            }
        }
    }

    /// Re-arms the coordinator's timer for its next deadline.
    fn reschedule(&mut self, context: &mut Context<Self>) {
        if let Some(timer) = self.timer.take() {
            context.cancel_future(timer);
        }
        let Some(running) = &self.running else {
            return;
        };
        if self.phase != Phase::Running {
            return;
        }
        // While a completed checkpoint is still being written, the schedule
        // pauses: otherwise a store slower than the interval would queue
        // persists without bound (Flink likewise counts a checkpoint as
        // pending until it is finalized). Requested checkpoints (the final
        // one) still start at once, through `request_checkpoint`.
        if !self.persisting.is_empty() {
            return;
        }
        if let Some(due_ms) = running.coordinator.poll_timeout() {
            let delay_ms = due_ms.saturating_sub(self.now_ms());
            self.timer = Some(context.run_later(
                Duration::from_millis(delay_ms),
                |supervisor, context| {
                    supervisor.timer = None;
                    let now_ms = supervisor.now_ms();
                    if let Some(running) = &mut supervisor.running {
                        running.coordinator.handle_timeout(now_ms);
                    }
                    supervisor.carry_out(context);
                },
            ));
        }
    }

    /// Carries out the coordinator's actions, then re-arms the timer.
    fn carry_out(&mut self, context: &mut Context<Self>) {
        let Some(running) = &mut self.running else {
            return;
        };
        let actions: Vec<CoordinatorAction<Vec<u8>>> =
            std::iter::from_fn(|| running.coordinator.poll_action()).collect();
        for action in actions {
            if self.phase != Phase::Running {
                return;
            }
            match action {
                CoordinatorAction::Trigger { checkpoint, kind } => {
                    self.trigger(checkpoint, kind);
                }
                CoordinatorAction::Complete(completed) => {
                    self.persist(
                        completed.checkpoint,
                        completed.kind,
                        completed.parts,
                        context,
                    );
                }
                CoordinatorAction::Abort {
                    checkpoint, reason, ..
                } => {
                    let span = self.checkpoint_span(checkpoint);
                    let _entered = span.enter();
                    tracing::info!(checkpoint = checkpoint.0, ?reason, "checkpoint aborted");
                    self.triggered_at.remove(&checkpoint);
                    self.alignment_max_us.remove(&checkpoint);
                    if reason.is_failure() {
                        self.report.failed_checkpoints.push(FailedCheckpoint {
                            checkpoint: checkpoint.0,
                            reason: format!("{reason:?}"),
                        });
                    }
                    self.broadcast(Control::Abort(checkpoint));
                    if self.savepoint_in_flight == Some(checkpoint) {
                        self.savepoint_in_flight = None;
                        self.request_savepoint(context);
                    }
                }
                CoordinatorAction::FailJob {
                    consecutive_failures,
                } => {
                    let failure = Failure::Checkpoints {
                        consecutive_failures,
                        persist: self.persist_failure.take(),
                    };
                    self.fail(failure, context);
                }
            }
        }
        self.reschedule(context);
    }

    fn trigger(&mut self, checkpoint: CheckpointId, kind: CheckpointKind) {
        let span = self.checkpoint_span(checkpoint);
        let _entered = span.enter();
        tracing::info!(checkpoint = checkpoint.0, ?kind, "checkpoint triggered");
        self.highest_triggered = self.highest_triggered.max(checkpoint);
        self.triggered_at.insert(checkpoint, Instant::now());
        if kind == CheckpointKind::Savepoint {
            self.savepoint_in_flight = Some(checkpoint);
        }
        let Some(running) = &self.running else {
            return;
        };
        for &node in running.coordinator.initiators() {
            running.handles.injects[node].do_send(Inject(Control::Trigger(checkpoint)));
        }
    }

    fn persist(
        &mut self,
        checkpoint: CheckpointId,
        kind: CheckpointKind,
        parts: Vec<Vec<u8>>,
        context: &mut Context<Self>,
    ) {
        let parts: Vec<(PartId, Vec<u8>)> = parts
            .into_iter()
            .enumerate()
            .map(|(node, bytes)| (self.plan.part_id(node), bytes))
            .collect();
        let request = CommitRequest {
            key_groups: KeyGroupLayout {
                max_parallelism: self.plan.config.max_parallelism,
                operator_parallelism: self
                    .plan
                    .operators
                    .iter()
                    .map(|operator| (operator.name.clone(), operator.parallelism as u32))
                    .collect(),
            },
            expected_parts: Some(parts.iter().map(|(part, _)| part.clone()).collect()),
            ..CommitRequest::default()
        };
        let kind = match kind {
            CheckpointKind::Savepoint => storage::CheckpointKind::Savepoint,
            CheckpointKind::Periodic | CheckpointKind::Requested => {
                storage::CheckpointKind::Checkpoint
            }
        };
        self.persisting.insert(checkpoint);
        let job = WriterJob::Persist {
            generation: self.generation,
            checkpoint,
            kind,
            parts,
            request,
        };
        if self.writer.send(job).is_err() {
            self.finish(
                Err(JobError::Internal("the checkpoint writer stopped".into())),
                context,
            );
        }
    }

    fn on_node_event(&mut self, event: NodeEvent, context: &mut Context<Self>) {
        if event.generation != self.generation || self.phase != Phase::Running {
            return;
        }
        let now_ms = self.now_ms();
        let Some(running) = &mut self.running else {
            return;
        };
        let node = event.node;
        match event.kind {
            NodeEventKind::Ack {
                checkpoint,
                part,
                alignment_us,
            } => {
                if self.triggered_at.contains_key(&checkpoint) {
                    let longest = self.alignment_max_us.entry(checkpoint).or_default();
                    *longest = (*longest).max(alignment_us);
                }
                // A stale ack's part is simply dropped: parts live in memory
                // until the writer persists a completed checkpoint.
                if let AckOutcome::Stale(_) =
                    running.coordinator.on_ack(now_ms, node, checkpoint, part)
                {
                    tracing::debug!(checkpoint = checkpoint.0, node, "stale ack");
                }
            }
            NodeEventKind::Decline { checkpoint, reason } => {
                running
                    .coordinator
                    .on_decline(now_ms, node, checkpoint, reason);
            }
            NodeEventKind::InputsEnded => {
                running.ended[node] = true;
                if let Some(idle_ms) = self.plan.is_loop_head(node) {
                    // The head decides when its loop is idle; it needs a
                    // clock, which the supervisor's ticks give it.
                    let inject = running.handles.injects[node].clone();
                    let period = Duration::from_millis((idle_ms / 4).max(1));
                    self.tickers.push(context.run_interval(period, move |_, _| {
                        inject.do_send(Inject(Control::Tick));
                    }));
                }
                for checkpoint in running.coordinator.add_initiator(node) {
                    running.handles.injects[node].do_send(Inject(Control::Trigger(checkpoint)));
                }
                if running.final_from.is_none() && running.ended.iter().all(|&ended| ended) {
                    // Every checkpoint from the next one on sees every input
                    // ended, so its completion commits all output.
                    running.final_from = Some(self.highest_triggered.next());
                    running
                        .coordinator
                        .request_checkpoint(now_ms, CheckpointKind::Requested);
                }
            }
            NodeEventKind::Committed { checkpoint } => {
                running.committed[node] = running.committed[node].max(Some(checkpoint));
                if self.is_done() {
                    let report = self.final_report();
                    self.finish(Ok(report), context);
                    return;
                }
            }
        }
        self.carry_out(context);
    }

    /// Whether every subtask committed a checkpoint that ends the job: one
    /// triggered after every input ended, or the stop savepoint.
    fn is_done(&self) -> bool {
        let Some(running) = &self.running else {
            return false;
        };
        let all_committed = |first: CheckpointId| {
            running
                .committed
                .iter()
                .all(|committed| committed.is_some_and(|checkpoint| checkpoint >= first))
        };
        let ended = running.final_from.is_some_and(all_committed);
        let stopped = self.stop_requested
            && self
                .report
                .savepoint
                .is_some_and(|savepoint| all_committed(CheckpointId(savepoint)));
        ended || stopped
    }

    fn on_stop(&mut self, savepoint: bool, context: &mut Context<Self>) {
        if self.phase == Phase::Done {
            return;
        }
        if !savepoint {
            let span = self.span.clone();
            let _entered = span.enter();
            tracing::info!("job cancelled");
            self.finish(Err(JobError::Cancelled), context);
            return;
        }
        self.stop_requested = true;
        self.request_savepoint(context);
    }

    /// Asks the coordinator for the stop savepoint (again, after an abort
    /// or a restart); while the job is not running it is asked at start.
    fn request_savepoint(&mut self, context: &mut Context<Self>) {
        if !self.stop_requested || self.savepoint_in_flight.is_some() {
            return;
        }
        let now_ms = self.now_ms();
        if let (Phase::Running, Some(running)) = (self.phase, &mut self.running) {
            running
                .coordinator
                .request_checkpoint(now_ms, CheckpointKind::Savepoint);
            self.carry_out(context);
        }
    }

    fn on_persisted(&mut self, persisted: Persisted, context: &mut Context<Self>) {
        let checkpoint = persisted.checkpoint;
        self.persisting.remove(&checkpoint);
        self.reschedule(context);
        let started = self.triggered_at.remove(&checkpoint);
        let alignment_max_us = self.alignment_max_us.remove(&checkpoint).unwrap_or(0);
        let span = self.checkpoint_span(checkpoint);
        let _entered = span.enter();
        match persisted.result {
            Ok(size_bytes) => {
                let duration_ms = started.map_or(0, |at| millis(at.elapsed()));
                tracing::info!(
                    checkpoint = checkpoint.0,
                    duration_ms,
                    size_bytes,
                    "checkpoint complete"
                );
                self.report.checkpoints.push(CheckpointReport {
                    checkpoint: checkpoint.0,
                    duration_ms,
                    size_bytes,
                    alignment_max_us,
                });
                if self.savepoint_in_flight == Some(checkpoint) {
                    self.savepoint_in_flight = None;
                    self.report.savepoint = Some(checkpoint.0);
                }
                if persisted.generation == self.generation && self.phase == Phase::Running {
                    self.broadcast(Control::Complete(checkpoint));
                }
            }
            Err(error) => {
                tracing::warn!(
                    checkpoint = checkpoint.0,
                    "checkpoint not persisted: {error}"
                );
                self.report.failed_checkpoints.push(FailedCheckpoint {
                    checkpoint: checkpoint.0,
                    reason: format!("not persisted: {error}"),
                });
                self.count_persist_failure(persisted.generation, checkpoint, error, context);
                if self.savepoint_in_flight == Some(checkpoint) {
                    self.savepoint_in_flight = None;
                    self.request_savepoint(context);
                }
            }
        }
    }

    /// A checkpoint that could not be persisted is a failed checkpoint for
    /// the coordinator's tolerance. The coordinator that completed it must
    /// still be running (same generation); a failure of an earlier
    /// generation's checkpoint is only reported, because the new
    /// generation's coordinator counts from zero, as after any restart.
    fn count_persist_failure(
        &mut self,
        generation: Generation,
        checkpoint: CheckpointId,
        error: StoreError,
        context: &mut Context<Self>,
    ) {
        if generation != self.generation || self.phase != Phase::Running {
            return;
        }
        let now_ms = self.now_ms();
        let Some(running) = &mut self.running else {
            return;
        };
        self.persist_failure = Some((checkpoint, error));
        running.coordinator.on_persist_failed(now_ms, checkpoint);
        self.carry_out(context);
        // Only a `FailJob` of this very call takes the error.
        self.persist_failure = None;
    }

    /// Stops the generation and restarts per the strategy, or gives up.
    fn fail(&mut self, failure: Failure, context: &mut Context<Self>) {
        let cause = failure.to_string();
        let span = self.span.clone();
        let _entered = span.enter();
        self.cancel_timers(context);
        self.retire_generation();
        match self.restarts.on_failure(self.now_ms()) {
            RestartDecision::GiveUp { reason } => {
                tracing::error!(generation = self.generation.0, %cause, %reason, "job failed");
                let (restarts, reason) = (self.restarts.attempts(), reason.to_string());
                let error = match failure {
                    Failure::Checkpoints {
                        consecutive_failures,
                        persist: Some((checkpoint, error)),
                    } => JobError::CheckpointPersistFailed {
                        checkpoint: checkpoint.0,
                        consecutive_failures,
                        restarts,
                        reason,
                        error,
                    },
                    _ => JobError::RestartsExhausted {
                        restarts,
                        reason,
                        cause,
                    },
                };
                self.finish(Err(error), context);
            }
            RestartDecision::Restart { delay_ms, attempt } => {
                tracing::warn!(
                    generation = self.generation.0,
                    attempt,
                    delay_ms,
                    %cause,
                    "restarting the job"
                );
                self.phase = Phase::Restarting;
                self.failure = Some(PendingRestart::new(cause, failure));
                let generation = self.generation;
                let address = context.address();
                let pool = self.pool.take();
                let stop = move || {
                    if let Some(pool) = pool {
                        if let Err(error) = pool.shutdown() {
                            tracing::warn!("stopping a failed generation: {error}");
                        }
                    }
                    address.do_send(PoolStopped { generation });
                };
                // Joining the arbiter threads can wait for user code to
                // return, so it happens off the supervisor's thread.
                let spawned = thread::Builder::new()
                    .name("snapflow-stop".into())
                    .spawn(stop);
                if spawned.is_err() {
                    // The closure (and the pool in it) was dropped, which
                    // shut the pool down on this thread; carry on.
                    tracing::error!("could not start the thread that stops a generation");
                    context.address().do_send(PoolStopped { generation });
                }
                self.restart_delay_ms = delay_ms;
            }
        }
    }

    fn cancel_timers(&mut self, context: &mut Context<Self>) {
        if let Some(timer) = self.timer.take() {
            context.cancel_future(timer);
        }
        for ticker in self.tickers.drain(..) {
            context.cancel_future(ticker);
        }
    }

    /// Folds the generation's channel statistics into the report and drops
    /// the coordinator (aborting what was in flight).
    fn retire_generation(&mut self) {
        let Some(mut running) = self.running.take() else {
            return;
        };
        running.coordinator.abort_all(self.now_ms());
        self.savepoint_in_flight = None;
        for (operator, stats) in &running.handles.channel_stats {
            let report = &mut self.report.operators[*operator];
            report.in_flight_batches_peak = report
                .in_flight_batches_peak
                .max(stats.in_flight_batches_peak());
            report.credit_stalls += stats.credit_stalls();
        }
        // Checkpoints still with the writer keep their figures: they may
        // yet become durable, and then they are reported as complete.
        let persisting = &self.persisting;
        self.triggered_at
            .retain(|checkpoint, _| persisting.contains(checkpoint));
        self.alignment_max_us
            .retain(|checkpoint, _| persisting.contains(checkpoint));
    }

    fn final_report(&mut self) -> JobReport {
        self.retire_generation();
        let mut report = self.report.clone();
        if self.plan.config.mode == crate::protocol::SnapshotMode::AtLeastOnce {
            report.guarantee = Guarantee::AtLeastOnce;
        }
        for (operator, planned) in report.operators.iter_mut().zip(&self.plan.operators) {
            let counters = &planned.counters;
            operator.records_in = counters
                .records_in
                .load(std::sync::atomic::Ordering::Relaxed);
            operator.records_out = counters
                .records_out
                .load(std::sync::atomic::Ordering::Relaxed);
            if counters
                .at_least_once
                .load(std::sync::atomic::Ordering::Relaxed)
            {
                report.guarantee = Guarantee::AtLeastOnce;
            }
        }
        report
    }

    fn finish(&mut self, result: Result<JobReport, JobError>, context: &mut Context<Self>) {
        self.phase = Phase::Done;
        self.retire_generation();
        self.cancel_timers(context);
        if let Some(done) = self.done.take() {
            let span = self.span.clone();
            let _entered = span.enter();
            tracing::info!(job = %self.name, ok = result.is_ok(), "job finished");
            // The receiver waits in `run`; if it is gone nobody needs the
            // result.
            let _ = done.send((result, self.pool.take()));
        }
        context.stop();
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, context: &mut Context<Self>) {
        self.request_load(context);
    }
}

impl Handler<NodeEvent> for Supervisor {
    type Result = ();

    fn handle(&mut self, event: NodeEvent, context: &mut Context<Self>) {
        self.on_node_event(event, context);
    }
}

impl Handler<FailureReport> for Supervisor {
    type Result = ();

    fn handle(&mut self, report: FailureReport, context: &mut Context<Self>) {
        if report.tag.generation != self.generation || self.phase != Phase::Running {
            return;
        }
        let checkpoint_in_flight = self
            .running
            .as_ref()
            .and_then(|running| running.coordinator.in_flight().last());
        let failure = Failure::Operator {
            report,
            checkpoint_in_flight,
        };
        self.fail(failure, context);
    }
}

impl Handler<Persisted> for Supervisor {
    type Result = ();

    fn handle(&mut self, persisted: Persisted, context: &mut Context<Self>) {
        self.on_persisted(persisted, context);
    }
}

impl Handler<Loaded> for Supervisor {
    type Result = ();

    fn handle(&mut self, loaded: Loaded, context: &mut Context<Self>) {
        if loaded.generation != self.generation || self.phase != Phase::Loading {
            return;
        }
        let started = match loaded.result {
            Ok(restored) => self.start(restored, context),
            Err(error) => Err(JobError::Store(error)),
        };
        if let Err(error) = started {
            self.finish(Err(error), context);
        }
    }
}

impl Handler<PoolStopped> for Supervisor {
    type Result = ();

    fn handle(&mut self, stopped: PoolStopped, context: &mut Context<Self>) {
        if stopped.generation != self.generation || self.phase != Phase::Restarting {
            return;
        }
        context.run_later(
            Duration::from_millis(self.restart_delay_ms),
            |supervisor, context| {
                supervisor.generation = Generation(supervisor.generation.0 + 1);
                supervisor.request_load(context);
            },
        );
    }
}

impl Handler<Stop> for Supervisor {
    type Result = ();

    fn handle(&mut self, stop: Stop, context: &mut Context<Self>) {
        self.on_stop(stop.savepoint, context);
    }
}
