//! Every personality through the FFI on the Rust file backend, with small sizes.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use filebench::{
    run, Attachment, Backend, CheckMode, Config, Error, FileBackend, Fileset, Kind, Personality,
    Scale,
};

/// A fresh directory for one test.
fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fb-rs-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    dir
}

/// A small, quick configuration.
fn small(p: Personality, nfiles: u32, threads: u32, ops: u64) -> Config {
    let mut c = Config::new(p, Scale::Small);
    c.nfiles = nfiles;
    c.nthreads = threads;
    c.ops = ops;
    c.mean_file_size = 4096;
    c.append_size = 2048;
    c.io_size = 1024;
    c.file_cap = 128 * 1024;
    c.log_cap = 1024 * 1024;
    c.verify_reads = true;
    c
}

#[test]
fn defaults_are_filebench_scaled_down() {
    let full = Config::new(Personality::Fileserver, Scale::Full);
    assert_eq!(
        (full.nfiles, full.nthreads, full.prealloc_pct),
        (10000, 50, 80)
    );
    assert_eq!(
        (full.mean_file_size, full.io_size, full.append_size),
        (128 << 10, 1 << 20, 16 << 10)
    );
    assert_eq!((full.ops, full.seconds), (0, 60));
    let small = Config::new(Personality::Fileserver, Scale::Small);
    assert_eq!((small.nfiles, small.nthreads, small.ops), (1000, 4, 5000));
    let web = Config::new(Personality::Webserver, Scale::Full);
    assert_eq!(
        (web.nfiles, web.nthreads, web.prealloc_pct),
        (1000, 100, 100)
    );
    assert_eq!(web.prefix, "fb.webserver");
    assert_eq!(Config::default_file_cap(16384, 16384), 102400);
    assert_eq!(
        "varmail".parse::<Personality>().unwrap(),
        Personality::Varmail
    );
    assert!(matches!(
        "mail".parse::<Personality>(),
        Err(Error::UnknownPersonality(_))
    ));
}

#[test]
fn write_shares_are_lpmos() {
    assert_eq!(Personality::Fileserver.write_share(), (2, 3));
    assert_eq!(Personality::Varmail.write_share(), (2, 4));
    assert_eq!(Personality::Webproxy.write_share(), (1, 6));
    assert_eq!(Personality::Webserver.write_share(), (1, 11));
    let pct: Vec<u32> = Personality::ALL
        .iter()
        .map(|p| {
            let (w, io) = p.write_share();
            (100 * w + io / 2) / io
        })
        .collect();
    assert_eq!(pct, [67, 50, 17, 9]); // LPMO truncates webproxy's 16.7% to 16
    let loops: Vec<u32> = Personality::ALL.iter().map(|p| p.loop_len()).collect();
    assert_eq!(loops, [11, 13, 19, 31]);
}

#[test]
fn every_personality_runs_and_leaves_consistent_files() {
    for p in Personality::ALL {
        let dir = temp(p.name());
        let backend = FileBackend::new(&dir).unwrap();
        let cfg = small(p, 40, 3, 600);
        let mut fs = Fileset::new(&cfg, &backend).unwrap();
        let prep = fs.prepare().unwrap();
        let s = fs.run().unwrap();
        let loop_len = u64::from(p.loop_len());
        assert_eq!(s.loops, 600u64.div_ceil(loop_len), "{p}");
        assert!(s.flowops.iter().all(|f| f.ops == s.loops), "{p}");
        let (w, io) = s.write_share();
        let (pw, pio) = p.write_share();
        assert_eq!(
            w * u64::from(pio),
            io * u64::from(pw),
            "{p}: measured write share"
        );
        let log = u64::from(p == Personality::Webserver);
        let prealloc = (40 * u64::from(cfg.prealloc_pct) + 50) / 100;
        assert_eq!(prep.creates, prealloc + log, "{p}");
        assert_eq!(s.prepare, prep, "{p}");
        assert_eq!(
            s.files_at_end,
            prealloc + s.run.creates - s.run.destroys,
            "{p}"
        );
        assert_eq!(
            backend.names().unwrap().len() as u64,
            s.files_at_end + log,
            "{p}"
        );
        assert_eq!(s.run.attaches, s.run.detaches, "{p}");
        assert_eq!(s.run.verify_errors, 0, "{p}");
        let written: u64 = s
            .flowops
            .iter()
            .filter(|f| f.kind == Kind::Write)
            .map(|f| f.bytes)
            .sum();
        assert_eq!(written, s.run.bytes_written, "{p}");
        assert!(s.run.bytes_read > 0, "{p}");
        let report = fs.check(CheckMode::Expect).unwrap();
        assert!(report.ok(), "{p}: {report:?}");
        assert_eq!(report.present, s.files_at_end + log, "{p}");
        let text = s.report();
        assert!(text.contains("IO Summary:"), "{p}");
        assert_eq!(s.csv().lines().count(), s.flowops.len() + 3, "{p}");
        fs.cleanup().unwrap();
        assert!(backend.names().unwrap().is_empty(), "{p}");
        drop(fs);
        drop(backend);
        fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn one_thread_one_seed_is_deterministic() {
    let mut results = Vec::new();
    for (i, seed) in [7, 7, 8].into_iter().enumerate() {
        let dir = temp(&format!("det{i}"));
        let backend = FileBackend::new(&dir).unwrap();
        let mut cfg = small(Personality::Varmail, 30, 1, 13 * 40);
        cfg.seed = seed;
        let s = run(&cfg, &backend).unwrap();
        results.push((
            s.run.bytes_written,
            s.run.bytes_read,
            s.bytes_at_end,
            backend.names().unwrap(),
        ));
        drop(backend);
        fs::remove_dir_all(&dir).unwrap();
    }
    assert_eq!(results[0], results[1]);
    assert_ne!(results[0].0, results[2].0);
}

#[test]
fn check_finds_a_flipped_byte() {
    let dir = temp("flip");
    let backend = FileBackend::new(&dir).unwrap();
    let cfg = small(Personality::Webproxy, 20, 2, 19 * 10);
    let mut fs = Fileset::new(&cfg, &backend).unwrap();
    fs.prepare().unwrap();
    fs.run().unwrap();
    assert!(fs.check(CheckMode::Expect).unwrap().ok());
    // The first file with data: flip its first data byte (after the 64-byte header).
    let victim = backend
        .names()
        .unwrap()
        .into_iter()
        .map(|n| dir.join(n))
        .find(|p| fs::read(p).unwrap()[24] != 0)
        .unwrap();
    let mut bytes = fs::read(&victim).unwrap();
    bytes[64] ^= 0x40;
    fs::write(&victim, &bytes).unwrap();
    let r = fs.check(CheckMode::Discover).unwrap();
    assert!(!r.ok());
    assert_eq!(r.bad_data, 1);
    drop(fs);
    drop(backend);
    fs::remove_dir_all(&dir).unwrap();
}

/// A file backend whose `n`-th sync panics, or fails with `errno`.
struct Faulty {
    inner: FileBackend,
    syncs: AtomicU64,
    at: u64,
    errno: Option<i32>,
}

// SAFETY: every call forwards to the file backend, which keeps the contract.
unsafe impl Backend for Faulty {
    fn create(&self, name: &str, size: usize) -> io::Result<()> {
        self.inner.create(name, size)
    }
    fn destroy(&self, name: &str) -> io::Result<()> {
        self.inner.destroy(name)
    }
    fn attach(&self, name: &str, writable: bool) -> io::Result<Attachment> {
        self.inner.attach(name, writable)
    }
    fn sync(&self, addr: NonNull<u8>) -> io::Result<()> {
        if self.syncs.fetch_add(1, Ordering::SeqCst) + 1 == self.at {
            match self.errno {
                Some(e) => return Err(io::Error::from_raw_os_error(e)),
                None => panic!("sync number {} panics", self.at),
            }
        }
        self.inner.sync(addr)
    }
    fn detach(&self, addr: NonNull<u8>) -> io::Result<()> {
        self.inner.detach(addr)
    }
}

#[test]
fn a_backend_panic_is_an_error_not_an_unwind_through_c() {
    let dir = temp("panic");
    let b = Faulty {
        inner: FileBackend::new(&dir).unwrap(),
        syncs: AtomicU64::new(0),
        at: 20, // the prepare's 16 psyncs pass, the run's fourth panics
        errno: None,
    };
    let err = run(&small(Personality::Varmail, 20, 2, 13 * 20), &b).unwrap_err();
    assert!(matches!(err, Error::BackendPanicked), "{err}");
    drop(b);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_backend_error_reaches_the_caller_with_its_errno() {
    let dir = temp("enospc");
    let b = Faulty {
        inner: FileBackend::new(&dir).unwrap(),
        syncs: AtomicU64::new(0),
        at: 20,
        errno: Some(libc::ENOSPC),
    };
    match run(&small(Personality::Varmail, 20, 2, 13 * 20), &b).unwrap_err() {
        Error::Engine { errno, message } => {
            assert_eq!(errno, libc::ENOSPC);
            assert!(message.starts_with("psync fb.varmail."), "{message}");
        }
        other => panic!("unexpected {other}"),
    }
    drop(b);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_configurations_are_refused() {
    let dir = temp("cfg");
    let backend = FileBackend::new(&dir).unwrap();
    let mut c = small(Personality::Fileserver, 10, 1, 11);
    c.nthreads = 0;
    assert!(matches!(Fileset::new(&c, &backend), Err(Error::Config(m)) if m.contains("nthreads")));
    let mut c = small(Personality::Fileserver, 10, 1, 11);
    c.prefix = "x".repeat(48);
    assert!(matches!(Fileset::new(&c, &backend), Err(Error::Config(_))));
    let mut c = small(Personality::Fileserver, 10, 1, 11);
    c.file_cap = 4097;
    assert!(matches!(Fileset::new(&c, &backend), Err(Error::Config(_))));
    // A fileset that can never satisfy createfile fails instead of hanging.
    let mut c = small(Personality::Fileserver, 10, 2, 110);
    c.prealloc_pct = 100;
    match run(&c, &backend).unwrap_err() {
        Error::Engine { errno, .. } => assert_eq!(errno, libc::ENOSPC),
        other => panic!("unexpected {other}"),
    }
    drop(backend);
    fs::remove_dir_all(&dir).unwrap();
}
