//! Incremental checkpoints of keyed state, on the job's side: which key
//! groups a keyed operator writes again at a checkpoint, which it refers
//! to in an earlier checkpoint's shared file, and the segments that say so
//! to the store ([`crate::storage::segment`]).
//!
//! This module owns that bookkeeping ([`KeyGroupLedger`]), the settings
//! ([`IncrementalCheckpoints`]), the job-wide record of which checkpoint
//! ids are savepoints ([`SnapshotKinds`]) and the segmented form of the
//! keyed-state envelope. It never does I/O, never decides when to
//! checkpoint and never reads a part back: loading assembles segmented
//! parts into exactly the bytes a full snapshot has, so restoring,
//! rescaling and `job::inspect` do not know about any of this.
//!
//! # The rule (why a reference is always valid)
//!
//! A key group is referred to, instead of written, only when it has not
//! changed since the snapshot that last wrote it (its dirty flag) and that
//! snapshot's checkpoint was confirmed complete (durable) to this very
//! operator instance. Every complete checkpoint this instance took after
//! that one refers to the same range too (it was unchanged and confirmed
//! then as well), so the store's retention, which keeps every shared file
//! a remaining checkpoint names, still has it. A restored or restarted
//! instance starts with nothing written, so its first checkpoint is full.
//! Savepoints are written whole and change nothing here.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::keyed::store::KeyGroupSnapshots;
use crate::protocol::CheckpointId;
use crate::runtime::BoxError;
use crate::storage::{Segment, SharedRange};

use super::ops::{encode_keyed_state, KeyGroupParts};

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

/// The default [`IncrementalCheckpoints::full_every`]: 10. With 1 s
/// checkpoints a key group that never changes is written again every
/// 10 s, a restore reads at most 10 shared files per subtask, and the
/// store holds at most the last full snapshot plus 9 checkpoints' changes
/// of each subtask beyond what retention keeps anyway.
pub const DEFAULT_FULL_EVERY: u32 = 10;

impl Default for IncrementalCheckpoints {
    fn default() -> Self {
        IncrementalCheckpoints {
            enabled: true,
            full_every: DEFAULT_FULL_EVERY,
        }
    }
}

/// Which checkpoint ids of a job are savepoints: the supervisor marks one
/// when it triggers it, before any barrier of it exists, and operator
/// instances ask at their snapshot. Only the latest is kept: one savepoint
/// is in flight at a time, and an instance asking about an older one that
/// was aborted treats it as a checkpoint, which is harmless (it never
/// completes, so nothing refers to it).
#[derive(Debug, Default)]
pub(crate) struct SnapshotKinds {
    latest_savepoint: AtomicU64,
}

impl SnapshotKinds {
    /// Records that `checkpoint` is a savepoint.
    pub(crate) fn mark_savepoint(&self, checkpoint: CheckpointId) {
        self.latest_savepoint
            .fetch_max(checkpoint.0, Ordering::AcqRel);
    }

    /// Whether `checkpoint` is the savepoint most recently triggered.
    pub(crate) fn is_savepoint(&self, checkpoint: CheckpointId) -> bool {
        checkpoint.0 != 0 && self.latest_savepoint.load(Ordering::Acquire) == checkpoint.0
    }
}

/// Where one key group's current bytes were last written.
#[derive(Debug, Clone, Copy)]
struct Written {
    range: SharedRange,
    /// Its checkpoint completed and is durable.
    confirmed: bool,
}

/// One keyed operator instance's record of where each of its key groups
/// was last written, and the choice at each checkpoint of which to write.
#[derive(Debug)]
pub(crate) struct KeyGroupLedger {
    full_every: u32,
    /// The next checkpoint's place in its chain: 0 (full) up to
    /// `full_every - 1`.
    next_position: u32,
    /// Per key group of the instance's range, in order.
    written: Vec<Option<Written>>,
}

impl KeyGroupLedger {
    /// A ledger for `key_groups` groups with nothing written yet.
    pub(crate) fn new(settings: IncrementalCheckpoints, key_groups: usize) -> Self {
        KeyGroupLedger {
            full_every: settings.full_every.max(1),
            next_position: 0,
            written: vec![None; key_groups],
        }
    }

    /// Forgets everything written: the next checkpoint is full.
    pub(crate) fn reset(&mut self) {
        self.next_position = 0;
        self.written.iter_mut().for_each(|written| *written = None);
    }

    /// `checkpoint` completed: the groups it wrote may be referred to.
    pub(crate) fn on_complete(&mut self, checkpoint: CheckpointId) {
        for written in self.written.iter_mut().flatten() {
            if written.range.checkpoint == checkpoint.0 {
                written.confirmed = true;
            }
        }
    }

    /// The segments of `state`'s snapshot for checkpoint `checkpoint`, in
    /// the keyed-state envelope's layout: changed or unconfirmed groups
    /// written shared, the others referred to. Clears the dirty flags.
    pub(crate) fn snapshot(
        &mut self,
        checkpoint: CheckpointId,
        state: &mut impl KeyGroupSnapshots,
    ) -> Result<Vec<Segment>, BoxError> {
        let start = state.key_groups().start;
        let full = self.next_position == 0;
        self.next_position = (self.next_position + 1) % self.full_every;
        let mut fresh = vec![full; self.written.len()];
        for key_group in state.changed_key_groups() {
            fresh[(key_group - start) as usize] = true;
        }
        for (fresh, written) in fresh.iter_mut().zip(&self.written) {
            *fresh |= !written.is_some_and(|written| written.confirmed);
        }
        let parts = state.parts_of(&mut |key_group| fresh[(key_group - start) as usize])?;
        state.forget_changes();
        let mut parts = parts.into_iter().peekable();
        let mut segments = vec![Segment::Own(postcard::to_allocvec(
            &(self.written.len() as u64),
        )?)];
        let mut offset = 0u64;
        for (index, key_group) in state.key_groups().iter().enumerate() {
            let fresh_part = parts.next_if(|part| part.key_group == key_group);
            let (len, tail) = match (fresh_part, self.written[index]) {
                (Some(part), _) => {
                    let range = SharedRange {
                        checkpoint: checkpoint.0,
                        offset,
                        len: part.bytes.len() as u64,
                        crc32: crc32fast::hash(&part.bytes),
                    };
                    offset += range.len;
                    self.written[index] = Some(Written {
                        range,
                        confirmed: false,
                    });
                    (range.len, Segment::Shared(part.bytes))
                }
                (None, Some(written)) => (written.range.len, Segment::Reuse(written.range)),
                (None, None) => {
                    return Err(
                        format!("bug: key group {key_group} was neither written nor kept").into(),
                    )
                }
            };
            push_own(&mut segments, postcard::to_allocvec(&(key_group, len))?);
            segments.push(tail);
        }
        Ok(segments)
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
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::keyed::test_support::Count;
    use crate::keyed::{KeyedState, MaxParallelism};

    fn state() -> KeyedState<u64, Count> {
        KeyedState::for_subtask(MaxParallelism::new(16).unwrap(), 2, 1).unwrap()
    }

    /// Every shared segment written so far, by its range.
    #[derive(Default)]
    struct Written(BTreeMap<(u64, u64), Vec<u8>>);

    impl Written {
        fn record(&mut self, segments: &[Segment], checkpoint: u64) {
            let mut offset = 0;
            for segment in segments {
                if let Segment::Shared(bytes) = segment {
                    self.0.insert((checkpoint, offset), bytes.clone());
                    offset += bytes.len() as u64;
                }
            }
        }

        fn assemble(&self, segments: &[Segment]) -> Vec<u8> {
            assemble(segments, |range| {
                let bytes = self.0[&(range.checkpoint, range.offset)].clone();
                assert_eq!(crc32fast::hash(&bytes), range.crc32);
                bytes
            })
        }
    }

    fn full_bytes(state: &KeyedState<u64, Count>) -> Vec<u8> {
        let parts: KeyGroupParts = state.snapshot().unwrap().into_parts().collect();
        encode_keyed_state(&parts).unwrap()
    }

    fn count_shared(segments: &[Segment]) -> usize {
        segments
            .iter()
            .filter(|segment| matches!(segment, Segment::Shared(_)))
            .count()
    }

    #[test]
    fn snapshots_assemble_to_the_full_bytes_and_write_only_changed_groups() {
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
        let first = ledger.snapshot(CheckpointId(1), &mut state).unwrap();
        written.record(&first, 1);
        assert_eq!(
            count_shared(&first),
            state.range().len(),
            "the first is full"
        );
        assert_eq!(written.assemble(&first), full_bytes(&state));

        // Not yet confirmed: everything is written again.
        state.get_or_default(&keys[0]).count += 1;
        let second = ledger.snapshot(CheckpointId(2), &mut state).unwrap();
        written.record(&second, 2);
        assert_eq!(count_shared(&second), state.range().len());
        ledger.on_complete(CheckpointId(2));

        // Confirmed: only the touched group is written.
        state.get_or_default(&keys[1]).count += 1;
        let third = ledger.snapshot(CheckpointId(3), &mut state).unwrap();
        written.record(&third, 3);
        assert_eq!(count_shared(&third), 1);
        assert_eq!(written.assemble(&third), full_bytes(&state));
        ledger.on_complete(CheckpointId(3));

        // Nothing touched: nothing written but the framing.
        let fourth = ledger.snapshot(CheckpointId(4), &mut state).unwrap();
        assert_eq!(count_shared(&fourth), 0);
        assert_eq!(written.assemble(&fourth), full_bytes(&state));
        ledger.on_complete(CheckpointId(4));

        // 1 started the chain and 2, 3 and 4 continued it: with
        // `full_every` 4, checkpoint 5 is full again.
        let fifth = ledger.snapshot(CheckpointId(5), &mut state).unwrap();
        assert_eq!(count_shared(&fifth), state.range().len());
    }

    #[test]
    fn a_savepoint_mark_names_only_the_latest_savepoint() {
        let kinds = SnapshotKinds::default();
        assert!(!kinds.is_savepoint(CheckpointId(0)));
        kinds.mark_savepoint(CheckpointId(4));
        assert!(kinds.is_savepoint(CheckpointId(4)));
        assert!(!kinds.is_savepoint(CheckpointId(5)));
        kinds.mark_savepoint(CheckpointId(9));
        assert!(!kinds.is_savepoint(CheckpointId(4)));
    }
}
