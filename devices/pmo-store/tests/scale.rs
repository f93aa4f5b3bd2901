//! Scale: a full 65,536-slot table of PMOs, and open cost independent of data size.

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use pmo_crypto::PAGE;
use pmo_media::{CrashMedium, FileMedium, Medium, MediumError};
use pmo_store::{Perm, Store, StoreError, StoreOptions, DEFAULT_SLOTS};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counts bytes read, to show what `open` touches.
struct Counting<M> {
    inner: M,
    read: AtomicU64,
}

impl<M: Medium> Medium for Counting<M> {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), MediumError> {
        self.read.fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.inner.read(off, buf)
    }
    fn write(&self, off: u64, data: &[u8]) -> Result<(), MediumError> {
        self.inner.write(off, data)
    }
    fn persist(&self, off: u64, len: u64) -> Result<(), MediumError> {
        self.inner.persist(off, len)
    }
}

fn bytes_read_by_open(pmo_pages: u64) -> u64 {
    let (m, s) = fresh(40 << 20);
    s.create_pmo("p", pmo_pages * PAGE as u64, &key("k"))
        .unwrap();
    let w = s.attach("p", Perm::Write, &key("k")).unwrap();
    let page = page_of(1, 0);
    w.psync((0..pmo_pages).map(|p| (p, &page))).unwrap();
    w.detach().wait().unwrap();
    let c = Arc::new(Counting {
        inner: CrashMedium::from_image(m.snapshot()),
        read: AtomicU64::new(0),
    });
    let (s2, rep) = Store::open(c.clone() as Arc<dyn Medium>).unwrap();
    assert!(rep.actions.is_empty());
    assert_eq!(s2.list().len(), 1);
    c.read.load(Ordering::Relaxed)
}

#[test]
fn open_reads_the_same_bytes_whatever_the_data_size() {
    let small = bytes_read_by_open(1);
    let big = bytes_read_by_open(2048); // 8 MiB of data
    assert_eq!(small, big);
    assert!(small < 64 << 10, "open read {small} bytes");
}

#[test]
fn a_full_table_of_65536_pmos() {
    let dir = std::path::Path::new("/dev/shm");
    let dir = if dir.is_dir() {
        dir.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(format!("pmo-scale-{}", std::process::id()));
    let m: Arc<dyn Medium> = Arc::new(FileMedium::create(&path, 6 << 30).unwrap());
    let s = Store::create(
        m,
        StoreOptions {
            kdf: pmo_crypto::KdfParams::INSECURE_FAST,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    assert_eq!(s.superblock().slots, DEFAULT_SLOTS);
    let k = key("k");
    for i in 0..DEFAULT_SLOTS {
        s.create_pmo(&format!("p{i}"), PAGE as u64, &k).unwrap();
    }
    assert!(matches!(
        s.create_pmo("one-more", PAGE as u64, &k),
        Err(StoreError::TableFull)
    ));
    drop(s);
    let m: Arc<dyn Medium> = Arc::new(FileMedium::open(&path).unwrap());
    let (s, rep) = Store::open(m).unwrap();
    assert_eq!(rep.pmos, DEFAULT_SLOTS as usize);
    let last = format!("p{}", DEFAULT_SLOTS - 1);
    let w = s.attach(&last, Perm::Write, &k).unwrap();
    w.psync([(0u64, &page_of(3, 0))]).unwrap();
    w.detach().wait().unwrap();
    s.destroy_pmo("p0", &k).unwrap();
    s.create_pmo("again", PAGE as u64, &k).unwrap();
    drop(s);
    std::fs::remove_file(&path).unwrap();
}

/// A 64 GiB PMO in a sparse store file costs almost nothing until written.
#[test]
fn a_64_gib_pmo_is_sparse() {
    use std::os::unix::fs::MetadataExt;
    let path = std::env::temp_dir().join(format!("pmo-64g-{}", std::process::id()));
    let m: Arc<dyn Medium> = Arc::new(FileMedium::create(&path, 140 << 30).unwrap());
    let s = Store::create(m, fast_options(16)).unwrap();
    let k = key("k");
    s.create_pmo("big", 64 << 30, &k).unwrap();
    let w = s.attach("big", Perm::Write, &k).unwrap();
    let last = (64u64 << 30) / PAGE as u64 - 1;
    w.psync([(0u64, &page_of(1, 0)), (last, &page_of(1, last))])
        .unwrap();
    let mut out = [0u8; PAGE];
    w.fault(last, &mut out).unwrap();
    assert_eq!(out, page_of(1, last));
    w.fault(last / 2, &mut out).unwrap();
    assert_eq!(out, [0u8; PAGE]);
    w.detach().wait().unwrap();
    drop(s);
    let used = std::fs::metadata(&path).unwrap().blocks() * 512;
    assert!(
        used < 8 << 20,
        "a 64 GiB PMO with 2 pages written uses {used} bytes"
    );
    std::fs::remove_file(&path).unwrap();
}
