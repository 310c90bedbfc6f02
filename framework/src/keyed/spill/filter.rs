//! [`SpilledKeys`]: a filter of the keys the spilling backend has written
//! to disk, so that a key never spilled is created in memory without
//! asking the disk table.
//!
//! This module owns the filter's bits and its sizing. It never reads the
//! disk and never sees a key, only its [`crate::keyed::key_hash`]; it
//! answers "maybe on disk" or "certainly not on disk", never wrongly the
//! latter (no false negatives), because keys are only ever added: the
//! backend never deletes a key from disk.
//!
//! # Sizing (memory per key)
//!
//! A scalable Bloom filter: a series of filters, each for twice as many
//! keys as the one before and with half its false-positive rate, so the
//! rate over all of them stays below twice the first one's
//! ([`FIRST_FALSE_POSITIVE_RATE`], 0.5 %, so under 1 %) however many keys
//! are spilled, without knowing their number in advance or rebuilding. A
//! filter for `n` keys at rate `p` holds `1.44 · n · log2(1/p)` bits, so a
//! spilled key costs about 11 bits in the first filter and 1.44 more in
//! each later one. Each filter is blocked ([`Bloom`]: a key's bits in one
//! cache line), which needs a tenth more bits for the same rate
//! ([`BLOCKED_EXTRA_BITS`]): about 2.8 bytes per key at 10 M spilled keys
//! per instance, 3.3 bytes at 100 M. A restore rebuilds it from the
//! parts, into one filter sized for the keys restored
//! ([`SpilledKeys::with_capacity`]).

use crate::keyed::slice_table::prefetch_line;

/// The false-positive rate of the first filter; the sum over all filters
/// is below twice this.
const FIRST_FALSE_POSITIVE_RATE: f64 = 0.005;

/// How many keys the first filter is sized for.
const FIRST_CAPACITY_KEYS: u64 = 1 << 16;

/// How many keys ahead [`SpilledKeys::insert_all`] asks for a block:
/// enough misses in flight to overlap their latency.
const INSERT_AHEAD: usize = 16;

/// The hashes per key are capped here (the optimum at rates of 1e-12).
const MAX_HASHES: u32 = 40;

/// The keys written to disk, as a scalable Bloom filter of their hashes.
#[derive(Debug, Clone, Default)]
pub(crate) struct SpilledKeys {
    /// Oldest first; only the last one takes new keys.
    filters: Vec<Bloom>,
}

impl SpilledKeys {
    /// An empty filter whose first part holds `keys` keys (at least as
    /// many as a default one's) at the first rate: for a restore, which
    /// knows how many keys it writes to disk, so that they go into one
    /// filter instead of a series of ever larger ones, each of which a
    /// lookup asks.
    pub(crate) fn with_capacity(keys: u64) -> Self {
        SpilledKeys {
            filters: vec![Bloom::new(
                keys.max(FIRST_CAPACITY_KEYS),
                FIRST_FALSE_POSITIVE_RATE,
            )],
        }
    }

    /// Whether the key with hash `hash` may be on disk: `false` only for a
    /// key never [`Self::insert`]ed.
    #[inline]
    pub(crate) fn may_contain(&self, hash: u64) -> bool {
        let probe = Probe::of(hash);
        self.filters.iter().any(|filter| filter.contains(probe))
    }

    /// Records that the key with hash `hash` is on disk.
    pub(crate) fn insert(&mut self, hash: u64) {
        let probe = Probe::of(hash);
        // A key already answered "maybe" is left out: the answer cannot
        // change (bits are never cleared), and the filters then grow with
        // the distinct keys spilled, not with every eviction.
        let Some((last, older)) = self.filters.split_last_mut() else {
            self.push_filter().insert(probe);
            return;
        };
        if older.iter().any(|filter| filter.contains(probe)) {
            return;
        }
        if last.len < last.capacity {
            last.insert(probe);
            return;
        }
        if !last.contains(probe) {
            self.push_filter().insert(probe);
        }
    }

    /// Adds the next filter of the series and returns it: each holds twice
    /// the one before (the first holds [`FIRST_CAPACITY_KEYS`], or a
    /// restore's keys) at half its rate.
    fn push_filter(&mut self) -> &mut Bloom {
        let level = self.filters.len() as i32;
        let capacity = self
            .filters
            .last()
            .map_or(FIRST_CAPACITY_KEYS, |last| last.capacity.saturating_mul(2));
        let rate = FIRST_FALSE_POSITIVE_RATE * 0.5f64.powi(level);
        self.filters.push(Bloom::new(capacity, rate));
        self.filters.last_mut().expect("a filter was just pushed")
    }

    /// Records every hash of `hashes`, as [`Self::insert`] each, asking for
    /// each one's blocks [`INSERT_AHEAD`] hashes ahead: a restore notes
    /// millions of keys, and one at a time each waited on its block's
    /// cache miss (a third of a restore's CPU at 10 M keys: BENCHMARKS.md at 07a44e5,
    /// "Restoring the spilling backend").
    pub(crate) fn insert_all(&mut self, hashes: &[u64]) {
        for (index, hash) in hashes.iter().enumerate() {
            if let Some(ahead) = hashes.get(index + INSERT_AHEAD) {
                self.prefetch(*ahead);
            }
            self.insert(*hash);
        }
    }

    /// Asks for the blocks of `hash` in every filter; nothing is read.
    fn prefetch(&self, hash: u64) {
        let probe = Probe::of(hash);
        for filter in &self.filters {
            prefetch_line(filter.blocks[filter.block_of(probe)].as_ptr().cast());
        }
    }

    /// The bytes the filters' bits take.
    #[cfg(test)]
    pub(crate) fn memory_bytes(&self) -> usize {
        self.filters
            .iter()
            .map(|filter| filter.blocks.len() * 64)
            .sum()
    }

    /// How many distinct keys were recorded (up to false positives, which
    /// are not counted).
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        self.filters.iter().map(|filter| filter.len).sum()
    }
}

/// Two independent 64-bit hashes of a key hash, from which each filter
/// derives its bit positions (Kirsch and Mitzenmacher's double hashing).
#[derive(Debug, Clone, Copy)]
struct Probe {
    first: u64,
    step: u64,
}

impl Probe {
    fn of(hash: u64) -> Self {
        // The key hash's low bits already chose the key group (every key
        // here shares them in part), so it is mixed again before use.
        Probe {
            first: mix(hash),
            step: mix(hash ^ 0x9e37_79b9_7f4a_7c15) | 1,
        }
    }
}

/// The finaliser of splitmix64: every input bit affects every output bit.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The bits of one block: a cache line.
const BLOCK_BITS: u64 = 512;

/// How many bits a blocked filter holds per bit an unblocked one of the
/// same rate would: measured by the test below, the series' rate at
/// 600,000 keys was 1.2 % with as many bits, 0.74 % with a tenth more
/// (and 0.88 % expected of the unblocked filters it replaced).
const BLOCKED_EXTRA_BITS: f64 = 1.1;

/// One Bloom filter of a fixed capacity, blocked: a key's bits all lie in
/// one 512-bit block (a cache line), chosen by its first hash.
///
/// # Why blocked
///
/// A key's bits spread over the whole filter cost a cache miss each (8 to
/// 14 per key here, and one 64-bit division each to place them): at a
/// restore of 5 M keys per subtask, noting them in the filter took
/// about 45 % of the restore's CPU (BENCHMARKS.md at 07a44e5, "Restoring the
/// spilling backend"), and every lookup of a key not in memory asks every
/// filter. In one block a key costs one miss per filter. The price is a
/// somewhat higher false-positive rate for the same bits (blocks hold
/// unequal numbers of keys), which the tests bound.
#[derive(Debug, Clone)]
struct Bloom {
    blocks: Vec<[u64; 8]>,
    hashes: u32,
    capacity: u64,
    len: u64,
}

impl Bloom {
    /// A filter for `capacity` keys at false-positive rate `rate` (as an
    /// unblocked filter of the same bits would have).
    fn new(capacity: u64, rate: f64) -> Self {
        let ln2 = std::f64::consts::LN_2;
        let bits_per_key = -rate.ln() / (ln2 * ln2);
        let bit_count = (capacity as f64 * bits_per_key * BLOCKED_EXTRA_BITS).ceil() as u64;
        let blocks = bit_count.div_ceil(BLOCK_BITS).max(1);
        let hashes = ((bits_per_key * ln2).round() as u32).clamp(1, MAX_HASHES);
        Bloom {
            blocks: vec![[0; 8]; blocks as usize],
            hashes,
            capacity,
            len: 0,
        }
    }

    /// The block of `probe`: its first hash scaled to the block count (a
    /// multiply and a shift, not a division).
    fn block_of(&self, probe: Probe) -> usize {
        ((u128::from(probe.first) * self.blocks.len() as u128) >> 64) as usize
    }

    /// The bit positions of `probe` in its block: nine bits each, seven
    /// from each 64-bit hash in the series `probe.step`, `mix(step)`, ...
    /// (positions may repeat, as in any Bloom filter). Double hashing in
    /// a block of 512 bits gives too few distinct patterns: measured, the
    /// false-positive rate went up by half.
    fn positions(probe: Probe, hashes: u32) -> impl Iterator<Item = u64> {
        let mut word = probe.step;
        (0..hashes).map(move |i| {
            if i > 0 && i % 7 == 0 {
                word = mix(word);
            }
            (word >> (9 * (i % 7))) % BLOCK_BITS
        })
    }

    fn contains(&self, probe: Probe) -> bool {
        let block = &self.blocks[self.block_of(probe)];
        Self::positions(probe, self.hashes)
            .all(|bit| block[(bit / 64) as usize] & (1u64 << (bit % 64)) != 0)
    }

    /// Inserts `probe` and counts it unless [`Self::contains`] already
    /// said yes for it (setting bits that are all set changes nothing):
    /// the check and the insert in one pass over the positions, since a
    /// restore notes millions of keys here.
    fn insert(&mut self, probe: Probe) {
        let index = self.block_of(probe);
        let block = &mut self.blocks[index];
        let mut absent = false;
        for bit in Self::positions(probe, self.hashes) {
            let (word, mask) = (&mut block[(bit / 64) as usize], 1u64 << (bit % 64));
            absent |= *word & mask == 0;
            *word |= mask;
        }
        self.len += u64::from(absent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyed::key_hash;

    /// The seed of the randomised keys: `SNAPFLOW_SEED` or a fixed one.
    fn seed() -> u64 {
        std::env::var("SNAPFLOW_SEED")
            .ok()
            .and_then(|seed| seed.parse().ok())
            .unwrap_or(0x5eed_f11e)
    }

    #[test]
    fn never_a_false_negative_across_growth_and_a_bounded_false_positive_rate() {
        let seed = seed();
        let keys = 600_000u64;
        let mut filter = SpilledKeys::default();
        for i in 0..keys {
            filter.insert(key_hash(&(seed.wrapping_add(i))));
        }
        // Several filters were added as it grew.
        assert!(
            filter.filters.len() >= 3,
            "seed {seed}: {:?}",
            filter.filters.len()
        );
        for i in 0..keys {
            assert!(
                filter.may_contain(key_hash(&(seed.wrapping_add(i)))),
                "seed {seed}: key {i} was inserted but the filter says it is not"
            );
        }
        let probes = 200_000u64;
        let false_positives = (keys..keys + probes)
            .filter(|i| filter.may_contain(key_hash(&(seed.wrapping_add(*i)))))
            .count();
        let rate = false_positives as f64 / probes as f64;
        assert!(rate < 0.015, "seed {seed}: false-positive rate {rate}");
        // About 3 bytes per key at this size (11 bits plus 1.44 per level,
        // and the newest filter is less than a third full).
        let per_key = filter.memory_bytes() as f64 / filter.len() as f64;
        assert!(per_key < 3.5, "seed {seed}: {per_key} bytes per key");
    }

    #[test]
    fn a_filter_sized_for_a_restore_holds_its_keys_in_one_filter() {
        let seed = seed();
        let keys = 300_000u64;
        let mut filter = SpilledKeys::with_capacity(keys);
        let hashes: Vec<u64> = (0..keys).map(|i| key_hash(&seed.wrapping_add(i))).collect();
        filter.insert_all(&hashes);
        assert_eq!(filter.filters.len(), 1, "seed {seed}");
        // A key the filter already answers "maybe" for is not counted.
        assert!(filter.len() <= keys && filter.len() > keys * 99 / 100);
        for (i, hash) in hashes.iter().enumerate() {
            assert!(filter.may_contain(*hash), "seed {seed}: key {i} missing");
        }
        let probes = 100_000u64;
        let false_positives = (keys..keys + probes)
            .filter(|i| filter.may_contain(key_hash(&seed.wrapping_add(*i))))
            .count();
        let rate = false_positives as f64 / probes as f64;
        assert!(rate < 0.01, "seed {seed}: false-positive rate {rate}");
    }

    #[test]
    fn an_empty_filter_says_no_and_a_repeated_key_is_counted_once() {
        let mut filter = SpilledKeys::default();
        assert!(!filter.may_contain(key_hash(&7u64)));
        assert_eq!(filter.memory_bytes(), 0);
        for _ in 0..10 {
            filter.insert(key_hash(&7u64));
        }
        assert!(filter.may_contain(key_hash(&7u64)));
        assert_eq!(filter.len(), 1);
    }
}
