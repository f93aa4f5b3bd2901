//! One prefetch job: a run of consecutive predicted pages filled from the source and
//! installed with one copy, or one trigger page filled and staged.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use pmo_policies::Tier;

use crate::pager::budget::DramBudget;
use crate::pager::bufs::RunBufs;
use crate::pager::page_source::Detected;
use crate::pager::slice::Slice;
use crate::pager::staging::Staged;
use crate::pager::window::Window;
use crate::pager::{FillError, PAGE};

/// Most pages of one prefetch job: consecutive predicted pages are filled as a run (one
/// lock and cipher lookup of the store session) and installed with one `UFFDIO_COPY`
/// (about 1.0 us a page here against 1.6-1.8 us one page at a time), which wakes a thread
/// waiting on the run once. A run of 64 pages (256 KiB) takes about 120 us; a fault thread
/// that takes one between faults hands its watch over first. (64 is also the most one
/// copy reports on: `Uffd::install_pages`.) In a sequential scan, runs of 16 pages gave 0.45x
/// the throughput of a first-touch scan of anonymous memory here, runs of 64 0.6-0.75x:
/// the walk waits once per run, and each wait ends in a cross-CPU wake-up.
pub(in crate::pager) const RUN_PAGES: usize = 64;

/// Pages filled and installed as one prefetch job: a run of consecutive pages, or one
/// trigger page to stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Run {
    pub(super) first: u64,
    pub(super) count: u64,
    /// A trigger: filled and held back, not installed (always one page).
    pub(super) stage: bool,
}

impl Run {
    /// The run is done: its pages are no longer its to fill. Wakes whatever waits on a page
    /// it did not install (`placed`, bit i for page `first + i`), in that order: a fault that
    /// saw the page as the run's before the release is woken and retries on the fault path;
    /// one after it takes the fault path at once.
    pub(super) fn release(&self, window: &Window, slice: &Slice, placed: u64) {
        if self.stage {
            return;
        }
        for p in self.first..self.first + self.count {
            slice.filling.clear(p);
        }
        let mut i = 0;
        while i < self.count {
            if placed & (1 << i) != 0 {
                i += 1;
                continue;
            }
            let mut len = 1;
            while i + len < self.count && placed & (1 << (i + len)) == 0 {
                len += 1;
            }
            window.wake_pages(window.page_addr(slice, self.first + i), len);
            i += len;
        }
    }
}

/// Splits predicted pages, in their order, into runs of consecutive pages of at most
/// [`RUN_PAGES`]; the page at index `trigger` becomes a staging job of its own.
pub(super) fn runs_of(pages: &[u64], trigger: Option<usize>) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < pages.len() {
        if trigger == Some(i) {
            runs.push(Run {
                first: pages[i],
                count: 1,
                stage: true,
            });
            i += 1;
            continue;
        }
        let first = pages[i];
        let mut n = 1;
        while i + n < pages.len()
            && n < RUN_PAGES
            && trigger != Some(i + n)
            && pages[i + n] == first + n as u64
        {
            n += 1;
        }
        runs.push(Run {
            first,
            count: n as u64,
            stage: false,
        });
        i += n;
    }
    runs
}

/// One prefetch job for the worker or a spinning fault thread.
pub(in crate::pager) struct PrefetchJob {
    pub(super) slice: Arc<Slice>,
    pub(super) run: Run,
    /// Predicted from a write fault: install it writable and dirty (see
    /// `Prefetcher::predict_after`).
    pub(super) writing: bool,
}

impl PrefetchJob {
    /// Pre-populates the run: fills its pages from the source and installs them, each
    /// stretch of pages that still needs it with one copy, unless a fault got there first. A
    /// page that fails verification is left alone: only a real access to it is refused (see
    /// `fault.rs`). Every page the run does not install is released to the fault path
    /// ([`Run::release`]).
    pub(super) fn populate(
        &self,
        window: &Window,
        budget: Option<&DramBudget>,
        bufs: &mut RunBufs,
    ) {
        let slice = &*self.slice;
        let run = self.run;
        if run.stage {
            self.stage(bufs.page());
            return;
        }
        let bufs = bufs.run();
        let mut placed = 0u64;
        if self.to_dram(budget) {
            let writable = slice.source.writable();
            let dirty = writable && self.writing;
            let mut i = 0;
            while i < run.count as usize && !slice.gate.closing(Ordering::Acquire) {
                // The longest stretch from page i that nobody installed yet.
                let mut len = 0;
                while i + len < run.count as usize
                    && !slice.installed.test(run.first + (i + len) as u64)
                {
                    len += 1;
                }
                let first = run.first + i as u64;
                // Fill it; a failure at page k ends the stretch there.
                let filled = match slice.source.fill_run(first, &mut bufs[..len]) {
                    Ok(()) => len,
                    Err((k, e)) => {
                        failed_ahead(slice, first + k as u64, &e);
                        k
                    }
                };
                if filled > 0 {
                    let data = bufs[..filled].as_flattened();
                    let wp = writable && !self.writing;
                    placed |= slice.install_run(window, budget, first, data, dirty, wp) << i;
                    for b in &mut bufs[..filled] {
                        b.fill(0);
                    }
                }
                // The page that ended the stretch is installed, bad, or failed: skip it.
                i += filled + 1;
            }
            let n = u64::from(placed.count_ones());
            if n > 0 {
                slice.stats.pages_prefetched.fetch_add(n, Ordering::Relaxed);
                if let Some(b) = budget {
                    b.enforce(window);
                }
            }
        }
        run.release(window, slice, placed);
    }

    /// Whether the run's pages go into local DRAM now: under a DRAM budget the placement
    /// policy may keep them in the CXL tier (the store) until they are touched, rather than
    /// push out pages it rates hotter. Decided before any decryption.
    fn to_dram(&self, budget: Option<&DramBudget>) -> bool {
        let slice = &*self.slice;
        let Some(b) = budget.filter(|_| !slice.on_device) else {
            return true;
        };
        if b.prefetch_tier() == Tier::Dram {
            return true;
        }
        // Left in the CXL tier: filled when touched, and free to be predicted again.
        for p in self.run.first..self.run.first + self.run.count {
            slice.predicted.clear(p);
        }
        slice
            .stats
            .prefetch_to_cxl
            .fetch_add(self.run.count, Ordering::Relaxed);
        false
    }

    /// Fills the trigger page and holds it outside the window until its fault (see
    /// [`Pager::set_predictor`](crate::pager::Pager::set_predictor)), unless a fault
    /// installed it meanwhile.
    fn stage(&self, buf: &mut [u8; PAGE]) {
        let slice = &*self.slice;
        let page = self.run.first;
        if slice.gate.closing(Ordering::Acquire) || slice.installed.test(page) {
            return;
        }
        if let Err(e) = slice.source.fill(page, buf) {
            failed_ahead(slice, page, &e);
            return;
        }
        let staged = Staged::new(page, slice.seq.load(Ordering::Acquire), buf);
        buf.fill(0);
        // A late fault may have installed it while we decrypted. Staged inside the gate, so
        // detach (which drops the staged pages after waiting for the gate) cannot miss it.
        let Some(gate) = slice.gate.enter() else {
            return;
        };
        if slice.installed.test(page) {
            return;
        }
        slice.stats.triggers.fetch_add(1, Ordering::Relaxed);
        slice.triggers.push(staged);
        drop(gate);
        slice.expire_staged(slice.seq.load(Ordering::Acquire));
    }
}

/// A predicted page failed to fill. One that fails verification is news even though
/// nothing touched it (and a wrong guess must not kill a process): the guest driver can
/// unmap it before anything, its own kernel included, reads it.
fn failed_ahead(slice: &Slice, page: u64, e: &FillError) {
    if matches!(e, FillError::Integrity(_)) && !slice.bad.set(page) {
        if let Some(_gate) = slice.gate.enter() {
            slice
                .stats
                .integrity_failures
                .fetch_add(1, Ordering::Relaxed);
            slice.source.page_failed(page, e, Detected::Ahead);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(first: u64, count: u64, stage: bool) -> Run {
        Run {
            first,
            count,
            stage,
        }
    }

    #[test]
    fn predictions_split_into_runs_of_consecutive_pages_around_the_trigger() {
        assert_eq!(runs_of(&[], None), vec![]);
        assert_eq!(runs_of(&[5], Some(0)), vec![run(5, 1, true)]);
        assert_eq!(
            runs_of(&[1, 2, 3, 4, 5], Some(2)),
            vec![run(1, 2, false), run(3, 1, true), run(4, 2, false)]
        );
        // Not consecutive, or out of order (a Markov guess): runs break there.
        assert_eq!(
            runs_of(&[7, 8, 20, 9, 10], None),
            vec![run(7, 2, false), run(20, 1, false), run(9, 2, false)]
        );
        let long: Vec<u64> = (100..100 + 2 * RUN_PAGES as u64 + 3).collect();
        let runs = runs_of(&long, None);
        assert_eq!(runs.len(), 3);
        assert_eq!(runs[0], run(100, RUN_PAGES as u64, false));
        assert_eq!(runs[2], run(100 + 2 * RUN_PAGES as u64, 3, false));
        assert_eq!(runs.iter().map(|r| r.count).sum::<u64>(), long.len() as u64);
    }
}
