//! [`StoreBackend`]: LMDB data files as PMOs of the real store, served through the real
//! userfaultfd pager. The threads running LMDB play the vCPUs: their first touch of a page is
//! a fault that the pager's threads answer with the page decrypted and verified by the store
//! session; a sync collects the pages written since the last one and psyncs them atomically.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use locked::Locked;
use pmo_policies::PolicyError;
use pmo_store::crypto::{KdfParams, Suite, UserKey, PAGE};
use pmo_store::medium::{FileMedium, MediumError};
use pmo_store::{CreateOptions, Design, Perm, Store, StoreError, StoreOptions};
use pmo_virtio::pager::{Pager, PagerError, SliceStats};
use pmo_virtio::source::{Attachment, AttachmentError};

use crate::pmo::PmoBackend;

/// How [`StoreBackend`] creates and attaches its PMOs.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Design of the PMOs it creates and of every attach session.
    pub design: Design,
    /// Page cipher and tag of the PMOs it creates.
    pub suite: Suite,
    /// Argon2id cost of the PMOs it creates (every attach pays it once).
    pub kdf: KdfParams,
    /// Prefetch predictor of every attachment (`pmo_policies::predictor_from_name` spec),
    /// `None` for demand faults only.
    pub predictor: Option<String>,
    /// Pager threads serving faults, per attachment.
    pub fault_threads: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            design: Design::D,
            suite: Suite::XtsBlake3,
            kdf: KdfParams::DEFAULT,
            predictor: None,
            fault_threads: 2,
        }
    }
}

/// Errors of setting up a [`StoreBackend`] or of its store operations.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The store refused.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The store file cannot be created or opened.
    #[error("store file: {0}")]
    Medium(#[from] MediumError),
    /// The predictor spec is not one.
    #[error("predictor: {0}")]
    Policy(#[from] PolicyError),
}

/// One attached PMO: the store session behind a pager window of its own.
struct Live {
    /// The PMO's name.
    pmo: String,
    pager: Arc<Pager>,
    attachment: Attachment,
    writable: bool,
}

impl Live {
    /// Drops the plaintext from the window, then detaches the session (nothing is psynced:
    /// stores since the last sync are lost, as the contract says) and waits for its
    /// background work. Dropping the pager afterwards unmaps the window.
    fn finish(&self) -> io::Result<()> {
        self.attachment
            .detach(&self.pager)
            .map_err(attachment_error)?
            .wait()
            .map_err(store_error)
    }
}

/// A [`PmoBackend`] over a PMO store: one PMO per LMDB data file, created under the backend's
/// key on first attach, each attachment served by its own pager window.
pub struct StoreBackend {
    store: Store,
    key: UserKey,
    config: StoreConfig,
    /// Live attachments by window address.
    live: Mutex<HashMap<usize, Arc<Live>>>,
    syncs: AtomicU64,
    synced_pages: AtomicU64,
}

impl StoreBackend {
    /// A backend on `store` whose PMOs are created and opened with `key`.
    pub fn new(store: Store, key: UserKey, config: StoreConfig) -> Result<Self, BackendError> {
        if let Some(spec) = &config.predictor {
            pmo_policies::predictor_from_name(spec)?;
        }
        Ok(StoreBackend {
            store,
            key,
            config,
            live: Mutex::new(HashMap::new()),
            syncs: AtomicU64::new(0),
            synced_pages: AtomicU64::new(0),
        })
    }

    /// A backend on the store in file `path`: opened (and recovered) if it exists, else
    /// created with `len` bytes and formatted. `key` is the user key of its PMOs.
    pub fn open_file(
        path: &Path,
        len: u64,
        key: &[u8],
        config: StoreConfig,
    ) -> Result<Self, BackendError> {
        let (medium, fresh) = FileMedium::open_or_create(path, Some(len))?;
        let opts = StoreOptions {
            kdf: config.kdf,
            ..StoreOptions::default()
        };
        let (store, _) = Store::open_or_format(Arc::new(medium), fresh, opts)?;
        let key = UserKey::new(key).map_err(StoreError::from)?;
        Self::new(store, key, config)
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The PMO that holds the data file at `path`: `lmdb-`, the directory's name (its first 32
    /// characters that PMO names allow) and a hash of the whole path.
    pub fn pmo_name(path: &str) -> String {
        let p = Path::new(path);
        let dir: String = p
            .parent()
            .and_then(Path::file_name)
            .map(|d| d.to_string_lossy())
            .unwrap_or_default()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            .take(32)
            .collect();
        format!("lmdb-{dir}-{:016x}", fnv1a(path.as_bytes()))
    }

    /// The PMO that [`EnvBuilder::open_pmo`](crate::EnvBuilder::open_pmo) on `dir` uses:
    /// that of LMDB's data file `data.mdb` in the directory's canonical path.
    pub fn pmo_name_for_dir(dir: &Path) -> io::Result<String> {
        let data = std::fs::canonicalize(dir)?.join("data.mdb");
        let path = data.to_str().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "directory path not UTF-8")
        })?;
        Ok(Self::pmo_name(path))
    }

    /// Destroys the PMO `pmo` (see [`StoreBackend::pmo_name`]); it must not be attached.
    pub fn destroy(&self, pmo: &str) -> Result<(), BackendError> {
        Ok(self.store.destroy_pmo(pmo, &self.key)?)
    }

    /// The pager's counters of the attached PMO `pmo`, if it is attached.
    pub fn slice_stats(&self, pmo: &str) -> Option<Arc<SliceStats>> {
        self.live
            .locked()
            .values()
            .find(|a| a.pmo == pmo)
            .map(|a| a.attachment.stats().clone())
    }

    /// Psyncs so far (one per successful [`PmoBackend::sync`] of a writable attachment).
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Dirty pages all psyncs so far wrote.
    pub fn synced_pages(&self) -> u64 {
        self.synced_pages.load(Ordering::Relaxed)
    }

    /// A store session on `pmo`, creating the PMO (zero-filled, `size` rounded up to pages)
    /// when a writer finds none.
    fn session(
        &self,
        pmo: &str,
        size: usize,
        perm: Perm,
    ) -> Result<pmo_store::Session, StoreError> {
        let design = Some(self.config.design);
        match self.store.attach_with(pmo, perm, &self.key, design) {
            Err(StoreError::NotFound(_)) if perm == Perm::Write => {}
            r => return r,
        }
        let bytes = (size as u64).div_ceil(PAGE as u64) * PAGE as u64;
        let opts = CreateOptions {
            design: self.config.design,
            suite: self.config.suite,
            kdf: Some(self.config.kdf),
        };
        match self.store.create_pmo_with(pmo, bytes, &self.key, opts) {
            // Someone else created it in between: attach theirs.
            Ok(()) | Err(StoreError::Exists(_)) => {}
            Err(e) => return Err(e),
        }
        self.store.attach_with(pmo, perm, &self.key, design)
    }

    /// The live attachment at `addr`, for a sync without holding the table's lock during it.
    fn lookup(&self, addr: NonNull<u8>) -> io::Result<Arc<Live>> {
        let live = self.live.locked();
        live.get(&(addr.as_ptr() as usize))
            .cloned()
            .ok_or_else(not_attached)
    }
}

impl PmoBackend for StoreBackend {
    fn attach(&self, name: &str, size: usize, writable: bool) -> io::Result<(NonNull<u8>, usize)> {
        let pmo = Self::pmo_name(name);
        let perm = if writable { Perm::Write } else { Perm::Read };
        let session = self.session(&pmo, size, perm).map_err(store_error)?;
        let bytes = session.pages() * PAGE as u64;
        let len = usize::try_from(bytes).map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory));
        let predictor = self
            .config
            .predictor
            .as_deref()
            .map(pmo_policies::predictor_from_name)
            .transpose()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e));
        // Until the attachment exists, a failure drops the session: the store's crash handler
        // leaves the PMO as it was.
        let (len, predictor) = (len?, predictor?);
        let pager = Pager::new(bytes, self.config.fault_threads.max(1)).map_err(pager_error)?;
        let attachment =
            Attachment::attach(&pager, session, writable, predictor).map_err(attachment_error)?;
        let a = Live {
            pmo,
            pager,
            attachment,
            writable,
        };
        let host = a.attachment.host_addr(&a.pager);
        let Some(addr) = usize::try_from(host)
            .ok()
            .and_then(|h| NonNull::new(h as *mut u8))
        else {
            let _ = a.finish();
            return Err(io::Error::other("pager window at an impossible address"));
        };
        self.live
            .locked()
            .insert(addr.as_ptr() as usize, Arc::new(a));
        Ok((addr, len))
    }

    fn sync(&self, addr: NonNull<u8>) -> io::Result<()> {
        let a = self.lookup(addr)?;
        if !a.writable {
            // Nothing can have been stored through a read-only attachment.
            return Ok(());
        }
        let pages = a.attachment.psync(&a.pager).map_err(attachment_error)?;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.synced_pages.fetch_add(pages, Ordering::Relaxed);
        Ok(())
    }

    fn detach(&self, addr: NonNull<u8>) -> io::Result<()> {
        let a = self
            .live
            .locked()
            .remove(&(addr.as_ptr() as usize))
            .ok_or_else(not_attached)?;
        a.finish()
    }
}

impl Drop for StoreBackend {
    fn drop(&mut self) {
        // Environments still open hold an Arc of the backend, so this only finds attachments
        // whose environment was leaked: take their plaintext away all the same.
        let left: Vec<Arc<Live>> = self.live.locked().drain().map(|(_, a)| a).collect();
        for a in left {
            let _ = a.finish();
        }
    }
}

/// 64-bit FNV-1a: a stable hash for PMO names (not a security property).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn not_attached() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "no PMO attached at that address",
    )
}

/// A store error for LMDB, with the errno its kind deserves.
fn store_error(e: StoreError) -> io::Error {
    let kind = match &e {
        StoreError::NotFound(_) => io::ErrorKind::NotFound,
        StoreError::Busy(_) => io::ErrorKind::ResourceBusy,
        StoreError::WrongKey | StoreError::ReadOnly => io::ErrorKind::PermissionDenied,
        StoreError::InvalidName(_) | StoreError::NameTooLong(_) | StoreError::InvalidSize(_) => {
            io::ErrorKind::InvalidInput
        }
        StoreError::Alloc(_) | StoreError::TableFull => io::ErrorKind::StorageFull,
        StoreError::TooLargeForDesign { .. } => io::ErrorKind::OutOfMemory,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e)
}

/// An attachment error for LMDB, with the errno its kind deserves.
fn attachment_error(e: AttachmentError) -> io::Error {
    match e {
        AttachmentError::Pager(e) => pager_error(e),
        AttachmentError::Store(e) => store_error(e),
        AttachmentError::Detached => not_attached(),
    }
}

/// A pager error for LMDB, with the errno its kind deserves.
fn pager_error(e: PagerError) -> io::Error {
    let kind = match &e {
        PagerError::WindowFull(_) | PagerError::Mmap(_) => io::ErrorKind::OutOfMemory,
        PagerError::BadWindowSize(_) => io::ErrorKind::InvalidInput,
        PagerError::NoSlice(_) | PagerError::Detaching(_) => io::ErrorKind::InvalidInput,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pmo_names_are_valid_store_names_and_differ_per_path() {
        let paths = [
            "/data.mdb",
            "data.mdb",
            "/tmp/db/data.mdb",
            "/tmp/db2/data.mdb",
            "/tmp/a dir with spaces and ünïcödé/data.mdb",
            "/tmp/.hidden/data.mdb",
            &format!("/tmp/{}/data.mdb", "x".repeat(300)),
        ];
        let names: Vec<String> = paths.iter().map(|p| StoreBackend::pmo_name(p)).collect();
        for (p, n) in paths.iter().zip(&names) {
            pmo_store::validate_name(n).unwrap_or_else(|e| panic!("{p}: {n}: {e}"));
        }
        assert_eq!(names[2], StoreBackend::pmo_name("/tmp/db/data.mdb"));
        assert!(names[2].starts_with("lmdb-db-"), "{}", names[2]);
        let distinct: std::collections::BTreeSet<&String> = names.iter().collect();
        assert_eq!(distinct.len(), names.len());
    }
}
