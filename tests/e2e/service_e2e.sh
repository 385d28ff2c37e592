#!/usr/bin/env bash
# End-to-end test of the service of docs/integration.md (examples/service) with Redis chosen in
# its YAML: the script starts a redis-server on a unix socket in its temp dir, writes a config
# whose backend section names it, and checks with curl that requests are limited on Redis (a
# second replica sees the first one's spent budget), that a denial is a 429 with the fields, that
# /metrics serves the counters, that SIGHUP and a changed file reload, and that a reload that
# changes the backend is refused while the running config keeps serving.
# Usage: service_e2e.sh <sluice_example_service binary> <redis-server binary> <service.yaml>
set -euo pipefail
service=$1
redis_server=$2
source "$(dirname "$0")/common.sh"

"$redis_server" --port 0 --unixsocket "$work/redis.sock" --unixsocketperm 700 --save '' \
  --appendonly no --dir "$work" --logfile "$work/redis.log" --daemonize no \
  --maxmemory 64mb --maxmemory-policy volatile-ttl &
server_pids+=("$!")
for _ in $(seq 100); do
  [ -S "$work/redis.sock" ] && break
  sleep 0.1
done
[ -S "$work/redis.sock" ] || { echo "FAIL: redis-server did not start" >&2; exit 1; }

# The example's config with three requests per hour, moved to Redis by its backend section. Per
# hour, not per minute: the checks after the raised limit expect a spent client to stay denied,
# and at 10 per minute it would get a request back 6 s after its first (a slow sanitizer run
# took longer).
config() { # config REQUESTS KEY_PREFIX
  sed "s/requests_per: { s: 2 }/requests_per: { hour: $1 }/" "$3"
  printf 'backend: { type: redis, unix_socket: "%s", key_prefix: "%s" }\n' "$work/redis.sock" "$2"
}
config 3 "rl:e2e:" "$3" >"$work/service.yaml"
grep -q "hour: 3" "$work/service.yaml" || { echo "FAIL: the example config changed" >&2; exit 1; }

start one "$service" "$work/service.yaml"
one="http://127.0.0.1:$started_port"
for i in 1 2 3; do expect "request $i" "$(code "$one/v1/items")" 200; done
headers=$(curl -s --max-time 15 -D - -o "$work/denied.json" "$one/v1/items" | tr -d '\r')
expect "request 4" "$(sed -n 's|^HTTP/1.1 \([0-9]*\).*|\1|p' <<<"$headers")" 429
grep -qi '^Retry-After: [1-9]' <<<"$headers" || fail "no Retry-After: $headers"
grep -qi '^X-RateLimit-Limit: 3$' <<<"$headers" || fail "no X-RateLimit-Limit: $headers"
grep -qi '^RateLimit-Policy: ' <<<"$headers" || fail "no RateLimit-Policy: $headers"
grep -q '"error":"rate limited"' "$work/denied.json" || fail "body: $(cat "$work/denied.json")"

# The state is in Redis, under the configured prefix: a second replica sees the spent budget.
keys=$(redis-cli -s "$work/redis.sock" --scan --pattern 'rl:e2e:*' | wc -l)
[ "$keys" -ge 1 ] || fail "no Redis key under rl:e2e:"
start two "$service" "$work/service.yaml"
two="http://127.0.0.1:$started_port"
expect "second replica, same client" "$(code "$two/v1/items")" 429

# /metrics: the counters of the current generation, never limited.
expect "metrics status" "$(code "$one/metrics")" 200
expect "denials on replica one" \
  "$(metric "$one" 'sluice_rule_denied_total{rule="api/per-ip",dry_run="false"}')" 1
expect "evaluations on replica one" "$(metric "$one" sluice_engine_evaluations_total)" 4

# SIGHUP reloads the unchanged file (the holder's thread does it; the handler only wakes it).
expect "reloads at start" "$(metric "$one" sluice_engine_reloads_total)" 0
kill -HUP "${server_pids[1]}"
wait_metric "$one" sluice_engine_reloads_total 1 || fail "SIGHUP did not reload"
expect "still limited after SIGHUP" "$(code "$one/v1/items")" 429

# A changed file is picked up by the poll (every second, once it has settled for a second).
config 10 "rl:e2e:" "$3" >"$work/next.yaml"
mv "$work/next.yaml" "$work/service.yaml"
wait_metric "$one" sluice_engine_reloads_total 2 || fail "the changed file was not reloaded"
# The raised limit applies (its X-RateLimit-Limit), and the client keeps the share of its bucket
# it had spent, all of it here: a reload never hands a spent client a fresh burst.
limit_header() { # limit_header URL: the status and X-RateLimit-Limit of one request
  curl -s --max-time 15 -D - -o /dev/null "$1" | tr -d '\r' |
    sed -n -e 's|^HTTP/1.1 \([0-9]*\).*|\1|p' -e 's|^[Xx]-[Rr]ate[Ll]imit-[Ll]imit: ||p' | paste -sd' '
}
expect "a raised limit, a spent client" "$(limit_header "$one/v1/items")" "429 10"

# A changed backend section is refused: the running config keeps serving, the failure is counted.
config 10 "rl:other:" "$3" >"$work/next.yaml"
mv "$work/next.yaml" "$work/service.yaml"
wait_metric "$one" sluice_engine_failed_reloads_total 1 || fail "the backend change was not refused"
expect "served by the running config after the refused reload" \
  "$(limit_header "$one/v1/items")" "429 10"
[ "$(redis-cli -s "$work/redis.sock" --scan --pattern 'rl:other:*' | wc -l)" -eq 0 ] ||
  fail "keys under the refused prefix"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed; service logs:" >&2
  cat "$work/one.err" "$work/two.err" >&2
  exit 1
fi
echo "service_e2e: all checks passed"
