//! The PMO device: encrypted persistent memory objects served to a guest over virtio.
//!
//! The store itself (medium, crypto, format, recovery) is the `pmo-store` crate. This crate
//! puts it in front of a guest: the [`pager`] (the userfaultfd-backed window that holds
//! plaintext working copies), the wire [`proto`]col, and the virtio [`device`] that serves it;
//! design `c`'s [`working`] copies on a CXL expander bypass the pager.

pub mod device;
pub mod pager;
pub mod proto;
pub mod source;
pub mod working;
