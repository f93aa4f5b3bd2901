//! The C driver `ycsb_lmdb` (host build, plain LMDB files) against this crate: the driver runs
//! a workload on LMDB, then dumps and verifies what is stored; the Rust side replays the same
//! generator and predicts every commit line, every operation count and the version of every
//! field of every record. Both sides use the one C generator, but through different programs:
//! this checks the driver applies each operation as the generator means it, and that its
//! record checker and the crate's agree.

// A test file: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use ycsb::{Generator, OpKind, Options, Workload, FIELDS};

/// Builds the host driver once (`make -C c host`), returns its path.
fn driver() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ycsb-host");
        let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("c");
        let st = Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(&c)
            .arg("host")
            .arg(format!("O={}", out.display()))
            .status()
            .expect("run make (needs gcc and LMDB's source, apps/lmdb/fetch.sh)");
        assert!(st.success(), "make -C {} host failed", c.display());
        out.join("ycsb_lmdb")
    })
}

/// A fresh directory for one run.
fn fresh_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ycsb-db-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn run(args: &[&str]) -> String {
    let out = Command::new(driver()).args(args).output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "ycsb_lmdb {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `[SECTION], Metric, value` lines.
fn metric(out: &str, section: &str, name: &str) -> Option<u64> {
    let prefix = format!("[{section}], {name}, ");
    out.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
}

/// key -> (keynum, versions) from `--check --dump`.
fn dump(dir: &Path) -> BTreeMap<String, (u64, [u64; FIELDS])> {
    let out = run(&[
        "--check",
        "--dump",
        "--file",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(metric(&out, "CHECK", "Corrupt"), Some(0));
    let mut m = BTreeMap::new();
    for l in out.lines().filter(|l| l.starts_with("RECORD ")) {
        let w: Vec<&str> = l.split(' ').collect();
        assert_eq!(w.len(), 3 + FIELDS, "{l}");
        let mut v = [0u64; FIELDS];
        for (i, x) in w[3..].iter().enumerate() {
            v[i] = x.parse().unwrap();
        }
        m.insert(w[1].to_string(), (w[2].parse().unwrap(), v));
    }
    assert_eq!(metric(&out, "CHECK", "Records"), Some(m.len() as u64));
    m
}

/// The COMMIT line the driver prints for a write op.
fn commit_line(op: &ycsb::Op) -> String {
    let field = op
        .field()
        .map_or_else(|| "all".to_string(), |f| f.to_string());
    format!(
        "COMMIT {} {} {} {} {field}",
        op.kind().name(),
        op.key(),
        op.keynum(),
        op.version()
    )
}

/// Runs one workload single-threaded and compares everything with the Rust replay.
fn single_thread(w: Workload, records: u64, ops: u64, seed: u64, batch: u64) {
    let dir = fresh_dir(&format!("{}-{batch}", w.letter()));
    let (r, o, s, b) = (
        records.to_string(),
        ops.to_string(),
        seed.to_string(),
        batch.to_string(),
    );
    let out = run(&[
        "--workload",
        &w.letter().to_string(),
        "--records",
        &r,
        "--ops",
        &o,
        "--seed",
        &s,
        "--batch",
        &b,
        "--load-batch",
        "97",
        "--verify",
        "--nosync",
        "--log-commits",
        "--file",
        "--dir",
        dir.to_str().unwrap(),
    ]);

    // The replay: expected store contents, commit lines and counts.
    let mut state: BTreeMap<String, (u64, [u64; FIELDS])> = (0..records)
        .map(|k| (ycsb::key_name(k), (k, [0; FIELDS])))
        .collect();
    let mut commits = Vec::new();
    let mut counts: HashMap<OpKind, u64> = HashMap::new();
    let opts = Options {
        ops,
        ..Options::default()
    };
    let mut g = Generator::with_options(w, records, seed, opts).unwrap();
    for _ in 0..ops {
        let op = g.next_op();
        *counts.entry(op.kind()).or_default() += 1;
        if !op.kind().writes() {
            continue;
        }
        commits.push(commit_line(&op));
        let entry = state
            .entry(op.key().to_string())
            .or_insert((op.keynum(), [0; FIELDS]));
        assert_eq!(entry.0, op.keynum());
        match op.field() {
            Some(f) => entry.1[f] = op.version(),
            None => entry.1 = [op.version(); FIELDS],
        }
    }

    let logged: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("COMMIT ") && !l.starts_with("COMMIT LOAD "))
        .collect();
    assert_eq!(logged, commits, "{w}: commit log");
    let loads = out
        .lines()
        .filter(|l| l.starts_with("COMMIT LOAD "))
        .count();
    assert_eq!(loads as u64, records);
    for k in OpKind::ALL {
        let want = counts.get(&k).copied().unwrap_or(0);
        let got = metric(&out, k.name(), "Return=OK").unwrap_or(0);
        assert_eq!(got, want, "{w}: {} OK count", k.name());
    }
    assert!(
        !out.contains("NOT_FOUND") && !out.contains("ERROR"),
        "{out}"
    );
    assert_eq!(metric(&out, "OVERALL", "CorruptRecords"), Some(0));
    assert_eq!(dump(&dir), state, "{w}: stored versions");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn driver_matches_generator_a_update_one_field() {
    single_thread(Workload::A, 300, 3000, 5, 1);
}

#[test]
fn driver_matches_generator_d_latest_inserts_batched() {
    single_thread(Workload::D, 300, 3000, 6, 16);
}

#[test]
fn driver_matches_generator_e_scans_and_f_rmw() {
    single_thread(Workload::E, 300, 2000, 7, 1);
    single_thread(Workload::F, 300, 3000, 8, 4);
}

/// Two threads: the interleaving is not deterministic, but every surviving field must carry
/// a version that one of the two generators wrote to it (or the load's 0), the key set must
/// be the loaded keys plus both threads' inserts, and the commit lines must be exactly the
/// two generators' writes.
#[test]
fn driver_two_threads_store_only_generated_writes() {
    const RECORDS: u64 = 400;
    const OPS: u64 = 4000;
    let dir = fresh_dir("threads");
    let out = run(&[
        "--workload",
        "d",
        "--records",
        "400",
        "--ops",
        "4000",
        "--threads",
        "2",
        "--seed",
        "3",
        "--batch",
        "3",
        "--nosync",
        "--log-commits",
        "--file",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    let mut allowed: HashMap<String, Vec<BTreeSet<u64>>> = (0..RECORDS)
        .map(|k| (ycsb::key_name(k), vec![BTreeSet::from([0]); FIELDS]))
        .collect();
    let mut commits = BTreeSet::new();
    for t in 0..2u32 {
        let opts = Options {
            ops: OPS / 2,
            thread: t,
            threads: 2,
            write_all_fields: false,
        };
        let mut g = Generator::with_options(Workload::D, RECORDS, 3, opts).unwrap();
        for _ in 0..OPS / 2 {
            let op = g.next_op();
            if op.kind().writes() {
                commits.insert(commit_line(&op));
                let a = allowed
                    .entry(op.key().to_string())
                    .or_insert_with(|| vec![BTreeSet::new(); FIELDS]);
                for (f, set) in a.iter_mut().enumerate() {
                    if op.value(f).is_some() {
                        set.insert(op.version());
                    }
                }
            }
        }
    }
    let logged: BTreeSet<String> = out
        .lines()
        .filter(|l| l.starts_with("COMMIT ") && !l.starts_with("COMMIT LOAD "))
        .map(str::to_string)
        .collect();
    assert_eq!(logged, commits);
    let stored = dump(&dir);
    let keys: BTreeSet<&String> = stored.keys().collect();
    let want: BTreeSet<&String> = allowed.keys().collect();
    assert_eq!(keys, want);
    for (key, (_, versions)) in &stored {
        for (f, v) in versions.iter().enumerate() {
            assert!(allowed[key][f].contains(v), "{key} field {f}: version {v}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
