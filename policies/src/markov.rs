//! A bounded correlation (Markov) table over fault pages.

use std::collections::{BTreeMap, HashMap};

use crate::{push_candidate, FaultEvent, Predictor};

/// Entries kept by default. Each entry is a few dozen bytes, so the table stays well under a
/// megabyte while still covering the fault sequence of a multi-gigabyte PMO's hot set.
pub const DEFAULT_CAPACITY: usize = 16 * 1024;
/// Successors remembered per page; more than a handful only dilutes the counts.
const MAX_SUCCESSORS: usize = 4;
/// Threads whose last fault is remembered (least recently faulting evicted first).
const MAX_THREADS: usize = 256;

#[derive(Debug, Clone)]
struct Entry {
    /// (successor page, times observed), unordered.
    successors: Vec<(u64, u32)>,
    stamp: u64,
}

impl Entry {
    /// Most frequent successor; ties go to the one recorded first (stable under noise).
    fn best(&self) -> Option<u64> {
        let mut best: Option<(u64, u32)> = None;
        for &(p, c) in &self.successors {
            if best.is_none_or(|(_, bc)| c > bc) {
                best = Some((p, c));
            }
        }
        best.map(|(p, _)| p)
    }

    fn record(&mut self, next: u64) {
        if let Some(slot) = self.successors.iter_mut().find(|(p, _)| *p == next) {
            slot.1 = slot.1.saturating_add(1);
            return;
        }
        if self.successors.len() >= MAX_SUCCESSORS {
            // Replace the least frequent successor; halve the rest so old habits fade.
            if let Some(i) = (0..self.successors.len()).min_by_key(|&i| self.successors[i].1) {
                self.successors.swap_remove(i);
            }
            for s in &mut self.successors {
                s.1 = s.1.div_ceil(2);
            }
        }
        self.successors.push((next, 1));
    }
}

/// Correlation table: for each fault page, the pages that faulted next on the same thread, with
/// counts. On a fault it follows the most frequent successor chain `depth` steps.
///
/// Why a chain and why it learns from the chain's tail: once predictions work, the pages they
/// covered no longer fault, so the raw next fault after p is far down the sequence. Recording
/// that skip edge would teach the table a different sequence every session and it would never
/// settle. Instead the thread's "previous page" after a prediction is the last page predicted, so
/// the next fault records the true edge tail -> next, and a learned sequence stays learned.
///
/// Bounded: at most `capacity` pages, least recently touched evicted first.
#[derive(Debug, Clone)]
pub struct Markov {
    depth: usize,
    capacity: usize,
    table: HashMap<u64, Entry>,
    /// stamp -> page, oldest first, for LRU eviction in O(log n).
    lru: BTreeMap<u64, u64>,
    /// thread -> (previous page for learning, last fault stamp).
    last: HashMap<u32, (u64, u64)>,
    clock: u64,
}

impl Markov {
    /// A predictor of `depth` pages with the default table capacity.
    pub fn new(depth: usize) -> Self {
        Self::with_capacity(depth, DEFAULT_CAPACITY)
    }

    /// As [`Markov::new`], remembering successors of at most `capacity` pages (LRU beyond).
    pub fn with_capacity(depth: usize, capacity: usize) -> Self {
        Markov {
            depth,
            capacity: capacity.max(1),
            table: HashMap::new(),
            lru: BTreeMap::new(),
            last: HashMap::new(),
            clock: 0,
        }
    }

    /// Pages currently in the table (never more than the capacity).
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// No page has a successor recorded yet.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn learn(&mut self, prev: u64, next: u64) {
        let stamp = self.tick();
        if let Some(e) = self.table.get_mut(&prev) {
            self.lru.remove(&e.stamp);
            e.stamp = stamp;
            e.record(next);
            self.lru.insert(stamp, prev);
            return;
        }
        if self.table.len() >= self.capacity {
            if let Some((_, victim)) = self.lru.pop_first() {
                self.table.remove(&victim);
            }
        }
        self.table.insert(
            prev,
            Entry {
                successors: vec![(next, 1)],
                stamp,
            },
        );
        self.lru.insert(stamp, prev);
    }
}

impl Predictor for Markov {
    fn on_fault(&mut self, ev: &FaultEvent, out: &mut Vec<u64>) {
        let stamp = self.tick();
        if let Some(&(prev, _)) = self.last.get(&ev.thread) {
            if prev != ev.page {
                self.learn(prev, ev.page);
            }
        } else if self.last.len() >= MAX_THREADS {
            if let Some((&tid, _)) = self.last.iter().min_by_key(|(_, (_, s))| *s) {
                self.last.remove(&tid);
            }
        }

        let start = out.len();
        let mut cur = ev.page;
        let mut tail = ev.page;
        // Bounded walk: a cycle in the table (a loop in the workload) must not spin forever.
        for _ in 0..self.depth.saturating_mul(2) {
            if out.len() - start >= self.depth {
                break;
            }
            let Some(next) = self.table.get(&cur).and_then(Entry::best) else {
                break;
            };
            if push_candidate(out, start, ev, next) {
                tail = next;
            }
            cur = next;
        }
        self.last.insert(ev.thread, (tail, stamp));
    }

    fn name(&self) -> String {
        format!("markov:{}", self.depth)
    }
}
