//! Event-time and processing-time timers of keyed process functions.
//!
//! A timer is keyed state: per key, the sorted times it fires at (one
//! list per [`TimeDomain`]), in a [`KeyedState`] of its own, snapshotted
//! by key group next to the user's per-key state, so timers rescale with
//! their keys. An index by time per domain (rebuilt on restore, never
//! stored) lets the watermark fire every due event-time timer in
//! timestamp order, before the shell sends the watermark on, and the
//! shell's periodic tick fire every processing-time timer the [`Clock`]
//! has passed. Both run on the operator's actor, between batches, never
//! concurrently with a record.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::job::{Collector, Core, Data, Key};
use crate::keyed::{key_hash, parts_in_range, KeyedState, MaxParallelism};
use crate::protocol::CheckpointId;
use crate::runtime::BoxError;
use crate::state::Snapshot;

use super::clock::Clock;

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
}

/// The stored state of a timed keyed operator: the user's key groups, the
/// timers' key groups (both in the keyed-state envelope of
/// [`crate::job`]), and the watermark the core last saw. This and
/// [`decode_timed_state`] are the only places that know this layout.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct TimedState {
    user: Vec<u8>,
    timers: Vec<u8>,
    watermark_ms: Option<u64>,
}

pub(crate) fn encode_timed_state(state: &TimedState) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_allocvec(state)
}

pub(crate) fn decode_timed_state(bytes: &[u8]) -> Result<TimedState, postcard::Error> {
    postcard::from_bytes(bytes)
}

/// A stored timed state made of its pieces, as [`timed_state_pieces`]
/// gives them back: for tests of readers that have no types.
#[cfg(test)]
pub(crate) fn timed_state_of_pieces(
    user: Vec<u8>,
    timers: Vec<u8>,
    watermark_ms: Option<u64>,
) -> Vec<u8> {
    encode_timed_state(&TimedState {
        user,
        timers,
        watermark_ms,
    })
    .expect("a timed state encodes")
}

/// A stored timed state's pieces, for describing it without its types
/// (`job::inspect`'s layout): the user's keyed-state bytes, the timers'
/// keyed-state bytes and the watermark. `None` unless `bytes` are exactly
/// one timed state, nothing after it.
pub(crate) fn timed_state_pieces(bytes: &[u8]) -> Option<(Vec<u8>, Vec<u8>, Option<u64>)> {
    let (state, rest): (TimedState, &[u8]) = postcard::take_from_bytes(bytes).ok()?;
    rest.is_empty()
        .then_some((state.user, state.timers, state.watermark_ms))
}

/// The stored states of the old subtasks of a timed operator, for
/// `parallelism` new subtasks: each gets the union of the key groups (it
/// keeps its own range on restore), and the lowest watermark any old
/// subtask had seen (`None` if one had none), which no new subtask has
/// passed.
pub(crate) fn rescale_timed_states(
    states: &[Vec<u8>],
    parallelism: usize,
) -> Result<Vec<Vec<u8>>, String> {
    let decoded = states
        .iter()
        .map(|state| decode_timed_state(state).map_err(|error| error.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let users: Vec<Vec<u8>> = decoded.iter().map(|state| state.user.clone()).collect();
    let timers: Vec<Vec<u8>> = decoded.iter().map(|state| state.timers.clone()).collect();
    let watermark_ms = decoded
        .iter()
        .map(|state| state.watermark_ms)
        .min()
        .flatten();
    let merged = TimedState {
        user: crate::job::merge_keyed_states(&users)?,
        timers: crate::job::merge_keyed_states(&timers)?,
        watermark_ms,
    };
    let bytes = encode_timed_state(&merged).map_err(|error| error.to_string())?;
    Ok(vec![bytes; parallelism])
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

/// The keyed process core with event-time and processing-time timers;
/// `KF` and `R` as in [`TimedFns`].
pub(crate) struct TimedKeyedCore<
    K,
    S,
    In,
    Out: Send + 'static,
    KF: ?Sized = dyn Fn(&In) -> K + Send + Sync,
    R: ?Sized = TimedFn<K, S, In, Out>,
> {
    fns: TimedFns<K, S, In, Out, KF, R>,
    states: KeyedState<K, S>,
    timers: KeyedState<K, KeyTimers>,
    /// Per domain, due times → keys registered at them; an entry whose
    /// key no longer holds that time (deleted) is skipped when it comes
    /// due.
    due: [BTreeMap<u64, Vec<K>>; 2],
    watermark_ms: Option<u64>,
    /// The clock's reading at the last processing-time firing.
    fired_processing_ms: Option<u64>,
    time: ProcessingTime,
    ops: Vec<TimerOp>,
    _records: PhantomData<fn(In) -> Out>,
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
    /// Empty state for `subtask` of `parallelism`.
    ///
    /// # Panics
    ///
    /// If `subtask` or `parallelism` do not fit `max_parallelism`: the plan
    /// checked both before anything started, so this is a bug.
    pub(crate) fn new(
        (max_parallelism, parallelism, subtask): (MaxParallelism, usize, usize),
        fns: TimedFns<K, S, In, Out, KF, R>,
        time: ProcessingTime,
    ) -> Self {
        TimedKeyedCore {
            fns,
            states: subtask_state(max_parallelism, parallelism, subtask),
            timers: subtask_state(max_parallelism, parallelism, subtask),
            due: [BTreeMap::new(), BTreeMap::new()],
            watermark_ms: None,
            fired_processing_ms: None,
            time,
            ops: Vec::new(),
            _records: PhantomData,
        }
    }

    /// Applies the timer calls the last function call made for `key`.
    fn apply_ops(&mut self, key: &K) {
        for op in self.ops.drain(..) {
            match op {
                TimerOp::Register(domain, timestamp_ms) => {
                    if self.timers.get_or_default(key).insert(domain, timestamp_ms) {
                        self.due[slot(domain)]
                            .entry(timestamp_ms)
                            .or_default()
                            .push(key.clone());
                    }
                }
                TimerOp::Delete(domain, timestamp_ms) => {
                    let now_empty = self.timers.get_mut(key).is_some_and(|timers| {
                        timers.remove(domain, timestamp_ms) && timers.is_empty()
                    });
                    if now_empty {
                        self.timers.remove(key);
                    }
                }
            }
        }
    }

    /// Removes `key`'s state when it has no timer left and the prune rule
    /// says its state holds nothing.
    fn maybe_prune(&mut self, key: &K) {
        let Some(prune) = self.fns.prune else {
            return;
        };
        if self.timers.get(key).is_none() && self.states.get(key).is_some_and(prune) {
            self.states.remove(key);
        }
    }

    /// Removes `key`'s timer at `timestamp_ms`; false when it was deleted.
    fn take_timer(&mut self, key: &K, domain: TimeDomain, timestamp_ms: u64) -> bool {
        let Some(timers) = self.timers.get_mut(key) else {
            return false;
        };
        let taken = timers.remove(domain, timestamp_ms);
        if timers.is_empty() {
            self.timers.remove(key);
        }
        taken
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
        let due_map = &mut self.due[slot(domain)];
        let mut due = Vec::new();
        while let Some(entry) = due_map.first_entry() {
            if *entry.key() > through_ms {
                break;
            }
            due.push(entry.remove_entry());
        }
        for (timestamp_ms, keys) in due {
            for key in keys {
                if !self.take_timer(&key, domain, timestamp_ms) {
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
                self.apply_ops(&key);
                result?;
                self.maybe_prune(&key);
            }
        }
        Ok(())
    }
}

/// Empty keyed state of one subtask.
fn subtask_state<K: Key, V: Snapshot + Default + Clone>(
    max_parallelism: MaxParallelism,
    parallelism: usize,
    subtask: usize,
) -> KeyedState<K, V> {
    KeyedState::for_subtask(max_parallelism, parallelism as u32, subtask as u32)
        .unwrap_or_else(|error| panic!("bug: the plan let through {error}"))
}

impl<K, S, In, Out, KF, R> Core<In, Out> for TimedKeyedCore<K, S, In, Out, KF, R>
where
    K: Key,
    S: Snapshot + Default + Clone + 'static,
    In: Data,
    Out: Data,
    KF: Fn(&In) -> K + ?Sized + 'static,
    R: Fn(&K, &mut S, In, &mut Timers<'_>, &mut Collector<'_, Out>) -> Result<(), BoxError>
        + ?Sized
        + 'static,
{
    fn process(&mut self, batch: Vec<In>, out: &mut Collector<'_, Out>) -> Result<(), BoxError> {
        for record in batch {
            let key = (self.fns.key_of)(&record);
            let state = self.states.get_or_default_routed(&key, key_hash(&key));
            let mut timers = Timers {
                ops: &mut self.ops,
                watermark_ms: self.watermark_ms,
                clock: &*self.time.clock,
                fired_processing_ms: self.fired_processing_ms,
                firing: None,
            };
            let result = (self.fns.on_record)(&key, state, record, &mut timers, out);
            // Most records register nothing (a window's timers come with
            // its first record): no call for them.
            if !self.ops.is_empty() {
                self.apply_ops(&key);
            }
            result?;
        }
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

    fn snapshot(&mut self, _checkpoint: CheckpointId) -> Result<Vec<u8>, BoxError> {
        let user: Vec<(u32, Vec<u8>)> = self.states.snapshot()?.into_parts().collect();
        let timers: Vec<(u32, Vec<u8>)> = self.timers.snapshot()?.into_parts().collect();
        let state = TimedState {
            user: crate::job::encode_keyed_state(&user)?,
            timers: crate::job::encode_keyed_state(&timers)?,
            watermark_ms: self.watermark_ms,
        };
        Ok(encode_timed_state(&state)?)
    }

    fn capture(&mut self) -> Result<Vec<u8>, BoxError> {
        // Encoding keyed state and timers has no side effect.
        self.snapshot(CheckpointId(0))
    }

    fn restore(&mut self, state: Option<&[u8]>) -> Result<(), BoxError> {
        let Some(state) = state else {
            return Ok(());
        };
        let state = decode_timed_state(state)?;
        let (max_parallelism, range) = (self.states.max_parallelism(), self.states.range());
        let user = crate::job::decode_keyed_state(&state.user)?;
        self.states = KeyedState::restore(max_parallelism, range, parts_in_range(range, user))?;
        let timers = crate::job::decode_keyed_state(&state.timers)?;
        self.timers = KeyedState::restore(max_parallelism, range, parts_in_range(range, timers))?;
        self.watermark_ms = state.watermark_ms;
        self.due = [BTreeMap::new(), BTreeMap::new()];
        for (key, timers) in self.timers.iter() {
            for (domain, times) in [
                (TimeDomain::EventTime, &timers.event_time_ms),
                (TimeDomain::ProcessingTime, &timers.processing_time_ms),
            ] {
                for &timestamp_ms in times {
                    self.due[slot(domain)]
                        .entry(timestamp_ms)
                        .or_default()
                        .push(key.clone());
                }
            }
        }
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

    #[test]
    fn rescaling_keeps_the_lowest_watermark() {
        let state = |watermark_ms| {
            let empty = crate::job::encode_keyed_state(&[]).expect("encodes");
            encode_timed_state(&TimedState {
                user: empty.clone(),
                timers: empty,
                watermark_ms,
            })
            .expect("encodes")
        };
        let rescaled =
            rescale_timed_states(&[state(Some(9)), state(Some(4))], 3).expect("rescales");
        assert_eq!(rescaled.len(), 3);
        let first = decode_timed_state(&rescaled[0]).expect("decodes");
        assert_eq!(first.watermark_ms, Some(4));
        let none = rescale_timed_states(&[state(Some(9)), state(None)], 1).expect("rescales");
        assert_eq!(
            decode_timed_state(&none[0]).expect("decodes").watermark_ms,
            None
        );
    }
}
