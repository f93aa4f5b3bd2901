//! The virtio-pmo device: the control queue in front of the PMO service.
//!
//! The service owns the store, the pager (window) and the attach sessions.
//! Requests are parsed by [`crate::proto`]; every failure becomes a status
//! code for the guest. The device never trusts a handle, offset or length
//! from the guest: handles are looked up, window slices come from the pager.

use locked::{Locked, RwLocked};
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use virtio_devices::{
    drain_queue, read_config_bytes, ActivateContext, ActivateError, DeviceMemory, InterruptKind,
    QueueHandler, QueueWorker, VirtioDevice, VirtioInterrupt, VIRTIO_F_VERSION_1,
};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::pager::{Detected, FillError, PageSource, Pager, PagerError, SliceStats, HIST_BUCKETS};
use crate::proto::{self, Request, Status};
use pmo_store::crypto::{UserKey, PAGE};
use pmo_store::medium::{FileMedium, KillInPsync, Medium};
use pmo_store::{Design, Perm, Session, Store, StoreError, StoreOptions};

/// Virtio device type of the PMO device (unassigned in virtio 1.3; see docs/virtio-pmo.md).
pub const VIRTIO_ID_PMO: u32 = 63;
const QUEUE_SIZE: u16 = 128;
const CONTROL_QUEUE: u16 = 0;
const EVENT_QUEUE: u16 = 1;
/// Internal wakeup of the queue thread: events waiting for the event queue.
const EVENT_KICK: u16 = 2;

/// Errors bringing the PMO device up.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("PMO store {path}: {source}")]
    Medium {
        path: PathBuf,
        source: pmo_store::medium::MediumError,
    },
    #[error("PMO store {path}: {source}")]
    Store { path: PathBuf, source: StoreError },
    #[error("PMO window: {0}")]
    Pager(#[from] PagerError),
    #[error("unknown PMO design {0:?}")]
    Design(String),
    #[error("PMO predictor: {0}")]
    Predictor(#[from] pmo_policies::PolicyError),
    #[error("eventfd: {0}")]
    EventFd(std::io::Error),
}

/// How to build the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PmoDeviceConfig {
    pub store: PathBuf,
    /// Size to create the store with when the file does not exist.
    pub store_size: Option<u64>,
    /// Design for attaches (None: each PMO's own).
    pub design: Option<String>,
    pub window_size: u64,
    pub fault_threads: usize,
    /// Test hook: kill the process at this persist point of every psync.
    pub test_kill_in_psync: Option<u64>,
    /// Predictor spec for every attachment (`stream:4`, `stride`, `markov`, ...).
    pub predictor: Option<String>,
    /// The store's rollback anchor and the Argon2id cost of PMOs the guest creates (both
    /// always), and how a missing store is formatted (slots; ignored when the file exists).
    /// Tests and fuzz targets format small stores, which create and open in microseconds.
    pub store_options: StoreOptions,
}

/// The store file, possibly behind the psync kill hook.
type KillHook = Option<Arc<KillInPsync<FileMedium>>>;

/// Opens the store file, creating and formatting it if missing.
pub fn open_store(path: &Path, size: Option<u64>) -> Result<Store, DeviceError> {
    open_store_with(path, size, StoreOptions::default(), None).map(|(s, _)| s)
}

fn open_store_with(
    path: &Path,
    size: Option<u64>,
    opts: StoreOptions,
    kill_at: Option<u64>,
) -> Result<(Store, KillHook), DeviceError> {
    let medium_err = |source| DeviceError::Medium {
        path: path.to_owned(),
        source,
    };
    let store_err = |source| DeviceError::Store {
        path: path.to_owned(),
        source,
    };
    let (file, fresh) = FileMedium::open_or_create(path, size).map_err(medium_err)?;
    let (m, hook): (Arc<dyn Medium>, KillHook) = match kill_at {
        Some(n) => {
            let k = Arc::new(KillInPsync::new(file, n));
            (k.clone(), Some(k))
        }
        None => (Arc::new(file), None),
    };
    let store = match Store::open_or_format(m, fresh, opts) {
        Ok((store, Some(report))) => {
            log::info!("PMO store {}: {report:?}", path.display());
            store
        }
        Ok((store, None)) => store,
        Err(e) => {
            if fresh {
                // Leave nothing behind that a later run would take for a damaged store.
                let _ = std::fs::remove_file(path);
            }
            return Err(store_err(e));
        }
    };
    Ok((store, hook))
}

/// A store session as the pager's page source.
struct SessionSource {
    session: RwLock<Option<Session>>,
    writable: bool,
    handle: u64,
    events: Arc<EventSink>,
    /// 0, or the status every later PSYNC and the DETACH of this attachment
    /// answer: a page failed (see [`SessionSource::failure`]).
    failed: AtomicU32,
}

impl SessionSource {
    /// Why the attachment failed, if it did: a page of it was refused to an
    /// access or found failing verification. From then on its PSYNCs persist
    /// nothing (the PMO stays as of its last good psync) and its DETACH
    /// reports the failure, so tampering never goes unnoticed.
    fn failure(&self) -> Option<Status> {
        match self.failed.load(Ordering::SeqCst) {
            0 => None,
            s if s == Status::Io as u32 => Some(Status::Io),
            _ => Some(Status::BadMsg),
        }
    }
}

impl PageSource for SessionSource {
    fn fill(&self, page: u64, out: &mut [u8; PAGE]) -> Result<(), FillError> {
        let guard = self.session.read_locked();
        let Some(s) = guard.as_ref() else {
            return Err(FillError::Other {
                page,
                why: "detached".into(),
            });
        };
        match s.fault(page, out) {
            Ok(()) => Ok(()),
            Err(StoreError::Integrity { page }) => Err(FillError::Integrity(page)),
            Err(e) => Err(FillError::Other {
                page,
                why: e.to_string(),
            }),
        }
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn page_failed(&self, page: u64, error: &FillError, how: Detected) {
        // An integrity failure outranks a medium error.
        match error {
            FillError::Integrity(_) => self.failed.store(Status::BadMsg as u32, Ordering::SeqCst),
            FillError::Other { .. } => {
                let _ = self.failed.compare_exchange(
                    0,
                    Status::Io as u32,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
        }
        let kind = match how {
            Detected::OnAccess => proto::EVENT_PAGE_POISONED,
            Detected::Ahead => proto::EVENT_PAGE_BAD,
        };
        self.events.post(kind, self.handle, page);
    }
}

/// Events waiting for a buffer on the event queue: (type, handle, page).
struct EventSink {
    pending: Mutex<VecDeque<(u32, u64, u64)>>,
    kick: EventFd,
}

impl EventSink {
    fn post(&self, kind: u32, handle: u64, page: u64) {
        let mut q = self.pending.locked();
        // Bounded: a flood of failures keeps only the most recent events
        // (the attachments stay failed whatever the guest hears).
        if q.len() >= 1024 {
            q.pop_front();
        }
        q.push_back((kind, handle, page));
        let _ = self.kick.write(1);
    }
}

/// What a detach leaves behind.
struct Detached {
    /// The store finishing the session in the background.
    pending: Option<pmo_store::DetachHandle>,
    /// The session failed (see [`SessionSource::failure`]).
    failure: Option<Status>,
}

struct Attachment {
    name: String,
    perm: Perm,
    source: Arc<SessionSource>,
    offset: u64,
    size: u64,
    stats: Arc<SliceStats>,
    psyncs: AtomicU64,
    psync_pages: AtomicU64,
    psync_ns: AtomicU64,
}

/// The PMO service: store, window and sessions.
pub struct PmoService {
    store: Store,
    pager: Arc<Pager>,
    design: Mutex<Option<Design>>,
    attachments: Mutex<BTreeMap<u64, Arc<Attachment>>>,
    next_handle: AtomicU64,
    events: Arc<EventSink>,
    kill_hook: KillHook,
    predictor: Option<String>,
    /// The PMO names and sizes LIST walks, as of a store catalog version: a guest listing
    /// n PMOs one index at a time costs n lookups, not n sorted copies of the catalog.
    list_snapshot: Mutex<Option<ListSnapshot>>,
}

/// PMO names and sizes in name order, and the catalog version they are of.
struct ListSnapshot {
    version: u64,
    entries: Arc<Vec<(String, u64)>>,
}

fn store_status(e: &StoreError) -> Status {
    match e {
        StoreError::NotFound(_) => Status::NoEnt,
        StoreError::Exists(_) => Status::Exist,
        StoreError::Busy(_) => Status::Busy,
        StoreError::WrongKey => Status::Access,
        StoreError::InvalidName(_)
        | StoreError::InvalidSize(_)
        | StoreError::PageOutOfRange { .. } => Status::Inval,
        StoreError::Integrity { .. } | StoreError::Corrupt { .. } => Status::BadMsg,
        StoreError::ReadOnly => Status::Perm,
        StoreError::TableFull | StoreError::Alloc(_) => Status::NoSpc,
        _ => Status::Io,
    }
}

impl PmoService {
    pub fn new(cfg: &PmoDeviceConfig) -> Result<Arc<Self>, DeviceError> {
        let design = match &cfg.design {
            Some(d) => Some(Design::from_name(d).ok_or_else(|| DeviceError::Design(d.clone()))?),
            None => None,
        };
        if let Some(spec) = &cfg.predictor {
            // Checked once here so a bad spec is a startup error, not a silent no-op.
            pmo_policies::predictor_from_name(spec)?;
        }
        let (store, kill_hook) = open_store_with(
            &cfg.store,
            cfg.store_size,
            cfg.store_options.clone(),
            cfg.test_kill_in_psync,
        )?;
        let pager = Pager::new(cfg.window_size, cfg.fault_threads)?;
        Ok(Arc::new(PmoService {
            store,
            pager,
            design: Mutex::new(design),
            attachments: Mutex::new(BTreeMap::new()),
            next_handle: AtomicU64::new(1),
            events: Arc::new(EventSink {
                pending: Mutex::new(VecDeque::new()),
                kick: EventFd::new(EFD_NONBLOCK).map_err(DeviceError::EventFd)?,
            }),
            kill_hook,
            predictor: cfg.predictor.clone(),
            list_snapshot: Mutex::new(None),
        }))
    }

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
                self.store
                    .create_pmo(&name, size, &key(&k)?)
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
            Request::Detach { handle } => match self.detach(handle)?.failure {
                // Detached all the same; the status says the session went bad.
                Some(st) => Err(st),
                None => Ok(Vec::new()),
            },
            Request::Psync { handle } => self.psync(handle).map(|n| n.to_le_bytes().to_vec()),
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
        let source = Arc::new(SessionSource {
            session: RwLock::new(Some(session)),
            writable: perm == Perm::Write,
            handle,
            events: self.events.clone(),
            failed: AtomicU32::new(0),
        });
        let (offset, stats) = match self.pager.attach(source.clone(), npages) {
            Ok(x) => x,
            Err(e) => {
                log::warn!("pmo: attach {name:?}: {e}");
                // Dropping the session runs the store's crash handler: nothing changes.
                drop(source.session.write_locked().take());
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
        let size = npages * PAGE as u64;
        self.attachments.locked().insert(
            handle,
            Arc::new(Attachment {
                name: name.to_string(),
                perm,
                source,
                offset,
                size,
                stats,
                psyncs: AtomicU64::new(0),
                psync_pages: AtomicU64::new(0),
                psync_ns: AtomicU64::new(0),
            }),
        );
        let mut out = handle.to_le_bytes().to_vec();
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        Ok(out)
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
        let failure = a.source.failure();
        log::info!(
            "pmo: detach {:?} ({}{}): {} faults ({} us total), {} pages decrypted, {} psyncs of {} pages ({} us), {} integrity failures",
            a.name,
            if a.perm == Perm::Write { "w" } else { "r" },
            if failure.is_some() { ", failed" } else { "" },
            s.faults.load(Ordering::Relaxed),
            s.fault_ns_total.load(Ordering::Relaxed) / 1000,
            s.pages_decrypted.load(Ordering::Relaxed),
            a.psyncs.load(Ordering::Relaxed),
            a.psync_pages.load(Ordering::Relaxed),
            a.psync_ns.load(Ordering::Relaxed) / 1000,
            s.integrity_failures.load(Ordering::Relaxed),
        );
        // Plaintext leaves the window first; then the session ends (in the background).
        if let Err(e) = self.pager.detach(a.offset) {
            log::error!("pmo: detach window slice: {e}");
        }
        let session = a.source.session.write_locked().take();
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
        let guard = a.source.session.read_locked();
        let session = guard.as_ref().ok_or(Status::NoEnt)?;
        // Of this attachment only: once it is detached, its offset may
        // already be a later attachment's.
        let n = self
            .pager
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
            .map_err(|_| Status::NoEnt)??;
        if let Some(k) = &self.kill_hook {
            k.arm(false);
        }
        a.psyncs.fetch_add(1, Ordering::Relaxed);
        a.psync_pages.fetch_add(n, Ordering::Relaxed);
        a.psync_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(n)
    }

    fn stat(&self, handle: u64) -> Result<Vec<u8>, Status> {
        let a = self.attachment(handle)?;
        let s = &a.stats;
        let mut v = Vec::with_capacity(8 * (14 + HIST_BUCKETS));
        for x in [
            a.size,
            s.faults.load(Ordering::Relaxed),
            s.fault_ns_total.load(Ordering::Relaxed),
            s.pages_decrypted.load(Ordering::Relaxed),
            s.pages_prefetched.load(Ordering::Relaxed),
            a.psyncs.load(Ordering::Relaxed),
            a.psync_pages.load(Ordering::Relaxed),
            a.psync_ns.load(Ordering::Relaxed),
            s.integrity_failures.load(Ordering::Relaxed),
        ] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        for b in &s.fault_hist {
            v.extend_from_slice(&b.load(Ordering::Relaxed).to_le_bytes());
        }
        for x in [
            &s.triggers,
            &s.trigger_hits,
            &s.trigger_wasted,
            &s.prefetch_late,
            &s.demand_unpredicted,
        ] {
            v.extend_from_slice(&x.load(Ordering::Relaxed).to_le_bytes());
        }
        Ok(v)
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
            .map(|a| if a.perm == Perm::Write { 2u32 } else { 1 })
            .max()
            .unwrap_or(0);
        let mut v = proto::name_field(name).to_vec();
        v.extend_from_slice(&size.to_le_bytes());
        v.extend_from_slice(&attached.to_le_bytes());
        let more = u32::from((index as usize + 1) < list.len());
        v.extend_from_slice(&more.to_le_bytes());
        Ok(v)
    }

    /// Detaches everything (driver reset, VMM shutdown) and waits until the
    /// store finished. Unsynced changes are dropped: each PMO stays as of its
    /// last psync.
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
    }
}

/// Device configuration space (docs/virtio-pmo.md).
fn config_bytes(window_size: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(32);
    v.extend_from_slice(&u32::from(proto::VERSION).to_le_bytes());
    v.extend_from_slice(&(PAGE as u32).to_le_bytes());
    v.extend_from_slice(&window_size.to_le_bytes());
    v.extend_from_slice(&(proto::MAX_NAME_LEN as u32).to_le_bytes());
    v.extend_from_slice(&(proto::KEY_FIELD as u32).to_le_bytes());
    v.extend_from_slice(&pmo_store::MAX_PMO_SIZE.to_le_bytes());
    v
}

/// The virtio device in front of a [`PmoService`].
pub struct PmoDevice {
    service: Arc<PmoService>,
    config: Vec<u8>,
    worker: Option<QueueWorker>,
}

impl PmoDevice {
    pub fn new(cfg: &PmoDeviceConfig) -> Result<Self, DeviceError> {
        let service = PmoService::new(cfg)?;
        Ok(PmoDevice {
            config: config_bytes(service.pager.size()),
            service,
            worker: None,
        })
    }

    pub fn service(&self) -> &Arc<PmoService> {
        &self.service
    }
}

impl VirtioDevice for PmoDevice {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_PMO
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE]
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }

    fn ack_features(&mut self, _features: u64) {}

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }

    fn write_config(&mut self, offset: u64, _data: &[u8]) {
        log::warn!("virtio-pmo: guest wrote read-only config at {offset:#x}");
    }

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        if ctx.queues.len() != 2 {
            return Err(ActivateError::QueueCount {
                expected: 2,
                got: ctx.queues.len(),
            });
        }
        let mut notifies = Vec::new();
        let mut queues = Vec::new();
        for q in ctx.queues {
            notifies.push((q.index, q.notify));
            queues.push(q.queue);
        }
        if let Ok(kick) = self.service.events.kick.try_clone() {
            notifies.push((EVENT_KICK, kick));
        }
        let mut it = queues.into_iter();
        let (Some(control), Some(event)) = (it.next(), it.next()) else {
            return Err(ActivateError::QueueCount {
                expected: 2,
                got: 0,
            });
        };
        let handler = Handler {
            mem: ctx.mem,
            control,
            event,
            interrupt: ctx.interrupt,
            service: self.service.clone(),
        };
        self.worker = Some(QueueWorker::spawn("virtio-pmo", notifies, handler)?);
        Ok(())
    }

    fn reset(&mut self) {
        self.worker = None;
        self.service.detach_all();
    }

    fn shared_memory(&self) -> Vec<DeviceMemory> {
        vec![DeviceMemory {
            host_addr: self.service.pager.host_addr(),
            len: self.service.pager.size(),
        }]
    }
}

struct Handler {
    mem: GuestMemoryMmap,
    control: Queue,
    event: Queue,
    interrupt: Arc<dyn VirtioInterrupt>,
    service: Arc<PmoService>,
}

/// Reads the request part of a chain and writes the response part; returns
/// the bytes written. Public (hidden) so the descriptor-chain fuzz target
/// drives exactly what the control queue runs.
#[doc(hidden)]
pub fn serve_request(
    service: &PmoService,
    chain: virtio_queue::DescriptorChain<&GuestMemoryMmap>,
) -> u32 {
    let mem = chain.memory();
    let (Ok(mut reader), Ok(mut writer)) = (chain.clone().reader(mem), chain.clone().writer(mem))
    else {
        log::warn!("virtio-pmo: malformed descriptor chain");
        return 0;
    };
    let n = reader.available_bytes().min(proto::MAX_REQUEST_LEN);
    let mut req = zeroize::Zeroizing::new(vec![0u8; n]);
    let (status, payload) = match std::io::Read::read_exact(&mut reader, &mut req) {
        Err(_) => (Status::Proto, Vec::new()),
        Ok(()) => match proto::parse(&req) {
            Ok(r) => {
                log::debug!("virtio-pmo: {}", r.op_name());
                service.execute(r)
            }
            Err(s) => (s, Vec::new()),
        },
    };
    let resp = proto::response(status, &payload);
    let room = writer.available_bytes();
    let out = &resp[..resp.len().min(room)];
    match std::io::Write::write_all(&mut writer, out) {
        Ok(()) => out.len() as u32,
        Err(_) => 0,
    }
}

impl Handler {
    fn process_control(&mut self) {
        let service = &self.service;
        if let Err(e) = drain_queue(
            &mut self.control,
            &self.mem,
            &*self.interrupt,
            CONTROL_QUEUE,
            |c| serve_request(service, c),
        ) {
            log::error!("virtio-pmo: control queue broken: {e}");
        }
    }

    fn process_events(&mut self) {
        let mem = self.mem.clone();
        let mut used = false;
        loop {
            let next = self.service.events.pending.locked().front().copied();
            let Some((kind, handle, page)) = next else {
                break;
            };
            let Some(chain) = self.event.pop_descriptor_chain(&mem) else {
                // No buffer: keep the event until the driver adds one.
                break;
            };
            let head = chain.head_index();
            let mut ev = [0u8; proto::EVENT_LEN];
            ev[..4].copy_from_slice(&kind.to_le_bytes());
            ev[8..16].copy_from_slice(&handle.to_le_bytes());
            ev[16..24].copy_from_slice(&page.to_le_bytes());
            let written = match chain.clone().writer(&mem) {
                Ok(mut w) if w.available_bytes() >= ev.len() => {
                    std::io::Write::write_all(&mut w, &ev).map_or(0, |_| ev.len() as u32)
                }
                _ => 0,
            };
            if self.event.add_used(&mem, head, written).is_err() {
                return;
            }
            self.service.events.pending.locked().pop_front();
            used = true;
        }
        if used && self.event.needs_notification(&mem).unwrap_or(true) {
            let _ = self.interrupt.trigger(InterruptKind::Queue(EVENT_QUEUE));
        }
    }
}

impl QueueHandler for Handler {
    fn process_queue(&mut self, index: u16) {
        match index {
            CONTROL_QUEUE => self.process_control(),
            EVENT_QUEUE | EVENT_KICK => self.process_events(),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
