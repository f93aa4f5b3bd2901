#![allow(dead_code)]
use pmo_crypto::{UserKey, PAGE};
use pmo_media::{CrashMedium, Medium};
use pmo_store::{Store, StoreOptions};
use std::sync::Arc;

pub const MEDIUM: u64 = 12 << 20;

pub fn key(s: &str) -> UserKey {
    UserKey::new(s.as_bytes()).unwrap()
}

/// A store of `slots` slots whose PMOs use the cheapest Argon2id cost (tests attach thousands
/// of times; the default cost is 0.2 s each).
pub fn fast_options(slots: u32) -> StoreOptions {
    StoreOptions {
        slots: Some(slots),
        kdf: pmo_crypto::KdfParams::INSECURE_FAST,
        ..Default::default()
    }
}

pub fn fresh(len: u64) -> (Arc<CrashMedium>, Store) {
    let m = Arc::new(CrashMedium::new(len));
    let s = Store::create(m.clone() as Arc<dyn Medium>, fast_options(16)).unwrap();
    (m, s)
}

pub fn reopen(img: Vec<u8>) -> (Arc<CrashMedium>, Store, pmo_store::RecoveryReport) {
    let m = Arc::new(CrashMedium::from_image(img));
    let (s, r) = Store::open(m.clone() as Arc<dyn Medium>).unwrap();
    (m, s, r)
}

/// [`fresh`] on a handle that also has the harness's benchmark suites (`paper`, no-MAC), as
/// the design-comparison harness opens its stores.
pub fn fresh_bench(len: u64) -> (Arc<CrashMedium>, Store) {
    let m = Arc::new(CrashMedium::new(len));
    let opts = StoreOptions {
        suites: pmo_bench_suites::suites(),
        ..fast_options(16)
    };
    let s = Store::create(m.clone(), opts).unwrap();
    (m, s)
}

/// [`reopen`] on a handle that also has the harness's benchmark suites.
pub fn reopen_bench(img: Vec<u8>) -> (Arc<CrashMedium>, Store, pmo_store::RecoveryReport) {
    let m = Arc::new(CrashMedium::from_image(img));
    let opts = pmo_store::OpenOptions {
        suites: pmo_bench_suites::suites(),
        ..Default::default()
    };
    let (s, r) = Store::open_with(m.clone(), &opts).unwrap();
    (m, s, r)
}

/// A page whose bytes encode (tag, page) so mixes are visible.
pub fn page_of(tag: u8, page: u64) -> [u8; PAGE] {
    let mut p = [0u8; PAGE];
    for (i, b) in p.iter_mut().enumerate() {
        *b = tag ^ (page as u8).wrapping_mul(31) ^ (i as u8).wrapping_mul(7);
    }
    p[..8].copy_from_slice(&page.to_le_bytes());
    p[8] = tag;
    p
}

/// Contains `needle`?
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    let n = needle.len();
    if n == 0 || hay.len() < n {
        return false;
    }
    let first = needle[0];
    let mut i = 0;
    while i + n <= hay.len() {
        if hay[i] == first && &hay[i..i + n] == needle {
            return true;
        }
        i += 1;
    }
    false
}
