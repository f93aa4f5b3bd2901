//! Helpers shared by the VM tests (each test file includes this module with `mod common;`):
//! the check every PMO VM test ends with, that the store file its VMs used is consistent.

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
