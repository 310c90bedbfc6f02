//! Partitions added to a topic while a job reads it are discovered, read
//! from their first record exactly once, and kept in the snapshot, against
//! a real broker.
//!
//! **How partitions are added.** tansu 0.6, the broker CI runs, has no
//! `CreatePartitions` (it answers `UnsupportedFeature`; no tansu release
//! implements it), and its PostgreSQL storage is not compiled into the
//! binary CI installs. Each test here starts a tansu broker of its own
//! ([`TansuBroker`]: `SNAPFLOW_TANSU_BIN` from `.ci/kafka.sh`, on a free
//! loopback port) with its storage in a bucket of the S3 server
//! `.ci/s3.sh` starts (`SNAPFLOW_S3_ENDPOINT`), and grows the topic by
//! raising its partition count in the broker's stored metadata
//! ([`TansuBroker::add_partitions`], which explains the objects it edits)
//! while the broker and the job run. The broker's `Metadata` answers then
//! list the new partitions, and it produces and fetches on them, as a
//! Kafka broker does after `CreatePartitions`. Without either variable
//! each test prints how to start the servers and passes, except in CI,
//! where it fails.
//!
//! - At source parallelism 1, 2 and 3 (fewer, as many and more subtasks
//!   than the first two partitions): a job counts per key over an
//!   unbounded topic of two partitions; once it read their records the
//!   topic grows to four and records go to all four. The job reads every
//!   record exactly once (the ids it read are each id once, none missing)
//!   and its count state in the savepoint taken after the last record
//!   (read with `snapflow::job::inspect`) equals the direct count. The source discovers every 200 ms.
//! - Then the job resumes from that savepoint at another parallelism and
//!   more records go to all four partitions: it reads exactly the new
//!   ones (a discovered partition missing from the snapshot would start
//!   again at its first record and be read twice), and the restored state
//!   plus the new records equals the direct count over everything; the
//!   sink's committed output over both runs holds each key's every count
//!   exactly once.
//!
//! Records are written one per produce request: tansu on S3 storage
//! serves a partition only up to the last batch's first offset plus one
//! (`kafka_probe.rs`), so a record behind another in its batch could wait
//! for the next batch.

#[path = "kafka/support.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseRecord, Producer};
use snapflow::connectors::kafka::{KafkaRecord, KafkaSourceConfig, KafkaSourceFactory};
use snapflow::job::inspect::CheckpointView;
use snapflow::job::{Job, JobConfig, JobReport, RestartStrategy};
use snapflow::sink::CollectHandle;
use snapflow::storage::{CheckpointStore, MemoryCheckpointStore};
use snapflow::Snapshot;
use snapflow_tests::kafka_count::decode_id;
use snapflow_tests::tansu::TansuBroker;

use support::{create_topic, unique};

/// Keys of the count.
const KEYS: u64 = 5;
/// The partitions the topic starts with, and has after it grew.
const PARTITIONS_FIRST: i32 = 2;
const PARTITIONS_GROWN: i32 = 4;
/// Records before the topic grows, after it grew, and after the restore.
const RECORDS_FIRST: u64 = 30;
const RECORDS_GROWN: u64 = 60;
const RECORDS_RESUMED: u64 = 40;
/// How often the source asks for new partitions.
const DISCOVERY_MS: u64 = 200;
/// The checkpoint interval.
const INTERVAL_MS: u64 = 100;
/// The longest a wait for the job to read records lasts.
const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// The per-key state of the count.
#[derive(Snapshot, Debug, Clone, Default)]
struct Count {
    seen: u64,
}

type Decode = fn(&KafkaRecord<'_>) -> Result<u64, String>;

/// The ids the job read, in the order it read them.
#[derive(Clone, Default)]
struct Reads(Arc<Mutex<Vec<u64>>>);

impl Reads {
    fn len(&self) -> usize {
        self.0.lock().expect("not poisoned").len()
    }

    fn sorted(&self) -> Vec<u64> {
        let mut ids = self.0.lock().expect("not poisoned").clone();
        ids.sort_unstable();
        ids
    }
}

fn source(brokers: &str, topic: &str) -> KafkaSourceFactory<Decode> {
    let mut config = KafkaSourceConfig::new(brokers, &[topic]);
    config.discovery_interval_ms = Some(DISCOVERY_MS);
    config.client_options = vec![("fetch.wait.max.ms".to_owned(), "50".to_owned())];
    KafkaSourceFactory::new(config, decode_id as Decode).expect("the source's checks pass")
}

fn job_config(store: &Arc<dyn CheckpointStore>) -> JobConfig {
    JobConfig {
        checkpoint_interval_ms: Some(INTERVAL_MS),
        batch_size_max: 8,
        max_parallelism: 16,
        arbiters: Some(2),
        store: Some(Arc::clone(store)),
        // A failure would re-read records and hide nothing here, but the
        // test wants a run without any: it fails on the first.
        restart: RestartStrategy::FixedDelay {
            attempts_max: 0,
            delay_ms: 0,
        },
        ..JobConfig::default()
    }
}

/// The job's sink: it outlives a run, as an external system does, so a
/// resumed run finds the transactions the savepoint lists.
type Output = CollectHandle<(u64, u64)>;

/// Declares source → record the id → count per key → `output` on `job`,
/// every operator at `parallelism`.
fn declare(
    job: &Job,
    (brokers, topic): (&str, &str),
    parallelism: usize,
    reads: &Reads,
    output: &Output,
) {
    let reads = reads.clone();
    let (counted, _state) = job
        .source("in", source(brokers, topic))
        .parallelism(parallelism)
        .map("read", move |id: u64| {
            reads.0.lock().expect("not poisoned").push(id);
            id
        })
        .parallelism(parallelism)
        .key_by(|id: &u64| id % KEYS)
        .process_with_state("count", |key: &u64, count: &mut Count, _id, out| {
            count.seen += 1;
            out.emit((*key, count.seen));
            Ok(())
        });
    counted.parallelism(parallelism).sink("out", output.clone());
}

/// Writes each id to partition `id % partitions`, one produce request
/// per record (see the module documentation).
fn produce(brokers: &str, topic: &str, ids: std::ops::Range<u64>, partitions: i32) {
    let producer = support::producer(brokers);
    for id in ids {
        let value = id.to_string();
        producer
            .send(
                BaseRecord::<(), _>::to(topic)
                    .partition((id % partitions as u64) as i32)
                    .payload(&value),
            )
            .map_err(|(error, _)| error)
            .expect("the record is queued");
        producer
            .flush(support::TIMEOUT)
            .expect("the record is acknowledged");
    }
}

/// Waits until the job read `count` records; `false` at the time limit.
fn await_reads(reads: &Reads, count: usize) -> bool {
    let deadline = Instant::now() + WAIT_LIMIT;
    while reads.len() < count {
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Stops the job with a savepoint and returns its report.
fn stop(running: snapflow::job::RunningJob) -> JobReport {
    running.stop_with_savepoint();
    running.wait().expect("the job stops with a savepoint")
}

/// Each key's count over `ids`.
fn direct_count(ids: std::ops::Range<u64>) -> BTreeMap<u64, u64> {
    let mut counts = BTreeMap::new();
    for id in ids {
        *counts.entry(id % KEYS).or_insert(0) += 1;
    }
    counts
}

/// Every `(key, n)` for `n` from 1 to the key's count, sorted.
fn every_count(counts: &BTreeMap<u64, u64>) -> Vec<(u64, u64)> {
    counts
        .iter()
        .flat_map(|(&key, &count)| (1..=count).map(move |n| (key, n)))
        .collect()
}

/// Each key's count in the state of the count operator in `savepoint`
/// (an unbounded job never ends its input, so the state is read from
/// the checkpoint store, not from a `KeyedStateHandle`).
fn saved_state(store: &Arc<dyn CheckpointStore>, savepoint: u64) -> BTreeMap<u64, u64> {
    CheckpointView::load(store.as_ref(), savepoint)
        .expect("the savepoint loads")
        .keyed_state::<u64, Count>("count")
        .expect("the count's state decodes")
        .into_iter()
        .map(|(key, count)| (key, count.seen))
        .collect()
}

/// The run at `parallelism`, then the resumed run at `resumed_parallelism`.
fn check(parallelism: usize, resumed_parallelism: usize) {
    let Some(broker) = TansuBroker::from_env("Kafka partition discovery") else {
        return;
    };
    let brokers = broker.address();
    let (topic, job_name) = (unique("grow"), unique("grow-job"));
    create_topic(&brokers, &topic, PARTITIONS_FIRST);
    produce(&brokers, &topic, 0..RECORDS_FIRST, PARTITIONS_FIRST);
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("kafka-discovery").expect("a memory store"));

    let reads = Reads::default();
    let job = Job::new(&job_name, job_config(&store));
    let output = Output::new();
    declare(&job, (&brokers, &topic), parallelism, &reads, &output);
    let running = job.start().expect("the job starts");
    let read_first = await_reads(&reads, RECORDS_FIRST as usize);
    broker.add_partitions(&topic, PARTITIONS_GROWN);
    let total = RECORDS_FIRST + RECORDS_GROWN;
    produce(&brokers, &topic, RECORDS_FIRST..total, PARTITIONS_GROWN);
    let read_grown = read_first && await_reads(&reads, total as usize);
    let report = stop(running);
    let at = format!("parallelism {parallelism}");
    assert!(
        read_grown,
        "{at}: the job read {} of {total} records within {WAIT_LIMIT:?} (first {read_first})",
        reads.len()
    );
    assert_eq!(
        reads.sorted(),
        (0..total).collect::<Vec<_>>(),
        "{at}: every record of the old and the new partitions is read exactly once"
    );
    let savepoint = report.savepoint.expect("a savepoint");
    assert_eq!(
        saved_state(&store, savepoint),
        direct_count(0..total),
        "{at}: state"
    );

    // Resumed from the savepoint, at another parallelism: the discovered
    // partitions go on from their stored offsets.
    let resumed_reads = Reads::default();
    let job = Job::new(&job_name, job_config(&store));
    declare(
        &job,
        (&brokers, &topic),
        resumed_parallelism,
        &resumed_reads,
        &output,
    );
    let running = job.start().expect("the job resumes");
    let end = total + RECORDS_RESUMED;
    produce(&brokers, &topic, total..end, PARTITIONS_GROWN);
    let read_resumed = await_reads(&resumed_reads, RECORDS_RESUMED as usize);
    // Time for a record read twice to show.
    thread::sleep(Duration::from_millis(3 * DISCOVERY_MS));
    let report = stop(running);
    let at = format!("{at}, resumed at {resumed_parallelism}");
    assert_eq!(report.resumed_from, Some(savepoint), "{at}");
    assert!(
        read_resumed,
        "{at}: the job read {} of {RECORDS_RESUMED} records within {WAIT_LIMIT:?}",
        resumed_reads.len()
    );
    assert_eq!(
        resumed_reads.sorted(),
        (total..end).collect::<Vec<_>>(),
        "{at}: the resumed job reads exactly the records written after the savepoint"
    );
    let last = report.savepoint.expect("a savepoint");
    let want = direct_count(0..end);
    assert_eq!(saved_state(&store, last), want, "{at}: state");
    let mut committed = output.committed();
    committed.sort_unstable();
    assert_eq!(
        committed,
        every_count(&want),
        "{at}: the committed output holds each key's every count once"
    );
}

#[test]
fn partitions_added_while_running_are_read_exactly_once_at_parallelism_1() {
    check(1, 2);
}

#[test]
fn partitions_added_while_running_are_read_exactly_once_at_parallelism_2() {
    check(2, 3);
}

#[test]
fn partitions_added_while_running_are_read_exactly_once_at_parallelism_3() {
    check(3, 1);
}
