//! [`KeyedStream`]: per-key state, reduce, aggregate and timers over a
//! keyed stream, and the handle that reads final keyed state.

use std::any::Any;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use crate::keyed::MaxParallelism;
use crate::runtime::BoxError;
use crate::state::Snapshot;

use super::builder::Job;
use super::graph::{EdgeKind, Producer};
use super::typed::Stream;
use crate::job::incremental::IncrementalCheckpoints;
use crate::job::inspect::restored_keyed_states;
use crate::job::operator::Aggregator;
use crate::job::ops::{FinalStates, Key, KeyedCore, Reduced, StatePlan};
use crate::job::physical::{CoreFactory, OperatorRescale, PublishRestored, Rescale};
use crate::job::route::{Collector, KeyHash};
use crate::job::shell::{Core, Data};
use crate::job::JobConfig;

/// A stream partitioned by key: every record with the same key goes to the
/// same subtask of the next operator (by key group).
///
/// `F` is the key function's type. [`Stream::key_by`] keeps it concrete,
/// so that the keyed operator's loop over a batch inlines the key function
/// together with the state lookup and the process function (one loop, no
/// indirect call per record); the default names the erased form.
#[must_use = "a keyed stream does nothing until it is processed"]
pub struct KeyedStream<'j, K, T, F: ?Sized = dyn Fn(&T) -> K + Send + Sync> {
    pub(super) job: &'j Job,
    pub(super) producers: Vec<usize>,
    pub(super) key_of: Arc<F>,
    /// `key_of` followed by the stable hash, as the partitioner uses it.
    pub(super) key_hash: KeyHash<T>,
    pub(super) _keys: PhantomData<fn() -> K>,
}

/// The job's incremental checkpoints as a keyed core takes them (`None`:
/// every checkpoint is full).
pub(crate) type IncrementalSettings = Option<IncrementalCheckpoints>;

/// Reads the final per-key state of a keyed operator after its job ran:
/// each subtask publishes its whole state when its input ends. A job that
/// had already finished ([`JobReport::already_finished`]: it resumed from
/// its own final checkpoint) runs nothing; its handle shows that
/// checkpoint's states.
///
/// [`JobReport::already_finished`]: crate::job::JobReport::already_finished
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

/// How a state handle is filled from a final checkpoint's parts when the
/// job had already finished: each subtask's states, as its `on_end`
/// would have published them.
fn publish_restored<K: Key, S: Snapshot + Send + 'static>(
    operator: &str,
    states: FinalStates<K, S>,
) -> PublishRestored {
    let operator = operator.to_owned();
    Arc::new(move |parts, max_parallelism| {
        let restored = restored_keyed_states::<K, S>(&operator, parts, max_parallelism)
            .map_err(|error| error.to_string())?;
        let mut published = states
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        published.clear();
        published.extend(
            restored
                .into_iter()
                .map(|(subtask, states)| (subtask as usize, states)),
        );
        Ok(())
    })
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
        S: Snapshot + Default + Clone + Send + Sync + 'static,
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
        S: Snapshot + Default + Clone + Send + Sync + 'static,
        U: Data,
    {
        let states: FinalStates<K, S> = Arc::new(Mutex::new(HashMap::new()));
        let job = self.job;
        let stream = self.process_inner(name, function, Some(Arc::clone(&states)));
        let operator = stream.producers[0].operator;
        job.graph.borrow_mut().operators[operator].publish_restored =
            Some(publish_restored(name, Arc::clone(&states)));
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
    ) -> Stream<'j, T>
    where
        // The reduced value is keyed state, encoded off the operator's
        // thread (asynchronous snapshots).
        T: Sync,
    {
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

    /// Adds a keyed operator whose per-subtask cores `make_core` builds
    /// from the key function and the job's settings, rescaled by the
    /// operator's own `rescale`: how `time` adds its timed core (timers,
    /// windows, state time-to-live) without this room naming it.
    pub(crate) fn keyed_stage<U: Data>(
        self,
        name: &str,
        make_core: impl FnOnce(Arc<F>, &JobConfig, IncrementalSettings) -> CoreFactory<T, U>,
        rescale: OperatorRescale,
    ) -> Stream<'j, U> {
        let key_hash: Arc<dyn Any + Send + Sync> = Arc::new(self.key_hash);
        let make_core = make_core(self.key_of, &self.job.config, self.job.incremental());
        let producers = hash_producers(&self.producers);
        let operator = self.job.stage(name, &producers, Some(key_hash), make_core);
        self.job.graph.borrow_mut().operators[operator].rescale = Rescale::Operator(rescale);
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
        S: Snapshot + Default + Clone + Send + Sync + 'static,
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
        let incremental = self.job.incremental();
        let plan = StatePlan {
            backend: self.job.config.keyed_backend.clone(),
            operator: name.to_string(),
            copy_on_write_threshold_keys: self.job.config.copy_on_write_threshold_keys,
        };
        let make_core = Arc::new(move |subtask: usize, parallelism: usize| {
            Box::new(KeyedCore::new(
                max_parallelism,
                parallelism,
                subtask,
                Arc::clone(&key_of),
                Arc::clone(&function),
                publish.clone(),
                incremental,
                &plan,
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
