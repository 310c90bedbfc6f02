//! A child process for the process-crash test: runs the test pipeline on a
//! file checkpoint store and an exactly-once file sink, resuming from the
//! store's latest checkpoint if there is one. The parent kills it with
//! SIGKILL at random moments and starts it again on the same directories.
//!
//! Usage: `job_runner <store dir> <output dir> <records>`. Prints
//! `resumed <checkpoint>` when it resumed, and `done` when the job finished.

use std::path::PathBuf;
use std::process::ExitCode;

use snapflow::job::{Job, JobConfig, RestartStrategy};
use snapflow_tests::file_sink::SlowCommitFileSink;
use snapflow_tests::pipeline::{declare, Pacing};
use snapflow_tests::Faults;

fn run(store: PathBuf, output: PathBuf, records: u64) -> Result<(), Box<dyn std::error::Error>> {
    let config = JobConfig {
        checkpoint_interval_ms: Some(10),
        default_parallelism: 2,
        batch_size_max: 16,
        arbiters: Some(2),
        restart: RestartStrategy::None,
        ..JobConfig::default()
    }
    .with_store_dir(store, "crash")?;
    let job = Job::new("crash", config);
    let pacing = Pacing {
        records_per_read: 16,
    };
    let _state = declare(
        &job,
        records,
        [2; 6],
        pacing,
        &Faults::none(),
        SlowCommitFileSink::new(&output, 20)?,
    );
    let report = job.run()?;
    if let Some(checkpoint) = report.resumed_from {
        println!("resumed {checkpoint}");
    }
    println!("done");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let [_, store, output, records] = args.as_slice() else {
        eprintln!("usage: job_runner <store dir> <output dir> <records>");
        return ExitCode::from(2);
    };
    let Ok(records) = records.parse() else {
        eprintln!("records must be a number, got {records}");
        return ExitCode::from(2);
    };
    match run(store.into(), output.into(), records) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("job failed: {error}");
            ExitCode::FAILURE
        }
    }
}
