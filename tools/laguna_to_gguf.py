#!/usr/bin/env python3
"""laguna_to_gguf.py - converts a Hugging Face Laguna folder to GGUF in llama.cpp's layout.

    laguna_to_gguf.py HF_DIR OUT.gguf [--outtype auto|f32|f16|bf16]

Architecture "laguna", as llama.cpp's converter (conversion/laguna.py) and
loader (src/models/laguna.cpp) lay it out; written from those facts, with
hf_to_gguf.py's writer, reader and tokenizer code:
- keys: laguna.attention.head_count one entry per layer (always an array);
  head_count_kv, key_length = value_length = head_dim; sliding_window (when
  > 0); rope.freq_base (full layers) and rope.freq_base_swa (sliding);
  rope.dimension_count = int(head_dim * partial_rotary_factor) of the full
  layers, rope.dimension_count_swa of the sliding ones; YaRN on the full
  layers as rope.scaling.{type, factor, original_context_length,
  yarn_beta_fast, yarn_beta_slow, yarn_attn_factor (transformers'
  attention_factor, when given)}; expert_count, expert_used_count,
  expert_feed_forward_length, expert_shared_feed_forward_length,
  expert_weights_norm = true, expert_weights_scale (the routed scaling
  factor), expert_gating_func (2 sigmoid, 4 sqrtsoftplus),
  leading_dense_block_count, router_logit_softcapping (when > 0);
- which layers slide: llama.cpp reads attention.sliding_window_pattern as a
  period p (layer l full when l % p == 0) and assumes 4 without it. The
  period is written when layer_types follow one; otherwise one bool per
  layer (true: sliding), which dflash reads and llama.cpp does not;
- the output gate's kind is not a key: blk.N.attn_gate has n_heads rows
  (per head) or n_heads * head_dim (per element);
- tensors blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, attn_gate,
  attn_q_norm, attn_k_norm, ffn_norm}; dense layers ffn_{gate,up,down};
  MoE layers ffn_gate_inp (router), exp_probs_b.bias (selection bias),
  ffn_{gate,up,down}_exps stacked [n_experts, rows, cols] (transformers'
  fused gate_up_proj split in two, or one tensor per expert stacked), and
  ffn_{gate,up,down}_shexp; sliding layers' sinks as attn_sinks.weight
  (gpt-oss's name; llama.cpp's laguna does not read sinks);
- 1-D tensors F32, matrices and expert stacks --outtype.
Refused, since llama.cpp's layout cannot say them: dense layers after the
first sparse one; attention or MLP biases.
"""
import json
import os
import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_to_gguf as H  # noqa: E402

# the dense names (no biases: Laguna has none), and Laguna's own
LAYER = {k: v for k, v in H.LAYER_NAMES.items() if not k.endswith(".bias")}
LAYER.update({
    "self_attn.g_proj.weight": "attn_gate.weight", "self_attn.sink": "attn_sinks.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight", "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.experts.e_score_correction_bias": "exp_probs_b.bias",
})
for _sh in ("shared_expert", "shared_experts"):
    for _p in ("gate", "up", "down"):
        LAYER[f"mlp.{_sh}.{_p}_proj.weight"] = f"ffn_{_p}_shexp.weight"
# llama.cpp's ExpertGatingFuncType values (gguf 0.19 lacks SQRTSOFTPLUS)
GATING_FUNC = {"sigmoid": 2, "sqrtsoftplus": 4}


def fail(msg):
    raise SystemExit(f"laguna_to_gguf: {msg}")


def ropes(cfg):
    """-> (full, sliding) RoPE dicts with partial_rotary_factor filled in, from the nested
    rope_parameters or the legacy flat form with swa_rope_parameters."""
    rp = cfg.get("rope_parameters") or {}
    top = cfg.get("partial_rotary_factor", 1.0)
    if "full_attention" in rp:
        full, swa = dict(rp["full_attention"]), dict(rp.get("sliding_attention") or {})
    else:
        full, swa = dict(rp), dict(cfg.get("swa_rope_parameters") or {})
    full.setdefault("partial_rotary_factor", top)
    full.setdefault("rope_theta", cfg.get("rope_theta", 500000.0))
    swa.setdefault("partial_rotary_factor", 1.0)
    swa.setdefault("rope_theta", 10000.0)
    if swa.get("rope_type", "default") != "default":
        fail(f"sliding layers' rope_type {swa['rope_type']!r} (plain RoPE only)")
    return full, swa


def mlp_types(cfg, L):
    """['dense' | 'sparse'] per layer, as transformers reads the config."""
    if cfg.get("mlp_layer_types"):
        return list(cfg["mlp_layer_types"])
    only = cfg.get("mlp_only_layers")
    only = [0] if only is None else only
    step = cfg.get("decoder_sparse_step") or 1
    return ["dense" if l in only or (l + 1) % step else "sparse" for l in range(L)]


def swa_pattern(kinds):
    """The period p whose full layers (l % p == 0; p 0: none) are kinds' (True: sliding),
    else the bools themselves."""
    for p in range(0, len(kinds) + 1):
        if all(k == (p == 0 or l % p != 0) for l, k in enumerate(kinds)):
            return p
    print("laguna_to_gguf: layer_types follow no period: writing one bool per layer "
          "(llama.cpp assumes a period of 4)", file=sys.stderr)
    return [bool(k) for k in kinds]


def add_keys(w, cfg, name, mtype):
    L, hd = cfg["num_hidden_layers"], cfg["head_dim"]
    heads = cfg.get("num_attention_heads_per_layer") or [cfg["num_attention_heads"]] * L
    if len(heads) != L:
        fail(f"num_attention_heads_per_layer has {len(heads)} entries for {L} layers")
    w.add_name(name)
    w.add_file_type(H.FILE_TYPE[mtype])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_context_length(int(cfg.get("max_position_embeddings", 131072)))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(L)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count([int(h) for h in heads])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    full, swa = ropes(cfg)
    w.add_rope_freq_base(float(full["rope_theta"]))
    w.add_rope_dimension_count(int(hd * float(full["partial_rotary_factor"])))
    add_yarn(w, cfg, full)
    kinds = [t == "sliding_attention" for t in cfg.get("layer_types") or ["full_attention"] * L]
    window = cfg.get("sliding_window") or 0
    if window > 0 and any(kinds):
        w.add_sliding_window(window)
        w.add_sliding_window_pattern(swa_pattern(kinds))
        w.add_rope_freq_base_swa(float(swa["rope_theta"]))
        w.add_rope_dimension_count_swa(int(hd * float(swa["partial_rotary_factor"])))
    add_moe(w, cfg, L)


def add_yarn(w, cfg, full):
    kind = full.get("rope_type", "default")
    if kind == "default":
        return
    if kind != "yarn":
        fail(f"full layers' rope_type {kind!r} not converted (default, yarn are)")
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(float(full["factor"]))
    w.add_rope_scaling_orig_ctx_len(int(full.get("original_max_position_embeddings") or
                                        cfg["max_position_embeddings"]))
    for key, add in (("beta_fast", w.add_rope_scaling_yarn_beta_fast),
                     ("beta_slow", w.add_rope_scaling_yarn_beta_slow),
                     ("attention_factor", w.add_rope_scaling_yarn_attn_factor)):
        if full.get(key) is not None:
            add(float(full[key]))


def add_moe(w, cfg, L):
    types = mlp_types(cfg, L)
    lead = next((i for i, t in enumerate(types) if t != "dense"), L)
    if any(t == "dense" for t in types[lead:]):
        fail(f"mlp layer types {types}: a dense layer after a sparse one (llama.cpp's layout "
             "has leading dense layers only)")
    w.add_leading_dense_block_count(lead)
    if lead == L:
        return
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_feed_forward_length(cfg.get("shared_expert_intermediate_size", 0))
    w.add_expert_weights_norm(True)
    w.add_expert_weights_scale(float(cfg.get("moe_routed_scaling_factor", 1.0)))
    func = cfg.get("moe_router_score_func") or "sigmoid"
    if func not in GATING_FUNC:
        fail(f"moe_router_score_func {func!r} not converted (sigmoid, sqrtsoftplus are)")
    w.add_uint32(gguf.Keys.LLM.EXPERT_GATING_FUNC.format(arch=w.arch), GATING_FUNC[func])
    cap = float(cfg.get("moe_router_logit_softcapping") or 0.0)
    if cap > 0:
        w.add_float32(gguf.Keys.LLM.ROUTER_LOGIT_SOFTCAPPING.format(arch=w.arch), cap)


def layer_tensors(hf, where, mtype):
    """[(gguf name, shape, type, producer)] for HF tensor hf; [] when it folds into a stack."""
    parts = hf.split(".", 3)
    if len(parts) < 4 or parts[:2] != ["model", "layers"]:
        top = {"model.embed_tokens.weight": "token_embd.weight",
               "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
        if hf not in top:
            fail(f"tensor {hf} has no GGUF name")
        return [(top[hf], where[hf][2], mtype if len(where[hf][2]) == 2 else QT.F32,
                 lambda: H.load_tensor(where, hf))]
    pre, rest = f"blk.{int(parts[2])}.", parts[3]
    shape = list(where[hf][2])
    gt = mtype if len(shape) >= 2 else QT.F32
    if rest in LAYER:
        return [(pre + LAYER[rest], shape, gt, lambda: H.load_tensor(where, hf))]
    if rest == "mlp.experts.gate_up_proj":   # [E, 2I, D]: gate rows first, then up
        E, I2, D = shape
        half = lambda i: lambda: H.load_tensor(where, hf)[:, i * (I2 // 2):(i + 1) * (I2 // 2)]
        return [(pre + "ffn_gate_exps.weight", [E, I2 // 2, D], gt, half(0)),
                (pre + "ffn_up_exps.weight", [E, I2 // 2, D], gt, half(1))]
    if rest == "mlp.experts.down_proj":
        return [(pre + "ffn_down_exps.weight", shape, gt, lambda: H.load_tensor(where, hf))]
    if rest.startswith("mlp.experts.") and rest.endswith("_proj.weight"):
        return []   # one tensor per expert: stacked by expert_stacks
    fail(f"tensor {hf} has no GGUF name")


def expert_stacks(where, mtype, n_experts, names=None):
    """Per-expert tensors (mlp.experts.{e}.{gate,up,down}_proj.weight) stacked per layer.
    names: {name as model.layers.N...: name in where} when the file's names differ."""
    names = names or {k: k for k in where}
    out, layers = [], sorted({int(k.split(".")[2]) for k in names if ".mlp.experts.0." in k})
    for l in layers:
        for p in ("gate", "up", "down"):
            want = [f"model.layers.{l}.mlp.experts.{e}.{p}_proj.weight" for e in range(n_experts)]
            if any(n not in names for n in want):
                fail(f"layer {l}: {p}_proj of some of the {n_experts} experts is missing")
            hfs = [names[n] for n in want]
            shape = [n_experts] + list(where[hfs[0]][2])
            out.append((f"blk.{l}.ffn_{p}_exps.weight", shape, mtype,
                        lambda hfs=hfs: np.stack([H.load_tensor(where, h) for h in hfs])))
    return out


def convert(d, out, outtype="auto", quiet=False):
    """Converts Laguna folder d to GGUF file out; returns the metadata written."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "laguna":
        fail(f"model_type {cfg.get('model_type')!r} is not laguna")
    for key in ("attention_bias", "mlp_bias", "moe_apply_router_weight_on_input"):
        if cfg.get(key):
            fail(f"{key} = true not converted")
    where = H.safetensors_index(d)
    if "model.embed_tokens.weight" not in where:
        fail(f"{d}: no model.embed_tokens.weight")
    mtype = (H.ST_TO_GGML.get(where["model.embed_tokens.weight"][1], QT.F32)
             if outtype == "auto" else H.OUTTYPE[outtype])
    w = gguf.GGUFWriter(out, "laguna")
    add_keys(w, cfg, os.path.basename(os.path.abspath(d)), mtype)
    H.add_tokenizer(w, d, cfg, cfg["vocab_size"])
    tied = bool(cfg.get("tie_word_embeddings", False))
    tensors = []
    for hf in where:
        if hf.endswith("rotary_emb.inv_freq") or (hf == "lm_head.weight" and tied):
            continue
        tensors += layer_tensors(hf, where, mtype)
    tensors += expert_stacks(where, mtype, cfg.get("num_experts", 0))
    H.write(w, out, tensors)
    if not quiet:
        print(f"laguna_to_gguf: wrote {out} ({len(tensors)} tensors)", file=sys.stderr)
    return {k: v.value for k, v in w.kv_data[0].items()}


def main(argv=None):
    return H.cli(convert, "Hugging Face Laguna folder -> GGUF (llama.cpp's layout)", argv)


if __name__ == "__main__":
    sys.exit(main())
