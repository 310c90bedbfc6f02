//! Choosing the checkpoint a job, or a failover region, restores from:
//! the newest one that the store verifies *and* whose sinks' staged data
//! is intact, falling back past damaged ones (each set aside, with a
//! warning naming the file), and refusing a fallback that would write
//! committed output a second time.
//!
//! A checkpoint is also damaged when its metadata disagrees with itself
//! (a part missing, a parallelism beyond its parts or bounds; see
//! `restore_check`), and refused with a typed error when it is whole but
//! does not fit the job; both are decided before any part is used.
//!
//! This module owns the fallback rule and the floor of new checkpoint ids.
//! It runs on the checkpoint writer's thread, before any actor of the
//! generation starts, so a refusal means nothing ran. It never starts
//! actors, never writes a part, and never decides what a sink's files
//! mean: each sink answers [`Sink::check_restore`](crate::sink::Sink::check_restore)
//! for itself.
//!
//! Known gap: a checkpoint whose `_metadata` file was deleted looks like
//! one that never committed, so only a sink that knows what it made
//! visible ([`Visibility::Known`]) notices a fallback past it; a sink that
//! cannot tell ([`Visibility::Unknown`]) is refused only past checkpoints
//! the store knows are damaged (skipped now, or set aside before).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::protocol::CheckpointId;
use crate::sink::{SinkError, SinkState, Visibility};
use crate::source::Guarantee;
use crate::storage::{CheckpointStore, LoadedCheckpoint, PartId};

use super::report::{FallbackReport, GuaranteeReason};
use super::restore_check::{self, JobShape, Misfit};
use super::shell::PartBytes;
use super::writer::Restored;
use super::JobError;

/// The metadata key that marks a job's final checkpoint (taken after
/// every input ended), and its value.
pub(crate) const FINAL_KEY: &str = "snapflow.final";
pub(crate) const FINAL_VALUE: &str = "true";

/// What a fresh sink of one subtask says before a restore.
pub(crate) struct SinkView {
    pub(crate) visibility: Visibility,
    pub(crate) guarantee: Guarantee,
}

/// Asks a fresh sink of (subtask, parallelism) `check_restore(restored,
/// state)`.
pub(crate) type SinkCheckFn = Arc<
    dyn Fn(usize, usize, Option<u64>, Option<&SinkState>) -> Result<SinkView, SinkError>
        + Send
        + Sync,
>;

/// Restores a fresh sink of (subtask, parallelism) from `state`, which
/// commits what it lists; used when the job had already finished.
pub(crate) type SinkRestoreFn =
    Arc<dyn Fn(usize, usize, Option<&SinkState>) -> Result<(), SinkError> + Send + Sync>;

/// The recovery hooks of one sink operator.
#[derive(Clone)]
pub(crate) struct SinkHooks {
    pub(crate) operator: String,
    pub(crate) parallelism: usize,
    pub(crate) check: SinkCheckFn,
    pub(crate) restore: SinkRestoreFn,
}

/// How to recover.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecoveryOptions {
    /// [`super::JobConfig::accept_duplicates_after_fallback`].
    pub(crate) accept_duplicates: bool,
    /// The job's first start (not a region's restart): only then does a
    /// final checkpoint mean "already finished".
    pub(crate) first_start: bool,
}

/// The outcome: what to restore, and what was learnt on the way.
pub(crate) struct Recovery {
    pub(crate) restored: Restored,
    /// Damaged checkpoints skipped, newest first.
    pub(crate) fallbacks: Vec<FallbackReport>,
    /// Every new checkpoint id must be above this: the highest id the
    /// store holds in any form and the highest a sink committed.
    pub(crate) id_floor: u64,
    /// Duplicates accepted by the user's option, one reason per sink.
    pub(crate) replayed: Vec<GuaranteeReason>,
    /// The restored checkpoint was the job's final one and the sinks have
    /// committed what it lists: nothing is left to run.
    pub(crate) finished: bool,
}

/// Why a candidate checkpoint was not taken.
enum Rejection {
    /// The checkpoint's metadata or a sink's staged data is damaged:
    /// fall back past it.
    Damaged(String),
    /// Anything else: the start fails.
    Failed(JobError),
}

/// Chooses the checkpoint to restore; see the module documentation.
pub(crate) fn recover(
    store: &dyn CheckpointStore,
    sinks: &[SinkHooks],
    shape: &JobShape,
    options: RecoveryOptions,
) -> Result<Recovery, JobError> {
    let mut fallbacks = Vec::new();
    let mut before = None;
    let (loaded, views) = loop {
        let report = match before {
            None => store.load_latest()?,
            Some(before) => store.load_latest_before(before)?,
        };
        for skipped in report.skipped {
            fallbacks.push(set_aside(
                store,
                skipped.checkpoint,
                &skipped.reason.to_string(),
            ));
        }
        let restored = report
            .checkpoint
            .as_ref()
            .map(|loaded| loaded.metadata.checkpoint);
        let checked = check_fit(shape, report.checkpoint.as_ref())
            .and_then(|()| check_sinks(sinks, report.checkpoint.as_ref()));
        match checked {
            Ok(views) => break (report.checkpoint, views),
            Err(Rejection::Damaged(reason)) => {
                let Some(checkpoint) = restored else {
                    return Err(JobError::Internal(format!(
                        "damage found without a checkpoint: {reason}"
                    )));
                };
                // The pin must go before the directory can move.
                drop(report.checkpoint);
                fallbacks.push(set_aside(store, checkpoint, &reason));
                before = Some(checkpoint);
            }
            Err(Rejection::Failed(error)) => return Err(error),
        }
    };
    let restored = loaded.as_ref().map(|loaded| loaded.metadata.checkpoint);
    for fallback in &mut fallbacks {
        fallback.restored = restored;
    }
    let replayed = check_duplicates(store, &views, restored, &fallbacks, options)?;
    let committed_max = views
        .iter()
        .flat_map(|(_, _, view)| view.visibility.committed().iter().copied())
        .max();
    let id_floor = [store.highest_id()?, committed_max, restored]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0);
    let finished = match &loaded {
        Some(loaded) if options.first_start && is_final(loaded) => {
            restore_sinks(sinks, loaded)?;
            true
        }
        _ => false,
    };
    Ok(Recovery {
        restored: loaded.map(|loaded| {
            (
                CheckpointId(loaded.metadata.checkpoint),
                loaded.parts,
                loaded.metadata.key_groups,
            )
        }),
        fallbacks,
        id_floor,
        replayed,
        finished,
    })
}

fn is_final(loaded: &LoadedCheckpoint) -> bool {
    loaded.metadata.user.get(FINAL_KEY).map(String::as_str) == Some(FINAL_VALUE)
}

/// Sets a damaged checkpoint aside, best effort: one that stays in place
/// is skipped again by every load, and its id still counts towards the
/// floor, so failing to move it loses nothing.
fn set_aside(store: &dyn CheckpointStore, checkpoint: u64, reason: &str) -> FallbackReport {
    let moved = match store.set_aside(checkpoint, reason) {
        Ok(moved) => moved,
        Err(error) => {
            tracing::warn!(checkpoint, %error, "could not set a damaged checkpoint aside");
            None
        }
    };
    tracing::warn!(
        checkpoint,
        reason,
        set_aside = ?moved,
        "skipping a damaged checkpoint; falling back to an older one"
    );
    FallbackReport {
        checkpoint,
        reason: reason.to_owned(),
        set_aside: moved,
        restored: None,
    }
}

/// Whether `loaded` fits the job (see `restore_check`): its metadata
/// disagreeing with itself is damage, a whole checkpoint of another shape
/// a typed error.
fn check_fit(shape: &JobShape, loaded: Option<&LoadedCheckpoint>) -> Result<(), Rejection> {
    let Some(loaded) = loaded else {
        return Ok(());
    };
    restore_check::check(shape, &loaded.metadata, &loaded.parts).map_err(|misfit| match misfit {
        Misfit::Damaged(reason) => Rejection::Damaged(format!("its metadata: {reason}")),
        Misfit::Refused(error) => Rejection::Failed(error),
    })
}

/// The stored state of one sink subtask in `loaded`, if it has one.
fn sink_state(
    loaded: &LoadedCheckpoint,
    operator: &str,
    subtask: usize,
) -> Result<Option<SinkState>, JobError> {
    let part = PartId::new(operator, u32::try_from(subtask).unwrap_or(u32::MAX));
    let Some(bytes) = loaded.parts.get(&part) else {
        return Ok(None);
    };
    let part = PartBytes::decode(bytes).map_err(|error| JobError::SinkRestore {
        sink: operator.to_owned(),
        subtask,
        error: SinkError::MalformedState {
            reason: format!("its part does not decode: {error}"),
        },
    })?;
    Ok(Some(SinkState::from_bytes(part.state)))
}

/// Every sink subtask's view of restoring `loaded`.
fn check_sinks<'s>(
    sinks: &'s [SinkHooks],
    loaded: Option<&LoadedCheckpoint>,
) -> Result<Vec<(&'s SinkHooks, usize, SinkView)>, Rejection> {
    let restored = loaded.map(|loaded| loaded.metadata.checkpoint);
    let mut views = Vec::new();
    for hooks in sinks {
        for subtask in 0..hooks.parallelism {
            let state = match loaded {
                Some(loaded) => {
                    sink_state(loaded, &hooks.operator, subtask).map_err(Rejection::Failed)?
                }
                None => None,
            };
            match (hooks.check)(subtask, hooks.parallelism, restored, state.as_ref()) {
                Ok(view) => views.push((hooks, subtask, view)),
                Err(error @ SinkError::StagedDataDamaged { .. }) => {
                    let reason = format!("sink `{}`: {error}", hooks.operator);
                    return Err(Rejection::Damaged(reason));
                }
                Err(error) => {
                    return Err(Rejection::Failed(JobError::SinkRestore {
                        sink: hooks.operator.clone(),
                        subtask,
                        error,
                    }))
                }
            }
        }
    }
    Ok(views)
}

/// Refuses (or, with the option, accepts and reports) a restore that
/// would write committed output again.
fn check_duplicates(
    store: &dyn CheckpointStore,
    views: &[(&SinkHooks, usize, SinkView)],
    restored: Option<u64>,
    fallbacks: &[FallbackReport],
    options: RecoveryOptions,
) -> Result<Vec<GuaranteeReason>, JobError> {
    let mut damaged: Vec<u64> = store.damaged_ids()?;
    damaged.extend(fallbacks.iter().map(|fallback| fallback.checkpoint));
    damaged.retain(|id| restored.map_or(true, |restored| *id > restored));
    damaged.sort_unstable();
    damaged.dedup();
    let mut replayed: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (hooks, subtask, view) in views {
        if view.guarantee == Guarantee::AtLeastOnce {
            continue;
        }
        let committed = match &view.visibility {
            Visibility::Known(ids) if !ids.is_empty() => ids.clone(),
            Visibility::Unknown if !damaged.is_empty() => Vec::new(),
            _ => continue,
        };
        if !options.accept_duplicates {
            return Err(JobError::FallbackWouldDuplicate {
                restored,
                sink: hooks.operator.clone(),
                subtask: *subtask,
                committed,
                skipped: damaged,
            });
        }
        tracing::warn!(
            sink = %hooks.operator,
            subtask,
            restored,
            ?committed,
            "restoring writes committed output again (accepted by accept_duplicates_after_fallback)"
        );
        let ids = replayed.entry(&hooks.operator).or_default();
        ids.extend(committed);
    }
    Ok(replayed
        .into_iter()
        .map(|(operator, mut committed)| {
            committed.sort_unstable();
            committed.dedup();
            GuaranteeReason::FallbackReplaysCommittedOutput {
                operator: operator.to_owned(),
                restored,
                committed,
            }
        })
        .collect())
}

/// The job had finished: each sink commits what the final checkpoint
/// lists (a crash may have come between its completion and the commits).
fn restore_sinks(sinks: &[SinkHooks], loaded: &LoadedCheckpoint) -> Result<(), JobError> {
    for hooks in sinks {
        for subtask in 0..hooks.parallelism {
            let state = sink_state(loaded, &hooks.operator, subtask)?;
            (hooks.restore)(subtask, hooks.parallelism, state.as_ref()).map_err(|error| {
                JobError::SinkRestore {
                    sink: hooks.operator.clone(),
                    subtask,
                    error,
                }
            })?;
        }
    }
    Ok(())
}
