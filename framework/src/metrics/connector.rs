//! What an operator shell hands the live metrics from the connector it
//! drives: a source's bytes read, lag and split positions, a sink's bytes
//! written.
//!
//! This module owns turning a connector's running totals (which start at
//! 0 with each connector object, so again after a restore) into additions
//! to the subtask's cell, which counts over every generation, and the
//! rate bound on split positions. It never asks a connector itself: the
//! shell calls [`SourceMeter::record`] or [`BytesSeen::delta`] once per
//! slice of work with what the connector returned.

use std::time::{Duration, Instant};

use super::cell::SubtaskCell;
use crate::source::{SourceFigures, SplitPosition};

/// How often a source's split positions are copied into its cell.
const SPLITS_REFRESH: Duration = Duration::from_secs(1);

/// The part of a running total not yet added to the cell.
#[derive(Debug, Default)]
pub(crate) struct BytesSeen(u64);

impl BytesSeen {
    /// What `total` adds since the last call. A total below the last one
    /// comes from a new connector object (made again on a restore), which
    /// counts from 0.
    pub(crate) fn delta(&mut self, total: u64) -> u64 {
        let delta = total.checked_sub(self.0).unwrap_or(total);
        self.0 = total;
        delta
    }
}

/// A source shell's side of its metrics.
#[derive(Debug, Default)]
pub(crate) struct SourceMeter {
    bytes: BytesSeen,
    splits_at: Option<Instant>,
    splits: Vec<SplitPosition>,
}

impl SourceMeter {
    /// Adds what `figures` bring to `cell`, and when a second passed
    /// since the last time by `now` (the slice's end, so no clock is
    /// read here), or `now_too` (at the source's end), the positions
    /// `positions` appends.
    pub(crate) fn record(
        &mut self,
        cell: &SubtaskCell,
        figures: SourceFigures,
        now: Instant,
        now_too: bool,
        positions: impl FnOnce(&mut Vec<SplitPosition>),
    ) {
        if let Some(total) = figures.bytes_read {
            cell.add_bytes_in(self.bytes.delta(total));
        }
        cell.set_pending(figures.pending_records, figures.pending_bytes);
        let due = self.splits_at.map_or(true, |at| {
            now.saturating_duration_since(at) >= SPLITS_REFRESH
        });
        if due || now_too {
            self.splits.clear();
            positions(&mut self.splits);
            cell.set_splits(&self.splits);
            self.splits_at = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_become_additions_across_connector_objects() {
        let mut seen = BytesSeen::default();
        assert_eq!(seen.delta(10), 10);
        assert_eq!(seen.delta(25), 15);
        assert_eq!(seen.delta(25), 0);
        assert_eq!(seen.delta(4), 4, "a new object counts from 0");
    }

    #[test]
    fn a_source_meter_fills_the_cell() {
        let cell = SubtaskCell::new(Instant::now());
        assert_eq!(cell.totals(Instant::now()).bytes_in, None);
        let mut meter = SourceMeter::default();
        let figures = SourceFigures {
            bytes_read: Some(0),
            pending_records: Some(7),
            pending_bytes: None,
        };
        let split = |position| SplitPosition {
            split: "t/0".into(),
            position,
            pending_records: Some(7),
        };
        meter.record(&cell, figures, Instant::now(), false, |out| {
            out.push(split(3))
        });
        assert_eq!(cell.totals(Instant::now()).bytes_in, Some(0), "known at 0");
        let figures = SourceFigures {
            bytes_read: Some(100),
            ..figures
        };
        // Within the second: the bytes and lag move, the positions wait.
        meter.record(&cell, figures, Instant::now(), false, |out| {
            out.push(split(9))
        });
        assert_eq!(cell.totals(Instant::now()).bytes_in, Some(100));
        assert_eq!(
            (cell.pending_records(), cell.pending_bytes()),
            (Some(7), None)
        );
        assert_eq!(cell.splits(), [split(3)]);
        meter.record(&cell, figures, Instant::now(), true, |out| {
            out.push(split(9))
        });
        assert_eq!(cell.splits(), [split(9)], "the end copies them at once");
    }
}
