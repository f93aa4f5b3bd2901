//! The persistent byte range under the PMO store, apart from the store.
//!
//! A [`Medium`] is written with ordinary stores and made durable only by [`Medium::persist`], an
//! ordered durability point: when it returns, every write inside the range issued before it is
//! durable. The store never relies on anything else, so a crash-injecting medium
//! ([`CrashMedium`]) can drop every write not covered by a persist and show that recovery copes.
//!
//! The store and the CXL expander both use this crate (the expander's `CxlMedium` is a
//! [`Medium`], its media charge their latency with [`charge`]); neither depends on the other.
//! What a medium offers beyond bytes has its own traits and travels beside it in [`Backing`]:
//! the keys of PMO extents on a medium that encrypts them inline ([`ExtentKeys`]), and whether
//! its reads wait for modelled device time (a scheduling hint for the pager).

mod backing;
mod crash;
mod extent;
mod file;
mod kill;
mod part;
mod timing;

pub use backing::Backing;
pub use crash::{CrashMedium, CrashMode};
pub use extent::{Extent, ExtentKeys};
pub use file::{FileMedium, Persistence};
pub use kill::KillInPsync;
pub use part::Part;
pub use timing::{charge, PmTiming, TimedMedium, SPIN_LIMIT};

/// Errors of a medium.
#[derive(Debug, thiserror::Error)]
pub enum MediumError {
    /// An access outside the medium.
    #[error("access {off:#x}+{len:#x} beyond medium end {end:#x}")]
    OutOfRange {
        /// Start of the access.
        off: u64,
        /// Length of the access.
        len: u64,
        /// Medium length.
        end: u64,
    },
    /// The operating system refused an operation.
    #[error("{what}: {source}")]
    Io {
        /// What was attempted.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A write through a read-only handle.
    #[error("medium opened read-only")]
    ReadOnly,
    /// Another process (or another handle in this one) has the store file open.
    #[error("medium file is in use by another owner")]
    InUse,
    /// A crash-injecting medium reached its crash point; nothing more reaches it.
    #[error("medium crashed (injected)")]
    Crashed,
}

/// A persistent byte range. Implementations must be safe to use from several threads as long as
/// concurrent writers touch disjoint ranges (the store guarantees that with its locks).
pub trait Medium: Send + Sync {
    /// Length in bytes.
    fn len(&self) -> u64;
    /// True when the medium has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `buf.len()` bytes at `off` into `buf`.
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), MediumError>;
    /// Copies `data` to `off`. Not durable until a covering [`Medium::persist`].
    fn write(&self, off: u64, data: &[u8]) -> Result<(), MediumError>;
    /// Makes every earlier write inside `[off, off+len)` durable, in order with later writes.
    fn persist(&self, off: u64, len: u64) -> Result<(), MediumError>;
    /// Base of a direct mapping of the whole medium, for zero-copy users, if there is one.
    /// Dereferencing it is the caller's `unsafe` business and must respect the store's locking.
    fn as_ptr(&self) -> Option<*mut u8> {
        None
    }
    /// Zeroes a range (used to scrub freed space). May deallocate backing storage. Not durable
    /// until persisted.
    fn zero(&self, off: u64, len: u64) -> Result<(), MediumError> {
        check_range(self.len(), off, len)?;
        let chunk = [0u8; 65536];
        let mut at = off;
        let end = off + len;
        while at < end {
            let n = (end - at).min(chunk.len() as u64) as usize;
            self.write(at, &chunk[..n])?;
            at += n as u64;
        }
        Ok(())
    }
    /// Zeroes a range the store writes again soon (the journal area, scrubbed at detach and
    /// filled by the next psync), keeping its backing storage: on a file, a punched hole
    /// makes every page of the next psync's journal an allocation (a first psync of a session
    /// at 0.8 GB/s against 1.5 GB/s for the next, 1024 pages on `/dev/shm`). Not durable
    /// until persisted. Default: [`Medium::zero`].
    fn zero_in_place(&self, off: u64, len: u64) -> Result<(), MediumError> {
        self.zero(off, len)
    }
}

/// Validates an access against the medium length without overflow.
pub fn check_range(end: u64, off: u64, len: u64) -> Result<(), MediumError> {
    match off.checked_add(len) {
        Some(e) if e <= end => Ok(()),
        _ => Err(MediumError::OutOfRange { off, len, end }),
    }
}

impl<M: Medium + ?Sized> Medium for std::sync::Arc<M> {
    fn len(&self) -> u64 {
        (**self).len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), MediumError> {
        (**self).read(off, buf)
    }
    fn write(&self, off: u64, data: &[u8]) -> Result<(), MediumError> {
        (**self).write(off, data)
    }
    fn persist(&self, off: u64, len: u64) -> Result<(), MediumError> {
        (**self).persist(off, len)
    }
    fn zero(&self, off: u64, len: u64) -> Result<(), MediumError> {
        (**self).zero(off, len)
    }
    fn zero_in_place(&self, off: u64, len: u64) -> Result<(), MediumError> {
        (**self).zero_in_place(off, len)
    }
    fn as_ptr(&self) -> Option<*mut u8> {
        (**self).as_ptr()
    }
}
