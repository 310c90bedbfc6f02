//! What the supervisor tells the live metrics (`crate::metrics`): the
//! registry made from the plan at the job's start, and one call per
//! checkpoint trigger, ack, completion or failure and per restart.
//!
//! It never decides anything: each call mirrors a fact the supervisor
//! has already acted on, off the record path.

use super::*;
use crate::metrics::{EdgeMetrics, MetricsRegistry, OperatorInfo, OperatorKind, RestartMetrics};

/// Each operator's kind, found from the edges: no input makes a source,
/// inputs and no output a sink. The registry shows it, and each
/// checkpoint records the sources and sinks (`checkpoints.rs`) for tools
/// that read their parts.
pub(super) fn operator_kinds(plan: &PhysicalPlan) -> Vec<OperatorKind> {
    let operator_count = plan.operators.len();
    let (mut has_input, mut has_output) =
        (vec![false; operator_count], vec![false; operator_count]);
    for edge in &plan.edges {
        has_output[plan.nodes[edge.from].0] = true;
        has_input[plan.nodes[edge.to].0] = true;
    }
    has_input
        .into_iter()
        .zip(has_output)
        .map(|kind| match kind {
            (false, _) => OperatorKind::Source,
            (true, false) => OperatorKind::Sink,
            (true, true) => OperatorKind::Operator,
        })
        .collect()
}

/// The registry of a planned job: its operators (with their kind found
/// from the edges) and its logical edges.
pub(super) fn registry(name: &str, plan: &PhysicalPlan) -> MetricsRegistry {
    let mut edges: Vec<(usize, EdgeMetrics)> = Vec::new();
    for edge in &plan.edges {
        let (from, to) = (plan.nodes[edge.from].0, plan.nodes[edge.to].0);
        if edges.iter().any(|(logical, _)| *logical == edge.logical) {
            continue;
        }
        let logical = &plan.logical_edges[edge.logical];
        edges.push((
            edge.logical,
            EdgeMetrics {
                from: plan.operators[from].name.clone(),
                to: plan.operators[to].name.clone(),
                partition: format!("{:?}", logical.partition).to_lowercase(),
                feedback: logical.feedback,
            },
        ));
    }
    let operators = plan
        .operators
        .iter()
        .zip(operator_kinds(plan))
        .map(|(operator, kind)| OperatorInfo {
            name: operator.name.clone(),
            kind,
            parallelism: operator.parallelism,
        })
        .collect();
    MetricsRegistry::new(
        name.to_owned(),
        plan.config.metrics,
        operators,
        edges.into_iter().map(|(_, edge)| edge).collect(),
    )
}

/// Starts the job's HTTP server when the configuration asks for one;
/// its actions reach the supervisor as `RunningJob`'s methods send them.
#[cfg(feature = "http")]
pub(super) fn serve(
    config: &super::super::JobConfig,
    registry: &Arc<MetricsRegistry>,
    supervisor: &Addr<Supervisor>,
) -> Result<Option<crate::http::HttpServer>, JobError> {
    use crate::http::{Action, ActionHandler, HttpServer};
    let Some(addr) = config.http_addr else {
        return Ok(None);
    };
    let actions: Option<ActionHandler> = config.http_actions.then(|| {
        let supervisor = supervisor.clone();
        Arc::new(move |action: Action| match action {
            Action::Savepoint => supervisor.do_send(TriggerSavepoint),
            Action::StopWithSavepoint => supervisor.do_send(Stop { savepoint: true }),
            Action::Cancel => supervisor.do_send(Stop { savepoint: false }),
        }) as ActionHandler
    });
    HttpServer::start(addr, Arc::clone(registry), actions)
        .map(Some)
        .map_err(JobError::InvalidConfig)
}

impl Supervisor {
    fn registry(&self) -> Option<&MetricsRegistry> {
        self.plan.metrics.as_deref()
    }

    pub(super) fn metrics_triggered(&self, checkpoint: CheckpointId, kind: CheckpointKind) {
        if let Some(registry) = self.registry() {
            let savepoint = kind == CheckpointKind::Savepoint;
            registry.checkpoint_triggered(checkpoint.0, savepoint, self.plan.node_count());
        }
    }

    pub(super) fn metrics_acked(
        &self,
        checkpoint: CheckpointId,
        node: usize,
        alignment_us: u64,
        size_bytes: usize,
    ) {
        if let Some(registry) = self.registry() {
            let subtask = self.plan.nodes[node];
            registry.checkpoint_acked(checkpoint.0, subtask, alignment_us, size_bytes as u64);
        }
    }

    /// `part_bytes` is each node's part size, in node order (the writer
    /// knows them once it encoded parts taken asynchronously).
    pub(super) fn metrics_completed(
        &self,
        checkpoint: CheckpointId,
        size_bytes: u64,
        part_bytes: &[u64],
    ) {
        if let Some(registry) = self.registry() {
            let parts: Vec<((usize, usize), u64)> = part_bytes
                .iter()
                .enumerate()
                .filter_map(|(node, bytes)| Some((*self.plan.nodes.get(node)?, *bytes)))
                .collect();
            registry.checkpoint_completed(checkpoint.0, size_bytes, &parts);
        }
    }

    pub(super) fn metrics_failed(&self, checkpoint: CheckpointId, reason: &str) {
        if let Some(registry) = self.registry() {
            registry.checkpoint_failed(checkpoint.0, reason);
        }
    }

    pub(super) fn metrics_restarted(&self, restart: &RestartReport) {
        if let Some(registry) = self.registry() {
            registry.restarted(RestartMetrics {
                time_unix_ms: 0,
                generation: restart.generation,
                region: restart.region.clone(),
                cause: restart.cause.clone(),
                restored_from: restart.restored_from,
                recovery_ms: restart.recovery_ms,
            });
        }
    }

    pub(super) fn metrics_failure(&self, cause: &str) {
        if let Some(registry) = self.registry() {
            registry.failed(cause.to_owned());
        }
    }
}
