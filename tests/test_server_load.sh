#!/usr/bin/env bash
# test_server_load.sh - a bounded load test of dflash serve on loopback:
# CLIENTS (8) concurrent streaming clients x REQUESTS (30) each through the openai
# client, a fifth of them hanging up at random moments. Every request
# completes or is cancelled cleanly, greedy answers agree under load, the
# server keeps no slot busy afterwards, /metrics adds up and passes promtool,
# RSS stays flat between two equal rounds, and SIGTERM in the middle of
# traffic still exits cleanly. Under an ASan build the scale is smaller and
# the RSS check is left out (the sanitizer's quarantine holds memory).
set -uo pipefail
. "$(dirname "$0")/server/lib.sh"

need_tools
need_promtool
make_models

CLIENTS=${CLIENTS:-8} REQUESTS=${REQUESTS:-30} MAX_TOKENS=${MAX_TOKENS:-8}
if is_asan; then CLIENTS=4 REQUESTS=10; say "ASan build: $CLIENTS clients x $REQUESTS requests"; fi
export MAX_TOKENS

start_server "$WORK/server.log" -m "$WORK/target" --draft "$WORK/draft" -c 512 --parallel 2
# The socket listens on the address given and no other.
port=${SERVER_URL##*:}
$PY - "$port" <<'PY' || die "the server listens beyond 127.0.0.1"
import sys
port = int(sys.argv[1])
found = []
for path in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(path).read().splitlines()[1:]:
        f = line.split()
        addr, p = f[1].split(":")
        if int(p, 16) == port and f[3] == "0A":
            found.append(addr)
sys.exit(0 if found == ["0100007F"] else f"listening sockets on port {port}: {found}")
PY

run_load() {   # name clients requests
  SERVER_URL=$SERVER_URL CLIENTS=$2 REQUESTS=$3 SEED=$RANDOM timeout 900 "$PY" "$CLIENT_DIR/load.py" \
    >"$WORK/$1.out" 2>&1
  local rc=$?
  cat "$WORK/$1.out"
  [ $rc = 0 ] || { tail -40 "$WORK/server.log"; die "load.py ($1)"; }
}

curl -sf "$SERVER_URL/metrics" >"$WORK/metrics0.txt" || die "GET /metrics"
# A warm-up round fills the allocator's arenas; then RSS must stay flat.
run_load warmup "$CLIENTS" "$(( (REQUESTS + 4) / 5 ))"
rss0=$(rss_kb)
run_load load "$CLIENTS" "$REQUESTS"
rss1=$(rss_kb)
say "RSS after warm-up $rss0 kB, after $(( CLIENTS * REQUESTS )) more requests $rss1 kB"
if ! is_asan; then
  # A leak of 10 kB per request would show.
  [ $(( rss1 - rss0 )) -lt 4096 ] || die "RSS grew by $(( rss1 - rss0 )) kB"
fi

curl -sf "$SERVER_URL/metrics" >"$WORK/metrics.txt" || die "GET /metrics"
promtool check metrics <"$WORK/metrics.txt" || die "promtool check metrics"
$PY - "$WORK/metrics0.txt" "$WORK/metrics.txt" "$WORK"/warmup.out "$WORK"/load.out <<'PY' || die "metrics do not add up"
import json, re, sys
def read(path):
    m = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        k, v = line.rsplit(" ", 1)
        m[k] = float(v)
    return m
m0, m = read(sys.argv[1]), read(sys.argv[2])
sent = done = 0
for path in sys.argv[3:]:
    for line in open(path):
        if line.startswith("LOAD "):
            fig = json.loads(line[5:])
            sent += fig["requests"]
            done += fig["completed"]
ok, cancelled = m['dflash_requests_total{result="ok"}'], m['dflash_requests_total{result="cancelled"}']
errors = m['dflash_requests_total{result="error"}'] + m['dflash_requests_total{result="rejected"}']
print(f"metrics: ok {ok:.0f} cancelled {cancelled:.0f} errors {errors:.0f}; clients sent {sent}, completed {done}")
# A client may hang up before its request reaches the server (then it is not
# counted) or after the answer is complete (then it counts as ok).
assert done <= ok and ok + cancelled <= sent, "counted at most once each"
c5 = 'dflash_http_responses_total{class="5xx"}'
assert errors == 0 and m[c5] == m0[c5], "no errors, no 5xx answers under load"
assert m["dflash_slots_busy"] == 0 and m["dflash_queue_depth"] == 0
assert m["dflash_spec_rounds_total"] > 0 and m["dflash_spec_proposed_total"] > 0
assert m["dflash_generated_tokens_total"] > 0
PY

# SIGTERM with requests in flight: running ones finish (or are cancelled after
# the grace period), the process exits 0 and stops listening.
SERVER_URL=$SERVER_URL CLIENTS=4 REQUESTS=1000 timeout 120 "$PY" "$CLIENT_DIR/load.py" >"$WORK/term.out" 2>&1 &
load_pid=$!
sleep 2
stop_server TERM
kill "$load_pid" 2>/dev/null; wait "$load_pid" 2>/dev/null
check_clean_exit "$WORK/server.log" "on SIGTERM under load"
curl -s -m 2 "$SERVER_URL/health" >/dev/null && die "still answering after exit"
echo "test_server_load: all passed"
