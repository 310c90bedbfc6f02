//! Copy-on-write key groups: how
//! [`CowKeyedState`](super::cow_state::CowKeyedState) hands the tables of
//! some key groups to a snapshot in constant time per group, and copies a
//! group only when the operator writes it while a snapshot still holds it.
//!
//! This module owns one key group's table slot (`GroupTable`) and the
//! value a snapshot takes away ([`KeyGroupHandoff`]), which encodes its
//! groups into parts on whatever thread holds it. It never decides which
//! groups a snapshot takes (the caller's `include` does), never does I/O
//! and never talks to actors.
//!
//! # The rule, and the memory bound
//!
//! Handing a group off moves its table into an `Arc` (no entry is copied)
//! and keeps a second reference in the slot, which the operator may still
//! read. The first write to the group after that takes the table back:
//! without a copy when the snapshot has dropped it already
//! (`Arc::try_unwrap`), otherwise by cloning the group's table once. So
//! while a snapshot is being encoded the extra memory is at most one copy
//! of each handed-off group written meanwhile, never of the whole state,
//! and nothing written after the handoff can reach the snapshot: the
//! snapshot's tables are immutable behind their `Arc`s.
//!
//! A write checks one enum tag per access (no atomic operation); the
//! `Arc` is touched only at the first write of a shared group.

use std::sync::Arc;

use hashbrown::HashTable;

use super::deferred::{BoxError, DeferredParts, DeferredSlices};
use super::key_group::MaxParallelism;
use super::part;
use super::{KeyGroupPart, StateKey};
use crate::state::{Snapshot, StateError};

/// Copies a shared table: a plain function pointer, captured where
/// `S: Clone` is known, so that the write path needs no `Clone` bound.
type CopyTable<K, S> = fn(&HashTable<(K, S)>) -> HashTable<(K, S)>;

/// A key group's table as a snapshot holds it.
pub(crate) type SharedTable<K, S> = Arc<HashTable<(K, S)>>;

/// One key group's entries: owned by the state alone, or shared with a
/// snapshot that was handed them.
pub(crate) enum GroupTable<K, S> {
    /// Only the state holds the table: written in place.
    Owned(HashTable<(K, S)>),
    /// A snapshot may still hold the table: read in place, taken back (and
    /// copied if still held) at the first write.
    Shared(SharedTable<K, S>, CopyTable<K, S>),
}

impl<K, S> std::fmt::Debug for GroupTable<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GroupTable::Owned(table) => write!(f, "Owned({} entries)", table.len()),
            GroupTable::Shared(table, _) => write!(f, "Shared({} entries)", table.len()),
        }
    }
}

impl<K, S> Default for GroupTable<K, S> {
    fn default() -> Self {
        GroupTable::Owned(HashTable::new())
    }
}

impl<K, S> GroupTable<K, S> {
    /// The table, for reading.
    #[inline(always)]
    pub(crate) fn get(&self) -> &HashTable<(K, S)> {
        match self {
            GroupTable::Owned(table) => table,
            GroupTable::Shared(table, _) => table,
        }
    }

    /// The table, for writing; `copies` counts the tables copied because
    /// a snapshot still held them.
    #[inline(always)]
    pub(crate) fn get_mut(&mut self, copies: &mut u64) -> &mut HashTable<(K, S)> {
        if let GroupTable::Shared(..) = self {
            self.take_back(copies);
        }
        match self {
            GroupTable::Owned(table) => table,
            GroupTable::Shared(..) => unreachable!("taken back just above"),
        }
    }

    /// Makes a shared table owned again: moved back when no snapshot holds
    /// it any more, copied once otherwise.
    #[cold]
    #[inline(never)]
    fn take_back(&mut self, copies: &mut u64) {
        let GroupTable::Shared(shared, copy) = std::mem::take(self) else {
            return;
        };
        let table = Arc::try_unwrap(shared).unwrap_or_else(|still_held| {
            *copies += 1;
            copy(&still_held)
        });
        *self = GroupTable::Owned(table);
    }

    /// Whether a snapshot was handed this table and the state has not
    /// written it since.
    pub(crate) fn is_shared(&self) -> bool {
        matches!(self, GroupTable::Shared(..))
    }
}

impl<K: Clone, S: Clone> GroupTable<K, S> {
    /// A reference to the table for a snapshot, in constant time: the
    /// table moves behind an `Arc` (on its first handoff) and the slot
    /// keeps the other reference.
    pub(crate) fn share(&mut self) -> SharedTable<K, S> {
        if let GroupTable::Owned(table) = self {
            let table = Arc::new(std::mem::take(table));
            *self = GroupTable::Shared(table, HashTable::clone);
        }
        match self {
            GroupTable::Shared(table, _) => Arc::clone(table),
            GroupTable::Owned(_) => unreachable!("shared just above"),
        }
    }
}

/// The tables of one key group's slices, as a snapshot holds them, in
/// slice order.
pub(crate) type GroupSlices<K, S> = Vec<SharedTable<K, S>>;

/// Immutable key-group tables a snapshot took from a
/// [`CowKeyedState`](super::cow_state::CowKeyedState), to be encoded
/// later, on any thread: what the state holds after the handoff never
/// reaches them.
///
/// It encodes one group per [`Self::encode_next`] and drops its
/// reference to that group's table right after, so a group the operator
/// writes after the writer has passed it is taken back without a copy.
/// It is `Send` when the keys and states are `Send + Sync` (the state's
/// thread may read a shared table while another thread encodes it).
pub struct KeyGroupHandoff<K, S> {
    max_parallelism: MaxParallelism,
    /// `(key group, its slices' tables)`, ascending by key group, not yet
    /// encoded.
    groups: std::vec::IntoIter<(u32, GroupSlices<K, S>)>,
    /// The schema section every part starts with, computed at the first
    /// part.
    schema: Option<Vec<u8>>,
}

impl<K, S> std::fmt::Debug for KeyGroupHandoff<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyGroupHandoff")
            .field("max_parallelism", &self.max_parallelism)
            .field("key_groups", &self.groups.len())
            .field("entries", &self.entries())
            .finish()
    }
}

impl<K, S> KeyGroupHandoff<K, S> {
    pub(crate) fn new(
        max_parallelism: MaxParallelism,
        groups: Vec<(u32, GroupSlices<K, S>)>,
    ) -> Self {
        KeyGroupHandoff {
            max_parallelism,
            groups: groups.into_iter(),
            schema: None,
        }
    }

    /// The key groups handed off and not yet encoded, ascending.
    pub fn key_groups(&self) -> impl Iterator<Item = u32> + '_ {
        self.groups
            .as_slice()
            .iter()
            .map(|(key_group, _)| *key_group)
    }

    /// How many (key, state) entries the groups not yet encoded hold.
    pub fn entries(&self) -> usize {
        self.groups
            .as_slice()
            .iter()
            .flat_map(|(_, slices)| slices.iter().map(|table| table.len()))
            .sum()
    }
}

impl<K: StateKey, S: Snapshot> KeyGroupHandoff<K, S> {
    /// Encodes the next group as a part, checked (its header must decode
    /// and name its group and exactly the entries of the table it came
    /// from); `None` after the last.
    ///
    /// # Errors
    ///
    /// A key or state that does not encode, or a part that fails its check.
    pub fn encode_next(&mut self) -> Option<Result<KeyGroupPart, StateError>> {
        let (key_group, slices) = self.groups.next()?;
        let schema = match &self.schema {
            Some(schema) => schema,
            None => match part::schema_section::<S>() {
                Ok(schema) => self.schema.insert(schema),
                Err(error) => return Some(Err(error)),
            },
        };
        let bytes = part::encode_tables(
            slices.iter().map(|table| &**table),
            schema,
            self.max_parallelism,
            key_group,
        );
        // `slices` drops here: the state may take the group back uncopied.
        Some(bytes.map(|bytes| KeyGroupPart { key_group, bytes }))
    }

    /// Encodes every remaining group, ascending by key group: the parts
    /// [`Self::encode_next`] gives one by one.
    ///
    /// # Errors
    ///
    /// As [`Self::encode_next`].
    pub fn encode(mut self) -> Result<Vec<KeyGroupPart>, StateError> {
        std::iter::from_fn(|| self.encode_next()).collect()
    }
}

impl<K, S> DeferredParts for KeyGroupHandoff<K, S>
where
    K: StateKey + Send + Sync,
    S: Snapshot + Send + Sync,
{
    fn next_part(&mut self) -> Option<Result<KeyGroupPart, BoxError>> {
        self.encode_next()
            .map(|part| part.map_err(|error| Box::new(error) as BoxError))
    }
}

/// One key group of a [`SliceHandoff`]: the tables of the slices a
/// snapshot writes again, and how many entries the others (referred to in
/// earlier checkpoints) hold.
pub(crate) struct HandedGroup<K, S> {
    pub(crate) key_group: u32,
    /// `(slice, its table)` of the slices written again, ascending.
    pub(crate) fresh: Vec<(u32, SharedTable<K, S>)>,
    /// The entries of the slices not written again, read from their
    /// tables at the handoff: unchanged since they were written, so the
    /// same count as in the bytes referred to.
    pub(crate) reused_entries: u64,
}

/// What [`SliceHandoff`] (and the flat state's `KeyedState::encode_slices`)
/// gives per key group: room for the part's header
/// ([`part::PART_HEADER_LEN`] zero bytes, filled in by the caller once it
/// knows the body's CRC), then the fresh slices' entries encoded one
/// after the other, in slice order, with the schema section in front of
/// slice 0's when slice 0 is among them (a part's schema belongs to its
/// first slice's bytes, see [`super::cow_state`]'s "Slices").
#[derive(Debug)]
pub(crate) struct EncodedSlices {
    pub(crate) key_group: u32,
    /// The header's room, then the fresh slices' bytes, back to back.
    pub(crate) bytes: Vec<u8>,
    /// `(slice, end of its bytes in `bytes`, its entries)`, ascending.
    pub(crate) slices: Vec<(u32, usize, u64)>,
    /// As [`HandedGroup::reused_entries`].
    pub(crate) reused_entries: u64,
    /// The schema section's length, for the part's header.
    pub(crate) schema_len: u32,
    /// The job's max parallelism, for the part's header.
    pub(crate) max_parallelism: MaxParallelism,
}

/// The slices of key groups an incremental snapshot of a
/// [`CowKeyedState`](super::cow_state::CowKeyedState) writes again, taken
/// in constant time per slice and encoded later, on any thread, one key
/// group per [`Self::encode_next`]; the same copy-on-write rule as
/// [`KeyGroupHandoff`] holds per slice.
pub(crate) struct SliceHandoff<K, S> {
    max_parallelism: MaxParallelism,
    groups: std::vec::IntoIter<HandedGroup<K, S>>,
    schema: Option<Vec<u8>>,
}

impl<K, S> SliceHandoff<K, S> {
    /// `groups`, ascending by key group: every key group of the state's
    /// range, each with the slices it writes.
    pub(crate) fn new(max_parallelism: MaxParallelism, groups: Vec<HandedGroup<K, S>>) -> Self {
        SliceHandoff {
            max_parallelism,
            groups: groups.into_iter(),
            schema: None,
        }
    }
}

impl<K: StateKey, S: Snapshot> SliceHandoff<K, S> {
    /// Encodes the next key group's fresh slices; `None` after the last.
    ///
    /// # Errors
    ///
    /// A key or state that does not encode, or a slice whose table
    /// length disagrees with the entries encoded.
    pub(crate) fn encode_next(&mut self) -> Option<Result<EncodedSlices, StateError>> {
        let group = self.groups.next()?;
        let schema = match &self.schema {
            Some(schema) => schema,
            None => match part::schema_section::<S>() {
                Ok(schema) => self.schema.insert(schema),
                Err(error) => return Some(Err(error)),
            },
        };
        Some(encode_slices(group, schema, self.max_parallelism))
    }
}

/// Encodes one key group's fresh slices back to back (see
/// [`EncodedSlices`]); the tables drop as it returns.
fn encode_slices<K: StateKey, S: Snapshot>(
    group: HandedGroup<K, S>,
    schema: &[u8],
    max_parallelism: MaxParallelism,
) -> Result<EncodedSlices, StateError> {
    let fresh = group.fresh.iter().map(|(slice, table)| {
        let entries = table.iter().map(|(key, state)| (key, state));
        (*slice, entries)
    });
    encode_group_slices(
        group.key_group,
        fresh,
        group.reused_entries,
        schema,
        max_parallelism,
    )
}

/// Encodes the fresh slices of `key_group`, each given as its number and
/// its entries, ascending by slice, back to back into an
/// [`EncodedSlices`] (header room first, the schema section in front of
/// slice 0's entries); `reused_entries` counts the entries of the slices
/// not written again. The one encoding of sliced parts, shared by the
/// copy-on-write hand-off and the flat state's synchronous snapshot
/// (`KeyedState::encode_slices`), so both write the same bytes for the
/// same entries in the same order.
///
/// # Errors
///
/// A key or state that does not encode, or a slice whose entries'
/// iterator yielded another number of entries than its length said.
pub(crate) fn encode_group_slices<'a, K, S, E>(
    key_group: u32,
    fresh: impl IntoIterator<Item = (u32, E)>,
    reused_entries: u64,
    schema: &[u8],
    max_parallelism: MaxParallelism,
) -> Result<EncodedSlices, StateError>
where
    K: StateKey + 'a,
    S: Snapshot + 'a,
    E: ExactSizeIterator<Item = (&'a K, &'a S)>,
{
    let mut bytes = vec![0; part::PART_HEADER_LEN];
    let mut slices = Vec::new();
    for (slice, entries) in fresh {
        if slice == 0 {
            bytes.extend_from_slice(schema);
        }
        let expected = entries.len() as u64;
        let mut writer = part::PartWriter::entries_into(bytes);
        for (key, state) in entries {
            writer.push(key, state)?;
        }
        let (out, written) = writer.into_entries();
        bytes = out;
        if written != expected {
            return Err(StateError::Encode {
                type_name: S::SCHEMA.type_name,
                reason: format!(
                    "slice {slice} of key group {key_group} encoded {written} entries; it held \
                     {expected}"
                ),
            });
        }
        slices.push((slice, bytes.len(), written));
    }
    Ok(EncodedSlices {
        key_group,
        bytes,
        slices,
        reused_entries,
        // `schema_section` refused anything over MAX_SCHEMA_LEN.
        schema_len: schema.len() as u32,
        max_parallelism,
    })
}

impl<K, S> DeferredSlices for SliceHandoff<K, S>
where
    K: StateKey + Send + Sync,
    S: Snapshot + Send + Sync,
{
    fn next_group(&mut self) -> Option<Result<EncodedSlices, BoxError>> {
        self.encode_next()
            .map(|group| group.map_err(|error| Box::new(error) as BoxError))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::keyed::cow_state::CowKeyedState;
    use crate::keyed::test_support::{seed, Count, Rng};
    use crate::keyed::{KeyedState, MaxParallelism, SLICES_PER_KEY_GROUP};

    type Model = BTreeMap<u64, u64>;

    fn state() -> CowKeyedState<u64, Count> {
        CowKeyedState::for_subtask(MaxParallelism::new(32).unwrap(), 2, 1).unwrap()
    }

    /// One random operation on `state` and on `model` alike; returns the
    /// slot (slice) it wrote, if any.
    fn random_op(
        rng: &mut Rng,
        keys: &[u64],
        state: &mut CowKeyedState<u64, Count>,
        model: &mut Model,
    ) -> Option<usize> {
        let key = keys[rng.below(keys.len() as u64) as usize];
        let slot = state.slot_of(&key).expect("an owned key");
        match rng.below(10) {
            0 => {
                let removed = state.remove(&key).map(|count| count.count);
                assert_eq!(removed, model.remove(&key));
                // A removal of an absent key writes nothing.
                removed.map(|_| slot)
            }
            1 => {
                let value = rng.below(1_000);
                state.insert(key, Count { count: value }).unwrap();
                model.insert(key, value);
                Some(slot)
            }
            2 => {
                let read = state.get(&key).map(|count| count.count);
                assert_eq!(read, model.get(&key).copied());
                None
            }
            _ => {
                state.get_or_default(&key).count += 1;
                *model.entry(key).or_default() += 1;
                Some(slot)
            }
        }
    }

    /// The entries of the parts, decoded, by key.
    fn decode(parts: &[KeyGroupPart], range: crate::keyed::KeyGroupRange) -> Model {
        let decoded: KeyedState<u64, Count> = KeyedState::restore(
            MaxParallelism::new(32).unwrap(),
            range,
            parts
                .iter()
                .map(|part| (part.key_group, part.bytes.clone())),
        )
        .unwrap();
        decoded
            .iter()
            .map(|(key, count)| (*key, count.count))
            .collect()
    }

    /// Handoffs at random moments of a random workload: each encodes
    /// exactly the state its groups had at the handoff, whatever was
    /// written afterwards, and the tables copied are exactly the handed-off
    /// groups written while the handoff was held.
    fn check_copy_on_write(seed: u64) {
        let mut rng = Rng(seed);
        let mut state = state();
        let keys: Vec<u64> = (0..4_000u64)
            .filter(|key| state.owns(key))
            .take(600)
            .collect();
        let mut model = Model::new();
        for _round in 0..20 {
            for _ in 0..rng.below(2_000) {
                random_op(&mut rng, &keys, &mut state, &mut model);
            }
            // A random subset of the groups (sometimes all) is handed off.
            let all = rng.below(4) == 0;
            let mask = rng.next();
            let pick = |key_group: u32| all || mask >> (key_group % 64) & 1 == 1;
            let stale = state.shared_slots();
            let handoff = state.hand_off_key_groups(pick);
            let handed: BTreeSet<u32> = handoff.key_groups().collect();
            let expected: Model = model
                .iter()
                .filter(|(key, _)| handed.contains(&state.key_group_of(key)))
                .map(|(key, count)| (*key, *count))
                .collect();
            assert_eq!(handoff.entries(), expected.len());
            let start = state.range().start;
            let handed_slots: BTreeSet<usize> = (0..state.range().len() * SLICES_PER_KEY_GROUP)
                .filter(|slot| handed.contains(&(start + (slot / SLICES_PER_KEY_GROUP) as u32)))
                .collect();
            // Slices handed off earlier and not written since stay shared
            // (their snapshot is gone: the first write takes them back
            // without a copy).
            let shared: BTreeSet<usize> = stale.union(&handed_slots).copied().collect();
            assert_eq!(state.shared_slots(), shared);
            let copies_before = state.copied_key_groups();
            let mut written_while_held = BTreeSet::new();
            for _ in 0..rng.below(3_000) {
                if let Some(slot) = random_op(&mut rng, &keys, &mut state, &mut model) {
                    written_while_held.insert(slot);
                }
            }
            // Encoded on another thread, as the checkpoint writer does.
            let parts = std::thread::spawn(move || handoff.encode().unwrap())
                .join()
                .unwrap();
            assert_eq!(
                parts
                    .iter()
                    .map(|part| part.key_group)
                    .collect::<BTreeSet<_>>(),
                handed
            );
            let mut with_every_group = parts.clone();
            let unsnapshotted = state
                .snapshot_key_groups(|key_group| !handed.contains(&key_group))
                .unwrap();
            // The other groups are empty in the expected model's view, so
            // restore them from empty parts of the same range.
            let empty: CowKeyedState<u64, Count> =
                CowKeyedState::new(state.max_parallelism(), state.range()).unwrap();
            let empties = empty
                .snapshot_key_groups(|key_group| !handed.contains(&key_group))
                .unwrap();
            assert_eq!(unsnapshotted.len(), empties.len());
            with_every_group.extend(empties);
            assert_eq!(
                decode(&with_every_group, state.range()),
                expected,
                "seed {seed}: the snapshot holds writes made after its handoff"
            );
            // Memory: one copy per slice of a handed-off group written
            // while held, and no other.
            let copied = state.copied_key_groups() - copies_before;
            let expected_copies = written_while_held.intersection(&handed_slots).count() as u64;
            assert_eq!(copied, expected_copies, "seed {seed}: tables copied");
            assert_eq!(
                state.shared_slots(),
                shared.difference(&written_while_held).copied().collect(),
                "seed {seed}: slices not written stay shared"
            );
            assert_eq!(state.shared_key_groups(), state.shared_slots().len());
            // The live state still equals the model.
            let live: Model = state
                .iter()
                .map(|(key, count)| (*key, count.count))
                .collect();
            assert_eq!(live, model, "seed {seed}: the live state");
        }
    }

    #[test]
    fn writes_after_a_handoff_never_reach_the_snapshot_and_copy_only_written_groups() {
        let seed = seed();
        let result = std::panic::catch_unwind(|| check_copy_on_write(seed));
        if result.is_err() {
            panic!("copy-on-write check failed; replay with SNAPFLOW_SEED={seed}");
        }
    }

    #[test]
    fn a_group_no_snapshot_holds_any_more_is_taken_back_without_a_copy() {
        let mut state = state();
        let key = (0..u64::MAX).find(|key| state.owns(key)).unwrap();
        state.get_or_default(&key).count = 7;
        let handoff = state.hand_off();
        assert_eq!(
            state.shared_key_groups(),
            state.range().len() * SLICES_PER_KEY_GROUP
        );
        drop(handoff);
        state.get_or_default(&key).count += 1;
        assert_eq!(state.copied_key_groups(), 0);
        assert_eq!(state.get(&key), Some(&Count { count: 8 }));
    }
}
