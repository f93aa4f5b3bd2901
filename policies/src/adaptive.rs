//! Accuracy-driven throttling around stride + stream.

use std::collections::{HashMap, VecDeque};

use crate::stride::{push_stride, StrideTable};
use crate::{push_next, FaultEvent, Predictor};

/// Outcomes (used / wasted) remembered for the accuracy estimate.
const WINDOW: usize = 64;
/// Re-evaluate the depth after this many new outcomes, so one lucky page does not swing it.
const EPOCH: usize = 16;
/// Accuracy at or above which the depth doubles.
const WIDEN_AT: f64 = 0.8;
/// Accuracy below which the depth halves.
const NARROW_BELOW: f64 = 0.5;
/// Accuracy below which prediction switches off (it costs PM bandwidth and worker time for
/// nothing; the paper's TMM at 60% is still worth predicting, random B+tree lookups are not).
const OFF_BELOW: f64 = 0.2;
/// A prediction with no outcome after this many later faults is forgotten, without an outcome:
/// the pager reports only some of them (its triggers, and late pages), and reports a wasted
/// trigger after 64 faults, well inside this.
const HORIZON: u64 = 256;
/// While off, one probe every this many faults.
const PROBE_EVERY: u64 = 32;
/// Pages predicted by one probe.
const PROBE_DEPTH: usize = 2;
/// Probe outcomes judged together; switch back on if at least `PROBE_HITS` of them were used.
const PROBE_SAMPLE: usize = 4;
const PROBE_HITS: usize = 3;
/// Depth to start with and to come back at after a probe succeeded.
const START_DEPTH: usize = 2;

/// Stride-with-stream-fallback whose depth follows its own measured accuracy.
///
/// - Predicts the thread's stride if one is established (see [`crate::Stride`]), otherwise the
///   next pages (stream), `depth` of them. Starts at depth 2.
/// - Tracks accuracy over the last 64 outcomes, as the pager reports them through `on_feedback`
///   (a sample: its trigger pages and late pages; installed pages are used without a fault) and
///   from faults on pages it predicted.
/// - Every 16 outcomes: doubles the depth (up to `max_depth`) when accuracy is at least 80%,
///   halves it below 50%, and switches itself off below 20%, so a random-access workload pays
///   (almost) nothing. (The paper's TMM, at about 60%, keeps predicting.)
/// - While off it probes: 2 pages every 32 faults; if 3 of 4 probed pages are used, the access
///   pattern changed and it switches back on at depth 2.
#[derive(Debug, Clone)]
pub struct Adaptive {
    max_depth: usize,
    depth: usize,
    enabled: bool,
    strides: StrideTable,
    /// Outstanding predictions: page -> (fault sequence number at which it was predicted,
    /// thread it was predicted for).
    outstanding: HashMap<u64, (u64, u32)>,
    /// Same predictions in issue order, for expiry (entries already resolved are skipped).
    issue_order: VecDeque<(u64, u64)>,
    window: VecDeque<bool>,
    since_epoch: usize,
    faults: u64,
    probe_outcomes: Vec<bool>,
}

impl Adaptive {
    /// The depth ceiling of `adaptive` without an argument.
    pub const DEFAULT_MAX_DEPTH: usize = 32;

    /// A predictor that starts shallow and deepens while its predictions are used, up to
    /// `max_depth` pages (at least 1).
    pub fn new(max_depth: usize) -> Self {
        let max_depth = max_depth.max(1);
        Adaptive {
            max_depth,
            depth: START_DEPTH.min(max_depth),
            enabled: true,
            strides: StrideTable::default(),
            outstanding: HashMap::new(),
            issue_order: VecDeque::new(),
            window: VecDeque::with_capacity(WINDOW),
            since_epoch: 0,
            faults: 0,
            probe_outcomes: Vec::new(),
        }
    }

    /// Current prediction depth (meaningful while enabled).
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Whether it currently predicts (false: switched off, only probing).
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Accuracy over the current window, or `None` before any outcome.
    pub fn window_accuracy(&self) -> Option<f64> {
        if self.window.is_empty() {
            None
        } else {
            let used = self.window.iter().filter(|&&u| u).count();
            Some(used as f64 / self.window.len() as f64)
        }
    }

    fn outcome(&mut self, used: bool) {
        if !self.enabled {
            self.probe_outcomes.push(used);
            if self.probe_outcomes.len() >= PROBE_SAMPLE {
                let hits = self.probe_outcomes.iter().filter(|&&u| u).count();
                self.probe_outcomes.clear();
                if hits >= PROBE_HITS {
                    self.enabled = true;
                    self.depth = START_DEPTH.min(self.max_depth);
                    self.window.clear();
                    self.since_epoch = 0;
                }
            }
            return;
        }
        if self.window.len() == WINDOW {
            self.window.pop_front();
        }
        self.window.push_back(used);
        self.since_epoch += 1;
        if self.since_epoch < EPOCH {
            return;
        }
        self.since_epoch = 0;
        let Some(acc) = self.window_accuracy() else {
            return;
        };
        if acc < OFF_BELOW {
            self.enabled = false;
            self.window.clear();
            self.probe_outcomes.clear();
        } else if acc < NARROW_BELOW {
            self.depth = (self.depth / 2).max(1);
        } else if acc >= WIDEN_AT {
            self.depth = (self.depth * 2).min(self.max_depth);
        }
    }

    /// Forgets predictions that got no outcome within [`HORIZON`] faults.
    fn expire(&mut self) {
        while let Some(&(page, seq)) = self.issue_order.front() {
            if self.faults.saturating_sub(seq) <= HORIZON {
                break;
            }
            self.issue_order.pop_front();
            if self.outstanding.get(&page).map(|&(s, _)| s) == Some(seq) {
                self.outstanding.remove(&page);
            }
        }
    }
}

impl Predictor for Adaptive {
    fn on_fault(&mut self, ev: &FaultEvent, out: &mut Vec<u64>) {
        self.faults += 1;
        self.expire();
        // A fault on a page we predicted means it was used (late); the pager also sends
        // feedback, and whichever comes first resolves it once.
        if let Some((_, thread)) = self.outstanding.remove(&ev.page) {
            self.strides.confirm_line(thread, ev.page);
            self.outcome(true);
        }
        let stride = self.strides.observe(ev);
        let depth = if self.enabled {
            self.depth
        } else if self.faults.is_multiple_of(PROBE_EVERY) {
            PROBE_DEPTH
        } else {
            return;
        };
        let start = out.len();
        match stride {
            Some(s) => push_stride(ev, s, depth, out),
            None => push_next(out, ev, depth),
        }
        self.strides.set_line(
            ev.thread,
            stride.unwrap_or(1),
            depth as u64,
            stride.is_some(),
        );
        for &p in &out[start..] {
            self.outstanding.insert(p, (self.faults, ev.thread));
            self.issue_order.push_back((p, self.faults));
        }
    }

    fn on_feedback(&mut self, page: u64, used: bool) {
        if let Some((_, thread)) = self.outstanding.remove(&page) {
            if used {
                self.strides.confirm_line(thread, page);
            }
            self.outcome(used);
        }
    }

    fn name(&self) -> String {
        format!("adaptive:{}", self.max_depth)
    }
}
