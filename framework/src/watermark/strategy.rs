//! Watermark strategies: how a source subtask turns the event times of
//! the records it reads into watermarks, and when it declares itself idle.

use std::fmt;
use std::sync::Arc;

use super::clock::{Clock, SystemClock};

/// A record's event time in milliseconds since the epoch.
pub type TimestampFn<T> = Arc<dyn Fn(&T) -> u64 + Send + Sync>;

/// Makes one split's generator.
pub(super) type GeneratorFactory<T> = Arc<dyn Fn() -> Box<dyn WatermarkGenerator<T>> + Send + Sync>;

/// Turns the records a source split reads into watermarks. One instance
/// runs per split of each source subtask (the built-in sources read one
/// split per subtask; a Kafka subtask one per partition), on the source's
/// actor, after every batch read from that split.
///
/// A watermark `W` promises that no record with event time `<= W` follows
/// from this split. Records that break the promise are late downstream.
pub trait WatermarkGenerator<T>: Send {
    /// A record with event time `timestamp_ms` was read.
    fn on_event(&mut self, record: &T, timestamp_ms: u64);

    /// The split read `records`, in order, whose event times
    /// `timestamp_of` gives. The source calls this once per batch; the
    /// default feeds each record to [`WatermarkGenerator::on_event`]. A
    /// generator that needs fewer timestamps overrides it (as
    /// [`Monotonous`] does: only the batch's last record).
    fn on_events(&mut self, records: &[T], timestamp_of: &dyn Fn(&T) -> u64) {
        for record in records {
            self.on_event(record, timestamp_of(record));
        }
    }

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

    fn on_events(&mut self, records: &[T], timestamp_of: &dyn Fn(&T) -> u64) {
        // One pass for the batch's maximum, with no call per record into
        // the generator.
        let batch_max = records.iter().map(timestamp_of).max();
        if let Some(batch_max) = batch_max {
            let max = self.max_timestamp_ms.get_or_insert(batch_max);
            *max = (*max).max(batch_max);
        }
    }

    fn current_watermark_ms(&self) -> Option<u64> {
        self.max_timestamp_ms?
            .checked_sub(self.bound_ms)?
            .checked_sub(1)
    }
}

/// Timestamps that never decrease within a split: the watermark is
/// `newest_ts - 1`. Per batch it reads only the last record's timestamp,
/// so a source pays for one timestamp call per batch, not per record. If
/// the promise is broken, the watermark follows the last record of each
/// batch (or the highest one seen, whichever is higher): it never runs
/// ahead of the records read, and records older than it are late
/// downstream, as with any watermark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Monotonous {
    newest_timestamp_ms: Option<u64>,
}

impl Monotonous {
    /// No record seen yet.
    pub fn new() -> Self {
        Monotonous::default()
    }

    fn saw(&mut self, timestamp_ms: u64) {
        let newest = self.newest_timestamp_ms.get_or_insert(timestamp_ms);
        *newest = (*newest).max(timestamp_ms);
    }
}

impl<T> WatermarkGenerator<T> for Monotonous {
    fn on_event(&mut self, _record: &T, timestamp_ms: u64) {
        self.saw(timestamp_ms);
    }

    fn on_events(&mut self, records: &[T], timestamp_of: &dyn Fn(&T) -> u64) {
        if let Some(last) = records.last() {
            self.saw(timestamp_of(last));
        }
    }

    fn current_watermark_ms(&self) -> Option<u64> {
        self.newest_timestamp_ms?.checked_sub(1)
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
/// function, a [`WatermarkGenerator`] per source split, and optionally
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
    pub(super) make_generator: GeneratorFactory<T>,
    pub(super) idleness_ms: Option<u64>,
    pub(super) emit_interval_ms: u64,
    pub(super) clock: Arc<dyn Clock>,
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
    /// `newest_ts - 1` (see [`Monotonous`], which reads one timestamp per
    /// batch).
    pub fn monotonous(timestamp_of: impl Fn(&T) -> u64 + Send + Sync + 'static) -> Self {
        Self::custom(timestamp_of, Monotonous::new)
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

    /// A generator of the user's own, made fresh for every split of every
    /// source subtask (and again after a restore: what it had seen is not state, but the
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

    /// A split that reads nothing for `idleness_ms` of processing time no
    /// longer holds back its subtask's watermark, until it reads again;
    /// a source subtask whose splits are all idle marks itself idle, so
    /// it no longer holds back the watermark downstream. (A subtask with
    /// no split at all is idle at once, with or without this setting.)
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

    /// The event-time function itself, for a whole batch.
    pub(super) fn timestamp_fn(&self) -> &(dyn Fn(&T) -> u64 + Send + Sync) {
        &*self.timestamp_of
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watermark_after<G: WatermarkGenerator<u64>>(
        mut generator: G,
        batches: &[&[u64]],
    ) -> Option<u64> {
        for batch in batches {
            generator.on_events(batch, &|record: &u64| *record);
        }
        generator.current_watermark_ms()
    }

    #[test]
    fn a_batch_gives_the_watermark_its_records_give_one_by_one() {
        let batches: &[&[u64]] = &[&[5, 9, 7], &[], &[12, 3]];
        let mut one_by_one = BoundedOutOfOrderness::new(2);
        for record in batches.iter().flat_map(|batch| batch.iter()) {
            one_by_one.on_event(record, *record);
        }
        let batched = watermark_after(BoundedOutOfOrderness::new(2), batches);
        assert_eq!(batched, Some(9));
        assert_eq!(
            batched,
            WatermarkGenerator::<u64>::current_watermark_ms(&one_by_one)
        );
    }

    #[test]
    fn monotonous_reads_the_last_record_of_a_batch_and_never_goes_back() {
        assert_eq!(watermark_after(Monotonous::new(), &[]), None);
        assert_eq!(
            watermark_after(Monotonous::new(), &[&[0]]),
            None,
            "no underflow"
        );
        assert_eq!(watermark_after(Monotonous::new(), &[&[1, 2, 10]]), Some(9));
        // A broken promise: the last record is older than one before it;
        // the watermark neither runs ahead of the records nor goes back.
        assert_eq!(
            watermark_after(Monotonous::new(), &[&[10], &[20, 15]]),
            Some(14)
        );
        assert_eq!(watermark_after(Monotonous::new(), &[&[10], &[4]]), Some(9));
    }
}
