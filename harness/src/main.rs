//! `pmo-compare`: runs the design comparison matrix and writes compare.{md,csv} (the PNG is
//! drawn from the CSV by scripts/plot_compare.py; scripts/compare.sh runs both).
//!
//! Usage: `pmo-compare [--quick | --paper-sizes] [--pm-model] [--cxl [--cxl-latency NS]] [--out DIR]
//! [--apps micro,ycsb,filebench] [--workloads a,b,..] [--threads 1,2] [--session S] [--cadence C]
//! [--size N] [--repeat R]`

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use pmo_harness::apps::{self, App};
use pmo_harness::cxl_store::ExpanderModel;
use pmo_harness::engine::{self, cxl_design_specs, design_specs, CellResult, Env, RunParams};
use pmo_harness::metrics;
use pmo_harness::report::{Report, Row};
use pmo_harness::workloads::{self, Workload};

/// Errors of the command line.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("unknown argument {0:?} (see the usage in docs/compare.md)")]
    Unknown(String),
    #[error("{0} needs a value")]
    Missing(&'static str),
    #[error("bad value {1:?} for {0}")]
    Bad(&'static str, String),
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

/// The `--apps` groups.
const GROUPS: [&str; 3] = ["micro", "ycsb", "filebench"];

struct Args {
    quick: bool,
    /// The microbenchmarks at the papers' sizes (`Workload::paper`), with integrity only.
    paper_sizes: bool,
    pm_model: bool,
    out: PathBuf,
    /// The `--apps` groups chosen (default: all).
    groups: Option<Vec<&'static str>>,
    /// `--workloads`, by name (default: every workload of the groups).
    workloads: Option<Vec<&'static str>>,
    threads: Vec<usize>,
    session: u64,
    /// Iterations per psync; default: each workload's `default_cadence` (about 8 psyncs a run).
    cadence: Option<u64>,
    /// Main size of every microbenchmark (`Workload::with_size`); default: the preset.
    size: Option<usize>,
    /// Rounds over the matrix (each cell's median run is reported); default 3, 1 with --quick.
    repeat: Option<usize>,
    /// LPMO's CXL figure: the CXL designs on an expander store beside O and D (micro only).
    cxl: bool,
    /// The expander's media latency per block for `--cxl`, in ns.
    cxl_latency_ns: u64,
}

/// The expander of `--cxl`: Optane-like media behind one CXL hop (a 4 KiB block at about
/// 2.5 GB/s plus the hop), the default 64 MiB device cache, and the VMM's default
/// device-memory latency per page.
const CXL_MEDIA_LATENCY_NS: u64 = 2_000;
const CXL_CACHE: u64 = 64 << 20;
const CXL_DEVMEM_LATENCY_NS: u64 = 400;

/// Splits a comma list, each item one of `known`.
fn names(
    flag: &'static str,
    v: &str,
    known: &[&'static str],
) -> Result<Vec<&'static str>, CliError> {
    v.split(',')
        .map(|w| {
            known
                .iter()
                .find(|n| **n == w.trim())
                .copied()
                .ok_or_else(|| CliError::Bad(flag, w.to_string()))
        })
        .collect()
}

fn parse() -> Result<Args, CliError> {
    let mut a = Args {
        quick: false,
        paper_sizes: false,
        pm_model: false,
        out: PathBuf::from("target/compare"),
        groups: None,
        workloads: None,
        threads: vec![1, 2],
        session: 2,
        cadence: None,
        size: None,
        repeat: None,
        cxl: false,
        cxl_latency_ns: CXL_MEDIA_LATENCY_NS,
    };
    let all: Vec<&'static str> = workloads::NAMES
        .iter()
        .chain(apps::NAMES.iter())
        .copied()
        .collect();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &'static str| it.next().ok_or(CliError::Missing(name));
        match arg.as_str() {
            "--quick" => a.quick = true,
            "--paper-sizes" => a.paper_sizes = true,
            "--pm-model" => a.pm_model = true,
            "--cxl" => a.cxl = true,
            "--cxl-latency" => {
                let v = val("--cxl-latency")?;
                a.cxl_latency_ns = v
                    .parse()
                    .ok()
                    .filter(|n| *n <= 1_000_000_000)
                    .ok_or(CliError::Bad("--cxl-latency", v))?;
            }
            "--out" => a.out = PathBuf::from(val("--out")?),
            "--apps" => a.groups = Some(names("--apps", &val("--apps")?, &GROUPS)?),
            "--workloads" => a.workloads = Some(names("--workloads", &val("--workloads")?, &all)?),
            "--threads" => {
                let v = val("--threads")?;
                a.threads = v
                    .split(',')
                    .map(|t| match t.trim().parse::<usize>() {
                        Ok(n) if (1..=64).contains(&n) => Ok(n),
                        _ => Err(CliError::Bad("--threads", t.to_string())),
                    })
                    .collect::<Result<_, _>>()?;
                a.threads.sort_unstable();
                a.threads.dedup();
            }
            "--session" => {
                let v = val("--session")?;
                a.session = v.parse().map_err(|_| CliError::Bad("--session", v))?;
            }
            "--cadence" => {
                let v = val("--cadence")?;
                a.cadence = match v.parse::<u64>() {
                    Ok(n) if n > 0 => Some(n),
                    _ => return Err(CliError::Bad("--cadence", v)),
                };
            }
            "--size" => {
                let v = val("--size")?;
                a.size = match v.parse::<usize>() {
                    Ok(n) if (2..=1 << 20).contains(&n) => Some(n),
                    _ => return Err(CliError::Bad("--size", v)),
                };
            }
            "--repeat" => {
                let v = val("--repeat")?;
                a.repeat = match v.parse::<usize>() {
                    Ok(n) if (1..=20).contains(&n) => Some(n),
                    _ => return Err(CliError::Bad("--repeat", v)),
                };
            }
            _ => return Err(CliError::Unknown(arg)),
        }
    }
    if a.quick && a.paper_sizes {
        return Err(CliError::Bad("--paper-sizes", "with --quick".to_string()));
    }
    if a.cxl && a.paper_sizes {
        return Err(CliError::Bad("--cxl", "with --paper-sizes".to_string()));
    }
    Ok(a)
}

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
fn items(a: &Args) -> Result<Vec<Item>, CliError> {
    let groups = a.groups.clone().unwrap_or(GROUPS.to_vec());
    let mut out = Vec::new();
    let wanted = |name: &str, group: &str| {
        groups.contains(&group) && a.workloads.as_ref().is_none_or(|w| w.contains(&name))
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

fn run(a: &Args) -> Result<Report, CliError> {
    let items = items(a)?;
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
    eprintln!("pmo-compare: medium: {}", env.medium);
    if let Some(c) = &cxl_env {
        eprintln!("pmo-compare: CXL designs on: {}", c.medium);
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
            for &threads in &a.threads {
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
                        eprintln!(
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
                        eprintln!(
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
        for &threads in &a.threads {
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
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("pmo-compare: {e}");
            return ExitCode::from(2);
        }
    };
    let rep = match run(&a) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pmo-compare: {e}");
            return ExitCode::FAILURE;
        }
    };
    let md = rep.markdown();
    println!("{md}");
    let write = |name: &str, text: &str| {
        let p = a.out.join(name);
        std::fs::create_dir_all(&a.out)
            .and_then(|()| std::fs::write(&p, text))
            .map_err(|e| CliError::Write(p, e))
    };
    if let Err(e) = write("compare.md", &md).and_then(|()| write("compare.csv", &rep.csv())) {
        eprintln!("pmo-compare: {e}");
        return ExitCode::FAILURE;
    }
    let failed = rep.rows.iter().filter(|r| r.error.is_some()).count();
    if failed > 0 {
        eprintln!("pmo-compare: {failed} cell(s) FAILED (wrong result or error), see the tables");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
