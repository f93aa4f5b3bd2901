//! One attachment's slice of the window: what the pager knows of each of its pages, and how
//! verified pages go into it.

use locked::Locked;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use pmo_policies::Predictor;

use super::bits::PageBits;
use super::budget::DramBudget;
use super::digests::StoreDigests;
use super::gate::DetachGate;
use super::page_source::PageSource;
use super::staging::Triggers;
use super::tier::Spilled;
use super::window::Window;
use super::{SliceStats, PAGE};

/// The pages of one attachment, per how they arrived: what a harness needs
/// to compute exact prediction metrics against a reference run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageSets {
    /// Pages a demand fault decrypted (nobody predicted them, or the prediction was late).
    pub demand: Vec<u64>,
    /// Every page handed to the prefetch worker (ready in time or not, used or not).
    pub prefetched: Vec<u64>,
}

/// A predictor and the pager's bookkeeping for it.
pub(super) struct PredictState {
    pub(super) predictor: Box<dyn Predictor>,
    /// Single-page predictions so far (one in `SINGLE_TRIGGER_EVERY` is a trigger, see
    /// `prefetch/mod.rs`).
    pub(super) singles: u64,
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

/// One attachment's slice of the window.
pub(super) struct Slice {
    /// First window page.
    pub(super) start: u64,
    pub(super) npages: u64,
    pub(super) source: Arc<dyn PageSource>,
    pub(super) dirty: PageBits,
    /// Pages installed (by a fault or a prefetch), so prefetch skips them.
    pub(super) installed: PageBits,
    /// Pages handed to the prefetch worker and not yet resolved.
    pub(super) predicted: PageBits,
    /// Pages of a queued or running prefetch run: a fault on one leaves it to the run, whose
    /// install wakes the access (or whose release does, when it does not install the page),
    /// rather than decrypting the page a second time.
    pub(super) filling: PageBits,
    /// Every page handed to the prefetch worker this session.
    pub(super) issued: PageBits,
    /// Pages a demand fault decrypted.
    pub(super) demand: PageBits,
    /// Pages a prefetch found failing verification: announced once, never prefetched again.
    pub(super) bad: PageBits,
    pub(super) predict: Mutex<Option<PredictState>>,
    pub(super) triggers: Triggers,
    /// Faults served so far: the clock of the staging horizon.
    pub(super) seq: AtomicU64,
    pub(super) poisoned: Mutex<Vec<u64>>,
    /// Refused pages now served as read-only zeros (see `Refusals::zero_all`).
    pub(super) zeroed: Mutex<Vec<u64>>,
    pub(super) stats: Arc<SliceStats>,
    /// Nothing more of this slice reaches the window once detach closed it.
    pub(super) gate: DetachGate,
    /// Dirty pages demoted into device memory (their only copy), by page. Its lock is the
    /// slice's tier lock (see `budget.rs`).
    pub(super) spilled: Mutex<BTreeMap<u64, Spilled>>,
    /// Pages demoted clean and not back yet: a fault on one is a promotion.
    pub(super) demoted: PageBits,
    /// Psyncs taking this slice's pages right now: no demotion meanwhile.
    pub(super) collecting: AtomicU64,
    /// What the store holds for each page (writable slices): a dirty page that still
    /// matches is not written or sealed.
    pub(super) digests: Option<StoreDigests>,
    /// The working copy is in the expander's device memory (see
    /// [`PageSource::working_copy_on_device`]).
    pub(super) on_device: bool,
}

impl Slice {
    /// The slice of `npages` from window page `start`, served by `source`; `digests` for a
    /// writable source.
    pub(super) fn new(
        start: u64,
        npages: u64,
        source: Arc<dyn PageSource>,
        digests: Option<StoreDigests>,
    ) -> Self {
        Slice {
            start,
            npages,
            on_device: source.working_copy_on_device(),
            source,
            dirty: PageBits::new(npages),
            installed: PageBits::new(npages),
            predicted: PageBits::new(npages),
            filling: PageBits::new(npages),
            issued: PageBits::new(npages),
            demand: PageBits::new(npages),
            bad: PageBits::new(npages),
            predict: Mutex::new(None),
            triggers: Triggers::default(),
            seq: AtomicU64::new(0),
            poisoned: Mutex::new(Vec::new()),
            zeroed: Mutex::new(Vec::new()),
            stats: Arc::new(SliceStats::default()),
            gate: DetachGate::default(),
            spilled: Mutex::new(BTreeMap::new()),
            demoted: PageBits::new(npages),
            collecting: AtomicU64::new(0),
            digests,
        }
    }

    #[inline]
    pub(super) fn mark_dirty(&self, page: u64) {
        self.dirty.set(page);
    }

    /// How the placement policy names `page` of this slice.
    pub(super) fn page_ref(&self, page: u64) -> pmo_policies::PageRef {
        pmo_policies::PageRef {
            pmo: self.start,
            page,
        }
    }

    /// Which pages came by demand fault and which were handed to the prefetch worker.
    pub(super) fn page_sets(&self) -> PageSets {
        PageSets {
            demand: self.demand.pages(),
            prefetched: self.issued.pages(),
        }
    }

    /// Tells the predictor how an earlier prediction of `page` turned out.
    pub(super) fn feedback(&self, page: u64, used: bool) {
        if let Some(st) = self.predict.locked().as_mut() {
            st.predictor.on_feedback(page, used);
        }
    }

    /// Counts triggers older than the horizon (or beyond the cap) as wasted
    /// and drops their plaintext; their pages may be predicted again.
    pub(super) fn expire_staged(&self, now: u64) {
        for page in self.triggers.expire(now) {
            self.predicted.clear(page);
            // A late fault may have installed it meanwhile: then it was used, and counted so.
            if !self.installed.test(page) {
                self.stats.trigger_wasted.fetch_add(1, Ordering::Relaxed);
                self.feedback(page, false);
            }
        }
    }

    /// Drops every staged trigger at detach, counted wasted.
    pub(super) fn drop_staged(&self) {
        let left = self.triggers.drop_all();
        self.stats.trigger_wasted.fetch_add(left, Ordering::Relaxed);
    }

    /// Installs `data` as `page` unless the page is spilled (its data is in device memory,
    /// newer than anything a fill read) or the slice is closing. `dirty` marks it dirty first
    /// (a psync racing the install must see it), `wp` write-protects it.
    pub(super) fn install(
        &self,
        window: &Window,
        budget: Option<&DramBudget>,
        page: u64,
        data: &[u8; PAGE],
        dirty: bool,
        wp: bool,
    ) -> Installed {
        if self.install_run(window, budget, page, data, dirty, wp) == 0 {
            Installed::Not
        } else {
            Installed::Done
        }
    }

    /// [`Slice::install`] for a run of consecutive pages from `first` (`data` holds whole
    /// pages, at most 64): spilled pages are left out, and each stretch between them goes in
    /// with one copy. Returns which pages went in (bit i for page `first + i`).
    pub(super) fn install_run(
        &self,
        window: &Window,
        budget: Option<&DramBudget>,
        first: u64,
        data: &[u8],
        dirty: bool,
        wp: bool,
    ) -> u64 {
        let n = data.len() / PAGE;
        let Some(_gate) = self.gate.enter() else {
            return 0;
        };
        let spilled = self.spilled.locked();
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
                    self.mark_dirty(first + k as u64);
                }
                if self.on_device {
                    // The page is written into the expander's device memory (LPMO CF).
                    window.charge_device(Instant::now());
                }
            }
            let addr = window.page_addr(self, first + i as u64);
            placed |= window.install_pages(addr, &data[i * PAGE..(i + len) * PAGE], wp) << i;
            i += len;
        }
        for k in (0..n).filter(|k| placed & (1 << k) != 0) {
            let page = first + k as u64;
            // `data` came from the store: remember what it holds. Only when installed (a fill
            // that lost a race may be older than a psync), and under the tier lock, which a
            // psync holds to record what it wrote, so the two cannot land out of order.
            if let Some(d) = &self.digests {
                d.record(page, &data[k * PAGE..(k + 1) * PAGE]);
            }
            self.installed.set(page);
            self.admitted(budget, page, dirty);
        }
        drop(spilled);
        placed
    }

    /// Counts a page that just became resident (under the slice's tier lock).
    fn admitted(&self, budget: Option<&DramBudget>, page: u64, dirty: bool) {
        if self.on_device {
            // Not local DRAM: outside the budget and its policy.
            self.stats.device_pages.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.stats.dram_pages.fetch_add(1, Ordering::Relaxed);
        if let Some(b) = budget {
            b.admitted(self, page, dirty);
        }
    }
}
