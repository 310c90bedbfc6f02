//! [`DiskTable`]: the on-disk half of the spilling backend, one fjall
//! keyspace with one partition per operator instance.
//!
//! This module owns the key layout on disk and every call into fjall. It
//! never decides which keys are hot and never reads a part.
//!
//! # Layout
//!
//! A key is its key group (4 bytes, big-endian, so one key group's keys are
//! one contiguous range of the LSM tree) followed by the user key in
//! postcard, exactly the bytes a part's entry starts with; a value is the
//! state's payload ([`crate::state::Snapshot::encode_payload`]). A snapshot
//! therefore copies both into a part without decoding them.
//!
//! Nothing here is durable on purpose: the journal is never synced
//! (`manual_journal_persist`) and the directory is deleted when the table is
//! dropped (`temporary`), because the checkpoint store holds the durable
//! copy and a restarted instance restores from it into a fresh directory.

use std::path::{Path, PathBuf};

use fjall::{Config, Keyspace, PartitionCreateOptions, PartitionHandle};

use super::sizing::StoreSizing;
use super::SpillError;

/// The bits per key of fjall's Bloom filters on its levels below the first
/// two, and on a restore's bulk load (fjall's default is 10; its level 0
/// and 1 filters are sized by a false-positive rate and keep it).
///
/// # Why 5
///
/// A lookup reaches fjall only for a key the filter of spilled keys
/// (`filter.rs`) says may be on disk, so nearly every lookup finds its
/// key, and a filter's "no" only saves reading the levels above the key's
/// own. With 5 bits (three hashes) a filter says "maybe" wrongly for
/// about 9 % of keys instead of about 1 %, for half the memory (about
/// 0.6 byte less per spilled key) and half the build: a restore builds
/// one over every key it loads, which was a sixth of a restore's CPU at
/// 10 M keys, and every compaction into those levels builds one too
/// (BENCHMARKS.md at 07a44e5, "A restore that copies entries").
const BLOOM_BITS_PER_KEY: u8 = 5;

/// One operator instance's table on disk.
pub(crate) struct DiskTable {
    dir: PathBuf,
    /// Kept so that the keyspace's background threads live as long as the
    /// partition.
    _keyspace: Keyspace,
    items: PartitionHandle,
}

impl std::fmt::Debug for DiskTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTable").field("dir", &self.dir).finish()
    }
}

impl DiskTable {
    /// An empty table in `dir`, which must not hold one already (each
    /// instance's directory name is unique in the process), with the
    /// store's memory set by `sizing`. One flush worker and one compaction
    /// worker per instance: their threads are the store's, and more would
    /// only hold more sealed memtables and compaction buffers at once.
    pub(crate) fn open(dir: &Path, sizing: &StoreSizing) -> Result<Self, SpillError> {
        let error = |source| SpillError::Store {
            dir: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(|source| SpillError::Dir {
            dir: dir.to_path_buf(),
            source,
        })?;
        let keyspace = Config::new(dir)
            .temporary(true)
            .manual_journal_persist(true)
            .flush_workers(1)
            .compaction_workers(1)
            .cache_size(sizing.cache_bytes)
            .max_write_buffer_size(sizing.write_buffer_bytes)
            .max_journaling_size(sizing.journal_bytes)
            .open()
            .map_err(error)?;
        let leveled = fjall::compaction::Leveled {
            target_size: sizing.segment_target_bytes,
            ..Default::default()
        };
        let options = PartitionCreateOptions::default()
            .bloom_filter_bits(Some(BLOOM_BITS_PER_KEY))
            .block_size(sizing.block_bytes)
            .max_memtable_size(sizing.memtable_bytes)
            .compaction_strategy(fjall::compaction::Strategy::Leveled(leveled));
        let items = keyspace.open_partition("state", options).map_err(error)?;
        Ok(DiskTable {
            dir: dir.to_path_buf(),
            _keyspace: keyspace,
            items,
        })
    }

    fn error(&self, source: fjall::Error) -> SpillError {
        SpillError::Store {
            dir: self.dir.clone(),
            source,
        }
    }

    /// The value stored under `key`, if any.
    pub(crate) fn get(&self, key: &[u8]) -> Result<Option<fjall::Slice>, SpillError> {
        self.items.get(key).map_err(|source| self.error(source))
    }

    /// Stores every `(key, value)` in one batch, replacing what was there.
    pub(crate) fn put_all(
        &self,
        entries: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
    ) -> Result<(), SpillError> {
        let mut batch = self._keyspace.batch();
        for (key, value) in entries {
            batch.insert(&self.items, key, value);
        }
        batch.commit().map_err(|source| self.error(source))
    }

    /// Fills this table, which must be empty and never written, with
    /// `entries`, which must ascend strictly by key: fjall writes them
    /// straight into segments of its last level, without its journal,
    /// memtables or compactions (`restore.rs` says why). Both conditions
    /// are the caller's to keep, because fjall panics on either: a
    /// restore opens a fresh table and checks the order as it goes.
    ///
    /// The load's entries carry sequence number 0, which fjall's next
    /// write would carry as well, and a view of a table whose counter is
    /// still 0 sees nothing, so an empty batch is committed first: it
    /// takes number 0 itself, and every later write and view comes after
    /// the loaded entries.
    pub(crate) fn ingest(
        &self,
        entries: impl Iterator<Item = IngestEntry>,
    ) -> Result<(), SpillError> {
        if !self.items.is_empty().map_err(|source| self.error(source))? {
            return Err(SpillError::Internal(format!(
                "a bulk load into the non-empty disk table in {}",
                self.dir.display()
            )));
        }
        self._keyspace
            .batch()
            .commit()
            .map_err(|source| self.error(source))?;
        self.items
            .ingest(entries.map(|entry| (entry.key, entry.value)))
            .map_err(|source| self.error(source))
    }

    /// Deletes `key` (writes a tombstone; nothing happens to a key that is
    /// not there).
    pub(crate) fn remove(&self, key: &[u8]) -> Result<(), SpillError> {
        self.items.remove(key).map_err(|source| self.error(source))
    }

    /// Calls `f` with every `(key, value)` of the table, in key order.
    pub(crate) fn scan_all(
        &self,
        f: impl FnMut(&[u8], &[u8]) -> Result<(), SpillError>,
    ) -> Result<(), SpillError> {
        self.scan(self.items.iter(), f)
    }

    fn scan(
        &self,
        entries: impl Iterator<Item = fjall::Result<fjall::KvPair>>,
        f: impl FnMut(&[u8], &[u8]) -> Result<(), SpillError>,
    ) -> Result<(), SpillError> {
        scan_entries(&self.dir, entries, f)
    }

    /// A read-only view of the table as it is now: writes after this call
    /// are not seen through it. It keeps the store (and its directory)
    /// alive until it is dropped, and fjall keeps the versions it sees
    /// through compactions meanwhile, so holding it long costs disk.
    pub(crate) fn snapshot(&self) -> DiskSnapshot {
        DiskSnapshot {
            dir: self.dir.clone(),
            _keyspace: self._keyspace.clone(),
            view: self.items.snapshot(),
        }
    }
}

/// One entry of a bulk load ([`DiskTable::ingest`]), in the store's own
/// byte type, so that it is copied once on its way in.
pub(crate) struct IngestEntry {
    key: fjall::Slice,
    value: fjall::Slice,
}

impl IngestEntry {
    /// `key` (its disk form) and `value` (the state's payload), copied.
    pub(crate) fn new(key: &[u8], value: &[u8]) -> Self {
        IngestEntry {
            key: key.into(),
            value: value.into(),
        }
    }

    /// The disk form of a key of `key_group` whose postcard bytes are
    /// `key` (the group big-endian, then the bytes), and `value` (the
    /// state's payload), copied.
    pub(crate) fn of_key_group(key_group: u32, key: &[u8], value: &[u8]) -> Self {
        IngestEntry {
            key: fjall::Slice::fused(&key_group.to_be_bytes(), key),
            value: value.into(),
        }
    }
}

/// A point-in-time view of a [`DiskTable`] (fjall's MVCC snapshot), which
/// may be read on another thread while the table goes on changing.
pub(crate) struct DiskSnapshot {
    dir: PathBuf,
    /// Kept so that the directory is not deleted while the view reads it.
    _keyspace: Keyspace,
    view: fjall::Snapshot,
}

impl DiskSnapshot {
    /// Calls `f` with every `(key, value)` of `key_group` as it was when
    /// the view was taken, in key order.
    pub(crate) fn scan_key_group(
        &self,
        key_group: u32,
        f: impl FnMut(&[u8], &[u8]) -> Result<(), SpillError>,
    ) -> Result<(), SpillError> {
        let entries = self
            .view
            .prefix(key_group.to_be_bytes())
            .map(|entry| entry.map_err(fjall::Error::from));
        scan_entries(&self.dir, entries, f)
    }
}

/// Calls `f` with each of `entries`, read from the store in `dir`.
fn scan_entries(
    dir: &Path,
    entries: impl Iterator<Item = fjall::Result<fjall::KvPair>>,
    mut f: impl FnMut(&[u8], &[u8]) -> Result<(), SpillError>,
) -> Result<(), SpillError> {
    for entry in entries {
        let (key, value) = entry.map_err(|source| SpillError::Store {
            dir: dir.to_path_buf(),
            source,
        })?;
        f(&key, &value)?;
    }
    Ok(())
}
