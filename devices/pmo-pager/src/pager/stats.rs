//! What a slice counts: faults and their latency, pages filled and prefetched, integrity
//! failures, and the prediction metrics the comparison reports.

use std::sync::atomic::{AtomicU64, Ordering};

/// Fault latency histogram buckets: bucket i counts faults of [2^i, 2^(i+1)) microseconds.
pub const HIST_BUCKETS: usize = 16;

/// Per-attachment counters, readable while the attachment runs.
#[derive(Default)]
pub struct SliceStats {
    /// Demand faults served (missing pages the guest touched).
    pub faults: AtomicU64,
    /// Their total service time.
    pub fault_ns_total: AtomicU64,
    /// Pages filled from the store (decrypted and verified), by faults or prefetch.
    pub pages_decrypted: AtomicU64,
    /// Of those, by prefetch.
    pub pages_prefetched: AtomicU64,
    /// Pages that failed verification (never installed).
    pub integrity_failures: AtomicU64,
    /// First writes to write-protected pages (the dirty set psync writes).
    pub wp_faults: AtomicU64,
    /// Demand faults on pages that were predicted but not yet installed (late prefetches).
    pub prefetch_late: AtomicU64,
    /// Pages decrypted and verified ahead of time but held back as triggers (see
    /// [`Pager::set_predictor`](super::Pager::set_predictor)).
    pub triggers: AtomicU64,
    /// Triggers the guest touched: predictions seen to be used, in time.
    pub trigger_hits: AtomicU64,
    /// Triggers never touched within the horizon, or left at detach: wasted predictions.
    pub trigger_wasted: AtomicU64,
    /// Demand faults on pages nobody predicted.
    pub demand_unpredicted: AtomicU64,
    /// Pages a psync found marked dirty but holding what the store has: not written.
    pub psync_unchanged: AtomicU64,
    /// Demoted pages brought back into local DRAM (see
    /// [`Pager::set_dram_budget`](super::Pager::set_dram_budget)).
    pub promotions: AtomicU64,
    /// Pages moved out of local DRAM to keep to the budget.
    pub demotions: AtomicU64,
    /// Predicted pages left in the CXL tier because DRAM had no room for them.
    pub prefetch_to_cxl: AtomicU64,
    /// Pages of the attachment resident in the window (local DRAM) now.
    pub dram_pages: AtomicU64,
    /// Written pages of the attachment demoted to device memory now.
    pub cxl_dirty_pages: AtomicU64,
    /// Pages of a working copy kept in the expander's device memory (design `cf`) installed
    /// this session; such an attachment has no `dram_pages`.
    pub device_pages: AtomicU64,
    /// Fault service times, bucket i counting `[2^i, 2^(i+1))` microseconds.
    pub fault_hist: [AtomicU64; HIST_BUCKETS],
}

/// Prediction quality of one attachment, as the paper defines it (seed 000
/// §4.2), estimated from what the pager can observe: an installed page is
/// used without a fault, so only triggers and late pages show use. Each
/// ratio is `None` while it has no data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PredictionEstimate {
    /// Pre-populated pages later used / pre-populated pages (from the triggers, a sample).
    pub accuracy: Option<f64>,
    /// Used pages that were pre-populated / used pages.
    pub coverage: Option<f64>,
    /// Pre-populated pages ready before their first use / pre-populated pages used.
    pub timeliness: Option<f64>,
}

impl SliceStats {
    pub(super) fn record_fault(&self, ns: u64) {
        self.faults.fetch_add(1, Ordering::Relaxed);
        self.fault_ns_total.fetch_add(ns, Ordering::Relaxed);
        let us = (ns / 1000).max(1);
        let bucket = (63 - us.leading_zeros() as usize).min(HIST_BUCKETS - 1);
        self.fault_hist[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// The counters behind [`SliceStats::estimate`], read once.
    pub fn prediction_counts(&self) -> PredictionCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PredictionCounts {
            pages_prefetched: get(&self.pages_prefetched),
            trigger_hits: get(&self.trigger_hits),
            trigger_wasted: get(&self.trigger_wasted),
            prefetch_late: get(&self.prefetch_late),
            demand_unpredicted: get(&self.demand_unpredicted),
        }
    }

    /// Estimates accuracy, coverage and timeliness from the counters (see
    /// [`PredictionCounts::estimate`]).
    pub fn estimate(&self) -> PredictionEstimate {
        self.prediction_counts().estimate()
    }
}

/// The counters a prediction estimate is made from, as plain numbers, so that several
/// attachments' counts can be summed before estimating.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PredictionCounts {
    /// [`SliceStats::pages_prefetched`].
    pub pages_prefetched: u64,
    /// [`SliceStats::trigger_hits`].
    pub trigger_hits: u64,
    /// [`SliceStats::trigger_wasted`].
    pub trigger_wasted: u64,
    /// [`SliceStats::prefetch_late`].
    pub prefetch_late: u64,
    /// [`SliceStats::demand_unpredicted`].
    pub demand_unpredicted: u64,
}

impl std::ops::AddAssign for PredictionCounts {
    fn add_assign(&mut self, o: Self) {
        self.pages_prefetched += o.pages_prefetched;
        self.trigger_hits += o.trigger_hits;
        self.trigger_wasted += o.trigger_wasted;
        self.prefetch_late += o.prefetch_late;
        self.demand_unpredicted += o.demand_unpredicted;
    }
}

impl PredictionCounts {
    /// Estimates accuracy, coverage and timeliness: the triggers' hit rate stands for the
    /// accuracy of every installed prediction, and late pages are used predictions that were
    /// not ready.
    pub fn estimate(&self) -> PredictionEstimate {
        let (hits, wasted) = (self.trigger_hits as f64, self.trigger_wasted as f64);
        let late = self.prefetch_late as f64;
        let accuracy = (hits + wasted > 0.0).then(|| hits / (hits + wasted));
        let used = accuracy.unwrap_or(0.0) * self.pages_prefetched as f64 + hits + late;
        let demand = self.demand_unpredicted as f64;
        PredictionEstimate {
            accuracy,
            coverage: (used + demand > 0.0).then(|| used / (used + demand)),
            timeliness: (used > 0.0).then(|| (used - late) / used),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PredictionCounts;

    /// Counts of two attachments add field by field, so their sum estimates both together.
    #[test]
    fn counts_add_field_by_field() {
        let a = PredictionCounts {
            pages_prefetched: 1,
            trigger_hits: 2,
            trigger_wasted: 3,
            prefetch_late: 4,
            demand_unpredicted: 5,
        };
        let mut sum = a;
        sum += PredictionCounts {
            pages_prefetched: 10,
            trigger_hits: 20,
            trigger_wasted: 30,
            prefetch_late: 40,
            demand_unpredicted: 50,
        };
        assert_eq!(
            sum,
            PredictionCounts {
                pages_prefetched: 11,
                trigger_hits: 22,
                trigger_wasted: 33,
                prefetch_late: 44,
                demand_unpredicted: 55,
            }
        );
        assert_eq!(sum.estimate().accuracy, Some(22.0 / 55.0));
    }
}
