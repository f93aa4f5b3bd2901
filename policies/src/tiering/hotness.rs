//! Demotion by measured reuse: pages that come back soon after a demotion are protected.

use super::ring::Ring;
use super::{PageRef, Placement, Tier};
use std::collections::HashMap;

/// Share of the resident pages the protected segment may hold, in quarters.
const PROTECTED_QUARTERS: usize = 3;

/// A refault counts when the page returns within resident / this many demotions.
const REFAULT_QUARTERS: usize = 4;

/// A segmented resident set with refault detection (2Q / SLRU with ghost entries, the
/// refault distance of Linux's workingset detection).
///
/// A page enters *probation* on its first touch. Demotion takes probation pages in the order
/// they came, a clean page before a dirty one (demoting a dirty page costs a copy into device
/// memory and a promotion back). A page that comes back within a quarter of a resident set's
/// worth of demotions after it left would have stayed in a slightly larger DRAM: it is part
/// of the working set and enters *protected*. (A whole resident set's worth, Linux's
/// threshold, also lets in cold pages that happen to return early: in the hot-set trace test
/// a quarter halves the hot set's misses against a whole.) Protected pages leave DRAM only by going back to
/// probation first, when protected outgrows three quarters of the resident pages; the oldest
/// unreferenced go (a fault the pager sees on a resident page, such as its first write after
/// a psync, marks it referenced and saves it once).
///
/// Predicted pages go to DRAM only while it has free room, so a guess never pushes out a page
/// whose reuse was measured.
pub struct Hotness {
    probation: Ring<State>,
    protected: Ring<State>,
    /// Demotion stamp of pages demoted not long ago, to tell a refault from a first touch.
    demoted: HashMap<PageRef, u64>,
    demotions: u64,
}

#[derive(Clone, Copy)]
struct State {
    dirty: bool,
    /// Protected: seen since the hand last passed. Probation: a dirty page already spared.
    mark: bool,
}

impl Hotness {
    /// An empty resident set with no history.
    pub fn new() -> Self {
        Self {
            probation: Ring::new(),
            protected: Ring::new(),
            demoted: HashMap::new(),
            demotions: 0,
        }
    }

    fn state_mut(&mut self, page: &PageRef) -> Option<&mut State> {
        match self.protected.get_mut(page) {
            Some(s) => Some(s),
            None => self.probation.get_mut(page),
        }
    }

    /// Moves protected pages back to probation until protected is within its share.
    fn shrink_protected(&mut self) {
        let cap = (self.resident() * PROTECTED_QUARTERS / 4).max(1);
        // Each page is passed over at most once (its mark cleared), so this ends.
        let mut steps = 2 * self.protected.len() + 1;
        while self.protected.len() > cap && steps > 0 {
            steps -= 1;
            let Some((page, mut s)) = self.protected.pop() else {
                break;
            };
            if s.mark {
                s.mark = false;
                self.protected.push(page, s);
            } else {
                self.probation.push(page, State { mark: false, ..s });
            }
        }
    }

    /// Forgets demotions too old to count as refaults, once the history is large.
    fn trim_history(&mut self) {
        let window = self.resident().max(1) as u64;
        if self.demoted.len() as u64 > 4 * window + 1024 {
            let now = self.demotions;
            self.demoted.retain(|_, &mut at| now - at <= window);
        }
    }
}

impl Default for Hotness {
    fn default() -> Self {
        Self::new()
    }
}

impl Placement for Hotness {
    fn admit(&mut self, page: PageRef, dirty: bool) {
        if let Some(s) = self.state_mut(&page) {
            s.dirty |= dirty;
            if self.protected.get_mut(&page).is_some() {
                self.touched(page);
            }
            return;
        }
        let state = State { dirty, mark: false };
        match self.demoted.remove(&page) {
            Some(at) if self.demotions - at <= (self.resident() / REFAULT_QUARTERS) as u64 => {
                self.protected.push(page, state)
            }
            _ => self.probation.push(page, state),
        }
    }

    fn touched(&mut self, page: PageRef) {
        if let Some(s) = self.protected.get_mut(&page) {
            s.mark = true;
        } else if let Some(s) = self.probation.get_mut(&page) {
            s.mark = false;
        }
    }

    fn dirtied(&mut self, page: PageRef) {
        if let Some(s) = self.state_mut(&page) {
            s.dirty = true;
        }
    }

    fn forget_pmo(&mut self, pmo: u64) {
        self.probation.forget_pmo(pmo);
        self.protected.forget_pmo(pmo);
        self.demoted.retain(|p, _| p.pmo != pmo);
    }

    fn victims(&mut self, n: usize, out: &mut Vec<PageRef>) {
        let mut taken = 0;
        // Each probation page is spared at most once per pass.
        let mut steps = 2 * (self.resident() + n) + 2;
        while taken < n && steps > 0 {
            steps -= 1;
            self.shrink_protected();
            let Some((page, mut s)) = self.probation.pop().or_else(|| self.protected.pop()) else {
                break;
            };
            if s.dirty && !s.mark {
                s.mark = true;
                self.probation.push(page, s);
                continue;
            }
            out.push(page);
            taken += 1;
            self.demoted.insert(page, self.demotions);
            self.demotions += 1;
        }
        self.trim_history();
    }

    fn prefetch_tier(&self, resident: usize, budget: usize) -> Tier {
        if resident < budget {
            Tier::Dram
        } else {
            Tier::Cxl
        }
    }

    fn resident(&self) -> usize {
        self.probation.len() + self.protected.len()
    }

    fn name(&self) -> &'static str {
        "hotness"
    }
}
