//! Appending a value's postcard encoding to a buffer the caller already
//! holds, the way every snapshot writes its entries.
//!
//! This module owns one postcard [`Flavor`] and the function around it. It
//! never allocates beyond the buffer's own growth and never chooses a
//! format: the bytes are exactly postcard's, as [`postcard::to_allocvec`]
//! would write them.
//!
//! # Why not `postcard::to_extend`
//!
//! `to_extend` takes the buffer by value and pushes through the generic
//! `Extend<u8>` path, one byte iterator at a time. In a scratch program on
//! this machine (10 M entries of a `u64` key and a `u64` count, encoded
//! one key group's worth at a time, the way `keyed::part` does), it took
//! 55-82 ns per entry; this flavor took 8.5-9 ns, and a hand-written
//! varint loop 7-7.5 ns. A checkpoint of a large keyed state encodes every
//! changed entry on the checkpoint writer's thread, which shares the cores
//! with the operators, so this cost shows directly in the throughput with
//! checkpoints (BENCHMARKS.md, issue 16's table).

use postcard::ser_flavors::Flavor;
use serde::Serialize;

/// The longest slice appended byte by byte rather than copied at once: a
/// `u64` varint is at most 10 bytes, an `f64` 8.
const SHORT_SLICE_LEN: usize = 16;

/// A postcard output that appends to a borrowed `Vec<u8>`.
struct AppendTo<'a>(&'a mut Vec<u8>);

impl Flavor for AppendTo<'_> {
    type Output = ();

    #[inline(always)]
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    /// Short slices (a varint, a small integer) are pushed byte by byte:
    /// `extend_from_slice` calls `memmove` for any length, which cost
    /// about 2 of the 10.5 ns per entry that a plain `extend_from_slice`
    /// flavor took in the measurement above.
    #[inline(always)]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        if data.len() <= SHORT_SLICE_LEN {
            self.0.reserve(data.len());
            for &byte in data {
                self.0.push(byte);
            }
        } else {
            self.0.extend_from_slice(data);
        }
        Ok(())
    }

    #[inline(always)]
    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Appends `value`'s postcard encoding to `out`. On an error `out` may hold
/// a prefix of the encoding; every caller discards the whole buffer then.
#[inline]
pub(crate) fn append_postcard<T: Serialize + ?Sized>(
    value: &T,
    out: &mut Vec<u8>,
) -> postcard::Result<()> {
    postcard::serialize_with_flavor(value, AppendTo(out))
}

#[cfg(test)]
mod tests {
    use super::append_postcard;

    fn check<T: serde::Serialize + ?Sized>(value: &T) {
        let mut out = vec![0xAB];
        append_postcard(value, &mut out).expect("encodes");
        let mut want = vec![0xAB];
        want.extend_from_slice(&postcard::to_allocvec(value).expect("encodes"));
        assert_eq!(out, want);
    }

    #[test]
    fn appends_exactly_postcard_bytes() {
        check(&0_u64);
        check(&127_u64);
        check(&128_u64);
        check(&u64::MAX);
        check(&-1_i64);
        check("a string");
        check(&(7_u32, vec![1_u8, 2, 3], Some("x".to_string())));
        check(&[1.5_f64, -0.0]);
    }
}
