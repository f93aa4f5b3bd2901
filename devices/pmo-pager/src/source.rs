//! The one adapter between the store and the pager: a store session as a [`PageSource`], and
//! [`Attachment`], a session serving a slice of a window for programs on the host.
//!
//! The device, the host-side comparison harness, the applications' host backends and the fault
//! bench all serve a window slice from a store session; they share these types so that how a
//! fill maps store errors to pager errors, what a fill after detach does, and the order of
//! psync and detach steps are decided once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use locked::RwLocked;
use pmo_crypto::PAGE;
use pmo_policies::Predictor;
use pmo_store::{DetachHandle, Session, StoreError};

use crate::pager::{FillError, PageSource, Pager, PagerError, SliceStats};

/// A store session behind a pager slice. Detach takes the session out while faults may still
/// be running: a fill after that fails ("detached") and installs nothing.
pub struct SessionSource {
    session: RwLock<Option<Session>>,
    writable: bool,
    /// The session's design keeps its working copy in device memory (LPMO CF).
    on_device: bool,
    fill_waits: bool,
}

impl SessionSource {
    /// Serves `session`; `writable` attachments get write-protected pages (dirty tracking).
    pub fn new(session: Session, writable: bool) -> Self {
        SessionSource {
            on_device: session.design().working_copy_on_device(),
            fill_waits: session.reads_wait(),
            session: RwLock::new(Some(session)),
            writable,
        }
    }

    /// Runs `f` on the session, or returns `None` once it has been taken.
    pub fn with<T>(&self, f: impl FnOnce(&Session) -> T) -> Option<T> {
        self.session.read_locked().as_ref().map(f)
    }

    /// Takes the session out (detach); later fills fail.
    pub fn take(&self) -> Option<Session> {
        self.session.write_locked().take()
    }
}

impl PageSource for SessionSource {
    fn fill(&self, page: u64, out: &mut [u8; PAGE]) -> Result<(), FillError> {
        let guard = self.session.read_locked();
        let Some(session) = guard.as_ref() else {
            return Err(FillError::Other {
                page,
                why: "detached".into(),
            });
        };
        session.fault(page, out).map_err(|e| fill_error(page, e))
    }

    fn fill_run(&self, first: u64, out: &mut [[u8; PAGE]]) -> Result<(), (usize, FillError)> {
        let guard = self.session.read_locked();
        let Some(session) = guard.as_ref() else {
            return Err((
                0,
                FillError::Other {
                    page: first,
                    why: "detached".into(),
                },
            ));
        };
        session
            .fault_run(first, out)
            .map_err(|(i, e)| (i, fill_error(first.saturating_add(i as u64), e)))
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn working_copy_on_device(&self) -> bool {
        self.on_device
    }

    fn fill_waits(&self) -> bool {
        self.fill_waits
    }
}

/// The pager's view of a store error on `page`: an integrity failure is refused and reported;
/// anything else is only not installed.
fn fill_error(page: u64, e: StoreError) -> FillError {
    match e {
        StoreError::Integrity { page } => FillError::Integrity(page),
        e => FillError::Other {
            page,
            why: e.to_string(),
        },
    }
}

/// Errors of an [`Attachment`].
#[derive(Debug, thiserror::Error)]
pub enum AttachmentError {
    /// The pager refused (window full, slice gone, clearing the window failed).
    #[error("pager: {0}")]
    Pager(#[from] PagerError),
    /// The store refused the psync or the detach.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The session was already taken out by a detach.
    #[error("the attachment is detached")]
    Detached,
}

/// A store session serving a slice of a pager window: what a program on the host holds while
/// it uses a PMO with plain loads and stores (the comparison harness, the host backends of
/// LMDB and Filebench). Its threads play the vCPUs; the pager's threads answer their faults.
pub struct Attachment {
    source: Arc<SessionSource>,
    offset: u64,
    stats: Arc<SliceStats>,
    npages: u64,
    /// Set by the first detach: the offset may belong to a later attachment afterwards, so
    /// a second detach must not touch the pager.
    detached: AtomicBool,
}

impl Attachment {
    /// Gives `session` a slice of `pager`'s window as large as its PMO, prefetching with
    /// `predictor` if one is given. On failure the session is dropped, which runs the store's
    /// crash handler: nothing of the PMO changes.
    pub fn attach(
        pager: &Pager,
        session: Session,
        writable: bool,
        predictor: Option<Box<dyn Predictor>>,
    ) -> Result<Self, AttachmentError> {
        let npages = session.pages();
        let source = Arc::new(SessionSource::new(session, writable));
        let (offset, stats) = match pager.attach(source.clone(), npages) {
            Ok(x) => x,
            Err(e) => {
                drop(source.take());
                return Err(e.into());
            }
        };
        let a = Attachment {
            source,
            offset,
            stats,
            npages,
            detached: AtomicBool::new(false),
        };
        if predictor.is_some() {
            if let Err(e) = pager.set_predictor(offset, predictor) {
                // The slice is fresh and nothing was stored through it.
                let _ = a.detach(pager).map(DetachHandle::wait);
                return Err(e.into());
            }
        }
        Ok(a)
    }

    /// The slice's byte offset in the window.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The PMO's size in pages.
    pub fn npages(&self) -> u64 {
        self.npages
    }

    /// The slice's counters (faults, prefetches, write-protect faults).
    pub fn stats(&self) -> &Arc<SliceStats> {
        &self.stats
    }

    /// Host address of the PMO's first byte in `pager`'s window.
    pub fn host_addr(&self, pager: &Pager) -> u64 {
        pager.host_addr() + self.offset
    }

    /// Psyncs the pages written since the last psync (atomically, as one commit); returns how
    /// many there were. Only this attachment's slice is read, even if a later attachment got
    /// the same offset after a detach.
    pub fn psync(&self, pager: &Pager) -> Result<u64, AttachmentError> {
        let n = self
            .source
            .with(|s| {
                pager.collect_dirty_of(self.offset, &self.stats, |pages| {
                    s.psync(pages.iter().map(|(p, d)| (*p, &**d)))
                })
            })
            .ok_or(AttachmentError::Detached)???;
        Ok(n)
    }

    /// Drops the plaintext from the window, gives the slice back, and detaches the session:
    /// stores since the last psync are lost. Returns the store's handle on the detach's
    /// background work; when the window cannot be cleared, waits for it and reports that.
    pub fn detach(&self, pager: &Pager) -> Result<DetachHandle, AttachmentError> {
        if self.detached.swap(true, Ordering::AcqRel) {
            return Err(AttachmentError::Detached);
        }
        let window = pager.detach(self.offset);
        let session = self.source.take().ok_or(AttachmentError::Detached)?;
        let handle = session.detach();
        match window {
            Ok(()) => Ok(handle),
            Err(e) => {
                let _ = handle.wait();
                Err(e.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmo_crypto::{KdfParams, UserKey};
    use pmo_media::FileMedium;
    use pmo_store::{Perm, Store, StoreOptions};

    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn store(tag: &str) -> (Dir, Store) {
        let dir = std::env::temp_dir().join(format!("pmo-source-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let medium = FileMedium::create(&dir.join("store.img"), 16 << 20).unwrap();
        let opts = StoreOptions {
            kdf: KdfParams::INSECURE_FAST,
            ..StoreOptions::default()
        };
        (Dir(dir), Store::create(Arc::new(medium), opts).unwrap())
    }

    fn window(a: &Attachment, pager: &Pager) -> &'static mut [u8] {
        let len = (a.npages() * PAGE as u64) as usize;
        // SAFETY: the slice lies in the pager's live mapping (the tests keep the pager alive
        // while they use it) and only the test thread touches it.
        unsafe { std::slice::from_raw_parts_mut(a.host_addr(pager) as *mut u8, len) }
    }

    #[test]
    fn stores_psynced_through_an_attachment_survive_and_unsynced_ones_do_not() {
        let (_d, store) = store("psync");
        let key = UserKey::new(b"attachment test key").unwrap();
        store.create_pmo("obj", 4 * PAGE as u64, &key).unwrap();
        let pager = Pager::new(16 * PAGE as u64, 1).unwrap();

        let s = store.attach("obj", Perm::Write, &key).unwrap();
        let a = Attachment::attach(&pager, s, true, None).unwrap();
        assert_eq!(a.npages(), 4);
        let w = window(&a, &pager);
        w[0] = 0xa5;
        w[3 * PAGE + 7] = 0x5a;
        assert_eq!(a.psync(&pager).unwrap(), 2);
        assert_eq!(a.psync(&pager).unwrap(), 0, "nothing written since");
        w[PAGE] = 0x77; // never psynced
        a.detach(&pager).unwrap().wait().unwrap();
        assert!(matches!(a.psync(&pager), Err(AttachmentError::Detached)));

        let s = store.attach("obj", Perm::Read, &key).unwrap();
        let b = Attachment::attach(&pager, s, false, None).unwrap();
        // The window space is reused; the second detach of `a` must not take it from `b`.
        assert_eq!(b.offset(), a.offset());
        assert!(matches!(a.detach(&pager), Err(AttachmentError::Detached)));
        let w = window(&b, &pager);
        assert_eq!((w[0], w[PAGE], w[3 * PAGE + 7]), (0xa5, 0, 0x5a));
        b.detach(&pager).unwrap().wait().unwrap();
    }

    #[test]
    fn a_failed_attach_leaves_the_pmo_attachable() {
        let (_d, store) = store("full");
        let key = UserKey::new(b"attachment test key").unwrap();
        store.create_pmo("big", 8 * PAGE as u64, &key).unwrap();
        let pager = Pager::new(4 * PAGE as u64, 1).unwrap();
        let s = store.attach("big", Perm::Write, &key).unwrap();
        assert!(matches!(
            Attachment::attach(&pager, s, true, None),
            Err(AttachmentError::Pager(PagerError::WindowFull(8)))
        ));
        // The session was dropped (crash handler): the PMO is not left busy.
        store
            .attach("big", Perm::Write, &key)
            .unwrap()
            .detach()
            .wait()
            .unwrap();
    }
}
