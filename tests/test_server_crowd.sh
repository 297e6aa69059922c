#!/usr/bin/env bash
# test_server_crowd.sh - continuous batching keeps output exact: a greedy
# request's text is the same alone or among 8 others, DFlash on and off
# (tests/server/crowd.py), on a server with 9 slots and a drafter; and a
# prompt sharing a prefix with a finished request copies it across slots,
# with the text of a cold run; and a --replay-tau server replays a recorded
# answer exactly, on the recording's cache (tests/server/replay.py).
set -uo pipefail
. "$(dirname "$0")/server/lib.sh"

need_tools
make_models
start_server "$WORK/server.log" -m "$WORK/target" --draft "$WORK/draft" -c 512 --parallel 9
SEEDS=${SEEDS:-4}
is_asan && SEEDS=1
SERVER_URL=$SERVER_URL SEEDS=$SEEDS DFLASH_BIN=$BIN TARGET=$WORK/target DRAFT=$WORK/draft timeout 900 "$PY" "$CLIENT_DIR/crowd.py" ||
  { tail -40 "$WORK/server.log"; die "crowd.py"; }
stop_server TERM
check_clean_exit "$WORK/server.log"

start_server "$WORK/replay.log" -m "$WORK/target" --draft "$WORK/draft" -c 512 --parallel 2 \
  --replay-tau 3
SERVER_URL=$SERVER_URL timeout 300 "$PY" "$CLIENT_DIR/replay.py" ||
  { tail -20 "$WORK/replay.log"; die "replay.py"; }
stop_server TERM
check_clean_exit "$WORK/replay.log"
echo "test_server_crowd: all passed"
