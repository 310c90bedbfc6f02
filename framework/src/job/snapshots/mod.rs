//! Global snapshots of a running job that are not recovery checkpoints:
//! Chandy-Lamport snapshots started by any operator instance (through its
//! [`OperatorContext`](super::OperatorContext)) or by the caller (through
//! [`RunningJob::snapshot`](super::RunningJob::snapshot)), concurrently
//! with each other and with the periodic checkpoints, and what they are
//! used for besides recovery: detecting that a loop has terminated, and
//! detecting operators that are stuck or deadlocked.
//!
//! This module owns the public types of such a snapshot: the
//! [`GlobalSnapshot`] handed back (every subtask's state and every
//! channel's recorded records, read through the same typed
//! [`CheckpointView`] as a stored checkpoint), the [`SnapshotReceiver`] it
//! arrives on, the typed [`SnapshotError`]s, what an operator declares it
//! is waiting for ([`Waiting`]), and the pure analyses of snapshots
//! ([`detect`]). It never sends a marker or decides a protocol question
//! (the shells drive [`ConcurrentMachine`](crate::protocol::ConcurrentMachine)),
//! never writes anything to the checkpoint store (these snapshots are
//! never restored), and never stops a job.
//!
//! A snapshot covers the failover region of the subtask that started it
//! (its connected part of the graph): markers travel only along channels,
//! and no channel leaves a region. The runtime makes the initiator's
//! snapshot reach every subtask of the region by also starting it at the
//! region's protocol initiators (its sources and one node per loop that no
//! source reaches), which Chandy-Lamport allows (any number of processes
//! may record spontaneously for one snapshot).
//!
//! ```
//! use std::time::Duration;
//! use snapflow::job::snapshots::SnapshotError;
//! use snapflow::job::{Job, JobConfig};
//! use snapflow::sink::CollectHandle;
//! use snapflow::source::VecSourceFactory;
//!
//! let job = Job::new("snapshot-doc", JobConfig::default());
//! job.source("numbers", VecSourceFactory::new((0..1_000_000_u64).collect()))
//!     .map("double", |n: u64| n * 2)
//!     .sink("out", CollectHandle::new());
//! let running = job.start()?;
//! // Until the job has loaded its first checkpoint it is not running yet.
//! let mut answer = running.snapshot("double", 0).wait(Duration::from_secs(30));
//! while matches!(answer, Err(SnapshotError::NotRunning { .. })) {
//!     std::thread::sleep(Duration::from_millis(1));
//!     answer = running.snapshot("double", 0).wait(Duration::from_secs(30));
//! }
//! // The job may also end before the snapshot is taken; either answer is typed.
//! match answer {
//!     Ok(snapshot) => assert!(snapshot.view().operators().contains(&"double")),
//!     Err(error) => assert!(matches!(error, SnapshotError::JobEnded), "{error}"),
//! }
//! running.wait()?;
//! # Ok::<(), snapflow::job::JobError>(())
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use crate::protocol::SnapshotId;
use crate::storage::PartId;

use super::inspect::CheckpointView;

pub mod detect;

/// How many snapshots that are not checkpoints the supervisor collects at
/// once (each keeps one part per subtask in memory until it is complete);
/// one more is refused with [`SnapshotError::TooMany`].
pub const SNAPSHOTS_IN_FLIGHT_MAX: usize = 16;

/// How many snapshots one operator instance may have asked for and not yet
/// started (they start after the record being processed); one more is
/// refused with [`SnapshotError::TooMany`].
pub const REQUESTS_PENDING_MAX: usize = 16;

/// How many snapshots one subtask takes part in at once
/// ([`ConcurrentConfig::max_concurrent`](crate::protocol::ConcurrentConfig)):
/// each records its own copy of the records in flight towards it. One more
/// is declined ([`SnapshotError::Declined`]).
pub const CONCURRENT_PER_SUBTASK_MAX: usize = 8;

/// What an operator declares it is waiting for, read at each snapshot
/// (see [`Operator::waiting`](super::Operator::waiting)). This is the
/// definition of "waiting" the stuck detector uses, so that a finding can
/// be checked by hand: an operator waits when it holds records it cannot
/// finish (`holding`) until a record arrives from one of the operators it
/// names (`for_operators`, for example a join waiting for its other
/// side). An operator that declares nothing is never waiting; operators
/// blocked on a channel's credits cannot take part in a snapshot at all
/// and show up as [`detect::Finding::Unresponsive`] instead.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Waiting {
    /// How many records the operator holds that it has not finished.
    pub holding: u64,
    /// The names of upstream operators a record from any of which could
    /// let it go on (an empty list: it waits for nothing in particular).
    pub for_operators: Vec<String>,
}

impl Waiting {
    /// Whether this declares any wait at all.
    pub fn is_waiting(&self) -> bool {
        self.holding > 0 || !self.for_operators.is_empty()
    }
}

/// What one subtask was doing at its local snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubtaskActivity {
    /// The operator and subtask.
    pub id: PartId,
    /// Records this subtask processed since its generation started.
    pub records_in: u64,
    /// Records it emitted since its generation started.
    pub records_out: u64,
    /// Per input channel (index as in [`ChannelActivity::input`]): whether
    /// it had ended.
    pub inputs_ended: Vec<bool>,
    /// What the operator declared it waits for.
    pub waiting: Waiting,
}

/// One channel of the snapshot's region and what was in flight on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelActivity {
    /// The sending subtask.
    pub from: PartId,
    /// The receiving subtask.
    pub to: PartId,
    /// The channel's index among the receiver's inputs.
    pub input: u32,
    /// Whether it is a feedback edge of a loop.
    pub feedback: bool,
    /// Records recorded in flight on it (sent before the sender's local
    /// snapshot, received after the receiver's).
    pub records_in_flight: u64,
}

/// A consistent global snapshot of one failover region of a running job:
/// every subtask's state at its local snapshot and the records in flight
/// on every channel, as Chandy-Lamport defines it. It is never stored and
/// never restored.
#[derive(Debug, Clone)]
pub struct GlobalSnapshot {
    pub(crate) id: SnapshotId,
    pub(crate) generation: u64,
    pub(crate) view: CheckpointView,
    pub(crate) subtasks: Vec<SubtaskActivity>,
    pub(crate) channels: Vec<ChannelActivity>,
}

impl GlobalSnapshot {
    /// The snapshot's identity (the starting subtask's node index and its
    /// own sequence number).
    pub fn id(&self) -> SnapshotId {
        self.id
    }

    /// The generation of the starting subtask's region when it was taken.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The states and recorded channels, read with the same typed API as a
    /// stored checkpoint (keyed state, custom operator states, source
    /// positions, records in flight); its checkpoint id is 0 and its
    /// operators' state carries no checkpoint id. Sinks record no state in
    /// such a snapshot (their pre-commit would have effects).
    pub fn view(&self) -> &CheckpointView {
        &self.view
    }

    /// Every subtask the snapshot covers, in node order: the whole running
    /// graph for a snapshot the caller or an operator started (every
    /// failover region; regions share no channel, so the union of their
    /// cuts is consistent), the region alone for the detectors' own.
    pub fn subtasks(&self) -> &[SubtaskActivity] {
        &self.subtasks
    }

    /// Every channel of the region, in the job's channel order.
    pub fn channels(&self) -> &[ChannelActivity] {
        &self.channels
    }

    /// One subtask's activity.
    pub fn subtask(&self, operator: &str, subtask: u32) -> Option<&SubtaskActivity> {
        self.subtasks
            .iter()
            .find(|activity| activity.id.operator == operator && activity.id.subtask == subtask)
    }
}

/// Why a snapshot was not handed back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// No operator of this name in the job.
    #[error("the job has no operator `{operator}`")]
    UnknownOperator {
        /// The name asked for.
        operator: String,
    },
    /// The operator has fewer subtasks.
    #[error("operator `{operator}` has {parallelism} subtasks, not subtask {subtask}")]
    UnknownSubtask {
        /// The operator.
        operator: String,
        /// The subtask asked for.
        subtask: usize,
        /// Its parallelism.
        parallelism: usize,
    },
    /// The subtask's region is restarting or the job is still loading.
    #[error("the region of `{operator}` is not running now (it is starting or restarting)")]
    NotRunning {
        /// The operator.
        operator: String,
    },
    /// Too many snapshots in flight (see [`SNAPSHOTS_IN_FLIGHT_MAX`] and
    /// [`REQUESTS_PENDING_MAX`]).
    #[error("{max} snapshots are already in flight")]
    TooMany {
        /// The bound that was reached.
        max: usize,
    },
    /// A subtask took part in as many snapshots as it may at once.
    #[error("subtask {subtask} of `{operator}` declined: it takes part in {max_concurrent} snapshots already")]
    Declined {
        /// The operator.
        operator: String,
        /// The subtask.
        subtask: u32,
        /// Its bound.
        max_concurrent: usize,
    },
    /// The region failed and restarted while the snapshot was taken.
    #[error("the snapshot was aborted: {reason}")]
    Aborted {
        /// Why.
        reason: String,
    },
    /// Not every subtask reported in time (it may be blocked, for example
    /// on a channel's credits, or very slow).
    #[error("the snapshot did not complete in {timeout_ms} ms; no part yet from {missing:?}")]
    TimedOut {
        /// The limit.
        timeout_ms: u64,
        /// The subtasks whose parts were missing.
        missing: Vec<PartId>,
    },
    /// The answer did not come within the caller's wait.
    #[error("no answer within {waited_ms} ms (the snapshot may still complete)")]
    WaitElapsed {
        /// How long the caller waited.
        waited_ms: u64,
    },
    /// The job ended before the snapshot was complete.
    #[error("the job ended before the snapshot was complete")]
    JobEnded,
    /// A part could not be read back (a bug in the job layer).
    #[error("a snapshot part could not be read: {reason}")]
    Malformed {
        /// What was wrong.
        reason: String,
    },
    /// A channel's counts do not add up: the records its sender pushed
    /// ahead of the marker differ from what its receiver processed before
    /// its local state plus what it recorded in flight. The cut would not
    /// be consistent, so it is never handed out (a bug in the protocol or
    /// the shells, not an operating error).
    #[error(
        "the snapshot is not a consistent cut on the channel {from} -> {to}: \
         {sent} records sent ahead of the marker, {received} processed or recorded"
    )]
    Inconsistent {
        /// The sending subtask.
        from: PartId,
        /// The receiving subtask.
        to: PartId,
        /// Records the sender pushed ahead of its marker.
        sent: u64,
        /// Records the receiver processed before its state plus those it
        /// recorded on the channel.
        received: u64,
    },
}

impl SnapshotError {
    /// Whether asking again may succeed: yes for load, restarts and slow
    /// subtasks; no for unknown names, an ended job, malformed parts or an
    /// inconsistent cut.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            SnapshotError::NotRunning { .. }
                | SnapshotError::TooMany { .. }
                | SnapshotError::Declined { .. }
                | SnapshotError::Aborted { .. }
                | SnapshotError::TimedOut { .. }
                | SnapshotError::WaitElapsed { .. }
        )
    }
}

/// The answer to one snapshot request: one message at most, so the channel
/// has room for exactly one.
pub(crate) type SnapshotReply = mpsc::SyncSender<Result<GlobalSnapshot, SnapshotError>>;

/// Where a requested snapshot arrives. Waiting on it blocks, so an operator
/// polls it with [`SnapshotReceiver::try_take`] instead.
#[derive(Debug)]
pub struct SnapshotReceiver {
    receiver: mpsc::Receiver<Result<GlobalSnapshot, SnapshotError>>,
}

impl SnapshotReceiver {
    pub(crate) fn new() -> (SnapshotReply, SnapshotReceiver) {
        let (sender, receiver) = mpsc::sync_channel(1);
        (sender, SnapshotReceiver { receiver })
    }

    /// A receiver that already holds `error`.
    pub(crate) fn failed(error: SnapshotError) -> SnapshotReceiver {
        let (sender, receiver) = SnapshotReceiver::new();
        // The channel has room for one answer and this is the first.
        let _ = sender.try_send(Err(error));
        receiver
    }

    /// Blocks until the snapshot is complete or failed, or `timeout` passed
    /// ([`SnapshotError::WaitElapsed`]; the snapshot may still complete and
    /// can be waited for again).
    pub fn wait(&self, timeout: Duration) -> Result<GlobalSnapshot, SnapshotError> {
        match self.receiver.recv_timeout(timeout) {
            Ok(answer) => answer,
            Err(mpsc::RecvTimeoutError::Timeout) => Err(SnapshotError::WaitElapsed {
                waited_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            }),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(SnapshotError::JobEnded),
        }
    }

    /// The answer if it is there, without blocking.
    pub fn try_take(&self) -> Option<Result<GlobalSnapshot, SnapshotError>> {
        match self.receiver.try_recv() {
            Ok(answer) => Some(answer),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(Err(SnapshotError::JobEnded)),
        }
    }
}

/// Lets an operator instance start global snapshots; every
/// [`OperatorContext`](super::OperatorContext) carries one for its subtask.
/// Keep it in a `#[snapshot(skip)]` field.
#[derive(Debug, Clone, Default)]
pub struct SnapshotStarter {
    requests: Arc<Requests>,
}

/// The requests of one subtask, taken by its shell after the batch being
/// processed. Bounded by [`REQUESTS_PENDING_MAX`].
#[derive(Debug, Default)]
pub(crate) struct Requests {
    /// Set when `queue` may be non-empty: the shell loads it once per
    /// batch, and takes the lock only when it is set.
    pending: AtomicBool,
    queue: Mutex<Vec<SnapshotReply>>,
}

impl SnapshotStarter {
    /// Asks for a global snapshot started at this subtask. It starts right
    /// after the current hook returns (the state it records is the state
    /// after this record), concurrently with any other snapshot and with
    /// the job's checkpoints; the answer arrives on the receiver. Poll it
    /// with [`SnapshotReceiver::try_take`]: blocking on it inside a hook
    /// would block the subtask, and the snapshot could never complete.
    pub fn start(&self) -> SnapshotReceiver {
        let mut queue = lock(&self.requests.queue);
        if queue.len() >= REQUESTS_PENDING_MAX {
            return SnapshotReceiver::failed(SnapshotError::TooMany {
                max: REQUESTS_PENDING_MAX,
            });
        }
        let (reply, receiver) = SnapshotReceiver::new();
        queue.push(reply);
        self.requests.pending.store(true, Ordering::Release);
        receiver
    }

    pub(crate) fn requests(&self) -> Arc<Requests> {
        Arc::clone(&self.requests)
    }
}

impl Requests {
    /// One relaxed load when nothing is pending (the per-batch cost).
    #[inline]
    pub(crate) fn is_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    pub(crate) fn take(&self) -> Vec<SnapshotReply> {
        let mut queue = lock(&self.queue);
        self.pending.store(false, Ordering::Release);
        std::mem::take(&mut *queue)
    }
}

/// A request queue stays consistent when a holder panicked (each change is
/// one push or one take).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
