#!/usr/bin/env bash
# The DRAM/CXL tiering evaluation of issue 13 in one command (see docs/tiering.md).
#
# Builds the harness with --release and runs pmo-tiering: a GUPS-style hot set and a zipfian
# key-value workload on a PMO on an emulated expander, all in DRAM and under DRAM budgets of
# 100/50/25/12.5 % with the hotness and FIFO policies, interleaved in three rounds. Prints the
# table and the targets and writes target/tiering/{tiering.md,tiering.csv,tiering.png}.
#
#   scripts/tiering.sh                       defaults (about 3 minutes on 2 cores)
#   scripts/tiering.sh --latency-ns 0        no media latency: the pager's own costs
# Other flags go to pmo-tiering: --pages N --ops N --threads N --rounds R --budgets 50,25
# --policies hotness,fifo --patterns hotset,zipfian --cache-mib N.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
target=${CARGO_TARGET_DIR:-$repo/target}
out=$repo/target/tiering

cargo build --release -q -p pmo-harness --bin pmo-tiering
rm -f "$out/tiering.md" "$out/tiering.csv" "$out/tiering.png"
"$target/release/pmo-tiering" --out "$out" "$@"
# The plot needs matplotlib.
source "$repo/scripts/lib/matplotlib.sh"
if [[ -z $py ]]; then
    echo "tiering.sh: no python3 with matplotlib (run scripts/setup.sh); no PNG" >&2
    exit 1
fi
"$py" "$repo/scripts/plot_tiering.py" "$out/tiering.csv" "$out/tiering.png"
echo "tiering.sh: wrote $out/tiering.md, $out/tiering.csv, $out/tiering.png" >&2
