//! What the Kafka tests share: finding the broker (skip outside CI, fail
//! in CI), unique topic names, creating topics, and plain librdkafka
//! clients to write input and to read everything the sink wrote.
//!
//! The helpers talk to the broker directly with rdkafka, never through
//! snapflow, so a test checks the connector against what a third-party
//! reader sees.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use snapflow_tests::servers::{server_from_env, unique_name};

/// The variable that names the broker (`host:port`).
pub const BROKER_VAR: &str = "SNAPFLOW_KAFKA_BROKERS";

/// How long a helper waits for the broker before the test fails.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// The broker address in [`BROKER_VAR`]; see
/// [`snapflow_tests::servers::server_from_env`].
pub fn broker() -> Option<String> {
    server_from_env(BROKER_VAR, "Kafka", ".ci/kafka.sh")
}

/// A topic or job name no other test or run uses.
pub fn unique(what: &str) -> String {
    unique_name(what, '-')
}

/// Creates `topic` with `partitions` partitions and waits until its
/// metadata shows all of them.
pub fn create_topic(brokers: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("an admin client");
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let results =
        block_on(admin.create_topics(&[new], &AdminOptions::new())).expect("create_topics answers");
    for result in results {
        result.expect("the topic is created");
    }
    let consumer = consumer(brokers, "read_uncommitted");
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .expect("metadata");
        let found = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .map_or(0, |t| t.partitions().len());
        if found == partitions as usize {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "topic {topic} never showed {partitions} partitions"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs a future of the admin API to completion on this thread: the
/// admin client needs no runtime, only a poll loop, which rdkafka drives
/// on its own thread.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = Box::pin(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park_timeout(Duration::from_millis(100));
    }
}

/// A plain (non-transactional, idempotent) producer.
pub fn producer(brokers: &str) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .create()
        .expect("a producer")
}

/// Writes `(partition, key, value)` records and waits until the broker
/// acknowledged every one. The last record of each partition goes in a
/// batch of its own, after the others are acknowledged: tansu 0.6
/// answers a partition's latest offset with the last batch's first
/// offset plus one (see `kafka_probe.rs`), which is then the true end,
/// and the bounded source stops there.
pub fn produce(brokers: &str, topic: &str, records: &[(i32, Vec<u8>, Vec<u8>)]) {
    let producer = producer(brokers);
    let (heads, tails) = last_alone(records, |(partition, _, _)| *partition);
    send_all(&producer, topic, &heads);
    send_all(&producer, topic, &tails);
}

/// [`produce`] of `(partition, timestamp in ms, value)` records, each
/// with that record timestamp (`BaseRecord::timestamp`) and no key.
pub fn produce_timed(brokers: &str, topic: &str, records: &[(i32, i64, Vec<u8>)]) {
    let producer = producer(brokers);
    let (heads, tails) = last_alone(records, |(partition, _, _)| *partition);
    for part in [heads, tails] {
        send_each(&producer, &part, |(partition, timestamp_ms, value)| {
            BaseRecord::to(topic)
                .partition(*partition)
                .timestamp(*timestamp_ms)
                .payload(value.as_slice())
        });
    }
}

/// `records` split in two, keeping their order: all but the last of each
/// partition, and the last of each partition.
fn last_alone<R: Clone>(records: &[R], partition_of: impl Fn(&R) -> i32) -> (Vec<R>, Vec<R>) {
    let mut last = std::collections::BTreeMap::new();
    for (index, record) in records.iter().enumerate() {
        last.insert(partition_of(record), index);
    }
    let (tails, heads): (Vec<_>, Vec<_>) = records
        .iter()
        .enumerate()
        .partition(|(index, record)| last.get(&partition_of(record)) == Some(index));
    let strip = |rows: Vec<(usize, &R)>| rows.into_iter().map(|(_, r)| r.clone()).collect();
    (strip(heads), strip(tails))
}

/// [`produce`] with the producer's usual batching throughout.
pub fn produce_batched(brokers: &str, topic: &str, records: &[(i32, Vec<u8>, Vec<u8>)]) {
    send_all(&producer(brokers), topic, records);
}

fn send_all(producer: &BaseProducer, topic: &str, records: &[(i32, Vec<u8>, Vec<u8>)]) {
    send_each(producer, records, |(partition, key, value)| {
        BaseRecord::to(topic)
            .partition(*partition)
            .key(key.as_slice())
            .payload(value.as_slice())
    });
}

/// Sends the record `to_record` makes of each of `records`, serving
/// delivery reports while the local queue is full, and waits until the
/// broker acknowledged every one.
fn send_each<'a, R>(
    producer: &BaseProducer,
    records: &'a [R],
    to_record: impl Fn(&'a R) -> BaseRecord<'a, [u8], [u8]>,
) {
    for row in records {
        let mut record = to_record(row);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((error, back)) => {
                    // The local queue is full: serve delivery reports.
                    assert!(
                        matches!(
                            error.rdkafka_error_code(),
                            Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
                        ),
                        "produce failed: {error}"
                    );
                    record = back;
                    producer.poll(Duration::from_millis(10));
                }
            }
        }
    }
    producer
        .flush(TIMEOUT)
        .expect("every record is acknowledged");
}

/// A consumer without a group (partitions are assigned by hand) at the
/// given isolation level.
pub fn consumer(brokers: &str, isolation: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", unique("snapflow-test-reader"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        // The broker answers a fetch with nothing new only after this
        // long; the readers here stop on quiet, so it bounds their wait.
        .set("fetch.wait.max.ms", "100")
        .create()
        .expect("a consumer")
}

/// One record as a reader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// The partition it was read from.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its key.
    pub key: Vec<u8>,
    /// Its value.
    pub value: Vec<u8>,
    /// Its headers, as (name, value).
    pub headers: Vec<(String, Vec<u8>)>,
}

/// Every record of `topic` from its start, read at `isolation`: the
/// reader stops once nothing arrived for 0.7 s after a record (10 s before
/// the first), because tansu 0.6's
/// latest offsets are not record counts (see `kafka_probe.rs`).
pub fn read_all(brokers: &str, topic: &str, isolation: &str) -> Vec<Read> {
    read_until(
        brokers,
        topic,
        isolation,
        Duration::from_millis(700),
        |_| true,
    )
}

/// Every record of `topic` from its start, read at `isolation` until
/// `complete` holds for what was read and nothing more arrived for
/// `quiet_after`, or until [`READ_LIMIT`].
///
/// A reader that stops at the first quiet gap reads too little on a busy
/// broker (tansu under a dozen child processes sometimes answered no
/// fetch for seconds, and a test then saw every result missing), and the
/// broker's latest offsets cannot say how much there is (see
/// `kafka_probe.rs`). So a test that knows what must be there says so in
/// `complete`, and the reader waits for it, however slow the broker, up
/// to the limit; a run that really lost output fails after the limit.
pub fn read_until(
    brokers: &str,
    topic: &str,
    isolation: &str,
    quiet_after: Duration,
    complete: impl Fn(&[Read]) -> bool,
) -> Vec<Read> {
    let consumer = consumer(brokers, isolation);
    consumer
        .assign(&from_the_start(&consumer, topic))
        .expect("assign");
    let mut out = Vec::new();
    let deadline = Instant::now() + READ_LIMIT;
    let mut last_progress = Instant::now();
    // Under load tansu takes a while to answer the first fetch: the
    // reader waits longer for the first record than between records.
    let mut quiet = Duration::from_secs(10);
    while Instant::now() < deadline {
        let Some(message) = consumer.poll(Duration::from_millis(50)) else {
            if last_progress.elapsed() >= quiet && complete(&out) {
                break;
            }
            continue;
        };
        let message = message.expect("a record");
        last_progress = Instant::now();
        quiet = quiet_after;
        out.push(Read::of(&message));
    }
    out
}

/// The longest [`read_until`] waits for a topic's records.
pub const READ_LIMIT: Duration = Duration::from_secs(60);

/// Every partition of `topic` from offset 0 (no test deletes records). Waits until the
/// metadata lists the topic's partitions: an assignment of none would
/// read nothing and look like lost output.
fn from_the_start(consumer: &BaseConsumer, topic: &str) -> TopicPartitionList {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let metadata = consumer
            .fetch_metadata(Some(topic), TIMEOUT)
            .expect("metadata");
        let mut assignment = TopicPartitionList::new();
        for partition in metadata
            .topics()
            .iter()
            .filter(|t| t.name() == topic)
            .flat_map(|t| t.partitions())
        {
            assignment
                // Offset 0, not `Beginning`: tansu 0.6 answers "earliest"
                // with the batch it stored first in time, which under
                // concurrent writers is not the lowest (a reader once
                // missed a partition's first 32 records so).
                .add_partition_offset(topic, partition.id(), Offset::Offset(0))
                .expect("an assignment");
        }
        if assignment.count() > 0 {
            return assignment;
        }
        assert!(
            Instant::now() < deadline,
            "the metadata of {topic} lists no partition"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Read {
    fn of<M: Message>(message: &M) -> Read {
        let headers = message
            .headers()
            .map(|headers| {
                headers
                    .iter()
                    .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        Read {
            partition: message.partition(),
            offset: message.offset(),
            key: message.key().unwrap_or_default().to_vec(),
            value: message.payload().unwrap_or_default().to_vec(),
            headers,
        }
    }
}

/// The `snapflow-txn` header of a record the exactly-once sink wrote.
pub fn txn_header(read: &Read) -> Option<String> {
    read.headers
        .iter()
        .find(|(name, _)| name == snapflow::connectors::kafka::TXN_HEADER)
        .map(|(_, value)| String::from_utf8_lossy(value).into_owned())
}

/// Each `key:count` result (`snapflow_tests::kafka_count`) in `all` whose
/// transaction is in `committed`, with that transaction's header, sorted.
/// tansu shows aborted records to `read_committed` readers too (see
/// `kafka_probe.rs`), so the committed headers decide.
pub fn committed_results(
    all: &[Read],
    committed: &std::collections::BTreeSet<String>,
) -> Vec<((u64, u64), String)> {
    let mut got: Vec<((u64, u64), String)> = all
        .iter()
        .filter_map(|read| {
            let header = txn_header(read)?;
            committed.contains(&header).then_some((read, header))
        })
        .map(|(read, header)| {
            let text = String::from_utf8(read.value.clone()).expect("UTF-8 output");
            let (key, count) = text.split_once(':').expect("key:count");
            let result = (key.parse().expect("a key"), count.parse().expect("a count"));
            (result, header)
        })
        .collect();
    got.sort_unstable();
    got
}

/// How many of `want` (sorted) are not among `got` (sorted).
pub fn missing(want: &[(u64, u64)], got: &[((u64, u64), String)]) -> usize {
    want.iter()
        .filter(|item| {
            got.binary_search_by(|(result, _)| result.cmp(item))
                .is_err()
        })
        .count()
}

/// Everything in `topic` from its start, read until every result of
/// `want` (sorted) is among the committed ones and nothing more arrived
/// for `quiet_after`, or until [`READ_LIMIT`]: see [`read_until`].
///
/// It reads at `read_uncommitted`, with the committed headers as the
/// proof that a record committed (tansu 0.6 shows aborted records to
/// `read_committed` readers anyway: `kafka_probe.rs`). Why not
/// `read_committed`: after in-process failovers on a loaded machine,
/// tansu's last stable offset still sometimes stays behind a
/// transaction for good, although the sink's send gate and its
/// restore's fences (`connectors/kafka/gate.rs`, `unblock.rs`) ended
/// that in the SIGKILL runs (docs/design/kafka-connector.md, known gaps).
pub fn read_results(
    brokers: &str,
    topic: &str,
    committed: &std::collections::BTreeSet<String>,
    want: &[(u64, u64)],
    quiet_after: Duration,
) -> Vec<Read> {
    read_until(brokers, topic, "read_uncommitted", quiet_after, |all| {
        missing(want, &committed_results(all, committed)) == 0
    })
}

/// For a failure's message: where each result of `want` that is not
/// among the committed results of `all` is, as `(partition, offset,
/// header, committed)` of every record that holds it (none: the broker
/// does not serve it at all), and the committed headers.
pub fn locate_missing(
    all: &[Read],
    committed: &std::collections::BTreeSet<String>,
    want: &[(u64, u64)],
) -> String {
    let got = committed_results(all, committed);
    let mut text = String::new();
    for result in want {
        if got.binary_search_by(|(r, _)| r.cmp(result)).is_ok() {
            continue;
        }
        let value = format!("{}:{}", result.0, result.1);
        let found: Vec<_> = all
            .iter()
            .filter(|read| read.value == value.as_bytes())
            .map(|read| {
                let header = txn_header(read);
                let is_committed = header.as_ref().is_some_and(|h| committed.contains(h));
                (read.partition, read.offset, header, is_committed)
            })
            .collect();
        text.push_str(&format!("missing {result:?}: {found:?}\n"));
    }
    text.push_str(&format!("committed headers: {committed:?}\n"));
    text
}
