//! `pmo-tiering`'s command line: what the tiering evaluation runs (docs/tiering.md), every
//! value typed and checked once, here.

use std::path::PathBuf;

use clap::builder::{PossibleValue, RangedU64ValueParser};
use clap::{ArgAction, Parser, ValueEnum};

use crate::tiering::access::Pattern;

/// Runs the DRAM/CXL tiering evaluation (docs/tiering.md) and writes tiering.md and
/// tiering.csv; scripts/tiering.sh also draws tiering.png.
///
/// A hot-set and a zipfian workload touch a PMO on an emulated expander, all in DRAM and under
/// each DRAM budget with each placement policy, interleaved in rounds. Exit status: 0 (a missed
/// target is a result, reported as MISS), 1 when the run failed, 2 on a bad command line.
#[derive(Debug, Clone, Parser)]
#[command(name = "pmo-tiering", args_override_self = true)]
pub struct TieringArgs {
    /// Pages (4 KiB) of the PMO, 16..=1048576.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 4096,
        value_parser = clap::value_parser!(u64).range(16..=1 << 20),
    )]
    pub pages: u64,

    /// Accesses per cell, 1..=2^40.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 400_000,
        value_parser = clap::value_parser!(u64).range(1..=1 << 40),
    )]
    pub ops: u64,

    /// Threads touching the PMO, 1..=64.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 2,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=64),
    )]
    pub threads: usize,

    /// Rounds, 1..=100; each runs every variant, in an order rotated per round.
    #[arg(
        long,
        value_name = "R",
        default_value_t = 3,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=100),
    )]
    pub rounds: usize,

    /// DRAM budgets, each a percentage of the PMO's pages in (0, 100].
    #[arg(
        long,
        value_name = "PCT,..",
        value_delimiter = ',',
        action = ArgAction::Set,
        default_value = "100,50,25,12.5",
        value_parser = budget,
    )]
    pub budgets: Vec<f64>,

    /// Placement policies that keep a budget.
    #[arg(
        long,
        value_name = "POLICY,..",
        value_delimiter = ',',
        action = ArgAction::Set,
        default_value = "hotness,fifo",
    )]
    pub policies: Vec<Policy>,

    /// Access patterns.
    #[arg(
        long,
        value_name = "PATTERN,..",
        value_delimiter = ',',
        action = ArgAction::Set,
        default_value = "hotset,zipfian",
    )]
    pub patterns: Vec<Pattern>,

    /// The expander's device cache in MiB, 1..=65536.
    #[arg(
        long,
        value_name = "MIB",
        default_value_t = 4,
        value_parser = clap::value_parser!(u64).range(1..=1 << 16),
    )]
    pub cache_mib: u64,

    /// The expander's media latency per block in ns, 0..=10^7.
    #[arg(
        long,
        value_name = "NS",
        default_value_t = cxl_t3::expander::DEFAULT_MEDIA_LATENCY_NS,
        value_parser = clap::value_parser!(u64).range(..=10_000_000),
    )]
    pub latency_ns: u64,

    /// Where the report goes.
    #[arg(long, value_name = "DIR", default_value = "target/tiering")]
    pub out: PathBuf,
}

/// A DRAM budget: a percentage in (0, 100].
fn budget(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|b| *b > 0.0 && *b <= 100.0)
        .ok_or_else(|| "a percentage in (0, 100]".to_string())
}

/// A placement policy (`--policies`), by the name `pmo_policies::placement_from_name` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Policy {
    /// Two segments (probation, protected) as in 2Q and SLRU; refaulting pages are protected.
    Hotness,
    /// Demotes in fault order: the no-hotness baseline.
    Fifo,
}

impl Policy {
    /// Its name for `pmo_policies::placement_from_name` and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Hotness => "hotness",
            Policy::Fifo => "fifo",
        }
    }
}

impl ValueEnum for Pattern {
    fn value_variants<'a>() -> &'a [Self] {
        &[Pattern::HotSet, Pattern::Zipfian]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<TieringArgs, clap::Error> {
        TieringArgs::try_parse_from(std::iter::once("pmo-tiering").chain(args.iter().copied()))
    }

    #[test]
    fn the_clap_definition_is_consistent() {
        TieringArgs::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let a = parse(&[]).unwrap();
        assert_eq!((a.pages, a.ops, a.threads, a.rounds), (4096, 400_000, 2, 3));
        assert_eq!(a.budgets, vec![100.0, 50.0, 25.0, 12.5]);
        assert_eq!(a.policies, vec![Policy::Hotness, Policy::Fifo]);
        assert_eq!(a.patterns, vec![Pattern::HotSet, Pattern::Zipfian]);
        assert_eq!(a.cache_mib, 4);
        assert_eq!(a.latency_ns, cxl_t3::expander::DEFAULT_MEDIA_LATENCY_NS);
        assert_eq!(a.out, PathBuf::from("target/tiering"));
    }

    #[test]
    fn lists_parse_typed_and_a_later_flag_replaces_an_earlier_one() {
        let a = parse(&[
            "--budgets",
            "50,25",
            "--policies",
            "fifo",
            "--patterns",
            "zipfian",
            "--latency-ns",
            "0",
            "--budgets",
            "12.5",
        ])
        .unwrap();
        assert_eq!(a.budgets, vec![12.5]);
        assert_eq!(a.policies, vec![Policy::Fifo]);
        assert_eq!(a.patterns, vec![Pattern::Zipfian]);
        assert_eq!(a.latency_ns, 0);
    }

    #[test]
    fn every_policy_name_is_one_the_policies_crate_knows() {
        for p in Policy::value_variants() {
            assert!(pmo_policies::placement_from_name(p.name()).is_ok(), "{p:?}");
            assert_eq!(
                p.to_possible_value().map(|v| v.get_name().to_string()),
                Some(p.name().into())
            );
        }
    }

    #[test]
    fn out_of_range_values_are_refused() {
        for bad in [
            &["--pages", "15"][..],
            &["--pages", "1048577"],
            &["--ops", "0"],
            &["--threads", "65"],
            &["--rounds", "0"],
            &["--budgets", "0"],
            &["--budgets", "50,100.5"],
            &["--budgets", "NaN"],
            &["--policies", "lru"],
            &["--patterns", "hotset,uniform"],
            &["--cache-mib", "0"],
            &["--latency-ns", "10000001"],
        ] {
            let e = parse(bad).unwrap_err();
            assert!(
                matches!(
                    e.kind(),
                    ErrorKind::InvalidValue | ErrorKind::ValueValidation
                ),
                "{bad:?}: {e}"
            );
        }
        assert_eq!(
            parse(&["--bogus"]).unwrap_err().kind(),
            ErrorKind::UnknownArgument
        );
    }
}
