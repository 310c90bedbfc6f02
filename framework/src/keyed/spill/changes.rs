//! [`ChangeLog`]: every entry the spilling state wrote to its disk table
//! since its last snapshot, kept in memory up to a bound, so that the next
//! snapshot can be built from the previous one and these changes instead
//! of reading the whole disk table back.
//!
//! This module owns the log's flat layout, its bound and turning it into
//! one sorted run of the newest value per key ([`SortedChanges`]). It
//! never reads or writes the disk table or a file, and never decides when
//! a snapshot is taken.
//!
//! A deletion from the disk table is logged too, as a tombstone (a record
//! whose value length is [`TOMBSTONE`]), so that a merge drops the key
//! from the previous base instead of bringing it back.
//!
//! # The bound
//!
//! The log holds at most `limit_entries` entries and `limit_bytes` bytes
//! of keys and values (set from the memory budget in `sizing.rs`). A write
//! that would go past either first compacts the log in place: it keeps
//! only the newest record of each key, in key order (what the snapshot
//! would keep of them anyway). An eviction-heavy workload writes the same
//! keys many times between snapshots (at 100 k keys and a budget of 10 k
//! per subtask, about four times each per second: BENCHMARKS.md at 07a44e5), so the
//! compacted log is a fraction of the full one and logging goes on. Only
//! when the newest records of the distinct keys written since the last
//! snapshot take more than half of either bound does the log give up: it
//! is marked incomplete and freed, the next snapshot reads the disk table
//! as before, and logging starts again after it. So a long checkpoint
//! interval under many writes costs compactions (a sort of the log on the
//! operator's thread, at most once per half a bound's worth of writes)
//! and, past the distinct keys the bound holds, the old, slower snapshot;
//! never unbounded memory. While a compaction copies the kept records the
//! log holds at most one and a half times `limit_bytes`, and while it (or
//! a snapshot) sorts the log it holds 16 more bytes of index per entry
//! (`newest_per_key`).

use super::order::{sort_prefixed, Prefixed};

/// One change's key and its new value, or `None` for a deletion.
pub(crate) type ChangeRef<'a> = (&'a [u8], Option<&'a [u8]>);

/// The value length that marks a record as a deletion: no value that the
/// log accepts is this long (a value must fit below it).
const TOMBSTONE: u32 = u32::MAX;

/// The bytes of one record's header: the key's and the value's lengths.
const HEADER_LEN: usize = 8;
/// The bit of a record's key-length word that marks it *unchanged*: the
/// value written is the one the key had at the last snapshot (an entry
/// loaded and evicted again without being written), so a delta part
/// need not hold it. Keys must be shorter than it.
const UNCHANGED: u32 = 1 << 31;

/// Entries written to the disk table since the log was last taken.
#[derive(Debug)]
pub(crate) struct ChangeLog {
    /// Records, each the key's length and the value's (`u32`
    /// little-endian), then the key, then the value.
    bytes: Vec<u8>,
    /// Where each record starts in `bytes`, in the order written.
    starts: Vec<usize>,
    limit_entries: usize,
    limit_bytes: usize,
    /// False until the first [`Self::take`], after giving up and after
    /// [`Self::invalidate`]: the log then misses changes and records none.
    complete: bool,
    /// How many times the log was compacted since it was created.
    compactions: u64,
}

impl ChangeLog {
    /// An incomplete (not yet recording) log holding at most
    /// `limit_entries` entries and `limit_bytes` bytes once it records.
    pub(crate) fn new(limit_entries: usize, limit_bytes: usize) -> Self {
        ChangeLog {
            bytes: Vec::new(),
            starts: Vec::new(),
            limit_entries,
            limit_bytes,
            complete: false,
            compactions: 0,
        }
    }

    /// Records that `key` now holds `value` on disk. Past the bound the log
    /// becomes incomplete and frees its memory.
    pub(crate) fn record(&mut self, key: &[u8], value: &[u8]) {
        self.append(key, Some(value), false);
    }

    /// [`Self::record`] of a value `key` already had at the last snapshot
    /// (the caller knows the key was not written since): a base merge
    /// takes it like any other, a delta part leaves it out.
    pub(crate) fn record_unchanged(&mut self, key: &[u8], value: &[u8]) {
        self.append(key, Some(value), true);
    }

    /// Records that `key` was deleted from disk.
    pub(crate) fn record_deletion(&mut self, key: &[u8]) {
        self.append(key, None, false);
    }

    fn append(&mut self, key: &[u8], value: Option<&[u8]>, unchanged: bool) {
        if !self.complete {
            return;
        }
        let value_len = value.map_or(0, <[u8]>::len);
        let record_len = HEADER_LEN + key.len() + value_len;
        // A value must stay below the tombstone's length, a key below the
        // flag bit.
        let too_long = u32::try_from(key.len()).map_or(true, |len| len >= UNCHANGED)
            || u32::try_from(value_len).map_or(true, |len| len == TOMBSTONE);
        if too_long || !self.make_room(record_len) {
            self.invalidate();
            return;
        }
        reserve_within(&mut self.starts, 1, self.limit_entries);
        reserve_within(&mut self.bytes, record_len, self.limit_bytes);
        self.starts.push(self.bytes.len());
        // Both fit a u32 (checked above).
        let value_word = value.map_or(TOMBSTONE, |value| value.len() as u32);
        let key_word = key.len() as u32 | if unchanged { UNCHANGED } else { 0 };
        self.bytes.extend_from_slice(&key_word.to_le_bytes());
        self.bytes.extend_from_slice(&value_word.to_le_bytes());
        self.bytes.extend_from_slice(key);
        if let Some(value) = value {
            self.bytes.extend_from_slice(value);
        }
    }

    /// Whether one more record of `record_len` bytes fits both bounds,
    /// compacting the log first if it would not.
    fn make_room(&mut self, record_len: usize) -> bool {
        self.fits(record_len) || (self.compact() && self.fits(record_len))
    }

    /// Whether one more record of `record_len` bytes stays within both
    /// bounds.
    fn fits(&self, record_len: usize) -> bool {
        self.starts.len() < self.limit_entries
            && self.bytes.len().saturating_add(record_len) <= self.limit_bytes
    }

    /// Keeps only the newest record of each key, in key order, if they
    /// take at most half of each bound (so that a compaction frees room
    /// for at least half a bound of writes, and compactions cost a sort
    /// per that many writes at most); returns whether it did. Otherwise
    /// the log is left as it was, for the caller to give up.
    fn compact(&mut self) -> bool {
        let newest = newest_per_key(&self.bytes, std::mem::take(&mut self.starts));
        let kept_bytes: usize = newest
            .iter()
            .map(|start| record_len(&self.bytes, *start))
            .sum();
        if newest.len() > self.limit_entries / 2 || kept_bytes > self.limit_bytes / 2 {
            // The caller frees the log; the order of `starts` no longer
            // matters.
            self.starts = newest;
            return false;
        }
        let mut bytes = Vec::with_capacity(kept_bytes);
        let mut starts = Vec::with_capacity(newest.len());
        for start in newest {
            starts.push(bytes.len());
            bytes.extend_from_slice(&self.bytes[start..start + record_len(&self.bytes, start)]);
        }
        // The kept records come before every later one, so a later write
        // of the same key still starts after them: "newest" stays "last".
        self.bytes = bytes;
        self.starts = starts;
        self.compactions += 1;
        true
    }

    /// Forgets every change and records none until the next
    /// [`Self::take`]: for a restore, which replaces the disk table.
    pub(crate) fn invalidate(&mut self) {
        self.complete = false;
        self.bytes = Vec::new();
        self.starts = Vec::new();
    }

    /// Whether the log missed no change since the last [`Self::take`]
    /// (which returns them only then).
    pub(crate) fn is_complete(&self) -> bool {
        self.complete
    }

    /// How many entries are logged now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.starts.len()
    }

    /// How many times the log was compacted since it was created.
    #[cfg(test)]
    pub(crate) fn compactions(&self) -> u64 {
        self.compactions
    }

    /// The changes since the last call, or `None` if some were missed,
    /// and a fresh complete log from now on. Constant time: the sorting is
    /// left to [`Changes::sorted`], on whichever thread reads them.
    pub(crate) fn take(&mut self) -> Option<Changes> {
        let bytes = std::mem::take(&mut self.bytes);
        let starts = std::mem::take(&mut self.starts);
        let was_complete = std::mem::replace(&mut self.complete, true);
        was_complete.then_some(Changes { bytes, starts })
    }
}

/// The changes of one interval between snapshots, in the order written.
#[derive(Debug)]
pub(crate) struct Changes {
    bytes: Vec<u8>,
    starts: Vec<usize>,
}

impl Changes {
    /// The newest value of each key, ascending by key bytes (the disk
    /// table's order). Takes `O(n log n)` for `n` logged entries.
    pub(crate) fn sorted(self) -> SortedChanges {
        let Changes { bytes, starts } = self;
        SortedChanges {
            starts: newest_per_key(&bytes, starts),
            bytes,
            next: 0,
        }
    }
}

/// The start of the newest record of each key among the records at
/// `starts` in `bytes`, ascending by key. A record that starts later in
/// `bytes` was written later (records are only appended, and a
/// compaction puts the ones it keeps before every later one), so the
/// position breaks ties between records of one key and the sort is
/// total. The sort holds each start with its key's prefix (`order.rs`):
/// 16 bytes per record while it runs, and the 8 of the result, instead
/// of sorting the log's index in place, so that it reads a record's key
/// only when two prefixes tie.
fn newest_per_key(bytes: &[u8], starts: Vec<usize>) -> Vec<usize> {
    let mut sorted: Vec<Prefixed<usize>> = starts
        .iter()
        .map(|&start| Prefixed::new(record(bytes, start).0, start))
        .collect();
    drop(starts);
    sort_prefixed(&mut sorted, |&start| record(bytes, start).0, Ord::cmp);
    // The later of two records of one key sorts after the earlier, and
    // replaces it.
    sorted.dedup_by(|later, kept| {
        let same = same_key(bytes, kept, later);
        if same {
            *kept = *later;
        }
        same
    });
    sorted.into_iter().map(|kept| kept.item).collect()
}

/// Whether the records at `a` and `b` have one key.
fn same_key(bytes: &[u8], a: &Prefixed<usize>, b: &Prefixed<usize>) -> bool {
    a.may_equal(b) && record(bytes, a.item).0 == record(bytes, b.item).0
}

/// Makes room for `additional` more items in `vec`, doubling its capacity
/// as a vector does but never past `limit` items, so that the log's
/// buffers stay within its bounds (a plain doubling could reserve twice
/// them). The caller has checked that `vec.len() + additional <= limit`.
fn reserve_within<T>(vec: &mut Vec<T>, additional: usize, limit: usize) {
    if vec.capacity() - vec.len() >= additional {
        return;
    }
    let needed = vec.len() + additional;
    let wanted = vec
        .capacity()
        .saturating_mul(2)
        .max(needed)
        .min(limit.max(needed));
    vec.reserve_exact(wanted - vec.len());
}

/// The length of the record at `start` in `bytes`, header included.
fn record_len(bytes: &[u8], start: usize) -> usize {
    let (key, value) = record(bytes, start);
    HEADER_LEN + key.len() + value.map_or(0, <[u8]>::len)
}

/// The key and value (`None` for a deletion) of the record at `start` in
/// `bytes`.
fn record(bytes: &[u8], start: usize) -> ChangeRef<'_> {
    let word = |at: usize| {
        let mut word = [0; 4];
        word.copy_from_slice(&bytes[at..at + 4]);
        u32::from_le_bytes(word)
    };
    let (key_len, value_word) = ((word(start) & !UNCHANGED) as usize, word(start + 4));
    let key_at = start + HEADER_LEN;
    let value_at = key_at + key_len;
    let value = (value_word != TOMBSTONE).then(|| &bytes[value_at..value_at + value_word as usize]);
    (&bytes[key_at..value_at], value)
}

/// Whether the record at `start` in `bytes` was marked unchanged
/// ([`ChangeLog::record_unchanged`]).
fn is_unchanged(bytes: &[u8], start: usize) -> bool {
    let mut word = [0; 4];
    word.copy_from_slice(&bytes[start..start + 4]);
    u32::from_le_bytes(word) & UNCHANGED != 0
}

/// A cursor over the newest value of each changed key, ascending.
#[derive(Debug)]
pub(crate) struct SortedChanges {
    bytes: Vec<u8>,
    starts: Vec<usize>,
    next: usize,
}

impl SortedChanges {
    /// The next key and value (`None` for a deletion), without moving
    /// past them.
    pub(crate) fn peek(&self) -> Option<ChangeRef<'_>> {
        self.starts
            .get(self.next)
            .map(|start| record(&self.bytes, *start))
    }

    /// Whether the entry [`Self::peek`] shows may hold a value the key did
    /// not have at the previous snapshot (false only for one recorded by
    /// [`ChangeLog::record_unchanged`]); false when there is none.
    pub(crate) fn peek_changed(&self) -> bool {
        self.starts
            .get(self.next)
            .is_some_and(|start| !is_unchanged(&self.bytes, *start))
    }

    /// Moves past the entry [`Self::peek`] shows.
    pub(crate) fn advance(&mut self) {
        self.next += 1;
    }

    /// How many of the entries still to come, counted from the next one,
    /// have keys starting with `prefix`: all of them come first, since
    /// the cursor is sorted, if the next entry's key is not before
    /// `prefix` (the caller checks that). A binary search.
    pub(crate) fn count_with_prefix(&self, prefix: &[u8]) -> usize {
        self.starts
            .get(self.next..)
            .unwrap_or_default()
            .partition_point(|start| record(&self.bytes, *start).0.starts_with(prefix))
    }

    /// How many distinct keys changed.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.starts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(mut sorted: SortedChanges) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some((key, value)) = sorted.peek() {
            out.push((key.to_vec(), value.expect("no deletion here").to_vec()));
            sorted.advance();
        }
        out
    }

    /// Every key and its value (`None` for a deletion), as the cursor
    /// yields them.
    fn changes_of(mut sorted: SortedChanges) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        let mut out = Vec::new();
        while let Some((key, value)) = sorted.peek() {
            out.push((key.to_vec(), value.map(<[u8]>::to_vec)));
            sorted.advance();
        }
        out
    }

    /// A record marked unchanged keeps its value for the merge, the newest
    /// record's mark is the key's, and a compaction keeps the marks.
    #[test]
    fn the_unchanged_mark_is_the_newest_records_and_survives_compaction() {
        let marks = |log: &mut ChangeLog| {
            let mut sorted = log.take().expect("complete").sorted();
            let mut out = Vec::new();
            while let Some((key, value)) = sorted.peek() {
                out.push((
                    key.to_vec(),
                    value.map(<[u8]>::to_vec),
                    sorted.peek_changed(),
                ));
                sorted.advance();
            }
            out
        };
        let mut log = ChangeLog::new(6, 1_000);
        log.take();
        log.record_unchanged(b"a", b"1");
        log.record(b"b", b"2");
        log.record(b"c", b"3");
        log.record_unchanged(b"c", b"3");
        log.record(b"b", b"2");
        log.record_unchanged(b"b", b"4");
        // A seventh record compacts the log to a, b, c first.
        log.record(b"a", b"5");
        assert!(log.compactions() > 0);
        assert_eq!(
            marks(&mut log),
            vec![
                (b"a".to_vec(), Some(b"5".to_vec()), true),
                (b"b".to_vec(), Some(b"4".to_vec()), false),
                (b"c".to_vec(), Some(b"3".to_vec()), false),
            ]
        );
    }

    #[test]
    fn a_deletion_is_a_tombstone_that_the_newest_record_of_its_key_decides() {
        let mut log = ChangeLog::new(10, 1_000);
        log.take();
        log.record(b"a", b"1");
        log.record_deletion(b"a");
        log.record_deletion(b"b");
        log.record(b"b", b"");
        log.record_deletion(b"c");
        assert_eq!(
            changes_of(log.take().unwrap().sorted()),
            vec![
                (b"a".to_vec(), None),
                (b"b".to_vec(), Some(Vec::new())),
                (b"c".to_vec(), None)
            ]
        );
    }

    #[test]
    fn a_log_records_only_after_its_first_take() {
        let mut log = ChangeLog::new(10, 1_000);
        log.record(b"a", b"1");
        assert_eq!(log.len(), 0);
        assert!(log.take().is_none());
        log.record(b"a", b"1");
        assert_eq!(log.len(), 1);
        assert!(log.take().is_some());
    }

    #[test]
    fn sorting_keeps_the_newest_value_of_each_key_in_key_order() {
        let mut log = ChangeLog::new(10, 1_000);
        assert!(log.take().is_none());
        for (key, value) in [("b", "1"), ("a", "2"), ("b", "3"), ("c", ""), ("a", "4")] {
            log.record(key.as_bytes(), value.as_bytes());
        }
        let sorted = log.take().unwrap().sorted();
        assert_eq!(sorted.len(), 3);
        let want: Vec<(Vec<u8>, Vec<u8>)> = [("a", "4"), ("b", "3"), ("c", "")]
            .iter()
            .map(|(key, value)| (key.as_bytes().to_vec(), value.as_bytes().to_vec()))
            .collect();
        assert_eq!(drain(sorted), want);
        // The next interval starts empty.
        assert_eq!(drain(log.take().unwrap().sorted()), Vec::new());
    }

    #[test]
    fn a_log_past_its_bound_is_incomplete_until_the_next_take() {
        let mut log = ChangeLog::new(2, 1_000);
        log.take();
        log.record(b"a", b"1");
        log.record(b"b", b"1");
        log.record(b"c", b"1");
        assert_eq!(log.len(), 0);
        assert!(log.take().is_none());
        // Bytes bound: one record of 8 + 1 + 1 bytes fits 15, two do not.
        let mut log = ChangeLog::new(100, 15);
        log.take();
        log.record(b"a", b"1");
        assert_eq!(log.len(), 1);
        log.record(b"b", b"1");
        assert!(log.take().is_none());
        log.record(b"b", b"1");
        assert!(log.take().is_some());
    }

    #[test]
    fn a_full_log_compacts_to_the_newest_record_of_each_key_and_goes_on() {
        let mut log = ChangeLog::new(4, 1_000);
        log.take();
        for value in [b"1", b"2", b"3"] {
            log.record(b"b", value);
        }
        log.record_deletion(b"a");
        // The fifth record does not fit 4: the log keeps "a" (deleted)
        // and "b" = 3, then takes "c".
        log.record(b"c", b"1");
        assert_eq!((log.len(), log.compactions()), (3, 1));
        log.record(b"a", b"4");
        assert_eq!(
            changes_of(log.take().unwrap().sorted()),
            vec![
                (b"a".to_vec(), Some(b"4".to_vec())),
                (b"b".to_vec(), Some(b"3".to_vec())),
                (b"c".to_vec(), Some(b"1".to_vec()))
            ]
        );
    }

    #[test]
    fn a_log_never_holds_more_than_its_bounds() {
        let (entries, bytes) = (64, 2_000);
        let mut log = ChangeLog::new(entries, bytes);
        log.take();
        for round in 0..1_000u32 {
            let key = (round % 20).to_le_bytes();
            log.record(&key, &round.to_le_bytes()[..(round % 4) as usize]);
            assert!(log.starts.capacity() <= entries && log.bytes.capacity() <= bytes);
        }
        assert!(log.take().is_some());
    }

    /// A random workload of writes and deletions of a few keys, with takes
    /// between, against a map of the newest value of each key since the
    /// last take: a complete log must give exactly the map, and a log may
    /// give up only once the map's records took more than half of a bound.
    fn against_a_model(seed: u64) {
        use crate::keyed::test_support::Rng;
        use std::collections::BTreeMap;
        let mut rng = Rng(seed);
        let (limit_entries, limit_bytes) =
            (1 + rng.below(60) as usize, 100 + rng.below(600) as usize);
        // Fewer distinct keys than the bound in some runs, more in others.
        let key_values = 1 + rng.below(30);
        let mut log = ChangeLog::new(limit_entries, limit_bytes);
        log.take();
        let mut model: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        let mut over_half = false;
        for _ in 0..5_000 {
            let key = vec![rng.below(key_values) as u8; 1 + rng.below(2) as usize];
            match rng.below(100) {
                0 => {
                    let taken = log.take().map(|changes| drain_all(changes.sorted()));
                    match taken {
                        Some(taken) => assert_eq!(taken, model, "{limit_entries}/{limit_bytes}"),
                        None => assert!(over_half, "gave up early: {limit_entries}/{limit_bytes}"),
                    }
                    model.clear();
                    over_half = false;
                }
                1..=15 => {
                    log.record_deletion(&key);
                    model.insert(key, None);
                }
                _ => {
                    let value = vec![rng.below(256) as u8; rng.below(6) as usize];
                    log.record(&key, &value);
                    model.insert(key, Some(value));
                }
            }
            let model_bytes: usize = model
                .iter()
                .map(|(key, value)| HEADER_LEN + key.len() + value.as_ref().map_or(0, Vec::len))
                .sum();
            over_half |= model.len() > limit_entries / 2 || model_bytes > limit_bytes / 2;
        }
    }

    /// The changes as a map, checking that they came strictly ascending.
    fn drain_all(sorted: SortedChanges) -> std::collections::BTreeMap<Vec<u8>, Option<Vec<u8>>> {
        let changes = changes_of(sorted);
        assert!(changes.windows(2).all(|pair| pair[0].0 < pair[1].0));
        changes.into_iter().collect()
    }

    #[test]
    fn a_compacting_log_gives_every_change_or_gives_up_only_past_half_its_bound() {
        let seed = crate::keyed::test_support::seed();
        let run = || {
            let mut rng = crate::keyed::test_support::Rng(seed);
            for _ in 0..50 {
                against_a_model(rng.next());
            }
        };
        if std::panic::catch_unwind(run).is_err() {
            panic!("the change log's model check failed; replay with SNAPFLOW_SEED={seed}");
        }
    }

    #[test]
    fn an_invalidated_log_misses_what_came_before() {
        let mut log = ChangeLog::new(10, 1_000);
        log.take();
        log.record(b"a", b"1");
        log.invalidate();
        log.record(b"b", b"1");
        assert!(log.take().is_none());
    }
}
