//! A fault thread's (or the prefetch worker's) page buffers.

use super::prefetch::RUN_PAGES;
use super::PAGE;

/// A thread's page buffers: one for a fault, up to `RUN_PAGES` (64) for a prefetch run (made
/// on the first run, so a fault thread that never prefetches keeps one page). Wiped after
/// each use.
pub struct RunBufs(Vec<[u8; PAGE]>);

impl RunBufs {
    /// One page's buffer; the run's are added when first needed.
    pub(super) fn new() -> Self {
        RunBufs(vec![[0u8; PAGE]])
    }

    /// The first page, for a fault or a trigger.
    #[inline]
    pub(super) fn page(&mut self) -> &mut [u8; PAGE] {
        &mut self.0[0]
    }

    /// Buffers for a whole run.
    pub(super) fn run(&mut self) -> &mut [[u8; PAGE]] {
        if self.0.len() < RUN_PAGES {
            self.0.resize(RUN_PAGES, [0u8; PAGE]);
        }
        &mut self.0
    }
}
