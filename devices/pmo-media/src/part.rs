//! A medium that is one byte range of another: a store kept behind a header, as on the
//! media file of a CXL expander (its DPA space starts after the media header).

use super::{check_range, Medium, MediumError};

/// Bytes `[base, base + len)` of `inner`, seen as a medium of `len` bytes.
pub struct Part<M> {
    inner: M,
    base: u64,
    len: u64,
}

impl<M: Medium> Part<M> {
    /// The range `[base, base + len)` of `inner`; it must lie inside it.
    pub fn new(inner: M, base: u64, len: u64) -> Result<Self, MediumError> {
        check_range(inner.len(), base, len)?;
        Ok(Self { inner, base, len })
    }

    fn at(&self, off: u64, len: u64) -> Result<u64, MediumError> {
        check_range(self.len, off, len)?;
        // Cannot overflow: base + self.len fits (checked at new) and off + len <= self.len.
        Ok(self.base + off)
    }
}

impl<M: Medium> Medium for Part<M> {
    fn len(&self) -> u64 {
        self.len
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), MediumError> {
        self.inner.read(self.at(off, buf.len() as u64)?, buf)
    }
    fn write(&self, off: u64, data: &[u8]) -> Result<(), MediumError> {
        self.inner.write(self.at(off, data.len() as u64)?, data)
    }
    fn persist(&self, off: u64, len: u64) -> Result<(), MediumError> {
        self.inner.persist(self.at(off, len)?, len)
    }
    fn zero(&self, off: u64, len: u64) -> Result<(), MediumError> {
        self.inner.zero(self.at(off, len)?, len)
    }
    fn zero_in_place(&self, off: u64, len: u64) -> Result<(), MediumError> {
        self.inner.zero_in_place(self.at(off, len)?, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FileMedium;

    #[test]
    fn a_part_is_offset_and_bounded() {
        let p = std::env::temp_dir().join(format!("pmo-part-{}", std::process::id()));
        let f = std::sync::Arc::new(FileMedium::create(&p, 3 * 4096).unwrap());
        f.write(4096 + 10, b"inside").unwrap();
        let part = Part::new(f.clone(), 4096, 4096).unwrap();
        assert_eq!(part.len(), 4096);
        let mut b = [0u8; 6];
        part.read(10, &mut b).unwrap();
        assert_eq!(&b, b"inside");
        part.write(4090, b"edge!!").unwrap();
        f.read(2 * 4096 - 6, &mut b).unwrap();
        assert_eq!(&b, b"edge!!");
        assert!(part.read(4091, &mut b).is_err(), "past the part's end");
        assert!(part.read(u64::MAX, &mut b).is_err(), "no wrap");
        assert!(
            Part::new(f.clone(), 4096, 3 * 4096).is_err(),
            "outside the medium"
        );
        assert!(Part::new(f.clone(), u64::MAX, 2).is_err(), "no wrap");
        drop(f);
        std::fs::remove_file(&p).unwrap();
    }
}
