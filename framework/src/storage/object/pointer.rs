//! The pointer object, `<job dir>/_pointer`: the one object whose
//! conditional update commits a checkpoint on object storage, and the
//! record of who owns the job's store.
//!
//! It names the job's owner (an epoch that rises with every takeover and
//! the owner's description), the newest committed entry, and every
//! committed checkpoint and savepoint by its directory relative to the job
//! directory (`checkpoints/chk-…`, `savepoints/sp-…`). A metadata object
//! that the pointer does not name does not exist for loading and listing,
//! whoever wrote it. This module owns the text format and its bounds; it
//! never sends a request (see `io.rs`).

use std::collections::BTreeSet;

use crate::storage::CheckpointId;

/// The pointer's name inside the job directory.
pub(crate) const POINTER_FILE: &str = "_pointer";
/// The first line of every pointer: the format and its version.
const MAGIC: &str = "snapflow-pointer 1";
/// The most bytes a pointer is read up to. Thousands of savepoints fit;
/// a larger object is not ours.
pub(crate) const MAX_POINTER_BYTES: u64 = 4 << 20;

/// What a pointer object says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Pointer {
    /// Rises by one with every takeover; the owner's fencing token.
    pub(crate) epoch: u64,
    /// The owner's description (pid, host, since when).
    pub(crate) owner: String,
    /// Every committed entry, relative to the job directory.
    pub(crate) entries: BTreeSet<String>,
}

impl Pointer {
    /// The pointer after `owner` took the store over.
    pub(crate) fn taken_by(&self, owner: String) -> Self {
        Self {
            epoch: self.epoch.saturating_add(1),
            owner: one_line(&owner),
            entries: self.entries.clone(),
        }
    }

    /// The pointer with `entry` committed.
    pub(crate) fn with_entry(&self, entry: &str) -> Self {
        let mut next = self.clone();
        next.entries.insert(entry.to_string());
        next
    }

    /// The pointer without `entry`.
    pub(crate) fn without_entry(&self, entry: &str) -> Self {
        let mut next = self.clone();
        next.entries.remove(entry);
        next
    }

    /// The id of the newest committed entry, from its directory's name.
    pub(crate) fn latest(&self) -> Option<CheckpointId> {
        self.entries
            .iter()
            .filter_map(|entry| entry_id(entry))
            .max()
    }

    /// The pointer as text: the magic line, then one `key value` line each.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut text = format!("{MAGIC}\nepoch {}\nowner {}\n", self.epoch, self.owner);
        match self.latest() {
            Some(latest) => text.push_str(&format!("latest {latest}\n")),
            None => text.push_str("latest -\n"),
        }
        for entry in &self.entries {
            text.push_str(&format!("entry {entry}\n"));
        }
        text.into_bytes()
    }

    /// Reads a pointer, refusing anything this module did not write.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "it is not UTF-8".to_string())?;
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err(format!("it does not start with {MAGIC:?}"));
        }
        let mut pointer = Self::default();
        for line in lines {
            let (key, value) = line.split_once(' ').unwrap_or((line, ""));
            match key {
                "epoch" => {
                    pointer.epoch = value.parse().map_err(|_| format!("bad epoch {value:?}"))?;
                }
                "owner" => pointer.owner = value.to_string(),
                "latest" => {}
                "entry" if entry_id(value).is_some() => {
                    pointer.entries.insert(value.to_string());
                }
                _ => return Err(format!("unexpected line {line:?}")),
            }
        }
        Ok(pointer)
    }
}

/// The id in an entry's directory name (`checkpoints/chk-<20 digits>` or
/// `savepoints/sp-<20 digits>`), or `None` for any other name.
pub(crate) fn entry_id(entry: &str) -> Option<CheckpointId> {
    let digits = entry
        .strip_prefix("checkpoints/chk-")
        .or_else(|| entry.strip_prefix("savepoints/sp-"))?;
    if digits.len() == 20 && digits.bytes().all(|byte| byte.is_ascii_digit()) {
        digits.parse().ok()
    } else {
        None
    }
}

fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::{entry_id, Pointer};

    const FIVE: &str = "checkpoints/chk-00000000000000000005";
    const SEVEN: &str = "savepoints/sp-00000000000000000007";

    /// A pointer reads back as written, names its newest entry, and a
    /// takeover raises the epoch and keeps the entries.
    #[test]
    fn round_trip_and_takeover() {
        let pointer = Pointer::default()
            .taken_by("pid 1\non host a".to_string())
            .with_entry(FIVE)
            .with_entry(SEVEN);
        assert_eq!(pointer.latest(), Some(7));
        let decoded = Pointer::decode(&pointer.encode()).expect("decodes");
        assert_eq!(decoded, pointer);
        assert_eq!(decoded.owner, "pid 1 on host a");
        let next = decoded.taken_by("pid 2".to_string()).without_entry(SEVEN);
        assert_eq!(next.epoch, 2);
        assert_eq!(next.latest(), Some(5));
    }

    /// Anything else is refused, never half read.
    #[test]
    fn refuses_what_it_did_not_write() {
        assert!(Pointer::decode(b"").is_err());
        assert!(Pointer::decode(b"snapflow-pointer 2\n").is_err());
        assert!(Pointer::decode(b"snapflow-pointer 1\nepoch x\n").is_err());
        assert!(Pointer::decode(b"snapflow-pointer 1\nentry ../x\n").is_err());
        assert!(Pointer::decode(&[0xff, 0xfe]).is_err());
        assert_eq!(entry_id("checkpoints/chk-1"), None);
    }
}
