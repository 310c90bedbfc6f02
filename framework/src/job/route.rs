//! Partitioners: which output channel each record of an operator instance
//! goes to, and the [`Collector`] user functions emit through.
//!
//! This module owns the routing rules (forward, rebalance, hash by key
//! group, broadcast, with the key groups and stable hash of [`crate::keyed`]). It never sends anything itself (the channel does) and never
//! allocates per record: routing a record is an index computation and one
//! push onto an open batch (a broadcast edge pushes a clone of the record
//! onto each of its channels but one, as fan-out to several edges does).

use std::sync::Arc;

use crate::keyed::MaxParallelism;
use crate::runtime::channel::Outputs;

use super::shell::Control;

/// A key function erased to "record to key hash".
pub(crate) type KeyHash<T> = Arc<dyn Fn(&T) -> u64 + Send + Sync>;

/// How the records of one logical edge are spread over its channels.
pub(crate) enum RouteKind<T> {
    /// To the one channel of this edge (same parallelism on both sides).
    Forward,
    /// Round robin over the downstream subtasks.
    Rebalance,
    /// By key group of the record's key.
    Hash {
        key_hash: KeyHash<T>,
        max_parallelism: MaxParallelism,
    },
    /// A copy to every downstream subtask.
    Broadcast,
}

impl<T> Clone for RouteKind<T> {
    fn clone(&self) -> Self {
        match self {
            RouteKind::Forward => RouteKind::Forward,
            RouteKind::Rebalance => RouteKind::Rebalance,
            RouteKind::Broadcast => RouteKind::Broadcast,
            RouteKind::Hash {
                key_hash,
                max_parallelism,
            } => RouteKind::Hash {
                key_hash: Arc::clone(key_hash),
                max_parallelism: *max_parallelism,
            },
        }
    }
}

/// One logical output edge of an instance: its channels are outputs
/// `first..first + count`, ordered by downstream subtask.
pub(crate) struct EdgeRoute<T> {
    pub(crate) first: usize,
    pub(crate) count: usize,
    pub(crate) kind: RouteKind<T>,
    next: usize,
}

impl<T> EdgeRoute<T> {
    pub(crate) fn new(first: usize, count: usize, kind: RouteKind<T>, subtask: usize) -> Self {
        EdgeRoute {
            first,
            count,
            kind,
            // Start the round robin at a different channel per subtask, so
            // small inputs do not all land on downstream subtask 0.
            next: subtask,
        }
    }

    /// The one channel a record goes to; a broadcast edge's records go to
    /// every channel (see [`EdgeRoute::send`]), not through here.
    #[inline]
    fn pick(&mut self, record: &T) -> usize {
        let offset = match &self.kind {
            RouteKind::Forward | RouteKind::Broadcast => 0,
            RouteKind::Rebalance => {
                self.next = (self.next + 1) % self.count;
                self.next
            }
            RouteKind::Hash {
                key_hash,
                max_parallelism,
            } => {
                let group = max_parallelism.key_group_of(key_hash(record));
                // Cannot fail: the plan checked every parallelism against
                // the max parallelism, and `group` comes from it.
                max_parallelism
                    .subtask_for_key_group(self.count as u32, group)
                    .unwrap_or(0) as usize
            }
        };
        self.first + offset
    }
}

impl<T: Clone + Send + 'static> EdgeRoute<T> {
    /// Sends `record` on this edge: to the channel it picks, or a copy to
    /// each channel of a broadcast edge.
    #[inline]
    fn send(&mut self, record: T, outputs: &mut Outputs<T, Control>) {
        if let RouteKind::Broadcast = self.kind {
            for output in self.first + 1..self.first + self.count {
                outputs.emit(output, record.clone());
            }
            outputs.emit(self.first, record);
            return;
        }
        let output = self.pick(&record);
        outputs.emit(output, record);
    }
}

/// Every logical output edge of one instance.
pub(crate) struct Router<T> {
    pub(crate) edges: Vec<EdgeRoute<T>>,
}

impl<T: Clone + Send + 'static> Router<T> {
    /// Sends `record` on every logical output edge (cloning for all but
    /// the last); drops it when there is none (a sink).
    #[inline]
    pub(crate) fn route(&mut self, record: T, outputs: &mut Outputs<T, Control>) {
        let Some((last, rest)) = self.edges.split_last_mut() else {
            return;
        };
        for edge in rest {
            edge.send(record.clone(), outputs);
        }
        last.send(record, outputs);
    }
}

/// Where a user function emits its output records.
pub struct Collector<'a, T: Send + 'static> {
    outputs: &'a mut Outputs<T, Control>,
    router: &'a mut Router<T>,
    emitted: u64,
}

impl<'a, T: Clone + Send + 'static> Collector<'a, T> {
    pub(crate) fn new(outputs: &'a mut Outputs<T, Control>, router: &'a mut Router<T>) -> Self {
        Collector {
            outputs,
            router,
            emitted: 0,
        }
    }

    /// Emits one record downstream.
    #[inline]
    pub fn emit(&mut self, record: T) {
        self.emitted += 1;
        self.router.route(record, self.outputs);
    }

    /// How many records were emitted through this collector.
    pub(crate) fn emitted(&self) -> u64 {
        self.emitted
    }
}
