//! The checkpoint coordinator machine: when to trigger, when a checkpoint is
//! complete, when to abort, and when the job must fail.
//!
//! [`Coordinator`] owns the checkpoint numbering, the periodic schedule
//! (interval, minimum pause, maximum concurrent checkpoints), timeouts,
//! manual and node-requested triggers (savepoints), the collection of acks
//! with their part handles, and the count of consecutive failures. Time is
//! an input (`now_ms` on every call); the next moment it wants to be called
//! again is [`Coordinator::poll_timeout`]; its decisions come out of
//! [`Coordinator::poll_action`] in order.
//!
//! It never reads a clock, never sends anything and never persists
//! anything: on [`CoordinatorAction::Complete`] the driver persists the
//! checkpoint (storage layer) and only then tells the nodes, so sinks commit
//! only what is durable.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::node::DeclineReason;
use super::CheckpointId;

/// How checkpoints are scheduled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoordinatorConfig {
    /// Time between periodic triggers; `None` disables periodic checkpoints
    /// (only requested ones then happen).
    pub interval_ms: Option<u64>,
    /// Minimum time from the end of one checkpoint to the start of the next
    /// periodic one. As in Flink, a non-zero pause also means no periodic
    /// checkpoint starts while another is in flight.
    pub min_pause_ms: u64,
    /// Maximum number of checkpoints in flight at once (at least 1). Also
    /// bounds requested checkpoints, because nodes decline their oldest
    /// checkpoint when one more starts.
    pub max_concurrent: usize,
    /// A checkpoint not complete this long after its trigger is aborted.
    pub timeout_ms: u64,
    /// How many consecutive failed checkpoints are tolerated; one more and
    /// the coordinator says the job must fail.
    pub tolerable_failures: u32,
    /// The number of the first checkpoint (after a restore: the restored
    /// checkpoint's number plus one).
    pub first_checkpoint: CheckpointId,
}

impl Default for CoordinatorConfig {
    fn default() -> CoordinatorConfig {
        CoordinatorConfig {
            interval_ms: None,
            min_pause_ms: 0,
            max_concurrent: 1,
            timeout_ms: 10 * 60 * 1000,
            tolerable_failures: 0,
            first_checkpoint: CheckpointId(1),
        }
    }
}

/// A [`CoordinatorConfig`] or node set the coordinator cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CoordinatorConfigError {
    /// `max_concurrent` was 0.
    #[error("max_concurrent must be at least 1")]
    ZeroConcurrency,
    /// `interval_ms` was `Some(0)`.
    #[error("interval_ms must be positive when given")]
    ZeroInterval,
    /// There are no nodes to ack.
    #[error("a coordinator needs at least one node")]
    NoNodes,
    /// There is no initiator, so no checkpoint could ever start.
    #[error("a coordinator needs at least one initiator")]
    NoInitiators,
    /// An initiator index is not below the node count.
    #[error("initiator {initiator} is not a node (there are {node_count} nodes)")]
    UnknownInitiator {
        /// The bad index.
        initiator: usize,
        /// The number of nodes.
        node_count: usize,
    },
}

impl CoordinatorConfigError {
    /// Whether trying again could succeed: never, the configuration is wrong.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

/// Why a checkpoint was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CheckpointKind {
    /// By the interval.
    Periodic,
    /// Requested by a node or the user; an ordinary checkpoint.
    Requested,
    /// Requested by the user as a savepoint (kept until deleted by hand).
    Savepoint,
}

/// Why a checkpoint was aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AbortReason {
    /// It was not complete within `timeout_ms`.
    Timeout,
    /// A node declined it.
    Declined {
        /// The node.
        node: usize,
        /// Its reason.
        reason: DeclineReason,
    },
    /// A newer checkpoint completed first; not a failure.
    Subsumed,
    /// The driver aborted it (for example because the job restarts); not
    /// counted as a failure.
    ByDriver,
}

impl AbortReason {
    /// Whether this abort counts towards the tolerable failures.
    pub fn is_failure(self) -> bool {
        matches!(self, AbortReason::Timeout | AbortReason::Declined { .. })
    }
}

/// A checkpoint every node acked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletedCheckpoint<H> {
    /// The checkpoint.
    pub checkpoint: CheckpointId,
    /// Why it was started.
    pub kind: CheckpointKind,
    /// One part handle per node, indexed by node.
    pub parts: Vec<H>,
    /// When it was triggered.
    pub triggered_ms: u64,
    /// When the last ack arrived.
    pub completed_ms: u64,
}

/// What the driver must do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoordinatorAction<H> {
    /// Trigger `checkpoint` at every node in [`Coordinator::initiators`].
    Trigger {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// Why it starts.
        kind: CheckpointKind,
    },
    /// Every node acked: persist the checkpoint, then tell every node it is
    /// complete (sinks commit on that).
    Complete(CompletedCheckpoint<H>),
    /// Tell every node to abort `checkpoint`, and discard the parts already
    /// acked.
    Abort {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// Why.
        reason: AbortReason,
        /// Handles of parts already acked, to discard.
        parts: Vec<H>,
    },
    /// More consecutive checkpoints failed than tolerated: the job must
    /// fail (and restart from the last completed checkpoint). The
    /// coordinator triggers nothing more.
    FailJob {
        /// How many failed in a row.
        consecutive_failures: u32,
    },
}

/// The answer to an ack.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a stale ack returns its handle, which the driver must discard"]
pub enum AckOutcome<H> {
    /// Recorded; the checkpoint waits for more acks.
    Pending,
    /// This was the last ack; a [`CoordinatorAction::Complete`] is queued.
    Completed,
    /// The checkpoint was already aborted or subsumed; discard the part.
    Stale(H),
}

#[derive(Debug, Clone)]
struct Pending<H> {
    checkpoint: CheckpointId,
    kind: CheckpointKind,
    triggered_ms: u64,
    acks: Vec<Option<H>>,
    ack_count: usize,
}

/// The coordinator machine. `H` is the runtime's handle of one acked part
/// (for example a storage reference plus the channel states).
///
/// ```
/// use snapflow::protocol::{CheckpointId, Coordinator, CoordinatorAction, CoordinatorConfig};
///
/// let config = CoordinatorConfig { interval_ms: Some(1_000), ..CoordinatorConfig::default() };
/// // Two nodes must ack; node 0 is the only initiator.
/// let mut coordinator: Coordinator<&str> = Coordinator::new(config, 2, vec![0], 0).unwrap();
/// assert_eq!(coordinator.poll_timeout(), Some(1_000));
/// coordinator.handle_timeout(1_000);
/// assert!(matches!(coordinator.poll_action(), Some(CoordinatorAction::Trigger { .. })));
/// let _ = coordinator.on_ack(1_010, 0, CheckpointId(1), "part 0");
/// let _ = coordinator.on_ack(1_020, 1, CheckpointId(1), "part 1");
/// let Some(CoordinatorAction::Complete(done)) = coordinator.poll_action() else { panic!() };
/// assert_eq!(done.parts, ["part 0", "part 1"]);
/// ```
#[derive(Debug, Clone)]
pub struct Coordinator<H> {
    config: CoordinatorConfig,
    node_count: usize,
    initiators: Vec<usize>,
    next_checkpoint: CheckpointId,
    /// Checkpoints in flight, ascending; at most `max_concurrent`.
    pending: Vec<Pending<H>>,
    /// A coalesced request; several requests before a trigger start one
    /// checkpoint (a savepoint if any request asked for one).
    requested: Option<CheckpointKind>,
    last_trigger_ms: u64,
    last_finish_ms: Option<u64>,
    consecutive_failures: u32,
    /// The newest completion and the failure count it reset, so that a
    /// driver that fails to persist it can take the reset back
    /// ([`Coordinator::on_persist_failed`]).
    last_completion: Option<(CheckpointId, u32)>,
    failed: bool,
    /// Set by [`Coordinator::savepoints_only`]: the job is stopping with a
    /// savepoint, so nothing but a savepoint may start.
    savepoints_only: bool,
    /// Drained by the driver after each call; bounded by one trigger, one
    /// completion and `max_concurrent` aborts per call.
    actions: VecDeque<CoordinatorAction<H>>,
}

impl<H> Coordinator<H> {
    /// A coordinator for `node_count` nodes (subtasks) that must all ack,
    /// triggering `initiators`. The first periodic checkpoint is due one
    /// interval after `now_ms`.
    pub fn new(
        config: CoordinatorConfig,
        node_count: usize,
        initiators: Vec<usize>,
        now_ms: u64,
    ) -> Result<Coordinator<H>, CoordinatorConfigError> {
        if config.max_concurrent == 0 {
            return Err(CoordinatorConfigError::ZeroConcurrency);
        }
        if config.interval_ms == Some(0) {
            return Err(CoordinatorConfigError::ZeroInterval);
        }
        if node_count == 0 {
            return Err(CoordinatorConfigError::NoNodes);
        }
        if initiators.is_empty() {
            return Err(CoordinatorConfigError::NoInitiators);
        }
        if let Some(&initiator) = initiators.iter().find(|&&node| node >= node_count) {
            return Err(CoordinatorConfigError::UnknownInitiator {
                initiator,
                node_count,
            });
        }
        Ok(Coordinator {
            next_checkpoint: config.first_checkpoint,
            config,
            node_count,
            initiators,
            pending: Vec::new(),
            requested: None,
            last_trigger_ms: now_ms,
            last_finish_ms: None,
            consecutive_failures: 0,
            last_completion: None,
            failed: false,
            savepoints_only: false,
            actions: VecDeque::new(),
        })
    }

    /// Time passed: abort timed-out checkpoints and trigger due ones.
    pub fn handle_timeout(&mut self, now_ms: u64) {
        self.expire(now_ms);
        self.maybe_trigger(now_ms);
    }

    /// The earliest time at which [`Coordinator::handle_timeout`] has work
    /// (a deadline or a due trigger); `None` if nothing is scheduled.
    pub fn poll_timeout(&self) -> Option<u64> {
        if self.failed {
            return None;
        }
        let deadline = self
            .pending
            .iter()
            .map(|pending| pending.triggered_ms.saturating_add(self.config.timeout_ms))
            .min();
        let trigger = self.next_periodic_due_ms();
        match (deadline, trigger) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// From now on only savepoints start: the periodic schedule ends and
    /// a request of another kind (the final checkpoint of a bounded job)
    /// is dropped. A job that stops with a savepoint calls it: a
    /// checkpoint after the savepoint would commit output that a resume
    /// from the savepoint writes again. Checkpoints already in flight go
    /// on (they precede the savepoint), and a savepoint that fails may be
    /// requested again.
    pub fn savepoints_only(&mut self) {
        self.savepoints_only = true;
        if self.requested != Some(CheckpointKind::Savepoint) {
            self.requested = None;
        }
    }

    /// The next action to carry out.
    pub fn poll_action(&mut self) -> Option<CoordinatorAction<H>> {
        self.actions.pop_front()
    }

    /// Asks for a checkpoint now (a savepoint, or a node's request). It
    /// starts at once if fewer than `max_concurrent` are in flight, else as
    /// soon as one finishes; requests made meanwhile coalesce.
    pub fn request_checkpoint(&mut self, now_ms: u64, kind: CheckpointKind) {
        self.requested = match (self.requested, kind) {
            (Some(CheckpointKind::Savepoint), _) | (_, CheckpointKind::Savepoint) => {
                Some(CheckpointKind::Savepoint)
            }
            _ => Some(CheckpointKind::Requested),
        };
        self.handle_timeout(now_ms);
    }

    /// Node `node` acked `checkpoint` with its part handle.
    ///
    /// # Panics
    ///
    /// On driver bugs: an unknown node, an ack for a checkpoint never
    /// triggered, or a second ack of the same node.
    pub fn on_ack(
        &mut self,
        now_ms: u64,
        node: usize,
        checkpoint: CheckpointId,
        handle: H,
    ) -> AckOutcome<H> {
        assert!(
            node < self.node_count,
            "ack from node {node}, but there are {} nodes",
            self.node_count
        );
        assert!(
            checkpoint < self.next_checkpoint,
            "ack of {checkpoint}, which was never triggered"
        );
        let Some(index) = self.index_of(checkpoint) else {
            return AckOutcome::Stale(handle);
        };
        let pending = &mut self.pending[index];
        assert!(
            pending.acks[node].is_none(),
            "node {node} acked {checkpoint} twice"
        );
        pending.acks[node] = Some(handle);
        pending.ack_count += 1;
        if pending.ack_count < self.node_count {
            return AckOutcome::Pending;
        }
        self.complete(index, now_ms);
        self.maybe_trigger(now_ms);
        AckOutcome::Completed
    }

    /// Node `node` declined `checkpoint`: abort it, as a failure.
    pub fn on_decline(
        &mut self,
        now_ms: u64,
        node: usize,
        checkpoint: CheckpointId,
        reason: DeclineReason,
    ) {
        if let Some(index) = self.index_of(checkpoint) {
            self.abort_at(index, now_ms, AbortReason::Declined { node, reason });
        }
        self.maybe_trigger(now_ms);
    }

    /// Aborts every checkpoint in flight without counting failures, for
    /// example before a restart.
    pub fn abort_all(&mut self, now_ms: u64) {
        while !self.pending.is_empty() {
            self.abort_at(0, now_ms, AbortReason::ByDriver);
        }
    }

    /// The driver could not persist the completed `checkpoint`: it counts
    /// as a failed checkpoint. Its completion had reset the failure count;
    /// that reset is taken back, so a run of checkpoints that complete but
    /// never become durable adds up to a run of failures. Exceeding
    /// `tolerable_failures` queues [`CoordinatorAction::FailJob`] as for any
    /// other failure.
    ///
    /// Known gap: if a newer checkpoint completed before this one's
    /// persist failed (only requested checkpoints can overlap a persist in
    /// the job layer), the count the older completion reset is not
    /// restored; the failure then counts as one.
    pub fn on_persist_failed(&mut self, now_ms: u64, checkpoint: CheckpointId) {
        let reset = match self.last_completion.take() {
            Some((completed, reset)) if completed == checkpoint => reset,
            other => {
                self.last_completion = other;
                0
            }
        };
        self.consecutive_failures = self.consecutive_failures.saturating_add(reset);
        self.count_failure();
        self.maybe_trigger(now_ms);
    }

    /// Node `node` had all its inputs end: from now on it is triggered
    /// directly. Returns the checkpoints in flight, with their kinds, that
    /// the driver must trigger at it now (their barriers will never reach
    /// it).
    pub fn add_initiator(&mut self, node: usize) -> Vec<(CheckpointId, CheckpointKind)> {
        assert!(node < self.node_count, "node {node} is not a node");
        if !self.initiators.contains(&node) {
            self.initiators.push(node);
        }
        self.pending
            .iter()
            .map(|pending| (pending.checkpoint, pending.kind))
            .collect()
    }

    /// The nodes a trigger goes to.
    pub fn initiators(&self) -> &[usize] {
        &self.initiators
    }

    /// Checkpoints in flight, ascending.
    pub fn in_flight(&self) -> impl Iterator<Item = CheckpointId> + '_ {
        self.pending.iter().map(|pending| pending.checkpoint)
    }

    /// How many checkpoints failed in a row since the last completion.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// Whether the coordinator said the job must fail.
    pub fn has_failed(&self) -> bool {
        self.failed
    }

    fn index_of(&self, checkpoint: CheckpointId) -> Option<usize> {
        self.pending
            .iter()
            .position(|pending| pending.checkpoint == checkpoint)
    }

    fn expire(&mut self, now_ms: u64) {
        while let Some(index) = self.pending.iter().position(|pending| {
            now_ms >= pending.triggered_ms.saturating_add(self.config.timeout_ms)
        }) {
            self.abort_at(index, now_ms, AbortReason::Timeout);
        }
    }

    fn next_periodic_due_ms(&self) -> Option<u64> {
        let interval_ms = self.config.interval_ms?;
        if self.failed || self.savepoints_only || self.pending.len() >= self.config.max_concurrent {
            return None;
        }
        if self.config.min_pause_ms > 0 && !self.pending.is_empty() {
            return None;
        }
        let by_interval = self.last_trigger_ms.saturating_add(interval_ms);
        let by_pause = self
            .last_finish_ms
            .map_or(0, |finish| finish.saturating_add(self.config.min_pause_ms));
        Some(by_interval.max(by_pause))
    }

    /// Triggers at most one checkpoint: a pending request first, else a due
    /// periodic one. One per call, so a long stall does not cause a burst.
    fn maybe_trigger(&mut self, now_ms: u64) {
        if self.failed || self.pending.len() >= self.config.max_concurrent {
            return;
        }
        if self.savepoints_only && self.requested != Some(CheckpointKind::Savepoint) {
            self.requested = None;
        }
        let kind = if let Some(kind) = self.requested.take() {
            kind
        } else if self.next_periodic_due_ms().is_some_and(|due| now_ms >= due) {
            CheckpointKind::Periodic
        } else {
            return;
        };
        let checkpoint = self.next_checkpoint;
        self.next_checkpoint = checkpoint.next();
        self.last_trigger_ms = now_ms;
        self.pending.push(Pending {
            checkpoint,
            kind,
            triggered_ms: now_ms,
            acks: (0..self.node_count).map(|_| None).collect(),
            ack_count: 0,
        });
        self.actions
            .push_back(CoordinatorAction::Trigger { checkpoint, kind });
    }

    fn complete(&mut self, index: usize, now_ms: u64) {
        // Older checkpoints still in flight are subsumed, as in Flink.
        for _ in 0..index {
            self.abort_at(0, now_ms, AbortReason::Subsumed);
        }
        let pending = self.pending.remove(0);
        self.last_completion = Some((pending.checkpoint, self.consecutive_failures));
        self.consecutive_failures = 0;
        self.last_finish_ms = Some(now_ms);
        let parts = pending
            .acks
            .into_iter()
            .map(|ack| ack.expect("a complete checkpoint has every ack"))
            .collect();
        self.actions
            .push_back(CoordinatorAction::Complete(CompletedCheckpoint {
                checkpoint: pending.checkpoint,
                kind: pending.kind,
                parts,
                triggered_ms: pending.triggered_ms,
                completed_ms: now_ms,
            }));
    }

    fn abort_at(&mut self, index: usize, now_ms: u64, reason: AbortReason) {
        let pending = self.pending.remove(index);
        self.last_finish_ms = Some(now_ms);
        self.actions.push_back(CoordinatorAction::Abort {
            checkpoint: pending.checkpoint,
            reason,
            parts: pending.acks.into_iter().flatten().collect(),
        });
        if reason.is_failure() {
            self.count_failure();
        }
    }

    /// One more failure in a row; more than tolerated fails the job once.
    fn count_failure(&mut self) {
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        if self.consecutive_failures > self.config.tolerable_failures && !self.failed {
            self.failed = true;
            self.actions.push_back(CoordinatorAction::FailJob {
                consecutive_failures: self.consecutive_failures,
            });
        }
    }
}
