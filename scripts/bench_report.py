#!/usr/bin/env python3
"""Writes report.md (and charts) from a scripts/bench report directory.

Usage: scripts/bench_report.py REPORT_DIR
REPORT_DIR holds <binary>.json (Google Benchmark --benchmark_out JSON, one per bench binary),
machine.txt ("key: value" lines) and runs.tsv (binary, start time, load average before and after,
arguments), as scripts/bench writes them. Each subject is set beside its hand-rolled baselines from
the same binary's run (same arguments and thread count), with the ratio subject / baseline: below 1
the subject is faster. A row's time is its median over repetitions (real time where the benchmark
measures real time, CPU time otherwise). Charts need python3-matplotlib; without it they are
skipped and the report says so.
"""
import json
import os
import re
import statistics
import subprocess
import sys

# Per binary: (subject, baselines). The subject is a regular expression over the benchmark's
# function name (fullmatch); each baseline is a function name in which \1, \2 ... stand for the
# subject's groups. Rows pair when their arguments and thread counts are equal.
PAIRS = {
    "clock_bench": [
        (r"BM_SteadyClockNow", [r"BM_StdSteadyClockNow"]),
    ],
    "store_bench": [
        (r"BM_Store_(HotKey|Uniform1M|Zipf1M|Spray)",
         [r"BM_MutexUnorderedMap_\1", r"BM_MutexFlatHashMap_\1"]),
        (r"BM_Store_(?:Uniform1M|Spray)", [r"BM_PointerChase_StoreTables1M"]),
    ],
    "limiter_bench": [
        (r"BM_(?:Gcra|FixedWindow)_OneWindow_HotKey",
         [r"BM_MutexUnorderedMap_HotKey", r"BM_MutexFlatHashMap_HotKey",
          r"BM_FloatTokenBucket_HotKey"]),
        (r"BM_Gcra_OneWindow_DistinctKeys", [r"BM_MutexUnorderedMap_DistinctKeys"]),
        (r"BM_Gcra_Uniform1M",
         [r"BM_MutexUnorderedMap_Uniform1M", r"BM_MutexFlatHashMap_Uniform1M",
          r"BM_FloatTokenBucket_Uniform1M", r"BM_PointerChase_StoreTables1M"]),
        (r"BM_Gcra_HotKeyFlood_(Frozen|Moving)", [r"BM_MutexFlatHashMap_HotKeyFlood_\1"]),
        (r"BM_Direct_(?:OneWindow|ThreeWindows)_Frozen_(Admit|Deny)(?:_CheckOne)?",
         [r"BM_AtomicGcraBaseline_Frozen_\1"]),
        (r"BM_Direct_(?:OneWindow|ThreeWindows)_Tick", [r"BM_AtomicGcraBaseline_Tick"]),
    ],
    "engine_bench": [
        (r"BM_Engine_OneRule", [r"BM_BareLimiter_OneRule"]),
        (r"BM_Engine_DocumentedExample(?:_\w+)?", [r"BM_BareLimiters_DocumentedExample"]),
        (r"BM_Engine_FiveRulesAllScopes", [r"BM_BareLimiters_FiveRules"]),
    ],
    "concurrency_bench": [
        (r"BM_Concurrency_AcquireRelease_(\w+)", [r"BM_MutexFlatMap_AcquireRelease_\1"]),
    ],
    "attempt_bench": [
        (r"BM_Attempt_HotSubject_\w+", [r"BM_MutexUnorderedMap_HotSubject"]),
        (r"BM_Attempt_Uniform1M_\w+", [r"BM_MutexUnorderedMap_Uniform1M"]),
        (r"BM_RedisAttempt_BeginSucceed", [r"BM_RedisTwoGets"]),
    ],
    "scaling_bench": [
        (r"BM_Gcra_Keys", [r"BM_PointerChase_Keys"]),
        (r"BM_Gcra_Threads_(\w+)", [r"BM_MutexFlatHashMap_Threads_\1"]),
    ],
    "redis_bench": [
        (r"BM_EngineDocumentedExample", [r"BM_TwoLimitersDocumentedExample"]),
        (r"BM_ServerCostSluice", [r"BM_ServerCostFloatReference", r"BM_ServerCostFloor"]),
        (r"BM_SluiceCheck(?:Coalesced|Uncoalesced)?(?:SharedKeys)?",
         [r"BM_PlainGet", r"BM_FloatGcraReference", r"BM_FloorScript"]),
        (r"BM_SluiceCheckPipelined", [r"BM_PlainGetPipelined", r"BM_FloatGcraReferencePipelined"]),
    ],
    "redis_cluster_bench": [
        (r"BM_(OneKey|TwoRules)_Cluster", [r"BM_\1_Single"]),
    ],
    "postgres_bench": [
        (r"BM_Postgres(?:Check|Batch4)", [r"BM_SelectOne", r"BM_RedisCheck"]),
    ],
}

NS_PER_UNIT = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
# Parts of a benchmark name that say how it was run, not what it measures.
RUN_PARTS = re.compile(r"^(real_time|process_time|manual_time|min_time:.*|min_warmup_time:.*|"
                       r"iterations:.*|repeats:.*|threads:.*)$")


class Row:
    """One benchmark instance: its median time in ns and, with repetitions, their cv."""

    def __init__(self, name):
        self.name = name
        parts = name.split("/")
        self.function = parts[0]
        self.args = tuple(p for p in parts[1:] if not RUN_PARTS.match(p))
        self.threads = 1
        self.ns = None
        self.cv = None
        self.error = None

    @property
    def key(self):
        return (self.args, self.threads)


def row_time(entry):
    field = "real_time" if "/real_time" in entry["run_name"] else "cpu_time"
    return entry[field] * NS_PER_UNIT.get(entry.get("time_unit", "ns"), 1.0)


def load_rows(path):
    """The rows of one binary's JSON output, in the order the binary ran them."""
    with open(path) as f:
        data = json.load(f)
    rows, samples, medians, cvs = {}, {}, {}, {}
    for entry in data.get("benchmarks", []):
        name = entry.get("run_name", entry["name"])
        row = rows.setdefault(name, Row(name))
        row.threads = entry.get("threads", 1)
        if entry.get("error_occurred"):
            row.error = entry.get("error_message", "error")
            continue
        if entry.get("run_type") == "aggregate":
            if entry.get("aggregate_name") == "median":
                medians[name] = row_time(entry)
            elif entry.get("aggregate_name") == "cv":
                cvs[name] = entry.get("real_time" if "/real_time" in name else "cpu_time")
        else:
            samples.setdefault(name, []).append(row_time(entry))
    for name, row in rows.items():
        times = samples.get(name, [])
        row.ns = medians.get(name, statistics.median(times) if times else None)
        row.cv = cvs.get(name)
        if row.cv is None and len(times) > 1:
            row.cv = statistics.pstdev(times) / statistics.mean(times)
    return data.get("context", {}), list(rows.values())


def pair_rows(binary, rows):
    """(subject, baseline) row pairs, and the rows in no pair."""
    pairs, paired = [], set()
    by_function = {}
    for row in rows:
        by_function.setdefault(row.function, {})[row.key] = row
    for subject_re, baselines in PAIRS.get(binary, []):
        for subject in rows:
            match = re.fullmatch(subject_re, subject.function)
            if not match:
                continue
            for template in baselines:
                baseline = by_function.get(match.expand(template), {}).get(subject.key)
                if baseline is not None and baseline is not subject:
                    pairs.append((subject, baseline))
                    paired.update((subject.name, baseline.name))
    return pairs, [r for r in rows if r.name not in paired]


def fmt_ns(row):
    if row.error:
        return "error: " + row.error
    if row.ns is None:
        return "no data"
    text = f"{row.ns:.3g}" if row.ns < 1000 else f"{row.ns:,.0f}"
    return text + (f" (cv {row.cv * 100:.1f}%)" if row.cv is not None else "")


def ratio(subject, baseline):
    if subject.ns is None or baseline.ns is None or baseline.ns == 0:
        return None
    return subject.ns / baseline.ns


def read_key_values(path):
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                key, sep, value = line.rstrip("\n").partition(": ")
                if sep:
                    out[key] = value
    return out


def read_runs(path):
    runs = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                fields = line.rstrip("\n").split("\t")
                if len(fields) == 5:
                    runs.append(dict(zip(("binary", "start", "load_before", "load_after",
                                          "args"), fields)))
    return runs


def stamp_lines(machine, runs, contexts):
    lines = ["| | |", "| --- | --- |"]
    for key in ("date", "mode", "commit", "cpu", "nproc", "kernel", "compiler", "build type"):
        if key in machine:
            lines.append(f"| {key} | {machine[key]} |")
    build_types = {c.get("library_build_type") for c in contexts.values()} - {None}
    if build_types:
        lines.append("| Google Benchmark library | built as " + ", ".join(sorted(build_types))
                     + " (the library's own build, not sluice's) |")
    lines += ["", "Load average (1, 5, 15 min, from /proc/loadavg) around each binary:", "",
              "| binary | started (UTC) | before | after | arguments |",
              "| --- | --- | --- | --- | --- |"]
    for run in runs:
        lines.append(f"| {run['binary']} | {run['start']} | {run['load_before']} | "
                     f"{run['load_after']} | `{run['args']}` |")
    return lines


def draw_ratio_chart(all_pairs, path):
    import matplotlib  # noqa: PLC0415 (optional dependency)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    import matplotlib.ticker  # noqa: PLC0415

    bars = [(f"{s.name}\nvs {b.name}", ratio(s, b)) for _, s, b in all_pairs]
    bars = [(label, r) for label, r in bars if r is not None]
    if not bars:
        return False
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(bars) + 1.2))
    # Each bar runs from 1 to its ratio: left of 1 the subject is faster, right of 1 slower.
    ratios = [r for _, r in bars]
    ax.barh([label for label, _ in bars], [r - 1 for r in ratios], left=1,
            color=["#4c72b0" if r <= 1 else "#dd8452" for r in ratios])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlim(min(ratios + [1]) / 1.5, max(ratios + [1]) * 1.5)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}×"))
    for y, r in enumerate(ratios):
        ax.annotate(f"{r:.2f}×", (r, y), xytext=(3 if r > 1 else -3, 0),
                    textcoords="offset points", va="center", ha="left" if r > 1 else "right",
                    fontsize=7)
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=6)
    ax.set_xlabel("time of subject / time of baseline (log scale; below 1: subject faster)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def draw_charts(out_dir, all_pairs):
    """Chart lines for the report: the ratios, and the scaling curve where scaling_bench ran."""
    try:
        import matplotlib  # noqa: F401,PLC0415
    except ImportError:
        return ["Charts skipped: python3-matplotlib is not installed."]
    lines = []
    if draw_ratio_chart(all_pairs, os.path.join(out_dir, "ratios.png")):
        lines.append("![subject / baseline](ratios.png)")
    scaling = os.path.join(out_dir, "scaling_bench.json")
    if os.path.exists(scaling):
        plot = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot_scaling.py")
        subprocess.run([sys.executable, plot, scaling, os.path.join(out_dir, "scaling.png")],
                       check=True)
        lines.append("![ns per check against tracked keys](scaling.png)")
    return lines


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    machine = read_key_values(os.path.join(out_dir, "machine.txt"))
    runs = read_runs(os.path.join(out_dir, "runs.tsv"))
    binaries = [r["binary"] for r in runs] or sorted(
        f[:-5] for f in os.listdir(out_dir) if f.endswith("_bench.json"))
    contexts, all_pairs, others = {}, [], []
    for binary in binaries:
        path = os.path.join(out_dir, binary + ".json")
        if not os.path.exists(path):
            others.append((binary, None))
            continue
        contexts[binary], rows = load_rows(path)
        pairs, unpaired = pair_rows(binary, rows)
        all_pairs += [(binary, s, b) for s, b in pairs]
        others += [(binary, r) for r in unpaired]

    lines = ["# sluice benchmark report", ""] + stamp_lines(machine, runs, contexts)
    lines += ["", "## Subjects beside their baselines", "",
              "Each ratio compares two rows of the same binary's run (time per operation, median "
              "of the repetitions; below 1: the subject is faster). Times taken on a loaded "
              "machine (load average above the number of CPUs) are inflated and noisy; compare "
              "ratios, not times, across machines.", "",
              "| binary | subject | ns/op | baseline | ns/op | subject / baseline |",
              "| --- | --- | --- | --- | --- | --- |"]
    for binary, s, b in all_pairs:
        r = ratio(s, b)
        lines.append(f"| {binary} | `{s.name}` | {fmt_ns(s)} | `{b.name}` | {fmt_ns(b)} | "
                     f"{'' if r is None else f'{r:.2f}×'} |")
    lines += ["", "## Other rows", "", "| binary | benchmark | ns/op |", "| --- | --- | --- |"]
    for binary, row in others:
        lines.append(f"| {binary} | " + ("(no output: the binary failed) | |" if row is None
                                         else f"`{row.name}` | {fmt_ns(row)} |"))
    lines += ["", "## Charts", ""] + draw_charts(out_dir, all_pairs)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(os.path.join(out_dir, "report.md"))


if __name__ == "__main__":
    main()
