//! The pmovmm virtual machine monitor as a library: the `pmovmm` binary is a
//! thin CLI over it, and tests can build machines directly.

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
pub mod pci;
mod vm;
