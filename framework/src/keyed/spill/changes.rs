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
//! past either marks the log incomplete and frees it: the next snapshot
//! then reads the disk table as before, and logging starts again after it.
//! So a long checkpoint interval under many writes costs the old, slower
//! snapshot, never unbounded memory.

/// One entry's key and value, borrowed.
pub(crate) type EntryRef<'a> = (&'a [u8], &'a [u8]);

/// One change's key and its new value, or `None` for a deletion.
pub(crate) type ChangeRef<'a> = (&'a [u8], Option<&'a [u8]>);

/// The value length that marks a record as a deletion: no value that the
/// log accepts is this long (a value must fit below it).
const TOMBSTONE: u32 = u32::MAX;

/// The bytes of one record's header: the key's and the value's lengths.
const HEADER_LEN: usize = 8;

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
    /// False until the first [`Self::take`], after an overflow and after
    /// [`Self::invalidate`]: the log then misses changes and records none.
    complete: bool,
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
        }
    }

    /// Records that `key` now holds `value` on disk. Past the bound the log
    /// becomes incomplete and frees its memory.
    pub(crate) fn record(&mut self, key: &[u8], value: &[u8]) {
        self.append(key, Some(value));
    }

    /// Records that `key` was deleted from disk.
    pub(crate) fn record_deletion(&mut self, key: &[u8]) {
        self.append(key, None);
    }

    fn append(&mut self, key: &[u8], value: Option<&[u8]>) {
        if !self.complete {
            return;
        }
        let value_len = value.map_or(0, <[u8]>::len);
        let record_len = HEADER_LEN + key.len() + value_len;
        // A value must stay below the tombstone's length.
        let too_long = u32::try_from(key.len()).is_err()
            || u32::try_from(value_len).map_or(true, |len| len == TOMBSTONE);
        if too_long
            || self.starts.len() >= self.limit_entries
            || self.bytes.len() + record_len > self.limit_bytes
        {
            self.invalidate();
            return;
        }
        self.starts.push(self.bytes.len());
        // Both fit a u32 (checked above).
        let value_word = value.map_or(TOMBSTONE, |value| value.len() as u32);
        self.bytes
            .extend_from_slice(&(key.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(&value_word.to_le_bytes());
        self.bytes.extend_from_slice(key);
        if let Some(value) = value {
            self.bytes.extend_from_slice(value);
        }
    }

    /// Forgets every change and records none until the next
    /// [`Self::take`]: for a restore, which replaces the disk table.
    pub(crate) fn invalidate(&mut self) {
        self.complete = false;
        self.bytes = Vec::new();
        self.starts = Vec::new();
    }

    /// How many entries are logged now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.starts.len()
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
        let Changes { bytes, mut starts } = self;
        // Stable, so the later of two writes of one key stays later.
        starts.sort_by(|a, b| record(&bytes, *a).0.cmp(record(&bytes, *b).0));
        let mut newest: Vec<usize> = Vec::with_capacity(starts.len());
        for start in starts {
            match newest.last_mut() {
                Some(last) if record(&bytes, *last).0 == record(&bytes, start).0 => *last = start,
                _ => newest.push(start),
            }
        }
        SortedChanges {
            bytes,
            starts: newest,
            next: 0,
        }
    }
}

/// The key and value (`None` for a deletion) of the record at `start` in
/// `bytes`.
fn record(bytes: &[u8], start: usize) -> ChangeRef<'_> {
    let word = |at: usize| {
        let mut word = [0; 4];
        word.copy_from_slice(&bytes[at..at + 4]);
        u32::from_le_bytes(word)
    };
    let (key_len, value_word) = (word(start) as usize, word(start + 4));
    let key_at = start + HEADER_LEN;
    let value_at = key_at + key_len;
    let value = (value_word != TOMBSTONE).then(|| &bytes[value_at..value_at + value_word as usize]);
    (&bytes[key_at..value_at], value)
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

    /// Moves past the entry [`Self::peek`] shows.
    pub(crate) fn advance(&mut self) {
        self.next += 1;
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

    #[test]
    fn a_deletion_is_a_tombstone_that_the_newest_record_of_its_key_decides() {
        let mut log = ChangeLog::new(10, 1_000);
        log.take();
        log.record(b"a", b"1");
        log.record_deletion(b"a");
        log.record_deletion(b"b");
        log.record(b"b", b"");
        log.record_deletion(b"c");
        let mut sorted = log.take().unwrap().sorted();
        let mut out = Vec::new();
        while let Some((key, value)) = sorted.peek() {
            out.push((key.to_vec(), value.map(<[u8]>::to_vec)));
            sorted.advance();
        }
        assert_eq!(
            out,
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
    fn an_invalidated_log_misses_what_came_before() {
        let mut log = ChangeLog::new(10, 1_000);
        log.take();
        log.record(b"a", b"1");
        log.invalidate();
        log.record(b"b", b"1");
        assert!(log.take().is_none());
    }
}
