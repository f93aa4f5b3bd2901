//! Userfaultfd for pmovmm's pagers (the PMO window, the CXL expander's device cache):
//!
//! - [`Uffd`] (`fd.rs`): a safe owner of the fd and the ioctls the pagers use (register, copy
//!   and install with retry, write-protect, wake), on the kernel ABI directly;
//! - [`AnonMap`] (`map.rs`): the mapping a pager serves, and the only place that changes its
//!   protection or drops its pages (`mprotect`, `madvise`), with their errors returned;
//! - [`FaultServer`] (`server.rs`): the one fault-thread loop every pager runs on.

mod fd;
mod map;
mod server;

pub use fd::{Fault, Install, Uffd};
pub use map::{Access, AnonMap};
pub use server::{FaultHandler, FaultServer, Watch, SPIN_AFTER_FAULT};

/// The base page size userfaultfd reports and installs at (x86-64).
pub const PAGE_SIZE: u64 = 4096;
