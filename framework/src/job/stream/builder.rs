//! The [`Job`] itself: adding sources and operators, the checks that
//! run before anything starts, and the plan handed to the supervisor.

use std::any::Any;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::keyed::MaxParallelism;
use crate::storage::names;

use super::graph::{EdgeKind, EdgeSpec, GraphSpec, OperatorSpec, Producer};
use super::typed::Stream;
use crate::job::incremental::IncrementalCheckpoints;
use crate::job::physical::{
    CoreFactory, Partition, PhysicalPlan, PlannedEdge, PlannedOperator, Rescale, SourceTemplate,
    StageTemplate, Template,
};
use crate::job::recovery::SinkHooks;
use crate::job::shell::{Data, OperatorCounters, SourceMaker};
use crate::job::supervisor::{self, RunningJob};
use crate::job::{JobConfig, JobError, JobReport, DEFAULT_CHECKPOINT_INTERVAL_MS};
use crate::source::{Source, SourceFactory, SourcePosition};

/// A streaming job under construction. Declare sources, operators and
/// sinks through the streams it returns, then [`Job::run`] it.
pub struct Job {
    pub(super) name: String,
    pub(super) config: JobConfig,
    pub(super) graph: RefCell<GraphSpec>,
}

impl Job {
    /// A job named `name` (the name of its checkpoints in the store).
    pub fn new(name: &str, config: JobConfig) -> Job {
        Job {
            name: name.to_owned(),
            config,
            graph: RefCell::new(GraphSpec::default()),
        }
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The checkpoint interval the job will run with (see
    /// [`SinkContext::checkpoint_interval_ms`](crate::sink::SinkContext::checkpoint_interval_ms)),
    /// as `plan` settles it.
    pub(super) fn effective_checkpoint_interval_ms(&self) -> Option<u64> {
        match self.config.checkpoint_interval_ms {
            None if self.config.store.is_some() => Some(DEFAULT_CHECKPOINT_INTERVAL_MS),
            interval => interval,
        }
    }

    /// Adds a source operator: `factory` makes each subtask's split. A
    /// source that cannot seek ([`Source::can_seek`] is false) is accepted
    /// but makes the job at-least-once: [`JobReport::guarantee`] says so,
    /// and [`JobReport::guarantee_reasons`] names this source
    /// ([`GuaranteeReason::SourceCannotSeek`](crate::job::GuaranteeReason::SourceCannotSeek)).
    pub fn source<F>(&self, name: &str, factory: F) -> Stream<'_, <F::Source as Source>::Item>
    where
        F: SourceFactory + Send + Sync + 'static,
        F::Source: 'static,
        <F::Source as Source>::Item: Data,
    {
        let factory = Arc::new(factory);
        let rescale = if factory.rescales() {
            let factory = Arc::clone(&factory);
            Rescale::Operator(Arc::new(move |states: &[Vec<u8>], parallelism| {
                let positions: Vec<SourcePosition> = states
                    .iter()
                    .map(|state| SourcePosition::from_bytes(state.clone()))
                    .collect();
                let spread = factory.rescale_positions(&positions, parallelism)?;
                Ok(spread
                    .into_iter()
                    .map(|position| position.as_bytes().to_vec())
                    .collect())
            }))
        } else {
            Rescale::No
        };
        let make: SourceMaker<<F::Source as Source>::Item> =
            Arc::new(move |subtask, parallelism| {
                let source = factory.split(subtask, parallelism)?;
                Ok(Box::new(source) as Box<dyn Source<Item = _>>)
            });
        let template = SourceTemplate {
            make,
            watermarks: None,
        };
        let operator = self.add_operator(name, true, Box::new(template));
        self.graph.borrow_mut().operators[operator].rescale = rescale;
        Stream {
            job: self,
            producers: vec![Producer {
                operator,
                partition: EdgeKind::Auto,
            }],
            _records: PhantomData,
        }
    }

    /// The stream `operator` produces.
    pub(super) fn stream_of<T>(&self, operator: usize) -> Stream<'_, T> {
        Stream {
            job: self,
            producers: vec![Producer {
                operator,
                partition: EdgeKind::Auto,
            }],
            _records: PhantomData,
        }
    }

    pub(super) fn add_operator(
        &self,
        name: &str,
        is_source: bool,
        template: Box<dyn Template>,
    ) -> usize {
        let mut graph = self.graph.borrow_mut();
        if graph.operators.iter().any(|operator| operator.name == name) {
            graph.errors.push(JobError::DuplicateName {
                name: name.to_owned(),
            });
        }
        if let Err(error) = names::validate("operator", name) {
            graph.errors.push(JobError::InvalidName {
                name: name.to_owned(),
                reason: error.to_string(),
            });
        }
        graph.operators.push(OperatorSpec {
            name: name.to_owned(),
            parallelism: None,
            follows: None,
            is_source,
            template,
            loop_idle_ms: None,
            rescale: Rescale::Stateless,
            sink: None,
            late_dropped: None,
            publish_restored: None,
        });
        graph.operators.len() - 1
    }

    pub(super) fn add_edges(
        &self,
        producers: &[Producer],
        to: usize,
        key_hash: Option<Arc<dyn Any + Send + Sync>>,
    ) {
        let mut graph = self.graph.borrow_mut();
        for producer in producers {
            graph.edges.push(EdgeSpec {
                from: producer.operator,
                to,
                kind: producer.partition,
                key_hash: key_hash.clone(),
                feedback: false,
            });
        }
    }

    pub(super) fn stage<In: Data, Out: Data>(
        &self,
        name: &str,
        producers: &[Producer],
        key_hash: Option<Arc<dyn Any + Send + Sync>>,
        make_core: CoreFactory<In, Out>,
    ) -> usize {
        let operator = self.add_operator(name, false, Box::new(StageTemplate { make_core }));
        self.add_edges(producers, operator, key_hash);
        operator
    }

    /// Records, in both jobs, that a stream of `other` was joined with one
    /// of this job (operator indices of one job mean nothing in the other).
    pub(super) fn check_same_job(&self, other: &Job) {
        if !std::ptr::eq(self, other) {
            self.graph.borrow_mut().errors.push(JobError::MixedJobs);
            other.graph.borrow_mut().errors.push(JobError::MixedJobs);
        }
    }

    /// Validates the job, runs it to completion (a bounded job ends when
    /// every source is exhausted and the final checkpoint committed every
    /// sink's output), and reports. Blocks the calling thread; the job runs
    /// on its own actix system and arbiters.
    pub fn run(self) -> Result<JobReport, JobError> {
        self.start()?.wait()
    }

    /// Validates the job and starts it on its own threads; the handle
    /// cancels it, stops it with a savepoint, or waits for it.
    pub fn start(self) -> Result<RunningJob, JobError> {
        let plan = self.plan()?;
        supervisor::start(self.name, plan)
    }

    pub(super) fn plan(&self) -> Result<PhysicalPlan, JobError> {
        let mut config = self.config.clone();
        if config.checkpoint_interval_ms == Some(0) {
            return Err(JobError::InvalidConfig(
                "checkpoint_interval_ms must be positive; use None for no periodic checkpoints"
                    .into(),
            ));
        }
        if config.store.is_some() && config.checkpoint_interval_ms.is_none() {
            tracing::info!(
                job = %self.name,
                interval_ms = DEFAULT_CHECKPOINT_INTERVAL_MS,
                "the job has a checkpoint store and no checkpoint_interval_ms: \
                 checkpointing every DEFAULT_CHECKPOINT_INTERVAL_MS"
            );
            config.checkpoint_interval_ms = Some(DEFAULT_CHECKPOINT_INTERVAL_MS);
        }
        config
            .keyed_backend
            .check()
            .map_err(JobError::InvalidConfig)?;
        if config.default_parallelism == 0 {
            return Err(JobError::InvalidConfig(
                "default_parallelism must be at least 1".into(),
            ));
        }
        if let Err(error) = MaxParallelism::new(config.max_parallelism) {
            return Err(JobError::InvalidConfig(error.to_string()));
        }
        let spec = self.graph.take();
        if let Some(error) = spec.errors.into_iter().next() {
            return Err(error);
        }
        if spec.operators.is_empty() {
            return Err(JobError::EmptyJob);
        }
        if let Some(&head) = spec.open_loops.first() {
            return Err(JobError::LoopNotClosed {
                name: spec.operators[head].name.clone(),
            });
        }
        let mut first_node = 0;
        let mut operators = Vec::with_capacity(spec.operators.len());
        let mut sources = Vec::with_capacity(spec.operators.len());
        for operator in spec.operators {
            // A followed operator is declared earlier, so it is planned.
            let followed = operator
                .follows
                .and_then(|index| operators.get(index))
                .map(|followed: &PlannedOperator| followed.parallelism);
            let parallelism = followed
                .or(operator.parallelism)
                .unwrap_or(config.default_parallelism);
            if parallelism == 0 || parallelism > config.max_parallelism as usize {
                return Err(JobError::BadParallelism {
                    operator: operator.name,
                    parallelism,
                    max: config.max_parallelism,
                });
            }
            sources.push(operator.is_source);
            let sink = operator.sink.map(|(check, restore)| SinkHooks {
                operator: operator.name.clone(),
                parallelism,
                check,
                restore,
            });
            operators.push(PlannedOperator {
                name: operator.name,
                parallelism,
                first_node,
                template: operator.template,
                counters: Arc::new(OperatorCounters {
                    late_dropped: operator.late_dropped.unwrap_or_default(),
                    ..OperatorCounters::default()
                }),
                loop_idle_ms: operator.loop_idle_ms,
                rescale: operator.rescale,
                sink,
                publish_restored: operator.publish_restored,
            });
            first_node += parallelism;
        }
        let mut logical = Vec::with_capacity(spec.edges.len());
        for edge in spec.edges {
            let (from, to) = (&operators[edge.from], &operators[edge.to]);
            let same_parallelism = from.parallelism == to.parallelism;
            let partition = match edge.kind {
                EdgeKind::Hash => Partition::Hash,
                EdgeKind::Auto | EdgeKind::Forward if same_parallelism => Partition::Forward,
                EdgeKind::Auto | EdgeKind::Rebalance => Partition::Rebalance,
                EdgeKind::Broadcast => Partition::Broadcast,
                EdgeKind::Forward => {
                    return Err(JobError::ForwardParallelismMismatch {
                        from: from.name.clone(),
                        to: to.name.clone(),
                        from_parallelism: from.parallelism,
                        to_parallelism: to.parallelism,
                    })
                }
            };
            logical.push((
                edge.from,
                edge.to,
                PlannedEdge {
                    partition,
                    key_hash: edge.key_hash,
                    feedback: edge.feedback,
                },
            ));
        }
        PhysicalPlan::new(operators, &sources, logical, config)
    }

    /// The settings of incremental checkpoints for a keyed core of this
    /// job; `None` when they are off or the
    /// store cannot refer to earlier checkpoints (a store of its own
    /// without segments: every checkpoint is then full).
    pub(super) fn incremental(&self) -> Option<IncrementalCheckpoints> {
        let settings = self.config.incremental_checkpoints;
        let supported = self
            .config
            .store
            .as_ref()
            .map_or(true, |store| store.supports_segments());
        (settings.enabled && supported).then_some(settings)
    }
}
