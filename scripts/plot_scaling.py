#!/usr/bin/env python3
"""Charts scaling_bench's JSON output: ns per check against tracked keys, beside the pointer chase.

Usage: build/bench/bench/scaling_bench --benchmark_format=json \\
           --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > /tmp/scaling.json
       /usr/bin/python3 scripts/plot_scaling.py /tmp/scaling.json docs/scaling.png
Uses the median of the repetitions where there are aggregates, else each row's own time.
Needs Debian's python3-matplotlib.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def series(rows, name):
    points = {}
    for row in rows:
        base, _, keys = row["run_name"].partition("/")
        if base != name:
            continue
        if row.get("run_type") == "aggregate" and row.get("aggregate_name") != "median":
            continue
        points[int(keys.split("/")[0])] = row["real_time"]
    keys = sorted(points)
    return keys, [points[k] for k in keys]


def main(source, target):
    with open(source) as f:
        rows = json.load(f)["benchmarks"]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for name, label, style in (
        ("BM_Gcra_Keys", "sluice GcraLimiter::check (one window)", "o-"),
        ("BM_PointerChase_Keys", "pointer chase over the same bytes", "s--"),
    ):
        keys, times = series(rows, name)
        ax.plot(keys, times, style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tracked keys")
    ax.set_ylabel("ns per check (median)")
    ax.set_ylim(bottom=0)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left")
    ax.set_title("Cost of a keyed check as the key count grows, uniform keys")
    fig.tight_layout()
    fig.savefig(target)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
