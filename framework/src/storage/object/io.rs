//! [`ObjectIo`]: the engine's [`Io`] on an object store, so that one
//! engine (layout, write order, fallback, retention, shared files) serves
//! both the file system and object storage.
//!
//! Directories are key prefixes: creating and fsyncing them does nothing,
//! listing one is a listing with a delimiter, renaming one copies and
//! deletes its objects. A PUT is atomic, so files are written under their
//! final names. Three things differ, and this module owns them:
//!
//! - the commit ([`Io::publish_metadata`]): the metadata object is
//!   written create-once, then the pointer (`pointer.rs`) is updated with
//!   `If-Match` on the ETag this store last wrote. Only that update makes
//!   the checkpoint exist; a metadata object the pointer does not name
//!   reads as absent;
//! - ownership ([`Io::try_lock_owner`]): opening a store takes the
//!   pointer over (a conditional write raising its epoch). A store that
//!   was taken over finds out at its next conditional write and fails
//!   with [`StoreError::StoreInUse`], not retryable;
//! - deleting or moving a committed entry removes it from the pointer
//!   first, by the same conditional write.
//!
//! It never decides what to write or delete; the engine does.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload, UpdateVersion, WriteMultipart};

use super::bridge::Bridge;
use super::errors::classify;
use super::pointer::{Pointer, MAX_POINTER_BYTES, POINTER_FILE};

use crate::storage::io::{DirEntry, Io};
use crate::storage::owner::{this_process, LockAttempt, OwnerLock};
use crate::storage::StoreError;

/// Files up to this size are one PUT; larger ones a multipart upload.
const SINGLE_PUT_MAX_BYTES: usize = 64 << 20;
/// The size of each part of a multipart upload.
const MULTIPART_CHUNK_BYTES: usize = 16 << 20;
/// How many parts of one upload are in flight at once.
const MULTIPART_IN_FLIGHT: usize = 4;
/// How many times a takeover re-reads the pointer when another writer
/// changed it in between.
const TAKEOVER_ATTEMPTS: usize = 5;
/// The metadata object's name (the engine's).
const METADATA_FILE: &str = crate::storage::engine::METADATA_FILE;

/// A pointer this store wrote last, with the version to update it from.
#[derive(Debug)]
struct Held {
    pointer: Pointer,
    version: UpdateVersion,
}

/// The engine's [`Io`] on an object store; see the module documentation.
#[derive(Debug)]
pub(crate) struct ObjectIo {
    store: Arc<dyn ObjectStore>,
    bridge: Bridge,
    /// The path the engine is given as its root, e.g. `s3://bucket/prefix`.
    root: PathBuf,
    /// The key prefix `root` stands for (may be empty).
    prefix: ObjectPath,
    /// The pointers of the job directories this store owns, by job
    /// directory. The lock is held across each conditional write, so one
    /// store's commits and deletions update its pointer one at a time.
    held: Mutex<HashMap<PathBuf, Held>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ObjectIo {
    /// An `Io` on `store`, where `root` stands for the keys under `prefix`.
    pub(crate) fn new(
        store: Arc<dyn ObjectStore>,
        root: PathBuf,
        prefix: ObjectPath,
    ) -> io::Result<Self> {
        Ok(Self {
            store,
            bridge: Bridge::new()?,
            root,
            prefix,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// The key of `path`, which must lie under the root.
    fn key(&self, path: &Path) -> io::Result<ObjectPath> {
        let relative = path.strip_prefix(&self.root).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not under {}", path.display(), self.root.display()),
            )
        })?;
        let mut key = self.prefix.clone();
        for component in relative.components() {
            let part = component.as_os_str().to_str().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "a key that is not UTF-8")
            })?;
            key = key.child(part);
        }
        Ok(key)
    }

    /// Runs one request and classifies its error.
    fn request<T: Send + 'static>(
        &self,
        path: &Path,
        future: impl std::future::Future<Output = object_store::Result<T>> + Send + 'static,
    ) -> io::Result<T> {
        self.bridge
            .run(future)?
            .map_err(|error| classify(&path.display().to_string(), error))
    }

    fn put(
        &self,
        path: &Path,
        bytes: Vec<u8>,
        mode: PutMode,
    ) -> io::Result<object_store::Result<UpdateVersion>> {
        let key = self.key(path)?;
        let store = Arc::clone(&self.store);
        self.bridge.run(async move {
            store
                .put_opts(&key, PutPayload::from(bytes), PutOptions::from(mode))
                .await
                .map(|result| UpdateVersion {
                    e_tag: result.e_tag,
                    version: result.version,
                })
        })
    }

    /// Reads at most `limit` bytes of an object, with its version; `None`
    /// when it does not exist.
    fn get(&self, path: &Path, limit: u64) -> io::Result<Option<(Vec<u8>, UpdateVersion)>> {
        let key = self.key(path)?;
        let store = Arc::clone(&self.store);
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let result = self.request(path, async move {
            let result = match store.get(&key).await {
                Ok(result) => result,
                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                Err(error) => return Err(error),
            };
            let version = UpdateVersion {
                e_tag: result.meta.e_tag.clone(),
                version: result.meta.version.clone(),
            };
            let capacity = usize::try_from(result.meta.size).unwrap_or(0).min(limit);
            let mut bytes = Vec::with_capacity(capacity);
            let mut stream = result.into_stream();
            while bytes.len() < limit {
                match stream.next().await {
                    Some(chunk) => bytes.extend_from_slice(&chunk?),
                    None => break,
                }
            }
            bytes.truncate(limit);
            Ok(Some((bytes, version)))
        })?;
        Ok(result)
    }

    /// Every key under `path`, as a directory.
    fn list_all(&self, path: &Path) -> io::Result<Vec<ObjectPath>> {
        let key = self.key(path)?;
        let store = Arc::clone(&self.store);
        self.request(path, async move {
            store
                .list(Some(&key))
                .map_ok(|meta| meta.location)
                .try_collect()
                .await
        })
    }

    fn delete_keys(&self, path: &Path, keys: Vec<ObjectPath>) -> io::Result<()> {
        let store = Arc::clone(&self.store);
        self.request(path, async move {
            for key in keys {
                match store.delete(&key).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(error) => return Err(error),
                }
            }
            Ok(())
        })
    }

    // ----- the pointer -----

    fn pointer_path(job_dir: &Path) -> PathBuf {
        job_dir.join(POINTER_FILE)
    }

    /// The job's pointer as stored now, with its version.
    fn read_pointer(&self, job_dir: &Path) -> io::Result<Option<(Pointer, UpdateVersion)>> {
        let path = Self::pointer_path(job_dir);
        let Some((bytes, version)) = self.get(&path, MAX_POINTER_BYTES)? else {
            return Ok(None);
        };
        let pointer = Pointer::decode(&bytes).map_err(|reason| {
            StoreError::CorruptMetadata {
                checkpoint: None,
                path: path.clone(),
                reason: format!("the pointer object does not read: {reason}"),
            }
            .into_io()
        })?;
        Ok(Some((pointer, version)))
    }

    /// Makes this store the owner of `job_dir`: writes the pointer with a
    /// higher epoch and this process as owner, conditionally on what it
    /// read, re-reading when another writer changed it in between.
    fn take_over(&self, job_dir: &Path) -> io::Result<()> {
        let path = Self::pointer_path(job_dir);
        for _ in 0..TAKEOVER_ATTEMPTS {
            let (current, mode) = match self.read_pointer(job_dir)? {
                Some((current, version)) => (current, PutMode::Update(version)),
                None => (Pointer::default(), PutMode::Create),
            };
            let next = current.taken_by(this_process());
            match self.put(&path, next.encode(), mode)? {
                Ok(version) => {
                    if !current.owner.is_empty() {
                        tracing::info!(
                            store = %job_dir.display(),
                            previous = %current.owner,
                            epoch = next.epoch,
                            "taking the checkpoint store over; its previous owner can no longer commit"
                        );
                    }
                    lock(&self.held).insert(
                        job_dir.to_path_buf(),
                        Held {
                            pointer: next,
                            version,
                        },
                    );
                    return Ok(());
                }
                Err(
                    object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. },
                ) => continue,
                Err(error) => return Err(classify(&path.display().to_string(), error)),
            }
        }
        Err(StoreError::ObjectStore {
            location: path.display().to_string(),
            problem: crate::storage::ObjectStoreProblem::Request,
            detail: format!(
                "the pointer changed under each of {TAKEOVER_ATTEMPTS} attempts to take the store over"
            ),
        }
        .into_io())
    }

    /// The error of a store that was taken over: who owns it now.
    fn fenced(&self, job_dir: &Path, what: &str) -> io::Error {
        let owner = match self.read_pointer(job_dir) {
            Ok(Some((pointer, _))) => {
                format!("{} (owner epoch {}); {what}", pointer.owner, pointer.epoch)
            }
            _ => format!("another writer; {what}"),
        };
        StoreError::StoreInUse {
            dir: job_dir.to_path_buf(),
            owner: Some(owner),
        }
        .into_io()
    }

    /// Writes `next` over the pointer this store holds for `job_dir`, if
    /// the stored one is still the one it wrote last.
    fn update_pointer(&self, job_dir: &Path, held: &mut Held, next: Pointer) -> io::Result<()> {
        let path = Self::pointer_path(job_dir);
        match self.put(&path, next.encode(), PutMode::Update(held.version.clone()))? {
            Ok(version) => {
                *held = Held {
                    pointer: next,
                    version,
                };
                Ok(())
            }
            Err(object_store::Error::Precondition { .. }) => {
                Err(self.fenced(job_dir, "this store was taken over"))
            }
            Err(error) => {
                // The write may have happened before the error (a lost
                // response): if the stored pointer is ours, it did.
                match self.read_pointer(job_dir) {
                    Ok(Some((stored, version))) if stored == next => {
                        *held = Held {
                            pointer: next,
                            version,
                        };
                        Ok(())
                    }
                    _ => Err(classify(&path.display().to_string(), error)),
                }
            }
        }
    }

    /// Fails unless the stored pointer is still the one this store wrote.
    fn check_owner(&self, job_dir: &Path, held: &Held) -> io::Result<()> {
        let path = Self::pointer_path(job_dir);
        let key = self.key(&path)?;
        let store = Arc::clone(&self.store);
        let meta = self.request(&path, async move { store.head(&key).await })?;
        if meta.e_tag.is_some() && meta.e_tag == held.version.e_tag {
            Ok(())
        } else {
            Err(self.fenced(job_dir, "this store was taken over"))
        }
    }

    /// Whether the entry `relative` of `job_dir` is committed: by the
    /// pointer this store holds, or (a read-only store) by the stored one.
    fn committed(&self, job_dir: &Path, relative: &str) -> io::Result<bool> {
        if let Some(held) = lock(&self.held).get(job_dir) {
            return Ok(held.pointer.entries.contains(relative));
        }
        Ok(self
            .read_pointer(job_dir)?
            .is_some_and(|(pointer, _)| pointer.entries.contains(relative)))
    }

    /// Before an entry's directory is deleted or moved: removes it from
    /// the pointer if it is committed, else checks that this store still
    /// owns the job, so a store that was taken over deletes nothing.
    fn release_entry(&self, dir: &Path) -> io::Result<()> {
        let Some((job_dir, relative)) = entry_of(dir) else {
            return Ok(());
        };
        let mut held_map = lock(&self.held);
        let Some(held) = held_map.get_mut(&job_dir) else {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "this store does not own the job's pointer",
            ));
        };
        if held.pointer.entries.contains(&relative) {
            let next = held.pointer.without_entry(&relative);
            self.update_pointer(&job_dir, held, next)
        } else {
            self.check_owner(&job_dir, held)
        }
    }

    /// The commit: the metadata object create-once, then the pointer.
    fn publish(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let (job_dir, relative) = entry_of(parent(path)).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "metadata outside an entry")
        })?;
        let mut held_map = lock(&self.held);
        let held = held_map.get_mut(&job_dir).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                "this store does not own the job's pointer",
            )
        })?;
        // A store that was taken over stops before it writes anything.
        self.check_owner(&job_dir, held)?;
        match self.put(path, bytes.to_vec(), PutMode::Create)? {
            Ok(_) => {}
            Err(object_store::Error::AlreadyExists { .. }) => {
                // Ours from an attempt whose answer was lost, or another
                // writer's.
                let stored = self.get(path, bytes.len() as u64 + 1)?;
                if stored.map(|(stored, _)| stored) != Some(bytes.to_vec()) {
                    return Err(
                        self.fenced(&job_dir, "another writer wrote this checkpoint's metadata")
                    );
                }
            }
            Err(error) => return Err(classify(&path.display().to_string(), error)),
        }
        let next = held.pointer.with_entry(&relative);
        self.update_pointer(&job_dir, held, next)
    }

    fn write_multipart(&self, path: &Path, pieces: &[&[u8]]) -> io::Result<()> {
        let key = self.key(path)?;
        let store = Arc::clone(&self.store);
        let owned: Vec<Vec<u8>> = pieces.iter().map(|piece| piece.to_vec()).collect();
        self.request(path, async move {
            let upload = store.put_multipart(&key).await?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, MULTIPART_CHUNK_BYTES);
            for piece in &owned {
                for chunk in piece.chunks(MULTIPART_CHUNK_BYTES) {
                    writer.wait_for_capacity(MULTIPART_IN_FLIGHT).await?;
                    writer.write(chunk);
                }
            }
            writer.finish().await.map(|_| ())
        })
    }
}

impl Io for ObjectIo {
    fn create_dir_all(&self, _path: &Path) -> io::Result<()> {
        Ok(())
    }

    fn write_file(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.write_file_pieces(path, &[bytes])
    }

    fn write_file_pieces(&self, path: &Path, pieces: &[&[u8]]) -> io::Result<()> {
        let total: usize = pieces.iter().map(|piece| piece.len()).sum();
        if total > SINGLE_PUT_MAX_BYTES {
            return self.write_multipart(path, pieces);
        }
        self.put(path, pieces.concat(), PutMode::Overwrite)?
            .map(|_| ())
            .map_err(|error| classify(&path.display().to_string(), error))
    }

    fn sync_file(&self, _path: &Path) -> io::Result<()> {
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.release_entry(from)?;
        let from_key = self.key(from)?;
        let to_key = self.key(to)?;
        let mut keys = self.list_all(from)?;
        let single = keys.is_empty();
        if single {
            keys.push(from_key.clone());
        }
        let store = Arc::clone(&self.store);
        let sources = keys.clone();
        self.request(from, async move {
            for key in &sources {
                let target = if single {
                    to_key.clone()
                } else {
                    let rest = key.prefix_match(&from_key).into_iter().flatten();
                    rest.fold(to_key.clone(), |target, part| target.child(part))
                };
                store.copy(key, &target).await?;
            }
            Ok(())
        })?;
        self.delete_keys(from, keys)
    }

    fn sync_dir(&self, _path: &Path) -> io::Result<()> {
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        if path.file_name().is_some_and(|name| name == METADATA_FILE) {
            self.release_entry(parent(path))?;
        }
        let key = self.key(path)?;
        self.delete_keys(path, vec![key])
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.release_entry(path)?;
        let keys = self.list_all(path)?;
        self.delete_keys(path, keys)
    }

    fn read_file(&self, path: &Path, limit_bytes: u64) -> io::Result<Vec<u8>> {
        if path.file_name().is_some_and(|name| name == METADATA_FILE) {
            let entry = entry_of(parent(path));
            let committed = match &entry {
                Some((job_dir, relative)) => self.committed(job_dir, relative)?,
                None => true,
            };
            if !committed {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "the pointer does not name this checkpoint: it never committed",
                ));
            }
        }
        match self.get(path, limit_bytes)? {
            Some((bytes, _)) => Ok(bytes),
            None => Err(io::Error::new(io::ErrorKind::NotFound, "no such object")),
        }
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        let key = self.key(path)?;
        let store = Arc::clone(&self.store);
        let listing = self.request(
            path,
            async move { store.list_with_delimiter(Some(&key)).await },
        )?;
        let mut entries: Vec<DirEntry> = listing
            .common_prefixes
            .iter()
            .filter_map(|prefix| prefix.parts().last())
            .filter_map(|name| decode_part(name.as_ref()))
            .map(|name| DirEntry { name, is_dir: true })
            .chain(listing.objects.iter().filter_map(|meta| {
                let name = decode_part(meta.location.filename()?)?;
                Some(DirEntry {
                    name,
                    is_dir: false,
                })
            }))
            .collect();
        entries.sort();
        Ok(entries)
    }

    fn try_lock_owner(&self, path: &Path) -> io::Result<LockAttempt> {
        self.take_over(parent(path))?;
        Ok(LockAttempt::Acquired(OwnerLock::in_process(path)))
    }

    fn dir_exists(&self, path: &Path) -> io::Result<bool> {
        self.list_dir(path).map(|entries| !entries.is_empty())
    }

    fn atomic_writes(&self) -> bool {
        true
    }

    fn publish_metadata(&self, path: &Path, bytes: &[u8]) -> Option<io::Result<()>> {
        Some(self.publish(path, bytes))
    }
}

impl ObjectIo {
    /// Reads the job's pointer once, so that a missing bucket, refused
    /// credentials or an unreachable endpoint show at open.
    pub(crate) fn probe(&self, job_dir: &Path) -> io::Result<()> {
        self.read_pointer(job_dir).map(|_| ())
    }
}

/// The job directory and the relative name (`checkpoints/chk-…`) of an
/// entry's directory, or `None` when `dir` is not in a job's
/// `checkpoints/` or `savepoints/`.
fn entry_of(dir: &Path) -> Option<(PathBuf, String)> {
    let name = dir.file_name()?.to_str()?;
    let kind_dir = dir.parent()?;
    let kind = kind_dir.file_name()?.to_str()?;
    if kind != "checkpoints" && kind != "savepoints" {
        return None;
    }
    let job_dir = kind_dir.parent()?;
    Some((job_dir.to_path_buf(), format!("{kind}/{name}")))
}

/// A key's part as the engine named it: `object_store` percent-encodes
/// some characters of a part (`%` among them, which the engine's own
/// escaping uses), and listings return them encoded. `None` for a part
/// that does not decode to UTF-8 (not written by a store).
fn decode_part(raw: &str) -> Option<String> {
    let bytes = raw.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escape = (bytes[index] == b'%')
            .then(|| raw.get(index + 1..index + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escape {
            Some(byte) => {
                decoded.push(byte);
                index += 3;
            }
            None => {
                decoded.push(bytes[index]);
                index += 1;
            }
        }
    }
    String::from_utf8(decoded).ok()
}

fn parent(path: &Path) -> &Path {
    path.parent().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::decode_part;
    use object_store::path::PathPart;

    /// A part the engine escaped survives `object_store`'s own encoding
    /// and a listing.
    #[test]
    fn parts_decode_to_the_engine_names() {
        for name in [
            "op-%43ount",
            "chk-00000000000000000001",
            "0-1.shared",
            "a%2Fb",
        ] {
            let encoded = PathPart::from(name);
            assert_eq!(decode_part(encoded.as_ref()).as_deref(), Some(name));
        }
        assert_eq!(decode_part("%zz").as_deref(), Some("%zz"));
    }
}
