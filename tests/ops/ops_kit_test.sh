#!/usr/bin/env bash
# Checks the operations kit (ops/): the Grafana dashboard is valid JSON whose queries parse as
# PromQL, the dashboard and the alert rules name only series that sluice/prometheus.hpp writes,
# the dashboard shows every one of them, `promtool check rules` accepts the alert rules and
# `promtool test rules` passes their unit tests. Exits 77 (skipped) without promtool or python3.
# Usage: ops_kit_test.sh <sluice source dir>
set -euo pipefail

source_dir=$1
alerts="$source_dir/ops/prometheus/sluice-alerts.yml"
alert_tests="$source_dir/ops/prometheus/sluice-alerts.test.yml"
dashboard="$source_dir/ops/grafana/sluice-dashboard.json"
header="$source_dir/include/sluice/prometheus.hpp"

for tool in promtool python3; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "SKIPPED: $tool not found (promtool: Debian package prometheus); the ops kit is unchecked"
    exit 77
  fi
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# --- the dashboard is JSON ---------------------------------------------------------------------
python3 -m json.tool "$dashboard" >/dev/null || fail "$dashboard is not valid JSON"

# --- series names: only those the header writes, and all of them on the dashboard --------------
# The header's families are the quoted names in its family tables, not its comments.
grep -oE '"sluice_(engine|rule)_[a-z_]+"' "$header" | tr -d '"' | sort -u >"$work/written"
[ -s "$work/written" ] || fail "no metric family found in $header"
for file in "$dashboard" "$alerts" "$alert_tests"; do
  grep -oE 'sluice_(engine|rule)_[a-z_]+' "$file" | sort -u >"$work/named"
  unknown=$(comm -23 "$work/named" "$work/written")
  [ -z "$unknown" ] || fail "$file names series that sluice does not write: $unknown"
done
grep -oE 'sluice_(engine|rule)_[a-z_]+' "$dashboard" | sort -u >"$work/shown"
missing=$(comm -13 "$work/shown" "$work/written")
[ -z "$missing" ] || fail "the dashboard shows no panel for: $missing"

# --- every dashboard query parses: as recording rules, with Grafana's variables filled in -------
python3 - "$dashboard" >"$work/dashboard-queries.yml" <<'PY'
import json, sys

def queries(node):
    if isinstance(node, dict):
        if isinstance(node.get("expr"), str):
            yield node["expr"]
        for value in node.values():
            yield from queries(value)
    elif isinstance(node, list):
        for value in node:
            yield from queries(value)

with open(sys.argv[1]) as f:
    dashboard = json.load(f)
print("groups:\n  - name: dashboard\n    rules:")
for i, expr in enumerate(queries(dashboard)):
    for variable, value in (("$__rate_interval", "5m"), ("$__range", "6h"), ("$job", ".*"),
                            ("$instance", ".*"), ("$rule", ".*")):
        expr = expr.replace(variable, value)
    print(f"      - record: dashboard:query{i}\n        expr: {json.dumps(expr)}")
PY
grep -q 'record: dashboard:query0$' "$work/dashboard-queries.yml" || fail "the dashboard has no query"
promtool check rules "$work/dashboard-queries.yml" >"$work/dashboard-check.out" 2>&1 ||
  fail "a dashboard query does not parse: $(cat "$work/dashboard-check.out")"

# --- the alert rules: valid, and their unit tests pass -------------------------------------------
promtool check rules "$alerts" || fail "promtool check rules $alerts"
(cd "$(dirname "$alert_tests")" && promtool test rules "$(basename "$alert_tests")") ||
  fail "promtool test rules $alert_tests"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "ops kit: dashboard ($(wc -l <"$work/shown") series), alert rules and their tests pass"
