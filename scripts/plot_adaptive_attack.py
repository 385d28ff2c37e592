#!/usr/bin/env python3
"""Charts an adaptive rule's normal trajectory beside one client's attack on it, as an SVG, from
the data engine_adaptive_test records with deterministic time. Only recorded points are drawn.

Usage: SLUICE_ADAPTIVE_TRAJECTORY=/tmp/trajectory.csv build/dev/tests/engine_tests \\
           "a slow-down\\, a 503 and the recovery*"
       SLUICE_ADAPTIVE_ATTACK=/tmp/attack.csv build/dev/tests/engine_tests \\
           "one client's 503 with Retry-After 300*"
       python3 scripts/plot_adaptive_attack.py /tmp/trajectory.csv /tmp/attack.csv \\
           docs/adaptive-attack.svg
Needs nothing beyond Python 3.
"""
import csv
import sys

PANEL_W, PANEL_H, LEFT, RIGHT, TOP, BOTTOM, GAP = 500, 300, 55, 50, 70, 130, 30
BLUE, RED, GREY = "#1f77b4", "#d62728", "#888"


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def steps(xs, ys, x, y):
    """A step line (value held until the next point) through the points."""
    out = []
    for i, (a, b) in enumerate(zip(xs, ys)):
        out.append(f"{x(a):.1f},{y(b):.1f}")
        end = xs[i + 1] if i + 1 < len(xs) else a + 1
        out.append(f"{x(end):.1f},{y(b):.1f}")
    return " ".join(out)


def panel(svg, left, title, x_max, admitted_max, series, notes):
    """One chart at x offset `left`: admitted per second (left axis), factor (right axis)."""
    w, h = PANEL_W - LEFT - RIGHT, PANEL_H
    x0 = left + LEFT
    x = lambda s: x0 + s / x_max * w  # noqa: E731
    ya = lambda v: TOP + h - v / admitted_max * h  # noqa: E731
    yf = lambda f: TOP + h - f / 1000 * h  # noqa: E731
    svg.append(f'<text x="{x0}" y="{TOP - 28}" font-size="13">{title}</text>')
    for i in range(5):
        v = admitted_max * i / 4
        svg.append(f'<line x1="{x0}" x2="{x0 + w}" y1="{ya(v):.1f}" y2="{ya(v):.1f}" '
                   'stroke="#e5e5e5"/>')
        svg.append(f'<text x="{x0 - 6}" y="{ya(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
        svg.append(f'<text x="{x0 + w + 6}" y="{ya(v) + 4:.1f}">{i / 4:g}</text>')
    for i in range(6):
        s = x_max * i / 5
        svg.append(f'<text x="{x(s):.1f}" y="{TOP + h + 16}" text-anchor="middle">{s:g}</text>')
    svg.append(f'<text x="{x0 + w / 2}" y="{TOP + h + 32}" text-anchor="middle">time (s)</text>')
    svg.append(f'<text x="{x0 - 40}" y="{TOP + h / 2}" text-anchor="middle" '
               f'transform="rotate(-90 {x0 - 40} {TOP + h / 2})">admitted per second</text>')
    svg.append(f'<text x="{x0 + w + 38}" y="{TOP + h / 2}" text-anchor="middle" '
               f'transform="rotate(90 {x0 + w + 38} {TOP + h / 2})">limit factor</text>')
    svg.append(f'<rect x="{x0}" y="{TOP}" width="{w}" height="{h}" fill="none" stroke="#999"/>')
    for at, text in notes:
        svg.append(f'<line x1="{x(at):.1f}" x2="{x(at):.1f}" y1="{TOP}" y2="{TOP + h}" '
                   'stroke="orange" stroke-dasharray="3,3"/>')
        svg.append(f'<text x="{x(at) + 3:.1f}" y="{TOP + 12}" fill="#b36b00">{text}</text>')
    for n, (xs, ys, factor, color, dash, label) in enumerate(series):
        y = yf if factor else ya
        svg.append(f'<polyline points="{steps(xs, ys, x, y)}" fill="none" stroke="{color}" '
                   f'stroke-width="1.8" stroke-dasharray="{dash}"/>')
        ly = TOP + h + 52 + 18 * n
        svg.append(f'<line x1="{x0}" x2="{x0 + 30}" y1="{ly}" y2="{ly}" stroke="{color}" '
                   f'stroke-width="2" stroke-dasharray="{dash}"/>')
        svg.append(f'<text x="{x0 + 36}" y="{ly + 4}">{label}</text>')


def main(trajectory, attack, target):
    normal, hit = read(trajectory), read(attack)
    col = lambda rows, name: [int(r[name]) for r in rows]  # noqa: E731
    width, height = 2 * PANEL_W + GAP, TOP + PANEL_H + BOTTOM
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{LEFT}" y="20" font-size="14">An adaptive rule of 20/s per client, target '
           '100 ms: its control law, and one client trying to pin it (recorded with deterministic '
           'time)</text>']
    s = col(normal, "second")
    panel(svg, 0, "Normal: one client at 50/s, upstream slow 10–20 s, a 503 at 30 s",
          max(s) + 1, 40,
          [(s, col(normal, "admitted"), False, BLUE, "", "admitted per second"),
           (s, col(normal, "factor_permille"), True, RED, "6,3", "limit factor")],
          [(10, "400 ms"), (30, "503, Retry-After: 5")])
    a = col(hit, "second")
    panel(svg, PANEL_W + GAP, "Attack: 6 clients at 5/s; a 7th gets a 503, Retry-After: 300",
          max(a) + 1, 36,
          [(a, col(hit, "protected_admitted"), False, BLUE, "",
            "admitted, defaults (min_samples 5, min_clients 3, max_retry_after 30 s)"),
           (a, col(hit, "protected_factor"), True, BLUE, "6,3", "factor, defaults"),
           (a, col(hit, "unprotected_admitted"), False, RED, "",
            "admitted, min_samples 1, min_clients 1, max_retry_after 300 s"),
           (a, col(hit, "unprotected_factor"), True, RED, "6,3", "factor, unprotected")],
          [(5, "the 503")])
    svg.append("</svg>")
    with open(target, "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
