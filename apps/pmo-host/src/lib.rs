//! Named PMOs for a program on the host: [`PmoHost`] over the real PMO store and the real
//! userfaultfd pager.
//!
//! A program (LMDB through `lmdb-pmo`, the Filebench engine through the comparison harness)
//! creates, attaches, psyncs, detaches and destroys PMOs by name; each attachment is a
//! [`pmo_pager::Attachment`] (a store session serving a slice of the host's pager
//! window), so the program's threads play the vCPUs: their first touch of a page is a fault
//! that the pager's threads answer with the page decrypted and verified by the store session,
//! and a sync collects the pages written since the last one and psyncs them atomically.
//!
//! Besides doing it, the host measures it the way the papers break time down ([`Measurements`]:
//! time in attach, in waiting for a previous background detach = stall, in psync, in detach,
//! and the pager's fault and prediction counters of every attachment), and can record each
//! session's demand and prefetched page sets ([`SessionRecord`]) for exact prediction metrics.
//! With [`HostConfig::nonblocking_detach`] a detach returns as soon as the plaintext is gone
//! from the window and the store's background work has started, and the next attach (or
//! destroy) of the same PMO waits for it: the papers' nonblocking detach and attach stall.
//!
//! Errors are [`HostError`]s; [`HostError::errno`] is what a C caller sees.
//!
//! ```no_run
//! # fn main() -> Result<(), pmo_host::HostError> {
//! use pmo_host::{HostConfig, PmoHost};
//!
//! let host = PmoHost::open_file("/tmp/store.img".as_ref(), 64 << 20, b"tenant key",
//!     HostConfig::default())?;
//! let (addr, len) = host.attach("notes", true, Some(8192))?; // created on first attach
//! // SAFETY: `addr` points to `len` bytes attached for writing.
//! unsafe { addr.as_ptr().write(42) };
//! assert_eq!(host.sync(addr)?, 1); // one dirty page, psynced atomically
//! host.detach(addr)?;
//! # let _ = len; Ok(()) }
//! ```

mod error;
mod meter;

use std::collections::HashMap;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use locked::Locked;
use pmo_crypto::{KdfParams, Suite, UserKey, PAGE};
use pmo_media::FileMedium;
use pmo_pager::{AttachOptions, Attachment, Pager, SliceStats, WorkingPlace};
use pmo_policies::PredictorSpec;
use pmo_store::{CreateOptions, Design, DetachHandle, Perm, Store, StoreError, StoreOptions};

pub use error::HostError;
pub use meter::{Measurements, SessionRecord};

use meter::Meters;

/// How a [`PmoHost`] creates and attaches its PMOs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    /// Design of the PMOs it creates and of every attach session.
    pub design: Design,
    /// Page cipher and tag of the PMOs it creates.
    pub suite: Suite,
    /// Argon2id cost of the PMOs it creates (every attach pays it once).
    pub kdf: KdfParams,
    /// Prefetch predictor of every attachment (`none` for demand faults only).
    pub predictor: PredictorSpec,
    /// Pager threads serving the faults of every attachment.
    pub fault_threads: usize,
    /// Bytes of the pager window all attachments share (address space, not memory): the
    /// attached PMOs must fit in it at once (default 1 GiB, like `--pmo-window`).
    pub window: u64,
    /// Detach returns without waiting for the store's background work; the next attach or
    /// destroy of the PMO waits for it (counted as stall). Off: detach waits.
    pub nonblocking_detach: bool,
    /// Record every session's page sets at detach ([`PmoHost::take_sessions`]).
    pub record_sessions: bool,
    /// What the pager charges per page moved into or out of expander device memory (design
    /// `cf`, on a store on an expander), in ns; 0 charges nothing.
    pub device_memory_latency_ns: u64,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            design: Design::D,
            suite: Suite::XtsBlake3,
            kdf: KdfParams::DEFAULT,
            predictor: PredictorSpec::None,
            fault_threads: 2,
            window: 1 << 30,
            nonblocking_detach: false,
            record_sessions: false,
            device_memory_latency_ns: 0,
        }
    }
}

/// One attached PMO.
struct Live {
    /// The PMO's name.
    name: String,
    attachment: Attachment,
    writable: bool,
}

/// Named PMOs of one store and key for a program on the host, attached into one pager window.
/// `Send + Sync`: every call may come from any thread.
pub struct PmoHost {
    store: Store,
    key: UserKey,
    config: HostConfig,
    pager: Arc<Pager>,
    /// Live attachments by address.
    live: Mutex<HashMap<usize, Arc<Live>>>,
    /// Background detaches not waited for yet, by PMO.
    pending: Mutex<HashMap<String, Vec<DetachHandle>>>,
    meters: Meters,
    sessions: Mutex<Vec<SessionRecord>>,
}

fn ns(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl PmoHost {
    /// A host on `store` whose PMOs are created and opened with `key`; maps its window.
    pub fn new(store: Store, key: UserKey, config: HostConfig) -> Result<Self, HostError> {
        let pager = Pager::new(config.window, config.fault_threads.max(1))?;
        pager.set_device_memory_latency(std::time::Duration::from_nanos(
            config.device_memory_latency_ns,
        ));
        Ok(PmoHost {
            store,
            key,
            config,
            pager,
            live: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            meters: Meters::default(),
            sessions: Mutex::new(Vec::new()),
        })
    }

    /// A host on the store in file `path`: opened (and recovered) if it exists, else created
    /// with `len` bytes and formatted. `key` is the user key of its PMOs.
    pub fn open_file(
        path: &Path,
        len: u64,
        key: &[u8],
        config: HostConfig,
    ) -> Result<Self, HostError> {
        let (medium, fresh) = FileMedium::open_or_create(path, Some(len))?;
        let opts = StoreOptions {
            kdf: config.kdf,
            ..StoreOptions::default()
        };
        let (store, _) = Store::open_or_format(Arc::new(medium), fresh, opts)?;
        let key = UserKey::new(key).map_err(StoreError::from)?;
        Self::new(store, key, config)
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The configuration.
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// Creates PMO `name` of `size` bytes rounded up to whole pages, zero-filled.
    pub fn create(&self, name: &str, size: usize) -> Result<(), HostError> {
        let t = Instant::now();
        let r = self.create_pmo(name, size);
        self.meters.create_ns.fetch_add(ns(t), RELAXED);
        r?;
        self.meters.creates.fetch_add(1, RELAXED);
        Ok(())
    }

    fn create_pmo(&self, name: &str, size: usize) -> Result<(), StoreError> {
        let page = PAGE as u64;
        let bytes = (size as u64).div_ceil(page) * page;
        let opts = CreateOptions {
            design: self.config.design,
            suite: Some(self.config.suite),
            kdf: Some(self.config.kdf),
        };
        self.store.create_pmo_with(name, bytes, &self.key, opts)
    }

    /// Destroys PMO `name` (after its pending detach, if any); `Busy` while attached.
    pub fn destroy(&self, name: &str) -> Result<(), HostError> {
        self.wait_pending(name)?;
        let t = Instant::now();
        let r = self.store.destroy_pmo(name, &self.key);
        self.meters.destroy_ns.fetch_add(ns(t), RELAXED);
        r?;
        self.meters.destroys.fetch_add(1, RELAXED);
        Ok(())
    }

    /// Waits for the pending background detaches of `name` (stall); the first failure of one
    /// is the result.
    fn wait_pending(&self, name: &str) -> Result<(), HostError> {
        let Some(handles) = self.pending.locked().remove(name) else {
            return Ok(());
        };
        let t = Instant::now();
        let mut first = Ok(());
        for h in handles {
            let r = h.wait();
            if first.is_ok() {
                first = r;
            }
        }
        self.meters.stall_ns.fetch_add(ns(t), RELAXED);
        Ok(first?)
    }

    /// Attaches PMO `name` for reading, or reading and writing, into the window; with
    /// `create_size`, a writer that finds no such PMO creates it (as [`PmoHost::create`])
    /// first. Returns the address of its first byte and its size (whole pages).
    pub fn attach(
        &self,
        name: &str,
        writable: bool,
        create_size: Option<usize>,
    ) -> Result<(NonNull<u8>, usize), HostError> {
        self.wait_pending(name)?;
        let t = Instant::now();
        let mut create_ns = 0;
        let perm = if writable { Perm::Write } else { Perm::Read };
        let design = Some(self.config.design);
        let session = match (
            self.store.attach_with(name, perm, &self.key, design),
            create_size,
        ) {
            (Err(StoreError::NotFound(_)), Some(size)) if writable => {
                let tc = Instant::now();
                let made = self.create_pmo(name, size);
                create_ns = ns(tc);
                self.meters.create_ns.fetch_add(create_ns, RELAXED);
                match made {
                    Ok(()) => {
                        self.meters.creates.fetch_add(1, RELAXED);
                    }
                    // Someone else created it in between: attach theirs.
                    Err(StoreError::Exists(_)) => {}
                    Err(e) => return Err(e.into()),
                }
                self.store.attach_with(name, perm, &self.key, design)?
            }
            (r, _) => r?,
        };
        // Until the attachment exists, a failure drops the session: the store's crash handler
        // leaves the PMO as it was.
        let bytes = session.pages() * PAGE as u64;
        let len = usize::try_from(bytes).map_err(|_| HostError::TooLarge(bytes))?;
        let opts = AttachOptions {
            name,
            predictor: self.config.predictor,
            notify: None,
            working: WorkingPlace::None,
        };
        let attachment = Attachment::attach(&self.pager, session, opts)?;
        let host = attachment.host_addr();
        let Some(addr) = usize::try_from(host)
            .ok()
            .and_then(|h| NonNull::new(h as *mut u8))
        else {
            finish(attachment.detach());
            return Err(HostError::BadAddress);
        };
        let live = Arc::new(Live {
            name: name.to_string(),
            attachment,
            writable,
        });
        self.live.locked().insert(addr.as_ptr() as usize, live);
        self.meters
            .attach_ns
            .fetch_add(ns(t).saturating_sub(create_ns), RELAXED);
        self.meters.attaches.fetch_add(1, RELAXED);
        Ok((addr, len))
    }

    /// The live attachment at `addr`.
    fn lookup(&self, addr: NonNull<u8>) -> Result<Arc<Live>, HostError> {
        self.live
            .locked()
            .get(&(addr.as_ptr() as usize))
            .cloned()
            .ok_or(HostError::NotAttached)
    }

    /// Makes every store to the PMO attached at `addr` since the last sync durable, atomically
    /// (one psync); returns the pages written. A read-only attachment has nothing to sync (0).
    pub fn sync(&self, addr: NonNull<u8>) -> Result<u64, HostError> {
        let a = self.lookup(addr)?;
        if !a.writable {
            return Ok(0);
        }
        let t = Instant::now();
        let r = a.attachment.psync();
        self.meters.psync_ns.fetch_add(ns(t), RELAXED);
        let pages = r?;
        self.meters.psyncs.fetch_add(1, RELAXED);
        self.meters.psync_pages.fetch_add(pages, RELAXED);
        Ok(pages)
    }

    /// Detaches the PMO at `addr`: its plaintext leaves the window and stores since the last
    /// sync are lost. Waits for the store's background work unless the detach is nonblocking.
    pub fn detach(&self, addr: NonNull<u8>) -> Result<(), HostError> {
        let a = self
            .live
            .locked()
            .remove(&(addr.as_ptr() as usize))
            .ok_or(HostError::NotAttached)?;
        // Not timed: the measurement's own bookkeeping (a scan of the slice's bitmaps).
        let record = if self.config.record_sessions {
            a.attachment.page_sets().ok().map(|s| SessionRecord {
                name: a.name.clone(),
                writable: a.writable,
                demand: s.demand,
                prefetched: s.prefetched,
                late: 0,
            })
        } else {
            None
        };
        let t = Instant::now();
        let r = match a.attachment.detach() {
            Ok(d) => {
                let failed = d.failure.map_or(Ok(()), |f| Err(HostError::Refused(f)));
                match d.pending {
                    Some(h) if self.config.nonblocking_detach => {
                        self.pending
                            .locked()
                            .entry(a.name.clone())
                            .or_default()
                            .push(h);
                        failed
                    }
                    Some(h) => h.wait().map_err(HostError::from).and(failed),
                    None => failed,
                }
            }
            Err(e) => Err(HostError::from(e)),
        };
        self.meters.detach_ns.fetch_add(ns(t), RELAXED);
        // After the pager's detach, which counts the triggers left untouched as wasted.
        let stats = a.attachment.stats();
        self.meters.add_slice(stats);
        if let Some(mut rec) = record {
            rec.late = stats.prefetch_late.load(RELAXED);
            self.sessions.locked().push(rec);
        }
        r?;
        self.meters.detaches.fetch_add(1, RELAXED);
        Ok(())
    }

    /// Waits for every pending background detach (counted as stall); the first failure of
    /// one is the result.
    pub fn drain(&self) -> Result<(), HostError> {
        let all: Vec<(String, Vec<DetachHandle>)> = self.pending.locked().drain().collect();
        let t = Instant::now();
        let mut first = Ok(());
        for h in all.into_iter().flat_map(|(_, hs)| hs) {
            let r = h.wait();
            if first.is_ok() {
                first = r;
            }
        }
        self.meters.stall_ns.fetch_add(ns(t), RELAXED);
        Ok(first?)
    }

    /// Background detaches not waited for yet.
    pub fn pending_detaches(&self) -> usize {
        self.pending.locked().values().map(Vec::len).sum()
    }

    /// Attachments live now.
    pub fn attached(&self) -> usize {
        self.live.locked().len()
    }

    /// What was measured since the host was made or last reset.
    pub fn measurements(&self) -> Measurements {
        self.meters.snapshot()
    }

    /// Zeroes the measurements and forgets the recorded sessions (after a setup phase).
    pub fn reset_measurements(&self) {
        self.meters.reset();
        self.sessions.locked().clear();
    }

    /// The sessions recorded since the last call or reset, in detach order.
    pub fn take_sessions(&self) -> Vec<SessionRecord> {
        std::mem::take(&mut *self.sessions.locked())
    }

    /// The pager's counters of the attached PMO `name`, if it is attached.
    pub fn slice_stats(&self, name: &str) -> Option<Arc<SliceStats>> {
        self.live
            .locked()
            .values()
            .find(|a| a.name == name)
            .map(|a| a.attachment.stats().clone())
    }
}

impl Drop for PmoHost {
    fn drop(&mut self) {
        // Attachments whose program never detached (a leaked environment, a failed run): take
        // their plaintext away all the same, then let the background work finish.
        let left: Vec<Arc<Live>> = self.live.locked().drain().map(|(_, a)| a).collect();
        for a in left {
            finish(a.attachment.detach());
        }
        let _ = self.drain();
    }
}

/// Waits for a detach's background work, whatever came of it (a leaked or failed attachment).
fn finish(detached: Result<pmo_pager::Detached, pmo_pager::AttachmentError>) {
    if let Some(h) = detached.ok().and_then(|d| d.pending) {
        let _ = h.wait();
    }
}

const RELAXED: std::sync::atomic::Ordering = std::sync::atomic::Ordering::Relaxed;

#[cfg(test)]
mod tests;
