#!/usr/bin/env python3
"""make_laguna.py - a random-weight Laguna target in Laguna-XS's shape, written
by transformers itself (LagunaConfig, LagunaForCausalLM, save_pretrained), for
benchmarks that need the real layout at a size this machine holds.

    make_laguna.py --tokenizer T/tokenizer.json --out DIR [--layers 12] [--experts 32]
                   [--top-k 8] [--dtype bf16]

Kept from Laguna-XS.2 (../shared/spec/architectures.md §1): hidden 2048, head_dim
128, 8 K/V heads, 48 query heads on full layers and 64 on sliding ones, layer i
full when i % 4 == 0, window 512, YaRN on full layers (theta 5e5, factor 32,
beta 64 / 1, half the dims rotate), default RoPE on sliding ones (theta 1e4),
per-head softplus gate, dense layer 0 (FFN 8192), then sigmoid-routed experts
(FFN 512, shared expert 512, routed scale 2.5). Fewer layers and experts, and
the given tokenizer's vocabulary (padded as real models pad), so it fits.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_checkpoint import copy_tokenizer, read_tokenizer  # noqa: E402


def config(a, vocab, bos, eos):
    from transformers import LagunaConfig
    n = a.layers
    types = ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(n)]
    return LagunaConfig(
        vocab_size=vocab, hidden_size=2048, intermediate_size=8192, num_hidden_layers=n,
        num_attention_heads=48, num_key_value_heads=8, head_dim=128,
        num_attention_heads_per_layer=[48 if t == "full_attention" else 64 for t in types],
        layer_types=types, sliding_window=512, gating=True, rms_norm_eps=1e-6,
        num_experts=a.experts, num_experts_per_tok=a.top_k, moe_intermediate_size=512,
        shared_expert_intermediate_size=512, moe_routed_scaling_factor=2.5,
        mlp_layer_types=["dense"] + ["sparse"] * (n - 1), max_position_embeddings=131072,
        rope_parameters={
            "full_attention": dict(rope_type="yarn", rope_theta=500000.0, factor=32.0,
                                   original_max_position_embeddings=4096, beta_fast=64.0,
                                   beta_slow=1.0, partial_rotary_factor=0.5),
            "sliding_attention": dict(rope_type="default", rope_theta=10000.0,
                                      partial_rotary_factor=1.0)},
        bos_token_id=bos, eos_token_id=eos, tie_word_embeddings=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    vocab, bos, eos = read_tokenizer(a.tokenizer)
    from transformers import LagunaForCausalLM
    torch.manual_seed(a.seed)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    torch.set_default_dtype(dtype)
    c = config(a, vocab, bos, eos)
    print(f"make_laguna: {a.layers} layers, {a.experts} experts (top {a.top_k}), "
          f"vocab {c.vocab_size}, {a.dtype}", file=sys.stderr)
    m = LagunaForCausalLM(c)
    n = sum(p.numel() for p in m.parameters())
    print(f"make_laguna: {n / 1e9:.2f} B parameters; writing {a.out}", file=sys.stderr)
    m.save_pretrained(a.out, safe_serialization=True)
    copy_tokenizer(a.tokenizer, a.out)


if __name__ == "__main__":
    main()
