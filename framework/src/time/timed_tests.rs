//! Unit tests of the timed keyed core's snapshots: what a checkpoint
//! takes is the state at the hand-off, whatever the operator does after it
//! (window adds, timer registrations and deletions, firings that remove
//! timers and state), in both layouts, whole and incremental; the stored
//! format is the one written before asynchronous snapshots, so such a
//! checkpoint restores into either layout with its timers due again.
//! Randomised runs take `SNAPFLOW_SEED` and name their seed on failure.
//! Compiled for tests only.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::job::{
    encode_keyed_state, Collector, Core, IncrementalCheckpoints, Router, TakenState, WrittenShared,
};
use crate::keyed::test_support::{seed, Count, Rng};
use crate::keyed::{KeyGroupRange, KeyedState, MaxParallelism};
use crate::protocol::{CheckpointId, CheckpointKind};
use crate::runtime::channel::Outputs;
use crate::storage::Segment;

use super::timed_state::{decode_timed_state, encode_timed_state, TimedState};
use super::timers::{KeyTimers, TimedStatePlan};
use super::{ManualClock, ProcessingTime, TimedFn, TimedFns, TimedKeyedCore};

/// (key, event time).
type Event = (u64, u64);
type TestCore = TimedKeyedCore<u64, Count, Event, u64>;

fn max_parallelism() -> MaxParallelism {
    MaxParallelism::new(16).expect("a valid max parallelism")
}

fn range() -> KeyGroupRange {
    max_parallelism()
        .range_for_subtask(1, 0)
        .expect("one subtask's range")
}

/// A core that counts per key, registers a timer at each record's time
/// (and deletes one 3 ms later at times divisible by 7), and at a timer
/// zeroes the count, which prunes the key once its timers are gone.
fn core(plan: &TimedStatePlan) -> TestCore {
    let fns = TimedFns {
        key_of: Arc::new(|event: &Event| event.0) as Arc<dyn Fn(&Event) -> u64 + Send + Sync>,
        on_record: Arc::new(
            |_key: &u64,
             count: &mut Count,
             event: Event,
             timers: &mut super::Timers<'_>,
             _out: &mut Collector<'_, u64>| {
                count.count += 1;
                timers.register_event_time_ms(event.1);
                if event.1 % 7 == 0 {
                    timers.delete_event_time_ms(event.1 + 3);
                }
                Ok(())
            },
        ) as Arc<TimedFn<u64, Count, Event, u64>>,
        on_timer: Arc::new(
            |key: &u64,
             count: &mut Count,
             _at: u64,
             _timers: &mut super::Timers<'_>,
             out: &mut Collector<'_, u64>| {
                count.count = 0;
                out.emit(*key);
                Ok(())
            },
        ),
        prune: Some(|count: &Count| count.count == 0),
        _records: PhantomData,
    };
    let time = ProcessingTime {
        clock: Arc::new(ManualClock::new(0)),
        tick_ms: None,
    };
    let mut core = TimedKeyedCore::new((max_parallelism(), 1, 0), fns, time, plan);
    core.restore(None).expect("starts fresh");
    core
}

/// Feeds `core` a random batch, then maybe a rise of the watermark (which
/// fires timers, removing them and pruning their keys).
fn workload(core: &mut TestCore, rng: &mut Rng, watermark_ms: &mut u64) {
    let mut outputs: Outputs<u64, crate::job::Control> = Outputs::new(Vec::new());
    let mut router = Router::new(Vec::new());
    let mut out = Collector::new(&mut outputs, &mut router);
    let batch: Vec<Event> = (0..rng.below(60))
        .map(|_| (rng.below(300), *watermark_ms + 1 + rng.below(40)))
        .collect();
    core.process(batch, &mut out).expect("processes");
    if rng.below(2) == 0 {
        *watermark_ms += rng.below(30);
        core.on_watermark(*watermark_ms, &mut out).expect("fires");
    }
}

/// What a stored timed state holds: counts and timers per key, and the
/// watermark (every part's CRCs checked on the way).
type Contents = (BTreeMap<u64, u64>, BTreeMap<u64, KeyTimers>, Option<u64>);

fn contents(bytes: &[u8]) -> Contents {
    let state = decode_timed_state(bytes).expect("a timed state");
    let user = crate::job::decode_keyed_state(&state.user).expect("the user envelope");
    let user: KeyedState<u64, Count> =
        KeyedState::restore(max_parallelism(), range(), user).expect("the user parts");
    let timers = crate::job::decode_keyed_state(&state.timers).expect("the timers envelope");
    let timers: KeyedState<u64, KeyTimers> =
        KeyedState::restore(max_parallelism(), range(), timers).expect("the timer parts");
    (
        user.iter()
            .map(|(key, count)| (*key, count.count))
            .collect(),
        timers.iter().map(|(key, t)| (*key, t.clone())).collect(),
        state.watermark_ms,
    )
}

fn plan(threshold_keys: usize, incremental: bool) -> TimedStatePlan {
    let settings = IncrementalCheckpoints {
        enabled: true,
        full_every: 4,
    };
    TimedStatePlan {
        copy_on_write_threshold_keys: threshold_keys,
        incremental: incremental.then_some(settings),
    }
}

/// A chain of checkpoints of a core with `threshold_keys`, incremental
/// when `incremental`: each taken snapshot, encoded after more work, holds
/// the state at its hand-off; returns how many segments referred to
/// earlier checkpoints.
fn check_chain(seed: u64, threshold_keys: usize, incremental: bool) -> usize {
    let mut core = core(&plan(threshold_keys, incremental));
    let (mut rng, mut watermark_ms) = (Rng(seed), 0);
    let (mut written, mut reused) = (WrittenShared::default(), 0);
    let context = format!(
        "seed {seed} (SNAPFLOW_SEED), threshold {threshold_keys}, incremental {incremental}"
    );
    for checkpoint in 1..=16u64 {
        for _ in 0..rng.below(6) {
            workload(&mut core, &mut rng, &mut watermark_ms);
        }
        // Every fifth is a savepoint, as its barrier would say.
        let kind = if checkpoint % 5 == 0 {
            CheckpointKind::Savepoint
        } else {
            CheckpointKind::Periodic
        };
        let at_hand_off = core.snapshot(CheckpointId(0)).expect("encodes");
        let taken = core
            .take_state(CheckpointId(checkpoint), kind)
            .expect("takes");
        if threshold_keys == 0 {
            assert!(
                matches!(taken, TakenState::Deferred(_)),
                "{context}: copy-on-write defers"
            );
        }
        for _ in 0..1 + rng.below(4) {
            workload(&mut core, &mut rng, &mut watermark_ms);
        }
        let segments = match taken {
            TakenState::Segments(segments) => segments,
            TakenState::Deferred(state) => state.encode().expect("encodes on the writer"),
        };
        if kind == CheckpointKind::Savepoint || !incremental {
            assert!(
                segments.iter().all(|s| matches!(s, Segment::Own(_))),
                "{context}: whole"
            );
        }
        reused += segments
            .iter()
            .filter(|s| matches!(s, Segment::Reuse(_)))
            .count();
        written.record(&segments, checkpoint);
        let bytes = written.assemble(&segments);
        assert_eq!(
            contents(&bytes),
            contents(&at_hand_off),
            "{context}, checkpoint {checkpoint}"
        );
        if rng.below(4) != 0 {
            core.on_complete(CheckpointId(checkpoint))
                .expect("confirms");
        }
    }
    reused
}

#[test]
fn writes_after_the_hand_off_never_reach_the_snapshot() {
    let seed = seed();
    for threshold_keys in [0, 40, usize::MAX] {
        for incremental in [false, true] {
            let reused = check_chain(seed, threshold_keys, incremental);
            if incremental {
                assert!(
                    reused > 0,
                    "seed {seed}: an incremental chain refers to earlier checkpoints"
                );
            }
        }
    }
}

#[test]
fn a_whole_snapshot_keeps_the_stored_bytes() {
    let seed = seed();
    for threshold_keys in [0, usize::MAX] {
        let mut core = core(&plan(threshold_keys, false));
        let (mut rng, mut watermark_ms) = (Rng(seed), 0);
        for _ in 0..8 {
            workload(&mut core, &mut rng, &mut watermark_ms);
        }
        let bytes = core.snapshot(CheckpointId(0)).expect("encodes");
        let segments = core
            .snapshot_segments(CheckpointId(1), CheckpointKind::Periodic)
            .expect("encodes");
        assert_eq!(
            segments,
            [Segment::Own(bytes)],
            "seed {seed}, threshold {threshold_keys}"
        );
    }
}

/// A checkpoint as the timed core wrote it before its snapshots were
/// asynchronous: both tables encoded whole by the flat state, framed by
/// postcard.
fn pre_change_checkpoint() -> Vec<u8> {
    let mut user: KeyedState<u64, Count> =
        KeyedState::new(max_parallelism(), range()).expect("a state");
    let mut timers: KeyedState<u64, KeyTimers> =
        KeyedState::new(max_parallelism(), range()).expect("a state");
    for key in 0..100u64 {
        user.get_or_default(&key).count = key + 1;
        *timers.get_or_default(&key) = KeyTimers::at(&[100 + key]);
    }
    let encode = |parts: Vec<(u32, Vec<u8>)>| encode_keyed_state(&parts).expect("encodes");
    encode_timed_state(&TimedState {
        user: encode(user.snapshot().expect("encodes").into_parts().collect()),
        timers: encode(timers.snapshot().expect("encodes").into_parts().collect()),
        watermark_ms: Some(99),
    })
    .expect("encodes")
}

#[test]
fn a_checkpoint_written_before_asynchronous_snapshots_restores_into_either_layout() {
    let stored = pre_change_checkpoint();
    for threshold_keys in [0, 50, usize::MAX] {
        let mut core = core(&plan(threshold_keys, false));
        core.restore(Some(&stored)).expect("restores");
        let restored = core.snapshot(CheckpointId(0)).expect("encodes");
        assert_eq!(
            contents(&restored),
            contents(&stored),
            "threshold {threshold_keys}"
        );
        // The index by time was rebuilt: every key's timer fires once.
        let mut outputs: Outputs<u64, crate::job::Control> = Outputs::new(Vec::new());
        let mut router = Router::new(Vec::new());
        let mut out = Collector::new(&mut outputs, &mut router);
        core.on_watermark(1_000, &mut out).expect("fires");
        drop(out);
        let after = contents(&core.snapshot(CheckpointId(0)).expect("encodes"));
        assert!(
            after.0.is_empty() && after.1.is_empty(),
            "every key fired and was pruned"
        );
    }
}
