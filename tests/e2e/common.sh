# Shared by the gateway end-to-end tests (sourced): a work directory, background servers stopped
# by process id on exit, failure counting, and reading the gateway's Prometheus metrics.
# Requires: bash, curl.

work=$(mktemp -d)
server_pids=()
cleanup() {
  local pid
  for pid in "${server_pids[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
expect() { # expect WHAT ACTUAL EXPECTED
  [ "$2" == "$3" ] || fail "$1: expected '$3', got '$2'"
}

# start NAME PATTERN COMMAND...: runs COMMAND in the background (stdout in $work/NAME.out, stderr
# in $work/NAME.err) and waits up to 10 s for a stdout line "... http://127.0.0.1:<port>...";
# sets started_pid and started_port. Exits the test if the server does not come up.
start() {
  local name=$1
  shift
  : >"$work/$name.out" # before the server starts: the loop below reads it at once (set -e)
  "$@" >"$work/$name.out" 2>"$work/$name.err" &
  started_pid=$!
  server_pids+=("$started_pid")
  started_port=""
  for _ in $(seq 100); do
    started_port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/$name.out")
    [ -n "$started_port" ] && return 0
    kill -0 "$started_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "FAIL: $name did not start" >&2
  cat "$work/$name.out" "$work/$name.err" >&2
  exit 1
}

# code URL [curl args...]: the HTTP status of one GET (000 when no answer came).
code() {
  local url=$1
  shift
  curl -s --max-time 15 -o /dev/null -w '%{http_code}' "$@" "$url" || true
}

# metric BASE LINE_PREFIX: the value of the first sample of BASE/metrics whose text starts with
# LINE_PREFIX followed by a space ("" when there is none).
metric() {
  curl -s --max-time 10 "$1/metrics" | awk -v p="$2 " 'index($0, p) == 1 { print $NF; exit }'
}

# wait_metric BASE LINE_PREFIX VALUE: waits up to 10 s for the sample to equal VALUE; true if it
# did.
wait_metric() {
  for _ in $(seq 100); do
    [ "$(metric "$1" "$2")" == "$3" ] && return 0
    sleep 0.1
  done
  return 1
}
