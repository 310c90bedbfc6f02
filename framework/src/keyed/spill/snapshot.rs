//! [`SpillSnapshot`]: a snapshot of the spilling backend that yields its
//! key groups' parts one at a time, reading the store through a fjall MVCC
//! snapshot while the operator goes on writing.
//!
//! This module owns the streaming half of a spilling snapshot: the view of
//! the store, the list of key groups still to yield, and building each
//! part in [`crate::keyed::part`]'s format. It never writes to the store,
//! never chooses the key groups and never writes a part anywhere: the
//! caller (the checkpoint writer, or [`SpillSnapshot::collect_parts`] for
//! the synchronous path) does.
//!
//! # The bound
//!
//! Taking the snapshot ([`super::SpillingState::snapshot`]) costs, on the
//! operator's thread, the write-back of the in-memory entries of the
//! requested key groups (at most the memory budget) and a constant-time
//! fjall snapshot. While it is alive, fjall keeps the versions it sees
//! through compactions (disk, not memory), and the snapshot holds at most
//! one part in memory at a time. State that never left memory has no
//! store: its parts are built at once and held until they are yielded
//! (bounded by the memory budget too).

use std::collections::VecDeque;

use super::disk::DiskSnapshot;
use super::SpillError;
use crate::keyed::backend::KeyGroupPart;
use crate::keyed::key_group::MaxParallelism;
use crate::keyed::part::PartWriter;

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The parts of some key groups of a [`super::SpillingState`] as they were
/// when it was taken, yielded in ascending key-group order by
/// [`Self::next_part`]. It is `Send`: it may be read on another thread
/// while the state goes on changing.
pub struct SpillSnapshot {
    source: Source,
}

/// Where the parts come from.
enum Source {
    /// Built when the snapshot was taken (the state never spilled).
    Built(VecDeque<KeyGroupPart>),
    /// Read from the store's view, one key group per call.
    Store {
        view: DiskSnapshot,
        /// The key groups still to yield, ascending.
        key_groups: VecDeque<u32>,
        /// The part's schema section, the same for every key group.
        schema: Vec<u8>,
        max_parallelism: MaxParallelism,
    },
}

impl std::fmt::Debug for SpillSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillSnapshot")
            .field("parts_left", &self.parts_left())
            .finish()
    }
}

impl SpillSnapshot {
    /// A snapshot whose parts are already built, ascending.
    pub(super) fn built(parts: Vec<KeyGroupPart>) -> Self {
        SpillSnapshot {
            source: Source::Built(parts.into()),
        }
    }

    /// A snapshot reading `key_groups` (ascending) from `view`.
    pub(super) fn from_store(
        view: DiskSnapshot,
        key_groups: Vec<u32>,
        schema: Vec<u8>,
        max_parallelism: MaxParallelism,
    ) -> Self {
        SpillSnapshot {
            source: Source::Store {
                view,
                key_groups: key_groups.into(),
                schema,
                max_parallelism,
            },
        }
    }

    /// How many parts are still to come.
    pub fn parts_left(&self) -> usize {
        match &self.source {
            Source::Built(parts) => parts.len(),
            Source::Store { key_groups, .. } => key_groups.len(),
        }
    }

    /// The next key group's part, ascending, or `None` when every part was
    /// yielded. A part that fails (the store could not be read) is an
    /// error; the key group is not retried.
    pub fn next_part(&mut self) -> Option<Result<KeyGroupPart, BoxError>> {
        self.next_spill_part()
            .map(|part| part.map_err(BoxError::from))
    }

    /// Every part still to come, ascending: the synchronous path.
    pub fn collect_parts(mut self) -> Result<Vec<KeyGroupPart>, SpillError> {
        let mut parts = Vec::with_capacity(self.parts_left());
        while let Some(part) = self.next_spill_part() {
            parts.push(part?);
        }
        Ok(parts)
    }

    fn next_spill_part(&mut self) -> Option<Result<KeyGroupPart, SpillError>> {
        match &mut self.source {
            Source::Built(parts) => parts.pop_front().map(Ok),
            Source::Store {
                view,
                key_groups,
                schema,
                max_parallelism,
            } => {
                let key_group = key_groups.pop_front()?;
                Some(read_part(view, key_group, schema, *max_parallelism))
            }
        }
    }
}

/// `key_group`'s part, its entries read from `view` in key order.
fn read_part(
    view: &DiskSnapshot,
    key_group: u32,
    schema: &[u8],
    max_parallelism: MaxParallelism,
) -> Result<KeyGroupPart, SpillError> {
    let mut writer = PartWriter::new(schema);
    view.scan_key_group(key_group, |key, payload| {
        Ok(writer.push_encoded(&key[4..], payload)?)
    })?;
    Ok(KeyGroupPart {
        key_group,
        bytes: writer.finish(max_parallelism, key_group),
    })
}

/// The checkpoint writer pulls a spilling snapshot's parts one at a time,
/// on its own thread, exactly as it pulls a copy-on-write hand-off's.
impl crate::keyed::deferred::DeferredParts for SpillSnapshot {
    fn next_part(&mut self) -> Option<Result<KeyGroupPart, BoxError>> {
        SpillSnapshot::next_part(self)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::keyed::backend::KeyedState;
    use crate::keyed::key_group::KeyGroupRange;
    use crate::keyed::spill::state::tests::{
        self as state_tests, memory, owned_keys, spilling, MAX,
    };
    use crate::keyed::spill::SpillingState;
    use crate::keyed::store::KeyGroupSnapshots;
    use crate::keyed::test_support::Count;

    fn range() -> KeyGroupRange {
        state_tests::range(2, 1)
    }

    /// Adds `key + 1 + round` to each key's count in both backends.
    fn touch(
        spilled: &mut SpillingState<u64, Count>,
        plain: &mut KeyedState<u64, Count>,
        keys: &[u64],
        round: u64,
    ) {
        for key in keys {
            spilled.get_or_default(key).unwrap().count += key + 1 + round;
            plain.get_or_default(key).count += key + 1 + round;
            spilled.enforce_budget().unwrap();
        }
    }

    /// The parts the spilling backend must write for `plain`'s key groups
    /// that `include` picks: its format with each group's entries in the
    /// order of their encoded keys (the store's order), built here
    /// independently of the store.
    fn expected_parts(
        plain: &KeyedState<u64, Count>,
        include: impl Fn(u32) -> bool,
    ) -> Vec<KeyGroupPart> {
        let mut groups: BTreeMap<u32, BTreeMap<Vec<u8>, &Count>> = range()
            .iter()
            .filter(|key_group| include(*key_group))
            .map(|key_group| (key_group, BTreeMap::new()))
            .collect();
        for (key, count) in plain.iter() {
            if let Some(group) = groups.get_mut(&plain.key_group_of(key)) {
                group.insert(postcard::to_allocvec(key).unwrap(), count);
            }
        }
        let schema = crate::keyed::part::schema_section::<Count>().unwrap();
        groups
            .into_iter()
            .map(|(key_group, entries)| {
                let mut writer = PartWriter::new(&schema);
                let mut payload = Vec::new();
                for (key, count) in entries {
                    payload.clear();
                    crate::state::Snapshot::encode_payload(count, &mut payload).unwrap();
                    writer.push_encoded(&key, &payload).unwrap();
                }
                KeyGroupPart {
                    key_group,
                    bytes: writer.finish(MaxParallelism::new(MAX).unwrap(), key_group),
                }
            })
            .collect()
    }

    fn drain(mut snapshot: SpillSnapshot) -> Vec<KeyGroupPart> {
        let mut parts = Vec::new();
        while let Some(part) = snapshot.next_part() {
            parts.push(part.unwrap());
        }
        parts
    }

    #[test]
    fn a_snapshot_is_send() {
        fn send<T: Send + 'static>() {}
        send::<SpillSnapshot>();
    }

    #[test]
    fn the_parts_equal_the_synchronous_paths_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spilled, mut plain) = (spilling(dir.path(), 8), memory());
        let keys = owned_keys(300);
        touch(&mut spilled, &mut plain, &keys, 0);
        touch(&mut spilled, &mut plain, &keys[..100], 1);
        let want = expected_parts(&plain, |_| true);
        let streamed = spilled.snapshot(&mut |_| true).unwrap();
        assert_eq!(streamed.parts_left(), range().len());
        assert_eq!(drain(streamed), want);
        assert_eq!(spilled.snapshot_parts().unwrap(), want);
        assert_eq!(spilled.parts_of(&mut |_| true).unwrap(), want);
    }

    #[test]
    fn writes_after_the_snapshot_stay_out_of_it_even_read_on_another_thread() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spilled, mut plain) = (spilling(dir.path(), 8), memory());
        let keys = owned_keys(400);
        touch(&mut spilled, &mut plain, &keys[..300], 0);
        let want = expected_parts(&plain, |_| true);
        let mut snapshot = spilled.snapshot(&mut |_| true).unwrap();
        let first = snapshot.next_part().unwrap().unwrap();
        // Changes to keys on disk and in memory, new keys and evictions
        // after the snapshot: the rest of its parts must not see them.
        touch(&mut spilled, &mut plain, &keys, 7);
        let reader = std::thread::spawn(move || drain(snapshot));
        // And more while the other thread reads.
        touch(&mut spilled, &mut plain, &keys, 9);
        let mut got = vec![first];
        got.extend(reader.join().unwrap());
        assert_eq!(got, want);
        // The state itself has every change.
        assert_eq!(
            spilled.snapshot_parts().unwrap(),
            expected_parts(&plain, |_| true)
        );
    }

    #[test]
    fn only_the_requested_key_groups_are_yielded_ascending() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spilled, mut plain) = (spilling(dir.path(), 8), memory());
        let keys = owned_keys(200);
        touch(&mut spilled, &mut plain, &keys, 0);
        spilled.forget_changes();
        touch(&mut spilled, &mut plain, &keys[..3], 1);
        let changed = spilled.changed_key_groups();
        assert!(!changed.is_empty() && changed.len() < range().len());
        let picked = |key_group: u32| changed.contains(&key_group);
        let parts = drain(
            spilled
                .snapshot(&mut |key_group| picked(key_group))
                .unwrap(),
        );
        assert_eq!(
            parts.iter().map(|part| part.key_group).collect::<Vec<_>>(),
            changed
        );
        assert_eq!(parts, expected_parts(&plain, picked));
    }

    #[test]
    fn state_that_never_spilled_is_yielded_as_the_in_memory_backend_writes_it() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spilled, mut plain) = (spilling(dir.path(), 1_000), memory());
        touch(&mut spilled, &mut plain, &owned_keys(50), 0);
        let snapshot = spilled
            .snapshot(&mut |key_group| key_group % 2 == 1)
            .unwrap();
        assert_eq!(
            drain(snapshot),
            plain
                .snapshot_key_groups(|key_group| key_group % 2 == 1)
                .unwrap()
        );
        assert!(!dir.path().join("instance").exists());
    }
}
