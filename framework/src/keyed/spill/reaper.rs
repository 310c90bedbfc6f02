//! Dropping a spilling state's disk table off the thread that lets go of
//! it, and waiting for those drops at the end of a job.
//!
//! This module owns the threads that drop tables and the list of drops
//! still running. It never opens a table and never decides when a state
//! is dropped; the job calls [`wait_for_drops`] when it ends.
//!
//! # Why
//!
//! Dropping a fjall keyspace waits for its background threads, and a
//! compaction that has started runs to its end first (fjall checks for a
//! stop between compactions, not within one). When a region fails, its
//! old generation's states are dropped as its arbiters stop, and the new
//! generation started only after that: at 10 M keys the wait was 0.2 to
//! 0.9 s of the 1.8 s from the failure to processing again, with one core
//! running the old compaction and the other idle (BENCHMARKS.md at 07a44e5, "The
//! old generation's tables drop in the background"). Handed here, the
//! old table drops on a thread of its own while the new generation
//! restores, and the idle core does the old compaction.
//!
//! # Bounds
//!
//! One thread per table handed over, and a table is handed over once, by
//! the state that owns it: at most the instances of the generations that
//! stopped and whose compactions have not ended yet. Finished threads are
//! reaped at every hand-over, so the list holds only running drops.
//!
//! **Invariant:** when [`wait_for_drops`] returns, every table handed over
//! before the call has been dropped and its directory deleted, so no
//! directory of a job outlives the job.

use std::sync::Mutex;
use std::thread::JoinHandle;

use super::disk::DiskTable;

/// The threads dropping tables.
static DROPS: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());

/// Drops `table` on a thread of its own. If no thread can be started, it
/// is dropped here, as it was before this module.
pub(crate) fn drop_later(table: DiskTable) {
    let mut drops = DROPS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // Joining a finished thread does not wait.
    let (finished, running): (Vec<_>, Vec<_>) =
        drops.drain(..).partition(|handle| handle.is_finished());
    *drops = running;
    finished.into_iter().for_each(join);
    let spawned = std::thread::Builder::new()
        .name("snapflow-spill-drop".into())
        .spawn(move || drop(table));
    match spawned {
        Ok(handle) => drops.push(handle),
        // The closure, and the table in it, was dropped on this thread.
        Err(error) => tracing::warn!("could not start a thread to drop a spilling table: {error}"),
    }
}

/// Waits until every table a spilling state handed over before this call is
/// dropped and its directory deleted.
pub fn wait_for_drops() {
    let handles: Vec<_> = DROPS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .drain(..)
        .collect();
    handles.into_iter().for_each(join);
}

/// Joins a drop's thread. A panic there (in fjall's drop) is logged, not
/// raised: the table is gone either way, and the job's own result stands.
fn join(handle: JoinHandle<()>) {
    if handle.join().is_err() {
        tracing::error!("dropping a spilling table panicked");
    }
}

#[cfg(test)]
mod tests {
    use super::super::sizing::StoreSizing;
    use super::*;

    #[test]
    fn a_table_dropped_later_is_gone_when_the_wait_returns() {
        let work = tempfile::tempdir().unwrap();
        let dirs: Vec<_> = (0..3).map(|i| work.path().join(format!("t{i}"))).collect();
        for dir in &dirs {
            let table = DiskTable::open(dir, &StoreSizing::for_budget(1_000)).unwrap();
            table
                .put_all((0..1_000u32).map(|i| (i.to_be_bytes().to_vec(), vec![1; 64])))
                .unwrap();
            drop_later(table);
        }
        wait_for_drops();
        for dir in &dirs {
            assert!(!dir.exists(), "{} outlived the wait", dir.display());
        }
    }
}
