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
    producer.init_transactions(TIMEOUT).expect("init_transactions");
    for (value, commit) in [("committed-1", true), ("aborted-1", false), ("committed-2", true)] {
        producer.begin_transaction().expect("begin_transaction");
        producer
            .send(BaseRecord::<(), _>::to(&topic).partition(0).payload(value))
            .map_err(|(error, _)| error)
            .expect("send");
        producer.flush(TIMEOUT).expect("flush");
        if commit {
            producer.commit_transaction(TIMEOUT).expect("commit_transaction");
        } else {
            producer.abort_transaction(TIMEOUT).expect("abort_transaction");
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
