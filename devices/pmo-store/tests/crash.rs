//! Crash injection at every persistence point of create, psync, detach and destroy: after the
//! crash only persisted writes survive (or, in random mode, any subset of unpersisted cache
//! lines), the store is reopened, and each PMO must be exactly as of its last completed psync.

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use pmo_crypto::{Suite, PAGE};
use pmo_media::{CrashMedium, CrashMode, Medium};
use pmo_store::{CreateOptions, Design, Perm, PmoState, Store, StoreError};
use std::sync::Arc;

const LEN: u64 = 4 << 20;
const NP: u64 = 8;

type Content = Vec<[u8; PAGE]>;

fn read_all(s: &Store, name: &str) -> Content {
    let r = s.attach(name, Perm::Read, &key("k")).unwrap();
    let mut v = Vec::new();
    for p in 0..NP {
        let mut out = [0u8; PAGE];
        r.fault(p, &mut out).unwrap();
        v.push(out);
    }
    r.detach().wait().unwrap();
    v
}

fn content(tag: u8, pages: &[u64], base: &Content) -> Content {
    let mut c = base.clone();
    for &p in pages {
        c[p as usize] = page_of(tag, p);
    }
    c
}

fn zero() -> Content {
    vec![[0u8; PAGE]; NP as usize]
}

fn modes(k: u64) -> [CrashMode; 2] {
    [CrashMode::DropAll, CrashMode::Random(k * 7919 + 1)]
}

/// After recovery every PMO must be detached, fsck clean, and usable again.
fn check_healthy(s: &Store) {
    for info in s.list() {
        assert_eq!(info.state, PmoState::Detached, "{info:?}");
    }
    let f = s.fsck();
    assert!(f.problems.is_empty(), "{f:?}");
}

/// Runs `op` with a crash at persist point k = 1, 2, ... until it completes; for each crash image
/// calls `judge(store, k)` which returns true if the state is the *new* one. Asserts that old
/// turns into new exactly once (at the commit point) and stays new.
fn sweep<S, O, J>(what: &str, setup: S, op: O, judge: J, commit_is_last: bool) -> u64
where
    S: Fn() -> (Arc<CrashMedium>, Store),
    O: Fn(&Store) -> Result<(), StoreError>,
    J: Fn(&Store) -> bool,
{
    let mut k = 1;
    let mut first_new: Option<u64> = None;
    loop {
        for mode in modes(k) {
            let (m, s) = setup();
            m.crash_at_persist(k);
            let r = op(&s);
            if !m.crashed() {
                r.unwrap();
                assert!(k > 1, "{what}: no persist point at all");
                let (_m2, s2, _rep) = reopen(m.crash_image(CrashMode::DropAll));
                check_healthy(&s2);
                assert!(judge(&s2), "{what}: completed op must give the new state");
                assert!(
                    commit_is_last || first_new.is_some(),
                    "{what}: no crash point after the commit point"
                );
                return k - 1;
            }
            drop(s);
            let (_m2, s2, rep) = reopen(m.crash_image(mode));
            check_healthy(&s2);
            let is_new = judge(&s2);
            // Crash at the first point must keep the old state.
            if k == 1 {
                assert!(!is_new, "{what}: new state before any persist");
            }
            if mode == CrashMode::DropAll {
                match first_new {
                    Some(f) => assert!(is_new, "{what}: back to old at {k} after new at {f}"),
                    None if is_new => first_new = Some(k),
                    None => {}
                }
            }
            let _ = rep;
        }
        k += 1;
        assert!(k < 200, "{what}: runaway");
    }
}

fn setup_pmo(design: Design, suite: Suite) -> impl Fn() -> (Arc<CrashMedium>, Store) {
    move || {
        let m = Arc::new(CrashMedium::new(LEN));
        let s = Store::create(m.clone() as Arc<dyn Medium>, fast_options(8)).unwrap();
        s.create_pmo_with(
            "p",
            NP * PAGE as u64,
            &key("k"),
            CreateOptions {
                design,
                suite: Some(suite),
                kdf: None,
            },
        )
        .unwrap();
        let w = s.attach("p", Perm::Write, &key("k")).unwrap();
        let old = content(1, &[0, 1, 2, 3], &zero());
        w.psync((0..4).map(|p| (p, &old[p as usize]))).unwrap();
        w.detach().wait().unwrap();
        (m, s)
    }
}

#[test]
fn crash_during_create() {
    let setup = || {
        let m = Arc::new(CrashMedium::new(LEN));
        let s = Store::create(m.clone() as Arc<dyn Medium>, fast_options(8)).unwrap();
        (m, s)
    };
    let n = sweep(
        "create",
        setup,
        |s| s.create_pmo("p", NP * PAGE as u64, &key("k")),
        |s| match s.list().len() {
            0 => false,
            _ => {
                assert_eq!(read_all(s, "p"), zero());
                true
            }
        },
        true,
    );
    assert!(n >= 2);
}

#[test]
fn crash_during_psync_every_design_and_point() {
    for design in Design::ON_ANY_MEDIUM {
        for suite in [Suite::XtsBlake3, Suite::AesGcm] {
            let old = content(1, &[0, 1, 2, 3], &zero());
            let new = content(2, &[1, 2, 6], &old);
            let n = sweep(
                "psync",
                setup_pmo(design, suite),
                |s| {
                    let w = s.attach("p", Perm::Write, &key("k"))?;
                    let mut out = [0u8; PAGE];
                    w.fault(1, &mut out)?;
                    w.psync([1u64, 2, 6].iter().map(|&p| (p, &new[p as usize])))?;
                    // The session is dropped without detach: the crash handler path.
                    Ok(())
                },
                |s| {
                    let got = read_all(s, "p");
                    assert!(
                        got == old || got == new,
                        "{design:?}: mixed state after crash"
                    );
                    got == new
                },
                false,
            );
            // attach(W), EP, TSC, TC, copy..., W, crash-handler points
            assert!(n >= 5, "{design:?}: only {n} persist points");
        }
    }
}

#[test]
fn crash_during_detach_keeps_the_last_psync() {
    for design in Design::ON_ANY_MEDIUM {
        let old = content(1, &[0, 1, 2, 3], &zero());
        let last = content(3, &[0, 7], &old);
        let setup = move || {
            let (m, s) = setup_pmo(design, Suite::XtsBlake3)();
            (m, s)
        };
        let last2 = last.clone();
        let mut k = 1;
        loop {
            let (m, s) = setup();
            let w = s.attach("p", Perm::Write, &key("k")).unwrap();
            let mut out = [0u8; PAGE];
            w.fault(2, &mut out).unwrap();
            w.fault(3, &mut out).unwrap();
            w.psync([(0u64, &last2[0]), (7, &last2[7])]).unwrap();
            m.crash_at_persist(k);
            let r = w.detach().wait();
            let crashed = m.crashed();
            if !crashed {
                r.unwrap();
            }
            let (_m2, s2, _) = reopen(m.crash_image(CrashMode::Random(k)));
            check_healthy(&s2);
            assert_eq!(
                read_all(&s2, "p"),
                last,
                "{design:?} crash at detach point {k}"
            );
            if !crashed {
                break;
            }
            k += 1;
        }
        assert!(k >= 2, "{design:?}");
    }
}

#[test]
fn crash_during_destroy() {
    let old = content(1, &[0, 1, 2, 3], &zero());
    sweep(
        "destroy",
        setup_pmo(Design::D, Suite::XtsBlake3),
        |s| s.destroy_pmo("p", &key("k")),
        |s| {
            if s.list().is_empty() {
                // Space is reclaimed and reusable.
                s.create_pmo("q", NP * PAGE as u64, &key("k")).unwrap();
                true
            } else {
                assert_eq!(read_all(s, "p"), old);
                false
            }
        },
        false,
    );
}

#[test]
fn crash_during_recovery_is_recovered_again() {
    let old = content(1, &[0, 1, 2, 3], &zero());
    let new = content(2, &[1, 2, 6], &old);
    // Crash psync just after its commit point, then crash recovery at each of its points.
    for psync_k in 3..=5 {
        let (m, s) = setup_pmo(Design::D, Suite::XtsBlake3)();
        let w = s.attach("p", Perm::Write, &key("k")).unwrap();
        m.crash_at_persist(psync_k);
        let _ = w.psync([1u64, 2, 6].iter().map(|&p| (p, &new[p as usize])));
        assert!(m.crashed());
        drop(w);
        drop(s);
        let img = m.crash_image(CrashMode::DropAll);
        let mut rk = 1;
        loop {
            let m2 = Arc::new(CrashMedium::from_image(img.clone()));
            m2.crash_at_persist(rk);
            let r = Store::open(m2.clone() as Arc<dyn Medium>);
            let crashed = m2.crashed();
            let (_m3, s3, _) = reopen(m2.crash_image(CrashMode::DropAll));
            check_healthy(&s3);
            let got = read_all(&s3, "p");
            assert!(got == old || got == new);
            if !crashed {
                r.unwrap();
                break;
            }
            rk += 1;
        }
    }
}

/// Id designs after a power loss: the crash handler runs at the next attach (it needs the key).
/// Crash *that* at each of its persist points too; the PMO must still end up as of the psync.
#[test]
fn crash_during_the_id_crash_handler_at_attach() {
    for design in [Design::BpId, Design::SpId] {
        let old = content(1, &[0, 1, 2, 3], &zero());
        let new = content(2, &[1, 2, 6], &old);
        let (m, s) = setup_pmo(design, Suite::XtsBlake3)();
        let w = s.attach("p", Perm::Write, &key("k")).unwrap();
        w.psync([1u64, 2, 6].iter().map(|&p| (p, &new[p as usize])))
            .unwrap();
        let img = m.crash_image(CrashMode::DropAll); // power loss before detach
        drop(w);
        assert!(reopen(img.clone()).1.list()[0].pending_tags > 0);
        let mut k = 1;
        loop {
            let m2 = Arc::new(CrashMedium::from_image(img.clone()));
            let (s2, _) = Store::open(m2.clone() as Arc<dyn Medium>).unwrap();
            m2.crash_at_persist(k);
            let r = s2.attach("p", Perm::Read, &key("k"));
            let crashed = m2.crashed();
            drop(r);
            drop(s2);
            let (_m3, s3, _) = reopen(m2.crash_image(CrashMode::Random(k)));
            check_healthy(&s3);
            assert_eq!(
                read_all(&s3, "p"),
                new,
                "{design:?} crash {k} in the Id crash handler"
            );
            assert_eq!(s3.list()[0].pending_tags, 0);
            if !crashed {
                break;
            }
            k += 1;
        }
        assert!(k >= 4, "{design:?}: {k}");
    }
}
