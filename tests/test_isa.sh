#!/usr/bin/env bash
# test_isa.sh - the same tokens on every CPU: for each kernel path this CPU
# has (DFLASH_ISA=generic, avx2, avx512, neon) and each weight type, the raw logits
# of a 17-row block (`dflash dump`) are byte for byte those of the plain-C
# twins (generic), classic and speculative `dflash generate` print the same
# ids, and `dflash probe` finds the block and chain paths exact. A path the CPU
# lacks must be refused with a clear error and is reported as skipped (the
# test still checks the paths it has). Random untied Qwen3, dim 256 (whole
# K-quant blocks), ffn 768 (three 256-blocks: odd block counts).
# DFLASH_EXEC prefixes each dflash run (make check-arm: qemu-aarch64 for an
# aarch64 build).
set -u
BIN=${DFLASH_BIN:-build/dflash}
# shellcheck disable=SC2206
EXEC=(${DFLASH_EXEC:-})
SRC=${DFLASH_SRC:-.}
PY=${DFLASH_PYTHON:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build/venv/bin/python}
tmp=$(mktemp -d /tmp/dflash-test-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { if eval "$1"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $2" >&2; fi; }

$PY "$SRC/tools/make_checkpoint.py" --arch qwen3 --dim 256 --layers 2 --heads 4 --kv-heads 2 \
    --head-dim 64 --ffn 768 --vocab 512 --untied --dtype bf16 --quiet --out "$tmp/t" &&
$PY "$SRC/tools/make_checkpoint.py" --drafter --target "$tmp/t" --layers 1 --block-size 16 \
    --quiet --out "$tmp/d" || { echo "FAIL: could not make checkpoints" >&2; echo "0 passed, 1 failed"; exit 1; }

# the paths this CPU runs; the others must be refused, naming the CPU's best
isas=""
for isa in generic avx2 avx512 neon; do
    if DFLASH_ISA=$isa "${EXEC[@]}" "$BIN" dump -m "$tmp/t" --ids 1,2 --out "$tmp/probe.bin" 2>"$tmp/err"; then
        isas="$isas $isa"
    else
        check "grep -q 'cannot run it' '$tmp/err'" "DFLASH_ISA=$isa failed without saying why: $(cat "$tmp/err")"
        echo "skip: the $isa path (this CPU lacks it)"
    fi
done
DFLASH_ISA=sse9 "${EXEC[@]}" "$BIN" dump -m "$tmp/t" --ids 1,2 --out "$tmp/probe.bin" 2>"$tmp/err"
check "[ $? != 0 ] && grep -q 'not one of auto, generic, avx2, avx512, neon' '$tmp/err'" \
    "an unknown DFLASH_ISA is refused, naming the choices: $(cat "$tmp/err")"
echo "paths:$isas"

ids17=3,141,59,26,53,58,97,93,238,46,264,33,83,279,50,28,84
gen() { # isa dtype block -> the generated ids line
    DFLASH_ISA=$1 "${EXEC[@]}" "$BIN" generate -m "$tmp/t" --draft "$tmp/d" --dtype "$2" -p "hello there, how" \
        -n 40 -t 2 --ignore-eos --block-size "$3" --print-token-ids -q 2>&1 >/dev/null |
        grep '^generated ids'
}
for t in q8_0 q4_k q4_0 q4_1 q6_k bf16 f32; do
    for isa in $isas; do
        DFLASH_ISA=$isa "${EXEC[@]}" "$BIN" dump -m "$tmp/t" --dtype "$t" --ids $ids17 -t 2 \
            --out "$tmp/$isa.bin" 2>"$tmp/err"
        check "[ $? = 0 ]" "dump $t $isa: $(cat "$tmp/err")"
        check "cmp -s '$tmp/generic.bin' '$tmp/$isa.bin'" "$t: $isa logits differ from the twins'"
        for b in 1 16; do
            got=$(gen "$isa" "$t" "$b")
            [ "$isa" = generic ] && eval "ref_$b=\$got"
            eval "want=\$ref_$b"
            check "[ -n \"\$got\" ] && [ \"\$got\" = \"\$want\" ]" \
                "$t block $b: $isa ids differ from generic: $got / $want"
        done
        check "[ \"\$ref_1\" = \"\$ref_16\" ]" "$t $isa: speculative ids differ from classic"
    done
    for isa in $isas; do
        [ "$isa" = generic ] && continue
        out=$(DFLASH_ISA=$isa "${EXEC[@]}" "$BIN" probe -m "$tmp/t" --draft "$tmp/d" --dtype "$t" \
            --block-size 16 -n 8 -t 2 2>"$tmp/err")
        check "printf '%s' \"\$out\" | grep -q '\"exact\": true'" "probe $t $isa: not exact: $out $(cat "$tmp/err")"
    done
done
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
