//! Event time from Kafka record timestamps, with a watermark per
//! partition merged in each source subtask, against a real broker (see
//! `kafka.rs` for how to start it; without `SNAPFLOW_KAFKA_BROKERS` each
//! test prints how and passes, except in CI, where it fails). The test's
//! producer sets every record's timestamp (`BaseRecord::timestamp`), the
//! deserialiser keeps `KafkaRecord::timestamp_ms`, and a tumbling
//! event-time window counts per key.
//!
//! - One partition far behind: four partitions whose timestamps lie 0,
//!   30, 60 and 90 s after a base, each out of order within the
//!   strategy's bound, read at parallelism 1, 2 and 3 (bounded). With one
//!   generator per partition no record is late (the windows fired only
//!   when the slowest partition's watermark passed them) and the counts
//!   equal the direct computation. With one generator for all of a
//!   subtask's partitions, the fast partitions' timestamps would make
//!   the slow one's records late.
//! - More subtasks than partitions (unbounded, two partitions, three
//!   subtasks): the subtask without a partition is idle at once, so the
//!   windows the data makes due fire while the job runs, and no other.
//! - Idleness (unbounded, one subtask reading two partitions): a
//!   partition that stops producing holds the windows back without
//!   `with_idleness` (nothing past its watermark fires while the other
//!   partition runs on) and does not with it (the windows follow the
//!   partition that still produces, with exact counts).
//! - A partition added to the topic while the job runs is discovered and
//!   gets a generator of its own: once the job read it, it holds the
//!   windows back at its watermark while the older partition runs ahead.
//!   tansu 0.6 has no `CreatePartitions`: this test runs a broker of its
//!   own on S3 storage (`.ci/s3.sh`) and raises the partition count in
//!   the broker's stored metadata (`snapflow_tests::tansu`).
//!
//! Seeds (the out-of-order jitter of the first test):
//! `SNAPFLOW_KAFKA_EVENT_TIME_SEEDS` (default 2) from 1 on;
//! `SNAPFLOW_SEED=n` replays seed n. A failing run names its seed.

#[path = "kafka/support.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseRecord, Producer};
use snapflow::connectors::kafka::source::owner;
use snapflow::connectors::kafka::{KafkaRecord, KafkaSourceConfig, KafkaSourceFactory};
use snapflow::job::{Job, JobConfig, JobError, RunningJob, Stream};
use snapflow::sink::CollectHandle;
use snapflow::time::{LateRecords, ManualClock, WatermarkStrategy, Windowed, Windows};
use snapflow_tests::tansu::TansuBroker;
use snapflow_tests::{seeds, TestRng};

use support::{broker, create_topic, produce_timed, producer, unique};

/// Record timestamps are this many ms after the epoch plus the test's
/// own event time (librdkafka reads a timestamp of 0 as "now").
const BASE_MS: u64 = 1_700_000_000_000;
/// The tumbling window's size.
const WINDOW_MS: u64 = 1_000;
/// Keys of the count.
const KEYS: u64 = 3;
/// How long a test waits for windows to fire in an unbounded run before
/// it fails.
const DEADLINE: Duration = Duration::from_secs(60);

/// A record as the job sees it: (event time in ms since `BASE_MS`, key,
/// partition).
type Event = (u64, u64, i32);

/// The record's Kafka timestamp (made relative to `BASE_MS`), its key
/// from the value, and its partition.
fn decode(record: &KafkaRecord<'_>) -> Result<Event, String> {
    let timestamp_ms = record
        .timestamp_ms()
        .ok_or("a record without a timestamp")?;
    let ts = u64::try_from(timestamp_ms)
        .ok()
        .and_then(|ts| ts.checked_sub(BASE_MS))
        .ok_or_else(|| format!("timestamp {timestamp_ms} before the test's base"))?;
    let value = record.value().ok_or("a record without a value")?;
    let key = std::str::from_utf8(value)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or("a value that is not a key")?;
    Ok((ts, key, record.partition()))
}

type Decode = fn(&KafkaRecord<'_>) -> Result<Event, String>;

fn source(brokers: &str, topic: &str, bounded: bool) -> KafkaSourceFactory<Decode> {
    let mut config = KafkaSourceConfig::new(brokers, &[topic]);
    config.bounded = bounded;
    config.client_options = vec![("fetch.wait.max.ms".to_owned(), "50".to_owned())];
    KafkaSourceFactory::new(config, decode as Decode).expect("the source's start checks pass")
}

/// A record of the input: (partition, event time, key).
type Row = (i32, u64, u64);

fn produce_rows(brokers: &str, topic: &str, rows: &[Row]) {
    let records: Vec<_> = rows
        .iter()
        .map(|(partition, ts, key)| {
            let timestamp_ms = i64::try_from(BASE_MS + ts).expect("a timestamp in range");
            (*partition, timestamp_ms, key.to_string().into_bytes())
        })
        .collect();
    produce_timed(brokers, topic, &records);
}

/// One window's result: (key, end, count).
type Fired = (u64, u64, u64);

/// The direct computation: per (key, window end) the records of `rows`.
fn expected(rows: &[Row]) -> Vec<Fired> {
    let mut counts = BTreeMap::new();
    for (_, ts, key) in rows {
        let end_ms = (ts / WINDOW_MS + 1) * WINDOW_MS;
        *counts.entry((*key, end_ms)).or_insert(0) += 1;
    }
    counts.into_iter().map(|((k, e), c)| (k, e, c)).collect()
}

fn rows_of(windows: Vec<Windowed<u64, u64>>) -> Vec<Fired> {
    let mut rows: Vec<_> = windows
        .into_iter()
        .map(|w| (w.key, w.end_ms, w.result))
        .collect();
    rows.sort_unstable();
    rows
}

/// The windows fired so far, as a map operator after the window saw
/// them (the unbounded runs end by a cancel, so their committed output is
/// not the place to look; no test here injects a failure, so each window
/// passes the map once).
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Windowed<u64, u64>>>>);

impl Seen {
    fn rows(&self) -> Vec<Fired> {
        rows_of(self.0.lock().expect("not poisoned").clone())
    }

    fn max_end_ms(&self) -> u64 {
        self.rows()
            .iter()
            .map(|(_, end, _)| *end)
            .max()
            .unwrap_or(0)
    }
}

/// Counts `events` per key in tumbling windows into `output`, and shows
/// every window in `seen`.
fn count_windows(
    events: Stream<'_, Event>,
    seen: &Seen,
    output: &CollectHandle<Windowed<u64, u64>>,
) -> LateRecords {
    let (windows, late) = events
        .key_by(|event: &Event| event.1)
        .window(
            Windows::tumbling(WINDOW_MS).expect("valid"),
            |event: &Event| event.0,
        )
        .count("count");
    let seen = seen.clone();
    windows
        .map("seen", move |window: Windowed<u64, u64>| {
            seen.0.lock().expect("not poisoned").push(window.clone());
            window
        })
        .sink("out", output.clone());
    late
}

fn job_config(parallelism: usize) -> JobConfig {
    JobConfig {
        default_parallelism: parallelism,
        // Small batches, so the source goes round its partitions often.
        batch_size_max: 16,
        arbiters: Some(2),
        ..JobConfig::default()
    }
}

/// The slow partition's first event time lies this far behind the
/// fastest one's.
const BEHIND_MS: u64 = 90_000;
/// Records per partition in the first test.
const PER_PARTITION: u64 = 200;
/// Event time between a partition's consecutive records.
const STEP_MS: u64 = 250;
/// The out-of-orderness the strategy allows.
const BOUND_MS: u64 = 1_000;
/// A record's timestamp is up to this much above its place in its
/// partition's sequence: records are out of order by less than
/// `BOUND_MS`, so none breaks its own partition's watermark.
const JITTER_MS: u64 = 800;

/// Partition `p` of four starts at `(3 - p) * 30 s`: partition 3 is far
/// behind, and the ranges overlap.
fn far_behind_rows(rng: &mut TestRng) -> Vec<Row> {
    let mut rows = Vec::new();
    for partition in 0..4i32 {
        let start_ms = (3 - partition as u64) * (BEHIND_MS / 3);
        for index in 0..PER_PARTITION {
            let ts = start_ms + index * STEP_MS + rng.between(0, JITTER_MS);
            rows.push((partition, ts, rng.between(0, KEYS - 1)));
        }
    }
    rows
}

fn check_far_behind(parallelism: usize) {
    let Some(brokers) = broker() else {
        return;
    };
    for seed in seeds("SNAPFLOW_KAFKA_EVENT_TIME_SEEDS", 2) {
        let mut rng = TestRng::new(seed);
        let rows = far_behind_rows(&mut rng);
        let topic = unique("kafka-event-time-behind");
        create_topic(&brokers, &topic, 4);
        produce_rows(&brokers, &topic, &rows);
        let job = Job::new(&unique("kafka-event-time"), job_config(parallelism));
        let output = CollectHandle::new();
        let events = job
            .source("in", source(&brokers, &topic, true))
            .assign_timestamps(WatermarkStrategy::bounded_out_of_orderness(
                BOUND_MS,
                |event: &Event| event.0,
            ));
        let late = count_windows(events, &Seen::default(), &output);
        job.run().expect("the job runs");
        assert_eq!(
            late.dropped(),
            0,
            "seed {seed}, parallelism {parallelism}: records were late, so a window fired \
             before the slowest partition's watermark passed it"
        );
        assert_eq!(
            rows_of(output.committed()),
            expected(&rows),
            "seed {seed}, parallelism {parallelism}: the window counts differ from the direct \
             computation"
        );
    }
}

#[test]
fn a_partition_far_behind_holds_the_windows_back_at_parallelism_1() {
    check_far_behind(1);
}

#[test]
fn a_partition_far_behind_holds_the_windows_back_at_parallelism_2() {
    check_far_behind(2);
}

#[test]
fn a_partition_far_behind_holds_the_windows_back_at_parallelism_3() {
    check_far_behind(3);
}

/// Polls `done` every 50 ms until it holds or [`DEADLINE`] passes; says
/// whether it held.
fn wait_for(done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + DEADLINE;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        thread::sleep(Duration::from_millis(50));
    }
    done()
}

/// Cancels an unbounded job and checks that it ended by the cancel.
fn cancel(running: RunningJob) {
    running.cancel();
    match running.wait() {
        Err(JobError::Cancelled) => {}
        other => panic!("the job should end cancelled, got {other:?}"),
    }
}

/// `rows` restricted to the windows ending at or before `end_ms`.
fn up_to(rows: Vec<Fired>, end_ms: u64) -> Vec<Fired> {
    rows.into_iter()
        .filter(|(_, end, _)| *end <= end_ms)
        .collect()
}

#[test]
fn a_subtask_without_a_partition_does_not_stall_the_windows() {
    let Some(brokers) = broker() else {
        return;
    };
    let topic = unique("kafka-event-time-spare");
    create_topic(&brokers, &topic, 2);
    let parallelism = 3;
    let owners: Vec<_> = (0..2).map(|p| owner(&topic, p, parallelism)).collect();
    assert_ne!(owners[0], owners[1], "two partitions go to two subtasks");
    // 10 s of event time in each partition.
    let rows: Vec<Row> = (0..2)
        .flat_map(|partition| (0..100).map(move |i| (partition, i * 100, i % KEYS)))
        .collect();
    produce_rows(&brokers, &topic, &rows);
    let job = Job::new(&unique("kafka-event-time-spare"), job_config(2));
    let (output, seen) = (CollectHandle::new(), Seen::default());
    let bound_ms = 500;
    let events = job
        .source("in", source(&brokers, &topic, false))
        .parallelism(parallelism)
        .assign_timestamps(WatermarkStrategy::bounded_out_of_orderness(
            bound_ms,
            |event: &Event| event.0,
        ));
    let late = count_windows(events, &seen, &output);
    let running = job.start().expect("the job starts");
    // Both partitions end at 9900 ms: the watermark reaches 9399, so the
    // windows ending up to 9000 fire, and no later one.
    let due = up_to(expected(&rows), 9_000);
    let fired = wait_for(|| up_to(seen.rows(), 9_000) == due);
    // Time for a window fired past the watermark to show.
    thread::sleep(Duration::from_millis(300));
    cancel(running);
    assert!(
        fired,
        "the windows due did not fire within {DEADLINE:?}: the subtask without a partition \
         held the watermark back (fired: {:?})",
        seen.rows()
    );
    assert_eq!(late.dropped(), 0);
    assert_eq!(seen.rows(), due, "no window past the watermark fired");
}

/// The partition that stops producing, and the one that runs on.
const STOPS: i32 = 1;
const RUNS: i32 = 0;

/// Writes records into partition [`RUNS`] of `topic` every 20 ms, event
/// time 100 ms apart from `from_ms`, until `stop`; returns them.
fn run_on(brokers: &str, topic: &str, from_ms: u64, stop: &AtomicBool) -> Vec<Row> {
    let producer = producer(brokers);
    let mut rows = Vec::new();
    let mut ts = from_ms;
    while !stop.load(Ordering::SeqCst) {
        let key = (ts / 100) % KEYS;
        let value = key.to_string();
        let record = BaseRecord::<[u8], [u8]>::to(topic)
            .partition(RUNS)
            .timestamp(i64::try_from(BASE_MS + ts).expect("in range"))
            .payload(value.as_bytes());
        producer
            .send(record)
            .map_err(|(error, _)| error)
            .expect("the producer takes the record");
        producer.poll(Duration::ZERO);
        rows.push((RUNS, ts, key));
        ts += 100;
        thread::sleep(Duration::from_millis(20));
    }
    producer
        .flush(support::TIMEOUT)
        .expect("every record is acknowledged");
    rows
}

/// The idleness scenario's strategy, without idleness.
fn strategy() -> WatermarkStrategy<Event> {
    WatermarkStrategy::bounded_out_of_orderness(100, |event: &Event| event.0)
}

/// What an unbounded run shows while it runs.
#[derive(Default)]
struct Watch {
    /// The windows fired.
    seen: Seen,
    /// The highest event time the job read from partitions 0 and 1.
    read_to_ms: [AtomicU64; 2],
}

impl Watch {
    fn read_to_ms(&self, partition: i32) -> u64 {
        self.read_to_ms[partition as usize].load(Ordering::SeqCst)
    }
}

/// What one run of the idleness scenario gave.
struct QuietRun {
    /// Every record written.
    rows: Vec<Row>,
    /// What the job showed.
    watch: Arc<Watch>,
    /// Whether the run's condition held before the deadline.
    held: bool,
    /// Records the window dropped as late.
    late: u64,
}

/// Runs the idleness scenario under `strategy`: both partitions hold
/// 0..3000 ms; then partition [`RUNS`] runs on while [`STOPS`] is quiet,
/// until `enough` holds for what the job shows (or the deadline passes).
fn quiet_partition(
    brokers: &str,
    strategy: WatermarkStrategy<Event>,
    enough: impl Fn(&Watch) -> bool,
) -> QuietRun {
    let topic = unique("kafka-event-time-idle");
    create_topic(brokers, &topic, 2);
    let mut rows: Vec<Row> = [RUNS, STOPS]
        .into_iter()
        .flat_map(|partition| (0..30).map(move |i| (partition, i * 100, i % KEYS)))
        .collect();
    produce_rows(brokers, &topic, &rows);
    let job = Job::new(&unique("kafka-event-time-idle"), job_config(1));
    let output = CollectHandle::new();
    let watch = Arc::new(Watch::default());
    let reads = Arc::clone(&watch);
    let events = job
        .source("in", source(brokers, &topic, false))
        .assign_timestamps(strategy)
        .map("read", move |event: Event| {
            reads.read_to_ms[event.2 as usize].fetch_max(event.0, Ordering::SeqCst);
            event
        });
    let late = count_windows(events, &watch.seen, &output);
    let running = job.start().expect("the job starts");
    let stop = AtomicBool::new(false);
    let (ran, held) = thread::scope(|scope| {
        let writer = scope.spawn(|| run_on(brokers, &topic, 3_000, &stop));
        let held = wait_for(|| enough(&watch));
        stop.store(true, Ordering::SeqCst);
        (writer.join().expect("the writer ran"), held)
    });
    cancel(running);
    rows.extend(ran);
    QuietRun {
        rows,
        watch,
        held,
        late: late.dropped(),
    }
}

#[test]
fn a_quiet_partition_holds_the_windows_back_without_idleness() {
    let Some(brokers) = broker() else {
        return;
    };
    // Partition STOPS ends at 2900 ms: its watermark stays at 2799, so
    // only the windows ending up to 2000 may fire, however far the other
    // partition runs. The run goes on until the job read the running
    // partition to 8000 ms, and 500 ms more, for a window fired too early
    // to show (or until one did).
    let read_at = Mutex::new(None::<Instant>);
    let run = quiet_partition(&brokers, strategy(), |watch| {
        if watch.seen.max_end_ms() > 2_000 {
            return true;
        }
        if watch.read_to_ms(RUNS) < 8_000 {
            return false;
        }
        let mut at = read_at.lock().expect("not poisoned");
        at.get_or_insert_with(Instant::now).elapsed() > Duration::from_millis(500)
    });
    assert!(
        run.held,
        "the job never read the running partition to 8000 ms (read to {} ms)",
        run.watch.read_to_ms(RUNS)
    );
    assert_eq!(run.late, 0);
    assert_eq!(
        run.watch.seen.rows(),
        up_to(expected(&run.rows), 2_000),
        "only the windows before the quiet partition's watermark fire, each with every record"
    );
}

#[test]
fn an_idle_partition_does_not_stall_the_windows() {
    let Some(brokers) = broker() else {
        return;
    };
    // With idleness the quiet partition stops counting after 300 ms, and
    // the windows follow the running one: wait until the window ending at
    // 10 s fired. The strategy's clock starts once the job read the quiet
    // partition's records (a broker slow to answer the first fetch must
    // not make a partition idle before its records came, which would make
    // them late: that is what idleness means, but not what this test is
    // about), then runs at the wall clock's pace, 50 ms per look.
    let clock = ManualClock::new(0);
    let strategy = strategy().with_idleness(300).with_clock(clock.clone());
    let run = quiet_partition(&brokers, strategy, |watch| {
        if watch.read_to_ms(STOPS) >= 2_900 {
            clock.advance_ms(50);
        }
        watch.seen.max_end_ms() >= 10_000
    });
    assert!(
        run.held,
        "the windows stalled at {} ms: the quiet partition held them back",
        run.watch.seen.max_end_ms()
    );
    assert_eq!(run.late, 0);
    assert_eq!(
        up_to(run.watch.seen.rows(), 10_000),
        up_to(expected(&run.rows), 10_000),
        "each window fired once with every record of both partitions"
    );
}

/// The topic grows on a tansu broker of the test's own, on S3 storage
/// (`snapflow_tests::tansu`): tansu has no `CreatePartitions`, and the
/// partition count is raised in its stored metadata instead (see
/// `kafka_discovery.rs`).
#[test]
fn a_partition_discovered_later_holds_the_windows_back_with_its_own_watermark() {
    let Some(broker) = TansuBroker::from_env("Kafka event time (discovery)") else {
        return;
    };
    let brokers = broker.address();
    let topic = unique("kafka-event-time-grow");
    create_topic(&brokers, &topic, 1);
    // Partition 0 first holds 0..5000 ms.
    let mut rows: Vec<Row> = (0..50).map(|i| (0, i * 100, i % KEYS)).collect();
    produce_rows(&brokers, &topic, &rows);
    let mut config = KafkaSourceConfig::new(&brokers, &[&topic]);
    config.discovery_interval_ms = Some(200);
    config.client_options = vec![("fetch.wait.max.ms".to_owned(), "50".to_owned())];
    let source = KafkaSourceFactory::new(config, decode as Decode).expect("the start checks pass");
    let job = Job::new(&unique("kafka-event-time-grow"), job_config(1));
    let output = CollectHandle::new();
    let watch = Arc::new(Watch::default());
    let reads = Arc::clone(&watch);
    let events = job
        .source("in", source)
        .assign_timestamps(WatermarkStrategy::bounded_out_of_orderness(
            500,
            |event: &Event| event.0,
        ))
        .map("read", move |event: Event| {
            reads.read_to_ms[event.2 as usize].fetch_max(event.0, Ordering::SeqCst);
            event
        });
    let late = count_windows(events, &watch.seen, &output);
    let running = job.start().expect("the job starts");
    // The watermark reaches 4399: the windows up to 4000 fire.
    let first = up_to(expected(&rows), 4_000);
    let mut fired = wait_for(|| watch.seen.rows() == first);
    // A second partition appears with 5000..10000 ms; once the job read
    // it, partition 0 runs on to 20000 ms. The new partition's own
    // generator (at 9399) holds the subtask back: the windows up to
    // 9000 fire, and none later.
    broker.add_partitions(&topic, 2);
    let grown: Vec<Row> = (50..100).map(|i| (1, i * 100, i % KEYS)).collect();
    produce_rows(&brokers, &topic, &grown);
    fired = fired && wait_for(|| watch.read_to_ms(1) >= 9_900);
    let ahead: Vec<Row> = (50..200).map(|i| (0, i * 100, i % KEYS)).collect();
    produce_rows(&brokers, &topic, &ahead);
    rows.extend(grown);
    rows.extend(ahead);
    let due = up_to(expected(&rows), 9_000);
    fired = fired
        && wait_for(|| watch.read_to_ms(0) >= 19_900 && up_to(watch.seen.rows(), 9_000) == due);
    // Time for a window fired past the new partition's watermark to show.
    thread::sleep(Duration::from_millis(500));
    cancel(running);
    assert!(
        fired,
        "the run did not get through its steps within {DEADLINE:?} (read to {} and {} ms, \
         fired {:?})",
        watch.read_to_ms(0),
        watch.read_to_ms(1),
        watch.seen.rows()
    );
    assert_eq!(late.dropped(), 0);
    assert_eq!(
        watch.seen.rows(),
        due,
        "nothing fired past the discovered partition's watermark"
    );
}
