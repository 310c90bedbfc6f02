//! The supervisor's side of snapshots that are not checkpoints: starting
//! them at a chosen subtask, spreading them over its region, collecting
//! one part per subtask into a [`GlobalSnapshot`], and handing it to whoever
//! asked: the caller, an operator, the loop-termination detector or the
//! stuck detector.
//!
//! It owns the collectors (at most [`SNAPSHOTS_IN_FLIGHT_MAX`], each with a
//! timeout), the starts waiting for their node's answer (at most
//! [`STARTS_PENDING_MAX`] per node), the loops it watches and the stuck
//! detector's state. It never decides a protocol question (the shells'
//! concurrent machines do), never touches the coordinator or the store
//! (these snapshots are not checkpoints and are never persisted), and
//! never stops a job because of a finding.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use actix::{AsyncContext, Context, Message};

use crate::job::inspect::CheckpointView;
use crate::job::shell::{Control, PartActivity};
use crate::job::snapshots::detect::{find_deadlock, is_loop_quiescent, Finding, StallTracker};
use crate::job::snapshots::{
    ChannelActivity, GlobalSnapshot, SnapshotError, SnapshotReceiver, SnapshotReply,
    SubtaskActivity, SNAPSHOTS_IN_FLIGHT_MAX,
};
use crate::protocol::SnapshotId;
use crate::runtime::channel::Window;
use crate::runtime::stage::Inject;
use crate::runtime::Generation;
use crate::storage::{CheckpointKind, CheckpointMetadata, PartId};

use super::{RegionPhase, Supervisor};

/// How long a snapshot may take before it fails with
/// [`SnapshotError::TimedOut`] (the detectors use their own).
pub(super) const SNAPSHOT_TIMEOUT_MS: u64 = 30_000;

/// Starts injected into one node and not yet answered by it; one more is
/// refused with [`SnapshotError::TooMany`].
const STARTS_PENDING_MAX: usize = 16;

/// How often a quiescent loop's head is checked by a snapshot once its
/// other inputs ended (after the previous check finished).
const LOOP_CHECK_PAUSE_MS: u64 = 5;

/// Who asked for a snapshot.
pub(super) enum Purpose {
    Caller(SnapshotReply),
    /// The termination detector of the loop headed by this node.
    Loop {
        head: usize,
    },
    /// The stuck detector's snapshot of this region.
    Detector {
        region: usize,
    },
}

struct Collecting {
    purpose: Purpose,
    /// The initiator's region.
    region: usize,
    generation: Generation,
    /// Every node the snapshot covers: the initiator's region for the
    /// detectors, every running region for a caller's or an operator's.
    nodes: Vec<usize>,
    /// The regions of `nodes`; a restart of any of them aborts it.
    regions: Vec<usize>,
    parts: BTreeMap<usize, (Vec<u8>, Box<PartActivity>)>,
}

/// A loop whose end a snapshot decides (`Stream::iterate_until_quiescent`).
struct LoopWatch {
    /// Its operators: those on a cycle through the head.
    operators: Vec<String>,
    checking: bool,
    ended: bool,
}

/// The stuck detector's configuration and state.
struct Detector {
    config: StuckDetection,
    tracker: StallTracker,
    /// Regions with a detector snapshot in flight.
    in_flight: Vec<bool>,
}

/// How the stuck detector runs (see [`RunningJob::detect_stuck`](super::RunningJob::detect_stuck)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StuckDetection {
    /// Time between two snapshots of each region.
    pub interval_ms: u64,
    /// After how many consecutive snapshots without progress a subtask
    /// that holds records is reported as stalled (at least 2).
    pub stalled_after_snapshots: usize,
    /// A detector snapshot not complete after this long reports the
    /// subtasks that did not answer as unresponsive.
    pub timeout_ms: u64,
}

impl Default for StuckDetection {
    /// A snapshot every second, a stall after 3, unresponsive after 10 s.
    fn default() -> Self {
        StuckDetection {
            interval_ms: 1_000,
            stalled_after_snapshots: 3,
            timeout_ms: 10_000,
        }
    }
}

/// Everything the supervisor keeps for snapshots that are not checkpoints.
#[derive(Default)]
pub(super) struct Snapshots {
    collecting: HashMap<SnapshotId, Collecting>,
    /// Per node, the purposes of the starts injected into it, oldest first.
    starts: HashMap<usize, VecDeque<(Purpose, u64)>>,
    loops: HashMap<usize, LoopWatch>,
    detector: Option<Detector>,
}

/// Asks for a snapshot started at `operator`'s subtask `subtask`.
pub(super) struct TakeSnapshot {
    pub(super) operator: String,
    pub(super) subtask: usize,
    pub(super) reply: SnapshotReply,
}

impl Message for TakeSnapshot {
    type Result = ();
}

/// Starts the stuck detector.
pub(super) struct DetectStuck(pub(super) StuckDetection);

impl Message for DetectStuck {
    type Result = ();
}

fn fail(purpose: Purpose, error: SnapshotError) {
    if let Purpose::Caller(reply) = purpose {
        // The caller may have dropped its receiver; nobody then waits.
        let _ = reply.try_send(Err(error));
    }
}

impl Supervisor {
    /// A caller's request: finds the node and starts the snapshot there.
    pub(super) fn on_take_snapshot(&mut self, request: TakeSnapshot, context: &mut Context<Self>) {
        let Some(&operator) = self.operator_index.get(&request.operator) else {
            let operator = request.operator;
            return fail(
                Purpose::Caller(request.reply),
                SnapshotError::UnknownOperator { operator },
            );
        };
        let planned = &self.plan.operators[operator];
        if request.subtask >= planned.parallelism {
            let error = SnapshotError::UnknownSubtask {
                operator: request.operator,
                subtask: request.subtask,
                parallelism: planned.parallelism,
            };
            return fail(Purpose::Caller(request.reply), error);
        }
        let node = planned.first_node + request.subtask;
        let purpose = Purpose::Caller(request.reply);
        self.start_snapshot_at(node, purpose, SNAPSHOT_TIMEOUT_MS, context);
    }

    /// Injects a start into `node`; its answer (`SnapshotStarted`) takes
    /// the purpose back in order.
    fn start_snapshot_at(
        &mut self,
        node: usize,
        purpose: Purpose,
        timeout_ms: u64,
        context: &mut Context<Self>,
    ) {
        let state = &self.nodes[node];
        let running = self.phase == super::Phase::Running
            && self.regions[state.region].phase == RegionPhase::Running;
        let Some(inject) = state.inject.clone().filter(|_| running) else {
            let operator = self.plan.part_id(node).operator;
            return self.snapshot_failed(purpose, SnapshotError::NotRunning { operator }, context);
        };
        let starts = self.snapshots.starts.entry(node).or_default();
        if starts.len() >= STARTS_PENDING_MAX
            || self.snapshots.collecting.len() >= SNAPSHOTS_IN_FLIGHT_MAX
        {
            let max = SNAPSHOTS_IN_FLIGHT_MAX;
            return self.snapshot_failed(purpose, SnapshotError::TooMany { max }, context);
        }
        starts.push_back((purpose, timeout_ms));
        inject.do_send(Inject(Control::StartSnapshot));
    }

    /// A snapshot was started at `node`: collect it, and have every other
    /// subtask it covers take part at once (markers may reach them later,
    /// or never, as in a DAG upstream of the initiator). A caller's or an
    /// operator's snapshot covers the whole running graph: failover
    /// regions share no channel (a region is a connected part of the
    /// subtask graph), so the union of each region's consistent cut is a
    /// consistent cut of the job. The detectors' cover their own region.
    pub(super) fn on_snapshot_started(
        &mut self,
        node: usize,
        snapshot: SnapshotId,
        reply: Option<SnapshotReply>,
        declined: Option<usize>,
        context: &mut Context<Self>,
    ) {
        let (purpose, timeout_ms) = match reply {
            Some(reply) => (Purpose::Caller(reply), SNAPSHOT_TIMEOUT_MS),
            None => match self
                .snapshots
                .starts
                .get_mut(&node)
                .and_then(VecDeque::pop_front)
            {
                Some(start) => start,
                None => return,
            },
        };
        let part = self.plan.part_id(node);
        if let Some(max_concurrent) = declined {
            let error = SnapshotError::Declined {
                operator: part.operator,
                subtask: part.subtask,
                max_concurrent,
            };
            return self.snapshot_failed(purpose, error, context);
        }
        if self.snapshots.collecting.len() >= SNAPSHOTS_IN_FLIGHT_MAX {
            // It runs at the nodes anyway; its parts are dropped on arrival.
            let max = SNAPSHOTS_IN_FLIGHT_MAX;
            return self.snapshot_failed(purpose, SnapshotError::TooMany { max }, context);
        }
        let region = self.nodes[node].region;
        let regions = self.regions_covered(region, &purpose);
        let nodes: Vec<usize> = regions
            .iter()
            .flat_map(|&covered| self.regions[covered].nodes.iter().copied())
            .collect();
        for &other in &nodes {
            if other != node {
                if let Some(inject) = &self.nodes[other].inject {
                    inject.do_send(Inject(Control::JoinSnapshot(snapshot)));
                }
            }
        }
        let generation = self.regions[region].generation;
        self.snapshots.collecting.insert(
            snapshot,
            Collecting {
                purpose,
                region,
                generation,
                nodes,
                regions,
                parts: BTreeMap::new(),
            },
        );
        context.run_later(
            Duration::from_millis(timeout_ms),
            move |supervisor, context| {
                supervisor.on_snapshot_timeout(snapshot, timeout_ms, context);
            },
        );
    }

    pub(super) fn on_snapshot_part(
        &mut self,
        node: usize,
        snapshot: SnapshotId,
        part: Vec<u8>,
        activity: Box<PartActivity>,
        context: &mut Context<Self>,
    ) {
        let Some(collecting) = self.snapshots.collecting.get_mut(&snapshot) else {
            return;
        };
        collecting.parts.insert(node, (part, activity));
        if collecting.parts.len() < collecting.nodes.len() {
            return;
        }
        let Some(collecting) = self.snapshots.collecting.remove(&snapshot) else {
            return;
        };
        match self.assemble(snapshot, collecting.generation, collecting.parts) {
            Ok(global) => self.snapshot_done(collecting.purpose, global, context),
            Err(error) => self.snapshot_failed(collecting.purpose, error, context),
        }
    }

    pub(super) fn on_snapshot_declined(
        &mut self,
        node: usize,
        snapshot: SnapshotId,
        max_concurrent: usize,
        context: &mut Context<Self>,
    ) {
        let Some(collecting) = self.snapshots.collecting.remove(&snapshot) else {
            return;
        };
        let part = self.plan.part_id(node);
        let error = SnapshotError::Declined {
            operator: part.operator,
            subtask: part.subtask,
            max_concurrent,
        };
        self.snapshot_failed(collecting.purpose, error, context);
    }

    fn on_snapshot_timeout(
        &mut self,
        snapshot: SnapshotId,
        timeout_ms: u64,
        context: &mut Context<Self>,
    ) {
        let Some(collecting) = self.snapshots.collecting.remove(&snapshot) else {
            return;
        };
        let missing: Vec<PartId> = collecting
            .nodes
            .iter()
            .filter(|node| !collecting.parts.contains_key(node))
            .map(|&node| self.plan.part_id(node))
            .collect();
        tracing::warn!(%snapshot, ?missing, timeout_ms, "snapshot timed out");
        if let Purpose::Detector { .. } = collecting.purpose {
            let mut findings = vec![Finding::Unresponsive {
                subtasks: missing.clone(),
            }];
            let silent: Vec<usize> = collecting
                .nodes
                .iter()
                .copied()
                .filter(|node| !collecting.parts.contains_key(node))
                .collect();
            findings.extend(self.credit_waits(collecting.region, &silent));
            self.report_findings(collecting.region, findings);
        }
        let error = SnapshotError::TimedOut {
            timeout_ms,
            missing,
        };
        self.snapshot_failed(collecting.purpose, error, context);
    }

    /// The region failed: its snapshots and starts can no longer complete.
    pub(super) fn abort_region_snapshots(&mut self, region: usize, context: &mut Context<Self>) {
        let ids: Vec<SnapshotId> = self
            .snapshots
            .collecting
            .iter()
            .filter(|(_, collecting)| collecting.regions.contains(&region))
            .map(|(&id, _)| id)
            .collect();
        let reason = format!(
            "region {} restarts",
            self.regions[region].operators.join(",")
        );
        let mut purposes = Vec::new();
        for id in ids {
            if let Some(collecting) = self.snapshots.collecting.remove(&id) {
                purposes.push(collecting.purpose);
            }
        }
        for &node in &self.regions[region].nodes {
            if let Some(starts) = self.snapshots.starts.remove(&node) {
                purposes.extend(starts.into_iter().map(|(purpose, _)| purpose));
            }
            self.snapshots.loops.remove(&node);
        }
        for purpose in purposes {
            let error = SnapshotError::Aborted {
                reason: reason.clone(),
            };
            self.snapshot_failed(purpose, error, context);
        }
    }

    /// Which of `silent` (nodes of `region`) have an output channel with no
    /// credit left now, and to whom: each such node waits for those
    /// receivers. Read from the region's channel counters, which follow
    /// the plan's channels of the region in order.
    fn credit_waits(&self, region: usize, silent: &[usize]) -> Vec<Finding> {
        let Window::Bounded(window) = self.plan.channel_config().window else {
            return Vec::new();
        };
        let state = &self.regions[region];
        let edges = self
            .plan
            .edges
            .iter()
            .filter(|edge| state.nodes.binary_search(&edge.from).is_ok());
        let mut waits: BTreeMap<usize, Vec<PartId>> = BTreeMap::new();
        for (edge, (_, stats)) in edges.zip(&state.channel_stats) {
            let full = stats.in_flight_batches() >= window.get() as u64;
            let feedback = self.plan.logical_edges[edge.logical].feedback;
            if full && !feedback && silent.contains(&edge.from) {
                waits
                    .entry(edge.from)
                    .or_default()
                    .push(self.plan.part_id(edge.to));
            }
        }
        waits
            .into_iter()
            .map(|(node, mut waiting_for)| {
                waiting_for.sort();
                waiting_for.dedup();
                Finding::Backpressured {
                    subtask: self.plan.part_id(node),
                    waiting_for,
                }
            })
            .collect()
    }

    /// The regions a snapshot started in `region` covers.
    fn regions_covered(&self, region: usize, purpose: &Purpose) -> Vec<usize> {
        match purpose {
            Purpose::Caller(_) => (0..self.regions.len())
                .filter(|&other| {
                    other == region || self.regions[other].phase == RegionPhase::Running
                })
                .collect(),
            Purpose::Loop { .. } | Purpose::Detector { .. } => vec![region],
        }
    }

    fn assemble(
        &self,
        id: SnapshotId,
        generation: Generation,
        parts: BTreeMap<usize, (Vec<u8>, Box<PartActivity>)>,
    ) -> Result<GlobalSnapshot, SnapshotError> {
        let mut bytes = BTreeMap::new();
        let mut subtasks = Vec::with_capacity(parts.len());
        for (&node, (part, activity)) in &parts {
            let part_id = self.plan.part_id(node);
            bytes.insert(part_id.clone(), part.clone());
            subtasks.push(SubtaskActivity {
                id: part_id,
                records_in: activity.records_in,
                records_out: activity.records_out,
                inputs_ended: activity.inputs_ended.clone(),
                waiting: activity.waiting.clone(),
            });
        }
        // A node's inputs and outputs are numbered in the order of the
        // job's channels.
        let mut next_input: HashMap<usize, u32> = HashMap::new();
        let mut next_output: HashMap<usize, usize> = HashMap::new();
        let mut channels = Vec::new();
        for edge in &self.plan.edges {
            let input = next_input.entry(edge.to).or_insert(0);
            let index = *input;
            *input += 1;
            let output = next_output.entry(edge.from).or_insert(0);
            let output_index = *output;
            *output += 1;
            let Some((_, activity)) = parts.get(&edge.to) else {
                continue;
            };
            if let Some((_, sender)) = parts.get(&edge.from) {
                self.check_channel(
                    (edge.from, output_index, sender),
                    (edge.to, index, activity),
                )?;
            }
            channels.push(ChannelActivity {
                from: self.plan.part_id(edge.from),
                to: self.plan.part_id(edge.to),
                input: index,
                feedback: self.plan.logical_edges[edge.logical].feedback,
                records_in_flight: activity.in_flight.get(index as usize).copied().unwrap_or(0),
            });
        }
        let metadata = CheckpointMetadata {
            job: self.name.clone(),
            checkpoint: 0,
            kind: CheckpointKind::Checkpoint,
            created_unix_ms: 0,
            parts: Vec::new(),
            source_positions: BTreeMap::new(),
            key_groups: self.key_group_layout(),
            user: BTreeMap::new(),
            segments: BTreeMap::new(),
        };
        let view = CheckpointView::from_parts(metadata, bytes).map_err(|error| {
            SnapshotError::Malformed {
                reason: error.to_string(),
            }
        })?;
        Ok(GlobalSnapshot {
            id,
            generation: generation.0,
            view,
            subtasks,
            channels,
        })
    }

    /// The runtime form of the oracle's rule for one channel: no record is
    /// received before the receiver's cut that was sent after the sender's
    /// (and none is lost between them). By FIFO order, the records the
    /// sender pushed ahead of its marker are exactly those the receiver
    /// processed before its local state plus those it recorded until the
    /// marker (or the channel's end) arrived.
    fn check_channel(
        &self,
        (from, output, sender): (usize, usize, &PartActivity),
        (to, input, receiver): (usize, u32, &PartActivity),
    ) -> Result<(), SnapshotError> {
        let input = input as usize;
        let sent = sender.sent.get(output).copied();
        let processed = receiver.processed.get(input).copied();
        let recorded = receiver.in_flight.get(input).copied();
        let (Some(sent), Some(processed), Some(recorded)) = (sent, processed, recorded) else {
            return Err(SnapshotError::Malformed {
                reason: format!("the parts of nodes {from} and {to} lack a channel's counts"),
            });
        };
        if sent == processed + recorded {
            return Ok(());
        }
        let error = SnapshotError::Inconsistent {
            from: self.plan.part_id(from),
            to: self.plan.part_id(to),
            sent,
            received: processed + recorded,
        };
        tracing::error!(%error, "bug: a snapshot is not a consistent cut");
        Err(error)
    }

    fn snapshot_done(
        &mut self,
        purpose: Purpose,
        global: GlobalSnapshot,
        context: &mut Context<Self>,
    ) {
        self.update_status(|status| status.snapshots_completed += 1);
        match purpose {
            Purpose::Caller(reply) => {
                let _ = reply.try_send(Ok(global));
            }
            Purpose::Loop { head } => self.on_loop_snapshot(head, &global, context),
            Purpose::Detector { region } => {
                let mut findings: Vec<Finding> = find_deadlock(&global).into_iter().collect();
                if let Some(detector) = &mut self.snapshots.detector {
                    findings.extend(detector.tracker.observe(&global));
                }
                self.report_findings(region, findings);
            }
        }
    }

    fn snapshot_failed(
        &mut self,
        purpose: Purpose,
        error: SnapshotError,
        context: &mut Context<Self>,
    ) {
        match purpose {
            Purpose::Caller(_) => fail(purpose, error),
            Purpose::Loop { head } => {
                tracing::debug!(head, %error, "loop check failed; trying again");
                if let Some(watch) = self.snapshots.loops.get_mut(&head) {
                    watch.checking = false;
                }
                self.schedule_loop_check(head, context);
            }
            Purpose::Detector { region } => {
                // Only timeouts are findings (reported where they happen).
                tracing::debug!(%error, "stuck detector snapshot failed");
                self.clear_detector_flag(region);
            }
        }
    }

    fn clear_detector_flag(&mut self, region: usize) {
        if let Some(flag) = self
            .snapshots
            .detector
            .as_mut()
            .and_then(|detector| detector.in_flight.get_mut(region))
        {
            *flag = false;
        }
    }

    /// Starts watching the loop headed by `head` once its other inputs
    /// ended (called for heads of `iterate_until_quiescent` loops).
    pub(super) fn watch_loop(&mut self, head: usize, context: &mut Context<Self>) {
        let operators = self.loop_operators(head);
        tracing::debug!(head, ?operators, "watching the loop for quiescence");
        self.snapshots.loops.insert(
            head,
            LoopWatch {
                operators,
                checking: false,
                ended: false,
            },
        );
        self.schedule_loop_check(head, context);
    }

    fn schedule_loop_check(&mut self, head: usize, context: &mut Context<Self>) {
        let due = self
            .snapshots
            .loops
            .get(&head)
            .is_some_and(|watch| !watch.checking && !watch.ended);
        if !due {
            return;
        }
        context.run_later(
            Duration::from_millis(LOOP_CHECK_PAUSE_MS),
            move |supervisor, context| {
                let Some(watch) = supervisor.snapshots.loops.get_mut(&head) else {
                    return;
                };
                if watch.checking || watch.ended {
                    return;
                }
                watch.checking = true;
                let purpose = Purpose::Loop { head };
                supervisor.start_snapshot_at(head, purpose, SNAPSHOT_TIMEOUT_MS, context);
            },
        );
    }

    fn on_loop_snapshot(
        &mut self,
        head: usize,
        global: &GlobalSnapshot,
        context: &mut Context<Self>,
    ) {
        let Some(watch) = self.snapshots.loops.get_mut(&head) else {
            return;
        };
        watch.checking = false;
        let operators: Vec<&str> = watch.operators.iter().map(String::as_str).collect();
        if !is_loop_quiescent(global, &operators) {
            self.update_status(|status| status.loop_checks_busy += 1);
            return self.schedule_loop_check(head, context);
        }
        watch.ended = true;
        tracing::info!(snapshot = %global.id, operators = ?watch.operators, "a snapshot proved the loop quiescent: ending it");
        self.update_status(|status| status.loops_ended_by_snapshot += 1);
        if let Some(inject) = &self.nodes[head].inject {
            inject.do_send(Inject(Control::EndLoop));
        }
    }

    /// The operators on a cycle through `head`: reachable from it and
    /// reaching it along channels.
    fn loop_operators(&self, head: usize) -> Vec<String> {
        let reach = |forward: bool| {
            let mut seen = vec![false; self.plan.nodes.len()];
            let mut stack = vec![head];
            seen[head] = true;
            while let Some(node) = stack.pop() {
                for edge in &self.plan.edges {
                    let (from, to) = if forward {
                        (edge.from, edge.to)
                    } else {
                        (edge.to, edge.from)
                    };
                    if from == node && !seen[to] {
                        seen[to] = true;
                        stack.push(to);
                    }
                }
            }
            seen
        };
        let (down, up) = (reach(true), reach(false));
        let mut operators: Vec<String> = Vec::new();
        for node in 0..self.plan.nodes.len() {
            let name = self.plan.part_id(node).operator;
            if down[node] && up[node] && !operators.contains(&name) {
                operators.push(name);
            }
        }
        operators
    }

    /// Starts the stuck detector (a second call replaces its configuration).
    pub(super) fn on_detect_stuck(&mut self, config: StuckDetection, context: &mut Context<Self>) {
        let first = self.snapshots.detector.is_none();
        self.snapshots.detector = Some(Detector {
            config,
            tracker: StallTracker::new(config.stalled_after_snapshots),
            in_flight: vec![false; self.regions.len()],
        });
        if first {
            let period = Duration::from_millis(config.interval_ms.max(1));
            context.run_interval(period, |supervisor, context| {
                supervisor.detector_round(context)
            });
        }
    }

    fn detector_round(&mut self, context: &mut Context<Self>) {
        let Some(detector) = &self.snapshots.detector else {
            return;
        };
        let timeout_ms = detector.config.timeout_ms;
        for region in 0..self.regions.len() {
            let busy = self
                .snapshots
                .detector
                .as_ref()
                .map(|d| d.in_flight[region]);
            if busy != Some(false) || self.regions[region].phase != RegionPhase::Running {
                continue;
            }
            let node = self.regions[region].nodes[0];
            if let Some(detector) = &mut self.snapshots.detector {
                detector.in_flight[region] = true;
            }
            self.start_snapshot_at(node, Purpose::Detector { region }, timeout_ms, context);
        }
    }

    fn report_findings(&mut self, region: usize, findings: Vec<Finding>) {
        self.clear_detector_flag(region);
        for finding in &findings {
            tracing::warn!(%finding, "stuck detector");
        }
        let members: Vec<PartId> = self.regions[region]
            .nodes
            .iter()
            .map(|&node| self.plan.part_id(node))
            .collect();
        self.update_status(|status| {
            // The newest round replaces the region's earlier findings.
            status
                .stuck
                .retain(|finding| !finding_in(finding, &members));
            status.stuck.extend(findings);
        });
    }
}

/// Whether `finding` names a subtask among `members` (one region's).
fn finding_in(finding: &Finding, members: &[PartId]) -> bool {
    let ids: Vec<&PartId> = match finding {
        Finding::Deadlock { subtasks } | Finding::Unresponsive { subtasks } => {
            subtasks.iter().collect()
        }
        Finding::Stalled { subtask, .. } | Finding::Backpressured { subtask, .. } => vec![subtask],
    };
    ids.iter().any(|id| members.contains(id))
}

/// The receiver for a caller's snapshot and the request to send.
pub(super) fn take_snapshot(operator: &str, subtask: usize) -> (TakeSnapshot, SnapshotReceiver) {
    let (reply, receiver) = SnapshotReceiver::new();
    let request = TakeSnapshot {
        operator: operator.to_owned(),
        subtask,
        reply,
    };
    (request, receiver)
}
