//! The integration-test crate. Its tests live in `tests/tests/*.rs` and use
//! only the public API of `snapflow`, exactly as a user's crate would. This
//! library holds the helpers those tests share and nothing else: a small
//! seeded random generator, seed selection from the environment, and fault
//! injection that fires each planned fault exactly once (with a panic hook
//! that keeps injected panics quiet), the keyed test pipeline, and the
//! sinks and the windowed pipeline the process-crash tests run in a child
//! process, a tansu broker of a test's own on S3 storage whose topics
//! can grow (`tansu`), and a memory checkpoint store with hooks at its
//! write points (`hooked_store`).

pub mod crash;
pub mod damage;
pub mod forge;
pub mod hooked_store;
pub mod kafka_count;
pub mod logged_commits;
pub mod postgres;
pub mod s3_objects;
pub mod sampled;
pub mod servers;
pub mod shared_files;
pub mod slow_commit;
pub mod tansu;
pub mod tenths;
pub mod touch;
pub mod window_pipeline;

/// The configuration of the event-time tests: checkpoints every 5 ms into
/// `store`, small batches, two arbiters, and up to 10 restarts without
/// delay.
pub fn event_time_config(
    store: &Arc<dyn snapflow::storage::CheckpointStore>,
    parallelism: usize,
) -> snapflow::job::JobConfig {
    snapflow::job::JobConfig {
        checkpoint_interval_ms: Some(5),
        default_parallelism: parallelism,
        max_parallelism: 16,
        batch_size_max: 16,
        arbiters: Some(2),
        store: Some(Arc::clone(store)),
        restart: snapflow::job::RestartStrategy::FixedDelay {
            attempts_max: 10,
            delay_ms: 0,
        },
        ..snapflow::job::JobConfig::default()
    }
}

use std::panic;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};

/// A tiny seeded generator (splitmix64): deterministic per seed, no
/// dependency, good enough to pick test parameters.
#[derive(Debug, Clone)]
pub struct TestRng {
    state: u64,
}

impl TestRng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> TestRng {
        TestRng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut mixed = self.state;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        mixed ^ (mixed >> 31)
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next_u64() % (high - low + 1)
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
}

/// The seeds a randomised test runs: `SNAPFLOW_SEED` replays exactly one;
/// otherwise `count_var` (an environment variable) or `default_count`
/// seeds from 1 on, so CI runs are reproducible.
pub fn seeds(count_var: &str, default_count: u64) -> Vec<u64> {
    if let Some(seed) = std::env::var("SNAPFLOW_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
    {
        return vec![seed];
    }
    let count = std::env::var(count_var)
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(default_count);
    (1..=count).collect()
}

/// How an injected fault shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The user function panics.
    Panic,
    /// The user function returns an error (where it can; else it panics).
    Error,
}

/// One planned fault: operator `stage` fails on the record with id
/// `record`, once.
#[derive(Debug)]
pub struct Fault {
    /// The operator's name.
    pub stage: &'static str,
    /// The record id it fails on.
    pub record: u64,
    /// Panic or error.
    pub kind: FaultKind,
    fired: AtomicBool,
}

/// The planned faults of one run, shared by every operator instance and
/// every generation; each fires at most once, so a restarted job gets past
/// it.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    faults: Arc<Vec<Fault>>,
}

impl Faults {
    /// Faults from `(stage, record, kind)` triples.
    pub fn new(planned: Vec<(&'static str, u64, FaultKind)>) -> Faults {
        Faults {
            faults: Arc::new(
                planned
                    .into_iter()
                    .map(|(stage, record, kind)| Fault {
                        stage,
                        record,
                        kind,
                        fired: AtomicBool::new(false),
                    })
                    .collect(),
            ),
        }
    }

    /// No faults.
    pub fn none() -> Faults {
        Faults::default()
    }

    /// Fails (panics or returns an error) if a fault is planned for this
    /// stage and record and has not fired yet.
    pub fn check(&self, stage: &str, record: u64) -> Result<(), String> {
        for fault in self.faults.iter() {
            if fault.stage == stage
                && fault.record == record
                && !fault.fired.swap(true, Ordering::SeqCst)
            {
                let message = format!("{INJECTED} in {stage} at record {record}");
                match fault.kind {
                    FaultKind::Panic => panic!("{message}"),
                    FaultKind::Error => return Err(message),
                }
            }
        }
        Ok(())
    }

    /// Like [`Faults::check`] for functions that cannot return an error:
    /// an error fault panics too.
    pub fn check_or_panic(&self, stage: &str, record: u64) {
        if let Err(message) = self.check(stage, record) {
            panic!("{message}");
        }
    }

    /// How many planned faults fired.
    pub fn fired(&self) -> usize {
        self.faults
            .iter()
            .filter(|fault| fault.fired.load(Ordering::SeqCst))
            .count()
    }

    /// How many faults are planned.
    pub fn planned(&self) -> usize {
        self.faults.len()
    }
}

/// How every message of an injected fault starts (see [`Faults::check`]).
const INJECTED: &str = "injected fault";

/// Keeps the panics [`Faults`] inject out of the test output; any other
/// panic still prints through the hook that was installed before. The
/// hook is installed once per test binary, however many tests call this
/// (concurrently or not), so hooks never stack.
pub fn quiet_injected_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let injected = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|message| message.starts_with(INJECTED));
            if !injected {
                default(info);
            }
        }));
    });
}

/// The test pipeline: source → parse (map) → keep (filter) → count (keyed
/// process with state) → format (map) → collect (a two-phase-commit sink
/// whose commits can fail). Record `id` has key `id % KEYS` and value
/// `id * 7 % 101`; ids with `id % 5 == 3` are dropped by the filter;
/// `count` emits `(key, running count)`.
pub mod pipeline {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    use snapflow::job::{Job, KeyedStateHandle};
    use snapflow::sink::{
        CollectHandle, CollectSink, Sink, SinkError, SinkFactory, SinkState, Visibility,
    };
    use snapflow::source::{
        Source, SourceError, SourceFactory, SourcePoll, SourcePosition, VecSourceFactory,
    };
    use snapflow::Snapshot;

    use super::Faults;

    /// The number of distinct keys.
    pub const KEYS: u64 = 37;

    /// How fast the source produces: at most `records_per_read` records
    /// per poll, and every other poll says it is idle (the runtime then
    /// waits a millisecond), so that checkpoints happen while records are
    /// in flight even for small inputs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Pacing {
        /// Records per read.
        pub records_per_read: usize,
    }

    /// Another factory's sources read at a pace. Position and seek are
    /// the inner source's own.
    pub struct Paced<F> {
        inner: F,
        pacing: Pacing,
    }

    impl<F> Paced<F> {
        /// `inner`'s sources read at `pacing`.
        pub fn over(inner: F, pacing: Pacing) -> Paced<F> {
            Paced { inner, pacing }
        }
    }

    /// The ids `0..records`, read at a pace.
    pub type PacedSourceFactory = Paced<VecSourceFactory<u64>>;

    impl PacedSourceFactory {
        /// The ids `0..records` at `pacing`.
        pub fn new(records: u64, pacing: Pacing) -> PacedSourceFactory {
            Paced::over(VecSourceFactory::new((0..records).collect()), pacing)
        }
    }

    impl<F: SourceFactory> SourceFactory for Paced<F> {
        type Source = PacedSource<F::Source>;

        fn split(&self, subtask: usize, parallelism: usize) -> Result<Self::Source, SourceError> {
            Ok(PacedSource {
                inner: self.inner.split(subtask, parallelism)?,
                pacing: self.pacing,
                rest: false,
            })
        }
    }

    /// One subtask's paced source.
    pub struct PacedSource<S> {
        inner: S,
        pacing: Pacing,
        /// The last poll produced; this one rests.
        rest: bool,
    }

    impl<S: Source> Source for PacedSource<S> {
        type Item = S::Item;

        fn poll_batch(
            &mut self,
            out: &mut Vec<S::Item>,
            max_records: usize,
        ) -> Result<SourcePoll, SourceError> {
            self.rest = !self.rest;
            if !self.rest {
                return Ok(SourcePoll::Idle);
            }
            self.inner
                .poll_batch(out, max_records.min(self.pacing.records_per_read))
        }

        fn position(&self) -> SourcePosition {
            self.inner.position()
        }

        fn seek(&mut self, position: &SourcePosition) -> Result<(), SourceError> {
            self.inner.seek(position)
        }

        fn figures(&mut self) -> snapflow::source::SourceFigures {
            self.inner.figures()
        }

        fn split_positions(&self, out: &mut Vec<snapflow::source::SplitPosition>) {
            self.inner.split_positions(out);
        }
    }

    /// A [`CollectHandle`] whose first pre-commit, across every subtask and
    /// generation, fails when the sink is armed: the failure happens inside
    /// checkpoint 1, before that subtask acks it, so checkpoint 1 is in
    /// flight when the job fails.
    #[derive(Clone)]
    pub struct FailFirstPreCommit<T> {
        output: CollectHandle<T>,
        failed: Arc<AtomicBool>,
    }

    impl<T> FailFirstPreCommit<T> {
        /// Collects into `output`; the first pre-commit fails if `armed`.
        pub fn new(output: CollectHandle<T>, armed: bool) -> Self {
            FailFirstPreCommit {
                output,
                failed: Arc::new(AtomicBool::new(!armed)),
            }
        }
    }

    /// One subtask's sink of a [`FailFirstPreCommit`].
    pub struct FailFirstWriter<T> {
        inner: CollectSink<T>,
        failed: Arc<AtomicBool>,
    }

    impl<T: Clone> SinkFactory for FailFirstPreCommit<T> {
        type Sink = FailFirstWriter<T>;

        fn create(&self, subtask: usize, parallelism: usize) -> Result<Self::Sink, SinkError> {
            Ok(FailFirstWriter {
                inner: self.output.create(subtask, parallelism)?,
                failed: Arc::clone(&self.failed),
            })
        }
    }

    impl<T: Clone> Sink for FailFirstWriter<T> {
        type Item = T;

        fn write_batch(&mut self, batch: &[T]) -> Result<(), SinkError> {
            self.inner.write_batch(batch)
        }

        fn pre_commit(&mut self, checkpoint_id: u64) -> Result<SinkState, SinkError> {
            if !self.failed.swap(true, Ordering::SeqCst) {
                return Err(SinkError::Custom {
                    message: format!("pre-commit of checkpoint {checkpoint_id} refused"),
                    // A transient refusal: the job is expected to recover.
                    retryable: true,
                });
            }
            self.inner.pre_commit(checkpoint_id)
        }

        fn commit(&mut self, checkpoint_id: u64) -> Result<(), SinkError> {
            self.inner.commit(checkpoint_id)
        }

        fn abort(&mut self) -> Result<(), SinkError> {
            self.inner.abort()
        }

        fn restore(&mut self, state: Option<&SinkState>) -> Result<(), SinkError> {
            self.inner.restore(state)
        }

        fn check_restore(
            &mut self,
            restored: Option<u64>,
            state: Option<&SinkState>,
        ) -> Result<Visibility, SinkError> {
            self.inner.check_restore(restored, state)
        }
    }

    /// A [`CollectHandle`] whose sinks' commits can fail: planned faults
    /// of stage `"commit"` name the commit call (0 for the first, across
    /// every subtask and generation) that fails, after the checkpoint is
    /// durable and before the output is committed; recovery must then
    /// commit it.
    #[derive(Clone)]
    pub struct FaultyCommitSink {
        inner: CollectHandle<(u64, u64)>,
        faults: Faults,
        commits: Arc<AtomicU64>,
    }

    impl SinkFactory for FaultyCommitSink {
        type Sink = FaultyCommitWriter;

        fn create(&self, subtask: usize, parallelism: usize) -> Result<Self::Sink, SinkError> {
            Ok(FaultyCommitWriter {
                inner: self.inner.create(subtask, parallelism)?,
                faults: self.faults.clone(),
                commits: Arc::clone(&self.commits),
            })
        }
    }

    /// One subtask's sink of a [`FaultyCommitSink`].
    pub struct FaultyCommitWriter {
        inner: CollectSink<(u64, u64)>,
        faults: Faults,
        commits: Arc<AtomicU64>,
    }

    impl Sink for FaultyCommitWriter {
        type Item = (u64, u64);

        fn write_batch(&mut self, batch: &[(u64, u64)]) -> Result<(), SinkError> {
            self.inner.write_batch(batch)
        }

        fn pre_commit(&mut self, checkpoint_id: u64) -> Result<SinkState, SinkError> {
            self.inner.pre_commit(checkpoint_id)
        }

        fn commit(&mut self, checkpoint_id: u64) -> Result<(), SinkError> {
            let call = self.commits.fetch_add(1, Ordering::SeqCst);
            self.faults
                .check("commit", call)
                .map_err(|message| SinkError::Custom {
                    message,
                    // An injected transient fault: the job must recover.
                    retryable: true,
                })?;
            self.inner.commit(checkpoint_id)
        }

        fn abort(&mut self) -> Result<(), SinkError> {
            self.inner.abort()
        }

        fn restore(&mut self, state: Option<&SinkState>) -> Result<(), SinkError> {
            self.inner.restore(state)
        }

        fn check_restore(
            &mut self,
            restored: Option<u64>,
            state: Option<&SinkState>,
        ) -> Result<Visibility, SinkError> {
            self.inner.check_restore(restored, state)
        }

        fn finish(&mut self) -> Result<(), SinkError> {
            self.inner.finish()
        }
    }

    /// The per-key state of `count`.
    #[derive(Snapshot, Debug, Clone, Default, PartialEq, Eq)]
    pub struct KeyTotals {
        /// Records seen for the key.
        pub count: u64,
        /// Sum of their values.
        pub sum: u64,
    }

    /// Parallelism of each operator of the pipeline, in order: source,
    /// parse, keep, count, format, collect.
    pub type Shape = [usize; 6];

    /// The identity of an output record, for faults in `format`.
    pub fn output_id(key: u64, count: u64) -> u64 {
        key * 1_000_000 + count
    }

    /// Whether the filter keeps record `id`.
    pub fn kept(id: u64) -> bool {
        id % 5 != 3
    }

    /// A collect sink whose commits fail as `faults` plan (stage
    /// `"commit"`), and the handle to its committed output.
    pub fn faulty_collect(faults: &Faults) -> (FaultyCommitSink, CollectHandle<(u64, u64)>) {
        let output = CollectHandle::new();
        let sink = FaultyCommitSink {
            inner: output.clone(),
            faults: faults.clone(),
            commits: Arc::new(AtomicU64::new(0)),
        };
        (sink, output)
    }

    /// Declares the pipeline on `job` over records `0..records`, ending in
    /// `sink`; returns the handle to `count`'s final keyed state.
    pub fn declare<F>(
        job: &Job,
        records: u64,
        shape: Shape,
        pacing: Pacing,
        faults: &Faults,
        sink: F,
    ) -> KeyedStateHandle<u64, KeyTotals>
    where
        F: SinkFactory + Send + Sync + 'static,
        F::Sink: Sink<Item = (u64, u64)> + 'static,
    {
        let (parse_faults, keep_faults, count_faults, format_faults) = (
            faults.clone(),
            faults.clone(),
            faults.clone(),
            faults.clone(),
        );
        let (counted, state) = job
            .source("numbers", PacedSourceFactory::new(records, pacing))
            .parallelism(shape[0])
            .map("parse", move |id: u64| {
                parse_faults.check_or_panic("parse", id);
                (id, id % KEYS, id * 7 % 101)
            })
            .parallelism(shape[1])
            .filter("keep", move |&(id, _, _): &(u64, u64, u64)| {
                keep_faults.check_or_panic("keep", id);
                kept(id)
            })
            .parallelism(shape[2])
            .key_by(|&(_, key, _): &(u64, u64, u64)| key)
            .process_with_state(
                "count",
                move |key: &u64, totals: &mut KeyTotals, (id, _, value), out| {
                    count_faults.check("count", id)?;
                    totals.count += 1;
                    totals.sum += value;
                    out.emit((*key, totals.count));
                    Ok(())
                },
            );
        counted
            .parallelism(shape[3])
            .map("format", move |(key, count): (u64, u64)| {
                format_faults.check_or_panic("format", output_id(key, count));
                (key, count)
            })
            .parallelism(shape[4])
            .sink("collect", sink)
            .parallelism(shape[5]);
        state
    }

    /// Asserts that the file sink's committed output under `output` is
    /// exactly the failure-free output of `records` records: no record
    /// lost, none twice. `context` (a replay line or a case) starts each
    /// message.
    pub fn assert_exactly_once(output: &std::path::Path, records: u64, context: &str) {
        let (want, _) = expected(records);
        let got = crate::file_sink::committed(output).expect("the committed output reads");
        assert_eq!(
            got.len(),
            want.len(),
            "{context}: committed record count differs"
        );
        assert!(got == want, "{context}: committed output differs");
    }

    /// The failure-free result, computed directly: the sorted sink output
    /// and every key's final state.
    pub fn expected(records: u64) -> (Vec<(u64, u64)>, HashMap<u64, KeyTotals>) {
        let mut state: HashMap<u64, KeyTotals> = HashMap::new();
        let mut output = Vec::new();
        for id in (0..records).filter(|&id| kept(id)) {
            let totals = state.entry(id % KEYS).or_default();
            totals.count += 1;
            totals.sum += id * 7 % 101;
            output.push((id % KEYS, totals.count));
        }
        output.sort_unstable();
        (output, state)
    }

    /// Every key's final count, sorted by key: what a table of upserts
    /// that keep the larger count holds after the failure-free run.
    pub fn final_counts(records: u64) -> Vec<(u64, u64)> {
        let mut finals: Vec<(u64, u64)> = expected(records)
            .1
            .iter()
            .map(|(key, totals)| (*key, totals.count))
            .collect();
        finals.sort_unstable();
        finals
    }
}

/// The exactly-once file sink of [`snapflow::sink`] for the process-crash
/// test, and a reader of what it committed. Files are not fsynced: the page
/// cache outlives a SIGKILL.
pub mod file_sink {
    use std::fs;
    use std::path::Path;

    use snapflow::sink::{committed_files, FileSinkFactory, SinkError, DEFAULT_PREFIX};

    /// How a `(key, count)` record becomes a line.
    pub type Encode = fn(&(u64, u64), &mut Vec<u8>);

    fn encode(record: &(u64, u64), out: &mut Vec<u8>) {
        out.extend_from_slice(format!("{} {}\n", record.0, record.1).as_bytes());
    }

    /// A file sink writing `key count` lines into `dir`, without fsync.
    pub fn factory(dir: &Path) -> Result<FileSinkFactory<(u64, u64), Encode>, SinkError> {
        Ok(FileSinkFactory::new(dir, encode as Encode)?.fsync(false))
    }

    /// Every committed record in `dir`, sorted.
    pub fn committed(dir: &Path) -> Result<Vec<(u64, u64)>, Box<dyn std::error::Error>> {
        let mut records = Vec::new();
        for file in committed_files(dir, DEFAULT_PREFIX)? {
            for line in fs::read_to_string(&file)?.lines() {
                let mut numbers = line.split(' ').map(str::parse::<u64>);
                match (numbers.next(), numbers.next()) {
                    (Some(Ok(key)), Some(Ok(count))) => records.push((key, count)),
                    _ => return Err(format!("bad line {line:?} in {}", file.display()).into()),
                }
            }
        }
        records.sort_unstable();
        Ok(records)
    }
}
