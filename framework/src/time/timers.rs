//! Event-time and processing-time timers of keyed process functions.
//!
//! A timer is keyed state: per key, the sorted times it fires at (one
//! list per [`TimeDomain`]), in a keyed table of its own (flat or
//! copy-on-write, `timed_table.rs`), snapshotted by key group next to the
//! user's per-key state, so timers rescale with their keys. An index by
//! time per domain (rebuilt on restore, never stored) lets the watermark
//! fire every due event-time timer in timestamp order, before the shell
//! sends the watermark on, and the shell's periodic tick fire every
//! processing-time timer the [`Clock`] has passed. Both run on the
//! operator's actor, between batches, never concurrently with a record.
//!
//! This module owns the timer service, the timed keyed core and its
//! per-record loop. It never knows the stored layout (`timed_state.rs`
//! does) and never encodes a table itself (`timed_table.rs` takes them
//! at a checkpoint).

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::job::{Collector, Core, Data, IncrementalCheckpoints, Key, KeyGroupLedger, TakenState};
use crate::keyed::{key_hash, CowKeyedState, MaxParallelism};
use crate::protocol::{CheckpointId, CheckpointKind};
use crate::runtime::BoxError;
use crate::state::Snapshot;
use crate::storage::Segment;

use super::timed_state::{decode_timed_state, encode_timed_state, TimedSnapshot, TimedState};
use super::timed_table::{RoutedLookup, TimedTable};
use crate::watermark::Clock;

/// The timer calls a function made while it ran, applied after it returns
/// (the function holds its key's state, not the timer tables).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimerOp {
    Register(TimeDomain, u64),
    Delete(TimeDomain, u64),
}

/// Which clock a timer follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimeDomain {
    /// Fires when the operator's watermark reaches the timer's time.
    EventTime,
    /// Fires when the job's [`Clock`] reaches the timer's time.
    ProcessingTime,
}

/// The timer service a timed process function gets for the current key.
pub struct Timers<'a> {
    ops: &'a mut Vec<TimerOp>,
    watermark_ms: Option<u64>,
    clock: &'a dyn Clock,
    /// The processing time through which timers have fired.
    fired_processing_ms: Option<u64>,
    firing: Option<TimeDomain>,
}

impl std::fmt::Debug for Timers<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Timers")
            .field("watermark_ms", &self.watermark_ms)
            .field("fired_processing_ms", &self.fired_processing_ms)
            .field("firing", &self.firing)
            .finish_non_exhaustive()
    }
}

impl Timers<'_> {
    /// Fires `on_timer` for this key once the job's [`Clock`] reaches
    /// `timestamp_ms` (checked every
    /// [`JobConfig::processing_time_tick_ms`](crate::job::JobConfig::processing_time_tick_ms)).
    /// Registering the same key and time twice keeps one timer. A timer
    /// that came due while the job was down fires when it is restored,
    /// before any record; at end of input every pending processing-time
    /// timer fires (a bounded job's last processing-time window is not
    /// lost).
    pub fn register_processing_time_ms(&mut self, timestamp_ms: u64) {
        self.ops
            .push(TimerOp::Register(TimeDomain::ProcessingTime, timestamp_ms));
    }

    /// Deletes this key's processing-time timer at `timestamp_ms`, if
    /// there is one.
    pub fn delete_processing_time_ms(&mut self, timestamp_ms: u64) {
        self.ops
            .push(TimerOp::Delete(TimeDomain::ProcessingTime, timestamp_ms));
    }

    /// The job's processing time now, read from its [`Clock`].
    pub fn current_processing_time_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Which kind of timer is firing, in `on_timer`; `None` in
    /// `on_record`.
    pub fn firing(&self) -> Option<TimeDomain> {
        self.firing
    }

    /// The time through which timers of `domain` have fired: the
    /// watermark for event time, the clock's reading at the last firing
    /// for processing time (`None` before the first).
    pub(crate) fn fired_through_ms(&self, domain: TimeDomain) -> Option<u64> {
        match domain {
            TimeDomain::EventTime => self.watermark_ms,
            TimeDomain::ProcessingTime => self.fired_processing_ms,
        }
    }

    /// Registers a timer of `domain`.
    pub(crate) fn register_ms(&mut self, domain: TimeDomain, timestamp_ms: u64) {
        self.ops.push(TimerOp::Register(domain, timestamp_ms));
    }

    /// Deletes a timer of `domain`.
    pub(crate) fn delete_ms(&mut self, domain: TimeDomain, timestamp_ms: u64) {
        self.ops.push(TimerOp::Delete(domain, timestamp_ms));
    }

    /// Fires `on_timer` for this key once the watermark reaches
    /// `timestamp_ms`. Registering the same key and time twice keeps one
    /// timer. A time at or below the current watermark fires when the
    /// watermark next rises; at end of input (the last rise) such a
    /// timer registered by a firing timer never fires.
    pub fn register_event_time_ms(&mut self, timestamp_ms: u64) {
        self.ops
            .push(TimerOp::Register(TimeDomain::EventTime, timestamp_ms));
    }

    /// Deletes this key's timer at `timestamp_ms`, if there is one.
    pub fn delete_event_time_ms(&mut self, timestamp_ms: u64) {
        self.ops
            .push(TimerOp::Delete(TimeDomain::EventTime, timestamp_ms));
    }

    /// The operator's current watermark, `None` before the first.
    pub fn current_watermark_ms(&self) -> Option<u64> {
        self.watermark_ms
    }
}

/// One key's timers per domain: sorted, without duplicates.
#[derive(crate::Snapshot, Clone, Default, Debug, PartialEq, Eq)]
#[snapshot(crate = "crate")]
pub(crate) struct KeyTimers {
    event_time_ms: Vec<u64>,
    processing_time_ms: Vec<u64>,
}

impl KeyTimers {
    fn times_mut(&mut self, domain: TimeDomain) -> &mut Vec<u64> {
        match domain {
            TimeDomain::EventTime => &mut self.event_time_ms,
            TimeDomain::ProcessingTime => &mut self.processing_time_ms,
        }
    }

    /// Adds `timestamp_ms`; true when it was not there.
    fn insert(&mut self, domain: TimeDomain, timestamp_ms: u64) -> bool {
        let times = self.times_mut(domain);
        match times.binary_search(&timestamp_ms) {
            Ok(_) => false,
            Err(at) => {
                times.insert(at, timestamp_ms);
                true
            }
        }
    }

    /// Removes `timestamp_ms`; true when it was there.
    fn remove(&mut self, domain: TimeDomain, timestamp_ms: u64) -> bool {
        let times = self.times_mut(domain);
        match times.binary_search(&timestamp_ms) {
            Ok(at) => {
                times.remove(at);
                true
            }
            Err(_) => false,
        }
    }

    fn is_empty(&self) -> bool {
        self.event_time_ms.is_empty() && self.processing_time_ms.is_empty()
    }

    /// A key's timers at these event times (sorted, without duplicates).
    #[cfg(test)]
    pub(crate) fn at(event_time_ms: &[u64]) -> Self {
        KeyTimers {
            event_time_ms: event_time_ms.to_vec(),
            processing_time_ms: Vec::new(),
        }
    }
}

/// A timed process function's per-record or per-timer call, erased.
pub(crate) type TimedFn<K, S, I, Out> = dyn Fn(&K, &mut S, I, &mut Timers<'_>, &mut Collector<'_, Out>) -> Result<(), BoxError>
    + Send
    + Sync;

/// Gives `function` back: it only pins a closure's signature to a timed
/// per-record or per-timer call, so that the closure keeps its concrete
/// type (no `dyn`) and its parameters still get their higher-ranked
/// lifetimes.
pub(crate) fn timed_fn<K, S, I, Out, F>(function: F) -> F
where
    F: Fn(&K, &mut S, I, &mut Timers<'_>, &mut Collector<'_, Out>) -> Result<(), BoxError>,
{
    function
}

/// The functions of a timed keyed operator. `KF` (the key function) and
/// `R` (the per-record call) are concrete closure types on the job
/// builder's path, so that a batch runs as one loop without an indirect
/// call per record (as [`KeyedCore`](crate::job::KeyedCore) does), or
/// `dyn` (the defaults) where they are erased. The per-timer call stays
/// erased: it runs once per window or timer, not per record.
pub(crate) struct TimedFns<
    K,
    S,
    In,
    Out: Send + 'static,
    KF: ?Sized = dyn Fn(&In) -> K + Send + Sync,
    R: ?Sized = TimedFn<K, S, In, Out>,
> {
    pub(crate) key_of: Arc<KF>,
    pub(crate) on_record: Arc<R>,
    pub(crate) on_timer: Arc<TimedFn<K, S, u64, Out>>,
    /// Says when a key's state can go once its last timer fired (a key
    /// whose windows all closed); `None`: keys stay.
    pub(crate) prune: Option<fn(&S) -> bool>,
    pub(crate) _records: PhantomData<fn(&In)>,
}

impl<K, S, In, Out: Send + 'static, KF: ?Sized, R: ?Sized> Clone
    for TimedFns<K, S, In, Out, KF, R>
{
    fn clone(&self) -> Self {
        TimedFns {
            key_of: Arc::clone(&self.key_of),
            on_record: Arc::clone(&self.on_record),
            on_timer: Arc::clone(&self.on_timer),
            prune: self.prune,
            _records: PhantomData,
        }
    }
}

/// How a timed operator meets processing time: the job's clock, and how
/// often the shell ticks it (`None`: never; event-time windows register
/// no processing-time timers and cost nothing per tick).
#[derive(Clone)]
pub(crate) struct ProcessingTime {
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) tick_ms: Option<u64>,
}

/// The index of a domain's due map.
fn slot(domain: TimeDomain) -> usize {
    match domain {
        TimeDomain::EventTime => 0,
        TimeDomain::ProcessingTime => 1,
    }
}

/// How a timed core keeps its state: from how many keys a table moves to
/// the copy-on-write layout (`JobConfig::copy_on_write_threshold_keys`),
/// and, when checkpoints are incremental, their settings and the job's
/// record of which checkpoints are savepoints (written whole).
#[derive(Debug, Clone)]
pub(crate) struct TimedStatePlan {
    pub(crate) copy_on_write_threshold_keys: usize,
    pub(crate) incremental: Option<IncrementalCheckpoints>,
}

impl Default for TimedStatePlan {
    /// The default threshold and full checkpoints.
    fn default() -> Self {
        TimedStatePlan {
            copy_on_write_threshold_keys: crate::keyed::DEFAULT_COPY_ON_WRITE_THRESHOLD_KEYS,
            incremental: None,
        }
    }
}

/// A timed core's incremental checkpoints: one ledger per table (the
/// tables' slices are written and referred to independently, into one
/// part) and the job's savepoint marks.
#[derive(Debug)]
struct TimedIncremental {
    user: KeyGroupLedger,
    timers: KeyGroupLedger,
}

/// The timers of a timed core: per key, its sorted times (a keyed table
/// of its own, snapshotted beside the user's state), and per domain the
/// index by time (never stored, rebuilt on restore).
struct TimerBook<K> {
    table: TimedTable<K, KeyTimers>,
    /// Per domain, due times → keys registered at them; an entry whose
    /// key no longer holds that time (deleted) is skipped when it comes
    /// due.
    due: [BTreeMap<u64, Vec<K>>; 2],
}

impl<K: Key> TimerBook<K> {
    /// Applies the timer calls the last function call made for `key`.
    fn apply(&mut self, ops: &mut Vec<TimerOp>, key: &K) {
        for op in ops.drain(..) {
            match op {
                TimerOp::Register(domain, timestamp_ms) => {
                    if self.table.get_or_default(key).insert(domain, timestamp_ms) {
                        self.due[slot(domain)]
                            .entry(timestamp_ms)
                            .or_default()
                            .push(key.clone());
                    }
                }
                TimerOp::Delete(domain, timestamp_ms) => {
                    let now_empty = self.table.get_mut(key).is_some_and(|timers| {
                        timers.remove(domain, timestamp_ms) && timers.is_empty()
                    });
                    if now_empty {
                        self.table.remove(key);
                    }
                }
            }
        }
    }

    /// Removes `key`'s timer at `timestamp_ms`; false when it was deleted.
    fn take(&mut self, key: &K, domain: TimeDomain, timestamp_ms: u64) -> bool {
        let Some(timers) = self.table.get_mut(key) else {
            return false;
        };
        let taken = timers.remove(domain, timestamp_ms);
        if timers.is_empty() {
            self.table.remove(key);
        }
        taken
    }

    /// Takes every index entry of `domain` at or below `through_ms`, in
    /// timestamp order.
    fn take_due(&mut self, domain: TimeDomain, through_ms: u64) -> Vec<(u64, Vec<K>)> {
        let due_map = &mut self.due[slot(domain)];
        let mut due = Vec::new();
        while let Some(entry) = due_map.first_entry() {
            if *entry.key() > through_ms {
                break;
            }
            due.push(entry.remove_entry());
        }
        due
    }

    /// Rebuilds the index by time from the table (after a restore).
    fn rebuild_due(&mut self) {
        let mut due = [BTreeMap::new(), BTreeMap::new()];
        self.table.for_each(|key, timers| {
            for (domain, times) in [
                (TimeDomain::EventTime, &timers.event_time_ms),
                (TimeDomain::ProcessingTime, &timers.processing_time_ms),
            ] {
                for &timestamp_ms in times {
                    let keys: &mut Vec<K> = due[slot(domain)].entry(timestamp_ms).or_default();
                    keys.push(key.clone());
                }
            }
        });
        self.due = due;
    }
}

/// The keyed process core with event-time and processing-time timers;
/// `KF` and `R` as in [`TimedFns`]. Its two tables (the user's state and
/// the timers) each start flat and move to the copy-on-write layout at
/// the job's threshold (`timed_table.rs`), so a checkpoint of a large
/// state is handed off to the writer ([`TimedSnapshot`]).
pub(crate) struct TimedKeyedCore<
    K,
    S,
    In,
    Out: Send + 'static,
    KF: ?Sized = dyn Fn(&In) -> K + Send + Sync,
    R: ?Sized = TimedFn<K, S, In, Out>,
> {
    fns: TimedFns<K, S, In, Out, KF, R>,
    states: TimedTable<K, S>,
    book: TimerBook<K>,
    watermark_ms: Option<u64>,
    /// The clock's reading at the last processing-time firing.
    fired_processing_ms: Option<u64>,
    time: ProcessingTime,
    ops: Vec<TimerOp>,
    copy_on_write_threshold_keys: usize,
    incremental: Option<TimedIncremental>,
    _records: PhantomData<fn(In) -> Out>,
}

/// What a record's call needs besides its key's state, borrowed from the
/// core apart from the user's table, so that one loop serves both
/// layouts.
struct RecordRun<'c, K, S, In, Out: Send + 'static, KF: ?Sized, R: ?Sized> {
    fns: &'c TimedFns<K, S, In, Out, KF, R>,
    book: &'c mut TimerBook<K>,
    ops: &'c mut Vec<TimerOp>,
    watermark_ms: Option<u64>,
    clock: &'c dyn Clock,
    fired_processing_ms: Option<u64>,
}

impl<K, S, In, Out, KF, R> RecordRun<'_, K, S, In, Out, KF, R>
where
    K: Key,
    S: Snapshot + Default,
    Out: Send + 'static,
    KF: Fn(&In) -> K + ?Sized,
    R: Fn(&K, &mut S, In, &mut Timers<'_>, &mut Collector<'_, Out>) -> Result<(), BoxError>
        + ?Sized,
{
    /// Runs `batch` against `states`: key, stable hash, routed lookup,
    /// the user's function, and its timer calls when it made any.
    #[inline(always)]
    fn batch<T: RoutedLookup<K, S>>(
        &mut self,
        states: &mut T,
        batch: Vec<In>,
        out: &mut Collector<'_, Out>,
    ) -> Result<(), BoxError> {
        for record in batch {
            let key = (self.fns.key_of)(&record);
            let state = states.get_or_default_routed(&key, key_hash(&key));
            let mut timers = Timers {
                ops: self.ops,
                watermark_ms: self.watermark_ms,
                clock: self.clock,
                fired_processing_ms: self.fired_processing_ms,
                firing: None,
            };
            let result = (self.fns.on_record)(&key, state, record, &mut timers, out);
            // Most records register nothing (a window's timers come with
            // its first record): no call for them.
            if !self.ops.is_empty() {
                self.book.apply(self.ops, &key);
            }
            result?;
        }
        Ok(())
    }

    /// [`Self::batch`] for the copy-on-write layout, out of line so that
    /// the core's `process` keeps only the flat table's loop inline (as
    /// the keyed core does).
    #[inline(never)]
    fn cow_batch(
        &mut self,
        states: &mut CowKeyedState<K, S>,
        batch: Vec<In>,
        out: &mut Collector<'_, Out>,
    ) -> Result<(), BoxError> {
        self.batch(states, batch, out)
    }
}

impl<
        K: Key,
        S: Snapshot + Default + Clone + 'static,
        In: 'static,
        Out: Send + 'static,
        KF: ?Sized,
        R: ?Sized,
    > TimedKeyedCore<K, S, In, Out, KF, R>
{
    /// Empty state for `subtask` of `parallelism`, kept as `plan` says.
    ///
    /// # Panics
    ///
    /// If `subtask` or `parallelism` do not fit `max_parallelism`: the plan
    /// checked both before anything started, so this is a bug.
    pub(crate) fn new(
        (max_parallelism, parallelism, subtask): (MaxParallelism, usize, usize),
        fns: TimedFns<K, S, In, Out, KF, R>,
        time: ProcessingTime,
        plan: &TimedStatePlan,
    ) -> Self {
        let threshold = plan.copy_on_write_threshold_keys;
        let subtask = (parallelism as u32, subtask as u32);
        let states = TimedTable::for_subtask(max_parallelism, subtask, threshold)
            .unwrap_or_else(|error| panic!("bug: the plan let through {error}"));
        let timers = TimedTable::for_subtask(max_parallelism, subtask, threshold)
            .unwrap_or_else(|error| panic!("bug: the plan let through {error}"));
        let key_groups = states.range().len();
        let incremental = plan.incremental.map(|settings| TimedIncremental {
            user: KeyGroupLedger::new(settings, key_groups),
            timers: KeyGroupLedger::new(settings, key_groups),
        });
        TimedKeyedCore {
            fns,
            states,
            book: TimerBook {
                table: timers,
                due: [BTreeMap::new(), BTreeMap::new()],
            },
            watermark_ms: None,
            fired_processing_ms: None,
            time,
            ops: Vec::new(),
            copy_on_write_threshold_keys: threshold,
            incremental,
            _records: PhantomData,
        }
    }

    /// Moves either table to the copy-on-write layout once it is large
    /// (two comparisons when nothing moves).
    #[inline]
    fn convert_if_large(&mut self) {
        let threshold = self.copy_on_write_threshold_keys;
        self.states.convert_if_large(threshold);
        self.book.table.convert_if_large(threshold);
    }

    /// Removes `key`'s state when it has no timer left and the prune rule
    /// says its state holds nothing.
    fn maybe_prune(&mut self, key: &K) {
        let Some(prune) = self.fns.prune else {
            return;
        };
        if self.book.table.get(key).is_none() && self.states.get(key).is_some_and(prune) {
            self.states.remove(key);
        }
    }

    /// Fires every timer of `domain` at or below `through_ms`, in
    /// timestamp order. What is due is taken first: a timer that a firing
    /// registers at or below `through_ms` waits for the next rise, so a
    /// function that always registers again cannot loop forever.
    fn fire_due(
        &mut self,
        domain: TimeDomain,
        through_ms: u64,
        out: &mut Collector<'_, Out>,
    ) -> Result<(), BoxError> {
        for (timestamp_ms, keys) in self.book.take_due(domain, through_ms) {
            for key in keys {
                if !self.book.take(&key, domain, timestamp_ms) {
                    continue;
                }
                let state = self.states.get_or_default(&key);
                let mut timers = Timers {
                    ops: &mut self.ops,
                    watermark_ms: self.watermark_ms,
                    clock: &*self.time.clock,
                    fired_processing_ms: self.fired_processing_ms,
                    firing: Some(domain),
                };
                let result = (self.fns.on_timer)(&key, state, timestamp_ms, &mut timers, out);
                self.book.apply(&mut self.ops, &key);
                result?;
                self.maybe_prune(&key);
            }
        }
        // Firings may register timers of new keys.
        self.convert_if_large();
        Ok(())
    }
}

impl<K, S, In, Out, KF, R> Core<In, Out> for TimedKeyedCore<K, S, In, Out, KF, R>
where
    K: Key,
    S: Snapshot + Default + Clone + Send + Sync + 'static,
    In: Data,
    Out: Data,
    KF: Fn(&In) -> K + ?Sized + 'static,
    R: Fn(&K, &mut S, In, &mut Timers<'_>, &mut Collector<'_, Out>) -> Result<(), BoxError>
        + ?Sized
        + 'static,
{
    fn process(&mut self, batch: Vec<In>, out: &mut Collector<'_, Out>) -> Result<(), BoxError> {
        let mut run = RecordRun {
            fns: &self.fns,
            book: &mut self.book,
            ops: &mut self.ops,
            watermark_ms: self.watermark_ms,
            clock: &*self.time.clock,
            fired_processing_ms: self.fired_processing_ms,
        };
        // One match per batch, and a loop per layout.
        match &mut self.states {
            TimedTable::Flat(states) => run.batch(states, batch, out)?,
            TimedTable::CopyOnWrite(states) => run.cow_batch(states, batch, out)?,
        }
        // Between batches, and two comparisons when nothing moves.
        self.convert_if_large();
        Ok(())
    }

    fn on_watermark(
        &mut self,
        watermark_ms: u64,
        out: &mut Collector<'_, Out>,
    ) -> Result<(), BoxError> {
        self.watermark_ms = Some(watermark_ms);
        self.fire_due(TimeDomain::EventTime, watermark_ms, out)
    }

    fn processing_tick_ms(&self) -> Option<u64> {
        self.time.tick_ms
    }

    fn on_processing_time(&mut self, out: &mut Collector<'_, Out>) -> Result<(), BoxError> {
        // A clock that went back (a system clock stepped) fires nothing
        // new: what fired stays fired.
        let now_ms = self
            .time
            .clock
            .now_ms()
            .max(self.fired_processing_ms.unwrap_or(0));
        self.fired_processing_ms = Some(now_ms);
        self.fire_due(TimeDomain::ProcessingTime, now_ms, out)
    }

    fn on_end(&mut self, out: &mut Collector<'_, Out>) -> Result<(), BoxError> {
        // Every pending processing-time timer fires: no later tick comes.
        self.fire_due(TimeDomain::ProcessingTime, u64::MAX, out)
    }

    /// The whole state encoded now, on the operator's thread (for
    /// snapshots that are not checkpoints, and as the reference bytes of
    /// every other form).
    fn snapshot(&mut self, _checkpoint: CheckpointId) -> Result<Vec<u8>, BoxError> {
        let state = TimedState {
            user: self.states.encode_now()?,
            timers: self.book.table.encode_now()?,
            watermark_ms: self.watermark_ms,
        };
        Ok(encode_timed_state(&state)?)
    }

    /// What [`Self::take_state`] takes, encoded at once.
    fn snapshot_segments(
        &mut self,
        checkpoint: CheckpointId,
        kind: CheckpointKind,
    ) -> Result<Vec<Segment>, BoxError> {
        match self.take_state(checkpoint, kind)? {
            TakenState::Segments(segments) => Ok(segments),
            TakenState::Deferred(state) => state.encode(),
        }
    }

    /// Both tables taken as the keyed core takes its state: a flat table
    /// encodes here (whole, or its changed slices with incremental
    /// checkpoints), a copy-on-write table is handed off in time
    /// proportional to its key groups (its slices with incremental
    /// checkpoints) and encoded by the checkpoint writer. A savepoint, or
    /// a job without incremental checkpoints, writes both whole.
    fn take_state(
        &mut self,
        checkpoint: CheckpointId,
        kind: CheckpointKind,
    ) -> Result<TakenState, BoxError> {
        let incremental = self
            .incremental
            .as_mut()
            .filter(|_| kind != CheckpointKind::Savepoint);
        let (user_ledger, timer_ledger) = match incremental {
            Some(incremental) => (Some(&mut incremental.user), Some(&mut incremental.timers)),
            None => (None, None),
        };
        let snapshot = TimedSnapshot {
            user: self.states.take(checkpoint, user_ledger)?,
            timers: self.book.table.take(checkpoint, timer_ledger)?,
            watermark_ms: self.watermark_ms,
        };
        snapshot.into_taken()
    }

    fn on_complete(&mut self, checkpoint: CheckpointId) -> Result<(), BoxError> {
        if let Some(incremental) = &mut self.incremental {
            incremental.user.on_complete(checkpoint);
            incremental.timers.on_complete(checkpoint);
        }
        Ok(())
    }

    fn capture(&mut self) -> Result<Vec<u8>, BoxError> {
        // Encoding keyed state and timers has no side effect.
        self.snapshot(CheckpointId(0))
    }

    fn restore(&mut self, state: Option<&[u8]>) -> Result<(), BoxError> {
        if let Some(incremental) = &mut self.incremental {
            // Restored state was written by another instance: nothing of
            // it may be referred to, so the first checkpoint is full.
            incremental.user.reset();
            incremental.timers.reset();
        }
        let Some(state) = state else {
            return Ok(());
        };
        let state = decode_timed_state(state)?;
        let threshold = self.copy_on_write_threshold_keys;
        let user = crate::job::decode_keyed_state(&state.user)?;
        self.states.restore(user, threshold)?;
        let timers = crate::job::decode_keyed_state(&state.timers)?;
        self.book.table.restore(timers, threshold)?;
        self.watermark_ms = state.watermark_ms;
        self.book.rebuild_due();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_timers_are_sorted_and_deduplicated() {
        let mut timers = KeyTimers::default();
        let event = TimeDomain::EventTime;
        assert!(timers.insert(event, 30));
        assert!(timers.insert(event, 10));
        assert!(!timers.insert(event, 30), "one timer per (key, time)");
        assert!(timers.insert(event, 20));
        assert_eq!(timers.event_time_ms, [10, 20, 30]);
        assert!(timers.remove(event, 20));
        assert!(!timers.remove(event, 20));
        assert_eq!(timers.event_time_ms, [10, 30]);
        let processing = TimeDomain::ProcessingTime;
        assert!(timers.insert(processing, 30), "the domains are apart");
        assert!(timers.remove(event, 10) && timers.remove(event, 30));
        assert!(!timers.is_empty());
        assert!(timers.remove(processing, 30));
        assert!(timers.is_empty());
    }
}
