//! [`HostError`] and the errno every error gets when a C program (LMDB, the Filebench engine)
//! sees it through its callbacks.

use std::io;

use pmo_media::MediumError;
use pmo_pager::{AttachmentError, Failure, PagerError};
use pmo_store::StoreError;

/// Errors of a [`PmoHost`](crate::PmoHost).
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The store refused.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The store file cannot be created or opened.
    #[error("store file: {0}")]
    Medium(#[from] MediumError),
    /// The pager refused (window full, no such slice, ...).
    #[error("pager: {0}")]
    Pager(#[from] PagerError),
    /// The attachment refused (it failed earlier, a reader's sync, ...).
    #[error("attachment: {0}")]
    Refused(Failure),
    /// No attachment of this host starts at that address.
    #[error("no PMO attached at that address")]
    NotAttached,
    /// The window is mapped at an address that is no pointer.
    #[error("pager window at an impossible address")]
    BadAddress,
    /// A PMO size that does not fit this process.
    #[error("PMO of {0} bytes does not fit the address space")]
    TooLarge(u64),
}

impl From<AttachmentError> for HostError {
    fn from(e: AttachmentError) -> Self {
        match e {
            AttachmentError::Pager(e) => HostError::Pager(e),
            AttachmentError::Store(e) => HostError::Store(e),
            AttachmentError::Detached => HostError::NotAttached,
            e => HostError::Refused(e.failure()),
        }
    }
}

impl HostError {
    /// The errno a C caller gets for this error.
    pub fn errno(&self) -> i32 {
        match self {
            HostError::Store(e) => Failure::from(e).errno(),
            HostError::Medium(_) => libc::EIO,
            HostError::Pager(e) => match e {
                PagerError::WindowFull(_) | PagerError::Mmap(_) => libc::ENOMEM,
                PagerError::BadWindowSize(_)
                | PagerError::NoSlice(_)
                | PagerError::Detaching(_) => libc::EINVAL,
                _ => libc::EIO,
            },
            HostError::Refused(f) => f.errno(),
            HostError::NotAttached | HostError::BadAddress => libc::EINVAL,
            HostError::TooLarge(_) => libc::ENOMEM,
        }
    }

    /// The error as an `io::Error` of the kind its errno has, keeping the store's or the
    /// pager's own error inside (so a caller can downcast to it): what LMDB's bridge wants.
    pub fn into_io(self) -> io::Error {
        let kind = kind_of(self.errno());
        match self {
            HostError::Store(e) => io::Error::new(kind, e),
            HostError::Pager(e) => io::Error::new(kind, e),
            e => io::Error::new(kind, e),
        }
    }

    /// The error as a bare errno (`io::Error::from_raw_os_error`): what the Filebench engine's
    /// bridge passes on.
    pub fn into_raw_os_error(self) -> io::Error {
        io::Error::from_raw_os_error(self.errno())
    }
}

impl From<HostError> for io::Error {
    fn from(e: HostError) -> Self {
        e.into_io()
    }
}

/// The `io::ErrorKind` of an errno this module hands out.
fn kind_of(errno: i32) -> io::ErrorKind {
    match errno {
        libc::ENOENT => io::ErrorKind::NotFound,
        libc::EEXIST => io::ErrorKind::AlreadyExists,
        libc::EBUSY => io::ErrorKind::ResourceBusy,
        libc::EACCES => io::ErrorKind::PermissionDenied,
        libc::EINVAL => io::ErrorKind::InvalidInput,
        libc::ENOSPC => io::ErrorKind::StorageFull,
        libc::ENOMEM => io::ErrorKind::OutOfMemory,
        libc::EBADMSG => io::ErrorKind::InvalidData,
        libc::EPERM => io::ErrorKind::PermissionDenied,
        libc::ENAMETOOLONG => io::ErrorKind::InvalidFilename,
        _ => io::ErrorKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_keep_their_errno_and_inner_error() {
        let e = HostError::Store(StoreError::NotFound("x".into()));
        assert_eq!(e.errno(), libc::ENOENT);
        let io = e.into_io();
        assert_eq!(io.kind(), io::ErrorKind::NotFound);
        let inner = io.get_ref().and_then(|i| i.downcast_ref::<StoreError>());
        assert!(matches!(inner, Some(StoreError::NotFound(_))));
        let raw = HostError::Store(StoreError::Exists("x".into())).into_raw_os_error();
        assert_eq!(raw.raw_os_error(), Some(libc::EEXIST));
        assert_eq!(
            HostError::Pager(PagerError::WindowFull(3)).errno(),
            libc::ENOMEM
        );
        assert_eq!(HostError::NotAttached.errno(), libc::EINVAL);
        assert_eq!(
            HostError::Store(StoreError::Busy("x".into())).errno(),
            libc::EBUSY
        );
    }
}
