//! Refused pages: a page that failed to fill is made inaccessible, never installed, and
//! reported; later it may be served as zeros, never as data.

use locked::Locked;
use std::sync::atomic::{AtomicU64, Ordering};

use uffd::Access;

use super::page_source::Detected;
use super::slice::Slice;
use super::window::Window;
use super::{FillError, PAGE, PAGE_U64};

/// Pages refused (failed verification) in live attachments; each slice lists its own
/// (`Slice::poisoned`, and of those `Slice::zeroed`).
#[derive(Default)]
pub(super) struct Refusals(AtomicU64);

impl Refusals {
    /// Refused pages of live attachments (see [`Pager::refused_pages`](super::Pager::refused_pages)).
    pub(super) fn count(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// `page` of `slice`, at `addr`, could not be filled (`e`): it is made inaccessible (so
    /// the access that faulted fails instead of retrying), reported once, and the access
    /// woken.
    pub(super) fn refuse(
        &self,
        window: &Window,
        slice: &Slice,
        page: u64,
        addr: u64,
        e: &FillError,
    ) {
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
        if let Some(_gate) = slice.gate.enter() {
            let mut poisoned = slice.poisoned.locked();
            if !poisoned.contains(&page) {
                poisoned.push(page);
                self.0.fetch_add(1, Ordering::AcqRel);
                // Before the vCPU can go on: the attachment fails and
                // the guest hears of it.
                slice.source.page_failed(page, e, Detected::OnAccess);
            }
            // One page of our window, inside this live slice; making it
            // inaccessible makes the faulting access fail (KVM returns EFAULT)
            // instead of retrying.
            if let Err(e) = window.protect(addr, Access::None) {
                log::error!("pmo: make refused page {page} inaccessible: {e}");
            }
            drop(poisoned);
        }
        window.wake(addr);
    }

    /// Serves every refused page of every live slice as zeros from now on (see
    /// [`Pager::zero_refused`](super::Pager::zero_refused)); returns how many pages were
    /// switched.
    pub(super) fn zero_all(&self, window: &Window) -> usize {
        let zeros = [0u8; PAGE];
        let mut n = 0;
        for slice in window.slices() {
            let Some(_gate) = slice.gate.enter() else {
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
                let addr = window.page_addr(&slice, page);
                // Zeros go in while the page is still inaccessible, so no
                // fault can refuse it again between the two steps.
                window.install(addr, &zeros, false);
                // One page of our window inside this live slice (we hold its gate); it
                // now holds zeros.
                if let Err(e) = window.protect(addr, Access::ReadWrite) {
                    log::error!("pmo: open refused page {page} as zeros: {e}");
                    continue;
                }
                zeroed.push(page);
                n += 1;
            }
        }
        n
    }

    /// `slice` is detached: its refused pages no longer count.
    pub(super) fn forget(&self, slice: &Slice) {
        let refused = slice.poisoned.locked().len() as u64;
        self.0.fetch_sub(refused, Ordering::AcqRel);
    }
}
