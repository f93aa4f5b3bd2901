//! The pmovmm virtual machine monitor as a library: the `pmovmm` binary is a
//! thin CLI over it, and tests can build machines directly.

pub mod acpi;
pub mod boot;
pub mod bus;
pub mod cli;
pub mod config;
pub mod cpu;
pub mod cxl;
pub mod exit;
pub mod layout;
pub mod legacy;
pub mod machine;
pub mod pci;
pub mod vm;
