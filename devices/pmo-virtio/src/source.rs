//! The one adapter between the store and the pager: a store session as a [`PageSource`].
//!
//! The device, the host-side comparison harness and the fault bench all serve a window slice
//! from a store session; they share this type so that how a fill maps store errors to pager
//! errors, and what a fill after detach does, is decided once.

use std::sync::RwLock;

use locked::RwLocked;
use pmo_store::crypto::PAGE;
use pmo_store::{Session, StoreError};

use crate::pager::{FillError, PageSource};

/// A store session behind a pager slice. Detach takes the session out while faults may still
/// be running: a fill after that fails ("detached") and installs nothing.
pub struct SessionSource {
    session: RwLock<Option<Session>>,
    writable: bool,
}

impl SessionSource {
    /// Serves `session`; `writable` attachments get write-protected pages (dirty tracking).
    pub fn new(session: Session, writable: bool) -> Self {
        SessionSource {
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
        session.fault(page, out).map_err(|e| match e {
            StoreError::Integrity { page } => FillError::Integrity(page),
            e => FillError::Other {
                page,
                why: e.to_string(),
            },
        })
    }

    fn writable(&self) -> bool {
        self.writable
    }
}
