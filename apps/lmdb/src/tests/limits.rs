//! A full PMO, backend failures at open, and what does (not) sync.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use pmo_store::{Design, StoreError};

use super::*;
use crate::{Error, PmoBackend};

#[test]
fn a_full_pmo_is_map_full_and_the_committed_data_stays() {
    let dir = TempDir::new("full");
    let store = dir.path().join("store.img");
    let db = dir.path().join("db");
    let b = backend(&store, Design::D);
    let env = Env::builder()
        .map_size(64 << 10)
        .open_pmo(&db, b.clone())
        .unwrap();
    assert_eq!(env.info().unwrap().map_size, 64 << 10);
    let mut committed = 0;
    let err = 'fill: loop {
        let mut t = env.write_txn().unwrap();
        for i in committed..committed + 10 {
            if let Err(e) = t.put(&key(i), &value(i, 1)) {
                break 'fill e;
            }
        }
        if let Err(e) = t.commit() {
            break 'fill e;
        }
        committed += 10;
        assert!(committed < 10_000, "64 KiB never filled up");
    };
    assert!(matches!(err, Error::MapFull), "{err}");
    assert_eq!(err.code(), Some(-30792));
    assert!(committed > 0);
    let want: Vec<(usize, u32)> = (0..committed).map(|i| (i, 1)).collect();
    expect_exactly(&env, &want);
    // Still usable: deleting frees room for another commit.
    let mut t = env.write_txn().unwrap();
    assert!(t.del(&key(0)).unwrap());
    t.commit().unwrap();
    drop(env);
    let env = Env::builder().open_pmo(&db, b).unwrap();
    expect_exactly(&env, &want[1..]);
}

#[test]
fn a_backend_failure_at_open_is_the_backends_error() {
    let dir = TempDir::new("refused");
    let store = dir.path().join("store.img");
    let b = backend(&store, Design::D);
    // Larger than the whole store: the store refuses the PMO.
    let err = Env::builder()
        .map_size(STORE_LEN as usize * 2)
        .open_pmo(&dir.path().join("db"), b.clone())
        .err()
        .unwrap();
    match &err {
        Error::Backend(e) => {
            assert_eq!(e.kind(), io::ErrorKind::StorageFull, "{e}");
            let inner = e.get_ref().and_then(|i| i.downcast_ref::<StoreError>());
            assert!(matches!(inner, Some(StoreError::Alloc(_))), "{e}");
        }
        e => panic!("not the backend's error: {e}"),
    }
    assert!(b.store().list().is_empty());
    // The same store still serves a PMO that fits.
    let env = Env::builder().open_pmo(&dir.path().join("db"), b).unwrap();
    load(&env, 0..5, 1, 5);
}

/// Counts the syncs LMDB asks for.
struct Counting {
    inner: StoreBackend,
    syncs: AtomicU64,
}

impl PmoBackend for Counting {
    fn attach(&self, name: &str, size: usize, writable: bool) -> io::Result<(NonNull<u8>, usize)> {
        self.inner.attach(name, size, writable)
    }
    fn sync(&self, addr: NonNull<u8>) -> io::Result<()> {
        self.syncs.fetch_add(1, Ordering::SeqCst);
        self.inner.sync(addr)
    }
    fn detach(&self, addr: NonNull<u8>) -> io::Result<()> {
        self.inner.detach(addr)
    }
}

#[test]
fn reads_never_sync_and_each_commit_syncs_once() {
    let dir = TempDir::new("syncs");
    let store = dir.path().join("store.img");
    let db = dir.path().join("db");
    {
        let env = open_pmo(&store, &db, Design::D);
        load(&env, 0..3_000, 1, 1_000);
    }
    let c = Arc::new(Counting {
        inner: StoreBackend::open_file(&store, STORE_LEN, KEY, config(Design::D)).unwrap(),
        syncs: AtomicU64::new(0),
    });
    let env = Env::builder().open_pmo(&db, c.clone()).unwrap();
    let name = StoreBackend::pmo_name_for_dir(&db).unwrap();
    let st = c.inner.slice_stats(&name).unwrap();
    assert_eq!(c.syncs.load(Ordering::SeqCst), 0, "opening an existing env");
    let want: Vec<(usize, u32)> = (0..3_000).map(|i| (i, 1)).collect();
    expect_exactly(&env, &want);
    std::thread::scope(|s| {
        s.spawn(|| expect_exactly(&env, &want));
    });
    // The reads went through the window (demand faults) and wrote nothing to it.
    assert!(st.faults.load(Ordering::Relaxed) > 0);
    assert_eq!(st.wp_faults.load(Ordering::Relaxed), 0);
    assert_eq!(c.syncs.load(Ordering::SeqCst), 0, "reads");
    assert_eq!(c.inner.syncs(), 0);
    // A write transaction without changes commits without a sync; one with changes, one.
    env.write_txn().unwrap().commit().unwrap();
    assert_eq!(c.syncs.load(Ordering::SeqCst), 0, "empty commit");
    let mut t = env.write_txn().unwrap();
    t.put(&key(7), &value(7, 2)).unwrap();
    t.commit().unwrap();
    assert_eq!(c.syncs.load(Ordering::SeqCst), 1, "one commit");
    assert_eq!(c.inner.syncs(), 1);
    // It wrote the pages of one B-tree path, the free list and the meta page: a handful.
    let pages = c.inner.synced_pages();
    assert!((2..=16).contains(&pages), "{pages} pages");
    // An aborted one: nothing.
    let mut t = env.write_txn().unwrap();
    t.put(&key(8), &value(8, 2)).unwrap();
    t.abort();
    assert_eq!(c.syncs.load(Ordering::SeqCst), 1, "abort");
}
