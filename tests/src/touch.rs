//! The "keys touched" job the incremental-checkpoint tests share
//! (`incremental.rs` on the in-memory backend, `spill_backend.rs` on the
//! spilling one): a first phase of records over many keys, then a slow
//! phase over few, so that several checkpoints see only those few change.
//! It owns the job's shape and a store that retains every checkpoint; it
//! never asserts anything.

use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use snapflow::job::Job;
use snapflow::sink::CollectHandle;
use snapflow::source::VecSourceFactory;
use snapflow::storage::{FsCheckpointStore, StoreOptions};
use snapflow::Snapshot;

/// A key's count of records.
#[derive(Snapshot, Default, Clone)]
pub struct Count {
    /// Records seen for the key.
    pub count: u64,
}

/// A file store in `dir` that retains every checkpoint (1,000), so a test
/// can read each one's segments after the run.
pub fn retaining_store(dir: &Path, name: &str) -> Arc<FsCheckpointStore> {
    Arc::new(
        FsCheckpointStore::open_with(
            dir,
            name,
            StoreOptions {
                retained_checkpoints: 1_000,
            },
        )
        .expect("the store opens"),
    )
}

/// Declares on `job` a source of records `0..records` (one subtask), a map
/// that sleeps 1 ms on every tenth record from `slow_from` on (so the
/// slow phase spans several checkpoints), `key` as the key of each record,
/// a keyed count (operator `count`) that emits each new count, and a
/// collecting sink, whose handle it returns.
pub fn declare_touch(
    job: &Job,
    records: u64,
    slow_from: u64,
    key: fn(u64) -> u64,
) -> CollectHandle<u64> {
    let output = CollectHandle::<u64>::new();
    job.source("numbers", VecSourceFactory::new((0..records).collect()))
        .parallelism(1)
        .map("slow", move |id: u64| {
            if id >= slow_from && id % 10 == 0 {
                thread::sleep(Duration::from_millis(1));
            }
            id
        })
        .parallelism(1)
        .key_by(move |&id: &u64| key(id))
        .process("count", |_key: &u64, count: &mut Count, _id: u64, out| {
            count.count += 1;
            out.emit(count.count);
            Ok(())
        })
        .sink("collect", output.clone())
        .parallelism(1);
    output
}
