//! Failures that retrying cannot fix end the job at once, under the
//! default restart strategy: a state schema that changed since the
//! checkpoint, a sink that would overwrite output or lost a transaction,
//! a sink that cannot be set up, a user error marked `NotRetryable`. A
//! poison pill (a record that fails its operator every time) ends the job
//! after the strategy's bound on restarts without a checkpoint. Also: the
//! live status, a finished job resumed, and the configuration edges.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use snapflow::job::{Job, JobConfig, JobError, JobReport, RestartStrategy};
use snapflow::restart::DEFAULT_RESTARTS_MAX_WITHOUT_CHECKPOINT;
use snapflow::runtime::NotRetryable;
use snapflow::sink::{CollectHandle, Sink, SinkError, SinkFactory, SinkState};
use snapflow::storage::{CheckpointStore, MemoryCheckpointStore};
use snapflow::Snapshot;
use snapflow_tests::damage::{self, Dirs};
use snapflow_tests::file_sink::committed;
use snapflow_tests::pipeline::{expected, PacedSourceFactory, Pacing};
use snapflow_tests::quiet_injected_panics;

const PACING: Pacing = Pacing {
    records_per_read: 50,
};

/// Seconds, not minutes: a job that ends "at once" ends well within this.
const AT_ONCE: Duration = Duration::from_secs(10);

#[derive(Snapshot, Default, Clone, Debug)]
struct CountV1 {
    seen: u64,
}

/// The same operator's state with another shape and no upgrade path.
#[derive(Snapshot, Default, Clone, Debug)]
struct CountV2 {
    seen: u64,
    label: String,
}

fn config(store: Option<Arc<dyn CheckpointStore>>) -> JobConfig {
    JobConfig {
        checkpoint_interval_ms: Some(10),
        store,
        ..JobConfig::default()
    }
}

/// Starts `job` and waits for it on a thread of its own; fails the test
/// if it has not ended within `limit` (a job retried forever).
fn run_within(limit: Duration, job: Job) -> Result<JobReport, JobError> {
    let running = job.start()?;
    let (sender, receiver) = mpsc::channel();
    thread::spawn(move || {
        // The receiver may have given up already.
        let _ = sender.send(running.wait());
    });
    receiver
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("the job was still running after {limit:?}"))
}

/// Runs `job` and checks it ends with `NotRetryable` at once, with no
/// restart, naming `operator`.
fn check_ends_at_once(job: Job, operator: &str) {
    let started = Instant::now();
    let error = run_within(AT_ONCE, job).expect_err("the job cannot succeed");
    let elapsed = started.elapsed();
    assert!(elapsed < AT_ONCE, "took {elapsed:?}: {error}");
    match &error {
        JobError::NotRetryable {
            restarts, failure, ..
        } => {
            assert_eq!(*restarts, 0, "{error}");
            assert_eq!(&*failure.tag.operator, operator, "{error}");
            assert!(!failure.retryable);
        }
        other => panic!("expected NotRetryable, got {other}"),
    }
    assert!(!error.is_retryable());
}

#[test]
fn a_changed_state_schema_ends_the_job_at_once() {
    let store: Arc<dyn CheckpointStore> = Arc::new(MemoryCheckpointStore::new("schema").unwrap());
    // Both runs write to one handle, as to one external system.
    let output = CollectHandle::new();
    // The first run checkpoints, then fails for good on record 900.
    let job = Job::new(
        "schema",
        JobConfig {
            restart: RestartStrategy::None,
            ..config(Some(Arc::clone(&store)))
        },
    );
    job.source("numbers", PacedSourceFactory::new(2_000, PACING))
        .key_by(|n: &u64| n % 5)
        .process("count", |_key: &u64, state: &mut CountV1, n: u64, out| {
            if n == 900 {
                return Err("stop here".into());
            }
            state.seen += 1;
            out.emit(state.seen);
            Ok(())
        })
        .sink("collect", output.clone());
    quiet_injected_panics();
    job.run().expect_err("the first run stops");
    assert!(
        !store.list().unwrap().is_empty(),
        "no checkpoint to restore"
    );
    let job = Job::new("schema", config(Some(store)));
    job.source("numbers", PacedSourceFactory::new(2_000, PACING))
        .key_by(|n: &u64| n % 5)
        .process("count", |_key: &u64, state: &mut CountV2, _n: u64, out| {
            state.seen += 1;
            out.emit(state.seen);
            Ok(())
        })
        .sink("collect", output);
    check_ends_at_once(job, "count");
}

/// A sink whose restore always fails with the error `make` gives.
#[derive(Clone)]
struct FailingRestore {
    make: fn() -> SinkError,
}

impl SinkFactory for FailingRestore {
    type Sink = FailingRestoreSink;

    fn create(
        &self,
        _subtask: usize,
        _parallelism: usize,
    ) -> Result<FailingRestoreSink, SinkError> {
        Ok(FailingRestoreSink { make: self.make })
    }
}

struct FailingRestoreSink {
    make: fn() -> SinkError,
}

impl Sink for FailingRestoreSink {
    type Item = u64;

    fn write_batch(&mut self, _batch: &[u64]) -> Result<(), SinkError> {
        Ok(())
    }

    fn pre_commit(&mut self, _checkpoint_id: u64) -> Result<SinkState, SinkError> {
        Ok(SinkState::default())
    }

    fn commit(&mut self, _checkpoint_id: u64) -> Result<(), SinkError> {
        Ok(())
    }

    fn abort(&mut self) -> Result<(), SinkError> {
        Ok(())
    }

    fn restore(&mut self, _state: Option<&SinkState>) -> Result<(), SinkError> {
        Err((self.make)())
    }
}

fn check_sink_restore(make: fn() -> SinkError) {
    let job = Job::new("sinks", config(None));
    job.source("numbers", PacedSourceFactory::new(100, PACING))
        .sink("broken", FailingRestore { make });
    check_ends_at_once(job, "broken");
}

#[test]
fn sink_errors_that_cannot_clear_end_the_job_at_once() {
    check_sink_restore(|| SinkError::TargetExists {
        path: "out/part-0-3".into(),
    });
    check_sink_restore(|| SinkError::MissingTransaction {
        subtask: 0,
        checkpoint_id: 3,
    });
    check_sink_restore(|| SinkError::Custom {
        message: "the table has the wrong columns".into(),
        retryable: false,
    });
}

#[test]
fn a_sink_that_cannot_be_set_up_fails_the_start() {
    struct Unusable;
    impl SinkFactory for Unusable {
        type Sink = FailingRestoreSink;
        fn create(&self, _: usize, _: usize) -> Result<FailingRestoreSink, SinkError> {
            Err(SinkError::InvalidName {
                name: "bad/name".into(),
                reason: "the prefix may hold only ASCII letters, digits and `_`",
            })
        }
    }
    let job = Job::new("setup", config(None));
    job.source("numbers", PacedSourceFactory::new(100, PACING))
        .sink("unusable", Unusable);
    let started = Instant::now();
    let error = job.run().expect_err("a sink that cannot be made");
    assert!(started.elapsed() < AT_ONCE);
    assert!(
        matches!(&error, JobError::SinkRestore { sink, error: SinkError::InvalidName { .. }, .. } if sink == "unusable"),
        "{error}"
    );
    assert!(!error.is_retryable());
}

#[test]
fn a_user_error_marked_not_retryable_ends_the_job_at_once() {
    let job = Job::new("user", config(None));
    job.source("numbers", PacedSourceFactory::new(1_000, PACING))
        .key_by(|n: &u64| n % 3)
        .process(
            "validate",
            |_key: &u64, state: &mut CountV1, n: u64, out| {
                if n == 400 {
                    return Err(NotRetryable::new(format!("record {n} has no user id")).into());
                }
                state.seen += 1;
                out.emit(n);
                Ok(())
            },
        )
        .sink("collect", CollectHandle::new());
    check_ends_at_once(job, "validate");
}

#[test]
fn a_poison_pill_ends_the_job_after_the_bounded_restarts() {
    quiet_injected_panics();
    let strategy = RestartStrategy::ExponentialBackoff {
        delay_ms_initial: 10,
        delay_ms_max: 40,
        multiplier: 1.5,
        reset_after_stable_ms: 3_600_000,
        jitter: None,
        restarts_max_without_checkpoint: Some(DEFAULT_RESTARTS_MAX_WITHOUT_CHECKPOINT),
    };
    // No periodic checkpoint: every restart starts from the beginning and
    // meets the same record.
    let job = Job::new(
        "poison",
        JobConfig {
            restart: strategy,
            ..JobConfig::default()
        },
    );
    job.source("numbers", PacedSourceFactory::new(500, PACING))
        .map("parse", |n: u64| {
            if n == 123 {
                panic!("injected poison pill at record {n}");
            }
            n
        })
        .sink("collect", CollectHandle::new());
    let started = Instant::now();
    let error = run_within(Duration::from_secs(30), job).expect_err("a poison pill cannot pass");
    eprintln!(
        "the poison pill ended the job after {:?}",
        started.elapsed()
    );
    match &error {
        JobError::RestartsExhausted {
            restarts,
            reason,
            cause,
        } => {
            assert_eq!(*restarts, DEFAULT_RESTARTS_MAX_WITHOUT_CHECKPOINT);
            assert!(reason.contains("no checkpoint completed"), "{reason}");
            assert!(cause.contains("poison pill"), "{cause}");
        }
        other => panic!("expected RestartsExhausted, got {other}"),
    }
}

#[test]
fn the_status_shows_restarts_failures_and_checkpoints_while_the_job_runs() {
    quiet_injected_panics();
    let failed = Arc::new(AtomicBool::new(false));
    let job = Job::new(
        "status",
        JobConfig {
            checkpoint_interval_ms: Some(10),
            restart: RestartStrategy::FixedDelay {
                attempts_max: 3,
                delay_ms: 10,
            },
            ..JobConfig::default()
        },
    );
    let once = Arc::clone(&failed);
    job.source(
        "numbers",
        PacedSourceFactory::new(
            40_000,
            Pacing {
                records_per_read: 20,
            },
        ),
    )
    .map("parse", move |n: u64| {
        if n == 300 && !once.swap(true, Ordering::SeqCst) {
            panic!("injected failure at record {n}");
        }
        n
    })
    .sink("collect", CollectHandle::new());
    let running = job.start().expect("the job starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let status = running.status();
        if status.restarts == 1
            && status.last_completed_checkpoint.is_some()
            && status.generation >= 2
        {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "never saw the restart: {status:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let failure = status.last_failure.expect("the failure is shown");
    assert!(
        failure.contains("parse") && failure.contains("injected failure"),
        "{failure}"
    );
    assert!(!status.ended);
    running.cancel();
    assert!(matches!(running.wait(), Err(JobError::Cancelled)));
}

#[test]
fn a_finished_job_run_again_says_so_and_writes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let dirs = Dirs::under(root.path());
    let first = damage::resume(&dirs, false, Duration::from_secs(60)).expect("the first run");
    assert!(!first.already_finished);
    let ids_before = damage::checkpoint_ids(&dirs);
    let again = damage::resume(&dirs, false, Duration::from_secs(60)).expect("the second run");
    assert!(again.already_finished, "{again:?}");
    assert_eq!(again.resumed_from, ids_before.last().copied());
    assert!(again.checkpoints.is_empty());
    assert_eq!(damage::checkpoint_ids(&dirs), ids_before);
    let (want, _) = expected(damage::RECORDS);
    assert!(committed(&dirs.output).unwrap() == want);
}

#[test]
fn a_zero_checkpoint_interval_is_refused_by_name() {
    let job = Job::new(
        "zero",
        JobConfig {
            checkpoint_interval_ms: Some(0),
            ..JobConfig::default()
        },
    );
    job.source("numbers", PacedSourceFactory::new(10, PACING))
        .sink("collect", CollectHandle::new());
    let error = job.run().expect_err("a zero interval");
    assert!(matches!(error, JobError::InvalidConfig(_)), "{error}");
    assert!(
        error.to_string().contains("checkpoint_interval_ms"),
        "{error}"
    );
}
