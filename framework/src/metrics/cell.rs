//! The figures of one operator instance (subtask): a cell of atomics that
//! its actor writes and any thread reads, and the actor's local recorder
//! that adds to it once per slice of work.
//!
//! One writer per cell at a time (the subtask's actor of the current
//! generation; a restarted subtask's new actor adds to the same cell), so
//! every write is an uncontended relaxed `fetch_add` or `store` on a cache
//! line no other actor writes. Nothing here takes a lock on the record
//! path; two mutexes are touched once per checkpoint, and a source's
//! split positions at most once a second.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::source::SplitPosition;

/// How many checkpoints' synchronous parts a cell remembers until the
/// supervisor reads them at the ack (more in flight than this is
/// impossible with `max_concurrent_checkpoints` below it; older ones are
/// dropped first).
const SYNC_PARTS_MAX: usize = 16;

/// The shared figures of one subtask. Made by the
/// [`MetricsRegistry`](super::MetricsRegistry), written through a
/// [`SubtaskRecorder`] and the shell's setters, read by snapshots.
///
/// Aligned to 128 bytes (two cache lines, as adjacent-line prefetch pairs
/// them), so that two actors on two cores never write one line: cells are
/// small allocations that would otherwise sit side by side.
#[derive(Debug)]
#[repr(align(128))]
pub struct SubtaskCell {
    epoch: Instant,
    records_in: AtomicU64,
    batches_in: AtomicU64,
    records_out: AtomicU64,
    busy_ns: AtomicU64,
    backpressured_ns: AtomicU64,
    /// Nanoseconds since `epoch`, plus one, at which the running
    /// backpressure period began; 0 when there is none.
    backpressured_since_ns: AtomicU64,
    /// The output watermark plus one; 0 before the first one.
    watermark_ms: AtomicU64,
    /// Bytes read from outside the job (a source's) plus one; 0 while
    /// the subtask does not count them.
    bytes_in: AtomicU64,
    /// Bytes written outside the job (a sink's) plus one; 0 while the
    /// subtask does not count them.
    bytes_out: AtomicU64,
    /// A source's records not read yet, plus one; 0: unknown.
    pending_records: AtomicU64,
    /// A source's bytes not read yet, plus one; 0: unknown.
    pending_bytes: AtomicU64,
    /// Records a source dropped (bad records it was told to skip), plus
    /// one; 0 for an operator that is not a source.
    records_dropped: AtomicU64,
    /// The source position taken with the newest checkpoint, as text.
    position: Mutex<Option<String>>,
    /// A source's splits as numbers, written at most once a second.
    splits: Mutex<Vec<SplitPosition>>,
    /// (checkpoint, synchronous part in microseconds), newest last.
    sync_parts: Mutex<VecDeque<(u64, u64)>>,
}

/// What one read of a cell gives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CellTotals {
    pub(crate) records_in: u64,
    pub(crate) batches_in: u64,
    pub(crate) records_out: u64,
    pub(crate) busy_ns: u64,
    pub(crate) backpressured_ns: u64,
    pub(crate) bytes_in: Option<u64>,
    pub(crate) bytes_out: Option<u64>,
}

impl SubtaskCell {
    /// An empty cell whose times count from `epoch` (the registry makes
    /// them; public for benchmarks that time the recorder alone).
    pub fn new(epoch: Instant) -> Self {
        SubtaskCell {
            epoch,
            records_in: AtomicU64::new(0),
            batches_in: AtomicU64::new(0),
            records_out: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            backpressured_ns: AtomicU64::new(0),
            backpressured_since_ns: AtomicU64::new(0),
            watermark_ms: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            pending_records: AtomicU64::new(0),
            pending_bytes: AtomicU64::new(0),
            records_dropped: AtomicU64::new(0),
            position: Mutex::new(None),
            splits: Mutex::new(Vec::new()),
            sync_parts: Mutex::new(VecDeque::new()),
        }
    }

    fn since_epoch_ns(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The totals at `now`, counting a backpressure period still running.
    pub(crate) fn totals(&self, now: Instant) -> CellTotals {
        let mut backpressured_ns = self.backpressured_ns.load(Ordering::Relaxed);
        let since = self.backpressured_since_ns.load(Ordering::Relaxed);
        if since > 0 {
            let running = self.since_epoch_ns(now).saturating_sub(since - 1);
            backpressured_ns = backpressured_ns.saturating_add(running);
        }
        CellTotals {
            records_in: self.records_in.load(Ordering::Relaxed),
            batches_in: self.batches_in.load(Ordering::Relaxed),
            records_out: self.records_out.load(Ordering::Relaxed),
            busy_ns: self.busy_ns.load(Ordering::Relaxed),
            backpressured_ns,
            bytes_in: plus_one(&self.bytes_in),
            bytes_out: plus_one(&self.bytes_out),
        }
    }

    /// Adds `bytes` read from outside the job (a source's); from the
    /// first call on the subtask shows its bytes in, 0 included.
    pub fn add_bytes_in(&self, bytes: u64) {
        add_plus_one(&self.bytes_in, bytes);
    }

    /// Adds `bytes` written outside the job (a sink's).
    pub fn add_bytes_out(&self, bytes: u64) {
        add_plus_one(&self.bytes_out, bytes);
    }

    /// Sets a source's lag: records and bytes not read yet, when known.
    pub fn set_pending(&self, records: Option<u64>, bytes: Option<u64>) {
        store_plus_one(&self.pending_records, records);
        store_plus_one(&self.pending_bytes, bytes);
    }

    /// A source's records not read yet, if it knows.
    pub fn pending_records(&self) -> Option<u64> {
        plus_one(&self.pending_records)
    }

    /// A source's bytes not read yet, if it knows.
    pub fn pending_bytes(&self) -> Option<u64> {
        plus_one(&self.pending_bytes)
    }

    /// Adds `records` a source dropped; from the first call on (a source
    /// shell makes it with 0 as it opens its source) the subtask shows
    /// its dropped records, 0 included.
    pub fn add_records_dropped(&self, records: u64) {
        add_plus_one(&self.records_dropped, records);
    }

    /// Records a source dropped, over every generation (`None`: not a
    /// source).
    pub fn records_dropped(&self) -> Option<u64> {
        plus_one(&self.records_dropped)
    }

    /// Sets where a source's splits are (called at most once a second).
    pub fn set_splits(&self, splits: &[SplitPosition]) {
        let mut kept = lock(&self.splits);
        kept.clear();
        kept.extend_from_slice(splits);
    }

    /// Where the source's splits were at the last [`SubtaskCell::set_splits`].
    pub fn splits(&self) -> Vec<SplitPosition> {
        lock(&self.splits).clone()
    }

    /// Sets the watermark the subtask sent on (its output watermark).
    pub fn set_watermark(&self, watermark_ms: u64) {
        self.watermark_ms
            .store(watermark_ms.saturating_add(1), Ordering::Relaxed);
    }

    /// The newest output watermark, if any.
    pub fn watermark_ms(&self) -> Option<u64> {
        self.watermark_ms.load(Ordering::Relaxed).checked_sub(1)
    }

    /// Sets the source position taken with the newest checkpoint (called
    /// once per checkpoint, never per record).
    pub fn set_position(&self, position: &[u8]) {
        let text = describe_position(position);
        *lock(&self.position) = Some(text);
    }

    /// The source position taken with the newest checkpoint.
    pub fn position(&self) -> Option<String> {
        lock(&self.position).clone()
    }

    /// Notes how long the synchronous part of `checkpoint` took here.
    pub fn set_sync_part(&self, checkpoint: u64, sync_us: u64) {
        let mut parts = lock(&self.sync_parts);
        if parts.len() >= SYNC_PARTS_MAX {
            parts.pop_front();
        }
        parts.push_back((checkpoint, sync_us));
    }

    /// Takes what [`SubtaskCell::set_sync_part`] noted for `checkpoint`
    /// (0 when nothing was: a source's position costs nothing measurable).
    pub(crate) fn take_sync_part(&self, checkpoint: u64) -> u64 {
        let mut parts = lock(&self.sync_parts);
        let found = parts.iter().position(|(id, _)| *id == checkpoint);
        found
            .and_then(|index| parts.remove(index))
            .map_or(0, |(_, sync_us)| sync_us)
    }
}

/// The value of a counter or gauge kept plus one (0: none).
fn plus_one(value: &AtomicU64) -> Option<u64> {
    value.load(Ordering::Relaxed).checked_sub(1)
}

/// Adds to a counter kept plus one, making it known on the first add
/// (a zero add after that writes nothing). The first add's load and add
/// are two steps; only one actor writes a cell at a time, so none races
/// it.
fn add_plus_one(value: &AtomicU64, add: u64) {
    let known = value.load(Ordering::Relaxed) > 0;
    let add = if known { add } else { add.saturating_add(1) };
    if add > 0 {
        value.fetch_add(add, Ordering::Relaxed);
    }
}

/// Sets a gauge kept plus one.
fn store_plus_one(value: &AtomicU64, to: Option<u64>) {
    let new = to.map_or(0, |to| to.saturating_add(1));
    if value.load(Ordering::Relaxed) != new {
        value.store(new, Ordering::Relaxed);
    }
}

/// A position made by `SourcePosition::from_index` is its number; any
/// other is its length and first bytes in hex.
fn describe_position(bytes: &[u8]) -> String {
    if let Ok(index) = <[u8; 8]>::try_from(bytes) {
        return u64::from_le_bytes(index).to_string();
    }
    let head: String = bytes.iter().take(16).map(|b| format!("{b:02x}")).collect();
    let more = if bytes.len() > 16 { "…" } else { "" };
    format!("{} bytes: {head}{more}", bytes.len())
}

/// A poisoned lock holds a value that was consistent when the panic hit
/// (every critical section here is one assignment or one queue step).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The actor-local side of a [`SubtaskCell`]: counts in plain integers and
/// adds them to the cell at [`SubtaskRecorder::flush`], which the actor
/// calls once per slice of work (at most a few dozen batches), not per
/// batch or record.
#[derive(Debug)]
pub struct SubtaskRecorder {
    cell: Arc<SubtaskCell>,
    records_in: u64,
    batches_in: u64,
    /// The sum of the outputs' sent records at the last flush.
    records_out_seen: u64,
    busy_ns: u64,
    backpressured_since: Option<Instant>,
}

impl SubtaskRecorder {
    /// A recorder adding to `cell`.
    pub fn new(cell: Arc<SubtaskCell>) -> Self {
        SubtaskRecorder {
            cell,
            records_in: 0,
            batches_in: 0,
            records_out_seen: 0,
            busy_ns: 0,
            backpressured_since: None,
        }
    }

    /// One batch of `records` was taken as input.
    #[inline]
    pub fn on_batch(&mut self, records: usize) {
        self.records_in += records as u64;
        self.batches_in += 1;
    }

    /// The actor worked from `started` to `ended`.
    #[inline]
    pub fn busy(&mut self, started: Instant, ended: Instant) {
        let spent = ended.saturating_duration_since(started).as_nanos();
        self.busy_ns += u64::try_from(spent).unwrap_or(u64::MAX);
    }

    /// Whether a backpressure period is running.
    pub fn is_backpressured(&self) -> bool {
        self.backpressured_since.is_some()
    }

    /// An output ran out of credit at `now` (nothing if a period runs).
    pub fn backpressure_started(&mut self, now: Instant) {
        if self.backpressured_since.is_none() {
            self.backpressured_since = Some(now);
            let since = self.cell.since_epoch_ns(now).saturating_add(1);
            self.cell
                .backpressured_since_ns
                .store(since, Ordering::Relaxed);
        }
    }

    /// Every output has credit again at `now`.
    pub fn backpressure_ended(&mut self, now: Instant) {
        if let Some(since) = self.backpressured_since.take() {
            let spent = now.saturating_duration_since(since).as_nanos();
            let spent = u64::try_from(spent).unwrap_or(u64::MAX);
            // Added before the running period is cleared, so a reader in
            // between counts the period twice at most for an instant,
            // never loses it.
            self.cell
                .backpressured_ns
                .fetch_add(spent, Ordering::Relaxed);
            self.cell.backpressured_since_ns.store(0, Ordering::Relaxed);
        }
    }

    /// Adds what was counted since the last flush to the cell;
    /// `records_out_total` is the sum of the actor's outputs' sent records
    /// (their channel counters, which start at 0 with the actor).
    pub fn flush(&mut self, records_out_total: u64) {
        let cell = &self.cell;
        if self.records_in > 0 {
            cell.records_in
                .fetch_add(self.records_in, Ordering::Relaxed);
            cell.batches_in
                .fetch_add(self.batches_in, Ordering::Relaxed);
            self.records_in = 0;
            self.batches_in = 0;
        }
        let out = records_out_total.saturating_sub(self.records_out_seen);
        if out > 0 {
            cell.records_out.fetch_add(out, Ordering::Relaxed);
            self.records_out_seen = records_out_total;
        }
        if self.busy_ns > 0 {
            cell.busy_ns.fetch_add(self.busy_ns, Ordering::Relaxed);
            self.busy_ns = 0;
        }
    }
}

impl Drop for SubtaskRecorder {
    /// A stopped actor's running backpressure period ends with it.
    fn drop(&mut self) {
        self.backpressure_ended(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn flushed_counts_and_backpressure_reach_the_cell() {
        let epoch = Instant::now();
        let cell = Arc::new(SubtaskCell::new(epoch));
        let mut recorder = SubtaskRecorder::new(Arc::clone(&cell));
        recorder.on_batch(10);
        recorder.on_batch(5);
        assert_eq!(cell.totals(epoch).records_in, 0, "nothing before a flush");
        recorder.flush(7);
        recorder.flush(9);
        let start = epoch + Duration::from_millis(1);
        recorder.backpressure_started(start);
        let running = cell.totals(start + Duration::from_millis(3));
        assert_eq!(
            running.backpressured_ns, 3_000_000,
            "a running period counts"
        );
        recorder.backpressure_ended(start + Duration::from_millis(5));
        let totals = cell.totals(start + Duration::from_secs(1));
        assert_eq!(
            (totals.records_in, totals.batches_in, totals.records_out),
            (15, 2, 9)
        );
        assert_eq!(totals.backpressured_ns, 5_000_000);
    }

    #[test]
    fn watermarks_positions_and_sync_parts() {
        let cell = SubtaskCell::new(Instant::now());
        assert_eq!(cell.watermark_ms(), None);
        cell.set_watermark(0);
        assert_eq!(cell.watermark_ms(), Some(0));
        cell.set_position(&42u64.to_le_bytes());
        assert_eq!(cell.position().as_deref(), Some("42"));
        cell.set_position(&[1, 2, 3]);
        assert_eq!(cell.position().as_deref(), Some("3 bytes: 010203"));
        for checkpoint in 0..20 {
            cell.set_sync_part(checkpoint, checkpoint * 10);
        }
        assert_eq!(cell.take_sync_part(19), 190);
        assert_eq!(cell.take_sync_part(19), 0, "taken once");
        assert_eq!(cell.take_sync_part(1), 0, "the oldest were dropped");
    }
}
