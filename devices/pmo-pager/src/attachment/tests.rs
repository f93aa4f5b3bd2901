use super::*;
use pmo_crypto::{KdfParams, UserKey};
use pmo_media::FileMedium;
use pmo_store::{Store, StoreOptions};

struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn store(tag: &str) -> (Dir, Store) {
    let dir = std::env::temp_dir().join(format!("pmo-attachment-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let medium = FileMedium::create(&dir.join("store.img"), 16 << 20).unwrap();
    let opts = StoreOptions {
        kdf: KdfParams::INSECURE_FAST,
        ..StoreOptions::default()
    };
    (Dir(dir), Store::create(Arc::new(medium), opts).unwrap())
}

fn opts(name: &str) -> AttachOptions<'_> {
    AttachOptions {
        name,
        predictor: PredictorSpec::None,
        notify: None,
        working: WorkingPlace::None,
    }
}

fn window(a: &Attachment) -> &'static mut [u8] {
    let len = (a.npages() * PAGE as u64) as usize;
    // SAFETY: the slice lies in the pager's live mapping (the tests keep the pager alive
    // while they use it) and only the test thread touches it.
    unsafe { std::slice::from_raw_parts_mut(a.host_addr() as *mut u8, len) }
}

fn detach(a: &Attachment) {
    let d = a.detach().unwrap();
    assert_eq!(d.failure, None);
    d.pending.unwrap().wait().unwrap();
}

#[test]
fn stores_psynced_through_an_attachment_survive_and_unsynced_ones_do_not() {
    let (_d, store) = store("psync");
    let key = UserKey::new(b"attachment test key").unwrap();
    store.create_pmo("obj", 4 * PAGE as u64, &key).unwrap();
    let pager = Pager::new(16 * PAGE as u64, 1).unwrap();

    let s = store.attach("obj", Perm::Write, &key).unwrap();
    let a = Attachment::attach(&pager, s, opts("obj")).unwrap();
    assert_eq!(a.npages(), 4);
    let w = window(&a);
    w[0] = 0xa5;
    w[3 * PAGE + 7] = 0x5a;
    assert_eq!(a.psync().unwrap(), 2);
    assert_eq!(a.psync().unwrap(), 0, "nothing written since");
    assert_eq!((a.stat().psyncs, a.stat().psync_pages), (2, 2));
    w[PAGE] = 0x77; // never psynced
    detach(&a);
    assert!(matches!(a.psync(), Err(AttachmentError::Detached)));

    let s = store.attach("obj", Perm::Read, &key).unwrap();
    let b = Attachment::attach(&pager, s, opts("obj")).unwrap();
    // The window space is reused; the second detach of `a` must not take it from `b`.
    assert_eq!(b.offset(), a.offset());
    assert!(matches!(a.detach(), Err(AttachmentError::Detached)));
    let w = window(&b);
    assert_eq!((w[0], w[PAGE], w[3 * PAGE + 7]), (0xa5, 0, 0x5a));
    assert!(matches!(b.psync(), Err(AttachmentError::ReadOnly)));
    assert_eq!(
        AttachmentError::ReadOnly.failure(),
        Failure::NotPermitted,
        "a reader's psync is refused as not permitted"
    );
    detach(&b);
}

#[test]
fn a_failed_attach_leaves_the_pmo_attachable() {
    let (_d, store) = store("full");
    let key = UserKey::new(b"attachment test key").unwrap();
    store.create_pmo("big", 8 * PAGE as u64, &key).unwrap();
    let pager = Pager::new(4 * PAGE as u64, 1).unwrap();
    let s = store.attach("big", Perm::Write, &key).unwrap();
    let e = Attachment::attach(&pager, s, opts("big")).err().unwrap();
    assert!(matches!(
        e,
        AttachmentError::Pager(PagerError::WindowFull(8))
    ));
    assert_eq!(e.failure(), Failure::NoMemory);
    // The session was dropped (crash handler): the PMO is not left busy.
    store
        .attach("big", Perm::Write, &key)
        .unwrap()
        .detach()
        .wait()
        .unwrap();
}

/// A page that fails verification fails its attachment: the front end hears of it once per
/// refusal, psync persists nothing from then on, and the detach reports it.
#[test]
fn a_refused_page_fails_the_attachment_psync_and_detach_say_so() {
    use std::sync::Mutex;
    struct Sink(Mutex<Vec<PageEvent>>);
    impl crate::PageEvents for Sink {
        fn post(&self, e: PageEvent) {
            self.0.lock().unwrap().push(e);
        }
    }
    use crate::events::PageEvent;
    use crate::pager::{Detected, FillError, PageSource};

    let (_d, store) = store("fail");
    let key = UserKey::new(b"attachment test key").unwrap();
    store.create_pmo("obj", 2 * PAGE as u64, &key).unwrap();
    let pager = Pager::new(16 * PAGE as u64, 1).unwrap();
    let sink = Arc::new(Sink(Mutex::new(Vec::new())));
    let s = store.attach("obj", Perm::Write, &key).unwrap();
    let a = Attachment::attach(
        &pager,
        s,
        AttachOptions {
            notify: Some(Notify {
                events: sink.clone(),
                handle: 7,
            }),
            ..opts("obj")
        },
    )
    .unwrap();
    window(&a)[0] = 1;
    // What the pager does when a fill of page 1 fails verification.
    a.source
        .page_failed(1, &FillError::Integrity(1), Detected::OnAccess);
    assert_eq!(a.failure(), Some(Failure::Integrity));
    assert_eq!(
        sink.0.lock().unwrap().as_slice(),
        [PageEvent {
            handle: 7,
            page: 1,
            how: Detected::OnAccess
        }]
    );
    assert!(matches!(
        a.psync(),
        Err(AttachmentError::Failed(Failure::Integrity))
    ));
    let d = a.detach().unwrap();
    assert_eq!(d.failure, Some(Failure::Integrity));
    d.pending.unwrap().wait().unwrap();
    // Nothing of the failed session was persisted.
    let s = store.attach("obj", Perm::Read, &key).unwrap();
    let b = Attachment::attach(&pager, s, opts("obj")).unwrap();
    assert_eq!(window(&b)[0], 0);
    detach(&b);
}
