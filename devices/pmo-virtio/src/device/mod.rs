//! The virtio-pmo device: the control queue in front of the PMO service.
//!
//! The service owns the store, the pager (window) and the attach sessions.
//! Requests are parsed by [`crate::proto`]; every failure becomes a status
//! code for the guest. The device never trusts a handle, offset or length
//! from the guest: handles are looked up, window slices come from the pager.
//!
//! Files: this one holds the virtio device (queues, config space, activation) and opens the
//! store; `service.rs` executes the requests.

use locked::Locked;
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use virtio_devices::{
    drain_queue, read_config_bytes, ActivateContext, ActivateError, DeviceMemory, InterruptKind,
    QueueHandler, QueueWorker, VirtioDevice, VirtioInterrupt, VIRTIO_F_VERSION_1,
};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::proto::{self, Request, Status};
use direct::{DirectCopy, DirectSetup};
use pmo_crypto::{UserKey, PAGE};
use pmo_media::{Backing, FileMedium, KillInPsync, Medium};
use pmo_pager::pager::{
    Detected, FillError, PageSource, Pager, PagerError, SliceStats, HIST_BUCKETS,
};
use pmo_pager::source::SessionSource;
use pmo_store::{CreateOptions, Design, Perm, Store, StoreError, StoreOptions};

const QUEUE_SIZE: u16 = 128;
const CONTROL_QUEUE: u16 = 0;
const EVENT_QUEUE: u16 = 1;
/// Internal wakeup of the queue thread: events waiting for the event queue.
const EVENT_KICK: u16 = 2;

/// Errors bringing the PMO device up.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The store file cannot be created or opened.
    #[error("PMO store {path}: {source}")]
    Medium {
        /// The store file.
        path: PathBuf,
        /// Why.
        source: pmo_media::MediumError,
    },
    /// The store cannot be formatted, opened or recovered.
    #[error("PMO store {path}: {source}")]
    Store {
        /// The store file.
        path: PathBuf,
        /// Why.
        source: StoreError,
    },
    /// The window cannot be set up.
    #[error("PMO window: {0}")]
    Pager(#[from] PagerError),
    /// `--pmo-design` names no design.
    #[error("unknown PMO design {0:?}")]
    Design(String),
    /// `--pmo-predictor` names no predictor, or a bad parameter.
    #[error("PMO predictor: {0}")]
    Predictor(#[from] pmo_policies::PolicyError),
    /// `--pmo-dram ...,policy=` names no placement policy.
    #[error("PMO placement policy: {0}")]
    Placement(#[from] pmo_policies::TieringError),
    /// The event-queue notifier cannot be made.
    #[error("eventfd: {0}")]
    EventFd(std::io::Error),
}

/// How to build the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PmoDeviceConfig {
    /// The store file.
    pub store: PathBuf,
    /// Size to create the store with when the file does not exist.
    pub store_size: Option<u64>,
    /// Design for attaches (None: each PMO's own).
    pub design: Option<String>,
    /// Bytes of the window attached PMOs appear in (address space until touched).
    pub window_size: u64,
    /// Threads serving the window's faults.
    pub fault_threads: usize,
    /// Test hook: kill the process at this persist point of every psync.
    pub test_kill_in_psync: Option<u64>,
    /// Predictor spec for every attachment (`stream:4`, `stride`, `markov`, ...).
    pub predictor: Option<String>,
    /// The store's rollback anchor and the Argon2id cost of PMOs the guest creates (both
    /// always), and how a missing store is formatted (slots; ignored when the file exists).
    /// Tests and fuzz targets format small stores, which create and open in microseconds.
    pub store_options: StoreOptions,
    /// Keep the plaintext in the window within a DRAM budget, demoting to the CXL tier.
    pub dram_budget: Option<DramBudgetConfig>,
    /// What moving one page into or out of the store's expander's device memory costs, in ns
    /// (a working copy of design `cf`, dirty pages demoted under a DRAM budget); 0 for a
    /// store file.
    pub device_memory_latency_ns: u64,
}

/// `--pmo-dram SIZE[,policy=NAME]`: the window's local-DRAM budget and its placement policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DramBudgetConfig {
    /// Bytes of plaintext the window may hold, across all attachments.
    pub bytes: u64,
    /// Placement policy spec (`hotness`, `fifo`).
    pub policy: String,
}

/// The store's medium, possibly behind the psync kill hook.
type KillHook = Option<Arc<KillInPsync<Arc<dyn Medium>>>>;

/// Opens the store file, creating and formatting it if missing.
pub fn open_store(path: &Path, size: Option<u64>) -> Result<Store, DeviceError> {
    open_file_store(path, size, StoreOptions::default(), None).map(|(s, _)| s)
}

fn open_file_store(
    path: &Path,
    size: Option<u64>,
    opts: StoreOptions,
    kill_at: Option<u64>,
) -> Result<(Store, KillHook), DeviceError> {
    let (file, fresh) =
        FileMedium::open_or_create(path, size).map_err(|source| DeviceError::Medium {
            path: path.to_owned(),
            source,
        })?;
    let opened = open_store_on(path, Arc::new(file).into(), fresh, opts, kill_at);
    if opened.is_err() && fresh {
        // Leave nothing behind that a later run would take for a damaged store.
        let _ = std::fs::remove_file(path);
    }
    opened
}

/// Opens the store on `media`, formatting it first when `blank`; `label` (the file or the
/// media behind it) names it in errors and logs.
fn open_store_on(
    label: &Path,
    backing: Backing,
    blank: bool,
    opts: StoreOptions,
    kill_at: Option<u64>,
) -> Result<(Store, KillHook), DeviceError> {
    let mut hook: KillHook = None;
    let backing = match kill_at {
        // Only the bytes go through the hook; the extent keys stay as they are.
        Some(n) => backing.map_medium(|m| {
            let k = Arc::new(KillInPsync::new(m, n));
            hook = Some(k.clone());
            k
        }),
        None => backing,
    };
    let store = match Store::open_or_format(backing, blank, opts) {
        Ok((store, Some(report))) => {
            log::info!("PMO store {}: {report:?}", label.display());
            store
        }
        Ok((store, None)) => store,
        Err(source) => {
            return Err(DeviceError::Store {
                path: label.to_owned(),
                source,
            })
        }
    };
    Ok((store, hook))
}

/// Device configuration space (docs/virtio-pmo.md).
fn config_bytes(window_size: u64) -> Vec<u8> {
    proto::DeviceConfig {
        version: u32::from(proto::VERSION),
        page_size: PAGE as u32,
        window_size,
        max_name_len: proto::MAX_NAME_LEN as u32,
        max_key_len: proto::KEY_FIELD as u32,
        max_pmo_size: pmo_store::MAX_PMO_SIZE,
    }
    .encode()
    .to_vec()
}

/// The virtio device in front of a [`PmoService`].
pub struct PmoDevice {
    service: Arc<PmoService>,
    config: Vec<u8>,
    worker: Option<QueueWorker>,
}

impl PmoDevice {
    /// Opens (or creates) the store file and starts the service behind the device.
    pub fn new(cfg: &PmoDeviceConfig) -> Result<Self, DeviceError> {
        Ok(Self::serving(PmoService::new(cfg)?))
    }

    /// The device over a store on media the VMM opened (a PMO store on a CXL expander's
    /// media with its extent keys, `cfg.store` naming that media); formats it first when
    /// `blank`.
    pub fn with_medium(
        cfg: &PmoDeviceConfig,
        backing: Backing,
        blank: bool,
    ) -> Result<Self, DeviceError> {
        Ok(Self::serving(PmoService::with_medium(cfg, backing, blank)?))
    }

    fn serving(service: Arc<PmoService>) -> Self {
        PmoDevice {
            config: config_bytes(service.pager().size()),
            service,
            worker: None,
        }
    }

    /// The service, which outlives a device reset (the VMM keeps it to detach all at exit).
    pub fn service(&self) -> &Arc<PmoService> {
        &self.service
    }

    /// Puts the working copies of design `c` attachments in `area`, on the store's expander,
    /// mapped straight into the guest after the window (see `direct.rs`). Call before the
    /// transport is built: the guest-visible window grows by the area's size.
    pub fn set_direct_area(&mut self, area: Arc<cxl_t3::WorkingArea>) {
        let len = area.len();
        self.service.direct.locked().set_area(area);
        self.config = config_bytes(self.service.pager().size().saturating_add(len));
    }
}

impl VirtioDevice for PmoDevice {
    fn device_type(&self) -> u32 {
        proto::VIRTIO_ID_PMO
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
            host_addr: self.service.pager().host_addr(),
            len: self.service.pager().size(),
            runtime_len: self.service.direct.locked().len(),
        }]
    }

    fn set_shm_mapper(&mut self, mapper: Arc<dyn virtio_devices::ShmMapper>) {
        self.service.direct.locked().set_mapper(mapper);
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
            let ev = proto::Event { kind, handle, page }.encode();
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

mod direct;
mod page_events;
mod service;

pub use service::PmoService;

#[cfg(test)]
mod tests;
