//! The commit marker: inside every exactly-once transaction the sink
//! also commits an offset (Kafka's `TxnOffsetCommit`, librdkafka's
//! `send_offsets_to_transaction`) for a consumer group of its own, one
//! per sink subtask, so that the broker records *atomically with the
//! records* which checkpoint's transaction the subtask committed last.
//!
//! A restore in a new process reads it to learn whether a transaction
//! the dead process pre-committed was committed before the crash (the
//! marker reached its checkpoint) or not (the sink then writes the
//! records again from its state). This is what closes the gap that
//! librdkafka leaves: it cannot commit a transaction another producer
//! object opened, and offers no way to resume one by producer id and
//! epoch as Flink does with the Java client.
//!
//! The marker is two committed offsets, each of partition 0 of the
//! output topic (Kafka does not check a committed offset against the
//! log), in two groups of the subtask: `<prefix>-<subtask>-marker` holds
//! the checkpoint id of the last pending transaction the committed one
//! carried, and `<prefix>-<subtask>-origin` holds
//! `(checkpoint - first) << 48 | nonce`: the committed transaction
//! carried the pending transactions of checkpoints `first` to
//! `checkpoint` (one, but for a restore that wrote several again in one
//! transaction), and its records carry the header `<id>#<nonce>`. No
//! consumer ever reads the output topic in these groups. The offset
//! metadata string would have been the natural place for the second
//! half, but the test broker (tansu 0.6) drops it (`kafka_probe.rs`).
//!
//! This module owns the group's name, the marker's encoding, and reading
//! it back. It never decides what to commit.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::{Offset, TopicPartitionList};

use super::client_config;
use super::error::KafkaError;
use super::sink::KafkaSinkConfig;

/// The widest span of checkpoints one marker can name (16 bits).
pub(crate) const SPAN_MAX: u64 = 0xFFFF;

/// The nonces' bits (the low 47 of the origin offset, which stays
/// positive).
pub(crate) const NONCE_MASK: u64 = (1 << 47) - 1;

/// What one committed transaction recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Marker {
    /// The highest checkpoint whose pending transaction it carried.
    pub(crate) checkpoint_id: u64,
    /// The lowest one (equal to `checkpoint_id` but for a restore that
    /// wrote several pending transactions again in one).
    pub(crate) first: u64,
    /// The nonce in its records' header (`<id>#<nonce>`).
    pub(crate) nonce: u64,
}

/// Who committed a pending transaction, as a marker tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Committed {
    /// Not committed.
    No,
    /// Committed by the incarnation that pre-committed it, under the
    /// header the state lists.
    AsListed,
    /// Committed in the marker's own transaction, under `<id>#<nonce>`
    /// where `id` is the transactional id of the marker's checkpoint.
    ByMarker(u64),
}

impl Marker {
    /// Whether the transaction pre-committed at `checkpoint_id` was
    /// committed (commits go in checkpoint order), and by whom.
    pub(crate) fn covers(&self, checkpoint_id: u64) -> Committed {
        if checkpoint_id > self.checkpoint_id {
            Committed::No
        } else if checkpoint_id >= self.first {
            Committed::ByMarker(self.nonce)
        } else {
            Committed::AsListed
        }
    }
}

/// The consumer group that holds the marker of one sink subtask, with
/// the client that reads it and gives the group metadata transactions
/// need.
pub(crate) struct MarkerGroup {
    marker: BaseConsumer,
    origin: BaseConsumer,
    topic: String,
    timeout: Duration,
}

impl MarkerGroup {
    /// The groups `<subtask prefix>marker` and `<subtask prefix>origin`,
    /// where the subtask prefix is `<transactional id prefix>-<subtask>-`.
    ///
    /// # Errors
    ///
    /// [`KafkaError::Client`] when librdkafka refuses the settings.
    pub(crate) fn new(config: &KafkaSinkConfig, prefix: &str) -> Result<MarkerGroup, KafkaError> {
        let client = |group: String| -> Result<BaseConsumer, KafkaError> {
            client_config(&config.brokers)
                .set("group.id", group)
                .set("enable.auto.commit", "false")
                .create()
                .map_err(|source| KafkaError::client("creating the marker client", source))
        };
        Ok(MarkerGroup {
            marker: client(format!("{prefix}marker"))?,
            origin: client(format!("{prefix}origin"))?,
            topic: config.topic.clone(),
            timeout: Duration::from_millis(config.request_timeout_ms),
        })
    }

    /// The request time-out, in milliseconds.
    pub(crate) fn timeout_ms(&self) -> u64 {
        u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX)
    }

    /// The two groups' metadata for `send_offsets_to_transaction` with
    /// the offsets that record `marker`, marker group first.
    ///
    /// # Errors
    ///
    /// [`KafkaError::InvalidConfig`] for a span past [`SPAN_MAX`] or when
    /// librdkafka has no group metadata (it always has for a consumer
    /// with a group id), [`KafkaError::Client`] when it refuses a list.
    pub(crate) fn offsets(
        &self,
        marker: &Marker,
    ) -> Result<[(ConsumerGroupMetadata, TopicPartitionList); 2], KafkaError> {
        let span = marker.checkpoint_id.saturating_sub(marker.first);
        if span > SPAN_MAX || marker.first > marker.checkpoint_id {
            return Err(KafkaError::InvalidConfig {
                setting: "pending transactions",
                reason: format!(
                    "checkpoints {} to {} are too far apart for one commit marker",
                    marker.first, marker.checkpoint_id
                ),
            });
        }
        let origin = (span << 48) | (marker.nonce & NONCE_MASK);
        Ok([
            (metadata(&self.marker)?, self.list(marker.checkpoint_id)?),
            (metadata(&self.origin)?, self.list(origin)?),
        ])
    }

    fn list(&self, offset: u64) -> Result<TopicPartitionList, KafkaError> {
        let mut list = TopicPartitionList::new();
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        list.add_partition_offset(&self.topic, 0, Offset::Offset(offset))
            .map_err(|source| KafkaError::client("the marker's offset", source))?;
        Ok(list)
    }

    /// The marker the broker holds, or `None` when the groups have
    /// committed nothing.
    ///
    /// # Errors
    ///
    /// [`KafkaError::Client`] (retryable when the broker is away) when
    /// the committed offsets cannot be read.
    pub(crate) fn read(&self) -> Result<Option<Marker>, KafkaError> {
        let (Some(checkpoint_id), Some(origin)) =
            (self.committed(&self.marker)?, self.committed(&self.origin)?)
        else {
            return Ok(None);
        };
        let span = origin >> 48;
        Ok(Some(Marker {
            checkpoint_id,
            first: checkpoint_id.saturating_sub(span),
            nonce: origin & NONCE_MASK,
        }))
    }

    fn committed(&self, consumer: &BaseConsumer) -> Result<Option<u64>, KafkaError> {
        let mut list = TopicPartitionList::new();
        list.add_partition(&self.topic, 0);
        let committed = consumer
            .committed_offsets(list, self.timeout)
            .map_err(|source| KafkaError::client("reading the commit marker", source))?;
        let offset = committed
            .find_partition(&self.topic, 0)
            .map(|element| element.offset());
        Ok(match offset {
            Some(Offset::Offset(offset)) => u64::try_from(offset).ok(),
            _ => None,
        })
    }
}

fn metadata(consumer: &BaseConsumer) -> Result<ConsumerGroupMetadata, KafkaError> {
    consumer
        .group_metadata()
        .ok_or_else(|| KafkaError::InvalidConfig {
            setting: "group.id",
            reason: "librdkafka gave no group metadata for a marker group".to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_covers_what_it_committed() {
        let marker = Marker {
            checkpoint_id: 9,
            first: 7,
            nonce: 5,
        };
        assert_eq!(marker.covers(10), Committed::No);
        assert_eq!(marker.covers(9), Committed::ByMarker(5));
        assert_eq!(marker.covers(7), Committed::ByMarker(5));
        assert_eq!(marker.covers(6), Committed::AsListed);
    }
}
