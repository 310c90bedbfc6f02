//! Process crash: a child process (`job_runner`) runs the keyed pipeline on
//! a file checkpoint store with an exactly-once file sink and is killed
//! with SIGKILL after a seeded random delay, one to three times; then it
//! runs once more to the end on the same directories. The committed output
//! must equal the failure-free result exactly: no record lost, none
//! committed twice.
//!
//! Seeds: `SNAPFLOW_CRASH_SEEDS` (default 5) seeds from 1 on;
//! `SNAPFLOW_SEED=n` replays seed n.

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use snapflow_tests::file_sink::committed;
use snapflow_tests::pipeline::expected;
use snapflow_tests::{seeds, TestRng};

const RECORDS: u64 = 3_000;

fn child(store: &std::path::Path, output: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_job_runner"));
    command
        .arg(store)
        .arg(output)
        .arg(RECORDS.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn check(seed: u64) {
    let replay = format!("seed {seed} (replay with SNAPFLOW_SEED={seed})");
    let mut rng = TestRng::new(seed);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (store, output) = (dir.path().join("store"), dir.path().join("output"));
    for _ in 0..rng.between(1, 3) {
        let mut running = child(&store, &output).spawn().expect("the child starts");
        thread::sleep(Duration::from_millis(rng.between(20, 200)));
        // SIGKILL on Unix. The child may have finished already; then the
        // kill fails and the next run resumes from its final checkpoint.
        let _ = running.kill();
        let _ = running.wait();
    }
    let mut last = child(&store, &output).spawn().expect("the child starts");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = last.try_wait().expect("the child can be waited for") {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{replay}: the last run did not finish in 60 s"
        );
        thread::sleep(Duration::from_millis(5));
    };
    let result = last.wait_with_output().expect("the child's output");
    assert!(
        status.success(),
        "{replay}: the last run failed: {}",
        String::from_utf8_lossy(&result.stderr)
    );
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(stdout.contains("done"), "{replay}: {stdout}");
    eprintln!("{replay}: last run: {}", stdout.replace('\n', " "));
    let (expected_output, _) = expected(RECORDS);
    let output = committed(&output).expect("the committed output reads");
    assert_eq!(
        output.len(),
        expected_output.len(),
        "{replay}: committed record count differs"
    );
    assert!(
        output == expected_output,
        "{replay}: committed output differs"
    );
}

#[test]
fn a_killed_process_resumes_exactly_once() {
    for seed in seeds("SNAPFLOW_CRASH_SEEDS", 5) {
        check(seed);
    }
}
