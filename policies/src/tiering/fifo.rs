//! Fault-order demotion: the baseline with no notion of hotness.

use super::ring::Ring;
use super::{PageRef, Placement, Tier};

/// Demotes the page that became resident longest ago, whatever happened to it since.
/// Pre-populated pages always go to DRAM (they push out the oldest).
pub struct Fifo {
    ring: Ring<()>,
}

impl Fifo {
    /// An empty resident set.
    pub fn new() -> Self {
        Self { ring: Ring::new() }
    }
}

impl Default for Fifo {
    fn default() -> Self {
        Self::new()
    }
}

impl Placement for Fifo {
    fn admit(&mut self, page: PageRef, _dirty: bool) {
        if self.ring.get_mut(&page).is_none() {
            self.ring.push(page, ());
        }
    }

    fn touched(&mut self, _page: PageRef) {}

    fn dirtied(&mut self, _page: PageRef) {}

    fn forget_pmo(&mut self, pmo: u64) {
        self.ring.forget_pmo(pmo);
    }

    fn victims(&mut self, n: usize, out: &mut Vec<PageRef>) {
        for _ in 0..n {
            match self.ring.pop() {
                Some((page, ())) => out.push(page),
                None => break,
            }
        }
    }

    fn prefetch_tier(&self, _resident: usize, _budget: usize) -> Tier {
        Tier::Dram
    }

    fn resident(&self) -> usize {
        self.ring.len()
    }

    fn name(&self) -> &'static str {
        "fifo"
    }
}
