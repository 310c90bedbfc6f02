//! Live metrics of a running job: what each operator instance processed,
//! how busy, idle and backpressured it was, how full each channel is, the
//! watermarks, the checkpoint history with Flink's figures, restarts and
//! failures.
//!
//! This module owns the registry ([`MetricsRegistry`]), the per-subtask
//! cells the actors write ([`SubtaskCell`], through a
//! [`SubtaskRecorder`] that adds to the cell once per slice of work) and
//! the typed snapshot ([`JobMetrics`]) that
//! [`RunningJob::metrics`](crate::job::RunningJob::metrics) returns. It
//! never owns an actor, never decides anything about the job, and never
//! takes a lock on the record path: a subtask writes atomics of its own
//! cell; the `dashmap`s are written when a generation starts and read by
//! snapshots; the history's mutex is taken once per checkpoint or restart.
//!
//! Known gaps: bytes in and out are not counted (records are not
//! serialized between operators, so their size is not known cheaply);
//! only sources that store their position as one index show it as a
//! number, and no source reports a lag yet.
//!
//! ```
//! use snapflow::job::{Job, JobConfig};
//! use snapflow::sink::CollectHandle;
//! use snapflow::source::VecSourceFactory;
//!
//! let job = Job::new("doc", JobConfig::default());
//! let output = CollectHandle::new();
//! job.source("numbers", VecSourceFactory::new((0..1000_u64).collect()))
//!     .sink("collect", output.clone());
//! let running = job.start()?;
//! let metrics = running.metrics();
//! assert_eq!(metrics.operators.len(), 2);
//! running.wait()?;
//! # Ok::<(), snapflow::job::JobError>(())
//! ```

mod cell;
mod progress;
mod registry;
mod snapshot;

pub use cell::{SubtaskCell, SubtaskRecorder};
pub use progress::{progress_line, Progress};
pub(crate) use registry::OperatorInfo;
pub use registry::{MetricsRegistry, QueueProbe, CHECKPOINT_HISTORY_MAX, RESTART_HISTORY_MAX};
pub use snapshot::{
    ChannelMetrics, CheckpointMetrics, CheckpointStatus, EdgeMetrics, JobMetrics, OperatorKind,
    OperatorMetrics, RestartMetrics, SubtaskCheckpoint, SubtaskMetrics,
};
