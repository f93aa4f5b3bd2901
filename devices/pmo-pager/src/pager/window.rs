//! The window's space: attachments get a slice of it, give it back at detach (after their
//! plaintext is dropped), and hand their dirty pages to psync.

use super::*;

impl Pager {
    /// Gives an attachment of `npages` a slice of the window; returns its byte offset.
    pub fn attach(
        &self,
        source: Arc<dyn PageSource>,
        npages: u64,
    ) -> Result<(u64, Arc<SliceStats>), PagerError> {
        let on_device = source.working_copy_on_device();
        let digests = if source.writable() {
            Some(digests::StoreDigests::new(npages).map_err(PagerError::Key)?)
        } else {
            None
        };
        // Held while the range is cleared and the slice published: a fault
        // in free window space installs its zero page under the read lock,
        // so that page is either cleared here or never lands in this slice.
        let mut slices = self.slices.write_locked();
        let start = {
            let mut free = self.free.locked();
            let i = free
                .iter()
                .position(|(_, n)| *n >= npages)
                .ok_or(PagerError::WindowFull(npages))?;
            let (s, n) = free[i];
            if n == npages {
                free.remove(i);
            } else {
                free[i] = (s + npages, n - npages);
            }
            s
        };
        // A guest may have touched this free range (it got zero pages): clear it
        // so every page of the new attachment faults and is filled from its source.
        if let Err(source) = self.zap(start, npages) {
            self.release_range(start, npages);
            return Err(PagerError::Zap {
                offset: start * PAGE_U64,
                source,
            });
        }
        let stats = Arc::new(SliceStats::default());
        let slice = Arc::new(Slice {
            start,
            npages,
            source,
            dirty: bitmap(npages),
            installed: bitmap(npages),
            predicted: bitmap(npages),
            filling: bitmap(npages),
            issued: bitmap(npages),
            demand: bitmap(npages),
            bad: bitmap(npages),
            predict: Mutex::new(None),
            staged: Mutex::new(VecDeque::new()),
            seq: AtomicU64::new(0),
            poisoned: Mutex::new(Vec::new()),
            zeroed: Mutex::new(Vec::new()),
            stats: stats.clone(),
            closing: AtomicBool::new(false),
            inflight: AtomicU64::new(0),
            spilled: Mutex::new(BTreeMap::new()),
            demoted: bitmap(npages),
            collecting: AtomicU64::new(0),
            digests,
            on_device,
        });
        slices.insert(start, slice);
        Ok((start * PAGE_U64, stats))
    }

    /// Gives the attachment at `offset` a predictor (or takes it away).
    ///
    /// After each fault it names pages that the prefetch worker decrypts,
    /// verifies and installs off the fault path. A page installed ahead of
    /// time is used without a fault, so its use is invisible; to learn
    /// whether predictions are used, and to keep a stream going, one page of
    /// each batch (its middle) is a *trigger*: verified ahead of time but
    /// held back. Touching it costs a fault without crypto, tells the
    /// predictor the prediction was used and asks it for the next batch; a
    /// trigger untouched for 64 faults is reported wasted. A demand fault on
    /// a page still on its way is reported used (late).
    pub fn set_predictor(
        &self,
        offset: u64,
        predictor: Option<Box<dyn Predictor>>,
    ) -> Result<(), PagerError> {
        *self.slice_at(offset)?.predict.locked() = predictor.map(|predictor| PredictState {
            predictor,
            singles: 0,
        });
        Ok(())
    }

    /// Which pages of the attachment at `offset` came by demand fault and
    /// which were handed to the prefetch worker, this session.
    pub fn page_sets(&self, offset: u64) -> Result<PageSets, PagerError> {
        let slice = self.slice_at(offset)?;
        Ok(PageSets {
            demand: bits_of(&slice.demand),
            prefetched: bits_of(&slice.issued),
        })
    }

    pub(super) fn slice_at(&self, offset: u64) -> Result<Arc<Slice>, PagerError> {
        self.slices
            .read_locked()
            .get(&(offset / PAGE_U64))
            .cloned()
            .ok_or(PagerError::NoSlice(offset))
    }

    pub(super) fn page_addr(&self, slice: &Slice, page: u64) -> u64 {
        self.host_addr() + (slice.start + page) * PAGE_U64
    }

    /// Takes the dirty set of the attachment at `offset`, write-protects those
    /// pages again, and hands their current contents to `sink` in page order.
    /// Returns the number of pages handed over.
    pub fn collect_dirty<E>(
        &self,
        offset: u64,
        sink: impl FnOnce(&[(u64, Box<[u8; PAGE]>)]) -> Result<(), E>,
    ) -> Result<Result<u64, E>, PagerError> {
        self.collect_slice_dirty(self.slice_at(offset)?, sink)
    }

    /// [`Pager::collect_dirty`] of the attachment whose counters are `owner`
    /// (what [`Pager::attach`] returned), and of no other: once that one is
    /// detached, the offset may already belong to a later attachment.
    pub fn collect_dirty_of<E>(
        &self,
        offset: u64,
        owner: &Arc<SliceStats>,
        sink: impl FnOnce(&[(u64, Box<[u8; PAGE]>)]) -> Result<(), E>,
    ) -> Result<Result<u64, E>, PagerError> {
        let slice = self.slice_at(offset)?;
        if !Arc::ptr_eq(&slice.stats, owner) {
            return Err(PagerError::NoSlice(offset));
        }
        self.collect_slice_dirty(slice, sink)
    }

    pub(super) fn collect_slice_dirty<E>(
        &self,
        slice: Arc<Slice>,
        sink: impl FnOnce(&[(u64, Box<[u8; PAGE]>)]) -> Result<(), E>,
    ) -> Result<Result<u64, E>, PagerError> {
        let offset = slice.start * PAGE_U64;
        // Reading the window for this slice: a detach must not clear (and a
        // next attachment refill) the range under the copies.
        let Some(gate) = slice.enter() else {
            return Err(PagerError::Detaching(offset));
        };
        // Under the tier lock: no page is demoted while this psync takes the slice's pages
        // (`collecting`), and the dirty pages already in device memory are read as they are.
        let mut pages = Vec::new();
        let mut out = Vec::new();
        let spilled_pages: Vec<u64>;
        let _collecting = {
            let spilled = slice.spilled.locked();
            slice.collecting.fetch_add(1, Ordering::SeqCst);
            for (w, word) in slice.dirty.iter().enumerate() {
                let mut bits = word.swap(0, Ordering::AcqRel);
                while bits != 0 {
                    let b = bits.trailing_zeros() as u64;
                    bits &= bits - 1;
                    let page = w as u64 * 64 + b;
                    if !spilled.contains_key(&page) {
                        pages.push(page);
                    }
                }
            }
            spilled_pages = spilled.keys().copied().collect();
            self.read_spilled(&spilled, &mut out);
            Collecting(&slice)
        };
        // A refused page never holds the attachment's data (it is
        // inaccessible, or zeros): never hand it over, never touch it.
        {
            let poisoned = slice.poisoned.locked();
            if !poisoned.is_empty() {
                pages.retain(|p| !poisoned.contains(p));
            }
        }
        out.reserve(pages.len());
        for page in pages {
            let addr = self.page_addr(&slice, page);
            // Protect first so a concurrent write lands in the next psync's dirty set.
            if let Err(e) = self.uffd.write_protect(addr, PAGE_U64, true) {
                log::warn!("pmo: re-protect page {page}: {e}");
                slice.mark_dirty(page);
            }
            let mut buf = Box::new([0u8; PAGE]);
            let copied = Instant::now();
            // SAFETY: `addr` is a page of our window mapping inside this
            // slice, which cannot be cleared while we hold its gate; if it is
            // not present, the copy faults and the fault service fills it. A
            // raw byte copy tolerates concurrent writes.
            unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), PAGE) };
            if slice.on_device {
                // Read out of the expander's device memory (LPMO CF).
                self.charge_device(copied);
            }
            out.push((page, buf));
        }
        // A detach that began meanwhile serves this slice's missing pages as
        // zeros: the copies may not be the attachment's data. Hand nothing over.
        let detaching = slice.closing.load(Ordering::SeqCst);
        drop(gate);
        if detaching {
            for (_, b) in out.iter_mut() {
                zeroize::Zeroize::zeroize(&mut b[..]);
            }
            return Err(PagerError::Detaching(offset));
        }
        // Pages that still hold what the store has (reads KVM faulted in for writing, writes
        // of the same bytes) are clean: nothing to write.
        if let Some(d) = &slice.digests {
            out.retain_mut(|(p, b)| {
                let same = d.unchanged(*p, b);
                if same {
                    zeroize::Zeroize::zeroize(&mut b[..]);
                    slice.stats.psync_unchanged.fetch_add(1, Ordering::Relaxed);
                }
                !same
            });
        }
        out.sort_unstable_by_key(|(p, _)| *p);
        let n = out.len() as u64;
        let r = sink(&out);
        if r.is_ok() {
            // Written: the store holds these now (recorded under the tier lock, see
            // `install_in`); spilled pages are clean and leave device memory.
            if let Some(d) = &slice.digests {
                let _tier = slice.spilled.locked();
                for (p, b) in &out {
                    d.record(*p, &b[..]);
                }
            }
            self.spilled_written(&slice, &spilled_pages);
        }
        // The plaintext copies leave memory now.
        for (_, b) in out.iter_mut() {
            zeroize::Zeroize::zeroize(&mut b[..]);
        }
        if r.is_err() {
            // Keep them dirty so a retry writes them (spilled pages stay spilled, so dirty).
            for (p, _) in &out {
                if !spilled_pages.contains(p) {
                    slice.mark_dirty(*p);
                }
            }
        }
        Ok(r.map(|()| n))
    }

    /// Drops the pages of `[start, start + npages)` (window pages) and makes
    /// the range accessible again (undoing refusals): the next access of any
    /// of them faults and is served by whoever owns the range then.
    pub(super) fn zap(&self, start: u64, npages: u64) -> io::Result<()> {
        let addr = self.host_addr() + start * PAGE_U64;
        let len = npages * PAGE_U64;
        self.map.discard(addr, len)?;
        self.map.protect(addr, len, Access::ReadWrite)
    }

    /// Returns a range to the free list, merging neighbours.
    pub(super) fn release_range(&self, start: u64, npages: u64) {
        let mut free = self.free.locked();
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

    /// Ends the attachment at `offset`: its plaintext leaves the window and the
    /// slice is reusable. Later guest accesses to it get zero pages.
    ///
    /// Fills of this attachment still decrypting may finish later; they find
    /// the slice closing and abandon their install (see [`Slice::enter`]), so
    /// the range is reused only when nothing of this attachment can land in it.
    pub fn detach(&self, offset: u64) -> Result<(), PagerError> {
        let slice = self.slice_at(offset)?;
        if !slice.close() {
            // Another detach of it is under way.
            return Err(PagerError::NoSlice(offset));
        }
        let left = std::mem::take(&mut *slice.staged.locked());
        slice
            .stats
            .trigger_wasted
            .fetch_add(left.len() as u64, Ordering::Relaxed);
        drop(left);
        let refused = slice.poisoned.locked().len() as u64;
        self.refused.fetch_sub(refused, Ordering::AcqRel);
        // Its pages leave the DRAM budget; dirty pages in device memory are dropped
        // (unsynced changes end with the attachment).
        self.release_budget(&slice);
        // Unpublish before clearing: a fault that still finds the slice
        // installs its zero page under the read lock, so before this.
        self.slices.write_locked().remove(&slice.start);
        if let Err(source) = self.zap(slice.start, slice.npages) {
            // Never hand out a range that may still hold this attachment's plaintext.
            log::error!(
                "pmo: cannot clear the window slice at {offset:#x}; it is not reused: {source}"
            );
            return Err(PagerError::Zap { offset, source });
        }
        self.release_range(slice.start, slice.npages);
        Ok(())
    }
}

/// A psync taking a slice's pages: demotion of them waits until it is dropped.
struct Collecting<'a>(&'a Slice);

impl Drop for Collecting<'_> {
    fn drop(&mut self) {
        self.0.collecting.fetch_sub(1, Ordering::SeqCst);
    }
}
