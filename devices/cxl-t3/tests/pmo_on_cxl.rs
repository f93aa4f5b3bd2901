//! A PMO store on the expander (the medium of PMO designs C / CL / CF) with
//! every PMO's extent under its own TEE range key from the PMO service's
//! keyring: the media file never holds the PMOs' bytes in the clear, the
//! keys are derived again at reopen, and another master key reads nothing
//! (the store's page MACs reject what it gets).

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cxl_t3::expander::{CxlMedium, Expander, ExpanderConfig};
use pmo_store::crypto::{ExtentKeyring, UserKey, PAGE};
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
            Arc::new(m),
            StoreOptions {
                slots: Some(16),
                kdf: pmo_store::crypto::KdfParams::INSECURE_FAST,
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
        let (s, _) = Store::open(Arc::new(m)).unwrap();
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
        let (s, _) = Store::open(Arc::new(m)).unwrap();
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
