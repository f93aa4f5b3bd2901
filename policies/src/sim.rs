//! A tiny deterministic trace simulator, playing the pager the way `pmo-virtio`'s does:
//! a window of installed pages per attach session; demand faults call `on_fault`; predicted pages
//! are pre-populated by one worker with a fixed cost per page. An installed page is used without
//! a fault, so the pager cannot see it used: only the middle page of each batch (one in four
//! single-page batches) is a *trigger*, held back so its first access faults cheaply, reports
//! `on_feedback(page, true)` and calls `on_fault` again. A trigger untouched for
//! [`TRIGGER_HORIZON`] faults reports `on_feedback(page, false)` and is dropped, as are triggers
//! left at detach. An access to a predicted page that is not ready yet faults, waits, and
//! reports it used (late).
//!
//! It also checks the trait's output contract on every call (each page < npages, never the
//! faulting page, no duplicates) and panics if a predictor breaks it.

use std::collections::{BTreeMap, HashSet};

use crate::{FaultEvent, Metrics, Predictor};

/// Faults a trigger waits for its first access (the pager's `STAGE_HORIZON`).
pub(crate) const TRIGGER_HORIZON: u64 = 64;
/// One in this many single-page predictions is a trigger (the pager's `SINGLE_TRIGGER_EVERY`).
const SINGLE_TRIGGER_EVERY: u64 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Page {
    /// Installed by a demand fault, or a predicted page already accessed.
    Resident,
    /// Predicted, ready at `ready_at`, not yet accessed; a trigger remembers the fault count
    /// at which it was issued.
    Predicted { ready_at: u64, trigger: Option<u64> },
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
    singles: u64,
    /// Outstanding triggers in issue order: (fault count at issue, page).
    triggers: std::collections::VecDeque<(u64, u64)>,
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
            singles: 0,
            triggers: std::collections::VecDeque::new(),
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
            Some(Page::Predicted { ready_at, trigger }) => {
                let ready = ready_at <= self.now;
                self.metrics.record_prefetched_use(ready);
                self.pages.insert(page, Page::Resident);
                if !ready || trigger.is_some() {
                    // Not installed yet (the access faults and waits for the worker), or a
                    // trigger (faults without crypto): either way the pager sees the use.
                    self.pred.on_feedback(page, true);
                    self.fault(page, thread);
                    self.now = self.now.max(ready_at);
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
        // Pages already there or on their way are not issued again (the pager's bitmaps).
        let pages = &self.pages;
        let issue: Vec<u64> = self
            .out
            .iter()
            .copied()
            .filter(|p| !pages.contains_key(p))
            .collect();
        if issue.len() == 1 {
            self.singles += 1;
        }
        let trigger = match issue.len() {
            0 => None,
            1 => self
                .singles
                .is_multiple_of(SINGLE_TRIGGER_EVERY)
                .then_some(0),
            n => Some(n / 2),
        };
        for (i, &p) in issue.iter().enumerate() {
            let ready_at = self.now.max(self.worker_free) + self.cost;
            self.worker_free = ready_at;
            let trig = (trigger == Some(i)).then_some(self.faults);
            if trig.is_some() {
                self.triggers.push_back((self.faults, p));
            }
            self.pages.insert(
                p,
                Page::Predicted {
                    ready_at,
                    trigger: trig,
                },
            );
            self.metrics.record_prefetch(1);
        }
        self.expire();
    }

    /// Triggers untouched for the horizon are wasted: reported, and their page dropped.
    fn expire(&mut self) {
        while let Some(&(seq, p)) = self.triggers.front() {
            if seq + TRIGGER_HORIZON > self.faults {
                break;
            }
            self.triggers.pop_front();
            if let Some(Page::Predicted {
                trigger: Some(s), ..
            }) = self.pages.get(&p)
            {
                if *s == seq {
                    self.pages.remove(&p);
                    self.pred.on_feedback(p, false);
                }
            }
        }
    }

    /// Ends the attach session: the window is dropped, unused predictions reported wasted.
    pub fn detach(&mut self) {
        let pages = std::mem::take(&mut self.pages);
        self.triggers.clear();
        for (p, state) in pages {
            if let Page::Predicted {
                trigger: Some(_), ..
            } = state
            {
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
