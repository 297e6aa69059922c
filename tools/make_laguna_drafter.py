#!/usr/bin/env python3
"""make_laguna_drafter.py - a random Laguna DFlash drafter (DFlashLagunaForCausalLM)
for a Laguna target folder, for tests.

    make_laguna_drafter.py --target T --out D --layers 2 --heads 8 --kv-heads 2 \\
        --head-dim 16 --ffn 96 --block-size 8 --layer-ids 0,2 --sliding-window 16

The config is Laguna's (hidden size, heads, head_dim, intermediate_size,
layer_types all full or all sliding, sliding_window, gating, rope_parameters
nested by layer type, rms_norm_eps) plus draft_vocab_size (the target's
vocabulary) and dflash_config {target_layer_ids, mask_token_id, block_size,
use_aux_hidden_state}. Tensors, as vLLM's laguna_dflash.py names them: fc,
hidden_norm, norm, aux_hidden_norms.{j}, and per layer self_attn.{qkv_proj
(rows q|k|v), o_proj, g_proj, q_norm, k_norm}, mlp.{gate,up,down}_proj,
input_layernorm, post_attention_layernorm. Layers are numbered after the
target's (layers.{n_target + i}) as vLLM loads them, or from 0 with
--zero-based. No embedding or lm_head: the target's are used.

--published-form writes the config in the shape of Poolside's published
drafters instead: a top-level rope_theta and no rope_parameters, no
mlp_layer_types, num_experts 0, no draft_vocab_size (vocab_size only),
num_target_layers and causal inside dflash_config.

Weights: linear rows N(0, 1/fan_in), norm weights U(0.5, 1.5) (so a norm
read as 1 or as 1 + w shows), from torch's generator seeded by --seed.
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file


def drafter_config(tc, a):
    sliding = a.sliding_window > 0
    kind = "sliding_attention" if sliding else "full_attention"
    gating = {"per-head": True, "per-element": "per-element", "none": False}[a.gating]
    dc = {"target_layer_ids": a.layer_ids, "mask_token_id": a.mask_id,
          "block_size": a.block_size, "use_aux_hidden_state": True}
    if a.causal is not None:
        dc["causal"] = a.causal == "true"
    full_rope = dict(rope_type="default", rope_theta=500000.0, partial_rotary_factor=a.partial)
    if a.yarn:
        full_rope.update(rope_type="yarn", factor=4.0, original_max_position_embeddings=64,
                         beta_fast=64.0, beta_slow=1.0)
    return dict(
        architectures=["DFlashLagunaForCausalLM"], model_type="laguna",
        hidden_size=tc["hidden_size"], num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
        intermediate_size=a.ffn, vocab_size=tc["vocab_size"], draft_vocab_size=tc["vocab_size"],
        rms_norm_eps=tc.get("rms_norm_eps", 1e-6),
        max_position_embeddings=tc["max_position_embeddings"], hidden_act="silu",
        attention_bias=False, tie_word_embeddings=False,
        layer_types=[kind] * a.layers, sliding_window=a.sliding_window if sliding else None,
        mlp_layer_types=["dense"] * a.layers, gating=gating,
        rope_parameters={"full_attention": full_rope,
                         "sliding_attention": dict(rope_type="default", rope_theta=10000.0,
                                                   partial_rotary_factor=a.swa_partial)},
        num_target_layers=tc["num_hidden_layers"], dflash_config=dc,
        torch_dtype={"f32": "float32", "bf16": "bfloat16"}[a.dtype])


def drafter_tensors(tc, a, g):
    D, td, hd = tc["hidden_size"], tc["hidden_size"], a.head_dim
    H, KV, F = a.heads, a.kv_heads, a.ffn

    def lin(rows, cols):
        return torch.randn(rows, cols, generator=g) * cols ** -0.5

    def norm(n):
        return torch.rand(n, generator=g) + 0.5

    t = {"fc.weight": lin(D, len(a.layer_ids) * td), "hidden_norm.weight": norm(D),
         "norm.weight": norm(D)}
    for j in range(len(a.layer_ids)):
        t[f"aux_hidden_norms.{j}.weight"] = norm(td)
    first = 0 if a.zero_based else tc["num_hidden_layers"]
    for i in range(a.layers):
        p = f"layers.{first + i}."
        t[p + "self_attn.qkv_proj.weight"] = lin((H + 2 * KV) * hd, D)
        t[p + "self_attn.o_proj.weight"] = lin(D, H * hd)
        if a.gating != "none":
            t[p + "self_attn.g_proj.weight"] = lin(H if a.gating == "per-head" else H * hd, D)
        t[p + "self_attn.q_norm.weight"] = norm(hd)
        t[p + "self_attn.k_norm.weight"] = norm(hd)
        t[p + "input_layernorm.weight"] = norm(D)
        t[p + "post_attention_layernorm.weight"] = norm(D)
        t[p + "mlp.gate_proj.weight"] = lin(F, D)
        t[p + "mlp.up_proj.weight"] = lin(F, D)
        t[p + "mlp.down_proj.weight"] = lin(D, F)
    return t


def published_form(cfg, rope_theta):
    """cfg reshaped as the published drafters' config.json is."""
    for k in ("rope_parameters", "mlp_layer_types", "draft_vocab_size", "num_target_layers"):
        cfg.pop(k)
    cfg.update(rope_theta=rope_theta, num_experts=0)
    cfg["dflash_config"].update(num_target_layers=cfg.pop("_n_target"), causal=True)
    return cfg


def make(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="the Laguna target folder (config.json)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=96)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--layer-ids", type=lambda s: [int(x) for x in s.split(",")], default=[0])
    ap.add_argument("--mask-id", type=int, default=0)
    ap.add_argument("--sliding-window", type=int, default=0, help="0: full-attention layers")
    ap.add_argument("--gating", choices=["per-head", "per-element", "none"], default="per-head")
    ap.add_argument("--partial", type=float, default=0.5, help="full layers' rotary fraction")
    ap.add_argument("--swa-partial", type=float, default=1.0, help="sliding layers' fraction")
    ap.add_argument("--yarn", action="store_true", help="YaRN RoPE on full-attention layers")
    ap.add_argument("--causal", choices=["true", "false"], help="dflash_config.causal")
    ap.add_argument("--zero-based", action="store_true", help="layers.0.. instead of after the "
                    "target's")
    ap.add_argument("--published-form", type=float, metavar="THETA",
                    help="the published config shape, with this top-level rope_theta")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    tc = json.load(open(os.path.join(a.target, "config.json")))
    g = torch.Generator().manual_seed(a.seed)
    t = drafter_tensors(tc, a, g)
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    os.makedirs(a.out, exist_ok=True)
    save_file({k: v.to(dt).contiguous() for k, v in t.items()},
              os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    cfg = drafter_config(tc, a)
    if a.published_form:
        cfg["_n_target"] = tc["num_hidden_layers"]
        cfg = published_form(cfg, a.published_form)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return cfg


if __name__ == "__main__":
    make()
