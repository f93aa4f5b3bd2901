//! The pmovmm virtual machine monitor as a library: the `pmovmm` binary is a thin CLI over
//! it, and tests can build machines directly.
//!
//! Public: [`config`] (one validated `VmConfig` from flags or a TOML file), [`machine`] (builds
//! and runs the VM a config describes), [`exit`] (why it stopped), [`cli`] (the host tools
//! `pmovmm store ...` and `pmovmm cxl create`). The machine's inside: `vm` (KVM VM, guest
//! memory, memslots), `cpu` (vCPU threads), `boot` (Linux 64-bit boot protocol), `layout` (the
//! guest address map), `acpi`, `bus` (port and MMIO dispatch), `pci_root` (the PCIe root
//! complex: ECAM, 0xCF8, BARs on the MMIO bus; the functions and the virtio-pci transport are
//! the `pci` crate's), `legacy` (serial, power, pvpanic, reset), `cxl` (CXL host bridges and
//! the expander's PCI function), `sandbox` (seccomp and Landlock for a run).

mod acpi;
mod boot;
mod bus;
pub mod cli;
pub mod config;
mod cpu;
mod cxl;
pub mod exit;
mod layout;
mod legacy;
pub mod machine;
mod pci_root;
pub mod sandbox;
mod vm;
