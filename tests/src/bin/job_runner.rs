//! A child process for the process-crash tests: runs the keyed test
//! pipeline on a file checkpoint store into an exactly-once sink (files,
//! or a PostgreSQL table), resuming from the store's latest checkpoint if
//! there is one. The parent kills it with SIGKILL at random moments (or
//! while a commit is held) and starts it again on the same store.
//!
//! Usage:
//!
//! ```text
//! job_runner <store dir> <records> <parallelism> file <output dir>
//! job_runner <store dir> <records> <parallelism> window <output dir>
//! job_runner <store dir> <records> <parallelism> postgres <url> <exactly-once|idempotent> <job> <table> [--multi-row] [--hold-first-commit]
//! ```
//!
//! `<store dir>` may also be an object-storage location,
//! `s3://bucket/prefix` (endpoint and credentials from the `AWS_*`
//! variables; `JobConfig::with_store_location`).
//!
//! `window` runs the windowed pipeline (`snapflow_tests::window_pipeline`)
//! into files instead of the keyed one.
//!
//! Every commit is delayed by 20 ms, which widens the window in which a
//! kill finds a durable checkpoint whose output is not committed yet.
//! `--multi-row` sends the rows as multi-row inserts instead of one
//! statement per row; `--hold-first-commit` prints `holding commit <id>` and waits before
//! the first commit of a checkpoint the sink staged rows for (see
//! `snapflow_tests::slow_commit`). Prints `resumed <checkpoint>` when it
//! resumed, and `done` when the job finished.
//!
//! With the environment variable `SNAPFLOW_SAVEPOINT_EVERY_MS=n` it also
//! asks for a savepoint every `n` ms while the job runs (one at a time:
//! a request while one is in flight is dropped), so that a kill can land
//! while one is written.
//!
//! `--stop-on-signals` (anywhere) makes SIGTERM and SIGINT stop the job
//! gracefully (`RunningJob::stop_on_signals`): it prints `started` once
//! the job runs with the watch, and `savepoint <id>` when a signal
//! stopped it with a savepoint.

use std::path::PathBuf;
use std::process::ExitCode;

use snapflow::connectors::postgres::Mode;
use snapflow::job::{Job, JobConfig, RestartStrategy};
use snapflow::sink::{Sink, SinkFactory};
use snapflow_tests::pipeline::{declare, Pacing};
use snapflow_tests::slow_commit::SlowCommits;
use snapflow_tests::Faults;

/// The delay before every commit.
const COMMIT_DELAY_MS: u64 = 20;

/// Runs the keyed test pipeline (or the windowed one) on a checkpoint
/// store into an exactly-once sink, resuming from the store's latest
/// checkpoint; a child process of the process-crash tests.
#[derive(clap::Parser)]
#[command(name = "job_runner")]
struct Run {
    /// The checkpoint store: a directory or s3://bucket/prefix.
    #[arg(value_name = "STORE_DIR")]
    store: PathBuf,
    /// Records the source reads.
    #[arg(value_parser = number::<u64>)]
    records: u64,
    /// Parallelism of every operator (at least 1).
    #[arg(value_parser = parallelism)]
    parallelism: usize,
    /// Stop gracefully on SIGTERM and SIGINT (anywhere on the line).
    #[arg(long, global = true)]
    stop_on_signals: bool,
    #[command(subcommand)]
    sink: SinkChoice,
}

/// Where the pipeline writes.
#[derive(clap::Subcommand)]
enum SinkChoice {
    /// The keyed pipeline into the exactly-once file sink.
    File {
        /// The sink's output directory.
        #[arg(value_name = "OUTPUT_DIR")]
        output: PathBuf,
    },
    /// The windowed pipeline into files.
    Window {
        /// The sink's output directory.
        #[arg(value_name = "OUTPUT_DIR")]
        output: PathBuf,
    },
    /// The keyed pipeline into a PostgreSQL table.
    Postgres {
        /// The server's connection string.
        url: String,
        /// exactly-once or idempotent.
        #[arg(value_parser = mode)]
        mode: Mode,
        /// The sink's job name.
        job: String,
        /// The table.
        table: String,
        /// Send the rows as multi-row inserts instead of one statement
        /// per row.
        #[arg(long)]
        multi_row: bool,
        /// Print `holding commit <id>` and wait before the first commit
        /// of a checkpoint the sink staged rows for.
        #[arg(long)]
        hold_first_commit: bool,
    },
}

/// A number argument.
fn number<T: std::str::FromStr>(text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("must be a number, got {text:?}"))
}

/// The parallelism: a number of at least 1.
fn parallelism(text: &str) -> Result<usize, String> {
    match number(text)? {
        0 => Err("parallelism must be at least 1".to_string()),
        parallelism => Ok(parallelism),
    }
}

/// The PostgreSQL sink's mode.
fn mode(text: &str) -> Result<Mode, String> {
    match text {
        "exactly-once" => Ok(Mode::ExactlyOnce),
        "idempotent" => Ok(Mode::Idempotent),
        other => Err(format!(
            "unknown mode {other:?} (exactly-once or idempotent)"
        )),
    }
}

/// The job both pipelines run in: checkpoints every 10 ms into the store
/// directory, no restart (the parent restarts the process). The
/// environment variable `SNAPFLOW_COPY_ON_WRITE_THRESHOLD_KEYS`, when set,
/// is `JobConfig::copy_on_write_threshold_keys` (the crash test varies the
/// keyed state's layout between processes).
fn crash_job(run: &Run) -> Result<Job, Box<dyn std::error::Error>> {
    let copy_on_write_threshold_keys = match std::env::var("SNAPFLOW_COPY_ON_WRITE_THRESHOLD_KEYS")
    {
        Ok(text) => text.parse().map_err(|_| {
            format!("SNAPFLOW_COPY_ON_WRITE_THRESHOLD_KEYS must be a number, got {text:?}")
        })?,
        Err(_) => JobConfig::default().copy_on_write_threshold_keys,
    };
    let config = JobConfig {
        checkpoint_interval_ms: Some(10),
        default_parallelism: run.parallelism,
        batch_size_max: 16,
        arbiters: Some(2),
        restart: RestartStrategy::None,
        copy_on_write_threshold_keys,
        ..JobConfig::default()
    }
    .with_store_location(&run.store.to_string_lossy(), "crash")?;
    Ok(Job::new("crash", config))
}

const PACING: Pacing = Pacing {
    records_per_read: 16,
};

fn run_with<F>(run: &Run, sink: F) -> Result<(), Box<dyn std::error::Error>>
where
    F: SinkFactory + Send + Sync + 'static,
    F::Sink: Sink<Item = (u64, u64)> + 'static,
{
    let job = crash_job(run)?;
    let _state = declare(
        &job,
        run.records,
        [run.parallelism; 6],
        PACING,
        &Faults::none(),
        sink,
    );
    finish(job, run.stop_on_signals)
}

fn run_windows(run: &Run, output: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let job = crash_job(run)?;
    let sink = snapflow_tests::file_sink::factory(output)?;
    let sink = SlowCommits::new(sink, COMMIT_DELAY_MS, false);
    snapflow_tests::window_pipeline::declare(&job, run.records, run.parallelism, PACING, sink);
    finish(job, run.stop_on_signals)
}

/// Runs `job` (asking for savepoints as `SNAPFLOW_SAVEPOINT_EVERY_MS`
/// says) and prints where it resumed from, the savepoint a signal
/// stopped it with, and `done`.
fn finish(job: Job, stop_on_signals: bool) -> Result<(), Box<dyn std::error::Error>> {
    let savepoint_every_ms =
        match std::env::var("SNAPFLOW_SAVEPOINT_EVERY_MS") {
            Ok(text) => Some(text.parse::<u64>().map_err(|_| {
                format!("SNAPFLOW_SAVEPOINT_EVERY_MS must be a number, got {text:?}")
            })?),
            Err(_) => None,
        };
    let running = job.start()?;
    if stop_on_signals {
        running.stop_on_signals()?;
        println!("started");
    }
    if let Some(every_ms) = savepoint_every_ms {
        while !running.status().ended {
            running.trigger_savepoint();
            std::thread::sleep(std::time::Duration::from_millis(every_ms));
        }
    }
    let report = running.wait()?;
    if let Some(checkpoint) = report.resumed_from {
        println!("resumed {checkpoint}");
    }
    if let Some(savepoint) = report.savepoint {
        println!("savepoint {savepoint}");
    }
    println!("done");
    Ok(())
}

fn run(run: &Run) -> Result<(), Box<dyn std::error::Error>> {
    match &run.sink {
        SinkChoice::File { output } => {
            let sink = snapflow_tests::file_sink::factory(output)?;
            run_with(run, SlowCommits::new(sink, COMMIT_DELAY_MS, false))
        }
        SinkChoice::Window { output } => run_windows(run, output),
        SinkChoice::Postgres {
            url,
            mode,
            job,
            table,
            multi_row,
            hold_first_commit,
        } => {
            let sink = if *multi_row {
                snapflow_tests::postgres::multi_row_factory(url, *mode, job, table)?
            } else {
                snapflow_tests::postgres::factory(url, *mode, job, table)?
            };
            run_with(
                run,
                SlowCommits::new(sink, COMMIT_DELAY_MS, *hold_first_commit),
            )
        }
    }
}

fn main() -> ExitCode {
    // Clap prints a usage error and exits with code 2.
    let parsed = <Run as clap::Parser>::parse();
    match run(&parsed) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("job failed: {error}");
            ExitCode::FAILURE
        }
    }
}
