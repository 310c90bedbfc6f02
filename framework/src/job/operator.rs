//! The user traits for custom operators: [`Operator`], a non-keyed operator
//! whose operator-level state is the implementing `#[derive(Snapshot)]`
//! struct itself, and [`Aggregator`], a per-key incremental aggregation
//! for [`KeyedStream::aggregate`](super::KeyedStream::aggregate).
//!
//! This module owns the contracts users implement and their documented
//! semantics (hook order, exactly-once, restore). It never runs anything:
//! the operator core in [`super::ops`] calls these hooks from the shell.

use crate::runtime::BoxError;
use crate::state::Snapshot;

use super::route::Collector;
use super::shell::Data;
use super::snapshots::{SnapshotStarter, Waiting};

/// A custom non-keyed operator with operator-level state: the implementing
/// struct is the state (`#[derive(Snapshot)]`), and one instance runs per
/// subtask, made by the factory given to
/// [`Stream::operator`](super::Stream::operator).
///
/// # Hooks and their order
///
/// For one subtask in one run (a *generation*; a restart starts a new one):
///
/// 1. The factory makes a fresh instance from the [`OperatorContext`].
/// 2. If the job restores from checkpoint `n` and this operator's subtask
///    has a part in it: the state is decoded into a second instance,
///    [`Operator::restore_from`] hands it to the fresh one (by default the
///    decoded instance replaces it), then [`Operator::on_restore`]`(n)`
///    runs. Neither runs on a fresh start.
/// 3. [`Operator::on_record`] for every record, in the order they arrive;
///    between two records, any number of checkpoints:
///    [`Operator::on_checkpoint`]`(n)` runs in the synchronous part of
///    checkpoint `n`, right before the instance is encoded as its state
///    (what it mutates there is part of checkpoint `n`), and
///    [`Operator::on_checkpoint_complete`]`(n)` runs once checkpoint `n`
///    is durable.
/// 4. [`Operator::on_end_of_input`] once every input ended (a bounded
///    job); it may emit final records. The job's final checkpoint comes
///    after it, so `on_checkpoint` and `on_checkpoint_complete` can still
///    follow. It runs once per subtask over the job's life: an instance
///    restored from a checkpoint taken after it does not run it again
///    (what it emitted is already part of that checkpoint downstream).
///
/// # Exactly-once
///
/// Each checkpoint holds the state as of a cut of the record stream: after
/// a failure the job restores checkpoint `n` and replays exactly the
/// records after that cut, so the state the operator ends with, and what
/// exactly-once sinks downstream commit, is as if no failure happened.
/// (In [`SnapshotMode::AtLeastOnce`](crate::protocol::SnapshotMode::AtLeastOnce)
/// the cut is not exact: records after it may reach the restored state
/// twice.) What the hooks do *outside* the state is not rolled back: a hook that
/// talks to the outside world sees records (and `on_checkpoint` calls)
/// after the last completed checkpoint again after a restart. As in Flink,
/// `on_checkpoint_complete` is a best-effort notification: a failure
/// between the checkpoint becoming durable and the notification skips it
/// (the restore's `on_restore(n)` then says that `n` completed).
///
/// An `Err` from any hook fails the job, which restarts per its
/// [`RestartStrategy`](super::RestartStrategy), exactly as an error of a
/// process function does; so does a panic.
///
/// # Parallelism
///
/// Operator state belongs to one subtask. Restoring a checkpoint at
/// another parallelism of this operator calls [`Operator::rescale`] with
/// the old subtasks' instances, and the operator decides how its state is
/// spread over the new subtasks (Flink's list state splits its elements
/// round robin; its union state hands every subtask all of them). The
/// default refuses, and the restore fails before anything starts with
/// [`JobError::RescaleUnsupported`](super::JobError::RescaleUnsupported).
/// State that is naturally per key rescales on its own in keyed state
/// ([`KeyedStream::process`](super::KeyedStream::process)).
///
/// # Example
///
/// ```
/// use snapflow::job::{Collector, Job, JobConfig, Operator, OperatorContext};
/// use snapflow::runtime::BoxError;
/// use snapflow::sink::CollectHandle;
/// use snapflow::source::VecSourceFactory;
/// use snapflow::Snapshot;
///
/// /// Sums its input and emits the sum when the input ends.
/// #[derive(Snapshot, Default)]
/// struct Total {
///     sum: u64,
///     /// Not state: set by the factory, kept across a restore.
///     #[snapshot(skip)]
///     subtask: usize,
/// }
///
/// impl Operator for Total {
///     type In = u64;
///     type Out = (usize, u64);
///
///     fn on_record(&mut self, record: u64, _out: &mut Collector<'_, (usize, u64)>) -> Result<(), BoxError> {
///         self.sum += record;
///         Ok(())
///     }
///
///     fn restore_from(&mut self, restored: Self) {
///         self.sum = restored.sum;
///     }
///
///     fn on_end_of_input(&mut self, out: &mut Collector<'_, (usize, u64)>) -> Result<(), BoxError> {
///         out.emit((self.subtask, self.sum));
///         Ok(())
///     }
/// }
///
/// let job = Job::new("total", JobConfig { default_parallelism: 2, ..JobConfig::default() });
/// let output = CollectHandle::new();
/// job.source("numbers", VecSourceFactory::new((1..=100_u64).collect()))
///     .operator("total", |context: &OperatorContext| Total { sum: 0, subtask: context.subtask })
///     .sink("collect", output.clone());
/// job.run()?;
/// let sums = output.committed();
/// assert_eq!(sums.len(), 2);
/// assert_eq!(sums.iter().map(|(_, sum)| sum).sum::<u64>(), 5050);
/// # Ok::<(), snapflow::job::JobError>(())
/// ```
pub trait Operator: Snapshot + Send + 'static {
    /// The input record type.
    type In: Data;
    /// The output record type.
    type Out: Data;

    /// Processes one record; emits any number of records through `out`.
    fn on_record(
        &mut self,
        record: Self::In,
        out: &mut Collector<'_, Self::Out>,
    ) -> Result<(), BoxError>;

    /// The synchronous part of checkpoint `checkpoint`, right before this
    /// instance is encoded as its state. No record is processed between
    /// this call and the encoding.
    fn on_checkpoint(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        let _ = checkpoint;
        Ok(())
    }

    /// Checkpoint `checkpoint` is complete and durable (best effort; see
    /// the trait's docs).
    fn on_checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        let _ = checkpoint;
        Ok(())
    }

    /// Takes over the state of `restored`, the instance decoded from the
    /// checkpoint, before [`Operator::on_restore`]. The default replaces
    /// this instance entirely, so `#[snapshot(skip)]` fields take their
    /// restored default; override it to keep such fields (configuration,
    /// handles) from the instance the factory made.
    fn restore_from(&mut self, restored: Self) {
        *self = restored;
    }

    /// The state was restored from checkpoint `checkpoint`; called once,
    /// before any record.
    fn on_restore(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        let _ = checkpoint;
        Ok(())
    }

    /// Every input ended; the last chance to emit.
    fn on_end_of_input(&mut self, out: &mut Collector<'_, Self::Out>) -> Result<(), BoxError> {
        let _ = out;
        Ok(())
    }

    /// The operator's event-time watermark rose to `watermark_ms` (the
    /// minimum over its non-idle inputs, see [`crate::time`]): no record
    /// with an event time at or below it follows, except late ones. What
    /// this emits reaches downstream before the watermark does. Called
    /// with [`crate::time::WATERMARK_MAX_MS`] once every input ended,
    /// before [`Operator::on_end_of_input`]. The watermark is kept in the
    /// checkpoint outside this instance, so a restore never calls this
    /// again for a watermark the restored state had already seen.
    fn on_watermark(
        &mut self,
        watermark_ms: u64,
        out: &mut Collector<'_, Self::Out>,
    ) -> Result<(), BoxError> {
        let _ = (watermark_ms, out);
        Ok(())
    }

    /// What this instance waits for, read at every global snapshot that is
    /// not a checkpoint (see [`Waiting`] for what "waiting" means and how
    /// the stuck detector uses it). The default waits for nothing; a
    /// join waiting for its other side returns the records it holds and
    /// that side's operator name.
    fn waiting(&self) -> Waiting {
        Waiting::default()
    }

    /// Spreads the state of the `old` subtasks (their instances as decoded
    /// from the checkpoint, in subtask order) over `parallelism` new ones,
    /// when a job is restored at another parallelism of this operator.
    /// Return exactly `parallelism` instances, in subtask order; each new
    /// subtask then gets its own through [`Operator::restore_from`].
    ///
    /// The default returns `None`: the state cannot be redistributed, and
    /// the restore fails with
    /// [`JobError::RescaleUnsupported`](super::JobError::RescaleUnsupported).
    /// A restore is refused as well when some old subtasks had seen the
    /// end of their input and others had not (a new subtask could not tell
    /// whether [`Operator::on_end_of_input`] already ran for its state).
    ///
    /// ```
    /// use snapflow::job::{Collector, Operator};
    /// use snapflow::runtime::BoxError;
    /// use snapflow::Snapshot;
    ///
    /// /// Counts records; counts add up, so rescaling keeps their total.
    /// #[derive(Snapshot, Default)]
    /// struct Count {
    ///     seen: u64,
    /// }
    ///
    /// impl Operator for Count {
    ///     type In = u64;
    ///     type Out = u64;
    ///
    ///     fn on_record(&mut self, _: u64, _: &mut Collector<'_, u64>) -> Result<(), BoxError> {
    ///         self.seen += 1;
    ///         Ok(())
    ///     }
    ///
    ///     fn rescale(old: Vec<Self>, parallelism: usize) -> Option<Vec<Self>> {
    ///         let total = old.iter().map(|count| count.seen).sum();
    ///         let mut new: Vec<Self> = (0..parallelism).map(|_| Count::default()).collect();
    ///         new.first_mut()?.seen = total;
    ///         Some(new)
    ///     }
    /// }
    ///
    /// let rescaled = Count::rescale(vec![Count { seen: 3 }, Count { seen: 4 }], 3).unwrap();
    /// assert_eq!(rescaled.iter().map(|count| count.seen).collect::<Vec<_>>(), [7, 0, 0]);
    /// ```
    fn rescale(old: Vec<Self>, parallelism: usize) -> Option<Vec<Self>>
    where
        Self: Sized,
    {
        let _ = (old, parallelism);
        None
    }
}

/// Which subtask an [`Operator`] instance is made for, and what it may
/// ask of the job.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OperatorContext {
    /// The subtask's index, in `0..parallelism`.
    pub subtask: usize,
    /// The operator's parallelism.
    pub parallelism: usize,
    /// Starts global snapshots at this subtask (see
    /// [`crate::job::snapshots`]); clone it into a `#[snapshot(skip)]`
    /// field to use it from the hooks.
    pub snapshots: SnapshotStarter,
}

/// An incremental per-key aggregation, as Flink's `AggregateFunction`:
/// the accumulator is the key's state (`Default::default()` is Flink's
/// `createAccumulator`), [`Aggregator::add`] folds one record into it and
/// [`Aggregator::result`] reads the current result.
/// [`KeyedStream::aggregate`](super::KeyedStream::aggregate) emits
/// `(key, result)` after every record. Flink's `merge` is not needed: there
/// are no merging windows.
///
/// ```
/// use snapflow::job::Aggregator;
/// use snapflow::runtime::BoxError;
/// use snapflow::Snapshot;
///
/// /// The mean of the values seen per key.
/// struct Mean;
///
/// #[derive(Snapshot, Default, Clone)]
/// struct SumCount {
///     sum: f64,
///     count: u64,
/// }
///
/// impl Aggregator<(String, f64)> for Mean {
///     type Accumulator = SumCount;
///     type Output = f64;
///
///     fn add(&self, accumulator: &mut SumCount, (_, value): (String, f64)) -> Result<(), BoxError> {
///         accumulator.sum += value;
///         accumulator.count += 1;
///         Ok(())
///     }
///
///     fn result(&self, accumulator: &SumCount) -> f64 {
///         accumulator.sum / accumulator.count as f64
///     }
/// }
/// ```
pub trait Aggregator<In>: Send + Sync + 'static {
    /// The per-key state.
    type Accumulator: Snapshot + Default + Clone + Send + Sync + 'static;
    /// What the aggregation emits per record (with its key).
    type Output: Data;

    /// Folds `value` into the key's accumulator. An `Err` fails the job.
    fn add(&self, accumulator: &mut Self::Accumulator, value: In) -> Result<(), BoxError>;

    /// The current result of an accumulator.
    fn result(&self, accumulator: &Self::Accumulator) -> Self::Output;

    /// Merges `from` into `into`: session windows
    /// ([`Windows::session`](crate::time::Windows::session)) call it when
    /// two windows of a key become one. Nothing else does, so only an
    /// aggregator used in session windows needs it. The default fails
    /// the job with a [`NotRetryable`](crate::runtime::NotRetryable)
    /// error that says so (retrying cannot add the method).
    fn merge(&self, into: &mut Self::Accumulator, from: Self::Accumulator) -> Result<(), BoxError> {
        let _ = (into, from);
        Err(Box::new(crate::runtime::NotRetryable::new(format!(
            "the aggregator {} does not implement Aggregator::merge, which session windows need",
            std::any::type_name::<Self>()
        ))))
    }
}
