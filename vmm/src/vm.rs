//! The KVM virtual machine: capabilities, interrupt controllers, guest RAM and memslots.

use locked::Locked;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use kvm_bindings::{kvm_pit_config, kvm_userspace_memory_region, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{Cap, Kvm, VmFd};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use crate::layout;

/// Errors creating or configuring the VM.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("cannot open /dev/kvm: {0}")]
    OpenKvm(kvm_ioctls::Error),
    #[error("KVM API version {0} is not supported (need 12)")]
    ApiVersion(i32),
    #[error("KVM lacks a required capability: {0}")]
    MissingCap(&'static str),
    #[error("create VM: {0}")]
    CreateVm(kvm_ioctls::Error),
    #[error("set up {what}: {source}")]
    Setup {
        what: &'static str,
        source: kvm_ioctls::Error,
    },
    #[error("allocate guest memory: {0}")]
    GuestMemory(vm_memory::mmap::FromRangesError),
    #[error("register memslot at {gpa:#x}: {source}")]
    MemSlot { gpa: u64, source: kvm_ioctls::Error },
    #[error("no free KVM memslot")]
    NoSlot,
}

/// Address of the three pages KVM needs for the TSS on Intel (below the IOAPIC hole).
const KVM_TSS_ADDRESS: usize = 0xfffb_d000;
/// Page KVM needs for the real-mode identity map on Intel (just below the TSS).
const KVM_IDENTITY_MAP_ADDRESS: u64 = 0xfffb_c000;

/// Capabilities we rely on; a KVM without them gets a clear error up front.
const REQUIRED_CAPS: &[(Cap, &str)] = &[
    (Cap::Irqchip, "KVM_CAP_IRQCHIP"),
    (Cap::UserMemory, "KVM_CAP_USER_MEMORY"),
    (Cap::SetTssAddr, "KVM_CAP_SET_TSS_ADDR"),
    (Cap::Pit2, "KVM_CAP_PIT2"),
    (Cap::PitState2, "KVM_CAP_PIT_STATE2"),
    (Cap::ExtCpuid, "KVM_CAP_EXT_CPUID"),
    (Cap::Irqfd, "KVM_CAP_IRQFD"),
    (Cap::Ioeventfd, "KVM_CAP_IOEVENTFD"),
    (Cap::SignalMsi, "KVM_CAP_SIGNAL_MSI"),
    (Cap::ImmediateExit, "KVM_CAP_IMMEDIATE_EXIT"),
];

/// A KVM VM with its guest RAM registered.
pub struct Vm {
    kvm: Kvm,
    fd: Arc<VmFd>,
    mem: GuestMemoryMmap,
    slots: Arc<SlotAllocator>,
}

impl Vm {
    /// Opens KVM, checks what we need and builds a VM with `mem_size` bytes of RAM.
    pub fn new(mem_size: u64) -> Result<Self, VmError> {
        let kvm = Kvm::new().map_err(VmError::OpenKvm)?;
        let api = kvm.get_api_version();
        if api != kvm_bindings::KVM_API_VERSION as i32 {
            return Err(VmError::ApiVersion(api));
        }
        for (cap, name) in REQUIRED_CAPS {
            if !kvm.check_extension(*cap) {
                return Err(VmError::MissingCap(name));
            }
        }
        let fd = kvm.create_vm().map_err(VmError::CreateVm)?;
        let setup = |what| move |source| VmError::Setup { what, source };
        fd.set_tss_address(KVM_TSS_ADDRESS)
            .map_err(setup("TSS address"))?;
        fd.set_identity_map_address(KVM_IDENTITY_MAP_ADDRESS)
            .map_err(setup("identity map address"))?;
        fd.create_irq_chip().map_err(setup("in-kernel irqchip"))?;
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        fd.create_pit2(pit).map_err(setup("in-kernel PIT"))?;

        let ranges: Vec<(GuestAddress, usize)> = layout::ram_regions(mem_size)
            .into_iter()
            .map(|(start, len)| (GuestAddress(start), len as usize))
            .collect();
        let mem = GuestMemoryMmap::from_ranges(&ranges).map_err(VmError::GuestMemory)?;
        // KVM's own limit (509 or 32764 on x86), capped: PMO attachments on a CXL expander
        // take one slot each while attached.
        let max_slots = u32::try_from(kvm.get_nr_memslots())
            .unwrap_or(u32::MAX)
            .clamp(MIN_SLOTS, MAX_SLOTS);
        let vm = Vm {
            kvm,
            fd: Arc::new(fd),
            mem,
            slots: Arc::new(SlotAllocator::new(max_slots)),
        };
        for region in vm.mem.iter() {
            let slot = vm.slots.alloc()?;
            let host = region.as_ptr() as u64;
            // SAFETY: the region is a live mapping owned by `vm.mem`, which
            // lives as long as the VM (RAM slots are never removed).
            unsafe {
                set_region(
                    &vm.fd,
                    slot,
                    region.start_addr().0,
                    host,
                    region.len(),
                    false,
                )?
            };
        }
        Ok(vm)
    }

    pub fn kvm(&self) -> &Kvm {
        &self.kvm
    }

    pub fn fd(&self) -> &Arc<VmFd> {
        &self.fd
    }

    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// A handle devices keep to (re)map their memory when the guest moves a BAR.
    pub fn slot_mapper(&self) -> SlotMapper {
        SlotMapper {
            vm: self.fd.clone(),
            slots: self.slots.clone(),
        }
    }
}

/// Creates device memslots on a VM; cheap to clone.
#[derive(Clone)]
pub struct SlotMapper {
    vm: Arc<VmFd>,
    slots: Arc<SlotAllocator>,
}

impl SlotMapper {
    /// # Safety
    /// `host_addr..host_addr+len` must stay mapped for as long as the returned
    /// [`MemSlot`] lives.
    pub unsafe fn map(
        &self,
        gpa: u64,
        host_addr: u64,
        len: u64,
        read_only: bool,
    ) -> Result<MemSlot, VmError> {
        let slot = self.slots.alloc()?;
        // SAFETY: the caller guarantees the host range outlives the slot.
        if let Err(e) = unsafe { set_region(&self.vm, slot, gpa, host_addr, len, read_only) } {
            self.slots.release(slot);
            return Err(e);
        }
        Ok(MemSlot {
            vm: self.vm.clone(),
            slots: self.slots.clone(),
            slot,
            gpa,
        })
    }
}

/// How the `pci` crate's virtio-pci transport maps a device's shared memory into the guest.
impl pci::GuestSlots for SlotMapper {
    unsafe fn map(
        &self,
        gpa: u64,
        host_addr: u64,
        len: u64,
        read_only: bool,
    ) -> Result<pci::GuestSlot, pci::SlotError> {
        // SAFETY: forwarded from the caller's guarantee.
        let slot = unsafe { SlotMapper::map(self, gpa, host_addr, len, read_only) }?;
        Ok(Box::new(slot))
    }
}

/// Hands out KVM memslot numbers.
struct SlotAllocator {
    next: AtomicU32,
    free: std::sync::Mutex<Vec<u32>>,
    max: u32,
}

/// KVM guarantees at least 32 user slots on x86.
const MIN_SLOTS: u32 = 32;
/// RAM, device memory and one slot per PMO attachment on an expander fit in this many.
const MAX_SLOTS: u32 = 1024;

impl SlotAllocator {
    fn new(max: u32) -> Self {
        Self {
            next: AtomicU32::new(0),
            free: std::sync::Mutex::new(Vec::new()),
            max,
        }
    }

    fn alloc(&self) -> Result<u32, VmError> {
        if let Some(s) = self.free.locked().pop() {
            return Ok(s);
        }
        // Never past `max`, however often a full table is asked again.
        self.next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                (s < self.max).then_some(s + 1)
            })
            .map_err(|_| VmError::NoSlot)
    }

    fn release(&self, slot: u32) {
        self.free.locked().push(slot);
    }
}

/// # Safety
/// The host range must stay mapped while the slot exists.
unsafe fn set_region(
    fd: &VmFd,
    slot: u32,
    gpa: u64,
    host: u64,
    len: u64,
    read_only: bool,
) -> Result<(), VmError> {
    let region = kvm_userspace_memory_region {
        slot,
        flags: if read_only {
            kvm_bindings::KVM_MEM_READONLY
        } else {
            0
        },
        guest_phys_addr: gpa,
        memory_size: len,
        userspace_addr: host,
    };
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { fd.set_user_memory_region(region) }.map_err(|source| VmError::MemSlot { gpa, source })
}

/// RAII owner of a device memslot: dropping it removes the mapping from the guest.
pub struct MemSlot {
    vm: Arc<VmFd>,
    slots: Arc<SlotAllocator>,
    slot: u32,
    gpa: u64,
}

impl Drop for MemSlot {
    fn drop(&mut self) {
        // SAFETY: a zero-sized region deletes the slot; no host memory is referenced.
        let r = unsafe { set_region(&self.vm, self.slot, self.gpa, 0, 0, false) };
        match r {
            Ok(()) => self.slots.release(self.slot),
            Err(e) => log::error!("cannot remove memslot {}: {e}", self.slot),
        }
    }
}
