use super::*;

#[test]
fn a_tiny_cell_runs_through_the_pager_and_matches_plain_memory() {
    let w = Workload::Lu { n: 40 };
    let (_, want) = run_plain(&w, 2).unwrap();
    let mut env = Env::new(w.pmo_bytes(), false).unwrap();
    let p = RunParams {
        threads: 2,
        cadence: 8,
        session: 2,
    };
    for spec in design_specs() {
        for integrity in [false, true] {
            let r = run_cell(&mut env, &w, &spec, integrity, p, want).unwrap();
            assert_eq!(r.checksum, want);
            // 39 iterations, a psync every 8 and after the last: 5 psyncs, 3 sessions.
            assert_eq!(r.breakdown.psyncs, 5, "{}", spec.label);
            assert_eq!(r.breakdown.sessions, 3, "{}", spec.label);
            assert_eq!(r.sessions.len(), 3);
            assert!(r.breakdown.psync_pages > 0);
        }
    }
}

/// LPMO's CXL columns: the file designs on the file store, the CXL designs on a real
/// expander store (design `c` in its working area, touched directly); every cell's
/// psynced result matches plain memory, the CXL designs have no run without integrity,
/// and a CXL design is refused on the file store.
#[test]
fn the_cxl_figure_runs_each_design_on_its_store() {
    let w = Workload::Lu { n: 40 };
    let (_, want) = run_plain(&w, 1).unwrap();
    let mut file = Env::new(w.pmo_bytes(), false).unwrap();
    let model = crate::cxl_store::ExpanderModel {
        cache: 4 << 20,
        media_latency_ns: 0,
    };
    let mut cxl = Env::on_cxl(
        3 * w.pmo_bytes() as u64 + (32 << 20),
        64,
        model,
        0,
        w.pmo_bytes() as u64,
    )
    .unwrap();
    let p = RunParams {
        threads: 1,
        cadence: 8,
        session: 2,
    };
    let specs = cxl_design_specs();
    let labels: std::collections::HashSet<_> = specs.iter().map(|(s, _)| s.label).collect();
    assert_eq!(labels.len(), specs.len(), "labels are unique");
    for (spec, on_cxl) in &specs {
        assert_eq!(
            *on_cxl,
            spec.design.needs_range_encryption(),
            "{}",
            spec.label
        );
        let env = if *on_cxl { &mut cxl } else { &mut file };
        let r = run_cell(env, &w, spec, true, p, want).unwrap();
        assert_eq!(r.checksum, want, "{}", spec.label);
        if spec.design == Design::C {
            // Its working copy is the expander's memory: no pager fault at all.
            assert_eq!(r.breakdown.faults, 0, "{}", spec.label);
            assert!(r.breakdown.psync_pages > 0, "{}", spec.label);
        } else {
            assert!(r.breakdown.faults > 0, "{}", spec.label);
        }
        if *on_cxl {
            assert!(matches!(
                run_cell(&mut cxl, &w, spec, false, p, want),
                Err(EngineError::NoIntegrityOff(_))
            ));
            assert!(matches!(
                run_cell(&mut file, &w, spec, true, p, want),
                Err(EngineError::Store(StoreError::NeedsRangeEncryption { .. }))
            ));
        }
    }
}

#[test]
fn stream_prefetch_covers_a_sequential_scan_and_metrics_are_ratios() {
    let w = Workload::Seq {
        pages: 512,
        seg: 64,
        passes: 2,
    };
    let (_, want) = run_plain(&w, 1).unwrap();
    let mut env = Env::new(w.pmo_bytes(), false).unwrap();
    let p = RunParams {
        threads: 1,
        cadence: 2,
        session: 2,
    };
    let specs = design_specs();
    let d = specs.iter().find(|s| s.label == "d").unwrap();
    let d8 = specs.iter().find(|s| s.label == "d8").unwrap();
    let none = run_cell(&mut env, &w, d, true, p, want).unwrap();
    // Under `d` every used page is a demand fault and nothing is prefetched.
    assert!(none.sessions.iter().all(|s| s.prefetched.is_empty()));
    assert!(none.breakdown.faults >= 512);
    let run = run_cell(&mut env, &w, d8, true, p, want).unwrap();
    let m = crate::metrics::exact(&none.sessions, &run.sessions).unwrap();
    for r in [m.accuracy(), m.coverage(), m.timeliness()] {
        let r = r.unwrap();
        assert!((0.0..=1.0).contains(&r), "{m:?}");
    }
    assert!(m.coverage().unwrap() > 0.5, "{m:?}");
}

#[test]
fn a_wrong_reference_fails_the_cell() {
    let w = Workload::Gauss { n: 16 };
    let (_, want) = run_plain(&w, 1).unwrap();
    let mut env = Env::new(w.pmo_bytes(), false).unwrap();
    let p = RunParams {
        threads: 1,
        cadence: 4,
        session: 1,
    };
    let spec = &design_specs()[2];
    assert!(matches!(
        run_cell(&mut env, &w, spec, true, p, want ^ 1),
        Err(EngineError::Mismatch { .. })
    ));
}
