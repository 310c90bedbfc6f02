//! [`HotGroups`]: the in-memory ("hot") entries of a spilling snapshot's
//! key groups, as the snapshot overlays them on its disk table's entries.
//!
//! This module owns how a snapshot holds the hot entries (frozen slices,
//! [`Frozen`], or already encoded ones, [`Encoded`]), what the operator
//! encodes of a frozen slice at its first write ([`encode_frozen_slice`])
//! and encoding one key group of them into its disk form, sorted by key.
//! It never reads the disk table, never builds a part and never chooses
//! the key groups.
//!
//! # Why an overlay, and its cost
//!
//! A spilling snapshot used to write every hot entry of its key groups
//! back to the disk table on the operator's thread (137 ms at p50 for
//! 100,000 entries: BENCHMARKS.md at 07a44e5). Instead [`Frozen`] takes the key
//! groups' slice tables weakly ([`crate::keyed::cow`]'s frozen slices) in
//! constant time per slice, and the checkpoint writer encodes one key
//! group of them at a time, on its own thread, when it builds that
//! group's part. A slice the operator writes first is encoded by the
//! operator, only the entries the snapshot takes of it, and taken back
//! without a copy. The extra memory is those encodings (at most one of
//! each frozen slice, about a third of its table for a whole part and
//! less for a delta's) and the encoded group being built (its entries'
//! keys and payloads in one buffer).

use std::collections::VecDeque;

use super::evict::Clocked;
use super::order::{sort_prefixed, Prefixed};
use super::SpillError;
use crate::keyed::cow::{EncodeScope, EncodedEntries, FrozenRead, FrozenSlices};
use crate::keyed::slice_table::{prefetch_scan_ahead, SliceTable};
use crate::keyed::StateKey;
use crate::state::append_postcard;
use crate::state::{Snapshot, StateError};

/// The hot entries of some key groups, handed out one key group at a time,
/// ascending. `Send`: the checkpoint writer reads them on its thread.
pub(crate) trait HotGroups: Send {
    /// The hot entries of `key_group`, sorted by their disk keys; empty
    /// for a group this holds nothing of. With `written_for`, only the
    /// entries written for the snapshot of that stamp
    /// ([`super::evict::stamp`]; a superset of them is allowed: a holder
    /// of encoded entries gives them all). Key groups must be asked for in
    /// ascending order; what is held of an earlier group is dropped.
    fn group(&mut self, key_group: u32, written_for: Option<u32>)
        -> Result<HotEntries, SpillError>;
}

/// One key group's hot entries in their disk form (the key: its key group
/// big-endian, then postcard; the value: the state's payload), ascending by
/// key, in one buffer.
#[derive(Debug, Default)]
pub(crate) struct HotEntries {
    bytes: Vec<u8>,
    /// `(start of the key, end of the key, end of the value)` in `bytes`,
    /// sorted by key, each with its key's prefix after the key group
    /// (`order.rs`: the sort then seldom reads `bytes`).
    entries: Vec<Prefixed<(usize, usize, usize)>>,
}

impl HotEntries {
    /// Encodes `entries` of `key_group` and sorts them by key.
    pub(crate) fn encode<'a, K: StateKey, S: Snapshot + 'a>(
        key_group: u32,
        entries: impl Iterator<Item = (&'a K, &'a S)>,
    ) -> Result<Self, SpillError> {
        let mut hot = HotEntries::default();
        for (key, state) in entries {
            hot.push(key_group, key, state)?;
        }
        hot.sort();
        Ok(hot)
    }

    /// Appends one entry of `key_group`, unsorted.
    fn push<K: StateKey, S: Snapshot>(
        &mut self,
        key_group: u32,
        key: &K,
        state: &S,
    ) -> Result<(), SpillError> {
        let start = self.bytes.len();
        encode_key(key_group, key, &mut self.bytes)?;
        let key_end = self.bytes.len();
        state.encode_payload(&mut self.bytes)?;
        self.index(start, key_end, self.bytes.len());
        Ok(())
    }

    /// Indexes the entry whose key is `bytes[start..key_end]` and whose
    /// value runs to `end`.
    fn index(&mut self, start: usize, key_end: usize, end: usize) {
        // Every key starts with the same key group (4 bytes), so they are
        // compared from the bytes after it.
        self.entries.push(Prefixed::new(
            &self.bytes[start + 4..key_end],
            (start, key_end, end),
        ));
    }

    /// Makes room for the entries of the encoded ones of `slices` at once:
    /// growing by doubling copied them again (a tenth of the checkpoint
    /// writer's CPU at 10 M keys: BENCHMARKS.md at 07a44e5, "Fewer whole reads").
    fn reserve_framed<K, S>(&mut self, slices: &FrozenSlices<K, S>) {
        let (mut bytes, mut entries) = (0, 0);
        for slice in slices {
            if let Some(Ok(encoded)) = slice.encoded() {
                bytes += encoded.bytes.len();
                entries += encoded.entries as usize;
            }
        }
        self.bytes.reserve(bytes);
        self.entries.reserve(entries);
    }

    /// Appends the entries of a slice encoded by [`encode_frozen_slice`],
    /// unsorted.
    fn extend_framed(&mut self, framed: &[u8]) -> Result<(), SpillError> {
        let offset = self.bytes.len();
        self.bytes.extend_from_slice(framed);
        let mut at = 0;
        while at < framed.len() {
            let lengths = framed
                .get(at..at + FRAME_LEN)
                .ok_or_else(|| bad_frame(at))?;
            let key_len = u32::from_le_bytes(lengths[..4].try_into().expect("4 bytes"));
            let value_len = u32::from_le_bytes(lengths[4..].try_into().expect("4 bytes"));
            let start = at + FRAME_LEN;
            let key_end = start + key_len as usize;
            let end = key_end + value_len as usize;
            if key_len < 4 || end > framed.len() {
                return Err(bad_frame(at));
            }
            self.index(offset + start, offset + key_end, offset + end);
            at = end;
        }
        Ok(())
    }

    /// Sorts the entries by key.
    fn sort(&mut self) {
        let bytes = &self.bytes;
        // Keys are distinct (one table entry each), so the order is total
        // without a tie break.
        sort_prefixed(
            &mut self.entries,
            |&(start, key_end, _)| &bytes[start + 4..key_end],
            |_, _| std::cmp::Ordering::Equal,
        );
    }

    /// How many entries there are.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The `index`-th entry's key and value, ascending by key.
    pub(crate) fn get(&self, index: usize) -> Option<(&[u8], &[u8])> {
        self.entries.get(index).map(|entry| {
            let (start, key_end, end) = entry.item;
            (&self.bytes[start..key_end], &self.bytes[key_end..end])
        })
    }
}

/// Appends the disk form of `key` of `key_group` to `out`: the key group
/// big-endian, then the key in postcard.
pub(crate) fn encode_key<K: serde::Serialize>(
    key_group: u32,
    key: &K,
    out: &mut Vec<u8>,
) -> Result<(), SpillError> {
    out.extend_from_slice(&key_group.to_be_bytes());
    append_postcard(key, out).map_err(|error| {
        SpillError::State(StateError::Encode {
            type_name: std::any::type_name::<K>(),
            reason: error.to_string(),
        })
    })
}

/// The length of a frame's lengths: the key's and the value's, `u32`
/// little-endian each.
const FRAME_LEN: usize = 8;

fn bad_frame(at: usize) -> SpillError {
    SpillError::Internal(format!("a frozen slice's encoding is cut at byte {at}"))
}

/// Encodes a frozen slice of the hot table at the operator's first write
/// to it while a snapshot still needs it ([`crate::keyed::cow`]'s
/// `FrozenSlot`): the entries the snapshot takes of it (of
/// `scope.key_group`, and with `scope.stamp` only those written for that
/// snapshot: a delta part's), each as its key's and value's lengths, then
/// its disk form, for [`HotEntries`] to index without decoding.
///
/// # Why, and its cost
///
/// A busy operator writes nearly every hot slice within milliseconds of a
/// snapshot, long before the writer reads it. Copying the slice then cost
/// the operator threads more than any other part of a checkpoint at
/// 10 M keys (`HashTable::clone` and its allocations: BENCHMARKS.md at 07a44e5), and
/// the writer read every hot entry again to find a delta's. Here the
/// operator reads the slice once, while it is about to write it anyway,
/// and keeps only what the snapshot needs: at 1 s checkpoints about one
/// entry in eight.
pub(crate) fn encode_frozen_slice<K: StateKey, S: Snapshot>(
    table: &SliceTable<K, Clocked<S>>,
    scope: EncodeScope,
) -> Result<EncodedEntries, String> {
    // Room for about a frame of 20 bytes per entry taken (a small key and
    // state), assuming a delta takes one entry in eight (1 s checkpoints
    // at 10 M keys); the buffer grows for more.
    let taken = match scope.stamp {
        Some(_) => table.len() / 8 + 1,
        None => table.len(),
    };
    let mut bytes = Vec::with_capacity(taken * 20);
    let mut entries = 0;
    for pair in table.iter() {
        prefetch_scan_ahead(pair);
        let (key, entry) = pair;
        if scope.stamp.is_some_and(|stamp| entry.written_for != stamp) {
            continue;
        }
        let frame = bytes.len();
        bytes.extend_from_slice(&[0; FRAME_LEN]);
        encode_key(scope.key_group, key, &mut bytes).map_err(|error| error.to_string())?;
        let key_end = bytes.len();
        entry
            .state
            .encode_payload(&mut bytes)
            .map_err(|error| error.to_string())?;
        let key_len = frame_length(key_end - frame - FRAME_LEN)?;
        let value_len = frame_length(bytes.len() - key_end)?;
        bytes[frame..frame + 4].copy_from_slice(&key_len.to_le_bytes());
        bytes[frame + 4..frame + FRAME_LEN].copy_from_slice(&value_len.to_le_bytes());
        entries += 1;
    }
    Ok(EncodedEntries { bytes, entries })
}

/// A key's or value's length in a frame.
fn frame_length(len: usize) -> Result<u32, String> {
    u32::try_from(len).map_err(|_| format!("a hot entry's key or value of {len} bytes"))
}

/// Key groups' hot slices as a snapshot froze them
/// ([`encode_frozen_slice`]): each is the table as it was, or the
/// entries the snapshot needs, encoded by the operator before its first
/// write after the freeze. Each group's references are dropped as soon
/// as it is encoded, so the operator takes a slice the writer has passed
/// back without encoding it. Each entry's reference bit (`evict.rs`) is
/// ignored: a snapshot holds the states; its write stamp picks a delta
/// part's entries.
pub(crate) struct Frozen<K, S> {
    groups: VecDeque<(u32, FrozenSlices<K, Clocked<S>>)>,
}

impl<K, S> Frozen<K, S> {
    /// `groups`, ascending by key group.
    pub(crate) fn new(groups: Vec<(u32, FrozenSlices<K, Clocked<S>>)>) -> Self {
        Frozen {
            groups: groups.into(),
        }
    }
}

impl<K, S> HotGroups for Frozen<K, S>
where
    K: StateKey + Send + Sync,
    S: Snapshot + Send + Sync,
{
    fn group(
        &mut self,
        key_group: u32,
        written_for: Option<u32>,
    ) -> Result<HotEntries, SpillError> {
        while self
            .groups
            .front()
            .is_some_and(|(group, _)| *group < key_group)
        {
            self.groups.pop_front();
        }
        match self.groups.front() {
            Some((group, _)) if *group == key_group => {}
            _ => return Ok(HotEntries::default()),
        }
        let Some((_, slices)) = self.groups.pop_front() else {
            return Ok(HotEntries::default());
        };
        let mut hot = HotEntries::default();
        hot.reserve_framed(&slices);
        for slice in &slices {
            match slice.read() {
                FrozenRead::Encoded(Ok(encoded)) => hot.extend_framed(&encoded.bytes)?,
                FrozenRead::Encoded(Err(reason)) => {
                    return Err(SpillError::State(StateError::Encode {
                        type_name: std::any::type_name::<S>(),
                        reason: reason.clone(),
                    }))
                }
                FrozenRead::Table(table) => {
                    let written = table.iter().filter(|(_, entry)| {
                        written_for.map_or(true, |stamp| entry.written_for == stamp)
                    });
                    for (key, entry) in written {
                        hot.push(key_group, key, &entry.state)?;
                    }
                }
            }
        }
        hot.sort();
        // `slices` drops as this returns.
        Ok(hot)
    }
}

/// Key groups' hot entries encoded already (on the operator's thread):
/// the synchronous path, for states that cannot be frozen (no `Clone`).
#[derive(Debug, Default)]
pub(crate) struct Encoded {
    groups: VecDeque<(u32, HotEntries)>,
}

impl Encoded {
    /// Adds `key_group`'s entries; groups must be added ascending.
    pub(crate) fn push(&mut self, key_group: u32, entries: HotEntries) {
        self.groups.push_back((key_group, entries));
    }
}

impl HotGroups for Encoded {
    /// Gives every entry of the group whatever `written_for` says (the
    /// keys are encoded already; a superset is allowed).
    fn group(
        &mut self,
        key_group: u32,
        _written_for: Option<u32>,
    ) -> Result<HotEntries, SpillError> {
        while self
            .groups
            .front()
            .is_some_and(|(group, _)| *group < key_group)
        {
            self.groups.pop_front();
        }
        match self.groups.front() {
            Some((group, _)) if *group == key_group => Ok(self
                .groups
                .pop_front()
                .map(|(_, entries)| entries)
                .unwrap_or_default()),
            _ => Ok(HotEntries::default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyed::test_support::Count;

    #[test]
    fn entries_are_encoded_in_disk_form_and_sorted_by_key() {
        let keys = [300_u64, 2, 70_000, 1];
        let counts: Vec<Count> = keys.iter().map(|key| Count { count: *key }).collect();
        let hot = HotEntries::encode(7, keys.iter().zip(&counts)).unwrap();
        assert_eq!(hot.len(), 4);
        let mut want: Vec<(Vec<u8>, Vec<u8>)> = keys
            .iter()
            .zip(&counts)
            .map(|(key, count)| {
                let mut disk_key = 7_u32.to_be_bytes().to_vec();
                disk_key.extend(postcard::to_allocvec(key).unwrap());
                let mut payload = Vec::new();
                count.encode_payload(&mut payload).unwrap();
                (disk_key, payload)
            })
            .collect();
        want.sort();
        let got: Vec<(Vec<u8>, Vec<u8>)> = (0..hot.len())
            .map(|index| {
                let (key, value) = hot.get(index).unwrap();
                (key.to_vec(), value.to_vec())
            })
            .collect();
        assert_eq!(got, want);
        assert!(hot.get(4).is_none());
    }

    #[test]
    fn groups_are_handed_out_ascending_and_skipped_ones_are_dropped() {
        let mut encoded = Encoded::default();
        for key_group in [2, 4, 6] {
            let key = u64::from(key_group);
            let count = Count { count: key };
            encoded.push(
                key_group,
                HotEntries::encode(key_group, std::iter::once((&key, &count))).unwrap(),
            );
        }
        assert_eq!(encoded.group(1, None).unwrap().len(), 0);
        assert_eq!(encoded.group(4, None).unwrap().len(), 1);
        // Group 2 was passed: it is gone.
        assert_eq!(encoded.group(5, None).unwrap().len(), 0);
        assert_eq!(encoded.group(6, None).unwrap().len(), 1);
        assert_eq!(encoded.group(6, None).unwrap().len(), 0);
    }
}
