#!/usr/bin/env bash
# test_server.sh - dflash serve end to end through the official openai Python
# client, on a small random Qwen3 target + DFlash drafter: chat and
# completions, streaming and not, stop strings, usage, logprobs; greedy output
# equals `dflash generate` with and without the drafter; every documented 4xx
# error; the API key; /metrics through promtool; a clean SIGTERM exit; 503
# when the queue is full; SIGTERM with requests queued and running.
set -uo pipefail
. "$(dirname "$0")/server/lib.sh"

need_tools
need_promtool
make_models

KEY=test-key-$$
for mode in draft none; do
  say "=== server with drafter: $mode"
  $PY "$CLIENT_DIR/expect.py" "$BIN" "$WORK/target" \
    "$([ $mode = draft ] && echo "$WORK/draft" || echo none)" "$WORK/expect-$mode.json" ||
    die "dflash generate (expected outputs)"
  args=(-m "$WORK/target" -c 512 --parallel 2 --max-body 1048576)
  [ $mode = draft ] && args+=(--draft "$WORK/draft" --api-key "$KEY" --cors https://page.example)
  # (--mmap: the server's default copies small weights into memory; the other mode reads them in place)
  lenient=""; [ $mode = none ] && { args+=(--lenient --mmap); lenient=1; }
  start_server "$WORK/server-$mode.log" "${args[@]}"
  key=""; [ $mode = draft ] && key=$KEY
  SERVER_URL=$SERVER_URL SERVER_API_KEY=$key EXPECT="$WORK/expect-$mode.json" MAX_BODY=1048576 LENIENT=$lenient \
    timeout 600 "$PY" "$CLIENT_DIR/api.py" || { tail -50 "$WORK/server-$mode.log"; die "api.py ($mode)"; }
  # CORS: with --cors, a preflight gets 204 and the origin; every response names it; off by default
  pre=$(curl -s -i -X OPTIONS "$SERVER_URL/v1/chat/completions" -H "Origin: https://page.example" \
        -H "Access-Control-Request-Method: POST" | tr -d '\r')
  got=$(curl -s -i -H "Authorization: Bearer $key" "$SERVER_URL/v1/models" | tr -d '\r')
  if [ $mode = draft ]; then
    grep -q "^HTTP/1.1 204" <<<"$pre" && grep -qi "^access-control-allow-origin: https://page.example" <<<"$pre" &&
      grep -qi "^access-control-allow-methods: POST" <<<"$pre" || die "CORS preflight: $pre"
    grep -qi "^access-control-allow-origin: https://page.example" <<<"$got" || die "no CORS header: $got"
    # the drafter's kind: in /v1/models, /props and the ready line
    grep -q '"draft_kind":"DFlash"' <<<"$got" || die "/v1/models: no draft_kind DFlash: $got"
    curl -s -H "Authorization: Bearer $key" "$SERVER_URL/props" | grep -q '"drafter_kind":"DFlash"' ||
      die "/props: no drafter_kind DFlash"
    grep -q "ready: .*, DFlash drafter, " "$WORK/server-$mode.log" || die "ready line without the drafter's kind"
    grep -q "ready: .*, weights in memory), " "$WORK/server-$mode.log" ||
      die "the default did not copy a small model's weights into memory"
  else
    grep -q "ready: .*, weights read in place), " "$WORK/server-$mode.log" || die "--mmap copied the weights"
    grep -q '"draft_kind":""' <<<"$got" || die "/v1/models: draft_kind not empty without a drafter: $got"
    grep -q "^HTTP/1.1 405" <<<"$pre" && ! grep -qi "^access-control" <<<"$pre$got" ||
      die "CORS is on without --cors: $pre"
  fi
  curl -sf -H "Authorization: Bearer $key" "$SERVER_URL/metrics" >"$WORK/metrics-$mode.txt" ||
    die "GET /metrics"
  promtool check metrics <"$WORK/metrics-$mode.txt" || die "promtool check metrics ($mode)"
  stop_server TERM
  check_clean_exit "$WORK/server-$mode.log"
done

say "=== a full server: 503 when the queue is full; SIGTERM refuses the queued, cancels the running"
start_server "$WORK/server-busy.log" -m "$WORK/target" -c 2048 --parallel 1 --queue 1 --shutdown-grace 1
SERVER_URL=$SERVER_URL SERVER_PID=$SERVER_PID timeout 300 "$PY" "$CLIENT_DIR/busy.py" ||
  { tail -30 "$WORK/server-busy.log"; die "busy.py"; }
stop_server TERM
[ "$SERVER_RC" = 0 ] || { tail -30 "$WORK/server-busy.log"; die "exit status $SERVER_RC after SIGTERM with work in flight"; }
grep -q "dflash serve: stopped" "$WORK/server-busy.log" || die "no clean stop in the log"
echo "test_server: all passed"
