#!/usr/bin/env python3
"""Time against DRAM budget, one line per placement policy, one panel per workload, from
pmo-tiering's CSV (issue 13). Each point is the median over rounds of the cell's time over the
same round's all-DRAM time; the bars show the min-max spread.

Usage: plot_tiering.py tiering.csv tiering.png
"""
import csv
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {"hotness": ("#4c72b0", "o"), "fifo": ("#dd8452", "s")}


def main(src, dst):
    with open(src, newline="") as f:
        rows = list(csv.DictReader(f))
    patterns = list(dict.fromkeys(r["pattern"] for r in rows))
    fig, axes = plt.subplots(1, len(patterns), figsize=(5.5 * len(patterns), 4), squeeze=False)
    for ax, pattern in zip(axes[0], patterns):
        mine = [r for r in rows if r["pattern"] == pattern and r["policy"] != "all-dram"]
        for policy in dict.fromkeys(r["policy"] for r in mine):
            budgets = sorted({float(r["budget_pct"]) for r in mine if r["policy"] == policy},
                             reverse=True)
            med, lo, hi = [], [], []
            for b in budgets:
                v = [float(r["ratio"]) for r in mine
                     if r["policy"] == policy and float(r["budget_pct"]) == b]
                m = statistics.median(v)
                med.append(m)
                lo.append(m - min(v))
                hi.append(max(v) - m)
            color, marker = STYLE.get(policy, ("grey", "x"))
            ax.errorbar(budgets, med, yerr=[lo, hi], color=color, marker=marker, capsize=3,
                        label=policy)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":", label="all-DRAM")
        ax.set_xscale("log", base=2)
        ax.invert_xaxis()
        ax.set_xticks([100, 50, 25, 12.5])
        ax.set_xticklabels(["100%", "50%", "25%", "12.5%"])
        ax.set_xlabel("DRAM budget (share of the PMO)")
        ax.set_ylabel("time / all-DRAM")
        ax.set_title(pattern)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
