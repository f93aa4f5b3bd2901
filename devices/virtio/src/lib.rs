//! The virtio device model that pmovmm's virtio-pci transport drives.
//!
//! A device only knows about its queues, its configuration space and the
//! guest memory; the transport (in the `vmm` crate) owns PCI, MSI-X and the
//! notification eventfds. Keeping the trait here, below the VMM, lets device
//! crates such as `pmo-virtio` implement it without depending on the machine.

pub mod pmem;
mod worker;

use std::io;
use std::sync::Arc;

use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

pub use worker::{QueueHandler, QueueWorker, WorkerError};

/// `VIRTIO_F_VERSION_1`: every device we offer is a modern (1.0+) device.
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;

/// Which interrupt a device raises; the transport maps it to an MSI-X vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InterruptKind {
    /// The device configuration changed.
    Config,
    /// The used ring of this queue has new entries.
    Queue(u16),
}

/// Raises guest interrupts on behalf of a device, from any thread.
pub trait VirtioInterrupt: Send + Sync {
    /// Sets the ISR bit of `kind` and sends its MSI-X vector, if the driver assigned one.
    fn trigger(&self, kind: InterruptKind) -> io::Result<()>;
}

/// A queue handed to the device when the driver sets DRIVER_OK.
pub struct ActiveQueue {
    /// Position of the queue in the device's queue list.
    pub index: u16,
    /// The ring addresses and size the driver programmed.
    pub queue: Queue,
    /// Signalled (by KVM, through an ioeventfd) whenever the driver notifies this queue.
    pub notify: EventFd,
}

/// Everything a device needs to start serving its queues.
pub struct ActivateContext {
    /// Guest memory the rings and buffers live in.
    pub mem: GuestMemoryMmap,
    /// How the device tells the driver about used buffers and config changes.
    pub interrupt: Arc<dyn VirtioInterrupt>,
    /// The queues the driver enabled, in queue-index order.
    pub queues: Vec<ActiveQueue>,
}

/// Why a device refused to start.
#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    /// The driver enabled a different number of queues than the device serves.
    #[error("expected {expected} queues, got {got}")]
    QueueCount {
        /// Queues the device serves.
        expected: usize,
        /// Queues the driver enabled.
        got: usize,
    },
    /// The thread that serves the queues could not start.
    #[error("cannot start the queue worker: {0}")]
    Worker(#[from] WorkerError),
}

/// A virtio device as seen by its transport.
pub trait VirtioDevice: Send {
    /// Virtio device type (e.g. 27 for pmem).
    fn device_type(&self) -> u32;
    /// Maximum size of each queue, one entry per queue.
    fn queue_max_sizes(&self) -> &[u16];
    /// Feature bits offered to the driver.
    fn features(&self) -> u64;
    /// The features the driver accepted (a subset of `features`).
    fn ack_features(&mut self, features: u64);
    /// Reads the device-specific configuration space; out-of-range bytes read as 0.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes the device-specific configuration space; read-only fields ignore writes.
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// Starts serving the queues.
    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError>;
    /// Stops serving the queues (driver reset). Afterwards the device may be activated again.
    fn reset(&mut self);
    /// Guest memory regions the device needs mapped into the guest at an
    /// address the VMM chooses and reports in the device's own config
    /// (virtio-pmem's region).
    fn device_memory(&self) -> Vec<DeviceMemory> {
        Vec::new()
    }
    /// Virtio shared memory regions (spec 2.10), in shmid order; the
    /// transport exposes them through a 64-bit BAR.
    fn shared_memory(&self) -> Vec<DeviceMemory> {
        Vec::new()
    }
    /// Hands the device the means to map memory into the run-time part of its shared memory
    /// regions ([`DeviceMemory::runtime_len`]). The transport calls it once, before the
    /// driver can see the device, if any region has such a part.
    fn set_shm_mapper(&mut self, _mapper: Arc<dyn ShmMapper>) {}
}

/// Maps host memory into the run-time part of a device's shared memory region while the
/// device runs, wherever the guest has placed the region (and again if it moves it).
pub trait ShmMapper: Send + Sync {
    /// Maps `len` bytes at `host_addr` at `offset` bytes into shared memory region `region`
    /// (an index into [`VirtioDevice::shared_memory`]); the guest sees them there until the
    /// returned [`ShmMapping`] is dropped. The range must lie in the region's run-time part
    /// and overlap no other live mapping. A `read_only` mapping refuses guest stores (they
    /// become MMIO exits the VMM ignores).
    ///
    /// # Safety
    /// `host_addr..host_addr + len` must stay mapped in this process for as long as the
    /// returned [`ShmMapping`] lives.
    unsafe fn map(
        &self,
        region: usize,
        offset: u64,
        host_addr: u64,
        len: u64,
        read_only: bool,
    ) -> Result<ShmMapping, ShmMapError>;
}

/// A live mapping made through a [`ShmMapper`]; dropping it takes the memory out of the guest.
pub struct ShmMapping {
    _owner: Box<dyn Send + Sync>,
}

impl ShmMapping {
    /// Wraps the transport's owner of the mapping (whose drop unmaps it).
    pub fn new(owner: Box<dyn Send + Sync>) -> Self {
        Self { _owner: owner }
    }
}

impl std::fmt::Debug for ShmMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShmMapping")
    }
}

/// Why a run-time shared memory mapping was refused.
#[derive(Debug, thiserror::Error)]
pub enum ShmMapError {
    /// The device has no such region, or the range is outside its run-time part.
    #[error("{offset:#x}+{len:#x} is outside the run-time part of shared memory region {region}")]
    OutOfRange {
        /// The region asked for.
        region: usize,
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
    },
    /// The range is empty, not page-aligned, or overlaps a live mapping.
    #[error("{offset:#x}+{len:#x} is empty, unaligned or overlaps a live mapping")]
    Conflict {
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
    },
    /// The hypervisor refused the mapping.
    #[error("map into the guest: {0}")]
    Hypervisor(String),
}

/// Host memory a device exposes directly to the guest at a physical address
/// chosen by the VMM (virtio-pmem's region, later the PMO window).
#[derive(Clone, Copy, Debug)]
pub struct DeviceMemory {
    /// Host virtual address of the mapping; stays valid while the device lives.
    pub host_addr: u64,
    /// Length of the mapping in bytes.
    pub len: u64,
    /// Guest-physical space after the first `len` bytes that the device fills while it runs,
    /// through the [`ShmMapper`] it is given (a hole to the guest until then; 0 for none).
    pub runtime_len: u64,
}

/// Serves every available chain of `queue` with `serve` (which returns the
/// bytes it wrote into the chain), then raises queue `index`'s interrupt if
/// anything was used and the driver wants to hear about it.
pub fn drain_queue(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    interrupt: &dyn VirtioInterrupt,
    index: u16,
    mut serve: impl FnMut(virtio_queue::DescriptorChain<&GuestMemoryMmap>) -> u32,
) -> Result<(), virtio_queue::Error> {
    use virtio_queue::QueueT;
    let mut used = false;
    while let Some(chain) = queue.pop_descriptor_chain(mem) {
        let head = chain.head_index();
        let len = serve(chain);
        queue.add_used(mem, head, len)?;
        used = true;
    }
    if used && queue.needs_notification(mem).unwrap_or(true) {
        if let Err(e) = interrupt.trigger(InterruptKind::Queue(index)) {
            log::error!("virtio: queue {index} interrupt: {e}");
        }
    }
    Ok(())
}

/// Copies `value` (little-endian bytes of a config structure) into `data` at
/// `offset`, the way every device's `read_config` needs it.
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Ok(start) = usize::try_from(offset) else {
        return;
    };
    if start >= config.len() {
        return;
    }
    let end = config.len().min(start.saturating_add(data.len()));
    data[..end - start].copy_from_slice(&config[start..end]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_reads_clip_at_the_end() {
        let cfg = [1u8, 2, 3, 4];
        let mut out = [0xffu8; 4];
        read_config_bytes(&cfg, 2, &mut out);
        assert_eq!(out, [3, 4, 0, 0]);
        read_config_bytes(&cfg, 9, &mut out);
        assert_eq!(out, [0; 4]);
        read_config_bytes(&cfg, u64::MAX, &mut out);
        assert_eq!(out, [0; 4]);
    }
}
