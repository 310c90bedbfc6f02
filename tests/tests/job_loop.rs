//! Iterations: a loop in which every record passes a keyed operator
//! `id % 5 + 1` times before it leaves. With seeded parallelism, snapshot
//! mode (aligned, which means cyclic on a loop, or unaligned) and injected
//! failures inside the loop, every id leaves exactly once and its visit
//! count is exact: the feedback edge's in-flight records are recorded as
//! channel state and replayed on restore.
//!
//! Seeds: `SNAPFLOW_LOOP_SEEDS` (default 10) seeds from 1 on;
//! `SNAPFLOW_SEED=n` replays seed n.

use snapflow::job::{Job, JobConfig, JobError, KeyedStateHandle, RestartStrategy};
use snapflow::protocol::SnapshotMode;
use snapflow::sink::CollectHandle;
use snapflow::Snapshot;
use snapflow_tests::pipeline::{PacedSourceFactory, Pacing};
use snapflow_tests::{quiet_injected_panics, seeds, FaultKind, Faults, TestRng};

/// How often a record with this id passes the loop.
fn hops(id: u64) -> u64 {
    id % 5 + 1
}

#[derive(Snapshot, Debug, Clone, Default, PartialEq, Eq)]
struct Visits {
    count: u64,
}

/// source → hops → loop head → hop (keyed) → again (back to the head) and
/// exit → done → collect.
fn declare(
    job: &Job,
    records: u64,
    parallelism: [usize; 4],
    faults: &Faults,
) -> (CollectHandle<u64>, KeyedStateHandle<u64, Visits>) {
    let output = CollectHandle::new();
    let pacing = Pacing {
        records_per_read: 32,
    };
    let (head, feedback) = job
        .source("ids", PacedSourceFactory::new(records, pacing))
        .parallelism(parallelism[0])
        .map("hops", |id: u64| (id, hops(id)))
        .iterate("loop", 100);
    let faults = faults.clone();
    let (hopped, visits) = head
        .parallelism(parallelism[1])
        .key_by(|&(id, _): &(u64, u64)| id)
        .process_with_state(
            "hop",
            move |&id: &u64, visits: &mut Visits, (_, remaining): (u64, u64), out| {
                faults.check("hop", id * 10 + remaining)?;
                visits.count += 1;
                out.emit((id, remaining - 1));
                Ok(())
            },
        );
    let hopped = hopped.parallelism(parallelism[2]);
    hopped
        .clone()
        .filter("again", |&(_, remaining): &(u64, u64)| remaining > 0)
        .parallelism(parallelism[3])
        .close_loop(feedback);
    hopped
        .filter("exit", |&(_, remaining): &(u64, u64)| remaining == 0)
        .map("done", |(id, _): (u64, u64)| id)
        .sink("collect", output.clone());
    (output, visits)
}

fn check(seed: u64) {
    let replay = format!("seed {seed} (replay with SNAPFLOW_SEED={seed})");
    let mut rng = TestRng::new(seed);
    let records = rng.between(200, 800);
    let base = (seed % 3 + 1) as usize;
    let mut parallelism = [base; 4];
    for value in parallelism.iter_mut() {
        if rng.chance(30) {
            *value = rng.between(1, 3) as usize;
        }
    }
    let mode = if rng.chance(50) {
        SnapshotMode::Aligned
    } else {
        SnapshotMode::Unaligned
    };
    let planned: Vec<_> = (0..rng.between(0, 2))
        .map(|_| {
            let id = rng.between(0, records - 1);
            let remaining = rng.between(1, hops(id));
            let kind = if rng.chance(50) {
                FaultKind::Panic
            } else {
                FaultKind::Error
            };
            ("hop", id * 10 + remaining, kind)
        })
        .collect();
    let faults = Faults::new(planned.clone());
    let job = Job::new(
        "loop",
        JobConfig {
            checkpoint_interval_ms: Some(rng.between(3, 20)),
            mode,
            batch_size_max: rng.between(4, 32) as usize,
            max_parallelism: 16,
            arbiters: Some(2),
            default_parallelism: base,
            restart: RestartStrategy::FixedDelay {
                attempts_max: 10,
                delay_ms: 0,
            },
            ..JobConfig::default()
        },
    );
    let (output, visits) = declare(&job, records, parallelism, &faults);
    let report = job
        .run()
        .unwrap_or_else(|error| panic!("{replay}: job failed: {error}"));
    let context = format!("{replay}: {parallelism:?} {mode:?} faults {planned:?}");
    let mut committed = output.committed();
    committed.sort_unstable();
    let missing: Vec<u64> = (0..records)
        .filter(|id| committed.binary_search(id).is_err())
        .collect();
    assert!(
        missing.is_empty() && committed.len() == records as usize,
        "{context}: {} ids committed for {records}, missing {missing:?}",
        committed.len()
    );
    let visits = visits.snapshot();
    for id in 0..records {
        assert_eq!(
            visits.get(&id).map(|visits| visits.count),
            Some(hops(id)),
            "{context}: visits of {id}"
        );
    }
    assert!(report.restarts.len() <= planned.len(), "{context}");
    eprintln!(
        "{replay}: {} checkpoints, {} restarts",
        report.checkpoints.len(),
        report.restarts.len()
    );
}

#[test]
fn loops_are_exactly_once_under_failures() {
    quiet_injected_panics();
    for seed in seeds("SNAPFLOW_LOOP_SEEDS", 10) {
        check(seed);
    }
}

#[test]
fn an_unclosed_loop_is_rejected_before_start() {
    let job = Job::new("open", JobConfig::default());
    let (head, _feedback) = job
        .source(
            "ids",
            PacedSourceFactory::new(
                10,
                Pacing {
                    records_per_read: 8,
                },
            ),
        )
        .iterate("loop", 10);
    head.sink("collect", CollectHandle::new());
    let error = job.run().expect_err("rejected");
    assert!(
        matches!(error, JobError::LoopNotClosed { ref name } if name == "loop"),
        "{error}"
    );
}
