//! `snapflow`: the command-line tool for a store directory. It lists the
//! checkpoints and savepoints of every job, shows one (operators, parts
//! with sizes and checksums, key groups, source positions with Kafka
//! offsets per partition, sink states with their pending transactions,
//! the stored schema of state blobs) and verifies one or all (every part present,
//! every size and checksum right; verifying all also lists leftovers:
//! entries that never committed, entries set aside as damaged, shared
//! files nothing refers to). Text by default, JSON with `--json`.
//!
//! It deletes an entry or prunes old checkpoints only when told to, the
//! way retention does (metadata first), and keeps the newest complete
//! checkpoint, the job's restore point, unless `--force` says otherwise.
//! Otherwise it only reads: it never creates or repairs anything. Exit
//! codes: 0 success, 1 an error or a damaged checkpoint, 2 a usage error.
//!
//! A store is a directory or, with the `s3` feature (on by default), an
//! object-storage location `s3://bucket/prefix`, whose endpoint and
//! credentials come from `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY` and `AWS_REGION`. Deleting and pruning there
//! take the store over, so a job still running on it fails at its next
//! checkpoint: stop it first.
//!
//! ```sh
//! snapflow list target/snapflow-checkpoints
//! snapflow show target/snapflow-checkpoints wordcount 12 --json
//! snapflow show --dir path/to/savepoint-7
//! snapflow verify target/snapflow-checkpoints wordcount
//! snapflow prune target/snapflow-checkpoints wordcount --keep 2
//! snapflow verify s3://my-bucket/checkpoints wordcount
//! ```

mod report;
mod state;
mod store;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde::Serialize;

use report::Verdict;
use store::CliError;

/// Lists, shows, verifies, deletes and prunes the checkpoints of a
/// checkpoint store. Exit codes: 0 success, 1 an error or a damaged
/// checkpoint, 2 a usage error.
#[derive(Debug, Parser)]
#[command(name = "snapflow", version)]
struct Cli {
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

/// What to do, parsed from the command line. A `STORE_DIR` is a store
/// directory or, with the `s3` feature, `s3://bucket/prefix`.
#[derive(Debug, Subcommand)]
enum Command {
    /// List the checkpoints and savepoints of every job in the store.
    List {
        /// The store: a directory or s3://bucket/prefix.
        #[arg(value_name = "STORE_DIR")]
        root: PathBuf,
    },
    /// Show one checkpoint: operators, parts, key groups, source
    /// positions, sink states and the stored schema of its state.
    Show(ShowArgs),
    /// Verify one checkpoint, or every checkpoint of the job and list its
    /// leftovers; exit code 1 when one is damaged.
    Verify {
        /// The store: a directory or s3://bucket/prefix.
        #[arg(value_name = "STORE_DIR")]
        root: PathBuf,
        /// The job's name.
        job: String,
        /// The checkpoint to verify; every one when left out.
        #[arg(value_parser = checkpoint_id)]
        id: Option<u64>,
    },
    /// Delete one checkpoint or savepoint, metadata first.
    Delete {
        /// The store: a directory or s3://bucket/prefix.
        #[arg(value_name = "STORE_DIR")]
        root: PathBuf,
        /// The job's name.
        job: String,
        /// The checkpoint to delete.
        #[arg(value_parser = checkpoint_id)]
        id: u64,
        /// Delete it even if it is the newest complete checkpoint, the
        /// one the job restores from.
        #[arg(long)]
        force: bool,
    },
    /// Delete all but the newest N checkpoints of the job.
    Prune {
        /// The store: a directory or s3://bucket/prefix.
        #[arg(value_name = "STORE_DIR")]
        root: PathBuf,
        /// The job's name.
        job: String,
        /// How many of the newest checkpoints to keep (at least 1).
        #[arg(long, value_name = "N", value_parser = keep_count, required = true)]
        keep: usize,
    },
}

/// `show`: a checkpoint of a store, or a checkpoint directory alone.
#[derive(Debug, clap::Args)]
struct ShowArgs {
    /// Show this checkpoint directory on its own (a savepoint's copy, say)
    /// instead of a store's entry.
    #[arg(long, value_name = "CHECKPOINT_DIR", conflicts_with_all = ["root", "job", "id"])]
    dir: Option<PathBuf>,
    /// The store: a directory or s3://bucket/prefix.
    #[arg(value_name = "STORE_DIR", required_unless_present = "dir")]
    root: Option<PathBuf>,
    /// The job's name.
    #[arg(required_unless_present = "dir")]
    job: Option<String>,
    /// The checkpoint to show.
    #[arg(value_parser = checkpoint_id, required_unless_present = "dir")]
    id: Option<u64>,
}

/// What `delete` and `prune` removed.
#[derive(Debug, Serialize)]
struct Deleted {
    job: String,
    deleted: Vec<u64>,
}

/// A checkpoint id on the command line.
fn checkpoint_id(text: &str) -> Result<u64, String> {
    text.parse()
        .map_err(|_| format!("a checkpoint id is a number, not {text:?}"))
}

/// `--keep`: a number of checkpoints, at least 1.
fn keep_count(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(keep) if keep > 0 => Ok(keep),
        _ => Err(format!(
            "--keep takes a number of checkpoints, at least 1, not {text:?}"
        )),
    }
}

/// Prints `value` as JSON or as `text` renders it.
fn print<T: Serialize>(value: &T, json: bool, text: impl FnOnce(&T) -> String) {
    if json {
        match serde_json::to_string_pretty(value) {
            Ok(document) => println!("{document}"),
            Err(error) => eprintln!("snapflow: the report does not serialize: {error}"),
        }
    } else {
        print!("{}", text(value));
    }
}

/// Runs `command`; `Ok(false)` when it found a damaged checkpoint.
fn run(command: Command, json: bool) -> Result<bool, CliError> {
    match command {
        Command::List { root } => {
            let jobs = store::jobs(&root)?
                .iter()
                .map(|job| store::entries(&store::open(&root, job)?, job))
                .collect::<Result<Vec<_>, _>>()?;
            print(&report::listing(jobs), json, |jobs| {
                report::listing_text(jobs)
            });
            Ok(true)
        }
        Command::Show(ShowArgs { dir: Some(dir), .. }) => show(store::load_dir(&dir)?, &dir, json),
        Command::Show(ShowArgs {
            root: Some(root),
            job: Some(job),
            id: Some(id),
            ..
        }) => {
            let store = store::open(&root, &job)?;
            let loaded = store::load(&store, id)?;
            let directory = store.entry_dir(id, loaded.metadata.kind);
            show(loaded, &directory, json)
        }
        // Clap requires the store, job and id unless `--dir` is given.
        Command::Show(_) => Err(CliError::Usage(
            "show takes STORE_DIR JOB ID or --dir CHECKPOINT_DIR".to_string(),
        )),
        Command::Verify { root, job, id } => verify(&root, &job, id, json),
        Command::Delete {
            root,
            job,
            id,
            force,
        } => delete(&root, &job, id, force, json),
        Command::Prune { root, job, keep } => {
            let deleted = store::open_owned(&root, &job)?.prune(keep)?;
            print_deleted(Deleted { job, deleted }, json);
            Ok(true)
        }
    }
}

/// Deletes entry `id` of `job`; the newest complete checkpoint only with
/// `force`, because it is what the job restores from.
fn delete(
    root: &std::path::Path,
    job: &str,
    id: u64,
    force: bool,
    json: bool,
) -> Result<bool, CliError> {
    let store = store::open_owned(root, job)?;
    let newest = store::entries(&store, job)?
        .entries
        .iter()
        .filter(|entry| entry.kind == snapflow::storage::CheckpointKind::Checkpoint)
        .map(|entry| entry.checkpoint)
        .max();
    if newest == Some(id) && !force {
        return Err(CliError::Usage(format!(
            "checkpoint {id} is the newest of job {job}, the one it restores from; \
             add --force to delete it anyway"
        )));
    }
    store.delete(id)?;
    print_deleted(
        Deleted {
            job: job.to_string(),
            deleted: vec![id],
        },
        json,
    );
    Ok(true)
}

fn print_deleted(deleted: Deleted, json: bool) {
    print(&deleted, json, |deleted: &Deleted| {
        let ids: Vec<String> = deleted.deleted.iter().map(u64::to_string).collect();
        match ids.is_empty() {
            true => format!("job {}: nothing to delete\n", deleted.job),
            false => format!("job {}: deleted {}\n", deleted.job, ids.join(", ")),
        }
    });
}

fn show(
    loaded: snapflow::storage::LoadedCheckpoint,
    directory: &std::path::Path,
    json: bool,
) -> Result<bool, CliError> {
    let shown = report::shown(loaded, directory).map_err(|reason| {
        CliError::Usage(format!(
            "the checkpoint verified but a part does not decode: {reason}"
        ))
    })?;
    print(&shown, json, report::shown_text);
    Ok(true)
}

/// Verifies checkpoint `id` of `job`, or every one the store lists.
fn verify(
    root: &std::path::Path,
    job: &str,
    id: Option<u64>,
    json: bool,
) -> Result<bool, CliError> {
    let store = store::open(root, job)?;
    // The whole job: its leftovers too (an entry whose metadata does not
    // read is listed by no load, so it is found there and judged here).
    let (unreadable, leftovers) = match id {
        Some(_) => (Vec::new(), Vec::new()),
        None => report::split_leftovers(store.leftovers()?),
    };
    let ids = match id {
        Some(id) => vec![id],
        None => store::entries(&store, job)?
            .entries
            .iter()
            .map(|entry| entry.checkpoint)
            .collect(),
    };
    let mut checkpoints: Vec<Verdict> = ids
        .into_iter()
        .map(|id| {
            let problem = store::load(&store, id).err().map(|error| error.to_string());
            Verdict {
                id,
                ok: problem.is_none(),
                problem,
            }
        })
        .chain(unreadable)
        .collect();
    checkpoints.sort_by_key(|verdict| verdict.id);
    let verified = report::Verified {
        checkpoints,
        leftovers,
    };
    print(&verified, json, |verified: &report::Verified| {
        report::verified_text(job, verified)
    });
    Ok(verified.checkpoints.iter().all(|verdict| verdict.ok))
}

fn main() -> ExitCode {
    // Clap prints the help (exit code 0) or a usage error (exit code 2)
    // and exits by itself.
    let cli = Cli::parse();
    match run(cli.command, cli.json) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("snapflow: {error}");
            ExitCode::from(1)
        }
    }
}
