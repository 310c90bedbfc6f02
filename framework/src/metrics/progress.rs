//! One line of progress from a metrics snapshot, and a thread that prints
//! it to standard error every period while a job runs (what the examples
//! and long benchmarks show).
//!
//! It owns only the wording and the printing thread; it reads the
//! registry as any reader does and never touches the job.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use super::{JobMetrics, MetricsRegistry, OperatorKind};

fn per_second(value: f64) -> String {
    if value >= 1e6 {
        format!("{:.2} M/s", value / 1e6)
    } else if value >= 1e3 {
        format!("{:.1} k/s", value / 1e3)
    } else {
        format!("{value:.0}/s")
    }
}

fn size(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
    } else if bytes >= 1 << 10 {
        format!("{:.1} KiB", bytes as f64 / f64::from(1 << 10))
    } else {
        format!("{bytes} B")
    }
}

fn count(value: u64) -> String {
    if value >= 1_000_000 {
        format!("{:.2} M", value as f64 / 1e6)
    } else if value >= 1_000 {
        format!("{:.1} k", value as f64 / 1e3)
    } else {
        value.to_string()
    }
}

/// The sources' lag, summed over the sources that know theirs (records
/// left, bytes left, or both); `None` when no source knows.
fn sources_lag(metrics: &JobMetrics) -> Option<String> {
    let sources = || {
        metrics
            .operators
            .iter()
            .filter(|o| o.kind == OperatorKind::Source)
    };
    let sum = |values: Vec<u64>| (!values.is_empty()).then(|| values.iter().sum::<u64>());
    let records = sum(sources().filter_map(|o| o.pending_records).collect());
    let bytes = sum(sources().filter_map(|o| o.pending_bytes).collect());
    let parts: Vec<String> = [
        records.map(|records| format!("{} records", count(records))),
        bytes.map(size),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// One line: the sources' output rate and, where a source knows it, its
/// lag (records or bytes not read yet), the sinks' input rate, the newest
/// completed checkpoint, restarts, and the most backpressured operator
/// when any is above 100 ms/s.
pub fn progress_line(metrics: &JobMetrics) -> String {
    let rate = |kind: OperatorKind, out: bool| -> f64 {
        let operators = metrics.operators.iter().filter(|o| o.kind == kind);
        match out {
            true => operators.map(|o| o.records_out_per_second).sum(),
            false => operators.map(|o| o.records_in_per_second).sum(),
        }
    };
    let mut line = format!(
        "[{:.1} s] {}: sources {}",
        metrics.uptime_ms as f64 / 1000.0,
        metrics.job,
        per_second(rate(OperatorKind::Source, true)),
    );
    if let Some(lag) = sources_lag(metrics) {
        line.push_str(&format!(", lag {lag}"));
    }
    line.push_str(&format!(
        ", sinks {}",
        per_second(rate(OperatorKind::Sink, false))
    ));
    match metrics.last_completed_checkpoint() {
        Some(last) => line.push_str(&format!(
            ", checkpoint {} ({} ms, {})",
            last.id,
            last.duration_ms,
            size(last.size_bytes)
        )),
        None => line.push_str(", no checkpoint yet"),
    }
    line.push_str(&format!(", restarts {}", metrics.restarts_total));
    let most = metrics
        .operators
        .iter()
        .max_by(|a, b| {
            a.backpressured_ms_per_second_max
                .total_cmp(&b.backpressured_ms_per_second_max)
        })
        .filter(|o| o.backpressured_ms_per_second_max >= 100.0);
    if let Some(operator) = most {
        line.push_str(&format!(
            ", backpressured: {} {:.0} ms/s",
            operator.name, operator.backpressured_ms_per_second_max
        ));
    }
    line
}

/// Prints [`progress_line`] to standard error every period until dropped.
#[derive(Debug)]
pub struct Progress {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Progress {
    /// Starts printing `registry`'s progress every `period_ms` (at least
    /// 100 ms) on a thread of its own.
    pub fn start(registry: Arc<MetricsRegistry>, period_ms: u64) -> Progress {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let period = Duration::from_millis(period_ms.max(100));
        let thread = thread::Builder::new()
            .name("snapflow-progress".into())
            .spawn({
                let stop = Arc::clone(&stop);
                move || {
                    let (lock, wake) = &*stop;
                    let mut stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
                    while !*stopped {
                        let (guard, _) = wake
                            .wait_timeout(stopped, period)
                            .unwrap_or_else(|e| e.into_inner());
                        stopped = guard;
                        if !*stopped {
                            let line = progress_line(&registry.snapshot());
                            // A closed stderr only loses the line.
                            let _ = writeln!(std::io::stderr(), "{line}");
                        }
                    }
                }
            })
            .ok();
        Progress { stop, thread }
    }

    /// Whether the printing thread runs (it could not be spawned
    /// otherwise; progress is then silently absent).
    pub fn is_running(&self) -> bool {
        self.thread.is_some()
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        let (lock, wake) = &*self.stop;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_rates_checkpoint_and_restarts() {
        let registry = crate::metrics::registry::two_operator_registry(1);
        registry.checkpoint_triggered(3, false, 2);
        registry.checkpoint_completed(3, 2048, &[]);
        let line = progress_line(&registry.snapshot());
        assert!(line.contains("job: sources 0/s, sinks 0/s"), "{line}");
        assert!(line.contains("checkpoint 3 ("), "{line}");
        assert!(line.contains("2.0 KiB), restarts 0"), "{line}");
        assert!(!line.contains("lag"), "no source knows its lag: {line}");
        let progress = Progress::start(Arc::new(registry), 100);
        assert!(progress.is_running());
        drop(progress);
    }

    #[test]
    fn the_line_shows_the_sources_lag_summed_over_subtasks() {
        let registry = crate::metrics::registry::two_operator_registry(2);
        let source = |subtask| registry.cell(0, subtask).expect("a source cell");
        source(0).set_pending(Some(1_500), None);
        source(1).set_pending(Some(700), None);
        let line = progress_line(&registry.snapshot());
        assert!(
            line.contains("sources 0/s, lag 2.2 k records, sinks"),
            "{line}"
        );
        source(0).set_pending(Some(0), Some(3 << 20));
        source(1).set_pending(Some(4), Some(0));
        let line = progress_line(&registry.snapshot());
        assert!(line.contains(", lag 4 records, 3.0 MiB, sinks"), "{line}");
    }
}
