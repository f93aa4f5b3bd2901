//! The PASS/MISS targets, judged from the cells of one run (the predictor, design and
//! application targets of `pmo-compare`): functions of a [`Report`], which keeps the cells and
//! the lookups.

use super::{geomean, ms, opt, ratio_in_rounds, Report, DEPTHS, D_ALL, O, PREDICTORS};

/// The targets, each with PASS or MISS and the numbers behind it (with integrity, one
/// thread).
pub(super) fn micro(rep: &Report) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let micro = rep.workloads_of("micro");
    if micro.is_empty() {
        return out;
    }
    let tot = |w: &str, d: &str| rep.find(w, d, true, 1).map(|r| r.total() as f64);
    // 1. Sequential workloads: coverage, accuracy, timeliness >= 0.9 at the best depth.
    for w in ["seq", "2dconv"] {
        if !micro.contains(&w) {
            continue;
        }
        let best = DEPTHS
            .iter()
            .filter_map(|d| {
                let q = rep.find(w, d, true, 1)?.quality?;
                let v = [q.accuracy()?, q.coverage()?, q.timeliness()?];
                Some((*d, v))
            })
            .max_by(|a, b| {
                let m = |v: &[f64; 3]| v.iter().copied().fold(f64::MAX, f64::min);
                m(&a.1).total_cmp(&m(&b.1))
            });
        // For context only (the target names the fixed depths): what adaptive reached.
        let adaptive = rep
            .find(w, "adaptive", true, 1)
            .and_then(|r| r.quality)
            .map_or(String::new(), |q| {
                format!(
                    "; adaptive: {} / {} / {}",
                    opt(q.accuracy()),
                    opt(q.coverage()),
                    opt(q.timeliness())
                )
            });
        match best {
            Some((d, v)) => out.push((
                format!(
                    "{w}: best depth {d}: accuracy {:.3}, coverage {:.3}, timeliness {:.3} (target >= 0.9 each){adaptive}",
                    v[0], v[1], v[2]
                ),
                v.iter().all(|x| *x >= 0.9),
            )),
            None => out.push((format!("{w}: no prediction metrics"), false)),
        }
    }
    // 2. adaptive within 5% of the best fixed depth on every workload, and 3. at most 2%
    // slower than none (= d) on random: ratios taken within each round, their median and
    // interquartile range over the rounds.
    let row = |w: &str, d: &str| rep.find(w, d, true, 1);
    let within = |w: &str, other: &str, what: &str, limit: f64| -> (String, bool) {
        match (row(w, "adaptive"), row(w, other)) {
            (Some(a), Some(b)) => match ratio_in_rounds(a, b) {
                Some((m, q1, q3)) => (
                    format!(
                        "{w}: adaptive / {what} {other} = {:+.1}% (median of {} rounds, IQR {:+.1} to {:+.1}%; medians {:.1} / {:.1} ms) (target <= {:+.0}%)",
                        (m - 1.0) * 100.0,
                        a.round_totals.len().min(b.round_totals.len()),
                        (q1 - 1.0) * 100.0,
                        (q3 - 1.0) * 100.0,
                        ms(a.total()),
                        ms(b.total()),
                        (limit - 1.0) * 100.0
                    ),
                    m <= limit,
                ),
                None => (format!("{w}: adaptive vs {other}: no rounds"), false),
            },
            _ => (format!("{w}: adaptive vs {other}: missing cells"), false),
        }
    };
    for w in &micro {
        match DEPTHS
            .iter()
            .filter_map(|d| tot(w, d).map(|t| (*d, t)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
        {
            Some((d, _)) => out.push(within(w, d, "best fixed depth", 1.05)),
            None => out.push((
                format!("{w}: adaptive vs fixed depths: missing cells"),
                false,
            )),
        }
    }
    if micro.contains(&"random") {
        out.push(within("random", "d", "no prediction", 1.02));
    }
    // 4. d with the best predictor >= 1.8x faster than wedi at this session size.
    let mut ratios = Vec::new();
    for w in &micro {
        let best = ["d", "d2", "d4", "d8", "adaptive"]
            .iter()
            .filter_map(|d| tot(w, d).map(|t| (*d, t)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        match (best, tot(w, "wedi")) {
            (Some((d, b)), Some(wedi)) => {
                let r = wedi / b;
                ratios.push(r);
                out.push((
                    format!(
                        "{w}: wedi / best d ({d}) = {r:.3}x at attach-session size {} (target >= 1.8x)",
                        rep.session
                    ),
                    r >= 1.8,
                ));
            }
            _ => out.push((format!("{w}: wedi vs d: missing cells"), false)),
        }
    }
    if !ratios.is_empty() {
        let g = (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp();
        out.push((
            format!("all workloads: geometric mean wedi / best d = {g:.3}x (target >= 1.8x)"),
            g >= 1.8,
        ));
    }
    out
}

/// The applications' targets, each with PASS or MISS and the ratios of this run behind it, per
/// thread count: LPMO's Filebench headline (without integrity: O over the best `d` variant >=
/// 1.25x and over the best predictor >= 1.81x, geometric means), LOaPP's Filebench result (with
/// integrity: `sp-id` over `wedi` >= 2.5x, geometric mean), and YCSB B and C with integrity
/// within 1.5x of the floor with `d` and its best predictor.
pub(super) fn apps(rep: &Report) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let fb = rep.workloads_of("filebench");
    let ycsb = rep.workloads_of("ycsb");
    for t in rep.threads() {
        if !fb.is_empty() {
            // O / X per personality, X the best of `designs`; None when a cell is missing.
            let ratios = |designs: &[&'static str], integrity: bool| {
                let mut v = Vec::new();
                let mut text = Vec::new();
                for w in &fb {
                    let o = rep.tot(w, O, integrity, t)?;
                    let (d, x) = rep.best_of(w, designs, integrity, t)?;
                    v.push(o / x);
                    text.push(format!("{w} {:.2}x ({d})", o / x));
                }
                Some((v, text.join(", ")))
            };
            for (designs, what, goal) in [
                (&D_ALL[..], "best d variant", 1.25),
                (&PREDICTORS[..], "best predictor", 1.81),
            ] {
                match ratios(designs, false) {
                    Some((v, text)) => {
                        let g = geomean(&v).unwrap_or(0.0);
                        out.push((
                            format!(
                                "filebench, without integrity, {t} thr: geometric mean O / {what} = {g:.3}x ({text}) (target >= {goal}x, LPMO)"
                            ),
                            g >= goal,
                        ));
                    }
                    None => out.push((
                        format!("filebench, without integrity, {t} thr: O / {what}: missing cells"),
                        false,
                    )),
                }
            }
            let mut v = Vec::new();
            let mut text = Vec::new();
            for w in &fb {
                if let (Some(wedi), Some(o)) = (rep.tot(w, "wedi", true, t), rep.tot(w, O, true, t))
                {
                    v.push(wedi / o);
                    text.push(format!("{w} {:.2}x", wedi / o));
                }
            }
            if v.len() == fb.len() {
                let g = geomean(&v).unwrap_or(0.0);
                out.push((
                    format!(
                        "filebench, with integrity, {t} thr: geometric mean wedi / sp-id = {g:.3}x ({}) (target >= 2.5x, LOaPP 2.56x)",
                        text.join(", ")
                    ),
                    g >= 2.5,
                ));
            } else {
                out.push((
                    format!("filebench, with integrity, {t} thr: wedi / sp-id: missing cells"),
                    false,
                ));
            }
        }
        for w in ["ycsb-b", "ycsb-c"] {
            if !ycsb.contains(&w) {
                continue;
            }
            let floor = rep
                .rows
                .iter()
                .find(|r| r.workload == w && r.threads == t && r.integrity)
                .map(|r| r.compute_ns as f64)
                .filter(|f| *f > 0.0);
            match (rep.best_of(w, &D_ALL, true, t), floor) {
                (Some((d, x)), Some(floor)) => out.push((
                    format!(
                        "{w}, with integrity, {t} thr: best of d and its predictors ({d}) {:.1} ms = {:.2}x the unencrypted mapped-file floor {:.1} ms (target <= 1.5x)",
                        x / 1e6,
                        x / floor,
                        floor / 1e6
                    ),
                    x <= floor * 1.5,
                )),
                _ => out.push((format!("{w}, {t} thr: d vs floor: missing cells"), false)),
            }
        }
    }
    out
}
