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
//! The marker is one committed offset, of partition 0 of the output
//! topic (Kafka does not check a committed offset against the log), in
//! the group `<prefix>-<subtask>-marker`: `checkpoint << 31 | span << 23
//! | nonce`. The committed transaction carried the pending transactions
//! of checkpoints `checkpoint - span` to `checkpoint` (one, but for a
//! restore that wrote several again in one transaction), and its records
//! carry the header `<id>#<nonce>`. No consumer ever reads the output
//! topic in this group. The offset metadata string would have been the
//! natural place for the second half, but the test broker (tansu 0.6)
//! drops it (`kafka_probe.rs`); one offset keeps it to one
//! `send_offsets_to_transaction` call per transaction. Hence the
//! packing, and its limits: checkpoint ids below 2^32, spans below 256,
//! 23-bit nonces (two attempts under one transactional id share a nonce
//! once in about 8 million).
//!
//! This module owns the group's name, the marker's encoding, and reading
//! it back. It never decides what to commit.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::{Offset, TopicPartitionList};

use super::error::KafkaError;
use super::sink::KafkaSinkConfig;
use super::{client_config, close_consumer};

/// The widest span of checkpoints one marker can name (8 bits).
pub(crate) const SPAN_MAX: u64 = 0xFF;

/// The nonces' bits (the low 23 of the offset).
pub(crate) const NONCE_MASK: u64 = (1 << 23) - 1;

/// The highest checkpoint id a marker can hold (32 bits).
pub(crate) const CHECKPOINT_MAX: u64 = u32::MAX as u64;

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
    topic: String,
    timeout: Duration,
}

impl MarkerGroup {
    /// The group `<subtask prefix>marker`, where the subtask prefix is `<transactional id prefix>-<subtask>-`.
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
            topic: config.topic.clone(),
            timeout: Duration::from_millis(config.request_timeout_ms),
        })
    }

    /// The group's metadata for `send_offsets_to_transaction` with the
    /// offsets that record `marker`.
    ///
    /// # Errors
    ///
    /// [`KafkaError::InvalidConfig`] for a span past [`SPAN_MAX`] or a
    /// checkpoint past [`CHECKPOINT_MAX`], or when librdkafka has no
    /// group metadata (it always has for a consumer with a group id),
    /// [`KafkaError::Client`] when it refuses the list.
    pub(crate) fn offsets(
        &self,
        marker: &Marker,
    ) -> Result<(ConsumerGroupMetadata, TopicPartitionList), KafkaError> {
        let span = marker.checkpoint_id.saturating_sub(marker.first);
        if span > SPAN_MAX
            || marker.first > marker.checkpoint_id
            || marker.checkpoint_id > CHECKPOINT_MAX
        {
            return Err(KafkaError::InvalidConfig {
                setting: "pending transactions",
                reason: format!(
                    "checkpoints {} to {} do not fit one commit marker (ids up to {CHECKPOINT_MAX}, \
                     at most {SPAN_MAX} apart)",
                    marker.first, marker.checkpoint_id
                ),
            });
        }
        let offset = (marker.checkpoint_id << 31) | (span << 23) | (marker.nonce & NONCE_MASK);
        Ok((metadata(&self.marker)?, self.list(offset)?))
    }

    fn list(&self, offset: u64) -> Result<TopicPartitionList, KafkaError> {
        let mut list = TopicPartitionList::new();
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        list.add_partition_offset(&self.topic, 0, Offset::Offset(offset))
            .map_err(|source| KafkaError::client("the marker's offset", source))?;
        Ok(list)
    }

    /// The marker the broker holds, or `None` when the group has
    /// committed nothing.
    ///
    /// # Errors
    ///
    /// [`KafkaError::Client`] (retryable when the broker is away) when
    /// the committed offsets cannot be read.
    pub(crate) fn read(&self) -> Result<Option<Marker>, KafkaError> {
        let Some(offset) = self.committed(&self.marker)? else {
            return Ok(None);
        };
        let checkpoint_id = offset >> 31;
        let span = (offset >> 23) & SPAN_MAX;
        Ok(Some(Marker {
            checkpoint_id,
            first: checkpoint_id.saturating_sub(span),
            nonce: offset & NONCE_MASK,
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

impl Drop for MarkerGroup {
    fn drop(&mut self) {
        // The marker client never joins its group (it only reads and
        // names it), so closing it has nothing to tell the broker.
        close_consumer(&self.marker, self.timeout.min(Duration::from_secs(1)));
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
