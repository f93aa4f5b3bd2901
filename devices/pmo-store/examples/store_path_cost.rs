//! The store's share of a fault and of a psync, for instruction counts that do not move with
//! the machine's load: run it under `valgrind --tool=callgrind` (valgrind has no AVX-512, so
//! the ciphers take their AES-NI and AVX2 paths there) and read the totals of
//! `Session::fault_run` and `Session::psync`, or run it plainly for times.
//!
//! `cargo build --release -p pmo-store --example store_path_cost` then
//! `valgrind --tool=callgrind --callgrind-out-file=cg.out target/release/examples/store_path_cost`
//! and `callgrind_annotate --inclusive=yes cg.out | grep -E 'fault_run|Session::psync'`.
//!
//! For each suite (`aes-gcm`, the default; `xts-blake3`): one PMO of 1024 pages on a store file
//! in `/dev/shm` (or the temporary directory), written once; then every page read page by page
//! (`Session::fault`, as a demand fault does), every page read in runs of 64
//! (`Session::fault_run`, as a prefetch run does), and one psync of every page. An argument
//! (`aes-gcm` or `xts-blake3`) runs that suite alone.

use std::sync::Arc;
use std::time::Instant;

use pmo_crypto::{KdfParams, Suite, UserKey, PAGE};
use pmo_media::{FileMedium, Medium};
use pmo_store::{CreateOptions, Perm, Store, StoreError, StoreOptions};

const PAGES: u64 = 1024;
const RUN: usize = 64;

fn main() -> Result<(), StoreError> {
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("pmo-store-path-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| pmo_media::MediumError::Io {
        what: "create the scratch directory",
        source: e,
    })?;
    let medium: Arc<dyn Medium> = Arc::new(FileMedium::create(
        &dir.join("store.img"),
        PAGES * PAGE as u64 * 8 + (64 << 20),
    )?);
    let store = Store::create(
        medium,
        StoreOptions {
            kdf: KdfParams::INSECURE_FAST,
            ..StoreOptions::default()
        },
    )?;
    let key = UserKey::new(b"store path cost")?;
    let data: Vec<[u8; PAGE]> = (0..PAGES).map(|p| [p as u8 | 1; PAGE]).collect();
    // One suite by name (its counts alone under callgrind), or both.
    let only = std::env::args().nth(1);
    for suite in [Suite::AesGcm, Suite::XtsBlake3] {
        if only.as_deref().is_some_and(|n| n != suite.name()) {
            continue;
        }
        let name = suite.name();
        let opts = CreateOptions {
            suite: Some(suite),
            ..CreateOptions::default()
        };
        store.create_pmo_with(name, PAGES * PAGE as u64, &key, opts)?;
        let w = store.attach(name, Perm::Write, &key)?;
        w.psync(data.iter().enumerate().map(|(p, d)| (p as u64, d)))?;
        let t = Instant::now();
        w.psync(data.iter().enumerate().map(|(p, d)| (p as u64, d)))?;
        let psync = t.elapsed();
        w.detach().wait()?;

        let r = store.attach(name, Perm::Read, &key)?;
        let mut page = [0u8; PAGE];
        let t = Instant::now();
        for p in 0..PAGES {
            r.fault(p, &mut page)?;
        }
        let single = t.elapsed();
        let mut run = vec![[0u8; PAGE]; RUN];
        let t = Instant::now();
        for first in (0..PAGES).step_by(RUN) {
            r.fault_run(first, &mut run).map_err(|(_, e)| e)?;
        }
        let runs = t.elapsed();
        r.detach().wait()?;
        let us = |d: std::time::Duration| d.as_nanos() as f64 / PAGES as f64 / 1e3;
        println!(
            "{name}: fault {:.2} us/page, fault_run of {RUN} {:.2} us/page, psync {:.2} us/page",
            us(single),
            us(runs),
            us(psync)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
