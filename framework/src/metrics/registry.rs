//! The registry of one job's live metrics: the subtasks' cells and the
//! channels' gauges in `dashmap`s, and the checkpoint and restart history
//! the supervisor writes.
//!
//! Writers never wait for readers on the record path: a subtask holds its
//! cell's `Arc` from its start and adds to it with atomics; the maps are
//! touched only when a generation starts (registration) and when a
//! snapshot is read. The history and the rate sampler sit behind mutexes
//! that only the supervisor (once per checkpoint or restart) and readers
//! take.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dashmap::DashMap;

use super::cell::{CellTotals, SubtaskCell};
use super::snapshot::{
    ChannelMetrics, CheckpointMetrics, CheckpointStatus, EdgeMetrics, JobMetrics, OperatorKind,
    OperatorMetrics, RestartMetrics, SubtaskCheckpoint, SubtaskMetrics,
};

/// How many checkpoints the history keeps (the oldest go first).
pub const CHECKPOINT_HISTORY_MAX: usize = 128;
/// How many restarts the history keeps (the oldest go first).
pub const RESTART_HISTORY_MAX: usize = 128;
/// Rates are computed over windows of at least this long.
const RATE_WINDOW: Duration = Duration::from_secs(1);

/// How full a channel is, read from its own counters.
pub trait QueueProbe: Send + Sync + fmt::Debug {
    /// Batches sent and not yet processed.
    fn in_flight_batches(&self) -> u64;
    /// Records sent so far.
    fn records_sent(&self) -> u64;
}

/// An operator as the registry describes it.
#[derive(Debug, Clone)]
pub(crate) struct OperatorInfo {
    pub(crate) name: String,
    pub(crate) kind: OperatorKind,
    pub(crate) parallelism: usize,
}

#[derive(Debug)]
struct ChannelEntry {
    from: (usize, usize),
    to: (usize, usize),
    window_batches: Option<u64>,
    probe: Arc<dyn QueueProbe>,
}

#[derive(Debug)]
struct TrackedCheckpoint {
    metrics: CheckpointMetrics,
    triggered: Instant,
    last_ack: Option<Instant>,
}

#[derive(Debug, Default)]
struct History {
    checkpoints: VecDeque<TrackedCheckpoint>,
    completed: u64,
    failed: u64,
    restarts: VecDeque<RestartMetrics>,
    restarts_total: u64,
    last_failure: Option<String>,
}

impl History {
    fn checkpoint(&mut self, id: u64) -> Option<&mut TrackedCheckpoint> {
        self.checkpoints
            .iter_mut()
            .rev()
            .find(|tracked| tracked.metrics.id == id)
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Rates {
    records_in: f64,
    records_out: f64,
    bytes_in: f64,
    bytes_out: f64,
    busy_ms: f64,
    backpressured_ms: f64,
}

#[derive(Debug)]
struct Base {
    at: Instant,
    totals: CellTotals,
    rates: Option<Rates>,
}

/// The live metrics of one job. Made by the job at its start; read it
/// through [`RunningJob::metrics`](crate::job::RunningJob::metrics).
pub struct MetricsRegistry {
    job: String,
    enabled: bool,
    epoch: Instant,
    started_unix_ms: u64,
    operators: Vec<OperatorInfo>,
    edges: Vec<EdgeMetrics>,
    subtasks: DashMap<(usize, usize), Arc<SubtaskCell>>,
    channels: DashMap<u64, ChannelEntry>,
    history: Mutex<History>,
    sampler: Mutex<HashMap<(usize, usize), Base>>,
}

impl fmt::Debug for MetricsRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsRegistry")
            .field("job", &self.job)
            .field("enabled", &self.enabled)
            .field("subtasks", &self.subtasks.len())
            .field("channels", &self.channels.len())
            .finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section leaves the value consistent.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl MetricsRegistry {
    pub(crate) fn new(
        job: String,
        enabled: bool,
        operators: Vec<OperatorInfo>,
        edges: Vec<EdgeMetrics>,
    ) -> Self {
        MetricsRegistry {
            job,
            enabled,
            epoch: Instant::now(),
            started_unix_ms: unix_ms(),
            operators,
            edges,
            subtasks: DashMap::new(),
            channels: DashMap::new(),
            history: Mutex::new(History::default()),
            sampler: Mutex::new(HashMap::new()),
        }
    }

    /// Whether subtasks record their figures.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The cell of `operator`'s subtask `subtask`, shared by its
    /// generations; `None` when metrics are off.
    pub(crate) fn cell(&self, operator: usize, subtask: usize) -> Option<Arc<SubtaskCell>> {
        if !self.enabled {
            return None;
        }
        let cell = self
            .subtasks
            .entry((operator, subtask))
            .or_insert_with(|| Arc::new(SubtaskCell::new(self.epoch)));
        Some(Arc::clone(&cell))
    }

    /// Registers (or replaces, for a new generation) channel `id`.
    pub(crate) fn register_channel(
        &self,
        id: u64,
        from: (usize, usize),
        to: (usize, usize),
        window_batches: Option<u64>,
        probe: Arc<dyn QueueProbe>,
    ) {
        self.channels.insert(
            id,
            ChannelEntry {
                from,
                to,
                window_batches,
                probe,
            },
        );
    }

    /// Checkpoint `id` was triggered; `total_subtasks` take part.
    pub(crate) fn checkpoint_triggered(&self, id: u64, savepoint: bool, total_subtasks: usize) {
        let mut history = lock(&self.history);
        if history.checkpoints.len() >= CHECKPOINT_HISTORY_MAX {
            history.checkpoints.pop_front();
        }
        let kind = if savepoint { "savepoint" } else { "checkpoint" };
        history.checkpoints.push_back(TrackedCheckpoint {
            metrics: CheckpointMetrics {
                id,
                kind: kind.to_owned(),
                status: CheckpointStatus::InProgress,
                trigger_time_unix_ms: unix_ms(),
                duration_ms: 0,
                sync_duration_ms: 0,
                async_duration_ms: 0,
                alignment_max_us: 0,
                size_bytes: 0,
                acked_subtasks: 0,
                total_subtasks,
                subtasks: Vec::new(),
                failure: None,
            },
            triggered: Instant::now(),
            last_ack: None,
        });
    }

    /// `operator`'s subtask `subtask` acked checkpoint `id` with a part
    /// of `size_bytes`.
    pub(crate) fn checkpoint_acked(
        &self,
        id: u64,
        (operator, subtask): (usize, usize),
        alignment_us: u64,
        size_bytes: u64,
    ) {
        let sync_us = self
            .subtasks
            .get(&(operator, subtask))
            .map_or(0, |cell| cell.take_sync_part(id));
        let name = self
            .operators
            .get(operator)
            .map_or_else(String::new, |info| info.name.clone());
        let mut history = lock(&self.history);
        let Some(tracked) = history.checkpoint(id) else {
            return;
        };
        let now = Instant::now();
        tracked.last_ack = Some(now);
        let metrics = &mut tracked.metrics;
        metrics.acked_subtasks += 1;
        metrics.alignment_max_us = metrics.alignment_max_us.max(alignment_us);
        metrics.subtasks.push(SubtaskCheckpoint {
            operator: name,
            subtask,
            ack_ms: millis(now.saturating_duration_since(tracked.triggered)),
            sync_us,
            alignment_us,
            size_bytes,
        });
    }

    /// Checkpoint `id` became durable with `size_bytes`.
    ///
    /// `part_bytes` gives `(operator, subtask)` part sizes known only now
    /// (parts encoded off the operator's thread acked with size 0).
    pub(crate) fn checkpoint_completed(
        &self,
        id: u64,
        size_bytes: u64,
        part_bytes: &[((usize, usize), u64)],
    ) {
        let names: Vec<(String, usize, u64)> = part_bytes
            .iter()
            .filter_map(|((operator, subtask), bytes)| {
                let name = self.operators.get(*operator)?.name.clone();
                Some((name, *subtask, *bytes))
            })
            .collect();
        let mut history = lock(&self.history);
        history.completed += 1;
        let Some(tracked) = history.checkpoint(id) else {
            return;
        };
        let now = Instant::now();
        let last_ack = tracked.last_ack.unwrap_or(now);
        let metrics = &mut tracked.metrics;
        metrics.status = CheckpointStatus::Completed;
        metrics.size_bytes = size_bytes;
        for subtask in &mut metrics.subtasks {
            let known = names
                .iter()
                .find(|(name, index, _)| *name == subtask.operator && *index == subtask.subtask);
            if let Some((_, _, bytes)) = known {
                subtask.size_bytes = *bytes;
            }
        }
        metrics.duration_ms = millis(now.saturating_duration_since(tracked.triggered));
        metrics.sync_duration_ms = millis(last_ack.saturating_duration_since(tracked.triggered));
        metrics.async_duration_ms = millis(now.saturating_duration_since(last_ack));
    }

    /// Checkpoint `id` failed (aborted, declined, timed out, not
    /// persisted).
    pub(crate) fn checkpoint_failed(&self, id: u64, reason: &str) {
        let mut history = lock(&self.history);
        history.failed += 1;
        if let Some(tracked) = history.checkpoint(id) {
            tracked.metrics.status = CheckpointStatus::Failed;
            tracked.metrics.duration_ms = millis(tracked.triggered.elapsed());
            tracked.metrics.failure = Some(reason.to_owned());
        }
    }

    /// A failover region runs again after a failure.
    pub(crate) fn restarted(&self, mut restart: RestartMetrics) {
        restart.time_unix_ms = unix_ms();
        let mut history = lock(&self.history);
        if history.restarts.len() >= RESTART_HISTORY_MAX {
            history.restarts.pop_front();
        }
        history.restarts.push_back(restart);
        history.restarts_total += 1;
    }

    /// An operator instance failed.
    pub(crate) fn failed(&self, cause: String) {
        lock(&self.history).last_failure = Some(cause);
    }

    /// The metrics now. Rates are over the last window of at least a
    /// second that ended at a call of this (the first second: since the
    /// start).
    pub fn snapshot(&self) -> JobMetrics {
        let now = Instant::now();
        let operators = self.operator_metrics(now);
        let mut channels: Vec<ChannelMetrics> = self
            .channels
            .iter()
            .map(|entry| self.channel_metrics(*entry.key(), entry.value()))
            .collect();
        channels.sort_by_key(|channel| channel.id);
        let history = lock(&self.history);
        let mut checkpoints: Vec<CheckpointMetrics> = history
            .checkpoints
            .iter()
            .map(|tracked| {
                let mut metrics = tracked.metrics.clone();
                if metrics.status == CheckpointStatus::InProgress {
                    metrics.duration_ms = millis(now.saturating_duration_since(tracked.triggered));
                }
                metrics
            })
            .collect();
        checkpoints.sort_by_key(|checkpoint| checkpoint.id);
        JobMetrics {
            job: self.job.clone(),
            uptime_ms: millis(now.saturating_duration_since(self.epoch)),
            enabled: self.enabled,
            operators,
            edges: self.edges.clone(),
            channels,
            checkpoints,
            checkpoints_completed: history.completed,
            checkpoints_failed: history.failed,
            restarts: history.restarts.iter().cloned().collect(),
            restarts_total: history.restarts_total,
            last_failure: history.last_failure.clone(),
        }
    }

    /// When the job started, in milliseconds since the Unix epoch.
    pub fn started_unix_ms(&self) -> u64 {
        self.started_unix_ms
    }

    fn channel_metrics(&self, id: u64, entry: &ChannelEntry) -> ChannelMetrics {
        let name = |operator: usize| {
            self.operators
                .get(operator)
                .map_or_else(String::new, |info| info.name.clone())
        };
        let in_flight_batches = entry.probe.in_flight_batches();
        let fill = match entry.window_batches {
            Some(window) if window > 0 => in_flight_batches as f64 / window as f64,
            _ => 0.0,
        };
        ChannelMetrics {
            id,
            from: (name(entry.from.0), entry.from.1),
            to: (name(entry.to.0), entry.to.1),
            in_flight_batches,
            window_batches: entry.window_batches,
            fill,
            records_sent: entry.probe.records_sent(),
        }
    }

    fn operator_metrics(&self, now: Instant) -> Vec<OperatorMetrics> {
        let mut sampler = lock(&self.sampler);
        self.operators
            .iter()
            .enumerate()
            .map(|(index, info)| {
                let subtasks: Vec<SubtaskMetrics> = (0..info.parallelism)
                    .map(|subtask| self.subtask_metrics(&mut sampler, index, subtask, now))
                    .collect();
                sum_operator(info, subtasks)
            })
            .collect()
    }

    fn subtask_metrics(
        &self,
        sampler: &mut HashMap<(usize, usize), Base>,
        operator: usize,
        subtask: usize,
        now: Instant,
    ) -> SubtaskMetrics {
        let Some(cell) = self
            .subtasks
            .get(&(operator, subtask))
            .map(|c| Arc::clone(&c))
        else {
            return SubtaskMetrics {
                subtask,
                ..SubtaskMetrics::default()
            };
        };
        let totals = cell.totals(now);
        let base = sampler.entry((operator, subtask)).or_insert(Base {
            at: self.epoch,
            totals: CellTotals::default(),
            rates: None,
        });
        let window = now.saturating_duration_since(base.at);
        let rates = if window >= RATE_WINDOW || base.rates.is_none() {
            let rates = rates_between(&base.totals, &totals, window);
            if window >= RATE_WINDOW {
                *base = Base {
                    at: now,
                    totals,
                    rates: Some(rates),
                };
            }
            rates
        } else {
            base.rates.unwrap_or_default()
        };
        SubtaskMetrics {
            subtask,
            records_in: totals.records_in,
            batches_in: totals.batches_in,
            records_out: totals.records_out,
            records_in_per_second: rates.records_in,
            records_out_per_second: rates.records_out,
            busy_ms_per_second: rates.busy_ms,
            idle_ms_per_second: (1000.0 - rates.busy_ms - rates.backpressured_ms).max(0.0),
            backpressured_ms_per_second: rates.backpressured_ms,
            busy_ms: totals.busy_ns / 1_000_000,
            backpressured_ms: totals.backpressured_ns / 1_000_000,
            watermark_ms: cell.watermark_ms(),
            position: cell.position(),
            bytes_in: totals.bytes_in,
            bytes_out: totals.bytes_out,
            bytes_in_per_second: rates.bytes_in,
            bytes_out_per_second: rates.bytes_out,
            pending_records: cell.pending_records(),
            pending_bytes: cell.pending_bytes(),
            records_dropped: cell.records_dropped(),
            splits: cell.splits(),
        }
    }
}

fn rates_between(old: &CellTotals, new: &CellTotals, window: Duration) -> Rates {
    let seconds = window.as_secs_f64();
    if seconds <= 0.0 {
        return Rates::default();
    }
    let per_second = |old: u64, new: u64| new.saturating_sub(old) as f64 / seconds;
    let bytes = |old: Option<u64>, new: Option<u64>| per_second(old.unwrap_or(0), new.unwrap_or(0));
    Rates {
        records_in: per_second(old.records_in, new.records_in),
        records_out: per_second(old.records_out, new.records_out),
        bytes_in: bytes(old.bytes_in, new.bytes_in),
        bytes_out: bytes(old.bytes_out, new.bytes_out),
        // Nanoseconds per second to milliseconds per second, at most 1000.
        busy_ms: (per_second(old.busy_ns, new.busy_ns) / 1e6).min(1000.0),
        backpressured_ms: (per_second(old.backpressured_ns, new.backpressured_ns) / 1e6)
            .min(1000.0),
    }
}

fn sum_operator(info: &OperatorInfo, subtasks: Vec<SubtaskMetrics>) -> OperatorMetrics {
    let max = |get: fn(&SubtaskMetrics) -> f64| subtasks.iter().map(get).fold(0.0, f64::max);
    let watermark_ms = subtasks
        .iter()
        .map(|subtask| subtask.watermark_ms)
        .collect::<Option<Vec<u64>>>()
        .and_then(|marks| marks.into_iter().min());
    OperatorMetrics {
        name: info.name.clone(),
        kind: info.kind,
        parallelism: info.parallelism,
        records_in: subtasks.iter().map(|s| s.records_in).sum(),
        records_out: subtasks.iter().map(|s| s.records_out).sum(),
        records_in_per_second: subtasks.iter().map(|s| s.records_in_per_second).sum(),
        records_out_per_second: subtasks.iter().map(|s| s.records_out_per_second).sum(),
        backpressured_ms_per_second_max: max(|s| s.backpressured_ms_per_second),
        busy_ms_per_second_max: max(|s| s.busy_ms_per_second),
        watermark_ms,
        bytes_in: sum_known(&subtasks, |s| s.bytes_in),
        bytes_out: sum_known(&subtasks, |s| s.bytes_out),
        bytes_in_per_second: subtasks.iter().map(|s| s.bytes_in_per_second).sum(),
        bytes_out_per_second: subtasks.iter().map(|s| s.bytes_out_per_second).sum(),
        pending_records: sum_known(&subtasks, |s| s.pending_records),
        pending_bytes: sum_known(&subtasks, |s| s.pending_bytes),
        records_dropped: sum_known(&subtasks, |s| s.records_dropped),
        subtasks,
    }
}

/// The sum over the subtasks that know a figure; `None` when none does.
fn sum_known(subtasks: &[SubtaskMetrics], get: fn(&SubtaskMetrics) -> Option<u64>) -> Option<u64> {
    subtasks.iter().filter_map(get).fold(None, |sum, value| {
        Some(sum.unwrap_or(0).saturating_add(value))
    })
}

/// A registry of the job `job` with a source `in` and a sink `out` of
/// `parallelism` subtasks each, for this module's and its neighbours'
/// unit tests.
#[cfg(test)]
pub(crate) fn two_operator_registry(parallelism: usize) -> MetricsRegistry {
    let info = |name: &str, kind| OperatorInfo {
        name: name.to_owned(),
        kind,
        parallelism,
    };
    MetricsRegistry::new(
        "job".into(),
        true,
        vec![
            info("in", OperatorKind::Source),
            info("out", OperatorKind::Sink),
        ],
        Vec::new(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> MetricsRegistry {
        two_operator_registry(2)
    }

    #[test]
    fn a_checkpoint_goes_from_trigger_to_completion_with_its_subtasks() {
        let registry = registry();
        registry.checkpoint_triggered(1, false, 4);
        if let Some(cell) = registry.cell(1, 0) {
            cell.set_sync_part(1, 250);
        }
        registry.checkpoint_acked(1, (1, 0), 30, 100);
        let running = registry.snapshot();
        assert_eq!(running.checkpoints[0].status, CheckpointStatus::InProgress);
        // A part encoded off the operator's thread acks with size 0; the
        // writer's size arrives with the completion.
        registry.checkpoint_acked(1, (0, 0), 0, 0);
        registry.checkpoint_completed(1, 400, &[((0, 0), 300)]);
        registry.checkpoint_triggered(2, true, 4);
        registry.checkpoint_failed(2, "declined");
        let metrics = registry.snapshot();
        let first = &metrics.checkpoints[0];
        assert_eq!(first.status, CheckpointStatus::Completed);
        assert_eq!((first.size_bytes, first.alignment_max_us), (400, 30));
        assert_eq!(first.subtasks[0].sync_us, 250);
        assert_eq!(first.subtasks[0].operator, "out");
        assert_eq!(first.subtasks[0].size_bytes, 100, "known at the ack");
        assert_eq!(first.subtasks[1].operator, "in");
        assert_eq!(first.subtasks[1].size_bytes, 300, "known at completion");
        assert_eq!(metrics.checkpoints[1].kind, "savepoint");
        assert_eq!(metrics.checkpoints[1].failure.as_deref(), Some("declined"));
        assert_eq!(
            (metrics.checkpoints_completed, metrics.checkpoints_failed),
            (1, 1)
        );
    }

    #[test]
    fn the_history_is_bounded() {
        let registry = registry();
        for id in 0..(CHECKPOINT_HISTORY_MAX as u64 + 10) {
            registry.checkpoint_triggered(id, false, 1);
        }
        let metrics = registry.snapshot();
        assert_eq!(metrics.checkpoints.len(), CHECKPOINT_HISTORY_MAX);
        assert_eq!(metrics.checkpoints[0].id, 10);
    }

    #[test]
    fn a_disabled_registry_hands_out_no_cells() {
        let registry = MetricsRegistry::new("job".into(), false, Vec::new(), Vec::new());
        assert!(registry.cell(0, 0).is_none());
    }
}
