//! Restart strategies: after a job failure, whether to restart it and after
//! how long a delay, as Flink's restart strategies decide.
//!
//! This module owns the restart policy: the configuration
//! ([`RestartStrategy`]), its validation ([`RestartConfigError`]) and the
//! machine that applies it to a job's history of failures
//! ([`RestartTracker`]), whose answers are [`RestartDecision`]s, including
//! the rule that ends a job whose failures make no progress (see
//! [`RunPositions`]). It is pure:
//! time is an input (`now_ms` on every call), and it never reads a clock,
//! sleeps, spawns, schedules the restart itself or knows actix. The
//! supervisor actor (runtime layer) feeds it failures and "running again"
//! moments, waits the delay it returns, and restarts the job from the last
//! completed checkpoint; which checkpoint that is and which tasks restart
//! are not decided here.
//!
//! # Example: what the supervisor does
//!
//! ```
//! use snapflow::restart::{GiveUpReason, RestartDecision, RestartStrategy, RestartTracker};
//!
//! let strategy = RestartStrategy::FixedDelay { attempts_max: 2, delay_ms: 500 };
//! let mut tracker = RestartTracker::new(strategy)?;
//!
//! // An operator panics at t = 10 s: the supervisor stops the job and asks.
//! let decision = tracker.on_failure(10_000);
//! assert_eq!(decision, RestartDecision::Restart { delay_ms: 500, attempt: 1 });
//! // It waits 500 ms, restores the last checkpoint, and once every operator
//! // runs again it says so (this is what resets an exponential backoff).
//! tracker.on_running(10_700);
//!
//! assert_eq!(tracker.on_failure(20_000), RestartDecision::Restart { delay_ms: 500, attempt: 2 });
//! tracker.on_running(20_600);
//!
//! // The third failure exceeds the two attempts: the job fails for good,
//! // and the reason is what the supervisor reports.
//! match tracker.on_failure(30_000) {
//!     RestartDecision::Restart { delay_ms, attempt } => {
//!         unreachable!("attempt {attempt} after {delay_ms} ms")
//!     }
//!     RestartDecision::GiveUp { reason } => {
//!         assert_eq!(reason, GiveUpReason::AttemptsExhausted { attempts_max: 2 });
//!         assert_eq!(reason.to_string(), "2 restart attempts exhausted");
//!     }
//! }
//! assert_eq!(tracker.attempts(), 2);
//! # Ok::<(), snapflow::restart::RestartConfigError>(())
//! ```

use std::collections::VecDeque;
use std::fmt;

use serde::{Deserialize, Serialize};

/// How a job restarts after a failure.
///
/// The [`Default`] is Flink's default for a job with checkpointing since
/// Flink 1.19: [`RestartStrategy::ExponentialBackoff`] from 1 s, growing by
/// 1.5 per failure up to 1 min, reset after the job ran stably for 1 h.
/// Unlike Flink's, which retries for ever, it gives up after
/// [`DEFAULT_RESTARTS_MAX_WITHOUT_CHECKPOINT`] (10) restarts in a row that
/// made no progress: after each of them the job failed again before any
/// checkpoint completed at new source positions (no checkpoint at all, or
/// only checkpoints holding the very positions the run restored). A
/// record that fails its operator every time (a poison pill) fails the
/// job at the same place after every restart, so it ends the job after
/// 11 failures and about two minutes of backoff (1 + 1.5 + ... + 1.5^9 s
/// = 113 s) instead of never; the error names the failing operator, the
/// restored source positions and the last cause. To retry for ever as
/// Flink does, set `restarts_max_without_checkpoint: None`; to allow more
/// or fewer, set another number. Flink's default also has a 10 % jitter; ours has none,
/// because the jitter here is seeded and a fixed seed in a default would
/// make every job jitter alike, which defeats the purpose: give each job its
/// own [`Jitter::seed`] to spread restarts out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RestartStrategy {
    /// Never restart: the first failure fails the job.
    None,
    /// Restart at most `attempts_max` times over the job's whole life,
    /// waiting `delay_ms` before each restart. `attempts_max = 0` is allowed
    /// and behaves like [`RestartStrategy::None`] with a different reason.
    FixedDelay {
        /// How many restarts are allowed in total; the failure after the
        /// last one fails the job.
        attempts_max: u32,
        /// The wait before each restart.
        delay_ms: u64,
    },
    /// Restart forever, waiting longer after each failure: the first delay
    /// is `delay_ms_initial`, each next one `multiplier` times the previous,
    /// capped at `delay_ms_max`. A failure that comes after the job ran for
    /// at least `reset_after_stable_ms` since its last restart (see
    /// [`RestartTracker::on_running`]) starts again from `delay_ms_initial`.
    ///
    /// Unlike Flink, which measures the stable period from the previous
    /// failure, this measures it from the moment the job ran again, so the
    /// restart delay itself never counts as stable running. Flink's
    /// `attempts-before-reset-backoff` limit is not offered.
    ExponentialBackoff {
        /// The first delay, and the delay after a reset; positive.
        delay_ms_initial: u64,
        /// The cap on every delay, jitter included; at least
        /// `delay_ms_initial`.
        delay_ms_max: u64,
        /// The growth factor per failure; finite and at least 1.0.
        multiplier: f64,
        /// How long the job must run after a restart for the next failure
        /// to start again from `delay_ms_initial`; positive.
        reset_after_stable_ms: u64,
        /// Optional random spread of each delay, deterministic per seed.
        #[serde(default)]
        jitter: Option<Jitter>,
        /// How many restarts in a row that made no progress are allowed
        /// before giving up (`None`: no limit, Flink's behaviour). A
        /// restart made no progress when the job failed again before any
        /// checkpoint completed at source positions other than the ones
        /// the restart restored: no checkpoint at all, or only checkpoints
        /// at the same positions (a source that waits a while before it
        /// reads, such as a Kafka consumer joining its group, lets
        /// checkpoints complete where it restored). A poison pill (a
        /// record that fails its operator every time) fails in the same
        /// place after every restart; this ends such a job instead of
        /// retrying it for ever. Progress resets the count (see
        /// [`RestartTracker::on_failure_at`] and
        /// [`RestartTracker::on_checkpoint_completed`]). The name is kept
        /// from when only a completed checkpoint counted as progress.
        #[serde(default = "default_restarts_without_checkpoint")]
        restarts_max_without_checkpoint: Option<u32>,
    },
    /// Restart after `delay_ms` unless more than `failures_max_per_interval`
    /// failures (this one included) fall within the last `interval_ms`. A
    /// failure exactly `interval_ms` before this one still counts, as in
    /// Flink. `failures_max_per_interval = 0` fails the job on its first
    /// failure.
    FailureRate {
        /// How many failures within `interval_ms` are tolerated.
        failures_max_per_interval: u32,
        /// The length of the sliding window; positive.
        interval_ms: u64,
        /// The wait before each restart.
        delay_ms: u64,
    },
}

/// The default strategy's limit on restarts in a row that made no
/// progress (no checkpoint completed at new source positions between
/// them): 10, about two minutes of backoff from 1 s,
/// long enough to ride out an external system that is away for a moment,
/// short enough that a poison pill ends the job in minutes, not never.
pub const DEFAULT_RESTARTS_MAX_WITHOUT_CHECKPOINT: u32 = 10;

fn default_restarts_without_checkpoint() -> Option<u32> {
    Some(DEFAULT_RESTARTS_MAX_WITHOUT_CHECKPOINT)
}

impl Default for RestartStrategy {
    fn default() -> RestartStrategy {
        RestartStrategy::ExponentialBackoff {
            delay_ms_initial: 1_000,
            delay_ms_max: 60_000,
            multiplier: 1.5,
            reset_after_stable_ms: 60 * 60 * 1_000,
            jitter: None,
            restarts_max_without_checkpoint: default_restarts_without_checkpoint(),
        }
    }
}

/// A random spread of exponential backoff delays.
///
/// Each delay `d` becomes a value drawn uniformly from
/// `[d * (1 - factor), d * (1 + factor)]`, rounded to whole milliseconds
/// and capped at `delay_ms_max` (so at the cap the spread only shortens
/// delays). The draws come from a small generator seeded with `seed`, so the
/// same seed and the same failures give the same delays.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Jitter {
    /// The relative spread, within `[0.0, 1.0]`.
    pub factor: f64,
    /// The generator's seed; give each job its own.
    pub seed: u64,
}

/// A [`RestartStrategy`] that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RestartConfigError {
    /// A failure-rate `interval_ms` was 0, so no window could hold a failure.
    #[error("interval_ms must be positive")]
    ZeroInterval,
    /// An exponential `delay_ms_initial` was 0, so the backoff could never grow.
    #[error("delay_ms_initial must be positive")]
    ZeroInitialDelay,
    /// An exponential `delay_ms_initial` was above `delay_ms_max`.
    #[error("delay_ms_initial {delay_ms_initial} exceeds delay_ms_max {delay_ms_max}")]
    InitialAboveMax {
        /// The first delay given.
        delay_ms_initial: u64,
        /// The cap given.
        delay_ms_max: u64,
    },
    /// An exponential `multiplier` was below 1.0, NaN or infinite.
    #[error("multiplier must be a finite number of at least 1.0, got {multiplier}")]
    BadMultiplier {
        /// The multiplier given.
        multiplier: f64,
    },
    /// An exponential `reset_after_stable_ms` was 0, which would reset the
    /// backoff on every restart and make it a fixed delay.
    #[error("reset_after_stable_ms must be positive")]
    ZeroStablePeriod,
    /// A jitter factor was outside `[0.0, 1.0]` or NaN.
    #[error("jitter factor must be within [0.0, 1.0], got {factor}")]
    BadJitterFactor {
        /// The factor given.
        factor: f64,
    },
}

impl RestartConfigError {
    /// Whether trying again could succeed: never, the configuration is wrong.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

impl RestartStrategy {
    /// Checks every value; [`RestartTracker::new`] calls this.
    pub fn validate(&self) -> Result<(), RestartConfigError> {
        match *self {
            RestartStrategy::None | RestartStrategy::FixedDelay { .. } => Ok(()),
            RestartStrategy::FailureRate { interval_ms, .. } => {
                if interval_ms == 0 {
                    return Err(RestartConfigError::ZeroInterval);
                }
                Ok(())
            }
            RestartStrategy::ExponentialBackoff {
                delay_ms_initial,
                delay_ms_max,
                multiplier,
                reset_after_stable_ms,
                jitter,
                ..
            } => validate_backoff(
                delay_ms_initial,
                delay_ms_max,
                multiplier,
                reset_after_stable_ms,
                jitter,
            ),
        }
    }
}

fn validate_backoff(
    delay_ms_initial: u64,
    delay_ms_max: u64,
    multiplier: f64,
    reset_after_stable_ms: u64,
    jitter: Option<Jitter>,
) -> Result<(), RestartConfigError> {
    if delay_ms_initial == 0 {
        return Err(RestartConfigError::ZeroInitialDelay);
    }
    if delay_ms_initial > delay_ms_max {
        return Err(RestartConfigError::InitialAboveMax {
            delay_ms_initial,
            delay_ms_max,
        });
    }
    // Written so that NaN fails too: every comparison with NaN is false.
    if !(multiplier.is_finite() && multiplier >= 1.0) {
        return Err(RestartConfigError::BadMultiplier { multiplier });
    }
    if reset_after_stable_ms == 0 {
        return Err(RestartConfigError::ZeroStablePeriod);
    }
    if let Some(Jitter { factor, .. }) = jitter {
        if !(0.0..=1.0).contains(&factor) {
            return Err(RestartConfigError::BadJitterFactor { factor });
        }
    }
    Ok(())
}

/// What to do after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RestartDecision {
    /// Wait `delay_ms`, then restart the job from its last checkpoint.
    Restart {
        /// The wait before restarting.
        delay_ms: u64,
        /// Which restart this is over the tracker's life, from 1.
        attempt: u32,
    },
    /// Fail the job for good. Final: every later failure gives the same.
    GiveUp {
        /// Which limit was hit.
        reason: GiveUpReason,
    },
}

impl fmt::Display for RestartDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RestartDecision::Restart { delay_ms, attempt } => {
                write!(f, "restart attempt {attempt} after {delay_ms} ms")
            }
            RestartDecision::GiveUp { reason } => write!(f, "give up: {reason}"),
        }
    }
}

/// Which limit made a [`RestartTracker`] give up, with its figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum GiveUpReason {
    /// The strategy is [`RestartStrategy::None`].
    StrategyNone,
    /// A [`RestartStrategy::FixedDelay`] used all its attempts.
    AttemptsExhausted {
        /// The configured number of attempts.
        attempts_max: u32,
    },
    /// A [`RestartStrategy::ExponentialBackoff`] restarted
    /// `restarts_max_without_checkpoint` times in a row and after each
    /// restart the job failed again with no checkpoint completed at new
    /// source positions in between (see [`RunPositions`]).
    NoCheckpointBetweenFailures {
        /// The configured limit.
        restarts_max: u32,
    },
    /// A [`RestartStrategy::FailureRate`] saw too many failures in its window.
    FailureRateExceeded {
        /// The failures within the window, the last one included.
        failures: u32,
        /// The window length.
        interval_ms: u64,
        /// The configured limit.
        failures_max_per_interval: u32,
    },
}

impl fmt::Display for GiveUpReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GiveUpReason::StrategyNone => write!(f, "restart strategy is none"),
            GiveUpReason::NoCheckpointBetweenFailures { restarts_max } => write!(
                f,
                "failed again after {restarts_max} {} in a row with no checkpoint completed \
                 at new source positions between them (the same failure at the same place \
                 every time, e.g. a poison pill)",
                plural(*restarts_max, "restart", "restarts")
            ),
            GiveUpReason::AttemptsExhausted { attempts_max } => {
                let noun = plural(*attempts_max, "attempt", "attempts");
                write!(f, "{attempts_max} restart {noun} exhausted")
            }
            GiveUpReason::FailureRateExceeded {
                failures,
                interval_ms,
                failures_max_per_interval,
            } => {
                let (noun, verb) = match failures {
                    1 => ("failure", "exceeds"),
                    _ => ("failures", "exceed"),
                };
                write!(
                    f,
                    "{failures} {noun} within {interval_ms} ms {verb} the limit \
                     {failures_max_per_interval}"
                )
            }
        }
    }
}

fn plural(count: u32, one: &'static str, many: &'static str) -> &'static str {
    if count == 1 {
        one
    } else {
        many
    }
}

/// Where the run that failed started and how far it got, as fingerprints
/// of its sources' stored positions, for the no-progress rule of
/// [`RestartStrategy::ExponentialBackoff`] (`restarts_max_without_checkpoint`).
///
/// The supervisor computes both over the source subtasks of the failover
/// regions that failed: `restored` from the checkpoint the run restored
/// (a fixed value for "nothing restored"), `reached` from the newest
/// checkpoint completed since, which is what the next restart restores
/// (`reached == restored` when none completed). The run made progress
/// exactly when they differ; the tracker compares them and nothing else.
/// A position the supervisor cannot read must get a fingerprint of its
/// own (it then counts as progress), so that a job is never given up on
/// for a position nobody compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunPositions {
    /// The fingerprint of the positions the failed run restored.
    pub restored: u64,
    /// The fingerprint of the positions of the newest checkpoint completed
    /// when it failed.
    pub reached: u64,
}

impl RunPositions {
    /// Whether the run's sources got past where it restored them.
    pub fn advanced(&self) -> bool {
        self.restored != self.reached
    }
}

/// Applies a [`RestartStrategy`] to one job's failures.
///
/// Call [`on_failure`](RestartTracker::on_failure) once per job failure
/// (the supervisor merges failures that arrive while a restart is already
/// pending; they are the same failover), and
/// [`on_running`](RestartTracker::on_running) when a restarted job runs
/// again. Times must come from one monotonic clock; a time earlier than one
/// already seen is taken as that later time, so a clock that steps back
/// counts as no time passing.
///
/// Memory is bounded: a failure-rate window keeps at most
/// `failures_max_per_interval + 1` timestamps, and the other strategies keep
/// a few numbers.
#[derive(Debug, Clone)]
pub struct RestartTracker {
    strategy: RestartStrategy,
    attempts: u32,
    given_up: Option<GiveUpReason>,
    latest_ms: u64,
    /// The exponential backoff's next delay before jitter, kept unrounded so
    /// that small multipliers still grow small delays.
    backoff_ms: f64,
    /// When the job last ran again after a restart, if it has since the
    /// last failure.
    running_since_ms: Option<u64>,
    jitter_state: u64,
    /// Failure times within the failure-rate window, oldest first.
    failure_times_ms: VecDeque<u64>,
    /// Restarts decided in a row, each followed by a failure that made no
    /// progress (the last restart included, whose run has not failed yet).
    restarts_without_progress: u32,
}

impl RestartTracker {
    /// A tracker with no failures yet, or the reason `strategy` is unusable.
    pub fn new(strategy: RestartStrategy) -> Result<RestartTracker, RestartConfigError> {
        strategy.validate()?;
        let (backoff_ms, jitter_state) = match &strategy {
            RestartStrategy::ExponentialBackoff {
                delay_ms_initial,
                jitter,
                ..
            } => (*delay_ms_initial as f64, jitter.map_or(0, |j| j.seed)),
            _ => (0.0, 0),
        };
        Ok(RestartTracker {
            strategy,
            attempts: 0,
            given_up: None,
            latest_ms: 0,
            backoff_ms,
            running_since_ms: None,
            jitter_state,
            failure_times_ms: VecDeque::new(),
            restarts_without_progress: 0,
        })
    }

    /// The strategy being applied.
    pub fn strategy(&self) -> &RestartStrategy {
        &self.strategy
    }

    /// How many restarts were decided so far. It never decreases, also not
    /// when an exponential backoff resets; it stops at `u32::MAX`.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Why the tracker gave up, if it did.
    pub fn given_up(&self) -> Option<GiveUpReason> {
        self.given_up
    }

    /// The job failed at `now_ms`: restart it after a delay, or give up.
    /// Nothing is known of its sources' positions, so only
    /// [`RestartTracker::on_checkpoint_completed`] counts as progress;
    /// [`RestartTracker::on_failure_at`] is the same with positions.
    pub fn on_failure(&mut self, now_ms: u64) -> RestartDecision {
        self.failure(now_ms, false)
    }

    /// The job failed at `now_ms` after its sources got from
    /// `positions.restored` to `positions.reached`: if they differ, the
    /// restart before made progress and the count of restarts without
    /// progress starts again from zero. Then as
    /// [`RestartTracker::on_failure`].
    pub fn on_failure_at(&mut self, now_ms: u64, positions: RunPositions) -> RestartDecision {
        self.failure(now_ms, positions.advanced())
    }

    fn failure(&mut self, now_ms: u64, advanced: bool) -> RestartDecision {
        if let Some(reason) = self.given_up {
            return RestartDecision::GiveUp { reason };
        }
        if advanced {
            self.restarts_without_progress = 0;
        }
        let now_ms = self.observe(now_ms);
        match self.decide(now_ms) {
            Ok(delay_ms) => {
                self.attempts = self.attempts.saturating_add(1);
                self.restarts_without_progress = self.restarts_without_progress.saturating_add(1);
                RestartDecision::Restart {
                    delay_ms,
                    attempt: self.attempts,
                }
            }
            Err(reason) => {
                self.given_up = Some(reason);
                RestartDecision::GiveUp { reason }
            }
        }
    }

    /// The restarted job runs again at `now_ms` (every operator restored
    /// and processing). Only an exponential backoff uses this: the stable
    /// period that resets it starts here. Calling it again before the next
    /// failure keeps the first moment.
    pub fn on_running(&mut self, now_ms: u64) {
        let now_ms = self.observe(now_ms);
        self.running_since_ms.get_or_insert(now_ms);
    }

    /// A checkpoint completed whose positions are not compared: taken as
    /// progress, so the count of restarts in a row without progress starts
    /// again from zero. The supervisor does not call this: a checkpoint at
    /// the positions the run restored is no progress, so it reports
    /// positions through [`RestartTracker::on_failure_at`] instead.
    pub fn on_checkpoint_completed(&mut self) {
        self.restarts_without_progress = 0;
    }

    /// Takes `now_ms` as the latest time, never letting time go backwards.
    fn observe(&mut self, now_ms: u64) -> u64 {
        self.latest_ms = self.latest_ms.max(now_ms);
        self.latest_ms
    }

    /// The delay for a restart now, or why there is none.
    fn decide(&mut self, now_ms: u64) -> Result<u64, GiveUpReason> {
        let running_since_ms = self.running_since_ms.take();
        match self.strategy {
            RestartStrategy::None => Err(GiveUpReason::StrategyNone),
            RestartStrategy::FixedDelay {
                attempts_max,
                delay_ms,
            } => {
                if self.attempts >= attempts_max {
                    return Err(GiveUpReason::AttemptsExhausted { attempts_max });
                }
                Ok(delay_ms)
            }
            RestartStrategy::ExponentialBackoff {
                delay_ms_initial,
                delay_ms_max,
                multiplier,
                reset_after_stable_ms,
                jitter,
                restarts_max_without_checkpoint,
            } => {
                if let Some(restarts_max) = restarts_max_without_checkpoint {
                    if self.restarts_without_progress >= restarts_max {
                        return Err(GiveUpReason::NoCheckpointBetweenFailures { restarts_max });
                    }
                }
                let ran_stably = running_since_ms
                    .is_some_and(|since_ms| now_ms - since_ms >= reset_after_stable_ms);
                if ran_stably {
                    self.backoff_ms = delay_ms_initial as f64;
                }
                Ok(self.next_backoff_ms(delay_ms_max, multiplier, jitter))
            }
            RestartStrategy::FailureRate {
                failures_max_per_interval,
                interval_ms,
                delay_ms,
            } => self
                .record_failure(now_ms, failures_max_per_interval, interval_ms)
                .map(|()| delay_ms),
        }
    }

    /// Returns the current backoff (with jitter, capped) and grows the next.
    fn next_backoff_ms(
        &mut self,
        delay_ms_max: u64,
        multiplier: f64,
        jitter: Option<Jitter>,
    ) -> u64 {
        let max_ms = delay_ms_max as f64;
        let base_ms = self.backoff_ms;
        self.backoff_ms = (base_ms * multiplier).min(max_ms);
        let delay_ms = match jitter {
            Some(Jitter { factor, .. }) => base_ms * (1.0 + factor * self.next_signed_unit()),
            None => base_ms,
        };
        // The float cap can round above a large `delay_ms_max` (beyond 2^53),
        // so the integer cap is applied again after the conversion, which
        // saturates at 0 and u64::MAX.
        (delay_ms.round().clamp(0.0, max_ms) as u64).min(delay_ms_max)
    }

    /// A uniform draw from `[-1.0, 1.0)` (splitmix64; small, seedable, and
    /// good enough to spread delays; not for anything secret).
    fn next_signed_unit(&mut self) -> f64 {
        self.jitter_state = self.jitter_state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.jitter_state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
        2.0 * unit - 1.0
    }

    /// Adds a failure to the window and says whether the rate is exceeded.
    fn record_failure(
        &mut self,
        now_ms: u64,
        failures_max_per_interval: u32,
        interval_ms: u64,
    ) -> Result<(), GiveUpReason> {
        let window = &mut self.failure_times_ms;
        while window
            .front()
            .is_some_and(|&oldest_ms| now_ms - oldest_ms > interval_ms)
        {
            window.pop_front();
        }
        window.push_back(now_ms);
        // The bound: to tell whether more than the limit fall in the window
        // only the newest limit + 1 matter. Giving up is final, so this
        // rarely drops anything; it is what keeps the bound obvious.
        let window_max = (failures_max_per_interval as usize).saturating_add(1);
        while window.len() > window_max {
            window.pop_front();
        }
        let failures = u32::try_from(window.len()).unwrap_or(u32::MAX);
        if failures > failures_max_per_interval {
            return Err(GiveUpReason::FailureRateExceeded {
                failures,
                interval_ms,
                failures_max_per_interval,
            });
        }
        Ok(())
    }
}
