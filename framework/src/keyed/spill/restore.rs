//! [`RestoredEntries`]: the entries of a restore's parts, one key group at
//! a time, in the disk table's key order, for its bulk load
//! ([`super::disk::DiskTable::ingest`]).
//!
//! This module owns decoding a part into disk entries (the key group
//! big-endian, then the key in postcard; the state's payload), sorting
//! them and checking that they ascend strictly, and noting each restored
//! key in the filter of spilled keys. It never opens the disk table and
//! never decides which parts a state restores.
//!
//! # Why a bulk load
//!
//! A restore used to put every entry into fjall through write batches:
//! its memtables, flushes and compactions took 8.1 of the 9.1 s that
//! restoring 5 M keys per subtask took at 10 M keys. A fresh table
//! instead takes one sorted stream and writes its segments directly:
//! 1.3 s, of which decoding, sorting and fjall's writing are most, and
//! noting the keys in the filter of spilled keys (prefetched, one
//! filter sized for them) about a tenth (BENCHMARKS.md, "Restoring the
//! spilling backend"). The stream must
//! ascend strictly (fjall panics otherwise), so each group is sorted
//! here and every adjacent pair is compared before it goes out, and the
//! groups go out ascending. A key group's entries are held decoded and
//! encoded at most once at a time.

use std::marker::PhantomData;

use super::disk::IngestEntry;
use super::filter::SpilledKeys;
use super::hot::HotEntries;
use super::SpillError;
use crate::keyed::backend::KeyedState;
use crate::keyed::hash::key_hash;
use crate::keyed::key_group::{KeyGroupRange, MaxParallelism};
use crate::keyed::StateKey;
use crate::state::Snapshot;

/// The entries of `parts`, ascending by disk key, as an iterator of
/// [`IngestEntry`]. An error (a part that does not decode, or keys out of
/// order) ends the iteration early; [`Self::finish`] returns it, so the
/// caller must call it after the load and discard the table on an error.
pub(crate) struct RestoredEntries<'a, K, S, B> {
    max_parallelism: MaxParallelism,
    /// Ascending by key group; the groups not yet decoded.
    parts: std::vec::IntoIter<(u32, B)>,
    /// The group being handed out, and the index of its next entry.
    group: HotEntries,
    next: usize,
    spilled: &'a mut SpilledKeys,
    failure: Option<SpillError>,
    entries: u64,
    _types: PhantomData<fn() -> (K, S)>,
}

impl<'a, K, S, B> RestoredEntries<'a, K, S, B>
where
    K: StateKey,
    S: Snapshot,
    B: AsRef<[u8]>,
{
    /// The entries of `parts` (one per key group, in any order), noting
    /// each key in `spilled` as its group is decoded.
    pub(crate) fn new(
        max_parallelism: MaxParallelism,
        mut parts: Vec<(u32, B)>,
        spilled: &'a mut SpilledKeys,
    ) -> Self {
        parts.sort_unstable_by_key(|(key_group, _)| *key_group);
        RestoredEntries {
            max_parallelism,
            parts: parts.into_iter(),
            group: HotEntries::default(),
            next: 0,
            spilled,
            failure: None,
            entries: 0,
            _types: PhantomData,
        }
    }

    /// How many entries were handed out, or why the iteration stopped
    /// early.
    pub(crate) fn finish(self) -> Result<u64, SpillError> {
        match self.failure {
            Some(error) => Err(error),
            None => Ok(self.entries),
        }
    }

    /// Decodes `key_group`'s part into its disk entries, sorted.
    fn load(&mut self, key_group: u32, bytes: B) -> Result<(), SpillError> {
        let one = KeyGroupRange::new(key_group, key_group + 1);
        let group: KeyedState<K, S> =
            KeyedState::restore(self.max_parallelism, one, [(key_group, bytes)])?;
        let hashes: Vec<u64> = group.iter().map(|(key, _)| key_hash(key)).collect();
        self.spilled.insert_all(&hashes);
        self.group = HotEntries::encode(key_group, group.iter())?;
        self.next = 0;
        Ok(())
    }

    /// The next entry of the current group, checked to follow the one
    /// before it.
    fn next_of_group(&mut self) -> Option<Result<IngestEntry, SpillError>> {
        let (key, value) = self.group.get(self.next)?;
        if let Some((before, _)) = self.next.checked_sub(1).and_then(|i| self.group.get(i)) {
            if before >= key {
                return Some(Err(SpillError::Internal(format!(
                    "a restored key group's keys do not ascend at entry {}",
                    self.next
                ))));
            }
        }
        let entry = IngestEntry::new(key, value);
        self.next += 1;
        self.entries += 1;
        Some(Ok(entry))
    }
}

impl<K, S, B> Iterator for RestoredEntries<'_, K, S, B>
where
    K: StateKey,
    S: Snapshot,
    B: AsRef<[u8]>,
{
    type Item = IngestEntry;

    fn next(&mut self) -> Option<IngestEntry> {
        while self.failure.is_none() {
            match self.next_of_group() {
                Some(Ok(entry)) => return Some(entry),
                Some(Err(error)) => self.failure = Some(error),
                None => {
                    // Groups ascend and every key starts with its group,
                    // so the last key of one is below the first of the
                    // next.
                    let (key_group, bytes) = self.parts.next()?;
                    if let Err(error) = self.load(key_group, bytes) {
                        self.failure = Some(error);
                    }
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::state::tests::{entries_of, memory, owned_keys, spilling};
    use super::*;
    use crate::keyed::KeyedError;

    /// The keys' counts as the in-memory backend's parts: `key + 1` each.
    fn parts_of(keys: &[u64]) -> Vec<(u32, Vec<u8>)> {
        let mut plain = memory();
        for key in keys {
            plain.get_or_default(key).count = key + 1;
        }
        let parts = plain.snapshot().unwrap().parts;
        parts
            .into_iter()
            .map(|part| (part.key_group, part.bytes))
            .collect()
    }

    #[test]
    fn writes_after_a_bulk_load_win_over_it_on_disk_and_in_snapshots() {
        let dir = tempfile::tempdir().unwrap();
        let mut state = spilling(dir.path(), 8);
        let keys = owned_keys(500);
        // Given in reverse: the load sorts the groups itself.
        let mut parts = parts_of(&keys);
        parts.reverse();
        state
            .restore(parts.iter().map(|(group, bytes)| (*group, bytes)))
            .unwrap();
        assert_eq!(state.len_in_memory(), 0);
        // Every third key is written again and evicted to disk (a budget
        // of 8 keeps almost nothing in memory), over its loaded value.
        let mut want = BTreeMap::new();
        for (index, key) in keys.iter().enumerate() {
            let mut count = key + 1;
            if index % 3 == 0 {
                state.get_or_default(key).unwrap().count += 1_000;
                state.enforce_budget().unwrap();
                count += 1_000;
            }
            want.insert(*key, count);
        }
        assert_eq!(entries_of(&mut state), want);
        for key in &keys {
            assert_eq!(state.get_or_default(key).unwrap().count, want[key]);
        }
    }

    #[test]
    fn a_part_that_does_not_decode_fails_the_restore_without_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let mut state = spilling(dir.path(), 8);
        let mut parts = parts_of(&owned_keys(500));
        // A later group's part is cut: the load stops there.
        let (_, bytes) = parts.last_mut().unwrap();
        bytes.truncate(bytes.len() - 3);
        let restored = state.restore(parts.iter().map(|(group, bytes)| (*group, bytes)));
        assert!(
            matches!(
                restored,
                Err(SpillError::Keyed(KeyedError::CorruptPart { .. }))
            ),
            "{restored:?}"
        );
    }
}
