//! Tests on a real store file and a real userfaultfd window; the test threads are the vCPUs.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

/// A directory removed on drop (tmpfs when there is one).
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("pmo-host-{}-{seq}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const KEY: &[u8] = b"pmo-host test key";

fn config(design: Design) -> HostConfig {
    HostConfig {
        design,
        kdf: KdfParams::INSECURE_FAST,
        window: 64 << 20,
        ..HostConfig::default()
    }
}

fn host(dir: &Dir, config: HostConfig) -> PmoHost {
    PmoHost::open_file(&dir.0.join("store.img"), 64 << 20, KEY, config).unwrap()
}

/// The attachment's bytes.
fn bytes<'a>(addr: NonNull<u8>, len: usize) -> &'a mut [u8] {
    // SAFETY: the tests pass an attachment of `len` bytes that stays attached while they use
    // the slice, and only the test thread touches it.
    unsafe { std::slice::from_raw_parts_mut(addr.as_ptr(), len) }
}

const P: usize = PAGE;

#[test]
fn create_attach_write_sync_detach_reattach_read() {
    let d = Dir::new("round");
    let h = host(&d, config(Design::D));
    h.create("obj", 3 * P + 1).unwrap();
    assert_eq!(
        h.create("obj", P).unwrap_err().errno(),
        libc::EEXIST,
        "exists"
    );
    let (a, len) = h.attach("obj", true, None).unwrap();
    assert_eq!(len, 4 * P, "rounded up to whole pages");
    let m = bytes(a, len);
    assert_eq!(m[0], 0, "zero-filled");
    m[0] = 0xa5;
    m[2 * P + 9] = 0x5a;
    assert_eq!(h.sync(a).unwrap(), 2);
    assert_eq!(h.sync(a).unwrap(), 0, "nothing written since");
    m[3 * P] = 0x77; // never synced
    h.detach(a).unwrap();
    assert_eq!(h.attached(), 0);
    assert_eq!(h.detach(a).unwrap_err().errno(), libc::EINVAL);

    let (b, len) = h.attach("obj", false, None).unwrap();
    let m = bytes(b, len);
    assert_eq!((m[0], m[2 * P + 9], m[3 * P], m[P]), (0xa5, 0x5a, 0, 0));
    assert_eq!(h.sync(b).unwrap(), 0, "a reader has nothing to sync");
    h.detach(b).unwrap();

    let got = h.measurements();
    assert_eq!(
        (got.creates, got.attaches, got.detaches, got.psyncs),
        (1, 2, 2, 2)
    );
    assert_eq!(got.psync_pages, 2);
    // The writer touched 3 pages (the reads of the zero page and two writes fault once each),
    // the reader 4: every first touch is a demand fault; the writer's stores to pages it had
    // read first are write-protect faults.
    assert_eq!(got.faults, 3 + 4);
    assert_eq!(
        got.stall_ns, 0,
        "blocking detach: nothing to wait for at attach"
    );
    assert_eq!(got.prefetch_late + got.pages_prefetched, 0);

    // A fresh host on the same store file (the first one gone) finds the data.
    drop(h);
    let h = host(&d, config(Design::SpId));
    let (c, len) = h.attach("obj", false, None).unwrap();
    assert_eq!(bytes(c, len)[2 * P + 9], 0x5a);
    h.detach(c).unwrap();
    h.destroy("obj").unwrap();
    assert_eq!(
        h.attach("obj", false, None).unwrap_err().errno(),
        libc::ENOENT
    );
}

#[test]
fn attach_creates_for_a_writer_and_the_pmo_rules_hold() {
    let d = Dir::new("rules");
    let h = host(&d, config(Design::D));
    assert_eq!(
        h.attach("new", false, Some(P)).unwrap_err().errno(),
        libc::ENOENT,
        "a reader never creates"
    );
    let (w, len) = h.attach("new", true, Some(2 * P - 5)).unwrap();
    assert_eq!(len, 2 * P);
    assert_eq!(h.measurements().creates, 1);
    assert_eq!(
        h.attach("new", true, None).unwrap_err().errno(),
        libc::EBUSY
    );
    assert_eq!(
        h.attach("new", false, None).unwrap_err().errno(),
        libc::EBUSY
    );
    assert_eq!(h.destroy("new").unwrap_err().errno(), libc::EBUSY);
    // Two PMOs share the window at distinct addresses.
    let (o, olen) = h.attach("other", true, Some(P)).unwrap();
    let (lo, hi) = (w.as_ptr() as usize, o.as_ptr() as usize);
    assert!(hi >= lo + len || lo >= hi + olen, "overlapping slices");
    bytes(o, olen)[0] = 1;
    bytes(w, len)[0] = 2;
    assert_eq!((h.sync(o).unwrap(), h.sync(w).unwrap()), (1, 1));
    h.detach(o).unwrap();
    h.detach(w).unwrap();
    // Many readers at once.
    let r1 = h.attach("new", false, None).unwrap().0;
    let r2 = h.attach("new", false, None).unwrap().0;
    assert_eq!(bytes(r1, P)[0], 2);
    assert_eq!(bytes(r2, P)[0], 2);
    h.detach(r1).unwrap();
    h.detach(r2).unwrap();
    // A second host on the same store, with a window of 4 pages: an 8-page PMO does not fit.
    let small = PmoHost::new(
        h.store().clone(),
        UserKey::new(KEY).unwrap(),
        HostConfig {
            window: 4 * P as u64,
            ..config(Design::D)
        },
    )
    .unwrap();
    small.create("eight", 8 * P).unwrap();
    assert_eq!(
        small.attach("eight", false, None).unwrap_err().errno(),
        libc::ENOMEM
    );
    // The failed attach left the PMO attachable.
    let (e, _) = h.attach("eight", true, None).unwrap();
    h.detach(e).unwrap();
}

#[test]
fn nonblocking_detach_is_waited_for_at_the_next_attach_as_stall() {
    let d = Dir::new("stall");
    let h = host(
        &d,
        HostConfig {
            nonblocking_detach: true,
            ..config(Design::Wedi)
        },
    );
    let (a, len) = h.attach("obj", true, Some(256 * P)).unwrap();
    for p in 0..256 {
        bytes(a, len)[p * P] = p as u8;
        // Every page changes (page 0's first byte stays 0): sync writes only changed pages.
        bytes(a, len)[p * P + 1] = 1;
    }
    assert_eq!(h.sync(a).unwrap(), 256);
    h.detach(a).unwrap();
    // wedi re-encrypts the whole PMO in the background of the detach.
    assert_eq!(h.pending_detaches(), 1);
    assert_eq!(h.measurements().stall_ns, 0);
    let (b, len) = h.attach("obj", true, None).unwrap();
    assert_eq!(h.pending_detaches(), 0, "the attach waited for it");
    let stall = h.measurements().stall_ns;
    assert!(stall > 0, "the wait is counted as stall");
    assert_eq!(bytes(b, len)[255 * P], 255);
    h.detach(b).unwrap();
    assert_eq!(h.pending_detaches(), 1);
    // Destroy waits too (no EBUSY from a detach still running).
    h.destroy("obj").unwrap();
    assert_eq!(h.pending_detaches(), 0);
    assert!(h.measurements().stall_ns > stall);
    // Several PMOs left pending: drain waits for all.
    for name in ["x", "y"] {
        let (a, _) = h.attach(name, true, Some(P)).unwrap();
        h.detach(a).unwrap();
    }
    assert_eq!(h.pending_detaches(), 2);
    h.drain().unwrap();
    assert_eq!(h.pending_detaches(), 0);
    let m = h.measurements();
    assert_eq!(
        (m.attaches, m.detaches, m.creates, m.destroys),
        (4, 4, 3, 1)
    );
    h.reset_measurements();
    assert_eq!(h.measurements(), Measurements::default());
}

#[test]
fn sessions_record_demand_and_prefetched_pages_and_counters_add_up() {
    let d = Dir::new("sets");
    let npages = 128;
    let run = |predictor: Option<&str>| {
        let predictor = predictor.map_or(PredictorSpec::None, |p| p.parse().unwrap());
        let h = host(
            &d,
            HostConfig {
                predictor,
                record_sessions: true,
                ..config(Design::D)
            },
        );
        h.create("scan", npages * P).unwrap_or(());
        let before = h.measurements();
        let mut sum = 0u64;
        for _ in 0..2 {
            let (a, len) = h.attach("scan", false, None).unwrap();
            let m = bytes(a, len);
            // Read every other page, in order.
            for p in (0..npages).step_by(2) {
                sum += u64::from(m[p * P + 1]);
            }
            h.detach(a).unwrap();
        }
        assert_eq!(sum, 0);
        (h.take_sessions(), h.measurements().since(&before))
    };
    let (reference, m) = run(None);
    assert_eq!(reference.len(), 2);
    for s in &reference {
        assert_eq!(s.name, "scan");
        assert!(!s.writable);
        assert!(s.prefetched.is_empty());
        let want: Vec<u64> = (0..npages as u64).step_by(2).collect();
        assert_eq!(s.demand, want, "every touched page, one demand fault each");
    }
    assert_eq!(m.faults, npages as u64, "2 sessions x 64 pages");
    assert_eq!(m.pages_prefetched, 0);

    let (predicted, m) = run(Some("stride:8"));
    assert_eq!(predicted.len(), 2);
    let prefetched: usize = predicted.iter().map(|s| s.prefetched.len()).sum();
    assert!(prefetched > 0, "{predicted:?}");
    // Every touched page came by demand fault or by prefetch (late ones were both).
    for s in &predicted {
        for p in (0..npages as u64).step_by(2) {
            assert!(
                s.demand.contains(&p) || s.prefetched.contains(&p),
                "page {p}"
            );
        }
    }
    let demand: usize = predicted.iter().map(|s| s.demand.len()).sum();
    // Faults also count touches of trigger pages (verified ahead, installed at first touch).
    assert!(m.faults >= demand as u64, "{} < {demand}", m.faults);
    assert!(demand < npages, "prediction saved demand decryptions");
    let e = m.estimate();
    assert!(e.coverage.is_some(), "{e:?}");
}
