//! [`Stream`]: the operators on a typed stream, its partitioning, loops
//! and sinks. Keyed operations live in `keyed`.

use std::marker::PhantomData;
use std::sync::Arc;

use super::builder::Job;
use super::graph::{EdgeKind, EdgeSpec, Producer};
use super::keyed::KeyedStream;
use crate::job::operator::{Operator, OperatorContext};
use crate::job::ops::{
    rescale_operator_states, Key, OperatorCore, RecordFn, SinkCore, SinkMaker, StatelessCore,
};
use crate::job::physical::Rescale;
use crate::job::recovery::{SinkCheckFn, SinkRestoreFn, SinkView};
use crate::job::route::KeyHasher;
use crate::job::shell::{Core, Data};
use crate::job::snapshots::SnapshotStarter;
use crate::job::JobError;
use crate::sink::{Sink, SinkContext, SinkFactory};
use crate::watermark::WatermarkStrategy;

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
    pub(super) job: &'j Job,
    pub(super) producers: Vec<Producer>,
    pub(super) _records: PhantomData<fn() -> T>,
}

impl<'j, T: Data> Stream<'j, T> {
    pub(super) fn next<U>(&self, operator: usize) -> Stream<'j, U> {
        Stream {
            job: self.job,
            producers: vec![Producer {
                operator,
                partition: EdgeKind::Auto,
            }],
            _records: PhantomData,
        }
    }

    /// The same stream once more: both consumers get every record (the
    /// producer clones it for fan-out).
    pub(crate) fn also(&self) -> Stream<'j, T> {
        Stream {
            job: self.job,
            producers: self.producers.clone(),
            _records: PhantomData,
        }
    }

    /// This stream's producers run at the parallelism of `other`'s single
    /// producer, declared before them (nothing when `other` is a union).
    pub(crate) fn follow_parallelism_of<U>(self, other: &Stream<'j, U>) -> Self {
        if let [followed] = other.producers[..] {
            let mut graph = self.job.graph.borrow_mut();
            for producer in &self.producers {
                graph.operators[producer.operator].follows = Some(followed.operator);
            }
        }
        self
    }

    /// Shows `counter` as the producing operators' dropped late records
    /// in the job report.
    pub(crate) fn report_late_drops(&self, counter: Arc<std::sync::atomic::AtomicU64>) {
        let mut graph = self.job.graph.borrow_mut();
        for producer in &self.producers {
            graph.operators[producer.operator].late_dropped = Some(Arc::clone(&counter));
        }
    }

    pub(super) fn partitioned(mut self, partition: EdgeKind) -> Self {
        for producer in &mut self.producers {
            producer.partition = partition;
        }
        self
    }

    pub(super) fn stateless<U: Data>(self, name: &str, function: RecordFn<T, U>) -> Stream<'j, U> {
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
                snapshots: SnapshotStarter::default(),
            };
            Box::new(OperatorCore {
                operator: factory(&context),
                ended: false,
                requests: Some(context.snapshots.requests()),
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

    /// Opens an iteration that ends when a consistent snapshot proves it
    /// has terminated, with no timeout to tune: once every input of the
    /// head but the feedback has ended, the supervisor takes global
    /// snapshots of the loop's region (started at the head, a few
    /// milliseconds apart), and ends the loop at the first one in which
    /// every channel between the loop's operators is empty, every channel
    /// into the loop from outside has ended, and no operator of the loop
    /// holds records (see [`crate::job::snapshots::detect::is_loop_quiescent`]).
    /// Termination is a stable property, so a snapshot that shows it
    /// proves it; a record parked on a back edge is in the snapshot's
    /// channel state, so the loop never ends early. Otherwise as
    /// [`Stream::iterate`].
    pub fn iterate_until_quiescent(self, name: &str) -> (Stream<'j, T>, Feedback<'j, T>) {
        self.iterate(name, crate::job::physical::QUIESCENT_LOOP_IDLE_MS)
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

    /// Sets the parallelism of the operator that produces this stream
    /// (for the results or late records of
    /// [`side_output_late`](crate::time::WindowedStream::side_output_late)
    /// windows: the window operator's, which its two splitting operators
    /// follow).
    pub fn parallelism(self, parallelism: usize) -> Self {
        {
            let mut graph = self.job.graph.borrow_mut();
            if let [producer] = self.producers[..] {
                let mut operator = producer.operator;
                while let Some(followed) = graph.operators[operator].follows {
                    operator = followed;
                }
                graph.operators[operator].parallelism = Some(parallelism);
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
    pub fn sink<F>(self, name: &str, mut factory: F) -> SinkHandle<'j>
    where
        F: SinkFactory + Send + Sync + 'static,
        F::Sink: Sink<Item = T> + 'static,
    {
        let context = SinkContext::new(
            self.job.name(),
            name,
            self.job.effective_checkpoint_interval_ms(),
        );
        if let Err(error) = factory.open(&context) {
            self.job
                .graph
                .borrow_mut()
                .errors
                .push(JobError::SinkConfig {
                    sink: name.to_owned(),
                    error,
                });
        }
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
