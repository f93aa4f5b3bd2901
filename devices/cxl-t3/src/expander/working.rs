//! Working extents: DPA ranges of the expander that the VMM maps straight into the guest (a
//! design `c` PMO's working copy, LPMO C), each under a range key made at random for it alone,
//! with the guest's stores recorded per block.
//!
//! A [`WorkingArea`] is a DPA range set aside for them (what the PMO store leaves at the end of
//! the device); [`WorkingArea::alloc`] takes a first-fit run of it as a [`WorkingExtent`], keys
//! it (TEE range id from 65535 down, the PMO store's extents using their table slots from 0
//! up) and starts recording stores to it. Dropping the extent stops that, drops its blocks from
//! the device cache without writing them back, writes zero blocks over it on the media, clears
//! its key and gives the range back.
//!
//! Recording (see also the module doc of `expander`): one bit per block of the extent, set by
//! the fault handler under the block's set lock before it makes the block writable (a write
//! fault that fills it, a write-protect fault that unprotects it). [`WorkingExtent::take_written`]
//! clears each set bit and write-protects the block again under that same lock, so a store
//! after the take faults and sets the bit again: it is reported by this take (it landed before
//! the protect) or by the next one, never lost. The bits are about the extent, not the cache,
//! so they survive eviction. Host-path writes set no bit and never unprotect a block of an
//! extent (`CachedMedia::write_tracked`).
//!
//! Media integrity: the range key (XTS) hides an extent's blocks on the media but does not
//! protect them, and the media file is outside the trust boundary (the device cache is not).
//! So every write of a block of the extent to the media (a write-back on eviction, persist,
//! flush or a key change, or the last copy of a block that could not be put back) records
//! a digest of the exact bytes written (the ciphertext) in the extent's [`Tracker`], and every
//! fill of such a block checks the media bytes against it before decrypting them: a block
//! with no digest must be the all-zero block (never written back since the extent was made:
//! the area is wiped when an extent goes, and a fresh extent's pages are first written on the
//! host path). A block that differs (bits flipped, an older ciphertext of the same block put
//! back, or bytes where nothing was written) is refused: an all-zero page is installed in its
//! place, so the faulting access completes, and the refusal is counted on the extent
//! ([`WorkingExtent::integrity_failures`]) and the expander (`working_integrity_failures`),
//! and logged once per extent. A host-path write that covers the whole block uses none of the
//! media's bytes, so it is not checked. Blocks outside working extents are neither digested
//! nor checked: the PMO store's pages there carry their own keyed tags.

use std::collections::{BTreeMap, BTreeSet};

use pmo_crypto::random_bytes;
use zeroize::Zeroizing;

use super::tracking::Tracker;
use super::*;
use crate::tee::Algorithm;

/// One extent of an area.
#[derive(Debug, Clone, Copy)]
struct Taken {
    /// Exclusive end DPA.
    end: u64,
    /// TEE range id.
    id: u16,
}

/// The lowest start in `[start, end)` of a free run of `len` bytes, extents `taken` (by start
/// DPA, inside the area, not overlapping) being in use.
fn first_fit(start: u64, end: u64, taken: &BTreeMap<u64, Taken>, len: u64) -> Option<u64> {
    let mut at = start;
    for (&s, t) in taken {
        if s.saturating_sub(at) >= len {
            return Some(at);
        }
        at = at.max(t.end);
    }
    (end.checked_sub(at)? >= len).then_some(at)
}

/// A DPA range the expander keeps for working copies (e.g. what the PMO store leaves at the
/// end of the device), handed out as [`WorkingExtent`]s.
pub struct WorkingArea {
    exp: Arc<Expander>,
    start: u64,
    end: u64,
    /// Extents handed out, by start DPA.
    taken: Mutex<BTreeMap<u64, Taken>>,
}

impl std::fmt::Debug for WorkingArea {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkingArea")
            .field("start", &self.start)
            .field("end", &self.end)
            .field("extents", &self.taken.locked().len())
            .finish()
    }
}

impl WorkingArea {
    /// The area `[start, end)` of `exp`'s DPA space: 4 KiB aligned, not empty, inside the
    /// device. Its extents take TEE range ids from 65535 down, skipping ids the range table
    /// already holds (the PMO store keys its extents with their table slots, from 0 up).
    pub fn new(
        exp: Arc<Expander>,
        start: u64,
        end: u64,
    ) -> Result<Arc<WorkingArea>, ExpanderError> {
        if start >= end
            || !start.is_multiple_of(BLOCK)
            || !end.is_multiple_of(BLOCK)
            || end > exp.size()
        {
            return Err(ExpanderError::BadWorkingArea { start, end });
        }
        Ok(Arc::new(WorkingArea {
            exp,
            start,
            end,
            taken: Mutex::new(BTreeMap::new()),
        }))
    }

    /// Start DPA of the area.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Length of the area in bytes.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Never true: an area is not empty.
    pub fn is_empty(&self) -> bool {
        self.start >= self.end
    }

    /// The expander the area is on.
    pub fn expander(&self) -> &Arc<Expander> {
        &self.exp
    }

    /// Takes the first free run of `len` bytes (a non-zero multiple of 4 KiB) as an extent,
    /// keyed under a fresh random range key (XTS-256, or XTS-128 while the range table runs
    /// that), with its stores recorded from now on. A fresh extent reads as zeros if the area
    /// was left wiped (every extent is wiped at its drop); media a crashed run left there
    /// decrypts to noise under the new key.
    pub fn alloc(self: &Arc<Self>, len: u64) -> Result<WorkingExtent, ExpanderError> {
        if len == 0 || !len.is_multiple_of(BLOCK) {
            return Err(ExpanderError::BadExtentLen(len));
        }
        // Held throughout, so two allocations never pick the same run or id.
        let mut taken = self.taken.locked();
        let dpa = first_fit(self.start, self.end, &taken, len).ok_or(ExpanderError::NoRoom(len))?;
        let end = dpa.checked_add(len).ok_or(ExpanderError::NoRoom(len))?;
        let id = self.free_id(&taken).ok_or(ExpanderError::NoRangeId)?;
        let tracker =
            Arc::new(Tracker::new(id, dpa / BLOCK, len / BLOCK).ok_or(ExpanderError::NoRoom(len))?);
        let memory = &self.exp.memory;
        // Recorded before it is keyed: keying drops the range's cached blocks, so every block
        // of the extent is filled under the record.
        memory.track(tracker.clone());
        if let Err(e) = self.key(id, dpa, end) {
            memory.untrack(&tracker);
            return Err(e);
        }
        taken.insert(dpa, Taken { end, id });
        Ok(WorkingExtent {
            area: self.clone(),
            dpa,
            len,
            id,
            tracker,
        })
    }

    /// The highest TEE range id neither this area, another working extent nor the range
    /// table holds.
    fn free_id(&self, taken: &BTreeMap<u64, Taken>) -> Option<u16> {
        let ours: BTreeSet<u16> = taken.values().map(|t| t.id).collect();
        (0..=u16::MAX).rev().find(|&id| {
            !ours.contains(&id)
                && !self.exp.memory.working_id(id)
                && self.exp.range_key(id).is_none()
        })
    }

    /// Keys `[dpa, end)` as `id` with a fresh random key of the table's algorithm (XTS-256 if
    /// none is chosen yet); if the table changed algorithm meanwhile, once more with the other.
    fn key(&self, id: u16, dpa: u64, end: u64) -> Result<(), ExpanderError> {
        let len = self
            .exp
            .memory
            .range_algorithm()
            .map_or(Algorithm::XtsAes256.key_len(), Algorithm::key_len);
        match self.key_with(id, dpa, end, len) {
            Err(ExpanderError::Tee(TeeError::AlgorithmMismatch(a))) if a.key_len() != len => {
                self.key_with(id, dpa, end, a.key_len())
            }
            r => r,
        }
    }

    fn key_with(&self, id: u16, dpa: u64, end: u64, len: usize) -> Result<(), ExpanderError> {
        // Wiped when it goes, right after programming; never formatted.
        let mut key = Zeroizing::new([0u8; 64]);
        let k = key.get_mut(..len).ok_or(ExpanderError::NoRandom)?;
        random_bytes(k).map_err(|_| ExpanderError::NoRandom)?;
        self.exp.set_range_key(id, dpa, end, k)
    }
}

/// A run of a [`WorkingArea`] under its own range key, with the stores made to it through
/// the DPA mapping recorded. Dropping it stops the record, drops its cached blocks without
/// writing them back, writes zero blocks over it on the media, clears its key (so neither the
/// device cache nor the media holds anything of it) and gives its range and id back. The VMM
/// must have unmapped it from the guest first.
pub struct WorkingExtent {
    area: Arc<WorkingArea>,
    dpa: u64,
    len: u64,
    id: u16,
    tracker: Arc<Tracker>,
}

impl std::fmt::Debug for WorkingExtent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkingExtent")
            .field("dpa", &self.dpa)
            .field("len", &self.len)
            .field("range_id", &self.id)
            .finish()
    }
}

impl WorkingExtent {
    /// Start DPA.
    pub fn dpa(&self) -> u64 {
        self.dpa
    }

    /// Offset from the start of the area.
    pub fn offset(&self) -> u64 {
        self.dpa - self.area.start
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Never true: an extent is not empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The TEE range id it is keyed under.
    pub fn range_id(&self) -> u16 {
        self.id
    }

    /// Its start in this process (the expander's DPA mapping): what the VMM maps into the
    /// guest.
    pub fn host_addr(&self) -> u64 {
        self.area.exp.host_addr() + self.dpa
    }

    /// The DPA of `[off, off+len)` of the extent, if inside it.
    fn at(&self, off: u64, len: usize) -> Result<u64, ExpanderError> {
        let len = len as u64;
        match off.checked_add(len) {
            Some(e) if e <= self.len => Ok(self.dpa + off),
            _ => Err(ExpanderError::OutsideExtent {
                off,
                len,
                size: self.len,
            }),
        }
    }

    /// Host-path read at `off` of the extent, through the device cache.
    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), ExpanderError> {
        let dpa = self.at(off, buf.len())?;
        self.area.exp.read(dpa, buf)
    }

    /// Host-path write at `off` of the extent, through the device cache; not recorded as a
    /// store (and it leaves the pages write-protected, so the next store through the mapping
    /// is).
    pub fn write(&self, off: u64, data: &[u8]) -> Result<(), ExpanderError> {
        let dpa = self.at(off, data.len())?;
        self.area.exp.write(dpa, data)
    }

    /// The pages (indices in the extent, ascending) stored to through the DPA mapping since
    /// the extent was made or since the previous call; each is write-protected again before
    /// this returns, so its next store is reported by the next call. A store racing the call
    /// is reported by it or by the next one. On an error nothing is taken.
    pub fn take_written(&self) -> Result<Vec<u64>, ExpanderError> {
        self.area.exp.memory.take_written(&self.tracker)
    }

    /// Records `pages` as stored to again (a psync that failed after
    /// [`WorkingExtent::take_written`]); pages past the extent are ignored.
    pub fn mark_written(&self, pages: &[u64]) {
        for &p in pages {
            self.tracker.set(p);
        }
    }

    /// Fills of this extent's blocks whose media bytes failed the integrity check (changed,
    /// rolled back to an older write-back, or non-zero where nothing was written back) and
    /// were replaced by zeros, since the extent was made. A caller about to persist the
    /// extent's pages (psync) compares it before and after copying them out.
    pub fn integrity_failures(&self) -> u64 {
        self.tracker.failures()
    }

    /// The page (index in the extent) of the first failed integrity check, if any.
    pub fn first_failed_page(&self) -> Option<u64> {
        self.tracker.first_failed()
    }
}

impl Drop for WorkingExtent {
    fn drop(&mut self) {
        let exp = &self.area.exp;
        let (dpa, len) = (self.dpa, self.len);
        // Dropped from the cache unwritten and zero blocks on the media; then synced.
        if let Err(e) = exp.zero(dpa, len).and_then(|()| exp.persist(dpa, len)) {
            log::error!("cxl: wipe working extent {dpa:#x}+{len:#x}: {e}");
        }
        exp.memory.untrack(&self.tracker);
        if let Err(e) = exp.clear_range_key(self.id) {
            log::error!("cxl: clear the key of working extent {dpa:#x}+{len:#x}: {e}");
            if exp.range_key(self.id).is_some() {
                // Still keyed: keep the range and id out of use rather than hand them out
                // under a key that is still there.
                return;
            }
        }
        self.area.taken.locked().remove(&dpa);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(end: u64) -> Taken {
        Taken { end, id: 0 }
    }

    #[test]
    fn first_fit_takes_the_lowest_gap() {
        let mut m = BTreeMap::new();
        assert_eq!(first_fit(10, 20, &m, 10), Some(10));
        assert_eq!(first_fit(10, 20, &m, 11), None);
        m.insert(12, t(14));
        m.insert(16, t(17));
        assert_eq!(first_fit(10, 20, &m, 2), Some(10));
        assert_eq!(first_fit(10, 20, &m, 3), Some(17));
        assert_eq!(first_fit(10, 20, &m, 4), None);
        assert_eq!(first_fit(10, 20, &m, u64::MAX), None);
    }

    proptest! {
        /// Allocating and freeing at random: every run lies in the area, none overlaps
        /// another, and no lower gap would have held it.
        #[test]
        fn first_fit_never_overlaps(ops in proptest::collection::vec((any::<bool>(), 1u64..8), 1..64)) {
            let (start, end) = (4u64, 36u64);
            let mut m: BTreeMap<u64, Taken> = BTreeMap::new();
            for (alloc, n) in ops {
                if alloc || m.is_empty() {
                    match first_fit(start, end, &m, n) {
                        Some(at) => {
                            prop_assert!(at >= start && at + n <= end);
                            for (&s, tk) in &m {
                                prop_assert!(at + n <= s || at >= tk.end, "overlap");
                            }
                            for lower in start..at {
                                let free = m.iter().all(|(&s, tk)| lower + n <= s || lower >= tk.end);
                                prop_assert!(!free, "gap at {} was free", lower);
                            }
                            m.insert(at, t(at + n));
                        }
                        None => {
                            for lower in start..=end.saturating_sub(n) {
                                let free = m.iter().all(|(&s, tk)| lower + n <= s || lower >= tk.end);
                                prop_assert!(!free, "refused with room at {}", lower);
                            }
                        }
                    }
                } else {
                    let k = *m.keys().nth(n as usize % m.len()).unwrap();
                    m.remove(&k);
                }
            }
        }
    }
}
