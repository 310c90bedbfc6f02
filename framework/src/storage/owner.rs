//! One owner per directory: an exclusive OS lock (`flock`) on a file,
//! taken before anything in the directory is read and held until the
//! owner drops it, with the owner's identity written inside for whoever is
//! refused.
//!
//! The checkpoint store takes it on `<job dir>/_lock`, the file sink on
//! `<output dir>/.pending/<prefix>.lock`: two processes of one job on one
//! store (a user's mistake, a service restarted while its old process still
//! runs, a cron overlap) would otherwise set each other's checkpoints aside
//! and commit each other's output twice. An OS lock dies with its process,
//! so a lock of a process killed with SIGKILL never blocks anyone; nothing
//! here ever deletes the lock file (deleting it would let a third process
//! lock a new file while the second still holds the old one).
//!
//! `flock` locks belong to an open file description, so a second open in
//! the *same* process is refused too: one store object (and one sink
//! factory) per directory and process. This module only locks and
//! describes; what a refusal means is said by its callers' errors
//! ([`StoreError::StoreInUse`](super::StoreError::StoreInUse) and the file
//! sink's `DirectoryInUse`).
//!
//! Known gap: network file systems whose `flock` is local to one client
//! (old NFS) do not exclude a process on another machine; on other systems
//! than Unix no lock is taken at all (the job says so once in its log).

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// How many bytes of an owner's description a refused process reads: the
/// description is one short line, and the file may have been written by
/// anyone, so the read is bounded.
const OWNER_DESCRIPTION_MAX_BYTES: u64 = 1024;

/// An exclusive lock on a file, held for as long as this value lives.
pub struct OwnerLock {
    path: PathBuf,
    /// The locked file; `None` for a lock that only exists in this process
    /// (an in-memory file system, which no other process can see).
    file: Option<File>,
}

impl fmt::Debug for OwnerLock {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("OwnerLock")
            .field("path", &self.path)
            .field("os_lock", &self.file.is_some())
            .finish()
    }
}

/// What trying to take an [`OwnerLock`] found.
#[derive(Debug)]
pub enum LockAttempt {
    /// The lock is ours until the value drops.
    Acquired(OwnerLock),
    /// Another open file (another process, or another store object in this
    /// one) holds it. `owner` is what its holder wrote into the file, when
    /// it could be read: pid, host and start time.
    Refused {
        /// The holder's description, if readable.
        owner: Option<String>,
    },
}

impl OwnerLock {
    /// Takes the lock on `path` without waiting, creating the file if it
    /// is missing, and writes [`this_process`] into it.
    ///
    /// # Errors
    ///
    /// Any I/O error of opening, locking or writing the file, except the
    /// lock being held, which is [`LockAttempt::Refused`].
    pub fn try_acquire(path: &Path) -> io::Result<LockAttempt> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if !try_lock_exclusive(&file)? {
            return Ok(LockAttempt::Refused {
                owner: read_owner(&mut file),
            });
        }
        // Ours now: say who we are. A reader may see the file half
        // written for a moment; it only loses the description.
        file.set_len(0)?;
        file.seek(SeekFrom::Start(0))?;
        file.write_all(this_process().as_bytes())?;
        Ok(LockAttempt::Acquired(OwnerLock {
            path: path.to_path_buf(),
            file: Some(file),
        }))
    }

    /// A lock that exists only in this process, for stores on a simulated
    /// file system no other process can reach.
    pub fn in_process(path: &Path) -> OwnerLock {
        OwnerLock {
            path: path.to_path_buf(),
            file: None,
        }
    }

    /// The locked file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// This process as an owner describes itself: pid, host and the moment it
/// took the lock (Unix milliseconds).
pub fn this_process() -> String {
    format!(
        "pid {} on host {} since unix ms {}",
        std::process::id(),
        host_name(),
        super::now_unix_ms()
    )
}

fn read_owner(file: &mut File) -> Option<String> {
    let mut bytes = Vec::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.take(OWNER_DESCRIPTION_MAX_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    let text = String::from_utf8_lossy(&bytes).trim().to_string();
    (!text.is_empty()).then_some(text)
}

#[cfg(unix)]
fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    use rustix::fs::{flock, FlockOperation};
    match flock(file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(errno) => Err(errno.into()),
    }
}

// Known gap (see the module documentation): no lock off Unix.
#[cfg(not(unix))]
fn try_lock_exclusive(_file: &File) -> io::Result<bool> {
    Ok(true)
}

#[cfg(unix)]
fn host_name() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

#[cfg(not(unix))]
fn host_name() -> String {
    std::env::var("COMPUTERNAME").unwrap_or_else(|_| "unknown".to_string())
}

#[cfg(test)]
mod tests {
    use super::{LockAttempt, OwnerLock};

    fn acquire(path: &std::path::Path) -> OwnerLock {
        match OwnerLock::try_acquire(path).expect("locking works") {
            LockAttempt::Acquired(lock) => lock,
            LockAttempt::Refused { owner } => panic!("refused, held by {owner:?}"),
        }
    }

    /// A second open of the same file is refused and told who holds it;
    /// once the holder drops its lock the file can be locked again.
    #[test]
    fn a_held_lock_refuses_a_second_holder_until_dropped() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("_lock");
        let first = acquire(&path);
        match OwnerLock::try_acquire(&path).expect("locking works") {
            LockAttempt::Refused { owner } => {
                let owner = owner.expect("the holder wrote its description");
                assert!(
                    owner.contains(&format!("pid {}", std::process::id())),
                    "{owner}"
                );
                assert!(owner.contains("on host "), "{owner}");
            }
            LockAttempt::Acquired(_) => panic!("a held lock was taken twice"),
        }
        drop(first);
        let again = acquire(&path);
        assert_eq!(again.path(), path);
    }

    /// An empty or unreadable description is no description, not an error.
    #[test]
    fn an_empty_file_is_locked_and_described() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("_lock");
        std::fs::write(&path, b"").expect("writes");
        let _lock = acquire(&path);
        let text = std::fs::read_to_string(&path).expect("reads");
        assert!(text.starts_with("pid "), "{text}");
    }
}
