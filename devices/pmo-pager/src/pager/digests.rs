//! What the store holds for each page of a writable slice, as a keyed fingerprint, so that a
//! page marked dirty whose content did not change is neither written by psync nor sealed into
//! device memory by a demotion.
//!
//! Dirty marks are conservative: in a VM, KVM's async page fault worker faults missing pages in
//! for writing whatever the guest's access was (`async_pf_execute`, `FOLL_WRITE`), so pages the
//! guest only read arrive dirty (docs/pmo-device.md). Comparing a page with what the store holds
//! undoes that at the cost of one hash per fill and per dirty page at psync.
//!
//! The fingerprint is 128 bits of BLAKE3 keyed with a key drawn at random per attachment: the
//! guest cannot compute it, so it cannot craft a change that compares equal (which would only
//! keep its own write from persisting), and an accidental equality of two different pages has
//! probability 2^-128. The key is wiped when the slice goes.

use std::sync::atomic::{AtomicU64, Ordering};

use pmo_crypto::{random_bytes, CryptoError, PAGE};
use zeroize::Zeroizing;

/// Fingerprints of the store's content, two words per page; all zero means unknown.
pub(super) struct StoreDigests {
    key: Zeroizing<[u8; 32]>,
    words: Vec<AtomicU64>,
}

impl StoreDigests {
    /// Unknown fingerprints for `npages` pages under a fresh key.
    pub(super) fn new(npages: u64) -> Result<Self, CryptoError> {
        let mut key = Zeroizing::new([0u8; 32]);
        random_bytes(&mut key[..])?;
        Ok(Self {
            key,
            words: (0..npages.saturating_mul(2))
                .map(|_| AtomicU64::new(0))
                .collect(),
        })
    }

    fn digest(&self, data: &[u8]) -> [u64; 2] {
        let h = blake3::keyed_hash(&self.key, data);
        let b = h.as_bytes();
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        [word(0), word(8)]
    }

    fn slot(&self, page: u64) -> Option<(&AtomicU64, &AtomicU64)> {
        let i = usize::try_from(page).ok()?.checked_mul(2)?;
        Some((self.words.get(i)?, self.words.get(i + 1)?))
    }

    /// The store holds `data` (one page) as `page` now (it was filled from there, or
    /// psynced).
    pub(super) fn record(&self, page: u64, data: &[u8]) {
        if let Some((a, b)) = self.slot(page) {
            let [x, y] = self.digest(data);
            a.store(x, Ordering::Relaxed);
            b.store(y, Ordering::Relaxed);
        }
    }

    /// Whether `data` is what the store holds as `page` (false when unknown).
    pub(super) fn unchanged(&self, page: u64, data: &[u8; PAGE]) -> bool {
        let Some((a, b)) = self.slot(page) else {
            return false;
        };
        let known = [a.load(Ordering::Relaxed), b.load(Ordering::Relaxed)];
        known != [0, 0] && known == self.digest(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_recorded_content_compares_unchanged() {
        let d = StoreDigests::new(4).unwrap();
        let mut page = [7u8; PAGE];
        assert!(!d.unchanged(1, &page), "unknown is never unchanged");
        d.record(1, &page);
        assert!(d.unchanged(1, &page));
        assert!(!d.unchanged(2, &page), "per page");
        page[PAGE - 1] ^= 1;
        assert!(!d.unchanged(1, &page), "one bit differs");
        assert!(!d.unchanged(u64::MAX, &page), "out of range");
        d.record(u64::MAX, &page);
        // Another attachment's key gives other fingerprints.
        let e = StoreDigests::new(4).unwrap();
        e.record(1, &page);
        assert_ne!(
            d.words[2].load(Ordering::Relaxed),
            e.words[2].load(Ordering::Relaxed)
        );
    }
}
