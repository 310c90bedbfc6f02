//! An in-memory file system that can "lose power", and the
//! [`MemoryCheckpointStore`] built on it.
//!
//! [`MemFs`] implements [`Io`] and remembers, next to what a reader sees,
//! what would survive a power loss: a file's data becomes durable on
//! `sync_file`, a directory's entries on `sync_dir`. [`MemFs::crash`] then
//! throws away what was not made durable. The store code is the same that
//! runs on a real disk, so tests of the write order run here fast.
//! This module never knows what a checkpoint is.
//!
//! # What the crash model covers
//!
//! - File data that was not fsynced reverts to the last fsynced version, or
//!   (in [`CrashMode::Random`]) survives in full, or survives torn: cut at a
//!   random length.
//! - Directory changes (create, remove, rename) that were not fsynced are
//!   lost; in [`CrashMode::Random`] each directory keeps a random prefix of
//!   its unsynced changes, in order. A rename inside one directory is one
//!   atomic change, as on journaling file systems.
//! - Directories are independent: one may keep more of its changes than
//!   another.
//!
//! It does not model: reordering of changes inside one directory, bit rot
//! (tests flip bytes themselves), `fsync` reporting success without
//! persisting, or errors from `fsync` that drop dirty pages. Unsynced
//! changes are kept in memory until the next `sync_dir`, without a bound:
//! this file system is for tests.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Component, Path};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::engine::{delegate_store, Engine};
use super::io::{DirEntry, Io};
use super::owner::{LockAttempt, OwnerLock};
use super::{StoreError, StoreOptions};

/// What a simulated crash keeps of the changes that were not fsynced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Everything stays: a process crash, the operating system survives.
    KeepAll,
    /// Nothing unsynced stays: the harshest power loss.
    LoseUnsynced,
    /// Each file and directory keeps a random part of its unsynced changes
    /// (see the module documentation), decided by the seed.
    Random {
        /// The seed; the same seed on the same history gives the same result.
        seed: u64,
    },
}

type Inode = u64;
const ROOT: Inode = 0;

/// One unsynced change to a directory.
#[derive(Debug, Clone)]
enum DirChange {
    Insert(String, Inode),
    Remove(String),
    Rename(String, String),
}

#[derive(Debug, Default)]
struct DirNode {
    /// What a reader sees now.
    current: BTreeMap<String, Inode>,
    /// What survives a power loss.
    durable: BTreeMap<String, Inode>,
    /// The changes from `durable` to `current`, in order.
    unsynced: Vec<DirChange>,
}

impl DirNode {
    fn change(&mut self, change: DirChange) {
        apply(&mut self.current, &change);
        self.unsynced.push(change);
    }
}

fn apply(entries: &mut BTreeMap<String, Inode>, change: &DirChange) {
    match change {
        DirChange::Insert(name, inode) => {
            entries.insert(name.clone(), *inode);
        }
        DirChange::Remove(name) => {
            entries.remove(name);
        }
        DirChange::Rename(from, to) => {
            if let Some(inode) = entries.remove(from) {
                entries.insert(to.clone(), inode);
            }
        }
    }
}

#[derive(Debug, Default)]
struct FileNode {
    current: Arc<Vec<u8>>,
    durable: Arc<Vec<u8>>,
}

#[derive(Debug)]
enum Node {
    Dir(DirNode),
    File(FileNode),
}

#[derive(Debug)]
struct FsState {
    nodes: HashMap<Inode, Node>,
    next_inode: Inode,
}

/// An in-memory file system with a durable and a current view; see the
/// module documentation. Paths must be absolute and use only normal
/// components.
#[derive(Debug)]
pub struct MemFs {
    state: Mutex<FsState>,
}

impl Default for MemFs {
    fn default() -> Self {
        Self::new()
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} not found", path.display()),
    )
}

fn invalid(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{}: {what}", path.display()),
    )
}

/// The normal components of an absolute path.
fn components(path: &Path) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for component in path.components() {
        match component {
            Component::RootDir => {}
            Component::Normal(name) => names.push(
                name.to_str()
                    .ok_or_else(|| invalid(path, "not UTF-8"))?
                    .to_string(),
            ),
            _ => return Err(invalid(path, "only absolute paths with normal components")),
        }
    }
    if path.has_root() {
        Ok(names)
    } else {
        Err(invalid(path, "not absolute"))
    }
}

impl FsState {
    fn dir(&self, inode: Inode) -> Option<&DirNode> {
        match self.nodes.get(&inode) {
            Some(Node::Dir(dir)) => Some(dir),
            _ => None,
        }
    }

    fn dir_mut(&mut self, inode: Inode) -> Option<&mut DirNode> {
        match self.nodes.get_mut(&inode) {
            Some(Node::Dir(dir)) => Some(dir),
            _ => None,
        }
    }

    fn resolve(&self, path: &Path) -> io::Result<Inode> {
        let mut inode = ROOT;
        for name in components(path)? {
            inode = *self
                .dir(inode)
                .and_then(|dir| dir.current.get(&name))
                .ok_or_else(|| not_found(path))?;
        }
        Ok(inode)
    }

    /// The directory holding `path` and `path`'s last component.
    fn parent_of(&self, path: &Path) -> io::Result<(Inode, String)> {
        let mut names = components(path)?;
        let name = names
            .pop()
            .ok_or_else(|| invalid(path, "the root has no parent"))?;
        let mut inode = ROOT;
        for component in names {
            inode = *self
                .dir(inode)
                .and_then(|dir| dir.current.get(&component))
                .ok_or_else(|| not_found(path))?;
        }
        if self.dir(inode).is_none() {
            return Err(invalid(path, "the parent is not a directory"));
        }
        Ok((inode, name))
    }

    fn add_node(&mut self, node: Node) -> Inode {
        let inode = self.next_inode;
        self.next_inode += 1;
        self.nodes.insert(inode, node);
        inode
    }

    fn remove_tree(&mut self, dir_inode: Inode) {
        let children: Vec<(String, Inode)> = self
            .dir(dir_inode)
            .map(|dir| {
                dir.current
                    .iter()
                    .map(|(name, inode)| (name.clone(), *inode))
                    .collect()
            })
            .unwrap_or_default();
        for (name, child) in children {
            if self.dir(child).is_some() {
                self.remove_tree(child);
            }
            if let Some(dir) = self.dir_mut(dir_inode) {
                dir.change(DirChange::Remove(name));
            }
        }
    }

    fn crash(&mut self, mode: CrashMode) {
        let mut random = SplitMix64(match mode {
            CrashMode::Random { seed } => seed,
            _ => 0,
        });
        let mut inodes: Vec<Inode> = self.nodes.keys().copied().collect();
        // Sorted so that the same seed gives the same result.
        inodes.sort_unstable();
        for inode in inodes {
            match self.nodes.get_mut(&inode) {
                Some(Node::Dir(dir)) => crash_dir(dir, mode, &mut random),
                Some(Node::File(file)) => crash_file(file, mode, &mut random),
                None => {}
            }
        }
        self.collect_garbage();
    }

    /// Drops nodes no directory refers to any more.
    fn collect_garbage(&mut self) {
        let mut reachable = std::collections::HashSet::new();
        let mut stack = vec![ROOT];
        while let Some(inode) = stack.pop() {
            if reachable.insert(inode) {
                if let Some(dir) = self.dir(inode) {
                    stack.extend(dir.current.values().copied());
                }
            }
        }
        self.nodes.retain(|inode, _| reachable.contains(inode));
    }
}

fn crash_dir(dir: &mut DirNode, mode: CrashMode, random: &mut SplitMix64) {
    let kept = match mode {
        CrashMode::KeepAll => dir.unsynced.len(),
        CrashMode::LoseUnsynced => 0,
        CrashMode::Random { .. } => random.below(dir.unsynced.len() + 1),
    };
    let mut entries = dir.durable.clone();
    for change in &dir.unsynced[..kept] {
        apply(&mut entries, change);
    }
    dir.current = entries.clone();
    dir.durable = entries;
    dir.unsynced.clear();
}

fn crash_file(file: &mut FileNode, mode: CrashMode, random: &mut SplitMix64) {
    if Arc::ptr_eq(&file.current, &file.durable) {
        return;
    }
    let survivor = match mode {
        CrashMode::KeepAll => Arc::clone(&file.current),
        CrashMode::LoseUnsynced => Arc::clone(&file.durable),
        CrashMode::Random { .. } => match random.below(3) {
            0 => Arc::clone(&file.durable),
            1 => Arc::clone(&file.current),
            _ => {
                let cut = random.below(file.current.len() + 1);
                Arc::new(file.current[..cut].to_vec())
            }
        },
    };
    file.current = Arc::clone(&survivor);
    file.durable = survivor;
}

/// A tiny deterministic generator (SplitMix64), so the library needs no
/// random-number crate for its test file system.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut mixed = self.0;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        mixed ^ (mixed >> 31)
    }

    /// A number in `0..bound` (`bound` > 0).
    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }
}

impl MemFs {
    /// An empty file system holding only the root directory `/`.
    pub fn new() -> Self {
        let mut nodes = HashMap::new();
        nodes.insert(ROOT, Node::Dir(DirNode::default()));
        Self {
            state: Mutex::new(FsState {
                nodes,
                next_inode: ROOT + 1,
            }),
        }
    }

    /// Simulates a crash: what was not made durable is treated as `mode`
    /// says, and afterwards the current view equals the durable one.
    pub fn crash(&self, mode: CrashMode) {
        self.lock().crash(mode);
    }

    /// Replaces the bytes of an existing file, durably, as damage on disk
    /// would. For corruption tests.
    pub fn overwrite(&self, path: &Path, bytes: Vec<u8>) -> io::Result<()> {
        let mut state = self.lock();
        let inode = state.resolve(path)?;
        match state.nodes.get_mut(&inode) {
            Some(Node::File(file)) => {
                let bytes = Arc::new(bytes);
                file.current = Arc::clone(&bytes);
                file.durable = bytes;
                Ok(())
            }
            _ => Err(invalid(path, "not a file")),
        }
    }

    fn lock(&self) -> MutexGuard<'_, FsState> {
        // Every operation changes the state in steps that each leave it
        // consistent, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Io for MemFs {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        let mut inode = ROOT;
        for name in components(path)? {
            let dir = state
                .dir(inode)
                .ok_or_else(|| invalid(path, "a parent is a file"))?;
            inode = match dir.current.get(&name) {
                Some(child) => *child,
                None => {
                    let child = state.add_node(Node::Dir(DirNode::default()));
                    if let Some(dir) = state.dir_mut(inode) {
                        dir.change(DirChange::Insert(name, child));
                    }
                    child
                }
            };
        }
        match state.dir(inode) {
            Some(_) => Ok(()),
            None => Err(invalid(path, "exists and is a file")),
        }
    }

    fn write_file(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut state = self.lock();
        let (parent, name) = state.parent_of(path)?;
        let existing = state
            .dir(parent)
            .and_then(|dir| dir.current.get(&name))
            .copied();
        match existing.map(|inode| (inode, state.nodes.get_mut(&inode))) {
            Some((_, Some(Node::File(file)))) => {
                file.current = Arc::new(bytes.to_vec());
                Ok(())
            }
            Some(_) => Err(invalid(path, "is a directory")),
            None => {
                let file = FileNode {
                    current: Arc::new(bytes.to_vec()),
                    durable: Arc::new(Vec::new()),
                };
                let inode = state.add_node(Node::File(file));
                if let Some(dir) = state.dir_mut(parent) {
                    dir.change(DirChange::Insert(name, inode));
                }
                Ok(())
            }
        }
    }

    fn sync_file(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        let inode = state.resolve(path)?;
        match state.nodes.get_mut(&inode) {
            Some(Node::File(file)) => {
                file.durable = Arc::clone(&file.current);
                Ok(())
            }
            _ => Err(invalid(path, "not a file")),
        }
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.lock();
        let (from_parent, from_name) = state.parent_of(from)?;
        let (to_parent, to_name) = state.parent_of(to)?;
        let inode = *state
            .dir(from_parent)
            .and_then(|dir| dir.current.get(&from_name))
            .ok_or_else(|| not_found(from))?;
        let target = state
            .dir(to_parent)
            .and_then(|dir| dir.current.get(&to_name))
            .copied();
        // A directory moves only to a free name (the store sets damaged
        // checkpoints aside this way); replacing a directory is not needed.
        if state.dir(inode).is_some() && target.is_some() {
            return Err(invalid(to, "renaming a directory onto an existing name"));
        }
        if target.is_some_and(|target| state.dir(target).is_some()) {
            return Err(invalid(to, "is a directory"));
        }
        if from_parent == to_parent {
            if let Some(dir) = state.dir_mut(from_parent) {
                dir.change(DirChange::Rename(from_name, to_name));
            }
        } else {
            if let Some(dir) = state.dir_mut(from_parent) {
                dir.change(DirChange::Remove(from_name));
            }
            if let Some(dir) = state.dir_mut(to_parent) {
                dir.change(DirChange::Insert(to_name, inode));
            }
        }
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        let inode = state.resolve(path)?;
        let dir = state
            .dir_mut(inode)
            .ok_or_else(|| invalid(path, "not a directory"))?;
        dir.durable = dir.current.clone();
        dir.unsynced.clear();
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        let (parent, name) = state.parent_of(path)?;
        let inode = *state
            .dir(parent)
            .and_then(|dir| dir.current.get(&name))
            .ok_or_else(|| not_found(path))?;
        if state.dir(inode).is_some() {
            return Err(invalid(path, "is a directory"));
        }
        if let Some(dir) = state.dir_mut(parent) {
            dir.change(DirChange::Remove(name));
        }
        Ok(())
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        let (parent, name) = state.parent_of(path)?;
        let inode = *state
            .dir(parent)
            .and_then(|dir| dir.current.get(&name))
            .ok_or_else(|| not_found(path))?;
        if state.dir(inode).is_none() {
            return Err(invalid(path, "not a directory"));
        }
        // Children first, then the directory itself, as `std` does.
        state.remove_tree(inode);
        if let Some(dir) = state.dir_mut(parent) {
            dir.change(DirChange::Remove(name));
        }
        Ok(())
    }

    fn read_file(&self, path: &Path, limit_bytes: u64) -> io::Result<Vec<u8>> {
        let state = self.lock();
        let inode = state.resolve(path)?;
        match state.nodes.get(&inode) {
            Some(Node::File(file)) => {
                let len = usize::try_from(limit_bytes)
                    .unwrap_or(usize::MAX)
                    .min(file.current.len());
                Ok(file.current[..len].to_vec())
            }
            _ => Err(invalid(path, "not a file")),
        }
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        let state = self.lock();
        let inode = state.resolve(path)?;
        let dir = state
            .dir(inode)
            .ok_or_else(|| invalid(path, "not a directory"))?;
        Ok(dir
            .current
            .iter()
            .map(|(name, child)| DirEntry {
                name: name.clone(),
                is_dir: state.dir(*child).is_some(),
            })
            .collect())
    }

    /// No other process can reach a `MemFs`, so its owner lock exists only
    /// in this process; two stores on one `MemFs` (a test that reopens a
    /// store after a simulated crash) are not refused.
    fn try_lock_owner(&self, path: &Path) -> io::Result<LockAttempt> {
        Ok(LockAttempt::Acquired(OwnerLock::in_process(path)))
    }
}

/// A [`CheckpointStore`](super::CheckpointStore) on a [`MemFs`], for tests.
/// It runs exactly the code of [`FsCheckpointStore`](super::FsCheckpointStore)
/// and keeps its job under `/` of its file system.
#[derive(Debug)]
pub struct MemoryCheckpointStore {
    engine: Engine,
    fs: Arc<MemFs>,
}

impl MemoryCheckpointStore {
    /// A memory store has no directory a person could open.
    fn directory(&self) -> Option<&std::path::Path> {
        None
    }

    /// A store for `job` on a new, empty [`MemFs`], with default options.
    pub fn new(job: &str) -> Result<Self, StoreError> {
        Self::on_fs(Arc::new(MemFs::new()), job, StoreOptions::default())
    }

    /// A store for `job` on an existing file system, for example to reopen
    /// it after [`MemFs::crash`].
    pub fn on_fs(fs: Arc<MemFs>, job: &str, options: StoreOptions) -> Result<Self, StoreError> {
        let io: Arc<dyn Io> = fs.clone();
        Ok(Self {
            engine: Engine::open(io, Path::new("/"), job, options)?,
            fs,
        })
    }

    /// The file system this store writes to.
    pub fn fs(&self) -> &Arc<MemFs> {
        &self.fs
    }
}

delegate_store!(MemoryCheckpointStore);
