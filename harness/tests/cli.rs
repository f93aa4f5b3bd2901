//! The two binaries as a script runs them: `--help` lists every option (and every option the
//! docs and scripts use), a bad value is refused with the value and the accepted ones named,
//! and a reader that has gone (stdout or stderr a pipe nobody reads) neither panics a binary
//! nor keeps it from writing its report files.

// A test file: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::pipe;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use clap::CommandFactory;
use pmo_harness::cli::compare::CompareArgs;
use pmo_harness::cli::tiering::TieringArgs;

const COMPARE: &str = env!("CARGO_BIN_EXE_pmo-compare");
const TIERING: &str = env!("CARGO_BIN_EXE_pmo-tiering");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A fresh scratch directory for one test.
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pmo-harness-cli-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(bin: &str, args: &[&str]) -> Output {
    Command::new(bin).args(args).output().unwrap()
}

/// The long options clap knows for a binary.
fn longs(cmd: clap::Command) -> BTreeSet<String> {
    cmd.get_arguments()
        .filter_map(|a| a.get_long())
        .map(|l| format!("--{l}"))
        .collect()
}

/// Every `--option` in `text` (words starting with two dashes and a letter).
fn flags_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("--") {
        let word: String = text[i + 2..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if word.starts_with(|c: char| c.is_ascii_lowercase()) {
            out.insert(format!("--{word}"));
        }
    }
    out
}

/// The options scripts and docs give each binary: what must keep working.
const COMPARE_OPTIONS: [&str; 13] = [
    "--quick",
    "--paper-sizes",
    "--pm-model",
    "--cxl",
    "--cxl-latency",
    "--out",
    "--apps",
    "--workloads",
    "--threads",
    "--session",
    "--cadence",
    "--size",
    "--repeat",
];
const TIERING_OPTIONS: [&str; 10] = [
    "--pages",
    "--ops",
    "--threads",
    "--rounds",
    "--budgets",
    "--policies",
    "--patterns",
    "--cache-mib",
    "--latency-ns",
    "--out",
];

#[test]
fn help_lists_every_option_and_the_docs_name_no_other() {
    for (bin, cmd, options) in [
        (COMPARE, CompareArgs::command(), &COMPARE_OPTIONS[..]),
        (TIERING, TieringArgs::command(), &TIERING_OPTIONS[..]),
    ] {
        let out = run(bin, &["--help"]);
        assert!(out.status.success(), "{bin} --help: {:?}", out.status);
        let help = String::from_utf8(out.stdout).unwrap();
        let mut known = longs(cmd);
        known.insert("--help".into());
        let wanted: BTreeSet<String> = options.iter().map(|o| o.to_string()).collect();
        // The parser has exactly the options the scripts and docs use (plus --help) ...
        assert_eq!(
            known,
            &wanted | &BTreeSet::from(["--help".to_string()]),
            "{bin}"
        );
        // ... and --help shows each of them.
        for o in &known {
            assert!(
                help.contains(&format!("{o} ")) || help.contains(&format!("{o}\n")),
                "{bin} --help lacks {o}:\n{help}"
            );
        }
    }
    // docs/compare.md's option table and the scripts' usage comments name only real options.
    let doc = std::fs::read_to_string(repo().join("docs/compare.md")).unwrap();
    let table: String = doc
        .lines()
        .filter(|l| l.starts_with("| `--"))
        .map(|l| l.split('|').nth(1).unwrap_or(""))
        .collect();
    let documented = flags_in(&table);
    assert!(documented.len() >= 12, "{documented:?}");
    for (script, options) in [
        ("scripts/compare.sh", &COMPARE_OPTIONS[..]),
        ("scripts/tiering.sh", &TIERING_OPTIONS[..]),
    ] {
        let text = std::fs::read_to_string(repo().join(script)).unwrap();
        let usage: String = text
            .lines()
            .take_while(|l| l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        // `--release` is cargo's (the scripts build with it), not the binary's.
        for flag in flags_in(&usage).into_iter().filter(|f| f != "--release") {
            assert!(options.contains(&flag.as_str()), "{script} names {flag}");
        }
    }
    for flag in documented {
        assert!(
            COMPARE_OPTIONS.contains(&flag.as_str()),
            "docs/compare.md names {flag}"
        );
    }
}

#[test]
fn a_bad_value_is_refused_naming_it_and_the_accepted_ones() {
    for (bin, args, named) in [
        (
            COMPARE,
            &["--threads", "0"][..],
            &["'0'", "--threads", "1..=64"][..],
        ),
        (COMPARE, &["--threads", "1,two"], &["'two'", "--threads"]),
        (
            COMPARE,
            &["--apps", "micro,macro"],
            &["'macro'", "--apps", "micro, ycsb, filebench"],
        ),
        (
            COMPARE,
            &["--workloads", "lu,ycsb-g"],
            &["'ycsb-g'", "2dconv", "ycsb-f", "webserver"],
        ),
        (
            COMPARE,
            &["--repeat", "21"],
            &["'21'", "--repeat", "1..=20"],
        ),
        (
            COMPARE,
            &["--quick", "--paper-sizes"],
            &["--quick", "--paper-sizes"],
        ),
        (COMPARE, &["--bogus"], &["--bogus"]),
        (
            TIERING,
            &["--budgets", "50,0"],
            &["'0'", "--budgets", "(0, 100]"],
        ),
        (TIERING, &["--policies", "lru"], &["'lru'", "hotness, fifo"]),
        (
            TIERING,
            &["--patterns", "uniform"],
            &["'uniform'", "hotset, zipfian"],
        ),
        (
            TIERING,
            &["--pages", "8"],
            &["'8'", "--pages", "16..=1048576"],
        ),
    ] {
        let out = run(bin, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bin} {args:?}: {err}");
        for n in named {
            assert!(err.contains(n), "{bin} {args:?}: no {n} in:\n{err}");
        }
        assert!(!err.contains("panicked"), "{bin} {args:?}: {err}");
    }
}

/// How the two standard outputs of a run are connected.
#[derive(Debug, Clone, Copy)]
enum Gone {
    /// stdout is a pipe whose reader has gone.
    Stdout,
    /// stdout and stderr both are.
    Both,
}

/// Runs `bin` with the reader of `gone` closed before the binary starts, so its first write
/// there fails (EPIPE) however little it writes; stderr otherwise captured.
fn run_reader_gone(bin: &str, args: &[&str], gone: Gone) -> (std::process::ExitStatus, String) {
    let (reader, writer) = pipe().unwrap();
    drop(reader);
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(writer.try_clone().unwrap());
    match gone {
        Gone::Stdout => cmd.stderr(Stdio::piped()),
        Gone::Both => cmd.stderr(writer),
    };
    let out = cmd.output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_into_a_closed_pipe_does_not_panic() {
    for bin in [COMPARE, TIERING] {
        for gone in [Gone::Stdout, Gone::Both] {
            let (status, err) = run_reader_gone(bin, &["--help"], gone);
            assert_eq!(status.code(), Some(0), "{bin} {gone:?}: {status:?} {err}");
            assert!(!err.contains("panicked"), "{bin} {gone:?}: {err}");
        }
    }
}

#[test]
fn a_run_into_a_closed_pipe_does_not_panic_and_writes_its_report() {
    let dir = scratch("runs");
    for gone in [Gone::Stdout, Gone::Both] {
        let out = dir.join(format!("compare-{gone:?}"));
        let o = out.to_str().unwrap();
        let args = [
            "--quick",
            "--apps",
            "micro",
            "--workloads",
            "seq",
            "--threads",
            "1",
            "--out",
            o,
        ];
        let (status, err) = run_reader_gone(COMPARE, &args, gone);
        assert_eq!(
            status.code(),
            Some(0),
            "pmo-compare {gone:?}: {status:?} {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        if let Gone::Stdout = gone {
            assert!(
                err.contains("round 1 seq"),
                "progress lines still reach stderr: {err}"
            );
        }
        let md = std::fs::read_to_string(out.join("compare.md")).unwrap();
        assert!(md.contains("seq"), "{md}");
        assert!(out.join("compare.csv").is_file());
    }
    // pmo-tiering once, both outputs gone (in a debug build its final scan of the expander's
    // media for plaintext takes half a minute).
    let out = dir.join("tiering");
    let o = out.to_str().unwrap();
    let args = [
        "--pages",
        "64",
        "--ops",
        "2000",
        "--rounds",
        "1",
        "--budgets",
        "50",
        "--policies",
        "fifo",
        "--patterns",
        "hotset",
        "--latency-ns",
        "0",
        "--out",
        o,
    ];
    let (status, err) = run_reader_gone(TIERING, &args, Gone::Both);
    assert_eq!(status.code(), Some(0), "pmo-tiering: {status:?} {err}");
    assert!(!err.contains("panicked"), "{err}");
    let md = std::fs::read_to_string(out.join("tiering.md")).unwrap();
    assert!(md.contains("Tiering evaluation"), "{md}");
    assert!(out.join("tiering.csv").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}
