#!/usr/bin/env python3
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

The file is written by llama.cpp's gguf package (GGUFWriter, and gguf.quants
for F16 / BF16 rounding); keys and types come from its constants.
"""
import argparse
import json
import os
import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import LlamaFileType, TokenType

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_checkpoint  # noqa: E402  (safetensors reading)

ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
FILE_TYPE = {QT.F32: LlamaFileType.ALL_F32, QT.F16: LlamaFileType.MOSTLY_F16,
             QT.BF16: LlamaFileType.MOSTLY_BF16}  # general.file_type
ST_TO_GGML = {"F32": QT.F32, "F16": QT.F16, "BF16": QT.BF16}
OUTTYPE = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16}

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
    if "\\\\p{M}" in text:   # Qwen3.5's: letters with their combining marks
        return "qwen35"
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
            types.append(TokenType.UNUSED)
        elif i in added:
            tokens.append(rev[i])
            types.append(TokenType.CONTROL if added[i].get("special") or looks_special(rev[i])
                         else TokenType.USER_DEFINED)
        else:
            tokens.append(rev[i])
            types.append(TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    pre = pre_tokenizer_name(tok)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([int(t) for t in types])  # I32
    w.add_token_merges(merges)
    if cfg.get("bos_token_id") is not None:
        w.add_bos_token_id(int(cfg["bos_token_id"]))
    eos = cfg.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if eos is not None:
        w.add_eos_token_id(int(eos))
    pad = tcfg.get("pad_token")
    if isinstance(pad, dict):
        pad = pad.get("content")
    pad_id = next((i for i, t in rev.items() if t == pad), None) if pad else None
    if pad_id is not None:
        w.add_pad_token_id(pad_id)
    w.add_add_bos_token(bool(tcfg.get("add_bos_token", pre == "llama-bpe")))
    if isinstance(tcfg.get("chat_template"), str):
        w.add_chat_template(tcfg["chat_template"])


def add_model_keys(w, cfg, name, mtype, V, D, L, H, KV, hd):
    """general.* and the per-arch keys (w.arch) llama.cpp's converter writes first."""
    w.add_name(name)
    w.add_file_type(FILE_TYPE[mtype])
    w.add_vocab_size(V)
    w.add_context_length(int(cfg.get("max_position_embeddings", 4096)))
    w.add_embedding_length(D)
    w.add_block_count(L)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_rope_dimension_count(hd)


def safetensors_index(d):
    """{name: (file, safetensors dtype, shape)} of a folder, in file order."""
    return {k: (p, dt, shape) for p in make_checkpoint.checkpoint_files(d)
            for k, dt, shape in make_checkpoint.file_tensors(p)}


def load_tensor(where, hf):
    return make_checkpoint.load_file(where[hf][0], names={hf})[hf]


def write(w, path, tensors, progress=None):
    """Writes GGUFWriter w (keys added) with tensors [(name, numpy shape, ggml type,
    producer)] to path. producer() gives the float array, called one tensor at a
    time while writing, so big models stream through memory."""
    for name, shape, gt, _ in tensors:
        block, size = gguf.GGML_QUANT_SIZES[gt]
        w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) // block * size,
                          raw_dtype=gt)
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, gt, producer in tensors:
        a = np.asarray(producer(), dtype=np.float32)
        if a.shape != tuple(shape):
            raise ValueError(f"tensor {name}: producer gave {a.shape}, declared {shape}")
        data = gguf.quants.quantize(a, gt)
        w.write_tensor_data(data)
        if progress:
            progress(name, data.nbytes)
    w.close()


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

    where = safetensors_index(d)
    if "model.embed_tokens.weight" not in where:
        raise SystemExit(f"hf_to_gguf: {d}: no model.embed_tokens.weight")
    if outtype == "auto":
        mtype = ST_TO_GGML.get(where["model.embed_tokens.weight"][1], QT.F32)
    else:
        mtype = OUTTYPE[outtype]

    w = gguf.GGUFWriter(out, arch)
    add_model_keys(w, cfg, os.path.basename(os.path.abspath(d)), mtype, V, D, L, H, KV, hd)
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(rs["factor"]))
    elif kind == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(rs["factor"]))
        w.add_rope_scaling_orig_ctx_len(
            int(rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]))
        if rs.get("beta_fast") is not None:
            w.add_rope_scaling_yarn_beta_fast(float(rs["beta_fast"]))
        if rs.get("beta_slow") is not None:
            w.add_rope_scaling_yarn_beta_slow(float(rs["beta_slow"]))
    elif kind not in (None, "default", "llama3"):
        raise SystemExit(f"hf_to_gguf: rope_scaling type {kind!r} not converted")
    add_tokenizer(w, d, cfg, V)

    def producer(hf, gname):
        def load():
            a = load_tensor(where, hf)
            if arch == "llama" and ".attn_q." in gname:
                a = permute_rows(a, H)
            elif arch == "llama" and ".attn_k." in gname:
                a = permute_rows(a, KV)
            return a
        return load

    tensors = []
    if kind == "llama3":
        fac = llama3_rope_factors(cfg, hd)
        tensors.append(("rope_freqs.weight", fac.shape, QT.F32, lambda: fac))
    for hf in where:  # safetensors file order; GGUF keeps it
        gname = gguf_name(hf)
        if gname is None:
            if hf.endswith("rotary_emb.inv_freq"):
                continue
            raise SystemExit(f"hf_to_gguf: tensor {hf} has no GGUF name")
        if gname == "output.weight" and tied:
            continue
        shape = where[hf][2]
        gt = mtype if len(shape) == 2 else QT.F32
        tensors.append((gname, shape, gt, producer(hf, gname)))
    total = [0]

    def progress(name, nb):
        total[0] += nb
        if not quiet and nb > (64 << 20):
            print(f"hf_to_gguf: {name} ({total[0] / 1e9:.2f} GB so far)", file=sys.stderr, flush=True)

    write(w, out, tensors, progress)
    if not quiet:
        print(f"hf_to_gguf: wrote {out} ({arch}, {len(tensors)} tensors, {total[0] / 1e6:.1f} MB)",
              file=sys.stderr)
    return {k: v.value for k, v in w.kv_data[0].items()}


def cli(convert_fn, description, argv=None):
    """MODEL_DIR OUT [--outtype] [--quiet] -> convert_fn(dir, out, outtype, quiet)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--outtype", choices=["auto", "f32", "f16", "bf16"], default="auto")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    convert_fn(a.model_dir, a.out, a.outtype, a.quiet)
    return 0


def main(argv=None):
    return cli(convert, "Hugging Face folder -> GGUF (llama / qwen2 / qwen3)", argv)


if __name__ == "__main__":
    sys.exit(main())
