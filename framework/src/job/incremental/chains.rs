//! The spilling backend's incremental checkpoints in delta chains: which
//! key groups a snapshot writes whole, which it writes as a delta part
//! appended to the chain an earlier checkpoint holds, and which it refers
//! to, chain and all.
//!
//! This module owns that choice ([`KeyGroupLedger::plan_chained`]) and
//! the bound on a chain's length. It never builds a part (the spilling
//! snapshot does, and may write a planned delta whole) and never reads
//! one; [`super::KeyedSnapshotParts::encode`] turns the plan into
//! segments, and restore reads a chain as [`crate::keyed::part`]'s module
//! doc says (last wins).
//!
//! # Why a delta is right
//!
//! A delta part of a group holds every entry of the group changed since
//! the state's previous snapshot (the spilling state's change records,
//! `keyed/spill/state.rs`). Laid over the group's chain it gives the
//! group as of this snapshot only when the chain describes the group as
//! of the previous snapshot, so a delta is planned only when (1) the
//! group's last write was confirmed complete (a pending or aborted write
//! is not a chain to build on) and (2) no snapshot this ledger did not
//! plan (a savepoint, a capture) took the state's change records since
//! the ledger's last plan (`chain_epoch`). A group referred to at the
//! previous snapshot was unchanged then, so its chain still describes it.

use super::{CompactRange, KeyGroupLedger, SnapshotPlan, Written};
use crate::keyed::KeyGroupRange;
use crate::protocol::CheckpointId;

/// A group is written whole again once its delta parts add up to more
/// than this fraction of its base part (in bytes), so that a restore
/// never reads much more than the state; `full_every` bounds the number
/// of parts in a chain besides.
const MAX_DELTA_BYTES_PER_BASE_BYTE: (u64, u64) = (1, 2);

impl KeyGroupLedger {
    /// [`Self::plan`] for a spilling state whose snapshot count is
    /// `epoch` before this snapshot: each changed (or unconfirmed) group
    /// is written, as a delta on its chain where the module doc allows it
    /// and its chain is under the bound, and whole otherwise; every other
    /// group is referred to with its whole chain.
    pub(crate) fn plan_chained(
        &mut self,
        checkpoint: CheckpointId,
        key_groups: KeyGroupRange,
        changed: impl IntoIterator<Item = u32>,
        epoch: u64,
    ) -> SnapshotPlan {
        let groups = key_groups.len();
        if self.units_per_group != 1 || self.written.len() != groups || self.chains.len() != groups
        {
            self.units_per_group = 1;
            self.written = vec![None; groups];
            self.chains = vec![Vec::new(); groups];
            self.reset();
        }
        let full = self.next_position == 0;
        let continues = self.chain_epoch == Some(epoch);
        self.chain_epoch = Some(epoch + 1);
        let extendable: Vec<bool> = self
            .written
            .iter()
            .zip(&self.chains)
            .map(|(written, chain)| {
                !full
                    && continues
                    && matches!(written, Some(Written::Confirmed(_)))
                    && under_bound(chain)
            })
            .collect();
        let mut plan = self.plan(checkpoint, key_groups, changed);
        plan.chains = Vec::with_capacity(groups);
        for (unit, extendable) in extendable.into_iter().enumerate() {
            let chain = &mut self.chains[unit];
            let planned = if plan.writes_unit(unit) {
                if !extendable {
                    chain.clear();
                }
                chain.iter().map(|range| range.range()).collect()
            } else {
                // Referred to: the base is the layout's range, the deltas
                // follow it.
                chain.iter().skip(1).map(|range| range.range()).collect()
            };
            plan.chains.push(planned);
        }
        plan
    }
}

/// Whether a delta may still be appended to `chain` (base first): it has
/// a base and its deltas are within [`MAX_DELTA_BYTES_PER_BASE_BYTE`] of
/// it.
fn under_bound(chain: &[CompactRange]) -> bool {
    let Some((base, deltas)) = chain.split_first() else {
        return false;
    };
    let deltas: u64 = deltas.iter().map(|range| u64::from(range.len)).sum();
    let (num, den) = MAX_DELTA_BYTES_PER_BASE_BYTE;
    deltas * den <= u64::from(base.len) * num
}

impl SnapshotPlan {
    /// Whether the snapshot writes `key_group` and may write it as a
    /// delta part on its chain (else whole), for a plan of
    /// [`KeyGroupLedger::plan_chained`].
    pub(crate) fn writes_delta(&self, key_group: u32) -> bool {
        let index = key_group.wrapping_sub(self.start) as usize;
        self.writes_unit(index)
            && self
                .chains
                .get(index)
                .is_some_and(|chain| !chain.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::tests::{counts, decoded, Written};
    use super::super::IncrementalCheckpoints;
    use super::*;
    use crate::keyed::spill::SpillingState;
    use crate::keyed::store::KeyGroupSnapshots;
    use crate::keyed::test_support::{with_seed, Count, Rng};
    use crate::keyed::{KeyGroupPart, MaxParallelism};
    use crate::storage::Segment;

    type Model = BTreeMap<u64, u64>;

    fn range() -> KeyGroupRange {
        MaxParallelism::new(16)
            .unwrap()
            .range_for_subtask(2, 1)
            .unwrap()
    }

    /// The keyed core's incremental snapshot of a spilling state
    /// (`job/ops.rs`, `take_state`), encoded at once.
    fn checkpoint(
        ledger: &mut KeyGroupLedger,
        id: u64,
        state: &mut SpillingState<u64, Count>,
    ) -> Vec<Segment> {
        let plan = ledger.plan_chained(
            CheckpointId(id),
            state.key_groups(),
            state.changed_key_groups(),
            state.epoch(),
        );
        let snapshot = state
            .snapshot_with_deltas(&mut |key_group| plan.writes(key_group), &mut |key_group| {
                plan.writes_delta(key_group)
            })
            .unwrap();
        state.forget_changes();
        plan.with_parts(Box::new(snapshot)).encode().unwrap()
    }

    /// How many groups of `segments` are a chain extended by a fresh delta
    /// part: a reused range right before the group's shared bytes.
    fn deltas_in(segments: &[Segment]) -> usize {
        segments
            .windows(2)
            .filter(|pair| matches!(pair, [Segment::Reuse(_), Segment::Shared(_)]))
            .count()
    }

    /// The keyed state `bytes` holds, restored as two subtasks would after
    /// a rescale, each taking the chains of its half of the range.
    fn rescaled(bytes: &[u8]) -> Model {
        let parts = crate::job::ops::decode_keyed_state(bytes).unwrap();
        let middle = range().iter().start + range().len() as u32 / 2;
        let halves = [
            KeyGroupRange::new(range().iter().start, middle),
            KeyGroupRange::new(middle, range().iter().end),
        ];
        let mut model = Model::new();
        for half in halves {
            let ours = crate::keyed::parts_in_range(half, parts.clone());
            model.extend(decoded_parts(ours.collect(), half));
        }
        model
    }

    /// The counts of `parts` restored into `range`.
    fn decoded_parts(parts: Vec<(u32, Vec<u8>)>, range: KeyGroupRange) -> Model {
        let restored: crate::keyed::KeyedState<u64, Count> =
            crate::keyed::KeyedState::restore(MaxParallelism::new(16).unwrap(), range, parts)
                .unwrap();
        counts(restored.iter())
    }

    /// A seeded chain of incremental checkpoints of a spilling state with
    /// writes, evictions, loads (keys read back from disk) and deletions,
    /// some checkpoints never confirmed and some snapshots the ledger did
    /// not plan (a capture): every checkpoint assembles to the model's
    /// state, also restored as two subtasks after a rescale, and deltas
    /// were written.
    fn chain_against_model(seed: u64) {
        let mut rng = Rng(seed);
        let dir = tempfile::tempdir().unwrap();
        let max_parallelism = MaxParallelism::new(16).unwrap();
        let mut state: SpillingState<u64, Count> =
            SpillingState::new(max_parallelism, range(), dir.path().join("instance"), 24).unwrap();
        let keys: Vec<u64> = (0..2_000u64)
            .filter(|key| {
                range().contains(max_parallelism.key_group_of(crate::keyed::key_hash(key)))
            })
            .take(300)
            .collect();
        let settings = IncrementalCheckpoints {
            enabled: true,
            full_every: 5,
        };
        let mut ledger = KeyGroupLedger::new(settings, range().len());
        let mut written = Written::default();
        let mut model = Model::new();
        let mut deltas = 0;
        for id in 1..=40u64 {
            for _ in 0..rng.below(120) {
                let key = keys[rng.below(keys.len() as u64) as usize];
                match rng.below(20) {
                    0 => {
                        let removed = state.remove(&key).unwrap().map(|count| count.count);
                        assert_eq!(removed, model.remove(&key), "removing {key}");
                    }
                    1..=4 => state.enforce_budget().unwrap(),
                    _ => {
                        let amount = 1 + rng.below(9);
                        state.get_or_default(&key).unwrap().count += amount;
                        *model.entry(key).or_default() += amount;
                    }
                }
            }
            state.enforce_budget().unwrap();
            if rng.below(10) == 0 {
                // A capture takes the change records without the ledger.
                let parts: Vec<KeyGroupPart> = state.snapshot_parts().unwrap();
                assert_eq!(parts.len(), range().len());
            }
            let segments = checkpoint(&mut ledger, id, &mut state);
            written.record(&segments, id);
            deltas += deltas_in(&segments);
            let assembled = written.assemble(&segments);
            assert_eq!(decoded(&assembled, range()), model, "checkpoint {id}");
            assert_eq!(rescaled(&assembled), model, "checkpoint {id}, rescaled");
            if rng.below(5) != 0 {
                ledger.on_complete(CheckpointId(id));
            }
        }
        assert!(deltas > 0, "no checkpoint wrote a delta part");
    }

    #[test]
    fn a_chain_of_delta_checkpoints_restores_the_model_state() {
        for _ in 0..4 {
            with_seed("the delta chain model test", chain_against_model);
        }
    }

    #[test]
    fn deltas_stop_at_the_bound() {
        let base = CompactRange {
            checkpoint: 1,
            offset: 0,
            len: 100,
            crc32: 0,
        };
        let delta = |len| CompactRange { len, ..base };
        assert!(!under_bound(&[]));
        assert!(under_bound(&[base]));
        assert!(under_bound(&[base, delta(30), delta(20)]));
        assert!(!under_bound(&[base, delta(30), delta(21)]));
    }
}
