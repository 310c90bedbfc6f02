//! The supervisor actor: drives the checkpoint coordinator, persists
//! checkpoints through a writer thread, detects failures and restarts the
//! failover region that failed from the last completed checkpoint.
//!
//! The supervisor owns the life of a running job: its failover regions
//! (the connected parts of the graph of subtasks, see `region`), each
//! running one generation of subtask actors on its own arbiter pool, so
//! that stopping a region is shutting its pool down; the machine
//! (`machine`, a pure state machine around the checkpoint
//! [`Coordinator`](crate::protocol::Coordinator): fed acks, declines,
//! failures, persists and time, its commands are carried out here); the
//! restart strategy; and the [`JobReport`]. It
//! never blocks its actor: every store operation runs on the writer thread
//! (`writer`), the shutdown of a failed region's pool on a helper thread,
//! and both answer with messages. It never panics on an operator's
//! failure: failures arrive as [`FailureReport`]s and become restarts or a
//! typed error.
//!
//! Order of a checkpoint: trigger at the initiators → every subtask acks
//! with its part → the coordinator completes → the writer writes every
//! part and commits the metadata → only then are the subtasks told the
//! checkpoint is complete (sinks commit). A bounded job ends with one more
//! checkpoint after every subtask's input ended, so the sinks commit
//! everything; the job is done when every subtask has processed that
//! completion.
//!
//! Regional failover (Flink's): checkpoints stay global (one coordinator,
//! one id space, one metadata file holding every region's parts). When a
//! subtask fails, the checkpoints in flight are aborted (the surviving
//! subtasks are told), the coordinator is set aside, and only the failed
//! subtask's region is stopped; after the restart delay it loads the
//! newest complete checkpoint and starts a new generation of that region
//! from its parts. The other regions keep processing meanwhile, without
//! checkpoints (a global checkpoint needs every subtask); once every
//! region runs again a new coordinator starts, numbering on from the
//! newest checkpoint ever triggered. Every start of a region takes a new
//! generation number from one counter, and events, failures and channels
//! of any other generation are dropped, so nothing of an old generation
//! reaches a new one. The restart strategy counts failures per job. Too
//! many checkpoint failures in a row restart every region.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use actix::SpawnHandle;
use actix::{Actor, ActorContext, Addr, AsyncContext, Context, Handler, Message, Recipient};

use crate::protocol::{CheckpointId, CheckpointKind};
use crate::runtime::channel::ChannelStats;
use crate::runtime::failure::{FailureReport, FailureSink};
use crate::runtime::pool::{ActorSlot, ArbiterPool, Placement, PoolConfig};
use crate::runtime::stage::Inject;
use crate::runtime::{ActorTag, Generation};
use crate::storage::{
    self, CheckpointStore, CommitRequest, KeyGroupLayout, MemoryCheckpointStore, PartId, StoreError,
};

use super::physical::{start_generation, PhysicalPlan, SupervisorLinks};
use super::recovery::{Recovery, FINAL_KEY, FINAL_VALUE};
use super::region::failover_regions;
use super::shell::{Control, NodeEvent, NodeEventKind, PendingPart};
use super::snapshots::SnapshotReceiver;
use super::writer::{
    spawn_writer, Loaded, PersistOutcome, Persisted, Restored, WriterHandle, WriterJob,
};
use super::{
    CheckpointReport, FailedCheckpoint, GuaranteeReason, JobError, JobReport, JobStatus,
    OperatorReport, RestartReport,
};
use crate::restart::{RestartDecision, RestartTracker};
use crate::source::Guarantee;

mod checkpoints;
mod failover;
pub(crate) mod machine;
mod metrics;
mod positions;
mod signals;
mod snapshots;

pub use snapshots::StuckDetection;

use failover::plan_regions;
use machine::{Command, Ending, Event, MachineConfig, PersistResult, SupervisorMachine, ToSubtask};

type Outcome = (Result<JobReport, JobError>, Vec<ArbiterPool>);

/// A job running on its own threads: cancel it, stop it with a savepoint,
/// or wait for it to finish.
pub struct RunningJob {
    supervisor: Addr<Supervisor>,
    done: mpsc::Receiver<Outcome>,
    control: ArbiterPool,
    writer_thread: thread::JoinHandle<()>,
    status: Arc<Mutex<JobStatus>>,
    metrics: Arc<crate::metrics::MetricsRegistry>,
    /// Serves until the job ends (`JobConfig::http_addr`).
    #[cfg(feature = "http")]
    http: Option<crate::http::HttpServer>,
    /// The signal thread, once [`RunningJob::stop_on_signals`] started it.
    signals: Mutex<Option<signals::SignalWatch>>,
}

impl RunningJob {
    /// The job's live metrics now (see [`crate::metrics`]): per operator
    /// and subtask the records in and out, their rates, busy, idle and
    /// backpressured time per second and the watermark; the channels'
    /// fill; the checkpoint history; the restarts and the last failure.
    /// Lock-free for the running job: it reads atomics and takes only
    /// locks that the supervisor takes once per checkpoint.
    pub fn metrics(&self) -> crate::metrics::JobMetrics {
        self.metrics.snapshot()
    }

    /// Where the job's HTTP server listens (`None` without one; see
    /// [`JobConfig::http_addr`](crate::job::JobConfig::http_addr)).
    pub fn http_addr(&self) -> Option<std::net::SocketAddr> {
        #[cfg(feature = "http")]
        return self.http.as_ref().map(crate::http::HttpServer::addr);
        #[cfg(not(feature = "http"))]
        None
    }

    /// The registry behind [`RunningJob::metrics`], to read from another
    /// thread (a server, a progress line) while this handle waits.
    pub fn metrics_registry(&self) -> Arc<crate::metrics::MetricsRegistry> {
        Arc::clone(&self.metrics)
    }

    /// What the job is doing now: its newest generation, the restarts so
    /// far, the last failure, the last completed checkpoint. Cheap: a copy
    /// of a small record the supervisor keeps up to date.
    pub fn status(&self) -> JobStatus {
        lock_status(&self.status).clone()
    }

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
    /// first simply finishes. While a failover region restarts, the
    /// savepoint is taken once every region runs again.
    pub fn stop_with_savepoint(&self) {
        self.supervisor.do_send(Stop { savepoint: true });
    }

    /// Takes a savepoint and keeps running: the job can later resume from
    /// it (a new run on the same store starts from the newest checkpoint
    /// or savepoint). It shows in [`RunningJob::metrics`] as a checkpoint
    /// of kind `savepoint`. Known gap: while a failover region restarts
    /// (no checkpoints then) the request is dropped, not queued.
    pub fn trigger_savepoint(&self) {
        self.supervisor.do_send(TriggerSavepoint);
    }

    /// Starts a global snapshot at `operator`'s subtask `subtask` (see
    /// [`crate::job::snapshots`]), concurrently with any other snapshot and
    /// with the periodic checkpoints, which it never delays. The answer, a
    /// [`GlobalSnapshot`](crate::job::snapshots::GlobalSnapshot) or a typed
    /// error (unknown operator, region restarting, declined, aborted,
    /// timed out after 30 s, job ended), arrives on the receiver.
    pub fn snapshot(&self, operator: &str, subtask: usize) -> SnapshotReceiver {
        let (request, receiver) = snapshots::take_snapshot(operator, subtask);
        self.supervisor.do_send(request);
        receiver
    }

    /// Starts the stuck detector: every `interval_ms` it takes a snapshot of
    /// each failover region and reports, as WARN tracing events and in
    /// [`JobStatus::stuck`], deadlocked sets of operators, stalled
    /// operators and subtasks that did not answer (see
    /// [`crate::job::snapshots::detect`]). It never stops the job.
    pub fn detect_stuck(&self, config: StuckDetection) {
        self.supervisor.do_send(snapshots::DetectStuck(config));
    }

    /// Blocks until the job finishes, fails, or is stopped.
    pub fn wait(self) -> Result<JobReport, JobError> {
        let (result, pools) = match self.done.recv() {
            Ok(outcome) => outcome,
            Err(_) => (
                Err(JobError::Internal(
                    "the supervisor stopped without a result".into(),
                )),
                Vec::new(),
            ),
        };
        // The job has ended: signals end the process by default again.
        drop(self.signals);
        // The server stops with the job it shows.
        #[cfg(feature = "http")]
        drop(self.http);
        // Every pool is shut down even if one fails; the first error wins.
        let mut shutdown = Ok(());
        for pool in pools {
            if let Err(error) = pool.shutdown() {
                shutdown = shutdown.and(Err(error));
            }
        }
        // The spilling states' disk tables drop on threads of their own
        // (`keyed/spill/reaper.rs`); no directory of the job outlives it.
        #[cfg(feature = "spill")]
        crate::keyed::spill::wait_for_drops();
        shutdown?;
        self.control.shutdown()?;
        // The writer ends when the supervisor (its only sender) is dropped.
        if self.writer_thread.join().is_err() {
            return Err(JobError::Internal("the checkpoint writer panicked".into()));
        }
        result
    }
}

/// Starts a planned job on its own threads.
pub(crate) fn start(name: String, mut plan: PhysicalPlan) -> Result<RunningJob, JobError> {
    #[cfg(not(feature = "http"))]
    if let Some(addr) = plan.config.http_addr {
        return Err(JobError::InvalidConfig(format!(
            "http_addr {addr} needs snapflow's cargo feature `http`"
        )));
    }
    let metrics = Arc::new(metrics::registry(&name, &plan));
    plan.metrics = Some(Arc::clone(&metrics));
    let span = tracing::info_span!("job", job = %name);
    let restarts = RestartTracker::new(plan.config.restart.clone())?;
    let machine = SupervisorMachine::new(machine_config(&plan))?;
    let store: Arc<dyn CheckpointStore> = match &plan.config.store {
        Some(store) => Arc::clone(store),
        None => Arc::new(MemoryCheckpointStore::new(&name)?),
    };
    {
        let _entered = span.enter();
        match store.location() {
            Some(location) => tracing::info!(?location, "checkpoints are stored in this directory"),
            None => tracing::info!("checkpoints are kept in memory and end with the job"),
        }
    }
    let sinks = plan
        .operators
        .iter()
        .filter_map(|operator| operator.sink.clone())
        .collect();
    let accept_duplicates = plan.config.accept_duplicates_after_fallback;
    let status = Arc::new(Mutex::new(JobStatus::default()));
    let control = ArbiterPool::new(PoolConfig {
        arbiters: NonZeroUsize::MIN,
    })?;
    let slot: ActorSlot<Supervisor> = ActorSlot::new();
    let supervisor = slot.address();
    #[cfg(feature = "http")]
    let http = metrics::serve(&plan.config, &metrics, &supervisor)?;
    let (writer, writer_thread) = spawn_writer(
        store,
        sinks,
        super::restore_check::JobShape::of(&plan),
        accept_duplicates,
        supervisor.clone().recipient(),
        supervisor.clone().recipient(),
    )?;
    let (done_sender, done) = mpsc::channel::<Outcome>();
    let tag = ActorTag::new("supervisor", 0, Generation(0));
    control.start_in_slot(slot, Placement::Arbiter(0), tag, FailureSink::log_only(), {
        let status = Arc::clone(&status);
        move |_| {
            let links = Links {
                writer,
                done: done_sender,
                span,
                status,
            };
            Supervisor::new(name, plan, machine, links, restarts)
        }
    })?;
    Ok(RunningJob {
        supervisor,
        done,
        control,
        writer_thread,
        status,
        metrics,
        #[cfg(feature = "http")]
        http,
        signals: Mutex::new(None),
    })
}

/// Asks for a savepoint that does not stop the job.
#[derive(Message)]
#[rtype(result = "()")]
struct TriggerSavepoint;

impl Handler<TriggerSavepoint> for Supervisor {
    type Result = ();

    fn handle(&mut self, _: TriggerSavepoint, context: &mut Context<Self>) {
        self.feed(Event::SavepointRequested, context);
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct Stop {
    savepoint: bool,
}

/// A failed region's pool has stopped (every actor of its generation is
/// gone).
#[derive(Message)]
#[rtype(result = "()")]
struct PoolStopped {
    region: usize,
    generation: Generation,
}

/// Why regions failed.
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

/// A failure being recovered from, until the region's restart is reported.
#[derive(Clone)]
struct PendingRestart {
    cause: String,
    /// The restart strategy's attempt number and delay.
    attempt: u32,
    delay_ms: u64,
    report: Option<FailureReport>,
    checkpoint_in_flight: Option<u64>,
    /// When the failure was reported.
    since: Instant,
}

impl PendingRestart {
    fn new(failure: &Failure, attempt: u32, delay_ms: u64) -> PendingRestart {
        let (report, checkpoint_in_flight) = match failure {
            Failure::Operator {
                report,
                checkpoint_in_flight,
            } => (
                Some(report.clone()),
                checkpoint_in_flight.map(|checkpoint| checkpoint.0),
            ),
            Failure::Checkpoints { .. } => (None, None),
        };
        PendingRestart {
            cause: failure.to_string(),
            attempt,
            delay_ms,
            report,
            checkpoint_in_flight,
            since: Instant::now(),
        }
    }
}

/// The job's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the checkpoint the first generation restores from.
    Loading,
    /// Started (some regions may be restarting).
    Running,
    Done,
}

/// A failover region's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RegionPhase {
    Running,
    /// Failed: its pool is shutting down, then the restart delay runs.
    Stopping,
    /// Waiting for the checkpoint it restores from.
    Loading,
}

/// One failover region and its current generation.
struct Region {
    /// Its nodes, ascending.
    nodes: Vec<usize>,
    /// The names of the operators it has subtasks of, in declaration order.
    operators: Vec<String>,
    phase: RegionPhase,
    generation: Generation,
    pool: Option<ArbiterPool>,
    /// (operator, stats) of its channels, by sending operator.
    channel_stats: Vec<(usize, ChannelStats)>,
    /// Timers ticking its iteration heads.
    tickers: Vec<SpawnHandle>,
    /// The failure it is restarting from.
    pending: Option<PendingRestart>,
    restart_delay_ms: u64,
}

/// What the supervisor knows of one node (subtask).
struct Node {
    region: usize,
    /// The generation of its running actor.
    generation: Generation,
    /// Where to inject controls; `None` while its region is not running.
    inject: Option<Recipient<Inject<Control>>>,
}

/// A triggered checkpoint's figures and span, until it is persisted or
/// aborted.
struct Tracked {
    triggered_at: Instant,
    /// The longest alignment acked so far.
    alignment_max_us: u64,
    span: tracing::Span,
}

pub(crate) struct Supervisor {
    name: String,
    plan: Arc<PhysicalPlan>,
    writer: WriterHandle,
    done: Option<mpsc::Sender<Outcome>>,
    span: tracing::Span,
    phase: Phase,
    regions: Vec<Region>,
    nodes: Vec<Node>,
    /// Operator index by name, to find a failure report's node.
    operator_index: HashMap<String, usize>,
    /// The newest generation handed out to a region.
    newest_generation: Generation,
    /// The decisions about checkpoints and failures (see `machine`).
    machine: SupervisorMachine<PendingPart>,
    /// The failure report being handed to the machine, for the command
    /// it causes (see `on_failure_report`).
    failure_in_hand: Option<FailureReport>,
    clock: Instant,
    timer: Option<SpawnHandle>,
    /// Triggered checkpoints not yet persisted or aborted. Those still with
    /// the writer survive a failure, so a checkpoint that becomes durable
    /// after a failure still reports its real duration.
    tracked: HashMap<CheckpointId, Tracked>,
    restarts: RestartTracker,
    /// The store error of the persist failure being handed to the
    /// machine, for the restart it may cause (see `on_persisted`).
    persist_failure: Option<(CheckpointId, StoreError)>,
    report: JobReport,
    /// What [`RunningJob::status`] shows.
    status: Arc<Mutex<JobStatus>>,
    /// Snapshots that are not checkpoints (see `snapshots.rs`).
    snapshots: snapshots::Snapshots,
    /// Where each region's sources stand, for the restart strategy.
    positions: positions::SourcePositions,
}

/// What the supervisor talks through: the writer thread, the waiting
/// caller, its tracing span and the status record.
struct Links {
    writer: WriterHandle,
    done: mpsc::Sender<Outcome>,
    span: tracing::Span,
    status: Arc<Mutex<JobStatus>>,
}

/// The machine's configuration for a plan.
fn machine_config(plan: &PhysicalPlan) -> MachineConfig {
    let (_, nodes) = plan_regions(plan);
    let config = &plan.config;
    MachineConfig {
        interval_ms: config.checkpoint_interval_ms,
        min_pause_ms: config.min_pause_ms,
        max_concurrent: config.max_concurrent_checkpoints,
        timeout_ms: config.checkpoint_timeout_ms,
        tolerable_failures: config.tolerable_checkpoint_failures,
        region_of: nodes.iter().map(|node| node.region).collect(),
        initiators: plan.snapshot.initiators.clone(),
    }
}

impl Supervisor {
    fn new(
        name: String,
        plan: PhysicalPlan,
        machine: SupervisorMachine<PendingPart>,
        links: Links,
        restarts: RestartTracker,
    ) -> Supervisor {
        let Links {
            writer,
            done,
            span,
            status,
        } = links;
        let report = JobReport {
            guarantee: Guarantee::ExactlyOnce,
            guarantee_reasons: Vec::new(),
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
            subsumed_checkpoints: Vec::new(),
            restarts: Vec::new(),
            resumed_from: None,
            savepoint: None,
            fallbacks: Vec::new(),
            already_finished: false,
        };
        let (regions, nodes) = plan_regions(&plan);
        let region_of: Vec<usize> = nodes.iter().map(|node| node.region).collect();
        let positions = positions::SourcePositions::new(&plan, &region_of, regions.len());
        let operator_index = plan
            .operators
            .iter()
            .enumerate()
            .map(|(index, operator)| (operator.name.clone(), index))
            .collect();
        Supervisor {
            name,
            plan: Arc::new(plan),
            writer,
            done: Some(done),
            span,
            phase: Phase::Loading,
            regions,
            nodes,
            operator_index,
            newest_generation: Generation(1),
            machine,
            failure_in_hand: None,
            clock: Instant::now(),
            timer: None,
            tracked: HashMap::new(),
            restarts,
            persist_failure: None,
            report,
            status,
            snapshots: snapshots::Snapshots::default(),
            positions,
        }
    }

    /// Updates what [`RunningJob::status`] shows.
    fn update_status(&self, change: impl FnOnce(&mut JobStatus)) {
        change(&mut lock_status(&self.status));
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.clock.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn on_node_event(&mut self, event: NodeEvent, context: &mut Context<Self>) {
        let node = event.node;
        let Some(state) = self.nodes.get(node) else {
            return;
        };
        if self.phase != Phase::Running
            || state.generation != event.generation
            || self.regions[state.region].phase != RegionPhase::Running
        {
            return;
        }
        let generation = event.generation;
        let machine_event = match event.kind {
            NodeEventKind::Ack {
                checkpoint,
                part,
                alignment_us,
            } => {
                if let Some(tracked) = self.tracked.get_mut(&checkpoint) {
                    tracked.alignment_max_us = tracked.alignment_max_us.max(alignment_us);
                }
                // A part encoded off the actor thread has no size yet:
                // 0 until the writer has encoded it (only the
                // checkpoint's total is known, once durable).
                let size_bytes = part.known_len().unwrap_or(0);
                self.metrics_acked(checkpoint, node, alignment_us, size_bytes as usize);
                // A stale ack's part is simply dropped by the machine:
                // parts live in memory until the writer persists a
                // completed checkpoint.
                Event::Ack {
                    node,
                    generation,
                    checkpoint,
                    part,
                }
            }
            NodeEventKind::Decline { checkpoint, reason } => Event::Decline {
                node,
                generation,
                checkpoint,
                reason,
            },
            NodeEventKind::InputsEnded => {
                self.on_inputs_ended(node, context);
                Event::InputsEnded { node, generation }
            }
            NodeEventKind::SnapshotStarted {
                snapshot,
                reply,
                declined,
            } => return self.on_snapshot_started(node, snapshot, reply, declined, context),
            NodeEventKind::SnapshotPart {
                snapshot,
                part,
                activity,
            } => return self.on_snapshot_part(node, snapshot, part, activity, context),
            NodeEventKind::SnapshotDeclined {
                snapshot,
                max_concurrent,
            } => return self.on_snapshot_declined(node, snapshot, max_concurrent, context),
            NodeEventKind::Committed { checkpoint } => Event::Committed {
                node,
                generation,
                checkpoint,
            },
        };
        self.feed(machine_event, context);
    }

    /// The shell's part of a subtask's end of input: the clock or the
    /// snapshots that end an iteration (the machine triggers it directly
    /// from now on).
    fn on_inputs_ended(&mut self, node: usize, context: &mut Context<Self>) {
        let Some(inject) = self.nodes[node].inject.clone() else {
            return;
        };
        if self.plan.is_quiescent_loop_head(node) {
            // A snapshot, not a clock, decides when this loop ends.
            self.watch_loop(node, context);
        } else if let Some(idle_ms) = self.plan.is_loop_head(node) {
            // The head decides when its loop is idle; it needs a clock,
            // which the supervisor's ticks give it.
            let ticks = inject.clone();
            let period = Duration::from_millis((idle_ms / 4).max(1));
            let ticker = context.run_interval(period, move |_, _| {
                ticks.do_send(Inject(Control::Tick));
            });
            let region = self.nodes[node].region;
            self.regions[region].tickers.push(ticker);
        }
    }

    fn on_stop(&mut self, savepoint: bool, context: &mut Context<Self>) {
        if self.phase == Phase::Done {
            return;
        }
        self.feed(Event::StopRequested { savepoint }, context);
    }

    fn final_report(&mut self) -> JobReport {
        for region in 0..self.regions.len() {
            self.fold_stats(region);
        }
        let mut report = self.report.clone();
        if self.plan.config.mode == crate::protocol::SnapshotMode::AtLeastOnce {
            report.guarantee = Guarantee::AtLeastOnce;
            report
                .guarantee_reasons
                .push(GuaranteeReason::AtLeastOnceMode);
        }
        for (operator, planned) in report.operators.iter_mut().zip(&self.plan.operators) {
            let counters = &planned.counters;
            operator.records_in = counters
                .records_in
                .load(std::sync::atomic::Ordering::Relaxed);
            operator.records_out = counters
                .records_out
                .load(std::sync::atomic::Ordering::Relaxed);
            operator.late_records_dropped = counters
                .late_dropped
                .load(std::sync::atomic::Ordering::Relaxed);
            operator.watermark_regressions = counters
                .watermark_regressions
                .load(std::sync::atomic::Ordering::Relaxed);
            operator.records_dropped = counters
                .records_dropped
                .load(std::sync::atomic::Ordering::Relaxed);
            if counters
                .at_least_once
                .load(std::sync::atomic::Ordering::Relaxed)
            {
                report.guarantee = Guarantee::AtLeastOnce;
                let plan = &self.plan;
                let is_source = !plan.edges.iter().any(|edge| edge.to == planned.first_node);
                let reason = GuaranteeReason::connector(&planned.name, is_source);
                report.guarantee_reasons.push(reason);
            }
        }
        report
    }

    fn finish(&mut self, result: Result<JobReport, JobError>, context: &mut Context<Self>) {
        self.phase = Phase::Done;
        self.update_status(|status| status.ended = true);
        if let Some(timer) = self.timer.take() {
            context.cancel_future(timer);
        }
        let mut pools = Vec::new();
        for region in 0..self.regions.len() {
            self.fold_stats(region);
            let state = &mut self.regions[region];
            for ticker in state.tickers.drain(..) {
                context.cancel_future(ticker);
            }
            pools.extend(state.pool.take());
        }
        if let Some(done) = self.done.take() {
            let span = self.span.clone();
            let _entered = span.enter();
            tracing::info!(job = %self.name, ok = result.is_ok(), "job finished");
            // The receiver waits in `run`; if it is gone nobody needs the
            // result.
            let _ = done.send((result, pools));
        }
        context.stop();
    }
}

/// The status record; a panic while it was held left it consistent (each
/// update is one assignment), so a poisoned lock is still usable.
fn lock_status(status: &Mutex<JobStatus>) -> std::sync::MutexGuard<'_, JobStatus> {
    status
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, context: &mut Context<Self>) {
        self.request_load(None, context);
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
        self.on_failure_report(report, context);
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
        self.on_loaded(loaded, context);
    }
}

impl Handler<PoolStopped> for Supervisor {
    type Result = ();

    fn handle(&mut self, stopped: PoolStopped, context: &mut Context<Self>) {
        self.on_pool_stopped(stopped, context);
    }
}

impl Handler<snapshots::TakeSnapshot> for Supervisor {
    type Result = ();

    fn handle(&mut self, request: snapshots::TakeSnapshot, context: &mut Context<Self>) {
        self.on_take_snapshot(request, context);
    }
}

impl Handler<snapshots::DetectStuck> for Supervisor {
    type Result = ();

    fn handle(&mut self, detect: snapshots::DetectStuck, context: &mut Context<Self>) {
        self.on_detect_stuck(detect.0, context);
    }
}

impl Handler<Stop> for Supervisor {
    type Result = ();

    fn handle(&mut self, stop: Stop, context: &mut Context<Self>) {
        self.on_stop(stop.savepoint, context);
    }
}
