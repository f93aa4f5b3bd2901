//! Tables, CSV and targets of the tiering evaluation, from cells measured in rounds.

use super::{TierCell, Variant};
use std::fmt::Write;

/// One measured cell and where it ran.
pub struct Measured {
    /// Round number (0-based): ratios are taken within a round.
    pub round: usize,
    /// Access pattern name.
    pub pattern: &'static str,
    /// The variant.
    pub variant: Variant,
    /// What it measured.
    pub cell: TierCell,
}

/// One row of the summary: a variant of a pattern across rounds.
pub struct Row {
    /// Access pattern name.
    pub pattern: &'static str,
    /// The variant.
    pub variant: Variant,
    /// Time over the same round's all-DRAM time: median, min, max.
    pub ratio: (f64, f64, f64),
    /// Median hit ratio of local DRAM.
    pub hit_ratio: f64,
    /// Median migrations per second.
    pub migrations_per_s: f64,
    /// Median MiB moved between the tiers.
    pub mib_moved: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn spread(v: &[f64]) -> (f64, f64, f64) {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (median(v.to_vec()), min, max)
}

/// Time of `m` over the all-DRAM time of the same pattern and round.
fn ratio(all: &[Measured], m: &Measured) -> Option<f64> {
    all.iter()
        .find(|b| b.round == m.round && b.pattern == m.pattern && b.variant == Variant::AllDram)
        .map(|b| m.cell.ns as f64 / b.cell.ns.max(1) as f64)
}

/// Summary rows, in the order variants first appear.
pub fn rows(all: &[Measured]) -> Vec<Row> {
    let mut keys: Vec<(&'static str, Variant)> = Vec::new();
    for m in all {
        if !keys.contains(&(m.pattern, m.variant)) {
            keys.push((m.pattern, m.variant));
        }
    }
    keys.into_iter()
        .map(|(pattern, variant)| {
            let cells: Vec<&Measured> = all
                .iter()
                .filter(|m| m.pattern == pattern && m.variant == variant)
                .collect();
            let ratios: Vec<f64> = cells.iter().filter_map(|m| ratio(all, m)).collect();
            Row {
                pattern,
                variant,
                ratio: spread(&ratios),
                hit_ratio: median(cells.iter().map(|m| m.cell.hit_ratio()).collect()),
                migrations_per_s: median(cells.iter().map(|m| m.cell.migrations_per_s()).collect()),
                mib_moved: median(
                    cells
                        .iter()
                        .map(|m| m.cell.bytes_moved as f64 / (1 << 20) as f64)
                        .collect(),
                ),
            }
        })
        .collect()
}

/// Median over rounds of `num`'s time over `den`'s time (same pattern and round).
fn paired(all: &[Measured], pattern: &str, num: Variant, den: Variant) -> Option<f64> {
    let v: Vec<f64> = all
        .iter()
        .filter(|m| m.pattern == pattern && m.variant == num)
        .filter_map(|n| {
            all.iter()
                .find(|d| d.pattern == pattern && d.round == n.round && d.variant == den)
                .map(|d| n.cell.ns as f64 / d.cell.ns.max(1) as f64)
        })
        .collect();
    (!v.is_empty()).then(|| median(v))
}

/// The targets: PASS/MISS lines (a target whose cells did not run says so).
pub fn targets(all: &[Measured], media_clean: bool) -> Vec<String> {
    let hot = Variant::Budget {
        policy: "hotness",
        fraction: 0.25,
    };
    let fifo = Variant::Budget {
        policy: "fifo",
        fraction: 0.25,
    };
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    let mut out = Vec::new();
    match paired(all, "hotset", hot, Variant::AllDram) {
        Some(r) => out.push(format!(
            "{}: hot set at a 25% budget within 1.25x of all-DRAM (hotness: {r:.2}x)",
            verdict(r <= 1.25)
        )),
        None => out.push("not run: hot set at a 25% budget against all-DRAM".into()),
    }
    match paired(all, "hotset", fifo, hot) {
        Some(r) => out.push(format!(
            "{}: hot set at a 25% budget at least 1.5x better than FIFO (fifo/hotness: {r:.2}x)",
            verdict(r >= 1.5)
        )),
        None => out.push("not run: hot set at a 25% budget, hotness against FIFO".into()),
    }
    out.push(format!(
        "{}: no PMO plaintext on the media after every run (marker scan)",
        verdict(media_clean)
    ));
    out
}

/// The summary as a Markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| pattern | variant | time / all-DRAM (median, min-max) | DRAM hit ratio | migrations/s | MiB moved |\n|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {:.2} ({:.2}-{:.2}) | {:.4} | {:.0} | {:.1} |",
            r.pattern,
            r.variant.label(),
            r.ratio.0,
            r.ratio.1,
            r.ratio.2,
            r.hit_ratio,
            r.migrations_per_s,
            r.mib_moved
        );
    }
    s
}

/// Every cell as CSV (one line per cell, for the plot).
pub fn csv(all: &[Measured]) -> String {
    let mut s = String::from(
        "round,pattern,policy,budget_pct,ns,ratio,ops,faults,promotions,demotions,bytes_moved\n",
    );
    for m in all {
        let (policy, pct) = match m.variant {
            Variant::AllDram => ("all-dram", 100.0),
            Variant::Budget { policy, fraction } => (policy, fraction * 100.0),
        };
        let _ = writeln!(
            s,
            "{},{},{},{},{},{:.4},{},{},{},{},{}",
            m.round,
            m.pattern,
            policy,
            pct,
            m.cell.ns,
            ratio(all, m).unwrap_or(f64::NAN),
            m.cell.ops,
            m.cell.faults,
            m.cell.promotions,
            m.cell.demotions,
            m.cell.bytes_moved
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(round: usize, variant: Variant, ns: u64) -> Measured {
        Measured {
            round,
            pattern: "hotset",
            variant,
            cell: TierCell {
                ns,
                ops: 100,
                faults: 10,
                ..Default::default()
            },
        }
    }

    #[test]
    fn ratios_are_taken_within_a_round_and_targets_judge_them() {
        let hot = Variant::Budget {
            policy: "hotness",
            fraction: 0.25,
        };
        let fifo = Variant::Budget {
            policy: "fifo",
            fraction: 0.25,
        };
        // Round 1 ran twice as slow throughout: ratios do not move.
        let all = vec![
            m(0, Variant::AllDram, 100),
            m(0, hot, 120),
            m(0, fifo, 240),
            m(1, Variant::AllDram, 200),
            m(1, hot, 240),
            m(1, fifo, 480),
        ];
        let rows = rows(&all);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[1].ratio, (1.2, 1.2, 1.2));
        assert_eq!(rows[2].ratio, (2.4, 2.4, 2.4));
        assert!((rows[1].hit_ratio - 0.9).abs() < 1e-9);
        let t = targets(&all, true);
        assert!(t[0].starts_with("PASS") && t[1].starts_with("PASS") && t[2].starts_with("PASS"));
        let t = targets(&all[..1], false);
        assert!(
            t[0].starts_with("not run") && t[2].starts_with("MISS"),
            "{t:?}"
        );
        assert_eq!(csv(&all).lines().count(), 7);
        assert!(markdown(&rows).contains("| hotset | hotness 25% | 1.20 (1.20-1.20) |"));
    }
}
