#!/usr/bin/env bash
# test_ngram_cli.sh - the n-gram lane through the CLI on the built-in default
# pair: `dflash probe --ngram` (alone and with the drafter) proves the lane
# exact -- greedy and exact-rule sampled output equal to classic -- on a prompt
# that repeats, with drafts accepted; `dflash generate --ngram` prints classic's
# ids and reports the lane in its stats line and --stats-json.
set -u
BIN=${DFLASH_BIN:-build/dflash}
SRC=${DFLASH_SRC:-.}
tmp=$(mktemp -d /tmp/dflash-test-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { if eval "$1"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $2" >&2; fi; }
P="The cat sat on the mat. The dog sat on the log. The cat sat on the mat. The dog sat on the log. The cat sat on"
M="$SRC/models/default/target"
D="$SRC/models/default/draft"

for draft in none "$D"; do
    out=$("$BIN" probe -m "$M" --draft "$draft" --ngram -n 96 -t 2 -p "$P" 2>"$tmp/err")
    rc=$?
    check "[ $rc = 0 ]" "probe --ngram (draft $draft) exits $rc: $(cat "$tmp/err")"
    check "printf '%s' \"\$out\" | grep -q '\"greedy_equal\": true, \"sampled_equal\": true'" \
        "probe --ngram (draft $draft): not equal to classic: $out"
    acc=$(printf '%s' "$out" | grep -o '"ngram": {[^}]*"accepted": [0-9]*' | grep -o '[0-9]*$')
    check "[ \"\${acc:-0}\" -gt 0 ]" "probe --ngram (draft $draft): the lane accepted nothing: $out"
done

ids() { # generated ids of one run: extra flags
    "$BIN" generate -m "$M" -p "$P" -n 80 -t 2 --ignore-eos --print-token-ids -q "$@" 2>&1 \
        >/dev/null | grep '^generated ids'
}
ref=$(ids --draft none --block-size 1)
check "[ -n \"\$ref\" ]" "generate: no ids"
for args in "--draft none --ngram" "--draft none --ngram --block-size 6" "--draft $D --ngram"; do
    got=$(ids $args)
    check "[ \"\$got\" = \"\$ref\" ]" "generate $args differs from classic"
done
"$BIN" generate -m "$M" --draft none --ngram -p "$P" -n 80 -t 2 --ignore-eos \
    --stats-json "$tmp/st.json" >/dev/null 2>"$tmp/err"
check "grep -q '^lane ngram: [1-9][0-9]* rounds' \"$tmp/err\"" "generate --ngram: no lane line: $(cat "$tmp/err")"
check "grep -q '\"ngram\": {\"rounds\": [1-9]' \"$tmp/st.json\"" "stats json: no lane: $(cat "$tmp/st.json")"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
