//! Kafka (feature `kafka`): a partitioned, replayable source whose
//! position is the offset of every partition it owns, and a sink that is
//! exactly-once through Kafka transactions, one per subtask and
//! checkpoint interval.
//!
//! This module owns everything snapflow's source and sink contracts need
//! from a Kafka-protocol broker, through librdkafka (the `rdkafka`
//! crate, built from the C source it bundles). It never creates topics,
//! never commits offsets to a consumer group (the checkpoint holds the
//! offsets) and never retries by itself: a failure is an error whose
//! `is_retryable` says whether the job's restart strategy may try again.
//!
//! - [`KafkaSourceFactory`] / [`KafkaSource`]: see [`source`].
//! - [`KafkaSinkFactory`] / [`KafkaSink`]: see [`sink`].
//!
//! Both check at construction, before any record flows, that a broker
//! answers and that every topic exists ([`KafkaError::BrokerUnreachable`],
//! [`KafkaError::UnknownTopic`]).
//!
//! # Example
//!
//! Building the factories needs a broker, so this example only compiles.
//!
//! ```no_run
//! use snapflow::connectors::kafka::{
//!     Delivery, KafkaOut, KafkaSinkConfig, KafkaSinkFactory, KafkaSourceConfig,
//!     KafkaSourceFactory,
//! };
//! use snapflow::job::{Job, JobConfig};
//! use snapflow::Snapshot;
//!
//! #[derive(Snapshot, Default, Clone)]
//! struct Count {
//!     seen: u64,
//! }
//!
//! let source = KafkaSourceFactory::new(
//!     KafkaSourceConfig::new("127.0.0.1:9092", &["words"]),
//!     |record| {
//!         let value = record.value().ok_or("a record without a value")?;
//!         String::from_utf8(value.to_vec()).map_err(|error| error.to_string())
//!     },
//! )?;
//! let mut sink = KafkaSinkConfig::new("127.0.0.1:9092", "counts", "word-count", "out");
//! sink.delivery = Delivery::ExactlyOnce;
//! let sink = KafkaSinkFactory::new(sink, |(word, count): &(String, u64)| KafkaOut {
//!     key: Some(word.as_bytes().to_vec()),
//!     value: count.to_string().into_bytes(),
//!     partition: None,
//!     timestamp_ms: None,
//! })?;
//! let job = Job::new("word-count", JobConfig::default());
//! let (counts, _state) = job
//!     .source("words", source)
//!     .key_by(|word: &String| word.clone())
//!     .process_with_state("count", |word: &String, count: &mut Count, _, out| {
//!         count.seen += 1;
//!         out.emit((word.clone(), count.seen));
//!         Ok(())
//!     });
//! counts.sink("out", sink);
//! job.run()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bad;
mod bound;
mod error;
mod gate;
mod lag;
mod marker;
mod partition;
mod position;
mod recover;
mod registry;
pub mod sink;
// The position's and the sink state's layouts are compiled without this
// feature, for readers of stored checkpoints (`connectors::kafka_position`,
// `connectors::kafka_sink_state`).
use super::kafka_sink_state as sink_state;
pub mod source;
mod txn;
mod unblock;

pub use error::KafkaError;
pub use sink::{
    CommitLog, Delivery, KafkaOut, KafkaSink, KafkaSinkConfig, KafkaSinkFactory, TXN_HEADER,
};
pub use source::{
    BadRecords, DroppedRecords, KafkaRecord, KafkaSource, KafkaSourceConfig, KafkaSourceFactory,
    StartFrom, DISCOVERY_INTERVAL_DEFAULT_MS,
};

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::types::RDKafkaErrorCode;

/// The settings every client of the connector starts from.
pub(crate) fn client_config(brokers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        // librdkafka logs through its own callback to stderr; the
        // connector's errors carry what matters.
        .set("log_level", "3");
    config
}

/// Closes `consumer` so that dropping it does not wait: rdkafka 0.39's
/// drop of a consumer with a group id polls in slices of 100 ms that run
/// to their end, so every drop took 100 ms; this polls for 1 ms at a time
/// until librdkafka says it is closed, for at most `timeout`. A consumer
/// that is not closed by then is left to the drop.
pub(crate) fn close_consumer<C: ClientContext + ConsumerContext>(
    consumer: &BaseConsumer<C>,
    timeout: Duration,
) {
    if consumer.close_queue().is_err() {
        return;
    }
    let deadline = std::time::Instant::now() + timeout;
    while !consumer.closed() && std::time::Instant::now() < deadline {
        // Closing a consumer that never joined a group delivers no
        // messages; anything that does come is dropped with it.
        let _ = consumer.poll(Duration::from_millis(1));
    }
}

/// The partition count of each topic, asked of the broker through
/// `consumer`.
///
/// # Errors
///
/// [`KafkaError::InvalidConfig`] for an empty broker list,
/// [`KafkaError::BrokerUnreachable`] when no broker answers within
/// `timeout_ms`, [`KafkaError::UnknownTopic`] for a topic the broker does
/// not have.
pub(crate) fn partition_counts<C: ClientContext + ConsumerContext>(
    consumer: &BaseConsumer<C>,
    brokers: &str,
    topics: &[String],
    timeout_ms: u64,
) -> Result<BTreeMap<String, i32>, KafkaError> {
    if brokers.trim().is_empty() {
        return Err(KafkaError::InvalidConfig {
            setting: "brokers",
            reason: "no bootstrap server given".to_owned(),
        });
    }
    let mut counts = BTreeMap::new();
    for topic in topics {
        if topic.is_empty() {
            return Err(KafkaError::InvalidConfig {
                setting: "topic",
                reason: "an empty topic name".to_owned(),
            });
        }
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_millis(timeout_ms))
            .map_err(|error| match error.rdkafka_error_code() {
                Some(
                    RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic,
                ) => KafkaError::UnknownTopic {
                    topic: topic.clone(),
                    brokers: brokers.to_owned(),
                },
                _ => KafkaError::BrokerUnreachable {
                    brokers: brokers.to_owned(),
                    timeout_ms,
                    detail: error.to_string(),
                },
            })?;
        let found = metadata.topics().iter().find(|t| t.name() == topic);
        match found {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => {
                counts.insert(topic.clone(), t.partitions().len() as i32);
            }
            _ => {
                return Err(KafkaError::UnknownTopic {
                    topic: topic.clone(),
                    brokers: brokers.to_owned(),
                })
            }
        }
    }
    Ok(counts)
}
