//! The PMO device's wire: encrypted persistent memory objects served to a guest over virtio.
//!
//! The store itself (medium, crypto, format, recovery) is the `pmo-store` crate, and the PMO
//! service (the pager, the attachments, every PMO call) is `pmo-pager`. This crate holds the
//! protocol the guest speaks ([`proto`]), the glue that carries a request from a descriptor
//! chain to the service and back ([`serve`]), the sink that turns failed pages into event-queue
//! buffers ([`events`]), and pmovmm's virtio `device` (feature `device`, on by default). A VMM
//! with a device model of its own (Cloud Hypervisor) takes the crate without that feature, so
//! it pulls in none of pmovmm's virtio crates.

#[cfg(feature = "device")]
pub mod device;
pub mod events;
pub mod proto;
pub mod serve;
