//! The job layer's restart strategy: whether, and after how long, a failed
//! job restarts.
//!
//! This module owns only the decision, as a pure function of the failure
//! history; it never sleeps or restarts anything (the supervisor does).
//! It is a minimal stand-in: the fuller `snapflow::restart` module
//! (exponential backoff, failure rate) is written in parallel and replaces
//! it when it lands.

/// What to do when the job fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartStrategy {
    /// Never restart: the first failure fails the job.
    None,
    /// Restart at most `attempts` times, waiting `delay_ms` each time.
    FixedDelay {
        /// How many restarts are allowed in the job's life.
        attempts: u32,
        /// The wait before each restart.
        delay_ms: u64,
    },
}

impl Default for RestartStrategy {
    /// Ten restarts, 10 ms apart.
    fn default() -> Self {
        RestartStrategy::FixedDelay {
            attempts: 10,
            delay_ms: 10,
        }
    }
}

/// The decision after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RestartDecision {
    /// Restart after this long.
    RestartAfter { delay_ms: u64 },
    /// Give up: the job fails.
    GiveUp,
}

/// Counts failures against a strategy.
#[derive(Debug, Clone)]
pub(crate) struct RestartTracker {
    strategy: RestartStrategy,
    restarts: u32,
}

impl RestartTracker {
    pub(crate) fn new(strategy: RestartStrategy) -> Self {
        RestartTracker {
            strategy,
            restarts: 0,
        }
    }

    /// A failure happened: decide, and count the restart if there is one.
    pub(crate) fn on_failure(&mut self) -> RestartDecision {
        match self.strategy {
            RestartStrategy::None => RestartDecision::GiveUp,
            RestartStrategy::FixedDelay { attempts, delay_ms } => {
                if self.restarts >= attempts {
                    RestartDecision::GiveUp
                } else {
                    self.restarts += 1;
                    RestartDecision::RestartAfter { delay_ms }
                }
            }
        }
    }

    /// Restarts so far.
    pub(crate) fn restarts(&self) -> u32 {
        self.restarts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(strategy: RestartStrategy, failures: usize, expected_last: RestartDecision) {
        let mut tracker = RestartTracker::new(strategy);
        let mut last = None;
        for _ in 0..failures {
            last = Some(tracker.on_failure());
        }
        assert_eq!(last, Some(expected_last));
    }

    #[test]
    fn none_gives_up_at_once() {
        check(RestartStrategy::None, 1, RestartDecision::GiveUp);
    }

    #[test]
    fn fixed_delay_restarts_up_to_its_attempts() {
        let strategy = RestartStrategy::FixedDelay {
            attempts: 2,
            delay_ms: 5,
        };
        check(strategy, 2, RestartDecision::RestartAfter { delay_ms: 5 });
        check(strategy, 3, RestartDecision::GiveUp);
    }
}
