#!/usr/bin/env python3
"""Plots the adaptive-limit trajectory that engine_adaptive_test records.

Usage: SLUICE_ADAPTIVE_TRAJECTORY=/tmp/t.csv build/dev/tests/engine_tests \\
           "a slow-down\\, a 503 and the recovery*"
       /usr/bin/python3 scripts/plot_adaptive.py /tmp/t.csv docs/adaptive-trajectory.png
Needs Debian's python3-matplotlib.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(source, target):
    with open(source, newline="") as f:
        rows = list(csv.DictReader(f))
    second = [int(r["second"]) for r in rows]
    factor = [int(r["factor_permille"]) / 1000 for r in rows]
    admitted = [int(r["admitted"]) for r in rows]

    fig, left = plt.subplots(figsize=(9, 4.5), dpi=100)
    left.step(second, admitted, where="post", color="tab:blue", label="admitted per second")
    left.set_xlabel("time (s)")
    left.set_ylabel("requests admitted per second (limit 20/s)")
    left.set_ylim(0, 22)
    right = left.twinx()
    right.step(second, factor, where="post", color="tab:red", linestyle="--", label="limit factor")
    right.set_ylabel("limit factor")
    right.set_ylim(0, 1.1)
    left.axvspan(10, 20, color="0.9", label="upstream at 400 ms")
    left.axvline(30, color="tab:orange", label="503, Retry-After: 5")
    lines = left.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    left.legend(lines[0] + more[0], lines[1] + more[1], loc="lower right", fontsize="small")
    left.set_title("An adaptive rule: 20/s, target latency 100 ms, client sending 50/s")
    fig.tight_layout()
    fig.savefig(target)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
