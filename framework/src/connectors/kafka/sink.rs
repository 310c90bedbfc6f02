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
//!   `snapflow.<job>.<operator>`. It is opened lazily, by the first record
//!   after `n`, with its own producer.
//! - **Pre-commit** at checkpoint `m`: the open transaction is flushed
//!   (every record acknowledged by the broker, still uncommitted) and
//!   filed under `m`; the sink state lists every pending `(m, id)` and the
//!   name of the next transaction.
//! - **Commit** when checkpoint `m` completes: `commit_transaction` for
//!   every pending one up to `m`, in order.
//! - **Restore** from a checkpoint that lists pending transactions: each
//!   is committed with the producer that opened it, which this process
//!   keeps in a table when a sink fails (librdkafka cannot resume a
//!   transaction from another producer object: a new producer with the
//!   same id aborts it). Then every other pre-committed transaction of
//!   the subtask still in the table is aborted, and the ids
//!   `<prefix>-<subtask>-<n>` to `<n + fence_ahead>` are fenced (a
//!   producer initialises each, which makes the broker abort whatever
//!   transaction a dead incarnation left open under it).
//! - **Headers.** Every record carries the header [`TXN_HEADER`]:
//!   `<transactional id>#<incarnation nonce>`, and the factory's
//!   [`CommitLog`] lists the header values of the transactions this
//!   process committed. A reader that cannot rely on the broker hiding
//!   aborted records (the test broker, tansu 0.6, does not) can keep
//!   exactly the committed ones.
//!
//! **Known gap: a process crash between a checkpoint's completion and its
//! commit.** The new process has no producer for the pending
//! transaction, so it cannot commit it; initialising a producer with its
//! id aborts it if it is still open (and changes nothing if it was
//! committed). The output of that one checkpoint interval is then lost.
//! A Kafka broker that hides aborted records from `read_committed`
//! readers would let the restore tell the two cases apart; this sink
//! does not check yet, counts such transactions in
//! [`CommitLog::unverified`] and logs a warning. Flink closes the gap by
//! resuming the transaction with its producer id and epoch, which
//! librdkafka's API does not offer.
//!
//! `check_restore` confirms that each listed transaction is still held by
//! this process when it is, and otherwise cannot see the broker's
//! transaction state: it answers [`Visibility::Unknown`], so the job
//! refuses a fallback past a damaged checkpoint rather than risk
//! duplicates.
//!
//! # At-least-once and none
//!
//! [`Delivery::AtLeastOnce`]: an idempotent producer, flushed at every
//! pre-commit (records are visible at once; a replay after a restore
//! writes them again). [`Delivery::None`]: records are sent and not
//! waited for (a failure can lose them).
//!
//! # Errors
//!
//! A broker that is away or times out gives retryable errors (the job
//! restarts per its strategy); a fenced producer, a missing topic or a
//! bad setting does not. Nothing committed is lost and nothing is
//! committed twice by a retry: commits are in checkpoint order and a
//! committed transaction leaves the pending list.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::consumer::BaseConsumer;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;

use super::bytes::{put_str, Reader};
use super::error::{code_is_retryable, KafkaError};
use super::{client_config, partition_counts, registry};
use crate::sink::{Guarantee, Sink, SinkError, SinkFactory, SinkState, Visibility};

/// The header every exactly-once record carries: its transaction's id
/// and the producing incarnation, `<transactional id>#<nonce>`.
pub const TXN_HEADER: &str = "snapflow-txn";

/// The sink state's format byte (`K`).
const STATE_FORMAT: u8 = b'K';

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

/// One record to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaOut {
    /// The key (it also chooses the partition when `partition` is None).
    pub key: Option<Vec<u8>>,
    /// The value.
    pub value: Vec<u8>,
    /// A partition to write to, or `None` for the producer's partitioner.
    pub partition: Option<i32>,
}

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
    /// is aborted by the broker. It must be longer than the checkpoint
    /// interval.
    pub transaction_timeout_ms: u64,
    /// The job's checkpoint interval, for the check above; `None` skips
    /// it.
    pub checkpoint_interval_ms: Option<u64>,
    /// How many ids past the restored checkpoint a restore fences.
    pub fence_ahead: u64,
    /// How long a flush, commit or metadata request may take before it
    /// fails (retryably).
    pub request_timeout_ms: u64,
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
            checkpoint_interval_ms: None,
            fence_ahead: 2,
            request_timeout_ms: 30_000,
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
    unverified: Arc<AtomicU64>,
}

impl CommitLog {
    /// The header values of the committed transactions (the newest
    /// [`COMMIT_LOG_MAX`]), in commit order.
    pub fn committed(&self) -> Vec<String> {
        self.lock().iter().cloned().collect()
    }

    /// Pending transactions a restore could neither commit nor confirm
    /// (see the module's known gap); 0 when every restore found them.
    pub fn unverified(&self) -> u64 {
        self.unverified.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<String>> {
        self.committed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn push(&self, header: String) {
        let mut log = self.lock();
        if log.len() == COMMIT_LOG_MAX {
            log.pop_front();
        }
        log.push_back(header);
    }
}

/// Delivery failures a producer's callback saw.
#[derive(Default)]
pub(crate) struct DeliveryWatch {
    failed: AtomicU64,
    first: Mutex<Option<(String, bool)>>,
}

impl DeliveryWatch {
    /// The failures since the last check, as an error.
    fn check(&self) -> Result<(), KafkaError> {
        let failed = self.failed.swap(0, Ordering::AcqRel);
        if failed == 0 {
            return Ok(());
        }
        let first = self
            .first
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
            .unwrap_or_else(|| ("unknown".to_owned(), true));
        Err(KafkaError::Delivery {
            failed,
            first: first.0,
            retryable: first.1,
        })
    }
}

/// The producer context: it counts failed deliveries.
#[derive(Clone)]
pub(crate) struct WatchContext(Arc<DeliveryWatch>);

impl ClientContext for WatchContext {}

impl ProducerContext for WatchContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((error, _)) = result {
            let retryable = error.rdkafka_error_code().is_some_and(code_is_retryable);
            self.0.failed.fetch_add(1, Ordering::AcqRel);
            let mut first = self
                .0
                .first
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            first.get_or_insert_with(|| (error.to_string(), retryable));
        }
    }
}

type Producer_ = BaseProducer<WatchContext>;

/// One transaction and the producer that opened it.
pub(crate) struct Txn {
    pub(crate) id: String,
    /// The value of [`TXN_HEADER`] on its records.
    header: String,
    producer: Producer_,
    watch: Arc<DeliveryWatch>,
    records: u64,
}

fn nonce() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn producer(
    config: &KafkaSinkConfig,
    transactional_id: Option<&str>,
) -> Result<(Producer_, Arc<DeliveryWatch>), KafkaError> {
    let mut client = client_config(&config.brokers);
    let message_timeout_ms = config.request_timeout_ms.min(config.transaction_timeout_ms);
    client
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", message_timeout_ms.to_string())
        .set("linger.ms", "5");
    if let Some(id) = transactional_id {
        client.set("transactional.id", id).set(
            "transaction.timeout.ms",
            config.transaction_timeout_ms.to_string(),
        );
    }
    for (key, value) in &config.client_options {
        client.set(key, value);
    }
    let watch = Arc::new(DeliveryWatch::default());
    let producer = client
        .create_with_context(WatchContext(Arc::clone(&watch)))
        .map_err(|source| KafkaError::client("creating a producer", source))?;
    Ok((producer, watch))
}

/// Opens the transaction `id` with a new producer (which fences and
/// aborts whatever another producer left open under it).
fn open_txn(config: &KafkaSinkConfig, id: String) -> Result<Txn, KafkaError> {
    let (producer, watch) = producer(config, Some(&id))?;
    let timeout = Duration::from_millis(config.request_timeout_ms);
    producer
        .init_transactions(timeout)
        .map_err(|source| KafkaError::client("init_transactions", source))?;
    producer
        .begin_transaction()
        .map_err(|source| KafkaError::client("begin_transaction", source))?;
    Ok(Txn {
        header: format!("{id}#{}", nonce()),
        id,
        producer,
        watch,
        records: 0,
    })
}

/// Makes the broker abort any transaction left open under `id`.
fn fence(config: &KafkaSinkConfig, id: &str) -> Result<(), KafkaError> {
    let (producer, _) = producer(config, Some(id))?;
    producer
        .init_transactions(Duration::from_millis(config.request_timeout_ms))
        .map_err(|source| KafkaError::client("init_transactions (fencing)", source))
}

/// Builds the Kafka sink of each subtask. See the
/// [module documentation](self).
pub struct KafkaSinkFactory<T, S> {
    config: Arc<KafkaSinkConfig>,
    serialize: Arc<S>,
    log: CommitLog,
    _records: std::marker::PhantomData<fn(&T)>,
}

impl<T, S> KafkaSinkFactory<T, S>
where
    S: Fn(&T) -> KafkaOut + Send + Sync + 'static,
{
    /// A factory writing `config.topic` through `serialize`; it checks now
    /// the settings, that a broker answers and that the topic exists.
    ///
    /// # Errors
    ///
    /// [`KafkaError::TransactionTimeoutTooShort`],
    /// [`KafkaError::InvalidConfig`], [`KafkaError::BrokerUnreachable`],
    /// [`KafkaError::UnknownTopic`].
    pub fn new(config: KafkaSinkConfig, serialize: S) -> Result<Self, KafkaError> {
        if let Some(interval_ms) = config.checkpoint_interval_ms {
            if config.delivery == Delivery::ExactlyOnce
                && config.transaction_timeout_ms <= interval_ms
            {
                return Err(KafkaError::TransactionTimeoutTooShort {
                    transaction_timeout_ms: config.transaction_timeout_ms,
                    checkpoint_interval_ms: interval_ms,
                });
            }
        }
        if config.request_timeout_ms == 0 {
            return Err(KafkaError::InvalidConfig {
                setting: "request_timeout_ms",
                reason: "must be above 0".to_owned(),
            });
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
            log: CommitLog::default(),
            _records: std::marker::PhantomData,
        })
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

    fn create(&self, subtask: usize, _parallelism: usize) -> Result<Self::Sink, SinkError> {
        Ok(KafkaSink {
            prefix: format!("{}-{subtask}-", self.config.prefix()),
            config: Arc::clone(&self.config),
            serialize: Arc::clone(&self.serialize),
            log: self.log.clone(),
            subtask,
            opened_after: 0,
            open: None,
            pending: BTreeMap::new(),
            plain: None,
            _records: std::marker::PhantomData,
        })
    }
}

/// The sink of one subtask. See the [module documentation](self).
pub struct KafkaSink<T, S> {
    config: Arc<KafkaSinkConfig>,
    serialize: Arc<S>,
    log: CommitLog,
    subtask: usize,
    /// `<prefix>-<subtask>-`: every transactional id of this subtask.
    prefix: String,
    /// The checkpoint the next transaction is named after.
    opened_after: u64,
    open: Option<Txn>,
    /// Pre-committed transactions by checkpoint id: their ids. The
    /// producers wait in the process table ([`registry`]), so that the
    /// next incarnation finds them even if this sink is never dropped
    /// cleanly.
    pending: BTreeMap<u64, String>,
    /// The producer of the at-least-once and none modes.
    plain: Option<(Producer_, Arc<DeliveryWatch>)>,
    _records: std::marker::PhantomData<fn(&T)>,
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

/// Sends one record, serving delivery callbacks while the local queue is
/// full, for at most `timeout`.
fn send(
    producer: &Producer_,
    topic: &str,
    out: &KafkaOut,
    header: Option<&str>,
    timeout: Duration,
) -> Result<(), KafkaError> {
    let mut record = BaseRecord::<Vec<u8>, Vec<u8>>::to(topic).payload(&out.value);
    if let Some(key) = &out.key {
        record = record.key(key);
    }
    if let Some(partition) = out.partition {
        record = record.partition(partition);
    }
    if let Some(header) = header {
        record = record.headers(OwnedHeaders::new().insert(Header {
            key: TXN_HEADER,
            value: Some(header),
        }));
    }
    let deadline = Instant::now() + timeout;
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((error, back))
                if error.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull)
                    && Instant::now() < deadline =>
            {
                record = back;
                producer.poll(Duration::from_millis(5));
            }
            Err((error, _)) => return Err(KafkaError::client("producing", error)),
        }
    }
}

impl<T, S> KafkaSink<T, S>
where
    S: Fn(&T) -> KafkaOut + Send + Sync + 'static,
{
    fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.request_timeout_ms)
    }

    fn id_after(&self, checkpoint_id: u64) -> String {
        format!("{}{checkpoint_id}", self.prefix)
    }

    fn commit_parked(&self, checkpoint_id: u64, id: &str) -> Result<(), KafkaError> {
        let Some(txn) = registry::take(id) else {
            // Committed earlier by this process (the log has it), or
            // left by a process that died: see the module's known gap.
            if !self
                .log
                .lock()
                .iter()
                .any(|header| header.starts_with(&format!("{id}#")))
            {
                tracing::warn!(
                    id,
                    checkpoint_id,
                    "a pending Kafka transaction is not held by this process; it is fenced, \
                     and its output is lost if it was not committed before the crash"
                );
                self.log.unverified.fetch_add(1, Ordering::Relaxed);
                fence(&self.config, id)?;
            }
            return Ok(());
        };
        match txn.producer.commit_transaction(self.timeout()) {
            Ok(()) => {
                self.log.push(txn.header.clone());
                Ok(())
            }
            Err(source) => {
                let error = KafkaError::client("commit_transaction", source);
                if error.is_retryable() {
                    // Still pending: a later commit or restore tries again.
                    registry::park(txn);
                }
                Err(error)
            }
        }
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
        let timeout = self.timeout();
        match self.config.delivery {
            Delivery::ExactlyOnce => {
                if self.open.is_none() {
                    let id = self.id_after(self.opened_after);
                    self.open = Some(open_txn(&self.config, id)?);
                }
                let Some(txn) = self.open.as_mut() else {
                    return Err(SinkError::Misuse {
                        reason: "no open transaction after opening one".to_owned(),
                    });
                };
                for record in batch {
                    let out = (self.serialize)(record);
                    send(
                        &txn.producer,
                        &self.config.topic,
                        &out,
                        Some(&txn.header),
                        timeout,
                    )?;
                }
                txn.records += batch.len() as u64;
                txn.producer.poll(Duration::ZERO);
                txn.watch.check()?;
            }
            Delivery::AtLeastOnce | Delivery::None => {
                if self.plain.is_none() {
                    self.plain = Some(producer(&self.config, None)?);
                }
                let Some((producer, watch)) = &self.plain else {
                    return Err(SinkError::Misuse {
                        reason: "no producer after making one".to_owned(),
                    });
                };
                for record in batch {
                    let out = (self.serialize)(record);
                    send(producer, &self.config.topic, &out, None, timeout)?;
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
                if let Some(txn) = self.open.take() {
                    txn.producer
                        .flush(self.timeout())
                        .map_err(|source| KafkaError::client("flush", source))?;
                    txn.watch.check()?;
                    self.pending.insert(checkpoint_id, txn.id.clone());
                    registry::park(txn);
                }
                self.opened_after = checkpoint_id;
            }
            Delivery::AtLeastOnce => {
                if let Some((producer, watch)) = &self.plain {
                    producer
                        .flush(self.timeout())
                        .map_err(|source| KafkaError::client("flush", source))?;
                    watch.check()?;
                }
            }
            Delivery::None => {
                if let Some((producer, _)) = &self.plain {
                    producer.poll(Duration::ZERO);
                }
            }
        }
        Ok(encode_state(self.subtask, self.opened_after, &self.pending))
    }

    fn commit(&mut self, checkpoint_id: u64) -> Result<(), SinkError> {
        while let Some((&pending_id, id)) = self.pending.first_key_value() {
            if pending_id > checkpoint_id {
                break;
            }
            let id = id.clone();
            self.commit_parked(pending_id, &id)?;
            self.pending.remove(&pending_id);
        }
        Ok(())
    }

    fn abort(&mut self) -> Result<(), SinkError> {
        if let Some(txn) = self.open.take() {
            txn.producer
                .abort_transaction(self.timeout())
                .map_err(|source| KafkaError::client("abort_transaction", source))?;
        }
        Ok(())
    }

    fn restore(&mut self, state: Option<&SinkState>) -> Result<(), SinkError> {
        if self.config.delivery != Delivery::ExactlyOnce {
            return Ok(());
        }
        let (opened_after, listed) = match state {
            Some(state) => decode_state(state, self.subtask)?,
            None => (0, BTreeMap::new()),
        };
        for (&checkpoint_id, id) in &listed {
            self.commit_parked(checkpoint_id, id)?;
        }
        // Pre-committed after the restored checkpoint, by an incarnation
        // of this process that failed: never to be committed.
        for txn in registry::take_prefixed(&self.prefix) {
            if let Err(error) = txn.producer.abort_transaction(self.timeout()) {
                tracing::warn!(id = %txn.id, %error, "aborting a left-over Kafka transaction failed; fencing it");
                fence(&self.config, &txn.id)?;
            }
        }
        // Open (or pre-committed) transactions of an incarnation that
        // died in another process.
        for after in opened_after..=opened_after.saturating_add(self.config.fence_ahead) {
            fence(&self.config, &self.id_after(after))?;
        }
        self.opened_after = opened_after;
        Ok(())
    }

    fn check_restore(
        &mut self,
        _restored: Option<u64>,
        state: Option<&SinkState>,
    ) -> Result<Visibility, SinkError> {
        if let Some(state) = state {
            // Bytes this sink did not write fail the start here, before
            // any actor runs.
            let (_, listed) = decode_state(state, self.subtask)?;
            for id in listed.values() {
                if !registry::contains(id) {
                    tracing::debug!(id, "a listed Kafka transaction is not held by this process");
                }
            }
        }
        Ok(Visibility::Unknown)
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        if let Some((producer, watch)) = &self.plain {
            producer
                .flush(self.timeout())
                .map_err(|source| KafkaError::client("flush", source))?;
            watch.check()?;
        }
        Ok(())
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
            let _ = txn.producer.abort_transaction(Duration::from_millis(1_000));
        }
    }
}

/// Layout (little-endian): `K`, subtask `u32`, next name `u64`, count
/// `u32`, then per pending transaction its checkpoint id `u64`, the id's
/// length `u16` and UTF-8 bytes.
fn encode_state(subtask: usize, opened_after: u64, pending: &BTreeMap<u64, String>) -> SinkState {
    let mut bytes = Vec::with_capacity(17 + pending.len() * 64);
    bytes.push(STATE_FORMAT);
    bytes.extend_from_slice(&u32::try_from(subtask).unwrap_or(u32::MAX).to_le_bytes());
    bytes.extend_from_slice(&opened_after.to_le_bytes());
    bytes.extend_from_slice(
        &u32::try_from(pending.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    for (checkpoint_id, id) in pending {
        bytes.extend_from_slice(&checkpoint_id.to_le_bytes());
        put_str(&mut bytes, id);
    }
    SinkState::from_bytes(bytes)
}

/// Reads [`encode_state`]'s bytes; checks every length before it
/// allocates.
fn decode_state(
    state: &SinkState,
    subtask: usize,
) -> Result<(u64, BTreeMap<u64, String>), SinkError> {
    let malformed = |reason: &str| SinkError::MalformedState {
        reason: format!("Kafka sink state: {reason}"),
    };
    let mut reader = Reader::new(state.as_bytes());
    if reader.u8().map_err(malformed)? != STATE_FORMAT {
        return Err(malformed("not written by the Kafka sink"));
    }
    let found = reader.u32().map_err(malformed)?;
    if found as usize != subtask {
        return Err(SinkError::WrongSubtask {
            expected: subtask,
            found,
        });
    }
    let opened_after = reader.u64().map_err(malformed)?;
    let count = reader.u32().map_err(malformed)?;
    let mut pending = BTreeMap::new();
    for _ in 0..count {
        let checkpoint_id = reader.u64().map_err(malformed)?;
        pending.insert(checkpoint_id, reader.str().map_err(malformed)?);
    }
    reader.finish().map_err(malformed)?;
    Ok((opened_after, pending))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_round_trips_and_hostile_bytes_are_typed_errors() {
        let mut pending = BTreeMap::new();
        pending.insert(4, "snapflow.j.out-1-2".to_owned());
        pending.insert(5, "snapflow.j.out-1-4".to_owned());
        let state = encode_state(1, 5, &pending);
        assert_eq!(decode_state(&state, 1).expect("decodes"), (5, pending));
        assert!(matches!(
            decode_state(&state, 0),
            Err(SinkError::WrongSubtask { .. })
        ));
        let bytes = state.as_bytes();
        for cut in 0..bytes.len() {
            let cut_state = SinkState::from_bytes(bytes[..cut].to_vec());
            assert!(decode_state(&cut_state, 1).is_err(), "cut at {cut}");
        }
        let huge = [
            vec![STATE_FORMAT],
            vec![1, 0, 0, 0],
            vec![0; 8],
            u32::MAX.to_le_bytes().to_vec(),
        ]
        .concat();
        assert!(decode_state(&SinkState::from_bytes(huge), 1).is_err());
    }
}
