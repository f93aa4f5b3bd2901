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
use std::sync::atomic::AtomicU64;

use pmo_store::crypto::random_bytes;
use zeroize::Zeroizing;

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
    fn new(id: u16, first: u64, blocks: u64) -> Option<Self> {
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
    fn set(&self, page: u64) {
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
    fn track(&self, t: Arc<Tracker>) {
        self.tracked.write_locked().push(t);
    }

    /// Stops recording stores to a working extent.
    fn untrack(&self, t: &Arc<Tracker>) {
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
    fn range_algorithm(&self) -> Option<Algorithm> {
        self.tee_read().algorithm()
    }

    /// Takes the pages recorded for `t` since the previous take, ascending, and write-protects
    /// each one again (see the module doc). On an error every page taken so far is recorded
    /// again, so nothing is lost.
    fn take_written(&self, t: &Tracker) -> Result<Vec<u64>, ExpanderError> {
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
        self.tracker.failures.load(Ordering::Acquire)
    }

    /// The page (index in the extent) of the first failed integrity check, if any.
    pub fn first_failed_page(&self) -> Option<u64> {
        Some(self.tracker.first_failed.load(Ordering::Acquire)).filter(|p| *p != NO_PAGE)
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
