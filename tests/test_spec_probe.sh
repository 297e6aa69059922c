#!/usr/bin/env bash
# test_spec_probe.sh - `dflash probe` and `dflash generate --draft` through the
# CLI, for every weight type the engine converts to: the probe must find 0
# differing logit bytes at every block size up to 16 (batch-invariant kernels),
# and speculative decoding (pinned and adaptive blocks) must print the same
# token ids as classic decode. The target is a random untied Qwen3 (dim 256 so
# the K-quants' 256-wide blocks fit) with a random z-lab drafter.
set -u
BIN=${DFLASH_BIN:-build/dflash}
SRC=${DFLASH_SRC:-.}
PY=${DFLASH_PYTHON:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build/venv/bin/python}
tmp=$(mktemp -d /tmp/dflash-test-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { if eval "$1"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $2" >&2; fi; }

$PY "$SRC/tools/make_checkpoint.py" --arch qwen3 --dim 256 --layers 2 --heads 4 --kv-heads 2 \
    --head-dim 64 --ffn 512 --vocab 512 --untied --dtype bf16 --quiet --out "$tmp/t" &&
$PY "$SRC/tools/make_checkpoint.py" --drafter --target "$tmp/t" --layers 1 --block-size 16 \
    --quiet --out "$tmp/d" || { echo "FAIL: could not make checkpoints" >&2; echo "0 passed, 1 failed"; exit 1; }

ids() { # generated ids of one run
    "$BIN" generate -m "$tmp/t" --draft "$tmp/d" --dtype "$1" -p "hello there, how" -n 60 -t 2 \
        --ignore-eos --block-size "$2" --print-token-ids -q 2>&1 >/dev/null | grep '^generated ids'
}

for t in f32 f16 bf16 q8_0 q4_0 q4_1 q4_k q6_k; do
    out=$("$BIN" probe -m "$tmp/t" --draft "$tmp/d" --dtype "$t" --block-size 16 -n 24 -t 2 2>"$tmp/err")
    rc=$?
    check "[ $rc = 0 ]" "probe $t exits $rc: $(cat "$tmp/err")"
    # every size 2..16 and the totals: no differing byte, logits nor features
    nz=$(printf '%s' "$out" | grep -o '"bytes_differ": [0-9]*' | grep -vc '": 0$')
    check "[ \"$nz\" = 0 ]" "probe $t: differing bytes: $out"
    check "printf '%s' \"\$out\" | grep -q '\"exact\": true'" "probe $t: not exact"
    check "printf '%s' \"\$out\" | grep -q '\"drafter\": {\"block\": 16, \"anchors\": 24'" "probe $t: no drafter report"
    ref=$(ids "$t" 1)
    check "[ -n \"\$ref\" ]" "generate $t: no ids"
    for b in 4 16 auto; do
        got=$(ids "$t" "$b")
        check "[ \"\$got\" = \"\$ref\" ]" "generate $t --block-size $b differs from classic"
    done
done
# The drafter diagnostic's chained rounds are exactly the rounds a pinned run
# makes (same drafts at the same anchors, shrunk blocks redone at the end).
chain() { # target drafter block n prompt -> "rounds committed" from probe and from generate
    local p l
    p=$("$BIN" probe -m "$1" --draft "$2" --block-size "$3" -n "$4" -p "$5" -t 2 2>/dev/null |
        grep -o '"rounds": [0-9]*, "committed": [0-9]*' | grep -o '[0-9]*' | tr '\n' ' ')
    "$BIN" generate -m "$1" --draft "$2" -p "$5" -n "$4" --ignore-eos -t 2 --block-size "$3" -q \
        --stats-json "$tmp/st.json" >/dev/null 2>&1
    # the totals come first; "lanes" repeats the keys per lane after them
    l=$(grep -o '"rounds": [0-9]*\|"committed": [0-9]*' "$tmp/st.json" | head -2 | grep -o '[0-9]*' | tr '\n' ' ')
    check "[ -n \"\$p\" ] && [ \"\$p\" = \"\$l\" ]" "chain $3/$4 on $(basename "$1"): probe {$p} generate {$l}"
}
chain "$tmp/t" "$tmp/d" 8 40 "hello there, how"
# with a trained drafter (committed under models/) the rounds accept real tokens
stories=${DFLASH_SHARED:-$SRC/../shared}/assets/stories260K/stories260K.gguf
if [ -d "$SRC/models/stories260K-dflash" ] && [ -f "$stories" ]; then
    for b in 4 8; do
        for n in 37 150; do chain "$stories" "$SRC/models/stories260K-dflash" $b $n "Tom and Sue went"; done
    done
fi

# a block larger than the rows the engine was sized for is refused, not crashed
"$BIN" probe -m "$tmp/t" --draft none --block-size 600 >/dev/null 2>&1
check "[ $? = 2 ]" "probe --block-size 600 should be a usage error"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
