//! Offline tampering with the medium is detected on access and the page is never returned.

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use pmo_crypto::PAGE;
use pmo_media::CrashMedium;
use pmo_store::record::{arbitrate, SlotContent};
use pmo_store::superblock::SLOT_SIZE;
use pmo_store::{Perm, Store, StoreError};
use std::sync::Arc;

const NP: u64 = 8;

struct Fixture {
    m: Arc<CrashMedium>,
    s: Store,
    /// Medium image after the first psync (every page at version 1).
    v1: Vec<u8>,
    ext: u64,
    meta: u64,
}

/// Page p holds page_of(1, p) after psync 1; pages 1 and 2 hold page_of(2, p) after psync 2.
fn fixture() -> Fixture {
    let (m, s) = fresh(MEDIUM);
    s.create_pmo("p", NP * PAGE as u64, &key("k")).unwrap();
    let w = s.attach("p", Perm::Write, &key("k")).unwrap();
    let v1p: Vec<_> = (0..NP).map(|p| page_of(1, p)).collect();
    w.psync(v1p.iter().enumerate().map(|(p, d)| (p as u64, d)))
        .unwrap();
    let v1 = m.snapshot();
    w.psync([(1u64, &page_of(2, 1)), (2, &page_of(2, 2))])
        .unwrap();
    w.detach().wait().unwrap();
    let ext = s.list()[0].extent.0;
    Fixture {
        m,
        s,
        v1,
        ext,
        meta: ext + NP * PAGE as u64,
    }
}

fn expect(p: u64) -> [u8; PAGE] {
    page_of(if p == 1 || p == 2 { 2 } else { 1 }, p)
}

/// Faults `p` in a fresh session; returns the error (if any) and checks no plaintext leaked.
fn fault_fresh(s: &Store, p: u64) -> Result<(), StoreError> {
    let r = s.attach("p", Perm::Read, &key("k"))?;
    let mut out = [0xAAu8; PAGE];
    let res = r.fault(p, &mut out);
    match &res {
        Ok(()) => assert_eq!(out, expect(p)),
        Err(_) => assert_eq!(out, [0u8; PAGE], "failed fault must not leave plaintext"),
    }
    res
}

fn flip(m: &CrashMedium, off: u64) {
    let mut b = [0u8; 1];
    let snap = m.snapshot();
    b[0] = snap[off as usize] ^ 0x01;
    m.tamper(off, &b);
}

#[test]
fn flipping_any_byte_of_a_page_is_detected() {
    let f = fixture();
    let r = f.s.attach("p", Perm::Read, &key("k")).unwrap();
    let page = 3u64;
    let base = f.ext + page * PAGE as u64;
    for i in (0..PAGE as u64).step_by(7).chain([PAGE as u64 - 1]) {
        flip(&f.m, base + i);
        let mut out = [0xAAu8; PAGE];
        assert!(matches!(
            r.fault(page, &mut out),
            Err(StoreError::Integrity { page: 3 })
        ));
        assert_eq!(out, [0u8; PAGE]);
        flip(&f.m, base + i);
    }
    let mut out = [0u8; PAGE];
    r.fault(page, &mut out).unwrap();
    assert_eq!(out, expect(page));
}

/// A run read (the prefetch of a sequential scan) stops at a tampered page: the pages
/// before it are verified plaintext, the tampered one holds zeros, and nothing after it is
/// read. Its tree group and cipher are shared across the run, so this checks that a cached
/// group or cipher never lets a page through unchecked, whichever page is edited.
#[test]
fn a_run_stops_at_a_tampered_page_and_returns_only_what_verified_before_it() {
    let f = fixture();
    let r = f.s.attach("p", Perm::Read, &key("k")).unwrap();
    for bad in 0..NP {
        let off = f.ext + bad * PAGE as u64 + 100;
        flip(&f.m, off);
        let mut out = vec![[0xAAu8; PAGE]; NP as usize];
        let (at, e) = r.fault_run(0, &mut out).unwrap_err();
        assert_eq!(at as u64, bad);
        assert!(
            matches!(e, StoreError::Integrity { page } if page == bad),
            "{e}"
        );
        for p in 0..bad {
            assert_eq!(out[p as usize], expect(p), "page {p} before the bad one");
        }
        assert_eq!(
            out[bad as usize], [0u8; PAGE],
            "the bad page leaves no plaintext"
        );
        for p in bad + 1..NP {
            assert_eq!(
                out[p as usize], [0xAAu8; PAGE],
                "page {p} after it is not read"
            );
        }
        flip(&f.m, off);
    }
    let mut out = vec![[0u8; PAGE]; NP as usize];
    r.fault_run(0, &mut out).unwrap();
    for p in 0..NP {
        assert_eq!(out[p as usize], expect(p));
    }
    // A run past the end fails where it leaves the PMO, having filled what lies inside.
    let mut out = vec![[0xAAu8; PAGE]; 3];
    let (at, e) = r.fault_run(NP - 1, &mut out).unwrap_err();
    assert_eq!(at, 1);
    assert!(matches!(e, StoreError::PageOutOfRange { page, .. } if page == NP));
    assert_eq!(out[0], expect(NP - 1));
    assert_eq!(out[1], [0u8; PAGE]);
    let (at, _) = r.fault_run(u64::MAX, &mut out).unwrap_err();
    assert_eq!(at, 0, "no wrap at the top of the page space");
}

#[test]
fn flipping_any_byte_of_page_metadata_is_detected() {
    let f = fixture();
    // Every byte of leaf 5 (version and tag).
    for i in 0..40u64 {
        let off = f.meta + 5 * 40 + i;
        flip(&f.m, off);
        assert!(
            matches!(fault_fresh(&f.s, 5), Err(StoreError::Integrity { page: 5 })),
            "byte {i}"
        );
        // A sibling in the same leaf group is refused too: the group no longer matches its hash.
        assert!(matches!(
            fault_fresh(&f.s, 4),
            Err(StoreError::Integrity { page: 4 })
        ));
        flip(&f.m, off);
    }
    fault_fresh(&f.s, 5).unwrap();
}

#[test]
fn swapping_two_pages_is_detected() {
    let f = fixture();
    let snap = f.m.snapshot();
    let a = (f.ext + 3 * PAGE as u64) as usize;
    let b = (f.ext + 4 * PAGE as u64) as usize;
    // Ciphertexts only.
    f.m.tamper(a as u64, &snap[b..b + PAGE]);
    f.m.tamper(b as u64, &snap[a..a + PAGE]);
    assert!(fault_fresh(&f.s, 3).is_err());
    assert!(fault_fresh(&f.s, 4).is_err());
    // Ciphertexts and their leaves (version + tag) together.
    let la = (f.meta + 3 * 40) as usize;
    let lb = (f.meta + 4 * 40) as usize;
    f.m.tamper(la as u64, &snap[lb..lb + 40]);
    f.m.tamper(lb as u64, &snap[la..la + 40]);
    assert!(fault_fresh(&f.s, 3).is_err());
    assert!(fault_fresh(&f.s, 4).is_err());
}

#[test]
fn rolling_back_a_page_with_its_tag_is_detected() {
    let f = fixture();
    let p = 1u64;
    let d = (f.ext + p * PAGE as u64) as usize;
    let l = (f.meta + p * 40) as usize;
    f.m.tamper(d as u64, &f.v1[d..d + PAGE]);
    f.m.tamper(l as u64, &f.v1[l..l + 40]);
    assert!(matches!(
        fault_fresh(&f.s, 1),
        Err(StoreError::Integrity { page: 1 })
    ));
}

#[test]
fn rolling_back_metadata_is_detected() {
    let f = fixture();
    let slot = f.s.superblock().record_off(0, 0) as usize;
    let rec_now = f.m.snapshot()[slot..slot + SLOT_SIZE as usize].to_vec();
    let meta_now = f.m.snapshot()[f.meta as usize..f.meta as usize + 4096].to_vec();
    // 1. The record (both copies) rolled back to psync 1: its root MAC is genuine but the
    //    tree on the medium is newer.
    f.m.tamper(slot as u64, &f.v1[slot..slot + SLOT_SIZE as usize]);
    let (_m, s2, _) = reopen(f.m.snapshot());
    assert!(fault_fresh(&s2, 1).is_err());
    assert!(fault_fresh(&s2, 0).is_err());
    // 2. Record and the whole tree rolled back, primaries left new: changed pages fail.
    let meta = f.meta as usize;
    f.m.tamper(meta as u64, &f.v1[meta..meta + 4096]);
    let (_m, s3, _) = reopen(f.m.snapshot());
    assert!(matches!(
        fault_fresh(&s3, 1),
        Err(StoreError::Integrity { page: 1 })
    ));
    // 3. The root edited by hand with a recomputed record checksum: the keyed root MAC fails.
    f.m.tamper(slot as u64, &rec_now);
    f.m.tamper(meta as u64, &meta_now);
    let (_m, s_ok, _) = reopen(f.m.snapshot());
    fault_fresh(&s_ok, 1).unwrap();
    let SlotContent::Valid { mut rec, copy } = arbitrate(&rec_now) else {
        panic!()
    };
    rec.root[0] ^= 1;
    rec.seq += 10;
    let enc = rec.encode();
    f.m.tamper(slot as u64 + copy as u64 * SLOT_SIZE / 2, &enc);
    let (_m, s4, _) = reopen(f.m.snapshot());
    assert!(matches!(
        s4.attach("p", Perm::Read, &key("k")),
        Err(StoreError::Corrupt { .. })
    ));
}

/// Documented limit: rolling the *whole* PMO (record, tree and primaries) back to an older
/// consistent image cannot be detected from the medium alone; it needs a monotonic counter
/// outside the medium (e.g. a TPM NV counter). This test pins that behaviour so the docs stay true.
#[test]
fn whole_pmo_rollback_needs_an_external_counter() {
    let f = fixture();
    let slot = f.s.superblock().record_off(0, 0);
    let range = |a: u64, n: u64| (a as usize, (a + n) as usize);
    for (a, b) in [
        range(slot, SLOT_SIZE),
        range(f.ext, NP * PAGE as u64 + 4096),
    ] {
        f.m.tamper(a as u64, &f.v1[a..b]);
    }
    let (_m, s2, _) = reopen(f.m.snapshot());
    let r = s2.attach("p", Perm::Read, &key("k")).unwrap();
    let mut out = [0u8; PAGE];
    r.fault(1, &mut out).unwrap();
    assert_eq!(
        out,
        page_of(1, 1),
        "old but self-consistent version accepted"
    );
}

/// A committed journal (crash between commit and copy) that was edited at rest is refused:
/// recovery reports it, attach fails, nothing is copied from it. A forged entry count costs no
/// memory (the journal is streamed).
#[test]
fn a_tampered_committed_journal_is_refused() {
    use pmo_media::{CrashMode, Medium};
    use pmo_store::{PmoState, RecoveryAction};
    for edit in ["tree-group-byte", "entry-count"] {
        let (m, s) = fresh(MEDIUM);
        s.create_pmo("p", NP * PAGE as u64, &key("k")).unwrap();
        let w = s.attach("p", Perm::Write, &key("k")).unwrap();
        // Persist points of this psync: EP record, journal, TC record (commit), copy...
        m.crash_at_persist(4);
        assert!(w.psync([(1u64, &page_of(7, 1))]).is_err());
        drop(w);
        let img = m.crash_image(CrashMode::DropAll);
        let (m2, s2, rep) = reopen(img.clone());
        assert_eq!(
            rep.actions[0].2,
            RecoveryAction::RolledForward,
            "sanity: TC was durable"
        );
        drop((m2, s2));
        // Now the same image with the journal edited.
        let info = {
            let (_m, s3, _) = reopen(img.clone());
            s3.list()[0].clone()
        };
        let tsc = info.extent.0 + NP * PAGE as u64 + 4096;
        let m4 = Arc::new(CrashMedium::from_image(img));
        match edit {
            // Last bytes of the journal: inside the tree-group entries, covered by the checksum.
            "tree-group-byte" => {
                let mut hdr = [0u8; 32];
                m4.read(tsc, &mut hdr).unwrap();
                let jlen = u64::from_le_bytes(hdr[24..32].try_into().unwrap());
                let at = tsc + jlen - 9;
                let mut b = [0u8; 1];
                m4.read(at, &mut b).unwrap();
                m4.tamper(at, &[b[0] ^ 0x10]);
            }
            _ => m4.tamper(tsc + 16, &u64::MAX.to_le_bytes()),
        }
        let (s4, rep) = Store::open(m4.clone() as Arc<dyn Medium>).unwrap();
        assert!(
            matches!(rep.actions[0].2, RecoveryAction::Damaged(_)),
            "{edit}: {rep:?}"
        );
        assert_eq!(s4.list()[0].state, PmoState::ApplyingJournal);
        assert!(!s4.fsck().problems.is_empty());
        assert!(matches!(
            s4.attach("p", Perm::Read, &key("k")),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
