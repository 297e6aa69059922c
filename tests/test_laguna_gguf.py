#!/usr/bin/env python3
"""test_laguna_gguf.py - Laguna in llama.cpp's GGUF layout, sinks and sqrt-softplus
routing, and refusals of malformed Laguna configs.

1. transformers makes random Laguna checkpoints (test_hf_oracle.py's cases:
   YaRN + partial rotary on full layers, per-head gates, experts fused as
   transformers saves them; a 256-wide one), tools/laguna_to_gguf.py (ours,
   written from llama.cpp's layout) converts each; `dflash dump` logits and
   hidden states from the .gguf must be bit-identical to those from the
   folder (f32 and bf16 weights, prefill and decode, f32 cache), and
   `dflash probe` on the .gguf must find 0 bytes differing at B=2..16;
   `dflash quantize` of the .gguf (q8_0, q4_k; 3-D expert stacks included)
   must compute the bytes of the folder loaded with --dtype of that type.
2. A case transformers' Laguna does not compute by itself: learned sinks on
   the sliding layers (swa_attention_sink_enabled, self_attn.sink) and
   moe_router_score_func = sqrtsoftplus, plus per-element gates, a router
   softcap, YaRN with an explicit attention_factor and sliding layers that
   follow no period (the GGUF then holds one bool per layer). The oracle is
   transformers' Laguna with its attention swapped for transformers' own
   gpt-oss eager attention (the sink column in the softmax, dropped after)
   and its router's sigmoid for sqrt(softplus(x)) (vLLM's definition);
   tolerance test_hf_oracle's TOL. Then GGUF == folder bit for bit, and the
   probe on the .gguf.
3. Malformed configs, as config.json and as GGUF metadata, each refused with
   a message naming the field (head counts against tensor shapes, top-k >
   experts, window outside 2..2^20, attention_bias, unknown scoring ...).
Without $DFLASH_BIN or torch/transformers: skipped, unless CI=true.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))
import test_hf_oracle as O  # noqa: E402
from testlib import check, finish, missing  # noqa: E402

GGUF_CASES = ["laguna-yarn-perhead-moe", "laguna-256-probe"]
SINK_CASE = ("laguna-sinks-sqrtsoftplus", "LagunaConfig",
             dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, num_attention_heads_per_layer=[4, 8, 4, 8],
                  layer_types=["sliding_attention", "full_attention", "sliding_attention",
                               "sliding_attention"], sliding_window=6, gating="per-element",
                  swa_attention_sink_enabled=True, moe_router_score_func="sqrtsoftplus",
                  mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
                  num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
                  shared_expert_intermediate_size=48, moe_routed_scaling_factor=2.5,
                  moe_router_logit_softcapping=2.0,
                  rope_parameters={"full_attention": dict(rope_type="yarn", rope_theta=500000.0,
                                                          factor=4.0, attention_factor=1.0,
                                                          original_max_position_embeddings=64,
                                                          partial_rotary_factor=0.5),
                                   "sliding_attention": dict(rope_type="default",
                                                             rope_theta=10000.0)},
                  tie_word_embeddings=False), 77)


def convert(d, outtype="auto"):
    import laguna_to_gguf
    path = d + ("" if outtype == "auto" else "-" + outtype) + ".gguf"
    laguna_to_gguf.convert(d, path, outtype, quiet=True)
    return path


def same_bits(name, binary, d, path, vocab_dim, layers):
    """dump of the folder and of the .gguf: identical logits and hidden states."""
    dim = vocab_dim
    ids = np.random.default_rng(7).integers(0, O.VOCAB, O.N_PROMPT).tolist()
    cap = list(range(layers - 1))
    for mode, dec in (("prefill", None), ("decode", O.DECODE_FROM)):
        try:
            a = O.dump(binary, d, ids, "f32", decode=dec, capture=cap, dim=dim)
            b = O.dump(binary, path, ids, "f32", decode=dec, capture=cap, dim=dim)
        except RuntimeError as e:
            check(False, f"{name} {mode}: {e}")
            continue
        for what, x, y in zip(("logits", "hidden"), a[:2], b[:2]):
            ok = np.array_equal(np.ascontiguousarray(x).view(np.uint32),
                                np.ascontiguousarray(y).view(np.uint32))
            check(ok, f"{name} {mode} {what}: GGUF differs from the folder (max diff "
                      f"{np.abs(x - y).max():.3g})")
        print(f"  {name:30s} {mode:7s} GGUF vs folder: "
              f"{'bit-identical' if ok else 'DIFFERENT'}", flush=True)


def raw_dump(binary, model, ids, extra=()):
    with tempfile.TemporaryDirectory(prefix="laguna_gguf-") as tmp:
        out = os.path.join(tmp, "l.bin")
        O.run([binary, "dump", "--model", model, "--ids", ",".join(map(str, ids)), "--out", out,
               "--kv-type", "f32", "--threads", "2"] + list(extra))
        return open(out, "rb").read()


def quantized_same(binary, name, d, path, q):
    """`dflash quantize` of the .gguf (its 3-D expert stacks included) computes what the
    folder loaded with --dtype q computes, byte for byte: the same rows, the same quantizer."""
    qpath = f"{path[:-5]}-{q}.gguf"
    try:
        O.run([binary, "quantize", "-m", path, "--out", qpath, "--type", q,
               "--quantize-embeddings", "-t", "2"])
        ids = np.random.default_rng(5).integers(0, O.VOCAB, 20).tolist()
        ok = raw_dump(binary, qpath, ids) == raw_dump(binary, d, ids, ["--dtype", q])
    except RuntimeError as e:
        ok = check(False, f"{name} {q}: {e}")
    check(ok, f"{name}: the quantized GGUF ({q}) differs from the folder at --dtype {q}")
    print(f"  {name:30s} quantize {q} GGUF vs folder --dtype {q}: "
          f"{'bit-identical' if ok else 'DIFFERENT'}", flush=True)


def test_gguf_cases(binary, tmp):
    for name, cls, kw, seed in [a for a in O.ARCHS if a[0] in GGUF_CASES]:
        dirs = O.make_target(tmp, name, cls, kw, seed)
        ggufs = {dt: convert(d) for dt, d in dirs.items()}
        for dt in dirs:
            same_bits(f"{name} {dt}", binary, dirs[dt], ggufs[dt], kw["hidden_size"],
                      kw["num_hidden_layers"])
        O.test_probe(binary, name + ".gguf", {"f32": ggufs["f32"], "bf16": ggufs["bf16"]})
        if "256" in name:   # rows of whole q8_0 / q4_k blocks
            for q in ("q8_0", "q4_k"):
                quantized_same(binary, name, dirs["f32"], ggufs["f32"], q)


# ---- 2: sinks and sqrt-softplus routing -------------------------------------------------

def sink_model(kw, seed):
    """transformers' Laguna with gpt-oss's sink attention on the sliding layers and a
    sqrt(softplus) router; -> (model, config)."""
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers.models.gpt_oss import modeling_gpt_oss
    from transformers.models.laguna import modeling_laguna
    cfg = transformers.LagunaConfig(**dict(O.COMMON, **kw))
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    O.randomize(m)
    plain = modeling_laguna.eager_attention_forward

    def attention(module, *a, **k):
        sinks = getattr(module, "sinks", None)
        return (modeling_gpt_oss.eager_attention_forward if sinks is not None else plain)(
            module, *a, **k)

    def router(self, hidden_states):
        x = F.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight).float()
        if self.router_logit_softcapping > 0.0:
            x = torch.tanh(x / self.router_logit_softcapping) * self.router_logit_softcapping
        scores = F.softplus(x).sqrt()
        _, chosen = torch.topk(scores + self.e_score_correction_bias, self.top_k, dim=-1)
        w = scores.gather(-1, chosen)
        return x, (w / w.sum(dim=-1, keepdim=True)).to(hidden_states.dtype), chosen

    modeling_laguna.eager_attention_forward = attention
    with torch.no_grad():
        for l, layer in enumerate(m.model.layers):
            if cfg.layer_types[l] == "sliding_attention":
                layer.self_attn.sinks = torch.nn.Parameter(torch.randn(layer.self_attn.num_heads))
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.forward = types.MethodType(router, layer.mlp.gate)
    return m.eval(), cfg


def save_sink_model(m, cfg, d):
    """The checkpoint as the published ones name it: self_attn.sink (vLLM's)."""
    from safetensors.torch import save_file
    os.makedirs(d)
    cfg.save_pretrained(d)
    sd = {k.replace(".self_attn.sinks", ".self_attn.sink"): v.contiguous()
          for k, v in m.state_dict().items()}
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    O.write_tokenizer(os.path.join(d, "tokenizer.json"))


def test_sinks(binary, tmp):
    import torch
    name, _, kw, seed = SINK_CASE
    m, cfg = sink_model(kw, seed)
    d = os.path.join(tmp, name)
    save_sink_model(m, cfg, d)
    ids = np.random.default_rng(11).integers(0, O.VOCAB, O.N_PROMPT).tolist()
    x = torch.tensor([ids])
    with torch.no_grad():
        ref = m(x).logits[0].numpy()
        # the oracle's sinks and router matter (sanity): without either the logits move
        s = {l.self_attn: l.self_attn.sinks for l in m.model.layers if hasattr(l.self_attn, "sinks")}
        for a in s:
            del a.sinks
        nosink = m(x).logits[0].numpy()
        for a, p in s.items():
            a.sinks = p
        r = {l.mlp.gate: l.mlp.gate.forward for l in m.model.layers if hasattr(l.mlp, "gate")}
        for g in r:
            del g.forward   # back to transformers' sigmoid
        sigmoid = m(x).logits[0].numpy()
        for g, f in r.items():
            g.forward = f
    check(np.abs(ref - nosink).max() > 1e-2, f"{name}: the sinks change the oracle's logits")
    check(np.abs(ref - sigmoid).max() > 1e-2, f"{name}: sqrtsoftplus changes the oracle's logits")
    for mode, dec in (("prefill", None), ("decode", O.DECODE_FROM)):
        for kv in ("f32", "f16"):
            try:
                got = O.dump(binary, d, ids, kv, decode=dec)[0]
            except RuntimeError as e:
                check(False, f"{name} {mode} kv {kv}: {e}")
                continue
            ok, diff, tol = O.compare(ref, got, kv)
            check(ok, f"{name} {mode} kv {kv}: max |diff| {diff:.3g} > tol {tol:.3g}")
            O.row(name, "f32", mode, kv, diff, tol, ok)
    path = convert(d)
    same_bits(name, binary, d, path, kw["hidden_size"], kw["num_hidden_layers"])
    O.test_probe(binary, name + ".gguf", {"f32": path, "bf16": convert(d, "bf16")})
    return d, path


# ---- 3: refusals ---------------------------------------------------------------------------

def refused(binary, name, model, want):
    r = subprocess.run([binary, "dump", "--model", model, "--ids", "1,2", "--out", os.devnull,
                        "--threads", "1"], capture_output=True, text=True, timeout=120)
    ok = r.returncode != 0 and want in r.stderr and "Sanitizer" not in r.stderr
    check(ok, f"refusal {name}: exit {r.returncode}, message should name {want!r}: "
              f"{r.stderr.strip()[-300:]}")
    print(f"  refusal {name:34s} {'ok' if ok else 'FAIL'}: {r.stderr.strip()[-110:]}", flush=True)


HF_BAD = [  # (name, config.json changes, what the message must name)
    ("heads vs q_proj shape", {"num_attention_heads_per_layer": [4, 4, 4, 8]}, "q_proj.weight"),
    ("heads list length", {"num_attention_heads_per_layer": [4, 8]},
     "num_attention_heads_per_layer"),
    ("heads not whole kv groups", {"num_attention_heads_per_layer": [4, 8, 3, 8]},
     "num_attention_heads_per_layer"),
    ("top-k > experts", {"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ("window 1", {"sliding_window": 1}, "sliding_window"),
    ("window 2^20 + 1", {"sliding_window": (1 << 20) + 1}, "sliding_window"),
    ("attention_bias", {"attention_bias": True}, "attention_bias"),
    ("score func", {"moe_router_score_func": "softmax"}, "moe_router_score_func"),
    ("gating", {"gating": "per-channel"}, "gating"),
    ("mlp_layer_types", {"mlp_layer_types": ["dense", "moe", "sparse", "sparse"]},
     "mlp_layer_types"),
    ("gating_types mixed", {"gating_types": ["per_element", "per_head", "per_element",
                                             "per_element"]}, "gating_types[1]"),
    ("norm_topk_prob false", {"norm_topk_prob": False}, "norm_topk_prob"),
    ("sinks without tensors", {"swa_attention_sink_enabled": True}, "self_attn.sink"),
    ("sliding rope yarn", {"rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 5e5},
        "sliding_attention": {"rope_type": "yarn", "factor": 2.0}}},
     "rope_parameters.sliding_attention.rope_type"),
]

GGUF_BAD = [  # (name, {key: value or None to drop}, what the message must name)
    ("head_count vs attn_q shape", {"attention.head_count": [4, 4, 4, 8]}, "attn_q.weight"),
    ("head_count length", {"attention.head_count": [4, 8]}, "attention.head_count"),
    ("head_count 0", {"attention.head_count": [4, 0, 4, 8]}, "attention.head_count"),
    ("expert_used_count > experts", {"expert_used_count": 9}, "expert_used_count"),
    ("window 1", {"attention.sliding_window": 1}, "sliding_window"),
    ("window 2^20 + 1", {"attention.sliding_window": (1 << 20) + 1},
     "attention.sliding_window"),
    ("gating func softmax", {"expert_gating_func": 1}, "expert_gating_func"),
    ("weights not normalised", {"expert_weights_norm": False}, "expert_weights_norm"),
    ("leading dense > layers", {"leading_dense_block_count": 5}, "leading_dense_block_count"),
    ("leading dense missing", {"leading_dense_block_count": None}, "leading_dense_block_count"),
    ("odd rope dims", {"rope.dimension_count": 7}, "rope.dimension_count"),
    ("rope dims > head_dim", {"rope.dimension_count_swa": 18}, "rope.dimension_count_swa"),
    ("swa pattern length", {"attention.sliding_window_pattern": [True, False]},
     "attention.sliding_window_pattern"),
    ("expert count missing", {"expert_count": None}, "expert_count"),
    ("routed scale nan", {"expert_weights_scale": float("nan")}, "expert_weights_scale"),
]


def rewrite_gguf(src, dst, changes, arch="laguna", more=()):
    """A copy of GGUF src with <arch>.<key> set (or dropped for None) as changes says, and
    the tensors more [(name, array, ggml type)] after its own."""
    import gguf
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch)
    changes = {f"{arch}.{k}": v for k, v in changes.items()}
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in changes:
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), f.types[0], sub_type=sub)
    for key, v in changes.items():
        if v is None:
            continue
        if isinstance(v, list):
            sub = gguf.GGUFValueType.BOOL if isinstance(v[0], bool) else gguf.GGUFValueType.UINT32
            w.add_key_value(key, v, gguf.GGUFValueType.ARRAY, sub_type=sub)
        else:
            w.add_key_value(key, v, gguf.GGUFValueType.BOOL if isinstance(v, bool) else
                            gguf.GGUFValueType.FLOAT32 if isinstance(v, float) else
                            gguf.GGUFValueType.UINT32)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    for name, data, typ in more:
        w.add_tensor(name, data, raw_dtype=typ)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_refusals(binary, tmp, d, path):
    for i, (name, change, want) in enumerate(HF_BAD):
        bad = os.path.join(tmp, f"bad-hf-{i}")
        shutil.copytree(d, bad)
        cfg = json.load(open(os.path.join(bad, "config.json")))
        cfg.update(change)
        if name == "sinks without tensors":   # the folder's tensors without the sinks
            from safetensors.numpy import load_file, save_file
            st = os.path.join(bad, "model.safetensors")
            save_file({k: v for k, v in load_file(st).items() if ".sink" not in k}, st,
                      metadata={"format": "pt"})
        json.dump(cfg, open(os.path.join(bad, "config.json"), "w"))
        refused(binary, "config.json " + name, bad, want)
    for i, (name, change, want) in enumerate(GGUF_BAD):
        bad = os.path.join(tmp, f"bad-{i}.gguf")
        rewrite_gguf(path, bad, change)
        refused(binary, "gguf " + name, bad, want)


def main():
    t0 = time.time()
    binary = O.find_bin()
    if not binary:
        missing("the dflash binary ($DFLASH_BIN)")
        return finish()
    if not O.torch_ready():
        return finish()
    with tempfile.TemporaryDirectory(prefix="test_laguna_gguf-") as tmp:
        test_gguf_cases(binary, tmp)
        d, path = test_sinks(binary, tmp)
        test_refusals(binary, tmp, d, path)
    print(f"test_laguna_gguf: {time.time() - t0:.1f} s")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
