//! Every public store operation from many threads at once, under a deadlock watchdog.
//!
//! `Store` is documented as usable from several threads. `list` used to take the catalog lock
//! and then each record's, while `destroy` took a record's and then the catalog: two threads
//! running those deadlocked within seconds (defect 4 of the store's review). The lock order is
//! now catalog before record everywhere; this test drives every operation against a few shared
//! names from several threads for a fixed number of steps, and a watchdog fails the test if the
//! steps stop advancing (a hang guard, generous, not a speed assertion).

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use pmo_crypto::PAGE;
use pmo_store::{Perm, Store, StoreError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const THREADS: u64 = 6;
const STEPS: u64 = 2000;
const NAMES: [&str; 3] = ["a", "b", "c"];

/// One step of a worker: an operation picked by `x` on a name picked by `x`. Every outcome the
/// store may legitimately give under contention is accepted; anything else fails the test.
fn step(s: &Store, x: u64) {
    let name = NAMES[(x % 3) as usize];
    let k = key("k");
    let ok_or = |r: Result<(), StoreError>| match r {
        Ok(())
        | Err(StoreError::NotFound(_))
        | Err(StoreError::Exists(_))
        | Err(StoreError::Busy(_)) => {}
        Err(e) => panic!("{name}: unexpected {e}"),
    };
    match (x / 3) % 9 {
        0 => ok_or(s.create_pmo(name, 8 * PAGE as u64, &k)),
        1 => ok_or(s.destroy_pmo(name, &k)),
        2 => {
            let l = s.list();
            assert!(l.windows(2).all(|w| w[0].name < w[1].name), "list order");
        }
        3 => ok_or(s.attach(name, Perm::Write, &k).and_then(|w| {
            let p = x % 8;
            w.psync([(p, &page_of(x as u8, p))])?;
            let mut out = [0u8; PAGE];
            w.fault(p, &mut out)?;
            assert_eq!(out, page_of(x as u8, p));
            w.detach().wait()
        })),
        4 => ok_or(s.attach(name, Perm::Read, &k).and_then(|r| {
            let mut out = [0u8; PAGE];
            r.fault(x % 8, &mut out)?;
            // Dropped without detach: the crash handler runs.
            Ok(())
        })),
        5 => ok_or(s.verify_pmo(name, &k, &mut |_, _| {}).map(|bad| {
            assert!(bad.is_empty(), "{name}: pages failed: {bad:?}");
        })),
        // fsck reads trees that a concurrent psync may be rewriting: only that it returns is
        // checked here; the final fsck, with every thread done, must be clean.
        6 => {
            let _ = s.fsck();
        }
        7 => {
            let _ = (s.free_bytes(), s.catalog_version(), s.commit_counter());
        }
        _ => ok_or(match s.attach(name, Perm::Write, &k) {
            // A writer left attached while others try everything else.
            Ok(w) => {
                std::thread::yield_now();
                w.detach().wait()
            }
            Err(e) => Err(e),
        }),
    }
}

/// Fails the test (the whole process: deadlocked threads cannot be joined) when `done` stops
/// moving for a minute before `finished` is set.
fn watchdog(done: Arc<AtomicU64>, finished: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let mut last = (0, Instant::now());
        while !finished.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(100));
            let now = done.load(Ordering::Acquire);
            if now != last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() > Duration::from_secs(60) {
                eprintln!("store operations made no progress for 60 s after {now} steps: deadlock");
                std::process::abort();
            }
        }
    });
}

#[test]
fn every_store_operation_from_many_threads_never_deadlocks() {
    let (_m, s) = fresh(MEDIUM);
    let done = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicBool::new(false));
    watchdog(done.clone(), finished.clone());
    std::thread::scope(|sc| {
        for t in 0..THREADS {
            let (s, done) = (s.clone(), done.clone());
            sc.spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
                for _ in 0..STEPS {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    step(&s, x);
                    done.fetch_add(1, Ordering::AcqRel);
                }
            });
        }
    });
    finished.store(true, Ordering::Release);
    assert_eq!(done.load(Ordering::Acquire), THREADS * STEPS);
    assert!(s.fsck().problems.is_empty());
}
