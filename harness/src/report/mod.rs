//! Tables, CSV and the targets from the cells of one run.
//!
//! Times are normalized to O (`sp-id`) of the same workload, integrity setting and thread count,
//! as the papers' figures are. Compute is the same workload on resident plain memory measured in
//! the same run (for the applications: the same workload on the floor, LMDB on a mapped file or
//! files in tmpfs); fault overhead is the workload phase on the pager's window minus compute.

use crate::engine::Breakdown;

use pmo_policies::Metrics;
use std::fmt::Write;

mod targets;

/// One measured cell.
#[derive(Debug, Clone)]
pub struct Row {
    /// Workload name.
    pub workload: &'static str,
    /// Its size parameters, for the report header.
    pub params: String,
    /// Design label (`DesignSpec::label`).
    pub design: &'static str,
    /// With page MACs (`xts-blake3`) or without (`xts-nomac-bench`).
    pub integrity: bool,
    /// Host threads playing vCPUs.
    pub threads: usize,
    /// The workload on plain memory, same threads (the compute baseline).
    pub compute_ns: u64,
    /// Where the run's time went.
    pub b: Breakdown,
    /// Exact prediction quality (designs with a predictor, once the `d` reference ran).
    pub quality: Option<Metrics>,
    /// Set when the cell failed (its times are then meaningless).
    pub error: Option<String>,
    /// `micro` (the papers' microbenchmarks and the scans), `ycsb` or `filebench`.
    pub group: &'static str,
    /// The total of every run, in round order (the row shows the median run).
    pub round_totals: Vec<u64>,
}

impl Row {
    /// Compute as shown in the breakdown (never more than the workload phase).
    pub fn compute(&self) -> u64 {
        self.compute_ns.min(self.b.workload_ns)
    }
    /// Workload phase minus compute: page faults and whatever else the window costs.
    pub fn fault(&self) -> u64 {
        self.b.workload_ns.saturating_sub(self.compute_ns)
    }
    /// End-to-end time of the run (every component but the untimed setup and check).
    pub fn total(&self) -> u64 {
        self.b.total_ns()
    }
    /// Shortest and longest total over the rounds.
    pub fn spread(&self) -> Option<(u64, u64)> {
        Some((
            *self.round_totals.iter().min()?,
            *self.round_totals.iter().max()?,
        ))
    }
}

/// Median and interquartile range of `self`'s total over `other`'s, taken within each round
/// (a burst of load from elsewhere hits both cells of a round), as issue 14 measures ratios.
pub fn ratio_in_rounds(a: &Row, b: &Row) -> Option<(f64, f64, f64)> {
    let mut r: Vec<f64> = a
        .round_totals
        .iter()
        .zip(&b.round_totals)
        .filter(|(_, y)| **y > 0)
        .map(|(x, y)| *x as f64 / *y as f64)
        .collect();
    if r.is_empty() {
        return None;
    }
    r.sort_by(f64::total_cmp);
    let q = |f: f64| r[((r.len() - 1) as f64 * f).round() as usize];
    Some((q(0.5), q(0.25), q(0.75)))
}

/// The rows of one run and how they were made.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Every cell, in run order.
    pub rows: Vec<Row>,
    /// Which medium the run used (said on the first line: the tables depend on it).
    pub medium: String,
    /// Tiny sizes: the numbers are a smoke test only.
    pub quick: bool,
    /// The microbenchmarks ran at the papers' sizes (`--paper-sizes`).
    pub paper_sizes: bool,
    /// Attach-session size (psyncs per detach); the issue states the wedi target for 2.
    pub session: u64,
    /// The psync cadence if fixed on the command line.
    pub cadence: Option<u64>,
    /// Design labels in table order.
    pub designs: Vec<&'static str>,
    /// Workload names in table order.
    pub workloads: Vec<&'static str>,
    /// Rounds over the matrix (each row is the median of its runs).
    pub rounds: usize,
    /// LPMO's CXL figure (`--cxl`): O and D on the store file, the CXL designs on an expander
    /// store, with integrity only.
    pub cxl: bool,
}

/// The baseline the papers normalize to.
pub const O: &str = "sp-id";
const DEPTHS: [&str; 3] = ["d2", "d4", "d8"];
/// The designs with a predictor.
const PREDICTORS: [&str; 6] = ["d2", "d4", "d8", "adaptive", "cl4", "cf4"];
/// LPMO's design with and without a predictor.
const D_ALL: [&str; 5] = ["d", "d2", "d4", "d8", "adaptive"];
/// Table titles of the workload groups, in order.
const GROUPS: [(&str, &str); 3] = [
    ("micro", "microbenchmarks"),
    ("ycsb", "YCSB on LMDB"),
    ("filebench", "Filebench"),
];

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn opt(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.3}"))
}

/// Geometric mean (of at least one positive ratio).
fn geomean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| (v.iter().map(|r| r.ln()).sum::<f64>() / v.len() as f64).exp())
}

impl Report {
    fn find(&self, w: &str, d: &str, integrity: bool, threads: usize) -> Option<&Row> {
        self.rows.iter().find(|r| {
            r.workload == w
                && r.design == d
                && r.integrity == integrity
                && r.threads == threads
                && r.error.is_none()
        })
    }

    /// Total of O for the row's group, for normalization.
    fn o_total(&self, r: &Row) -> Option<f64> {
        self.find(r.workload, O, r.integrity, r.threads)
            .map(|o| o.total() as f64)
            .filter(|t| *t > 0.0)
    }

    /// Total time normalized to O of the same group.
    pub fn norm(&self, r: &Row) -> Option<f64> {
        self.o_total(r).map(|o| r.total() as f64 / o)
    }

    fn threads(&self) -> Vec<usize> {
        let mut t: Vec<usize> = self.rows.iter().map(|r| r.threads).collect();
        t.sort_unstable();
        t.dedup();
        t
    }

    /// The workloads of `group`, in table order.
    fn workloads_of(&self, group: &str) -> Vec<&'static str> {
        self.workloads
            .iter()
            .copied()
            .filter(|w| {
                self.rows
                    .iter()
                    .any(|r| r.workload == *w && r.group == group)
            })
            .collect()
    }

    /// Total of the cell, if it ran.
    fn tot(&self, w: &str, d: &str, integrity: bool, threads: usize) -> Option<f64> {
        self.find(w, d, integrity, threads)
            .map(|r| r.total() as f64)
            .filter(|t| *t > 0.0)
    }

    /// The fastest of `designs` for the cell: (design, total).
    fn best_of(
        &self,
        w: &str,
        designs: &[&'static str],
        integrity: bool,
        threads: usize,
    ) -> Option<(&'static str, f64)> {
        designs
            .iter()
            .filter_map(|d| self.tot(w, d, integrity, threads).map(|t| (*d, t)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// The breakdown table for `threads` (all groups).
    pub fn breakdown_md(&self, threads: usize) -> String {
        self.breakdown_md_of(threads, None)
    }

    /// The breakdown table for `threads`, of one group's rows or all.
    fn breakdown_md_of(&self, threads: usize, group: Option<&str>) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "| workload | integrity | design | total ms | x O | compute | fault | psync | detach | attach | stall | create | faults | wp faults | psync pages | runs: min-max ms |"
        );
        let _ = writeln!(
            s,
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for r in self
            .rows
            .iter()
            .filter(|r| r.threads == threads && group.is_none_or(|g| r.group == g))
        {
            let integ = if r.integrity { "with" } else { "without" };
            if let Some(e) = &r.error {
                let _ = writeln!(
                    s,
                    "| {} | {integ} | {} | FAILED: {e} | | | | | | | | | | | | |",
                    r.workload, r.design
                );
                continue;
            }
            let o = self.o_total(r);
            let f = |ns: u64| o.map_or("-".into(), |o| format!("{:.3}", ns as f64 / o));
            let spread = r.spread().map_or("-".into(), |(lo, hi)| {
                format!("{}: {:.1}-{:.1}", r.round_totals.len(), ms(lo), ms(hi))
            });
            let _ = writeln!(
                s,
                "| {} | {integ} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {spread} |",
                r.workload,
                r.design,
                ms(r.total()),
                opt(self.norm(r)),
                f(r.compute()),
                f(r.fault()),
                f(r.b.psync_ns),
                f(r.b.detach_ns),
                f(r.b.attach_ns),
                f(r.b.stall_ns),
                f(r.b.create_ns),
                r.b.faults,
                r.b.wp_faults,
                r.b.psync_pages,
            );
        }
        s
    }

    /// The applications against their floor: total / the floor's time, per design.
    pub fn floor_md(&self) -> String {
        let mut s = String::new();
        let _ = write!(s, "| workload | integrity | threads | floor ms |");
        for d in &self.designs {
            let _ = write!(s, " {d} |");
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "|---|---|---:|---:|{}",
            "---:|".repeat(self.designs.len())
        );
        for t in self.threads() {
            for integrity in [false, true] {
                for w in self
                    .workloads_of("ycsb")
                    .into_iter()
                    .chain(self.workloads_of("filebench"))
                {
                    let Some(floor) = self
                        .rows
                        .iter()
                        .find(|r| r.workload == w && r.threads == t && r.integrity == integrity)
                        .map(|r| r.compute_ns)
                        .filter(|f| *f > 0)
                    else {
                        continue;
                    };
                    let integ = if integrity { "with" } else { "without" };
                    let _ = write!(s, "| {w} | {integ} | {t} | {:.1} |", ms(floor));
                    for d in &self.designs {
                        let v = self
                            .tot(w, d, integrity, t)
                            .map_or("-".into(), |x| format!("{:.2}x", x / floor as f64));
                        let _ = write!(s, " {v} |");
                    }
                    let _ = writeln!(s);
                }
            }
        }
        s
    }

    /// Accuracy / coverage / timeliness per workload and predictor.
    pub fn metrics_md(&self, threads: usize, integrity: bool) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "| workload | design | accuracy | coverage | timeliness | prefetched | used prefetched | late | demand faults | pager estimate (acc / cov / time) |"
        );
        let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|---|");
        // Applications with several threads have no reference run with the same pages (their
        // interleaving differs run to run): only the pager's estimate is shown for them.
        for r in self.rows.iter().filter(|r| {
            r.threads == threads
                && r.integrity == integrity
                && r.error.is_none()
                && (r.quality.is_some() || (r.group != "micro" && PREDICTORS.contains(&r.design)))
        }) {
            let e = r.b.est.estimate();
            let q = r.quality;
            let n = |f: fn(&Metrics) -> u64| q.as_ref().map_or("-".into(), |q| f(q).to_string());
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} / {} |",
                r.workload,
                r.design,
                opt(q.and_then(|q| q.accuracy())),
                opt(q.and_then(|q| q.coverage())),
                opt(q.and_then(|q| q.timeliness())),
                n(|q| q.prefetched),
                n(|q| q.prefetched_used),
                n(|q| q.used_before_ready),
                r.b.faults,
                opt(e.accuracy),
                opt(e.coverage),
                opt(e.timeliness),
            );
        }
        s
    }

    /// Total time at each thread count, with integrity, and the speedup over one thread.
    pub fn scaling_md(&self) -> String {
        let threads = self.threads();
        let mut s = String::new();
        let _ = write!(s, "| workload | design |");
        for t in &threads {
            let _ = write!(s, " {t} thr ms |");
        }
        for t in threads.iter().skip(1) {
            let _ = write!(s, " speedup {t}/1 |");
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "|---|---|{}", "---:|".repeat(threads.len() * 2 - 1));
        for w in &self.workloads {
            for d in &self.designs {
                let cells: Vec<Option<&Row>> =
                    threads.iter().map(|t| self.find(w, d, true, *t)).collect();
                if cells.iter().skip(1).all(|c| c.is_none()) {
                    continue;
                }
                let _ = write!(s, "| {w} | {d} |");
                for c in &cells {
                    let _ = write!(
                        s,
                        " {} |",
                        c.map_or("-".into(), |r| format!("{:.1}", ms(r.total())))
                    );
                }
                for c in cells.iter().skip(1) {
                    let sp = match (cells.first().copied().flatten(), c) {
                        (Some(one), Some(r)) if r.total() > 0 => {
                            format!("{:.2}", one.total() as f64 / r.total() as f64)
                        }
                        _ => "-".into(),
                    };
                    let _ = write!(s, " {sp} |");
                }
                let _ = writeln!(s);
            }
        }
        s
    }

    /// The whole Markdown report.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# PMO design comparison\n");
        let _ = writeln!(s, "- medium: {}", self.medium);
        let micro = !self.workloads_of("micro").is_empty();
        let _ = writeln!(
            s,
            "- sizes: {}; each row is the median of {} round(s) (the runs of a cell interleaved with every other cell's), with the min-max of its totals",
            if self.quick {
                "quick (tiny, not meaningful)"
            } else if self.paper_sizes {
                "the papers' (microbenchmarks with integrity only; docs/compare.md)"
            } else {
                "full"
            },
            self.rounds.max(1),
        );
        if micro {
            let _ = writeln!(
                s,
                "- microbenchmarks: attach-session size {} psyncs per detach; cadence {}",
                self.session,
                self.cadence
                    .map_or("about 8 psyncs per run".to_string(), |c| format!(
                        "{c} iterations per psync"
                    ))
            );
        }
        let mut seen = Vec::new();
        for r in &self.rows {
            if !seen.contains(&r.workload) {
                seen.push(r.workload);
                let _ = writeln!(s, "- {}: {}", r.workload, r.params);
            }
        }
        if self.cxl {
            let _ = writeln!(
                s,
                "- LPMO's CXL figures (seed 000 Figs. 13, 14): `sp-id` (O), `d`, `d4` on the store file; `c`, `cl`, `cl4`, `cf`, `cf4` (LPMO's C, L, L4, F, F4) on the expander store, whose range key is their only cipher (suite `tee-blake3`); with integrity only (docs/compare.md)"
            );
        }
        let _ = writeln!(
            s,
            "\nComponents are fractions of O's (`sp-id`) total for the same workload, integrity and threads; they add up to `x O`. For the applications, compute is the floor's time of the same run phase and fault the rest of the workload phase (an estimate, docs/compare.md).\n"
        );
        for (group, title) in GROUPS {
            if self.workloads_of(group).is_empty() {
                continue;
            }
            for t in self.threads() {
                let _ = writeln!(s, "## Execution time, {title}, {t} thread(s)\n");
                let _ = writeln!(s, "{}", self.breakdown_md_of(t, Some(group)));
            }
        }
        if !self.workloads_of("ycsb").is_empty() || !self.workloads_of("filebench").is_empty() {
            let _ = writeln!(
                s,
                "## Against the floor (total / the floor's time; the floor: LMDB on a mapped file in tmpfs, files in tmpfs with msync)\n"
            );
            let _ = writeln!(s, "{}", self.floor_md());
        }
        for t in self.threads() {
            let _ = writeln!(s, "## Prediction quality, {t} thread(s), with integrity\n");
            let _ = writeln!(s, "{}", self.metrics_md(t, true));
        }
        if !self.cxl {
            let _ = writeln!(s, "## Prediction quality, 1 thread(s), without integrity\n");
            let _ = writeln!(s, "{}", self.metrics_md(1, false));
        }
        if self.threads().len() > 1 {
            let _ = writeln!(s, "## Thread scaling (with integrity)\n");
            let _ = writeln!(s, "{}", self.scaling_md());
        }
        if micro && !self.cxl {
            let _ = writeln!(s, "## Targets (issue 5; with integrity, 1 thread)\n");
            for (t, ok) in targets::micro(self) {
                let _ = writeln!(s, "- **{}** {t}", if ok { "PASS" } else { "MISS" });
            }
            let _ = writeln!(s);
        }
        // The application targets compare designs a `--cxl` run does not have.
        let apps = if self.cxl {
            Vec::new()
        } else {
            targets::apps(self)
        };
        if !apps.is_empty() {
            let _ = writeln!(
                s,
                "## Targets of the applications (the papers' results; ratios within this run)\n"
            );
            for (t, ok) in apps {
                let _ = writeln!(s, "- **{}** {t}", if ok { "PASS" } else { "MISS" });
            }
        }
        s
    }

    /// One CSV line per cell.
    pub fn csv(&self) -> String {
        let mut s = String::from(
            "workload,params,design,integrity,threads,total_ns,norm_to_o,compute_ns,fault_ns,psync_ns,detach_ns,attach_ns,stall_ns,faults,wp_faults,late,psyncs,sessions,psync_pages,prefetched,accuracy,coverage,timeliness,est_accuracy,est_coverage,est_timeliness,group,create_ns,fault_service_ns,total_min_ns,total_max_ns,runs,error\n",
        );
        for r in &self.rows {
            let q = r.quality;
            let est = r.b.est.estimate();
            let predicts = PREDICTORS.contains(&r.design);
            let f = |x: Option<f64>| x.map_or(String::new(), |v| format!("{v:.4}"));
            let g = |x: Option<f64>| if predicts { f(x) } else { String::new() };
            let (lo, hi) = r.spread().map_or((String::new(), String::new()), |(a, b)| {
                (a.to_string(), b.to_string())
            });
            let _ = writeln!(
                s,
                "{},\"{}\",{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},\"{}\"",
                r.workload,
                r.params,
                r.design,
                r.integrity,
                r.threads,
                r.total(),
                f(self.norm(r)),
                r.compute(),
                r.fault(),
                r.b.psync_ns,
                r.b.detach_ns,
                r.b.attach_ns,
                r.b.stall_ns,
                r.b.faults,
                r.b.wp_faults,
                r.b.late,
                r.b.psyncs,
                r.b.sessions,
                r.b.psync_pages,
                q.map_or(String::new(), |q| q.prefetched.to_string()),
                f(q.and_then(|q| q.accuracy())),
                f(q.and_then(|q| q.coverage())),
                f(q.and_then(|q| q.timeliness())),
                g(est.accuracy),
                g(est.coverage),
                g(est.timeliness),
                r.group,
                r.b.create_ns,
                r.b.fault_service_ns,
                lo,
                hi,
                r.round_totals.len(),
                r.error.as_deref().unwrap_or("").replace('"', "'"),
            );
        }
        s
    }
}

#[cfg(test)]
mod tests;
