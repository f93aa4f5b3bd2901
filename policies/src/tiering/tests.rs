//! Placement policies driven by traces the way the pager drives them: only faults are seen.

use super::*;
use crate::sim::Rng;
use std::collections::HashSet;

/// The pager's view of one DRAM budget: what is resident and dirty, and what the policy was
/// told. Checks the policy's contract on every call.
struct TierSim {
    policy: Box<dyn Placement>,
    budget: usize,
    resident: HashSet<PageRef>,
    dirty: HashSet<PageRef>,
    hits: u64,
    misses: u64,
    dirty_demotions: u64,
}

impl TierSim {
    fn new(policy: &str, budget: usize) -> Self {
        Self {
            policy: placement_from_name(policy).unwrap(),
            budget,
            resident: HashSet::new(),
            dirty: HashSet::new(),
            hits: 0,
            misses: 0,
            dirty_demotions: 0,
        }
    }

    fn access(&mut self, page: PageRef, write: bool) {
        if self.resident.contains(&page) {
            self.hits += 1;
            // Only the first write to a clean page faults (write protection).
            if write && self.dirty.insert(page) {
                self.policy.touched(page);
                self.policy.dirtied(page);
            }
            return;
        }
        self.misses += 1;
        self.resident.insert(page);
        if write {
            self.dirty.insert(page);
        }
        self.policy.admit(page, write);
        self.enforce();
    }

    fn enforce(&mut self) {
        if self.resident.len() <= self.budget {
            return;
        }
        let mut out = Vec::new();
        let excess = self.resident.len() - self.budget;
        self.policy.victims(excess, &mut out);
        assert!(out.len() <= excess, "asked for {excess}, got {}", out.len());
        for v in out {
            assert!(self.resident.remove(&v), "{v:?} named but not resident");
            if self.dirty.remove(&v) {
                self.dirty_demotions += 1;
            }
        }
        assert!(
            self.resident.len() <= self.budget,
            "over budget after victims"
        );
        assert_eq!(self.policy.resident(), self.resident.len());
    }

    fn forget(&mut self, pmo: u64) {
        self.policy.forget_pmo(pmo);
        self.resident.retain(|p| p.pmo != pmo);
        self.dirty.retain(|p| p.pmo != pmo);
        assert_eq!(self.policy.resident(), self.resident.len());
    }

    fn miss_ratio(&self) -> f64 {
        self.misses as f64 / (self.hits + self.misses) as f64
    }
}

fn page(page: u64) -> PageRef {
    PageRef { pmo: 0, page }
}

/// A random permutation of `0..n`, so hot pages are scattered over the PMO.
fn shuffled(n: u64, rng: &mut Rng) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).collect();
    for i in (1..v.len()).rev() {
        v.swap(i, rng.below(i as u64 + 1) as usize);
    }
    v
}

/// HeMem's GUPS hot set: 90 % of accesses to 10 % of the pages, uniform inside each set; one
/// access in four writes. Also returns the hot pages.
fn gups(npages: u64, accesses: usize, seed: u64) -> (Vec<(u64, bool)>, HashSet<u64>) {
    let mut rng = Rng(seed);
    let order = shuffled(npages, &mut rng);
    let hot = npages / 10;
    let hot_set = order[..hot as usize].iter().copied().collect();
    let trace = (0..accesses)
        .map(|_| {
            let i = if rng.below(10) < 9 {
                rng.below(hot)
            } else {
                hot + rng.below(npages - hot)
            };
            (order[i as usize], rng.below(4) == 0)
        })
        .collect();
    (trace, hot_set)
}

/// Zipfian key popularity (exponent 0.99, YCSB's), ranks scattered over the pages; one access in
/// ten writes.
fn zipfian(npages: u64, accesses: usize, seed: u64) -> Vec<(u64, bool)> {
    let mut rng = Rng(seed);
    let order = shuffled(npages, &mut rng);
    let mut cdf = Vec::with_capacity(npages as usize);
    let mut sum = 0.0;
    for rank in 1..=npages {
        sum += 1.0 / (rank as f64).powf(0.99);
        cdf.push(sum);
    }
    (0..accesses)
        .map(|_| {
            let x = (rng.next() as f64 / u64::MAX as f64) * sum;
            let rank = cdf.partition_point(|&c| c < x).min(npages as usize - 1);
            (order[rank], rng.below(10) == 0)
        })
        .collect()
}

/// Miss ratio of `policy` on `trace` with `budget` pages, the first quarter as warm-up: over
/// all accesses, and over those to pages `hot` says are hot.
fn miss_ratio_in(
    policy: &str,
    budget: usize,
    trace: &[(u64, bool)],
    hot: impl Fn(u64) -> bool,
) -> (f64, f64) {
    let mut sim = TierSim::new(policy, budget);
    let warm = trace.len() / 4;
    for &(p, w) in &trace[..warm] {
        sim.access(page(p), w);
    }
    sim.hits = 0;
    sim.misses = 0;
    let (mut hot_accesses, mut hot_misses) = (0u64, 0u64);
    for &(p, w) in &trace[warm..] {
        let before = sim.misses;
        sim.access(page(p), w);
        if hot(p) {
            hot_accesses += 1;
            hot_misses += sim.misses - before;
        }
    }
    (
        sim.miss_ratio(),
        hot_misses as f64 / hot_accesses.max(1) as f64,
    )
}

fn miss_ratio(policy: &str, budget: usize, trace: &[(u64, bool)]) -> f64 {
    miss_ratio_in(policy, budget, trace, |_| false).0
}

#[test]
fn names_parse_and_round_trip() {
    for name in ["hotness", "fifo"] {
        assert_eq!(placement_from_name(name).unwrap().name(), name);
    }
    assert_eq!(
        placement_from_name(" fifo ").unwrap().name(),
        "fifo",
        "surrounding space is ignored"
    );
    for bad in ["", "lru", "hotness:2", "FIFO"] {
        assert_eq!(
            placement_from_name(bad).err(),
            Some(TieringError::UnknownPolicy(bad.to_string()))
        );
    }
}

#[test]
fn hot_set_stays_in_dram_under_a_quarter_budget() {
    let (trace, hot_set) = gups(4096, 400_000, 7);
    let is_hot = |p| hot_set.contains(&p);
    let (fifo, fifo_hot) = miss_ratio_in("fifo", 1024, &trace, is_hot);
    let (hot, hot_hot) = miss_ratio_in("hotness", 1024, &trace, is_hot);
    eprintln!(
        "GUPS 25 %: miss ratio fifo {fifo:.3} (hot set {fifo_hot:.3}), \
         hotness {hot:.3} (hot set {hot_hot:.3})"
    );
    // The cold accesses (a tenth) miss about as often under any policy that keeps the hot set
    // (the 15 % of DRAM left cannot hold the cold 90 % of pages); the hot set is what differs.
    assert!(hot < fifo, "hotness {hot:.3} vs fifo {fifo:.3}");
    assert!(
        hot_hot * 2.0 < fifo_hot,
        "hot set: hotness {hot_hot:.3} vs fifo {fifo_hot:.3}"
    );
}

#[test]
fn zipfian_keys_miss_less_than_in_fault_order() {
    let trace = zipfian(4096, 400_000, 11);
    for budget in [512, 1024, 2048] {
        let fifo = miss_ratio("fifo", budget, &trace);
        let hot = miss_ratio("hotness", budget, &trace);
        eprintln!("zipfian budget {budget}: miss ratio fifo {fifo:.3} hotness {hot:.3}");
        assert!(
            hot < fifo,
            "budget {budget}: hotness {hot:.3} vs fifo {fifo:.3}"
        );
    }
}

#[test]
fn a_budget_of_the_whole_working_set_never_demotes() {
    let (trace, _) = gups(1000, 50_000, 3);
    for policy in ["fifo", "hotness"] {
        let mut sim = TierSim::new(policy, 1000);
        for &(p, w) in &trace {
            sim.access(page(p), w);
        }
        assert_eq!(
            sim.misses as usize,
            sim.resident.len(),
            "{policy}: only first touches"
        );
    }
}

#[test]
fn contract_holds_across_attachments_and_tiny_budgets() {
    let mut rng = Rng(99);
    for policy in ["fifo", "hotness"] {
        for budget in [1, 2, 7, 64] {
            let mut sim = TierSim::new(policy, budget);
            for step in 0..20_000u64 {
                let pmo = rng.below(3) * 1000;
                let p = PageRef {
                    pmo,
                    page: rng.below(200),
                };
                sim.access(p, rng.below(3) == 0);
                if step % 997 == 0 {
                    sim.forget(pmo);
                }
            }
        }
    }
}

#[test]
fn clean_pages_leave_before_dirty_ones_of_equal_heat() {
    let mut p = Hotness::new();
    for i in 0..4 {
        p.admit(page(i), i % 2 == 0);
    }
    let mut out = Vec::new();
    p.victims(2, &mut out);
    assert_eq!(out, vec![page(1), page(3)]);
}

#[test]
fn a_page_back_soon_after_demotion_outlives_a_first_touch() {
    let mut p = Hotness::new();
    for i in 0..8 {
        p.admit(page(i), false);
    }
    let mut out = Vec::new();
    p.victims(1, &mut out);
    let back = out[0];
    // It returns right away (a refault), and a new page arrives with it.
    p.admit(back, false);
    p.admit(page(100), false);
    out.clear();
    p.victims(8, &mut out);
    let pos = |x: PageRef| out.iter().position(|&v| v == x);
    assert!(pos(page(100)).is_some(), "the new page goes: {out:?}");
    assert!(
        pos(back).is_none() || pos(back) > pos(page(100)),
        "the refaulted page outlives the new one: {out:?}"
    );
}

#[test]
fn forgotten_pages_are_never_named() {
    for policy in ["fifo", "hotness"] {
        let mut p = placement_from_name(policy).unwrap();
        for i in 0..10 {
            p.admit(PageRef { pmo: 1, page: i }, false);
            p.admit(PageRef { pmo: 2, page: i }, true);
        }
        p.forget_pmo(1);
        assert_eq!(p.resident(), 10);
        let mut out = Vec::new();
        p.victims(100, &mut out);
        assert_eq!(out.len(), 10, "{policy}");
        assert!(out.iter().all(|v| v.pmo == 2), "{policy}: {out:?}");
        assert_eq!(p.resident(), 0);
    }
}

#[test]
fn hotness_prefetches_into_free_room_only() {
    let p = Hotness::new();
    assert_eq!(p.prefetch_tier(3, 4), Tier::Dram);
    assert_eq!(p.prefetch_tier(4, 4), Tier::Cxl);
    assert_eq!(Fifo::new().prefetch_tier(4, 4), Tier::Dram);
}
