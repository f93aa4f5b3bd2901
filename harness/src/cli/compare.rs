//! `pmo-compare`'s command line: what the design comparison runs (docs/compare.md), every value
//! typed and checked once, here.

use std::path::PathBuf;

use clap::builder::{PossibleValue, RangedU64ValueParser};
use clap::{ArgAction, Parser, ValueEnum};

use crate::{apps, workloads};

/// Runs the PMO design comparison matrix (docs/compare.md) and writes compare.md and
/// compare.csv; scripts/compare.sh also draws compare.png.
///
/// Each workload runs through the real store and pager for the designs wedi, sp-id (the
/// papers' O), d, d2, d4, d8 and adaptive, without and with integrity, and is checked against a
/// plain-memory run. Exit status: 0, 1 when a cell failed (the report is still written), 2 on a
/// bad command line.
#[derive(Debug, Clone, Parser)]
#[command(name = "pmo-compare", args_override_self = true)]
pub struct CompareArgs {
    /// Tiny sizes and one round: a smoke test (the numbers mean nothing).
    #[arg(long, conflicts_with = "paper_sizes")]
    pub quick: bool,

    /// The microbenchmarks at the papers' sizes, with integrity only.
    #[arg(long)]
    pub paper_sizes: bool,

    /// The PM timing model on the medium (default: a DRAM-backed file).
    #[arg(long)]
    pub pm_model: bool,

    /// LPMO's CXL figure, with integrity only: sp-id, d and d4 on the store file, the CXL
    /// designs c, cl, cl4, cf and cf4 on a store on an emulated expander.
    #[arg(long, conflicts_with = "paper_sizes")]
    pub cxl: bool,

    /// The expander's media latency per 4 KiB block for --cxl, in ns (at most 10^9).
    #[arg(
        long = "cxl-latency",
        value_name = "NS",
        default_value_t = CXL_MEDIA_LATENCY_NS,
        value_parser = clap::value_parser!(u64).range(..=1_000_000_000),
    )]
    pub cxl_latency_ns: u64,

    /// Where the report goes.
    #[arg(long, value_name = "DIR", default_value = "target/compare")]
    pub out: PathBuf,

    /// Workload groups [default: all three].
    #[arg(
        long = "apps",
        value_name = "GROUP,..",
        value_delimiter = ',',
        action = ArgAction::Set,
    )]
    pub groups: Option<Vec<Group>>,

    /// Workloads by name [default: every workload of the groups].
    #[arg(
        long,
        value_name = "NAME,..",
        value_delimiter = ',',
        action = ArgAction::Set,
    )]
    pub workloads: Option<Vec<WorkloadName>>,

    /// Thread counts, each 1..=64: the vCPUs, YCSB's client threads, Filebench's threads.
    #[arg(
        long,
        value_name = "N,..",
        value_delimiter = ',',
        action = ArgAction::Set,
        default_value = "1,2",
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=64),
    )]
    pub threads: Vec<usize>,

    /// Microbenchmarks: psyncs per attach session (0: detach only at the end).
    #[arg(long, value_name = "S", default_value_t = 2)]
    pub session: u64,

    /// Microbenchmarks: iterations per psync (at least 1) [default: about 8 psyncs a run].
    #[arg(long, value_name = "C", value_parser = clap::value_parser!(u64).range(1..))]
    pub cadence: Option<u64>,

    /// Microbenchmarks: the matrix order, or the pages of seq and random (2..=1048576)
    /// [default: each workload's preset].
    #[arg(
        long,
        value_name = "N",
        value_parser = RangedU64ValueParser::<usize>::new().range(2..=1 << 20),
    )]
    pub size: Option<usize>,

    /// Rounds over the whole matrix (1..=20); each row is the cell's median run [default: 3,
    /// 1 with --quick].
    #[arg(
        long,
        value_name = "R",
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=20),
    )]
    pub repeat: Option<usize>,
}

/// The expander of `--cxl`: Optane-like media behind one CXL hop (a 4 KiB block at about
/// 2.5 GB/s plus the hop).
pub const CXL_MEDIA_LATENCY_NS: u64 = 2_000;

impl CompareArgs {
    /// The thread counts in increasing order, each once.
    pub fn thread_counts(&self) -> Vec<usize> {
        let mut t = self.threads.clone();
        t.sort_unstable();
        t.dedup();
        t
    }
}

/// A group of workloads (`--apps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Group {
    /// The papers' microbenchmarks and the two scans.
    Micro,
    /// YCSB A-F on LMDB.
    Ycsb,
    /// Filebench's four personalities.
    Filebench,
}

impl Group {
    /// All groups, in table order.
    pub const ALL: [Group; 3] = [Group::Micro, Group::Ycsb, Group::Filebench];

    /// Its name on the command line and in reports (`App::group`).
    pub fn name(self) -> &'static str {
        match self {
            Group::Micro => "micro",
            Group::Ycsb => "ycsb",
            Group::Filebench => "filebench",
        }
    }
}

/// A workload the harness knows (`--workloads`): a microbenchmark of
/// [`workloads::NAMES`] or an application of [`apps::NAMES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkloadName(pub &'static str);

/// Every workload name, microbenchmarks first.
const ALL_NAMES: [WorkloadName; workloads::NAMES.len() + apps::NAMES.len()] = {
    let mut all = [WorkloadName(""); workloads::NAMES.len() + apps::NAMES.len()];
    let mut i = 0;
    while i < workloads::NAMES.len() {
        all[i] = WorkloadName(workloads::NAMES[i]);
        i += 1;
    }
    let mut j = 0;
    while j < apps::NAMES.len() {
        all[i + j] = WorkloadName(apps::NAMES[j]);
        j += 1;
    }
    all
};

impl ValueEnum for WorkloadName {
    fn value_variants<'a>() -> &'a [Self] {
        &ALL_NAMES
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<CompareArgs, clap::Error> {
        CompareArgs::try_parse_from(std::iter::once("pmo-compare").chain(args.iter().copied()))
    }

    #[test]
    fn the_clap_definition_is_consistent() {
        CompareArgs::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let a = parse(&[]).unwrap();
        assert!(!a.quick && !a.paper_sizes && !a.pm_model && !a.cxl);
        assert_eq!(a.cxl_latency_ns, 2_000);
        assert_eq!(a.out, PathBuf::from("target/compare"));
        assert_eq!((&a.groups, &a.workloads), (&None, &None));
        assert_eq!(a.thread_counts(), vec![1, 2]);
        assert_eq!(
            (a.session, a.cadence, a.size, a.repeat),
            (2, None, None, None)
        );
    }

    #[test]
    fn lists_parse_typed_and_a_later_flag_replaces_an_earlier_one() {
        let a = parse(&[
            "--apps",
            "micro,filebench",
            "--workloads",
            "lu,ycsb-a,varmail",
            "--threads",
            "2,1,2",
        ])
        .unwrap();
        assert_eq!(a.groups, Some(vec![Group::Micro, Group::Filebench]));
        assert_eq!(
            a.workloads,
            Some(vec![
                WorkloadName("lu"),
                WorkloadName("ycsb-a"),
                WorkloadName("varmail")
            ])
        );
        assert_eq!(a.thread_counts(), vec![1, 2]);
        // scripts/compare.sh puts `--threads 1 --repeat 1` before the caller's flags for
        // --paper-sizes: the caller's must win, not add to them.
        let a = parse(&[
            "--threads",
            "1",
            "--repeat",
            "1",
            "--threads",
            "2",
            "--repeat",
            "3",
        ])
        .unwrap();
        assert_eq!((a.thread_counts(), a.repeat), (vec![2], Some(3)));
    }

    #[test]
    fn every_workload_name_is_accepted_and_nothing_else() {
        for name in workloads::NAMES.iter().chain(apps::NAMES.iter()) {
            let a = parse(&["--workloads", name]).unwrap();
            assert_eq!(a.workloads, Some(vec![WorkloadName(name)]));
        }
        for group in Group::ALL {
            assert_eq!(
                parse(&["--apps", group.name()]).unwrap().groups,
                Some(vec![group])
            );
        }
        let e = parse(&["--workloads", "lu,nope"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidValue);
    }

    #[test]
    fn out_of_range_and_conflicting_values_are_refused() {
        for bad in [
            &["--threads", "0"][..],
            &["--threads", "65"],
            &["--threads", "1,x"],
            &["--cadence", "0"],
            &["--size", "1"],
            &["--size", "1048577"],
            &["--repeat", "0"],
            &["--repeat", "21"],
            &["--cxl-latency", "1000000001"],
            &["--session", "x"],
            &["--apps", "macro"],
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
        for (a, b) in [("--quick", "--paper-sizes"), ("--cxl", "--paper-sizes")] {
            let e = parse(&[a, b]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ArgumentConflict, "{a} {b}");
        }
        assert_eq!(
            parse(&["--bogus"]).unwrap_err().kind(),
            ErrorKind::UnknownArgument
        );
        assert_eq!(
            parse(&["--threads"]).unwrap_err().kind(),
            ErrorKind::InvalidValue
        );
    }
}
