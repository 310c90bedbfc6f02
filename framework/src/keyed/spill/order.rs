//! The order of the spilling backend's disk keys (byte-wise, as fjall,
//! the bases and the runs keep them), compared through an 8-byte prefix
//! first.
//!
//! This module owns [`key_prefix`] and why comparing prefixes first is
//! the byte order. It never encodes a key (`hot.rs` does).
//!
//! # Why a prefix
//!
//! The checkpoint writer sorts each delta's hot entries and the change
//! log by key. Sorting by slices calls `memcmp` per comparison, which
//! was the writer's largest symbol at 10 M keys (BENCHMARKS.md). A key of
//! a keyed count (a `u64` in postcard) is at most 10 bytes, so its first
//! 8 bytes as a big-endian number decide nearly every comparison with
//! one integer compare.

use std::cmp::Ordering;

/// The first 8 bytes of `bytes` as a big-endian number, zero-padded when
/// it is shorter.
///
/// **Invariant:** `key_prefix(a) < key_prefix(b)` implies `a < b` (byte
/// order), so comparing prefixes first and the bytes only on a tie is
/// byte order. The prefixes differ first at some byte i < 8: there `a`
/// holds a smaller byte than `b`, or `a` has ended (padding 0) while `b`
/// holds a byte above 0, and both mean `a < b`.
#[inline]
fn key_prefix(bytes: &[u8]) -> u64 {
    let mut word = [0; 8];
    let length = bytes.len().min(8);
    word[..length].copy_from_slice(&bytes[..length]);
    u64::from_be_bytes(word)
}

/// `a` against `b` in byte order, through their prefixes first.
#[inline]
pub(crate) fn compare_keys(a: &[u8], b: &[u8]) -> Ordering {
    key_prefix(a).cmp(&key_prefix(b)).then_with(|| a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyed::test_support::{seed, Rng};

    /// Random byte strings of 0 to 12 bytes over a small alphabet (0, 1
    /// and 255), so that prefixes of each other, ties past 8 bytes and
    /// padding-like zeros are all common.
    fn random_key(rng: &mut Rng) -> Vec<u8> {
        let length = rng.below(13) as usize;
        (0..length)
            .map(|_| [0, 1, 255][rng.below(3) as usize])
            .collect()
    }

    #[test]
    fn comparing_prefixes_first_is_byte_order() {
        let seed = seed();
        let mut rng = Rng(seed);
        for _ in 0..20_000 {
            let (a, b) = (random_key(&mut rng), random_key(&mut rng));
            assert_eq!(compare_keys(&a, &b), a.cmp(&b), "seed {seed}: {a:?} {b:?}");
            if key_prefix(&a) < key_prefix(&b) {
                assert!(a < b, "seed {seed}: {a:?} {b:?}");
            }
        }
    }
}
