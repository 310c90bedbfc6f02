//! Which in-memory entries of a [`SpillingState`](super::SpillingState)
//! go to disk when it is over its budget: a second-chance (CLOCK) choice,
//! so that keys used often stay in memory.
//!
//! This module owns the reference bit kept beside each hot entry
//! ([`Clocked`]), the eviction hand and its bound per call
//! ([`Evictor`]). It never writes to disk, never marks a key group dirty
//! and never decides when to evict (`state.rs`'s `enforce_budget` does).
//!
//! # The choice
//!
//! Each hot entry carries a reference bit. A lookup that finds its key
//! already in memory sets it; a key read back from disk or created enters
//! with the bit clear, so a key used once (a scan over cold keys) is the
//! first to go and cannot push out keys used again. The hand walks the
//! hot table's slices in slot order, continuing where the last eviction
//! stopped: an entry with its bit set is kept and its bit cleared (its
//! second chance), an entry with its bit clear is evicted. A key used
//! again before the hand comes back round keeps its place.
//!
//! # Why a bit in the entry (and not a set of keys or a bit set)
//!
//! - The bit is in the entry the lookup has just found and returns for
//!   writing, so setting it is one byte store to a cache line already
//!   being written: no second table, no hash, no shared memory. Its cost
//!   is memory: `(K, Clocked<S>)` is padded to the entry's alignment, so
//!   an entry of a `u64` key and a `u64` count grows from 16 to 24 bytes
//!   (a third more hot-table memory per budgeted key; the budget is in
//!   entries, not bytes).
//! - The same reasoning put the delta parts' record of what was written
//!   since the last snapshot into the entry too ([`Clocked::written_for`],
//!   in the same padding): it replaced a set of key hashes that cost a
//!   hash-table insert per record on the operator's thread and a probe
//!   per hot entry on the checkpoint writer's, about 4 % of the CPU of a
//!   spilling run at 10 M keys (BENCHMARKS.md at 07a44e5). That set was never a
//!   recency signal either: every key that enters memory enters it by a
//!   lookup, so it held every key loaded since the last snapshot.
//! - A bit set beside each slice's table, indexed by bucket, would cost a
//!   bit instead of up to a word per entry, but hashbrown 0.14's
//!   `HashTable` exposes no bucket index, and a table that grows moves
//!   its entries. Known gap: not built.
//!
//! # Bounded work
//!
//! One eviction takes `count` entries and clears at most
//! [`SKIPS_PER_VICTIM`] bits per entry taken; past that it takes the next
//! entries whatever their bits (the fallback when nearly everything was
//! used since the hand last passed, the order-based choice this replaced).
//! A call visits at most `(1 + SKIPS_PER_VICTIM) * count` entries, plus
//! the empty slots of at most two laps of the table's slots (a lap that
//! finds too few unreferenced entries has cleared every bit it passed or
//! spent its skips, so a second lap takes what it visits).
//! Clearing a bit changes an entry of a slice, so a slice a live snapshot
//! still holds is encoded for it (or copied) before the hand changes it,
//! as before an entry leaves it (the extra memory stays at most one
//! encoding or copy of the slices changed while the snapshot lives).
//!
//! The hand remembers its slot, not its place inside a slice: an eviction
//! that stops inside a slice starts that slice again next time, from its
//! first bucket, so the entries it already passed get a shorter second
//! chance (one eviction batch rather than a lap). A key used between
//! every batch keeps its bit set; one used more rarely than that may go.

use crate::keyed::cow_state::CowKeyedState;
use crate::keyed::StateKey;

/// How many referenced entries an eviction may pass over (clearing their
/// bits) per entry it takes, before it takes entries whatever their bits.
/// Three: with up to three quarters of the hot table used again since the
/// hand's last pass, a batch still finds its victims among unused keys.
pub(crate) const SKIPS_PER_VICTIM: usize = 3;

/// A hot entry's state, its reference bit and its write stamp.
#[derive(Debug, Default, Clone)]
pub(crate) struct Clocked<S> {
    pub(crate) state: S,
    /// Whether the key was found in memory by a lookup since the hand last
    /// passed it.
    pub(crate) referenced: bool,
    /// The [`stamp`] of the snapshot that holds the entry's last write:
    /// a lookup for writing sets it to the next snapshot's, so a delta
    /// part takes the entries whose stamp is its snapshot's (see
    /// `stamp` for why 32 bits are enough). It sits in the padding
    /// after `referenced` for states of 8-byte alignment, so it costs
    /// no memory there.
    pub(crate) written_for: u32,
}

impl<S> Clocked<S> {
    /// `state` as it enters memory (read back from disk or restored): not
    /// referenced, and written for no snapshot yet (stamp 0: snapshots
    /// start at epoch 1).
    pub(crate) fn entering(state: S) -> Self {
        Clocked {
            state,
            referenced: false,
            written_for: 0,
        }
    }
}

/// The write stamp of the snapshot of epoch `epoch`: its low 32 bits.
///
/// Two epochs 2^32 apart share a stamp, so an entry last written 2^32
/// snapshots ago would count as written for the current one. That only
/// puts an unchanged entry into a delta part (a delta may hold more than
/// what changed; it may never hold less), and the truncation keeps the
/// stamp in the entry's padding.
pub(crate) fn stamp(epoch: u64) -> u32 {
    epoch as u32
}

/// How the victims are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    /// Second chance (CLOCK): the default.
    SecondChance,
    /// The table's memory order, ignoring the bits: the choice before
    /// second chance, kept to compare the two (benchmarks set
    /// `SNAPFLOW_SPILL_EVICTION=order`; nothing else should).
    Order,
}

impl Policy {
    /// The policy `SNAPFLOW_SPILL_EVICTION` names (`order`), else second
    /// chance. Read once per state, when it is created.
    pub(crate) fn from_env() -> Self {
        match std::env::var("SNAPFLOW_SPILL_EVICTION").as_deref() {
            Ok("order") => Policy::Order,
            _ => Policy::SecondChance,
        }
    }
}

/// The eviction hand: where the next eviction starts, and how it chooses.
#[derive(Debug)]
pub(crate) struct Evictor {
    /// The hot table's slot where the next eviction starts.
    hand: usize,
    policy: Policy,
}

impl Evictor {
    pub(crate) fn new(policy: Policy) -> Self {
        Evictor { hand: 0, policy }
    }

    /// Takes `count` entries (fewer only when the table holds fewer) out
    /// of `hot`, chosen by the policy, without marking any key group
    /// dirty, and moves the hand past them.
    pub(crate) fn take<K: StateKey, S>(
        &mut self,
        hot: &mut CowKeyedState<K, Clocked<S>>,
        count: usize,
    ) -> Vec<(K, Clocked<S>)> {
        let mut skips_left = match self.policy {
            Policy::SecondChance => count.saturating_mul(SKIPS_PER_VICTIM),
            Policy::Order => 0,
        };
        let mut choose = |(_, entry): &mut (K, Clocked<S>)| second_chance(entry, &mut skips_left);
        let (mut taken, mut next) = hot.take_entries_from(self.hand, count, &mut choose);
        if taken.len() < count {
            // One lap did not find enough unreferenced entries, so every
            // entry left has had its bit cleared or the skips are spent:
            // a second lap takes what it visits.
            let (more, after) = hot.take_entries_from(next, count - taken.len(), &mut choose);
            taken.extend(more);
            next = after;
        }
        self.hand = next;
        taken
    }
}

/// Whether the hand evicts `entry`: not when its bit is set and it may
/// still pass over entries (`skips_left`), in which case it clears the bit
/// and spends one skip.
#[inline]
fn second_chance<S>(entry: &mut Clocked<S>, skips_left: &mut usize) -> bool {
    if entry.referenced && *skips_left > 0 {
        entry.referenced = false;
        *skips_left -= 1;
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_referenced_entry_is_passed_over_once_and_the_skips_are_bounded() {
        let mut entry = Clocked {
            state: 1u64,
            referenced: true,
            written_for: 0,
        };
        let mut skips = 1;
        assert!(!second_chance(&mut entry, &mut skips));
        assert!(!entry.referenced);
        assert!(second_chance(&mut entry, &mut skips));
        // With no skips left, a referenced entry goes too.
        entry.referenced = true;
        assert!(second_chance(&mut entry, &mut skips));
    }
}
