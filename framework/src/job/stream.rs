//! The typed job builder: [`Job`], [`Stream`] and [`KeyedStream`].
//!
//! This module owns the logical graph as the user declares it (operators
//! with names and parallelism, edges with their partitioner), the checks
//! that run before anything starts, and the erasure of each operator's
//! types into a template the physical layer instantiates per generation.
//! It never starts actors itself; [`Job::run`] hands a validated plan to the
//! supervisor.
//!
//! Mistakes are caught as early as the types allow: joining streams of
//! different record types does not compile (see [`Stream`]); duplicate or
//! invalid operator names, a forward edge between different
//! parallelisms, an iteration that is never closed and streams of two
//! different jobs are typed [`JobError`]s from [`Job::run`] or
//! [`Job::start`], before anything starts.

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use crate::keyed::MaxParallelism;
use crate::runtime::BoxError;
use crate::state::Snapshot;
use crate::storage::names;

use super::operator::{Aggregator, Operator, OperatorContext};
use super::ops::{
    rescale_operator_states, FinalStates, Key, KeyedCore, OperatorCore, RecordFn, Reduced,
    SinkCore, SinkMaker, StatelessCore,
};
use super::physical::{
    CoreFactory, Partition, PhysicalPlan, PlannedEdge, PlannedOperator, Rescale, SourceTemplate,
    StageTemplate, Template,
};
use super::recovery::{SinkCheckFn, SinkHooks, SinkRestoreFn, SinkView};
use super::route::{Collector, KeyHash, KeyHasher};
use super::shell::{Core, Data, OperatorCounters, SourceMaker};
use super::supervisor::{self, RunningJob};
use super::{JobConfig, JobError, JobReport, DEFAULT_CHECKPOINT_INTERVAL_MS};
use crate::sink::{Sink, SinkFactory};
use crate::source::{Source, SourceFactory, SourcePosition};
use crate::time::{rescale_timed_states, TimedFn, TimedKeyedCore, Timers, WatermarkStrategy};

struct OperatorSpec {
    name: String,
    parallelism: Option<usize>,
    is_source: bool,
    template: Box<dyn Template>,
    loop_idle_ms: Option<u64>,
    rescale: Rescale,
    /// A sink's recovery hooks (checked before any restore).
    sink: Option<(SinkCheckFn, SinkRestoreFn)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum EdgeKind {
    /// Forward when both sides have the same parallelism, else rebalance.
    Auto,
    Hash,
    /// Forward, chosen explicitly: both sides must have the same
    /// parallelism.
    Forward,
    Rebalance,
    Broadcast,
}

/// One operator that produces a stream, and how its records are
/// partitioned towards the stream's consumer.
#[derive(Clone, Copy)]
struct Producer {
    operator: usize,
    partition: EdgeKind,
}

struct EdgeSpec {
    from: usize,
    to: usize,
    kind: EdgeKind,
    key_hash: Option<Arc<dyn Any + Send + Sync>>,
    feedback: bool,
}

#[derive(Default)]
struct GraphSpec {
    operators: Vec<OperatorSpec>,
    edges: Vec<EdgeSpec>,
    /// Mistakes found while declaring; the first is returned by `run`.
    errors: Vec<JobError>,
    /// Iteration heads not closed yet.
    open_loops: Vec<usize>,
}

/// A streaming job under construction. Declare sources, operators and
/// sinks through the streams it returns, then [`Job::run`] it.
pub struct Job {
    name: String,
    config: JobConfig,
    graph: RefCell<GraphSpec>,
}

/// A typed stream of records of type `T`, produced by one or more operators
/// (more than one after [`Stream::union`]).
///
/// Record types are checked by the compiler: an operator, a union, a
/// sink or a loop fed with the wrong type is a compile error, not a
/// failure at run time. This compiles:
///
/// ```
/// use snapflow::job::{Job, JobConfig};
/// use snapflow::sink::CollectHandle;
/// use snapflow::source::VecSourceFactory;
///
/// let job = Job::new("typed", JobConfig::default());
/// let numbers = job.source("numbers", VecSourceFactory::new(vec![1_u64]));
/// let lengths = job
///     .source("words", VecSourceFactory::new(vec![String::from("a")]))
///     .map("length", |word: String| word.len() as u64);
/// numbers.union(lengths).sink("out", CollectHandle::<u64>::new());
/// ```
///
/// and the same union without the `map` does not:
///
/// ```compile_fail,E0308
/// use snapflow::job::{Job, JobConfig};
/// use snapflow::sink::CollectHandle;
/// use snapflow::source::VecSourceFactory;
///
/// let job = Job::new("typed", JobConfig::default());
/// let numbers = job.source("numbers", VecSourceFactory::new(vec![1_u64]));
/// let words = job.source("words", VecSourceFactory::new(vec![String::from("a")]));
/// numbers.union(words).sink("out", CollectHandle::<u64>::new());
/// ```
///
/// nor does a sink of another type:
///
/// ```compile_fail,E0271
/// use snapflow::job::{Job, JobConfig};
/// use snapflow::sink::CollectHandle;
/// use snapflow::source::VecSourceFactory;
///
/// let job = Job::new("typed", JobConfig::default());
/// job.source("numbers", VecSourceFactory::new(vec![1_u64]))
///     .sink("out", CollectHandle::<String>::new());
/// ```
#[must_use = "a stream does nothing until it reaches a sink"]
pub struct Stream<'j, T> {
    job: &'j Job,
    producers: Vec<Producer>,
    _records: PhantomData<fn() -> T>,
}

/// A stream partitioned by key: every record with the same key goes to the
/// same subtask of the next operator (by key group).
///
/// `F` is the key function's type. [`Stream::key_by`] keeps it concrete,
/// so that the keyed operator's loop over a batch inlines the key function
/// together with the state lookup and the process function (one loop, no
/// indirect call per record); the default names the erased form.
#[must_use = "a keyed stream does nothing until it is processed"]
pub struct KeyedStream<'j, K, T, F: ?Sized = dyn Fn(&T) -> K + Send + Sync> {
    job: &'j Job,
    producers: Vec<usize>,
    key_of: Arc<F>,
    /// `key_of` followed by the stable hash, as the partitioner uses it.
    key_hash: KeyHash<T>,
    _keys: PhantomData<fn() -> K>,
}

/// Reads the final per-key state of a keyed operator after its job ran:
/// each subtask publishes its whole state when its input ends.
pub struct KeyedStateHandle<K, S> {
    states: FinalStates<K, S>,
}

impl<K: Key, S: Clone> KeyedStateHandle<K, S> {
    /// Every key's final state (all subtasks merged).
    pub fn snapshot(&self) -> HashMap<K, S> {
        let states = self
            .states
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        states
            .values()
            .flat_map(|map| map.iter().map(|(key, state)| (key.clone(), state.clone())))
            .collect()
    }
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

    /// Adds a source operator: `factory` makes each subtask's split. A
    /// source that cannot seek ([`Source::can_seek`] is false) is accepted
    /// but makes the job at-least-once: [`JobReport::guarantee`] says so,
    /// and [`JobReport::guarantee_reasons`] names this source
    /// ([`GuaranteeReason::SourceCannotSeek`](super::GuaranteeReason::SourceCannotSeek)).
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
    fn stream_of<T>(&self, operator: usize) -> Stream<'_, T> {
        Stream {
            job: self,
            producers: vec![Producer {
                operator,
                partition: EdgeKind::Auto,
            }],
            _records: PhantomData,
        }
    }

    fn add_operator(&self, name: &str, is_source: bool, template: Box<dyn Template>) -> usize {
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
            is_source,
            template,
            loop_idle_ms: None,
            rescale: Rescale::Stateless,
            sink: None,
        });
        graph.operators.len() - 1
    }

    fn add_edges(
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

    fn stage<In: Data, Out: Data>(
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
    fn check_same_job(&self, other: &Job) {
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

    fn plan(&self) -> Result<PhysicalPlan, JobError> {
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
            let parallelism = operator.parallelism.unwrap_or(config.default_parallelism);
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
                counters: Arc::new(OperatorCounters::default()),
                loop_idle_ms: operator.loop_idle_ms,
                rescale: operator.rescale,
                sink,
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
}

impl<'j, T: Data> Stream<'j, T> {
    fn next<U>(&self, operator: usize) -> Stream<'j, U> {
        Stream {
            job: self.job,
            producers: vec![Producer {
                operator,
                partition: EdgeKind::Auto,
            }],
            _records: PhantomData,
        }
    }

    fn partitioned(mut self, partition: EdgeKind) -> Self {
        for producer in &mut self.producers {
            producer.partition = partition;
        }
        self
    }

    fn stateless<U: Data>(self, name: &str, function: RecordFn<T, U>) -> Stream<'j, U> {
        let make_core = Arc::new(move |_subtask: usize, _parallelism: usize| {
            Box::new(StatelessCore {
                function: Arc::clone(&function),
            }) as Box<dyn Core<T, U>>
        });
        let operator = self.job.stage(name, &self.producers, None, make_core);
        self.next(operator)
    }

    /// Gives this source's records event times and watermarks: each
    /// source subtask (one split each for the built-in sources) runs the
    /// strategy's generator on what it reads and sends watermarks in-band,
    /// after the records they follow. It must follow
    /// [`Job::source`] directly; anywhere else [`Job::run`] fails with
    /// [`JobError::TimestampsNotAtSource`].
    ///
    /// ```
    /// use snapflow::job::{Job, JobConfig};
    /// use snapflow::sink::CollectHandle;
    /// use snapflow::source::VecSourceFactory;
    /// use snapflow::time::WatermarkStrategy;
    ///
    /// let job = Job::new("timestamps", JobConfig::default());
    /// let events = CollectHandle::new();
    /// job.source("events", VecSourceFactory::new(vec![(1u32, 1_000u64), (2, 900)]))
    ///     .assign_timestamps(WatermarkStrategy::bounded_out_of_orderness(500, |event: &(u32, u64)| event.1))
    ///     .sink("out", events.clone());
    /// job.run()?;
    /// assert_eq!(events.committed().len(), 2);
    /// # Ok::<(), snapflow::job::JobError>(())
    /// ```
    pub fn assign_timestamps(self, strategy: WatermarkStrategy<T>) -> Self {
        {
            let mut graph = self.job.graph.borrow_mut();
            let operator = match self.producers.as_slice() {
                [producer] => Some(producer.operator),
                _ => None,
            };
            let accepted = operator.is_some_and(|operator| {
                let spec = &mut graph.operators[operator];
                spec.is_source && spec.template.set_watermarks(Box::new(strategy))
            });
            if !accepted {
                let operator = operator
                    .map(|operator| graph.operators[operator].name.clone())
                    .unwrap_or_else(|| "a union".to_owned());
                graph
                    .errors
                    .push(JobError::TimestampsNotAtSource { operator });
            }
        }
        self
    }

    /// Transforms every record.
    pub fn map<U: Data>(
        self,
        name: &str,
        function: impl Fn(T) -> U + Send + Sync + 'static,
    ) -> Stream<'j, U> {
        self.stateless(
            name,
            Arc::new(move |record, out| out.emit(function(record))),
        )
    }

    /// Keeps the records for which `predicate` is true.
    pub fn filter(
        self,
        name: &str,
        predicate: impl Fn(&T) -> bool + Send + Sync + 'static,
    ) -> Stream<'j, T> {
        self.stateless(
            name,
            Arc::new(move |record, out| {
                if predicate(&record) {
                    out.emit(record);
                }
            }),
        )
    }

    /// Turns every record into zero or more records.
    pub fn flat_map<U: Data, I: IntoIterator<Item = U>>(
        self,
        name: &str,
        function: impl Fn(T) -> I + Send + Sync + 'static,
    ) -> Stream<'j, U> {
        self.stateless(
            name,
            Arc::new(move |record, out| {
                for item in function(record) {
                    out.emit(item);
                }
            }),
        )
    }

    /// A custom operator with operator-level state (see [`Operator`]):
    /// `factory` makes one instance per subtask, and its state is
    /// checkpointed and restored exactly-once. Its parallelism can change
    /// on restore only if it implements [`Operator::rescale`] (else
    /// [`JobError::RescaleUnsupported`]).
    pub fn operator<O>(
        self,
        name: &str,
        factory: impl Fn(&OperatorContext) -> O + Send + Sync + 'static,
    ) -> Stream<'j, O::Out>
    where
        O: Operator<In = T>,
    {
        let make_core = Arc::new(move |subtask: usize, parallelism: usize| {
            let context = OperatorContext {
                subtask,
                parallelism,
            };
            Box::new(OperatorCore {
                operator: factory(&context),
                ended: false,
            }) as Box<dyn Core<T, O::Out>>
        });
        let operator = self.job.stage(name, &self.producers, None, make_core);
        self.job.graph.borrow_mut().operators[operator].rescale =
            Rescale::Operator(Arc::new(rescale_operator_states::<O>));
        self.next(operator)
    }

    /// Sends every record to every subtask of the next operator (Flink's
    /// broadcast partitioner). Checkpoints stay exactly-once: a broadcast
    /// edge is one channel from each upstream subtask to each downstream
    /// subtask, aligned like any other.
    pub fn broadcast(self) -> Self {
        self.partitioned(EdgeKind::Broadcast)
    }

    /// Spreads the records round robin over the subtasks of the next
    /// operator, whatever the parallelisms (the default when they differ).
    pub fn rebalance(self) -> Self {
        self.partitioned(EdgeKind::Rebalance)
    }

    /// Sends the records of subtask `i` to subtask `i` of the next operator
    /// (the default when the parallelisms are equal); different
    /// parallelisms are [`JobError::ForwardParallelismMismatch`].
    pub fn forward(self) -> Self {
        self.partitioned(EdgeKind::Forward)
    }

    /// Partitions the stream by key (hash of the key's key group),
    /// replacing any partitioning chosen before on this stream.
    pub fn key_by<K, F>(self, key_of: F) -> KeyedStream<'j, K, T, F>
    where
        K: Key,
        F: Fn(&T) -> K + Send + Sync + 'static,
    {
        let key_of = Arc::new(key_of);
        KeyedStream {
            job: self.job,
            producers: self
                .producers
                .iter()
                .map(|producer| producer.operator)
                .collect(),
            key_hash: Arc::new(KeyHasher::new(Arc::clone(&key_of))),
            key_of,
            _keys: PhantomData,
        }
    }

    /// Opens an iteration: the returned stream carries this stream's
    /// records and, once the loop is closed with [`Stream::close_loop`],
    /// every record fed back. Checkpoints stay exactly-once (feedback edges
    /// are recorded as channel state, DESIGN section 3); feedback channels
    /// are unbounded. A bounded job ends its loop when every input of the
    /// head but the feedback has ended and no record came back for
    /// `idle_timeout_ms` (records fed back later are dropped), as Flink's
    /// bounded iterations do.
    pub fn iterate(self, name: &str, idle_timeout_ms: u64) -> (Stream<'j, T>, Feedback<'j, T>) {
        let job = self.job;
        let stream = self.stateless(name, Arc::new(|record, out| out.emit(record)));
        let head = stream.producers[0].operator;
        let mut graph = job.graph.borrow_mut();
        graph.operators[head].loop_idle_ms = Some(idle_timeout_ms);
        graph.open_loops.push(head);
        drop(graph);
        let feedback = Feedback {
            job,
            head,
            _records: PhantomData,
        };
        (stream, feedback)
    }

    /// Closes an iteration: this stream's records go back to its head
    /// (partitioned as chosen on this stream, by default forward or
    /// rebalance).
    pub fn close_loop(self, feedback: Feedback<'j, T>) {
        self.job.check_same_job(feedback.job);
        if !std::ptr::eq(self.job, feedback.job) {
            return;
        }
        let mut graph = self.job.graph.borrow_mut();
        graph.open_loops.retain(|&head| head != feedback.head);
        for producer in &self.producers {
            graph.edges.push(EdgeSpec {
                from: producer.operator,
                to: feedback.head,
                kind: producer.partition,
                key_hash: None,
                feedback: true,
            });
        }
    }

    /// Merges two streams of the same type; each keeps the partitioning
    /// chosen on it.
    pub fn union(mut self, other: Stream<'j, T>) -> Stream<'j, T> {
        self.job.check_same_job(other.job);
        self.producers.extend(other.producers);
        self
    }

    /// Sets the parallelism of the operator that produces this stream.
    pub fn parallelism(self, parallelism: usize) -> Self {
        {
            let mut graph = self.job.graph.borrow_mut();
            if let [producer] = self.producers[..] {
                graph.operators[producer.operator].parallelism = Some(parallelism);
            } else {
                graph.errors.push(JobError::ParallelismOnUnion);
            }
        }
        self
    }

    /// Ends the stream in a sink: `factory` makes each subtask's sink,
    /// driven through two-phase commit (pre-commit at each checkpoint,
    /// commit when it is complete, restore before the first record).
    /// Returns a handle to set the sink's parallelism.
    pub fn sink<F>(self, name: &str, factory: F) -> SinkHandle<'j>
    where
        F: SinkFactory + Send + Sync + 'static,
        F::Sink: Sink<Item = T> + 'static,
    {
        let factory = Arc::new(factory);
        let hooks = sink_hooks(&factory);
        let make: SinkMaker<T> = Arc::new(move |subtask, parallelism| {
            let sink = factory.create(subtask, parallelism)?;
            Ok(Box::new(sink) as Box<dyn Sink<Item = T>>)
        });
        let make_core = Arc::new(move |subtask: usize, parallelism: usize| {
            Box::new(SinkCore {
                make: Arc::clone(&make),
                subtask,
                parallelism,
                sink: None,
            }) as Box<dyn Core<T, ()>>
        });
        let operator = self.job.stage(name, &self.producers, None, make_core);
        let mut graph = self.job.graph.borrow_mut();
        graph.operators[operator].rescale = Rescale::No;
        graph.operators[operator].sink = Some(hooks);
        drop(graph);
        SinkHandle {
            job: self.job,
            operator,
        }
    }
}

/// The producing operators of a keyed stream, each feeding the keyed
/// operator through a hash edge by its key.
fn hash_producers(producers: &[usize]) -> Vec<Producer> {
    producers
        .iter()
        .map(|&operator| Producer {
            operator,
            partition: EdgeKind::Hash,
        })
        .collect()
}

/// The recovery hooks of a sink factory: both make a fresh sink, used
/// once and dropped, on the checkpoint writer's thread.
fn sink_hooks<F>(factory: &Arc<F>) -> (SinkCheckFn, SinkRestoreFn)
where
    F: SinkFactory + Send + Sync + 'static,
{
    let checker = Arc::clone(factory);
    let check: SinkCheckFn = Arc::new(move |subtask, parallelism, restored, state| {
        let mut sink = checker.create(subtask, parallelism)?;
        let visibility = sink.check_restore(restored, state)?;
        let guarantee = sink.guarantee();
        Ok(SinkView {
            visibility,
            guarantee,
        })
    });
    let restorer = Arc::clone(factory);
    let restore: SinkRestoreFn = Arc::new(move |subtask, parallelism, state| {
        restorer.create(subtask, parallelism)?.restore(state)
    });
    (check, restore)
}

/// The open end of an iteration: close it with [`Stream::close_loop`].
#[must_use = "an iteration must be closed with Stream::close_loop"]
pub struct Feedback<'j, T> {
    job: &'j Job,
    head: usize,
    _records: PhantomData<fn(&'j ()) -> T>,
}

impl<T> Clone for Stream<'_, T> {
    fn clone(&self) -> Self {
        Stream {
            job: self.job,
            producers: self.producers.clone(),
            _records: PhantomData,
        }
    }
}

/// A declared sink, to set its parallelism.
pub struct SinkHandle<'j> {
    job: &'j Job,
    operator: usize,
}

impl SinkHandle<'_> {
    /// Sets the sink's parallelism.
    pub fn parallelism(self, parallelism: usize) -> Self {
        self.job.graph.borrow_mut().operators[self.operator].parallelism = Some(parallelism);
        self
    }
}

impl<'j, K, T, F> KeyedStream<'j, K, T, F>
where
    K: Key,
    T: Data,
    F: Fn(&T) -> K + Send + Sync + ?Sized + 'static,
{
    /// A keyed process function: for each record, `function` gets its key,
    /// the key's state (`S::default()` for a new key) and a collector.
    /// An `Err` fails the job (which restarts per its strategy).
    pub fn process<S, U>(
        self,
        name: &str,
        function: impl Fn(&K, &mut S, T, &mut Collector<'_, U>) -> Result<(), BoxError>
            + Send
            + Sync
            + 'static,
    ) -> Stream<'j, U>
    where
        S: Snapshot + Default + Clone + Send + 'static,
        U: Data,
    {
        self.process_inner(name, function, None)
    }

    /// As [`KeyedStream::process`], and returns a handle that shows every
    /// key's final state once the job has run.
    pub fn process_with_state<S, U>(
        self,
        name: &str,
        function: impl Fn(&K, &mut S, T, &mut Collector<'_, U>) -> Result<(), BoxError>
            + Send
            + Sync
            + 'static,
    ) -> (Stream<'j, U>, KeyedStateHandle<K, S>)
    where
        S: Snapshot + Default + Clone + Send + 'static,
        U: Data,
    {
        let states: FinalStates<K, S> = Arc::new(Mutex::new(HashMap::new()));
        let stream = self.process_inner(name, function, Some(Arc::clone(&states)));
        (stream, KeyedStateHandle { states })
    }

    /// A rolling reduce per key, as Flink's `KeyedStream::reduce`: the
    /// first record of a key is its reduced value; every next record
    /// `value` makes it `function(&reduced, value)`. Emits the key's
    /// reduced value after every record. The reduced value is per-key
    /// state, checkpointed and restored exactly-once (and rescaled by key
    /// group like any keyed state).
    pub fn reduce(
        self,
        name: &str,
        function: impl Fn(&T, T) -> T + Send + Sync + 'static,
    ) -> Stream<'j, T> {
        self.process_inner(
            name,
            move |_key: &K, state: &mut Reduced<T>, record: T, out| {
                let reduced = match state.value.take() {
                    Some(previous) => function(&previous, record),
                    None => record,
                };
                out.emit(reduced.clone());
                state.value = Some(reduced);
                Ok(())
            },
            None,
        )
    }

    /// An incremental aggregation per key (see [`Aggregator`]): each
    /// record is added to its key's accumulator (per-key state, starting
    /// at `Default::default()`), then `(key, result)` is emitted. The key
    /// is part of the output because, unlike a reduce, the result need not
    /// contain it.
    pub fn aggregate<A>(self, name: &str, aggregator: A) -> Stream<'j, (K, A::Output)>
    where
        A: Aggregator<T>,
        K: Data,
    {
        self.process_inner(
            name,
            move |key: &K, accumulator: &mut A::Accumulator, record: T, out| {
                aggregator.add(accumulator, record)?;
                out.emit((key.clone(), aggregator.result(accumulator)));
                Ok(())
            },
            None,
        )
    }

    /// A keyed process function with event-time timers: `on_record` runs
    /// for each record as in [`KeyedStream::process`], with the key's
    /// [`Timers`]; `on_timer(key, state, timestamp_ms, timers, out)` runs
    /// once the operator's watermark reaches a registered time, in
    /// timestamp order, before the watermark is sent on (so its output
    /// comes first). Never concurrently with `on_record` on a subtask.
    /// Timers are per-key state, stored by key group, so they are
    /// restored exactly-once and rescale with their keys. The stream must
    /// have event time ([`Stream::assign_timestamps`]), or timers fire
    /// only at end of input.
    pub fn process_with_timers<S, U>(
        self,
        name: &str,
        on_record: impl Fn(&K, &mut S, T, &mut Timers<'_>, &mut Collector<'_, U>) -> Result<(), BoxError>
            + Send
            + Sync
            + 'static,
        on_timer: impl Fn(&K, &mut S, u64, &mut Timers<'_>, &mut Collector<'_, U>) -> Result<(), BoxError>
            + Send
            + Sync
            + 'static,
    ) -> Stream<'j, U>
    where
        S: Snapshot + Default + Clone + Send + 'static,
        U: Data,
    {
        let key_of = self.key_of;
        let key_of: Arc<dyn Fn(&T) -> K + Send + Sync> = Arc::new(move |record: &T| key_of(record));
        let key_hash: Arc<dyn Any + Send + Sync> = Arc::new(self.key_hash);
        let on_record: Arc<TimedFn<K, S, T, U>> = Arc::new(on_record);
        let on_timer: Arc<TimedFn<K, S, u64, U>> = Arc::new(on_timer);
        let max_parallelism =
            MaxParallelism::new(self.job.config.max_parallelism).unwrap_or_default();
        let make_core = Arc::new(move |subtask: usize, parallelism: usize| {
            Box::new(TimedKeyedCore::new(
                (max_parallelism, parallelism, subtask),
                Arc::clone(&key_of),
                Arc::clone(&on_record),
                Arc::clone(&on_timer),
            )) as Box<dyn Core<T, U>>
        });
        let producers = hash_producers(&self.producers);
        let operator = self.job.stage(name, &producers, Some(key_hash), make_core);
        self.job.graph.borrow_mut().operators[operator].rescale =
            Rescale::Operator(Arc::new(rescale_timed_states));
        self.job.stream_of(operator)
    }

    fn process_inner<S, U>(
        self,
        name: &str,
        function: impl Fn(&K, &mut S, T, &mut Collector<'_, U>) -> Result<(), BoxError>
            + Send
            + Sync
            + 'static,
        publish: Option<FinalStates<K, S>>,
    ) -> Stream<'j, U>
    where
        S: Snapshot + Default + Clone + Send + 'static,
        U: Data,
    {
        let key_of = self.key_of;
        let key_hash: Arc<dyn Any + Send + Sync> = Arc::new(self.key_hash);
        // Kept as its concrete type, as the key function: the core runs a
        // batch without an indirect call per record.
        let function = Arc::new(function);
        // Checked again by the plan; an invalid value makes `run` fail with
        // a typed error before this factory is ever called.
        let max_parallelism =
            MaxParallelism::new(self.job.config.max_parallelism).unwrap_or_default();
        let make_core = Arc::new(move |subtask: usize, parallelism: usize| {
            Box::new(KeyedCore::new(
                max_parallelism,
                parallelism,
                subtask,
                Arc::clone(&key_of),
                Arc::clone(&function),
                publish.clone(),
            )) as Box<dyn Core<T, U>>
        });
        let producers = hash_producers(&self.producers);
        let operator = self.job.stage(name, &producers, Some(key_hash), make_core);
        self.job.graph.borrow_mut().operators[operator].rescale = Rescale::Keyed;
        Stream {
            job: self.job,
            producers: vec![Producer {
                operator,
                partition: EdgeKind::Auto,
            }],
            _records: PhantomData,
        }
    }
}
