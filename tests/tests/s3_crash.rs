//! Process crash with checkpoints on object storage: the child process
//! (`job_runner`) runs the keyed pipeline with its checkpoints on an S3
//! server (moto, from `.ci/s3.sh`) and an exactly-once file sink, and is
//! killed with SIGKILL after a seeded random delay, one to three times;
//! then it runs once more to the end on the same location. Every restart
//! takes the store over from the killed process (its pointer's owner
//! epoch rises), and the committed output must equal the failure-free
//! result exactly. At the end every listed checkpoint loads, and some
//! refer to shared objects (incremental checkpoints).
//!
//! Needs `SNAPFLOW_S3_ENDPOINT` (skipped outside CI without it, a failure
//! in CI). Seeds: `SNAPFLOW_CRASH_SEEDS` (default 2) seeds from 1 on;
//! `SNAPFLOW_SEED=n` replays seed n.

use std::process::Command;

use snapflow::storage::{CheckpointStore, ObjectCheckpointStore, S3Settings};
use snapflow_tests::crash::kill_then_finish;
use snapflow_tests::pipeline::assert_exactly_once;
use snapflow_tests::servers::{server_from_env, unique_name};
use snapflow_tests::tansu::{create_bucket, S3_ENDPOINT_VAR};
use snapflow_tests::{seeds, TestRng};

const RECORDS: u64 = 3_000;
/// Credentials moto accepts (it checks none).
const KEY: &str = "snapflow";

fn settings(endpoint: &str) -> S3Settings {
    S3Settings {
        endpoint: Some(endpoint.to_string()),
        region: Some("us-east-1".to_string()),
        access_key_id: Some(KEY.to_string()),
        secret_access_key: Some(KEY.to_string()),
        ..S3Settings::default()
    }
}

fn check(endpoint: &str, seed: u64) {
    let replay = format!("seed {seed} (replay with SNAPFLOW_SEED={seed})");
    let mut rng = TestRng::new(seed);
    let bucket = unique_name("crash", '-').to_lowercase();
    create_bucket(endpoint, &bucket);
    let location = format!("s3://{bucket}/jobs");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let output = dir.path().join("output");
    let stdout = kill_then_finish(&mut rng, &replay, (300, 1_500), || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_job_runner"));
        command
            .env("AWS_ENDPOINT_URL", endpoint)
            .env("AWS_ACCESS_KEY_ID", KEY)
            .env("AWS_SECRET_ACCESS_KEY", KEY)
            .env("AWS_REGION", "us-east-1")
            .arg(&location)
            .arg(RECORDS.to_string())
            .arg("2")
            .arg("file")
            .arg(&output);
        command
    });
    eprintln!("{replay}: last run: {}", stdout.replace('\n', " "));
    // Some checkpoint completed on S3 before a kill, and the last run
    // restored from it.
    assert!(
        stdout.contains("resumed "),
        "{replay}: the last run did not resume: {stdout}"
    );
    assert_exactly_once(&output, RECORDS, &replay);
    let store = ObjectCheckpointStore::open_s3_read_only(&location, "crash", &settings(endpoint))
        .expect("the store opens");
    let listed = store.list().expect("the store lists");
    assert!(!listed.is_empty(), "{replay}: no checkpoint on S3");
    let mut with_shared = 0;
    for entry in &listed {
        let loaded = store.load(entry.checkpoint).unwrap_or_else(|error| {
            panic!(
                "{replay}: checkpoint {} does not load: {error}",
                entry.checkpoint
            )
        });
        if loaded.metadata.shared_files().next().is_some() {
            with_shared += 1;
        }
    }
    eprintln!(
        "{replay}: {} checkpoints listed, {with_shared} with shared objects",
        listed.len()
    );
    // The keyed operator checkpoints incrementally (the default).
    assert!(
        with_shared > 0,
        "{replay}: no shared object: not incremental"
    );
}

#[test]
fn a_killed_process_resumes_exactly_once_from_s3() {
    let Some(endpoint) = server_from_env(S3_ENDPOINT_VAR, "S3 checkpoint", ".ci/s3.sh") else {
        return;
    };
    for seed in seeds("SNAPFLOW_CRASH_SEEDS", 2) {
        check(&endpoint, seed);
    }
}
