//! The window assigners ([`Windows`]: tumbling, sliding and session
//! windows of event time), their typed build errors, the result type
//! [`Windowed`] and the late-record counter [`LateRecords`].
//!
//! This file only says which windows a record belongs to and when a
//! window fires and is cleaned up; it never holds window contents
//! (`window_state`) and never declares an operator (`windowed`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::timers::TimeDomain;

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
    /// A session window whose gap is 0 would never hold two records.
    #[error("a session window's gap must be above 0 ms")]
    ZeroGap,
    /// A slide larger than the window would leave gaps no window covers.
    #[error("a sliding window's slide ({slide_ms} ms) is larger than its size ({size_ms} ms)")]
    SlideLargerThanSize {
        /// The window's size.
        size_ms: u64,
        /// Its slide.
        slide_ms: u64,
    },
}

/// Which event-time windows a record belongs to, and how long after its
/// end a window still takes late records: windows of `size_ms` starting
/// every `slide_ms` (tumbling: slide = size), aligned to the epoch; or
/// session windows, which merge every two records of a key closer than
/// a gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    kind: WindowKind,
    allowed_lateness_ms: u64,
    domain: TimeDomain,
}

/// The two families of assigners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WindowKind {
    /// Tumbling and sliding windows: fixed, aligned to the epoch.
    Fixed { size_ms: u64, slide_ms: u64 },
    /// Session windows: a record opens `[ts, ts + gap_ms)`, and windows of
    /// one key that overlap or touch merge into one.
    Session { gap_ms: u64 },
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
            kind: WindowKind::Fixed { size_ms, slide_ms },
            allowed_lateness_ms: 0,
            domain: TimeDomain::EventTime,
        })
    }

    /// Session windows: per key, records closer than `gap_ms` (or exactly
    /// `gap_ms` apart) are in one window, from the first record's time to
    /// the last one's plus `gap_ms`. Windows merge as records arrive, in
    /// any order; a session fires once the watermark passes its end.
    ///
    /// ```
    /// use snapflow::time::{WindowError, Windows};
    ///
    /// assert!(Windows::session(30_000).is_ok());
    /// assert_eq!(Windows::session(0), Err(WindowError::ZeroGap));
    /// ```
    pub fn session(gap_ms: u64) -> Result<Windows, WindowError> {
        if gap_ms == 0 {
            return Err(WindowError::ZeroGap);
        }
        Ok(Windows {
            kind: WindowKind::Session { gap_ms },
            allowed_lateness_ms: 0,
            domain: TimeDomain::EventTime,
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
    /// For session windows this is the record's own window before any
    /// merge: it starts at `timestamp_ms`.
    pub fn starts_of(&self, timestamp_ms: u64) -> impl Iterator<Item = u64> {
        let (size_ms, slide_ms) = match self.kind {
            WindowKind::Fixed { size_ms, slide_ms } => (size_ms, slide_ms),
            // One window of one slide: exactly the record's own start.
            WindowKind::Session { .. } => (1, 1),
        };
        let last = timestamp_ms - timestamp_ms % slide_ms;
        // A tumbling window (and a session's own) holds only the record's
        // own slot: skip the second division (an assigner runs once per
        // record).
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

    /// Which family this is.
    pub(crate) fn kind(&self) -> WindowKind {
        self.kind
    }

    /// Which time the windows follow.
    pub(crate) fn domain(&self) -> TimeDomain {
        self.domain
    }

    /// The same windows on processing time.
    pub(crate) fn on_processing_time(mut self) -> Windows {
        self.domain = TimeDomain::ProcessingTime;
        self
    }

    /// The last event time inside the window a record at `start_ms` opens
    /// (its timer fires there).
    pub(crate) fn last_ms(&self, start_ms: u64) -> u64 {
        let length_ms = match self.kind {
            WindowKind::Fixed { size_ms, .. } => size_ms,
            WindowKind::Session { gap_ms } => gap_ms,
        };
        start_ms.saturating_add(length_ms - 1)
    }

    /// When a window whose last event time is `last_ms` is cleaned up.
    pub(crate) fn cleanup_ms(&self, last_ms: u64) -> u64 {
        last_ms.saturating_add(self.allowed_lateness_ms)
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
/// The same count is the operator's
/// [`OperatorReport::late_records_dropped`](crate::job::OperatorReport::late_records_dropped).
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

    /// Counts one more dropped record.
    pub(crate) fn count_one(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// The shared counter, for the job report.
    pub(crate) fn counter(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.dropped)
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
        assert_eq!(windows.cleanup_ms(119), 134);
        let edge = Windows::tumbling(60)
            .expect("valid")
            .allowed_lateness_ms(u64::MAX);
        assert_eq!(edge.cleanup_ms(119), u64::MAX, "saturates");
    }

    #[test]
    fn a_session_window_starts_at_its_record() {
        let sessions = Windows::session(30).expect("valid");
        assert_eq!(starts(sessions, 1_234), [1_234]);
        assert_eq!(sessions.last_ms(1_234), 1_263);
        assert_eq!(sessions.last_ms(u64::MAX), u64::MAX, "saturates");
    }
}
