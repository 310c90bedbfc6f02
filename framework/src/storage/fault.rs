//! Fault injection for storage tests: an [`Io`] wrapper that fails the k-th
//! mutating operation.
//!
//! This module exists for tests (of this layer and of the runtime above it)
//! and is public for that reason. It never changes what the wrapped [`Io`]
//! does except to refuse operations.
//!
//! # What the model covers
//!
//! [`FaultyIo`] counts the mutating operations (`create_dir_all`,
//! `write_file`, `sync_file`, `rename`, `sync_dir`, `remove_file`,
//! `remove_dir_all`) and fails number `k` (0-based) with an I/O error. With
//! [`AfterFault::Crash`] every later operation fails too, reads included:
//! the process has "stopped" at that point, and a test reopens the directory
//! with a fresh store. With [`AfterFault::Continue`] only operation `k`
//! fails, which models a transient error such as a full disk.
//!
//! On its own this models a process crash: whatever the operating system
//! already accepted stays. It does not lose data that was written but not
//! fsynced (no page cache is simulated). For that, wrap
//! [`MemFs`](super::memory::MemFs) and call
//! [`MemFs::crash`](super::memory::MemFs::crash) after the fault.

use std::collections::VecDeque;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::io::{DirEntry, Io};
use super::owner::LockAttempt;

/// What happens after the injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFault {
    /// Every later operation fails too: the process is dead.
    Crash,
    /// Only the faulted operation fails.
    Continue,
}

/// Which operation fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPlan {
    /// No fault: only count operations.
    Never,
    /// Fail the mutating operation with this 0-based index.
    FailAt {
        /// The index among mutating operations.
        operation: u64,
        /// What happens afterwards.
        after: AfterFault,
    },
}

/// One mutating operation as it was attempted, for diagnostics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoOperation {
    /// Its 0-based index among mutating operations.
    pub index: u64,
    /// Its name, e.g. `"rename"`.
    pub name: &'static str,
    /// Its (first) path, shown with `Path::display`.
    pub path: String,
    /// Whether it was made to fail.
    pub failed: bool,
}

#[derive(Debug, Default)]
struct FaultState {
    count: u64,
    crashed: bool,
    log: VecDeque<IoOperation>,
}

/// An [`Io`] that fails one chosen mutating operation (see the module
/// documentation).
#[derive(Debug)]
pub struct FaultyIo {
    inner: Arc<dyn Io>,
    plan: FaultPlan,
    failing_reads: Option<String>,
    skip_syncs: bool,
    state: Mutex<FaultState>,
}

/// The most operations kept in [`FaultyIo::log`]; older ones are dropped so
/// a long-running test does not grow without bound.
const MAX_LOG_LEN: usize = 4096;

impl FaultyIo {
    /// Wraps `inner` with a fault plan.
    pub fn new(inner: Arc<dyn Io>, plan: FaultPlan) -> Self {
        Self {
            inner,
            plan,
            failing_reads: None,
            skip_syncs: false,
            state: Mutex::new(FaultState::default()),
        }
    }

    /// Counts `sync_file` and `sync_dir` as crash points but does not pass
    /// them on. For process-crash tests on a real disk: an fsync only
    /// matters after a power loss, which that model does not simulate, and
    /// skipping it makes such tests many times faster on a busy disk.
    pub fn skipping_syncs(mut self) -> Self {
        self.skip_syncs = true;
        self
    }

    /// Also fails every `read_file` whose path contains `fragment`, as an
    /// unreadable sector would. Reads are not counted as operations.
    pub fn failing_reads_of(mut self, fragment: impl Into<String>) -> Self {
        self.failing_reads = Some(fragment.into());
        self
    }

    /// How many mutating operations were attempted so far.
    pub fn operations(&self) -> u64 {
        self.lock().count
    }

    /// Whether the planned fault has happened.
    pub fn fault_hit(&self) -> bool {
        let state = self.lock();
        match self.plan {
            FaultPlan::Never => false,
            FaultPlan::FailAt { operation, .. } => state.count > operation,
        }
    }

    /// The most recent mutating operations (at most 4096), oldest first.
    pub fn log(&self) -> Vec<IoOperation> {
        self.lock().log.iter().cloned().collect()
    }

    fn lock(&self) -> MutexGuard<'_, FaultState> {
        // A panic while holding this lock cannot leave the counters
        // inconsistent, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a mutating operation and decides whether it fails.
    fn mutating(&self, name: &'static str, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        let index = state.count;
        state.count += 1;
        let fail = state.crashed
            || match self.plan {
                FaultPlan::Never => false,
                FaultPlan::FailAt { operation, after } => {
                    if index == operation && after == AfterFault::Crash {
                        state.crashed = true;
                    }
                    index == operation
                }
            };
        if state.log.len() == MAX_LOG_LEN {
            state.log.pop_front();
        }
        state.log.push_back(IoOperation {
            index,
            name,
            path: path.display().to_string(),
            failed: fail,
        });
        if fail {
            Err(injected(name, index))
        } else {
            Ok(())
        }
    }

    fn reading(&self, name: &'static str) -> io::Result<()> {
        if self.lock().crashed {
            Err(injected(name, u64::MAX))
        } else {
            Ok(())
        }
    }
}

fn injected(name: &'static str, index: u64) -> io::Error {
    let message = if index == u64::MAX {
        format!("injected fault: {name} after the simulated crash")
    } else {
        format!("injected fault at mutating operation {index} ({name})")
    };
    io::Error::other(message)
}

impl Io for FaultyIo {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.mutating("create_dir_all", path)?;
        self.inner.create_dir_all(path)
    }

    fn write_file(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.mutating("write_file", path)?;
        self.inner.write_file(path, bytes)
    }

    fn sync_file(&self, path: &Path) -> io::Result<()> {
        self.mutating("sync_file", path)?;
        if self.skip_syncs {
            return Ok(());
        }
        self.inner.sync_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.mutating("rename", from)?;
        self.inner.rename(from, to)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.mutating("sync_dir", path)?;
        if self.skip_syncs {
            return Ok(());
        }
        self.inner.sync_dir(path)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.mutating("remove_file", path)?;
        self.inner.remove_file(path)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.mutating("remove_dir_all", path)?;
        self.inner.remove_dir_all(path)
    }

    fn read_file(&self, path: &Path, limit_bytes: u64) -> io::Result<Vec<u8>> {
        self.reading("read_file")?;
        if let Some(fragment) = &self.failing_reads {
            if path.to_string_lossy().contains(fragment.as_str()) {
                return Err(io::Error::other(format!(
                    "injected read fault on {}",
                    path.display()
                )));
            }
        }
        self.inner.read_file(path, limit_bytes)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        self.reading("list_dir")?;
        self.inner.list_dir(path)
    }

    fn try_lock_owner(&self, path: &Path) -> io::Result<LockAttempt> {
        self.inner.try_lock_owner(path)
    }
}
