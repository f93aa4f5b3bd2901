use super::*;
use pmo_crypto::{KdfParams, KeyParams, PageId, PmoKeys, UserKey, PAGE, TAG_LEN};

fn keys_with(suite: Suite, user: &[u8]) -> PmoKeys {
    let p = KeyParams::generate(suite, KdfParams::INSECURE_FAST).unwrap();
    PmoKeys::derive(&UserKey::new(user).unwrap(), p, &suites()).unwrap()
}

fn keys(suite: Suite) -> PmoKeys {
    keys_with(suite, b"correct horse")
}

fn id(k: &PmoKeys, page: u32, version: u64, gen: u8) -> PageId {
    PageId {
        uid: k.params().uid,
        page,
        version,
        gen: [gen; 16],
    }
}

#[test]
fn codes_names_and_markers() {
    let s = suites();
    assert_eq!(s.named("paper"), Some(PAPER));
    assert_eq!(s.named("xts-nomac-bench"), Some(NOMAC));
    assert_eq!((PAPER.code(), NOMAC.code()), (2, 4));
    assert_eq!(s.name_of(NOMAC), Some("xts-nomac-bench"));
    // The product-binary test (vmm/tests/product_binaries.rs) keeps a copy of these.
    assert_eq!(
        MARKERS,
        [
            "pmo_bench_suites",
            "pmo-bench-suites: paper xts",
            "pmo-bench-suites: nomac generation",
            "xts-nomac-bench"
        ]
    );
    assert_eq!(module_path!().split("::").next(), Some(MARKERS[0]));
}

#[test]
fn both_suites_round_trip() {
    for s in [PAPER, NOMAC] {
        let k = keys(s);
        let id = id(&k, 3, 9, 1);
        let mut page = [0x5au8; PAGE];
        let tag = k.seal_page(id, &mut page).unwrap();
        assert_ne!(page, [0x5au8; PAGE], "{s:?} encrypts");
        k.open_page(id, &mut page, &tag).unwrap();
        assert_eq!(page, [0x5au8; PAGE]);
    }
}

/// The authors' weakness 1: one tweak per PMO shows equal plaintext blocks across pages and
/// versions. Ours does not.
#[test]
fn equal_plaintexts_give_equal_ciphertexts_in_the_paper_suite_only() {
    let paper = keys(PAPER);
    let ids = |k: &PmoKeys| [id(k, 0, 1, 1), id(k, 1, 1, 1), id(k, 0, 2, 2)];
    let enc = |k: &PmoKeys, id| {
        let mut p = [0x42u8; PAGE];
        k.seal_page(id, &mut p).unwrap();
        p
    };
    let pc: Vec<_> = ids(&paper).into_iter().map(|id| enc(&paper, id)).collect();
    assert_eq!(
        pc[0], pc[1],
        "paper suite: same plaintext on two pages leaks"
    );
    assert_eq!(
        pc[0], pc[2],
        "paper suite: same plaintext in two versions (and sessions) leaks"
    );
    for ours in [keys(Suite::XtsBlake3), keys(Suite::AesGcm)] {
        let oc: Vec<_> = ids(&ours).into_iter().map(|id| enc(&ours, id)).collect();
        assert_ne!(oc[0], oc[1]);
        assert_ne!(oc[0], oc[2]);
    }
}

/// The authors' weakness 2: an attacker who modifies a page can recompute an unkeyed hash.
#[test]
fn recomputed_unkeyed_hash_passes_paper_but_not_our_mac() {
    let paper = keys(PAPER);
    let ours = keys(Suite::XtsBlake3);
    for (k, must_pass) in [(&paper, true), (&ours, false)] {
        let id = id(k, 0, 1, 1);
        let mut p = [7u8; PAGE];
        k.seal_page(id, &mut p).unwrap();
        p[0] ^= 0xff; // attacker edit
        let mut forged = [0u8; TAG_LEN]; // attacker recomputes the only hash it can
        forged.copy_from_slice(&paper_checksum(&p)[..TAG_LEN]);
        assert_eq!(k.open_page(id, &mut p, &forged).is_ok(), must_pass);
    }
}

#[test]
fn nomac_bench_suite_encrypts_but_does_not_detect_tampering() {
    let k = keys(NOMAC);
    let id = id(&k, 1, 2, 3);
    let mut page = [0x33u8; PAGE];
    let tag = k.seal_page(id, &mut page).unwrap();
    assert_eq!(tag, [0u8; TAG_LEN]);
    assert_ne!(page, [0x33u8; PAGE], "still encrypted");
    // Another generation seals under another key (as `xts-blake3`).
    let mut again = [0x33u8; PAGE];
    k.seal_page(PageId { gen: [4; 16], ..id }, &mut again)
        .unwrap();
    assert_ne!(again, page);
    page[100] ^= 1;
    // Benchmark-only: the flipped bit is not detected, the page decrypts to other bytes.
    k.open_page(id, &mut page, &tag).unwrap();
    assert_ne!(page, [0x33u8; PAGE]);
}

/// Through the store: a handle given the suites creates and opens such PMOs; a product
/// handle (no suites registered) cannot create one, lists one, and refuses to attach it.
#[test]
fn only_a_store_handle_given_the_suites_uses_them() {
    use pmo_media::CrashMedium;
    use pmo_store::{CreateOptions, Design, OpenOptions, Perm, Store, StoreError, StoreOptions};

    let m = Arc::new(CrashMedium::new(16 << 20));
    let bench = StoreOptions {
        kdf: KdfParams::INSECURE_FAST,
        suites: suites(),
        ..StoreOptions::default()
    };
    let s = Store::create(m.clone(), bench).unwrap();
    let key = UserKey::new(b"bench").unwrap();
    for (name, suite) in [("p", PAPER), ("n", NOMAC)] {
        let opts = CreateOptions {
            design: Design::SpId,
            suite: Some(suite),
            kdf: None,
        };
        s.create_pmo_with(name, 2 * PAGE as u64, &key, opts)
            .unwrap();
        let w = s.attach(name, Perm::Write, &key).unwrap();
        w.psync([(1u64, &[0x77u8; PAGE])]).unwrap();
        w.detach().wait().unwrap();
    }
    drop(s);

    let (product, _) = Store::open(m.clone()).unwrap();
    let listed: Vec<_> = product.list().iter().map(|i| i.suite).collect();
    assert_eq!(listed, [NOMAC, PAPER]);
    for name in ["p", "n"] {
        assert!(matches!(
            product.attach(name, Perm::Read, &key),
            Err(StoreError::Crypto(
                pmo_crypto::CryptoError::SuiteUnavailable(_)
            ))
        ));
    }
    let opts = CreateOptions {
        design: Design::SpId,
        suite: Some(NOMAC),
        kdf: None,
    };
    assert!(matches!(
        product.create_pmo_with("x", PAGE as u64, &key, opts),
        Err(StoreError::Crypto(
            pmo_crypto::CryptoError::SuiteUnavailable(4)
        ))
    ));
    assert!(product.list().iter().all(|i| i.name != "x"));
    drop(product);

    let open = OpenOptions {
        suites: suites(),
        ..OpenOptions::default()
    };
    let (again, _) = Store::open_with(m, &open).unwrap();
    let r = again.attach("p", Perm::Read, &key).unwrap();
    let mut out = [0u8; PAGE];
    r.fault(1, &mut out).unwrap();
    assert_eq!(out, [0x77u8; PAGE]);
    r.detach().wait().unwrap();
}
