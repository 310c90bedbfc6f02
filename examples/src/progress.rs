//! Live progress: a `tracing` layer that turns the job supervisor's events
//! (checkpoint complete, restarting, generation started) into one readable
//! line each, as they happen.
//!
//! This module owns only the wording of those lines. It never changes what
//! the job does; if the supervisor renames an event, the line simply stops
//! appearing (the summary printed from the `JobReport` after the run still
//! shows every checkpoint and restart).

use std::collections::BTreeMap;
use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

/// Installs the progress printer as the global subscriber (once; later
/// calls, or a subscriber installed by someone else, win silently).
pub fn install() {
    let _ = tracing_subscriber::registry()
        .with(ProgressLayer)
        .try_init();
}

/// The layer; see the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProgressLayer;

/// The fields of one event, as text.
#[derive(Default)]
struct Fields {
    message: String,
    values: BTreeMap<&'static str, String>,
}

impl Fields {
    fn get(&self, name: &str) -> &str {
        self.values.get(name).map_or("?", String::as_str)
    }

    /// `message (name=value, ...)`.
    fn plain(&self) -> String {
        let values: Vec<String> = self
            .values
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        format!("{} ({})", self.message, values.join(", "))
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.values.insert(field.name(), text);
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            self.values.insert(field.name(), value.to_owned());
        }
    }
}

impl<S: Subscriber> Layer<S> for ProgressLayer {
    fn on_event(&self, event: &Event<'_>, _context: Context<'_, S>) {
        let metadata = event.metadata();
        if !metadata.target().starts_with("snapflow") {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        if let Some(line) = describe(&fields) {
            println!("  {line}");
        } else if *metadata.level() <= Level::WARN && !WORDED_ELSEWHERE.contains(&&*fields.message)
        {
            // Every warning and error is shown, worded or not: a fallback
            // past a damaged checkpoint, a failure that ends the job.
            println!("  {}: {}", metadata.level(), fields.plain());
        }
    }
}

/// Warnings that another line already tells: "region restarted" is the
/// "recovered: ..." line of "generation started".
const WORDED_ELSEWHERE: [&str; 1] = ["region restarted"];

/// The readable line of a supervisor event, or `None` to stay quiet.
fn describe(fields: &Fields) -> Option<String> {
    match fields.message.as_str() {
        "checkpoint complete" => Some(format!(
            "checkpoint {} complete: {} bytes in {} ms",
            fields.get("checkpoint"),
            fields.get("size_bytes"),
            fields.get("duration_ms")
        )),
        "restarting a failover region" => Some(format!(
            "CRASH: {}; restarting (attempt {})",
            fields.get("cause"),
            fields.get("attempt")
        )),
        // The first generation is 1; a job resumed from an earlier run's
        // checkpoint also names it in its first generation.
        "generation started" => {
            let restored = fields.values.get("restored_from");
            match (fields.get("generation"), restored) {
                ("1", None) => None,
                ("1", Some(checkpoint)) => Some(format!("resumed from checkpoint {checkpoint}")),
                (generation, Some(checkpoint)) => Some(format!(
                    "recovered: generation {generation} restored checkpoint {checkpoint}, \
                     sources rewound to its positions"
                )),
                (generation, None) => Some(format!(
                    "recovered: generation {generation} starts over (no checkpoint yet)"
                )),
            }
        }
        "checkpoint aborted" => Some(format!("checkpoint {} aborted", fields.get("checkpoint"))),
        "job failed" => Some(format!("job failed: {}", fields.get("cause"))),
        _ => None,
    }
}
