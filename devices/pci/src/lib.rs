//! PCI functions for a VMM: a function's configuration space (registers, write masks, BARs,
//! capability lists), MSI-X, a PCIe root port, and the virtio-pci modern transport in front of
//! any [`virtio_devices::VirtioDevice`].
//!
//! A root complex (pmovmm's is `vmm/src/pci_root.rs`) routes config cycles and BAR accesses to
//! a [`PciDevice`]; nothing here knows the VMM's buses. MSI-X messages and queue notifiers go
//! to KVM (`kvm-ioctls`); a device's shared memory reaches the guest through the VMM's
//! [`GuestSlots`]. The transport also runs without a VM
//! ([`virtio::VirtioPci::without_vm`]), which is how the fuzz target `virtio_pci` drives it.

pub mod config;
pub mod msix;
pub mod root_port;
mod slots;
pub mod virtio;

pub use slots::{GuestSlot, GuestSlots, SlotError};

use config::PciConfig;

/// A PCI function as the root complex sees it.
pub trait PciDevice: Send {
    /// The function's configuration space (the root reads it directly).
    fn config(&self) -> &PciConfig;
    /// Guest config write; devices override it to react to their capabilities.
    fn config_write(&mut self, reg: usize, offset: usize, data: &[u8]);
    /// Guest read within a BAR; a function without BARs never sees one.
    fn bar_read(&mut self, _bar: usize, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }
    /// Guest write within a BAR.
    fn bar_write(&mut self, _bar: usize, _offset: u64, _data: &[u8]) {}
    /// The guest moved, enabled (`old` is `None`) or disabled (`new` is `None`) a BAR.
    fn bar_moved(&mut self, _bar: usize, _old: Option<u64>, _new: Option<u64>) {}
    /// For a bridge: the bus number behind it, as the guest programmed it.
    fn secondary_bus(&self) -> Option<u8> {
        None
    }
}
