//! One topic's partitions within a Kafka source subtask: a consumer
//! assigned by hand, a queue of its own for each partition, and reading
//! one partition's records into a batch.
//!
//! This module owns reading per partition, which lets the source return
//! every batch from a single partition so that the partition's own
//! watermark generator sees exactly its records (DESIGN.md §7). It never
//! decides which partitions a subtask owns, never decodes position bytes,
//! never decodes records (the caller's function does) and never blocks:
//! every queue is polled with a zero timeout.
//!
//! **Per-partition queues.** librdkafka fetches each partition into a
//! queue of its own and by default forwards all of them to the consumer's
//! one queue, where partitions interleave. Before a partition is
//! assigned, [`TopicReader::assign`] takes its queue out of that
//! forwarding (`rd_kafka_queue_get_partition` and a forward to nothing,
//! through rdkafka's `split_partition_queue`); librdkafka remembers that
//! the application set the forwarding, so the assignment's fetch start
//! does not forward it again. The queue is taken again after the
//! assignment, as rdkafka's documentation asks. The consumer's own queue
//! then carries only events (errors), and is served once per poll.
//!
//! **The bound.** snapflow buffers nothing here: a batch takes at most
//! `max_records` records from one queue. What waits in the queues is
//! librdkafka's prefetch, bounded per partition by its settings
//! `queued.min.messages` and `queued.max.messages.kbytes` (100,000
//! messages and 64 MiB by default; set them through
//! `KafkaSourceConfig::client_options`), as it was with one queue.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{BaseConsumer, Consumer, DefaultConsumerContext};
use rdkafka::error::KafkaError as ClientError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::bound::{self, Seen};
use super::error::{code_is_retryable, KafkaError};
use super::lag::PartitionKey;
use super::position::PartitionOffsets;
use crate::source::SplitId;

/// Events (errors, never records) taken from the consumer's own queue per
/// poll: it is served once per poll, so this bounds what one poll does
/// there; more wait for the next poll.
const MAIN_EVENTS_PER_POLL: usize = 16;

/// Events that are not records (end-of-partition, retryable errors,
/// leftovers of an earlier assignment, dropped bad records) one partition
/// read takes besides its records, so a queue full of them cannot hold a
/// poll; the rest wait for the next poll.
const OTHER_EVENTS_PER_READ: usize = 64;

/// What the caller's function made of one message.
pub(super) enum Taken {
    /// It appended a record.
    Record,
    /// It dropped the message (counted by the caller).
    Dropped,
    /// The message is bad and the job must fail with this reason; the
    /// partition's next offset stays at it.
    Bad(String),
}

/// What one read of a partition did.
#[derive(Debug, Default)]
pub(super) struct Read {
    /// Records the caller appended.
    pub(super) produced: usize,
    /// A bad record's offset and reason, after the records appended.
    pub(super) bad: Option<(i64, String)>,
}

/// A partition a subtask owns.
pub(super) struct OwnedPartition {
    /// Where it is.
    pub(super) offsets: PartitionOffsets,
    /// Its split id within the subtask, for its watermark generator.
    pub(super) split: SplitId,
    /// Its queue while it is assigned.
    queue: Option<PartitionQueue<DefaultConsumerContext>>,
    /// The high watermark the lag probe last got from the broker, as
    /// [`TopicReader::refresh_highs`] took it (`None` before any).
    high: Option<i64>,
    /// The consumer's own position then: past transaction markers, which
    /// are never delivered and so never move `offsets.next`.
    consumed: Option<i64>,
}

pub(super) use super::bound::done;

/// One topic's consumer within a subtask: one consumer per topic, so
/// that its events name partitions of one topic only.
pub(super) struct TopicReader {
    pub(super) topic: String,
    consumer: Arc<BaseConsumer>,
    pub(super) partitions: BTreeMap<i32, OwnedPartition>,
    /// Whether the consumer reads from `partitions`' next offsets; cleared
    /// by a seek, a new partition or a record on the consumer's own queue.
    assigned: bool,
    /// Bytes of the messages read (keys, values, headers), for the live
    /// metrics.
    pub(super) bytes_read: u64,
    /// Whether a partition's end already proved wrong (warned once per
    /// topic and subtask).
    warned_end: bool,
}

/// The bytes of one message as the source's metrics count them: key,
/// value and every header's name and value.
fn message_bytes(message: &BorrowedMessage<'_>) -> u64 {
    let key = message.key().map_or(0, <[u8]>::len);
    let value = message.payload().map_or(0, <[u8]>::len);
    let headers = message.headers().map_or(0, |headers| {
        headers
            .iter()
            .map(|header| header.key.len() + header.value.map_or(0, <[u8]>::len))
            .sum()
    });
    (key + value + headers) as u64
}

impl TopicReader {
    pub(super) fn new(topic: String, consumer: BaseConsumer) -> TopicReader {
        TopicReader {
            topic,
            consumer: Arc::new(consumer),
            partitions: BTreeMap::new(),
            assigned: false,
            bytes_read: 0,
            warned_end: false,
        }
    }

    /// Takes every owned partition's high watermark from `highs` (the lag
    /// probe's answers for reader `index`) and the consumer's own
    /// positions, which are local (no request), for the lag.
    pub(super) fn refresh_highs(&mut self, index: usize, highs: &BTreeMap<PartitionKey, i64>) {
        let positions = self.consumer.position().ok();
        for (&partition, owned) in &mut self.partitions {
            if let Some(&high) = highs.get(&(index, partition)).filter(|high| **high >= 0) {
                owned.high = Some(high);
            }
            owned.consumed = positions
                .as_ref()
                .and_then(|list| list.find_partition(&self.topic, partition))
                .and_then(|entry| match entry.offset() {
                    Offset::Offset(at) => Some(at),
                    _ => None,
                });
        }
    }

    /// The consumer, for the lag probe's thread.
    pub(super) fn shared_consumer(&self) -> Arc<BaseConsumer> {
        Arc::clone(&self.consumer)
    }

    /// Offsets of `owned` not read yet: up to its end when bounded, else
    /// up to the probe's high watermark (`None` before one is known), from
    /// its next offset or the consumer's position past markers.
    pub(super) fn pending(owned: &OwnedPartition) -> Option<u64> {
        let target = match owned.offsets.reads_on {
            true => owned.high,
            false => owned.offsets.end.or(owned.high),
        }?;
        let from = owned
            .consumed
            .filter(|&at| at <= target)
            .map_or(owned.offsets.next, |at| at.max(owned.offsets.next));
        Some(u64::try_from(target.saturating_sub(from)).unwrap_or(0))
    }

    pub(super) fn consumer(&self) -> &BaseConsumer {
        &self.consumer
    }

    /// Adds (or moves) an owned partition; it is read from `offsets.next`
    /// after the next assignment. A known partition keeps its split id.
    pub(super) fn place(&mut self, partition: i32, offsets: PartitionOffsets, split: SplitId) {
        self.partitions
            .entry(partition)
            .and_modify(|owned| owned.offsets = offsets)
            .or_insert(OwnedPartition {
                offsets,
                split,
                queue: None,
                high: None,
                consumed: None,
            });
        self.assigned = false;
    }

    /// The next poll assigns the partitions again from their offsets.
    pub(super) fn reassign(&mut self) {
        self.assigned = false;
    }

    pub(super) fn assigned(&self) -> bool {
        self.assigned
    }

    /// Whether every partition is done (a bounded source's end).
    pub(super) fn finished(&self) -> bool {
        self.partitions.values().all(|owned| done(&owned.offsets))
    }

    /// Assigns every partition not done at its next offset, each with a
    /// queue of its own (see the module documentation).
    pub(super) fn assign(&mut self) -> Result<(), KafkaError> {
        let mut list = TopicPartitionList::new();
        for (&partition, owned) in &mut self.partitions {
            owned.queue = None;
            if done(&owned.offsets) {
                continue;
            }
            owned.queue = Some(split_queue(&self.consumer, &self.topic, partition)?);
            list.add_partition_offset(&self.topic, partition, Offset::Offset(owned.offsets.next))
                .map_err(|source| KafkaError::client("assigning partitions", source))?;
        }
        self.consumer
            .assign(&list)
            .map_err(|source| KafkaError::client("assigning partitions", source))?;
        for (&partition, owned) in &mut self.partitions {
            if owned.queue.is_some() {
                owned.queue = Some(split_queue(&self.consumer, &self.topic, partition)?);
            }
        }
        self.assigned = true;
        Ok(())
    }

    /// Serves the consumer's own queue: errors, and in the case that
    /// should not happen (a record of a partition whose queue was not
    /// taken out in time) a new assignment from the partitions' offsets,
    /// so that the record is read again from its partition's queue rather
    /// than out of its order.
    pub(super) fn serve_events(&mut self) -> Result<(), KafkaError> {
        for _ in 0..MAIN_EVENTS_PER_POLL {
            let Some(result) = self.consumer.poll(Duration::ZERO) else {
                return Ok(());
            };
            match result {
                Ok(message) => {
                    tracing::warn!(
                        topic = %self.topic,
                        partition = message.partition(),
                        offset = message.offset(),
                        "a Kafka record came on the consumer's own queue; assigning again"
                    );
                    self.assigned = false;
                    return Ok(());
                }
                Err(ClientError::PartitionEOF(partition)) => {
                    if let Some(owned) = self.partitions.get_mut(&partition) {
                        at_end(&self.consumer, &self.topic, partition, &mut owned.offsets);
                        if done(&owned.offsets) {
                            self.assigned = false;
                        }
                    }
                }
                Err(error) => check_retryable(&self.topic, error)?,
            }
        }
        Ok(())
    }

    /// Reads up to `max_records` records of `partition` from its queue,
    /// handing each message at or after its next offset (and before its
    /// end) to `take`, and moves the next offset past it.
    ///
    /// # Errors
    ///
    /// A client error that retrying cannot fix.
    pub(super) fn read<F>(
        &mut self,
        partition: i32,
        max_records: usize,
        mut take: F,
    ) -> Result<Read, KafkaError>
    where
        F: FnMut(&BorrowedMessage<'_>) -> Taken,
    {
        let mut read = Read::default();
        let TopicReader {
            topic,
            consumer,
            partitions,
            assigned,
            bytes_read,
            warned_end,
        } = self;
        let Some(owned) = partitions.get_mut(&partition) else {
            return Ok(read);
        };
        let Some(queue) = owned.queue.as_ref() else {
            return Ok(read);
        };
        let place = &mut owned.offsets;
        if done(place) {
            // Records the fetcher queued before the partition is left
            // out at the next assignment are not read.
            return Ok(read);
        }
        let mut other_events = 0;
        while read.produced < max_records && other_events < OTHER_EVENTS_PER_READ {
            if bound::stop_before_last(place, read.produced, max_records) {
                break;
            }
            let Some(result) = queue.poll(Duration::ZERO) else {
                break;
            };
            let message = match result {
                Ok(message) => message,
                Err(ClientError::PartitionEOF(_)) => {
                    // A bounded partition whose last offsets are
                    // transaction markers (never delivered) ends when the
                    // consumer's own position passed its end, and one
                    // that reads on past a wrong end ends here.
                    at_end(consumer, topic, partition, place);
                    if done(place) {
                        *assigned = false;
                        break;
                    }
                    other_events += 1;
                    continue;
                }
                Err(error) => {
                    check_retryable(topic, error)?;
                    other_events += 1;
                    continue;
                }
            };
            let offset = message.offset();
            match bound::on_message(place, offset) {
                Seen::Take => {}
                Seen::TakeProvingEndWrong => warn_end_wrong(warned_end, topic, partition, offset),
                Seen::Leftover => {
                    // An earlier assignment's leftover.
                    other_events += 1;
                    continue;
                }
                Seen::PastDone => {
                    // The next assignment leaves the partition out, so
                    // its queue stops filling.
                    *assigned = false;
                    break;
                }
            }
            place.next = offset + 1;
            *bytes_read += message_bytes(&message);
            match take(&message) {
                Taken::Record => read.produced += 1,
                // Counted like the other events that are not records, so
                // a run of bad records cannot make one poll unbounded.
                Taken::Dropped => other_events += 1,
                Taken::Bad(reason) => {
                    // The position stays before the bad record, so a
                    // restore finds it again and fails again.
                    place.next = offset;
                    read.bad = Some((offset, reason));
                    break;
                }
            }
        }
        Ok(read)
    }
}

fn split_queue(
    consumer: &Arc<BaseConsumer>,
    topic: &str,
    partition: i32,
) -> Result<PartitionQueue<DefaultConsumerContext>, KafkaError> {
    consumer
        .split_partition_queue(topic, partition)
        .ok_or_else(|| KafkaError::InvalidConfig {
            setting: "topics",
            reason: format!("librdkafka gave no queue for partition {partition} of `{topic}`"),
        })
}

/// Passes a retryable client error (librdkafka reconnects by itself; a
/// lost broker that stays lost shows as no records) and returns the
/// others.
fn check_retryable(topic: &str, error: ClientError) -> Result<(), KafkaError> {
    if error.rdkafka_error_code().is_some_and(code_is_retryable) {
        tracing::warn!(%topic, %error, "Kafka consumer error");
        return Ok(());
    }
    Err(KafkaError::client("reading", error))
}

/// Warns, once per topic and subtask, that a bounded partition's end
/// proved wrong at `offset`.
fn warn_end_wrong(warned: &mut bool, topic: &str, partition: i32, offset: i64) {
    if std::mem::replace(warned, true) {
        return;
    }
    tracing::warn!(
        %topic,
        partition,
        offset,
        "a bounded Kafka source read a record at or past the end offset the broker gave \
         (tansu's latest offset counts batches, not records): it reads on until the broker \
         has nothing more (warned once per topic and subtask)"
    );
}

/// An end-of-partition event for `partition`: past trailing transaction
/// markers, and the end of a partition that reads on past a wrong end.
fn at_end(consumer: &BaseConsumer, topic: &str, partition: i32, place: &mut PartitionOffsets) {
    skip_markers(consumer, topic, partition, place);
    if place.reads_on {
        bound::at_broker_end(place, consumer_position(consumer, topic, partition));
    }
}

/// The consumer's own position in `partition` (local, no request).
fn consumer_position(consumer: &BaseConsumer, topic: &str, partition: i32) -> Option<i64> {
    let positions = consumer.position().ok()?;
    match positions.find_partition(topic, partition)?.offset() {
        Offset::Offset(at) => Some(at),
        _ => None,
    }
}

/// Moves a bounded partition's next offset up to the consumer's position
/// when that lies between it and the end: the offsets between were
/// control records (transaction markers).
fn skip_markers(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    place: &mut PartitionOffsets,
) {
    let Some(end) = place.end.filter(|_| !place.reads_on) else {
        return;
    };
    let Ok(positions) = consumer.position() else {
        return;
    };
    if let Some(Offset::Offset(at)) = positions
        .find_partition(topic, partition)
        .map(|entry| entry.offset())
    {
        if at > place.next && at <= end {
            place.next = at;
        }
    }
}
