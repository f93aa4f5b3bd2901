//! Prediction quality metrics, defined as in seed 000 §4.2.

/// Tallies of one PMO's pre-population, and the three ratios the paper reports.
///
/// The paper (seed 000 §4.2) defines them as:
/// - **accuracy**: "what percentage of pages decrypted ahead of time are later found to be
///   correct" — here `prefetched_used / prefetched`;
/// - **coverage**: "what percentage of accessed pages were decrypted ahead of time" — here
///   `prefetched_used / (prefetched_used + demand_faults)`, every used page being either one or
///   the other;
/// - **timeliness**: "what percentage of predicted pages that were fully decrypted by the time the
///   page fault occurs" — here the prefetched pages ready before their first access over the
///   prefetched pages used: `(prefetched_used - used_before_ready) / prefetched_used`.
///
/// Each ratio is `None` while its denominator is zero: "no data" must not read as 0% or 100%.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Metrics {
    /// Pages pre-populated (decrypt + verify + install started) on a prediction.
    pub prefetched: u64,
    /// Pre-populated pages that were later accessed.
    pub prefetched_used: u64,
    /// Of those, pages whose first access came before they were ready (the access faulted and
    /// waited for, or raced with, the pre-population).
    pub used_before_ready: u64,
    /// Accessed pages that were not pre-populated and so took a full demand fault.
    pub demand_faults: u64,
}

impl Metrics {
    /// `n` pages were issued for pre-population.
    pub fn record_prefetch(&mut self, n: u64) {
        self.prefetched = self.prefetched.saturating_add(n);
    }

    /// First access to a pre-populated page; `ready` whether it was installed by then.
    pub fn record_prefetched_use(&mut self, ready: bool) {
        self.prefetched_used = self.prefetched_used.saturating_add(1);
        if !ready {
            self.used_before_ready = self.used_before_ready.saturating_add(1);
        }
    }

    /// First access to a page nobody pre-populated.
    pub fn record_demand_fault(&mut self) {
        self.demand_faults = self.demand_faults.saturating_add(1);
    }

    /// Prefetched pages later used / prefetched pages.
    pub fn accuracy(&self) -> Option<f64> {
        ratio(self.prefetched_used, self.prefetched)
    }

    /// Used pages that were prefetched / used pages.
    pub fn coverage(&self) -> Option<f64> {
        ratio(
            self.prefetched_used,
            self.prefetched_used.saturating_add(self.demand_faults),
        )
    }

    /// Prefetched pages ready before their first access / prefetched pages used.
    pub fn timeliness(&self) -> Option<f64> {
        ratio(
            self.prefetched_used.saturating_sub(self.used_before_ready),
            self.prefetched_used,
        )
    }

    /// Adds another tally (e.g. per-session into per-PMO totals).
    pub fn merge(&mut self, other: &Metrics) {
        self.prefetched = self.prefetched.saturating_add(other.prefetched);
        self.prefetched_used = self.prefetched_used.saturating_add(other.prefetched_used);
        self.used_before_ready = self
            .used_before_ready
            .saturating_add(other.used_before_ready);
        self.demand_faults = self.demand_faults.saturating_add(other.demand_faults);
    }
}

fn ratio(num: u64, den: u64) -> Option<f64> {
    if den == 0 {
        None
    } else {
        Some(num as f64 / den as f64)
    }
}
