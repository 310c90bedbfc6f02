//! A child process for the broker probe `kafka_probe.rs`: commits
//! transactions that each carry one record and one transactional offset
//! (as the exactly-once sink's commit marker does), prints `committed <k>`
//! after each `commit_transaction` returned, and then waits to be killed.
//!
//! Usage:
//!
//! ```text
//! kafka_commit_child <brokers> <topic> <group> <transactional id> <transactions> [<next id>]
//! ```
//!
//! Transaction `k` (from 1) commits the offset `k` of partition 0 of
//! `<topic>` for `<group>`. With `<next id>`, a producer with that
//! transactional id then opens one more transaction, sends its record and
//! the offset `<transactions> + 1` and flushes, but never commits (as the
//! sink's next checkpoint does before its commit), and the child prints
//! `pending`. The parent kills it (SIGKILL) the moment it
//! reads the last line and then asks the broker which offset the group
//! holds: what a restore in a new process would read.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const TIMEOUT: Duration = Duration::from_secs(30);

/// Commits transactions that each carry one record and one transactional
/// offset, then waits to be killed; the child of the broker probe.
#[derive(clap::Parser)]
#[command(name = "kafka_commit_child")]
struct Arguments {
    /// The Kafka brokers.
    brokers: String,
    /// The topic whose partition 0 offsets are committed.
    topic: String,
    /// The consumer group the offsets are committed for.
    group: String,
    /// The producer's transactional id.
    #[arg(value_name = "TRANSACTIONAL_ID")]
    id: String,
    /// How many transactions to commit.
    transactions: i64,
    /// A second transactional id that opens one more transaction and
    /// never commits it.
    #[arg(value_name = "NEXT_ID")]
    next: Option<String>,
}

fn main() -> ExitCode {
    // Clap prints a usage error and exits with code 2.
    let arguments = <Arguments as clap::Parser>::parse();
    let Arguments {
        brokers,
        topic,
        group,
        id,
        transactions,
        next,
    } = &arguments;
    let (transactions, next) = (*transactions, next.as_deref());
    match run(brokers, topic, group, id, transactions, next) {
        Ok(()) => loop {
            // Killed here by the parent.
            std::thread::sleep(Duration::from_secs(1));
        },
        Err(error) => {
            eprintln!("kafka_commit_child: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(
    brokers: &str,
    topic: &str,
    group: &str,
    id: &str,
    transactions: i64,
    next: Option<&str>,
) -> Result<(), rdkafka::error::KafkaError> {
    let transactional = |id: &str| -> Result<BaseProducer, rdkafka::error::KafkaError> {
        ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("transactional.id", id)
            .create()
    };
    let producer = transactional(id)?;
    let group_client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let metadata = group_client
        .group_metadata()
        .expect("a consumer with a group id has group metadata");
    producer.init_transactions(TIMEOUT)?;
    let open = |producer: &BaseProducer, k: i64| -> Result<(), rdkafka::error::KafkaError> {
        producer.begin_transaction()?;
        let value = format!("record {k}");
        producer
            .send(BaseRecord::<(), _>::to(topic).partition(0).payload(&value))
            .map_err(|(error, _)| error)?;
        let mut offsets = TopicPartitionList::new();
        offsets.add_partition_offset(topic, 0, Offset::Offset(k))?;
        producer.send_offsets_to_transaction(&offsets, &metadata, TIMEOUT)
    };
    for k in 1..=transactions {
        open(&producer, k)?;
        producer.commit_transaction(TIMEOUT)?;
        say(&format!("committed {k}"));
    }
    if let Some(next) = next {
        let next = transactional(next)?;
        next.init_transactions(TIMEOUT)?;
        open(&next, transactions + 1)?;
        next.flush(TIMEOUT)?;
        say("pending");
        // Kept open until the kill.
        std::mem::forget(next);
    }
    Ok(())
}

fn say(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}
