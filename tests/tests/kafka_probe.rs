//! A probe of what the test broker does with transactions: one
//! transaction committed, one aborted, then the topic read at both
//! isolation levels. It asserts what the broker in `.ci/kafka.sh` did when
//! the connector was written (see ARCHITECTURE.md, Kafka connector), so
//! that a broker upgrade that changes it fails here, by name, before the
//! connector's own tests fail in confusing ways.

#[path = "kafka/support.rs"]
mod kafka_support;

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use kafka_support::{broker, create_topic, read_all, unique, TIMEOUT};

/// Sends one record to partition 0 of `topic` (into the open
/// transaction, if any).
fn send_one(producer: &BaseProducer, topic: &str, value: &str) {
    producer
        .send(BaseRecord::<(), _>::to(topic).partition(0).payload(value))
        .map_err(|(error, _)| error)
        .expect("send");
}

fn values(reads: &[kafka_support::Read]) -> Vec<String> {
    reads
        .iter()
        .map(|read| String::from_utf8_lossy(&read.value).into_owned())
        .collect()
}

#[test]
fn committed_and_aborted_transactions_as_each_isolation_level_reads_them() {
    let Some(brokers) = broker() else { return };
    let topic = unique("probe");
    create_topic(&brokers, &topic, 1);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("transactional.id", unique("probe-txn"))
        .create()
        .expect("a transactional producer");
    producer
        .init_transactions(TIMEOUT)
        .expect("init_transactions");
    for (value, commit) in [
        ("committed-1", true),
        ("aborted-1", false),
        ("committed-2", true),
    ] {
        producer.begin_transaction().expect("begin_transaction");
        producer
            .send(BaseRecord::<(), _>::to(&topic).partition(0).payload(value))
            .map_err(|(error, _)| error)
            .expect("send");
        producer.flush(TIMEOUT).expect("flush");
        if commit {
            producer
                .commit_transaction(TIMEOUT)
                .expect("commit_transaction");
        } else {
            producer
                .abort_transaction(TIMEOUT)
                .expect("abort_transaction");
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let uncommitted = values(&read_all(&brokers, &topic, "read_uncommitted"));
    let committed = values(&read_all(&brokers, &topic, "read_committed"));
    eprintln!("read_uncommitted: {uncommitted:?}");
    eprintln!("read_committed:   {committed:?}");
    assert_eq!(uncommitted, ["committed-1", "aborted-1", "committed-2"]);
    assert_eq!(committed, ["committed-1", "aborted-1", "committed-2"]);
}

/// The offsets the broker reports for a partition after 40 records written
/// in one batch: the records get offsets 0 to 39, but tansu 0.6 answers
/// the "latest offset" request with 1 (the last batch's base offset plus
/// one, it seems), where Kafka answers 40. The bounded source stops at
/// that offset, so the tests write their input one record per batch
/// (`support::produce` writes the last record of each partition in a batch
/// of its own, which makes the answer right).
#[test]
fn the_high_watermark_counts_every_record() {
    let Some(brokers) = broker() else { return };
    let topic = unique("probe-watermark");
    create_topic(&brokers, &topic, 1);
    let records: Vec<_> = (0..40u32)
        .map(|i| (0, Vec::new(), i.to_string().into_bytes()))
        .collect();
    kafka_support::produce_batched(&brokers, &topic, &records);
    let consumer = kafka_support::consumer(&brokers, "read_committed");
    use rdkafka::consumer::Consumer;
    let (low, high) = consumer
        .fetch_watermarks(&topic, 0, TIMEOUT)
        .expect("watermarks");
    eprintln!("watermarks after 40 records: low {low}, high {high}");
    let mut list = rdkafka::TopicPartitionList::new();
    list.add_partition_offset(&topic, 0, rdkafka::Offset::Beginning)
        .expect("list");
    consumer.assign(&list).expect("assign");
    let mut offsets = Vec::new();
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        if let Some(Ok(message)) = consumer.poll(Duration::from_millis(100)) {
            use rdkafka::message::Message;
            offsets.push(message.offset());
        }
    }
    eprintln!("offsets read: {offsets:?}");
    assert_eq!(offsets, (0..40).collect::<Vec<i64>>());
    assert_eq!(
        (low, high),
        (0, 1),
        "the broker's latest offset changed: if it is now 40, tansu fixed its high watermark; \
         update this probe, ARCHITECTURE.md and support::produce"
    );
}

/// What one transaction costs on this broker (printed, not asserted: speed
/// goals belong in benchmarks): creating a transactional producer and
/// `init_transactions`, one record, commit, and dropping the producer.
#[test]
fn the_cost_of_one_transaction() {
    let Some(brokers) = broker() else { return };
    let topic = unique("probe-cost");
    create_topic(&brokers, &topic, 1);
    for round in 0..3 {
        let started = std::time::Instant::now();
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("transactional.id", unique("probe-cost-txn"))
            .set("retry.backoff.ms", "5")
            .create()
            .expect("a transactional producer");
        producer
            .init_transactions(TIMEOUT)
            .expect("init_transactions");
        let init_ms = started.elapsed().as_millis();
        producer.begin_transaction().expect("begin");
        producer
            .send(BaseRecord::<(), _>::to(&topic).partition(0).payload("x"))
            .map_err(|(error, _)| error)
            .expect("send");
        producer.flush(TIMEOUT).expect("flush");
        let flush_ms = started.elapsed().as_millis() - init_ms;
        producer.commit_transaction(TIMEOUT).expect("commit");
        let commit_ms = started.elapsed().as_millis() - init_ms - flush_ms;
        drop(producer);
        let drop_ms = started.elapsed().as_millis() - init_ms - flush_ms - commit_ms;
        eprintln!("round {round}: init {init_ms} ms, flush {flush_ms} ms, commit {commit_ms} ms, drop {drop_ms} ms");
    }
}

/// Fencing: a second producer with the same transactional id initialises
/// while the first has a transaction open with a record flushed. On Kafka
/// the open transaction is aborted and the first producer is fenced (its
/// commit fails). The sink's restore relies on the first half (it fences
/// ids a dead incarnation may have left open); this records what tansu
/// does with both halves. What it showed with tansu 0.6: the first
/// producer's commit does not succeed (librdkafka times out waiting for
/// it), and the flushed record stays readable (aborted records are never
/// hidden there).
#[test]
fn a_second_producer_with_the_same_id_fences_the_first() {
    let Some(brokers) = broker() else { return };
    let topic = unique("probe-fence");
    create_topic(&brokers, &topic, 1);
    let id = unique("probe-fence-txn");
    let make = || -> BaseProducer {
        ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("transactional.id", &id)
            .create()
            .expect("a transactional producer")
    };
    let first = make();
    first.init_transactions(TIMEOUT).expect("init_transactions");
    first.begin_transaction().expect("begin");
    send_one(&first, &topic, "lingering");
    first.flush(TIMEOUT).expect("flush");
    let second = make();
    second
        .init_transactions(TIMEOUT)
        .expect("the second producer initialises");
    let fenced = first.commit_transaction(Duration::from_secs(2));
    eprintln!("the first producer's commit after the second initialised: {fenced:?}");
    assert!(
        fenced.is_err(),
        "the broker let a fenced producer commit: the sink's fencing on restore does not hold"
    );
    second.begin_transaction().expect("begin");
    send_one(&second, &topic, "after");
    second
        .commit_transaction(TIMEOUT)
        .expect("the second commits");
    let values = values(&read_all(&brokers, &topic, "read_committed"));
    eprintln!("read_committed after fencing: {values:?}");
    // tansu shows the aborted record too (see the first probe).
    assert_eq!(values, ["lingering", "after"]);
}
