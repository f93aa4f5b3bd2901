#!/usr/bin/env bash
# Sets up and runs every test of the project, on a fresh Debian 12 machine or an old one:
# packages, the guest image, formatting and lints, the C library's and the kernel module's
# checks, unit tests, and the tests that boot real VMs (directly on hardware KVM, inside the
# nested QEMU-TCG test host elsewhere; see tests/integration/README.md).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
start=$(date +%s)

step() {
    printf '\n== %s (%ss)\n' "$*" "$(($(date +%s) - start))"
}

step "packages"
scripts/setup.sh

step "guest image (kernel, initramfs, pmo.ko, libpmo, guest programs)"
guest/build.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "libpmo allocator tests"
make -s -C guest/libpmo test

step "pmo_bench workload kernel tests"
make -s -C guest/bench test

# The applications on PMOs (apps/): their C halves on the host, against ordinary files.
step "LMDB on PMOs: the patch's API tests and LMDB's own mtest..mtest6 (file backend)"
make -s -C apps/lmdb/c host-test O="$repo/target/apps/lmdb-host"

step "YCSB generator and Filebench engine C tests"
make -s -C apps/ycsb/c test O="$repo/target/apps/ycsb-host"
make -s -C apps/filebench/c test O="$repo/target/apps/filebench-host"

step "checkpatch --strict on the guest driver"
scripts/checkpatch.sh

# The whole workspace, as a plain `cargo build --release` at the root builds it: the harness and
# its benchmark-only suites beside pmovmm. The VM tests run this pmovmm, and
# vmm/tests/product_binaries.rs (PMO_CHECK_BINS) checks it holds none of those suites.
step "release build of the workspace (the VM tests run its pmovmm)"
cargo build --release
release=${CARGO_TARGET_DIR:-$repo/target}/release

step "cargo test: unit tests and host-side device tests (the fuzz target bodies as seeded loops)"
PMO_CHECK_BINS="$release/pmovmm" cargo test --workspace --exclude pmo-harness --exclude pmo-integration

# The VM tests keep one CPU busy (the nested test host is one QEMU-TCG vCPU; VM runs take a
# lock, so only one runs at a time) and leave the other mostly idle. The harness's tests and the
# fuzz targets, which need no VM, run on it meanwhile, niced so the test host keeps its CPU;
# their output follows the VM tests'.
lane_log=target/test-logs/harness-and-fuzz.log
mkdir -p "$(dirname "$lane_log")"
step "in the background (log: $lane_log): the design-comparison harness's tests, then the fuzz targets"
(
    set -euo pipefail
    step "cargo test: the design-comparison harness"
    nice -n 10 cargo test -p pmo-harness
    # The same fuzz target bodies, coverage-guided under libFuzzer + ASan, when a
    # nightly toolchain is here (cargo-fuzz needs one); docs/fuzzing.md.
    if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
        step "fuzz targets: 20 s each (scripts/fuzz.sh)"
        scripts/fuzz.sh 20
    else
        step "fuzz targets: no nightly toolchain; their bodies ran only as cargo test's seeded loops (fuzz/targets/tests/loops.rs)"
    fi
) >"$lane_log" 2>&1 &
lane=$!

step "cargo test: the VM tests and the rest of pmo-integration"
vm_rc=0
cargo test -p pmo-integration || vm_rc=$?

lane_rc=0
wait "$lane" || lane_rc=$?
step "the background part's output ($lane_log)"
cat "$lane_log"
if ((vm_rc != 0 || lane_rc != 0)); then
    printf '\ntest.sh: FAILED (VM tests exit %s; harness tests and fuzzing exit %s)\n' "$vm_rc" "$lane_rc"
    exit 1
fi

printf '\ntest.sh: all tests passed in %ss\n' "$(($(date +%s) - start))"
