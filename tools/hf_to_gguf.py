#!/usr/bin/python3
"""hf_to_gguf.py - converts a Hugging Face Llama / Mistral / Qwen2 / Qwen3 folder to GGUF.

    hf_to_gguf.py HF_DIR OUT.gguf [--outtype auto|f32|f16|bf16]

Follows llama.cpp's conventions so the result is the file llama.cpp's own
converter would make (float types only):
- architecture "llama" (Llama, Mistral), "qwen2" or "qwen3";
- tensor names token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v,
  attn_output, attn_q_norm, attn_k_norm, ffn_norm, ffn_gate, ffn_up,
  ffn_down}, output_norm, output (absent when tied); q/k/v biases as
  blk.N.attn_{q,k,v}.bias;
- arch "llama" uses Meta's interleaved RoPE, so the rows of attn_q (and
  attn_k, with the KV head count) are permuted within each head from
  Hugging Face's rotate-half order (i, i + hd/2) into adjacent pairs
  (2i, 2i + 1): w.reshape(heads, 2, hd/2, cols).swapaxes(1, 2); Qwen stays
  rotate-half (NeoX) and unpermuted;
- Llama 3 rope scaling becomes the tensor rope_freqs.weight (hd/2 divisors
  of the frequencies); linear and yarn become rope.scaling.* keys;
- 1-D tensors (norms, biases) stay F32; matrices take --outtype;
- tokenizer: byte-level BPE from tokenizer.json as "gpt2", the vocabulary
  padded to vocab_size with [PADn] tokens (type UNUSED), added tokens CONTROL
  when special (or shaped like <|...|>) else USER_DEFINED, merges as "a b".
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_writer as gw  # noqa: E402
import st  # noqa: E402

ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
FILE_TYPE = {gw.GGML_F32: 0, gw.GGML_F16: 1, gw.GGML_BF16: 32}  # general.file_type
ST_TO_GGML = {"F32": gw.GGML_F32, "F16": gw.GGML_F16, "BF16": gw.GGML_BF16}
TOK_NORMAL, TOK_CONTROL, TOK_USER, TOK_UNUSED = 1, 3, 4, 5

LAYER_NAMES = {
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}


def gguf_name(hf):
    """Hugging Face tensor name -> GGUF name (None: not converted)."""
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in LAYER_NAMES:
        return f"blk.{int(parts[2])}.{LAYER_NAMES[parts[3]]}"
    return None


def permute_rows(w, n_head):
    """Rotate-half row order -> interleaved pairs, per head (rows = n_head * hd)."""
    shape = w.shape
    return w.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def llama3_rope_factors(cfg, hd):
    """Per-frequency divisors equivalent to transformers' llama3 inv_freq."""
    rs = cfg["rope_scaling"]
    base = float(cfg.get("rope_theta", 10000.0))
    factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old = float(rs["original_max_position_embeddings"])
    inv = 1.0 / base ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    wavelen = 2 * np.pi / inv
    out = np.empty_like(inv)
    for i, wl in enumerate(wavelen):
        if wl < old / hi:
            out[i] = 1.0
        elif wl > old / lo:
            out[i] = factor
        else:
            smooth = (old / wl - lo) / (hi - lo)
            out[i] = 1.0 / ((1 - smooth) / factor + smooth)
    return out.astype(np.float32)


def pre_tokenizer_name(tok):
    """llama.cpp's tokenizer.ggml.pre for the Split regex in tokenizer.json."""
    text = json.dumps(tok.get("pre_tokenizer"))
    if "\\\\p{N}{1,3}" in text:
        return "llama-bpe"
    if "\\\\p{N}" in text:
        return "qwen2"
    return "default"


def looks_special(s):
    return s.startswith("<|") and s.endswith("|>") or s in ("<pad>", "<mask>")


def add_tokenizer(w, d, cfg, vocab_size):
    p = os.path.join(d, "tokenizer.json")
    if not os.path.exists(p):
        print(f"hf_to_gguf: no tokenizer.json in {d}: writing no tokenizer", file=sys.stderr)
        return
    with open(p, encoding="utf-8") as f:
        tok = json.load(f)
    tcfg = {}
    cp = os.path.join(d, "tokenizer_config.json")
    if os.path.exists(cp):
        with open(cp, encoding="utf-8") as f:
            tcfg = json.load(f)
    model = tok["model"]
    if model.get("type") != "BPE":
        raise SystemExit(f"hf_to_gguf: {p}: only byte-level BPE tokenizers are converted "
                         f"(model type {model.get('type')})")
    rev = {i: t for t, i in model["vocab"].items()}
    added = {t["id"]: t for t in tok.get("added_tokens", [])}
    for i, t in added.items():
        rev[i] = t["content"]
    if max(rev) >= vocab_size:
        raise SystemExit(f"hf_to_gguf: tokenizer id {max(rev)} >= vocab_size {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in rev:
            tokens.append(f"[PAD{i}]")
            types.append(TOK_UNUSED)
        elif i in added:
            tokens.append(rev[i])
            types.append(TOK_CONTROL if added[i].get("special") or looks_special(rev[i]) else TOK_USER)
        else:
            tokens.append(rev[i])
            types.append(TOK_NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    pre = pre_tokenizer_name(tok)
    w.add("tokenizer.ggml.model", gw.STRING, "gpt2")
    w.add("tokenizer.ggml.pre", gw.STRING, pre)
    w.add("tokenizer.ggml.tokens", gw.ARRAY, tokens, gw.STRING)
    w.add("tokenizer.ggml.token_type", gw.ARRAY, types, gw.I32)
    w.add("tokenizer.ggml.merges", gw.ARRAY, merges, gw.STRING)
    if cfg.get("bos_token_id") is not None:
        w.add("tokenizer.ggml.bos_token_id", gw.U32, int(cfg["bos_token_id"]))
    eos = cfg.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if eos is not None:
        w.add("tokenizer.ggml.eos_token_id", gw.U32, int(eos))
    pad = tcfg.get("pad_token")
    if isinstance(pad, dict):
        pad = pad.get("content")
    pad_id = next((i for i, t in rev.items() if t == pad), None) if pad else None
    if pad_id is not None:
        w.add("tokenizer.ggml.padding_token_id", gw.U32, pad_id)
    w.add("tokenizer.ggml.add_bos_token", gw.BOOL, bool(tcfg.get("add_bos_token", pre == "llama-bpe")))
    if isinstance(tcfg.get("chat_template"), str):
        w.add("tokenizer.chat_template", gw.STRING, tcfg["chat_template"])


def convert(d, out, outtype="auto", quiet=False):
    """Converts folder d to GGUF file out; returns the metadata written."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    mt = cfg.get("model_type")
    if mt not in ARCH:
        raise SystemExit(f"hf_to_gguf: model_type {mt!r} not supported (llama, mistral, qwen2, qwen3)")
    arch = ARCH[mt]
    D, H, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    KV = cfg.get("num_key_value_heads") or H
    hd = cfg.get("head_dim") or D // H
    V = cfg["vocab_size"]
    tied = bool(cfg.get("tie_word_embeddings", False))

    # tensors: name -> (file, safetensors dtype, shape)
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(x for x in os.listdir(d) if x.endswith(".safetensors"))
    where = {}
    for fn in files:
        h, _, _ = st.read_header(os.path.join(d, fn))
        for k, v in h.items():
            where[k] = (os.path.join(d, fn), v["dtype"], tuple(v["shape"]))
    if "model.embed_tokens.weight" not in where:
        raise SystemExit(f"hf_to_gguf: {d}: no model.embed_tokens.weight")
    if outtype == "auto":
        mtype = ST_TO_GGML.get(where["model.embed_tokens.weight"][1], gw.GGML_F32)
    else:
        mtype = gw.GGML_NAMES[outtype]

    w = gw.GGUFWriter()
    w.add("general.architecture", gw.STRING, arch)
    w.add("general.name", gw.STRING, os.path.basename(os.path.abspath(d)))
    w.add("general.file_type", gw.U32, FILE_TYPE[mtype])
    w.add(f"{arch}.vocab_size", gw.U32, V)
    w.add(f"{arch}.context_length", gw.U32, int(cfg.get("max_position_embeddings", 4096)))
    w.add(f"{arch}.embedding_length", gw.U32, D)
    w.add(f"{arch}.block_count", gw.U32, L)
    w.add(f"{arch}.feed_forward_length", gw.U32, cfg["intermediate_size"])
    w.add(f"{arch}.attention.head_count", gw.U32, H)
    w.add(f"{arch}.attention.head_count_kv", gw.U32, KV)
    w.add(f"{arch}.attention.key_length", gw.U32, hd)
    w.add(f"{arch}.attention.value_length", gw.U32, hd)
    w.add(f"{arch}.attention.layer_norm_rms_epsilon", gw.F32, float(cfg.get("rms_norm_eps", 1e-6)))
    w.add(f"{arch}.rope.freq_base", gw.F32, float(cfg.get("rope_theta", 10000.0)))
    w.add(f"{arch}.rope.dimension_count", gw.U32, hd)
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        w.add(f"{arch}.rope.scaling.type", gw.STRING, "linear")
        w.add(f"{arch}.rope.scaling.factor", gw.F32, float(rs["factor"]))
    elif kind == "yarn":
        w.add(f"{arch}.rope.scaling.type", gw.STRING, "yarn")
        w.add(f"{arch}.rope.scaling.factor", gw.F32, float(rs["factor"]))
        w.add(f"{arch}.rope.scaling.original_context_length", gw.U32,
              int(rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]))
        for k in ("beta_fast", "beta_slow"):
            if rs.get(k) is not None:
                w.add(f"{arch}.rope.scaling.yarn_{k}", gw.F32, float(rs[k]))
    elif kind not in (None, "default", "llama3"):
        raise SystemExit(f"hf_to_gguf: rope_scaling type {kind!r} not converted")
    add_tokenizer(w, d, cfg, V)

    def producer(hf, gname):
        def load():
            path, _, _ = where[hf]
            a = st.read(path, names={hf})[hf]
            if arch == "llama" and ".attn_q." in gname:
                a = permute_rows(a, H)
            elif arch == "llama" and ".attn_k." in gname:
                a = permute_rows(a, KV)
            return a
        return load

    if kind == "llama3":
        fac = llama3_rope_factors(cfg, hd)
        w.add_tensor("rope_freqs.weight", fac.shape, gw.GGML_F32, lambda: fac)
    for hf in where:  # safetensors header order; GGUF keeps ours
        gname = gguf_name(hf)
        if gname is None:
            if hf.endswith("rotary_emb.inv_freq"):
                continue
            raise SystemExit(f"hf_to_gguf: tensor {hf} has no GGUF name")
        if gname == "output.weight" and tied:
            continue
        shape = where[hf][2]
        gt = mtype if len(shape) == 2 else gw.GGML_F32
        w.add_tensor(gname, shape, gt, producer(hf, gname))
    total = [0]

    def progress(name, nb):
        total[0] += nb
        if not quiet and nb > (64 << 20):
            print(f"hf_to_gguf: {name} ({total[0] / 1e9:.2f} GB so far)", file=sys.stderr, flush=True)

    w.write(out, progress)
    if not quiet:
        print(f"hf_to_gguf: wrote {out} ({arch}, {len(w.tensors)} tensors, {total[0] / 1e6:.1f} MB)",
              file=sys.stderr)
    return {k: v for k, _, v, _ in w.kv}


def main(argv=None):
    ap = argparse.ArgumentParser(description="Hugging Face folder -> GGUF (llama / qwen2 / qwen3)")
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--outtype", choices=["auto", "f32", "f16", "bf16"], default="auto")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    convert(a.model_dir, a.out, a.outtype, a.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
