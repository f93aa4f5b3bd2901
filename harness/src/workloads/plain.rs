//! Plain resident memory for a workload: the reference run and the compute baseline.

use super::WORDS;

/// Page-aligned plain memory: the reference run and the compute baseline.
pub struct PlainMem(Vec<u64>);

impl PlainMem {
    /// `bytes` of zeroed memory, every page touched (resident) before any timing.
    pub fn new(bytes: usize) -> Self {
        let mut v = vec![0u64; bytes.div_ceil(8)];
        for x in v.iter_mut().step_by(WORDS) {
            // Touch each page so later timings see resident memory.
            // SAFETY: a valid, aligned element of the vector.
            unsafe { std::ptr::write_volatile(x, 0) };
        }
        PlainMem(v)
    }

    /// The bytes.
    pub fn bytes(&mut self) -> &mut [u8] {
        let len = self.0.len() * 8;
        // SAFETY: the vector's storage viewed as bytes (u8 has no alignment or validity needs);
        // the borrow of `self` keeps it alive and unaliased.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), len) }
    }
}
