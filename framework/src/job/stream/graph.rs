//! The logical graph as the user declares it: operators with names and
//! parallelism, and edges with their partitioner. Plain data; the
//! builder fills it and `plan` reads it.

use std::any::Any;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::job::physical::{PublishRestored, Rescale, Template};
use crate::job::recovery::{SinkCheckFn, SinkRestoreFn};
use crate::job::JobError;

pub(super) struct OperatorSpec {
    pub(super) name: String,
    pub(super) parallelism: Option<usize>,
    /// Runs at the parallelism of this earlier operator instead of its
    /// own (the splitters of a window's late side output follow the
    /// window operator); setting this operator's parallelism sets that
    /// operator's.
    pub(super) follows: Option<usize>,
    pub(super) is_source: bool,
    pub(super) template: Box<dyn Template>,
    pub(super) loop_idle_ms: Option<u64>,
    pub(super) rescale: Rescale,
    /// A sink's recovery hooks (checked before any restore).
    pub(super) sink: Option<(SinkCheckFn, SinkRestoreFn)>,
    /// A window operator's count of dropped late records, shown in the
    /// job report.
    pub(super) late_dropped: Option<Arc<AtomicU64>>,
    /// A keyed operator's state handle, filled from a final checkpoint.
    pub(super) publish_restored: Option<PublishRestored>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum EdgeKind {
    /// Forward when both sides have the same parallelism, else rebalance.
    Auto,
    Hash,
    /// Forward, chosen explicitly: both sides must have the same
    /// parallelism.
    Forward,
    Rebalance,
    Broadcast,
}

/// One operator that produces a stream, and how its records are
/// partitioned towards the stream's consumer.
#[derive(Clone, Copy)]
pub(super) struct Producer {
    pub(super) operator: usize,
    pub(super) partition: EdgeKind,
}

pub(super) struct EdgeSpec {
    pub(super) from: usize,
    pub(super) to: usize,
    pub(super) kind: EdgeKind,
    pub(super) key_hash: Option<Arc<dyn Any + Send + Sync>>,
    pub(super) feedback: bool,
}

#[derive(Default)]
pub(super) struct GraphSpec {
    pub(super) operators: Vec<OperatorSpec>,
    pub(super) edges: Vec<EdgeSpec>,
    /// Mistakes found while declaring; the first is returned by `run`.
    pub(super) errors: Vec<JobError>,
    /// Iteration heads not closed yet.
    pub(super) open_loops: Vec<usize>,
}
