//! The coordinator's schedule and bookkeeping, one behaviour per test:
//! interval, minimum pause, maximum concurrent checkpoints, timeout abort,
//! tolerable failures, manual triggers and savepoints, declines, stale acks
//! and subsumption. Time is only ever an argument.

use snapflow::protocol::coordinator::{AbortReason, AckOutcome, CoordinatorAction};
use snapflow::protocol::{
    CheckpointId, CheckpointKind, Coordinator, CoordinatorConfig, CoordinatorConfigError,
    DeclineReason,
};

type Action = CoordinatorAction<&'static str>;

fn coordinator(config: CoordinatorConfig, nodes: usize) -> Coordinator<&'static str> {
    Coordinator::new(config, nodes, vec![0], 0).expect("valid config")
}

fn periodic(interval_ms: u64) -> CoordinatorConfig {
    CoordinatorConfig {
        interval_ms: Some(interval_ms),
        ..CoordinatorConfig::default()
    }
}

fn drain(coordinator: &mut Coordinator<&'static str>) -> Vec<Action> {
    std::iter::from_fn(|| coordinator.poll_action()).collect()
}

fn trigger(checkpoint: u64, kind: CheckpointKind) -> Action {
    Action::Trigger {
        checkpoint: CheckpointId(checkpoint),
        kind,
    }
}

fn ack_all(
    coordinator: &mut Coordinator<&'static str>,
    now_ms: u64,
    checkpoint: u64,
    nodes: usize,
) {
    for node in 0..nodes {
        let _ = coordinator.on_ack(now_ms, node, CheckpointId(checkpoint), "part");
    }
}

/// Advances to each time in `times` and returns the trigger numbers seen.
fn triggers_at(coordinator: &mut Coordinator<&'static str>, times: &[u64]) -> Vec<(u64, u64)> {
    let mut seen = Vec::new();
    for &now_ms in times {
        coordinator.handle_timeout(now_ms);
        for action in drain(coordinator) {
            if let Action::Trigger { checkpoint, .. } = action {
                seen.push((now_ms, checkpoint.0));
            }
        }
    }
    seen
}

#[test]
fn interval_triggers_one_interval_apart() {
    let mut c = coordinator(periodic(100), 1);
    assert_eq!(c.poll_timeout(), Some(100));
    assert_eq!(triggers_at(&mut c, &[50, 99]), vec![]);
    c.handle_timeout(100);
    assert_eq!(drain(&mut c), vec![trigger(1, CheckpointKind::Periodic)]);
    ack_all(&mut c, 120, 1, 1);
    assert!(
        matches!(drain(&mut c)[..], [Action::Complete(ref done)] if done.checkpoint == CheckpointId(1))
    );
    assert_eq!(triggers_at(&mut c, &[150, 199, 200]), vec![(200, 2)]);
}

#[test]
fn min_pause_delays_the_next_trigger_after_a_finish() {
    let mut c = coordinator(
        CoordinatorConfig {
            min_pause_ms: 50,
            ..periodic(100)
        },
        1,
    );
    assert_eq!(triggers_at(&mut c, &[100]), vec![(100, 1)]);
    ack_all(&mut c, 180, 1, 1);
    drain(&mut c);
    assert_eq!(c.poll_timeout(), Some(230));
    assert_eq!(triggers_at(&mut c, &[200, 229, 230]), vec![(230, 2)]);
}

#[test]
fn max_concurrent_bounds_checkpoints_in_flight() {
    let mut c = coordinator(
        CoordinatorConfig {
            max_concurrent: 2,
            ..periodic(10)
        },
        1,
    );
    assert_eq!(
        triggers_at(&mut c, &[10, 20, 30, 40]),
        vec![(10, 1), (20, 2)]
    );
    ack_all(&mut c, 45, 1, 1);
    let actions = drain(&mut c);
    assert!(
        matches!(
            actions[..],
            [
                Action::Complete(_),
                Action::Trigger {
                    checkpoint: CheckpointId(3),
                    ..
                }
            ]
        ),
        "{actions:?}"
    );
}

#[test]
fn timeout_aborts_and_returns_acked_parts() {
    let mut c = coordinator(
        CoordinatorConfig {
            timeout_ms: 50,
            tolerable_failures: 5,
            ..periodic(100)
        },
        2,
    );
    triggers_at(&mut c, &[100]);
    assert_eq!(
        c.on_ack(110, 0, CheckpointId(1), "part of node 0"),
        AckOutcome::Pending
    );
    assert_eq!(c.poll_timeout(), Some(150));
    c.handle_timeout(150);
    let abort = Action::Abort {
        checkpoint: CheckpointId(1),
        reason: AbortReason::Timeout,
        parts: vec!["part of node 0"],
    };
    assert_eq!(drain(&mut c), vec![abort]);
    assert_eq!(c.consecutive_failures(), 1);
    assert_eq!(
        c.on_ack(160, 1, CheckpointId(1), "late"),
        AckOutcome::Stale("late")
    );
}

#[test]
fn tolerable_failures_then_the_job_fails() {
    let mut c = coordinator(
        CoordinatorConfig {
            timeout_ms: 5,
            tolerable_failures: 1,
            ..periodic(10)
        },
        1,
    );
    triggers_at(&mut c, &[10, 15]);
    assert!(!c.has_failed(), "one failure is tolerated");
    c.handle_timeout(20);
    c.handle_timeout(25);
    let actions = drain(&mut c);
    assert!(
        actions.contains(&Action::FailJob {
            consecutive_failures: 2
        }),
        "{actions:?}"
    );
    assert!(c.has_failed());
    assert_eq!(
        c.poll_timeout(),
        None,
        "a failed coordinator schedules nothing"
    );
}

#[test]
fn a_completion_resets_the_failure_count() {
    let mut c = coordinator(
        CoordinatorConfig {
            timeout_ms: 5,
            tolerable_failures: 1,
            ..periodic(10)
        },
        1,
    );
    triggers_at(&mut c, &[10, 15, 20]);
    ack_all(&mut c, 21, 2, 1);
    drain(&mut c);
    assert_eq!(c.consecutive_failures(), 0);
    triggers_at(&mut c, &[30, 35]);
    assert!(!c.has_failed());
}

#[test]
fn persist_failures_add_up_across_completions() {
    let mut c = coordinator(
        CoordinatorConfig {
            tolerable_failures: 2,
            ..periodic(10)
        },
        1,
    );
    for (round, now_ms) in [(1_u64, 10_u64), (2, 20), (3, 30)] {
        triggers_at(&mut c, &[now_ms]);
        ack_all(&mut c, now_ms + 1, round, 1);
        assert_eq!(c.consecutive_failures(), 0, "a completion resets the count");
        c.on_persist_failed(now_ms + 2, CheckpointId(round));
        assert_eq!(c.consecutive_failures(), round as u32, "round {round}");
    }
    let actions = drain(&mut c);
    assert!(
        actions.contains(&Action::FailJob {
            consecutive_failures: 3
        }),
        "{actions:?}"
    );
}

#[test]
fn a_durable_completion_keeps_the_count_reset() {
    let mut c = coordinator(periodic(10), 1);
    triggers_at(&mut c, &[10]);
    ack_all(&mut c, 11, 1, 1);
    triggers_at(&mut c, &[20]);
    ack_all(&mut c, 21, 2, 1);
    c.on_persist_failed(22, CheckpointId(2));
    assert_eq!(c.consecutive_failures(), 1);
    assert!(drain(&mut c).contains(&Action::FailJob {
        consecutive_failures: 1
    }));
}

#[test]
fn manual_trigger_ignores_the_interval() {
    let mut c = coordinator(CoordinatorConfig::default(), 1);
    assert_eq!(c.poll_timeout(), None, "no interval, nothing scheduled");
    c.request_checkpoint(5, CheckpointKind::Savepoint);
    assert_eq!(drain(&mut c), vec![trigger(1, CheckpointKind::Savepoint)]);
}

#[test]
fn requests_while_busy_coalesce_into_one_savepoint() {
    let mut c = coordinator(CoordinatorConfig::default(), 1);
    c.request_checkpoint(0, CheckpointKind::Requested);
    c.request_checkpoint(1, CheckpointKind::Requested);
    c.request_checkpoint(2, CheckpointKind::Savepoint);
    assert_eq!(drain(&mut c), vec![trigger(1, CheckpointKind::Requested)]);
    ack_all(&mut c, 3, 1, 1);
    let actions = drain(&mut c);
    assert_eq!(actions[1..], [trigger(2, CheckpointKind::Savepoint)]);
}

#[test]
fn a_decline_aborts_and_counts_as_a_failure() {
    let mut c = coordinator(
        CoordinatorConfig {
            tolerable_failures: 3,
            ..periodic(10)
        },
        2,
    );
    triggers_at(&mut c, &[10]);
    c.on_decline(11, 1, CheckpointId(1), DeclineReason::BarrierOvertaken);
    let reason = AbortReason::Declined {
        node: 1,
        reason: DeclineReason::BarrierOvertaken,
    };
    assert_eq!(
        drain(&mut c),
        vec![Action::Abort {
            checkpoint: CheckpointId(1),
            reason,
            parts: vec![]
        }]
    );
    assert_eq!(c.consecutive_failures(), 1);
}

#[test]
fn completing_a_newer_checkpoint_subsumes_older_ones() {
    let mut c = coordinator(
        CoordinatorConfig {
            max_concurrent: 2,
            ..periodic(10)
        },
        1,
    );
    triggers_at(&mut c, &[10, 20]);
    ack_all(&mut c, 25, 2, 1);
    let actions = drain(&mut c);
    let subsumed = Action::Abort {
        checkpoint: CheckpointId(1),
        reason: AbortReason::Subsumed,
        parts: vec![],
    };
    assert_eq!(actions[0], subsumed);
    assert!(matches!(actions[1], Action::Complete(ref done) if done.checkpoint == CheckpointId(2)));
    assert_eq!(c.consecutive_failures(), 0, "subsumption is not a failure");
}

#[test]
fn abort_all_is_not_a_failure() {
    let mut c = coordinator(periodic(10), 1);
    triggers_at(&mut c, &[10]);
    c.abort_all(12);
    assert_eq!(drain(&mut c).len(), 1);
    assert!(!c.has_failed());
}

#[test]
fn complete_carries_every_part_in_node_order() {
    let mut c = coordinator(CoordinatorConfig::default(), 2);
    c.request_checkpoint(0, CheckpointKind::Requested);
    drain(&mut c);
    assert_eq!(c.on_ack(1, 1, CheckpointId(1), "b"), AckOutcome::Pending);
    assert_eq!(c.on_ack(2, 0, CheckpointId(1), "a"), AckOutcome::Completed);
    let Some(Action::Complete(done)) = c.poll_action() else {
        panic!("expected a completion")
    };
    assert_eq!(
        (done.parts, done.triggered_ms, done.completed_ms),
        (vec!["a", "b"], 0, 2)
    );
}

#[test]
fn bad_configs_are_typed_errors() {
    let check = |config, nodes, initiators: Vec<usize>, want| {
        let error = Coordinator::<()>::new(config, nodes, initiators, 0).unwrap_err();
        assert_eq!(error, want);
        assert!(!error.is_retryable());
    };
    check(
        CoordinatorConfig {
            max_concurrent: 0,
            ..CoordinatorConfig::default()
        },
        1,
        vec![0],
        CoordinatorConfigError::ZeroConcurrency,
    );
    check(
        periodic(0),
        1,
        vec![0],
        CoordinatorConfigError::ZeroInterval,
    );
    check(
        CoordinatorConfig::default(),
        0,
        vec![0],
        CoordinatorConfigError::NoNodes,
    );
    check(
        CoordinatorConfig::default(),
        1,
        vec![],
        CoordinatorConfigError::NoInitiators,
    );
    check(
        CoordinatorConfig::default(),
        1,
        vec![3],
        CoordinatorConfigError::UnknownInitiator {
            initiator: 3,
            node_count: 1,
        },
    );
}

#[test]
#[should_panic(expected = "acked checkpoint 1 twice")]
fn a_double_ack_is_a_driver_bug() {
    let mut c = coordinator(CoordinatorConfig::default(), 2);
    c.request_checkpoint(0, CheckpointKind::Requested);
    let _ = c.on_ack(1, 0, CheckpointId(1), "a");
    let _ = c.on_ack(1, 0, CheckpointId(1), "a");
}

#[test]
fn after_savepoints_only_nothing_but_a_savepoint_starts() {
    let mut c = coordinator(periodic(100), 1);
    assert_eq!(triggers_at(&mut c, &[100]), [(100, 1)]);
    ack_all(&mut c, 110, 1, 1);
    drain(&mut c);
    // A stop with a savepoint: the schedule ends, and the final
    // checkpoint a bounded job asks for is dropped.
    c.savepoints_only();
    c.request_checkpoint(120, CheckpointKind::Requested);
    assert!(drain(&mut c).is_empty(), "a requested checkpoint started");
    assert!(triggers_at(&mut c, &[200, 300, 1_000]).is_empty());
    assert_eq!(c.poll_timeout(), None, "nothing is scheduled");
    c.request_checkpoint(1_000, CheckpointKind::Savepoint);
    assert_eq!(drain(&mut c), [trigger(2, CheckpointKind::Savepoint)]);
    ack_all(&mut c, 1_010, 2, 1);
    drain(&mut c);
    assert!(triggers_at(&mut c, &[1_100, 5_000]).is_empty());
}
