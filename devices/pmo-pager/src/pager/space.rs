//! The window's free space: which runs of window pages no attachment holds.

use locked::Locked;
use std::sync::Mutex;

/// Free runs of window pages as `(first page, pages)`, in no particular order until a
/// release sorts and merges them. First fit: an attachment takes the first run long enough,
/// from its start.
pub(super) struct FreeSpace(Mutex<Vec<(u64, u64)>>);

impl FreeSpace {
    /// A window of `npages` pages, all free.
    pub(super) fn new(npages: u64) -> Self {
        FreeSpace(Mutex::new(vec![(0, npages)]))
    }

    /// Takes `npages` pages from the first free run long enough; returns the first page, or
    /// `None` if no run is.
    pub(super) fn take(&self, npages: u64) -> Option<u64> {
        let mut free = self.0.locked();
        let i = free.iter().position(|(_, n)| *n >= npages)?;
        let (s, n) = free[i];
        if n == npages {
            free.remove(i);
        } else {
            free[i] = (s + npages, n - npages);
        }
        Some(s)
    }

    /// Returns a run taken before, merging it with free neighbours.
    pub(super) fn release(&self, start: u64, npages: u64) {
        let mut free = self.0.locked();
        free.push((start, npages));
        free.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(free.len());
        for (s, n) in free.drain(..) {
            match merged.last_mut() {
                Some((ls, ln)) if *ls + *ln == s => *ln += n,
                _ => merged.push((s, n)),
            }
        }
        *free = merged;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(f: &FreeSpace) -> Vec<(u64, u64)> {
        f.0.lock().unwrap().clone()
    }

    #[test]
    fn first_fit_and_released_neighbours_merge() {
        let f = FreeSpace::new(10);
        assert_eq!(f.take(3), Some(0));
        assert_eq!(f.take(3), Some(3));
        assert_eq!(f.take(5), None, "4 pages left");
        assert_eq!(f.take(4), Some(6));
        assert_eq!(f.take(1), None, "full");
        f.release(0, 3);
        f.release(6, 4);
        assert_eq!(runs(&f), vec![(0, 3), (6, 4)]);
        // First fit: the hole at 0 is too short for 4, the run at 6 is not.
        assert_eq!(f.take(4), Some(6));
        assert_eq!(f.take(2), Some(0));
        f.release(0, 2);
        f.release(6, 4);
        f.release(3, 3);
        assert_eq!(runs(&f), vec![(0, 10)], "all merged again");
        assert_eq!(f.take(10), Some(0));
    }
}
