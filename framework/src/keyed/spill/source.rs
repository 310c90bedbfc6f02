//! [`GroupSource`]: where a spilling snapshot reads its entries from, one
//! key group at a time, ascending: the disk table's MVCC view, or the
//! previous snapshot's base file merged with the changes since.
//!
//! This module owns the merge of a base with the sorted changes (the
//! newer value wins, and a deletion drops the key) and the checks that
//! both runs stay in key-group order. It never builds a part, never writes a base and never decides
//! which source a snapshot uses ([`super::snapshot`] does).

use std::cmp::Ordering;

use super::base::BaseReader;
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
        base: BaseReader,
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
    /// key. Key groups must be asked for in ascending order.
    pub(crate) fn for_each_in(
        &mut self,
        key_group: u32,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<(), SpillError>,
    ) -> Result<(), SpillError> {
        let (base, changes) = match self {
            GroupSource::Empty => return Ok(()),
            GroupSource::View(view) => return view.scan_key_group(key_group, f),
            GroupSource::Merge { base, changes } => (base, changes),
        };
        let prefix = key_group.to_be_bytes();
        loop {
            let step = {
                let from_base = in_group(base.peek()?, &prefix)?;
                let from_changes = in_group(changes.peek(), &prefix)?;
                match (from_base, from_changes) {
                    (None, None) => return Ok(()),
                    (Some((key, value)), None) => {
                        f(key, value)?;
                        Step::Base
                    }
                    (None, Some((key, value))) => {
                        // A deletion of a key the base does not hold.
                        if let Some(value) = value {
                            f(key, value)?;
                        }
                        Step::Changes
                    }
                    (Some((base_key, base_value)), Some((key, value))) => match base_key.cmp(key) {
                        Ordering::Less => {
                            f(base_key, base_value)?;
                            Step::Base
                        }
                        Ordering::Greater => {
                            if let Some(value) = value {
                                f(key, value)?;
                            }
                            Step::Changes
                        }
                        Ordering::Equal => {
                            // The change replaces the base's value, or a
                            // deletion drops it.
                            if let Some(value) = value {
                                f(key, value)?;
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

    /// Fails if a merge left entries unread: keys outside the key groups
    /// asked for, i.e. a bug.
    pub(crate) fn finish(mut self) -> Result<(), SpillError> {
        match &mut self {
            GroupSource::Empty | GroupSource::View(_) => Ok(()),
            GroupSource::Merge { base, changes } => {
                if base.peek()?.is_some() || changes.peek().is_some() {
                    return Err(SpillError::Internal(
                        "a snapshot's base or changes held keys outside its key groups".into(),
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

    fn merge(
        dir: &std::path::Path,
        base: &[(Vec<u8>, &[u8])],
        changes: &[(Vec<u8>, &[u8])],
    ) -> GroupSource {
        let bases = Bases::new(dir.join("bases"));
        let mut writer = bases.writer(1).unwrap();
        for (key, value) in base {
            writer.push(key, value).unwrap();
        }
        writer.finish().unwrap();
        let mut log = ChangeLog::new(100, 10_000);
        log.take();
        for (key, value) in changes {
            log.record(key, value);
        }
        GroupSource::Merge {
            base: bases.open(1).unwrap().unwrap(),
            changes: log.take().unwrap().sorted(),
        }
    }

    fn group(source: &mut GroupSource, key_group: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        source
            .for_each_in(key_group, |key, value| {
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
        let mut source = merge(dir.path(), &base, &changes);
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
            base: bases.open(1).unwrap().unwrap(),
            changes: log.take().unwrap().sorted(),
        };
        assert_eq!(group(&mut source, 1), vec![(key(1, b"b"), b"1".to_vec())]);
        source.finish().unwrap();
    }

    #[test]
    fn entries_left_outside_the_groups_asked_for_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut source = merge(dir.path(), &[(key(5, b"a"), &b"1"[..])], &[]);
        assert_eq!(group(&mut source, 4), Vec::new());
        assert!(source.finish().is_err());
        // A group asked for after its entries' group was passed: the runs
        // are out of order.
        let mut source = merge(dir.path(), &[], &[(key(2, b"a"), &b"1"[..])]);
        assert!(source.for_each_in(3, |_, _| Ok(())).is_err());
        let mut source = merge(dir.path(), &[(key(2, b"a"), &b"1"[..])], &[]);
        assert!(source.for_each_in(3, |_, _| Ok(())).is_err());
    }
}
