#!/usr/bin/env python3
"""hybrid_to_gguf.py - converts a Hugging Face Qwen3.5 (dense or MoE, text or multimodal),
Qwen3-Next or Qwen3-MoE folder to GGUF in llama.cpp's layout.

    hybrid_to_gguf.py HF_DIR OUT.gguf [--outtype auto|f32|f16|bf16]

Architectures "qwen35", "qwen35moe", "qwen3next", "qwen3moe", laid out as
llama.cpp's converter (conversion/qwen.py: Qwen3NextModel,
_LinearAttentionVReorderBase, Qwen3_5TextModel, Qwen3_5MoeTextModel,
Qwen2MoeModel) and loader (src/models/qwen35*.cpp, qwen3next.cpp,
qwen3moe.cpp) do; written from those facts with hf_to_gguf.py's writer,
reader and tokenizer code. Quantize the result with `dflash quantize`.
- keys: block_count, context_length, embedding_length, feed_forward_length
  (when the model has dense MLPs), attention.head_count, head_count_kv,
  key_length = value_length = head_dim, layer_norm_rms_epsilon,
  rope.freq_base; the hybrids' rope.dimension_count = int(head_dim *
  partial_rotary_factor), ssm.conv_kernel, ssm.state_size (the key head
  dim), ssm.group_count (key heads), ssm.time_step_rank (value heads),
  ssm.inner_size (value heads * value head dim), full_attention_interval
  when layer_types follow one, else attention.recurrent_layers (one bool a
  layer; llama.cpp reads both); Qwen3.5's rope.dimension_sections (its
  mrope_section padded to 4; when absent, the rotated pairs split over time,
  height, width as interleaved M-RoPE takes them: [11, 11, 10, 0] for the
  released models, as llama.cpp's converter writes); experts:
  expert_count, expert_used_count, expert_feed_forward_length,
  expert_shared_feed_forward_length (hybrids), expert_weights_norm
  (norm_topk_prob: dflash reads it, llama.cpp always renormalises);
- tensors: blk.N.{attn_norm, post_attention_norm (hybrids) | ffn_norm
  (qwen3moe), attn_q ([q | gate] per head on the hybrids), attn_k, attn_v,
  attn_output, attn_q_norm, attn_k_norm}; DeltaNet layers attn_qkv
  (q | k | v), attn_gate (z), ssm_beta and ssm_alpha (Qwen3.5) or ssm_ba
  (Qwen3-Next, [b | a] per key head as Hugging Face has it), ssm_conv1d
  ([C, 1, K] squeezed to [C, K], F32), ssm_dt.bias, ssm_a = -exp(A_log)
  (F32, libm's expf, the engine's bits), ssm_norm, ssm_out; dense MLPs
  ffn_{gate,up,down}; sparse ones ffn_gate_inp (router),
  ffn_{gate,up,down}_exps stacked [n_experts, rows, cols],
  ffn_{gate,up,down}_shexp and ffn_gate_inp_shexp (the shared expert's
  sigmoid gate, [1, dim]);
- Qwen3-Next's in_proj_qkvz ([q | k | v | z] per key head) split into
  attn_qkv [all q | all k | all v] and attn_gate;
- the hybrids' RMSNorms apply 1 + w: the 1 is added here in f32 (all but
  the DeltaNet's gated norm), so the file holds the weight applied;
- Qwen3.5 (not Qwen3-Next) with more value than key heads: value heads
  reordered from Hugging Face's grouped order (head j of key head k at
  k * r + j) to llama.cpp's tiled one (j * n_k + k) in v's rows of attn_qkv
  and its conv channels, attn_gate, ssm_beta, ssm_alpha, ssm_dt, ssm_a, and
  ssm_out's columns; dflash reads them back to grouped;
- 1-D tensors, the conv and the routers (ffn_gate_inp, ffn_gate_inp_shexp) F32, as
  llama.cpp's converter writes them (the engine computes the same bits from them as from
  the folder's type); other matrices and expert stacks --outtype;
- a multimodal checkpoint's vision tower and the MTP head are not written.
llama.cpp itself cannot load files whose key and value head dims differ, or
Qwen3-Next / Qwen3-MoE files with dense layers among the sparse ones; dflash
can. Refused: attention or MLP biases, RoPE scaling.
"""
import ctypes
import ctypes.util
import json
import os
import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_to_gguf as H  # noqa: E402
import laguna_to_gguf as L  # noqa: E402  (expert stacking)

ARCH = {"qwen3_5_text": "qwen35", "qwen3_5": "qwen35", "qwen3_5_moe_text": "qwen35moe",
        "qwen3_5_moe": "qwen35moe", "qwen3_next": "qwen3next", "qwen3_moe": "qwen3moe"}
HYBRID = ("qwen35", "qwen35moe", "qwen3next")

# Hugging Face layer names (after "model.layers.N.") -> llama.cpp's, besides the dense ones
LAYER = {k: v for k, v in H.LAYER_NAMES.items() if not k.endswith(".bias")}
LAYER.update({
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.in_proj_ba.weight": "ssm_ba.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.A_log": "ssm_a",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
})
for _p in ("gate", "up", "down"):
    LAYER[f"mlp.shared_expert.{_p}_proj.weight"] = f"ffn_{_p}_shexp.weight"


def fail(msg):
    raise SystemExit(f"hybrid_to_gguf: {msg}")


def _libm_expf():
    lib = ctypes.util.find_library("m")
    if not lib:
        return None
    f = ctypes.CDLL(lib).expf
    f.restype, f.argtypes = ctypes.c_float, [ctypes.c_float]
    return f


EXPF = _libm_expf()


def neg_exp(a):
    """-exp(a) in float32 as the engine computes it from A_log (libm's expf), else numpy's."""
    a = np.asarray(a, dtype=np.float32)
    if EXPF is None:
        return -np.exp(a.astype(np.float64)).astype(np.float32)
    return np.array([-EXPF(float(x)) for x in a.ravel()], dtype=np.float32).reshape(a.shape)


def mrope_sections(R):
    """Interleaved M-RoPE sections over R rotated pairs when the config has none: pair s
    takes section s % 3 (time, height, width), so each gets the pairs of its residue.
    Released Qwen3.5 (R = 32) gives [11, 11, 10, 0], what llama.cpp's converter writes;
    llama.cpp refuses sections wider than the head, so small models get their own."""
    return [(R + 2) // 3, (R + 1) // 3, R // 3, 0]


def text_config(cfg):
    return cfg.get("text_config") or cfg


def tile(a, axis, n_k, r, seg):
    """Value heads along axis from grouped (k * r + j) to llama.cpp's tiled order (j * n_k + k),
    seg entries a head."""
    a = np.moveaxis(a, axis, 0)
    rest = a.shape[1:]
    a = a.reshape(n_k, r, seg, *rest).swapaxes(0, 1).reshape(n_k * r * seg, *rest)
    return np.moveaxis(a, 0, axis)


def layer_kinds(cfg):
    """[True: DeltaNet layer] per layer, as transformers reads the config."""
    L = cfg["num_hidden_layers"]
    if cfg.get("layer_types"):
        return [t == "linear_attention" for t in cfg["layer_types"]]
    every = cfg.get("full_attention_interval") or 4
    return [(l + 1) % every != 0 for l in range(L)]


def add_keys(w, cfg, arch, name, mtype):
    L, D = cfg["num_hidden_layers"], cfg["hidden_size"]
    hd = cfg.get("head_dim") or D // cfg["num_attention_heads"]
    w.add_name(name)
    w.add_file_type(H.FILE_TYPE[mtype])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_context_length(int(cfg.get("max_position_embeddings", 32768)))
    w.add_embedding_length(D)
    w.add_block_count(L)
    if cfg.get("intermediate_size"):
        w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rp.get("rope_type", rp.get("type", "default")) not in ("default", "mrope", None):
        fail(f"rope type {rp.get('rope_type', rp.get('type'))!r} not converted (default is)")
    w.add_rope_freq_base(float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    if arch in HYBRID:
        partial = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
        w.add_rope_dimension_count(int(hd * float(partial)))
        add_ssm(w, cfg)
    if arch in ("qwen35", "qwen35moe"):
        R = int(hd * float(partial)) // 2
        sec = list(rp.get("mrope_section") or mrope_sections(R))
        w.add_rope_dimension_sections((sec + [0, 0, 0, 0])[:4])
    add_moe(w, cfg, arch)


def add_ssm(w, cfg):
    kv, vh = cfg.get("linear_num_key_heads", 16), cfg.get("linear_num_value_heads", 32)
    w.add_ssm_conv_kernel(cfg.get("linear_conv_kernel_dim", 4))
    w.add_ssm_state_size(cfg.get("linear_key_head_dim", 128))
    w.add_ssm_group_count(kv)
    w.add_ssm_time_step_rank(vh)
    w.add_ssm_inner_size(cfg.get("linear_value_head_dim", 128) * vh)
    kinds, L = layer_kinds(cfg), cfg["num_hidden_layers"]
    every = next((p for p in range(1, L + 1)
                  if all(k == ((l + 1) % p != 0) for l, k in enumerate(kinds))), None)
    if every is not None:
        w.add_full_attention_interval(every)
    else:   # llama.cpp's attention.recurrent_layers: true for a DeltaNet layer
        w.add_array(gguf.Keys.Attention.RECURRENT_LAYERS.format(arch=w.arch)
                    if hasattr(gguf.Keys.Attention, "RECURRENT_LAYERS")
                    else f"{w.arch}.attention.recurrent_layers", [bool(k) for k in kinds])


def add_moe(w, cfg, arch):
    n = cfg.get("num_experts") or cfg.get("num_local_experts")
    if not n:
        return
    w.add_expert_count(n)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if arch != "qwen3moe":
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_expert_weights_norm(bool(cfg.get("norm_topk_prob", True)) or arch == "qwen35moe")


class Layout:
    """The value-head shapes the DeltaNet tensors are cut by."""

    def __init__(self, cfg, arch):
        self.nk = cfg.get("linear_num_key_heads", 16)
        self.nv = cfg.get("linear_num_value_heads", 32)
        self.dk = cfg.get("linear_key_head_dim", 128)
        self.dv = cfg.get("linear_value_head_dim", 128)
        self.r = self.nv // self.nk
        self.tiled = arch in ("qwen35", "qwen35moe") and self.nv != self.nk

    def retile(self, rest, a):
        """a in llama.cpp's tiled value-head order where Qwen3.5 has it (identity otherwise)."""
        if not self.tiled:
            return a
        kd, t = 2 * self.nk * self.dk, lambda x, axis, seg: tile(x, axis, self.nk, self.r, seg)
        if rest in ("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight"):
            return np.concatenate([a[:kd], t(a[kd:], 0, self.dv)])
        if rest == "linear_attn.in_proj_z.weight":
            return t(a, 0, self.dv)
        if rest in ("linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight",
                    "linear_attn.A_log", "linear_attn.dt_bias"):
            return t(a, 0, 1)
        if rest == "linear_attn.out_proj.weight":
            return t(a, 1, self.dv)
        return a

    def split_qkvz(self, a):
        """Qwen3-Next's in_proj_qkvz ([q | k | v | z] per key head) -> (q | k | v, z)."""
        rv = self.r * self.dv
        g = a.reshape(self.nk, 2 * self.dk + 2 * rv, -1)
        q, k = g[:, :self.dk], g[:, self.dk:2 * self.dk]
        v, z = g[:, 2 * self.dk:2 * self.dk + rv], g[:, 2 * self.dk + rv:]
        D = a.shape[-1]
        return (np.concatenate([q.reshape(-1, D), k.reshape(-1, D), v.reshape(-1, D)]),
                z.reshape(-1, D))


def plus_one(rest, arch):
    return arch in HYBRID and rest.endswith("norm.weight") and rest != "linear_attn.norm.weight"


def layer_tensors(hf, n, where, arch, lay, mtype):
    """[(gguf name, shape, type, producer)] for HF tensor hf (normalised name n)."""
    load = lambda: H.load_tensor(where, hf)  # noqa: E731
    shape = list(where[hf][2])
    gt = mtype if len(shape) >= 2 else QT.F32
    top = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    if n in top:
        one = arch in HYBRID and n == "model.norm.weight"
        return [(top[n], shape, gt, (lambda: load() + np.float32(1)) if one else load)]
    parts = n.split(".", 3)
    if len(parts) < 4 or parts[:2] != ["model", "layers"]:
        fail(f"tensor {hf} has no GGUF name")
    pre, rest = f"blk.{int(parts[2])}.", parts[3]
    if rest == "post_attention_layernorm.weight" and arch in HYBRID:
        return [(pre + "post_attention_norm.weight", shape, QT.F32,
                 lambda: load() + np.float32(1))]
    if rest == "linear_attn.in_proj_qkvz.weight":
        rows = shape[0] - lay.nv * lay.dv
        return [(pre + "attn_qkv.weight", [rows, shape[1]], gt, lambda: lay.split_qkvz(load())[0]),
                (pre + "attn_gate.weight", [shape[0] - rows, shape[1]], gt,
                 lambda: lay.split_qkvz(load())[1])]
    if rest == "linear_attn.conv1d.weight":   # [C, 1, K] -> [C, K]
        return [(pre + "ssm_conv1d.weight", [shape[0], shape[2]], QT.F32,
                 lambda: lay.retile(rest, load()[:, 0, :]))]
    if rest == "linear_attn.A_log":
        return [(pre + "ssm_a", shape, QT.F32, lambda: lay.retile(rest, neg_exp(load())))]
    if rest in LAYER:
        if plus_one(rest, arch):
            return [(pre + LAYER[rest], shape, QT.F32, lambda: load() + np.float32(1))]
        if rest in ("mlp.gate.weight", "mlp.shared_expert_gate.weight"):
            gt = QT.F32   # llama.cpp's converter keeps the routers F32
        return [(pre + LAYER[rest], shape, gt, lambda: lay.retile(rest, load()))]
    if rest == "mlp.experts.gate_up_proj":   # [E, 2I, D]: gate rows first, then up
        E, I2, D = shape
        half = lambda i: lambda: load()[:, i * (I2 // 2):(i + 1) * (I2 // 2)]  # noqa: E731
        return [(pre + "ffn_gate_exps.weight", [E, I2 // 2, D], gt, half(0)),
                (pre + "ffn_up_exps.weight", [E, I2 // 2, D], gt, half(1))]
    if rest == "mlp.experts.down_proj":
        return [(pre + "ffn_down_exps.weight", shape, gt, load)]
    if rest.startswith("mlp.experts.") and rest.endswith("_proj.weight"):
        return []   # one tensor per expert: stacked by laguna_to_gguf.expert_stacks
    fail(f"tensor {hf} has no GGUF name")


def normalise(hf):
    """The multimodal class's text names as the text class has them; None: not converted."""
    if hf.startswith(("model.visual.", "mtp.", "model.mtp.")) or hf.endswith("rotary_emb.inv_freq"):
        return None
    return "model." + hf[len("model.language_model."):] if hf.startswith("model.language_model.") \
        else hf


def convert(d, out, outtype="auto", quiet=False):
    """Converts folder d to GGUF file out; returns the metadata written."""
    with open(os.path.join(d, "config.json")) as f:
        top = json.load(f)
    arch = ARCH.get(top.get("model_type"))
    if arch is None:
        fail(f"model_type {top.get('model_type')!r} not converted ({', '.join(ARCH)} are)")
    cfg = text_config(top)
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            fail(f"{key} = true not converted")
    where = H.safetensors_index(d)
    names = {n: hf for hf in where for n in [normalise(hf)] if n}
    if "model.embed_tokens.weight" not in names:
        fail(f"{d}: no embed_tokens.weight")
    emb = names["model.embed_tokens.weight"]
    mtype = H.ST_TO_GGML.get(where[emb][1], QT.F32) if outtype == "auto" else H.OUTTYPE[outtype]
    w = gguf.GGUFWriter(out, arch)
    add_keys(w, cfg, arch, os.path.basename(os.path.abspath(d)), mtype)
    H.add_tokenizer(w, d, cfg, cfg["vocab_size"])
    tied = bool(top.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False)))
    lay, tensors = Layout(cfg, arch), []
    for n, hf in names.items():
        if n == "lm_head.weight" and tied:
            continue
        tensors += layer_tensors(hf, n, where, arch, lay, mtype)
    n_exp = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    tensors += L.expert_stacks(where, mtype, n_exp, names)
    H.write(w, out, tensors)
    if not quiet:
        print(f"hybrid_to_gguf: wrote {out} ({arch}, {len(tensors)} tensors)", file=sys.stderr)
    return {k: v.value for k, v in w.kv_data[0].items()}


def main(argv=None):
    return H.cli(convert, "Hugging Face Qwen3.5 / Qwen3-Next / Qwen3-MoE folder -> GGUF "
                 "(llama.cpp's layout)", argv)


if __name__ == "__main__":
    sys.exit(main())
