//! A sink that collects records in memory, behind a handle the caller reads
//! while or after the job runs.
//!
//! The handle plays the external transactional system: pre-committed
//! transactions and committed output live in it and survive the death of a
//! sink object, while the open transaction lives in the sink and dies with
//! it, as a process's memory would. The handle shows committed output, and
//! separately how much is pending; it never shows the open transaction.
//!
//! The store is unbounded: it keeps everything committed, by design, for
//! tests and small jobs. Use a file sink for large output.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{
    check_ascending, subtask_u32, PendingTransactions, Sink, SinkError, SinkFactory, SinkState,
    Visibility,
};

/// What one subtask has stored in the handle.
#[derive(Debug)]
struct SubtaskStore<T> {
    committed: Vec<T>,
    committed_ids: BTreeSet<u64>,
    pending: BTreeMap<u64, Vec<T>>,
}

impl<T> Default for SubtaskStore<T> {
    fn default() -> Self {
        SubtaskStore {
            committed: Vec::new(),
            committed_ids: BTreeSet::new(),
            pending: BTreeMap::new(),
        }
    }
}

impl<T> SubtaskStore<T> {
    /// Moves every pending transaction with an id `<= checkpoint_id` to the
    /// committed output, in id order.
    fn commit_through(&mut self, checkpoint_id: u64) {
        let later = self.pending.split_off(&checkpoint_id.saturating_add(1));
        for (id, records) in std::mem::replace(&mut self.pending, later) {
            self.committed.extend(records);
            self.committed_ids.insert(id);
        }
    }
}

/// The caller's view of a [`CollectSink`]'s output, shared by every
/// subtask's sink. Cloning gives another view of the same store.
///
/// ```
/// use snapflow::sink::{CollectHandle, Sink};
///
/// let handle = CollectHandle::new();
/// let mut sink = handle.sink(0);
/// sink.restore(None)?;
/// sink.write_batch(&["a", "b"])?;
/// sink.pre_commit(1)?;
/// assert!(handle.committed().is_empty());
/// assert_eq!(handle.pending_len(), 2);
/// sink.commit(1)?;
/// assert_eq!(handle.committed(), ["a", "b"]);
/// # Ok::<(), snapflow::sink::SinkError>(())
/// ```
#[derive(Debug)]
pub struct CollectHandle<T> {
    store: Arc<Mutex<BTreeMap<usize, SubtaskStore<T>>>>,
}

impl<T> Clone for CollectHandle<T> {
    fn clone(&self) -> Self {
        CollectHandle {
            store: Arc::clone(&self.store),
        }
    }
}

impl<T> Default for CollectHandle<T> {
    fn default() -> Self {
        CollectHandle {
            store: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }
}

impl<T> CollectHandle<T> {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new sink for `subtask`, writing into this store.
    pub fn sink(&self, subtask: usize) -> CollectSink<T> {
        CollectSink {
            handle: self.clone(),
            subtask,
            open: Vec::new(),
            finished: false,
            last_pre_commit: None,
        }
    }

    /// The number of records pre-committed but not yet committed, over all
    /// subtasks.
    pub fn pending_len(&self) -> usize {
        self.lock()
            .values()
            .flat_map(|store| store.pending.values())
            .map(Vec::len)
            .sum()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<usize, SubtaskStore<T>>> {
        // A panic while the lock is held can only come from an allocation
        // failure mid-update; the vectors stay valid, so keep using them.
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: Clone> CollectHandle<T> {
    /// Every committed record: subtask 0's in commit order, then subtask
    /// 1's, and so on.
    pub fn committed(&self) -> Vec<T> {
        self.lock()
            .values()
            .flat_map(|store| store.committed.iter().cloned())
            .collect()
    }

    /// The committed records of one subtask, in commit order.
    pub fn committed_of(&self, subtask: usize) -> Vec<T> {
        self.lock()
            .get(&subtask)
            .map(|store| store.committed.clone())
            .unwrap_or_default()
    }
}

impl<T: Clone> SinkFactory for CollectHandle<T> {
    type Sink = CollectSink<T>;

    fn create(&self, subtask: usize, _parallelism: usize) -> Result<CollectSink<T>, SinkError> {
        Ok(self.sink(subtask))
    }
}

/// One subtask's sink into a [`CollectHandle`]. Exactly-once.
#[derive(Debug)]
pub struct CollectSink<T> {
    handle: CollectHandle<T>,
    subtask: usize,
    open: Vec<T>,
    finished: bool,
    last_pre_commit: Option<u64>,
}

impl<T: Clone> Sink for CollectSink<T> {
    type Item = T;

    fn write_batch(&mut self, batch: &[T]) -> Result<(), SinkError> {
        if self.finished {
            return Err(SinkError::Misuse {
                reason: "write_batch after finish".to_string(),
            });
        }
        self.open.extend_from_slice(batch);
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint_id: u64) -> Result<SinkState, SinkError> {
        check_ascending(self.last_pre_commit, checkpoint_id)?;
        self.last_pre_commit = Some(checkpoint_id);
        let mut stores = self.handle.lock();
        let store = stores.entry(self.subtask).or_default();
        if !self.open.is_empty() {
            store
                .pending
                .insert(checkpoint_id, std::mem::take(&mut self.open));
        }
        let checkpoint_ids = store.pending.keys().copied().collect();
        Ok(PendingTransactions {
            subtask: subtask_u32(self.subtask)?,
            checkpoint_ids,
        }
        .encode())
    }

    fn commit(&mut self, checkpoint_id: u64) -> Result<(), SinkError> {
        self.handle
            .lock()
            .entry(self.subtask)
            .or_default()
            .commit_through(checkpoint_id);
        Ok(())
    }

    fn abort(&mut self) -> Result<(), SinkError> {
        self.open.clear();
        Ok(())
    }

    fn restore(&mut self, state: Option<&SinkState>) -> Result<(), SinkError> {
        let listed = PendingTransactions::decode_for(state, self.subtask)?;
        let mut stores = self.handle.lock();
        let store = stores.entry(self.subtask).or_default();
        for id in &listed {
            if !store.pending.contains_key(id) && !store.committed_ids.contains(id) {
                return Err(SinkError::MissingTransaction {
                    subtask: self.subtask,
                    checkpoint_id: *id,
                });
            }
        }
        store.pending.retain(|id, _| listed.contains(id));
        if let Some(last) = listed.last() {
            store.commit_through(*last);
        }
        self.open.clear();
        Ok(())
    }

    fn check_restore(
        &mut self,
        restored: Option<u64>,
        state: Option<&SinkState>,
    ) -> Result<Visibility, SinkError> {
        let listed = PendingTransactions::decode_for(state, self.subtask)?;
        let mut stores = self.handle.lock();
        let store = stores.entry(self.subtask).or_default();
        // The handle is the external system: a transaction it never saw
        // is not damaged staging but another system (a fresh handle), so
        // this is the typed error of the restore itself, not a fallback.
        if let Some(id) = listed
            .iter()
            .find(|id| !store.pending.contains_key(id) && !store.committed_ids.contains(id))
        {
            return Err(SinkError::MissingTransaction {
                subtask: self.subtask,
                checkpoint_id: *id,
            });
        }
        let after = restored;
        let committed = store
            .committed_ids
            .iter()
            .copied()
            .filter(|id| after.map_or(true, |after| *id > after))
            .collect();
        Ok(Visibility::Known(committed))
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.finished = true;
        Ok(())
    }
}
