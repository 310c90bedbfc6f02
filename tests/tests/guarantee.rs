//! The guarantee a job reports: a user source that cannot seek is
//! accepted, the report says at-least-once and names that source, and
//! after an injected failure no record is lost (a source that replays from
//! its beginning on reconnect delivers duplicates instead). The same job
//! with a seekable source is exactly-once and says so. The at-least-once
//! mode and a sink that cannot roll back are named as reasons too.

use std::collections::BTreeMap;

use snapflow::job::{GuaranteeReason, Job, JobConfig, RestartStrategy};
use snapflow::protocol::SnapshotMode;
use snapflow::sink::{CollectHandle, PrintSink, SinkError, SinkFactory};
use snapflow::source::{Guarantee, Source, SourceError, SourceFactory, SourcePoll, SourcePosition};
use snapflow_tests::pipeline::{PacedSourceFactory, Pacing};
use snapflow_tests::{FaultKind, Faults};

const RECORDS: u64 = 3_000;
const KEYS: u64 = 17;
const PACING: Pacing = Pacing {
    records_per_read: 32,
};

/// A source like a message broker read without committed offsets: every
/// connection (every call of `split`, so every restart) starts again at
/// the first record, and it cannot seek to a checkpointed position.
struct ReplayFromStart;

struct ReplayReader {
    inner: <PacedSourceFactory as SourceFactory>::Source,
}

impl SourceFactory for ReplayFromStart {
    type Source = ReplayReader;

    fn split(&self, subtask: usize, parallelism: usize) -> Result<ReplayReader, SourceError> {
        let inner = PacedSourceFactory::new(RECORDS, PACING).split(subtask, parallelism)?;
        Ok(ReplayReader { inner })
    }
}

impl Source for ReplayReader {
    type Item = u64;

    fn poll_batch(
        &mut self,
        out: &mut Vec<u64>,
        max_records: usize,
    ) -> Result<SourcePoll, SourceError> {
        self.inner.poll_batch(out, max_records)
    }

    fn position(&self) -> SourcePosition {
        // Stored in checkpoints but never used: the runtime does not seek
        // a source that cannot.
        self.inner.position()
    }

    fn seek(&mut self, _position: &SourcePosition) -> Result<(), SourceError> {
        Err(SourceError::SeekUnsupported)
    }

    fn can_seek(&self) -> bool {
        false
    }
}

fn config() -> JobConfig {
    JobConfig {
        checkpoint_interval_ms: Some(5),
        default_parallelism: 2,
        batch_size_max: 16,
        arbiters: Some(2),
        restart: RestartStrategy::FixedDelay {
            attempts_max: 3,
            delay_ms: 10,
        },
        ..JobConfig::default()
    }
}

/// source → key_by id % KEYS → `count` (fails once, on record `fail_at`)
/// → collect. Returns how often each id was committed, and the report.
fn run<F>(
    config: JobConfig,
    source: F,
    fail_at: u64,
) -> (BTreeMap<u64, u64>, snapflow::job::JobReport)
where
    F: SourceFactory + Send + Sync + 'static,
    F::Source: Source<Item = u64> + 'static,
{
    let faults = Faults::new(vec![("count", fail_at, FaultKind::Panic)]);
    let job = Job::new("guarantee", config);
    let output = CollectHandle::new();
    let in_count = faults.clone();
    job.source("live", source)
        .key_by(|id: &u64| id % KEYS)
        .process("count", move |_key: &u64, seen: &mut Seen, id: u64, out| {
            in_count.check("count", id)?;
            seen.records += 1;
            out.emit(id);
            Ok(())
        })
        .sink("out", output.clone());
    let report = job.run().expect("the job recovers and finishes");
    assert_eq!(faults.fired(), 1, "the injected failure fired");
    assert_eq!(report.restarts.len(), 1);
    let mut committed = BTreeMap::new();
    for id in output.committed() {
        *committed.entry(id).or_insert(0) += 1;
    }
    (committed, report)
}

#[derive(snapflow::Snapshot, Debug, Clone, Default)]
struct Seen {
    records: u64,
}

fn check(seekable: bool) {
    let fail_at = RECORDS * 2 / 3;
    let (committed, report) = if seekable {
        run(config(), PacedSourceFactory::new(RECORDS, PACING), fail_at)
    } else {
        run(config(), ReplayFromStart, fail_at)
    };
    let ids: Vec<u64> = committed.keys().copied().collect();
    assert_eq!(ids, (0..RECORDS).collect::<Vec<_>>(), "no record is lost");
    let duplicates = committed.values().filter(|&&times| times > 1).count();
    println!("seekable {seekable}: {duplicates} ids committed more than once");
    if seekable {
        assert_eq!(duplicates, 0, "exactly once");
        assert_eq!(report.guarantee, Guarantee::ExactlyOnce);
        assert!(report.guarantee_reasons.is_empty());
    } else {
        assert_eq!(report.guarantee, Guarantee::AtLeastOnce);
        let reason = GuaranteeReason::SourceCannotSeek {
            operator: "live".to_owned(),
        };
        assert_eq!(reason.to_string(), "source `live` cannot seek");
        assert_eq!(report.guarantee_reasons, [reason]);
    }
}

#[test]
fn a_seekable_source_is_exactly_once() {
    check(true);
}

#[test]
fn a_source_that_cannot_seek_is_at_least_once_and_loses_nothing() {
    check(false);
}

#[test]
fn the_at_least_once_mode_is_a_reason() {
    let config = JobConfig {
        mode: SnapshotMode::AtLeastOnce,
        ..config()
    };
    let (committed, report) = run(config, PacedSourceFactory::new(RECORDS, PACING), 100);
    assert_eq!(committed.len() as u64, RECORDS, "no record is lost");
    assert_eq!(report.guarantee, Guarantee::AtLeastOnce);
    assert_eq!(report.guarantee_reasons, [GuaranteeReason::AtLeastOnceMode]);
}

/// Prints into nothing: a sink that cannot take output back.
struct Discard;

impl SinkFactory for Discard {
    type Sink = PrintSink<u64, std::io::Sink>;

    fn create(&self, _subtask: usize, _parallelism: usize) -> Result<Self::Sink, SinkError> {
        Ok(PrintSink::new(std::io::sink()))
    }
}

#[test]
fn a_sink_that_cannot_roll_back_is_a_reason() {
    let job = Job::new("guarantee", config());
    job.source("live", PacedSourceFactory::new(RECORDS, PACING))
        .sink("print", Discard);
    let report = job.run().expect("the job runs");
    assert_eq!(report.guarantee, Guarantee::AtLeastOnce);
    let reason = GuaranteeReason::SinkCannotRollBack {
        operator: "print".to_owned(),
    };
    assert_eq!(report.guarantee_reasons, [reason]);
}
