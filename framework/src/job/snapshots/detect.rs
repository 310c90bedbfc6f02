//! What a global snapshot proves besides a recovery point (the seed's
//! second use of snapshots): that a loop has terminated, that a set of
//! operators is deadlocked, that an operator is stalled.
//!
//! This module owns the rules, as pure functions of [`GlobalSnapshot`]s,
//! so each finding can be checked by hand against the snapshot it came
//! from. It never takes a snapshot, reads a clock or stops a job: the
//! supervisor takes the snapshots and acts on (or reports) the findings.
//!
//! Why snapshots give the right answer: termination and deadlock are
//! *stable* properties (once true they stay true), and a consistent
//! snapshot shows a state the job really passed through or could have
//! passed through between the snapshot's start and end; a stable property
//! true in it is therefore true from then on (Chandy and Lamport, 1985,
//! section 5). A property that is not stable, such as "no progress", is
//! only reported after it held in several consecutive snapshots, and
//! only as a stall, never as a proof.

use std::collections::{BTreeMap, BTreeSet};

use crate::storage::PartId;

use super::{ChannelActivity, GlobalSnapshot, SubtaskActivity};

/// One thing the stuck detector found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// These subtasks wait on each other (see [`find_deadlock`] for what
    /// each waits on) and no record is in flight on any channel between
    /// them: none can ever go on. At least one of them declared a wait.
    Deadlock {
        /// The subtasks, sorted.
        subtasks: Vec<PartId>,
    },
    /// This subtask held records and processed and emitted nothing across
    /// `snapshots` consecutive snapshots.
    Stalled {
        /// The subtask.
        subtask: PartId,
        /// The records it held at the newest snapshot.
        holding: u64,
        /// Over how many consecutive snapshots.
        snapshots: usize,
    },
    /// A snapshot did not complete in time: these subtasks never reported
    /// (blocked on a channel's credits, or in a hook that does not return).
    Unresponsive {
        /// The subtasks whose parts were missing.
        subtasks: Vec<PartId>,
    },
    /// An unresponsive subtask whose output channels to these subtasks had
    /// no credit left when its snapshot timed out: it waits for them to
    /// take its records (backpressure), so the cause is downstream. A
    /// credit wait never closes a cycle (back edges of loops are
    /// unbounded), so a chain of these ends at a slow or stuck subtask.
    Backpressured {
        /// The waiting subtask.
        subtask: PartId,
        /// The receivers of its full channels, sorted.
        waiting_for: Vec<PartId>,
    },
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = |ids: &[PartId]| {
            ids.iter()
                .map(|id| format!("{}[{}]", id.operator, id.subtask))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Finding::Deadlock { subtasks } => write!(
                f,
                "deadlock: {} wait on each other with no record in flight between them",
                names(subtasks)
            ),
            Finding::Stalled {
                subtask,
                holding,
                snapshots,
            } => write!(
                f,
                "stalled: {}[{}] holds {holding} records and made no progress across {snapshots} snapshots",
                subtask.operator, subtask.subtask
            ),
            Finding::Unresponsive { subtasks } => write!(
                f,
                "unresponsive: {} did not take part in a snapshot in time",
                names(subtasks)
            ),
            Finding::Backpressured {
                subtask,
                waiting_for,
            } => write!(
                f,
                "backpressured: {}[{}] waits for credit from {}",
                subtask.operator,
                subtask.subtask,
                names(waiting_for)
            ),
        }
    }
}

/// Whether the snapshot proves that the loop made of `operators` has
/// terminated: every channel between two of its subtasks is empty, every
/// channel into it from outside has ended, and none of its subtasks holds
/// records. Nothing can then create a record inside the loop again, so the
/// loop may end. Checked on the snapshot only; the caller names the loop.
pub fn is_loop_quiescent(snapshot: &GlobalSnapshot, operators: &[&str]) -> bool {
    let inside = |id: &PartId| operators.contains(&id.operator.as_str());
    let subtasks_idle = snapshot
        .subtasks
        .iter()
        .filter(|activity| inside(&activity.id))
        .all(|activity| activity.waiting.holding == 0);
    let channels_quiet = snapshot.channels.iter().all(|channel| {
        if !inside(&channel.to) {
            return true;
        }
        if inside(&channel.from) {
            return channel.records_in_flight == 0;
        }
        // From outside the loop: it must have ended before the receiver's
        // local snapshot, so that no record can enter the loop again.
        snapshot
            .subtasks
            .iter()
            .find(|activity| activity.id == channel.to)
            .and_then(|activity| activity.inputs_ended.get(channel.input as usize))
            .copied()
            .unwrap_or(false)
    });
    subtasks_idle && channels_quiet
}

/// The deadlocked subtasks of the snapshot, if any.
///
/// What each subtask waits on: one that declared operators
/// ([`super::Waiting::for_operators`]) waits on its channels from them;
/// any other subtask with inputs is passive between records (snapflow
/// operators act only on input) and waits on every input channel that has
/// not ended. A subtask without inputs (a source) acts on its own and
/// never waits. The closed set is found by removing, until nothing
/// changes, every subtask that waits on a channel with a record in flight
/// or from a subtask outside the set (a declared wait that no channel can
/// answer is removed too: it cannot be checked). A deadlock is reported
/// when the set holds a subtask that declared a wait; the finding names
/// it and every subtask it waits on, transitively, inside the set (so
/// idle subtasks downstream of the deadlock are not named).
pub fn find_deadlock(snapshot: &GlobalSnapshot) -> Option<Finding> {
    let waits_on = |activity: &SubtaskActivity| -> Vec<&ChannelActivity> {
        let declared = &activity.waiting.for_operators;
        snapshot
            .channels
            .iter()
            .filter(|channel| channel.to == activity.id)
            .filter(|channel| {
                if declared.is_empty() {
                    let ended = activity.inputs_ended.get(channel.input as usize);
                    !ended.copied().unwrap_or(false)
                } else {
                    declared.contains(&channel.from.operator)
                }
            })
            .collect()
    };
    let mut set: BTreeSet<&PartId> = snapshot
        .subtasks
        .iter()
        .filter(|activity| !activity.inputs_ended.is_empty())
        .map(|activity| &activity.id)
        .collect();
    loop {
        let before = set.len();
        let keep: BTreeSet<&PartId> = snapshot
            .subtasks
            .iter()
            .filter(|activity| set.contains(&activity.id))
            .filter(|activity| {
                let channels = waits_on(activity);
                let unanswerable =
                    channels.is_empty() && !activity.waiting.for_operators.is_empty();
                !unanswerable
                    && channels.iter().all(|channel| {
                        channel.records_in_flight == 0 && set.contains(&channel.from)
                    })
            })
            .map(|activity| &activity.id)
            .collect();
        set = keep;
        if set.len() == before {
            break;
        }
    }
    let by_id: BTreeMap<&PartId, &SubtaskActivity> = snapshot
        .subtasks
        .iter()
        .map(|activity| (&activity.id, activity))
        .collect();
    let mut named: BTreeSet<&PartId> = set
        .iter()
        .copied()
        .filter(|id| {
            by_id
                .get(id)
                .is_some_and(|activity| activity.waiting.is_waiting())
        })
        .collect();
    if named.is_empty() {
        return None;
    }
    let mut frontier: Vec<&PartId> = named.iter().copied().collect();
    while let Some(id) = frontier.pop() {
        let Some(activity) = by_id.get(id) else {
            continue;
        };
        for channel in waits_on(activity) {
            if set.contains(&channel.from) && named.insert(&channel.from) {
                frontier.push(&channel.from);
            }
        }
    }
    Some(Finding::Deadlock {
        subtasks: named.into_iter().cloned().collect(),
    })
}

/// Follows consecutive snapshots of one job and reports subtasks that hold
/// records and make no progress across `after` of them in a row. Keeps one
/// entry per subtask.
#[derive(Debug, Clone)]
pub struct StallTracker {
    after: usize,
    /// Per subtask: its counts at the last snapshot and for how many
    /// consecutive snapshots they stayed the same while it held records.
    history: BTreeMap<PartId, (u64, u64, usize)>,
}

impl StallTracker {
    /// A tracker that reports after `after` snapshots without progress (at
    /// least 2: one snapshot shows no progress at all).
    pub fn new(after: usize) -> StallTracker {
        StallTracker {
            after: after.max(2),
            history: BTreeMap::new(),
        }
    }

    /// Takes the next snapshot; returns the subtasks stalled as of it. A
    /// new generation (a restart) starts every count again.
    pub fn observe(&mut self, snapshot: &GlobalSnapshot) -> Vec<Finding> {
        let mut findings = Vec::new();
        for activity in &snapshot.subtasks {
            let counts = (activity.records_in, activity.records_out);
            let streak = match self.history.get(&activity.id) {
                Some(&(records_in, records_out, streak))
                    if (records_in, records_out) == counts && activity.waiting.holding > 0 =>
                {
                    streak + 1
                }
                _ if activity.waiting.holding > 0 => 1,
                _ => 0,
            };
            self.history
                .insert(activity.id.clone(), (counts.0, counts.1, streak));
            if streak >= self.after {
                findings.push(Finding::Stalled {
                    subtask: activity.id.clone(),
                    holding: activity.waiting.holding,
                    snapshots: streak,
                });
            }
        }
        findings
    }

    /// Forgets every count (after a restart, counters start from zero).
    pub fn reset(&mut self) {
        self.history.clear();
    }
}
