//! put / get / del / scan, 10,000 keys over several transactions, abort, close and reopen:
//! the same sequence on stock LMDB and on a PMO.

use std::path::Path;
use std::sync::atomic::Ordering;

use pmo_store::Design;

use super::*;
use crate::Error;

/// The whole sequence; `open` opens the same environment afresh each time it is called.
fn round_trip(open: &dyn Fn() -> Env) {
    {
        let env = open();
        let mut t = env.write_txn().unwrap();
        t.put(b"b", b"2").unwrap();
        t.put(b"a", b"1").unwrap();
        t.put(b"c", b"3").unwrap();
        t.put(b"c", b"33").unwrap();
        assert_eq!(t.get(b"a").unwrap(), Some(&b"1"[..]));
        assert!(t.del(b"b").unwrap());
        assert!(!t.del(b"b").unwrap());
        assert_eq!(t.get(b"b").unwrap(), None);
        let all = t.scan(b"", 10).unwrap();
        assert_eq!(all, vec![(&b"a"[..], &b"1"[..]), (&b"c"[..], &b"33"[..])]);
        assert_eq!(t.scan(b"b", 10).unwrap(), vec![(&b"c"[..], &b"33"[..])]);
        assert_eq!(t.scan(b"a", 0).unwrap(), vec![]);
        t.commit().unwrap();
        // Not visible before commit to a reader; nothing of an aborted txn survives.
        let mut t = env.write_txn().unwrap();
        t.put(b"zz", b"x").unwrap();
        assert!(t.del(b"a").unwrap());
        t.abort();
        let mut t = env.write_txn().unwrap();
        t.put(b"zy", b"y").unwrap();
        drop(t);
        let r = env.read_txn().unwrap();
        assert_eq!(r.get(b"zz").unwrap(), None);
        assert_eq!(r.get(b"zy").unwrap(), None);
        assert_eq!(r.get(b"a").unwrap(), Some(&b"1"[..]));
        assert_eq!(r.scan(b"", 10).unwrap().len(), 2);
        drop(r);
        // A nested write txn on this thread is an error, not a deadlock.
        let t = env.write_txn().unwrap();
        assert!(matches!(env.write_txn(), Err(Error::NestedWrite)));
        drop(t);
        let mut t = env.write_txn().unwrap();
        assert!(t.del(b"a").unwrap() && t.del(b"c").unwrap());
        t.commit().unwrap();
        // 10,000 keys over ten transactions, then overwrite some and delete others.
        let before = env.info().unwrap().last_txn;
        load(&env, 0..10_000, 1, 1_000);
        assert_eq!(env.info().unwrap().last_txn, before + 10);
        let mut t = env.write_txn().unwrap();
        for i in (0..10_000).step_by(7) {
            t.put(&key(i), &value(i, 2)).unwrap();
        }
        for i in (3..10_000).step_by(11) {
            assert!(t.del(&key(i)).unwrap());
        }
        t.commit().unwrap();
        let r = env.read_txn().unwrap();
        let got = r.scan(&key(4321), 3).unwrap();
        let want: Vec<Vec<u8>> = [4321, 4322, 4323].iter().map(|&i| key(i)).collect();
        assert_eq!(
            got.iter().map(|(k, _)| k.to_vec()).collect::<Vec<_>>(),
            want
        );
        // Past the end: fewer records.
        assert_eq!(r.scan(&key(9_998), 10).unwrap().len(), 2);
        assert_eq!(r.scan(b"zzz", 10).unwrap().len(), 0);
        drop(r);
        expect_exactly(&env, &expected());
        let s = env.stat().unwrap();
        assert_eq!(s.page_size, 4096);
        assert!(s.depth >= 2 && s.leaf_pages > 10, "{s:?}");
    }
    let env = open();
    expect_exactly(&env, &expected());
}

/// What the sequence above leaves.
fn expected() -> Vec<(usize, u32)> {
    (0..10_000)
        .filter(|i| i % 11 != 3)
        .map(|i| (i, if i % 7 == 0 { 2 } else { 1 }))
        .collect()
}

#[test]
fn stock_lmdb_on_a_directory_round_trips_and_reopens() {
    let dir = TempDir::new("dir");
    let db = dir.path().join("db");
    round_trip(&|| Env::builder().map_size(MAP).open_dir(&db).unwrap());
    // The baseline keeps its data in a plaintext file (what the PMO avoids).
    assert!(file_contains(&db.join("data.mdb"), &value(42, 1)));
}

#[test]
fn lmdb_on_a_pmo_round_trips_and_reopens_through_a_fresh_store() {
    let dir = TempDir::new("pmo");
    let store = dir.path().join("store.img");
    let db = dir.path().join("db");
    round_trip(&|| open_pmo(&store, &db, Design::D));
    // The data file is the PMO: only the lock file is in the directory, and the store file
    // holds none of the values in plaintext.
    assert!(!db.join("data.mdb").exists());
    assert!(db.join("lock.mdb").exists());
    assert!(!file_contains(&store, &value(42, 1)));
    // One PMO, of the map size, named after the directory.
    let b = backend(&store, Design::D);
    let name = StoreBackend::pmo_name_for_dir(&db).unwrap();
    let pmos = b.store().list();
    assert_eq!(pmos.len(), 1);
    assert_eq!(
        (pmos[0].name.as_str(), pmos[0].size),
        (name.as_str(), MAP as u64)
    );
    assert!(name.starts_with("lmdb-db-"), "{name}");
}

#[test]
fn every_design_keeps_committed_data_across_a_reopen() {
    let dir = TempDir::new("designs");
    for design in Design::ON_ANY_MEDIUM {
        let store = dir.path().join(format!("{}.img", design.name()));
        let db = dir.path().join(format!("db-{}", design.name()));
        {
            let env = open_pmo(&store, &db, design);
            assert_eq!(env.info().unwrap().map_size, MAP);
            load(&env, 0..600, 1, 200);
            load(&env, 0..600, 2, 300);
        }
        let env = open_pmo(&store, &db, design);
        let want: Vec<(usize, u32)> = (0..600).map(|i| (i, 2)).collect();
        expect_exactly(&env, &want);
    }
}

#[test]
fn a_prefetching_design_serves_readers_on_other_threads_while_a_writer_commits() {
    let dir = TempDir::new("threads");
    let store = dir.path().join("store.img");
    let db = dir.path().join("db");
    {
        let env = open_pmo(&store, &db, Design::D);
        load(&env, 0..4_000, 1, 1_000);
    }
    let b = Arc::new(
        StoreBackend::open_file(
            &store,
            STORE_LEN,
            KEY,
            StoreConfig {
                predictor: pmo_policies::PredictorSpec::Stream(4),
                ..config(Design::D)
            },
        )
        .unwrap(),
    );
    let env = Env::builder().open_pmo(&db, b.clone()).unwrap();
    std::thread::scope(|s| {
        for t in 0..2 {
            let env = &env;
            s.spawn(move || {
                for round in 0..3 {
                    // A snapshot: generation 1 everywhere or, once the writer committed,
                    // generation 2 everywhere below 4,000.
                    let r = env.read_txn().unwrap();
                    let first = r.get(&key(0)).unwrap().unwrap().to_vec();
                    let gen = if first == value(0, 1) { 1 } else { 2 };
                    let all = r.scan(b"", 10_000).unwrap();
                    assert!(all.len() >= 4_000, "thread {t} round {round}");
                    for (i, (k, v)) in all.iter().take(4_000).enumerate() {
                        assert_eq!((k.to_vec(), v.to_vec()), (key(i), value(i, gen)));
                    }
                }
            });
        }
        let mut t = env.write_txn().unwrap();
        for i in 0..4_000 {
            t.put(&key(i), &value(i, 2)).unwrap();
        }
        t.commit().unwrap();
    });
    // The pages came through the window: faults, decryptions and some prefetching.
    let name = StoreBackend::pmo_name_for_dir(&db).unwrap();
    let st = b.slice_stats(&name).unwrap();
    assert!(st.faults.load(Ordering::Relaxed) > 0);
    // Predicted pages arrived ahead (prefetched) or, when the worker lagged, were faulted on
    // late: either way the predictor ran on this attachment.
    let predicted =
        st.pages_prefetched.load(Ordering::Relaxed) + st.prefetch_late.load(Ordering::Relaxed);
    assert!(predicted > 0);
    assert!(st.wp_faults.load(Ordering::Relaxed) > 0);
    drop(env);
    assert!(b.slice_stats(&name).is_none(), "detached at close");
    let want: Vec<(usize, u32)> = (0..4_000).map(|i| (i, 2)).collect();
    drop(b);
    expect_exactly(&open_pmo(&store, &db, Design::D), &want);
}

/// The path spelling does not matter: `db/../db` opens the same PMO.
#[test]
fn another_spelling_of_the_directory_opens_the_same_pmo() {
    let dir = TempDir::new("spelling");
    let store = dir.path().join("store.img");
    let db = dir.path().join("db");
    {
        let env = open_pmo(&store, &db, Design::SpId);
        load(&env, 0..10, 1, 10);
    }
    let other = Path::new(&db).join("..").join("db");
    let env = open_pmo(&store, &other, Design::SpId);
    expect_exactly(&env, &(0..10).map(|i| (i, 1)).collect::<Vec<_>>());
}
