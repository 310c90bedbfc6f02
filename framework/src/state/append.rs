//! Appending a value's postcard encoding to a buffer the caller already
//! holds, the way every snapshot writes its entries.
//!
//! This module owns a serde [`Serializer`](serde::Serializer) that writes
//! exactly postcard's bytes, and the function around it. It never
//! allocates beyond the buffer's own growth and never chooses a format:
//! the bytes are postcard's, as [`postcard::to_allocvec`] would write them
//! (the tests compare the two on every serde shape, and on seeded random
//! integers).
//!
//! # Why not postcard's own serializer
//!
//! A checkpoint of a large keyed state encodes every changed entry on
//! threads that share the cores with the operators, so the cost per entry
//! shows directly in the throughput with checkpoints (BENCHMARKS.md at 07a44e5,
//! the tables of issue 16). `postcard::to_extend` pushes through the generic
//! `Extend<u8>` path, one byte iterator at a time: 55-82 ns per entry of a
//! `u64` key and a `u64` count in a scratch program on this machine.
//! postcard's serializer over a flavor that appends to a borrowed `Vec`
//! (this module's former form) took 9.6 ns per entry with the table in
//! cache, most of it in postcard's varint: it zeroes a 10-byte buffer,
//! loops with a branch per byte (mispredicted when the lengths vary, as
//! random keys' do), then copies the used bytes. Here a varint of up to
//! eight bytes is written without a data-dependent loop: its 7-bit groups
//! are spread into the bytes of a register by three shift-and-mask steps,
//! the length comes from the leading zeros, and a fixed 8-byte copy is
//! followed by a truncation.

use postcard::Error;
use serde::ser::{self, Serialize};

/// Appends `value`'s postcard encoding to `out`. On an error `out` may hold
/// a prefix of the encoding; every caller discards the whole buffer then.
#[inline]
pub(crate) fn append_postcard<T: Serialize + ?Sized>(
    value: &T,
    out: &mut Vec<u8>,
) -> postcard::Result<()> {
    value.serialize(&mut AppendSerializer(out))
}

/// Appends `value` as a varint (7 bits per byte, least significant group
/// first, the high bit set on every byte but the last).
#[inline(always)]
fn push_varint_u64(out: &mut Vec<u8>, value: u64) {
    // Small values (counts, lengths, enum tags) are most of what a state
    // holds: one predictable branch and one push, small enough to inline
    // into every caller; longer ones make one call.
    if value < 0x80 {
        out.push(value as u8);
    } else {
        push_long_varint_u64(out, value);
    }
}

/// [`push_varint_u64`] for values of two bytes or more.
#[inline(never)]
fn push_long_varint_u64(out: &mut Vec<u8>, value: u64) {
    if value >= 1 << 56 {
        push_varint_u128(out, u128::from(value));
        return;
    }
    // Up to eight groups: spread into the eight bytes of a register in
    // three steps (28-bit halves into 32-bit lanes, 14-bit quarters into
    // 16-bit lanes, 7-bit groups into bytes) rather than stored byte by
    // byte into a stack buffer, which stalls on store forwarding when it
    // is read back whole. Every byte gets its continuation bit, then the
    // last one's is cleared (its eighth bit is 0 by the choice of `len`).
    let mut spread = value;
    spread = (spread & 0x0000_0000_0FFF_FFFF) | ((spread & 0x00FF_FFFF_F000_0000) << 4);
    spread = (spread & 0x0000_3FFF_0000_3FFF) | ((spread & 0x0FFF_C000_0FFF_C000) << 2);
    spread = (spread & 0x007F_007F_007F_007F) | ((spread & 0x3F80_3F80_3F80_3F80) << 1);
    let len = varint_u64_len(value);
    let last_continuation = 0x80_u64 << (8 * (len - 1));
    spread = (spread | 0x8080_8080_8080_8080) & !last_continuation;
    let start = out.len();
    out.extend_from_slice(&spread.to_le_bytes());
    out.truncate(start + len);
}

/// The number of 7-bit groups of `value`'s varint, 1 to 10.
#[inline(always)]
fn varint_u64_len(value: u64) -> usize {
    let significant_bits = 64 - (value | 1).leading_zeros() as usize;
    significant_bits.div_ceil(7)
}

/// Appends a `u128` as a varint: rare in state, so a plain loop.
fn push_varint_u128(out: &mut Vec<u8>, mut value: u128) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Zigzag: small magnitudes of either sign become small unsigned values.
#[inline(always)]
fn zigzag_i64(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

#[inline(always)]
fn zigzag_i128(value: i128) -> u128 {
    ((value << 1) ^ (value >> 127)) as u128
}

/// postcard's format written straight into a borrowed `Vec<u8>`.
struct AppendSerializer<'a>(&'a mut Vec<u8>);

impl AppendSerializer<'_> {
    #[inline(always)]
    fn varint(&mut self, value: u64) -> postcard::Result<()> {
        push_varint_u64(self.0, value);
        Ok(())
    }

    /// An enum variant's tag: its index as a varint, whatever its shape.
    #[inline(always)]
    fn variant(&mut self, variant_index: u32) -> postcard::Result<()> {
        self.varint(u64::from(variant_index))
    }

    #[inline(always)]
    fn length(&mut self, len: Option<usize>) -> postcard::Result<()> {
        let len = len.ok_or(Error::SerializeSeqLengthUnknown)?;
        self.varint(len as u64)
    }
}

impl ser::Serializer for &mut AppendSerializer<'_> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    fn is_human_readable(&self) -> bool {
        false
    }

    #[inline]
    fn serialize_bool(self, value: bool) -> postcard::Result<()> {
        self.serialize_u8(u8::from(value))
    }

    #[inline]
    fn serialize_i8(self, value: i8) -> postcard::Result<()> {
        self.serialize_u8(value as u8)
    }

    #[inline]
    fn serialize_i16(self, value: i16) -> postcard::Result<()> {
        self.varint(zigzag_i64(i64::from(value)))
    }

    #[inline]
    fn serialize_i32(self, value: i32) -> postcard::Result<()> {
        self.varint(zigzag_i64(i64::from(value)))
    }

    #[inline]
    fn serialize_i64(self, value: i64) -> postcard::Result<()> {
        self.varint(zigzag_i64(value))
    }

    fn serialize_i128(self, value: i128) -> postcard::Result<()> {
        push_varint_u128(self.0, zigzag_i128(value));
        Ok(())
    }

    #[inline]
    fn serialize_u8(self, value: u8) -> postcard::Result<()> {
        self.0.push(value);
        Ok(())
    }

    #[inline]
    fn serialize_u16(self, value: u16) -> postcard::Result<()> {
        self.varint(u64::from(value))
    }

    #[inline]
    fn serialize_u32(self, value: u32) -> postcard::Result<()> {
        self.varint(u64::from(value))
    }

    #[inline(always)]
    fn serialize_u64(self, value: u64) -> postcard::Result<()> {
        self.varint(value)
    }

    fn serialize_u128(self, value: u128) -> postcard::Result<()> {
        push_varint_u128(self.0, value);
        Ok(())
    }

    #[inline]
    fn serialize_f32(self, value: f32) -> postcard::Result<()> {
        self.0.extend_from_slice(&value.to_bits().to_le_bytes());
        Ok(())
    }

    #[inline]
    fn serialize_f64(self, value: f64) -> postcard::Result<()> {
        self.0.extend_from_slice(&value.to_bits().to_le_bytes());
        Ok(())
    }

    fn serialize_char(self, value: char) -> postcard::Result<()> {
        let mut utf8 = [0u8; 4];
        self.serialize_str(value.encode_utf8(&mut utf8))
    }

    #[inline]
    fn serialize_str(self, value: &str) -> postcard::Result<()> {
        self.serialize_bytes(value.as_bytes())
    }

    #[inline]
    fn serialize_bytes(self, value: &[u8]) -> postcard::Result<()> {
        self.varint(value.len() as u64)?;
        self.0.extend_from_slice(value);
        Ok(())
    }

    #[inline]
    fn serialize_none(self) -> postcard::Result<()> {
        self.serialize_u8(0)
    }

    #[inline]
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> postcard::Result<()> {
        self.serialize_u8(1)?;
        value.serialize(self)
    }

    #[inline]
    fn serialize_unit(self) -> postcard::Result<()> {
        Ok(())
    }

    #[inline]
    fn serialize_unit_struct(self, _name: &'static str) -> postcard::Result<()> {
        Ok(())
    }

    #[inline]
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        variant_index: u32,
        _variant: &'static str,
    ) -> postcard::Result<()> {
        self.variant(variant_index)
    }

    #[inline]
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> postcard::Result<()> {
        value.serialize(self)
    }

    #[inline]
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        variant_index: u32,
        _variant: &'static str,
        value: &T,
    ) -> postcard::Result<()> {
        self.variant(variant_index)?;
        value.serialize(self)
    }

    #[inline]
    fn serialize_seq(self, len: Option<usize>) -> postcard::Result<Self> {
        self.length(len)?;
        Ok(self)
    }

    #[inline]
    fn serialize_tuple(self, _len: usize) -> postcard::Result<Self> {
        Ok(self)
    }

    #[inline]
    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> postcard::Result<Self> {
        Ok(self)
    }

    #[inline]
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        variant_index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> postcard::Result<Self> {
        self.variant(variant_index)?;
        Ok(self)
    }

    #[inline]
    fn serialize_map(self, len: Option<usize>) -> postcard::Result<Self> {
        self.length(len)?;
        Ok(self)
    }

    #[inline]
    fn serialize_struct(self, _name: &'static str, _len: usize) -> postcard::Result<Self> {
        Ok(self)
    }

    #[inline]
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        variant_index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> postcard::Result<Self> {
        self.variant(variant_index)?;
        Ok(self)
    }
}

/// Compound values are their elements in order, with no framing beyond
/// what `serialize_seq`, `serialize_map` and the variants wrote.
macro_rules! elements {
    ($($trait:ident :: $method:ident),* $(,)?) => {$(
        impl ser::$trait for &mut AppendSerializer<'_> {
            type Ok = ();
            type Error = Error;

            #[inline]
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> postcard::Result<()> {
                value.serialize(&mut **self)
            }

            #[inline]
            fn end(self) -> postcard::Result<()> {
                Ok(())
            }
        }
    )*};
}

elements!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field,
);

impl ser::SerializeMap for &mut AppendSerializer<'_> {
    type Ok = ();
    type Error = Error;

    #[inline]
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> postcard::Result<()> {
        key.serialize(&mut **self)
    }

    #[inline]
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> postcard::Result<()> {
        value.serialize(&mut **self)
    }

    #[inline]
    fn end(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Struct fields are their values in order; postcard writes no names.
macro_rules! fields {
    ($($trait:ident),* $(,)?) => {$(
        impl ser::$trait for &mut AppendSerializer<'_> {
            type Ok = ();
            type Error = Error;

            #[inline]
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                _key: &'static str,
                value: &T,
            ) -> postcard::Result<()> {
                value.serialize(&mut **self)
            }

            #[inline]
            fn end(self) -> postcard::Result<()> {
                Ok(())
            }
        }
    )*};
}

fields!(SerializeStruct, SerializeStructVariant);

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Serialize;

    use super::append_postcard;

    /// `value` appended after a byte already in the buffer equals
    /// postcard's own encoding after that byte.
    fn check<T: Serialize + ?Sized>(value: &T) {
        let mut out = vec![0xAB];
        append_postcard(value, &mut out).expect("encodes");
        let mut want = vec![0xAB];
        want.extend_from_slice(&postcard::to_allocvec(value).expect("encodes"));
        assert_eq!(out, want);
    }

    /// Every power of two, one below and one above, as `u64` and with
    /// either sign as `i64`: every varint length and both sides of each
    /// length's boundary.
    fn boundaries() -> impl Iterator<Item = u64> {
        (0..64).flat_map(|bit| {
            let power = 1_u64 << bit;
            [power - 1, power, power.wrapping_add(1)]
        })
    }

    #[test]
    fn integers_are_postcard_at_every_varint_boundary() {
        for value in boundaries().chain([u64::MAX]) {
            check(&value);
            check(&(value as i64));
            check(&(value as i64).wrapping_neg());
            check(&(value as u32));
            check(&(value as i32));
            check(&(value as u16));
            check(&(value as i16));
            check(&(value as u8));
            check(&(value as i8));
            check(&u128::from(value));
            check(&(u128::from(value) << 64));
            check(&(i128::from(value as i64) << 60));
        }
        check(&i64::MIN);
        check(&i128::MIN);
        check(&u128::MAX);
    }

    #[derive(Serialize)]
    struct Named {
        count: u64,
        name: String,
        ratio: f32,
    }

    #[derive(Serialize)]
    struct Tuple(i32, char);

    #[derive(Serialize)]
    struct Unit;

    #[derive(Serialize)]
    struct Newtype(u16);

    #[derive(Serialize)]
    enum Shape {
        Empty,
        Wrapped(u64),
        Pair(u8, bool),
        Fields { left: i64, right: Option<u8> },
    }

    #[test]
    fn every_serde_shape_is_postcard() {
        check(&0_u64);
        check("a string");
        check(&'é');
        check(&Bytes(&[1, 2, 3]));
        check(&Bytes(&[7; 300]));
        check(&(7_u32, vec![1_u8, 2, 3], Some("x".to_string())));
        check(&[1.5_f64, -0.0]);
        check(&(true, false, ()));
        check(&Option::<u64>::None);
        check(&Named {
            count: 300,
            name: "n".repeat(200),
            ratio: 0.25,
        });
        check(&Tuple(-70_000, 'z'));
        check(&Unit);
        check(&Newtype(65_535));
        let shapes = vec![
            Shape::Empty,
            Shape::Wrapped(1 << 40),
            Shape::Pair(9, true),
            Shape::Fields {
                left: -5,
                right: Some(200),
            },
        ];
        check(&shapes);
        let map: BTreeMap<String, Vec<i16>> = [
            ("a".to_string(), vec![-1, 1_000]),
            ("b".to_string(), vec![]),
        ]
        .into_iter()
        .collect();
        check(&map);
    }

    /// Bytes serialized as bytes (not as a sequence of `u8`s), the way
    /// `serde_bytes` does.
    struct Bytes<'a>(&'a [u8]);

    impl Serialize for Bytes<'_> {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.serialize_bytes(self.0)
        }
    }

    #[test]
    fn a_sequence_of_unknown_length_is_refused_as_postcard_refuses_it() {
        struct Unsized;
        impl Serialize for Unsized {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeSeq;
                serializer.serialize_seq(None)?.end()
            }
        }
        let mut out = Vec::new();
        assert_eq!(
            append_postcard(&Unsized, &mut out),
            Err(postcard::Error::SerializeSeqLengthUnknown)
        );
        assert_eq!(
            postcard::to_allocvec(&Unsized),
            Err(postcard::Error::SerializeSeqLengthUnknown)
        );
    }
}
