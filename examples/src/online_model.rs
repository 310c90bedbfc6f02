//! online_model: a streaming model per sensor, the running mean and
//! variance of its readings (Welford's algorithm). The model's parameters
//! (count, mean, sum of squared deviations) are the keyed state, so they are
//! checkpointed and restored with everything else; after crashes the model
//! must equal one computed directly over all readings.
//!
//! The graph: `readings` (paced source) → key_by sensor → `model` (keyed
//! state: Welford's parameters; emits `(sensor, count, mean)` after every
//! reading) → `estimates` (collect sink). The planned crashes panic inside
//! `model`.
//!
//! Checks: per sensor, the count is exact, the mean and variance agree
//! with a direct two-pass computation to 1e-9 (relative; with parallelism
//! above 1 the readings of one sensor arrive in a different order, which
//! changes the last bits), and the committed estimates are exactly one per
//! reading.

use std::collections::{BTreeMap, HashMap};

use std::sync::Arc;

use snapflow::job::{Job, KeyedStateHandle};
use snapflow::sink::CollectHandle;
use snapflow::Snapshot;

use crate::common::{
    check_crashes, fresh_store, positive, print_report, CommonArgs, CommonOptions, CrashPlan,
    ExampleError, ExampleOptions, PacedSource, Pacing, Rng,
};

/// The options of the online_model example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Readings in all.
    pub readings: u64,
    /// Distinct sensors.
    pub sensors: u64,
    /// Parallelism, crashes, checkpoints and pace.
    pub common: CommonOptions,
}

impl ExampleOptions for Options {
    type Args = Args;

    fn full() -> Self {
        Options {
            readings: 30_000,
            sensors: 20,
            common: CommonOptions::full(),
        }
    }

    fn smoke() -> Self {
        Options {
            readings: 1_000,
            sensors: 5,
            common: CommonOptions::smoke(),
        }
    }

    fn from_args(args: Args) -> Self {
        let defaults = Self::defaults(args.common.smoke);
        Options {
            readings: args.readings.unwrap_or(defaults.readings),
            sensors: args.sensors.unwrap_or(defaults.sensors),
            common: args.common.apply(defaults.common),
        }
    }
}

/// online_model: the running mean and variance of each sensor's readings
/// as keyed state, checked after injected crashes against a direct
/// computation (exit code 1 on a mismatch).
#[derive(Debug, clap::Parser)]
#[command(name = "online_model", args_override_self = true)]
pub struct Args {
    /// Readings in all [default: 30000, 1000 with --smoke].
    #[arg(long, value_name = "N", value_parser = positive)]
    readings: Option<u64>,
    /// Distinct sensors [default: 20, 5 with --smoke].
    #[arg(long, value_name = "N", value_parser = positive)]
    sensors: Option<u64>,
    #[command(flatten)]
    common: CommonArgs,
}

/// One reading: its position in the stream, the sensor and the value.
pub type Reading = (u64, u64, f64);

/// One committed estimate: the sensor, its readings so far and their mean.
pub type Estimate = (u64, u64, f64);

/// Welford's running mean and variance of one sensor.
#[derive(Snapshot, Debug, Clone, Default, PartialEq)]
pub struct Model {
    /// Readings seen.
    pub count: u64,
    /// Their mean.
    pub mean: f64,
    /// The sum of squared deviations from the mean.
    pub squares: f64,
}

impl Model {
    /// Adds one reading.
    pub fn update(&mut self, value: f64) {
        self.count += 1;
        let delta = value - self.mean;
        self.mean += delta / self.count as f64;
        self.squares += delta * (value - self.mean);
    }

    /// The sample variance (0 below two readings).
    pub fn variance(&self) -> f64 {
        if self.count < 2 {
            0.0
        } else {
            self.squares / (self.count - 1) as f64
        }
    }
}

/// Runs the example; `Ok` only when the models match a direct computation.
pub fn run(options: &Options) -> Result<(), ExampleError> {
    let common = &options.common;
    let readings = generate(options.readings, options.sensors);
    let crashes = CrashPlan::new(common.crashes.records(readings.len() as u64));
    let store = fresh_store(&common.checkpoint_root, "online_model")?;
    println!(
        "online_model: {} readings of {} sensors, parallelism {}, checkpoints in {}",
        readings.len(),
        options.sensors,
        common.parallelism,
        store.job_dir().display()
    );
    println!(
        "  crashes planned in `model` at input records (readings) {:?}",
        crashes.records()
    );
    let expected = direct(&readings);

    let job = Job::new(
        "online_model",
        common.job_config(Arc::new(store), crashes.planned()),
    );
    let (estimates, models) = declare(&job, readings, common.pacing(), &crashes);
    let report = common.run(job)?;
    print_report(&report);

    let models: BTreeMap<u64, Model> = models.snapshot().into_iter().collect();
    for (sensor, model) in models.iter().take(5) {
        println!(
            "  sensor {sensor}: {} readings, mean {:.4}, variance {:.4}",
            model.count,
            model.mean,
            model.variance()
        );
    }
    check_crashes(&crashes, &report)?;
    check_models(&models, &expected)?;
    check_estimates(&estimates.committed(), &expected)?;
    println!(
        "check: OK, every sensor's model equals a direct computation and one estimate per \
         reading was committed, despite {} crashes",
        report.restarts.len()
    );
    Ok(())
}

/// readings → key_by sensor → model → estimates.
fn declare(
    job: &Job,
    readings: Vec<Reading>,
    pacing: Pacing,
    crashes: &CrashPlan,
) -> (CollectHandle<Estimate>, KeyedStateHandle<u64, Model>) {
    let estimates = CollectHandle::new();
    let sink = estimates.clone();
    let crashes = crashes.clone();
    let (updates, models) = job
        .source("readings", PacedSource::new(readings, pacing))
        .key_by(|(_, sensor, _): &Reading| *sensor)
        .process_with_state(
            "model",
            move |sensor: &u64, model: &mut Model, (position, _, value): Reading, out| {
                crashes.check(position);
                model.update(value);
                out.emit((*sensor, model.count, model.mean));
                Ok(())
            },
        );
    updates.sink("estimates", sink);
    (estimates, models)
}

/// Readings of sensors with different means and spreads.
fn generate(readings: u64, sensors: u64) -> Vec<Reading> {
    let mut rng = Rng::new(7);
    (0..readings)
        .map(|position| {
            let sensor = rng.below(sensors);
            let centre = 10.0 * sensor as f64;
            let spread = 1.0 + sensor as f64 / 2.0;
            // The sum of three uniforms is roughly bell-shaped.
            let noise = rng.unit() + rng.unit() + rng.unit() - 1.5;
            (position, sensor, centre + spread * noise)
        })
        .collect()
}

/// (count, mean, variance) per sensor, by the two-pass textbook formula.
fn direct(readings: &[Reading]) -> BTreeMap<u64, (u64, f64, f64)> {
    let mut values: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for (_, sensor, value) in readings {
        values.entry(*sensor).or_default().push(*value);
    }
    values
        .into_iter()
        .map(|(sensor, values)| {
            let count = values.len() as f64;
            let mean = values.iter().sum::<f64>() / count;
            let squares: f64 = values.iter().map(|value| (value - mean).powi(2)).sum();
            let variance = if values.len() < 2 {
                0.0
            } else {
                squares / (count - 1.0)
            };
            (sensor, (values.len() as u64, mean, variance))
        })
        .collect()
}

fn close(actual: f64, expected: f64) -> bool {
    (actual - expected).abs() <= 1e-9 * expected.abs().max(1.0)
}

fn check_models(
    models: &BTreeMap<u64, Model>,
    expected: &BTreeMap<u64, (u64, f64, f64)>,
) -> Result<(), ExampleError> {
    if models.len() != expected.len() {
        return Err(ExampleError::Mismatch(format!(
            "{} sensors have a model, expected {}",
            models.len(),
            expected.len()
        )));
    }
    for (sensor, &(count, mean, variance)) in expected {
        let Some(model) = models.get(sensor) else {
            return Err(ExampleError::Mismatch(format!(
                "sensor {sensor} has no model"
            )));
        };
        if model.count != count || !close(model.mean, mean) || !close(model.variance(), variance) {
            return Err(ExampleError::Mismatch(format!(
                "sensor {sensor}: model ({}, {}, {}) but directly ({count}, {mean}, {variance})",
                model.count,
                model.mean,
                model.variance()
            )));
        }
    }
    Ok(())
}

/// One committed estimate per reading: counts exactly `1..=count` per sensor.
fn check_estimates(
    estimates: &[Estimate],
    expected: &BTreeMap<u64, (u64, f64, f64)>,
) -> Result<(), ExampleError> {
    let mut counts: HashMap<u64, Vec<u64>> = HashMap::new();
    for (sensor, count, _) in estimates {
        counts.entry(*sensor).or_default().push(*count);
    }
    for (sensor, &(count, _, _)) in expected {
        let mut committed = counts.remove(sensor).unwrap_or_default();
        committed.sort_unstable();
        if !committed.iter().copied().eq(1..=count) {
            return Err(ExampleError::Mismatch(format!(
                "sensor {sensor}: {} estimates committed, not exactly one per reading 1..={count}",
                committed.len()
            )));
        }
    }
    if let Some(sensor) = counts.keys().next() {
        return Err(ExampleError::Mismatch(format!(
            "estimates were committed for unknown sensor {sensor}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn welford_matches_the_textbook_formula() {
        let readings = generate(2_000, 3);
        let expected = direct(&readings);
        let mut models: BTreeMap<u64, Model> = BTreeMap::new();
        for (_, sensor, value) in &readings {
            models.entry(*sensor).or_default().update(*value);
        }
        assert!(check_models(&models, &expected).is_ok());
    }

    #[test]
    fn a_model_that_missed_a_reading_is_a_mismatch() {
        let readings = generate(200, 2);
        let expected = direct(&readings);
        let mut models: BTreeMap<u64, Model> = BTreeMap::new();
        for (_, sensor, value) in readings.iter().skip(1) {
            models.entry(*sensor).or_default().update(*value);
        }
        assert!(check_models(&models, &expected).is_err());
    }

    #[test]
    fn a_missing_estimate_is_a_mismatch() {
        let expected: BTreeMap<u64, (u64, f64, f64)> = [(0, (2, 1.0, 0.0))].into();
        assert!(check_estimates(&[(0, 1, 1.0), (0, 2, 1.0)], &expected).is_ok());
        assert!(check_estimates(&[(0, 2, 1.0)], &expected).is_err());
    }
}
