//! The spilling keyed-state backend (cargo feature `spill`): per-key state
//! larger than memory, with a bounded number of keys in memory and the
//! rest on local disk in an embedded LSM store (fjall).
//!
//! This module owns [`SpillingState`], its disk table, its streaming
//! snapshot [`SpillSnapshot`] and the snapshot's base files, change runs
//! and change log. It is the one
//! part of the keyed layer that does I/O, and only to its own working
//! directory, never to the checkpoint store: its snapshots are parts of
//! exactly the in-memory backend's format ([`crate::keyed::part`]), so
//! storage, incremental checkpoints, restore, rescale and `job::inspect`
//! see no difference, and a checkpoint written by one backend restores
//! into the other. It never decides when to snapshot and never talks to
//! actors. A job selects it with `JobConfig::keyed_backend`
//! ([`crate::keyed::KeyedBackend::Spilling`]).
//!
//! # Known gaps
//!
//! - Eviction is a second-chance (CLOCK) choice (`evict.rs`): a key
//!   found in memory again keeps its place while the hand laps the table.
//!   Its reference bit sits in the hot entry, which pads a small entry
//!   (16 to 24 bytes for a `u64` key and count); a bit set beside each
//!   slice would be smaller but needs bucket indices hashbrown 0.14 does
//!   not give. It is an approximation of recency, not LRU: the hand
//!   restarts a slice it stopped in from its first bucket, and past
//!   three cleared bits per victim it takes entries whatever their bits.
//! - The budget is in entries, not bytes. The store's memtables and block
//!   cache are bounded from it (`sizing.rs`), but fjall's bloom filters
//!   and block indexes and the filter of spilled keys (`filter.rs`) grow
//!   with the keys on disk (about 5 bytes each, measured), and glibc keeps
//!   memory that fjall's flush thread frees from the operator threads'
//!   arenas (about 20 bytes of RSS per spilled key unless the application
//!   sets `GLIBC_TUNABLES=glibc.malloc.trim_threshold=...` or another
//!   allocator; BENCHMARKS.md at 07a44e5).
//! - A lookup of a key that is on disk (or a false positive of the
//!   filter, under 1 %) still goes through fjall's memtables and segments
//!   on the operator's thread.
//! - A snapshot ([`SpillingState::snapshot`]) takes, on the operator's
//!   thread, the picked key groups' in-memory slices (frozen, constant
//!   time per slice), a fjall MVCC snapshot and the change log;
//!   [`SpillSnapshot`] then builds one key group's part at a time on the
//!   checkpoint writer's thread, as the previous snapshot's base merged
//!   with the changes since (`base.rs`, `changes.rs`, `source.rs`), or the
//!   fjall view when there is no such base, overlaid by the group's hot
//!   entries (`hot.rs`). A group written as a delta only appends its
//!   changes to its base as a sorted run (`runs.rs`); a group written
//!   whole, or past its runs' bound (`source.rs`, "The bound on runs"),
//!   is read whole and its base file rewritten, off the operator's
//!   thread. The parts are written to the checkpoint store, not as
//!   references to fjall's segment files (fjall's API does not expose
//!   them; BENCHMARKS.md at 07a44e5).
//! - The change log (`changes.rs`) is bounded by the budget (six entries
//!   per budgeted key, at least 2^18): when it fills it compacts to the
//!   newest record of each key, a sort on the operator's thread (not
//!   timed alone; the writer's sort of a similar log suggests tens of
//!   milliseconds at the floor), at most once per half a bound of writes,
//!   and when the distinct keys written since the last snapshot exceed
//!   half the bound (a long interval over a large, evenly written state)
//!   it gives up and the next snapshot scans fjall whole, on the writer's
//!   thread, as before the log existed. A log spilled to sorted runs on
//!   disk would remove that cliff; not built.
//! - When every key group changes each interval, an incremental
//!   checkpoint writes each as a delta part of the entries changed since
//!   the previous snapshot (`job/incremental/chains.rs`), so the bytes
//!   written follow the keys changed, and such a snapshot reads and
//!   writes only the changes (a run per group). The whole parts the chain
//!   bound forces (every few checkpoints when every group changes) and
//!   the runs' own bound still read and rewrite the whole local base, so
//!   the writer's CPU per checkpoint averages a fraction of the state's
//!   size, not only the changes'; and every delta still sorts the change
//!   log and visits every hot entry of its group to pick those whose
//!   write stamp is the snapshot's (`evict.rs`, `Clocked::written_for`:
//!   a field compare each, where a probe of a set of key hashes was).
//! - A state type without `Clone` cannot be frozen: its synchronous path
//!   ([`SpillingState::snapshot_encoded`], used by `parts_of`) encodes the
//!   hot entries on the operator's thread (at most the budget).
//! - Only the keyed operators of `process`, `reduce` and `aggregate` use
//!   it; timers, windows and time-to-live keep their state in memory.
//! - A process killed without unwinding leaves its instance directories
//!   behind (each is deleted when its instance is dropped).

mod base;
mod changes;
mod disk;
mod evict;
#[cfg(test)]
mod evict_tests;
mod filter;
mod hot;
mod merge;
mod order;
#[cfg(test)]
mod overlay_tests;
mod reaper;
mod restore;
mod runs;
#[cfg(test)]
mod runs_tests;
mod sizing;
mod snapshot;
mod source;
mod state;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub use reaper::wait_for_drops;
pub use snapshot::SpillSnapshot;
pub use state::SpillingState;

use super::KeyedError;
use crate::state::StateError;

/// Why the spilling backend failed. Disk and store errors are worth a
/// restart (the instance starts again in a fresh directory); a state that
/// does not encode or decode is not.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpillError {
    /// The working directory could not be created.
    #[error("the spilling backend could not create its directory {dir}: {source}")]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The embedded store failed.
    #[error("the spilling backend's store in {dir} failed: {source}")]
    Store {
        /// The store's directory.
        dir: PathBuf,
        /// fjall's error.
        source: fjall::Error,
    },
    /// A state did not encode or decode.
    #[error(transparent)]
    State(#[from] StateError),
    /// A key, key group or part was refused.
    #[error(transparent)]
    Keyed(#[from] KeyedError),
    /// A bug: something this backend wrote did not read back.
    #[error("the spilling backend: {0}")]
    Internal(String),
}

impl From<super::KeyGroupError> for SpillError {
    fn from(error: super::KeyGroupError) -> Self {
        SpillError::Keyed(KeyedError::KeyGroup(error))
    }
}

/// Entries read back from disk by every spilling state of this process
/// (see [`disk_loads_total`]).
static DISK_LOADS: AtomicU64 = AtomicU64::new(0);

/// How many entries every spilling state of this process has read back
/// from disk so far: each was a disk lookup on an operator's thread, the
/// cost a good eviction choice avoids. For benchmarks and metrics; a
/// state's own count is [`SpillingState::loaded_entries`].
pub fn disk_loads_total() -> u64 {
    DISK_LOADS.load(Ordering::Relaxed)
}

/// Counts one entry read back from disk. Relaxed: only a total is read,
/// and the read it counts costs far more than the increment.
pub(crate) fn count_disk_load() {
    DISK_LOADS.fetch_add(1, Ordering::Relaxed);
}

/// Distinguishes the directories of instances of the same operator and
/// subtask in one process (a restarted region's new instance may open its
/// table before the old one is dropped).
static INSTANCE: AtomicU64 = AtomicU64::new(0);

/// A directory beside `dir` that no table has used: a restore starts a
/// fresh table there rather than waiting for the old one's deletion.
pub(crate) fn fresh_dir(dir: &Path) -> PathBuf {
    let instance = INSTANCE.fetch_add(1, Ordering::Relaxed);
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{instance}"));
    dir.with_file_name(name)
}

/// The directory of one operator instance under the job's working
/// directory `root`: `<operator>-<subtask>-<process id>-<instance>`.
pub(crate) fn instance_dir(root: &Path, operator: &str, subtask: u32) -> PathBuf {
    let instance = INSTANCE.fetch_add(1, Ordering::Relaxed);
    root.join(format!(
        "{operator}-{subtask}-{}-{instance}",
        std::process::id()
    ))
}
