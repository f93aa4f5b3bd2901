use super::*;
use crate::events::PageEvent;
use pmo_crypto::KdfParams;

struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct NoEvents;
impl PageEvents for NoEvents {
    fn post(&self, _: PageEvent) {}
}

fn service(tag: &str) -> (Dir, Arc<PmoService>) {
    let dir = std::env::temp_dir().join(format!("pmo-service-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = PmoConfig {
        store: dir.join("store.img"),
        store_size: Some(16 << 20),
        design: None,
        window_size: 64 * PAGE as u64,
        fault_threads: 1,
        predictor: PredictorSpec::Stream(2),
        store_options: pmo_store::StoreOptions {
            kdf: KdfParams::INSECURE_FAST,
            ..Default::default()
        },
        dram_budget: None,
        device_memory_latency_ns: 0,
        test_kill_in_psync: None,
    };
    let s = PmoService::open(&cfg, Arc::new(NoEvents)).unwrap();
    (Dir(dir), s)
}

fn key() -> UserKey {
    UserKey::new(b"service test key").unwrap()
}

#[test]
fn the_calls_of_one_attachment_in_order() {
    let (_d, s) = service("calls");
    assert_eq!(s.create("a", 0, &key()), Err(Failure::Invalid));
    assert_eq!(s.create("a", 100, &key()), Err(Failure::Invalid));
    s.create("a", 4 * PAGE as u64, &key()).unwrap();
    assert_eq!(s.create("a", PAGE as u64, &key()), Err(Failure::Exists));
    assert_eq!(
        s.attach("a", Perm::Write, &UserKey::new(b"other").unwrap()),
        Err(Failure::WrongKey)
    );
    let w = s.attach("a", Perm::Write, &key()).unwrap();
    assert_eq!(w.size, 4 * PAGE as u64);
    assert_eq!(s.list(0).unwrap().attached, Listed::Writer);
    assert_eq!(s.destroy("a", &key()), Err(Failure::Busy));
    // SAFETY: the attachment's slice of the live window; only this thread touches it.
    unsafe { ((s.pager().host_addr() + w.offset) as *mut u8).write(9) };
    assert_eq!(s.psync(w.handle), Ok(1));
    let st = s.stat(w.handle).unwrap();
    assert_eq!(
        (st.size, st.psyncs, st.psync_pages),
        (4 * PAGE as u64, 1, 1)
    );
    assert_eq!(s.detach(w.handle), Ok(()));
    assert_eq!(s.detach(w.handle), Err(Failure::NotFound));
    assert_eq!(s.psync(w.handle), Err(Failure::NotFound));

    let r = s.attach("a", Perm::Read, &key()).unwrap();
    assert_eq!(s.psync(r.handle), Err(Failure::NotPermitted));
    let e = s.list(0).unwrap();
    assert_eq!(
        (e.name.as_str(), e.attached, e.more),
        ("a", Listed::Readers, false)
    );
    assert_eq!(s.list(1), Err(Failure::NotFound));
    // SAFETY: as above, read only.
    let first = unsafe { ((s.pager().host_addr() + r.offset) as *const u8).read() };
    assert_eq!(first, 9);
    assert_eq!(s.attached_names(), ["a"]);
    let live = s.counters();
    assert_eq!((live.attachments, live.attaches, live.psyncs), (1, 2, 1));
    s.detach_all();
    assert_eq!(s.attached(), 0);
    // Ended attachments keep counting: the writer's psync, both attachments' faults.
    let c = s.counters();
    assert_eq!(
        (c.attachments, c.attaches, c.psyncs, c.psync_pages),
        (0, 2, 1, 1)
    );
    assert_eq!(c.psync_bytes(), PAGE as u64);
    assert!(c.faults >= 2 && c.pages_decrypted >= 2, "{c:?}");
    assert_eq!(s.list(0).unwrap().attached, Listed::Detached);
    s.destroy("a", &key()).unwrap();
    assert_eq!(s.list(0), Err(Failure::NotFound));
}

#[test]
fn a_design_set_by_the_caller_governs_later_creates_and_attaches() {
    let (_d, s) = service("design");
    // A CXL design needs a medium that encrypts its extent; a file does not.
    s.set_design(Design::Cl);
    assert_eq!(s.create("x", PAGE as u64, &key()), Err(Failure::Invalid));
    s.set_design(Design::SpId);
    s.create("x", PAGE as u64, &key()).unwrap();
    let a = s.attach("x", Perm::Write, &key()).unwrap();
    s.detach(a.handle).unwrap();
    // A window too small for the PMO: no memory, and the PMO is not left busy.
    s.create("big", 128 * PAGE as u64, &key()).unwrap();
    assert_eq!(s.attach("big", Perm::Write, &key()), Err(Failure::NoMemory));
    s.destroy("big", &key()).unwrap();
}
