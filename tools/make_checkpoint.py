#!/usr/bin/env python3
"""make_checkpoint.py - random-weight Hugging Face checkpoints for tests and benchmarks.

Targets (Llama / Qwen2 / Qwen3 / Mistral dense decoders) with the exact
config.json fields and tensor names Hugging Face uses, and z-lab DFlash
drafters (spec section 1) paired with a target folder.

    make_checkpoint.py --preset qwen3-0.6b --tokenizer T/tokenizer.json --out /tmp/q06
    make_checkpoint.py --arch llama --dim 64 --layers 2 --heads 4 --kv-heads 2 \\
        --ffn 128 --vocab 512 --dtype f32 --rope-scaling llama3 --out /tmp/tiny
    make_checkpoint.py --drafter --target /tmp/q06 --layers 2 --out /tmp/q06-dflash
    make_checkpoint.py --drafter --dflash2 --target /tmp/q06 --layers 2 --block-size 8 \
        --out /tmp/q06-dflash2    # DFlash2DraftModel: conv and candidate selector

Weights are drawn from numpy's default_rng, seeded per (seed, model kind,
tensor index, chunk index), so a given seed gives the same values whatever the
dtype or sharding. Files are written by the safetensors package, which takes
a whole file from memory: a preset needs its file size in RAM (--shard-mb
bounds it). Scales keep activations O(1) through any depth and logits spread
(std about 3) so greedy argmax margins are not all tiny:
    embed, lm_head          N(0, (3/sqrt(dim))^2)
    q, k, v, gate, up, fc   N(0, 1/fan_in)
    o, down                 N(0, 1/(fan_in * 2 * n_layers))   (residual growth bounded)
    norm weights            1 + N(0, 0.05^2);   qwen2 q/k/v biases N(0, 0.2^2)

Sizes (bf16; f32 doubles them): qwen3-0.6b 1.2 GB, qwen3-1.7b 3.4 GB,
llama3-1b 2.5 GB, qwen3-4b 8.0 GB. Speed is about 100-150 MB/s of bf16 on
2 cores (random generation dominates).

Python API (used by tests): make_target(out, **spec) and make_drafter(out,
target_dir, **spec); both return the config dict written. The other tools
read and write safetensors through load_dir / load_file / save here.
"""
import argparse
import concurrent.futures
import json
import math
import os
import re
import shutil
import sys
import time

import gguf
import numpy as np
import safetensors

PRESETS = {
    # name: shapes of the published models (random weights)
    "qwen3-0.6b": dict(arch="qwen3", dim=1024, layers=28, heads=16, kv_heads=8, head_dim=128,
                       ffn=3072, vocab=151936, max_ctx=40960, rope_theta=1e6, eps=1e-6, tied=True),
    "qwen3-1.7b": dict(arch="qwen3", dim=2048, layers=28, heads=16, kv_heads=8, head_dim=128,
                       ffn=6144, vocab=151936, max_ctx=40960, rope_theta=1e6, eps=1e-6, tied=True),
    "qwen3-4b": dict(arch="qwen3", dim=2560, layers=36, heads=32, kv_heads=8, head_dim=128,
                     ffn=9728, vocab=151936, max_ctx=40960, rope_theta=1e6, eps=1e-6, tied=True),
    "llama3-1b": dict(arch="llama", dim=2048, layers=16, heads=32, kv_heads=8, head_dim=64,
                      ffn=8192, vocab=128256, max_ctx=131072, rope_theta=500000.0, eps=1e-5,
                      tied=True, rope_scaling="llama3"),
    "tiny": dict(arch="qwen3", dim=64, layers=4, heads=4, kv_heads=2, head_dim=16, ffn=192,
                 vocab=512, max_ctx=2048, rope_theta=10000.0, eps=1e-6, tied=True),
}

DEFAULTS = dict(arch="qwen3", dim=64, layers=2, heads=4, kv_heads=2, head_dim=None, ffn=None,
                vocab=None, max_ctx=2048, rope_theta=None, eps=None, tied=None,
                rope_scaling="none", rope_factor=None, rope_orig_ctx=None,
                rope_low_freq=1.0, rope_high_freq=4.0, dtype="bf16", seed=0,
                tokenizer=None, shard_mb=0, quiet=False)

ARCH = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "mistral": ("MistralForCausalLM", "mistral"),
}

TORCH_DTYPE = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
ST_DTYPE = {"f32": "F32", "bf16": "BF16", "f16": "F16"}  # safetensors' header names
STORAGE = {"f32": np.float32, "bf16": np.uint16, "f16": np.float16}  # bf16 as bit patterns

CHUNK = 1 << 22  # elements per random chunk (fixed: part of the seeding)


# ---- tokenizer ----------------------------------------------------------------

def tokenizer_size(tok):
    """Number of ids a tokenizer.json defines (max id + 1)."""
    ids = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok.get("added_tokens", [])]
    return max(ids) + 1


def _token_id(tok, content):
    if content is None:
        return None
    if isinstance(content, dict):  # {"content": "<s>", ...} in older configs
        content = content.get("content")
    for t in tok.get("added_tokens", []):
        if t["content"] == content:
            return t["id"]
    return tok["model"]["vocab"].get(content)


def tokenizer_specials(tok, tcfg):
    """(bos_id, eos_id) as config.json states them for this tokenizer.

    eos: the tokenizer config's eos_token. bos: its bos_token, or (Qwen, whose
    bos_token is null) the <|endoftext|> id that Qwen's config.json carries."""
    bos = _token_id(tok, tcfg.get("bos_token"))
    if bos is None:
        bos = _token_id(tok, "<|endoftext|>")
    eos = _token_id(tok, tcfg.get("eos_token"))
    return bos, eos


def read_tokenizer(path):
    """-> (vocab rows as real models allot them, bos_id, eos_id) of a tokenizer.json
    (with the tokenizer_config.json beside it, when there is one)."""
    tok = json.load(open(path))
    tcfg_path = os.path.join(os.path.dirname(os.path.abspath(path)), "tokenizer_config.json")
    tcfg = json.load(open(tcfg_path)) if os.path.exists(tcfg_path) else {}
    bos, eos = tokenizer_specials(tok, tcfg)
    return default_vocab(tokenizer_size(tok)), bos, eos


def copy_tokenizer(path, out):
    """Copies tokenizer.json and tokenizer_config.json from path's folder into out."""
    tdir = os.path.dirname(os.path.abspath(path))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(tdir, f)):
            shutil.copy(os.path.join(tdir, f), os.path.join(out, f))


def default_vocab(tok_size):
    """Embedding rows real models allot to a tokenizer of tok_size ids."""
    if 151643 <= tok_size <= 151936:
        return 151936  # Qwen2 / Qwen2.5 / Qwen3
    return -(-tok_size // 128) * 128  # Llama 3: 128256 stays


def _bytes_to_unicode():
    # GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to 256+n.
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


SYNTH_TEXT = """Once upon a time there was a little robot who lived in a quiet town by the sea.
Every morning the robot walked to the harbour, counted the boats and wrote the numbers
in a small blue notebook. One day the numbers did not add up: there were seven boats
in the water but only six names on the list. The robot asked the fisherman, the baker
and the teacher, and nobody knew where the seventh boat had come from. So it waited on
the pier until the evening, when a girl rowed the boat back to the shore and laughed.
"I built it myself," she said, "from the wood of an old door." The robot added her name
to the notebook, and from then on the numbers always matched. def main(): return 0
for i in range(10): print(i, i * i)  # squares of the first ten numbers
The quick brown fox jumps over the lazy dog; the five boxing wizards jump quickly.
"""

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def synthetic_tokenizer(max_size):
    """A small byte-level BPE tokenizer (GPT-2 alphabet, merges learnt from
    SYNTH_TEXT, three ChatML specials) with at most max_size ids.

    -> (tokenizer.json dict, tokenizer_config.json dict), or None if max_size < 260."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    if max_size < 256 + len(specials) + 1:
        return None
    b2u = _bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    # words with their leading space, as the Split pre-tokenizer cuts them (roughly)
    words = {}
    for w in re.findall(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+", SYNTH_TEXT):
        key = tuple(b2u[b] for b in w.encode())
        words[key] = words.get(key, 0) + 1
    merges = []
    n_merges = max_size - 256 - len(specials) - 1  # leave one free id (a drafter mask)
    while len(merges) < n_merges:
        pairs = {}
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        if pairs[best] < 2:
            break
        merges.append(best)
        vocab[best[0] + best[1]] = len(vocab)
        new = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] = new.get(tuple(out), 0) + c
        words = new
    added = [{"id": len(vocab) + i, "content": s, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for i, s in enumerate(specials)]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_SPLIT}, "behavior": "Isolated", "invert": False},
            bl]},
        "post_processor": bl, "decoder": bl,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": [a + " " + b for a, b in merges]},
    }
    tcfg = {
        "add_bos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added},
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "chat_template": CHATML, "clean_up_tokenization_spaces": False, "errors": "replace",
        "model_max_length": 131072, "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer",
    }
    return tok, tcfg


def load_tokenizer(path):
    """-> (tokenizer.json dict, tokenizer_config.json dict or {}, config path or None)."""
    with open(path, encoding="utf-8") as f:
        tok = json.load(f)
    cpath = os.path.join(os.path.dirname(os.path.abspath(path)), "tokenizer_config.json")
    tcfg = {}
    if os.path.exists(cpath):
        with open(cpath, encoding="utf-8") as f:
            tcfg = json.load(f)
    else:
        cpath = None
    return tok, tcfg, cpath


# ---- specs --------------------------------------------------------------------

def resolve(preset=None, **kw):
    """Fills a target spec: preset values, then explicit ones, then defaults."""
    s = dict(DEFAULTS)
    if preset:
        if preset not in PRESETS:
            raise SystemExit(f"make_checkpoint: unknown preset {preset!r} (have {', '.join(PRESETS)})")
        s.update(PRESETS[preset])
    s.update({k: v for k, v in kw.items() if v is not None})
    if s["arch"] not in ARCH:
        raise SystemExit(f"make_checkpoint: --arch must be one of {', '.join(ARCH)}")
    if s["head_dim"] is None:
        s["head_dim"] = s["dim"] // s["heads"]
    if s["ffn"] is None:
        s["ffn"] = 3 * s["dim"]
    if s["rope_theta"] is None:
        s["rope_theta"] = 500000.0 if s["arch"] == "llama" else 1e6
    if s["eps"] is None:
        s["eps"] = 1e-5 if s["arch"] in ("llama", "mistral") else 1e-6
    if s["tied"] is None:
        s["tied"] = s["arch"] != "mistral"
    if s["heads"] % s["kv_heads"]:
        raise SystemExit("make_checkpoint: --heads must be a multiple of --kv-heads")
    if s["head_dim"] % 2:
        raise SystemExit("make_checkpoint: --head-dim must be even (RoPE pairs)")
    s["rope_dict"] = rope_scaling_dict(s)
    return s


def rope_scaling_dict(s):
    """The config.json rope_scaling of spec s; may raise max_ctx for yarn."""
    kind = s["rope_scaling"]
    if kind in (None, "none"):
        return None
    if kind == "llama3":
        f = s["rope_factor"] or 32.0
        orig = s["rope_orig_ctx"] or min(8192, s["max_ctx"])
        return {"factor": float(f), "high_freq_factor": float(s["rope_high_freq"]),
                "low_freq_factor": float(s["rope_low_freq"]),
                "original_max_position_embeddings": int(orig), "rope_type": "llama3"}
    if kind == "yarn":
        f = s["rope_factor"] or 4.0
        orig = s["rope_orig_ctx"] or s["max_ctx"]
        # Transformers versions disagree on whether `factor` or max_pos/orig wins;
        # keeping max_position_embeddings == factor * orig makes them agree.
        s["max_ctx"] = int(round(f * orig))
        return {"factor": float(f), "original_max_position_embeddings": int(orig), "rope_type": "yarn"}
    if kind == "linear":
        return {"factor": float(s["rope_factor"] or 2.0), "rope_type": "linear"}
    raise SystemExit(f"make_checkpoint: unknown --rope-scaling {kind!r}")


def target_config(s, bos, eos):
    arch_name, model_type = ARCH[s["arch"]]
    c = {
        "architectures": [arch_name],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "head_dim": s["head_dim"],
        "hidden_act": "silu",
        "hidden_size": s["dim"],
        "initializer_range": 0.02,
        "intermediate_size": s["ffn"],
        "max_position_embeddings": s["max_ctx"],
        "model_type": model_type,
        "num_attention_heads": s["heads"],
        "num_hidden_layers": s["layers"],
        "num_key_value_heads": s["kv_heads"],
        "rms_norm_eps": s["eps"],
        "rope_scaling": s["rope_dict"],
        "rope_theta": float(s["rope_theta"]),
        "tie_word_embeddings": bool(s["tied"]),
        "torch_dtype": TORCH_DTYPE[s["dtype"]],
        "transformers_version": "4.51.0",
        "use_cache": True,
        "vocab_size": s["vocab"],
    }
    if s["arch"] == "llama":
        c["mlp_bias"] = False
        c["pretraining_tp"] = 1
    if s["arch"] == "qwen2":
        del c["attention_bias"]  # Qwen2 always has q/k/v biases; its config has no such field
        if s["head_dim"] * s["heads"] == s["dim"]:
            del c["head_dim"]    # as in published Qwen2 configs
        c.update(max_window_layers=s["layers"], sliding_window=s["max_ctx"], use_sliding_window=False)
    if s["arch"] == "qwen3":
        c.update(max_window_layers=s["layers"], sliding_window=None, use_sliding_window=False)
    if s["arch"] == "mistral":
        del c["attention_bias"]
        c["sliding_window"] = None
    w = s.get("sliding_window")
    if w:  # Mistral: every layer; Qwen2/3: 3 sliding layers to 1 full, as Laguna and Gemma
        c["sliding_window"] = w
        if s["arch"] in ("qwen2", "qwen3"):
            c["use_sliding_window"] = True
            c["layer_types"] = ["full_attention" if i % 4 == 0 else "sliding_attention"
                                for i in range(s["layers"])]
    return dict(sorted(c.items()))


def target_tensors(s):
    """[(name, shape, init)] in Hugging Face order; init = (kind, scale)."""
    D, H, KV, hd, F, V, L = (s["dim"], s["heads"], s["kv_heads"], s["head_dim"], s["ffn"],
                             s["vocab"], s["layers"])
    res = 1.0 / math.sqrt(2 * L)
    t = [("model.embed_tokens.weight", (V, D), ("normal", 3.0 / math.sqrt(D)))]
    for i in range(L):
        p = f"model.layers.{i}."
        t += [(p + "self_attn.q_proj.weight", (H * hd, D), ("normal", 1 / math.sqrt(D))),
              (p + "self_attn.k_proj.weight", (KV * hd, D), ("normal", 1 / math.sqrt(D))),
              (p + "self_attn.v_proj.weight", (KV * hd, D), ("normal", 1 / math.sqrt(D))),
              (p + "self_attn.o_proj.weight", (D, H * hd), ("normal", res / math.sqrt(H * hd)))]
        if s["arch"] == "qwen2":
            t += [(p + "self_attn.q_proj.bias", (H * hd,), ("normal", 0.2)),
                  (p + "self_attn.k_proj.bias", (KV * hd,), ("normal", 0.2)),
                  (p + "self_attn.v_proj.bias", (KV * hd,), ("normal", 0.2))]
        if s["arch"] == "qwen3":
            t += [(p + "self_attn.q_norm.weight", (hd,), ("norm", 0.05)),
                  (p + "self_attn.k_norm.weight", (hd,), ("norm", 0.05))]
        t += [(p + "mlp.gate_proj.weight", (F, D), ("normal", 1 / math.sqrt(D))),
              (p + "mlp.up_proj.weight", (F, D), ("normal", 1 / math.sqrt(D))),
              (p + "mlp.down_proj.weight", (D, F), ("normal", res / math.sqrt(F))),
              (p + "input_layernorm.weight", (D,), ("norm", 0.05)),
              (p + "post_attention_layernorm.weight", (D,), ("norm", 0.05))]
    t.append(("model.norm.weight", (D,), ("norm", 0.05)))
    if not s["tied"]:
        t.append(("lm_head.weight", (V, D), ("normal", 3.0 / math.sqrt(D))))
    return t


# ---- writing ------------------------------------------------------------------

def _chunk(seed, kind, ti, ci, n, init):
    """Chunk ci of tensor ti: n float32 values (deterministic per seed)."""
    rng = np.random.default_rng([seed, kind, ti, ci])
    x = rng.standard_normal(n, dtype=np.float32)
    how, scale = init
    x *= np.float32(scale)
    if how == "norm":
        x += np.float32(1.0)
    return x


class Progress:
    def __init__(self, total, quiet):
        self.total, self.done, self.quiet = total, 0, quiet or total < (64 << 20)
        self.t0 = self.last = time.time()

    def add(self, n):
        self.done += n
        now = time.time()
        if not self.quiet and (now - self.last > 2 or self.done == self.total):
            self.last = now
            rate = self.done / max(now - self.t0, 1e-9) / 1e6
            print(f"make_checkpoint: {self.done / 1e9:.2f} / {self.total / 1e9:.2f} GB "
                  f"({100 * self.done / self.total:.0f}%), {rate:.0f} MB/s", file=sys.stderr, flush=True)


# ---- safetensors files (the safetensors package) ---------------------------------
# numpy has no bfloat16, so safetensors' numpy API refuses BF16 tensors both ways
# ("data type 'bfloat16' not understood"). BF16 is written from uint16 bit patterns
# through safetensors.TensorSpec (what safetensors.numpy.save_file builds, with the
# dtype name numpy cannot spell) and read back through torch, widened exactly.

def encode(a, dtype):
    """float array -> storage array of dtype (f32, f16, or bf16 as uint16 bit patterns).
    f16 and bf16 round to nearest even (bf16 by gguf.quants, llama.cpp's rounding)."""
    a = np.asarray(a, dtype=np.float32)
    if dtype == "bf16":
        return gguf.quants.quantize(a, gguf.GGMLQuantizationType.BF16).view(np.uint16)
    return a.astype(STORAGE[dtype])


def save_file(path, tensors, dtype):
    """Writes {name: storage array of dtype} (encode's output) as one .safetensors file."""
    arrs = {k: np.ascontiguousarray(v) for k, v in tensors.items()}  # alive while it writes
    specs = {k: safetensors.TensorSpec(dtype=TORCH_DTYPE[dtype], shape=list(a.shape),
                                       data_ptr=a.ctypes.data, data_len=a.nbytes)
             for k, a in arrs.items()}
    safetensors.serialize_file(specs, path, metadata={"format": "pt"})


def save(path, tensors, dtype="f32"):
    """Writes {name: float array} rounded to dtype (f32, f16, bf16) as one file."""
    save_file(path, {k: encode(v, dtype) for k, v in tensors.items()}, dtype)


def file_tensors(path):
    """[(name, safetensors dtype, shape)] of one .safetensors file, in file order."""
    with safetensors.safe_open(path, framework="np") as f:
        return [(k, s.get_dtype(), tuple(s.get_shape()))
                for k in f.offset_keys() for s in [f.get_slice(k)]]


def load_file(path, names=None):
    """{name: array} of one .safetensors file (or just names), in file order; F16 and
    BF16 come back as float32 (exact), other types as stored. Memory-mapped, so a few
    names of a big file are cheap."""
    index = [t for t in file_tensors(path) if names is None or t[0] in names]
    out = {}
    with safetensors.safe_open(path, framework="np") as f:
        for k, dt, _ in index:
            if dt != "BF16":
                a = f.get_tensor(k)
                out[k] = a.astype(np.float32) if dt == "F16" else a
    if len(out) < len(index):
        import torch  # noqa: F401  (safe_open's "pt" framework)
        with safetensors.safe_open(path, framework="pt") as f:
            for k, dt, _ in index:
                if dt == "BF16":
                    out[k] = f.get_tensor(k).float().numpy()
    return {k: out[k] for k, _, _ in index}


def checkpoint_files(d):
    """The .safetensors files of a Hugging Face folder (sharded or not)."""
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(x for x in os.listdir(d) if x.endswith(".safetensors"))
    return [os.path.join(d, x) for x in files]


def load_dir(d):
    """Every tensor of a Hugging Face folder (load_file's types)."""
    out = {}
    for p in checkpoint_files(d):
        out.update(load_file(p))
    return out


# ---- writing checkpoints ---------------------------------------------------------

def write_tensors(out, tensors, dtype, seed, kind, shard_mb=0, prefix="", quiet=False):
    """Writes tensors (from target_tensors / drafter_tensors) as safetensors.

    One model.safetensors, or shards of about shard_mb MB plus
    model.safetensors.index.json like Hugging Face's. The safetensors package
    writes a file from memory, so each file (shard) is built whole first."""
    item = np.dtype(STORAGE[dtype]).itemsize
    # 1-D tensors (norms, biases) stay in the chosen dtype too, as HF saves them.
    specs = [(prefix + name, shape, init, ti) for ti, (name, shape, init) in enumerate(tensors)]
    nbytes = [int(np.prod(s[1])) * item for s in specs]
    total = sum(nbytes)
    shards, cur, size = [], [], 0
    limit = int(shard_mb * (1 << 20)) if shard_mb else None
    for sp, nb in zip(specs, nbytes):
        if limit and cur and size + nb > limit:
            shards.append(cur)
            cur, size = [], 0
        cur.append(sp)
        size += nb
    shards.append(cur)
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    prog = Progress(total, quiet)
    workers = max(1, min(4, os.cpu_count() or 1))

    # numpy's rng and ufuncs release the GIL: chunks are made on a few threads, each
    # into its own slice of the tensor
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        for fname, shard in zip(names, shards):
            arrs = {name: np.empty(int(np.prod(shape)), STORAGE[dtype])
                    for name, shape, _, _ in shard}

            def make(job):
                name, ti, ci, init = job
                dst = arrs[name][ci * CHUNK:(ci + 1) * CHUNK]
                dst[:] = encode(_chunk(seed, kind, ti, ci, dst.size, init), dtype)
                return dst.nbytes

            jobs = [(name, ti, ci, init) for name, shape, init, ti in shard
                    for ci in range(-(-int(np.prod(shape)) // CHUNK))]
            for nb in pool.map(make, jobs):
                prog.add(nb)
            save_file(os.path.join(out, fname),
                      {name: arrs[name].reshape(shape) for name, shape, _, _ in shard}, dtype)
    if len(shards) > 1:
        wm = {sp[0]: fn for fn, shard in zip(names, shards) for sp in shard}
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)
            f.write("\n")
    return total


def _write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def make_target(out, preset=None, **kw):
    """Writes a random target checkpoint folder; returns its config dict.

    kw: arch, dim, layers, heads, kv_heads, head_dim, ffn, vocab, max_ctx,
    rope_theta, eps, tied, rope_scaling (none|llama3|yarn|linear), rope_factor,
    rope_orig_ctx, rope_low_freq, rope_high_freq, sliding_window, dtype (f32|bf16|f16), seed,
    tokenizer (path to tokenizer.json, "synthetic", or "none"), shard_mb, quiet."""
    s = resolve(preset, **kw)
    os.makedirs(out, exist_ok=True)
    tok = tcfg = None
    tokp = s["tokenizer"]
    if tokp and tokp not in ("none", "synthetic"):
        tok, tcfg, cpath = load_tokenizer(tokp)
        size = tokenizer_size(tok)
        if s["vocab"] is None:
            s["vocab"] = default_vocab(size)
        if s["vocab"] < size:
            raise SystemExit(f"make_checkpoint: --vocab {s['vocab']} is smaller than the tokenizer's "
                             f"{size} ids ({tokp})")
        shutil.copyfile(tokp, os.path.join(out, "tokenizer.json"))
        if cpath:
            shutil.copyfile(cpath, os.path.join(out, "tokenizer_config.json"))
    if s["vocab"] is None:
        s["vocab"] = 512
    if tok is None and tokp != "none":
        synth = synthetic_tokenizer(s["vocab"])
        if synth:
            tok, tcfg = synth
            _write_json(os.path.join(out, "tokenizer.json"), tok)
            _write_json(os.path.join(out, "tokenizer_config.json"), tcfg)
    if tok is not None:
        bos, eos = tokenizer_specials(tok, tcfg)
    else:
        bos, eos = (1, 2) if s["vocab"] > 2 else (None, None)
    cfg = target_config(s, bos, eos)
    _write_json(os.path.join(out, "config.json"), cfg)
    _write_json(os.path.join(out, "generation_config.json"),
                {"bos_token_id": bos, "eos_token_id": eos, "do_sample": False})
    total = write_tensors(out, target_tensors(s), s["dtype"], s["seed"], 0, s["shard_mb"],
                          quiet=s["quiet"])
    if not s["quiet"]:
        print(f"make_checkpoint: wrote {out} ({cfg['model_type']}, {total / 1e6:.1f} MB "
              f"{s['dtype']})", file=sys.stderr)
    return cfg


# ---- drafter ------------------------------------------------------------------

def build_target_layer_ids(n_target, n_draft):
    """z-lab's default capture layers; spread evenly when the target is too shallow."""
    if n_draft == 1:
        ids = [n_target // 2]
    else:
        ids = [int(round(1 + i * (n_target - 4) / (n_draft - 1))) for i in range(n_draft)]
    if len(set(ids)) != len(ids) or max(ids) >= n_target or min(ids) < 0:
        hi = max(n_target - 2, 0)
        ids = sorted(set(int(round(i * hi / max(n_draft - 1, 1))) for i in range(n_draft)))
    return ids


def drafter_config(tc, d):
    """z-lab's drafter config: rope_theta, eps, max positions (and rope_scaling,
    unless d["rope"] == "none") as the target's."""
    c = {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": d["block_size"],
        "bos_token_id": tc.get("bos_token_id"),
        "dflash_config": {"mask_token_id": d["mask_id"], "target_layer_ids": d["target_layer_ids"]},
        "eos_token_id": tc.get("eos_token_id"),
        "head_dim": d["head_dim"],
        "hidden_act": "silu",
        "hidden_size": tc["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": d["ffn"],
        "layer_types": ["full_attention"] * d["layers"],
        "max_position_embeddings": tc["max_position_embeddings"],
        "max_window_layers": d["layers"],
        "model_type": "qwen3",
        "num_attention_heads": d["heads"],
        "num_hidden_layers": d["layers"],
        "num_key_value_heads": d["kv_heads"],
        "num_target_layers": tc["num_hidden_layers"],
        "rms_norm_eps": tc["rms_norm_eps"],
        "rope_scaling": tc.get("rope_scaling") if d["rope"] == "target" else None,
        "rope_theta": tc.get("rope_theta") or (tc.get("rope_parameters") or {}).get("rope_theta",
                                                                                  10000.0),
        "sliding_window": None,
        "tie_word_embeddings": tc.get("tie_word_embeddings", True),
        "torch_dtype": TORCH_DTYPE[d["dtype"]],
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": tc["vocab_size"],
    }
    if d.get("dflash2"):
        # SpecForge's DFlash2DraftModel export (the names SGLang loads)
        c["architectures"] = ["DFlash2DraftModel"]
        c["auto_map"] = {"AutoModel": "dflash2.DFlash2DraftModel"}
        c["dflash_config"].update(d["dflash2"])
    return c


def dflash2_tensors(D, d):
    """DFlash2's tensors past z-lab's: per layer attention_conv and mlp_conv
    (base_kernel [2, K, D], kernel_projection [2*K*D/group, D]), and the
    candidate selector (codebooks [V, r] without a .weight suffix)."""
    x = d["dflash2"]
    K, G, r, V = x["conv_kernel_size"], D // x["conv_group_size"], x["selector_rank"], d["vocab"]
    t = []
    for i in range(d["layers"]):
        for conv in ("attention_conv", "mlp_conv"):
            p = f"layers.{i}.{conv}."
            t += [(p + "base_kernel", (2, K, D), ("normal", 0.5)),
                  (p + "kernel_projection.weight", (2 * K * G, D), ("normal", 0.5 / math.sqrt(D)))]
    return t + [("candidate_selector.hidden_projection.weight", (r, D), ("normal", 1 / math.sqrt(D))),
                ("candidate_selector.predecessor_codebook", (V, r), ("normal", 1.0)),
                ("candidate_selector.successor_codebook", (V, r), ("normal", 1.0))]


def drafter_tensors(D, d):
    H, KV, hd, F, L, K = d["heads"], d["kv_heads"], d["head_dim"], d["ffn"], d["layers"], \
        len(d["target_layer_ids"])
    res = 1.0 / math.sqrt(2 * L)
    t = [("fc.weight", (D, K * D), ("normal", 1 / math.sqrt(K * D))),
         ("hidden_norm.weight", (D,), ("norm", 0.05))]
    for i in range(L):
        p = f"layers.{i}."
        t += [(p + "input_layernorm.weight", (D,), ("norm", 0.05)),
              (p + "post_attention_layernorm.weight", (D,), ("norm", 0.05)),
              (p + "self_attn.q_proj.weight", (H * hd, D), ("normal", 1 / math.sqrt(D))),
              (p + "self_attn.k_proj.weight", (KV * hd, D), ("normal", 1 / math.sqrt(D))),
              (p + "self_attn.v_proj.weight", (KV * hd, D), ("normal", 1 / math.sqrt(D))),
              (p + "self_attn.o_proj.weight", (D, H * hd), ("normal", res / math.sqrt(H * hd))),
              (p + "self_attn.q_norm.weight", (hd,), ("norm", 0.05)),
              (p + "self_attn.k_norm.weight", (hd,), ("norm", 0.05)),
              (p + "mlp.gate_proj.weight", (F, D), ("normal", 1 / math.sqrt(D))),
              (p + "mlp.up_proj.weight", (F, D), ("normal", 1 / math.sqrt(D))),
              (p + "mlp.down_proj.weight", (D, F), ("normal", res / math.sqrt(F)))]
    t.append(("norm.weight", (D,), ("norm", 0.05)))
    return t + (dflash2_tensors(D, d) if d.get("dflash2") else [])


def default_mask_id(target_dir, vocab):
    """First id past the tokenizer (z-lab's <|MASK|> slot), else the last
    reserved special token, else vocab - 1."""
    p = os.path.join(target_dir, "tokenizer.json")
    if os.path.exists(p):
        with open(p, encoding="utf-8") as f:
            tok = json.load(f)
        size = tokenizer_size(tok)
        if size < vocab:
            return size
        reserved = [t["id"] for t in tok.get("added_tokens", []) if "reserved" in t["content"]]
        if reserved:
            return max(reserved)
        raise SystemExit(f"make_checkpoint: the tokenizer fills all {vocab} ids; pass --mask-id")
    return vocab - 1


def make_drafter(out, target_dir, layers=None, heads=None, kv_heads=None, head_dim=None, ffn=None,
                 block_size=16, target_layer_ids=None, mask_id=None, dtype="bf16", seed=0,
                 prefix_model=False, shard_mb=0, quiet=False, rope="target", dflash2=None):
    """Writes a random z-lab DFlash drafter paired with target_dir; returns its config.
    dflash2: {conv_kernel_size, conv_group_size, selector_rank, selector_top_k}
    makes it a DFlash2DraftModel."""
    with open(os.path.join(target_dir, "config.json")) as f:
        tc = json.load(f)
    tc = tc.get("text_config", tc)   # a multimodal target (Qwen3.5) keeps its text model there
    D, N = tc["hidden_size"], tc["num_hidden_layers"]
    H = heads or tc["num_attention_heads"]
    d = dict(layers=layers or min(5, max(1, N // 2)), heads=H,
             kv_heads=kv_heads or tc.get("num_key_value_heads", H),
             head_dim=head_dim or tc.get("head_dim") or D // tc["num_attention_heads"],
             ffn=ffn or tc["intermediate_size"], block_size=block_size, dtype=dtype, rope=rope,
             dflash2=dflash2, vocab=tc["vocab_size"])
    if rope not in ("target", "none"):
        raise SystemExit("make_checkpoint: --drafter-rope must be target or none")
    if d["heads"] % d["kv_heads"]:
        raise SystemExit("make_checkpoint: drafter heads must be a multiple of kv heads")
    d["target_layer_ids"] = list(target_layer_ids) if target_layer_ids else \
        build_target_layer_ids(N, d["layers"])
    if any(i < 0 or i >= N for i in d["target_layer_ids"]):
        raise SystemExit(f"make_checkpoint: target layer ids must be in 0..{N - 1}")
    d["mask_id"] = mask_id if mask_id is not None else default_mask_id(target_dir, tc["vocab_size"])
    if not 0 <= d["mask_id"] < tc["vocab_size"]:
        raise SystemExit(f"make_checkpoint: mask id {d['mask_id']} outside the vocabulary "
                         f"(0..{tc['vocab_size'] - 1})")
    os.makedirs(out, exist_ok=True)
    cfg = drafter_config(tc, d)
    _write_json(os.path.join(out, "config.json"), cfg)
    total = write_tensors(out, drafter_tensors(D, d), dtype, seed, 1, shard_mb,
                          prefix="model." if prefix_model else "", quiet=quiet)
    if not quiet:
        print(f"make_checkpoint: wrote drafter {out} ({d['layers']} layers, block {block_size}, "
              f"layers {d['target_layer_ids']}, mask {d['mask_id']}, {total / 1e6:.1f} MB {dtype})",
              file=sys.stderr)
    return cfg


# ---- command line -------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--preset", choices=sorted(PRESETS))
    ap.add_argument("--arch", choices=sorted(ARCH))
    ap.add_argument("--dim", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--head-dim", type=int)
    ap.add_argument("--ffn", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--max-ctx", type=int)
    ap.add_argument("--rope-theta", type=float)
    ap.add_argument("--eps", type=float)
    ap.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="bf16")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--tied", dest="tied", action="store_true", default=None)
    g.add_argument("--untied", dest="tied", action="store_false")
    ap.add_argument("--rope-scaling", choices=["none", "llama3", "yarn", "linear"])
    ap.add_argument("--rope-factor", type=float)
    ap.add_argument("--rope-orig-ctx", type=int)
    ap.add_argument("--rope-low-freq", type=float)
    ap.add_argument("--rope-high-freq", type=float)
    ap.add_argument("--sliding-window", type=int,
                    help="keys a sliding layer attends (mistral: every layer; qwen2/3: all but "
                         "every 4th)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", help="tokenizer.json to copy (with tokenizer_config.json beside "
                    "it); 'synthetic' (default: a small byte-level BPE) or 'none'")
    ap.add_argument("--shard-mb", type=float, default=0, help="split into shards of about N MB")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--drafter", action="store_true", help="write a DFlash drafter for --target")
    ap.add_argument("--target", help="the target folder a drafter pairs with")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--target-layer-ids", help="comma-separated capture layers (default z-lab's)")
    ap.add_argument("--mask-id", type=int)
    ap.add_argument("--prefix-model", action="store_true", help="drafter keys start with 'model.'")
    ap.add_argument("--drafter-rope", choices=["target", "none"], default="target",
                    help="drafter rope_scaling: copy the target's (default) or none")
    ap.add_argument("--dflash2", action="store_true",
                    help="a DFlash2DraftModel (grouped dynamic conv, candidate selector)")
    ap.add_argument("--conv-kernel-size", type=int, default=2)
    ap.add_argument("--conv-group-size", type=int, default=16)
    ap.add_argument("--selector-rank", type=int, default=256)
    ap.add_argument("--selector-top-k", type=int, default=16)
    a = ap.parse_args(argv)
    if a.drafter:
        if not a.target:
            ap.error("--drafter needs --target DIR")
        ids = [int(x) for x in a.target_layer_ids.split(",")] if a.target_layer_ids else None
        make_drafter(a.out, a.target, layers=a.layers, heads=a.heads, kv_heads=a.kv_heads,
                     head_dim=a.head_dim, ffn=a.ffn, block_size=a.block_size, target_layer_ids=ids,
                     mask_id=a.mask_id, dtype=a.dtype, seed=a.seed, prefix_model=a.prefix_model,
                     shard_mb=a.shard_mb, quiet=a.quiet, rope=a.drafter_rope,
                     dflash2=dict(conv_kernel_size=a.conv_kernel_size,
                                  conv_group_size=a.conv_group_size,
                                  selector_rank=a.selector_rank,
                                  selector_top_k=a.selector_top_k) if a.dflash2 else None)
        return 0
    kw = {k: getattr(a, k) for k in ("arch", "dim", "layers", "heads", "kv_heads", "head_dim", "ffn",
                                     "vocab", "max_ctx", "rope_theta", "eps", "tied", "rope_scaling",
                                     "rope_factor", "rope_orig_ctx", "rope_low_freq", "rope_high_freq",
                                     "sliding_window", "dtype", "seed", "tokenizer", "shard_mb",
                                     "quiet")}
    make_target(a.out, a.preset, **kw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
