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

use locked::{Locked, RwLocked};
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Instant;

use pmo_policies::{FaultEvent, Predictor};
use pmo_store::crypto::PAGE;
use uffd::AnonMap;
pub use uffd::{Fault, Install, Uffd};
use zeroize::Zeroize;

const PAGE_U64: u64 = PAGE as u64;

/// Errors of the pager.
#[derive(Debug, thiserror::Error)]
pub enum PagerError {
    #[error("window of {0} bytes is not a non-zero multiple of the page size")]
    BadWindowSize(u64),
    #[error("mmap window: {0}")]
    Mmap(io::Error),
    #[error("userfaultfd: {0}")]
    Uffd(io::Error),
    #[error("the window has no room for {0} more pages")]
    WindowFull(u64),
    #[error("no attachment at window offset {0:#x}")]
    NoSlice(u64),
    #[error("spawn fault thread: {0}")]
    Spawn(io::Error),
    #[error("eventfd: {0}")]
    EventFd(io::Error),
    /// Dropping a slice's pages failed: the range is not reused (it may hold plaintext).
    #[error("clear window range at {offset:#x}: {source}")]
    Zap { offset: u64, source: io::Error },
    /// The attachment's detach began: no more psyncs.
    #[error("attachment at window offset {0:#x} is being detached")]
    Detaching(u64),
}

/// Why a page could not be filled.
#[derive(Debug, thiserror::Error)]
pub enum FillError {
    /// Verification failed: the page must never reach the guest.
    #[error("page {0} failed integrity verification")]
    Integrity(u64),
    /// Anything else (medium error, ...): also not installed.
    #[error("page {page}: {why}")]
    Other { page: u64, why: String },
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
    /// Writable attachments track dirty pages.
    fn writable(&self) -> bool;
    /// Told once per refusal of `page` (`OnAccess`, any error) and per page a
    /// prefetch found failing verification (`Ahead`), so the owner can fail
    /// the attachment and tell the guest. Called while the slice is live.
    fn page_failed(&self, _page: u64, _error: &FillError, _how: Detected) {}
}

/// One predicted page for the prefetch worker: install it, or stage it as a trigger.
struct PrefetchJob {
    slice: Arc<Slice>,
    page: u64,
    stage: bool,
    /// Predicted from a write fault: install it writable and dirty (see `predict_after`).
    writing: bool,
}

/// Where fault threads hand predicted pages to the prefetch worker.
type PrefetchQueue = std::sync::mpsc::SyncSender<PrefetchJob>;

/// Predicted pages waiting for the prefetch worker; beyond this they are dropped.
const PREFETCH_BACKLOG: usize = 4096;

/// Fault latency histogram buckets: bucket i counts faults of [2^i, 2^(i+1)) microseconds.
pub const HIST_BUCKETS: usize = 16;

/// A staged trigger page waits this many later faults of its attachment for
/// its first access; then it counts as a wasted prediction.
const STAGE_HORIZON: u64 = 64;
/// Staged trigger pages per attachment; the oldest counts as wasted beyond this.
const STAGE_CAP: usize = 64;
/// Of single-page predictions, one in this many is staged as a trigger.
const SINGLE_TRIGGER_EVERY: u64 = 4;

/// Per-attachment counters, readable while the attachment runs.
#[derive(Default)]
pub struct SliceStats {
    pub faults: AtomicU64,
    pub fault_ns_total: AtomicU64,
    pub pages_decrypted: AtomicU64,
    pub pages_prefetched: AtomicU64,
    pub integrity_failures: AtomicU64,
    pub wp_faults: AtomicU64,
    /// Demand faults on pages that were predicted but not yet installed (late prefetches).
    pub prefetch_late: AtomicU64,
    /// Pages decrypted and verified ahead of time but held back as triggers (see [`Pager::set_predictor`]).
    pub triggers: AtomicU64,
    /// Triggers the guest touched: predictions seen to be used, in time.
    pub trigger_hits: AtomicU64,
    /// Triggers never touched within the horizon, or left at detach: wasted predictions.
    pub trigger_wasted: AtomicU64,
    /// Demand faults on pages nobody predicted.
    pub demand_unpredicted: AtomicU64,
    pub fault_hist: [AtomicU64; HIST_BUCKETS],
}

/// Prediction quality of one attachment, as the paper defines it (seed 000
/// §4.2), estimated from what the pager can observe: an installed page is
/// used without a fault, so only triggers and late pages show use. Each
/// ratio is `None` while it has no data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PredictionEstimate {
    /// Pre-populated pages later used / pre-populated pages (from the triggers, a sample).
    pub accuracy: Option<f64>,
    /// Used pages that were pre-populated / used pages.
    pub coverage: Option<f64>,
    /// Pre-populated pages ready before their first use / pre-populated pages used.
    pub timeliness: Option<f64>,
}

impl SliceStats {
    fn record_fault(&self, ns: u64) {
        self.faults.fetch_add(1, Ordering::Relaxed);
        self.fault_ns_total.fetch_add(ns, Ordering::Relaxed);
        let us = (ns / 1000).max(1);
        let bucket = (63 - us.leading_zeros() as usize).min(HIST_BUCKETS - 1);
        self.fault_hist[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// Estimates accuracy, coverage and timeliness from the counters: the
    /// triggers' hit rate stands for the accuracy of every installed
    /// prediction, and late pages are used predictions that were not ready.
    pub fn estimate(&self) -> PredictionEstimate {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64;
        let (hits, wasted) = (get(&self.trigger_hits), get(&self.trigger_wasted));
        let late = get(&self.prefetch_late);
        let accuracy = (hits + wasted > 0.0).then(|| hits / (hits + wasted));
        let used = accuracy.unwrap_or(0.0) * get(&self.pages_prefetched) + hits + late;
        let demand = get(&self.demand_unpredicted);
        PredictionEstimate {
            accuracy,
            coverage: (used + demand > 0.0).then(|| used / (used + demand)),
            timeliness: (used > 0.0).then(|| (used - late) / used),
        }
    }
}

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
    stop: vmm_sys_util::eventfd::EventFd,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Feeds the prefetch worker; dropped at shutdown to stop it.
    prefetch: Mutex<Option<PrefetchQueue>>,
    /// Predicted pages queued for the prefetch worker and not yet handled.
    prefetch_backlog: AtomicU64,
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
            stop: vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK)
                .map_err(PagerError::EventFd)?,
            threads: Mutex::new(Vec::new()),
            prefetch: Mutex::new(None),
            prefetch_backlog: AtomicU64::new(0),
        });
        let (tx, rx) = std::sync::mpsc::sync_channel(PREFETCH_BACKLOG);
        *pager.prefetch.locked() = Some(tx);
        let weak = Arc::downgrade(&pager);
        let worker = std::thread::Builder::new()
            .name("pmo-prefetch".into())
            .spawn(move || prefetch_worker(weak, rx))
            .map_err(PagerError::Spawn)?;
        pager.threads.locked().push(worker);
        for i in 0..threads.max(1) {
            // Threads hold the pager weakly so dropping the last owner stops them.
            let weak = Arc::downgrade(&pager);
            let uffd = pager.uffd.clone();
            let stop = pager.stop.try_clone().map_err(PagerError::EventFd)?;
            let t = std::thread::Builder::new()
                .name(format!("pmo-fault{i}"))
                .spawn(move || serve(weak, &uffd, &stop))
                .map_err(PagerError::Spawn)?;
            pager.threads.locked().push(t);
        }
        Ok(pager)
    }

    /// Host address of the window (what the VMM maps into the guest).
    pub fn host_addr(&self) -> u64 {
        self.map.addr()
    }

    pub fn size(&self) -> u64 {
        self.map.len() as u64
    }

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
                // SAFETY: one page of our window inside this live slice (we
                // hold its gate); it now holds zeros.
                let r = unsafe {
                    libc::mprotect(addr as *mut _, PAGE, libc::PROT_READ | libc::PROT_WRITE)
                };
                if r != 0 {
                    log::error!(
                        "pmo: open refused page {page} as zeros: {}",
                        io::Error::last_os_error()
                    );
                    continue;
                }
                zeroed.push(page);
                n += 1;
            }
        }
        n
    }

    /// Stops the fault threads (they also stop when the pager is dropped).
    pub fn shutdown(&self) {
        let _ = self.stop.write(1);
        // Closing the channel ends the prefetch worker.
        drop(self.prefetch.locked().take());
        let threads = std::mem::take(&mut *self.threads.locked());
        let me = std::thread::current().id();
        for t in threads {
            // The last owner may be a fault thread itself; it must not join itself.
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }

    /// Gives an attachment of `npages` a slice of the window; returns its byte offset.
    pub fn attach(
        &self,
        source: Arc<dyn PageSource>,
        npages: u64,
    ) -> Result<(u64, Arc<SliceStats>), PagerError> {
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

    fn slice_at(&self, offset: u64) -> Result<Arc<Slice>, PagerError> {
        self.slices
            .read_locked()
            .get(&(offset / PAGE_U64))
            .cloned()
            .ok_or(PagerError::NoSlice(offset))
    }

    fn page_addr(&self, slice: &Slice, page: u64) -> u64 {
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

    fn collect_slice_dirty<E>(
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
        let mut pages = Vec::new();
        for (w, word) in slice.dirty.iter().enumerate() {
            let mut bits = word.swap(0, Ordering::AcqRel);
            while bits != 0 {
                let b = bits.trailing_zeros() as u64;
                bits &= bits - 1;
                pages.push(w as u64 * 64 + b);
            }
        }
        // A refused page never holds the attachment's data (it is
        // inaccessible, or zeros): never hand it over, never touch it.
        {
            let poisoned = slice.poisoned.locked();
            if !poisoned.is_empty() {
                pages.retain(|p| !poisoned.contains(p));
            }
        }
        let mut out = Vec::with_capacity(pages.len());
        for page in pages {
            let addr = self.page_addr(&slice, page);
            // Protect first so a concurrent write lands in the next psync's dirty set.
            if let Err(e) = self.uffd.write_protect(addr, PAGE_U64, true) {
                log::warn!("pmo: re-protect page {page}: {e}");
                slice.mark_dirty(page);
            }
            let mut buf = Box::new([0u8; PAGE]);
            // SAFETY: `addr` is a page of our window mapping inside this
            // slice, which cannot be cleared while we hold its gate; if it is
            // not present, the copy faults and the fault service fills it. A
            // raw byte copy tolerates concurrent writes.
            unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), PAGE) };
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
        let n = out.len() as u64;
        let r = sink(&out);
        // The plaintext copies leave memory now.
        for (_, b) in out.iter_mut() {
            zeroize::Zeroize::zeroize(&mut b[..]);
        }
        if r.is_err() {
            // Keep them dirty so a retry writes them.
            for (p, _) in &out {
                slice.mark_dirty(*p);
            }
        }
        Ok(r.map(|()| n))
    }

    /// Drops the pages of `[start, start + npages)` (window pages) and makes
    /// the range accessible again (undoing refusals): the next access of any
    /// of them faults and is served by whoever owns the range then.
    fn zap(&self, start: u64, npages: u64) -> io::Result<()> {
        let addr = (self.host_addr() + start * PAGE_U64) as *mut libc::c_void;
        let len = (npages * PAGE_U64) as usize;
        // SAFETY: the range lies inside our window mapping; dropping anonymous
        // pages zero-fills them on the next (uffd-reported) fault.
        if unsafe { libc::madvise(addr, len, libc::MADV_DONTNEED) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above; only the protection of our own mapping changes.
        if unsafe { libc::mprotect(addr, len, libc::PROT_READ | libc::PROT_WRITE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Returns a range to the free list, merging neighbours.
    fn release_range(&self, start: u64, npages: u64) {
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

    /// Serves one fault.
    pub fn handle(&self, f: Fault, buf: &mut [u8; PAGE]) {
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
            slice.mark_dirty(page);
            slice.stats.wp_faults.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = self.uffd.write_protect(f.address, PAGE_U64, false) {
                log::error!("pmo: unprotect page {page}: {e}");
            }
            return;
        }
        let writable = slice.source.writable();
        // A write fault dirties the page as it is installed (once it holds
        // verified data); otherwise protect it so the first write is seen.
        let dirty_now = writable && f.write;
        let wp = writable && !f.write;
        let now = slice.seq.fetch_add(1, Ordering::AcqRel) + 1;
        if let Some(staged) = slice.take_staged(page) {
            // A trigger: verified already, so this fault costs no crypto.
            slice.stats.trigger_hits.fetch_add(1, Ordering::Relaxed);
            slice.feedback(page, true);
            // Predict before the install wakes the guest: its next touch must
            // find the next batch already on its way.
            self.predict_after(&slice, page, f.tid, f.write);
            slice.stats.record_fault(start.elapsed().as_nanos() as u64);
            if dirty_now {
                slice.mark_dirty(page);
            }
            match slice.enter() {
                Some(_gate) => {
                    self.install(f.address, &staged.data, wp);
                }
                None => self.wake(f.address),
            }
            set_bit(&slice.installed, page);
            clear_bit(&slice.predicted, page);
            slice.expire_staged(now);
            return;
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
                // find the next pages already on their way.
                self.predict_after(&slice, page, f.tid, f.write);
                // Count before installing, for the same reason. The histogram
                // covers lookup, decryption, verification and prediction.
                slice.stats.pages_decrypted.fetch_add(1, Ordering::Relaxed);
                slice.stats.record_fault(start.elapsed().as_nanos() as u64);
                if dirty_now {
                    slice.mark_dirty(page);
                }
                let installed = match slice.enter() {
                    Some(_gate) => self.install(f.address, buf, wp),
                    None => {
                        // Detached while we decrypted: the plaintext stays out.
                        self.wake(f.address);
                        false
                    }
                };
                if !installed {
                    // A racing fault or prefetch installed it first, or detach began.
                    slice.stats.pages_decrypted.fetch_sub(1, Ordering::Relaxed);
                }
                set_bit(&slice.installed, page);
                buf.fill(0);
                slice.expire_staged(now);
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
                    // SAFETY: one page of our window, inside this live slice;
                    // making it inaccessible makes the faulting access fail
                    // (KVM returns EFAULT) instead of retrying.
                    if unsafe { libc::mprotect(f.address as *mut _, PAGE, libc::PROT_NONE) } != 0 {
                        log::error!(
                            "pmo: make refused page {page} inaccessible: {}",
                            io::Error::last_os_error()
                        );
                    }
                    drop(poisoned);
                }
                self.wake(f.address);
            }
        }
    }

    /// Asks the slice's predictor what to pre-populate after a fault on `page`
    /// and queues what is not there yet. Pages predicted from a write fault
    /// of a writable attachment are installed writable and dirty: a stream
    /// being written (an output array) would otherwise take a write-protect
    /// fault on every prefetched page. A wrong guess costs psync one page.
    fn predict_after(&self, slice: &Arc<Slice>, page: u64, tid: u32, write: bool) {
        let mut pages = Vec::new();
        let single_trigger;
        {
            let mut p = slice.predict.locked();
            let Some(st) = p.as_mut() else { return };
            let ev = FaultEvent {
                page,
                npages: slice.npages,
                thread: tid,
            };
            st.predictor.on_fault(&ev, &mut pages);
            pages.retain(|&p| {
                p < slice.npages
                    && !test_bit(&slice.installed, p)
                    && !test_bit(&slice.bad, p)
                    && !set_bit(&slice.predicted, p)
            });
            if pages.len() == 1 {
                st.singles += 1;
            }
            single_trigger = st.singles.is_multiple_of(SINGLE_TRIGGER_EVERY);
        }
        let trigger = match pages.len() {
            0 => return,
            1 if single_trigger => Some(0),
            1 => None,
            n => Some(n / 2),
        };
        let tx = self.prefetch.locked().clone();
        for (i, &p) in pages.iter().enumerate() {
            let job = PrefetchJob {
                slice: slice.clone(),
                page: p,
                stage: trigger == Some(i),
                writing: write,
            };
            // A full backlog drops the prediction: prefetch never delays a fault.
            self.prefetch_backlog.fetch_add(1, Ordering::AcqRel);
            if tx.as_ref().is_none_or(|tx| tx.try_send(job).is_err()) {
                self.prefetch_backlog.fetch_sub(1, Ordering::AcqRel);
                for &q in &pages[i..] {
                    clear_bit(&slice.predicted, q);
                }
                return;
            }
            set_bit(&slice.issued, p);
        }
    }

    /// Pre-populates one predicted page: fill from the source and install it,
    /// unless a fault got there first. A page that fails verification is left
    /// alone: only a real access to it is refused (see `handle`).
    fn prefetch_page(&self, slice: &Slice, job: &PrefetchJob, buf: &mut [u8; PAGE]) {
        let (page, stage) = (job.page, job.stage);
        if slice.closing.load(Ordering::Acquire) || test_bit(&slice.installed, page) {
            return;
        }
        if let Err(e) = slice.source.fill(page, buf) {
            // Not refused (nothing touched it, and a wrong guess must not
            // kill a process), but a page that fails verification is news:
            // the guest driver can unmap it before anything, its own kernel
            // included, reads it.
            if matches!(e, FillError::Integrity(_)) && !set_bit(&slice.bad, page) {
                if let Some(_gate) = slice.enter() {
                    slice
                        .stats
                        .integrity_failures
                        .fetch_add(1, Ordering::Relaxed);
                    slice.source.page_failed(page, &e, Detected::Ahead);
                }
            }
            return;
        }
        if stage {
            let staged = Staged {
                page,
                seq: slice.seq.load(Ordering::Acquire),
                data: Box::new(*buf),
            };
            buf.fill(0);
            // A late fault may have installed it while we decrypted. Staged
            // inside the gate, so detach (which drops the staged pages after
            // waiting for the gate) cannot miss it.
            let Some(gate) = slice.enter() else { return };
            if test_bit(&slice.installed, page) {
                return;
            }
            slice.stats.triggers.fetch_add(1, Ordering::Relaxed);
            slice.staged.locked().push_back(staged);
            drop(gate);
            slice.expire_staged(slice.seq.load(Ordering::Acquire));
            return;
        }
        let addr = self.page_addr(slice, page);
        let writable = slice.source.writable();
        if writable && job.writing {
            slice.mark_dirty(page);
        }
        let installed = match slice.enter() {
            Some(_gate) => self.install(addr, buf, writable && !job.writing),
            None => false,
        };
        buf.fill(0);
        if installed {
            slice.stats.pages_prefetched.fetch_add(1, Ordering::Relaxed);
        }
        set_bit(&slice.installed, page);
    }

    /// Wakes whoever waits on the fault at `addr` without installing anything:
    /// the access retries and faults again if the page is still missing.
    fn wake(&self, addr: u64) {
        if let Err(e) = self.uffd.wake(addr, PAGE_U64) {
            log::error!("pmo: wake {addr:#x}: {e}");
        }
    }

    /// Installs a page, retrying while the kernel asks us to; true if we put it there.
    fn install(&self, addr: u64, page: &[u8; PAGE], wp: bool) -> bool {
        loop {
            match self.uffd.copy(addr, page, wp) {
                Ok(Install::Done) => return true,
                Ok(Install::AlreadyThere) => return false,
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => continue,
                Err(e) => {
                    log::error!("pmo: install page at {addr:#x}: {e}");
                    return false;
                }
            }
        }
    }

    /// Predicted pages queued for the prefetch worker and not handled yet: 0 means every
    /// prediction made so far has been installed, staged or dropped (what a test or harness
    /// waits for before it compares).
    pub fn prefetch_backlog(&self) -> u64 {
        self.prefetch_backlog.load(Ordering::Acquire)
    }

    /// Pages of the attachment at `offset` that failed verification so far.
    pub fn poisoned_pages(&self, offset: u64) -> Result<Vec<u64>, PagerError> {
        Ok(self.slice_at(offset)?.poisoned.locked().clone())
    }
}

/// How long a fault thread keeps looking for the next fault before it
/// sleeps: a workload walking its PMO faults again within microseconds, and
/// catching that fault without a wake-up saves a context switch per page.
const SPIN_AFTER_FAULT: std::time::Duration = std::time::Duration::from_micros(20);

/// Fault thread body: wait on the uffd and the stop eventfd, serve faults
/// while the pager lives. Each thread has its own epoll set with the uffd
/// added `EPOLLEXCLUSIVE`, so one fault wakes one thread, not all of them.
fn serve(pager: std::sync::Weak<Pager>, uffd: &Uffd, stop: &vmm_sys_util::eventfd::EventFd) {
    use std::os::fd::AsRawFd;
    use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
    const UFFD_TOKEN: u64 = 0;
    const STOP_TOKEN: u64 = 1;
    let setup = || -> io::Result<Epoll> {
        let ep = Epoll::new()?;
        ep.ctl(
            ControlOperation::Add,
            uffd.as_raw_fd(),
            EpollEvent::new(EventSet::IN | EventSet::EXCLUSIVE, UFFD_TOKEN),
        )?;
        ep.ctl(
            ControlOperation::Add,
            stop.as_raw_fd(),
            EpollEvent::new(EventSet::IN, STOP_TOKEN),
        )?;
        Ok(ep)
    };
    let epoll = match setup() {
        Ok(ep) => ep,
        Err(e) => {
            log::error!("pmo: fault thread epoll: {e}");
            return;
        }
    };
    let mut events = [EpollEvent::default(); 2];
    let mut buf = Box::new([0u8; PAGE]);
    loop {
        let n = match epoll.wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::error!("pmo: fault thread wait failed: {e}");
                return;
            }
        };
        if events[..n].iter().any(|e| e.data() == STOP_TOKEN) {
            return;
        }
        let mut idle_since = Instant::now();
        loop {
            match uffd.read_fault() {
                Ok(Some(f)) => {
                    match pager.upgrade() {
                        Some(p) => p.handle(f, &mut buf),
                        None => return,
                    }
                    idle_since = Instant::now();
                }
                Ok(None) if idle_since.elapsed() < SPIN_AFTER_FAULT => std::hint::spin_loop(),
                Ok(None) => break,
                Err(e) => {
                    log::error!("pmo: read uffd: {e}");
                    break;
                }
            }
        }
    }
}

/// Prefetch worker body: install predicted pages while the pager lives.
fn prefetch_worker(pager: std::sync::Weak<Pager>, rx: std::sync::mpsc::Receiver<PrefetchJob>) {
    let mut buf = Box::new([0u8; PAGE]);
    while let Ok(job) = rx.recv() {
        let Some(p) = pager.upgrade() else { return };
        p.prefetch_page(&job.slice, &job, &mut buf);
        p.prefetch_backlog.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Pager {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests;
