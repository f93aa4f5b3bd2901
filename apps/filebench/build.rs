//! Compiles the C engine (c/) into a static library for the crate.

/// The engine's sources; the drivers, the backends and the C tests are not part of the crate.
const SOURCES: [&str; 8] = [
    "fb.c",
    "fb_pick.c",
    "fb_flowop.c",
    "fb_fileset.c",
    "fb_personality.c",
    "fb_data.c",
    "fb_check.c",
    "fb_report.c",
];

/// Headers the sources include.
const HEADERS: [&str; 4] = ["fb.h", "fb_data.h", "fb_internal.h", "fb_thread.h"];

fn main() {
    let mut build = cc::Build::new();
    build
        .include("c")
        .flag("-std=c11")
        .flag("-pthread")
        .flag("-Wshadow")
        .flag("-Wstrict-prototypes")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true);
    for source in SOURCES {
        build.file(format!("c/{source}"));
        println!("cargo:rerun-if-changed=c/{source}");
    }
    for header in HEADERS {
        println!("cargo:rerun-if-changed=c/{header}");
    }
    build.compile("filebench");
    println!("cargo:rustc-link-lib=m");
    println!("cargo:rustc-link-lib=pthread");
}
