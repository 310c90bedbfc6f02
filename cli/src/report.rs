//! What the tool prints: one serializable report per command, written as
//! readable text or, with `--json`, as one JSON document. It reads the
//! loaded checkpoints it is given and never touches the store.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use snapflow::job::inspect::{CheckpointView, OperatorRole};
use snapflow::storage::{CheckpointKind, Leftover, LoadedCheckpoint};

use crate::state::{PositionRow, StateRow};
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
    /// The sources and sinks among them, as the checkpoint records them
    /// (`source` or `sink`; absent in checkpoints written before roles
    /// were recorded).
    pub roles: BTreeMap<String, &'static str>,
    /// Every part, sorted.
    pub parts: Vec<PartRow>,
    /// Each source subtask's position (from its part, and from the
    /// metadata's positions where a writer put them there), decoded where
    /// its layout is known (a built-in source's index, Kafka offsets per
    /// partition).
    pub source_positions: BTreeMap<String, PositionRow>,
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
                state: StateRow::of(part, view.operator_role(&info.part.operator)),
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
        roles: metadata
            .key_groups
            .operator_parallelism
            .keys()
            .filter_map(|operator| Some((operator.clone(), view.operator_role(operator)?.name())))
            .collect(),
        parts,
        source_positions: source_positions(&view, &metadata),
        user: metadata.user.clone(),
    })
}

/// Every source subtask's position: its part's state, and what the
/// metadata lists.
fn source_positions(
    view: &CheckpointView,
    metadata: &snapflow::storage::CheckpointMetadata,
) -> BTreeMap<String, PositionRow> {
    let mut positions: BTreeMap<String, PositionRow> = view
        .parts()
        .filter(|part| view.operator_role(&part.id().operator) == Some(OperatorRole::Source))
        .map(|part| (part.id().to_string(), PositionRow::of(part.state_bytes())))
        .collect();
    for (part, bytes) in &metadata.source_positions {
        positions.insert(part.to_string(), PositionRow::of(bytes));
    }
    positions
}

/// Metadata the job layer writes for tools (operator roles), shown as
/// roles rather than as user metadata.
const ROLE_PREFIX: &str = "snapflow.role.";

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
        let role = shown
            .roles
            .get(operator)
            .map_or(String::new(), |role| format!(", {role}"));
        let _ = writeln!(
            text,
            "  operator {operator}: parallelism {parallelism}{role}"
        );
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
        let _ = writeln!(text, "  source position {part}: {}", position.text());
    }
    for (key, value) in shown
        .user
        .iter()
        .filter(|(key, _)| !key.starts_with(ROLE_PREFIX))
    {
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

/// What `verify` found: a verdict per checkpoint and savepoint, and
/// what else the job's directory holds.
#[derive(Debug, Serialize)]
pub struct Verified {
    /// One per entry, oldest first; an entry whose metadata does not read
    /// is one too (damaged).
    pub checkpoints: Vec<Verdict>,
    /// Leftovers: entries that never committed, entries set aside as
    /// damaged, shared files nothing refers to. They do not fail `verify`.
    pub leftovers: Vec<LeftoverRow>,
}

/// One leftover.
#[derive(Debug, Serialize)]
pub struct LeftoverRow {
    /// `incomplete`, `set aside` or `unreferenced shared file`.
    pub kind: &'static str,
    /// The checkpoint or savepoint id, where there is one.
    pub id: Option<u64>,
    /// `checkpoint` or `savepoint`, where it is one.
    pub entry: Option<&'static str>,
    /// Where it is.
    pub path: String,
}

/// The verdicts and leftover rows of `leftovers`: an entry whose
/// metadata does not read is a damaged entry, the others are leftovers.
pub fn split_leftovers(leftovers: Vec<Leftover>) -> (Vec<Verdict>, Vec<LeftoverRow>) {
    let entry = |kind: CheckpointKind| match kind {
        CheckpointKind::Checkpoint => "checkpoint",
        CheckpointKind::Savepoint => "savepoint",
    };
    let (mut verdicts, mut rows) = (Vec::new(), Vec::new());
    for leftover in leftovers {
        match leftover {
            Leftover::Unreadable {
                checkpoint, reason, ..
            } => verdicts.push(Verdict {
                id: checkpoint,
                ok: false,
                problem: Some(reason),
            }),
            Leftover::Incomplete {
                checkpoint,
                kind,
                path,
            } => rows.push(LeftoverRow {
                kind: "incomplete",
                id: Some(checkpoint),
                entry: Some(entry(kind)),
                path: path.display().to_string(),
            }),
            Leftover::SetAside { checkpoint, path } => rows.push(LeftoverRow {
                kind: "set aside",
                id: Some(checkpoint),
                entry: None,
                path: path.display().to_string(),
            }),
            Leftover::UnreferencedShared { path } => rows.push(LeftoverRow {
                kind: "unreferenced shared file",
                id: None,
                entry: None,
                path: path.display().to_string(),
            }),
            // A kind this build does not know is still shown.
            other => rows.push(LeftoverRow {
                kind: "other",
                id: None,
                entry: None,
                path: format!("{other:?}"),
            }),
        }
    }
    (verdicts, rows)
}

/// `verify` as text.
pub fn verified_text(job: &str, verified: &Verified) -> String {
    let mut text = verdicts_text(job, &verified.checkpoints);
    for row in &verified.leftovers {
        let what = match (row.entry, row.id) {
            (Some(entry), Some(id)) => format!("{} {entry} {id}", row.kind),
            (None, Some(id)) => format!("checkpoint {id} {}", row.kind),
            _ => row.kind.to_string(),
        };
        let _ = writeln!(text, "job {job} leftover: {what}: {}", row.path);
    }
    text
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
