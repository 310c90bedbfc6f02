//! The Kafka connector's typed errors and how each one maps onto the
//! framework's [`SourceError`] and [`SinkError`], keeping whether a retry
//! can help.
//!
//! This module owns the classification of librdkafka's error codes into
//! "retrying can fix it" (a broker away, a time-out, a coordinator
//! moving) and "it cannot" (a missing topic, a bad setting, a fenced
//! producer). It never retries anything itself.

use rdkafka::error::KafkaError as ClientError;
use rdkafka::types::RDKafkaErrorCode;

use crate::sink::{ConnectorError, SinkError};
use crate::source::SourceError;

/// Why the Kafka source or sink could not start or went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaError {
    /// A configuration value the connector refuses before any record
    /// flows.
    #[error("invalid Kafka connector setting `{setting}`: {reason}")]
    InvalidConfig {
        /// The setting.
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// No broker answered at start within the time-out.
    #[error("no Kafka broker at `{brokers}` answered within {timeout_ms} ms: {detail}")]
    BrokerUnreachable {
        /// The bootstrap servers tried.
        brokers: String,
        /// How long the connector waited.
        timeout_ms: u64,
        /// librdkafka's message.
        detail: String,
    },
    /// A topic the broker does not have (the connector never creates
    /// topics: partition counts are the user's choice).
    #[error("Kafka topic `{topic}` does not exist on `{brokers}`")]
    UnknownTopic {
        /// The topic.
        topic: String,
        /// The bootstrap servers asked.
        brokers: String,
    },
    /// The producer's transaction time-out is not longer than the
    /// checkpoint interval: the broker would abort every transaction
    /// before its checkpoint could commit it.
    #[error(
        "the Kafka transaction timeout ({transaction_timeout_ms} ms) must be longer than the \
         job's checkpoint interval ({checkpoint_interval_ms} ms), or the broker aborts every \
         transaction before its checkpoint completes: raise \
         `KafkaSinkConfig::transaction_timeout_ms` (to at least twice the interval; the \
         broker's `transaction.max.timeout.ms` caps it, 15 minutes by default) or shorten \
         `JobConfig::checkpoint_interval_ms`"
    )]
    TransactionTimeoutTooShort {
        /// The configured transaction time-out.
        transaction_timeout_ms: u64,
        /// The job's checkpoint interval.
        checkpoint_interval_ms: u64,
    },
    /// A record's timestamp that Kafka cannot hold (past `i64::MAX`
    /// milliseconds).
    #[error(
        "a Kafka record's timestamp of {timestamp_ms} ms since the epoch is past what Kafka \
         holds (i64::MAX ms); check what the sink's serializer or event-time function returns"
    )]
    BadTimestamp {
        /// The timestamp given.
        timestamp_ms: u64,
    },
    /// A user deserialiser rejected a record and the source is set to
    /// fail on bad records.
    #[error(
        "record at {topic}/{partition}@{offset} does not decode: {reason} (the source fails on \
         such records; set `KafkaSourceConfig::bad_records` to `BadRecords::Drop` to skip them, \
         logged and counted)"
    )]
    BadRecord {
        /// The record's topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// Its offset.
        offset: i64,
        /// The deserialiser's message.
        reason: String,
    },
    /// A position or sink state this connector did not write.
    #[error("malformed Kafka connector state: {reason}")]
    MalformedState {
        /// What is wrong with the bytes.
        reason: String,
    },
    /// A call to librdkafka failed.
    #[error("Kafka {operation} failed: {source}")]
    Client {
        /// What the connector was doing.
        operation: &'static str,
        /// librdkafka's error.
        #[source]
        source: ClientError,
    },
    /// Records the producer could not deliver (reported by its delivery
    /// callback).
    #[error("Kafka could not deliver {failed} record(s); first error: {first}")]
    Delivery {
        /// How many failed since the last check.
        failed: u64,
        /// The first failure's message.
        first: String,
        /// Whether the first failure is one a retry can fix.
        retryable: bool,
    },
}

impl KafkaError {
    /// A [`KafkaError::Client`] for `operation`.
    pub(crate) fn client(operation: &'static str, source: ClientError) -> KafkaError {
        KafkaError::Client { operation, source }
    }

    /// Whether trying again (a restart of the job) may succeed: a broker
    /// that is away, a time-out or a coordinator that moved can come
    /// back; a bad setting, a missing topic, a bad record or a fenced
    /// producer cannot.
    pub fn is_retryable(&self) -> bool {
        match self {
            KafkaError::BrokerUnreachable { .. } => true,
            KafkaError::Client { source, .. } => client_error_is_retryable(source),
            KafkaError::Delivery { retryable, .. } => *retryable,
            KafkaError::InvalidConfig { .. }
            | KafkaError::UnknownTopic { .. }
            | KafkaError::TransactionTimeoutTooShort { .. }
            | KafkaError::BadTimestamp { .. }
            | KafkaError::BadRecord { .. }
            | KafkaError::MalformedState { .. } => false,
        }
    }

    /// The framework's sink error for this one, keeping its message,
    /// whether it is retryable, and itself (reach it with
    /// [`ConnectorError::downcast_ref`]).
    pub(crate) fn into_sink_error(self) -> SinkError {
        let retryable = self.is_retryable();
        SinkError::Connector(ConnectorError::new(self, retryable))
    }

    /// The framework's source error for this one.
    pub(crate) fn into_source_error(self) -> SourceError {
        SourceError::Custom {
            retryable: self.is_retryable(),
            message: self.to_string(),
        }
    }
}

impl From<KafkaError> for SinkError {
    fn from(error: KafkaError) -> SinkError {
        error.into_sink_error()
    }
}

impl From<KafkaError> for SourceError {
    fn from(error: KafkaError) -> SourceError {
        error.into_source_error()
    }
}

/// Whether a librdkafka error code names a passing condition.
pub(crate) fn code_is_retryable(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as Code;
    matches!(
        code,
        Code::BrokerTransportFailure
            | Code::AllBrokersDown
            | Code::MessageTimedOut
            | Code::OperationTimedOut
            | Code::RequestTimedOut
            | Code::NetworkException
            | Code::Resolve
            | Code::TimedOutQueue
            | Code::QueueFull
            | Code::NotCoordinator
            | Code::CoordinatorNotAvailable
            | Code::CoordinatorLoadInProgress
            | Code::NotLeaderForPartition
            | Code::LeaderNotAvailable
            | Code::NotEnoughReplicas
            | Code::NotEnoughReplicasAfterAppend
            | Code::ConcurrentTransactions
            | Code::BrokerNotAvailable
    )
}

fn client_error_is_retryable(error: &ClientError) -> bool {
    match error {
        // The transactional API says itself whether the call may be
        // repeated; a fatal error (a fenced producer) never is, and one
        // that needs an abort means the job must restart from its last
        // checkpoint, which a retry does.
        ClientError::Transaction(inner) => {
            !inner.is_fatal() && (inner.is_retriable() || inner.txn_requires_abort())
        }
        other => other.rdkafka_error_code().is_some_and(code_is_retryable),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_mistakes_are_not_retryable_and_a_lost_broker_is() {
        let short = KafkaError::TransactionTimeoutTooShort {
            transaction_timeout_ms: 1_000,
            checkpoint_interval_ms: 5_000,
        };
        assert!(!short.is_retryable());
        assert!(!short.into_sink_error().is_retryable());
        let away = KafkaError::client(
            "flush",
            ClientError::Flush(RDKafkaErrorCode::AllBrokersDown),
        );
        assert!(away.is_retryable());
        assert!(away.into_sink_error().is_retryable());
        let missing = KafkaError::client(
            "metadata",
            ClientError::MetadataFetch(RDKafkaErrorCode::UnknownTopicOrPartition),
        );
        assert!(!missing.is_retryable());
    }
}
