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

const USAGE: &str = "usage: job_runner [--stop-on-signals] <store dir> <records> <parallelism> file <output dir>\n       \
     job_runner <store dir> <records> <parallelism> window <output dir>\n       \
     job_runner <store dir> <records> <parallelism> postgres <url> <exactly-once|idempotent> <job> <table> [--multi-row] [--hold-first-commit]";

/// What the command line asked for.
struct Run {
    store: PathBuf,
    /// Stop gracefully on SIGTERM and SIGINT.
    stop_on_signals: bool,
    records: u64,
    parallelism: usize,
    sink: SinkChoice,
}

enum SinkChoice {
    File {
        output: PathBuf,
    },
    /// The windowed pipeline into files.
    Window {
        output: PathBuf,
    },
    Postgres {
        url: String,
        mode: Mode,
        job: String,
        table: String,
        multi_row: bool,
        hold_first_commit: bool,
    },
}

fn parse(args: &[String]) -> Result<Run, String> {
    let number = |text: &String, what: &str| -> Result<u64, String> {
        text.parse()
            .map_err(|_| format!("{what} must be a number, got {text:?}"))
    };
    let (store, records, parallelism, sink) = match args {
        [store, records, parallelism, rest @ ..] => (store, records, parallelism, rest),
        _ => return Err(USAGE.to_string()),
    };
    let parallelism = number(parallelism, "parallelism")?;
    if parallelism == 0 {
        return Err("parallelism must be at least 1".to_string());
    }
    let sink = match sink {
        [kind, output] if kind == "file" => SinkChoice::File {
            output: output.into(),
        },
        [kind, output] if kind == "window" => SinkChoice::Window {
            output: output.into(),
        },
        [kind, url, mode, job, table, flags @ ..] if kind == "postgres" => {
            if let Some(flag) = flags
                .iter()
                .find(|flag| !["--multi-row", "--hold-first-commit"].contains(&flag.as_str()))
            {
                return Err(format!("unknown flag {flag:?}\n{USAGE}"));
            }
            SinkChoice::Postgres {
                url: url.clone(),
                mode: match mode.as_str() {
                    "exactly-once" => Mode::ExactlyOnce,
                    "idempotent" => Mode::Idempotent,
                    other => return Err(format!("unknown mode {other:?}\n{USAGE}")),
                },
                job: job.clone(),
                table: table.clone(),
                multi_row: flags.iter().any(|flag| flag == "--multi-row"),
                hold_first_commit: flags.iter().any(|flag| flag == "--hold-first-commit"),
            }
        }
        _ => return Err(USAGE.to_string()),
    };
    Ok(Run {
        store: store.into(),
        stop_on_signals: false,
        records: number(records, "records")?,
        parallelism: parallelism as usize,
        sink,
    })
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
    let args: Vec<String> = std::env::args().skip(1).collect();
    let stop_on_signals = args.iter().any(|arg| arg == "--stop-on-signals");
    let args: Vec<String> = args
        .into_iter()
        .filter(|arg| arg != "--stop-on-signals")
        .collect();
    let parsed = match parse(&args) {
        Ok(parsed) => Run {
            stop_on_signals,
            ..parsed
        },
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(&parsed) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("job failed: {error}");
            ExitCode::FAILURE
        }
    }
}
