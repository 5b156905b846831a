//! The byte codec of template files (`crate::snapshot`): little-endian integers, length-prefixed
//! byte strings.
//!
//! Owning modules encode their own state with it (`GuestProcess::encode_state`, `Vfs`, the fd
//! table, the memory map); decoding checks every length against the bytes that remain and
//! reports a `DecodeError` naming what was being read, never panics.

use std::fmt;

/// Why template bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DecodeError {}

impl DecodeError {
    pub fn new(what: impl Into<String>) -> DecodeError {
        DecodeError(what.into())
    }
}

#[derive(Debug, Default)]
pub struct Encoder {
    bytes: Vec<u8>,
}

impl Encoder {
    pub fn new() -> Encoder {
        Encoder::default()
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    pub fn u8(&mut self, v: u8) {
        self.bytes.push(v);
    }

    pub fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }

    pub fn u32(&mut self, v: u32) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    pub fn u64(&mut self, v: u64) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    pub fn i64(&mut self, v: i64) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    /// A count or index (stored as u64).
    pub fn len(&mut self, n: usize) {
        self.u64(n as u64);
    }

    /// Length-prefixed bytes.
    pub fn bytes(&mut self, v: &[u8]) {
        self.len(v.len());
        self.bytes.extend_from_slice(v);
    }

    /// Bytes of a length the reader knows (hashes).
    pub fn raw(&mut self, v: &[u8]) {
        self.bytes.extend_from_slice(v);
    }

    pub fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }
}

pub struct Decoder<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Decoder<'a> {
    pub fn new(bytes: &'a [u8]) -> Decoder<'a> {
        Decoder { bytes, at: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// Fails unless every byte was read (trailing bytes mean a format mismatch).
    pub fn finish(&self, what: &str) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::new(format!(
                "{n} unexpected bytes after {what}"
            ))),
        }
    }

    pub fn raw(&mut self, n: usize, what: &str) -> Result<&'a [u8], DecodeError> {
        if n > self.remaining() {
            return Err(DecodeError::new(format!(
                "{what}: needs {n} bytes, {} remain",
                self.remaining()
            )));
        }
        let slice = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.raw(N, what)?);
        Ok(a)
    }

    pub fn u8(&mut self, what: &str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub fn bool(&mut self, what: &str) -> Result<bool, DecodeError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(DecodeError::new(format!("{what}: {v} is not a boolean"))),
        }
    }

    pub fn u32(&mut self, what: &str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub fn u64(&mut self, what: &str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub fn i64(&mut self, what: &str) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    pub fn hash(&mut self, what: &str) -> Result<[u8; 32], DecodeError> {
        self.array(what)
    }

    /// A count of items each at least `min_item_bytes` long: bounded by the bytes that remain,
    /// so a corrupt count cannot make the reader allocate more than the input's size.
    pub fn count(&mut self, min_item_bytes: usize, what: &str) -> Result<usize, DecodeError> {
        let n = self.u64(what)?;
        let max = (self.remaining() / min_item_bytes.max(1)) as u64;
        if n > max {
            return Err(DecodeError::new(format!(
                "{what}: {n} items cannot fit in the {} bytes that remain",
                self.remaining()
            )));
        }
        Ok(n as usize)
    }

    /// An index or size that must be below `bound`.
    pub fn index(&mut self, bound: usize, what: &str) -> Result<usize, DecodeError> {
        let v = self.u64(what)?;
        if v >= bound as u64 {
            return Err(DecodeError::new(format!(
                "{what}: {v} is out of range (below {bound})"
            )));
        }
        Ok(v as usize)
    }

    pub fn bytes(&mut self, what: &str) -> Result<&'a [u8], DecodeError> {
        let n = self.count(1, what)?;
        self.raw(n, what)
    }

    pub fn string(&mut self, what: &str) -> Result<String, DecodeError> {
        let bytes = self.bytes(what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| DecodeError::new(format!("{what}: not UTF-8")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        let mut e = Encoder::new();
        e.u8(7);
        e.bool(true);
        e.u32(0xdead_beef);
        e.u64(u64::MAX);
        e.i64(-5);
        e.str("héllo");
        e.raw(&[9; 32]);
        let bytes = e.into_bytes();
        let mut d = Decoder::new(&bytes);
        assert_eq!(d.u8("a"), Ok(7));
        assert_eq!(d.bool("b"), Ok(true));
        assert_eq!(d.u32("c"), Ok(0xdead_beef));
        assert_eq!(d.u64("d"), Ok(u64::MAX));
        assert_eq!(d.i64("e"), Ok(-5));
        assert_eq!(d.string("f").as_deref(), Ok("héllo"));
        assert_eq!(d.hash("g"), Ok([9; 32]));
        assert_eq!(d.finish("all"), Ok(()));
    }

    #[test]
    fn short_or_hostile_input_is_an_error() {
        assert!(Decoder::new(&[1, 2, 3])
            .u64("x")
            .unwrap_err()
            .0
            .contains("x: needs 8 bytes, 3 remain"));
        assert!(Decoder::new(&[2]).bool("flag").is_err());
        let mut huge = Encoder::new();
        huge.u64(u64::MAX);
        assert!(Decoder::new(&huge.into_bytes())
            .bytes("name")
            .unwrap_err()
            .0
            .contains("cannot fit"));
        let mut e = Encoder::new();
        e.u64(5);
        assert!(Decoder::new(&e.into_bytes()).index(5, "fd").is_err());
        let mut d = Decoder::new(&[0, 0]);
        d.u8("one").unwrap();
        assert!(d.finish("state").is_err());
    }
}
