//! A watermark that goes backwards is ignored, and counted (DESIGN.md §7),
//! end to end: a source's own `WatermarkGenerator` sometimes returns a
//! value far below the one before. The job report shows the regressions
//! at the source, nothing lower travels on (the window operator counts
//! none), no record becomes late and every window fires exactly once with
//! its full count, at parallelism 1 and 2.

use std::collections::BTreeMap;

use snapflow::job::{Job, JobConfig};
use snapflow::sink::CollectHandle;
use snapflow::source::VecSourceFactory;
use snapflow::time::{WatermarkGenerator, WatermarkStrategy, Windowed, Windows};
use snapflow_tests::pipeline::{Paced, Pacing};

/// `(id, user, event time)`.
type Event = (u64, u32, u64);

const EVENTS: u64 = 3_000;
const USERS: u64 = 4;
const STEP_MS: u64 = 10;
const BOUND_MS: u64 = 50;
const WINDOW_MS: u64 = 1_000;
/// How far a glitch drops the watermark.
const GLITCH_MS: u64 = 5_000;

/// A glitch follows these records.
fn is_glitch(id: u64) -> bool {
    id % 10 == 7
}

fn events() -> Vec<Event> {
    (0..EVENTS)
        .map(|id| (id, (id % USERS) as u32, 10_000 + id * STEP_MS))
        .collect()
}

/// Bounded out-of-orderness, except that after a glitch record its
/// watermark drops by [`GLITCH_MS`] until the next record.
struct Glitchy {
    max_ts_ms: Option<u64>,
    glitch: bool,
}

impl WatermarkGenerator<Event> for Glitchy {
    fn on_event(&mut self, record: &Event, timestamp_ms: u64) {
        self.max_ts_ms = Some(self.max_ts_ms.unwrap_or(0).max(timestamp_ms));
        self.glitch = is_glitch(record.0);
    }

    fn current_watermark_ms(&self) -> Option<u64> {
        let watermark_ms = self.max_ts_ms?.checked_sub(BOUND_MS + 1)?;
        Some(match self.glitch {
            true => watermark_ms.saturating_sub(GLITCH_MS),
            false => watermark_ms,
        })
    }
}

fn check(parallelism: usize) {
    let job = Job::new(
        "regressions",
        JobConfig {
            checkpoint_interval_ms: Some(10),
            default_parallelism: parallelism,
            batch_size_max: 16,
            arbiters: Some(2),
            ..JobConfig::default()
        },
    );
    let output = CollectHandle::new();
    let strategy = WatermarkStrategy::custom(
        |event: &Event| event.2,
        || Glitchy {
            max_ts_ms: None,
            glitch: false,
        },
    );
    let source = Paced::over(
        VecSourceFactory::new(events()),
        Pacing {
            records_per_read: 8,
        },
    );
    let (windows, late) = job
        .source("events", source)
        .assign_timestamps(strategy)
        .key_by(|event: &Event| event.1)
        .window(
            Windows::tumbling(WINDOW_MS).expect("a valid size"),
            |event: &Event| event.2,
        )
        .count("window");
    windows.sink("collect", output.clone());
    let report = job.run().expect("the job runs");
    let context = format!("parallelism {parallelism}");
    let at_source = report
        .operator("events")
        .expect("the source reports")
        .watermark_regressions;
    let glitches = (0..EVENTS).filter(|&id| is_glitch(id)).count() as u64;
    assert!(
        at_source > 0 && at_source <= glitches,
        "{context}: {at_source} regressions counted at the source, for {glitches} glitch records \
         (a glitch shows when its record ends a read)"
    );
    let window = report
        .operator("window")
        .expect("the window operator reports");
    assert_eq!(
        window.watermark_regressions, 0,
        "{context}: a lower watermark travelled on"
    );
    assert_eq!(late.dropped(), 0, "{context}: a glitch made records late");
    let mut got: Vec<(u32, u64, u64)> = output
        .committed()
        .into_iter()
        .map(|w: Windowed<u32, u64>| (w.key, w.end_ms, w.result))
        .collect();
    got.sort_unstable();
    let mut want: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    for (_, user, ts_ms) in events() {
        *want
            .entry((user, ts_ms - ts_ms % WINDOW_MS + WINDOW_MS))
            .or_default() += 1;
    }
    let want: Vec<_> = want.into_iter().map(|((u, e), c)| (u, e, c)).collect();
    assert_eq!(got, want, "{context}: every window fires once, complete");
}

#[test]
fn a_generator_that_goes_back_is_ignored_and_counted_at_parallelism_1() {
    check(1);
}

#[test]
fn a_generator_that_goes_back_is_ignored_and_counted_at_parallelism_2() {
    check(2);
}
