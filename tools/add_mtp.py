#!/usr/bin/env python3
"""add_mtp.py - puts a native MTP head (mtp.*) into a Qwen3.5 / Qwen3.5-MoE /
Qwen3-Next checkpoint folder that transformers wrote (transformers drops mtp.*
when it saves, and ignores it when it loads).

The head is vLLM's Qwen3NextMultiTokenPredictor (qwen3_next_mtp.py):
  mtp.fc.weight                        [H, 2H]  over [norm_e(embedding) ; norm_h(hidden)]
  mtp.pre_fc_norm_embedding.weight     [H]
  mtp.pre_fc_norm_hidden.weight        [H]
  mtp.layers.0.*                       a full-attention decoder layer with the MLP of
                                       the target's layer 0 (dense, or its experts)
  mtp.norm.weight                      [H]
The layer's tensor names and shapes are copied from the checkpoint itself: the
attention from its first full-attention layer, the norms and MLP from layer 0,
so the head matches whatever layout (fused or per-expert experts) it uses.

  python tools/add_mtp.py DIR                  random head (seeded), the checkpoint's dtype
  python tools/add_mtp.py DIR --from F.safetensors   the mtp.* tensors of F (a real head)
  python tools/add_mtp.py DIR --prefix model.mtp.    store under another prefix

Random weights: matrices N(0, 1/fan_in); norms (applied as 1 + w) N(0, 0.1^2).
The head goes to DIR/mtp.safetensors and model.safetensors.index.json names
every shard (written when the folder had a single model.safetensors).
"""
import argparse
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def text_config(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    return cfg.get("text_config", cfg)


def shard_map(d):
    """-> {tensor name: shard file name} of the folder."""
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        return dict(json.load(open(idx))["weight_map"])
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        return {k: "model.safetensors" for k in f.keys()}


def read(d, wm, name):
    with safe_open(os.path.join(d, wm[name]), "pt") as f:
        return f.get_tensor(name)


def decoder_prefix(wm):
    for p in ("model.language_model.", "model."):
        if p + "embed_tokens.weight" in wm:
            return p
    sys.exit("add_mtp.py: no model.embed_tokens.weight or model.language_model.embed_tokens."
             "weight: not a transformers Qwen3.5 / Qwen3-Next checkpoint")


def layout(d, wm):
    """-> {mtp-relative name: (shape, dtype)} of the head, from the checkpoint's own layers."""
    cfg = text_config(d)
    types = cfg.get("layer_types") or []
    if "full_attention" not in types:
        sys.exit("add_mtp.py: config.json has no full_attention layer in layer_types")
    full, dec = types.index("full_attention"), decoder_prefix(wm)
    h = cfg["hidden_size"]
    embed = read(d, wm, dec + "embed_tokens.weight")
    out = {"fc.weight": ((h, 2 * h), embed.dtype)}
    for n in ("pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight"):
        out[n] = ((h,), embed.dtype)
    for src, keep in ((f"{dec}layers.{full}.", ("self_attn.",)),
                      (f"{dec}layers.0.", ("input_layernorm.", "post_attention_layernorm.",
                                           "mlp."))):
        for name in wm:
            if name.startswith(src) and name[len(src):].startswith(keep):
                t = read(d, wm, name)
                out["layers.0." + name[len(src):]] = (tuple(t.shape), t.dtype)
    return out


def random_head(shapes, seed):
    g = torch.Generator().manual_seed(seed)
    head = {}
    for name, (shape, dtype) in sorted(shapes.items()):
        if "norm" in name:
            t = torch.randn(shape, generator=g) * 0.1
        elif len(shape) == 1:          # biases (A_log-like vectors do not occur here)
            t = torch.randn(shape, generator=g) * 0.1
        else:                          # fan-in is the last dim (Linear rows, fused experts)
            t = torch.randn(shape, generator=g) * shape[-1] ** -0.5
        head[name] = t.to(dtype)
    return head


def given_head(path, shapes):
    head = {}
    with safe_open(path, "pt") as f:
        for k in f.keys():
            for p in ("model.language_model.mtp.", "model.mtp.", "mtp."):
                if k.startswith(p):
                    head[k[len(p):]] = f.get_tensor(k)
                    break
    missing = sorted(set(shapes) - set(head))
    if missing:
        sys.exit(f"add_mtp.py: {path} lacks {', '.join(missing[:4])}")
    for k, (shape, _) in shapes.items():
        if tuple(head[k].shape) != shape:
            sys.exit(f"add_mtp.py: {path}: mtp.{k} is {tuple(head[k].shape)}, the target "
                     f"needs {shape}")
    return head


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--from", dest="src", help="a .safetensors holding mtp.* tensors")
    ap.add_argument("--prefix", default="mtp.", choices=["mtp.", "model.mtp."])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    wm = shard_map(a.dir)
    if any(k.startswith(("mtp.", "model.mtp.", "model.language_model.mtp.")) for k in wm):
        sys.exit(f"add_mtp.py: {a.dir} already has MTP tensors")
    shapes = layout(a.dir, wm)
    head = given_head(a.src, shapes) if a.src else random_head(shapes, a.seed)
    tensors = {a.prefix + k: v.contiguous() for k, v in head.items()}
    save_file(tensors, os.path.join(a.dir, "mtp.safetensors"), metadata={"format": "pt"})
    for k in tensors:
        wm[k] = "mtp.safetensors"
    idx = os.path.join(a.dir, "model.safetensors.index.json")
    meta = json.load(open(idx)).get("metadata", {}) if os.path.exists(idx) else {}
    json.dump({"metadata": meta, "weight_map": dict(sorted(wm.items()))}, open(idx, "w"),
              indent=2)
    print(f"add_mtp.py: {len(tensors)} MTP tensors under '{a.prefix}' in {a.dir}/mtp.safetensors")


if __name__ == "__main__":
    main()
