//! Tumbling and sliding event-time windows on a keyed stream, with an
//! incremental aggregate, allowed lateness and dropped late records,
//! built on [`KeyedStream::process_with_timers`]: a window's accumulator
//! is per-key state and its firing and clean-up are event-time timers, so
//! both are in the snapshot, restored exactly-once and rescaled by key
//! group, and a window's state is gone once the watermark passes its end
//! plus the allowed lateness.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::job::{Aggregator, Collector, Data, Key, KeyedStream, Stream};
use crate::runtime::BoxError;

use super::timers::Timers;

/// Why a window assigner cannot be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WindowError {
    /// A window of no length.
    #[error("a window's size must be above 0 ms")]
    ZeroSize,
    /// A sliding window that never moves.
    #[error("a sliding window's slide must be above 0 ms")]
    ZeroSlide,
    /// A slide larger than the window would leave gaps no window covers.
    #[error("a sliding window's slide ({slide_ms} ms) is larger than its size ({size_ms} ms)")]
    SlideLargerThanSize {
        /// The window's size.
        size_ms: u64,
        /// Its slide.
        slide_ms: u64,
    },
}

/// Which event-time windows a record belongs to: windows of `size_ms`
/// starting every `slide_ms` (tumbling: slide = size), aligned to the
/// epoch, and how long after its end a window still takes late records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    size_ms: u64,
    slide_ms: u64,
    allowed_lateness_ms: u64,
}

impl Windows {
    /// Back-to-back windows of `size_ms`.
    ///
    /// ```
    /// use snapflow::time::{WindowError, Windows};
    ///
    /// assert!(Windows::tumbling(60_000).is_ok());
    /// assert_eq!(Windows::tumbling(0), Err(WindowError::ZeroSize));
    /// ```
    pub fn tumbling(size_ms: u64) -> Result<Windows, WindowError> {
        Windows::sliding(size_ms, size_ms)
    }

    /// Windows of `size_ms` starting every `slide_ms`; a record belongs to
    /// `size_ms / slide_ms` of them (rounded up).
    pub fn sliding(size_ms: u64, slide_ms: u64) -> Result<Windows, WindowError> {
        if size_ms == 0 {
            return Err(WindowError::ZeroSize);
        }
        if slide_ms == 0 {
            return Err(WindowError::ZeroSlide);
        }
        if slide_ms > size_ms {
            return Err(WindowError::SlideLargerThanSize { size_ms, slide_ms });
        }
        Ok(Windows {
            size_ms,
            slide_ms,
            allowed_lateness_ms: 0,
        })
    }

    /// A window keeps its state, and takes late records (each one emits
    /// an updated result, a late firing), until the watermark passes its
    /// end by `allowed_lateness_ms`. Default 0.
    pub fn allowed_lateness_ms(mut self, allowed_lateness_ms: u64) -> Windows {
        self.allowed_lateness_ms = allowed_lateness_ms;
        self
    }

    /// The starts of the windows that hold `timestamp_ms`, oldest first.
    pub fn starts_of(&self, timestamp_ms: u64) -> impl Iterator<Item = u64> {
        let last = timestamp_ms - timestamp_ms % self.slide_ms;
        let (size_ms, slide_ms) = (self.size_ms, self.slide_ms);
        // A tumbling window holds only the record's own slot: skip the
        // second division (a window assigner runs once per record).
        let first = if slide_ms == size_ms {
            last
        } else {
            last.saturating_sub(size_ms - 1).div_ceil(slide_ms) * slide_ms
        };
        (first..=last)
            .step_by(usize::try_from(slide_ms).unwrap_or(usize::MAX))
            // A window whose end is past u64::MAX holds everything after
            // its start (it fires at end of input).
            .filter(move |start| match start.checked_add(size_ms) {
                Some(end_ms) => end_ms > timestamp_ms,
                None => true,
            })
    }

    /// The last event time inside the window starting at `start_ms` (its
    /// timer fires there).
    fn last_ms(&self, start_ms: u64) -> u64 {
        start_ms.saturating_add(self.size_ms - 1)
    }

    /// When the window starting at `start_ms` is cleaned up.
    fn cleanup_ms(&self, start_ms: u64) -> u64 {
        self.last_ms(start_ms)
            .saturating_add(self.allowed_lateness_ms)
    }
}

/// One window's result: the key, the window `[start_ms, end_ms)` and the
/// aggregate.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Windowed<K, R> {
    /// The key.
    pub key: K,
    /// The window's first millisecond.
    pub start_ms: u64,
    /// The first millisecond after the window.
    pub end_ms: u64,
    /// The aggregate of the window's records.
    pub result: R,
}

/// Counts the records a window operator dropped as late (across restarts:
/// a record replayed after a restore is counted again). Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct LateRecords {
    dropped: Arc<AtomicU64>,
}

impl LateRecords {
    /// Records dropped because every window they belong to was past its
    /// allowed lateness.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// One key's open windows: (start, accumulator), oldest first.
#[derive(crate::Snapshot, Clone)]
#[snapshot(crate = "crate")]
pub(crate) struct OpenWindows<A> {
    windows: Vec<(u64, A)>,
}

impl<A> Default for OpenWindows<A> {
    fn default() -> Self {
        OpenWindows {
            windows: Vec::new(),
        }
    }
}

/// A keyed stream cut into event-time windows; see
/// [`KeyedStream::window`].
pub struct WindowedStream<'j, K, T, F: ?Sized> {
    keyed: KeyedStream<'j, K, T, F>,
    windows: Windows,
    timestamp_of: Arc<dyn Fn(&T) -> u64 + Send + Sync>,
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
    pub fn window(
        self,
        windows: Windows,
        timestamp_of: impl Fn(&T) -> u64 + Send + Sync + 'static,
    ) -> WindowedStream<'j, K, T, F> {
        WindowedStream {
            keyed: self,
            windows,
            timestamp_of: Arc::new(timestamp_of),
        }
    }
}

impl<'j, K, T, F> WindowedStream<'j, K, T, F>
where
    K: Key + Data,
    T: Data,
    F: Fn(&T) -> K + Send + Sync + ?Sized + 'static,
{
    /// Aggregates each window incrementally with `aggregator` and emits
    /// its result when the watermark passes the window's end (and again,
    /// updated, for each late record within the allowed lateness).
    /// Records later than that are dropped and counted in the returned
    /// [`LateRecords`].
    pub fn aggregate<A>(
        self,
        name: &str,
        aggregator: A,
    ) -> (Stream<'j, Windowed<K, A::Output>>, LateRecords)
    where
        A: Aggregator<T>,
        A::Accumulator: Serialize + DeserializeOwned,
    {
        let late = LateRecords::default();
        let dropped = Arc::clone(&late.dropped);
        let (windows, timestamp_of) = (self.windows, self.timestamp_of);
        let aggregator = Arc::new(aggregator);
        let adder = Arc::clone(&aggregator);
        let stream = self.keyed.process_with_timers(
            name,
            move |key: &K, open: &mut OpenWindows<A::Accumulator>, record: T, timers, out| {
                let timestamp_ms = timestamp_of(&record);
                let added = add(
                    &windows,
                    &*adder,
                    (key, open),
                    (timestamp_ms, record),
                    timers,
                    out,
                )?;
                if !added {
                    dropped.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            },
            move |key: &K, open: &mut OpenWindows<A::Accumulator>, timestamp_ms, _timers, out| {
                fire(&windows, &*aggregator, (key, open), timestamp_ms, out);
                Ok(())
            },
        );
        (stream, late)
    }

    /// Counts each window's records (see [`WindowedStream::aggregate`]).
    pub fn count(self, name: &str) -> (Stream<'j, Windowed<K, u64>>, LateRecords) {
        self.aggregate(name, CountRecords)
    }
}

/// The aggregator of [`WindowedStream::count`].
struct CountRecords;

/// The accumulator of [`CountRecords`].
#[derive(crate::Snapshot, Clone, Default, Serialize, Deserialize)]
#[snapshot(crate = "crate")]
struct RecordCount {
    records: u64,
}

impl<T> Aggregator<T> for CountRecords {
    type Accumulator = RecordCount;
    type Output = u64;

    fn add(&self, accumulator: &mut RecordCount, _value: T) -> Result<(), BoxError> {
        accumulator.records += 1;
        Ok(())
    }

    fn result(&self, accumulator: &RecordCount) -> u64 {
        accumulator.records
    }
}

/// Adds `record` to each of its windows that is not past its lateness;
/// false when there was none (the record is dropped).
fn add<K: Data, T, A: Aggregator<T>>(
    windows: &Windows,
    aggregator: &A,
    (key, open): (&K, &mut OpenWindows<A::Accumulator>),
    (timestamp_ms, record): (u64, T),
    timers: &mut Timers<'_>,
    out: &mut Collector<'_, Windowed<K, A::Output>>,
) -> Result<bool, BoxError>
where
    T: Clone,
{
    let watermark_ms = timers.current_watermark_ms();
    let passed = |at_ms: u64| watermark_ms.is_some_and(|watermark| at_ms <= watermark);
    let mut added = false;
    for start_ms in windows.starts_of(timestamp_ms) {
        if passed(windows.cleanup_ms(start_ms)) {
            continue;
        }
        added = true;
        // Records mostly fall into a key's newest window: look there
        // before searching.
        let newest = open.windows.len().checked_sub(1);
        let found = match newest {
            Some(last) if open.windows[last].0 == start_ms => Ok(last),
            _ => open
                .windows
                .binary_search_by_key(&start_ms, |(start, _)| *start),
        };
        let at = match found {
            Ok(at) => at,
            Err(at) => {
                open.windows
                    .insert(at, (start_ms, A::Accumulator::default()));
                // A window first opened within its lateness fires below
                // (late), not again by a timer.
                if !passed(windows.last_ms(start_ms)) {
                    timers.register_event_time_ms(windows.last_ms(start_ms));
                }
                timers.register_event_time_ms(windows.cleanup_ms(start_ms));
                at
            }
        };
        let accumulator = &mut open.windows[at].1;
        aggregator.add(accumulator, record.clone())?;
        if passed(windows.last_ms(start_ms)) {
            // A late firing: the window already fired, within its lateness.
            out.emit(result(
                windows,
                key,
                start_ms,
                aggregator.result(accumulator),
            ));
        }
    }
    Ok(added)
}

/// Fires the windows whose end the timer at `timestamp_ms` marks, and
/// drops those whose lateness it ends.
fn fire<K: Data, T, A: Aggregator<T>>(
    windows: &Windows,
    aggregator: &A,
    (key, open): (&K, &mut OpenWindows<A::Accumulator>),
    timestamp_ms: u64,
    out: &mut Collector<'_, Windowed<K, A::Output>>,
) {
    for (start_ms, accumulator) in &open.windows {
        if windows.last_ms(*start_ms) == timestamp_ms {
            out.emit(result(
                windows,
                key,
                *start_ms,
                aggregator.result(accumulator),
            ));
        }
    }
    open.windows
        .retain(|(start_ms, _)| windows.cleanup_ms(*start_ms) != timestamp_ms);
}

fn result<K: Clone, R>(windows: &Windows, key: &K, start_ms: u64, result: R) -> Windowed<K, R> {
    Windowed {
        key: key.clone(),
        start_ms,
        end_ms: start_ms.saturating_add(windows.size_ms),
        result,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn starts(windows: Windows, timestamp_ms: u64) -> Vec<u64> {
        windows.starts_of(timestamp_ms).collect()
    }

    #[test]
    fn assigners_are_checked_when_built() {
        assert_eq!(Windows::sliding(0, 1), Err(WindowError::ZeroSize));
        assert_eq!(Windows::sliding(10, 0), Err(WindowError::ZeroSlide));
        assert_eq!(
            Windows::sliding(10, 20),
            Err(WindowError::SlideLargerThanSize {
                size_ms: 10,
                slide_ms: 20
            })
        );
    }

    #[test]
    fn tumbling_windows_hold_each_record_once() {
        let windows = Windows::tumbling(60).expect("valid");
        assert_eq!(starts(windows, 0), [0]);
        assert_eq!(starts(windows, 59), [0]);
        assert_eq!(starts(windows, 60), [60]);
        assert_eq!(starts(windows, u64::MAX), [u64::MAX - u64::MAX % 60]);
    }

    #[test]
    fn sliding_windows_hold_size_over_slide_records() {
        let windows = Windows::sliding(60, 10).expect("valid");
        assert_eq!(starts(windows, 5), [0]);
        assert_eq!(starts(windows, 65), [10, 20, 30, 40, 50, 60]);
        let uneven = Windows::sliding(25, 10).expect("valid");
        assert_eq!(starts(uneven, 30), [10, 20, 30]);
        assert_eq!(starts(uneven, 34), [10, 20, 30]);
        assert_eq!(starts(uneven, 35), [20, 30]);
    }

    #[test]
    fn lateness_moves_the_cleanup_not_the_firing() {
        let windows = Windows::tumbling(60)
            .expect("valid")
            .allowed_lateness_ms(15);
        assert_eq!(windows.last_ms(60), 119);
        assert_eq!(windows.cleanup_ms(60), 134);
        let edge = Windows::tumbling(60)
            .expect("valid")
            .allowed_lateness_ms(u64::MAX);
        assert_eq!(edge.cleanup_ms(60), u64::MAX, "saturates");
    }
}
