#!/usr/bin/env python3
"""make_qwen35.py - a random-weight Qwen3.5 hybrid target of a 2B-class size,
written by transformers itself (Qwen3_5TextConfig / Qwen3_5MoeTextConfig,
save_pretrained), for benchmarks that need the real layout at a size this
machine holds.

    make_qwen35.py --tokenizer T/tokenizer.json --out DIR [--moe] [--layers 24]
                   [--experts 32] [--top-k 8] [--dtype bf16]

Kept from the released Qwen3.5 layout (../shared/spec/architectures.md §2): 3
gated DeltaNet layers to 1 gated full-attention layer, DeltaNet with 16 key
heads of 128, conv kernel 4, full attention with head_dim 256, 2 K/V heads and a
quarter of the dims rotating, every norm x̂·(1+w). The widths are a 2B-class
choice of ours (hidden 2048, 8 query heads, 16 value heads, FFN 6144; with
--moe: experts of 512 plus a gated shared expert of 512, softmax top-k), with
the given tokenizer's vocabulary (padded as real models pad), so it fits.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_checkpoint import copy_tokenizer, read_tokenizer  # noqa: E402


def config(a, vocab, bos, eos):
    import transformers
    n = a.layers
    common = dict(
        vocab_size=vocab, hidden_size=2048, num_hidden_layers=n, num_attention_heads=8,
        num_key_value_heads=2, head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=16,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                     for i in range(n)],
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                             partial_rotary_factor=0.25),
        max_position_embeddings=262144, rms_norm_eps=1e-6, bos_token_id=bos, eos_token_id=eos,
        tie_word_embeddings=True)
    if not a.moe:
        return transformers.Qwen3_5TextConfig(intermediate_size=6144, **common)
    return transformers.Qwen3_5MoeTextConfig(
        num_experts=a.experts, num_experts_per_tok=a.top_k, moe_intermediate_size=512,
        shared_expert_intermediate_size=512, **common)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--moe", action="store_true", help="Qwen3.5-MoE (every MLP routed)")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    vocab, bos, eos = read_tokenizer(a.tokenizer)
    import transformers
    torch.manual_seed(a.seed)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    torch.set_default_dtype(dtype)
    c = config(a, vocab, bos, eos)
    kind = f"MoE, {a.experts} experts (top {a.top_k})" if a.moe else "dense"
    print(f"make_qwen35: {a.layers} layers, {kind}, vocab {c.vocab_size}, {a.dtype}",
          file=sys.stderr)
    m = transformers.AutoModelForCausalLM.from_config(c, dtype=dtype)
    n = sum(p.numel() for p in m.parameters())
    print(f"make_qwen35: {n / 1e9:.2f} B parameters; writing {a.out}", file=sys.stderr)
    m.save_pretrained(a.out, safe_serialization=True)
    copy_tokenizer(a.tokenizer, a.out)


if __name__ == "__main__":
    main()
