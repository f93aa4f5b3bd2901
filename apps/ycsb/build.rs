//! Compiles the one YCSB generator, `c/ycsb.c`, with the `cc` crate (the guest driver compiles
//! the same file with musl-gcc), with the same deterministic floating-point flags as
//! `c/Makefile` so host and guest draw identical operation sequences.

fn main() {
    println!("cargo:rerun-if-changed=c/ycsb.c");
    println!("cargo:rerun-if-changed=c/ycsb.h");
    cc::Build::new()
        .file("c/ycsb.c")
        .include("c")
        // Always optimized: the statistical tests draw millions of operations.
        .opt_level(2)
        .flag("-std=c11")
        .flag("-ffp-contract=off")
        .flag("-fno-fast-math")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("ycsb");
    // pow() lives in libm.
    println!("cargo:rustc-link-lib=m");
}
