#!/usr/bin/env bash
# The PMO design comparison of issue 5 in one command (see docs/compare.md).
#
# Builds the harness with --release, runs the whole matrix (designs wedi, sp-id = the papers' O,
# d, d2, d4, d8, adaptive; without and with integrity; 1 and 2 threads; six microbenchmarks,
# YCSB A-F on LMDB and four Filebench personalities, the applications also on their unencrypted
# floor), prints the tables and writes target/compare/{compare.md,compare.csv,compare.png}.
#
#   scripts/compare.sh               full sizes, three rounds (about 28 minutes on 2 cores)
#   scripts/compare.sh --apps micro  the microbenchmarks alone (about 6 minutes)
#   scripts/compare.sh --quick       tiny sizes, one round (seconds; numbers not meaningful)
#   scripts/compare.sh --paper-sizes 2dConv, Gauss, LU and TMM at the papers' sizes (with
#                                    integrity) and the applications, 1 thread, one round
#                                    (about 35 minutes; the sizes are in docs/compare.md)
#   scripts/compare.sh --pm-model    the PM timing model on the medium (default: DRAM-backed file)
#   scripts/compare.sh --cxl --threads 1
#                                    LPMO's CXL figure: O, D, D4 on the file, the CXL designs c, cl,
#                                    cl4, cf, cf4 on an emulated expander store (with integrity)
# Other flags go to pmo-compare: --apps micro,ycsb,filebench --workloads a,b --threads 1,2
# --session S --repeat R.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
target=${CARGO_TARGET_DIR:-$repo/target}
out=$repo/target/compare

cargo build --release -q -p pmo-harness
# A failed cell (wrong result) makes pmo-compare exit non-zero after writing its report: still
# draw the plot (failed bars are marked), then pass the failure on.
status=0
rm -f "$out/compare.md" "$out/compare.csv" "$out/compare.png"
# At the papers' sizes a cell takes up to two minutes: one thread and one round fit the run in
# 40 minutes. Flags after it still override these.
defaults=()
for arg in "$@"; do
    [[ $arg == --paper-sizes ]] && defaults=(--threads 1 --repeat 1)
done
"$target/release/pmo-compare" --out "$out" "${defaults[@]}" "$@" || status=$?
if [[ ! -f $out/compare.csv || $status -eq 2 ]]; then
    exit "$status"
fi
# The plot needs matplotlib.
source "$repo/scripts/lib/matplotlib.sh"
if [[ -z $py ]]; then
    echo "compare.sh: no python3 with matplotlib (run scripts/setup.sh); no PNG" >&2
    exit 1
fi
"$py" "$repo/scripts/plot_compare.py" "$out/compare.csv" "$out/compare.png"
echo "compare.sh: wrote $out/compare.md, $out/compare.csv, $out/compare.png" >&2
exit "$status"
