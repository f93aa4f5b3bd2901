//! Free-space allocator for PMO extents.
//!
//! Nothing of it is stored: at open the free space is the data area minus the extents of all live
//! records, so allocation never needs its own crash-atomic metadata. A create is committed by the
//! record write alone; a crash before it leaves the space free.

use std::collections::BTreeMap;

/// Allocator errors.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AllocError {
    /// No free run is long enough.
    #[error("no free extent of {0} bytes")]
    NoSpace(u64),
    /// An extent overlaps another or lies outside the data area (damaged table).
    #[error("extent {off:#x}+{len:#x} overlaps another or lies outside the data area")]
    Overlap {
        /// Offset.
        off: u64,
        /// Length.
        len: u64,
    },
}

/// First-fit allocator over `[start, end)` with `align`-aligned extents.
#[derive(Debug, Clone)]
pub struct Allocator {
    free: BTreeMap<u64, u64>,
    align: u64,
}

impl Allocator {
    /// Everything free.
    pub fn new(start: u64, end: u64, align: u64) -> Self {
        let mut free = BTreeMap::new();
        if end > start {
            free.insert(start, end - start);
        }
        Self { free, align }
    }

    /// Total free bytes.
    pub fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }

    /// Marks `[off, off+len)` used (at open, for a live record).
    pub fn reserve(&mut self, off: u64, len: u64) -> Result<(), AllocError> {
        let end = off
            .checked_add(len)
            .ok_or(AllocError::Overlap { off, len })?;
        let (&fo, &fl) = self
            .free
            .range(..=off)
            .next_back()
            .ok_or(AllocError::Overlap { off, len })?;
        if len == 0 || fo + fl < end {
            return Err(AllocError::Overlap { off, len });
        }
        self.free.remove(&fo);
        if off > fo {
            self.free.insert(fo, off - fo);
        }
        if fo + fl > end {
            self.free.insert(end, fo + fl - end);
        }
        Ok(())
    }

    /// Finds and reserves an aligned extent of at least `len` bytes (rounded up to the
    /// alignment). Offsets are aligned even when a free run does not start aligned.
    pub fn alloc(&mut self, len: u64) -> Result<(u64, u64), AllocError> {
        let len = len
            .checked_next_multiple_of(self.align)
            .ok_or(AllocError::NoSpace(len))?;
        let found = self.free.iter().find_map(|(&o, &l)| {
            let start = o.checked_next_multiple_of(self.align)?;
            (start.checked_add(len)? <= o + l).then_some(start)
        });
        let off = found.ok_or(AllocError::NoSpace(len))?;
        self.reserve(off, len)?;
        Ok((off, len))
    }

    /// Returns an extent, merging with neighbours.
    pub fn release(&mut self, off: u64, len: u64) {
        let mut start = off;
        let mut end = off + len;
        if let Some((&po, &pl)) = self.free.range(..off).next_back() {
            if po + pl == off {
                self.free.remove(&po);
                start = po;
            }
        }
        if let Some(&nl) = self.free.get(&end) {
            self.free.remove(&end);
            end += nl;
        }
        self.free.insert(start, end - start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_stay_aligned_after_an_unaligned_run() {
        let mut a = Allocator::new(0, 100, 10);
        a.reserve(0, 15).unwrap();
        assert_eq!(a.alloc(10).unwrap(), (20, 10));
        assert_eq!(a.alloc(80), Err(AllocError::NoSpace(80)));
    }

    #[test]
    fn alloc_release_merge_and_overlap() {
        let mut a = Allocator::new(0, 100, 10);
        let (o1, l1) = a.alloc(15).unwrap();
        assert_eq!((o1, l1), (0, 20));
        let (o2, _) = a.alloc(30).unwrap();
        assert_eq!(o2, 20);
        assert_eq!(a.alloc(60), Err(AllocError::NoSpace(60)));
        a.release(o1, l1);
        a.release(o2, 30);
        assert_eq!(a.free_bytes(), 100);
        assert_eq!(a.alloc(100).unwrap(), (0, 100));
        let mut b = Allocator::new(0, 100, 10);
        b.reserve(10, 20).unwrap();
        assert!(b.reserve(20, 20).is_err());
        assert!(b.reserve(90, 20).is_err());
    }
}
