//! Renders a [`JobMetrics`] snapshot as Prometheus text (the OpenMetrics
//! text format, which Prometheus scrapes), through the `prometheus-client`
//! crate's encoder, so names, labels, escaping and the `# EOF` line follow
//! the specification rather than our own formatting.
//!
//! A fresh `prometheus_client` registry is filled from each snapshot: the
//! job's own counters live in [`crate::metrics`], and this is only their
//! exposition. Help texts have no final period: the encoder adds one.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::metrics::{JobMetrics, SubtaskMetrics};

/// The content type of the exposition.
pub(super) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(String, String)>;
type Counters = Family<Labels, Counter>;
type Gauges = Family<Labels, Gauge<f64, AtomicU64>>;

fn subtask_labels(job: &str, operator: &str, subtask: usize) -> Labels {
    vec![
        ("job".into(), job.into()),
        ("operator".into(), operator.into()),
        ("subtask".into(), subtask.to_string()),
    ]
}

fn counter(registry: &mut Registry, name: &str, help: &str) -> Counters {
    let family = Counters::default();
    registry.register(name, help, family.clone());
    family
}

fn gauge(registry: &mut Registry, name: &str, help: &str) -> Gauges {
    let family = Gauges::default();
    registry.register(name, help, family.clone());
    family
}

/// The subtask families, filled per operator instance.
struct SubtaskFamilies {
    records_in: Counters,
    records_out: Counters,
    busy: Gauges,
    idle: Gauges,
    backpressured: Gauges,
    watermark: Gauges,
    bytes_in: Counters,
    bytes_out: Counters,
    pending_records: Gauges,
    pending_bytes: Gauges,
    split_position: Gauges,
    split_pending_records: Gauges,
    records_dropped: Counters,
}

impl SubtaskFamilies {
    fn register(registry: &mut Registry) -> Self {
        SubtaskFamilies {
            records_in: counter(registry, "snapflow_records_in", "Records taken as input"),
            records_out: counter(registry, "snapflow_records_out", "Records sent on outputs"),
            busy: gauge(
                registry,
                "snapflow_busy_ms_per_second",
                "Milliseconds per second spent processing",
            ),
            idle: gauge(
                registry,
                "snapflow_idle_ms_per_second",
                "Milliseconds per second with nothing to do",
            ),
            backpressured: gauge(
                registry,
                "snapflow_backpressured_ms_per_second",
                "Milliseconds per second waiting for credit on an output",
            ),
            watermark: gauge(
                registry,
                "snapflow_watermark_ms",
                "The event-time watermark the subtask sent on last",
            ),
            bytes_in: counter(
                registry,
                "snapflow_bytes_in",
                "Bytes a source read from outside the job",
            ),
            bytes_out: counter(
                registry,
                "snapflow_bytes_out",
                "Bytes a sink wrote outside the job",
            ),
            pending_records: gauge(
                registry,
                "snapflow_source_pending_records",
                "Records a source knows exist and has not read yet (its lag)",
            ),
            pending_bytes: gauge(
                registry,
                "snapflow_source_pending_bytes",
                "Bytes a source knows exist and has not read yet",
            ),
            split_position: gauge(
                registry,
                "snapflow_source_split_position",
                "The position of a split's next record (a Kafka offset, a byte offset)",
            ),
            split_pending_records: gauge(
                registry,
                "snapflow_source_split_pending_records",
                "Records of a split not read yet",
            ),
            records_dropped: counter(
                registry,
                "snapflow_source_records_dropped",
                "Records a source read and dropped as bad (replayed ones counted again)",
            ),
        }
    }

    /// The figures only sources and sinks have.
    fn fill_connector(&self, labels: &Labels, subtask: &SubtaskMetrics) {
        if let Some(bytes) = subtask.bytes_in {
            self.bytes_in.get_or_create(labels).inc_by(bytes);
        }
        if let Some(bytes) = subtask.bytes_out {
            self.bytes_out.get_or_create(labels).inc_by(bytes);
        }
        if let Some(records) = subtask.pending_records {
            self.pending_records
                .get_or_create(labels)
                .set(records as f64);
        }
        if let Some(bytes) = subtask.pending_bytes {
            self.pending_bytes.get_or_create(labels).set(bytes as f64);
        }
        if let Some(records) = subtask.records_dropped {
            self.records_dropped.get_or_create(labels).inc_by(records);
        }
        for split in &subtask.splits {
            let mut labels = labels.clone();
            labels.push(("split".into(), split.split.clone()));
            self.split_position
                .get_or_create(&labels)
                .set(split.position as f64);
            if let Some(records) = split.pending_records {
                self.split_pending_records
                    .get_or_create(&labels)
                    .set(records as f64);
            }
        }
    }

    fn fill(&self, metrics: &JobMetrics) {
        for operator in &metrics.operators {
            for subtask in &operator.subtasks {
                let labels = subtask_labels(&metrics.job, &operator.name, subtask.subtask);
                self.records_in
                    .get_or_create(&labels)
                    .inc_by(subtask.records_in);
                self.records_out
                    .get_or_create(&labels)
                    .inc_by(subtask.records_out);
                self.busy
                    .get_or_create(&labels)
                    .set(subtask.busy_ms_per_second);
                self.idle
                    .get_or_create(&labels)
                    .set(subtask.idle_ms_per_second);
                self.backpressured
                    .get_or_create(&labels)
                    .set(subtask.backpressured_ms_per_second);
                if let Some(watermark_ms) = subtask.watermark_ms {
                    self.watermark
                        .get_or_create(&labels)
                        .set(watermark_ms as f64);
                }
                self.fill_connector(&labels, subtask);
            }
        }
    }
}

fn fill_job(registry: &mut Registry, metrics: &JobMetrics) {
    let job: Labels = vec![("job".into(), metrics.job.clone())];
    let fill = gauge(
        registry,
        "snapflow_channel_fill",
        "Batches in flight on a channel over its window (0 when unbounded)",
    );
    for channel in &metrics.channels {
        let labels = vec![
            ("job".into(), metrics.job.clone()),
            ("from".into(), channel.from.0.clone()),
            ("from_subtask".into(), channel.from.1.to_string()),
            ("to".into(), channel.to.0.clone()),
            ("to_subtask".into(), channel.to.1.to_string()),
        ];
        fill.get_or_create(&labels).set(channel.fill);
    }
    let counters = [
        (
            "snapflow_checkpoints_completed",
            "Checkpoints completed",
            metrics.checkpoints_completed,
        ),
        (
            "snapflow_checkpoints_failed",
            "Checkpoints failed or aborted",
            metrics.checkpoints_failed,
        ),
        (
            "snapflow_restarts",
            "Restarts of failover regions",
            metrics.restarts_total,
        ),
    ];
    for (name, help, value) in counters {
        counter(registry, name, help)
            .get_or_create(&job)
            .inc_by(value);
    }
    gauge(
        registry,
        "snapflow_uptime_ms",
        "Milliseconds since the job started",
    )
    .get_or_create(&job)
    .set(metrics.uptime_ms as f64);
    if let Some(last) = metrics.last_completed_checkpoint() {
        let gauges = [
            (
                "snapflow_last_checkpoint_id",
                "The id of the newest completed checkpoint",
                last.id as f64,
            ),
            (
                "snapflow_last_checkpoint_duration_ms",
                "From trigger to durable commit of the newest completed checkpoint",
                last.duration_ms as f64,
            ),
            (
                "snapflow_last_checkpoint_size_bytes",
                "Bytes of the newest completed checkpoint",
                last.size_bytes as f64,
            ),
            (
                "snapflow_last_checkpoint_alignment_us",
                "The longest barrier alignment of the newest completed checkpoint",
                last.alignment_max_us as f64,
            ),
        ];
        for (name, help, value) in gauges {
            gauge(registry, name, help).get_or_create(&job).set(value);
        }
    }
}

/// The exposition of `metrics`.
pub fn render(metrics: &JobMetrics) -> String {
    let mut registry = Registry::default();
    SubtaskFamilies::register(&mut registry).fill(metrics);
    fill_job(&mut registry, metrics);
    let mut text = String::new();
    if let Err(error) = encode(&mut text, &registry) {
        // Writing into a String fails only on a formatting bug.
        text = format!("# the exposition could not be written: {error}\n# EOF\n");
    }
    text
}
