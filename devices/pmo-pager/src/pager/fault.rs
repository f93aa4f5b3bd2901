//! The demand-fault path: a touched page is filled from its source, checked, and installed;
//! a page that fails is refused (made inaccessible) and reported, never installed.

use super::budget::Installed;
use super::*;

impl Pager {
    /// Pages of live attachments that failed verification and stay
    /// inaccessible: while any exist, a vCPU's `EFAULT` is a guest access to
    /// one of them, not a VMM bug.
    pub fn refused_pages(&self) -> u64 {
        self.refused.load(Ordering::Acquire)
    }

    /// Serves every refused page as a page of zeros from now on.
    ///
    /// For accesses the guest driver cannot turn into SIGBUS in time (its
    /// kernel reading the page, e.g. `write(2)` straight from a PMO mapping,
    /// on a vCPU that never yields to the driver's work): after the VMM has
    /// waited for the driver, the access completes with zeros, never with
    /// the page's plaintext, and the VM goes on. It is never silent: the
    /// refusal was reported first ([`PageSource::page_failed`]), which fails
    /// the attachment (its psync persists nothing) and makes the guest driver
    /// signal the process. The zeros are writable so a kernel write into the
    /// page completes too; psync never takes refused pages. Returns how many
    /// pages were switched.
    pub fn zero_refused(&self) -> usize {
        let slices: Vec<Arc<Slice>> = self.slices.read_locked().values().cloned().collect();
        let zeros = [0u8; PAGE];
        let mut n = 0;
        for slice in slices {
            let Some(_gate) = slice.enter() else {
                continue;
            };
            // Held throughout: a refusal of the same page (push, then
            // PROT_NONE) cannot interleave with serving it.
            let poisoned = slice.poisoned.locked();
            let mut zeroed = slice.zeroed.locked();
            for &page in poisoned.iter() {
                if zeroed.contains(&page) {
                    continue;
                }
                let addr = self.page_addr(&slice, page);
                // Zeros go in while the page is still inaccessible, so no
                // fault can refuse it again between the two steps.
                self.install(addr, &zeros, false);
                // One page of our window inside this live slice (we hold its gate); it
                // now holds zeros.
                if let Err(e) = self.map.protect(addr, PAGE_U64, Access::ReadWrite) {
                    log::error!("pmo: open refused page {page} as zeros: {e}");
                    continue;
                }
                zeroed.push(page);
                n += 1;
            }
        }
        n
    }

    /// Serves one fault (the body of [`FaultHandler::handle`]).
    pub(super) fn serve_fault(&self, f: Fault, buf: &mut [u8; PAGE], watch: &mut Watch<'_>) {
        let start = Instant::now();
        let base = self.host_addr();
        if f.address < base || f.address >= base + self.size() {
            return;
        }
        let wpage = (f.address - base) / PAGE_U64;
        let slice = {
            let slices = self.slices.read_locked();
            let found = slices
                .range(..=wpage)
                .next_back()
                .filter(|(s, sl)| wpage < *s + sl.npages && !sl.closing.load(Ordering::SeqCst));
            match found {
                Some((_, sl)) => sl.clone(),
                None => {
                    // Outside any live attachment: a free part of the window,
                    // or one being detached. Give it zeros (never anybody's
                    // plaintext) so it cannot hang a vCPU. Under the read
                    // lock: attach clears a range under the write lock, and
                    // detach clears it after unpublishing the slice under the
                    // write lock, so this page is cleared before the range
                    // is anybody's.
                    if f.wp {
                        // Only a detaching slice has protected pages; they are cleared next.
                        if let Err(e) = self.uffd.write_protect(f.address, PAGE_U64, false) {
                            log::error!("pmo: unprotect page of a detaching slice: {e}");
                        }
                    } else {
                        buf.fill(0);
                        self.install(f.address, buf, false);
                    }
                    return;
                }
            }
        };
        let page = wpage - slice.start;
        if f.wp {
            let Some(_gate) = slice.enter() else {
                // Detach began: the retry finds whoever owns the range then.
                self.wake(f.address);
                return;
            };
            // Under the tier lock: a demotion either moved the page out before (then the
            // retried access promotes it) or sees it dirty after.
            let spilled = slice.spilled.locked();
            if !test_bit(&slice.installed, page) {
                drop(spilled);
                self.wake(f.address);
                return;
            }
            slice.mark_dirty(page);
            slice.stats.wp_faults.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = self.uffd.write_protect(f.address, PAGE_U64, false) {
                log::error!("pmo: unprotect page {page}: {e}");
            }
            self.touched(&slice, page, true);
            return;
        }
        let writable = slice.source.writable();
        // A write fault dirties the page as it is installed (once it holds
        // verified data); otherwise protect it so the first write is seen.
        let dirty_now = writable && f.write;
        let wp = writable && !f.write;
        let now = slice.seq.fetch_add(1, Ordering::AcqRel) + 1;
        if self.promote_spilled(&slice, page, buf) {
            // Its only copy was in device memory: back, dirty, without crypto of the store.
            slice.stats.record_fault(start.elapsed().as_nanos() as u64);
            self.enforce_budget();
            return;
        }
        if let Some(staged) = slice.take_staged(page) {
            // A trigger: verified already, so this fault costs no crypto.
            slice.stats.trigger_hits.fetch_add(1, Ordering::Relaxed);
            slice.feedback(page, true);
            // Predict before the install wakes the guest: its next touch must find the next
            // batch already queued (the worker is woken after the install).
            let wake = self.predict_after(&slice, page, f.tid, f.write);
            slice.stats.record_fault(start.elapsed().as_nanos() as u64);
            if self.install_in(&slice, page, &staged.data, dirty_now, wp) == Installed::Not {
                self.wake(f.address);
            }
            self.wake_prefetch(wake);
            clear_bit(&slice.predicted, page);
            slice.expire_staged(now);
            self.enforce_budget();
            return;
        }
        if test_bit(&slice.filling, page) {
            // A prefetch run has it in hand: the run's install wakes this access (its release
            // does, if it cannot install the page). Decrypting it here too would only race
            // the run and split its one install into single pages.
            slice.stats.prefetch_late.fetch_add(1, Ordering::Relaxed);
            slice.feedback(page, true);
            slice.stats.record_fault(start.elapsed().as_nanos() as u64);
            return;
        }
        if slice.source.fill_waits() {
            watch.hand_off();
        }
        match slice.source.fill(page, buf) {
            Ok(()) => {
                let late = test_bit(&slice.predicted, page);
                if late {
                    slice.stats.prefetch_late.fetch_add(1, Ordering::Relaxed);
                    slice.feedback(page, true);
                } else {
                    slice
                        .stats
                        .demand_unpredicted
                        .fetch_add(1, Ordering::Relaxed);
                }
                set_bit(&slice.demand, page);
                // Predict before the install wakes the guest: its next touch must
                // find the next pages already queued (the worker is woken after it).
                let wake = self.predict_after(&slice, page, f.tid, f.write);
                // Count before installing, for the same reason. The histogram
                // covers lookup, decryption, verification and prediction.
                slice.stats.pages_decrypted.fetch_add(1, Ordering::Relaxed);
                slice.stats.record_fault(start.elapsed().as_nanos() as u64);
                if self.install_in(&slice, page, buf, dirty_now, wp) == Installed::Not {
                    // A racing fault or prefetch installed it first, detach began (the
                    // plaintext stays out), or it was demoted dirty meanwhile (the retry
                    // promotes it).
                    slice.stats.pages_decrypted.fetch_sub(1, Ordering::Relaxed);
                    self.wake(f.address);
                }
                self.wake_prefetch(wake);
                buf.fill(0);
                slice.expire_staged(now);
                self.enforce_budget();
            }
            Err(e) => {
                slice
                    .stats
                    .integrity_failures
                    .fetch_add(1, Ordering::Relaxed);
                log::warn!(
                    "pmo: refusing page {page} of window offset {:#x}: {e}",
                    slice.start * PAGE_U64
                );
                // Inside the gate: a refusal landing after detach would make
                // the next attachment's page inaccessible.
                if let Some(_gate) = slice.enter() {
                    let mut poisoned = slice.poisoned.locked();
                    if !poisoned.contains(&page) {
                        poisoned.push(page);
                        self.refused.fetch_add(1, Ordering::AcqRel);
                        // Before the vCPU can go on: the attachment fails and
                        // the guest hears of it.
                        slice.source.page_failed(page, &e, Detected::OnAccess);
                    }
                    // One page of our window, inside this live slice; making it
                    // inaccessible makes the faulting access fail (KVM returns EFAULT)
                    // instead of retrying.
                    if let Err(e) = self.map.protect(f.address, PAGE_U64, Access::None) {
                        log::error!("pmo: make refused page {page} inaccessible: {e}");
                    }
                    drop(poisoned);
                }
                self.wake(f.address);
            }
        }
    }

    /// Wakes whoever waits on the fault at `addr` without installing anything:
    /// the access retries and faults again if the page is still missing.
    pub(super) fn wake(&self, addr: u64) {
        if let Err(e) = self.uffd.wake(addr, PAGE_U64) {
            log::error!("pmo: wake {addr:#x}: {e}");
        }
    }

    /// Installs a page; true if we put it there (false: it was there already, or the
    /// install failed and the access will fault again).
    pub(super) fn install(&self, addr: u64, page: &[u8; PAGE], wp: bool) -> bool {
        match self.uffd.install(addr, page, wp) {
            Ok(Install::Done) => true,
            Ok(Install::AlreadyThere) => false,
            Err(e) => {
                log::error!("pmo: install page at {addr:#x}: {e}");
                false
            }
        }
    }

    /// Pages of the attachment at `offset` that failed verification so far.
    pub fn poisoned_pages(&self, offset: u64) -> Result<Vec<u64>, PagerError> {
        Ok(self.slice_at(offset)?.poisoned.locked().clone())
    }
}
