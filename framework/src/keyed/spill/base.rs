//! [`Bases`]: the contents of the spilling state's disk table as its last
//! completed snapshot saw them, kept per key group as one sorted local
//! file and the sorted change runs appended since ([`super::runs`])
//! (together, a "base"), from which the next snapshot is built by merging
//! in the changes since ([`super::changes`]) instead of reading the disk
//! table back.
//!
//! This module owns the base files' layout, their directory, which base is
//! the newest complete one, and when a file is deleted. It never reads
//! the disk table, never builds a part, never merges runs and never
//! decides what a snapshot contains.
//!
//! # Why a base is right
//!
//! Snapshot `e` of a state either reads the disk table's view `e` (the
//! fallback) or merges base `e - 1` with every entry written to (or
//! deleted from) the disk table between the views `e - 1` and `e`; both
//! give the table's content at view `e`, which it writes as base `e`. A
//! key group with no change since keeps its file and runs of base `e - 1`
//! in base `e` (shared, not copied); a changed group either gets a new
//! file of its merged content, or keeps its file and runs and gets the
//! changes as one more run (a later run wins on the same key, and a
//! deletion in it hides the key), which describes the same content. A
//! base is used only by the snapshot of the very next epoch, and only if
//! it was finished (its run file is flushed before it is published): a
//! snapshot dropped half-way, a restore or a change log that gave up
//! leaves the next snapshot on the fallback, which starts a new chain.
//!
//! # Layout
//!
//! One file per key group and base that rewrote it, `base-<epoch>-<group>`
//! (none for an empty group), in the state's own directory beside its
//! disk table: every entry of the group, ascending by key, as the key's
//! and the value's lengths (`u32` little-endian), the key (key group
//! big-endian, then postcard) and the value (the state's payload); and
//! one `run-<epoch>` per base that appended runs ([`super::runs`]). A
//! file is deleted when the last base (or snapshot reading one) that
//! refers to it is dropped. It is not durable, as the disk table is not:
//! the checkpoint store holds the durable copy. The directory is deleted
//! when the last holder of the [`Bases`] is dropped (the state and any
//! snapshot still being written).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::runs::{io_error, RecordReader, Run, RunWriter};
use super::SpillError;

/// The buffer of a base file's reader and writer: large enough that a
/// sequential pass costs few system calls, small next to a part.
const BUFFER_BYTES: usize = 256 * 1024;

/// One key group's file of a base, shared by every base that kept it;
/// deleted when the last of them is dropped.
#[derive(Debug)]
pub(crate) struct GroupFile {
    path: PathBuf,
    entries: u64,
}

impl Drop for GroupFile {
    fn drop(&mut self) {
        // A file left behind costs disk until the directory goes.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One key group of a base: its file (none when the group had no entry
/// when it was last rewritten) and the runs of changes appended since,
/// oldest first. Cloning shares the files.
#[derive(Debug, Clone, Default)]
pub(crate) struct GroupBase {
    file: Option<Arc<GroupFile>>,
    runs: Vec<Run>,
}

impl GroupBase {
    /// How many entries the group's file holds.
    pub(crate) fn file_entries(&self) -> u64 {
        self.file.as_ref().map_or(0, |file| file.entries)
    }

    /// How many records its runs hold together (a key changed in several
    /// runs counts once per run).
    pub(crate) fn run_entries(&self) -> u64 {
        self.runs.iter().map(Run::entries).sum()
    }

    /// How many runs it has.
    pub(crate) fn runs(&self) -> usize {
        self.runs.len()
    }

    /// Readers of the group's file, then of each run, oldest first: a
    /// later one wins on the same key. The files stay readable even if
    /// every base drops them meanwhile (they are open, and only unlinked).
    pub(crate) fn readers(&self) -> Result<Vec<RecordReader>, SpillError> {
        let mut readers = Vec::with_capacity(1 + self.runs.len());
        readers.push(match &self.file {
            Some(file) => RecordReader::open(&file.path, 0, u64::MAX, BUFFER_BYTES)?,
            None => RecordReader::empty(),
        });
        for run in &self.runs {
            readers.push(run.reader()?);
        }
        Ok(readers)
    }
}

/// A finished base: each key group's file and runs, if the group had any.
#[derive(Debug, Default)]
pub(crate) struct Base {
    groups: BTreeMap<u32, GroupBase>,
}

impl Base {
    /// `key_group`'s file and runs, `None` if the group has neither.
    pub(crate) fn group(&self, key_group: u32) -> Option<&GroupBase> {
        self.groups.get(&key_group)
    }
}

/// The bases of one spilling state, shared with its snapshots.
#[derive(Debug)]
pub(crate) struct Bases {
    dir: PathBuf,
    /// The newest finished base and its epoch.
    newest: Mutex<Option<(u64, Arc<Base>)>>,
}

impl Bases {
    /// Bases kept in `dir` (created with the first base file).
    pub(crate) fn new(dir: PathBuf) -> Arc<Self> {
        Arc::new(Bases {
            dir,
            newest: Mutex::new(None),
        })
    }

    fn newest(&self) -> std::sync::MutexGuard<'_, Option<(u64, Arc<Base>)>> {
        // A panic while holding it leaves a consistent value (one
        // assignment), so a poisoned lock is still usable.
        self.newest
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Base `epoch`, if it is the newest finished one. Holding it keeps
    /// its files even if a newer base replaces it meanwhile.
    pub(crate) fn open(&self, epoch: u64) -> Option<Arc<Base>> {
        match &*self.newest() {
            Some((newest_epoch, base)) if *newest_epoch == epoch => Some(Arc::clone(base)),
            _ => None,
        }
    }

    /// A writer of base `epoch`, published by [`BaseWriter::finish`].
    pub(crate) fn writer(self: &Arc<Self>, epoch: u64) -> Result<BaseWriter, SpillError> {
        std::fs::create_dir_all(&self.dir).map_err(|source| io_error(&self.dir, source))?;
        Ok(BaseWriter {
            bases: Arc::clone(self),
            epoch,
            base: Base::default(),
            current: None,
            runs: RunWriter::new(&self.dir, epoch),
        })
    }

    /// Makes `base` base `epoch` unless a newer one is finished already
    /// (the loser's own files are deleted as it drops).
    fn publish(&self, epoch: u64, base: Base) {
        let mut newest = self.newest();
        let replaced = match &*newest {
            Some((newest_epoch, _)) if *newest_epoch > epoch => None,
            _ => newest.replace((epoch, Arc::new(base))),
        };
        // Dropped outside the lock: it may delete files.
        drop(newest);
        drop(replaced);
    }

    /// The epoch of the newest finished base, if any.
    #[cfg(test)]
    pub(crate) fn newest_epoch(&self) -> Option<u64> {
        self.newest().as_ref().map(|(epoch, _)| *epoch)
    }
}

impl Drop for Bases {
    fn drop(&mut self) {
        // Nothing to report to: a directory left behind only costs disk.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One key group being written.
#[derive(Debug)]
enum OpenGroup {
    /// A new file of the whole group, created at the first entry (an
    /// empty group has no file).
    Rewrite {
        key_group: u32,
        file: Option<(BufWriter<File>, GroupFile)>,
        entries: u64,
    },
    /// The previous base's file and runs, and a new run of changes.
    Append { key_group: u32, kept: GroupBase },
}

/// Writes one base, key group by key group, ascending; its files are
/// deleted unless [`Self::finish`]ed (a kept file stays with the bases
/// that hold it).
#[derive(Debug)]
pub(crate) struct BaseWriter {
    bases: Arc<Bases>,
    epoch: u64,
    base: Base,
    current: Option<OpenGroup>,
    /// This base's run file, holding the runs of the groups appended to.
    runs: RunWriter,
}

impl BaseWriter {
    /// Starts writing `key_group`'s file anew, with no runs (ending the
    /// group before).
    pub(crate) fn begin_group(&mut self, key_group: u32) -> Result<(), SpillError> {
        self.end_group()?;
        self.current = Some(OpenGroup::Rewrite {
            key_group,
            file: None,
            entries: 0,
        });
        Ok(())
    }

    /// Keeps `group` (of the previous base) as `key_group`'s, unchanged;
    /// `None` keeps the group empty.
    pub(crate) fn keep_group(
        &mut self,
        key_group: u32,
        group: Option<GroupBase>,
    ) -> Result<(), SpillError> {
        self.end_group()?;
        if let Some(group) = group {
            self.base.groups.insert(key_group, group);
        }
        Ok(())
    }

    /// Starts `key_group` as `kept` (of the previous base; `None` for an
    /// empty group) with one more run, of the records
    /// [`Self::push_change`] appends.
    pub(crate) fn append_group(
        &mut self,
        key_group: u32,
        kept: Option<GroupBase>,
    ) -> Result<(), SpillError> {
        self.end_group()?;
        self.runs.begin();
        self.current = Some(OpenGroup::Append {
            key_group,
            kept: kept.unwrap_or_default(),
        });
        Ok(())
    }

    /// Appends one change (`None`: a deletion) to the run of the group
    /// begun last by [`Self::append_group`]; ascending key order.
    pub(crate) fn push_change(
        &mut self,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), SpillError> {
        match &self.current {
            Some(OpenGroup::Append { .. }) => self.runs.push((key, value)),
            _ => Err(SpillError::Internal(
                "a run entry written outside an appended key group".into(),
            )),
        }
    }

    /// Appends one entry to the group begun last by
    /// [`Self::begin_group`]; entries must come in ascending key order.
    pub(crate) fn push(&mut self, key: &[u8], value: &[u8]) -> Result<(), SpillError> {
        let (Ok(key_len), Ok(value_len)) = (u32::try_from(key.len()), u32::try_from(value.len()))
        else {
            return Err(SpillError::Internal(
                "an entry over 4 GiB does not fit a base file".into(),
            ));
        };
        let Some(OpenGroup::Rewrite {
            key_group,
            file,
            entries,
        }) = &mut self.current
        else {
            return Err(SpillError::Internal(
                "a base entry written outside a rewritten key group".into(),
            ));
        };
        if file.is_none() {
            let path = self
                .bases
                .dir
                .join(format!("base-{}-{}", self.epoch, key_group));
            let created = File::create(&path).map_err(|source| io_error(&path, source))?;
            *file = Some((
                BufWriter::with_capacity(BUFFER_BYTES, created),
                GroupFile { path, entries: 0 },
            ));
        }
        let Some((file, group_file)) = file else {
            return Err(SpillError::Internal("a base file did not open".into()));
        };
        let result = file
            .write_all(&key_len.to_le_bytes())
            .and_then(|()| file.write_all(&value_len.to_le_bytes()))
            .and_then(|()| file.write_all(key))
            .and_then(|()| file.write_all(value));
        *entries += 1;
        result.map_err(|source| io_error(&group_file.path, source))
    }

    /// Flushes the group being written, if any, into the base.
    fn end_group(&mut self) -> Result<(), SpillError> {
        match self.current.take() {
            None => Ok(()),
            Some(OpenGroup::Append {
                key_group,
                mut kept,
            }) => {
                kept.runs.extend(self.runs.end());
                if kept.file.is_some() || !kept.runs.is_empty() {
                    self.base.groups.insert(key_group, kept);
                }
                Ok(())
            }
            Some(OpenGroup::Rewrite {
                key_group,
                file,
                entries,
            }) => {
                if let Some((file, mut group_file)) = file {
                    // `group_file` deletes its file if this fails.
                    file.into_inner()
                        .map_err(|error| io_error(&group_file.path, error.into_error()))?;
                    group_file.entries = entries;
                    let group = GroupBase {
                        file: Some(Arc::new(group_file)),
                        runs: Vec::new(),
                    };
                    self.base.groups.insert(key_group, group);
                }
                Ok(())
            }
        }
    }

    /// Flushes the last group and the run file and makes this base the
    /// newest (unless a newer one is finished already). Returns how many
    /// entries its files and runs hold.
    pub(crate) fn finish(mut self) -> Result<u64, SpillError> {
        self.end_group()?;
        let runs = std::mem::replace(&mut self.runs, RunWriter::new(&self.bases.dir, self.epoch));
        runs.finish()?;
        let base = std::mem::take(&mut self.base);
        let entries = base
            .groups
            .values()
            .map(|group| group.file_entries() + group.run_entries())
            .sum();
        self.bases.publish(self.epoch, base);
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(mut reader: RecordReader) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some((key, value)) = reader.peek().unwrap() {
            out.push((
                key.to_vec(),
                value.expect("no deletion in a base file").to_vec(),
            ));
            reader.advance();
        }
        out
    }

    /// A reader of `key_group`'s base file.
    fn file_reader(base: &Base, key_group: u32) -> RecordReader {
        match base.group(key_group) {
            Some(group) => group.readers().unwrap().remove(0),
            None => RecordReader::empty(),
        }
    }

    fn files(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    #[test]
    fn a_finished_base_reads_back_per_group_and_only_as_the_newest_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let bases = Bases::new(dir.path().join("bases"));
        assert!(bases.open(1).is_none());
        let mut writer = bases.writer(1).unwrap();
        writer.begin_group(3).unwrap();
        writer.push(b"a", b"1").unwrap();
        writer.push(b"bb", b"").unwrap();
        writer.begin_group(4).unwrap();
        writer.begin_group(5).unwrap();
        writer.push(b"c", b"2").unwrap();
        assert!(bases.open(1).is_none(), "not finished yet");
        assert_eq!(writer.finish().unwrap(), 3);
        let base = bases.open(1).unwrap();
        assert_eq!(
            read_all(file_reader(&base, 3)),
            vec![(b"a".to_vec(), b"1".to_vec()), (b"bb".to_vec(), Vec::new())]
        );
        assert_eq!(read_all(file_reader(&base, 4)), Vec::new());
        assert_eq!(read_all(file_reader(&base, 5)).len(), 1);
        // An empty group has no file.
        assert_eq!(
            files(&dir.path().join("bases")),
            vec!["base-1-3", "base-1-5"]
        );
        assert!(bases.open(0).is_none());
        assert!(bases.open(2).is_none());
    }

    #[test]
    fn a_kept_group_file_is_shared_and_deleted_with_its_last_base() {
        let dir = tempfile::tempdir().unwrap();
        let bases = Bases::new(dir.path().join("bases"));
        let mut writer = bases.writer(1).unwrap();
        for key_group in [1, 2] {
            writer.begin_group(key_group).unwrap();
            writer.push(&[key_group as u8], b"old").unwrap();
        }
        writer.finish().unwrap();
        let first = bases.open(1).unwrap();
        let mut writer = bases.writer(2).unwrap();
        writer.keep_group(1, first.group(1).cloned()).unwrap();
        writer.begin_group(2).unwrap();
        writer.push(&[2], b"new").unwrap();
        assert_eq!(writer.finish().unwrap(), 2);
        let second = bases.open(2).unwrap();
        assert_eq!(
            read_all(file_reader(&second, 1)),
            vec![(vec![1], b"old".to_vec())]
        );
        assert_eq!(
            read_all(file_reader(&second, 2)),
            vec![(vec![2], b"new".to_vec())]
        );
        // Base 1 is still held here: its group 2 file is still there.
        let bases_dir = dir.path().join("bases");
        assert_eq!(files(&bases_dir), vec!["base-1-1", "base-1-2", "base-2-2"]);
        drop(first);
        assert_eq!(files(&bases_dir), vec!["base-1-1", "base-2-2"]);
        drop(second);
        drop(bases);
        assert!(!bases_dir.exists());
    }

    #[test]
    fn an_unfinished_base_is_deleted_and_an_older_one_never_replaces_a_newer() {
        let dir = tempfile::tempdir().unwrap();
        let bases = Bases::new(dir.path().join("bases"));
        let mut dropped = bases.writer(5).unwrap();
        dropped.begin_group(0).unwrap();
        dropped.push(b"a", b"1").unwrap();
        drop(dropped);
        assert!(files(&dir.path().join("bases")).is_empty());
        let mut older = bases.writer(6).unwrap();
        older.begin_group(0).unwrap();
        older.push(b"a", b"1").unwrap();
        bases.writer(7).unwrap().finish().unwrap();
        older.finish().unwrap();
        assert_eq!(bases.newest_epoch(), Some(7));
        assert!(files(&dir.path().join("bases")).is_empty());
        drop(bases);
        assert!(!dir.path().join("bases").exists());
    }

    #[test]
    fn a_truncated_base_is_an_error_not_an_end() {
        let dir = tempfile::tempdir().unwrap();
        let bases = Bases::new(dir.path().join("bases"));
        let mut writer = bases.writer(1).unwrap();
        writer.begin_group(0).unwrap();
        writer.push(b"key", b"value").unwrap();
        writer.finish().unwrap();
        let path = dir.path().join("bases").join("base-1-0");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        let mut reader = file_reader(&bases.open(1).unwrap(), 0);
        assert!(reader.peek().is_err());
    }

    /// Base 1 of `bases`: group 1 holds `a = 1`, nothing else.
    fn write_one_entry_base(bases: &Arc<Bases>) {
        let mut writer = bases.writer(1).unwrap();
        writer.begin_group(1).unwrap();
        writer.push(b"a", b"1").unwrap();
        writer.finish().unwrap();
    }

    #[test]
    fn a_run_file_is_shared_by_the_bases_that_list_its_runs_and_deleted_with_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let bases_dir = dir.path().join("bases");
        let bases = Bases::new(bases_dir.clone());
        write_one_entry_base(&bases);
        // Base 2 appends runs to groups 1 (which has a file) and 2 (which
        // has none), without rewriting the file.
        let first = bases.open(1).unwrap();
        let mut writer = bases.writer(2).unwrap();
        writer.append_group(1, first.group(1).cloned()).unwrap();
        writer.push_change(b"a", None).unwrap();
        writer.push_change(b"b", Some(b"2")).unwrap();
        writer.append_group(2, None).unwrap();
        writer.push_change(b"c", Some(b"2")).unwrap();
        // An appended group with no record keeps what it had.
        writer.append_group(3, None).unwrap();
        assert_eq!(writer.finish().unwrap(), 4);
        drop(first);
        assert_eq!(files(&bases_dir), vec!["base-1-1", "run-2"]);
        let second = bases.open(2).unwrap();
        assert_eq!(second.group(1).unwrap().runs(), 1);
        assert_eq!(second.group(2).unwrap().file_entries(), 0);
        assert!(second.group(3).is_none());
        // Base 3 keeps group 1 and rewrites group 2: run-2 stays for
        // group 1's run.
        let mut writer = bases.writer(3).unwrap();
        writer.keep_group(1, second.group(1).cloned()).unwrap();
        writer.begin_group(2).unwrap();
        writer.push(b"c", b"2").unwrap();
        writer.finish().unwrap();
        drop(second);
        assert_eq!(files(&bases_dir), vec!["base-1-1", "base-3-2", "run-2"]);
        // Base 4 rewrites group 1 too: nothing refers to run-2 any more.
        let third = bases.open(3).unwrap();
        let mut writer = bases.writer(4).unwrap();
        writer.begin_group(1).unwrap();
        writer.push(b"b", b"2").unwrap();
        writer.keep_group(2, third.group(2).cloned()).unwrap();
        writer.finish().unwrap();
        drop(third);
        assert_eq!(files(&bases_dir), vec!["base-3-2", "base-4-1"]);
    }

    #[test]
    fn an_abandoned_base_deletes_its_half_written_run_file() {
        let dir = tempfile::tempdir().unwrap();
        let bases_dir = dir.path().join("bases");
        let bases = Bases::new(bases_dir.clone());
        write_one_entry_base(&bases);
        let first = bases.open(1).unwrap();
        let mut writer = bases.writer(2).unwrap();
        writer.append_group(1, first.group(1).cloned()).unwrap();
        writer.push_change(b"b", Some(b"2")).unwrap();
        writer.append_group(2, None).unwrap();
        writer.push_change(b"c", Some(b"2")).unwrap();
        // A record outside an appended group is refused.
        writer.begin_group(3).unwrap();
        assert!(writer.push_change(b"d", None).is_err());
        drop(writer);
        assert_eq!(files(&bases_dir), vec!["base-1-1"]);
        assert_eq!(bases.newest_epoch(), Some(1));
    }
}
