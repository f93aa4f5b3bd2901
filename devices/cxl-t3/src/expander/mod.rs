//! The expander's memory: the DPA space the guest sees, made of a device
//! DRAM cache over persistent [`Media`], with TEE range encryption between
//! the two.
//!
//! The DPA space is an anonymous host mapping registered with userfaultfd
//! (missing and write-protect faults); the VMM maps it into the guest as a
//! KVM memslot at the committed decoder's HPA. A resident page of the
//! mapping *is* the cached block: the guest reads and writes it at memory
//! speed. A page that is not resident faults; a fault thread then runs the
//! [`CacheModel`]: a miss evicts the set's LRU block (write-protect it, copy
//! it out, encrypt it if keyed, write it to media if dirty, then
//! `MADV_DONTNEED` it so it leaves guest memory) and fills the block (read,
//! decrypt if keyed, install with `UFFDIO_COPY` write-protected so the first
//! write faults once and marks it dirty).
//!
//! Races: every operation on a block (fault, host access, write-back,
//! eviction) holds the lock of the block's cache set, so a block's state
//! changes one step at a time; a resident block in the model is always
//! present in the mapping, a clean one is always write-protected and a
//! dirty one never is. A guest write racing an eviction is either before
//! the write-protect (then it is in the copy written back) or blocked by it
//! (then its fault, served after the eviction, fills the block again and
//! the write lands there): no write is lost. Key changes take a
//! reconfiguration lock exclusively, which every other operation holds
//! shared, so no fill or write-back sees half a change.
//!
//! Counting: a guest access to a resident block never traps, so guest-path
//! hits are not counted and the guest path updates LRU order only at fills;
//! host-path accesses ([`Shared::read`], [`Shared::write`]) are counted
//! and update LRU on every access.

mod medium;

pub use medium::{CxlMedium, ExtentKeys};

use locked::{Locked, RwLocked};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use pmo_store::crypto::wipe;
use uffd::{AnonMap, Fault, Install, Uffd};
use vmm_sys_util::eventfd::EventFd;

use crate::cache::{CacheError, CacheModel, CacheStats, BLOCK, DEFAULT_WAYS};
use crate::media::{Media, MediaError};
use crate::tee::{RangeTable, TeeError};

/// Default device cache: 64 MiB.
pub const DEFAULT_CACHE_BYTES: u64 = 64 << 20;
/// Default media latency per block transfer: 25 µs, a NAND page read.
pub const DEFAULT_MEDIA_LATENCY_NS: u64 = 25_000;
/// Fault threads per expander.
pub const FAULT_THREADS: usize = 2;

const PAGE: usize = BLOCK as usize;
type Page = [u8; PAGE];

/// How an expander is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpanderConfig {
    /// Media file (created sparse if missing).
    pub media: PathBuf,
    /// DPA space size in bytes (a multiple of 4 KiB).
    pub size: u64,
    /// Device cache size in bytes (whole sets of `ways` 4 KiB blocks are used).
    pub cache_bytes: u64,
    /// Cache associativity.
    pub ways: usize,
    /// Latency charged per fill and per write-back.
    pub media_latency_ns: u64,
}

impl ExpanderConfig {
    /// A device of `size` bytes on `media` with the default cache (64 MiB,
    /// 8-way) and media latency (25 µs).
    pub fn new(media: impl Into<PathBuf>, size: u64) -> Self {
        Self {
            media: media.into(),
            size,
            cache_bytes: DEFAULT_CACHE_BYTES,
            ways: DEFAULT_WAYS,
            media_latency_ns: DEFAULT_MEDIA_LATENCY_NS,
        }
    }
}

/// Errors of the expander.
#[derive(Debug, thiserror::Error)]
pub enum ExpanderError {
    #[error("media: {0}")]
    Media(#[from] MediaError),
    #[error("cache: {0}")]
    Cache(#[from] CacheError),
    #[error("tee: {0}")]
    Tee(#[from] TeeError),
    #[error("device size {0:#x} is not a non-zero multiple of 4 KiB")]
    BadSize(u64),
    #[error("access {off:#x}+{len:#x} beyond device end {end:#x}")]
    OutOfRange { off: u64, len: u64, end: u64 },
    #[error("{what}: {source}")]
    Os {
        what: &'static str,
        source: io::Error,
    },
}

fn os(what: &'static str) -> impl FnOnce(io::Error) -> ExpanderError {
    move |source| ExpanderError::Os { what, source }
}

/// Counters beyond the cache model's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExpanderCounters {
    /// First writes to clean resident blocks seen through write protection.
    pub wp_faults: u64,
    /// Write-protect faults whose block was gone when they were served: a
    /// store that raced an eviction and was held by its write-protect (it
    /// then fills the block again and lands there). Tests use it to know
    /// that they drove that race.
    pub raced_evictions: u64,
    /// Fills and write-backs that failed on the media file.
    pub media_errors: u64,
    /// Blocks resident in the cache now.
    pub resident: u64,
    /// Of those, dirty.
    pub dirty: u64,
}

/// One CXL Type 3 device's memory. The handle owns the fault threads:
/// dropping the last `Arc<Expander>` stops and joins them, so the media file
/// is closed (and unlocked) when the drop returns. Everything else is on
/// [`Shared`], reached through `Deref`.
pub struct Expander {
    shared: Arc<Shared>,
    stop: EventFd,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::ops::Deref for Expander {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.shared
    }
}

/// The state the fault threads share with the handle.
pub struct Shared {
    map: AnonMap,
    size: u64,
    uffd: Arc<Uffd>,
    media: Media,
    model: Mutex<CacheModel>,
    /// One per cache set: serializes every block operation of that set.
    set_locks: Vec<Mutex<()>>,
    tee: RwLock<RangeTable>,
    /// Shared by block operations, exclusive for key changes.
    reconfig: RwLock<()>,
    wp_faults: AtomicU64,
    raced_evictions: AtomicU64,
    media_errors: AtomicU64,
    /// A clean shutdown is recorded on media; a new write must undo that.
    clean: AtomicBool,
}

impl std::fmt::Debug for Expander {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Expander")
            .field("size", &self.size)
            .field("media", &self.media)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("size", &self.size)
            .field("media", &self.media)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.locked()
}

/// True if every byte is zero. An OR over the whole block, which the
/// compiler vectorizes; an early-exit scan does not.
fn is_zero(p: &Page) -> bool {
    p.iter().fold(0u8, |acc, &b| acc | b) == 0
}

impl Expander {
    /// Opens the media (creating it if missing), builds the cache and the
    /// uffd-backed DPA space, and starts the fault threads.
    pub fn open(cfg: &ExpanderConfig) -> Result<Arc<Expander>, ExpanderError> {
        if cfg.size == 0 || !cfg.size.is_multiple_of(BLOCK) {
            return Err(ExpanderError::BadSize(cfg.size));
        }
        let len = usize::try_from(cfg.size).map_err(|_| ExpanderError::BadSize(cfg.size))?;
        let model = CacheModel::new(cfg.cache_bytes, cfg.ways)?;
        let (media, report) = Media::open(
            &cfg.media,
            cfg.size,
            Duration::from_nanos(cfg.media_latency_ns),
        )?;
        if report.dirty {
            log::warn!(
                "cxl: {}: the last run did not shut down cleanly (dirty shutdown count {})",
                cfg.media.display(),
                media.dirty_shutdown_count()
            );
        }
        let map = AnonMap::new(len).map_err(os("mmap DPA space"))?;
        let uffd = Uffd::new().map_err(os("userfaultfd"))?;
        uffd.register(map.addr(), cfg.size)
            .map_err(os("register DPA space"))?;
        let sets = model.sets() as usize;
        let shared = Arc::new(Shared {
            map,
            size: cfg.size,
            uffd: Arc::new(uffd),
            media,
            model: Mutex::new(model),
            set_locks: (0..sets).map(|_| Mutex::new(())).collect(),
            tee: RwLock::new(RangeTable::new(cfg.size)),
            reconfig: RwLock::new(()),
            wp_faults: AtomicU64::new(0),
            raced_evictions: AtomicU64::new(0),
            media_errors: AtomicU64::new(0),
            clean: AtomicBool::new(false),
        });
        let exp = Arc::new(Expander {
            shared,
            stop: EventFd::new(libc::EFD_NONBLOCK).map_err(os("eventfd"))?,
            threads: Mutex::new(Vec::new()),
        });
        for i in 0..FAULT_THREADS {
            let shared = exp.shared.clone();
            let stop = exp.stop.try_clone().map_err(os("eventfd"))?;
            let t = std::thread::Builder::new()
                .name(format!("cxl-fault{i}"))
                .spawn(move || serve(&shared, &stop))
                .map_err(os("spawn fault thread"))?;
            lock(&exp.threads).push(t);
        }
        Ok(exp)
    }

    /// Stops and joins the fault threads. Touching the DPA space afterwards
    /// hangs the toucher: only for teardown.
    fn stop_threads(&self) {
        let _ = self.stop.write(1);
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Shared {
    /// Start of the DPA space in this process: what the VMM maps as a memslot.
    pub fn host_addr(&self) -> u64 {
        self.map.addr()
    }

    /// DPA space size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Dirty shutdowns recorded on the media (GET_HEALTH_INFO reports it).
    pub fn dirty_shutdown_count(&self) -> u32 {
        self.media.dirty_shutdown_count()
    }

    /// Cache counters (see the module doc for what the guest path counts).
    pub fn stats(&self) -> CacheStats {
        lock(&self.model).stats()
    }

    /// Counters beyond the cache model's.
    pub fn counters(&self) -> ExpanderCounters {
        let m = lock(&self.model);
        ExpanderCounters {
            wp_faults: self.wp_faults.load(Ordering::Relaxed),
            raced_evictions: self.raced_evictions.load(Ordering::Relaxed),
            media_errors: self.media_errors.load(Ordering::Relaxed),
            resident: m.resident(),
            dirty: m.dirty_blocks().len() as u64,
        }
    }

    /// The cache geometry: (sets, ways).
    pub fn geometry(&self) -> (u64, usize) {
        let m = lock(&self.model);
        (m.sets(), m.ways())
    }

    fn addr(&self, block: u64) -> u64 {
        self.host_addr() + block * BLOCK
    }

    fn set_lock(&self, block: u64) -> MutexGuard<'_, ()> {
        let set = lock(&self.model).set_of(block) as usize;
        // `set_of` is below the number of sets, which is the length of `set_locks`.
        lock(&self.set_locks[set % self.set_locks.len()])
    }

    fn reconfig_shared(&self) -> RwLockReadGuard<'_, ()> {
        self.reconfig.read_locked()
    }

    fn tee_read(&self) -> RwLockReadGuard<'_, RangeTable> {
        self.tee.read_locked()
    }

    /// A block becomes dirty: if a clean shutdown was recorded, the run is
    /// live again on media first.
    fn note_dirty(&self) -> Result<(), ExpanderError> {
        if self.clean.load(Ordering::Acquire) {
            self.media.mark_running()?;
            self.clean.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// Writes a resident block to media without dropping it: protect it
    /// first (later writes fault and wait for our set lock), copy it out,
    /// encrypt if keyed. Caller holds the set lock; the model is unchanged.
    fn write_back_locked(
        &self,
        block: u64,
        tee: &RangeTable,
        buf: &mut Page,
    ) -> Result<(), ExpanderError> {
        let addr = self.addr(block);
        self.uffd
            .write_protect(addr, BLOCK, true)
            .map_err(os("write-protect block"))?;
        // SAFETY: the block is resident (set lock held), so `addr` is a
        // present page of our mapping; the guest cannot write it now.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), PAGE) };
        tee.encrypt_block(block, buf);
        let r = self.media.write_block(block, buf);
        wipe(&mut buf[..]);
        if let Err(e) = r {
            self.media_errors.fetch_add(1, Ordering::Relaxed);
            // Still dirty, so writable again (a dirty block is never
            // protected); should this fail too, the media is failing anyway.
            let _ = self.uffd.write_protect(addr, BLOCK, false);
            return Err(e.into());
        }
        Ok(())
    }

    /// Drops a resident block from the mapping (after any write-back).
    fn discard_locked(&self, block: u64) {
        // SAFETY: one page of our mapping; the next touch faults to us again.
        unsafe { libc::madvise(self.addr(block) as *mut _, PAGE, libc::MADV_DONTNEED) };
    }

    /// Brings a non-resident block in, evicting its set's LRU block if the
    /// set is full. `write` installs it writable and dirty. Caller holds the
    /// set lock and the reconfiguration lock shared.
    fn fill_locked(
        &self,
        block: u64,
        write: bool,
        tee: &RangeTable,
        buf: &mut Page,
        vbuf: &mut Page,
    ) -> Result<(), ExpanderError> {
        if write {
            self.note_dirty()?;
        }
        if let Err(e) = self.media.read_block(block, buf) {
            self.media_errors.fetch_add(1, Ordering::Relaxed);
            return Err(e.into());
        }
        // An all-zero media block was never written: it reads as zeros
        // whether or not the range is keyed.
        if !is_zero(buf) {
            tee.decrypt_block(block, buf);
        }
        let victim = lock(&self.model).peek_victim(block);
        if let Some((v, dirty)) = victim {
            if dirty {
                if let Err(e) = self.write_back_locked(v, tee, vbuf) {
                    wipe(&mut buf[..]);
                    return Err(e);
                }
            }
            self.discard_locked(v);
        }
        lock(&self.model).access(block, write);
        let r = self.install(self.addr(block), buf, !write);
        wipe(&mut buf[..]);
        if r.is_err() {
            // Not present, so not resident: keep the model true to the mapping.
            lock(&self.model).remove(block);
        }
        r
    }

    fn install(&self, addr: u64, page: &Page, wp: bool) -> Result<(), ExpanderError> {
        loop {
            match self.uffd.copy(addr, page, wp) {
                Ok(Install::Done) | Ok(Install::AlreadyThere) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => continue,
                Err(e) => {
                    return Err(ExpanderError::Os {
                        what: "install block",
                        source: e,
                    })
                }
            }
        }
    }

    /// Serves one guest (or host-thread) fault on the DPA space.
    fn handle(&self, f: Fault, buf: &mut Page, vbuf: &mut Page) {
        let base = self.host_addr();
        if f.address < base || f.address >= base + self.size {
            return;
        }
        let block = (f.address - base) / BLOCK;
        let _cfg = self.reconfig_shared();
        let _set = self.set_lock(block);
        let resident = lock(&self.model).lookup(block);
        let r = match resident {
            Some(_) if f.wp || f.write => {
                // First write to a clean block (or a stale write fault).
                self.wp_faults.fetch_add(1, Ordering::Relaxed);
                // Dirty before the unprotect wakes the writer; if the
                // unprotect fails the old bit comes back, so a dirty block
                // is never write-protected (the host path's writes rely on it).
                self.note_dirty().and_then(|()| {
                    let was = lock(&self.model).swap_dirty(block, true);
                    self.uffd
                        .write_protect(f.address, BLOCK, false)
                        .map_err(|e| {
                            if let Some(was) = was {
                                lock(&self.model).swap_dirty(block, was);
                            }
                            ExpanderError::Os {
                                what: "unprotect block",
                                source: e,
                            }
                        })
                })
            }
            // Another fault installed it meanwhile.
            Some(_) => self.uffd.wake(f.address, BLOCK).map_err(os("wake")),
            None => {
                if f.wp {
                    self.raced_evictions.fetch_add(1, Ordering::Relaxed);
                }
                let tee = self.tee_read();
                self.fill_locked(block, f.write || f.wp, &tee, buf, vbuf)
            }
        };
        if let Err(e) = r {
            log::error!("cxl: fault on DPA {:#x}: {e}", block * BLOCK);
            // Let the access retry rather than hang.
            let _ = self.uffd.wake(f.address, BLOCK);
        }
    }

    fn check(&self, off: u64, len: u64) -> Result<(), ExpanderError> {
        match off.checked_add(len) {
            Some(e) if e <= self.size => Ok(()),
            _ => Err(ExpanderError::OutOfRange {
                off,
                len,
                end: self.size,
            }),
        }
    }

    /// Makes `block` resident and usable from this thread, counted as one
    /// cache access, and runs `f` on its page. Caller holds the
    /// reconfiguration lock shared.
    fn host_access(
        &self,
        block: u64,
        write: bool,
        tee: &RangeTable,
        bufs: &mut Option<Box<[Page; 2]>>,
        f: impl FnOnce(*mut u8),
    ) -> Result<(), ExpanderError> {
        let _set = self.set_lock(block);
        let resident = lock(&self.model).lookup(block);
        match resident {
            Some(dirty) => {
                if write && !dirty {
                    // Unprotect before touching it: a write fault here would
                    // wait for the set lock this thread holds.
                    self.note_dirty()?;
                    self.uffd
                        .write_protect(self.addr(block), BLOCK, false)
                        .map_err(os("unprotect block"))?;
                }
                lock(&self.model).access(block, write);
            }
            None => {
                // Buffers only for misses: hits stay allocation-free.
                let [buf, vbuf] = &mut **bufs.get_or_insert_with(|| Box::new([[0u8; PAGE]; 2]));
                self.fill_locked(block, write, tee, buf, vbuf)?;
            }
        }
        f(self.addr(block) as *mut u8);
        Ok(())
    }

    /// Reads DPA bytes through the cache (host path, counted).
    pub fn read(&self, dpa: u64, out: &mut [u8]) -> Result<(), ExpanderError> {
        self.check(dpa, out.len() as u64)?;
        let _cfg = self.reconfig_shared();
        let tee = self.tee_read();
        let mut bufs = None;
        let mut done = 0usize;
        while done < out.len() {
            let at = dpa + done as u64;
            let in_block = (at % BLOCK) as usize;
            let n = (PAGE - in_block).min(out.len() - done);
            let dst = &mut out[done..done + n];
            self.host_access(at / BLOCK, false, &tee, &mut bufs, |page| {
                // SAFETY: `page` is a present page of our mapping (resident,
                // set lock held) and `in_block + n <= PAGE`.
                unsafe { std::ptr::copy_nonoverlapping(page.add(in_block), dst.as_mut_ptr(), n) }
            })?;
            done += n;
        }
        Ok(())
    }

    /// Writes DPA bytes through the cache (host path, counted). Durable only
    /// after [`Shared::persist`] or [`Shared::flush`].
    pub fn write(&self, dpa: u64, data: &[u8]) -> Result<(), ExpanderError> {
        self.check(dpa, data.len() as u64)?;
        let _cfg = self.reconfig_shared();
        let tee = self.tee_read();
        let mut bufs = None;
        let mut done = 0usize;
        while done < data.len() {
            let at = dpa + done as u64;
            let in_block = (at % BLOCK) as usize;
            let n = (PAGE - in_block).min(data.len() - done);
            let src = &data[done..done + n];
            self.host_access(at / BLOCK, true, &tee, &mut bufs, |page| {
                // SAFETY: `page` is a present, writable page of our mapping
                // (resident and unprotected, set lock held); `in_block + n <= PAGE`.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), page.add(in_block), n) }
            })?;
            done += n;
        }
        Ok(())
    }

    /// Writes back one set's dirty blocks that `pick` selects; they stay
    /// resident, clean. Caller holds the reconfiguration lock.
    fn write_back_set(
        &self,
        set: u64,
        tee: &RangeTable,
        buf: &mut Page,
        pick: impl Fn(u64) -> bool,
    ) -> Result<(), ExpanderError> {
        let Some(l) = self.set_locks.get(set as usize) else {
            return Ok(());
        };
        let _set = lock(l);
        let lines = lock(&self.model).set_lines(set);
        let mut first_err = None;
        for (b, dirty) in lines {
            if !dirty || !pick(b) {
                continue;
            }
            match self.write_back_locked(b, tee, buf) {
                Ok(()) => {
                    lock(&self.model).clean(b);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Makes every earlier write inside `[dpa, dpa+len)` durable: writes
    /// back the covered dirty blocks, then `fdatasync`s the media.
    pub fn persist(&self, dpa: u64, len: u64) -> Result<(), ExpanderError> {
        self.check(dpa, len)?;
        if len == 0 {
            return Ok(());
        }
        let first = dpa / BLOCK;
        let last = (dpa + len - 1) / BLOCK;
        let _cfg = self.reconfig_shared();
        let tee = self.tee_read();
        let mut buf = Box::new([0u8; PAGE]);
        let (sets, capacity) = {
            let m = lock(&self.model);
            (m.sets(), m.capacity())
        };
        if last - first + 1 > capacity {
            for set in 0..sets {
                self.write_back_set(set, &tee, &mut buf, |b| (first..=last).contains(&b))?;
            }
        } else {
            for b in first..=last {
                let _set = self.set_lock(b);
                if lock(&self.model).lookup(b) == Some(true) {
                    self.write_back_locked(b, &tee, &mut buf)?;
                    lock(&self.model).clean(b);
                }
            }
        }
        Ok(self.media.sync()?)
    }

    /// GPF: writes back every dirty block (each stays cached, now clean and
    /// write-protected) and `fdatasync`s the media.
    pub fn flush(&self) -> Result<(), ExpanderError> {
        let _cfg = self.reconfig_shared();
        self.flush_locked()
    }

    /// [`Shared::flush`] for a caller that holds the reconfiguration lock.
    fn flush_locked(&self) -> Result<(), ExpanderError> {
        let tee = self.tee_read();
        let mut buf = Box::new([0u8; PAGE]);
        let sets = lock(&self.model).sets();
        let mut first_err = None;
        for set in 0..sets {
            if let Err(e) = self.write_back_set(set, &tee, &mut buf, |_| true) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)?;
        Ok(self.media.sync()?)
    }

    /// Flushes and records a clean shutdown on the media (idempotent). Only
    /// this clears the media's "running" mark: dropping the expander
    /// without it counts as a dirty shutdown at the next open.
    pub fn shutdown(&self) -> Result<(), ExpanderError> {
        // Exclusive: no block can be dirtied between the flush and the
        // clean mark; one dirtied after it finds `clean` set and undoes it.
        let _cfg = self.reconfig.write_locked();
        self.flush_locked()?;
        self.media.mark_clean()?;
        self.clean.store(true, Ordering::Release);
        Ok(())
    }

    /// Writes back and drops every cached block of `[start, end)`. Caller
    /// holds the reconfiguration lock exclusively.
    fn drain_locked(&self, start: u64, end: u64, tee: &RangeTable) -> Result<(), ExpanderError> {
        let range = start / BLOCK..end.div_ceil(BLOCK);
        let mut buf = Box::new([0u8; PAGE]);
        let sets = lock(&self.model).sets();
        for set in 0..sets {
            let Some(l) = self.set_locks.get(set as usize) else {
                continue;
            };
            let _set = lock(l);
            let lines = lock(&self.model).set_lines(set);
            for (b, dirty) in lines {
                if !range.contains(&b) {
                    continue;
                }
                if dirty {
                    self.write_back_locked(b, tee, &mut buf)?;
                    lock(&self.model).clean(b);
                }
                self.discard_locked(b);
                lock(&self.model).remove(b);
            }
        }
        Ok(self.media.sync()?)
    }

    /// Keys DPA `[dpa_start, dpa_end)` (4 KiB aligned, exclusive end) as
    /// range `id`; a 32-byte key selects XTS-AES-128, a 64-byte key
    /// XTS-AES-256 (one algorithm at a time, see [`crate::tee`]). The
    /// range's cached blocks are written back (as they were) and dropped
    /// first, so every later fill decrypts and every later write-back
    /// encrypts. Media already in the range is taken as ciphertext under
    /// this key: programming the key a range was written with makes it read
    /// as plaintext again.
    pub fn set_range_key(
        &self,
        id: u16,
        dpa_start: u64,
        dpa_end: u64,
        key: &[u8],
    ) -> Result<(), ExpanderError> {
        let _cfg = self.reconfig.write_locked();
        {
            let tee = self.tee_read();
            tee.check(id, dpa_start, dpa_end)?;
            self.drain_locked(dpa_start, dpa_end, &tee)?;
        }
        self.tee.write_locked().set(id, dpa_start, dpa_end, key)?;
        Ok(())
    }

    /// The `[start, end)` DPA range keyed as `id`, if any (never the key).
    pub fn range_key(&self, id: u16) -> Option<(u64, u64)> {
        self.tee_read().range_of(id)
    }

    /// Clears range `id`: its cached blocks are written back (encrypted)
    /// and dropped, then its key is wiped. From then on its blocks are
    /// filled without decryption: the range reads as its ciphertext.
    pub fn clear_range_key(&self, id: u16) -> Result<(), ExpanderError> {
        let _cfg = self.reconfig.write_locked();
        let (start, end) = {
            let tee = self.tee_read();
            let (s, e) = tee.range_of(id).ok_or(TeeError::NoSuchId(id))?;
            self.drain_locked(s, e, &tee)?;
            (s, e)
        };
        let cleared = self.tee.write_locked().clear(id)?;
        debug_assert_eq!(cleared, (start, end));
        Ok(())
    }
}

impl Drop for Expander {
    fn drop(&mut self) {
        // No flush and no clean mark here: a drop without `shutdown` is a
        // dirty shutdown, as a VMM crash would be.
        self.stop_threads();
    }
}

/// How long a fault thread polls for the next fault before sleeping.
const SPIN_AFTER_FAULT: Duration = Duration::from_micros(20);

/// Fault thread: waits on the uffd (EPOLLEXCLUSIVE, so one fault wakes one
/// thread) and on the stop eventfd; serves faults while the expander lives.
fn serve(exp: &Shared, stop: &EventFd) {
    let uffd = &*exp.uffd;
    use std::os::fd::AsRawFd;
    use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
    const FAULT: u64 = 0;
    const STOP: u64 = 1;
    let setup = || -> io::Result<Epoll> {
        let ep = Epoll::new()?;
        ep.ctl(
            ControlOperation::Add,
            uffd.as_raw_fd(),
            EpollEvent::new(EventSet::IN | EventSet::EXCLUSIVE, FAULT),
        )?;
        ep.ctl(
            ControlOperation::Add,
            stop.as_raw_fd(),
            EpollEvent::new(EventSet::IN, STOP),
        )?;
        Ok(ep)
    };
    let epoll = match setup() {
        Ok(ep) => ep,
        Err(e) => {
            log::error!("cxl: fault thread epoll: {e}");
            return;
        }
    };
    let mut events = [EpollEvent::default(); 2];
    let mut buf = Box::new([0u8; PAGE]);
    let mut vbuf = Box::new([0u8; PAGE]);
    loop {
        let n = match epoll.wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::error!("cxl: fault thread wait: {e}");
                return;
            }
        };
        if events.iter().take(n).any(|e| e.data() == STOP) {
            return;
        }
        let mut idle = std::time::Instant::now();
        loop {
            match uffd.read_fault() {
                Ok(Some(f)) => {
                    exp.handle(f, &mut buf, &mut vbuf);
                    idle = std::time::Instant::now();
                }
                Ok(None) if idle.elapsed() < SPIN_AFTER_FAULT => std::hint::spin_loop(),
                Ok(None) => break,
                Err(e) => {
                    log::error!("cxl: read uffd: {e}");
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
