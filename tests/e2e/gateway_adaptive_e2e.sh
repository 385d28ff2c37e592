#!/usr/bin/env bash
# End-to-end test of adaptive limits: the gateway proxies a route to a test upstream
# (sluice_test_upstream) and feeds every answer to the route's adaptive rule. Load from several
# curl loops; the admitted rate is what reached the upstream (its own count) over measured time.
# A fast upstream admits the configured 20 per second; slowed to 300 ms (target 100 ms) the
# factor falls to its 25% floor and the admitted rate with it; fast again, both recover. 503s
# with Retry-After from several clients drop the factor at once, held for the Retry-After. One
# client's single 503 with Retry-After: 300 drops nothing: fresh clients keep their share. The
# load comes from several clients (X-Forwarded-For from a trusted proxy), as the rule only
# shrinks on answers to at least min_clients distinct clients.
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
  trusted_proxies: [127.0.0.1/32]
policies:
  - name: upstream-guard
    rate_limits:
      - name: per-route
        selector: [route]
        requests_per: { s: 20 }
        burst: 20
        adaptive:
          target_latency_ms: 100
          interval_ms: 500
          decrease_permille: 500
          recovery_permille: 250
          minimum_factor_permille: 250
          max_hold_seconds: 6
          min_samples: 2                # at the floor, 5/s leave ~2.5 answers per interval
          min_clients: 2
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
      curl -s --max-time 15 -o /dev/null -H "X-Forwarded-For: 198.51.100.$i" "$base/api/item" ||
        true
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

# --- one client's 503 with Retry-After: 300 on one path: nobody else's share moves --------------
expect "the unavailable path's 503 is passed back" \
  "$(code "$base/api/unavailable" -H "X-Forwarded-For: 203.0.113.66")" 503
expect "factor after one client's 503" "$(factor)" 1000
passed=0
for i in $(seq 25); do # fresh clients, right after it: the bucket of 20 (and what refills)
  [ "$(code "$base/api/item" -H "X-Forwarded-For: 192.0.2.$((i % 5 + 1))")" == 200 ] &&
    passed=$((passed + 1))
done
[ "$passed" -ge 20 ] || fail "fresh clients after one 503: $passed of 25 admitted, expected 20 or more"
expect "factor after the fresh clients" "$(factor)" 1000

# --- a fast upstream: the configured rate -------------------------------------------------------
load 1 # spends the burst
load 3
fast_rate=$rate
expect "factor with a fast upstream" "$(factor)" 1000
[ "$fast_rate" -ge 140 ] || fail "fast upstream: admitted $((fast_rate / 10)).$((fast_rate % 10))/s, expected about 20/s"

# --- a slow upstream: the factor falls to its floor, and the admitted rate with it ---------------
control "delay_ms=300"
load 3 # the latency average passes the target, then each 500 ms interval halves the factor
load 3
slow_rate=$rate
expect "factor with a slow upstream" "$(factor)" 250
[ "$slow_rate" -le 90 ] || fail "slow upstream: admitted $((slow_rate / 10)).$((slow_rate % 10))/s, expected about 5/s"
[ "$slow_rate" -gt 0 ] || fail "slow upstream: nothing admitted"
decreases=$(metric "$base" "sluice_rule_limit_decreases_total$rule")
[ "${decreases:-0}" -ge 2 ] || fail "decreases: expected at least 2 (1000 -> 500 -> 250), got '$decreases'"

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

# --- 503s with Retry-After from two clients: the floor at once, held for the Retry-After --------
sleep 1.1 # a full bucket again
control "status=503&retry_after=4"
expect "an upstream 503 is passed back" "$(code "$base/api/item" -H "X-Forwarded-For: 192.0.2.1")" 503
expect "factor after one client's 503" "$(factor)" 1000
expect "another client's 503" "$(code "$base/api/item" -H "X-Forwarded-For: 192.0.2.2")" 503
# The two answers are counted in the 500 ms interval they fall in; where a boundary fell between
# them, the next pair (a few ms apart) lands in one interval.
for _ in 1 2; do
  [ "$(factor)" == 250 ] && break
  code "$base/api/item" -H "X-Forwarded-For: 192.0.2.1" >/dev/null
  code "$base/api/item" -H "X-Forwarded-For: 192.0.2.2" >/dev/null
done
expect "factor right after 503s to two clients" "$(factor)" 250
control "status=200&retry_after=0"
sleep 1 # 3 s of the hold left: room for a loaded machine
expect "factor during the hold" "$(factor)" 250
for _ in $(seq 50); do
  [ "$(factor)" == 1000 ] && break
  sleep 0.2
done
expect "factor after the hold" "$(factor)" 1000

echo "fresh clients after one client's 503: $passed of 25 admitted"
echo "admitted per second (x10): fast $fast_rate, slow $slow_rate, recovered $recovered_rate"
if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed; gateway log:" >&2
  cat "$work/gateway.err" >&2
  exit 1
fi
echo "gateway adaptive end-to-end: all checks passed"
