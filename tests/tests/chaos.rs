//! Exactly-once chaos: the six-operator pipeline with keyed state (see
//! `snapflow_tests::pipeline`) runs with seeded random parallelism (1 to 3
//! per operator), snapshot mode (aligned or unaligned), batch size,
//! checkpoint interval, source pace, keyed-state layout (flat, copy-on-write
//! from the start, switching to copy-on-write after a few keys, or the
//! spilling backend with two keys per subtask in memory: a quarter of the
//! seeds each, by `seed / 3 % 4` so that it varies apart from the
//! parallelism) and one to three faults (a panic or an
//! error in a random operator on a random record, or in the sink's commit
//! after a checkpoint became durable; each fires once). The
//! committed sink output and the final keyed state must equal the
//! failure-free result exactly.
//!
//! At-least-once mode runs the same chaos with a weaker oracle: nothing is
//! lost (every expected output is committed, every key's count is at least
//! the exact one); duplicates are allowed.
//!
//! Seeds: `SNAPFLOW_CHAOS_SEEDS` (default 200, what CI runs) seeds from 1 on, for each
//! test; `SNAPFLOW_SEED=n` replays seed n. A failing run names its seed.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use snapflow::job::{Job, JobConfig, KeyedBackend, RestartStrategy};
use snapflow::protocol::SnapshotMode;
use snapflow_tests::pipeline::{declare, expected, faulty_collect, kept, output_id, Pacing, KEYS};
use snapflow_tests::{quiet_injected_panics, seeds, FaultKind, Faults, TestRng};

const STAGES: [&str; 5] = ["parse", "keep", "count", "format", "commit"];

/// Which oracle a run is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guarantee {
    ExactlyOnce,
    AtLeastOnce,
}

/// What one seed chose, printed with a failure.
#[derive(Debug)]
struct Plan {
    records: u64,
    shape: [usize; 6],
    mode: SnapshotMode,
    interval_ms: u64,
    batch_size_max: usize,
    pacing: Pacing,
    faults: Vec<(&'static str, u64, FaultKind)>,
    layout: Layout,
}

/// Where the keyed operators keep their state.
#[derive(Debug, Clone, Copy)]
enum Layout {
    /// The in-memory backend with this
    /// `JobConfig::copy_on_write_threshold_keys`.
    Memory { copy_on_write_threshold_keys: usize },
    /// `KeyedBackend::Spilling` with this budget per subtask, in a
    /// temporary directory of the run's own.
    Spilling { memory_entries: usize },
}

fn plan(seed: u64, guarantee: Guarantee) -> Plan {
    let mut rng = TestRng::new(seed);
    let records = rng.between(400, 1_500);
    // Seeds cycle the default parallelism 1, 2, 3; operators vary around it.
    let base = (seed % 3 + 1) as usize;
    let mut shape = [base; 6];
    for parallelism in shape.iter_mut() {
        if rng.chance(30) {
            *parallelism = rng.between(1, 3) as usize;
        }
    }
    let mode = match guarantee {
        Guarantee::AtLeastOnce => SnapshotMode::AtLeastOnce,
        Guarantee::ExactlyOnce if rng.chance(50) => SnapshotMode::Aligned,
        Guarantee::ExactlyOnce => SnapshotMode::Unaligned,
    };
    let mut faults: Vec<(&'static str, u64, FaultKind)> = Vec::new();
    for _ in 0..rng.between(1, 3) {
        let (stage, record, kind) = fault(&mut rng, records, shape[5]);
        // Two faults on the same record of the same stage would fire once.
        if !faults.iter().any(|&(s, r, _)| (s, r) == (stage, record)) {
            faults.push((stage, record, kind));
        }
    }
    Plan {
        records,
        shape,
        mode,
        interval_ms: rng.between(2, 25),
        batch_size_max: rng.between(4, 64) as usize,
        pacing: Pacing {
            records_per_read: rng.between(16, 64) as usize,
        },
        faults,
        // From the seed, not the generator, so that every other choice of
        // a seed stays what it was before this one existed.
        layout: match seed / 3 % 4 {
            0 => Layout::Memory {
                copy_on_write_threshold_keys: JobConfig::default().copy_on_write_threshold_keys,
            },
            1 => Layout::Memory {
                copy_on_write_threshold_keys: 0,
            },
            2 => Layout::Memory {
                copy_on_write_threshold_keys: 5,
            },
            _ => Layout::Spilling { memory_entries: 2 },
        },
    }
}

/// A fault on a record the stage really sees.
fn fault(rng: &mut TestRng, records: u64, sinks: usize) -> (&'static str, u64, FaultKind) {
    let stage = STAGES[rng.between(0, 4) as usize];
    let kind = if rng.chance(50) {
        FaultKind::Panic
    } else {
        FaultKind::Error
    };
    let mut id = rng.between(0, records - 1);
    while !kept(id) {
        id = (id + 1) % records;
    }
    let record = match stage {
        // The n-th sink commit; every run commits at least once per sink
        // subtask (the final checkpoint).
        "commit" => rng.between(0, sinks as u64 - 1),
        // `format` sees (key, running count); pick the output of `id`.
        "format" => {
            let count = (0..=id)
                .filter(|&n| kept(n) && n % KEYS == id % KEYS)
                .count();
            output_id(id % KEYS, count as u64)
        }
        _ => id,
    };
    (stage, record, kind)
}

/// Completed checkpoints, restarts and total recovery time of one run.
type Summary = (usize, usize, u64);

/// Runs one seed; `Err` describes the divergence.
fn run(seed: u64, guarantee: Guarantee) -> Result<Summary, String> {
    let plan = plan(seed, guarantee);
    let faults = Faults::new(plan.faults.clone());
    let work = tempfile::tempdir().map_err(|error| format!("no temporary directory: {error}"))?;
    let (keyed_backend, copy_on_write_threshold_keys) = match plan.layout {
        Layout::Memory {
            copy_on_write_threshold_keys,
        } => (KeyedBackend::Memory, copy_on_write_threshold_keys),
        Layout::Spilling { memory_entries } => (
            KeyedBackend::Spilling {
                dir: work.path().to_path_buf(),
                memory_entries,
            },
            JobConfig::default().copy_on_write_threshold_keys,
        ),
    };
    let job = Job::new(
        "chaos",
        JobConfig {
            checkpoint_interval_ms: Some(plan.interval_ms),
            mode: plan.mode,
            batch_size_max: plan.batch_size_max,
            max_parallelism: 16,
            arbiters: Some(2),
            copy_on_write_threshold_keys,
            keyed_backend,
            restart: RestartStrategy::FixedDelay {
                attempts_max: 10,
                delay_ms: 0,
            },
            ..JobConfig::default()
        },
    );
    let (sink, output) = faulty_collect(&faults);
    let state = declare(&job, plan.records, plan.shape, plan.pacing, &faults, sink);
    let report = job
        .run()
        .map_err(|error| format!("job failed: {error}; {plan:?}"))?;
    let (expected_output, expected_state) = expected(plan.records);
    let mut committed = output.committed();
    committed.sort_unstable();
    let state = state.snapshot();
    match guarantee {
        Guarantee::ExactlyOnce => {
            if committed != expected_output {
                return Err(format!(
                    "committed output differs: {} records, expected {}; {plan:?}",
                    committed.len(),
                    expected_output.len()
                ));
            }
            if state != expected_state {
                return Err(format!("final keyed state differs; {plan:?}"));
            }
        }
        Guarantee::AtLeastOnce => {
            if let Some(lost) = expected_output
                .iter()
                .find(|record| committed.binary_search(record).is_err())
            {
                return Err(format!("output {lost:?} was lost; {plan:?}"));
            }
            let undercounted = expected_state
                .iter()
                .find(|(key, totals)| state.get(key).is_none_or(|seen| seen.count < totals.count));
            if let Some((key, _)) = undercounted {
                return Err(format!("key {key} lost records; {plan:?}"));
            }
        }
    }
    if faults.fired() != faults.planned() || report.restarts.is_empty() {
        return Err(format!(
            "{} of {} faults fired, {} restarts; {plan:?}",
            faults.fired(),
            faults.planned(),
            report.restarts.len()
        ));
    }
    let recovery_ms = report
        .restarts
        .iter()
        .map(|restart| restart.recovery_ms)
        .sum();
    Ok((report.checkpoints.len(), report.restarts.len(), recovery_ms))
}

fn check(guarantee: Guarantee) {
    quiet_injected_panics();
    let seeds = seeds("SNAPFLOW_CHAOS_SEEDS", 200);
    let (mut checkpoints, mut restarts, mut recovery_ms) = (0, 0, 0);
    for &seed in &seeds {
        let (sender, receiver) = mpsc::channel();
        thread::spawn(move || {
            let _ = sender.send(run(seed, guarantee));
        });
        // A hang is a failure too; the watchdog names the seed.
        let replay = format!("seed {seed} (replay with SNAPFLOW_SEED={seed})");
        match receiver.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok((completed, restarted, recovered_ms))) => {
                checkpoints += completed;
                restarts += restarted;
                recovery_ms += recovered_ms;
            }
            Ok(Err(divergence)) => panic!("{replay}: {divergence}"),
            Err(_) => panic!("{replay} did not finish in 60 s"),
        }
    }
    // A figure, not an assertion: failure report to the new generation's
    // start, averaged.
    eprintln!(
        "chaos {guarantee:?}: {} seeds, {checkpoints} checkpoints completed, {restarts} restarts, \
         mean recovery {} ms",
        seeds.len(),
        recovery_ms / restarts.max(1) as u64
    );
}

#[test]
fn chaos_runs_are_exactly_once() {
    check(Guarantee::ExactlyOnce);
}

#[test]
fn at_least_once_chaos_loses_nothing() {
    check(Guarantee::AtLeastOnce);
}
