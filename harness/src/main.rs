//! `pmo-compare`: runs the design comparison matrix and writes compare.{md,csv} (the PNG is
//! drawn from the CSV by scripts/plot_compare.py; scripts/compare.sh runs both).
//!
//! Usage: `pmo-compare [--quick] [--pm-model] [--out DIR] [--workloads a,b,..]
//! [--threads 1,2] [--session S] [--cadence C] [--size N] [--repeat R]`

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use pmo_harness::engine::{self, design_specs, Env, RunParams};
use pmo_harness::metrics;
use pmo_harness::report::{Report, Row};
use pmo_harness::workloads::{Workload, NAMES};

/// Errors of the command line.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("unknown argument {0:?} (see the usage in docs/compare.md)")]
    Unknown(String),
    #[error("{0} needs a value")]
    Missing(&'static str),
    #[error("bad value {1:?} for {0}")]
    Bad(&'static str, String),
    #[error("{0}")]
    Engine(#[from] engine::EngineError),
    #[error("{0}: two plain-memory runs gave different checksums")]
    Nondeterministic(&'static str),
    #[error("write {0}: {1}")]
    Write(PathBuf, std::io::Error),
}

struct Args {
    quick: bool,
    pm_model: bool,
    out: PathBuf,
    workloads: Vec<&'static str>,
    threads: Vec<usize>,
    session: u64,
    /// Iterations per psync; default: each workload's `default_cadence` (about 8 psyncs a run).
    cadence: Option<u64>,
    /// Main size of every workload (`Workload::with_size`); default: the preset.
    size: Option<usize>,
    /// Rounds over the matrix (each cell keeps its shortest run); default 3, 1 with --quick.
    repeat: Option<usize>,
}

fn parse() -> Result<Args, CliError> {
    let mut a = Args {
        quick: false,
        pm_model: false,
        out: PathBuf::from("target/compare"),
        workloads: NAMES.to_vec(),
        threads: vec![1, 2],
        session: 2,
        cadence: None,
        size: None,
        repeat: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &'static str| it.next().ok_or(CliError::Missing(name));
        match arg.as_str() {
            "--quick" => a.quick = true,
            "--pm-model" => a.pm_model = true,
            "--out" => a.out = PathBuf::from(val("--out")?),
            "--workloads" => {
                let v = val("--workloads")?;
                a.workloads = v
                    .split(',')
                    .map(|w| {
                        NAMES
                            .iter()
                            .find(|n| **n == w.trim())
                            .copied()
                            .ok_or_else(|| CliError::Bad("--workloads", w.to_string()))
                    })
                    .collect::<Result<_, _>>()?;
            }
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
    Ok(a)
}

/// The cell a result belongs to: (workload, threads, integrity, design) indices.
type Key = (usize, usize, bool, usize);

fn run(a: &Args) -> Result<Report, CliError> {
    let workloads: Vec<Workload> = a
        .workloads
        .iter()
        .filter_map(|n| Workload::preset(n, a.quick))
        .map(|w| a.size.map_or(w.clone(), |n| w.with_size(n)))
        .collect();
    for w in &workloads {
        w.check()
            .map_err(|e| CliError::Engine(engine::EngineError::Workload(e)))?;
    }
    let max = workloads
        .iter()
        .map(|w| w.pmo_bytes())
        .max()
        .unwrap_or(1 << 20);
    let mut env = Env::new(max, a.pm_model)?;
    let specs = design_specs();
    eprintln!("pmo-compare: medium: {}", env.medium);
    // Plain-memory compute baseline and reference checksum per (workload, threads).
    let mut compute: HashMap<(usize, usize), (u64, u64)> = HashMap::new();
    // Best (shortest) run of each cell over the rounds, or its error.
    let mut best: HashMap<Key, Result<engine::CellResult, String>> = HashMap::new();
    // Rounds over the whole matrix rather than back-to-back repeats, so a burst of load from
    // elsewhere hits one run of many cells instead of every run of one cell.
    let rounds = a.repeat.unwrap_or(if a.quick { 1 } else { 3 });
    for round in 0..rounds {
        for (wi, w) in workloads.iter().enumerate() {
            for &threads in &a.threads {
                // The baseline is short next to the cells: take the best of three per round so
                // one unlucky moment on a shared machine does not make "compute" look slow.
                for _ in 0..3 {
                    let (ns, want) = engine::run_plain(w, threads)?;
                    let e = compute.entry((wi, threads)).or_insert((ns, want));
                    e.0 = e.0.min(ns);
                    if e.1 != want {
                        return Err(CliError::Nondeterministic(w.name()));
                    }
                }
                let want = compute.get(&(wi, threads)).map_or(0, |c| c.1);
                let p = RunParams {
                    threads,
                    cadence: a.cadence.unwrap_or(w.default_cadence()),
                    session: a.session,
                };
                // The whole design x integrity matrix at one thread; with integrity beyond.
                let integrities: &[bool] = if threads == 1 {
                    &[false, true]
                } else {
                    &[true]
                };
                for &integrity in integrities {
                    for (si, spec) in specs.iter().enumerate() {
                        let key = (wi, threads, integrity, si);
                        if matches!(best.get(&key), Some(Err(_))) {
                            continue;
                        }
                        let r = engine::run_cell(&mut env, w, spec, integrity, p, want);
                        eprintln!(
                            "  round {} {:<7} {:<8} {:<7} {} thr: {}",
                            round + 1,
                            w.name(),
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
                                let keep = match best.get(&key) {
                                    Some(Ok(b)) => r.breakdown.total_ns() < b.breakdown.total_ns(),
                                    _ => true,
                                };
                                if keep {
                                    best.insert(key, Ok(r));
                                }
                            }
                            Err(e) => {
                                best.insert(key, Err(e.to_string()));
                            }
                        }
                    }
                }
            }
        }
    }
    let mut rep = Report {
        medium: env.medium.clone(),
        quick: a.quick,
        session: a.session,
        cadence: a.cadence,
        designs: specs.iter().map(|s| s.label).collect(),
        workloads: workloads.iter().map(|w| w.name()).collect(),
        ..Default::default()
    };
    let d_index = specs.iter().position(|s| s.label == "d");
    for (wi, w) in workloads.iter().enumerate() {
        for &threads in &a.threads {
            let integrities: &[bool] = if threads == 1 {
                &[false, true]
            } else {
                &[true]
            };
            for &integrity in integrities {
                // `d` (no predictor) gives each session's used pages: the metrics' reference.
                let reference = d_index
                    .and_then(|d| best.get(&(wi, threads, integrity, d)))
                    .and_then(|r| r.as_ref().ok())
                    .map(|r| r.sessions.clone());
                for (si, spec) in specs.iter().enumerate() {
                    let (r, error) = match best.remove(&(wi, threads, integrity, si)) {
                        Some(Ok(r)) => (r, None),
                        Some(Err(e)) => (Default::default(), Some(e)),
                        None => (Default::default(), Some("not run".to_string())),
                    };
                    let quality = match (spec.predictor, &reference, &error) {
                        (Some(_), Some(refs), None) => metrics::exact(refs, &r.sessions).ok(),
                        _ => None,
                    };
                    rep.rows.push(Row {
                        workload: w.name(),
                        params: w.params(),
                        design: spec.label,
                        integrity,
                        threads,
                        compute_ns: compute.get(&(wi, threads)).map_or(0, |c| c.0),
                        b: r.breakdown,
                        quality,
                        error,
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
