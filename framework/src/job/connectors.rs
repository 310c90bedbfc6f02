//! The minimal source and sink contracts the job layer drives, plus the two
//! connectors the tests need: a replayable in-memory source and a collect
//! sink with two-phase commit.
//!
//! This module owns what a source reader and a sink writer must do for
//! exactly-once recovery (report and seek a position; pre-commit, commit and
//! recover transactions). It never touches actors, channels or the store:
//! the operator shells in [`super::shell`] call these hooks at the right
//! moments of the checkpoint protocol.
//!
//! Known gap: the richer `snapflow::source` / `snapflow::sink` modules are
//! written in parallel; these traits are the job layer's own minimal
//! versions until the two are reconciled.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::runtime::BoxError;

/// What one read of a source reader produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadStatus {
    /// Records were read (or may be available right away): read again.
    Ready,
    /// Nothing to read now; read again after this long.
    Idle {
        /// How long to wait before the next read.
        retry_after_ms: u64,
    },
    /// The reader is finished; it is never read again.
    Exhausted,
}

/// A source of records of type `T`: a factory of one reader per parallel
/// subtask. It is shared by every subtask and every generation of the job,
/// so it must be `Send + Sync`; the readers it makes live on one actor
/// thread and need not be.
pub trait Source<T>: Send + Sync + 'static {
    /// The reader of subtask `subtask` of `parallelism`, at its beginning.
    fn reader(&self, subtask: usize, parallelism: usize) -> Box<dyn SourceReader<T>>;
}

/// One subtask's reader. Exactly-once recovery needs [`SourceReader::position`]
/// and [`SourceReader::seek`] to agree: after `seek(p)` the reader produces
/// exactly what it produced after it reported `p`.
pub trait SourceReader<T>: 'static {
    /// Appends at most `max_records` records to `out`.
    fn read(&mut self, max_records: usize, out: &mut Vec<T>) -> Result<ReadStatus, BoxError>;

    /// The current position, as opaque bytes stored in the checkpoint.
    fn position(&self) -> Vec<u8>;

    /// Moves to a position returned by [`SourceReader::position`].
    fn seek(&mut self, position: &[u8]) -> Result<(), BoxError>;
}

/// A sink of records of type `T`: a factory of one writer per parallel
/// subtask (see [`Source`] for the sharing rules).
pub trait Sink<T>: Send + Sync + 'static {
    /// The writer of subtask `subtask` of `parallelism`, with no open
    /// transaction.
    fn writer(&self, subtask: usize, parallelism: usize) -> Box<dyn SinkWriter<T>>;
}

/// One subtask's writer, with two-phase commit: records written go into an
/// open transaction; at a checkpoint the transaction is pre-committed (its
/// description becomes part of the checkpoint), and it is committed only
/// when that checkpoint is complete. On restore the writer recovers the
/// pre-committed transactions of the restored checkpoint and commits them
/// (they belong to a complete checkpoint); everything written after it is
/// dropped, which is the abort.
pub trait SinkWriter<T>: 'static {
    /// Adds records to the open transaction.
    fn write(&mut self, batch: Vec<T>) -> Result<(), BoxError>;

    /// Closes the open transaction as checkpoint `checkpoint`'s and returns
    /// the state to store: every pre-committed transaction not yet
    /// committed, so a restore can finish them.
    fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, BoxError>;

    /// Checkpoint `checkpoint` is complete: commit every pre-committed
    /// transaction up to it. Must be idempotent per transaction.
    fn commit(&mut self, checkpoint: u64) -> Result<(), BoxError>;

    /// Restores from the state [`SinkWriter::pre_commit`] returned in the
    /// restored checkpoint, committing what it lists.
    fn recover(&mut self, state: &[u8]) -> Result<(), BoxError>;
}

/// A source reading a vector: record `i` goes to subtask `i % parallelism`,
/// and a subtask's position is how many of its records it has read.
#[derive(Debug, Clone)]
pub struct VecSource<T> {
    records: Arc<Vec<T>>,
}

impl<T> VecSource<T> {
    /// A source of `records`, in order per subtask.
    pub fn new(records: Vec<T>) -> VecSource<T> {
        VecSource {
            records: Arc::new(records),
        }
    }
}

impl<T: Clone + Send + Sync + 'static> Source<T> for VecSource<T> {
    fn reader(&self, subtask: usize, parallelism: usize) -> Box<dyn SourceReader<T>> {
        Box::new(VecReader {
            records: Arc::clone(&self.records),
            subtask,
            parallelism: parallelism.max(1),
            read: 0,
        })
    }
}

struct VecReader<T> {
    records: Arc<Vec<T>>,
    subtask: usize,
    parallelism: usize,
    /// How many of this subtask's records were read.
    read: u64,
}

impl<T: Clone + 'static> SourceReader<T> for VecReader<T> {
    fn read(&mut self, max_records: usize, out: &mut Vec<T>) -> Result<ReadStatus, BoxError> {
        for _ in 0..max_records {
            let index = self.subtask as u64 + self.read * self.parallelism as u64;
            let Some(record) = usize::try_from(index)
                .ok()
                .and_then(|index| self.records.get(index))
            else {
                return Ok(ReadStatus::Exhausted);
            };
            out.push(record.clone());
            self.read += 1;
        }
        Ok(ReadStatus::Ready)
    }

    fn position(&self) -> Vec<u8> {
        self.read.to_le_bytes().to_vec()
    }

    fn seek(&mut self, position: &[u8]) -> Result<(), BoxError> {
        let bytes: [u8; 8] = position
            .try_into()
            .map_err(|_| format!("a vector position is 8 bytes, got {}", position.len()))?;
        self.read = u64::from_le_bytes(bytes);
        Ok(())
    }
}

/// A sink that collects committed records in memory, for tests and
/// examples. Its [`CollectHandle`] shows only committed output, so it shows
/// exactly-once results even across restarts. Clones share the output, so
/// a job resumed in the same process can append to it.
#[derive(Debug)]
pub struct CollectSink<T> {
    shared: Arc<Mutex<Committed<T>>>,
}

impl<T> Clone for CollectSink<T> {
    fn clone(&self) -> Self {
        CollectSink {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The reader's side of a [`CollectSink`].
#[derive(Debug)]
pub struct CollectHandle<T> {
    shared: Arc<Mutex<Committed<T>>>,
}

impl<T> Clone for CollectHandle<T> {
    fn clone(&self) -> Self {
        CollectHandle {
            shared: Arc::clone(&self.shared),
        }
    }
}

#[derive(Debug)]
struct Committed<T> {
    /// (subtask, checkpoint) of every committed transaction, so a commit
    /// repeated after a restore is a no-op.
    done: BTreeSet<(usize, u64)>,
    records: Vec<T>,
}

impl<T> CollectSink<T> {
    /// A sink and the handle to read what it committed.
    pub fn new() -> (CollectSink<T>, CollectHandle<T>) {
        let shared = Arc::new(Mutex::new(Committed {
            done: BTreeSet::new(),
            records: Vec::new(),
        }));
        let handle = CollectHandle {
            shared: Arc::clone(&shared),
        };
        (CollectSink { shared }, handle)
    }
}

fn lock<T>(shared: &Mutex<Committed<T>>) -> MutexGuard<'_, Committed<T>> {
    // A panic while holding this lock can only come from `Vec::extend`
    // running out of memory; the data is still consistent then.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<T: Clone> CollectHandle<T> {
    /// Every committed record, in commit order (per subtask in write order).
    pub fn committed(&self) -> Vec<T> {
        lock(&self.shared).records.clone()
    }

    /// How many transactions were committed.
    pub fn transactions(&self) -> usize {
        lock(&self.shared).done.len()
    }
}

impl<T> Sink<T> for CollectSink<T>
where
    T: Clone + Send + Serialize + DeserializeOwned + 'static,
{
    fn writer(&self, subtask: usize, _parallelism: usize) -> Box<dyn SinkWriter<T>> {
        Box::new(CollectWriter {
            shared: Arc::clone(&self.shared),
            subtask,
            open: Vec::new(),
            pending: BTreeMap::new(),
        })
    }
}

#[derive(Serialize, Deserialize)]
struct PendingTransactions<T> {
    transactions: Vec<(u64, Vec<T>)>,
}

struct CollectWriter<T> {
    shared: Arc<Mutex<Committed<T>>>,
    subtask: usize,
    open: Vec<T>,
    /// Pre-committed, not yet committed. Bounded by the checkpoints in
    /// flight: every completion commits all older ones.
    pending: BTreeMap<u64, Vec<T>>,
}

impl<T> CollectWriter<T> {
    fn commit_transaction(&self, committed: &mut Committed<T>, checkpoint: u64, records: Vec<T>) {
        if committed.done.insert((self.subtask, checkpoint)) {
            committed.records.extend(records);
        }
    }
}

impl<T> SinkWriter<T> for CollectWriter<T>
where
    T: Clone + Send + Serialize + DeserializeOwned + 'static,
{
    fn write(&mut self, batch: Vec<T>) -> Result<(), BoxError> {
        if self.open.is_empty() {
            self.open = batch;
        } else {
            self.open.extend(batch);
        }
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, BoxError> {
        let records = std::mem::take(&mut self.open);
        self.pending.insert(checkpoint, records);
        let state = PendingTransactions {
            transactions: self
                .pending
                .iter()
                .map(|(id, records)| (*id, records.clone()))
                .collect(),
        };
        Ok(postcard::to_allocvec(&state)?)
    }

    fn commit(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        let later = self.pending.split_off(&(checkpoint + 1));
        let ready = std::mem::replace(&mut self.pending, later);
        let mut committed = lock(&self.shared);
        for (id, records) in ready {
            self.commit_transaction(&mut committed, id, records);
        }
        Ok(())
    }

    fn recover(&mut self, state: &[u8]) -> Result<(), BoxError> {
        let state: PendingTransactions<T> = postcard::from_bytes(state)?;
        let mut committed = lock(&self.shared);
        for (id, records) in state.transactions {
            self.commit_transaction(&mut committed, id, records);
        }
        Ok(())
    }
}
