//! The PMO device: encrypted persistent memory objects served to a guest.
//!
//! This crate holds the host-side PMO store: the [`medium`] that persists bytes, the [`crypto`]
//! that protects pages, and the [`store`] that lays PMOs out on a medium with crash-atomic
//! psync and recovery. On top of it: the [`pager`] (the userfaultfd-backed window that holds
//! plaintext working copies), the wire [`proto`]col, and the virtio [`device`] that serves it.

pub mod cli_support;
pub mod crypto;
pub mod device;
pub mod medium;
pub mod pager;
pub mod proto;
pub mod store;
