#!/usr/bin/env bash
# llamacpp_side_by_side.sh - dflash and llama.cpp on identical GGUF weights,
# same threads, measured in one run (ratios hold on a busy machine).
#
#   bench/llamacpp_side_by_side.sh LLAMA_CPP_BUILD_DIR [OUT_DIR]
#
# LLAMA_CPP_BUILD_DIR is a CPU build of llama.cpp made by hand from its public
# source (this script neither fetches nor builds it; nothing of llama.cpp is
# committed here); it needs bin/llama-bench and, for its DFlash mode,
# bin/llama-speculative-simple. Per pair (Qwen3-0.6B and Qwen3-1.7B shapes,
# random weights, tools/make_checkpoint.py; lagN: Laguna-XS-shaped with N
# layers, tools/make_laguna.py; q35d / q35m: 2B-class Qwen3.5 hybrids, dense
# and MoE, tools/make_qwen35.py) and weight type (Q8_0, BF16, Q4_K, ...):
#   - prefill and decode tok/s: llama-bench pp512 / tg128 / pp16 vs dflash
#     (prefill of the same length, a 128-token classic decode, a 16-row chunk);
#   - one-row decode GB/s against the read bandwidth measured by dflash bench;
#   - DFlash rounds at zero acceptance (a random drafter accepts nothing):
#     llama-speculative-simple --spec-type draft-dflash vs dflash generate,
#     ms per round at blocks 8 and 16, plus classic ms per token for both.
# Everything lands in OUT_DIR (default /tmp/dflash-side-by-side): the raw
# outputs, results.json (one record per number, with the command that made
# it) and a markdown summary on stdout. bench/plot.py draws results.json.
#
# Environment: THREADS (2), MODELS (/work/models/bench: made here when
# missing, which takes minutes), DFLASH (the dflash binary; default
# build/dflash beside this script), PAIRS ("q06 q17"), TYPES ("q8_0 bf16"),
# BLOCKS ("8 16"), N_GEN (128), N_PROMPT (512), REPS (3).
set -euo pipefail

LC=${1:?usage: $0 LLAMA_CPP_BUILD_DIR [OUT_DIR]}
OUT=${2:-/tmp/dflash-side-by-side}
HERE=$(cd "$(dirname "$0")/.." && pwd)
THREADS=${THREADS:-2}
MODELS=${MODELS:-/work/models/bench}
DFLASH=${DFLASH:-$HERE/build/dflash}
PAIRS=${PAIRS:-q06 q17}
TYPES=${TYPES:-q8_0 bf16}
BLOCKS=${BLOCKS:-8 16}
N_GEN=${N_GEN:-128}
N_PROMPT=${N_PROMPT:-512}
REPS=${REPS:-3}
PY=${DFLASH_PYTHON:-$HERE/build/venv/bin/python}  # the tools need the project venv
PROMPT="Write a long story about a lighthouse keeper who finds a message in a bottle."

LB=$LC/bin/llama-bench
LS=$LC/bin/llama-speculative-simple
[ -x "$LB" ] || { echo "no $LB (build llama.cpp's llama-bench first)" >&2; exit 2; }
[ -x "$DFLASH" ] || { echo "no dflash binary at $DFLASH (set DFLASH=...)" >&2; exit 2; }
mkdir -p "$OUT" "$MODELS"
RES=$OUT/results.json
: >"$RES.lines"

say() { echo "== $*" >&2; }
# record ENGINE PAIR TYPE METRIC VALUE COMMAND
record() {
  $PY -c 'import json,sys; print(json.dumps(dict(zip(["engine","pair","type","metric","value","cmd"], sys.argv[1:5] + [float(sys.argv[5]), sys.argv[6]]))))' \
    "$@" >>"$RES.lines"
}

# ---- models (our own tools; nothing downloaded) ---------------------------------
preset() { case $1 in q06) echo qwen3-0.6b ;; q17) echo qwen3-1.7b ;; *) echo "$1" ;; esac; }
# 0 when every requested type of pair $1 is there (the bf16 GGUF they come from may be gone)
have_types() {
  local t
  [ -f "$1-bf16.gguf" ] && return 0
  for t in $TYPES; do [ -f "$1-$t.gguf" ] || return 1; done
}
make_models() {
  local p=$1 t tok=${DFLASH_SHARED:-$HERE/../shared}/assets/tokenizers/qwen3/tokenizer.json
  cd "$MODELS"
  case $p in
  lag*) # Laguna-XS-shaped, lagN: N layers (tools/make_laguna.py); no drafter pair yet
    [ -d "$p" ] || $PY "$HERE/tools/make_laguna.py" --tokenizer "$tok" --out "$p" --layers "${p#lag}"
    have_types "$p" || $PY "$HERE/tools/laguna_to_gguf.py" "$p" "$p-bf16.gguf" ;;
  q35d|q35m) # Qwen3.5 hybrids (gated DeltaNet 3:1 gated attention), with a DFlash drafter
    [ -d "$p" ] || $PY "$HERE/tools/make_qwen35.py" --tokenizer "$tok" --out "$p" $([ "$p" = q35m ] && echo --moe)
    # (the MoE config has no dense FFN width: the drafter takes the dense variant's)
    [ -d "$p-dflash" ] || $PY "$HERE/tools/make_checkpoint.py" --drafter --target "$p" --ffn 6144 --block-size 16 --out "$p-dflash"
    have_types "$p" || $PY "$HERE/tools/hybrid_to_gguf.py" "$p" "$p-bf16.gguf"
    [ -f "$p-dflash-q8_0.gguf" ] || [ -f "$p-dflash-bf16.gguf" ] || $PY "$HERE/tools/drafter_to_gguf.py" "$p-dflash" "$p" "$p-dflash-bf16.gguf"
    [ -f "$p-dflash-q8_0.gguf" ] || "$DFLASH" quantize -m "$p-dflash-bf16.gguf" -o "$p-dflash-q8_0.gguf" --type q8_0 ;;
  *)
    [ -d "$p" ] || $PY "$HERE/tools/make_checkpoint.py" --preset "$(preset "$p")" --tokenizer "$tok" --out "$p"
    [ -d "$p-dflash" ] || $PY "$HERE/tools/make_checkpoint.py" --drafter --target "$p" --block-size 16 --out "$p-dflash"
    have_types "$p" || $PY "$HERE/tools/hf_to_gguf.py" "$p" "$p-bf16.gguf"
    [ -f "$p-dflash-q8_0.gguf" ] || [ -f "$p-dflash-bf16.gguf" ] || $PY "$HERE/tools/drafter_to_gguf.py" "$p-dflash" "$p" "$p-dflash-bf16.gguf"
    [ -f "$p-dflash-q8_0.gguf" ] || "$DFLASH" quantize -m "$p-dflash-bf16.gguf" -o "$p-dflash-q8_0.gguf" --type q8_0 ;;
  esac
  for t in $TYPES; do
    [ "$t" = bf16 ] || [ -f "$p-$t.gguf" ] ||
      "$DFLASH" quantize -m "$p-bf16.gguf" -o "$p-$t.gguf" --type "$t" --quantize-embeddings
  done
  cd - >/dev/null
}

# ---- llama.cpp --------------------------------------------------------------------
lc_bench() { # pair type
  local m=$MODELS/$1-$2.gguf f=$OUT/llama-bench-$1-$2.json
  local cmd="$LB -m $m -t $THREADS -p $N_PROMPT,16 -n $N_GEN -r $REPS -o json"
  say "$cmd"
  $cmd >"$f" 2>"$f.err" || { echo "llama-bench failed, see $f.err" >&2; return 0; }
  $PY - "$f" "$1" "$2" "$cmd" "$RES.lines" <<'EOF'
import json, sys
f, pair, typ, cmd, out = sys.argv[1:]
with open(out, "a") as o:
    for r in json.load(open(f)):
        if r["n_gen"]:
            metric = "decode_tok_s"
        else:
            metric = "prefill16_tok_s" if r["n_prompt"] == 16 else "prefill_tok_s"
        # the best repetition, as dflash bench keeps the best (the mean is kept too)
        best = max(r.get("samples_ts") or [r["avg_ts"]])
        for m, v in ((metric, best), (metric + "_mean", r["avg_ts"])):
            o.write(json.dumps(dict(engine="llama.cpp", pair=pair, type=typ, metric=m,
                                    value=v, cmd=cmd)) + "\n")
EOF
}

lc_dflash() { # pair type block
  [ -x "$LS" ] || return 0
  local m=$MODELS/$1-$2.gguf d=$MODELS/$1-dflash-$2.gguf f=$OUT/llama-dflash-$1-$2-b$3.txt
  local cmd=("$LS" -m "$m" -md "$d" --spec-type draft-dflash --spec-draft-n-max $(($3 - 1))
             -t "$THREADS" -td "$THREADS" -c 2048 -n "$N_GEN" --temp 0 --top-k 1 -p "$PROMPT")
  say "${cmd[*]}"
  if ! "${cmd[@]}" >"$f" 2>&1; then echo "llama.cpp DFlash failed (see $f)" >&2; return 0; fi
  $PY - "$f" "$1" "$2" "$3" "${cmd[*]}" "$RES.lines" <<'EOF'
import json, re, sys
f, pair, typ, block, cmd, out = sys.argv[1:]
t = open(f, errors="replace").read()
m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", t)
acc = re.search(r"n_accept\s*=\s*(\d+)", t)
if m and acc:
    n, sec, a = int(m.group(1)), float(m.group(2)), int(acc.group(1))
    rounds = max(1, n - a)   # each round commits its accepted drafts + 1
    with open(out, "a") as o:
        for metric, v in (("spec_ms_per_round_b" + block, 1e3 * sec / rounds),
                          ("spec_tok_s_b" + block, n / sec), ("spec_accepted_b" + block, a)):
            o.write(json.dumps(dict(engine="llama.cpp", pair=pair, type=typ, metric=metric,
                                    value=v, cmd=cmd)) + "\n")
EOF
}

# ---- dflash -------------------------------------------------------------------------
df_bench() { # pair type: machine, decode, verify (B = 1..16), 512-token prefill
  local m=$MODELS/$1-$2.gguf j=$OUT/dflash-bench-$1-$2.json
  local cmd="$DFLASH bench -m $m -t $THREADS --sections machine,decode,verify,ctx --ctx $N_PROMPT --ttft-max $N_PROMPT --reps $REPS --json $j"
  say "$cmd"
  $cmd >"$OUT/dflash-bench-$1-$2.txt" 2>"$OUT/dflash-bench-$1-$2.err"
  $PY - "$j" "$1" "$2" "$cmd" "$RES.lines" "$N_PROMPT" <<'EOF'
import json, sys
f, pair, typ, cmd, out, n = sys.argv[1:]
j = json.load(open(f))
d, v, c = j["decode"][0], j["verify"][0], j["ctx"][0]
recs = [("read_gbs", j["machine"]["read_gbs"]), ("fma_gflops", j["machine"]["fma_gflops"]),
        ("decode1_tok_s", d["tok_s"]), ("decode1_gbs", d["gbs"]),
        ("decode1_frac_bw", d["frac_of_bw"]),
        ("prefill_tok_s", int(n) / c["ttft_s"]),
        ("prefill16_tok_s", 16e3 / v["rows16_nologits_ms"])]
recs += [(f"verify_ratio_b{r['B']}", r["ratio"]) for r in v["rows"]]
recs += [(f"roofline_ratio_b{r['B']}", r["roofline_ratio"]) for r in v["rows"]]
with open(out, "a") as o:
    for metric, val in recs:
        o.write(json.dumps(dict(engine="dflash", pair=pair, type=typ, metric=metric, value=val,
                                cmd=cmd)) + "\n")
EOF
}

df_generate() { # pair type block(1 = classic)
  local m=$MODELS/$1-$2.gguf d=$MODELS/$1-dflash-$2.gguf s=$OUT/dflash-gen-$1-$2-b$3.json
  local cmd=("$DFLASH" generate -m "$m" -t "$THREADS" -c 2048 -n "$N_GEN" --ignore-eos -q
             --block-size "$3" --stats-json "$s" -p "$PROMPT")
  [ "$3" -gt 1 ] && cmd+=(--draft "$d")
  say "${cmd[*]}"
  # classic decode: the best of REPS runs, as llama-bench's best repetition is kept
  local reps=1 i
  [ "$3" = 1 ] && reps=$REPS
  for i in $(seq "$reps"); do
    "${cmd[@]}" >/dev/null 2>"$s.err" || { echo "dflash generate failed (see $s.err)" >&2; return 0; }
    cp "$s" "$s.$i"
  done
  $PY - "$s" "$1" "$2" "$3" "${cmd[*]}" "$RES.lines" "$reps" <<'EOF'
import json, sys
f, pair, typ, block, cmd, out, reps = sys.argv[1:]
runs = [json.load(open(f"{f}.{i}")) for i in range(1, int(reps) + 1)]
s = max(runs, key=lambda r: r["decode_tok_s"])
if block == "1":
    recs = [("decode_tok_s", s["decode_tok_s"])]
else:
    rounds = max(1, s["rounds"] + s["classic_steps"])
    recs = [("spec_ms_per_round_b" + block, 1e3 * s["t_decode"] / rounds),
            ("spec_tok_s_b" + block, s["decode_tok_s"]), ("spec_accepted_b" + block, s["accepted"])]
with open(out, "a") as o:
    for metric, v in recs:
        o.write(json.dumps(dict(engine="dflash", pair=pair, type=typ, metric=metric, value=v,
                                cmd=cmd)) + "\n")
EOF
}

# ---- run: engines interleaved per pair and type ---------------------------------------
"$LB" --help >/dev/null 2>&1 || true
say "llama.cpp: $LC; dflash: $DFLASH ($(cd "$HERE" && git rev-parse --short HEAD 2>/dev/null || echo ?)); threads $THREADS"
for p in $PAIRS; do
  make_models "$p"
  for t in $TYPES; do
    lc_bench "$p" "$t"
    df_bench "$p" "$t"
    df_generate "$p" "$t" 1
    [ -f "$MODELS/$p-dflash-$t.gguf" ] || continue   # no drafter for this pair
    for b in $BLOCKS; do
      lc_dflash "$p" "$t" "$b"
      df_generate "$p" "$t" "$b"
    done
  done
done

$PY - "$RES.lines" "$RES" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
json.dump(recs, open(sys.argv[2], "w"), indent=1)
val = {(r["engine"], r["pair"], r["type"], r["metric"]): r["value"] for r in recs}
pairs = sorted({(r["pair"], r["type"]) for r in recs})
def g(e, p, t, m):
    v = val.get((e, p, t, m))
    return "-" if v is None else f"{v:.2f}"
def ratio(p, t, m, m2=None):
    a, b = val.get(("dflash", p, t, m)), val.get(("llama.cpp", p, t, m2 or m))
    return "-" if a is None or not b else f"{a / b:.2f}"
print("| pair | type | decode tok/s dflash | llama.cpp | ratio | prefill tok/s dflash | llama.cpp | ratio | 16-row tok/s dflash | llama.cpp | ratio | 1-row GB/s | of read bw |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for p, t in pairs:
    print(f"| {p} | {t} | {g('dflash',p,t,'decode_tok_s')} | {g('llama.cpp',p,t,'decode_tok_s')} | "
          f"{ratio(p,t,'decode_tok_s')} | {g('dflash',p,t,'prefill_tok_s')} | "
          f"{g('llama.cpp',p,t,'prefill_tok_s')} | {ratio(p,t,'prefill_tok_s')} | "
          f"{g('dflash',p,t,'prefill16_tok_s')} | {g('llama.cpp',p,t,'prefill16_tok_s')} | "
          f"{ratio(p,t,'prefill16_tok_s')} | {g('dflash',p,t,'decode1_gbs')} | "
          f"{g('dflash',p,t,'decode1_frac_bw')} |")
print()
print("| pair | type | block | ms/round dflash | llama.cpp | dflash / llama.cpp | accepted dflash | llama.cpp |")
print("|---|---|---|---|---|---|---|---|")
for p, t in pairs:
    for b in sorted({int(r["metric"].rsplit("b", 1)[1]) for r in recs if r["metric"].startswith("spec_ms")}):
        m = f"spec_ms_per_round_b{b}"
        print(f"| {p} | {t} | {b} | {g('dflash',p,t,m)} | {g('llama.cpp',p,t,m)} | {ratio(p,t,m)} | "
              f"{g('dflash',p,t,f'spec_accepted_b{b}')} | {g('llama.cpp',p,t,f'spec_accepted_b{b}')} |")
EOF
rm -f "$RES.lines"
say "results: $RES (plot: /usr/bin/python3 bench/plot.py $RES docs/benchmarks.png)"
