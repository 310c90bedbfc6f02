//! The stable key hash: the same value for the same key in every process,
//! run and build of one target, so that a checkpoint written by one process
//! routes keys to the same key groups in the process that restores it.
//!
//! This module owns [`StableHasher`] and [`key_hash`]. It never uses a
//! random seed (std's `RandomState` would give every process different key
//! groups) and never depends on another crate's hasher, whose output could
//! change with a version bump and silently move keys between key groups.
//!
//! # The function
//!
//! An FxHash-style word mixer with a fixed seed, plus a folded-multiply
//! finaliser. Each 64-bit word `w` fed in updates the state as
//! `state = (state.rotate_left(5) ^ w) * MULTIPLY` (FxHash's step, the
//! constant is the golden-ratio odd number). `finish` returns the high and
//! low halves of the 128-bit product `state * FINISH` xor-ed together, so
//! every output bit depends on every input bit; plain FxHash leaves the low
//! bits of the hash of an integer depending only on the integer's low bits.
//! A `u64` key costs two multiplications.
//!
//! Integers are fed as one word each; byte strings are fed eight bytes at a
//! time, little-endian, with the tail zero-padded and its length in the top
//! byte; `usize` is widened to `u64` and `u128` is fed as two words, so
//! 32- and 64-bit targets agree.
//!
//! # Known limits
//!
//! The hash is computed over what the key's [`std::hash::Hash`]
//! implementation feeds the hasher. For integers, strings, tuples and
//! derived structs that has been the same for years, but std documents it
//! as not guaranteed across compiler versions, and slices of integers feed
//! their bytes in native byte order (so big-endian targets differ). A change
//! there would move keys to other key groups; restore detects it (each key
//! is rehashed and must land in the key group it was stored under) and
//! fails with [`super::KeyedError::KeyGroupMismatch`] rather than silently
//! splitting a key's state. A hash over the key's serde encoding would not
//! have this limit; it is not built.

use std::hash::{BuildHasher, Hash, Hasher};

/// The hasher's initial state: the first 64 bits of the fraction of pi.
const SEED: u64 = 0x243f_6a88_85a3_08d3;
/// The per-word multiplier: 2^64 divided by the golden ratio, made odd.
const MULTIPLY: u64 = 0x9e37_79b9_7f4a_7c15;
/// The finaliser's multiplier (from the SplitMix64 finaliser).
const FINISH: u64 = 0xbf58_476d_1ce4_e5b9;

/// A fast, deterministic 64-bit hasher with a fixed seed. See the module
/// docs for the exact function; tests pin its output for known keys.
#[derive(Debug, Clone, Copy)]
pub struct StableHasher {
    state: u64,
}

impl StableHasher {
    /// A hasher in its fixed initial state.
    #[inline]
    pub fn new() -> Self {
        StableHasher { state: SEED }
    }

    #[inline]
    fn add_word(&mut self, word: u64) {
        self.state = (self.state.rotate_left(5) ^ word).wrapping_mul(MULTIPLY);
    }
}

impl Default for StableHasher {
    fn default() -> Self {
        StableHasher::new()
    }
}

impl Hasher for StableHasher {
    #[inline]
    fn finish(&self) -> u64 {
        let product = u128::from(self.state) * u128::from(FINISH);
        (product as u64) ^ ((product >> 64) as u64)
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add_word(u64::from_le_bytes(word));
        }
        let tail = chunks.remainder();
        if !tail.is_empty() {
            let mut word = [0u8; 8];
            word[..tail.len()].copy_from_slice(tail);
            // The tail is at most 7 bytes, so the top byte is free for its
            // length; "a" and "a\0" then differ even without a terminator.
            word[7] = tail.len() as u8;
            self.add_word(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u8(&mut self, value: u8) {
        self.add_word(u64::from(value));
    }

    #[inline]
    fn write_u16(&mut self, value: u16) {
        self.add_word(u64::from(value));
    }

    #[inline]
    fn write_u32(&mut self, value: u32) {
        self.add_word(u64::from(value));
    }

    #[inline]
    fn write_u64(&mut self, value: u64) {
        self.add_word(value);
    }

    #[inline]
    fn write_u128(&mut self, value: u128) {
        self.add_word(value as u64);
        self.add_word((value >> 64) as u64);
    }

    #[inline]
    fn write_usize(&mut self, value: usize) {
        self.add_word(value as u64);
    }

    // The signed writes default to the unsigned ones of the same width,
    // which is what we want: two's complement bits, widened per the above.
}

/// A [`BuildHasher`] for [`StableHasher`], for std and hashbrown maps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BuildStableHasher;

impl BuildHasher for BuildStableHasher {
    type Hasher = StableHasher;

    #[inline]
    fn build_hasher(&self) -> StableHasher {
        StableHasher::new()
    }
}

/// The stable hash of a key: what partitioners route by and what keyed
/// state groups by. Equal keys have equal hashes in every process.
#[inline]
pub fn key_hash<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut hasher = StableHasher::new();
    key.hash(&mut hasher);
    hasher.finish()
}
