//! The PostgreSQL sink under SIGKILL of the job's process, against a real
//! server (`.ci/run` starts it; locally `eval "$(.ci/postgres.sh start)"`;
//! without `SNAPFLOW_POSTGRES_URL` each test prints how to start it and
//! passes, except in CI, where it fails).
//!
//! A child process (`job_runner`) runs the keyed pipeline of
//! `snapflow_tests::pipeline` into a table through the sink, on a file
//! checkpoint store, with every commit delayed by 20 ms:
//!
//! - Killed after seeded random delays, one to three times, then run to
//!   the end on the same store (the harness of `job_crash.rs`,
//!   `snapflow_tests::crash`), in exactly-once mode (plain inserts) and
//!   idempotent mode (upserts), at parallelism 1, 2 and 3 (exactly-once
//!   with the per-row statement and the multi-row insert): the table
//!   equals the direct computation, no row missing or doubled, and no
//!   prepared transaction of the job is left.
//! - Killed exactly between `PREPARE TRANSACTION` and `COMMIT PREPARED`:
//!   the child holds its first commit of a checkpoint with rows and says
//!   so; the parent checks that the transaction is prepared on the
//!   server, kills the child, and runs it again: the restored job
//!   commits that transaction exactly once.
//!
//! Seeds: `SNAPFLOW_PG_CRASH_SEEDS` (default 2) seeds from 1 on per mode
//! and parallelism, so 12 in all; `SNAPFLOW_SEED=n` replays seed n.

#[path = "postgres_sink/support.rs"]
#[allow(dead_code)] // The job tests' fault injection is not used here.
mod support;

use std::path::Path;
use std::process::Command;

use snapflow::connectors::postgres::Mode;
use snapflow_tests::crash::{finish, kill, kill_then_finish, spawn, wait_for_line};
use snapflow_tests::pipeline::{expected, final_counts};
use snapflow_tests::slow_commit::HOLDING;
use snapflow_tests::{seeds, TestRng};

use support::{create_table, prepared_of, rows, server, unique, URL_VAR};

const RECORDS: u64 = 2_000;

/// The child's command line for one run.
fn child(
    store: &Path,
    parallelism: usize,
    (url, mode, job, table): (&str, Mode, &str, &str),
    multi_row: bool,
    hold_first_commit: bool,
) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_job_runner"));
    command
        .arg(store)
        .arg(RECORDS.to_string())
        .arg(parallelism.to_string())
        .args(["postgres", url])
        .arg(match mode {
            Mode::ExactlyOnce => "exactly-once",
            _ => "idempotent",
        })
        .args([job, table]);
    if multi_row {
        command.arg("--multi-row");
    }
    if hold_first_commit {
        command.arg("--hold-first-commit");
    }
    command
}

/// The table the failure-free run leaves: every `(key, count)` update
/// for inserts, every key's final count for upserts.
fn want(mode: Mode) -> Vec<(u64, u64)> {
    match mode {
        Mode::ExactlyOnce => expected(RECORDS).0,
        _ => final_counts(RECORDS),
    }
}

/// The table and the prepared transactions after the last run.
fn check_table(url: &str, mode: Mode, job: &str, table: &str, replay: &str) {
    let (got, want) = (rows(url, table), want(mode));
    assert_eq!(got.len(), want.len(), "{replay}: row count differs");
    assert!(
        got == want,
        "{replay}: the table differs from the direct computation"
    );
    assert_eq!(prepared_of(url, job), Vec::<String>::new(), "{replay}");
}

/// Killed one to three times at random, then run to the end. Even seeds
/// of exactly-once mode send multi-row inserts (upserts cannot: a batch
/// of running counts holds one key twice).
fn check_killed(mode: Mode, parallelism: usize, seed: u64) {
    let Some(url) = server(URL_VAR) else { return };
    let multi_row = mode == Mode::ExactlyOnce && seed % 2 == 0;
    let replay = format!(
        "{mode:?} at parallelism {parallelism}, multi-row {multi_row}, seed {seed} \
         (replay with SNAPFLOW_SEED={seed})"
    );
    let mut rng = TestRng::new(seed);
    let (job, table) = (unique("killed"), unique("rows"));
    create_table(&url, &table, mode == Mode::Idempotent);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = dir.path().join("store");
    let target = (url.as_str(), mode, job.as_str(), table.as_str());
    // Later than the file sink's kills: the child first connects and
    // checks the server, so a kill before 100 ms rarely finds a
    // checkpoint.
    let stdout = kill_then_finish(&mut rng, &replay, (100, 500), || {
        child(&store, parallelism, target, multi_row, false)
    });
    eprintln!("{replay}: last run: {}", stdout.replace('\n', " "));
    check_table(&url, mode, &job, &table, &replay);
}

fn killed_over_seeds(mode: Mode, parallelism: usize) {
    for seed in seeds("SNAPFLOW_PG_CRASH_SEEDS", 2) {
        check_killed(mode, parallelism, seed);
    }
}

#[test]
fn exactly_once_survives_sigkill_at_parallelism_1() {
    killed_over_seeds(Mode::ExactlyOnce, 1);
}

#[test]
fn exactly_once_survives_sigkill_at_parallelism_2() {
    killed_over_seeds(Mode::ExactlyOnce, 2);
}

#[test]
fn exactly_once_survives_sigkill_at_parallelism_3() {
    killed_over_seeds(Mode::ExactlyOnce, 3);
}

#[test]
fn idempotent_survives_sigkill_at_parallelism_1() {
    killed_over_seeds(Mode::Idempotent, 1);
}

#[test]
fn idempotent_survives_sigkill_at_parallelism_2() {
    killed_over_seeds(Mode::Idempotent, 2);
}

#[test]
fn idempotent_survives_sigkill_at_parallelism_3() {
    killed_over_seeds(Mode::Idempotent, 3);
}

/// Killed while a prepared transaction waits for `COMMIT PREPARED`; the
/// next run must resume from that checkpoint or later and commit it.
fn check_kill_between_prepare_and_commit(parallelism: usize) {
    let Some(url) = server(URL_VAR) else { return };
    let replay = format!("parallelism {parallelism}");
    let (job, table) = (unique("held"), unique("rows"));
    create_table(&url, &table, false);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = dir.path().join("store");
    let target = (
        url.as_str(),
        Mode::ExactlyOnce,
        job.as_str(),
        table.as_str(),
    );
    let mut held = spawn(&mut child(&store, parallelism, target, false, true));
    let line = wait_for_line(&mut held, HOLDING);
    // "holding commit <checkpoint> of subtask <subtask>"
    let numbers: Vec<u64> = line
        .as_deref()
        .unwrap_or_default()
        .split(' ')
        .filter_map(|word| word.parse().ok())
        .collect();
    let [checkpoint, subtask] = numbers[..] else {
        kill(held);
        panic!("{replay}: the child never held a commit (it printed {line:?})");
    };
    // Other subtasks go on preparing and committing; the held one's
    // transaction is the one that must stay prepared.
    let prefix = format!("snapflow:{job}:sink:{subtask}:");
    let held_ids = |when: &str| -> Vec<String> {
        let ids: Vec<String> = prepared_of(&url, &job)
            .into_iter()
            .filter(|gid| gid.starts_with(&prefix))
            .collect();
        assert!(
            !ids.is_empty(),
            "{replay}: no transaction of subtask {subtask} is prepared {when}"
        );
        ids
    };
    let before = held_ids("while its commit is held");
    kill(held);
    assert_eq!(
        held_ids("after the kill"),
        before,
        "{replay}: the held transactions outlive the killed process unchanged"
    );
    let stdout = finish(
        &replay,
        spawn(&mut child(&store, parallelism, target, false, false)),
    );
    let resumed = stdout
        .lines()
        .find_map(|line| line.strip_prefix("resumed "))
        .and_then(|id| id.trim().parse::<u64>().ok());
    assert!(
        resumed.is_some_and(|resumed| resumed >= checkpoint),
        "{replay}: the last run resumed from {resumed:?}, not from checkpoint {checkpoint} or later"
    );
    eprintln!(
        "{replay}: killed holding commit {checkpoint} with {before:?} prepared; resumed from {resumed:?}"
    );
    check_table(&url, Mode::ExactlyOnce, &job, &table, &replay);
}

#[test]
fn a_kill_between_prepare_and_commit_is_committed_exactly_once_at_parallelism_1() {
    check_kill_between_prepare_and_commit(1);
}

#[test]
fn a_kill_between_prepare_and_commit_is_committed_exactly_once_at_parallelism_2() {
    check_kill_between_prepare_and_commit(2);
}

#[test]
fn a_kill_between_prepare_and_commit_is_committed_exactly_once_at_parallelism_3() {
    check_kill_between_prepare_and_commit(3);
}
