#!/usr/bin/env python3
"""drafter_to_gguf.py - a z-lab DFlash (or DFlash2) drafter folder -> llama.cpp's `dflash` GGUF.

    tools/drafter_to_gguf.py DRAFTER_DIR TARGET_DIR OUT.gguf [--outtype auto|f32|f16|bf16]

So llama.cpp's DFlash mode (and our engine, which reads both forms) can run
the same pair. What llama.cpp's loader and speculative code read, written
the way its converter writes them (spec/dflash.md section 1.4):

- general.architecture "dflash"; the usual per-arch keys under `dflash.`
  (embedding_length, block_count, feed_forward_length, attention.head_count
  / head_count_kv / key_length / value_length / layer_norm_rms_epsilon,
  rope.freq_base, rope.dimension_count, context_length, vocab_size);
- dflash.target_layers: the drafter's HF target_layer_ids PLUS ONE (I32),
  because llama.cpp captures the INPUT of target layer v, which is the
  output of layer v-1 that z-lab's ids name;
- dflash.block_size, dflash.target_hidden_size (the target's hidden size);
- the mask id twice: dflash.mask_token_id (the converter's key) and
  tokenizer.ggml.mask_token_id (what llama_vocab_mask reads at run time);
- the TARGET's tokenizer (llama.cpp checks that draft and target
  vocabularies agree before speculating);
- tensors fc.weight, enc.output_norm.weight (hidden_norm),
  output_norm.weight (norm), blk.N.{attn_norm, attn_q, attn_k, attn_v,
  attn_output, attn_q_norm, attn_k_norm, ffn_norm, ffn_gate, ffn_up,
  ffn_down}.weight; no token_embd and no output (both come from the target);
- a DFlash2DraftModel adds dflash.{conv_kernel_size, conv_group_size,
  selector_rank, selector_top_k} and the tensors of llama.cpp's DFlash2
  loader (PR #27342): blk.N.{attn,ffn}_conv_base (F32 [2, K, D]),
  blk.N.{attn,ffn}_conv_proj.weight, selector_hidden.weight,
  selector_predecessor.weight, selector_successor.weight ([V, r]).

Matrices take --outtype (auto keeps the file's); norms stay F32. Quantize
the result with `dflash quantize` (its matrices) like any other GGUF. Written
by llama.cpp's gguf package (through hf_to_gguf's helpers); the dflash.*
keys are not in its constants yet, so they are spelled here.
"""
import argparse
import json
import os
import sys

import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_to_gguf  # noqa: E402
from hf_to_gguf import QT  # noqa: E402

LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
TOP_NAMES = {"fc": "fc", "hidden_norm": "enc.output_norm", "norm": "output_norm"}
DFLASH2_TOP = {"candidate_selector.hidden_projection.weight": "selector_hidden.weight",
               "candidate_selector.predecessor_codebook": "selector_predecessor.weight",
               "candidate_selector.successor_codebook": "selector_successor.weight"}
DFLASH2_LAYER = {"attention_conv.base_kernel": "attn_conv_base",
                 "attention_conv.kernel_projection.weight": "attn_conv_proj.weight",
                 "mlp_conv.base_kernel": "ffn_conv_base",
                 "mlp_conv.kernel_projection.weight": "ffn_conv_proj.weight"}
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def gguf_name(hf):
    """z-lab tensor name (with or without a `model.` prefix) -> GGUF name, or None."""
    n = hf[len("model."):] if hf.startswith("model.") else hf
    if n in DFLASH2_TOP:
        return DFLASH2_TOP[n]
    parts = n.split(".", 2)
    if len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit() and parts[2] in DFLASH2_LAYER:
        return f"blk.{int(parts[1])}.{DFLASH2_LAYER[parts[2]]}"
    if not n.endswith(".weight"):
        return None
    n = n[:-len(".weight")]
    if n in TOP_NAMES:
        return TOP_NAMES[n] + ".weight"
    parts = n.split(".", 2)
    if len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit() and parts[2] in LAYER_NAMES:
        return f"blk.{int(parts[1])}.{LAYER_NAMES[parts[2]]}.weight"
    return None


def build_target_layer_ids(n_target, n_draft):
    """z-lab's rule when the config has no target_layer_ids."""
    if n_draft == 1:
        return [n_target // 2]
    return [round(1 + i * (n_target - 4) / (n_draft - 1)) for i in range(n_draft)]


def convert(ddir, tdir, out, outtype="auto", quiet=False):
    with open(os.path.join(ddir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(tdir, "config.json")) as f:
        tcfg = json.load(f)
    arch = (cfg.get("architectures") or [None])[0]
    if arch not in ("DFlashDraftModel", "DFlash2DraftModel"):
        raise SystemExit(f"drafter_to_gguf: {ddir}: architectures {cfg.get('architectures')} "
                         "is not DFlashDraftModel or DFlash2DraftModel")
    dflash2 = arch == "DFlash2DraftModel"
    dc0 = cfg.get("dflash_config") or {}
    if dflash2 and (dc0.get("output_multiplier", 1.0) != 1.0
                    or dc0.get("final_logit_softcapping") is not None):
        raise SystemExit(f"drafter_to_gguf: {ddir}: dflash_config sets output_multiplier or "
                         "final_logit_softcapping, which llama.cpp's DFlash2 GGUF has no key for")
    D, H, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    KV = cfg.get("num_key_value_heads") or H
    hd = cfg.get("head_dim") or D // H
    TD = tcfg["hidden_size"]
    V = tcfg["vocab_size"]
    dc = cfg.get("dflash_config") or {}
    mask = dc.get("mask_token_id", cfg.get("mask_token_id"))
    if mask is None:
        raise SystemExit(f"drafter_to_gguf: {ddir}: no dflash_config.mask_token_id")
    ids = dc.get("target_layer_ids") or build_target_layer_ids(
        cfg.get("num_target_layers", tcfg["num_hidden_layers"]), L)
    if cfg.get("rope_scaling"):
        raise SystemExit("drafter_to_gguf: the drafter has rope_scaling; llama.cpp's dflash "
                         "arch takes plain RoPE")

    where = hf_to_gguf.safetensors_index(ddir)
    fc = next((k for k in where if gguf_name(k) == "fc.weight"), None)
    if fc is None:
        raise SystemExit(f"drafter_to_gguf: {ddir}: no fc.weight")
    if where[fc][2] != (D, len(ids) * TD):
        raise SystemExit(f"drafter_to_gguf: fc.weight is {where[fc][2]}, expected "
                         f"({D}, {len(ids)} x {TD})")
    if outtype == "auto":
        mtype = hf_to_gguf.ST_TO_GGML.get(where[fc][1], QT.F32)
    else:
        mtype = hf_to_gguf.OUTTYPE[outtype]

    a = "dflash"
    w = gguf.GGUFWriter(out, a)
    hf_to_gguf.add_model_keys(w, cfg, os.path.basename(os.path.abspath(ddir)), mtype, V, D, L, H,
                              KV, hd)
    block = int(cfg.get("block_size") or (cfg.get("dflash_config") or {}).get("block_size", 16))
    w.add_uint32(f"{a}.block_size", block)
    for k in DFLASH2_KEYS if dflash2 else ():
        w.add_uint32(f"{a}.{k}", int(dc[k]))
    w.add_key_value(f"{a}.target_layers", [int(i) + 1 for i in ids], gguf.GGUFValueType.ARRAY,
                    gguf.GGUFValueType.INT32)
    w.add_uint32(f"{a}.target_hidden_size", TD)
    w.add_uint32(f"{a}.mask_token_id", int(mask))
    hf_to_gguf.add_tokenizer(w, tdir, tcfg, V)
    w.add_mask_token_id(int(mask))

    def producer(hf):
        return lambda: hf_to_gguf.load_tensor(where, hf)

    names = {}
    for hf in where:
        g = gguf_name(hf)
        if g is None:
            if hf.endswith("rotary_emb.inv_freq"):
                continue
            raise SystemExit(f"drafter_to_gguf: tensor {hf} has no GGUF name (a Laguna drafter? "
                             "only DFlashDraftModel and DFlash2DraftModel are converted)")
        names[g] = hf
    # GGUF order: fc, norms, then layer by layer (what llama.cpp's converter does)
    order = ["fc.weight", "enc.output_norm.weight", "output_norm.weight"]
    order += [f"blk.{i}.{n}.weight" for i in range(L) for n in LAYER_NAMES.values()]
    if dflash2:
        order += [f"blk.{i}.{n}" for i in range(L) for n in DFLASH2_LAYER.values()]
        order += list(DFLASH2_TOP.values())
    missing = [g for g in order if g not in names]
    if missing:
        raise SystemExit(f"drafter_to_gguf: {ddir}: missing tensors {missing[:4]}")
    tensors = [(g, where[names[g]][2], mtype if len(where[names[g]][2]) == 2 else QT.F32,
                producer(names[g])) for g in order]
    hf_to_gguf.write(w, out, tensors)
    if not quiet:
        print(f"drafter_to_gguf: wrote {out} ({L} layers, target layers {ids} -> "
              f"{[i + 1 for i in ids]}, mask {mask}, block {block})",
              file=sys.stderr)
    return {k: v.value for k, v in w.kv_data[0].items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description="z-lab DFlash drafter folder -> llama.cpp dflash GGUF")
    ap.add_argument("drafter_dir")
    ap.add_argument("target_dir", help="the target's HF folder (tokenizer, hidden size)")
    ap.add_argument("out")
    ap.add_argument("--outtype", choices=["auto", "f32", "f16", "bf16"], default="auto")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    convert(a.drafter_dir, a.target_dir, a.out, a.outtype, a.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
