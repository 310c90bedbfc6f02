//! The machine's vocabulary: the events the supervisor actor feeds it and
//! the commands it gives back, as plain serde data (no address, `Arc`,
//! channel or closure inside), so that they could cross a process.
//!
//! Types only: what each event makes the machine do is `mod.rs`'s, and
//! carrying out a command is the actor's (`super::super::checkpoints`).

use serde::{Deserialize, Serialize};

use crate::protocol::{CheckpointId, CheckpointKind, DeclineReason};
use crate::runtime::Generation;

/// What happened, as the actor tells the machine. `H` is the handle of one
/// acked part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Event<H> {
    /// A new generation of `region` runs, restored from a checkpoint no
    /// newer than `id_floor` (the newest id the store ever held, so new
    /// checkpoints number on above it).
    RegionStarted {
        /// The region.
        region: usize,
        /// Its new generation.
        generation: Generation,
        /// New checkpoint ids start above this.
        id_floor: CheckpointId,
    },
    /// The actor decided to restart these regions (after a
    /// [`Command::RegionFailed`] or [`Command::CheckpointsFailing`]): they
    /// stop now; checkpoints are suspended until every region runs again.
    RegionsStopped {
        /// The regions.
        regions: Vec<usize>,
    },
    /// A subtask acked a checkpoint with its part.
    Ack {
        /// The subtask.
        node: usize,
        /// The generation it belongs to.
        generation: Generation,
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// Its part.
        part: H,
    },
    /// A subtask declined a checkpoint.
    Decline {
        /// The subtask.
        node: usize,
        /// The generation it belongs to.
        generation: Generation,
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// Why.
        reason: DeclineReason,
    },
    /// Every input of a subtask ended; it must be triggered directly.
    InputsEnded {
        /// The subtask.
        node: usize,
        /// The generation it belongs to.
        generation: Generation,
    },
    /// A subtask processed the completion of a checkpoint (sinks
    /// committed up to it).
    Committed {
        /// The subtask.
        node: usize,
        /// The generation it belongs to.
        generation: Generation,
        /// The checkpoint.
        checkpoint: CheckpointId,
    },
    /// A subtask failed.
    Failed {
        /// The subtask.
        node: usize,
        /// The generation it belongs to.
        generation: Generation,
        /// Whether a restart can help.
        retryable: bool,
    },
    /// The writer finished with a checkpoint handed over by
    /// [`Command::Persist`] of machine epoch `epoch`.
    Persisted {
        /// The `epoch` of the [`Command::Persist`].
        epoch: u64,
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// How it went.
        outcome: PersistResult,
    },
    /// The deadline of [`SupervisorMachine::poll_timeout`] passed.
    Timer,
    /// The user asked for a savepoint that does not stop the job.
    SavepointRequested,
    /// The user asked to stop: with a savepoint, or at once.
    StopRequested {
        /// With a savepoint.
        savepoint: bool,
    },
}

/// How a persist went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum PersistResult {
    /// Committed: the checkpoint is durable.
    Durable,
    /// Not written: the final checkpoint holds all it held.
    Subsumed,
    /// The store could not persist it.
    Failed,
}

/// A control message for one subtask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum ToSubtask {
    /// Start this checkpoint (the subtask is an initiator).
    Trigger(CheckpointId, CheckpointKind),
    /// The checkpoint is durable: commit (sinks).
    Complete(CheckpointId),
    /// The checkpoint was aborted.
    Abort(CheckpointId),
}

/// How the job ends, when the machine decides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Ending {
    /// Every subtask committed the final checkpoint or the stop savepoint.
    Finished,
    /// The user cancelled the job.
    Cancelled,
    /// `node` failed with an error that a restart cannot fix.
    NotRetryable {
        /// The subtask.
        node: usize,
    },
}

/// What the actor must do, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Command<H> {
    /// Send `message` to the running subtask `node`.
    Send {
        /// The subtask.
        node: usize,
        /// The message.
        message: ToSubtask,
    },
    /// A checkpoint was triggered (its figures start now).
    Triggered {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// Its kind.
        kind: CheckpointKind,
    },
    /// Every subtask acked: write the parts and commit, then answer with
    /// [`Event::Persisted`].
    Persist {
        /// The machine's epoch, to give back in [`Event::Persisted`].
        epoch: u64,
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// Its kind.
        kind: CheckpointKind,
        /// Every input had ended before it: a later run has nothing to do.
        is_final: bool,
        /// One part per node, by node.
        parts: Vec<H>,
    },
    /// Checkpoints below this one need not be written (the final one
    /// holds all they hold).
    SubsumeBelow(CheckpointId),
    /// A checkpoint was aborted (the subtasks are told by `Send`s).
    Aborted {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// Why, in words.
        reason: String,
        /// Whether it counts as a failed checkpoint.
        failure: bool,
    },
    /// A persisted checkpoint is durable; `Send`s of its completion follow.
    Durable {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// It is the stop savepoint.
        stop_savepoint: bool,
    },
    /// A subtask failed and a restart can help: the actor asks its restart
    /// strategy, then answers with [`Event::RegionsStopped`] (or ends the
    /// job).
    RegionFailed {
        /// The region to restart.
        region: usize,
        /// The subtask that failed.
        node: usize,
        /// The newest checkpoint in flight at the failure.
        checkpoint_in_flight: Option<CheckpointId>,
    },
    /// More checkpoints failed in a row than tolerated: restart every
    /// region, as for [`Command::RegionFailed`].
    CheckpointsFailing {
        /// How many failed in a row.
        consecutive_failures: u32,
    },
    /// Checkpoints run again: every region runs.
    Resumed,
    /// The job ends; nothing more comes out of the machine.
    Finish(Ending),
}
