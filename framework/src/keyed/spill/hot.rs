//! [`HotGroups`]: the in-memory ("hot") entries of a spilling snapshot's
//! key groups, as the snapshot overlays them on its disk table's entries.
//!
//! This module owns how a snapshot holds the hot entries (frozen
//! copy-on-write tables, [`Frozen`], or already encoded ones,
//! [`Encoded`]) and encoding one key group of them into its disk form,
//! sorted by key. It never reads the disk table, never builds a part and
//! never chooses the key groups.
//!
//! # Why an overlay, and its cost
//!
//! A spilling snapshot used to write every hot entry of its key groups
//! back to the disk table on the operator's thread (137 ms at p50 for
//! 100,000 entries: BENCHMARKS.md). Instead [`Frozen`] takes the key
//! groups' copy-on-write tables ([`crate::keyed::cow`]) in constant time
//! per slice, and the checkpoint writer encodes one key group of them at
//! a time, on its own thread, when it builds that group's part. The
//! encoded group (its entries' keys and payloads in one buffer) is the
//! only extra memory besides the copies the operator makes of the slices
//! it writes while the snapshot still holds them.

use std::collections::VecDeque;

use super::evict::Clocked;
use super::order::{sort_prefixed, Prefixed};
use super::SpillError;
use crate::keyed::cow::GroupSlices;
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
            let start = hot.bytes.len();
            encode_key(key_group, key, &mut hot.bytes)?;
            let key_end = hot.bytes.len();
            state.encode_payload(&mut hot.bytes)?;
            // Every key starts with the same key group (4 bytes), so they
            // are compared from the bytes after it.
            let entry = (start, key_end, hot.bytes.len());
            hot.entries
                .push(Prefixed::new(&hot.bytes[start + 4..key_end], entry));
        }
        let bytes = &hot.bytes;
        // Keys are distinct (one table entry each), so the order is total
        // without a tie break.
        sort_prefixed(
            &mut hot.entries,
            |&(start, key_end, _)| &bytes[start + 4..key_end],
            |_, _| std::cmp::Ordering::Equal,
        );
        Ok(hot)
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

/// Key groups' copy-on-write slice tables as a snapshot froze them: the
/// operator's writes after the freeze copy a slice instead of changing it
/// ([`crate::keyed::cow`]), so these stay as they were. Each group's
/// tables are dropped as soon as it is encoded, so the operator takes a
/// group the writer has passed back without a copy.
/// Each entry's reference bit (`evict.rs`) is ignored: a snapshot holds
/// the states; its write stamp picks a delta part's entries.
pub(crate) struct Frozen<K, S> {
    groups: VecDeque<(u32, GroupSlices<K, Clocked<S>>)>,
}

impl<K, S> Frozen<K, S> {
    /// `groups`, ascending by key group.
    pub(crate) fn new(groups: Vec<(u32, GroupSlices<K, Clocked<S>>)>) -> Self {
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
        let entries = slices
            .iter()
            .flat_map(|table| table.iter())
            .filter(|(_, entry)| written_for.map_or(true, |stamp| entry.written_for == stamp))
            .map(|(key, entry)| (key, &entry.state));
        // `slices` drops as this returns.
        HotEntries::encode(key_group, entries)
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
