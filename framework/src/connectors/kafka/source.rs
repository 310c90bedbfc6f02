//! The Kafka source: a topic's partitions are the splits, spread over the
//! source subtasks by a stable rule, each partition's next offset is the
//! position in the snapshot, and a restore (at any parallelism) seeks to
//! the stored offsets.
//!
//! This module owns reading partitions with librdkafka's consumer
//! assigned by hand (no consumer group: the checkpoint, not the broker,
//! holds the truth about offsets, and nothing is committed to the
//! broker), decoding records through the user's function, and the
//! optional bound at the offsets a partition had when first read. It
//! never blocks waiting for records (a poll with nothing ready says
//! [`SourcePoll::Idle`]) and never creates topics.
//!
//! **Which subtask reads a partition.** Partition `p` of topic `t` goes
//! to subtask `(crc32(t) + p) mod parallelism` (Flink's rule with a
//! stable hash): partitions of one topic are spread round-robin, and a
//! partition added later never moves an existing one, so discovery
//! needs no coordination. A subtask that owns no partition stays
//! [`SourcePoll::Idle`] (unbounded) or ends at once (bounded).
//!
//! **Rescale.** Each subtask's position lists the partitions it owns. A
//! restore at another parallelism gives every new subtask the union of
//! the old positions ([`SourceFactory::rescale_positions`]); each keeps
//! the partitions it owns under the new parallelism. A partition that is
//! in no position (created after the checkpoint) starts at its earliest
//! offset, so no record of it is skipped.
//!
//! **Idleness and event time.** The source has no watermark logic of its
//! own: give the stream a [`WatermarkStrategy`](crate::time::WatermarkStrategy)
//! whose timestamp function reads the record's timestamp (the
//! deserialiser gets [`KafkaRecord::timestamp_ms`]). A subtask with no
//! partition left to read reports no split
//! ([`Source::current_splits`]) and is idle at once; with
//! `with_idleness(ms)` one whose partitions bring nothing new is marked
//! idle after `ms` of quiet polls. Not done: a watermark per partition
//! merged in the subtask: all of a subtask's partitions share one
//! generator (split 0), so one slow partition holds the subtask's
//! watermark back only through the generator's bound.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError as ClientError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::error::{code_is_retryable, KafkaError};
use super::position::{self, Offsets, PartitionOffsets};
use super::{client_config, close_consumer, partition_counts};
use crate::source::{
    check_split, Source, SourceError, SourceFactory, SourcePoll, SourcePosition, SplitId,
};

/// Where a partition without a stored offset starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    /// At its first retained record.
    Earliest,
    /// After its last record at the time the subtask first reads it.
    Latest,
    /// At the first record whose timestamp is at or after this many
    /// milliseconds since the Unix epoch (at the end when there is none).
    TimestampMs(i64),
}

/// What the source does with a record the deserialiser rejects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadRecords {
    /// Count it ([`DroppedRecords`]) and go on.
    Drop,
    /// Fail the job with [`KafkaError::BadRecord`] (not retryable: the
    /// record is still there after a restart).
    Fail,
}

/// The Kafka source's settings.
#[derive(Debug, Clone)]
pub struct KafkaSourceConfig {
    /// The bootstrap servers, `host:port[,host:port...]`.
    pub brokers: String,
    /// The topics to read; each must exist.
    pub topics: Vec<String>,
    /// Where a partition without a stored offset starts.
    pub start: StartFrom,
    /// Whether to stop at the end offsets the partitions had when the
    /// job first read them (they are stored with the position, so a
    /// restore stops at the same place); `false` reads forever.
    pub bounded: bool,
    /// What to do with records the deserialiser rejects.
    pub bad_records: BadRecords,
    /// How often an unbounded source asks the broker for new partitions;
    /// `None` turns discovery off. Bounded sources never discover.
    pub discovery_interval_ms: Option<u64>,
    /// How long a metadata or offset request may take before it fails
    /// (retryably).
    pub request_timeout_ms: u64,
    /// Further librdkafka consumer settings, applied last (for example
    /// `fetch.max.bytes`). `isolation.level` is `read_committed` unless
    /// set here.
    pub client_options: Vec<(String, String)>,
}

impl KafkaSourceConfig {
    /// A source over `topics` from their earliest records, unbounded,
    /// failing on bad records, discovering partitions every 10 s.
    pub fn new(brokers: &str, topics: &[&str]) -> KafkaSourceConfig {
        KafkaSourceConfig {
            brokers: brokers.to_owned(),
            topics: topics.iter().map(|topic| (*topic).to_owned()).collect(),
            start: StartFrom::Earliest,
            bounded: false,
            bad_records: BadRecords::Fail,
            discovery_interval_ms: Some(10_000),
            request_timeout_ms: 10_000,
            client_options: Vec::new(),
        }
    }
}

/// One record as the deserialiser sees it.
pub struct KafkaRecord<'a> {
    message: &'a BorrowedMessage<'a>,
}

impl<'a> KafkaRecord<'a> {
    /// The topic.
    pub fn topic(&self) -> &str {
        self.message.topic()
    }

    /// The partition.
    pub fn partition(&self) -> i32 {
        self.message.partition()
    }

    /// The offset.
    pub fn offset(&self) -> i64 {
        self.message.offset()
    }

    /// The key, if any.
    pub fn key(&self) -> Option<&[u8]> {
        self.message.key()
    }

    /// The value (payload), if any.
    pub fn value(&self) -> Option<&[u8]> {
        self.message.payload()
    }

    /// The record's timestamp in milliseconds since the Unix epoch (create
    /// or log-append time, as the topic says), if it has one.
    pub fn timestamp_ms(&self) -> Option<i64> {
        self.message.timestamp().to_millis()
    }

    /// The value of the first header called `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        let headers = self.message.headers()?;
        headers
            .iter()
            .find(|header| header.key == name)
            .and_then(|header| header.value)
    }
}

impl fmt::Debug for KafkaRecord<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaRecord")
            .field("topic", &self.topic())
            .field("partition", &self.partition())
            .field("offset", &self.offset())
            .finish()
    }
}

/// The number of records the deserialiser rejected and
/// [`BadRecords::Drop`] dropped, over every subtask and restart of the
/// factory's job. Clones share the count.
#[derive(Debug, Clone, Default)]
pub struct DroppedRecords(Arc<AtomicU64>);

impl DroppedRecords {
    /// Records dropped so far. A restore re-reads records after its
    /// checkpoint, so a bad record in that stretch is counted again.
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Builds the Kafka source of each subtask. See the
/// [module documentation](self).
pub struct KafkaSourceFactory<D> {
    config: Arc<KafkaSourceConfig>,
    deserialize: Arc<D>,
    dropped: DroppedRecords,
}

impl<T, D> KafkaSourceFactory<D>
where
    D: Fn(&KafkaRecord<'_>) -> Result<T, String> + Send + Sync + 'static,
{
    /// A factory reading `config.topics` through `deserialize`; it checks
    /// now that the broker answers and every topic exists.
    ///
    /// # Errors
    ///
    /// [`KafkaError::InvalidConfig`] for no topics or an empty broker
    /// list, [`KafkaError::BrokerUnreachable`] when no broker answers in
    /// `request_timeout_ms`, [`KafkaError::UnknownTopic`].
    pub fn new(config: KafkaSourceConfig, deserialize: D) -> Result<Self, KafkaError> {
        if config.topics.is_empty() {
            return Err(KafkaError::InvalidConfig {
                setting: "topics",
                reason: "a source needs at least one topic".to_owned(),
            });
        }
        let consumer = consumer(&config)?;
        partition_counts(
            &consumer,
            &config.brokers,
            &config.topics,
            config.request_timeout_ms,
        )?;
        Ok(KafkaSourceFactory {
            config: Arc::new(config),
            deserialize: Arc::new(deserialize),
            dropped: DroppedRecords::default(),
        })
    }

    /// The count of dropped bad records.
    pub fn dropped(&self) -> DroppedRecords {
        self.dropped.clone()
    }
}

/// The subtask that reads `partition` of `topic` at `parallelism`.
pub fn owner(topic: &str, partition: i32, parallelism: usize) -> usize {
    let start = crc32fast::hash(topic.as_bytes()) as usize;
    start.wrapping_add(partition.max(0) as usize) % parallelism.max(1)
}

fn consumer(config: &KafkaSourceConfig) -> Result<BaseConsumer, KafkaError> {
    let mut client = client_config(&config.brokers);
    // No group is joined (partitions are assigned by hand); librdkafka
    // still wants an id, and nothing is ever committed under it.
    client
        .set("group.id", "snapflow-source")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed");
    for (key, value) in &config.client_options {
        client.set(key, value);
    }
    client
        .create()
        .map_err(|source| KafkaError::client("creating a consumer", source))
}

impl<T, D> SourceFactory for KafkaSourceFactory<D>
where
    D: Fn(&KafkaRecord<'_>) -> Result<T, String> + Send + Sync + 'static,
{
    type Source = KafkaSource<D>;

    fn split(&self, subtask: usize, parallelism: usize) -> Result<Self::Source, SourceError> {
        check_split(subtask, parallelism)?;
        let mut readers = Vec::with_capacity(self.config.topics.len());
        for topic in &self.config.topics {
            readers.push(TopicReader {
                topic: topic.clone(),
                consumer: consumer(&self.config)?,
                partitions: BTreeMap::new(),
                assigned: false,
            });
        }
        let mut source = KafkaSource {
            config: Arc::clone(&self.config),
            deserialize: Arc::clone(&self.deserialize),
            dropped: self.dropped.clone(),
            subtask,
            parallelism,
            readers,
            next_reader: 0,
            last_discovery: Instant::now(),
            failed: None,
        };
        source.discover(self.config.start)?;
        Ok(source)
    }

    fn rescales(&self) -> bool {
        true
    }

    fn rescale_positions(
        &self,
        positions: &[SourcePosition],
        parallelism: usize,
    ) -> Result<Vec<SourcePosition>, String> {
        let merged = position::merge(positions)?;
        Ok(vec![merged; parallelism])
    }
}

/// One topic's consumer within a subtask: one consumer per topic, because
/// librdkafka's end-of-partition event names the partition but (through
/// rdkafka) not the topic.
struct TopicReader {
    topic: String,
    consumer: BaseConsumer,
    partitions: BTreeMap<i32, PartitionOffsets>,
    /// Whether the consumer reads from `partitions`' next offsets; cleared
    /// by a seek or a new partition.
    assigned: bool,
}

impl TopicReader {
    fn done(place: &PartitionOffsets) -> bool {
        place.end.is_some_and(|end| place.next >= end)
    }

    fn assign(&mut self) -> Result<(), KafkaError> {
        let mut list = TopicPartitionList::new();
        for (&partition, place) in &self.partitions {
            if !Self::done(place) {
                list.add_partition_offset(&self.topic, partition, Offset::Offset(place.next))
                    .map_err(|source| KafkaError::client("assigning partitions", source))?;
            }
        }
        self.consumer
            .assign(&list)
            .map_err(|source| KafkaError::client("assigning partitions", source))?;
        self.assigned = true;
        Ok(())
    }

    /// Moves a bounded partition's next offset up to the consumer's
    /// position when that lies between it and the end: the offsets
    /// between were control records (transaction markers).
    fn skip_markers(&mut self, partition: i32) {
        let Some(place) = self.partitions.get_mut(&partition) else {
            return;
        };
        let Some(end) = place.end else {
            return;
        };
        let Ok(positions) = self.consumer.position() else {
            return;
        };
        if let Some(Offset::Offset(at)) = positions
            .find_partition(&self.topic, partition)
            .map(|entry| entry.offset())
        {
            if at > place.next && at <= end {
                place.next = at;
            }
        }
    }

    fn finished(&self) -> bool {
        self.partitions.values().all(Self::done)
    }
}

/// The source of one subtask. See the [module documentation](self).
pub struct KafkaSource<D> {
    config: Arc<KafkaSourceConfig>,
    deserialize: Arc<D>,
    dropped: DroppedRecords,
    subtask: usize,
    parallelism: usize,
    readers: Vec<TopicReader>,
    /// The reader the next poll starts with, so one busy topic cannot
    /// starve the others.
    next_reader: usize,
    last_discovery: Instant,
    /// A bad record found while filling a batch, returned by the next
    /// poll (the records before it are delivered first).
    failed: Option<KafkaError>,
}

impl<D> KafkaSource<D> {
    /// Adds the partitions this subtask owns and does not know yet,
    /// starting at `start`.
    fn discover(&mut self, start: StartFrom) -> Result<(), KafkaError> {
        let timeout = Duration::from_millis(self.config.request_timeout_ms);
        for reader in &mut self.readers {
            let counts = partition_counts(
                &reader.consumer,
                &self.config.brokers,
                std::slice::from_ref(&reader.topic),
                self.config.request_timeout_ms,
            )?;
            let count = counts.get(&reader.topic).copied().unwrap_or(0);
            for partition in 0..count {
                if owner(&reader.topic, partition, self.parallelism) != self.subtask
                    || reader.partitions.contains_key(&partition)
                {
                    continue;
                }
                let (low, high) = reader
                    .consumer
                    .fetch_watermarks(&reader.topic, partition, timeout)
                    .map_err(|source| KafkaError::client("fetching offsets", source))?;
                let next = match start {
                    StartFrom::Earliest => low,
                    StartFrom::Latest => high,
                    StartFrom::TimestampMs(at_ms) => {
                        let mut list = TopicPartitionList::new();
                        list.add_partition_offset(&reader.topic, partition, Offset::Offset(at_ms))
                            .map_err(|source| {
                                KafkaError::client("looking up a timestamp", source)
                            })?;
                        let found =
                            reader
                                .consumer
                                .offsets_for_times(list, timeout)
                                .map_err(|source| {
                                    KafkaError::client("looking up a timestamp", source)
                                })?;
                        match found
                            .find_partition(&reader.topic, partition)
                            .map(|e| e.offset())
                        {
                            Some(Offset::Offset(offset)) => offset,
                            _ => high,
                        }
                    }
                };
                let end = self.config.bounded.then_some(high);
                reader
                    .partitions
                    .insert(partition, PartitionOffsets { next, end });
                reader.assigned = false;
            }
        }
        self.last_discovery = Instant::now();
        Ok(())
    }

    fn offsets(&self) -> Offsets {
        let mut offsets = Offsets::new();
        for reader in &self.readers {
            for (&partition, &place) in &reader.partitions {
                offsets.insert((reader.topic.clone(), partition), place);
            }
        }
        offsets
    }
}

impl<T, D> Source for KafkaSource<D>
where
    D: Fn(&KafkaRecord<'_>) -> Result<T, String> + Send + Sync + 'static,
{
    type Item = T;

    fn poll_batch(
        &mut self,
        out: &mut Vec<T>,
        max_records: usize,
    ) -> Result<SourcePoll, SourceError> {
        if let Some(error) = self.failed.take() {
            return Err(error.into());
        }
        if !self.config.bounded {
            if let Some(interval_ms) = self.config.discovery_interval_ms {
                if self.last_discovery.elapsed() >= Duration::from_millis(interval_ms) {
                    // New partitions start at their first record, so none
                    // of their records is skipped (as Flink does).
                    self.discover(StartFrom::Earliest)?;
                }
            }
        }
        for reader in &mut self.readers {
            if !reader.assigned {
                reader.assign()?;
            }
        }
        if self.config.bounded && self.readers.iter().all(TopicReader::finished) {
            return Ok(SourcePoll::Ended);
        }
        let mut produced = 0;
        let count = self.readers.len();
        'readers: for step in 0..count {
            let reader = &mut self.readers[(self.next_reader + step) % count];
            while produced < max_records {
                let Some(result) = reader.consumer.poll(Duration::ZERO) else {
                    break;
                };
                let message = match result {
                    Ok(message) => message,
                    Err(ClientError::PartitionEOF(partition)) => {
                        // A bounded partition whose last offsets are
                        // transaction markers (never delivered) ends when
                        // the consumer's own position passed its end. The
                        // event alone is not trusted: tansu 0.6 sends it
                        // before the partition's records.
                        reader.skip_markers(partition);
                        continue;
                    }
                    Err(error) => {
                        let retryable = error.rdkafka_error_code().is_some_and(code_is_retryable);
                        if retryable {
                            // librdkafka reconnects by itself; a lost
                            // broker that stays lost shows as no records.
                            tracing::warn!(topic = %reader.topic, %error, "Kafka consumer error");
                            continue;
                        }
                        return Err(KafkaError::client("reading", error).into());
                    }
                };
                let partition = message.partition();
                let Some(place) = reader.partitions.get_mut(&partition) else {
                    continue; // Not ours (an old assignment's leftover).
                };
                let offset = message.offset();
                if offset < place.next || place.end.is_some_and(|end| offset >= end) {
                    if place.end.is_some_and(|end| offset >= end) {
                        place.next = place.next.max(offset);
                    }
                    continue;
                }
                place.next = offset + 1;
                match (self.deserialize)(&KafkaRecord { message: &message }) {
                    Ok(record) => {
                        out.push(record);
                        produced += 1;
                    }
                    Err(reason) => match self.config.bad_records {
                        BadRecords::Drop => {
                            self.dropped.0.fetch_add(1, Ordering::Relaxed);
                        }
                        BadRecords::Fail => {
                            // The position stays before the bad record, so
                            // a restore finds it again and fails again.
                            place.next = offset;
                            self.failed = Some(KafkaError::BadRecord {
                                topic: reader.topic.clone(),
                                partition,
                                offset,
                                reason,
                            });
                            break 'readers;
                        }
                    },
                }
            }
        }
        self.next_reader = (self.next_reader + 1) % count.max(1);
        if produced > 0 {
            return Ok(SourcePoll::Produced(produced));
        }
        if let Some(error) = self.failed.take() {
            return Err(error.into());
        }
        if self.config.bounded && self.readers.iter().all(TopicReader::finished) {
            return Ok(SourcePoll::Ended);
        }
        Ok(SourcePoll::Idle)
    }

    fn position(&self) -> SourcePosition {
        position::encode(&self.offsets())
    }

    /// One split (0) while the subtask has a partition left to read, none
    /// otherwise, so that a subtask without partitions is idle at once.
    /// All its partitions share that split's watermark generator: per
    /// partition generators would need one partition's records per poll,
    /// which this source does not do yet.
    fn current_splits(&self, out: &mut Vec<SplitId>) {
        let reading = self.readers.iter().any(|reader| {
            reader
                .partitions
                .values()
                .any(|place| !TopicReader::done(place))
        });
        if reading {
            out.push(0);
        }
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), SourceError> {
        let stored = position::decode(position)?;
        for reader in &mut self.readers {
            for ((topic, partition), place) in &stored {
                if *topic == reader.topic
                    && owner(topic, *partition, self.parallelism) == self.subtask
                {
                    reader.partitions.insert(*partition, *place);
                }
            }
            // Owned partitions the stored position does not know were
            // created after it: they start at their first record.
            for (&partition, place) in reader.partitions.iter_mut() {
                if !stored.contains_key(&(reader.topic.clone(), partition)) {
                    let timeout = Duration::from_millis(self.config.request_timeout_ms);
                    let (low, _) = reader
                        .consumer
                        .fetch_watermarks(&reader.topic, partition, timeout)
                        .map_err(|source| KafkaError::client("fetching offsets", source))?;
                    place.next = low;
                }
            }
            reader.assigned = false;
        }
        Ok(())
    }
}

impl<D> Drop for KafkaSource<D> {
    fn drop(&mut self) {
        let timeout = Duration::from_millis(self.config.request_timeout_ms.min(1_000));
        close_readers(&self.readers, timeout);
    }
}

/// Closes every reader's consumer before the drop, which would otherwise
/// wait 100 ms per consumer (see [`close_consumer`]) on the source's
/// actor thread at the end of every job and at every restart.
fn close_readers(readers: &[TopicReader], timeout: Duration) {
    for reader in readers {
        close_consumer(&reader.consumer, timeout);
    }
}
