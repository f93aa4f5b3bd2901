//! The store's error type.

use crate::{AllocError, AnchorError, JournalError, SuperblockError};
use pmo_crypto::CryptoError;
use pmo_media::MediumError;

/// Every way a store operation can fail. Messages are short and never carry key material.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No PMO of that name.
    #[error("no PMO named {0:?}")]
    NotFound(String),
    /// A PMO of that name exists.
    #[error("a PMO named {0:?} already exists")]
    Exists(String),
    /// Attached in a conflicting mode (many readers or one writer).
    #[error("PMO {0:?} is attached")]
    Busy(String),
    /// The key does not open this PMO. Same error whatever the key and wherever it differs.
    #[error("wrong key")]
    WrongKey,
    /// Name rules: 1..=63 bytes of [A-Za-z0-9._-], not starting with '.'.
    #[error("invalid PMO name {0:?} (letters, digits, '.', '_', '-'; not starting with '.')")]
    InvalidName(String),
    /// A name longer than [`record::MAX_NAME`](crate::record::MAX_NAME) bytes.
    #[error("PMO name of {0} bytes is too long (at most 63)")]
    NameTooLong(usize),
    /// Size rules: a nonzero multiple of 4096 up to 64 GiB.
    #[error("invalid PMO size {0} (a nonzero multiple of 4096, at most 64 GiB)")]
    InvalidSize(u64),
    /// A store asked to occupy more than its medium.
    #[error("a store of {len} bytes does not fit a medium of {medium}")]
    TooLong {
        /// The length asked for.
        len: u64,
        /// The medium's length.
        medium: u64,
    },
    /// A page index beyond the PMO.
    #[error("page {page} beyond PMO of {npages} pages")]
    PageOutOfRange {
        /// Requested page.
        page: u64,
        /// PMO size in pages.
        npages: u64,
    },
    /// A page failed authentication; its plaintext was not returned.
    #[error("page {page} failed integrity verification")]
    Integrity {
        /// The page.
        page: u64,
    },
    /// PMO metadata (root, tree or journal) failed authentication or is damaged.
    #[error("PMO {name:?} metadata failed verification: {why}")]
    Corrupt {
        /// PMO name.
        name: String,
        /// What failed.
        why: String,
    },
    /// Writing through a read-only session.
    #[error("session is read-only")]
    ReadOnly,
    /// No free PMO table slot.
    #[error("PMO table full")]
    TableFull,
    /// Not enough free space.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// The store could not be formatted or opened.
    #[error(transparent)]
    Superblock(#[from] SuperblockError),
    /// The medium failed (or an injected crash fired).
    #[error(transparent)]
    Medium(#[from] MediumError),
    /// A crypto primitive failed (not a verification failure).
    #[error("crypto: {0}")]
    Crypto(CryptoError),
    /// A journal could not be written.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// `wedi` holds the whole plaintext in host memory; this PMO would not fit.
    #[error("PMO of {size} bytes is too large for design {design} on this host")]
    TooLargeForDesign {
        /// Design name.
        design: &'static str,
        /// PMO size.
        size: u64,
    },
    /// A design or suite that leaves encryption to the medium, on an extent it does not encrypt.
    #[error("PMO {name:?}: {what} needs a medium that encrypts its extent (a PMO store on a CXL expander with --pmo-master-key)")]
    NeedsRangeEncryption {
        /// PMO name.
        name: String,
        /// The design or suite, e.g. "design c" or "suite tee-blake3".
        what: String,
    },
    /// A background detach thread could not be started or died.
    #[error("detach worker failed")]
    Worker,
    /// A counter read from the medium is at its maximum; it is refused, never wrapped.
    #[error("{0} exhausted")]
    CounterExhausted(&'static str),
    /// The rollback anchor refused the store or could not be updated.
    #[error(transparent)]
    Anchor(#[from] AnchorError),
    /// Open refused this PMO: its table slot is damaged or invalid, another slot holds the same
    /// name, its extent overlaps another PMO's, or its rollback anchor says the record is not
    /// the current one (docs/store.md, "Admission"). Its data is left alone for repair.
    #[error("PMO {name:?} is refused until repaired: {why}")]
    Refused {
        /// PMO name.
        name: String,
        /// What open found.
        why: String,
    },
    /// A keyless record write would have changed a field bound under the record MAC (a bug).
    #[error("internal: keyless write of a bound record field")]
    BoundFieldChanged,
}

impl From<CryptoError> for StoreError {
    fn from(e: CryptoError) -> Self {
        match e {
            CryptoError::WrongKey => StoreError::WrongKey,
            other => StoreError::Crypto(other),
        }
    }
}
