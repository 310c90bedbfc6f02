//! [`KeyedSnapshotParts`]: a keyed state's snapshot in whole key-group
//! parts (the copy-on-write hand-off of whole groups, the spilling
//! backend's snapshot), turned into the keyed-state envelope's segments on
//! the checkpoint writer's thread.
//!
//! This module owns that encoding: each written group as shared (or, for
//! a full snapshot, own) bytes, each referred group as `Reuse` of its
//! ranges, a spilling group's delta part after the ranges of its chain
//! ([`super::chains`]), and telling the ledger where the written groups
//! landed. It never plans (the ledger does) and never builds a part.

use crate::keyed::deferred::DeferredParts;
use crate::keyed::part;
use crate::runtime::BoxError;
use crate::storage::{Segment, SharedRange};

use super::super::shell::DeferredState;
use super::{push_own, settle_landing, Landing, SnapshotPlan};

/// One keyed state's snapshot, planned at the snapshot and encoded into
/// the keyed-state envelope's segments by [`Self::encode`] (a
/// [`DeferredState`], so on the checkpoint writer's thread when its parts
/// are a copy-on-write hand-off).
pub(crate) struct KeyedSnapshotParts {
    plan: SnapshotPlan,
    parts: Box<dyn DeferredParts>,
}

impl KeyedSnapshotParts {
    /// `plan` with the parts of the groups it writes, ascending.
    pub(super) fn new(plan: SnapshotPlan, parts: Box<dyn DeferredParts>) -> Self {
        KeyedSnapshotParts { plan, parts }
    }

    /// The segments: the envelope's framing as own bytes; each written
    /// group as shared bytes (from offset 0, in order) for an incremental
    /// snapshot or as own bytes for a full one (the same bytes as
    /// [`encode_keyed_state`] of the parts); each other group referred
    /// to. Parts are asked for one at a time and each moves into its
    /// segment at once. Tells the ledger where the written groups landed.
    ///
    /// Known gap: the store takes a part's segments all at once
    /// ([`crate::storage::CheckpointStore::write_part_segments`]), so the
    /// encoded groups of one part are held together until it is written;
    /// writing each group to the file before encoding the next would need
    /// an appending write in `storage::io`.
    pub(crate) fn encode(self) -> Result<Vec<Segment>, BoxError> {
        let KeyedSnapshotParts { plan, mut parts } = self;
        let shared = plan.landed.is_some();
        let mut segments = vec![Segment::Own(postcard::to_allocvec(
            &(plan.layout.len() as u64),
        )?)];
        let mut landing = Landing::default();
        let mut offset = 0u64;
        let mut chains = plan.chains.into_iter();
        for (key_group, layout) in (plan.start..).zip(plan.layout) {
            let chain = chains.next().unwrap_or_default();
            let mut group = Vec::new();
            match layout {
                Some(range) => {
                    group.push(Segment::Reuse(range));
                    group.extend(chain.into_iter().map(Segment::Reuse));
                }
                None => {
                    let part = parts.next_part().transpose()?;
                    let part =
                        part.filter(|part| part.key_group == key_group)
                            .ok_or_else(|| {
                                format!("bug: key group {key_group} was planned but not handed off")
                            })?;
                    let delta = part::is_delta(&part.bytes);
                    if delta {
                        if chain.is_empty() || !shared {
                            return Err(format!(
                                "bug: key group {key_group} came as a delta without a chain"
                            )
                            .into());
                        }
                        group.extend(chain.into_iter().map(Segment::Reuse));
                    }
                    if shared {
                        let len = part.bytes.len() as u64;
                        landing.ranges.push(SharedRange {
                            checkpoint: plan.checkpoint.0,
                            offset,
                            len,
                            crc32: crc32fast::hash(&part.bytes),
                        });
                        landing.deltas.push(delta);
                        offset += len;
                        group.push(Segment::Shared(part.bytes));
                    } else {
                        group.push(Segment::Own(part.bytes));
                    }
                }
            }
            let len: u64 = group.iter().map(Segment::len).sum();
            push_own(&mut segments, postcard::to_allocvec(&(key_group, len))?);
            for segment in group {
                match segment {
                    Segment::Own(bytes) => push_own(&mut segments, bytes),
                    segment => segments.push(segment),
                }
            }
        }
        if parts.next_part().is_some() {
            return Err("bug: a key group was handed off but not planned".into());
        }
        settle_landing(plan.landed, landing);
        Ok(segments)
    }
}

impl DeferredState for KeyedSnapshotParts {
    fn encode(self: Box<Self>) -> Result<Vec<Segment>, BoxError> {
        (*self).encode()
    }
}
