//! [`SpillingState`]: per-key state with a bounded set of keys in memory
//! and the rest in a [`DiskTable`].
//!
//! This module owns the movement of entries between memory and disk (load
//! on a miss, eviction over the budget (which entries go is `evict.rs`'s
//! choice), deletion), what a snapshot takes
//! on the operator's thread, and restoring parts into a fresh disk table.
//! It never decides when to snapshot and never builds a part itself
//! ([`super::snapshot`] does).
//!
//! # The rule (why a snapshot is right)
//!
//! The logical state is the in-memory ("hot") table over the disk table:
//! a key in memory has its current value there, a key only on disk has it
//! on disk. An entry loaded from disk stays on disk too (possibly stale)
//! until an eviction writes it again. A deletion deletes the key in memory
//! *and* on disk at once (a tombstone in the disk table and in the change
//! log), so no older value of it survives anywhere a snapshot reads. A
//! snapshot of some key groups takes, in one go on the operator's thread,
//! the disk table's state (its change log since the last snapshot and a
//! constant-time MVCC view) and the hot table's picked groups (frozen
//! slices, held weakly, constant time per slice); the writer builds each
//! part as the disk's entries of the group overlaid by the hot ones (a
//! hot entry wins: it is the newer). So the disk table, and every base
//! built from it, describes the disk table only, never the hot entries:
//! the next snapshot's merge stays "previous base + what was written to
//! disk since", and the hot entries are laid over it again. Dirty key
//! groups are the hot table's own flags: every access through it marks its
//! group, loading and evicting do not change the logical state, and a
//! deletion goes through the hot table.
//!
//! # The memory bound while a snapshot is alive
//!
//! The hot table is a [`CowKeyedState`]: a slice the operator writes (or
//! evicts from, or loads into) while a snapshot still holds it is first
//! encoded once, keeping only the entries the snapshot takes of it
//! (`hot::encode_frozen_slice`), and copied only if the writer is reading
//! it at that moment, so the extra memory is at most one encoding or copy
//! of the slices changed meanwhile (at most the memory budget), never
//! more; the writer drops each group's slices as soon as it has built
//! that group's part.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::base::Bases;
use super::changes::ChangeLog;
use super::disk::DiskTable;
use super::evict::{stamp, Clocked, Evictor, Policy};
use super::filter::SpilledKeys;
use super::hot::{encode_frozen_slice, encode_key, Encoded, Frozen, HotEntries, HotGroups};
use super::restore::RestoredEntries;
use super::sizing::StoreSizing;
use super::snapshot::{SpillSnapshot, Taken};
use super::SpillError;
use crate::keyed::backend::{parts_covering, KeyGroupPart};
use crate::keyed::cow::EncodeScope;
use crate::keyed::cow_state::CowKeyedState;
use crate::keyed::key_group::{KeyGroupRange, MaxParallelism};
use crate::keyed::part;
use crate::keyed::store::KeyGroupSnapshots;
use crate::keyed::{key_hash, KeyedError, StateKey};
use crate::state::Snapshot;

/// The per-key state of one subtask of a keyed operator, with at most
/// `memory_entries` keys in memory (checked after each batch) and the rest
/// on local disk.
#[derive(Debug)]
pub struct SpillingState<K, S> {
    /// The hot table: each state with its reference bit (`evict.rs`).
    hot: CowKeyedState<K, Clocked<S>>,
    memory_entries: usize,
    dir: PathBuf,
    /// Opened at the first eviction or restore: state that fits in memory
    /// never touches the disk.
    disk: Option<DiskTable>,
    /// Reused for the on-disk form of one key (key group, then postcard).
    key_scratch: Vec<u8>,
    /// How many entries were written to disk by eviction.
    evicted: u64,
    /// How many entries were read back from disk into memory.
    loaded: u64,
    /// Which entries eviction takes, and where it starts next.
    evictor: Evictor,
    /// The store's memory settings, from `memory_entries`.
    sizing: StoreSizing,
    /// Every key on disk (by hash): a key it has never seen is not looked
    /// up there.
    spilled: SpilledKeys,
    /// Every entry written to or deleted from disk since the last
    /// snapshot, so that the next one merges them into the last one's
    /// base.
    changes: ChangeLog,
    /// The bases of this state's snapshots.
    bases: Arc<Bases>,
    /// How many snapshots were taken.
    epoch: u64,
    /// Per key group of the range, whether a key of it was deleted since
    /// the last snapshot: a delta part cannot say so, so such a group is
    /// written whole.
    deleted: Vec<bool>,
}

impl<K, S> Drop for SpillingState<K, S> {
    /// The disk table drops on a thread of its own (`reaper.rs` says why);
    /// the job waits for it before it ends.
    fn drop(&mut self) {
        if let Some(disk) = self.disk.take() {
            super::reaper::drop_later(disk);
        }
    }
}

impl<K: StateKey, S: Snapshot + Default> SpillingState<K, S> {
    /// Empty state owning `range`, keeping at most `memory_entries` keys in
    /// memory and the others in a table under `dir` (created when first
    /// needed, deleted when this state is dropped).
    pub fn new(
        max_parallelism: MaxParallelism,
        range: KeyGroupRange,
        dir: PathBuf,
        memory_entries: usize,
    ) -> Result<Self, SpillError> {
        let sizing = StoreSizing::for_budget(memory_entries);
        Ok(SpillingState {
            hot: CowKeyedState::new(max_parallelism, range)?,
            memory_entries: memory_entries.max(1),
            bases: Bases::new(bases_dir(&dir)),
            dir,
            disk: None,
            key_scratch: Vec::new(),
            evicted: 0,
            loaded: 0,
            evictor: Evictor::new(Policy::from_env()),
            changes: ChangeLog::new(sizing.change_log_entries, sizing.change_log_bytes),
            sizing,
            spilled: SpilledKeys::default(),
            epoch: 0,
            deleted: vec![false; range.len()],
        })
    }

    /// This state with a change log of at most `entries` entries and
    /// `bytes` bytes instead of the budget's (for tests of its bound).
    #[cfg(test)]
    pub(crate) fn with_change_log_bound(mut self, entries: usize, bytes: usize) -> Self {
        self.changes = ChangeLog::new(entries, bytes);
        self
    }

    /// This state with eviction choosing by `policy` (for tests comparing
    /// the choices).
    #[cfg(test)]
    pub(crate) fn with_policy(mut self, policy: Policy) -> Self {
        self.evictor = Evictor::new(policy);
        self
    }

    /// How many times the change log was compacted (for tests).
    #[cfg(test)]
    pub(crate) fn change_log_compactions(&self) -> u64 {
        self.changes.compactions()
    }

    /// The key groups owned.
    pub fn range(&self) -> KeyGroupRange {
        self.hot.range()
    }

    /// How many keys are in memory now.
    pub fn len_in_memory(&self) -> usize {
        self.hot.len()
    }

    /// Whether `key` is in memory now (for tests: nothing is loaded).
    #[cfg(test)]
    pub(crate) fn in_memory(&self, key: &K) -> bool {
        self.hot.contains_hashed(key, key_hash(key))
    }

    /// How many entries eviction has written to disk so far.
    pub fn evicted_entries(&self) -> u64 {
        self.evicted
    }

    /// How many entries were read back from disk so far (lookups of keys
    /// that were only on disk): each was a disk read on the operator's
    /// thread. [`super::disk_loads_total`] sums them over the process.
    pub fn loaded_entries(&self) -> u64 {
        self.loaded
    }

    /// How many of the hot table's slices were copied so far because a
    /// snapshot was reading them when this state wrote, loaded into or
    /// evicted from them (rare: a frozen slice is encoded instead, see
    /// [`Self::encoded_slices`]).
    pub fn copied_slices(&self) -> u64 {
        self.hot.copied_key_groups()
    }

    /// How many of the hot table's frozen slices this state encoded so far
    /// for a snapshot that had not read them yet, at its first write, load
    /// or eviction into them (the entries that snapshot takes of the
    /// slice: `hot::encode_frozen_slice`): with the copies, the extra
    /// memory of asynchronous snapshots.
    pub fn encoded_slices(&self) -> u64 {
        self.hot.encoded_at_write()
    }

    /// Fails for a key this subtask does not own.
    fn check_owned(&self, key: &K) -> Result<(), SpillError> {
        if self.hot.owns(key) {
            return Ok(());
        }
        Err(SpillError::Keyed(KeyedError::ForeignKey {
            key_group: self.hot.key_group_of(key),
            range: self.hot.range(),
        }))
    }

    /// The state of `key`, read from disk when it is not in memory and
    /// created with `S::default()` when it is nowhere. Fails for a key this
    /// subtask does not own or when the disk cannot be read. Call
    /// [`Self::enforce_budget`] after a batch of these.
    pub fn get_or_default(&mut self, key: &K) -> Result<&mut S, SpillError> {
        self.check_owned(key)?;
        self.get_or_default_routed(key, key_hash(key))
    }

    /// [`Self::get_or_default`] for a key routed here by its key group,
    /// with its [`key_hash`] `hash` (the keyed operator's path).
    #[inline]
    pub(crate) fn get_or_default_routed(
        &mut self,
        key: &K,
        hash: u64,
    ) -> Result<&mut S, SpillError> {
        let hit = self.hot.contains_hashed(key, hash);
        if !hit {
            self.load(key, hash)?;
        }
        let pending = self.pending_stamp();
        let entry = self.hot.get_or_default_routed(key, hash);
        // Found in memory: used again, so it gets a second chance
        // (`evict.rs`); a key loaded or created here enters unreferenced
        // (it was just inserted with the bit clear, so this store keeps
        // it so). The stamp marks the entry as written for the next
        // snapshot's delta parts. Both are stores into the entry this
        // lookup writes anyway.
        entry.referenced = hit;
        entry.written_for = pending;
        Ok(&mut entry.state)
    }

    /// The write stamp of the next snapshot: the one that holds what is
    /// written now.
    #[inline]
    fn pending_stamp(&self) -> u32 {
        stamp(self.epoch + 1)
    }

    /// How many snapshots of this state were taken (any kind): an
    /// incremental checkpoint's delta parts hold the changes since the
    /// last one, so its planner checks that it planned that one.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Deletes the state of `key`, in memory and on disk, and returns it
    /// (read from disk if it was only there). Fails for a key this subtask
    /// does not own or when the disk cannot be read or written. The disk
    /// table gets a tombstone at once, and the change log records it, so
    /// neither the disk table nor a base built from it can bring the key
    /// back (see the module's rule).
    pub fn remove(&mut self, key: &K) -> Result<Option<S>, SpillError> {
        self.check_owned(key)?;
        let hash = key_hash(key);
        if !self.hot.contains_hashed(key, hash) {
            // Through the hot table, so that its group is marked dirty.
            self.load(key, hash)?;
        }
        let removed = self.hot.remove(key).map(|entry| entry.state);
        if removed.is_some() {
            let index = (self.hot.key_group_of(key) - self.hot.range().start) as usize;
            if let Some(deleted) = self.deleted.get_mut(index) {
                *deleted = true;
            }
        }
        if removed.is_some() && self.spilled.may_contain(hash) {
            if let Some(disk) = &self.disk {
                self.key_scratch.clear();
                encode_key(self.hot.key_group_of(key), key, &mut self.key_scratch)?;
                disk.remove(&self.key_scratch)?;
                self.changes.record_deletion(&self.key_scratch);
            }
        }
        Ok(removed)
    }

    /// Brings `key` (with hash `hash`) from disk into memory, if it is
    /// there; a key the filter of spilled keys has never seen is not
    /// looked up.
    #[cold]
    fn load(&mut self, key: &K, hash: u64) -> Result<(), SpillError> {
        let Some(disk) = &self.disk else {
            return Ok(());
        };
        if !self.spilled.may_contain(hash) {
            return Ok(());
        }
        self.key_scratch.clear();
        encode_key(self.hot.key_group_of(key), key, &mut self.key_scratch)?;
        let Some(payload) = disk.get(&self.key_scratch)? else {
            return Ok(());
        };
        let state = S::decode_payload(&payload)?;
        self.hot.insert(key.clone(), Clocked::entering(state))?;
        self.loaded += 1;
        super::count_disk_load();
        Ok(())
    }

    /// Moves keys to disk while more than the budget are in memory: down to
    /// three quarters of it or by one eviction batch, whichever is less
    /// (a batch fills at most about one of the store's memtables), so that
    /// eviction runs in batches rather than for every new key. Which keys
    /// go is a second-chance (CLOCK) choice (`evict.rs`): keys found in
    /// memory since the hand last passed stay, with a bound on the bits
    /// cleared per call. Evicting changes no logical state, so no key
    /// group is marked dirty, and `store` records a key not written since
    /// the last snapshot as unchanged. A slice a live snapshot still holds
    /// is encoded for it (or copied) before entries leave it or the hand
    /// clears a bit in it.
    pub fn enforce_budget(&mut self) -> Result<(), SpillError> {
        if self.hot.len() <= self.memory_entries {
            return Ok(());
        }
        let batch = (self.memory_entries / 4).min(self.sizing.eviction_batch_entries);
        let keep = self.memory_entries - batch;
        let count = self.hot.len() - keep;
        let entries = self.evictor.take(&mut self.hot, count);
        self.evicted += entries.len() as u64;
        let pending = self.pending_stamp();
        let encoded = self.encode_entries(
            entries
                .iter()
                .map(|(key, entry)| marked(key, entry, pending)),
        )?;
        self.store(encoded)
    }

    /// Writes `entries` to disk and records their keys in the filter of
    /// spilled keys and in the change log (every write to disk goes
    /// through here, so neither misses a key on disk).
    fn store(&mut self, entries: Vec<EncodedEntry>) -> Result<(), SpillError> {
        // Opened first, then borrowed beside the filter.
        self.disk()?;
        let (spilled, changes) = (&mut self.spilled, &mut self.changes);
        let entries = entries.into_iter().map(|(entry, hash, written)| {
            spilled.insert(hash);
            // A key not written since the last snapshot holds the value it
            // had then: a delta part leaves it out.
            if written {
                changes.record(&entry.0, &entry.1);
            } else {
                changes.record_unchanged(&entry.0, &entry.1);
            }
            entry
        });
        match &self.disk {
            Some(disk) => disk.put_all(entries),
            None => Err(SpillError::Internal("the disk table did not open".into())),
        }
    }

    /// The disk table, opened now if it was not.
    fn disk(&mut self) -> Result<&DiskTable, SpillError> {
        if self.disk.is_none() {
            self.disk = Some(DiskTable::open(&self.dir, &self.sizing)?);
        }
        self.disk
            .as_ref()
            .ok_or_else(|| SpillError::Internal("the disk table did not open".into()))
    }

    /// The on-disk form of each `(key, state, written since the last
    /// snapshot)`, with its key's [`key_hash`].
    fn encode_entries<'a>(
        &self,
        entries: impl Iterator<Item = (&'a K, &'a S, bool)>,
    ) -> Result<Vec<EncodedEntry>, SpillError>
    where
        K: 'a,
        S: 'a,
    {
        entries
            .map(|(key, state, written)| {
                let mut key_bytes = Vec::new();
                encode_key(self.hot.key_group_of(key), key, &mut key_bytes)?;
                let mut payload = Vec::new();
                state.encode_payload(&mut payload)?;
                Ok(((key_bytes, payload), key_hash(key), written))
            })
            .collect()
    }

    /// Writes every in-memory entry to disk, so that the disk table holds
    /// the whole state (for [`Self::for_each`] only: snapshots overlay the
    /// hot entries instead).
    fn write_back_all(&mut self) -> Result<(), SpillError> {
        let pending = self.pending_stamp();
        let encoded = self.encode_entries(
            self.hot
                .iter()
                .map(|(key, entry)| marked(key, entry, pending)),
        )?;
        self.store(encoded)
    }

    /// Which of the range's key groups `include` picks, for a new
    /// snapshot.
    fn pick(&mut self, include: &mut dyn FnMut(u32) -> bool) -> Vec<bool> {
        self.hot.range().iter().map(include).collect()
    }

    /// The snapshot of the `picked` groups whose hot entries `hot` holds:
    /// takes the change log and a view of the disk table (constant time
    /// each, on this thread).
    fn take(
        &mut self,
        picked: Vec<bool>,
        deltas: Vec<bool>,
        hot: Box<dyn HotGroups>,
    ) -> Result<SpillSnapshot, SpillError> {
        self.epoch += 1;
        // `deltas` is settled (`settle_deltas`) by the caller, before it
        // froze the hot slices by it.
        self.deleted.iter_mut().for_each(|deleted| *deleted = false);
        let schema = part::schema_section::<S>()?;
        // Without a disk table the log is empty; it records from here on,
        // but this snapshot leaves no base to merge into.
        let changes = self.changes.take();
        let view = self.disk.as_ref().map(DiskTable::snapshot);
        Ok(SpillSnapshot::new(Taken {
            spilled: view.is_some(),
            view,
            changes,
            bases: Arc::clone(&self.bases),
            epoch: self.epoch,
            range: self.hot.range(),
            picked,
            schema,
            max_parallelism: self.hot.max_parallelism(),
            hot,
            deltas,
        }))
    }

    /// Leaves in `deltas` only the groups a delta part can hold: none
    /// when the change log missed changes (no delta knows what changed),
    /// and no group that lost a key since the last snapshot (a delta
    /// cannot delete). Settled before the hot entries are frozen, since a
    /// delta group's frozen slices keep only what it needs.
    fn settle_deltas(&self, deltas: &mut [bool]) {
        let complete = self.changes.is_complete();
        for (delta, deleted) in deltas.iter_mut().zip(&self.deleted) {
            *delta &= complete && !*deleted;
        }
    }

    /// A snapshot of the key groups `include` picks whose hot entries are
    /// encoded here, on this thread (time proportional to them, at most
    /// the memory budget): the synchronous path, for state types that
    /// cannot be frozen (see [`Self::snapshot`]). The disk table is not
    /// written. Its parts are exactly [`Self::snapshot`]'s.
    pub fn snapshot_encoded(
        &mut self,
        include: &mut dyn FnMut(u32) -> bool,
    ) -> Result<SpillSnapshot, SpillError> {
        let picked = self.pick(include);
        let mut hot = Encoded::default();
        for (key_group, picked) in self.hot.range().iter().zip(&picked) {
            if *picked {
                hot.push(
                    key_group,
                    HotEntries::encode(
                        key_group,
                        self.hot
                            .iter_key_group(key_group)
                            .map(|(key, entry)| (key, &entry.state)),
                    )?,
                );
            }
        }
        let deltas = vec![false; picked.len()];
        self.take(picked, deltas, Box::new(hot))
    }

    /// Replaces the state with `parts` (exactly one per key group of its
    /// range, written by either backend at any parallelism). Each part is
    /// decoded on its own, sorted and bulk-loaded into a fresh disk table
    /// (`restore.rs`), so at most one key group's entries are in memory at
    /// a time (the encoded parts themselves are held by the caller). On an
    /// error the state holds what was loaded before it and must not be
    /// used.
    pub fn restore<B: AsRef<[u8]>>(
        &mut self,
        parts: impl IntoIterator<Item = (u32, B)>,
    ) -> Result<(), SpillError> {
        let range = self.hot.range();
        let max_parallelism = self.hot.max_parallelism();
        let parts = parts_covering(range, parts)?;
        // The old table deletes its directory when dropped, perhaps after
        // its background threads end; the new one starts elsewhere, and
        // so does a first one: `dir` may hold a table of another state
        // given the same directory, and a bulk load needs an empty one.
        self.disk = None;
        self.dir = super::fresh_dir(&self.dir);
        self.hot = CowKeyedState::new(max_parallelism, range)?;
        self.deleted.iter_mut().for_each(|deleted| *deleted = false);
        // The table is replaced: no earlier base describes it.
        self.changes.invalidate();
        // At most this many keys go to disk (each entry takes a byte at
        // least, so a hostile header cannot inflate it past the bytes).
        let keys: usize = parts
            .iter()
            .map(|(_, bytes)| part::plausible_entries(bytes.as_ref()))
            .sum();
        if keys == 0 {
            // Nothing to load, but every part must still decode: a part
            // whose header is damaged claims no entries too, and taking
            // it as empty would restore a partial state.
            self.spilled = SpilledKeys::default();
            let mut entries =
                RestoredEntries::<K, S, B>::new(max_parallelism, parts, &mut self.spilled);
            if entries.next().is_some() {
                return Err(SpillError::Internal(
                    "parts that claim no entries hold some".to_string(),
                ));
            }
            entries.finish()?;
            return Ok(());
        }
        self.spilled = SpilledKeys::with_capacity(keys as u64);
        // The change log is invalid until the next snapshot, so the
        // restored entries are not recorded in it.
        let disk = DiskTable::open(&self.dir, &self.sizing)?;
        let mut entries =
            RestoredEntries::<K, S, B>::new(max_parallelism, parts, &mut self.spilled);
        disk.ingest(&mut entries)?;
        entries.finish()?;
        self.disk = Some(disk);
        Ok(())
    }

    /// Calls `f` with every key and its state, from memory and disk, in
    /// unspecified order. Writes every in-memory entry back first.
    pub fn for_each(&mut self, mut f: impl FnMut(&K, &S)) -> Result<(), SpillError> {
        if self.disk.is_none() {
            self.hot
                .iter()
                .for_each(|(key, entry)| f(key, &entry.state));
            return Ok(());
        }
        self.write_back_all()?;
        self.disk()?.scan_all(|key, payload| {
            let key: K = postcard::from_bytes(&key[4..]).map_err(|error| {
                SpillError::Internal(format!("a key on disk does not decode: {error}"))
            })?;
            f(&key, &S::decode_payload(payload)?);
            Ok(())
        })
    }

    /// Every part, as a full snapshot writes them (the synchronous path).
    pub fn snapshot_parts(&mut self) -> Result<Vec<KeyGroupPart>, SpillError> {
        self.snapshot_encoded(&mut |_| true)?.collect_parts()
    }
}

impl<K, S> SpillingState<K, S>
where
    K: StateKey + Send + Sync,
    S: Snapshot + Default + Clone + Send + Sync + 'static,
{
    /// A snapshot of the key groups `include` picks, whose parts
    /// [`SpillSnapshot::next_part`] yields ascending while this state goes
    /// on changing. On this thread it takes the change log, a
    /// constant-time view of the disk table and the picked groups' hot
    /// slices (frozen, constant time per slice): nothing is encoded or
    /// written here. The writer lays the hot entries over the disk's
    /// (module doc, "The rule").
    pub fn snapshot(
        &mut self,
        include: &mut dyn FnMut(u32) -> bool,
    ) -> Result<SpillSnapshot, SpillError> {
        self.snapshot_with_deltas(include, &mut |_| false)
    }

    /// [`Self::snapshot`] where each picked key group that `delta` names
    /// is yielded as a delta part ([`crate::keyed::part`]'s module doc)
    /// holding the entries changed since the previous snapshot of this
    /// state, when the snapshot knows them (it merges the previous base
    /// with the change log, or the state never spilled) and no key of the
    /// group was deleted since; otherwise it is yielded whole. The caller
    /// lays a delta over the group's chain as of the previous snapshot.
    pub(crate) fn snapshot_with_deltas(
        &mut self,
        include: &mut dyn FnMut(u32) -> bool,
        delta: &mut dyn FnMut(u32) -> bool,
    ) -> Result<SpillSnapshot, SpillError> {
        let picked = self.pick(include);
        let mut deltas = self.pick(delta);
        self.settle_deltas(&mut deltas);
        let range = self.hot.range();
        // A delta group's hot slices need only the entries written for
        // this snapshot: a slice the operator writes before the writer
        // reads it encodes just those (`hot::encode_frozen_slice`).
        let stamp = self.pending_stamp();
        let frozen = self.hot.freeze_key_groups(
            |key_group| {
                let index = (key_group - range.start) as usize;
                picked[index].then_some(EncodeScope {
                    key_group,
                    stamp: deltas[index].then_some(stamp),
                })
            },
            encode_frozen_slice::<K, S>,
        );
        self.take(picked, deltas, Box::new(Frozen::new(frozen)))
    }
}

/// The directory of the bases of a state whose disk table is in `dir`:
/// beside it, so that a restore's fresh table leaves it in place.
fn bases_dir(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".bases");
    dir.with_file_name(name)
}

/// One entry in its on-disk form: the key (key group, then postcard) and
/// the state's payload.
type DiskEntry = (Vec<u8>, Vec<u8>);

/// A hot entry as [`SpillingState::encode_entries`] takes it: its key, its
/// state and whether it was written since the last snapshot (its stamp is
/// `pending`, the next snapshot's).
fn marked<'a, K, S>(key: &'a K, entry: &'a Clocked<S>, pending: u32) -> (&'a K, &'a S, bool) {
    (key, &entry.state, entry.written_for == pending)
}

/// An entry on its way to disk: its disk form, its key's [`key_hash`] and
/// whether it was written since the last snapshot.
type EncodedEntry = (DiskEntry, u64, bool);

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

impl<K: StateKey, S: Snapshot + Default> KeyGroupSnapshots for SpillingState<K, S> {
    fn key_groups(&self) -> KeyGroupRange {
        self.hot.range()
    }

    fn changed_key_groups(&self) -> Vec<u32> {
        self.hot.dirty_key_groups().collect()
    }

    fn forget_changes(&mut self) {
        self.hot.clear_dirty();
    }

    fn parts_of(
        &mut self,
        include: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Vec<KeyGroupPart>, BoxError> {
        Ok(self.snapshot_encoded(include)?.collect_parts()?)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::keyed::backend::KeyedState;
    use crate::keyed::test_support::Count;

    pub(in crate::keyed::spill) const MAX: u32 = 16;

    pub(in crate::keyed::spill) fn range(parallelism: u32, subtask: u32) -> KeyGroupRange {
        MaxParallelism::new(MAX)
            .unwrap()
            .range_for_subtask(parallelism, subtask)
            .unwrap()
    }

    pub(in crate::keyed::spill) fn spilling(
        dir: &std::path::Path,
        budget: usize,
    ) -> SpillingState<u64, Count> {
        SpillingState::new(
            MaxParallelism::new(MAX).unwrap(),
            range(2, 1),
            dir.join("instance"),
            budget,
        )
        .unwrap()
    }

    pub(in crate::keyed::spill) fn memory() -> KeyedState<u64, Count> {
        KeyedState::new(MaxParallelism::new(MAX).unwrap(), range(2, 1)).unwrap()
    }

    /// The entries that `parts` hold, read back by the in-memory backend.
    fn contents(parts: Vec<KeyGroupPart>) -> BTreeMap<u64, u64> {
        let restored: KeyedState<u64, Count> = KeyedState::restore(
            MaxParallelism::new(MAX).unwrap(),
            range(2, 1),
            parts.into_iter().map(|part| (part.key_group, part.bytes)),
        )
        .unwrap();
        restored
            .iter()
            .map(|(key, count)| (*key, count.count))
            .collect()
    }

    /// Every key and its count, from memory and disk
    /// ([`SpillingState::for_each`]).
    pub(in crate::keyed::spill) fn entries_of(
        state: &mut SpillingState<u64, Count>,
    ) -> BTreeMap<u64, u64> {
        let mut entries = BTreeMap::new();
        state
            .for_each(|key, count| {
                entries.insert(*key, count.count);
            })
            .unwrap();
        entries
    }

    /// Adds `key` to both backends `times` times.
    fn touch(
        spilled: &mut SpillingState<u64, Count>,
        plain: &mut KeyedState<u64, Count>,
        keys: impl Iterator<Item = u64>,
    ) {
        for key in keys {
            spilled.get_or_default(&key).unwrap().count += key + 1;
            plain.get_or_default(&key).count += key + 1;
            spilled.enforce_budget().unwrap();
        }
    }

    pub(in crate::keyed::spill) fn owned_keys(count: usize) -> Vec<u64> {
        let plain = memory();
        (0..u64::MAX)
            .filter(|key| plain.owns(key))
            .take(count)
            .collect()
    }

    #[test]
    fn most_keys_go_to_disk_and_the_parts_hold_the_same_state() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spilled, mut plain) = (spilling(dir.path(), 10), memory());
        let keys = owned_keys(500);
        touch(&mut spilled, &mut plain, keys.iter().copied());
        // Again, so that evicted keys are read back and changed.
        touch(
            &mut spilled,
            &mut plain,
            keys.iter().rev().step_by(3).copied(),
        );
        assert!(spilled.len_in_memory() <= 10);
        assert!(spilled.evicted_entries() >= 490);
        let want = contents(plain.snapshot().unwrap().parts);
        assert_eq!(contents(spilled.snapshot_parts().unwrap()), want);
        // Each part is a valid part of its key group for the in-memory
        // backend, with the same entries per group.
        let picked = spilled
            .parts_of(&mut |key_group| key_group % 2 == 0)
            .unwrap();
        let expected = plain
            .snapshot_key_groups(|key_group| key_group % 2 == 0)
            .unwrap();
        assert_eq!(
            picked.iter().map(|part| part.key_group).collect::<Vec<_>>(),
            expected
                .iter()
                .map(|part| part.key_group)
                .collect::<Vec<_>>()
        );
        for (got, want) in picked.iter().zip(&expected) {
            assert_eq!(
                got.bytes.len(),
                want.bytes.len(),
                "key group {}",
                got.key_group
            );
        }
    }

    #[test]
    fn state_that_fits_never_opens_the_disk_and_writes_identical_parts() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spilled, mut plain) = (spilling(dir.path(), 1_000), memory());
        touch(&mut spilled, &mut plain, owned_keys(100).into_iter());
        // The same entries per group (the spilling backend orders them by
        // their encoded keys, the in-memory one by its table).
        let (got, want) = (
            spilled.snapshot_parts().unwrap(),
            plain.snapshot().unwrap().parts,
        );
        assert_eq!(
            got.iter()
                .map(|part| (part.key_group, part.bytes.len()))
                .collect::<Vec<_>>(),
            want.iter()
                .map(|part| (part.key_group, part.bytes.len()))
                .collect::<Vec<_>>()
        );
        assert_eq!(contents(got), contents(want));
        assert!(!dir.path().join("instance").exists());
    }

    #[test]
    fn a_restore_reads_parts_of_either_backend_and_drops_what_was_there() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spilled, mut plain) = (spilling(dir.path(), 4), memory());
        let keys = owned_keys(200);
        touch(&mut spilled, &mut plain, keys.iter().copied());
        let memory_parts = plain.snapshot().unwrap().parts;
        let want = contents(memory_parts.clone());
        // Changes after the snapshot are gone after the restore.
        touch(&mut spilled, &mut memory(), keys.iter().copied());
        spilled
            .restore(
                memory_parts
                    .iter()
                    .map(|part| (part.key_group, &part.bytes)),
            )
            .unwrap();
        assert_eq!(spilled.len_in_memory(), 0);
        assert_eq!(contents(spilled.snapshot_parts().unwrap()), want);
        for key in &keys {
            assert_eq!(spilled.get_or_default(key).unwrap().count, key + 1);
        }
        let mut restored = spilling(dir.path(), 4);
        let spill_parts = spilled.snapshot_parts().unwrap();
        restored
            .restore(spill_parts.iter().map(|part| (part.key_group, &part.bytes)))
            .unwrap();
        assert_eq!(contents(restored.snapshot_parts().unwrap()), want);
        assert_eq!(entries_of(&mut restored), want);
    }

    #[test]
    fn a_restore_refuses_a_missing_key_group_and_a_foreign_key() {
        let dir = tempfile::tempdir().unwrap();
        let mut spilled = spilling(dir.path(), 4);
        let parts = memory().snapshot().unwrap().parts;
        let missing = spilled.restore(
            parts
                .iter()
                .skip(1)
                .map(|part| (part.key_group, &part.bytes)),
        );
        assert!(matches!(
            missing,
            Err(SpillError::Keyed(KeyedError::MissingKeyGroups { .. }))
        ));
        let foreign = (0..u64::MAX).find(|key| !memory().owns(key)).unwrap();
        assert!(matches!(
            spilled.get_or_default(&foreign),
            Err(SpillError::Keyed(KeyedError::ForeignKey { .. }))
        ));
    }

    #[test]
    fn only_key_groups_touched_since_the_last_snapshot_are_dirty() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spilled, mut plain) = (spilling(dir.path(), 4), memory());
        let keys = owned_keys(100);
        touch(&mut spilled, &mut plain, keys.iter().copied());
        spilled.forget_changes();
        touch(&mut spilled, &mut plain, keys[..1].iter().copied());
        let group = plain.key_group_of(&keys[0]);
        assert_eq!(spilled.changed_key_groups(), vec![group]);
    }
}
