//! The windowed pipeline of the process-crash test: event-time sliding
//! windows over paced ids, counted per key, into a sink of `(u64, u64)`
//! rows, and its failure-free result computed directly.
//!
//! It owns the job's shape and the arithmetic of its expected output; it
//! never starts, kills or checks a process (`crash.rs` and the tests do).
//! The disorder stays below the watermark bound, so no record is ever
//! late and the result is the same at every parallelism: every window
//! fires exactly once with every record in it.

use snapflow::job::Job;
use snapflow::sink::{Sink, SinkFactory};
use snapflow::time::{WatermarkStrategy, Windowed, Windows};

use crate::pipeline::{PacedSourceFactory, Pacing};

/// The number of distinct keys.
pub const KEYS: u64 = 7;
/// Event time advances this much per id.
pub const STEP_MS: u64 = 10;
/// The watermark bound; the disorder stays below it.
pub const BOUND_MS: u64 = 50;
/// The window size.
pub const WINDOW_MS: u64 = 1_000;
/// The window slide.
pub const SLIDE_MS: u64 = 500;

/// The event time of `id`: in id order, moved back by up to 40 ms.
pub fn event_time_ms(id: u64) -> u64 {
    id * STEP_MS + 1_000 - (id * 7_919) % 40
}

/// The key of `id`.
pub fn key(id: u64) -> u64 {
    id % KEYS
}

/// One output row: the key and the window's end in one number (the key
/// times 10^9 plus the end), and the count.
pub fn row(key: u64, end_ms: u64, count: u64) -> (u64, u64) {
    (key * 1_000_000_000 + end_ms, count)
}

fn windows() -> Windows {
    Windows::sliding(WINDOW_MS, SLIDE_MS).unwrap_or_else(|error| panic!("bug: {error}"))
}

/// Declares the pipeline over ids `0..records` on `job`: source → windows
/// (counts) → rows → `sink`, every operator at `parallelism`.
pub fn declare<F>(job: &Job, records: u64, parallelism: usize, pacing: Pacing, sink: F)
where
    F: SinkFactory + Send + Sync + 'static,
    F::Sink: Sink<Item = (u64, u64)> + 'static,
{
    let (counts, _late) = job
        .source("ids", PacedSourceFactory::new(records, pacing))
        .parallelism(parallelism)
        .assign_timestamps(WatermarkStrategy::bounded_out_of_orderness(
            BOUND_MS,
            |id: &u64| event_time_ms(*id),
        ))
        .key_by(|id: &u64| key(*id))
        .window(windows(), |id: &u64| event_time_ms(*id))
        .count("window");
    counts
        .parallelism(parallelism)
        .map("rows", |window: Windowed<u64, u64>| {
            row(window.key, window.end_ms, window.result)
        })
        .parallelism(parallelism)
        .sink("windows", sink)
        .parallelism(parallelism);
}

/// The failure-free output over ids `0..records`, sorted: one row per
/// key and window that holds a record.
pub fn expected(records: u64) -> Vec<(u64, u64)> {
    let assigner = windows();
    let mut counts = std::collections::BTreeMap::new();
    for id in 0..records {
        for start_ms in assigner.starts_of(event_time_ms(id)) {
            *counts.entry((key(id), start_ms + WINDOW_MS)).or_insert(0) += 1;
        }
    }
    let mut rows: Vec<(u64, u64)> = counts
        .into_iter()
        .map(|((key, end_ms), count)| row(key, end_ms, count))
        .collect();
    rows.sort_unstable();
    rows
}
