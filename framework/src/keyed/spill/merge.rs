//! The merge behind a whole read of one key group's base: its oldest
//! input (the base file, or the oldest run when the group has no file),
//! its newer runs and the sorted changes since the previous base, into
//! the group's entries, ascending, the newest record of each key winning
//! and a deletion dropping it.
//!
//! This module owns the order of that merge and the checks that every
//! input stays in its key group. It never opens a file, never decides
//! whether a group is read whole ([`super::source`] does) and never
//! writes anything.
//!
//! # Why two stages
//!
//! The oldest input is the big one: a base file holds the whole group,
//! and the runs together hold at most half as many records
//! ([`super::source`], "The bound on runs"). So the newer inputs are kept
//! in one order of their own ([`Newer`], a binary search per record they
//! give), and each record of the oldest input costs one comparison with
//! the newer inputs' smallest key. A linear pick of the smallest key
//! among all inputs, as before, compared every input's record for every
//! entry written: at 10 M keys, where a whole part then merged a base
//! with up to ten runs, the pick itself was about a sixth of the
//! checkpoint writer's CPU, and with up to 64 runs it would grow with
//! them (BENCHMARKS.md at 07a44e5, "Fewer whole reads").

use std::cmp::Ordering;

use super::changes::{ChangeRef, SortedChanges};
use super::runs::RecordReader;
use super::SpillError;

/// Merges `readers` (a group's base file and runs, oldest first) and the
/// group's changes (newest) into `f`: every live `(key, value)` of
/// `key_group`, ascending, and whether it came from the changes and may
/// differ from the key's value at the previous base.
pub(crate) fn merge_group(
    readers: &mut [RecordReader],
    changes: &mut SortedChanges,
    key_group: u32,
    mut f: impl FnMut(&[u8], &[u8], bool) -> Result<(), SpillError>,
) -> Result<(), SpillError> {
    let (mut oldest, runs) = match readers.split_first_mut() {
        Some((oldest, runs)) => (Some(oldest), runs),
        None => (None, &mut [][..]),
    };
    let mut newer = Newer::new(runs, changes, key_group)?;
    loop {
        let order = {
            let old = match &mut oldest {
                Some(reader) => {
                    reader.fill()?;
                    own_group(reader.current(), key_group)?
                }
                None => None,
            };
            let new = newer.head();
            let order = match (&old, &new) {
                (None, None) => return Ok(()),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some((old_key, _)), Some(((new_key, _), _))) => old_key.cmp(new_key),
            };
            // The smaller key is written, the newer record on the same key;
            // a deletion is not.
            if order == Ordering::Less {
                if let Some((key, Some(value))) = old {
                    f(key, value, false)?;
                }
            } else if let Some(((key, Some(value)), changed)) = new {
                f(key, value, changed)?;
            }
            order
        };
        if order != Ordering::Greater {
            if let Some(reader) = &mut oldest {
                reader.advance();
            }
        }
        if order != Ordering::Less {
            newer.pop()?;
        }
    }
}

/// The newer inputs of a merge (runs oldest first, then the changes),
/// each at its next record of the group, ordered by that record's key
/// and, on the same key, newest first.
struct Newer<'a> {
    runs: &'a mut [RecordReader],
    changes: &'a mut SortedChanges,
    key_group: u32,
    /// Indices of the inputs that still hold a record of the group (the
    /// changes are `runs.len()`), in merge order: the first holds the
    /// smallest key, and of the inputs holding it the newest.
    order: Vec<usize>,
}

impl<'a> Newer<'a> {
    fn new(
        runs: &'a mut [RecordReader],
        changes: &'a mut SortedChanges,
        key_group: u32,
    ) -> Result<Self, SpillError> {
        let inputs = runs.len() + 1;
        let mut newer = Newer {
            runs,
            changes,
            key_group,
            order: Vec::with_capacity(inputs),
        };
        for input in 0..inputs {
            newer.admit(input)?;
        }
        Ok(newer)
    }

    /// Input `input`'s next record, which must be loaded ([`Self::admit`]).
    fn record(&self, input: usize) -> Option<ChangeRef<'_>> {
        match self.runs.get(input) {
            Some(reader) => reader.current(),
            None => self.changes.peek(),
        }
    }

    /// The smallest key's newest record, and whether it is a change that
    /// may differ from the key's value at the previous base.
    fn head(&self) -> Option<(ChangeRef<'_>, bool)> {
        let input = *self.order.first()?;
        let record = self.record(input);
        debug_assert!(
            record.is_some(),
            "input {input} is in the order without a record"
        );
        let record = record?;
        let changed = input == self.runs.len() && self.changes.peek_changed();
        Some((record, changed))
    }

    /// Loads `input`'s next record and, if it is in the group, places the
    /// input in the merge order.
    fn admit(&mut self, input: usize) -> Result<(), SpillError> {
        let key_group = self.key_group;
        let prefix = key_group.to_be_bytes();
        if let Some(reader) = self.runs.get_mut(input) {
            reader.fill()?;
        }
        let key = match self.runs.get(input) {
            Some(reader) => own_group(reader.current(), key_group)?.map(|(key, _)| key),
            None => in_group(self.changes.peek(), &prefix)?.map(|(key, _)| key),
        };
        let Some(key) = key else {
            return Ok(());
        };
        let at = self.order.partition_point(|&other| {
            let other_key = self.record(other).map_or(&[][..], |(key, _)| key);
            // An input is placed after those with smaller keys and after
            // newer ones with the same key.
            match other_key.cmp(key) {
                Ordering::Less => true,
                Ordering::Equal => other > input,
                Ordering::Greater => false,
            }
        });
        self.order.insert(at, input);
        Ok(())
    }

    /// Moves every input holding the smallest key past it.
    fn pop(&mut self) -> Result<(), SpillError> {
        if self.order.is_empty() {
            return Ok(());
        }
        let first = self.order.remove(0);
        // The other inputs holding the same key follow at once; each
        // input's keys ascend, so one moved past it is placed after them.
        while let Some(&next) = self.order.first() {
            let same = match (self.record(first), self.record(next)) {
                (Some((first_key, _)), Some((next_key, _))) => first_key == next_key,
                _ => false,
            };
            if !same {
                break;
            }
            self.order.remove(0);
            self.advance(next);
            self.admit(next)?;
        }
        self.advance(first);
        self.admit(first)
    }

    fn advance(&mut self, input: usize) {
        match self.runs.get_mut(input) {
            Some(reader) => reader.advance(),
            None => self.changes.advance(),
        }
    }
}

/// `record`, whose key must be in `key_group`: a base file or run holding
/// another group's key is a bug.
pub(super) fn own_group(
    record: Option<ChangeRef<'_>>,
    key_group: u32,
) -> Result<Option<ChangeRef<'_>>, SpillError> {
    match record {
        Some((key, _)) if key.get(..4) != Some(key_group.to_be_bytes().as_slice()) => {
            Err(SpillError::Internal(format!(
                "the base of key group {key_group} holds the key {key:?}"
            )))
        }
        record => Ok(record),
    }
}

/// `entry` if its key is in the key group `prefix` names, `None` if it is
/// in a later one; a key of an earlier group (or too short to name one)
/// means the runs were out of order, a bug.
pub(super) fn in_group<'a, V>(
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
    use std::collections::BTreeMap;

    use super::*;
    use crate::keyed::spill::base::Bases;
    use crate::keyed::spill::changes::ChangeLog;
    use crate::keyed::test_support::{with_seed, Rng};

    const GROUP: u32 = 7;
    const KEYS: u64 = 300;

    fn key(group: u32, i: u64) -> Vec<u8> {
        let mut key = group.to_be_bytes().to_vec();
        key.extend_from_slice(&i.to_be_bytes());
        key
    }

    fn value(rng: &mut Rng) -> Vec<u8> {
        let len = 1 + rng.below(8) as usize;
        rng.next().to_le_bytes()[..len].to_vec()
    }

    /// A group of a base file (or none) and `runs` runs of random writes
    /// and deletions, merged with random changes (and a later group's),
    /// gives what a map applying the same records in order holds, with
    /// a change's flag.
    fn check(seed: u64, with_file: bool, runs: u64) {
        let mut rng = Rng(seed);
        let dir = tempfile::tempdir().unwrap();
        let bases = Bases::new(dir.path().join("bases"));
        let mut model: BTreeMap<u64, (Vec<u8>, bool)> = BTreeMap::new();
        let mut writer = bases.writer(1).unwrap();
        if with_file {
            writer.begin_group(GROUP).unwrap();
            for i in 0..KEYS {
                if rng.below(2) != 0 {
                    continue;
                }
                let value = value(&mut rng);
                writer.push(&key(GROUP, i), &value).unwrap();
                model.insert(i, (value, false));
            }
        }
        writer.finish().unwrap();
        for epoch in 2..2 + runs {
            let previous = bases.open(epoch - 1).unwrap();
            let mut writer = bases.writer(epoch).unwrap();
            writer
                .append_group(GROUP, previous.group(GROUP).cloned())
                .unwrap();
            let density = 1 + rng.below(16);
            for i in 0..KEYS {
                if rng.below(density) != 0 {
                    continue;
                }
                if rng.below(4) == 0 {
                    writer.push_change(&key(GROUP, i), None).unwrap();
                    model.remove(&i);
                } else {
                    let value = value(&mut rng);
                    writer.push_change(&key(GROUP, i), Some(&value)).unwrap();
                    model.insert(i, (value, false));
                }
            }
            writer.finish().unwrap();
        }
        let mut log = ChangeLog::new(10_000, 1_000_000);
        log.take();
        for _ in 0..rng.below(KEYS) {
            let i = rng.below(KEYS);
            match rng.below(4) {
                0 => {
                    log.record_deletion(&key(GROUP, i));
                    model.remove(&i);
                }
                1 => {
                    let value = value(&mut rng);
                    log.record_unchanged(&key(GROUP, i), &value);
                    model.insert(i, (value, false));
                }
                _ => {
                    let value = value(&mut rng);
                    log.record(&key(GROUP, i), &value);
                    model.insert(i, (value, true));
                }
            }
        }
        log.record(&key(GROUP + 1, 0), b"later");
        let base = bases.open(1 + runs).unwrap();
        let mut readers = match base.group(GROUP) {
            Some(group) => group.readers().unwrap(),
            None => Vec::new(),
        };
        let mut changes = log.take().unwrap().sorted();
        let mut merged = Vec::new();
        merge_group(&mut readers, &mut changes, GROUP, |key, value, changed| {
            merged.push((key.to_vec(), value.to_vec(), changed));
            Ok(())
        })
        .unwrap();
        let expected: Vec<_> = model
            .into_iter()
            .map(|(i, (value, changed))| (key(GROUP, i), value, changed))
            .collect();
        assert_eq!(merged, expected);
        // The later group's change is left for it.
        assert_eq!(
            changes.peek().map(|(key, _)| key.to_vec()),
            Some(key(GROUP + 1, 0))
        );
    }

    #[test]
    fn a_merge_of_a_file_runs_and_changes_keeps_the_newest_record_of_each_key() {
        with_seed("merge", |seed| {
            for runs in [0, 1, 2, 5, 17, 63] {
                check(seed ^ runs, true, runs);
                check(seed ^ runs, false, runs);
            }
        });
    }

    #[test]
    fn an_input_holding_another_groups_key_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let bases = Bases::new(dir.path().join("bases"));
        let mut writer = bases.writer(1).unwrap();
        writer.begin_group(GROUP).unwrap();
        writer.push(&key(GROUP, 1), b"1").unwrap();
        writer.push(&key(GROUP + 1, 2), b"1").unwrap();
        writer.finish().unwrap();
        let base = bases.open(1).unwrap();
        let mut readers = base.group(GROUP).unwrap().readers().unwrap();
        let mut log = ChangeLog::new(100, 10_000);
        log.take();
        let mut changes = log.take().unwrap().sorted();
        let mut seen = 0;
        let result = merge_group(&mut readers, &mut changes, GROUP, |_, _, _| {
            seen += 1;
            Ok(())
        });
        assert!(matches!(result, Err(SpillError::Internal(_))), "{result:?}");
        assert_eq!(seen, 1);
    }
}
