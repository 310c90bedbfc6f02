//! What the tool prints: one serializable report per command, written as
//! readable text or, with `--json`, as one JSON document. It reads the
//! loaded checkpoints it is given and never touches the store.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use snapflow::job::inspect::{CheckpointView, StoredState};
use snapflow::keyed::part::PartDescription;
use snapflow::state::StoredSchema;
use snapflow::storage::{CheckpointKind, LoadedCheckpoint};

use crate::store::JobEntries;

/// One entry of a listing.
#[derive(Debug, Serialize)]
pub struct EntryRow {
    /// The checkpoint's id.
    pub id: u64,
    /// `checkpoint` or `savepoint`.
    pub kind: &'static str,
    /// When it was triggered, ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// Its parts.
    pub parts: usize,
    /// The sum of its parts' sizes.
    pub bytes: u64,
}

/// A job's entries.
#[derive(Debug, Serialize)]
pub struct JobListing {
    /// The job.
    pub job: String,
    /// Its checkpoints and savepoints, oldest first.
    pub entries: Vec<EntryRow>,
    /// Checkpoints set aside as damaged.
    pub damaged: Vec<u64>,
}

/// The listing of `list`.
pub fn listing(jobs: Vec<JobEntries>) -> Vec<JobListing> {
    jobs.into_iter()
        .map(|job| JobListing {
            job: job.job,
            entries: job
                .entries
                .iter()
                .map(|entry| EntryRow {
                    id: entry.checkpoint,
                    kind: kind_name(entry.kind),
                    created_unix_ms: entry.created_unix_ms,
                    parts: entry.part_count,
                    bytes: entry.total_bytes,
                })
                .collect(),
            damaged: job.damaged.clone(),
        })
        .collect()
}

fn kind_name(kind: CheckpointKind) -> &'static str {
    match kind {
        CheckpointKind::Checkpoint => "checkpoint",
        CheckpointKind::Savepoint => "savepoint",
    }
}

/// The listing as text.
pub fn listing_text(jobs: &[JobListing]) -> String {
    let mut text = String::new();
    for job in jobs {
        let _ = writeln!(text, "job {}", job.job);
        if job.entries.is_empty() {
            let _ = writeln!(text, "  no complete checkpoint");
        }
        for entry in &job.entries {
            let _ = writeln!(
                text,
                "  {:<10} {:>6}  created {}  {} parts  {} bytes",
                entry.kind, entry.id, entry.created_unix_ms, entry.parts, entry.bytes
            );
        }
        for id in &job.damaged {
            let _ = writeln!(text, "  damaged    {id:>6}  set aside by a recovery");
        }
    }
    text
}

/// One part of a shown checkpoint.
#[derive(Debug, Serialize)]
pub struct PartRow {
    /// Its operator.
    pub operator: String,
    /// Its subtask.
    pub subtask: u32,
    /// Its size as stored.
    pub bytes: u64,
    /// Its CRC-32 as recorded (and verified on load).
    pub crc32: String,
    /// The operator state's bytes inside the part.
    pub state_bytes: usize,
    /// Recorded in-flight channels with records.
    pub recorded_channels: usize,
    /// What the operator state holds, as far as it describes itself.
    pub state: StateRow,
}

/// An operator state described without its types.
#[derive(Debug, Serialize)]
#[serde(tag = "layout", rename_all = "snake_case")]
pub enum StateRow {
    /// No state (map, filter, flat_map).
    Empty,
    /// One state blob.
    Blob {
        /// Its stored schema.
        schema: SchemaRow,
    },
    /// Keyed state.
    Keyed {
        /// Key groups in the part.
        key_groups: usize,
        /// (key, state) entries over them.
        entries: u64,
        /// The distinct schemas of the key groups (one, unless the part
        /// is corrupt or mixes writers).
        schemas: Vec<SchemaRow>,
    },
    /// A timed keyed operator (timers, windows, state time-to-live).
    Timed {
        /// Key groups in the part.
        key_groups: usize,
        /// (key, state) entries over them: for windows, keys with open
        /// windows.
        entries: u64,
        /// Keys that have at least one timer.
        keys_with_timers: u64,
        /// The watermark the operator last saw.
        watermark_ms: Option<u64>,
        /// The distinct schemas of the user state's key groups.
        schemas: Vec<SchemaRow>,
    },
    /// A custom operator's instance.
    Operator {
        /// Whether its input had ended.
        ended: bool,
        /// The instance's stored schema.
        schema: SchemaRow,
    },
    /// A layout only its writer reads (a source position, a sink's
    /// state).
    Opaque,
}

impl StateRow {
    fn of(state: StoredState) -> StateRow {
        match state {
            StoredState::Empty => StateRow::Empty,
            StoredState::Blob(schema) => StateRow::Blob {
                schema: SchemaRow::of(schema),
            },
            StoredState::Keyed(groups) => StateRow::Keyed {
                key_groups: groups.len(),
                entries: entries(&groups),
                schemas: schemas(&groups),
            },
            StoredState::Timed {
                state,
                timers,
                watermark_ms,
            } => StateRow::Timed {
                key_groups: state.len(),
                entries: entries(&state),
                keys_with_timers: entries(&timers),
                watermark_ms,
                schemas: schemas(&state),
            },
            StoredState::Operator { ended, schema } => StateRow::Operator {
                ended,
                schema: SchemaRow::of(schema),
            },
            // `StoredState` may grow; what this tool does not know is
            // shown as opaque.
            _ => StateRow::Opaque,
        }
    }

    fn text(&self) -> String {
        match self {
            StateRow::Empty => "no state".to_string(),
            StateRow::Blob { schema } => format!("blob {}", schema.text()),
            StateRow::Keyed {
                key_groups,
                entries,
                schemas,
            } => {
                let schemas: Vec<String> = schemas.iter().map(SchemaRow::text).collect();
                format!(
                    "keyed: {key_groups} key groups, {entries} entries, {}",
                    schemas.join("; ")
                )
            }
            StateRow::Timed {
                key_groups,
                entries,
                keys_with_timers,
                watermark_ms,
                schemas,
            } => {
                let schemas: Vec<String> = schemas.iter().map(SchemaRow::text).collect();
                let watermark = watermark_ms.map_or("none".to_string(), |ms| ms.to_string());
                format!(
                    "timed: {key_groups} key groups, {entries} entries, {keys_with_timers} keys \
                     with timers, watermark {watermark}, {}",
                    schemas.join("; ")
                )
            }
            StateRow::Operator { ended, schema } => {
                format!("operator (input ended: {ended}) {}", schema.text())
            }
            StateRow::Opaque => "opaque (read by its writer only)".to_string(),
        }
    }
}

/// The entries over key groups.
fn entries(groups: &[PartDescription]) -> u64 {
    groups.iter().map(|group| group.entries).sum()
}

/// The distinct schemas of key groups, in order of first appearance (one,
/// unless the part is corrupt or mixes writers).
fn schemas(groups: &[PartDescription]) -> Vec<SchemaRow> {
    let mut schemas: Vec<SchemaRow> = Vec::new();
    for group in groups {
        let schema = SchemaRow::of(group.schema.clone());
        if !schemas.contains(&schema) {
            schemas.push(schema);
        }
    }
    schemas
}

/// A state blob's stored schema.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct SchemaRow {
    /// The writer's type name.
    pub type_name: String,
    /// The writer's version.
    pub version: u32,
    /// `name: type` lines.
    pub fields: Vec<String>,
}

impl SchemaRow {
    fn of(schema: StoredSchema) -> SchemaRow {
        SchemaRow {
            type_name: schema.type_name,
            version: schema.version,
            fields: schema.fields,
        }
    }

    fn text(&self) -> String {
        format!(
            "{} v{} {{ {} }}",
            self.type_name,
            self.version,
            self.fields.join(", ")
        )
    }
}

/// The report of `show`.
#[derive(Debug, Serialize)]
pub struct Shown {
    /// The entry's directory.
    pub directory: String,
    /// The job.
    pub job: String,
    /// The id.
    pub id: u64,
    /// `checkpoint` or `savepoint`.
    pub kind: &'static str,
    /// When it was triggered.
    pub created_unix_ms: u64,
    /// The sum of part sizes.
    pub bytes: u64,
    /// Key groups (the max parallelism; 0 without keyed state).
    pub key_groups: u32,
    /// Each operator's parallelism when it was taken.
    pub operators: BTreeMap<String, u32>,
    /// Every part, sorted.
    pub parts: Vec<PartRow>,
    /// Each source subtask's position as hex.
    pub source_positions: BTreeMap<String, String>,
    /// Free user metadata.
    pub user: BTreeMap<String, String>,
}

/// The report of `show` for a loaded (and so verified) checkpoint.
///
/// # Errors
///
/// A part whose layout is not the job layer's (its reason).
pub fn shown(loaded: LoadedCheckpoint, directory: &Path) -> Result<Shown, String> {
    let metadata = loaded.metadata.clone();
    let view = CheckpointView::from_loaded(loaded).map_err(|error| error.to_string())?;
    let parts = metadata
        .parts
        .iter()
        .map(|info| {
            let part = view
                .part(&info.part.operator, info.part.subtask)
                .map_err(|error| error.to_string())?;
            Ok(PartRow {
                operator: info.part.operator.clone(),
                subtask: info.part.subtask,
                bytes: info.size_bytes,
                crc32: format!("{:08x}", info.crc32),
                state_bytes: part.state_bytes().len(),
                recorded_channels: part.channels().count(),
                state: StateRow::of(part.stored_state()),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Shown {
        directory: directory.display().to_string(),
        job: metadata.job.clone(),
        id: metadata.checkpoint,
        kind: kind_name(metadata.kind),
        created_unix_ms: metadata.created_unix_ms,
        bytes: metadata.total_bytes(),
        key_groups: metadata.key_groups.max_parallelism,
        operators: metadata.key_groups.operator_parallelism.clone(),
        parts,
        source_positions: metadata
            .source_positions
            .iter()
            .map(|(part, bytes)| (part.to_string(), hex(bytes)))
            .collect(),
        user: metadata.user.clone(),
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut text, byte| {
        let _ = write!(text, "{byte:02x}");
        text
    })
}

/// `show` as text.
pub fn shown_text(shown: &Shown) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "{} {} of job {}: created {}, {} bytes, {} key groups, in {}",
        shown.kind,
        shown.id,
        shown.job,
        shown.created_unix_ms,
        shown.bytes,
        shown.key_groups,
        shown.directory
    );
    for (operator, parallelism) in &shown.operators {
        let _ = writeln!(text, "  operator {operator}: parallelism {parallelism}");
    }
    for part in &shown.parts {
        let _ = writeln!(
            text,
            "  part {}[{}]: {} bytes, crc32 {}, state {} bytes, {} recorded channels",
            part.operator,
            part.subtask,
            part.bytes,
            part.crc32,
            part.state_bytes,
            part.recorded_channels
        );
        let _ = writeln!(text, "    state: {}", part.state.text());
    }
    for (part, position) in &shown.source_positions {
        let _ = writeln!(text, "  source position {part}: {position}");
    }
    for (key, value) in &shown.user {
        let _ = writeln!(text, "  metadata {key} = {value}");
    }
    text
}

/// One checkpoint's verdict.
#[derive(Debug, Serialize)]
pub struct Verdict {
    /// The id.
    pub id: u64,
    /// Whether every part is present and matches its size and checksum.
    pub ok: bool,
    /// Why not.
    pub problem: Option<String>,
}

/// `verify` as text.
pub fn verdicts_text(job: &str, verdicts: &[Verdict]) -> String {
    let mut text = String::new();
    for verdict in verdicts {
        let _ = match &verdict.problem {
            None => writeln!(text, "job {job} checkpoint {}: OK", verdict.id),
            Some(problem) => writeln!(
                text,
                "job {job} checkpoint {}: DAMAGED: {problem}",
                verdict.id
            ),
        };
    }
    text
}
