//! The PMO device: encrypted persistent memory objects served to a guest.
//!
//! This crate holds the host-side PMO store: the [`medium`] that persists bytes, the [`crypto`]
//! that protects pages, and the [`store`] that lays PMOs out on a medium with crash-atomic
//! psync and recovery. The pager (userfaultfd window) and the virtio protocol build on it.

pub mod cli_support;
pub mod crypto;
#[cfg(feature = "device")]
pub mod device;
pub mod medium;
#[cfg(feature = "device")]
pub mod pager;
#[cfg(feature = "device")]
pub mod proto;
pub mod store;
