//! Runs one cell of the comparison matrix (workload × design × integrity × threads) through the
//! real store and pager, and the same workload in plain memory for the compute baseline.
//!
//! A run follows docs/workloads.md: iterations; a psync after every `cadence` iterations (and
//! after the last); a detach and re-attach after every `session` psyncs. The pieces are timed the
//! way the papers break time down (seed 000 Fig. 6, seed 002 Fig. 6):
//! - **attach**: `Store::attach_with` + the pager slice + the predictor (for `wedi` this
//!   decrypts and verifies the whole PMO);
//! - **attach stall**: waiting for the previous session's background detach to finish before the
//!   next attach (and, at the end, for the last one);
//! - **workload**: the iterations on the pager's window, host threads playing vCPUs (compute
//!   plus every page fault they take);
//! - **psync**: collecting the dirty pages from the window and `Session::psync`;
//! - **detach**: the pager detach plus the nonblocking `Session::detach` call.
//!
//! After the run, the PMO is read back through a fresh session (not timed) and its checksum
//! compared with the plain-memory run's: a pager or store that lost or mixed up a page fails
//! the cell loudly.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use cxl_t3::WorkingArea;
use pmo_crypto::{Suite, UserKey, PAGE};
use pmo_host::{HostConfig, HostError, PmoHost};
use pmo_media::{FileMedium, Medium, PmTiming, TimedMedium};
use pmo_pager::source::{Attachment, AttachmentError};
use pmo_pager::working::{WorkingCopy, WorkingError};
use pmo_pager::{Pager, PagerError};
use pmo_store::{
    CreateOptions, Design, DetachHandle, Perm, Session, Store, StoreError, StoreOptions,
};

use crate::workloads::{PlainMem, Workload, WorkloadError};

mod breakdown;
pub use breakdown::{Breakdown, CellResult, SessionPages};

/// Errors of a harness run.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The store refused an operation.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The pager refused an operation.
    #[error("pager: {0}")]
    Pager(#[from] PagerError),
    /// A workload's parameters or memory.
    #[error("workload: {0}")]
    Workload(#[from] WorkloadError),
    /// A predictor spec of a design.
    #[error("predictor: {0}")]
    Policy(#[from] pmo_policies::PolicyError),
    /// The store file.
    #[error("medium: {0}")]
    Medium(#[from] pmo_media::MediumError),
    /// The temporary directory.
    #[error("temp dir: {0}")]
    Io(#[from] std::io::Error),
    /// A cell computed something else than plain memory did: the run is wrong, not slow.
    #[error(
        "{workload}/{design}: checksum {got:016x} differs from the plain-memory run's {want:016x}"
    )]
    Mismatch {
        /// The workload.
        workload: &'static str,
        /// The design's label.
        design: String,
        /// The cell's checksum.
        got: u64,
        /// The plain-memory run's.
        want: u64,
    },
    /// An attachment's psync or detach failed.
    #[error("attachment: {0}")]
    Attachment(#[from] AttachmentError),
    /// A design `c` working copy could not be made or psynced.
    #[error("working copy: {0}")]
    Working(#[from] WorkingError),
    /// A PMO larger than this process can map.
    #[error("PMO of {0} bytes does not fit the address space")]
    TooLarge(usize),
    /// The expander store could not be made.
    #[error("{0}")]
    CxlStore(#[from] crate::cxl_store::CxlStoreError),
    /// A CXL design without integrity: its only cipher is the range key and its tag is the
    /// integrity, so there is no such cell.
    #[error("design {0} has no run without integrity")]
    NoIntegrityOff(&'static str),
}

/// A design of the comparison: a store design plus, for LPMO's `dN` and `adaptive`, a predictor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesignSpec {
    /// Label in tables: `wedi`, `sp-id` (the papers' O), `d`, `d2`, `d4`, `d8`, `adaptive`.
    pub label: &'static str,
    /// The store design of the PMO and its sessions.
    pub design: Design,
    /// Spec for `pmo_policies::predictor_from_name`, none for no prediction.
    pub predictor: Option<&'static str>,
}

/// The designs the issue compares, in table order.
pub fn design_specs() -> Vec<DesignSpec> {
    let d = |label, predictor| DesignSpec {
        label,
        design: Design::D,
        predictor,
    };
    vec![
        DesignSpec {
            label: "wedi",
            design: Design::Wedi,
            predictor: None,
        },
        DesignSpec {
            label: "sp-id",
            design: Design::SpId,
            predictor: None,
        },
        d("d", None),
        d("d2", Some("stream:2")),
        d("d4", Some("stream:4")),
        d("d8", Some("stream:8")),
        d("adaptive", Some("adaptive")),
    ]
}

/// The columns of LPMO's CXL figure (seed 000, Fig. 13): O and D on the store file, then the
/// CXL designs on an expander store, with and without a depth-4 stream predictor (the paper's
/// L4 and F4 are `cl4` and `cf4` here). `on_cxl` says which store a column runs on.
pub fn cxl_design_specs() -> Vec<(DesignSpec, bool)> {
    let spec = |label, design, predictor| DesignSpec {
        label,
        design,
        predictor,
    };
    vec![
        (spec("sp-id", Design::SpId, None), false),
        (spec("d", Design::D, None), false),
        (spec("d4", Design::D, Some("stream:4")), false),
        (spec("c", Design::C, None), true),
        (spec("cl", Design::Cl, None), true),
        (spec("cl4", Design::Cl, Some("stream:4")), true),
        (spec("cf", Design::Cf, None), true),
        (spec("cf4", Design::Cf, Some("stream:4")), true),
    ]
}

/// How a run is driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunParams {
    /// Host threads touching the window (the vCPUs).
    pub threads: usize,
    /// Iterations between psyncs.
    pub cadence: u64,
    /// Psyncs per attach session (0: never detach until the end).
    pub session: u64,
}

/// Where the PMOs live: one store on a temporary file, or on an emulated CXL expander whose
/// media is a temporary file (removed on drop).
pub struct Env {
    store: Store,
    key: UserKey,
    dir: PathBuf,
    /// Human-readable description of the medium, for reports.
    pub medium: String,
    next: u64,
    /// What the pager charges per page moved into or out of expander device memory (design
    /// `cf`); 0 on a file.
    device_latency_ns: u64,
    /// Design `c`'s working area on the expander: its cells touch the expander's memory
    /// directly rather than a pager window.
    area: Option<Arc<WorkingArea>>,
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

/// The suite of a cell's PMOs. With integrity, every file design runs the papers' cipher and
/// a keyed MAC (`xts-blake3`), so cells differ only in their design (the product gives `d` the
/// faster `aes-gcm`, which `sp-id` cannot defer tags with; docs/compare.md), and the CXL
/// designs their range key alone; without, the no-MAC benchmark suite (which the CXL designs
/// have not: their tag is their integrity).
pub(crate) fn cell_suite(spec: &DesignSpec, integrity: bool) -> Result<Suite, EngineError> {
    match (integrity, spec.design.needs_range_encryption()) {
        (true, true) => Ok(spec.design.default_suite()),
        (true, false) => Ok(Suite::XtsBlake3),
        (false, false) => Ok(pmo_bench_suites::NOMAC),
        (false, true) => Err(EngineError::NoIntegrityOff(spec.label)),
    }
}

impl Env {
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

/// The user key of every benchmark PMO.
const KEY: &[u8] = b"pmo-compare benchmark key";

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One live attach session: the store session behind a pager slice, or (design `c` with a
/// working area) beside its working copy on the expander.
enum Attached {
    Window(Attachment),
    Direct { copy: WorkingCopy, session: Session },
}

impl Attached {
    /// The PMO's bytes: its slice of the window, or its working copy.
    ///
    /// The caller holds the pager for as long as the attachment (it is dropped only after the
    /// last detach), which keeps the mapping alive; a working copy's memory is the expander's
    /// DPA mapping, alive while the copy is. The exclusive borrow of `self` makes the slice the
    /// only view of it in the harness, and nothing else in the harness touches that memory
    /// while the workload runs. The pager or the expander only install pages that are not
    /// present yet (the kernel makes the faulting access wait) and read written pages at
    /// psync, which the harness calls between iterations.
    fn memory(&mut self, pager: &Pager) -> Result<&mut [u8], EngineError> {
        let (addr, len) = match self {
            Attached::Window(a) => {
                let len = a.npages() * PAGE as u64;
                if a.offset() + len > pager.size() {
                    return Err(EngineError::Pager(PagerError::NoSlice(a.offset())));
                }
                (a.host_addr(pager), len)
            }
            Attached::Direct { copy, .. } => (copy.host_addr(), copy.len()),
        };
        let len = usize::try_from(len).map_err(|_| EngineError::TooLarge(usize::MAX))?;
        // SAFETY: `[addr, addr + len)` is the attachment's own live memory (checked above for
        // the window); see the doc comment for why exclusive use holds for the borrow.
        Ok(unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) })
    }

    /// Psyncs the pages written since the last psync; returns how many.
    fn psync(&self, pager: &Pager) -> Result<u64, EngineError> {
        match self {
            Attached::Window(a) => Ok(a.psync(pager)?),
            Attached::Direct { copy, session } => Ok(copy.psync(session)?),
        }
    }
}

/// Runs a workload on plain resident memory: returns (iteration time in ns, checksum).
pub fn run_plain(w: &Workload, threads: usize) -> Result<(u64, u64), EngineError> {
    let mut m = PlainMem::new(w.pmo_bytes());
    w.init(m.bytes())?;
    let t = Instant::now();
    for it in 0..w.iters() {
        w.run_iter(m.bytes(), it, threads)?;
    }
    let ns = t.elapsed().as_nanos() as u64;
    Ok((ns, w.checksum(m.bytes(), w.iters())?))
}

/// Runs one cell through the store and the pager; checks its result against `want`.
pub fn run_cell(
    env: &mut Env,
    w: &Workload,
    spec: &DesignSpec,
    integrity: bool,
    p: RunParams,
    want: u64,
) -> Result<CellResult, EngineError> {
    env.next += 1;
    let name = format!("cell-{}", env.next);
    let bytes = w.pmo_bytes();
    let suite = cell_suite(spec, integrity)?;
    env.store.create_pmo_with(
        &name,
        bytes as u64,
        &env.key,
        CreateOptions {
            design: spec.design,
            suite: Some(suite),
            kdf: None,
        },
    )?;
    let r = run_created(env, &name, w, spec, p, want);
    let d = env.store.destroy_pmo(&name, &env.key);
    let r = r?;
    d?;
    Ok(r)
}

fn run_created(
    env: &Env,
    name: &str,
    w: &Workload,
    spec: &DesignSpec,
    p: RunParams,
    want: u64,
) -> Result<CellResult, EngineError> {
    let bytes = w.pmo_bytes();
    let npages = (bytes / PAGE) as u64;
    // Initial contents, written as a program would before the measured run (not timed).
    {
        let mut init = PlainMem::new(bytes);
        w.init(init.bytes())?;
        let s = env
            .store
            .attach_with(name, Perm::Write, &env.key, Some(Design::D))?;
        let mem = init.bytes();
        s.psync(
            mem.chunks_exact(PAGE)
                .enumerate()
                .filter_map(|(i, c)| <&[u8; PAGE]>::try_from(c).ok().map(|a| (i as u64, a))),
        )?;
        s.detach().wait()?;
    }
    let pager = Pager::new(npages * PAGE as u64, 2)?;
    pager.set_device_memory_latency(std::time::Duration::from_nanos(env.device_latency_ns));
    let mut b = Breakdown::default();
    let mut sessions = Vec::new();
    let mut pending: Option<DetachHandle> = None;
    let attach = |b: &mut Breakdown, pending: &mut Option<DetachHandle>| {
        let t = Instant::now();
        if let Some(h) = pending.take() {
            h.wait()?;
        }
        let t1 = Instant::now();
        b.stall_ns += (t1 - t).as_nanos() as u64;
        let a = attach_one(env, &pager, name, spec)?;
        b.attach_ns += t1.elapsed().as_nanos() as u64;
        b.sessions += 1;
        Ok::<_, EngineError>(a)
    };
    let mut cur = attach(&mut b, &mut pending)?;
    let mut in_session = 0;
    let iters = w.iters();
    for it in 0..iters {
        let mem = cur.memory(&pager)?;
        let t = Instant::now();
        w.run_iter(mem, it, p.threads)?;
        b.workload_ns += t.elapsed().as_nanos() as u64;
        let last = it + 1 == iters;
        if (it + 1) % p.cadence.max(1) == 0 || last {
            let t = Instant::now();
            b.psync_pages += cur.psync(&pager)?;
            b.psync_ns += t.elapsed().as_nanos() as u64;
            b.psyncs += 1;
            in_session += 1;
            if p.session > 0 && in_session == p.session && !last {
                pending = Some(detach(&pager, cur, &mut b, &mut sessions)?);
                cur = attach(&mut b, &mut pending)?;
                in_session = 0;
            }
        }
    }
    let h = detach(&pager, cur, &mut b, &mut sessions)?;
    let t = Instant::now();
    h.wait()?;
    b.stall_ns += t.elapsed().as_nanos() as u64;
    drop(pager);
    // Read the psynced result back through the store (not timed) and check it.
    let got = {
        let s = env
            .store
            .attach_with(name, Perm::Read, &env.key, Some(Design::D))?;
        let mut back = PlainMem::new(bytes);
        for (i, page) in back.bytes().chunks_exact_mut(PAGE).enumerate() {
            if let Ok(pg) = <&mut [u8; PAGE]>::try_from(page) {
                s.fault(i as u64, pg)?;
            }
        }
        s.detach().wait()?;
        w.checksum(back.bytes(), iters)?
    };
    if got != want {
        return Err(EngineError::Mismatch {
            workload: w.name(),
            design: spec.label.to_string(),
            got,
            want,
        });
    }
    Ok(CellResult {
        breakdown: b,
        sessions,
        checksum: got,
    })
}

fn attach_one(
    env: &Env,
    pager: &Pager,
    name: &str,
    spec: &DesignSpec,
) -> Result<Attached, EngineError> {
    let session = env
        .store
        .attach_with(name, Perm::Write, &env.key, Some(spec.design))?;
    if let (Design::C, Some(area)) = (spec.design, &env.area) {
        let copy = WorkingCopy::attach(&session, area)?;
        return Ok(Attached::Direct { copy, session });
    }
    let predictor = spec
        .predictor
        .map(pmo_policies::predictor_from_name)
        .transpose()?;
    Ok(Attached::Window(Attachment::attach(
        pager, session, true, predictor,
    )?))
}

fn detach(
    pager: &Pager,
    a: Attached,
    b: &mut Breakdown,
    sessions: &mut Vec<SessionPages>,
) -> Result<DetachHandle, EngineError> {
    use std::sync::atomic::Ordering::Relaxed;
    let a = match a {
        Attached::Window(a) => a,
        Attached::Direct { copy, session } => {
            // No pager: nothing faulted or predicted through it.
            sessions.push(SessionPages::default());
            let t = Instant::now();
            // The working copy goes first (wiped), then the session.
            drop(copy);
            let h = session.detach();
            b.detach_ns += t.elapsed().as_nanos() as u64;
            return Ok(h);
        }
    };
    // Not timed: bookkeeping of the harness.
    let sets = pager.page_sets(a.offset())?;
    let stats = a.stats().clone();
    let late = stats.prefetch_late.load(Relaxed);
    b.faults += sets.demand.len() as u64;
    b.late += late;
    sessions.push(SessionPages {
        demand: sets.demand,
        prefetched: sets.prefetched,
        late,
    });
    let t = Instant::now();
    let h = a.detach(pager)?;
    b.detach_ns += t.elapsed().as_nanos() as u64;
    // After the pager detach: it reports triggers left untouched as wasted.
    b.est += stats.prediction_counts();
    b.wp_faults += stats.wp_faults.load(Relaxed);
    b.fault_service_ns += stats.fault_ns_total.load(Relaxed);
    Ok(h)
}

#[cfg(test)]
mod tests;
