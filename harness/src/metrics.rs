//! Exact prediction metrics from the pager's page sets.
//!
//! The pager cannot see a pre-populated page being used (it is used without a fault), so the
//! harness measures against a reference: the same workload under `d` (no predictor), where every
//! page a session uses takes exactly one demand fault, gives each session's used set U. For a run
//! with a predictor, each session's prefetched set P (every page handed to the prefetch worker)
//! and its late count (demand faults on predicted pages not installed yet) give, summed over the
//! sessions:
//! - accuracy = |P∩U| / |P|
//! - coverage = |P∩U| / |U|
//! - timeliness = (|P∩U| − late) / |P∩U|
//!
//! which are seed 000 §4.2's definitions, tallied in a [`pmo_policies::Metrics`].

use crate::engine::SessionPages;
use pmo_policies::Metrics;
use std::collections::HashSet;

/// Errors of the metrics computation.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MetricsError {
    /// The two runs did not go through the same number of sessions, so they cannot be paired.
    #[error("the run has {0} sessions, the reference {1}")]
    Sessions(usize, usize),
}

/// Tallies a predictor run against the reference run's used sets, session by session.
pub fn exact(reference: &[SessionPages], run: &[SessionPages]) -> Result<Metrics, MetricsError> {
    if reference.len() != run.len() {
        return Err(MetricsError::Sessions(run.len(), reference.len()));
    }
    let mut m = Metrics::default();
    for (r, s) in reference.iter().zip(run) {
        let used: HashSet<u64> = r.demand.iter().copied().collect();
        let prefetched: HashSet<u64> = s.prefetched.iter().copied().collect();
        let hit = prefetched.intersection(&used).count() as u64;
        m.record_prefetch(prefetched.len() as u64);
        // Late pages are predicted pages that were used; never count more than were used.
        let late = s.late.min(hit);
        for i in 0..hit {
            m.record_prefetched_use(i >= late);
        }
        for _ in 0..(used.len() as u64).saturating_sub(hit) {
            m.record_demand_fault();
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(demand: &[u64], prefetched: &[u64], late: u64) -> SessionPages {
        SessionPages {
            demand: demand.to_vec(),
            prefetched: prefetched.to_vec(),
            late,
        }
    }

    #[test]
    fn ratios_follow_the_definitions() {
        // Session 1: U = {0..10}, P = {2..12} (8 used, 2 wasted), 2 late.
        // Session 2: U = {0..4}, P = {} .
        let reference = [
            s(&(0..10).collect::<Vec<_>>(), &[], 0),
            s(&[0, 1, 2, 3], &[], 0),
        ];
        let run = [
            s(&[0, 1, 2, 3], &(2..12).collect::<Vec<_>>(), 2),
            s(&[0, 1, 2, 3], &[], 0),
        ];
        let m = exact(&reference, &run).unwrap();
        assert_eq!(m.accuracy(), Some(8.0 / 10.0));
        assert_eq!(m.coverage(), Some(8.0 / 14.0));
        assert_eq!(m.timeliness(), Some(6.0 / 8.0));
    }

    #[test]
    fn no_prediction_has_no_accuracy_and_zero_coverage() {
        let reference = [s(&[1, 2], &[], 0)];
        let m = exact(&reference, &reference).unwrap();
        assert_eq!(m.accuracy(), None);
        assert_eq!(m.coverage(), Some(0.0));
        assert_eq!(m.timeliness(), None);
        assert_eq!(exact(&reference, &[]), Err(MetricsError::Sessions(0, 1)));
    }
}
