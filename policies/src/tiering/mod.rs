//! Placement between local DRAM and the CXL tier: which resident plaintext pages leave DRAM
//! when the pager is over its budget, and whether a predicted page is worth a DRAM slot.
//!
//! The pager sees a page's accesses only when they fault: the first touch (a missing-page
//! fault, [`Placement::admit`]) and the first write after a psync or a clean fill (a
//! write-protect fault, [`Placement::touched`] and [`Placement::dirtied`]). Loads and stores to
//! a resident page run at memory speed, unseen. A policy therefore rates pages by what faults
//! tell over time, above all by how soon a page comes back after it was demoted (see
//! [`Hotness`]); docs/hotness.md says why this source and not access bits here.
//!
//! Policies (see [`PlacementPolicy`]):
//! - [`Fifo`] (`fifo`): demotes in fault order; the no-hotness baseline.
//! - [`Hotness`] (`hotness`): probation and protected segments; a page that returns soon
//!   after its demotion is protected; clean pages go before dirty ones.

mod fifo;
mod hotness;
mod ring;

#[cfg(test)]
mod tests;

pub use fifo::Fifo;
pub use hotness::Hotness;

/// One page of one attached PMO, as the pager names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageRef {
    /// The attachment (its first page in the pager's window; unique while attached).
    pub pmo: u64,
    /// Page index inside the PMO.
    pub page: u64,
}

/// Where a page's plaintext lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Installed in the PMO window, in local host DRAM.
    Dram,
    /// Not in local DRAM: in the store on the expander's media (clean) or sealed in its device
    /// memory (dirty).
    Cxl,
}

/// A placement policy. The pager owns one for all attachments and calls it under its own
/// lock, hence `Send` but not `Sync`.
///
/// Contract: the policy tracks the pages admitted and not yet returned by [`victims`] or
/// dropped by [`forget_pmo`]; it never names a page it does not track, and never names a
/// page twice without an `admit` between. The pager admits a page again when it could not
/// demote it.
///
/// [`victims`]: Placement::victims
/// [`forget_pmo`]: Placement::forget_pmo
pub trait Placement: Send {
    /// A page became resident in DRAM (a demand fault, a promotion, or a pre-population);
    /// `dirty` if it was written. Admitting a tracked page counts as an access.
    fn admit(&mut self, page: PageRef, dirty: bool);
    /// The guest accessed a resident page and the pager saw it (a write-protect fault).
    fn touched(&mut self, page: PageRef);
    /// A resident page was written since it was last clean.
    fn dirtied(&mut self, page: PageRef);
    /// The attachment `pmo` ended: forget its pages.
    fn forget_pmo(&mut self, pmo: u64);
    /// Pushes up to `n` resident pages to demote, coldest first, and stops tracking them.
    fn victims(&mut self, n: usize, out: &mut Vec<PageRef>);
    /// Where a predicted page should go when `resident` of `budget` DRAM pages are in use.
    fn prefetch_tier(&self, resident: usize, budget: usize) -> Tier;
    /// Pages tracked as resident.
    fn resident(&self) -> usize;
    /// The canonical name, accepted by [`placement_from_name`].
    fn name(&self) -> &'static str;
}

/// A bad placement policy name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TieringError {
    /// The name is not a policy.
    #[error("unknown placement policy {0:?} (expected hotness or fifo)")]
    UnknownPolicy(String),
}

/// A placement policy by name, parsed once (`"hotness".parse()`); [`PlacementPolicy::build`]
/// makes the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PlacementPolicy {
    /// [`Hotness`] (`hotness`), the default.
    #[default]
    Hotness,
    /// [`Fifo`] (`fifo`).
    Fifo,
}

impl PlacementPolicy {
    /// A new policy of this kind.
    pub fn build(self) -> Box<dyn Placement> {
        match self {
            PlacementPolicy::Hotness => Box::new(Hotness::new()),
            PlacementPolicy::Fifo => Box::new(Fifo::new()),
        }
    }

    /// The canonical name.
    pub fn name(self) -> &'static str {
        match self {
            PlacementPolicy::Hotness => "hotness",
            PlacementPolicy::Fifo => "fifo",
        }
    }
}

impl std::str::FromStr for PlacementPolicy {
    type Err = TieringError;

    fn from_str(name: &str) -> Result<Self, TieringError> {
        match name.trim() {
            "hotness" => Ok(PlacementPolicy::Hotness),
            "fifo" => Ok(PlacementPolicy::Fifo),
            _ => Err(TieringError::UnknownPolicy(name.to_string())),
        }
    }
}

impl std::fmt::Display for PlacementPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Builds a placement policy by name: `hotness` or `fifo` ([`PlacementPolicy`]).
pub fn placement_from_name(name: &str) -> Result<Box<dyn Placement>, TieringError> {
    Ok(name.parse::<PlacementPolicy>()?.build())
}
