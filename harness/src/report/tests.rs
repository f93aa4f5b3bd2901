use super::*;

fn row(w: &'static str, d: &'static str, total: u64, q: Option<Metrics>) -> Row {
    Row {
        workload: w,
        params: String::new(),
        design: d,
        integrity: true,
        threads: 1,
        compute_ns: total / 4,
        b: Breakdown {
            workload_ns: total,
            ..Default::default()
        },
        quality: q,
        error: None,
        group: "micro",
        round_totals: vec![total],
    }
}

fn q(acc: (u64, u64), late: u64, demand: u64) -> Metrics {
    Metrics {
        prefetched: acc.1,
        prefetched_used: acc.0,
        used_before_ready: late,
        demand_faults: demand,
    }
}

#[test]
fn normalization_and_targets() {
    let good = q((95, 100), 1, 5);
    let bad = q((50, 100), 40, 50);
    let rep = Report {
        rows: vec![
            row("seq", "wedi", 400, None),
            row("seq", "sp-id", 200, None),
            row("seq", "d", 150, None),
            row("seq", "d2", 120, Some(bad)),
            row("seq", "d4", 100, Some(good)),
            row("seq", "d8", 110, Some(bad)),
            row("seq", "adaptive", 104, Some(good)),
        ],
        session: 2,
        designs: vec!["wedi", "sp-id", "d", "d2", "d4", "d8", "adaptive"],
        workloads: vec!["seq"],
        ..Default::default()
    };
    assert_eq!(rep.norm(&rep.rows[0]), Some(2.0));
    assert_eq!(rep.rows[0].fault(), 300);
    let t = super::targets::micro(&rep);
    // seq metrics at d4 pass; adaptive +4% passes; wedi/best = 4.0 passes.
    assert!(t.iter().all(|(_, ok)| *ok), "{t:?}");
    assert!(t[0].0.contains("d4"));
    let md = rep.markdown();
    assert!(md.contains("| seq | with | wedi | 0.0 | 2.000 |"), "{md}");
    assert_eq!(rep.csv().lines().count(), 8);

    let mut slow = rep.clone();
    slow.rows[6].b.workload_ns = 200;
    slow.rows[6].round_totals = vec![200];
    slow.rows[0].b.workload_ns = 150;
    let t = super::targets::micro(&slow);
    assert!(!t[1].1, "adaptive 2x the best depth must miss");
    assert!(!t[2].1, "wedi only 1.5x must miss");
}

/// Ratios are taken within each round: a round slowed by load from elsewhere slows both
/// cells of the round and does not decide the verdict.
#[test]
fn ratios_are_taken_within_rounds() {
    let mut a = row("random", "adaptive", 0, None);
    let mut d = row("random", "d", 0, None);
    a.round_totals = vec![101, 300, 98, 102, 500];
    d.round_totals = vec![100, 290, 100, 100, 480];
    let (m, q1, q3) = ratio_in_rounds(&a, &d).unwrap();
    assert!((m - 1.02).abs() < 1e-9, "{m}");
    assert!(q1 <= m && m <= q3);
    assert!((q1 - 1.01).abs() < 1e-9 && (q3 - 300.0 / 290.0).abs() < 1e-9);
    d.round_totals.clear();
    assert_eq!(ratio_in_rounds(&a, &d), None);
}
