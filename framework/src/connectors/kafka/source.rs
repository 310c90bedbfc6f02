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
//! **Event time: a watermark per partition.** Every owned partition is a
//! split of its own ([`Source::current_splits`]) and every batch holds
//! the records of one partition only ([`Source::last_split`] names it:
//! each partition is read from a queue of its own, see the connector's
//! `partition.rs`), so with a
//! [`WatermarkStrategy`](crate::time::WatermarkStrategy) on the stream
//! each partition runs its own generator and the subtask's watermark is
//! the minimum over its partitions (DESIGN.md §7): a partition far
//! behind holds the subtask back, and its records are not late because
//! another partition ran ahead. The event time is the record's Kafka
//! timestamp: the deserialiser copies [`KafkaRecord::timestamp_ms`] into
//! the record and the strategy's timestamp function reads it (see the
//! example on [`KafkaRecord::timestamp_ms`]). A partition added later
//! (discovery) gets a new split and so a fresh generator. A subtask with
//! no partition left to read reports no split and is idle at once; with
//! `with_idleness(ms)` a partition that brings nothing new for `ms` no
//! longer holds the subtask back (and the subtask is idle when all of
//! its partitions are), until it reads again. A bounded partition that
//! reached its end drops out of the splits. Batches are per partition
//! with or without a strategy; a poll tries the partitions round-robin
//! from after the one it read last and takes up to `max_records`
//! records from the first that has any.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::bad::{log_drop, DropLog};
pub use super::bad::{BadRecords, DroppedRecords};
use super::error::KafkaError;
use super::lag::LagProbe;
use super::partition::{self, Taken, TopicReader};
use super::position::{self, Offsets, PartitionOffsets};
use super::{client_config, close_consumer, partition_counts};
use crate::source::{
    check_split, Source, SourceError, SourceFactory, SourceFigures, SourcePoll, SourcePosition,
    SplitId, SplitPosition,
};

/// How often the lag probe's answers are taken over (it asks the broker
/// once a second): the live metrics ask once per slice of polls, and this
/// keeps its locks and the consumer's positions off most of them.
const HIGHS_REFRESH: Duration = Duration::from_secs(1);

/// How soon the source looks again while the probe has no answer yet
/// (just started): its first one then shows within milliseconds.
const FIRST_ANSWER_POLL: Duration = Duration::from_millis(10);

/// How long an unbounded source that read nothing yet waits before it
/// starts its lag probe (one that read something starts it at once).
const LAG_PROBE_DELAY: Duration = Duration::from_secs(2);

/// How often an unbounded source looks for new partitions unless told
/// otherwise: 5 minutes, Flink's default for `partition.discovery.interval.ms`
/// (since its Kafka connector 3.1, FLIP-288). Each look is one metadata
/// request per topic and subtask.
pub const DISCOVERY_INTERVAL_DEFAULT_MS: u64 = 300_000;

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
    /// How often an unbounded source asks the broker for new partitions
    /// (Flink's `partition.discovery.interval.ms`, with its default of
    /// 5 minutes, [`DISCOVERY_INTERVAL_DEFAULT_MS`]); `None` or `Some(0)`
    /// turns discovery off (Flink: a non-positive value). Bounded
    /// sources never discover. A partition found by a discovery starts at
    /// its earliest offset whatever [`KafkaSourceConfig::start`] says
    /// (Flink's FLIP-288), so none of its records is skipped; `start`
    /// applies to the partitions there when the job first starts.
    pub discovery_interval_ms: Option<u64>,
    /// How long a metadata or offset request may take before it fails
    /// (retryably).
    pub request_timeout_ms: u64,
    /// Further librdkafka consumer settings, applied last (for example
    /// `fetch.max.bytes`). `isolation.level` is `read_committed` unless
    /// set here; the fetch settings of
    /// [`KafkaSourceConfig::fetch_settings`] apply unless set here.
    pub client_options: Vec<(String, String)>,
}

impl KafkaSourceConfig {
    /// A source over `topics` from their earliest records, unbounded,
    /// failing on bad records, discovering partitions every 5 minutes.
    pub fn new(brokers: &str, topics: &[&str]) -> KafkaSourceConfig {
        KafkaSourceConfig {
            brokers: brokers.to_owned(),
            topics: topics.iter().map(|topic| (*topic).to_owned()).collect(),
            start: StartFrom::Earliest,
            bounded: false,
            bad_records: BadRecords::Fail,
            discovery_interval_ms: Some(DISCOVERY_INTERVAL_DEFAULT_MS),
            request_timeout_ms: 10_000,
            client_options: Vec::new(),
        }
    }

    /// The librdkafka fetch settings the source sets where librdkafka's
    /// defaults cost time; [`KafkaSourceConfig::client_options`] can set
    /// them otherwise.
    ///
    /// - `fetch.queue.backoff.ms` = 10 (librdkafka: 1,000): once a
    ///   partition's queue held more than `queued.min.messages`, the
    ///   fetcher looked again only a second later, long after the source
    ///   had drained it; at 10 ms it fetches again soon after. It costs
    ///   a timer wake-up, not a request, while the queue stays full.
    /// - `fetch.wait.max.ms` = 20 (librdkafka: 500) on a bounded source
    ///   only: a bounded partition whose end proved wrong (tansu, see
    ///   the connector's `bound.rs`) ends at the end-of-partition event,
    ///   which comes with a fetch answer that the broker holds back for
    ///   up to this long when it has nothing new. A bounded source is
    ///   idle at its end only until that answer, so the short wait costs
    ///   a few requests. An unbounded source keeps librdkafka's default:
    ///   the broker answers as soon as it has records, so the wait costs
    ///   no latency, only idle requests.
    ///
    /// Together they took a bounded read of 2 M records at parallelism 2
    /// on tansu from 3.9 s to about 1.3 s (`cargo bench -p snapflow
    /// --features kafka --bench kafka_source`).
    pub fn fetch_settings(&self) -> Vec<(&'static str, &'static str)> {
        let mut settings = vec![("fetch.queue.backoff.ms", "10")];
        if self.bounded {
            settings.push(("fetch.wait.max.ms", "20"));
        }
        settings
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
    ///
    /// It is the event time of the Kafka source's records: keep it in the
    /// record and read it in the stream's watermark strategy, which gives
    /// each partition a watermark of its own.
    ///
    /// ```no_run
    /// use snapflow::connectors::kafka::{KafkaSourceConfig, KafkaSourceFactory};
    /// use snapflow::job::{Job, JobConfig};
    /// use snapflow::time::WatermarkStrategy;
    ///
    /// // (event time in ms, value)
    /// let source = KafkaSourceFactory::new(
    ///     KafkaSourceConfig::new("127.0.0.1:9092", &["clicks"]),
    ///     |record| {
    ///         let timestamp_ms = record.timestamp_ms().ok_or("a record without a timestamp")?;
    ///         let value = record.value().unwrap_or_default().to_vec();
    ///         Ok((u64::try_from(timestamp_ms).map_err(|e| e.to_string())?, value))
    ///     },
    /// )?;
    /// let job = Job::new("clicks", JobConfig::default());
    /// let clicks = job
    ///     .source("clicks", source)
    ///     .assign_timestamps(
    ///         WatermarkStrategy::bounded_out_of_orderness(1_000, |(ts, _): &(u64, Vec<u8>)| *ts)
    ///             .with_idleness(10_000),
    ///     );
    /// # let _ = clicks;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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
        .set("isolation.level", "read_committed")
        // An offset the broker no longer has (deleted by retention) is
        // read from the log's start, never skipped to its end (the
        // client's default): nothing that is still there is left unread.
        .set("auto.offset.reset", "earliest");
    for (key, value) in config.fetch_settings() {
        client.set(key, value);
    }
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
            readers.push(TopicReader::new(topic.clone(), consumer(&self.config)?));
        }
        let mut source = KafkaSource {
            config: Arc::clone(&self.config),
            deserialize: Arc::clone(&self.deserialize),
            dropped: self.dropped.clone(),
            subtask,
            parallelism,
            readers,
            order: Vec::new(),
            cursor: 0,
            last_split: 0,
            next_split: 0,
            last_discovery: Instant::now(),
            lag_due: None,
            lag: None,
            failed: None,
            dropped_here: 0,
            drop_log: DropLog::default(),
            made_at: Instant::now(),
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

/// The source of one subtask. See the [module documentation](self).
pub struct KafkaSource<D> {
    config: Arc<KafkaSourceConfig>,
    deserialize: Arc<D>,
    dropped: DroppedRecords,
    subtask: usize,
    parallelism: usize,
    readers: Vec<TopicReader>,
    /// Every owned partition as (reader index, partition), in the order
    /// of `readers` and their partitions; rebuilt when partitions are
    /// added. Polls go round it from `cursor`.
    order: Vec<(usize, i32)>,
    /// Where the next poll starts in `order`: after the partition the
    /// last batch came from, so one busy partition cannot starve the
    /// others.
    cursor: usize,
    /// The split of the partition the last batch came from.
    last_split: SplitId,
    /// The split id the next partition added gets: ids are never reused
    /// within a subtask, so a new partition always starts with a fresh
    /// watermark generator.
    next_split: SplitId,
    last_discovery: Instant,
    /// When the lag probe's answers are taken over next (`None`: at the
    /// first [`Source::figures`]).
    lag_due: Option<Instant>,
    /// The high watermarks' thread, started at the first
    /// [`Source::figures`] of an unbounded source (metrics on).
    lag: Option<LagProbe>,
    /// A bad record found while filling a batch, returned by the next
    /// poll (the records before it are delivered first).
    failed: Option<KafkaError>,
    /// Records this source object dropped ([`BadRecords::Drop`]), for
    /// [`Source::records_dropped`].
    dropped_here: u64,
    /// The rate limit on the warnings about them.
    drop_log: DropLog,
    /// When the source was made.
    made_at: Instant,
}

/// The partitions of `topic` (with `count` partitions now) that
/// `subtask` of `parallelism` owns and does not read yet (`known`): what
/// a discovery adds. A partition added later never moves an existing one.
fn unknown_owned(
    topic: &str,
    count: i32,
    subtask: usize,
    parallelism: usize,
    known: impl Fn(i32) -> bool,
) -> Vec<i32> {
    (0..count)
        .filter(|&partition| owner(topic, partition, parallelism) == subtask && !known(partition))
        .collect()
}

/// Whether a discovery is due `elapsed` after the last one, every
/// `interval_ms` (`None` or `Some(0)`: never, as Flink's non-positive
/// `partition.discovery.interval.ms`).
fn discovery_due(interval_ms: Option<u64>, elapsed: Duration) -> bool {
    match interval_ms {
        Some(interval_ms) if interval_ms > 0 => elapsed >= Duration::from_millis(interval_ms),
        _ => false,
    }
}

impl<D> KafkaSource<D> {
    /// Adds the partitions this subtask owns and does not know yet,
    /// starting at `start`.
    fn discover(&mut self, start: StartFrom) -> Result<(), KafkaError> {
        for index in 0..self.readers.len() {
            let reader = &self.readers[index];
            let counts = partition_counts(
                reader.consumer(),
                &self.config.brokers,
                std::slice::from_ref(&reader.topic),
                self.config.request_timeout_ms,
            )?;
            let count = counts.get(&reader.topic).copied().unwrap_or(0);
            let found = unknown_owned(&reader.topic, count, self.subtask, self.parallelism, |p| {
                reader.partitions.contains_key(&p)
            });
            for partition in found {
                let offsets = self.first_offsets(&self.readers[index], partition, start)?;
                self.add(index, partition, offsets);
            }
        }
        self.last_discovery = Instant::now();
        Ok(())
    }

    /// Where a partition without a stored offset starts, and (bounded)
    /// ends.
    fn first_offsets(
        &self,
        reader: &TopicReader,
        partition: i32,
        start: StartFrom,
    ) -> Result<PartitionOffsets, KafkaError> {
        let timeout = Duration::from_millis(self.config.request_timeout_ms);
        let consumer = reader.consumer();
        // The latest offset only when it is needed: an unbounded source
        // from the earliest record (the default) asks the broker nothing
        // before its first fetch. On tansu every offset request lists
        // every batch the partition holds (seconds on a topic written one
        // record per batch, and a subtask asked twice per partition before
        // reading: the 10 s before the first record of issue 36).
        let high = if self.config.bounded || start != StartFrom::Earliest {
            let (_, high) = consumer
                .fetch_watermarks(&reader.topic, partition, timeout)
                .map_err(|source| KafkaError::client("fetching offsets", source))?;
            high
        } else {
            0
        };
        let next = match start {
            // Offset 0, not the broker's earliest: tansu 0.6 answers
            // "earliest" with the first offset of the batch it stored first
            // in time, which under concurrent writers is not the lowest (a
            // test once lost a partition's first 32 records so). On Kafka,
            // whose earliest is exact, offset 0 is out of range once
            // retention has deleted it, and `auto.offset.reset=earliest`
            // moves the read to the log's start.
            StartFrom::Earliest => 0,
            StartFrom::Latest => high,
            StartFrom::TimestampMs(at_ms) => {
                let mut list = TopicPartitionList::new();
                list.add_partition_offset(&reader.topic, partition, Offset::Offset(at_ms))
                    .map_err(|source| KafkaError::client("looking up a timestamp", source))?;
                let found = consumer
                    .offsets_for_times(list, timeout)
                    .map_err(|source| KafkaError::client("looking up a timestamp", source))?;
                match found
                    .find_partition(&reader.topic, partition)
                    .map(|entry| entry.offset())
                {
                    Some(Offset::Offset(offset)) => offset,
                    _ => high,
                }
            }
        };
        let end = self.config.bounded.then_some(high);
        tracing::debug!(
            topic = %reader.topic,
            partition,
            next,
            ?end,
            "Kafka source starts a partition without a stored offset"
        );
        Ok(PartitionOffsets {
            next,
            end,
            reads_on: false,
        })
    }

    /// Places `partition` of reader `index` at `offsets`: a partition new
    /// to this subtask gets a split id of its own (and so a watermark
    /// generator of its own).
    fn add(&mut self, index: usize, partition: i32, offsets: PartitionOffsets) {
        let split = self.next_split;
        let reader = &mut self.readers[index];
        if !reader.partitions.contains_key(&partition) {
            self.next_split = self.next_split.wrapping_add(1);
            self.order.push((index, partition));
            self.order.sort_unstable();
        }
        reader.place(partition, offsets, split);
    }

    fn offsets(&self) -> Offsets {
        let mut offsets = Offsets::new();
        for reader in &self.readers {
            for (&partition, owned) in &reader.partitions {
                offsets.insert((reader.topic.clone(), partition), owned.offsets);
            }
        }
        offsets
    }

    fn finished(&self) -> bool {
        self.config.bounded && self.readers.iter().all(TopicReader::finished)
    }

    /// Starts the lag probe if it does not run, tells it the partitions
    /// owned now and takes over its answers.
    fn refresh_lag(&mut self) {
        match &self.lag {
            Some(probe) => probe.want(&self.order),
            None => {
                let consumers = self
                    .readers
                    .iter()
                    .map(|reader| (reader.topic.clone(), reader.shared_consumer()))
                    .collect();
                let timeout = Duration::from_millis(self.config.request_timeout_ms.min(1_000));
                self.lag = LagProbe::start(consumers, &self.order, timeout);
            }
        }
        if let Some(probe) = &self.lag {
            let highs = probe.highs();
            for (index, reader) in self.readers.iter_mut().enumerate() {
                reader.refresh_highs(index, &highs);
            }
        }
        let answered = self.lag.as_ref().is_some_and(LagProbe::answered);
        let wait = if answered {
            HIGHS_REFRESH
        } else {
            FIRST_ANSWER_POLL
        };
        self.lag_due = Some(Instant::now() + wait);
    }

    /// Discovery when it is due, assignments that are due, and the
    /// consumers' own queues.
    fn prepare(&mut self) -> Result<(), KafkaError> {
        let interval_ms = self.config.discovery_interval_ms;
        if !self.config.bounded && discovery_due(interval_ms, self.last_discovery.elapsed()) {
            // New partitions start at their first record, so none of
            // their records is skipped (as Flink does).
            self.discover(StartFrom::Earliest)?;
        }
        for reader in &mut self.readers {
            if !reader.assigned() {
                reader.assign()?;
            }
            reader.serve_events()?;
        }
        Ok(())
    }
}

impl<T, D> KafkaSource<D>
where
    D: Fn(&KafkaRecord<'_>) -> Result<T, String> + Send + Sync + 'static,
{
    /// Reads one batch from the first partition, from the cursor on, that
    /// has records; the records and the partition's split.
    fn read_one_partition(
        &mut self,
        out: &mut Vec<T>,
        max_records: usize,
    ) -> Result<usize, KafkaError> {
        let count = self.order.len();
        for step in 0..count {
            let at = (self.cursor + step) % count;
            let (index, partition) = self.order[at];
            let deserialize = &*self.deserialize;
            let (bad_records, dropped) = (self.config.bad_records, &self.dropped);
            let (dropped_here, drop_log) = (&mut self.dropped_here, &mut self.drop_log);
            let reader = &mut self.readers[index];
            let read = reader.read(partition, max_records, |message| {
                match deserialize(&KafkaRecord { message }) {
                    Ok(record) => {
                        out.push(record);
                        Taken::Record
                    }
                    Err(reason) => match bad_records {
                        BadRecords::Drop => {
                            dropped.add_one();
                            *dropped_here += 1;
                            let at = (message.topic(), partition, message.offset());
                            log_drop(drop_log, Instant::now(), at, &reason);
                            Taken::Dropped
                        }
                        BadRecords::Fail => Taken::Bad(reason),
                    },
                }
            })?;
            if let Some((offset, reason)) = read.bad {
                self.failed = Some(KafkaError::BadRecord {
                    topic: reader.topic.clone(),
                    partition,
                    offset,
                    reason,
                });
            }
            if read.produced > 0 || self.failed.is_some() {
                self.cursor = (at + 1) % count;
                if let Some(owned) = reader.partitions.get(&partition) {
                    self.last_split = owned.split;
                }
                return Ok(read.produced);
            }
        }
        Ok(0)
    }
}

impl<T, D> Source for KafkaSource<D>
where
    D: Fn(&KafkaRecord<'_>) -> Result<T, String> + Send + Sync + 'static,
{
    type Item = T;

    /// Appends records of one partition only (see
    /// [`Source::last_split`]), up to `max_records`.
    fn poll_batch(
        &mut self,
        out: &mut Vec<T>,
        max_records: usize,
    ) -> Result<SourcePoll, SourceError> {
        if let Some(error) = self.failed.take() {
            return Err(error.into());
        }
        self.prepare()?;
        if self.finished() {
            return Ok(SourcePoll::Ended);
        }
        let produced = self.read_one_partition(out, max_records)?;
        if produced > 0 {
            return Ok(SourcePoll::Produced(produced));
        }
        if let Some(error) = self.failed.take() {
            return Err(error.into());
        }
        if self.finished() {
            return Ok(SourcePoll::Ended);
        }
        Ok(SourcePoll::Idle)
    }

    fn position(&self) -> SourcePosition {
        position::encode(&self.offsets())
    }

    /// The records this subtask's source dropped with
    /// [`BadRecords::Drop`] since it was made.
    fn records_dropped(&self) -> u64 {
        self.dropped_here
    }

    /// One split per owned partition with records left to read (a
    /// bounded partition that reached its end drops out), so that each
    /// partition has a watermark generator of its own, and none when the
    /// subtask has no partition left: it is then idle at once.
    fn current_splits(&self, out: &mut Vec<SplitId>) {
        for reader in &self.readers {
            for owned in reader.partitions.values() {
                if !partition::done(&owned.offsets) {
                    out.push(owned.split);
                }
            }
        }
    }

    /// The partition the last batch came from: every batch holds one
    /// partition's records.
    fn last_split(&self) -> SplitId {
        self.last_split
    }

    /// The bytes of the messages read, and the offsets not read yet
    /// summed over the owned partitions: up to a bounded partition's end,
    /// else up to its high watermark as the lag probe last got it from
    /// the broker (taken over at most once a second; a partition whose
    /// high watermark is not known yet leaves the lag unknown).
    fn figures(&mut self) -> SourceFigures {
        let due = self.lag_due.map_or(true, |at| Instant::now() >= at);
        // The probe starts once the source read something (or after
        // LAG_PROBE_DELAY), so that its offset requests never stand
        // between the job's start and its first fetch.
        let started = self.readers.iter().any(|reader| reader.bytes_read > 0)
            || self.made_at.elapsed() >= LAG_PROBE_DELAY;
        if due && !self.config.bounded && started {
            self.refresh_lag();
        }
        let mut pending = Some(0_u64);
        for reader in &self.readers {
            for owned in reader.partitions.values() {
                pending = pending
                    .zip(TopicReader::pending(owned))
                    .map(|(sum, more)| sum.saturating_add(more));
            }
        }
        SourceFigures {
            bytes_read: Some(self.readers.iter().map(|reader| reader.bytes_read).sum()),
            pending_records: pending,
            pending_bytes: None,
        }
    }

    /// Every owned partition as `topic/partition` at its next offset,
    /// with its own lag.
    fn split_positions(&self, out: &mut Vec<SplitPosition>) {
        for reader in &self.readers {
            for (partition, owned) in &reader.partitions {
                out.push(SplitPosition {
                    split: format!("{}/{partition}", reader.topic),
                    position: u64::try_from(owned.offsets.next).unwrap_or(0),
                    pending_records: TopicReader::pending(owned),
                });
            }
        }
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), SourceError> {
        let stored = position::decode(position)?;
        for index in 0..self.readers.len() {
            for ((topic, partition), place) in &stored {
                if *topic == self.readers[index].topic
                    && owner(topic, *partition, self.parallelism) == self.subtask
                {
                    self.add(index, *partition, *place);
                }
            }
            // Owned partitions the stored position does not know were
            // created after it: they start at their first record.
            let reader = &self.readers[index];
            let mut unknown = Vec::new();
            for (&partition, owned) in &reader.partitions {
                if !stored.contains_key(&(reader.topic.clone(), partition)) {
                    let first = self.first_offsets(reader, partition, StartFrom::Earliest)?;
                    unknown.push((
                        partition,
                        PartitionOffsets {
                            next: first.next,
                            ..owned.offsets
                        },
                    ));
                }
            }
            for (partition, offsets) in unknown {
                self.add(index, partition, offsets);
            }
            self.readers[index].reassign();
        }
        Ok(())
    }
}

impl<D> Drop for KafkaSource<D> {
    fn drop(&mut self) {
        // The probe's thread uses the consumers: it stops first.
        drop(self.lag.take());
        let timeout = Duration::from_millis(self.config.request_timeout_ms.min(1_000));
        close_readers(&self.readers, timeout);
    }
}

/// Closes every reader's consumer before the drop, which would otherwise
/// wait 100 ms per consumer (see [`close_consumer`]) on the source's
/// actor thread at the end of every job and at every restart.
fn close_readers(readers: &[TopicReader], timeout: Duration) {
    for reader in readers {
        close_consumer(reader.consumer(), timeout);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Discovery runs once its interval passed, and never when it is off
    /// (`None`, or `0` as in Flink).
    #[test]
    fn discovery_is_due_after_its_interval_and_never_when_off() {
        let second = Duration::from_secs(1);
        assert!(!discovery_due(Some(1_000), second / 2));
        assert!(discovery_due(Some(1_000), second));
        assert!(!discovery_due(None, second * 1_000));
        assert!(!discovery_due(Some(0), second * 1_000));
        let config = KafkaSourceConfig::new("localhost:9092", &["t"]);
        assert_eq!(
            config.discovery_interval_ms,
            Some(DISCOVERY_INTERVAL_DEFAULT_MS),
            "Flink's default of 5 minutes"
        );
        assert_eq!(DISCOVERY_INTERVAL_DEFAULT_MS, 300_000);
    }

    /// The ownership rule of discovery alone (`tests/tests/kafka_discovery.rs`
    /// grows a topic on a real broker): a topic grown from 3 to 8
    /// partitions gives each subtask exactly the new partitions it owns,
    /// the old ones stay where they were, and every partition has one
    /// owner.
    #[test]
    fn a_grown_topic_adds_only_new_partitions_to_their_owners() {
        for parallelism in 1..=3 {
            let mut known: Vec<Vec<i32>> = (0..parallelism)
                .map(|subtask| unknown_owned("t", 3, subtask, parallelism, |_| false))
                .collect();
            let before = known.clone();
            for (subtask, owned) in known.iter_mut().enumerate() {
                let added = unknown_owned("t", 8, subtask, parallelism, |p| owned.contains(&p));
                assert!(
                    added.iter().all(|&p| p >= 3),
                    "only new partitions are added"
                );
                owned.extend(added);
            }
            for (owned, old) in known.iter().zip(&before) {
                assert!(old.iter().all(|p| owned.contains(p)), "nothing moves");
            }
            let mut all: Vec<i32> = known.concat();
            all.sort_unstable();
            assert_eq!(all, (0..8).collect::<Vec<_>>(), "each partition once");
        }
    }
}
