//! What a front end tells its caller when a PMO call fails: one small set of outcomes, mapped
//! from the store's, the pager's and the working copies' errors here and nowhere else. A wire
//! protocol maps each to its own status code (virtio-pmo: one errno each).

use pmo_store::StoreError;

use crate::working::WorkingError;

/// Why a PMO call was refused, as its caller learns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Failure {
    /// The attachment may not do that (psync of a reader), or the store is read-only.
    #[error("not permitted")]
    NotPermitted,
    /// No such PMO, handle or list index.
    #[error("not found")]
    NotFound,
    /// The medium failed, or a page could not be read.
    #[error("I/O error")]
    Io,
    /// The window (or the working area) has no room for the attachment.
    #[error("no room in the window")]
    NoMemory,
    /// Wrong key.
    #[error("wrong key")]
    WrongKey,
    /// Attached (destroy), or the one-writer rule.
    #[error("busy")]
    Busy,
    /// The name is taken.
    #[error("exists")]
    Exists,
    /// A malformed value (name, size, key, design for this medium).
    #[error("invalid argument")]
    Invalid,
    /// The store is full.
    #[error("no space in the store")]
    NoSpace,
    /// A name longer than the store allows.
    #[error("name too long")]
    NameTooLong,
    /// A page failed verification, or the PMO's metadata did: the attachment failed.
    #[error("integrity check failed")]
    Integrity,
    /// The store refused the PMO at open: its record was damaged, duplicated or older than
    /// the rollback anchor knows it (docs/store.md, "Admission").
    #[error("refused by the host's store")]
    Stale,
}

impl Failure {
    /// The Linux errno that means this (what a C caller sees; virtio-pmo's status codes are
    /// the same numbers).
    pub fn errno(self) -> i32 {
        match self {
            Failure::NotPermitted => libc::EPERM,
            Failure::NotFound => libc::ENOENT,
            Failure::Io => libc::EIO,
            Failure::NoMemory => libc::ENOMEM,
            Failure::WrongKey => libc::EACCES,
            Failure::Busy => libc::EBUSY,
            Failure::Exists => libc::EEXIST,
            Failure::Invalid => libc::EINVAL,
            Failure::NoSpace => libc::ENOSPC,
            Failure::NameTooLong => libc::ENAMETOOLONG,
            Failure::Integrity => libc::EBADMSG,
            Failure::Stale => libc::ESTALE,
        }
    }
}

impl From<&StoreError> for Failure {
    fn from(e: &StoreError) -> Self {
        match e {
            StoreError::NotFound(_) => Failure::NotFound,
            StoreError::Exists(_) => Failure::Exists,
            StoreError::Busy(_) => Failure::Busy,
            StoreError::WrongKey => Failure::WrongKey,
            StoreError::NameTooLong(_) => Failure::NameTooLong,
            StoreError::InvalidName(_)
            | StoreError::InvalidSize(_)
            | StoreError::PageOutOfRange { .. }
            | StoreError::NeedsRangeEncryption { .. } => Failure::Invalid,
            StoreError::Integrity { .. } | StoreError::Corrupt { .. } => Failure::Integrity,
            StoreError::ReadOnly => Failure::NotPermitted,
            StoreError::TableFull | StoreError::Alloc(_) => Failure::NoSpace,
            StoreError::Refused { .. } => Failure::Stale,
            // A whole-PMO design's plaintext copy of a PMO too large for it.
            StoreError::TooLargeForDesign { .. } => Failure::NoMemory,
            _ => Failure::Io,
        }
    }
}

impl From<&WorkingError> for Failure {
    fn from(e: &WorkingError) -> Self {
        match e {
            WorkingError::NoRoom { .. } | WorkingError::TooLarge(_) => Failure::NoMemory,
            WorkingError::Integrity(_) => Failure::Integrity,
            WorkingError::Store(e) => e.into(),
            WorkingError::Expander(_) => Failure::Io,
        }
    }
}
