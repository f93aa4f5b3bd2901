//! The record a working extent keeps (`working.rs`'s module doc says why): a bit per block
//! for the guest's stores, set by the fault handler and taken for psync; and the digest of
//! what each block last wrote to the media, checked when the block is filled again. With the
//! device-cache hooks that keep them.

use std::sync::atomic::AtomicU64;

use super::*;
use crate::tee::Algorithm;

/// Bits per word of a store bitmap.
const WORD: u64 = 64;

/// No page has failed its integrity check (`Tracker::first_failed`).
const NO_PAGE: u64 = u64::MAX;

/// A media block's digest: the first 16 bytes of its unkeyed BLAKE3 hash, as two words.
type Digest = [u64; 2];

/// The digest of the bytes of a media block. Unkeyed: the digests live only in this process's
/// memory, which the media editor cannot reach, so he can neither read them nor change them;
/// to pass a check he must find other bytes with the same 128-bit hash as the ones written (a
/// second preimage), which a keyless hash resists as well as a keyed one.
fn digest(media: &Page) -> Digest {
    let h = blake3::hash(media);
    let (lo, hi) = h.as_bytes().split_at(8);
    let word = |b: &[u8]| {
        let mut w = [0u8; 8];
        w.iter_mut().zip(b).for_each(|(d, s)| *d = *s);
        u64::from_le_bytes(w)
    };
    [word(lo), word(hi)]
}

/// The store record of one working extent: a bit per block, set by the fault handler; and
/// the digest of what each block last wrote to the media, checked when it is filled again.
pub(super) struct Tracker {
    /// TEE range id of the extent.
    id: u16,
    /// First DPA block.
    first: u64,
    /// Number of blocks.
    blocks: u64,
    bits: Box<[AtomicU64]>,
    /// Per page, the digest of the bytes last written to its media block (valid where
    /// `recorded` has the page's bit). Written and read only under the block's set lock, so
    /// the two words of one digest are never seen half-written.
    digests: Box<[[AtomicU64; 2]]>,
    /// A bit per page: its media block was written (and `digests` holds what) since the
    /// extent was made; clear, the media block must be all zeros.
    recorded: Box<[AtomicU64]>,
    /// Fills whose media bytes failed the check.
    failures: AtomicU64,
    /// The page of the first of them, or [`NO_PAGE`].
    first_failed: AtomicU64,
}

impl Tracker {
    pub(super) fn new(id: u16, first: u64, blocks: u64) -> Option<Self> {
        let words = usize::try_from(blocks.div_ceil(WORD)).ok()?;
        let pages = usize::try_from(blocks).ok()?;
        Some(Self {
            id,
            first,
            blocks,
            bits: (0..words).map(|_| AtomicU64::new(0)).collect(),
            digests: (0..pages)
                .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
                .collect(),
            recorded: (0..words).map(|_| AtomicU64::new(0)).collect(),
            failures: AtomicU64::new(0),
            first_failed: AtomicU64::new(NO_PAGE),
        })
    }

    /// The extent page of DPA block `block`, if it is one of the extent's.
    fn page_of(&self, block: u64) -> Option<u64> {
        block.checked_sub(self.first).filter(|p| *p < self.blocks)
    }

    /// Word and mask of page `page`'s bit.
    fn slot(&self, page: u64) -> Option<(&AtomicU64, u64)> {
        if page >= self.blocks {
            return None;
        }
        let word = self.bits.get(usize::try_from(page / WORD).ok()?)?;
        Some((word, 1u64 << (page % WORD)))
    }

    /// Records a store to extent page `page` (ignored past the extent).
    pub(super) fn set(&self, page: u64) {
        if let Some((word, mask)) = self.slot(page) {
            word.fetch_or(mask, Ordering::AcqRel);
        }
    }

    /// Word and mask of page `page`'s bit in `recorded`, and its digest slot.
    fn digest_slot(&self, page: u64) -> Option<(&AtomicU64, u64, &[AtomicU64; 2])> {
        if page >= self.blocks {
            return None;
        }
        let word = self.recorded.get(usize::try_from(page / WORD).ok()?)?;
        let slot = self.digests.get(usize::try_from(page).ok()?)?;
        Some((word, 1u64 << (page % WORD), slot))
    }

    /// Page `page`'s media block now holds bytes of digest `d`. Under the block's set lock.
    fn record(&self, page: u64, d: Digest) {
        if let Some((word, mask, slot)) = self.digest_slot(page) {
            for (s, w) in slot.iter().zip(d) {
                s.store(w, Ordering::Relaxed);
            }
            word.fetch_or(mask, Ordering::Release);
        }
    }

    /// Page `page`'s media block is all zeros again. Under the block's set lock.
    fn forget(&self, page: u64) {
        if let Some((word, mask, _)) = self.digest_slot(page) {
            word.fetch_and(!mask, Ordering::Release);
        }
    }

    /// Whether `media`, read from page `page`'s media block, is what the extent last wrote
    /// there (or the all-zero block, `zero`, if it wrote nothing). Under the block's set lock.
    fn vouches(&self, page: u64, media: &Page, zero: bool) -> bool {
        let Some((word, mask, slot)) = self.digest_slot(page) else {
            return false;
        };
        if word.load(Ordering::Acquire) & mask == 0 {
            return zero;
        }
        let want = [
            slot[0].load(Ordering::Relaxed),
            slot[1].load(Ordering::Relaxed),
        ];
        digest(media) == want
    }

    /// Fills whose media bytes failed the check.
    pub(super) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Acquire)
    }

    /// The page of the first fill that failed the check.
    pub(super) fn first_failed(&self) -> Option<u64> {
        Some(self.first_failed.load(Ordering::Acquire)).filter(|p| *p != NO_PAGE)
    }

    /// Counts a refused fill of page `page`; true for the extent's first.
    fn refused(&self, page: u64) -> bool {
        let _ =
            self.first_failed
                .compare_exchange(NO_PAGE, page, Ordering::AcqRel, Ordering::Acquire);
        self.failures.fetch_add(1, Ordering::AcqRel) == 0
    }
}

impl CachedMedia {
    /// Starts recording stores to a working extent.
    pub(super) fn track(&self, t: Arc<Tracker>) {
        self.tracked.write_locked().push(t);
    }

    /// Stops recording stores to a working extent.
    pub(super) fn untrack(&self, t: &Arc<Tracker>) {
        self.tracked.write_locked().retain(|x| !Arc::ptr_eq(x, t));
    }

    /// Whether `block` belongs to a working extent.
    pub(super) fn is_tracked(&self, block: u64) -> bool {
        let tracked = self.tracked.read_locked();
        tracked.iter().any(|t| t.page_of(block).is_some())
    }

    /// Records a store to `block` if it belongs to a working extent. The fault handler calls it
    /// under the block's set lock, before the block becomes writable.
    pub(super) fn note_written(&self, block: u64) {
        let tracked = self.tracked.read_locked();
        if let Some((t, page)) = tracked
            .iter()
            .find_map(|t| t.page_of(block).map(|p| (t, p)))
        {
            t.set(page);
        }
    }

    /// Records that `media` (the exact bytes, ciphertext if keyed) is being written to media
    /// block `block`, if the block belongs to a working extent. Every write of a block to the
    /// media under the block's set lock calls it (write-backs, a lost block's last copy);
    /// outside working extents it costs one lookup.
    pub(super) fn note_media_write(&self, block: u64, media: &Page) {
        let tracked = self.tracked.read_locked();
        if let Some((t, page)) = tracked
            .iter()
            .find_map(|t| t.page_of(block).map(|p| (t, p)))
        {
            t.record(page, digest(media));
        }
    }

    /// Records that media block `block` was set to all zeros, if it belongs to a working
    /// extent. Under the block's set lock.
    pub(super) fn note_media_zeroed(&self, block: u64) {
        let tracked = self.tracked.read_locked();
        if let Some((t, page)) = tracked
            .iter()
            .find_map(|t| t.page_of(block).map(|p| (t, p)))
        {
            t.forget(page);
        }
    }

    /// Checks `media`, just read from media block `block` for a fill (`zero`: it is all
    /// zeros), before it is decrypted. True if the block is outside every working extent (not
    /// checked) or holds what its extent last wrote there (the all-zero block if nothing);
    /// false if it is refused, counted and (the extent's first) logged: the caller then
    /// installs zeros instead. Caller holds the block's set lock.
    pub(super) fn vet_fill(&self, block: u64, media: &Page, zero: bool) -> bool {
        let tracked = self.tracked.read_locked();
        let Some((t, page)) = tracked
            .iter()
            .find_map(|t| t.page_of(block).map(|p| (t, p)))
        else {
            return true;
        };
        if t.vouches(page, media, zero) {
            return true;
        }
        self.integrity_failures.fetch_add(1, Ordering::Relaxed);
        if t.refused(page) {
            // Once per extent; no key and no data, only where.
            log::error!(
                "cxl: working extent (range {}) page {page} (DPA {:#x}): media block failed its \
                 integrity check (changed or rolled back behind the device); zeros installed, \
                 further failures of this extent are only counted",
                t.id,
                block.saturating_mul(BLOCK)
            );
        }
        false
    }

    /// Whether TEE range id `id` is a working extent's (the PMO store's medium must then
    /// leave it alone).
    pub(super) fn working_id(&self, id: u16) -> bool {
        self.tracked.read_locked().iter().any(|t| t.id == id)
    }

    /// The range table's algorithm, if one is chosen.
    pub(super) fn range_algorithm(&self) -> Option<Algorithm> {
        self.tee_read().algorithm()
    }

    /// Takes the pages recorded for `t` since the previous take, ascending, and write-protects
    /// each one again (see the module doc). On an error every page taken so far is recorded
    /// again, so nothing is lost.
    pub(super) fn take_written(&self, t: &Tracker) -> Result<Vec<u64>, ExpanderError> {
        let _cfg = self.reconfig_shared();
        let mut out = Vec::new();
        for (w, word) in t.bits.iter().enumerate() {
            let mut pending = word.load(Ordering::Acquire);
            while pending != 0 {
                let bit = u64::from(pending.trailing_zeros());
                let mask = 1u64 << bit;
                pending &= !mask;
                let Some(page) = (w as u64)
                    .checked_mul(WORD)
                    .and_then(|p| p.checked_add(bit))
                    .filter(|p| *p < t.blocks)
                else {
                    continue;
                };
                let block = t.first + page;
                let _set = self.set_lock(block);
                // Cleared and protected under the set lock, which the fault handler holds
                // while it sets the bit and unprotects: a store after the protect faults and
                // sets the bit again for the next take.
                if word.fetch_and(!mask, Ordering::AcqRel) & mask == 0 {
                    // Another take got it.
                    continue;
                }
                // A clean block is already protected; a dirty one may be writable.
                if self.model.locked().lookup(block) == Some(true) {
                    if let Err(e) = self.uffd.write_protect(self.addr(block), BLOCK, true) {
                        word.fetch_or(mask, Ordering::AcqRel);
                        for p in out {
                            t.set(p);
                        }
                        return Err(ExpanderError::Os {
                            what: "write-protect block",
                            source: e,
                        });
                    }
                }
                out.push(page);
            }
        }
        Ok(out)
    }

    /// A host-path write of `src` at byte `in_block` of `block`, a block of a working extent.
    /// Its page must not become writable behind the store record, so the write never
    /// unprotects it: a missing block is filled with the write applied and installed
    /// write-protected (dirty); a resident one is protected, copied out, changed, dropped and
    /// installed again write-protected (dirty). Stores racing it fault and wait for the set
    /// lock, then find the new page. Counted as one cache access, like the untracked path.
    /// Caller holds the reconfiguration lock shared.
    pub(super) fn write_tracked(
        &self,
        block: u64,
        in_block: usize,
        src: &[u8],
        tee: &RangeTable,
        bufs: &mut Option<Box<[Page; 2]>>,
    ) -> Result<(), ExpanderError> {
        let Some(end) = in_block.checked_add(src.len()).filter(|e| *e <= PAGE) else {
            return Err(ExpanderError::OutOfRange {
                off: block.saturating_mul(BLOCK).saturating_add(in_block as u64),
                len: src.len() as u64,
                end: self.size,
            });
        };
        let _set = self.set_lock(block);
        let [buf, vbuf] = &mut **bufs.get_or_insert_with(|| Box::new([[0u8; PAGE]; 2]));
        if self.model.locked().lookup(block).is_none() {
            let how = fault::Fill {
                dirty: true,
                wp: true,
                // A whole-block write uses none of the media's bytes.
                whole: in_block == 0 && end == PAGE,
            };
            return self.fill_with(block, how, tee, (buf, vbuf), |page| {
                if let Some(dst) = page.get_mut(in_block..end) {
                    dst.copy_from_slice(src);
                }
            });
        }
        self.note_dirty()?;
        let addr = self.addr(block);
        self.uffd
            .write_protect(addr, BLOCK, true)
            .map_err(os("write-protect block"))?;
        // SAFETY: the block is resident (set lock held), so `addr` is a present page of our
        // mapping, and write-protected, so no store changes it while it is copied.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), PAGE) };
        if let Some(dst) = buf.get_mut(in_block..end) {
            dst.copy_from_slice(src);
        }
        let r = self.replace_locked(block, buf, tee);
        wipe(&mut buf[..]);
        r?;
        self.model.locked().access(block, true);
        Ok(())
    }

    /// Replaces resident `block`'s page with `page`, installed write-protected. If that fails,
    /// `page` is the only copy of the block's bytes: it goes to the media (encrypted if keyed)
    /// and the block leaves the model, so nothing is lost and the model stays true to the
    /// mapping. Caller holds the set lock; `page` may be left encrypted.
    fn replace_locked(
        &self,
        block: u64,
        page: &mut Page,
        tee: &RangeTable,
    ) -> Result<(), ExpanderError> {
        let addr = self.addr(block);
        self.map.discard(addr, BLOCK).map_err(os("drop block"))?;
        let err = match self.uffd.install(addr, page, true) {
            Ok(Install::Done) => return Ok(()),
            // Faults on the block wait for the set lock this thread holds: cannot happen.
            Ok(Install::AlreadyThere) => ExpanderError::Os {
                what: "replace block",
                source: io::Error::other("block reinstalled by another thread"),
            },
            Err(source) => ExpanderError::Os {
                what: "install block",
                source,
            },
        };
        self.discard_locked(block);
        self.model.locked().remove(block);
        tee.encrypt_block(block, page);
        self.note_media_write(block, page);
        if let Err(e) = self.media.write_block(block, page) {
            self.media_errors.fetch_add(1, Ordering::Relaxed);
            log::error!("cxl: block {block} lost: not reinstalled ({err}) nor written ({e})");
        }
        Err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_bits_stay_inside_the_extent() {
        let tr = Tracker::new(1, 100, 65).unwrap();
        assert_eq!(tr.bits.len(), 2);
        assert_eq!(tr.page_of(99), None);
        assert_eq!(tr.page_of(100), Some(0));
        assert_eq!(tr.page_of(164), Some(64));
        assert_eq!(tr.page_of(165), None);
        tr.set(64);
        tr.set(65);
        tr.set(u64::MAX);
        assert_eq!(tr.bits[1].load(Ordering::Relaxed), 1);
        assert_eq!(tr.bits[0].load(Ordering::Relaxed), 0);
    }

    #[test]
    fn digests_vouch_for_what_was_written_and_nothing_else() {
        let tr = Tracker::new(1, 100, 65).unwrap();
        let zero = [0u8; PAGE];
        let mut a = [0u8; PAGE];
        a[17] = 1;
        let mut b = a;
        b[4095] = 2;
        // Nothing written back: only the all-zero block.
        assert!(tr.vouches(64, &zero, true));
        assert!(!tr.vouches(64, &a, false));
        tr.record(64, digest(&a));
        assert!(tr.vouches(64, &a, false));
        assert!(!tr.vouches(64, &b, false));
        assert!(
            !tr.vouches(64, &zero, true),
            "a written block zeroed behind us"
        );
        // Other pages are untouched by it.
        assert!(tr.vouches(0, &zero, true));
        assert!(tr.vouches(63, &zero, true));
        tr.record(64, digest(&b));
        assert!(!tr.vouches(64, &a, false), "the older write-back");
        assert!(tr.vouches(64, &b, false));
        tr.forget(64);
        assert!(tr.vouches(64, &zero, true));
        assert!(!tr.vouches(64, &b, false));
        // Past the extent: ignored, never vouched for.
        tr.record(65, digest(&a));
        tr.forget(u64::MAX);
        assert!(!tr.vouches(65, &zero, true));
        assert!(!tr.vouches(u64::MAX, &a, false));
        assert_eq!(tr.recorded[1].load(Ordering::Relaxed), 0);
        // Failures: the first page stays, the first one is reported once.
        assert!(tr.refused(7));
        assert!(!tr.refused(3));
        assert_eq!(tr.failures.load(Ordering::Relaxed), 2);
        assert_eq!(tr.first_failed.load(Ordering::Relaxed), 7);
    }
}
