//! The fuzz target bodies on stable: every saved input under
//! `regressions/<target>/` (crashes found by the fuzzer, fixed since), then
//! a bounded number of inputs from a seeded PRNG.
//!
//! `PMO_FUZZ_ITERS=N` changes the number of random inputs per target and
//! `PMO_FUZZ_SEED=S` the seed (the default seed is fixed, so a failure
//! reproduces on every machine). A failing random input is written to
//! `target/fuzz-failures/` and its path printed: move it into
//! `regressions/<target>/` once the bug is fixed.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use pmo_fuzz_targets::common::Rng;
use pmo_fuzz_targets::TARGETS;

fn target(name: &str) -> fn(&[u8]) {
    TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
        .unwrap_or_else(|| panic!("no target {name}"))
}

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Saved inputs of `name`, sorted (an empty list when there are none yet).
fn regressions(name: &str) -> Vec<PathBuf> {
    let dir = crate_dir().join("regressions").join(name);
    let mut v: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(_) => Vec::new(),
    };
    v.retain(|p| p.is_file() && !p.ends_with("README.md"));
    v.sort();
    v
}

fn save_failure(name: &str, input: &[u8]) -> PathBuf {
    let dir = crate_dir().join("../../target/fuzz-failures");
    let _ = std::fs::create_dir_all(&dir);
    let hash = input.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    let p = dir.join(format!("{name}-{hash:016x}"));
    std::fs::write(&p, input).expect("write the failing input");
    p
}

fn env_u64(var: &str) -> Option<u64> {
    std::env::var(var).ok().and_then(|v| v.parse().ok())
}

/// Runs the saved inputs, then `iters` random ones of up to `max_len` bytes.
fn run_loop(name: &str, iters: u64, max_len: usize) {
    let f = target(name);
    let saved = regressions(name);
    for p in &saved {
        let input = std::fs::read(p).expect("read a saved input");
        if catch_unwind(AssertUnwindSafe(|| f(&input))).is_err() {
            panic!("{name}: saved input {} fails again", p.display());
        }
    }
    let iters = env_u64("PMO_FUZZ_ITERS").unwrap_or(iters);
    let seed = env_u64("PMO_FUZZ_SEED").unwrap_or(0x706d_6f66_757a_7a00);
    let mut rng = Rng::new(seed ^ name.len() as u64);
    for i in 0..iters {
        let input = rng.input(max_len);
        if catch_unwind(AssertUnwindSafe(|| f(&input))).is_err() {
            let p = save_failure(name, &input);
            panic!(
                "{name}: random input {i} (seed {seed:#x}) failed; saved to {}",
                p.display()
            );
        }
    }
    println!(
        "{name}: {} saved inputs and {iters} random inputs passed",
        saved.len()
    );
}

#[test]
fn pmo_service() {
    run_loop("pmo_service", 300, 512);
}

#[test]
fn cxl_mailbox() {
    run_loop("cxl_mailbox", 3000, 1024);
}

#[test]
fn virtio_pci() {
    run_loop("virtio_pci", 3000, 1024);
}

#[test]
fn virtio_chains() {
    run_loop("virtio_chains", 1000, 1024);
}

#[test]
fn store_image() {
    run_loop("store_image", 1000, 256);
}

/// The loop can fail: a target that panics on some input is caught, and
/// the input is saved where the message says.
#[test]
fn a_failing_body_is_reported_with_its_input() {
    let bad: fn(&[u8]) = |d| assert!(d.len() < 3, "long input");
    let r = catch_unwind(|| {
        let mut rng = Rng::new(1);
        for _ in 0..100 {
            let input = rng.input(8);
            if catch_unwind(AssertUnwindSafe(|| bad(&input))).is_err() {
                let p = save_failure("selftest", &input);
                return Some((input, p));
            }
        }
        None
    });
    let (input, p) = r.expect("no panic escapes").expect("a long input came up");
    assert!(input.len() >= 3);
    assert_eq!(std::fs::read(&p).expect("saved"), input);
    std::fs::remove_file(Path::new(&p)).expect("remove the saved input");
}
