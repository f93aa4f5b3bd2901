//! The virtio-pci modern transport (virtio 1.x, section 4.1).
//!
//! BAR0 (32 KiB) holds every structure the driver needs:
//!
//! | offset  | structure                                     |
//! |---------|-----------------------------------------------|
//! | 0x0000  | common configuration                          |
//! | 0x1000  | ISR status                                    |
//! | 0x2000  | device configuration                          |
//! | 0x3000  | notifications, 4 bytes per queue (ioeventfds) |
//! | 0x4000  | MSI-X table                                   |
//! | 0x6000  | MSI-X pending bits                            |
//!
//! Devices with virtio shared memory regions (the PMO window) get BAR2, a
//! 64-bit prefetchable BAR that is not trapped: it is a KVM memslot over the
//! device's host memory, re-created wherever the guest places the BAR.
//!
//! Queue notifications never reach this code: KVM signals the queue's
//! eventfd directly and the device's worker thread wakes up.

use locked::Locked;
use std::sync::atomic::{AtomicU16, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use kvm_ioctls::VmFd;
use virtio_devices::VirtioDevice;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::config::{BarKind, PciConfig, PciIds};
use super::msix::{Msix, SharedMsix};
use super::PciDevice;
use crate::GuestSlots;
use shm::{Region, ShmTable, TableMapper};

mod activate;
mod common_config;
mod shm;

const BAR_SIZE: u64 = 0x8000;
const COMMON_OFFSET: u64 = 0x0000;
const COMMON_SIZE: u64 = 0x38;
const ISR_OFFSET: u64 = 0x1000;
const DEVICE_OFFSET: u64 = 0x2000;
const DEVICE_SIZE: u64 = 0x1000;
const NOTIFY_OFFSET: u64 = 0x3000;
const NOTIFY_SIZE: u64 = 0x1000;
const NOTIFY_MULTIPLIER: u32 = 4;
const MSIX_TABLE_OFFSET: u64 = 0x4000;
const MSIX_PBA_OFFSET: u64 = 0x6000;

const VIRTIO_PCI_VENDOR: u16 = 0x1af4;
const VIRTIO_PCI_DEVICE_BASE: u16 = 0x1040;
const PCI_CAP_ID_VENDOR: u8 = 0x09;
const PCI_CAP_ID_MSIX: u8 = 0x11;
const CAP_COMMON: u8 = 1;
const CAP_NOTIFY: u8 = 2;
const CAP_ISR: u8 = 3;
const CAP_DEVICE: u8 = 4;
const CAP_SHARED_MEMORY: u8 = 8;
/// BAR that holds the shared memory regions.
const SHM_BAR: usize = 2;

/// "No vector" in virtio's MSI-X vector fields.
pub const NO_VECTOR: u16 = 0xffff;

const STATUS_ACKNOWLEDGE: u8 = 1;
const STATUS_DRIVER: u8 = 2;
const STATUS_DRIVER_OK: u8 = 4;
const STATUS_FEATURES_OK: u8 = 8;
const STATUS_FAILED: u8 = 0x80;

/// What the driver programmed for one queue.
struct QueueConfig {
    max_size: u16,
    size: u16,
    enabled: bool,
    desc: u64,
    avail: u64,
    used: u64,
    notify: EventFd,
}

/// A virtio device behind the PCI transport.
pub struct VirtioPci {
    /// Guest mappings of the device's shared memory; emptied in `drop`, before the
    /// device that owns the memory goes.
    shm: Option<Arc<Mutex<ShmTable>>>,
    config: PciConfig,
    msix_cap: usize,
    dev: Box<dyn VirtioDevice>,
    /// Where ioeventfds and MSI-X messages go; `None` only for a transport
    /// driven without a VM ([`VirtioPci::without_vm`]).
    vm: Option<Arc<VmFd>>,
    mem: GuestMemoryMmap,
    msix: SharedMsix,
    isr: Arc<AtomicU8>,
    config_vector: Arc<AtomicU16>,
    queue_vectors: Arc<[AtomicU16]>,
    queues: Vec<QueueConfig>,
    device_feature_select: u32,
    driver_feature_select: u32,
    driver_features: u64,
    status: u8,
    config_generation: u8,
    queue_select: u16,
    active: bool,
    notify_base: Option<u64>,
}

/// Errors building the transport.
#[derive(Debug, thiserror::Error)]
pub enum VirtioPciError {
    /// A queue or config-change notifier could not be made.
    #[error("eventfd: {0}")]
    EventFd(std::io::Error),
    /// The transport's capabilities do not fit its configuration space.
    #[error("config space: {0}")]
    Config(#[from] super::config::ConfigError),
    /// More queues than the transport serves.
    #[error("device has {0} queues; the transport supports at most 1023")]
    TooManyQueues(usize),
    /// The shared memory regions do not fit a 64-bit BAR.
    #[error("shared memory regions larger than the address space")]
    ShmTooLarge,
    /// A device with a shared-memory region needs a memslot mapper.
    #[error("device has shared memory but the transport got no way to map it")]
    NoMapper,
}

/// A `virtio_pci_cap` after its ID/next bytes: cap_len, cfg_type, bar, id,
/// padding[2], offset, length, then `extra` (the notify multiplier, or the
/// high halves of a 64-bit shared-memory capability).
fn vendor_cap(cfg_type: u8, bar: u8, id: u8, offset: u64, length: u64, extra: &[u8]) -> Vec<u8> {
    let mut body = vec![(16 + extra.len()) as u8, cfg_type, bar, id, 0, 0];
    body.extend_from_slice(&(offset as u32).to_le_bytes());
    body.extend_from_slice(&(length as u32).to_le_bytes());
    body.extend_from_slice(extra);
    body
}

impl VirtioPci {
    /// `mapper` maps the device's shared memory regions into the guest; it is
    /// required only for devices that have some.
    pub fn new(
        dev: Box<dyn VirtioDevice>,
        vm: Arc<VmFd>,
        mem: GuestMemoryMmap,
        mapper: Option<Box<dyn GuestSlots>>,
    ) -> Result<Self, VirtioPciError> {
        Self::build(dev, Some(vm), mem, mapper)
    }

    /// A transport with no VM behind it: notify writes only reach the
    /// queues' eventfds through the BAR and MSI-X messages are dropped
    /// (pending bits still work). The fuzz targets drive the registers with
    /// it; devices with shared memory are refused (nothing can map it).
    #[doc(hidden)]
    pub fn without_vm(
        dev: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
    ) -> Result<Self, VirtioPciError> {
        Self::build(dev, None, mem, None)
    }

    fn build(
        mut dev: Box<dyn VirtioDevice>,
        vm: Option<Arc<VmFd>>,
        mem: GuestMemoryMmap,
        mapper: Option<Box<dyn GuestSlots>>,
    ) -> Result<Self, VirtioPciError> {
        let nq = dev.queue_max_sizes().len();
        if nq >= 1024 {
            return Err(VirtioPciError::TooManyQueues(nq));
        }
        let ty = dev.device_type();
        let mut config = PciConfig::new(PciIds {
            vendor: VIRTIO_PCI_VENDOR,
            device: VIRTIO_PCI_DEVICE_BASE + ty as u16,
            class: 0xff_00_00,
            revision: 1,
            subsystem_vendor: VIRTIO_PCI_VENDOR,
            subsystem: 0x40,
        });
        config.add_bar(0, BAR_SIZE, BarKind::Mem32)?;
        config.add_capability(
            PCI_CAP_ID_VENDOR,
            &vendor_cap(CAP_COMMON, 0, 0, COMMON_OFFSET, COMMON_SIZE, &[]),
            &[],
        )?;
        config.add_capability(
            PCI_CAP_ID_VENDOR,
            &vendor_cap(
                CAP_NOTIFY,
                0,
                0,
                NOTIFY_OFFSET,
                NOTIFY_SIZE,
                &NOTIFY_MULTIPLIER.to_le_bytes(),
            ),
            &[],
        )?;
        config.add_capability(
            PCI_CAP_ID_VENDOR,
            &vendor_cap(CAP_ISR, 0, 0, ISR_OFFSET, 1, &[]),
            &[],
        )?;
        config.add_capability(
            PCI_CAP_ID_VENDOR,
            &vendor_cap(CAP_DEVICE, 0, 0, DEVICE_OFFSET, DEVICE_SIZE, &[]),
            &[],
        )?;
        let mut regions = Vec::new();
        let mut shm_end = 0u64;
        for (id, region) in dev.shared_memory().iter().enumerate() {
            let offset = shm_end.next_multiple_of(4096);
            let len = region
                .len
                .checked_add(region.runtime_len)
                .ok_or(VirtioPciError::ShmTooLarge)?;
            let mut hi = ((offset >> 32) as u32).to_le_bytes().to_vec();
            hi.extend_from_slice(&((len >> 32) as u32).to_le_bytes());
            let body = vendor_cap(CAP_SHARED_MEMORY, SHM_BAR as u8, id as u8, offset, len, &hi);
            config.add_capability(PCI_CAP_ID_VENDOR, &body, &[])?;
            regions.push(Region {
                offset,
                host: region.host_addr,
                len: region.len,
                runtime_len: region.runtime_len,
            });
            shm_end = offset.checked_add(len).ok_or(VirtioPciError::ShmTooLarge)?;
        }
        let mut shm = None;
        if shm_end > 0 {
            let Some(mapper) = mapper else {
                return Err(VirtioPciError::NoMapper);
            };
            config.add_bar(
                SHM_BAR,
                shm_end.next_power_of_two(),
                BarKind::Mem64 { prefetchable: true },
            )?;
            let table = ShmTable::new(mapper, regions);
            if table.locked().has_runtime() {
                dev.set_shm_mapper(Arc::new(TableMapper(table.clone())));
            }
            shm = Some(table);
        }
        let vectors = nq as u16 + 1;
        let mut msix_body = Vec::new();
        msix_body.extend_from_slice(&(vectors - 1).to_le_bytes());
        msix_body.extend_from_slice(&(MSIX_TABLE_OFFSET as u32).to_le_bytes());
        msix_body.extend_from_slice(&(MSIX_PBA_OFFSET as u32).to_le_bytes());
        let msix_cap = config.add_capability(PCI_CAP_ID_MSIX, &msix_body, &[0x00, 0xc0])?;

        let mut queues = Vec::with_capacity(nq);
        for &max in dev.queue_max_sizes() {
            queues.push(QueueConfig {
                max_size: max,
                size: max,
                enabled: false,
                desc: 0,
                avail: 0,
                used: 0,
                notify: EventFd::new(EFD_NONBLOCK).map_err(VirtioPciError::EventFd)?,
            });
        }
        Ok(VirtioPci {
            config,
            msix_cap,
            msix: Arc::new(Mutex::new(Msix::new(vectors, vm.clone()))),
            dev,
            vm,
            mem,
            isr: Arc::new(AtomicU8::new(0)),
            config_vector: Arc::new(AtomicU16::new(NO_VECTOR)),
            queue_vectors: (0..nq).map(|_| AtomicU16::new(NO_VECTOR)).collect(),
            queues,
            device_feature_select: 0,
            driver_feature_select: 0,
            driver_features: 0,
            status: 0,
            config_generation: 0,
            queue_select: 0,
            active: false,
            notify_base: None,
            shm,
        })
    }

    /// Size of the shared-memory BAR, if the device has one.
    pub fn shm_bar_size(&self) -> Option<u64> {
        self.config.bar_size(SHM_BAR)
    }

    /// Firmware-style placement of the shared-memory BAR.
    pub fn set_shm_bar(&mut self, addr: u64) {
        self.config.set_bar_addr(SHM_BAR, addr);
    }

    fn map_shm(&mut self, base: Option<u64>) {
        if let Some(t) = &self.shm {
            t.locked().place(base);
        }
    }

    /// Firmware-style placement of BAR0 before the guest boots.
    pub fn set_bar0(&mut self, addr: u64) {
        self.config.set_bar_addr(0, addr);
    }

    /// Size of BAR0 (common, notify, ISR and device config, and the MSI-X table).
    pub fn bar0_size() -> u64 {
        BAR_SIZE
    }

    fn selected_queue(&mut self) -> Option<&mut QueueConfig> {
        self.queues.get_mut(usize::from(self.queue_select))
    }
}

impl PciDevice for VirtioPci {
    fn config(&self) -> &PciConfig {
        &self.config
    }

    fn config_write(&mut self, reg: usize, offset: usize, data: &[u8]) {
        self.config.write_reg(reg, offset, data);
        if reg == self.msix_cap / 4 {
            let control = (self.config.read_reg(reg) >> 16) as u16;
            self.msix.locked().set_control(control);
        }
    }

    fn bar_read(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if bar != 0 {
            return;
        }
        match offset {
            o if o < COMMON_OFFSET + COMMON_SIZE => self.read_common(o - COMMON_OFFSET, data),
            o if o == ISR_OFFSET => {
                // Reading the ISR acknowledges it.
                if let Some(b) = data.first_mut() {
                    *b = self.isr.swap(0, Ordering::AcqRel);
                }
            }
            o if (DEVICE_OFFSET..DEVICE_OFFSET + DEVICE_SIZE).contains(&o) => {
                self.dev.read_config(o - DEVICE_OFFSET, data)
            }
            o if (MSIX_TABLE_OFFSET..MSIX_PBA_OFFSET).contains(&o) => {
                self.msix.locked().read_table(o - MSIX_TABLE_OFFSET, data)
            }
            o if (MSIX_PBA_OFFSET..BAR_SIZE).contains(&o) => {
                self.msix.locked().read_pba(o - MSIX_PBA_OFFSET, data)
            }
            _ => {}
        }
    }

    fn bar_write(&mut self, bar: usize, offset: u64, data: &[u8]) {
        if bar != 0 {
            return;
        }
        match offset {
            o if o < COMMON_OFFSET + COMMON_SIZE => self.write_common(o - COMMON_OFFSET, data),
            o if (DEVICE_OFFSET..DEVICE_OFFSET + DEVICE_SIZE).contains(&o) => {
                self.dev.write_config(o - DEVICE_OFFSET, data)
            }
            o if (NOTIFY_OFFSET..NOTIFY_OFFSET + NOTIFY_SIZE).contains(&o) => {
                // Only reached before the ioeventfds exist (or if KVM refused them).
                let q = ((o - NOTIFY_OFFSET) / u64::from(NOTIFY_MULTIPLIER)) as usize;
                if let Some(qc) = self.queues.get(q) {
                    let _ = qc.notify.write(1);
                }
            }
            o if (MSIX_TABLE_OFFSET..MSIX_PBA_OFFSET).contains(&o) => {
                self.msix.locked().write_table(o - MSIX_TABLE_OFFSET, data)
            }
            _ => {}
        }
    }

    fn bar_moved(&mut self, bar: usize, _old: Option<u64>, new: Option<u64>) {
        match (bar, new) {
            (0, Some(new)) => self.register_notifiers(new),
            (SHM_BAR, new) => self.map_shm(new),
            _ => {}
        }
    }
}

impl Drop for VirtioPci {
    fn drop(&mut self) {
        // The guest must lose the device's memory before the device frees it.
        if let Some(t) = &self.shm {
            t.locked().unmap_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_capability_is_a_64_bit_virtio_cap() {
        let body = vendor_cap(
            CAP_SHARED_MEMORY,
            2,
            7,
            0x1_0000_2000,
            0x3_4000_0000,
            &[1, 0, 0, 0, 3, 0, 0, 0],
        );
        assert_eq!(&body[..4], &[24, CAP_SHARED_MEMORY, 2, 7]);
        assert_eq!(&body[6..10], &0x2000u32.to_le_bytes());
        assert_eq!(&body[10..14], &0x4000_0000u32.to_le_bytes());
        assert_eq!(body.len(), 22, "24 bytes with the ID and next bytes");
        let plain = vendor_cap(CAP_ISR, 0, 0, ISR_OFFSET, 1, &[]);
        assert_eq!(&plain[..4], &[16, CAP_ISR, 0, 0]);
    }
}
