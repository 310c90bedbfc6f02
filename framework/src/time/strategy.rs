//! Watermark strategies: how a source subtask turns the event times of
//! the records it reads into watermarks, and when it declares itself idle.

use std::fmt;
use std::sync::Arc;

use super::clock::{Clock, SystemClock};
use super::watermark::WatermarkState;

/// A record's event time in milliseconds since the epoch.
pub type TimestampFn<T> = Arc<dyn Fn(&T) -> u64 + Send + Sync>;

/// Makes one subtask's generator.
type GeneratorFactory<T> = Arc<dyn Fn() -> Box<dyn WatermarkGenerator<T>> + Send + Sync>;

/// Turns the records a source subtask reads into watermarks. One instance
/// runs per source subtask (one split each for the built-in sources), on
/// the source's actor, after every batch it reads.
///
/// A watermark `W` promises that no record with event time `<= W` follows
/// on this subtask. Records that break the promise are late downstream.
pub trait WatermarkGenerator<T>: Send {
    /// A record with event time `timestamp_ms` was read.
    fn on_event(&mut self, record: &T, timestamp_ms: u64);

    /// The watermark now, or `None` while there is none yet. A value
    /// lower than one returned before is ignored (watermarks only rise).
    fn current_watermark_ms(&self) -> Option<u64>;
}

/// Bounded out-of-orderness: the watermark is `max_ts - bound_ms - 1`,
/// none while that would be below zero (saturating: no underflow at the
/// start or after a restore).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoundedOutOfOrderness {
    bound_ms: u64,
    max_timestamp_ms: Option<u64>,
}

impl BoundedOutOfOrderness {
    /// Tolerates records up to `bound_ms` older than the newest one seen.
    pub fn new(bound_ms: u64) -> Self {
        BoundedOutOfOrderness {
            bound_ms,
            max_timestamp_ms: None,
        }
    }
}

impl<T> WatermarkGenerator<T> for BoundedOutOfOrderness {
    fn on_event(&mut self, _record: &T, timestamp_ms: u64) {
        let max = self.max_timestamp_ms.get_or_insert(timestamp_ms);
        *max = (*max).max(timestamp_ms);
    }

    fn current_watermark_ms(&self) -> Option<u64> {
        self.max_timestamp_ms?
            .checked_sub(self.bound_ms)?
            .checked_sub(1)
    }
}

/// A punctuated generator: `marker(record, timestamp_ms)` returns a
/// watermark carried by the record itself (a marker record), or `None`.
pub struct Punctuated<F> {
    marker: F,
    watermark_ms: Option<u64>,
}

impl<F> fmt::Debug for Punctuated<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Punctuated")
            .field("watermark_ms", &self.watermark_ms)
            .finish_non_exhaustive()
    }
}

impl<T, F> WatermarkGenerator<T> for Punctuated<F>
where
    F: Fn(&T, u64) -> Option<u64> + Send,
{
    fn on_event(&mut self, record: &T, timestamp_ms: u64) {
        if let Some(watermark_ms) = (self.marker)(record, timestamp_ms) {
            let current = self.watermark_ms.get_or_insert(watermark_ms);
            *current = (*current).max(watermark_ms);
        }
    }

    fn current_watermark_ms(&self) -> Option<u64> {
        self.watermark_ms
    }
}

/// How a stream's records get event times and watermarks: a timestamp
/// function, a [`WatermarkGenerator`] per source subtask, and optionally
/// idleness.
///
/// ```
/// use snapflow::time::WatermarkStrategy;
///
/// // Records are (user, event time in ms); tolerate 5 s of disorder, and
/// // a split that reads nothing for 10 s stops holding the watermark.
/// let strategy = WatermarkStrategy::bounded_out_of_orderness(5_000, |record: &(u32, u64)| record.1)
///     .with_idleness(10_000);
/// assert_eq!(strategy.idleness_ms(), Some(10_000));
/// ```
pub struct WatermarkStrategy<T> {
    timestamp_of: TimestampFn<T>,
    make_generator: GeneratorFactory<T>,
    idleness_ms: Option<u64>,
    emit_interval_ms: u64,
    clock: Arc<dyn Clock>,
}

impl<T> Clone for WatermarkStrategy<T> {
    fn clone(&self) -> Self {
        WatermarkStrategy {
            timestamp_of: Arc::clone(&self.timestamp_of),
            make_generator: Arc::clone(&self.make_generator),
            idleness_ms: self.idleness_ms,
            emit_interval_ms: self.emit_interval_ms,
            clock: Arc::clone(&self.clock),
        }
    }
}

impl<T> fmt::Debug for WatermarkStrategy<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatermarkStrategy")
            .field("idleness_ms", &self.idleness_ms)
            .field("emit_interval_ms", &self.emit_interval_ms)
            .finish_non_exhaustive()
    }
}

impl<T: 'static> WatermarkStrategy<T> {
    /// Bounded out-of-orderness of `bound_ms` (see
    /// [`BoundedOutOfOrderness`]).
    pub fn bounded_out_of_orderness(
        bound_ms: u64,
        timestamp_of: impl Fn(&T) -> u64 + Send + Sync + 'static,
    ) -> Self {
        Self::custom(timestamp_of, move || BoundedOutOfOrderness::new(bound_ms))
    }

    /// Timestamps that never decrease within a split: the watermark is
    /// `max_ts - 1`.
    pub fn monotonous(timestamp_of: impl Fn(&T) -> u64 + Send + Sync + 'static) -> Self {
        Self::bounded_out_of_orderness(0, timestamp_of)
    }

    /// Watermarks carried by marker records (see [`Punctuated`]).
    pub fn punctuated(
        timestamp_of: impl Fn(&T) -> u64 + Send + Sync + 'static,
        marker: impl Fn(&T, u64) -> Option<u64> + Clone + Send + Sync + 'static,
    ) -> Self {
        Self::custom(timestamp_of, move || Punctuated {
            marker: marker.clone(),
            watermark_ms: None,
        })
    }

    /// A generator of the user's own, made fresh for every source subtask
    /// (and again after a restore: what it had seen is not state, but the
    /// subtask's watermark never goes below what it had sent).
    pub fn custom<G>(
        timestamp_of: impl Fn(&T) -> u64 + Send + Sync + 'static,
        make_generator: impl Fn() -> G + Send + Sync + 'static,
    ) -> Self
    where
        G: WatermarkGenerator<T> + 'static,
    {
        WatermarkStrategy {
            timestamp_of: Arc::new(timestamp_of),
            make_generator: Arc::new(move || Box::new(make_generator())),
            idleness_ms: None,
            emit_interval_ms: 0,
            clock: Arc::new(SystemClock),
        }
    }

    /// A source subtask that reads nothing for `idleness_ms` of processing
    /// time marks itself idle, so it no longer holds back the watermark
    /// downstream, until it reads again.
    pub fn with_idleness(mut self, idleness_ms: u64) -> Self {
        self.idleness_ms = Some(idleness_ms);
        self
    }

    /// Sends a risen watermark at most once per `emit_interval_ms` of
    /// processing time (0, the default: after every batch read). A
    /// watermark is a control item, which closes the open batch on every
    /// output channel, so a larger interval keeps batches fuller.
    pub fn with_emit_interval_ms(mut self, emit_interval_ms: u64) -> Self {
        self.emit_interval_ms = emit_interval_ms;
        self
    }

    /// Reads processing time (idleness, emit interval) from `clock`
    /// instead of the system clock.
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The idleness timeout, if any.
    pub fn idleness_ms(&self) -> Option<u64> {
        self.idleness_ms
    }

    /// The event time of `record`.
    pub fn timestamp_of(&self, record: &T) -> u64 {
        (self.timestamp_of)(record)
    }
}

/// What a source subtask must send after it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SourceSignal {
    /// Nothing.
    None,
    /// This watermark, after the records just read.
    Watermark(u64),
    /// An idleness mark.
    Idle,
}

/// The watermark machinery of one source subtask: its generator, what it
/// has sent, and its idleness.
pub(crate) struct SourceWatermarks<T> {
    strategy: WatermarkStrategy<T>,
    generator: Box<dyn WatermarkGenerator<T>>,
    sent_ms: Option<u64>,
    last_emit_at_ms: Option<u64>,
    quiet_since_ms: Option<u64>,
    idle_sent: bool,
}

impl<T: 'static> SourceWatermarks<T> {
    pub(crate) fn new(strategy: WatermarkStrategy<T>) -> Self {
        let generator = (strategy.make_generator)();
        SourceWatermarks {
            strategy,
            generator,
            sent_ms: None,
            last_emit_at_ms: None,
            quiet_since_ms: None,
            idle_sent: false,
        }
    }

    /// The subtask read `records` (possibly none).
    pub(crate) fn on_records(&mut self, records: &[T]) -> SourceSignal {
        if records.is_empty() {
            return self.on_quiet();
        }
        self.quiet_since_ms = None;
        self.idle_sent = false;
        for record in records {
            let timestamp_ms = self.strategy.timestamp_of(record);
            self.generator.on_event(record, timestamp_ms);
        }
        let Some(watermark_ms) = self.generator.current_watermark_ms() else {
            return SourceSignal::None;
        };
        if self.sent_ms.is_some_and(|sent| watermark_ms <= sent) {
            return SourceSignal::None;
        }
        let now_ms = self.strategy.clock.now_ms();
        let interval_ms = self.strategy.emit_interval_ms;
        if self
            .last_emit_at_ms
            .is_some_and(|at| now_ms.saturating_sub(at) < interval_ms)
        {
            return SourceSignal::None;
        }
        self.last_emit_at_ms = Some(now_ms);
        self.sent_ms = Some(watermark_ms);
        SourceSignal::Watermark(watermark_ms)
    }

    /// A read found nothing: idle once the idleness timeout has passed.
    fn on_quiet(&mut self) -> SourceSignal {
        let Some(idleness_ms) = self.strategy.idleness_ms else {
            return SourceSignal::None;
        };
        let now_ms = self.strategy.clock.now_ms();
        let since_ms = *self.quiet_since_ms.get_or_insert(now_ms);
        if self.idle_sent || now_ms.saturating_sub(since_ms) < idleness_ms {
            return SourceSignal::None;
        }
        self.idle_sent = true;
        SourceSignal::Idle
    }

    /// What a snapshot keeps: the watermark sent on.
    pub(crate) fn state(&self) -> WatermarkState {
        WatermarkState::sent(self.sent_ms)
    }

    /// Resumes from a snapshot: never sends below what was sent.
    pub(crate) fn restore(&mut self, state: &WatermarkState) {
        self.sent_ms = state.output_ms();
    }
}

#[cfg(test)]
mod tests {
    use super::super::clock::ManualClock;
    use super::*;

    fn run(strategy: WatermarkStrategy<u64>, batches: &[&[u64]]) -> Vec<SourceSignal> {
        let mut marks = SourceWatermarks::new(strategy);
        batches
            .iter()
            .map(|batch| marks.on_records(batch))
            .collect()
    }

    #[test]
    fn bounded_out_of_orderness_is_max_minus_bound_minus_one() {
        let strategy = WatermarkStrategy::bounded_out_of_orderness(5, |ts: &u64| *ts);
        assert_eq!(
            run(strategy, &[&[3], &[6], &[10, 7], &[8], &[12]]),
            [
                SourceSignal::None,
                SourceSignal::Watermark(0),
                SourceSignal::Watermark(4),
                SourceSignal::None,
                SourceSignal::Watermark(6),
            ]
        );
    }

    #[test]
    fn arithmetic_saturates() {
        let huge = WatermarkStrategy::bounded_out_of_orderness(u64::MAX, |ts: &u64| *ts);
        assert_eq!(run(huge, &[&[u64::MAX]]), [SourceSignal::None]);
        let zero = WatermarkStrategy::monotonous(|ts: &u64| *ts);
        assert_eq!(
            run(zero, &[&[0], &[u64::MAX]]),
            [SourceSignal::None, SourceSignal::Watermark(u64::MAX - 1)]
        );
    }

    #[test]
    fn punctuated_marks_come_from_records() {
        let strategy = WatermarkStrategy::punctuated(
            |ts: &u64| *ts,
            |_: &u64, ts| (ts % 10 == 0).then_some(ts),
        );
        assert_eq!(
            run(strategy, &[&[3], &[10], &[12], &[20]]),
            [
                SourceSignal::None,
                SourceSignal::Watermark(10),
                SourceSignal::None,
                SourceSignal::Watermark(20),
            ]
        );
    }

    #[test]
    fn idleness_after_its_timeout_and_once() {
        let clock = ManualClock::new(100);
        let strategy = WatermarkStrategy::monotonous(|ts: &u64| *ts)
            .with_idleness(50)
            .with_clock(clock.clone());
        let mut marks = SourceWatermarks::new(strategy);
        assert_eq!(marks.on_records(&[]), SourceSignal::None);
        clock.advance_ms(49);
        assert_eq!(marks.on_records(&[]), SourceSignal::None);
        clock.advance_ms(1);
        assert_eq!(marks.on_records(&[]), SourceSignal::Idle);
        assert_eq!(marks.on_records(&[]), SourceSignal::None);
        assert_eq!(marks.on_records(&[5]), SourceSignal::Watermark(4));
        clock.advance_ms(60);
        assert_eq!(
            marks.on_records(&[]),
            SourceSignal::None,
            "the quiet time starts again"
        );
    }

    #[test]
    fn emit_interval_holds_rises_back() {
        let clock = ManualClock::new(0);
        let strategy = WatermarkStrategy::monotonous(|ts: &u64| *ts)
            .with_emit_interval_ms(10)
            .with_clock(clock.clone());
        let mut marks = SourceWatermarks::new(strategy);
        assert_eq!(marks.on_records(&[5]), SourceSignal::Watermark(4));
        assert_eq!(marks.on_records(&[6]), SourceSignal::None);
        clock.advance_ms(10);
        assert_eq!(marks.on_records(&[7]), SourceSignal::Watermark(6));
    }

    #[test]
    fn a_restored_subtask_never_sends_below_what_it_sent() {
        let strategy = WatermarkStrategy::monotonous(|ts: &u64| *ts);
        let mut before = SourceWatermarks::new(strategy.clone());
        assert_eq!(before.on_records(&[10]), SourceSignal::Watermark(9));
        let mut after = SourceWatermarks::new(strategy);
        after.restore(&before.state());
        assert_eq!(after.on_records(&[8]), SourceSignal::None);
        assert_eq!(after.on_records(&[11]), SourceSignal::Watermark(10));
    }
}
