//! The keyed process function with timers, added to job's
//! [`KeyedStream`] from this room: [`KeyedStream::process_with_timers`],
//! and the timed operator the windows and state time-to-live build on.
//!
//! This file owns only the wiring of the timed keyed core (`timers.rs`)
//! into a job's graph, through the keyed stream's `keyed_stage`, so that
//! `job` never imports `time`. It never runs a core and never knows the
//! stored layout.

use std::marker::PhantomData;
use std::sync::Arc;

use crate::job::{Collector, Core, CoreFactory, Data, JobConfig, Key, KeyedStream, Stream};
use crate::keyed::MaxParallelism;
use crate::runtime::BoxError;
use crate::state::Snapshot;

use super::timed_state::rescale_timed_states;
use super::timers::{ProcessingTime, TimedFn, TimedFns, TimedKeyedCore, TimedStatePlan, Timers};

impl<'j, K, T, F> KeyedStream<'j, K, T, F>
where
    K: Key,
    T: Data,
    F: Fn(&T) -> K + Send + Sync + ?Sized + 'static,
{
    /// A keyed process function with timers: `on_record` runs for each
    /// record as in [`KeyedStream::process`], with the key's [`Timers`];
    /// `on_timer(key, state, timestamp_ms, timers, out)` runs once the
    /// operator's watermark reaches a registered event time, in
    /// timestamp order, before the watermark is sent on (so its output
    /// comes first), or once the job's
    /// [`JobConfig::clock`](crate::job::JobConfig::clock) reaches a
    /// registered processing time ([`Timers::firing`] says which). Never
    /// concurrently with `on_record` on a subtask: both run on its actor.
    /// Timers are per-key state, stored by key group, so they are
    /// restored exactly-once and rescale with their keys. Event-time
    /// timers need event time ([`Stream::assign_timestamps`]), or they
    /// fire only at end of input. The operator checks its clock every
    /// [`JobConfig::processing_time_tick_ms`](crate::job::JobConfig::processing_time_tick_ms).
    pub fn process_with_timers<S, U>(
        self,
        name: &str,
        on_record: impl Fn(&K, &mut S, T, &mut Timers<'_>, &mut Collector<'_, U>) -> Result<(), BoxError>
            + Send
            + Sync
            + 'static,
        on_timer: impl Fn(&K, &mut S, u64, &mut Timers<'_>, &mut Collector<'_, U>) -> Result<(), BoxError>
            + Send
            + Sync
            + 'static,
    ) -> Stream<'j, U>
    where
        S: Snapshot + Default + Clone + Send + Sync + 'static,
        U: Data,
    {
        self.timed(name, Arc::new(on_record), Arc::new(on_timer), None, true)
    }

    /// The keyed process core with timers; a key's state is removed once
    /// its last timer fired and `prune` says it holds nothing (the windows
    /// use it: a key whose windows all closed leaves no state behind).
    /// Only with `ticks` does the operator check processing time (an
    /// event-time window never registers processing-time timers).
    pub(crate) fn timed<S, U, R>(
        self,
        name: &str,
        on_record: Arc<R>,
        on_timer: Arc<TimedFn<K, S, u64, U>>,
        prune: Option<fn(&S) -> bool>,
        ticks: bool,
    ) -> Stream<'j, U>
    where
        S: Snapshot + Default + Clone + Send + Sync + 'static,
        U: Data,
        R: Fn(&K, &mut S, T, &mut Timers<'_>, &mut Collector<'_, U>) -> Result<(), BoxError>
            + Send
            + Sync
            + ?Sized
            + 'static,
    {
        let make_core = move |key_of: Arc<F>, config: &JobConfig, incremental| {
            // Both kept as their concrete types: the core runs a batch
            // without an indirect call per record.
            let fns = TimedFns {
                key_of,
                on_record,
                on_timer,
                prune,
                _records: PhantomData,
            };
            let max_parallelism = MaxParallelism::new(config.max_parallelism).unwrap_or_default();
            let time = ProcessingTime {
                clock: Arc::clone(&config.clock),
                tick_ms: ticks.then_some(config.processing_time_tick_ms.max(1)),
            };
            let plan = TimedStatePlan {
                copy_on_write_threshold_keys: config.copy_on_write_threshold_keys,
                incremental,
            };
            let make_core: CoreFactory<T, U> =
                Arc::new(move |subtask: usize, parallelism: usize| {
                    Box::new(TimedKeyedCore::new(
                        (max_parallelism, parallelism, subtask),
                        fns.clone(),
                        time.clone(),
                        &plan,
                    )) as Box<dyn Core<T, U>>
                });
            make_core
        };
        self.keyed_stage(name, make_core, Arc::new(rescale_timed_states))
    }
}
