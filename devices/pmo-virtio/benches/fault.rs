//! Host-side fault latency, at native speed: host threads touch the same
//! userfaultfd window a vCPU would, and the same fault service resolves it.
//!
//! Three paths, measured in one run so their ratios are comparable:
//! - `anon`: first touch of plain anonymous memory (the kernel's own fault,
//!   the no-protection floor);
//! - `pager only`: the userfaultfd round trip with a zero-filled page, no crypto;
//! - `pmo-nointeg`: the pager with a page source that only decrypts
//!   (AES-XTS-256), no integrity check;
//! - `pmo-integ`: the pager over a real store session on a store file:
//!   decrypt + keyed MAC + authenticated version tree, as the VMM runs it;
//! - the same with a stream predictor of depth 8: the access latency a
//!   sequential walk sees when pages are pre-populated off the fault path.
//!
//! Each touch is timed by the touching thread from just before the access
//! to just after it returns, so it covers the whole round trip: the uffd
//! message, the service thread's work, `UFFDIO_COPY` and the wake-up.
//!
//! Run: `cargo bench -p pmo-virtio --bench fault` (env `PMO_BENCH_PAGES`,
//! default 8192 pages = 32 MiB per path).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use pmo_store::crypto::xts::XtsCipher;
use pmo_store::crypto::{UserKey, PAGE};
use pmo_store::medium::{FileMedium, Medium};
use pmo_store::{Perm, Store, StoreOptions};
use pmo_virtio::pager::{FillError, PageSource, Pager};
use pmo_virtio::source::SessionSource;

/// Decrypt-only source: the cost of the fault path without integrity.
struct DecryptOnly {
    cipher: XtsCipher,
    pages: Vec<[u8; PAGE]>,
}

impl PageSource for DecryptOnly {
    fn fill(&self, page: u64, out: &mut [u8; PAGE]) -> Result<(), FillError> {
        let src = self.pages.get(page as usize).ok_or(FillError::Other {
            page,
            why: "out of range".into(),
        })?;
        out.copy_from_slice(src);
        let mut tweak = [0u8; 16];
        tweak[..8].copy_from_slice(&page.to_le_bytes());
        self.cipher
            .decrypt(tweak, out)
            .map_err(|e| FillError::Other {
                page,
                why: e.to_string(),
            })
    }
    fn writable(&self) -> bool {
        false
    }
}

/// Zero-filled pages: the pager's own cost (uffd message, lookup, copy, wake).
struct Zeros;

impl PageSource for Zeros {
    fn fill(&self, _page: u64, out: &mut [u8; PAGE]) -> Result<(), FillError> {
        out.fill(0);
        Ok(())
    }
    fn writable(&self) -> bool {
        false
    }
}

/// Touches `pages` pages from `base` with `threads` threads (interleaved),
/// returning every touch's latency in nanoseconds.
fn touch_all(base: u64, pages: u64, threads: u64) -> Vec<u64> {
    let mut all = Vec::with_capacity(pages as usize);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut lat = Vec::with_capacity((pages / threads + 1) as usize);
                    let mut p = t;
                    while p < pages {
                        let addr = (base + p * PAGE as u64) as *const u8;
                        let t0 = Instant::now();
                        // SAFETY: `addr` is inside a live mapping of `pages` pages.
                        let v = unsafe { std::ptr::read_volatile(addr) };
                        lat.push(t0.elapsed().as_nanos() as u64);
                        std::hint::black_box(v);
                        p += threads;
                    }
                    lat
                })
            })
            .collect();
        for h in handles {
            all.extend(h.join().expect("toucher thread"));
        }
    });
    all
}

fn anon_touch(pages: u64) -> Vec<u64> {
    let len = (pages * PAGE as u64) as usize;
    let map = uffd::AnonMap::new(len).expect("mmap");
    let addr = map.addr();
    // Reads of untouched anonymous memory map the shared zero page; write
    // instead, as a first store to fresh memory does.
    let mut lat = Vec::with_capacity(pages as usize);
    for p in 0..pages {
        let a = (addr + p * PAGE as u64) as *mut u8;
        let t0 = Instant::now();
        // SAFETY: inside the mapping.
        unsafe { std::ptr::write_volatile(a, 1) };
        lat.push(t0.elapsed().as_nanos() as u64);
    }
    drop(map);
    lat
}

struct Row {
    name: String,
    p50: u64,
    p99: u64,
    mean: u64,
}

fn summarize(name: &str, mut lat: Vec<u64>) -> Row {
    lat.sort_unstable();
    let pct = |q: f64| lat[((lat.len() as f64 - 1.0) * q) as usize];
    Row {
        name: name.to_string(),
        p50: pct(0.50),
        p99: pct(0.99),
        mean: lat.iter().sum::<u64>() / lat.len() as u64,
    }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing: run small then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let pages: u64 = std::env::var("PMO_BENCH_PAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 256 } else { 8192 });
    let mut rows = Vec::new();

    rows.push(summarize("anon first touch (write)", anon_touch(pages)));

    // The pager alone.
    {
        let pager = Pager::new(pages * PAGE as u64, 2).expect("pager");
        let (off, _) = pager.attach(Arc::new(Zeros), pages).expect("attach");
        let lat = touch_all(pager.host_addr() + off, pages, 1);
        rows.push(summarize("pager only (zero fill), 1 thread", lat));
    }

    // Decrypt-only pager.
    let key = [7u8; 64];
    let cipher = XtsCipher::new(&key);
    let mut ct = vec![[0u8; PAGE]; pages as usize];
    for (i, p) in ct.iter_mut().enumerate() {
        p.fill(i as u8);
        let mut tweak = [0u8; 16];
        tweak[..8].copy_from_slice(&(i as u64).to_le_bytes());
        cipher.encrypt(tweak, p).expect("encrypt");
    }
    for threads in [1u64, 2] {
        let pager = Pager::new(pages * PAGE as u64, 2).expect("pager");
        let (off, _) = pager
            .attach(
                Arc::new(DecryptOnly {
                    cipher: XtsCipher::new(&key),
                    pages: ct.clone(),
                }),
                pages,
            )
            .expect("attach");
        let lat = touch_all(pager.host_addr() + off, pages, threads);
        rows.push(summarize(
            &format!("PMO fault, no integrity, {threads} thread(s)"),
            lat,
        ));
    }

    // Real store with integrity.
    let dir = std::env::temp_dir().join(format!("pmo-fault-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path: PathBuf = dir.join("store.img");
    let medium: Arc<dyn Medium> = Arc::new(
        FileMedium::create(&path, (pages * PAGE as u64) * 3 + (256 << 20)).expect("medium"),
    );
    let store = Store::create(
        medium,
        StoreOptions {
            kdf: pmo_store::crypto::KdfParams::INSECURE_FAST,
            ..StoreOptions::default()
        },
    )
    .expect("store");
    let ukey = UserKey::new(b"bench-key").expect("key");
    store
        .create_pmo("bench", pages * PAGE as u64, &ukey)
        .expect("create");
    {
        let w = store.attach("bench", Perm::Write, &ukey).expect("attach w");
        let data: Vec<(u64, Box<[u8; PAGE]>)> =
            (0..pages).map(|p| (p, Box::new([p as u8; PAGE]))).collect();
        w.psync(data.iter().map(|(p, d)| (*p, &**d)))
            .expect("psync");
        w.detach().wait().expect("detach");
    }
    for threads in [1u64, 2] {
        let session = store.attach("bench", Perm::Read, &ukey).expect("attach r");
        let pager = Pager::new(pages * PAGE as u64, 2).expect("pager");
        let (off, _) = pager
            .attach(Arc::new(SessionSource::new(session, false)), pages)
            .expect("attach slice");
        let lat = touch_all(pager.host_addr() + off, pages, threads);
        rows.push(summarize(
            &format!("PMO fault, with integrity, {threads} thread(s)"),
            lat,
        ));
    }
    // The same walk with a stream predictor of depth 8 (LPMO's idea): most
    // touches find their page already decrypted and verified.
    {
        let session = store.attach("bench", Perm::Read, &ukey).expect("attach r");
        let pager = Pager::new(pages * PAGE as u64, 2).expect("pager");
        let (off, _) = pager
            .attach(Arc::new(SessionSource::new(session, false)), pages)
            .expect("attach slice");
        pager
            .set_predictor(
                off,
                Some(pmo_policies::predictor_from_name("stream:8").expect("stream:8")),
            )
            .expect("predictor");
        let lat = touch_all(pager.host_addr() + off, pages, 1);
        rows.push(summarize(
            "PMO access, with integrity, stream:8 prefetch",
            lat,
        ));
    }
    let _ = std::fs::remove_dir_all(&dir);

    let floor = rows[0].p50.max(1) as f64;
    println!("\nhost-side fault latency, {pages} pages of 4 KiB per row (ns)");
    println!(
        "{:<44} {:>8} {:>8} {:>8} {:>12}",
        "path", "p50", "p99", "mean", "p50 / anon"
    );
    for r in &rows {
        println!(
            "{:<44} {:>8} {:>8} {:>8} {:>11.2}x",
            r.name,
            r.p50,
            r.p99,
            r.mean,
            r.p50 as f64 / floor
        );
    }
    if quick {
        println!("(quick run with {pages} pages: numbers are not meaningful; use cargo bench)");
    }
}
