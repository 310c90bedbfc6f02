//! Incremental checkpoints of keyed state, on the job's side: which units
//! (slices of key groups for the in-memory layouts, key groups for the
//! spilling backend) a keyed operator writes again at a checkpoint, which
//! it refers to in an earlier checkpoint's shared file, and the segments
//! that say so to the store ([`crate::storage::segment`]).
//!
//! This module owns that bookkeeping ([`KeyGroupLedger`]), the settings
//! ([`IncrementalCheckpoints`]) and the segmented form of the
//! keyed-state envelope. It never does I/O, never decides when to
//! checkpoint and never reads a part back: loading assembles segmented
//! parts into exactly the bytes a full snapshot has, so restoring,
//! rescaling and `job::inspect` do not know about any of this.
//!
//! # The rule (why a reference is always valid)
//!
//! A unit is referred to, instead of written, only when it has not
//! changed since the snapshot that last wrote it (its dirty flag) and that
//! snapshot's checkpoint was confirmed complete (durable) to this very
//! operator instance. Every complete checkpoint this instance took after
//! that one refers to the same range too (it was unchanged and confirmed
//! then as well), so the store's retention, which keeps every shared file
//! a remaining checkpoint names, still has it. A restored or restarted
//! instance starts with nothing written, so its first checkpoint is full.
//! Savepoints are written whole and change nothing here.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

use crate::keyed::deferred::{DeferredParts, DeferredSlices, ReadySlices};
use crate::keyed::store::KeyGroupSnapshots;
use crate::keyed::{CowKeyedState, KeyGroupRange, KeyedState, StateKey, SLICES_PER_KEY_GROUP};
use crate::protocol::CheckpointId;
use crate::runtime::BoxError;
use crate::state::Snapshot;
use crate::storage::{Segment, SharedRange};

use super::ops::{encode_keyed_state, KeyGroupParts};

#[cfg(feature = "spill")]
mod chains;
mod parts;
mod slices;

pub(crate) use parts::KeyedSnapshotParts;
pub(crate) use slices::KeyedSnapshotSlices;

/// How keyed operators checkpoint: incrementally (the default) or in full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IncrementalCheckpoints {
    /// Write only the key groups that changed since the last completed
    /// checkpoint and refer to the others. Takes effect only with a store
    /// whose [`supports_segments`](crate::storage::CheckpointStore::supports_segments)
    /// is true (both built-in stores); with another store every
    /// checkpoint is full.
    pub enabled: bool,
    /// Every this many checkpoints of an operator instance one is full
    /// (writes every key group again), so that a checkpoint refers to at
    /// most this many checkpoints' shared files per part and a restore
    /// never reads a longer chain. 1 makes every checkpoint full; 0 counts
    /// as 1. Default [`DEFAULT_FULL_EVERY`].
    pub full_every: u32,
}

/// The default [`IncrementalCheckpoints::full_every`]: 50. With 1 s
/// checkpoints a key group that never changes is written again every
/// 50 s, a restore reads at most 50 shared files per subtask, and the
/// store holds at most the last full snapshot plus 49 checkpoints' changes
/// of each subtask beyond what retention keeps anyway.
///
/// # Why 50, not 10
///
/// A full checkpoint costs a write of the whole state, and for the
/// spilling backend a read of it too: at 10 M keys with 1 s checkpoints
/// the whole reads of a full one every 10 took about a quarter of its
/// checkpoint writer's CPU, and a full one every 48 instead took a fifth
/// of the writer's samples off a run (BENCHMARKS.md at 07a44e5, "Fewer whole reads"). What a restore reads is
/// bounded anyway: a spilling group's chain is written whole again once
/// its deltas pass half its base part (`job/incremental/chains.rs`), and
/// an in-memory slice is read once, from the newest checkpoint holding
/// it. What grows is the number of shared files a restore opens and, for
/// a state of which a part changes in every interval, the store's
/// overhead, at most 49 checkpoints' changes. Flink's incremental
/// RocksDB checkpoints force no full one at all, and its changelog
/// backend materialises every 10 minutes by default.
pub const DEFAULT_FULL_EVERY: u32 = 50;

impl Default for IncrementalCheckpoints {
    fn default() -> Self {
        IncrementalCheckpoints {
            enabled: true,
            full_every: DEFAULT_FULL_EVERY,
        }
    }
}

/// Where one unit's (a key group's of the spilling state, or a slice's
/// or part header's of an in-memory state) current bytes were last written: 32 bytes per unit (a unit test
/// holds it to that).
#[derive(Debug, Clone, Copy)]
enum Written {
    /// By the snapshot of `checkpoint`, not yet confirmed complete: the
    /// `fresh`-th unit that snapshot wrote (its range is known once the
    /// part is encoded, on the writer's thread for a deferred one).
    Pending { checkpoint: u64, fresh: u32 },
    /// In a checkpoint confirmed complete (durable), at this range.
    Confirmed(CompactRange),
}

/// A [`SharedRange`] in 24 bytes: a unit longer than 4 GiB is never
/// confirmed (and so is written again each time), which no real unit is.
#[derive(Debug, Clone, Copy)]
struct CompactRange {
    checkpoint: u64,
    offset: u64,
    len: u32,
    crc32: u32,
}

impl CompactRange {
    fn of(range: &SharedRange) -> Option<Self> {
        Some(CompactRange {
            checkpoint: range.checkpoint,
            offset: range.offset,
            len: u32::try_from(range.len).ok()?,
            crc32: range.crc32,
        })
    }

    fn range(self) -> SharedRange {
        SharedRange {
            checkpoint: self.checkpoint,
            offset: self.offset,
            len: u64::from(self.len),
            crc32: self.crc32,
        }
    }
}

/// Where the groups a snapshot wrote landed in its shared file, in the
/// order it wrote them: set when the snapshot is encoded (by the writer
/// thread for a deferred one), read by the ledger when the checkpoint is
/// confirmed.
type Landed = Arc<OnceLock<Landing>>;

/// What [`Landed`] says of an encoded snapshot: per unit it wrote, in
/// order, its range in the shared file, and whether those bytes are a
/// delta part appended to the unit's chain (the spilling backend's
/// incremental checkpoints; `deltas` is empty otherwise).
#[derive(Debug, Default)]
pub(crate) struct Landing {
    ranges: Vec<SharedRange>,
    deltas: Vec<bool>,
}

/// How many snapshots' [`Landed`] a ledger keeps while their checkpoints
/// are not confirmed. An older one is dropped: its groups then stay
/// unconfirmed and are written again, which is always safe.
const MAX_PENDING_SNAPSHOTS: usize = 16;

/// One keyed operator instance's record of where each of its units was
/// last written, and the choice at each checkpoint of which to write. A
/// unit is a key group for the spilling state, and a slice of a key group
/// (or its part's header) for both in-memory layouts, flat and
/// copy-on-write (see [`crate::keyed::SLICES_PER_KEY_GROUP`]), so a state
/// that moves from one to the other keeps its record.
#[derive(Debug)]
pub(crate) struct KeyGroupLedger {
    full_every: u32,
    /// The next checkpoint's place in its chain: 0 (full) up to
    /// `full_every - 1`.
    next_position: u32,
    /// Units per key group of what `written` records: 1 (key groups) or
    /// an in-memory state's header and slices. A plan in the other unit
    /// (which no instance makes: its backend is fixed, and a restore
    /// resets the ledger anyway) starts the chain again.
    units_per_group: usize,
    /// Per unit of the instance's range, in order.
    written: Vec<Option<Written>>,
    /// Per key group of a spilling state (empty otherwise): its whole
    /// chain, the base part's range first and then its delta parts', of
    /// a group whose `written` is confirmed, or while a delta write is
    /// pending the chain it extends; empty for a group that has none.
    chains: Vec<Vec<CompactRange>>,
    /// The spilling state's snapshot count right after this ledger last
    /// planned for it: a delta may be planned only when no other snapshot
    /// (a savepoint, a capture) took the state's change records since.
    chain_epoch: Option<u64>,
    /// The snapshots taken and not yet confirmed, oldest first, at most
    /// [`MAX_PENDING_SNAPSHOTS`].
    pending: VecDeque<(CheckpointId, Landed)>,
}

impl KeyGroupLedger {
    /// A ledger for `key_groups` groups with nothing written yet.
    pub(crate) fn new(settings: IncrementalCheckpoints, key_groups: usize) -> Self {
        KeyGroupLedger {
            full_every: settings.full_every.max(1),
            next_position: 0,
            units_per_group: 1,
            written: vec![None; key_groups],
            chains: Vec::new(),
            chain_epoch: None,
            pending: VecDeque::new(),
        }
    }

    /// Forgets everything written: the next checkpoint is full.
    pub(crate) fn reset(&mut self) {
        self.next_position = 0;
        self.written.iter_mut().for_each(|written| *written = None);
        self.chains.iter_mut().for_each(Vec::clear);
        self.chain_epoch = None;
        self.pending.clear();
    }

    /// `checkpoint` completed: the groups it wrote may be referred to, at
    /// the ranges its encoding gave them. Snapshots older than it never
    /// will be, and are forgotten.
    pub(crate) fn on_complete(&mut self, checkpoint: CheckpointId) {
        let mut landed = None;
        while let Some((id, _)) = self.pending.front() {
            if *id > checkpoint {
                break;
            }
            let (id, ranges) = self.pending.pop_front().expect("a front entry");
            if id == checkpoint {
                landed = Some(ranges);
            }
        }
        // A checkpoint completes only after its every part was encoded,
        // so its ranges are set; if not, its groups stay unconfirmed and
        // are written again.
        let Some(landing) = landed.as_deref().and_then(OnceLock::get) else {
            return;
        };
        for (unit, written) in self.written.iter_mut().enumerate() {
            let Some(Written::Pending {
                checkpoint: id,
                fresh,
            }) = *written
            else {
                continue;
            };
            if id != checkpoint.0 {
                continue;
            }
            let Some(range) = landing
                .ranges
                .get(fresh as usize)
                .and_then(CompactRange::of)
            else {
                continue;
            };
            *written = Some(Written::Confirmed(range));
            if let Some(chain) = self.chains.get_mut(unit) {
                // A delta extends the chain it was planned on; anything
                // else starts a new one.
                if landing.deltas.get(fresh as usize) != Some(&true) {
                    chain.clear();
                }
                chain.push(range);
                *written = Some(Written::Confirmed(chain[0]));
            }
        }
    }

    /// Which key groups of `key_groups` the snapshot for `checkpoint`
    /// writes (the `changed` ones, the unconfirmed ones, or all when the
    /// chain starts again) and which it refers to: constant work per key
    /// group, nothing is encoded. The caller takes the parts of exactly
    /// the groups [`SnapshotPlan::writes`] names and clears its changes.
    pub(crate) fn plan(
        &mut self,
        checkpoint: CheckpointId,
        key_groups: KeyGroupRange,
        changed: impl IntoIterator<Item = u32>,
    ) -> SnapshotPlan {
        let start = key_groups.start;
        let changed = changed
            .into_iter()
            .map(|key_group| (key_group - start) as usize);
        self.plan_units(checkpoint, key_groups, 1, false, changed)
    }

    /// [`Self::plan`] in units of `units_per_group` per key group (1, or
    /// the copy-on-write state's header and slices): which units the
    /// snapshot writes (the `changed` ones, by index from the range's
    /// first unit, the unconfirmed ones, or all) and which it refers to.
    /// With `headers`, each group's first unit is its part's header,
    /// written whenever another unit of the group is. The caller takes
    /// exactly the units [`SnapshotPlan::writes_unit`] names.
    pub(crate) fn plan_units(
        &mut self,
        checkpoint: CheckpointId,
        key_groups: KeyGroupRange,
        units_per_group: usize,
        headers: bool,
        changed: impl IntoIterator<Item = usize>,
    ) -> SnapshotPlan {
        let units = key_groups.len() * units_per_group;
        if units_per_group != self.units_per_group || units != self.written.len() {
            // What was recorded names other units: start again, full.
            self.units_per_group = units_per_group;
            self.written = vec![None; units];
            self.reset();
        }
        let full = self.next_position == 0;
        self.next_position = (self.next_position + 1) % self.full_every;
        let mut writes: Vec<bool> = self
            .written
            .iter()
            .map(|written| full || !matches!(written, Some(Written::Confirmed(_))))
            .collect();
        for unit in changed {
            writes[unit] = true;
        }
        if headers {
            for group in writes.chunks_mut(units_per_group) {
                let any = group.iter().any(|writes| *writes);
                group[0] = any;
            }
        }
        let mut layout = Vec::with_capacity(units);
        let mut fresh_count = 0u32;
        for (writes, written) in writes.iter().zip(&mut self.written) {
            match written {
                Some(Written::Confirmed(range)) if !*writes => layout.push(Some(range.range())),
                _ => {
                    *written = Some(Written::Pending {
                        checkpoint: checkpoint.0,
                        fresh: fresh_count,
                    });
                    fresh_count += 1;
                    layout.push(None);
                }
            }
        }
        let landed = Landed::default();
        self.pending.push_back((checkpoint, Arc::clone(&landed)));
        if self.pending.len() > MAX_PENDING_SNAPSHOTS {
            self.pending.pop_front();
        }
        SnapshotPlan {
            checkpoint,
            start: key_groups.start,
            units_per_group,
            layout,
            chains: Vec::new(),
            landed: Some(landed),
        }
    }

    /// [`Self::plan_units`] for an in-memory state, flat or copy-on-write:
    /// per key group its part's header and `slices` slices; `dirty` are
    /// slots (group index times `slices` plus slice, as
    /// `KeyedState::dirty_slots` and `CowKeyedState::dirty_slots` give).
    pub(crate) fn plan_slices(
        &mut self,
        checkpoint: CheckpointId,
        key_groups: KeyGroupRange,
        slices: usize,
        dirty: impl IntoIterator<Item = usize>,
    ) -> SnapshotPlan {
        let units = dirty.into_iter().map(|slot| slice_unit(slices, slot));
        self.plan_units(checkpoint, key_groups, slices + 1, true, units)
    }

    /// The flat state's incremental snapshot for checkpoint `checkpoint`:
    /// planned per slice, the written slices encoded now, on the caller's
    /// thread (the flat state is small), and their assembly into segments
    /// left to [`KeyedSnapshotSlices::encode`]. Clears the dirty flags.
    pub(crate) fn snapshot_flat<K: StateKey, S: Snapshot>(
        &mut self,
        checkpoint: CheckpointId,
        state: &mut KeyedState<K, S>,
    ) -> Result<KeyedSnapshotSlices, BoxError> {
        let plan = self.plan_in_slices(checkpoint, state.range(), state.dirty_slots());
        let slices = state.encode_slices(|slot| plan.writes_slot(slot))?;
        state.forget_changes();
        Ok(plan.with_slices(Box::new(ReadySlices::new(slices))))
    }

    /// The copy-on-write state's incremental snapshot for checkpoint
    /// `checkpoint`: planned per slice and the written slices handed off
    /// frozen, in constant time per slice, to be encoded by
    /// [`KeyedSnapshotSlices::encode`] on the writer's thread. Clears the
    /// dirty flags.
    pub(crate) fn hand_off_cow<K, S>(
        &mut self,
        checkpoint: CheckpointId,
        state: &mut CowKeyedState<K, S>,
    ) -> KeyedSnapshotSlices
    where
        K: StateKey + Clone + Send + Sync + 'static,
        S: Snapshot + Clone + Send + Sync + 'static,
    {
        let plan = self.plan_in_slices(checkpoint, state.range(), state.dirty_slots());
        let handoff = state.hand_off_slices(|slot| plan.writes_slot(slot));
        state.clear_dirty();
        plan.with_slices(Box::new(handoff))
    }

    /// [`Self::plan_slices`] at the in-memory layouts' slices per key
    /// group.
    fn plan_in_slices(
        &mut self,
        checkpoint: CheckpointId,
        key_groups: KeyGroupRange,
        dirty: impl IntoIterator<Item = usize>,
    ) -> SnapshotPlan {
        self.plan_slices(checkpoint, key_groups, SLICES_PER_KEY_GROUP, dirty)
    }
}

/// The ledger's unit of the copy-on-write slot `slot` (group index times
/// `slices` plus slice): each group's units are its header, then its
/// slices.
fn slice_unit(slices: usize, slot: usize) -> usize {
    slot / slices * (slices + 1) + 1 + slot % slices
}

/// A snapshot's layout: per unit (key group, or slice), the range an
/// earlier checkpoint holds it at, or `None` when this snapshot writes it.
#[derive(Debug)]
pub(crate) struct SnapshotPlan {
    checkpoint: CheckpointId,
    /// The first key group of the state's range.
    start: u32,
    /// Units per key group: 1, or the copy-on-write state's slices.
    units_per_group: usize,
    layout: Vec<Option<SharedRange>>,
    /// Per key group of a spilling state's plan (empty otherwise): for a
    /// referred group, the delta parts after the base in `layout`; for a
    /// written one, the whole chain a delta part may extend (empty: the
    /// group is written whole).
    chains: Vec<Vec<SharedRange>>,
    /// Where to say the written groups landed; `None` for a full snapshot
    /// written into the part's own file (a savepoint, or a job without
    /// incremental checkpoints), which nothing refers to later.
    landed: Option<Landed>,
}

impl SnapshotPlan {
    /// A full snapshot of `key_groups` into the part's own file.
    pub(crate) fn full(key_groups: KeyGroupRange) -> Self {
        SnapshotPlan {
            checkpoint: CheckpointId(0),
            start: key_groups.start,
            units_per_group: 1,
            layout: vec![None; key_groups.len()],
            chains: Vec::new(),
            landed: None,
        }
    }

    /// Whether the snapshot writes `key_group` (rather than refer to it),
    /// for a plan in key groups.
    pub(crate) fn writes(&self, key_group: u32) -> bool {
        self.units_per_group == 1 && self.writes_unit(key_group.wrapping_sub(self.start) as usize)
    }

    /// Whether the snapshot writes the unit at `index` from the range's
    /// first (rather than refer to it).
    pub(crate) fn writes_unit(&self, index: usize) -> bool {
        self.layout.get(index).is_some_and(Option::is_none)
    }

    /// Whether a plan of [`KeyGroupLedger::plan_slices`] writes the slice
    /// at slot `slot`.
    pub(crate) fn writes_slot(&self, slot: usize) -> bool {
        let slices = self.units_per_group.saturating_sub(1).max(1);
        self.writes_unit(slice_unit(slices, slot))
    }

    /// The snapshot with an in-memory state's fresh slices of every key
    /// group (handed off by the copy-on-write state, encoded already by
    /// the flat one), to be assembled on the writer's thread.
    pub(crate) fn with_slices(self, slices: Box<dyn DeferredSlices>) -> KeyedSnapshotSlices {
        KeyedSnapshotSlices { plan: self, slices }
    }

    /// The snapshot with the parts of the groups it writes, ascending, to
    /// be encoded now or on the writer's thread.
    pub(crate) fn with_parts(self, parts: Box<dyn DeferredParts>) -> KeyedSnapshotParts {
        KeyedSnapshotParts::new(self, parts)
    }
}

/// Tells the ledger where an encoded snapshot's groups landed, when it
/// asked (`cell`); set once, as a snapshot is encoded once.
fn settle_landed(cell: Option<Landed>, landed: Vec<SharedRange>) {
    settle_landing(
        cell,
        Landing {
            ranges: landed,
            deltas: Vec::new(),
        },
    );
}

/// [`settle_landed`] with the delta flags of the units written.
fn settle_landing(cell: Option<Landed>, landing: Landing) {
    if let Some(cell) = cell {
        let _ = cell.set(landing);
    }
}

/// The whole snapshot of `state` as one segment of its own, the form of a
/// savepoint or of a job without incremental checkpoints.
pub(crate) fn full_segments(state: &mut impl KeyGroupSnapshots) -> Result<Vec<Segment>, BoxError> {
    let parts: KeyGroupParts = state.all_parts()?;
    Ok(vec![Segment::Own(encode_keyed_state(&parts)?)])
}

/// Appends `bytes` to the last segment when it is an own one, so that the
/// small framing bytes between key groups do not each become a segment.
pub(crate) fn push_own(segments: &mut Vec<Segment>, bytes: Vec<u8>) {
    match segments.last_mut() {
        Some(Segment::Own(last)) => last.extend_from_slice(&bytes),
        _ => segments.push(Segment::Own(bytes)),
    }
}

/// The bytes `segments` stand for, with referred ranges taken from
/// `lookup`. For tests: the store does this when it loads.
#[cfg(test)]
pub(crate) fn assemble(
    segments: &[Segment],
    mut lookup: impl FnMut(&SharedRange) -> Vec<u8>,
) -> Vec<u8> {
    let mut out = Vec::new();
    for segment in segments {
        match segment {
            Segment::Own(bytes) | Segment::Shared(bytes) => out.extend_from_slice(bytes),
            Segment::Reuse(range) => out.extend(lookup(range)),
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::job::ops::decode_keyed_state;
    use crate::keyed::test_support::Count;
    use crate::keyed::MaxParallelism;

    fn state() -> KeyedState<u64, Count> {
        KeyedState::for_subtask(MaxParallelism::new(16).unwrap(), 2, 1).unwrap()
    }

    /// Every checkpoint's shared file so far (its shared segments back to
    /// back), as the store writes it.
    #[derive(Default)]
    pub(crate) struct Written(pub(super) BTreeMap<u64, Vec<u8>>);

    impl Written {
        pub(crate) fn record(&mut self, segments: &[Segment], checkpoint: u64) {
            let file = self.0.entry(checkpoint).or_default();
            for segment in segments {
                if let Segment::Shared(bytes) = segment {
                    file.extend_from_slice(bytes);
                }
            }
        }

        pub(crate) fn assemble(&self, segments: &[Segment]) -> Vec<u8> {
            assemble(segments, |range| {
                let start = range.offset as usize;
                let bytes = self.0[&range.checkpoint][start..start + range.len as usize].to_vec();
                assert_eq!(crc32fast::hash(&bytes), range.crc32);
                bytes
            })
        }
    }

    /// The keys and counts of the keyed-state envelope `bytes`, restored
    /// into a flat state of `range` (every part's CRCs checked).
    pub(super) fn decoded(bytes: &[u8], range: KeyGroupRange) -> BTreeMap<u64, u64> {
        let parts = decode_keyed_state(bytes).unwrap();
        let restored: KeyedState<u64, Count> =
            KeyedState::restore(MaxParallelism::new(16).unwrap(), range, parts).unwrap();
        counts(restored.iter())
    }

    /// The keys and counts of a state's entries.
    pub(super) fn counts<'a>(
        entries: impl Iterator<Item = (&'a u64, &'a Count)>,
    ) -> BTreeMap<u64, u64> {
        entries.map(|(key, count)| (*key, count.count)).collect()
    }

    /// The keyed core's incremental snapshot of a flat state
    /// ([`KeyGroupLedger::snapshot_flat`]), its segments assembled by the
    /// caller.
    pub(super) fn take_flat(
        ledger: &mut KeyGroupLedger,
        checkpoint: u64,
        state: &mut KeyedState<u64, Count>,
    ) -> KeyedSnapshotSlices {
        ledger
            .snapshot_flat(CheckpointId(checkpoint), state)
            .unwrap()
    }

    fn count_shared(segments: &[Segment]) -> usize {
        segments
            .iter()
            .filter(|segment| matches!(segment, Segment::Shared(_)))
            .count()
    }

    pub(super) fn shared_len(segments: &[Segment]) -> u64 {
        segments
            .iter()
            .filter(|segment| matches!(segment, Segment::Shared(_)))
            .map(Segment::len)
            .sum()
    }

    #[test]
    fn flat_snapshots_restore_the_state_and_write_only_changed_slices() {
        let mut state = state();
        let keys: Vec<u64> = (0..1000).filter(|key| state.owns(key)).collect();
        let settings = IncrementalCheckpoints {
            enabled: true,
            full_every: 4,
        };
        let mut ledger = KeyGroupLedger::new(settings, state.range().len());
        let mut written = Written::default();
        for key in &keys {
            state.get_or_default(key).count += 1;
        }
        let range = state.range();
        let mut take = |ledger: &mut KeyGroupLedger, state: &mut KeyedState<u64, Count>, id| {
            let segments = take_flat(ledger, id, state).encode().unwrap();
            written.record(&segments, id);
            let assembled = written.assemble(&segments);
            assert_eq!(decoded(&assembled, range), counts(state.iter()));
            segments
        };
        let first = take(&mut ledger, &mut state, 1);
        assert_eq!(count_shared(&first), range.len(), "full: a run per group");

        // Not yet confirmed: everything is written again.
        state.get_or_default(&keys[0]).count += 1;
        let second = take(&mut ledger, &mut state, 2);
        assert_eq!(count_shared(&second), range.len());
        ledger.on_complete(CheckpointId(2));

        // Confirmed: only the touched slice and its group's header are
        // written (one run when no slice with entries comes between).
        state.get_or_default(&keys[1]).count += 1;
        let third = take(&mut ledger, &mut state, 3);
        assert!((1..=2).contains(&count_shared(&third)));
        assert!(shared_len(&third) * 20 < shared_len(&second));
        ledger.on_complete(CheckpointId(3));

        // Nothing touched: nothing written but the framing.
        let fourth = take(&mut ledger, &mut state, 4);
        assert_eq!(count_shared(&fourth), 0);
        ledger.on_complete(CheckpointId(4));

        // 1 started the chain and 2, 3 and 4 continued it: with
        // `full_every` 4, checkpoint 5 is full again.
        let fifth = take(&mut ledger, &mut state, 5);
        assert_eq!(count_shared(&fifth), range.len());
    }

    /// The keyed core's asynchronous snapshot of a copy-on-write state:
    /// planned and handed off now, encoded later.
    fn hand_off(
        ledger: &mut KeyGroupLedger,
        checkpoint: u64,
        state: &mut CowKeyedState<u64, Count>,
    ) -> KeyedSnapshotParts {
        let changed: Vec<u32> = state.dirty_key_groups().collect();
        let plan = ledger.plan(CheckpointId(checkpoint), state.range(), changed);
        let handoff = state.hand_off_key_groups(|key_group| plan.writes(key_group));
        state.clear_dirty();
        plan.with_parts(Box::new(handoff))
    }

    fn cow_bytes(state: &CowKeyedState<u64, Count>) -> Vec<u8> {
        let parts: KeyGroupParts = state
            .snapshot_key_groups(|_| true)
            .unwrap()
            .into_iter()
            .map(|part| (part.key_group, part.bytes))
            .collect();
        encode_keyed_state(&parts).unwrap()
    }

    #[test]
    fn writes_after_the_handoff_stay_out_of_the_encoded_snapshot() {
        let mut state: CowKeyedState<u64, Count> =
            CowKeyedState::for_subtask(MaxParallelism::new(16).unwrap(), 2, 1).unwrap();
        let keys: Vec<u64> = (0..1000).filter(|key| state.owns(key)).collect();
        let mut ledger =
            KeyGroupLedger::new(IncrementalCheckpoints::default(), state.range().len());
        let mut written = Written::default();
        for key in &keys {
            state.get_or_default(key).count += 1;
        }
        let at_handoff = cow_bytes(&state);
        let handoff = hand_off(&mut ledger, 1, &mut state);
        // The operator goes on before the writer encodes: every key is
        // written again, and each slice holding one is copied once (the
        // snapshot holds it).
        for key in &keys {
            state.get_or_default(key).count += 10;
        }
        let slices = keys
            .iter()
            .filter_map(|key| state.slot_of(key))
            .collect::<std::collections::BTreeSet<_>>()
            .len() as u64;
        assert_eq!(state.copied_key_groups(), slices);
        let segments = std::thread::spawn(move || handoff.encode().unwrap())
            .join()
            .unwrap();
        written.record(&segments, 1);
        assert_eq!(written.assemble(&segments), at_handoff);
        assert_ne!(cow_bytes(&state), at_handoff);

        // Once 1 is confirmed at the ranges the writer gave, an untouched
        // state refers to all of them and assembles to the same bytes.
        ledger.on_complete(CheckpointId(1));
        let settled = cow_bytes(&state);
        let second = hand_off(&mut ledger, 2, &mut state).encode().unwrap();
        assert_eq!(
            count_shared(&second),
            state.range().len(),
            "2 follows writes"
        );
        written.record(&second, 2);
        ledger.on_complete(CheckpointId(2));
        let third = hand_off(&mut ledger, 3, &mut state).encode().unwrap();
        assert_eq!(count_shared(&third), 0);
        assert_eq!(written.assemble(&third), settled);
        // No copy since the first hand-off: the writer had dropped the
        // groups before the state wrote them again.
        assert_eq!(state.copied_key_groups(), slices);
    }

    #[test]
    fn a_full_hand_off_encodes_the_bytes_of_a_full_snapshot() {
        let mut state: CowKeyedState<u64, Count> =
            CowKeyedState::for_subtask(MaxParallelism::new(16).unwrap(), 2, 0).unwrap();
        let keys: Vec<u64> = (0..2_000).filter(|key| state.owns(key)).collect();
        for key in keys {
            state.get_or_default(&key).count += key;
        }
        let expected = cow_bytes(&state);
        let plan = SnapshotPlan::full(state.range());
        let segments = plan
            .with_parts(Box::new(state.hand_off()))
            .encode()
            .unwrap();
        assert_eq!(segments, vec![Segment::Own(expected)]);
    }
}
