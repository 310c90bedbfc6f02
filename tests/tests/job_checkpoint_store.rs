//! The job against a checkpoint store that fails or is slow: a checkpoint
//! the store cannot persist is a failed checkpoint that counts towards
//! `tolerable_checkpoint_failures` (tolerance 0 ends the job with the
//! store's error; a large tolerance completes exactly-once and lists the
//! failed checkpoints), a partially written checkpoint is never restored,
//! a checkpoint that becomes durable after a failure reports its real
//! duration, and too many failed checkpoints restart every failover region
//! (checkpoints are global).

use std::collections::BTreeSet;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use snapflow::job::{Job, JobConfig, JobError, JobReport, RestartStrategy};
use snapflow::sink::CollectHandle;
use snapflow::storage::{CheckpointId, CheckpointStore, StoreError};
use snapflow_tests::hooked_store::{HookedStore, StoreHooks};
use snapflow_tests::pipeline::{declare, expected, faulty_collect, PacedSourceFactory, Pacing};
use snapflow_tests::{FaultKind, Faults};

const RECORDS: u64 = 3_000;
const PACING: Pacing = Pacing {
    records_per_read: 32,
};

/// A memory store that fails chosen persists half way (after one part is
/// written, so a partial checkpoint is left behind for `discard`) and
/// can make its first commit slow.
type ScriptedStore = HookedStore<Script>;

/// The [`ScriptedStore`]'s plan and what it counted.
#[derive(Debug)]
struct Script {
    /// 0-based persist attempts (calls of `begin`) that fail.
    failing: BTreeSet<u64>,
    /// How long the first commit sleeps.
    first_commit_delay_ms: u64,
    begins: AtomicU64,
    parts_in_attempt: AtomicU64,
    commits: AtomicU64,
    /// Set while the slow commit sleeps.
    committing_slowly: Arc<AtomicBool>,
}

fn scripted(failing: &[u64], first_commit_delay_ms: u64) -> ScriptedStore {
    let script = Script {
        failing: failing.iter().copied().collect(),
        first_commit_delay_ms,
        begins: AtomicU64::new(0),
        parts_in_attempt: AtomicU64::new(0),
        commits: AtomicU64::new(0),
        committing_slowly: Arc::new(AtomicBool::new(false)),
    };
    HookedStore::new("scripted", script)
}

impl Script {
    fn attempt_fails(&self) -> bool {
        let attempt = self.begins.load(Ordering::SeqCst).saturating_sub(1);
        self.failing.contains(&attempt)
    }
}

impl StoreHooks for Script {
    fn on_begin(&self, _checkpoint: CheckpointId) {
        self.begins.fetch_add(1, Ordering::SeqCst);
        self.parts_in_attempt.store(0, Ordering::SeqCst);
    }

    fn before_write_part(&self, checkpoint: CheckpointId) -> Result<(), StoreError> {
        let written = self.parts_in_attempt.fetch_add(1, Ordering::SeqCst);
        if written == 1 && self.attempt_fails() {
            return Err(StoreError::Io {
                operation: "write_part",
                path: format!("checkpoint {checkpoint}").into(),
                source: io::Error::other("injected store failure"),
            });
        }
        Ok(())
    }

    fn before_commit(&self, _checkpoint: CheckpointId) {
        if self.commits.fetch_add(1, Ordering::SeqCst) == 0 && self.first_commit_delay_ms > 0 {
            self.committing_slowly.store(true, Ordering::SeqCst);
            thread::sleep(Duration::from_millis(self.first_commit_delay_ms));
            self.committing_slowly.store(false, Ordering::SeqCst);
        }
    }
}

fn config(store: &Arc<ScriptedStore>, tolerable: u32, restart: RestartStrategy) -> JobConfig {
    let store: Arc<dyn CheckpointStore> = store.clone();
    JobConfig {
        checkpoint_interval_ms: Some(5),
        tolerable_checkpoint_failures: tolerable,
        store: Some(store),
        restart,
        default_parallelism: 2,
        batch_size_max: 16,
        arbiters: Some(2),
        ..JobConfig::default()
    }
}

/// Runs the test pipeline against a store failing the persists `failing`,
/// with the operator `faults`; checks the output when the job succeeds.
fn run(
    failing: &[u64],
    tolerable: u32,
    restart: RestartStrategy,
    faults: &Faults,
) -> (Arc<ScriptedStore>, Result<JobReport, JobError>) {
    let store = Arc::new(scripted(failing, 0));
    let job = Job::new("scripted", config(&store, tolerable, restart));
    let (sink, output) = faulty_collect(faults);
    let state = declare(&job, RECORDS, [2; 6], PACING, faults, sink);
    let result = job.run();
    if result.is_ok() {
        let (expected_output, expected_state) = expected(RECORDS);
        let mut committed = output.committed();
        committed.sort_unstable();
        assert_eq!(committed, expected_output, "exactly-once output");
        assert_eq!(state.snapshot(), expected_state, "exactly-once state");
    }
    (store, result)
}

fn restart_once() -> RestartStrategy {
    RestartStrategy::FixedDelay {
        attempts_max: 3,
        delay_ms: 0,
    }
}

/// Checks a run where every failing persist is tolerated.
fn check_tolerated(failing: &[u64], faults: &Faults) {
    let (store, result) = run(failing, 100, restart_once(), faults);
    let report = result.expect("the failures are tolerated");
    let not_persisted: Vec<u64> = report
        .failed_checkpoints
        .iter()
        .filter(|failed| failed.reason.contains("injected store failure"))
        .map(|failed| failed.checkpoint)
        .collect();
    assert_eq!(not_persisted.len(), failing.len(), "{report:?}");
    let listed: Vec<u64> = store
        .list()
        .expect("the store lists")
        .iter()
        .map(|summary| summary.checkpoint)
        .collect();
    for checkpoint in &not_persisted {
        assert!(!listed.contains(checkpoint), "{checkpoint} is not stored");
        assert!(
            report
                .checkpoints
                .iter()
                .all(|c| c.checkpoint != *checkpoint),
            "{checkpoint} is not reported complete"
        );
        assert!(
            report
                .restarts
                .iter()
                .all(|restart| restart.restored_from != Some(*checkpoint)),
            "a partially written {checkpoint} is never restored: {:?}",
            report.restarts
        );
    }
    assert_eq!(
        report.restarts.len(),
        faults.fired(),
        "{:?}",
        report.restarts
    );
}

#[test]
fn tolerance_zero_fails_the_job_with_the_store_error() {
    let (_, result) = run(&[1], 0, RestartStrategy::None, &Faults::none());
    let error = result.expect_err("one failed persist is not tolerated");
    let JobError::CheckpointPersistFailed {
        consecutive_failures,
        ref error,
        ..
    } = error
    else {
        panic!("unexpected error: {error}");
    };
    assert_eq!(consecutive_failures, 1);
    assert!(
        error.to_string().contains("injected store failure"),
        "{error}"
    );
    assert!(error.is_retryable(), "an I/O error may pass");
}

#[test]
fn tolerance_zero_with_restarts_recovers_exactly_once() {
    let (_, result) = run(&[1], 0, restart_once(), &Faults::none());
    let report = result.expect("the job restarts and completes");
    assert_eq!(report.restarts.len(), 1, "{:?}", report.restarts);
    assert!(
        report.restarts[0].cause.contains("injected store failure"),
        "{}",
        report.restarts[0].cause
    );
}

#[test]
fn a_large_tolerance_completes_and_lists_the_failed_checkpoints() {
    check_tolerated(&[1, 2, 3], &Faults::none());
}

#[test]
fn a_partial_checkpoint_is_never_restored_after_an_operator_failure() {
    let faults = Faults::new(vec![("count", 2_000, FaultKind::Error)]);
    check_tolerated(&[0, 2, 4, 6, 8], &faults);
}

/// The first commit sleeps `delay_ms`; an operator fails while it sleeps.
/// That checkpoint becomes durable after the failure: it is reported with
/// at least the store's delay (not 0 ms) and the restart restores it.
#[test]
fn a_checkpoint_durable_after_a_failure_reports_its_real_duration() {
    let delay_ms = 200;
    let store = Arc::new(scripted(&[], delay_ms));
    let slow = Arc::clone(&store.hooks.committing_slowly);
    let fired = Arc::new(AtomicBool::new(false));
    let fired_in_map = Arc::clone(&fired);
    let job = Job::new("slow-store", config(&store, 0, restart_once()));
    let output = CollectHandle::new();
    let pacing = Pacing {
        records_per_read: 8,
    };
    job.source("numbers", PacedSourceFactory::new(2_000, pacing))
        .map("fail-while-persisting", move |n: u64| {
            if slow.load(Ordering::SeqCst) && !fired_in_map.swap(true, Ordering::SeqCst) {
                panic!("failure while a checkpoint is persisted");
            }
            n
        })
        .sink("collect", output.clone());
    let report = job.run().expect("the job recovers");
    assert!(fired.load(Ordering::SeqCst), "the failure was injected");
    let mut committed = output.committed();
    committed.sort_unstable();
    assert_eq!(committed, (0..2_000).collect::<Vec<_>>());
    assert_eq!(report.restarts.len(), 1, "{:?}", report.restarts);
    let first = report.checkpoints.first().expect("checkpoints completed");
    assert_eq!(
        report.restarts[0].restored_from,
        Some(first.checkpoint),
        "the restart waits for the persist and restores it"
    );
    assert!(
        first.duration_ms >= delay_ms,
        "checkpoint {} reported {} ms, the store alone took {delay_ms} ms",
        first.checkpoint,
        first.duration_ms
    );
}

#[test]
fn too_many_checkpoint_failures_restart_every_region() {
    let store = Arc::new(scripted(&[1], 0));
    let job = Job::new("scripted", config(&store, 0, restart_once()));
    let pacing = Pacing {
        records_per_read: 8,
    };
    let outputs: Vec<CollectHandle<u64>> = ["left", "right"]
        .into_iter()
        .map(|side| {
            let output = CollectHandle::new();
            job.source(
                &format!("{side}-numbers"),
                PacedSourceFactory::new(600, pacing),
            )
            .sink(&format!("{side}-collect"), output.clone());
            output
        })
        .collect();
    let report = job.run().expect("the job restarts and completes");
    for output in &outputs {
        let mut committed = output.committed();
        committed.sort_unstable();
        assert_eq!(committed, (0..600).collect::<Vec<_>>());
    }
    let mut regions: Vec<String> = report
        .restarts
        .iter()
        .map(|restart| {
            assert!(restart.failure.is_none(), "not an operator's failure");
            assert!(
                restart.cause.contains("injected store failure"),
                "{}",
                restart.cause
            );
            restart.region.join(",")
        })
        .collect();
    regions.sort();
    let expected = [
        "left-numbers,left-collect".to_owned(),
        "right-numbers,right-collect".to_owned(),
    ];
    // At parallelism 2 each pipeline is two forward lanes: four regions.
    assert_eq!(regions.len(), 4, "{regions:?}");
    regions.dedup();
    assert_eq!(regions, expected);
}
