//! Watermarks inside recorded channel state and on the back edge of a
//! loop, through real jobs.
//!
//! - Unaligned checkpoints record the window operator's input while a
//!   slow stage drains: a source subtask with no split sends its barrier
//!   at once, so the window operator (two inputs, both Record) snapshots
//!   at that barrier and records the other input, batches and watermarks
//!   alike, until its barrier comes. Records made late on purpose lie
//!   just far enough back that the watermark closing their window came a
//!   few batches before them, so it is often inside the recorded state
//!   with them. After injected panics the committed windows and the late
//!   records equal the failure-free run's exactly: a restore replays the
//!   recorded watermarks in their place, so a record that was late stays
//!   late. (Before recorded state kept its watermarks, such a record
//!   joined its window after a restore and the window counted one more.)
//! - A loop with event time: every record goes around a loop before it
//!   reaches tumbling windows; the loop's back edge carries records and
//!   its watermarks, and must not hold the loop head's watermark back, so
//!   windows fire while the source still runs (the source ends only once
//!   a window fired, or gives up after 10 s, which the test reports).
//!
//! Seeds: `SNAPFLOW_CHANNEL_SEEDS` (default 2) seeds from 1 on;
//! `SNAPFLOW_SEED=n` replays seed n.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use snapflow::job::{Job, JobConfig, RestartStrategy};
use snapflow::protocol::SnapshotMode;
use snapflow::sink::CollectHandle;
use snapflow::source::{Source, SourceError, SourceFactory, SourcePoll, SourcePosition, SplitId};
use snapflow::storage::{CheckpointStore, MemoryCheckpointStore};
use snapflow::time::{WatermarkStrategy, Windowed, Windows};
use snapflow_tests::{event_time_config, quiet_injected_panics, seeds, FaultKind, Faults, TestRng};

/// `(id, user, event time)`.
type Event = (u64, u32, u64);

const EVENTS: u64 = 1_500;
const USERS: u64 = 3;
const STEP_MS: u64 = 10;
const BOUND_MS: u64 = 100;
const WINDOW_MS: u64 = 200;
const EPOCH_MS: u64 = 1_700_000_000_000;
/// Records per source read.
const READ_MAX: usize = 8;
/// How far before its place a late record lies: past its window's end by
/// the bound and a read and more (the watermark a record meets is the
/// one after the read before its own), so it is late however the reads
/// fall, and no further, so the watermark that closed its window came at
/// most `(WINDOW_MS + 10 * STEP_MS) / STEP_MS` records before it.
const LATE_BY_MS: u64 = WINDOW_MS + BOUND_MS + (READ_MAX as u64 + 2) * STEP_MS;
/// How long the slow stage takes per record, so that its queue fills and
/// in-flight batches are recorded at the window operator.
const SLOW_PER_RECORD: Duration = Duration::from_micros(250);

fn is_late(id: u64) -> bool {
    id >= 200 && id % 6 == 3
}

fn events() -> Vec<Event> {
    (0..EVENTS)
        .map(|id| {
            let base_ms = EPOCH_MS + id * STEP_MS;
            let ts_ms = if is_late(id) {
                base_ms - LATE_BY_MS
            } else {
                base_ms
            };
            (id, (id % USERS) as u32, ts_ms)
        })
        .collect()
}

/// Subtask 0 reads every event, `READ_MAX` per read with a rest between
/// reads; every other subtask has no split (idle at once) and ends once
/// subtask 0 has read everything.
#[derive(Clone)]
struct Lopsided {
    events: Arc<Vec<Event>>,
    done: Arc<AtomicBool>,
}

struct LopsidedReader {
    events: Arc<Vec<Event>>,
    done: Arc<AtomicBool>,
    /// `None` for a subtask without a split.
    next: Option<usize>,
    rest: bool,
}

impl SourceFactory for Lopsided {
    type Source = LopsidedReader;

    fn split(&self, subtask: usize, _parallelism: usize) -> Result<Self::Source, SourceError> {
        Ok(LopsidedReader {
            events: Arc::clone(&self.events),
            done: Arc::clone(&self.done),
            next: (subtask == 0).then_some(0),
            rest: false,
        })
    }
}

impl Source for LopsidedReader {
    type Item = Event;

    fn poll_batch(&mut self, out: &mut Vec<Event>, max: usize) -> Result<SourcePoll, SourceError> {
        let Some(next) = self.next else {
            if self.done.load(Ordering::SeqCst) {
                return Ok(SourcePoll::Ended);
            }
            return Ok(SourcePoll::Idle);
        };
        if next >= self.events.len() {
            self.done.store(true, Ordering::SeqCst);
            return Ok(SourcePoll::Ended);
        }
        self.rest = !self.rest;
        if self.rest {
            return Ok(SourcePoll::Idle);
        }
        let end = self.events.len().min(next + max.min(READ_MAX));
        out.extend_from_slice(&self.events[next..end]);
        self.next = Some(end);
        Ok(SourcePoll::Produced(end - next))
    }

    fn position(&self) -> SourcePosition {
        SourcePosition::from_index(self.next.unwrap_or(0) as u64)
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), SourceError> {
        if self.next.is_some() {
            self.next = Some(position.to_index()? as usize);
        }
        Ok(())
    }

    fn current_splits(&self, out: &mut Vec<SplitId>) {
        if self.next.is_some() {
            out.push(0);
        }
    }
}

/// A run's committed output: `(user, start, end, count)` sorted, and the
/// ids of the late records sorted.
#[derive(Debug, PartialEq, Eq)]
struct Output {
    windows: Vec<(u32, u64, u64, u64)>,
    late: Vec<u64>,
}

/// source (2 subtasks) → slow (2) → tumbling window counts (1), late
/// records to a side output; unaligned checkpoints every 5 ms.
fn run_unaligned(faults: &Faults) -> Output {
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("channels").expect("a memory store opens"));
    // Four arbiters: the slow stage sleeps on its own thread, so the
    // source reads ahead of it and its queue fills.
    let config = JobConfig {
        mode: SnapshotMode::Unaligned,
        arbiters: Some(4),
        ..event_time_config(&store, 1)
    };
    let job = Job::new("channels", config);
    let source = Lopsided {
        events: Arc::new(events()),
        done: Arc::new(AtomicBool::new(false)),
    };
    let faults = faults.clone();
    let (fired, late) = (CollectHandle::new(), CollectHandle::new());
    let (windows, late_records) = job
        .source("events", source)
        .parallelism(2)
        .assign_timestamps(WatermarkStrategy::bounded_out_of_orderness(
            BOUND_MS,
            |event: &Event| event.2,
        ))
        .map("slow", move |event: Event| {
            faults.check_or_panic("slow", event.0);
            std::thread::sleep(SLOW_PER_RECORD);
            event
        })
        .parallelism(2)
        .key_by(|event: &Event| event.1)
        .window(
            Windows::tumbling(WINDOW_MS).expect("a valid size"),
            |event: &Event| event.2,
        )
        .side_output_late()
        .count("window");
    windows.sink("collect", fired.clone()).parallelism(1);
    late_records.sink("late", late.clone()).parallelism(1);
    job.run()
        .unwrap_or_else(|error| panic!("the job failed: {error}"));
    let mut windows: Vec<_> = fired
        .committed()
        .into_iter()
        .map(|w: Windowed<u32, u64>| (w.key, w.start_ms, w.end_ms, w.result))
        .collect();
    windows.sort_unstable();
    let mut late: Vec<u64> = late.committed().into_iter().map(|e: Event| e.0).collect();
    late.sort_unstable();
    Output { windows, late }
}

/// The failure-free result computed directly: the records made late are
/// late, every other one is counted in its window.
fn direct() -> Output {
    let mut counts: BTreeMap<(u32, u64, u64), u64> = BTreeMap::new();
    let mut late = Vec::new();
    for (id, user, ts_ms) in events() {
        if is_late(id) {
            late.push(id);
            continue;
        }
        let start_ms = ts_ms - ts_ms % WINDOW_MS;
        *counts
            .entry((user, start_ms, start_ms + WINDOW_MS))
            .or_default() += 1;
    }
    let windows = counts
        .into_iter()
        .map(|((user, start, end), count)| (user, start, end, count))
        .collect();
    Output { windows, late }
}

#[test]
fn restores_replay_recorded_watermarks_in_order() {
    quiet_injected_panics();
    let want = direct();
    let clean = run_unaligned(&Faults::none());
    assert_eq!(clean, want, "the failure-free run equals the direct result");
    for seed in seeds("SNAPFLOW_CHANNEL_SEEDS", 2) {
        let mut rng = TestRng::new(seed);
        let planned: Vec<_> = (0..3)
            .map(|_| ("slow", rng.between(300, EVENTS - 100), FaultKind::Panic))
            .collect();
        let faults = Faults::new(planned.clone());
        let faulty = run_unaligned(&faults);
        let context = format!("SNAPFLOW_SEED={seed} faults {planned:?}");
        assert_eq!(
            faults.fired(),
            faults.planned(),
            "{context}: not every fault fired"
        );
        let extra_late: Vec<_> = want
            .late
            .iter()
            .filter(|id| !faulty.late.contains(id))
            .collect();
        let differs = want
            .windows
            .iter()
            .zip(&faulty.windows)
            .find(|(a, b)| a != b);
        assert_eq!(
            faulty, clean,
            "{context}: the run with restores differs from the failure-free one; late records \
             not sent out as late {extra_late:?}, first different window {differs:?}"
        );
    }
}

/// Event times `0..LOOP_RECORDS` (ms), then, once every one of them left
/// the loop, one far later record that moves the watermark past every
/// window; the source ends once a window fired.
#[derive(Clone)]
struct LoopInput {
    exited: Arc<AtomicU64>,
    fired: Arc<AtomicBool>,
    gave_up: Arc<AtomicBool>,
}

const LOOP_RECORDS: u64 = 600;
const LOOP_WINDOW_MS: u64 = 100;
/// Longer than the records' span, so no record that loops is late.
const LOOP_BOUND_MS: u64 = 1_000;
const LAST_TS_MS: u64 = 1_000_000;
const DEADLINE: Duration = Duration::from_secs(10);

struct LoopReader {
    input: LoopInput,
    next: u64,
    started: Instant,
}

impl SourceFactory for LoopInput {
    type Source = LoopReader;

    fn split(&self, _subtask: usize, _parallelism: usize) -> Result<Self::Source, SourceError> {
        Ok(LoopReader {
            input: self.clone(),
            next: 0,
            started: Instant::now(),
        })
    }
}

impl Source for LoopReader {
    type Item = u64;

    fn poll_batch(&mut self, out: &mut Vec<u64>, max: usize) -> Result<SourcePoll, SourceError> {
        if self.next < LOOP_RECORDS {
            let end = LOOP_RECORDS.min(self.next + max.min(16) as u64);
            out.extend(self.next..end);
            let produced = (end - self.next) as usize;
            self.next = end;
            return Ok(SourcePoll::Produced(produced));
        }
        if self.input.fired.load(Ordering::SeqCst) {
            return Ok(SourcePoll::Ended);
        }
        if self.started.elapsed() > DEADLINE {
            self.input.gave_up.store(true, Ordering::SeqCst);
            return Ok(SourcePoll::Ended);
        }
        if self.next == LOOP_RECORDS && self.input.exited.load(Ordering::SeqCst) == LOOP_RECORDS {
            self.next += 1;
            out.push(LAST_TS_MS);
            return Ok(SourcePoll::Produced(1));
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

/// How often event time `ts` goes around the loop.
fn laps(ts: u64) -> u64 {
    ts % 3 + 1
}

fn check_loop(mode: SnapshotMode, parallelism: usize) {
    let input = LoopInput {
        exited: Arc::new(AtomicU64::new(0)),
        fired: Arc::new(AtomicBool::new(false)),
        gave_up: Arc::new(AtomicBool::new(false)),
    };
    let job = Job::new(
        "loop",
        JobConfig {
            checkpoint_interval_ms: Some(5),
            mode,
            default_parallelism: parallelism,
            batch_size_max: 16,
            arbiters: Some(2),
            restart: RestartStrategy::None,
            ..JobConfig::default()
        },
    );
    let output = CollectHandle::new();
    let (head, feedback) = job
        .source("events", input.clone())
        .parallelism(1)
        .assign_timestamps(WatermarkStrategy::bounded_out_of_orderness(
            LOOP_BOUND_MS,
            |ts: &u64| *ts,
        ))
        .map("laps", |ts: u64| (ts, laps(ts)))
        .iterate("loop", 100);
    let lapped = head.map("lap", |(ts, left): (u64, u64)| (ts, left - 1));
    lapped
        .clone()
        .filter("again", |&(_, left): &(u64, u64)| left > 0)
        .close_loop(feedback);
    let exited = Arc::clone(&input.exited);
    let fired = Arc::clone(&input.fired);
    let (windows, late) = lapped
        .filter("exit", |&(_, left): &(u64, u64)| left == 0)
        .map("exited", move |(ts, _): (u64, u64)| {
            exited.fetch_add(1, Ordering::SeqCst);
            ts
        })
        .key_by(|ts: &u64| ts % 2)
        .window(
            Windows::tumbling(LOOP_WINDOW_MS).expect("a valid size"),
            |ts: &u64| *ts,
        )
        .count("window");
    windows
        .map("fired", move |window: Windowed<u64, u64>| {
            fired.store(true, Ordering::SeqCst);
            window
        })
        .sink("collect", output.clone());
    job.run()
        .unwrap_or_else(|error| panic!("{mode:?} p={parallelism}: the job failed: {error}"));
    assert!(
        !input.gave_up.load(Ordering::SeqCst),
        "{mode:?} p={parallelism}: no window fired while the source ran; the loop's back edge \
         held the watermark back"
    );
    let mut got: Vec<(u64, u64, u64)> = output
        .committed()
        .into_iter()
        .map(|w: Windowed<u64, u64>| (w.key, w.end_ms, w.result))
        .collect();
    got.sort_unstable();
    let mut want: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for ts in (0..LOOP_RECORDS).chain([LAST_TS_MS]) {
        let end_ms = ts - ts % LOOP_WINDOW_MS + LOOP_WINDOW_MS;
        *want.entry((ts % 2, end_ms)).or_default() += 1;
    }
    let want: Vec<_> = want.into_iter().map(|((k, e), c)| (k, e, c)).collect();
    assert_eq!(got, want, "{mode:?} p={parallelism}");
    assert_eq!(late.dropped(), 0, "{mode:?} p={parallelism}");
}

#[test]
fn a_loops_back_edge_does_not_hold_the_watermark_back_in_cyclic_mode() {
    check_loop(SnapshotMode::Aligned, 1);
    check_loop(SnapshotMode::Aligned, 2);
}

#[test]
fn a_loops_back_edge_does_not_hold_the_watermark_back_unaligned() {
    check_loop(SnapshotMode::Unaligned, 2);
}
