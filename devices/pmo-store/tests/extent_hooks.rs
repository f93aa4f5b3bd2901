//! The store tells a medium that keys extents which ranges are PMO extents
//! (`ExtentKeys::extent_in_use` / `extent_released`, given beside the medium in a `Backing`), so
//! a medium with inline range encryption (the CXL expander's TEE) can key each PMO's range. The
//! invariants checked here: every access inside an extent happens while that extent is in use,
//! from create through recovery to destroy; and each PMO announces its extent under an owner
//! of its own, which a later tenant of the same slot and place cannot take over.

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use pmo_crypto::PmoKeys;
use pmo_crypto::PAGE;
use pmo_media::{Backing, CrashMedium, CrashMode, Extent, ExtentKeys, Medium, MediumError};
use pmo_store::record::{arbitrate, SlotContent};
use pmo_store::superblock::SLOT_SIZE;
use pmo_store::{Perm, Store, StoreError};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A medium that checks every access against the extents it was told about.
struct Checked {
    inner: CrashMedium,
    /// slot -> extent (off, len) while in use.
    extents: Mutex<BTreeMap<u32, (u64, u64)>>,
    /// Extents released so far (off, len): later accesses to them must come after a new `in_use`.
    released: Mutex<Vec<(u64, u64)>>,
    violations: Mutex<Vec<String>>,
    events: Mutex<Vec<String>>,
}

impl Checked {
    fn new(inner: CrashMedium) -> Self {
        Checked {
            inner,
            extents: Mutex::new(BTreeMap::new()),
            released: Mutex::new(Vec::new()),
            violations: Mutex::new(Vec::new()),
            events: Mutex::new(Vec::new()),
        }
    }

    fn check(&self, what: &str, off: u64, len: u64) {
        let overlaps = |(o, l): (u64, u64)| off < o + l && o < off + len;
        let live = self.extents.lock().unwrap().values().any(|&e| overlaps(e));
        let dead = self.released.lock().unwrap().iter().any(|&e| overlaps(e));
        if dead && !live {
            self.violations
                .lock()
                .unwrap()
                .push(format!("{what} [{off:#x}, +{len:#x}) in a released extent"));
        }
    }

    fn in_use_extents(&self) -> Vec<(u64, u64)> {
        self.extents.lock().unwrap().values().copied().collect()
    }
}

impl Medium for Checked {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), MediumError> {
        self.check("read", off, buf.len() as u64);
        self.inner.read(off, buf)
    }
    fn write(&self, off: u64, data: &[u8]) -> Result<(), MediumError> {
        self.check("write", off, data.len() as u64);
        self.inner.write(off, data)
    }
    fn persist(&self, off: u64, len: u64) -> Result<(), MediumError> {
        self.inner.persist(off, len)
    }
    fn zero(&self, off: u64, len: u64) -> Result<(), MediumError> {
        self.check("zero", off, len);
        self.inner.zero(off, len)
    }
}

impl ExtentKeys for Checked {
    fn extent_in_use(&self, e: &Extent) -> Result<(), MediumError> {
        let (slot, off, len) = (e.slot, e.off, e.len);
        self.events
            .lock()
            .unwrap()
            .push(format!("in_use {slot} {off:#x} {len:#x}"));
        let prev = self.extents.lock().unwrap().insert(slot, (off, len));
        if let Some(p) = prev {
            self.violations
                .lock()
                .unwrap()
                .push(format!("slot {slot} in use twice: {p:?}"));
        }
        self.released.lock().unwrap().retain(|&e| e != (off, len));
        Ok(())
    }
    fn extent_released(&self, slot: u32) -> Result<(), MediumError> {
        self.events.lock().unwrap().push(format!("released {slot}"));
        match self.extents.lock().unwrap().remove(&slot) {
            Some(e) => self.released.lock().unwrap().push(e),
            None => self
                .violations
                .lock()
                .unwrap()
                .push(format!("slot {slot} released but not in use")),
        }
        Ok(())
    }
    fn extent_encrypted(&self, _: &Extent) -> bool {
        false
    }
}

/// The checked medium as a store's media: its bytes and its extent hooks.
fn media(m: &Arc<Checked>) -> Backing {
    Backing::new(m.clone()).with_extent_keys(m.clone())
}

#[test]
fn extents_are_in_use_whenever_the_store_touches_them() {
    let m = Arc::new(Checked::new(CrashMedium::new(MEDIUM)));
    let s = Store::create(media(&m), fast_options(16)).unwrap();
    let k = key("k");
    s.create_pmo("a", 8 * PAGE as u64, &k).unwrap();
    s.create_pmo("b", 4 * PAGE as u64, &k).unwrap();
    let listed: Vec<(u64, u64)> = s.list().iter().map(|p| p.extent).collect();
    let mut in_use = m.in_use_extents();
    in_use.sort_unstable();
    let mut want = listed.clone();
    want.sort_unstable();
    assert_eq!(in_use, want, "each PMO's extent is in use, exactly");
    {
        let w = s.attach("a", Perm::Write, &k).unwrap();
        w.psync([(2, &page_of(1, 2))]).unwrap();
        w.detach().wait().unwrap();
    }
    s.destroy_pmo("b", &k).unwrap();
    assert_eq!(
        m.in_use_extents().len(),
        1,
        "{:?}",
        m.events.lock().unwrap()
    );
    // A PMO whose slot and extent are reused after a destroy.
    s.create_pmo("c", 4 * PAGE as u64, &k).unwrap();
    assert_eq!(m.in_use_extents().len(), 2);
    // Crash in the middle of a write session: recovery runs the crash handler on "a".
    let w = s.attach("a", Perm::Write, &k).unwrap();
    w.psync([(3, &page_of(2, 3))]).unwrap();
    let img = m.inner.crash_image(CrashMode::DropAll);
    std::mem::forget(w);
    let violations = m.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:?}");

    // The new medium starts knowing the extents but with none in use, so an access before
    // open declared them (recovery included) is a violation.
    let m2 = Arc::new(Checked::new(CrashMedium::from_image(img)));
    *m2.released.lock().unwrap() = m.in_use_extents();
    let (s2, rep) = Store::open(media(&m2)).unwrap();
    assert!(!rep.actions.is_empty(), "recovery ran: {rep:?}");
    let mut in_use = m2.in_use_extents();
    in_use.sort_unstable();
    let mut want: Vec<(u64, u64)> = s2.list().iter().map(|p| p.extent).collect();
    want.sort_unstable();
    assert_eq!(in_use, want, "open puts every live extent in use");
    let r = s2.attach("a", Perm::Read, &k).unwrap();
    let mut out = [0u8; PAGE];
    r.fault(2, &mut out).unwrap();
    assert_eq!(out, page_of(1, 2));
    drop(r);
    s2.destroy_pmo("a", &k).unwrap();
    s2.destroy_pmo("c", &k).unwrap();
    assert!(m2.in_use_extents().is_empty());
    let violations = m2.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:?}");
}

/// The check above can fail: an access to a released extent is reported.
#[test]
fn the_checker_catches_an_access_to_a_released_extent() {
    let m = Checked::new(CrashMedium::new(1 << 20));
    m.extent_in_use(&Extent {
        slot: 0,
        off: 0x1000,
        len: 0x1000,
        owner: [0; 32],
    })
    .unwrap();
    m.write(0x1800, &[1]).unwrap();
    assert!(m.violations.lock().unwrap().is_empty());
    m.extent_released(0).unwrap();
    m.write(0x1800, &[1]).unwrap();
    assert_eq!(m.violations.lock().unwrap().len(), 1);
}

/// Records the extents announced to it; encrypts nothing.
#[derive(Default)]
struct Announced(Mutex<Vec<Extent>>);

impl ExtentKeys for Announced {
    fn extent_in_use(&self, e: &Extent) -> Result<(), MediumError> {
        self.0.lock().unwrap().push(*e);
        Ok(())
    }
    fn extent_released(&self, _: u32) -> Result<(), MediumError> {
        Ok(())
    }
    fn extent_encrypted(&self, _: &Extent) -> bool {
        false
    }
}

/// Issue 27 part 2, from the store's side: the owner an extent is announced with (what an
/// inline-encrypting medium derives its key from) differs for a PMO created in a destroyed
/// PMO's slot and place; and the new tenant, who can edit its own record and re-seal it with
/// its own key, cannot take the old owner over: copying the old uid and salt still gives
/// another owner (its key check value is its own key's), and copying the old key check value
/// too makes its own key fail the check.
#[test]
fn a_later_pmo_in_the_same_place_is_announced_under_another_owner() {
    let m = Arc::new(CrashMedium::new(MEDIUM));
    let ann = Arc::new(Announced::default());
    let backing = |m: &Arc<CrashMedium>| Backing::new(m.clone()).with_extent_keys(ann.clone());
    let s = Store::create(backing(&m), fast_options(4)).unwrap();
    let (ka, kb) = (key("old tenant"), key("new tenant"));
    s.create_pmo("a", 4 * PAGE as u64, &ka).unwrap();
    let old = ann.0.lock().unwrap()[0];
    let rec_of = |m: &CrashMedium| {
        let at = s.superblock().record_off(0, 0);
        let img = m.snapshot();
        let SlotContent::Valid { rec, copy } =
            arbitrate(&img[at as usize..(at + SLOT_SIZE) as usize])
        else {
            panic!("slot 0 holds no record");
        };
        (*rec, s.superblock().record_off(0, copy))
    };
    let (rec_a, _) = rec_of(&m);
    s.destroy_pmo("a", &ka).unwrap();
    s.create_pmo("b", 4 * PAGE as u64, &kb).unwrap();
    let new = *ann.0.lock().unwrap().last().unwrap();
    assert_eq!((new.slot, new.off, new.len), (old.slot, old.off, old.len));
    assert_ne!(new.owner, old.owner, "same place, another owner");
    let uuid = s.superblock().uuid;

    // The new tenant copies the old uid and salt and re-seals with its own key.
    let (mut rec_b, at) = rec_of(&m);
    rec_b.keys.uid = rec_a.keys.uid;
    rec_b.keys.salt = rec_a.keys.salt;
    let keys = PmoKeys::derive(&kb, rec_b.keys, &Default::default()).unwrap();
    rec_b.kcv = keys.key_check_value();
    rec_b.seal(&keys, &uuid, 0);
    m.tamper(at, &rec_b.encode());
    let m2 = Arc::new(CrashMedium::from_image(m.snapshot()));
    ann.0.lock().unwrap().clear();
    let (s2, _) = Store::open(backing(&m2)).unwrap();
    let reopened = ann.0.lock().unwrap()[0];
    assert_ne!(
        reopened.owner, old.owner,
        "its own key check value, its own owner"
    );
    s2.attach("b", Perm::Read, &kb)
        .unwrap()
        .detach()
        .wait()
        .unwrap();
    drop(s2);

    // And the old key check value too: the owner is the old one, but its key fails the check.
    // (The attach above wrote the record again: edit the copy that is current now.)
    let (mut rec_b, at) = rec_of(&m2);
    rec_b.kcv = rec_a.kcv;
    rec_b.seal(&keys, &uuid, 0);
    m2.tamper(at, &rec_b.encode());
    ann.0.lock().unwrap().clear();
    let (s3, _) = Store::open(backing(&Arc::new(CrashMedium::from_image(m2.snapshot())))).unwrap();
    assert_eq!(ann.0.lock().unwrap()[0].owner, old.owner);
    assert!(matches!(
        s3.attach("b", Perm::Write, &kb),
        Err(StoreError::WrongKey)
    ));
}
