//! YCSB's zipfian and scrambled zipfian generators and the C library's random numbers, for
//! callers that draw from the distributions directly.

use crate::{ffi, Error};

/// YCSB's `ZipfianGenerator` (Gray et al.), unscrambled: item `min` is the most popular,
/// `min + 1` the next, and so on. Seeded by its own xoshiro256** stream.
#[derive(Clone, Debug)]
pub struct Zipfian {
    z: ffi::RawZipf,
    rng: ffi::RawRng,
}

impl Zipfian {
    /// Items `min..=max` with zipfian constant `theta` (0 < theta < 1); sums zeta over the
    /// item count, O(max - min).
    pub fn new(min: u64, max: u64, theta: f64, seed: u64) -> Result<Zipfian, Error> {
        let mut z = ffi::RawZipf::default();
        // SAFETY: `z` is a valid, writable RawZipf (all 8-byte fields, as in C).
        let rc = unsafe { ffi::ycsb_zipf_init(&mut z, min, max, theta) };
        if rc != 0 {
            return Err(Error::InvalidParameters);
        }
        Ok(Zipfian { z, rng: rng(seed) })
    }

    /// The next item.
    pub fn next_item(&mut self) -> u64 {
        // SAFETY: both are valid, initialized RawZipf / RawRng values.
        unsafe { ffi::ycsb_zipf_next(&mut self.z, &mut self.rng) }
    }

    /// The next item over `itemcount` items (`min..min + itemcount`); a larger count than
    /// before extends zeta incrementally.
    pub fn next_item_of(&mut self, itemcount: u64) -> u64 {
        // SAFETY: both are valid, initialized RawZipf / RawRng values.
        unsafe { ffi::ycsb_zipf_next_n(&mut self.z, &mut self.rng, itemcount) }
    }
}

/// YCSB's `ScrambledZipfianGenerator(min, max)`: a zipfian value over [`SCRAMBLED_ITEMS`]
/// items, FNV-hashed and taken modulo the item count, so the popular items are spread over
/// the range.
///
/// [`SCRAMBLED_ITEMS`]: crate::SCRAMBLED_ITEMS
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    s: ffi::RawScrambled,
    rng: ffi::RawRng,
}

impl ScrambledZipfian {
    /// Items `min..=max`.
    pub fn new(min: u64, max: u64, seed: u64) -> Result<ScrambledZipfian, Error> {
        let mut s = ffi::RawScrambled::default();
        // SAFETY: `s` is a valid, writable RawScrambled (all 8-byte fields, as in C).
        let rc = unsafe { ffi::ycsb_scrambled_init(&mut s, min, max) };
        if rc != 0 {
            return Err(Error::InvalidParameters);
        }
        Ok(ScrambledZipfian { s, rng: rng(seed) })
    }

    /// The next item.
    pub fn next_item(&mut self) -> u64 {
        // SAFETY: both are valid, initialized RawScrambled / RawRng values.
        unsafe { ffi::ycsb_scrambled_next(&mut self.s, &mut self.rng) }
    }
}

/// The C library's random generator, seeded.
fn rng(seed: u64) -> ffi::RawRng {
    let mut r = ffi::RawRng::default();
    // SAFETY: `r` is a valid, writable RawRng.
    unsafe { ffi::ycsb_rng_seed(&mut r, seed) };
    r
}

/// The C library's random numbers (xoshiro256** seeded through splitmix64).
#[derive(Clone, Debug)]
pub struct Rng {
    r: ffi::RawRng,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { r: rng(seed) }
    }

    /// Uniform in [0, 1), 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        // SAFETY: `r` is a valid, initialized RawRng.
        unsafe { ffi::ycsb_rng_double(&mut self.r) }
    }

    /// Uniform in `0..n`, unbiased (0 when `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        // SAFETY: `r` is a valid, initialized RawRng.
        unsafe { ffi::ycsb_rng_below(&mut self.r, n) }
    }
}

/// zeta(n, theta) = sum of 1/i^theta for i in 1..=n, as the generators compute it.
pub fn zeta(n: u64, theta: f64) -> f64 {
    // SAFETY: a pure function of the C library.
    unsafe { ffi::ycsb_zeta(0, n, theta, 0.0) }
}
