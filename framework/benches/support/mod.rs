//! What the end-to-end benchmarks share: the keyed count's state, the
//! replayable sequence source (the project's generator), a discarding sink with two-phase commit (and
//! an optional pause per batch), peak-RSS readings and order statistics.
//!
//! It is a module of each benchmark binary, not a target of its own; each
//! binary uses a subset, hence the `dead_code` allowance.
#![allow(dead_code)]

#[cfg(feature = "kafka")]
pub mod kafka;

use std::collections::{BTreeMap, BTreeSet};
use std::hint::black_box;
use std::marker::PhantomData;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use snapflow::job::{CheckpointReport, Job, JobError, JobReport};
use snapflow::metrics::{CheckpointStatus, JobMetrics, Progress};
use snapflow::protocol::SnapshotMode;
use snapflow::sink::{Sink, SinkError, SinkFactory, SinkState};
use snapflow::source::GeneratorSourceFactory;

/// The per-key state of the count.
#[derive(snapflow::Snapshot, Default, Clone, Debug)]
pub struct Count {
    /// Records seen for the key.
    pub count: u64,
}

/// What a [`DiscardSink`]'s writers committed, shared by all of them: the
/// committed record count and the committed transactions (so a commit
/// repeated after a restore counts once).
#[derive(Default)]
pub struct Discarded {
    records: AtomicU64,
    done: Mutex<BTreeSet<(usize, u64)>>,
}

impl Discarded {
    fn commit(&self, subtask: usize, checkpoint: u64, records: u64) {
        let mut done = self.done.lock().unwrap_or_else(|error| error.into_inner());
        if done.insert((subtask, checkpoint)) {
            self.records.fetch_add(records, Ordering::Relaxed);
        }
    }
}

/// A sink that drops records of type `T` and counts them with two-phase
/// commit: the count of a transaction is committed when its checkpoint
/// completes.
pub struct DiscardSink<T = (u64, u64)> {
    shared: Arc<Discarded>,
    /// A pause per written batch, to make the sink the bottleneck.
    pause_per_batch: Duration,
    records: PhantomData<fn(T)>,
}

impl<T> Clone for DiscardSink<T> {
    fn clone(&self) -> Self {
        DiscardSink {
            shared: Arc::clone(&self.shared),
            pause_per_batch: self.pause_per_batch,
            records: PhantomData,
        }
    }
}

impl<T> Default for DiscardSink<T> {
    fn default() -> Self {
        DiscardSink::slow(Duration::ZERO)
    }
}

impl<T> DiscardSink<T> {
    /// A sink that sleeps `pause_per_batch` on every batch it writes.
    pub fn slow(pause_per_batch: Duration) -> DiscardSink<T> {
        DiscardSink {
            shared: Arc::default(),
            pause_per_batch,
            records: PhantomData,
        }
    }

    /// Records committed so far, over every writer.
    pub fn committed(&self) -> u64 {
        self.shared.records.load(Ordering::Relaxed)
    }
}

impl<T: Send + 'static> SinkFactory for DiscardSink<T> {
    type Sink = DiscardWriter<T>;

    fn create(&self, subtask: usize, _parallelism: usize) -> Result<DiscardWriter<T>, SinkError> {
        Ok(DiscardWriter {
            shared: Arc::clone(&self.shared),
            subtask,
            pause_per_batch: self.pause_per_batch,
            open: 0,
            pending: BTreeMap::new(),
            records: PhantomData,
        })
    }
}

/// One subtask's [`DiscardSink`]: record counts per transaction.
pub struct DiscardWriter<T = (u64, u64)> {
    shared: Arc<Discarded>,
    subtask: usize,
    pause_per_batch: Duration,
    open: u64,
    /// Pre-committed record counts per checkpoint; bounded by the
    /// checkpoints in flight, as every completion drains all older ones.
    pending: BTreeMap<u64, u64>,
    records: PhantomData<fn(T)>,
}

impl<T> DiscardWriter<T> {
    fn commit_up_to(&mut self, checkpoint: u64) {
        let later = self.pending.split_off(&(checkpoint + 1));
        for (id, records) in std::mem::replace(&mut self.pending, later) {
            self.shared.commit(self.subtask, id, records);
        }
    }
}

impl<T: Send + 'static> Sink for DiscardWriter<T> {
    type Item = T;

    fn write_batch(&mut self, batch: &[T]) -> Result<(), SinkError> {
        if !self.pause_per_batch.is_zero() {
            std::thread::sleep(self.pause_per_batch);
        }
        self.open += black_box(batch).len() as u64;
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint_id: u64) -> Result<SinkState, SinkError> {
        self.pending
            .insert(checkpoint_id, std::mem::take(&mut self.open));
        let pending: Vec<(u64, u64)> = self.pending.iter().map(|(&id, &n)| (id, n)).collect();
        let bytes = postcard::to_allocvec(&pending).map_err(|error| SinkError::MalformedState {
            reason: error.to_string(),
        })?;
        Ok(SinkState::from_bytes(bytes))
    }

    fn commit(&mut self, checkpoint_id: u64) -> Result<(), SinkError> {
        self.commit_up_to(checkpoint_id);
        Ok(())
    }

    fn abort(&mut self) -> Result<(), SinkError> {
        self.open = 0;
        Ok(())
    }

    fn restore(&mut self, state: Option<&SinkState>) -> Result<(), SinkError> {
        self.open = 0;
        self.pending.clear();
        let Some(state) = state else {
            return Ok(());
        };
        let pending: Vec<(u64, u64)> =
            postcard::from_bytes(state.as_bytes()).map_err(|error| SinkError::MalformedState {
                reason: error.to_string(),
            })?;
        for (id, records) in pending {
            self.shared.commit(self.subtask, id, records);
        }
        Ok(())
    }
}

/// The sequence `0..records` from the project's generator source (each
/// subtask reads a contiguous share; a position is the next index).
///
/// The generator is a closure, not a `fn` pointer: with a pointer, every
/// record cost an indirect call (about 7% of the keyed count's cycles);
/// with a closure the batch loop is a plain copy of the index range.
pub fn sequence(records: u64) -> GeneratorSourceFactory<impl Fn(u64) -> u64 + Clone> {
    GeneratorSourceFactory::new(0..records, |index| index)
}

/// The exact count of key `key` among `records` records.
pub fn expected_count(records: u64, keys: u64, key: u64) -> u64 {
    records / keys + u64::from(key < records % keys)
}

/// Resets the kernel's peak-RSS mark (`VmHWM`) to the current RSS so the
/// next reading covers only what follows; returns whether it could (Linux
/// 4.0 and later). Without the reset the reading is the peak since the
/// process started.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// `VmHWM` of this process in KiB, if the kernel reports it.
pub fn peak_rss_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The value at quantile `q` (nearest rank) of sorted `values`.
pub fn quantile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// Pins the job's arbiter threads to CPUs while it runs, with the
/// `taskset` tool (util-linux), so that no `unsafe` affinity call is
/// needed. On an idle 2-CPU machine the kernel sometimes runs both worker
/// arbiters of a p = 2 job on one CPU for a whole run, which halves the
/// job's throughput and makes back-to-back runs bimodal. Pinning the
/// threads measures the framework rather than that placement.
///
/// A background thread scans `/proc/self/task` (every 2 ms for the first
/// 200 ms, then every 100 ms) and pins each new
/// thread named `actix-rt|system` (every arbiter: the supervisor's first,
/// then the workers). The first goes to the last CPU and the rest round
/// robin from CPU 0, so the workers of a 2-CPU machine get one CPU each.
pub struct ArbiterPinner {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<usize, String>>>,
}

impl ArbiterPinner {
    /// Starts pinning every arbiter thread that appears from now on.
    pub fn start() -> ArbiterPinner {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || pin_until(&flag));
        ArbiterPinner {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops scanning; returns how many threads were pinned, or why
    /// pinning failed.
    pub fn finish(mut self) -> Result<usize, String> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err("the pinning thread panicked".to_string()),
            None => Ok(0),
        }
    }
}

fn pin_until(stop: &std::sync::atomic::AtomicBool) -> Result<usize, String> {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let mut pinned = BTreeSet::new();
    let started = std::time::Instant::now();
    while !stop.load(Ordering::Relaxed) {
        for tid in arbiter_threads() {
            if pinned.contains(&tid) {
                continue;
            }
            let cpu = (pinned.len() + cpus - 1) % cpus;
            let output = std::process::Command::new("taskset")
                .args(["-p", "-c", &cpu.to_string(), &tid.to_string()])
                .output()
                .map_err(|error| format!("taskset: {error}"))?;
            if !output.status.success() {
                return Err(format!(
                    "taskset -p -c {cpu} {tid}: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                ));
            }
            pinned.insert(tid);
        }
        // The arbiters start within the job's first milliseconds; later
        // scans only catch a restart's, so they can be rare and cheap.
        let pause_ms = if started.elapsed() < Duration::from_millis(200) {
            2
        } else {
            100
        };
        std::thread::sleep(Duration::from_millis(pause_ms));
    }
    Ok(pinned.len())
}

/// The thread ids of this process's arbiter threads, ascending.
fn arbiter_threads() -> Vec<u64> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut tids: Vec<u64> = tasks
        .filter_map(Result::ok)
        .filter_map(|task| {
            let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
            let tid = task.file_name().to_str()?.parse().ok()?;
            comm.starts_with("actix-rt|system").then_some(tid)
        })
        .collect();
    tids.sort_unstable();
    tids
}

/// A number on the command line, `_` separators allowed (`20_000_000`).
pub fn number<T: FromStr>(text: &str) -> Result<T, String> {
    text.replace('_', "")
        .parse()
        .map_err(|_| format!("`{text}` is not a valid number"))
}

/// A [`number`] of at least 1.
pub fn positive<T: FromStr + Default + PartialEq>(text: &str) -> Result<T, String> {
    match number(text)? {
        zero if zero == T::default() => Err("must be at least 1".to_string()),
        value => Ok(value),
    }
}

/// `--checkpoint-interval-ms`: milliseconds, or `off` for no periodic
/// checkpoints (`None`).
pub fn interval(text: &str) -> Result<Option<u64>, String> {
    match text {
        "off" => Ok(None),
        _ => number(text).map(Some),
    }
}

/// `--mode`: `aligned`, `unaligned` or `at-least-once`.
pub fn mode(text: &str) -> Result<SnapshotMode, String> {
    match text {
        "aligned" => Ok(SnapshotMode::Aligned),
        "unaligned" => Ok(SnapshotMode::Unaligned),
        "at-least-once" => Ok(SnapshotMode::AtLeastOnce),
        other => Err(format!(
            "unknown mode {other:?} (aligned, unaligned or at-least-once)"
        )),
    }
}

/// `on` or `off`.
pub fn on_off(text: &str) -> Result<bool, String> {
    match text {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("expected on or off, got {other:?}")),
    }
}

/// The flag `cargo bench` passes to every benchmark binary, accepted and
/// ignored (flattened into each benchmark's options).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CargoBench {
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// `given`, else the environment variable `name` when it is set and not
/// empty: where a benchmark finds its server (`--brokers` or
/// `SNAPFLOW_KAFKA_BROKERS`, `--url` or `SNAPFLOW_POSTGRES_URL`).
pub fn or_env(given: Option<String>, name: &str) -> Option<String> {
    given.or_else(|| std::env::var(name).ok().filter(|value| !value.is_empty()))
}

/// The `main` of every benchmark: clap parses the arguments (printing
/// `--help`, or a usage error with exit code 2), `settle` applies
/// `--smoke` and checks the rules between flags (a broken rule is a
/// usage error too), then it runs and turns a failed check into exit code
/// 1 with the benchmark's name in the message.
pub fn bench_main<O: clap::Parser>(
    name: &str,
    settle: impl FnOnce(O) -> Result<O, String>,
    run: impl FnOnce(&O) -> Result<(), String>,
) -> ExitCode {
    let options = settle(O::parse()).unwrap_or_else(|message| {
        O::command()
            .error(clap::error::ErrorKind::ArgumentConflict, message)
            .exit()
    });
    match run(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("{name}: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The time of one cache-line round trip between two threads, in
/// nanoseconds: two threads take turns incrementing one atomic counter,
/// `round_trips` times each. The caller times chunks of 1,000 round trips
/// and returns the median chunk's mean, so a chunk stalled by the
/// scheduler (the helper thread starting, or both threads sharing one CPU
/// for a moment) does not move the figure.
///
/// On the 2-vCPU VM the benchmarks were written on, this figure moves
/// between about 30, about 80 and about 340 ns from one minute to the next
/// (the host places the two vCPUs as SMT siblings, on cores that share a
/// cache, or on cores that do not), and the job's throughput moves with
/// it; see BENCHMARKS.md, "Machine and conditions". Taken around a run,
/// it tells which placement the run had. It measures nothing about the job.
pub fn cross_core_round_trip_ns(round_trips: u64) -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    const CHUNK: u64 = 1_000;
    let chunks = (round_trips / CHUNK).max(1);
    let total = chunks * CHUNK;
    let turn = Arc::new(AtomicU64::new(0));
    let other = Arc::clone(&turn);
    // Odd values are the helper's turn, even values the caller's. Each
    // side spins (bounded by `total`) until the counter says it is its
    // turn, then hands the turn over.
    let helper = std::thread::spawn(move || {
        for round in 0..total {
            while other.load(Ordering::Acquire) != 2 * round + 1 {
                std::hint::spin_loop();
            }
            other.store(2 * round + 2, Ordering::Release);
        }
    });
    let mut chunk_ns: Vec<f64> = Vec::with_capacity(chunks as usize);
    for chunk in 0..chunks {
        let started = std::time::Instant::now();
        for round in chunk * CHUNK..(chunk + 1) * CHUNK {
            turn.store(2 * round + 1, Ordering::Release);
            while turn.load(Ordering::Acquire) != 2 * round + 2 {
                std::hint::spin_loop();
            }
        }
        chunk_ns.push(started.elapsed().as_nanos() as f64 / CHUNK as f64);
    }
    // The helper only spins on the shared counter and has finished its
    // last round once the caller saw it; a panic there is a bug here.
    helper
        .join()
        .expect("the round-trip helper thread panicked");
    median(&mut chunk_ns)
}

/// Records per second in millions.
pub fn mega_per_second(records: u64, elapsed: Duration) -> f64 {
    records as f64 / elapsed.as_secs_f64() / 1e6
}

/// `label: median … (min …, max …, n runs)` over `values` (at least one).
pub fn summary(label: &str, values: &[f64], unit: &str) -> String {
    let mut sorted = values.to_vec();
    let middle = median(&mut sorted);
    format!(
        "{label}: median {middle:.2} {unit} (min {:.2}, max {:.2}, {} runs)",
        sorted[0],
        sorted[sorted.len() - 1],
        sorted.len()
    )
}

/// Prints a figure, or that there was no periodic checkpoint to take it
/// from.
pub fn print_optional(label: &str, value: Option<u64>, unit: &str) {
    match value {
        Some(value) => println!("  {label}: {value} {unit}"),
        None => println!("  {label}: none (no periodic checkpoint)"),
    }
}

/// One figure of every periodic checkpoint of every run's report, sorted:
/// all checkpoints but the last of each run, which is the final checkpoint
/// triggered after every input ended (no barriers, nothing to align).
pub fn periodic_figures<'a>(
    reports: impl IntoIterator<Item = &'a JobReport>,
    figure: fn(&CheckpointReport) -> u64,
) -> Vec<u64> {
    let mut figures: Vec<u64> = reports
        .into_iter()
        .flat_map(|report| {
            let periodic = report.checkpoints.len().saturating_sub(1);
            report.checkpoints[..periodic].iter().map(figure)
        })
        .collect();
    figures.sort_unstable();
    figures
}

/// The checkpoint setting in words.
pub fn describe(interval_ms: Option<u64>) -> String {
    match interval_ms {
        Some(ms) => format!("checkpoint every {ms} ms"),
        None => "periodic checkpoints off".to_string(),
    }
}

/// An interval no benchmark run reaches: a day.
const NEVER_MS: u64 = 24 * 60 * 60 * 1000;

/// The `checkpoint_interval_ms` to give a job whose benchmark setting is
/// `interval_ms`, when the job has a checkpoint store. A job with a store
/// and no interval checkpoints every `DEFAULT_CHECKPOINT_INTERVAL_MS`
/// (10 s) by design (`JobConfig::checkpoint_interval_ms`), so a baseline
/// "with checkpoints off" that passed `None` took a full checkpoint every
/// 10 s and understated what checkpoints cost; an interval of a day keeps
/// the same store and the same final checkpoint and takes no other.
pub fn periodic_interval_ms(interval_ms: Option<u64>) -> Option<u64> {
    Some(interval_ms.unwrap_or(NEVER_MS))
}

/// Runs `job` to its end; with `progress`, prints one line per second to
/// standard error from its live metrics while it runs (`--progress`).
pub fn run_with_progress(job: Job, progress: bool) -> Result<JobReport, JobError> {
    run_with_metrics(job, progress).map(|(report, _)| report)
}

/// [`run_with_progress`] that also returns the live metrics as they were
/// when the job ended (its checkpoint history holds each subtask's
/// synchronous part). Without metrics (`JobConfig::metrics` off) they
/// are empty.
pub fn run_with_metrics(job: Job, progress: bool) -> Result<(JobReport, JobMetrics), JobError> {
    let running = job.start()?;
    let registry = running.metrics_registry();
    let printer = progress.then(|| Progress::start(Arc::clone(&registry), 1_000));
    let report = running.wait();
    drop(printer);
    Ok((report?, registry.snapshot()))
}

/// The synchronous parts (microseconds) of `operator`'s subtasks in every
/// completed checkpoint of `metrics`, sorted: the part of a checkpoint
/// that runs on the operator's own thread.
pub fn sync_parts_us(metrics: &JobMetrics, operator: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = metrics
        .checkpoints
        .iter()
        .filter(|checkpoint| checkpoint.status == CheckpointStatus::Completed)
        .flat_map(|checkpoint| &checkpoint.subtasks)
        .filter(|subtask| subtask.operator == operator)
        .map(|subtask| subtask.sync_us)
        .collect();
    parts.sort_unstable();
    parts
}
