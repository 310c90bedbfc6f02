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
//! Bytes are counted where Flink counts them, at a serialization
//! boundary, which in one process is the job's edge: a source counts the
//! bytes it reads from outside ([`Source::figures`](crate::source::Source::figures):
//! the file source its lines with their endings, the Kafka source each
//! message's key, value and headers) and a sink the bytes it writes out
//! ([`Sink::bytes_written`](crate::sink::Sink::bytes_written): the file
//! sink's encoded lines, the Kafka sink's keys, values and headers).
//! Records pass between operators in memory, unserialized, as between
//! Flink's chained operators, so an operator in between shows no bytes
//! (`None`), not an estimate. The shells ask the connector once per slice
//! of work and add the difference to the cell (`connector.rs`). Sources
//! that know their lag report it (Flink's `pendingRecords` and
//! `pendingBytes`): the Kafka source per partition from the high
//! watermark a thread of its own asks the broker for once a second (off
//! the actor), the file source the bytes left in its split, the in-memory
//! sources the records left; and each split's position as a number,
//! copied at most once a second.
//!
//! Known gaps: the PostgreSQL and print sinks count no bytes (a row's
//! parameters have no size until the client encodes them); the Kafka lag
//! counts offsets (transaction markers and aborted records included,
//! markers past the consumer's position only), and trusts the high
//! watermark the broker sends; offsets above 2^53 lose precision in the
//! Prometheus gauges (floats).
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
mod connector;
mod progress;
mod registry;
mod snapshot;

pub use cell::{SubtaskCell, SubtaskRecorder};
pub(crate) use connector::{BytesSeen, SourceMeter};
pub use progress::{progress_line, Progress};
pub(crate) use registry::OperatorInfo;
pub use registry::{MetricsRegistry, QueueProbe, CHECKPOINT_HISTORY_MAX, RESTART_HISTORY_MAX};
pub use snapshot::{
    ChannelMetrics, CheckpointMetrics, CheckpointStatus, EdgeMetrics, JobMetrics, OperatorKind,
    OperatorMetrics, RestartMetrics, SubtaskCheckpoint, SubtaskMetrics,
};
