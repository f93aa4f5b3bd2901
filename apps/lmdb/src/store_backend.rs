//! [`StoreBackend`]: LMDB data files as PMOs of the real store, served through the real
//! userfaultfd pager by a [`PmoHost`]. This file only maps LMDB's data-file paths to PMO names;
//! attaching, psyncing and detaching are the host's (`apps/pmo-host`). The threads running
//! LMDB play the vCPUs: their first touch of a page is a fault that the pager's threads answer
//! with the page decrypted and verified by the store session; a sync collects the pages
//! written since the last one and psyncs them atomically.

use std::io;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

use pmo_crypto::UserKey;
use pmo_host::PmoHost;
use pmo_pager::SliceStats;
use pmo_store::Store;

use crate::pmo::PmoBackend;

/// How [`StoreBackend`] creates and attaches its PMOs (the host's configuration).
pub type StoreConfig = pmo_host::HostConfig;

/// Errors of setting up a [`StoreBackend`] or of its store operations.
pub type BackendError = pmo_host::HostError;

/// A [`PmoBackend`] over a PMO store: one PMO per LMDB data file, created under the backend's
/// key on first attach, all attachments in the host's pager window.
pub struct StoreBackend {
    host: PmoHost,
}

impl StoreBackend {
    /// A backend on `store` whose PMOs are created and opened with `key`.
    pub fn new(store: Store, key: UserKey, config: StoreConfig) -> Result<Self, BackendError> {
        Ok(Self::from_host(PmoHost::new(store, key, config)?))
    }

    /// A backend on the store in file `path`: opened (and recovered) if it exists, else
    /// created with `len` bytes and formatted. `key` is the user key of its PMOs.
    pub fn open_file(
        path: &Path,
        len: u64,
        key: &[u8],
        config: StoreConfig,
    ) -> Result<Self, BackendError> {
        Ok(Self::from_host(PmoHost::open_file(path, len, key, config)?))
    }

    /// A backend on `host` (whose measurements then include LMDB's attach, sync and detach).
    pub fn from_host(host: PmoHost) -> Self {
        StoreBackend { host }
    }

    /// The host behind the backend.
    pub fn host(&self) -> &PmoHost {
        &self.host
    }

    /// The store.
    pub fn store(&self) -> &Store {
        self.host.store()
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
        self.host.destroy(pmo)
    }

    /// The pager's counters of the attached PMO `pmo`, if it is attached.
    pub fn slice_stats(&self, pmo: &str) -> Option<Arc<SliceStats>> {
        self.host.slice_stats(pmo)
    }

    /// Psyncs so far (one per successful [`PmoBackend::sync`] of a writable attachment).
    pub fn syncs(&self) -> u64 {
        self.host.measurements().psyncs
    }

    /// Dirty pages all psyncs so far wrote.
    pub fn synced_pages(&self) -> u64 {
        self.host.measurements().psync_pages
    }
}

impl PmoBackend for StoreBackend {
    fn attach(&self, name: &str, size: usize, writable: bool) -> io::Result<(NonNull<u8>, usize)> {
        let pmo = Self::pmo_name(name);
        Ok(self.host.attach(&pmo, writable, writable.then_some(size))?)
    }

    fn sync(&self, addr: NonNull<u8>) -> io::Result<()> {
        self.host.sync(addr)?;
        Ok(())
    }

    fn detach(&self, addr: NonNull<u8>) -> io::Result<()> {
        Ok(self.host.detach(addr)?)
    }
}

/// 64-bit FNV-1a: a stable hash for PMO names (not a security property).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
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
