//! A failure that makes no progress ends the job (issue 36, finding 5): a
//! record that fails its operator every time (a poison pill), behind a
//! source that waits a moment before it reads on (as a Kafka consumer
//! joining its group does), so that checkpoints keep completing at the
//! position the job restored between the failures. The restart strategy
//! must count those restarts as no progress and end the job with an
//! error that names the operator, the restored position and the cause.
//!
//! - `the_default_strategy_ends_a_poison_pill_within_three_minutes`: the
//!   default strategy end to end (its backoff sums to 113 s).
//! - `a_region_that_keeps_flowing_does_not_hide_one_that_is_stuck`: two
//!   failover regions, one stuck on the pill while the other's source
//!   moves on: progress is judged per failed region.
//!
//! Run with `cargo test -p snapflow-tests --test no_progress`.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use snapflow::job::{Job, JobConfig, JobError, JobReport, RestartStrategy};
use snapflow::restart::DEFAULT_RESTARTS_MAX_WITHOUT_CHECKPOINT;
use snapflow::sink::CollectHandle;
use snapflow::source::{Source, SourceError, SourceFactory, SourcePoll, SourcePosition};
use snapflow_tests::quiet_injected_panics;

/// How long the source waits before it reads the pill, each run.
const PAUSE: Duration = Duration::from_millis(800);

/// Records per poll; every other poll is idle, as the paced test source.
const RECORDS_PER_READ: u64 = 16;

/// Subtask `subtask` of `parallelism` reads `subtask, subtask +
/// parallelism, ...` below `end`, pausing for [`PAUSE`] in each run
/// before it reads `pill`. Its position is the next value.
#[derive(Clone)]
struct PillFactory {
    end: u64,
    pill: u64,
}

struct PillSource {
    next: u64,
    step: u64,
    end: u64,
    pill: u64,
    /// When this run reached the pill, and whether its pause is over.
    reached: Option<Instant>,
    rest: bool,
}

impl SourceFactory for PillFactory {
    type Source = PillSource;

    fn split(&self, subtask: usize, parallelism: usize) -> Result<PillSource, SourceError> {
        Ok(PillSource {
            next: subtask as u64,
            step: parallelism as u64,
            end: self.end,
            pill: self.pill,
            reached: None,
            rest: false,
        })
    }
}

impl Source for PillSource {
    type Item = u64;

    fn poll_batch(
        &mut self,
        out: &mut Vec<u64>,
        max_records: usize,
    ) -> Result<SourcePoll, SourceError> {
        self.rest = !self.rest;
        if self.rest {
            return Ok(SourcePoll::Idle);
        }
        if self.next >= self.end {
            return Ok(SourcePoll::Ended);
        }
        if self.next == self.pill {
            let reached = *self.reached.get_or_insert_with(Instant::now);
            if reached.elapsed() < PAUSE {
                return Ok(SourcePoll::Idle);
            }
            // The pause is over: the pill, alone.
            out.push(self.next);
            self.next += self.step;
            return Ok(SourcePoll::Produced(1));
        }
        let limit = RECORDS_PER_READ.min(max_records as u64);
        let mut produced = 0;
        while produced < limit && self.next < self.end && self.next != self.pill {
            out.push(self.next);
            self.next += self.step;
            produced += 1;
        }
        Ok(SourcePoll::Produced(produced as usize))
    }

    fn position(&self) -> SourcePosition {
        SourcePosition::from_index(self.next)
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), SourceError> {
        self.next = position.to_index()?;
        Ok(())
    }
}

/// Runs `job` and returns its result, or panics after `limit`.
fn run_within(limit: Duration, job: Job) -> Result<JobReport, JobError> {
    let running = job.start()?;
    let (sender, receiver) = mpsc::channel();
    thread::spawn(move || {
        // The receiver may have given up already.
        let _ = sender.send(running.wait());
    });
    receiver
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("the job was still running after {limit:?}: it never gave up"))
}

/// The job: `numbers` (the pill source) → `parse` (fails on the pill) →
/// `collect`, at `parallelism` with forward edges (one failover region
/// per subtask), checkpoints every 20 ms into memory.
fn pill_job(
    restart: RestartStrategy,
    parallelism: usize,
    factory: PillFactory,
) -> (Job, CollectHandle<u64>) {
    let job = Job::new(
        "poison",
        JobConfig {
            checkpoint_interval_ms: Some(20),
            default_parallelism: parallelism,
            restart,
            ..JobConfig::default()
        },
    );
    let pill = factory.pill;
    let output = CollectHandle::new();
    job.source("numbers", factory)
        .map("parse", move |n: u64| {
            if n == pill {
                panic!("injected fault: poison pill at record {n}");
            }
            n
        })
        .sink("collect", output.clone());
    (job, output)
}

/// Checks the error that ends the job: restarts exhausted by the
/// no-progress rule, naming the operator, the restored position of the
/// pill's source subtask and the pill.
fn check_error(error: &JobError, position: &str) {
    match error {
        JobError::RestartsExhausted {
            restarts,
            reason,
            cause,
        } => {
            assert_eq!(
                *restarts, DEFAULT_RESTARTS_MAX_WITHOUT_CHECKPOINT,
                "{error}"
            );
            assert!(
                reason.contains("no checkpoint completed at new source positions"),
                "{error}"
            );
            assert!(reason.contains("operator `parse`"), "{error}");
            assert!(reason.contains(position), "{error}");
            assert!(cause.contains("poison pill at record"), "{error}");
        }
        other => panic!("expected RestartsExhausted, got {other}"),
    }
}

#[test]
fn the_default_strategy_ends_a_poison_pill_within_three_minutes() {
    quiet_injected_panics();
    const RECORDS: u64 = 1_000;
    const PILL: u64 = 800;
    let (job, output) = pill_job(
        RestartStrategy::default(),
        1,
        PillFactory {
            end: RECORDS,
            pill: PILL,
        },
    );
    let started = Instant::now();
    let limit = Duration::from_secs(180);
    let error = run_within(limit, job).expect_err("a poison pill cannot pass");
    let elapsed = started.elapsed();
    eprintln!("the poison pill ended the job after {elapsed:?}: {error}");
    assert!(elapsed < limit, "took {elapsed:?}");
    check_error(&error, "numbers[0] at index 800");
    // Everything before the pill was committed once, nothing after it.
    let mut committed = output.committed();
    committed.sort_unstable();
    assert_eq!(committed, (0..PILL).collect::<Vec<u64>>());
}

#[test]
fn a_region_that_keeps_flowing_does_not_hide_one_that_is_stuck() {
    quiet_injected_panics();
    // Subtask 0 reads the even numbers and meets the pill at 400; subtask
    // 1 reads the odd ones, far more than it can read before the end.
    const PILL: u64 = 400;
    let fast = RestartStrategy::ExponentialBackoff {
        delay_ms_initial: 10,
        delay_ms_max: 40,
        multiplier: 1.5,
        reset_after_stable_ms: 3_600_000,
        jitter: None,
        restarts_max_without_checkpoint: Some(DEFAULT_RESTARTS_MAX_WITHOUT_CHECKPOINT),
    };
    let (job, output) = pill_job(
        fast,
        2,
        PillFactory {
            end: 100_000_000,
            pill: PILL,
        },
    );
    let error = run_within(Duration::from_secs(60), job).expect_err("a poison pill cannot pass");
    eprintln!("{error}");
    check_error(&error, "numbers[0] at index 400");
    // Subtask 1 committed more than subtask 0 could: it kept flowing.
    let odd = output.committed().iter().filter(|n| *n % 2 == 1).count();
    assert!(odd as u64 > PILL, "only {odd} odd records committed");
}
