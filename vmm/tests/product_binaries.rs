//! No product program contains the benchmark-only page suites (issue 27 part 4).
//!
//! The design comparison measures designs "without integrity" with a suite that has no page
//! MAC, and compares with the authors' `paper` scheme. Both live in `pmo-bench-suites`, which
//! only the harness links; the store learns them from its options, never from a cargo feature,
//! so no feature unification can put them into `pmovmm`. These tests check it from outside:
//!
//! 1. the resolved dependency graph (`cargo metadata --all-features`, normal and build edges)
//!    of every workspace package but the harness lacks `pmo-bench-suites`;
//! 2. the `pmovmm` binary this test run built (with whatever features this cargo invocation
//!    unified: `cargo test --workspace` builds it beside the harness) contains none of the
//!    crate's markers, nor does any binary named in `PMO_CHECK_BINS` (colon-separated;
//!    `scripts/test.sh` names the `target/release` binaries of a root `cargo build --release`).

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The crate that holds the benchmark-only suites.
const BENCH_CRATE: &str = "pmo-bench-suites";
/// Workspace packages allowed to link it: the comparison harness (its binaries are the
/// benchmark tools) and the crate itself.
const ALLOWED: &[&str] = &["pmo-harness", BENCH_CRATE];
/// Byte strings only that crate's code puts into a binary (its `MARKERS`, copied: this test
/// must not depend on it): its crate name as symbols carry it, the labels of its suites' key
/// derivations and the no-MAC suite's name.
const MARKERS: &[&str] = &[
    "pmo_bench_suites",
    "pmo-bench-suites: paper xts",
    "pmo-bench-suites: nomac generation",
    "xts-nomac-bench",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The host's target triple (`rustc -vV`): the graph is resolved for the platform the
/// binaries run on (other platforms' dependencies are not even downloaded here).
fn host_triple() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(rustc).arg("-vV").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .unwrap()
        .to_string()
}

fn metadata() -> serde_json::Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--all-features",
            "--offline",
        ])
        .args(["--filter-platform", &host_triple()])
        .arg("--manifest-path")
        .arg(workspace().join("Cargo.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Names of the packages `root` links: its normal and build dependencies, transitively
/// (dev-dependencies only reach tests, benches and examples).
fn linked(meta: &serde_json::Value, root: &str) -> BTreeSet<String> {
    let name_of: HashMap<&str, &str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let nodes: HashMap<&str, &serde_json::Value> = meta["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let mut seen = BTreeSet::new();
    let mut todo = vec![root];
    while let Some(id) = todo.pop() {
        for dep in nodes[id]["deps"].as_array().unwrap() {
            let kinds = dep["dep_kinds"].as_array().unwrap();
            let linked = kinds
                .iter()
                .any(|k| k["kind"].is_null() || k["kind"] == "build");
            let pkg = dep["pkg"].as_str().unwrap();
            if linked && seen.insert(name_of[pkg].to_string()) {
                todo.push(pkg);
            }
        }
    }
    seen
}

#[test]
fn no_product_package_links_the_benchmark_suites() {
    let meta = metadata();
    let members: Vec<(&str, &str)> = meta["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| {
            let id = id.as_str().unwrap();
            let pkg = meta["packages"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["id"] == id)
                .unwrap();
            (id, pkg["name"].as_str().unwrap())
        })
        .collect();
    assert!(members.iter().any(|(_, n)| *n == "pmovmm"), "{members:?}");
    let mut offenders = Vec::new();
    for (id, name) in &members {
        let deps = linked(&meta, id);
        if ALLOWED.contains(name) {
            continue;
        }
        if deps.contains(BENCH_CRATE) {
            offenders.push(*name);
        }
    }
    assert!(
        offenders.is_empty(),
        "product packages that link {BENCH_CRATE}: {offenders:?}"
    );
    // The walk can see the crate where it is linked: the harness has it.
    let (harness, _) = members.iter().find(|(_, n)| *n == "pmo-harness").unwrap();
    assert!(linked(&meta, harness).contains(BENCH_CRATE));
}

/// The markers `bin` contains.
fn markers_in(bin: &Path) -> Vec<&'static str> {
    let bytes = std::fs::read(bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    // Searched as text with std's (optimized) substring search: the markers are ASCII, and a
    // lossy conversion keeps every ASCII byte where it was.
    let text = String::from_utf8_lossy(&bytes);
    // The scan sees strings of this binary: a built-in suite's name is in every pmovmm.
    assert!(
        text.contains("xts-blake3"),
        "{}: scan finds nothing",
        bin.display()
    );
    MARKERS
        .iter()
        .copied()
        .filter(|m| text.contains(m))
        .collect()
}

#[test]
fn no_pmovmm_binary_holds_a_benchmark_suite() {
    let mut bins = vec![PathBuf::from(env!("CARGO_BIN_EXE_pmovmm"))];
    if let Ok(list) = std::env::var("PMO_CHECK_BINS") {
        bins.extend(list.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    for bin in &bins {
        let found = markers_in(bin);
        assert!(
            found.is_empty(),
            "{} contains the benchmark suites' markers {found:?}",
            bin.display()
        );
    }
}
