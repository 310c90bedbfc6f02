//! Watermarks per source split and idleness, through real jobs.
//!
//! - More source subtasks than splits: the subtasks without a split mark
//!   themselves idle at once (no idleness timeout is set), so windows fire
//!   while the job still runs, at window parallelism 1, 2 and 3. Without
//!   that the split-less subtasks would hold the watermark back until the
//!   end of input, and the sources here only end once a window fired (or
//!   at a 10 s deadline, which the test reports as the failure).
//! - An idle split that wakes up holds the watermark back again: a source
//!   subtask reads two splits; split A is quiet, goes idle on a test clock,
//!   and the watermark follows split B; then A reads again, behind B, and
//!   the watermark stops at A's until the test clock makes A idle again.
//! - After a restore, a stage whose inputs are all idle stays idle
//!   downstream (it sends its idleness mark again, not its old
//!   watermark), so the windows keep firing while the other subtask reads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use snapflow::job::{Job, JobConfig, Stream};
use snapflow::sink::CollectHandle;
use snapflow::source::{Source, SourceError, SourceFactory, SourcePoll, SourcePosition, SplitId};
use snapflow::time::{LateRecords, ManualClock, WatermarkStrategy, Windowed, Windows};

/// The window size.
const WINDOW_MS: u64 = 1_000;
/// How long a source waits for a window to fire before it gives up.
const DEADLINE: Duration = Duration::from_secs(10);

/// What the sources and the job's output share.
#[derive(Default)]
struct Progress {
    /// The highest window end that reached the output so far.
    fired_end_ms: AtomicU64,
    /// A source gave up waiting (the watermark did not move).
    gave_up: AtomicBool,
}

impl Progress {
    fn fired(&self, end_ms: u64) {
        self.fired_end_ms.fetch_max(end_ms, Ordering::SeqCst);
    }

    fn fired_end_ms(&self) -> u64 {
        self.fired_end_ms.load(Ordering::SeqCst)
    }
}

/// Event times `0..records` in one split, read by subtask 0; every other
/// subtask has no split. A subtask ends once a window fired.
#[derive(Clone)]
struct OnePartition {
    records: u64,
    progress: Arc<Progress>,
}

struct OnePartitionReader {
    /// `None` for a subtask without a split.
    next: Option<u64>,
    records: u64,
    progress: Arc<Progress>,
    started: Instant,
}

impl SourceFactory for OnePartition {
    type Source = OnePartitionReader;

    fn split(&self, subtask: usize, _parallelism: usize) -> Result<Self::Source, SourceError> {
        Ok(OnePartitionReader {
            next: (subtask == 0).then_some(0),
            records: self.records,
            progress: Arc::clone(&self.progress),
            started: Instant::now(),
        })
    }
}

impl Source for OnePartitionReader {
    type Item = u64;

    fn poll_batch(&mut self, out: &mut Vec<u64>, max: usize) -> Result<SourcePoll, SourceError> {
        if let Some(next) = self.next.filter(|next| *next < self.records) {
            let end = self.records.min(next + max as u64);
            out.extend(next..end);
            self.next = Some(end);
            return Ok(SourcePoll::Produced((end - next) as usize));
        }
        if self.progress.fired_end_ms() > 0 {
            return Ok(SourcePoll::Ended);
        }
        if self.started.elapsed() > DEADLINE {
            self.progress.gave_up.store(true, Ordering::SeqCst);
            return Ok(SourcePoll::Ended);
        }
        Ok(SourcePoll::Idle)
    }

    fn position(&self) -> SourcePosition {
        SourcePosition::from_index(self.next.unwrap_or(0))
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), SourceError> {
        if self.next.is_some() {
            self.next = Some(position.to_index()?);
        }
        Ok(())
    }

    fn current_splits(&self, out: &mut Vec<SplitId>) {
        if self.next.is_some() {
            out.push(0);
        }
    }
}

/// Per (key, window end), the count of event times `0..records` with
/// that key (`ts % 2`).
fn expected_counts(records: u64) -> Vec<(u64, u64, u64)> {
    let mut counts = std::collections::BTreeMap::new();
    for ts in 0..records {
        let end_ms = (ts / WINDOW_MS + 1) * WINDOW_MS;
        *counts.entry((ts % 2, end_ms)).or_insert(0) += 1;
    }
    counts.into_iter().map(|((k, e), c)| (k, e, c)).collect()
}

fn sorted(windows: Vec<Windowed<u64, u64>>) -> Vec<(u64, u64, u64)> {
    let mut rows: Vec<_> = windows
        .into_iter()
        .map(|window| (window.key, window.end_ms, window.result))
        .collect();
    rows.sort_unstable();
    rows
}

/// Counts `events` per `ts % 2` in tumbling windows into `output`, and
/// notes each firing in `progress`.
fn count_windows(
    events: Stream<'_, u64>,
    progress: &Arc<Progress>,
    output: &CollectHandle<Windowed<u64, u64>>,
) -> LateRecords {
    let seen = Arc::clone(progress);
    let (windows, late) = events
        .key_by(|ts: &u64| ts % 2)
        .window(Windows::tumbling(WINDOW_MS).expect("valid"), |ts: &u64| *ts)
        .count("count");
    windows
        .map("seen", move |window: Windowed<u64, u64>| {
            seen.fired(window.end_ms);
            window
        })
        .sink("out", output.clone());
    late
}

fn check_more_subtasks_than_splits(parallelism: usize) {
    let records = 5_000;
    let progress = Arc::new(Progress::default());
    let config = JobConfig {
        default_parallelism: parallelism,
        batch_size_max: 64,
        ..JobConfig::default()
    };
    let job = Job::new("splitless", config);
    let output = CollectHandle::new();
    let source = OnePartition {
        records,
        progress: Arc::clone(&progress),
    };
    let events = job
        .source("events", source)
        .parallelism(3)
        .assign_timestamps(WatermarkStrategy::monotonous(|ts: &u64| *ts));
    let late = count_windows(events, &progress, &output);
    job.run().expect("the job runs");
    assert!(
        !progress.gave_up.load(Ordering::SeqCst),
        "parallelism {parallelism}: no window fired while the sources ran; the subtasks \
         without a split held the watermark back"
    );
    assert_eq!(sorted(output.committed()), expected_counts(records));
    assert_eq!(late.dropped(), 0);
}

#[test]
fn subtasks_without_a_split_do_not_hold_the_watermark_at_parallelism_1() {
    check_more_subtasks_than_splits(1);
}

#[test]
fn subtasks_without_a_split_do_not_hold_the_watermark_at_parallelism_2() {
    check_more_subtasks_than_splits(2);
}

#[test]
fn subtasks_without_a_split_do_not_hold_the_watermark_at_parallelism_3() {
    check_more_subtasks_than_splits(3);
}

/// Split A.
const A: SplitId = 1;
/// Split B.
const B: SplitId = 2;
/// The idleness timeout, on the test clock.
const IDLENESS_MS: u64 = 100;

/// A scripted source subtask of two splits. Each step says what the
/// subtask reads; the clock is the strategy's, advanced only by the
/// script, so a split is idle exactly when the script says.
struct TwoSplits {
    clock: ManualClock,
    progress: Arc<Progress>,
    /// What the windows had fired while split A held the watermark back.
    held_at_end_ms: Arc<AtomicU64>,
}

struct TwoSplitsReader {
    clock: ManualClock,
    progress: Arc<Progress>,
    held_at_end_ms: Arc<AtomicU64>,
    step: u8,
    /// The records of the current step still to hand out: (split, ts).
    pending: Vec<(SplitId, u64)>,
    last_split: SplitId,
    waiting_since: Option<Instant>,
    started: Instant,
}

impl SourceFactory for TwoSplits {
    type Source = TwoSplitsReader;

    fn split(&self, _subtask: usize, _parallelism: usize) -> Result<Self::Source, SourceError> {
        Ok(TwoSplitsReader {
            clock: self.clock.clone(),
            progress: Arc::clone(&self.progress),
            held_at_end_ms: Arc::clone(&self.held_at_end_ms),
            step: 0,
            pending: b_reads(0..4_000),
            last_split: B,
            waiting_since: None,
            started: Instant::now(),
        })
    }
}

impl TwoSplitsReader {
    /// Hands out pending records of one split, oldest first.
    fn hand_out(&mut self, out: &mut Vec<(SplitId, u64)>, max: usize) -> usize {
        let split = self.pending.last().map_or(B, |(split, _)| *split);
        let mut produced = 0;
        while produced < max && self.pending.last().is_some_and(|(s, _)| *s == split) {
            out.extend(self.pending.pop());
            produced += 1;
        }
        self.last_split = split;
        produced
    }

    /// Waits (idle) until the windows fired up to `end_ms`; true once they
    /// have. Past the deadline it gives up and says so.
    fn fired_up_to(&self, end_ms: u64) -> bool {
        if self.progress.fired_end_ms() >= end_ms {
            return true;
        }
        if self.started.elapsed() > DEADLINE {
            eprintln!(
                "step {}: waited in vain for windows up to {end_ms} ms (fired up to {})",
                self.step,
                self.progress.fired_end_ms()
            );
            self.progress.gave_up.store(true, Ordering::SeqCst);
            return true;
        }
        false
    }

    /// Runs the script one poll further; `None` keeps the subtask idle.
    /// The clock moves only while B reads on, so that B stays active and
    /// only the quiet split A turns idle.
    fn advance(&mut self) -> Option<SourcePoll> {
        match self.step {
            // B read 0..4000, A nothing: the clock makes A idle, and B
            // reads on, 4000..5000.
            0 => {
                self.clock.advance_ms(IDLENESS_MS);
                self.pending = b_reads(4_000..5_000);
                self.step = 1;
            }
            // The watermark followed B alone: windows up to 4000 fired.
            // Then A wakes up at 6000, behind B's 5000..20000.
            1 if self.fired_up_to(4_000) => {
                self.pending = b_reads(5_000..20_000);
                self.pending.push((A, 6_000));
                self.step = 2;
            }
            // A is not idle (the clock stands still): the watermark stops
            // at A's 5999, so the window ending at 6000 fires and none
            // after it. Hold for another 200 ms to see nothing more fire,
            // then make A idle again while B reads 20000..21000.
            2 if self.fired_up_to(6_000) => {
                let since = *self.waiting_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_millis(200) {
                    let held = self.progress.fired_end_ms();
                    self.held_at_end_ms.store(held, Ordering::SeqCst);
                    self.clock.advance_ms(IDLENESS_MS);
                    self.pending = b_reads(20_000..21_000);
                    self.step = 3;
                }
            }
            // A idle again: the watermark follows B to 20998.
            3 if self.fired_up_to(20_000) => return Some(SourcePoll::Ended),
            _ => {}
        }
        None
    }
}

/// Split B's reads of the event times `range`, as a stack (the next one
/// last).
fn b_reads(range: std::ops::Range<u64>) -> Vec<(SplitId, u64)> {
    range.rev().map(|ts| (B, ts)).collect()
}

impl Source for TwoSplitsReader {
    type Item = (SplitId, u64);

    fn poll_batch(
        &mut self,
        out: &mut Vec<(SplitId, u64)>,
        max: usize,
    ) -> Result<SourcePoll, SourceError> {
        if !self.pending.is_empty() {
            return Ok(SourcePoll::Produced(self.hand_out(out, max)));
        }
        Ok(self.advance().unwrap_or(SourcePoll::Idle))
    }

    fn position(&self) -> SourcePosition {
        SourcePosition::from_index(0)
    }

    fn seek(&mut self, _position: &SourcePosition) -> Result<(), SourceError> {
        Ok(())
    }

    fn can_seek(&self) -> bool {
        false
    }

    fn current_splits(&self, out: &mut Vec<SplitId>) {
        out.extend([A, B]);
    }

    fn last_split(&self) -> SplitId {
        self.last_split
    }
}

#[test]
fn an_idle_split_that_wakes_up_holds_the_watermark_back_again() {
    let clock = ManualClock::new(0);
    let progress = Arc::new(Progress::default());
    let held_at_end_ms = Arc::new(AtomicU64::new(0));
    let config = JobConfig {
        default_parallelism: 2,
        batch_size_max: 64,
        ..JobConfig::default()
    };
    let job = Job::new("wake-up", config);
    let output = CollectHandle::new();
    let source = TwoSplits {
        clock: clock.clone(),
        progress: Arc::clone(&progress),
        held_at_end_ms: Arc::clone(&held_at_end_ms),
    };
    let strategy = WatermarkStrategy::monotonous(|(_, ts): &(SplitId, u64)| *ts)
        .with_idleness(IDLENESS_MS)
        .with_clock(clock);
    let seen = Arc::clone(&progress);
    let (windows, late) = job
        .source("events", source)
        .parallelism(1)
        .assign_timestamps(strategy)
        .key_by(|(split, _): &(SplitId, u64)| u64::from(*split))
        .window(Windows::tumbling(WINDOW_MS).expect("valid"), |(_, ts)| *ts)
        .count("count");
    windows
        .map("seen", move |window: Windowed<u64, u64>| {
            seen.fired(window.end_ms);
            window
        })
        .sink("out", output.clone());
    job.run().expect("the job runs");
    assert!(
        !progress.gave_up.load(Ordering::SeqCst),
        "a step of the script waited in vain (fired up to {} ms)",
        progress.fired_end_ms()
    );
    assert_eq!(
        held_at_end_ms.load(Ordering::SeqCst),
        6_000,
        "while split A was awake at 6000 the windows fired up to its watermark and no further"
    );
    let rows = sorted(output.committed());
    let mut want: Vec<(u64, u64, u64)> = (1..=21)
        .map(|window| (u64::from(B), window * WINDOW_MS, WINDOW_MS))
        .collect();
    want.push((u64::from(A), 7_000, 1));
    want.sort_unstable();
    assert_eq!(rows, want);
    assert_eq!(late.dropped(), 0);
}

/// Records per read of [`QuietAfterStart`]'s subtask 0.
const STEADY_PER_READ: usize = 8;
/// Subtask 0's event times, one per record.
const STEADY_RECORDS: u64 = 3_000;
/// Subtask 1 reads these first few event times, then nothing.
const EARLY_RECORDS: u64 = 10;

/// Subtask 0 reads event times `0..STEADY_RECORDS` at a pace; subtask 1
/// reads `0..EARLY_RECORDS` at once and then nothing, so its split goes
/// idle after the idleness timeout. Neither ends before the window ending
/// at `STEADY_RECORDS - WINDOW_MS` fired (or the deadline passed: a
/// failure), so the end of input cannot hide a stuck watermark.
#[derive(Clone)]
struct QuietAfterStart {
    progress: Arc<Progress>,
    started: Instant,
}

struct QuietAfterStartReader {
    source: QuietAfterStart,
    next: u64,
    records: u64,
    rest: bool,
}

impl SourceFactory for QuietAfterStart {
    type Source = QuietAfterStartReader;

    fn split(&self, subtask: usize, _parallelism: usize) -> Result<Self::Source, SourceError> {
        let records = if subtask == 0 {
            STEADY_RECORDS
        } else {
            EARLY_RECORDS
        };
        Ok(QuietAfterStartReader {
            source: self.clone(),
            next: 0,
            records,
            rest: false,
        })
    }
}

impl Source for QuietAfterStartReader {
    type Item = u64;

    fn poll_batch(&mut self, out: &mut Vec<u64>, max: usize) -> Result<SourcePoll, SourceError> {
        if self.next < self.records {
            self.rest = !self.rest;
            if self.rest {
                return Ok(SourcePoll::Idle);
            }
            let end = self
                .records
                .min(self.next + max.min(STEADY_PER_READ) as u64);
            out.extend(self.next..end);
            let produced = (end - self.next) as usize;
            self.next = end;
            return Ok(SourcePoll::Produced(produced));
        }
        // The last window but one fires only after the failure.
        if self.source.progress.fired_end_ms() >= STEADY_RECORDS - WINDOW_MS {
            return Ok(SourcePoll::Ended);
        }
        if self.source.started.elapsed() > DEADLINE {
            self.source.progress.gave_up.store(true, Ordering::SeqCst);
            return Ok(SourcePoll::Ended);
        }
        Ok(SourcePoll::Idle)
    }

    fn position(&self) -> SourcePosition {
        SourcePosition::from_index(self.next)
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), SourceError> {
        self.next = position.to_index()?;
        Ok(())
    }
}

/// After a restore, a stage whose inputs are all idle stays idle
/// downstream: source subtask 1's split went idle long before the
/// injected failure, and the windows keep firing while subtask 0 reads
/// on. (A restored stage that sent its old watermark instead made its
/// output active again downstream and held the window operator's
/// watermark there until the end of input.)
#[test]
fn an_idle_stage_stays_idle_downstream_after_a_restore() {
    snapflow_tests::quiet_injected_panics();
    let progress = Arc::new(Progress::default());
    let store: Arc<dyn snapflow::storage::CheckpointStore> = Arc::new(
        snapflow::storage::MemoryCheckpointStore::new("idle").expect("a memory store opens"),
    );
    let job = Job::new("idle", snapflow_tests::event_time_config(&store, 1));
    let source = QuietAfterStart {
        progress: Arc::clone(&progress),
        started: Instant::now(),
    };
    let faults = snapflow_tests::Faults::new(vec![(
        "faults",
        STEADY_RECORDS / 2,
        snapflow_tests::FaultKind::Panic,
    )]);
    let check = faults.clone();
    let output = CollectHandle::new();
    let events = job
        .source("events", source)
        .parallelism(2)
        .assign_timestamps(WatermarkStrategy::monotonous(|ts: &u64| *ts).with_idleness(20))
        .map("faults", move |ts: u64| {
            check.check_or_panic("faults", ts);
            ts
        })
        .parallelism(2);
    let late = count_windows(events, &progress, &output);
    let report = job.run().expect("the job runs");
    assert_eq!(faults.fired(), 1, "the failure happened");
    assert_eq!(report.restarts.len(), 1);
    assert!(
        !progress.gave_up.load(Ordering::SeqCst),
        "the windows stopped firing after the restore: the idle stage held the watermark back"
    );
    let mut want = expected_counts(STEADY_RECORDS);
    for (key, end_ms, count) in &mut want {
        let early = (0..EARLY_RECORDS)
            .filter(|ts| ts % 2 == *key && (ts / WINDOW_MS + 1) * WINDOW_MS == *end_ms)
            .count() as u64;
        *count += early;
    }
    assert_eq!(sorted(output.committed()), want);
    assert_eq!(late.dropped(), 0);
}
