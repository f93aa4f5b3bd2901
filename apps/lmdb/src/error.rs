//! Errors of the safe API: LMDB's return codes, the PMO backend's errors, paths.

use std::ffi::CStr;
use std::io;
use std::path::PathBuf;

use libc::c_int;

use crate::ffi;

/// Every way an LMDB operation of this crate can fail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The map is full (`MDB_MAP_FULL`): the data file, or the PMO, has no free page left.
    /// The write transaction that got it can only be aborted.
    #[error("LMDB map is full")]
    MapFull,
    /// Any other LMDB return code or errno.
    #[error("LMDB: {message} ({code})")]
    Lmdb {
        /// The return code (negative: LMDB's own; positive: an errno).
        code: i32,
        /// LMDB's text for it.
        message: String,
    },
    /// The PMO backend failed (attach at open, sync at commit, detach at close).
    #[error("PMO backend: {0}")]
    Backend(io::Error),
    /// The environment's directory cannot be created or resolved.
    #[error("directory {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A path LMDB cannot take (a NUL byte in it).
    #[error("path {0} contains a NUL byte")]
    NulInPath(PathBuf),
    /// A second write transaction on a thread that has one open (LMDB would deadlock).
    #[error("this thread already has a write transaction open on this environment")]
    NestedWrite,
}

impl Error {
    /// The LMDB return code or errno behind this error, if there is one.
    pub fn code(&self) -> Option<i32> {
        match self {
            Error::MapFull => Some(ffi::MDB_MAP_FULL),
            Error::Lmdb { code, .. } => Some(*code),
            Error::Backend(e) => e.raw_os_error(),
            _ => None,
        }
    }
}

/// The error of a nonzero LMDB return code.
pub(crate) fn from_rc(rc: c_int) -> Error {
    if rc == ffi::MDB_MAP_FULL {
        return Error::MapFull;
    }
    let message = if (ffi::MDB_KEYEXIST..=ffi::MDB_LAST_ERRCODE).contains(&rc) {
        // SAFETY: for LMDB's own codes mdb_strerror returns an entry of its static table of
        // NUL-terminated strings (no strerror buffer involved); never null.
        unsafe { CStr::from_ptr(ffi::mdb_strerror(rc)) }
            .to_string_lossy()
            .into_owned()
    } else {
        io::Error::from_raw_os_error(rc).to_string()
    };
    Error::Lmdb { code: rc, message }
}

/// `Ok(())` for 0, the error otherwise.
pub(crate) fn check(rc: c_int) -> Result<(), Error> {
    if rc == 0 {
        Ok(())
    } else {
        Err(from_rc(rc))
    }
}
