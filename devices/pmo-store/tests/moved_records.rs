//! A keyless editor who kept an old copy of a PMO puts its old record into another table slot
//! (docs/threat-model.md, issue 27 part 1). Each test is named after the attack it stops.

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use pmo_crypto::{KdfParams, PAGE};
use pmo_media::{CrashMedium, Medium};
use pmo_store::superblock::SLOT_SIZE;
use pmo_store::{OpenOptions, Perm, RecoveryReport, Store, StoreError, StoreOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const NP: u64 = 4;

/// A scratch directory for one test's anchor, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("pmo-moved-{tag}-{}", std::process::id()));
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

fn anchored_store(anchor: &Path) -> (Arc<CrashMedium>, Store) {
    let m = Arc::new(CrashMedium::new(MEDIUM));
    let s = Store::create(
        m.clone() as Arc<dyn Medium>,
        StoreOptions {
            anchor: Some(anchor.to_owned()),
            ..fast_options(16)
        },
    )
    .unwrap();
    (m, s)
}

fn open(img: Vec<u8>, anchor: Option<&Path>) -> Result<(Store, RecoveryReport), StoreError> {
    let m = Arc::new(CrashMedium::from_image(img));
    Store::open_with(
        m as Arc<dyn Medium>,
        &OpenOptions {
            anchor: anchor.map(Path::to_owned),
            kdf: KdfParams::INSECURE_FAST,
            len: None,
            ..Default::default()
        },
    )
}

fn psync_page0(s: &Store, name: &str, tag: u8) {
    let w = s.attach(name, Perm::Write, &key("k")).unwrap();
    w.psync([(0u64, &page_of(tag, 0))]).unwrap();
    w.detach().wait().unwrap();
}

/// The table slot range of `slot` (table right after the two 4 KiB superblock copies).
fn slot_bytes_of(slot: u32) -> std::ops::Range<usize> {
    let at = (2 * 4096 + u64::from(slot) * SLOT_SIZE) as usize;
    at..at + SLOT_SIZE as usize
}

/// Under an anchor: the store opens, the report names `p` as refused with a reason that
/// says `because`, and every way to reach the name says so (attach, destroy, create), while
/// `fsck` counts it as a problem and its old extent is not handed to a new PMO.
fn refused_under_anchor(img: Vec<u8>, anchor: &Path, because: &str) {
    let (s, rep) = open(img, Some(anchor)).unwrap();
    let why = rep
        .refused
        .iter()
        .find(|(n, _)| n == "p")
        .map(|(_, w)| w.clone())
        .unwrap_or_else(|| panic!("p not refused: {rep:?}"));
    assert!(why.contains(because), "{why}");
    match attach_refused(&s, "p", 1) {
        StoreError::Refused { name, why: w } => assert_eq!((name.as_str(), &w), ("p", &why)),
        e => panic!("attach: {e}"),
    }
    assert!(matches!(
        s.destroy_pmo("p", &key("k")),
        Err(StoreError::Refused { .. })
    ));
    assert!(matches!(
        s.create_pmo("p", NP * PAGE as u64, &key("k")),
        Err(StoreError::Refused { .. })
    ));
    assert!(s.list().iter().all(|i| i.name != "p"));
    assert_eq!(s.refused(), vec![("p".to_string(), why.clone())]);
    let f = s.fsck();
    assert!(
        f.problems.iter().any(|p| p.starts_with("p: refused")),
        "{f:?}"
    );
    let e = StoreError::Refused {
        name: "p".into(),
        why,
    };
    assert!(e
        .to_string()
        .starts_with("PMO \"p\" is refused until repaired: "));
}

/// Without an anchor the moved record fails its MAC at attach: it binds the slot it was sealed
/// for and whether it is destroyed.
fn record_mac_fails_without_anchor(img: Vec<u8>) {
    let (s, _) = open(img, None).unwrap();
    match attach_refused(&s, "p", 1) {
        StoreError::Corrupt { why, .. } => assert_eq!(why, "record MAC"),
        e => panic!("attach: {e}"),
    }
}

fn slot_of(s: &Store, name: &str) -> u32 {
    s.list().iter().find(|i| i.name == name).unwrap().slot
}

fn extent_of(s: &Store, name: &str) -> (usize, usize) {
    let i = s.list().into_iter().find(|i| i.name == name).unwrap();
    (i.extent.0 as usize, (i.extent.0 + i.extent.1) as usize)
}

/// The owner's view after the attack: `name` must not attach and give its old page 0.
/// Returns the error the attach gave.
fn attach_refused(s: &Store, name: &str, old: u8) -> StoreError {
    match s.attach(name, Perm::Read, &key("k")) {
        Ok(r) => {
            let mut out = [0u8; PAGE];
            let got = r.fault(0, &mut out).map(|_| out[8]);
            panic!(
                "{name} attached after the attack; page 0 read {got:?} (old contents: tag {old})"
            );
        }
        Err(e) => e,
    }
}

/// The old record of a PMO written into a never-used slot, the PMO's own slot damaged and its
/// old extent put back. Before, open noted the damaged slot as unknown, the anchor check left
/// it out, and the old record was served from the other slot: the owner read old contents.
#[test]
fn an_old_record_moved_to_a_never_used_slot_with_the_real_slot_damaged_is_refused() {
    let dir = Dir::new("never-used");
    let (m, s) = anchored_store(&dir.anchor());
    s.create_pmo("p", NP * PAGE as u64, &key("k")).unwrap();
    psync_page0(&s, "p", 1);
    let old = m.snapshot();
    psync_page0(&s, "p", 2);
    let (slot, (e0, e1)) = (slot_of(&s, "p"), extent_of(&s, "p"));
    let mut img = m.snapshot();
    drop(s);
    let (real, spare) = (slot_bytes_of(slot), slot_bytes_of(9));
    img[spare.clone()].copy_from_slice(&old[real.clone()]);
    img[real].fill(0x5a); // no copy decodes
    img[e0..e1].copy_from_slice(&old[e0..e1]);
    refused_under_anchor(img.clone(), &dir.anchor(), "slot 0 is damaged");
    // The refused PMO's extent is not handed out while it waits for repair.
    let (s, _) = open(img.clone(), Some(&dir.anchor())).unwrap();
    s.create_pmo("q", NP * PAGE as u64, &key("k")).unwrap();
    let q = s.list().into_iter().find(|i| i.name == "q").unwrap();
    assert!(q.extent.0 as usize >= e1, "q took p's extent");
    drop(s);
    record_mac_fails_without_anchor(img);
}

/// The old record of a PMO written into a free slot numbered lower than the PMO's own, nothing
/// damaged, the old extent put back. Before, the lower slot's copy won (a duplicate name was
/// dropped by slot order after its commit number had been counted for the anchor).
#[test]
fn an_old_record_moved_to_a_lower_free_slot_is_refused() {
    let dir = Dir::new("lower-free");
    let (m, s) = anchored_store(&dir.anchor());
    s.create_pmo("a", NP * PAGE as u64, &key("k")).unwrap();
    s.create_pmo("p", NP * PAGE as u64, &key("k")).unwrap();
    let free = slot_of(&s, "a");
    s.destroy_pmo("a", &key("k")).unwrap();
    psync_page0(&s, "p", 1);
    let old = m.snapshot();
    psync_page0(&s, "p", 2);
    let (slot, (e0, e1)) = (slot_of(&s, "p"), extent_of(&s, "p"));
    assert!(free < slot);
    let mut img = m.snapshot();
    drop(s);
    img[slot_bytes_of(free)].copy_from_slice(&old[slot_bytes_of(slot)]);
    img[e0..e1].copy_from_slice(&old[e0..e1]);
    refused_under_anchor(img.clone(), &dir.anchor(), "table slots [0, 1] all hold it");
    // Without an anchor too: a duplicated name is never resolved by slot order.
    let (s, rep) = open(img, None).unwrap();
    assert!(matches!(
        attach_refused(&s, "p", 1),
        StoreError::Refused { .. }
    ));
    assert_eq!(rep.refused.len(), 1, "{rep:?}");
}

/// A destroyed PMO's old record written into another slot with its old extent: before, the
/// PMO came back with its old contents under the anchor.
#[test]
fn a_destroyed_pmos_record_brought_back_in_another_slot_is_refused() {
    let dir = Dir::new("destroyed");
    let (m, s) = anchored_store(&dir.anchor());
    s.create_pmo("p", NP * PAGE as u64, &key("k")).unwrap();
    psync_page0(&s, "p", 1);
    let old = m.snapshot();
    let (slot, (e0, e1)) = (slot_of(&s, "p"), extent_of(&s, "p"));
    s.destroy_pmo("p", &key("k")).unwrap();
    let mut img = m.snapshot();
    drop(s);
    img[slot_bytes_of(7)].copy_from_slice(&old[slot_bytes_of(slot)]);
    img[e0..e1].copy_from_slice(&old[e0..e1]);
    refused_under_anchor(img.clone(), &dir.anchor(), "an old copy");
    record_mac_fails_without_anchor(img);
}

/// A destroyed PMO's free record edited back to a live state (the state byte is outside the
/// record MAC, and the checksum is unkeyed) in its own slot, its old extent put back: before,
/// the destroy commit's MAC still verified and the PMO came back with its last contents.
#[test]
fn a_destroyed_pmo_brought_back_by_editing_its_free_records_state_is_refused() {
    use pmo_store::record::{arbitrate, Record, SlotContent};
    use pmo_store::PmoState;
    let dir = Dir::new("state");
    let (m, s) = anchored_store(&dir.anchor());
    s.create_pmo("p", NP * PAGE as u64, &key("k")).unwrap();
    psync_page0(&s, "p", 1);
    let old = m.snapshot();
    let (slot, (e0, e1)) = (slot_of(&s, "p"), extent_of(&s, "p"));
    s.destroy_pmo("p", &key("k")).unwrap();
    let mut img = m.snapshot();
    drop(s);
    let at = slot_bytes_of(slot);
    let SlotContent::Valid { mut rec, copy } = arbitrate(&img[at.clone()]) else {
        panic!("no free record");
    };
    assert_eq!(rec.state, PmoState::Free);
    rec.state = PmoState::Detached;
    let raw: Vec<u8> = rec.encode();
    let half = at.start + usize::from(copy) * (SLOT_SIZE as usize / 2);
    img[half..half + raw.len()].copy_from_slice(&raw);
    assert!(Record::decode(&img[half..half + raw.len()]).is_some());
    img[e0..e1].copy_from_slice(&old[e0..e1]);
    refused_under_anchor(
        img.clone(),
        &dir.anchor(),
        "where the anchor has it destroyed",
    );
    record_mac_fails_without_anchor(img);
}

/// A PMO's slot damaged, nothing else: under an anchor the PMO is refused by the name the
/// anchor has for the slot, not silently gone. (Without one, the slot is reported as bad and
/// the name is unknown: the documented limit.)
#[test]
fn damaging_a_pmos_slot_under_an_anchor_refuses_it_by_name() {
    let dir = Dir::new("damaged");
    let (m, s) = anchored_store(&dir.anchor());
    s.create_pmo("p", NP * PAGE as u64, &key("k")).unwrap();
    psync_page0(&s, "p", 1);
    let slot = slot_of(&s, "p");
    let mut img = m.snapshot();
    drop(s);
    img[slot_bytes_of(slot)].fill(0x5a);
    refused_under_anchor(img.clone(), &dir.anchor(), "slot 0 is damaged");
    let (s, rep) = open(img, None).unwrap();
    assert_eq!(
        rep.bad_slots,
        vec![(slot, "no valid record copy".to_string())]
    );
    assert!(matches!(
        s.attach("p", Perm::Read, &key("k")),
        Err(StoreError::NotFound(_))
    ));
}

/// A live PMO's record marked free (the state byte is outside the MAC; the checksum is
/// recomputed): before, the PMO vanished silently and its slot and extent were handed to the
/// next create. Under an anchor it is refused by name and neither is reused.
#[test]
fn marking_a_pmo_free_under_an_anchor_refuses_it_by_name() {
    use pmo_store::record::{arbitrate, SlotContent};
    use pmo_store::PmoState;
    let dir = Dir::new("marked-free");
    let (m, s) = anchored_store(&dir.anchor());
    s.create_pmo("p", NP * PAGE as u64, &key("k")).unwrap();
    psync_page0(&s, "p", 1);
    let (slot, (_, e1)) = (slot_of(&s, "p"), extent_of(&s, "p"));
    let mut img = m.snapshot();
    drop(s);
    let at = slot_bytes_of(slot);
    let SlotContent::Valid { mut rec, copy } = arbitrate(&img[at.clone()]) else {
        panic!("no record");
    };
    rec.state = PmoState::Free;
    let raw = rec.encode();
    let half = at.start + usize::from(copy) * (SLOT_SIZE as usize / 2);
    img[half..half + raw.len()].copy_from_slice(&raw);
    refused_under_anchor(img.clone(), &dir.anchor(), "marks it destroyed");
    let (s, _) = open(img, Some(&dir.anchor())).unwrap();
    s.create_pmo("q", NP * PAGE as u64, &key("k")).unwrap();
    let q = s.list().into_iter().find(|i| i.name == "q").unwrap();
    assert_ne!(q.slot, slot, "q took p's slot");
    assert!(q.extent.0 as usize >= e1, "q took p's extent");
}

/// What honest use leaves behind opens clean under an anchor: commits a crash kept from the
/// anchor (a psync, a create, a destroy: emulated by putting the anchor from before them
/// back) are caught up, not refused; a name destroyed and created again, in its old slot or
/// another, is not taken for an old copy.
#[test]
fn honest_histories_under_an_anchor_open_clean() {
    let dir = Dir::new("honest");
    let anchor = dir.anchor();
    let (m, s) = anchored_store(&anchor);
    s.create_pmo("p", NP * PAGE as u64, &key("k")).unwrap();
    s.create_pmo("q", NP * PAGE as u64, &key("k")).unwrap();
    psync_page0(&s, "p", 1);
    let before = std::fs::read(&anchor).unwrap();
    // Crash windows: a psync of p, a create of r, a destroy of q, none in the anchor.
    psync_page0(&s, "p", 2);
    s.create_pmo("r", NP * PAGE as u64, &key("k")).unwrap();
    s.destroy_pmo("q", &key("k")).unwrap();
    let img = m.snapshot();
    drop(s);
    std::fs::write(&anchor, &before).unwrap();
    let m = Arc::new(CrashMedium::from_image(img));
    let opts = OpenOptions {
        anchor: Some(anchor.clone()),
        kdf: KdfParams::INSECURE_FAST,
        len: None,
        ..Default::default()
    };
    let (s, rep) = Store::open_with(m.clone() as Arc<dyn Medium>, &opts).unwrap();
    assert!(rep.refused.is_empty(), "{rep:?}");
    let caught: Vec<(u32, &str, bool)> = rep
        .anchor_caught_up
        .iter()
        .map(|(i, e)| (*i, e.name.as_str(), e.destroyed))
        .collect();
    assert_eq!(
        caught,
        vec![(0, "p", false), (1, "q", true), (2, "r", false)]
    );
    let r = s.attach("p", Perm::Read, &key("k")).unwrap();
    let mut out = [0u8; PAGE];
    r.fault(0, &mut out).unwrap();
    assert_eq!(out, page_of(2, 0));
    drop(r);
    // Destroyed and made again: q in its own slot, p in another (x takes p's).
    s.create_pmo("q", NP * PAGE as u64, &key("k")).unwrap();
    assert_eq!(slot_of(&s, "q"), 1);
    s.destroy_pmo("p", &key("k")).unwrap();
    s.create_pmo("x", NP * PAGE as u64, &key("k")).unwrap();
    s.create_pmo("p", NP * PAGE as u64, &key("k")).unwrap();
    assert_eq!((slot_of(&s, "x"), slot_of(&s, "p")), (0, 3));
    psync_page0(&s, "p", 3);
    drop(s);
    let (s, rep) = open(m.snapshot(), Some(&anchor)).unwrap();
    assert!(rep.refused.is_empty(), "{rep:?}");
    assert!(rep.anchor_caught_up.is_empty(), "{rep:?}");
    let names: Vec<String> = s.list().into_iter().map(|i| i.name).collect();
    assert_eq!(names, ["p", "q", "r", "x"]);
    assert!(s.fsck().problems.is_empty());
}
