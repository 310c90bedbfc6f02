//! What a window computes over its records: an incremental aggregate
//! ([`Aggregator`], of which count is one), a reduce, or a full-window
//! function that sees every record. [`WindowFunction`] is the one shape
//! the window operator drives: add a record to a window's contents,
//! merge two windows' contents (session windows), and give the result.
//!
//! It never decides which window a record belongs to or when a window
//! fires (`window` and `window_state` do), and never touches timers.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::job::{Aggregator, Data};
use crate::runtime::BoxError;

/// The contents of one window and how they become its result.
pub(crate) trait WindowFunction<K, T>: Send + Sync + 'static {
    /// One window's contents, kept as keyed state.
    /// `Sync` because a checkpoint of a large window state hands its
    /// tables to the checkpoint writer, which reads them while the
    /// operator goes on.
    type Contents: Clone + Default + Send + Sync + Serialize + DeserializeOwned + 'static;
    /// The window's result.
    type Output: Data;

    /// Adds `record` to a window.
    fn add(&self, contents: &mut Self::Contents, record: T) -> Result<(), BoxError>;
    /// Merges `from` into `into` (two session windows became one).
    fn merge(&self, into: &mut Self::Contents, from: Self::Contents) -> Result<(), BoxError>;
    /// The window's result.
    fn result(&self, key: &K, contents: &Self::Contents) -> Result<Self::Output, BoxError>;
}

/// An [`Aggregator`] as a window function: each window holds one
/// accumulator.
pub(crate) struct Aggregating<A>(pub(crate) A);

impl<K, T, A> WindowFunction<K, T> for Aggregating<A>
where
    A: Aggregator<T>,
    A::Accumulator: Serialize + DeserializeOwned,
{
    type Contents = A::Accumulator;
    type Output = A::Output;

    fn add(&self, contents: &mut A::Accumulator, record: T) -> Result<(), BoxError> {
        self.0.add(contents, record)
    }

    fn merge(&self, into: &mut A::Accumulator, from: A::Accumulator) -> Result<(), BoxError> {
        self.0.merge(into, from)
    }

    fn result(&self, _key: &K, contents: &A::Accumulator) -> Result<A::Output, BoxError> {
        Ok(self.0.result(contents))
    }
}

/// The aggregator of `WindowedStream::count`.
pub(crate) struct CountRecords;

/// The accumulator of [`CountRecords`].
#[derive(crate::Snapshot, Clone, Default, Serialize, Deserialize)]
#[snapshot(crate = "crate")]
pub(crate) struct RecordCount {
    records: u64,
}

impl<T> Aggregator<T> for CountRecords {
    type Accumulator = RecordCount;
    type Output = u64;

    fn add(&self, accumulator: &mut RecordCount, _value: T) -> Result<(), BoxError> {
        accumulator.records += 1;
        Ok(())
    }

    fn result(&self, accumulator: &RecordCount) -> u64 {
        accumulator.records
    }

    fn merge(&self, into: &mut RecordCount, from: RecordCount) -> Result<(), BoxError> {
        into.records += from.records;
        Ok(())
    }
}

/// A reduce as a window function: the window holds the records reduced
/// so far (`None` while it is empty, which a fired window never is).
pub(crate) struct Reducing<F>(pub(crate) F);

impl<K, T, F> WindowFunction<K, T> for Reducing<F>
where
    T: Data + Sync,
    F: Fn(&T, T) -> T + Send + Sync + 'static,
{
    type Contents = Option<T>;
    type Output = T;

    fn add(&self, contents: &mut Option<T>, record: T) -> Result<(), BoxError> {
        let reduced = match contents.take() {
            Some(previous) => (self.0)(&previous, record),
            None => record,
        };
        *contents = Some(reduced);
        Ok(())
    }

    fn merge(&self, into: &mut Option<T>, from: Option<T>) -> Result<(), BoxError> {
        match from {
            Some(from) => <Self as WindowFunction<K, T>>::add(self, into, from),
            None => Ok(()),
        }
    }

    fn result(&self, _key: &K, contents: &Option<T>) -> Result<T, BoxError> {
        // A window exists only once a record was added to it.
        contents
            .clone()
            .ok_or_else(|| "bug: a window fired with no record in it".into())
    }
}

/// A full-window function: the window keeps every record (in arrival
/// order; a merged session keeps the older window's records first), and
/// the function sees them all when the window fires.
pub(crate) struct Processing<F>(pub(crate) F);

/// The records of one window, for [`Processing`].
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct Elements<T> {
    records: Vec<T>,
}

impl<T> Default for Elements<T> {
    fn default() -> Self {
        Elements {
            records: Vec::new(),
        }
    }
}

impl<K, T, R, F> WindowFunction<K, T> for Processing<F>
where
    T: Data + Sync,
    R: Data,
    F: Fn(&K, &[T]) -> Result<R, BoxError> + Send + Sync + 'static,
{
    type Contents = Elements<T>;
    type Output = R;

    fn add(&self, contents: &mut Elements<T>, record: T) -> Result<(), BoxError> {
        contents.records.push(record);
        Ok(())
    }

    fn merge(&self, into: &mut Elements<T>, from: Elements<T>) -> Result<(), BoxError> {
        into.records.extend(from.records);
        Ok(())
    }

    fn result(&self, key: &K, contents: &Elements<T>) -> Result<R, BoxError> {
        (self.0)(key, &contents.records)
    }
}
