//! The pipeline the metrics and HTTP tests watch: numbers → tenths (a
//! map) → a keyed count (per tenth) → the given sink, so that it has a
//! source, a forward edge, a hash edge and a sink, each with state or
//! records to show.

use snapflow::job::Job;
use snapflow::sink::{Sink, SinkFactory};
use snapflow::source::VecSourceFactory;

/// A tenth's count so far.
#[derive(snapflow::Snapshot, Default, Clone, Debug)]
pub struct Count {
    /// Records seen for the key.
    pub seen: u64,
}

/// Declares numbers `0..records` → `tenths` → keyed `count` emitting
/// `(tenth, count so far)` → `out` on `job`.
pub fn declare<F>(job: &Job, records: u64, sink: F)
where
    F: SinkFactory + Send + Sync + 'static,
    F::Sink: Sink<Item = (u64, u64)> + 'static,
{
    job.source("numbers", VecSourceFactory::new((0..records).collect()))
        .map("tenths", |n: u64| n / 10)
        .key_by(|n: &u64| *n)
        .process("count", |key: &u64, state: &mut Count, _n: u64, out| {
            state.seen += 1;
            out.emit((*key, state.seen));
            Ok(())
        })
        .sink("out", sink);
}
