//! Processing time end to end, through the public API only: keyed
//! processing-time timers and tumbling processing-time windows, driven by
//! a `ManualClock` that a test thread moves while the job runs.
//!
//! What a record's processing time is depends on scheduling, so these
//! tests check what must hold whatever it is: every record is counted in
//! exactly one committed firing (also across injected failures and a
//! savepoint restored at another parallelism), a key's timer fires at
//! most once per time, never before the clock reached it, and timers
//! that came due while the job was down fire on restore, before the
//! rest of the input.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use snapflow::job::{Job, JobConfig};
use snapflow::sink::CollectHandle;
use snapflow::source::VecSourceFactory;
use snapflow::storage::{CheckpointStore, MemoryCheckpointStore};
use snapflow::time::{Clock, ManualClock, TimeDomain, Timers, Windowed, Windows};
use snapflow::Snapshot;
use snapflow_tests::pipeline::{Paced, Pacing};
use snapflow_tests::{event_time_config, quiet_injected_panics, seeds, FaultKind, Faults, TestRng};

const EVENTS: u64 = 2_000;
const KEYS: u64 = 7;
/// Timers fire at the next multiple of this after a record.
const PERIOD_MS: u64 = 1_000;
/// A timer every record registers and deletes again: it never fires.
const NEVER_MS: u64 = u64::MAX / 2;
const START_MS: u64 = 1_700_000_000_000;
const PACING: Pacing = Pacing {
    records_per_read: 4,
};

/// `(id, key)`.
type Event = (u64, u32);

/// `(key, timer time, records counted, clock reading when it fired)`.
type Fired = (u32, u64, u64, u64);

fn events(seed: u64) -> Vec<Event> {
    let mut rng = TestRng::new(seed);
    (0..EVENTS)
        .map(|id| (id, rng.between(0, KEYS - 1) as u32))
        .collect()
}

/// A key's records since its last firing.
#[derive(Snapshot, Default, Clone)]
struct Pending {
    records: u64,
}

fn config(store: &Arc<dyn CheckpointStore>, parallelism: usize, clock: &ManualClock) -> JobConfig {
    JobConfig {
        clock: Arc::new(clock.clone()),
        processing_time_tick_ms: 1,
        ..event_time_config(store, parallelism)
    }
}

/// `count` panics at seeded records past the first 100.
fn planned_faults(seed: u64, count: u64) -> Faults {
    let mut rng = TestRng::new(seed ^ 0xfa17);
    let planned = (0..count)
        .map(|_| ("faults", rng.between(100, EVENTS - 1), FaultKind::Panic))
        .collect();
    Faults::new(planned)
}

/// A job named `name` on a fresh memory store, reading `clock`.
fn fresh_job(name: &str, parallelism: usize, clock: &ManualClock) -> Job {
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new(name).expect("a memory store opens"));
    Job::new(name, config(&store, parallelism, clock))
}

/// Moves `clock` by `step_ms` every millisecond until dropped.
struct Driver {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Driver {
    fn start(clock: &ManualClock, step_ms: u64) -> Driver {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, clock) = (Arc::clone(&stop), clock.clone());
        let thread = thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                clock.advance_ms(step_ms);
                thread::sleep(Duration::from_millis(1));
            }
        });
        Driver {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Declares the timer job: per key, records are counted until the next
/// whole period of processing time, when a timer emits the count.
fn declare_timers(
    job: &Job,
    events: &[Event],
    faults: &Faults,
    progress: &Arc<AtomicU64>,
    fired: &CollectHandle<Fired>,
) {
    let (faults, progress) = (faults.clone(), Arc::clone(progress));
    job.source(
        "events",
        Paced::over(VecSourceFactory::new(events.to_vec()), PACING),
    )
    .parallelism(1)
    .map("faults", move |event: Event| {
        faults.check_or_panic("faults", event.0);
        progress.fetch_add(1, Ordering::Relaxed);
        event
    })
    .parallelism(1)
    .key_by(|event: &Event| event.1)
    .process_with_timers(
        "timers",
        |_key: &u32, pending: &mut Pending, _event: Event, timers: &mut Timers<'_>, _out| {
            pending.records += 1;
            let now_ms = timers.current_processing_time_ms();
            timers.register_processing_time_ms((now_ms / PERIOD_MS + 1) * PERIOD_MS);
            timers.register_processing_time_ms(NEVER_MS);
            timers.delete_processing_time_ms(NEVER_MS);
            Ok(())
        },
        |key: &u32, pending: &mut Pending, timestamp_ms, timers: &mut Timers<'_>, out| {
            if timers.firing() != Some(TimeDomain::ProcessingTime) {
                return Err(format!("a {:?} timer fired", timers.firing()).into());
            }
            let now_ms = timers.current_processing_time_ms();
            out.emit((*key, timestamp_ms, pending.records, now_ms));
            pending.records = 0;
            Ok(())
        },
    )
    .sink("collect", fired.clone())
    .parallelism(1);
}

/// Every record counted once; each (key, time) fired once, and the
/// deleted timer never. (A timer may fire before its time only at end of
/// input, which fires every pending one, so that is not checked here.)
fn verify_timers(events: &[Event], fired: &[Fired]) -> Result<(), String> {
    let mut want: BTreeMap<u32, u64> = BTreeMap::new();
    for event in events {
        *want.entry(event.1).or_default() += 1;
    }
    let mut got: BTreeMap<u32, u64> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for &(key, timestamp_ms, records, _) in fired {
        if timestamp_ms == NEVER_MS {
            return Err(format!("key {key}'s deleted timer fired"));
        }
        if !seen.insert((key, timestamp_ms)) {
            return Err(format!("key {key}'s timer at {timestamp_ms} fired twice"));
        }
        *got.entry(key).or_default() += records;
    }
    if got != want {
        return Err(format!("counted {got:?}, want {want:?}"));
    }
    Ok(())
}

fn check_timers(parallelism: usize, fault_count: u64) {
    quiet_injected_panics();
    for seed in seeds("SNAPFLOW_PROCESSING_SEEDS", 2) {
        let context = format!("SNAPFLOW_SEED={seed} p={parallelism}");
        let events = events(seed);
        let faults = planned_faults(seed, fault_count);
        let clock = ManualClock::new(START_MS);
        let job = fresh_job("timers", parallelism, &clock);
        let fired = CollectHandle::new();
        declare_timers(&job, &events, &faults, &Arc::new(AtomicU64::new(0)), &fired);
        let driver = Driver::start(&clock, 100);
        job.run()
            .unwrap_or_else(|error| panic!("{context}: {error}"));
        drop(driver);
        assert_eq!(
            faults.fired(),
            faults.planned(),
            "{context}: not every fault fired"
        );
        let fired = fired.committed();
        verify_timers(&events, &fired).unwrap_or_else(|error| panic!("{context}: {error}"));
        let on_time = fired.iter().filter(|fired| fired.3 >= fired.1).count();
        assert!(
            on_time > 0,
            "{context}: no timer fired by the clock (all at end of input)"
        );
    }
}

#[test]
fn processing_time_timers_at_parallelism_1() {
    check_timers(1, 0);
}

#[test]
fn processing_time_timers_at_parallelism_2() {
    check_timers(2, 0);
}

#[test]
fn processing_time_timers_at_parallelism_3() {
    check_timers(3, 0);
}

#[test]
fn processing_time_timers_with_failures_count_every_record_once_at_parallelism_2() {
    check_timers(2, 3);
}

/// Stops with a savepoint while every key has a pending timer, moves the
/// clock past them while the job is down, and resumes at `to`: they fire
/// on restore, before the rest of the input is read.
fn check_downtime(from: usize, to: usize) {
    for seed in seeds("SNAPFLOW_PROCESSING_SEEDS", 1) {
        let context = format!("SNAPFLOW_SEED={seed} {from} -> {to}");
        let events = events(seed);
        let clock = ManualClock::new(START_MS);
        let store: Arc<dyn CheckpointStore> =
            Arc::new(MemoryCheckpointStore::new("downtime").expect("a memory store opens"));
        let (progress, fired) = (Arc::new(AtomicU64::new(0)), CollectHandle::new());
        let first = Job::new("downtime", config(&store, from, &clock));
        declare_timers(&first, &events, &Faults::none(), &progress, &fired);
        let running = first.start().expect("the first run starts");
        let started = Instant::now();
        while progress.load(Ordering::Relaxed) < EVENTS / 4
            && started.elapsed() < Duration::from_secs(20)
        {
            thread::sleep(Duration::from_millis(1));
        }
        running.stop_with_savepoint();
        running
            .wait()
            .unwrap_or_else(|error| panic!("{context}: {error}"));
        assert!(
            fired.committed().is_empty(),
            "{context}: the clock stood still, nothing may fire before the stop"
        );
        // Down for a while: every pending timer is due at restore.
        clock.advance_ms(10 * PERIOD_MS);
        let restored_ms = clock.now_ms();
        let read_before = progress.swap(0, Ordering::Relaxed);
        let second = Job::new("downtime", config(&store, to, &clock));
        declare_timers(&second, &events, &Faults::none(), &progress, &fired);
        let running = second.start().expect("the second run starts");
        let started = Instant::now();
        let mut read_when_fired = None;
        while read_when_fired.is_none() && started.elapsed() < Duration::from_secs(20) {
            if fired
                .committed()
                .iter()
                .any(|fired| fired.1 <= START_MS + PERIOD_MS)
            {
                read_when_fired = Some(progress.load(Ordering::Relaxed));
            }
            thread::sleep(Duration::from_millis(1));
        }
        running
            .wait()
            .unwrap_or_else(|error| panic!("{context}: {error}"));
        let read_when_fired =
            read_when_fired.unwrap_or_else(|| panic!("{context}: the due timers never fired"));
        assert!(
            read_when_fired < EVENTS - read_before,
            "{context}: the due timers fired only after the input ended"
        );
        let fired = fired.committed();
        verify_timers(&events, &fired).unwrap_or_else(|error| panic!("{context}: {error}"));
        let due: Vec<&Fired> = fired
            .iter()
            .filter(|fired| fired.1 == START_MS + PERIOD_MS)
            .collect();
        assert!(
            !due.is_empty(),
            "{context}: no timer was pending at the stop"
        );
        assert!(
            due.iter().all(|fired| fired.3 >= restored_ms),
            "{context}: a due timer fired before the restore"
        );
    }
}

#[test]
fn timers_due_during_downtime_fire_on_restore_from_2_to_3() {
    check_downtime(2, 3);
}

#[test]
fn timers_due_during_downtime_fire_on_restore_from_3_to_1() {
    check_downtime(3, 1);
}

/// Tumbling processing-time windows: every record is in exactly one
/// committed window, windows are aligned, and none fires twice.
fn check_windows(parallelism: usize, fault_count: u64) {
    quiet_injected_panics();
    for seed in seeds("SNAPFLOW_PROCESSING_SEEDS", 2) {
        let context = format!("SNAPFLOW_SEED={seed} p={parallelism}");
        let events = events(seed);
        let faults = planned_faults(seed, fault_count);
        let clock = ManualClock::new(START_MS);
        let job = fresh_job("windows", parallelism, &clock);
        let output = CollectHandle::new();
        let checked = faults.clone();
        let windows = Windows::tumbling(PERIOD_MS).unwrap_or_else(|error| panic!("{error}"));
        let (windowed, late) = job
            .source(
                "events",
                Paced::over(VecSourceFactory::new(events.clone()), PACING),
            )
            .map("faults", move |event: Event| {
                checked.check_or_panic("faults", event.0);
                event
            })
            .key_by(|event: &Event| event.1)
            .processing_time_window(windows)
            .process("window", |key: &u32, events: &[Event]| {
                if events.iter().any(|event| event.1 != *key) {
                    return Err("a record in another key's window".into());
                }
                Ok(events.iter().map(|event| event.0).collect::<Vec<u64>>())
            });
        windowed.sink("collect", output.clone()).parallelism(1);
        let driver = Driver::start(&clock, 50);
        job.run()
            .unwrap_or_else(|error| panic!("{context}: {error}"));
        drop(driver);
        assert_eq!(
            faults.fired(),
            faults.planned(),
            "{context}: not every fault fired"
        );
        assert_eq!(
            late.dropped(),
            0,
            "{context}: nothing is late on processing time"
        );
        let mut ids = BTreeSet::new();
        let mut windows_seen = BTreeSet::new();
        let fired: Vec<Windowed<u32, Vec<u64>>> = output.committed();
        for window in &fired {
            assert_eq!(
                window.start_ms % PERIOD_MS,
                0,
                "{context}: {window:?} is not aligned"
            );
            assert_eq!(
                window.end_ms - window.start_ms,
                PERIOD_MS,
                "{context}: {window:?}"
            );
            assert!(
                windows_seen.insert((window.key, window.start_ms)),
                "{context}: {window:?} fired twice"
            );
            for &id in &window.result {
                assert!(ids.insert(id), "{context}: record {id} is in two windows");
            }
        }
        assert_eq!(
            ids.len() as u64,
            EVENTS,
            "{context}: records missing from the windows"
        );
        assert!(
            fired.len() > KEYS as usize,
            "{context}: the clock never cut a window"
        );
    }
}

#[test]
fn tumbling_processing_time_windows_at_parallelism_1() {
    check_windows(1, 0);
}

#[test]
fn tumbling_processing_time_windows_at_parallelism_2() {
    check_windows(2, 0);
}

#[test]
fn tumbling_processing_time_windows_at_parallelism_3() {
    check_windows(3, 0);
}

#[test]
fn tumbling_processing_time_windows_with_failures_at_parallelism_3() {
    check_windows(3, 3);
}
