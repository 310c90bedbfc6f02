//! Process crash with event-time windows: a child process (`job_runner
//! window`) runs sliding event-time windows (their firing and clean-up
//! are timers of their keys) on a file checkpoint store into an
//! exactly-once file sink, and is killed with SIGKILL after seeded random
//! delays, one to three times, at parallelism 1, 2 and 3; then it runs
//! once more to the end on the same directories. The committed window
//! results must equal the failure-free result exactly: every window fires
//! once, none twice, none missing, each with its full count.
//!
//! Seeds: `SNAPFLOW_WINDOW_CRASH_SEEDS` (default 2) seeds from 1 on;
//! `SNAPFLOW_SEED=n` replays seed n.

use std::process::Command;

use snapflow_tests::crash::kill_then_finish;
use snapflow_tests::file_sink::committed;
use snapflow_tests::window_pipeline::expected;
use snapflow_tests::{seeds, TestRng};

const RECORDS: u64 = 3_000;

fn check(parallelism: usize) {
    let want = expected(RECORDS);
    for seed in seeds("SNAPFLOW_WINDOW_CRASH_SEEDS", 2) {
        let replay = format!("p={parallelism} seed {seed} (replay with SNAPFLOW_SEED={seed})");
        let mut rng = TestRng::new(seed ^ parallelism as u64);
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (store, output) = (dir.path().join("store"), dir.path().join("output"));
        let stdout = kill_then_finish(&mut rng, &replay, (20, 250), || {
            let mut command = Command::new(env!("CARGO_BIN_EXE_job_runner"));
            command
                .arg(&store)
                .arg(RECORDS.to_string())
                .arg(parallelism.to_string())
                .arg("window")
                .arg(&output);
            command
        });
        eprintln!("{replay}: last run: {}", stdout.replace('\n', " "));
        let got = committed(&output).expect("the committed output reads");
        let mut windows: Vec<u64> = got.iter().map(|(window, _)| *window).collect();
        windows.dedup();
        assert_eq!(windows.len(), got.len(), "{replay}: a window fired twice");
        let missing = want.iter().find(|row| !got.contains(row));
        assert!(
            got == want,
            "{replay}: {} windows committed, {} expected; first missing or different {missing:?}",
            got.len(),
            want.len()
        );
    }
}

#[test]
fn killed_windows_resume_exactly_once_at_parallelism_1() {
    check(1);
}

#[test]
fn killed_windows_resume_exactly_once_at_parallelism_2() {
    check(2);
}

#[test]
fn killed_windows_resume_exactly_once_at_parallelism_3() {
    check(3);
}
