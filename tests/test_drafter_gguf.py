#!/usr/bin/env python3
"""test_drafter_gguf.py - tools/drafter_to_gguf.py against llama.cpp's `dflash`
GGUF conventions (spec/dflash.md section 1.4, read from llama.cpp's
conversion/qwen.py DFlashModel, src/models/dflash.cpp and
common/speculative.cpp), and the engine reading both forms alike:

1. without the engine: architecture, the per-arch keys, target_layers = HF
   ids + 1 as I32, block size, target hidden size, the mask id under both
   keys, the target's tokenizer; exactly the tensor names llama.cpp creates
   (fc, enc.output_norm, output_norm, blk.N.*; no token_embd / output), their
   shapes, F32 norms, values equal to the safetensors (bf16 kept, or f32);
   both z-lab layouts (plain and `model.`-prefixed names); refusals;
2. with the engine: `dflash dump` drafter logits from the folder and from
   the GGUF are bit-identical (bf16 and f32).

Without $DFLASH_BIN part 2 is skipped, unless CI=true.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import gguf
import numpy as np

SRC = os.environ.get("DFLASH_SRC") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SRC, "tools"))
import drafter_to_gguf as d2g  # noqa: E402
import make_checkpoint as mc  # noqa: E402
from testlib import check, finish, missing  # noqa: E402


LAYER = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
         "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]


def read_gguf(path):
    """-> (reader, {key: value}, {name: float32 array}) through gguf's own GGUFReader."""
    r = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return r, meta, {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in r.tensors}


def bf16_round(x):
    """float32 -> bfloat16 -> float32, rounded by torch (the oracle)."""
    import torch
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16).float().numpy()


def check_file(tdir, ddir, out, outtype, what):
    with open(os.path.join(tdir, "config.json")) as f:
        tc = json.load(f)
    with open(os.path.join(ddir, "config.json")) as f:
        dc = json.load(f)
    rd, meta, tens = read_gguf(out)
    ids = dc["dflash_config"]["target_layer_ids"]
    L, D = dc["num_hidden_layers"], dc["hidden_size"]
    exp = {
        "general.architecture": "dflash",
        "dflash.block_count": L,
        "dflash.embedding_length": D,
        "dflash.feed_forward_length": dc["intermediate_size"],
        "dflash.attention.head_count": dc["num_attention_heads"],
        "dflash.attention.head_count_kv": dc["num_key_value_heads"],
        "dflash.attention.key_length": dc["head_dim"],
        "dflash.attention.value_length": dc["head_dim"],
        "dflash.rope.dimension_count": dc["head_dim"],
        "dflash.block_size": dc["block_size"],
        "dflash.target_layers": [i + 1 for i in ids],
        "dflash.target_hidden_size": tc["hidden_size"],
        "dflash.mask_token_id": dc["dflash_config"]["mask_token_id"],
        "tokenizer.ggml.mask_token_id": dc["dflash_config"]["mask_token_id"],
        "dflash.vocab_size": tc["vocab_size"],
    }
    for k, v in exp.items():
        check(meta.get(k) == v, f"{what}: {k} = {meta.get(k)!r}, expected {v!r}")
    check(abs(meta["dflash.rope.freq_base"] - dc["rope_theta"]) < 1e-3 * dc["rope_theta"],
          f"{what}: rope.freq_base")
    check(len(meta.get("tokenizer.ggml.tokens", [])) == tc["vocab_size"] and
          meta.get("tokenizer.ggml.model") == "gpt2", f"{what}: the target's tokenizer")
    names = ["fc.weight", "enc.output_norm.weight", "output_norm.weight"] + \
        [f"blk.{i}.{n}.weight" for i in range(L) for n in LAYER]
    check(sorted(tens) == sorted(names), f"{what}: tensor names {sorted(set(tens) ^ set(names))}")
    # the target-layers key must be I32 in the file (llama.cpp and our loader read I32)
    types = rd.fields["dflash.target_layers"].types
    check(types == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32],
          f"{what}: target_layers type {types}")
    src = mc.load_dir(ddir)
    strip = {(k[6:] if k.startswith("model.") else k): v for k, v in src.items()}
    hf_of = {"fc.weight": "fc.weight", "enc.output_norm.weight": "hidden_norm.weight",
             "output_norm.weight": "norm.weight"}
    inv = {v: k for k, v in d2g.LAYER_NAMES.items()}
    for i in range(L):
        for n in LAYER:
            hf_of[f"blk.{i}.{n}.weight"] = f"layers.{i}.{inv[n]}.weight"
    for g, a in tens.items():
        s = strip[hf_of[g]]
        if outtype == "f32" or a.ndim == 1:
            check(np.array_equal(a, s.astype(np.float32)), f"{what}: {g} values")
        else:
            check(np.array_equal(a, bf16_round(s)), f"{what}: {g} bf16 values")
    check(tens["fc.weight"].shape == (D, len(ids) * tc["hidden_size"]), f"{what}: fc shape")


def dump(bin_, tdir, draft, out, outd):
    r = subprocess.run([bin_, "dump", "-m", tdir, "--ids", "5,9,2,77,31,6,8,100,3", "--out", out,
                        "--draft", draft, "--draft-block", "8", "--out-draft", outd],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"dflash dump --draft {draft}: {r.stderr[-400:]}")
    return open(outd, "rb").read() if r.returncode == 0 else b""


def summary(bin_, model, draft, *flags):
    """The load summary of a short generate with the drafter."""
    r = subprocess.run([bin_, "generate", "-m", model, "--draft", draft, "-p", "hi", "-n", "2",
                        "-t", "1", *flags], capture_output=True, text=True)
    check(r.returncode == 0, f"generate --draft {draft} {flags}: {r.stderr[-300:]}")
    return r.stderr


def drafter_type(bin_, model, draft, *flags):
    """The drafter's weight type the load summary names."""
    m = re.search(r"DFlash drafter of \d+ layers \((\w+) weights\)",
                  summary(bin_, model, draft, *flags))
    check(m, f"generate --draft {draft} {flags}: the summary names the drafter's type")
    return m.group(1) if m else None


def head_copy(bin_, model, draft, *flags):
    """The type of the drafter's own copy of the target's lm_head; None: it reads the target's."""
    m = re.search(r"drafts read a (\w+) copy of the lm_head", summary(bin_, model, draft, *flags))
    return m.group(1) if m else None


def text(bin_, model, *flags):
    r = subprocess.run([bin_, "generate", "-m", model, "-p", "the sea", "-n", "24", "-t", "1",
                        *flags], capture_output=True, text=True)
    check(r.returncode == 0, f"generate {flags}: {r.stderr[-300:]}")
    return r.stdout


def drafter_head(bin_, tg, tq, draft):
    """A quantized drafter beside a quantized target whose lm_head is 16-bit (dflash
    quantize keeps token_embd) drafts from its own copy of the head in its type; one
    beside a quantized head, or a 16-bit drafter, reads the target's. Output stays
    the classic decode's."""
    tqe = tg.replace(".gguf", "-q8e.gguf")
    r = subprocess.run([bin_, "quantize", "-m", tg, "-o", tqe, "--type", "q8_0",
                        "--quantize-embeddings"], capture_output=True, text=True)
    check(r.returncode == 0, f"quantize --quantize-embeddings: {r.stderr[-300:]}")
    check(head_copy(bin_, tq, draft) == "q8_0", "a q8_0 drafter drafts from a q8_0 copy of a bf16 head")
    check(head_copy(bin_, tq, draft, "--draft-dtype", "auto") is None,
          "a bf16 drafter reads the target's bf16 head")
    check(head_copy(bin_, tqe, draft) is None, "a q8_0 head is read as it is")
    classic = text(bin_, tq, "--draft", "none")
    for block in ("4", "8"):
        check(text(bin_, tq, "--draft", draft, "--block-size", block) == classic,
              f"block {block}, drafts from the copied head: the classic decode's text")


def weight_types(bin_, tmp, tdir, draft):
    """Beside a quantized target a 16-bit drafter runs as q8_0 unless --draft-dtype
    says otherwise; a quantized drafter keeps its type; a 16-bit target keeps both."""
    tg = os.path.join(tmp, "t.gguf")
    subprocess.run([sys.executable, os.path.join(SRC, "tools", "hf_to_gguf.py"), tdir, tg],
                   capture_output=True, check=True)
    made = {}
    for src, typ in ((tg, "q8_0"), (draft, "q4_0")):
        made[src] = src.replace(".gguf", f"-{typ}.gguf")
        r = subprocess.run([bin_, "quantize", "-m", src, "-o", made[src], "--type", typ],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"quantize {src} to {typ}: {r.stderr[-300:]}")
    tq, dq = made[tg], made[draft]
    check(drafter_type(bin_, tq, draft) == "q8_0", "a bf16 drafter beside a q8_0 target runs as q8_0")
    check(drafter_type(bin_, tq, draft, "--draft-dtype", "auto") == "bf16",
          "--draft-dtype auto keeps the drafter's bf16")
    check(drafter_type(bin_, tq, draft, "--draft-dtype", "f32") == "f32", "--draft-dtype f32")
    check(drafter_type(bin_, tq, dq) == "q4_0", "a q4_0 drafter keeps its type beside a q8_0 target")
    check(drafter_type(bin_, tg, draft) == "bf16", "a bf16 drafter beside a bf16 target stays bf16")
    drafter_head(bin_, tg, tq, draft)


def main():
    bin_ = os.environ.get("DFLASH_BIN")
    if not bin_ or not os.path.exists(bin_):
        missing("the dflash binary ($DFLASH_BIN)")  # a failure under CI=true, else a skip
        bin_ = None
    with tempfile.TemporaryDirectory() as tmp:
        t = os.path.join(tmp, "t")
        mc.make_target(t, arch="qwen3", dim=64, layers=6, heads=4, kv_heads=2, head_dim=16,
                       ffn=96, vocab=384, max_ctx=256, rope_theta=10000.0, dtype="bf16", quiet=True)
        cases = [("bf16", dict(dtype="bf16"), "auto"),
                 ("f32 prefixed", dict(dtype="f32", prefix_model=True, layers=3), "auto"),
                 ("bf16 -> f32", dict(dtype="bf16", layers=1), "f32")]
        for name, kw, outtype in cases:
            d = os.path.join(tmp, name.replace(" ", "_").replace(">", ""))
            mc.make_drafter(d, t, block_size=8, quiet=True, **kw)
            out = d + ".gguf"
            d2g.convert(d, t, out, outtype, quiet=True)
            check_file(t, d, out, "f32" if outtype == "f32" or kw["dtype"] == "f32" else "bf16",
                       name)
            if bin_:
                a = dump(bin_, t, d, os.path.join(tmp, "a"), os.path.join(tmp, "ad"))
                b = dump(bin_, t, out, os.path.join(tmp, "b"), os.path.join(tmp, "bd"))
                check(len(a) > 0 and a == b, f"{name}: drafter logits folder vs GGUF differ")
        if bin_:
            weight_types(bin_, tmp, t, os.path.join(tmp, "bf16.gguf"))
        # refusals: a target folder is not a drafter; a drafter with rope scaling
        bad = subprocess.run([sys.executable, os.path.join(SRC, "tools", "drafter_to_gguf.py"), t,
                              t, os.path.join(tmp, "x.gguf")], capture_output=True, text=True)
        check(bad.returncode != 0 and "DFlashDraftModel" in bad.stderr, "a target is refused")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
