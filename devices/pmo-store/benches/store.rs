//! Store benchmarks: page cipher per suite, fault and psync per page, attach/detach vs PMO size.
//!
//! The medium is a sparse file on /dev/shm (tmpfs: msync is free), so these figures are the
//! crypto + copy + metadata cost of the store, not of a disk. Run with `cargo bench -p pmo-store`;
//! select a group with e.g. `cargo bench -p pmo-store -- cipher`. The `paper` suite (the
//! authors' scheme) comes from the harness's benchmark suites.

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pmo_crypto::{KeyParams, PageId, PmoKeys, Suite, UserKey, XtsCipher, PAGE};
use pmo_media::{FileMedium, Medium};
use pmo_store::{CreateOptions, Design, Perm, Store, StoreOptions};
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const SUITES: [Suite; 3] = [Suite::XtsBlake3, pmo_bench_suites::PAPER, Suite::AesGcm];

fn keys(suite: Suite) -> PmoKeys {
    PmoKeys::derive(
        &UserKey::new(b"bench").unwrap(),
        KeyParams::generate(suite, pmo_crypto::KdfParams::INSECURE_FAST).unwrap(),
        &pmo_bench_suites::suites(),
    )
    .unwrap()
}

fn name(suite: Suite) -> &'static str {
    pmo_bench_suites::suites()
        .name_of(suite)
        .unwrap_or("unknown")
}

fn cipher(c: &mut Criterion) {
    let mut g = c.benchmark_group("cipher");
    g.throughput(Throughput::Bytes(PAGE as u64));
    for suite in SUITES {
        let k = keys(suite);
        let id = PageId {
            uid: 1,
            page: 7,
            version: 3,
            gen: [1; 16],
        };
        let mut page = [0x5au8; PAGE];
        g.bench_function(BenchmarkId::new("seal", name(suite)), |b| {
            b.iter(|| black_box(k.seal_page(id, &mut page).unwrap()))
        });
        let mut ct = [0x5au8; PAGE];
        let tag = k.seal_page(id, &mut ct).unwrap();
        g.bench_function(BenchmarkId::new("open", name(suite)), |b| {
            b.iter(|| {
                let mut p = ct;
                k.open_page(id, &mut p, &tag).unwrap();
                black_box(p[0])
            })
        });
    }
    let x = XtsCipher::new(&[7u8; 64]);
    let mut page = [1u8; PAGE];
    g.bench_function("xts-only/batched", |b| {
        b.iter(|| x.encrypt([3; 16], black_box(&mut page)).unwrap())
    });
    {
        use aes::cipher::KeyInit;
        let reference = xts_mode::Xts128::<aes::Aes256>::new(
            aes::Aes256::new_from_slice(&[7u8; 32]).unwrap(),
            aes::Aes256::new_from_slice(&[8u8; 32]).unwrap(),
        );
        g.bench_function("xts-only/xts-mode-crate", |b| {
            b.iter(|| reference.encrypt_sector(black_box(&mut page), [3u8; 16].into()))
        });
    }
    g.finish();
}

fn bench_dir() -> PathBuf {
    let d = PathBuf::from("/dev/shm").join(format!("pmo-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn store_with(len: u64, name: &str) -> (Store, PathBuf) {
    let dir = bench_dir();
    let path = dir.join(name);
    let m: Arc<dyn Medium> = Arc::new(FileMedium::create(&path, len).unwrap());
    (
        Store::create(
            m,
            StoreOptions {
                slots: Some(64),
                kdf: pmo_crypto::KdfParams::INSECURE_FAST,
                suites: pmo_bench_suites::suites(),
                ..Default::default()
            },
        )
        .unwrap(),
        path,
    )
}

/// Writes every page of `name` once (so faults decrypt real ciphertext).
fn fill(s: &Store, name: &str, npages: u64) {
    let k = UserKey::new(b"k").unwrap();
    let w = s
        .attach_with(name, Perm::Write, &k, Some(Design::D))
        .unwrap();
    let page = [0x42u8; PAGE];
    let chunk = 4096u64;
    let mut p = 0;
    while p < npages {
        let end = (p + chunk).min(npages);
        w.psync((p..end).map(|i| (i, &page))).unwrap();
        p = end;
    }
    w.detach().wait().unwrap();
}

/// A 1 GiB store holding PMO "f" of `npages` (design `d`, `suite`), every page written once.
fn filled_d_pmo(name: &str, suite: Suite, npages: u64, k: &UserKey) -> (Store, PathBuf) {
    let (s, path) = store_with(1 << 30, name);
    s.create_pmo_with(
        "f",
        npages * PAGE as u64,
        k,
        CreateOptions {
            design: Design::D,
            suite: Some(suite),
            kdf: None,
        },
    )
    .unwrap();
    fill(&s, "f", npages);
    (s, path)
}

fn fault_and_psync(c: &mut Criterion) {
    let npages = 4096u64; // 16 MiB
    let k = UserKey::new(b"k").unwrap();
    let mut g = c.benchmark_group("fault");
    g.throughput(Throughput::Elements(1));
    for suite in SUITES {
        let (s, path) = filled_d_pmo(&format!("fault-{}", name(suite)), suite, npages, &k);
        let sess = s.attach("f", Perm::Read, &k).unwrap();
        let mut out = [0u8; PAGE];
        let mut p = 0u64;
        // Warm the tree cache so we measure the steady-state fault (read + verify + decrypt).
        for i in 0..npages {
            sess.fault(i, &mut out).unwrap();
        }
        g.bench_function(BenchmarkId::new("decrypt+verify", name(suite)), |b| {
            b.iter(|| {
                p = (p + 97) % npages;
                sess.fault(p, &mut out).unwrap();
                black_box(out[0])
            })
        });
        drop(sess);
        let _ = std::fs::remove_file(path);
    }
    g.finish();

    let mut g = c.benchmark_group("psync");
    for dirty in [1u64, 64] {
        g.throughput(Throughput::Elements(dirty));
        for suite in SUITES {
            let (s, path) = filled_d_pmo(&format!("psync-{}", name(suite)), suite, npages, &k);
            let w = s.attach("f", Perm::Write, &k).unwrap();
            let page = [0x17u8; PAGE];
            let mut base = 0u64;
            g.bench_function(
                BenchmarkId::new(format!("{}-dirty", dirty), name(suite)),
                |b| {
                    b.iter(|| {
                        base = (base + 131) % (npages - dirty);
                        w.psync((base..base + dirty).map(|i| (i, &page))).unwrap();
                    })
                },
            );
            w.detach().wait().unwrap();
            let _ = std::fs::remove_file(path);
        }
    }
    g.finish();
}

fn attach_detach(c: &mut Criterion) {
    let k = UserKey::new(b"k").unwrap();
    let mut g = c.benchmark_group("attach_detach");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(4));
    for (label, size) in [("4KiB", 4096u64), ("16MiB", 16 << 20), ("1GiB", 1 << 30)] {
        let npages = size / PAGE as u64;
        let (s, path) = store_with(4 << 30, &format!("ad-{label}"));
        s.create_pmo("f", size, &k).unwrap();
        fill(&s, "f", npages);
        for design in Design::ON_ANY_MEDIUM {
            // One session as the papers measure it: attach, fault one page, psync it, detach.
            g.bench_function(BenchmarkId::new(design.name(), label), |b| {
                b.iter(|| {
                    let w = s.attach_with("f", Perm::Write, &k, Some(design)).unwrap();
                    let mut out = [0u8; PAGE];
                    w.fault(0, &mut out).unwrap();
                    out[0] ^= 1;
                    w.psync([(0u64, &out)]).unwrap();
                    w.detach().wait().unwrap();
                })
            });
            g.bench_function(
                BenchmarkId::new(format!("{}-attach-only", design.name()), label),
                |b| {
                    b.iter(|| {
                        let r = s.attach_with("f", Perm::Read, &k, Some(design)).unwrap();
                        black_box(r.pages());
                        r.detach().wait().unwrap();
                    })
                },
            );
        }
        let _ = std::fs::remove_file(path);
    }
    g.finish();
}

criterion_group!(benches, cipher, fault_and_psync, attach_detach);
criterion_main!(benches);
