//! A set of pages of one attachment, one bit each, that fault threads, the prefetch worker
//! and psync update concurrently without a lock.

use std::sync::atomic::{AtomicU64, Ordering};

/// One bit per page of a slice (callers pass pages of the slice; one past the last word reads
/// as clear and is never set, so a bad page number costs nothing but a wrong answer). Every
/// update is acquire-release, every read an acquire: a thread that sees a bit also sees
/// what its setter wrote before it.
pub(super) struct PageBits(Box<[AtomicU64]>);

impl PageBits {
    /// `npages` clear bits.
    pub(super) fn new(npages: u64) -> Self {
        PageBits(
            (0..npages.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
        )
    }

    #[inline]
    fn word(&self, page: u64) -> Option<&AtomicU64> {
        self.0.get(usize::try_from(page / 64).ok()?)
    }

    /// Sets `page`; returns whether it was set before.
    #[inline]
    pub(super) fn set(&self, page: u64) -> bool {
        let bit = 1 << (page % 64);
        self.word(page)
            .is_some_and(|w| w.fetch_or(bit, Ordering::AcqRel) & bit != 0)
    }

    /// Clears `page`.
    #[inline]
    pub(super) fn clear(&self, page: u64) {
        if let Some(w) = self.word(page) {
            w.fetch_and(!(1 << (page % 64)), Ordering::AcqRel);
        }
    }

    /// Clears `page`; returns whether it was set.
    #[inline]
    pub(super) fn clear_was_set(&self, page: u64) -> bool {
        let bit = 1 << (page % 64);
        self.word(page)
            .is_some_and(|w| w.fetch_and(!bit, Ordering::AcqRel) & bit != 0)
    }

    /// Whether `page` is set.
    #[inline]
    pub(super) fn test(&self, page: u64) -> bool {
        self.word(page)
            .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (page % 64)) != 0)
    }

    /// The set pages, in order.
    pub(super) fn pages(&self) -> Vec<u64> {
        let mut v = Vec::new();
        for (i, w) in self.0.iter().enumerate() {
            let mut b = w.load(Ordering::Acquire);
            while b != 0 {
                v.push(i as u64 * 64 + u64::from(b.trailing_zeros()));
                b &= b - 1;
            }
        }
        v
    }

    /// Clears every page, a word at a time, and hands each page that was set to `f`, in
    /// order. A page set concurrently is either handed over here or stays set.
    pub(super) fn take_each(&self, mut f: impl FnMut(u64)) {
        for (i, w) in self.0.iter().enumerate() {
            let mut b = w.swap(0, Ordering::AcqRel);
            while b != 0 {
                f(i as u64 * 64 + u64::from(b.trailing_zeros()));
                b &= b - 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_set_tested_cleared_and_listed_in_order() {
        let b = PageBits::new(130);
        assert!(!b.set(129));
        assert!(b.set(129), "set before");
        assert!(!b.set(0));
        assert!(!b.set(64));
        assert!(b.test(64) && b.test(0) && !b.test(1));
        assert_eq!(b.pages(), vec![0, 64, 129]);
        b.clear(64);
        assert!(!b.test(64));
        assert!(b.clear_was_set(0));
        assert!(!b.clear_was_set(0));
        assert_eq!(b.pages(), vec![129]);
    }

    #[test]
    fn pages_past_the_last_word_are_never_set() {
        let b = PageBits::new(3);
        assert!(!b.set(200));
        assert!(!b.test(200));
        assert!(!b.clear_was_set(200));
        b.clear(u64::MAX);
        assert!(!b.set(u64::MAX));
        assert_eq!(b.pages(), Vec::<u64>::new());
    }

    #[test]
    fn take_each_hands_over_and_clears_every_set_page() {
        let b = PageBits::new(200);
        for p in [3, 63, 64, 150, 199] {
            b.set(p);
        }
        let mut got = Vec::new();
        b.take_each(|p| got.push(p));
        assert_eq!(got, vec![3, 63, 64, 150, 199]);
        assert_eq!(b.pages(), Vec::<u64>::new());
        b.take_each(|_| panic!("nothing is left"));
    }
}
