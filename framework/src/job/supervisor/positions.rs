//! The supervisor's record of where each failover region's sources
//! stand, for the restart strategy's no-progress rule
//! ([`crate::restart::RunPositions`]): per region, a fingerprint of the
//! source positions its current generation restored and of those in the
//! newest completed checkpoint, and the restored ones described for the
//! error that ends a job whose failures make no progress.
//!
//! It only reads parts (a source's part is its position, `shell/part.rs`)
//! and hashes them; the decision is the [`crate::restart::RestartTracker`]'s.
//! Fingerprints are compared within one process only, so std's hasher
//! with its fixed keys is enough.

use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use crate::job::inspect::{describe_position, StoredPosition};
use crate::protocol::CheckpointId;
use crate::restart::RunPositions;
use crate::storage::{PartId, Segment};

use super::super::physical::PhysicalPlan;
use super::super::shell::{PartBytes, PendingPart};

/// A region's sources' positions: the fingerprint and what they say.
#[derive(Debug, Clone)]
struct Restored {
    fingerprint: u64,
    /// `operator[subtask] position`, one per source subtask.
    described: Vec<String>,
}

/// Where the sources of every region stand (module doc).
pub(super) struct SourcePositions {
    /// Per region, its source nodes in ascending order.
    sources: Vec<Vec<usize>>,
    /// Per region, what its current generation restored.
    restored: Vec<Restored>,
    /// Per region, the fingerprint of the newest completed checkpoint's
    /// positions (the restored ones until a checkpoint completes).
    reached: Vec<u64>,
    /// Per checkpoint with the writer, its per-region fingerprints. At
    /// most one entry per checkpoint being persisted, removed when the
    /// writer answers.
    persisting: BTreeMap<CheckpointId, Vec<u64>>,
}

impl SourcePositions {
    /// Nothing restored yet, for a plan whose node `n` is in region
    /// `region_of[n]`.
    pub(super) fn new(plan: &PhysicalPlan, region_of: &[usize], region_count: usize) -> Self {
        let kinds = super::metrics::operator_kinds(plan);
        let mut sources = vec![Vec::new(); region_count];
        for (node, &(operator, _)) in plan.nodes.iter().enumerate() {
            if kinds[operator] == crate::metrics::OperatorKind::Source {
                sources[region_of[node]].push(node);
            }
        }
        let nothing = Restored {
            fingerprint: fingerprint_of(std::iter::empty::<Option<&[u8]>>()),
            described: Vec::new(),
        };
        SourcePositions {
            sources,
            reached: vec![nothing.fingerprint; region_count],
            restored: vec![nothing; region_count],
            persisting: BTreeMap::new(),
        }
    }

    /// `region` starts a generation from `parts` (already mapped onto the
    /// plan's subtasks; empty when nothing is restored).
    pub(super) fn on_restored(
        &mut self,
        region: usize,
        plan: &PhysicalPlan,
        parts: &BTreeMap<PartId, Vec<u8>>,
    ) {
        let states: Vec<(PartId, Option<Vec<u8>>)> = self.sources[region]
            .iter()
            .map(|&node| {
                let part = plan.part_id(node);
                let state = parts
                    .get(&part)
                    .and_then(|bytes| PartBytes::decode(bytes).ok())
                    .map(|decoded| decoded.state);
                (part, state)
            })
            .collect();
        if parts.is_empty() {
            // Nothing restored: the fixed fingerprint `new` starts with.
            let nothing = fingerprint_of(std::iter::empty::<Option<&[u8]>>());
            self.restored[region] = Restored {
                fingerprint: nothing,
                described: Vec::new(),
            };
            self.reached[region] = nothing;
            return;
        }
        let fingerprint = fingerprint_of(states.iter().map(|(_, state)| state.as_deref()));
        let described = states
            .iter()
            .map(|(part, state)| {
                let position = state.as_deref().map_or("nothing".to_owned(), describe);
                format!("{}[{}] {position}", part.operator, part.subtask)
            })
            .collect();
        self.restored[region] = Restored {
            fingerprint,
            described,
        };
        self.reached[region] = fingerprint;
    }

    /// `checkpoint` goes to the writer with `parts` (by node): keeps each
    /// region's fingerprint until it is persisted.
    pub(super) fn on_persist(&mut self, checkpoint: CheckpointId, parts: &[(PartId, PendingPart)]) {
        let per_region = self
            .sources
            .iter()
            .map(|nodes| {
                let states: Vec<Option<Vec<u8>>> = nodes
                    .iter()
                    .map(|&node| parts.get(node).and_then(|(_, part)| source_state(part)))
                    .collect();
                match states.iter().all(Option::is_some) {
                    true => fingerprint_of(states.iter().map(Option::as_deref)),
                    // A position that cannot be read counts as a new one
                    // (the checkpoint's id makes it unique), so that no
                    // job is given up on for positions nobody compared.
                    false => fingerprint_of([Some(&checkpoint.0.to_le_bytes()[..])]),
                }
            })
            .collect();
        self.persisting.insert(checkpoint, per_region);
    }

    /// The writer answered for `checkpoint`: if it is durable, its
    /// positions are the ones every region's next restart restores.
    pub(super) fn on_persisted(&mut self, checkpoint: CheckpointId, durable: bool) {
        let Some(per_region) = self.persisting.remove(&checkpoint) else {
            return;
        };
        if durable {
            self.reached = per_region;
        }
    }

    /// Where the failed `regions` started and how far they got.
    pub(super) fn of_failure(&self, regions: &[usize]) -> RunPositions {
        let combined = |of: &dyn Fn(usize) -> u64| {
            let mut hasher = DefaultHasher::new();
            for &region in regions {
                of(region).hash(&mut hasher);
            }
            hasher.finish()
        };
        RunPositions {
            restored: combined(&|region| self.restored[region].fingerprint),
            reached: combined(&|region| self.reached[region]),
        }
    }

    /// The positions the failed `regions` restored, for an error.
    pub(super) fn describe_restored(&self, regions: &[usize]) -> String {
        let described: Vec<&str> = regions
            .iter()
            .flat_map(|&region| &self.restored[region].described)
            .map(String::as_str)
            .collect();
        match described.is_empty() {
            true => "nothing (no checkpoint was restored)".to_owned(),
            false => described.join(", "),
        }
    }
}

/// A source part's state (its position), if it is all bytes at hand.
fn source_state(part: &PendingPart) -> Option<Vec<u8>> {
    let PendingPart::Ready(segments) = part else {
        return None;
    };
    let mut bytes = Vec::new();
    for segment in segments {
        match segment {
            Segment::Own(own) | Segment::Shared(own) => bytes.extend_from_slice(own),
            Segment::Reuse(_) => return None,
        }
    }
    PartBytes::decode(&bytes).ok().map(|decoded| decoded.state)
}

/// One fingerprint of a sequence of optional byte strings.
fn fingerprint_of<'a>(states: impl IntoIterator<Item = Option<&'a [u8]>>) -> u64 {
    let mut hasher = DefaultHasher::new();
    for state in states {
        state.hash(&mut hasher);
    }
    hasher.finish()
}

/// A source position as a person reads it.
fn describe(state: &[u8]) -> String {
    match describe_position(state) {
        StoredPosition::Index(index) => format!("at index {index}"),
        StoredPosition::Kafka(partitions) => {
            let offsets: Vec<String> = partitions
                .iter()
                .map(|place| {
                    format!(
                        "{}/{} at offset {}",
                        place.topic, place.partition, place.next_offset
                    )
                })
                .collect();
            offsets.join(" ")
        }
        StoredPosition::Unknown { bytes, crc32 } => {
            format!("at a position of {bytes} bytes, crc32 {crc32:08x}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::SourcePosition;

    #[test]
    fn positions_read_as_people_write_them() {
        assert_eq!(
            describe(SourcePosition::from_index(800).as_bytes()),
            "at index 800"
        );
        assert!(describe(&[9, 9, 9]).starts_with("at a position of 3 bytes"));
    }

    #[test]
    fn equal_states_have_equal_fingerprints_and_order_matters() {
        let one: &[u8] = &[1];
        let two: &[u8] = &[2];
        assert_eq!(
            fingerprint_of([Some(one), None]),
            fingerprint_of([Some(one), None])
        );
        assert_ne!(
            fingerprint_of([Some(one), Some(two)]),
            fingerprint_of([Some(two), Some(one)])
        );
        assert_ne!(fingerprint_of([None]), fingerprint_of([Some(&[][..])]));
    }
}
