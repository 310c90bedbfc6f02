//! Kafka pipeline benchmark: records per second from an input topic
//! through a keyed count into an output topic, exactly-once (Kafka
//! source, `key_by`, `process_with_state`, the transactional Kafka sink,
//! checkpoints every `--interval-ms`), at parallelism `--parallelism`
//! (2), against librdkafka's own consumer → producer pipe moving the
//! same records with no processing (one consumer reading both
//! partitions, one idempotent producer, no transactions), in the same
//! run, printed as a ratio.
//!
//! Both timings cover the same kinds of work: `Job::run` makes the
//! job's clients (the sources' consumers, the sinks' restore: fencing and
//! the first transaction), moves the records and closes the clients; the
//! raw pipe's time covers making its consumer and producer, moving the
//! records, the last flush and closing them. The factories' start checks
//! (one metadata request each) run before either. The ratio against the
//! raw pipe's moving alone (clients made before, closed after) is
//! printed too.
//!
//! The input is `--records` small records (decimal ids, no key) over two
//! partitions, written once before both runs; each side writes a topic
//! of its own. The record count defaults to 200,000, not the issue's
//! 10 M: the test broker (tansu 0.6, memory storage) takes minutes per
//! million records written; the figures say what was run.
//!
//! Needs a broker: `eval "$(.ci/kafka.sh start)"`, then
//! `cargo bench -p snapflow --features kafka --bench kafka_pipeline`
//! (`-- --help` for the options, `-- --smoke` for a tiny run). Without
//! `SNAPFLOW_KAFKA_BROKERS` (or `--brokers`) it says how to start one and
//! exits with 0. It checks that every record arrived and asserts nothing
//! about speed.

mod support;

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use snapflow::connectors::kafka::{
    KafkaOut, KafkaSinkConfig, KafkaSinkFactory, KafkaSourceConfig, KafkaSourceFactory,
};
use snapflow::job::{Job, JobConfig};
use snapflow::Snapshot;

use support::{bench_main, mega_per_second, number, positive, CargoBench};

const PARTITIONS: i32 = 2;
const TIMEOUT: Duration = Duration::from_secs(60);

/// Records per second from an input topic through a keyed count into an
/// output topic, exactly once, against librdkafka's own consumer →
/// producer pipe moving the same records.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "kafka_pipeline", args_override_self = true)]
struct Options {
    /// Records [with --smoke: 5000].
    #[arg(long, value_name = "N", value_parser = positive::<u64>, default_value_t = 200_000)]
    records: u64,
    /// Parallelism of every operator.
    #[arg(long, value_name = "P", value_parser = positive::<usize>, default_value_t = 2)]
    parallelism: usize,
    /// Time between periodic checkpoints (the sink commits at each).
    #[arg(long, value_name = "I", value_parser = number::<u64>, default_value_t = 1_000)]
    interval_ms: u64,
    /// Distinct keys.
    #[arg(long, value_name = "K", value_parser = positive::<u64>, default_value_t = 10_000)]
    keys: u64,
    /// The Kafka broker [default: $SNAPFLOW_KAFKA_BROKERS; without one,
    /// the benchmark says how to start one and exits].
    #[arg(long, value_name = "HOST:PORT")]
    brokers: Option<String>,
    /// A tiny run: 5000 records (in place of --records).
    #[arg(long)]
    smoke: bool,
    #[command(flatten)]
    cargo: CargoBench,
}

/// Applies `--smoke` and the broker from the environment.
fn settle(mut options: Options) -> Result<Options, String> {
    if options.smoke {
        options.records = 5_000;
    }
    options.brokers = support::or_env(options.brokers, "SNAPFLOW_KAFKA_BROKERS");
    Ok(options)
}

fn producer(brokers: &str) -> Result<BaseProducer, String> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .map_err(|error| error.to_string())
}

/// Sends one record, serving delivery reports while the queue is full.
fn send(producer: &BaseProducer, topic: &str, partition: i32, value: &[u8]) -> Result<(), String> {
    let mut record = BaseRecord::<(), [u8]>::to(topic)
        .partition(partition)
        .payload(value);
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
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

/// Writes ids `0..records` over the partitions; the last record of each
/// partition goes alone after the rest is acknowledged (tansu answers a
/// partition's latest offset with its last batch's first offset plus
/// one, and the bounded source stops there).
fn fill(brokers: &str, topic: &str, records: u64) -> Result<(), String> {
    let producer = producer(brokers)?;
    let tail = PARTITIONS as u64;
    for id in 0..records.saturating_sub(tail) {
        send(
            &producer,
            topic,
            (id % tail) as i32,
            id.to_string().as_bytes(),
        )?;
    }
    flush(&producer)?;
    for id in records.saturating_sub(tail)..records {
        send(
            &producer,
            topic,
            (id % tail) as i32,
            id.to_string().as_bytes(),
        )?;
    }
    flush(&producer)
}

/// Waits for every acknowledgement without rdkafka 0.39's 100 ms poll
/// slices (its `flush` runs each slice to the end; the sink does the
/// same as this, so neither side pays for them).
fn flush(producer: &BaseProducer) -> Result<(), String> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match producer.flush(Duration::ZERO) {
            Ok(()) => return Ok(()),
            Err(error)
                if error.rdkafka_error_code() == Some(RDKafkaErrorCode::OperationTimedOut)
                    && Instant::now() < deadline =>
            {
                producer.poll(Duration::from_millis(1));
            }
            Err(error) => return Err(error.to_string()),
        }
    }
}

/// The raw pipe's two timings: the whole of it (making its clients,
/// moving the records, closing the clients: what `Job::run` also covers)
/// and the moving alone.
struct RawTimes {
    whole: Duration,
    moving: Duration,
}

/// librdkafka alone: consume every record of `input` and produce it to
/// `output` unchanged, then flush and close.
fn raw_pipe(brokers: &str, input: &str, output: &str, records: u64) -> Result<RawTimes, String> {
    let whole = Instant::now();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("{input}-raw"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .map_err(|error| error.to_string())?;
    let mut assignment = TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        assignment
            .add_partition_offset(input, partition, Offset::Beginning)
            .map_err(|error| error.to_string())?;
    }
    consumer
        .assign(&assignment)
        .map_err(|error| error.to_string())?;
    let producer = producer(brokers)?;
    let started = Instant::now();
    let mut moved = 0;
    while moved < records {
        if started.elapsed() > TIMEOUT * 10 {
            return Err(format!("the raw pipe moved {moved} of {records} records"));
        }
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = message.map_err(|error| error.to_string())?;
        send(
            &producer,
            output,
            message.partition(),
            message.payload().unwrap_or_default(),
        )?;
        moved += 1;
    }
    flush(&producer)?;
    let moving = started.elapsed();
    // Closed as the connector closes its consumers (rdkafka's drop of a
    // consumer with a group id waits in 100 ms slices too).
    if consumer.close_queue().is_ok() {
        while !consumer.closed() && whole.elapsed() < TIMEOUT * 10 {
            let _ = consumer.poll(Duration::from_millis(1));
        }
    }
    drop(consumer);
    drop(producer);
    Ok(RawTimes {
        whole: whole.elapsed(),
        moving,
    })
}

#[derive(Snapshot, Debug, Clone, Default)]
struct Count {
    seen: u64,
}

/// The job: source → key_by → count → exactly-once sink. Returns the
/// elapsed time and how many results it emitted.
fn job(options: &Options, brokers: &str, input: &str, output: &str) -> Result<Duration, String> {
    let mut source = KafkaSourceConfig::new(brokers, &[input]);
    source.bounded = true;
    let source = KafkaSourceFactory::new(source, |record| {
        let value = record.value().ok_or("no value")?;
        std::str::from_utf8(value)
            .ok()
            .and_then(|text| text.parse::<u64>().ok())
            .ok_or_else(|| "not a number".to_string())
    })
    .map_err(|error| error.to_string())?;
    let job_name = format!("{input}-job");
    let mut sink = KafkaSinkConfig::new(brokers, output, &job_name, "out");
    sink.transaction_timeout_ms = (options.interval_ms * 10).max(60_000);
    let sink = KafkaSinkFactory::new(sink, |&(key, count): &(u64, u64)| KafkaOut {
        key: Some(key.to_le_bytes().to_vec()),
        value: count.to_le_bytes().to_vec(),
        partition: None,
        timestamp_ms: None,
    })
    .map_err(|error| error.to_string())?;
    let config = JobConfig {
        checkpoint_interval_ms: Some(options.interval_ms),
        default_parallelism: options.parallelism,
        ..JobConfig::default()
    };
    let job = Job::new(&job_name, config);
    let keys = options.keys;
    let (counted, _state) = job
        .source("in", source)
        .key_by(move |id: &u64| id % keys)
        .process_with_state("count", |key: &u64, count: &mut Count, _, out| {
            count.seen += 1;
            out.emit((*key, count.seen));
            Ok(())
        });
    counted.sink("out", sink);
    let started = Instant::now();
    let report = job.run().map_err(|error| error.to_string())?;
    let elapsed = started.elapsed();
    let counted = report
        .operators
        .iter()
        .find(|operator| operator.name == "count")
        .map_or(0, |operator| operator.records_in);
    if counted != options.records {
        return Err(format!(
            "the job counted {counted} of {} records",
            options.records
        ));
    }
    println!(
        "  job: {} checkpoints, {} restarts",
        report.checkpoints.len(),
        report.restarts.len()
    );
    Ok(elapsed)
}

fn run(options: &Options) -> Result<(), String> {
    let Some(brokers) = &options.brokers else {
        println!(
            "kafka_pipeline: skipped: SNAPFLOW_KAFKA_BROKERS is not set; start a broker with \
             `eval \"$(.ci/kafka.sh start)\"` or pass --brokers"
        );
        return Ok(());
    };
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    let input = format!("bench-in-{stamp}");
    let (raw_out, job_out) = (format!("bench-raw-{stamp}"), format!("bench-job-{stamp}"));
    support::kafka::create_topics(brokers, &[&input, &raw_out, &job_out], PARTITIONS)?;
    let started = Instant::now();
    fill(brokers, &input, options.records)?;
    println!(
        "kafka_pipeline: {} records over {PARTITIONS} partitions written in {:.1} s; \
         parallelism {}, checkpoint every {} ms, {} keys",
        options.records,
        started.elapsed().as_secs_f64(),
        options.parallelism,
        options.interval_ms,
        options.keys
    );
    let raw = raw_pipe(brokers, &input, &raw_out, options.records)?;
    let raw_rate = mega_per_second(options.records, raw.whole) * 1e6;
    let moving_rate = mega_per_second(options.records, raw.moving) * 1e6;
    println!(
        "  raw librdkafka consumer -> producer: {:.2} s, {raw_rate:.0} records/s \
         (clients made and closed included; moving alone {:.2} s, {moving_rate:.0} records/s)",
        raw.whole.as_secs_f64(),
        raw.moving.as_secs_f64()
    );
    let job = job(options, brokers, &input, &job_out)?;
    let job_rate = mega_per_second(options.records, job) * 1e6;
    println!(
        "  snapflow keyed count, exactly-once: {:.2} s, {job_rate:.0} records/s",
        job.as_secs_f64()
    );
    println!(
        "  ratio job / raw pipe: {:.2} (against the moving alone: {:.2})",
        job_rate / raw_rate,
        job_rate / moving_rate
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    bench_main("kafka_pipeline", settle, run)
}
