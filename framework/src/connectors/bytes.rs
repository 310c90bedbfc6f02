//! A bounds-checked little-endian reader and the matching string writer
//! for the Kafka connector's two byte formats (source positions, sink
//! states). Compiled without the `kafka` feature too, because the
//! position layout ([`super::kafka_position`]) is read by tools that do
//! not build librdkafka; what only the sink state uses is then unused.
//!
//! This module owns only the mechanics of reading fixed-size numbers and
//! length-prefixed strings from untrusted bytes: every read checks the
//! bytes that remain first, so no length read from the input makes it
//! allocate more than the input holds. It never knows what a field
//! means; callers turn its `&'static str` reasons into their own typed
//! errors.

/// Reads from a byte slice, front to back.
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { rest: bytes }
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], &'static str> {
        if self.rest.len() < N {
            return Err("cut short");
        }
        let (head, tail) = self.rest.split_at(N);
        self.rest = tail;
        head.try_into().map_err(|_| "cut short")
    }

    pub(crate) fn u8(&mut self) -> Result<u8, &'static str> {
        Ok(self.take::<1>()?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, &'static str> {
        self.take().map(u32::from_le_bytes)
    }

    pub(crate) fn i32(&mut self) -> Result<i32, &'static str> {
        self.take().map(i32::from_le_bytes)
    }

    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) fn u64(&mut self) -> Result<u64, &'static str> {
        self.take().map(u64::from_le_bytes)
    }

    pub(crate) fn i64(&mut self) -> Result<i64, &'static str> {
        self.take().map(i64::from_le_bytes)
    }

    /// A string written by [`put_str`].
    pub(crate) fn str(&mut self) -> Result<String, &'static str> {
        let length = usize::from(u16::from_le_bytes(self.take()?));
        if self.rest.len() < length {
            return Err("cut short");
        }
        let (head, tail) = self.rest.split_at(length);
        self.rest = tail;
        std::str::from_utf8(head)
            .map(str::to_owned)
            .map_err(|_| "a name is not UTF-8")
    }

    /// Bytes written as a `u32` length and the bytes.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) fn bytes(&mut self) -> Result<Vec<u8>, &'static str> {
        let length = self.u32()? as usize;
        if self.rest.len() < length {
            return Err("cut short");
        }
        let (head, tail) = self.rest.split_at(length);
        self.rest = tail;
        Ok(head.to_vec())
    }

    /// How many bytes are left to read.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// Fails when bytes are left over.
    pub(crate) fn finish(self) -> Result<(), &'static str> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err("trailing bytes")
        }
    }
}

/// Appends `text` as a `u16` length and its bytes. Kafka topic names and
/// the sink's transactional ids are far below 64 KiB; a longer text is
/// cut at a character boundary below the limit rather than misframed.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub(crate) fn put_str(bytes: &mut Vec<u8>, text: &str) {
    let mut length = text.len().min(usize::from(u16::MAX));
    while !text.is_char_boundary(length) {
        length -= 1;
    }
    // `length` fits: it is at most u16::MAX.
    bytes.extend_from_slice(&(length as u16).to_le_bytes());
    bytes.extend_from_slice(&text.as_bytes()[..length]);
}
