//! The PMO device: encrypted persistent memory objects served to a guest over virtio.
//!
//! The store itself (medium, crypto, format, recovery) is the `pmo-store` crate and the pager
//! (the userfaultfd window, store sessions as page sources) is `pmo-pager`. This crate is the
//! device's wire: the [`proto`]col the guest speaks and the virtio [`device`] that serves it.

pub mod device;
pub mod proto;
