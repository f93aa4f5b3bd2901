//! Demotion by measured reuse: a CLOCK whose credits come from faults and refaults.

use super::ring::Ring;
use super::{PageRef, Placement, Tier};
use std::collections::HashMap;

/// Most credit a page holds: it survives this many sweeps of the hand without being seen.
const MAX_HEAT: u8 = 7;

/// A CLOCK over resident pages with refault-distance credit.
///
/// Each resident page holds a credit. The hand takes one credit from every page it passes and
/// demotes a page that has none; a dirty page is passed over once more than a clean one, since
/// demoting it costs a copy into device memory and a promotion back. A page enters with one
/// credit, and with [`MAX_HEAT`] when it comes back within one resident set's worth of
/// demotions after it left: it would have stayed in a slightly larger DRAM, so it is part of
/// the working set (the refault distance of Linux's workingset detection). A fault the pager
/// sees on a resident page (a first write) adds a credit.
///
/// Predicted pages go to DRAM only while it has free room, so a guess never pushes out a page
/// whose reuse was measured.
pub struct Hotness {
    ring: Ring<Credit>,
    /// Demotion stamp of pages demoted not long ago, to tell a refault from a first touch.
    demoted: HashMap<PageRef, u64>,
    demotions: u64,
}

struct Credit {
    heat: u8,
    dirty: bool,
    /// The hand already passed over this dirty page with no heat once.
    spared: bool,
}

impl Hotness {
    /// An empty resident set with no history.
    pub fn new() -> Self {
        Self {
            ring: Ring::new(),
            demoted: HashMap::new(),
            demotions: 0,
        }
    }

    /// Forgets demotions too old to count as refaults, once the history is large.
    fn trim_history(&mut self) {
        let window = self.ring.len().max(1) as u64;
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
        if let Some(c) = self.ring.get_mut(&page) {
            c.heat = (c.heat + 1).min(MAX_HEAT);
            c.dirty |= dirty;
            return;
        }
        let heat = match self.demoted.remove(&page) {
            Some(at) if self.demotions - at <= self.ring.len() as u64 => MAX_HEAT,
            _ => 1,
        };
        self.ring.push(
            page,
            Credit {
                heat,
                dirty,
                spared: false,
            },
        );
    }

    fn touched(&mut self, page: PageRef) {
        if let Some(c) = self.ring.get_mut(&page) {
            c.heat = (c.heat + 1).min(MAX_HEAT);
            c.spared = false;
        }
    }

    fn dirtied(&mut self, page: PageRef) {
        if let Some(c) = self.ring.get_mut(&page) {
            c.dirty = true;
        }
    }

    fn forget_pmo(&mut self, pmo: u64) {
        self.ring.forget_pmo(pmo);
        self.demoted.retain(|p, _| p.pmo != pmo);
    }

    fn victims(&mut self, n: usize, out: &mut Vec<PageRef>) {
        // Every page runs out of credit within MAX_HEAT + 2 turns of the hand.
        let mut steps = (self.ring.len() + n).saturating_mul(usize::from(MAX_HEAT) + 2);
        let mut taken = 0;
        while taken < n && steps > 0 {
            steps -= 1;
            let Some((page, mut c)) = self.ring.pop() else {
                break;
            };
            if c.heat > 0 {
                c.heat -= 1;
                self.ring.push(page, c);
            } else if c.dirty && !c.spared {
                c.spared = true;
                self.ring.push(page, c);
            } else {
                out.push(page);
                taken += 1;
                self.demoted.insert(page, self.demotions);
                self.demotions += 1;
            }
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
        self.ring.len()
    }

    fn name(&self) -> &'static str {
        "hotness"
    }
}
