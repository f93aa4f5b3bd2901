//! The PMO service of one VM: the store, the pager's window and the attachments its guest
//! holds by handle, and every PMO call a front end forwards (create, destroy, attach, psync,
//! detach, stat, list, set-design). Every failure is a [`Failure`] for the caller, with the
//! details in the log. A front end (a VMM's virtio device) parses its wire requests, calls
//! these, and encodes the results.
//!
//! Handles are the service's own: nothing a caller sends is trusted as an offset or length;
//! handles are looked up, window slices come from the pager.

mod counters;
mod list;
mod open;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cxl_t3::WorkingArea;
use locked::Locked;
use pmo_crypto::{UserKey, PAGE};
use pmo_media::Backing;
use pmo_policies::PredictorSpec;
use pmo_store::{CreateOptions, Design, Perm, Store};

use crate::attachment::{AttachOptions, Attachment, AttachmentStat, WorkingPlace};
use crate::config::PmoConfig;
use crate::direct::{DirectSetup, GuestMapper};
use crate::events::PageEvents;
use crate::pager::Pager;
use crate::source::Notify;
use crate::Failure;

pub use counters::ServiceCounters;
pub use list::{ListEntry, Listed};
pub use open::{open_store, ServiceError};

use counters::Totals;
use list::ListCache;
use open::{open_file_store, open_store_on, KillHook};

/// What an attach gives the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attached {
    /// The attachment's handle for later calls.
    pub handle: u64,
    /// Where the PMO's first byte is in the device's range (window, then working area).
    pub offset: u64,
    /// The PMO's size in bytes.
    pub size: u64,
}

/// The PMO service: store, window and attachments.
pub struct PmoService {
    store: Store,
    pager: Arc<Pager>,
    /// The design of attach sessions (`None`: each PMO's own); the guest may change it.
    design: Mutex<Option<Design>>,
    predictor: PredictorSpec,
    /// Where design `c` attachments' working copies go, if the store is on an expander with
    /// a working area.
    direct: Mutex<DirectSetup>,
    attachments: Mutex<BTreeMap<u64, Arc<Attachment>>>,
    next_handle: AtomicU64,
    events: Arc<dyn PageEvents>,
    kill_hook: KillHook,
    list: ListCache,
    totals: Totals,
    /// Detaches whose store work still runs in the background: [`PmoService::detach_all`]
    /// waits for them, so a VMM exit never cuts one short.
    detaching: Mutex<Vec<pmo_store::DetachHandle>>,
}

impl PmoService {
    /// Opens (or creates) the store file and the window as `cfg` says; failed pages are told
    /// to `events`.
    pub fn open(cfg: &PmoConfig, events: Arc<dyn PageEvents>) -> Result<Arc<Self>, ServiceError> {
        let (store, kill_hook) = open_file_store(
            &cfg.store,
            cfg.store_size,
            cfg.store_options.clone(),
            cfg.test_kill_in_psync,
        )?;
        Self::start(cfg, store, kill_hook, events)
    }

    /// The service over a store on `backing` (an expander's media the VMM opened, with its
    /// extent keys; `cfg.store` naming it); formats it first when `blank`.
    pub fn on_medium(
        cfg: &PmoConfig,
        backing: Backing,
        blank: bool,
        events: Arc<dyn PageEvents>,
    ) -> Result<Arc<Self>, ServiceError> {
        let (store, kill_hook) = open_store_on(
            &cfg.store,
            backing,
            blank,
            cfg.store_options.clone(),
            cfg.test_kill_in_psync,
            None,
        )?;
        Self::start(cfg, store, kill_hook, events)
    }

    fn start(
        cfg: &PmoConfig,
        store: Store,
        kill_hook: KillHook,
        events: Arc<dyn PageEvents>,
    ) -> Result<Arc<Self>, ServiceError> {
        let pager = Pager::new(cfg.window_size, cfg.fault_threads)?;
        pager.set_device_memory_latency(std::time::Duration::from_nanos(
            cfg.device_memory_latency_ns,
        ));
        if let Some(b) = &cfg.dram_budget {
            let window_pages = cfg.window_size / PAGE as u64;
            // Every page of the window may be dirty: device memory for all of them.
            pager.set_dram_budget(
                (b.bytes / PAGE as u64).max(1),
                b.placement.build(),
                window_pages,
            )?;
        }
        Ok(Arc::new(PmoService {
            store,
            pager,
            design: Mutex::new(cfg.design),
            predictor: cfg.predictor,
            direct: Mutex::new(DirectSetup::default()),
            attachments: Mutex::new(BTreeMap::new()),
            next_handle: AtomicU64::new(1),
            events,
            kill_hook,
            list: ListCache::default(),
            totals: Totals::default(),
            detaching: Mutex::new(Vec::new()),
        }))
    }

    /// Bytes of the medium the store occupies from its start (the rest of an expander is the
    /// working area of design `c`).
    pub fn store_len(&self) -> u64 {
        self.store.superblock().medium_len
    }

    /// The store (its catalog, for front ends and tests that look at what is stored).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The window's pager (the VMM maps its memory into the guest).
    pub fn pager(&self) -> &Arc<Pager> {
        &self.pager
    }

    /// Puts the working copies of design `c` attachments in `area`, on the store's expander,
    /// mapped into the guest after the window once a mapper is set.
    pub fn set_working_area(&self, area: Arc<WorkingArea>) {
        self.direct.locked().set_area(area);
    }

    /// How the front end maps working copies into the guest.
    pub fn set_guest_mapper(&self, mapper: Arc<dyn GuestMapper>) {
        self.direct.locked().set_mapper(mapper);
    }

    /// Bytes of the device's range after the window that design `c` working copies take.
    pub fn working_area_len(&self) -> u64 {
        self.direct.locked().len()
    }

    /// Attachments live now.
    pub fn attached(&self) -> usize {
        self.attachments.locked().len()
    }

    /// The names of the PMOs attached now, in name order (a name once per attachment).
    pub fn attached_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .attachments
            .locked()
            .values()
            .map(|a| a.name().to_string())
            .collect();
        names.sort();
        names
    }

    fn attachment(&self, handle: u64) -> Result<Arc<Attachment>, Failure> {
        self.attachments
            .locked()
            .get(&handle)
            .cloned()
            .ok_or(Failure::NotFound)
    }

    /// Creates PMO `name` of `size` bytes (whole pages) under `key`, in the design attaches
    /// use now (a CXL design's PMO gets its suite, which the store refuses where the medium
    /// encrypts nothing).
    pub fn create(&self, name: &str, size: u64, key: &UserKey) -> Result<(), Failure> {
        if size == 0 || !size.is_multiple_of(PAGE as u64) {
            return Err(Failure::Invalid);
        }
        let design = self.design.locked().unwrap_or(Design::D);
        let opts = CreateOptions {
            design,
            suite: None,
            kdf: None,
        };
        self.store
            .create_pmo_with(name, size, key, opts)
            .map_err(|e| Failure::from(&e))
    }

    /// Destroys PMO `name`; busy while any attachment holds it.
    pub fn destroy(&self, name: &str, key: &UserKey) -> Result<(), Failure> {
        if self.attachments.locked().values().any(|a| a.name() == name) {
            return Err(Failure::Busy);
        }
        self.store
            .destroy_pmo(name, key)
            .map_err(|e| Failure::from(&e))
    }

    /// Sets the design of later attach sessions (and of PMOs created from now on).
    pub fn set_design(&self, design: Design) {
        *self.design.locked() = Some(design);
    }

    /// Attaches PMO `name` with `perm` under `key`.
    pub fn attach(&self, name: &str, perm: Perm, key: &UserKey) -> Result<Attached, Failure> {
        let design = *self.design.locked();
        let session = self
            .store
            .attach_with(name, perm, key, design)
            .map_err(|e| Failure::from(&e))?;
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let ready = self.direct.locked().ready();
        let working = match &ready {
            Some((area, mapper)) => WorkingPlace::Guest {
                area,
                mapper: &**mapper,
                window_len: self.pager.size(),
            },
            None => WorkingPlace::None,
        };
        let opts = AttachOptions {
            name,
            predictor: self.predictor,
            notify: Some(Notify {
                events: self.events.clone(),
                handle,
            }),
            working,
        };
        let a = Attachment::attach(&self.pager, session, opts).map_err(|e| {
            log::warn!("pmo: attach {name:?}: {e}");
            e.failure()
        })?;
        let attached = Attached {
            handle,
            offset: a.offset(),
            size: a.size(),
        };
        self.attachments.locked().insert(handle, Arc::new(a));
        self.totals.attached();
        Ok(attached)
    }

    /// Persists what attachment `handle` wrote since its last psync; returns the pages.
    pub fn psync(&self, handle: u64) -> Result<u64, Failure> {
        let a = self.attachment(handle)?;
        if let Some(k) = &self.kill_hook {
            k.arm(true);
        }
        let r = a.psync();
        if let Some(k) = &self.kill_hook {
            k.arm(false);
        }
        r.map_err(|e| {
            log::error!("pmo: psync of {:?}: {e}", a.name());
            e.failure()
        })
    }

    /// Detaches `handle`: its plaintext leaves the guest now, the store finishes in the
    /// background (a later attach of the PMO waits for it). A failed attachment is detached
    /// all the same, and the caller is told why it failed.
    pub fn detach(&self, handle: u64) -> Result<(), Failure> {
        let a = self
            .attachments
            .locked()
            .remove(&handle)
            .ok_or(Failure::NotFound)?;
        let d = a.detach().map_err(|e| e.failure())?;
        self.totals.ended(&a.stat());
        if let Some(pending) = d.pending {
            self.keep_detaching(pending);
        }
        match d.failure {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }

    /// The device's counts since the service started, live attachments included.
    pub fn counters(&self) -> ServiceCounters {
        let live: Vec<AttachmentStat> = self
            .attachments
            .locked()
            .values()
            .map(|a| a.stat())
            .collect();
        self.totals.with_live(live.into_iter())
    }

    /// What STAT reports of attachment `handle`.
    pub fn stat(&self, handle: u64) -> Result<AttachmentStat, Failure> {
        Ok(self.attachment(handle)?.stat())
    }

    /// Entry `index` of the catalog, in name order.
    pub fn list(&self, index: u32) -> Result<ListEntry, Failure> {
        let list = self.list.entries(&self.store);
        let (name, size) = list.get(index as usize).ok_or(Failure::NotFound)?;
        let attached = self
            .attachments
            .locked()
            .values()
            .filter(|a| a.name() == name)
            .map(|a| match a.perm() {
                Perm::Write => Listed::Writer,
                Perm::Read => Listed::Readers,
            })
            .max()
            .unwrap_or(Listed::Detached);
        Ok(ListEntry {
            name: name.clone(),
            size: *size,
            attached,
            more: (index as usize + 1) < list.len(),
        })
    }

    /// Keeps a background detach until it ends; reaps the ones that already did, so the
    /// list stays as short as the detaches actually running.
    fn keep_detaching(&self, pending: pmo_store::DetachHandle) {
        let mut running = self.detaching.locked();
        let (done, still): (Vec<_>, Vec<_>) = running.drain(..).partition(|d| d.is_finished());
        *running = still;
        running.push(pending);
        drop(running);
        for d in done {
            // Its outcome was logged by the detach thread itself.
            let _ = d.wait();
        }
    }

    /// Detaches everything (driver reset, VMM shutdown) and waits until the store finished,
    /// also for detaches asked for before. Unsynced changes are dropped: each PMO stays as of
    /// its last psync.
    pub fn detach_all(&self) {
        let all: Vec<Arc<Attachment>> = std::mem::take(&mut *self.attachments.locked())
            .into_values()
            .collect();
        for a in all {
            if let Ok(d) = a.detach() {
                self.totals.ended(&a.stat());
                if let Some(Err(e)) = d.pending.map(pmo_store::DetachHandle::wait) {
                    log::warn!("pmo: detach: {e}");
                }
            }
        }
        let earlier = std::mem::take(&mut *self.detaching.locked());
        for pending in earlier {
            if let Err(e) = pending.wait() {
                log::warn!("pmo: detach: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests;
