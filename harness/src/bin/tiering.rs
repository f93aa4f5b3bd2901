//! `pmo-tiering`: the DRAM/CXL tiering evaluation (docs/tiering.md). Runs a hot-set and a
//! zipfian workload on a PMO on an emulated expander, all in DRAM and under DRAM budgets with
//! each placement policy, interleaved in rounds; writes tiering.{md,csv} (the plot is drawn
//! from the CSV by scripts/plot_tiering.py; scripts/tiering.sh runs both).
//!
//! Usage: `pmo-tiering --help`; the options are `pmo_harness::cli::tiering::TieringArgs`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use pmo_harness::cli::tiering::TieringArgs;
use pmo_harness::errln;
use pmo_harness::tiering::access::Pages;
use pmo_harness::tiering::report::{self, Measured};
use pmo_harness::tiering::{media_has_marker, TierEnv, TieringError, Variant};

/// Errors of a run (a bad command line is clap's: usage on stderr, exit status 2).
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("{0}")]
    Run(#[from] TieringError),
    #[error("write {0}: {1}")]
    Write(PathBuf, std::io::Error),
}

fn run(a: &TieringArgs) -> Result<bool, CliError> {
    let mut variants = vec![Variant::AllDram];
    for &b in &a.budgets {
        for &policy in &a.policies {
            variants.push(Variant::Budget {
                policy: policy.name(),
                fraction: b / 100.0,
            });
        }
    }
    let mut env = TierEnv::new(a.pages * 4096, a.cache_mib << 20, a.latency_ns)?;
    errln!(
        "pmo-tiering: {} pages, {} accesses on {} threads, {} rounds; {}",
        a.pages,
        a.ops,
        a.threads,
        a.rounds,
        env.medium
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
                errln!(
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
    pmo_harness::cli::out(&md);
    std::fs::create_dir_all(&a.out).map_err(|e| CliError::Write(a.out.clone(), e))?;
    for (name, text) in [("tiering.md", md), ("tiering.csv", report::csv(&all))] {
        let path = a.out.join(name);
        std::fs::write(&path, text).map_err(|e| CliError::Write(path, e))?;
    }
    Ok(targets.iter().all(|t| !t.starts_with("MISS")))
}

fn main() -> ExitCode {
    let a = TieringArgs::parse();
    match run(&a) {
        // A missed target is a result (reported as MISS), not a failure of the tool.
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            errln!("pmo-tiering: {e}");
            ExitCode::FAILURE
        }
    }
}
