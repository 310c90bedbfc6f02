//! The check of a loaded checkpoint against the job about to restore it,
//! before anything is allocated from the checkpoint's numbers: the
//! metadata must agree with itself (its operators, parallelisms, parts,
//! roles and source positions) and then fit the job (key groups, removed
//! operators, parallelisms that cannot change).
//!
//! It is pure: it reads the metadata and the part bytes already loaded
//! and verified by the store, and answers. `recovery` turns its answer
//! into the fallback rule: metadata that disagrees with itself is a
//! damaged checkpoint (set aside, fall back), metadata that is whole but
//! describes another job is refused with a typed error and nothing is
//! set aside. See `docs/design/restore-check.md` for why the line is
//! drawn there.

use std::collections::BTreeMap;

use crate::job::inspect::OperatorRole;
use crate::keyed::MaxParallelism;
use crate::storage::{CheckpointMetadata, PartId};

use super::physical::{PhysicalPlan, Rescale};
use super::shell::{is_empty_channel, PartBytes};
use super::JobError;

/// The prefix of the user-metadata keys that record an operator's role
/// (see `inspect::connector_state::role_key`).
const ROLE_PREFIX: &str = "snapflow.role.";

/// How one operator's state follows a change of parallelism, without the
/// closures of [`Rescale`], so that a [`JobShape`] can move to the
/// checkpoint writer's thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RescaleKind {
    /// Sources and sinks: the parallelism must not change.
    Fixed,
    /// Everything else can be restored at another parallelism (a user
    /// operator's own `rescale` may still refuse, later).
    Free,
}

/// One operator of the job, as a restore needs to know it.
#[derive(Debug, Clone)]
pub(crate) struct ShapeOperator {
    pub(crate) name: String,
    pub(crate) parallelism: usize,
    pub(crate) rescale: RescaleKind,
}

/// What a checkpoint must fit: the job's operators and key groups.
#[derive(Debug, Clone)]
pub(crate) struct JobShape {
    pub(crate) max_parallelism: u32,
    pub(crate) operators: Vec<ShapeOperator>,
}

impl JobShape {
    /// The shape of a planned job.
    pub(crate) fn of(plan: &PhysicalPlan) -> JobShape {
        JobShape {
            max_parallelism: plan.config.max_parallelism,
            operators: plan
                .operators
                .iter()
                .map(|operator| ShapeOperator {
                    name: operator.name.clone(),
                    parallelism: operator.parallelism,
                    rescale: match operator.rescale {
                        Rescale::No => RescaleKind::Fixed,
                        _ => RescaleKind::Free,
                    },
                })
                .collect(),
        }
    }
}

/// Why a checkpoint cannot be restored by this job.
#[derive(Debug)]
pub(crate) enum Misfit {
    /// The metadata disagrees with itself: the checkpoint is damaged.
    Damaged(String),
    /// The checkpoint is whole but does not fit the job: a typed error
    /// that retrying cannot fix.
    Refused(JobError),
}

/// Checks `metadata` (with the `parts` the store loaded for it) against
/// itself and against `shape`; see the module documentation.
pub(crate) fn check(
    shape: &JobShape,
    metadata: &CheckpointMetadata,
    parts: &BTreeMap<PartId, Vec<u8>>,
) -> Result<(), Misfit> {
    check_consistent(metadata, parts).map_err(Misfit::Damaged)?;
    check_fits(shape, metadata, parts)
}

/// The metadata agrees with itself: a valid number of key groups, every
/// operator's parallelism within it, exactly the parts `0..parallelism`
/// of every operator it lists and no other, and roles and source
/// positions only of parts it has. Every count is compared with what is
/// really there before it is used.
fn check_consistent(
    metadata: &CheckpointMetadata,
    parts: &BTreeMap<PartId, Vec<u8>>,
) -> Result<(), String> {
    let layout = &metadata.key_groups;
    let recorded = &layout.operator_parallelism;
    if layout.max_parallelism == 0 && recorded.is_empty() && metadata.parts.is_empty() {
        // An empty checkpoint (no job writes one, but it holds nothing).
        return Ok(());
    }
    let max = MaxParallelism::new(layout.max_parallelism)
        .map_err(|error| format!("its key-group count is unusable: {error}"))?
        .get();
    for (operator, &parallelism) in recorded {
        if parallelism == 0 || parallelism > max {
            return Err(format!(
                "operator `{operator}` is recorded with parallelism {parallelism}, \
                 outside 1..={max}"
            ));
        }
    }
    let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
    for info in &metadata.parts {
        let part = &info.part;
        let parallelism = recorded
            .get(&part.operator)
            .ok_or_else(|| format!("it has part {part} of an operator its layout does not list"))?;
        if part.subtask >= *parallelism {
            return Err(format!(
                "it has part {part}, beyond the operator's recorded parallelism {parallelism}"
            ));
        }
        if !parts.contains_key(part) {
            return Err(format!("part {part} is listed but was not loaded"));
        }
        *counts.entry(part.operator.as_str()).or_default() += 1;
    }
    if parts.len() != metadata.parts.len() {
        return Err(format!(
            "{} parts were loaded for {} listed",
            parts.len(),
            metadata.parts.len()
        ));
    }
    for (operator, &parallelism) in recorded {
        let count = counts.get(operator.as_str()).copied().unwrap_or(0);
        if count != parallelism {
            // Parts are unique and below the parallelism, so one is
            // missing; name the first.
            let missing = (0..parallelism)
                .find(|&subtask| !parts.contains_key(&PartId::new(operator.clone(), subtask)))
                .unwrap_or(0);
            return Err(format!(
                "operator `{operator}` is recorded with parallelism {parallelism}, but the part \
                 of its subtask {missing} is missing ({count} of {parallelism} parts)"
            ));
        }
    }
    for part in metadata.source_positions.keys() {
        let known = recorded
            .get(&part.operator)
            .is_some_and(|&parallelism| part.subtask < parallelism);
        if !known {
            return Err(format!(
                "it has a source position of {part}, which is not one of its parts"
            ));
        }
    }
    for (key, value) in &metadata.user {
        let Some(operator) = key.strip_prefix(ROLE_PREFIX) else {
            continue;
        };
        if !recorded.contains_key(operator) {
            return Err(format!(
                "it records the role of operator `{operator}`, which its layout does not list"
            ));
        }
        if OperatorRole::parse(value).is_none() {
            return Err(format!(
                "it records an unknown role {value:?} for operator `{operator}`"
            ));
        }
    }
    Ok(())
}

/// A consistent checkpoint fits the job: the same key groups, no state of
/// an operator the job no longer has, and no change of parallelism of a
/// source or sink.
fn check_fits(
    shape: &JobShape,
    metadata: &CheckpointMetadata,
    parts: &BTreeMap<PartId, Vec<u8>>,
) -> Result<(), Misfit> {
    let layout = &metadata.key_groups;
    if layout.max_parallelism != 0 && layout.max_parallelism != shape.max_parallelism {
        return Err(Misfit::Refused(JobError::MaxParallelismChanged {
            stored: layout.max_parallelism,
            configured: shape.max_parallelism,
        }));
    }
    for (name, &stored) in &layout.operator_parallelism {
        match shape
            .operators
            .iter()
            .find(|operator| operator.name == *name)
        {
            None => check_removed(metadata, parts, name)?,
            Some(operator) => {
                if stored as usize != operator.parallelism && operator.rescale == RescaleKind::Fixed
                {
                    return Err(Misfit::Refused(JobError::RescaleUnsupported {
                        operator: name.clone(),
                        reason: format!(
                            "sources and sinks keep their parallelism ({stored} in checkpoint \
                             {}, {} now)",
                            metadata.checkpoint, operator.parallelism
                        ),
                    }));
                }
            }
        }
    }
    for operator in &shape.operators {
        if !layout.operator_parallelism.contains_key(&operator.name) {
            tracing::info!(
                operator = %operator.name,
                checkpoint = metadata.checkpoint,
                "the checkpoint has no state of this operator; it starts empty"
            );
        }
    }
    Ok(())
}

/// An operator the checkpoint has and the job does not: refused if it
/// held anything (a role, state, recorded channel state), as Flink
/// refuses state it cannot map without `--allowNonRestoredState`; a
/// stateless one is dropped, as Flink's savepoints hold nothing of them.
fn check_removed(
    metadata: &CheckpointMetadata,
    parts: &BTreeMap<PartId, Vec<u8>>,
    name: &str,
) -> Result<(), Misfit> {
    let refused = || {
        Misfit::Refused(JobError::OperatorStateNotRestored {
            operator: name.to_owned(),
            checkpoint: metadata.checkpoint,
        })
    };
    if metadata.user.contains_key(&format!("{ROLE_PREFIX}{name}")) {
        return Err(refused());
    }
    for (part, bytes) in parts.iter().filter(|(part, _)| part.operator == name) {
        let decoded = PartBytes::decode(bytes)
            .map_err(|error| Misfit::Damaged(format!("part {part} does not decode: {error}")))?;
        let empty = decoded.state.is_empty()
            && decoded
                .channels
                .iter()
                .all(|(_, messages)| is_empty_channel(messages));
        if !empty {
            return Err(refused());
        }
    }
    tracing::info!(
        operator = name,
        checkpoint = metadata.checkpoint,
        "the checkpoint has a stateless operator the job no longer has; it is dropped"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{CheckpointKind, KeyGroupLayout, PartInfo};

    fn part_bytes(state: &[u8]) -> Vec<u8> {
        PartBytes {
            state: state.to_vec(),
            channels: Vec::new(),
            time: None,
        }
        .encode()
        .unwrap()
    }

    /// A checkpoint of `numbers` (2 subtasks, a source), `parse` (2,
    /// stateless), `count` (2, keyed) and `out` (1, a sink).
    fn checkpoint() -> (CheckpointMetadata, BTreeMap<PartId, Vec<u8>>) {
        let mut parts = BTreeMap::new();
        for (operator, parallelism, state) in [
            ("count", 2, &b"keyed"[..]),
            ("numbers", 2, b"position"),
            ("out", 1, b"txn"),
            ("parse", 2, b""),
        ] {
            for subtask in 0..parallelism {
                parts.insert(PartId::new(operator, subtask), part_bytes(state));
            }
        }
        let metadata = CheckpointMetadata {
            job: "job".into(),
            checkpoint: 9,
            kind: CheckpointKind::Checkpoint,
            created_unix_ms: 0,
            parts: parts
                .iter()
                .map(|(part, bytes)| PartInfo::of(part.clone(), bytes))
                .collect(),
            source_positions: BTreeMap::new(),
            key_groups: KeyGroupLayout {
                max_parallelism: 128,
                operator_parallelism: BTreeMap::from([
                    ("count".to_string(), 2),
                    ("numbers".to_string(), 2),
                    ("out".to_string(), 1),
                    ("parse".to_string(), 2),
                ]),
            },
            user: BTreeMap::from([
                ("snapflow.role.numbers".to_string(), "source".to_string()),
                ("snapflow.role.out".to_string(), "sink".to_string()),
            ]),
            segments: BTreeMap::new(),
        };
        (metadata, parts)
    }

    fn shape() -> JobShape {
        let operator = |name: &str, parallelism, rescale| ShapeOperator {
            name: name.to_string(),
            parallelism,
            rescale,
        };
        JobShape {
            max_parallelism: 128,
            operators: vec![
                operator("numbers", 2, RescaleKind::Fixed),
                operator("parse", 2, RescaleKind::Free),
                operator("count", 2, RescaleKind::Free),
                operator("out", 1, RescaleKind::Fixed),
            ],
        }
    }

    /// Removes `part` from the metadata and the loaded parts.
    fn without(
        (mut metadata, mut parts): (CheckpointMetadata, BTreeMap<PartId, Vec<u8>>),
        part: &PartId,
    ) -> (CheckpointMetadata, BTreeMap<PartId, Vec<u8>>) {
        metadata.parts.retain(|info| info.part != *part);
        parts.remove(part);
        (metadata, parts)
    }

    fn damaged(
        shape: &JobShape,
        (metadata, parts): &(CheckpointMetadata, BTreeMap<PartId, Vec<u8>>),
        expected: &str,
    ) {
        match check(shape, metadata, parts) {
            Err(Misfit::Damaged(reason)) => assert!(reason.contains(expected), "{reason}"),
            other => panic!("expected damage ({expected}), got {other:?}"),
        }
    }

    fn refused(
        shape: &JobShape,
        (metadata, parts): &(CheckpointMetadata, BTreeMap<PartId, Vec<u8>>),
        expected: &str,
    ) {
        match check(shape, metadata, parts) {
            Err(Misfit::Refused(error)) => {
                let text = error.to_string();
                assert!(text.contains(expected), "{text}");
                assert!(!error.is_retryable(), "{text}");
            }
            other => panic!("expected a refusal ({expected}), got {other:?}"),
        }
    }

    #[test]
    fn a_whole_checkpoint_fits() {
        let (metadata, parts) = checkpoint();
        check(&shape(), &metadata, &parts).unwrap();
    }

    #[test]
    fn a_missing_part_of_any_operator_is_damage() {
        for (operator, subtask) in [("numbers", 1), ("numbers", 0), ("count", 1), ("out", 0)] {
            let forged = without(checkpoint(), &PartId::new(operator, subtask));
            damaged(&shape(), &forged, &format!("subtask {subtask} is missing"));
        }
        // A stateless operator's part too: every subtask writes one.
        let forged = without(checkpoint(), &PartId::new("parse", 0));
        damaged(&shape(), &forged, "missing");
    }

    #[test]
    fn parallelisms_and_key_groups_out_of_bounds_are_damage() {
        for parallelism in [0, 3, 129, u32::MAX] {
            let mut forged = checkpoint();
            forged
                .0
                .key_groups
                .operator_parallelism
                .insert("count".into(), parallelism);
            damaged(&shape(), &forged, "count");
        }
        for max in [0, 1 << 16, u32::MAX] {
            let mut forged = checkpoint();
            forged.0.key_groups.max_parallelism = max;
            damaged(&shape(), &forged, "key-group count");
        }
        // Within bounds but not the job's: whole, and refused.
        let mut forged = checkpoint();
        forged.0.key_groups.max_parallelism = 64;
        refused(&shape(), &forged, "key groups");
    }

    #[test]
    fn parts_roles_and_positions_of_unlisted_operators_are_damage() {
        let mut forged = checkpoint();
        forged.0.key_groups.operator_parallelism.remove("count");
        damaged(&shape(), &forged, "does not list");
        let mut forged = checkpoint();
        forged.0.key_groups.operator_parallelism.remove("numbers");
        forged
            .0
            .parts
            .retain(|info| info.part.operator != "numbers");
        forged.1.retain(|part, _| part.operator != "numbers");
        // The role is still recorded: an operator dropped from the layout.
        damaged(&shape(), &forged, "role of operator `numbers`");
        let mut forged = checkpoint();
        forged
            .0
            .source_positions
            .insert(PartId::new("numbers", 2), vec![1]);
        damaged(&shape(), &forged, "source position");
        let mut forged = checkpoint();
        forged
            .0
            .user
            .insert("snapflow.role.parse".into(), "teapot".into());
        damaged(&shape(), &forged, "unknown role");
        let mut forged = checkpoint();
        forged.1.remove(&PartId::new("count", 0));
        damaged(&shape(), &forged, "not loaded");
    }

    #[test]
    fn a_removed_operator_with_state_is_refused_and_a_stateless_one_dropped() {
        let mut job = shape();
        job.operators.retain(|operator| operator.name != "count");
        refused(&job, &checkpoint(), "`count`");
        let mut job = shape();
        job.operators.retain(|operator| operator.name != "out");
        refused(&job, &checkpoint(), "`out`");
        let mut job = shape();
        job.operators.retain(|operator| operator.name != "parse");
        let (metadata, parts) = checkpoint();
        check(&job, &metadata, &parts).unwrap();
    }

    #[test]
    fn a_rescale_is_checked_per_operator() {
        let mut job = shape();
        job.operators[2].parallelism = 5; // count: keyed, rescales
        job.operators[1].parallelism = 1; // parse: stateless
        let (metadata, parts) = checkpoint();
        check(&job, &metadata, &parts).unwrap();
        let mut job = shape();
        job.operators[0].parallelism = 3; // numbers: a source
        refused(&job, &checkpoint(), "keep their parallelism");
        // An operator the checkpoint does not have starts empty.
        let mut job = shape();
        job.operators.push(ShapeOperator {
            name: "new".into(),
            parallelism: 4,
            rescale: RescaleKind::Fixed,
        });
        check(&job, &metadata, &parts).unwrap();
    }
}
