//! The keyed count of the `keyed_count` benchmark (DESIGN.md section 5) at
//! a tiny size, through the public API only: a replayable source of N
//! records, key = i % K, a keyed per-key count emitting `(key, count)` per
//! record, and a committing sink. It checks the output is exactly-once in
//! every snapshot mode at parallelism 1 and 2: per key the committed counts
//! are exactly 1..=c with c = N/K or N/K + 1, and the final keyed state
//! agrees. It shares no code with the benchmark binary, so CI exercises the
//! benchmark's workload even though bench targets are not run by
//! `cargo test`.

use std::collections::HashMap;
use std::thread;
use std::time::Duration;

use snapflow::job::{Job, JobConfig};
use snapflow::protocol::SnapshotMode;
use snapflow::sink::CollectHandle;
use snapflow::source::VecSourceFactory;

const RECORDS: u64 = 20_003;
const KEYS: u64 = 100;
const PACE_EVERY_RECORDS: u64 = 500;

#[derive(snapflow::Snapshot, Default, Clone, Debug)]
struct Count {
    count: u64,
}

fn expected_count(key: u64) -> u64 {
    RECORDS / KEYS + u64::from(key < RECORDS % KEYS)
}

fn check(parallelism: usize, mode: SnapshotMode, interval_ms: Option<u64>) {
    let config = JobConfig {
        checkpoint_interval_ms: interval_ms,
        mode,
        default_parallelism: parallelism,
        batch_size_max: 64,
        arbiters: Some(2),
        ..JobConfig::default()
    };
    let job = Job::new("keyed-count-smoke", config);
    let output = CollectHandle::new();
    let (counts, state) = job
        .source("sequence", VecSourceFactory::new((0..RECORDS).collect()))
        // Pacing, so that periodic checkpoints (and their barriers) happen
        // while records flow; without it the job ends within milliseconds.
        .map("pace", |i: u64| {
            if i % PACE_EVERY_RECORDS == 0 {
                thread::sleep(Duration::from_millis(1));
            }
            i
        })
        .key_by(|i: &u64| i % KEYS)
        .process_with_state("count", |key: &u64, state: &mut Count, _i: u64, out| {
            state.count += 1;
            out.emit((*key, state.count));
            Ok(())
        });
    counts.sink("collect", output.clone());
    let report = job.run().expect("the job runs");
    assert!(report.restarts.is_empty(), "no failure was injected");

    let mut emitted: HashMap<u64, Vec<u64>> = HashMap::new();
    for (key, count) in output.committed() {
        emitted.entry(key).or_default().push(count);
    }
    assert_eq!(emitted.len() as u64, KEYS);
    for (key, mut counts) in emitted {
        counts.sort_unstable();
        let want: Vec<u64> = (1..=expected_count(key)).collect();
        assert_eq!(counts, want, "committed counts of key {key}");
    }
    let final_state = state.snapshot();
    assert_eq!(final_state.len() as u64, KEYS);
    for (key, count) in final_state {
        assert_eq!(count.count, expected_count(key), "final state of key {key}");
    }
    let operator = report.operator("count").expect("reported");
    assert_eq!(operator.records_in, RECORDS);
    assert_eq!(operator.records_out, RECORDS);
}

#[test]
fn aligned_at_parallelism_1() {
    check(1, SnapshotMode::Aligned, Some(5));
}

#[test]
fn aligned_at_parallelism_2() {
    check(2, SnapshotMode::Aligned, Some(5));
}

#[test]
fn unaligned_at_parallelism_2() {
    check(2, SnapshotMode::Unaligned, Some(5));
}

#[test]
fn at_least_once_at_parallelism_2() {
    check(2, SnapshotMode::AtLeastOnce, Some(5));
}

#[test]
fn checkpoints_off_at_parallelism_2() {
    check(2, SnapshotMode::Aligned, None);
}
