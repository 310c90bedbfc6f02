//! Records the Kafka source's deserialiser rejects: what the source does
//! with them ([`BadRecords`]), the count the factory hands out
//! ([`DroppedRecords`]), and the rate limit on the warnings a dropped
//! record logs ([`DropLog`]).
//!
//! This module owns those decisions and nothing else: it never reads a
//! clock (the caller passes the time, so the limit is tested with a
//! driven clock), never reads records and never talks to a broker. The
//! count also reaches the job's report and its live metrics through
//! [`Source::records_dropped`](crate::source::Source::records_dropped).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the source does with a record the deserialiser rejects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadRecords {
    /// Drop it and go on: each dropped record is counted
    /// ([`DroppedRecords`], [`JobReport`](crate::job::JobReport)'s
    /// `records_dropped` of the source, the live metrics' and
    /// Prometheus' `records_dropped`) and logged as a warning with its
    /// topic, partition and offset, at most one warning per subtask
    /// every [`DROP_LOG_INTERVAL`] (the ones in between are counted in
    /// the next warning).
    Drop,
    /// Fail the job with [`KafkaError::BadRecord`](super::KafkaError::BadRecord)
    /// (not retryable: the record is still there after a restart).
    Fail,
}

/// The number of records the deserialiser rejected and
/// [`BadRecords::Drop`] dropped, over every subtask and restart of the
/// factory's job. Clones share the count.
#[derive(Debug, Clone, Default)]
pub struct DroppedRecords(Arc<AtomicU64>);

impl DroppedRecords {
    /// Records dropped so far. A restore re-reads records after its
    /// checkpoint, so a bad record in that stretch is counted again.
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Counts one more.
    pub(super) fn add_one(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// The shortest time between two warnings about dropped records of one
/// source subtask: a topic full of bad records logs a line every 10 s
/// (with the count since the last line), not one per record.
pub(super) const DROP_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The rate limit on one subtask's warnings about dropped records.
#[derive(Debug, Default)]
pub(super) struct DropLog {
    /// When the last warning went out (`None`: never).
    logged_at: Option<Instant>,
    /// Drops since then that logged nothing.
    quiet: u64,
}

impl DropLog {
    /// A record was dropped at `now`: `Some(n)` when it is to be logged,
    /// with `n` the drops before it that were not (0 for the first);
    /// `None` when it is only counted.
    pub(super) fn on_drop(&mut self, now: Instant) -> Option<u64> {
        let due = self.logged_at.map_or(true, |at| {
            now.saturating_duration_since(at) >= DROP_LOG_INTERVAL
        });
        if !due {
            self.quiet += 1;
            return None;
        }
        self.logged_at = Some(now);
        Some(std::mem::take(&mut self.quiet))
    }
}

/// Logs a dropped record when `log` says it is due.
pub(super) fn log_drop(
    log: &mut DropLog,
    now: Instant,
    (topic, partition, offset): (&str, i32, i64),
    reason: &str,
) {
    if let Some(unlogged) = log.on_drop(now) {
        tracing::warn!(
            topic,
            partition,
            offset,
            reason,
            dropped_without_warning = unlogged,
            "Kafka source dropped a record its deserialiser rejected (BadRecords::Drop); \
             at most one such warning per subtask every 10 s"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first drop logs, the ones within the interval only count, and
    /// the first one after it logs with that count.
    #[test]
    fn drops_log_at_most_once_per_interval_with_the_count_in_between() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut log = DropLog::default();
        assert_eq!(log.on_drop(at(0)), Some(0), "the first drop logs");
        assert_eq!(log.on_drop(at(1)), None);
        assert_eq!(log.on_drop(at(9_999)), None);
        assert_eq!(log.on_drop(at(10_000)), Some(2), "two went unlogged");
        assert_eq!(log.on_drop(at(10_001)), None);
        assert_eq!(log.on_drop(at(60_000)), Some(1));
        assert_eq!(log.on_drop(at(70_000)), Some(0));
    }

    #[test]
    fn the_shared_count_adds_over_clones() {
        let dropped = DroppedRecords::default();
        let clone = dropped.clone();
        dropped.add_one();
        clone.add_one();
        assert_eq!(dropped.count(), 2);
    }
}
