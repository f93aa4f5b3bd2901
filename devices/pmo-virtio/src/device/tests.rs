//! The PMO service end to end on the host: requests in wire format, a real
//! store file, and host threads touching the userfaultfd window the way a
//! vCPU would.

use super::*;
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

fn service_with(dir: &Path, predictor: Option<&str>) -> Result<Arc<PmoService>, DeviceError> {
    PmoService::new(&PmoDeviceConfig {
        store: dir.join("store.img"),
        store_size: Some(256 << 20),
        design: None,
        window_size: 16 << 20,
        fault_threads: 2,
        test_kill_in_psync: None,
        predictor: predictor.map(str::to_string),
        store_options: StoreOptions::default(),
    })
}

fn service(dir: &Path) -> Arc<PmoService> {
    service_with(dir, None).unwrap()
}

fn call(s: &PmoService, op: u16, payload: &[u8]) -> (Status, Vec<u8>) {
    match proto::parse(&request(op, payload)) {
        Ok(r) => s.execute(r),
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
    assert_eq!(
        unsafe { *window(&s, off) },
        1,
        "the PMO is as of its last psync"
    );
    call(&s, OP_DETACH, &h.to_le_bytes());
}

#[test]
fn wrong_key_maps_nothing() {
    let d = tmp("key");
    let s = service(&d.0);
    assert_eq!(create(&s, "a", 4096, b"right"), Status::Ok);
    assert_eq!(attach(&s, "a", true, b"wrong").0, Status::Access);
    assert_eq!(attach(&s, "a", true, b"righ").0, Status::Access);
    assert!(s.attachments.lock().unwrap().is_empty());
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
    let s = service_with(&d.0, Some("stream:4")).unwrap();
    assert_eq!(create(&s, "seq", 16 * 4096, b"k"), Status::Ok);
    let (_, h, off, _) = attach(&s, "seq", false, b"k");
    // SAFETY: inside the attached slice.
    assert_eq!(unsafe { *window(&s, off) }, 0);
    let stat = |i: usize| {
        let (st, r) = call(&s, OP_STAT, &h.to_le_bytes());
        assert_eq!(st, Status::Ok);
        u64::from_le_bytes(r[i * 8..i * 8 + 8].try_into().unwrap())
    };
    // After the fault on page 0, pages 1..=4 are predicted: pages_prefetched
    // (field 4) reaches 3, and page 3 is held back as a trigger (field 25).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while stat(4) < 3 || stat(25) < 1 {
        assert!(std::time::Instant::now() < deadline, "no prefetch happened");
        std::thread::yield_now();
    }
    assert_eq!(stat(1), 1, "one demand fault so far");
    // Touching the trigger is a fault, seen as a used prediction (field 26).
    // SAFETY: inside the attached slice.
    assert_eq!(unsafe { *window(&s, off).add(3 * 4096) }, 0);
    assert_eq!(stat(1), 2);
    assert_eq!(stat(26), 1, "trigger hit");
    // demand_unpredicted (field 29): only page 0.
    assert_eq!(stat(29), 1);
    let (_, r) = call(&s, OP_STAT, &h.to_le_bytes());
    assert_eq!(r.len(), 8 * (9 + 16 + 5), "struct pmo_stat size");
    call(&s, OP_DETACH, &h.to_le_bytes());
    // A bad predictor spec is a startup error.
    let other = tmp("predict-bad");
    let bad = service_with(&other.0, Some("psychic"));
    assert!(matches!(bad, Err(DeviceError::Predictor(_))));
}
