# lib.sh - shared by tests/test_server*.sh: tool checks (the openai Python
# client in the project venv), a small random model pair, starting and
# stopping a server.
# Everything talks to 127.0.0.1 only and ends by itself (timeouts everywhere).

SRC=${DFLASH_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
BIN=${DFLASH_BIN:-$SRC/build/dflash}
SHARED=${DFLASH_SHARED:-$SRC/../shared}
CLIENT_DIR=$SRC/tests/server
PY=${DFLASH_PYTHON:-$SRC/build/venv/bin/python}
SERVER_PID=
WORK=$(mktemp -d /tmp/dflash-server-test.XXXXXX)
trap 'stop_server KILL; rm -rf "$WORK"' EXIT

say() { echo "[$(date +%H:%M:%S)] $*"; }
die() { echo "FAIL: $*" >&2; exit 1; }
# A missing tool or asset: a failure under CI=true, a skip otherwise.
missing() {
  if [ "${CI:-}" = true ]; then die "$*"; fi
  echo "SKIP: $*"
  exit 77  # ctest SKIP_RETURN_CODE
}

need_tools() {
  "$PY" -c "import openai" 2>/dev/null || missing "no openai Python package in $PY (scripts/deps.sh)"
  [ -x "$BIN" ] || die "no dflash binary at $BIN"
  "$BIN" serve --help >/dev/null 2>&1 || die "dflash serve is not in this build (libmicrohttpd-dev?)"
  [ -f "$SHARED/assets/tokenizers/qwen3/tokenizer.json" ] || missing "qwen3 tokenizer asset missing"
}

need_promtool() {
  command -v promtool >/dev/null || missing "promtool is not installed (Debian package prometheus)"
}

# A tiny random Qwen3 target with the real Qwen3 tokenizer, and a DFlash drafter for
# it; f32, which decodes faster here than bf16.
make_models() {
  say "making a random qwen3 target and drafter"
  $PY "$SRC/tools/make_checkpoint.py" --arch qwen3 --preset tiny --vocab 151936 --seed 11 --dtype f32 \
    --tokenizer "$SHARED/assets/tokenizers/qwen3/tokenizer.json" --out "$WORK/target" --quiet ||
    die "make_checkpoint (target)"
  $PY "$SRC/tools/make_checkpoint.py" --drafter --target "$WORK/target" --dtype f32 --out "$WORK/draft" --quiet ||
    die "make_checkpoint (drafter)"
}

# The binary was built with AddressSanitizer.
is_asan() { ldd "$BIN" 2>/dev/null | grep -q libasan; }

# start_server LOG ARGS...: starts `dflash serve --port 0 ARGS`, waits for
# /health, sets SERVER_PID and SERVER_URL.
start_server() {
  local log=$1; shift
  "$BIN" serve --host 127.0.0.1 --port 0 "$@" >"$log" 2>&1 &
  SERVER_PID=$!
  local port="" i
  for i in $(seq 1 600); do
    port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$log" | head -1)
    [ -n "$port" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$log"; die "the server exited at start"; }
    sleep 0.1
  done
  [ -n "$port" ] || { cat "$log"; die "the server did not report its port"; }
  SERVER_URL=http://127.0.0.1:$port
  for i in $(seq 1 1200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$SERVER_URL/health")" = 200 ] && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$log"; die "the server exited while loading"; }
    sleep 0.1
  done
  cat "$log"
  die "the server did not become healthy in 120 s"
}

# stop_server [SIG]: SIGTERM (default) and wait up to 60 s; sets SERVER_RC.
stop_server() {
  local sig=${1:-TERM} i
  SERVER_RC=
  [ -n "$SERVER_PID" ] || return 0
  kill -"$sig" "$SERVER_PID" 2>/dev/null
  for i in $(seq 1 600); do
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -KILL "$SERVER_PID" 2>/dev/null
    SERVER_RC=timeout
  fi
  wait "$SERVER_PID" 2>/dev/null
  local rc=$?
  [ -n "$SERVER_RC" ] || SERVER_RC=$rc
  SERVER_PID=
}

# check_clean_exit LOG [WHEN]: after stop_server TERM, the server exited 0, said
# it stopped, and (under ASan) reported nothing.
check_clean_exit() {
  local log=$1 when=${2:-on SIGTERM}
  [ "$SERVER_RC" = 0 ] || { tail -30 "$log"; die "the server exited with $SERVER_RC $when"; }
  grep -q "dflash serve: stopped" "$log" || { tail -30 "$log"; die "no clean stop in $log"; }
  ! grep -q "Sanitizer" "$log" || { cat "$log"; die "sanitizer report in $log"; }
}

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$SERVER_PID/status"; }
