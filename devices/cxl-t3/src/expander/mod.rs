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
//! present in the mapping, and a clean one is always write-protected. A
//! dirty block is writable, except inside a *working extent* (below), where
//! it may be write-protected again while dirty. A guest write racing an
//! eviction is either before the write-protect (then it is in the copy
//! written back) or blocked by it (then its fault, served after the
//! eviction, fills the block again and the write lands there): no write is
//! lost. Key changes take a reconfiguration lock exclusively, which every
//! other operation holds shared, so no fill or write-back sees half a
//! change.
//!
//! Write tracking (`working.rs`): a [`WorkingExtent`] is a DPA range the VMM
//! maps into the guest whose stores are recorded, one bit per block that
//! survives eviction. A block of such an extent becomes writable in the
//! mapping only in the fault handler (a write fault that fills it, or a
//! write-protect fault that unprotects it), and both set its bit under the
//! set lock first. [`WorkingExtent::take_written`] clears each set bit and
//! write-protects the block (if resident and dirty) under the same lock, so
//! the next store faults again: the write-protect fault handler therefore
//! also serves dirty blocks ("dirty but protected for tracking": set the bit,
//! unprotect, the block stays dirty). So that nothing else makes such a
//! block writable behind the bit, host-path writes into an extent never
//! unprotect: they replace the page with a write-protected copy that holds
//! the write (`UFFDIO_COPY`), and a failed write-back leaves the block
//! protected. Host-path writes set no bit. The extent also keeps a digest of what each of
//! its blocks last wrote to the (untrusted) media, and a fill of the block checks the media's
//! bytes against it before decrypting: a changed or rolled-back block is refused and read as
//! zeros (`working.rs`).
//!
//! Counting: a guest access to a resident block never traps, so guest-path
//! hits are not counted and the guest path updates LRU order only at fills;
//! host-path accesses ([`Expander::read`], [`Expander::write`]) are counted
//! and update LRU on every access.
//!
//! Files: this one holds the expander and its setup; `fault.rs` the block fill and eviction
//! behind a fault; `host.rs` the host path, write-back and shutdown; `keys.rs` the TEE range
//! keys; `medium.rs` the PMO store's medium over an expander; `working.rs` the working area,
//! its extents and their write tracking. The fault threads are `uffd::FaultServer`'s.

mod medium;
mod tracking;
mod working;

pub use medium::{CxlMedium, ExtentKeySource};
pub use working::{WorkingArea, WorkingExtent};

use locked::{Locked, RwLocked};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::time::Duration;

use pmo_crypto::wipe;
use uffd::{AnonMap, Fault, FaultHandler, FaultServer, Install, Uffd, Watch};

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
    /// The media file failed or is not ours.
    #[error("media: {0}")]
    Media(#[from] MediaError),
    /// The cache geometry is impossible.
    #[error("cache: {0}")]
    Cache(#[from] CacheError),
    /// A TEE range or key was refused.
    #[error("tee: {0}")]
    Tee(#[from] TeeError),
    /// A device size that is not whole blocks.
    #[error("device size {0:#x} is not a non-zero multiple of 4 KiB")]
    BadSize(u64),
    /// A host-path access past the end of the device.
    #[error("access {off:#x}+{len:#x} beyond device end {end:#x}")]
    OutOfRange {
        /// Its DPA.
        off: u64,
        /// Its length.
        len: u64,
        /// The device size.
        end: u64,
    },
    /// A system call the expander needs failed.
    #[error("{what}: {source}")]
    Os {
        /// What was being done.
        what: &'static str,
        /// The system's answer.
        source: io::Error,
    },
    /// A working area that is empty, not 4 KiB aligned or not inside the device.
    #[error("working area {start:#x}..{end:#x} is empty, unaligned or beyond the device")]
    BadWorkingArea {
        /// Its start DPA.
        start: u64,
        /// Its exclusive end DPA.
        end: u64,
    },
    /// A working extent length that is not a non-zero multiple of 4 KiB.
    #[error("working extent length {0:#x} is not a non-zero multiple of 4 KiB")]
    BadExtentLen(u64),
    /// No free run of the working area is long enough.
    #[error("no room in the working area for {0:#x} bytes")]
    NoRoom(u64),
    /// Every TEE range id is taken.
    #[error("no free TEE range id for a working extent")]
    NoRangeId,
    /// The random source gave no key.
    #[error("no random bytes for a range key")]
    NoRandom,
    /// An access past the end of a working extent.
    #[error("access {off:#x}+{len:#x} beyond working extent length {size:#x}")]
    OutsideExtent {
        /// Its offset in the extent.
        off: u64,
        /// Its length.
        len: u64,
        /// The extent's length.
        size: u64,
    },
}

fn os(what: &'static str) -> impl FnOnce(io::Error) -> ExpanderError {
    move |source| ExpanderError::Os { what, source }
}

/// Counters beyond the cache model's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExpanderCounters {
    /// Write-protect faults on resident blocks: first writes to clean blocks, and stores to
    /// dirty blocks of a working extent that a take of its written pages protected again.
    pub wp_faults: u64,
    /// Write-protect faults whose block was gone when they were served: a
    /// store that raced an eviction and was held by its write-protect (it
    /// then fills the block again and lands there). Tests use it to know
    /// that they drove that race.
    pub raced_evictions: u64,
    /// Fills and write-backs that failed on the media file.
    pub media_errors: u64,
    /// Fills of working extents' blocks whose media bytes failed the integrity check (see
    /// [`WorkingExtent::integrity_failures`]) and were replaced by zeros.
    pub working_integrity_failures: u64,
    /// Blocks resident in the cache now.
    pub resident: u64,
    /// Of those, dirty.
    pub dirty: u64,
}

/// One CXL Type 3 device's memory, as its owners hold it: the cached media and the fault
/// threads that serve it. Dropping the last `Arc<Expander>` stops and joins the threads first,
/// so the media file is closed (and unlocked) when the drop returns.
pub struct Expander {
    memory: Arc<CachedMedia>,
    faults: FaultServer,
}

/// The DPA space the guest maps (userfaultfd-backed), the device DRAM cache model in front of
/// the media, and the TEE range table. The fault threads hold it weakly.
pub(crate) struct CachedMedia {
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
    /// Working extents' fills refused by the integrity check.
    integrity_failures: AtomicU64,
    /// A clean shutdown is recorded on media; a new write must undo that.
    clean: AtomicBool,
    /// The working extents whose stores are recorded (few; empty unless design `c` runs).
    tracked: RwLock<Vec<Arc<tracking::Tracker>>>,
}

impl std::fmt::Debug for Expander {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Expander")
            .field("size", &self.memory.size)
            .field("media", &self.memory.media)
            .finish_non_exhaustive()
    }
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
        let memory = Arc::new(CachedMedia {
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
            integrity_failures: AtomicU64::new(0),
            clean: AtomicBool::new(false),
            tracked: RwLock::new(Vec::new()),
        });
        let faults = FaultServer::new().map_err(os("eventfd"))?;
        faults
            .start(
                threads::ThreadKind::CxlFault,
                "cxl-fault",
                &memory.uffd,
                Arc::downgrade(&memory),
                FAULT_THREADS,
            )
            .map_err(os("spawn fault thread"))?;
        Ok(Arc::new(Expander { memory, faults }))
    }
}

impl CachedMedia {
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
        self.model.locked().stats()
    }

    /// Counters beyond the cache model's.
    pub fn counters(&self) -> ExpanderCounters {
        let m = self.model.locked();
        ExpanderCounters {
            wp_faults: self.wp_faults.load(Ordering::Relaxed),
            raced_evictions: self.raced_evictions.load(Ordering::Relaxed),
            media_errors: self.media_errors.load(Ordering::Relaxed),
            working_integrity_failures: self.integrity_failures.load(Ordering::Relaxed),
            resident: m.resident(),
            dirty: m.dirty_blocks().len() as u64,
        }
    }

    /// The cache geometry: (sets, ways).
    pub fn geometry(&self) -> (u64, usize) {
        let m = self.model.locked();
        (m.sets(), m.ways())
    }

    fn addr(&self, block: u64) -> u64 {
        self.host_addr() + block * BLOCK
    }

    fn set_lock(&self, block: u64) -> MutexGuard<'_, ()> {
        let set = self.model.locked().set_of(block) as usize;
        // `set_of` is below the number of sets, which is the length of `set_locks`.
        self.set_locks[set % self.set_locks.len()].locked()
    }

    fn reconfig_shared(&self) -> RwLockReadGuard<'_, ()> {
        self.reconfig.read_locked()
    }

    fn tee_read(&self) -> RwLockReadGuard<'_, RangeTable> {
        self.tee.read_locked()
    }
}

/// The owners' view: every operation is the cached media's; the handle only adds the fault
/// threads' lifetime.
impl Expander {
    /// Start of the DPA space in this process: what the VMM maps as a memslot.
    pub fn host_addr(&self) -> u64 {
        self.memory.host_addr()
    }

    /// DPA space size in bytes.
    pub fn size(&self) -> u64 {
        self.memory.size()
    }

    /// Dirty shutdowns recorded on the media (GET_HEALTH_INFO reports it).
    pub fn dirty_shutdown_count(&self) -> u32 {
        self.memory.dirty_shutdown_count()
    }

    /// Cache counters (see the module doc for what the guest path counts).
    pub fn stats(&self) -> CacheStats {
        self.memory.stats()
    }

    /// Counters beyond the cache model's.
    pub fn counters(&self) -> ExpanderCounters {
        self.memory.counters()
    }

    /// The cache geometry: (sets, ways).
    pub fn geometry(&self) -> (u64, usize) {
        self.memory.geometry()
    }

    /// Host-path read of `out.len()` bytes at `dpa`, through the cache (counted).
    pub fn read(&self, dpa: u64, out: &mut [u8]) -> Result<(), ExpanderError> {
        self.memory.read(dpa, out)
    }

    /// Host-path write of `data` at `dpa`, through the cache (counted; marks blocks dirty).
    pub fn write(&self, dpa: u64, data: &[u8]) -> Result<(), ExpanderError> {
        self.memory.write(dpa, data)
    }

    /// Zeroes `[dpa, dpa + len)`: whole blocks on the media directly, without filling them
    /// (see the host path's `zero`); durable after [`Expander::persist`].
    pub fn zero(&self, dpa: u64, len: u64) -> Result<(), ExpanderError> {
        self.memory.zero(dpa, len)
    }

    /// Writes the dirty blocks covering `[dpa, dpa + len)` back to media and syncs it.
    pub fn persist(&self, dpa: u64, len: u64) -> Result<(), ExpanderError> {
        self.memory.persist(dpa, len)
    }

    /// Writes every dirty block back and syncs the media (GPF).
    pub fn flush(&self) -> Result<(), ExpanderError> {
        self.memory.flush()
    }

    /// Flushes and records a clean shutdown on the media.
    pub fn shutdown(&self) -> Result<(), ExpanderError> {
        self.memory.shutdown()
    }

    /// Programs TEE range `id` over DPA `[dpa_start, dpa_end)` with `key`.
    pub fn set_range_key(
        &self,
        id: u16,
        dpa_start: u64,
        dpa_end: u64,
        key: &[u8],
    ) -> Result<(), ExpanderError> {
        self.memory.set_range_key(id, dpa_start, dpa_end, key)
    }

    /// The latency charged per media block transfer (fill or write-back).
    pub fn media_latency(&self) -> Duration {
        self.memory.media.latency()
    }

    /// The DPA range of TEE range `id`, if it is programmed.
    pub fn range_key(&self, id: u16) -> Option<(u64, u64)> {
        self.memory.range_key(id)
    }

    /// Clears TEE range `id` (its cached blocks written back and dropped, its key wiped).
    pub fn clear_range_key(&self, id: u16) -> Result<(), ExpanderError> {
        self.memory.clear_range_key(id)
    }
}

impl Drop for Expander {
    fn drop(&mut self) {
        // No flush and no clean mark here: a drop without `shutdown` is a
        // dirty shutdown, as a VMM crash would be. Joining the threads first drops any
        // reference they hold, so the memory (and the media file) goes with this drop.
        self.faults.stop();
    }
}

impl FaultHandler for CachedMedia {
    /// A block buffer for the fill and one for a victim's write-back.
    type Scratch = (Box<Page>, Box<Page>);

    fn scratch(&self) -> Self::Scratch {
        (Box::new([0u8; PAGE]), Box::new([0u8; PAGE]))
    }

    fn handle(&self, fault: Fault, (buf, vbuf): &mut Self::Scratch, watch: &mut Watch<'_>) {
        self.serve_fault(fault, buf, vbuf, watch);
    }
}

mod fault;
mod host;
mod keys;

#[cfg(test)]
mod tests;
