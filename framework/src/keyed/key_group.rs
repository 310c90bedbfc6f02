//! Key groups: the unit in which keyed state is split, routed and rescaled.
//!
//! This module owns the arithmetic that maps a key hash to a key group and a
//! key group to a subtask. It never stores state and never hashes keys
//! itself (see [`super::hash`]).
//!
//! As in Apache Flink, a job has a fixed number of key groups, its *max
//! parallelism*, chosen when the job is first created and stored in every
//! checkpoint's metadata. Each subtask of a keyed operator owns one
//! contiguous [`KeyGroupRange`]. Because the key-to-group mapping never
//! depends on the parallelism, a snapshot taken at parallelism 2 can be
//! restored at parallelism 3: every new subtask takes the key groups of its
//! new range, wherever they were written.
//!
//! The range and subtask formulas are Flink's
//! (`KeyGroupRangeAssignment.computeKeyGroupRangeForOperatorIndex` and
//! `computeOperatorIndexForKeyGroup`), with one difference in
//! representation: [`KeyGroupRange::end`] is exclusive here, inclusive in
//! Flink. The key-to-group step is our own (see [`MaxParallelism::key_group_of`]),
//! because our key hash is not Java's `hashCode`.

use std::fmt;

/// The number of key groups when the user does not choose one.
pub const DEFAULT_MAX_PARALLELISM: u32 = 128;

/// The largest accepted max parallelism (Flink's limit, `1 << 15`).
pub const UPPER_BOUND_MAX_PARALLELISM: u32 = 1 << 15;

/// An invalid max parallelism, parallelism, subtask index or key group.
///
/// These are configuration errors: the same inputs fail again, so none is
/// retryable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyGroupError {
    /// The max parallelism is 0 or above [`UPPER_BOUND_MAX_PARALLELISM`].
    #[error(
        "max parallelism {max_parallelism} is out of range; it must be between 1 and \
         {UPPER_BOUND_MAX_PARALLELISM}"
    )]
    InvalidMaxParallelism {
        /// The value given.
        max_parallelism: u32,
    },
    /// The parallelism is 0.
    #[error("parallelism must be at least 1")]
    ZeroParallelism,
    /// The parallelism exceeds the max parallelism, so some subtask would own
    /// no key group.
    #[error(
        "parallelism {parallelism} exceeds the max parallelism {max_parallelism}; a keyed \
         operator cannot have more subtasks than key groups"
    )]
    ParallelismAboveMax {
        /// The parallelism given.
        parallelism: u32,
        /// The job's max parallelism.
        max_parallelism: u32,
    },
    /// The subtask index is not below the parallelism.
    #[error("subtask index {subtask} is out of range for parallelism {parallelism}")]
    SubtaskOutOfRange {
        /// The subtask index given.
        subtask: u32,
        /// The parallelism.
        parallelism: u32,
    },
    /// The key group is not below the max parallelism.
    #[error("key group {key_group} is out of range for max parallelism {max_parallelism}")]
    KeyGroupOutOfRange {
        /// The key group given.
        key_group: u32,
        /// The job's max parallelism.
        max_parallelism: u32,
    },
    /// A key group range is empty, reversed, or reaches past the max
    /// parallelism.
    #[error("key group range {range} is not a non-empty range within 0..{max_parallelism}")]
    InvalidRange {
        /// The range given.
        range: KeyGroupRange,
        /// The job's max parallelism.
        max_parallelism: u32,
    },
}

impl KeyGroupError {
    /// Whether trying again with the same input could succeed: never.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

/// The odd constant [`MaxParallelism::key_group_of`] multiplies a hash by.
const GROUP_MIX: u64 = 0xd6e8_feb8_6659_fd93;

/// [`MaxParallelism::key_group_of`] with its scaling chosen once, for the
/// keyed state's per-record lookup, where the group's table is found from
/// the group: the group is on that lookup's critical path.
///
/// For a power-of-two max parallelism `2^k` (the default 128 is one) the
/// multiply-shift scaling of the upper 32 bits is exactly a shift of the
/// mixed hash by `64 - k`, which saves a dependent multiply per record;
/// other values take the general formula. Both give the same group
/// (a unit test compares them at every max parallelism).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyGroupOf {
    max_parallelism: MaxParallelism,
    /// `64 - k - SLICE_BITS` when the max parallelism is `2^k` with
    /// `k >= 1` (at least 64 - 15 - 6, so never 0); 0 otherwise. Worked
    /// out once, so that a lookup shifts by it without a subtraction.
    slot_shift: u32,
}

/// log2 of the number of slices each key group of the in-memory keyed
/// state is split into (`SLICES_PER_KEY_GROUP`, see
/// [`super::cow_state`]'s "Slices"): the bits of the mixed hash right
/// below the key group's.
pub(crate) const SLICE_BITS: u32 = 6;

/// How many slices (copy-on-write tables, each with a dirty flag) each key
/// group of a [`CowKeyedState`](super::CowKeyedState) is split into; see
/// `keyed::cow_state`'s "Slices".
pub const SLICES_PER_KEY_GROUP: usize = 1 << SLICE_BITS;

impl KeyGroupOf {
    /// The lookup for `max_parallelism`.
    pub(crate) fn new(max_parallelism: MaxParallelism) -> Self {
        let max = max_parallelism.get();
        let slot_shift = if max > 1 && max.is_power_of_two() {
            64 - max.trailing_zeros() - SLICE_BITS
        } else {
            0
        };
        KeyGroupOf {
            max_parallelism,
            slot_shift,
        }
    }

    /// The key group of `key_hash`: what [`MaxParallelism::key_group_of`]
    /// gives. The state finds its tables with [`Self::key_group_slice_of`];
    /// this is the reference its test compares with.
    #[cfg(test)]
    pub(crate) fn key_group_of(self, key_hash: u64) -> u32 {
        let mixed = key_hash.wrapping_mul(GROUP_MIX);
        if self.slot_shift != 0 {
            (mixed >> (self.slot_shift + SLICE_BITS)) as u32
        } else {
            (((mixed >> 32) * u64::from(self.max_parallelism.get())) >> 32) as u32
        }
    }

    /// The key group of `key_hash` followed by the [`SLICE_BITS`] bits
    /// that come right after the group's in the same mixed product:
    /// `key_group << SLICE_BITS | slice`, the key's slot. The in-memory
    /// keyed state splits each group into slices by these bits, so one
    /// shift gives both (the same cost as [`Self::key_group_of`]). They
    /// are not the bits hashbrown uses inside a table (the low bits of the
    /// hash for the bucket, the top 7 for the tag), so each slice's table
    /// stays evenly spread.
    #[inline(always)]
    pub(crate) fn key_group_slice_of(self, key_hash: u64) -> u32 {
        let mixed = key_hash.wrapping_mul(GROUP_MIX);
        if self.slot_shift != 0 {
            (mixed >> self.slot_shift) as u32
        } else {
            // `(mixed >> 32) * max` is below 2^47: the group is its bits
            // from 32 up, the slice the `SLICE_BITS` below them.
            (((mixed >> 32) * u64::from(self.max_parallelism.get())) >> (32 - SLICE_BITS)) as u32
        }
    }

    /// The index of `key_hash`'s slot ([`Self::key_group_slice_of`])
    /// counted from `first_slot`, the slot of the first slice of a state's
    /// first key group: what the in-memory layouts index their per-slice
    /// arrays by, one shift and one subtraction at a power-of-two max
    /// parallelism. A key of a group before the range wraps to a huge
    /// index, so one comparison with an array's length checks both ends
    /// of the range ([`Self::locate_slot`]).
    #[inline(always)]
    pub(crate) fn slot_index(self, key_hash: u64, first_slot: u32) -> usize {
        self.key_group_slice_of(key_hash).wrapping_sub(first_slot) as usize
    }

    /// [`Self::slot_index`] checked against the `slots` slots a state
    /// has: the index, or the key group of a key the state does not own
    /// (a bare `u32`, so that the hot path carries no large error value).
    #[inline(always)]
    pub(crate) fn locate_slot(
        self,
        key_hash: u64,
        first_slot: u32,
        slots: usize,
    ) -> Result<usize, u32> {
        let slot = self.key_group_slice_of(key_hash);
        let index = slot.wrapping_sub(first_slot) as usize;
        if index < slots {
            Ok(index)
        } else {
            Err(slot >> SLICE_BITS)
        }
    }
}

/// A validated max parallelism: the number of key groups of a job, between 1
/// and [`UPPER_BOUND_MAX_PARALLELISM`].
///
/// It deserializes through the same validation, so checkpoint metadata with
/// an out-of-range value is rejected when read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct MaxParallelism(u32);

impl MaxParallelism {
    /// Validates `max_parallelism`.
    pub fn new(max_parallelism: u32) -> Result<Self, KeyGroupError> {
        if max_parallelism == 0 || max_parallelism > UPPER_BOUND_MAX_PARALLELISM {
            return Err(KeyGroupError::InvalidMaxParallelism { max_parallelism });
        }
        Ok(MaxParallelism(max_parallelism))
    }

    /// The number of key groups.
    pub fn get(self) -> u32 {
        self.0
    }

    /// The key group of a key hash, in `0..self.get()`.
    ///
    /// The hash is multiplied by a fixed odd constant and the upper 32 bits
    /// of the product are scaled onto `0..max_parallelism` with a
    /// multiply-shift (Lemire's "fast range"), which needs no division. The
    /// extra multiply makes the group depend on every bit of the hash, so it
    /// is not correlated with the bits the in-memory hash tables use (the low
    /// bits for the bucket, the top seven for the tag); without it, all keys
    /// of one group would share a tag and every lookup would compare keys
    /// needlessly. This formula is part of the checkpoint format: changing it
    /// moves keys between groups, and restore rejects such checkpoints.
    #[inline]
    pub fn key_group_of(self, key_hash: u64) -> u32 {
        let mixed = key_hash.wrapping_mul(GROUP_MIX) >> 32;
        ((mixed * u64::from(self.0)) >> 32) as u32
    }

    /// The key groups owned by `subtask` of `parallelism` subtasks.
    pub fn range_for_subtask(
        self,
        parallelism: u32,
        subtask: u32,
    ) -> Result<KeyGroupRange, KeyGroupError> {
        self.check_parallelism(parallelism)?;
        if subtask >= parallelism {
            return Err(KeyGroupError::SubtaskOutOfRange {
                subtask,
                parallelism,
            });
        }
        let (max, parallelism, subtask) = (
            u64::from(self.0),
            u64::from(parallelism),
            u64::from(subtask),
        );
        // Flink: start = ceil(subtask * max / parallelism) and inclusive
        // end = ((subtask + 1) * max - 1) / parallelism; our end is one past.
        // Both fit in u32 because they are at most `max`.
        let start = (subtask * max).div_ceil(parallelism);
        let end = ((subtask + 1) * max - 1) / parallelism + 1;
        Ok(KeyGroupRange {
            start: start as u32,
            end: end as u32,
        })
    }

    /// The subtask of `parallelism` subtasks that owns `key_group`.
    pub fn subtask_for_key_group(
        self,
        parallelism: u32,
        key_group: u32,
    ) -> Result<u32, KeyGroupError> {
        self.check_parallelism(parallelism)?;
        self.check_key_group(key_group)?;
        // Flink: keyGroupId * parallelism / maxParallelism; below parallelism
        // because key_group < max.
        Ok((u64::from(key_group) * u64::from(parallelism) / u64::from(self.0)) as u32)
    }

    /// For every key group in order, the subtask of `parallelism` subtasks
    /// that owns it: [`Self::subtask_for_key_group`] precomputed, so that a
    /// partitioner routes a record with one table load instead of a 64-bit
    /// division (which the profile of the keyed count showed at about 6% of
    /// all cycles). The table has [`Self::get`] entries, at most
    /// [`UPPER_BOUND_MAX_PARALLELISM`] (128 KiB).
    pub fn subtask_table(self, parallelism: u32) -> Result<Vec<u32>, KeyGroupError> {
        self.check_parallelism(parallelism)?;
        (0..self.0)
            .map(|key_group| self.subtask_for_key_group(parallelism, key_group))
            .collect()
    }

    /// Checks that a range is non-empty and lies within `0..self.get()`.
    pub fn check_range(self, range: KeyGroupRange) -> Result<(), KeyGroupError> {
        if range.start >= range.end || range.end > self.0 {
            return Err(KeyGroupError::InvalidRange {
                range,
                max_parallelism: self.0,
            });
        }
        Ok(())
    }

    /// Checks that `key_group` is below the max parallelism.
    pub fn check_key_group(self, key_group: u32) -> Result<(), KeyGroupError> {
        if key_group >= self.0 {
            return Err(KeyGroupError::KeyGroupOutOfRange {
                key_group,
                max_parallelism: self.0,
            });
        }
        Ok(())
    }

    fn check_parallelism(self, parallelism: u32) -> Result<(), KeyGroupError> {
        if parallelism == 0 {
            return Err(KeyGroupError::ZeroParallelism);
        }
        if parallelism > self.0 {
            return Err(KeyGroupError::ParallelismAboveMax {
                parallelism,
                max_parallelism: self.0,
            });
        }
        Ok(())
    }
}

impl Default for MaxParallelism {
    fn default() -> Self {
        MaxParallelism(DEFAULT_MAX_PARALLELISM)
    }
}

impl TryFrom<u32> for MaxParallelism {
    type Error = KeyGroupError;

    fn try_from(value: u32) -> Result<Self, Self::Error> {
        MaxParallelism::new(value)
    }
}

impl From<MaxParallelism> for u32 {
    fn from(value: MaxParallelism) -> Self {
        value.0
    }
}

impl fmt::Display for MaxParallelism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A contiguous, half-open range of key groups `start..end` owned by one
/// subtask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct KeyGroupRange {
    /// The first key group in the range.
    pub start: u32,
    /// One past the last key group in the range.
    pub end: u32,
}

impl KeyGroupRange {
    /// The range `start..end`; not validated (see
    /// [`MaxParallelism::check_range`]).
    pub fn new(start: u32, end: u32) -> Self {
        KeyGroupRange { start, end }
    }

    /// Whether `key_group` is in the range.
    #[inline]
    pub fn contains(&self, key_group: u32) -> bool {
        self.start <= key_group && key_group < self.end
    }

    /// The number of key groups in the range (0 for an empty or reversed
    /// range).
    pub fn len(&self) -> usize {
        self.end.saturating_sub(self.start) as usize
    }

    /// Whether the range holds no key group.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key groups of the range in ascending order.
    pub fn iter(&self) -> std::ops::Range<u32> {
        self.start..self.end
    }
}

impl fmt::Display for KeyGroupRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.start, self.end)
    }
}

/// The key group of `key_hash` among `max_parallelism` groups; see
/// [`MaxParallelism::key_group_of`]. Validates `max_parallelism` on every
/// call; hot paths should hold a [`MaxParallelism`] instead.
pub fn key_group_of(key_hash: u64, max_parallelism: u32) -> Result<u32, KeyGroupError> {
    Ok(MaxParallelism::new(max_parallelism)?.key_group_of(key_hash))
}

/// The key groups owned by `subtask` (0-based) of `parallelism` subtasks;
/// see [`MaxParallelism::range_for_subtask`].
pub fn range_for_subtask(
    max_parallelism: u32,
    parallelism: u32,
    subtask: u32,
) -> Result<KeyGroupRange, KeyGroupError> {
    MaxParallelism::new(max_parallelism)?.range_for_subtask(parallelism, subtask)
}

/// The subtask of `parallelism` subtasks that owns `key_group`; see
/// [`MaxParallelism::subtask_for_key_group`].
pub fn subtask_for_key_group(
    max_parallelism: u32,
    parallelism: u32,
    key_group: u32,
) -> Result<u32, KeyGroupError> {
    MaxParallelism::new(max_parallelism)?.subtask_for_key_group(parallelism, key_group)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The precomputed lookup gives the formula's group at every max
    /// parallelism, power of two or not, for hashes spread over all bits.
    #[test]
    fn the_precomputed_key_group_equals_the_formula() {
        let mut hash = 0x1234_5678_9abc_def0u64;
        for max in 1..=UPPER_BOUND_MAX_PARALLELISM {
            let max_parallelism = MaxParallelism::new(max).unwrap();
            let fast = KeyGroupOf::new(max_parallelism);
            for _ in 0..64 {
                // splitmix64 steps: every bit of the hash varies.
                hash = hash.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = hash;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^= z >> 31;
                for probe in [z, 0, u64::MAX, z << 32, z >> 32] {
                    assert_eq!(
                        fast.key_group_of(probe),
                        max_parallelism.key_group_of(probe),
                        "max parallelism {max}, hash {probe:#x}"
                    );
                    assert_eq!(
                        fast.key_group_slice_of(probe) >> SLICE_BITS,
                        max_parallelism.key_group_of(probe),
                        "the slice's group, max parallelism {max}, hash {probe:#x}"
                    );
                }
            }
        }
    }

    /// The table agrees with the formula for every key group.
    fn check(max_parallelism: u32, parallelism: u32) {
        let max = MaxParallelism::new(max_parallelism).unwrap();
        let table = max.subtask_table(parallelism).unwrap();
        assert_eq!(table.len(), max_parallelism as usize);
        for (key_group, subtask) in table.iter().enumerate() {
            let want = max.subtask_for_key_group(parallelism, key_group as u32);
            assert_eq!(Ok(*subtask), want, "max {max_parallelism} p {parallelism}");
        }
    }

    #[test]
    fn subtask_table_matches_the_formula() {
        check(128, 1);
        check(128, 2);
        check(128, 3);
        check(7, 7);
        check(UPPER_BOUND_MAX_PARALLELISM, 5);
    }

    #[test]
    fn subtask_table_rejects_bad_parallelism() {
        let max = MaxParallelism::new(4).unwrap();
        assert_eq!(max.subtask_table(0), Err(KeyGroupError::ZeroParallelism));
        assert!(max.subtask_table(5).is_err());
    }
}
