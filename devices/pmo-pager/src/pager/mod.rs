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
//! Files: this one holds the pager, its slices and their bitmaps; `window.rs` gives slices
//! out and takes them back (attach, detach, dirty pages for psync); `fault.rs` is the demand
//! fault path (fill, verify, install or refuse); `prefetch.rs` the predictor-driven prefetch;
//! `stats.rs` the per-slice counters; `budget.rs` keeps the window within a DRAM budget by
//! demoting pages to the CXL tier, `tier.rs` is that tier's device memory for dirty pages.
//! The fault threads are `uffd::FaultServer`'s.

use locked::{Locked, RwLocked};
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Instant;

use pmo_crypto::PAGE;
use pmo_policies::{FaultEvent, Predictor};
use uffd::{Access, AnonMap, FaultServer, Watch};
pub use uffd::{Fault, FaultHandler, Install, Uffd};
use zeroize::Zeroize;

const PAGE_U64: u64 = PAGE as u64;

/// Errors of the pager.
#[derive(Debug, thiserror::Error)]
pub enum PagerError {
    /// A window size of no pages or part of a page.
    #[error("window of {0} bytes is not a non-zero multiple of the page size")]
    BadWindowSize(u64),
    /// The window cannot be mapped.
    #[error("mmap window: {0}")]
    Mmap(io::Error),
    /// The userfaultfd cannot be made or registered.
    #[error("userfaultfd: {0}")]
    Uffd(io::Error),
    /// No free run of the window is that many pages long.
    #[error("the window has no room for {0} more pages")]
    WindowFull(u64),
    /// No attachment starts at that offset.
    #[error("no attachment at window offset {0:#x}")]
    NoSlice(u64),
    /// A fault or prefetch thread cannot be started.
    #[error("spawn fault thread: {0}")]
    Spawn(io::Error),
    /// The fault server's stop notifier cannot be made.
    #[error("eventfd: {0}")]
    EventFd(io::Error),
    /// Dropping a slice's pages failed: the range is not reused (it may hold plaintext).
    #[error("clear window range at {offset:#x}: {source}")]
    Zap {
        /// The slice's window offset.
        offset: u64,
        /// Why.
        source: io::Error,
    },
    /// The attachment's detach began: no more psyncs.
    #[error("attachment at window offset {0:#x} is being detached")]
    Detaching(u64),
    /// A DRAM budget that cannot be set.
    #[error("DRAM budget: {0}")]
    Budget(String),
    /// No key for the slice's page fingerprints could be drawn.
    #[error("page fingerprint key: {0}")]
    Key(pmo_crypto::CryptoError),
}

/// Why a page could not be filled.
#[derive(Debug, thiserror::Error)]
pub enum FillError {
    /// Verification failed: the page must never reach the guest.
    #[error("page {0} failed integrity verification")]
    Integrity(u64),
    /// Anything else (medium error, ...): also not installed.
    #[error("page {page}: {why}")]
    Other {
        /// The page, from the attachment's start.
        page: u64,
        /// What failed, for the log.
        why: String,
    },
}

/// How the pager learnt that a page cannot be served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detected {
    /// An access to the page was refused: whoever touched it is kept out.
    OnAccess,
    /// A prefetch found the page bad before anything touched it.
    Ahead,
}

/// Where an attachment's verified plaintext comes from (a store session).
pub trait PageSource: Send + Sync {
    /// Writes the verified plaintext of `page` into `out`; on error `out` holds no plaintext.
    fn fill(&self, page: u64, out: &mut [u8; PAGE]) -> Result<(), FillError>;
    /// Fills the consecutive pages `first ..`, one per buffer of `out`, in order (a prefetch
    /// run). On a failure at `first + i` returns `i` with the error: `out[i]` holds no
    /// plaintext, `out[..i]` is filled, nothing after `i` was read. A source that can share
    /// work across a run (a store session: one lock, one cipher lookup) overrides this.
    fn fill_run(&self, first: u64, out: &mut [[u8; PAGE]]) -> Result<(), (usize, FillError)> {
        for (i, o) in out.iter_mut().enumerate() {
            self.fill(first + i as u64, o).map_err(|e| (i, e))?;
        }
        Ok(())
    }
    /// Writable attachments track dirty pages.
    fn writable(&self) -> bool;
    /// The attachment's working copy stands for the CXL expander's device memory (LPMO CF)
    /// rather than local DRAM: every page moved into or out of it is charged the device
    /// memory latency ([`Pager::set_device_memory_latency`]) and the DRAM budget does not
    /// count it.
    fn working_copy_on_device(&self) -> bool {
        false
    }
    /// A fill may wait for modelled media time (a store on the expander): the fault thread
    /// hands its watch over first, so other vCPUs' faults are served meanwhile.
    fn fill_waits(&self) -> bool {
        false
    }
    /// Told once per refusal of `page` (`OnAccess`, any error) and per page a
    /// prefetch found failing verification (`Ahead`), so the owner can fail
    /// the attachment and tell the guest. Called while the slice is live.
    fn page_failed(&self, _page: u64, _error: &FillError, _how: Detected) {}
}

/// Prefetch jobs waiting for the prefetch worker; beyond this they are dropped.
const PREFETCH_BACKLOG: usize = 4096;
/// Most pages of one prefetch job: consecutive predicted pages are filled as a run (one
/// lock and cipher lookup of the store session) and installed with one `UFFDIO_COPY`
/// (about 1.0 us a page here against 1.6-1.8 us one page at a time), which wakes a thread
/// waiting on the run once. A run of 64 pages (256 KiB) takes about 120 us; a fault thread
/// that takes one between faults hands its watch over first. (64 is also the most one
/// copy reports on: `Uffd::install_pages`.) In a sequential scan, runs of 16 pages gave 0.45x
/// the throughput of a first-touch scan of anonymous memory here, runs of 64 0.6-0.75x:
/// the walk waits once per run, and each wait ends in a cross-CPU wake-up.
const RUN_PAGES: usize = 64;

/// A staged trigger page waits this many later faults of its attachment for
/// its first access; then it counts as a wasted prediction.
const STAGE_HORIZON: u64 = 64;
/// Staged trigger pages per attachment; the oldest counts as wasted beyond this.
const STAGE_CAP: usize = 64;
/// Of single-page predictions, one in this many is staged as a trigger.
const SINGLE_TRIGGER_EVERY: u64 = 4;

/// The pages of one attachment, per how they arrived: what a harness needs
/// to compute exact prediction metrics against a reference run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageSets {
    /// Pages a demand fault decrypted (nobody predicted them, or the prediction was late).
    pub demand: Vec<u64>,
    /// Every page handed to the prefetch worker (ready in time or not, used or not).
    pub prefetched: Vec<u64>,
}

/// A trigger page: verified plaintext held outside the window until the
/// guest touches it (installed then, at the cost of a fault without crypto)
/// or the horizon passes (wasted). Zeroized when dropped.
struct Staged {
    page: u64,
    /// The attachment's fault count when it was staged.
    seq: u64,
    data: Box<[u8; PAGE]>,
}

impl Drop for Staged {
    fn drop(&mut self) {
        self.data.zeroize();
    }
}

/// A predictor and the pager's bookkeeping for it.
struct PredictState {
    predictor: Box<dyn Predictor>,
    /// Single-page predictions so far (one in [`SINGLE_TRIGGER_EVERY`] is a trigger).
    singles: u64,
}

/// One attachment's slice of the window.
struct Slice {
    start: u64,
    npages: u64,
    source: Arc<dyn PageSource>,
    dirty: Vec<AtomicU64>,
    /// Pages installed (by a fault or a prefetch), so prefetch skips them.
    installed: Vec<AtomicU64>,
    /// Pages handed to the prefetch worker and not yet resolved.
    predicted: Vec<AtomicU64>,
    /// Pages of a queued or running prefetch run: a fault on one leaves it to the run, whose
    /// install wakes the access (or whose release does, when it does not install the page),
    /// rather than decrypting the page a second time.
    filling: Vec<AtomicU64>,
    /// Every page handed to the prefetch worker this session.
    issued: Vec<AtomicU64>,
    /// Pages a demand fault decrypted.
    demand: Vec<AtomicU64>,
    /// Pages a prefetch found failing verification: announced once, never prefetched again.
    bad: Vec<AtomicU64>,
    predict: Mutex<Option<PredictState>>,
    staged: Mutex<VecDeque<Staged>>,
    /// Faults served so far: the clock of the staging horizon.
    seq: AtomicU64,
    poisoned: Mutex<Vec<u64>>,
    /// Refused pages now served as read-only zeros (see `zero_refused`).
    zeroed: Mutex<Vec<u64>>,
    stats: Arc<SliceStats>,
    /// Set once detach began: nothing more of this slice may reach the window
    /// (see [`Slice::enter`]).
    closing: AtomicBool,
    /// Window mutations on behalf of this slice in progress (see [`Slice::enter`]).
    inflight: AtomicU64,
    /// Dirty pages demoted into device memory (their only copy), by page. Its lock is the
    /// slice's tier lock (see `budget.rs`).
    spilled: Mutex<BTreeMap<u64, tier::Spilled>>,
    /// Pages demoted clean and not back yet: a fault on one is a promotion.
    demoted: Vec<AtomicU64>,
    /// Psyncs taking this slice's pages right now: no demotion meanwhile.
    collecting: AtomicU64,
    /// What the store holds for each page (writable slices): a dirty page that still
    /// matches is not written or sealed.
    digests: Option<digests::StoreDigests>,
    /// The working copy is in the expander's device memory (see
    /// [`PageSource::working_copy_on_device`]).
    on_device: bool,
}

/// One window mutation on behalf of a slice in progress; detach waits until it is dropped.
struct InFlight<'a>(&'a Slice);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A bitmap of `n` clear bits.
fn bitmap(n: u64) -> Vec<AtomicU64> {
    (0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect()
}

/// Sets bit `page` of a bitmap; returns whether it was set before.
fn set_bit(bits: &[AtomicU64], page: u64) -> bool {
    bits.get((page / 64) as usize)
        .is_some_and(|w| w.fetch_or(1 << (page % 64), Ordering::AcqRel) & (1 << (page % 64)) != 0)
}

fn clear_bit(bits: &[AtomicU64], page: u64) {
    if let Some(w) = bits.get((page / 64) as usize) {
        w.fetch_and(!(1 << (page % 64)), Ordering::AcqRel);
    }
}

/// The set bits of a bitmap, in order.
fn bits_of(bits: &[AtomicU64]) -> Vec<u64> {
    let mut v = Vec::new();
    for (i, w) in bits.iter().enumerate() {
        let mut b = w.load(Ordering::Acquire);
        while b != 0 {
            v.push(i as u64 * 64 + u64::from(b.trailing_zeros()));
            b &= b - 1;
        }
    }
    v
}

fn test_bit(bits: &[AtomicU64], page: u64) -> bool {
    bits.get((page / 64) as usize)
        .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (page % 64)) != 0)
}

impl Slice {
    /// Admits one change of the window on behalf of this slice (installing a
    /// page, protecting or unprotecting one, copying pages out for psync), or
    /// refuses it once detach began.
    ///
    /// Fills take long (decrypt and verify) and run outside the gate; only
    /// the change itself runs inside. Detach sets `closing` and then waits
    /// until nothing is in flight before it clears the range, so whatever a
    /// late fill would do either happens before the clear or not at all: it
    /// can never land in the next attachment of the range. Both sides use
    /// SeqCst (increment then read `closing`; set `closing` then read the
    /// count), so at least one of them sees the other.
    fn enter(&self) -> Option<InFlight<'_>> {
        self.inflight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(self);
        if self.closing.load(Ordering::SeqCst) {
            return None;
        }
        Some(guard)
    }

    /// Starts detach: refuses new window changes and waits for those in
    /// flight. False if another detach got there first.
    fn close(&self) -> bool {
        if self.closing.swap(true, Ordering::SeqCst) {
            return false;
        }
        // In flight = one ioctl, mprotect or a psync's page copies: short.
        while self.inflight.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        true
    }

    fn mark_dirty(&self, page: u64) {
        set_bit(&self.dirty, page);
    }

    /// How the placement policy names `page` of this slice.
    fn page_ref(&self, page: u64) -> pmo_policies::PageRef {
        pmo_policies::PageRef {
            pmo: self.start,
            page,
        }
    }

    /// Tells the predictor how an earlier prediction of `page` turned out.
    fn feedback(&self, page: u64, used: bool) {
        if let Some(st) = self.predict.locked().as_mut() {
            st.predictor.on_feedback(page, used);
        }
    }

    /// Takes the staged trigger for `page`, if there is one.
    fn take_staged(&self, page: u64) -> Option<Staged> {
        let mut staged = self.staged.locked();
        let i = staged.iter().position(|s| s.page == page)?;
        staged.remove(i)
    }

    /// Counts triggers older than the horizon (or beyond the cap) as wasted
    /// and drops their plaintext; their pages may be predicted again.
    fn expire_staged(&self, now: u64) {
        let mut expired = Vec::new();
        {
            let mut staged = self.staged.locked();
            while let Some(front) = staged.front() {
                if front.seq + STAGE_HORIZON > now && staged.len() <= STAGE_CAP {
                    break;
                }
                if let Some(s) = staged.pop_front() {
                    expired.push(s.page);
                }
            }
        }
        for page in expired {
            clear_bit(&self.predicted, page);
            // A late fault may have installed it meanwhile: then it was used, and counted so.
            if !test_bit(&self.installed, page) {
                self.stats.trigger_wasted.fetch_add(1, Ordering::Relaxed);
                self.feedback(page, false);
            }
        }
    }
}

/// The window and its fault service.
pub struct Pager {
    map: AnonMap,
    uffd: Arc<Uffd>,
    slices: RwLock<BTreeMap<u64, Arc<Slice>>>,
    free: Mutex<Vec<(u64, u64)>>,
    /// Pages refused (failed verification) in live attachments.
    refused: AtomicU64,
    /// The fault threads (they hold the pager weakly).
    faults: FaultServer,
    /// The prefetch worker, joined at shutdown.
    prefetch_worker: Mutex<Option<JoinHandle<()>>>,
    /// Predicted pages for the prefetch worker and the spinning fault threads; closed at
    /// shutdown to stop the worker.
    prefetch: Arc<PrefetchQueue>,
    /// Predicted pages queued for the prefetch worker and not yet handled.
    prefetch_backlog: AtomicU64,
    /// The DRAM budget, if one is set (see `budget.rs`).
    budget: std::sync::OnceLock<budget::DramBudget>,
    /// Charged per page moved into or out of the expander's device memory, in ns.
    device_latency_ns: AtomicU64,
}

impl Pager {
    /// Creates a window of `size` bytes served by `threads` fault threads.
    pub fn new(size: u64, threads: usize) -> Result<Arc<Self>, PagerError> {
        if size == 0 || !size.is_multiple_of(PAGE_U64) {
            return Err(PagerError::BadWindowSize(size));
        }
        let len = usize::try_from(size).map_err(|_| PagerError::BadWindowSize(size))?;
        let map = AnonMap::new(len).map_err(PagerError::Mmap)?;
        let uffd = Uffd::new().map_err(PagerError::Uffd)?;
        uffd.register(map.addr(), size).map_err(PagerError::Uffd)?;
        let pager = Arc::new(Pager {
            map,
            uffd: Arc::new(uffd),
            slices: RwLock::new(BTreeMap::new()),
            free: Mutex::new(vec![(0, size / PAGE_U64)]),
            refused: AtomicU64::new(0),
            faults: FaultServer::new().map_err(PagerError::EventFd)?,
            prefetch_worker: Mutex::new(None),
            prefetch: Arc::new(PrefetchQueue::new()),
            prefetch_backlog: AtomicU64::new(0),
            budget: std::sync::OnceLock::new(),
            device_latency_ns: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&pager);
        let queue = Arc::clone(&pager.prefetch);
        let worker = std::thread::Builder::new()
            .name("pmo-prefetch".into())
            .spawn(move || prefetch_worker(weak, &queue))
            .map_err(PagerError::Spawn)?;
        *pager.prefetch_worker.locked() = Some(worker);
        pager
            .faults
            .start("pmo-fault", &pager.uffd, Arc::downgrade(&pager), threads)
            .map_err(PagerError::Spawn)?;
        Ok(pager)
    }

    /// What one page moved into or out of the CXL expander's device memory costs from now
    /// on: installs into and psync reads of a working copy on the device (LPMO CF), and
    /// dirty pages demoted to or promoted from device memory under a DRAM budget. 0 (the
    /// default) charges nothing. The wait is [`pmo_media::charge`]'s, as the
    /// expander's media latency.
    pub fn set_device_memory_latency(&self, per_page: std::time::Duration) {
        let ns = u64::try_from(per_page.as_nanos()).unwrap_or(u64::MAX);
        self.device_latency_ns.store(ns, Ordering::Relaxed);
    }

    /// Waits out one device-memory page transfer that began at `start`.
    pub(super) fn charge_device(&self, start: Instant) {
        let ns = self.device_latency_ns.load(Ordering::Relaxed);
        pmo_media::charge(start, std::time::Duration::from_nanos(ns));
    }

    /// Host address of the window (what the VMM maps into the guest).
    pub fn host_addr(&self) -> u64 {
        self.map.addr()
    }

    /// Bytes of the window.
    pub fn size(&self) -> u64 {
        self.map.len() as u64
    }

    /// Stops the fault threads (they also stop when the pager is dropped).
    pub fn shutdown(&self) {
        self.faults.stop();
        // Closing the queue ends the prefetch worker; what it still held is dropped.
        let dropped = self.prefetch.close();
        self.prefetch_backlog.fetch_sub(dropped, Ordering::AcqRel);
        if let Some(t) = self.prefetch_worker.locked().take() {
            // The last owner may be the worker itself; it must not join itself.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

impl FaultHandler for Pager {
    type Scratch = prefetch::RunBufs;

    fn scratch(&self) -> Self::Scratch {
        prefetch::run_bufs()
    }

    fn handle(&self, fault: Fault, bufs: &mut Self::Scratch, watch: &mut Watch<'_>) {
        self.serve_fault(fault, bufs.page(), watch);
    }

    /// Fills one predicted run: a fault thread spinning between faults would otherwise
    /// take the CPU the prefetch worker needs (a walker, the spinner and the worker on two
    /// CPUs left the worker far behind the walk).
    fn idle(&self, bufs: &mut Self::Scratch, watch: &mut Watch<'_>) -> bool {
        self.prefetch_one(bufs, watch)
    }
}

impl Drop for Pager {
    fn drop(&mut self) {
        self.shutdown();
    }
}

mod budget;
mod digests;
mod fault;
mod prefetch;
mod stats;
mod tier;
mod window;

pub use budget::TierStats;
pub use prefetch::RunBufs;
pub use tier::TierError;

use prefetch::{prefetch_worker, PrefetchQueue};
pub use stats::{PredictionCounts, PredictionEstimate, SliceStats, HIST_BUCKETS};

#[cfg(test)]
mod budget_tests;
#[cfg(test)]
mod tests;
