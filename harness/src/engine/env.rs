//! Where a cell's PMOs live: one store on a temporary file (DRAM-backed, optionally behind the
//! PM timing model) or on an emulated CXL expander, with the benchmark key; scratch directories
//! on tmpfs.

use std::path::PathBuf;
use std::sync::Arc;

use cxl_t3::WorkingArea;
use pmo_crypto::{UserKey, PAGE};
use pmo_host::{HostConfig, HostError, PmoHost};
use pmo_media::{FileMedium, Medium, PmTiming, TimedMedium};
use pmo_store::{Design, Perm, Store, StoreOptions};

use super::EngineError;

/// Where the PMOs live: one store on a temporary file, or on an emulated CXL expander whose
/// media is a temporary file (removed on drop).
pub struct Env {
    /// The store every cell's PMO is created in (by the cell runner, `engine/mod.rs`).
    pub(super) store: Store,
    /// The benchmark key of every PMO.
    pub(super) key: UserKey,
    dir: PathBuf,
    /// Human-readable description of the medium, for reports.
    pub medium: String,
    /// Cells run so far: the next cell's PMO is `cell-{next + 1}`.
    pub(super) next: u64,
    /// What the pager charges per page moved into or out of expander device memory (design
    /// `cf`); 0 on a file.
    pub(super) device_latency_ns: u64,
    /// Design `c`'s working area on the expander: its cells touch the expander's memory
    /// directly rather than a pager window.
    pub(super) area: Option<Arc<WorkingArea>>,
}

/// Read and write slowdowns of `--pm-model` relative to the DRAM-backed file (PMBD-style
/// scaling; Optane-like: reads ~3x, writes ~6x slower than DRAM copies).
pub const PM_MODEL: PmTiming = PmTiming {
    read_factor: 3.0,
    write_factor: 6.0,
};

impl Env {
    /// A store big enough for PMOs of up to `max_pmo` bytes, one at a time.
    pub fn new(max_pmo: usize, pm_model: bool) -> Result<Env, EngineError> {
        // Primaries, tree and TSC take a little over twice the data; leave room for three.
        Env::sized((max_pmo as u64) * 3 + (32 << 20), 64, pm_model)
    }

    /// A store of at least `len` bytes with `slots` PMO table slots on an emulated CXL
    /// expander (`--pmo-store cxl=NAME`): where the CXL designs (`c`, `cl`, `cf`) run. The
    /// pagers of its cells charge `device_latency_ns` per page moved into or out of device
    /// memory. With `working` > 0 the device's last `working` bytes are design `c`'s working
    /// area (`direct=`): its cells' working copies live there and are touched directly.
    pub fn on_cxl(
        len: u64,
        slots: u32,
        model: crate::cxl_store::ExpanderModel,
        device_latency_ns: u64,
        working: u64,
    ) -> Result<Env, EngineError> {
        let dir = scratch_dir()?;
        let working = working.next_multiple_of(PAGE as u64);
        let x = crate::cxl_store::expander_store_with_area(&dir, len, slots, model, working)?;
        let desc = x.desc;
        Ok(Env {
            area: x.area,
            store: x.store,
            key: UserKey::new(KEY).map_err(|e| EngineError::Store(e.into()))?,
            dir,
            medium: format!("{desc}, {device_latency_ns} ns per page of device memory"),
            next: 0,
            device_latency_ns,
        })
    }

    /// A store of `len` bytes with `slots` PMO table slots (the most PMOs it holds).
    pub fn sized(len: u64, slots: u32, pm_model: bool) -> Result<Env, EngineError> {
        let dir = scratch_dir()?;
        let path = dir.join("store.img");
        let file = FileMedium::create(&path, len)?;
        let (medium, desc): (Arc<dyn Medium>, String) = if pm_model {
            (
                Arc::new(TimedMedium::new(file, PM_MODEL)),
                format!(
                    "PM timing model (TimedMedium: reads x{}, writes x{} over a DRAM-backed file in {})",
                    PM_MODEL.read_factor,
                    PM_MODEL.write_factor,
                    dir.display()
                ),
            )
        } else {
            (
                Arc::new(file),
                format!(
                    "DRAM-backed file (FileMedium in {}; no PM timing model)",
                    dir.display()
                ),
            )
        };
        let store = Store::create(
            medium,
            StoreOptions {
                slots: Some(slots),
                kdf: pmo_crypto::KdfParams::INSECURE_FAST,
                suites: pmo_bench_suites::suites(),
                ..Default::default()
            },
        )?;
        Ok(Env {
            store,
            key: UserKey::new(KEY).map_err(|e| EngineError::Store(e.into()))?,
            dir,
            medium: desc,
            next: 0,
            device_latency_ns: 0,
            area: None,
        })
    }
    /// A [`PmoHost`] on this store with the benchmark key: what the applications' cells attach
    /// their PMOs through.
    pub fn host(&self, config: HostConfig) -> Result<PmoHost, HostError> {
        let key = UserKey::new(KEY).map_err(|e| HostError::Store(e.into()))?;
        let config = HostConfig {
            device_memory_latency_ns: self.device_latency_ns,
            ..config
        };
        PmoHost::new(self.store.clone(), key, config)
    }

    /// The directory the store file is in (removed with the Env): scratch space of a cell.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Writes `bytes` (whole pages; the rest of the PMO stays as it is) into PMO `name` in one
    /// psync of a store session of design `d`: contents a program wrote before the measured
    /// run, without the pager.
    pub fn fill(&self, name: &str, bytes: &[u8]) -> Result<(), EngineError> {
        let s = self
            .store
            .attach_with(name, Perm::Write, &self.key, Some(Design::D))?;
        s.psync(
            bytes
                .chunks_exact(PAGE)
                .enumerate()
                .filter_map(|(i, c)| <&[u8; PAGE]>::try_from(c).ok().map(|a| (i as u64, a))),
        )?;
        s.detach().wait()?;
        Ok(())
    }

    /// Every page of PMO `name` as psynced, read through a fresh store session (not the pager).
    pub fn read_back(&self, name: &str) -> Result<Vec<u8>, EngineError> {
        let s = self
            .store
            .attach_with(name, Perm::Read, &self.key, Some(Design::D))?;
        let len = usize::try_from(s.pages() * PAGE as u64)
            .map_err(|_| EngineError::TooLarge(usize::MAX))?;
        let mut out = vec![0u8; len];
        for (i, page) in out.chunks_exact_mut(PAGE).enumerate() {
            if let Ok(pg) = <&mut [u8; PAGE]>::try_from(page) {
                s.fault(i as u64, pg)?;
            }
        }
        s.detach().wait()?;
        Ok(out)
    }
}

/// A new directory for one store, on tmpfs when there is one: a DRAM-backed file whose msync
/// is not a disk write-back (on a disk-backed /tmp every psync would time the disk, not the
/// design).
fn scratch_dir() -> Result<PathBuf, EngineError> {
    Ok(new_scratch_dir("store")?)
}

/// A new directory `pmo-compare-PID-TAG-N` on tmpfs when there is one (unique per call: two
/// stores on one file would truncate each other's mapping).
pub(crate) fn new_scratch_dir(tag: &str) -> std::io::Result<PathBuf> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let shm = std::path::Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("pmo-compare-{}-{tag}-{seq}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The user key of every benchmark PMO.
const KEY: &[u8] = b"pmo-compare benchmark key";

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
