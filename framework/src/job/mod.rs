//! The job layer: a typed builder for a streaming job, and the machinery
//! that runs it end to end with checkpoints and exactly-once recovery.
//!
//! This module owns the user's vocabulary for a job ([`Job`], [`JobConfig`],
//! [`Stream`], [`KeyedStream`], [`Collector`], the [`Operator`] and
//! [`Aggregator`] traits; sources and sinks are the
//! [`crate::source::SourceFactory`] and [`crate::sink::SinkFactory`] of
//! their own modules), the translation of the logical graph into a graph of subtasks
//! with channels and partitioners, the operator shells that drive one
//! protocol [`NodeMachine`](crate::protocol::NodeMachine) per subtask, and
//! the supervisor actor that drives the
//! [`Coordinator`](crate::protocol::Coordinator), persists checkpoints off
//! the actor threads, detects failures and restarts the failed region from
//! the last completed checkpoint. It never decides a protocol question (the protocol
//! machines do), never formats bytes on disk (the store does) and never
//! moves a record by itself (the runtime's channels do).
//!
//! A failure restarts only its failover region: the connected part of the
//! graph of subtasks that holds the failed subtask (every channel connects
//! its ends, feedback edges included; a shuffle joins every subtask of both
//! operators, a forward edge only its lane). Independent pipelines of one
//! job keep running. Checkpoints stay global: one id space and one
//! metadata file with every region's parts.
//!
//! Known gaps: while a region restarts no checkpoint is taken (a global
//! checkpoint needs every subtask), so the other regions keep processing
//! but commit no new output until it runs again; each region has its own
//! arbiter pool (at most `arbiters` threads, never more than its subtasks,
//! plus one system thread); subtasks whose input ended stay alive and ack
//! later checkpoints with their final state until the job ends; too many
//! checkpoint failures in a row restart every region and report one
//! restart per region; a checkpoint that fails to persist after its
//! coordinator was replaced by a restart is reported but not counted; a
//! loop ends by an idle timeout (records fed back after it are dropped);
//! only keyed and stateless operators can change parallelism on restore;
//! operators are not chained, so every operator instance is its own actor.
//!
//! ```
//! use snapflow::job::{Job, JobConfig};
//! use snapflow::sink::CollectHandle;
//! use snapflow::source::VecSourceFactory;
//!
//! #[derive(snapflow::Snapshot, Default, Clone, Debug)]
//! struct Count {
//!     seen: u64,
//! }
//!
//! let job = Job::new("doc", JobConfig { checkpoint_interval_ms: Some(20), ..JobConfig::default() });
//! let output = CollectHandle::new();
//! job.source("numbers", VecSourceFactory::new((0..100_u64).collect()))
//!     .map("tenths", |n| n / 10)
//!     .key_by(|n: &u64| *n)
//!     .process("count", |key: &u64, state: &mut Count, _n: u64, out| {
//!         state.seen += 1;
//!         out.emit((*key, state.seen));
//!         Ok(())
//!     })
//!     .sink("collect", output.clone());
//! let report = job.run()?;
//! let mut counts = output.committed();
//! counts.sort();
//! assert_eq!(counts.len(), 100);
//! assert!(counts.contains(&(9, 10)));
//! assert_eq!(report.operator("count").map(|op| op.records_in), Some(100));
//! # Ok::<(), snapflow::job::JobError>(())
//! ```

mod incremental;
pub mod inspect;
mod operator;
mod ops;
mod physical;
mod recovery;
mod region;
mod report;
mod restore_check;
mod route;
mod shell;
pub mod snapshots;
mod stream;
mod supervisor;
pub(crate) mod timed_layout;
mod writer;

pub use crate::keyed::{KeyedBackend, DEFAULT_COPY_ON_WRITE_THRESHOLD_KEYS};
use crate::watermark::{Clock, SystemClock};
use std::path::Path;
use std::sync::Arc;

use crate::protocol::{CoordinatorConfigError, GraphError, SnapshotMode};
use crate::restart::RestartConfigError;
use crate::runtime::failure::FailureReport;
use crate::runtime::RuntimeError;
use crate::sink::SinkError;
use crate::storage::{CheckpointStore, FsCheckpointStore, StoreError};

pub use crate::restart::RestartStrategy;
pub use incremental::{IncrementalCheckpoints, DEFAULT_FULL_EVERY};
pub use operator::{Aggregator, Operator, OperatorContext};
pub use ops::Key;
pub use report::{
    CheckpointReport, FailedCheckpoint, FallbackReport, GuaranteeReason, JobReport, JobStatus,
    OperatorReport, RestartReport,
};
pub use route::Collector;
#[cfg(test)]
pub(crate) use route::Router;
#[cfg(test)]
pub(crate) use shell::Control;
pub use shell::Data;
// For `crate::time`'s timed keyed core, which plugs into the shells.
#[cfg(test)]
pub(crate) use incremental::tests::Written as WrittenShared;
pub(crate) use incremental::{
    full_segments, push_own, KeyGroupLedger, KeyedSnapshotParts, KeyedSnapshotSlices, SnapshotPlan,
};
pub(crate) use ops::{decode_keyed_state, encode_keyed_state, merge_keyed_states};
pub(crate) use physical::CoreFactory;
pub(crate) use shell::Core;
pub(crate) use shell::{DeferredState, TakenState};
pub use stream::{Feedback, Job, KeyedStateHandle, KeyedStream, SinkHandle, Stream};
pub use supervisor::{RunningJob, StuckDetection};

/// How a job runs: checkpoints, snapshot mode, store, restarts, parallelism
/// and transport tuning.
#[derive(Debug, Clone)]
pub struct JobConfig {
    /// Time between periodic checkpoints; positive. `None` disables them
    /// (the final checkpoint at the end of a bounded job still happens),
    /// except with a [`JobConfig::store`]: a job given a place for its
    /// checkpoints means to recover from them, so it then checkpoints
    /// every [`DEFAULT_CHECKPOINT_INTERVAL_MS`] and says so at start.
    pub checkpoint_interval_ms: Option<u64>,
    /// A checkpoint not complete after this long is aborted as a failure.
    pub checkpoint_timeout_ms: u64,
    /// Minimum time between the end of one checkpoint and the next.
    pub min_pause_ms: u64,
    /// How many checkpoints may be in flight at once.
    pub max_concurrent_checkpoints: usize,
    /// How many checkpoint failures in a row are tolerated before the job
    /// restarts (every failover region, through the restart strategy). A
    /// failure is a checkpoint that timed out, was declined, or could not
    /// be persisted by the store; a checkpoint that becomes durable resets
    /// the count. When the strategy gives up after a persist failure the
    /// job ends with [`JobError::CheckpointPersistFailed`], which carries
    /// the store's error.
    pub tolerable_checkpoint_failures: u32,
    /// The snapshot algorithm: aligned (default), unaligned or
    /// at-least-once. With iterations, aligned means
    /// [`SnapshotMode::Cyclic`]: forward edges aligned, feedback edges
    /// recorded.
    pub mode: SnapshotMode,
    /// Where checkpoints go; `None` means a fresh in-memory store per run.
    pub store: Option<Arc<dyn CheckpointStore>>,
    /// What to do when the job fails (default: Flink's exponential
    /// backoff from 1 s, never giving up).
    pub restart: RestartStrategy,
    /// The parallelism of operators that do not set their own.
    pub default_parallelism: usize,
    /// The number of key groups (Flink's max parallelism): the upper bound
    /// of any keyed operator's parallelism.
    pub max_parallelism: u32,
    /// A batch closes at this many records.
    pub batch_size_max: usize,
    /// A batch closes this long after its first record.
    pub batch_linger_ms: u64,
    /// Batches in flight per channel (the backpressure window).
    pub window_batches: usize,
    /// Arbiter threads for operators; `None` means one per core.
    pub arbiters: Option<usize>,
    /// Run even when falling back past a damaged checkpoint replays output
    /// a sink has already committed. Off by default: the job then fails
    /// at start with [`JobError::FallbackWouldDuplicate`]. On, it runs,
    /// the committed output of the skipped checkpoints appears twice, and
    /// the report's guarantee is at-least-once with
    /// [`GuaranteeReason::FallbackReplaysCommittedOutput`].
    pub accept_duplicates_after_fallback: bool,
    /// The job's processing time: what processing-time timers and
    /// windows read. The system clock by default; tests give a
    /// [`ManualClock`](crate::time::ManualClock) and move it.
    pub clock: Arc<dyn Clock>,
    /// How often an operator with processing-time timers checks its
    /// clock (positive; 0 counts as 1). Operators without them have no
    /// tick at all. Default 10 ms.
    pub processing_time_tick_ms: u64,
    /// Whether every operator instance records its live figures (records
    /// in and out, busy and backpressured time, watermarks; see
    /// [`crate::metrics`]). On by default; it costs two clock reads and a
    /// few uncontended atomic additions per slice of about 32 batches.
    /// Off, [`RunningJob::metrics`] still shows the graph, the checkpoint
    /// history and the restarts.
    pub metrics: bool,
    /// Where the job serves its metrics, JSON API and dashboard over HTTP
    /// (cargo feature `http`, see `snapflow::http`); `None` (the
    /// default): no server. [`DEFAULT_HTTP_ADDR`] is loopback, so only
    /// this machine can connect; port 0 picks a free port
    /// ([`RunningJob::http_addr`] tells which). Without the feature, an
    /// address is refused with [`JobError::InvalidConfig`].
    pub http_addr: Option<std::net::SocketAddr>,
    /// Whether the HTTP server may act on the job (trigger a savepoint,
    /// stop with a savepoint, cancel). Off by default: those routes then
    /// answer 403.
    pub http_actions: bool,
    /// Whether keyed operators (`process`, `reduce`, `aggregate`) write
    /// only the key groups that changed since their last completed
    /// checkpoint, and how often one is full. On by default; savepoints
    /// are always full and self-contained.
    pub incremental_checkpoints: IncrementalCheckpoints,
    /// Where keyed operators (`process`, `reduce`, `aggregate`) keep their
    /// per-key state: in memory (the default) or, with cargo feature
    /// `spill`, spilling to local disk beyond a number of keys per subtask
    /// ([`KeyedBackend::Spilling`]). Both write the same checkpoints, so a
    /// job may change backend between a checkpoint and its restore.
    pub keyed_backend: KeyedBackend,
    /// From how many keys a subtask of a keyed operator with the in-memory
    /// backend keeps its state in copy-on-write key groups, whose
    /// checkpoints take constant time per key group on the operator's
    /// thread and are encoded by the checkpoint writer (asynchronous
    /// snapshots), instead of one flat table, whose lookups are faster
    /// and whose checkpoints encode on the operator's thread. The state
    /// moves once, between batches, when it reaches this many keys (and a
    /// restore of at least this many goes straight to it); 0 makes every
    /// subtask copy-on-write from the start. Default
    /// [`DEFAULT_COPY_ON_WRITE_THRESHOLD_KEYS`] (see `keyed/store.rs` for
    /// why). The timed keyed operators (windows, timers) always keep the
    /// flat table.
    pub copy_on_write_threshold_keys: usize,
}

/// The loopback address and port a job's HTTP server is usually given
/// ([`JobConfig::http_addr`]): `127.0.0.1:8081`, Flink's web UI port.
pub const DEFAULT_HTTP_ADDR: std::net::SocketAddr = std::net::SocketAddr::V4(
    std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 8081),
);

/// The checkpoint interval of a job that has a [`JobConfig::store`] but no
/// [`JobConfig::checkpoint_interval_ms`]: 10 s, a common choice for
/// Flink jobs and Arroyo's default, short enough that a restart replays
/// little, long enough that checkpoints cost little.
pub const DEFAULT_CHECKPOINT_INTERVAL_MS: u64 = 10_000;

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            checkpoint_interval_ms: None,
            checkpoint_timeout_ms: 60_000,
            min_pause_ms: 0,
            max_concurrent_checkpoints: 1,
            tolerable_checkpoint_failures: 0,
            mode: SnapshotMode::Aligned,
            store: None,
            restart: RestartStrategy::default(),
            default_parallelism: 1,
            max_parallelism: 128,
            batch_size_max: 1024,
            batch_linger_ms: 5,
            window_batches: 8,
            arbiters: None,
            accept_duplicates_after_fallback: false,
            clock: Arc::new(SystemClock),
            processing_time_tick_ms: 10,
            metrics: true,
            http_addr: None,
            http_actions: false,
            incremental_checkpoints: IncrementalCheckpoints::default(),
            keyed_backend: KeyedBackend::Memory,
            copy_on_write_threshold_keys: DEFAULT_COPY_ON_WRITE_THRESHOLD_KEYS,
        }
    }
}

impl JobConfig {
    /// Sets [`JobConfig::copy_on_write_threshold_keys`].
    pub fn with_copy_on_write_threshold_keys(mut self, keys: usize) -> Self {
        self.copy_on_write_threshold_keys = keys;
        self
    }

    /// Sets [`JobConfig::keyed_backend`].
    pub fn with_keyed_backend(mut self, backend: KeyedBackend) -> Self {
        self.keyed_backend = backend;
        self
    }

    /// Uses a file-system store under `root` for job `job`.
    pub fn with_store_dir(mut self, root: impl AsRef<Path>, job: &str) -> Result<Self, JobError> {
        self.store = Some(Arc::new(FsCheckpointStore::open(root, job)?));
        Ok(self)
    }

    /// Uses the store at `location` for job `job`: object storage for
    /// `s3://bucket/prefix` (feature `s3`; endpoint and credentials from
    /// the `AWS_*` variables, see
    /// [`ObjectCheckpointStore::open`](crate::storage::ObjectCheckpointStore::open)),
    /// else a file-system store under the directory `location`.
    ///
    /// # Errors
    ///
    /// Those of opening the store; for an `s3://` location in a build
    /// without the `s3` feature, [`StoreError::InvalidOptions`].
    pub fn with_store_location(mut self, location: &str, job: &str) -> Result<Self, JobError> {
        if location.starts_with("s3://") {
            self.store = Some(open_object_store(location, job)?);
            return Ok(self);
        }
        self.with_store_dir(location, job)
    }
}

#[cfg(feature = "s3")]
fn open_object_store(location: &str, job: &str) -> Result<Arc<dyn CheckpointStore>, StoreError> {
    Ok(Arc::new(crate::storage::ObjectCheckpointStore::open(
        location, job,
    )?))
}

#[cfg(not(feature = "s3"))]
fn open_object_store(location: &str, _job: &str) -> Result<Arc<dyn CheckpointStore>, StoreError> {
    Err(StoreError::InvalidOptions(format!(
        "{location} is on object storage, and this build has no `s3` feature"
    )))
}

/// Why a job could not be built or did not finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    /// Two operators have the same name.
    #[error("two operators are named `{name}`; operator names must be unique in a job")]
    DuplicateName {
        /// The name.
        name: String,
    },
    /// An operator name cannot be used in checkpoints.
    #[error("operator name `{name}` is not valid: {reason}")]
    InvalidName {
        /// The name.
        name: String,
        /// Why.
        reason: String,
    },
    /// An operator's parallelism is 0 or above the job's max parallelism.
    #[error("operator `{operator}` has parallelism {parallelism}; it must be in 1..={max}")]
    BadParallelism {
        /// The operator.
        operator: String,
        /// Its parallelism.
        parallelism: usize,
        /// The job's max parallelism.
        max: u32,
    },
    /// `.parallelism(n)` on a stream that several operators produce (a union).
    #[error("parallelism set on a union stream; set it on each input instead")]
    ParallelismOnUnion,
    /// [`Stream::assign_timestamps`] on a stream that is not a source's
    /// own output: watermarks are generated per split, in the source.
    #[error("assign_timestamps must follow a source directly; `{operator}` is not one")]
    TimestampsNotAtSource {
        /// The operator that produces the stream.
        operator: String,
    },
    /// An iteration was opened with [`Stream::iterate`] and never closed.
    #[error("iteration `{name}` is never closed with close_loop")]
    LoopNotClosed {
        /// The iteration head's name.
        name: String,
    },
    /// A loop that is not one iteration closed on a stream derived from its
    /// head (for example closed with an unrelated stream).
    #[error("a feedback edge does not close a loop through its iteration head")]
    UnsupportedLoop,
    /// The checkpoint to restore was written with another max parallelism
    /// (number of key groups), which is fixed for a job's life.
    #[error("the checkpoint has {stored} key groups, the job is configured with {configured}")]
    MaxParallelismChanged {
        /// In the checkpoint.
        stored: u32,
        /// In the job's configuration.
        configured: u32,
    },
    /// The checkpoint to restore holds state of an operator the job no
    /// longer has (by name): restoring would drop that state silently,
    /// so the job refuses, as Flink does without
    /// `--allowNonRestoredState`. Nothing ran. A stateless operator that
    /// was removed is no reason (it has no state to lose).
    #[error(
        "checkpoint {checkpoint} holds state of operator `{operator}`, which the job no longer \
         has; restoring would drop that state. Nothing ran. Give the job that operator back \
         under the same name, or start the changed job on a new store"
    )]
    OperatorStateNotRestored {
        /// The operator the checkpoint has and the job does not.
        operator: String,
        /// The checkpoint.
        checkpoint: u64,
    },
    /// An operator's parallelism changed and its state cannot follow.
    #[error("operator `{operator}` cannot change its parallelism on restore: {reason}")]
    RescaleUnsupported {
        /// The operator.
        operator: String,
        /// Why.
        reason: String,
    },
    /// An edge chosen with [`Stream::forward`] joins operators of
    /// different parallelisms.
    #[error(
        "forward edge from `{from}` (parallelism {from_parallelism}) to `{to}` \
         (parallelism {to_parallelism}) needs equal parallelisms"
    )]
    ForwardParallelismMismatch {
        /// The upstream operator.
        from: String,
        /// The downstream operator.
        to: String,
        /// The upstream parallelism.
        from_parallelism: usize,
        /// The downstream parallelism.
        to_parallelism: usize,
    },
    /// A union or a loop joins streams of two different jobs.
    #[error("a union or loop joins streams of two different jobs")]
    MixedJobs,
    /// The job has no operators.
    #[error("the job has no operators")]
    EmptyJob,
    /// The configuration is unusable.
    #[error("invalid job configuration: {0}")]
    InvalidConfig(String),
    /// The graph cannot be checkpointed in the chosen mode.
    #[error("graph: {0}")]
    Graph(#[from] GraphError),
    /// The restart strategy is unusable.
    #[error("restart strategy: {0}")]
    Restart(#[from] RestartConfigError),
    /// The checkpoint schedule is unusable.
    #[error("checkpoint coordinator: {0}")]
    Coordinator(#[from] CoordinatorConfigError),
    /// The runtime could not start threads or actors.
    #[error("runtime: {0}")]
    Runtime(#[from] RuntimeError),
    /// The checkpoint store failed (loading a checkpoint to restore).
    #[error("checkpoint store: {0}")]
    Store(#[from] StoreError),
    /// The restart strategy gave up; `cause` is the last failure.
    #[error("job failed after {restarts} restarts ({reason}); last failure: {cause}")]
    RestartsExhausted {
        /// How many restarts happened.
        restarts: u32,
        /// Why the strategy gave up.
        reason: String,
        /// The root cause: operator, subtask, generation, kind and
        /// message of the failure, and the checkpoint in flight.
        cause: String,
    },
    /// More checkpoints failed in a row than
    /// [`JobConfig::tolerable_checkpoint_failures`], the last of them
    /// because the store could not persist it, and the restart strategy
    /// gave up. `error` is the store's error (the root cause).
    #[error(
        "job failed after {restarts} restarts ({reason}): {consecutive_failures} checkpoints \
         failed in a row, more than tolerated; checkpoint {checkpoint} could not be persisted: {error}"
    )]
    CheckpointPersistFailed {
        /// The checkpoint that could not be persisted.
        checkpoint: u64,
        /// How many checkpoints failed in a row, this one included.
        consecutive_failures: u32,
        /// How many restarts happened before.
        restarts: u32,
        /// Why the restart strategy gave up.
        reason: String,
        /// The store's error.
        #[source]
        error: StoreError,
    },
    /// Loading fell back past damaged checkpoints (or started from none)
    /// to a checkpoint older than output a sink has already committed, so
    /// running would write that output a second time. Nothing ran.
    #[error(
        "restoring {} would write again output that sink `{sink}` (subtask {subtask}) already \
         committed ({}){}. Nothing ran. To run anyway and accept the duplicates (the report \
         then says at-least-once), set JobConfig::accept_duplicates_after_fallback; or put the \
         damaged checkpoint back from a backup; or remove that output from the sink first.",
        restored.map_or("no checkpoint (a start from the beginning)".to_string(), |id| format!("checkpoint {id}")),
        report::describe_ids(committed),
        describe_skipped(skipped)
    )]
    FallbackWouldDuplicate {
        /// The checkpoint that would be restored (`None`: none).
        restored: Option<u64>,
        /// The sink operator.
        sink: String,
        /// The sink's subtask.
        subtask: usize,
        /// The checkpoints after `restored` whose output the sink made
        /// visible (empty: the sink cannot tell, and a fallback happened).
        committed: Vec<u64>,
        /// The damaged checkpoints skipped on the way (this load's and
        /// those set aside before).
        skipped: Vec<u64>,
    },
    /// A failure that retrying cannot fix (its error says
    /// `is_retryable() == false`: a schema or version mismatch on
    /// restore, output that would be overwritten, a missing transaction,
    /// a configuration error, or a user error marked
    /// [`NotRetryable`](crate::runtime::NotRetryable)). The job ends at
    /// once, under every restart strategy.
    #[error(
        "job failed with an error that retrying cannot fix (after {restarts} restarts): {cause}"
    )]
    NotRetryable {
        /// How many restarts happened before.
        restarts: u32,
        /// The failure: operator, subtask, generation, kind and message.
        cause: String,
        /// The failed operator instance.
        failure: FailureReport,
    },
    /// A sink refused the job's settings when it joined the job
    /// ([`SinkFactory::open`](crate::sink::SinkFactory::open)); nothing
    /// ran. Its error says what to change.
    #[error("sink `{sink}` cannot run in this job: {error}")]
    SinkConfig {
        /// The sink operator.
        sink: String,
        /// The sink's error.
        #[source]
        error: SinkError,
    },
    /// A sink could not be checked or restored before the job started.
    #[error("sink `{sink}` (subtask {subtask}) cannot restore: {error}")]
    SinkRestore {
        /// The sink operator.
        sink: String,
        /// The subtask.
        subtask: usize,
        /// The sink's error.
        #[source]
        error: SinkError,
    },
    /// The job had already finished (its newest checkpoint is its final
    /// one), and the final state of a keyed operator with a state handle
    /// in that checkpoint does not decode as the job now declares it.
    #[error(
        "the job already finished, but the final state of `{operator}` in checkpoint \
         {checkpoint} does not decode: {reason}"
    )]
    FinalStateUnreadable {
        /// The keyed operator.
        operator: String,
        /// The final checkpoint.
        checkpoint: u64,
        /// Why its part does not decode.
        reason: String,
    },
    /// The job was cancelled.
    #[error("the job was cancelled")]
    Cancelled,
    /// A bug in the job layer (wiring of mismatched types, a lost
    /// supervisor); never expected.
    #[error("internal error: {0}")]
    Internal(String),
}

impl JobError {
    /// Whether running the job again could succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            JobError::Runtime(error) => error.is_retryable(),
            JobError::Store(error) | JobError::CheckpointPersistFailed { error, .. } => {
                error.is_retryable()
            }
            JobError::SinkRestore { error, .. } => error.is_retryable(),
            _ => false,
        }
    }
}

fn describe_skipped(skipped: &[u64]) -> String {
    if skipped.is_empty() {
        return String::new();
    }
    let texts: Vec<String> = skipped.iter().map(u64::to_string).collect();
    format!(
        "; damaged checkpoint {} was skipped and set aside",
        texts.join(", ")
    )
}
