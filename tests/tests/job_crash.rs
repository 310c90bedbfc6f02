//! Process crash: a child process (`job_runner`) runs the keyed pipeline on
//! a file checkpoint store with an exactly-once file sink and is killed
//! with SIGKILL after a seeded random delay, one to three times; then it
//! runs once more to the end on the same directories. The committed output
//! must equal the failure-free result exactly: no record lost, none
//! committed twice. The keyed operator checkpoints incrementally, and at
//! the end every listed checkpoint loads and every shared file is one a
//! listed checkpoint refers to. The keyed state's layout changes from one
//! process to the next (`SNAPFLOW_COPY_ON_WRITE_THRESHOLD_KEYS`, read by
//! `job_runner`): copy-on-write from the start, then the default (flat for
//! these few keys), in turn from a seeded start, so that a restore reads
//! either layout's checkpoints.
//!
//! Seeds: `SNAPFLOW_CRASH_SEEDS` (default 5) seeds from 1 on;
//! `SNAPFLOW_SEED=n` replays seed n.

use std::cell::Cell;
use std::process::Command;

use snapflow::storage::FsCheckpointStore;
use snapflow_tests::crash::kill_then_finish;
use snapflow_tests::pipeline::assert_exactly_once;
use snapflow_tests::shared_files;
use snapflow_tests::{seeds, TestRng};

const RECORDS: u64 = 3_000;

fn check(seed: u64) {
    let replay = format!("seed {seed} (replay with SNAPFLOW_SEED={seed})");
    let mut rng = TestRng::new(seed);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (store, output) = (dir.path().join("store"), dir.path().join("output"));
    let launches = Cell::new(seed);
    let stdout = kill_then_finish(&mut rng, &replay, (20, 200), || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_job_runner"));
        let launch = launches.get();
        launches.set(launch + 1);
        if launch % 2 == 1 {
            command.env("SNAPFLOW_COPY_ON_WRITE_THRESHOLD_KEYS", "0");
        } else {
            command.env_remove("SNAPFLOW_COPY_ON_WRITE_THRESHOLD_KEYS");
        }
        command
            .arg(&store)
            .arg(RECORDS.to_string())
            .arg("2")
            .arg("file")
            .arg(&output);
        command
    });
    eprintln!("{replay}: last run: {}", stdout.replace('\n', " "));
    assert_exactly_once(&output, RECORDS, &replay);
    // The keyed operator checkpoints incrementally (the default): the
    // kills never left a shared file unreferenced or one missing.
    let store = FsCheckpointStore::open(&store, "crash").expect("the store opens");
    let shared = shared_files::check(&store).unwrap_or_else(|error| panic!("{replay}: {error}"));
    eprintln!("{replay}: {shared:?}");
    assert!(
        shared.files > 0,
        "{replay}: no shared file: not incremental"
    );
}

#[test]
fn a_killed_process_resumes_exactly_once() {
    for seed in seeds("SNAPFLOW_CRASH_SEEDS", 5) {
        check(seed);
    }
}
