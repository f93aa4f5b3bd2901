//! The PMO service end to end on the host: requests in wire format, a real
//! store file, and host threads touching the userfaultfd window the way a
//! vCPU would.

use super::*;
use crate::proto::{Request, Status};
use locked::Locked;
use pmo_pager::service::open_store;
use pmo_policies::PredictorSpec;
use pmo_store::{Design, StoreOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

mod direct;
mod race;
mod refused;

use crate::proto::{
    key_field, name_field, request, OP_ATTACH, OP_CREATE, OP_DESTROY, OP_DETACH, OP_PSYNC, OP_STAT,
};

struct Tmp(PathBuf);
impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tmp(tag: &str) -> Tmp {
    let d = std::env::temp_dir().join(format!("pmo-dev-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Tmp(d)
}

/// The tests drive the service behind a device (its requests in wire format, its pager's
/// window) as the device's queue thread does.
impl std::ops::Deref for PmoDevice {
    type Target = PmoService;
    fn deref(&self) -> &PmoService {
        &self.service
    }
}

fn service_with(dir: &Path, predictor: PredictorSpec) -> Result<PmoDevice, DeviceError> {
    PmoDevice::new(&PmoConfig {
        store: dir.join("store.img"),
        store_size: Some(256 << 20),
        design: None,
        window_size: 16 << 20,
        fault_threads: 2,
        test_kill_in_psync: None,
        predictor,
        store_options: fast_store(),
        dram_budget: None,
        device_memory_latency_ns: 0,
    })
}

/// A default-sized store whose PMOs use the cheapest Argon2id cost.
fn fast_store() -> StoreOptions {
    StoreOptions {
        kdf: pmo_crypto::KdfParams::INSECURE_FAST,
        ..StoreOptions::default()
    }
}

fn service(dir: &Path) -> PmoDevice {
    service_with(dir, PredictorSpec::None).unwrap()
}

fn call(s: &PmoService, op: u16, payload: &[u8]) -> (Status, Vec<u8>) {
    match proto::parse(&request(op, payload)) {
        Ok(r) => crate::serve::execute(s, r),
        Err(st) => (st, Vec::new()),
    }
}

fn create(s: &PmoService, name: &str, size: u64, key: &[u8]) -> Status {
    let mut p = name_field(name).to_vec();
    p.extend_from_slice(&size.to_le_bytes());
    p.extend_from_slice(&key_field(key));
    call(s, OP_CREATE, &p).0
}

/// Returns (status, handle, window offset, size).
fn attach(s: &PmoService, name: &str, write: bool, key: &[u8]) -> (Status, u64, u64, u64) {
    let mut p = name_field(name).to_vec();
    p.extend_from_slice(&(if write { 2u32 } else { 1 }).to_le_bytes());
    p.extend_from_slice(&key_field(key));
    let (st, r) = call(s, OP_ATTACH, &p);
    if st != Status::Ok {
        return (st, 0, 0, 0);
    }
    let u = |i: usize| u64::from_le_bytes(r[i * 8..i * 8 + 8].try_into().unwrap());
    (st, u(0), u(1), u(2))
}

/// Whether `needle` occurs in `hay` (memmem: fast even in debug builds on big files).
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    // SAFETY: both pointers and lengths describe live slices.
    !unsafe {
        libc::memmem(
            hay.as_ptr().cast(),
            hay.len(),
            needle.as_ptr().cast(),
            needle.len(),
        )
    }
    .is_null()
}

fn window(s: &PmoService, offset: u64) -> *mut u8 {
    (s.pager().host_addr() + offset) as *mut u8
}

#[test]
fn create_write_psync_detach_reattach_read() {
    let d = tmp("rw");
    let s = service(&d.0);
    assert_eq!(create(&s, "notes", 64 * 4096, b"k1"), Status::Ok);
    assert_eq!(create(&s, "notes", 4096, b"k1"), Status::Exist);
    let (st, h, off, size) = attach(&s, "notes", true, b"k1");
    assert_eq!((st, size), (Status::Ok, 64 * 4096));
    let w = window(&s, off);
    // Two host threads write like two vCPUs.
    std::thread::scope(|sc| {
        for t in 0..2usize {
            let w = w as usize;
            sc.spawn(move || {
                for p in (t..64).step_by(2) {
                    let msg = format!("page {p} says hello");
                    // SAFETY: inside the attached slice of the window.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            msg.as_ptr(),
                            (w + p * 4096 + 100) as *mut u8,
                            msg.len(),
                        )
                    };
                }
            });
        }
    });
    let (st, r) = call(&s, OP_PSYNC, &h.to_le_bytes());
    assert_eq!(st, Status::Ok);
    assert_eq!(u64::from_le_bytes(r[..8].try_into().unwrap()), 64);
    let (st, r) = call(&s, OP_STAT, &h.to_le_bytes());
    assert_eq!(st, Status::Ok);
    let stat = |i: usize| u64::from_le_bytes(r[i * 8..i * 8 + 8].try_into().unwrap());
    assert_eq!(stat(0), 64 * 4096);
    assert_eq!(stat(1), 64, "one fault per page");
    assert_eq!((stat(5), stat(6)), (1, 64), "one psync of 64 pages");
    // A writer excludes everyone; destroy of an attached PMO is refused.
    assert_eq!(attach(&s, "notes", false, b"k1").0, Status::Busy);
    let mut p = name_field("notes").to_vec();
    p.extend_from_slice(&key_field(b"k1"));
    assert_eq!(call(&s, OP_DESTROY, &p).0, Status::Busy);
    assert_eq!(call(&s, OP_DETACH, &h.to_le_bytes()).0, Status::Ok);
    assert_eq!(call(&s, OP_DETACH, &h.to_le_bytes()).0, Status::NoEnt);

    // Two readers at once see the data.
    let (st, h1, o1, _) = attach(&s, "notes", false, b"k1");
    assert_eq!(st, Status::Ok);
    let (st, h2, o2, _) = attach(&s, "notes", false, b"k1");
    assert_eq!(st, Status::Ok);
    for (o, p) in [(o1, 7usize), (o2, 60)] {
        let want = format!("page {p} says hello");
        let mut got = vec![0u8; want.len()];
        // SAFETY: inside the attached slice.
        unsafe {
            std::ptr::copy_nonoverlapping(
                window(&s, o).add(p * 4096 + 100),
                got.as_mut_ptr(),
                got.len(),
            )
        };
        assert_eq!(got, want.as_bytes());
    }
    // Readers cannot psync.
    assert_eq!(call(&s, OP_PSYNC, &h1.to_le_bytes()).0, Status::Perm);
    call(&s, OP_DETACH, &h1.to_le_bytes());
    call(&s, OP_DETACH, &h2.to_le_bytes());
    assert_eq!(call(&s, OP_DESTROY, &p).0, Status::Ok);
    assert_eq!(attach(&s, "notes", false, b"k1").0, Status::NoEnt);
}

#[test]
fn unsynced_writes_are_dropped_at_detach() {
    let d = tmp("drop");
    let s = service(&d.0);
    assert_eq!(create(&s, "a", 4 * 4096, b"key"), Status::Ok);
    let (_, h, off, _) = attach(&s, "a", true, b"key");
    // SAFETY: inside the attached slice.
    unsafe { *window(&s, off) = 1 };
    call(&s, OP_PSYNC, &h.to_le_bytes());
    // SAFETY: as above.
    unsafe { *window(&s, off) = 2 };
    call(&s, OP_DETACH, &h.to_le_bytes());
    let (_, h, off, _) = attach(&s, "a", false, b"key");
    // SAFETY: as above.
    let first = unsafe { *window(&s, off) };
    assert_eq!(first, 1, "the PMO is as of its last psync");
    call(&s, OP_DETACH, &h.to_le_bytes());
}

#[test]
fn wrong_key_maps_nothing() {
    let d = tmp("key");
    let s = service(&d.0);
    assert_eq!(create(&s, "a", 4096, b"right"), Status::Ok);
    assert_eq!(attach(&s, "a", true, b"wrong").0, Status::Access);
    assert_eq!(attach(&s, "a", true, b"righ").0, Status::Access);
    assert_eq!(s.attached(), 0);
}

/// LIST walks a snapshot of the catalog that a create or destroy replaces: every index answers
/// the PMO of that rank in name order, NoEnt past the end, and `more` is set on all but the last.
#[test]
fn list_follows_creates_and_destroys() {
    let d = tmp("list");
    let s = service(&d.0);
    let names = |s: &PmoService| {
        let mut v = Vec::new();
        for i in 0u32.. {
            let (st, body) = call(s, crate::proto::OP_LIST, &i.to_le_bytes());
            if st == Status::NoEnt {
                break;
            }
            assert_eq!(st, Status::Ok);
            let n = body.iter().position(|b| *b == 0).unwrap();
            let more = u32::from_le_bytes(body[body.len() - 4..].try_into().unwrap());
            v.push((String::from_utf8(body[..n].to_vec()).unwrap(), more));
        }
        v
    };
    assert!(names(&s).is_empty());
    for n in ["c", "a", "b"] {
        assert_eq!(create(&s, n, 4096, b"k"), Status::Ok);
    }
    let want = |v: &[&str]| -> Vec<(String, u32)> {
        v.iter()
            .enumerate()
            .map(|(i, n)| (n.to_string(), u32::from(i + 1 < v.len())))
            .collect()
    };
    assert_eq!(names(&s), want(&["a", "b", "c"]));
    let mut p = name_field("b").to_vec();
    p.extend_from_slice(&key_field(b"k"));
    assert_eq!(call(&s, OP_DESTROY, &p).0, Status::Ok);
    assert_eq!(names(&s), want(&["a", "c"]));
    assert_eq!(create(&s, "0", 4096, b"k"), Status::Ok);
    assert_eq!(names(&s), want(&["0", "a", "c"]));
}

#[test]
fn hostile_requests_get_error_statuses() {
    let d = tmp("hostile");
    let s = service(&d.0);
    assert_eq!(create(&s, "a", 0, b"k"), Status::Inval);
    assert_eq!(create(&s, "a", 4095, b"k"), Status::Inval);
    assert_eq!(create(&s, "a", 1 << 50, b"k"), Status::Inval);
    assert_eq!(call(&s, OP_PSYNC, &12345u64.to_le_bytes()).0, Status::NoEnt);
    assert_eq!(call(&s, OP_STAT, &0u64.to_le_bytes()).0, Status::NoEnt);
    assert_eq!(
        call(&s, OP_DETACH, &u64::MAX.to_le_bytes()).0,
        Status::NoEnt
    );
    // A PMO bigger than the window cannot be attached, and nothing leaks.
    assert_eq!(create(&s, "big", 32 << 20, b"k"), Status::Ok);
    assert_eq!(attach(&s, "big", true, b"k").0, Status::NoMem);
    assert_eq!(
        attach(&s, "big", true, b"k").0,
        Status::NoMem,
        "the gate was released"
    );
}

#[test]
fn store_file_never_holds_the_plaintext() {
    let d = tmp("marker");
    let s = service(&d.0);
    let marker = b"PLAINTEXT-MARKER-7f3a9c";
    assert_eq!(create(&s, "secret", 16 * 4096, b"k"), Status::Ok);
    let (_, h, off, _) = attach(&s, "secret", true, b"k");
    for p in 0..16 {
        // SAFETY: inside the attached slice.
        unsafe {
            std::ptr::copy_nonoverlapping(
                marker.as_ptr(),
                window(&s, off).add(p * 4096 + 17),
                marker.len(),
            )
        };
    }
    call(&s, OP_PSYNC, &h.to_le_bytes());
    let during = std::fs::read(d.0.join("store.img")).unwrap();
    assert!(!contains(&during, marker));
    call(&s, OP_DETACH, &h.to_le_bytes());
    drop(s);
    let after = std::fs::read(d.0.join("store.img")).unwrap();
    assert!(!contains(&after, marker));
    // The check can fail: the marker is found where it is plainly written.
    assert!(contains(&[&[0u8; 9][..], marker, &[1, 2]].concat(), marker));
}

#[test]
fn fresh_pmo_reads_as_zeros() {
    let d = tmp("fresh");
    let s = service(&d.0);
    assert_eq!(create(&s, "fresh", 16 * 4096, b"k"), Status::Ok);
    let (st, h, off, _) = attach(&s, "fresh", false, b"k");
    assert_eq!(st, Status::Ok);
    // SAFETY: inside the attached slice.
    assert_eq!(unsafe { *window(&s, off).add(5 * 4096 + 7) }, 0);
    call(&s, OP_DETACH, &h.to_le_bytes());
}

#[test]
fn a_predictor_prefetches_after_faults() {
    let d = tmp("predict");
    let s = service_with(&d.0, PredictorSpec::Stream(4)).unwrap();
    assert_eq!(create(&s, "seq", 16 * 4096, b"k"), Status::Ok);
    let (_, h, off, _) = attach(&s, "seq", false, b"k");
    // SAFETY: inside the attached slice.
    assert_eq!(unsafe { *window(&s, off) }, 0);
    // Fields are read by value (`{ .. }` in assert_eq!): the wire struct is packed.
    let stat = || {
        let (st, r) = call(&s, OP_STAT, &h.to_le_bytes());
        assert_eq!(st, Status::Ok);
        proto::StatResponse::decode(&r).expect("STAT answers a struct virtio_pmo_stat")
    };
    // After the fault on page 0, pages 1..=4 are predicted: pages_prefetched
    // reaches 3, and page 3 is held back as a trigger.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while stat().pages_prefetched < 3 || stat().triggers < 1 {
        assert!(std::time::Instant::now() < deadline, "no prefetch happened");
        std::thread::yield_now();
    }
    assert_eq!({ stat().faults }, 1, "one demand fault so far");
    // Touching the trigger is a fault, seen as a used prediction.
    // SAFETY: inside the attached slice.
    assert_eq!(unsafe { *window(&s, off).add(3 * 4096) }, 0);
    assert_eq!({ stat().faults }, 2);
    assert_eq!({ stat().trigger_hits }, 1, "trigger hit");
    // Only page 0 was a demand fault nobody predicted.
    assert_eq!({ stat().demand_unpredicted }, 1);
    assert_eq!(
        stat().tier,
        proto::TierStat::default(),
        "no tiering without a budget"
    );
    call(&s, OP_DETACH, &h.to_le_bytes());
}

/// Creates PMO "t" of 8 pages in a fresh store under `dir`, page p holding
/// `good-p` at offset 100 (psynced), then flips a byte of page 3's
/// ciphertext in the store file, as an attacker with the file would.
fn tampered_store(dir: &Path) {
    let s = service(dir);
    assert_eq!(create(&s, "t", 8 * 4096, b"k"), Status::Ok);
    let (_, h, off, _) = attach(&s, "t", true, b"k");
    for p in 0..8usize {
        let msg = format!("good-{p}");
        // SAFETY: inside the attached slice.
        unsafe {
            std::ptr::copy_nonoverlapping(
                msg.as_ptr(),
                window(&s, off).add(p * 4096 + 100),
                msg.len(),
            )
        };
    }
    assert_eq!(call(&s, OP_PSYNC, &h.to_le_bytes()).0, Status::Ok);
    // Waits for the store to finish the session, so the file is free below.
    s.detach_all();
    let ext = s.store().list()[0].extent.0;
    drop(s);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.join("store.img"))
        .unwrap();
    let at = ext + 3 * 4096 + 100;
    let mut b = [0u8; 1];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, at).unwrap();
    b[0] ^= 0x55;
    std::os::unix::fs::FileExt::write_all_at(&f, &b, at).unwrap();
}

/// The events waiting for the guest: (type, handle, page).
fn pending_events(s: &PmoDevice) -> Vec<(u32, u64, u64)> {
    s.events.pending()
}

/// Serves a vCPU's access to window page `wpage` (a real touch of a refused
/// page would be SIGSEGV on a host thread; in a VM KVM returns EFAULT).
fn touch(s: &PmoService, off: u64, page: u64, write: bool) {
    use pmo_pager::pager::FaultHandler;
    let mut buf = s.pager().scratch();
    s.pager().handle(
        pmo_pager::pager::Fault {
            address: s.pager().host_addr() + off + page * 4096,
            write,
            wp: false,
            tid: 1,
        },
        &mut buf,
        &mut uffd::Watch::outside_server(),
    );
}

/// Whether page p of PMO "t" reads back `good-p` in a fresh read attachment,
/// and that attachment's DETACH status.
fn reads_good(s: &PmoService, p: usize) -> (bool, Status) {
    let (st, h, off, _) = attach(s, "t", false, b"k");
    assert_eq!(st, Status::Ok);
    let want = format!("good-{p}");
    let mut got = vec![0u8; want.len()];
    // SAFETY: inside the attached slice; page p is not the tampered one.
    unsafe {
        std::ptr::copy_nonoverlapping(
            window(s, off).add(p * 4096 + 100),
            got.as_mut_ptr(),
            got.len(),
        )
    };
    let st = call(s, OP_DETACH, &h.to_le_bytes()).0;
    (got == want.as_bytes(), st)
}

/// A refused page fails its attachment: the guest hears PAGE_POISONED, the
/// PSYNC persists nothing (also after the page was served as zeros) and
/// answers EBADMSG, the DETACH detaches and answers EBADMSG, and the PMO
/// stays as of its last good psync.
#[test]
fn a_refused_page_fails_psync_and_detach_with_ebadmsg() {
    let d = tmp("refused");
    tampered_store(&d.0);
    let s = service(&d.0);
    let (st, h, off, _) = attach(&s, "t", true, b"k");
    assert_eq!(st, Status::Ok);
    // A good page is written, then the tampered one is touched.
    // SAFETY: inside the attached slice, a good page.
    unsafe { *window(&s, off).add(4096 + 100) = b'X' };
    assert_eq!(
        call(&s, OP_PSYNC, &h.to_le_bytes()).0,
        Status::Ok,
        "before the refusal"
    );
    // SAFETY: as above.
    unsafe { *window(&s, off).add(4096 + 100) = b'Y' };
    touch(&s, off, 3, false);
    assert_eq!(
        pending_events(&s),
        [(proto::EVENT_PAGE_POISONED, h, 3)],
        "the guest is told"
    );
    assert_eq!(call(&s, OP_PSYNC, &h.to_le_bytes()).0, Status::BadMsg);
    // The guest kernel did not unmap it in time: zeros, writable; still failed.
    assert_eq!(s.pager().zero_refused(), 1);
    // SAFETY: the refused page now holds (writable) zeros.
    unsafe {
        assert_eq!(*window(&s, off).add(3 * 4096 + 100), 0);
        *window(&s, off).add(3 * 4096 + 100) = 7;
    }
    assert_eq!(call(&s, OP_PSYNC, &h.to_le_bytes()).0, Status::BadMsg);
    let (st, r) = call(&s, OP_STAT, &h.to_le_bytes());
    assert_eq!(st, Status::Ok);
    assert_eq!(
        u64::from_le_bytes(r[64..72].try_into().unwrap()),
        1,
        "integrity_failures"
    );
    assert_eq!(call(&s, OP_DETACH, &h.to_le_bytes()).0, Status::BadMsg);
    assert_eq!(
        call(&s, OP_DETACH, &h.to_le_bytes()).0,
        Status::NoEnt,
        "detached all the same"
    );
    // The PMO is as of its last good psync: 'X' on page 1, not the later 'Y'.
    let (st, h2, off2, _) = attach(&s, "t", false, b"k");
    assert_eq!(st, Status::Ok);
    // SAFETY: inside the attached slice, a good page.
    assert_eq!(unsafe { *window(&s, off2).add(4096 + 100) }, b'X');
    assert_eq!(call(&s, OP_DETACH, &h2.to_le_bytes()).0, Status::Ok);
    assert_eq!(reads_good(&s, 0), (true, Status::Ok));
    assert_eq!(reads_good(&s, 7), (true, Status::Ok));
    // A write access to the tampered page is refused the same way and leaves nothing dirty.
    let (_, h, off, _) = attach(&s, "t", true, b"k");
    touch(&s, off, 3, true);
    assert_eq!(call(&s, OP_PSYNC, &h.to_le_bytes()).0, Status::BadMsg);
    assert_eq!(call(&s, OP_DETACH, &h.to_le_bytes()).0, Status::BadMsg);
}

/// A page a prefetch finds bad is announced (PAGE_BAD) before anything
/// touches it, and the attachment fails as with a refusal; no page is refused.
#[test]
fn a_page_found_bad_by_prefetch_is_announced_and_fails_the_attachment() {
    let d = tmp("ahead");
    tampered_store(&d.0);
    let s = service_with(&d.0, PredictorSpec::Stream(4)).unwrap();
    let (st, h, off, _) = attach(&s, "t", true, b"k");
    assert_eq!(st, Status::Ok);
    // SAFETY: inside the attached slice; page 0 is good. Pages 1..=4 get predicted.
    assert_eq!(unsafe { *window(&s, off).add(100) }, b'g');
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while pending_events(&s).is_empty() {
        assert!(std::time::Instant::now() < deadline, "no event for page 3");
        std::thread::yield_now();
    }
    assert_eq!(pending_events(&s), [(proto::EVENT_PAGE_BAD, h, 3)]);
    assert_eq!(s.pager().refused_pages(), 0, "nothing was refused");
    assert_eq!(call(&s, OP_PSYNC, &h.to_le_bytes()).0, Status::BadMsg);
    assert_eq!(call(&s, OP_DETACH, &h.to_le_bytes()).0, Status::BadMsg);
    // A later reader reads good pages; its DETACH says BadMsg if its own
    // prefetch reached page 3 before it left.
    let (good, st) = reads_good(&s, 1);
    assert!(good && matches!(st, Status::Ok | Status::BadMsg), "{st:?}");
}

#[test]
fn a_64m_store_is_created_and_a_too_small_one_leaves_no_file() {
    let t = tmp("small-store");
    let path = t.0.join("store.img");
    let s = open_store(&path, Some(64 << 20)).unwrap();
    assert_eq!(s.superblock().slots, 8192);
    drop(s);
    // Reopened as it is, never formatted again.
    assert!(open_store(&path, Some(64 << 20)).is_ok());
    let tiny = t.0.join("tiny.img");
    let e = open_store(&tiny, Some(2 << 20)).err().unwrap().to_string();
    assert!(e.contains("needs at least"), "{e}");
    assert!(
        !tiny.exists(),
        "a store that could not be formatted is removed"
    );
}

#[test]
fn detach_all_waits_for_detaches_the_guest_asked_for() {
    // sp-id defers every page's tag to detach: until the background detach ends, the
    // record says tags are pending. A VMM that exits right after detach_all must not cut
    // that work short.
    let d = tmp("bgdetach");
    let s = service(&d.0);
    let key = pmo_crypto::UserKey::new(b"k1").unwrap();
    let opts = pmo_store::CreateOptions {
        design: Design::SpId,
        ..Default::default()
    };
    let pages = 1024u64;
    for round in 0..3 {
        let name = format!("deferred-{round}");
        s.store()
            .create_pmo_with(&name, pages * 4096, &key, opts)
            .unwrap();
        let (st, h, off, _) = attach(&s, &name, true, b"k1");
        assert_eq!(st, Status::Ok);
        for p in 0..pages {
            touch(&s, off, p, true);
            // A real change: a page only faulted in for writing is not psynced.
            let addr = s.pager().host_addr() + off + p * 4096;
            // SAFETY: a page of this writable attachment, installed writable by the write
            // fault above.
            unsafe { std::ptr::write_volatile(addr as *mut u8, 1) };
        }
        assert_eq!(call(&s, OP_PSYNC, &h.to_le_bytes()).0, Status::Ok);
        let pending = |s: &PmoService| {
            s.store()
                .list()
                .into_iter()
                .find(|i| i.name == name)
                .map(|i| i.pending_tags)
        };
        assert_eq!(pending(&s), Some(pages), "psync deferred every tag");
        assert_eq!(call(&s, OP_DETACH, &h.to_le_bytes()).0, Status::Ok);
        s.detach_all();
        assert_eq!(
            pending(&s),
            Some(0),
            "detach_all returned before the detach ended"
        );
    }
}
