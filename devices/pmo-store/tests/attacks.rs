//! The store's promise, tried from the attacker's side (docs/threat-model.md).
//!
//! The attacker here is a keyless editor of the medium: it can rewrite any byte, recompute every
//! unkeyed checksum (the record's BLAKE3, the journal's), and put back older copies of any part
//! of the file. Each test is named after the attack it stops, and each of them failed against
//! the store before the record MAC, generations and the anchor existed.

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use pmo_crypto::{KdfParams, PmoKeys, Suite, PAGE};
use pmo_media::{CrashMedium, Medium};
use pmo_store::record::{arbitrate, Record, SlotContent};
use pmo_store::superblock::SLOT_SIZE;
use pmo_store::tree::{Leaf, LEAF};
use pmo_store::{
    AnchorError, CreateOptions, Design, OpenOptions, Perm, Store, StoreError, StoreOptions,
};
use std::sync::Arc;

const NP: u64 = 4;

/// A store with one PMO "p" of `suite`, every page psynced once.
fn one_pmo(suite: Suite) -> (Arc<CrashMedium>, Store) {
    let (m, s) = fresh(MEDIUM);
    s.create_pmo_with(
        "p",
        NP * PAGE as u64,
        &key("k"),
        CreateOptions {
            design: Design::D,
            suite: Some(suite),
            kdf: None,
        },
    )
    .unwrap();
    let w = s.attach("p", Perm::Write, &key("k")).unwrap();
    let pages: Vec<_> = (0..NP).map(|p| page_of(1, p)).collect();
    w.psync(pages.iter().enumerate().map(|(p, d)| (p as u64, d)))
        .unwrap();
    w.detach().wait().unwrap();
    (m, s)
}

/// The current record of slot 0 and where its copy lives.
fn current_record(m: &CrashMedium, s: &Store) -> (Record, u64) {
    let at = s.superblock().record_off(0, 0);
    let img = m.snapshot();
    let raw = &img[at as usize..(at + SLOT_SIZE) as usize];
    let SlotContent::Valid { rec, copy } = arbitrate(raw) else {
        panic!("slot 0 holds no record");
    };
    (*rec, s.superblock().record_off(0, copy))
}

/// The keyless editor's move: change the record, recompute its (unkeyed) checksum, write it back
/// over the current copy.
fn edit_record(m: &CrashMedium, s: &Store, edit: impl FnOnce(&mut Record)) {
    let (mut rec, at) = current_record(m, s);
    edit(&mut rec);
    m.tamper(at, &rec.encode());
}

fn attach_err(m: &CrashMedium) -> StoreError {
    let (_m, s, _) = reopen(m.snapshot());
    match s.attach("p", Perm::Read, &key("k")) {
        Ok(_) => panic!("attach accepted an edited record"),
        Err(e) => e,
    }
}

/// Defect 1: setting the suite to the paper's unkeyed scheme or to the no-MAC benchmark suite,
/// with a recomputed checksum, used to be accepted at attach; pages written afterwards lost
/// their integrity. Now the record MAC refuses every suite change, on a product handle (which
/// does not even have the benchmark suites) and on the harness's, which registers them.
#[test]
fn downgrading_the_suite_with_a_recomputed_checksum_is_refused() {
    use pmo_bench_suites::{NOMAC, PAPER};
    let (m, s) = one_pmo(Suite::XtsBlake3);
    let clean = m.snapshot();
    let with_suites = OpenOptions {
        suites: pmo_bench_suites::suites(),
        ..OpenOptions::default()
    };
    for to in [PAPER, NOMAC, Suite::AesGcm, Suite::TeeBlake3] {
        m.tamper(0, &clean);
        edit_record(&m, &s, |r| r.keys.suite = to);
        assert!(
            matches!(attach_err(&m), StoreError::Corrupt { ref why, .. } if why == "record MAC"),
            "{to:?}"
        );
        let (s2, _) = Store::open_with(
            Arc::new(CrashMedium::from_image(m.snapshot())),
            &with_suites,
        )
        .unwrap();
        assert_eq!(s2.list()[0].suite, to);
        assert!(
            matches!(
                s2.attach("p", Perm::Read, &key("k")),
                Err(StoreError::Corrupt { ref why, .. }) if why == "record MAC"
            ),
            "{to:?} with the benchmark suites registered"
        );
    }
    // The genuine record still opens, and its pages still verify.
    m.tamper(0, &clean);
    let (m1, s1, _) = reopen(m.snapshot());
    assert_eq!(s1.list()[0].suite, Suite::XtsBlake3);
    let ext = s1.list()[0].extent.0;
    let mut b = [0u8; 1];
    m1.read(ext + 10, &mut b).unwrap();
    m1.tamper(ext + 10, &[b[0] ^ 1]);
    let r = s1.attach("p", Perm::Read, &key("k")).unwrap();
    let mut out = [0u8; PAGE];
    assert!(matches!(
        r.fault(0, &mut out),
        Err(StoreError::Integrity { page: 0 })
    ));
}

/// The CXL designs and `tee-blake3` store pages with no software cipher, for the expander's
/// range key to encrypt. On a medium that encrypts nothing (a store file) they would put
/// plaintext on disk: they are refused at create, at attach (also as a session's design
/// override of a PMO made otherwise), and a keyless edit that turns a PMO's suite or design
/// into one of them breaks the record MAC.
#[test]
fn pages_without_a_software_cipher_never_reach_a_medium_that_does_not_encrypt() {
    let (m, s) = one_pmo(Suite::XtsBlake3);
    let before = m.snapshot();
    for (design, suite) in [
        (Design::D, Suite::TeeBlake3),
        (Design::C, Suite::TeeBlake3),
        (Design::Cl, Suite::TeeBlake3),
        (Design::C, Suite::XtsBlake3),
        (Design::Cl, Suite::XtsBlake3),
        (Design::Cf, Suite::TeeBlake3),
    ] {
        let opts = CreateOptions {
            design,
            suite: Some(suite),
            kdf: None,
        };
        let e = s
            .create_pmo_with("q", NP * PAGE as u64, &key("k"), opts)
            .unwrap_err();
        assert!(
            matches!(e, StoreError::NeedsRangeEncryption { .. }),
            "{design:?} {suite:?}: {e}"
        );
        assert!(e.to_string().contains("encrypts its extent"), "{e}");
    }
    assert_eq!(s.list().len(), 1, "a refused create leaves nothing");
    for design in [Design::C, Design::Cl, Design::Cf] {
        let e = s
            .attach_with("p", Perm::Write, &key("k"), Some(design))
            .err()
            .unwrap();
        assert!(matches!(e, StoreError::NeedsRangeEncryption { .. }), "{e}");
    }
    // The refused attaches released the PMO and wrote nothing.
    drop(s.attach("p", Perm::Write, &key("k")).unwrap());
    let (_m, s2, _) = reopen(before.clone());
    assert!(s2.attach("p", Perm::Read, &key("k")).is_ok());
    for design in [Design::C, Design::Cl, Design::Cf] {
        m.tamper(0, &before);
        edit_record(&m, &s, |r| r.design = design);
        assert!(
            matches!(attach_err(&m), StoreError::Corrupt { ref why, .. } if why == "record MAC"),
            "{design:?}"
        );
    }
}

/// Defect 1, every other field: each edit of a field that decides how pages are encrypted or
/// checked, or which version is current, is an integrity error at attach (or a refused slot at
/// open), never a PMO used with changed parameters. Edits of the key-derivation inputs (salt,
/// Argon2id cost, key check) change the key itself: the right key then reads as a wrong key,
/// and nothing is attached.
#[test]
fn editing_any_bound_record_field_is_refused() {
    type Edit = fn(&mut Record);
    let corrupting: [(&str, Edit); 11] = [
        ("design", |r| r.design = Design::Wedi),
        ("npages", |r| r.npages -= 1),
        ("ext_len", |r| r.ext_len += 64 << 10),
        ("uid", |r| r.keys.uid ^= 1),
        ("paper_iv", |r| r.keys.paper_iv[0] ^= 1),
        ("epoch", |r| r.epoch -= 1),
        ("next_epoch", |r| r.next_epoch = 1),
        ("root", |r| r.root[5] ^= 1),
        ("commit", |r| r.commit += 1),
        ("pending_tags", |r| r.pending_tags = 1),
        ("rec_mac", |r| r.rec_mac[0] ^= 1),
    ];
    let rekeying: [(&str, Edit); 4] = [
        ("salt", |r| r.keys.salt[0] ^= 1),
        ("kdf m", |r| r.keys.kdf.m_kib *= 2),
        ("kdf t", |r| r.keys.kdf.t += 1),
        ("kcv", |r| r.kcv[0] ^= 1),
    ];
    let (m, s) = one_pmo(Suite::XtsBlake3);
    let clean = m.snapshot();
    for (what, edit) in corrupting {
        m.tamper(0, &clean);
        edit_record(&m, &s, edit);
        let (_m, s2, rep) = reopen(m.snapshot());
        match s2.attach("p", Perm::Read, &key("k")) {
            Err(StoreError::Corrupt { .. }) => {}
            Err(StoreError::Refused { .. }) => assert!(!rep.bad_slots.is_empty(), "{what}"),
            other => panic!("{what}: {:?}", other.map(|_| "attached")),
        }
    }
    for (what, edit) in rekeying {
        m.tamper(0, &clean);
        edit_record(&m, &s, edit);
        assert!(
            matches!(attach_err(&m), StoreError::WrongKey),
            "{what}: a changed key input must not open"
        );
    }
    // Renaming a record: the name is bound too.
    m.tamper(0, &clean);
    edit_record(&m, &s, |r| r.name = "q".into());
    let (_m, s2, _) = reopen(m.snapshot());
    assert!(matches!(
        s2.attach("q", Perm::Read, &key("k")),
        Err(StoreError::Corrupt { .. })
    ));
    // Untouched, it attaches: the edits above are what was refused.
    m.tamper(0, &clean);
    let (_m, s3, _) = reopen(m.snapshot());
    s3.attach("p", Perm::Read, &key("k")).unwrap();
}

/// KDF costs read from the medium are bounded before any memory is spent on them: a record
/// asking for a terabyte or a million passes is a refused PMO, not an attach that never ends.
#[test]
fn an_edited_kdf_cost_cannot_make_attach_run_away() {
    let (m, s) = one_pmo(Suite::XtsBlake3);
    edit_record(&m, &s, |r| {
        r.keys.kdf = KdfParams {
            m_kib: u32::MAX,
            t: u32::MAX,
            p: 1,
        }
    });
    let (_m, s2, rep) = reopen(m.snapshot());
    assert!(
        rep.bad_slots
            .iter()
            .any(|(_, why)| why.contains("key derivation")),
        "{rep:?}"
    );
    // Refused by name (not silently gone), before any key derivation is tried.
    assert!(matches!(
        s2.attach("p", Perm::Read, &key("k")),
        Err(StoreError::Refused { ref why, .. }) if why.contains("key derivation")
    ));
}

fn leaf_of(m: &CrashMedium, s: &Store, page: u64) -> (Leaf, Vec<u8>) {
    let info = &s.list()[0];
    let img = m.snapshot();
    let meta = (info.extent.0 + info.size) as usize;
    let l = meta + page as usize * LEAF;
    let ct = (info.extent.0 + page * PAGE as u64) as usize;
    (Leaf::decode(&img[l..l + LEAF]), img[ct..ct + PAGE].to_vec())
}

/// Defect 2: rolling the whole store file back rolls the epoch counter back with it. Before,
/// the next psync then sealed a new plaintext under a (key, page, version) that had already
/// sealed another one (for GCM, ct1 xor ct2 = pt1 xor pt2). Now each writing session has its
/// own generation, hence its own key: the version repeats, the key does not.
#[test]
fn a_rolled_back_store_never_seals_two_plaintexts_under_one_nonce() {
    for suite in [Suite::XtsBlake3, Suite::AesGcm] {
        let (m, s) = fresh(MEDIUM);
        s.create_pmo_with(
            "p",
            NP * PAGE as u64,
            &key("k"),
            CreateOptions {
                design: Design::D,
                suite: Some(suite),
                kdf: None,
            },
        )
        .unwrap();
        let before = m.snapshot();
        let a = [0x41u8; PAGE];
        let mut b = a;
        b[0] = 0x42; // one block differs; 255 blocks equal
        let seal = |m: &Arc<CrashMedium>, s: &Store, pt: &[u8; PAGE]| {
            let w = s.attach("p", Perm::Write, &key("k")).unwrap();
            w.psync([(0u64, pt)]).unwrap();
            w.detach().wait().unwrap();
            leaf_of(m, s, 0)
        };
        let (leaf_a, ct_a) = seal(&m, &s, &a);
        drop(s);
        // The attacker puts the whole old file back.
        let (m2, s2, _) = reopen(before);
        let (leaf_b, ct_b) = seal(&m2, &s2, &b);
        assert_eq!(
            leaf_a.version, leaf_b.version,
            "the epoch counter rolled back"
        );
        assert_ne!(leaf_a.gen, leaf_b.gen, "{suite:?}: same generation twice");
        let equal_blocks = ct_a
            .chunks(16)
            .zip(ct_b.chunks(16))
            .filter(|(x, y)| x == y)
            .count();
        assert_eq!(equal_blocks, 0, "{suite:?}: equal plaintext blocks show");
        let xor_ct: Vec<u8> = ct_a.iter().zip(&ct_b).map(|(x, y)| x ^ y).collect();
        let xor_pt: Vec<u8> = a.iter().zip(&b).map(|(x, y)| x ^ y).collect();
        assert_ne!(xor_ct, xor_pt, "{suite:?}: keystream reused");
    }
}

/// Defect 2, the arithmetic: counters read from the medium are checked, never wrapped. A record
/// sequence at its maximum (a keyless edit) and an epoch at its maximum (which only the key
/// holder could write) are refused with an error; nothing panics, nothing is written.
#[test]
fn counters_at_their_maximum_are_refused_not_wrapped() {
    // The record sequence is unkeyed: the editor can set it.
    let (m, s) = one_pmo(Suite::XtsBlake3);
    edit_record(&m, &s, |r| r.seq = u64::MAX);
    let (_m, s2, _) = reopen(m.snapshot());
    assert!(matches!(
        s2.attach("p", Perm::Write, &key("k")),
        Err(StoreError::CounterExhausted("record sequence"))
    ));
    // The epochs are keyed: forge them with the key to exercise the checks.
    for (epoch, next) in [(u64::MAX - 1, u64::MAX), (u64::MAX, u64::MAX)] {
        let (m, s) = one_pmo(Suite::AesGcm);
        let uuid = s.superblock().uuid;
        edit_record(&m, &s, |r| {
            let keys = PmoKeys::derive(&key("k"), r.keys, &Default::default()).unwrap();
            r.epoch = epoch;
            r.next_epoch = next;
            r.seal(&keys, &uuid, 0);
        });
        let (m2, s2, _) = reopen(m.snapshot());
        let w = s2.attach("p", Perm::Write, &key("k")).unwrap();
        let before = m2.snapshot();
        assert!(matches!(
            w.psync([(0u64, &page_of(9, 0))]),
            Err(StoreError::CounterExhausted("epoch"))
        ));
        let after = m2.snapshot();
        let ext = s2.list()[0].extent.0 as usize;
        assert_eq!(
            before[ext..ext + NP as usize * PAGE],
            after[ext..ext + NP as usize * PAGE],
            "nothing sealed"
        );
    }
}

fn anchored(dir: &std::path::Path) -> (Arc<CrashMedium>, Store, std::path::PathBuf) {
    let anchor = dir.join("anchor");
    let m = Arc::new(CrashMedium::new(MEDIUM));
    let s = Store::create(
        m.clone() as Arc<dyn Medium>,
        StoreOptions {
            slots: Some(16),
            anchor: Some(anchor.clone()),
            kdf: KdfParams::INSECURE_FAST,
            len: None,
            suites: Default::default(),
        },
    )
    .unwrap();
    s.create_pmo("p", NP * PAGE as u64, &key("k")).unwrap();
    (m, s, anchor)
}

fn open_anchored(img: Vec<u8>, anchor: &std::path::Path) -> Result<Store, StoreError> {
    let m = Arc::new(CrashMedium::from_image(img));
    Store::open_with(
        m as Arc<dyn Medium>,
        &OpenOptions {
            anchor: Some(anchor.to_owned()),
            kdf: KdfParams::INSECURE_FAST,
            len: None,
            suites: Default::default(),
        },
    )
    .map(|(s, _)| s)
}

fn psync_one(s: &Store, tag: u8) {
    let w = s.attach("p", Perm::Write, &key("k")).unwrap();
    w.psync([(0u64, &page_of(tag, 0))]).unwrap();
    w.detach().wait().unwrap();
}

fn read_page0(s: &Store) -> [u8; PAGE] {
    let r = s.attach("p", Perm::Read, &key("k")).unwrap();
    let mut out = [0u8; PAGE];
    r.fault(0, &mut out).unwrap();
    out
}

/// Defect 6: a store file rolled back as a whole verifies everywhere (it was genuine once).
/// With an anchor, open refuses it with one line naming both counters; without one it is
/// accepted (the documented limit), as is a store rolled back together with its anchor.
#[test]
fn rolling_back_the_whole_store_file_is_refused_by_its_anchor() {
    let dir = std::env::temp_dir().join(format!("pmo-attack-anchor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (m, s, anchor) = anchored(&dir);
    psync_one(&s, 1);
    let old = m.snapshot();
    let old_anchor = std::fs::read(&anchor).unwrap();
    psync_one(&s, 2);
    let new = m.snapshot();
    drop(s);
    // Current store, current anchor: fine.
    let s = open_anchored(new.clone(), &anchor).unwrap();
    assert_eq!(read_page0(&s), page_of(2, 0));
    drop(s);
    // The old file under the current anchor: refused, naming both counters.
    let e = match open_anchored(old.clone(), &anchor) {
        Err(StoreError::Anchor(e @ AnchorError::RolledBack { .. })) => e,
        other => panic!("accepted a rolled-back store: {:?}", other.map(|_| ())),
    };
    let line = e.to_string();
    assert!(
        line.starts_with("store is older than its anchor: slot 0 is at commit 2, the anchor at 3"),
        "{line}"
    );
    assert!(line.contains("store counter 2, anchor counter 3"), "{line}");
    // Splicing: the old file with its record's commit number raised to the anchor's passes
    // open, but the raised number is under the record MAC: attach refuses it.
    let mc = CrashMedium::from_image(old.clone());
    let (_m0, s0, _) = reopen(old.clone());
    edit_record(&mc, &s0, |r| r.commit = 3);
    let s_spliced = open_anchored(mc.snapshot(), &anchor).unwrap();
    assert!(matches!(
        s_spliced.attach("p", Perm::Read, &key("k")),
        Err(StoreError::Corrupt { .. })
    ));
    // Without an anchor the old file is accepted: the medium alone cannot tell.
    let (_m1, s1, _) = reopen(old.clone());
    assert_eq!(read_page0(&s1), page_of(1, 0));
    // Both rolled back together: accepted too (documented in docs/threat-model.md).
    std::fs::write(&anchor, &old_anchor).unwrap();
    let s2 = open_anchored(old, &anchor).unwrap();
    assert_eq!(read_page0(&s2), page_of(1, 0));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The anchor also catches one PMO rolled back (record, tree and pages) inside a current store,
/// and a destroyed PMO brought back.
#[test]
fn rolling_back_one_pmo_or_undoing_a_destroy_is_refused_by_the_anchor() {
    let dir = std::env::temp_dir().join(format!("pmo-attack-anchor1-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (m, s, anchor) = anchored(&dir);
    s.create_pmo("other", NP * PAGE as u64, &key("k")).unwrap();
    psync_one(&s, 1);
    let old = m.snapshot();
    psync_one(&s, 2);
    let info = s.list().into_iter().find(|i| i.name == "p").unwrap();
    let now = m.snapshot();
    // Put back p's slot and extent only.
    let mut img = now.clone();
    let slot = s.superblock().record_off(info.slot, 0) as usize;
    let (e0, e1) = (
        info.extent.0 as usize,
        (info.extent.0 + info.extent.1) as usize,
    );
    img[slot..slot + SLOT_SIZE as usize].copy_from_slice(&old[slot..slot + SLOT_SIZE as usize]);
    img[e0..e1].copy_from_slice(&old[e0..e1]);
    assert!(matches!(
        open_anchored(img, &anchor),
        Err(StoreError::Anchor(AnchorError::RolledBack { .. }))
    ));
    // Destroy "other", then bring its slot back.
    s.destroy_pmo("other", &key("k")).unwrap();
    let o = s.superblock().record_off(1, 0) as usize;
    let mut img = m.snapshot();
    img[o..o + SLOT_SIZE as usize].copy_from_slice(&now[o..o + SLOT_SIZE as usize]);
    assert!(matches!(
        open_anchored(img, &anchor),
        Err(StoreError::Anchor(AnchorError::RolledBack { .. }))
    ));
    open_anchored(m.snapshot(), &anchor).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
