//! The exactly-once sink's producers: creating one per transaction,
//! opening its transaction, fencing an id, sending records and waiting
//! for their acknowledgements.
//!
//! This module owns how the connector talks to librdkafka's transactional
//! producer, and the two places where doing that the obvious way was
//! slow: fencing several ids one after another (each is an
//! `init_transactions` round trip, about 100 ms on the test broker), and
//! `Producer::flush` of rdkafka 0.39, which waits in slices of 100 ms
//! that always run to their end. It never decides which transaction to
//! open, commit or abort (the sink and [`recover`](super::recover) do).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{
    BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext, PurgeConfig,
};
use rdkafka::types::RDKafkaErrorCode;

use super::error::{code_is_retryable, KafkaError};
use super::sink::{KafkaOut, KafkaSinkConfig, TXN_HEADER};
use super::{client_config, registry};

/// Delivery failures a producer's callback saw.
#[derive(Default)]
pub(crate) struct DeliveryWatch {
    failed: AtomicU64,
    first: Mutex<Option<(String, bool)>>,
}

impl DeliveryWatch {
    /// The failures since the last check, as an error.
    pub(crate) fn check(&self) -> Result<(), KafkaError> {
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

pub(crate) type Producer_ = BaseProducer<WatchContext>;

/// One transaction and the producer that opened it.
pub(crate) struct Txn {
    pub(crate) id: String,
    /// The value of [`TXN_HEADER`] on its records: `<id>#<nonce>`.
    pub(crate) header: String,
    /// The attempt's nonce (see [`nonce`]).
    pub(crate) nonce: u64,
    pub(crate) producer: Producer_,
    pub(crate) watch: Arc<DeliveryWatch>,
    /// What was sent into it, kept until it is pre-committed (then the
    /// sink state holds them) so that a restore can write them again.
    pub(crate) records: Vec<KafkaOut>,
}

/// A number for one transaction attempt: distinct, as far as 23 random
/// bits go, from every other attempt under the same transactional id,
/// in this process or another (the commit marker stores it).
fn nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
    if let Ok(since) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(since.as_nanos());
    }
    hasher.finish() & super::marker::NONCE_MASK
}

pub(crate) fn producer(
    config: &KafkaSinkConfig,
    transactional_id: Option<&str>,
) -> Result<(Producer_, Arc<DeliveryWatch>), KafkaError> {
    let mut client = client_config(&config.brokers);
    // A record waits in librdkafka, retried, for as long as its
    // transaction can live (librdkafka allows no longer): a slow broker
    // must slow the job down, not fail it, and the sink's own waits
    // (`send`, `flush`) say when the broker is unreachable. Without a
    // transaction nothing limits it but those waits (0: no limit).
    // Before, this was the request time-out, and a broker slower than
    // that failed the job with `MessageTimedOut`.
    let message_timeout_ms = match transactional_id {
        Some(_) => config.transaction_timeout_ms,
        None => 0,
    };
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
pub(crate) fn open_txn(config: &KafkaSinkConfig, id: String) -> Result<Txn, KafkaError> {
    let (producer, watch) = producer(config, Some(&id))?;
    ask_until_unreachable(config, "init_transactions", |timeout| {
        producer.init_transactions(timeout)
    })?;
    producer
        .begin_transaction()
        .map_err(|source| KafkaError::client("begin_transaction", source))?;
    let nonce = nonce();
    Ok(Txn {
        header: format!("{id}#{nonce}"),
        nonce,
        id,
        producer,
        watch,
        records: Vec::new(),
    })
}

/// Aborts `producer`'s open transaction once nothing of it is on the
/// way to the broker: records not yet sent are dropped, and those sent
/// are waited for (at most `timeout`).
///
/// Why not `abort_transaction` alone: librdkafka sends the abort to the
/// transaction coordinator while records may still be on their way to
/// the partition leader, and tansu 0.6 files a record that comes after
/// the abort under the ended transaction, which then holds back every
/// later commit in that partition for good (seen in its metadata:
/// an aborted transaction that still lists records).
///
/// # Errors
///
/// [`KafkaError::Client`] when the records are not acknowledged in time
/// (then nothing is aborted: a restore fences the id) or the abort
/// fails.
pub(crate) fn abort_flushed(producer: &Producer_, timeout: Duration) -> Result<(), KafkaError> {
    producer.purge(PurgeConfig::default().queue());
    flush(producer, timeout)?;
    producer
        .abort_transaction(timeout)
        .map_err(|source| KafkaError::client("abort_transaction", source))
}

/// Makes the broker abort any transaction left open under `id`.
pub(crate) fn fence(config: &KafkaSinkConfig, id: &str) -> Result<(), KafkaError> {
    let (producer, _) = producer(config, Some(id))?;
    producer
        .init_transactions(Duration::from_millis(config.request_timeout_ms))
        .map_err(|source| KafkaError::client("init_transactions (fencing)", source))
}

/// Sends one record. While librdkafka's queue is full (the broker is
/// slower than the job), it serves delivery callbacks and waits: the
/// job slows down to the broker's pace (backpressure). It gives up only
/// when the broker acknowledged nothing for `stalled` (it is
/// unreachable): [`KafkaError::Client`] with `QueueFull`, retryable.
///
/// # Errors
///
/// As above; [`KafkaError::BadTimestamp`] for a timestamp past
/// `i64::MAX`; librdkafka's error for anything else.
pub(crate) fn send(
    producer: &Producer_,
    topic: &str,
    out: &KafkaOut,
    header: Option<&str>,
    stalled: Duration,
) -> Result<(), KafkaError> {
    let mut record = BaseRecord::<Vec<u8>, Vec<u8>>::to(topic).payload(&out.value);
    if let Some(key) = &out.key {
        record = record.key(key);
    }
    if let Some(partition) = out.partition {
        record = record.partition(partition);
    }
    if let Some(timestamp_ms) = out.timestamp_ms {
        let timestamp_ms =
            i64::try_from(timestamp_ms).map_err(|_| KafkaError::BadTimestamp { timestamp_ms })?;
        record = record.timestamp(timestamp_ms);
    }
    if let Some(header) = header {
        record = record.headers(OwnedHeaders::new().insert(Header {
            key: TXN_HEADER,
            value: Some(header),
        }));
    }
    let mut progress = Progress::new(producer, stalled);
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((error, back))
                if error.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull)
                    && progress.goes_on(producer) =>
            {
                record = back;
                producer.poll(Duration::from_millis(5));
            }
            Err((error, _)) => return Err(KafkaError::client("producing", error)),
        }
    }
}

/// Whether a producer's records still move: the count of records
/// librdkafka holds (queued or waiting for an acknowledgement) fell, or
/// did within the last `stalled`. A broker that acknowledges anything is
/// busy, not gone.
struct Progress {
    stalled: Duration,
    lowest: i32,
    since: Instant,
}

impl Progress {
    fn new(producer: &Producer_, stalled: Duration) -> Progress {
        Progress {
            stalled,
            lowest: producer.in_flight_count(),
            since: Instant::now(),
        }
    }

    /// Whether to wait on: the records moved within the last `stalled`.
    fn goes_on(&mut self, producer: &Producer_) -> bool {
        let now = producer.in_flight_count();
        if now < self.lowest {
            self.lowest = now;
            self.since = Instant::now();
        }
        self.since.elapsed() < self.stalled
    }
}

/// Asks the broker through `request`, each time for at most
/// `config.request_timeout_ms`, again and again while it answers with an
/// error librdkafka says may be retried (a time-out: a busy or briefly
/// stopped broker), until `config.unreachable_timeout_ms` has passed
/// since the first ask. Every transactional call of librdkafka
/// (`init_transactions`, `send_offsets_to_transaction`,
/// `commit_transaction`) may be called again after such an error and
/// goes on where it was.
///
/// # Errors
///
/// [`KafkaError::Client`] for `operation`: the last error once the time
/// is up, or at once an error that is not retriable.
pub(crate) fn ask_until_unreachable(
    config: &KafkaSinkConfig,
    operation: &'static str,
    mut request: impl FnMut(Duration) -> rdkafka::error::KafkaResult<()>,
) -> Result<(), KafkaError> {
    let timeout = Duration::from_millis(config.request_timeout_ms);
    let deadline = Instant::now() + Duration::from_millis(config.unreachable_timeout_ms);
    loop {
        let asked = Instant::now();
        match request(timeout) {
            Ok(()) => return Ok(()),
            Err(rdkafka::error::KafkaError::Transaction(error))
                if error.is_retriable() && Instant::now() < deadline =>
            {
                tracing::debug!(operation, %error, "the Kafka broker is slow; asking again");
                // An error that came at once (no broker to connect to)
                // is not asked again in a tight loop.
                if asked.elapsed() < RETRY_PAUSE {
                    std::thread::sleep(RETRY_PAUSE);
                }
            }
            Err(source) => return Err(KafkaError::client(operation, source)),
        }
    }
}

/// The least time between two asks of [`ask_until_unreachable`].
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Starts opening the transaction `id` on a thread of its own, for the
/// sink to take with [`take_ahead`] when its first record comes: opening
/// one is an `init_transactions` round trip that takes 60 ms, and on the
/// test broker often 510 ms (librdkafka retries its coordinator after a
/// fixed 500 ms when the new producer's connection to it is not up
/// yet), which the sink's actor thread (and every operator on its
/// arbiter) would otherwise wait for once per checkpoint interval.
///
/// The opening waits in the process table ([`registry`]); a restore of
/// the subtask waits for every opening of its ids first
/// ([`settle_ahead`]), so that none initialises an id after the restore
/// did. When no thread can be started, nothing is opened ahead (the
/// first record opens it, as without this).
pub(crate) fn open_ahead(config: &Arc<KafkaSinkConfig>, id: String) {
    if !registry::room_for_opening() {
        return;
    }
    let config = Arc::clone(config);
    let opened = id.clone();
    let spawned = std::thread::Builder::new()
        .name("snapflow-kafka-open".to_owned())
        .spawn(move || open_txn(&config, opened));
    match spawned {
        Ok(handle) => registry::put_opening(id, handle),
        Err(error) => {
            tracing::warn!(%id, %error, "no thread to open a Kafka transaction ahead; the first record opens it");
        }
    }
}

/// The transaction `id` if [`open_ahead`] opened it, once the opening
/// ended (its error, if it failed); `None` when it was not opened ahead
/// or its thread panicked.
pub(crate) fn take_ahead(id: &str) -> Option<Result<Txn, KafkaError>> {
    let handle = registry::take_opening(id)?;
    match handle.join() {
        Ok(opened) => Some(opened),
        Err(_) => {
            tracing::warn!(%id, "opening a Kafka transaction ahead panicked; opening it again");
            None
        }
    }
}

/// Waits for every opening ahead of ids that start with `prefix` and
/// drops what they opened (their transactions hold no record).
pub(crate) fn settle_ahead(prefix: &str) {
    for handle in registry::take_openings_prefixed(prefix) {
        let _ = handle.join();
    }
}

/// The most fences [`fence_all`] runs at once.
const FENCES_AT_ONCE: usize = 8;

/// Fences every id of `ids`, up to [`FENCES_AT_ONCE`] at a time on
/// threads of their own, and returns when all are done: they do not
/// depend on each other, and one after another they cost one round trip
/// each.
///
/// # Errors
///
/// The first id's error, in the order of `ids`, when any fence fails
/// (the others still ran to their end).
pub(crate) fn fence_all(config: &KafkaSinkConfig, ids: &[String]) -> Result<(), KafkaError> {
    for chunk in ids.chunks(FENCES_AT_ONCE) {
        let results: Vec<Result<(), KafkaError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|id| scope.spawn(move || fence(config, id)))
                .collect();
            handles
                .into_iter()
                .map(|handle| {
                    handle
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        });
        results.into_iter().collect::<Result<(), KafkaError>>()?;
    }
    Ok(())
}

/// Opens the transaction `open` while [`fence_all`] fences `others`, and
/// returns it when both are done (a restore's first transaction and the
/// ids after it: opening one fences it too).
///
/// # Errors
///
/// The opening's error first, then the fences'.
pub(crate) fn open_and_fence(
    config: &KafkaSinkConfig,
    open: String,
    others: &[String],
) -> Result<Txn, KafkaError> {
    let (opened, fenced) = std::thread::scope(|scope| {
        let opening = scope.spawn(move || open_txn(config, open));
        let fenced = fence_all(config, others);
        let opened = opening
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (opened, fenced)
    });
    let txn = opened?;
    fenced?;
    Ok(txn)
}

/// Waits until the broker acknowledged every record `producer` holds,
/// serving delivery callbacks meanwhile, for as long as the broker
/// acknowledges records: it gives up when none was acknowledged for
/// `stalled` (the broker is unreachable), not after a fixed time, so
/// that a slow broker's backlog slows the job down instead of failing
/// it (before, a pre-commit failed with `OperationTimedOut` after the
/// request time-out however fast the records went).
///
/// Why not `Producer::flush(timeout)`: rdkafka 0.39 flushes by polling
/// in slices of 100 ms, and its poll runs each slice to the end even
/// when the last acknowledgement came at once, so every flush that did
/// not finish immediately took at least 100 ms (measured: 100.1 to
/// 101.4 ms for every pre-commit in `kafka_pipeline`). This asks
/// librdkafka without waiting and polls for 1 ms between the asks.
///
/// # Errors
///
/// [`KafkaError::Client`] (retryable) when the broker stalls for
/// `stalled`, or librdkafka's error.
pub(crate) fn flush(producer: &Producer_, stalled: Duration) -> Result<(), KafkaError> {
    let mut progress = Progress::new(producer, stalled);
    loop {
        match producer.flush(Duration::ZERO) {
            Ok(()) => return Ok(()),
            Err(source)
                if source.rdkafka_error_code() == Some(RDKafkaErrorCode::OperationTimedOut)
                    && progress.goes_on(producer) =>
            {
                producer.poll(Duration::from_millis(1));
            }
            Err(source) => return Err(KafkaError::client("flush", source)),
        }
    }
}
