//! [`GroupSource`]: where a spilling snapshot reads its entries from, one
//! key group at a time, ascending: the disk table's MVCC view, or the
//! previous snapshot's base (a file and sorted change runs per group)
//! merged with the changes since.
//!
//! This module owns which source a group's entries come from (the view,
//! or the group's base file and runs merged with the sorted changes by
//! [`super::merge`]: the newest value wins, and a deletion drops the key),
//! the checks that the changes stay in key-group order, and the choice of
//! what a snapshot does with a changed group's base ([`GroupPlan`]): keep
//! it, append the changes as one more run, or rewrite it whole. It never
//! builds a part, never writes a base and never decides which source a
//! snapshot uses ([`super::snapshot`] does).
//!
//! # The bound on runs
//!
//! A group's changes are appended as a run unless the snapshot needs the
//! whole group anyway (a whole part), or the group's runs would then hold
//! more records than half its base file's entries, or more than
//! [`MAX_RUNS`] runs. So the disk a group's base takes is at most about one
//! and a half times its entries (plus the newest run), a whole read merges
//! at most that many records and `MAX_RUNS + 2` sorted inputs (one open
//! file and a 64 KiB buffer per run; [`super::merge`] costs a binary
//! search among the runs per record they give), and each rewrite is paid
//! for by at least half its size in appended changes. The half matches
//! the chain planner's bound on delta bytes (`job/incremental/chains.rs`),
//! which writes a group whole once its deltas pass half its base part's
//! bytes, and `MAX_RUNS` is above the default fifty parts per chain
//! (`DEFAULT_FULL_EVERY`), so that compactions mostly coincide with whole
//! parts, which must read the group whole anyway.

use std::sync::Arc;

use super::base::{Base, GroupBase};
use super::changes::SortedChanges;
use super::disk::DiskSnapshot;
use super::merge::{in_group, merge_group};
use super::SpillError;

/// The most runs a group's base keeps; one more rewrites its file.
pub(crate) const MAX_RUNS: usize = 64;

/// The entries of one snapshot's disk table, in its key order.
pub(crate) enum GroupSource {
    /// No disk table: the state never spilled.
    Empty,
    /// The disk table as the snapshot's view sees it (a prefix scan per
    /// key group), and, when the snapshot writes delta parts, the changes
    /// since the previous snapshot: a delta's disk entries are its group's
    /// changes, whichever source gives the next base
    /// ([`Self::changes_in`]).
    View {
        view: DiskSnapshot,
        changes: Option<SortedChanges>,
    },
    /// The previous base, with every entry written since laid over it.
    Merge {
        base: Arc<Base>,
        changes: SortedChanges,
    },
}

/// What a snapshot does with one key group's base.
#[derive(Debug)]
pub(crate) enum GroupPlan {
    /// Nothing of the group changed on disk: the next base keeps its file
    /// and runs (`None`: the group stays empty).
    Keep(Option<GroupBase>),
    /// The next base keeps the group's file and runs (`None`: none) and
    /// appends the group's changes as one more run
    /// ([`GroupSource::changes_in`]); the group is not read.
    Append(Option<GroupBase>),
    /// The group is read whole ([`GroupSource::for_each_in`]) into a new
    /// file with no runs.
    Rewrite,
}

impl GroupSource {
    /// What to do with `key_group`'s base; `whole` when the snapshot reads
    /// the group whole anyway (a whole part). Key groups must be asked for
    /// in ascending order, before their entries.
    pub(crate) fn plan(&mut self, key_group: u32, whole: bool) -> Result<GroupPlan, SpillError> {
        let (base, changes) = match self {
            GroupSource::Empty => return Ok(GroupPlan::Keep(None)),
            GroupSource::View { .. } => return Ok(GroupPlan::Rewrite),
            GroupSource::Merge { base, changes } => (base, changes),
        };
        let prefix = key_group.to_be_bytes();
        let group = base.group(key_group);
        if in_group(changes.peek(), &prefix)?.is_none() {
            return Ok(GroupPlan::Keep(group.cloned()));
        }
        let new = changes.count_with_prefix(&prefix) as u64;
        let (file_entries, run_entries, runs) = group.map_or((0, 0, 0), |group| {
            (group.file_entries(), group.run_entries(), group.runs())
        });
        if whole || runs >= MAX_RUNS || run_entries + new > file_entries / 2 {
            return Ok(GroupPlan::Rewrite);
        }
        Ok(GroupPlan::Append(group.cloned()))
    }

    /// Calls `f` with every `(key, value)` of `key_group`, ascending by
    /// key, and whether the value came from the changes since the
    /// previous base and may differ from the key's value then (a record
    /// not marked unchanged; always `false` for a view, which skips the
    /// group's changes). Key groups must be asked for in ascending order.
    pub(crate) fn for_each_in(
        &mut self,
        key_group: u32,
        f: impl FnMut(&[u8], &[u8], bool) -> Result<(), SpillError>,
    ) -> Result<(), SpillError> {
        let mut f = f;
        match self {
            GroupSource::Empty => Ok(()),
            GroupSource::View { view, changes } => {
                view.scan_key_group(key_group, |key, value| f(key, value, false))?;
                if let Some(changes) = changes {
                    skip_group(changes, key_group)?;
                }
                Ok(())
            }
            GroupSource::Merge { base, changes } => {
                let mut readers = match base.group(key_group) {
                    Some(group) => group.readers()?,
                    None => Vec::new(),
                };
                merge_group(&mut readers, changes, key_group, f)
            }
        }
    }

    /// Calls `f` with every change of `key_group` since the previous base
    /// (`None`: a deletion), ascending by key, and whether it may differ
    /// from the key's value then. Only for a source that knows the
    /// changes (nothing otherwise); key groups must be asked for in
    /// ascending order, and a view's before [`Self::for_each_in`].
    pub(crate) fn changes_in(
        &mut self,
        key_group: u32,
        mut f: impl FnMut(&[u8], Option<&[u8]>, bool) -> Result<(), SpillError>,
    ) -> Result<(), SpillError> {
        let changes = match self {
            GroupSource::Merge { changes, .. } => changes,
            GroupSource::View {
                changes: Some(changes),
                ..
            } => changes,
            _ => return Ok(()),
        };
        let prefix = key_group.to_be_bytes();
        while let Some((key, value)) = in_group(changes.peek(), &prefix)? {
            f(key, value, changes.peek_changed())?;
            changes.advance();
        }
        Ok(())
    }

    /// Whether a delta part can be built from this source: it knows the
    /// changes since the previous snapshot (a merge, a view with them, or
    /// no disk table at all).
    pub(crate) fn knows_changes(&self) -> bool {
        !matches!(self, GroupSource::View { changes: None, .. })
    }

    /// Whether this is a view of the disk table (which gives no changed
    /// flags: a delta part takes its group's changes instead).
    pub(crate) fn is_view(&self) -> bool {
        matches!(self, GroupSource::View { .. })
    }

    /// Fails if a merge left changes unread: keys outside the key groups
    /// asked for, i.e. a bug.
    pub(crate) fn finish(mut self) -> Result<(), SpillError> {
        match &mut self {
            GroupSource::Empty | GroupSource::View { changes: None, .. } => Ok(()),
            GroupSource::Merge { changes, .. }
            | GroupSource::View {
                changes: Some(changes),
                ..
            } => {
                if changes.peek().is_some() {
                    return Err(SpillError::Internal(
                        "a snapshot's changes held keys outside its key groups".into(),
                    ));
                }
                Ok(())
            }
        }
    }
}

/// Moves `changes` past `key_group`'s entries.
fn skip_group(changes: &mut SortedChanges, key_group: u32) -> Result<(), SpillError> {
    let prefix = key_group.to_be_bytes();
    while in_group(changes.peek(), &prefix)?.is_some() {
        changes.advance();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyed::spill::base::Bases;
    use crate::keyed::spill::changes::ChangeLog;

    fn key(group: u32, rest: &[u8]) -> Vec<u8> {
        let mut key = group.to_be_bytes().to_vec();
        key.extend_from_slice(rest);
        key
    }

    /// A merge of `base` and `changes`, with the bases that own its files
    /// (dropping them deletes the files).
    fn merge(
        dir: &std::path::Path,
        base: &[(Vec<u8>, &[u8])],
        changes: &[(Vec<u8>, &[u8])],
    ) -> (std::sync::Arc<Bases>, GroupSource) {
        let bases = Bases::new(dir.join("bases"));
        let mut writer = bases.writer(1).unwrap();
        let mut group = None;
        for (key, value) in base {
            let key_group = u32::from_be_bytes(key[..4].try_into().unwrap());
            if group != Some(key_group) {
                writer.begin_group(key_group).unwrap();
                group = Some(key_group);
            }
            writer.push(key, value).unwrap();
        }
        writer.finish().unwrap();
        let mut log = ChangeLog::new(100, 10_000);
        log.take();
        for (key, value) in changes {
            log.record(key, value);
        }
        let source = GroupSource::Merge {
            base: bases.open(1).unwrap(),
            changes: log.take().unwrap().sorted(),
        };
        (bases, source)
    }

    fn group(source: &mut GroupSource, key_group: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        source
            .for_each_in(key_group, |key, value, _| {
                out.push((key.to_vec(), value.to_vec()));
                Ok(())
            })
            .unwrap();
        out
    }

    #[test]
    fn a_merge_lays_the_changes_over_the_base_group_by_group() {
        let dir = tempfile::tempdir().unwrap();
        let base = [
            (key(1, b"a"), &b"1"[..]),
            (key(1, b"c"), b"1"),
            (key(3, b"a"), b"1"),
        ];
        let changes = [
            (key(3, b"b"), &b"2"[..]),
            (key(1, b"c"), b"2"),
            (key(1, b"b"), b"2"),
            (key(2, b"a"), b"2"),
            (key(1, b"c"), b"3"),
        ];
        let (_bases, mut source) = merge(dir.path(), &base, &changes);
        let owned = |entries: &[(Vec<u8>, &[u8])]| -> Vec<(Vec<u8>, Vec<u8>)> {
            entries
                .iter()
                .map(|(k, v)| (k.clone(), v.to_vec()))
                .collect()
        };
        assert_eq!(group(&mut source, 0), Vec::new());
        assert_eq!(
            group(&mut source, 1),
            owned(&[
                (key(1, b"a"), b"1"),
                (key(1, b"b"), b"2"),
                (key(1, b"c"), b"3")
            ])
        );
        assert_eq!(group(&mut source, 2), owned(&[(key(2, b"a"), b"2")]));
        assert_eq!(
            group(&mut source, 3),
            owned(&[(key(3, b"a"), b"1"), (key(3, b"b"), b"2")])
        );
        source.finish().unwrap();
    }

    #[test]
    fn a_deletion_drops_the_key_from_the_base_and_a_key_never_there_stays_out() {
        let dir = tempfile::tempdir().unwrap();
        let bases = Bases::new(dir.path().join("bases"));
        let mut writer = bases.writer(1).unwrap();
        writer.begin_group(1).unwrap();
        writer.push(&key(1, b"a"), b"1").unwrap();
        writer.push(&key(1, b"b"), b"1").unwrap();
        writer.finish().unwrap();
        let mut log = ChangeLog::new(100, 10_000);
        log.take();
        log.record_deletion(&key(1, b"a"));
        log.record_deletion(&key(1, b"c"));
        log.record(&key(1, b"d"), b"2");
        log.record_deletion(&key(1, b"d"));
        let mut source = GroupSource::Merge {
            base: bases.open(1).unwrap(),
            changes: log.take().unwrap().sorted(),
        };
        assert_eq!(group(&mut source, 1), vec![(key(1, b"b"), b"1".to_vec())]);
        source.finish().unwrap();
    }

    #[test]
    fn changes_left_outside_the_groups_asked_for_or_a_misfiled_base_entry_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let (_bases, mut source) = merge(dir.path(), &[], &[(key(5, b"a"), &b"1"[..])]);
        assert_eq!(group(&mut source, 4), Vec::new());
        assert!(source.finish().is_err());
        // A group asked for after its changes' group was passed: the runs
        // are out of order.
        let (_bases, mut source) = merge(dir.path(), &[], &[(key(2, b"a"), &b"1"[..])]);
        assert!(source.for_each_in(3, |_, _, _| Ok(())).is_err());
        // A base file holding another group's key.
        let bases = Bases::new(dir.path().join("misfiled"));
        let mut writer = bases.writer(1).unwrap();
        writer.begin_group(3).unwrap();
        writer.push(&key(2, b"a"), b"1").unwrap();
        writer.finish().unwrap();
        let mut log = ChangeLog::new(100, 10_000);
        log.take();
        let mut source = GroupSource::Merge {
            base: bases.open(1).unwrap(),
            changes: log.take().unwrap().sorted(),
        };
        assert!(source.for_each_in(3, |_, _, _| Ok(())).is_err());
    }

    #[test]
    fn a_group_without_changes_keeps_its_base_and_a_changed_one_appends_or_rewrites() {
        let dir = tempfile::tempdir().unwrap();
        let base: Vec<(Vec<u8>, &[u8])> = (0..10u8)
            .map(|i| (key(2, &[i]), &b"1"[..]))
            .chain([(key(1, b"a"), &b"1"[..])])
            .collect();
        let mut base = base;
        base.sort();
        let (_bases, mut source) = merge(
            dir.path(),
            &base,
            &[(key(2, b"b"), &b"2"[..]), (key(3, b"a"), b"2")],
        );
        assert!(matches!(source.plan(0, false), Ok(GroupPlan::Keep(None))));
        assert!(matches!(source.plan(1, true), Ok(GroupPlan::Keep(Some(_)))));
        // One change against ten entries: under half, so a run...
        assert!(matches!(
            source.plan(2, false),
            Ok(GroupPlan::Append(Some(_)))
        ));
        // ...unless the group is read whole anyway.
        assert!(matches!(source.plan(2, true), Ok(GroupPlan::Rewrite)));
        assert_eq!(group(&mut source, 2).len(), 11);
        // A change to an empty group is more than half of nothing.
        assert!(matches!(source.plan(3, false), Ok(GroupPlan::Rewrite)));
        assert_eq!(group(&mut source, 3).len(), 1);
        assert!(matches!(source.plan(4, false), Ok(GroupPlan::Keep(None))));
        source.finish().unwrap();
    }

    /// Base `epoch` of `bases` with `records` of `key_group` appended as
    /// one run to the group of the base before (every other group kept).
    fn append_run(
        bases: &Arc<Bases>,
        epoch: u64,
        key_group: u32,
        records: &[(Vec<u8>, Option<&[u8]>)],
    ) {
        let previous = bases.open(epoch - 1).unwrap();
        let mut writer = bases.writer(epoch).unwrap();
        writer
            .append_group(key_group, previous.group(key_group).cloned())
            .unwrap();
        for (key, value) in records {
            writer.push_change(key, *value).unwrap();
        }
        writer.finish().unwrap();
    }

    #[test]
    fn runs_merge_in_order_the_newest_record_winning_and_deletions_dropping_keys() {
        let dir = tempfile::tempdir().unwrap();
        let bases = Bases::new(dir.path().join("bases"));
        let mut writer = bases.writer(1).unwrap();
        writer.begin_group(1).unwrap();
        for name in [b"a", b"b", b"c", b"d"] {
            writer.push(&key(1, name), b"1").unwrap();
        }
        writer.finish().unwrap();
        append_run(
            &bases,
            2,
            1,
            &[
                (key(1, b"b"), Some(b"2")),
                (key(1, b"c"), None),
                (key(1, b"e"), Some(b"2")),
            ],
        );
        append_run(
            &bases,
            3,
            1,
            &[
                (key(1, b"c"), Some(b"3")),
                (key(1, b"d"), None),
                (key(1, b"e"), None),
                (key(1, b"g"), None),
            ],
        );
        let base = bases.open(3).unwrap();
        let group_base = base.group(1).unwrap();
        assert_eq!((group_base.runs(), group_base.run_entries()), (2, 7));
        assert_eq!(group_base.file_entries(), 4);
        let mut log = ChangeLog::new(100, 10_000);
        log.take();
        log.record_deletion(&key(1, b"a"));
        log.record_unchanged(&key(1, b"b"), b"4");
        log.record(&key(1, b"f"), b"4");
        let mut source = GroupSource::Merge {
            base,
            changes: log.take().unwrap().sorted(),
        };
        let mut out = Vec::new();
        source
            .for_each_in(1, |key, value, changed| {
                out.push((key.to_vec(), value.to_vec(), changed));
                Ok(())
            })
            .unwrap();
        assert_eq!(
            out,
            vec![
                (key(1, b"b"), b"4".to_vec(), false),
                (key(1, b"c"), b"3".to_vec(), false),
                (key(1, b"f"), b"4".to_vec(), true),
            ]
        );
        source.finish().unwrap();
    }

    #[test]
    fn a_group_past_its_bound_on_runs_is_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let bases = Bases::new(dir.path().join("bases"));
        let mut writer = bases.writer(1).unwrap();
        writer.begin_group(1).unwrap();
        let name = |i: u16| key(1, &i.to_be_bytes());
        for i in 0..1_000u16 {
            writer.push(&name(i), b"1").unwrap();
        }
        writer.finish().unwrap();
        let plan = |bases: &Arc<Bases>, epoch: u64, changed: u16| {
            let mut log = ChangeLog::new(10_000, 1_000_000);
            log.take();
            for i in 0..changed {
                log.record(&name(i), b"2");
            }
            let mut source = GroupSource::Merge {
                base: bases.open(epoch).unwrap(),
                changes: log.take().unwrap().sorted(),
            };
            source.plan(1, false).unwrap()
        };
        // Runs of 200 records each: 200 and 400 fit in half of 1,000
        // entries, and 100 more, but not 101.
        for epoch in 2..4 {
            assert!(matches!(plan(&bases, epoch - 1, 200), GroupPlan::Append(_)));
            let records: Vec<_> = (0..200u16).map(|i| (name(i), Some(&b"2"[..]))).collect();
            append_run(&bases, epoch, 1, &records);
        }
        assert!(matches!(plan(&bases, 3, 100), GroupPlan::Append(_)));
        assert!(matches!(plan(&bases, 3, 101), GroupPlan::Rewrite));
        // And at MAX_RUNS runs, however small.
        let mut epoch = 3;
        while bases.open(epoch).unwrap().group(1).unwrap().runs() < MAX_RUNS {
            assert!(matches!(plan(&bases, epoch, 1), GroupPlan::Append(_)));
            epoch += 1;
            append_run(&bases, epoch, 1, &[(name(0), Some(&b"3"[..]))]);
        }
        assert!(bases.open(epoch).unwrap().group(1).unwrap().run_entries() < 499);
        assert!(matches!(plan(&bases, epoch, 1), GroupPlan::Rewrite));
    }
}
