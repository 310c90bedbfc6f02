//! The job's tracing: one span per job, per operator instance (subtask)
//! and per checkpoint, and events for checkpoint trigger, completion and
//! abort and for restarts, carrying ids and durations. A small layer
//! records every span and event of one job that fails once inside a
//! checkpoint (so that checkpoint is aborted and its region restarts).
//!
//! The layer is the process-wide default subscriber (the job runs on its
//! own threads), so this file holds exactly one test.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use snapflow::job::{Job, JobConfig, RestartStrategy};
use snapflow::sink::CollectHandle;
use snapflow::Snapshot;
use snapflow_tests::damage::{self, Crash, Dirs, Harm, Target};
use snapflow_tests::pipeline::{FailFirstPreCommit, PacedSourceFactory, Pacing};
use snapflow_tests::TestRng;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

/// Field name → value as text.
type Fields = BTreeMap<String, String>;

#[derive(Debug, Clone)]
struct SpanRecord {
    name: String,
    parent: Option<String>,
    fields: Fields,
}

#[derive(Debug, Clone)]
struct EventRecord {
    /// The span the event happened in (its name and fields).
    span: Option<(String, Fields)>,
    fields: Fields,
    level: tracing::Level,
}

impl EventRecord {
    fn message(&self) -> &str {
        self.fields.get("message").map_or("", String::as_str)
    }
}

/// What the layer saw.
#[derive(Default)]
struct Seen {
    spans: Vec<SpanRecord>,
    events: Vec<EventRecord>,
}

struct FieldText<'a>(&'a mut Fields);

impl Visit for FieldText<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// Span fields are kept in the span's extensions, for its events.
struct SpanFields(Fields);

struct Recorder(Arc<Mutex<Seen>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attributes: &Attributes<'_>, id: &Id, context: Context<'_, S>) {
        let mut fields = Fields::new();
        attributes.record(&mut FieldText(&mut fields));
        let Some(span) = context.span(id) else {
            return;
        };
        let parent = span.parent().map(|parent| parent.name().to_owned());
        span.extensions_mut().insert(SpanFields(fields.clone()));
        let record = SpanRecord {
            name: span.name().to_owned(),
            parent,
            fields,
        };
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .spans
            .push(record);
    }

    fn on_event(&self, event: &Event<'_>, context: Context<'_, S>) {
        let mut fields = Fields::new();
        event.record(&mut FieldText(&mut fields));
        let span = context.event_span(event).map(|span| {
            let fields = span
                .extensions()
                .get::<SpanFields>()
                .map(|fields| fields.0.clone())
                .unwrap_or_default();
            (span.name().to_owned(), fields)
        });
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .events
            .push(EventRecord {
                span,
                fields,
                level: *event.metadata().level(),
            });
    }
}

#[derive(Snapshot, Default, Clone, Debug)]
struct Count {
    seen: u64,
}

/// What the layer saw since the last call.
fn take_seen(seen: &Mutex<Seen>) -> Seen {
    std::mem::take(&mut *seen.lock().unwrap_or_else(PoisonError::into_inner))
}

/// Runs the traced job and returns what the layer saw.
fn traced_run(seen: &Arc<Mutex<Seen>>) -> Seen {
    tracing_subscriber::registry()
        .with(Recorder(Arc::clone(seen)))
        .try_init()
        .expect("the only subscriber of this test binary");
    let job = Job::new(
        "traced",
        JobConfig {
            checkpoint_interval_ms: Some(5),
            default_parallelism: 2,
            restart: RestartStrategy::FixedDelay {
                attempts_max: 1,
                delay_ms: 0,
            },
            batch_size_max: 8,
            arbiters: Some(2),
            ..JobConfig::default()
        },
    );
    let output = CollectHandle::new();
    let sink = FailFirstPreCommit::new(output.clone(), true);
    let pacing = Pacing {
        records_per_read: 8,
    };
    job.source("numbers", PacedSourceFactory::new(400, pacing))
        .key_by(|n: &u64| n % 7)
        .process("count", |key: &u64, count: &mut Count, _n: u64, out| {
            count.seen += 1;
            if count.seen == 1 {
                tracing::info!(key, "first record of a key");
            }
            out.emit((*key, count.seen));
            Ok(())
        })
        .sink("collect", sink);
    let report = job.run().expect("the job recovers");
    assert_eq!(report.restarts.len(), 1);
    assert_eq!(output.committed().len(), 400);
    take_seen(seen)
}

fn span<'a>(seen: &'a Seen, name: &str, field: &str, value: &str) -> Option<&'a SpanRecord> {
    seen.spans.iter().find(|span| {
        span.name == name && span.fields.get(field).is_some_and(|found| found == value)
    })
}

fn events<'a>(seen: &'a Seen, message: &str) -> Vec<&'a EventRecord> {
    seen.events
        .iter()
        .filter(|event| event.message() == message)
        .collect()
}

/// Every `message` event has each of `fields` and happens in a span
/// named `span_name` (when given).
fn check_events(seen: &Seen, message: &str, fields: &[&str], span_name: Option<&str>) {
    let found = events(seen, message);
    assert!(!found.is_empty(), "no `{message}` event");
    for event in found {
        for field in fields {
            assert!(event.fields.contains_key(*field), "{field} in {event:?}");
        }
        if let Some(name) = span_name {
            let inside = event.span.as_ref().map(|(span, _)| span.as_str());
            assert_eq!(inside, Some(name), "{event:?}");
        }
    }
}

#[test]
fn job_subtask_and_checkpoint_spans_and_events_are_traced() {
    let recorder = Arc::new(Mutex::new(Seen::default()));
    let seen = traced_run(&recorder);
    let job = span(&seen, "job", "job", "traced").expect("a job span");
    assert_eq!(job.parent, None);
    for subtask in ["0", "1"] {
        let instance = seen
            .spans
            .iter()
            .find(|span| {
                span.name == "subtask"
                    && span.fields.get("operator").map(String::as_str) == Some("count")
                    && span.fields.get("subtask").map(String::as_str) == Some(subtask)
            })
            .unwrap_or_else(|| panic!("a span for count[{subtask}]"));
        assert_eq!(instance.parent.as_deref(), Some("job"));
        assert!(instance.fields.contains_key("generation"));
    }
    // User code runs inside its operator instance's span: a process
    // function's event names the subtask that ran it.
    let user_events = events(&seen, "first record of a key");
    assert!(
        user_events.len() >= 7,
        "one per key at least: {user_events:?}"
    );
    for event in user_events {
        let (name, fields) = event.span.as_ref().expect("inside a span");
        assert_eq!(name, "subtask", "{event:?}");
        assert_eq!(fields.get("operator").map(String::as_str), Some("count"));
    }
    let checkpoint = span(&seen, "checkpoint", "checkpoint", "1").expect("checkpoint 1's span");
    assert_eq!(checkpoint.parent.as_deref(), Some("job"));
    let checkpoint_fields = ["checkpoint"];
    check_events(
        &seen,
        "checkpoint triggered",
        &checkpoint_fields,
        Some("checkpoint"),
    );
    check_events(
        &seen,
        "checkpoint complete",
        &["checkpoint", "duration_ms", "size_bytes"],
        Some("checkpoint"),
    );
    check_events(
        &seen,
        "checkpoint aborted",
        &["checkpoint", "duration_ms", "reason"],
        Some("checkpoint"),
    );
    let aborted = events(&seen, "checkpoint aborted");
    assert!(
        aborted
            .iter()
            .any(|event| event.fields.get("checkpoint").map(String::as_str) == Some("1")),
        "checkpoint 1 was in flight at the failure: {aborted:?}"
    );
    // Each checkpoint's events share one span: the completion of a
    // checkpoint is reported in the span of the same checkpoint.
    for event in events(&seen, "checkpoint complete") {
        let (_, fields) = event.span.as_ref().expect("inside a span");
        assert_eq!(fields.get("checkpoint"), event.fields.get("checkpoint"));
    }
    check_events(
        &seen,
        "restarting a failover region",
        &["region", "attempt", "delay_ms", "cause"],
        Some("job"),
    );
    check_events(
        &seen,
        "region restarted",
        &[
            "region",
            "attempt",
            "delay_ms",
            "cause",
            "restored_from",
            "generation",
            "recovery_ms",
        ],
        Some("job"),
    );
    for event in events(&seen, "region restarted") {
        assert_eq!(event.level, tracing::Level::WARN, "{event:?}");
    }
    check_events(
        &seen,
        "checkpoints are kept in memory and end with the job",
        &[],
        Some("job"),
    );
    check_fallback_events(&recorder);
    check_default_interval_event(&recorder);
}

/// A fallback past a damaged part is a warning that names the file.
fn check_fallback_events(recorder: &Mutex<Seen>) {
    let root = tempfile::tempdir().expect("a temporary directory");
    let dirs = Dirs::under(root.path());
    let _ = damage::crash_run(&dirs, Crash::BeforeCommit(3));
    let newest = *damage::checkpoint_ids(&dirs).last().expect("a checkpoint");
    let part = damage::newest_file(&dirs, newest, Target::NewestPart, "count");
    damage::apply(&part, Harm::Truncate, &mut TestRng::new(1));
    take_seen(recorder);
    damage::resume(&dirs, false, Duration::from_secs(60)).expect("the fallback runs");
    let seen = take_seen(recorder);
    let message = "skipping a damaged checkpoint; falling back to an older one";
    check_events(&seen, message, &["checkpoint", "reason", "set_aside"], None);
    let warned = events(&seen, message);
    let event = warned
        .iter()
        .find(|event| event.fields.get("checkpoint") == Some(&newest.to_string()))
        .unwrap_or_else(|| panic!("no warning for checkpoint {newest}: {warned:?}"));
    assert_eq!(event.level, tracing::Level::WARN);
    let reason = &event.fields["reason"];
    assert!(reason.contains(&*part.to_string_lossy()), "{reason}");
    check_events(
        &seen,
        "checkpoints are stored in this directory",
        &["location"],
        Some("job"),
    );
}

/// A store without an interval takes the default one, and says so.
fn check_default_interval_event(recorder: &Mutex<Seen>) {
    let root = tempfile::tempdir().expect("a temporary directory");
    let config = JobConfig::default()
        .with_store_dir(root.path(), "defaults")
        .expect("a store");
    let job = Job::new("defaults", config);
    job.source(
        "numbers",
        PacedSourceFactory::new(
            10,
            Pacing {
                records_per_read: 5,
            },
        ),
    )
    .sink("collect", CollectHandle::new());
    take_seen(recorder);
    job.run().expect("the job runs");
    let seen = take_seen(recorder);
    let said = seen.events.iter().find(|event| {
        event.message().contains("no checkpoint_interval_ms")
            && event.fields.get("interval_ms").map(String::as_str) == Some("10000")
    });
    assert!(said.is_some(), "no word of the default interval");
}
