//! A budget of local DRAM for plaintext across every attachment, and the pages that move
//! between local DRAM and the CXL tier to keep to it.
//!
//! Every page installed in the window counts against the budget. Above it, the placement
//! policy (`pmo_policies`, pure and trace-tested) names the coldest resident pages and they
//! are *demoted*: a clean page is dropped (its ciphertext is in the store, on the expander's
//! media), and so is a page marked dirty that still holds what the store has (see
//! `digests.rs`); a page changed since the last psync is sealed into the expander's device
//! memory ([`DeviceTier`]). The next access of a demoted page faults and *promotes* it: from device
//! memory for a dirty page (it stays dirty), from the store for a clean one.
//!
//! Invariants, each kept under the slice's tier lock (`Slice::spilled`):
//! - a page is resident (installed), spilled (its only copy in device memory) or neither
//!   (its content is the store's), never two of them;
//! - nothing from the store is installed over a spilled page (every install checks);
//! - a page is not demoted while a psync collects its slice, and a write-protect fault of a
//!   page that was demoted meanwhile only retries the access (which then promotes it).
//!
//! Lock order: slice tier lock, then the policy. The budget may be exceeded by the pages
//! that fault threads install between two enforcements (one each), and by trigger pages a
//! predictor holds back (at most 64 per attachment, outside the window).

use locked::Locked;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use pmo_policies::{PageRef, Placement, Tier};

use super::slice::Slice;
use super::tier::{DeviceTier, Spilled};
use super::window::Window;
use super::{PagerError, PAGE, PAGE_U64};

/// The DRAM budget of a pager and what enforcing it did.
pub(super) struct DramBudget {
    /// Most pages resident in the window.
    pages: u64,
    policy: Mutex<Box<dyn Placement>>,
    tier: DeviceTier,
    /// Pages resident in the window (installed and not demoted) across live slices.
    resident: AtomicU64,
    /// Held while demoting, so two fault threads do not demote for the same excess.
    enforcing: Mutex<()>,
    counters: TierCounters,
}

/// What tiering did, across attachments (see [`Pager::tier_stats`](super::Pager::tier_stats)).
#[derive(Default)]
struct TierCounters {
    promotions_clean: AtomicU64,
    promotions_dirty: AtomicU64,
    demotions_clean: AtomicU64,
    demotions_dirty: AtomicU64,
    /// Enforcements that found nothing to demote while over the budget.
    over_budget: AtomicU64,
}

/// A snapshot of tiering across all attachments of a pager.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    /// The budget, in pages.
    pub budget_pages: u64,
    /// Pages resident in local DRAM now.
    pub resident_pages: u64,
    /// Dirty pages held in device memory now.
    pub spilled_pages: u64,
    /// Demoted pages brought back from the store (clean).
    pub promotions_clean: u64,
    /// Demoted pages brought back from device memory (dirty).
    pub promotions_dirty: u64,
    /// Clean pages dropped.
    pub demotions_clean: u64,
    /// Dirty pages moved to device memory.
    pub demotions_dirty: u64,
    /// Enforcements that found nothing to demote while over the budget.
    pub over_budget: u64,
}

impl TierStats {
    /// Bytes that crossed between local DRAM and the CXL tier: every promotion and every
    /// dirty demotion moves a page (a clean demotion moves nothing).
    pub fn bytes_moved(&self) -> u64 {
        (self.promotions_clean + self.promotions_dirty + self.demotions_dirty) * PAGE_U64
    }
}

impl DramBudget {
    /// Keeps the plaintext in the window within `pages` pages (more than 0), demoting by
    /// `policy`, dirty pages into a device memory of `spill_pages` pages.
    pub(super) fn new(
        pages: u64,
        policy: Box<dyn Placement>,
        spill_pages: u64,
    ) -> Result<Self, PagerError> {
        let tier = DeviceTier::new(spill_pages).map_err(|e| PagerError::Budget(e.to_string()))?;
        Ok(DramBudget {
            pages,
            policy: Mutex::new(policy),
            tier,
            resident: AtomicU64::new(0),
            enforcing: Mutex::new(()),
            counters: TierCounters::default(),
        })
    }

    /// Tiering across all attachments.
    pub(super) fn stats(&self) -> TierStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TierStats {
            budget_pages: self.pages,
            resident_pages: get(&self.resident),
            spilled_pages: self.tier.used(),
            promotions_clean: get(&c.promotions_clean),
            promotions_dirty: get(&c.promotions_dirty),
            demotions_clean: get(&c.demotions_clean),
            demotions_dirty: get(&c.demotions_dirty),
            over_budget: get(&c.over_budget),
        }
    }

    /// Where the placement policy puts predicted pages now: under the budget it may keep
    /// them in the CXL tier (the store) until they are touched, rather than push out pages
    /// it rates hotter.
    pub(super) fn prefetch_tier(&self) -> Tier {
        let resident = self.resident.load(Ordering::Acquire) as usize;
        self.policy
            .locked()
            .prefetch_tier(resident, self.pages as usize)
    }

    /// Counts `page` of `slice` (in local DRAM), which just became resident (under the
    /// slice's tier lock).
    pub(super) fn admitted(&self, slice: &Slice, page: u64, dirty: bool) {
        if slice.demoted.clear_was_set(page) {
            self.counters
                .promotions_clean
                .fetch_add(1, Ordering::Relaxed);
            slice.stats.promotions.fetch_add(1, Ordering::Relaxed);
        }
        self.resident.fetch_add(1, Ordering::AcqRel);
        self.policy.locked().admit(slice.page_ref(page), dirty);
    }

    /// Serves a missing-page fault on a page whose only copy is in device memory: it comes
    /// back into the window, dirty. False if the page is not spilled.
    pub(super) fn promote_spilled(
        &self,
        window: &Window,
        slice: &Slice,
        page: u64,
        buf: &mut [u8; PAGE],
    ) -> bool {
        let Some(_gate) = slice.gate.enter() else {
            return false;
        };
        let mut spilled = slice.spilled.locked();
        let Some(slot) = spilled.remove(&page) else {
            return false;
        };
        slice.stats.cxl_dirty_pages.fetch_sub(1, Ordering::Relaxed);
        let moved = Instant::now();
        let taken = self.tier.take(slot, buf);
        window.charge_device(moved);
        if let Err(e) = taken {
            // Cannot happen for whole pages; the page's unsynced data is lost, say so.
            log::error!("pmo: promote page {page} from device memory: {e}");
            buf.fill(0);
        }
        slice.mark_dirty(page);
        let addr = window.page_addr(slice, page);
        if window.install(addr, buf, false) {
            slice.stats.dram_pages.fetch_add(1, Ordering::Relaxed);
            slice.demoted.clear(page);
            self.resident.fetch_add(1, Ordering::AcqRel);
            self.policy.locked().admit(slice.page_ref(page), true);
        }
        slice.installed.set(page);
        buf.fill(0);
        self.counters
            .promotions_dirty
            .fetch_add(1, Ordering::Relaxed);
        slice.stats.promotions.fetch_add(1, Ordering::Relaxed);
        drop(spilled);
        true
    }

    /// Tells the policy of an access it could not otherwise see (a write-protect fault).
    pub(super) fn touched(&self, slice: &Slice, page: u64, dirtied: bool) {
        if slice.on_device {
            return;
        }
        let mut p = self.policy.locked();
        p.touched(slice.page_ref(page));
        if dirtied {
            p.dirtied(slice.page_ref(page));
        }
    }

    /// Demotes pages until the window is within the budget (or nothing more can go).
    pub(super) fn enforce(&self, window: &Window) {
        if self.resident.load(Ordering::Acquire) <= self.pages {
            return;
        }
        let _one = self.enforcing.locked();
        let mut victims = Vec::new();
        loop {
            let resident = self.resident.load(Ordering::Acquire);
            if resident <= self.pages {
                return;
            }
            victims.clear();
            self.policy
                .locked()
                .victims((resident - self.pages) as usize, &mut victims);
            if victims.is_empty() {
                self.counters.over_budget.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let demoted = victims.iter().filter(|&&v| self.demote(window, v)).count();
            if demoted == 0 {
                self.counters.over_budget.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }

    /// Moves one resident page out of local DRAM; false if it could not (the policy is told
    /// again about a page that stays resident).
    fn demote(&self, window: &Window, v: PageRef) -> bool {
        let Some(slice) = window.slice_from(v.pmo) else {
            return false;
        };
        let page = v.page;
        let Some(_gate) = slice.gate.enter() else {
            return false;
        };
        let mut spilled = slice.spilled.locked();
        if page >= slice.npages
            || !slice.installed.test(page)
            || spilled.contains_key(&page)
            || slice.poisoned.locked().contains(&page)
        {
            // Not resident (any more): nothing to move, and nothing to track.
            return false;
        }
        let dirty = slice.dirty.test(page);
        if slice.collecting.load(Ordering::SeqCst) > 0 {
            // A psync is taking this slice's pages: leave them where they are.
            self.policy.locked().admit(v, dirty);
            return false;
        }
        let addr = window.page_addr(&slice, page);
        let mut slot: Option<Spilled> = None;
        if dirty {
            // Protect first: a write from now on faults and waits for the tier lock.
            if let Err(e) = window.write_protect(addr, true) {
                log::warn!("pmo: protect page {page} for demotion: {e}");
                self.policy.locked().admit(v, dirty);
                return false;
            }
            let mut buf = Box::new([0u8; PAGE]);
            // SAFETY: a present page of our window inside this live slice (we hold its
            // gate and tier lock, so nothing drops it); writes to it now fault.
            unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), PAGE) };
            if slice
                .digests
                .as_ref()
                .is_some_and(|d| d.unchanged(page, &buf))
            {
                // Marked dirty, but it holds what the store has: dropped like a clean page.
                slice.dirty.clear(page);
            } else {
                let moved = Instant::now();
                let put = self.tier.put(&buf);
                window.charge_device(moved);
                buf.fill(0);
                match put {
                    Ok(s) => slot = Some(s),
                    Err(e) => {
                        // Stays resident (protected: the next write marks it dirty again).
                        log::debug!("pmo: page {page} stays in DRAM: {e}");
                        self.policy.locked().admit(v, dirty);
                        return false;
                    }
                }
            }
            buf.fill(0);
        }
        if let Err(e) = window.discard(addr) {
            log::error!("pmo: drop page {page} for demotion: {e}");
            if let Some(s) = slot {
                self.tier.free(s);
            }
            self.policy.locked().admit(v, dirty);
            return false;
        }
        slice.installed.clear(page);
        match slot {
            Some(s) => {
                slice.dirty.clear(page);
                spilled.insert(page, s);
                slice.stats.cxl_dirty_pages.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .demotions_dirty
                    .fetch_add(1, Ordering::Relaxed);
            }
            None => {
                slice.demoted.set(page);
                self.counters
                    .demotions_clean
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        slice.stats.demotions.fetch_add(1, Ordering::Relaxed);
        slice.stats.dram_pages.fetch_sub(1, Ordering::Relaxed);
        self.resident.fetch_sub(1, Ordering::AcqRel);
        true
    }

    /// A detached slice's pages leave the budget; its spilled pages (unsynced changes) are
    /// dropped with it. Called once nothing of the slice is in flight.
    pub(super) fn release(&self, slice: &Slice) {
        let spilled = std::mem::take(&mut *slice.spilled.locked());
        for (_, s) in spilled {
            self.tier.free(s);
        }
        self.policy.locked().forget_pmo(slice.start);
        slice.stats.cxl_dirty_pages.store(0, Ordering::Relaxed);
        self.resident.fetch_sub(
            slice.stats.dram_pages.swap(0, Ordering::AcqRel),
            Ordering::AcqRel,
        );
    }

    /// Reads the spilled pages of a slice for a psync (under its tier lock; the slots stay).
    pub(super) fn read_spilled(
        &self,
        window: &Window,
        spilled: &BTreeMap<u64, Spilled>,
        out: &mut Vec<(u64, Box<[u8; PAGE]>)>,
    ) {
        for (&page, slot) in spilled {
            let mut buf = Box::new([0u8; PAGE]);
            let moved = Instant::now();
            let read = self.tier.read(slot, &mut buf);
            window.charge_device(moved);
            if let Err(e) = read {
                log::error!("pmo: read spilled page {page}: {e}");
                continue;
            }
            out.push((page, buf));
        }
    }

    /// After a psync wrote them, spilled pages are clean: their slots are freed and a later
    /// access fills them from the store.
    pub(super) fn spilled_written(&self, slice: &Slice, pages: &[u64]) {
        let mut spilled = slice.spilled.locked();
        for p in pages {
            if let Some(s) = spilled.remove(p) {
                slice.stats.cxl_dirty_pages.fetch_sub(1, Ordering::Relaxed);
                self.tier.free(s);
                slice.demoted.set(*p);
            }
        }
    }
}
