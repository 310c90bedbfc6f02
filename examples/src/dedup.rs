//! dedup: drops repeated events. Each event carries an id; an upstream
//! system that retries delivers some ids two or three times, a little later.
//! A keyed operator remembers, per id, whether it has passed the id on; that
//! memory is checkpointed, so after a crash a replayed duplicate is still
//! recognised and the committed output has every id exactly once.
//!
//! The graph: `events` (paced source) → key_by id → `dedup` (keyed state:
//! seen or not; emits an event the first time) → `unique` (collect sink).
//! The planned crashes panic inside `dedup`.
//!
//! Known gap: the seen-set grows with every id and is never expired; a real
//! deduplicator bounds it with a time-to-live, which the keyed state does
//! not offer yet.

use std::collections::BTreeSet;

use std::sync::Arc;

use snapflow::job::Job;
use snapflow::sink::CollectHandle;
use snapflow::Snapshot;

use crate::common::{
    check_crashes, fresh_store, positive, print_report, CommonArgs, CommonOptions, CrashPlan,
    ExampleError, ExampleOptions, PacedSource, Pacing, Rng,
};

/// The options of the dedup example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Distinct event ids.
    pub ids: u64,
    /// Parallelism, crashes, checkpoints and pace.
    pub common: CommonOptions,
}

impl ExampleOptions for Options {
    type Args = Args;

    fn full() -> Self {
        Options {
            ids: 20_000,
            common: CommonOptions::full(),
        }
    }

    fn smoke() -> Self {
        Options {
            ids: 600,
            common: CommonOptions::smoke(),
        }
    }

    fn from_args(args: Args) -> Self {
        let defaults = Self::defaults(args.common.smoke);
        Options {
            ids: args.ids.unwrap_or(defaults.ids),
            common: args.common.apply(defaults.common),
        }
    }
}

/// dedup: drops repeated events with a keyed seen-set that is
/// checkpointed, so the committed output has every id exactly once across
/// injected crashes (exit code 1 otherwise).
#[derive(Debug, clap::Parser)]
#[command(name = "dedup", args_override_self = true)]
pub struct Args {
    /// Distinct event ids [default: 20000, 600 with --smoke].
    #[arg(long, value_name = "N", value_parser = positive)]
    ids: Option<u64>,
    #[command(flatten)]
    common: CommonArgs,
}

/// One delivered event: its position in the stream, its id and a payload.
pub type Event = (u64, u64, String);

/// Per id: whether it was passed on.
#[derive(Snapshot, Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// True once the id was emitted.
    pub emitted: bool,
}

/// Runs the example; `Ok` only when every id was committed exactly once.
pub fn run(options: &Options) -> Result<(), ExampleError> {
    let common = &options.common;
    let events = deliveries(options.ids);
    let crashes = CrashPlan::new(common.crashes.records(events.len() as u64));
    let store = fresh_store(&common.checkpoint_root, "dedup")?;
    println!(
        "dedup: {} events carrying {} distinct ids, parallelism {}, checkpoints in {}",
        events.len(),
        options.ids,
        common.parallelism,
        store.job_dir().display()
    );
    println!(
        "  crashes planned in `dedup` at input records (events) {:?}",
        crashes.records()
    );

    let total = events.len();
    let job = Job::new(
        "dedup",
        common.job_config(Arc::new(store), crashes.planned()),
    );
    let unique = declare(&job, events, common.pacing(), &crashes);
    let report = common.run(job)?;
    print_report(&report);

    let committed = unique.committed();
    println!(
        "done: {total} events in, {} out, {} duplicates dropped",
        committed.len(),
        total - committed.len().min(total)
    );
    check_crashes(&crashes, &report)?;
    check_unique(&committed, options.ids)?;
    println!(
        "check: OK, every id was committed exactly once despite {} crashes",
        report.restarts.len()
    );
    Ok(())
}

/// events → key_by id → dedup → unique.
fn declare(
    job: &Job,
    events: Vec<Event>,
    pacing: Pacing,
    crashes: &CrashPlan,
) -> CollectHandle<Event> {
    let unique = CollectHandle::new();
    let sink = unique.clone();
    let crashes = crashes.clone();
    job.source("events", PacedSource::new(events, pacing))
        .key_by(|(_, id, _): &Event| *id)
        .process(
            "dedup",
            move |_id: &u64, seen: &mut Seen, event: Event, out| {
                crashes.check(event.0);
                if !seen.emitted {
                    seen.emitted = true;
                    out.emit(event);
                }
                Ok(())
            },
        )
        .sink("unique", sink);
    unique
}

/// Every id once, and a third of them again (some twice more), each repeat
/// a little after the original, as a retrying producer would send them.
fn deliveries(ids: u64) -> Vec<Event> {
    let mut rng = Rng::new(99);
    // (delivery time, id): originals at 4·id, repeats up to 400 later.
    let mut schedule: Vec<(u64, u64)> = Vec::new();
    for id in 0..ids {
        schedule.push((4 * id, id));
        let repeats = match rng.below(6) {
            0 | 1 => 1,
            2 => 2,
            _ => 0,
        };
        for _ in 0..repeats {
            schedule.push((4 * id + 1 + rng.below(400), id));
        }
    }
    schedule.sort_unstable();
    schedule
        .into_iter()
        .zip(0_u64..)
        .map(|((_, id), position)| (position, id, format!("payload of {id}")))
        .collect()
}

fn check_unique(committed: &[Event], ids: u64) -> Result<(), ExampleError> {
    let mut seen = BTreeSet::new();
    for (_, id, payload) in committed {
        if !seen.insert(*id) {
            return Err(ExampleError::Mismatch(format!(
                "id {id} was committed twice"
            )));
        }
        if *payload != format!("payload of {id}") {
            return Err(ExampleError::Mismatch(format!(
                "id {id} has a wrong payload"
            )));
        }
    }
    if seen.len() as u64 != ids || seen.last().is_some_and(|&last| last >= ids) {
        return Err(ExampleError::Mismatch(format!(
            "{} distinct ids committed, expected exactly the {ids} ids 0..{ids}",
            seen.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: u64) -> Event {
        (0, id, format!("payload of {id}"))
    }

    #[test]
    fn each_id_once_passes() {
        assert!(check_unique(&[event(1), event(0)], 2).is_ok());
    }

    #[test]
    fn a_duplicate_is_a_mismatch() {
        assert!(check_unique(&[event(0), event(1), event(1)], 2).is_err());
    }

    #[test]
    fn a_lost_id_is_a_mismatch() {
        assert!(check_unique(&[event(0)], 2).is_err());
    }

    #[test]
    fn deliveries_repeat_some_ids_after_the_original() {
        let events = deliveries(500);
        let ids: BTreeSet<u64> = events.iter().map(|(_, id, _)| *id).collect();
        assert_eq!(ids.len(), 500);
        assert!(events.len() > 600, "about a third are repeated");
        let first = |id: u64| events.iter().position(|event| event.1 == id);
        assert!(events
            .iter()
            .enumerate()
            .all(|(position, (_, id, _))| first(*id) <= Some(position)));
    }
}
