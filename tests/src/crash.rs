//! The harness of the process-crash tests: a child process (the
//! `job_runner` binary) is started and killed with SIGKILL after seeded
//! random delays, one to three times, and then runs once more to the end
//! on the same store.
//!
//! It owns starting, killing and waiting for the child; what the child
//! runs and what its output must be are the tests' own.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::TestRng;

/// How long the last, uninterrupted run may take.
pub const LAST_RUN_LIMIT: Duration = Duration::from_secs(60);

/// The abort of librdkafka 2.12.1's issue #5573 (fixed upstream, not in
/// any rdkafka-sys on crates.io): a consumer assigned twice in quick
/// succession can fail this assertion and abort the process. The Kafka
/// crash tests count such an abort of their last run as one more crash
/// (which exactly-once must survive like a SIGKILL) and run it again.
pub const LIBRDKAFKA_ASSIGNMENT_ABORT: &str = "rd_kafka_assignment_partition_stopped: Assertion";

/// How many known aborts of the last run [`kill_then_finish`] tolerates
/// before it fails the test.
pub const KNOWN_ABORTS_MAX: usize = 2;

/// Starts `command` with its stdout and stderr piped.
///
/// # Panics
///
/// When the child cannot start (a test failure).
pub fn spawn(command: &mut Command) -> Child {
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the child starts")
}

/// Kills `child` with SIGKILL (on Unix) and reaps it. It may have
/// finished already; then the kill fails and the next run resumes from
/// its final checkpoint.
pub fn kill(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs `child()` and kills it after a delay drawn from `kill_after_ms`
/// (inclusive), one to three times (as `rng` draws), then runs it once
/// more and waits for it to end within [`LAST_RUN_LIMIT`]. Returns what
/// the last run printed on stdout.
///
/// # Panics
///
/// When the last run fails, does not end in time or does not print
/// `done`; the message starts with `replay`.
pub fn kill_then_finish(
    rng: &mut TestRng,
    replay: &str,
    kill_after_ms: (u64, u64),
    child: impl Fn() -> Command,
) -> String {
    for _ in 0..rng.between(1, 3) {
        let running = spawn(&mut child());
        let (low, high) = kill_after_ms;
        thread::sleep(Duration::from_millis(rng.between(low, high)));
        kill(running);
    }
    let mut aborts = 0;
    loop {
        match try_finish(replay, spawn(&mut child())) {
            Ok(stdout) => return stdout,
            Err(stderr)
                if aborts < KNOWN_ABORTS_MAX && stderr.contains(LIBRDKAFKA_ASSIGNMENT_ABORT) =>
            {
                aborts += 1;
                eprintln!("{replay}: the last run aborted in librdkafka (#5573), counted as a crash; running it again");
            }
            Err(stderr) => panic!("{replay}: the last run failed: {stderr}"),
        }
    }
}

/// Waits for `last` to end within [`LAST_RUN_LIMIT`]; returns its
/// stdout.
///
/// # Panics
///
/// As [`kill_then_finish`].
pub fn finish(replay: &str, last: Child) -> String {
    try_finish(replay, last)
        .unwrap_or_else(|stderr| panic!("{replay}: the last run failed: {stderr}"))
}

/// [`finish`], but a last run that exits unsuccessfully is `Err` with
/// its stderr instead of a panic.
///
/// # Panics
///
/// When the last run does not end in time or does not print `done`.
fn try_finish(replay: &str, mut last: Child) -> Result<String, String> {
    let started = Instant::now();
    let status = loop {
        if let Some(status) = last.try_wait().expect("the child can be waited for") {
            break status;
        }
        if started.elapsed() > LAST_RUN_LIMIT {
            kill(last);
            panic!("{replay}: the last run did not finish in {LAST_RUN_LIMIT:?}");
        }
        thread::sleep(Duration::from_millis(5));
    };
    let result = last.wait_with_output().expect("the child's output");
    if !status.success() {
        return Err(String::from_utf8_lossy(&result.stderr).into_owned());
    }
    let stdout = String::from_utf8_lossy(&result.stdout).into_owned();
    assert!(stdout.contains("done"), "{replay}: {stdout}");
    Ok(stdout)
}

/// Reads `child`'s stdout until a line starts with `prefix` and returns
/// that line, or `None` when stdout ends first. The rest of stdout stays
/// unread (the child is about to be killed).
///
/// # Panics
///
/// When stdout was not piped.
pub fn wait_for_line(child: &mut Child, prefix: &str) -> Option<String> {
    let stdout = child.stdout.take().expect("stdout is piped");
    BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find(|line| line.starts_with(prefix))
}
