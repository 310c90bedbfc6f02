//! The supervisor's decisions about checkpoints and failures, as a pure
//! state machine: events in ([`Event`]), commands out ([`Command`]), in
//! the shape of [`crate::protocol::Coordinator`] (and quinn-proto).
//!
//! It owns the checkpoint lifecycle of a running job: when the
//! [`Coordinator`] runs (exactly while every failover region runs), which
//! node events count (only those of a region's current generation), the
//! trigger of a checkpoint at the initiators with its kind, the hand-off
//! of a completed checkpoint to be persisted, telling the subtasks a
//! checkpoint is complete only once it is durable, aborts, the count of
//! checkpoints the store could not persist, the final checkpoint of a
//! bounded job, savepoints and the stop savepoint, the end of the job once
//! every subtask committed, and whether an operator's failure ends the job
//! (not retryable) or restarts its region. It numbers checkpoints on
//! across generations, so ids only rise.
//!
//! It never reads a clock (time is `now_ms` on every call), never does
//! I/O, never starts threads and shares nothing: the actor around it
//! (`super`) carries out its commands (sends to subtask addresses, the
//! writer thread, timers) and feeds it what happened. What it does not
//! decide yet, the actor still does: the restart strategy (whether and
//! when a failed region restarts, or the job gives up), loading the
//! checkpoint a region restores from, and the snapshots that are not
//! checkpoints. Every event and command is plain serde data, so the
//! machine could be driven across a process boundary.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::protocol::{
    CheckpointId, CheckpointKind, Coordinator, CoordinatorAction, CoordinatorConfig,
    CoordinatorConfigError,
};
use crate::runtime::Generation;

mod messages;
#[cfg(test)]
mod tests;

pub(crate) use messages::{Command, Ending, Event, PersistResult, ToSubtask};

/// What the machine is built from: the coordinator's schedule and the
/// shape of the job's graph of subtasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MachineConfig {
    /// How checkpoints are scheduled; `first_checkpoint` is ignored (the
    /// machine numbers on from the newest checkpoint it knows).
    pub(crate) interval_ms: Option<u64>,
    /// See [`CoordinatorConfig::min_pause_ms`].
    pub(crate) min_pause_ms: u64,
    /// See [`CoordinatorConfig::max_concurrent`].
    pub(crate) max_concurrent: usize,
    /// See [`CoordinatorConfig::timeout_ms`].
    pub(crate) timeout_ms: u64,
    /// See [`CoordinatorConfig::tolerable_failures`].
    pub(crate) tolerable_failures: u32,
    /// The failover region of each node (subtask).
    pub(crate) region_of: Vec<usize>,
    /// The nodes a checkpoint is triggered at (sources).
    pub(crate) initiators: Vec<usize>,
}

/// The job's phase, as the machine sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Phase {
    /// Not every region has started yet.
    Loading,
    Running,
    Done,
}

/// One region's current generation.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Region {
    running: bool,
    generation: Generation,
    /// The first checkpoint its generation takes part in; older
    /// completions are not for it.
    first_checkpoint: CheckpointId,
}

/// One subtask's progress in its current generation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Node {
    ended: bool,
    committed: Option<CheckpointId>,
}

/// The supervisor as a pure machine (see the module doc).
pub(crate) struct SupervisorMachine<H> {
    config: MachineConfig,
    phase: Phase,
    regions: Vec<Region>,
    nodes: Vec<Node>,
    /// Present exactly while every region runs.
    coordinator: Option<Coordinator<H>>,
    /// Which nodes acked each checkpoint in flight, so a repeated ack is
    /// dropped here rather than reaching the coordinator (which treats it
    /// as a bug).
    acked: BTreeMap<CheckpointId, Vec<bool>>,
    /// Counts coordinators, so a persist failure counts only for the one
    /// that completed the checkpoint.
    epoch: u64,
    /// The newest checkpoint id ever triggered or restored.
    highest: CheckpointId,
    /// The first checkpoint triggered after every input ended.
    final_from: Option<CheckpointId>,
    /// Checkpoints handed over to be persisted, not yet answered.
    persisting: Vec<CheckpointId>,
    stop_requested: bool,
    /// The stop savepoint, while triggered and not yet durable.
    savepoint_in_flight: Option<CheckpointId>,
    /// The stop savepoint, once durable.
    stop_savepoint: Option<CheckpointId>,
    /// Drained by the actor after every event, so it holds at most one
    /// event's commands (bounded by the nodes times the checkpoints in
    /// flight).
    commands: VecDeque<Command<H>>,
}

impl<H> SupervisorMachine<H> {
    /// A machine for a job of `config`'s shape, waiting for its regions to
    /// start. A schedule the coordinator cannot run is an error (not
    /// retryable).
    pub(crate) fn new(config: MachineConfig) -> Result<Self, CoordinatorConfigError> {
        // The coordinator checks the schedule once here, so that starting
        // one later cannot fail.
        Coordinator::<H>::new(
            coordinator_config(&config, CheckpointId(1)),
            config.region_of.len(),
            config.initiators.clone(),
            0,
        )?;
        let region_count = config.region_of.iter().map(|region| region + 1).max();
        let regions = (0..region_count.unwrap_or(0))
            .map(|_| Region {
                running: false,
                generation: Generation(0),
                first_checkpoint: CheckpointId(1),
            })
            .collect();
        Ok(SupervisorMachine {
            nodes: vec![Node::default(); config.region_of.len()],
            config,
            phase: Phase::Loading,
            regions,
            coordinator: None,
            acked: BTreeMap::new(),
            epoch: 0,
            highest: CheckpointId(0),
            final_from: None,
            persisting: Vec::new(),
            stop_requested: false,
            savepoint_in_flight: None,
            stop_savepoint: None,
            commands: VecDeque::new(),
        })
    }

    /// The next command to carry out.
    pub(crate) fn poll_command(&mut self) -> Option<Command<H>> {
        self.commands.pop_front()
    }

    /// When to deliver [`Event::Timer`]; `None`: no timer. While a
    /// completed checkpoint is still being written the schedule pauses:
    /// otherwise a store slower than the interval would queue persists
    /// without bound (Flink likewise counts a checkpoint as pending until
    /// it is finalized). Requested checkpoints still start at once.
    pub(crate) fn poll_timeout(&self) -> Option<u64> {
        if self.phase != Phase::Running || !self.persisting.is_empty() {
            return None;
        }
        self.coordinator.as_ref()?.poll_timeout()
    }

    /// The newest checkpoint in flight.
    fn checkpoint_in_flight(&self) -> Option<CheckpointId> {
        self.coordinator.as_ref()?.in_flight().last()
    }

    /// Takes in one event at `now_ms`; its commands are then ready in
    /// [`SupervisorMachine::poll_command`].
    pub(crate) fn handle(&mut self, event: Event<H>, now_ms: u64) {
        if self.phase == Phase::Done {
            return;
        }
        match event {
            Event::RegionStarted {
                region,
                generation,
                id_floor,
            } => self.on_region_started(region, generation, id_floor, now_ms),
            Event::RegionsStopped { regions } => self.on_regions_stopped(&regions, now_ms),
            Event::Ack {
                node,
                generation,
                checkpoint,
                part,
            } => {
                if self.is_current(node, generation) {
                    self.on_ack(node, checkpoint, part, now_ms);
                }
            }
            Event::Decline {
                node,
                generation,
                checkpoint,
                reason,
            } => {
                if self.is_current(node, generation) {
                    if let Some(coordinator) = &mut self.coordinator {
                        coordinator.on_decline(now_ms, node, checkpoint, reason);
                    }
                    self.carry_out(now_ms);
                }
            }
            Event::InputsEnded { node, generation } => {
                if self.is_current(node, generation) {
                    self.on_inputs_ended(node, now_ms);
                }
            }
            Event::Committed {
                node,
                generation,
                checkpoint,
            } => {
                if self.is_current(node, generation) {
                    let committed = &mut self.nodes[node].committed;
                    *committed = (*committed).max(Some(checkpoint));
                    if self.all_committed() {
                        self.finish(Ending::Finished);
                    }
                }
            }
            Event::Failed {
                node,
                generation,
                retryable,
            } => {
                if self.is_current(node, generation) {
                    self.on_failed(node, retryable);
                }
            }
            Event::Persisted {
                epoch,
                checkpoint,
                outcome,
            } => self.on_persisted(epoch, checkpoint, outcome, now_ms),
            Event::Timer => {
                if let Some(coordinator) = &mut self.coordinator {
                    coordinator.handle_timeout(now_ms);
                }
                self.carry_out(now_ms);
            }
            Event::SavepointRequested => {
                if let (Phase::Running, Some(coordinator)) = (self.phase, &mut self.coordinator) {
                    coordinator.request_checkpoint(now_ms, CheckpointKind::Savepoint);
                    self.carry_out(now_ms);
                }
            }
            Event::StopRequested { savepoint: false } => self.finish(Ending::Cancelled),
            Event::StopRequested { savepoint: true } => {
                self.stop_requested = true;
                // No checkpoint may follow the stop savepoint: it would
                // commit output written after the savepoint, which a
                // resume from the savepoint writes again.
                if let Some(coordinator) = &mut self.coordinator {
                    coordinator.savepoints_only();
                }
                self.request_savepoint(now_ms);
            }
        }
    }

    /// Whether an event of `node` in `generation` counts: the job runs,
    /// the node's region runs, and the event is of its current generation
    /// (nothing of an old generation reaches a new one).
    fn is_current(&self, node: usize, generation: Generation) -> bool {
        let Some(region) = self.config.region_of.get(node) else {
            return false;
        };
        let region = &self.regions[*region];
        self.phase == Phase::Running && region.running && region.generation == generation
    }

    fn on_region_started(
        &mut self,
        region: usize,
        generation: Generation,
        id_floor: CheckpointId,
        now_ms: u64,
    ) {
        let Some(state) = self.regions.get(region) else {
            return;
        };
        // A generation never returns; a stale start is dropped.
        if state.running || generation <= state.generation {
            return;
        }
        self.highest = self.highest.max(id_floor);
        let first_checkpoint = self.highest.next();
        self.regions[region] = Region {
            running: true,
            generation,
            first_checkpoint,
        };
        for (node, state) in self.nodes.iter_mut().enumerate() {
            if self.config.region_of[node] == region {
                *state = Node::default();
            }
        }
        if self.regions.iter().all(|region| region.running) {
            self.phase = Phase::Running;
            self.resume(now_ms);
        }
    }

    /// Every region runs: a new coordinator numbers on from the newest
    /// checkpoint ever triggered. Subtasks whose inputs ended (in regions
    /// that kept running) are triggered directly, as before.
    fn resume(&mut self, now_ms: u64) {
        let config = coordinator_config(&self.config, self.highest.next());
        let coordinator = Coordinator::new(
            config,
            self.config.region_of.len(),
            self.config.initiators.clone(),
            now_ms,
        );
        // `new` checked this very schedule; only the first id differs.
        let Ok(mut coordinator) = coordinator else {
            debug_assert!(false, "bug: a checked coordinator config failed");
            return;
        };
        for (node, state) in self.nodes.iter().enumerate() {
            if state.ended {
                // Nothing is in flight yet, so there is nothing to trigger.
                let _ = coordinator.add_initiator(node);
            }
        }
        if self.stop_requested {
            coordinator.savepoints_only();
        }
        self.coordinator = Some(coordinator);
        self.epoch += 1;
        self.commands.push_back(Command::Resumed);
        self.check_final(now_ms);
        self.carry_out(now_ms);
        self.request_savepoint(now_ms);
    }

    fn on_regions_stopped(&mut self, stopped: &[usize], now_ms: u64) {
        if self.phase != Phase::Running {
            return;
        }
        // The stopped regions' subtasks need no news of the aborts, nor
        // of anything still queued for them (this event can arrive while
        // the actor carries out an earlier event's commands).
        for &region in stopped {
            if let Some(state) = self.regions.get_mut(region) {
                state.running = false;
            }
        }
        let region_of = &self.config.region_of;
        self.commands.retain(|command| match command {
            Command::Send { node, .. } => !stopped.contains(&region_of[*node]),
            _ => true,
        });
        self.savepoint_in_flight = None;
        self.final_from = None;
        self.acked.clear();
        let Some(mut coordinator) = self.coordinator.take() else {
            return;
        };
        coordinator.abort_all(now_ms);
        while let Some(action) = coordinator.poll_action() {
            if let CoordinatorAction::Abort { checkpoint, .. } = action {
                self.abort(checkpoint, "the job restarts".to_owned(), false);
            }
        }
    }

    fn on_ack(&mut self, node: usize, checkpoint: CheckpointId, part: H, now_ms: u64) {
        let Some(coordinator) = &mut self.coordinator else {
            return;
        };
        // An ack of a checkpoint never triggered, or a second ack of one
        // node, is a subtask's bug; the coordinator would panic on it.
        if checkpoint > self.highest {
            return;
        }
        if coordinator.in_flight().any(|id| id == checkpoint) {
            let node_count = self.nodes.len();
            let acked = self
                .acked
                .entry(checkpoint)
                .or_insert_with(|| vec![false; node_count]);
            if std::mem::replace(&mut acked[node], true) {
                return;
            }
        }
        // A stale ack's part is simply dropped.
        let _ = coordinator.on_ack(now_ms, node, checkpoint, part);
        self.carry_out(now_ms);
    }

    fn on_inputs_ended(&mut self, node: usize, now_ms: u64) {
        self.nodes[node].ended = true;
        if let Some(coordinator) = &mut self.coordinator {
            for (checkpoint, kind) in coordinator.add_initiator(node) {
                self.commands.push_back(Command::Send {
                    node,
                    message: ToSubtask::Trigger(checkpoint, kind),
                });
            }
        }
        self.check_final(now_ms);
        self.carry_out(now_ms);
    }

    /// Once every input ended, the next checkpoint is the final one.
    fn check_final(&mut self, now_ms: u64) {
        let Some(coordinator) = &mut self.coordinator else {
            return;
        };
        if self.final_from.is_none() && self.nodes.iter().all(|node| node.ended) {
            // Every checkpoint from the next one on sees every input
            // ended, so its completion commits all output.
            let final_from = self.highest.next();
            self.final_from = Some(final_from);
            // A checkpoint still being written would only delay the final
            // one, which holds all it holds.
            self.commands.push_back(Command::SubsumeBelow(final_from));
            coordinator.request_checkpoint(now_ms, CheckpointKind::Requested);
        }
    }

    fn on_failed(&mut self, node: usize, retryable: bool) {
        if !retryable {
            self.finish(Ending::NotRetryable { node });
            return;
        }
        let checkpoint_in_flight = self.checkpoint_in_flight();
        self.commands.push_back(Command::RegionFailed {
            region: self.config.region_of[node],
            node,
            checkpoint_in_flight,
        });
    }

    fn on_persisted(
        &mut self,
        epoch: u64,
        checkpoint: CheckpointId,
        outcome: PersistResult,
        now_ms: u64,
    ) {
        let Some(index) = self.persisting.iter().position(|id| *id == checkpoint) else {
            // Never handed over, or answered already.
            return;
        };
        self.persisting.remove(index);
        match outcome {
            PersistResult::Durable => {
                let stop_savepoint = self.savepoint_in_flight == Some(checkpoint);
                if stop_savepoint {
                    self.savepoint_in_flight = None;
                    self.stop_savepoint = Some(checkpoint);
                }
                self.commands.push_back(Command::Durable {
                    checkpoint,
                    stop_savepoint,
                });
                // Only now, with the commit durable, may sinks commit; only
                // generations that took part in it hear of it.
                if self.phase == Phase::Running {
                    for (node, &region) in self.config.region_of.iter().enumerate() {
                        let region = &self.regions[region];
                        if region.running && checkpoint >= region.first_checkpoint {
                            self.commands.push_back(Command::Send {
                                node,
                                message: ToSubtask::Complete(checkpoint),
                            });
                        }
                    }
                }
            }
            PersistResult::Subsumed => {}
            PersistResult::Failed => {
                // It counts as a failed checkpoint, but only for the
                // coordinator that completed it: a new one (after a
                // restart) counts from zero.
                if epoch == self.epoch && self.phase == Phase::Running {
                    if let Some(coordinator) = &mut self.coordinator {
                        coordinator.on_persist_failed(now_ms, checkpoint);
                        self.carry_out(now_ms);
                    }
                }
                if self.savepoint_in_flight == Some(checkpoint) {
                    self.savepoint_in_flight = None;
                    self.request_savepoint(now_ms);
                }
            }
        }
    }

    /// Asks the coordinator for the stop savepoint (again, after an abort
    /// or a restart); while a region restarts it is asked once every
    /// region runs again.
    fn request_savepoint(&mut self, now_ms: u64) {
        if !self.stop_requested || self.savepoint_in_flight.is_some() {
            return;
        }
        if let (Phase::Running, Some(coordinator)) = (self.phase, &mut self.coordinator) {
            coordinator.request_checkpoint(now_ms, CheckpointKind::Savepoint);
            self.carry_out(now_ms);
        }
    }

    /// Turns the coordinator's actions into commands.
    fn carry_out(&mut self, now_ms: u64) {
        loop {
            let Some(coordinator) = &mut self.coordinator else {
                return;
            };
            let Some(action) = coordinator.poll_action() else {
                return;
            };
            match action {
                CoordinatorAction::Trigger { checkpoint, kind } => self.trigger(checkpoint, kind),
                CoordinatorAction::Complete(completed) => {
                    let checkpoint = completed.checkpoint;
                    self.acked.remove(&checkpoint);
                    self.persisting.push(checkpoint);
                    self.commands.push_back(Command::Persist {
                        epoch: self.epoch,
                        checkpoint,
                        kind: completed.kind,
                        is_final: self.final_from.is_some_and(|first| checkpoint >= first),
                        parts: completed.parts,
                    });
                }
                CoordinatorAction::Abort {
                    checkpoint, reason, ..
                } => {
                    self.abort(checkpoint, format!("{reason:?}"), reason.is_failure());
                    if self.savepoint_in_flight == Some(checkpoint) {
                        self.savepoint_in_flight = None;
                        self.request_savepoint(now_ms);
                    }
                }
                CoordinatorAction::FailJob {
                    consecutive_failures,
                } => self.commands.push_back(Command::CheckpointsFailing {
                    consecutive_failures,
                }),
            }
        }
    }

    fn trigger(&mut self, checkpoint: CheckpointId, kind: CheckpointKind) {
        self.highest = self.highest.max(checkpoint);
        self.commands
            .push_back(Command::Triggered { checkpoint, kind });
        // Only a stop makes a savepoint the stop savepoint; one asked for
        // by itself is stored and the job goes on.
        if kind == CheckpointKind::Savepoint && self.stop_requested {
            self.savepoint_in_flight = Some(checkpoint);
        }
        let Some(coordinator) = &self.coordinator else {
            return;
        };
        for &node in coordinator.initiators() {
            self.commands.push_back(Command::Send {
                node,
                message: ToSubtask::Trigger(checkpoint, kind),
            });
        }
    }

    /// Reports an aborted checkpoint and tells every running subtask.
    fn abort(&mut self, checkpoint: CheckpointId, reason: String, failure: bool) {
        self.acked.remove(&checkpoint);
        self.commands.push_back(Command::Aborted {
            checkpoint,
            reason,
            failure,
        });
        for (node, &region) in self.config.region_of.iter().enumerate() {
            if self.regions[region].running {
                self.commands.push_back(Command::Send {
                    node,
                    message: ToSubtask::Abort(checkpoint),
                });
            }
        }
    }

    /// Whether every subtask committed a checkpoint that ends the job: one
    /// triggered after every input ended, or the stop savepoint. Never
    /// while a region restarts.
    fn all_committed(&self) -> bool {
        if self.coordinator.is_none() {
            return false;
        }
        let all_from = |first: CheckpointId| {
            self.nodes
                .iter()
                .all(|node| node.committed.is_some_and(|checkpoint| checkpoint >= first))
        };
        let ended = self.final_from.is_some_and(all_from);
        let stopped = self.stop_requested && self.stop_savepoint.is_some_and(all_from);
        ended || stopped
    }

    fn finish(&mut self, ending: Ending) {
        self.phase = Phase::Done;
        self.coordinator = None;
        self.commands.push_back(Command::Finish(ending));
    }
}

/// The coordinator's configuration for a machine's schedule.
fn coordinator_config(config: &MachineConfig, first_checkpoint: CheckpointId) -> CoordinatorConfig {
    CoordinatorConfig {
        interval_ms: config.interval_ms,
        min_pause_ms: config.min_pause_ms,
        max_concurrent: config.max_concurrent,
        timeout_ms: config.timeout_ms,
        tolerable_failures: config.tolerable_failures,
        first_checkpoint,
    }
}
