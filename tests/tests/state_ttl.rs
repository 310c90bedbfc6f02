//! Per-key state time-to-live end to end, through the public API only.
//!
//! On event time, a keyed count with a 10 s time-to-live over seeded
//! out-of-order input whose keys come back either within 3 s (the count
//! goes on) or after more than 30 s (the count starts again): the margins
//! dwarf the watermark's lag, so every run, at parallelism 1, 2 and 3 and
//! with injected failures, equals the direct computation exactly. On
//! processing time, state that expired while the job was down is gone
//! after the restore, and state that did not is still there.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use snapflow::job::{Job, JobConfig, Stream};
use snapflow::sink::CollectHandle;
use snapflow::source::VecSourceFactory;
use snapflow::storage::{CheckpointStore, MemoryCheckpointStore};
use snapflow::time::{ManualClock, StateTtl, WatermarkStrategy};
use snapflow::Snapshot;
use snapflow_tests::pipeline::{Paced, Pacing};
use snapflow_tests::{event_time_config, quiet_injected_panics, seeds, FaultKind, Faults, TestRng};

const TTL_MS: u64 = 10_000;
/// A key back within this keeps its count.
const CLOSE_MS: u64 = 3_000;
/// A key back after this starts again.
const FAR_MS: u64 = 30_000;
const BOUND_MS: u64 = 500;
const JITTER_MS_MAX: u64 = 300;
const STEP_MS: u64 = 50;
const EPOCH_MS: u64 = 1_700_000_000_000;
const EVENTS: u64 = 3_000;
const PACING: Pacing = Pacing {
    records_per_read: 8,
};

/// A key's count.
#[derive(Snapshot, Default, Clone)]
struct Count {
    records: u64,
}

/// `(id, key, event time)`.
type Event = (u64, u32, u64);
/// `(id, key, the key's count after it)`.
type Counted = (u64, u32, u64);

/// Events whose keys never come back between `CLOSE_MS` and `FAR_MS`
/// after their latest event time: a key is drawn among those that may
/// come back now, and a new key is made when none may.
fn input(seed: u64) -> Vec<Event> {
    let mut rng = TestRng::new(seed);
    let mut latest: BTreeMap<u32, u64> = BTreeMap::new();
    (0..EVENTS)
        .map(|id| {
            let ts_ms = EPOCH_MS + id * STEP_MS - rng.between(0, JITTER_MS_MAX);
            let eligible: Vec<u32> = latest
                .iter()
                .filter(|(_, &last_ms)| ts_ms < last_ms + CLOSE_MS || ts_ms > last_ms + FAR_MS)
                .map(|(&key, _)| key)
                .collect();
            let key = if eligible.is_empty() || rng.chance(2) {
                latest.len() as u32
            } else {
                eligible[rng.between(0, eligible.len() as u64 - 1) as usize]
            };
            let last_ms = latest.entry(key).or_insert(ts_ms);
            *last_ms = (*last_ms).max(ts_ms);
            (id, key, ts_ms)
        })
        .collect()
}

/// The direct computation: per key, the count since it last came back
/// after more than `FAR_MS`.
fn direct(events: &[Event]) -> Vec<Counted> {
    let mut state: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    let mut counted: Vec<Counted> = events
        .iter()
        .map(|&(id, key, ts_ms)| {
            let (count, latest_ms) = state.entry(key).or_insert((0, ts_ms));
            if ts_ms > *latest_ms + FAR_MS {
                *count = 0;
            }
            *count += 1;
            *latest_ms = (*latest_ms).max(ts_ms);
            (id, key, *count)
        })
        .collect();
    counted.sort_unstable();
    counted
}

/// Per key, `(id, key, count)` after each record, the count kept with
/// `ttl`.
fn count_with_ttl<'j>(events: Stream<'j, Event>, ttl: StateTtl<Event>) -> Stream<'j, Counted> {
    events.key_by(|event: &Event| event.1).process_with_ttl(
        "count",
        ttl,
        |key: &u32, count: &mut Count, event: Event, out| {
            count.records += 1;
            out.emit((event.0, *key, count.records));
            Ok(())
        },
    )
}

/// The keyed count with an event-time time-to-live; the source runs at
/// parallelism 1 (so the watermark's lag is a read batch).
fn run(events: &[Event], (parallelism, cow): (usize, bool), faults: &Faults) -> Vec<Counted> {
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("ttl").expect("a memory store opens"));
    let mut config = event_time_config(&store, parallelism);
    if cow {
        // The copy-on-write layout from the start: checkpoints hand the
        // state and its timers to the checkpoint writer.
        config.copy_on_write_threshold_keys = 0;
    }
    let job = Job::new("ttl", config);
    let output = CollectHandle::new();
    let faults = faults.clone();
    let ttl = StateTtl::event_time(TTL_MS, |event: &Event| event.2)
        .unwrap_or_else(|error| panic!("bug in the test: {error}"));
    let events = job
        .source(
            "events",
            Paced::over(VecSourceFactory::new(events.to_vec()), PACING),
        )
        .parallelism(1)
        .assign_timestamps(WatermarkStrategy::bounded_out_of_orderness(
            BOUND_MS,
            |event: &Event| event.2,
        ))
        .map("faults", move |event: Event| {
            faults.check_or_panic("faults", event.0);
            event
        })
        .parallelism(1);
    count_with_ttl(events, ttl)
        .sink("collect", output.clone())
        .parallelism(1);
    job.run()
        .unwrap_or_else(|error| panic!("the job failed: {error}"));
    let mut counted = output.committed();
    counted.sort_unstable();
    counted
}

fn check(parallelism: usize, fault_count: u64) {
    check_in(false, parallelism, fault_count);
}

/// [`check`] in the flat layout, or with `cow` in the copy-on-write one:
/// the counts are exact either way.
fn check_in(cow: bool, parallelism: usize, fault_count: u64) {
    quiet_injected_panics();
    for seed in seeds("SNAPFLOW_TTL_SEEDS", 2) {
        let context = format!("SNAPFLOW_SEED={seed} p={parallelism} copy-on-write {cow}");
        let events = input(seed);
        let want = direct(&events);
        let restarts = want
            .iter()
            .filter(|&&(id, key, count)| count == 1 && want.iter().any(|c| c.1 == key && c.0 < id))
            .count();
        assert!(
            restarts > 0,
            "{context}: bug in the test: no key's state expires"
        );
        let mut rng = TestRng::new(seed ^ 0xfa17);
        let planned = (0..fault_count)
            .map(|_| ("faults", rng.between(100, EVENTS - 1), FaultKind::Panic))
            .collect();
        let faults = Faults::new(planned);
        let got = run(&events, (parallelism, cow), &faults);
        assert_eq!(
            faults.fired(),
            faults.planned(),
            "{context}: not every fault fired"
        );
        if got != want {
            let first = want.iter().zip(&got).find(|(want, got)| want != got);
            panic!(
                "{context}: {} counts, {} expected; first difference (want, got) {first:?}",
                got.len(),
                want.len()
            );
        }
    }
}

#[test]
fn event_time_ttl_at_parallelism_1() {
    check(1, 0);
}

#[test]
fn event_time_ttl_at_parallelism_2() {
    check(2, 0);
}

#[test]
fn event_time_ttl_at_parallelism_3() {
    check(3, 0);
}

#[test]
fn event_time_ttl_with_failures_is_exact_at_parallelism_2() {
    check(2, 3);
}

#[test]
fn copy_on_write_event_time_ttl_at_parallelism_1() {
    check_in(true, 1, 0);
}

#[test]
fn copy_on_write_event_time_ttl_at_parallelism_3() {
    check_in(true, 3, 0);
}

#[test]
fn copy_on_write_event_time_ttl_with_failures_is_exact_at_parallelism_2() {
    check_in(true, 2, 3);
}

#[test]
fn a_ttl_of_zero_is_refused() {
    assert!(StateTtl::<Event>::processing_time(0).is_err());
}

/// Counts per key on processing time with a 10 s time-to-live; stops
/// with a savepoint halfway, moves the clock by `down_ms`, resumes at
/// `to`. Returns what each run committed, sorted by id.
fn run_downtime(seed: u64, down_ms: u64, to: usize) -> (Vec<Counted>, Vec<Counted>) {
    let events = input(seed);
    let clock = ManualClock::new(EPOCH_MS);
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("ttl-down").expect("a memory store opens"));
    let output = CollectHandle::new();
    let progress = Arc::new(AtomicU64::new(0));
    let declare = |job: &Job| {
        let progress = Arc::clone(&progress);
        let ttl = StateTtl::processing_time(TTL_MS)
            .unwrap_or_else(|error| panic!("bug in the test: {error}"));
        let events = job
            .source(
                "events",
                Paced::over(VecSourceFactory::new(events.clone()), PACING),
            )
            .parallelism(1)
            .map("progress", move |event: Event| {
                progress.fetch_add(1, Ordering::Relaxed);
                event
            })
            .parallelism(1);
        count_with_ttl(events, ttl)
            .sink("collect", output.clone())
            .parallelism(1);
    };
    let config = |parallelism| JobConfig {
        clock: Arc::new(clock.clone()),
        processing_time_tick_ms: 1,
        ..event_time_config(&store, parallelism)
    };
    let first = Job::new("ttl-down", config(2));
    declare(&first);
    let running = first.start().expect("the first run starts");
    let started = Instant::now();
    while progress.load(Ordering::Relaxed) < EVENTS / 2
        && started.elapsed() < Duration::from_secs(20)
    {
        thread::sleep(Duration::from_millis(1));
    }
    running.stop_with_savepoint();
    running
        .wait()
        .unwrap_or_else(|error| panic!("SNAPFLOW_SEED={seed}: {error}"));
    let mut before = output.committed();
    before.sort_unstable();
    clock.advance_ms(down_ms);
    let second = Job::new("ttl-down", config(to));
    declare(&second);
    second
        .run()
        .unwrap_or_else(|error| panic!("SNAPFLOW_SEED={seed}: {error}"));
    let mut after: Vec<Counted> = output
        .committed()
        .into_iter()
        .filter(|counted| !before.contains(counted))
        .collect();
    after.sort_unstable();
    (before, after)
}

/// Per key, the counts of `counted` in id order.
fn counts_by_key(counted: &[Counted]) -> BTreeMap<u32, Vec<u64>> {
    let mut by_key: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for &(_, key, count) in counted {
        by_key.entry(key).or_default().push(count);
    }
    by_key
}

/// The clock stands still while the job runs, so nothing expires then;
/// down for more than the time-to-live, every key starts again after the
/// restore; down for less, every key goes on.
fn check_downtime(down_ms: u64, to: usize) {
    for seed in seeds("SNAPFLOW_TTL_SEEDS", 1) {
        let context = format!("SNAPFLOW_SEED={seed} down {down_ms} ms, resumed at {to}");
        let (before, after) = run_downtime(seed, down_ms, to);
        let (before, after) = (counts_by_key(&before), counts_by_key(&after));
        assert!(
            !before.is_empty() && !after.is_empty(),
            "{context}: both runs count"
        );
        for (key, counts) in &before {
            let want: Vec<u64> = (1..=counts.len() as u64).collect();
            assert_eq!(counts, &want, "{context}: key {key} before the stop");
        }
        for (key, counts) in &after {
            let first = match before.get(key) {
                Some(old) if down_ms < TTL_MS => old.len() as u64 + 1,
                _ => 1,
            };
            let want: Vec<u64> = (first..first + counts.len() as u64).collect();
            assert_eq!(counts, &want, "{context}: key {key} after the restore");
        }
    }
}

#[test]
fn state_expired_during_downtime_is_gone_after_restore_from_2_to_3() {
    check_downtime(TTL_MS + 1, 3);
}

#[test]
fn state_not_expired_during_downtime_is_kept_from_2_to_1() {
    check_downtime(TTL_MS / 2, 1);
}
