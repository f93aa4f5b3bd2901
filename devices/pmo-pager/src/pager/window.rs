//! The window: anonymous memory registered with userfaultfd, the slices it is given out in,
//! and every change of its pages (install, wake, protect, drop).

use locked::RwLocked;
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use uffd::{Access, AnonMap, Install, Uffd};

use super::slice::Slice;
use super::space::FreeSpace;
use super::{PagerError, PAGE, PAGE_U64};

/// The window's memory, its userfaultfd, and which slice owns which of its pages.
pub(super) struct Window {
    map: AnonMap,
    uffd: Arc<Uffd>,
    /// Live slices by first window page.
    slices: RwLock<BTreeMap<u64, Arc<Slice>>>,
    /// Window pages no slice holds (taken under the write lock of `slices`).
    free: FreeSpace,
    /// Charged per page moved into or out of the expander's device memory, in ns.
    device_latency_ns: AtomicU64,
}

impl Window {
    /// A window of `size` bytes, registered with a new userfaultfd; every page free.
    pub(super) fn new(size: u64) -> Result<Self, PagerError> {
        if size == 0 || !size.is_multiple_of(PAGE_U64) {
            return Err(PagerError::BadWindowSize(size));
        }
        let len = usize::try_from(size).map_err(|_| PagerError::BadWindowSize(size))?;
        let map = AnonMap::new(len).map_err(PagerError::Mmap)?;
        let uffd = Uffd::new().map_err(PagerError::Uffd)?;
        uffd.register(map.addr(), size).map_err(PagerError::Uffd)?;
        Ok(Window {
            map,
            uffd: Arc::new(uffd),
            slices: RwLock::new(BTreeMap::new()),
            free: FreeSpace::new(size / PAGE_U64),
            device_latency_ns: AtomicU64::new(0),
        })
    }

    /// The userfaultfd the fault threads read.
    pub(super) fn uffd(&self) -> &Arc<Uffd> {
        &self.uffd
    }

    /// Host address of the window.
    #[inline]
    pub(super) fn host_addr(&self) -> u64 {
        self.map.addr()
    }

    /// Bytes of the window.
    #[inline]
    pub(super) fn size(&self) -> u64 {
        self.map.len() as u64
    }

    /// The window page at host address `addr`, if it is in the window.
    #[inline]
    pub(super) fn page_of(&self, addr: u64) -> Option<u64> {
        let base = self.host_addr();
        if addr < base || addr >= base + self.size() {
            return None;
        }
        Some((addr - base) / PAGE_U64)
    }

    /// Host address of `page` of `slice`.
    #[inline]
    pub(super) fn page_addr(&self, slice: &Slice, page: u64) -> u64 {
        self.host_addr() + (slice.start + page) * PAGE_U64
    }

    /// Gives `npages` of free window space to the slice `make` builds for its first page,
    /// and publishes it.
    pub(super) fn attach(
        &self,
        npages: u64,
        make: impl FnOnce(u64) -> Slice,
    ) -> Result<Arc<Slice>, PagerError> {
        // Held while the range is cleared and the slice published: a fault
        // in free window space installs its zero page under the read lock,
        // so that page is either cleared here or never lands in this slice.
        let mut slices = self.slices.write_locked();
        let start = self
            .free
            .take(npages)
            .ok_or(PagerError::WindowFull(npages))?;
        // A guest may have touched this free range (it got zero pages): clear it
        // so every page of the new attachment faults and is filled from its source.
        if let Err(source) = self.zap(start, npages) {
            self.free.release(start, npages);
            return Err(PagerError::Zap {
                offset: start * PAGE_U64,
                source,
            });
        }
        let slice = Arc::new(make(start));
        slices.insert(start, slice.clone());
        Ok(slice)
    }

    /// Unpublishes `slice` (whose gate is closed), drops its pages and frees its range;
    /// `offset` is its byte offset, for errors.
    pub(super) fn detach(&self, slice: &Slice, offset: u64) -> Result<(), PagerError> {
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
        self.free.release(slice.start, slice.npages);
        Ok(())
    }

    /// The slice at byte offset `offset`.
    pub(super) fn slice_at(&self, offset: u64) -> Result<Arc<Slice>, PagerError> {
        self.slice_from(offset / PAGE_U64)
            .ok_or(PagerError::NoSlice(offset))
    }

    /// The slice whose first window page is `start`.
    pub(super) fn slice_from(&self, start: u64) -> Option<Arc<Slice>> {
        self.slices.read_locked().get(&start).cloned()
    }

    /// The live (not detaching) slice holding window page `wpage`. If there is none, runs
    /// `outside` under the read lock first: attach clears a range under the write lock and
    /// detach clears it after unpublishing its slice under the write lock, so whatever
    /// `outside` puts into the page is cleared before the range is anybody's.
    #[inline]
    pub(super) fn live_slice(&self, wpage: u64, outside: impl FnOnce()) -> Option<Arc<Slice>> {
        let slices = self.slices.read_locked();
        let found = slices
            .range(..=wpage)
            .next_back()
            .filter(|(s, sl)| wpage < *s + sl.npages && !sl.gate.closing(Ordering::SeqCst));
        match found {
            Some((_, sl)) => Some(sl.clone()),
            None => {
                outside();
                None
            }
        }
    }

    /// Every live slice.
    pub(super) fn slices(&self) -> Vec<Arc<Slice>> {
        self.slices.read_locked().values().cloned().collect()
    }

    /// Whether no slice is given out.
    pub(super) fn is_empty(&self) -> bool {
        self.slices.read_locked().is_empty()
    }

    /// Installs a page; true if we put it there (false: it was there already, or the
    /// install failed and the access will fault again).
    #[inline]
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

    /// Installs the whole pages of `data` from `addr` with one copy; returns which went in
    /// (bit i for the page at `addr + i * PAGE`), none if the copy failed.
    #[inline]
    pub(super) fn install_pages(&self, addr: u64, data: &[u8], wp: bool) -> u64 {
        match self.uffd.install_pages(addr, data, wp) {
            Ok(mask) => mask,
            Err(e) => {
                log::error!("pmo: install pages at {addr:#x}: {e}");
                0
            }
        }
    }

    /// Wakes whoever waits on the fault at `addr` without installing anything:
    /// the access retries and faults again if the page is still missing.
    #[inline]
    pub(super) fn wake(&self, addr: u64) {
        self.wake_pages(addr, 1);
    }

    /// [`Window::wake`] for `npages` pages from `addr`.
    pub(super) fn wake_pages(&self, addr: u64, npages: u64) {
        if let Err(e) = self.uffd.wake(addr, npages * PAGE_U64) {
            log::error!("pmo: wake {addr:#x}: {e}");
        }
    }

    /// Write-protects the page at `addr` (its next write faults), or lifts that.
    #[inline]
    pub(super) fn write_protect(&self, addr: u64, on: bool) -> io::Result<()> {
        self.uffd.write_protect(addr, PAGE_U64, on)
    }

    /// Sets the access of the page at `addr` (inaccessible for a refused page).
    pub(super) fn protect(&self, addr: u64, access: Access) -> io::Result<()> {
        self.map.protect(addr, PAGE_U64, access)
    }

    /// Drops the page at `addr`: its next access faults.
    pub(super) fn discard(&self, addr: u64) -> io::Result<()> {
        self.map.discard(addr, PAGE_U64)
    }

    /// Drops the pages of `[start, start + npages)` (window pages) and makes
    /// the range accessible again (undoing refusals): the next access of any
    /// of them faults and is served by whoever owns the range then.
    fn zap(&self, start: u64, npages: u64) -> io::Result<()> {
        let addr = self.host_addr() + start * PAGE_U64;
        let len = npages * PAGE_U64;
        self.map.discard(addr, len)?;
        self.map.protect(addr, len, Access::ReadWrite)
    }

    /// What one page moved into or out of the expander's device memory costs from now on.
    pub(super) fn set_device_latency(&self, per_page: Duration) {
        let ns = u64::try_from(per_page.as_nanos()).unwrap_or(u64::MAX);
        self.device_latency_ns.store(ns, Ordering::Relaxed);
    }

    /// Waits out one device-memory page transfer that began at `start`.
    pub(super) fn charge_device(&self, start: Instant) {
        let ns = self.device_latency_ns.load(Ordering::Relaxed);
        pmo_media::charge(start, Duration::from_nanos(ns));
    }
}
