//! A test hook: a medium that kills the whole process at a chosen persist
//! point of a psync, to prove on a real VM that a VMM dying mid-psync leaves
//! each PMO exactly as of the old or the new psync (never a mix).
//!
//! Only `pmovmm run --pmo-test-kill-in-psync N` (a hidden flag) installs it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{Medium, MediumError};

/// Wraps a medium; while armed, the `n`-th persist kills the process with SIGKILL.
pub struct KillInPsync<M> {
    inner: M,
    n: u64,
    armed: AtomicBool,
    seen: AtomicU64,
}

impl<M: Medium> KillInPsync<M> {
    /// Wraps `inner`, disarmed; once armed, the `n`-th persist kills the process.
    pub fn new(inner: M, n: u64) -> Self {
        KillInPsync {
            inner,
            n,
            armed: AtomicBool::new(false),
            seen: AtomicU64::new(0),
        }
    }

    /// Counts persists from now on (the device arms it around each psync).
    pub fn arm(&self, on: bool) {
        self.seen.store(0, Ordering::Release);
        self.armed.store(on, Ordering::Release);
    }
}

impl<M: Medium> Medium for KillInPsync<M> {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), MediumError> {
        self.inner.read(off, buf)
    }
    fn write(&self, off: u64, data: &[u8]) -> Result<(), MediumError> {
        self.inner.write(off, data)
    }
    fn persist(&self, off: u64, len: u64) -> Result<(), MediumError> {
        if self.armed.load(Ordering::Acquire)
            && self.seen.fetch_add(1, Ordering::AcqRel) + 1 == self.n
        {
            eprintln!(
                "pmovmm: test hook: killing the VMM at persist {} of a psync",
                self.n
            );
            // SAFETY: signalling our own process; nothing after this runs.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        self.inner.persist(off, len)
    }
    fn zero(&self, off: u64, len: u64) -> Result<(), MediumError> {
        self.inner.zero(off, len)
    }
    fn as_ptr(&self) -> Option<*mut u8> {
        self.inner.as_ptr()
    }
}
