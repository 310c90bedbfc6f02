//! Per-key time-to-live of keyed `process` state ([`StateTtl`]), as
//! Flink users prune state: a key's state is removed once no record of
//! the key came for the time-to-live, and is then absent from
//! checkpoints; the key's next record starts from `S::default()`.
//!
//! It is built on the timed keyed core: each key's state carries its
//! expiry, and one timer per key (event or processing time) checks it
//! when it comes due, moving itself on if a record refreshed the expiry
//! meanwhile, so a record costs a comparison, not a timer. A record that
//! finds its key's expiry passed (the moved timer has not fired yet)
//! starts from `S::default()` too. It never reads a clock itself (the
//! timers do) and never touches other keys.

use std::sync::Arc;

use crate::job::{Collector, Data, Key, KeyedStream, Stream};
use crate::runtime::BoxError;
use crate::state::Snapshot;

use super::timers::{TimeDomain, TimedFn, Timers};
use crate::watermark::TimestampFn;

/// Why a [`StateTtl`] cannot be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TtlError {
    /// A time-to-live of 0 would remove state before it is used.
    #[error("a state time-to-live must be above 0 ms")]
    Zero,
}

/// How long a key's state lives after its last record, and on which
/// time.
///
/// - [`StateTtl::event_time`]: the state of a key whose latest record had
///   event time `ts` is removed once the operator's watermark reaches
///   `ts + ttl_ms` (end of input removes all of it). The stream needs
///   event time ([`Stream::assign_timestamps`]).
/// - [`StateTtl::processing_time`]: removed once the job's
///   [`JobConfig::clock`](crate::job::JobConfig::clock) reads `ttl_ms`
///   past the key's last record; state that expired while the job was
///   down is removed on restore, before any record.
pub struct StateTtl<T> {
    ttl_ms: u64,
    domain: TimeDomain,
    timestamp_of: Option<TimestampFn<T>>,
}

impl<T> StateTtl<T> {
    /// Time-to-live on event time, with the record's event time given by
    /// `timestamp_of` (the same as the source's strategy's).
    ///
    /// ```
    /// use snapflow::time::{StateTtl, TtlError};
    ///
    /// assert!(StateTtl::event_time(60_000, |event: &(u32, u64)| event.1).is_ok());
    /// assert_eq!(StateTtl::event_time(0, |event: &(u32, u64)| event.1).err(), Some(TtlError::Zero));
    /// ```
    pub fn event_time(
        ttl_ms: u64,
        timestamp_of: impl Fn(&T) -> u64 + Send + Sync + 'static,
    ) -> Result<StateTtl<T>, TtlError> {
        if ttl_ms == 0 {
            return Err(TtlError::Zero);
        }
        Ok(StateTtl {
            ttl_ms,
            domain: TimeDomain::EventTime,
            timestamp_of: Some(Arc::new(timestamp_of)),
        })
    }

    /// Time-to-live on processing time.
    pub fn processing_time(ttl_ms: u64) -> Result<StateTtl<T>, TtlError> {
        if ttl_ms == 0 {
            return Err(TtlError::Zero);
        }
        Ok(StateTtl {
            ttl_ms,
            domain: TimeDomain::ProcessingTime,
            timestamp_of: None,
        })
    }
}

/// A key's state with its expiry.
#[derive(crate::Snapshot, Clone, Default)]
#[snapshot(crate = "crate")]
pub(crate) struct Expiring<S: Snapshot + Default + Clone> {
    #[snapshot(nested)]
    value: S,
    /// The state goes once its time reaches this.
    expires_ms: u64,
    /// Where the key's one timer is (`None`: no timer yet).
    timer_ms: Option<u64>,
    /// The timer found the state expired: the core removes it.
    expired: bool,
}

impl<S: Snapshot + Default + Clone> Expiring<S> {
    fn is_expired(&self) -> bool {
        self.expired
    }
}

impl<'j, K, T, F> KeyedStream<'j, K, T, F>
where
    K: Key,
    T: Data,
    F: Fn(&T) -> K + Send + Sync + ?Sized + 'static,
{
    /// As [`KeyedStream::process`], and a key's state is removed `ttl`
    /// after the key's last record (see [`StateTtl`]); its next record
    /// then starts from `S::default()`.
    ///
    /// ```
    /// use snapflow::job::{Job, JobConfig};
    /// use snapflow::sink::CollectHandle;
    /// use snapflow::source::VecSourceFactory;
    /// use snapflow::time::{StateTtl, WatermarkStrategy};
    /// use snapflow::Snapshot;
    ///
    /// #[derive(Snapshot, Default, Clone)]
    /// struct Count {
    ///     events: u64,
    /// }
    ///
    /// // (user, event time): user 1's count starts again, as its state
    /// // expired when the watermark passed 12 s (one record per batch, so
    /// // a watermark follows each).
    /// let events = vec![(1u32, 1_000u64), (1, 2_000), (2, 30_000), (1, 40_000)];
    /// let job = Job::new("ttl", JobConfig { batch_size_max: 1, ..JobConfig::default() });
    /// let counts = CollectHandle::new();
    /// job.source("events", VecSourceFactory::new(events))
    ///     .assign_timestamps(WatermarkStrategy::bounded_out_of_orderness(0, |e: &(u32, u64)| e.1))
    ///     .key_by(|e: &(u32, u64)| e.0)
    ///     .process_with_ttl("count", StateTtl::event_time(10_000, |e: &(u32, u64)| e.1)?,
    ///         |user: &u32, count: &mut Count, _e, out| {
    ///             count.events += 1;
    ///             out.emit((*user, count.events));
    ///             Ok(())
    ///         })
    ///     .sink("out", counts.clone());
    /// job.run()?;
    /// assert_eq!(counts.committed(), [(1, 1), (1, 2), (2, 1), (1, 1)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn process_with_ttl<S, U>(
        self,
        name: &str,
        ttl: StateTtl<T>,
        function: impl Fn(&K, &mut S, T, &mut Collector<'_, U>) -> Result<(), BoxError>
            + Send
            + Sync
            + 'static,
    ) -> Stream<'j, U>
    where
        S: Snapshot + Default + Clone + Send + Sync + 'static,
        U: Data,
    {
        let domain = ttl.domain;
        let (on_record, on_timer) = ttl_functions(ttl, function);
        let ticks = domain == TimeDomain::ProcessingTime;
        self.timed(name, on_record, on_timer, Some(Expiring::is_expired), ticks)
    }
}

/// The erased record and timer functions of a `process_with_ttl`.
type TtlFns<K, S, T, U> = (
    Arc<TimedFn<K, Expiring<S>, T, U>>,
    Arc<TimedFn<K, Expiring<S>, u64, U>>,
);

/// The record function (refreshes the key's expiry, sets its one timer
/// if it has none, runs the user's function) and the timer function
/// (moves the timer on, or marks the state expired) of a time-to-live.
fn ttl_functions<K, S, T, U>(
    ttl: StateTtl<T>,
    function: impl Fn(&K, &mut S, T, &mut Collector<'_, U>) -> Result<(), BoxError>
        + Send
        + Sync
        + 'static,
) -> TtlFns<K, S, T, U>
where
    K: 'static,
    T: 'static,
    S: Snapshot + Default + Clone + 'static,
    U: Send + 'static,
{
    let StateTtl {
        ttl_ms,
        domain,
        timestamp_of,
    } = ttl;
    let on_record: Arc<TimedFn<K, Expiring<S>, T, U>> = Arc::new(
        move |key: &K,
              state: &mut Expiring<S>,
              record: T,
              timers: &mut Timers<'_>,
              out: &mut Collector<'_, U>| {
            let now_ms = match &timestamp_of {
                Some(timestamp_of) => timestamp_of(&record),
                None => timers.current_processing_time_ms(),
            };
            // State whose expiry time has passed is gone, even when its
            // timer (moved on lazily) has not fired yet.
            let passed = timers.fired_through_ms(domain);
            if state.timer_ms.is_some() && passed.is_some_and(|at| at >= state.expires_ms) {
                state.value = S::default();
                state.expires_ms = 0;
            }
            // A record older than its key's latest (out of order) does not
            // shorten the expiry.
            state.expires_ms = state.expires_ms.max(now_ms.saturating_add(ttl_ms));
            if state.timer_ms.is_none() {
                timers.register_ms(domain, state.expires_ms);
                state.timer_ms = Some(state.expires_ms);
            }
            function(key, &mut state.value, record, out)
        },
    );
    let on_timer: Arc<TimedFn<K, Expiring<S>, u64, U>> = Arc::new(
        move |_key: &K,
              state: &mut Expiring<S>,
              timestamp_ms: u64,
              timers: &mut Timers<'_>,
              _out: &mut Collector<'_, U>| {
            if state.expires_ms > timestamp_ms {
                // Refreshed since the timer was set: it moves on.
                timers.register_ms(domain, state.expires_ms);
                state.timer_ms = Some(state.expires_ms);
            } else {
                state.expired = true;
            }
            Ok(())
        },
    );
    (on_record, on_timer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Core, Router};
    use crate::keyed::MaxParallelism;
    use crate::protocol::CheckpointId;
    use crate::runtime::channel::Outputs;
    use crate::time::{ManualClock, ProcessingTime, TimedFns, TimedKeyedCore};

    #[derive(crate::Snapshot, Clone, Default)]
    #[snapshot(crate = "crate")]
    struct Count {
        records: u64,
    }

    type Event = (u32, u64);

    /// A timed core counting per key with a 10 s event-time time-to-live.
    fn core() -> TimedKeyedCore<u32, Expiring<Count>, Event, u64> {
        let ttl = StateTtl::event_time(10_000, |event: &Event| event.1).expect("valid");
        let (on_record, on_timer) =
            ttl_functions(ttl, |_key: &u32, count: &mut Count, _event: Event, out| {
                count.records += 1;
                out.emit(count.records);
                Ok(())
            });
        let fns = TimedFns {
            key_of: Arc::new(|event: &Event| event.0) as Arc<dyn Fn(&Event) -> u32 + Send + Sync>,
            on_record,
            on_timer,
            prune: Some(Expiring::is_expired),
            _records: std::marker::PhantomData,
        };
        let time = ProcessingTime {
            clock: Arc::new(ManualClock::new(0)),
            tick_ms: None,
        };
        TimedKeyedCore::new(
            (MaxParallelism::default(), 1, 0),
            fns,
            time,
            &super::super::timers::TimedStatePlan::default(),
        )
    }

    /// Feeds `events` then the watermark `watermark_ms` to a fresh core
    /// and returns its snapshot.
    fn snapshot_after(events: Vec<Event>, watermark_ms: u64) -> Vec<u8> {
        let mut core = core();
        core.restore(None).expect("starts fresh");
        let mut outputs: Outputs<u64, crate::job::Control> = Outputs::new(Vec::new());
        let mut router = Router::new(Vec::new());
        let mut out = Collector::new(&mut outputs, &mut router);
        core.process(events, &mut out).expect("processes");
        core.on_watermark(watermark_ms, &mut out).expect("fires");
        drop(out);
        core.snapshot(CheckpointId(1)).expect("snapshots")
    }

    #[test]
    fn expired_state_is_absent_from_the_snapshot() {
        // Key 1 expired at 11 s; key 2 lives until 15 s.
        let expired = snapshot_after(vec![(1, 1_000), (2, 5_000)], 11_000);
        let never_seen = snapshot_after(vec![(2, 5_000)], 11_000);
        assert_eq!(expired, never_seen, "nothing of key 1 is left");
        let alive = snapshot_after(vec![(1, 1_000), (2, 5_000)], 10_999);
        assert_ne!(alive, never_seen, "key 1 lives until its expiry");
    }
}
