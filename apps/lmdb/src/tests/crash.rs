//! The durability boundary, with real crashes: a child process (this test binary, running only
//! the test below) writes, then dies by `_exit` at a chosen instant: no detach, no psync of
//! anything after its last sync, no close. The parent opens the store file afresh (recovery)
//! and must find exactly the committed transactions.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use pmo_store::Design;

use super::*;
use crate::PmoBackend;

/// Set in the child: which crash to stage.
const MODE: &str = "LMDB_PMO_CRASH_MODE";
/// Set in the child: the test's directory.
const DIR: &str = "LMDB_PMO_CRASH_DIR";
/// The child's exit status at its crash point (anything else: it failed before).
const CRASHED: i32 = 77;

/// Dies at the crash point (skipping every destructor, like a killed process).
fn crash() -> ! {
    // SAFETY: _exit ends the process at once; nothing of ours runs afterwards.
    unsafe { libc::_exit(CRASHED) }
}

/// Around the real backend: when armed, dies on the next sync, before or after it ran.
struct DieInSync {
    inner: StoreBackend,
    armed: AtomicBool,
    after: bool,
}

impl PmoBackend for DieInSync {
    fn attach(&self, name: &str, size: usize, writable: bool) -> io::Result<(NonNull<u8>, usize)> {
        self.inner.attach(name, size, writable)
    }
    fn sync(&self, addr: NonNull<u8>) -> io::Result<()> {
        let armed = self.armed.load(Ordering::SeqCst);
        if armed && !self.after {
            crash();
        }
        self.inner.sync(addr)?;
        if armed {
            crash();
        }
        Ok(())
    }
    fn detach(&self, addr: NonNull<u8>) -> io::Result<()> {
        self.inner.detach(addr)
    }
}

/// The child's work: transaction 1 (keys 0..1000, generation 1) committed, then transaction 2
/// (keys 500..1500 at generation 2, and every fifth key below 500 deleted), then the crash.
fn child(mode: &str, dir: &Path) -> ! {
    let store = dir.join("store.img");
    let db = dir.join("db");
    let b = Arc::new(DieInSync {
        inner: StoreBackend::open_file(&store, STORE_LEN, KEY, config(Design::D)).unwrap(),
        armed: AtomicBool::new(false),
        after: mode == "after-sync",
    });
    let env = Env::builder()
        .map_size(MAP)
        .open_pmo(&db, b.clone())
        .unwrap();
    load(&env, 0..1_000, 1, 1_000);
    let mut t = env.write_txn().unwrap();
    for i in 500..1_500 {
        t.put(&key(i), &value(i, 2)).unwrap();
    }
    for i in (0..500).step_by(5) {
        assert!(t.del(&key(i)).unwrap());
    }
    match mode {
        // The transaction's pages are in the window, dirty; nothing made them durable.
        "uncommitted" => crash(),
        // Committed (its one sync done), then the process dies before any close.
        "committed" => {
            t.commit().unwrap();
            crash()
        }
        // The commit's sync dies before (its meta page is in the window only) or after
        // psyncing.
        "before-sync" | "after-sync" => {
            b.armed.store(true, Ordering::SeqCst);
            let _ = t.commit();
            unreachable!("the commit's sync crashes the process");
        }
        m => panic!("unknown crash mode {m}"),
    }
}

/// What the database holds after the crash: transaction 1 alone, or both.
fn expected(both: bool) -> Vec<(usize, u32)> {
    if !both {
        return (0..1_000).map(|i| (i, 1)).collect();
    }
    (0..1_500)
        .filter(|i| *i >= 500 || i % 5 != 0)
        .map(|i| (i, if i >= 500 { 2 } else { 1 }))
        .collect()
}

#[test]
fn a_crash_keeps_exactly_the_committed_transactions() {
    if let Ok(mode) = std::env::var(MODE) {
        let dir = std::env::var(DIR).unwrap();
        child(&mode, Path::new(&dir));
    }
    let test = format!(
        "{}::a_crash_keeps_exactly_the_committed_transactions",
        module_path!().split_once("::").unwrap().1
    );
    for (mode, both) in [
        ("uncommitted", false),
        ("before-sync", false),
        ("after-sync", true),
        ("committed", true),
    ] {
        let dir = TempDir::new(mode);
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([&test, "--exact", "--nocapture", "--test-threads=1"])
            .env(MODE, mode)
            .env(DIR, dir.path())
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(CRASHED),
            "{mode}: the child did not reach its crash point:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // A fresh store handle: recovery runs, then LMDB reads what the PMO holds.
        let env = open_pmo(
            &dir.path().join("store.img"),
            &dir.path().join("db"),
            Design::D,
        );
        expect_exactly(&env, &expected(both));
        // And it is writable again.
        load(&env, 2_000..2_010, 3, 10);
        assert_eq!(env.stat().unwrap().entries, expected(both).len() + 10);
    }
}
