//! The protocol layer: pure state machines for globally consistent
//! snapshots, and the tools to check them.
//!
//! This module owns the decisions of the checkpoint protocol: when a node
//! takes its local snapshot, which input channels it holds back or records,
//! when its part of a checkpoint is done ([`node`]); when the coordinator
//! triggers, completes, aborts or gives up on checkpoints ([`coordinator`]);
//! which channels of a graph are back edges, which policy each channel gets
//! and which nodes initiate ([`graph`]); how a node takes part in any number
//! of concurrent Chandy-Lamport snapshots started by any node, each with its
//! own identity and no global order ([`concurrent`]); and how to verify that
//! a recorded snapshot is a consistent cut of a trace ([`oracle`]).
//!
//! It never does I/O, never reads a clock, never spawns, sleeps or blocks,
//! and knows nothing of actix. Time and events are inputs, actions are
//! outputs; the runtime layer drives these machines and carries out what
//! they say. That is what makes every interleaving of a small graph
//! checkable exhaustively (see `framework/tests/protocol.rs`).

pub mod concurrent;
pub mod coordinator;
pub mod global;
pub mod graph;
pub mod node;
pub mod oracle;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use concurrent::{
    ConcurrentAction, ConcurrentConfig, ConcurrentConfigError, ConcurrentDeclineReason,
    ConcurrentMachine, ConcurrentPart, ConcurrentToken, SnapshotId,
};
pub use coordinator::{
    AbortReason, AckOutcome, CheckpointKind, CompletedCheckpoint, Coordinator, CoordinatorAction,
    CoordinatorConfig, CoordinatorConfigError,
};
pub use global::{AssembleError, GlobalSnapshot};
pub use graph::{GraphBuilder, GraphError, LogicalGraph, SnapshotMode, SnapshotPlan};
pub use node::{
    ChannelState, DeclineReason, Delivery, NodeAction, NodeConfig, NodeConfigError, NodeMachine,
    NodePart, SnapshotToken,
};

/// The number of one checkpoint. Checkpoints of one job are numbered in
/// increasing order; a higher number is a later checkpoint.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct CheckpointId(pub u64);

impl CheckpointId {
    /// The checkpoint after this one.
    pub fn next(self) -> CheckpointId {
        CheckpointId(self.0 + 1)
    }
}

impl fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "checkpoint {}", self.0)
    }
}

/// What a node does with one input channel during a checkpoint (DESIGN §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ChannelPolicy {
    /// The channel's barrier must arrive before the node snapshots; once it
    /// has, the channel is held (its later messages are buffered, not
    /// processed) until the snapshot. Such a channel never has channel state.
    Align,
    /// The node may snapshot before the channel's barrier arrives; what
    /// arrives afterwards, until the barrier, is recorded as channel state
    /// (and still processed). If the barrier arrives before the snapshot,
    /// the channel is held like an [`ChannelPolicy::Align`] channel.
    Record,
    /// At-least-once: the channel's barrier must arrive before the node
    /// snapshots, but the channel is never held, so messages after the
    /// barrier may be part of the snapshot and are replayed after recovery.
    AlignNoHold,
}

impl ChannelPolicy {
    /// Whether the node waits for this channel's barrier before snapshotting.
    pub fn waits_for_barrier(self) -> bool {
        !matches!(self, ChannelPolicy::Record)
    }

    /// Whether the channel is held after its barrier until the snapshot.
    pub fn holds(self) -> bool {
        !matches!(self, ChannelPolicy::AlignNoHold)
    }
}
