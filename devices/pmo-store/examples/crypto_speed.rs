//! Page-cipher throughput by *thread CPU time* (CLOCK_THREAD_CPUTIME_ID), so the figure stays
//! meaningful on a shared, oversubscribed machine where wall-clock benches are inflated by
//! waiting for a CPU. `cargo run --release -p pmo-store --example crypto_speed` (the `paper` suite, the
//! authors' scheme, comes from the harness's benchmark suites).

use pmo_crypto::{KeyParams, PageId, PmoKeys, Suite, UserKey, XtsCipher, PAGE};
use std::hint::black_box;

fn cpu_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

fn report(what: &str, pages: u64, ns: u128) {
    let per = ns as f64 / pages as f64;
    println!(
        "{what:<28} {per:8.0} ns/page  {:6.2} GB/s",
        PAGE as f64 / per
    );
}

fn main() {
    let n = 200_000u64;
    let x = XtsCipher::new(&[7u8; 64]);
    let mut page = [1u8; PAGE];
    let t = cpu_ns();
    for i in 0..n {
        x.encrypt((i as u128).to_le_bytes(), black_box(&mut page))
            .unwrap_or(());
    }
    report("xts-only (batched)", n, cpu_ns() - t);
    {
        use aes::cipher::KeyInit;
        let r = xts_mode::Xts128::<aes::Aes256>::new(
            aes::Aes256::new_from_slice(&[7u8; 32]).unwrap_or_else(|_| unreachable!()),
            aes::Aes256::new_from_slice(&[8u8; 32]).unwrap_or_else(|_| unreachable!()),
        );
        let m = n / 10;
        let t = cpu_ns();
        for i in 0..m {
            r.encrypt_sector(black_box(&mut page), (i as u128).to_le_bytes().into());
        }
        report("xts-only (xts-mode crate)", m, cpu_ns() - t);
    }
    let suites = pmo_bench_suites::suites();
    for suite in [Suite::XtsBlake3, pmo_bench_suites::PAPER, Suite::AesGcm] {
        let params = KeyParams::generate(suite, pmo_crypto::KdfParams::INSECURE_FAST)
            .unwrap_or_else(|_| unreachable!());
        let key = UserKey::new(b"speed").unwrap_or_else(|_| unreachable!());
        let k = PmoKeys::derive(&key, params, &suites).unwrap_or_else(|_| unreachable!());
        let name = suites.name_of(suite).unwrap_or("unknown");
        let t = cpu_ns();
        let mut tag = [0u8; pmo_crypto::TAG_LEN];
        for i in 0..n {
            let id = PageId {
                uid: 1,
                page: i as u32,
                version: 1,
                gen: [1; 16],
            };
            tag = k.seal_page(id, black_box(&mut page)).unwrap_or(tag);
        }
        report(&format!("seal {name}"), n, cpu_ns() - t);
        let id = PageId {
            uid: 1,
            page: 0,
            version: 1,
            gen: [1; 16],
        };
        let mut ct = [3u8; PAGE];
        let tag = k.seal_page(id, &mut ct).unwrap_or(tag);
        let t = cpu_ns();
        for _ in 0..n {
            let mut p = ct;
            let _ = k.open_page(id, black_box(&mut p), &tag);
            black_box(p[0]);
        }
        report(&format!("open {name}"), n, cpu_ns() - t);
    }
}
