//! The pager: the window of plaintext working copies and its fault service.
//!
//! The window is anonymous host memory registered with userfaultfd and
//! mapped into the guest (a KVM memslot behind the device's shared-memory
//! BAR). A page that is not present has not been decrypted yet. The guest's
//! first touch is a stage-2 fault that KVM resolves through the host page
//! tables, which userfaultfd turns into a message for the fault service: it
//! asks the attachment's [`PageSource`] (a store session) for the verified
//! plaintext and installs it with `UFFDIO_COPY`. Writable attachments get
//! their pages write-protected at install time so the first write faults
//! once more: that is the dirty set `psync` needs.
//!
//! A page that fails verification is never installed. The page is made
//! inaccessible instead and counted in [`Pager::refused_pages`]; KVM then
//! returns `EFAULT` to the vCPU that touched it, and the VMM re-enters the
//! vCPU until the guest driver, told through the device's event queue, has
//! unmapped that page from every process: the retried access then faults in
//! the guest, whose driver answers it with SIGBUS (see docs/pmo-device.md).
//!
//! Files, one type or concern each: this one holds the [`Pager`], which owns the parts below
//! and wires them. `window.rs` is the window itself (its memory, userfaultfd, which slice
//! owns which pages, every change of a page) and `space.rs` its free space; `slice.rs` one
//! attachment's slice (its page sets, counters, installs), with `bits.rs` (a set of pages),
//! `gate.rs` (the detach gate) and `staging.rs` (trigger pages held back); `fault.rs` is the
//! demand-fault path (fill, verify, install or refuse: the [`FaultHandler`] of the fault
//! threads, which are `uffd::FaultServer`'s), `refusal.rs` what happens to a page that
//! failed; `psync.rs` takes the dirty pages; `prefetch/` is the predictor-driven prefetch
//! (and `bufs.rs` a thread's page buffers); `budget.rs` keeps the window within a DRAM budget
//! by demoting pages to the CXL tier, `tier.rs` is that tier's device memory for dirty pages,
//! `digests.rs` what the store holds for each page; `stats.rs` the per-slice counters;
//! `page_source.rs` the [`PageSource`] trait, `error.rs` the errors.

use locked::Locked;
use std::sync::{Arc, OnceLock};
use threads::ThreadKind;

use pmo_crypto::PAGE;
use pmo_policies::{Placement, Predictor};
use uffd::FaultServer;
pub use uffd::{Fault, FaultHandler, Install, Uffd};

mod bits;
mod budget;
mod bufs;
mod digests;
mod error;
mod fault;
mod gate;
mod page_source;
mod prefetch;
mod psync;
mod refusal;
mod slice;
mod space;
mod staging;
mod stats;
mod tier;
mod window;

pub use budget::TierStats;
pub use bufs::RunBufs;
pub use error::{FillError, PagerError};
pub use page_source::{Detected, PageSource};
pub use slice::PageSets;
pub use stats::{PredictionCounts, PredictionEstimate, SliceStats, HIST_BUCKETS};
pub use tier::TierError;

use budget::DramBudget;
use digests::StoreDigests;
use prefetch::{prefetch_worker, PrefetchJob, Prefetcher};
use refusal::Refusals;
use slice::{PredictState, Slice};
use window::Window;

const PAGE_U64: u64 = PAGE as u64;

/// The window and its fault service.
pub struct Pager {
    window: Window,
    /// Pages refused (failed verification) in live attachments.
    refusals: Refusals,
    /// The fault threads (they hold the pager weakly).
    faults: FaultServer,
    /// Predicted pages on their way into the window, and the worker that fills them.
    prefetch: Prefetcher,
    /// The DRAM budget, if one is set (see `budget.rs`).
    budget: OnceLock<DramBudget>,
}

impl Pager {
    /// Creates a window of `size` bytes served by `threads` fault threads.
    pub fn new(size: u64, threads: usize) -> Result<Arc<Self>, PagerError> {
        let window = Window::new(size)?;
        let pager = Arc::new(Pager {
            window,
            refusals: Refusals::default(),
            faults: FaultServer::new().map_err(PagerError::EventFd)?,
            prefetch: Prefetcher::new(),
            budget: OnceLock::new(),
        });
        let weak = Arc::downgrade(&pager);
        let queue = pager.prefetch.queue();
        let worker = threads::spawn(ThreadKind::PmoPrefetch, "pmo-prefetch", move || {
            prefetch_worker(weak, &queue)
        })
        .map_err(PagerError::Spawn)?;
        pager.prefetch.set_worker(worker);
        pager
            .faults
            .start(
                ThreadKind::PmoFault,
                "pmo-fault",
                pager.window.uffd(),
                Arc::downgrade(&pager),
                threads,
            )
            .map_err(PagerError::Spawn)?;
        Ok(pager)
    }

    /// What one page moved into or out of the CXL expander's device memory costs from now
    /// on: installs into and psync reads of a working copy on the device (LPMO CF), and
    /// dirty pages demoted to or promoted from device memory under a DRAM budget. 0 (the
    /// default) charges nothing. The wait is [`pmo_media::charge`]'s, as the
    /// expander's media latency.
    pub fn set_device_memory_latency(&self, per_page: std::time::Duration) {
        self.window.set_device_latency(per_page);
    }

    /// Host address of the window (what the VMM maps into the guest).
    pub fn host_addr(&self) -> u64 {
        self.window.host_addr()
    }

    /// Bytes of the window.
    pub fn size(&self) -> u64 {
        self.window.size()
    }

    /// Gives an attachment of `npages` a slice of the window; returns its byte offset.
    pub fn attach(
        &self,
        source: Arc<dyn PageSource>,
        npages: u64,
    ) -> Result<(u64, Arc<SliceStats>), PagerError> {
        let digests = if source.writable() {
            Some(StoreDigests::new(npages).map_err(PagerError::Key)?)
        } else {
            None
        };
        let slice = self
            .window
            .attach(npages, |start| Slice::new(start, npages, source, digests))?;
        Ok((slice.start * PAGE_U64, slice.stats.clone()))
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
        *self.window.slice_at(offset)?.predict.locked() = predictor.map(|predictor| PredictState {
            predictor,
            singles: 0,
        });
        Ok(())
    }

    /// Which pages of the attachment at `offset` came by demand fault and
    /// which were handed to the prefetch worker, this session.
    pub fn page_sets(&self, offset: u64) -> Result<PageSets, PagerError> {
        Ok(self.window.slice_at(offset)?.page_sets())
    }

    /// Takes the dirty set of the attachment at `offset`, write-protects those
    /// pages again, and hands their current contents to `sink` in page order.
    /// Returns the number of pages handed over.
    pub fn collect_dirty<E>(
        &self,
        offset: u64,
        sink: impl FnOnce(&[(u64, Box<[u8; PAGE]>)]) -> Result<(), E>,
    ) -> Result<Result<u64, E>, PagerError> {
        let slice = self.window.slice_at(offset)?;
        psync::collect_dirty(&self.window, self.budget.get(), &slice, sink)
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
        let slice = self.window.slice_at(offset)?;
        if !Arc::ptr_eq(&slice.stats, owner) {
            return Err(PagerError::NoSlice(offset));
        }
        psync::collect_dirty(&self.window, self.budget.get(), &slice, sink)
    }

    /// Ends the attachment at `offset`: its plaintext leaves the window and the
    /// slice is reusable. Later guest accesses to it get zero pages.
    ///
    /// Fills of this attachment still decrypting may finish later; they find
    /// the slice closing and abandon their install (see `DetachGate::enter`), so
    /// the range is reused only when nothing of this attachment can land in it.
    pub fn detach(&self, offset: u64) -> Result<(), PagerError> {
        let slice = self.window.slice_at(offset)?;
        if !slice.gate.close() {
            // Another detach of it is under way.
            return Err(PagerError::NoSlice(offset));
        }
        slice.drop_staged();
        self.refusals.forget(&slice);
        // Its pages leave the DRAM budget; dirty pages in device memory are dropped
        // (unsynced changes end with the attachment).
        if let Some(b) = self.budget.get() {
            b.release(&slice);
        }
        self.window.detach(&slice, offset)
    }

    /// Pages of live attachments that failed verification and stay
    /// inaccessible: while any exist, a vCPU's `EFAULT` is a guest access to
    /// one of them, not a VMM bug.
    pub fn refused_pages(&self) -> u64 {
        self.refusals.count()
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
        self.refusals.zero_all(&self.window)
    }

    /// Pages of the attachment at `offset` that failed verification so far.
    pub fn poisoned_pages(&self, offset: u64) -> Result<Vec<u64>, PagerError> {
        Ok(self.window.slice_at(offset)?.poisoned.locked().clone())
    }

    /// Predicted pages queued for the prefetch worker and not handled yet: 0 means every
    /// prediction made so far has been installed, staged or dropped (what a test or harness
    /// waits for before it compares).
    pub fn prefetch_backlog(&self) -> u64 {
        self.prefetch.backlog()
    }

    /// Keeps the plaintext in the window within `pages` pages from now on, demoting by
    /// `policy`, dirty pages into a device memory of `spill_pages` pages. Only before the
    /// first attach, and once.
    pub fn set_dram_budget(
        &self,
        pages: u64,
        policy: Box<dyn Placement>,
        spill_pages: u64,
    ) -> Result<(), PagerError> {
        if pages == 0 {
            return Err(PagerError::Budget("a budget of 0 pages".into()));
        }
        if !self.window.is_empty() {
            return Err(PagerError::Budget("attachments exist already".into()));
        }
        let budget = DramBudget::new(pages, policy, spill_pages)?;
        self.budget
            .set(budget)
            .map_err(|_| PagerError::Budget("the budget is set already".into()))
    }

    /// Tiering across all attachments, if a budget is set.
    pub fn tier_stats(&self) -> Option<TierStats> {
        Some(self.budget.get()?.stats())
    }

    /// Stops the fault threads (they also stop when the pager is dropped).
    pub fn shutdown(&self) {
        self.faults.stop();
        self.prefetch.shutdown();
    }

    /// Fills one prediction taken off the queue (by the prefetch worker or a fault thread
    /// between faults).
    fn prefetch(&self, job: &PrefetchJob, bufs: &mut RunBufs) {
        self.prefetch
            .run(&self.window, self.budget.get(), job, bufs);
    }
}

impl Drop for Pager {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod budget_tests;
#[cfg(test)]
mod tests;
