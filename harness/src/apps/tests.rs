//! Application cells at quick sizes through the real store and pager: every workload on every
//! design gives a checked result, and a page lost or mixed up fails the cell.

use std::ptr::NonNull;

use super::*;
use crate::engine::design_specs;

const PAGE: usize = 4096;

fn nothing(_: Stage, _: &PmoHost) -> Result<(), AppError> {
    Ok(())
}

/// Every design on `apps`, with and without integrity at one thread, with integrity at two.
fn every_design(apps: &[App]) {
    let runner = Apps::new(true, false);
    for &app in apps {
        for spec in design_specs() {
            for (integrity, threads) in [(true, 1), (false, 1), (true, 2)] {
                let r = runner
                    .run_cell(app, &spec, integrity, threads, &mut nothing)
                    .unwrap_or_else(|e| {
                        panic!("{} {} {integrity} {threads}: {e}", app.name(), spec.label)
                    });
                let b = &r.breakdown;
                assert!(
                    b.sessions > 0 && b.total_ns() > 0,
                    "{} {}",
                    app.name(),
                    spec.label
                );
                // Single-threaded runs record a session per attach.
                if threads == 1 {
                    assert_eq!(r.sessions.len() as u64, b.sessions, "{}", app.name());
                }
                let predicts = spec.predictor.is_some();
                if !predicts {
                    assert!(r.sessions.iter().all(|s| s.prefetched.is_empty()));
                    assert_eq!(b.est.pages_prefetched, 0);
                }
            }
        }
    }
}

#[test]
fn every_ycsb_workload_runs_on_every_design_and_keeps_every_record() {
    let apps: Vec<App> = ycsb::Workload::ALL.into_iter().map(App::Ycsb).collect();
    every_design(&apps);
}

#[test]
fn every_filebench_personality_runs_on_every_design_and_checks() {
    let apps: Vec<App> = Personality::ALL.into_iter().map(App::Filebench).collect();
    every_design(&apps);
}

/// `pmo-compare --cxl`: the CXL designs' cells of every application run on a store on an
/// emulated expander and check; without an expander, or without integrity, they are refused.
#[test]
fn the_cxl_designs_run_every_application_on_an_expander_store() {
    let model = crate::cxl_store::ExpanderModel {
        cache: 8 << 20,
        media_latency_ns: 0,
    };
    let runner = Apps::new(true, false).with_cxl(model, 0);
    let file_only = Apps::new(true, false);
    let cxl_specs: Vec<_> = crate::engine::cxl_design_specs()
        .into_iter()
        .filter(|(_, on_cxl)| *on_cxl)
        .map(|(s, _)| s)
        .collect();
    let apps = [
        App::Ycsb(ycsb::Workload::A),
        App::Filebench(Personality::Varmail),
    ];
    for app in apps {
        for spec in &cxl_specs {
            let r = runner
                .run_cell(app, spec, true, 1, &mut nothing)
                .unwrap_or_else(|e| panic!("{} {}: {e}", app.name(), spec.label));
            assert!(r.breakdown.sessions > 0, "{} {}", app.name(), spec.label);
            assert!(runner.run_cell(app, spec, false, 1, &mut nothing).is_err());
            assert!(file_only
                .run_cell(app, spec, true, 1, &mut nothing)
                .is_err());
        }
    }
}

#[test]
fn the_floors_run_and_check() {
    let runner = Apps::new(true, false);
    for name in NAMES {
        let app = App::from_name(name).unwrap();
        assert_eq!(app.name(), name);
        for threads in [1, 2] {
            let ns = runner
                .run_floor(app, threads)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(ns > 0);
        }
    }
    assert_eq!(App::from_name("ycsb-g"), None);
    assert_eq!(App::from_name("mailserver"), None);
}

/// The bytes of an attachment.
fn bytes<'a>(addr: NonNull<u8>, len: usize) -> &'a mut [u8] {
    // SAFETY: the tests pass an attachment of `len` bytes of the host, kept attached while the
    // slice is used, which only the test thread touches.
    unsafe { std::slice::from_raw_parts_mut(addr.as_ptr(), len) }
}

/// LMDB's page header: flags at byte 10; a leaf page has P_LEAF (0x02).
fn is_leaf(page: &[u8]) -> bool {
    u16::from_le_bytes([page[10], page[11]]) & 0x02 != 0
}

/// The highest field version on page `page` (field bytes start `keynum:version:f:`, both 16
/// hex digits), if it holds any field.
fn newest_version(page: &[u8]) -> Option<u64> {
    let hex = |b: &[u8]| {
        std::str::from_utf8(b)
            .ok()
            .and_then(|t| u64::from_str_radix(t, 16).ok())
    };
    (0..page.len().saturating_sub(36))
        .filter(|&j| page[j + 16] == b':' && page[j + 33] == b':' && page[j + 35] == b':')
        .filter_map(|j| hex(&page[j..j + 16]).and(hex(&page[j + 17..j + 33])))
        .max()
}

#[test]
fn a_ycsb_cell_whose_pmo_gets_a_stale_page_back_fails() {
    let spec = design_specs()
        .into_iter()
        .find(|s| s.label == "d4")
        .unwrap();
    let mut before: Vec<u8> = Vec::new();
    let mut restored = None;
    let mut hook = |stage: Stage, host: &PmoHost| -> Result<(), AppError> {
        let name = host.store().list()[0].name.clone();
        match stage {
            Stage::Ready => {
                let (a, len) = host.attach(&name, false, None)?;
                before = bytes(a, len).to_vec();
                host.detach(a)?;
            }
            Stage::Ran => {
                // A page holding the run's newest writes (a page of the live tree, which no
                // later transaction copied) gets its content from before the run back: what a
                // design that lost a psynced page, or served one of the wrong age, would leave.
                let (a, len) = host.attach(&name, true, None)?;
                let now = bytes(a, len);
                let mut pages: Vec<(u64, usize)> = (2..len / PAGE)
                    .filter_map(|p| newest_version(&now[p * PAGE..][..PAGE]).map(|v| (v, p)))
                    .collect();
                pages.sort_unstable_by(|a, b| b.cmp(a));
                // A leaf where a leaf was: LMDB's own assertions abort on a page that is no
                // page of the right kind, which would end the test, not fail the cell.
                let p = pages
                    .iter()
                    .map(|&(_, p)| p)
                    .find(|&p| is_leaf(&before[p * PAGE..][..PAGE]))
                    .expect("a page of the run's newest writes was a leaf before");
                assert_ne!(before[p * PAGE..][..PAGE], now[p * PAGE..][..PAGE]);
                now[p * PAGE..][..PAGE].copy_from_slice(&before[p * PAGE..][..PAGE]);
                assert_eq!(host.sync(a)?, 1);
                host.detach(a)?;
                restored = Some(p);
            }
        }
        Ok(())
    };
    let r =
        Apps::new(true, false).run_cell(App::Ycsb(ycsb::Workload::A), &spec, true, 1, &mut hook);
    assert!(restored.is_some());
    assert!(matches!(r, Err(AppError::Check(_))), "{r:?}");
}

#[test]
fn a_filebench_cell_with_a_page_of_another_file_fails() {
    let spec = design_specs()
        .into_iter()
        .find(|s| s.label == "sp-id")
        .unwrap();
    let mut mixed = false;
    let mut hook = |stage: Stage, host: &PmoHost| -> Result<(), AppError> {
        if stage != Stage::Ran {
            return Ok(());
        }
        // Two files with data: the first page of one is copied over the other's.
        let mut firsts: Vec<(String, Vec<u8>)> = Vec::new();
        for pmo in host.store().list() {
            if pmo.name.ends_with(".log") || firsts.len() == 2 {
                continue;
            }
            let (a, _) = host.attach(&pmo.name, false, None)?;
            let first = bytes(a, PAGE).to_vec();
            host.detach(a)?;
            if first.iter().any(|&b| b != 0) {
                firsts.push((pmo.name, first));
            }
        }
        assert_eq!(firsts.len(), 2, "two files with data");
        let (a, _) = host.attach(&firsts[1].0, true, None)?;
        bytes(a, PAGE).copy_from_slice(&firsts[0].1);
        host.sync(a)?;
        host.detach(a)?;
        mixed = true;
        Ok(())
    };
    let r = Apps::new(true, false).run_cell(
        App::Filebench(Personality::Varmail),
        &spec,
        true,
        1,
        &mut hook,
    );
    assert!(mixed);
    assert!(matches!(r, Err(AppError::Check(_))), "{r:?}");
}

#[test]
fn calls_are_divided_by_the_threads_making_them_and_the_rest_is_the_workload() {
    let run = AppRun {
        wall_ns: 1000,
        m: Measurements {
            attach_ns: 200,
            stall_ns: 100,
            psync_ns: 300,
            detach_ns: 40,
            create_ns: 20,
            destroy_ns: 20,
            attaches: 7,
            psyncs: 5,
            ..Measurements::default()
        },
        sessions: Vec::new(),
    };
    let b = run.cell(2).breakdown;
    assert_eq!(
        (
            b.attach_ns,
            b.stall_ns,
            b.psync_ns,
            b.detach_ns,
            b.create_ns
        ),
        (100, 50, 150, 20, 20)
    );
    assert_eq!(b.workload_ns, 1000 - 340);
    assert_eq!(b.total_ns(), 1000);
    assert_eq!((b.sessions, b.psyncs), (7, 5));
    let b = run.cell(1).breakdown;
    assert_eq!(b.workload_ns, 1000 - 680);
}
