#!/usr/bin/env bash
# mtp_vs_dflash.sh - the two draft lanes on one Qwen3.5 target: its native MTP
# head (--draft-mtp) against a DFlash drafter, each through `dflash bench
# --sections spec` with the replay drafter, so both run at the same
# acceptance (tau, flat per position over 15 draft positions: the DFlash
# drafter's block 16 and the MTP lane's default max block 16) and what differs
# is what a round costs: one DFlash block forward against k one-row MTP steps
# plus the re-fusion of the committed rows.
#
#   bench/mtp_vs_dflash.sh [OUT_DIR]
#
# The target is random, Qwen3.5-shaped (transformers' Qwen3_5TextConfig: DeltaNet
# and gated attention 3:1, every 4th layer full), written by transformers; the
# head is tools/add_mtp.py's, the drafter tools/make_checkpoint.py's (z-lab
# layout). Environment: THREADS (2), DIM (512), LAYERS (8), FFN (1536),
# VOCAB (32000), DRAFT_LAYERS (1), TAUS (1,3,6.5), BLOCKS (4,8), N_GEN (64),
# DTYPE (bf16).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-/tmp/dflash-mtp-vs-dflash}
PY=${DFLASH_PYTHON:-$here/build/venv/bin/python}
BIN=${DFLASH:-$here/build/dflash}
THREADS=${THREADS:-2} DIM=${DIM:-512} LAYERS=${LAYERS:-8} FFN=${FFN:-1536}
VOCAB=${VOCAB:-32000} DRAFT_LAYERS=${DRAFT_LAYERS:-1} TAUS=${TAUS:-1,3,6.5}
BLOCKS=${BLOCKS:-4,8} N_GEN=${N_GEN:-64} DTYPE=${DTYPE:-bf16}
mkdir -p "$OUT"
T="$OUT/q35-d$DIM-l$LAYERS"

if [ ! -f "$T/mtp.safetensors" ]; then
  "$PY" - "$T" "$DIM" "$LAYERS" "$FFN" "$VOCAB" "$DTYPE" <<'PYEOF'
import sys, torch, transformers
out, dim, layers, ffn, vocab, dt = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]
torch.manual_seed(0)
cfg = transformers.Qwen3_5TextConfig(
    hidden_size=dim, intermediate_size=ffn, num_hidden_layers=layers, vocab_size=vocab,
    num_attention_heads=dim // 64, num_key_value_heads=2, head_dim=128,
    linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=dim // 128,
    linear_num_value_heads=dim // 64, max_position_embeddings=4096, tie_word_embeddings=False)
m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
m.to({"bf16": torch.bfloat16, "f32": torch.float32}[dt]).save_pretrained(out)
PYEOF
  "$PY" "$here/tools/add_mtp.py" "$T"
fi
D="$T-dflash$DRAFT_LAYERS"
[ -d "$D" ] || "$PY" "$here/tools/make_checkpoint.py" --drafter --target "$T" \
  --layers "$DRAFT_LAYERS" --block-size 16 --quiet --out "$D"

common=(-t "$THREADS" --sections spec --tau "$TAUS" --blocks "$BLOCKS" -n "$N_GEN")
echo "MTP lane:    $BIN bench -m $T --draft-mtp ${common[*]}"
"$BIN" bench -m "$T" --draft-mtp "${common[@]}" --json "$OUT/mtp.json" >"$OUT/mtp.txt" 2>"$OUT/mtp.err"
echo "DFlash lane: $BIN bench -m $T --draft $D ${common[*]}"
"$BIN" bench -m "$T" --draft "$D" "${common[@]}" --json "$OUT/dflash.json" >"$OUT/dflash.txt" \
  2>"$OUT/dflash.err"

"$PY" - "$OUT/mtp.json" "$OUT/dflash.json" <<'PYEOF'
import json, sys
lanes = [("MTP", json.load(open(sys.argv[1]))), ("DFlash", json.load(open(sys.argv[2])))]
print("| tau | mode | lane | tok/s | x classic | ms/forward | draft ms/round | beyond verify "
      "| accepted/round | = classic |")
print("|---|---|---|---|---|---|---|---|---|---|")
rows = {}
for lane, j in lanes:
    for r in j["spec"]["runs"]:
        rows.setdefault((r["tau"], r["mode"]), []).append((lane, r))
for (tau, mode), rs in rows.items():
    for lane, r in rs:
        ms = r["ms_per_forward"]
        dms = 1e3 * r["t_draft"] / r["rounds"] if r["rounds"] else 0
        acc = r["accepted"] / r["rounds"] if r["rounds"] else 0
        print(f"| {tau:g} | {mode} | {lane} | {r['tok_s']:.1f} | {r['x_classic']:.2f} | "
              f"{ms:.1f} | {dms:.1f} | {100 * r['overhead_over_verify']:.0f}% | {acc:.2f} | "
              f"{r['matches_classic']} |")
PYEOF
