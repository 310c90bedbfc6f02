//! The order of the spilling backend's disk keys (byte-wise, as fjall,
//! the bases and the runs keep them), compared through an 8-byte prefix
//! first.
//!
//! This module owns [`key_prefix`], why comparing prefixes first is the
//! byte order ([`compare_keys`]), and [`Prefixed`], an item carrying its key's prefix so
//! that a sort compares most pairs without reading their keys. It never
//! encodes a key (`hot.rs` does).
//!
//! # Why a prefix
//!
//! The checkpoint writer sorts each delta's hot entries and the change
//! log by key. Sorting by slices calls `memcmp` per comparison, which
//! was the writer's largest symbol at 10 M keys (BENCHMARKS.md at 07a44e5). A key of
//! a keyed count (a `u64` in postcard) is at most 10 bytes, so its first
//! 8 bytes as a big-endian number decide nearly every comparison with
//! one integer compare.
//!
//! # Why the prefix is kept beside the item
//!
//! Computing the prefix inside the comparison still reads both keys from
//! the buffer that holds them, at scattered places: a sort of a hundred
//! thousand entries then waits on a cache miss or two per comparison,
//! and the sorts were again about 40 % of the writer's CPU at 10 M keys
//! (BENCHMARKS.md at 07a44e5, "Sorting by kept prefixes"). A [`Prefixed`] item is computed once per key, in
//! the order the keys were written, and the sort moves the prefixes with
//! the items, so it reads a key only when two prefixes tie.

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
    if let Some(first) = bytes.first_chunk::<8>() {
        return u64::from_be_bytes(*first);
    }
    // Byte by byte rather than a copy of a variable length, which is a
    // `memcpy` call: the merges take a prefix per entry they compare.
    bytes.iter().enumerate().fold(0, |word, (index, byte)| {
        word | u64::from(*byte) << (56 - 8 * index)
    })
}

/// `a` against `b` in byte order, through their prefixes first: for the
/// overlay of a snapshot's hot entries on its disk entries, which
/// compares each disk entry's key with the next hot one's (a `memcmp`
/// call or two each before: BENCHMARKS.md at 07a44e5, "Sorting by kept prefixes").
/// Not for the merge of a base's inputs: it compares the smallest key so
/// far with each input's, and recomputing that key's prefix per input
/// cost more than the `memcmp` calls it saved.
#[inline]
pub(crate) fn compare_keys(a: &[u8], b: &[u8]) -> Ordering {
    key_prefix(a).cmp(&key_prefix(b)).then_with(|| a.cmp(b))
}

/// An item (where a key is, in a buffer the caller holds) with its key's
/// [`key_prefix`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prefixed<T> {
    prefix: u64,
    /// The item, as the caller made it.
    pub(crate) item: T,
}

impl<T> Prefixed<T> {
    /// `item`, whose key is `key`.
    #[inline]
    pub(crate) fn new(key: &[u8], item: T) -> Self {
        Prefixed {
            prefix: key_prefix(key),
            item,
        }
    }

    /// Whether this item's key may equal `other`'s: false means the keys
    /// differ, true that the caller must compare them.
    #[inline]
    pub(crate) fn may_equal(&self, other: &Self) -> bool {
        self.prefix == other.prefix
    }

    /// This item's key against `other`'s in byte order, `key` giving each
    /// item's key, read only when the prefixes tie.
    #[inline]
    pub(crate) fn cmp_by<'k>(&self, other: &Self, key: impl Fn(&T) -> &'k [u8]) -> Ordering {
        self.prefix
            .cmp(&other.prefix)
            .then_with(|| key(&self.item).cmp(key(&other.item)))
    }
}

/// Sorts `items` ascending by their keys in byte order (`key` gives an
/// item's key; it must be the key the item was made with), then by
/// `tie` among items of one key. Unstable, so a total order needs `tie`
/// to tell apart every two items of one key.
pub(crate) fn sort_prefixed<'k, T>(
    items: &mut [Prefixed<T>],
    key: impl Fn(&T) -> &'k [u8],
    tie: impl Fn(&T, &T) -> Ordering,
) {
    items.sort_unstable_by(|a, b| a.cmp_by(b, &key).then_with(|| tie(&a.item, &b.item)));
}

/// Sorts `items` by their keys in byte order, stably: items of equal keys
/// keep the order they had. A restore sorts a key group's chain this way
/// (a delta's entry comes after the older ones of its key), and a stable
/// sort also finds runs that are sorted already (a spilling snapshot's
/// base and each of its deltas) and merges them, where the unstable one
/// sorts everything again.
pub(crate) fn sort_prefixed_stable<'k, T>(items: &mut [Prefixed<T>], key: impl Fn(&T) -> &'k [u8]) {
    items.sort_by(|a, b| a.cmp_by(b, &key));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyed::test_support::{seed, with_seed, Rng};

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
            let mut padded = [0; 8];
            let length = a.len().min(8);
            padded[..length].copy_from_slice(&a[..length]);
            assert_eq!(
                key_prefix(&a),
                u64::from_be_bytes(padded),
                "seed {seed}: {a:?}"
            );
            let (pa, pb) = (Prefixed::new(&a, ()), Prefixed::new(&b, ()));
            if a == b {
                assert!(pa.may_equal(&pb), "seed {seed}: {a:?}");
            }
        }
    }

    /// Sorts random keys (with repeats) by [`sort_prefixed`], ties by
    /// their index, and checks the order against a plain sort of the
    /// `(key, index)` pairs.
    fn check_sort(seed: u64) {
        let mut rng = Rng(seed);
        let count = rng.below(2_000) as usize;
        let keys: Vec<Vec<u8>> = (0..count).map(|_| random_key(&mut rng)).collect();
        let mut items: Vec<Prefixed<usize>> = keys
            .iter()
            .enumerate()
            .map(|(index, key)| Prefixed::new(key, index))
            .collect();
        sort_prefixed(&mut items, |index| &keys[*index], |a, b| a.cmp(b));
        let mut want: Vec<(&[u8], usize)> = keys
            .iter()
            .enumerate()
            .map(|(index, key)| (key.as_slice(), index))
            .collect();
        want.sort();
        let got: Vec<(&[u8], usize)> = items
            .iter()
            .map(|item| (keys[item.item].as_slice(), item.item))
            .collect();
        assert_eq!(got, want);
        // Stably, equal keys keep their first order, which is the index's.
        let mut stable: Vec<Prefixed<usize>> = keys
            .iter()
            .enumerate()
            .map(|(index, key)| Prefixed::new(key, index))
            .collect();
        sort_prefixed_stable(&mut stable, |index| &keys[*index]);
        let got: Vec<(&[u8], usize)> = stable
            .iter()
            .map(|item| (keys[item.item].as_slice(), item.item))
            .collect();
        assert_eq!(got, want, "stable");
    }

    #[test]
    fn a_prefixed_sort_is_byte_order_then_the_tie_break() {
        with_seed("a_prefixed_sort_is_byte_order_then_the_tie_break", |seed| {
            for round in 0..20 {
                check_sort(seed.wrapping_add(round));
            }
        });
    }
}
