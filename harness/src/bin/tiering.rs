//! `pmo-tiering`: the DRAM/CXL tiering evaluation (docs/tiering.md). Runs a hot-set and a
//! zipfian workload on a PMO on an emulated expander, all in DRAM and under DRAM budgets with
//! each placement policy, interleaved in rounds; writes tiering.{md,csv} (the plot is drawn
//! from the CSV by scripts/plot_tiering.py; scripts/tiering.sh runs both).
//!
//! Usage: `pmo-tiering [--pages N] [--ops N] [--threads N] [--rounds R]
//! [--budgets 50,25,..] [--policies hotness,fifo] [--patterns hotset,zipfian]
//! [--cache-mib N] [--latency-ns N] [--out DIR]`

use std::path::PathBuf;
use std::process::ExitCode;

use pmo_harness::tiering::access::{Pages, Pattern};
use pmo_harness::tiering::report::{self, Measured};
use pmo_harness::tiering::{media_has_marker, TierEnv, TieringError, Variant};

/// Errors of the command line.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("unknown argument {0:?} (see the usage in docs/tiering.md)")]
    Unknown(String),
    #[error("{0} needs a value")]
    Missing(&'static str),
    #[error("bad value {1:?} for {0}")]
    Bad(&'static str, String),
    #[error("{0}")]
    Run(#[from] TieringError),
    #[error("write {0}: {1}")]
    Write(PathBuf, std::io::Error),
}

struct Args {
    pages: u64,
    ops: u64,
    threads: usize,
    rounds: usize,
    budgets: Vec<f64>,
    policies: Vec<&'static str>,
    patterns: Vec<Pattern>,
    cache_mib: u64,
    latency_ns: u64,
    out: PathBuf,
}

fn parse() -> Result<Args, CliError> {
    let mut a = Args {
        pages: 4096,
        ops: 400_000,
        threads: 2,
        rounds: 3,
        budgets: vec![100.0, 50.0, 25.0, 12.5],
        policies: vec!["hotness", "fifo"],
        patterns: vec![Pattern::HotSet, Pattern::Zipfian],
        cache_mib: 4,
        latency_ns: cxl_t3::expander::DEFAULT_MEDIA_LATENCY_NS,
        out: PathBuf::from("target/tiering"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let flag: &'static str = match arg.as_str() {
            "--pages" => "--pages",
            "--ops" => "--ops",
            "--threads" => "--threads",
            "--rounds" => "--rounds",
            "--budgets" => "--budgets",
            "--policies" => "--policies",
            "--patterns" => "--patterns",
            "--cache-mib" => "--cache-mib",
            "--latency-ns" => "--latency-ns",
            "--out" => "--out",
            _ => return Err(CliError::Unknown(arg)),
        };
        let v = it.next().ok_or(CliError::Missing(flag))?;
        let bad = || CliError::Bad(flag, v.clone());
        let num = |lo: u64, hi: u64| {
            v.parse::<u64>()
                .ok()
                .filter(|n| (lo..=hi).contains(n))
                .ok_or_else(bad)
        };
        match flag {
            "--pages" => a.pages = num(16, 1 << 20)?,
            "--ops" => a.ops = num(1, 1 << 40)?,
            "--threads" => a.threads = num(1, 64)? as usize,
            "--rounds" => a.rounds = num(1, 100)? as usize,
            "--cache-mib" => a.cache_mib = num(1, 1 << 16)?,
            "--latency-ns" => a.latency_ns = num(0, 10_000_000)?,
            "--out" => a.out = PathBuf::from(&v),
            "--budgets" => {
                a.budgets = v
                    .split(',')
                    .map(|b| b.parse::<f64>().ok().filter(|b| *b > 0.0 && *b <= 100.0))
                    .collect::<Option<_>>()
                    .ok_or_else(bad)?
            }
            "--policies" => {
                a.policies = v
                    .split(',')
                    .map(|p| match p {
                        "hotness" => Some("hotness"),
                        "fifo" => Some("fifo"),
                        _ => None,
                    })
                    .collect::<Option<_>>()
                    .ok_or_else(bad)?
            }
            _ => {
                a.patterns = v
                    .split(',')
                    .map(Pattern::parse)
                    .collect::<Option<_>>()
                    .ok_or_else(bad)?
            }
        }
    }
    Ok(a)
}

fn run() -> Result<bool, CliError> {
    let a = parse()?;
    let mut variants = vec![Variant::AllDram];
    for &b in &a.budgets {
        for &policy in &a.policies {
            variants.push(Variant::Budget {
                policy,
                fraction: b / 100.0,
            });
        }
    }
    let mut env = TierEnv::new(a.pages * 4096, a.cache_mib << 20, a.latency_ns)?;
    eprintln!(
        "pmo-tiering: {} pages, {} accesses on {} threads, {} rounds; {}",
        a.pages, a.ops, a.threads, a.rounds, env.medium
    );
    let mut all = Vec::new();
    for round in 0..a.rounds {
        for &pattern in &a.patterns {
            let seed = 0x7131_u64 ^ ((round as u64) << 32) ^ pattern as u64;
            let pages = Pages::new(pattern, a.pages, seed);
            // Rotate the order each round so no variant always runs first.
            for i in 0..variants.len() {
                let variant = variants[(i + round) % variants.len()];
                let cell = env.run_cell(&pages, a.pages, a.ops, a.threads, variant, seed)?;
                eprintln!(
                    "round {round} {} {}: {:.3} s, {} faults, {} promotions, {} demotions",
                    pattern.name(),
                    variant.label(),
                    cell.ns as f64 / 1e9,
                    cell.faults,
                    cell.promotions,
                    cell.demotions
                );
                all.push(Measured {
                    round,
                    pattern: pattern.name(),
                    variant,
                    cell,
                });
            }
        }
    }
    let clean = !media_has_marker(env.media()).map_err(TieringError::Io)?;
    let rows = report::rows(&all);
    let targets = report::targets(&all, clean);
    let md = format!(
        "# Tiering evaluation\n\n{} pages ({} MiB), {} accesses on {} threads per cell, {} rounds; {}.\n\n{}\n{}\n",
        a.pages,
        (a.pages * 4096) >> 20,
        a.ops,
        a.threads,
        a.rounds,
        env.medium,
        report::markdown(&rows),
        targets.join("\n")
    );
    print!("{md}");
    std::fs::create_dir_all(&a.out).map_err(|e| CliError::Write(a.out.clone(), e))?;
    for (name, text) in [("tiering.md", md), ("tiering.csv", report::csv(&all))] {
        let path = a.out.join(name);
        std::fs::write(&path, text).map_err(|e| CliError::Write(path, e))?;
    }
    Ok(targets.iter().all(|t| !t.starts_with("MISS")))
}

fn main() -> ExitCode {
    match run() {
        // A missed target is a result (reported as MISS), not a failure of the tool.
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pmo-tiering: {e}");
            ExitCode::FAILURE
        }
    }
}
