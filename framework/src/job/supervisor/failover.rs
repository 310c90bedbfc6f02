//! The supervisor's failover: loading the checkpoint a region restores
//! from, starting a region's generation on a fresh pool, turning a failure
//! report into a region restart (or the job's end, once the restart
//! strategy says so), and stopping a failed region's pool off the actor.
//!
//! It never triggers or completes a checkpoint, and what a failure means
//! (the job's end or a region's restart) the machine decides; this asks
//! the restart strategy whether and when to restart, then tells the
//! machine which regions stopped and which generations started.

use super::*;
use crate::restart::GiveUpReason;

impl Supervisor {
    /// Asks the writer for the newest checkpoint, to start `region`
    /// (`None`: every region).
    pub(super) fn request_load(&mut self, region: Option<usize>, context: &mut Context<Self>) {
        let generation = match region {
            Some(region) => self.regions[region].generation,
            None => self.newest_generation,
        };
        if self
            .writer
            .send(WriterJob::Load { region, generation })
            .is_err()
        {
            self.finish(
                Err(JobError::Internal("the checkpoint writer stopped".into())),
                context,
            );
        }
    }

    pub(super) fn on_loaded(&mut self, loaded: Loaded, context: &mut Context<Self>) {
        let targets: Vec<usize> = match loaded.region {
            None if self.phase == Phase::Loading => (0..self.regions.len()).collect(),
            Some(region)
                if self.phase == Phase::Running
                    && self.regions[region].phase == RegionPhase::Loading
                    && self.regions[region].generation == loaded.generation =>
            {
                vec![region]
            }
            _ => return,
        };
        let started = match loaded.result {
            Ok(recovery) => self.apply_recovery(&targets, recovery, context),
            Err(error) if error.is_retryable() => {
                self.retry_load(loaded.region, error, context);
                return;
            }
            Err(error) => Err(error),
        };
        if let Err(error) = started {
            let span = self.span.clone();
            let _entered = span.enter();
            tracing::error!(%error, "the job cannot start");
            self.finish(Err(error), context);
        }
    }

    /// Loading failed in a way that may pass (the store's I/O, a sink's
    /// external system away for a moment): the restart strategy decides
    /// whether and when to load again, as for any other failure.
    fn retry_load(&mut self, region: Option<usize>, error: JobError, context: &mut Context<Self>) {
        let span = self.span.clone();
        let _entered = span.enter();
        match self.restarts.on_failure(self.now_ms()) {
            RestartDecision::Restart { delay_ms, attempt } => {
                tracing::warn!(attempt, delay_ms, %error, "loading the checkpoint to restore failed; retrying");
                self.update_status(|status| status.restarts = attempt);
                let delay = Duration::from_millis(delay_ms);
                context.run_later(delay, move |supervisor, context| {
                    if supervisor.phase != Phase::Done {
                        supervisor.request_load(region, context);
                    }
                });
            }
            RestartDecision::GiveUp { reason } => {
                tracing::error!(%error, %reason, "the job cannot start");
                let error = JobError::RestartsExhausted {
                    restarts: self.restarts.attempts(),
                    reason: reason.to_string(),
                    cause: error.to_string(),
                };
                self.finish(Err(error), context);
            }
        }
    }

    /// Takes in what recovery found (fallbacks, accepted duplicates, the
    /// floor of new ids), then starts the regions, or ends a job that had
    /// already finished.
    fn apply_recovery(
        &mut self,
        targets: &[usize],
        recovery: Recovery,
        context: &mut Context<Self>,
    ) -> Result<(), JobError> {
        let id_floor = CheckpointId(recovery.id_floor);
        let fallbacks = recovery.fallbacks.len();
        self.report.fallbacks.extend(recovery.fallbacks);
        self.update_status(|status| status.fallbacks += fallbacks);
        if !recovery.replayed.is_empty() {
            self.report.guarantee = Guarantee::AtLeastOnce;
            for reason in recovery.replayed {
                if !self.report.guarantee_reasons.contains(&reason) {
                    self.report.guarantee_reasons.push(reason);
                }
            }
        }
        if recovery.finished {
            let restored = recovery
                .restored
                .as_ref()
                .map(|(checkpoint, ..)| checkpoint.0);
            if let Some((checkpoint, parts, layout)) = recovery.restored {
                // The job as declared now must still fit the checkpoint
                // (parallelism, key groups), as it would for a real run.
                let parts = self.plan.redistribute(parts, &layout)?;
                // No subtask runs to publish its state at the end of its
                // input, so the handles get the final checkpoint's.
                self.plan.publish_restored(checkpoint.0, &parts)?;
            }
            let span = self.span.clone();
            let _entered = span.enter();
            tracing::warn!(
                checkpoint = restored,
                "the job already finished: its newest checkpoint is its final one, so \
                 nothing runs and no checkpoint is written"
            );
            let mut report = self.final_report();
            report.resumed_from = restored;
            report.already_finished = true;
            self.finish(Ok(report), context);
            return Ok(());
        }
        self.start_regions(targets, recovery.restored, id_floor, context)
    }

    /// Starts a new generation of every region in `targets` from the
    /// restored checkpoint (its parts of it), and tells the machine, which
    /// resumes checkpoints once every region runs. New checkpoint ids
    /// start above `id_floor` and the restored checkpoint.
    pub(super) fn start_regions(
        &mut self,
        targets: &[usize],
        restored: Restored,
        id_floor: CheckpointId,
        context: &mut Context<Self>,
    ) -> Result<(), JobError> {
        let span = self.span.clone();
        let _entered = span.enter();
        let (last_completed, parts) = match restored {
            Some((checkpoint, parts, layout)) => {
                (Some(checkpoint), self.plan.redistribute(parts, &layout)?)
            }
            None => (None, Default::default()),
        };
        let id_floor = id_floor.max(last_completed.unwrap_or(CheckpointId(0)));
        let restored_from = last_completed.map(|checkpoint| checkpoint.0);
        for &region in targets {
            self.positions.on_restored(region, &self.plan, &parts);
            self.start_region(region, &parts, last_completed, context)?;
        }
        if self.phase == Phase::Loading {
            self.phase = Phase::Running;
            self.report.resumed_from = restored_from;
        }
        for &region in targets {
            let Some(pending) = self.regions[region].pending.take() else {
                continue;
            };
            let recovery_ms = millis(pending.since.elapsed());
            let generation = self.regions[region].generation.0;
            tracing::warn!(
                region = %self.regions[region].operators.join(","),
                attempt = pending.attempt,
                delay_ms = pending.delay_ms,
                cause = %pending.cause,
                restored_from = %restored_from.map_or("nothing".to_string(), |id| id.to_string()),
                generation,
                recovery_ms,
                "region restarted"
            );
            let restart = RestartReport {
                generation,
                region: self.regions[region].operators.clone(),
                cause: pending.cause,
                failure: pending.report,
                checkpoint_in_flight: pending.checkpoint_in_flight,
                restored_from,
                recovery_ms,
            };
            self.metrics_restarted(&restart);
            self.report.restarts.push(restart);
        }
        for &region in targets {
            let generation = self.regions[region].generation;
            let started = Event::RegionStarted {
                region,
                generation,
                id_floor,
            };
            let now_ms = self.now_ms();
            self.machine.handle(started, now_ms);
        }
        self.drive(context);
        Ok(())
    }

    /// Starts one generation of `region`'s subtasks on a pool of its own.
    pub(super) fn start_region(
        &mut self,
        region: usize,
        parts: &std::collections::BTreeMap<PartId, Vec<u8>>,
        last_completed: Option<CheckpointId>,
        context: &mut Context<Self>,
    ) -> Result<(), JobError> {
        let members: Vec<bool> = self
            .nodes
            .iter()
            .map(|node| node.region == region)
            .collect();
        let node_count = self.regions[region].nodes.len();
        let arbiters = self
            .plan
            .config
            .arbiters
            .and_then(NonZeroUsize::new)
            .unwrap_or_else(|| PoolConfig::default().arbiters);
        // A region never needs more threads than it has subtasks.
        let arbiters = NonZeroUsize::new(arbiters.get().min(node_count)).unwrap_or(arbiters);
        let pool = ArbiterPool::new(PoolConfig { arbiters })?;
        let address = context.address();
        let links = SupervisorLinks {
            events: address.clone().recipient(),
            failures: FailureSink::from_recipient(address.recipient()),
            span: self.span.clone(),
        };
        let generation = self.regions[region].generation;
        let mut handles = start_generation(
            &self.plan,
            &pool,
            generation,
            &links,
            parts,
            last_completed,
            &members,
        )?;
        self.update_status(|status| status.generation = status.generation.max(generation.0));
        for &node in &self.regions[region].nodes {
            let state = &mut self.nodes[node];
            state.generation = generation;
            state.inject = handles.injects[node].take();
        }
        let state = &mut self.regions[region];
        state.channel_stats = handles.channel_stats;
        state.pool = Some(pool);
        state.phase = RegionPhase::Running;
        tracing::info!(
            region = %state.operators.join(","),
            generation = generation.0,
            restored_from = last_completed.map(|checkpoint| checkpoint.0),
            "generation started"
        );
        Ok(())
    }

    pub(super) fn on_failure_report(&mut self, report: FailureReport, context: &mut Context<Self>) {
        if self.phase != Phase::Running {
            return;
        }
        let Some(node) = self.node_of(&report.tag) else {
            tracing::warn!(tag = %report.tag, "a failure report from an unknown subtask");
            return;
        };
        let state = &self.nodes[node];
        if state.generation != report.tag.generation
            || self.regions[state.region].phase != RegionPhase::Running
        {
            return;
        }
        // The machine decides what the failure means; the commands it
        // causes take the report from here.
        let event = Event::Failed {
            node,
            generation: report.tag.generation,
            retryable: report.retryable,
        };
        self.failure_in_hand = Some(report);
        self.feed(event, context);
        self.failure_in_hand = None;
    }

    /// The node of an actor tag (operator name and subtask).
    pub(super) fn node_of(&self, tag: &ActorTag) -> Option<usize> {
        let operator = *self.operator_index.get(&*tag.operator)?;
        let planned = &self.plan.operators[operator];
        (tag.subtask < planned.parallelism).then_some(planned.first_node + tag.subtask)
    }

    /// Stops the failed regions and restarts them per the strategy, or
    /// gives up.
    pub(super) fn fail(
        &mut self,
        failed: Vec<usize>,
        failure: Failure,
        context: &mut Context<Self>,
    ) {
        let span = self.span.clone();
        let _entered = span.enter();
        let cause = failure.to_string();
        let operators: Vec<&str> = failed
            .iter()
            .flat_map(|&region| self.regions[region].operators.iter().map(String::as_str))
            .collect();
        let region_text = operators.join(",");
        let positions = self.positions.of_failure(&failed);
        match self.restarts.on_failure_at(self.now_ms(), positions) {
            RestartDecision::GiveUp { reason } => {
                let reason = self.give_up_text(reason, &failed, &failure);
                tracing::error!(region = %region_text, %cause, %reason, "job failed");
                let restarts = self.restarts.attempts();
                let error = match failure {
                    Failure::Checkpoints {
                        consecutive_failures,
                        persist: Some((checkpoint, error)),
                    } => JobError::CheckpointPersistFailed {
                        checkpoint: checkpoint.0,
                        consecutive_failures,
                        restarts,
                        reason,
                        error,
                    },
                    _ => JobError::RestartsExhausted {
                        restarts,
                        reason,
                        cause,
                    },
                };
                self.finish(Err(error), context);
            }
            RestartDecision::Restart { delay_ms, attempt } => {
                tracing::warn!(
                    region = %region_text,
                    attempt,
                    delay_ms,
                    %cause,
                    "restarting a failover region"
                );
                self.update_status(|status| status.restarts = attempt);
                // Checkpoints in flight are aborted (the machine tells the
                // subtasks outside `failed`) and suspended until every
                // region runs again.
                let now_ms = self.now_ms();
                let stopped = Event::RegionsStopped {
                    regions: failed.clone(),
                };
                self.machine.handle(stopped, now_ms);
                let pending = PendingRestart::new(&failure, attempt, delay_ms);
                for region in failed {
                    if self.regions[region].phase == RegionPhase::Running {
                        self.stop_region(region, pending.clone(), delay_ms, context);
                    }
                }
            }
        }
    }

    /// Why the restart strategy gave up, in words: a job that made no
    /// progress also names the failing operator and the source positions
    /// the failed regions restored every time (the failing record is at
    /// or after them).
    fn give_up_text(&self, reason: GiveUpReason, failed: &[usize], failure: &Failure) -> String {
        if !matches!(reason, GiveUpReason::NoCheckpointBetweenFailures { .. }) {
            return reason.to_string();
        }
        let operator = match failure {
            Failure::Operator { report, .. } => format!(
                "operator `{}` (subtask {}) failed each time",
                report.tag.operator, report.tag.subtask
            ),
            Failure::Checkpoints { .. } => "checkpoints failed each time".to_owned(),
        };
        format!(
            "{reason}; {operator}, from the same source positions: {}",
            self.positions.describe_restored(failed)
        )
    }

    /// Stops a region's generation: its pool shuts down on a helper thread,
    /// which reports back when every actor of it is gone.
    pub(super) fn stop_region(
        &mut self,
        region: usize,
        pending: PendingRestart,
        delay_ms: u64,
        context: &mut Context<Self>,
    ) {
        self.abort_region_snapshots(region, context);
        self.fold_stats(region);
        let state = &mut self.regions[region];
        for ticker in state.tickers.drain(..) {
            context.cancel_future(ticker);
        }
        state.phase = RegionPhase::Stopping;
        state.pending = Some(pending);
        state.restart_delay_ms = delay_ms;
        for &node in &state.nodes {
            self.nodes[node].inject = None;
        }
        let generation = state.generation;
        let address = context.address();
        let pool = state.pool.take();
        let stop = move || {
            if let Some(pool) = pool {
                if let Err(error) = pool.shutdown() {
                    tracing::warn!("stopping a failed generation: {error}");
                }
            }
            address.do_send(PoolStopped { region, generation });
        };
        // Joining the arbiter threads can wait for user code to return, so
        // it happens off the supervisor's thread.
        let spawned = thread::Builder::new()
            .name("snapflow-stop".into())
            .spawn(stop);
        if spawned.is_err() {
            // The closure (and the pool in it) was dropped, which shut the
            // pool down on this thread; carry on.
            tracing::error!("could not start the thread that stops a generation");
            context
                .address()
                .do_send(PoolStopped { region, generation });
        }
    }

    pub(super) fn on_pool_stopped(&mut self, stopped: PoolStopped, context: &mut Context<Self>) {
        let region = stopped.region;
        let Some(state) = self.regions.get(region) else {
            return;
        };
        if self.phase != Phase::Running
            || state.generation != stopped.generation
            || state.phase != RegionPhase::Stopping
        {
            return;
        }
        let delay = Duration::from_millis(state.restart_delay_ms);
        context.run_later(delay, move |supervisor, context| {
            if supervisor.phase != Phase::Running {
                return;
            }
            supervisor.newest_generation = Generation(supervisor.newest_generation.0 + 1);
            let state = &mut supervisor.regions[region];
            state.generation = supervisor.newest_generation;
            state.phase = RegionPhase::Loading;
            supervisor.request_load(Some(region), context);
        });
    }

    /// Folds a region's channel statistics into the report (once per
    /// generation).
    pub(super) fn fold_stats(&mut self, region: usize) {
        for (operator, stats) in self.regions[region].channel_stats.drain(..) {
            let report = &mut self.report.operators[operator];
            report.in_flight_batches_peak = report
                .in_flight_batches_peak
                .max(stats.in_flight_batches_peak());
            report.credit_stalls += stats.credit_stalls();
        }
    }
}

/// The failover regions of a plan, and per node its region.
pub(super) fn plan_regions(plan: &PhysicalPlan) -> (Vec<Region>, Vec<Node>) {
    let edges = plan.edges.iter().map(|edge| (edge.from, edge.to));
    let partition = failover_regions(plan.node_count(), edges);
    let mut nodes: Vec<Node> = (0..plan.node_count())
        .map(|_| Node {
            region: 0,
            generation: Generation(1),
            inject: None,
        })
        .collect();
    let regions = partition
        .into_iter()
        .enumerate()
        .map(|(region, members)| {
            let mut operators: Vec<usize> = Vec::new();
            for &node in &members {
                nodes[node].region = region;
                let operator = plan.nodes[node].0;
                if !operators.contains(&operator) {
                    operators.push(operator);
                }
            }
            operators.sort_unstable();
            Region {
                nodes: members,
                operators: operators
                    .into_iter()
                    .map(|operator| plan.operators[operator].name.clone())
                    .collect(),
                phase: RegionPhase::Loading,
                generation: Generation(1),
                pool: None,
                channel_stats: Vec::new(),
                tickers: Vec::new(),
                pending: None,
                restart_delay_ms: 0,
            }
        })
        .collect();
    (regions, nodes)
}
