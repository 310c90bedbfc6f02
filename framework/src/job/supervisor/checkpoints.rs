//! The supervisor's checkpoint bookkeeping: triggering checkpoints (and
//! the stop savepoint), carrying out what the [`Coordinator`] decides,
//! handing completed checkpoints to the writer and counting the ones the
//! store could not persist, and each checkpoint's span and figures.
//!
//! It never touches a region's pool or a node's generation; failures and
//! restarts are `failover`'s. Everything here runs on the supervisor's
//! actor and never blocks it: store work goes to the writer thread.

use super::*;
use crate::job::inspect::{role_key, OperatorRole};
use std::collections::BTreeMap;

impl Supervisor {
    /// The span of one checkpoint's events, under the job's span: the one
    /// made at its trigger while it is tracked.
    pub(super) fn checkpoint_span(&self, checkpoint: CheckpointId) -> tracing::Span {
        match self.tracked.get(&checkpoint) {
            Some(tracked) => tracked.span.clone(),
            None => {
                tracing::info_span!(parent: &self.span, "checkpoint", checkpoint = checkpoint.0)
            }
        }
    }

    /// Every region runs: a new coordinator numbers on from the newest
    /// checkpoint ever triggered. Subtasks whose inputs ended (in regions
    /// that kept running) are triggered directly, as before.
    pub(super) fn resume_checkpoints(
        &mut self,
        context: &mut Context<Self>,
    ) -> Result<(), JobError> {
        let config = &self.plan.config;
        let now_ms = self.now_ms();
        let mut coordinator = Coordinator::new(
            CoordinatorConfig {
                interval_ms: config.checkpoint_interval_ms,
                min_pause_ms: config.min_pause_ms,
                max_concurrent: config.max_concurrent_checkpoints,
                timeout_ms: config.checkpoint_timeout_ms,
                tolerable_failures: config.tolerable_checkpoint_failures,
                first_checkpoint: self.highest_triggered.next(),
            },
            self.plan.node_count(),
            self.plan.snapshot.initiators.clone(),
            now_ms,
        )?;
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
        self.restarts.on_running(now_ms);
        self.check_final(now_ms);
        self.carry_out(context);
        self.request_savepoint(context);
        Ok(())
    }

    /// Once every input ended, the next checkpoint is the final one.
    pub(super) fn check_final(&mut self, now_ms: u64) {
        let Some(coordinator) = &mut self.coordinator else {
            return;
        };
        if self.final_from.is_none() && self.nodes.iter().all(|node| node.ended) {
            // Every checkpoint from the next one on sees every input ended,
            // so its completion commits all output.
            let final_from = self.highest_triggered.next();
            self.final_from = Some(final_from);
            // A checkpoint still being written would only delay the final
            // one, which holds all it holds (the writer's module doc).
            self.writer.subsume_below(final_from);
            coordinator.request_checkpoint(now_ms, CheckpointKind::Requested);
        }
    }

    /// Re-arms the coordinator's timer for its next deadline.
    pub(super) fn reschedule(&mut self, context: &mut Context<Self>) {
        if let Some(timer) = self.timer.take() {
            context.cancel_future(timer);
        }
        let Some(coordinator) = &self.coordinator else {
            return;
        };
        if self.phase != Phase::Running {
            return;
        }
        // While a completed checkpoint is still being written, the schedule
        // pauses: otherwise a store slower than the interval would queue
        // persists without bound (Flink likewise counts a checkpoint as
        // pending until it is finalized). Requested checkpoints (the final
        // one) still start at once, through `request_checkpoint`.
        if !self.persisting.is_empty() {
            return;
        }
        if let Some(due_ms) = coordinator.poll_timeout() {
            let delay_ms = due_ms.saturating_sub(self.now_ms());
            self.timer = Some(context.run_later(
                Duration::from_millis(delay_ms),
                |supervisor, context| {
                    supervisor.timer = None;
                    let now_ms = supervisor.now_ms();
                    if let Some(coordinator) = &mut supervisor.coordinator {
                        coordinator.handle_timeout(now_ms);
                    }
                    supervisor.carry_out(context);
                },
            ));
        }
    }

    /// Carries out the coordinator's actions, then re-arms the timer.
    pub(super) fn carry_out(&mut self, context: &mut Context<Self>) {
        let Some(coordinator) = &mut self.coordinator else {
            return;
        };
        let actions: Vec<CoordinatorAction<PendingPart>> =
            std::iter::from_fn(|| coordinator.poll_action()).collect();
        for action in actions {
            if self.phase != Phase::Running || self.coordinator.is_none() {
                return;
            }
            match action {
                CoordinatorAction::Trigger { checkpoint, kind } => {
                    self.trigger(checkpoint, kind);
                }
                CoordinatorAction::Complete(completed) => {
                    self.persist(
                        completed.checkpoint,
                        completed.kind,
                        completed.parts,
                        context,
                    );
                }
                CoordinatorAction::Abort {
                    checkpoint, reason, ..
                } => {
                    self.on_abort(checkpoint, &format!("{reason:?}"), reason.is_failure());
                    if self.savepoint_in_flight == Some(checkpoint) {
                        self.savepoint_in_flight = None;
                        self.request_savepoint(context);
                    }
                }
                CoordinatorAction::FailJob {
                    consecutive_failures,
                } => {
                    let failure = Failure::Checkpoints {
                        consecutive_failures,
                        persist: self.persist_failure.take(),
                    };
                    let regions = (0..self.regions.len()).collect();
                    self.fail(regions, failure, context);
                }
            }
        }
        self.reschedule(context);
    }

    /// Reports and forgets an aborted checkpoint and tells every running
    /// subtask.
    pub(super) fn on_abort(&mut self, checkpoint: CheckpointId, reason: &str, failure: bool) {
        let span = self.checkpoint_span(checkpoint);
        let _entered = span.enter();
        let duration_ms = self
            .tracked
            .remove(&checkpoint)
            .map_or(0, |tracked| millis(tracked.triggered_at.elapsed()));
        tracing::info!(
            checkpoint = checkpoint.0,
            duration_ms,
            reason,
            "checkpoint aborted"
        );
        self.metrics_failed(checkpoint, reason);
        if failure {
            self.report.failed_checkpoints.push(FailedCheckpoint {
                checkpoint: checkpoint.0,
                reason: reason.to_owned(),
            });
        }
        self.broadcast(Control::Abort(checkpoint));
    }

    pub(super) fn trigger(&mut self, checkpoint: CheckpointId, kind: CheckpointKind) {
        let span = tracing::info_span!(parent: &self.span, "checkpoint", checkpoint = checkpoint.0);
        {
            let _entered = span.enter();
            tracing::info!(checkpoint = checkpoint.0, ?kind, "checkpoint triggered");
        }
        self.highest_triggered = self.highest_triggered.max(checkpoint);
        self.metrics_triggered(checkpoint, kind);
        self.tracked.insert(
            checkpoint,
            Tracked {
                triggered_at: Instant::now(),
                alignment_max_us: 0,
                span,
            },
        );
        // Only a stop makes a savepoint the stop savepoint; one asked for
        // by `RunningJob::trigger_savepoint` is stored and the job goes on.
        if kind == CheckpointKind::Savepoint && self.stop_requested {
            self.savepoint_in_flight = Some(checkpoint);
        }
        let Some(coordinator) = &self.coordinator else {
            return;
        };
        for &node in coordinator.initiators() {
            if let Some(inject) = &self.nodes[node].inject {
                // The kind travels with the trigger and every barrier:
                // keyed cores write a savepoint whole.
                inject.do_send(Inject(Control::Trigger(checkpoint, kind)));
            }
        }
    }

    /// The job's key-group layout, as its checkpoints record it.
    pub(super) fn key_group_layout(&self) -> KeyGroupLayout {
        KeyGroupLayout {
            max_parallelism: self.plan.config.max_parallelism,
            operator_parallelism: self
                .plan
                .operators
                .iter()
                .map(|operator| (operator.name.clone(), operator.parallelism as u32))
                .collect(),
        }
    }

    pub(super) fn persist(
        &mut self,
        checkpoint: CheckpointId,
        kind: CheckpointKind,
        parts: Vec<PendingPart>,
        context: &mut Context<Self>,
    ) {
        let parts: Vec<(PartId, PendingPart)> = parts
            .into_iter()
            .enumerate()
            .map(|(node, bytes)| (self.plan.part_id(node), bytes))
            .collect();
        self.positions.on_persist(checkpoint, &parts);
        let request = CommitRequest {
            key_groups: self.key_group_layout(),
            expected_parts: Some(parts.iter().map(|(part, _)| part.clone()).collect()),
            ..CommitRequest::default()
        };
        let mut request = request;
        record_roles(&self.plan, &mut request.user);
        if self.final_from.is_some_and(|first| checkpoint >= first) {
            // Every input had ended: a later run on this store has nothing
            // left to do (see `recovery`).
            request
                .user
                .insert(FINAL_KEY.to_owned(), FINAL_VALUE.to_owned());
        }
        let kind = match kind {
            CheckpointKind::Savepoint => storage::CheckpointKind::Savepoint,
            CheckpointKind::Periodic | CheckpointKind::Requested => {
                storage::CheckpointKind::Checkpoint
            }
        };
        self.persisting.insert(checkpoint);
        let job = WriterJob::Persist {
            epoch: self.epoch,
            checkpoint,
            kind,
            parts,
            request,
        };
        if self.writer.send(job).is_err() {
            self.finish(
                Err(JobError::Internal("the checkpoint writer stopped".into())),
                context,
            );
        }
    }

    /// Asks the coordinator for the stop savepoint (again, after an abort
    /// or a restart); while a region restarts it is asked once every region
    /// runs again.
    pub(super) fn request_savepoint(&mut self, context: &mut Context<Self>) {
        if !self.stop_requested || self.savepoint_in_flight.is_some() {
            return;
        }
        let now_ms = self.now_ms();
        if let (Phase::Running, Some(coordinator)) = (self.phase, &mut self.coordinator) {
            coordinator.request_checkpoint(now_ms, CheckpointKind::Savepoint);
            self.carry_out(context);
        }
    }

    pub(super) fn on_persisted(&mut self, persisted: Persisted, context: &mut Context<Self>) {
        let checkpoint = persisted.checkpoint;
        self.persisting.remove(&checkpoint);
        self.reschedule(context);
        let span = self.checkpoint_span(checkpoint);
        let _entered = span.enter();
        let (duration_ms, alignment_max_us) =
            self.tracked.remove(&checkpoint).map_or((0, 0), |tracked| {
                (
                    millis(tracked.triggered_at.elapsed()),
                    tracked.alignment_max_us,
                )
            });
        match persisted.outcome {
            PersistOutcome::Persisted(size) => {
                tracing::info!(
                    checkpoint = checkpoint.0,
                    duration_ms,
                    size_bytes = size.size_bytes,
                    written_bytes = size.written_bytes,
                    alignment_max_us,
                    "checkpoint complete"
                );
                self.metrics_completed(checkpoint, size.size_bytes, &size.part_bytes);
                self.report.checkpoints.push(CheckpointReport {
                    checkpoint: checkpoint.0,
                    duration_ms,
                    size_bytes: size.size_bytes,
                    written_bytes: size.written_bytes,
                    alignment_max_us,
                });
                // Progress is judged by the positions it holds, not by its
                // completion (a source that waits before it reads lets
                // checkpoints complete where it restored).
                self.positions.on_persisted(checkpoint, true);
                self.update_status(|status| {
                    status.last_completed_checkpoint =
                        status.last_completed_checkpoint.max(Some(checkpoint.0));
                });
                if self.savepoint_in_flight == Some(checkpoint) {
                    self.savepoint_in_flight = None;
                    self.report.savepoint = Some(checkpoint.0);
                }
                if self.phase == Phase::Running {
                    self.broadcast(Control::Complete(checkpoint));
                }
            }
            PersistOutcome::Subsumed => {
                self.positions.on_persisted(checkpoint, false);
                // Not a failure: the final checkpoint holds all it held.
                tracing::info!(
                    checkpoint = checkpoint.0,
                    duration_ms,
                    "checkpoint subsumed by the final checkpoint"
                );
                self.metrics_failed(checkpoint, "subsumed by the final checkpoint");
                self.report.subsumed_checkpoints.push(checkpoint.0);
            }
            PersistOutcome::Failed(error) => {
                self.positions.on_persisted(checkpoint, false);
                tracing::warn!(
                    checkpoint = checkpoint.0,
                    duration_ms,
                    "checkpoint not persisted: {error}"
                );
                let reason = format!("not persisted: {error}");
                self.metrics_failed(checkpoint, &reason);
                self.report.failed_checkpoints.push(FailedCheckpoint {
                    checkpoint: checkpoint.0,
                    reason,
                });
                self.count_persist_failure(persisted.epoch, checkpoint, error, context);
                if self.savepoint_in_flight == Some(checkpoint) {
                    self.savepoint_in_flight = None;
                    self.request_savepoint(context);
                }
            }
        }
    }

    /// A checkpoint that could not be persisted is a failed checkpoint for
    /// the coordinator's tolerance. The coordinator that completed it must
    /// still be running (same epoch); a failure of an earlier coordinator's
    /// checkpoint is only reported, because a new coordinator (after a
    /// restart) counts from zero.
    pub(super) fn count_persist_failure(
        &mut self,
        epoch: u64,
        checkpoint: CheckpointId,
        error: StoreError,
        context: &mut Context<Self>,
    ) {
        if epoch != self.epoch || self.phase != Phase::Running {
            return;
        }
        let now_ms = self.now_ms();
        let Some(coordinator) = &mut self.coordinator else {
            return;
        };
        self.persist_failure = Some((checkpoint, error));
        coordinator.on_persist_failed(now_ms, checkpoint);
        self.carry_out(context);
        // Only a `FailJob` of this very call takes the error.
        self.persist_failure = None;
    }
}

/// Records which operators are sources and which are sinks in a
/// checkpoint's user metadata, so that a tool without the job's code
/// knows a source's part holds its position and a sink's its state
/// (`job::inspect::CheckpointView::operator_role`).
fn record_roles(plan: &PhysicalPlan, user: &mut BTreeMap<String, String>) {
    let kinds = super::metrics::operator_kinds(plan);
    for (operator, kind) in plan.operators.iter().zip(kinds) {
        let role = match kind {
            crate::metrics::OperatorKind::Source => OperatorRole::Source,
            crate::metrics::OperatorKind::Sink => OperatorRole::Sink,
            crate::metrics::OperatorKind::Operator => continue,
        };
        user.insert(role_key(&operator.name), role.name().to_owned());
    }
}
