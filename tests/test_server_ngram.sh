#!/usr/bin/env bash
# test_server_ngram.sh - dflash serve --ngram on the built-in default model (no
# drafter): a greedy completion whose prompt repeats is drafted by the n-gram
# lane (the response's "dflash".lanes.ngram counts its rounds) and equals the
# same request decoded classically (block_size 1); /metrics shows the lane in
# dflash_lane_*_total{lane="ngram"} (checked by promtool when installed).
set -uo pipefail
. "$(dirname "$0")/server/lib.sh"

[ -x "$BIN" ] || die "no dflash binary at $BIN"
"$BIN" serve --help >/dev/null 2>&1 || missing "dflash serve is not in this build (libmicrohttpd-dev?)"
start_server "$WORK/server.log" -m "$SRC/models/default/target" --ngram -t 2

P="The cat sat on the mat. The dog sat on the log. The cat sat on the mat. The dog sat on the log. The cat sat on"
ask() { # block_size -> the response JSON
  curl -sf "$SERVER_URL/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"$P\", \"max_tokens\": 80, \"temperature\": 0, \"ignore_eos\": true, \"block_size\": $1}"
}
spec=$(ask 0) || die "completion (adaptive)"
classic=$(ask 1) || die "completion (classic)"
field() { "$PY" -c "import json,sys; d=json.loads(sys.argv[1]); print($2)" "$1"; }
[ "$(field "$spec" "d['choices'][0]['text']")" = "$(field "$classic" "d['choices'][0]['text']")" ] ||
  die "the lane's text differs from classic: $spec / $classic"
rounds=$(field "$spec" "d['dflash']['lanes']['ngram']['rounds']")
acc=$(field "$spec" "d['dflash']['lanes']['ngram']['accepted']")
[ "$rounds" -gt 0 ] && [ "$acc" -gt 0 ] || die "the n-gram lane did not draft: $spec"
[ "$(field "$spec" "d['dflash']['lanes']['drafter']['rounds']")" = 0 ] || die "drafter rounds without a drafter"

curl -sf "$SERVER_URL/metrics" >"$WORK/metrics.txt" || die "GET /metrics"
got=$(sed -n 's/^dflash_lane_rounds_total{lane="ngram"} \([0-9]*\)$/\1/p' "$WORK/metrics.txt")
[ "${got:-0}" -ge "$rounds" ] || die "metrics: lane rounds ${got:-none} < $rounds: $(grep lane "$WORK/metrics.txt")"
grep -q '^dflash_lane_accepted_total{lane="drafter"} 0$' "$WORK/metrics.txt" || die "metrics: no drafter lane line"
if command -v promtool >/dev/null; then
  promtool check metrics <"$WORK/metrics.txt" || die "promtool check metrics"
fi
stop_server
[ "$SERVER_RC" = 0 ] || die "server exit status $SERVER_RC"
say "ok"
