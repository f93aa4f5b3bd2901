//! A tiny deterministic trace simulator, playing the pager the way `pmo-virtio` will:
//! a window of installed pages per attach session, demand faults call `on_fault`, predicted pages
//! are installed by one pre-population worker with a fixed cost per page, the first access to a
//! predicted page reports `on_feedback(page, true)`, and at detach every predicted page never
//! accessed reports `on_feedback(page, false)`.
//!
//! It also checks the trait's output contract on every call (each page < npages, never the
//! faulting page, no duplicates) and panics if a predictor breaks it.

use std::collections::{BTreeMap, HashSet};

use crate::{FaultEvent, Metrics, Predictor};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Page {
    /// Installed by a demand fault, or a predicted page already accessed.
    Resident,
    /// Predicted, installed (or in flight) at `ready_at`, not yet accessed.
    Predicted { ready_at: u64 },
}

pub(crate) struct Sim {
    pub pred: Box<dyn Predictor>,
    pub npages: u64,
    /// Worker time per pre-populated page, in units of one access.
    pub cost: u64,
    pages: BTreeMap<u64, Page>,
    now: u64,
    worker_free: u64,
    pub metrics: Metrics,
    /// Calls to `on_fault`.
    pub faults: u64,
    /// Pages returned by the predictor (before the "already installed" filter).
    pub predicted: u64,
    out: Vec<u64>,
}

impl Sim {
    pub fn new(pred: Box<dyn Predictor>, npages: u64) -> Self {
        Sim {
            pred,
            npages,
            cost: 0,
            pages: BTreeMap::new(),
            now: 0,
            worker_free: 0,
            metrics: Metrics::default(),
            faults: 0,
            predicted: 0,
            out: Vec::new(),
        }
    }

    pub fn access(&mut self, page: u64, thread: u32) {
        assert!(page < self.npages, "trace page {page} outside the PMO");
        self.now += 1;
        match self.pages.get(&page).copied() {
            Some(Page::Resident) => {}
            None => {
                self.metrics.record_demand_fault();
                self.pages.insert(page, Page::Resident);
                self.fault(page, thread);
            }
            Some(Page::Predicted { ready_at }) => {
                let ready = ready_at <= self.now;
                self.metrics.record_prefetched_use(ready);
                self.pages.insert(page, Page::Resident);
                self.pred.on_feedback(page, true);
                if !ready {
                    // Not installed yet: the access faults and waits for the worker.
                    self.fault(page, thread);
                    self.now = ready_at;
                }
            }
        }
    }

    fn fault(&mut self, page: u64, thread: u32) {
        self.faults += 1;
        let ev = FaultEvent {
            page,
            npages: self.npages,
            thread,
        };
        self.out.clear();
        self.pred.on_fault(&ev, &mut self.out);
        let mut seen = HashSet::new();
        for &p in &self.out {
            assert!(
                p < self.npages,
                "{}: predicted {p} >= npages {}",
                self.pred.name(),
                self.npages
            );
            assert_ne!(p, page, "{}: predicted the faulting page", self.pred.name());
            assert!(
                seen.insert(p),
                "{}: duplicate prediction {p}",
                self.pred.name()
            );
        }
        self.predicted += self.out.len() as u64;
        for i in 0..self.out.len() {
            let p = self.out[i];
            if self.pages.contains_key(&p) {
                continue; // Already installed: the pager's UFFDIO_COPY would see EEXIST.
            }
            let ready_at = self.now.max(self.worker_free) + self.cost;
            self.worker_free = ready_at;
            self.pages.insert(p, Page::Predicted { ready_at });
            self.metrics.record_prefetch(1);
        }
    }

    /// Ends the attach session: the window is dropped, unused predictions reported wasted.
    pub fn detach(&mut self) {
        let pages = std::mem::take(&mut self.pages);
        for (p, state) in pages {
            if let Page::Predicted { .. } = state {
                self.pred.on_feedback(p, false);
            }
        }
    }

    pub fn run(&mut self, trace: &[(u64, u32)]) {
        for &(p, t) in trace {
            self.access(p, t);
        }
    }
}

/// Deterministic SplitMix64, so "random" traces are the same on every run.
pub(crate) struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
