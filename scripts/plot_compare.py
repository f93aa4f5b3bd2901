#!/usr/bin/env python3
"""Stacked-bar plot of the design comparison (issue 5) from pmo-compare's CSV.

One panel per workload, one bar per design and integrity setting (1 thread), each bar split
into compute, fault overhead, psync, detach, attach, attach stall and (the applications'
files) PMO create/destroy, normalized to O (sp-id) of the same integrity setting, like the
papers' figures.

Usage: plot_compare.py compare.csv compare.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PARTS = [
    ("compute_ns", "compute", "#4c72b0"),
    ("fault_ns", "fault overhead", "#dd8452"),
    ("psync_ns", "psync", "#55a868"),
    ("detach_ns", "detach", "#c44e52"),
    ("attach_ns", "attach", "#8172b3"),
    ("stall_ns", "attach stall", "#937860"),
    # PMO create/destroy during the run (the applications' files); absent in older CSVs.
    ("create_ns", "create/destroy", "#8c8c8c"),
]


def main(src, dst):
    with open(src, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["threads"] == "1"]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    designs = list(dict.fromkeys(r["design"] for r in rows))
    # A run with integrity only (--paper-sizes, --cxl) has no left half.
    integs = [i for i in ("false", "true") if any(r["integrity"] == i for r in rows)]
    labelled = set()
    cols = min(3, max(1, len(workloads)))
    nrows = (len(workloads) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(6 * cols, 4.2 * nrows), squeeze=False)
    for i, w in enumerate(workloads):
        ax = axes[i // cols][i % cols]
        labels, x = [], 0
        for integ in integs:
            o = next(
                (r for r in rows if r["workload"] == w and r["design"] == "sp-id"
                 and r["integrity"] == integ and not r["error"]),
                None,
            )
            o_total = float(o["total_ns"]) if o and float(o["total_ns"]) > 0 else None
            for d in designs:
                r = next(
                    (r for r in rows if r["workload"] == w and r["design"] == d
                     and r["integrity"] == integ),
                    None,
                )
                labels.append(d + ("+I" if integ == "true" else ""))
                if r is None or r["error"] or o_total is None:
                    ax.text(x, 0.05, "failed", rotation=90, ha="center", fontsize=7)
                    x += 1
                    continue
                bottom = 0.0
                for key, name, color in PARTS:
                    h = float(r.get(key) or 0) / o_total
                    ax.bar(x, h, bottom=bottom, color=color,
                           label=None if name in labelled else name)
                    labelled.add(name)
                    bottom += h
                x += 1
        if len(integs) == 2:
            ax.axvline(len(designs) - 0.5, color="grey", linewidth=0.8, linestyle=":")
        ax.axhline(1.0, color="black", linewidth=0.6)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=60, fontsize=7)
        ax.set_title(w)
        ax.set_ylabel("time / O (sp-id)")
    for j in range(len(workloads), nrows * cols):
        axes[j // cols][j % cols].axis("off")
    halves = ("; left: without integrity, right: with (+I)" if len(integs) == 2
              else ", with integrity (+I)" if integs == ["true"] else ", without integrity")
    fig.suptitle("PMO designs, 1 thread, normalized to O" + halves, y=0.995, fontsize=10)
    fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.965), ncol=len(PARTS), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
