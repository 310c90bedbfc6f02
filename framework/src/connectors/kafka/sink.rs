//! The Kafka sink: exactly-once through one Kafka transaction per subtask
//! and checkpoint interval (as Flink's `KafkaSink`), or at-least-once, or
//! no guarantee.
//!
//! This module owns producing records, the transactions' names and
//! lifecycle, and the sink state that lists pre-committed transactions.
//! It never creates topics and never retries by itself.
//!
//! # Exactly-once ([`Delivery::ExactlyOnce`])
//!
//! - **Names.** The transaction that holds the records written after
//!   checkpoint `n` (or after the start, `n = 0`) has the transactional id
//!   `<prefix>-<subtask>-<n>`, where the prefix defaults to
//!   `snapflow.<job>.<operator>`. It is opened with its own producer: by
//!   the restore for the first one; after a pre-commit whose transaction
//!   held records, ahead of need on a thread of its own (opening one
//!   blocked the actor 60 to 510 ms per interval on the test broker); else
//!   by the first record after `n`. A restore first waits for every
//!   opening ahead of its subtask's ids (see `super::txn`).
//! - **Pre-commit** at checkpoint `m`: the open transaction is flushed
//!   (every record acknowledged by the broker, still uncommitted) and
//!   filed under `m`; the sink state lists every pending `(m, id)` and the
//!   name of the next transaction.
//! - **Commit** when checkpoint `m` completes: `commit_transaction` for
//!   every pending one up to `m`, in order.
//! - **Marker.** Each transaction also commits, through Kafka's
//!   transactional offset commit, the subtask's *commit marker*: the
//!   checkpoint it was pre-committed at and its nonce (see
//!   `super::marker`), so the broker records atomically with
//!   the records which checkpoint the subtask committed last.
//! - **State.** The sink state lists every pending transaction with its
//!   id, header and records, so the records can be written again.
//! - **Restore** from a checkpoint that lists pending transactions (see
//!   `super::recover`): each is committed with the producer
//!   that opened it if this process still has it (a table kept across a
//!   failover inside the process: librdkafka cannot resume a
//!   transaction from another producer object); else the marker says
//!   whether a process that died committed it; else its records, and
//!   those of every later pending one, are written again in one new
//!   transaction whose marker covers them. Then every other
//!   pre-committed transaction of the subtask still in the table is
//!   aborted, and the ids `<prefix>-<subtask>-<n>` to `<n + fence_ahead>`
//!   are fenced (a producer initialises each, which makes the broker
//!   abort whatever transaction a dead incarnation left open under it).
//!   A fresh start (no checkpoint) resets a marker an earlier run with
//!   the same prefix left.
//! - **Headers.** Every record carries the header [`TXN_HEADER`]:
//!   `<transactional id>#<nonce>`, and the factory's [`CommitLog`] lists
//!   the header values of the transactions this process committed or
//!   found committed. A reader that cannot rely on the broker hiding
//!   aborted records (the test broker, tansu 0.6, does not) can keep
//!   exactly the committed ones.
//!
//! So a process crash between a checkpoint's completion and its commit
//! loses nothing: the next run writes that interval's output again when
//! the marker shows it was not committed (tested by SIGKILL in
//! `tests/tests/kafka_crash.rs`). Records written after a pre-commit
//! wait in the sink until the factory's pending commits are done
//! (`super::gate`), and a restore in a new process ends the dead
//! process's transactions before it reads the marker
//! (`super::unblock`): the test broker, tansu 0.6, applies a
//! commit's marker only once every overlapping transaction has ended
//! (see docs/design/kafka-connector.md). Flink resumes the
//! transaction itself by producer id and epoch; librdkafka offers no
//! such call, hence the records in the state. Their cost: a checkpoint
//! holds the sink's output of one interval (more while commits lag).
//!
//! `check_restore` reads the marker: a marker past the restored
//! checkpoint means that output after it is visible, so the job refuses
//! (or, if allowed, reports) a fallback past a damaged checkpoint;
//! without a restored checkpoint it answers [`Visibility::Unknown`] (the
//! marker may be an earlier run's).
//!
//! # At-least-once and none
//!
//! [`Delivery::AtLeastOnce`]: an idempotent producer, flushed at every
//! pre-commit (records are visible at once; a replay after a restore
//! writes them again). [`Delivery::None`]: records are sent and not
//! waited for (a failure can lose them).
//!
//! # Backpressure and errors
//!
//! A slow broker slows the job down: the sink waits while librdkafka's
//! queue is full, at a pre-commit's flush and on transactional requests
//! that time out, for as long as the broker acknowledges records, and
//! gives up only after [`KafkaSinkConfig::unreachable_timeout_ms`]
//! without an acknowledgement (see `docs/design/kafka-sink.md`). A
//! broker that is away that long gives retryable errors (the job
//! restarts per its strategy); a fenced producer, a missing topic or a
//! bad setting does not. Nothing committed is lost and nothing is
//! committed twice by a retry: commits are in checkpoint order and a
//! committed transaction leaves the pending list.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::Producer;

use super::error::KafkaError;
use super::gate::{SendGate, HELD_MAX};
use super::marker::{Marker, MarkerGroup};
use super::sink_state::{self, PendingTxn};
use super::txn::{self, fence, open_txn, send, DeliveryWatch, Producer_, Txn};
use super::{client_config, partition_counts, recover, registry, unblock};
use crate::sink::{Guarantee, Sink, SinkContext, SinkError, SinkFactory, SinkState, Visibility};

/// The header every exactly-once record carries: its transaction's id
/// and the producing incarnation, `<transactional id>#<nonce>`.
pub const TXN_HEADER: &str = "snapflow-txn";

/// How long a dropped sink waits for its open transaction's records
/// before it aborts it.
const DROP_FLUSH_MAX_MS: u64 = 10_000;

/// At most this many committed transactions are remembered by a
/// [`CommitLog`]; older ones are forgotten first.
pub const COMMIT_LOG_MAX: usize = 100_000;

/// The sink's delivery guarantee.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Kafka transactions committed when their checkpoint completes.
    ExactlyOnce,
    /// An idempotent producer flushed at each checkpoint; duplicates
    /// after a restore.
    AtLeastOnce,
    /// Fire and forget.
    None,
}

pub use crate::connectors::kafka_sink_state::KafkaOut;

/// The Kafka sink's settings.
#[derive(Debug, Clone)]
pub struct KafkaSinkConfig {
    /// The bootstrap servers, `host:port[,host:port...]`.
    pub brokers: String,
    /// The topic to write; it must exist.
    pub topic: String,
    /// The job's name (part of the transactional ids).
    pub job: String,
    /// The sink operator's name (part of the transactional ids).
    pub operator: String,
    /// The guarantee.
    pub delivery: Delivery,
    /// The transactional ids' prefix; `None`: `snapflow.<job>.<operator>`.
    /// Two jobs writing at once must not share it.
    pub transactional_id_prefix: Option<String>,
    /// The producer's `transaction.timeout.ms`: a transaction open longer
    /// is aborted by the broker. It must be longer than the job's
    /// checkpoint interval, which the sink learns from the job
    /// ([`SinkFactory::open`]): a job whose interval is not shorter
    /// does not start ([`KafkaError::TransactionTimeoutTooShort`]). It is
    /// also librdkafka's `message.timeout.ms` of the exactly-once mode (a
    /// record not delivered by then belongs to a transaction the broker
    /// aborts anyway).
    pub transaction_timeout_ms: u64,
    /// How many ids past the restored checkpoint a restore fences.
    pub fence_ahead: u64,
    /// How long one request to the broker (a commit, opening a
    /// transaction, adding the commit marker, a metadata request) waits
    /// for its answer. A request that times out is asked again until
    /// [`KafkaSinkConfig::unreachable_timeout_ms`] has passed.
    pub request_timeout_ms: u64,
    /// How long the sink waits while the broker acknowledges nothing
    /// before it fails with a retryable error (the broker counts as
    /// unreachable, and the job restarts per its strategy). While the
    /// broker acknowledges records, however slowly, the sink waits for
    /// it: when librdkafka's queue is full, at a pre-commit's flush, and
    /// for requests that time out. A slow or briefly stopped broker thus
    /// slows the job down (backpressure) instead of failing it. Default
    /// 60 s; keep it below `transaction_timeout_ms` in the exactly-once
    /// mode, or the broker aborts the transaction first.
    pub unreachable_timeout_ms: u64,
    /// Further librdkafka producer settings, applied last.
    pub client_options: Vec<(String, String)>,
}

impl KafkaSinkConfig {
    /// An exactly-once sink writing `topic`, with a 60 s transaction
    /// time-out.
    pub fn new(brokers: &str, topic: &str, job: &str, operator: &str) -> KafkaSinkConfig {
        KafkaSinkConfig {
            brokers: brokers.to_owned(),
            topic: topic.to_owned(),
            job: job.to_owned(),
            operator: operator.to_owned(),
            delivery: Delivery::ExactlyOnce,
            transactional_id_prefix: None,
            transaction_timeout_ms: 60_000,
            fence_ahead: 2,
            request_timeout_ms: 30_000,
            unreachable_timeout_ms: 60_000,
            client_options: Vec::new(),
        }
    }

    fn prefix(&self) -> String {
        self.transactional_id_prefix
            .clone()
            .unwrap_or_else(|| format!("snapflow.{}.{}", self.job, self.operator))
    }
}

/// The transactions committed by the sinks of one factory in this
/// process, as the values of their [`TXN_HEADER`]. Clones share it.
#[derive(Debug, Clone, Default)]
pub struct CommitLog {
    committed: Arc<Mutex<VecDeque<String>>>,
    pub(super) recovered: Arc<AtomicU64>,
    pub(super) rewritten: Arc<AtomicU64>,
}

impl CommitLog {
    /// The header values of the committed transactions (the newest
    /// [`COMMIT_LOG_MAX`]), in commit order.
    pub fn committed(&self) -> Vec<String> {
        self.lock().iter().cloned().collect()
    }

    /// Pending transactions a restore found committed by the commit
    /// marker (an incarnation in a process that died committed them) and
    /// added to this log under their header.
    pub fn recovered(&self) -> u64 {
        self.recovered.load(Ordering::Relaxed)
    }

    /// Pending transactions a restore found uncommitted and without a
    /// producer in this process (it died), and wrote again from the
    /// sink's state in a new transaction.
    pub fn rewritten(&self) -> u64 {
        self.rewritten.load(Ordering::Relaxed)
    }

    /// Whether the log holds a transaction with this header.
    pub(super) fn contains(&self, header: &str) -> bool {
        self.lock().iter().any(|logged| logged == header)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<String>> {
        self.committed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn push(&self, header: String) {
        let mut log = self.lock();
        if log.len() == COMMIT_LOG_MAX {
            log.pop_front();
        }
        log.push_back(header);
    }
}

/// Builds the Kafka sink of each subtask. See the
/// [module documentation](self).
pub struct KafkaSinkFactory<T, S> {
    config: Arc<KafkaSinkConfig>,
    serialize: Arc<S>,
    /// The records' event time, for those without a timestamp.
    event_time: Option<EventTime<T>>,
    log: CommitLog,
    gate: Arc<SendGate>,
    _records: std::marker::PhantomData<fn(&T)>,
}

impl<T, S> KafkaSinkFactory<T, S>
where
    S: Fn(&T) -> KafkaOut + Send + Sync + 'static,
{
    /// A factory writing `config.topic` through `serialize`; it checks now
    /// the settings, that a broker answers and that the topic exists. The
    /// transaction time-out is checked against the job's checkpoint
    /// interval when the sink joins a job ([`SinkFactory::open`]).
    ///
    /// # Errors
    ///
    /// [`KafkaError::InvalidConfig`], [`KafkaError::BrokerUnreachable`],
    /// [`KafkaError::UnknownTopic`].
    pub fn new(config: KafkaSinkConfig, serialize: S) -> Result<Self, KafkaError> {
        for (setting, value) in [
            ("request_timeout_ms", config.request_timeout_ms),
            ("unreachable_timeout_ms", config.unreachable_timeout_ms),
            ("transaction_timeout_ms", config.transaction_timeout_ms),
        ] {
            if value == 0 {
                return Err(KafkaError::InvalidConfig {
                    setting,
                    reason: "must be above 0".to_owned(),
                });
            }
        }
        let prefix = config.prefix();
        if prefix.is_empty() || prefix.len() > 200 {
            return Err(KafkaError::InvalidConfig {
                setting: "transactional_id_prefix",
                reason: format!("`{prefix}` must be 1 to 200 bytes long"),
            });
        }
        let consumer: BaseConsumer = client_config(&config.brokers)
            .create()
            .map_err(|source| KafkaError::client("creating a metadata client", source))?;
        partition_counts(
            &consumer,
            &config.brokers,
            std::slice::from_ref(&config.topic),
            config.request_timeout_ms,
        )?;
        Ok(KafkaSinkFactory {
            config: Arc::new(config),
            serialize: Arc::new(serialize),
            event_time: None,
            log: CommitLog::default(),
            gate: Arc::new(SendGate::default()),
            _records: std::marker::PhantomData,
        })
    }

    /// Gives every record whose [`KafkaOut::timestamp_ms`] is `None` the
    /// timestamp `timestamp_of` reads from it: its event time, in
    /// milliseconds since the epoch.
    ///
    /// Records do not carry their event time through a job (as for
    /// [`window`](crate::job::KeyedStream::window), the timestamp is a
    /// function of the record), so the sink cannot read it by itself:
    /// pass the function the source's
    /// [`WatermarkStrategy`](crate::time::WatermarkStrategy) uses, or one
    /// that reads the time a result carries (a window's `end_ms - 1`).
    /// Without this and without a timestamp in the record, the producer
    /// stamps the time it sends the record.
    ///
    /// ```no_run
    /// use snapflow::connectors::kafka::{KafkaOut, KafkaSinkConfig, KafkaSinkFactory};
    ///
    /// // (user, event time in ms)
    /// let sink = KafkaSinkFactory::new(
    ///     KafkaSinkConfig::new("127.0.0.1:9092", "events", "job", "out"),
    ///     |event: &(u32, u64)| KafkaOut::new(event.0.to_string().into_bytes()),
    /// )?
    /// .with_event_time(|event: &(u32, u64)| event.1);
    /// # Ok::<(), snapflow::connectors::kafka::KafkaError>(())
    /// ```
    pub fn with_event_time(
        mut self,
        timestamp_of: impl Fn(&T) -> u64 + Send + Sync + 'static,
    ) -> Self {
        self.event_time = Some(Arc::new(timestamp_of));
        self
    }

    /// The log of committed transactions of this factory's sinks.
    pub fn commit_log(&self) -> CommitLog {
        self.log.clone()
    }
}

impl<T, S> SinkFactory for KafkaSinkFactory<T, S>
where
    S: Fn(&T) -> KafkaOut + Send + Sync + 'static,
{
    type Sink = KafkaSink<T, S>;

    /// Checks the transaction time-out against the job's checkpoint
    /// interval: every transaction stays open for one interval and until
    /// its checkpoint completes, so a time-out not longer than the
    /// interval would make the broker abort every one of them.
    fn open(&mut self, context: &SinkContext) -> Result<(), SinkError> {
        if self.config.delivery != Delivery::ExactlyOnce {
            return Ok(());
        }
        check_transaction_timeout(&self.config, context).map_err(KafkaError::into_sink_error)
    }

    fn create(&self, subtask: usize, _parallelism: usize) -> Result<Self::Sink, SinkError> {
        Ok(KafkaSink {
            prefix: format!("{}-{subtask}-", self.config.prefix()),
            config: Arc::clone(&self.config),
            serialize: Arc::clone(&self.serialize),
            event_time: self.event_time.clone(),
            log: self.log.clone(),
            gate: Arc::clone(&self.gate),
            reported_pending: 0,
            subtask,
            opened_after: 0,
            open: None,
            held_from: 0,
            pending: BTreeMap::new(),
            marker: None,
            plain: None,
            ended: false,
            live: false,
            bytes_written: 0,
            _records: std::marker::PhantomData,
        })
    }
}

/// A function that reads a record's event time.
type EventTime<T> = Arc<dyn Fn(&T) -> u64 + Send + Sync>;

/// [`SinkFactory::open`]'s check of the exactly-once mode.
///
/// # Errors
///
/// [`KafkaError::TransactionTimeoutTooShort`] when the transaction
/// time-out is not longer than the job's checkpoint interval.
fn check_transaction_timeout(
    config: &KafkaSinkConfig,
    context: &SinkContext,
) -> Result<(), KafkaError> {
    match context.checkpoint_interval_ms {
        Some(interval_ms) if config.transaction_timeout_ms <= interval_ms => {
            Err(KafkaError::TransactionTimeoutTooShort {
                transaction_timeout_ms: config.transaction_timeout_ms,
                checkpoint_interval_ms: interval_ms,
            })
        }
        Some(_) => Ok(()),
        None => {
            // Not an error: a short bounded job commits its one
            // transaction at its final checkpoint in time. A longer one
            // fails (retryably) when the broker aborts the transaction.
            tracing::warn!(
                job = %context.job,
                sink = %context.operator,
                transaction_timeout_ms = config.transaction_timeout_ms,
                "the job takes no periodic checkpoints, so the exactly-once Kafka sink writes \
                 all its output in one transaction, committed at the job's end: the broker \
                 aborts it if the job runs longer than transaction_timeout_ms; set \
                 JobConfig::checkpoint_interval_ms"
            );
            Ok(())
        }
    }
}

/// The sink of one subtask. See the [module documentation](self).
pub struct KafkaSink<T, S> {
    config: Arc<KafkaSinkConfig>,
    serialize: Arc<S>,
    /// The records' event time, for those without a timestamp.
    event_time: Option<EventTime<T>>,
    log: CommitLog,
    /// The factory's [`SendGate`], and this subtask's pending count as
    /// last told to it.
    gate: Arc<SendGate>,
    reported_pending: usize,
    subtask: usize,
    /// `<prefix>-<subtask>-`: every transactional id of this subtask.
    prefix: String,
    /// The checkpoint the next transaction is named after.
    opened_after: u64,
    open: Option<Txn>,
    /// The first record of `open` not yet sent: those after it wait for
    /// the [`SendGate`].
    held_from: usize,
    /// Pre-committed transactions by checkpoint id: their ids. The
    /// producers wait in the process table ([`registry`]), so that the
    /// next incarnation finds them even if this sink is never dropped
    /// cleanly.
    pending: BTreeMap<u64, PendingTxn>,
    /// The client of this subtask's commit marker (exactly-once only),
    /// made at the first use.
    marker: Option<MarkerGroup>,
    /// The producer of the at-least-once and none modes.
    plain: Option<(Producer_, Arc<DeliveryWatch>)>,
    /// Whether the input ended (`finish`): no transaction is opened
    /// ahead after that.
    ended: bool,
    /// Whether this sink was restored and counts as alive in the process
    /// table ([`registry::add_live`]).
    live: bool,
    /// Bytes of the records produced so far: keys, values and headers
    /// (an aborted transaction's too, as they were sent).
    bytes_written: u64,
    _records: std::marker::PhantomData<fn(&T)>,
}

/// The record `serialize` makes of `record`, with the event time
/// `event_time` reads as its timestamp when it has none.
fn to_out<T, S: Fn(&T) -> KafkaOut>(
    serialize: &S,
    event_time: Option<&EventTime<T>>,
    record: &T,
) -> KafkaOut {
    let mut out = serialize(record);
    if let (None, Some(event_time)) = (out.timestamp_ms, event_time) {
        out.timestamp_ms = Some(event_time(record));
    }
    out
}

/// The bytes of one produced record as [`Sink::bytes_written`] counts
/// them: key, value and, with a transaction, the header's name and value.
fn record_bytes(out: &KafkaOut, header: Option<&str>) -> u64 {
    let key = out.key.as_ref().map_or(0, Vec::len);
    let header = header.map_or(0, |value| TXN_HEADER.len() + value.len());
    (key + out.value.len() + header) as u64
}

impl<T, S> fmt::Debug for KafkaSink<T, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSink")
            .field("subtask", &self.subtask)
            .field("opened_after", &self.opened_after)
            .field("pending", &self.pending)
            .finish()
    }
}

impl<T, S> KafkaSink<T, S>
where
    S: Fn(&T) -> KafkaOut + Send + Sync + 'static,
{
    fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.request_timeout_ms)
    }

    /// How long the sink waits for a broker that acknowledges nothing.
    fn unreachable(&self) -> Duration {
        Duration::from_millis(self.config.unreachable_timeout_ms)
    }

    fn id_after(&self, checkpoint_id: u64) -> String {
        format!("{}{checkpoint_id}", self.prefix)
    }

    /// This subtask's marker client, made at the first use.
    fn marker(&mut self) -> Result<&MarkerGroup, KafkaError> {
        if self.marker.is_none() {
            self.marker = Some(MarkerGroup::new(&self.config, &self.prefix)?);
        }
        self.marker.as_ref().ok_or(KafkaError::InvalidConfig {
            setting: "group.id",
            reason: "no marker client after making one".to_owned(),
        })
    }

    /// Finishes the pending transactions `listed` (ascending), as
    /// [`recover::finish`] describes.
    fn finish_pending(&mut self, listed: &BTreeMap<u64, PendingTxn>) -> Result<(), KafkaError> {
        let config = Arc::clone(&self.config);
        let log = self.log.clone();
        let prefix = self.prefix.clone();
        let gate = Arc::clone(&self.gate);
        let marker = self.marker()?;
        let nudge = recover::Nudge {
            gate: &gate,
            prefix: &prefix,
        };
        recover::finish(&config, &log, marker, &nudge, listed)
    }

    /// [`Sink::restore`] of the exactly-once mode.
    fn restore_exactly_once(&mut self, state: Option<&SinkState>) -> Result<(), SinkError> {
        let restored = match state {
            Some(state) => Some(sink_state::decode(state, self.subtask)?),
            None => None,
        };
        // Openings ahead of a failed incarnation of this subtask end
        // before this restore initialises any of its ids.
        txn::settle_ahead(&self.prefix);
        match &restored {
            Some(restored) => self.finish_pending(&restored.pending)?,
            None => {
                // A fresh start: a marker left by an earlier run of a job
                // with the same name would claim checkpoints this run has
                // not reached yet.
                let config = Arc::clone(&self.config);
                let id = self.id_after(0);
                let marker = self.marker()?;
                recover::reset_marker(&config, marker, id)?;
            }
        }
        // Pre-committed after the restored checkpoint, by an incarnation
        // of this process that failed: never to be committed.
        for txn in registry::take_prefixed(&self.prefix) {
            if let Err(error) = txn.producer.abort_transaction(self.timeout()) {
                tracing::warn!(id = %txn.id, %error, "aborting a left-over Kafka transaction failed; fencing it");
                fence(&self.config, &txn.id)?;
            }
        }
        // Open transactions of an incarnation that died in another
        // process: the first id is fenced by opening this incarnation's
        // first transaction under it, the others by fences, all at once
        // (one after another they cost a broker round trip each, and the
        // first record would wait for the opening).
        let opened_after = restored.map_or(0, |restored| restored.opened_after);
        // Those the checks fenced already (`unblock::end_dead`) are not
        // fenced twice: on a busy broker each is a round trip. The first
        // is opened here either way, so it leaves the table too.
        registry::take_fenced(&self.id_after(opened_after));
        let later: Vec<String> = (1..=self.config.fence_ahead)
            .map(|ahead| self.id_after(opened_after.saturating_add(ahead)))
            .filter(|id| !registry::take_fenced(id))
            .collect();
        self.open = Some(txn::open_and_fence(
            &self.config,
            self.id_after(opened_after),
            &later,
        )?);
        self.opened_after = opened_after;
        self.pending.clear();
        self.report_pending();
        self.held_from = 0;
        tracing::debug!(subtask = self.subtask, opened_after, "Kafka sink restored");
        Ok(())
    }

    /// Tells the [`SendGate`] how many transactions this subtask has
    /// pending now.
    fn report_pending(&mut self) {
        let now = self.pending.len();
        self.gate.report_pending(self.reported_pending, now);
        self.reported_pending = now;
    }

    /// Sends the records of the open transaction that wait for the gate.
    fn send_held(&mut self) -> Result<(), KafkaError> {
        let timeout = self.unreachable();
        let Some(txn) = self.open.as_mut() else {
            return Ok(());
        };
        if self.held_from >= txn.records.len() {
            return Ok(());
        }
        for out in &txn.records[self.held_from..] {
            send(
                &txn.producer,
                &self.config.topic,
                out,
                Some(&txn.header),
                timeout,
            )?;
            self.bytes_written += record_bytes(out, Some(&txn.header));
        }
        self.held_from = txn.records.len();
        txn.producer.poll(Duration::ZERO);
        txn.watch.check()
    }
}

impl<T, S> Sink for KafkaSink<T, S>
where
    S: Fn(&T) -> KafkaOut + Send + Sync + 'static,
{
    type Item = T;

    fn write_batch(&mut self, batch: &[T]) -> Result<(), SinkError> {
        if batch.is_empty() {
            return Ok(());
        }
        let timeout = self.unreachable();
        match self.config.delivery {
            Delivery::ExactlyOnce => {
                if self.open.is_none() {
                    let id = self.id_after(self.opened_after);
                    let txn = match txn::take_ahead(&id) {
                        Some(opened) => opened?,
                        None => open_txn(&self.config, id)?,
                    };
                    self.open = Some(txn);
                }
                let Some(txn) = self.open.as_mut() else {
                    return Err(SinkError::Misuse {
                        reason: "no open transaction after opening one".to_owned(),
                    });
                };
                let (serialize, event_time) = (&*self.serialize, &self.event_time);
                txn.records.extend(
                    batch
                        .iter()
                        .map(|record| to_out(serialize, event_time.as_ref(), record)),
                );
                let held = txn.records.len() - self.held_from;
                if self.gate.is_open() || held >= HELD_MAX {
                    self.send_held()?;
                }
            }
            Delivery::AtLeastOnce | Delivery::None => {
                if self.plain.is_none() {
                    self.plain = Some(txn::producer(&self.config, None)?);
                }
                let Some((producer, watch)) = &self.plain else {
                    return Err(SinkError::Misuse {
                        reason: "no producer after making one".to_owned(),
                    });
                };
                for record in batch {
                    let out = to_out(&*self.serialize, self.event_time.as_ref(), record);
                    send(producer, &self.config.topic, &out, None, timeout)?;
                    self.bytes_written += record_bytes(&out, None);
                }
                producer.poll(Duration::ZERO);
                watch.check()?;
            }
        }
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint_id: u64) -> Result<SinkState, SinkError> {
        match self.config.delivery {
            Delivery::ExactlyOnce => {
                if let Some(txn) = self.open.take_if(|txn| txn.records.is_empty()) {
                    // Opened by the restore and never written to: nothing
                    // to keep (librdkafka has not told the broker about a
                    // transaction without records or offsets).
                    txn.producer
                        .abort_transaction(self.timeout())
                        .map_err(|source| KafkaError::client("abort_transaction", source))?;
                }
                if self.open.is_none() {
                    // Opened ahead for an interval that brought no record:
                    // the next transaction has another id.
                    drop(txn::take_ahead(&self.id_after(self.opened_after)));
                }
                // Pre-committing is when the held records must go.
                self.send_held()?;
                self.held_from = 0;
                if let Some(mut txn) = self.open.take() {
                    tracing::debug!(
                        checkpoint_id,
                        id = %txn.id,
                        records = txn.records.len(),
                        "Kafka sink pre-commit"
                    );
                    let marker = Marker {
                        checkpoint_id,
                        first: checkpoint_id,
                        nonce: txn.nonce,
                    };
                    let config = Arc::clone(&self.config);
                    let group = self.marker()?;
                    recover::send_marker(&config, &txn.producer, group, &marker)?;
                    txn::flush(&txn.producer, self.unreachable())?;
                    txn.watch.check()?;
                    let pending = PendingTxn {
                        id: txn.id.clone(),
                        header: txn.header.clone(),
                        records: std::mem::take(&mut txn.records),
                    };
                    self.pending.insert(checkpoint_id, pending);
                    self.report_pending();
                    registry::park(txn);
                    if !self.ended {
                        // A busy interval: the next one likely brings
                        // records too.
                        txn::open_ahead(&self.config, self.id_after(checkpoint_id));
                    }
                }
                self.opened_after = checkpoint_id;
            }
            Delivery::AtLeastOnce => {
                if let Some((producer, watch)) = &self.plain {
                    txn::flush(producer, self.unreachable())?;
                    watch.check()?;
                }
            }
            Delivery::None => {
                if let Some((producer, _)) = &self.plain {
                    producer.poll(Duration::ZERO);
                }
            }
        }
        Ok(sink_state::encode(
            self.subtask,
            self.opened_after,
            &self.pending,
        ))
    }

    fn commit(&mut self, checkpoint_id: u64) -> Result<(), SinkError> {
        // Moved out rather than copied (they hold an interval's records);
        // put back on an error, so that a retry finds them.
        let later = self.pending.split_off(&checkpoint_id.saturating_add(1));
        let mut due = std::mem::replace(&mut self.pending, later);
        if due.is_empty() {
            return Ok(());
        }
        tracing::debug!(
            checkpoint_id,
            ids = ?due.values().map(|pending| pending.id.as_str()).collect::<Vec<_>>(),
            "Kafka sink commit"
        );
        let finished = self.finish_pending(&due);
        if finished.is_err() {
            self.pending.append(&mut due);
        }
        self.report_pending();
        finished?;
        if self.gate.is_open() {
            self.send_held()?;
        }
        Ok(())
    }

    fn abort(&mut self) -> Result<(), SinkError> {
        self.held_from = 0;
        if let Some(txn) = self.open.take() {
            txn::abort_flushed(&txn.producer, self.timeout())?;
        }
        Ok(())
    }

    fn restore(&mut self, state: Option<&SinkState>) -> Result<(), SinkError> {
        if self.config.delivery != Delivery::ExactlyOnce {
            return Ok(());
        }
        if !self.live {
            registry::add_live(&self.prefix);
            self.live = true;
        }
        let restored = self.restore_exactly_once(state);
        // Whatever happened, this subtask no longer holds the others'
        // records back.
        self.gate.set_restoring(self.subtask, false);
        restored
    }

    fn check_restore(
        &mut self,
        restored: Option<u64>,
        state: Option<&SinkState>,
    ) -> Result<Visibility, SinkError> {
        // Bytes this sink did not write fail the start here, before any
        // actor runs.
        let decoded = match state {
            Some(state) => Some(sink_state::decode(state, self.subtask)?),
            None => None,
        };
        if self.config.delivery != Delivery::ExactlyOnce {
            return Ok(Visibility::Unknown);
        }
        // Without a restored checkpoint, the marker may be an earlier
        // run's (a job started again on an empty store): it says nothing
        // about this run.
        let Some(restored) = restored else {
            self.gate.set_restoring(self.subtask, false);
            return Ok(Visibility::Unknown);
        };
        // Every subtask's check runs before any restore: so the dead
        // process's transactions of all subtasks end before any restore
        // reads its marker (see `unblock`).
        // A subtask that runs in this process (another region restores)
        // keeps its transactions and reads no marker.
        let reads_marker = match &decoded {
            Some(decoded) if !registry::is_live(&self.prefix) => {
                unblock::end_dead(&self.config, &self.prefix, decoded)?;
                decoded
                    .pending
                    .values()
                    .any(|pending| !registry::holds(&pending.id))
            }
            _ => false,
        };
        self.gate.set_restoring(self.subtask, reads_marker);
        if reads_marker {
            self.gate.need_nudge();
        }
        let marker = self.marker()?.read()?;
        Ok(Visibility::Known(match marker {
            Some(marker) if marker.checkpoint_id > restored => vec![marker.checkpoint_id],
            _ => Vec::new(),
        }))
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        // Only the final checkpoint is left: nothing to open ahead for.
        self.ended = true;
        if let Some((producer, watch)) = &self.plain {
            txn::flush(producer, self.unreachable())?;
            watch.check()?;
        }
        Ok(())
    }

    fn bytes_written(&self) -> Option<u64> {
        Some(self.bytes_written)
    }

    fn guarantee(&self) -> Guarantee {
        match self.config.delivery {
            Delivery::ExactlyOnce => Guarantee::ExactlyOnce,
            Delivery::AtLeastOnce | Delivery::None => Guarantee::AtLeastOnce,
        }
    }
}

impl<T, S> Drop for KafkaSink<T, S> {
    fn drop(&mut self) {
        // The open transaction is not in any checkpoint: the broker may
        // drop it now rather than at its time-out. Errors are moot here
        // (a restore fences the id anyway).
        if let Some(txn) = self.open.take() {
            // Long enough for a busy broker: a record that reached it
            // after the abort would block the partition on tansu (see
            // `txn::abort_flushed`); the drop runs on the thread that
            // stops a failed generation, not on an actor.
            let wait_ms = self.config.request_timeout_ms.min(DROP_FLUSH_MAX_MS);
            let _ = txn::abort_flushed(&txn.producer, Duration::from_millis(wait_ms));
        }
        if self.live {
            registry::remove_live(&self.prefix);
        }
        self.gate.report_pending(self.reported_pending, 0);
        self.reported_pending = 0;
    }
}
