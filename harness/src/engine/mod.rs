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
//!
//! Here: running a cell and its attach sessions. Beside it: `design.rs` (the designs compared
//! and a cell's cipher suite), `env.rs` (the store a cell's PMOs live in), `breakdown.rs` (what
//! a cell measured).

use std::time::Instant;

use pmo_crypto::PAGE;
use pmo_pager::working::WorkingError;
use pmo_pager::{AttachOptions, Attachment, AttachmentError, Pager, PagerError, WorkingPlace};
use pmo_policies::PredictorSpec;
use pmo_store::{CreateOptions, Design, DetachHandle, Perm, StoreError};

use crate::workloads::{PlainMem, Workload, WorkloadError};

mod breakdown;
mod design;
mod env;

pub use breakdown::{Breakdown, CellResult, SessionPages};
pub(crate) use design::cell_suite;
pub use design::{cxl_design_specs, design_specs, DesignSpec};
pub(crate) use env::new_scratch_dir;
pub use env::{Env, PM_MODEL};

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

/// The PMO's bytes: its slice of the window, or (design `c` with a working area) its working
/// copy on the expander.
///
/// The caller holds the pager for as long as the attachment (it is dropped only after the last
/// detach), which keeps the mapping alive; a working copy's memory is the expander's DPA
/// mapping, alive while the attachment is. The exclusive borrow of the attachment makes the
/// slice the only view of it in the harness, and nothing else in the harness touches that
/// memory while the workload runs. The pager or the expander only install pages that are not
/// present yet (the kernel makes the faulting access wait) and read written pages at psync,
/// which the harness calls between iterations.
fn memory<'a>(a: &'a mut Attachment, pager: &Pager) -> Result<&'a mut [u8], EngineError> {
    let len = a.size();
    if !a.is_direct() && a.offset().saturating_add(len) > pager.size() {
        return Err(EngineError::Pager(PagerError::NoSlice(a.offset())));
    }
    let len = usize::try_from(len).map_err(|_| EngineError::TooLarge(usize::MAX))?;
    // SAFETY: `[host_addr, host_addr + len)` is the attachment's own live memory (checked
    // above for the window); see the doc comment for why exclusive use holds for the borrow.
    Ok(unsafe { std::slice::from_raw_parts_mut(a.host_addr() as *mut u8, len) })
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
        let mem = memory(&mut cur, &pager)?;
        let t = Instant::now();
        w.run_iter(mem, it, p.threads)?;
        b.workload_ns += t.elapsed().as_nanos() as u64;
        let last = it + 1 == iters;
        if (it + 1) % p.cadence.max(1) == 0 || last {
            let t = Instant::now();
            b.psync_pages += cur.psync()?;
            b.psync_ns += t.elapsed().as_nanos() as u64;
            b.psyncs += 1;
            in_session += 1;
            if p.session > 0 && in_session == p.session && !last {
                pending = Some(detach(cur, &mut b, &mut sessions)?);
                cur = attach(&mut b, &mut pending)?;
                in_session = 0;
            }
        }
    }
    let h = detach(cur, &mut b, &mut sessions)?;
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
    pager: &std::sync::Arc<Pager>,
    name: &str,
    spec: &DesignSpec,
) -> Result<Attachment, EngineError> {
    let session = env
        .store
        .attach_with(name, Perm::Write, &env.key, Some(spec.design))?;
    let predictor = spec
        .predictor
        .map(str::parse::<PredictorSpec>)
        .transpose()?
        .unwrap_or_default();
    let opts = AttachOptions {
        name,
        predictor,
        notify: None,
        working: env
            .area
            .as_ref()
            .map_or(WorkingPlace::None, WorkingPlace::Host),
    };
    Ok(Attachment::attach(pager, session, opts)?)
}

fn detach(
    a: Attachment,
    b: &mut Breakdown,
    sessions: &mut Vec<SessionPages>,
) -> Result<DetachHandle, EngineError> {
    use std::sync::atomic::Ordering::Relaxed;
    // Not timed: bookkeeping of the harness. A working copy has no pager: nothing faulted or
    // predicted through it.
    let sets = a.page_sets()?;
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
    let d = a.detach()?;
    // A working copy goes (wiped) with its attachment.
    drop(a);
    b.detach_ns += t.elapsed().as_nanos() as u64;
    if let Some(f) = d.failure {
        return Err(AttachmentError::Failed(f).into());
    }
    // After the pager detach: it reports triggers left untouched as wasted.
    b.est += stats.prediction_counts();
    b.wp_faults += stats.wp_faults.load(Relaxed);
    b.fault_service_ns += stats.fault_ns_total.load(Relaxed);
    d.pending
        .ok_or(EngineError::Attachment(AttachmentError::Detached))
}

#[cfg(test)]
mod tests;
