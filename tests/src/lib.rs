//! The integration-test crate. Its tests live in `tests/tests/*.rs` and use
//! only the public API of `snapflow`, exactly as a user's crate would. This
//! library holds the helpers those tests share and nothing else: a small
//! seeded random generator, seed selection from the environment, and fault
//! injection that fires each planned fault exactly once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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
                let message = format!("injected fault in {stage} at record {record}");
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

/// The test pipeline: source → parse (map) → keep (filter) → count (keyed
/// process with state) → format (map) → collect (a two-phase-commit sink
/// whose commits can fail). Record `id` has key
/// `id % KEYS` and value `id * 7 % 101`; ids with `id % 5 == 3` are
/// dropped by the filter; `count` emits `(key, running count)`.
pub mod pipeline {
    use std::collections::HashMap;

    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use snapflow::job::{
        CollectHandle, CollectSink, Job, KeyedStateHandle, ReadStatus, Sink, SinkWriter, Source,
        SourceReader, VecSource,
    };
    use snapflow::runtime::BoxError;
    use snapflow::Snapshot;

    use super::Faults;

    /// How fast the source produces: at most `records_per_read` records,
    /// then a pause of `pause_ms`, so that checkpoints happen while records
    /// are in flight even for small inputs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Pacing {
        /// Records per read.
        pub records_per_read: usize,
        /// Pause after each read.
        pub pause_ms: u64,
    }

    /// A [`CollectSink`] whose commits can fail: planned faults of stage
    /// `"commit"` name the commit call (0 for the first, across every
    /// subtask and generation) that fails, after the checkpoint is durable
    /// and before the output is committed; recovery must then commit it.
    #[derive(Clone)]
    pub struct FaultyCommitSink {
        inner: CollectSink<(u64, u64)>,
        faults: Faults,
        commits: Arc<AtomicU64>,
    }

    impl Sink<(u64, u64)> for FaultyCommitSink {
        fn writer(&self, subtask: usize, parallelism: usize) -> Box<dyn SinkWriter<(u64, u64)>> {
            Box::new(FaultyCommitWriter {
                inner: self.inner.writer(subtask, parallelism),
                faults: self.faults.clone(),
                commits: Arc::clone(&self.commits),
            })
        }
    }

    struct FaultyCommitWriter {
        inner: Box<dyn SinkWriter<(u64, u64)>>,
        faults: Faults,
        commits: Arc<AtomicU64>,
    }

    impl SinkWriter<(u64, u64)> for FaultyCommitWriter {
        fn write(&mut self, batch: Vec<(u64, u64)>) -> Result<(), BoxError> {
            self.inner.write(batch)
        }

        fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, BoxError> {
            self.inner.pre_commit(checkpoint)
        }

        fn commit(&mut self, checkpoint: u64) -> Result<(), BoxError> {
            let call = self.commits.fetch_add(1, Ordering::SeqCst);
            self.faults.check("commit", call)?;
            self.inner.commit(checkpoint)
        }

        fn recover(&mut self, state: &[u8]) -> Result<(), BoxError> {
            self.inner.recover(state)
        }
    }

    /// A [`VecSource`] read at a given pace.
    pub struct PacedSource {
        inner: VecSource<u64>,
        pacing: Pacing,
    }

    impl PacedSource {
        /// The ids `0..records` at `pacing`.
        pub fn new(records: u64, pacing: Pacing) -> PacedSource {
            PacedSource {
                inner: VecSource::new((0..records).collect()),
                pacing,
            }
        }
    }

    impl Source<u64> for PacedSource {
        fn reader(&self, subtask: usize, parallelism: usize) -> Box<dyn SourceReader<u64>> {
            Box::new(PacedReader {
                inner: self.inner.reader(subtask, parallelism),
                pacing: self.pacing,
            })
        }
    }

    struct PacedReader {
        inner: Box<dyn SourceReader<u64>>,
        pacing: Pacing,
    }

    impl SourceReader<u64> for PacedReader {
        fn read(&mut self, max_records: usize, out: &mut Vec<u64>) -> Result<ReadStatus, BoxError> {
            let status = self
                .inner
                .read(max_records.min(self.pacing.records_per_read), out)?;
            Ok(match status {
                ReadStatus::Ready => ReadStatus::Idle {
                    retry_after_ms: self.pacing.pause_ms,
                },
                other => other,
            })
        }

        fn position(&self) -> Vec<u8> {
            self.inner.position()
        }

        fn seek(&mut self, position: &[u8]) -> Result<(), BoxError> {
            self.inner.seek(position)
        }
    }

    /// The number of distinct keys.
    pub const KEYS: u64 = 37;

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
        let (collect, output) = CollectSink::new();
        let sink = FaultyCommitSink {
            inner: collect,
            faults: faults.clone(),
            commits: Arc::new(AtomicU64::new(0)),
        };
        (sink, output)
    }

    /// Declares the pipeline on `job` over records `0..records`, ending in
    /// `sink`; returns the handle to `count`'s final keyed state.
    pub fn declare(
        job: &Job,
        records: u64,
        shape: Shape,
        pacing: Pacing,
        faults: &Faults,
        sink: impl Sink<(u64, u64)>,
    ) -> KeyedStateHandle<u64, KeyTotals> {
        let (parse_faults, keep_faults, count_faults, format_faults) = (
            faults.clone(),
            faults.clone(),
            faults.clone(),
            faults.clone(),
        );
        let (counted, state) = job
            .source("numbers", PacedSource::new(records, pacing))
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
}

/// An exactly-once file sink for the process-crash test: two-phase commit
/// with files. `pre_commit` writes the open transaction to
/// `pending-<subtask>-<checkpoint>` (written to a temporary name, then
/// renamed, so a file is whole or absent), `commit` renames pending files
/// to `committed-<subtask>-<checkpoint>`, and `recover` commits the pending
/// files the restored checkpoint lists and deletes every other pending
/// file of its subtask (the abort). Only `committed-*` files are output.
///
/// It survives a killed process, not a lost machine: files are not
/// fsynced, because the page cache outlives a SIGKILL.
pub mod file_sink {
    use std::fs;
    use std::io;
    use std::path::{Path, PathBuf};

    use snapflow::job::{Sink, SinkWriter};
    use snapflow::runtime::BoxError;

    /// The sink; one directory for every subtask.
    pub struct FileSink {
        dir: PathBuf,
        commit_delay_ms: u64,
    }

    impl FileSink {
        /// A sink writing into `dir` (created if missing) that waits
        /// `commit_delay_ms` before each commit, which widens the window
        /// in which a crash finds a durable checkpoint whose output is not
        /// committed yet (recovery must commit it).
        pub fn new(dir: impl Into<PathBuf>, commit_delay_ms: u64) -> io::Result<FileSink> {
            let dir = dir.into();
            fs::create_dir_all(&dir)?;
            Ok(FileSink {
                dir,
                commit_delay_ms,
            })
        }
    }

    impl Sink<(u64, u64)> for FileSink {
        fn writer(&self, subtask: usize, _parallelism: usize) -> Box<dyn SinkWriter<(u64, u64)>> {
            Box::new(FileWriter {
                dir: self.dir.clone(),
                subtask,
                open: String::new(),
                pending: Vec::new(),
                commit_delay_ms: self.commit_delay_ms,
            })
        }
    }

    struct FileWriter {
        dir: PathBuf,
        subtask: usize,
        open: String,
        /// Pre-committed checkpoints not yet committed, ascending.
        pending: Vec<u64>,
        commit_delay_ms: u64,
    }

    impl FileWriter {
        fn path(&self, state: &str, checkpoint: u64) -> PathBuf {
            self.dir
                .join(format!("{state}-{}-{checkpoint}", self.subtask))
        }

        fn commit_file(&self, checkpoint: u64) -> io::Result<()> {
            let pending = self.path("pending", checkpoint);
            if pending.exists() {
                fs::rename(pending, self.path("committed", checkpoint))?;
            }
            Ok(())
        }
    }

    impl SinkWriter<(u64, u64)> for FileWriter {
        fn write(&mut self, batch: Vec<(u64, u64)>) -> Result<(), BoxError> {
            for (key, count) in batch {
                self.open.push_str(&format!("{key} {count}\n"));
            }
            Ok(())
        }

        fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, BoxError> {
            let temporary = self.path("writing", checkpoint);
            fs::write(&temporary, std::mem::take(&mut self.open))?;
            fs::rename(temporary, self.path("pending", checkpoint))?;
            self.pending.push(checkpoint);
            let listed: Vec<String> = self.pending.iter().map(u64::to_string).collect();
            Ok(listed.join(",").into_bytes())
        }

        fn commit(&mut self, checkpoint: u64) -> Result<(), BoxError> {
            std::thread::sleep(std::time::Duration::from_millis(self.commit_delay_ms));
            while let Some(&first) = self.pending.first() {
                if first > checkpoint {
                    break;
                }
                self.commit_file(first)?;
                self.pending.remove(0);
            }
            Ok(())
        }

        fn recover(&mut self, state: &[u8]) -> Result<(), BoxError> {
            let listed: Vec<u64> = std::str::from_utf8(state)?
                .split(',')
                .filter(|text| !text.is_empty())
                .map(str::parse)
                .collect::<Result<_, _>>()?;
            for &checkpoint in &listed {
                self.commit_file(checkpoint)?;
            }
            // Abort: pending files the checkpoint does not list were
            // written after it.
            let prefix = format!("pending-{}-", self.subtask);
            for entry in fs::read_dir(&self.dir)? {
                let name = entry?.file_name().to_string_lossy().into_owned();
                if name.starts_with(&prefix) {
                    fs::remove_file(self.dir.join(name))?;
                }
            }
            Ok(())
        }
    }

    /// Every committed record in `dir`, sorted.
    pub fn committed(dir: &Path) -> io::Result<Vec<(u64, u64)>> {
        let mut records = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if !entry
                .file_name()
                .to_string_lossy()
                .starts_with("committed-")
            {
                continue;
            }
            for line in fs::read_to_string(entry.path())?.lines() {
                let mut numbers = line.split(' ').map(str::parse::<u64>);
                if let (Some(Ok(key)), Some(Ok(count))) = (numbers.next(), numbers.next()) {
                    records.push((key, count));
                } else {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("bad line {line:?} in {}", entry.path().display()),
                    ));
                }
            }
        }
        records.sort_unstable();
        Ok(records)
    }
}
