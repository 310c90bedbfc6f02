//! The built-in windows end to end, through the public API only: session
//! windows beside tumbling and sliding ones, each with a count, a reduce
//! and a full-window function, and the late side output.
//!
//! Every run is checked exactly against a direct computation over the
//! same seeded, out-of-order input minus the records the run sent to its
//! late side output: the last firing of every window equals the direct
//! result, and no window fires twice without allowed lateness. The
//! records made late on purpose lie far before every other event time,
//! so a window or session of them is either wholly accepted (before any
//! watermark reached the window operator) or wholly late, at any
//! parallelism; which of them are late is exact at parallelism 1.
//!
//! The window operator's state starts flat (these tests hold few keys);
//! the `copy_on_write` tests run it in the copy-on-write layout from the
//! start (`copy_on_write_threshold_keys` 0), whose checkpoints hand the
//! windows and timers to the checkpoint writer, and compare with the flat
//! layout's firings as well as with the direct computation.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use snapflow::job::{Job, JobConfig, Stream, DEFAULT_COPY_ON_WRITE_THRESHOLD_KEYS};
use snapflow::sink::CollectHandle;
use snapflow::source::VecSourceFactory;
use snapflow::storage::{CheckpointStore, MemoryCheckpointStore};
use snapflow::time::{WatermarkStrategy, Windowed, Windows};
use snapflow_tests::pipeline::{Paced, Pacing};
use snapflow_tests::{event_time_config, quiet_injected_panics, seeds, FaultKind, Faults, TestRng};

/// The out-of-orderness the strategy tolerates.
const BOUND_MS: u64 = 5_000;
/// The disorder stays below the bound: only records made late on purpose
/// can be late.
const JITTER_MS_MAX: u64 = 4_000;
const STEP_MS: u64 = 50;
/// Every `PAUSE_EVERY` records, event time jumps by `PAUSE_MS`, so that
/// every user's session ends there.
const PAUSE_EVERY: u64 = 300;
const PAUSE_MS: u64 = 3 * GAP_MS + JITTER_MS_MAX;
const GAP_MS: u64 = 1_000;
/// The size of tumbling and sliding windows.
const WINDOW_MS: u64 = 60_000;
const EPOCH_MS: u64 = 1_700_000_000_000;
/// Late records lie at least this far before `EPOCH_MS`.
const LATE_MARGIN_MS: u64 = 200_000;
const LATENESS_MS: u64 = 5_000;
const EVENTS: u64 = 3_000;
const USERS: u64 = 5;
const PACING: Pacing = Pacing {
    records_per_read: 8,
};

/// `(id, user, event time)`.
type Event = (u64, u32, u64);

/// A window's result as the tests compare it.
type Summary = Vec<u64>;

struct Input {
    events: Vec<Event>,
    late_ids: BTreeSet<u64>,
}

/// Records in event-time order with jitter below the bound, pauses that
/// end every session, and about 3% made late on purpose (never near the
/// start of a split: at parallelism 1 to 3 splits start at multiples of
/// 1000), far before all others.
fn input(seed: u64) -> Input {
    let mut rng = TestRng::new(seed);
    let mut late_ids = BTreeSet::new();
    let events = (0..EVENTS)
        .map(|id| {
            let base_ms = EPOCH_MS + id * STEP_MS + (id / PAUSE_EVERY) * PAUSE_MS;
            let user = rng.between(0, USERS - 1) as u32;
            let late = id % 1_000 >= 50 && rng.chance(3);
            let ts_ms = if late {
                late_ids.insert(id);
                EPOCH_MS - LATE_MARGIN_MS - rng.between(0, 3_600_000)
            } else {
                base_ms - rng.between(0, JITTER_MS_MAX)
            };
            (id, user, ts_ms)
        })
        .collect();
    Input { events, late_ids }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Tumbling,
    Sliding,
    Session,
    /// Sessions with allowed lateness: late firings, last one counts.
    LenientSession,
}

impl Shape {
    fn windows(self) -> Windows {
        let windows = match self {
            Shape::Tumbling => Windows::tumbling(WINDOW_MS),
            Shape::Sliding => Windows::sliding(WINDOW_MS, 20_000),
            Shape::Session | Shape::LenientSession => Windows::session(GAP_MS),
        };
        let windows = windows.unwrap_or_else(|error| panic!("bug in the test: {error}"));
        if self == Shape::LenientSession {
            windows.allowed_lateness_ms(LATENESS_MS)
        } else {
            windows
        }
    }
}

/// What the windows compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Function {
    /// `[records]`.
    Count,
    /// `[sum of ids, largest event time]`, by a reduce.
    Reduce,
    /// `[records, sum of ids, smallest and largest event time]`, by a
    /// full-window function that also checks each record's key.
    Process,
}

impl Function {
    fn summary(self, events: &[Event]) -> Summary {
        let ids: u64 = events.iter().map(|event| event.0).sum();
        let low = events.iter().map(|event| event.2).min().unwrap_or(0);
        let high = events.iter().map(|event| event.2).max().unwrap_or(0);
        match self {
            Function::Count => vec![events.len() as u64],
            Function::Reduce => vec![ids, high],
            Function::Process => vec![events.len() as u64, ids, low, high],
        }
    }
}

/// Per (user, start, end): the direct result over `events`.
fn direct(
    shape: Shape,
    function: Function,
    events: &[Event],
) -> BTreeMap<(u32, u64, u64), Summary> {
    let mut windows: BTreeMap<(u32, u64, u64), Vec<Event>> = BTreeMap::new();
    match shape {
        Shape::Tumbling | Shape::Sliding => {
            let assigner = shape.windows();
            for &event in events {
                for start_ms in assigner.starts_of(event.2) {
                    windows
                        .entry((event.1, start_ms, start_ms + WINDOW_MS))
                        .or_default()
                        .push(event);
                }
            }
        }
        Shape::Session | Shape::LenientSession => {
            let mut by_user: BTreeMap<u32, Vec<Event>> = BTreeMap::new();
            for &event in events {
                by_user.entry(event.1).or_default().push(event);
            }
            for (user, mut user_events) in by_user {
                user_events.sort_by_key(|event| event.2);
                let mut session: Vec<Event> = Vec::new();
                for event in user_events {
                    let last_ms = session.last().map(|last| last.2);
                    if last_ms.is_some_and(|last_ms| event.2 > last_ms + GAP_MS) {
                        close_session(&mut windows, user, std::mem::take(&mut session));
                    }
                    session.push(event);
                }
                close_session(&mut windows, user, session);
            }
        }
    }
    windows
        .into_iter()
        .map(|(window, events)| (window, function.summary(&events)))
        .collect()
}

fn close_session(
    windows: &mut BTreeMap<(u32, u64, u64), Vec<Event>>,
    user: u32,
    session: Vec<Event>,
) {
    if let (Some(first), Some(last)) = (session.first(), session.last()) {
        windows.insert((user, first.2, last.2 + GAP_MS), session);
    }
}

/// The input, paced, with event time and 5 s of out-of-orderness. Its
/// parallelism is the last operator's: the next one sets it.
fn source<'j>(job: &'j Job, input: &Input) -> Stream<'j, Event> {
    job.source(
        "events",
        Paced::over(VecSourceFactory::new(input.events.clone()), PACING),
    )
    .assign_timestamps(WatermarkStrategy::bounded_out_of_orderness(
        BOUND_MS,
        |event: &Event| event.2,
    ))
}

/// The window operator of `shape` and `function` over `events`, late
/// records to a stream of their own.
fn windowed<'j>(
    events: Stream<'j, Event>,
    shape: Shape,
    function: Function,
) -> (Stream<'j, Windowed<u32, Summary>>, Stream<'j, Event>) {
    let windows = events
        .key_by(|event: &Event| event.1)
        .window(shape.windows(), |event: &Event| event.2)
        .side_output_late();
    let as_summary = |(results, late): (Stream<'j, Windowed<u32, u64>>, _)| {
        let results = results.map("summary", |window: Windowed<u32, u64>| Windowed {
            result: vec![window.result],
            key: window.key,
            start_ms: window.start_ms,
            end_ms: window.end_ms,
        });
        (results, late)
    };
    match function {
        Function::Count => as_summary(windows.count("window")),
        Function::Reduce => {
            let (results, late) = windows.reduce("window", |a: &Event, b: Event| {
                (a.0 + b.0, a.1, a.2.max(b.2))
            });
            let results = results.map("summary", |window: Windowed<u32, Event>| Windowed {
                result: vec![window.result.0, window.result.2],
                key: window.key,
                start_ms: window.start_ms,
                end_ms: window.end_ms,
            });
            (results, late)
        }
        Function::Process => windows.process("window", |user: &u32, events: &[Event]| {
            if let Some(stranger) = events.iter().find(|event| event.1 != *user) {
                return Err(format!("{stranger:?} is in a window of user {user}").into());
            }
            Ok(Function::Process.summary(events))
        }),
    }
}

/// The window operator's keyed-state layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// The default threshold: these tests' few keys stay flat.
    Flat,
    /// Copy-on-write from the start (threshold 0).
    CopyOnWrite,
}

/// The tests' job configuration at `parallelism` in `layout`.
fn config(store: &Arc<dyn CheckpointStore>, parallelism: usize, layout: Layout) -> JobConfig {
    JobConfig {
        copy_on_write_threshold_keys: match layout {
            Layout::Flat => DEFAULT_COPY_ON_WRITE_THRESHOLD_KEYS,
            Layout::CopyOnWrite => 0,
        },
        ..event_time_config(store, parallelism)
    }
}

/// One run's committed firings and late records.
struct Run {
    fired: Vec<Windowed<u32, Summary>>,
    late: Vec<Event>,
}

fn run(
    input: &Input,
    (parallelism, layout): (usize, Layout),
    (shape, function): (Shape, Function),
    faults: &Faults,
) -> Run {
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("windows").expect("a memory store opens"));
    let job = Job::new("windows", config(&store, parallelism, layout));
    let (fired, late) = (CollectHandle::new(), CollectHandle::new());
    let faults = faults.clone();
    let events = source(&job, input).map("faults", move |event: Event| {
        faults.check_or_panic("faults", event.0);
        event
    });
    let (results, late_records) = windowed(events, shape, function);
    results.sink("collect", fired.clone()).parallelism(1);
    late_records.sink("late", late.clone()).parallelism(1);
    job.run()
        .unwrap_or_else(|error| panic!("the job failed: {error}"));
    Run {
        fired: fired.committed(),
        late: late.committed(),
    }
}

/// Checks a run against the direct computation over its accepted
/// records; returns its last firings.
fn verify(
    input: &Input,
    (parallelism, shape, function): (usize, Shape, Function),
    run: &Run,
) -> Result<BTreeMap<(u32, u64, u64), Summary>, String> {
    let late_ids: BTreeSet<u64> = run.late.iter().map(|event| event.0).collect();
    if late_ids.len() != run.late.len() {
        return Err("a late record came out twice".into());
    }
    if let Some(id) = late_ids.difference(&input.late_ids).next() {
        return Err(format!("record {id} was sent out as late, but is on time"));
    }
    if parallelism == 1 && late_ids != input.late_ids {
        return Err(format!(
            "{} records came out late, {} were made late",
            late_ids.len(),
            input.late_ids.len()
        ));
    }
    let accepted: Vec<Event> = input
        .events
        .iter()
        .copied()
        .filter(|event| !late_ids.contains(&event.0))
        .collect();
    let want = direct(shape, function, &accepted);
    let mut last = BTreeMap::new();
    for firing in &run.fired {
        let window = (firing.key, firing.start_ms, firing.end_ms);
        let previous = last.insert(window, firing.result.clone());
        if shape != Shape::LenientSession && previous.is_some() {
            return Err(format!("{firing:?} fired twice"));
        }
    }
    if last != want {
        let differs = want
            .iter()
            .find(|(window, result)| last.get(*window) != Some(*result))
            .map(|(window, result)| {
                format!("{window:?}: want {result:?}, got {:?}", last.get(window))
            });
        let extra = last.keys().find(|window| !want.contains_key(*window));
        return Err(format!(
            "{} windows fired, {} expected; first difference {differs:?}, first extra {extra:?}",
            last.len(),
            want.len()
        ));
    }
    Ok(last)
}

/// Runs `shape` and `function` at `parallelism`, failure-free and with
/// `fault_count` injected panics; each run equals the direct computation
/// over its accepted records, and at parallelism 1 both runs are equal.
fn check(parallelism: usize, shape: Shape, function: Function, fault_count: u64) {
    check_in(Layout::Flat, parallelism, (shape, function), fault_count);
}

/// [`check`] in `layout`; in the copy-on-write layout the failure-free
/// run is also compared with the flat layout's (equal at parallelism 1,
/// where which records are late is exact).
fn check_in(
    layout: Layout,
    parallelism: usize,
    (shape, function): (Shape, Function),
    fault_count: u64,
) {
    quiet_injected_panics();
    for seed in seeds("SNAPFLOW_WINDOW_SEEDS", 2) {
        let context =
            format!("SNAPFLOW_SEED={seed} p={parallelism} {layout:?} {shape:?} {function:?}");
        let input = input(seed);
        let at = (parallelism, layout);
        let clean = run(&input, at, (shape, function), &Faults::none());
        let clean = verify(&input, (parallelism, shape, function), &clean)
            .unwrap_or_else(|error| panic!("{context}: {error}"));
        if layout == Layout::CopyOnWrite {
            let flat = run(
                &input,
                (parallelism, Layout::Flat),
                (shape, function),
                &Faults::none(),
            );
            let flat = verify(&input, (parallelism, shape, function), &flat)
                .unwrap_or_else(|error| panic!("{context}, flat: {error}"));
            assert!(
                parallelism != 1 || flat == clean,
                "{context}: the copy-on-write firings differ from the flat layout's"
            );
        }
        if fault_count == 0 {
            continue;
        }
        let mut rng = TestRng::new(seed ^ 0xfa17);
        let planned = (0..fault_count)
            .map(|_| ("faults", rng.between(100, EVENTS - 1), FaultKind::Panic))
            .collect();
        let faults = Faults::new(planned);
        let faulty = run(&input, at, (shape, function), &faults);
        assert_eq!(
            faults.fired(),
            faults.planned(),
            "{context}: not every fault fired"
        );
        let faulty = verify(&input, (parallelism, shape, function), &faulty)
            .unwrap_or_else(|error| panic!("{context} with faults: {error}"));
        assert!(
            parallelism != 1 || faulty == clean,
            "{context}: the firings with faults differ from the failure-free run's"
        );
    }
}

#[test]
fn session_counts_at_parallelism_1() {
    check(1, Shape::Session, Function::Count, 0);
}

#[test]
fn session_counts_at_parallelism_2() {
    check(2, Shape::Session, Function::Count, 0);
}

#[test]
fn session_counts_at_parallelism_3() {
    check(3, Shape::Session, Function::Count, 0);
}

#[test]
fn session_reduce_at_parallelism_2() {
    check(2, Shape::Session, Function::Reduce, 0);
}

#[test]
fn session_process_at_parallelism_3() {
    check(3, Shape::Session, Function::Process, 0);
}

#[test]
fn lenient_session_process_at_parallelism_1() {
    check(1, Shape::LenientSession, Function::Process, 0);
}

#[test]
fn tumbling_process_at_parallelism_1() {
    check(1, Shape::Tumbling, Function::Process, 0);
}

#[test]
fn tumbling_reduce_at_parallelism_3() {
    check(3, Shape::Tumbling, Function::Reduce, 0);
}

#[test]
fn sliding_process_at_parallelism_2() {
    check(2, Shape::Sliding, Function::Process, 0);
}

#[test]
fn sessions_with_failures_are_the_failure_free_ones_at_parallelism_1() {
    check(1, Shape::Session, Function::Process, 3);
}

#[test]
fn sessions_with_failures_stay_exact_at_parallelism_3() {
    check(3, Shape::LenientSession, Function::Count, 3);
}

#[test]
fn copy_on_write_session_counts_at_parallelism_1() {
    check_in(Layout::CopyOnWrite, 1, (Shape::Session, Function::Count), 0);
}

#[test]
fn copy_on_write_tumbling_reduce_at_parallelism_2() {
    check_in(
        Layout::CopyOnWrite,
        2,
        (Shape::Tumbling, Function::Reduce),
        0,
    );
}

#[test]
fn copy_on_write_sliding_process_at_parallelism_3() {
    check_in(
        Layout::CopyOnWrite,
        3,
        (Shape::Sliding, Function::Process),
        0,
    );
}

#[test]
fn copy_on_write_sessions_with_failures_are_the_failure_free_ones_at_parallelism_1() {
    check_in(
        Layout::CopyOnWrite,
        1,
        (Shape::Session, Function::Process),
        3,
    );
}

#[test]
fn copy_on_write_tumbling_with_failures_stays_exact_at_parallelism_2() {
    check_in(
        Layout::CopyOnWrite,
        2,
        (Shape::Tumbling, Function::Count),
        3,
    );
}

#[test]
fn copy_on_write_sessions_with_failures_stay_exact_at_parallelism_3() {
    check_in(
        Layout::CopyOnWrite,
        3,
        (Shape::LenientSession, Function::Count),
        3,
    );
}

/// Without a side output, late records are dropped and counted, in the
/// handle and in the job report alike.
#[test]
fn dropped_late_records_show_in_the_report_at_parallelism_1() {
    for seed in seeds("SNAPFLOW_WINDOW_SEEDS", 1) {
        let input = input(seed);
        let store: Arc<dyn CheckpointStore> =
            Arc::new(MemoryCheckpointStore::new("dropped").expect("a memory store opens"));
        let job = Job::new("dropped", event_time_config(&store, 1));
        let fired = CollectHandle::new();
        let (counts, late) = source(&job, &input)
            .key_by(|event: &Event| event.1)
            .window(Shape::Session.windows(), |event: &Event| event.2)
            .count("window");
        counts.sink("collect", fired.clone());
        let report = job
            .run()
            .unwrap_or_else(|error| panic!("SNAPFLOW_SEED={seed}: {error}"));
        let want = input.late_ids.len() as u64;
        assert_eq!(late.dropped(), want, "SNAPFLOW_SEED={seed}");
        let window = report
            .operator("window")
            .expect("the window operator reports");
        assert_eq!(window.late_records_dropped, want, "SNAPFLOW_SEED={seed}");
        assert_eq!(window.watermark_regressions, 0, "SNAPFLOW_SEED={seed}");
        let on_time: Vec<Event> = input
            .events
            .iter()
            .copied()
            .filter(|event| !input.late_ids.contains(&event.0))
            .collect();
        let mut got: Vec<(u32, u64, u64, u64)> = fired
            .committed()
            .into_iter()
            .map(|w: Windowed<u32, u64>| (w.key, w.start_ms, w.end_ms, w.result))
            .collect();
        got.sort_unstable();
        let want: Vec<(u32, u64, u64, u64)> = direct(Shape::Session, Function::Count, &on_time)
            .into_iter()
            .map(|((user, start, end), summary)| (user, start, end, summary[0]))
            .collect();
        assert_eq!(got, want, "SNAPFLOW_SEED={seed}");
    }
}

/// `side_output_late` at parallelism `parallelism` set on its results
/// stream (the job's default is another): the window operator and both
/// splitters run at it, and the late records arrive complete (exactly
/// the records made late at parallelism 1, a subset of them otherwise,
/// with every other record in its window).
fn check_side_output_parallelism(parallelism: usize) {
    for seed in seeds("SNAPFLOW_WINDOW_SEEDS", 1) {
        let context = format!("SNAPFLOW_SEED={seed} p={parallelism}");
        let input = input(seed);
        let store: Arc<dyn CheckpointStore> =
            Arc::new(MemoryCheckpointStore::new("split").expect("a memory store opens"));
        let default = if parallelism == 1 { 2 } else { 1 };
        let job = Job::new("split", event_time_config(&store, default));
        let (fired, late) = (CollectHandle::new(), CollectHandle::new());
        let events = source(&job, &input).parallelism(1);
        let (results, late_records) = windowed(events, Shape::Tumbling, Function::Process);
        let results = results.parallelism(parallelism);
        results.sink("collect", fired.clone()).parallelism(1);
        late_records.sink("late", late.clone()).parallelism(1);
        let report = job
            .run()
            .unwrap_or_else(|error| panic!("{context}: the job failed: {error}"));
        for name in ["window", "window-results", "window-late"] {
            let operator = report
                .operator(name)
                .unwrap_or_else(|| panic!("{context}: {name} reports"));
            assert_eq!(operator.parallelism, parallelism, "{context}: {name}");
        }
        let run = Run {
            fired: fired.committed(),
            late: late.committed(),
        };
        verify(
            &input,
            (parallelism, Shape::Tumbling, Function::Process),
            &run,
        )
        .unwrap_or_else(|error| panic!("{context}: {error}"));
    }
}

#[test]
fn side_output_late_follows_the_window_parallelism_1() {
    check_side_output_parallelism(1);
}

#[test]
fn side_output_late_follows_the_window_parallelism_2() {
    check_side_output_parallelism(2);
}

#[test]
fn side_output_late_follows_the_window_parallelism_3() {
    check_side_output_parallelism(3);
}

/// The sinks' handles: the external system, the same for both runs.
type Outputs = (CollectHandle<Windowed<u32, Summary>>, CollectHandle<Event>);

/// Sessions at the job's default parallelism, source and sinks at 1,
/// counting the records that reached the windows into `progress`.
fn declare_sessions(job: &Job, input: &Input, progress: &Arc<AtomicU64>, (fired, late): &Outputs) {
    let progress = Arc::clone(progress);
    let events = source(job, input)
        .parallelism(1)
        .map("progress", move |event: Event| {
            progress.fetch_add(1, Ordering::Relaxed);
            event
        })
        .parallelism(1);
    let (results, late_records) = windowed(events, Shape::Session, Function::Process);
    results.sink("collect", fired.clone()).parallelism(1);
    late_records.sink("late", late.clone()).parallelism(1);
}

/// Stops the sessions at `from` with a savepoint while sessions are open
/// and resumes at `to`: every session fires once with the right records.
fn check_rescale(from: (usize, Layout), to: (usize, Layout)) {
    for seed in seeds("SNAPFLOW_WINDOW_SEEDS", 2) {
        let context = format!("SNAPFLOW_SEED={seed} {from:?} -> {to:?}");
        let input = input(seed);
        let store: Arc<dyn CheckpointStore> =
            Arc::new(MemoryCheckpointStore::new("rescale").expect("a memory store opens"));
        let progress = Arc::new(AtomicU64::new(0));
        let first = Job::new("rescale", config(&store, from.0, from.1));
        let outputs: Outputs = (CollectHandle::new(), CollectHandle::new());
        declare_sessions(&first, &input, &progress, &outputs);
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
        let fired_before = outputs.0.committed().len();
        let second = Job::new("rescale", config(&store, to.0, to.1));
        declare_sessions(&second, &input, &progress, &outputs);
        let resumed = second
            .run()
            .unwrap_or_else(|error| panic!("{context}: {error}"));
        assert_eq!(resumed.resumed_from, Some(savepoint), "{context}");
        let run = Run {
            fired: outputs.0.committed(),
            late: outputs.1.committed(),
        };
        assert!(
            fired_before > 0 && run.fired.len() > fired_before,
            "{context}: sessions should fire before and after the savepoint"
        );
        verify(&input, (1, Shape::Session, Function::Process), &run)
            .unwrap_or_else(|error| panic!("{context}: {error}"));
    }
}

#[test]
fn sessions_rescale_from_2_to_3() {
    check_rescale((2, Layout::Flat), (3, Layout::Flat));
}

#[test]
fn sessions_rescale_from_3_to_1() {
    check_rescale((3, Layout::Flat), (1, Layout::Flat));
}

#[test]
fn copy_on_write_sessions_rescale_from_2_to_3() {
    check_rescale((2, Layout::CopyOnWrite), (3, Layout::CopyOnWrite));
}

#[test]
fn copy_on_write_sessions_rescale_from_3_to_1_flat() {
    check_rescale((3, Layout::CopyOnWrite), (1, Layout::Flat));
}

#[test]
fn a_session_gap_of_zero_is_refused_when_built() {
    assert!(Windows::session(0).is_err());
}
