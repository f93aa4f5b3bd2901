//! Host-side fault latency at native speed, every cost a ratio to floors measured in the same
//! rounds: host threads touch the same userfaultfd window a vCPU would, and the same fault
//! service resolves it.
//!
//! Variants, run interleaved in rounds (the order rotates each round, so a burst of load from
//! elsewhere lands on one run of many variants rather than on every run of one):
//! - `anon`: first write to plain anonymous memory (the kernel's own fault, no userfaultfd);
//! - `uffd blocking`: a minimal handler thread asleep in `poll(2)` on the userfaultfd, then
//!   `UFFDIO_COPY` of a ready page (the plain round trip with a cross-CPU wake-up);
//! - `uffd spinning`: the same handler spinning on the non-blocking fd: **the yardstick**, the
//!   best a userfaultfd handler does on this host;
//! - `pager zero-fill`: the pager with a source that zero-fills (its own cost: lookup,
//!   bookkeeping, install, wake), with the VMM's two fault threads and with one;
//! - `pmo no integrity`: the pager over a decrypt-only source (AES-XTS-256);
//! - `pmo aes-gcm`: the pager over a real store session on a store file (verify and decrypt in
//!   one AES-256-GCM pass, authenticated version tree), as the VMM runs a PMO of the default
//!   suite, with two fault threads and with one;
//! - `pmo xts-blake3`: the same with the `id` designs' suite (AES-XTS-256, keyed BLAKE3 tag);
//! - the **sequential scan** variants walk the same pages with every thread free to use every
//!   CPU (also under `PMO_BENCH_CPU`: a scan that overlaps decryption with the walk needs a
//!   second CPU): first touch of anonymous memory, and the PMO (default suite) with a stream
//!   predictor of depth 8 and of depth 256. Their figure is the mean per page, the walk's
//!   throughput.
//!
//! Each round also psyncs every page of each suite's PMO once through a writing session (one
//! thread: encrypt, MAC, write, persist) for the psync target, on a store file in `/dev/shm`
//! (memory, standing for persistent memory, where persisting is flushing cache lines) and, for
//! the default suite, on one in the temporary directory (a disk: `msync` waits for it).
//!
//! One thread touches each page once, sequentially; each touch is timed from just before the
//! access to just after it returns (the whole round trip). Per variant the report gives the
//! median over rounds of each round's p50 with the interquartile range of those p50s, the p99
//! and the mean of all touches (the mean is what a walk's throughput sees), and the ratio to `uffd spinning` taken within each round (median and IQR
//! over rounds). The load average before and after says how quiet the machine was.
//!
//! Run: `cargo bench -p pmo-pager --bench fault` (env `PMO_BENCH_PAGES`, default 1024 pages
//! per variant and round; `PMO_BENCH_ROUNDS`, default 15; `PMO_BENCH_CPU=N` runs every thread
//! on CPU N). `cargo test --benches` runs it tiny.
//!
//! Two modes show up here. When the toucher and the thread serving it run on different CPUs,
//! every wake-up of the toucher's idle CPU costs about 8 us on this (virtualized) host, and
//! whole rounds land at about 16 us instead of 7-8 us for every userfaultfd variant; the
//! interquartile ranges show it. With `PMO_BENCH_CPU` the layout is fixed and the spread small.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use pmo_crypto::xts::XtsCipher;
use pmo_crypto::{Suite, UserKey, PAGE};
use pmo_media::{FileMedium, Medium};
use pmo_pager::source::SessionSource;
use pmo_pager::{FillError, PageSource, Pager};
use pmo_store::{CreateOptions, Design, Perm, Store, StoreOptions};
use uffd::{AnonMap, Uffd};

/// Decrypt-only source: the cost of the fault path without integrity.
struct DecryptOnly {
    cipher: XtsCipher,
    pages: Arc<Vec<[u8; PAGE]>>,
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

/// Reads one byte of each of `pages` pages from `base`, in order; every touch's latency in ns.
fn touch_all(base: u64, pages: u64) -> Vec<u64> {
    let mut lat = Vec::with_capacity(pages as usize);
    for p in 0..pages {
        let addr = (base + p * PAGE as u64) as *const u8;
        let t0 = Instant::now();
        // SAFETY: `addr` is inside a live mapping of `pages` pages whose faults are served.
        let v = unsafe { std::ptr::read_volatile(addr) };
        lat.push(t0.elapsed().as_nanos() as u64);
        std::hint::black_box(v);
    }
    lat
}

fn anon_touch(pages: u64) -> Vec<u64> {
    let map = AnonMap::new((pages * PAGE as u64) as usize).expect("mmap");
    let addr = map.addr();
    // Reads of untouched anonymous memory map the shared zero page; write instead, as a first
    // store to fresh memory does.
    let mut lat = Vec::with_capacity(pages as usize);
    for p in 0..pages {
        let a = (addr + p * PAGE as u64) as *mut u8;
        let t0 = Instant::now();
        // SAFETY: inside the mapping.
        unsafe { std::ptr::write_volatile(a, 1) };
        lat.push(t0.elapsed().as_nanos() as u64);
    }
    lat
}

/// A minimal userfaultfd handler over a fresh window: one thread that waits for a fault
/// (asleep in `poll`, or spinning on the non-blocking fd) and copies in a ready page.
fn minimal_handler(pages: u64, spin: bool) -> Vec<u64> {
    let map = AnonMap::new((pages * PAGE as u64) as usize).expect("mmap");
    let uffd = Arc::new(Uffd::new().expect("userfaultfd"));
    uffd.register(map.addr(), pages * PAGE as u64)
        .expect("register");
    let stop = Arc::new(AtomicBool::new(false));
    let handler = {
        let (uffd, stop) = (uffd.clone(), stop.clone());
        std::thread::spawn(move || {
            let page = [0u8; PAGE];
            while !stop.load(Ordering::Relaxed) {
                if !spin {
                    let mut pfd = libc::pollfd {
                        fd: uffd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd; a 100 ms timeout lets the thread see `stop`.
                    unsafe { libc::poll(&mut pfd, 1, 100) };
                }
                match uffd.read_fault() {
                    Ok(Some(f)) => {
                        uffd.install(f.address, &page, false).expect("UFFDIO_COPY");
                    }
                    Ok(None) => std::hint::spin_loop(),
                    Err(e) => panic!("read userfaultfd: {e}"),
                }
            }
        })
    };
    let lat = touch_all(map.addr(), pages);
    stop.store(true, Ordering::Relaxed);
    handler.join().expect("handler thread");
    lat
}

/// Touches a fresh pager slice over `source` served by `threads` fault threads, optionally
/// with a predictor.
fn pager_touch(
    pages: u64,
    threads: usize,
    source: Arc<dyn PageSource>,
    predictor: Option<&str>,
) -> Vec<u64> {
    let pager = Pager::new(pages * PAGE as u64, threads).expect("pager");
    let (off, _) = pager.attach(source, pages).expect("attach slice");
    if let Some(spec) = predictor {
        let p = pmo_policies::predictor_from_name(spec).expect("predictor");
        pager.set_predictor(off, Some(p)).expect("set predictor");
    }
    let lat = touch_all(pager.host_addr() + off, pages);
    pager.detach(off).expect("detach slice");
    lat
}

/// The suites measured: the default of `d` first.
const SUITES: [Suite; 2] = [Suite::AesGcm, Suite::XtsBlake3];

/// A store file in `parent` with one PMO of `pages` pages per suite of [`SUITES`] (named after
/// it), every page written once.
struct BenchStore {
    dir: PathBuf,
    store: Store,
    key: UserKey,
}

impl BenchStore {
    fn new(parent: &std::path::Path, pages: u64) -> BenchStore {
        let dir = parent.join(format!("pmo-fault-bench-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("bench dir");
        let medium: Arc<dyn Medium> = Arc::new(
            FileMedium::create(
                &dir.join("store.img"),
                pages * PAGE as u64 * 3 * SUITES.len() as u64 + (256 << 20),
            )
            .expect("medium"),
        );
        let store = Store::create(
            medium,
            StoreOptions {
                kdf: pmo_crypto::KdfParams::INSECURE_FAST,
                ..StoreOptions::default()
            },
        )
        .expect("store");
        let key = UserKey::new(b"bench-key").expect("key");
        assert_eq!(Design::D.default_suite(), SUITES[0]);
        for suite in SUITES {
            let opts = CreateOptions {
                suite: Some(suite),
                ..CreateOptions::default()
            };
            store
                .create_pmo_with(suite.name(), pages * PAGE as u64, &key, opts)
                .expect("create");
        }
        let b = BenchStore { dir, store, key };
        for suite in SUITES {
            b.psync_gbps(suite, pages, 0);
        }
        b
    }

    /// Psyncs all `pages` pages of `suite`'s PMO, each filled with `fill` ^ its index, through
    /// a writing session (the store's own encrypt, MAC, write and persist, on one thread);
    /// GB/s.
    fn psync_gbps(&self, suite: Suite, pages: u64, fill: u8) -> f64 {
        // A fault variant's read session ends in the background after its pager detach.
        let started = Instant::now();
        let w = loop {
            match self.store.attach(suite.name(), Perm::Write, &self.key) {
                Err(pmo_store::StoreError::Busy(_)) if started.elapsed().as_secs() < 10 => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                r => break r.expect("attach w"),
            }
        };
        let data: Vec<(u64, Box<[u8; PAGE]>)> = (0..pages)
            .map(|p| (p, Box::new([(p as u8) ^ fill; PAGE])))
            .collect();
        let t = Instant::now();
        w.psync(data.iter().map(|(p, d)| (*p, &**d)))
            .expect("psync");
        let ns = t.elapsed().as_nanos().max(1) as f64;
        w.detach().wait().expect("detach");
        (pages * PAGE as u64) as f64 / ns
    }

    fn session(&self, suite: Suite) -> Arc<dyn PageSource> {
        let s = self
            .store
            .attach(suite.name(), Perm::Read, &self.key)
            .expect("attach r");
        Arc::new(SessionSource::new(s, false, None))
    }
}

impl Drop for BenchStore {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The stores and ciphertext the variants use: the fault variants and one psync on a store
/// file in the temporary directory (a disk here), and a psync on one in `/dev/shm` (memory, as
/// persistent memory would be) where that exists.
struct Fixture {
    disk: BenchStore,
    shm: Option<BenchStore>,
    ciphertext: Arc<Vec<[u8; PAGE]>>,
}

impl Fixture {
    fn new(pages: u64) -> Fixture {
        let disk = BenchStore::new(&std::env::temp_dir(), pages);
        let shm = std::path::Path::new("/dev/shm")
            .is_dir()
            .then(|| BenchStore::new(std::path::Path::new("/dev/shm"), pages));
        let cipher = XtsCipher::new(&KEY);
        let ciphertext = (0..pages)
            .map(|i| {
                let mut p = [i as u8; PAGE];
                let mut tweak = [0u8; 16];
                tweak[..8].copy_from_slice(&i.to_le_bytes());
                cipher.encrypt(tweak, &mut p).expect("encrypt");
                p
            })
            .collect();
        Fixture {
            disk,
            shm,
            ciphertext: Arc::new(ciphertext),
        }
    }

    fn session(&self, suite: Suite) -> Arc<dyn PageSource> {
        self.disk.session(suite)
    }
}

const KEY: [u8; 64] = [7u8; 64];

/// The variants, in table order; `SPIN` is the yardstick. The pager runs with the VMM's two
/// fault threads and, beside it, with one (one toucher here, so one thread can serve it; the
/// second must stay asleep rather than share the host's two CPUs with the toucher). From
/// `SCAN` on, the sequential scans: every thread may use every CPU.
const NAMES: [&str; 12] = [
    "anon first touch (write)",
    "uffd blocking (poll), copy",
    "uffd spinning, copy",
    "pager zero-fill, 2 fault threads",
    "pager zero-fill, 1 fault thread",
    "pmo no integrity (XTS decrypt), 2 thr",
    "pmo aes-gcm (default), 2 thr",
    "pmo aes-gcm (default), 1 thr",
    "pmo xts-blake3, 2 thr",
    "scan: anon first touch (write)",
    "scan: pmo aes-gcm, stream:8",
    "scan: pmo aes-gcm, stream:256",
];
const SPIN: usize = 2;
/// The PMO fault of the default suite with the VMM's two fault threads.
const PMO_FAULT: usize = 6;
/// The first sequential-scan variant (anonymous memory, the scans' yardstick).
const SCAN: usize = 9;

fn run_variant(v: usize, pages: u64, fx: &Fixture) -> Vec<u64> {
    let pmo = |threads, predictor| pager_touch(pages, threads, fx.session(SUITES[0]), predictor);
    match v {
        0 | 9 => anon_touch(pages),
        1 => minimal_handler(pages, false),
        2 => minimal_handler(pages, true),
        3 => pager_touch(pages, 2, Arc::new(Zeros), None),
        4 => pager_touch(pages, 1, Arc::new(Zeros), None),
        5 => pager_touch(
            pages,
            2,
            Arc::new(DecryptOnly {
                cipher: XtsCipher::new(&KEY),
                pages: fx.ciphertext.clone(),
            }),
            None,
        ),
        6 => pmo(2, None),
        7 => pmo(1, None),
        8 => pager_touch(pages, 2, fx.session(Suite::XtsBlake3), None),
        10 => pmo(2, Some("stream:8")),
        _ => pmo(2, Some("stream:256")),
    }
}

/// The value at quantile `q` of sorted `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

/// Median and interquartile range of `v`.
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (quantile(&v, 0.5), quantile(&v, 0.25), quantile(&v, 0.75))
}

/// Runs this thread, and every thread it starts from now on, on CPU `cpu` only, or on every
/// CPU of the machine for `None`.
fn pin_to(cpu: Option<usize>) {
    // SAFETY: sysconf has no memory effects.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it (it ignores
    // indices past the set's size), and sched_setaffinity only reads it.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in cpu.map_or(0..cpus, |c| c..c + 1) {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(
        r,
        0,
        "pin to CPU {cpu:?}: {}",
        std::io::Error::last_os_error()
    );
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing: run tiny then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|n| *n > 0)
            .unwrap_or(default)
    };
    let pages = env("PMO_BENCH_PAGES", if quick { 64 } else { 1024 });
    let cpu = std::env::var("PMO_BENCH_CPU")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    if cpu.is_some() {
        pin_to(cpu);
    }
    let rounds = env("PMO_BENCH_ROUNDS", if quick { 2 } else { 15 }) as usize;
    let fx = Fixture::new(pages);
    let load_before = loadavg();
    // p50 and mean of each round, and every touch, per variant; psync GB/s per round.
    let mut p50s: Vec<Vec<f64>> = vec![Vec::new(); NAMES.len()];
    let mut means: Vec<Vec<f64>> = vec![Vec::new(); NAMES.len()];
    let mut all: Vec<Vec<u64>> = vec![Vec::new(); NAMES.len()];
    let mut psync_disk = Vec::new();
    let mut psync_shm: Vec<Vec<f64>> = vec![Vec::new(); SUITES.len()];
    for round in 0..rounds {
        for k in 0..=NAMES.len() {
            let v = (round + k) % (NAMES.len() + 1);
            if v == NAMES.len() {
                let fill = round as u8 + 1;
                psync_disk.push(fx.disk.psync_gbps(SUITES[0], pages, fill));
                if let Some(shm) = &fx.shm {
                    for (i, suite) in SUITES.into_iter().enumerate() {
                        psync_shm[i].push(shm.psync_gbps(suite, pages, fill));
                    }
                }
                continue;
            }
            if v >= SCAN && cpu.is_some() {
                pin_to(None);
            }
            let mut lat = run_variant(v, pages, &fx);
            if v >= SCAN && cpu.is_some() {
                pin_to(cpu);
            }
            lat.sort_unstable();
            p50s[v].push(lat[lat.len() / 2] as f64);
            means[v].push(lat.iter().sum::<u64>() as f64 / lat.len() as f64);
            all[v].extend(lat);
        }
    }
    let load_after = loadavg();
    println!(
        "\nhost-side fault latency: {rounds} rounds x {pages} pages per variant, variants \
         interleaved (order rotated each round); {}; load average before {load_before}, after {load_after}",
        match cpu {
            Some(c) => format!("every thread on CPU {c}"),
            None => "threads placed by the scheduler".into(),
        }
    );
    println!(
        "{:<37} {:>9} {:>19} {:>9} {:>10} {:>8} {:>15}",
        "variant",
        "p50 (us)",
        "IQR of p50s (us)",
        "p99 (us)",
        "mean (us)",
        "/ spin",
        "IQR of / spin"
    );
    let ratios = |v: usize| -> Vec<f64> {
        (0..rounds)
            .map(|r| p50s[v][r] / p50s[SPIN][r].max(1.0))
            .collect()
    };
    let mut verdicts = Vec::new();
    for (v, name) in NAMES.iter().enumerate() {
        let (m, q1, q3) = spread(p50s[v].clone());
        let (r, r1, r3) = spread(ratios(v));
        all[v].sort_unstable();
        let p99 = all[v][(all[v].len() - 1) * 99 / 100] as f64;
        let mean = all[v].iter().sum::<u64>() as f64 / all[v].len() as f64;
        if v == SCAN {
            println!("sequential scans, every thread free to use every CPU:");
        }
        // A scan's figure is its mean (throughput); a ratio of its p50 to a fault's says nothing.
        let vs_spin = if v < SCAN {
            format!("{r:>7.2}x {r1:>6.2} - {r3:>5.2}")
        } else {
            String::new()
        };
        println!(
            "{:<37} {:>9.2} {:>8.2} - {:>8.2} {:>9.2} {:>10.2} {vs_spin}",
            name,
            m / 1e3,
            q1 / 1e3,
            q3 / 1e3,
            p99 / 1e3,
            mean / 1e3,
        );
        match v {
            3 => verdicts.push((
                "pager zero-fill (2 fault threads) <= 1.1x spinning handler",
                r,
                r3,
                1.1,
            )),
            PMO_FAULT => verdicts.push((
                "PMO fault with integrity (default suite, 2 fault threads) <= 1.5x spinning handler",
                r,
                r3,
                1.5,
            )),
            _ => {}
        }
    }
    println!("\ntargets (issue 14; p50 ratio within each round, median and upper quartile):");
    for (what, r, r3, limit) in verdicts {
        println!(
            "  {} {what}: {r:.2}x (upper quartile {r3:.2}x)",
            if r <= limit { "PASS" } else { "MISS" }
        );
    }
    // Higher is better for the rest: median and lower quartile.
    for (v, depth) in [(SCAN + 1, 8), (SCAN + 2, 256)] {
        let scan: Vec<f64> = (0..rounds)
            .map(|r| means[SCAN][r] / means[v][r].max(1.0))
            .collect();
        let (s, s1, _) = spread(scan);
        println!(
            "  {} sequential scan with stream:{depth}, throughput >= 0.8x anonymous first touch \
             (means within each round, every CPU): {s:.2}x (lower quartile {s1:.2}x)",
            if s >= 0.8 { "PASS" } else { "MISS" }
        );
    }
    let mut psyncs: Vec<(String, Vec<f64>)> = SUITES
        .iter()
        .zip(psync_shm)
        .map(|(suite, g)| (format!("{}, store file on /dev/shm", suite.name()), g))
        .collect();
    psyncs.push((
        format!(
            "{}, store file on the temporary directory's disk",
            SUITES[0].name()
        ),
        psync_disk,
    ));
    for (what, gbps) in psyncs {
        if gbps.is_empty() {
            println!("  (no /dev/shm: psync measured on the disk only)");
            continue;
        }
        let (g, g1, _) = spread(gbps);
        println!(
            "  {} psync of {pages} dirty pages (encrypt + MAC + write + persist, one thread, {what}) \
             >= 1 GB/s: {g:.2} GB/s (lower quartile {g1:.2})",
            if g >= 1.0 { "PASS" } else { "MISS" }
        );
    }
    if quick {
        println!("(quick run: {pages} pages, {rounds} rounds; numbers are not meaningful; use cargo bench)");
    }
}
