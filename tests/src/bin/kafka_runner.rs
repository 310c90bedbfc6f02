//! A child process for the Kafka process-crash tests: runs Kafka → parse
//! → keyed count → Kafka (exactly-once) on a file checkpoint store,
//! resuming from the store's latest checkpoint if there is one. The
//! parent kills it with SIGKILL at random moments (or while a commit is
//! held after its checkpoint completed) and starts it again on the same
//! store.
//!
//! Usage:
//!
//! ```text
//! kafka_runner <store dir> <brokers> <input topic> <output topic> <job> <parallelism> <commit log file> <panic at id> [--hold-first-commit]
//! ```
//!
//! Every commit is delayed by 20 ms (`snapflow_tests::slow_commit`), which
//! widens the window in which a kill finds a completed checkpoint whose
//! transactions are not committed yet; `--hold-first-commit` prints
//! `holding commit <id>` before the first commit of a checkpoint with
//! records and waits there. `parse` panics once per process at record
//! `<panic at id>` (a restart inside the process follows). Every
//! transaction the sink commits is appended to the commit log file
//! (`snapflow_tests::logged_commits`). At the end it prints
//! `recovered <n> rewritten <n>` (the sink's restores in this run),
//! `state <key> <count>` per key, and `done`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::thread;
use std::time::Duration;

use snapflow::connectors::kafka::{
    BadRecords, KafkaSinkConfig, KafkaSinkFactory, KafkaSourceConfig, KafkaSourceFactory,
};
use snapflow::job::{Job, JobConfig, RestartStrategy};
use snapflow::Snapshot;
use snapflow_tests::kafka_count::{decode_id as decode, encode_count as encode};
use snapflow_tests::logged_commits::LoggedCommits;
use snapflow_tests::slow_commit::SlowCommits;
use snapflow_tests::{FaultKind, Faults};

/// Keys of the count (the tests compute the same).
pub const KEYS: u64 = 7;
/// The checkpoint interval.
const INTERVAL_MS: u64 = 100;
/// The delay before every commit.
const COMMIT_DELAY_MS: u64 = 20;
/// The pause per parsed record, so that a run spans several checkpoints.
const PAUSE_US: u64 = 300;

/// Runs Kafka → parse → keyed count → Kafka (exactly once) on a file
/// checkpoint store; a child process of the Kafka process-crash tests.
#[derive(clap::Parser)]
#[command(name = "kafka_runner")]
struct Arguments {
    /// The checkpoint store directory.
    #[arg(value_name = "STORE_DIR")]
    store: String,
    /// The Kafka brokers.
    brokers: String,
    /// The input topic.
    #[arg(value_name = "INPUT_TOPIC")]
    input: String,
    /// The output topic.
    #[arg(value_name = "OUTPUT_TOPIC")]
    output: String,
    /// The job's name (and the sink's transactional ids' prefix).
    #[arg(value_name = "JOB")]
    job_name: String,
    /// Parallelism of every operator.
    parallelism: usize,
    /// The file every committed transaction is appended to.
    #[arg(value_name = "COMMIT_LOG_FILE")]
    log_file: String,
    /// The record id at which `parse` panics once per process.
    #[arg(value_name = "PANIC_AT_ID")]
    panic_at: u64,
    /// Print `holding commit <id>` before the first commit of a
    /// checkpoint with records and wait there.
    #[arg(long)]
    hold_first_commit: bool,
}

#[derive(Snapshot, Debug, Clone, Default)]
struct Count {
    seen: u64,
}

fn run(arguments: &Arguments) -> Result<(), Box<dyn std::error::Error>> {
    let Arguments {
        store,
        brokers,
        input,
        output,
        job_name,
        log_file,
        ..
    } = arguments;
    let (parallelism, panic_at) = (arguments.parallelism, arguments.panic_at);
    let hold = arguments.hold_first_commit;
    let config = JobConfig {
        checkpoint_interval_ms: Some(INTERVAL_MS),
        default_parallelism: parallelism,
        batch_size_max: 16,
        max_parallelism: 16,
        arbiters: Some(2),
        restart: RestartStrategy::FixedDelay {
            attempts_max: 5,
            delay_ms: 0,
        },
        ..JobConfig::default()
    }
    .with_store_dir(PathBuf::from(store), "kafka-crash")?;
    let mut source = KafkaSourceConfig::new(brokers, &[input.as_str()]);
    source.bounded = true;
    source.bad_records = BadRecords::Fail;
    let source = KafkaSourceFactory::new(source, decode)?;
    let mut sink = KafkaSinkConfig::new(brokers, output, job_name, "out");
    sink.transaction_timeout_ms = 30_000;
    let sink = KafkaSinkFactory::new(sink, encode)?;
    let log = sink.commit_log();
    let sink = SlowCommits::new(
        LoggedCommits::new(sink, log.clone(), PathBuf::from(log_file)),
        COMMIT_DELAY_MS,
        hold,
    );
    trace_recovery(log_file)?;
    let faults = Faults::new(vec![("parse", panic_at, FaultKind::Panic)]);
    snapflow_tests::quiet_injected_panics();
    let job = Job::new(job_name, config);
    let (counted, state) = job
        .source("in", source)
        .map("parse", move |id: u64| {
            faults.check_or_panic("parse", id);
            thread::sleep(Duration::from_micros(PAUSE_US));
            id
        })
        .key_by(|id: &u64| id % KEYS)
        .process_with_state("count", |key: &u64, count: &mut Count, _, out| {
            count.seen += 1;
            out.emit((*key, count.seen));
            Ok(())
        });
    counted.sink("out", sink);
    let report = job.run()?;
    if let Some(checkpoint) = report.resumed_from {
        println!("resumed {checkpoint}");
    }
    for fallback in &report.fallbacks {
        println!(
            "fell back past {} ({})",
            fallback.checkpoint, fallback.reason
        );
    }
    println!(
        "recovered {} rewritten {}",
        log.recovered(),
        log.rewritten()
    );
    let mut counts: Vec<(u64, u64)> = state
        .snapshot()
        .into_iter()
        .map(|(key, count)| (key, count.seen))
        .collect();
    counts.sort_unstable();
    for (key, count) in counts {
        println!("state {key} {count}");
    }
    println!("done");
    Ok(())
}

/// Appends the Kafka connector's events (what each restore's commit
/// marker said, rewrites) to `<commit log file>.trace`, after a line
/// naming this process, for a failing test's message. The runs of one
/// case never overlap (each is killed before the next starts), so their
/// lines do not interleave.
fn trace_recovery(log_file: &str) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(format!("{log_file}.trace"))?;
    writeln!(file, "pid {}", std::process::id())?;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "snapflow::connectors::kafka=info",
        ))
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file))
        .init();
    Ok(())
}

fn main() -> ExitCode {
    // Clap prints a usage error and exits with code 2.
    match run(&<Arguments as clap::Parser>::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("kafka_runner failed: {error}");
            ExitCode::FAILURE
        }
    }
}
