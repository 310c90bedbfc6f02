//! The typed, serializable view of a running job's metrics that
//! [`RunningJob::metrics`](crate::job::RunningJob::metrics) returns and the
//! HTTP server renders. Plain data: it never refers back to the job.

use serde::Serialize;

use crate::source::SplitPosition;

/// A snapshot of a running job's metrics.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct JobMetrics {
    /// The job's name.
    pub job: String,
    /// Milliseconds since the job started.
    pub uptime_ms: u64,
    /// Whether the per-subtask figures are collected
    /// ([`JobConfig::metrics`](crate::job::JobConfig::metrics)); without,
    /// every count and time below is 0, and checkpoints and restarts are
    /// still recorded.
    pub enabled: bool,
    /// The operators, in declaration order.
    pub operators: Vec<OperatorMetrics>,
    /// The logical edges between operators.
    pub edges: Vec<EdgeMetrics>,
    /// The physical channels of the running generations.
    pub channels: Vec<ChannelMetrics>,
    /// The newest checkpoints, oldest first (at most
    /// [`CHECKPOINT_HISTORY_MAX`](super::CHECKPOINT_HISTORY_MAX)).
    pub checkpoints: Vec<CheckpointMetrics>,
    /// Checkpoints completed since the start.
    pub checkpoints_completed: u64,
    /// Checkpoints failed, aborted or subsumed since the start (a
    /// subsumed one: see [`JobReport::subsumed_checkpoints`](crate::job::JobReport::subsumed_checkpoints)).
    pub checkpoints_failed: u64,
    /// The restarts, oldest first (at most
    /// [`RESTART_HISTORY_MAX`](super::RESTART_HISTORY_MAX)).
    pub restarts: Vec<RestartMetrics>,
    /// Restarts since the start.
    pub restarts_total: u64,
    /// The newest failure of an operator instance, as text.
    pub last_failure: Option<String>,
}

impl JobMetrics {
    /// The operator named `name`.
    pub fn operator(&self, name: &str) -> Option<&OperatorMetrics> {
        self.operators.iter().find(|operator| operator.name == name)
    }

    /// The newest completed checkpoint.
    pub fn last_completed_checkpoint(&self) -> Option<&CheckpointMetrics> {
        self.checkpoints
            .iter()
            .rev()
            .find(|checkpoint| checkpoint.status == CheckpointStatus::Completed)
    }
}

/// What an operator is in the graph.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OperatorKind {
    /// No inputs.
    Source,
    /// Inputs and outputs.
    Operator,
    /// No outputs.
    Sink,
}

/// One operator: its subtasks' figures and their sums.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OperatorMetrics {
    /// Its name.
    pub name: String,
    /// Source, operator or sink.
    pub kind: OperatorKind,
    /// Its parallelism.
    pub parallelism: usize,
    /// Per subtask, by subtask index.
    pub subtasks: Vec<SubtaskMetrics>,
    /// Records taken as input, summed over subtasks.
    pub records_in: u64,
    /// Records sent on outputs, summed over subtasks (a record sent on
    /// two channels, as a broadcast does, counts twice).
    pub records_out: u64,
    /// Input records per second, summed over subtasks.
    pub records_in_per_second: f64,
    /// Output records per second, summed over subtasks.
    pub records_out_per_second: f64,
    /// The largest backpressured time per second of any subtask (as
    /// Flink's graph shows an operator by its most backpressured subtask).
    pub backpressured_ms_per_second_max: f64,
    /// The largest busy time per second of any subtask.
    pub busy_ms_per_second_max: f64,
    /// The lowest output watermark of its subtasks, once each has one.
    pub watermark_ms: Option<u64>,
    /// Bytes read from outside the job, summed over the subtasks that
    /// count them (see [`SubtaskMetrics::bytes_in`]); `None` when none
    /// does.
    pub bytes_in: Option<u64>,
    /// Bytes written outside the job, summed over the subtasks that count
    /// them (see [`SubtaskMetrics::bytes_out`]).
    pub bytes_out: Option<u64>,
    /// Bytes read per second, summed over subtasks.
    pub bytes_in_per_second: f64,
    /// Bytes written per second, summed over subtasks.
    pub bytes_out_per_second: f64,
    /// A source's records not read yet, summed over the subtasks that
    /// know (Flink's `pendingRecords`).
    pub pending_records: Option<u64>,
    /// A source's bytes not read yet, summed over the subtasks that know
    /// (Flink's `pendingBytes`).
    pub pending_bytes: Option<u64>,
    /// Records a source dropped as bad, summed over its subtasks (see
    /// [`SubtaskMetrics::records_dropped`]); `None` for other operators.
    pub records_dropped: Option<u64>,
}

/// One operator instance's figures.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SubtaskMetrics {
    /// Its index.
    pub subtask: usize,
    /// Records taken as input (counted again when a restart replays them).
    pub records_in: u64,
    /// Batches taken as input.
    pub batches_in: u64,
    /// Records sent on its output channels.
    pub records_out: u64,
    /// Input records per second over the last sampling window (about 1 s).
    pub records_in_per_second: f64,
    /// Output records per second over the last sampling window.
    pub records_out_per_second: f64,
    /// Milliseconds per second spent processing (Flink's
    /// `busyTimeMsPerSecond`).
    pub busy_ms_per_second: f64,
    /// Milliseconds per second with nothing to do (the rest of the second).
    pub idle_ms_per_second: f64,
    /// Milliseconds per second waiting for credit on an output (Flink's
    /// `backPressuredTimeMsPerSecond`).
    pub backpressured_ms_per_second: f64,
    /// Total milliseconds spent processing.
    pub busy_ms: u64,
    /// Total milliseconds waiting for credit.
    pub backpressured_ms: u64,
    /// The watermark it sent on last, if event time is used.
    pub watermark_ms: Option<u64>,
    /// For a source: its position at the newest checkpoint.
    pub position: Option<String>,
    /// Bytes read from outside the job, over every generation, as Flink
    /// counts `numBytesIn` at a serialization boundary: a source's input
    /// (the file source: the lines with their endings; the Kafka source:
    /// each message's key, value and headers). `None` for an operator
    /// that reads nothing from outside: records pass between snapflow's
    /// operators in memory, unserialized, as between Flink's chained
    /// operators, so they have no size to count.
    pub bytes_in: Option<u64>,
    /// Bytes written outside the job, over every generation: a sink's
    /// output (the file sink: the encoded lines; the Kafka sink: each
    /// record's key, value and headers; the print sink: the lines its
    /// writer took; the PostgreSQL sink: the parameter values in
    /// PostgreSQL's binary encoding). `None` for a sink that does not
    /// count them (collect, a user's sink) and for every other operator.
    pub bytes_out: Option<u64>,
    /// Bytes read per second over the last sampling window.
    pub bytes_in_per_second: f64,
    /// Bytes written per second over the last sampling window.
    pub bytes_out_per_second: f64,
    /// For a source that knows: records not read yet, its lag (the Kafka
    /// source: high watermark minus next offset, summed over its
    /// partitions; in-memory sources: the records left).
    pub pending_records: Option<u64>,
    /// For a source that knows: bytes not read yet (the file source: its
    /// split's end minus its next line).
    pub pending_bytes: Option<u64>,
    /// For a source: the records it read and dropped because its user
    /// chose to skip them (the Kafka source's undecodable records with
    /// `BadRecords::Drop`), over every generation (replayed records are
    /// counted again); 0 for a source that dropped none, `None` for
    /// every other operator.
    pub records_dropped: Option<u64>,
    /// For a source that reports them: each split's position as a number
    /// (a Kafka partition's next offset, a file's byte offset), copied at
    /// most once a second while it runs and at its end.
    pub splits: Vec<SplitPosition>,
}

/// One logical edge.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct EdgeMetrics {
    /// The sending operator's name.
    pub from: String,
    /// The receiving operator's name.
    pub to: String,
    /// How records are spread: forward, rebalance, hash or broadcast.
    pub partition: String,
    /// Whether it closes a loop (a back edge).
    pub feedback: bool,
}

/// One physical channel and how full it is.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChannelMetrics {
    /// Its id in the generation.
    pub id: u64,
    /// The sending operator and subtask.
    pub from: (String, usize),
    /// The receiving operator and subtask.
    pub to: (String, usize),
    /// Batches sent and not yet processed.
    pub in_flight_batches: u64,
    /// The bound on them (`None`: unbounded, a back edge).
    pub window_batches: Option<u64>,
    /// `in_flight_batches / window_batches` (0 when unbounded).
    pub fill: f64,
    /// Records sent on it by its current generation.
    pub records_sent: u64,
}

/// Where a checkpoint is.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointStatus {
    /// Triggered, not yet durable.
    InProgress,
    /// Durable.
    Completed,
    /// Aborted, declined, timed out, not persisted, or subsumed by the
    /// final checkpoint (as Flink shows a subsumed one: failed, with the
    /// reason).
    Failed,
}

/// One checkpoint with Flink's figures.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CheckpointMetrics {
    /// Its id.
    pub id: u64,
    /// `checkpoint` or `savepoint`.
    pub kind: String,
    /// Where it is.
    pub status: CheckpointStatus,
    /// When it was triggered, in milliseconds since the Unix epoch.
    pub trigger_time_unix_ms: u64,
    /// From trigger to durable commit (so far, while in progress).
    pub duration_ms: u64,
    /// From trigger to the last subtask's ack: barriers travelling,
    /// alignment and every subtask's synchronous part.
    pub sync_duration_ms: u64,
    /// From the last ack to the durable commit: the writer's work (write,
    /// fsync, rename), off the actor threads.
    pub async_duration_ms: u64,
    /// The longest barrier alignment of any subtask.
    pub alignment_max_us: u64,
    /// Bytes of all its parts (0 until it is durable).
    pub size_bytes: u64,
    /// Subtasks that acked.
    pub acked_subtasks: usize,
    /// Subtasks that take part.
    pub total_subtasks: usize,
    /// Per subtask that acked, in ack order.
    pub subtasks: Vec<SubtaskCheckpoint>,
    /// Why it failed.
    pub failure: Option<String>,
}

/// One subtask's share of a checkpoint.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SubtaskCheckpoint {
    /// The operator's name.
    pub operator: String,
    /// The subtask's index.
    pub subtask: usize,
    /// From trigger to this subtask's ack, in milliseconds.
    pub ack_ms: u64,
    /// The synchronous part (encoding the state) in microseconds.
    pub sync_us: u64,
    /// Its barrier alignment in microseconds.
    pub alignment_us: u64,
    /// Bytes of its part.
    pub size_bytes: u64,
}

/// One restart of a failover region.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RestartMetrics {
    /// When the region ran again, in milliseconds since the Unix epoch.
    pub time_unix_ms: u64,
    /// The generation it started with.
    pub generation: u64,
    /// The operators of the region.
    pub region: Vec<String>,
    /// The failure that caused it, as text.
    pub cause: String,
    /// The checkpoint it restored from.
    pub restored_from: Option<u64>,
    /// From failure to running again.
    pub recovery_ms: u64,
}
