//! The applications of the comparison: YCSB A-F on LMDB and Filebench's fileserver, varmail,
//! webproxy and webserver, each run through a [`PmoHost`] (the real store and userfaultfd
//! pager) for every design, and on the floor a tenant would otherwise use: unmodified LMDB on
//! an ordinary memory-mapped file in DRAM (tmpfs), and files on tmpfs with `msync`.
//!
//! A cell has a fresh store of its own (on tmpfs, or the PM timing model), a setup phase that
//! is not measured (YCSB's load phase, Filebench's preparation of the prealloc'ed files; both
//! attach through design `d` without prediction, into PMOs created with the cell's design), the
//! measured run through the cell's host (nonblocking detach, as the engine's), and a check of
//! the result that fails the cell when anything differs: for LMDB every record against the
//! commit log of the run ([`ycsb_lmdb::check`]), for Filebench the engine's own check mode.
//!
//! The breakdown: attach, stall, psync, detach and create/destroy are the host's timers; with
//! Filebench's T threads making those calls at once, their summed time is divided by T (an
//! estimate of their share of the wall-clock time); the rest of the run's wall-clock time is
//! the workload phase, of which the floor's time of the same workload is "compute" and the
//! remainder "fault" (an estimate: whatever the window costs beyond the floor).

pub mod fb;
pub mod ycsb_lmdb;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use filebench::{CheckMode, FileBackend, Fileset, Personality};
use lmdb_pmo::{Env as Lmdb, StoreBackend};
use locked::Locked;
use pmo_crypto::{KdfParams, Suite};
use pmo_host::{HostConfig, HostError, Measurements, PmoHost, SessionRecord};
use pmo_pager::PredictionCounts;
use pmo_store::{Design, StoreError};

use crate::cxl_store::ExpanderModel;

use crate::engine::{Breakdown, CellResult, DesignSpec, EngineError, Env, SessionPages};
use pmo_policies::PredictorSpec;

/// Names of the application workloads, in table order.
pub const NAMES: [&str; 10] = [
    "ycsb-a",
    "ycsb-b",
    "ycsb-c",
    "ycsb-d",
    "ycsb-e",
    "ycsb-f",
    "fileserver",
    "varmail",
    "webproxy",
    "webserver",
];

/// Errors of an application cell.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The PMO host refused.
    #[error("pmo host: {0}")]
    Host(#[from] HostError),
    /// LMDB failed.
    #[error("lmdb: {0}")]
    Lmdb(#[from] lmdb_pmo::Error),
    /// The YCSB generator refused.
    #[error("ycsb: {0}")]
    Ycsb(#[from] ycsb::Error),
    /// The Filebench engine failed.
    #[error("filebench: {0}")]
    Filebench(#[from] filebench::Error),
    /// The store of the cell.
    #[error("{0}")]
    Engine(#[from] EngineError),
    /// A scratch directory or file.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// A parameter out of range.
    #[error("bad parameter: {0}")]
    Params(String),
    /// A worker thread panicked.
    #[error("a worker thread panicked")]
    Thread,
    /// The result is wrong: the run lost, mixed up or invented data.
    #[error("wrong result: {0}")]
    Check(String),
}

/// One application workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum App {
    /// A YCSB core workload on LMDB.
    Ycsb(ycsb::Workload),
    /// A Filebench personality, one PMO per file.
    Filebench(Personality),
}

impl App {
    /// The workload of a name in [`NAMES`].
    pub fn from_name(name: &str) -> Option<App> {
        if let Some(letter) = name.strip_prefix("ycsb-") {
            return letter.parse().ok().map(App::Ycsb);
        }
        name.parse().ok().map(App::Filebench)
    }

    /// Its name in [`NAMES`].
    pub fn name(self) -> &'static str {
        let i = match self {
            App::Ycsb(w) => w as usize,
            App::Filebench(p) => 6 + p as usize,
        };
        NAMES.get(i).copied().unwrap_or("?")
    }

    /// `ycsb` or `filebench` (the `--apps` group).
    pub fn group(self) -> &'static str {
        match self {
            App::Ycsb(_) => "ycsb",
            App::Filebench(_) => "filebench",
        }
    }

    /// Size parameters, for reports.
    pub fn params(self, quick: bool) -> String {
        match self {
            App::Ycsb(_) => ycsb_lmdb::YcsbScale::preset(quick).describe(),
            App::Filebench(p) => fb::describe(&fb::config(p, 1, quick)),
        }
    }

    /// How many threads make PMO calls at the same time: their summed time is divided by this
    /// in the breakdown. Filebench's threads each open, sync and close files; YCSB's attach and
    /// detach happen between sessions and its psyncs hold LMDB's single writer lock.
    fn overlap(self, threads: usize) -> u64 {
        match self {
            App::Ycsb(_) => 1,
            App::Filebench(_) => threads.max(1) as u64,
        }
    }
}

/// Where a cell's hook is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// After the setup phase, before the measured run.
    Ready,
    /// After the measured run, before the check.
    Ran,
}

/// Called with the cell's host at each [`Stage`]; the tests damage the PMOs there the way a
/// broken design would, to see the check fail the cell.
pub type Hook<'h> = &'h mut dyn FnMut(Stage, &PmoHost) -> Result<(), AppError>;

/// What a cell's measured run gave.
#[derive(Debug, Clone, Default)]
pub struct AppRun {
    /// Wall-clock time of the run, including waiting for the last background detaches.
    pub wall_ns: u64,
    /// The host's timers and counters over the run.
    pub m: Measurements,
    /// Each session's page sets (single-threaded runs).
    pub sessions: Vec<SessionRecord>,
}

impl AppRun {
    /// The run as the engine's [`CellResult`]: PMO calls' time divided by `overlap`, the rest
    /// of the wall-clock time as the workload phase.
    pub fn cell(&self, overlap: u64) -> CellResult {
        let d = overlap.max(1);
        let m = &self.m;
        let mut b = Breakdown {
            attach_ns: m.attach_ns / d,
            stall_ns: m.stall_ns / d,
            psync_ns: m.psync_ns / d,
            detach_ns: m.detach_ns / d,
            create_ns: (m.create_ns + m.destroy_ns) / d,
            workload_ns: 0,
            sessions: m.attaches,
            psyncs: m.psyncs,
            psync_pages: m.psync_pages,
            faults: m.faults,
            late: m.prefetch_late,
            wp_faults: m.wp_faults,
            est: PredictionCounts {
                pages_prefetched: m.pages_prefetched,
                trigger_hits: m.trigger_hits,
                trigger_wasted: m.trigger_wasted,
                prefetch_late: m.prefetch_late,
                demand_unpredicted: m.demand_unpredicted,
            },
            fault_service_ns: m.fault_ns,
        };
        let calls = b.total_ns();
        b.workload_ns = self.wall_ns.saturating_sub(calls);
        CellResult {
            breakdown: b,
            sessions: self
                .sessions
                .iter()
                .map(|s| SessionPages {
                    demand: s.demand.clone(),
                    prefetched: s.prefetched.clone(),
                    late: s.late,
                })
                .collect(),
            checksum: 0,
        }
    }
}

fn ns(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// A host configuration of a cell: the measured one (nonblocking detach, the design's
/// predictor, sessions recorded when asked) or the setup's (`d`, blocking).
fn host_config(
    design: Design,
    suite: Suite,
    predictor: Option<&str>,
    measured: bool,
    record: bool,
) -> Result<HostConfig, AppError> {
    let predictor = predictor
        .map(str::parse::<PredictorSpec>)
        .transpose()
        .map_err(EngineError::from)?
        .unwrap_or_default();
    Ok(HostConfig {
        design,
        suite,
        // Every attach derives the PMO's key; the papers' systems have no such cost per attach
        // (the engine's PMOs use the same cheap parameters).
        kdf: KdfParams::INSECURE_FAST,
        predictor,
        fault_threads: 2,
        window: 1 << 30,
        nonblocking_detach: measured,
        record_sessions: record,
        // Set by `Env::host` from the store it runs on.
        device_memory_latency_ns: 0,
    })
}

fn suite(spec: &DesignSpec, integrity: bool) -> Result<Suite, AppError> {
    Ok(crate::engine::cell_suite(spec, integrity)?)
}

/// Runs the application cells and floors of one comparison at one size: quick or full, on the
/// DRAM-backed file or the PM timing model. Keeps YCSB's loaded database (the same for every
/// workload, thread count and design), made once.
pub struct Apps {
    quick: bool,
    pm_model: bool,
    /// The expander the CXL designs' cells run on, and its device-memory latency per page.
    cxl: Option<(ExpanderModel, u64)>,
    image: std::sync::Mutex<Option<Arc<Vec<u8>>>>,
}

impl Apps {
    /// A runner of cells at `quick` or full sizes, on the PM timing model or not.
    pub fn new(quick: bool, pm_model: bool) -> Apps {
        Apps {
            quick,
            pm_model,
            cxl: None,
            image: std::sync::Mutex::new(None),
        }
    }

    /// The same runner, with the CXL designs' cells on a store on an expander of `model`
    /// whose device memory costs `devmem_ns` per page (`pmo-compare --cxl`).
    pub fn with_cxl(self, model: ExpanderModel, devmem_ns: u64) -> Apps {
        Apps {
            cxl: Some((model, devmem_ns)),
            ..self
        }
    }

    /// A store of `len` bytes with `slots` PMO slots for `spec`: on the expander for a CXL
    /// design, else on a file.
    fn env_for(&self, spec: &DesignSpec, len: u64, slots: u32) -> Result<Env, AppError> {
        if !spec.design.needs_range_encryption() {
            return Ok(Env::sized(len, slots, self.pm_model)?);
        }
        let Some((model, devmem)) = self.cxl else {
            return Err(EngineError::Store(StoreError::NeedsRangeEncryption {
                name: spec.label.to_string(),
                what: format!("design {}", spec.design.name()),
            })
            .into());
        };
        // The applications attach through `PmoHost` and its pager: no working area.
        Ok(Env::on_cxl(len, slots, model, devmem, 0)?)
    }

    /// YCSB's database after the load phase: LMDB's data file, loaded once on a file.
    fn ycsb_image(&self, s: &ycsb_lmdb::YcsbScale) -> Result<Arc<Vec<u8>>, AppError> {
        let mut image = self.image.locked();
        if let Some(i) = &*image {
            return Ok(i.clone());
        }
        let dir = Scratch::new("load")?;
        {
            let e = Lmdb::builder().map_size(s.map_size()).open_dir(&dir.0)?;
            ycsb_lmdb::load(&e, s)?;
        }
        let mut bytes = std::fs::read(dir.0.join("data.mdb"))?;
        bytes.resize(bytes.len().next_multiple_of(PAGE), 0);
        let i = Arc::new(bytes);
        *image = Some(i.clone());
        Ok(i)
    }

    /// Runs one cell of `app` for `spec` through a fresh store, checks its result and returns
    /// it with the breakdown; `hook` is called after the setup and after the run.
    pub fn run_cell(
        &self,
        app: App,
        spec: &DesignSpec,
        integrity: bool,
        threads: usize,
        hook: Hook<'_>,
    ) -> Result<CellResult, AppError> {
        let record = threads == 1;
        let run = match app {
            App::Ycsb(w) => {
                let s = ycsb_lmdb::YcsbScale::preset(self.quick);
                let image = self.ycsb_image(&s)?;
                let env = self.env_for(spec, s.map_size() as u64 * 3 + (64 << 20), 64)?;
                let cell = YcsbCell {
                    env: &env,
                    w,
                    spec,
                    suite: suite(spec, integrity)?,
                    threads,
                    s: &s,
                    record,
                };
                cell.run(&image, hook)?
            }
            App::Filebench(p) => {
                let c = fb::config(p, threads, self.quick);
                let (len, slots) = fb::store_size(&c);
                let env = self.env_for(spec, len, slots)?;
                fb_cell(&env, spec, suite(spec, integrity)?, &c, record, hook)?
            }
        };
        Ok(run.cell(app.overlap(threads)))
    }

    /// The floor: `app` without PMOs as a tenant would otherwise run it, in DRAM: LMDB 0.9.24
    /// unmodified on a memory-mapped file in tmpfs (normal durable commits, no encryption), or
    /// the Filebench engine on files in tmpfs (`msync` as sync). Same sizes, sessions, seed,
    /// loaded database and checks as the cells; returns the run phase's wall-clock time.
    pub fn run_floor(&self, app: App, threads: usize) -> Result<u64, AppError> {
        let dir = Scratch::new("floor")?;
        match app {
            App::Ycsb(w) => {
                let s = ycsb_lmdb::YcsbScale::preset(self.quick);
                let image = self.ycsb_image(&s)?;
                let db = dir.0.join("db");
                std::fs::create_dir_all(&db)?;
                std::fs::write(db.join("data.mdb"), &image[..])?;
                let open = || Ok(Lmdb::builder().map_size(s.map_size()).open_dir(&db)?);
                let t = Instant::now();
                let writes = ycsb_lmdb::run(&open, w, &s, threads)?;
                let wall = ns(t);
                ycsb_lmdb::check(&open()?, &ycsb_lmdb::expected(&s, &writes))?;
                Ok(wall)
            }
            App::Filebench(p) => {
                let c = fb::config(p, threads, self.quick);
                let backend = FileBackend::new(dir.0.join("files"))?;
                let mut fs = Fileset::new(&c, &backend)?;
                fs.prepare()?;
                let t = Instant::now();
                fs.run()?;
                let wall = ns(t);
                let report = fs.check(CheckMode::Expect)?;
                if !report.ok() {
                    return Err(AppError::Check(format!("filebench check: {report:?}")));
                }
                Ok(wall)
            }
        }
    }
}

/// Page size of the PMOs and of LMDB's data file.
const PAGE: usize = 4096;

/// One YCSB cell on its store.
struct YcsbCell<'a> {
    env: &'a Env,
    w: ycsb::Workload,
    spec: &'a DesignSpec,
    suite: Suite,
    threads: usize,
    s: &'a ycsb_lmdb::YcsbScale,
    record: bool,
}

impl YcsbCell<'_> {
    /// The PMO (created with the cell's design) gets the loaded database in one psync; the run
    /// phase goes through the cell's host; the result is read back through a store session
    /// into a file that LMDB opens for the check.
    fn run(&self, image: &[u8], hook: Hook<'_>) -> Result<AppRun, AppError> {
        let dir = self.env.dir().join("lmdb");
        std::fs::create_dir_all(&dir)?;
        let name = StoreBackend::pmo_name_for_dir(&dir)?;
        let map = self.s.map_size();
        let host = self.env.host(host_config(
            self.spec.design,
            self.suite,
            self.spec.predictor,
            true,
            self.record,
        )?)?;
        let cell = Arc::new(StoreBackend::from_host(host));
        cell.host().create(&name, map)?;
        self.env.fill(&name, image)?;
        hook(Stage::Ready, cell.host())?;
        cell.host().reset_measurements();
        let open = || Ok(Lmdb::builder().map_size(map).open_pmo(&dir, cell.clone())?);
        let t = Instant::now();
        let writes = ycsb_lmdb::run(&open, self.w, self.s, self.threads)?;
        cell.host().drain()?;
        let wall_ns = ns(t);
        let m = cell.host().measurements();
        let sessions = cell.host().take_sessions();
        hook(Stage::Ran, cell.host())?;
        let back = self.env.read_back(&name)?;
        let copy = Scratch::new("check")?;
        std::fs::write(copy.0.join("data.mdb"), back)?;
        let e = Lmdb::builder().map_size(map).open_dir(&copy.0)?;
        ycsb_lmdb::check(&e, &ycsb_lmdb::expected(self.s, &writes))?;
        Ok(AppRun {
            wall_ns,
            m,
            sessions,
        })
    }
}

fn fb_cell(
    env: &Env,
    spec: &DesignSpec,
    suite: Suite,
    c: &filebench::Config,
    record: bool,
    hook: Hook<'_>,
) -> Result<AppRun, AppError> {
    let run = env.host(host_config(
        spec.design,
        suite,
        spec.predictor,
        true,
        record,
    )?)?;
    let setup = env.host(host_config(Design::D, suite, None, false, false)?)?;
    let backend = fb::FbHost::new(&run, &setup);
    let mut fs = Fileset::new(c, &backend)?;
    fs.prepare()?;
    backend.set_measured(true);
    hook(Stage::Ready, &run)?;
    run.reset_measurements();
    let t = Instant::now();
    let summary = fs.run()?;
    run.drain()?;
    let wall_ns = ns(t);
    let m = run.measurements();
    let sessions = run.take_sessions();
    // The engine's own counts of its PMO calls must be the host's.
    let engine = (
        summary.run.creates,
        summary.run.destroys,
        summary.run.attaches,
        summary.run.psyncs,
    );
    let host = (m.creates, m.destroys, m.attaches, m.psyncs);
    if engine != host {
        return Err(AppError::Check(format!(
            "the engine counted (creates, destroys, attaches, psyncs) {engine:?}, the host {host:?}"
        )));
    }
    hook(Stage::Ran, &run)?;
    // The check reads every file through the setup host (design `d`), not measured.
    backend.set_measured(false);
    let report = fs.check(CheckMode::Expect)?;
    if !report.ok() {
        return Err(AppError::Check(format!("filebench check: {report:?}")));
    }
    Ok(AppRun {
        wall_ns,
        m,
        sessions,
    })
}

/// A scratch directory on tmpfs (the temp dir without one), removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Result<Scratch, AppError> {
        Ok(Scratch(crate::engine::new_scratch_dir(tag)?))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests;
