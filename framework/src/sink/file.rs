//! An exactly-once file sink: one file per subtask and checkpoint, made
//! visible by an atomic rename when the checkpoint completes.
//!
//! It owns, inside its directory, the files of its prefix and subtask:
//!
//! | file | what it holds |
//! |---|---|
//! | `.pending/<prefix>-<subtask>.inprogress` | the open transaction |
//! | `.pending/<prefix>-<subtask>-<checkpoint>.part` | a pre-committed transaction (fsynced) |
//! | `<prefix>-<subtask>-<checkpoint>` | committed output |
//!
//! Pre-commit flushes and fsyncs the open file, renames it to its `.part`
//! name and fsyncs the directory; the sink's state records each pending
//! file's size and CRC-32, so a restore never commits a file that was cut
//! short or changed ([`SinkError::StagedDataDamaged`]). Commit renames `.part` files into place
//! (a rename whose source is gone and whose target exists was done before:
//! idempotent). Restore commits the transactions its state lists and deletes
//! every other pending file of its prefix and subtask. It never touches
//! files of other prefixes or subtasks, and never deletes committed output.
//!
//! One writer per directory and prefix: the factory's first `create`
//! takes an OS lock on `.pending/<prefix>.lock` (see
//! [`crate::storage::owner`]) and every clone of the factory shares it
//! until the last one drops; a second process (or a second factory) with
//! the same directory and prefix fails with the non-retryable
//! [`SinkError::DirectoryInUse`] before it reads or deletes anything. The
//! lock dies with its process. Beyond that, the sink refuses to overwrite
//! committed output ([`SinkError::TargetExists`]) rather than lose it.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Display;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use super::{
    check_ascending, decode_staged_for, encode_staged, subtask_u32, Digest, Sink, SinkError,
    SinkFactory, SinkState, StagedFiles, Visibility,
};
use crate::storage::owner::{LockAttempt, OwnerLock};

/// The file-name prefix used unless another is given.
pub const DEFAULT_PREFIX: &str = "part";

const PENDING_DIR: &str = ".pending";
const MAX_PREFIX_BYTES: usize = 64;
/// Encoded records are written to the file once this many bytes gather.
const BUFFER_BYTES: usize = 64 * 1024;

/// Builds [`FileSink`]s that write into one directory.
///
/// ```
/// use snapflow::sink::{committed_files, FileSinkFactory, Sink, SinkFactory};
///
/// let dir = tempfile::tempdir().unwrap();
/// let factory = FileSinkFactory::<u64, _>::lines(dir.path())?.prefix("counts")?;
/// let mut sink = factory.create(0, 1)?;
/// sink.restore(None)?;
/// sink.write_batch(&[1, 2, 3])?;
/// sink.pre_commit(7)?;
/// sink.commit(7)?;
/// let files = committed_files(dir.path(), "counts")?;
/// assert_eq!(std::fs::read_to_string(&files[0]).unwrap(), "1\n2\n3\n");
/// # Ok::<(), snapflow::sink::SinkError>(())
/// ```
#[derive(Debug, Clone)]
pub struct FileSinkFactory<T, F> {
    dir: PathBuf,
    prefix: String,
    encode: F,
    fsync: bool,
    /// The lock that makes this factory (and its clones) the one writer
    /// of its prefix in `dir`, taken at the first `create`.
    owner: Arc<Mutex<Option<OwnerLock>>>,
    _records: PhantomData<fn(&T)>,
}

impl<T: Display> FileSinkFactory<T, fn(&T, &mut Vec<u8>)> {
    /// Writes each record with `Display`, followed by a newline.
    ///
    /// # Errors
    ///
    /// [`SinkError::Io`] when the directory cannot be created.
    pub fn lines(dir: impl AsRef<Path>) -> Result<Self, SinkError> {
        fn encode_line<T: Display>(record: &T, out: &mut Vec<u8>) {
            // Writing into a Vec cannot fail.
            let _ = writeln!(out, "{record}");
        }
        FileSinkFactory::new(dir, encode_line::<T> as fn(&T, &mut Vec<u8>))
    }
}

impl<T, F: Fn(&T, &mut Vec<u8>) + Clone> FileSinkFactory<T, F> {
    /// Writes each record as `encode` appends it to a buffer. Creates the
    /// directory and its `.pending` directory if needed.
    ///
    /// # Errors
    ///
    /// [`SinkError::Io`] when the directories cannot be created.
    pub fn new(dir: impl AsRef<Path>, encode: F) -> Result<Self, SinkError> {
        let dir = dir.as_ref().to_path_buf();
        let pending = dir.join(PENDING_DIR);
        fs::create_dir_all(&pending).map_err(io_error("creating", &pending))?;
        Ok(FileSinkFactory {
            dir,
            prefix: DEFAULT_PREFIX.to_string(),
            encode,
            fsync: true,
            owner: Arc::default(),
            _records: PhantomData,
        })
    }

    /// Whether pre-commit, commit and restore fsync files and directories;
    /// on by default. Turned off, output stays exactly-once across process
    /// crashes (the kernel's page cache outlives the process) but not
    /// across power loss or a kernel crash: for tests and scratch output.
    pub fn fsync(mut self, enabled: bool) -> Self {
        self.fsync = enabled;
        self
    }

    /// Uses `prefix` for file names: 1 to 64 ASCII letters, digits or `_`.
    ///
    /// # Errors
    ///
    /// [`SinkError::InvalidName`] for any other prefix.
    pub fn prefix(mut self, prefix: &str) -> Result<Self, SinkError> {
        validate_prefix(prefix)?;
        self.prefix = prefix.to_string();
        // A lock taken for the old prefix stays with the clones that use
        // it; this factory takes its own.
        self.owner = Arc::default();
        Ok(self)
    }

    /// Takes the directory's lock for this prefix unless this factory
    /// (or a clone) holds it already.
    fn own_directory(&self) -> Result<(), SinkError> {
        let mut owner = self.owner.lock().unwrap_or_else(PoisonError::into_inner);
        if owner.is_some() {
            return Ok(());
        }
        let path = self
            .dir
            .join(PENDING_DIR)
            .join(format!("{}.lock", self.prefix));
        match OwnerLock::try_acquire(&path).map_err(io_error("locking", &path))? {
            LockAttempt::Acquired(lock) => {
                *owner = Some(lock);
                Ok(())
            }
            LockAttempt::Refused { owner } => Err(SinkError::DirectoryInUse {
                dir: self.dir.clone(),
                prefix: self.prefix.clone(),
                owner,
            }),
        }
    }
}

fn validate_prefix(prefix: &str) -> Result<(), SinkError> {
    let invalid = |reason| {
        Err(SinkError::InvalidName {
            name: prefix.to_string(),
            reason,
        })
    };
    if prefix.is_empty() {
        return invalid("the prefix is empty");
    }
    if prefix.len() > MAX_PREFIX_BYTES {
        return invalid("the prefix is longer than 64 bytes");
    }
    if !prefix
        .bytes()
        .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_')
    {
        return invalid("the prefix may hold only ASCII letters, digits and `_`");
    }
    Ok(())
}

impl<T, F: Fn(&T, &mut Vec<u8>) + Clone> SinkFactory for FileSinkFactory<T, F> {
    type Sink = FileSink<T, F>;

    fn create(&self, subtask: usize, _parallelism: usize) -> Result<FileSink<T, F>, SinkError> {
        subtask_u32(subtask)?;
        self.own_directory()?;
        Ok(FileSink {
            names: Names {
                dir: self.dir.clone(),
                pending_dir: self.dir.join(PENDING_DIR),
                prefix: self.prefix.clone(),
                subtask,
            },
            encode: self.encode.clone(),
            fsync: self.fsync,
            open: None,
            written: RunningDigest::default(),
            buffer: Vec::new(),
            pending: BTreeMap::new(),
            finished: false,
            last_pre_commit: None,
            bytes_written: 0,
            _records: PhantomData,
        })
    }
}

/// The file names of one sink.
#[derive(Debug, Clone)]
struct Names {
    dir: PathBuf,
    pending_dir: PathBuf,
    prefix: String,
    subtask: usize,
}

impl Names {
    fn in_progress(&self) -> PathBuf {
        self.pending_dir
            .join(format!("{}-{}.inprogress", self.prefix, self.subtask))
    }

    fn pending(&self, checkpoint_id: u64) -> PathBuf {
        self.pending_dir.join(format!(
            "{}-{}-{checkpoint_id}.part",
            self.prefix, self.subtask
        ))
    }

    fn committed(&self, checkpoint_id: u64) -> PathBuf {
        self.dir
            .join(format!("{}-{}-{checkpoint_id}", self.prefix, self.subtask))
    }

    /// Whether `name` (in `.pending`) is one of this sink's files, and if so
    /// the checkpoint id it is filed under (`None` for the open file).
    fn parse_pending(&self, name: &str) -> Option<Option<u64>> {
        let own = format!("{}-{}", self.prefix, self.subtask);
        let rest = name.strip_prefix(own.as_str())?;
        if rest == ".inprogress" {
            return Some(None);
        }
        let id = rest.strip_prefix('-')?.strip_suffix(".part")?;
        let id = parse_decimal(id)?;
        // Only a name this sink would write counts; `part-0-07.part` is not.
        (name == format!("{own}-{id}.part")).then_some(Some(id))
    }
}

fn parse_decimal(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// One subtask's exactly-once file sink. See the module documentation.
#[derive(Debug)]
pub struct FileSink<T, F> {
    names: Names,
    encode: F,
    fsync: bool,
    /// The open transaction's file, created at the first write.
    open: Option<File>,
    /// Size and checksum of what was written to `open` so far.
    written: RunningDigest,
    /// Encoded records not yet written to `open`; bounded by flushing at
    /// [`BUFFER_BYTES`] (one record may overshoot it).
    buffer: Vec<u8>,
    /// Pre-committed, uncommitted transactions: checkpoint id and the
    /// digest of the staged file.
    pending: BTreeMap<u64, Digest>,
    finished: bool,
    last_pre_commit: Option<u64>,
    /// Bytes written to transaction files so far (an aborted one's too).
    bytes_written: u64,
    _records: PhantomData<fn(&T)>,
}

impl<T, F> FileSink<T, F> {
    /// Makes renames and deletions in `dir` durable (if fsync is on).
    fn sync_dir(&self, dir: &Path) -> Result<(), SinkError> {
        if !self.fsync {
            return Ok(());
        }
        File::open(dir)
            .and_then(|handle| handle.sync_all())
            .map_err(io_error("syncing", dir))
    }

    /// Syncs the output directory (new committed files) and `.pending`
    /// (their old names gone, rolled-back files deleted).
    fn sync_dirs(&self) -> Result<(), SinkError> {
        self.sync_dir(&self.names.dir)?;
        self.sync_dir(&self.names.pending_dir)
    }

    fn write_buffer(&mut self) -> Result<(), SinkError> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let path = self.names.in_progress();
        if self.open.is_none() {
            let file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .map_err(io_error("creating", &path))?;
            self.open = Some(file);
        }
        if let Some(file) = self.open.as_mut() {
            file.write_all(&self.buffer)
                .map_err(io_error("writing", &path))?;
            self.written.add(&self.buffer);
            self.bytes_written += self.buffer.len() as u64;
        }
        self.buffer.clear();
        Ok(())
    }

    /// Renames one pending file into place; done before counts as done.
    /// With a digest, the file is checked against it first: `restore`
    /// checks again what `check_restore` checked on another sink object,
    /// because the file may have changed in between, and a restore is rare
    /// enough that reading it twice costs little.
    fn commit_one(&self, checkpoint_id: u64, digest: Option<Digest>) -> Result<(), SinkError> {
        let source = self.names.pending(checkpoint_id);
        let target = self.names.committed(checkpoint_id);
        let source_exists = exists(&source)?;
        let target_exists = exists(&target)?;
        match (source_exists, target_exists) {
            (true, false) => {
                if let Some(digest) = digest {
                    self.verify_staged(checkpoint_id, digest)?;
                }
                fs::rename(&source, &target).map_err(io_error("renaming", &source))
            }
            (false, true) => Ok(()),
            (true, true) => Err(SinkError::TargetExists { path: target }),
            (false, false) => Err(SinkError::MissingTransaction {
                subtask: self.names.subtask,
                checkpoint_id,
            }),
        }
    }

    /// Checks a staged file against the digest recorded at pre-commit.
    fn verify_staged(&self, checkpoint_id: u64, expected: Digest) -> Result<(), SinkError> {
        let path = self.names.pending(checkpoint_id);
        let found = Digest::of_file(&path).map_err(io_error("reading", &path))?;
        if found == expected {
            return Ok(());
        }
        Err(SinkError::StagedDataDamaged {
            subtask: self.names.subtask,
            checkpoint_id,
            location: path.display().to_string(),
            reason: format!(
                "staged {} bytes with CRC-32 {:08x}, found {} bytes with CRC-32 {:08x}",
                expected.size_bytes, expected.crc32, found.size_bytes, found.crc32
            ),
        })
    }

    /// Whether a transaction the restored state lists can be restored:
    /// its staged file is intact, or it was committed already.
    fn check_listed(&self, checkpoint_id: u64, digest: Option<Digest>) -> Result<(), SinkError> {
        let source = self.names.pending(checkpoint_id);
        if exists(&source)? {
            return match digest {
                Some(digest) => self.verify_staged(checkpoint_id, digest),
                None => Ok(()),
            };
        }
        if exists(&self.names.committed(checkpoint_id))? {
            return Ok(());
        }
        Err(SinkError::StagedDataDamaged {
            subtask: self.names.subtask,
            checkpoint_id,
            location: source.display().to_string(),
            reason: "the staged file is missing and was never committed".to_string(),
        })
    }

    /// The checkpoint ids of this subtask's committed files above `after`.
    fn committed_after(&self, after: Option<u64>) -> Result<Vec<u64>, SinkError> {
        let dir = &self.names.dir;
        let mut ids = Vec::new();
        for entry in fs::read_dir(dir).map_err(io_error("listing", dir))? {
            let entry = entry.map_err(io_error("listing", dir))?;
            let name = entry.file_name();
            let Some((subtask, id)) = name
                .to_str()
                .and_then(|name| parse_committed(name, &self.names.prefix))
            else {
                continue;
            };
            if subtask == self.names.subtask as u64 && after.map_or(true, |after| id > after) {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    /// Deletes every pending file of this sink not filed under `keep`.
    fn delete_pending_except(&self, keep: &HashSet<u64>) -> Result<(), SinkError> {
        let pending_dir = &self.names.pending_dir;
        let entries = fs::read_dir(pending_dir).map_err(io_error("listing", pending_dir))?;
        for entry in entries {
            let entry = entry.map_err(io_error("listing", pending_dir))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let doomed = match self.names.parse_pending(&name) {
                Some(Some(id)) => !keep.contains(&id),
                Some(None) => true,
                None => false,
            };
            if doomed {
                let path = entry.path();
                fs::remove_file(&path).map_err(io_error("deleting", &path))?;
            }
        }
        Ok(())
    }
}

impl<T, F: Fn(&T, &mut Vec<u8>)> Sink for FileSink<T, F> {
    type Item = T;

    fn write_batch(&mut self, batch: &[T]) -> Result<(), SinkError> {
        if self.finished {
            return Err(SinkError::Misuse {
                reason: "write_batch after finish".to_string(),
            });
        }
        for record in batch {
            (self.encode)(record, &mut self.buffer);
            if self.buffer.len() >= BUFFER_BYTES {
                self.write_buffer()?;
            }
        }
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint_id: u64) -> Result<SinkState, SinkError> {
        check_ascending(self.last_pre_commit, checkpoint_id)?;
        self.write_buffer()?;
        if let Some(file) = self.open.take() {
            let open_path = self.names.in_progress();
            if self.fsync {
                file.sync_all().map_err(io_error("syncing", &open_path))?;
            }
            drop(file);
            let part_path = self.names.pending(checkpoint_id);
            fs::rename(&open_path, &part_path).map_err(io_error("renaming", &open_path))?;
            self.sync_dir(&self.names.pending_dir)?;
            self.pending
                .insert(checkpoint_id, std::mem::take(&mut self.written).finish());
        }
        self.last_pre_commit = Some(checkpoint_id);
        let staged = StagedFiles {
            subtask: subtask_u32(self.names.subtask)?,
            files: self
                .pending
                .iter()
                .map(|(id, digest)| (*id, Some(*digest)))
                .collect(),
        };
        Ok(encode_staged(&staged))
    }

    fn commit(&mut self, checkpoint_id: u64) -> Result<(), SinkError> {
        let due: Vec<u64> = self
            .pending
            .range(..=checkpoint_id)
            .map(|(id, _)| *id)
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        for id in due {
            // This process wrote the file moments ago: no re-read here.
            self.commit_one(id, None)?;
            self.pending.remove(&id);
        }
        self.sync_dirs()
    }

    fn abort(&mut self) -> Result<(), SinkError> {
        self.buffer.clear();
        self.written = RunningDigest::default();
        if self.open.take().is_some() {
            let path = self.names.in_progress();
            fs::remove_file(&path).map_err(io_error("deleting", &path))?;
        }
        Ok(())
    }

    fn restore(&mut self, state: Option<&SinkState>) -> Result<(), SinkError> {
        let listed = decode_staged_for(state, self.names.subtask)?;
        for (id, digest) in &listed {
            self.commit_one(*id, *digest)?;
        }
        self.delete_pending_except(&listed.iter().map(|(id, _)| *id).collect())?;
        self.sync_dirs()?;
        self.open = None;
        self.written = RunningDigest::default();
        self.buffer.clear();
        self.pending.clear();
        Ok(())
    }

    fn check_restore(
        &mut self,
        restored: Option<u64>,
        state: Option<&SinkState>,
    ) -> Result<Visibility, SinkError> {
        let listed = decode_staged_for(state, self.names.subtask)?;
        for (id, digest) in listed {
            self.check_listed(id, digest)?;
        }
        let committed = self.committed_after(restored)?;
        Ok(Visibility::Known(committed))
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.finished = true;
        self.write_buffer()
    }

    fn bytes_written(&self) -> Option<u64> {
        Some(self.bytes_written)
    }
}

/// A [`Digest`] being computed over bytes as they are written.
#[derive(Debug, Clone, Default)]
struct RunningDigest {
    size_bytes: u64,
    hasher: crc32fast::Hasher,
}

impl RunningDigest {
    fn add(&mut self, bytes: &[u8]) {
        self.size_bytes += bytes.len() as u64;
        self.hasher.update(bytes);
    }

    fn finish(self) -> Digest {
        Digest {
            size_bytes: self.size_bytes,
            crc32: self.hasher.finalize(),
        }
    }
}

impl Digest {
    /// Reads the file in bounded chunks; never holds it whole.
    fn of_file(path: &Path) -> io::Result<Digest> {
        use std::io::Read;
        let mut file = File::open(path)?;
        let mut digest = RunningDigest::default();
        let mut chunk = vec![0_u8; BUFFER_BYTES];
        loop {
            let read = file.read(&mut chunk)?;
            if read == 0 {
                return Ok(digest.finish());
            }
            digest.add(&chunk[..read]);
        }
    }
}

/// The committed files of `prefix` in `dir`, ordered by subtask, then by
/// checkpoint id: concatenated in this order they are the job's output.
///
/// # Errors
///
/// [`SinkError::InvalidName`] for a bad prefix, [`SinkError::Io`] when the
/// directory cannot be listed.
pub fn committed_files(dir: impl AsRef<Path>, prefix: &str) -> Result<Vec<PathBuf>, SinkError> {
    validate_prefix(prefix)?;
    let dir = dir.as_ref();
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error("listing", dir))? {
        let entry = entry.map_err(io_error("listing", dir))?;
        let name = entry.file_name();
        let Some(key) = name.to_str().and_then(|name| parse_committed(name, prefix)) else {
            continue;
        };
        files.push((key, entry.path()));
    }
    files.sort();
    Ok(files.into_iter().map(|(_, path)| path).collect())
}

/// `(subtask, checkpoint)` of a committed file name of `prefix`.
fn parse_committed(name: &str, prefix: &str) -> Option<(u64, u64)> {
    let rest = name.strip_prefix(prefix)?.strip_prefix('-')?;
    let (subtask, id) = rest.split_once('-')?;
    let key = (parse_decimal(subtask)?, parse_decimal(id)?);
    (name == format!("{prefix}-{}-{}", key.0, key.1)).then_some(key)
}

fn exists(path: &Path) -> Result<bool, SinkError> {
    path.try_exists().map_err(io_error("checking", path))
}

fn io_error(operation: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SinkError {
    let path = path.to_path_buf();
    move |source| SinkError::Io {
        operation,
        path,
        source,
    }
}
