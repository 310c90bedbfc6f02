//! The small file-system interface every store goes through.
//!
//! Keeping the operations few and path-based means a test can count them,
//! fail any one of them ([`FaultyIo`](super::fault::FaultyIo)) or run them
//! against a simulated disk that forgets what was not fsynced
//! ([`MemFs`](super::memory::MemFs)). This module owns the real
//! implementation, [`StdIo`]; it never knows what a checkpoint is.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::Path;

use super::owner::{LockAttempt, OwnerLock};

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DirEntry {
    /// The entry's file name (not a path). Names that are not UTF-8 are
    /// skipped by listings: the store never creates them.
    pub name: String,
    /// Whether the entry is a directory.
    pub is_dir: bool,
}

/// The file operations a store needs. Mutating operations are the crash
/// points that fault injection counts.
pub trait Io: Send + Sync + fmt::Debug {
    /// Creates a directory and its missing parents (no error if it exists).
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Creates or truncates a file and writes all of `bytes` (no fsync).
    fn write_file(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Creates or truncates a file and writes `pieces` one after the other
    /// (no fsync): one crash point, like [`Io::write_file`] of their
    /// concatenation, which is what the default does. [`StdIo`] writes
    /// the pieces as they are, so a large part made of many key groups is
    /// not copied into one buffer first.
    fn write_file_pieces(&self, path: &Path, pieces: &[&[u8]]) -> io::Result<()> {
        self.write_file(path, &pieces.concat())
    }
    /// Makes a file's data durable (fsync).
    fn sync_file(&self, path: &Path) -> io::Result<()>;
    /// Renames a file, replacing `to` if it exists.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes a directory's entries durable (fsync of the directory).
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Removes a directory and everything in it.
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Reads at most `limit_bytes` bytes of a file. Callers that know the
    /// expected length pass one more, to see a file that is too long.
    fn read_file(&self, path: &Path, limit_bytes: u64) -> io::Result<Vec<u8>>;
    /// Lists a directory, sorted by name.
    fn list_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>>;
    /// Takes the exclusive lock that makes its caller the one owner of a
    /// directory (see [`super::owner`]), without waiting: an OS lock on
    /// the real file system, which dies with its process. Not a crash
    /// point: it changes no stored byte a checkpoint depends on. A file
    /// system that no other process can reach (the simulated
    /// [`MemFs`](super::memory::MemFs)) returns
    /// [`OwnerLock::in_process`].
    fn try_lock_owner(&self, path: &Path) -> io::Result<LockAttempt>;
    /// Whether a directory exists. The default lists it; an object store,
    /// whose directories are only key prefixes, says whether any object
    /// lies under it.
    fn dir_exists(&self, path: &Path) -> io::Result<bool> {
        match self.list_dir(path) {
            Ok(_) => Ok(true),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(error) => Err(error),
        }
    }
    /// Whether [`Io::write_file`] is atomic and durable by itself (an
    /// object store's PUT): the engine then writes every file under its
    /// final name, without a temporary name, fsync and rename. False by
    /// default.
    fn atomic_writes(&self) -> bool {
        false
    }
    /// Writes a checkpoint's metadata file as the commit point of an
    /// [`Io`] that has one of its own (an object store: a create-once put
    /// and a conditional update of the pointer object), or `None` when it
    /// has none and the engine's temporary name, fsync and rename are the
    /// commit (the default).
    fn publish_metadata(&self, path: &Path, bytes: &[u8]) -> Option<io::Result<()>> {
        let _ = (path, bytes);
        None
    }
}

/// The real file system through `std::fs`.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdIo;

impl Io for StdIo {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }

    fn write_file(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut file = File::create(path)?;
        file.write_all(bytes)
    }

    fn write_file_pieces(&self, path: &Path, pieces: &[&[u8]]) -> io::Result<()> {
        let mut file = File::create(path)?;
        pieces.iter().try_for_each(|piece| file.write_all(piece))
    }

    fn sync_file(&self, path: &Path) -> io::Result<()> {
        // On Linux, fsync through any descriptor of the file flushes its
        // dirty pages, so reopening read-only is enough.
        File::open(path)?.sync_all()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        sync_dir(path)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir_all(path)
    }

    fn read_file(&self, path: &Path, limit_bytes: u64) -> io::Result<Vec<u8>> {
        let file = File::open(path)?;
        let file_len = file.metadata()?.len();
        // The capacity is bounded by what the file really holds, never by
        // the caller's limit, which may come from damaged metadata.
        let capacity = usize::try_from(file_len.min(limit_bytes)).unwrap_or(0);
        let mut bytes = Vec::with_capacity(capacity);
        file.take(limit_bytes).read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        let mut entries = Vec::new();
        for entry in fs::read_dir(path)? {
            let entry = entry?;
            if let Ok(name) = entry.file_name().into_string() {
                entries.push(DirEntry {
                    name,
                    is_dir: entry.file_type()?.is_dir(),
                });
            }
        }
        entries.sort();
        Ok(entries)
    }

    fn try_lock_owner(&self, path: &Path) -> io::Result<LockAttempt> {
        OwnerLock::try_acquire(path)
    }
}

#[cfg(unix)]
fn sync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

// Windows cannot open a directory as a file; NTFS journals renames itself.
// This is a known gap of the port, not of the Linux build.
#[cfg(not(unix))]
fn sync_dir(_path: &Path) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Io, StdIo};
    use crate::storage::memory::MemFs;

    /// Both ways of writing pieces leave exactly their concatenation, and
    /// replace what the file held.
    fn check(io: &dyn Io, dir: &std::path::Path) {
        let path = dir.join("pieces");
        io.write_file(&path, b"an older and longer content")
            .expect("writes");
        io.write_file_pieces(&path, &[b"ab", b"", b"cde", &[0; 3]])
            .expect("writes");
        assert_eq!(
            io.read_file(&path, 100).expect("reads"),
            b"abcde\0\0\0".to_vec()
        );
    }

    #[test]
    fn pieces_are_written_as_their_concatenation() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        check(&StdIo, dir.path());
        let memory = MemFs::default();
        memory.create_dir_all(dir.path()).expect("creates");
        check(&memory, dir.path());
    }
}
