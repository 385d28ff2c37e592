#!/usr/bin/env bash
# End-to-end test of the gateway's config reload: the gateway serves a copy of the example config;
# the test edits the copy while it runs and checks, with curl, that an unchanged rule keeps its
# state, that a broken file keeps the last good config serving (reported once), that a changed
# limit keeps what each key spent, that SIGHUP reloads a gateway that does not poll, and that a
# config without the listener the gateway serves is refused.
# Usage: gateway_reload_e2e.sh <sluice_gateway binary> <gateway.yaml>
set -euo pipefail
gateway=$1
source "$(dirname "$0")/common.sh"

# limit_field URL: the X-RateLimit-Limit that URL answers with.
limit_field() {
  curl -s --max-time 15 -o /dev/null -D - "$1" | tr -d '\r' |
    sed -n 's/^[Xx]-[Rr]ate[Ll]imit-[Ll]imit: *//p'
}

# The example's login limit is 5 per minute: a spent login would get a request back within 8.6 to
# 10 s, less than a slow sanitizer run of this script can take. The copies limit logins per hour.
login_limit() { echo "rate_limit: { requests: $1, window_seconds: 3600 }"; }
copy_config() {
  sed "s/rate_limit: { requests: 5, window_seconds: 60 }/$(login_limit 5)/" "$1" >"$2"
  grep -qF "$(login_limit 5)" "$2" || { fail "the example's login limit changed: edit this test"; exit 1; }
}

reloads=sluice_engine_reloads_total
failed=sluice_engine_failed_reloads_total

# --- reload on file change (polled every 200 ms) ------------------------------------------------
copy_config "$2" "$work/polled.yaml"
start polled "$gateway" "$work/polled.yaml" --port 0 --reload-poll-ms 200
base="http://127.0.0.1:$started_port"

# /login allows 5 per hour for the route: spend them.
for i in 1 2 3 4 5; do expect "login $i" "$(code "$base/login")" 200; done
expect "login 6" "$(code "$base/login")" 429
expect "reloads at start" "$(metric "$base" $reloads)" 0

# An edit that leaves the login rule alone: reloaded, and the spent budget stays spent.
sed -i 's/requests_per: { minute: 3 }/requests_per: { minute: 4 }/' "$work/polled.yaml"
wait_metric "$base" $reloads 1 || fail "the edited file was not reloaded"
expect "login after an unrelated edit" "$(code "$base/login")" 429
grep -q "config reloaded: 8 rules, 7 kept their state" "$work/polled.err" ||
  fail "no reload line in the log: $(cat "$work/polled.err")"

# A broken file: the last good config keeps serving; the failure is counted and logged once.
cp "$work/polled.yaml" "$work/good.yaml"
printf 'policies:\n  - name: [broken\n' >"$work/polled.yaml"
wait_metric "$base" $failed 1 || fail "the broken file was not reported"
sleep 1 # five more polls of the same broken content
expect "failed reloads after more polls" "$(metric "$base" $failed)" 1
expect "reloads after the broken file" "$(metric "$base" $reloads)" 1
expect "login still limited" "$(code "$base/login")" 429
expect "items still served" "$(code "$base/v1/items")" 200
expect "failures logged" "$(grep -c "reload failed, the previous config keeps serving" "$work/polled.err")" 1

# A good file again, with the login limit raised: the rule keeps each key's spent share, so the
# spent login stays spent (no client gains room from a change), and its answer states the new limit.
sed "s/$(login_limit 5)/$(login_limit 6)/" "$work/good.yaml" >"$work/polled.yaml"
wait_metric "$base" $reloads 2 || fail "the repaired file was not reloaded"
expect "spent login under the raised limit" "$(code "$base/login")" 429
expect "the raised limit is answered" "$(limit_field "$base/login")" 6
metrics_body=$(curl -s --max-time 10 "$base/metrics")
grep -q '^# TYPE sluice_engine_reloads_total counter$' <<<"$metrics_body" ||
  fail "metrics lack the reload counter's TYPE line"

# --- reload on SIGHUP (no polling) --------------------------------------------------------------
copy_config "$2" "$work/signalled.yaml"
start signalled "$gateway" "$work/signalled.yaml" --port 0 --reload-poll-ms 0
hup_pid=$started_pid
hup="http://127.0.0.1:$started_port"
for i in 1 2 3 4 5; do expect "signalled login $i" "$(code "$hup/login")" 200; done
expect "signalled login 6" "$(code "$hup/login")" 429
sed -i "s/$(login_limit 5)/$(login_limit 7)/" "$work/signalled.yaml"
sleep 1
expect "no reload without a signal" "$(metric "$hup" $reloads)" 0
expect "login before the signal" "$(code "$hup/login")" 429
kill -HUP "$hup_pid"
wait_metric "$hup" $reloads 1 || fail "SIGHUP did not reload"
expect "spent login after the signal" "$(code "$hup/login")" 429
expect "the signalled limit is answered" "$(limit_field "$hup/login")" 7
kill -0 "$hup_pid" 2>/dev/null || fail "the gateway exited on SIGHUP"

# A config that renames the listener the gateway serves ("public", its first): refused, since the
# listener's limits would no longer apply to the gateway's requests; the running config serves on.
sed -i 's/name: public$/name: publik/; s/listener: public$/listener: publik/' "$work/signalled.yaml"
grep -q 'name: publik$' "$work/signalled.yaml" || fail "the example's listener changed: edit this test"
kill -HUP "$hup_pid"
wait_metric "$hup" $failed 1 || fail "a reload dropping the served listener was not refused"
expect "reloads after the renamed listener" "$(metric "$hup" $reloads)" 1
expect "login still limited after the refusal" "$(code "$hup/login")" 429
grep -q 'reload failed, the previous config keeps serving: .*: the config has no listener \\"public\\".*keep a listener named' \
  "$work/signalled.err" || fail "no refusal naming the fix in the log: $(cat "$work/signalled.err")"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed; polled gateway log:" >&2
  cat "$work/polled.err" >&2
  exit 1
fi
echo "gateway reload end-to-end: all checks passed"
