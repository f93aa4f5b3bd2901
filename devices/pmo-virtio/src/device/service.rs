//! The PMO service: the store, the pager's window and the attachments the guest holds, and
//! the execution of every control request against them (attach, detach, psync, stat, list,
//! create, destroy, set-design). Every failure is a status for the guest.

use super::page_events::{AttachmentSource, EventSink};
use super::*;

/// What a detach leaves behind.
struct Detached {
    /// The store finishing the session in the background.
    pending: Option<pmo_store::DetachHandle>,
    /// The session failed (see [`AttachmentSource::failure`]).
    failure: Option<Status>,
}

pub(super) struct Attachment {
    name: String,
    perm: Perm,
    source: Arc<AttachmentSource>,
    /// Design `c` on an expander with a working area: the guest's working copy lives there
    /// and the pager holds nothing of this attachment.
    direct: Option<DirectCopy>,
    offset: u64,
    size: u64,
    stats: Arc<SliceStats>,
    psyncs: AtomicU64,
    psync_pages: AtomicU64,
    psync_ns: AtomicU64,
}

/// The PMO service: store, window and sessions.
pub struct PmoService {
    pub(super) store: Store,
    pager: Arc<Pager>,
    design: Mutex<Option<Design>>,
    /// Where design `c` attachments' working copies go, if the store is on an expander with
    /// a working area.
    pub(super) direct: Mutex<DirectSetup>,
    pub(super) attachments: Mutex<BTreeMap<u64, Arc<Attachment>>>,
    pub(super) next_handle: AtomicU64,
    pub(super) events: Arc<EventSink>,
    kill_hook: KillHook,
    predictor: Option<String>,
    /// The PMO names and sizes LIST walks, as of a store catalog version: a guest listing
    /// n PMOs one index at a time costs n lookups, not n sorted copies of the catalog.
    list_snapshot: Mutex<Option<ListSnapshot>>,
    /// Detaches the guest asked for whose store work still runs in the background:
    /// [`PmoService::detach_all`] waits for them, so a VMM exit never cuts one short.
    detaching: Mutex<Vec<pmo_store::DetachHandle>>,
}

/// PMO names and sizes in name order, and the catalog version they are of.
struct ListSnapshot {
    version: u64,
    entries: Arc<Vec<(String, u64)>>,
}

pub(super) fn store_status(e: &StoreError) -> Status {
    match e {
        StoreError::NotFound(_) => Status::NoEnt,
        StoreError::Exists(_) => Status::Exist,
        StoreError::Busy(_) => Status::Busy,
        StoreError::WrongKey => Status::Access,
        StoreError::NameTooLong(_) => Status::NameTooLong,
        StoreError::InvalidName(_)
        | StoreError::InvalidSize(_)
        | StoreError::PageOutOfRange { .. }
        | StoreError::NeedsRangeEncryption { .. } => Status::Inval,
        StoreError::Integrity { .. } | StoreError::Corrupt { .. } => Status::BadMsg,
        StoreError::ReadOnly => Status::Perm,
        StoreError::TableFull | StoreError::Alloc(_) => Status::NoSpc,
        _ => Status::Io,
    }
}

impl PmoService {
    /// Opens (or creates) the store file and the window as `cfg` says.
    pub fn new(cfg: &PmoDeviceConfig) -> Result<Arc<Self>, DeviceError> {
        Self::check(cfg)?;
        let (store, kill_hook) = open_file_store(
            &cfg.store,
            cfg.store_size,
            cfg.store_options.clone(),
            cfg.test_kill_in_psync,
        )?;
        Self::start(cfg, store, kill_hook)
    }

    /// The service over a store on `backing` (see [`super::PmoDevice::with_medium`]).
    pub fn with_medium(
        cfg: &PmoDeviceConfig,
        backing: Backing,
        blank: bool,
    ) -> Result<Arc<Self>, DeviceError> {
        Self::check(cfg)?;
        let (store, kill_hook) = open_store_on(
            &cfg.store,
            backing,
            blank,
            cfg.store_options.clone(),
            cfg.test_kill_in_psync,
        )?;
        Self::start(cfg, store, kill_hook)
    }

    /// Refuses a bad design or predictor before any store is touched.
    fn check(cfg: &PmoDeviceConfig) -> Result<(), DeviceError> {
        if let Some(d) = &cfg.design {
            Design::from_name(d).ok_or_else(|| DeviceError::Design(d.clone()))?;
        }
        if let Some(spec) = &cfg.predictor {
            // Checked once here so a bad spec is a startup error, not a silent no-op.
            pmo_policies::predictor_from_name(spec)?;
        }
        Ok(())
    }

    fn start(
        cfg: &PmoDeviceConfig,
        store: Store,
        kill_hook: KillHook,
    ) -> Result<Arc<Self>, DeviceError> {
        let design = match &cfg.design {
            Some(d) => Some(Design::from_name(d).ok_or_else(|| DeviceError::Design(d.clone()))?),
            None => None,
        };
        let pager = Pager::new(cfg.window_size, cfg.fault_threads)?;
        pager.set_device_memory_latency(std::time::Duration::from_nanos(
            cfg.device_memory_latency_ns,
        ));
        if let Some(b) = &cfg.dram_budget {
            let policy = pmo_policies::placement_from_name(&b.policy)?;
            let window_pages = cfg.window_size / PAGE as u64;
            // Every page of the window may be dirty: device memory for all of them.
            pager.set_dram_budget((b.bytes / PAGE as u64).max(1), policy, window_pages)?;
        }
        Ok(Arc::new(PmoService {
            store,
            pager,
            design: Mutex::new(design),
            direct: Mutex::new(DirectSetup::default()),
            attachments: Mutex::new(BTreeMap::new()),
            next_handle: AtomicU64::new(1),
            events: Arc::new(EventSink {
                pending: Mutex::new(VecDeque::new()),
                kick: EventFd::new(EFD_NONBLOCK).map_err(DeviceError::EventFd)?,
            }),
            kill_hook,
            predictor: cfg.predictor.clone(),
            list_snapshot: Mutex::new(None),
            detaching: Mutex::new(Vec::new()),
        }))
    }

    /// Bytes of the medium the store occupies from its start (the rest of an expander is the
    /// working area of design `c`).
    pub fn store_len(&self) -> u64 {
        self.store.superblock().medium_len
    }

    /// The window's pager (the VMM maps its memory into the guest).
    pub fn pager(&self) -> &Arc<Pager> {
        &self.pager
    }

    fn attachment(&self, handle: u64) -> Result<Arc<Attachment>, Status> {
        self.attachments
            .locked()
            .get(&handle)
            .cloned()
            .ok_or(Status::NoEnt)
    }

    /// Serves one validated request; returns the status and response payload.
    pub fn execute(&self, req: Request) -> (Status, Vec<u8>) {
        match self.execute_inner(req) {
            Ok(payload) => (Status::Ok, payload),
            Err(s) => (s, Vec::new()),
        }
    }

    fn execute_inner(&self, req: Request) -> Result<Vec<u8>, Status> {
        let key = |k: &proto::KeyBytes| UserKey::new(k).map_err(|_| Status::Inval);
        match req {
            Request::Create { name, size, key: k } => {
                if size == 0 || !size.is_multiple_of(PAGE as u64) {
                    return Err(Status::Inval);
                }
                // A PMO made while a CXL design is chosen gets its suite (the range key as
                // the only cipher); the store refuses it where the medium encrypts nothing.
                let design = self.design.locked().unwrap_or(Design::D);
                let opts = CreateOptions {
                    design,
                    suite: None,
                    kdf: None,
                };
                self.store
                    .create_pmo_with(&name, size, &key(&k)?, opts)
                    .map_err(|e| store_status(&e))?;
                Ok(Vec::new())
            }
            Request::Destroy { name, key: k } => {
                let attached = self.attachments.locked().values().any(|a| a.name == name);
                if attached {
                    return Err(Status::Busy);
                }
                self.store
                    .destroy_pmo(&name, &key(&k)?)
                    .map_err(|e| store_status(&e))?;
                Ok(Vec::new())
            }
            Request::Attach { name, perm, key: k } => self.attach(&name, perm, &key(&k)?),
            Request::Detach { handle } => {
                let Detached { pending, failure } = self.detach(handle)?;
                if let Some(pending) = pending {
                    self.keep_detaching(pending);
                }
                match failure {
                    // Detached all the same; the status says the session went bad.
                    Some(st) => Err(st),
                    None => Ok(Vec::new()),
                }
            }
            Request::Psync { handle } => self
                .psync(handle)
                .map(|pages_written| proto::PsyncResponse { pages_written }.encode().to_vec()),
            Request::Stat { handle } => Ok(self.stat(handle)?),
            Request::SetDesign { design } => {
                let d = Design::from_name(&design).ok_or(Status::Inval)?;
                *self.design.locked() = Some(d);
                Ok(Vec::new())
            }
            Request::List { index } => self.list(index),
        }
    }

    fn attach(&self, name: &str, perm: Perm, key: &UserKey) -> Result<Vec<u8>, Status> {
        let design = *self.design.locked();
        let session = self
            .store
            .attach_with(name, perm, key, design)
            .map_err(|e| store_status(&e))?;
        let npages = session.pages();
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let writable = perm == Perm::Write;
        let direct_setup = self.direct.locked().ready();
        let direct = match (session.design(), direct_setup) {
            // On failure the session is dropped, which runs the store's crash handler.
            (Design::C, Some((area, mapper))) => Some(DirectCopy::attach(
                &session,
                &area,
                &*mapper,
                self.pager.size(),
                writable,
            )?),
            _ => None,
        };
        let source = Arc::new(AttachmentSource::new(
            SessionSource::new(session, writable),
            handle,
            self.events.clone(),
        ));
        let (offset, stats) = match &direct {
            Some((_, offset)) => (*offset, Arc::new(SliceStats::default())),
            None => self.attach_to_window(name, &source, npages)?,
        };
        let size = npages * PAGE as u64;
        self.attachments.locked().insert(
            handle,
            Arc::new(Attachment {
                name: name.to_string(),
                perm,
                source,
                direct: direct.map(|(copy, _)| copy),
                offset,
                size,
                stats,
                psyncs: AtomicU64::new(0),
                psync_pages: AtomicU64::new(0),
                psync_ns: AtomicU64::new(0),
            }),
        );
        Ok(proto::AttachResponse {
            handle,
            window_offset: offset,
            size,
        }
        .encode()
        .to_vec())
    }

    /// Gives `source` a slice of the pager's window and its predictor.
    fn attach_to_window(
        &self,
        name: &str,
        source: &Arc<AttachmentSource>,
        npages: u64,
    ) -> Result<(u64, Arc<SliceStats>), Status> {
        let (offset, stats) = match self.pager.attach(source.clone(), npages) {
            Ok(x) => x,
            Err(e) => {
                log::warn!("pmo: attach {name:?}: {e}");
                // Dropping the session runs the store's crash handler: nothing changes.
                drop(source.session.take());
                return Err(Status::NoMem);
            }
        };
        if let Some(spec) = &self.predictor {
            match pmo_policies::predictor_from_name(spec) {
                Ok(p) => {
                    if let Err(e) = self.pager.set_predictor(offset, Some(p)) {
                        log::warn!("pmo: predictor for {name:?}: {e}");
                    }
                }
                Err(e) => log::warn!("pmo: predictor for {name:?}: {e}"),
            }
        }
        Ok((offset, stats))
    }

    fn detach(&self, handle: u64) -> Result<Detached, Status> {
        let a = self
            .attachments
            .locked()
            .remove(&handle)
            .ok_or(Status::NoEnt)?;
        let s = &a.stats;
        let est = s.estimate();
        let pct = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{:.0}%", r * 100.0));
        if s.pages_prefetched.load(Ordering::Relaxed) + s.triggers.load(Ordering::Relaxed) > 0 {
            log::info!(
                "pmo: detach {:?}: {} pages prefetched, {} triggers ({} used, {} wasted), {} late; estimated accuracy {}, coverage {}, timeliness {}",
                a.name,
                s.pages_prefetched.load(Ordering::Relaxed),
                s.triggers.load(Ordering::Relaxed),
                s.trigger_hits.load(Ordering::Relaxed),
                s.trigger_wasted.load(Ordering::Relaxed),
                s.prefetch_late.load(Ordering::Relaxed),
                pct(est.accuracy),
                pct(est.coverage),
                pct(est.timeliness),
            );
        }
        if let Some(page) = a.direct.as_ref().and_then(DirectCopy::failed_page) {
            a.source.direct_page_failed(page);
        }
        let failure = a.source.failure();
        log::info!(
            "pmo: detach {:?} ({}{}): {} faults ({} us total), {} pages decrypted, {} psyncs of {} pages ({} us; {} pages marked dirty were unchanged), {} integrity failures",
            a.name,
            if a.perm == Perm::Write { "w" } else { "r" },
            if failure.is_some() { ", failed" } else { "" },
            s.faults.load(Ordering::Relaxed),
            s.fault_ns_total.load(Ordering::Relaxed) / 1000,
            s.pages_decrypted.load(Ordering::Relaxed),
            a.psyncs.load(Ordering::Relaxed),
            a.psync_pages.load(Ordering::Relaxed),
            a.psync_ns.load(Ordering::Relaxed) / 1000,
            s.psync_unchanged.load(Ordering::Relaxed),
            s.integrity_failures.load(Ordering::Relaxed),
        );
        let on_device = s.device_pages.load(Ordering::Relaxed);
        if on_device > 0 {
            log::info!(
                "pmo: detach {:?}: working copy in expander device memory (design cf): {} pages",
                a.name,
                on_device,
            );
        }
        if let Some(vm) = self.pager.tier_stats() {
            log::info!(
                "pmo: detach {:?}: tiering: {} pages in DRAM, {} dirty in device memory (dropped), {} promotions, {} demotions, {} predictions left in CXL; VM: {} of {} budget pages in DRAM, {} bytes moved",
                a.name,
                s.dram_pages.load(Ordering::Relaxed),
                s.cxl_dirty_pages.load(Ordering::Relaxed),
                s.promotions.load(Ordering::Relaxed),
                s.demotions.load(Ordering::Relaxed),
                s.prefetch_to_cxl.load(Ordering::Relaxed),
                vm.resident_pages,
                vm.budget_pages,
                vm.bytes_moved(),
            );
        }
        // Plaintext leaves the guest first; then the session ends (in the background).
        match &a.direct {
            Some(copy) => {
                copy.unmap();
                log::info!(
                    "pmo: detach {:?}: working copy on the expander (design c), mapped into the guest",
                    a.name
                );
            }
            None => {
                if let Err(e) = self.pager.detach(a.offset) {
                    log::error!("pmo: detach window slice: {e}");
                }
            }
        }
        let session = a.source.session.take();
        // Nonblocking: the store finishes in the background and a later attach waits.
        Ok(Detached {
            pending: session.map(|s| s.detach()),
            failure,
        })
    }

    fn psync(&self, handle: u64) -> Result<u64, Status> {
        let a = self.attachment(handle)?;
        if a.perm != Perm::Write {
            return Err(Status::Perm);
        }
        // A failed attachment persists nothing: its PMO stays as of its last good psync.
        if let Some(st) = a.source.failure() {
            return Err(st);
        }
        let start = Instant::now();
        if let Some(k) = &self.kill_hook {
            k.arm(true);
        }
        let n = match &a.direct {
            Some(copy) => {
                let n = a
                    .source
                    .session
                    .with(|session| copy.psync(session))
                    .unwrap_or(Err(Status::NoEnt));
                if let Some(page) = copy.failed_page() {
                    a.source.direct_page_failed(page);
                }
                n
            }
            None => self.psync_window(&a),
        };
        if let Some(k) = &self.kill_hook {
            k.arm(false);
        }
        let n = n?;
        a.psyncs.fetch_add(1, Ordering::Relaxed);
        a.psync_pages.fetch_add(n, Ordering::Relaxed);
        a.psync_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// Persists the pages of `a` the pager found dirty in the window.
    fn psync_window(&self, a: &Attachment) -> Result<u64, Status> {
        // Of this attachment only: once it is detached, its offset may
        // already be a later attachment's.
        let n = a
            .source
            .session
            .with(|session| {
                self.pager
                    .collect_dirty_of(a.offset, &a.stats, |pages| {
                        // Checked again at the last moment before anything is written.
                        if let Some(st) = a.source.failure() {
                            return Err(st);
                        }
                        session
                            .psync(pages.iter().map(|(p, d)| (*p, &**d)))
                            .map_err(|e| {
                                log::error!("pmo: psync of {:?}: {e}", a.name);
                                store_status(&e)
                            })
                    })
                    .map_err(|_| Status::NoEnt)
            })
            .ok_or(Status::NoEnt)???;
        Ok(n)
    }

    fn stat(&self, handle: u64) -> Result<Vec<u8>, Status> {
        const _: () = assert!(HIST_BUCKETS == proto::HIST_BUCKETS);
        let a = self.attachment(handle)?;
        let s = &a.stats;
        let load = |x: &AtomicU64| x.load(Ordering::Relaxed);
        Ok(proto::StatResponse {
            size: a.size,
            faults: load(&s.faults),
            fault_ns_total: load(&s.fault_ns_total),
            pages_decrypted: load(&s.pages_decrypted),
            pages_prefetched: load(&s.pages_prefetched),
            psyncs: load(&a.psyncs),
            psync_pages: load(&a.psync_pages),
            psync_ns_total: load(&a.psync_ns),
            integrity_failures: load(&s.integrity_failures),
            fault_hist: std::array::from_fn(|i| load(&s.fault_hist[i])),
            triggers: load(&s.triggers),
            trigger_hits: load(&s.trigger_hits),
            trigger_wasted: load(&s.trigger_wasted),
            prefetch_late: load(&s.prefetch_late),
            demand_unpredicted: load(&s.demand_unpredicted),
            tier: self.tier_stat(s),
        }
        .encode()
        .to_vec())
    }

    /// STAT's tiering block for an attachment with counters `s`.
    fn tier_stat(&self, s: &SliceStats) -> proto::TierStat {
        let Some(vm) = self.pager.tier_stats() else {
            return proto::TierStat::default();
        };
        let load = |x: &AtomicU64| x.load(Ordering::Relaxed);
        proto::TierStat {
            dram_pages: load(&s.dram_pages),
            cxl_dirty_pages: load(&s.cxl_dirty_pages),
            promotions: load(&s.promotions),
            demotions: load(&s.demotions),
            prefetch_to_cxl: load(&s.prefetch_to_cxl),
            vm_budget_pages: vm.budget_pages,
            vm_dram_pages: vm.resident_pages,
            vm_cxl_dirty_pages: vm.spilled_pages,
            vm_bytes_moved: vm.bytes_moved(),
        }
    }

    /// The catalog as LIST sees it: rebuilt only when a create or destroy changed it.
    fn list_entries(&self) -> Arc<Vec<(String, u64)>> {
        // Read the version first: a change racing the rebuild leaves a snapshot tagged older
        // than its contents, which only costs one more rebuild.
        let version = self.store.catalog_version();
        let mut snap = self.list_snapshot.locked();
        if let Some(s) = snap.as_ref().filter(|s| s.version == version) {
            return s.entries.clone();
        }
        let entries: Arc<Vec<(String, u64)>> = Arc::new(
            self.store
                .list()
                .into_iter()
                .map(|i| (i.name, i.size))
                .collect(),
        );
        *snap = Some(ListSnapshot {
            version,
            entries: entries.clone(),
        });
        entries
    }

    fn list(&self, index: u32) -> Result<Vec<u8>, Status> {
        let list = self.list_entries();
        let (name, size) = list.get(index as usize).ok_or(Status::NoEnt)?;
        let attached = self
            .attachments
            .locked()
            .values()
            .filter(|a| a.name == *name)
            .map(|a| match a.perm {
                Perm::Write => proto::LIST_WRITER,
                Perm::Read => proto::LIST_READERS,
            })
            .max()
            .unwrap_or(proto::LIST_DETACHED);
        Ok(proto::ListEntry {
            name: name.clone(),
            size: *size,
            attached,
            more: u32::from((index as usize + 1) < list.len()),
        }
        .encode()
        .to_vec())
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

    /// Detaches everything (driver reset, VMM shutdown) and waits until the
    /// store finished, also for detaches the guest asked for before. Unsynced
    /// changes are dropped: each PMO stays as of its last psync.
    pub fn detach_all(&self) {
        let handles: Vec<u64> = self.attachments.locked().keys().copied().collect();
        for h in handles {
            if let Ok(Detached {
                pending: Some(pending),
                ..
            }) = self.detach(h)
            {
                if let Err(e) = pending.wait() {
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
