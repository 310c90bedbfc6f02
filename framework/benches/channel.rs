//! Micro-benchmark of the runtime's channel: moves 20 M `u64` records from a
//! source actor to a sink actor on another arbiter, in batches of 1024, with
//! the default credit window, and prints records per second.
//!
//! Run: `cargo bench -p snapflow --bench channel` (release profile). Set
//! `SNAPFLOW_BENCH_RECORDS` to change the record count and
//! `SNAPFLOW_BENCH_WINDOW` to change the credit window (batches in flight).

use std::num::NonZeroUsize;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use snapflow::runtime::channel::{channel, ChannelConfig, ChannelId, Outputs, Window};
use snapflow::runtime::failure::FailureSink;
use snapflow::runtime::pool::{ActorSlot, ArbiterPool, Placement, PoolConfig};
use snapflow::runtime::source::{SourceActor, SourceConfig, SourceLogic, SourcePoll};
use snapflow::runtime::stage::{StageActor, StageConfig, StageIo, StageLogic};
use snapflow::runtime::{ActorTag, BoxError, Generation};

const BATCH_SIZE: usize = 1024;

/// Emits 0..total, one batch per poll.
struct Counter {
    next: u64,
    total: u64,
}

impl SourceLogic for Counter {
    type Out = u64;
    type Control = ();

    fn poll(&mut self, outputs: &mut Outputs<u64, ()>) -> Result<SourcePoll, BoxError> {
        let stop = (self.next + BATCH_SIZE as u64).min(self.total);
        for value in self.next..stop {
            outputs.emit(0, value);
        }
        self.next = stop;
        Ok(if self.next < self.total {
            SourcePoll::Ready
        } else {
            SourcePoll::Exhausted
        })
    }
}

/// Sums what arrives and reports when every record has.
struct Summer {
    received: u64,
    sum: u64,
    total: u64,
    done: mpsc::Sender<(Instant, u64)>,
}

impl StageLogic for Summer {
    type In = u64;
    type Out = u64;
    type Control = ();

    fn on_batch(
        &mut self,
        _input: usize,
        batch: Vec<u64>,
        _io: &mut StageIo<'_, u64, ()>,
    ) -> Result<(), BoxError> {
        self.received += batch.len() as u64;
        self.sum = batch
            .iter()
            .fold(self.sum, |sum, value| sum.wrapping_add(*value));
        if self.received == self.total {
            let _ = self.done.send((Instant::now(), self.sum));
        }
        Ok(())
    }

    fn on_control(
        &mut self,
        _input: usize,
        _control: (),
        _io: &mut StageIo<'_, u64, ()>,
    ) -> Result<(), BoxError> {
        Ok(())
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let total = env_or("SNAPFLOW_BENCH_RECORDS", 20_000_000);
    let window =
        NonZeroUsize::new(env_or("SNAPFLOW_BENCH_WINDOW", 8) as usize).expect("window > 0");
    let arbiters = NonZeroUsize::new(2).expect("2 > 0");
    let pool = ArbiterPool::new(PoolConfig { arbiters }).expect("start pool");
    let failures = FailureSink::log_only();
    let config = ChannelConfig {
        batch_size_max: NonZeroUsize::new(BATCH_SIZE).expect("batch > 0"),
        window: Window::Bounded(window),
        ..ChannelConfig::default()
    };
    let source_slot = ActorSlot::<SourceActor<Counter>>::new();
    let sink_slot = ActorSlot::<StageActor<Summer>>::new();
    let (sender, receiver) = channel(
        ChannelId(0),
        Generation(1),
        config,
        sink_slot.address().recipient(),
        source_slot.address().recipient(),
    );
    let stats = sender.stats().clone();
    let (done_sender, done) = mpsc::channel();
    let sink_tag = ActorTag::new("sink", 0, Generation(1));
    let sink_failures = failures.clone();
    pool.start_in_slot(
        sink_slot,
        Placement::Arbiter(1),
        sink_tag.clone(),
        failures.clone(),
        move |_| {
            let logic = Summer {
                received: 0,
                sum: 0,
                total,
                done: done_sender,
            };
            StageActor::new(
                sink_tag,
                logic,
                vec![receiver],
                Vec::new(),
                StageConfig::default(),
                sink_failures,
            )
        },
    )
    .expect("start sink");
    let source_tag = ActorTag::new("source", 0, Generation(1));
    let source_failures = failures.clone();
    let started = Instant::now();
    pool.start_in_slot(
        source_slot,
        Placement::Arbiter(0),
        source_tag.clone(),
        failures,
        move |_| {
            let logic = Counter { next: 0, total };
            SourceActor::new(
                source_tag,
                logic,
                vec![sender],
                SourceConfig::default(),
                source_failures,
            )
        },
    )
    .expect("start source");
    let (finished, sum) = done
        .recv_timeout(Duration::from_secs(600))
        .expect("sink finished");
    let seconds = finished.duration_since(started).as_secs_f64();
    let expected_sum = (0..total).fold(0_u64, u64::wrapping_add);
    assert_eq!(sum, expected_sum, "records lost or changed");
    // Joined before the stats are read: the source counts a batch after
    // sending it, so the last count can trail the sink's last sum.
    pool.shutdown().expect("shutdown");
    println!(
        "channel: {total} u64 records, source -> sink on two arbiters, batches of {BATCH_SIZE}, \
         window {:?}: {seconds:.3} s, {:.1} M records/s, {} batches, peak in flight {}",
        config.window,
        total as f64 / seconds / 1e6,
        stats.batches_sent(),
        stats.in_flight_batches_peak(),
    );
    single_thread_reference(total);
}

/// The same batching and summing on one thread with no actors, as the
/// reference the channel's figure is a fraction of.
fn single_thread_reference(total: u64) {
    let started = Instant::now();
    let mut sum = 0_u64;
    let mut next = 0;
    while next < total {
        let stop = (next + BATCH_SIZE as u64).min(total);
        let mut batch = Vec::with_capacity(BATCH_SIZE);
        for value in next..stop {
            batch.push(value);
        }
        next = stop;
        sum = std::hint::black_box(batch)
            .iter()
            .fold(sum, |sum, value| sum.wrapping_add(*value));
    }
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(sum, (0..total).fold(0_u64, u64::wrapping_add));
    println!(
        "reference: the same batches built and summed on one thread: {seconds:.3} s, {:.1} M records/s",
        total as f64 / seconds / 1e6
    );
}
