//! The demand-fault path: a touched page is filled from its source, checked, and installed;
//! a page that fails is refused (made inaccessible) and reported, never installed.

use locked::Locked;
use std::sync::atomic::Ordering;
use std::time::Instant;

use uffd::{Fault, FaultHandler, Watch};

use super::budget::DramBudget;
use super::bufs::RunBufs;
use super::slice::{Installed, Slice};
use super::window::Window;
use super::Pager;

impl FaultHandler for Pager {
    type Scratch = RunBufs;

    fn scratch(&self) -> Self::Scratch {
        RunBufs::new()
    }

    /// Serves one fault.
    fn handle(&self, f: Fault, bufs: &mut Self::Scratch, watch: &mut Watch<'_>) {
        let start = Instant::now();
        let buf = bufs.page();
        let window = &self.window;
        let Some(wpage) = window.page_of(f.address) else {
            return;
        };
        let found = window.live_slice(wpage, || {
            // Outside any live attachment: a free part of the window,
            // or one being detached. Give it zeros (never anybody's
            // plaintext) so it cannot hang a vCPU. Under the read
            // lock: attach clears a range under the write lock, and
            // detach clears it after unpublishing the slice under the
            // write lock, so this page is cleared before the range
            // is anybody's.
            if f.wp {
                // Only a detaching slice has protected pages; they are cleared next.
                if let Err(e) = window.write_protect(f.address, false) {
                    log::error!("pmo: unprotect page of a detaching slice: {e}");
                }
            } else {
                buf.fill(0);
                window.install(f.address, buf, false);
            }
        });
        let Some(slice) = found else {
            return;
        };
        let page = wpage - slice.start;
        let budget = self.budget.get();
        if f.wp {
            first_write(window, budget, &slice, page, f.address);
            return;
        }
        let writable = slice.source.writable();
        // A write fault dirties the page as it is installed (once it holds
        // verified data); otherwise protect it so the first write is seen.
        let dirty_now = writable && f.write;
        let wp = writable && !f.write;
        let now = slice.seq.fetch_add(1, Ordering::AcqRel) + 1;
        if budget.is_some_and(|b| b.promote_spilled(window, &slice, page, buf)) {
            // Its only copy was in device memory: back, dirty, without crypto of the store.
            slice.stats.record_fault(start.elapsed().as_nanos() as u64);
            enforce(window, budget);
            return;
        }
        if let Some(staged) = slice.triggers.take(page) {
            // A trigger: verified already, so this fault costs no crypto.
            slice.stats.trigger_hits.fetch_add(1, Ordering::Relaxed);
            slice.feedback(page, true);
            // Predict before the install wakes the guest: its next touch must find the next
            // batch already queued (the worker is woken after the install).
            let wake = self
                .prefetch
                .predict_after(window, &slice, page, f.tid, f.write);
            slice.stats.record_fault(start.elapsed().as_nanos() as u64);
            if slice.install(window, budget, page, staged.data(), dirty_now, wp) == Installed::Not {
                window.wake(f.address);
            }
            self.prefetch.wake(wake);
            slice.predicted.clear(page);
            slice.expire_staged(now);
            enforce(window, budget);
            return;
        }
        if slice.filling.test(page) {
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
                let late = slice.predicted.test(page);
                if late {
                    slice.stats.prefetch_late.fetch_add(1, Ordering::Relaxed);
                    slice.feedback(page, true);
                } else {
                    slice
                        .stats
                        .demand_unpredicted
                        .fetch_add(1, Ordering::Relaxed);
                }
                slice.demand.set(page);
                // Predict before the install wakes the guest: its next touch must
                // find the next pages already queued (the worker is woken after it).
                let wake = self
                    .prefetch
                    .predict_after(window, &slice, page, f.tid, f.write);
                // Count before installing, for the same reason. The histogram
                // covers lookup, decryption, verification and prediction.
                slice.stats.pages_decrypted.fetch_add(1, Ordering::Relaxed);
                slice.stats.record_fault(start.elapsed().as_nanos() as u64);
                if slice.install(window, budget, page, buf, dirty_now, wp) == Installed::Not {
                    // A racing fault or prefetch installed it first, detach began (the
                    // plaintext stays out), or it was demoted dirty meanwhile (the retry
                    // promotes it).
                    slice.stats.pages_decrypted.fetch_sub(1, Ordering::Relaxed);
                    window.wake(f.address);
                }
                self.prefetch.wake(wake);
                buf.fill(0);
                slice.expire_staged(now);
                enforce(window, budget);
            }
            Err(e) => self.refusals.refuse(window, &slice, page, f.address, &e),
        }
    }

    /// Fills one predicted run: a fault thread spinning between faults would otherwise
    /// take the CPU the prefetch worker needs (a walker, the spinner and the worker on two
    /// CPUs left the worker far behind the walk).
    fn idle(&self, bufs: &mut Self::Scratch, watch: &mut Watch<'_>) -> bool {
        let Some(job) = self.prefetch.take_one(watch) else {
            return false;
        };
        self.prefetch(&job, bufs);
        true
    }
}

/// The first write to an installed page of a writable slice (it was write-protected): the
/// page joins the dirty set and takes writes from now on.
fn first_write(window: &Window, budget: Option<&DramBudget>, slice: &Slice, page: u64, addr: u64) {
    let Some(_gate) = slice.gate.enter() else {
        // Detach began: the retry finds whoever owns the range then.
        window.wake(addr);
        return;
    };
    // Under the tier lock: a demotion either moved the page out before (then the
    // retried access promotes it) or sees it dirty after.
    let spilled = slice.spilled.locked();
    if !slice.installed.test(page) {
        drop(spilled);
        window.wake(addr);
        return;
    }
    slice.mark_dirty(page);
    slice.stats.wp_faults.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = window.write_protect(addr, false) {
        log::error!("pmo: unprotect page {page}: {e}");
    }
    if let Some(b) = budget {
        b.touched(slice, page, true);
    }
}

/// Keeps the window within the DRAM budget, if there is one.
#[inline]
fn enforce(window: &Window, budget: Option<&DramBudget>) {
    if let Some(b) = budget {
        b.enforce(window);
    }
}
