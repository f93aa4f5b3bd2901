//! The virtio-pmo device: the control queue in front of the PMO service (`pmo-pager`).
//!
//! The service owns the store, the pager (window) and the attachments. Requests are parsed
//! by [`crate::proto`] and carried out by [`crate::serve`]; every failure becomes a status
//! code for the guest. Failed pages reach the guest through the event queue (`events.rs`);
//! design `c` working copies are mapped through the transport's shared-memory mapper
//! (`shm.rs`).

use std::sync::Arc;

use virtio_devices::{
    drain_queue, read_config_bytes, ActivateContext, ActivateError, DeviceMemory, InterruptKind,
    QueueHandler, QueueWorker, VirtioDevice, VirtioInterrupt, VIRTIO_F_VERSION_1,
};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use crate::events::EventSink;
use crate::proto;
use crate::serve::{device_config, serve_chain};
use pmo_media::Backing;
use pmo_pager::{PmoConfig, PmoService, ServiceError};
use shm::ShmGuestMapper;

const QUEUE_SIZE: u16 = 128;
const CONTROL_QUEUE: u16 = 0;
const EVENT_QUEUE: u16 = 1;
/// Internal wakeup of the queue thread: events waiting for the event queue.
const EVENT_KICK: u16 = 2;

/// Errors bringing the PMO device up.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The service (store, window) cannot be set up.
    #[error(transparent)]
    Service(#[from] ServiceError),
    /// The event-queue notifier cannot be made.
    #[error("eventfd: {0}")]
    EventFd(std::io::Error),
}

/// The virtio device in front of a [`PmoService`].
pub struct PmoDevice {
    service: Arc<PmoService>,
    events: Arc<EventSink>,
    config: Vec<u8>,
    worker: Option<QueueWorker>,
}

impl PmoDevice {
    /// Opens (or creates) the store file and starts the service behind the device.
    pub fn new(cfg: &PmoConfig) -> Result<Self, DeviceError> {
        let events = Arc::new(EventSink::new().map_err(DeviceError::EventFd)?);
        let service = PmoService::open(cfg, events.clone())?;
        Ok(Self::serving(service, events))
    }

    /// The device over a store on media the VMM opened (a PMO store on a CXL expander's
    /// media with its extent keys, `cfg.store` naming that media); formats it first when
    /// `blank`.
    pub fn with_medium(
        cfg: &PmoConfig,
        backing: Backing,
        blank: bool,
    ) -> Result<Self, DeviceError> {
        let events = Arc::new(EventSink::new().map_err(DeviceError::EventFd)?);
        let service = PmoService::on_medium(cfg, backing, blank, events.clone())?;
        Ok(Self::serving(service, events))
    }

    fn serving(service: Arc<PmoService>, events: Arc<EventSink>) -> Self {
        PmoDevice {
            config: device_config(service.pager().size()),
            service,
            events,
            worker: None,
        }
    }

    /// The service, which outlives a device reset (the VMM keeps it to detach all at exit).
    pub fn service(&self) -> &Arc<PmoService> {
        &self.service
    }

    /// Puts the working copies of design `c` attachments in `area`, on the store's expander,
    /// mapped straight into the guest after the window. Call before the transport is built:
    /// the guest-visible window grows by the area's size.
    pub fn set_working_area(&mut self, area: Arc<cxl_t3::WorkingArea>) {
        self.service.set_working_area(area);
        let len = self.service.working_area_len();
        self.config = device_config(self.service.pager().size().saturating_add(len));
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
        if let Ok(kick) = self.events.kick().try_clone() {
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
            events: self.events.clone(),
        };
        self.worker = Some(QueueWorker::spawn(
            threads::ThreadKind::PmoQueue,
            "virtio-pmo",
            notifies,
            handler,
        )?);
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
            runtime_len: self.service.working_area_len(),
        }]
    }

    fn set_shm_mapper(&mut self, mapper: Arc<dyn virtio_devices::ShmMapper>) {
        self.service
            .set_guest_mapper(Arc::new(ShmGuestMapper(mapper)));
    }
}

struct Handler {
    mem: GuestMemoryMmap,
    control: Queue,
    event: Queue,
    interrupt: Arc<dyn VirtioInterrupt>,
    service: Arc<PmoService>,
    events: Arc<EventSink>,
}

impl Handler {
    fn process_control(&mut self) {
        let service = &self.service;
        if let Err(e) = drain_queue(
            &mut self.control,
            &self.mem,
            &*self.interrupt,
            CONTROL_QUEUE,
            |c| serve_chain(service, c),
        ) {
            log::error!("virtio-pmo: control queue broken: {e}");
        }
    }

    fn process_events(&mut self) {
        let mem = self.mem.clone();
        let mut used = false;
        while let Some(ev) = self.events.next_event() {
            let Some(chain) = self.event.pop_descriptor_chain(&mem) else {
                // No buffer: keep the event until the driver adds one.
                break;
            };
            let head = chain.head_index();
            let written = match chain.clone().writer(&mem) {
                Ok(mut w) if w.available_bytes() >= ev.len() => {
                    std::io::Write::write_all(&mut w, &ev).map_or(0, |_| ev.len() as u32)
                }
                _ => 0,
            };
            if self.event.add_used(&mem, head, written).is_err() {
                return;
            }
            self.events.pop();
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

mod shm;

#[cfg(test)]
mod tests;
