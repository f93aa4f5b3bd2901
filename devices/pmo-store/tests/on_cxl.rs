//! A PMO store on the CXL expander's media (the medium of PMO designs C / CL
//! / CF) with every PMO's extent under its own TEE range key from the PMO
//! service's keyring: the media file never holds the PMOs' bytes in the
//! clear, the keys are derived again at reopen, and another master key reads
//! nothing (the store's page MACs reject what it gets).
//!
//! These tests live with the store, not the expander: `cxl-t3` does not
//! depend on the store; the store is tested here on one more real medium.

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cxl_t3::cache::BLOCK;
use cxl_t3::expander::{CxlMedium, Expander, ExpanderConfig};
use pmo_crypto::{ExtentKeyring, UserKey, PAGE};
use pmo_media::Medium;
use pmo_store::{Perm, Store, StoreError, StoreOptions};

const SIZE: u64 = 32 << 20;

fn tmp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("cxl-pmo-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn open(path: &Path) -> Arc<Expander> {
    let mut cfg = ExpanderConfig::new(path, SIZE);
    cfg.cache_bytes = 1 << 20;
    cfg.media_latency_ns = 0;
    Expander::open(&cfg).unwrap()
}

/// An expander of `size` bytes with a cache of `cache_blocks` blocks in `ways` ways.
fn config(media: PathBuf, size: u64, cache_blocks: u64, ways: usize) -> ExpanderConfig {
    ExpanderConfig {
        media,
        size,
        cache_bytes: cache_blocks * BLOCK,
        ways,
        media_latency_ns: 0,
    }
}

const KEY256: [u8; 64] = [0x3c; 64];

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

fn page_with(marker: &[u8]) -> [u8; PAGE] {
    let mut p = [0u8; PAGE];
    for chunk in p.chunks_mut(marker.len()) {
        chunk.copy_from_slice(&marker[..chunk.len()]);
    }
    p
}

#[test]
fn each_pmo_extent_has_its_own_range_key_and_the_media_holds_no_plaintext() {
    let path = tmp("keyring");
    let marker = b"CXL-PMO-MARKER-0123456789abcdef!";
    let page = page_with(marker);
    let k = UserKey::new(b"tenant key").unwrap();
    let master = [0x42u8; 32];
    {
        let x = open(&path);
        let m = CxlMedium::new(x.clone()).with_keyring(ExtentKeyring::new(&master).unwrap());
        let s = Store::create(
            m,
            StoreOptions {
                slots: Some(16),
                kdf: pmo_crypto::KdfParams::INSECURE_FAST,
                ..Default::default()
            },
        )
        .unwrap();
        s.create_pmo("a", 8 * PAGE as u64, &k).unwrap();
        s.create_pmo("b", 8 * PAGE as u64, &k).unwrap();
        let ranges: Vec<(u64, u64)> = (0..16u16).filter_map(|id| x.range_key(id)).collect();
        assert_eq!(ranges.len(), 2, "one range per PMO");
        let extents: Vec<(u64, u64)> = s
            .list()
            .iter()
            .map(|p| (p.extent.0, p.extent.0 + p.extent.1))
            .collect();
        for r in &ranges {
            assert!(
                extents.contains(r),
                "range {r:?} is a PMO extent ({extents:?})"
            );
        }
        for name in ["a", "b"] {
            let w = s.attach(name, Perm::Write, &k).unwrap();
            w.psync([(1, &page), (6, &page)]).unwrap();
            w.detach().wait().unwrap();
        }
        drop(s);
        x.shutdown().unwrap();
    }
    let media = std::fs::read(&path).unwrap();
    assert_eq!(count(&media, marker), 0, "plaintext reached the media");
    // Control: the scan finds the marker where it is plainly written.
    assert!(count(&page, marker) > 100);

    // Same master: the store reopens, re-keys both extents, and reads back.
    {
        let x = open(&path);
        let m = CxlMedium::new(x.clone()).with_keyring(ExtentKeyring::new(&master).unwrap());
        let (s, _) = Store::open(m).unwrap();
        assert_eq!((0..16u16).filter_map(|id| x.range_key(id)).count(), 2);
        for name in ["a", "b"] {
            let r = s.attach(name, Perm::Read, &k).unwrap();
            let mut out = [0u8; PAGE];
            r.fault(6, &mut out).unwrap();
            assert_eq!(out, page, "{name}");
        }
        s.destroy_pmo("b", &k).unwrap();
        assert_eq!((0..16u16).filter_map(|id| x.range_key(id)).count(), 1);
        drop(s);
        x.shutdown().unwrap();
    }
    // Another master key: the store's table is readable, the PMO is not.
    {
        let x = open(&path);
        let m = CxlMedium::new(x.clone()).with_keyring(ExtentKeyring::new(&[0x43u8; 32]).unwrap());
        let (s, _) = Store::open(m).unwrap();
        let got = s.attach("a", Perm::Read, &k).and_then(|r| {
            let mut out = [0u8; PAGE];
            r.fault(6, &mut out).map(|()| out)
        });
        match got {
            Err(
                StoreError::WrongKey | StoreError::Integrity { .. } | StoreError::Corrupt { .. },
            ) => {}
            Err(e) => panic!("unexpected error {e}"),
            Ok(out) => assert_ne!(out, page, "another master read the PMO"),
        }
        drop(s);
        x.shutdown().unwrap();
    }
    let _ = std::fs::remove_file(&path);
}

/// Writes `bytes` at `off` of the media file, as a keyless editor does between or during runs
/// (the expander's `flock` is advisory; the editor ignores it).
fn edit_media(path: &Path, off: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, off).unwrap();
    f.sync_all().unwrap();
}

fn read_media(path: &Path, off: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).unwrap();
    let mut v = vec![0u8; len];
    f.read_exact_at(&mut v, off).unwrap();
    v
}

/// Media header before DPA 0 (docs/cxl-media.md).
const MEDIA_HEADER: u64 = 4096;

fn design_c_store(x: &Arc<Expander>, master: &[u8]) -> Store {
    let m = CxlMedium::new(x.clone()).with_keyring(ExtentKeyring::new(master).unwrap());
    Store::create(
        m,
        StoreOptions {
            slots: Some(16),
            kdf: pmo_crypto::KdfParams::INSECURE_FAST,
            ..Default::default()
        },
    )
    .unwrap()
}

/// LPMO's design C on the expander: no software cipher (`tee-blake3`), the range key is the
/// only encryption and the CPU checks each page's keyed tag. The media never holds its
/// plaintext; a keyless editor who flips a byte of a page on the media, or puts back an older
/// copy of it, has the next attach refused (the whole PMO is checked there, naming the page);
/// a session of design `cl` on the same PMO attaches and refuses exactly that page at its
/// fault; and media edited while a `c` session runs is refused at the fault that reads it.
#[test]
fn design_c_keeps_plaintext_off_the_media_and_refuses_tampering_at_attach() {
    use pmo_crypto::Suite;
    use pmo_store::{CreateOptions, Design};
    let path = tmp("design-c");
    let marker = b"DESIGN-C-MARKER-0123456789abcdef";
    let (v1, v2) = (
        page_with(marker),
        page_with(b"second version of the page, v2.."),
    );
    let k = UserKey::new(b"tenant key").unwrap();
    let master = [0x42u8; 32];
    let np = 8u64;
    let (ext, old_page3) = {
        let x = open(&path);
        let s = design_c_store(&x, &master);
        let opts = CreateOptions {
            design: Design::C,
            suite: None,
            kdf: None,
        };
        s.create_pmo_with("c", np * PAGE as u64, &k, opts).unwrap();
        let info = s.list().remove(0);
        assert_eq!((info.design, info.suite), (Design::C, Suite::TeeBlake3));
        let w = s.attach("c", Perm::Write, &k).unwrap();
        assert_eq!(w.design(), Design::C);
        w.psync((0..np).map(|p| (p, &v1))).unwrap();
        w.detach().wait().unwrap();
        x.flush().unwrap();
        let old = read_media(&path, MEDIA_HEADER + info.extent.0 + 3 * PAGE as u64, PAGE);
        let w = s.attach("c", Perm::Write, &k).unwrap();
        w.psync([(3, &v2)]).unwrap();
        w.detach().wait().unwrap();
        drop(s);
        x.shutdown().unwrap();
        (info.extent.0, old)
    };
    let media = std::fs::read(&path).unwrap();
    assert_eq!(
        count(&media, marker),
        0,
        "plaintext of a design-c PMO on the media"
    );
    let page_at = |p: u64| MEDIA_HEADER + ext + p * PAGE as u64;
    let genuine3 = read_media(&path, page_at(3), PAGE);
    assert_ne!(
        genuine3, old_page3,
        "the range key changed the bytes of page 3"
    );

    let reopen = || {
        let x = open(&path);
        let m = CxlMedium::new(x.clone()).with_keyring(ExtentKeyring::new(&master).unwrap());
        let (s, _) = Store::open(m).unwrap();
        (x, s)
    };
    // Untouched: reads back.
    {
        let (x, s) = reopen();
        let r = s.attach("c", Perm::Read, &k).unwrap();
        let mut out = [0u8; PAGE];
        r.fault(3, &mut out).unwrap();
        assert_eq!(out, v2);
        r.fault(5, &mut out).unwrap();
        assert_eq!(out, v1);
        drop(r);
        drop(s);
        x.shutdown().unwrap();
    }
    // A flipped byte, then an older copy of the page: the attach is refused, naming page 3.
    let mut flipped = genuine3.clone();
    flipped[77] ^= 0x10;
    for (what, bytes) in [("flipped byte", &flipped), ("rolled back page", &old_page3)] {
        edit_media(&path, page_at(3), bytes);
        let (x, s) = reopen();
        match s.attach("c", Perm::Read, &k) {
            Err(StoreError::Integrity { page: 3 }) => {}
            Err(e) => panic!("{what}: unexpected error {e}"),
            Ok(_) => panic!("{what}: design c attached a tampered PMO"),
        }
        // Design cl checks at each fault instead: the other pages serve, page 3 is refused.
        let r = s
            .attach_with("c", Perm::Read, &k, Some(Design::Cl))
            .unwrap();
        let mut out = [0u8; PAGE];
        r.fault(5, &mut out).unwrap();
        assert_eq!(out, v1);
        assert!(matches!(
            r.fault(3, &mut out),
            Err(StoreError::Integrity { page: 3 })
        ));
        assert_eq!(out, [0u8; PAGE], "{what}: a refused page leaves no bytes");
        drop(r);
        drop(s);
        x.shutdown().unwrap();
    }
    edit_media(&path, page_at(3), &genuine3);
    // Edited during a `c` session: the attach-time check passed, the fault that reads the
    // edited page from the media refuses it. The device cache holds the page after the check,
    // so evict it first by reading more than the cache through the expander.
    {
        let (x, s) = reopen();
        let r = s.attach("c", Perm::Read, &k).unwrap();
        edit_media(&path, page_at(6), &flipped);
        let mut buf = vec![0u8; 2 << 20];
        x.read(SIZE - buf.len() as u64, &mut buf).unwrap();
        let mut out = [0u8; PAGE];
        r.fault(5, &mut out).unwrap();
        assert_eq!(out, v1);
        assert!(matches!(
            r.fault(6, &mut out),
            Err(StoreError::Integrity { page: 6 })
        ));
        drop(r);
        drop(s);
        x.shutdown().unwrap();
    }
    let _ = std::fs::remove_file(&path);
}

/// The CXL designs need the extent under a range key: an expander medium without the keyring
/// encrypts nothing, and the store refuses them there as it does on a file.
#[test]
fn cxl_designs_are_refused_on_an_unkeyed_expander() {
    use pmo_store::{CreateOptions, Design};
    let path = tmp("unkeyed");
    let x = open(&path);
    let s = Store::create(
        CxlMedium::new(x.clone()),
        StoreOptions {
            slots: Some(16),
            kdf: pmo_crypto::KdfParams::INSECURE_FAST,
            ..Default::default()
        },
    )
    .unwrap();
    let k = UserKey::new(b"tenant key").unwrap();
    for design in [Design::C, Design::Cl, Design::Cf] {
        let opts = CreateOptions {
            design,
            suite: None,
            kdf: None,
        };
        assert!(matches!(
            s.create_pmo_with("c", 4 * PAGE as u64, &k, opts),
            Err(StoreError::NeedsRangeEncryption { .. })
        ));
    }
    s.create_pmo("d", 4 * PAGE as u64, &k).unwrap();
    assert!(matches!(
        s.attach_with("d", Perm::Read, &k, Some(Design::C)),
        Err(StoreError::NeedsRangeEncryption { .. })
    ));
    drop(s);
    x.shutdown().unwrap();
    let _ = std::fs::remove_file(&path);
}

#[test]
fn pmo_store_on_a_keyed_cxl_medium() {
    let name = "cxl-name-marker-7c1d";
    for keyed in [false, true] {
        let path = tmp(&format!("store{keyed}"));
        let size = 16 << 20;
        let x = Expander::open(&config(path.clone(), size, 64, 8)).unwrap();
        if keyed {
            x.set_range_key(1, 0, size, &KEY256).unwrap();
        }
        let m: Arc<dyn Medium> = Arc::new(CxlMedium::new(x.clone()));
        let s = Store::create(
            m,
            StoreOptions {
                slots: Some(16),
                kdf: pmo_crypto::KdfParams::INSECURE_FAST,
                ..Default::default()
            },
        )
        .unwrap();
        let k = UserKey::new(b"user key").unwrap();
        s.create_pmo(name, 8 * PAGE as u64, &k).unwrap();
        let sess = s.attach(name, Perm::Write, &k).unwrap();
        let mut page = [0u8; PAGE];
        page[..12].copy_from_slice(b"page payload");
        sess.psync([(3, &page)]).unwrap();
        sess.detach().wait().unwrap();
        drop(s);
        x.flush().unwrap();
        let raw = std::fs::read(&path).unwrap();
        let found = count(&raw, name.as_bytes());
        if keyed {
            assert_eq!(found, 0, "the PMO name reached keyed media in plaintext");
        } else {
            assert!(found > 0, "control: unkeyed media holds the name");
        }
        x.shutdown().unwrap();
        drop(x);
        // Reopen the device and the store; the PMO reads back.
        let x = Expander::open(&config(path.clone(), size, 64, 8)).unwrap();
        if keyed {
            x.set_range_key(1, 0, size, &KEY256).unwrap();
        }
        let m: Arc<dyn Medium> = Arc::new(CxlMedium::new(x.clone()));
        let (s, _) = Store::open(m).unwrap();
        let r = s.attach(name, Perm::Read, &k).unwrap();
        let mut out = [0u8; PAGE];
        r.fault(3, &mut out).unwrap();
        assert_eq!(out, page);
        drop(r);
        drop(s);
        x.shutdown().unwrap();
        drop(x);
        let _ = std::fs::remove_file(&path);
    }
}

#[test]
fn store_extents_are_keyed_through_the_provider() {
    use cxl_t3::expander::ExtentKeySource;
    use zeroize::Zeroizing;
    let keys_with = |salt: u8| -> Arc<ExtentKeySource> {
        Arc::new(move |e| Some(Zeroizing::new(vec![e.slot as u8 ^ salt; 64])))
    };
    let keyed = |x: &Expander| (0..16u16).filter_map(|id| x.range_key(id)).count();
    let path = tmp("extents");
    let size = 16 << 20;
    let x = Expander::open(&config(path.clone(), size, 64, 8)).unwrap();
    let m = CxlMedium::new(x.clone()).with_extent_keys(keys_with(0x5c));
    let s = Store::create(
        m,
        StoreOptions {
            slots: Some(16),
            kdf: pmo_crypto::KdfParams::INSECURE_FAST,
            ..Default::default()
        },
    )
    .unwrap();
    let k = UserKey::new(b"user key").unwrap();
    s.create_pmo("a", 8 * PAGE as u64, &k).unwrap();
    s.create_pmo("b", 8 * PAGE as u64, &k).unwrap();
    assert_eq!(keyed(&x), 2);
    let sess = s.attach("a", Perm::Write, &k).unwrap();
    let mut page = [0u8; PAGE];
    page[..7].copy_from_slice(b"payload");
    sess.psync([(2, &page)]).unwrap();
    sess.detach().wait().unwrap();
    s.destroy_pmo("b", &k).unwrap();
    assert_eq!(keyed(&x), 1, "a destroyed PMO's key is cleared");
    drop(s);
    x.shutdown().unwrap();
    drop(x);
    // Reopen: the store announces the live extent again and it is re-keyed.
    for (salt, good) in [(0x5c, true), (0x33, false)] {
        let x = Expander::open(&config(path.clone(), size, 64, 8)).unwrap();
        assert_eq!(keyed(&x), 0);
        let m = CxlMedium::new(x.clone()).with_extent_keys(keys_with(salt));
        let got = Store::open(m).ok().and_then(|(s, _)| {
            let r = s.attach("a", Perm::Read, &k).ok()?;
            let mut out = [0u8; PAGE];
            r.fault(2, &mut out).ok()?;
            Some(out)
        });
        if good {
            assert_eq!(got, Some(page));
            assert_eq!(keyed(&x), 1);
        } else {
            assert_ne!(got, Some(page), "another extent key must not read the PMO");
        }
        drop(x);
    }
    let _ = std::fs::remove_file(&path);
}

/// Issue 27 part 2: a PMO created after a destroy gets the destroyed PMO's slot and, first
/// fit, its extent. Its range key must not be the old one: with an old copy of the media and
/// a tenant choosing what the new PMO holds, equal XTS blocks at equal DPAs would test the old
/// tenant's data one 16-byte block at a time. Design `c` (`tee-blake3`) stores pages with no
/// software cipher, so the range key is all that stands between them: the same plaintext
/// written into the same extent through the new PMO must share no 16-byte block with the old
/// media copy.
#[test]
fn a_pmo_in_a_destroyed_pmos_extent_never_reuses_its_range_key() {
    use pmo_store::{CreateOptions, Design};
    let path = tmp("reuse");
    let np = 8u64;
    let page = page_with(b"the old tenant's secret block 16");
    let opts = CreateOptions {
        design: Design::C,
        suite: None,
        kdf: None,
    };
    let x = open(&path);
    let s = design_c_store(&x, &[0x42u8; 32]);
    let extent_of = |s: &Store| {
        let info = s.list().remove(0);
        (info.slot, info.extent)
    };
    let write_all = |s: &Store, name: &str, k: &UserKey| {
        let w = s.attach(name, Perm::Write, k).unwrap();
        w.psync((0..np).map(|p| (p, &page))).unwrap();
        w.detach().wait().unwrap();
        x.flush().unwrap();
    };
    let old_key = UserKey::new(b"old tenant").unwrap();
    s.create_pmo_with("old", np * PAGE as u64, &old_key, opts)
        .unwrap();
    let (slot, extent) = extent_of(&s);
    write_all(&s, "old", &old_key);
    let primaries = |at: u64| read_media(&path, MEDIA_HEADER + at, (np * PAGE as u64) as usize);
    let old_copy = primaries(extent.0);
    assert_eq!(
        count(&old_copy, b"the old tenant's"),
        0,
        "range key applied"
    );
    s.destroy_pmo("old", &old_key).unwrap();

    // The next tenant gets the same slot and extent, and writes the same plaintext.
    let new_key = UserKey::new(b"new tenant").unwrap();
    s.create_pmo_with("new", np * PAGE as u64, &new_key, opts)
        .unwrap();
    assert_eq!(extent_of(&s), (slot, extent), "same slot, same extent");
    write_all(&s, "new", &new_key);
    let new_copy = primaries(extent.0);
    let old_blocks: std::collections::HashSet<&[u8]> = old_copy.chunks(16).collect();
    let repeated = new_copy
        .chunks(16)
        .filter(|b| old_blocks.contains(b))
        .count();
    assert_eq!(
        repeated,
        0,
        "{repeated} of {} media blocks repeat the destroyed PMO's",
        new_copy.len() / 16
    );
    drop(s);
    x.shutdown().unwrap();
    let _ = std::fs::remove_file(&path);
}
