//! Helpers shared by the VM tests (each test file includes this module with `mod common;`):
//! the check every PMO VM test ends with, that the store file its VMs used is consistent, and
//! that a VMM died of the psync kill hook.

// Each test file uses only some of them.
#![allow(dead_code)]

use std::path::Path;

/// Runs `pmovmm store fsck` (the library function behind it) on the store file `store` and
/// panics, naming the file and `context` (e.g. the seed that reproduces the run), if it
/// cannot run or finds a problem.
#[track_caller]
pub fn assert_store_clean(store: &Path, context: &str) {
    let report = pmovmm::cli::store::store_fsck(
        pmovmm::cli::store::StoreFile::plain(store),
        &mut std::io::sink(),
        &mut std::io::sink(),
    )
    .unwrap_or_else(|e| panic!("fsck of {}: {e} ({context})", store.display()));
    assert!(
        report.problems.is_empty(),
        "fsck of {}: {:?} ({context})",
        store.display(),
        report.problems
    );
}

/// The VMM of `vm` died of SIGKILL from the hidden `--pmo-test-kill-in-psync` hook.
pub fn assert_killed_by_the_psync_hook(vm: &pmo_integration::VmOutcome) {
    assert!(
        vm.vmm_stderr.contains("test hook: killing the VMM"),
        "{}",
        vm.report("the VMM was not killed by the psync hook")
    );
    // Nested: the test host reports 128 + SIGKILL; direct: no exit code (killed by a signal).
    let killed = match vm.exit_code {
        Some(code) => code == 137,
        None => !vm.timed_out,
    };
    assert!(
        killed,
        "{}",
        vm.report("expected the VMM to die of SIGKILL")
    );
}
