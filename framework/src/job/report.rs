//! The reports of a job: what [`RunningJob::wait`](super::RunningJob::wait)
//! returns when the job ends ([`JobReport`] and its parts) and what
//! [`RunningJob::status`](super::RunningJob::status) shows while it runs
//! ([`JobStatus`]). Plain data: this module never computes a figure.

use std::path::PathBuf;

use crate::runtime::failure::FailureReport;
use crate::source::Guarantee;

/// What a finished job reports.
#[derive(Debug, Clone)]
pub struct JobReport {
    /// What the job guarantees after a restore: exactly-once unless the
    /// mode is at-least-once, a source cannot seek, or a sink cannot roll
    /// back.
    pub guarantee: Guarantee,
    /// Why [`JobReport::guarantee`] is at-least-once: the mode, and every
    /// source that cannot seek or sink that cannot roll back. Empty when
    /// the job is exactly-once.
    pub guarantee_reasons: Vec<GuaranteeReason>,
    /// The job's name.
    pub job: String,
    /// Per operator, in declaration order.
    pub operators: Vec<OperatorReport>,
    /// Checkpoints that completed and were persisted, in order.
    pub checkpoints: Vec<CheckpointReport>,
    /// Checkpoints that were aborted as failures or failed to persist.
    pub failed_checkpoints: Vec<FailedCheckpoint>,
    /// Checkpoints whose writing stopped, uncommitted, because the final
    /// checkpoint (taken once every input ended) holds all they held and
    /// would otherwise wait behind them. Not failures: nothing of them was
    /// committed or stored, and the final checkpoint's completion commits
    /// the sinks' output up to it.
    pub subsumed_checkpoints: Vec<u64>,
    /// Every restart, in order.
    pub restarts: Vec<RestartReport>,
    /// The checkpoint the first generation restored from (a resumed job).
    pub resumed_from: Option<u64>,
    /// The savepoint the job stopped with
    /// ([`RunningJob::stop_with_savepoint`](super::RunningJob::stop_with_savepoint)).
    pub savepoint: Option<u64>,
    /// Every checkpoint that loading skipped because it was damaged, in
    /// the order they were found (newest first within one load).
    pub fallbacks: Vec<FallbackReport>,
    /// The job had already finished: the checkpoint it resumed from
    /// ([`JobReport::resumed_from`]) was its final one, taken after every
    /// input ended. Nothing ran and no checkpoint was written; only the
    /// sinks committed what that checkpoint lists, and the state handles
    /// of keyed operators (`process_with_state`) show its per-key states.
    pub already_finished: bool,
}

impl JobReport {
    /// The report of the operator named `name`.
    pub fn operator(&self, name: &str) -> Option<&OperatorReport> {
        self.operators.iter().find(|operator| operator.name == name)
    }
}

/// Why a job guarantees only at-least-once (see [`JobReport::guarantee`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GuaranteeReason {
    /// The job runs in [`SnapshotMode::AtLeastOnce`](crate::protocol::SnapshotMode::AtLeastOnce): barriers are not
    /// aligned, so records after a checkpoint's barrier may already be in
    /// its state and are applied again after a restore.
    AtLeastOnceMode,
    /// This source cannot seek ([`crate::source::Source::can_seek`] is
    /// false): after a restore it goes on from wherever it is, so what it
    /// read since the last checkpoint is not replayed by snapflow. Whether
    /// the external system redelivers it decides between duplicates and
    /// loss.
    SourceCannotSeek {
        /// The source operator's name.
        operator: String,
    },
    /// This sink cannot roll back output it wrote after the last
    /// checkpoint, so a restore writes it again.
    SinkCannotRollBack {
        /// The sink operator's name.
        operator: String,
    },
    /// The job fell back past damaged checkpoints to `restored`, and this
    /// sink had already made output of later checkpoints visible, which
    /// the replay writes again. Only with
    /// [`JobConfig::accept_duplicates_after_fallback`](super::JobConfig::accept_duplicates_after_fallback);
    /// without it the job refuses to start.
    FallbackReplaysCommittedOutput {
        /// The sink operator's name.
        operator: String,
        /// The checkpoint restored (`None`: from the beginning).
        restored: Option<u64>,
        /// The checkpoints whose committed output is written again (empty
        /// when the sink cannot tell which).
        committed: Vec<u64>,
    },
}

impl GuaranteeReason {
    /// The reason for an operator whose connector is at-least-once.
    pub(crate) fn connector(operator: &str, is_source: bool) -> GuaranteeReason {
        let operator = operator.to_owned();
        if is_source {
            GuaranteeReason::SourceCannotSeek { operator }
        } else {
            GuaranteeReason::SinkCannotRollBack { operator }
        }
    }
}

impl std::fmt::Display for GuaranteeReason {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuaranteeReason::AtLeastOnceMode => write!(formatter, "the mode is at-least-once"),
            GuaranteeReason::SourceCannotSeek { operator } => {
                write!(formatter, "source `{operator}` cannot seek")
            }
            GuaranteeReason::SinkCannotRollBack { operator } => {
                write!(formatter, "sink `{operator}` cannot roll back")
            }
            GuaranteeReason::FallbackReplaysCommittedOutput {
                operator,
                restored,
                committed,
            } => {
                let restored =
                    restored.map_or("no checkpoint".to_string(), |id| format!("checkpoint {id}"));
                write!(
                    formatter,
                    "the job fell back to {restored}, and sink `{operator}` had committed \
                     later output ({}), which is written again",
                    describe_ids(committed)
                )
            }
        }
    }
}

/// Counters of one operator, summed over subtasks and generations (records
/// replayed after a restart are counted again).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorReport {
    /// The operator's name.
    pub name: String,
    /// Its parallelism.
    pub parallelism: usize,
    /// Records it processed.
    pub records_in: u64,
    /// Records it emitted.
    pub records_out: u64,
    /// The most batches ever in flight on one of its output channels.
    pub in_flight_batches_peak: u64,
    /// How often one of its output channels ran out of credit.
    pub credit_stalls: u64,
    /// Records a window operator dropped because they came later than
    /// its allowed lateness (0 for other operators, and for windows that
    /// send late records to a stream of their own). Replayed records are
    /// counted again after a restart.
    pub late_records_dropped: u64,
    /// Watermarks that went backwards, ignored (watermarks only rise) and
    /// counted here: at a source, how often a split's
    /// [`WatermarkGenerator`](crate::time::WatermarkGenerator) returned a
    /// value below one it had returned before (each new lower value once;
    /// a source never sends such a value on); at any other operator,
    /// watermarks that arrived on an input lower than that input's
    /// previous one.
    pub watermark_regressions: u64,
    /// Records a source read and dropped because its user chose to skip
    /// them (the Kafka source's undecodable records with
    /// `BadRecords::Drop`); 0 for other operators. Replayed records are
    /// counted again after a restart.
    pub records_dropped: u64,
}

/// One completed checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointReport {
    /// Its id.
    pub checkpoint: u64,
    /// From trigger to durable commit.
    pub duration_ms: u64,
    /// Bytes of all its parts: the size of the state it holds.
    pub size_bytes: u64,
    /// Bytes it wrote itself: with incremental checkpoints, only the key
    /// groups that changed (and the parts of other operators), not those
    /// it refers to in earlier checkpoints; `size_bytes` otherwise.
    pub written_bytes: u64,
    /// The longest barrier alignment of any subtask: from the first
    /// barrier of this checkpoint at its inputs to its snapshot. 0 when no
    /// subtask received a barrier (a checkpoint triggered after every input
    /// ended); near 0 in unaligned mode.
    pub alignment_max_us: u64,
}

/// One failed checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedCheckpoint {
    /// Its id.
    pub checkpoint: u64,
    /// Why it failed.
    pub reason: String,
}

/// One restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartReport {
    /// The generation the restarted region started with (one counter for
    /// the whole job: every start of any region takes the next number).
    pub generation: u64,
    /// The operators of the failover region that restarted (those with a
    /// subtask in it), in declaration order. Every other region kept
    /// running.
    pub region: Vec<String>,
    /// The failure that caused it, as text: the operator, subtask and
    /// generation that failed, how (panic or error) and the message, and
    /// the checkpoint in flight; or the checkpoint failures.
    pub cause: String,
    /// The failed operator instance (operator, subtask, generation, kind
    /// and message); `None` when more checkpoints failed in a row than
    /// tolerated.
    pub failure: Option<FailureReport>,
    /// The newest checkpoint that was triggered and neither complete nor
    /// aborted when the failure was reported (`None`: no checkpoint was in
    /// flight, or the cause was not an operator's failure).
    pub checkpoint_in_flight: Option<u64>,
    /// The checkpoint it restored from (`None`: from the beginning).
    pub restored_from: Option<u64>,
    /// From the failure report to the new generation's start.
    pub recovery_ms: u64,
}

/// A damaged checkpoint that loading skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FallbackReport {
    /// The skipped checkpoint.
    pub checkpoint: u64,
    /// What was wrong with it, naming the file.
    pub reason: String,
    /// Where its directory was moved to, kept for inspection (`None`: the
    /// store could not move it, or it had no directory).
    pub set_aside: Option<PathBuf>,
    /// The checkpoint the job restored instead (`None`: none).
    pub restored: Option<u64>,
}

/// What a running job is doing; see
/// [`RunningJob::status`](super::RunningJob::status).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobStatus {
    /// The newest generation started by any failover region (1 at the
    /// first start; every restart takes the next number).
    pub generation: u64,
    /// Restarts so far.
    pub restarts: u32,
    /// The last failure, as text (operator, subtask, kind, message).
    pub last_failure: Option<String>,
    /// The newest checkpoint that completed and became durable.
    pub last_completed_checkpoint: Option<u64>,
    /// Damaged checkpoints skipped so far.
    pub fallbacks: usize,
    /// Whether the job has ended (finished, failed or cancelled).
    pub ended: bool,
    /// Global snapshots that are not checkpoints completed so far (asked
    /// for by callers, operators and the detectors).
    pub snapshots_completed: u64,
    /// Snapshots of quiescent loops (`iterate_until_quiescent`) that
    /// showed the loop still busy.
    pub loop_checks_busy: u64,
    /// Loops that a snapshot proved quiescent and that were ended.
    pub loops_ended_by_snapshot: u64,
    /// The stuck detector's newest findings, per failover region (see
    /// [`RunningJob::detect_stuck`](super::RunningJob::detect_stuck)).
    pub stuck: Vec<crate::job::snapshots::detect::Finding>,
}

/// `checkpoint 1, 2, 5`, or a phrase saying they are unknown.
pub(crate) fn describe_ids(ids: &[u64]) -> String {
    if ids.is_empty() {
        return "which ones it cannot tell".to_string();
    }
    let texts: Vec<String> = ids.iter().map(u64::to_string).collect();
    format!("checkpoint {}", texts.join(", "))
}
