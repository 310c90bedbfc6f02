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

use serde::Serialize;

use report::Verdict;
use store::CliError;

const USAGE: &str = "usage (STORE_DIR may be s3://bucket/prefix):
  snapflow list STORE_DIR [--json]
  snapflow show STORE_DIR JOB ID [--json]
  snapflow show --dir CHECKPOINT_DIR [--json]
  snapflow verify STORE_DIR JOB [ID] [--json]
  snapflow delete STORE_DIR JOB ID [--force] [--json]
  snapflow prune STORE_DIR JOB --keep N [--json]";

/// What to do, parsed from the command line.
#[derive(Debug, PartialEq, Eq)]
enum Command {
    List {
        root: PathBuf,
    },
    Show {
        root: PathBuf,
        job: String,
        id: u64,
    },
    ShowDir {
        dir: PathBuf,
    },
    Verify {
        root: PathBuf,
        job: String,
        id: Option<u64>,
    },
    Delete {
        root: PathBuf,
        job: String,
        id: u64,
        force: bool,
    },
    Prune {
        root: PathBuf,
        job: String,
        keep: usize,
    },
}

/// What `delete` and `prune` removed.
#[derive(Debug, Serialize)]
struct Deleted {
    job: String,
    deleted: Vec<u64>,
}

/// The command and whether to print JSON.
fn parse(arguments: Vec<String>) -> Result<(Command, bool), CliError> {
    let json = arguments.iter().any(|argument| argument == "--json");
    let force = arguments.iter().any(|argument| argument == "--force");
    let words: Vec<&str> = arguments
        .iter()
        .map(String::as_str)
        .filter(|argument| !matches!(*argument, "--json" | "--force"))
        .collect();
    let id = |text: &str| {
        text.parse::<u64>()
            .map_err(|_| CliError::Usage(format!("a checkpoint id is a number, not {text:?}")))
    };
    let command = match words.as_slice() {
        ["list", root] => Command::List { root: root.into() },
        ["show", "--dir", dir] => Command::ShowDir { dir: dir.into() },
        ["show", root, job, checkpoint] => Command::Show {
            root: root.into(),
            job: job.to_string(),
            id: id(checkpoint)?,
        },
        ["verify", root, job] => Command::Verify {
            root: root.into(),
            job: job.to_string(),
            id: None,
        },
        ["verify", root, job, checkpoint] => Command::Verify {
            root: root.into(),
            job: job.to_string(),
            id: Some(id(checkpoint)?),
        },
        ["delete", root, job, checkpoint] => Command::Delete {
            root: root.into(),
            job: job.to_string(),
            id: id(checkpoint)?,
            force,
        },
        ["prune", root, job, "--keep", keep] => Command::Prune {
            root: root.into(),
            job: job.to_string(),
            keep: match keep.parse::<usize>() {
                Ok(keep) if keep > 0 => keep,
                _ => {
                    return Err(CliError::Usage(format!(
                        "--keep takes a number of checkpoints, at least 1, not {keep:?}"
                    )))
                }
            },
        },
        _ => return Err(CliError::Usage(USAGE.to_string())),
    };
    Ok((command, json))
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
        Command::Show { root, job, id } => {
            let store = store::open(&root, &job)?;
            let loaded = store::load(&store, id)?;
            let directory = store.entry_dir(id, loaded.metadata.kind);
            show(loaded, &directory, json)
        }
        Command::ShowDir { dir } => show(store::load_dir(&dir)?, &dir, json),
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
    let (command, json) = match parse(std::env::args().skip(1).collect()) {
        Ok(parsed) => parsed,
        Err(error) => {
            eprintln!("snapflow: {error}");
            return ExitCode::from(2);
        }
    };
    match run(command, json) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("snapflow: {error}");
            ExitCode::from(1)
        }
    }
}
