#!/usr/bin/env bash
# test_server_choices.sh - `n > 1` on /v1/chat/completions and /v1/completions
# through the official openai client (tests/server/choices.py), on the small
# random Qwen3 target + DFlash drafter: two slots, so that of three choices two
# generate at once and one waits; choices.py ends with a SIGTERM mid-stream.
set -uo pipefail
. "$(dirname "$0")/server/lib.sh"

need_tools
make_models

$PY "$CLIENT_DIR/expect.py" "$BIN" "$WORK/target" "$WORK/draft" "$WORK/expect.json" ||
  die "dflash generate (expected outputs)"
start_server "$WORK/server.log" -m "$WORK/target" --draft "$WORK/draft" -c 512 --parallel 2 \
  --shutdown-grace 0.5
SERVER_URL=$SERVER_URL SERVER_PID=$SERVER_PID EXPECT="$WORK/expect.json" timeout 600 "$PY" \
  "$CLIENT_DIR/choices.py" || { tail -50 "$WORK/server.log"; die "choices.py"; }
stop_server TERM   # choices.py sent the first
check_clean_exit "$WORK/server.log"
echo "test_server_choices: all passed"
