//! The PMO device's wire: encrypted persistent memory objects served to a guest over virtio.
//!
//! The store itself (medium, crypto, format, recovery) is the `pmo-store` crate, and the PMO
//! service (the pager, the attachments, every PMO call) is `pmo-pager`. This crate holds the
//! protocol the guest speaks ([`proto`]), the glue that carries a request from a descriptor
//! chain to the service and back ([`serve`], usable by any VMM on the rust-vmm queue and memory
//! crates), and pmovmm's virtio [`device`].

pub mod device;
pub mod proto;
pub mod serve;
