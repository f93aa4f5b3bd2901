//! Tests on real files: stock LMDB on a directory, and LMDB on a PMO of a real store file
//! served through a real userfaultfd window (the test threads are the vCPUs).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pmo_crypto::KdfParams;
use pmo_store::Design;

use crate::{Env, StoreBackend, StoreConfig};

mod crash;
mod limits;
mod round_trip;

/// A directory removed on drop; on tmpfs when there is one (like the harness: a DRAM-backed
/// store file, so psync does not time a disk).
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("lmdb-pmo-{}-{seq}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The store file of a test: room for a 16 MiB PMO (primaries, tree, journal) and more.
pub(crate) const STORE_LEN: u64 = 96 << 20;
/// The tenant's key.
pub(crate) const KEY: &[u8] = b"lmdb-pmo test key";
/// Map size (= PMO size) of the tests' environments.
pub(crate) const MAP: usize = 16 << 20;

/// Cheap key derivation: tests attach hundreds of times.
pub(crate) fn config(design: Design) -> StoreConfig {
    StoreConfig {
        design,
        kdf: KdfParams::INSECURE_FAST,
        ..StoreConfig::default()
    }
}

/// A backend on the store file `path` (created, or opened and recovered).
pub(crate) fn backend(path: &Path, design: Design) -> Arc<StoreBackend> {
    Arc::new(StoreBackend::open_file(path, STORE_LEN, KEY, config(design)).unwrap())
}

/// An environment on a PMO of a fresh store handle on `store` (the previous handle must be
/// gone: one owner per store file).
pub(crate) fn open_pmo(store: &Path, db: &Path, design: Design) -> Env {
    Env::builder()
        .map_size(MAP)
        .open_pmo(db, backend(store, design))
        .unwrap()
}

pub(crate) fn key(i: usize) -> Vec<u8> {
    format!("user{i:08}").into_bytes()
}

/// A value of 60 to 160 bytes that names its key and a generation.
pub(crate) fn value(i: usize, gen: u32) -> Vec<u8> {
    let mut v = format!("value of {i} gen {gen}:").into_bytes();
    v.resize(60 + (i * 37) % 100, b'a' + (i % 26) as u8);
    v
}

/// Puts keys `range` with generation `gen`, `per_txn` to a committed transaction.
pub(crate) fn load(env: &Env, range: std::ops::Range<usize>, gen: u32, per_txn: usize) {
    let keys: Vec<usize> = range.collect();
    for chunk in keys.chunks(per_txn) {
        let mut t = env.write_txn().unwrap();
        for &i in chunk {
            t.put(&key(i), &value(i, gen)).unwrap();
        }
        t.commit().unwrap();
    }
}

/// Checks that the database holds exactly `want` (index, generation), in key order, through
/// both `get` and a chunked `scan`, and that its entry count agrees.
pub(crate) fn expect_exactly(env: &Env, want: &[(usize, u32)]) {
    let r = env.read_txn().unwrap();
    for &(i, gen) in want {
        assert_eq!(r.get(&key(i)).unwrap(), Some(&value(i, gen)[..]), "key {i}");
    }
    let mut seen = Vec::new();
    let mut start = Vec::new();
    loop {
        let batch = r.scan(&start, 777).unwrap();
        // Each batch after the first begins with the last key of the one before.
        let skip = usize::from(!seen.is_empty());
        if batch.len() <= skip {
            break;
        }
        for (k, v) in &batch[skip..] {
            seen.push((k.to_vec(), v.to_vec()));
        }
        start = batch[batch.len() - 1].0.to_vec();
    }
    let want_kv: Vec<(Vec<u8>, Vec<u8>)> =
        want.iter().map(|&(i, g)| (key(i), value(i, g))).collect();
    assert_eq!(seen.len(), want_kv.len(), "records found by scan");
    assert!(seen == want_kv, "scan differs from the expected records");
    drop(r);
    assert_eq!(env.stat().unwrap().entries, want.len());
}

/// Whether `needle` occurs in the file at `path`.
pub(crate) fn file_contains(path: &Path, needle: &[u8]) -> bool {
    let hay = std::fs::read(path).unwrap();
    hay.windows(needle.len()).any(|w| w == needle)
}
