//! What every example shares: command-line parsing, the crash plan that
//! injects operator panics, a paced source, the checkpoint directory, the
//! restart strategy, and the error type.
//!
//! This module owns the plumbing that is not the point of any example. It
//! never builds a job graph: each example module declares its own.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use clap::{CommandFactory, Parser};
use snapflow::job::{Job, JobConfig, JobError, JobReport, RestartStrategy};
use snapflow::metrics::Progress;
use snapflow::source::{
    Guarantee, Source, SourceError, SourceFactory, SourcePoll, SourcePosition, VecSource,
    VecSourceFactory,
};
use snapflow::storage::{CheckpointStore, FsCheckpointStore, StoreError};

/// Why an example did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ExampleError {
    /// A command-line option was wrong.
    #[error("{0}")]
    Usage(String),
    /// A file could not be read or a directory cleared.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The job could not be built or did not finish.
    #[error("job: {0}")]
    Job(#[from] JobError),
    /// The checkpoint store failed.
    #[error("checkpoint store: {0}")]
    Store(#[from] StoreError),
    /// A checkpoint's bytes could not be decoded.
    #[error("decoding a checkpoint: {0}")]
    Decode(String),
    /// The database an example writes to failed or refused.
    #[error("database: {message}")]
    Database {
        /// What failed, with the server's message.
        message: String,
        /// Whether running again could succeed (a server still starting,
        /// a lost connection).
        retryable: bool,
    },
    /// The Kafka connector refused (a missing broker or topic, bad
    /// settings).
    #[cfg(feature = "kafka")]
    #[error("kafka: {0}")]
    Kafka(#[from] snapflow::connectors::kafka::KafkaError),
    /// The job ran but its result differs from a direct computation.
    #[error("MISMATCH: {0}")]
    Mismatch(String),
    /// SIGTERM or Ctrl-C stopped the job with a savepoint before it
    /// finished, so there is no whole result to check (exit code 0).
    #[error(
        "stopped by a signal with savepoint {savepoint}; the output it covers is committed \
         (the examples start from scratch, so a new run does not resume from it)"
    )]
    Stopped {
        /// The stop savepoint's id.
        savepoint: u64,
    },
}

impl ExampleError {
    /// Whether running the example again could succeed (a transient I/O or
    /// store failure); a missing file, a usage error or a mismatch never
    /// heals by itself.
    pub fn is_retryable(&self) -> bool {
        use std::io::ErrorKind;
        match self {
            ExampleError::Io { source, .. } => !matches!(
                source.kind(),
                ErrorKind::NotFound | ErrorKind::PermissionDenied | ErrorKind::InvalidData
            ),
            ExampleError::Job(error) => error.is_retryable(),
            ExampleError::Store(error) => error.is_retryable(),
            ExampleError::Database { retryable, .. } => *retryable,
            #[cfg(feature = "kafka")]
            ExampleError::Kafka(error) => error.is_retryable(),
            ExampleError::Usage(_)
            | ExampleError::Decode(_)
            | ExampleError::Mismatch(_)
            | ExampleError::Stopped { .. } => false,
        }
    }
}

/// Runs an example's `main`: parses the arguments (clap prints `--help`
/// and exits 0, or prints a usage error and exits 2), runs, prints the
/// error if any, and returns the process exit code (0 success or a
/// graceful stop by a signal, 1 failure or mismatch).
pub fn main_with<O: ExampleOptions>(run: impl FnOnce(&O) -> Result<(), ExampleError>) -> i32 {
    crate::progress::install();
    let name = O::Args::command().get_name().to_owned();
    let options =
        O::try_parse(std::env::args().skip(1).collect()).unwrap_or_else(|error| error.exit());
    match run(&options) {
        Ok(()) => 0,
        Err(error @ ExampleError::Stopped { .. }) => {
            eprintln!("{name}: {error}");
            0
        }
        Err(error) => {
            eprintln!("{name}: {error}");
            1
        }
    }
}

/// An example's options: its two sets of defaults and its command line,
/// whose flags (its own and a flattened [`CommonArgs`]) override them.
pub trait ExampleOptions: Sized {
    /// The example's command line.
    type Args: Parser;
    /// The defaults of a full run.
    fn full() -> Self;
    /// The defaults of a smoke run (selected by `--smoke`).
    fn smoke() -> Self;
    /// The options `args` ask for: the defaults `--smoke` selects, with
    /// each flag given applied.
    fn from_args(args: Self::Args) -> Self;

    /// The smoke defaults if `smoke`, else the full ones.
    fn defaults(smoke: bool) -> Self {
        if smoke {
            Self::smoke()
        } else {
            Self::full()
        }
    }

    /// Parses a command line (without the program name). `--help` and a
    /// bad flag are clap's error, which prints itself and exits with code
    /// 0 or 2 ([`clap::Error::exit`]).
    fn try_parse(arguments: Vec<String>) -> Result<Self, clap::Error> {
        let name = Self::Args::command().get_name().to_owned();
        let args = Self::Args::try_parse_from(std::iter::once(name).chain(arguments))?;
        Ok(Self::from_args(args))
    }

    /// [`ExampleOptions::try_parse`] with clap's message as a usage error.
    fn parse(arguments: Vec<String>) -> Result<Self, ExampleError> {
        Self::try_parse(arguments).map_err(|error| ExampleError::Usage(error.to_string()))
    }
}

/// A whole number of at least 1, for a flag's value.
pub fn positive(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(value) => Ok(value),
        Err(_) => Err(format!("takes a whole number, not {text:?}")),
    }
}

/// [`positive`] as a `u32`.
pub fn positive_u32(text: &str) -> Result<u32, String> {
    u32::try_from(positive(text)?).map_err(|_| "is too large".to_owned())
}

/// [`positive`] as a `usize`.
fn positive_usize(text: &str) -> Result<usize, String> {
    usize::try_from(positive(text)?).map_err(|_| "is too large".to_owned())
}

/// A socket address for `--http`.
fn address(text: &str) -> Result<std::net::SocketAddr, String> {
    text.parse()
        .map_err(|_| "takes an address like 127.0.0.1:8081".to_owned())
}

/// The flags every example shares. Each one left out keeps the example's
/// default: its full run's, or its smoke run's with `--smoke`. Of
/// `--crash-every`, `--crashes` and `--no-crash` the last one given wins.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CommonArgs {
    /// Use the smoke run's defaults: tiny and fast, one crash, no
    /// progress lines.
    #[arg(long)]
    pub smoke: bool,
    /// Parallelism of every operator [default: 2].
    #[arg(long, value_name = "P", value_parser = positive_usize)]
    pub parallelism: Option<usize>,
    /// Crash an operator at input records N, 2N, 3N... (each once).
    #[arg(long, value_name = "N", value_parser = positive,
          overrides_with_all = ["crashes", "no_crash"])]
    pub crash_every: Option<u64>,
    /// Crash an operator at K records the seed chooses in the middle 80%
    /// of the input [default: 2, 1 with --smoke].
    #[arg(long, value_name = "K", overrides_with_all = ["crash_every", "no_crash"])]
    pub crashes: Option<u64>,
    /// The seed that chooses the records of --crashes [default: 42, 7
    /// with --smoke].
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// Inject no crash.
    #[arg(long, overrides_with_all = ["crash_every", "crashes"])]
    pub no_crash: bool,
    /// Root directory of the file checkpoint store [default:
    /// target/snapflow-checkpoints].
    #[arg(long, value_name = "PATH")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Time between periodic checkpoints [default: 200, 10 with --smoke].
    #[arg(long, value_name = "MS", value_parser = positive)]
    pub checkpoint_interval_ms: Option<u64>,
    /// Records the source reads per second, all subtasks together (the
    /// pace of a live stream) [default: 20000, 100000 with --smoke, in
    /// most examples].
    #[arg(long, value_name = "RECORDS_PER_SECOND", value_parser = positive)]
    pub rate: Option<u64>,
    /// Serve the dashboard, the JSON API and Prometheus text at this
    /// address, with the actions (savepoint, stop, cancel) enabled.
    #[arg(long, value_name = "ADDR", value_parser = address)]
    pub http: Option<std::net::SocketAddr>,
    /// Print one line of progress per second to standard error, from the
    /// job's live metrics [the default without --smoke].
    #[arg(long, overrides_with = "no_progress")]
    pub progress: bool,
    /// Print no progress lines [the default with --smoke].
    #[arg(long, overrides_with = "progress")]
    pub no_progress: bool,
}

impl CommonArgs {
    /// `defaults` with every flag given here applied.
    pub fn apply(&self, defaults: CommonOptions) -> CommonOptions {
        CommonOptions {
            parallelism: self.parallelism.unwrap_or(defaults.parallelism),
            crashes: self.crash_spec(defaults.crashes),
            checkpoint_root: self
                .checkpoint_dir
                .clone()
                .unwrap_or(defaults.checkpoint_root),
            checkpoint_interval_ms: self
                .checkpoint_interval_ms
                .unwrap_or(defaults.checkpoint_interval_ms),
            records_per_second: self.rate.unwrap_or(defaults.records_per_second),
            http: self.http.or(defaults.http),
            progress: match (self.progress, self.no_progress) {
                (true, _) => true,
                (_, true) => false,
                _ => defaults.progress,
            },
        }
    }

    /// The crashes the flags ask for: `--crashes` and `--seed` change
    /// only what they name of the random default.
    fn crash_spec(&self, default: CrashSpec) -> CrashSpec {
        if self.no_crash {
            return CrashSpec::None;
        }
        if let Some(every) = self.crash_every {
            return CrashSpec::Every(every);
        }
        match (default, self.crashes) {
            (CrashSpec::Random { count, seed }, crashes) => CrashSpec::Random {
                count: crashes.unwrap_or(count),
                seed: self.seed.unwrap_or(seed),
            },
            (_, Some(count)) => CrashSpec::Random {
                count,
                seed: self.seed.unwrap_or(42),
            },
            (default, None) => default,
        }
    }
}

/// The options every example shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommonOptions {
    /// Parallelism of every operator.
    pub parallelism: usize,
    /// Which records crash an operator.
    pub crashes: CrashSpec,
    /// Root directory of the file checkpoint store.
    pub checkpoint_root: PathBuf,
    /// Time between periodic checkpoints.
    pub checkpoint_interval_ms: u64,
    /// Records the source reads per second, all subtasks together (the pace of a live
    /// stream, so that checkpoints and crashes happen mid-stream).
    pub records_per_second: u64,
    /// Serve the dashboard, the JSON API and Prometheus text here, with
    /// the actions (savepoint, stop, cancel) enabled (`--http ADDR`).
    pub http: Option<std::net::SocketAddr>,
    /// Print one line of progress per second to standard error, read
    /// from the job's live metrics (`--progress`, `--no-progress`).
    pub progress: bool,
}

impl CommonOptions {
    /// The defaults of a full run.
    pub fn full() -> CommonOptions {
        CommonOptions {
            parallelism: 2,
            crashes: CrashSpec::Random { count: 2, seed: 42 },
            checkpoint_root: PathBuf::from("target/snapflow-checkpoints"),
            checkpoint_interval_ms: 200,
            records_per_second: 20_000,
            http: None,
            progress: true,
        }
    }

    /// The defaults of a smoke run: tiny and fast, one crash.
    pub fn smoke() -> CommonOptions {
        CommonOptions {
            parallelism: 2,
            crashes: CrashSpec::Random { count: 1, seed: 7 },
            checkpoint_root: PathBuf::from("target/snapflow-checkpoints"),
            checkpoint_interval_ms: 10,
            records_per_second: 100_000,
            http: None,
            progress: false,
        }
    }

    /// How each source subtask is paced: records per read and the pause
    /// after each, so that all subtasks together read about
    /// `records_per_second`.
    pub fn pacing(&self) -> Pacing {
        const PAUSE_MS: u64 = 5;
        let per_subtask = self.records_per_second / self.parallelism.max(1) as u64;
        Pacing {
            records_per_read: (per_subtask * PAUSE_MS / 1000).max(1) as usize,
            pause_ms: PAUSE_MS,
        }
    }

    /// The job configuration every example uses: periodic checkpoints into
    /// `store`, the parallelism, and restarts for the planned crashes.
    pub fn job_config(&self, store: Arc<dyn CheckpointStore>, planned_crashes: usize) -> JobConfig {
        JobConfig {
            checkpoint_interval_ms: Some(self.checkpoint_interval_ms),
            default_parallelism: self.parallelism,
            restart: self.restart_strategy(planned_crashes),
            store: Some(store),
            http_addr: self.http,
            http_actions: self.http.is_some(),
            ..JobConfig::default()
        }
    }

    /// Starts `job`, shows where its dashboard is (with `--http`) and its
    /// progress (with `--progress`) while it runs, and waits for it.
    /// SIGTERM and Ctrl-C stop it with a savepoint (a second one cancels
    /// it): that is [`ExampleError::Stopped`], since the output is then
    /// only what the savepoint covers.
    pub fn run(&self, job: Job) -> Result<JobReport, ExampleError> {
        let running = job.start()?;
        if let Err(error) = running.stop_on_signals() {
            eprintln!("  SIGTERM and Ctrl-C will end the job without a savepoint: {error}");
        }
        if let Some(addr) = running.http_addr() {
            println!("  dashboard: http://{addr}/ (Prometheus text at /metrics)");
        }
        let progress = self
            .progress
            .then(|| Progress::start(running.metrics_registry(), 1_000));
        let report = running.wait();
        drop(progress);
        let report = report?;
        match report.savepoint {
            Some(savepoint) => Err(ExampleError::Stopped { savepoint }),
            None => Ok(report),
        }
    }

    /// Restarts with a short fixed delay, a few more attempts than planned
    /// crashes, so that an unplanned failure loop still ends.
    pub fn restart_strategy(&self, planned_crashes: usize) -> RestartStrategy {
        RestartStrategy::FixedDelay {
            attempts_max: u32::try_from(planned_crashes)
                .unwrap_or(u32::MAX)
                .saturating_add(3),
            delay_ms: 50,
        }
    }
}

/// Which records crash an operator (each at most once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrashSpec {
    /// No crash.
    None,
    /// Records `N`, `2N`, `3N`... of the input.
    Every(u64),
    /// `count` records chosen by `seed`, in the middle 80% of the input.
    Random {
        /// How many crashes.
        count: u64,
        /// Which records.
        seed: u64,
    },
}

impl CrashSpec {
    /// The record numbers (in `0..records`) that crash.
    pub fn records(&self, records: u64) -> BTreeSet<u64> {
        match *self {
            CrashSpec::None => BTreeSet::new(),
            CrashSpec::Every(every) => (1..)
                .map(|n| n * every)
                .take_while(|&record| record < records)
                .collect(),
            CrashSpec::Random { count, seed } => {
                let low = records / 10;
                let span = (records * 8 / 10).max(1);
                let mut rng = Rng::new(seed);
                let mut chosen = BTreeSet::new();
                // Bounded: at most `span` distinct records can be chosen.
                while (chosen.len() as u64) < count.min(span) {
                    chosen.insert(low + rng.below(span));
                }
                chosen
            }
        }
    }
}

const CRASH_MESSAGE: &str = "injected crash";

/// The planned crashes of a run: an operator calls [`CrashPlan::check`]
/// with each record's number, and the first time a planned record is seen
/// the operator panics. Replays of the same record after the restart find
/// the crash already fired and pass, so each planned crash happens once.
#[derive(Debug, Clone)]
pub struct CrashPlan {
    crashes: Arc<Vec<(u64, AtomicBool)>>,
}

impl CrashPlan {
    /// Crashes at these record numbers.
    pub fn new(records: BTreeSet<u64>) -> CrashPlan {
        silence_injected_panics();
        CrashPlan {
            crashes: Arc::new(
                records
                    .into_iter()
                    .map(|record| (record, AtomicBool::new(false)))
                    .collect(),
            ),
        }
    }

    /// Panics if `record` is a planned crash that has not fired yet.
    pub fn check(&self, record: u64) {
        let planned = self.crashes.binary_search_by_key(&record, |(at, _)| *at);
        if let Ok(index) = planned {
            if !self.crashes[index].1.swap(true, Ordering::SeqCst) {
                panic!("{CRASH_MESSAGE} at input record {record}");
            }
        }
    }

    /// How many crashes are planned.
    pub fn planned(&self) -> usize {
        self.crashes.len()
    }

    /// How many fired.
    pub fn fired(&self) -> usize {
        self.crashes
            .iter()
            .filter(|(_, fired)| fired.load(Ordering::SeqCst))
            .count()
    }

    /// The planned record numbers, for the summary.
    pub fn records(&self) -> Vec<u64> {
        self.crashes.iter().map(|(record, _)| *record).collect()
    }
}

/// Keeps the default panic message for real bugs but not for the crashes
/// the examples inject on purpose (the restart is printed instead).
fn silence_injected_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied());
            if !message.is_some_and(|message| message.starts_with(CRASH_MESSAGE)) {
                default(info);
            }
        }));
    });
}

/// A tiny deterministic generator (splitmix64), so that the examples need
/// no extra dependency and a seed replays the same input.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (`bound` at least 1).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound.max(1)
    }

    /// A number in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1_u64 << 53) as f64
    }
}

/// How fast a [`PacedSource`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacing {
    /// Records per read.
    pub records_per_read: usize,
    /// Pause after each read.
    pub pause_ms: u64,
}

/// The read clock of one paced reader: a read is allowed once per pause.
#[derive(Debug, Clone)]
pub struct Pacer {
    pacing: Pacing,
    next_read: Instant,
}

impl Pacer {
    /// A clock that allows the first read at once.
    pub fn new(pacing: Pacing) -> Pacer {
        Pacer {
            pacing,
            next_read: Instant::now(),
        }
    }

    /// How many records this poll may read (at most `max_records`), or
    /// `None` while the pause after the previous read lasts (the reader
    /// then says [`SourcePoll::Idle`]).
    pub fn budget(&mut self, max_records: usize) -> Option<usize> {
        let now = Instant::now();
        if now < self.next_read {
            return None;
        }
        self.next_read = now + Duration::from_millis(self.pacing.pause_ms);
        Some(max_records.min(self.pacing.records_per_read))
    }
}

/// A [`VecSourceFactory`] read at a pace, like a live stream, so that
/// checkpoints and crashes happen while records are in flight.
pub struct PacedSource<T> {
    inner: VecSourceFactory<T>,
    pacing: Pacing,
}

impl<T> PacedSource<T> {
    /// `records` read at `pacing`.
    pub fn new(records: Vec<T>, pacing: Pacing) -> PacedSource<T> {
        PacedSource {
            inner: VecSourceFactory::new(records),
            pacing,
        }
    }
}

impl<T: Clone> SourceFactory for PacedSource<T> {
    type Source = PacedReader<T>;

    fn split(&self, subtask: usize, parallelism: usize) -> Result<PacedReader<T>, SourceError> {
        Ok(PacedReader {
            inner: self.inner.split(subtask, parallelism)?,
            pacer: Pacer::new(self.pacing),
        })
    }
}

/// One subtask's paced reader: it says [`SourcePoll::Idle`] until its
/// pause has passed (the job polls an idle source again a moment later).
pub struct PacedReader<T> {
    inner: VecSource<T>,
    pacer: Pacer,
}

impl<T: Clone> Source for PacedReader<T> {
    type Item = T;

    fn poll_batch(
        &mut self,
        out: &mut Vec<T>,
        max_records: usize,
    ) -> Result<SourcePoll, SourceError> {
        match self.pacer.budget(max_records) {
            Some(budget) => self.inner.poll_batch(out, budget),
            None => Ok(SourcePoll::Idle),
        }
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

/// Opens the file store for `job` under `root` after deleting what an
/// earlier run left there: a job on a store with checkpoints resumes from
/// the newest, and every example run is meant to start from scratch.
pub fn fresh_store(root: &Path, job: &str) -> Result<FsCheckpointStore, ExampleError> {
    let store = FsCheckpointStore::open(root, job)?;
    let job_dir = store.job_dir().to_path_buf();
    drop(store);
    match std::fs::remove_dir_all(&job_dir) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(ExampleError::Io {
                path: job_dir,
                source,
            })
        }
    }
    Ok(FsCheckpointStore::open(root, job)?)
}

/// Prints what a finished job reports: checkpoints, restarts and what each
/// restored from.
pub fn print_report(report: &snapflow::job::JobReport) {
    let bytes: u64 = report
        .checkpoints
        .iter()
        .map(|checkpoint| checkpoint.size_bytes)
        .sum();
    println!(
        "job {}: {} checkpoints completed ({} bytes in all), {} failed, {} restarts",
        report.job,
        report.checkpoints.len(),
        bytes,
        report.failed_checkpoints.len(),
        report.restarts.len()
    );
    let reasons: Vec<String> = report
        .guarantee_reasons
        .iter()
        .map(ToString::to_string)
        .collect();
    match report.guarantee {
        Guarantee::ExactlyOnce => println!("  guarantee: exactly-once"),
        Guarantee::AtLeastOnce => {
            println!("  guarantee: at-least-once ({})", reasons.join(", "));
        }
    }
    for restart in &report.restarts {
        let from = restart
            .restored_from
            .map_or("the beginning".to_owned(), |id| format!("checkpoint {id}"));
        println!(
            "  restart to generation {} from {from} after {} ms ({})",
            restart.generation, restart.recovery_ms, restart.cause
        );
    }
}

/// Checks that every planned crash fired and caused a restart.
pub fn check_crashes(
    crashes: &CrashPlan,
    report: &snapflow::job::JobReport,
) -> Result<(), ExampleError> {
    if crashes.fired() != crashes.planned() || report.restarts.len() < crashes.planned() {
        return Err(ExampleError::Mismatch(format!(
            "{} of {} planned crashes fired and the job restarted {} times",
            crashes.fired(),
            crashes.planned(),
            report.restarts.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(spec: CrashSpec, records: u64, expected: &[u64]) {
        let chosen: Vec<u64> = spec.records(records).into_iter().collect();
        assert_eq!(chosen, expected, "{spec:?} over {records} records");
    }

    #[test]
    fn crash_every_n_stays_inside_the_input() {
        check(CrashSpec::Every(4), 13, &[4, 8, 12]);
    }

    #[test]
    fn no_crash_plans_nothing() {
        check(CrashSpec::None, 100, &[]);
    }

    #[test]
    fn random_crashes_fall_in_the_middle_and_replay_from_the_seed() {
        let spec = CrashSpec::Random { count: 5, seed: 3 };
        let chosen = spec.records(1_000);
        assert_eq!(chosen.len(), 5);
        assert!(chosen.iter().all(|record| (100..900).contains(record)));
        assert_eq!(chosen, spec.records(1_000));
    }

    #[test]
    fn more_random_crashes_than_records_are_capped() {
        let chosen = CrashSpec::Random { count: 50, seed: 1 }.records(10);
        assert_eq!(chosen.len(), 8);
    }

    #[test]
    fn a_planned_crash_fires_once() {
        let plan = CrashPlan::new([5].into());
        plan.check(4);
        assert!(std::panic::catch_unwind(|| plan.check(5)).is_err());
        plan.check(5);
        assert_eq!((plan.fired(), plan.planned()), (1, 1));
    }

    /// A command line of the common flags alone.
    #[derive(Debug, Parser)]
    #[command(args_override_self = true)]
    struct Common {
        #[command(flatten)]
        common: CommonArgs,
    }

    fn parsed(arguments: &[&str]) -> Result<CommonOptions, clap::Error> {
        let args =
            Common::try_parse_from(std::iter::once("example").chain(arguments.iter().copied()))?;
        Ok(args.common.apply(CommonOptions::full()))
    }

    fn crashes(arguments: &[&str]) -> CrashSpec {
        parsed(arguments).expect("valid").crashes
    }

    #[test]
    fn common_flags_parse() {
        assert_eq!(crashes(&["--crash-every", "7"]), CrashSpec::Every(7));
        assert_eq!(
            crashes(&["--seed", "9"]),
            CrashSpec::Random { count: 2, seed: 9 }
        );
        assert_eq!(
            crashes(&["--no-crash", "--crash-every", "4", "--crashes", "5"]),
            CrashSpec::Random { count: 5, seed: 42 },
            "the last of the crash flags wins"
        );
        assert_eq!(crashes(&["--crashes", "3", "--no-crash"]), CrashSpec::None);
        let options = parsed(&["--no-progress", "--rate", "5", "--rate", "6"]).expect("valid");
        assert_eq!((options.progress, options.records_per_second), (false, 6));
        assert!(parsed(&["--rate", "x"]).is_err());
        assert!(parsed(&["--parallelism", "0"]).is_err());
        assert!(parsed(&["--http", "nowhere"]).is_err());
        assert!(parsed(&["--other"]).is_err());
    }
}
