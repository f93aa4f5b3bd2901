//! Builds LMDB for the host: `fetch.sh` downloads the pinned release and applies our patch into
//! `target/lmdb/src` (nothing of LMDB lives in the repository), then `mdb.c` and `midl.c` are
//! compiled into a static library with the `cc` crate.

use std::path::{Path, PathBuf};
use std::process::{exit, Command};

/// Prints `msg` as the build script's error and stops the build.
fn fail(msg: &str) -> ! {
    eprintln!("lmdb-pmo build: {msg}");
    exit(1);
}

fn main() {
    let Some(here) = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from) else {
        fail("CARGO_MANIFEST_DIR is not set");
    };
    let fetch = here.join("fetch.sh");
    let patch = here.join("pmo.patch");
    println!("cargo:rerun-if-changed={}", fetch.display());
    println!("cargo:rerun-if-changed={}", patch.display());

    match Command::new("bash").arg(&fetch).status() {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!("{} failed ({s})", fetch.display())),
        Err(e) => fail(&format!("cannot run {}: {e}", fetch.display())),
    }

    // fetch.sh puts the tree under the repository's target/, whatever CARGO_TARGET_DIR says.
    let src: PathBuf = here.join("../../target/lmdb/src/libraries/liblmdb");
    let header = src.join("lmdb.h");
    for f in ["lmdb.h", "mdb.c", "midl.c", "midl.h"] {
        println!("cargo:rerun-if-changed={}", src.join(f).display());
    }
    require_pmo_api(&header);

    let mut build = cc::Build::new();
    build
        .files([src.join("mdb.c"), src.join("midl.c")])
        .include(&src)
        .flag("-std=c11")
        .flag("-pthread")
        .warnings(true)
        .extra_warnings(true)
        // LMDB 0.9.24 itself trips these two (an unused `env` parameter, a commented
        // fall-through); everything else, our patch included, must compile cleanly.
        .flag("-Wno-unused-parameter")
        .flag("-Wno-implicit-fallthrough")
        .warnings_into_errors(true);
    build.compile("lmdb");
}

/// The safe API needs the PMO hooks of our patch (`mdb_env_set_pmo`); a tree without them
/// was fetched without `pmo.patch`.
fn require_pmo_api(header: &Path) {
    match std::fs::read_to_string(header) {
        Ok(h) if h.contains("mdb_env_set_pmo") => {}
        Ok(_) => fail(&format!(
            "{} has no mdb_env_set_pmo: apps/lmdb/pmo.patch is missing or was not applied",
            header.display()
        )),
        Err(e) => fail(&format!("read {}: {e}", header.display())),
    }
}
