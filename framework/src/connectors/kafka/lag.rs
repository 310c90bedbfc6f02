//! The Kafka source's lag probe: a thread of its own that asks the broker
//! for the high watermarks of one subtask's partitions once a second, so
//! that the source's actor never waits for that request.
//!
//! It owns the thread, the list of partitions to ask about and the
//! latest answers. It never reads records, never moves an offset and
//! never runs unless the live metrics want the lag: the source starts it
//! at its first `Source::figures` call, which only a job with metrics on
//! makes. (librdkafka caches each partition's high watermark from every
//! fetch, but rdkafka 0.39 has no safe call for that cache, and its
//! statistics callback would need a consumer context of our own on every
//! consumer; one `ListOffsets` request per partition and second is the
//! price instead.)

use std::collections::BTreeMap;
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};

/// How often the probe asks, at most.
const INTERVAL: Duration = Duration::from_secs(1);

/// The probe waits this many times as long as its last round of requests
/// took before the next one (and at least [`INTERVAL`]), so that it never
/// takes more than about a tenth of a slow broker's time: on tansu each
/// offset request lists every batch of the partition, seconds on a topic
/// written one record per batch, and a probe asking every second kept the
/// broker from answering the fetches (issue 36's stalled source).
const BACKOFF_FACTOR: u32 = 10;

/// A partition as the source names it: (reader index, partition).
pub(super) type PartitionKey = (usize, i32);

/// The probe of one source subtask; dropping it stops and joins the
/// thread (after at most the request in flight).
pub(super) struct LagProbe {
    wanted: Arc<Mutex<Vec<PartitionKey>>>,
    highs: Arc<Mutex<BTreeMap<PartitionKey, i64>>>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is one assignment or one copy.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl LagProbe {
    /// Starts asking, through `consumers` (each reader's topic and
    /// consumer, by reader index), about `wanted`, each request bounded by
    /// `timeout`. `None` when no thread can be started: the lag then stays
    /// unknown, and the job runs on.
    pub(super) fn start(
        consumers: Vec<(String, Arc<BaseConsumer>)>,
        wanted: &[PartitionKey],
        timeout: Duration,
    ) -> Option<LagProbe> {
        let wanted = Arc::new(Mutex::new(wanted.to_vec()));
        let highs = Arc::new(Mutex::new(BTreeMap::new()));
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("snapflow-kafka-lag".into())
            .spawn({
                let (wanted, highs) = (Arc::clone(&wanted), Arc::clone(&highs));
                move || ask_until_stopped(&consumers, &wanted, &highs, &stopped, timeout)
            })
            .map_err(|error| tracing::warn!(%error, "no thread for the Kafka source's lag"))
            .ok()?;
        Some(LagProbe {
            wanted,
            highs,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Asks about `partitions` from now on.
    pub(super) fn want(&self, partitions: &[PartitionKey]) {
        let mut wanted = lock(&self.wanted);
        if wanted.as_slice() != partitions {
            wanted.clear();
            wanted.extend_from_slice(partitions);
        }
    }

    /// Whether the broker answered at least once.
    pub(super) fn answered(&self) -> bool {
        !lock(&self.highs).is_empty()
    }

    /// The latest high watermark of each partition that has one.
    pub(super) fn highs(&self) -> BTreeMap<PartitionKey, i64> {
        lock(&self.highs).clone()
    }
}

/// The thread: ask about every wanted partition, then wait a second or
/// for the stop (the sender dropped), and again.
fn ask_until_stopped(
    consumers: &[(String, Arc<BaseConsumer>)],
    wanted: &Mutex<Vec<PartitionKey>>,
    highs: &Mutex<BTreeMap<PartitionKey, i64>>,
    stopped: &mpsc::Receiver<()>,
    timeout: Duration,
) {
    loop {
        let round = std::time::Instant::now();
        let partitions = lock(wanted).clone();
        for (index, partition) in &partitions {
            if !matches!(stopped.try_recv(), Err(TryRecvError::Empty)) {
                return;
            }
            let Some((topic, consumer)) = consumers.get(*index) else {
                continue;
            };
            // A failed request (a broker away for a moment) keeps the
            // last answer; the next second asks again.
            if let Ok((_, high)) = consumer.fetch_watermarks(topic, *partition, timeout) {
                lock(highs).insert((*index, *partition), high);
            }
        }
        lock(highs).retain(|key, _| partitions.contains(key));
        let wait = INTERVAL.max(round.elapsed() * BACKOFF_FACTOR);
        match stopped.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

impl Drop for LagProbe {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // A panic on the thread lost only the lag.
            let _ = thread.join();
        }
    }
}
