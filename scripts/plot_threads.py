#!/usr/bin/env python3
"""Charts scaling_bench's thread-scaling rows as an SVG: checks per microsecond, all threads
together, against the thread count, for one key and disjoint keys, sluice beside mutex +
absl::flat_hash_map. Only measured points are drawn; nothing is extrapolated.

Usage: build/bench/bench/scaling_bench --benchmark_filter=Threads --benchmark_format=json \\
           --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > /tmp/threads.json
       python3 scripts/plot_threads.py /tmp/threads.json docs/thread-scaling.svg
Uses the median of the repetitions where there are aggregates. Needs nothing beyond Python 3.
"""
import json
import re
import sys

SERIES = (
    ("BM_Gcra_Threads_OneKey", "sluice, one key", "#1f77b4", ""),
    ("BM_MutexFlatHashMap_Threads_OneKey", "mutex + flat_hash_map, one key", "#d62728", ""),
    ("BM_Gcra_Threads_DisjointKeys", "sluice, disjoint keys", "#1f77b4", "6,4"),
    ("BM_MutexFlatHashMap_Threads_DisjointKeys", "mutex + flat_hash_map, disjoint keys",
     "#d62728", "6,4"),
)
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 720, 420, 70, 250, 40, 50


def points(rows, name):
    """{threads: checks per µs} for one subject."""
    out = {}
    for row in rows:
        match = re.fullmatch(name + r"/real_time/threads:(\d+)", row["run_name"])
        if not match:
            continue
        if row.get("run_type") == "aggregate" and row.get("aggregate_name") != "median":
            continue
        out[int(match.group(1))] = row["items_per_second"] / 1e6
    return out


def main(source, target):
    with open(source) as f:
        data = json.load(f)
    rows, cores = data["benchmarks"], data["context"]["num_cpus"]
    series = [(points(rows, name), label, color, dash) for name, label, color, dash in SERIES]
    max_threads = max(max(p) for p, *_ in series if p)
    max_rate = max(max(p.values()) for p, *_ in series if p) * 1.1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    x = lambda t: LEFT + (t - 1) / max(max_threads - 1, 1) * plot_w  # noqa: E731
    y = lambda r: TOP + plot_h - r / max_rate * plot_h  # noqa: E731
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="14">Checks per µs, all threads together '
           f'({cores} cores; measured points only)</text>']
    for t in range(1, max_threads + 1):
        svg.append(f'<text x="{x(t)}" y="{TOP + plot_h + 18}" text-anchor="middle">{t}</text>')
    svg.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 10}" text-anchor="middle">'
               'threads</text>')
    for i in range(6):
        r = max_rate * i / 5
        svg.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(r)}" y2="{y(r)}" '
                   'stroke="#ddd"/>')
        svg.append(f'<text x="{LEFT - 6}" y="{y(r) + 4}" text-anchor="end">{r:.0f}</text>')
    svg.append(f'<line x1="{x(cores)}" x2="{x(cores)}" y1="{TOP}" y2="{TOP + plot_h}" '
               'stroke="#888" stroke-dasharray="2,3"/>')
    svg.append(f'<text x="{x(cores) + 4}" y="{TOP + 12}" fill="#666">= cores</text>')
    for n, (p, label, color, dash) in enumerate(series):
        if not p:
            continue
        path = " ".join(f"{x(t):.1f},{y(r):.1f}" for t, r in sorted(p.items()))
        svg.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2" '
                   f'stroke-dasharray="{dash}"/>')
        for t, r in sorted(p.items()):
            svg.append(f'<circle cx="{x(t):.1f}" cy="{y(r):.1f}" r="3" fill="{color}"/>')
        ly = TOP + 20 + 22 * n
        svg.append(f'<line x1="{WIDTH - RIGHT + 15}" x2="{WIDTH - RIGHT + 45}" y1="{ly}" '
                   f'y2="{ly}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>')
        svg.append(f'<text x="{WIDTH - RIGHT + 50}" y="{ly + 4}">{label}</text>')
    svg.append("</svg>")
    with open(target, "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
