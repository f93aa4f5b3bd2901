//! Opening the store a service runs on: a store file (created and formatted when missing), or
//! a medium the VMM opened (an expander's media), optionally behind the psync kill hook tests
//! use.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pmo_media::{Backing, FileMedium, KillInPsync, Medium, MediumError};
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
    // A store file spans its file: a superblock that says another length was edited.
    let len = Some(file.len());
    let opened = open_store_on(path, Arc::new(file).into(), fresh, opts, kill_at, len);
    if opened.is_err() && fresh {
        // Leave nothing behind that a later run would take for a damaged store.
        let _ = std::fs::remove_file(path);
    }
    opened
}

/// Opens the store on `backing`, formatting it first when `blank`; `label` (the file or the
/// media behind it) names it in errors and logs; `len` is the store's length when the caller
/// knows it (a store file), checked against the superblock. PMOs the store refused at open
/// (a damaged, duplicated or stale record: docs/store.md, "Admission") are logged at warn,
/// one line each, as are commits the rollback anchor had missed.
pub(crate) fn open_store_on(
    label: &Path,
    backing: Backing,
    blank: bool,
    opts: StoreOptions,
    kill_at: Option<u64>,
    len: Option<u64>,
) -> Result<(Store, KillHook), ServiceError> {
    let mut hook: KillHook = None;
    let m = match kill_at {
        // Only the bytes go through the hook; the extent keys stay as they are.
        Some(n) => backing.map_medium(|m| {
            let k = Arc::new(KillInPsync::new(m, n));
            hook = Some(k.clone());
            k
        }),
        None => backing,
    };
    let err = |source| ServiceError::Store {
        path: label.to_owned(),
        source,
    };
    if blank {
        return Ok((Store::create(m, opts).map_err(err)?, hook));
    }
    let open = pmo_store::OpenOptions {
        anchor: opts.anchor,
        kdf: opts.kdf,
        len,
        suites: opts.suites,
    };
    let (store, report) = Store::open_with(m, &open).map_err(err)?;
    log_report(label, &report);
    Ok((store, hook))
}

/// The open's report in the host log: what must not pass unnoticed at warn.
fn log_report(label: &Path, report: &pmo_store::RecoveryReport) {
    let at = label.display();
    for (name, why) in &report.refused {
        log::warn!("PMO store {at}: PMO {name:?} refused (the guest gets ESTALE): {why}");
    }
    for (slot, why) in &report.bad_slots {
        log::warn!("PMO store {at}: table slot {slot} refused: {why}");
    }
    for (slot, e) in &report.anchor_caught_up {
        if e.destroyed {
            log::warn!(
                "PMO store {at}: slot {slot}: PMO {:?} destroyed at commit {}, which its rollback \
                 anchor had not learned (a destroy cut short by a crash, or an edit): now anchored",
                e.name,
                e.commit
            );
        }
    }
    log::info!("PMO store {at}: {report:?}");
}
