#!/usr/bin/env bash
# End-to-end test of adaptive limits: the gateway proxies a route to a test upstream
# (sluice_test_upstream) and feeds every answer to the route's adaptive rule. Load from several
# curl loops; the admitted rate is what reached the upstream (its own count) over measured time.
# A fast upstream admits the configured 20 per second; slowed to 300 ms (target 100 ms) the
# factor falls to its 20% floor and the admitted rate with it; fast again, both recover. A 503
# with Retry-After drops the factor at once, held for the Retry-After.
# Usage: gateway_adaptive_e2e.sh <sluice_gateway binary> <sluice_test_upstream binary>
set -euo pipefail
gateway=$1
upstream_bin=$2
source "$(dirname "$0")/common.sh"

cat >"$work/adaptive.yaml" <<'YAML'
listeners:
  - name: public
routes:
  - name: api
    path_prefix: /api
    policies: [upstream-guard]
gateway:
  exempt_paths: [/healthz, /metrics]
policies:
  - name: upstream-guard
    rate_limits:
      - name: per-route
        selector: [route]
        requests_per: { s: 20 }
        burst: 20
        adaptive:
          target_latency_ms: 100
          interval_ms: 250
          decrease_permille: 500
          recovery_permille: 250
          minimum_factor_permille: 200
          max_hold_seconds: 6
YAML

start upstream "$upstream_bin"
upstream="http://127.0.0.1:$started_port"
start gateway "$gateway" "$work/adaptive.yaml" --port 0 --upstream "$upstream"
base="http://127.0.0.1:$started_port"

rule='{rule="upstream-guard/per-route",dry_run="false"}'
factor() { metric "$base" "sluice_rule_limit_factor_permille$rule"; }
upstream_count() { curl -s --max-time 10 "$upstream/__stats" | awk '{ print $2 }'; }
control() { expect "control $1" "$(code "$upstream/__control?$1")" 200; }

# load SECONDS: six curl loops against the route for SECONDS; sets `rate`, the requests that
# reached the upstream per second (x10, an integer), over the measured time.
load() {
  local before start_ns end_ns after i
  before=$(upstream_count)
  start_ns=$(date +%s%N)
  local until=$((start_ns + $1 * 1000000000))
  for i in 1 2 3 4 5 6; do
    (while [ "$(date +%s%N)" -lt "$until" ]; do
      curl -s --max-time 15 -o /dev/null "$base/api/item" || true
      sleep 0.05
    done) &
  done
  wait_loops
  end_ns=$(date +%s%N)
  after=$(upstream_count)
  rate=$(((after - before) * 10 * 1000000000 / (end_ns - start_ns)))
}
# Waits for the curl loops only (not the servers).
wait_loops() {
  local pid
  for pid in $(jobs -p); do
    case " ${server_pids[*]} " in *" $pid "*) continue ;; esac
    wait "$pid" || true
  done
}

# --- a fast upstream: the configured rate -------------------------------------------------------
load 1 # spends the burst
load 3
fast_rate=$rate
expect "factor with a fast upstream" "$(factor)" 1000
[ "$fast_rate" -ge 140 ] || fail "fast upstream: admitted $((fast_rate / 10)).$((fast_rate % 10))/s, expected about 20/s"

# --- a slow upstream: the factor falls to its floor, and the admitted rate with it ---------------
control "delay_ms=300"
load 3 # the latency average passes the target, then each 250 ms interval halves the factor
load 3
slow_rate=$rate
expect "factor with a slow upstream" "$(factor)" 200
[ "$slow_rate" -le 80 ] || fail "slow upstream: admitted $((slow_rate / 10)).$((slow_rate % 10))/s, expected about 4/s"
[ "$slow_rate" -gt 0 ] || fail "slow upstream: nothing admitted"
decreases=$(metric "$base" "sluice_rule_limit_decreases_total$rule")
[ "${decreases:-0}" -ge 3 ] || fail "decreases: expected at least 3 (1000 -> 500 -> 250 -> 200), got '$decreases'"

# --- fast again: the factor recovers, and the rate with it --------------------------------------
control "delay_ms=0"
for _ in $(seq 10); do
  load 1
  [ "$(factor)" == 1000 ] && break
done
expect "factor after recovery" "$(factor)" 1000
load 3
recovered_rate=$rate
[ "$recovered_rate" -ge 140 ] || fail "recovered upstream: admitted $((recovered_rate / 10)).$((recovered_rate % 10))/s, expected about 20/s"

# --- a 503 with Retry-After: the floor at once, held for the Retry-After -------------------------
sleep 1.1 # a full bucket again
control "status=503&retry_after=4"
expect "an upstream 503 is passed back" "$(code "$base/api/item")" 503
expect "factor right after the 503" "$(factor)" 200
control "status=200&retry_after=0"
sleep 1 # 3 s of the hold left: room for a loaded machine
expect "factor during the hold" "$(factor)" 200
for _ in $(seq 50); do
  [ "$(factor)" == 1000 ] && break
  sleep 0.2
done
expect "factor after the hold" "$(factor)" 1000

echo "admitted per second (x10): fast $fast_rate, slow $slow_rate, recovered $recovered_rate"
if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed; gateway log:" >&2
  cat "$work/gateway.err" >&2
  exit 1
fi
echo "gateway adaptive end-to-end: all checks passed"
