//! [`SpillSnapshot`]: a snapshot of the spilling backend that yields its
//! key groups' parts one at a time while the operator goes on writing.
//!
//! This module owns the streaming half of a spilling snapshot: choosing
//! where its entries come from (the previous snapshot's base merged with
//! the changes since, or else the disk table's MVCC view), building each
//! part in [`crate::keyed::part`]'s format, and writing the next base. It
//! never writes to the disk table, never chooses the key groups and never
//! writes a part anywhere: the caller (the checkpoint writer, or
//! [`SpillSnapshot::collect_parts`] for the synchronous path) does.
//!
//! # Two sources
//!
//! Reading the whole disk table back through fjall costs about a
//! microsecond per entry (its merge of memtables and segments, block
//! decoding and version filtering: BENCHMARKS.md at 07a44e5, "Checkpoints of the
//! spilling backend"), so a workload that changes every key group each
//! interval spent more CPU on checkpoints than on processing. A snapshot
//! therefore writes, beside its parts, a base: every entry of the disk
//! table as its view saw it, in one sorted local file ([`super::base`]).
//! The next snapshot merges that base with the entries written to the
//! disk table since ([`super::changes`]), a sequential pass of tens of
//! nanoseconds per entry, and drops its fjall view at once. It falls back
//! to the view when there is no finished base of the epoch before, or the
//! change log gave up (the distinct keys written since the previous
//! snapshot took more than half its bound, even compacted); the fallback
//! reads every key group (not only the requested ones), since the base
//! must hold them all. The fallback costs a microsecond or more per entry
//! and version on the writer's thread and keeps fjall's old versions
//! alive meanwhile: at 100 k keys, when the log's bound was six entries
//! per budgeted key, every snapshot fell back and checkpoints took about
//! a second (BENCHMARKS.md at 07a44e5, "The spilling backend's change log").
//!
//! # The hot overlay
//!
//! The disk table (and so every base) holds only what was evicted to it,
//! possibly stale for a key that was read back and changed since. The
//! in-memory ("hot") entries of the picked key groups come frozen with
//! the snapshot ([`super::hot`]); each part is the group's disk entries
//! with the hot ones laid over them, both runs in key order, the hot entry
//! winning on the same key. The base written beside the parts gets the
//! disk entries only, so the next snapshot's merge still starts from the
//! disk table as it was (the module doc of [`super::state`] says why a
//! deleted key cannot come back: it is deleted on disk at once).
//!
//! # The bound
//!
//! Taking the snapshot ([`super::SpillingState::snapshot`]) costs, on the
//! operator's thread, constant time per slice of the picked key groups
//! (their tables are frozen, not read), taking the change log (constant
//! time) and a constant-time fjall snapshot. While it is alive it holds
//! at most one part and one group's encoded hot entries, the sorted
//! change log (bounded in `sizing.rs`) and two file buffers in memory,
//! besides the frozen slices (the operator encodes a slice it changes
//! while frozen, once, keeping the entries the snapshot takes of it, or
//! copies it in the rare case that the writer is reading it at that
//! moment: at most one extra copy of what changed, at most the memory
//! budget); a view it reads keeps fjall's old versions on disk
//! meanwhile. State that never left memory has no store: its parts
//! are the hot entries alone, encoded on the writer's thread too.
//!
//! # Delta parts
//!
//! A picked group the caller asked for as a delta
//! ([`super::SpillingState::snapshot_with_deltas`]) gets only the entries
//! the change log holds and the hot entries written since, as a delta
//! part ([`crate::keyed::part`], "Delta chains"). Whether a group is a
//! delta is settled when the snapshot is taken, never by the writer: the
//! state plans none when its log missed changes or the group lost a key,
//! and a snapshot that falls back to the view still writes its deltas
//! from the changes (the view gives only the next base). So the hot
//! entries a delta needs (those written since the previous snapshot) are
//! known on the operator's thread.
//!
//! A key group with no change on disk since the previous base keeps that
//! base's file and runs, and is read only when its part is whole. A
//! changed group written as a delta (or not requested) is not read: its
//! changes go into its delta part and are appended to its base as one
//! more sorted run ([`super::runs`]); a group written whole, or one past
//! the runs' bound ([`super::source`], "The bound on runs"), is read whole
//! (file, runs and changes merged) and its file rewritten with no runs.
//! Known gap: so a whole part still costs I/O and CPU (off the operator's
//! thread) that grow with the group's size, not with its changes, and a
//! snapshot writes one run file even when its runs are tiny.

use std::cmp::Ordering;
use std::sync::Arc;

use super::base::{BaseWriter, Bases};
use super::changes::Changes;
use super::disk::DiskSnapshot;
use super::evict::stamp;
use super::hot::{HotEntries, HotGroups};
use super::order::compare_keys;
use super::source::{GroupPlan, GroupSource};
use super::SpillError;
use crate::keyed::backend::KeyGroupPart;
use crate::keyed::key_group::{KeyGroupRange, MaxParallelism};
use crate::keyed::part::PartWriter;

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The parts of some key groups of a [`super::SpillingState`] as they were
/// when it was taken, yielded in ascending key-group order by
/// [`Self::next_part`]. It is `Send`: it may be read on another thread
/// while the state goes on changing.
pub struct SpillSnapshot {
    streamed: Box<Streamed>,
}

/// What a snapshot of a state took, and how far its reading is.
pub(super) struct Taken {
    /// The disk table's view; dropped as soon as the snapshot merges
    /// instead (it keeps fjall's old versions).
    pub(super) view: Option<DiskSnapshot>,
    /// The entries written to (and deleted from) the disk table since the
    /// previous snapshot, if the log missed none.
    pub(super) changes: Option<Changes>,
    pub(super) bases: Arc<Bases>,
    /// This snapshot's number; the previous snapshot's is one less.
    pub(super) epoch: u64,
    /// Every key group of the state, and which of them to yield.
    pub(super) range: KeyGroupRange,
    pub(super) picked: Vec<bool>,
    /// The part's schema section, the same for every key group.
    pub(super) schema: Vec<u8>,
    pub(super) max_parallelism: MaxParallelism,
    /// The in-memory entries of the picked key groups, laid over the disk
    /// table's (they are newer).
    pub(super) hot: Box<dyn HotGroups>,
    /// Whether the state has a disk table; without one the hot entries are
    /// the whole state and no base is written.
    pub(super) spilled: bool,
    /// Per key group of the range, whether a picked group is written
    /// as a delta part (its entries changed since the previous snapshot)
    /// rather than whole; false for every group when `changes` is `None`
    /// (the log missed some).
    pub(super) deltas: Vec<bool>,
}

/// A snapshot being read.
struct Streamed {
    taken: Taken,
    /// Chosen at the first part; `None` before and after.
    reader: Option<GroupSource>,
    /// The base this snapshot writes, if it writes one.
    base: Option<BaseWriter>,
    /// The next key group to read.
    next: u32,
    parts_left: usize,
    /// Set once every key group was read, or after an error.
    done: bool,
    /// Whether the entries came from the previous base (for tests and
    /// figures).
    merged: bool,
}

impl std::fmt::Debug for SpillSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillSnapshot")
            .field("parts_left", &self.parts_left())
            .finish()
    }
}

impl SpillSnapshot {
    /// A snapshot reading what `taken` holds.
    pub(super) fn new(taken: Taken) -> Self {
        let parts_left = taken.picked.iter().filter(|picked| **picked).count();
        let next = taken.range.start;
        SpillSnapshot {
            streamed: Box::new(Streamed {
                taken,
                reader: None,
                base: None,
                next,
                parts_left,
                done: false,
                merged: false,
            }),
        }
    }

    /// How many parts are still to come.
    pub fn parts_left(&self) -> usize {
        self.streamed.parts_left
    }

    /// Whether this snapshot was built from the previous snapshot's base
    /// and the changes since, rather than read from the disk table; known
    /// once its first part was asked for.
    #[cfg(test)]
    pub(crate) fn merged(&self) -> bool {
        self.streamed.merged
    }

    /// The next key group's part, ascending, or `None` when every part was
    /// yielded. A part that fails (the store or a base could not be read)
    /// is an error, and the snapshot yields nothing after it.
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
        let streamed = &mut self.streamed;
        match streamed.step() {
            Ok(part) => part.map(Ok),
            Err(error) => {
                streamed.abandon();
                Some(Err(error))
            }
        }
    }
}

impl Streamed {
    /// The next requested part; after the last one, the remaining key
    /// groups are read at once, so that the base is finished even if the
    /// caller asks for nothing more.
    fn step(&mut self) -> Result<Option<KeyGroupPart>, SpillError> {
        if self.done {
            return Ok(None);
        }
        if self.reader.is_none() {
            self.start()?;
        }
        while self.next < self.taken.range.end {
            let key_group = self.next;
            self.next += 1;
            if let Some(part) = self.read_group(key_group)? {
                self.parts_left -= 1;
                if self.parts_left == 0 {
                    self.finish()?;
                }
                return Ok(Some(part));
            }
        }
        self.finish()?;
        Ok(None)
    }

    /// Chooses the disk table's source: none when the state never
    /// spilled, the previous base with the changes when both are
    /// complete, or else the view.
    fn start(&mut self) -> Result<(), SpillError> {
        let taken = &mut self.taken;
        if !taken.spilled {
            self.reader = Some(GroupSource::Empty);
            return Ok(());
        }
        let changes = taken.changes.take();
        let view = taken.view.take();
        let previous = taken.epoch.checked_sub(1);
        let base = match (&changes, previous) {
            (Some(_), Some(previous)) => taken.bases.open(previous),
            _ => None,
        };
        self.base = Some(taken.bases.writer(taken.epoch)?);
        let reader = match (base, changes) {
            (Some(base), Some(changes)) => {
                self.merged = true;
                drop(view);
                GroupSource::Merge {
                    base,
                    changes: changes.sorted(),
                }
            }
            (_, changes) => {
                let view = view.ok_or_else(|| {
                    SpillError::Internal("a snapshot's view was taken twice".into())
                })?;
                // A delta part's disk entries are its group's changes, so
                // they are sorted when some picked group is a delta.
                let deltas = taken.picked.iter().zip(&taken.deltas);
                let changes = changes
                    .filter(|_| deltas.into_iter().any(|(picked, delta)| *picked && *delta))
                    .map(Changes::sorted);
                GroupSource::View { view, changes }
            }
        };
        self.reader = Some(reader);
        Ok(())
    }

    /// Builds `key_group`'s part if it was requested, and its base: the
    /// disk's entries overlaid by the hot ones (both runs ascending by
    /// key; on the same key the hot entry wins, since the disk's is the
    /// older). What is read depends on the group's [`GroupPlan`]: a group
    /// that did not change on disk since the previous base keeps that
    /// base's file and runs, and is read only for a whole part; a changed
    /// group whose part is a delta (or that is not requested) gets its
    /// changes appended as a run, and only they are read; any other is
    /// read whole (base file, runs and changes) into a new file.
    fn read_group(&mut self, key_group: u32) -> Result<Option<KeyGroupPart>, SpillError> {
        let taken = &mut self.taken;
        let index = (key_group - taken.range.start) as usize;
        let picked = taken.picked[index];
        let reader = self
            .reader
            .as_mut()
            .ok_or_else(|| SpillError::Internal("a snapshot read before it started".into()))?;
        // The state plans a delta only with the changes (`take`), which
        // every source then knows.
        let delta = picked && taken.deltas[index];
        if delta && !reader.knows_changes() {
            return Err(SpillError::Internal(format!(
                "key group {key_group} is a delta, but the snapshot has no changes"
            )));
        }
        let plan = reader.plan(key_group, picked && !delta)?;
        let keeps = matches!(plan, GroupPlan::Keep(_));
        let appends = matches!(plan, GroupPlan::Append(_));
        if let Some(base) = &mut self.base {
            match plan {
                GroupPlan::Keep(group) => base.keep_group(key_group, group)?,
                GroupPlan::Append(group) => base.append_group(key_group, group)?,
                GroupPlan::Rewrite => base.begin_group(key_group)?,
            }
        }
        if !picked && keeps {
            return Ok(None);
        }
        let hot = if picked {
            taken
                .hot
                .group(key_group, delta.then_some(stamp(taken.epoch)))?
        } else {
            HotEntries::default()
        };
        let mut overlay = Overlay {
            part: picked.then(|| PartWriter::new(&taken.schema)),
            hot,
            next_hot: 0,
            delta,
        };
        let base = &mut self.base;
        if keeps {
            // Unchanged on disk: a delta holds only the hot entries written
            // since the previous snapshot.
            if !delta {
                reader.for_each_in(key_group, |key, value, changed| {
                    overlay.disk(key, value, changed)
                })?;
            }
        } else if appends {
            reader.changes_in(key_group, |key, value, changed| {
                if let Some(base) = base.as_mut() {
                    base.push_change(key, value)?;
                }
                match value {
                    Some(value) => overlay.disk(key, value, changed),
                    None => Ok(()),
                }
            })?;
        } else if delta && reader.is_view() {
            // The view gives the next base but not which entries changed:
            // the delta takes the group's changes, as an appended group's.
            reader.changes_in(key_group, |key, value, changed| match value {
                Some(value) => overlay.disk(key, value, changed),
                None => Ok(()),
            })?;
            reader.for_each_in(key_group, |key, value, _| match base.as_mut() {
                Some(base) => base.push(key, value),
                None => Ok(()),
            })?;
        } else {
            reader.for_each_in(key_group, |key, value, changed| {
                if let Some(base) = base.as_mut() {
                    base.push(key, value)?;
                }
                overlay.disk(key, value, changed)
            })?;
        }
        overlay.finish(taken.max_parallelism, key_group)
    }

    /// Reads every key group left and publishes the base.
    fn finish(&mut self) -> Result<(), SpillError> {
        while self.next < self.taken.range.end {
            let key_group = self.next;
            self.next += 1;
            self.read_group(key_group)?;
        }
        self.done = true;
        if let Some(reader) = self.reader.take() {
            reader.finish()?;
        }
        if let Some(base) = self.base.take() {
            base.finish()?;
        }
        Ok(())
    }

    /// Stops after an error: the half-written base is deleted, so the next
    /// snapshot reads the disk table.
    fn abandon(&mut self) {
        self.done = true;
        self.parts_left = 0;
        self.reader = None;
        self.base = None;
    }
}

/// One requested group's part being built: the disk's entries as they
/// come, with the group's hot entries laid over them.
struct Overlay {
    /// `None` for a group that is not requested (only its base is
    /// written).
    part: Option<PartWriter>,
    hot: HotEntries,
    next_hot: usize,
    /// Whether the part is a delta: a disk entry unchanged since the
    /// previous snapshot is left out (its chain has it).
    delta: bool,
}

impl Overlay {
    /// Adds the disk's `key` and `value` (`changed` since the previous
    /// snapshot, or not), after the hot entries before it; a hot entry of
    /// the same key replaces it.
    fn disk(&mut self, key: &[u8], value: &[u8], changed: bool) -> Result<(), SpillError> {
        let Some(part) = &mut self.part else {
            return Ok(());
        };
        while let Some((hot_key, hot_value)) = self.hot.get(self.next_hot) {
            let order = compare_keys(hot_key, key);
            if order == Ordering::Greater {
                break;
            }
            part.push_encoded(&hot_key[4..], hot_value)?;
            self.next_hot += 1;
            if order == Ordering::Equal {
                // The hot value replaces the disk's.
                return Ok(());
            }
        }
        if self.delta && !changed {
            // Unchanged since the previous snapshot: its chain has it.
            return Ok(());
        }
        Ok(part.push_encoded(&key[4..], value)?)
    }

    /// The part, after the hot entries left; `None` if not requested.
    fn finish(
        mut self,
        max_parallelism: MaxParallelism,
        key_group: u32,
    ) -> Result<Option<KeyGroupPart>, SpillError> {
        let Some(mut part) = self.part.take() else {
            return Ok(None);
        };
        while let Some((hot_key, hot_value)) = self.hot.get(self.next_hot) {
            part.push_encoded(&hot_key[4..], hot_value)?;
            self.next_hot += 1;
        }
        let bytes = if self.delta {
            part.finish_delta(max_parallelism, key_group)
        } else {
            part.finish(max_parallelism, key_group)
        };
        Ok(Some(KeyGroupPart { key_group, bytes }))
    }
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
    fn state_that_never_spilled_is_yielded_in_the_in_memory_backends_format() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spilled, mut plain) = (spilling(dir.path(), 1_000), memory());
        touch(&mut spilled, &mut plain, &owned_keys(50), 0);
        let snapshot = spilled
            .snapshot(&mut |key_group| key_group % 2 == 1)
            .unwrap();
        // The entries ordered by their encoded keys, as a spilled state's.
        assert_eq!(
            drain(snapshot),
            expected_parts(&plain, |key_group| key_group % 2 == 1)
        );
        assert!(!dir.path().join("instance").exists());
    }

    /// Takes a snapshot of the groups `include` picks and checks its parts
    /// against `plain`'s; returns whether it merged the previous base.
    fn check_snapshot(
        spilled: &mut SpillingState<u64, Count>,
        plain: &KeyedState<u64, Count>,
        include: impl Fn(u32) -> bool,
    ) -> bool {
        let mut snapshot = spilled
            .snapshot(&mut |key_group| include(key_group))
            .unwrap();
        let mut parts = Vec::new();
        let first = snapshot.next_part();
        let merged = snapshot.merged();
        parts.extend(first.map(Result::unwrap));
        parts.extend(drain(snapshot));
        assert_eq!(parts, expected_parts(plain, include));
        merged
    }

    #[test]
    fn later_snapshots_merge_the_previous_base_and_equal_a_read_of_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spilled, mut plain) = (spilling(dir.path(), 8), memory());
        let keys = owned_keys(300);
        touch(&mut spilled, &mut plain, &keys, 0);
        assert!(!check_snapshot(&mut spilled, &plain, |_| true));
        for round in 1..8u64 {
            // Changes on disk and in memory, some new keys, and snapshots
            // that leave some (changed) groups out.
            let from = (round as usize * 37) % 200;
            touch(&mut spilled, &mut plain, &keys[from..from + 100], round);
            let more = owned_keys(300 + round as usize * 10);
            touch(&mut spilled, &mut plain, &more[300..], round);
            let merged = check_snapshot(&mut spilled, &plain, |key_group| {
                (u64::from(key_group) + round) % 3 != 0
            });
            assert!(merged, "round {round}");
        }
        assert!(check_snapshot(&mut spilled, &plain, |_| true));
        assert_eq!(
            spilled.snapshot_parts().unwrap(),
            expected_parts(&plain, |_| true)
        );
    }

    /// The base files in the state's bases directory, by epoch.
    fn base_files(dir: &std::path::Path) -> BTreeMap<u64, Vec<u32>> {
        let mut files: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
        for entry in std::fs::read_dir(dir.join("instance.bases")).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            let mut fields = name.trim_start_matches("base-").split('-');
            let epoch = fields.next().unwrap().parse().unwrap();
            let group = fields.next().unwrap().parse().unwrap();
            files.entry(epoch).or_default().push(group);
        }
        files.values_mut().for_each(|groups| groups.sort());
        files
    }

    #[test]
    fn a_snapshot_rewrites_the_base_files_of_only_the_groups_changed_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spilled, mut plain) = (spilling(dir.path(), 8), memory());
        let keys = owned_keys(200);
        touch(&mut spilled, &mut plain, &keys, 0);
        assert!(!check_snapshot(&mut spilled, &plain, |_| true));
        let first = base_files(dir.path());
        assert_eq!(first.keys().copied().collect::<Vec<_>>(), vec![1]);
        assert_eq!(first[&1], range().iter().collect::<Vec<_>>());
        // Nothing written to disk since, whatever is picked: every group
        // keeps its file.
        assert!(check_snapshot(&mut spilled, &plain, |_| false));
        assert!(check_snapshot(&mut spilled, &plain, |_| true));
        assert_eq!(base_files(dir.path()), first);
        // A deletion on disk changes one group: only its file is new.
        let key = *keys.iter().find(|key| !spilled.in_memory(key)).unwrap();
        spilled.remove(&key).unwrap();
        plain.remove(&key);
        let group = plain.key_group_of(&key);
        assert!(check_snapshot(&mut spilled, &plain, |_| true));
        let files = base_files(dir.path());
        assert_eq!(files[&4], vec![group]);
        assert_eq!(files[&1].len(), range().len() - 1);
        assert!(check_snapshot(&mut spilled, &plain, |key_group| key_group != group));
    }

    #[test]
    fn a_snapshot_dropped_half_way_leaves_the_next_one_reading_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spilled, mut plain) = (spilling(dir.path(), 8), memory());
        let keys = owned_keys(300);
        touch(&mut spilled, &mut plain, &keys, 0);
        assert!(!check_snapshot(&mut spilled, &plain, |_| true));
        touch(&mut spilled, &mut plain, &keys[..50], 1);
        let mut dropped = spilled.snapshot(&mut |_| true).unwrap();
        dropped.next_part().unwrap().unwrap();
        assert!(dropped.merged());
        drop(dropped);
        touch(&mut spilled, &mut plain, &keys[50..100], 2);
        assert!(!check_snapshot(&mut spilled, &plain, |_| true));
        touch(&mut spilled, &mut plain, &keys[100..150], 3);
        assert!(check_snapshot(&mut spilled, &plain, |_| true));
    }

    /// A state with 8 keys in memory and a change log of at most 1,000
    /// entries, and its model.
    fn with_small_change_log(
        dir: &std::path::Path,
    ) -> (SpillingState<u64, Count>, KeyedState<u64, Count>) {
        let spilled = spilling(dir, 8).with_change_log_bound(1_000, 100_000);
        (spilled, memory())
    }

    #[test]
    fn an_overflowing_change_log_or_a_restore_falls_back_to_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spilled, mut plain) = with_small_change_log(dir.path());
        let keys = owned_keys(3_000);
        touch(&mut spilled, &mut plain, &keys, 0);
        assert!(!check_snapshot(&mut spilled, &plain, |_| true));
        // With 8 keys in memory nearly every touch writes one entry, of
        // about 3,000 distinct keys: more than half the log's bound of
        // 1,000 entries even once compacted.
        for round in 1..4 {
            touch(&mut spilled, &mut plain, &keys, round);
        }
        assert!(!check_snapshot(&mut spilled, &plain, |_| true));
        touch(&mut spilled, &mut plain, &keys[..10], 4);
        assert!(check_snapshot(&mut spilled, &plain, |_| true));
        // A restore replaces the table: its first snapshot reads it.
        let parts = spilled.snapshot_parts().unwrap();
        spilled
            .restore(parts.into_iter().map(|part| (part.key_group, part.bytes)))
            .unwrap();
        touch(&mut spilled, &mut plain, &keys[..10], 5);
        assert!(!check_snapshot(&mut spilled, &plain, |_| true));
        assert!(check_snapshot(&mut spilled, &plain, |_| true));
    }

    #[test]
    fn a_change_log_past_its_bound_compacts_and_the_next_snapshot_still_merges() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spilled, mut plain) = with_small_change_log(dir.path());
        let keys = owned_keys(300);
        touch(&mut spilled, &mut plain, &keys, 0);
        assert!(!check_snapshot(&mut spilled, &plain, |_| true));
        // About 2,400 writes to disk of 300 distinct keys between two
        // snapshots: past the bound of 1,000 entries more than once, but
        // each compaction keeps at most 300, under half of it.
        for round in 1..9 {
            touch(&mut spilled, &mut plain, &keys, round);
        }
        assert!(spilled.change_log_compactions() >= 2);
        assert!(check_snapshot(&mut spilled, &plain, |_| true));
        // Again, with deletions among the writes: a compacted tombstone
        // still drops its key from the base.
        for key in keys.iter().step_by(7) {
            spilled.remove(key).unwrap();
            plain.remove(key);
        }
        let compactions = spilled.change_log_compactions();
        for round in 9..17 {
            touch(&mut spilled, &mut plain, &keys[..150], round);
        }
        assert!(spilled.change_log_compactions() > compactions);
        assert!(check_snapshot(&mut spilled, &plain, |_| true));
    }
}
