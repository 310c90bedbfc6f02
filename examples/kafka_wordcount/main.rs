//! Word count from Kafka to Kafka, exactly once: a first job writes a few
//! lines of text into the topic `lines` (at-least-once, through the same
//! sink), a second job reads `lines`, counts words per key with
//! checkpoints every 200 ms and writes `word:count` records into the
//! topic `word-counts` in Kafka transactions.
//!
//! Run it with the broker and topics that `run.sh` in this folder starts
//! and creates:
//!
//! ```text
//! bash examples/kafka_wordcount/run.sh
//! ```
//!
//! or by hand, with `SNAPFLOW_KAFKA_BROKERS` naming a broker that has the
//! topics `lines` and `word-counts`:
//!
//! ```text
//! cargo run -p snapflow-examples --features kafka --example kafka_wordcount
//! ```

use std::error::Error;

use snapflow::connectors::kafka::{
    Delivery, KafkaOut, KafkaSinkConfig, KafkaSinkFactory, KafkaSourceConfig, KafkaSourceFactory,
};
use snapflow::job::{Job, JobConfig};
use snapflow::source::VecSourceFactory;
use snapflow::Snapshot;

/// The text the first job writes, one record per line.
const TEXT: &[&str] = &[
    "the quick brown fox jumps over the lazy dog",
    "the dog sleeps and the fox runs",
    "a fox a dog a day",
];

/// One word's count, the keyed state.
#[derive(Snapshot, Default, Clone)]
struct Count {
    seen: u64,
}

fn main() -> Result<(), Box<dyn Error>> {
    let brokers =
        std::env::var("SNAPFLOW_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:19092".to_owned());

    // Job 1: the input. tansu 0.6 reports a partition's end per batch, not
    // per record, so the bounded reader below would stop early on batched
    // input: one record per batch keeps the end right (see
    // ARCHITECTURE.md, Kafka).
    let mut input = KafkaSinkConfig::new(&brokers, "lines", "kafka-wordcount-input", "lines");
    input.delivery = Delivery::AtLeastOnce;
    input.client_options = vec![
        ("batch.num.messages".to_owned(), "1".to_owned()),
        ("linger.ms".to_owned(), "0".to_owned()),
    ];
    let input = KafkaSinkFactory::new(input, |line: &String| KafkaOut {
        key: None,
        value: line.clone().into_bytes(),
        partition: Some(0),
    })?;
    let writer = Job::new("kafka-wordcount-input", JobConfig::default());
    let lines: Vec<String> = TEXT.iter().map(|line| (*line).to_owned()).collect();
    writer
        .source("text", VecSourceFactory::new(lines))
        .sink("lines", input);
    writer.run()?;

    // Job 2: the count, exactly once.
    let mut source = KafkaSourceConfig::new(&brokers, &["lines"]);
    source.bounded = true;
    let source = KafkaSourceFactory::new(source, |record| {
        let value = record.value().ok_or("a record without a value")?;
        String::from_utf8(value.to_vec()).map_err(|error| error.to_string())
    })?;
    let checkpoint_interval_ms = 200;
    let mut sink = KafkaSinkConfig::new(&brokers, "word-counts", "kafka-wordcount", "counts");
    sink.checkpoint_interval_ms = Some(checkpoint_interval_ms);
    let sink = KafkaSinkFactory::new(sink, |(word, count): &(String, u64)| KafkaOut {
        key: Some(word.clone().into_bytes()),
        value: format!("{word}:{count}").into_bytes(),
        partition: None,
    })?;
    let log = sink.commit_log();
    let job = Job::new(
        "kafka-wordcount",
        JobConfig {
            checkpoint_interval_ms: Some(checkpoint_interval_ms),
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
    println!(
        "counted; {} checkpoints, {} transactions committed into `word-counts`",
        report.checkpoints.len(),
        log.committed().len()
    );
    Ok(())
}
