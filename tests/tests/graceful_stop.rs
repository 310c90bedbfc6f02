//! A graceful stop on signals (issue 36, "A graceful stop"): a child
//! process (`job_runner --stop-on-signals`) runs the keyed pipeline on a
//! file checkpoint store into the exactly-once file sink, and is sent
//! SIGTERM after a seeded delay, as a service manager or a container
//! runtime stops a process.
//!
//! - One SIGTERM: the process ends within seconds with exit code 0 and a
//!   savepoint; a second run on the same store resumes from that
//!   savepoint and finishes; the committed output of both runs together
//!   equals the failure-free result, no record lost or committed twice.
//! - SIGTERM then SIGINT (Ctrl-C): the second signal cancels at once, with
//!   no savepoint and a non-zero exit; a later run still ends exactly-once.
//!
//! Seeds: `SNAPFLOW_STOP_SEEDS` (default 3) seeds from 1 on;
//! `SNAPFLOW_SEED=n` replays seed n.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use snapflow_tests::crash::{finish, kill, spawn};
use snapflow_tests::file_sink::committed;
use snapflow_tests::pipeline::{assert_exactly_once, expected};
use snapflow_tests::{seeds, TestRng};

/// Enough input that the job is still running when the signal comes (a
/// few seconds at the test pipeline's pace).
const RECORDS: u64 = 60_000;

/// How long a stopped process may take to end: seconds, not minutes.
const STOP_LIMIT: Duration = Duration::from_secs(15);

/// `job_runner` on `store` into `output`, with the signal watch if `stop`.
fn runner(store: &Path, output: &Path, stop: bool) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_job_runner"));
    if stop {
        command.arg("--stop-on-signals");
    }
    command
        .arg(store)
        .arg(RECORDS.to_string())
        .arg("2")
        .arg("file")
        .arg(output);
    command
}

/// A running child whose stdout lines arrive on a channel.
struct Watched {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watched {
    fn start(mut command: Command) -> Watched {
        let mut child = spawn(&mut command);
        let stdout = child.stdout.take().expect("stdout is piped");
        let (sender, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        Watched { child, lines }
    }

    /// Waits for the line `expected`.
    fn wait_for(&mut self, expected: &str, replay: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) if line == expected => return,
                Ok(_) => continue,
                Err(_) => break,
            }
        }
        panic!("{replay}: the child never printed {expected:?}");
    }

    /// Sends `signals` (names for `kill -s`) one right after the other,
    /// from one shell (its built-in `kill` starts no process per signal).
    fn signal(&self, signals: &[&str]) {
        let pid = self.child.id();
        let script: Vec<String> = signals
            .iter()
            .map(|signal| format!("kill -s {signal} {pid}"))
            .collect();
        let status = Command::new("sh")
            .arg("-c")
            .arg(script.join(" && "))
            .status()
            .expect("sh runs");
        assert!(status.success(), "{script:?} failed");
    }

    /// Waits for the child to end within `limit`; its exit status, how
    /// long it took, the rest of its stdout and its stderr.
    fn end(mut self, limit: Duration, replay: &str) -> (ExitStatus, Duration, Vec<String>, String) {
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("the child can be waited for") {
                break status;
            }
            if started.elapsed() > limit {
                kill(self.child);
                panic!("{replay}: the child did not end within {limit:?} of the signal");
            }
            thread::sleep(Duration::from_millis(5));
        };
        let took = started.elapsed();
        let output = self.child.wait_with_output().expect("the child's output");
        let lines = self.lines.iter().collect();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        (status, took, lines, stderr)
    }
}

/// The savepoint a `savepoint <id>` line names.
fn savepoint_of(lines: &[String]) -> Option<u64> {
    lines
        .iter()
        .find_map(|line| line.strip_prefix("savepoint "))
        .map(|id| id.parse().expect("a savepoint id"))
}

/// Runs the job on the same store to the end and checks the committed
/// output equals the failure-free result; returns the last run's stdout.
fn finish_exactly_once(store: &Path, output: &Path, replay: &str) -> String {
    let stdout = finish(replay, spawn(&mut runner(store, output, false)));
    assert_exactly_once(output, RECORDS, replay);
    stdout
}

fn check_sigterm(seed: u64) {
    let replay = format!("seed {seed} (replay with SNAPFLOW_SEED={seed})");
    let mut rng = TestRng::new(seed);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (store, output) = (dir.path().join("store"), dir.path().join("output"));
    let mut running = Watched::start(runner(&store, &output, true));
    running.wait_for("started", &replay);
    // Late enough that the source has read something even on a busy
    // machine, early enough that it has not read everything.
    thread::sleep(Duration::from_millis(rng.between(300, 800)));
    running.signal(&["TERM"]);
    let (status, took, lines, stderr) = running.end(STOP_LIMIT, &replay);
    eprintln!("{replay}: stopped in {took:?}: {lines:?}");
    assert!(status.success(), "{replay}: exit {status}: {stderr}");
    let savepoint = savepoint_of(&lines)
        .unwrap_or_else(|| panic!("{replay}: no savepoint after SIGTERM: {lines:?} {stderr}"));
    assert!(
        lines.iter().any(|line| line == "done"),
        "{replay}: {lines:?}"
    );
    // The stop came mid-flight, and what the savepoint covers is committed.
    let stopped_at = committed(&output)
        .expect("the committed output reads")
        .len();
    let (expected_output, _) = expected(RECORDS);
    assert!(
        0 < stopped_at && stopped_at < expected_output.len(),
        "{replay}: {stopped_at} of {} records committed at the stop",
        expected_output.len()
    );
    let stdout = finish_exactly_once(&store, &output, &replay);
    assert!(
        stdout.contains(&format!("resumed {savepoint}\n")),
        "{replay}: the second run did not resume from savepoint {savepoint}: {stdout}"
    );
}

#[test]
fn sigterm_stops_with_a_savepoint_and_the_resume_is_exactly_once() {
    for seed in seeds("SNAPFLOW_STOP_SEEDS", 3) {
        check_sigterm(seed);
    }
}

#[test]
fn a_second_signal_cancels_at_once_without_a_savepoint() {
    let replay = "two signals";
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (store, output) = (dir.path().join("store"), dir.path().join("output"));
    let mut running = Watched::start(runner(&store, &output, true));
    running.wait_for("started", replay);
    thread::sleep(Duration::from_millis(300));
    // The stop savepoint's commits take 20 ms each (`job_runner`), so the
    // second signal, sent right after, comes before the stop ends. Two
    // different signals: the same one twice in a row may arrive as one.
    running.signal(&["TERM", "INT"]);
    let (status, took, lines, stderr) = running.end(STOP_LIMIT, replay);
    eprintln!("{replay}: ended in {took:?}: {lines:?} {stderr}");
    assert!(!status.success(), "{replay}: a cancel exits non-zero");
    assert!(
        stderr.contains("the job was cancelled"),
        "{replay}: {stderr}"
    );
    assert_eq!(savepoint_of(&lines), None, "{replay}: {lines:?}");
    assert!(took < Duration::from_secs(5), "{replay}: took {took:?}");
    // Whatever the cancel left, a resume is still exactly-once.
    finish_exactly_once(&store, &output, replay);
}
