//! Exactly-once chaos: the six-operator pipeline with keyed state (see
//! `snapflow_tests::pipeline`) runs with seeded random parallelism (1 to 3
//! per operator), snapshot mode (aligned or unaligned), batch size,
//! checkpoint interval, source pace and one to three faults (a panic or an
//! error in a random operator on a random record, or in the sink's commit
//! after a checkpoint became durable; each fires once). The
//! committed sink output and the final keyed state must equal the
//! failure-free result exactly.
//!
//! Seeds: `SNAPFLOW_CHAOS_SEEDS` (default 20) seeds from 1 on;
//! `SNAPFLOW_SEED=n` replays seed n. A failing run names its seed.

use std::panic;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use snapflow::job::{Job, JobConfig, RestartStrategy};
use snapflow::protocol::SnapshotMode;
use snapflow_tests::pipeline::{declare, expected, kept, output_id, Pacing, KEYS};
use snapflow_tests::{seeds, FaultKind, Faults, TestRng};

const STAGES: [&str; 5] = ["parse", "keep", "count", "format", "commit"];

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
}

fn plan(seed: u64) -> Plan {
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
    let mode = if rng.chance(50) {
        SnapshotMode::Aligned
    } else {
        SnapshotMode::Unaligned
    };
    let faults = (0..rng.between(1, 3))
        .map(|_| fault(&mut rng, records, shape[5]))
        .collect();
    Plan {
        records,
        shape,
        mode,
        interval_ms: rng.between(2, 25),
        batch_size_max: rng.between(4, 64) as usize,
        pacing: Pacing {
            records_per_read: rng.between(16, 64) as usize,
            pause_ms: 1,
        },
        faults,
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

/// Runs one seed; `Err` describes the divergence.
fn run(seed: u64) -> Result<String, String> {
    let plan = plan(seed);
    let faults = Faults::new(plan.faults.clone());
    let job = Job::new(
        "chaos",
        JobConfig {
            checkpoint_interval_ms: Some(plan.interval_ms),
            mode: plan.mode,
            batch_size_max: plan.batch_size_max,
            max_parallelism: 16,
            arbiters: Some(2),
            restart: RestartStrategy::FixedDelay {
                attempts_max: 10,
                delay_ms: 0,
            },
            ..JobConfig::default()
        },
    );
    let (output, state) = declare(&job, plan.records, plan.shape, plan.pacing, &faults);
    let report = job
        .run()
        .map_err(|error| format!("job failed: {error}; {plan:?}"))?;
    let (expected_output, expected_state) = expected(plan.records);
    let mut committed = output.committed();
    committed.sort_unstable();
    if committed != expected_output {
        return Err(format!(
            "committed output differs: {} records, expected {}; {plan:?}",
            committed.len(),
            expected_output.len()
        ));
    }
    if state.snapshot() != expected_state {
        return Err(format!("final keyed state differs; {plan:?}"));
    }
    if faults.fired() != faults.planned() || report.restarts.is_empty() {
        return Err(format!(
            "{} of {} faults fired, {} restarts; {plan:?}",
            faults.fired(),
            faults.planned(),
            report.restarts.len()
        ));
    }
    Ok(format!(
        "{} checkpoints, {} restarts",
        report.checkpoints.len(),
        report.restarts.len()
    ))
}

/// Silences the panics the faults inject; other panics print as usual.
fn quiet_injected_panics() {
    let default = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        let injected = info
            .payload()
            .downcast_ref::<String>()
            .is_some_and(|message| message.contains("injected fault"));
        if !injected {
            default(info);
        }
    }));
}

#[test]
fn chaos_runs_are_exactly_once() {
    quiet_injected_panics();
    let seeds = seeds("SNAPFLOW_CHAOS_SEEDS", 20);
    let (mut checkpoints, mut restarts) = (0, 0);
    for &seed in &seeds {
        let (sender, receiver) = mpsc::channel();
        thread::spawn(move || {
            let _ = sender.send(run(seed));
        });
        // A hang is a failure too; the watchdog names the seed.
        match receiver.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(summary)) => {
                let mut numbers = summary
                    .split(|c: char| !c.is_ascii_digit())
                    .filter_map(|n| n.parse::<usize>().ok());
                checkpoints += numbers.next().unwrap_or(0);
                restarts += numbers.next().unwrap_or(0);
            }
            Ok(Err(divergence)) => {
                panic!("seed {seed} (replay with SNAPFLOW_SEED={seed}): {divergence}")
            }
            Err(_) => {
                panic!("seed {seed} (replay with SNAPFLOW_SEED={seed}) did not finish in 60 s")
            }
        }
    }
    eprintln!(
        "chaos: {} seeds, {checkpoints} checkpoints completed, {restarts} restarts",
        seeds.len()
    );
}
