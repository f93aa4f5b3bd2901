//! `pmo-compare`: runs the design comparison matrix and writes compare.{md,csv} (the PNG is
//! drawn from the CSV by scripts/plot_compare.py; scripts/compare.sh runs both).
//!
//! Usage: `pmo-compare [--quick] [--pm-model] [--out DIR] [--workloads a,b,..]
//! [--threads 1,2] [--session S] [--repeat R]`

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
    repeat: usize,
}

fn parse() -> Result<Args, CliError> {
    let mut a = Args {
        quick: false,
        pm_model: false,
        out: PathBuf::from("target/compare"),
        workloads: NAMES.to_vec(),
        threads: vec![1, 2],
        session: 2,
        repeat: 1,
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
            "--repeat" => {
                let v = val("--repeat")?;
                a.repeat = match v.parse::<usize>() {
                    Ok(n) if (1..=20).contains(&n) => n,
                    _ => return Err(CliError::Bad("--repeat", v)),
                };
            }
            _ => return Err(CliError::Unknown(arg)),
        }
    }
    Ok(a)
}

fn run(a: &Args) -> Result<Report, CliError> {
    let workloads: Vec<Workload> = a
        .workloads
        .iter()
        .filter_map(|n| Workload::preset(n, a.quick))
        .collect();
    let max = workloads
        .iter()
        .map(|w| w.pmo_bytes())
        .max()
        .unwrap_or(1 << 20);
    let mut env = Env::new(max, a.pm_model)?;
    let specs = design_specs();
    let mut rep = Report {
        medium: env.medium.clone(),
        quick: a.quick,
        session: a.session,
        designs: specs.iter().map(|s| s.label).collect(),
        workloads: workloads.iter().map(|w| w.name()).collect(),
        ..Default::default()
    };
    eprintln!("pmo-compare: medium: {}", env.medium);
    for w in &workloads {
        for &threads in &a.threads {
            // Compute baseline and reference checksum: best of `repeat` plain runs.
            let mut compute = u64::MAX;
            let mut want = 0;
            for _ in 0..a.repeat {
                let (ns, sum) = engine::run_plain(w, threads)?;
                compute = compute.min(ns);
                want = sum;
            }
            let p = RunParams {
                threads,
                cadence: w.default_cadence(),
                session: a.session,
            };
            // The full design x integrity matrix at one thread; with integrity only beyond.
            let integrities: &[bool] = if threads == 1 {
                &[false, true]
            } else {
                &[true]
            };
            for &integrity in integrities {
                let mut reference = None;
                for spec in &specs {
                    let mut best: Option<engine::CellResult> = None;
                    let mut error = None;
                    for _ in 0..a.repeat {
                        match engine::run_cell(&mut env, w, spec, integrity, p, want) {
                            Ok(r) => {
                                if best
                                    .as_ref()
                                    .is_none_or(|b| r.breakdown.total_ns() < b.breakdown.total_ns())
                                {
                                    best = Some(r);
                                }
                            }
                            Err(e) => {
                                error = Some(e.to_string());
                                break;
                            }
                        }
                    }
                    let r = best.unwrap_or_default();
                    if spec.label == "d" && error.is_none() {
                        reference = Some(r.sessions.clone());
                    }
                    let quality = match (spec.predictor, &reference) {
                        (Some(_), Some(refs)) if error.is_none() => {
                            metrics::exact(refs, &r.sessions).ok()
                        }
                        _ => None,
                    };
                    eprintln!(
                        "  {:<7} {:<8} {:<7} {} thr: {:>9.1} ms{}",
                        w.name(),
                        spec.label,
                        if integrity { "integ" } else { "nointeg" },
                        threads,
                        r.breakdown.total_ns() as f64 / 1e6,
                        error
                            .as_deref()
                            .map(|e| format!("  FAILED: {e}"))
                            .unwrap_or_default()
                    );
                    rep.rows.push(Row {
                        workload: w.name(),
                        params: w.params(),
                        design: spec.label,
                        integrity,
                        threads,
                        compute_ns: compute,
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
