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
//!
//! An incremental snapshot's slices are *frozen* rather than shared
//! ([`GroupTable::freeze`], [`FrozenSlot`]): the snapshot holds each
//! table weakly, and the first write to a slice it has not read yet
//! encodes the slice once on the operator's thread and takes the table
//! back without a copy. The extra memory is then the encoded bytes of
//! each such slice (about a third of its table) until the writer appends
//! them, and a copy only when the writer is reading that slice at the
//! moment of the write.

use std::sync::{Arc, OnceLock, Weak};

use super::slice_table::{prefetch_scan_ahead, SliceTable};

use super::deferred::{BoxError, DeferredParts, DeferredSlices};
pub(crate) use super::group_part::EncodedSlices;
use super::group_part::KeyGroupPart;
use super::key_group::MaxParallelism;
use super::part;
use super::StateKey;
use crate::state::{Snapshot, StateError};

/// Copies a shared table: a plain function pointer, captured where
/// `S: Clone` is known, so that the write path needs no `Clone` bound.
type CopyTable<K, S> = fn(&SliceTable<K, S>) -> SliceTable<K, S>;

/// Encodes a frozen slice's entries as its [`EncodeScope`] says: a plain
/// function pointer, captured where `K: StateKey, S: Snapshot` are known,
/// for the same reason.
pub(crate) type EncodeTable<K, S> =
    fn(&SliceTable<K, S>, EncodeScope) -> Result<EncodedEntries, String>;

/// What the encoding of a frozen slice holds, passed to its
/// [`EncodeTable`]. The in-memory state encodes every entry as a part's
/// and ignores it; the spilling backend's hot table encodes the entries
/// of key group `key_group` in their disk form, with `stamp` only those
/// whose write stamp it is (the hot entries a delta part needs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct EncodeScope {
    pub(crate) key_group: u32,
    pub(crate) stamp: Option<u32>,
}

impl EncodeScope {
    /// Whether an encoding made for `self` serves a later snapshot that
    /// asks for `later` of the same slice, still frozen (unwritten) since:
    /// one of every entry serves any; one of a stamp serves another stamp,
    /// since no entry of an unwritten slice carries the later stamp and a
    /// delta may hold more entries than changed, never fewer.
    fn serves(&self, later: &EncodeScope) -> bool {
        self.key_group == later.key_group && (self.stamp.is_none() || later.stamp.is_some())
    }
}

/// A key group's table as a snapshot holds it.
pub(crate) type SharedTable<K, S> = Arc<SliceTable<K, S>>;

/// One key group's entries: owned by the state alone, or shared with a
/// snapshot that was handed them.
pub(crate) enum GroupTable<K, S> {
    /// Only the state holds the table: written in place.
    Owned(SliceTable<K, S>),
    /// A snapshot may still hold the table: read in place, taken back (and
    /// copied if still held) at the first write.
    Shared(SharedTable<K, S>, CopyTable<K, S>),
    /// A slice handed to incremental snapshots that hold it weakly: read
    /// in place; at the first write, encoded once for the snapshots that
    /// have not read it yet and taken back without a copy (see
    /// [`FrozenSlot`]).
    Frozen(FrozenSlot<K, S>),
}

/// A slice's table frozen for one or more incremental snapshots
/// ([`GroupTable::freeze`]), or for a spilling snapshot's hot entries
/// ([`GroupTable::freeze_with`], whose [`EncodeScope`] makes the encoding
/// hold only the entries that snapshot takes).
///
/// # Why the first write encodes instead of copying
///
/// A snapshot of a large state hands off every slice, and a busy operator
/// writes nearly every slice within milliseconds, long before the
/// checkpoint writer reaches most of them (BENCHMARKS.md at 07a44e5: at 10 M keys
/// every slice was copied once per checkpoint). A copy reads the slice,
/// writes it to fresh pages, and the writer then reads the original again
/// to encode it. Here the snapshots hold the table weakly, so the first
/// write instead encodes the slice's entries once into
/// [`SliceEncoding`] (compact bytes, about a third of the table) and takes
/// the table back in place: one read instead of two, no page to clear,
/// and the writer only appends the bytes. The snapshot's content is the
/// same either way: the table is immutable until it is encoded.
///
/// Invariant: the encoding is filled (by the write, or by the guard's drop
/// when the state itself goes away) before the last strong reference to
/// the table is dropped, so a snapshot whose weak reference no longer
/// upgrades always finds it.
pub(crate) struct FrozenSlot<K, S> {
    /// Declared first so that it drops (and fills the encoding with an
    /// error if nothing did) before the table.
    encoding: EncodingGuard,
    table: SharedTable<K, S>,
    copy: CopyTable<K, S>,
    encode: EncodeTable<K, S>,
    /// What `encoding` holds once filled.
    scope: EncodeScope,
}

/// A frozen slice's entries encoded as a part's entries (no header, no
/// schema), with their count.
#[derive(Debug)]
pub(crate) struct EncodedEntries {
    pub(crate) bytes: Vec<u8>,
    pub(crate) entries: u64,
}

/// The encoding of one frozen slice, filled at most once: by the operator
/// when it writes the slice while a snapshot still needs it, or with an
/// error when the state is dropped first. Snapshots that can still
/// upgrade their weak reference encode the table themselves instead.
#[derive(Debug, Default)]
pub(crate) struct SliceEncoding(OnceLock<Result<EncodedEntries, String>>);

/// One slice's [`SliceEncoding`] among those of its key group's freeze.
#[derive(Debug, Clone)]
pub(crate) struct EncodingCell {
    cells: Arc<[SliceEncoding]>,
    index: usize,
}

impl EncodingCell {
    fn get(&self) -> &SliceEncoding {
        &self.cells[self.index]
    }
}

/// The encodings of the slices one freeze takes of a key group, one cell
/// per slice, made at the first slice it freezes: one allocation per key
/// group rather than per slice, since the synchronous part of a snapshot
/// freezes thousands of slices (4,096 per subtask at 10 M keys).
#[derive(Debug)]
pub(crate) struct GroupCells {
    slices: usize,
    cells: Option<Arc<[SliceEncoding]>>,
}

impl GroupCells {
    /// Cells for a key group of `slices` slices, not made yet.
    pub(crate) fn new(slices: usize) -> Self {
        GroupCells {
            slices,
            cells: None,
        }
    }

    /// Slice `index`'s cell.
    fn cell(&mut self, index: usize) -> EncodingCell {
        let slices = self.slices;
        let cells = self
            .cells
            .get_or_insert_with(|| (0..slices).map(|_| SliceEncoding::default()).collect());
        assert!(index < cells.len(), "slice {index} of {slices}");
        EncodingCell {
            cells: Arc::clone(cells),
            index,
        }
    }
}

/// The state's side of a [`SliceEncoding`]: fills it with an error when
/// dropped unfilled, so that no snapshot waits for a state that is gone.
struct EncodingGuard(EncodingCell);

impl Drop for EncodingGuard {
    fn drop(&mut self) {
        // Ignored when filled already: the common case.
        let _ = self.0.get().0.set(Err(
            "the keyed state was dropped before a snapshot read a slice it holds".to_string(),
        ));
    }
}

/// How often [`GroupTable::get_mut`] had to do more than a tag check:
/// tables copied because a snapshot still held them, and frozen slices
/// encoded at a write because a snapshot had not read them yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TakeBacks {
    pub(crate) copies: u64,
    pub(crate) encodings: u64,
}

impl<K, S> std::fmt::Debug for GroupTable<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GroupTable::Owned(table) => write!(f, "Owned({} entries)", table.len()),
            GroupTable::Shared(table, _) => write!(f, "Shared({} entries)", table.len()),
            GroupTable::Frozen(slot) => write!(f, "Frozen({} entries)", slot.table.len()),
        }
    }
}

impl<K, S> Default for GroupTable<K, S> {
    fn default() -> Self {
        GroupTable::Owned(SliceTable::default())
    }
}

impl<K, S> GroupTable<K, S> {
    /// The table, for reading.
    #[inline(always)]
    pub(crate) fn get(&self) -> &SliceTable<K, S> {
        match self {
            GroupTable::Owned(table) => table,
            GroupTable::Shared(table, _) => table,
            GroupTable::Frozen(slot) => &slot.table,
        }
    }

    /// The table, for writing; `take_backs` counts the tables copied
    /// because a snapshot still held them and the slices encoded for a
    /// snapshot that had not read them yet.
    #[inline(always)]
    pub(crate) fn get_mut(&mut self, take_backs: &mut TakeBacks) -> &mut SliceTable<K, S> {
        if !matches!(self, GroupTable::Owned(_)) {
            self.take_back(take_backs);
        }
        match self {
            GroupTable::Owned(table) => table,
            _ => unreachable!("taken back just above"),
        }
    }

    /// Makes a shared or frozen table owned again: moved back when no
    /// snapshot holds it any more, copied once when one still does (a
    /// frozen slice is first encoded for the snapshots that hold it
    /// weakly, which then need not read it).
    #[cold]
    #[inline(never)]
    fn take_back(&mut self, take_backs: &mut TakeBacks) {
        let table = match std::mem::take(self) {
            GroupTable::Owned(table) => table,
            GroupTable::Shared(shared, copy) => owned_or_copied(shared, copy, take_backs),
            GroupTable::Frozen(slot) => slot.take_back(take_backs),
        };
        *self = GroupTable::Owned(table);
    }

    /// Whether a snapshot was handed this table and the state has not
    /// written it since.
    pub(crate) fn is_shared(&self) -> bool {
        !matches!(self, GroupTable::Owned(_))
    }
}

/// `shared` moved out when nothing else holds it, else copied with `copy`.
fn owned_or_copied<K, S>(
    shared: SharedTable<K, S>,
    copy: CopyTable<K, S>,
    take_backs: &mut TakeBacks,
) -> SliceTable<K, S> {
    Arc::try_unwrap(shared).unwrap_or_else(|still_held| {
        take_backs.copies += 1;
        copy(&still_held)
    })
}

impl<K, S> FrozenSlot<K, S> {
    /// The table, owned again. A weak holder is a snapshot that has not
    /// read the slice yet (it drops its reference once it has): the slice
    /// is encoded for it first. Weak references are made only on the
    /// state's thread, so a count read here can only be too high (a
    /// snapshot dropping its reference meanwhile), which costs an
    /// encoding no one reads, never a missing one. A snapshot reading the
    /// table at this very moment holds it strongly, and the table is
    /// copied: rare, since a slice takes the writer microseconds.
    fn take_back(self, take_backs: &mut TakeBacks) -> SliceTable<K, S> {
        let FrozenSlot {
            encoding,
            table,
            copy,
            encode,
            scope,
        } = self;
        if Arc::weak_count(&table) > 0 {
            take_backs.encodings += 1;
            let _ = encoding.0.get().0.set(encode(&table, scope));
        }
        drop(encoding);
        owned_or_copied(table, copy, take_backs)
    }
}

impl<K: Clone, S: Clone> GroupTable<K, S> {
    /// A reference to the table for a snapshot, in constant time: the
    /// table moves behind an `Arc` (on its first handoff) and the slot
    /// keeps the other reference.
    pub(crate) fn share(&mut self) -> SharedTable<K, S> {
        if let GroupTable::Owned(table) = self {
            let table = Arc::new(std::mem::take(table));
            *self = GroupTable::Shared(table, SliceTable::clone);
        }
        match self {
            GroupTable::Shared(table, _) => Arc::clone(table),
            GroupTable::Frozen(slot) => Arc::clone(&slot.table),
            GroupTable::Owned(_) => unreachable!("shared just above"),
        }
    }
}

impl<K: StateKey + Clone, S: Snapshot + Clone> GroupTable<K, S> {
    /// A weak reference to the table for an incremental snapshot of the
    /// in-memory state, in constant time (see [`FrozenSlot`]); the slice
    /// is number `slice` of the key group `cells` serves.
    pub(crate) fn freeze(&mut self, cells: &mut GroupCells, slice: usize) -> FrozenRef<K, S> {
        self.freeze_with(encode_table::<K, S>, EncodeScope::default(), cells, slice)
    }
}

impl<K: Clone, S: Clone> GroupTable<K, S> {
    /// A weak reference to the table for a snapshot whose first write
    /// encodes the slice with `encode` as `scope` says, in constant time
    /// (see [`FrozenSlot`]). Snapshots that freeze a slice the state has
    /// not written since share its [`SliceEncoding`] when the earlier
    /// scope serves the later ([`EncodeScope::serves`]): the table is the
    /// same, so one encoding serves them all.
    ///
    /// Otherwise (a whole snapshot after a delta one, while the slice is
    /// still frozen for it: a savepoint during a checkpoint) the earlier
    /// snapshots' encoding is made here, on this thread, so that the
    /// slice can take a new one. Known gap: that costs time proportional
    /// to the slice, not constant.
    pub(crate) fn freeze_with(
        &mut self,
        encode: EncodeTable<K, S>,
        scope: EncodeScope,
        cells: &mut GroupCells,
        slice: usize,
    ) -> FrozenRef<K, S> {
        let table = match std::mem::take(self) {
            GroupTable::Frozen(slot) if slot.scope.serves(&scope) => {
                *self = GroupTable::Frozen(slot);
                None
            }
            GroupTable::Frozen(slot) => Some(slot.encode_for_holders()),
            GroupTable::Owned(table) => Some(Arc::new(table)),
            GroupTable::Shared(shared, _) => Some(shared),
        };
        if let Some(table) = table {
            *self = GroupTable::Frozen(FrozenSlot {
                encoding: EncodingGuard(cells.cell(slice)),
                table,
                copy: SliceTable::clone,
                encode,
                scope,
            });
        }
        let GroupTable::Frozen(slot) = self else {
            unreachable!("frozen just above")
        };
        FrozenRef {
            table: Arc::downgrade(&slot.table),
            encoding: slot.encoding.0.clone(),
        }
    }
}

impl<K, S> FrozenSlot<K, S> {
    /// Fills the encoding for the snapshots that still hold the slice
    /// weakly and returns the table, still frozen for them (they find the
    /// encoding first) and free for a new slot.
    fn encode_for_holders(self) -> SharedTable<K, S> {
        if Arc::weak_count(&self.table) > 0 {
            let _ = self
                .encoding
                .0
                .get()
                .0
                .set((self.encode)(&self.table, self.scope));
        }
        let FrozenSlot {
            encoding, table, ..
        } = self;
        drop(encoding);
        table
    }
}

/// An incremental snapshot's hold on one frozen slice: the table while
/// the state has not written it, else the encoding the state made of it
/// before its first write.
pub(crate) struct FrozenRef<K, S> {
    table: Weak<SliceTable<K, S>>,
    encoding: EncodingCell,
}

/// The frozen slices of one key group, in slice order.
#[cfg(feature = "spill")]
pub(crate) type FrozenSlices<K, S> = Vec<FrozenRef<K, S>>;

/// What a snapshot finds of a frozen slice ([`FrozenRef::read`]).
pub(crate) enum FrozenRead<'a, K, S> {
    /// The encoding the state made at its first write.
    Encoded(&'a Result<EncodedEntries, String>),
    /// The table itself, unwritten since the freeze; encode it here.
    Table(SharedTable<K, S>),
}

impl<K, S> FrozenRef<K, S> {
    /// The slice as the snapshot finds it: the state's encoding when it
    /// made one, else the table (held strongly while the caller reads it,
    /// so a write meanwhile copies it).
    pub(crate) fn read(&self) -> FrozenRead<'_, K, S> {
        if let Some(done) = self.encoded() {
            return FrozenRead::Encoded(done);
        }
        match self.table.upgrade() {
            Some(table) => FrozenRead::Table(table),
            None => FrozenRead::Encoded(self.encoding.get().wait()),
        }
    }

    /// The state's encoding of the slice if it made one already; never
    /// waits and never holds the table (which would make a write copy it).
    pub(crate) fn encoded(&self) -> Option<&Result<EncodedEntries, String>> {
        self.encoding.get().0.get()
    }
}

impl<K: StateKey, S: Snapshot> FrozenRef<K, S> {
    /// Appends the slice's entries to `out` and returns their count: the
    /// state's encoding when it made one, else the table's entries
    /// encoded here (the same bytes).
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<u64, String> {
        match self.read() {
            FrozenRead::Encoded(done) => append_encoded(done, out),
            FrozenRead::Table(table) => push_entries(table_entries(&table), out),
        }
    }
}

impl SliceEncoding {
    /// The encoding, once filled. Called only after the table's last
    /// strong reference is gone, which happens after the encoding is
    /// filled (see [`FrozenSlot`]'s invariant); the loop only waits for
    /// that write to become visible on this thread, so it ends at once.
    fn wait(&self) -> &Result<EncodedEntries, String> {
        loop {
            if let Some(done) = self.0.get() {
                return done;
            }
            std::thread::yield_now();
        }
    }
}

/// Appends a slice's encoding made by the state.
fn append_encoded(done: &Result<EncodedEntries, String>, out: &mut Vec<u8>) -> Result<u64, String> {
    let encoded = done.as_ref().map_err(Clone::clone)?;
    out.extend_from_slice(&encoded.bytes);
    Ok(encoded.entries)
}

/// A frozen slice's entries, encoded on the state's thread at its first
/// write ([`EncodeTable`]).
fn encode_table<K: StateKey, S: Snapshot>(
    table: &SliceTable<K, S>,
    _every_entry: EncodeScope,
) -> Result<EncodedEntries, String> {
    // About six bytes an entry for small keys and states; the buffer grows
    // for larger ones.
    let mut bytes = Vec::with_capacity(table.len() * 6);
    let entries = push_entries(table_entries(table), &mut bytes)?;
    Ok(EncodedEntries { bytes, entries })
}

/// Appends `entries` to `out` as a part's entries and returns their
/// count, checked against the iterator's length (a table's `len`).
fn push_entries<'a, K, S>(
    entries: impl ExactSizeIterator<Item = (&'a K, &'a S)>,
    out: &mut Vec<u8>,
) -> Result<u64, String>
where
    K: StateKey + 'a,
    S: Snapshot + 'a,
{
    let expected = entries.len() as u64;
    let mut writer = part::PartWriter::entries_into(std::mem::take(out));
    let pushed = entries
        .into_iter()
        .try_for_each(|(key, state)| writer.push(key, state));
    let (bytes, written) = writer.into_entries();
    *out = bytes;
    pushed.map_err(|error| error.to_string())?;
    if written != expected {
        return Err(format!("encoded {written} entries; it held {expected}"));
    }
    Ok(written)
}

/// `table`'s entries, as [`push_entries`] takes them.
fn table_entries<K, S>(table: &SliceTable<K, S>) -> impl ExactSizeIterator<Item = (&K, &S)> + '_ {
    table.iter().map(|pair| {
        prefetch_scan_ahead(pair);
        (&pair.0, &pair.1)
    })
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
    /// `(slice, its frozen table)` of the slices written again,
    /// ascending.
    pub(crate) fresh: Vec<(u32, FrozenRef<K, S>)>,
    /// The entries of the slices not written again, read from their
    /// tables at the handoff: unchanged since they were written, so the
    /// same count as in the bytes referred to.
    pub(crate) reused_entries: u64,
}

#[cfg(test)]
impl EncodedSlices {
    /// The whole part these bytes make with their header filled in, for
    /// tests that hand off or encode every slice (the header counts the
    /// reused entries too, which such a group has none of).
    pub(crate) fn to_part(&self) -> Vec<u8> {
        let mut bytes = self.bytes.clone();
        let body = &bytes[part::PART_HEADER_LEN..];
        let entries: u64 = self.slices.iter().map(|(_, _, entries)| entries).sum();
        let header = part::header_for(
            self.max_parallelism,
            self.key_group,
            entries + self.reused_entries,
            self.schema_len,
            body.len() as u64,
            crc32fast::hash(body),
        );
        bytes[..part::PART_HEADER_LEN].copy_from_slice(&header);
        bytes
    }
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
    /// The bytes to reserve per fresh slice of the next group: the last
    /// group's average, since a subtask's slices hold about as many keys
    /// each. Growing from empty instead copied each group's bytes about
    /// twice over (half a megabyte a group at 10 M keys); reserving per
    /// fresh slice keeps a group with few fresh slices small.
    bytes_per_slice_hint: usize,
}

impl<K, S> SliceHandoff<K, S> {
    /// `groups`, ascending by key group: every key group of the state's
    /// range, each with the slices it writes.
    pub(crate) fn new(max_parallelism: MaxParallelism, groups: Vec<HandedGroup<K, S>>) -> Self {
        SliceHandoff {
            max_parallelism,
            groups: groups.into_iter(),
            schema: None,
            bytes_per_slice_hint: 0,
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
        let capacity =
            part::PART_HEADER_LEN + schema.len() + group.fresh.len() * self.bytes_per_slice_hint;
        let encoded = encode_slices(group, schema, self.max_parallelism, capacity);
        if let Ok(encoded) = &encoded {
            if let Some(per_slice) = encoded.bytes.len().checked_div(encoded.slices.len()) {
                self.bytes_per_slice_hint = per_slice;
            }
        }
        Some(encoded)
    }
}

/// Encodes one key group's fresh frozen slices back to back (see
/// [`EncodedSlices`]); each slice's reference drops as soon as it is
/// encoded, so that a later write of it needs no encoding. `capacity`
/// bytes are reserved up front.
fn encode_slices<K: StateKey, S: Snapshot>(
    group: HandedGroup<K, S>,
    schema: &[u8],
    max_parallelism: MaxParallelism,
    capacity: usize,
) -> Result<EncodedSlices, StateError> {
    let key_group = group.key_group;
    let mut out = SlicesOut::new(key_group, schema, group.fresh.len(), capacity);
    for (slice, frozen) in group.fresh {
        out.start(slice);
        let entries = frozen
            .encode_into(&mut out.bytes)
            .map_err(|reason| slice_error::<S>(slice, key_group, reason))?;
        out.end(slice, entries);
    }
    Ok(out.finish(group.reused_entries, max_parallelism))
}

/// Encodes the fresh slices of `key_group`, each given as its number and
/// its entries, ascending by slice, back to back into an
/// [`EncodedSlices`] (header room first, the schema section in front of
/// slice 0's entries); `reused_entries` counts the entries of the slices
/// not written again. The flat state's synchronous snapshot
/// (`KeyedState::encode_slices`) uses it; the copy-on-write hand-off
/// ([`encode_slices`]) lays out the same bytes through the same
/// [`SlicesOut`] and [`push_entries`], so both write the same bytes for
/// the same entries in the same order.
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
    let mut out = SlicesOut::new(key_group, schema, 0, 0);
    for (slice, entries) in fresh {
        out.start(slice);
        let entries = push_entries(entries, &mut out.bytes)
            .map_err(|reason| slice_error::<S>(slice, key_group, reason))?;
        out.end(slice, entries);
    }
    Ok(out.finish(reused_entries, max_parallelism))
}

/// An [`EncodedSlices`] being laid out, slice by slice.
struct SlicesOut<'s> {
    key_group: u32,
    schema: &'s [u8],
    bytes: Vec<u8>,
    slices: Vec<(u32, usize, u64)>,
}

impl<'s> SlicesOut<'s> {
    /// Room for `slices` slices and `capacity` bytes, the header's room
    /// included.
    fn new(key_group: u32, schema: &'s [u8], slices: usize, capacity: usize) -> Self {
        let mut bytes = Vec::with_capacity(capacity.max(part::PART_HEADER_LEN));
        bytes.resize(part::PART_HEADER_LEN, 0);
        SlicesOut {
            key_group,
            schema,
            bytes,
            slices: Vec::with_capacity(slices),
        }
    }

    /// Before a slice's entries: the schema section belongs to slice 0's
    /// bytes.
    fn start(&mut self, slice: u32) {
        if slice == 0 {
            self.bytes.extend_from_slice(self.schema);
        }
    }

    fn end(&mut self, slice: u32, entries: u64) {
        self.slices.push((slice, self.bytes.len(), entries));
    }

    fn finish(self, reused_entries: u64, max_parallelism: MaxParallelism) -> EncodedSlices {
        EncodedSlices {
            key_group: self.key_group,
            bytes: self.bytes,
            slices: self.slices,
            reused_entries,
            // `schema_section` refused anything over MAX_SCHEMA_LEN.
            schema_len: self.schema.len() as u32,
            max_parallelism,
        }
    }
}

/// A slice that did not encode, as the state error a snapshot fails with.
fn slice_error<S: Snapshot>(slice: u32, key_group: u32, reason: String) -> StateError {
    StateError::Encode {
        type_name: S::SCHEMA.type_name,
        reason: format!("slice {slice} of key group {key_group}: {reason}"),
    }
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
    use crate::keyed::test_support::{with_seed, Count, Rng};
    use crate::keyed::{key_hash, KeyedState, MaxParallelism, SLICES_PER_KEY_GROUP};

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
        let (mut rng, mut state, keys, mut model) = workload(seed);
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

    /// A seeded workload's start: its random numbers, an empty state, 600
    /// keys the state owns, and the model of what it holds.
    fn workload(seed: u64) -> (Rng, CowKeyedState<u64, Count>, Vec<u64>, Model) {
        let state = state();
        let keys = (0..4_000u64)
            .filter(|key| state.owns(key))
            .take(600)
            .collect();
        (Rng(seed), state, keys, Model::new())
    }

    /// A state holding one owned key, counted 7, and that key.
    fn state_with_one_key() -> (CowKeyedState<u64, Count>, u64) {
        let mut state = state();
        let key = (0..u64::MAX).find(|key| state.owns(key)).unwrap();
        state.get_or_default(&key).count = 7;
        (state, key)
    }

    #[test]
    fn writes_after_a_handoff_never_reach_the_snapshot_and_copy_only_written_groups() {
        with_seed("the copy-on-write check", check_copy_on_write);
    }

    #[test]
    fn a_group_no_snapshot_holds_any_more_is_taken_back_without_a_copy() {
        let (mut state, key) = state_with_one_key();
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

    /// A slice hand-off's groups as full parts: each group's header made
    /// for its bytes (every slot handed off, so each group has all its
    /// slices).
    fn parts_of_slices(
        mut handoff: SliceHandoff<u64, Count>,
    ) -> Result<Vec<KeyGroupPart>, StateError> {
        let mut parts = Vec::new();
        while let Some(group) = handoff.encode_next() {
            let group = group?;
            parts.push(KeyGroupPart {
                key_group: group.key_group,
                bytes: group.to_part(),
            });
        }
        Ok(parts)
    }

    /// Incremental hand-offs of every slice at random moments, one or two
    /// in flight at once, their writer advancing part of the way between
    /// the operator's writes: each decodes to exactly the state at its
    /// hand-off, no table is copied (the writer never reads while the
    /// state writes here), and a slice written while a snapshot still
    /// needed it was encoded at that write, once.
    fn check_frozen_slices(seed: u64) {
        let (mut rng, mut state, keys, mut model) = workload(seed);
        for _round in 0..12 {
            for _ in 0..rng.below(1_500) {
                random_op(&mut rng, &keys, &mut state, &mut model);
            }
            let first = (state.hand_off_slices(|_| true), model.clone());
            let mut written = BTreeSet::new();
            for _ in 0..rng.below(400) {
                written.extend(random_op(&mut rng, &keys, &mut state, &mut model));
            }
            // Sometimes a second snapshot while the first is pending:
            // slices not written since share the first one's encoding.
            let second =
                (rng.below(2) == 0).then(|| (state.hand_off_slices(|_| true), model.clone()));
            let (mut handoff, expected) = first;
            // The writer gets part of the way through the first.
            let mut parts = Vec::new();
            for _ in 0..rng.below(3) {
                parts.extend(
                    parts_of_slices(SliceHandoff::new(
                        handoff.max_parallelism,
                        handoff.groups.next().into_iter().collect(),
                    ))
                    .unwrap(),
                );
            }
            let encodings_before = state.encoded_at_write();
            for _ in 0..rng.below(2_000) {
                written.extend(random_op(&mut rng, &keys, &mut state, &mut model));
            }
            assert!(
                state.encoded_at_write() - encodings_before <= written.len() as u64,
                "seed {seed}: a slice was encoded more than once"
            );
            let rest = std::thread::spawn(move || parts_of_slices(handoff).unwrap())
                .join()
                .unwrap();
            parts.extend(rest);
            assert_eq!(
                decode(&parts, state.range()),
                expected,
                "seed {seed}: first snapshot"
            );
            if let Some((handoff, expected)) = second {
                let parts = std::thread::spawn(move || parts_of_slices(handoff).unwrap())
                    .join()
                    .unwrap();
                assert_eq!(
                    decode(&parts, state.range()),
                    expected,
                    "seed {seed}: second snapshot"
                );
            }
            assert_eq!(
                state.copied_key_groups(),
                0,
                "seed {seed}: a table was copied"
            );
            let live: Model = state
                .iter()
                .map(|(key, count)| (*key, count.count))
                .collect();
            assert_eq!(live, model, "seed {seed}: the live state");
        }
        assert!(
            state.encoded_at_write() > 0,
            "seed {seed}: nothing was encoded at a write"
        );
    }

    #[test]
    fn frozen_slices_written_before_the_writer_reads_them_are_encoded_once_and_never_copied() {
        with_seed("the frozen slice check", check_frozen_slices);
    }

    #[test]
    fn a_snapshot_of_a_state_dropped_before_it_is_read_fails_instead_of_waiting() {
        let (mut state, _) = state_with_one_key();
        let handoff = state.hand_off_slices(|_| true);
        drop(state);
        let error = parts_of_slices(handoff).unwrap_err().to_string();
        assert!(error.contains("dropped"), "{error}");
    }

    #[test]
    fn a_slice_the_writer_has_read_is_taken_back_without_encoding_or_copy() {
        let (mut state, key) = state_with_one_key();
        let parts = parts_of_slices(state.hand_off_slices(|_| true)).unwrap();
        assert_eq!(decode(&parts, state.range()), Model::from([(key, 7)]));
        state.get_or_default(&key).count += 1;
        assert_eq!(
            (state.copied_key_groups(), state.encoded_at_write()),
            (0, 0)
        );
        assert_eq!(state.get(&key), Some(&Count { count: 8 }));
    }

    /// Encodes the keys (little-endian) whose value is the scope's stamp,
    /// or every key without one: a stand-in for the spilling backend's
    /// encoding of a delta's entries.
    fn keys_with_stamp(
        table: &SliceTable<u64, u64>,
        scope: EncodeScope,
    ) -> Result<EncodedEntries, String> {
        let mut keys: Vec<u64> = table
            .iter()
            .filter(|(_, value)| scope.stamp.map_or(true, |stamp| u64::from(stamp) == *value))
            .map(|(key, _)| *key)
            .collect();
        keys.sort_unstable();
        let entries = keys.len() as u64;
        let bytes = keys.iter().flat_map(|key| key.to_le_bytes()).collect();
        Ok(EncodedEntries { bytes, entries })
    }

    fn keys_of(frozen: &FrozenRef<u64, u64>) -> Vec<u64> {
        match frozen.read() {
            FrozenRead::Encoded(Ok(encoded)) => encoded
                .bytes
                .chunks(8)
                .map(|chunk| u64::from_le_bytes(chunk.try_into().unwrap()))
                .collect(),
            other => panic!("not encoded: {}", matches!(other, FrozenRead::Table(_))),
        }
    }

    /// A slot frozen for a stamped (delta) snapshot and then for a whole
    /// one before any write: the earlier snapshot gets its own encoding at
    /// the second freeze, the later one at the first write, and a stamped
    /// freeze after a whole one shares the whole encoding (a superset).
    #[test]
    fn freezes_with_scopes_share_an_encoding_only_when_it_serves() {
        let mut slot = GroupTable::<u64, u64>::Owned(SliceTable::default());
        let mut take_backs = TakeBacks::default();
        for (key, value) in [(1, 7), (2, 8), (3, 7)] {
            slot.get_mut(&mut take_backs).insert_unique(
                key_hash(&key),
                (key, value),
                |(key, _)| key_hash(key),
            );
        }
        let scope = |stamp| EncodeScope {
            key_group: 0,
            stamp,
        };
        let cells = || GroupCells::new(1);
        let delta = slot.freeze_with(keys_with_stamp, scope(Some(7)), &mut cells(), 0);
        let whole = slot.freeze_with(keys_with_stamp, scope(None), &mut cells(), 0);
        assert_eq!(keys_of(&delta), [1, 3], "encoded at the whole freeze");
        assert!(matches!(whole.read(), FrozenRead::Table(_)));
        let later = slot.freeze_with(keys_with_stamp, scope(Some(8)), &mut cells(), 0);
        slot.get_mut(&mut take_backs);
        assert_eq!(
            take_backs,
            TakeBacks {
                copies: 0,
                encodings: 1
            }
        );
        assert_eq!(keys_of(&whole), [1, 2, 3]);
        assert_eq!(keys_of(&later), [1, 2, 3], "the whole encoding serves it");
        assert_eq!(keys_of(&delta), [1, 3]);
    }
}
