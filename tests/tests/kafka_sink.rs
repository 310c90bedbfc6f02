//! The exactly-once Kafka sink as a user meets it:
//!
//! - **Backpressure.** A broker of the test's own (`snapflow_tests::tansu`,
//!   memory storage) paused with `SIGSTOP` for longer than the sink's
//!   request time-out (which was librdkafka's message time-out before),
//!   or throttled (stopped and resumed in a cycle), slows the job down:
//!   the job neither fails nor restarts, and once the broker goes on it
//!   catches up, with every record committed once (each read back under
//!   the header of a committed transaction; at `read_uncommitted`, as the
//!   other Kafka tests, because tansu's last stable offset can stay
//!   behind).
//! - **The job's checkpoint interval.** The sink learns it from the job
//!   (`SinkFactory::open`); a transaction time-out not longer than it
//!   stops the job at its start with a typed, non-retryable error that
//!   says what to change.
//! - **Timestamps.** `KafkaOut::timestamp_ms`, and
//!   `KafkaSinkFactory::with_event_time` for records without one, are
//!   the timestamps a reader sees.
//!
//! Without `SNAPFLOW_KAFKA_BROKERS` and `SNAPFLOW_TANSU_BIN` (`eval
//! "$(.ci/kafka.sh start)"`) each test prints how to start the broker and
//! passes, except in CI, where it fails.

#[path = "kafka/support.rs"]
mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use snapflow::connectors::kafka::{
    Delivery, KafkaError, KafkaOut, KafkaSinkConfig, KafkaSinkFactory, TXN_HEADER,
};
use snapflow::job::{Job, JobConfig, JobError, RestartStrategy};
use snapflow::sink::{SinkContext, SinkError, SinkFactory};
use snapflow::source::VecSourceFactory;
use snapflow_tests::servers::server_from_env;
use snapflow_tests::tansu::{TansuBroker, TANSU_BIN_VAR};

use support::{broker, create_topic, unique};

/// The longest any wait here lasts.
const WAIT_LIMIT: Duration = Duration::from_secs(120);

/// One record as a reader sees it: partition, value, timestamp and
/// transaction header.
#[derive(Debug, Clone)]
struct Seen {
    value: String,
    timestamp_ms: Option<i64>,
    header: Option<String>,
}

/// Every record of `topic` (from offset 0 of each of its `partitions`)
/// at `isolation`, read until `count` are in or `limit`.
fn read(
    brokers: &str,
    topic: &str,
    partitions: i32,
    isolation: &str,
    count: usize,
    limit: Duration,
) -> Vec<Seen> {
    let consumer: BaseConsumer = support::consumer(brokers, isolation);
    let mut assignment = TopicPartitionList::new();
    for partition in 0..partitions {
        assignment
            .add_partition_offset(topic, partition, Offset::Offset(0))
            .expect("an assignment");
    }
    consumer.assign(&assignment).expect("assign");
    let started = Instant::now();
    let mut seen = Vec::new();
    while seen.len() < count && started.elapsed() < limit {
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = message.expect("a record");
        let header = message.headers().and_then(|headers| {
            headers
                .iter()
                .find(|header| header.key == TXN_HEADER)
                .and_then(|header| header.value)
                .map(|value| String::from_utf8_lossy(value).into_owned())
        });
        seen.push(Seen {
            value: String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned(),
            timestamp_ms: message.timestamp().to_millis(),
            header,
        });
    }
    seen
}

/// How a test takes the broker's speed away.
#[derive(Debug, Clone, Copy)]
enum Outage {
    /// `SIGSTOP` for this long, then `SIGCONT`.
    Paused { paused_ms: u64 },
    /// Stopped for `stopped_ms`, running for `running_ms`, in turn,
    /// until the job ends.
    Throttled { stopped_ms: u64, running_ms: u64 },
}

/// The records of the backpressure tests.
const RECORDS: u64 = 4_000;
/// The sink's request time-out: shorter than every stop of the broker.
/// On main it was also librdkafka's message time-out.
const REQUEST_TIMEOUT_MS: u64 = 1_500;

#[test]
fn a_broker_paused_longer_than_the_request_timeout_slows_the_job_without_a_restart() {
    check_backpressure(Outage::Paused { paused_ms: 8_000 });
}

#[test]
fn a_throttled_broker_slows_the_job_without_a_restart() {
    check_backpressure(Outage::Throttled {
        stopped_ms: 2_000,
        running_ms: 300,
    });
}

/// Runs 0..[`RECORDS`] through a slow map into the exactly-once sink on
/// a broker of its own, takes the broker's speed away (`outage`) once a
/// quarter is mapped, and checks that the job slowed down, did not
/// restart, and committed every record once.
fn check_backpressure(outage: Outage) {
    let Some(binary) = server_from_env(TANSU_BIN_VAR, "Kafka sink backpressure", ".ci/kafka.sh")
    else {
        return;
    };
    if let Ok(filter) = std::env::var("SNAPFLOW_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    }
    let broker = Arc::new(TansuBroker::start_in_memory(binary));
    let brokers = broker.address();
    let (output, job_name) = (unique("backpressure-out"), unique("backpressure-job"));
    create_topic(&brokers, &output, 2);

    let mut sink = KafkaSinkConfig::new(&brokers, &output, &job_name, "out");
    sink.request_timeout_ms = REQUEST_TIMEOUT_MS;
    // A small local queue, so that the sink finds it full while the
    // broker is stopped (librdkafka's default holds 100,000 records).
    sink.client_options = vec![("queue.buffering.max.messages".to_owned(), "200".to_owned())];
    let sink = KafkaSinkFactory::new(sink, encode).expect("the sink's checks pass");
    let log = sink.commit_log();
    let job = Job::new(
        &job_name,
        JobConfig {
            checkpoint_interval_ms: Some(200),
            default_parallelism: 2,
            batch_size_max: 16,
            window_batches: 4,
            arbiters: Some(2),
            // A restart would show in the report; a few, in case one
            // happens, so that the job still ends and the test says why.
            restart: RestartStrategy::FixedDelay {
                attempts_max: 3,
                delay_ms: 200,
            },
            ..JobConfig::default()
        },
    );
    let mapped = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&mapped);
    job.source("in", VecSourceFactory::new((0..RECORDS).collect()))
        .map("slow", move |id: u64| {
            thread::sleep(Duration::from_micros(1_000));
            counted.fetch_add(1, Ordering::Relaxed);
            id
        })
        .sink("out", sink);
    let started = Instant::now();
    let running = job.start().expect("the job starts");
    let (done_tx, done) = mpsc::channel();
    thread::spawn(move || {
        let _ = done_tx.send(running.wait());
    });
    while mapped.load(Ordering::Relaxed) < RECORDS / 4 {
        assert!(started.elapsed() < WAIT_LIMIT, "the job never got going");
        thread::sleep(Duration::from_millis(5));
    }
    let report = match outage {
        Outage::Paused { paused_ms } => {
            let before = mapped.load(Ordering::Relaxed);
            broker.pause();
            thread::sleep(Duration::from_millis(paused_ms));
            let during = mapped.load(Ordering::Relaxed) - before;
            broker.resume();
            eprintln!("{during} records mapped while the broker was stopped for {paused_ms} ms");
            // Backpressure: the map could not run to the end while the
            // sink waited for the broker. A subtask whose transaction is
            // pre-committed may take its whole share meanwhile (the send
            // gate holds up to `HELD_MAX` records in the sink while a
            // checkpoint waits for another subtask), but a subtask
            // waiting in its flush or commit takes nothing more.
            assert!(
                before + during < RECORDS,
                "the job did not slow down: all {RECORDS} records were mapped while the broker \
                 was stopped ({during} of them during the stop)"
            );
            done.recv_timeout(WAIT_LIMIT).expect("the job ends in time")
        }
        Outage::Throttled {
            stopped_ms,
            running_ms,
        } => {
            let ended = Arc::new(AtomicBool::new(false));
            let throttle = {
                let (broker, ended) = (Arc::clone(&broker), Arc::clone(&ended));
                thread::spawn(move || {
                    let mut cycles = 0;
                    while !ended.load(Ordering::Relaxed) {
                        broker.pause();
                        thread::sleep(Duration::from_millis(stopped_ms));
                        broker.resume();
                        thread::sleep(Duration::from_millis(running_ms));
                        cycles += 1;
                    }
                    cycles
                })
            };
            let report = done.recv_timeout(WAIT_LIMIT);
            ended.store(true, Ordering::Relaxed);
            let cycles = throttle.join().expect("the throttle thread ends");
            eprintln!("the broker was stopped {cycles} times for {stopped_ms} ms");
            assert!(cycles > 0, "the job ended before the broker was throttled");
            report.expect("the job ends in time")
        }
    };
    let report = report.expect("the job completes");
    eprintln!(
        "{outage:?}: the job took {} ms; restarts: {:?}",
        started.elapsed().as_millis(),
        report
            .restarts
            .iter()
            .map(|restart| restart.cause.clone())
            .collect::<Vec<_>>()
    );
    assert!(
        report.restarts.is_empty(),
        "the slow broker made the job restart: {:?}",
        report
            .restarts
            .iter()
            .map(|restart| restart.cause.clone())
            .collect::<Vec<_>>()
    );
    let committed: BTreeSet<String> = log.committed().into_iter().collect();
    // At `read_uncommitted`, with the committed headers as the proof of a
    // commit, as `support::read_results` and for its reason: tansu's last
    // stable offset sometimes stays behind for good (README, Kafka), and
    // a `read_committed` reader with it. How far a `read_committed`
    // reader gets is printed.
    let seen = read(
        &brokers,
        &output,
        2,
        "read_uncommitted",
        RECORDS as usize,
        WAIT_LIMIT,
    );
    let at_committed = read(
        &brokers,
        &output,
        2,
        "read_committed",
        RECORDS as usize,
        Duration::from_secs(10),
    );
    eprintln!(
        "read back: {} records at read_uncommitted, {} at read_committed",
        seen.len(),
        at_committed.len()
    );
    let uncommitted: Vec<&Seen> = seen
        .iter()
        .filter(|seen| !seen.header.as_ref().is_some_and(|h| committed.contains(h)))
        .collect();
    assert!(
        uncommitted.is_empty(),
        "records outside a committed transaction: {} (first {:?})",
        uncommitted.len(),
        uncommitted.first()
    );
    let mut values: Vec<u64> = seen
        .iter()
        .map(|seen| seen.value.parse().expect("a number"))
        .collect();
    values.sort_unstable();
    let want: Vec<u64> = (0..RECORDS).collect();
    assert_eq!(values.len(), want.len(), "records read back");
    assert!(
        values == want,
        "the committed output differs from the input"
    );
}

fn encode(id: &u64) -> KafkaOut {
    KafkaOut {
        key: None,
        value: id.to_string().into_bytes(),
        partition: Some((id % 2) as i32),
        timestamp_ms: None,
    }
}

/// A job whose checkpoint interval is `interval_ms` (or, with `None`,
/// that has none) with an exactly-once sink whose transactions time out
/// after `transaction_timeout_ms`, run to its end.
fn run_with_interval(
    brokers: &str,
    topic: &str,
    interval_ms: Option<u64>,
    transaction_timeout_ms: u64,
    delivery: Delivery,
) -> Result<(), JobError> {
    let name = unique("interval-job");
    let mut sink = KafkaSinkConfig::new(brokers, topic, &name, "out");
    sink.transaction_timeout_ms = transaction_timeout_ms;
    sink.delivery = delivery;
    let sink = KafkaSinkFactory::new(sink, encode).expect("the sink's checks pass");
    let job = Job::new(
        &name,
        JobConfig {
            checkpoint_interval_ms: interval_ms,
            ..JobConfig::default()
        },
    );
    job.source("in", VecSourceFactory::new((0..10).collect()))
        .sink("out", sink);
    job.run().map(|_| ())
}

#[test]
fn the_transaction_timeout_is_checked_against_the_jobs_checkpoint_interval() {
    let Some(brokers) = broker() else { return };
    let topic = unique("interval");
    create_topic(&brokers, &topic, 2);
    let error = run_with_interval(
        &brokers,
        &topic,
        Some(10_000),
        10_000,
        Delivery::ExactlyOnce,
    )
    .expect_err("a transaction time-out as long as the interval is refused");
    assert!(!error.is_retryable(), "{error}");
    let JobError::SinkConfig { sink, error } = &error else {
        panic!("not a sink's refusal: {error}");
    };
    assert_eq!(sink, "out");
    let SinkError::Connector(connector) = error else {
        panic!("not the connector's error: {error}");
    };
    assert!(!connector.is_retryable());
    assert!(
        matches!(
            connector.downcast_ref::<KafkaError>(),
            Some(KafkaError::TransactionTimeoutTooShort {
                transaction_timeout_ms: 10_000,
                checkpoint_interval_ms: 10_000,
            })
        ),
        "{connector}"
    );
    let message = error.to_string();
    for what in ["transaction_timeout_ms", "checkpoint_interval_ms"] {
        assert!(message.contains(what), "{message} does not name {what}");
    }
    // Longer than the interval; no periodic checkpoints (the one final
    // checkpoint of a short job); another guarantee: each runs.
    for (interval_ms, delivery) in [
        (Some(100), Delivery::ExactlyOnce),
        (None, Delivery::ExactlyOnce),
        (Some(10_000), Delivery::AtLeastOnce),
    ] {
        run_with_interval(&brokers, &topic, interval_ms, 10_000, delivery)
            .unwrap_or_else(|error| panic!("{interval_ms:?}, {delivery:?}: {error}"));
    }
    // The factory's own answer, as the job asks it.
    let mut sink = KafkaSinkConfig::new(&brokers, &topic, "job", "out");
    sink.transaction_timeout_ms = 5_000;
    let mut factory = KafkaSinkFactory::new(sink, encode).expect("the sink's checks pass");
    assert!(factory
        .open(&SinkContext::new("job", "out", Some(4_999)))
        .is_ok());
    assert!(factory
        .open(&SinkContext::new("job", "out", Some(5_000)))
        .is_err());
}

/// `(id, event time)`: the event times lie in 2023, far from now, so a
/// producer's own time stamp cannot pass for them.
fn events() -> Vec<(u64, u64)> {
    (0..40)
        .map(|id| (id, 1_700_000_000_000 + id * 1_000))
        .collect()
}

#[test]
fn records_carry_the_timestamp_given_or_their_event_time() {
    let Some(brokers) = broker() else { return };
    let (given, unset) = (unique("timestamps-given"), unique("timestamps-unset"));
    create_topic(&brokers, &given, 2);
    create_topic(&brokers, &unset, 1);
    let name = unique("timestamps-job");
    let job = Job::new(
        &name,
        JobConfig {
            checkpoint_interval_ms: Some(100),
            ..JobConfig::default()
        },
    );
    // Even ids set their timestamp; odd ones leave it to the event-time
    // function, which reads it 7 ms later so that the two are told apart.
    let with_event_time = KafkaSinkFactory::new(
        KafkaSinkConfig::new(&brokers, &given, &name, "given"),
        |&(id, at): &(u64, u64)| KafkaOut {
            timestamp_ms: (id % 2 == 0).then_some(at),
            partition: Some((id % 2) as i32),
            ..KafkaOut::new(id.to_string().into_bytes())
        },
    )
    .expect("the sink's checks pass")
    .with_event_time(|&(_, at): &(u64, u64)| at + 7);
    let without = KafkaSinkFactory::new(
        KafkaSinkConfig::new(&brokers, &unset, &name, "unset"),
        |&(id, _): &(u64, u64)| KafkaOut::new(id.to_string().into_bytes()),
    )
    .expect("the sink's checks pass");
    let stream = job.source("in", VecSourceFactory::new(events()));
    stream.clone().sink("given", with_event_time);
    stream.sink("unset", without);
    let started_ms = now_ms();
    job.run().expect("the job completes");
    // The job completed, so every transaction is committed; read at
    // `read_uncommitted`, as the other tests, past tansu's last stable
    // offset when it stays behind.

    let mut seen: Vec<(u64, Option<i64>)> =
        read(&brokers, &given, 2, "read_uncommitted", 40, WAIT_LIMIT)
            .into_iter()
            .map(|seen| (seen.value.parse().expect("an id"), seen.timestamp_ms))
            .collect();
    seen.sort_unstable();
    let want: Vec<(u64, Option<i64>)> = events()
        .into_iter()
        .map(|(id, at)| {
            let stamped = if id % 2 == 0 { at } else { at + 7 };
            (id, Some(stamped as i64))
        })
        .collect();
    assert_eq!(seen, want, "the timestamps read back");
    // Neither given nor read from the record: the producer's time.
    let unstamped = read(&brokers, &unset, 1, "read_uncommitted", 40, WAIT_LIMIT);
    assert_eq!(unstamped.len(), 40);
    for seen in unstamped {
        let at = seen.timestamp_ms.expect("a timestamp");
        assert!(
            at >= started_ms - 5_000 && at <= now_ms() + 5_000,
            "record {} has timestamp {at}, not the time it was sent",
            seen.value
        );
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64)
}
