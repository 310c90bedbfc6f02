//! What a restart reports about the failure that caused it: the operator,
//! the subtask, the generation, how it failed (panic or error) with its
//! message, and the checkpoint in flight at that moment (or none).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use snapflow::job::{Job, JobConfig, RestartReport, RestartStrategy};
use snapflow::runtime::failure::FailureKind;
use snapflow::sink::CollectHandle;
use snapflow_tests::pipeline::{FailFirstPreCommit, PacedSourceFactory, Pacing};

const RECORDS: u64 = 500;

/// How the test job fails.
#[derive(Clone, Copy)]
enum Inject {
    /// The map panics on this record; no periodic checkpoints.
    PanicInMap(u64),
    /// The sink's first pre-commit fails (checkpoint 1 in flight).
    SinkPreCommit,
}

/// Runs source → map → sink with one failure and returns the only restart.
fn restart_of(inject: Inject) -> RestartReport {
    let interval_ms = match inject {
        Inject::PanicInMap(_) => None,
        Inject::SinkPreCommit => Some(5),
    };
    let job = Job::new(
        "reported",
        JobConfig {
            checkpoint_interval_ms: interval_ms,
            restart: RestartStrategy::FixedDelay {
                attempts_max: 1,
                delay_ms: 0,
            },
            batch_size_max: 8,
            arbiters: Some(2),
            ..JobConfig::default()
        },
    );
    let output = CollectHandle::new();
    let fired = Arc::new(AtomicBool::new(false));
    let sink = FailFirstPreCommit::new(output.clone(), matches!(inject, Inject::SinkPreCommit));
    let pacing = Pacing {
        records_per_read: 8,
    };
    job.source("numbers", PacedSourceFactory::new(RECORDS, pacing))
        .map("step", move |n: u64| {
            if let Inject::PanicInMap(record) = inject {
                if n == record && !fired.swap(true, Ordering::SeqCst) {
                    panic!("boom at {n}");
                }
            }
            n
        })
        .sink("collect", sink);
    let report = job.run().expect("the job recovers");
    let mut committed = output.committed();
    committed.sort_unstable();
    assert_eq!(committed, (0..RECORDS).collect::<Vec<_>>());
    assert_eq!(report.restarts.len(), 1, "{:?}", report.restarts);
    report.restarts[0].clone()
}

fn check(inject: Inject, operator: &str, kind: FailureKind, message: &str, in_flight: Option<u64>) {
    let restart = restart_of(inject);
    let failure = restart.failure.clone().expect("an operator failed");
    assert_eq!(&*failure.tag.operator, operator, "{restart:?}");
    assert_eq!(failure.tag.subtask, 0);
    assert_eq!(failure.tag.generation.0, 1, "the first generation failed");
    assert_eq!(failure.kind, kind);
    assert!(failure.message.contains(message), "{restart:?}");
    assert_eq!(restart.checkpoint_in_flight, in_flight, "{restart:?}");
    let in_flight_text = match in_flight {
        Some(checkpoint) => format!("checkpoint {checkpoint} in flight"),
        None => "no checkpoint in flight".to_owned(),
    };
    for part in [
        format!("{operator}[0]"),
        "generation 1".to_owned(),
        kind.to_string(),
        message.to_owned(),
        in_flight_text,
    ] {
        assert!(
            restart.cause.contains(&part),
            "`{part}` in {}",
            restart.cause
        );
    }
}

#[test]
fn a_panic_names_operator_subtask_generation_and_no_checkpoint() {
    check(
        Inject::PanicInMap(200),
        "step",
        FailureKind::CallbackPanicked,
        "boom at 200",
        None,
    );
}

#[test]
fn an_error_during_a_checkpoint_names_that_checkpoint() {
    check(
        Inject::SinkPreCommit,
        "collect",
        FailureKind::CallbackFailed,
        "pre-commit of checkpoint 1 refused",
        Some(1),
    );
}
