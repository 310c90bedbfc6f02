//! Kafka source benchmark: records per second of a bounded Kafka source
//! into a sink that drops them, at parallelism 1 and 2, beside plain
//! librdkafka consumers (`BaseConsumer`, no snapflow) reading the same
//! topic on the same broker in the same run (one consumer per subtask,
//! each assigned the partitions that subtask owns), printed as ratios:
//! once with librdkafka's default settings, once with the fetch settings
//! the source sets ([`KafkaSourceConfig::fetch_settings`]), which show
//! what the source itself costs.
//!
//! All timings cover making the consumers, reading every record and
//! closing them; the job's also covers its start, checkpoints every
//! second and its end, and the bench prints when the job read its first
//! and its last record. The input is `--records` (2,000,000) small
//! records (decimal ids) over four partitions, written once with the
//! producer's usual batching before every run.
//!
//! Needs a broker: `eval "$(.ci/kafka.sh start)"`, then
//! `cargo bench -p snapflow --features kafka --bench kafka_source`
//! (`-- --help` for the options, `-- --smoke` for a tiny run). Without
//! `SNAPFLOW_KAFKA_BROKERS` (or `--brokers`) it says how to start one and
//! exits with 0. It checks that every record arrived and asserts nothing
//! about speed.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use snapflow::connectors::kafka::source::owner;
use snapflow::connectors::kafka::{KafkaSourceConfig, KafkaSourceFactory};
use snapflow::job::{Job, JobConfig};

use support::{bench_main, mega_per_second, positive, CargoBench, DiscardSink};

const PARTITIONS: i32 = 4;
const TIMEOUT: Duration = Duration::from_secs(600);

/// Records per second of a bounded Kafka source into a sink that drops
/// them, beside plain librdkafka consumers reading the same topic.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "kafka_source", args_override_self = true)]
struct Options {
    /// Records [with --smoke: 20000].
    #[arg(long, value_name = "N", value_parser = positive::<u64>, default_value_t = 2_000_000)]
    records: u64,
    /// Runs.
    #[arg(long, value_name = "R", value_parser = positive::<usize>, default_value_t = 1)]
    runs: usize,
    /// The Kafka broker [default: $SNAPFLOW_KAFKA_BROKERS; without one,
    /// the benchmark says how to start one and exits].
    #[arg(long, value_name = "HOST:PORT")]
    brokers: Option<String>,
    /// A tiny run: 20000 records (in place of --records).
    #[arg(long)]
    smoke: bool,
    #[command(flatten)]
    cargo: CargoBench,
}

/// Applies `--smoke` and the broker from the environment.
fn settle(mut options: Options) -> Result<Options, String> {
    if options.smoke {
        options.records = 20_000;
    }
    options.brokers = support::or_env(options.brokers, "SNAPFLOW_KAFKA_BROKERS");
    Ok(options)
}

/// Writes ids `0..records` over the partitions with the producer's usual
/// batching.
fn fill(brokers: &str, topic: &str, records: u64) -> Result<(), String> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .map_err(|error| error.to_string())?;
    for id in 0..records {
        let value = id.to_string();
        let mut record = BaseRecord::<(), [u8]>::to(topic)
            .partition((id % PARTITIONS as u64) as i32)
            .payload(value.as_bytes());
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((error, back))
                    if error.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) =>
                {
                    record = back;
                    producer.poll(Duration::from_millis(5));
                }
                Err((error, _)) => return Err(error.to_string()),
            }
        }
    }
    producer.flush(TIMEOUT).map_err(|error| error.to_string())
}

/// Plain librdkafka: `parallelism` consumers on threads of their own,
/// each reading the partitions the source's subtask of the same index
/// owns, from offset 0 to the end; returns the elapsed time.
fn plain(
    brokers: &str,
    topic: &str,
    records: u64,
    parallelism: usize,
    settings: &[(&'static str, &'static str)],
) -> Result<Duration, String> {
    let started = Instant::now();
    let read = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..parallelism)
        .map(|subtask| {
            let (brokers, topic, read) = (brokers.to_owned(), topic.to_owned(), Arc::clone(&read));
            let settings = settings.to_vec();
            std::thread::spawn(move || -> Result<(), String> {
                let mut config = ClientConfig::new();
                config
                    .set("bootstrap.servers", &brokers)
                    .set("group.id", format!("{topic}-plain"))
                    .set("enable.auto.commit", "false")
                    .set("isolation.level", "read_committed");
                for (key, value) in settings {
                    config.set(key, value);
                }
                let consumer: BaseConsumer = config.create().map_err(|error| error.to_string())?;
                let mut assignment = TopicPartitionList::new();
                let mine: Vec<i32> = (0..PARTITIONS)
                    .filter(|&p| owner(&topic, p, parallelism) == subtask)
                    .collect();
                for &partition in &mine {
                    assignment
                        .add_partition_offset(&topic, partition, Offset::Offset(0))
                        .map_err(|error| error.to_string())?;
                }
                consumer
                    .assign(&assignment)
                    .map_err(|error| error.to_string())?;
                let want = records / PARTITIONS as u64 * mine.len() as u64;
                let mut mine_read = 0;
                while mine_read < want {
                    if started.elapsed() > TIMEOUT {
                        return Err(format!("a plain consumer read {mine_read} of {want}"));
                    }
                    match consumer.poll(Duration::from_millis(100)) {
                        Some(Ok(_)) => mine_read += 1,
                        Some(Err(error)) => return Err(error.to_string()),
                        None => {}
                    }
                }
                read.fetch_add(mine_read, Ordering::Relaxed);
                if consumer.close_queue().is_ok() {
                    while !consumer.closed() {
                        let _ = consumer.poll(Duration::from_millis(1));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for thread in threads {
        thread
            .join()
            .map_err(|_| "a plain consumer panicked".to_string())??;
    }
    let read = read.load(Ordering::Relaxed);
    if read != records {
        return Err(format!("the plain consumers read {read} of {records}"));
    }
    Ok(started.elapsed())
}

/// The job: bounded Kafka source → a sink that drops the records; returns
/// the elapsed time of `Job::run`.
fn job(brokers: &str, topic: &str, records: u64, parallelism: usize) -> Result<Duration, String> {
    let mut source = KafkaSourceConfig::new(brokers, &[topic]);
    source.bounded = true;
    // When the first record and the last record of a partition were
    // read, in microseconds after `epoch`; the job starts `before`
    // microseconds after it (the factory asks the broker for the topics'
    // metadata first). Only those records read the clock.
    let epoch = Instant::now();
    let (first, last) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (first_seen, last_seen) = (Arc::clone(&first), Arc::clone(&last));
    let last_offset = (records / PARTITIONS as u64) as i64 - 1;
    let source = KafkaSourceFactory::new(source, move |record| {
        if first_seen.load(Ordering::Relaxed) == 0 {
            let at = epoch.elapsed().as_micros() as u64;
            let _ = first_seen.compare_exchange(0, at, Ordering::Relaxed, Ordering::Relaxed);
        }
        if record.offset() == last_offset {
            last_seen.fetch_max(epoch.elapsed().as_micros() as u64, Ordering::Relaxed);
        }
        Ok(record.value().map_or(0, <[u8]>::len) as u64)
    })
    .map_err(|error| error.to_string())?;
    let config = JobConfig {
        checkpoint_interval_ms: Some(1_000),
        default_parallelism: parallelism,
        ..JobConfig::default()
    };
    let job = Job::new(&format!("{topic}-job-{parallelism}"), config);
    let sink = DiscardSink::<u64>::default();
    job.source("in", source).sink("out", sink.clone());
    let started = Instant::now();
    let before = (started - epoch).as_micros() as u64;
    job.run().map_err(|error| error.to_string())?;
    let elapsed = started.elapsed();
    println!(
        "    p={parallelism}: the job read its first record {} ms after its start, its last \
         after {} ms, and ended after {} ms",
        first.load(Ordering::Relaxed).saturating_sub(before) / 1_000,
        last.load(Ordering::Relaxed).saturating_sub(before) / 1_000,
        elapsed.as_millis()
    );
    if sink.committed() != records {
        return Err(format!(
            "the job committed {} of {records}",
            sink.committed()
        ));
    }
    Ok(elapsed)
}

fn run(options: &Options) -> Result<(), String> {
    let Some(brokers) = &options.brokers else {
        println!(
            "kafka_source: skipped: SNAPFLOW_KAFKA_BROKERS is not set; start a broker with \
             `eval \"$(.ci/kafka.sh start)\"` or pass --brokers"
        );
        return Ok(());
    };
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    let topic = format!("bench-source-{stamp}");
    support::kafka::create_topics(brokers, &[&topic], PARTITIONS)?;
    let started = Instant::now();
    fill(brokers, &topic, options.records)?;
    println!(
        "kafka_source: {} records over {PARTITIONS} partitions written in {:.1} s",
        options.records,
        started.elapsed().as_secs_f64()
    );
    let rate = |elapsed: Duration| mega_per_second(options.records, elapsed) * 1e6;
    let mut bounded = KafkaSourceConfig::new(brokers, &[&topic]);
    bounded.bounded = true;
    let tuned = bounded.fetch_settings();
    for _ in 0..options.runs {
        for parallelism in [1, 2] {
            let plain_default = plain(brokers, &topic, options.records, parallelism, &[])?;
            let plain_tuned = plain(brokers, &topic, options.records, parallelism, &tuned)?;
            let job = job(brokers, &topic, options.records, parallelism)?;
            println!(
                "  p={parallelism}: plain librdkafka {:.2} s ({:.0} records/s), with the source's \
                 fetch settings {:.2} s ({:.0} records/s); snapflow source {:.2} s ({:.0} \
                 records/s); ratio {:.2} to the first, {:.2} to the second",
                plain_default.as_secs_f64(),
                rate(plain_default),
                plain_tuned.as_secs_f64(),
                rate(plain_tuned),
                job.as_secs_f64(),
                rate(job),
                rate(job) / rate(plain_default),
                rate(job) / rate(plain_tuned)
            );
        }
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    bench_main("kafka_source", settle, run)
}
