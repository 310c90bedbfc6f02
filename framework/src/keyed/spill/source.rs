//! [`GroupSource`]: where a spilling snapshot reads its entries from, one
//! key group at a time, ascending: the disk table's MVCC view, or the
//! previous snapshot's base file merged with the changes since.
//!
//! This module owns the merge of a base with the sorted changes (the
//! newer value wins, and a deletion drops the key) and the checks that
//! both runs stay in key-group order. It never builds a part, never writes a base and never decides
//! which source a snapshot uses ([`super::snapshot`] does).

use std::cmp::Ordering;

use std::sync::Arc;

use super::base::{Base, GroupFile};
use super::changes::SortedChanges;
use super::disk::DiskSnapshot;
use super::SpillError;

/// The entries of one snapshot's disk table, in its key order.
pub(crate) enum GroupSource {
    /// No disk table: the state never spilled.
    Empty,
    /// The disk table as the snapshot's view sees it (a prefix scan per
    /// key group).
    View(DiskSnapshot),
    /// The previous base, with every entry written since laid over it.
    Merge {
        base: Arc<Base>,
        changes: SortedChanges,
    },
}

/// Which run the entry just handed on came from.
enum Step {
    Base,
    Changes,
    /// Both held the key: the change replaced the base's value.
    Both,
}

impl GroupSource {
    /// Calls `f` with every `(key, value)` of `key_group`, ascending by
    /// key, and whether the value came from the changes since the
    /// previous base and may differ from the key's value then (a record
    /// not marked unchanged; always `false` for a view). Key groups must be
    /// asked for in ascending order.
    pub(crate) fn for_each_in(
        &mut self,
        key_group: u32,
        mut f: impl FnMut(&[u8], &[u8], bool) -> Result<(), SpillError>,
    ) -> Result<(), SpillError> {
        let (base, changes) = match self {
            GroupSource::Empty => return Ok(()),
            GroupSource::View(view) => {
                return view.scan_key_group(key_group, |key, value| f(key, value, false))
            }
            GroupSource::Merge { base, changes } => (base, changes),
        };
        let mut base = base.reader(key_group)?;
        let prefix = key_group.to_be_bytes();
        loop {
            let step = {
                let from_base = match base.peek()? {
                    Some((key, value)) if key.get(..4) == Some(prefix.as_slice()) => {
                        Some((key, value))
                    }
                    Some((key, _)) => {
                        return Err(SpillError::Internal(format!(
                            "the base file of key group {key_group} holds the key {key:?}"
                        )))
                    }
                    None => None,
                };
                let changed = changes.peek_changed();
                let from_changes = in_group(changes.peek(), &prefix)?;
                match (from_base, from_changes) {
                    (None, None) => return Ok(()),
                    (Some((key, value)), None) => {
                        f(key, value, false)?;
                        Step::Base
                    }
                    (None, Some((key, value))) => {
                        // A deletion of a key the base does not hold.
                        if let Some(value) = value {
                            f(key, value, changed)?;
                        }
                        Step::Changes
                    }
                    (Some((base_key, base_value)), Some((key, value))) => match base_key.cmp(key) {
                        Ordering::Less => {
                            f(base_key, base_value, false)?;
                            Step::Base
                        }
                        Ordering::Greater => {
                            if let Some(value) = value {
                                f(key, value, changed)?;
                            }
                            Step::Changes
                        }
                        Ordering::Equal => {
                            // The change replaces the base's value, or a
                            // deletion drops it.
                            if let Some(value) = value {
                                f(key, value, changed)?;
                            }
                            Step::Both
                        }
                    },
                }
            };
            match step {
                Step::Base => base.advance(),
                Step::Changes => changes.advance(),
                Step::Both => {
                    base.advance();
                    changes.advance();
                }
            }
        }
    }

    /// Whether [`Self::for_each_in`] says which entries changed since the
    /// previous base (a merge, or no disk table at all), so that a delta
    /// part can be built from it.
    pub(crate) fn knows_changes(&self) -> bool {
        !matches!(self, GroupSource::View(_))
    }

    /// For a merge, when nothing of `key_group` changed on disk since
    /// the previous base: `Some` of that base's file of the group (`None`
    /// inside for an empty group), which the next base may keep as it is.
    /// `None` when the group changed, or for any other source. Key groups
    /// must be asked for in ascending order, before their entries.
    pub(crate) fn unchanged_file(
        &mut self,
        key_group: u32,
    ) -> Result<Option<Option<Arc<GroupFile>>>, SpillError> {
        let GroupSource::Merge { base, changes } = self else {
            return Ok(None);
        };
        if in_group(changes.peek(), &key_group.to_be_bytes())?.is_some() {
            return Ok(None);
        }
        Ok(Some(base.file(key_group).cloned()))
    }

    /// Fails if a merge left changes unread: keys outside the key groups
    /// asked for, i.e. a bug.
    pub(crate) fn finish(mut self) -> Result<(), SpillError> {
        match &mut self {
            GroupSource::Empty | GroupSource::View(_) => Ok(()),
            GroupSource::Merge { changes, .. } => {
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

/// `entry` if its key is in the key group `prefix` names, `None` if it is
/// in a later one; a key of an earlier group (or too short to name one)
/// means the runs were out of order, a bug.
fn in_group<'a, V>(
    entry: Option<(&'a [u8], V)>,
    prefix: &[u8; 4],
) -> Result<Option<(&'a [u8], V)>, SpillError> {
    let Some((key, value)) = entry else {
        return Ok(None);
    };
    match key.get(..4).map(|group| group.cmp(prefix.as_slice())) {
        Some(Ordering::Equal) => Ok(Some((key, value))),
        Some(Ordering::Greater) => Ok(None),
        _ => Err(SpillError::Internal(format!(
            "a snapshot's entry {key:?} is out of key-group order"
        ))),
    }
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
    fn a_group_without_changes_offers_its_previous_file() {
        let dir = tempfile::tempdir().unwrap();
        let (_bases, mut source) = merge(
            dir.path(),
            &[(key(1, b"a"), &b"1"[..]), (key(2, b"a"), b"1")],
            &[(key(2, b"b"), &b"2"[..])],
        );
        assert!(matches!(source.unchanged_file(0), Ok(Some(None))));
        assert!(matches!(source.unchanged_file(1), Ok(Some(Some(_)))));
        assert!(matches!(source.unchanged_file(2), Ok(None)));
        assert_eq!(group(&mut source, 2).len(), 2);
        assert!(matches!(source.unchanged_file(3), Ok(Some(None))));
        source.finish().unwrap();
    }
}
