//! A store session as the pager's [`PageSource`]: the one adapter between the store and the
//! pager, and where an attachment's failure is recorded.
//!
//! How a fill maps store errors to pager errors, what a fill after detach does, and what a
//! refused page does to its attachment are decided here, once, for every front end.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, RwLock};

use locked::RwLocked;
use pmo_crypto::PAGE;
use pmo_store::{Session, StoreError};

use crate::events::{PageEvent, PageEvents};
use crate::pager::{Detected, FillError, PageSource};
use crate::Failure;

/// No page failed.
const HEALTHY: u8 = 0;
/// A page could not be read (a medium error): [`Failure::Io`].
const FAILED_IO: u8 = 1;
/// A page failed verification: [`Failure::Integrity`]; outranks an I/O failure.
const FAILED_INTEGRITY: u8 = 2;

/// Whom to tell when a page of an attachment fails, and how it is named to them.
pub struct Notify {
    /// The front end's sink (a device's event queue).
    pub events: Arc<dyn PageEvents>,
    /// The attachment's handle as the front end's caller knows it.
    pub handle: u64,
}

/// A store session behind an attachment. Detach takes the session out while faults may still
/// be running: a fill after that fails ("detached") and installs nothing.
pub struct SessionSource {
    session: RwLock<Option<Session>>,
    writable: bool,
    /// The session's design keeps its working copy in device memory (LPMO CF).
    on_device: bool,
    fill_waits: bool,
    /// [`HEALTHY`], or why the attachment failed (see [`SessionSource::failure`]).
    failed: AtomicU8,
    notify: Option<Notify>,
}

impl SessionSource {
    /// Serves `session`; `writable` attachments get write-protected pages (dirty tracking);
    /// `notify` hears of every failed page.
    pub fn new(session: Session, writable: bool, notify: Option<Notify>) -> Self {
        SessionSource {
            on_device: session.design().working_copy_on_device(),
            fill_waits: session.reads_wait(),
            session: RwLock::new(Some(session)),
            writable,
            failed: AtomicU8::new(HEALTHY),
            notify,
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

    /// Why the attachment failed, if it did: a page of it was refused to an access or found
    /// failing verification. From then on its psyncs persist nothing (the PMO stays as of its
    /// last good psync) and its detach reports the failure, so tampering never goes unnoticed.
    pub fn failure(&self) -> Option<Failure> {
        match self.failed.load(Ordering::SeqCst) {
            HEALTHY => None,
            FAILED_IO => Some(Failure::Io),
            _ => Some(Failure::Integrity),
        }
    }

    /// A page of a design `c` working copy came back from the media other than it was
    /// written (the expander served it as zeros): the attachment fails as when a fault is
    /// refused, and the front end hears of the page once.
    pub fn working_page_failed(&self, page: u64) {
        let was = self.failed.swap(FAILED_INTEGRITY, Ordering::SeqCst);
        if was != FAILED_INTEGRITY {
            self.tell(page, Detected::Ahead);
        }
    }

    fn tell(&self, page: u64, how: Detected) {
        if let Some(n) = &self.notify {
            n.events.post(PageEvent {
                handle: n.handle,
                page,
                how,
            });
        }
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

    fn page_failed(&self, page: u64, error: &FillError, how: Detected) {
        match error {
            FillError::Integrity(_) => self.failed.store(FAILED_INTEGRITY, Ordering::SeqCst),
            FillError::Other { .. } => {
                let _ = self.failed.compare_exchange(
                    HEALTHY,
                    FAILED_IO,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
        }
        self.tell(page, how);
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
