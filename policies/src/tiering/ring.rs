//! The resident set both policies keep: pages in admission order, each with its policy's state.

use super::PageRef;
use std::collections::{HashMap, VecDeque};

/// Resident pages in clock order with per-page state `S`. Removal is lazy: the order keeps a
/// generation per entry and skips entries whose page was removed or admitted again since.
pub(super) struct Ring<S> {
    order: VecDeque<(PageRef, u64)>,
    pages: HashMap<PageRef, (u64, S)>,
    next_gen: u64,
}

impl<S> Ring<S> {
    pub(super) fn new() -> Self {
        Self {
            order: VecDeque::new(),
            pages: HashMap::new(),
            next_gen: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.pages.len()
    }

    pub(super) fn get_mut(&mut self, page: &PageRef) -> Option<&mut S> {
        self.pages.get_mut(page).map(|(_, s)| s)
    }

    /// Adds `page` at the tail (the hand reaches it last). The caller checked it is absent.
    pub(super) fn push(&mut self, page: PageRef, state: S) {
        let gen = self.next_gen;
        self.next_gen += 1;
        self.pages.insert(page, (gen, state));
        self.order.push_back((page, gen));
        self.compact();
    }

    /// Takes the page under the hand, if any is tracked.
    pub(super) fn pop(&mut self) -> Option<(PageRef, S)> {
        while let Some((page, gen)) = self.order.pop_front() {
            if self.pages.get(&page).is_some_and(|(g, _)| *g == gen) {
                return self.pages.remove(&page).map(|(_, s)| (page, s));
            }
        }
        None
    }

    /// Forgets every page of attachment `pmo`.
    pub(super) fn forget_pmo(&mut self, pmo: u64) {
        self.pages.retain(|p, _| p.pmo != pmo);
        self.compact();
    }

    /// Drops stale order entries once they outnumber the live ones, so the order stays
    /// proportional to the resident set however pages come and go.
    fn compact(&mut self) {
        if self.order.len() > 2 * self.pages.len() + 64 {
            let pages = &self.pages;
            self.order
                .retain(|(p, gen)| pages.get(p).is_some_and(|(g, _)| g == gen));
        }
    }
}
