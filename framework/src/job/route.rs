//! Partitioners: which output channel each record of an operator instance
//! goes to, and the [`Collector`] user functions emit through.
//!
//! This module owns the routing rules (forward, rebalance, hash by key
//! group, broadcast, with the key groups and stable hash of [`crate::keyed`]). It never
//! sends anything itself (the channel does) and never allocates per record:
//! routing a record is an index computation and one push onto an open
//! batch (a broadcast edge pushes a clone of the record onto each of its
//! channels but one, as fan-out to several edges does).
//!
//! A whole batch (what a source read, or what a [`Collector`] buffered) is
//! routed by [`Router::route_batch`]. A hash edge runs one monomorphised
//! loop per batch: the user's key function, the stable hash, a key-group
//! table lookup (no division) and a push onto the vector of the record's
//! channel, with no indirect call per record; then each vector goes to its
//! channel whole. A forward edge hands the batch to its channel whole, and
//! the channel takes the vector itself when no batch is open.
//!
//! Known gap: the keyed operator downstream computes each record's key
//! again (as Flink's does); carrying it would need a typed side column in
//! the channel's batches.

use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::keyed::{self, KeyGroupError, MaxParallelism};
use crate::runtime::channel::Outputs;

use super::shell::Control;

/// A key function erased to "record to key hash", shared by every subtask
/// of an edge.
pub(crate) type KeyHash<T> = Arc<KeyHasher<T>>;

/// Where the records of one hash edge go: its first output and the
/// downstream subtask of every key group.
pub(crate) struct HashTarget<'a> {
    first: usize,
    /// The edge's channel count (its downstream subtasks).
    count: usize,
    subtasks: &'a [u32],
    max_parallelism: MaxParallelism,
}

impl<'a> HashTarget<'a> {
    /// The target of a hash edge whose `count` channels start at output
    /// `first`, with `subtasks` its key-group table.
    fn new(
        first: usize,
        count: usize,
        subtasks: &'a [u32],
        max_parallelism: MaxParallelism,
    ) -> Self {
        HashTarget {
            first,
            count,
            subtasks,
            max_parallelism,
        }
    }

    /// The downstream subtask of the key group of `key_hash`: the output's
    /// offset from the edge's first.
    #[inline]
    fn offset_of(&self, key_hash: u64) -> usize {
        let group = self.max_parallelism.key_group_of(key_hash) as usize;
        // Cannot miss: the table has an entry for every key group, and
        // `group` is below the max parallelism by construction.
        self.subtasks.get(group).copied().unwrap_or(0) as usize
    }

    /// The output of the subtask that owns the key group of `key_hash`.
    #[inline]
    pub(crate) fn output_of(&self, key_hash: u64) -> usize {
        self.first + self.offset_of(key_hash)
    }
}

/// Routes a whole batch over one hash edge, leaving the vector empty: the
/// user's key function, the stable hash and the push onto the channel in
/// one monomorphised loop.
trait Scatter<T>: Send + Sync {
    /// Pushes every record of `records` onto the output `target` names for
    /// its key, in order. `parts` is the edge's, one vector per output,
    /// kept between batches; it is left empty.
    fn scatter(
        &self,
        records: &mut Vec<T>,
        outputs: &mut Outputs<T, Control>,
        target: &HashTarget<'_>,
        parts: &mut Vec<Vec<T>>,
    ) where
        T: Send + 'static;
}

/// [`Scatter`] by a key function `F` with keys `K`.
struct ScatterByKey<F: ?Sized, K> {
    key_of: Arc<F>,
    _keys: PhantomData<fn() -> K>,
}

impl<T, K, F> Scatter<T> for ScatterByKey<F, K>
where
    K: Hash,
    F: Fn(&T) -> K + Send + Sync + ?Sized,
{
    fn scatter(
        &self,
        records: &mut Vec<T>,
        outputs: &mut Outputs<T, Control>,
        target: &HashTarget<'_>,
        parts: &mut Vec<Vec<T>>,
    ) where
        T: Send + 'static,
    {
        parts.resize_with(target.count, Vec::new);
        // A channel that takes a part whole hands back a vector without
        // capacity: reserve a fair share and a quarter, so that a part
        // grows at most about once per batch unless the keys are skewed.
        let share = records.len() / target.count.max(1);
        for part in parts.iter_mut() {
            part.reserve(share + share / 4);
        }
        for record in records.drain(..) {
            let hash = keyed::key_hash(&(self.key_of)(&record));
            // Cannot miss: the table holds subtasks below the edge's
            // channel count, which is the number of parts.
            if let Some(part) = parts.get_mut(target.offset_of(hash)) {
                part.push(record);
            }
        }
        for (offset, part) in parts.iter_mut().enumerate() {
            if !part.is_empty() {
                outputs.emit_all(target.first + offset, part);
            }
        }
    }
}

/// A key function erased to "record to key hash", in two forms: per
/// record, and as a whole-batch router. The batch form is one indirect call
/// per batch with the user's key function, the stable hash and the push
/// onto the channel inlined into one loop, so that the key function's
/// latency (the benchmark's key is a 64-bit division) overlaps with the
/// rest of the routing instead of running as a pass of its own.
pub(crate) struct KeyHasher<T> {
    one: Box<dyn Fn(&T) -> u64 + Send + Sync>,
    scatter: Box<dyn Scatter<T>>,
}

impl<T> KeyHasher<T> {
    /// Both forms of `key_of` followed by [`keyed::key_hash`]. With a
    /// concrete (not `dyn`) `F`, the batch form inlines `key_of`.
    pub(crate) fn new<K, F>(key_of: Arc<F>) -> Self
    where
        K: Hash + 'static,
        F: Fn(&T) -> K + Send + Sync + ?Sized + 'static,
    {
        let scatter = ScatterByKey {
            key_of: Arc::clone(&key_of),
            _keys: PhantomData,
        };
        KeyHasher {
            one: Box::new(move |record| keyed::key_hash(&key_of(record))),
            scatter: Box::new(scatter),
        }
    }

    /// The key hash of one record.
    #[inline]
    pub(crate) fn hash_one(&self, record: &T) -> u64 {
        (self.one)(record)
    }
}

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
    /// For a hash edge: the downstream subtask of every key group, for the
    /// current `count` (see [`MaxParallelism::subtask_table`]).
    subtasks: Vec<u32>,
    /// For a hash edge: one vector per channel, which its batch router
    /// fills and hands to the channel whole (see [`Scatter::scatter`]).
    parts: Vec<Vec<T>>,
}

impl<T> EdgeRoute<T> {
    pub(crate) fn new(first: usize, count: usize, kind: RouteKind<T>, subtask: usize) -> Self {
        let mut route = EdgeRoute {
            first,
            count: 0,
            kind,
            // Start the round robin at a different channel per subtask, so
            // small inputs do not all land on downstream subtask 0.
            next: subtask,
            subtasks: Vec::new(),
            parts: Vec::new(),
        };
        for _ in 0..count {
            // A count above the max parallelism leaves the table empty;
            // `add_channel` reports it when the wiring adds channels.
            let _ = route.add_channel();
        }
        route
    }

    /// Adds the next channel of the edge (the next downstream subtask) and
    /// recomputes the key-group table of a hash edge. Fails when a hash
    /// edge gets more channels than key groups (the plan checks every
    /// parallelism against the max parallelism first, so this is a bug in
    /// the wiring).
    pub(crate) fn add_channel(&mut self) -> Result<(), KeyGroupError> {
        self.count += 1;
        if let RouteKind::Hash {
            max_parallelism, ..
        } = &self.kind
        {
            self.subtasks = max_parallelism.subtask_table(self.count as u32)?;
        }
        Ok(())
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
                let hash = key_hash.hash_one(record);
                let target =
                    HashTarget::new(self.first, self.count, &self.subtasks, *max_parallelism);
                return target.output_of(hash);
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

impl<T: Send + 'static> EdgeRoute<T> {
    /// Routes every record of `records` (leaving it empty) when this edge
    /// has a batch fast path; returns false, touching nothing, when it has
    /// none (the caller then routes record by record).
    fn route_all(&mut self, records: &mut Vec<T>, outputs: &mut Outputs<T, Control>) -> bool {
        match &self.kind {
            RouteKind::Forward => outputs.emit_all(self.first, records),
            RouteKind::Hash {
                key_hash,
                max_parallelism,
            } => {
                let target =
                    HashTarget::new(self.first, self.count, &self.subtasks, *max_parallelism);
                key_hash
                    .scatter
                    .scatter(records, outputs, &target, &mut self.parts);
            }
            RouteKind::Rebalance | RouteKind::Broadcast => return false,
        }
        true
    }
}

/// Every logical output edge of one instance.
pub(crate) struct Router<T> {
    pub(crate) edges: Vec<EdgeRoute<T>>,
    /// The buffer of this instance's [`Collector`], kept between callbacks
    /// so that its capacity is reused.
    pub(crate) collected: Vec<T>,
}

impl<T> Router<T> {
    /// A router over `edges`.
    pub(crate) fn new(edges: Vec<EdgeRoute<T>>) -> Self {
        Router {
            edges,
            collected: Vec::new(),
        }
    }
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

    /// Routes every record of `records` in order, as [`Router::route`]
    /// would one by one, and leaves `records` empty (its capacity is kept
    /// for the next batch). A single forward or hash edge takes the batch
    /// fast path.
    pub(crate) fn route_batch(&mut self, records: &mut Vec<T>, outputs: &mut Outputs<T, Control>) {
        if let [edge] = self.edges.as_mut_slice() {
            if edge.route_all(records, outputs) {
                return;
            }
        }
        for record in records.drain(..) {
            self.route(record, outputs);
        }
    }
}

/// How many emitted records a [`Collector`] buffers before it routes them.
const COLLECT_BATCH_MAX: usize = 1024;

/// Where a user function emits its output records.
///
/// Emitted records are buffered and routed a batch at a time (at
/// 1,024 records, and when the callback returns), so that
/// the per-record cost is one push onto a vector; routing, the channel's
/// batch bookkeeping and the record counter run once per batch. The buffer
/// is the router's, reused from callback to callback. Order is kept: the
/// buffer is always routed before the shell pushes any control item.
pub struct Collector<'a, T: Send + 'static> {
    outputs: &'a mut Outputs<T, Control>,
    router: &'a mut Router<T>,
    buffer: Vec<T>,
    emitted: u64,
}

impl<'a, T: Clone + Send + 'static> Collector<'a, T> {
    pub(crate) fn new(outputs: &'a mut Outputs<T, Control>, router: &'a mut Router<T>) -> Self {
        let mut buffer = std::mem::take(&mut router.collected);
        // A forward edge takes the buffer itself as its next batch and
        // hands back an empty vector: reserve once here rather than grow
        // through every power of two.
        buffer.reserve(COLLECT_BATCH_MAX);
        Collector {
            buffer,
            outputs,
            router,
            emitted: 0,
        }
    }

    /// Emits one record downstream.
    #[inline]
    pub fn emit(&mut self, record: T) {
        self.buffer.push(record);
        if self.buffer.len() >= COLLECT_BATCH_MAX {
            self.flush();
        }
    }

    /// Routes the buffered records.
    fn flush(&mut self) {
        self.emitted += self.buffer.len() as u64;
        self.router.route_batch(&mut self.buffer, self.outputs);
    }

    /// Routes what is still buffered and returns how many records were
    /// emitted through this collector. The shell calls it when the user
    /// callback returns, before it pushes anything else.
    pub(crate) fn finish(&mut self) -> u64 {
        self.flush();
        self.emitted
    }
}

impl<T: Send + 'static> Drop for Collector<'_, T> {
    /// Hands the (empty) buffer back to the router for reuse. A collector
    /// dropped without `finish` (its callback failed, and the
    /// subtask with it) drops what it buffered.
    fn drop(&mut self) {
        self.buffer.clear();
        self.router.collected = std::mem::take(&mut self.buffer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyed::KeyedState;
    use crate::runtime::channel::{
        channel, ChannelConfig, ChannelId, Credit, Delivery, Item, Window,
    };
    use crate::runtime::Generation;
    use actix::{Actor, Context, Handler, System};
    use std::cell::RefCell;
    use std::collections::BTreeMap;
    use std::num::NonZeroUsize;
    use std::rc::Rc;

    /// The records each channel delivered, in order, by channel id.
    type Seen = Rc<RefCell<BTreeMap<u64, Vec<u64>>>>;

    /// Records every delivered batch; also stands in as the credit target.
    struct Receiver {
        seen: Seen,
    }

    impl Actor for Receiver {
        type Context = Context<Self>;
    }

    impl Handler<Delivery<u64, Control>> for Receiver {
        type Result = ();
        fn handle(&mut self, delivery: Delivery<u64, Control>, _: &mut Context<Self>) {
            if let Item::Batch(records) = delivery.item {
                let mut seen = self.seen.borrow_mut();
                seen.entry(delivery.channel.0).or_default().extend(records);
            }
        }
    }

    impl Handler<Credit> for Receiver {
        type Result = ();
        fn handle(&mut self, _: Credit, _: &mut Context<Self>) {}
    }

    /// Routes `records` over a hash edge to `parallelism` channels, once as
    /// a batch (the scatter) and once record by record, and returns what
    /// each channel received in each case (channels 0.. and 100..).
    fn route_both_ways(parallelism: usize, records: &[u64]) -> (Vec<Vec<u64>>, Vec<Vec<u64>>) {
        let runner = System::new();
        let seen: Seen = Rc::default();
        let receiver = runner.block_on(async {
            Receiver {
                seen: Rc::clone(&seen),
            }
            .start()
        });
        let config = ChannelConfig {
            batch_size_max: NonZeroUsize::new(7).unwrap(),
            batch_linger_ms: 1_000,
            window: Window::Unbounded,
        };
        let outputs = |first_id: u64| {
            let senders = (0..parallelism as u64)
                .map(|subtask| {
                    channel(
                        ChannelId(first_id + subtask),
                        Generation(1),
                        config,
                        receiver.clone().recipient(),
                        receiver.clone().recipient(),
                    )
                    .0
                })
                .collect();
            Outputs::new(senders)
        };
        let key_of = Arc::new(|record: &u64| record % 97);
        let router = || {
            let kind = RouteKind::Hash {
                key_hash: Arc::new(KeyHasher::new(Arc::clone(&key_of))),
                max_parallelism: MaxParallelism::default(),
            };
            Router::new(vec![EdgeRoute::new(0, parallelism, kind, 0)])
        };
        let (mut batched, mut single) = (outputs(0), outputs(100));
        let mut batch = records.to_vec();
        router().route_batch(&mut batch, &mut batched);
        assert!(batch.is_empty(), "the scatter leaves the batch empty");
        let mut one_by_one = router();
        records
            .iter()
            .for_each(|&record| one_by_one.route(record, &mut single));
        batched.flush_all();
        single.flush_all();
        runner.block_on(async {
            for _ in 0..10 {
                actix_rt::task::yield_now().await;
            }
        });
        let seen = seen.borrow();
        let received = |first_id: u64| {
            (first_id..first_id + parallelism as u64)
                .map(|id| seen.get(&id).cloned().unwrap_or_default())
                .collect()
        };
        (received(0), received(100))
    }

    /// The batch router sends each record where routing it alone would, in
    /// the same order, and that is the subtask whose keyed state owns the
    /// record's key (what `KeyedState::get_or_default_routed` relies on).
    fn check(parallelism: usize, records: &[u64]) {
        let (batched, single) = route_both_ways(parallelism, records);
        assert_eq!(batched, single, "parallelism {parallelism}");
        let received: usize = batched.iter().map(Vec::len).sum();
        assert_eq!(received, records.len(), "parallelism {parallelism}");
        for (subtask, records) in batched.iter().enumerate() {
            let state: KeyedState<u64, ()> = KeyedState::for_subtask(
                MaxParallelism::default(),
                parallelism as u32,
                subtask as u32,
            )
            .unwrap();
            for record in records {
                assert!(
                    state.owns(&(record % 97)),
                    "record {record} went to subtask {subtask} of {parallelism}"
                );
            }
        }
    }

    #[test]
    fn a_hash_edge_routes_a_batch_as_it_routes_each_record() {
        for parallelism in 1..=3 {
            check(parallelism, &[]);
            check(parallelism, &[5]);
            check(parallelism, &(0..1_000).collect::<Vec<_>>());
            check(
                parallelism,
                &(0..500).map(|i| i * 97 + 3).collect::<Vec<_>>(),
            );
        }
    }
}
