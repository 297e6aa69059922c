#!/usr/bin/env python3
"""test_gguf_vs_hf.py - one model, two files: the engine must not care.

Random checkpoints of each architecture are converted with tools/hf_to_gguf.py
(llama.cpp's conventions: q/k rows permuted into Meta's interleaved RoPE order
for arch llama, Llama 3 rope factors as rope_freqs.weight, rope.scaling.* keys,
gpt2 tokenizer metadata). Then:
1. without the engine: the GGUF tensors, run through the numpy reference with
   interleaved RoPE (llama) or rotate-half (qwen), give the Hugging Face
   logits; rope_freqs divides inv_freq into transformers' llama3 frequencies;
   metadata and tokenizer arrays hold what llama.cpp's converter writes;
2. with the engine: `dflash dump` of the folder and of the .gguf give
   bit-identical logits and features (f32 weights, and bf16 kept as bf16).
   This catches RoPE layout / permutation and metadata-mapping bugs.

Without $DFLASH_BIN part 2 is skipped, unless CI=true (then it fails, as do
missing tokenizer assets).
"""
import os
import sys
import tempfile
import time

import gguf
import numpy as np

SRC = os.environ.get("DFLASH_SRC") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("DFLASH_SHARED") or os.path.join(os.path.dirname(SRC), "shared")
sys.path.insert(0, os.path.join(SRC, "tools"))
import dumpcmp  # noqa: E402
import hf_to_gguf  # noqa: E402
import make_checkpoint as mc  # noqa: E402
import reference as R  # noqa: E402
from testlib import CI, check, finish, missing  # noqa: E402

LLAMA_BIT_EXACT = True  # the engine un-permutes llama q/k rows at load


BASE = dict(dim=64, layers=3, ffn=96, vocab=384, max_ctx=256, rope_theta=10000.0, dtype="f32",
            quiet=True)

CASES = [  # (name, make_target kwargs, tokenizer asset or None)
    ("llama-gqa2-hd24-untied", dict(arch="llama", heads=4, kv_heads=2, head_dim=24, tied=False), None),
    ("llama-llama3-gqa4", dict(arch="llama", heads=8, kv_heads=2, rope_scaling="llama3",
                               rope_factor=4.0, rope_orig_ctx=32), None),
    ("mistral-linear-mha", dict(arch="mistral", heads=4, kv_heads=4, rope_scaling="linear",
                                rope_factor=2.0), None),
    ("qwen2-bias", dict(arch="qwen2", heads=4, kv_heads=2), None),
    ("qwen3-qknorm-hd32", dict(arch="qwen3", heads=4, kv_heads=2, head_dim=32), None),
    ("qwen3-yarn", dict(arch="qwen3", heads=4, kv_heads=1, rope_scaling="yarn", rope_factor=4.0,
                        rope_orig_ctx=32), None),
    ("qwen3-bf16", dict(arch="qwen3", heads=4, kv_heads=2, dtype="bf16"), None),
    ("llama-bf16-gqa2", dict(arch="llama", heads=4, kv_heads=2, dtype="bf16", tied=False), None),
    ("qwen3-tok", dict(arch="qwen3", dim=16, layers=2, heads=2, kv_heads=1, ffn=32, vocab=None),
     "qwen3"),
    ("llama3-tok", dict(arch="llama", dim=16, layers=2, heads=2, kv_heads=1, ffn=32, vocab=None,
                        rope_scaling="llama3", rope_factor=32.0, rope_orig_ctx=8192,
                        rope_theta=500000.0), "llama3"),
]


def hf_weights_from_gguf(tensors):
    """GGUF tensors renamed back to Hugging Face names (data untouched)."""
    out = {}
    for name, a in tensors.items():
        if name == "token_embd.weight":
            out["model.embed_tokens.weight"] = a
        elif name == "output_norm.weight":
            out["model.norm.weight"] = a
        elif name == "output.weight":
            out["lm_head.weight"] = a
        elif name.startswith("blk."):
            _, i, rest = name.split(".", 2)
            for hf, g in hf_to_gguf.LAYER_NAMES.items():
                if g == rest:
                    out[f"model.layers.{i}.{hf}"] = a
    return {k: v.astype(np.float64) for k, v in out.items()}


def read_gguf(path):
    """-> ({key: value}, {name: float32 array}) through gguf's own GGUFReader."""
    r = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return meta, {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in r.tensors}


def check_file(name, d, path, cfg):
    meta, tensors = read_gguf(path)
    arch = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}[cfg["model_type"]]
    dm = R.dims(cfg)
    want = {
        "general.architecture": arch, f"{arch}.block_count": dm["layers"],
        f"{arch}.embedding_length": dm["dim"], f"{arch}.feed_forward_length": dm["ffn"],
        f"{arch}.attention.head_count": dm["heads"], f"{arch}.attention.head_count_kv": dm["kv_heads"],
        f"{arch}.attention.key_length": dm["head_dim"], f"{arch}.attention.value_length": dm["head_dim"],
        f"{arch}.context_length": cfg["max_position_embeddings"],
        f"{arch}.rope.dimension_count": dm["head_dim"],
        "tokenizer.ggml.model": "gpt2",
    }
    for k, v in want.items():
        check(meta.get(k) == v, f"{name}: {k} = {meta.get(k)!r}, expected {v!r}")
    check(np.float32(meta[f"{arch}.rope.freq_base"]) == np.float32(cfg["rope_theta"]) and
          np.float32(meta[f"{arch}.attention.layer_norm_rms_epsilon"]) == np.float32(cfg["rms_norm_eps"]),
          f"{name}: rope.freq_base, rms epsilon")
    rs = cfg.get("rope_scaling") or {}
    if rs.get("rope_type") in ("linear", "yarn"):
        check(meta.get(f"{arch}.rope.scaling.type") == rs["rope_type"] and
              meta.get(f"{arch}.rope.scaling.factor") == rs["factor"], f"{name}: rope.scaling keys")
    if rs.get("rope_type") == "yarn":
        check(meta.get(f"{arch}.rope.scaling.original_context_length") ==
              rs["original_max_position_embeddings"], f"{name}: yarn original context")
    check(("output.weight" in tensors) == (not dm["tied"]), f"{name}: output.weight iff untied")
    if rs.get("rope_type") == "llama3":
        inv, _ = R.rope_params(cfg)
        base = 1.0 / float(cfg["rope_theta"]) ** (np.arange(0, dm["head_dim"], 2) / dm["head_dim"])
        got = base / tensors["rope_freqs.weight"].astype(np.float64)
        check(np.allclose(got, inv, rtol=1e-6), f"{name}: rope_freqs gives transformers' llama3 inv_freq")
    else:
        check("rope_freqs.weight" not in tensors, f"{name}: no rope_freqs without llama3 scaling")
    check(meta["tokenizer.ggml.bos_token_id"] == cfg["bos_token_id"] and
          meta["tokenizer.ggml.eos_token_id"] == cfg["eos_token_id"], f"{name}: bos/eos ids")
    toks, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    check(len(toks) == len(types) == dm["vocab"], f"{name}: {len(toks)} tokens for vocab {dm['vocab']}")
    # the numbers: GGUF weights through the matching RoPE == the HF forward
    W = hf_weights_from_gguf(tensors)
    _, Whf = R.load(d)
    ids = np.random.default_rng(3).integers(0, dm["vocab"], 16).tolist()
    ref, _ = R.forward(cfg, Whf, ids)
    got, _ = R.forward(cfg, W, ids, interleaved=(arch == "llama"))
    tol = 1e-9 * max(1.0, np.abs(ref).max())
    check(np.abs(got - ref).max() <= tol, f"{name}: GGUF weights + {'interleaved' if arch == 'llama' else 'rotate-half'} "
          f"RoPE reproduce the HF logits (max diff {np.abs(got - ref).max():.3g})")
    if arch == "llama":
        plain, _ = R.forward(cfg, W, ids)
        check(np.abs(plain - ref).max() > 1e-3, f"{name}: the permutation matters (sanity)")
    return meta, tensors


def check_tokenizer(name, meta, tokdir):
    import json
    tok = json.load(open(os.path.join(tokdir, "tokenizer.json"), encoding="utf-8"))
    toks, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    size = mc.tokenizer_size(tok)
    check(all(toks[i] == t for t, i in tok["model"]["vocab"].items()), f"{name}: BPE tokens by id")
    added = {t["id"]: t for t in tok["added_tokens"]}
    check(all(toks[i] == t["content"] for i, t in added.items()), f"{name}: added tokens by id")
    check(all(types[i] == 1 for i in tok["model"]["vocab"].values() if i not in added),
          f"{name}: BPE tokens are NORMAL")
    check(all(types[i] == (3 if t["special"] or t["content"].startswith("<|") else 4)
              for i, t in added.items()), f"{name}: added tokens CONTROL / USER_DEFINED")
    check(all(toks[i] == f"[PAD{i}]" and types[i] == 5 for i in range(size, len(toks))),
          f"{name}: padding tokens [PADn] UNUSED")
    m = tok["model"]["merges"]
    check(meta["tokenizer.ggml.merges"] == [x if isinstance(x, str) else " ".join(x) for x in m],
          f"{name}: merges")
    pre = {"qwen3": "qwen2", "llama3": "llama-bpe"}[name.split("-")[0]]
    check(meta["tokenizer.ggml.pre"] == pre, f"{name}: pre = {meta['tokenizer.ggml.pre']}")
    if name.startswith("qwen3"):
        check(types[151667] == 4 and types[151645] == 3, f"{name}: <think> USER_DEFINED, <|im_end|> CONTROL")
        check(meta["tokenizer.ggml.add_bos_token"] is False, f"{name}: Qwen adds no BOS")
        check("tokenizer.chat_template" in meta, f"{name}: chat template carried")


def test_engine(name, d, path, cfg, binary):
    """Qwen files hold the same rows in the same order: bit-identical. A llama
    GGUF holds q/k rows in interleaved order, so an engine that runs RoPE in
    that layout sums q.k over the head dims in another order: the single-row
    case (softmax over one key is exactly 1) stays bit-identical, longer ones
    agree to rounding (rel 1e-5; a RoPE layout bug is O(1)). Set
    LLAMA_BIT_EXACT once the engine un-permutes llama q/k rows at load."""
    dm = R.dims(cfg)
    cap = [0, dm["layers"] - 1]
    exact = cfg["model_type"] not in ("llama", "mistral") or LLAMA_BIT_EXACT
    for n in (1, 9):
        ids = np.random.default_rng(n).integers(0, dm["vocab"], n).tolist()
        try:
            a = dumpcmp.run_dump(binary, d, ids, dm["vocab"], dm["dim"], cap)
            b = dumpcmp.run_dump(binary, path, ids, dm["vocab"], dm["dim"], cap)
        except Exception as e:  # noqa: BLE001
            check(False, f"{name}: dump n={n}: {e}")
            continue
        for what, x, y in zip(("logits", "features"), a, b):
            diff = np.abs(x - y).max()
            if exact or n == 1:
                check(np.array_equal(x.view(np.uint32), y.view(np.uint32)),
                      f"{name}: n={n} {what} bit-identical from HF and GGUF (max diff {diff:.3g})")
            else:
                ok, msg = dumpcmp.compare(x, y, rel=1e-5)
                check(ok, f"{name}: n={n} {what} from HF and GGUF agree to rounding: {msg}")


def main():
    t0 = time.time()
    binary = dumpcmp.find_bin()
    if not binary:
        missing("the dflash binary ($DFLASH_BIN)")
    with tempfile.TemporaryDirectory(prefix="test_gguf_vs_hf-") as tmp:
        for i, (name, kw, tokname) in enumerate(CASES):
            d = os.path.join(tmp, name)
            args = dict(BASE, **kw)
            if tokname:
                tokdir = os.path.join(SHARED, "assets", "tokenizers", tokname)
                if not os.path.exists(os.path.join(tokdir, "tokenizer.json")):
                    missing(f"tokenizer asset {tokdir}")
                    continue
                args["tokenizer"] = os.path.join(tokdir, "tokenizer.json")
            cfg = mc.make_target(d, seed=30 + i, **args)
            path = d + ".gguf"
            hf_to_gguf.convert(d, path, "auto", quiet=True)
            meta, _ = check_file(name, d, path, cfg)
            if tokname:
                check_tokenizer(name, meta, tokdir)
            if binary:
                test_engine(name, d, path, cfg, binary)
    print(f"test_gguf_vs_hf: {time.time() - t0:.1f} s")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
