//! Event time end to end, through the public API only: per-user counts in
//! 60-second tumbling windows of event time, with 5 s of out-of-orderness
//! and late records dropped (and counted), computed by a user operator
//! that fires on `Operator::on_watermark`.
//!
//! Every run is checked against a direct computation over the same seeded
//! input: committed window counts plus dropped late records add up to the
//! direct per-(user, window) counts; no window fires twice; each operator
//! subtask's watermark rises strictly (also across restores) and ends at
//! +infinity. With forward edges every subtask sees one split in order, so
//! which records are late is exact and a run with injected failures must
//! commit exactly the results of a failure-free run.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use snapflow::job::{Collector, Job, Operator, OperatorContext};
use snapflow::runtime::BoxError;
use snapflow::sink::CollectHandle;
use snapflow::source::VecSourceFactory;
use snapflow::storage::{CheckpointStore, MemoryCheckpointStore};
use snapflow::time::{Timers, WatermarkStrategy, Windowed, Windows, WATERMARK_MAX_MS};
use snapflow::Snapshot;
use snapflow_tests::pipeline::{Paced, Pacing};
use snapflow_tests::{event_time_config, quiet_injected_panics, seeds, FaultKind, Faults, TestRng};

/// The window size.
const WINDOW_MS: u64 = 60_000;
/// The out-of-orderness the strategy tolerates.
const BOUND_MS: u64 = 5_000;
/// The generator's disorder stays below the bound, so only the records it
/// makes late on purpose can be late.
const JITTER_MS_MAX: u64 = 4_000;
/// Event time between consecutive records before jitter.
const STEP_MS: u64 = 50;
/// Event times start here, so that large values are exercised.
const EPOCH_MS: u64 = 1_700_000_000_000;
const EVENTS: u64 = 6_000;
const USERS: u64 = 7;
const PACING: Pacing = Pacing {
    records_per_read: 8,
};

/// `(id, user, event time)`.
type Event = (u64, u32, u64);

/// `(kind, subtask, user, a, b)`: kind 0 is a window result (a = window
/// end, b = count), 1 a dropped late record (a = window end, b = id), 2
/// a watermark the subtask saw (a = watermark).
type Output = (u8, u32, u32, u64, u64);

const RESULT: u8 = 0;
const LATE: u8 = 1;
const WATERMARK: u8 = 2;

/// The seeded input and what it must give.
struct Input {
    events: Vec<Event>,
    /// The ids made late on purpose (far behind the watermark).
    late_ids: BTreeSet<u64>,
}

/// Records in event-time order with jitter below the bound (large against
/// the step, so that a source re-reading after a restore usually sees a
/// lower maximum than before it: a watermark recomputed instead of
/// restored would go back), and about 3%
/// made late by far more than a window, never near the start of a split
/// (at parallelism 1 to 3 splits start at multiples of 1000 here), so that
/// with forward edges each of them is certainly late.
fn input(seed: u64) -> Input {
    let mut rng = TestRng::new(seed);
    let mut late_ids = BTreeSet::new();
    let events = (0..EVENTS)
        .map(|id| {
            let base_ms = EPOCH_MS + id * STEP_MS;
            let user = rng.between(0, USERS - 1) as u32;
            let late = id * STEP_MS >= 200_000 && id % 1_000 >= 50 && rng.chance(3);
            let ts_ms = if late {
                late_ids.insert(id);
                base_ms - 2 * WINDOW_MS - rng.between(0, WINDOW_MS)
            } else {
                base_ms - rng.between(0, JITTER_MS_MAX)
            };
            (id, user, ts_ms)
        })
        .collect();
    Input { events, late_ids }
}

fn window_end_ms(ts_ms: u64) -> u64 {
    (ts_ms / WINDOW_MS + 1) * WINDOW_MS
}

/// The direct computation: per (user, window end), every record's count.
fn direct(events: &[Event]) -> BTreeMap<(u32, u64), u64> {
    let mut counts = BTreeMap::new();
    for &(_, user, ts_ms) in events {
        *counts.entry((user, window_end_ms(ts_ms))).or_default() += 1;
    }
    counts
}

/// Per-user counts in tumbling windows, fired when the watermark passes
/// a window's end; a record whose window already fired is dropped and
/// reported as late.
#[derive(Snapshot, Default)]
struct TumblingCounts {
    /// Open windows: (window end, user) → count.
    open: BTreeMap<(u64, u32), u64>,
    /// The last watermark seen.
    watermark_ms: Option<u64>,
    #[snapshot(skip)]
    subtask: u32,
    #[snapshot(skip)]
    faults: Faults,
}

impl Operator for TumblingCounts {
    type In = Event;
    type Out = Output;

    fn on_record(&mut self, event: Event, out: &mut Collector<'_, Output>) -> Result<(), BoxError> {
        let (id, user, ts_ms) = event;
        self.faults.check("window", id)?;
        let end_ms = window_end_ms(ts_ms);
        if self
            .watermark_ms
            .is_some_and(|watermark| end_ms - 1 <= watermark)
        {
            out.emit((LATE, self.subtask, user, end_ms, id));
            return Ok(());
        }
        *self.open.entry((end_ms, user)).or_default() += 1;
        Ok(())
    }

    fn on_watermark(
        &mut self,
        watermark_ms: u64,
        out: &mut Collector<'_, Output>,
    ) -> Result<(), BoxError> {
        self.watermark_ms = Some(watermark_ms);
        out.emit((WATERMARK, self.subtask, 0, watermark_ms, 0));
        while let Some((&(end_ms, user), &count)) = self.open.first_key_value() {
            if end_ms - 1 > watermark_ms {
                break;
            }
            out.emit((RESULT, self.subtask, user, end_ms, count));
            self.open.remove(&(end_ms, user));
        }
        Ok(())
    }

    fn restore_from(&mut self, restored: Self) {
        self.open = restored.open;
        self.watermark_ms = restored.watermark_ms;
    }
}

/// The per-user windows of the keyed pipeline: window end → count.
#[derive(Snapshot, Default, Clone)]
struct UserWindows {
    open: BTreeMap<u64, u64>,
}

/// The window job's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Edge {
    /// A user operator; each subtask reads one split, in order (exact
    /// lateness).
    Forward,
    /// A user operator; every subtask reads every split (its watermark is
    /// the minimum over them).
    Rebalance,
    /// Keyed by user, windows fired by event-time timers; every subtask
    /// reads every split.
    Timers,
}

impl Edge {
    /// Whether which records are late is exact at `parallelism`.
    fn exact_lateness(self, parallelism: usize) -> bool {
        self == Edge::Forward || parallelism == 1
    }
}

/// Counts a record into its user's window and registers the window's
/// timer, or drops it as late once the watermark passed the window.
fn count_into_window(
    user: &u32,
    windows: &mut UserWindows,
    (id, _, ts_ms): Event,
    timers: &mut Timers<'_>,
    out: &mut Collector<'_, Output>,
) -> Result<(), BoxError> {
    let end_ms = window_end_ms(ts_ms);
    if timers
        .current_watermark_ms()
        .is_some_and(|watermark| end_ms - 1 <= watermark)
    {
        out.emit((LATE, 0, *user, end_ms, id));
        return Ok(());
    }
    *windows.open.entry(end_ms).or_default() += 1;
    timers.register_event_time_ms(end_ms - 1);
    Ok(())
}

/// Fires the window that ends right after `timestamp_ms`.
fn fire_window(
    user: &u32,
    windows: &mut UserWindows,
    timestamp_ms: u64,
    _timers: &mut Timers<'_>,
    out: &mut Collector<'_, Output>,
) -> Result<(), BoxError> {
    let end_ms = timestamp_ms + 1;
    let count = windows.open.remove(&end_ms).ok_or_else(|| {
        format!("a timer fired for user {user}'s window {end_ms}, which is not open")
    })?;
    out.emit((RESULT, 0, *user, end_ms, count));
    Ok(())
}

/// One run's committed output, per sink subtask (in commit order).
fn run(
    input: &Input,
    (parallelism, cow): (usize, bool),
    edge: Edge,
    faults: &Faults,
) -> Vec<Vec<Output>> {
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("event-time").expect("a memory store opens"));
    let mut config = event_time_config(&store, parallelism);
    if cow {
        // Keyed timer state in the copy-on-write layout from the start:
        // checkpoints hand it to the checkpoint writer.
        config.copy_on_write_threshold_keys = 0;
    }
    let job = Job::new("event-time", config);
    let output = CollectHandle::new();
    let strategy = WatermarkStrategy::bounded_out_of_orderness(BOUND_MS, |event: &Event| event.2);
    let events = job
        .source(
            "events",
            Paced::over(VecSourceFactory::new(input.events.clone()), PACING),
        )
        .assign_timestamps(strategy);
    let faults = faults.clone();
    let windows = match edge {
        Edge::Forward | Edge::Rebalance => {
            let events = if edge == Edge::Forward {
                events.forward()
            } else {
                events.rebalance()
            };
            events.operator("window", move |context: &OperatorContext| TumblingCounts {
                subtask: context.subtask as u32,
                faults: faults.clone(),
                ..TumblingCounts::default()
            })
        }
        Edge::Timers => events.key_by(|event: &Event| event.1).process_with_timers(
            "window",
            move |user: &u32, windows: &mut UserWindows, event: Event, timers, out| {
                faults.check("window", event.0)?;
                count_into_window(user, windows, event, timers, out)
            },
            fire_window,
        ),
    };
    windows.forward().sink("collect", output.clone());
    job.run()
        .unwrap_or_else(|error| panic!("the job failed: {error}"));
    (0..parallelism)
        .map(|subtask| output.committed_of(subtask))
        .collect()
}

/// Checks one run's committed output against the direct computation;
/// returns its window results and late records, sorted, for comparison.
fn verify(
    input: &Input,
    (parallelism, edge): (usize, Edge),
    committed: &[Vec<Output>],
) -> Result<Vec<Output>, String> {
    let mut totals: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    let mut fired = BTreeSet::new();
    let mut late = BTreeSet::new();
    let mut results = Vec::new();
    for (sink_subtask, outputs) in committed.iter().enumerate() {
        let mut last_watermark: Option<u64> = None;
        for &record in outputs {
            let (kind, subtask, user, a, b) = record;
            match kind {
                WATERMARK => {
                    if last_watermark.is_some_and(|last| a <= last) {
                        return Err(format!(
                            "subtask {subtask}'s watermark went from {last_watermark:?} to {a}"
                        ));
                    }
                    last_watermark = Some(a);
                }
                RESULT => {
                    if !fired.insert((subtask, user, a)) {
                        return Err(format!("subtask {subtask} fired ({user}, {a}) twice"));
                    }
                    *totals.entry((user, a)).or_default() += b;
                    results.push(record);
                }
                LATE => {
                    if !late.insert(b) {
                        return Err(format!("late record {b} was reported twice"));
                    }
                    *totals.entry((user, a)).or_default() += 1;
                    results.push(record);
                }
                other => return Err(format!("unknown output kind {other}")),
            }
        }
        if edge != Edge::Timers && last_watermark != Some(WATERMARK_MAX_MS) {
            return Err(format!(
                "sink subtask {sink_subtask}'s last watermark is {last_watermark:?}, not +infinity"
            ));
        }
    }
    let want = direct(&input.events);
    if totals != want {
        let differ: Vec<_> = want
            .iter()
            .filter(|(window, count)| totals.get(window) != Some(count))
            .take(5)
            .collect();
        return Err(format!(
            "window totals differ from the direct computation at {differ:?}"
        ));
    }
    if !late.is_subset(&input.late_ids) {
        return Err("a record that was not made late was dropped as late".into());
    }
    if edge.exact_lateness(parallelism) && late != input.late_ids {
        return Err(format!(
            "{} of {} records made late were dropped",
            late.len(),
            input.late_ids.len()
        ));
    }
    results.sort_unstable();
    Ok(results)
}

/// Runs the job on seeded inputs at `parallelism`, failure-free and, when
/// `fault_count > 0`, with that many injected failures in the window
/// operator, whose committed results must then equal the failure-free
/// run's exactly (with forward edges).
fn check(parallelism: usize, edge: Edge, fault_count: u64) {
    check_in(false, parallelism, edge, fault_count);
}

/// [`check`] with the keyed state flat, or with `cow` copy-on-write from
/// the start (whose failure-free results must then equal the flat
/// layout's where lateness is exact).
fn check_in(cow: bool, parallelism: usize, edge: Edge, fault_count: u64) {
    quiet_injected_panics();
    for seed in seeds("SNAPFLOW_EVENT_TIME_SEEDS", 2) {
        let input = input(seed);
        let clean = run(&input, (parallelism, cow), edge, &Faults::none());
        let clean = verify(&input, (parallelism, edge), &clean).unwrap_or_else(|error| {
            panic!("SNAPFLOW_SEED={seed} p={parallelism} {edge:?} copy-on-write {cow}: {error}")
        });
        if cow {
            let flat = run(&input, (parallelism, false), edge, &Faults::none());
            let flat = verify(&input, (parallelism, edge), &flat)
                .unwrap_or_else(|error| panic!("SNAPFLOW_SEED={seed} flat: {error}"));
            assert!(
                !edge.exact_lateness(parallelism) || flat == clean,
                "SNAPFLOW_SEED={seed} p={parallelism}: copy-on-write differs from flat"
            );
        }
        if fault_count == 0 {
            continue;
        }
        let mut rng = TestRng::new(seed ^ 0xfa17);
        let planned = (0..fault_count)
            .map(|_| {
                let kind = if rng.chance(50) {
                    FaultKind::Panic
                } else {
                    FaultKind::Error
                };
                ("window", rng.between(100, EVENTS - 1), kind)
            })
            .collect();
        let faults = Faults::new(planned);
        let faulty = run(&input, (parallelism, cow), edge, &faults);
        let context =
            format!("SNAPFLOW_SEED={seed} p={parallelism} {edge:?} cow {cow} with faults");
        assert_eq!(
            faults.fired(),
            faults.planned(),
            "{context}: not every fault fired"
        );
        let faulty = verify(&input, (parallelism, edge), &faulty)
            .unwrap_or_else(|error| panic!("{context}: {error}"));
        // When which records are late depends on how the splits
        // interleave, only the totals (checked above) must agree.
        assert!(
            !edge.exact_lateness(parallelism) || faulty == clean,
            "{context}: the committed results differ from the failure-free run's"
        );
    }
}

#[test]
fn tumbling_counts_at_parallelism_1() {
    check(1, Edge::Forward, 0);
}

#[test]
fn tumbling_counts_at_parallelism_2() {
    check(2, Edge::Forward, 0);
}

#[test]
fn tumbling_counts_at_parallelism_3() {
    check(3, Edge::Forward, 0);
}

#[test]
fn watermark_is_the_minimum_over_inputs_at_parallelism_2() {
    check(2, Edge::Rebalance, 0);
}

#[test]
fn watermark_is_the_minimum_over_inputs_at_parallelism_3() {
    check(3, Edge::Rebalance, 0);
}

#[test]
fn failures_give_exactly_the_failure_free_results_at_parallelism_1() {
    check(1, Edge::Forward, 3);
}

#[test]
fn failures_give_exactly_the_failure_free_results_at_parallelism_2() {
    check(2, Edge::Forward, 3);
}

#[test]
fn failures_keep_the_totals_and_the_rising_watermark_at_parallelism_3() {
    check(3, Edge::Rebalance, 3);
}

#[test]
fn timer_windows_at_parallelism_1() {
    check(1, Edge::Timers, 0);
}

#[test]
fn timer_windows_at_parallelism_2() {
    check(2, Edge::Timers, 0);
}

#[test]
fn timer_windows_at_parallelism_3() {
    check(3, Edge::Timers, 0);
}

#[test]
fn timer_windows_with_failures_give_exactly_the_failure_free_results_at_parallelism_1() {
    check(1, Edge::Timers, 3);
}

#[test]
fn timer_windows_with_failures_keep_the_totals_at_parallelism_3() {
    check(3, Edge::Timers, 3);
}

#[test]
fn copy_on_write_timer_windows_with_failures_are_the_failure_free_ones_at_parallelism_1() {
    check_in(true, 1, Edge::Timers, 3);
}

#[test]
fn copy_on_write_timer_windows_at_parallelism_2() {
    check_in(true, 2, Edge::Timers, 0);
}

#[test]
fn copy_on_write_timer_windows_with_failures_keep_the_totals_at_parallelism_3() {
    check_in(true, 3, Edge::Timers, 3);
}

/// A job of the keyed timer windows, source and sink at parallelism 1,
/// windows at `parallelism`, counting the records it has windowed into
/// `progress`.
fn declare_rescalable(
    job: &Job,
    input: &Input,
    parallelism: usize,
    progress: &Arc<AtomicU64>,
) -> CollectHandle<Output> {
    let output = CollectHandle::new();
    let progress = Arc::clone(progress);
    let strategy = WatermarkStrategy::bounded_out_of_orderness(BOUND_MS, |event: &Event| event.2);
    job.source(
        "events",
        Paced::over(VecSourceFactory::new(input.events.clone()), PACING),
    )
    .parallelism(1)
    .assign_timestamps(strategy)
    .key_by(|event: &Event| event.1)
    .process_with_timers(
        "window",
        move |user: &u32, windows: &mut UserWindows, event: Event, timers, out| {
            progress.fetch_add(1, Ordering::Relaxed);
            count_into_window(user, windows, event, timers, out)
        },
        fire_window,
    )
    .parallelism(parallelism)
    .sink("collect", output.clone())
    .parallelism(1);
    output
}

/// Stops the timer windows at `from` with a savepoint while windows are
/// open, resumes at `to`: every window fires once with the right count,
/// and the results equal a run that never stopped.
fn check_rescale(from: usize, to: usize) {
    for seed in seeds("SNAPFLOW_EVENT_TIME_SEEDS", 2) {
        let context = format!("SNAPFLOW_SEED={seed} {from} -> {to}");
        let input = input(seed);
        let store: Arc<dyn CheckpointStore> =
            Arc::new(MemoryCheckpointStore::new("rescale").expect("a memory store opens"));
        let progress = Arc::new(AtomicU64::new(0));
        let first = Job::new("rescale", event_time_config(&store, from));
        let first_output = declare_rescalable(&first, &input, from, &progress);
        let running = first.start().expect("the first run starts");
        let started = Instant::now();
        while progress.load(Ordering::Relaxed) < EVENTS / 2
            && started.elapsed() < Duration::from_secs(20)
        {
            thread::sleep(Duration::from_millis(1));
        }
        running.stop_with_savepoint();
        let stopped = running
            .wait()
            .unwrap_or_else(|error| panic!("{context}: {error}"));
        let savepoint = stopped
            .savepoint
            .unwrap_or_else(|| panic!("{context}: no savepoint"));
        let before = first_output.committed();
        let second = Job::new("rescale", event_time_config(&store, to));
        let second_output = declare_rescalable(&second, &input, to, &progress);
        let resumed = second
            .run()
            .unwrap_or_else(|error| panic!("{context}: {error}"));
        assert_eq!(resumed.resumed_from, Some(savepoint), "{context}");
        let after = second_output.committed();
        assert!(
            !before.is_empty() && !after.is_empty(),
            "{context}: windows should fire before and after the savepoint"
        );
        let all: Vec<Output> = before.into_iter().chain(after).collect();
        let rescaled = verify(&input, (1, Edge::Timers), &[all])
            .unwrap_or_else(|error| panic!("{context}: {error}"));
        let unstopped = run(&input, (1, false), Edge::Timers, &Faults::none());
        let unstopped = verify(&input, (1, Edge::Timers), &unstopped)
            .unwrap_or_else(|error| panic!("{context}, unstopped: {error}"));
        assert!(
            rescaled == unstopped,
            "{context}: results differ from a run that never stopped"
        );
    }
}

#[test]
fn timer_windows_rescale_from_2_to_3() {
    check_rescale(2, 3);
}

#[test]
fn timer_windows_rescale_from_3_to_1() {
    check_rescale(3, 1);
}

/// Which built-in windows a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Tumbling,
    /// 60 s windows every 10 s.
    Sliding,
    /// Tumbling, with more allowed lateness than any late record needs.
    Lenient,
}

impl Shape {
    fn windows(self) -> Windows {
        let windows = match self {
            Shape::Tumbling | Shape::Lenient => Windows::tumbling(WINDOW_MS),
            Shape::Sliding => Windows::sliding(WINDOW_MS, 10_000),
        };
        let windows = windows.unwrap_or_else(|error| panic!("bug in the test: {error}"));
        if self == Shape::Lenient {
            windows.allowed_lateness_ms(4 * WINDOW_MS)
        } else {
            windows
        }
    }
}

/// Per (user, window start): the direct count of `events` over `windows`.
fn direct_windows(windows: &Windows, events: &[&Event]) -> BTreeMap<(u32, u64), u64> {
    let mut counts = BTreeMap::new();
    for &&(_, user, ts_ms) in events {
        for start_ms in windows.starts_of(ts_ms) {
            *counts.entry((user, start_ms)).or_default() += 1;
        }
    }
    counts
}

/// One run of the built-in window count: its committed firings in commit
/// order, and how many records it dropped as late.
fn run_windows(
    input: &Input,
    parallelism: usize,
    shape: Shape,
    faults: &Faults,
) -> (Vec<Windowed<u32, u64>>, u64) {
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("windows").expect("a memory store opens"));
    let job = Job::new("windows", event_time_config(&store, parallelism));
    let output = CollectHandle::new();
    let strategy = WatermarkStrategy::bounded_out_of_orderness(BOUND_MS, |event: &Event| event.2);
    let faults = faults.clone();
    let (counts, late) = job
        .source(
            "events",
            Paced::over(VecSourceFactory::new(input.events.clone()), PACING),
        )
        .assign_timestamps(strategy)
        .map("faults", move |event: Event| {
            faults.check_or_panic("faults", event.0);
            event
        })
        .key_by(|event: &Event| event.1)
        .window(shape.windows(), |event: &Event| event.2)
        .count("window");
    counts.sink("collect", output.clone()).parallelism(1);
    job.run()
        .unwrap_or_else(|error| panic!("the job failed: {error}"));
    (output.committed(), late.dropped())
}

/// Checks the built-in windows against the direct computation: without
/// lateness each window fires once, with at least the count of its
/// on-time records and at most that of all its records (exactly the
/// on-time count at parallelism 1); with lateness each window's last
/// firing counts all its records. Returns the firings, sorted.
fn verify_windows(
    input: &Input,
    (parallelism, shape): (usize, Shape),
    fired: &[Windowed<u32, u64>],
    dropped: Option<u64>,
) -> Result<Vec<Windowed<u32, u64>>, String> {
    let windows = shape.windows();
    let all: Vec<&Event> = input.events.iter().collect();
    let on_time: Vec<&Event> = all
        .iter()
        .copied()
        .filter(|event| !input.late_ids.contains(&event.0))
        .collect();
    let (want_all, want_on_time) = (
        direct_windows(&windows, &all),
        direct_windows(&windows, &on_time),
    );
    let mut last: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    for firing in fired {
        if firing.end_ms - firing.start_ms != WINDOW_MS {
            return Err(format!("{firing:?} is not a {WINDOW_MS} ms window"));
        }
        let previous = last.insert((firing.key, firing.start_ms), firing.result);
        if shape != Shape::Lenient && previous.is_some() {
            return Err(format!("{firing:?} fired twice"));
        }
    }
    if shape == Shape::Lenient {
        return if last == want_all {
            Ok(fired.to_vec())
        } else {
            Err("the last firings differ from the direct counts of all records".into())
        };
    }
    if last.keys().ne(want_on_time.keys()) && last.keys().ne(want_all.keys()) {
        let missing = want_on_time
            .keys()
            .find(|window| !last.contains_key(window));
        return Err(format!("windows missing or extra, e.g. {missing:?}"));
    }
    for (window, &count) in &last {
        let low = want_on_time.get(window).copied().unwrap_or(0);
        let high = want_all.get(window).copied().unwrap_or(0);
        let exact = parallelism == 1 && count != low;
        if count < low || count > high || exact {
            return Err(format!(
                "window {window:?} counted {count}, want {low}..={high}"
            ));
        }
    }
    if let Some(dropped) = dropped {
        let missing: u64 = want_all.values().sum::<u64>() - last.values().sum::<u64>();
        // A dropped record is missing from every window that holds it; at
        // parallelism above 1 a record can also be too late for only some
        // of its sliding windows (it is then not dropped).
        let whole = dropped * windows_per_record(shape);
        if missing < whole || (parallelism == 1 && missing != whole) {
            return Err(format!(
                "{dropped} records counted as dropped, {missing} window entries missing"
            ));
        }
    }
    let mut sorted = fired.to_vec();
    sorted.sort_unstable();
    Ok(sorted)
}

/// How many windows hold each record.
fn windows_per_record(shape: Shape) -> u64 {
    match shape {
        Shape::Sliding => WINDOW_MS / 10_000,
        Shape::Tumbling | Shape::Lenient => 1,
    }
}

/// Runs the built-in windows at `parallelism`, failure-free and with
/// `fault_count` injected failures; at parallelism 1 both commit exactly
/// the same firings.
fn check_windows(parallelism: usize, shape: Shape, fault_count: u64) {
    quiet_injected_panics();
    for seed in seeds("SNAPFLOW_EVENT_TIME_SEEDS", 2) {
        let context = format!("SNAPFLOW_SEED={seed} p={parallelism} {shape:?}");
        let input = input(seed);
        let (fired, dropped) = run_windows(&input, parallelism, shape, &Faults::none());
        let clean = verify_windows(&input, (parallelism, shape), &fired, Some(dropped))
            .unwrap_or_else(|error| panic!("{context}: {error}"));
        if fault_count == 0 {
            continue;
        }
        let mut rng = TestRng::new(seed ^ 0xfa17);
        let planned = (0..fault_count)
            .map(|_| ("faults", rng.between(100, EVENTS - 1), FaultKind::Panic))
            .collect();
        let faults = Faults::new(planned);
        let (fired, _) = run_windows(&input, parallelism, shape, &faults);
        assert_eq!(
            faults.fired(),
            faults.planned(),
            "{context}: not every fault fired"
        );
        let faulty = verify_windows(&input, (parallelism, shape), &fired, None)
            .unwrap_or_else(|error| panic!("{context} with faults: {error}"));
        assert!(
            parallelism != 1 || faulty == clean,
            "{context}: the firings with faults differ from the failure-free run's"
        );
    }
}

#[test]
fn window_assigners_are_checked_when_built() {
    assert!(Windows::tumbling(0).is_err());
    assert!(Windows::sliding(10, 20).is_err());
    assert!(Windows::sliding(10, 0).is_err());
}

#[test]
fn tumbling_window_counts_at_parallelism_1() {
    check_windows(1, Shape::Tumbling, 0);
}

#[test]
fn tumbling_window_counts_at_parallelism_2() {
    check_windows(2, Shape::Tumbling, 0);
}

#[test]
fn tumbling_window_counts_at_parallelism_3() {
    check_windows(3, Shape::Tumbling, 0);
}

#[test]
fn sliding_window_counts_at_parallelism_1() {
    check_windows(1, Shape::Sliding, 0);
}

#[test]
fn sliding_window_counts_at_parallelism_3() {
    check_windows(3, Shape::Sliding, 0);
}

#[test]
fn allowed_lateness_counts_every_record_at_parallelism_2() {
    check_windows(2, Shape::Lenient, 0);
}

#[test]
fn window_counts_with_failures_are_the_failure_free_ones_at_parallelism_1() {
    check_windows(1, Shape::Tumbling, 3);
}

#[test]
fn window_counts_with_failures_keep_their_bounds_at_parallelism_3() {
    check_windows(3, Shape::Sliding, 3);
}
