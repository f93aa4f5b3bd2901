//! The superblock's fields carry only an unkeyed checksum: a keyless editor rewrites them and
//! recomputes it (docs/threat-model.md, issue 27 part 3). Each test is named after the edit.

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use pmo_crypto::{KdfParams, PAGE};
use pmo_media::{CrashMedium, Medium};
use pmo_store::superblock::{Superblock, SB_SIZE};
use pmo_store::{AnchorError, OpenOptions, Perm, Store, StoreError, StoreOptions, SuperblockError};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A scratch directory for one test's anchor, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("pmo-sb-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn anchor(&self) -> PathBuf {
        self.0.join("anchor")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A store over the first `len` bytes of a `MEDIUM`-byte medium (all of it for `None`),
/// with PMO "p" psynced once.
fn store(len: Option<u64>, anchor: Option<&Path>) -> (Arc<CrashMedium>, Store) {
    let m = Arc::new(CrashMedium::new(MEDIUM));
    let s = Store::create(
        m.clone() as Arc<dyn Medium>,
        StoreOptions {
            len,
            anchor: anchor.map(Path::to_owned),
            ..fast_options(16)
        },
    )
    .unwrap();
    s.create_pmo("p", 4 * PAGE as u64, &key("k")).unwrap();
    let w = s.attach("p", Perm::Write, &key("k")).unwrap();
    w.psync([(0u64, &page_of(1, 0))]).unwrap();
    w.detach().wait().unwrap();
    (m, s)
}

/// The editor's move: both superblock copies with a new store length and a recomputed
/// checksum.
fn with_store_len(img: &[u8], len: u64) -> Vec<u8> {
    edited(img, |sb| sb.medium_len = len)
}

/// Both superblock copies edited, checksum recomputed.
fn edited(img: &[u8], edit: impl FnOnce(&mut Superblock)) -> Vec<u8> {
    let mut img = img.to_vec();
    let mut sb = Superblock::decode(&img[..128]).unwrap();
    edit(&mut sb);
    let b = sb.encode();
    for copy in 0..2 {
        let at = (copy * SB_SIZE) as usize;
        img[at..at + b.len()].copy_from_slice(&b);
    }
    img
}

/// Opens the edited image, with the store length the opener knows if any; on refusal,
/// checks that nothing was written.
fn open_len(img: Vec<u8>, anchor: Option<&Path>, len: Option<u64>) -> Result<Store, StoreError> {
    let m = Arc::new(CrashMedium::from_image(img.clone()));
    let r = Store::open_with(
        m.clone() as Arc<dyn Medium>,
        &OpenOptions {
            anchor: anchor.map(Path::to_owned),
            kdf: KdfParams::INSECURE_FAST,
            len,
            ..Default::default()
        },
    );
    if r.is_err() {
        assert!(m.snapshot() == img, "a refused open wrote to the medium");
    }
    r.map(|(s, _)| s)
}

fn open(img: Vec<u8>, anchor: Option<&Path>) -> Result<Store, StoreError> {
    open_len(img, anchor, None)
}

/// The store length edited below a PMO's extent: before, open took it and the PMO vanished
/// as a bad slot (and on an expander the working area past the new end covered its extent).
/// Edited above the store's part of the medium under an anchor: before, accepted. Each edit
/// is now refused with a line that says what was edited, and the refused open wrote nothing.
#[test]
fn an_edited_store_length_is_refused_both_ways() {
    // Shrunk below p's extent, a store over the whole medium and one over half of it.
    for len in [None, Some(MEDIUM / 2)] {
        let (m, s) = store(len, None);
        let data_off = s.superblock().data_off;
        let img = with_store_len(&m.snapshot(), data_off + 4096);
        drop(s);
        let e = open(img, None).err().unwrap();
        assert!(
            matches!(
                e,
                StoreError::Superblock(SuperblockError::CutsExtent { slot: 0, .. })
            ),
            "{len:?}: {e}"
        );
        assert!(e.to_string().contains("an edited store length"), "{e}");
    }
    // A store that spans its medium (a store file), opened by one who knows it: any other
    // length is refused, also one that cuts only free space; past the medium it never fits.
    let (m, s) = store(None, None);
    let img = m.snapshot();
    drop(s);
    for len in [MEDIUM - (2 << 20), MEDIUM - 4096] {
        let e = open_len(with_store_len(&img, len), None, Some(MEDIUM))
            .err()
            .unwrap();
        assert!(
            matches!(e, StoreError::Superblock(SuperblockError::Length { .. })),
            "{len}: {e}"
        );
        assert!(e.to_string().contains("an edited superblock"), "{e}");
    }
    let e = open(with_store_len(&img, MEDIUM + 4096), None)
        .err()
        .unwrap();
    assert!(
        matches!(e, StoreError::Superblock(SuperblockError::Geometry)),
        "{e}"
    );
    open_len(img, None, Some(MEDIUM)).unwrap();
    // Grown over the rest of the medium: under an anchor, refused by the anchor, which
    // recorded the length; by an opener who knows the length, refused.
    let dir = Dir::new("grow");
    let (m, s) = store(Some(MEDIUM / 2), Some(&dir.anchor()));
    let img = with_store_len(&m.snapshot(), MEDIUM);
    drop(s);
    let e = open(img.clone(), Some(&dir.anchor())).err().unwrap();
    assert!(
        matches!(e, StoreError::Anchor(AnchorError::Geometry { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("an edited superblock"), "{e}");
    let e = open_len(img.clone(), None, Some(MEDIUM / 2)).err().unwrap();
    assert!(
        matches!(e, StoreError::Superblock(SuperblockError::Length { .. })),
        "{e}"
    );
    // With neither, a grown length is taken (what an expander store opened without
    // `direct=` does): the store then also uses what was the rest of the medium. It never
    // writes past the medium, and p is as it was (docs/threat-model.md).
    let s = open(img, None).unwrap();
    assert_eq!(s.superblock().medium_len, MEDIUM);
    let r = s.attach("p", Perm::Read, &key("k")).unwrap();
    let mut out = [0u8; PAGE];
    r.fault(0, &mut out).unwrap();
    assert_eq!(out, page_of(1, 0));
}

/// The other superblock fields: a lowered slot count that would hide used slots, a moved
/// data area, a moved table, an edited store id. Each is refused at open, or (the id) makes
/// every PMO fail its record MAC and the anchor refuse the store.
#[test]
fn every_other_superblock_field_edit_is_refused() {
    let (m, s) = store(None, None);
    s.create_pmo("q", 4 * PAGE as u64, &key("k")).unwrap();
    let sb = s.superblock().clone();
    let img = m.snapshot();
    drop(s);
    // Slot count lowered below q's slot (1): the slot past the new count is in use.
    let e = open(edited(&img, |sb| sb.slots = 1), None).err().unwrap();
    assert!(
        matches!(
            e,
            StoreError::Superblock(SuperblockError::TableTail { slots: 1 })
        ),
        "{e}"
    );
    // Raised inside the table's padding: the new slots are blank, nothing changes.
    let s = open(edited(&img, |sb| sb.slots = 17), None).unwrap();
    assert_eq!(s.list().len(), 2);
    drop(s);
    // Data area or table moved: the geometry no longer fits (no copy is taken).
    for (what, e) in [
        (
            "data_off",
            edited(&img, |x| x.data_off = sb.data_off + (2 << 20)),
        ),
        ("table_off", edited(&img, |x| x.table_off = 0)),
    ] {
        let e = open(e, None).err().unwrap();
        assert!(
            matches!(e, StoreError::Superblock(SuperblockError::Geometry)),
            "{what}: {e}"
        );
    }
    // Another store id: every record MAC binds the id.
    let s = open(edited(&img, |x| x.uuid[0] ^= 1), None).unwrap();
    assert!(matches!(
        s.attach("p", Perm::Read, &key("k")),
        Err(StoreError::Corrupt { ref why, .. }) if why == "record MAC"
    ));
    drop(s);
    let dir = Dir::new("uuid");
    let (m, s) = store(None, Some(&dir.anchor()));
    let img = m.snapshot();
    drop(s);
    let e = open(edited(&img, |x| x.uuid[0] ^= 1), Some(&dir.anchor()))
        .err()
        .unwrap();
    assert!(
        matches!(e, StoreError::Anchor(AnchorError::OtherStore(_))),
        "{e}"
    );
}
