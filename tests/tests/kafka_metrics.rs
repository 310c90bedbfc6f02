//! The Kafka connectors in the live metrics, against a real broker
//! (`eval "$(.ci/kafka.sh start)"` first; without `SNAPFLOW_KAFKA_BROKERS`
//! each test prints how to start it and passes, except in CI, where it
//! fails):
//!
//! - A bounded source over three partitions at parallelism 2 into the
//!   exactly-once sink, the sink slowed down: the source's bytes in equal
//!   the keys and values written, the sink's bytes out equal the keys,
//!   values and headers a reader finds in the output topic, each
//!   partition shows its next offset, and the lag was above 0 while the
//!   source was held back and is 0 at the end.
//! - An unbounded source: its lag comes from the high watermark
//!   librdkafka saw in its fetches; it shows above 0 while the source is
//!   held back and reaches 0 once everything is read.

#[path = "kafka/support.rs"]
mod support;

use std::thread;
use std::time::{Duration, Instant};

use snapflow::connectors::kafka::{
    KafkaOut, KafkaRecord, KafkaSinkConfig, KafkaSinkFactory, KafkaSourceConfig, KafkaSourceFactory,
};
use snapflow::job::{Job, JobConfig, JobError};
use snapflow::sink::CollectHandle;
use snapflow_tests::sampled::{run_sampled, Sampled};
use snapflow_tests::slow_commit::SlowCommits;

use support::{broker, create_topic, produce, read_until, unique};

/// The input: `(partition, key, value)` of varied lengths.
fn input(records: u64, partitions: i32) -> Vec<(i32, Vec<u8>, Vec<u8>)> {
    (0..records)
        .map(|id| {
            let partition = (id % partitions as u64) as i32;
            let key = format!("k{}", id % 13).into_bytes();
            let value = format!("{id}:{}", "x".repeat((id % 11) as usize)).into_bytes();
            (partition, key, value)
        })
        .collect()
}

fn input_bytes(rows: &[(i32, Vec<u8>, Vec<u8>)]) -> u64 {
    rows.iter()
        .map(|(_, key, value)| (key.len() + value.len()) as u64)
        .sum()
}

fn value_of(record: &KafkaRecord<'_>) -> Result<Vec<u8>, String> {
    Ok(record.value().unwrap_or_default().to_vec())
}

fn job_config(parallelism: usize) -> JobConfig {
    JobConfig {
        default_parallelism: parallelism,
        checkpoint_interval_ms: Some(100),
        batch_size_max: 8,
        window_batches: 2,
        arbiters: Some(2),
        ..JobConfig::default()
    }
}

#[test]
fn kafka_bytes_positions_and_lag_of_a_bounded_source_and_the_sink() {
    let Some(brokers) = broker() else { return };
    let (from, to) = (unique("metrics-in"), unique("metrics-out"));
    create_topic(&brokers, &from, 3);
    create_topic(&brokers, &to, 1);
    let records = 600;
    let rows = input(records, 3);
    produce(&brokers, &from, &rows);

    let name = unique("metrics-job");
    let job = Job::new(&name, job_config(2));
    let mut source = KafkaSourceConfig::new(&brokers, &[&from]);
    source.bounded = true;
    let source = KafkaSourceFactory::new(source, value_of).expect("the source's checks pass");
    let mut sink = KafkaSinkConfig::new(&brokers, &to, &name, "out");
    sink.transaction_timeout_ms = 30_000;
    let sink = KafkaSinkFactory::new(sink, |value: &Vec<u8>| KafkaOut {
        key: Some(value[..1].to_vec()),
        value: value.clone(),
        partition: None,
        timestamp_ms: None,
    })
    .expect("the sink's checks pass");
    job.source("in", source).sink(
        "out",
        SlowCommits::new(sink, 0, false).with_write_delay_ms(1),
    );
    let running = job.start().expect("the job starts");
    let Sampled { during, last } = run_sampled(running, Duration::from_secs(120));

    let source = last.operator("in").expect("listed");
    assert_eq!(source.records_out, records);
    assert_eq!(
        source.bytes_in,
        Some(input_bytes(&rows)),
        "keys and values read"
    );
    assert_eq!(source.pending_records, Some(0), "nothing left at the end");
    let mut splits: Vec<(String, u64)> = source
        .subtasks
        .iter()
        .flat_map(|subtask| subtask.splits.iter())
        .map(|split| (split.split.clone(), split.position))
        .collect();
    splits.sort();
    let want: Vec<(String, u64)> = (0..3)
        .map(|partition| (format!("{from}/{partition}"), records / 3))
        .collect();
    assert_eq!(splits, want, "each partition at its end offset");
    let behind = during.iter().any(|metrics| {
        metrics
            .operator("in")
            .and_then(|source| source.pending_records)
            .is_some_and(|pending| pending > 0 && pending < records)
    });
    assert!(behind, "the lag showed while the source was held back");

    // At `read_uncommitted`, as every reader of the sink's output in
    // these tests: tansu 0.6's last stable offset sometimes stays behind
    // (docs/design/kafka-connector.md, known gaps); a run without failures
    // aborts nothing, so every record read is a committed one.
    let read = read_until(
        &brokers,
        &to,
        "read_uncommitted",
        Duration::from_millis(700),
        |read| read.len() as u64 >= records,
    );
    assert_eq!(read.len() as u64, records, "bug in the test: the output");
    let written: u64 = read
        .iter()
        .map(|record| {
            let headers: usize = record
                .headers
                .iter()
                .map(|(name, value)| name.len() + value.len())
                .sum();
            (record.key.len() + record.value.len() + headers) as u64
        })
        .sum();
    let sink = last.operator("out").expect("listed");
    assert_eq!(
        sink.bytes_out,
        Some(written),
        "keys, values and headers sent"
    );
}

/// The lag of the one split, if it shows one.
fn split_lag(splits: &[snapflow::source::SplitPosition]) -> Option<u64> {
    match splits {
        [split] => split.pending_records,
        _ => None,
    }
}

#[test]
fn an_unbounded_source_shows_its_lag_until_it_caught_up() {
    let Some(brokers) = broker() else { return };
    let topic = unique("metrics-lag");
    create_topic(&brokers, &topic, 1);
    // 2,000 records at 8 per batch and 5 ms per batch: the source stays
    // behind for about a second and a half, far longer than the probe's
    // first answer takes.
    let records = 2_000;
    let rows = input(records, 1);
    produce(&brokers, &topic, &rows);

    let job = Job::new(&unique("metrics-lag-job"), job_config(1));
    let mut config = KafkaSourceConfig::new(&brokers, &[&topic]);
    config.discovery_interval_ms = None;
    let source = KafkaSourceFactory::new(config, value_of).expect("the source's checks pass");
    let output = CollectHandle::new();
    job.source("in", source).sink(
        "out",
        SlowCommits::new(output, 0, false).with_write_delay_ms(5),
    );
    let running = job.start().expect("the job starts");
    // Bounded waits (a broker on a busy machine may be slow); no timing
    // is asserted, only what the metrics say on the way.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen_behind = false;
    let caught_up = loop {
        let metrics = running.metrics();
        let source = metrics.operator("in").expect("listed");
        let read = source.records_out;
        match source.pending_records {
            Some(pending) if pending > 0 => {
                assert!(pending <= records, "lag {pending} of {records} records");
                seen_behind = true;
            }
            // The splits are copied once a second: wait for theirs too.
            Some(0) if read == records && split_lag(&source.subtasks[0].splits) == Some(0) => {
                break true
            }
            _ => {}
        }
        if Instant::now() >= deadline {
            break false;
        }
        thread::sleep(Duration::from_millis(5));
    };
    let metrics = running.metrics();
    running.cancel();
    assert!(matches!(running.wait(), Err(JobError::Cancelled)));
    assert!(seen_behind, "the lag showed while the source was behind");
    assert!(
        caught_up,
        "the lag reached 0 once all was read: {metrics:?}"
    );
    let source = metrics.operator("in").expect("listed");
    assert_eq!(source.bytes_in, Some(input_bytes(&rows)));
    let split = &source.subtasks[0].splits[0];
    assert_eq!(split.split, format!("{topic}/0"));
    assert_eq!(split.position, records, "the next offset");
}
