//! An emulated CXL Type 3 memory expander (the device of seed 003, CMM-H).
//!
//! The guest-facing half is what Linux 6.1's `cxl_pci`, `cxl_port` and
//! `cxl_mem` drivers talk to: the PCI function's DVSECs, the register
//! blocks, the mailbox, the HDM decoders and the label storage area.
//!
//! The memory half is what the decoded range is made of: a device DRAM cache
//! (set-associative, write-back) in front of persistent media in a host
//! file, with TEE range-based encryption between the two, so the media never
//! holds plaintext of a keyed range.
//!
//! See docs/cxl-t3.md.

// Guest-facing half.
pub mod dvsec;
pub mod hdm;
pub mod lsa;
pub mod mailbox;
pub mod regs;

// Memory half.
pub mod cache;
pub mod expander;
pub mod media;
pub mod tee;

pub use expander::{CxlMedium, WorkingArea, WorkingExtent};
