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

use super::*;
use pmo_policies::{PageRef, Placement};
use tier::{DeviceTier, Spilled};

/// The DRAM budget of a pager and what enforcing it did.
pub(super) struct DramBudget {
    /// Most pages resident in the window.
    pub(super) pages: u64,
    pub(super) policy: Mutex<Box<dyn Placement>>,
    pub(super) tier: DeviceTier,
    /// Pages resident in the window (installed and not demoted) across live slices.
    pub(super) resident: AtomicU64,
    /// Held while demoting, so two fault threads do not demote for the same excess.
    pub(super) enforcing: Mutex<()>,
    pub(super) counters: TierCounters,
}

/// What tiering did, across attachments (see [`Pager::tier_stats`]).
#[derive(Default)]
pub(super) struct TierCounters {
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

/// How an install into a slice went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Installed {
    /// We put the page there.
    Done,
    /// It was there already, the slice is closing, the install failed, or the page is spilled:
    /// the access retries and is served by whoever owns the page then.
    Not,
}

impl Pager {
    /// Keeps the plaintext in the window within `pages` pages from now on, demoting by
    /// `policy`, dirty pages into a device memory of `spill_pages` pages. Only before the
    /// first attach, and once.
    pub fn set_dram_budget(
        &self,
        pages: u64,
        policy: Box<dyn Placement>,
        spill_pages: u64,
    ) -> Result<(), PagerError> {
        if pages == 0 {
            return Err(PagerError::Budget("a budget of 0 pages".into()));
        }
        if !self.slices.read_locked().is_empty() {
            return Err(PagerError::Budget("attachments exist already".into()));
        }
        let tier = DeviceTier::new(spill_pages).map_err(|e| PagerError::Budget(e.to_string()))?;
        self.budget
            .set(DramBudget {
                pages,
                policy: Mutex::new(policy),
                tier,
                resident: AtomicU64::new(0),
                enforcing: Mutex::new(()),
                counters: TierCounters::default(),
            })
            .map_err(|_| PagerError::Budget("the budget is set already".into()))
    }

    /// Tiering across all attachments, if a budget is set.
    pub fn tier_stats(&self) -> Option<TierStats> {
        let b = self.budget.get()?;
        let c = &b.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Some(TierStats {
            budget_pages: b.pages,
            resident_pages: get(&b.resident),
            spilled_pages: b.tier.used(),
            promotions_clean: get(&c.promotions_clean),
            promotions_dirty: get(&c.promotions_dirty),
            demotions_clean: get(&c.demotions_clean),
            demotions_dirty: get(&c.demotions_dirty),
            over_budget: get(&c.over_budget),
        })
    }

    /// Installs `data` as `page` of `slice` unless the page is spilled (its data is in device
    /// memory, newer than anything a fill read) or the slice is closing. `dirty` marks it
    /// dirty first (a psync racing the install must see it), `wp` write-protects it.
    pub(super) fn install_in(
        &self,
        slice: &Slice,
        page: u64,
        data: &[u8; PAGE],
        dirty: bool,
        wp: bool,
    ) -> Installed {
        if self.install_run_in(slice, page, data, dirty, wp) == 0 {
            Installed::Not
        } else {
            Installed::Done
        }
    }

    /// [`Pager::install_in`] for a run of consecutive pages from `first` (`data` holds whole
    /// pages, at most 64): spilled pages are left out, and each stretch between them goes in
    /// with one copy. Returns which pages went in (bit i for page `first + i`).
    pub(super) fn install_run_in(
        &self,
        slice: &Slice,
        first: u64,
        data: &[u8],
        dirty: bool,
        wp: bool,
    ) -> u64 {
        let n = data.len() / PAGE;
        let Some(_gate) = slice.enter() else {
            return 0;
        };
        let spilled = slice.spilled.locked();
        let mut placed = 0u64;
        let mut i = 0;
        while i < n {
            if spilled.contains_key(&(first + i as u64)) {
                i += 1;
                continue;
            }
            let mut len = 1;
            while i + len < n && !spilled.contains_key(&(first + (i + len) as u64)) {
                len += 1;
            }
            for k in i..i + len {
                if dirty {
                    slice.mark_dirty(first + k as u64);
                }
                if slice.on_device {
                    // The page is written into the expander's device memory (LPMO CF).
                    self.charge_device(Instant::now());
                }
            }
            let addr = self.page_addr(slice, first + i as u64);
            match self
                .uffd
                .install_pages(addr, &data[i * PAGE..(i + len) * PAGE], wp)
            {
                Ok(mask) => placed |= mask << i,
                Err(e) => log::error!("pmo: install pages at {addr:#x}: {e}"),
            }
            i += len;
        }
        for k in (0..n).filter(|k| placed & (1 << k) != 0) {
            let page = first + k as u64;
            // `data` came from the store: remember what it holds. Only when installed (a fill
            // that lost a race may be older than a psync), and under the tier lock, which a
            // psync holds to record what it wrote, so the two cannot land out of order.
            if let Some(d) = &slice.digests {
                d.record(page, &data[k * PAGE..(k + 1) * PAGE]);
            }
            set_bit(&slice.installed, page);
            self.admitted(slice, page, dirty);
        }
        drop(spilled);
        placed
    }

    /// Counts a page that just became resident (under the slice's tier lock).
    fn admitted(&self, slice: &Slice, page: u64, dirty: bool) {
        if slice.on_device {
            // Not local DRAM: outside the budget and its policy.
            slice.stats.device_pages.fetch_add(1, Ordering::Relaxed);
            return;
        }
        slice.stats.dram_pages.fetch_add(1, Ordering::Relaxed);
        let Some(b) = self.budget.get() else { return };
        if clear_bit_was_set(&slice.demoted, page) {
            b.counters.promotions_clean.fetch_add(1, Ordering::Relaxed);
            slice.stats.promotions.fetch_add(1, Ordering::Relaxed);
        }
        b.resident.fetch_add(1, Ordering::AcqRel);
        b.policy.locked().admit(slice.page_ref(page), dirty);
    }

    /// Serves a missing-page fault on a page whose only copy is in device memory: it comes
    /// back into the window, dirty. False if the page is not spilled.
    pub(super) fn promote_spilled(&self, slice: &Slice, page: u64, buf: &mut [u8; PAGE]) -> bool {
        let Some(b) = self.budget.get() else {
            return false;
        };
        let Some(_gate) = slice.enter() else {
            return false;
        };
        let mut spilled = slice.spilled.locked();
        let Some(slot) = spilled.remove(&page) else {
            return false;
        };
        slice.stats.cxl_dirty_pages.fetch_sub(1, Ordering::Relaxed);
        let moved = Instant::now();
        let taken = b.tier.take(slot, buf);
        self.charge_device(moved);
        if let Err(e) = taken {
            // Cannot happen for whole pages; the page's unsynced data is lost, say so.
            log::error!("pmo: promote page {page} from device memory: {e}");
            buf.fill(0);
        }
        slice.mark_dirty(page);
        let addr = self.page_addr(slice, page);
        if self.install(addr, buf, false) {
            slice.stats.dram_pages.fetch_add(1, Ordering::Relaxed);
            clear_bit(&slice.demoted, page);
            b.resident.fetch_add(1, Ordering::AcqRel);
            b.policy.locked().admit(slice.page_ref(page), true);
        }
        set_bit(&slice.installed, page);
        buf.fill(0);
        b.counters.promotions_dirty.fetch_add(1, Ordering::Relaxed);
        slice.stats.promotions.fetch_add(1, Ordering::Relaxed);
        drop(spilled);
        true
    }

    /// Tells the policy of an access it could not otherwise see (a write-protect fault).
    pub(super) fn touched(&self, slice: &Slice, page: u64, dirtied: bool) {
        if slice.on_device {
            return;
        }
        if let Some(b) = self.budget.get() {
            let mut p = b.policy.locked();
            p.touched(slice.page_ref(page));
            if dirtied {
                p.dirtied(slice.page_ref(page));
            }
        }
    }

    /// Demotes pages until the window is within the budget (or nothing more can go).
    pub(super) fn enforce_budget(&self) {
        let Some(b) = self.budget.get() else { return };
        if b.resident.load(Ordering::Acquire) <= b.pages {
            return;
        }
        let _one = b.enforcing.locked();
        let mut victims = Vec::new();
        loop {
            let resident = b.resident.load(Ordering::Acquire);
            if resident <= b.pages {
                return;
            }
            victims.clear();
            b.policy
                .locked()
                .victims((resident - b.pages) as usize, &mut victims);
            if victims.is_empty() {
                b.counters.over_budget.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let demoted = victims.iter().filter(|&&v| self.demote(b, v)).count();
            if demoted == 0 {
                b.counters.over_budget.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }

    /// Moves one resident page out of local DRAM; false if it could not (the policy is told
    /// again about a page that stays resident).
    fn demote(&self, b: &DramBudget, v: PageRef) -> bool {
        let Some(slice) = self.slices.read_locked().get(&v.pmo).cloned() else {
            return false;
        };
        let page = v.page;
        let Some(_gate) = slice.enter() else {
            return false;
        };
        let mut spilled = slice.spilled.locked();
        if page >= slice.npages
            || !test_bit(&slice.installed, page)
            || spilled.contains_key(&page)
            || slice.poisoned.locked().contains(&page)
        {
            // Not resident (any more): nothing to move, and nothing to track.
            return false;
        }
        let dirty = test_bit(&slice.dirty, page);
        if slice.collecting.load(Ordering::SeqCst) > 0 {
            // A psync is taking this slice's pages: leave them where they are.
            b.policy.locked().admit(v, dirty);
            return false;
        }
        let addr = self.page_addr(&slice, page);
        let mut slot: Option<Spilled> = None;
        if dirty {
            // Protect first: a write from now on faults and waits for the tier lock.
            if let Err(e) = self.uffd.write_protect(addr, PAGE_U64, true) {
                log::warn!("pmo: protect page {page} for demotion: {e}");
                b.policy.locked().admit(v, dirty);
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
                clear_bit(&slice.dirty, page);
            } else {
                let moved = Instant::now();
                let put = b.tier.put(&buf);
                self.charge_device(moved);
                buf.fill(0);
                match put {
                    Ok(s) => slot = Some(s),
                    Err(e) => {
                        // Stays resident (protected: the next write marks it dirty again).
                        log::debug!("pmo: page {page} stays in DRAM: {e}");
                        b.policy.locked().admit(v, dirty);
                        return false;
                    }
                }
            }
            buf.fill(0);
        }
        if let Err(e) = self.map.discard(addr, PAGE_U64) {
            log::error!("pmo: drop page {page} for demotion: {e}");
            if let Some(s) = slot {
                b.tier.free(s);
            }
            b.policy.locked().admit(v, dirty);
            return false;
        }
        clear_bit(&slice.installed, page);
        match slot {
            Some(s) => {
                clear_bit(&slice.dirty, page);
                spilled.insert(page, s);
                slice.stats.cxl_dirty_pages.fetch_add(1, Ordering::Relaxed);
                b.counters.demotions_dirty.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                set_bit(&slice.demoted, page);
                b.counters.demotions_clean.fetch_add(1, Ordering::Relaxed);
            }
        }
        slice.stats.demotions.fetch_add(1, Ordering::Relaxed);
        slice.stats.dram_pages.fetch_sub(1, Ordering::Relaxed);
        b.resident.fetch_sub(1, Ordering::AcqRel);
        true
    }

    /// A detached slice's pages leave the budget; its spilled pages (unsynced changes) are
    /// dropped with it. Called once nothing of the slice is in flight.
    pub(super) fn release_budget(&self, slice: &Slice) {
        let spilled = std::mem::take(&mut *slice.spilled.locked());
        let Some(b) = self.budget.get() else { return };
        for (_, s) in spilled {
            b.tier.free(s);
        }
        b.policy.locked().forget_pmo(slice.start);
        slice.stats.cxl_dirty_pages.store(0, Ordering::Relaxed);
        b.resident.fetch_sub(
            slice.stats.dram_pages.swap(0, Ordering::AcqRel),
            Ordering::AcqRel,
        );
    }

    /// Reads the spilled pages of `slice` for a psync (under its tier lock; the slots stay).
    pub(super) fn read_spilled(
        &self,
        spilled: &BTreeMap<u64, Spilled>,
        out: &mut Vec<(u64, Box<[u8; PAGE]>)>,
    ) {
        let Some(b) = self.budget.get() else { return };
        for (&page, slot) in spilled {
            let mut buf = Box::new([0u8; PAGE]);
            let moved = Instant::now();
            let read = b.tier.read(slot, &mut buf);
            self.charge_device(moved);
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
        let Some(b) = self.budget.get() else { return };
        let mut spilled = slice.spilled.locked();
        for p in pages {
            if let Some(s) = spilled.remove(p) {
                slice.stats.cxl_dirty_pages.fetch_sub(1, Ordering::Relaxed);
                b.tier.free(s);
                set_bit(&slice.demoted, *p);
            }
        }
    }
}

/// Clears bit `page`; returns whether it was set.
fn clear_bit_was_set(bits: &[AtomicU64], page: u64) -> bool {
    bits.get((page / 64) as usize).is_some_and(|w| {
        w.fetch_and(!(1 << (page % 64)), Ordering::AcqRel) & (1 << (page % 64)) != 0
    })
}
