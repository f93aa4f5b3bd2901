//! The store's basic contract: every design and suite through create, attach, fault, psync,
//! detach and reopen; typed errors for bad input; wrong keys; nothing plaintext at rest;
//! nonblocking detach; parallel sessions; destroy; the `id` designs' deferred tags.

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use pmo_crypto::Suite;
use pmo_crypto::{UserKey, PAGE};
use pmo_media::CrashMedium;
use pmo_store::{CreateOptions, Design, Perm, PmoState, StoreError};
use std::sync::Arc;

/// A fresh store holding PMO `name` of `npages` pages with `design` (default suite), and its key.
fn fresh_with_pmo(
    name: &str,
    npages: u64,
    design: Design,
) -> (Arc<CrashMedium>, pmo_store::Store, UserKey) {
    let (m, s) = fresh(MEDIUM);
    let k = key("k");
    s.create_pmo_with(
        name,
        npages * PAGE as u64,
        &k,
        CreateOptions {
            design,
            suite: Some(Suite::XtsBlake3),
            kdf: None,
        },
    )
    .unwrap();
    (m, s, k)
}

#[test]
fn create_attach_psync_detach_reopen_every_design_and_suite() {
    // The benchmark suites too: they run through the store's external-suite path.
    let suites = [
        Suite::XtsBlake3,
        Suite::AesGcm,
        pmo_bench_suites::PAPER,
        pmo_bench_suites::NOMAC,
    ];
    for suite in suites {
        for design in Design::ON_ANY_MEDIUM {
            let (m, s) = fresh_bench(MEDIUM);
            let k = key("k1");
            s.create_pmo_with(
                "obj",
                8 * PAGE as u64,
                &k,
                CreateOptions {
                    design,
                    suite: Some(suite),
                    kdf: None,
                },
            )
            .unwrap();
            let sess = s.attach("obj", Perm::Write, &k).unwrap();
            assert_eq!(sess.design(), design);
            let mut out = [1u8; PAGE];
            sess.fault(3, &mut out).unwrap();
            assert_eq!(out, [0u8; PAGE], "fresh pages read as zero");
            let p1 = page_of(1, 1);
            let p5 = page_of(1, 5);
            sess.psync([(1, &p1), (5, &p5)]).unwrap();
            let p5b = page_of(2, 5);
            sess.psync([(5, &p5b)]).unwrap();
            sess.fault(5, &mut out).unwrap();
            assert_eq!(out, p5b, "{design:?} {suite:?}");
            sess.detach().wait().unwrap();
            let (_m2, s2, rep) = reopen_bench(m.crash_image(pmo_media::CrashMode::DropAll));
            assert!(rep.actions.is_empty(), "{rep:?}");
            let r = s2.attach("obj", Perm::Read, &k).unwrap();
            r.fault(1, &mut out).unwrap();
            assert_eq!(out, p1);
            r.fault(5, &mut out).unwrap();
            assert_eq!(out, p5b);
            r.fault(0, &mut out).unwrap();
            assert_eq!(out, [0u8; PAGE]);
            drop(r);
            assert!(s2.fsck().problems.is_empty());
        }
    }
}

#[test]
fn validation_and_typed_errors() {
    let (_m, s) = fresh(MEDIUM);
    let k = key("k");
    assert!(matches!(
        s.create_pmo("", 4096, &k),
        Err(StoreError::InvalidName(_))
    ));
    assert!(matches!(
        s.create_pmo(".hidden", 4096, &k),
        Err(StoreError::InvalidName(_))
    ));
    assert!(matches!(
        s.create_pmo("a/b", 4096, &k),
        Err(StoreError::InvalidName(_))
    ));
    assert!(matches!(
        s.create_pmo(&"x".repeat(65), 4096, &k),
        Err(StoreError::NameTooLong(65))
    ));
    // 63 bytes is the limit, as on the guest protocol; 64 is refused with a clear message.
    let e = s.create_pmo(&"x".repeat(64), 4096, &k).unwrap_err();
    assert!(matches!(e, StoreError::NameTooLong(64)));
    assert_eq!(
        e.to_string(),
        "PMO name of 64 bytes is too long (at most 63)"
    );
    s.create_pmo_with(
        &"x".repeat(63),
        4096,
        &k,
        pmo_store::CreateOptions {
            kdf: Some(pmo_crypto::KdfParams::INSECURE_FAST),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(matches!(
        s.create_pmo("a", 0, &k),
        Err(StoreError::InvalidSize(0))
    ));
    assert!(matches!(
        s.create_pmo("a", 4095, &k),
        Err(StoreError::InvalidSize(_))
    ));
    assert!(matches!(
        s.create_pmo("a", 65 << 30, &k),
        Err(StoreError::InvalidSize(_))
    ));
    assert!(matches!(
        s.create_pmo("huge", 1 << 30, &k),
        Err(StoreError::Alloc(_))
    ));
    s.create_pmo("a", 4096, &k).unwrap();
    assert!(matches!(
        s.create_pmo("a", 4096, &k),
        Err(StoreError::Exists(_))
    ));
    assert!(matches!(
        s.attach("nope", Perm::Read, &k),
        Err(StoreError::NotFound(_))
    ));
    let w = s.attach("a", Perm::Write, &k).unwrap();
    assert!(matches!(
        s.attach("a", Perm::Read, &k),
        Err(StoreError::Busy(_))
    ));
    assert!(matches!(
        s.attach("a", Perm::Write, &k),
        Err(StoreError::Busy(_))
    ));
    assert!(matches!(s.destroy_pmo("a", &k), Err(StoreError::Busy(_))));
    let mut out = [0u8; PAGE];
    assert!(matches!(
        w.fault(1, &mut out),
        Err(StoreError::PageOutOfRange { .. })
    ));
    let p = [0u8; PAGE];
    assert!(matches!(
        w.psync([(1, &p)]),
        Err(StoreError::PageOutOfRange { .. })
    ));
    w.detach().wait().unwrap();
    let r1 = s.attach("a", Perm::Read, &k).unwrap();
    let r2 = s.attach("a", Perm::Read, &k).unwrap();
    assert!(matches!(r1.psync([(0, &p)]), Err(StoreError::ReadOnly)));
    assert!(matches!(
        s.attach("a", Perm::Write, &k),
        Err(StoreError::Busy(_))
    ));
    drop(r1);
    r2.detach().wait().unwrap();
    assert_eq!(s.list()[0].state, PmoState::Detached);
    s.attach("a", Perm::Write, &k)
        .unwrap()
        .detach()
        .wait()
        .unwrap();
}

#[test]
fn wrong_key_is_uniform_and_reveals_nothing() {
    let (_m, s) = fresh(MEDIUM);
    let k = key("right");
    s.create_pmo("a", 4 * PAGE as u64, &k).unwrap();
    let w = s.attach("a", Perm::Write, &k).unwrap();
    w.psync([(0, &page_of(9, 0))]).unwrap();
    w.detach().wait().unwrap();
    let mut msgs = Vec::new();
    for bad in ["wrong", "righ", "right ", "Right", "x"] {
        for perm in [Perm::Read, Perm::Write] {
            match s.attach("a", perm, &key(bad)) {
                Err(e @ StoreError::WrongKey) => msgs.push(e.to_string()),
                Err(e) => panic!("unexpected error {e}"),
                Ok(_) => panic!("wrong key accepted"),
            }
        }
        assert!(matches!(
            s.destroy_pmo("a", &key(bad)),
            Err(StoreError::WrongKey)
        ));
    }
    msgs.dedup();
    assert_eq!(msgs, vec!["wrong key".to_string()]);
    // The wrong key did not change anything: the right key still works.
    let r = s.attach("a", Perm::Read, &k).unwrap();
    let mut out = [0u8; PAGE];
    r.fault(0, &mut out).unwrap();
    assert_eq!(out, page_of(9, 0));
}

#[test]
fn at_rest_the_medium_holds_no_plaintext_marker() {
    let suites = [
        Suite::XtsBlake3,
        Suite::AesGcm,
        pmo_bench_suites::PAPER,
        pmo_bench_suites::NOMAC,
    ];
    for suite in suites {
        for design in Design::ON_ANY_MEDIUM {
            let (m, s) = fresh_bench(MEDIUM);
            let k = key("KEY-MARKER-0b4c9e");
            s.create_pmo_with(
                "a",
                16 * PAGE as u64,
                &k,
                CreateOptions {
                    design,
                    suite: Some(suite),
                    kdf: None,
                },
            )
            .unwrap();
            let marker = b"PLAINTEXT-MARKER-7d1e";
            let mut p = [0u8; PAGE];
            for c in p.chunks_mut(64) {
                c[..marker.len()].copy_from_slice(marker);
            }
            let w = s.attach("a", Perm::Write, &k).unwrap();
            let mut out = [0u8; PAGE];
            w.fault(2, &mut out).unwrap();
            w.psync((0..16).map(|i| (i, &p))).unwrap();
            // Mid-session the medium holds no plaintext either.
            assert!(!contains(&m.snapshot(), marker));
            w.detach().wait().unwrap();
            assert!(!contains(&m.snapshot(), marker), "{design:?}");
            assert!(!contains(&m.snapshot(), b"KEY-MARKER-0b4c9e"));
            // And destroy scrubs the ciphertext too.
            let before = m.snapshot();
            s.destroy_pmo("a", &k).unwrap();
            let after = m.snapshot();
            let (off, len) = (s.superblock().data_off, 1 << 20);
            assert_ne!(
                &before[off as usize..(off + len) as usize],
                &after[off as usize..(off + len) as usize]
            );
            assert!(after[off as usize..(off + len) as usize]
                .iter()
                .all(|b| *b == 0));
        }
    }
}

#[test]
fn nonblocking_detach_then_attach_waits_and_sees_everything() {
    let (_m, s, k) = fresh_with_pmo("a", 64, Design::Wedi);
    for round in 0..3u8 {
        let w = s.attach("a", Perm::Write, &k).unwrap();
        let pages: Vec<_> = (0..64).map(|i| page_of(round, i)).collect();
        w.psync(pages.iter().enumerate().map(|(i, p)| (i as u64, p)))
            .unwrap();
        let _h = w.detach(); // do not wait: the next attach must
        let r = s.attach("a", Perm::Read, &k).unwrap();
        let mut out = [0u8; PAGE];
        for i in 0..64 {
            r.fault(i, &mut out).unwrap();
            assert_eq!(out, pages[i as usize]);
        }
    }
}

#[test]
fn sessions_on_different_pmos_run_in_parallel_threads() {
    let (_m, s) = fresh(MEDIUM);
    let k = key("k");
    for i in 0..4 {
        s.create_pmo(&format!("p{i}"), 32 * PAGE as u64, &k)
            .unwrap();
    }
    std::thread::scope(|sc| {
        for i in 0..4u8 {
            let s = s.clone();
            let k = key("k");
            sc.spawn(move || {
                let w = s.attach(&format!("p{i}"), Perm::Write, &k).unwrap();
                for round in 0..5u8 {
                    let pages: Vec<_> = (0..8).map(|p| page_of(i * 16 + round, p)).collect();
                    w.psync(pages.iter().enumerate().map(|(p, d)| (p as u64 * 4, d)))
                        .unwrap();
                }
                // several fault threads on one session
                std::thread::scope(|sc2| {
                    for t in 0..3u64 {
                        let w = &w;
                        sc2.spawn(move || {
                            let mut out = [0u8; PAGE];
                            for p in 0..8u64 {
                                w.fault(p * 4, &mut out).unwrap();
                                assert_eq!(out, page_of(i * 16 + 4, p), "t{t}");
                            }
                        });
                    }
                });
                w.detach().wait().unwrap();
            });
        }
    });
    assert!(s.fsck().problems.is_empty());
}

#[test]
fn destroy_reclaims_space_and_name() {
    let (_m, s) = fresh(MEDIUM);
    let k = key("k");
    let free0 = s.free_bytes();
    s.create_pmo("a", 64 * PAGE as u64, &k).unwrap();
    assert!(s.free_bytes() < free0);
    s.destroy_pmo("a", &k).unwrap();
    assert_eq!(s.free_bytes(), free0);
    assert!(s.list().is_empty());
    // a new PMO in the same space/slot starts empty under its own keys
    s.create_pmo("a", 64 * PAGE as u64, &key("other")).unwrap();
    let r = s.attach("a", Perm::Read, &key("other")).unwrap();
    let mut out = [1u8; PAGE];
    r.fault(0, &mut out).unwrap();
    assert_eq!(out, [0u8; PAGE]);
}

#[test]
fn id_designs_defer_tags_to_detach_and_recover_after_power_loss() {
    use pmo_media::CrashMode;
    for design in [Design::BpId, Design::SpId] {
        let (m, s, k) = fresh_with_pmo("a", 8, design);
        let w = s.attach("a", Perm::Write, &k).unwrap();
        w.psync([(2u64, &page_of(5, 2)), (3, &page_of(5, 3))])
            .unwrap();
        // The checksum is not updated at psync: the leaves on the medium carry no tag yet
        // (a leaf is version, generation, tag).
        let info = &s.list()[0];
        assert_eq!(info.pending_tags, 2);
        let leaf = info.extent.0 + 8 * PAGE as u64 + 2 * 40;
        assert!(m.snapshot()[leaf as usize + 24..leaf as usize + 40]
            .iter()
            .all(|b| *b == 0));
        // In-session faults are served from the shadow.
        let mut out = [0u8; PAGE];
        w.fault(2, &mut out).unwrap();
        assert_eq!(out, page_of(5, 2));
        // Power loss now: the session never detaches.
        let img = m.crash_image(CrashMode::DropAll);
        w.detach().wait().unwrap();
        assert_eq!(s.list()[0].pending_tags, 0, "UC at detach");
        assert!(m.snapshot()[leaf as usize + 24..leaf as usize + 40]
            .iter()
            .any(|b| *b != 0));
        // Reboot: recovery is keyless; the next attach runs the crash handler with the key.
        let (_m2, s2, _) = reopen(img);
        assert_eq!(s2.list()[0].pending_tags, 2);
        let r = s2.attach("a", Perm::Read, &k).unwrap();
        assert_eq!(s2.list()[0].pending_tags, 0);
        r.fault(3, &mut out).unwrap();
        assert_eq!(out, page_of(5, 3));
        drop(r);
        assert!(s2.fsck().problems.is_empty());
    }
}

/// BP re-encrypts at detach exactly the pages the session read from the medium, whether
/// they came one at a time (a demand fault) or in a run (a prefetch), and none of the pages a
/// run served from the session's pending shadow.
#[test]
fn bp_reencrypts_exactly_the_pages_its_faults_and_runs_read() {
    for design in [Design::BpIp, Design::BpId] {
        let (m, s, k) = fresh_with_pmo("a", 8, design);
        let w = s.attach("a", Perm::Write, &k).unwrap();
        let v1: Vec<_> = (0..8).map(|p| page_of(1, p)).collect();
        w.psync(v1.iter().enumerate().map(|(p, d)| (p as u64, d)))
            .unwrap();
        w.detach().wait().unwrap();
        let ext = s.list()[0].extent.0;
        let version = |p: u64| {
            let at = (ext + 8 * PAGE as u64 + p * 40) as usize;
            u64::from_le_bytes(m.snapshot()[at..at + 8].try_into().unwrap())
        };
        let before: Vec<u64> = (0..8).map(version).collect();
        let w = s.attach("a", Perm::Write, &k).unwrap();
        // Page 3 psynced in this session: for `bp-id` its run read serves the shadow.
        w.psync([(3u64, &page_of(2, 3))]).unwrap();
        let after_psync: Vec<u64> = (0..8).map(version).collect();
        let mut run = vec![[0u8; PAGE]; 4];
        w.fault_run(2, &mut run).unwrap();
        assert_eq!(run[0], page_of(1, 2));
        assert_eq!(run[1], page_of(2, 3));
        let mut one = [0u8; PAGE];
        w.fault(7, &mut one).unwrap();
        w.detach().wait().unwrap();
        let read: &[u64] = if design == Design::BpId {
            &[2, 4, 5, 7]
        } else {
            &[2, 3, 4, 5, 7]
        };
        for p in 0..8u64 {
            let v = version(p);
            if read.contains(&p) {
                assert!(
                    v > after_psync[p as usize],
                    "{design:?}: page {p} re-encrypted"
                );
            } else {
                assert_eq!(
                    v, after_psync[p as usize],
                    "{design:?}: page {p} left alone"
                );
            }
        }
        assert!(version(0) == before[0]);
        let r = s.attach("a", Perm::Read, &k).unwrap();
        r.fault(3, &mut one).unwrap();
        assert_eq!(one, page_of(2, 3));
        drop(r);
        assert!(s.fsck().problems.is_empty());
    }
}

#[test]
fn the_store_file_at_rest_holds_no_plaintext_or_key() {
    use pmo_media::{FileMedium, Medium};
    use pmo_store::Store;
    use std::sync::Arc;
    let path = std::env::temp_dir().join(format!("pmo-atrest-{}", std::process::id()));
    let k = key("FILE-KEY-MARKER-51c2");
    let marker = b"FILE-PLAINTEXT-MARKER-9a0f";
    {
        let m: Arc<dyn Medium> = Arc::new(FileMedium::create(&path, 8 << 20).unwrap());
        let s = Store::create(m, fast_options(8)).unwrap();
        s.create_pmo("f", 16 * PAGE as u64, &k).unwrap();
        let mut p = [0u8; PAGE];
        for c in p.chunks_mut(128) {
            c[..marker.len()].copy_from_slice(marker);
        }
        let w = s.attach("f", Perm::Write, &k).unwrap();
        w.psync((0..16).map(|i| (i, &p))).unwrap();
        w.detach().wait().unwrap();
    }
    let bytes = std::fs::read(&path).unwrap();
    assert!(!contains(&bytes, marker));
    assert!(!contains(&bytes, b"FILE-KEY-MARKER-51c2"));
    // ...and the data is really there, behind the key.
    let m: Arc<dyn Medium> = Arc::new(FileMedium::open(&path).unwrap());
    let (s, _) = Store::open(m).unwrap();
    let r = s.attach("f", Perm::Read, &k).unwrap();
    let mut out = [0u8; PAGE];
    r.fault(15, &mut out).unwrap();
    assert!(contains(&out, marker));
    drop(r);
    std::fs::remove_file(&path).unwrap();
}

/// Faults from several threads while psync rewrites primaries and tree of the same session: a
/// fault sees the old or the new page, never an error or a mix.
#[test]
fn faults_race_psync_on_one_session() {
    for design in [Design::D, Design::SpId] {
        let (_m, s, k) = fresh_with_pmo("a", 16, design);
        let w = s.attach("a", Perm::Write, &k).unwrap();
        let first: Vec<_> = (0..16).map(|p| page_of(0, p)).collect();
        w.psync(first.iter().enumerate().map(|(p, d)| (p as u64, d)))
            .unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|sc| {
            for t in 0..2u64 {
                let (w, stop) = (&w, &stop);
                sc.spawn(move || {
                    let mut out = [0u8; PAGE];
                    let mut n = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) || n < 50 {
                        let p = (n * 5 + t) % 16;
                        w.fault(p, &mut out).unwrap();
                        let tag = out[8];
                        assert_eq!(out, page_of(tag, p), "torn or foreign page {p}");
                        n += 1;
                    }
                });
            }
            for round in 1..=60u8 {
                let pages: Vec<_> = (0..8).map(|p| page_of(round, p * 2)).collect();
                w.psync(pages.iter().enumerate().map(|(i, d)| (i as u64 * 2, d)))
                    .unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let mut out = [0u8; PAGE];
        w.fault(2, &mut out).unwrap();
        assert_eq!(out, page_of(60, 2));
        w.fault(3, &mut out).unwrap();
        assert_eq!(out, page_of(0, 3));
        w.detach().wait().unwrap();
    }
}

/// A store formatted over the first part of its medium never writes past it, keeps to it
/// when reopened, and a length past the medium is refused.
#[test]
fn a_store_given_part_of_its_medium_keeps_out_of_the_rest() {
    use pmo_media::Medium;
    use pmo_store::{Store, StoreOptions};
    let half = MEDIUM / 2;
    let m = Arc::new(CrashMedium::new(MEDIUM));
    let tail = vec![0xa5u8; (MEDIUM - half) as usize];
    m.write(half, &tail).unwrap();
    let opts = StoreOptions {
        len: Some(half),
        ..fast_options(16)
    };
    let s = Store::create(m.clone() as Arc<dyn Medium>, opts).unwrap();
    assert_eq!(s.superblock().medium_len, half);
    // More than the part's data area: refused, though the medium has room.
    assert!(s.create_pmo("big", half, &key("k")).is_err());
    let mut n = 0;
    while s
        .create_pmo(&format!("p{n}"), 256 * 1024, &key("k"))
        .is_ok()
    {
        let a = s.attach(&format!("p{n}"), Perm::Write, &key("k")).unwrap();
        let pages: Vec<(u64, [u8; PAGE])> = (0..64).map(|p| (p, page_of(n as u8, p))).collect();
        a.psync(pages.iter().map(|(p, d)| (*p, d))).unwrap();
        a.detach().wait().unwrap();
        n += 1;
    }
    assert!(n >= 4, "only {n} PMOs fit");
    s.destroy_pmo("p0", &key("k")).unwrap();
    let mut now = vec![0u8; tail.len()];
    m.read(half, &mut now).unwrap();
    assert!(now == tail, "the store wrote past its part of the medium");
    drop(s);
    let (s, _) = Store::open(m.clone() as Arc<dyn Medium>).unwrap();
    assert_eq!(s.superblock().medium_len, half);
    assert!(s.create_pmo("big", half, &key("k")).is_err());

    let past = StoreOptions {
        len: Some(MEDIUM + 4096),
        ..fast_options(16)
    };
    let m2 = Arc::new(CrashMedium::new(MEDIUM));
    assert!(matches!(
        Store::create(m2 as Arc<dyn Medium>, past),
        Err(StoreError::TooLong { .. })
    ));
}
