//! [`RestoredEntries`]: the entries of a restore's parts, one key group at
//! a time, in the disk table's key order, for its bulk load
//! ([`super::disk::DiskTable::ingest`]).
//!
//! This module owns reading a key group's chain into disk entries (the
//! key group big-endian, then the key in postcard; the state's payload),
//! sorting them, keeping the newest entry of each key and checking that
//! they ascend strictly, and noting each restored key in the filter of
//! spilled keys. It never opens the disk table and never decides which
//! parts a state restores.
//!
//! # Why a bulk load
//!
//! A restore used to put every entry into fjall through write batches:
//! its memtables, flushes and compactions took 8.1 of the 9.1 s that
//! restoring 5 M keys per subtask took at 10 M keys. A fresh table
//! instead takes one sorted stream and writes its segments directly:
//! 1.3 s, of which decoding, sorting and fjall's writing are most, and
//! noting the keys in the filter of spilled keys (prefetched, one
//! filter sized for them) about a tenth (BENCHMARKS.md at 07a44e5, "Restoring the
//! spilling backend"). The stream must
//! ascend strictly (fjall panics otherwise), so each group is sorted
//! here and every adjacent pair is compared before it goes out, and the
//! groups go out ascending.
//!
//! # Why entries are copied, not decoded
//!
//! A part's entry is its key in postcard and its state's payload, exactly
//! the bytes a disk entry is made of, so a part written with this build's
//! schema goes out as spans of its own bytes: each key is decoded only to
//! check its key group and to note its hash, and each payload only to be
//! checked. Decoding every entry into a table, encoding it again and
//! sorting it whole made the restore of 5 M keys per subtask about 1.9 s
//! instead of 1.5 s (BENCHMARKS.md at 07a44e5, "A restore that copies entries"). A
//! part of an older schema still goes through the state's upgrade chain
//! and is encoded again. A chain's deltas replace older entries of their
//! keys: the sort is stable, so the newest entry of a key comes last
//! among its equals and is the one kept; a stable sort also merges the
//! chain's parts, each sorted already when a spilling snapshot wrote it,
//! instead of sorting them again. One key group's bytes and spans (or its
//! entries encoded again) are held at a time.

use std::cmp::Ordering;
use std::marker::PhantomData;

use super::disk::IngestEntry;
use super::filter::SpilledKeys;
use super::hot::HotEntries;
use super::order::{sort_prefixed_stable, Prefixed};
use super::SpillError;
use crate::keyed::backend::KeyedState;
use crate::keyed::hash::key_hash;
use crate::keyed::key_group::{KeyGroupRange, MaxParallelism};
use crate::keyed::part::{self, EntryBytes};
use crate::keyed::{KeyedError, StateKey};
use crate::state::Snapshot;

/// The entries of `parts`, ascending by disk key, as an iterator of
/// [`IngestEntry`]. An error (a part that does not decode, or keys out of
/// order) ends the iteration early; [`Self::finish`] returns it, so the
/// caller must call it after the load and discard the table on an error.
pub(crate) struct RestoredEntries<'a, K, S, B> {
    max_parallelism: MaxParallelism,
    /// Ascending by key group; the groups not yet read.
    parts: std::vec::IntoIter<(u32, B)>,
    /// The group being handed out.
    group: Group<B>,
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
    /// each key in `spilled` as its group is read.
    pub(crate) fn new(
        max_parallelism: MaxParallelism,
        mut parts: Vec<(u32, B)>,
        spilled: &'a mut SpilledKeys,
    ) -> Self {
        parts.sort_unstable_by_key(|(key_group, _)| *key_group);
        RestoredEntries {
            max_parallelism,
            parts: parts.into_iter(),
            group: Group::Encoded(EncodedGroup::default()),
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

    /// Reads `key_group`'s chain into spans of its bytes, sorted, or into
    /// entries encoded again when a part of it has an older schema.
    fn load(&mut self, key_group: u32, bytes: B) -> Result<(), SpillError> {
        let all = bytes.as_ref();
        let plausible = part::plausible_entries(all);
        let (mut spans, mut hashes) =
            (Vec::with_capacity(plausible), Vec::with_capacity(plausible));
        let exact =
            part::decode_entry_bytes::<K, S>(all, self.max_parallelism, key_group, |entry| {
                hashes.push(entry.hash);
                spans.push(Prefixed::new(entry.key_bytes, Span::of(all, &entry)));
                Ok(())
            })?;
        if !exact {
            return self.load_upgraded(key_group, bytes);
        }
        sort_prefixed_stable(&mut spans, |span| &all[span.key.clone()]);
        keep_newest(&mut spans, all, key_group)?;
        // A key a delta replaced is noted twice, which changes nothing.
        self.spilled.insert_all(&hashes);
        self.group = Group::Spans(SpanGroup {
            key_group,
            bytes,
            spans,
            next: 0,
        });
        Ok(())
    }

    /// Decodes `key_group`'s chain, some of whose parts were written with
    /// an older schema, into a table (through the state's upgrade chain)
    /// and encodes it again, sorted.
    fn load_upgraded(&mut self, key_group: u32, bytes: B) -> Result<(), SpillError> {
        let one = KeyGroupRange::new(key_group, key_group + 1);
        let group: KeyedState<K, S> =
            KeyedState::restore(self.max_parallelism, one, [(key_group, bytes)])?;
        let hashes: Vec<u64> = group.iter().map(|(key, _)| key_hash(key)).collect();
        self.spilled.insert_all(&hashes);
        self.group = Group::Encoded(EncodedGroup {
            entries: HotEntries::encode(key_group, group.iter())?,
            next: 0,
        });
        Ok(())
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
            match self.group.next() {
                Some(Ok(entry)) => {
                    self.entries += 1;
                    return Some(entry);
                }
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

/// One key group's entries, as they are handed out.
enum Group<B> {
    Spans(SpanGroup<B>),
    Encoded(EncodedGroup),
}

impl<B: AsRef<[u8]>> Group<B> {
    /// The group's next entry, checked to follow the one before it.
    fn next(&mut self) -> Option<Result<IngestEntry, SpillError>> {
        match self {
            Group::Spans(group) => group.next(),
            Group::Encoded(group) => group.next(),
        }
    }
}

/// Where one entry of a chain lies in the chain's bytes.
#[derive(Debug, Clone)]
struct Span {
    /// The key's postcard bytes.
    key: std::ops::Range<usize>,
    /// The state's payload.
    payload: std::ops::Range<usize>,
    /// Whether it comes from a delta part.
    replaces: bool,
}

impl Span {
    /// The span of `entry`, whose bytes lie in `all`.
    fn of<K>(all: &[u8], entry: &EntryBytes<'_, K>) -> Self {
        // `decode_entry_bytes` hands out slices of the bytes it was given.
        let offset = |bytes: &[u8]| {
            let start = bytes.as_ptr() as usize - all.as_ptr() as usize;
            debug_assert!(start + bytes.len() <= all.len(), "a span outside its part");
            start..start + bytes.len()
        };
        Span {
            key: offset(entry.key_bytes),
            payload: offset(entry.payload),
            replaces: entry.replaces,
        }
    }
}

/// Keeps the newest span of each key of `spans` (sorted stably by key,
/// so the last of its equals, in chain order) and drops the older ones.
/// Two equal keys of the chain's first part are a duplicate, which a
/// table's restore refuses too.
fn keep_newest(
    spans: &mut Vec<Prefixed<Span>>,
    all: &[u8],
    key_group: u32,
) -> Result<(), KeyedError> {
    let key = |span: &Prefixed<Span>| &all[span.item.key.clone()];
    let same = |a: &Prefixed<Span>, b: &Prefixed<Span>| a.may_equal(b) && key(a) == key(b);
    if spans.windows(2).all(|pair| !same(&pair[0], &pair[1])) {
        return Ok(());
    }
    if spans
        .windows(2)
        .any(|pair| same(&pair[0], &pair[1]) && !pair[1].item.replaces)
    {
        return Err(KeyedError::DuplicateKey { key_group });
    }
    // `dedup_by` keeps the first of equal neighbours; the newest is the
    // last, so each kept span takes the place of the one it drops.
    spans.dedup_by(|later, kept| {
        let equal = same(later, kept);
        if equal {
            std::mem::swap(later, kept);
        }
        equal
    });
    Ok(())
}

/// A key group's chain with the spans of its newest entries, ascending by
/// key.
struct SpanGroup<B> {
    key_group: u32,
    bytes: B,
    spans: Vec<Prefixed<Span>>,
    /// The index of the next span to hand out.
    next: usize,
}

impl<B: AsRef<[u8]>> SpanGroup<B> {
    /// The next entry, checked to follow the one before it.
    fn next(&mut self) -> Option<Result<IngestEntry, SpillError>> {
        let index = self.next;
        let span = self.spans.get(index)?;
        let bytes = self.bytes.as_ref();
        if let Some(before) = index.checked_sub(1).map(|before| &self.spans[before]) {
            if before.cmp_by(span, |span| &bytes[span.key.clone()]) != Ordering::Less {
                return Some(Err(SpillError::Internal(format!(
                    "a restored key group's keys do not ascend at entry {index}"
                ))));
            }
        }
        self.next += 1;
        Some(Ok(IngestEntry::of_key_group(
            self.key_group,
            &bytes[span.item.key.clone()],
            &bytes[span.item.payload.clone()],
        )))
    }
}

/// A key group's entries encoded again (in their disk form, sorted).
#[derive(Default)]
struct EncodedGroup {
    entries: HotEntries,
    next: usize,
}

impl EncodedGroup {
    fn next(&mut self) -> Option<Result<IngestEntry, SpillError>> {
        let (key, value) = self.entries.get(self.next)?;
        if let Some((before, _)) = self.next.checked_sub(1).and_then(|i| self.entries.get(i)) {
            if before >= key {
                return Some(Err(SpillError::Internal(format!(
                    "a restored key group's keys do not ascend at entry {}",
                    self.next
                ))));
            }
        }
        self.next += 1;
        Some(Ok(IngestEntry::new(key, value)))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::state::tests::{entries_of, memory, owned_keys, spilling};
    use super::super::SpillingState;
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

    /// Version 2 of the tests' count: parts of version 1 go through its
    /// upgrade chain.
    #[derive(crate::Snapshot, Default, Debug, Clone, PartialEq)]
    #[snapshot(crate = "crate", version = 2, upgrade_from = crate::keyed::test_support::Count)]
    struct CountV2 {
        count: u64,
        seen: Option<u64>,
    }

    impl From<crate::keyed::test_support::Count> for CountV2 {
        fn from(old: crate::keyed::test_support::Count) -> Self {
            CountV2 {
                count: old.count,
                seen: None,
            }
        }
    }

    #[test]
    fn parts_of_an_older_schema_are_upgraded_and_encoded_again() {
        let dir = tempfile::tempdir().unwrap();
        let (max, range) = {
            let plain = memory();
            (plain.max_parallelism(), plain.range())
        };
        let mut state: SpillingState<u64, CountV2> =
            SpillingState::new(max, range, dir.path().join("instance"), 8).unwrap();
        let keys = owned_keys(300);
        let parts = parts_of(&keys);
        state
            .restore(parts.iter().map(|(group, bytes)| (*group, bytes)))
            .unwrap();
        let mut got = BTreeMap::new();
        state
            .for_each(|key, value| {
                got.insert(*key, value.clone());
            })
            .unwrap();
        let want: BTreeMap<u64, CountV2> = keys
            .iter()
            .map(|key| {
                let count = CountV2 {
                    count: key + 1,
                    seen: None,
                };
                (*key, count)
            })
            .collect();
        assert_eq!(got, want);
        // The loaded entries are this build's bytes (`for_each` decoded
        // each as version 2, which version 1's bytes fail), and a key read
        // back from disk takes a write.
        state.get_or_default(&keys[0]).unwrap().seen = Some(5);
        assert_eq!(state.get_or_default(&keys[0]).unwrap().seen, Some(5));
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
