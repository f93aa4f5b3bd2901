//! The guest mappings of a device's virtio shared memory regions, all in one BAR: each
//! region's fixed part (one memslot over the device's host memory) and the mappings the
//! device makes while it runs in the region's run-time part (one memslot each, e.g. a PMO
//! attachment that lives on the CXL expander). Every mapping is re-created wherever the guest
//! places the BAR, and all go before the device's memory does.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use locked::Locked;
use virtio_devices::{ShmMapError, ShmMapper, ShmMapping};

use crate::{GuestSlot, GuestSlots};

/// One shared memory region's place in the BAR.
#[derive(Clone, Copy, Debug)]
pub(super) struct Region {
    /// Offset of the region in the BAR.
    pub offset: u64,
    /// Host memory behind the fixed part.
    pub host: u64,
    /// Length of the fixed part.
    pub len: u64,
    /// Length of the run-time part, right after the fixed part.
    pub runtime_len: u64,
}

/// A run-time mapping: where in the BAR, which host memory, and its memslot while the BAR
/// is placed.
struct Runtime {
    bar_offset: u64,
    host: u64,
    len: u64,
    read_only: bool,
    slot: Option<GuestSlot>,
}

/// Every mapping of the BAR; shared between the transport and the device's [`ShmMapper`].
pub(super) struct ShmTable {
    mapper: Box<dyn GuestSlots>,
    regions: Vec<Region>,
    /// Guest address of the BAR, while the guest has placed it.
    base: Option<u64>,
    fixed: Vec<GuestSlot>,
    runtime: BTreeMap<u64, Runtime>,
    next_id: u64,
}

impl ShmTable {
    pub fn new(mapper: Box<dyn GuestSlots>, regions: Vec<Region>) -> Arc<Mutex<Self>> {
        Arc::new(Mutex::new(Self {
            mapper,
            regions,
            base: None,
            fixed: Vec::new(),
            runtime: BTreeMap::new(),
            next_id: 0,
        }))
    }

    /// Whether any region has a run-time part (the device then gets a mapper).
    pub fn has_runtime(&self) -> bool {
        self.regions.iter().any(|r| r.runtime_len > 0)
    }

    /// The guest placed the BAR at `base` (or took it away): every mapping moves.
    pub fn place(&mut self, base: Option<u64>) {
        // Old mappings go first: KVM refuses overlapping slots.
        self.unmap_all();
        self.base = base;
        let Some(base) = base else { return };
        for r in &self.regions {
            // SAFETY: the fixed part's host memory belongs to the device, which the transport
            // owns; the transport calls `unmap_all` before the device is dropped.
            match unsafe { self.mapper.map(base + r.offset, r.host, r.len, false) } {
                Ok(slot) => self.fixed.push(slot),
                Err(e) => log::error!(
                    "virtio-pci: map shared memory at {:#x}: {e}",
                    base + r.offset
                ),
            }
        }
        for m in self.runtime.values_mut() {
            // SAFETY: the device keeps the host memory mapped while its `ShmMapping` lives,
            // and dropping that removes this entry (and its slot) first.
            match unsafe {
                self.mapper
                    .map(base + m.bar_offset, m.host, m.len, m.read_only)
            } {
                Ok(slot) => m.slot = Some(slot),
                Err(e) => log::error!(
                    "virtio-pci: map run-time shared memory at {:#x}: {e}",
                    base + m.bar_offset
                ),
            }
        }
    }

    /// Takes every mapping out of the guest (they come back at the next `place`).
    pub fn unmap_all(&mut self) {
        self.fixed.clear();
        for m in self.runtime.values_mut() {
            m.slot = None;
        }
    }

    /// Checks a run-time mapping request; returns its offset in the BAR.
    fn check(&self, region: usize, offset: u64, len: u64) -> Result<u64, ShmMapError> {
        let outside = ShmMapError::OutOfRange {
            region,
            offset,
            len,
        };
        let Some(r) = self.regions.get(region) else {
            return Err(outside);
        };
        let runtime = r.len..r.len.saturating_add(r.runtime_len);
        let end = offset.checked_add(len);
        if !runtime.contains(&offset) || end.is_none_or(|e| e > runtime.end) {
            return Err(outside);
        }
        let bar_offset = r.offset + offset;
        let overlaps = self
            .runtime
            .values()
            .any(|m| bar_offset < m.bar_offset + m.len && m.bar_offset < bar_offset + len);
        if len == 0 || !offset.is_multiple_of(4096) || !len.is_multiple_of(4096) || overlaps {
            return Err(ShmMapError::Conflict { offset, len });
        }
        Ok(bar_offset)
    }
}

/// The device's handle on the table.
pub(super) struct TableMapper(pub Arc<Mutex<ShmTable>>);

/// Removes its run-time mapping from the table (and the guest) when dropped.
struct RuntimeOwner {
    table: Arc<Mutex<ShmTable>>,
    id: u64,
}

impl Drop for RuntimeOwner {
    fn drop(&mut self) {
        self.table.locked().runtime.remove(&self.id);
    }
}

impl ShmMapper for TableMapper {
    unsafe fn map(
        &self,
        region: usize,
        offset: u64,
        host_addr: u64,
        len: u64,
        read_only: bool,
    ) -> Result<ShmMapping, ShmMapError> {
        let mut t = self.0.locked();
        let bar_offset = t.check(region, offset, len)?;
        let slot = match t.base {
            // SAFETY: the caller keeps the host range mapped while the mapping lives; the
            // slot is dropped with the entry, which the returned owner removes.
            Some(base) => Some(
                unsafe { t.mapper.map(base + bar_offset, host_addr, len, read_only) }
                    .map_err(|e| ShmMapError::Hypervisor(e.to_string()))?,
            ),
            None => None,
        };
        let id = t.next_id;
        t.next_id += 1;
        t.runtime.insert(
            id,
            Runtime {
                bar_offset,
                host: host_addr,
                len,
                read_only,
                slot,
            },
        );
        Ok(ShmMapping::new(Box::new(RuntimeOwner {
            table: self.0.clone(),
            id,
        })))
    }
}

#[cfg(test)]
mod tests {
    // Test code: an unwrap that fails is a failed test.
    #![allow(clippy::unwrap_used)]

    use super::*;
    use kvm_bindings::{kvm_userspace_memory_region, KVM_MEM_READONLY};
    use kvm_ioctls::{Kvm, VmFd};

    const MB: u64 = 1 << 20;
    /// A guest-physical address far above anything else in the test VM.
    const BAR: u64 = 1 << 36;

    /// Real KVM memslots on a bare VM, made as pmovmm's `SlotMapper` makes them.
    struct KvmSlots {
        vm: Arc<VmFd>,
        free: Arc<Mutex<Vec<u32>>>,
    }

    /// One memslot; dropping it deletes the slot.
    struct KvmSlot {
        vm: Arc<VmFd>,
        free: Arc<Mutex<Vec<u32>>>,
        slot: u32,
    }

    impl KvmSlots {
        fn new() -> Self {
            KvmSlots {
                vm: Arc::new(Kvm::new().unwrap().create_vm().unwrap()),
                free: Arc::new(Mutex::new((0..32).rev().collect())),
            }
        }
    }

    /// Sets (or, with `len` 0, deletes) memslot `slot`.
    ///
    /// # Safety
    /// The host range must stay mapped while the slot exists.
    unsafe fn set(
        vm: &VmFd,
        slot: u32,
        gpa: u64,
        host: u64,
        len: u64,
        read_only: bool,
    ) -> Result<(), kvm_ioctls::Error> {
        let region = kvm_userspace_memory_region {
            slot,
            flags: if read_only { KVM_MEM_READONLY } else { 0 },
            guest_phys_addr: gpa,
            memory_size: len,
            userspace_addr: host,
        };
        // SAFETY: forwarded from the caller's guarantee.
        unsafe { vm.set_user_memory_region(region) }
    }

    impl GuestSlots for KvmSlots {
        unsafe fn map(
            &self,
            gpa: u64,
            host_addr: u64,
            len: u64,
            read_only: bool,
        ) -> Result<GuestSlot, crate::SlotError> {
            let slot = self.free.locked().pop().ok_or("no free memslot")?;
            // SAFETY: the caller keeps the host range mapped while the slot lives.
            if let Err(e) = unsafe { set(&self.vm, slot, gpa, host_addr, len, read_only) } {
                self.free.locked().push(slot);
                return Err(e.into());
            }
            Ok(Box::new(KvmSlot {
                vm: self.vm.clone(),
                free: self.free.clone(),
                slot,
            }))
        }
    }

    impl Drop for KvmSlot {
        fn drop(&mut self) {
            // SAFETY: a zero-sized region deletes the slot; no host memory is referenced.
            unsafe { set(&self.vm, self.slot, 0, 0, 0, false) }.unwrap();
            self.free.locked().push(self.slot);
        }
    }

    /// Anonymous memory the test's memslots point at.
    struct Host(*mut libc::c_void, usize);

    impl Host {
        fn new(len: u64) -> Self {
            // SAFETY: a fresh private anonymous mapping; checked below.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            Host(p, len as usize)
        }
        fn addr(&self, off: u64) -> u64 {
            self.0 as u64 + off
        }
    }

    impl Drop for Host {
        fn drop(&mut self) {
            // SAFETY: unmaps what `new` mapped; every slot over it is gone by now.
            unsafe { libc::munmap(self.0, self.1) };
        }
    }

    fn slots_live(t: &ShmTable) -> (usize, usize) {
        let runtime = t.runtime.values().filter(|m| m.slot.is_some()).count();
        (t.fixed.len(), runtime)
    }

    /// Real KVM memslots: run-time mappings land in the run-time part only, never overlap,
    /// follow the BAR when the guest moves it (KVM refuses a slot that overlaps a live one,
    /// so a mapping left behind would show as a missing slot), and go when dropped.
    #[test]
    fn run_time_mappings_follow_the_bar_and_go_when_dropped() {
        let fixed = Host::new(4 * MB);
        let extra = Host::new(8 * MB);
        let table = ShmTable::new(
            Box::new(KvmSlots::new()),
            vec![Region {
                offset: 0,
                host: fixed.addr(0),
                len: 4 * MB,
                runtime_len: 8 * MB,
            }],
        );
        assert!(table.locked().has_runtime());
        let mapper = TableMapper(table.clone());
        // Before the guest placed the BAR: recorded, mapped at placement.
        // SAFETY: `extra` outlives every mapping of this test (all are dropped before it).
        let a = unsafe { mapper.map(0, 4 * MB, extra.addr(0), 2 * MB, false) }.unwrap();
        assert_eq!(slots_live(&table.locked()), (0, 0));
        table.locked().place(Some(BAR));
        assert_eq!(slots_live(&table.locked()), (1, 1));
        // SAFETY: as for `a`.
        let b = unsafe { mapper.map(0, 8 * MB, extra.addr(4 * MB), 4 * MB, true) }.unwrap();
        assert_eq!(slots_live(&table.locked()), (1, 2));

        let refused = |region, offset, len| {
            // SAFETY: refused before any slot is made.
            unsafe { mapper.map(region, offset, extra.addr(0), len, false) }.unwrap_err()
        };
        // Inside the fixed part, past the end, overlapping, unaligned, empty, no region.
        assert!(matches!(
            refused(0, 0, 2 * MB),
            ShmMapError::OutOfRange { .. }
        ));
        assert!(matches!(
            refused(0, 10 * MB, 4 * MB),
            ShmMapError::OutOfRange { .. }
        ));
        assert!(matches!(
            refused(0, u64::MAX - 4095, 4096),
            ShmMapError::OutOfRange { .. }
        ));
        assert!(matches!(
            refused(0, 5 * MB, 2 * MB),
            ShmMapError::Conflict { .. }
        ));
        assert!(matches!(
            refused(0, 6 * MB + 1, 4096),
            ShmMapError::Conflict { .. }
        ));
        assert!(matches!(
            refused(0, 6 * MB, 0),
            ShmMapError::Conflict { .. }
        ));
        assert!(matches!(
            refused(1, 4 * MB, 4096),
            ShmMapError::OutOfRange { .. }
        ));

        // The guest moves the BAR: every slot is made again at the new place.
        table.locked().place(Some(BAR + (1 << 30)));
        assert_eq!(slots_live(&table.locked()), (1, 2));
        drop(a);
        assert_eq!(slots_live(&table.locked()), (1, 1));
        // Its range is free again.
        // SAFETY: as for `a`.
        let c = unsafe { mapper.map(0, 4 * MB, extra.addr(0), 4 * MB, false) }.unwrap();
        assert_eq!(slots_live(&table.locked()), (1, 2));
        table.locked().place(None);
        assert_eq!(slots_live(&table.locked()), (0, 0));
        table.locked().place(Some(BAR));
        assert_eq!(slots_live(&table.locked()), (1, 2));
        drop((b, c));
        table.locked().unmap_all();
        assert_eq!(slots_live(&table.locked()), (0, 0));
    }
}
