//! Little-endian encoding helpers for on-media structures. Decoding never panics: every read is
//! bounds-checked because everything on the medium is hostile.

/// Decoding failed: the bytes are too short for the structure.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("truncated structure")]
pub struct Truncated;

/// Appends fields to a byte vector.
#[derive(Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }
}

/// Reads fields from a byte slice.
pub struct Dec<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Dec<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        Self { b, at: 0 }
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Truncated> {
        let end = self.at.checked_add(n).ok_or(Truncated)?;
        let s = self.b.get(self.at..end).ok_or(Truncated)?;
        self.at = end;
        Ok(s)
    }
    pub fn arr<const N: usize>(&mut self) -> Result<[u8; N], Truncated> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    pub fn u8(&mut self) -> Result<u8, Truncated> {
        Ok(self.arr::<1>()?[0])
    }
    pub fn u32(&mut self) -> Result<u32, Truncated> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    pub fn u64(&mut self) -> Result<u64, Truncated> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
}

/// Unkeyed BLAKE3 used as a torn-write / corruption detector for metadata records.
pub fn checksum(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(p);
    }
    *h.finalize().as_bytes()
}
