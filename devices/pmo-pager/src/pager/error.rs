//! What can go wrong in the pager: setting up the window and giving out its slices
//! ([`PagerError`]), and filling one page ([`FillError`]).

use std::io;

/// Errors of the pager.
#[derive(Debug, thiserror::Error)]
pub enum PagerError {
    /// A window size of no pages or part of a page.
    #[error("window of {0} bytes is not a non-zero multiple of the page size")]
    BadWindowSize(u64),
    /// The window cannot be mapped.
    #[error("mmap window: {0}")]
    Mmap(io::Error),
    /// The userfaultfd cannot be made or registered.
    #[error("userfaultfd: {0}")]
    Uffd(io::Error),
    /// No free run of the window is that many pages long.
    #[error("the window has no room for {0} more pages")]
    WindowFull(u64),
    /// No attachment starts at that offset.
    #[error("no attachment at window offset {0:#x}")]
    NoSlice(u64),
    /// A fault or prefetch thread cannot be started.
    #[error("spawn fault thread: {0}")]
    Spawn(io::Error),
    /// The fault server's stop notifier cannot be made.
    #[error("eventfd: {0}")]
    EventFd(io::Error),
    /// Dropping a slice's pages failed: the range is not reused (it may hold plaintext).
    #[error("clear window range at {offset:#x}: {source}")]
    Zap {
        /// The slice's window offset.
        offset: u64,
        /// Why.
        source: io::Error,
    },
    /// The attachment's detach began: no more psyncs.
    #[error("attachment at window offset {0:#x} is being detached")]
    Detaching(u64),
    /// A DRAM budget that cannot be set.
    #[error("DRAM budget: {0}")]
    Budget(String),
    /// No key for the slice's page fingerprints could be drawn.
    #[error("page fingerprint key: {0}")]
    Key(pmo_crypto::CryptoError),
}

/// Why a page could not be filled.
#[derive(Debug, thiserror::Error)]
pub enum FillError {
    /// Verification failed: the page must never reach the guest.
    #[error("page {0} failed integrity verification")]
    Integrity(u64),
    /// Anything else (medium error, ...): also not installed.
    #[error("page {page}: {why}")]
    Other {
        /// The page, from the attachment's start.
        page: u64,
        /// What failed, for the log.
        why: String,
    },
}
