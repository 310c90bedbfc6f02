//! The supervisor's shell around its machine (`machine`): feeding it
//! events at the actor's clock, carrying out its commands (sends to the
//! subtasks, the writer, the timer), and each checkpoint's span, figures
//! and report.
//!
//! It decides nothing about checkpoints itself: what to trigger, when a
//! checkpoint is complete, when the subtasks hear of it, what a failure
//! means are the machine's. It never touches a region's pool; restarts
//! are `failover`'s. Everything here runs on the supervisor's actor and
//! never blocks it: store work goes to the writer thread.

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

    /// Carries out the machine's commands, then re-arms its timer.
    pub(super) fn drive(&mut self, context: &mut Context<Self>) {
        while let Some(command) = self.machine.poll_command() {
            if self.phase == Phase::Done {
                return;
            }
            self.execute(command, context);
        }
        self.reschedule(context);
    }

    /// Hands one event to the machine at the actor's clock and carries out
    /// what it decides.
    pub(super) fn feed(&mut self, event: Event<PendingPart>, context: &mut Context<Self>) {
        let now_ms = self.now_ms();
        self.machine.handle(event, now_ms);
        self.drive(context);
    }

    /// Re-arms the timer for the machine's next deadline.
    pub(super) fn reschedule(&mut self, context: &mut Context<Self>) {
        if let Some(timer) = self.timer.take() {
            context.cancel_future(timer);
        }
        if self.phase != Phase::Running {
            return;
        }
        if let Some(due_ms) = self.machine.poll_timeout() {
            let delay_ms = due_ms.saturating_sub(self.now_ms());
            self.timer = Some(context.run_later(
                Duration::from_millis(delay_ms),
                |supervisor, context| {
                    supervisor.timer = None;
                    supervisor.feed(Event::Timer, context);
                },
            ));
        }
    }

    /// Carries out one command of the machine: I/O and reports only.
    fn execute(&mut self, command: Command<PendingPart>, context: &mut Context<Self>) {
        match command {
            Command::Send { node, message } => {
                let control = match message {
                    ToSubtask::Trigger(checkpoint, kind) => Control::Trigger(checkpoint, kind),
                    ToSubtask::Complete(checkpoint) => Control::Complete(checkpoint),
                    ToSubtask::Abort(checkpoint) => Control::Abort(checkpoint),
                };
                if let Some(inject) = self.nodes.get(node).and_then(|node| node.inject.as_ref()) {
                    inject.do_send(Inject(control));
                }
            }
            Command::Triggered { checkpoint, kind } => self.triggered(checkpoint, kind),
            Command::Persist {
                epoch,
                checkpoint,
                kind,
                is_final,
                parts,
            } => self.persist(epoch, checkpoint, kind, is_final, parts, context),
            Command::SubsumeBelow(checkpoint) => self.writer.subsume_below(checkpoint),
            Command::Aborted {
                checkpoint,
                reason,
                failure,
            } => self.on_abort(checkpoint, &reason, failure),
            Command::Durable {
                checkpoint,
                stop_savepoint,
            } => {
                if stop_savepoint {
                    self.report.savepoint = Some(checkpoint.0);
                }
            }
            Command::RegionFailed {
                region,
                node: _,
                checkpoint_in_flight,
            } => {
                let Some(report) = self.failure_in_hand.take() else {
                    return;
                };
                let text = report.to_string();
                self.metrics_failure(&text);
                self.update_status(|status| status.last_failure = Some(text));
                let failure = Failure::Operator {
                    report,
                    checkpoint_in_flight,
                };
                self.fail(vec![region], failure, context);
            }
            Command::CheckpointsFailing {
                consecutive_failures,
            } => {
                let failure = Failure::Checkpoints {
                    consecutive_failures,
                    persist: self.persist_failure.take(),
                };
                let regions = (0..self.regions.len()).collect();
                self.fail(regions, failure, context);
            }
            Command::Resumed => {
                let now_ms = self.now_ms();
                self.restarts.on_running(now_ms);
            }
            Command::Finish(ending) => self.on_ending(ending, context),
        }
    }

    /// The machine ended the job.
    fn on_ending(&mut self, ending: Ending, context: &mut Context<Self>) {
        match ending {
            Ending::Finished => {
                let report = self.final_report();
                self.finish(Ok(report), context);
            }
            Ending::Cancelled => {
                let span = self.span.clone();
                let _entered = span.enter();
                tracing::info!("job cancelled");
                self.finish(Err(JobError::Cancelled), context);
            }
            Ending::NotRetryable { .. } => {
                let Some(report) = self.failure_in_hand.take() else {
                    let error = JobError::Internal("a failure ended the job unreported".into());
                    return self.finish(Err(error), context);
                };
                let text = report.to_string();
                self.metrics_failure(&text);
                self.update_status(|status| status.last_failure = Some(text));
                let span = self.span.clone();
                let _entered = span.enter();
                tracing::error!(failure = %report, "job failed with an error that retrying cannot fix");
                let error = JobError::NotRetryable {
                    restarts: self.restarts.attempts(),
                    cause: report.to_string(),
                    failure: report,
                };
                self.finish(Err(error), context);
            }
        }
    }

    /// Reports and forgets an aborted checkpoint (the machine tells the
    /// subtasks).
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
    }

    /// A checkpoint was triggered: its span and figures start.
    fn triggered(&mut self, checkpoint: CheckpointId, kind: CheckpointKind) {
        let span = tracing::info_span!(parent: &self.span, "checkpoint", checkpoint = checkpoint.0);
        {
            let _entered = span.enter();
            tracing::info!(checkpoint = checkpoint.0, ?kind, "checkpoint triggered");
        }
        self.metrics_triggered(checkpoint, kind);
        self.tracked.insert(
            checkpoint,
            Tracked {
                triggered_at: Instant::now(),
                alignment_max_us: 0,
                span,
            },
        );
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

    /// Hands a completed checkpoint to the writer.
    fn persist(
        &mut self,
        epoch: u64,
        checkpoint: CheckpointId,
        kind: CheckpointKind,
        is_final: bool,
        parts: Vec<PendingPart>,
        context: &mut Context<Self>,
    ) {
        let parts: Vec<(PartId, PendingPart)> = parts
            .into_iter()
            .enumerate()
            .map(|(node, bytes)| (self.plan.part_id(node), bytes))
            .collect();
        self.positions.on_persist(checkpoint, &parts);
        let mut request = CommitRequest {
            key_groups: self.key_group_layout(),
            expected_parts: Some(parts.iter().map(|(part, _)| part.clone()).collect()),
            ..CommitRequest::default()
        };
        record_roles(&self.plan, &mut request.user);
        if is_final {
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
        let job = WriterJob::Persist {
            epoch,
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

    pub(super) fn on_persisted(&mut self, persisted: Persisted, context: &mut Context<Self>) {
        let checkpoint = persisted.checkpoint;
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
                drop(_entered);
                // The machine tells the subtasks, now that it is durable.
                self.feed(
                    persisted_event(persisted.epoch, checkpoint, PersistResult::Durable),
                    context,
                );
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
                drop(_entered);
                self.feed(
                    persisted_event(persisted.epoch, checkpoint, PersistResult::Subsumed),
                    context,
                );
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
                drop(_entered);
                // The machine counts it as a failed checkpoint; if that is
                // one too many, the restart names this store error.
                self.persist_failure = Some((checkpoint, error));
                self.feed(
                    persisted_event(persisted.epoch, checkpoint, PersistResult::Failed),
                    context,
                );
                self.persist_failure = None;
            }
        }
    }
}

/// The machine's event for a writer's answer.
fn persisted_event(
    epoch: u64,
    checkpoint: CheckpointId,
    outcome: PersistResult,
) -> Event<PendingPart> {
    Event::Persisted {
        epoch,
        checkpoint,
        outcome,
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
