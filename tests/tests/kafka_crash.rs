//! The Kafka source and exactly-once sink under SIGKILL of the job's
//! process, against the real broker (`.ci/run` starts it; locally
//! `eval "$(.ci/kafka.sh start)"`; without `SNAPFLOW_KAFKA_BROKERS` each
//! test prints how to start it and passes, except in CI, where it fails).
//!
//! A child process (`kafka_runner`) runs Kafka → parse → keyed count →
//! Kafka on a file checkpoint store, with one seeded panic in `parse` per
//! process and every commit delayed by 20 ms. Every transaction a child
//! commits is appended to a file (`snapflow_tests::logged_commits`), and
//! the output topic is read back keeping only the records whose
//! `snapflow-txn` header is in that file (tansu 0.6 shows aborted records
//! to `read_committed` readers: see `kafka_probe.rs`).
//!
//! - Killed after seeded random delays, one to three times, then run to
//!   the end on the same store (the harness `snapflow_tests::crash`), at
//!   parallelism 1, 2 and 3: the committed output holds every `(key,
//!   count)`, and the last run's state equals the direct computation
//!   over the input topic, every result exactly once (a result
//!   committed twice fails and names its two transactions).
//! - Killed exactly after a checkpoint completed and before its Kafka
//!   commit (the child holds the first commit with records and says so):
//!   the next run finds through the commit marker that the transaction
//!   was not committed and writes its records again from the sink state
//!   (it reports `rewritten` above 0), and the output is exactly once.
//!
//! Seeds: `SNAPFLOW_KAFKA_CRASH_SEEDS` (default 4 per parallelism, so 12
//! in all) from 1 on; `SNAPFLOW_SEED=n` replays seed n.

#[path = "kafka/support.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::Duration;

use snapflow_tests::crash::{finish, kill, kill_then_finish, spawn, wait_for_line};
use snapflow_tests::slow_commit::HOLDING;
use snapflow_tests::{seeds, TestRng};

use support::{
    broker, committed_results, create_topic, locate_missing, missing, produce, read_results,
    txn_header, unique, Read,
};

/// Keys of the count (as `kafka_runner` counts).
const KEYS: u64 = 7;
/// Records in the input topic.
const RECORDS: u64 = 1_500;
/// Partitions of the input topic.
const PARTITIONS: i32 = 4;

/// The topics and names of one case.
struct Case {
    brokers: String,
    input: String,
    output: String,
    job: String,
    dir: tempfile::TempDir,
}

impl Case {
    fn new(brokers: String) -> Case {
        let case = Case {
            input: unique("crash-in"),
            output: unique("crash-out"),
            job: unique("crash-job"),
            dir: tempfile::tempdir().expect("a temporary directory"),
            brokers,
        };
        create_topic(&case.brokers, &case.input, PARTITIONS);
        create_topic(&case.brokers, &case.output, 2);
        let rows: Vec<_> = (0..RECORDS)
            .map(|id| {
                (
                    (id % PARTITIONS as u64) as i32,
                    Vec::new(),
                    id.to_string().into_bytes(),
                )
            })
            .collect();
        produce(&case.brokers, &case.input, &rows);
        case
    }

    fn log_file(&self) -> std::path::PathBuf {
        self.dir.path().join("committed.txt")
    }

    /// The child's command line for one run.
    fn child(&self, parallelism: usize, panic_at: u64, hold: bool) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_kafka_runner"));
        command
            .arg(self.dir.path().join("store"))
            .args([&self.brokers, &self.input, &self.output, &self.job])
            .arg(parallelism.to_string())
            .arg(self.log_file())
            .arg(panic_at.to_string());
        if hold {
            command.arg("--hold-first-commit");
        }
        command
    }

    /// What the runs' sinks did (`logged_commits` writes it), for a
    /// failure's message.
    fn events(&self) -> String {
        let mut events = self.log_file().into_os_string();
        events.push(".events");
        let mut trace = self.log_file().into_os_string();
        trace.push(".trace");
        format!(
            "{}\nthe connector's events:\n{}",
            std::fs::read_to_string(events).unwrap_or_default(),
            std::fs::read_to_string(trace).unwrap_or_default()
        )
    }

    /// Checks the committed output and the last run's state.
    fn check(&self, stdout: &str, replay: &str) {
        let committed = committed_headers(&self.log_file());
        let (want, want_state) = expected();
        // The reader waits until every wanted result is in, however busy
        // the broker, so a slow fetch never looks like lost output.
        let all = read_results(
            &self.brokers,
            &self.output,
            &committed,
            &want,
            Duration::from_secs(3),
        );
        let got = committed_results(&all, &committed);
        let mut unique: Vec<(u64, u64)> = got.iter().map(|(result, _)| *result).collect();
        unique.dedup();
        let missing = missing(&want, &got);
        // A result committed twice names the two transactions: before
        // the sink's send gate and its restore's fences (`gate.rs`,
        // `unblock.rs`), tansu 0.6 left a commit's marker unapplied
        // behind an open transaction, and the next run wrote that
        // interval again.
        let doubled: Vec<String> = got
            .windows(2)
            .filter(|pair| pair[0].0 == pair[1].0)
            .map(|pair| format!("{:?} by {} and {}", pair[0].0, pair[0].1, pair[1].1))
            .collect();
        if missing > 0 || unique != want || !doubled.is_empty() {
            eprintln!(
                "{replay}: {}\n{}events:\n{}",
                describe_extra(&all, &committed),
                locate_missing(&all, &committed, &want),
                self.events()
            );
        }
        assert_eq!(
            missing, 0,
            "{replay}: {missing} results missing from the committed output"
        );
        assert!(unique == want, "{replay}: the committed output differs");
        assert!(
            doubled.is_empty(),
            "{replay}: {} results committed twice, first {:?}",
            doubled.len(),
            doubled.first()
        );
        let state: BTreeMap<u64, u64> = stdout
            .lines()
            .filter_map(|line| line.strip_prefix("state "))
            .map(|rest| {
                let (key, count) = rest.split_once(' ').expect("state <key> <count>");
                (key.parse().expect("a key"), count.parse().expect("a count"))
            })
            .collect();
        assert_eq!(state, want_state, "{replay}: the last run's state");
        eprintln!(
            "{replay}: {} committed results of {} records in the topic (aborted included), {} \
             transactions committed; last run: {}",
            got.len(),
            all.len(),
            committed.len(),
            stdout
                .lines()
                .filter(|line| !line.starts_with("state "))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// For a failing run: how many records each committed header holds, and
/// the headers of the first doubled result.
fn describe_extra(all: &[Read], committed: &BTreeSet<String>) -> String {
    let mut per_header: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_value: BTreeMap<Vec<u8>, Vec<(String, i32, i64)>> = BTreeMap::new();
    for read in all {
        let header = txn_header(read).unwrap_or_default();
        if committed.contains(&header) {
            *per_header.entry(header.clone()).or_default() += 1;
            by_value.entry(read.value.clone()).or_default().push((
                header,
                read.partition,
                read.offset,
            ));
        }
    }
    let doubled = by_value.iter().find(|(_, seen)| seen.len() > 1);
    format!(
        "{} records read, {} committed headers in the log; records per committed header \
         {per_header:?}; first doubled {doubled:?}",
        all.len(),
        committed.len()
    )
}

/// The headers of every transaction some run committed.
fn committed_headers(path: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The failure-free output (every `(key, n)`, sorted) and final state.
fn expected() -> (Vec<(u64, u64)>, BTreeMap<u64, u64>) {
    let mut counts = BTreeMap::new();
    let mut out = Vec::new();
    for id in 0..RECORDS {
        let count = counts.entry(id % KEYS).or_insert(0);
        *count += 1;
        out.push((id % KEYS, *count));
    }
    out.sort_unstable();
    (out, counts)
}

/// One case runs at a time (each with its seeds side by side): the test
/// harness would otherwise run all five at once, a dozen children and
/// the broker on two cores, and the last runs then miss their time
/// limit.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Killed one to three times at random, then run to the end.
fn check_killed(brokers: String, parallelism: usize, seed: u64) {
    let replay =
        format!("parallelism {parallelism}, seed {seed} (replay with SNAPFLOW_SEED={seed})");
    let mut rng = TestRng::new(seed);
    let case = Case::new(brokers);
    let panic_at = rng.between(0, RECORDS - 1);
    // The child needs a few hundred milliseconds to reach the broker and
    // fence its ids; a run of the whole input takes one to three seconds.
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        kill_then_finish(&mut rng, &replay, (300, 1_800), || {
            case.child(parallelism, panic_at, false)
        })
    }));
    let stdout = run.unwrap_or_else(|panic| {
        eprintln!("{replay}: events:\n{}", case.events());
        std::panic::resume_unwind(panic)
    });
    case.check(&stdout, &replay);
}

/// Runs every seed of one parallelism side by side (each run mostly
/// waits for the broker); a failing seed's panic names it.
fn killed_over_seeds(parallelism: usize) {
    let Some(brokers) = broker() else { return };
    let _turn = one_at_a_time();
    thread::scope(|scope| {
        let runs: Vec<_> = seeds("SNAPFLOW_KAFKA_CRASH_SEEDS", 4)
            .into_iter()
            .map(|seed| {
                let brokers = brokers.clone();
                scope.spawn(move || check_killed(brokers, parallelism, seed))
            })
            .collect();
        for run in runs {
            if let Err(panic) = run.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
}

#[test]
fn exactly_once_survives_sigkill_at_parallelism_1() {
    killed_over_seeds(1);
}

#[test]
fn exactly_once_survives_sigkill_at_parallelism_2() {
    killed_over_seeds(2);
}

#[test]
fn exactly_once_survives_sigkill_at_parallelism_3() {
    killed_over_seeds(3);
}

/// Killed after a checkpoint completed and before its transaction's
/// commit: the next run must write that transaction's records again.
fn check_kill_between_checkpoint_and_commit(parallelism: usize) {
    let Some(brokers) = broker() else { return };
    let replay = format!("held commit at parallelism {parallelism}");
    let _turn = one_at_a_time();
    let case = Case::new(brokers);
    // No panic: the held commit must be the first run's.
    let mut held = spawn(&mut case.child(parallelism, RECORDS, true));
    let line = wait_for_line(&mut held, HOLDING);
    kill(held);
    assert!(line.is_some(), "{replay}: the child never held a commit");
    let stdout = finish(&replay, spawn(&mut case.child(parallelism, RECORDS, false)));
    let rewritten: u64 = stdout
        .lines()
        .find_map(|line| line.strip_prefix("recovered "))
        .and_then(|rest| rest.split(' ').nth(2))
        .and_then(|count| count.parse().ok())
        .unwrap_or(0);
    assert!(
        rewritten > 0,
        "{replay}: the next run wrote no pending transaction again ({stdout})"
    );
    case.check(&stdout, &replay);
}

#[test]
fn a_kill_between_checkpoint_and_commit_writes_the_transaction_again_at_parallelism_1() {
    check_kill_between_checkpoint_and_commit(1);
}

#[test]
fn a_kill_between_checkpoint_and_commit_writes_the_transaction_again_at_parallelism_3() {
    check_kill_between_checkpoint_and_commit(3);
}
