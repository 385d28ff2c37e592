#!/usr/bin/env bash
# End-to-end test of request paths through the gateway's proxy: a path that climbs out of a route
# with dot segments (sent as is by curl --path-as-is, plain or percent-encoded) is limited by the
# route it resolves to and reaches the upstream as that route's path; an ambiguous path (above
# the root, an encoded '/' or '\') is answered 400 and never reaches the upstream; a query reaches
# the upstream exactly as the client sent it, or not at all.
# Usage: gateway_paths_e2e.sh <sluice_gateway binary> <sluice_test_upstream binary> <gateway.yaml>
set -euo pipefail
gateway=$1
source "$(dirname "$0")/common.sh"

start upstream "$2"
upstream="http://127.0.0.1:$started_port"
start gateway "$gateway" "$3" --port 0 --upstream "$upstream"
gateway_pid=$started_pid
base="http://127.0.0.1:$started_port"

# --- [attack] an upstream that trickles its answer is cut off at one deadline -------------------
# cpp-httplib's read timeout applies to each read on its own: an upstream that sends a byte every
# 500 ms held a gateway worker for as long as it kept sending (here 30 s; forever for one that
# never stops). The whole exchange must end within the gateway's 10 s. Started first, in the
# background, and checked last, so that the other checks run while it waits.
trickle_start=$(date +%s%N)
(
  curl -s --max-time 25 -o "$work/trickle.b" -w '%{http_code}' "$base/v1/items/trickle" \
    >"$work/trickle.s" || true
  date +%s%N >"$work/trickle.t"
) &
trickle_pid=$!

# fetch NAME PATH: GET PATH as written (no dot-segment removal by curl); status in $work/NAME.s,
# headers in $work/NAME.h, body in $work/NAME.b.
fetch() {
  curl -s --path-as-is --max-time 15 -D "$work/$1.h" -o "$work/$1.b" -w '%{http_code}' \
    "$base$2" >"$work/$1.s" || true
}
upstream_requests() { curl -s --max-time 10 "$upstream/__stats" | awk '{ print $2 }'; }

# --- /login allows 5 per minute for the route, whatever path spells it ---------------------------
paths=(/v1/items/../../login /v1/items/%2e%2e/%2e%2e/login /v1/items/%2E%2E/.%2e/login
  /v1/./items/..//../login)
admitted=0
for i in $(seq 20); do
  fetch "climb$i" "${paths[$((i % 4))]}"
  case "$(cat "$work/climb$i.s")" in
    200)
      admitted=$((admitted + 1))
      expect "climb$i upstream path" "$(cat "$work/climb$i.b")" '{"upstream":"ok","path":"/login"}'
      ;;
    429)
      grep -qi '^RateLimit-Policy: "login-throttle/rate_limit/minute";q=5;w=60' "$work/climb$i.h" ||
        fail "climb$i was not denied by the login rule: $(cat "$work/climb$i.h")"
      ;;
    *) fail "climb$i: status $(cat "$work/climb$i.s")" ;;
  esac
done
expect "requests through dot segments admitted" "$admitted" 5
expect "requests the upstream answered" "$(upstream_requests)" 5

# --- ambiguous paths: 400, and the upstream never sees them --------------------------------------
for path in /../login /v1/items/../../../login /v1/items%2F..%2F..%2Flogin /v1/items%2f..%2flogin \
  /v1/items/..%5C..%5Clogin /v1/items%00; do
  fetch ambiguous "$path"
  expect "$path status" "$(cat "$work/ambiguous.s")" 400
  expect "$path body" "$(cat "$work/ambiguous.b")" '{"error":"ambiguous request path"}'
done
expect "requests the upstream answered after the ambiguous ones" "$(upstream_requests)" 5

# --- a plain path is forwarded as it came ---------------------------------------------------------
fetch items /v1/items/42
expect "items status" "$(cat "$work/items.s")" 200
expect "items upstream path" "$(cat "$work/items.b")" '{"upstream":"ok","path":"/v1/items/42"}'

# --- [attack] a query reaches the upstream as the client sent it --------------------------------
# The query key below decodes to CR LF and a second request line: written back decoded into the
# upstream request, it ends the request to /v1/items and has an upstream that reads pipelined
# requests serve a /login that the login route never limited.
smuggle='a%20HTTP/1.1%0D%0AHost:%20x%0D%0A%0D%0AGET%20/login%20HTTP/1.1%0D%0AX-Pad:%20=1'
fetch smuggle "/v1/items?$smuggle"
expect "smuggling query: status" "$(cat "$work/smuggle.s")" 200
expect "smuggling query: what the upstream received" "$(cat "$work/smuggle.b")" \
  "{\"upstream\":\"ok\",\"path\":\"/v1/items\",\"query\":\"$smuggle\"}"
fetch query "/v1/items?b=x%2By&a=1&a=2&c"
expect "plain query: what the upstream received" "$(cat "$work/query.b")" \
  '{"upstream":"ok","path":"/v1/items","query":"b=x%2By&a=1&a=2&c"}'

# A query with a raw control character (a bare CR, which cpp-httplib lets into the target) is
# refused: no upstream could read it as the client meant.
before=$(upstream_requests)
raw_status=$(exec 3<>"/dev/tcp/127.0.0.1/${base##*:}" &&
  printf 'GET /v1/items?a\rb=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n' >&3 &&
  head -c 12 <&3 | cut -c10-12)
expect "a bare CR in the query: status" "$raw_status" 400
expect "requests the upstream answered for a bare CR in the query" \
  "$(($(upstream_requests) - before))" 0

# --- [attack] an upstream answer is read up to a bound --------------------------------------------
# 64 MiB from the upstream, held whole by every worker that proxies it, would take the gateway's
# memory far past its bound; it is answered 502 once the bound is passed.
fetch large /v1/items/large
expect "a 64 MiB upstream answer: status" "$(cat "$work/large.s")" 502
expect "a 64 MiB upstream answer: body" "$(head -c 100 "$work/large.b")" \
  '{"error":"upstream answer too large"}'

# --- [attack] an upstream's headers are read up to a bound -----------------------------------------
# cpp-httplib's client reads header lines until the blank one, however many: 20 MiB of them took
# the gateway's memory far past its bound (some 100 MiB per answer, held by every worker that
# proxied one). They are answered 502 once 64 KiB of status line and headers were read.
fetch headers /v1/items/headers
expect "20 MiB of upstream headers: status" "$(cat "$work/headers.s")" 502
peak_kib=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$gateway_pid/status")
echo "gateway_paths_e2e: gateway VmHWM after large upstream answers: ${peak_kib} kB"
if ! [[ "$peak_kib" =~ ^[0-9]+$ ]] || [ "$peak_kib" -gt $((64 * 1024)) ]; then
  fail "gateway VmHWM: expected under 65536 kB, got '$peak_kib' kB"
fi

wait "$trickle_pid"
trickle_ms=$((($(cat "$work/trickle.t") - trickle_start) / 1000000))
expect "a trickling upstream: status" "$(cat "$work/trickle.s")" 502
expect "a trickling upstream: body" "$(cat "$work/trickle.b")" '{"error":"upstream unavailable"}'
[ "$trickle_ms" -le 13000 ] ||
  fail "a trickling upstream held the request for $trickle_ms ms (the deadline is 10000 ms)"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed; gateway log:" >&2
  cat "$work/gateway.err" >&2
  exit 1
fi
echo "gateway paths end-to-end: all checks passed"
