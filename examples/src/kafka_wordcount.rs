//! Word count from Kafka to Kafka, exactly once (feature `kafka`).
//!
//! A first job writes a few lines of text into the lines topic
//! (at-least-once, through the same sink). A second job reads it, counts
//! words per key with checkpoints and writes `word:count` records into
//! the counts topic in Kafka transactions. A third job reads the counts
//! topic back, and the example passes only when the committed records
//! hold every `word:n` exactly once and the last count of each word
//! equals a direct count of the text.
//!
//! This module never creates topics: the broker must have both (the
//! example's `run.sh` starts the test broker and creates them).
//!
//! The writers send one record per batch, which the bounded source no
//! longer needs (it reads on past the end tansu 0.6 reports per batch,
//! `kafka/bound.rs`); on tansu it makes every fetch slower (the broker
//! lists each stored batch per request), which these few lines do not
//! notice.

use std::collections::{BTreeMap, BTreeSet};

use snapflow::connectors::kafka::{
    Delivery, KafkaOut, KafkaSinkConfig, KafkaSinkFactory, KafkaSourceConfig, KafkaSourceFactory,
    TXN_HEADER,
};
use snapflow::job::{Job, JobConfig};
use snapflow::sink::CollectHandle;
use snapflow::source::VecSourceFactory;
use snapflow::Snapshot;

use crate::common::ExampleError;

/// The text the first job writes, one record per line.
pub const TEXT: &[&str] = &[
    "the quick brown fox jumps over the lazy dog",
    "the dog sleeps and the fox runs",
    "a fox a dog a day",
];

/// Where the example runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The bootstrap servers.
    pub brokers: String,
    /// The topic of the text lines; it must exist.
    pub lines_topic: String,
    /// The topic of the counts; it must exist.
    pub counts_topic: String,
    /// The counting job's name (part of its transactional ids).
    pub job: String,
    /// The counting job's checkpoint interval.
    pub checkpoint_interval_ms: u64,
}

impl Options {
    /// The broker of `SNAPFLOW_KAFKA_BROKERS` (default `127.0.0.1:19092`,
    /// the test broker's port) and the topics `lines` and `word-counts`.
    pub fn from_env() -> Options {
        Options {
            brokers: std::env::var("SNAPFLOW_KAFKA_BROKERS")
                .unwrap_or_else(|_| "127.0.0.1:19092".to_owned()),
            lines_topic: "lines".to_owned(),
            counts_topic: "word-counts".to_owned(),
            job: "kafka-wordcount".to_owned(),
            checkpoint_interval_ms: 200,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Checkpoints the counting job completed.
    pub checkpoints: usize,
    /// Transactions it committed into the counts topic.
    pub transactions: usize,
    /// The last count of each word, as read back from the counts topic.
    pub counts: BTreeMap<String, u64>,
}

/// One word's count, the keyed state.
#[derive(Snapshot, Default, Clone)]
struct Count {
    seen: u64,
}

/// Runs the three jobs and checks the committed output.
///
/// # Errors
///
/// [`ExampleError::Kafka`] when the broker or a topic is missing,
/// [`ExampleError::Job`] when a job fails, [`ExampleError::Mismatch`]
/// when the committed counts differ from a direct count.
pub fn run(options: &Options) -> Result<Summary, ExampleError> {
    write_lines(options)?;
    let (checkpoints, committed) = count(options)?;
    let records = read_back(options)?;
    let counts = check(&records, &committed)?;
    Ok(Summary {
        checkpoints,
        transactions: committed.len(),
        counts,
    })
}

/// Job 1: the text into the lines topic.
fn write_lines(options: &Options) -> Result<(), ExampleError> {
    let mut input = KafkaSinkConfig::new(
        &options.brokers,
        &options.lines_topic,
        &format!("{}-input", options.job),
        "lines",
    );
    input.delivery = Delivery::AtLeastOnce;
    input.client_options = one_record_per_batch();
    let input = KafkaSinkFactory::new(input, |line: &String| KafkaOut {
        key: None,
        value: line.clone().into_bytes(),
        partition: Some(0),
        timestamp_ms: None,
    })?;
    let writer = Job::new(&format!("{}-input", options.job), JobConfig::default());
    let lines: Vec<String> = TEXT.iter().map(|line| (*line).to_owned()).collect();
    writer
        .source("text", VecSourceFactory::new(lines))
        .sink("lines", input);
    writer.run()?;
    Ok(())
}

/// Job 2: the count, exactly once. Returns its completed checkpoints and
/// the headers of the transactions it committed.
fn count(options: &Options) -> Result<(usize, BTreeSet<String>), ExampleError> {
    let mut source = KafkaSourceConfig::new(&options.brokers, &[options.lines_topic.as_str()]);
    source.bounded = true;
    let source = KafkaSourceFactory::new(source, |record| {
        let value = record.value().ok_or("a record without a value")?;
        String::from_utf8(value.to_vec()).map_err(|error| error.to_string())
    })?;
    let mut sink = KafkaSinkConfig::new(
        &options.brokers,
        &options.counts_topic,
        &options.job,
        "counts",
    );
    sink.client_options = one_record_per_batch();
    let sink = KafkaSinkFactory::new(sink, |(word, count): &(String, u64)| KafkaOut {
        key: Some(word.clone().into_bytes()),
        value: format!("{word}:{count}").into_bytes(),
        partition: None,
        timestamp_ms: None,
    })?;
    let log = sink.commit_log();
    let job = Job::new(
        &options.job,
        JobConfig {
            checkpoint_interval_ms: Some(options.checkpoint_interval_ms),
            ..JobConfig::default()
        },
    );
    let (counts, _state) = job
        .source("lines", source)
        .flat_map("split", |line: String| {
            line.split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .key_by(|word: &String| word.clone())
        .process_with_state("count", |word: &String, count: &mut Count, _, out| {
            count.seen += 1;
            out.emit((word.clone(), count.seen));
            Ok(())
        });
    counts.sink("counts", sink);
    let report = job.run()?;
    Ok((
        report.checkpoints.len(),
        log.committed().into_iter().collect(),
    ))
}

/// Job 3: every record of the counts topic, as `(header, value)`.
fn read_back(options: &Options) -> Result<Vec<(String, String)>, ExampleError> {
    let mut source = KafkaSourceConfig::new(&options.brokers, &[options.counts_topic.as_str()]);
    source.bounded = true;
    let source = KafkaSourceFactory::new(source, |record| {
        let text =
            |bytes: Option<&[u8]>| String::from_utf8_lossy(bytes.unwrap_or_default()).into_owned();
        Ok((text(record.header(TXN_HEADER)), text(record.value())))
    })?;
    let output = CollectHandle::new();
    let reader = Job::new(&format!("{}-check", options.job), JobConfig::default());
    reader
        .source("counts", source)
        .sink("collect", output.clone());
    reader.run()?;
    Ok(output.committed())
}

/// The last count of each word among the committed `records`, after
/// checking that they hold every `word:n` exactly once and agree with a
/// direct count of [`TEXT`].
fn check(
    records: &[(String, String)],
    committed: &BTreeSet<String>,
) -> Result<BTreeMap<String, u64>, ExampleError> {
    let mut seen: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (header, value) in records {
        if !committed.contains(header) {
            // Aborted (the test broker shows aborted records).
            continue;
        }
        let (word, count) = value
            .rsplit_once(':')
            .and_then(|(word, count)| Some((word, count.parse::<u64>().ok()?)))
            .ok_or_else(|| ExampleError::Mismatch(format!("a committed record {value:?}")))?;
        seen.entry(word.to_owned()).or_default().push(count);
    }
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    for word in TEXT.iter().flat_map(|line| line.split_whitespace()) {
        *want.entry(word.to_owned()).or_default() += 1;
    }
    let mut last = BTreeMap::new();
    for (word, mut counts) in seen {
        counts.sort_unstable();
        let expected: Vec<u64> = (1..=want.get(&word).copied().unwrap_or(0)).collect();
        if counts != expected {
            return Err(ExampleError::Mismatch(format!(
                "`{word}` was committed as {counts:?}, not once each of {expected:?}"
            )));
        }
        last.insert(word, counts.last().copied().unwrap_or(0));
    }
    if last != want {
        return Err(ExampleError::Mismatch(format!(
            "the committed counts {last:?} differ from the text's {want:?}"
        )));
    }
    Ok(last)
}

fn one_record_per_batch() -> Vec<(String, String)> {
    vec![
        ("batch.num.messages".to_owned(), "1".to_owned()),
        ("linger.ms".to_owned(), "0".to_owned()),
    ]
}
