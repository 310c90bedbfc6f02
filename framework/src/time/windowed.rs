//! [`WindowedStream`]: a keyed stream cut into event-time windows, and
//! what can be computed over them (an incremental aggregate or count, a
//! reduce, a full-window function), with late records either counted and
//! dropped ([`DropLate`], the default) or sent on a stream of their own
//! ([`SideOutputLate`]).
//!
//! The operator is a keyed process function with event-time timers
//! ([`KeyedStream::process_with_timers`]), so windows and their timers
//! are keyed state by key group: restored exactly-once and rescaled.
//! This file only declares; the window moves are in `window_state`.

use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::job::{Aggregator, Collector, Data, Key, KeyedStream, Stream};
use crate::runtime::BoxError;

use super::timers::{timed_fn, TimeDomain, TimedFn, Timers};
use super::window::{LateRecords, Windowed, Windows};
use super::window_fn::{Aggregating, CountRecords, Processing, Reducing, WindowFunction};
use super::window_state::{Adding, OpenWindows};

mod sealed {
    /// Only this module's policies are late policies.
    pub trait Sealed {}
}

/// How a window operator treats a record later than its allowed
/// lateness (every window it belongs to has fired and been cleaned up).
/// Sealed: [`DropLate`] or [`SideOutputLate`].
pub trait LatePolicy<T: Data>: sealed::Sealed + Send + Sync + 'static {
    /// What the window operator itself emits for results of type `R`.
    type Out<R: Data>: Data;
    /// What the caller gets for the late records.
    type Late<'j>;

    /// A window's result as the operator's output.
    #[doc(hidden)]
    fn result<R: Data>(result: R) -> Self::Out<R>;

    /// A late record as the operator's output; `None`: it is dropped.
    #[doc(hidden)]
    fn late<R: Data>(record: T) -> Option<Self::Out<R>>;

    /// Splits the operator's output into the results and the late part.
    #[doc(hidden)]
    fn split<'j, R: Data>(
        stream: Stream<'j, Self::Out<R>>,
        name: &str,
        late: LateRecords,
    ) -> (Stream<'j, R>, Self::Late<'j>);
}

/// Late records are dropped and counted: in the returned
/// [`LateRecords`] and in the operator's
/// [`OperatorReport::late_records_dropped`](crate::job::OperatorReport::late_records_dropped).
/// The default; the window operator's output is its results, nothing
/// else.
#[derive(Debug, Clone, Copy, Default)]
pub struct DropLate;

/// Late records go to a stream of their own (see
/// [`WindowedStream::side_output_late`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SideOutputLate;

/// The output of a window operator with [`SideOutputLate`], before it is
/// split into its two streams.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WindowOutput<R, T> {
    /// A window's result.
    Result(R),
    /// A record later than the allowed lateness.
    Late(T),
}

impl sealed::Sealed for DropLate {}
impl sealed::Sealed for SideOutputLate {}

impl<T: Data> LatePolicy<T> for DropLate {
    type Out<R: Data> = R;
    type Late<'j> = LateRecords;

    fn result<R: Data>(result: R) -> R {
        result
    }

    fn late<R: Data>(_record: T) -> Option<R> {
        None
    }

    fn split<'j, R: Data>(
        stream: Stream<'j, R>,
        _name: &str,
        late: LateRecords,
    ) -> (Stream<'j, R>, LateRecords) {
        stream.report_late_drops(late.counter());
        (stream, late)
    }
}

impl<T: Data> LatePolicy<T> for SideOutputLate {
    type Out<R: Data> = WindowOutput<R, T>;
    type Late<'j> = Stream<'j, T>;

    fn result<R: Data>(result: R) -> WindowOutput<R, T> {
        WindowOutput::Result(result)
    }

    fn late<R: Data>(record: T) -> Option<WindowOutput<R, T>> {
        Some(WindowOutput::Late(record))
    }

    fn split<'j, R: Data>(
        stream: Stream<'j, WindowOutput<R, T>>,
        name: &str,
        _late: LateRecords,
    ) -> (Stream<'j, R>, Stream<'j, T>) {
        // The splitters run beside the window operator (a forward edge
        // each) at its parallelism, whatever is set on either stream.
        let results = stream
            .also()
            .flat_map(&format!("{name}-results"), |output| match output {
                WindowOutput::Result(result) => Some(result),
                WindowOutput::Late(_) => None,
            })
            .follow_parallelism_of(&stream);
        let late = stream
            .also()
            .flat_map(&format!("{name}-late"), |output| match output {
                WindowOutput::Late(record) => Some(record),
                WindowOutput::Result(_) => None,
            })
            .follow_parallelism_of(&stream);
        (results, late)
    }
}

/// The event-time function of a processing-time window, never called.
pub type NoEventTime<T> = fn(&T) -> u64;

/// The window operator's per-record (`I` = `T`) or per-timer (`I` =
/// `u64`) call.
type WindowFn<K, T, W, I, L> = TimedFn<
    K,
    OpenWindows<<W as WindowFunction<K, T>>::Contents>,
    I,
    <L as LatePolicy<T>>::Out<Windowed<K, <W as WindowFunction<K, T>>::Output>>,
>;

/// A keyed stream cut into event-time windows; see
/// [`KeyedStream::window`]. `L` says what happens to late records; `TS`
/// is the event-time function, kept as its concrete type so that the
/// window operator calls it without an indirect call per record.
pub struct WindowedStream<
    'j,
    K,
    T,
    F: ?Sized,
    L = DropLate,
    TS: ?Sized = dyn Fn(&T) -> u64 + Send + Sync,
> {
    keyed: KeyedStream<'j, K, T, F>,
    windows: Windows,
    timestamp_of: Arc<TS>,
    _late: PhantomData<fn() -> L>,
}

impl<'j, K, T, F> KeyedStream<'j, K, T, F>
where
    K: Key,
    T: Data,
    F: Fn(&T) -> K + Send + Sync + ?Sized + 'static,
{
    /// Cuts each key's records into `windows` by the event time
    /// `timestamp_of` gives (the same as the source's
    /// [`WatermarkStrategy`](super::WatermarkStrategy)'s: records do not
    /// carry their timestamps).
    ///
    /// ```
    /// use snapflow::job::{Job, JobConfig};
    /// use snapflow::sink::CollectHandle;
    /// use snapflow::source::VecSourceFactory;
    /// use snapflow::time::{WatermarkStrategy, Windows};
    ///
    /// // (user, event time in ms): per user, count events in 60 s windows,
    /// // tolerating 5 s of disorder.
    /// let events = vec![(1u32, 1_000u64), (2, 2_000), (1, 59_000), (1, 61_000), (2, 130_000)];
    /// let job = Job::new("windows", JobConfig::default());
    /// let counts = CollectHandle::new();
    /// let (windowed, late) = job
    ///     .source("events", VecSourceFactory::new(events))
    ///     .assign_timestamps(WatermarkStrategy::bounded_out_of_orderness(5_000, |e: &(u32, u64)| e.1))
    ///     .key_by(|e: &(u32, u64)| e.0)
    ///     .window(Windows::tumbling(60_000)?, |e: &(u32, u64)| e.1)
    ///     .count("count");
    /// windowed.sink("out", counts.clone());
    /// job.run()?;
    /// let mut counts: Vec<_> = counts.committed().into_iter().map(|w| (w.key, w.end_ms, w.result)).collect();
    /// counts.sort();
    /// assert_eq!(counts, [(1, 60_000, 2), (1, 120_000, 1), (2, 60_000, 1), (2, 180_000, 1)]);
    /// assert_eq!(late.dropped(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn window<TS>(
        self,
        windows: Windows,
        timestamp_of: TS,
    ) -> WindowedStream<'j, K, T, F, DropLate, TS>
    where
        TS: Fn(&T) -> u64 + Send + Sync + 'static,
    {
        WindowedStream {
            keyed: self,
            windows,
            timestamp_of: Arc::new(timestamp_of),
            _late: PhantomData,
        }
    }
}

impl<'j, K, T, F> KeyedStream<'j, K, T, F>
where
    K: Key,
    T: Data,
    F: Fn(&T) -> K + Send + Sync + ?Sized + 'static,
{
    /// Cuts each key's records into `windows` of processing time: a
    /// record belongs to the windows of the job's
    /// [`JobConfig::clock`](crate::job::JobConfig::clock) reading when the
    /// window operator takes it, and a window fires when the clock passes
    /// its end (checked every
    /// [`JobConfig::processing_time_tick_ms`](crate::job::JobConfig::processing_time_tick_ms)).
    /// Windows and their timers are keyed state as on event time: a
    /// window that came due while the job was down fires when it is
    /// restored, and every open window fires at end of input. Results
    /// depend on when records arrive, so a replay after a restore may cut
    /// them differently; each record is still in the committed results
    /// exactly once.
    ///
    /// ```
    /// use snapflow::job::{Job, JobConfig};
    /// use snapflow::sink::CollectHandle;
    /// use snapflow::source::VecSourceFactory;
    /// use snapflow::time::{ManualClock, Windows};
    /// use std::sync::Arc;
    ///
    /// let clock = ManualClock::new(10_000);
    /// let config = JobConfig { clock: Arc::new(clock.clone()), ..JobConfig::default() };
    /// let job = Job::new("processing-time", config);
    /// let counts = CollectHandle::new();
    /// let (windowed, _late) = job
    ///     .source("words", VecSourceFactory::new(vec!["a".to_string(), "b".into(), "a".into()]))
    ///     .key_by(|word: &String| word.clone())
    ///     .processing_time_window(Windows::tumbling(1_000)?)
    ///     .count("count");
    /// windowed.sink("out", counts.clone());
    /// job.run()?;
    /// let mut counts: Vec<_> = counts.committed().into_iter().map(|w| (w.key, w.start_ms, w.result)).collect();
    /// counts.sort();
    /// assert_eq!(counts, [("a".to_string(), 10_000, 2), ("b".to_string(), 10_000, 1)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn processing_time_window(
        self,
        windows: Windows,
    ) -> WindowedStream<'j, K, T, F, DropLate, NoEventTime<T>> {
        // The event-time function is never called on processing time.
        self.window(windows.on_processing_time(), |_: &T| 0)
    }
}

impl<'j, K, T, F: ?Sized, TS: ?Sized> WindowedStream<'j, K, T, F, DropLate, TS> {
    /// Sends records later than the allowed lateness to a stream of their
    /// own instead of dropping them: each window method then returns that
    /// stream beside the results. The window operator's output is split
    /// by two stateless operators, `<name>-results` and `<name>-late`, that
    /// run beside it at its parallelism: `.parallelism(n)` on either
    /// returned stream sets the window operator's.
    ///
    /// ```
    /// use snapflow::job::{Job, JobConfig};
    /// use snapflow::sink::CollectHandle;
    /// use snapflow::source::VecSourceFactory;
    /// use snapflow::time::{WatermarkStrategy, Windows};
    ///
    /// // The record at 500 ms comes after the watermark passed 10 s (one
    /// // record per batch, so a watermark follows each).
    /// let events = vec![(1u32, 1_000u64), (1, 12_000), (1, 500), (1, 25_000)];
    /// let job = Job::new("late", JobConfig { batch_size_max: 1, ..JobConfig::default() });
    /// let (counts, late_out) = (CollectHandle::new(), CollectHandle::new());
    /// let (windowed, late) = job
    ///     .source("events", VecSourceFactory::new(events))
    ///     .assign_timestamps(WatermarkStrategy::bounded_out_of_orderness(0, |e: &(u32, u64)| e.1))
    ///     .key_by(|e: &(u32, u64)| e.0)
    ///     .window(Windows::session(5_000)?, |e: &(u32, u64)| e.1)
    ///     .side_output_late()
    ///     .count("sessions");
    /// windowed.sink("out", counts.clone());
    /// late.sink("late", late_out.clone());
    /// job.run()?;
    /// assert_eq!(late_out.committed(), [(1, 500)]);
    /// let mut sessions: Vec<_> = counts.committed().into_iter().map(|w| (w.start_ms, w.end_ms, w.result)).collect();
    /// sessions.sort();
    /// assert_eq!(sessions, [(1_000, 6_000, 1), (12_000, 17_000, 1), (25_000, 30_000, 1)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn side_output_late(self) -> WindowedStream<'j, K, T, F, SideOutputLate, TS> {
        WindowedStream {
            keyed: self.keyed,
            windows: self.windows,
            timestamp_of: self.timestamp_of,
            _late: PhantomData,
        }
    }
}

impl<'j, K, T, F, L, TS> WindowedStream<'j, K, T, F, L, TS>
where
    K: Key + Data,
    T: Data,
    F: Fn(&T) -> K + Send + Sync + ?Sized + 'static,
    L: LatePolicy<T>,
    TS: Fn(&T) -> u64 + Send + Sync + ?Sized + 'static,
{
    /// Aggregates each window incrementally with `aggregator` and emits
    /// its result when the watermark passes the window's end (and again,
    /// updated, for each late record within the allowed lateness).
    /// Records later than that go where `L` says: by default they are
    /// dropped and counted in the returned [`LateRecords`]. Session
    /// windows need [`Aggregator::merge`].
    pub fn aggregate<A>(
        self,
        name: &str,
        aggregator: A,
    ) -> (Stream<'j, Windowed<K, A::Output>>, L::Late<'j>)
    where
        A: Aggregator<T>,
        A::Accumulator: Serialize + DeserializeOwned,
    {
        self.build(name, Aggregating(aggregator))
    }

    /// Counts each window's records (see [`WindowedStream::aggregate`]).
    pub fn count(self, name: &str) -> (Stream<'j, Windowed<K, u64>>, L::Late<'j>) {
        self.build(name, Aggregating(CountRecords))
    }

    /// Reduces each window's records with `function` (the first record is
    /// the reduced value, each next one makes it `function(&reduced,
    /// record)`); fires as [`WindowedStream::aggregate`] does. Merged
    /// sessions reduce their values with the same function. The record
    /// type is `Sync`: it is the window's state, which a checkpoint of a
    /// large state hands to the checkpoint writer.
    pub fn reduce(
        self,
        name: &str,
        function: impl Fn(&T, T) -> T + Send + Sync + 'static,
    ) -> (Stream<'j, Windowed<K, T>>, L::Late<'j>)
    where
        T: Sync,
    {
        self.build(name, Reducing(function))
    }

    /// A full-window function: the window keeps every record, and when it
    /// fires `function(key, records)` sees them all (in arrival order; a
    /// merged session has the older window's records first) and gives
    /// the window's result. An `Err` fails the job. Costs a window's
    /// records in state, where an aggregate keeps one accumulator. The
    /// record type is `Sync`, as for [`WindowedStream::reduce`].
    pub fn process<R: Data>(
        self,
        name: &str,
        function: impl Fn(&K, &[T]) -> Result<R, BoxError> + Send + Sync + 'static,
    ) -> (Stream<'j, Windowed<K, R>>, L::Late<'j>)
    where
        T: Sync,
    {
        self.build(name, Processing(function))
    }

    fn build<W: WindowFunction<K, T>>(
        self,
        name: &str,
        function: W,
    ) -> (Stream<'j, Windowed<K, W::Output>>, L::Late<'j>) {
        let late = LateRecords::default();
        let counted = late.clone();
        let (windows, timestamp_of) = (self.windows, self.timestamp_of);
        let function = Arc::new(function);
        let firing = Arc::clone(&function);
        let wrap = L::result::<Windowed<K, W::Output>>;
        // Kept as its concrete type: the timed core calls it without an
        // indirect call per record.
        let on_record = Arc::new(timed_fn::<K, _, T, L::Out<Windowed<K, W::Output>>, _>(
            move |key: &K,
                  open: &mut OpenWindows<W::Contents>,
                  record: T,
                  timers: &mut Timers<'_>,
                  out: &mut Collector<'_, _>| {
                let timestamp_ms = match windows.domain() {
                    TimeDomain::EventTime => timestamp_of(&record),
                    TimeDomain::ProcessingTime => timers.current_processing_time_ms(),
                };
                let adding = Adding::new(&windows, &*function, key, &wrap);
                let late = adding.add(open, (timestamp_ms, record), timers, out)?;
                if let Some(record) = late {
                    match L::late::<Windowed<K, W::Output>>(record) {
                        Some(late_record) => out.emit(late_record),
                        None => counted.count_one(),
                    }
                }
                Ok(())
            },
        ));
        let on_timer: Arc<WindowFn<K, T, W, u64, L>> = Arc::new(
            move |key: &K,
                  open: &mut OpenWindows<W::Contents>,
                  timestamp_ms: u64,
                  _timers: &mut Timers<'_>,
                  out: &mut Collector<'_, _>| {
                Adding::new(&windows, &*firing, key, &wrap).fire(open, timestamp_ms, out)
            },
        );
        let ticks = windows.domain() == TimeDomain::ProcessingTime;
        let stream = self.keyed.timed(
            name,
            on_record,
            on_timer,
            Some(OpenWindows::is_empty),
            ticks,
        );
        L::split(stream, name, late)
    }
}
