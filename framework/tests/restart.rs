//! Tests of `snapflow::restart` through its public API: each strategy's
//! exact decisions for scripted failure times, backoff growth, cap and
//! reset, the sliding failure-rate window, validation, serialisation, and
//! property tests against simple models.
//!
//! Cases are one line each (`#[rustfmt::skip]` keeps them so). Scripts are
//! one line too: `F<ms>` is a failure at that time, `R<ms>` the job running
//! again, `S<ms>` a failure whose run restored the same source positions
//! as the newest checkpoint holds (no progress), `A<ms>` one whose run got
//! past them (progress), `C<ms>` a checkpoint completed (the positionless
//! API). Run with `cargo test -p snapflow --test restart`;
//! proptest prints the failing case and its seed, and replays it from
//! `proptest-regressions/` or `PROPTEST_RNG_SEED`.

use proptest::prelude::*;
use snapflow::restart::{
    GiveUpReason, Jitter, RestartConfigError, RestartDecision, RestartStrategy, RestartTracker,
    RunPositions, DEFAULT_RESTARTS_MAX_WITHOUT_CHECKPOINT,
};

fn fixed(attempts_max: u32, delay_ms: u64) -> RestartStrategy {
    RestartStrategy::FixedDelay {
        attempts_max,
        delay_ms,
    }
}

fn backoff(initial_ms: u64, max_ms: u64, multiplier: f64, stable_ms: u64) -> RestartStrategy {
    RestartStrategy::ExponentialBackoff {
        delay_ms_initial: initial_ms,
        delay_ms_max: max_ms,
        multiplier,
        reset_after_stable_ms: stable_ms,
        jitter: None,
        restarts_max_without_checkpoint: None,
    }
}

fn with_jitter(strategy: RestartStrategy, jitter: Jitter) -> RestartStrategy {
    match strategy {
        RestartStrategy::ExponentialBackoff {
            delay_ms_initial,
            delay_ms_max,
            multiplier,
            reset_after_stable_ms,
            ..
        } => RestartStrategy::ExponentialBackoff {
            delay_ms_initial,
            delay_ms_max,
            multiplier,
            reset_after_stable_ms,
            jitter: Some(jitter),
            restarts_max_without_checkpoint: None,
        },
        other => panic!("only a backoff takes jitter, not {other:?}"),
    }
}

fn rate(failures_max: u32, interval_ms: u64, delay_ms: u64) -> RestartStrategy {
    RestartStrategy::FailureRate {
        failures_max_per_interval: failures_max,
        interval_ms,
        delay_ms,
    }
}

/// One step of a script.
#[derive(Debug, Clone, Copy)]
enum Step {
    Fail(u64),
    Run(u64),
    /// A failure with positions: whether the run advanced.
    FailAt(u64, bool),
    Checkpoint,
}

fn parse(script: &str) -> Vec<Step> {
    let step = |word: &str| {
        let (kind, time) = word.split_at(1);
        let time_ms: u64 = time.parse().unwrap_or_else(|_| panic!("bad step {word}"));
        match kind {
            "F" => Step::Fail(time_ms),
            "R" => Step::Run(time_ms),
            "S" => Step::FailAt(time_ms, false),
            "A" => Step::FailAt(time_ms, true),
            "C" => Step::Checkpoint,
            _ => panic!("bad step {word}"),
        }
    };
    script.split_whitespace().map(step).collect()
}

/// Runs the steps and returns the decision of every failure.
fn run(tracker: &mut RestartTracker, steps: &[Step]) -> Vec<RestartDecision> {
    let mut decisions = Vec::new();
    for step in steps {
        match *step {
            Step::Fail(now_ms) => decisions.push(tracker.on_failure(now_ms)),
            Step::Run(now_ms) => tracker.on_running(now_ms),
            Step::FailAt(now_ms, advanced) => {
                decisions.push(tracker.on_failure_at(now_ms, positions(advanced)));
            }
            Step::Checkpoint => tracker.on_checkpoint_completed(),
        }
    }
    decisions
}

/// Runs `script` and compares the decisions, as the supervisor would log
/// them, with `expected`: a delay in ms for a restart (attempts must count
/// 1, 2, ...), or a give-up message.
fn check(strategy: RestartStrategy, script: &str, expected: &[&str]) {
    let mut tracker = RestartTracker::new(strategy.clone()).expect("valid strategy");
    let decisions = run(&mut tracker, &parse(script));
    let mut restarts = 0;
    let shown: Vec<String> = decisions
        .iter()
        .map(|decision| match decision {
            RestartDecision::Restart { delay_ms, attempt } => {
                restarts += 1;
                assert_eq!(*attempt, restarts, "{strategy:?}: {script}");
                delay_ms.to_string()
            }
            RestartDecision::GiveUp { reason } => reason.to_string(),
        })
        .collect();
    assert_eq!(shown, expected, "{strategy:?}: {script}");
    assert_eq!(tracker.attempts(), restarts, "{strategy:?}: {script}");
}

const NONE: &str = "restart strategy is none";

#[test]
#[rustfmt::skip]
fn none_never_restarts() {
    check(RestartStrategy::None, "F0", &[NONE]);
    check(RestartStrategy::None, "F0 R5 F10", &[NONE, NONE]);
}

#[test]
#[rustfmt::skip]
fn fixed_delay_counts_attempts_over_the_whole_life() {
    let gave_up = "3 restart attempts exhausted";
    check(fixed(3, 1000), "F0 F1 F2", &["1000", "1000", "1000"]);
    check(fixed(3, 1000), "F0 F1 F2 F3 F4", &["1000", "1000", "1000", gave_up, gave_up]);
    check(fixed(3, 0), "F0 F1 F2 F3", &["0", "0", "0", gave_up]);
    // Running stably does not give attempts back, as in Flink.
    check(fixed(2, 7), "F0 R10 F9999999 R10000000 F99999999", &["7", "7", "2 restart attempts exhausted"]);
    check(fixed(1, 5), "F0 F1", &["5", "1 restart attempt exhausted"]);
    check(fixed(0, 5), "F0", &["0 restart attempts exhausted"]);
}

#[test]
#[rustfmt::skip]
fn backoff_grows_by_the_multiplier_up_to_the_cap() {
    check(backoff(1000, 10_000, 2.0, 60_000), "F0 F1 F2 F3 F4 F5", &["1000", "2000", "4000", "8000", "10000", "10000"]);
    check(backoff(1000, 1000, 3.0, 60_000), "F0 F1 F2", &["1000", "1000", "1000"]);
    check(backoff(250, 10_000, 1.0, 60_000), "F0 F1 F2", &["250", "250", "250"]);
    // Fractions are kept between failures and rounded only in the delay.
    check(backoff(1000, 60_000, 1.5, 60_000), "F0 F1 F2 F3 F4 F5", &["1000", "1500", "2250", "3375", "5063", "7594"]);
    check(backoff(1, 100, 1.1, 60_000), "F0 F1 F2 F3 F4 F5 F6 F7 F8", &["1", "1", "1", "1", "1", "2", "2", "2", "2"]);
}

#[test]
#[rustfmt::skip]
fn backoff_resets_after_a_stable_period() {
    let strategy = || backoff(1000, 10_000, 2.0, 60_000);
    // Ran 1000 ms: not stable; ran 65000 ms: stable, back to the start.
    check(strategy(), "F0 R1000 F2000 R5000 F70000 F70001", &["1000", "2000", "1000", "2000"]);
    // Exactly the stable period resets; one ms less does not.
    check(strategy(), "F0 R1000 F61000", &["1000", "1000"]);
    check(strategy(), "F0 R1000 F60999", &["1000", "2000"]);
    // Without `on_running` the job never counts as running stably.
    check(strategy(), "F0 F999999999", &["1000", "2000"]);
    // A second `on_running` keeps the first moment.
    check(strategy(), "F0 R100 R50000 F60100", &["1000", "1000"]);
    // The stable period counts from running again, not from the failure.
    check(strategy(), "F0 F1 R100000 F150000", &["1000", "2000", "4000"]);
}

#[test]
#[rustfmt::skip]
fn the_default_is_flinks_exponential_backoff() {
    let strategy = RestartStrategy::default();
    let mut expected = backoff(1000, 60_000, 1.5, 3_600_000);
    if let RestartStrategy::ExponentialBackoff {
        restarts_max_without_checkpoint,
        ..
    } = &mut expected
    {
        *restarts_max_without_checkpoint = Some(DEFAULT_RESTARTS_MAX_WITHOUT_CHECKPOINT);
    }
    assert_eq!(strategy, expected);
    check(strategy, "F0 F1 F2 R3 F3600003", &["1000", "1500", "2250", "1000"]);
}

/// Positions of a failed run: restored at 7, reached 7 or 8.
fn positions(advanced: bool) -> RunPositions {
    RunPositions {
        restored: 7,
        reached: if advanced { 8 } else { 7 },
    }
}

/// A backoff with a limit on restarts without progress.
fn limit(restarts_max: Option<u32>) -> RestartStrategy {
    let mut strategy = backoff(10, 100, 2.0, 1_000_000);
    if let RestartStrategy::ExponentialBackoff {
        restarts_max_without_checkpoint,
        ..
    } = &mut strategy
    {
        *restarts_max_without_checkpoint = restarts_max;
    }
    strategy
}

/// A tracker of [`limit`].
fn limited(restarts_max: u32) -> RestartTracker {
    RestartTracker::new(limit(Some(restarts_max))).expect("a valid strategy")
}

#[test]
fn a_backoff_gives_up_after_its_restarts_without_a_checkpoint() {
    let mut tracker = limited(3);
    for attempt in 1..=3 {
        assert!(matches!(
            tracker.on_failure(attempt * 10),
            RestartDecision::Restart { attempt: got, .. } if got == attempt as u32
        ));
        tracker.on_running(attempt * 10 + 5);
    }
    let RestartDecision::GiveUp { reason } = tracker.on_failure(100) else {
        panic!("a fourth failure in a row without a checkpoint restarted");
    };
    assert_eq!(
        reason,
        GiveUpReason::NoCheckpointBetweenFailures { restarts_max: 3 }
    );
    assert!(
        reason.to_string().contains("no checkpoint completed"),
        "{reason}"
    );
}

#[test]
fn a_completed_checkpoint_resets_the_count_of_restarts_without_one() {
    let mut tracker = limited(2);
    for round in 0..5_u64 {
        for failure in 0..2 {
            let decision = tracker.on_failure(round * 100 + failure * 10);
            assert!(
                matches!(decision, RestartDecision::Restart { .. }),
                "{decision:?}"
            );
        }
        tracker.on_checkpoint_completed();
    }
    assert_eq!(tracker.attempts(), 10);
}

/// The give-up message of the no-progress rule with `restarts_max`.
fn no_progress(restarts_max: u32) -> String {
    GiveUpReason::NoCheckpointBetweenFailures { restarts_max }.to_string()
}

#[test]
#[rustfmt::skip]
fn failures_at_the_same_positions_give_up_even_with_checkpoints_between() {
    let gave_up = &*no_progress(3);
    assert_eq!(gave_up, "failed again after 3 restarts in a row with no checkpoint completed at new source positions between them (the same failure at the same place every time, e.g. a poison pill)");
    // Issue 36, finding 5: checkpoints complete between the failures, at
    // the restored positions; that is no progress.
    check(limit(Some(3)), "S0 S1 S2 S3 S4", &["10", "20", "40", gave_up, gave_up]);
    // The first failure's run got somewhere; the three after did not.
    check(limit(Some(3)), "A0 S1 S2 S3", &["10", "20", "40", gave_up]);
    // Progress starts the count again; the backoff grows on regardless.
    check(limit(Some(3)), "S0 S1 A2 S3 S4 S5", &["10", "20", "40", "80", "100", gave_up]);
    check(limit(Some(3)), "S0 S1 S2 A3 S4 S5 S6", &["10", "20", "40", "80", "100", "100", gave_up]);
    // A limit of 0 gives up at the first failure without progress.
    check(limit(Some(0)), "A0", &[&*no_progress(0)]);
    // No limit: Flink's behaviour, for ever.
    check(limit(None), "S0 S1 S2 S3 S4 S5 S6", &["10", "20", "40", "80", "100", "100", "100"]);
    // The positionless API: a completed checkpoint is progress.
    check(limit(Some(2)), "F0 F1 C2 F3 F4 F5", &["10", "20", "40", "80", &*no_progress(2)]);
}

#[test]
fn the_default_gives_up_on_a_poison_pill_after_ten_restarts_and_two_minutes() {
    let mut tracker = RestartTracker::new(RestartStrategy::default()).expect("valid");
    let mut now_ms = 0;
    let mut delays_ms = Vec::new();
    // The first run got as far as the pill; every later one restored the
    // position before it, and checkpoints completed there each time.
    let mut advanced = true;
    loop {
        match tracker.on_failure_at(now_ms, positions(advanced)) {
            RestartDecision::Restart { delay_ms, .. } => {
                delays_ms.push(delay_ms);
                now_ms += delay_ms + 500;
                tracker.on_running(now_ms);
                now_ms += 500;
            }
            RestartDecision::GiveUp { reason } => {
                assert!(matches!(
                    reason,
                    GiveUpReason::NoCheckpointBetweenFailures { restarts_max: 10 }
                ));
                break;
            }
        }
        advanced = false;
    }
    assert_eq!(
        delays_ms,
        [1000, 1500, 2250, 3375, 5063, 7594, 11391, 17086, 25629, 38443]
    );
    assert_eq!(delays_ms.iter().sum::<u64>(), 113_331);
    assert_eq!(tracker.attempts(), DEFAULT_RESTARTS_MAX_WITHOUT_CHECKPOINT);
}

#[test]
#[rustfmt::skip]
fn failure_rate_gives_up_on_too_many_failures_in_the_window() {
    let gave_up = "3 failures within 60000 ms exceed the limit 2";
    check(rate(2, 60_000, 500), "F0 F10000", &["500", "500"]);
    check(rate(2, 60_000, 500), "F0 F10000 F20000 F999999", &["500", "500", gave_up, gave_up]);
    // A failure exactly one interval old still counts, as in Flink.
    check(rate(2, 60_000, 500), "F0 F10000 F60000", &["500", "500", gave_up]);
    check(rate(0, 1000, 5), "F0", &["1 failure within 1000 ms exceeds the limit 0"]);
}

#[test]
#[rustfmt::skip]
fn failure_rate_window_slides() {
    check(rate(2, 60_000, 500), "F0 F10000 F60001 F70001 F120002", &["500"; 5]);
    check(rate(1, 100, 0), "F0 F101 F202 F303 F403", &["0", "0", "0", "0", "2 failures within 100 ms exceed the limit 1"]);
    // Running again changes nothing for a failure rate.
    check(rate(1, 100, 0), "F0 R50 F60", &["0", "2 failures within 100 ms exceed the limit 1"]);
}

#[test]
#[rustfmt::skip]
fn time_never_goes_backwards() {
    // F10 after F5000 counts as a failure at 5000.
    check(rate(1, 1000, 5), "F5000 F10", &["5", "2 failures within 1000 ms exceed the limit 1"]);
    // F100 after R70000 counts as a failure at 70000: no stable period.
    check(backoff(1000, 10_000, 2.0, 60_000), "F0 R70000 F100", &["1000", "2000"]);
}

#[test]
fn give_up_is_final_and_typed() {
    let mut tracker = RestartTracker::new(rate(1, 1000, 5)).expect("valid");
    assert_eq!(tracker.given_up(), None);
    run(&mut tracker, &parse("F0 F1"));
    let reason = GiveUpReason::FailureRateExceeded {
        failures: 2,
        interval_ms: 1000,
        failures_max_per_interval: 1,
    };
    assert_eq!(tracker.given_up(), Some(reason));
    assert_eq!(
        tracker.on_failure(1_000_000),
        RestartDecision::GiveUp { reason }
    );
    assert_eq!(tracker.attempts(), 1);
    assert_eq!(
        RestartDecision::GiveUp { reason }.to_string(),
        "give up: 2 failures within 1000 ms exceed the limit 1"
    );
    assert_eq!(
        RestartDecision::Restart {
            delay_ms: 7,
            attempt: 3
        }
        .to_string(),
        "restart attempt 3 after 7 ms"
    );
}

#[test]
fn jitter_is_deterministic_per_seed_and_spreads_delays() {
    let strategy = |seed| {
        with_jitter(
            backoff(1000, 1_000_000, 2.0, 60_000),
            Jitter { factor: 0.5, seed },
        )
    };
    let steps = parse("F0 F1 F2 F3 F4 F5 F6 F7");
    let delays = |seed| {
        let mut tracker = RestartTracker::new(strategy(seed)).expect("valid");
        run(&mut tracker, &steps)
    };
    assert_eq!(delays(42), delays(42));
    assert_ne!(delays(42), delays(43));
    let plain: Vec<u64> = (0..8).map(|k| 1000 << k).collect();
    let jittered: Vec<u64> = delays(42).iter().map(restart_delay_ms).collect();
    assert_ne!(jittered, plain, "a factor of 0.5 moved no delay");
    for (delay_ms, base_ms) in jittered.iter().zip(&plain) {
        assert!(
            (base_ms / 2..=base_ms * 3 / 2).contains(delay_ms),
            "{delay_ms} from {base_ms}"
        );
    }
    // A zero factor is the same as no jitter.
    let zero = with_jitter(
        backoff(1000, 1_000_000, 2.0, 60_000),
        Jitter {
            factor: 0.0,
            seed: 9,
        },
    );
    check(zero, "F0 F1 F2", &["1000", "2000", "4000"]);
}

fn restart_delay_ms(decision: &RestartDecision) -> u64 {
    match decision {
        RestartDecision::Restart { delay_ms, .. } => *delay_ms,
        RestartDecision::GiveUp { reason } => panic!("a backoff gave up: {reason}"),
    }
}

/// Checks that `strategy` is refused with the message `expected`.
fn check_invalid(strategy: RestartStrategy, expected: &str) {
    let error = RestartTracker::new(strategy.clone()).expect_err("invalid strategy");
    assert_eq!(error.to_string(), expected, "{strategy:?}");
    assert!(!error.is_retryable());
    assert_eq!(strategy.validate(), Err(error));
}

#[test]
#[rustfmt::skip]
fn bad_configurations_are_typed_errors() {
    check_invalid(rate(3, 0, 10), "interval_ms must be positive");
    check_invalid(backoff(0, 10, 2.0, 1), "delay_ms_initial must be positive");
    check_invalid(backoff(11, 10, 2.0, 1), "delay_ms_initial 11 exceeds delay_ms_max 10");
    check_invalid(backoff(1, 10, 0.5, 1), "multiplier must be a finite number of at least 1.0, got 0.5");
    check_invalid(backoff(1, 10, -2.0, 1), "multiplier must be a finite number of at least 1.0, got -2");
    check_invalid(backoff(1, 10, f64::INFINITY, 1), "multiplier must be a finite number of at least 1.0, got inf");
    check_invalid(backoff(1, 10, 2.0, 0), "reset_after_stable_ms must be positive");
    let jitter = |factor| with_jitter(backoff(1, 10, 2.0, 1), Jitter { factor, seed: 1 });
    check_invalid(jitter(1.5), "jitter factor must be within [0.0, 1.0], got 1.5");
    check_invalid(jitter(-0.1), "jitter factor must be within [0.0, 1.0], got -0.1");
    // NaN is never equal to itself, so these two are checked by shape.
    let error = RestartTracker::new(backoff(1, 10, f64::NAN, 1)).expect_err("NaN multiplier");
    assert!(
        matches!(error, RestartConfigError::BadMultiplier { multiplier } if multiplier.is_nan())
    );
    let error = RestartTracker::new(jitter(f64::NAN)).expect_err("NaN jitter");
    assert!(matches!(error, RestartConfigError::BadJitterFactor { factor } if factor.is_nan()));
    // Edge values that are fine.
    for strategy in [
        fixed(0, 0),
        rate(0, 1, 0),
        backoff(5, 5, 1.0, 1),
        jitter(1.0),
        jitter(0.0),
    ] {
        assert_eq!(strategy.validate(), Ok(()), "{strategy:?}");
    }
}

#[test]
fn strategies_round_trip_through_postcard() {
    let strategies = [
        RestartStrategy::None,
        fixed(3, 10_000),
        RestartStrategy::default(),
        with_jitter(
            backoff(1, 10, 1.25, 7),
            Jitter {
                factor: 0.1,
                seed: u64::MAX,
            },
        ),
        rate(4, 60_000, 500),
    ];
    for strategy in strategies {
        let bytes = postcard::to_allocvec(&strategy).expect("encode");
        let decoded: RestartStrategy = postcard::from_bytes(&bytes).expect("decode");
        assert_eq!(decoded, strategy);
    }
}

// Property tests.

/// Any valid strategy, extreme values included.
fn any_strategy() -> impl Strategy<Value = RestartStrategy> {
    let jitter = proptest::option::of(
        (0.0..=1.0f64, any::<u64>()).prop_map(|(factor, seed)| Jitter { factor, seed }),
    );
    let backoff = (
        1..=u64::MAX,
        any::<u64>(),
        1.0..8.0f64,
        1..=u64::MAX,
        jitter,
    )
        .prop_map(|(initial_ms, extra_ms, multiplier, stable_ms, jitter)| {
            RestartStrategy::ExponentialBackoff {
                delay_ms_initial: initial_ms,
                delay_ms_max: initial_ms.saturating_add(extra_ms),
                multiplier,
                reset_after_stable_ms: stable_ms,
                jitter,
                restarts_max_without_checkpoint: None,
            }
        });
    prop_oneof![
        Just(RestartStrategy::None),
        (0..20u32, any::<u64>()).prop_map(|(attempts, delay_ms)| fixed(attempts, delay_ms)),
        backoff,
        (0..8u32, 1..=100_000u64, any::<u64>()).prop_map(|(max, interval_ms, delay_ms)| rate(
            max,
            interval_ms,
            delay_ms
        )),
    ]
}

/// Scripts whose times mostly advance, sometimes by a lot, sometimes back.
fn any_steps() -> impl Strategy<Value = Vec<Step>> {
    let step = (
        any::<bool>(),
        prop_oneof![0..1000u64, 0..100_000_000u64],
        any::<bool>(),
    );
    proptest::collection::vec(step, 0..40).prop_map(|raw| {
        let mut now_ms = 1_000_000_000u64;
        let to_step = |(fail, delta_ms, backwards): (bool, u64, bool)| {
            now_ms = match backwards && delta_ms < 1000 {
                true => now_ms - delta_ms,
                false => now_ms + delta_ms,
            };
            if fail {
                Step::Fail(now_ms)
            } else {
                Step::Run(now_ms)
            }
        };
        raw.into_iter().map(to_step).collect()
    })
}

/// The largest delay a strategy may ask for.
fn delay_ms_max(strategy: &RestartStrategy) -> u64 {
    match *strategy {
        RestartStrategy::None => 0,
        RestartStrategy::FixedDelay { delay_ms, .. }
        | RestartStrategy::FailureRate { delay_ms, .. } => delay_ms,
        RestartStrategy::ExponentialBackoff { delay_ms_max, .. } => delay_ms_max,
    }
}

proptest! {
    #[test]
    fn delays_stay_in_bounds_and_attempts_count_up(strategy in any_strategy(), steps in any_steps()) {
        let mut tracker = RestartTracker::new(strategy.clone()).expect("valid strategy");
        let mut attempts = 0u32;
        let mut final_reason = None;
        for decision in run(&mut tracker, &steps) {
            match (decision, final_reason) {
                (RestartDecision::Restart { delay_ms, attempt }, None) => {
                    prop_assert!(delay_ms <= delay_ms_max(&strategy), "delay {delay_ms}");
                    prop_assert_eq!(attempt, attempts + 1);
                    attempts = attempt;
                }
                (RestartDecision::GiveUp { reason }, None) => final_reason = Some(reason),
                (later, Some(reason)) => prop_assert_eq!(later, RestartDecision::GiveUp { reason }),
            }
        }
        prop_assert_eq!(tracker.attempts(), attempts);
        prop_assert_eq!(tracker.given_up(), final_reason);
    }

    #[test]
    fn backoff_without_resets_follows_the_formula(
        initial_ms in 1..10_000u64,
        max_ms in 1..10_000_000u64,
        multiplier in 1.0..4.0f64,
        failures in 1..30usize,
    ) {
        let max_ms = max_ms.max(initial_ms);
        let mut tracker = RestartTracker::new(backoff(initial_ms, max_ms, multiplier, 1)).expect("valid");
        for k in 0..failures {
            let expected_ms = (initial_ms as f64 * multiplier.powi(k as i32)).min(max_ms as f64);
            let delay_ms = restart_delay_ms(&tracker.on_failure(k as u64));
            // Repeated multiplication and powi differ in the last bits only.
            prop_assert!((delay_ms as f64 - expected_ms).abs() <= 1.0 + expected_ms * 1e-9,
                "failure {k}: {delay_ms} ms, formula {expected_ms} ms");
        }
    }

    #[test]
    fn jitter_stays_within_its_factor_of_the_plain_delay(
        strategy in any_strategy().prop_filter("jittered backoff", |strategy| {
            matches!(strategy, RestartStrategy::ExponentialBackoff { jitter: Some(_), .. })
        }),
        steps in any_steps(),
    ) {
        let RestartStrategy::ExponentialBackoff { jitter: Some(jitter), .. } = strategy else { unreachable!() };
        let mut plain_strategy = strategy.clone();
        if let RestartStrategy::ExponentialBackoff { jitter, .. } = &mut plain_strategy {
            *jitter = None;
        }
        let jittered = run(&mut RestartTracker::new(strategy.clone()).expect("valid"), &steps);
        let plain = run(&mut RestartTracker::new(plain_strategy).expect("valid"), &steps);
        let cap_ms = delay_ms_max(&strategy) as f64;
        for (with, without) in jittered.iter().zip(&plain) {
            let (with_ms, base_ms) = (restart_delay_ms(with) as f64, restart_delay_ms(without) as f64);
            let low_ms = (base_ms * (1.0 - jitter.factor)).floor() - 1.0;
            let high_ms = ((base_ms * (1.0 + jitter.factor)).ceil() + 1.0).min(cap_ms);
            prop_assert!(low_ms <= with_ms && with_ms <= high_ms, "{with_ms} from {base_ms}");
        }
    }

    #[test]
    fn the_no_progress_rule_matches_a_count_of_restarts_since_progress(
        restarts_max in 0..6u32,
        advanced in proptest::collection::vec(any::<bool>(), 0..40),
    ) {
        let mut tracker = RestartTracker::new(limit(Some(restarts_max))).expect("valid");
        // The model: restarts since the last failure whose run advanced.
        let mut without_progress = 0u32;
        let mut gave_up = false;
        for (k, &advanced) in advanced.iter().enumerate() {
            if advanced {
                without_progress = 0;
            }
            gave_up |= without_progress >= restarts_max;
            let decision = tracker.on_failure_at(k as u64 * 10, positions(advanced));
            prop_assert_eq!(matches!(decision, RestartDecision::GiveUp { .. }), gave_up, "failure {}", k);
            without_progress += 1;
        }
    }

    #[test]
    fn failure_rate_matches_an_unbounded_history(
        failures_max in 0..6u32,
        interval_ms in 1..2000u64,
        steps in any_steps(),
    ) {
        let mut tracker = RestartTracker::new(rate(failures_max, interval_ms, 3)).expect("valid");
        let mut history_ms: Vec<u64> = Vec::new();
        let mut latest_ms = 0;
        let mut gave_up = false;
        for step in steps {
            let Step::Fail(now_ms) = step else { continue };
            latest_ms = now_ms.max(latest_ms);
            history_ms.push(latest_ms);
            let in_window = history_ms.iter().filter(|&&time_ms| latest_ms - time_ms <= interval_ms).count();
            gave_up |= in_window as u32 > failures_max;
            let decision = tracker.on_failure(now_ms);
            prop_assert_eq!(matches!(decision, RestartDecision::GiveUp { .. }), gave_up, "{:?}", history_ms);
        }
    }
}
