#!/usr/bin/env bash
# End-to-end test of the login example: starts sluice_login on a free loopback port (delays of
# 1 s doubling up to 4 s), drives it with curl and asserts statuses, Retry-After and the reported
# waits. Five wrong passwords: each is answered 401, and an immediate retry is answered 429 with a
# wait that doubles (1, 2, then the 4 s cap); the test waits out each one (the server's own
# figure), which is the only sleeping it does. A right password then answers 200 and resets the
# sequence. Each response carries the fields of the limiter that decided it: a 401 the per-address
# rule admitted carries that rule's X-RateLimit-*; a 429 of the attempt limiter carries its
# Retry-After and none of the per-address rule's fields; the per-address rule's own 429 (after
# the address's 30 per minute) carries its fields. With a redis-server binary as second argument, the script starts that server on a
# unix socket in its temp dir and runs the same checks with the records in Redis. Every server is
# always stopped by pid (trap).
# Usage: login_e2e.sh <sluice_login binary> [<redis-server binary>]
set -euo pipefail

login=$1
redis_server=${2:-}
work=$(mktemp -d)
server_pid=""
redis_pid=""
cleanup() {
  for pid in "$server_pid" "$redis_pid"; do
    if [ -n "$pid" ]; then
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$work"
}
trap cleanup EXIT

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

backend=()
if [ -n "$redis_server" ]; then
  "$redis_server" --port 0 --unixsocket "$work/redis.sock" --unixsocketperm 700 --save '' \
    --appendonly no --dir "$work" --logfile "$work/redis.log" --daemonize no \
    --maxmemory 64mb --maxmemory-policy volatile-ttl &
  redis_pid=$!
  for _ in $(seq 100); do
    [ -S "$work/redis.sock" ] && break
    sleep 0.1
  done
  [ -S "$work/redis.sock" ] || { echo "FAIL: redis-server did not start" >&2; exit 1; }
  backend=(--redis-socket "$work/redis.sock")
fi

"$login" --port 0 --initial-delay-ms 1000 --delay-cap-ms 4000 --quiet-period-ms 60000 \
  --lease-ms 10000 --per-ip-per-minute 30 "${backend[@]}" >"$work/stdout" 2>"$work/stderr" &
server_pid=$!
port=""
for _ in $(seq 100); do
  port=$(sed -n 's|^sluice_login: listening on http://127.0.0.1:\([0-9]*\)$|\1|p' "$work/stdout")
  [ -n "$port" ] && break
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$port" ]; then
  echo "FAIL: the login server did not start" >&2
  cat "$work/stdout" "$work/stderr" >&2
  exit 1
fi
base="http://127.0.0.1:$port"

# attempt NAME USER PASSWORD: status in ${status[NAME]}, headers in $work/NAME.h, body in
# $work/NAME.b.
declare -A status
attempt() {
  status[$1]=$(curl -s --max-time 10 -D "$work/$1.h" -o "$work/$1.b" -w '%{http_code}' \
    --data-urlencode "user=$2" --data-urlencode "password=$3" "$base/login")
}
header() {  # header NAME FIELD: the field's value in the response NAME ("" when absent)
  { grep -i "^$2:" "$work/$1.h" || true; } | head -n 1 | cut -d' ' -f2- | tr -d '\r'
}
expect() {  # expect WHAT ACTUAL EXPECTED
  [ "$2" == "$3" ] || fail "$1: expected '$3', got '$2'"
}
# A denial by the attempt limiter carries none of the per-address rule's fields.
expect_no_rule_fields() {  # expect_no_rule_fields NAME
  local field
  for field in X-RateLimit-Limit X-RateLimit-Remaining X-RateLimit-Reset RateLimit-Policy \
    RateLimit; do
    if grep -qi "^$field:" "$work/$1.h"; then fail "$1 carries $field: $(header "$1" "$field")"; fi
  done
}
# The wait a 429 reports, in ms: at most the nominal delay, and more than half of it (the retry
# follows the failure at once; only a stalled machine takes longer than half the delay).
expect_wait() {  # expect_wait NAME NOMINAL_MS FAILURES
  local body wait
  body=$(cat "$work/$1.b")
  wait=$(sed -n 's|^{"error":"too many attempts","reason":"backoff","retry_after_ms":\([0-9]*\),"failures":'"$3"'}$|\1|p' \
    <<<"$body")
  if ! [[ "$wait" =~ ^[0-9]+$ ]] || [ "$wait" -gt "$2" ] || [ $((wait * 2)) -le "$2" ]; then
    fail "$1: expected a backoff of (${2}/2, $2] ms after $3 failures, got '$body'"
    wait=$2
  fi
  WAIT_MS=$wait
}

# --- five wrong passwords: the waits double, then stay at the cap -----------------------------------------
nominal=(1000 2000 4000 4000 4000)
previous=0
for i in 1 2 3 4 5; do
  user=alice
  [ "$i" -eq 3 ] && user="  Alice "  # the same subject after normalization
  attempt "wrong$i" "$user" "guess$i"
  expect "wrong$i status" "${status[wrong$i]}" 401
  expect "wrong$i X-RateLimit-Limit" "$(header "wrong$i" X-RateLimit-Limit)" 30
  attempt "early$i" alice "correct horse"  # too early, even with the right password
  expect "early$i status" "${status[early$i]}" 429
  expect_wait "early$i" "${nominal[$((i - 1))]}" "$i"
  # Retry-After: the same wait in whole seconds, rounded up.
  expect "early$i Retry-After" "$(header "early$i" Retry-After)" $(((WAIT_MS + 999) / 1000))
  expect_no_rule_fields "early$i"
  [ "$i" -ge 4 ] || [ "$WAIT_MS" -gt "$previous" ] || fail "early$i: the wait did not grow"
  previous=$WAIT_MS
  sleep "$(awk "BEGIN { printf \"%.3f\", $WAIT_MS / 1000 }")"
done

# --- the right password after the wait: 200, and the record is cleared ----------------------------
attempt right alice "correct horse"
expect "right status" "${status[right]}" 200
expect "right body" "$(cat "$work/right.b")" '{"ok":true}'
if grep -qi '^Retry-After' "$work/right.h"; then fail "a success carries Retry-After"; fi
attempt again alice "wrong again"
expect "again status" "${status[again]}" 401
attempt again_early alice "correct horse"
expect "again_early status" "${status[again_early]}" 429
expect_wait again_early 1000 1  # the sequence starts over

# --- other users are independent; bad requests are refused --------------------------------------
attempt bob bob "anything"
expect "bob status" "${status[bob]}" 401
status[bad]=$(curl -s --max-time 10 -o "$work/bad.b" -w '%{http_code}' --data "user=alice" \
  "$base/login")
expect "missing password status" "${status[bad]}" 400

# --- the per-address rule: 30 per minute, then its own 429 with its own fields ---------------------
flooded=""
for i in $(seq 40); do
  code=$(curl -s --max-time 10 -D "$work/flood.h" -o "$work/flood.b" -w '%{http_code}' \
    --data "user=flood" "$base/login")
  if [ "$code" == 429 ]; then
    flooded=$i
    break
  fi
  expect "flood$i status" "$code" 400
done
if [ -z "$flooded" ]; then
  fail "40 requests from one address were never limited"
else
  expect "flood X-RateLimit-Limit" "$(header flood X-RateLimit-Limit)" 30
  expect "flood X-RateLimit-Remaining" "$(header flood X-RateLimit-Remaining)" 0
  [[ "$(header flood Retry-After)" =~ ^[1-9][0-9]*$ ]] || fail "flood: no Retry-After"
  grep -q '^{"error":"rate limited"' "$work/flood.b" || fail "flood body: $(cat "$work/flood.b")"
fi

if grep -q -e "guess" -e "correct horse" "$work/stdout" "$work/stderr"; then
  fail "the server printed a password"
fi
if [ -n "$redis_server" ]; then  # the records were in Redis, under hashed keys only, no TTL
  keys=$(redis-cli -s "$work/redis.sock" --scan 2>/dev/null || true)
  if ! grep -qE '^login:\{attempts\}:[0-9a-f]{32}$' <<<"$keys" ||
    grep -vqE '^login:\{attempts\}:([0-9a-f]{32}|index)$' <<<"$keys" ||
    grep -qi alice <<<"$keys"; then
    fail "unexpected Redis keys: $keys"
  fi
  for key in $keys; do  # no TTL: no volatile-* eviction policy may pick an attempt record
    ttl=$(redis-cli -s "$work/redis.sock" pttl "$key" 2>/dev/null || true)
    expect "PTTL of $key" "$ttl" -1
  done
fi

if [ "$failures" -ne 0 ]; then
  echo "--- login stderr" >&2
  cat "$work/stderr" >&2
  echo "login_e2e: $failures failure(s)" >&2
  exit 1
fi
echo "login_e2e: all checks passed"
