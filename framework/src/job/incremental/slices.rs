//! An in-memory state's incremental snapshot in slices
//! ([`KeyedSnapshotSlices`]), of the copy-on-write or the flat layout:
//! per key group a fresh part header, then each slice either written
//! again or referred to where an earlier checkpoint wrote it, with the
//! header's body CRC combined from the pieces' CRCs.
//!
//! This module owns only that assembly of segments; which slices to
//! write is the ledger's choice (the parent module) and the slices'
//! bytes come from the copy-on-write state's hand-off (`keyed::cow`) or
//! from the flat state's encoding on the operator's thread
//! (`KeyedState::encode_slices`), in the same form. It never does
//! I/O and never reads an unchanged byte: the part it stands for is, byte
//! for byte, a format-1 part whose entries run slice by slice, so
//! restoring, rescaling and `snapflow show` see a full part.

use crate::keyed::deferred::DeferredSlices;
use crate::keyed::{part, EncodedSlices};
use crate::protocol::CheckpointId;
use crate::runtime::BoxError;
use crate::storage::segment::combined_crc32;
use crate::storage::{Segment, SharedRange};

use super::super::shell::DeferredState;
use super::{push_own, settle_landed, SnapshotPlan};

/// One in-memory state's incremental snapshot, planned per slice at the
/// snapshot and encoded by [`Self::encode`] on the checkpoint writer's
/// thread: per key group a fresh header (as own bytes), then each slice
/// either written again (shared bytes) or referred to where an earlier
/// checkpoint wrote it. The part assembles to a format-1 part whose
/// entries run slice by slice, so loading needs nothing new.
pub(crate) struct KeyedSnapshotSlices {
    pub(super) plan: SnapshotPlan,
    pub(super) slices: Box<dyn DeferredSlices>,
}

impl KeyedSnapshotSlices {
    /// The segments: the envelope's framing and each part's header as own
    /// bytes, then its slices. Tells the ledger where the written slices
    /// landed. Key groups are asked for one at a time.
    pub(crate) fn encode(self) -> Result<Vec<Segment>, BoxError> {
        self.encode_at(0)
    }

    /// [`Self::encode`] for a part whose shared file already holds
    /// `shared_offset` bytes of an earlier state of the same part (the
    /// timed core writes its user state's and its timers' snapshots into
    /// one part), so that the ranges the ledger confirms name where the
    /// written slices really land.
    pub(crate) fn encode_at(self, shared_offset: u64) -> Result<Vec<Segment>, BoxError> {
        let KeyedSnapshotSlices { plan, mut slices } = self;
        let per_group = plan.units_per_group.max(1);
        let groups = plan.layout.len() / per_group;
        let mut segments = vec![Segment::Own(postcard::to_allocvec(&(groups as u64))?)];
        let mut landed = Vec::new();
        let mut offset = shared_offset;
        for (key_group, layout) in (plan.start..).zip(plan.layout.chunks(per_group)) {
            let encoded = slices.next_group().transpose()?;
            let encoded = encoded
                .filter(|encoded| encoded.key_group == key_group)
                .ok_or_else(|| {
                    format!("bug: key group {key_group} was planned but not handed off")
                })?;
            let (len, body) =
                group_segments(plan.checkpoint, layout, encoded, &mut offset, &mut landed)?;
            push_own(&mut segments, postcard::to_allocvec(&(key_group, len))?);
            segments.extend(body);
        }
        if slices.next_group().is_some() {
            return Err("bug: a key group was handed off but not planned".into());
        }
        settle_landed(plan.landed, landed);
        Ok(segments)
    }
}

impl DeferredState for KeyedSnapshotSlices {
    fn encode(self: Box<Self>) -> Result<Vec<Segment>, BoxError> {
        (*self).encode()
    }
}

/// One key group's part, as its length and its segments, from its plan
/// (`layout`: the header's unit, then one per slice) and its fresh slices.
/// What is written lands in this checkpoint's shared file from `offset`
/// on (recorded in `landed`, in unit order), the rest is referred to. A
/// fresh header's entry count and body CRC are combined from the
/// pieces', so no unchanged byte is read; a group with nothing fresh
/// refers to its earlier header too (the plan writes the header whenever
/// a slice is written, so that header describes exactly these slices).
fn group_segments(
    checkpoint: CheckpointId,
    layout: &[Option<SharedRange>],
    mut encoded: EncodedSlices,
    offset: &mut u64,
    landed: &mut Vec<SharedRange>,
) -> Result<(u64, Vec<Segment>), BoxError> {
    let key_group = encoded.key_group;
    let Some((header_plan, slice_plans)) = layout.split_first() else {
        return Err(format!("bug: key group {key_group} has no planned header").into());
    };
    let header_len = part::PART_HEADER_LEN as u64;
    let mut body: Vec<BodyPiece> = Vec::new();
    let mut pieces = Vec::with_capacity(slice_plans.len());
    let mut group_landed = Vec::new();
    let mut entries = encoded.reused_entries;
    // The header's room comes first in `encoded.bytes` and, when the
    // header is written, in the shared file.
    let mut start = part::PART_HEADER_LEN;
    let mut next_offset = *offset + if header_plan.is_none() { header_len } else { 0 };
    let mut fresh = encoded.slices.iter();
    for (slice, planned) in slice_plans.iter().enumerate() {
        let range = match planned {
            Some(range) => {
                push_piece(&mut body, BodyPiece::Reuse(*range));
                *range
            }
            None => {
                let &(_, end, count) = fresh
                    .next()
                    .filter(|(fresh, ..)| *fresh as usize == slice)
                    .ok_or_else(|| {
                        format!("bug: slice {slice} of key group {key_group} was planned but not handed off")
                    })?;
                let bytes = encoded.bytes.get(start..end).ok_or_else(|| {
                    format!("bug: slice {slice} of key group {key_group} ends before it starts")
                })?;
                let range = SharedRange {
                    checkpoint: checkpoint.0,
                    offset: next_offset,
                    len: bytes.len() as u64,
                    crc32: crc32fast::hash(bytes),
                };
                next_offset += range.len;
                group_landed.push(range);
                entries += count;
                push_piece(&mut body, BodyPiece::Fresh { start, end });
                start = end;
                range
            }
        };
        pieces.push((range.crc32, range.len));
    }
    if fresh.next().is_some() {
        return Err(format!(
            "bug: a slice of key group {key_group} was handed off but not planned"
        )
        .into());
    }
    let body_len: u64 = pieces.iter().map(|(_, len)| len).sum();
    let header = match header_plan {
        Some(range) => BodyPiece::Reuse(*range),
        None => {
            let header = part::header_for(
                encoded.max_parallelism,
                key_group,
                entries,
                encoded.schema_len,
                body_len,
                combined_crc32(pieces),
            );
            encoded.bytes[..part::PART_HEADER_LEN].copy_from_slice(&header);
            let range = SharedRange {
                checkpoint: checkpoint.0,
                offset: *offset,
                len: header_len,
                crc32: crc32fast::hash(&header),
            };
            landed.push(range);
            BodyPiece::Fresh {
                start: 0,
                end: part::PART_HEADER_LEN,
            }
        }
    };
    landed.extend(group_landed);
    *offset = next_offset;
    let mut all = Vec::with_capacity(body.len() + 1);
    all.push(header);
    for piece in body {
        push_piece(&mut all, piece);
    }
    Ok((header_len + body_len, into_segments(all, encoded.bytes)))
}

/// A run of a part's body: fresh slices back to back in the group's
/// encoded bytes, or a range an earlier checkpoint wrote. A fresh run
/// carries no CRC: each fresh slice's own CRC is recorded in `landed`,
/// and the store computes the CRC of the segment it writes, so combining
/// them per run (about a microsecond per slice) bought nothing.
enum BodyPiece {
    Fresh { start: usize, end: usize },
    Reuse(SharedRange),
}

/// Appends a slice's piece, merged into the last run when they are
/// adjacent (fresh after fresh; a reused range right after a reused range
/// of the same file), so that a part has a few segments, not one per
/// slice. An empty piece adds nothing.
fn push_piece(body: &mut Vec<BodyPiece>, piece: BodyPiece) {
    let len = match &piece {
        BodyPiece::Fresh { start, end } => (end - start) as u64,
        BodyPiece::Reuse(range) => range.len,
    };
    if len == 0 {
        return;
    }
    match (body.last_mut(), &piece) {
        (Some(BodyPiece::Fresh { end, .. }), BodyPiece::Fresh { end: next, .. }) => {
            *end = *next;
        }
        (Some(BodyPiece::Reuse(last)), BodyPiece::Reuse(range))
            if last.checkpoint == range.checkpoint && last.offset + last.len == range.offset =>
        {
            *last = merged(last, range);
        }
        _ => body.push(piece),
    }
}

/// `first` and `second`, which follow each other in one file, as one range.
fn merged(first: &SharedRange, second: &SharedRange) -> SharedRange {
    SharedRange {
        checkpoint: first.checkpoint,
        offset: first.offset,
        len: first.len + second.len,
        crc32: combined_crc32([(first.crc32, first.len), (second.crc32, second.len)]),
    }
}

/// The part's runs as segments; fresh bytes are moved when they are one
/// run (a group written whole, its header included), copied out of
/// `bytes` otherwise.
fn into_segments(body: Vec<BodyPiece>, bytes: Vec<u8>) -> Vec<Segment> {
    if let [BodyPiece::Fresh { start: 0, end, .. }] = body.as_slice() {
        if *end == bytes.len() {
            return vec![Segment::Shared(bytes)];
        }
    }
    body.into_iter()
        .map(|piece| match piece {
            BodyPiece::Fresh { start, end, .. } => Segment::Shared(bytes[start..end].to_vec()),
            BodyPiece::Reuse(range) => Segment::Reuse(range),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::tests::{counts, decoded, shared_len, take_flat, Written};
    use super::super::{assemble, IncrementalCheckpoints, KeyGroupLedger};
    use super::*;
    use crate::job::ops::{decode_keyed_state, encode_keyed_state, KeyGroupParts};
    use crate::keyed::test_support::{with_seed, Count};
    use crate::keyed::{CowKeyedState, KeyedState, MaxParallelism, SLICES_PER_KEY_GROUP};

    type State = CowKeyedState<u64, Count>;

    /// splitmix64.
    fn next(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn state() -> State {
        CowKeyedState::for_subtask(MaxParallelism::new(16).unwrap(), 2, 1).unwrap()
    }

    /// The keyed core's incremental snapshot of a copy-on-write state
    /// ([`KeyGroupLedger::hand_off_cow`]), encoded by the caller.
    fn take(
        ledger: &mut KeyGroupLedger,
        checkpoint: u64,
        state: &mut State,
    ) -> KeyedSnapshotSlices {
        ledger.hand_off_cow(CheckpointId(checkpoint), state)
    }

    /// A full encoding of `state`, each key group's entries slice by slice.
    fn full_bytes(state: &State) -> Vec<u8> {
        let parts: KeyGroupParts = state
            .snapshot_key_groups(|_| true)
            .unwrap()
            .into_iter()
            .map(|part| (part.key_group, part.bytes))
            .collect();
        encode_keyed_state(&parts).unwrap()
    }

    /// Every part of the envelope `bytes` passes its header and body CRCs.
    fn check_parts(bytes: &[u8]) -> Result<(), String> {
        for (key_group, part) in decode_keyed_state(bytes).map_err(|error| error.to_string())? {
            let description = part::describe(&part)?;
            assert_eq!(description.key_group, key_group);
        }
        Ok(())
    }

    /// A random chain of incremental snapshots (random keys touched,
    /// checkpoints confirmed or not, a full one every 4): each assembles,
    /// from its fresh slices and the ranges it reuses, to exactly the
    /// bytes of a full encoding of the state at its handoff, every part's
    /// CRCs verify, and it writes only the slices touched since the last
    /// confirmed checkpoint (plus the unconfirmed ones).
    fn check_chain(seed: u64) {
        let mut rng = seed;
        let mut state = state();
        let keys: Vec<u64> = (0..40_000u64).filter(|key| state.owns(key)).collect();
        for key in &keys {
            state.get_or_default(key).count = *key;
        }
        let settings = IncrementalCheckpoints {
            enabled: true,
            full_every: 4,
        };
        let mut ledger = KeyGroupLedger::new(settings, state.range().len());
        let mut written = Written::default();
        let mut confirmed_last = false;
        for checkpoint in 1..=24u64 {
            let touched: BTreeSet<usize> = (0..next(&mut rng) % 12)
                .map(|_| {
                    let key = keys[(next(&mut rng) % keys.len() as u64) as usize];
                    state.get_or_default(&key).count += 1;
                    state.slot_of(&key).unwrap()
                })
                .collect();
            let expected = full_bytes(&state);
            let snapshot = take(&mut ledger, checkpoint, &mut state);
            // Written after the handoff, before the writer encodes: must
            // not reach the snapshot (the state encodes each such slice at
            // its write, and the writer appends those bytes).
            state.get_or_default(&keys[0]).count += 1000;
            for _ in 0..next(&mut rng) % 3 {
                let key = keys[(next(&mut rng) % keys.len() as u64) as usize];
                state.get_or_default(&key).count += 1;
            }
            let segments = snapshot.encode().unwrap();
            written.record(&segments, checkpoint);
            let assembled = written.assemble(&segments);
            assert!(
                assembled == expected,
                "seed {seed}: checkpoint {checkpoint} assembles to other bytes"
            );
            check_parts(&assembled).unwrap();
            // Only the touched slices (and keys[0]'s, written after the
            // last handoff) are written again: bounded by the largest
            // slices' bytes, far below the state's.
            let wrote = Wrote {
                checkpoint,
                shared: shared_len(&segments),
                total: expected.len() as u64,
                slices: touched.len(),
            };
            confirmed_last = wrote.check_then_confirm(seed, &mut rng, &mut ledger, confirmed_last);
        }
    }

    /// What a checkpoint of a random chain (every 4th full) wrote: its
    /// shared bytes of its `total`, for `slices` touched slices.
    struct Wrote {
        checkpoint: u64,
        shared: u64,
        total: u64,
        slices: usize,
    }

    impl Wrote {
        /// Checks that the checkpoint, when it is not full and follows a
        /// confirmed one, wrote under 5 % of its bytes, then confirms it
        /// or not at random; returns whether it did.
        fn check_then_confirm(
            &self,
            seed: u64,
            rng: &mut u64,
            ledger: &mut KeyGroupLedger,
            confirmed_last: bool,
        ) -> bool {
            let full = (self.checkpoint - 1) % 4 == 0;
            if !full && confirmed_last {
                assert!(
                    self.shared * 20 < self.total,
                    "seed {seed}: checkpoint {} wrote {} of {} bytes for {} slices",
                    self.checkpoint,
                    self.shared,
                    self.total,
                    self.slices
                );
            }
            let confirmed = next(rng) % 4 != 0;
            if confirmed {
                ledger.on_complete(CheckpointId(self.checkpoint));
            }
            confirmed
        }
    }

    #[test]
    fn a_chain_of_sliced_parts_assembles_to_full_parts_and_writes_only_touched_slices() {
        with_seed("the sliced chain check", check_chain);
    }

    /// An in-memory state in either layout, as the keyed store holds it.
    enum Layout {
        Flat(KeyedState<u64, Count>),
        Cow(State),
    }

    impl Layout {
        fn count(&mut self, key: u64) {
            match self {
                Layout::Flat(state) => state.get_or_default(&key).count += 1,
                Layout::Cow(state) => state.get_or_default(&key).count += 1,
            }
        }

        fn range(&self) -> crate::keyed::KeyGroupRange {
            match self {
                Layout::Flat(state) => state.range(),
                Layout::Cow(state) => state.range(),
            }
        }

        fn counts(&self) -> std::collections::BTreeMap<u64, u64> {
            match self {
                Layout::Flat(state) => counts(state.iter()),
                Layout::Cow(state) => counts(state.iter()),
            }
        }

        /// The keyed core's incremental snapshot of the state.
        fn take(&mut self, ledger: &mut KeyGroupLedger, checkpoint: u64) -> KeyedSnapshotSlices {
            match self {
                Layout::Flat(state) => take_flat(ledger, checkpoint, state),
                Layout::Cow(state) => take(ledger, checkpoint, state),
            }
        }

        /// The state moved to the copy-on-write layout, as the keyed
        /// store does at its threshold.
        fn convert(self) -> Self {
            match self {
                Layout::Flat(state) => Layout::Cow(CowKeyedState::from_flat(state)),
                cow => cow,
            }
        }
    }

    /// A random chain of the flat layout's incremental snapshots (random
    /// keys touched, new ones among them so that the table grows and
    /// reorders its entries, checkpoints confirmed or not, a full one
    /// every 4), moved to the copy-on-write layout before checkpoint
    /// `convert_at` when it is given: each assembles to parts whose CRCs
    /// verify and which restore to exactly the state at the snapshot, and
    /// a checkpoint after a confirmed one that is not full writes only the
    /// touched slices, also right after the move (the ledger's units are
    /// the same in both layouts, so nothing starts again).
    fn check_flat_chain(seed: u64, convert_at: Option<u64>) {
        let mut rng = seed;
        let mut state =
            Layout::Flat(KeyedState::for_subtask(MaxParallelism::new(16).unwrap(), 2, 1).unwrap());
        let range = state.range();
        let max_parallelism = MaxParallelism::new(16).unwrap();
        let owned =
            |key: &u64| range.contains(max_parallelism.key_group_of(crate::keyed::key_hash(key)));
        let mut keys: Vec<u64> = (0..40_000u64).filter(owned).collect();
        let mut unused = (40_000u64..).filter(owned);
        for key in &keys {
            state.count(*key);
        }
        let settings = IncrementalCheckpoints {
            enabled: true,
            full_every: 4,
        };
        let mut ledger = KeyGroupLedger::new(settings, range.len());
        let mut written = Written::default();
        let mut confirmed_last = false;
        for checkpoint in 1..=24u64 {
            if convert_at == Some(checkpoint) {
                state = state.convert();
            }
            let touches = next(&mut rng) % 12;
            for _ in 0..touches {
                let key = if next(&mut rng) % 3 == 0 {
                    let key = unused.next().expect("an owned key");
                    keys.push(key);
                    key
                } else {
                    keys[(next(&mut rng) % keys.len() as u64) as usize]
                };
                state.count(key);
            }
            let segments = state.take(&mut ledger, checkpoint).encode().unwrap();
            written.record(&segments, checkpoint);
            let assembled = written.assemble(&segments);
            check_parts(&assembled).unwrap();
            assert!(
                decoded(&assembled, range) == state.counts(),
                "seed {seed}: checkpoint {checkpoint} restores another state"
            );
            let wrote = Wrote {
                checkpoint,
                shared: shared_len(&segments),
                total: assembled.len() as u64,
                slices: touches as usize,
            };
            confirmed_last = wrote.check_then_confirm(seed, &mut rng, &mut ledger, confirmed_last);
        }
    }

    #[test]
    fn a_flat_chain_of_sliced_parts_restores_exactly_and_writes_only_touched_slices() {
        with_seed("the flat sliced chain check", |seed| {
            check_flat_chain(seed, None);
            // Moved after a confirmed incremental checkpoint (3 follows 2,
            // which is not full, when 2 was confirmed), and at a random one.
            check_flat_chain(seed, Some(3));
            check_flat_chain(seed, Some(2 + seed % 20));
        });
    }

    #[test]
    fn a_flat_state_moved_to_copy_on_write_refers_to_the_slices_it_wrote_flat() {
        let mut flat: KeyedState<u64, Count> =
            KeyedState::for_subtask(MaxParallelism::new(16).unwrap(), 2, 1).unwrap();
        let keys: Vec<u64> = (0..20_000).filter(|key| flat.owns(key)).collect();
        for key in &keys {
            flat.get_or_default(key).count += 1;
        }
        let mut ledger = KeyGroupLedger::new(IncrementalCheckpoints::default(), flat.range().len());
        let mut written = Written::default();
        let first = take_flat(&mut ledger, 1, &mut flat).encode().unwrap();
        written.record(&first, 1);
        ledger.on_complete(CheckpointId(1));
        flat.get_or_default(&keys[7]).count += 1;
        let range = flat.range();
        let mut cow = CowKeyedState::from_flat(flat);
        let second = take(&mut ledger, 2, &mut cow).encode().unwrap();
        written.record(&second, 2);
        // One slice and its header written; everything else read from
        // what the flat layout wrote at checkpoint 1.
        assert!(shared_len(&second) * 200 < shared_len(&first));
        assert!(second.iter().any(|segment| matches!(
            segment,
            Segment::Reuse(range) if range.checkpoint == 1
        )));
        let assembled = written.assemble(&second);
        check_parts(&assembled).unwrap();
        assert_eq!(decoded(&assembled, range), counts(cow.iter()));
    }

    /// A state holding the owned keys below `below` once each, after its
    /// first (full) checkpoint 1, confirmed: the state, those keys, the
    /// ledger, what was written and checkpoint 1's segments.
    fn after_a_full_checkpoint(
        below: u64,
    ) -> (State, Vec<u64>, KeyGroupLedger, Written, Vec<Segment>) {
        let mut state = state();
        let keys: Vec<u64> = (0..below).filter(|key| state.owns(key)).collect();
        for key in &keys {
            state.get_or_default(key).count += 1;
        }
        let mut ledger =
            KeyGroupLedger::new(IncrementalCheckpoints::default(), state.range().len());
        let mut written = Written::default();
        let first = take(&mut ledger, 1, &mut state).encode().unwrap();
        written.record(&first, 1);
        ledger.on_complete(CheckpointId(1));
        (state, keys, ledger, written, first)
    }

    #[test]
    fn one_touched_key_writes_one_slice_and_refers_to_the_rest_in_few_segments() {
        let (mut state, keys, mut ledger, mut written, first) = after_a_full_checkpoint(20_000);
        // A full one: one shared run per key group, header included.
        let shared_runs = |segments: &[Segment]| {
            segments
                .iter()
                .filter(|segment| matches!(segment, Segment::Shared(_)))
                .count()
        };
        assert_eq!(shared_runs(&first), state.range().len());

        state.get_or_default(&keys[7]).count += 1;
        let slot = state.slot_of(&keys[7]).unwrap();
        let second = take(&mut ledger, 2, &mut state).encode().unwrap();
        written.record(&second, 2);
        // The touched group's header and its one slice (one run when the
        // slice is the first, which follows the header).
        assert!(shared_runs(&second) <= 2, "one slice written");
        let one_slice = shared_len(&second);
        assert!(
            one_slice * 200 < shared_len(&first),
            "{one_slice} bytes for one key"
        );
        // Reused ranges of one file merge: per untouched key group one
        // reused run (its header and slices), two around the written
        // slice.
        let reused = second
            .iter()
            .filter(|segment| matches!(segment, Segment::Reuse(_)))
            .count();
        assert!(reused <= state.range().len() + 1, "{reused} reused runs");
        assert!(written.assemble(&second) == full_bytes(&state));
        ledger.on_complete(CheckpointId(2));
        // Nothing touched: nothing written, the touched slice now read
        // from checkpoint 2's file.
        let third = take(&mut ledger, 3, &mut state).encode().unwrap();
        assert_eq!(shared_len(&third), 0);
        assert!(third.iter().any(|segment| matches!(
            segment,
            Segment::Reuse(range) if range.checkpoint == 2
        )));
        assert!(written.assemble(&third) == full_bytes(&state));
        assert!(slot < state.range().len() * SLICES_PER_KEY_GROUP);
    }

    #[test]
    fn a_corrupted_reused_range_fails_the_parts_body_crc() {
        let (mut state, keys, mut ledger, written, _) = after_a_full_checkpoint(5_000);
        state.get_or_default(&keys[3]).count += 1;
        let second = take(&mut ledger, 2, &mut state).encode().unwrap();
        // Unharmed, it verifies; with one byte of checkpoint 1's file
        // flipped inside a range the second refers to, the header's body
        // CRC (combined from the pieces' CRCs) no longer matches.
        let whole = assemble(&second, |range| {
            let start = range.offset as usize;
            written.0[&range.checkpoint][start..start + range.len as usize].to_vec()
        });
        check_parts(&whole).unwrap();
        let target = second
            .iter()
            .find_map(|segment| match segment {
                Segment::Reuse(range) if range.len > 8 => Some(*range),
                _ => None,
            })
            .expect("a reused range");
        let damaged = assemble(&second, |range| {
            let start = range.offset as usize;
            let mut bytes =
                written.0[&range.checkpoint][start..start + range.len as usize].to_vec();
            if *range == target {
                bytes[range.len as usize / 2] ^= 0x20;
            }
            bytes
        });
        let error = check_parts(&damaged).unwrap_err();
        assert!(error.contains("body checksum"), "{error}");
    }

    #[test]
    fn the_ledger_keeps_32_bytes_per_slice() {
        assert!(std::mem::size_of::<Option<super::super::Written>>() <= 32);
    }
}
