//! `pmo-compare`: runs the design comparison matrix and writes compare.{md,csv} (the PNG is
//! drawn from the CSV by scripts/plot_compare.py; scripts/compare.sh runs both).
//!
//! Usage: `pmo-compare --help`; the options are `pmo_harness::cli::compare::CompareArgs`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use pmo_harness::apps::{self, App};
use pmo_harness::cli::compare::{CompareArgs, Group};
use pmo_harness::cxl_store::ExpanderModel;
use pmo_harness::engine::{self, cxl_design_specs, design_specs, CellResult, Env, RunParams};
use pmo_harness::metrics;
use pmo_harness::report::{Report, Row};
use pmo_harness::workloads::{self, Workload};
use pmo_harness::{errln, outln};

/// Errors of a run (a bad command line is clap's: usage on stderr, exit status 2).
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("no workload left: --workloads names none of the --apps groups")]
    Empty,
    #[error("{0}")]
    Engine(#[from] engine::EngineError),
    #[error("{0}: the floor failed: {1}")]
    Floor(&'static str, apps::AppError),
    #[error("{0}: two plain-memory runs gave different checksums")]
    Nondeterministic(&'static str),
    #[error("write {0}: {1}")]
    Write(PathBuf, std::io::Error),
}

/// The expander of `--cxl`: the default 64 MiB device cache and the VMM's default
/// device-memory latency per page (its media latency is `--cxl-latency`).
const CXL_CACHE: u64 = 64 << 20;
const CXL_DEVMEM_LATENCY_NS: u64 = 400;

/// One workload of the matrix.
enum Item {
    /// A microbenchmark on the engine.
    Micro(Workload),
    /// An application through a PMO host.
    App(App),
}

impl Item {
    fn name(&self) -> &'static str {
        match self {
            Item::Micro(w) => w.name(),
            Item::App(a) => a.name(),
        }
    }

    fn group(&self) -> &'static str {
        match self {
            Item::Micro(_) => "micro",
            Item::App(a) => a.group(),
        }
    }

    /// Integrity settings run at `threads`: the microbenchmarks both at one thread and with
    /// integrity beyond, and with integrity only at the papers' sizes (a cell takes up to two
    /// minutes there); the applications both everywhere.
    fn integrities(&self, threads: usize, paper_sizes: bool, cxl: bool) -> &'static [bool] {
        match self {
            _ if cxl => &[true],
            Item::Micro(_) if threads > 1 || paper_sizes => &[true],
            _ => &[false, true],
        }
    }
}

/// The workloads of the run, in table order.
fn items(a: &CompareArgs) -> Result<Vec<Item>, CliError> {
    let groups = a.groups.clone().unwrap_or(Group::ALL.to_vec());
    let mut out = Vec::new();
    let wanted = |name: &str, group: &str| {
        groups.iter().any(|g| g.name() == group)
            && a.workloads
                .as_ref()
                .is_none_or(|w| w.iter().any(|n| n.0 == name))
    };
    for name in workloads::NAMES {
        if wanted(name, "micro") {
            let w = if a.paper_sizes {
                Workload::paper(name)
            } else {
                Workload::preset(name, a.quick)
            };
            if let Some(w) = w {
                let w = a.size.map_or(w.clone(), |n| w.with_size(n));
                w.check()
                    .map_err(|e| CliError::Engine(engine::EngineError::Workload(e)))?;
                out.push(Item::Micro(w));
            }
        }
    }
    for name in apps::NAMES {
        if let Some(app) = App::from_name(name) {
            if wanted(name, app.group()) {
                out.push(Item::App(app));
            }
        }
    }
    if out.is_empty() {
        return Err(CliError::Empty);
    }
    Ok(out)
}

/// The cell a result belongs to: (workload, threads, integrity, design) indices.
type Key = (usize, usize, bool, usize);

/// The run whose total is the median of `runs` (the lower one of an even count), and every
/// run's total in round order.
fn median(mut runs: Vec<CellResult>) -> Option<(CellResult, Vec<u64>)> {
    let totals = runs.iter().map(|r| r.breakdown.total_ns()).collect();
    runs.sort_by_key(|r| r.breakdown.total_ns());
    let n = runs.len();
    runs.first()?;
    let mid = runs.swap_remove((n - 1) / 2);
    Some((mid, totals))
}

fn run(a: &CompareArgs) -> Result<Report, CliError> {
    let items = items(a)?;
    let thread_counts = a.thread_counts();
    let max = items
        .iter()
        .filter_map(|i| match i {
            Item::Micro(w) => Some(w.pmo_bytes()),
            Item::App(_) => None,
        })
        .max()
        .unwrap_or(1 << 20);
    // The microbenchmarks' store (the applications make one per cell on the same medium).
    let mut env = Env::new(max, a.pm_model)?;
    // Each design with the store it runs on (true: the expander store of `--cxl`).
    let (specs, on_cxl): (Vec<_>, Vec<bool>) = if a.cxl {
        cxl_design_specs().into_iter().unzip()
    } else {
        design_specs().into_iter().map(|s| (s, false)).unzip()
    };
    // The expander of the CXL designs: the microbenchmarks' store and each application cell's.
    let cxl_model = a.cxl.then_some(ExpanderModel {
        cache: CXL_CACHE,
        media_latency_ns: a.cxl_latency_ns,
    });
    let mut cxl_env = match cxl_model {
        // As `Env::new`: primaries, tree and shadow copy take a little over twice the data.
        // The last `max` bytes are design c's working area: its working copy lives there.
        Some(model) => Some(Env::on_cxl(
            max as u64 * 3 + (32 << 20),
            64,
            model,
            CXL_DEVMEM_LATENCY_NS,
            max as u64,
        )?),
        None => None,
    };
    let runner = match cxl_model {
        Some(model) => apps::Apps::new(a.quick, a.pm_model).with_cxl(model, CXL_DEVMEM_LATENCY_NS),
        None => apps::Apps::new(a.quick, a.pm_model),
    };
    errln!("pmo-compare: medium: {}", env.medium);
    if let Some(c) = &cxl_env {
        errln!("pmo-compare: CXL designs on: {}", c.medium);
    }
    // Plain-memory compute baseline (shortest) and reference checksum per (workload, threads).
    let mut compute: HashMap<(usize, usize), (u64, u64)> = HashMap::new();
    // The floors' times per (workload, threads), one per round.
    let mut floors: HashMap<(usize, usize), Vec<u64>> = HashMap::new();
    // Every run of each cell over the rounds, or its error.
    let mut runs: HashMap<Key, Result<Vec<CellResult>, String>> = HashMap::new();
    // Rounds over the whole matrix rather than back-to-back repeats, so a burst of load from
    // elsewhere hits one run of many cells instead of every run of one cell.
    let rounds = a.repeat.unwrap_or(if a.quick { 1 } else { 3 });
    for round in 0..rounds {
        for (wi, item) in items.iter().enumerate() {
            for &threads in &thread_counts {
                let mut want = 0;
                match item {
                    Item::Micro(w) => {
                        // The baseline is short next to the cells: take the best of three per
                        // round so one unlucky moment on a shared machine does not make
                        // "compute" look slow. At the papers' sizes one run is over a minute
                        // and long enough to average the noise out.
                        for _ in 0..if a.paper_sizes { 1 } else { 3 } {
                            let (ns, sum) = engine::run_plain(w, threads)?;
                            let e = compute.entry((wi, threads)).or_insert((ns, sum));
                            e.0 = e.0.min(ns);
                            if e.1 != sum {
                                return Err(CliError::Nondeterministic(w.name()));
                            }
                        }
                        want = compute.get(&(wi, threads)).map_or(0, |c| c.1);
                    }
                    Item::App(app) => {
                        let ns = runner
                            .run_floor(*app, threads)
                            .map_err(|e| CliError::Floor(app.name(), e))?;
                        floors.entry((wi, threads)).or_default().push(ns);
                        errln!(
                            "  round {} {:<10} {:<8} {:<7} {} thr: {:>9.1} ms",
                            round + 1,
                            app.name(),
                            "floor",
                            "-",
                            threads,
                            ns as f64 / 1e6
                        );
                    }
                }
                for &integrity in item.integrities(threads, a.paper_sizes, a.cxl) {
                    for (si, spec) in specs.iter().enumerate() {
                        let key = (wi, threads, integrity, si);
                        if matches!(runs.get(&key), Some(Err(_))) {
                            continue;
                        }
                        let r = match item {
                            Item::Micro(w) => {
                                let p = RunParams {
                                    threads,
                                    cadence: a.cadence.unwrap_or(w.default_cadence()),
                                    session: a.session,
                                };
                                let env = match (&mut cxl_env, on_cxl[si]) {
                                    (Some(c), true) => c,
                                    _ => &mut env,
                                };
                                engine::run_cell(env, w, spec, integrity, p, want)
                                    .map_err(|e| e.to_string())
                            }
                            Item::App(app) => runner
                                .run_cell(*app, spec, integrity, threads, &mut |_, _| Ok(()))
                                .map_err(|e| e.to_string()),
                        };
                        errln!(
                            "  round {} {:<10} {:<8} {:<7} {} thr: {}",
                            round + 1,
                            item.name(),
                            spec.label,
                            if integrity { "integ" } else { "nointeg" },
                            threads,
                            match &r {
                                Ok(r) => format!("{:>9.1} ms", r.breakdown.total_ns() as f64 / 1e6),
                                Err(e) => format!("FAILED: {e}"),
                            }
                        );
                        match r {
                            Ok(r) => {
                                if let Ok(v) = runs.entry(key).or_insert_with(|| Ok(Vec::new())) {
                                    v.push(r);
                                }
                            }
                            Err(e) => {
                                runs.insert(key, Err(e));
                            }
                        }
                    }
                }
            }
        }
    }
    let mut rep = Report {
        medium: match &cxl_env {
            Some(c) => format!("{}; CXL designs: {}", env.medium, c.medium),
            None => env.medium.clone(),
        },
        cxl: a.cxl,
        quick: a.quick,
        paper_sizes: a.paper_sizes,
        session: a.session,
        cadence: a.cadence,
        designs: specs.iter().map(|s| s.label).collect(),
        workloads: items.iter().map(Item::name).collect(),
        rounds,
        ..Default::default()
    };
    let d_index = specs.iter().position(|s| s.label == "d");
    for (wi, item) in items.iter().enumerate() {
        let params = match item {
            Item::Micro(w) => w.params(),
            Item::App(app) => app.params(a.quick),
        };
        for &threads in &thread_counts {
            let compute_ns = match item {
                Item::Micro(_) => compute.get(&(wi, threads)).map_or(0, |c| c.0),
                Item::App(_) => {
                    let mut f = floors.get(&(wi, threads)).cloned().unwrap_or_default();
                    f.sort_unstable();
                    f.get(f.len().saturating_sub(1) / 2).copied().unwrap_or(0)
                }
            };
            // The exact metrics need the same pages in the reference run: the applications
            // give them only single-threaded (same seed, same order).
            let exact = matches!(item, Item::Micro(_)) || threads == 1;
            for &integrity in item.integrities(threads, a.paper_sizes, a.cxl) {
                let mut cells: Vec<_> = (0..specs.len())
                    .map(|si| match runs.remove(&(wi, threads, integrity, si)) {
                        Some(Ok(v)) => median(v).ok_or_else(|| "not run".to_string()),
                        Some(Err(e)) => Err(e),
                        None => Err("not run".to_string()),
                    })
                    .collect();
                // `d` (no predictor) gives each session's used pages: the metrics' reference.
                let reference = d_index
                    .and_then(|d| cells.get(d))
                    .and_then(|c| c.as_ref().ok())
                    .map(|c| c.0.sessions.clone());
                for (si, spec) in specs.iter().enumerate() {
                    let cell = std::mem::replace(&mut cells[si], Err(String::new()));
                    let (r, round_totals, error) = match cell {
                        Ok((r, totals)) => (r, totals, None),
                        Err(e) => (CellResult::default(), Vec::new(), Some(e)),
                    };
                    let quality = match (spec.predictor, &reference, &error) {
                        (Some(_), Some(refs), None) if exact => {
                            metrics::exact(refs, &r.sessions).ok()
                        }
                        _ => None,
                    };
                    rep.rows.push(Row {
                        workload: item.name(),
                        params: params.clone(),
                        design: spec.label,
                        integrity,
                        threads,
                        compute_ns,
                        b: r.breakdown,
                        quality,
                        error,
                        group: item.group(),
                        round_totals,
                    });
                }
            }
        }
    }
    Ok(rep)
}

fn main() -> ExitCode {
    let a = CompareArgs::parse();
    let rep = match run(&a) {
        Ok(r) => r,
        Err(e) => {
            errln!("pmo-compare: {e}");
            return ExitCode::FAILURE;
        }
    };
    let md = rep.markdown();
    outln!("{md}");
    let write = |name: &str, text: &str| {
        let p = a.out.join(name);
        std::fs::create_dir_all(&a.out)
            .and_then(|()| std::fs::write(&p, text))
            .map_err(|e| CliError::Write(p, e))
    };
    if let Err(e) = write("compare.md", &md).and_then(|()| write("compare.csv", &rep.csv())) {
        errln!("pmo-compare: {e}");
        return ExitCode::FAILURE;
    }
    let failed = rep.rows.iter().filter(|r| r.error.is_some()).count();
    if failed > 0 {
        errln!("pmo-compare: {failed} cell(s) FAILED (wrong result or error), see the tables");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
