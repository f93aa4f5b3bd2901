//! Opening the store a service runs on: a store file (created and formatted when missing), or
//! a medium the VMM opened (an expander's media), optionally behind the psync kill hook tests
//! use.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pmo_store::medium::{FileMedium, KillInPsync, Medium, MediumError};
use pmo_store::{Store, StoreError, StoreOptions};

use crate::pager::PagerError;

/// Errors bringing a PMO service up.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The store file cannot be created or opened.
    #[error("PMO store {path}: {source}")]
    Medium {
        /// The store file.
        path: PathBuf,
        /// Why.
        source: MediumError,
    },
    /// The store cannot be formatted, opened or recovered.
    #[error("PMO store {path}: {source}")]
    Store {
        /// The store file.
        path: PathBuf,
        /// Why.
        source: StoreError,
    },
    /// The window cannot be set up.
    #[error("PMO window: {0}")]
    Pager(#[from] PagerError),
}

/// The store's medium behind the psync kill hook, when a test asked for one.
pub(crate) type KillHook = Option<Arc<KillInPsync<Arc<dyn Medium>>>>;

/// Opens the store file, creating and formatting it if missing.
pub fn open_store(path: &Path, size: Option<u64>) -> Result<Store, ServiceError> {
    open_file_store(path, size, StoreOptions::default(), None).map(|(s, _)| s)
}

/// Opens the store file `path` (created with `size` bytes and formatted if missing), behind
/// a kill hook at persist point `kill_at` of every psync if given.
pub(crate) fn open_file_store(
    path: &Path,
    size: Option<u64>,
    opts: StoreOptions,
    kill_at: Option<u64>,
) -> Result<(Store, KillHook), ServiceError> {
    let (file, fresh) =
        FileMedium::open_or_create(path, size).map_err(|source| ServiceError::Medium {
            path: path.to_owned(),
            source,
        })?;
    let opened = open_store_on(path, Arc::new(file), fresh, opts, kill_at);
    if opened.is_err() && fresh {
        // Leave nothing behind that a later run would take for a damaged store.
        let _ = std::fs::remove_file(path);
    }
    opened
}

/// Opens the store on `medium`, formatting it first when `blank`; `label` (the file or the
/// media behind it) names it in errors and logs.
pub(crate) fn open_store_on(
    label: &Path,
    medium: Arc<dyn Medium>,
    blank: bool,
    opts: StoreOptions,
    kill_at: Option<u64>,
) -> Result<(Store, KillHook), ServiceError> {
    let (m, hook): (Arc<dyn Medium>, KillHook) = match kill_at {
        Some(n) => {
            let k = Arc::new(KillInPsync::new(medium, n));
            (k.clone(), Some(k))
        }
        None => (medium, None),
    };
    let store = match Store::open_or_format(m, blank, opts) {
        Ok((store, Some(report))) => {
            log::info!("PMO store {}: {report:?}", label.display());
            store
        }
        Ok((store, None)) => store,
        Err(source) => {
            return Err(ServiceError::Store {
                path: label.to_owned(),
                source,
            })
        }
    };
    Ok((store, hook))
}
