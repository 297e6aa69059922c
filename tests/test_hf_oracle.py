#!/usr/bin/env python3
"""test_hf_oracle.py - Hugging Face transformers as the oracle for the engine.

Checkpoints are made by transformers itself (XxxConfig, from_config,
save_pretrained), so nothing of ours writes or reads them on the reference
side. For Llama (llama3 RoPE, GQA, untied; yarn RoPE, MHA with head_dim !=
dim/heads, tied), Mistral (linear RoPE, 4 query heads a KV head; a sliding
window of 16), Qwen2 (q/k/v biases) and Qwen3 (q/k norms, tied and untied;
layer_types mixing sliding and full layers), each in float32 and bfloat16:
1. `dflash dump` logits and hidden states (--capture; every layer but the
   last) against model(ids, output_hidden_states=True), for a prefill (all
   rows as one block) and decode (`--decode K`: K rows as a block, then one
   row per step), with the K/V cache in f32 (tight) and in f16, the default
   (looser);
2. 64 greedy tokens of `dflash generate` (f32 weights; f32 and default f16
   cache) against model.generate(do_sample=False), id for id;
3. a DFlash drafter of z-lab's layout on a Qwen3 target: a torch module
   written as z-lab's modeling file is (transformers' Qwen3 parts, context
   K/V from fc + hidden_norm of the target's hidden states, concatenated
   before the block's), against dump's drafter logits.
Qwen3.5 dense hybrids (gated DeltaNet layers with a recurrent state, gated full
attention; the text class and the multimodal class) go through 1 and 2 as well, through
`dflash probe` with the recurrent states compared, and speculative = classic decode
(test_hybrid_spec).
Tolerances are stated per comparison (TOL); a table line per case prints the
largest |diff|. Without $DFLASH_BIN or torch/transformers: skipped, unless
CI=true, where that is a failure.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import check, finish, missing  # noqa: E402

VOCAB = 320          # model rows; the tokenizer has TOK_SIZE ids, the drafter's mask is TOK_SIZE
TOK_SIZE = 290
N_PROMPT = 24        # dump rows
DECODE_FROM = 5      # --decode: rows 0..4 as a block, 5..23 one at a time
N_GEN = 64
PROMPT = "Once upon a time, a small fox found a lantern by the river and"

# max |engine - transformers| <= TOL * max(1, max |transformers logits|).
# f32 cache: both sides compute in float32 and differ in summation order only
# (observed: relative <= 1e-6, absolute <= 2e-5). f16 cache: the engine stores
# K and V as float16, transformers keeps float32 (observed: relative <= 6e-4).
TOL = {"f32": 1e-5, "f16": 2e-3}
# The hybrids' recurrence accumulates float32 rounding on both sides, and how much depends on
# the machine torch runs on (on a Zen 3, qwen35moe-hybrid bf16: transformers 1.4e-4 and the
# engine 2.2e-4 from the float64 reference, on opposite sides). The engine is held to TOL
# against tools/reference.py's float64 forward (test_reference64); against transformers it
# may differ by twice it (an f16 cache's tolerance already covers its rounding).
HYBRID_PAIR = 2.0
# transformers itself against that float64 forward (a check of tools/reference.py, whose
# errors would be 1e-2 and up): the host's torch kernels set its rounding. On an Intel Xeon
# (AVX-512) qwen35moe-hybrid bf16 read 6.4e-4 at one row of 24 (1.9x TOL; the other rows
# 1e-5 to 2e-4, with any thread count), while the engine stayed at 2.2e-4, within TOL.
HF_REF64 = 4.0
# Greedy runs are compared id for id only where transformers' top-2 margin at
# every step exceeds this (a margin below the logit error could flip a tie).
MIN_MARGIN = 0.05
MIN_COMPARED = 40    # greedy steps compared at least (prompt ~16 + 40 > 6x the window of 8)

LLAMA3 = dict(rope_type="llama3", rope_theta=500000.0, factor=4.0, low_freq_factor=1.0,
              high_freq_factor=4.0, original_max_position_embeddings=32)
COMMON = dict(vocab_size=VOCAB, max_position_embeddings=256, bos_token_id=None, eos_token_id=None)
ARCHS = [  # (name, config class, config kwargs, seed)
    ("llama3-untied-gqa2", "LlamaConfig",
     dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=2, rope_parameters=LLAMA3, rms_norm_eps=1e-5,
          tie_word_embeddings=False), 34),
    ("llama-yarn-tied-mha-hd24", "LlamaConfig",
     dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=4, head_dim=24, max_position_embeddings=128,
          rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                               original_max_position_embeddings=32),
          tie_word_embeddings=True), 2),
    ("mistral-linear-gqa4-untied", "MistralConfig",
     dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=1, sliding_window=None,
          rope_parameters=dict(rope_type="linear", rope_theta=1e6, factor=2.0),
          tie_word_embeddings=False), 36),
    # sliding windows far shorter than prompt + output: the ring cache wraps many times
    ("mistral-swa16-gqa2", "MistralConfig",
     dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=2, sliding_window=16, tie_word_embeddings=False), 41),
    ("qwen3-layer-types-swa12", "Qwen3Config",
     dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
          num_key_value_heads=2, head_dim=16, use_sliding_window=True, sliding_window=12,
          layer_types=["sliding_attention", "full_attention", "sliding_attention"],
          tie_word_embeddings=False), 9),
    # Laguna: sliding (window 8) and full layers with their own head counts and RoPE (YaRN,
    # partial rotary on full layers), softplus output gates, a dense layer 0 then sigmoid-routed
    # experts (selection bias, routed scale, shared expert), fused experts as transformers saves
    ("laguna-yarn-perhead-moe", "LagunaConfig",
     dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
          num_key_value_heads=2, head_dim=16, num_attention_heads_per_layer=[4, 8, 4, 8],
          layer_types=["full_attention", "sliding_attention", "sliding_attention",
                       "sliding_attention"], sliding_window=8, gating=True,
          num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
          shared_expert_intermediate_size=48, moe_routed_scaling_factor=2.5,
          rope_parameters={"full_attention": dict(rope_type="yarn", rope_theta=500000.0,
                                                  factor=4.0, original_max_position_embeddings=64,
                                                  beta_fast=64.0, beta_slow=1.0,
                                                  partial_rotary_factor=0.5),
                           "sliding_attention": dict(rope_type="default", rope_theta=10000.0,
                                                     partial_rotary_factor=1.0)},
          tie_word_embeddings=False), 168),
    ("laguna-elementgate-softcap", "LagunaConfig",
     dict(hidden_size=64, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
          num_key_value_heads=1, head_dim=16, layer_types=["sliding_attention",
                                                           "full_attention",
                                                           "sliding_attention"],
          sliding_window=6, gating="per-element", mlp_layer_types=["sparse", "dense", "sparse"],
          num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24,
          shared_expert_intermediate_size=32, moe_router_logit_softcapping=1.5,
          rope_parameters={"full_attention": dict(rope_type="default", rope_theta=500000.0,
                                                  partial_rotary_factor=0.25),
                           "sliding_attention": dict(rope_type="default", rope_theta=10000.0)},
          tie_word_embeddings=False), 121),
    # wide enough for Q8_0 and Q4_K rows (multiples of 256): the probe's exactness per type
    ("laguna-256-probe", "LagunaConfig",
     dict(hidden_size=256, intermediate_size=256, num_hidden_layers=4, num_attention_heads=8,
          num_key_value_heads=2, head_dim=32, num_attention_heads_per_layer=[8, 16, 8, 16],
          layer_types=["full_attention", "sliding_attention", "sliding_attention",
                       "sliding_attention"], sliding_window=16, gating="per-head",
          num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
          shared_expert_intermediate_size=256, moe_routed_scaling_factor=2.5,
          rope_parameters={"full_attention": dict(rope_type="default", rope_theta=500000.0,
                                                  partial_rotary_factor=0.5),
                           "sliding_attention": dict(rope_type="default", rope_theta=10000.0)},
          tie_word_embeddings=False), 59),
    # Qwen3.5 dense: gated DeltaNet (linear_attention) layers with a recurrent state and gated
    # full attention (q_proj [q | gate], partial rotary 8 of 32), every norm 1 + w; value heads
    # twice the key heads, key and value head dims apart
    ("qwen35-hybrid-untied", "Qwen3_5TextConfig",
     dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
          num_key_value_heads=2, head_dim=32, linear_conv_kernel_dim=4, linear_key_head_dim=16,
          linear_value_head_dim=24, linear_num_key_heads=2, linear_num_value_heads=4,
          layer_types=["linear_attention", "full_attention", "linear_attention",
                       "full_attention"], tie_word_embeddings=False), 7),
    # the multimodal class: text_config nested, "model.language_model." names, a vision tower
    # the engine skips, tied embeddings, transformers' default layout (full every 4th layer)
    ("qwen35-multimodal-tied", "Qwen3_5Config",
     dict(text_config=dict(hidden_size=64, intermediate_size=80, num_hidden_layers=4,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                           linear_conv_kernel_dim=3, linear_key_head_dim=8,
                           linear_value_head_dim=16, linear_num_key_heads=2,
                           linear_num_value_heads=2,
                           rope_parameters=dict(rope_type="default", rope_theta=100000.0,
                                                partial_rotary_factor=0.5)),
          vision_config=dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2,
                             out_hidden_size=64, patch_size=4, num_position_embeddings=16),
          tie_word_embeddings=True), 15),
    # Qwen3.5-MoE: every MLP softmax-routed (top 2 of 6, renormalised) plus a shared expert
    # behind a sigmoid gate, on the same hybrid mixer
    ("qwen35moe-hybrid", "Qwen3_5MoeTextConfig",
     dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
          head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=16,
          linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
          layer_types=["linear_attention", "linear_attention", "full_attention",
                       "linear_attention"], num_experts=6, num_experts_per_tok=2,
          moe_intermediate_size=32, shared_expert_intermediate_size=48,
          tie_word_embeddings=False), 32),
    # Qwen3-Next: grouped DeltaNet projections (in_proj_qkvz, in_proj_ba), a dense layer
    # (mlp_only_layers) among softmax-routed ones, top-k scores not renormalised
    ("qwen3next-grouped-moe", "Qwen3NextConfig",
     dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
          num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=16,
          linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=6,
          layer_types=["linear_attention", "full_attention", "linear_attention",
                       "linear_attention"], num_experts=6, num_experts_per_tok=2,
          moe_intermediate_size=32, shared_expert_intermediate_size=48, mlp_only_layers=[1],
          norm_topk_prob=False, tie_word_embeddings=False), 43),
    # wide enough for Q8_0 and Q4_K rows: 3 DeltaNet layers to 1 attention, as released
    ("qwen35-256-probe", "Qwen3_5TextConfig",
     dict(hidden_size=256, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
          num_key_value_heads=2, head_dim=64, linear_key_head_dim=32, linear_value_head_dim=64,
          linear_num_key_heads=2, linear_num_value_heads=4, tie_word_embeddings=False), 27),
    # Qwen3-MoE: Qwen3 attention, a dense layer (mlp_only_layers) among softmax-routed
    # experts (top 2 of 8, renormalised), no shared expert
    ("qwen3moe-sparse", "Qwen3MoeConfig",
     dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
          num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
          moe_intermediate_size=32, mlp_only_layers=[1], norm_topk_prob=True,
          tie_word_embeddings=False), 61),
    ("qwen2-bias-gqa4-tied", "Qwen2Config",
     dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
          num_key_value_heads=2, tie_word_embeddings=True), 4),
    ("qwen3-tied-hd32", "Qwen3Config",
     dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=2, head_dim=32, tie_word_embeddings=True), 5),
    ("qwen3-untied-3l-hd16", "Qwen3Config",
     dict(hidden_size=96, intermediate_size=160, num_hidden_layers=3, num_attention_heads=8,
          num_key_value_heads=2, head_dim=16, tie_word_embeddings=False), 26),
]
DRAFT_TARGET = "qwen3-untied-3l-hd16"
# (name, target dtype, layers, heads, kv heads, head_dim, ffn, block, target layer ids). Not the
# target's last layer: transformers' hidden_states[-1] is after the final norm (spec section 2).
DRAFTERS = [
    ("drafter-f32", "f32", 2, 4, 2, 32, 160, 8, [0, 1]),
    ("drafter-bf16", "bf16", 1, 8, 4, 16, 128, 6, [1, 0]),
]


def find_bin():
    b = os.environ.get("DFLASH_BIN")
    return b if b and os.access(b, os.X_OK) else None


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\nexit {r.returncode}: {r.stderr.strip()[-2000:]}")
    return r


# ---- checkpoints, made by transformers ---------------------------------------------------

def write_tokenizer(path):
    """A byte-level BPE of TOK_SIZE ids (tokenizers' trainer), for `dflash generate`'s prompt."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=TOK_SIZE, special_tokens=["<|endoftext|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False)
    tok.train_from_iterator([PROMPT, "the quick brown fox jumps over the lazy dog " * 3] * 4, tr)
    tok.save(path)
    return tok.get_vocab_size()


def randomize(model):
    """Weights of O(1) activations and spread logits (from_config's std 0.02
    gives near-uniform logits, where greedy ids are ties): linear rows
    ~N(0, 1/in), embeddings N(0, 0.5^2), biases N(0, 0.5^2), norm weights
    U(0.5, 1.5) so a norm read as 1 or as 1 + w shows."""
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0, 0.5)
            elif "embed_tokens" in name:
                p.normal_(0, 0.5)
            elif "lm_head" in name:
                p.normal_(0, 4 / p.shape[1] ** 0.5)
            elif p.dim() == 1:  # e.g. the router's selection bias: it must move the choice
                p.normal_(0, 0.5)
            else:  # fan-in is the last dim (2-D Linear rows, fused 3-D experts)
                p.normal_(0, p.shape[-1] ** -0.5)


# Config classes whose checkpoints are a multimodal model (the text model's fields in
# text_config): the class transformers saves and loads them with.
MULTIMODAL = {"Qwen3_5Config": "Qwen3_5ForConditionalGeneration"}


def make_target(tmp, name, cls, kw, seed):
    """-> {dtype: folder}: the same random model saved as float32 and as bfloat16."""
    import torch
    import transformers
    torch.manual_seed(seed)
    if cls in MULTIMODAL:
        cfg = getattr(transformers, cls)(**dict(kw, text_config=dict(COMMON, **kw["text_config"])))
        model = getattr(transformers, MULTIMODAL[cls])(cfg).to(torch.float32)
    else:
        cfg = getattr(transformers, cls)(**dict(COMMON, **kw))
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomize(model)
    dirs = {}
    for dt in ("f32", "bf16"):
        d = os.path.join(tmp, f"{name}-{dt}")
        m = model if dt == "f32" else model.to(torch.bfloat16)
        m.save_pretrained(d, safe_serialization=True)
        write_tokenizer(os.path.join(d, "tokenizer.json"))
        dirs[dt] = d
    return dirs


def load_hf(d):
    """The model in float32. For a bf16 checkpoint that upcasts the stored
    bf16 values exactly, so transformers computes in f32 on the bf16-rounded
    weights -- what the engine does (bf16 weights widened to f32 in its dot
    products, f32 activations and accumulation)."""
    import torch
    import transformers
    arch = json.load(open(os.path.join(d, "config.json")))["architectures"][0]
    cls = getattr(transformers, arch) if arch in MULTIMODAL.values() else \
        transformers.AutoModelForCausalLM
    m = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    return m.eval()


# ---- engine runs ---------------------------------------------------------------------------

def dump(binary, d, ids, kv, decode=None, draft=None, block=None, capture=(), dim=0):
    """-> (logits (n, VOCAB), hidden states (n, len(capture), dim),
    drafter logits (block - 1, VOCAB) or None)."""
    n = len(ids)
    with tempfile.TemporaryDirectory(prefix="hf_oracle-") as tmp:
        out, outd = os.path.join(tmp, "l.bin"), os.path.join(tmp, "d.bin")
        cmd = [binary, "dump", "--model", d, "--ids", ",".join(map(str, ids)), "--out", out,
               "--kv-type", kv, "--threads", "2"]
        if decode is not None:
            cmd += ["--decode", str(decode)]
        if capture:
            cmd += ["--capture", ",".join(map(str, capture))]
        if draft:
            cmd += ["--draft", draft, "--draft-block", str(block), "--out-draft", outd]
        run(cmd)
        raw = np.fromfile(out, dtype="<f4")
        if raw.size != n * (VOCAB + len(capture) * dim):
            raise RuntimeError(f"{out}: {raw.size} floats")
        feat = raw[n * VOCAB:].reshape(n, len(capture), dim)
        dl = np.fromfile(outd, dtype="<f4").reshape(block - 1, VOCAB) if draft else None
    return raw[:n * VOCAB].reshape(n, VOCAB), feat, dl


def generate(binary, d, kv):
    """-> (prompt ids, generated ids) of greedy `dflash generate` (classic decode: no drafter)."""
    r = run([binary, "generate", "-m", d, "--draft", "none", "-p", PROMPT, "-n", str(N_GEN),
             "--ignore-eos", "--kv-type", kv, "--print-token-ids", "-q", "-t", "2"])
    got = {}
    for what in ("prompt", "generated"):
        m = re.search(what + r" ids \(\d+\): \[([0-9, ]*)\]", r.stderr)
        got[what] = [int(x) for x in m.group(1).split(",")] if m and m.group(1) else []
    return got["prompt"], got["generated"]


def compare(ref, got, kv, scale=1.0):
    """-> (ok, max |diff|, tolerance): max |diff| within scale * TOL[kv], and for logits
    the same argmax in every row whose top-2 margin exceeds twice the tolerance."""
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    tol = scale * TOL[kv] * max(1.0, float(np.abs(ref).max()))
    diff = float(np.abs(ref - got).max()) if np.all(np.isfinite(got)) else float("inf")
    if ref.ndim != 2:
        return diff <= tol, diff, tol
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * tol
    same = np.array_equal(ref.argmax(1)[clear], got.argmax(1)[clear])
    return diff <= tol and same, diff, tol


def row(case, dt, mode, kv, diff, tol, ok):
    print(f"  {case:26s} {dt:5s} {mode:9s} kv {kv}: max|diff| {diff:9.3g}  tol {tol:8.3g}  "
          f"{'ok' if ok else 'FAIL'}", flush=True)


HYBRID = ("qwen35", "qwen3next")   # cases with gated DeltaNet layers


# ---- 1 and 2: targets ----------------------------------------------------------------------

def test_target(binary, name, dirs):
    import torch
    ids = np.random.default_rng(100 + len(name)).integers(0, VOCAB, N_PROMPT).tolist()
    for dt, d in dirs.items():
        hf = load_hf(d)
        tcfg = hf.config.get_text_config()
        if dt == "bf16":
            w = hf.lm_head.weight
            check(torch.equal(w, w.to(torch.bfloat16).float()) and
                  json.load(open(os.path.join(d, "config.json")))["dtype"] == "bfloat16",
                  f"{name}: the bf16 checkpoint holds bf16 values")
        # hidden_states[l + 1] is decoder layer l's output, but the last entry is
        # after the final norm: capture all layers but the last.
        cap = list(range(tcfg.num_hidden_layers - 1))
        ref, href = hf_forward(hf, ids, cap, step=name.startswith(HYBRID))
        check(ref.std() > 1.0, f"{name} {dt}: logits spread (std {ref.std():.2f})")
        for mode, dec in (("prefill", None), ("decode", DECODE_FROM)):
            for kv in ("f32", "f16"):
                try:
                    got, feat, _ = dump(binary, d, ids, kv, decode=dec, capture=cap,
                                        dim=tcfg.hidden_size)
                except RuntimeError as e:
                    check(False, f"{name} {dt} {mode} kv {kv}: {e}")
                    continue
                pair = HYBRID_PAIR if name.startswith(HYBRID) and kv == "f32" else 1.0
                ok, diff, tol = compare(ref, got, kv, pair)
                check(ok, f"{name} {dt} {mode} kv {kv}: max |diff| {diff:.3g} > tol {tol:.3g} "
                      "or an argmax differs")
                row(name, dt, mode, kv, diff, tol, ok)
                ok, diff, tol = compare(href, feat, kv, pair)
                check(ok, f"{name} {dt} {mode} kv {kv} hidden {cap}: max |diff| {diff:.3g} > "
                      f"tol {tol:.3g}")
                row(name, dt, mode + "-h", kv, diff, tol, ok)
        if name.startswith(HYBRID):
            test_chunked(binary, name, dt, d, hf, ids)
        if dt == "f32":
            test_generate(binary, name, d, hf)
        if name.startswith(HYBRID):
            test_reference64(binary, name, dt, d, ids, ref)


def hf_forward(hf, ids, cap, step=False):
    """-> transformers' (logits (n, vocab), hidden states (n, len(cap), dim)) of ids: one
    forward, or (step) one token at a time through its cache, its decode path. A hybrid's
    one-forward prefill runs the chunked form of the delta rule, whose rounding differs:
    its step form (the recurrence, as the engine runs it) is the oracle there."""
    import torch
    with torch.no_grad():
        if not step:
            out = hf(torch.tensor([ids]), output_hidden_states=True)
            return out.logits[0].numpy(), torch.stack([out.hidden_states[l + 1][0] for l in cap],
                                                       dim=1).numpy()
        cache, lg, hs = None, [], []
        for t in ids:
            out = hf(torch.tensor([[t]]), cache=cache, use_cache=True, output_hidden_states=True)
            cache = out.cache
            lg.append(out.logits[0, -1])
            hs.append(torch.stack([out.hidden_states[l + 1][0, -1] for l in cap]))
        return torch.stack(lg).numpy(), torch.stack(hs).numpy()


# transformers' chunked prefill against its own step form, relative to max |logit|: up to
# 3e-5 seen (9.2e-4 at logits of 30 in bf16 weights with experts), 4x the step form's error
CHUNKED_TOL = 1e-4


def test_chunked(binary, name, dt, d, hf, ids):
    """The engine against transformers' one-forward prefill (the chunked delta rule), at the
    looser CHUNKED_TOL: the engine's recurrence and transformers' chunked form agree too."""
    import torch
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    got, _, _ = dump(binary, d, ids, "f32")
    ref64, g64 = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    tol = CHUNKED_TOL * max(1.0, float(np.abs(ref64).max()))
    diff = float(np.abs(ref64 - g64).max())
    ok = diff <= tol and np.array_equal(ref64.argmax(1), g64.argmax(1))
    check(ok, f"{name} {dt} chunked: max |diff| {diff:.3g} > tol {tol:.3g} or an argmax differs")
    row(name, dt, "chunked", "f32", diff, tol, ok)


def test_reference64(binary, name, dt, d, ids, ref):
    """A second line for the hybrids: tools/reference.py's float64 numpy forward (the
    DeltaNet in its step form, written from the spec) against transformers' step form
    and against the engine."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "tools"))
    import reference
    cfg, W = reference.load(d)
    r64, _ = reference.forward(cfg, W, ids)
    got, _, _ = dump(binary, d, ids, "f32")
    for what, other, scale in (("ref64-hf", ref, HF_REF64), ("ref64", got, 1.0)):
        ok, diff, tol = compare(r64, other, "f32", scale)
        check(ok, f"{name} {dt} {what}: max |diff| {diff:.3g} > tol {tol:.3g} or an argmax differs")
        row(name, dt, what, "f32", diff, tol, ok)


def test_generate(binary, name, d, hf):
    import torch
    try:
        runs = {kv: generate(binary, d, kv) for kv in ("f32", "f16")}
    except RuntimeError as e:
        return check(False, f"{name}: generate: {e}")
    prompt = runs["f32"][0]
    check(len(prompt) > 8 and runs["f16"][0] == prompt, f"{name}: prompt ids {prompt}")
    hf.generation_config.eos_token_id = None  # as --ignore-eos
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=N_GEN, do_sample=False,
                          output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    want = out.sequences[0, len(prompt):].tolist()
    top2 = torch.stack(out.logits)[:, 0].topk(2, dim=-1).values
    gaps = (top2[:, 0] - top2[:, 1]).tolist()
    # ids are compared up to transformers' first near tie (either choice is right there);
    # a seed whose tie comes before MIN_COMPARED steps is a bad seed, not a pass
    n_cmp = next((i for i, g in enumerate(gaps) if g <= MIN_MARGIN), N_GEN)
    check(n_cmp >= MIN_COMPARED, f"{name}: a near tie (top-2 margin {min(gaps):.3g}) at step "
          f"{n_cmp} of transformers' path: pick another seed")
    for kv, (_, got) in runs.items():
        same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                    min(len(got), len(want)))
        ok = len(got) == N_GEN and got[:n_cmp] == want[:n_cmp]
        check(ok, f"{name}: generate kv {kv}: {len(got)} ids, first difference at {same}\n"
              f"  engine       {got}\n  transformers {want}")
        print(f"  {name:26s} f32   generate  kv {kv}: {same}/{N_GEN} ids equal, compared "
              f"{n_cmp} (to the first top-2 margin <= {MIN_MARGIN})  {'ok' if ok else 'FAIL'}",
              flush=True)


# ---- exactness: verify blocks against decode steps -------------------------------------------

PROBE_IDS = ",".join(str((i * 37 + 5) % TOK_SIZE) for i in range(48))


def test_probe(binary, name, dirs):
    """`dflash probe`: a verify block of 2..16 rows gives the bytes of single-row
    decode (logits and captured features), at every weight type the shapes allow, with
    the prompt past the sliding window many times over."""
    cases = [("f32", dirs["f32"], []), ("bf16", dirs["bf16"], [])]
    if "256" in name:
        cases += [(q, dirs["bf16"], ["--dtype", q]) for q in ("q8_0", "q4_k")]
    for label, d, extra in cases:
        r = subprocess.run([binary, "probe", "-m", d, "--ids", PROBE_IDS, "--block-size", "16",
                            "-t", "2"] + extra, capture_output=True, text=True, timeout=300)
        try:
            sizes = json.loads(r.stdout)["probe"]["sizes"]
        except (ValueError, KeyError) as e:
            check(False, f"{name} {label}: probe output ({e}): {r.stderr[-300:]}")
            continue
        bad = [x["block"] for x in sizes if x["bytes_differ"] or x.get("feat_bytes_differ") or
               x.get("state_bytes_differ")]
        # a hybrid's recurrent states (each verify row's snapshot) are part of what is compared
        states = json.loads(r.stdout)["probe"]["state_bytes_compared"]
        ok = r.returncode == 0 and not bad and len(sizes) == 15 and \
            (states > 0) == name.startswith(HYBRID)
        check(ok, f"{name} {label}: probe blocks {bad} differ from decode (exit {r.returncode})")
        print(f"  {name:26s} {label:5s} probe     B=2..16: {'0 bytes differ' if ok else bad}"
              f"{f' (recurrent states: {states} bytes)' if states else ''}", flush=True)


# ---- speculation on a hybrid: recurrent states rolled back -----------------------------------

SPEC_TARGET = "qwen35-hybrid-untied"


def test_hybrid_spec(binary, dirs):
    """Speculative ids equal classic ids on a Qwen3.5 hybrid, whose DeltaNet states roll back
    through per-row snapshots: (1) test_spec_oracle's forced accept lengths 0..B-1 at blocks
    2..16, mixtures, prefix reuse and stops, with the reference decoded row by row; (2) `dflash
    generate` with a random z-lab drafter (it accepts almost nothing: every round rolls back)
    at pinned and adaptive blocks against --block-size 1."""
    oracle = os.path.join(os.environ.get("DFLASH_BUILD", ""), "test_spec_oracle")
    src = os.environ.get("DFLASH_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for dt, d in dirs[SPEC_TARGET].items():
        if not os.access(oracle, os.X_OK):
            check(False, f"{oracle} missing ($DFLASH_BUILD)")
            break
        r = subprocess.run([oracle], capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, DFLASH_ORACLE_TARGET=d))
        m = re.search(r"(\d+) passed, (\d+) failed, (\d+) skipped", r.stdout + r.stderr)
        ok = r.returncode == 0 and m and int(m.group(1)) > 500 and m.group(2) == m.group(3) == "0"
        check(ok, f"{SPEC_TARGET} {dt}: test_spec_oracle: {r.stdout[-800:]} {r.stderr[-800:]}")
        print(f"  {SPEC_TARGET:26s} {dt:5s} forced accept lengths: "
              f"{m.group(0) if m else 'no summary'}", flush=True)
    for dt, d in dirs[SPEC_TARGET].items():
        dd = d + "-drafter"
        run([sys.executable, os.path.join(src, "tools", "make_checkpoint.py"), "--drafter",
             "--target", d, "--layers", "1", "--block-size", "16", "--quiet", "--out", dd])
        ids = {}
        for b in ("1", "2", "4", "16", "auto"):
            r = run([binary, "generate", "-m", d, "--draft", dd, "-p", PROMPT, "-n", "48",
                     "--ignore-eos", "--block-size", b, "--print-token-ids", "-q", "-t", "2"])
            m = re.search(r"generated ids \(\d+\): \[([0-9, ]*)\]", r.stderr)
            ids[b] = m.group(1) if m else None
        same = [b for b in ids if ids[b] and ids[b] == ids["1"]]
        ok = ids["1"] and len(same) == len(ids)
        check(ok, f"{SPEC_TARGET} {dt}: speculative ids differ from classic: {ids}")
        print(f"  {SPEC_TARGET:26s} {dt:5s} generate --draft: blocks {same} give classic ids",
              flush=True)
        # the probe's drafter diagnostic chains the rounds a pinned run makes, rollbacks included
        r = run([binary, "probe", "-m", d, "--draft", dd, "--block-size", "8", "-n", "40", "-p",
                 PROMPT, "-t", "2"])
        p = re.search(r'"rounds": (\d+), "committed": (\d+)', r.stdout)
        st = os.path.join(os.path.dirname(d), f"stats-{dt}.json")
        run([binary, "generate", "-m", d, "--draft", dd, "-p", PROMPT, "-n", "40", "--ignore-eos",
             "--block-size", "8", "-q", "-t", "2", "--stats-json", st])
        g = json.load(open(st))
        ok = p is not None and (int(p.group(1)), int(p.group(2))) == (g["rounds"], g["committed"])
        check(ok, f"{SPEC_TARGET} {dt}: probe's chained rounds {p and p.groups()} vs generate's "
              f"{g.get('rounds')}, {g.get('committed')}")
        print(f"  {SPEC_TARGET:26s} {dt:5s} probe chain = generate: {p and p.groups()}", flush=True)
        if dt == "f32":
            test_hybrid_batch(d, dd)


def test_hybrid_batch(d, dd):
    """test_batch on the hybrid: rows of several sequences in one forward (decode rows,
    verify blocks, prefill chunks, random rollbacks) keep single-row decode's bits, and
    threads generating at once get what each gets alone."""
    binary = os.path.join(os.environ.get("DFLASH_BUILD", ""), "test_batch")
    if not os.access(binary, os.X_OK):
        return check(False, f"{binary} missing ($DFLASH_BUILD)")
    r = subprocess.run([binary], capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, DFLASH_BATCH_TARGET=d, DFLASH_BATCH_DRAFT=dd))
    m = re.search(r"(\d+) passed, (\d+) failed, (\d+) skipped", r.stdout + r.stderr)
    ok = r.returncode == 0 and m and int(m.group(1)) > 5 and m.group(2) == m.group(3) == "0"
    check(ok, f"{SPEC_TARGET}: test_batch: {r.stdout[-800:]} {r.stderr[-800:]}")
    print(f"  {SPEC_TARGET:26s} f32   batched sequences: {m.group(0) if m else 'no summary'}",
          flush=True)


# ---- 3: the DFlash drafter -----------------------------------------------------------------

def drafter_module(cfg):
    """z-lab's DFlashDraftModel (dflash/model.py) as its modeling file builds it
    from transformers' Qwen3 parts: the context c = hidden_norm(fc(target
    hidden states)) skips input_layernorm; K/V project cat(c, block); q/k
    norms, then RoPE at positions 0..S+B-1 (the queries take the last B); no
    attention mask; the target's embeddings and lm_head outside."""
    import torch
    from torch import nn
    from transformers.models.qwen3 import modeling_qwen3 as q3

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            hd, H, KV = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
            D = cfg.hidden_size
            self.head_dim, self.num_key_value_groups, self.scaling = hd, H // KV, hd ** -0.5
            self.q_proj = nn.Linear(D, H * hd, bias=False)
            self.k_proj = nn.Linear(D, KV * hd, bias=False)
            self.v_proj = nn.Linear(D, KV * hd, bias=False)
            self.o_proj = nn.Linear(H * hd, D, bias=False)
            self.q_norm = q3.Qwen3RMSNorm(hd, eps=cfg.rms_norm_eps)
            self.k_norm = q3.Qwen3RMSNorm(hd, eps=cfg.rms_norm_eps)

        def forward(self, x, ctx, cos, sin):
            b, q_len, s = x.shape[0], x.shape[1], ctx.shape[1]
            q = self.q_norm(self.q_proj(x).view(b, q_len, -1, self.head_dim)).transpose(1, 2)
            kv_in = torch.cat([ctx, x], dim=1)
            k = self.k_norm(self.k_proj(kv_in).view(b, s + q_len, -1, self.head_dim))
            k = k.transpose(1, 2)
            v = self.v_proj(kv_in).view(b, s + q_len, -1, self.head_dim).transpose(1, 2)
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
            q = q * cos[..., -q_len:, :] + q3.rotate_half(q) * sin[..., -q_len:, :]
            k = k * cos + q3.rotate_half(k) * sin
            o, _ = q3.eager_attention_forward(self, q, k, v, None, self.scaling)  # non-causal
            return self.o_proj(o.reshape(b, q_len, -1))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = q3.Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
            self.self_attn = Attention()
            self.post_attention_layernorm = q3.Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
            self.mlp = q3.Qwen3MLP(cfg)

        def forward(self, x, ctx, cos, sin):
            x = x + self.self_attn(self.input_layernorm(x), ctx, cos, sin)
            return x + self.mlp(self.post_attention_layernorm(x))

    class DFlashDraftModel(nn.Module):
        def __init__(self):
            super().__init__()
            K = len(cfg.dflash_config["target_layer_ids"])
            self.fc = nn.Linear(K * cfg.hidden_size, cfg.hidden_size, bias=False)
            self.hidden_norm = q3.Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
            self.layers = nn.ModuleList([Layer() for _ in range(cfg.num_hidden_layers)])
            self.norm = q3.Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
            self.rotary_emb = q3.Qwen3RotaryEmbedding(cfg)

        def forward(self, noise_embedding, target_hidden, position_ids):
            ctx = self.hidden_norm(self.fc(target_hidden))
            cos, sin = self.rotary_emb(noise_embedding, position_ids)
            x = noise_embedding
            for layer in self.layers:
                x = layer(x, ctx, cos, sin)
            return self.norm(x)

    return DFlashDraftModel()


def make_drafter(tmp, tdir, spec, seed):
    """Writes a random drafter folder as z-lab publishes them (spec 1.1/1.2);
    -> (folder, module, config)."""
    import torch
    import transformers
    from safetensors.torch import save_file
    name, dt, L, H, KV, hd, F, B, layer_ids = spec
    tc = json.load(open(os.path.join(tdir, "config.json")))
    fields = dict(
        architectures=["DFlashDraftModel"], auto_map={"AutoModel": "dflash.DFlashDraftModel"},
        model_type="qwen3", hidden_size=tc["hidden_size"], num_hidden_layers=L,
        num_attention_heads=H, num_key_value_heads=KV, head_dim=hd, intermediate_size=F,
        vocab_size=tc["vocab_size"], rms_norm_eps=tc["rms_norm_eps"],
        rope_theta=tc["rope_parameters"]["rope_theta"], rope_scaling=None,
        max_position_embeddings=tc["max_position_embeddings"], hidden_act="silu",
        attention_bias=False, tie_word_embeddings=tc["tie_word_embeddings"],
        block_size=B, num_target_layers=tc["num_hidden_layers"],
        dflash_config={"mask_token_id": TOK_SIZE, "target_layer_ids": layer_ids},
        layer_types=["full_attention"] * L, sliding_window=None, use_sliding_window=False,
        torch_dtype={"f32": "float32", "bf16": "bfloat16"}[dt])
    cfg = transformers.Qwen3Config(**{k: v for k, v in fields.items()
                                      if k not in ("architectures", "auto_map", "model_type")})
    torch.manual_seed(seed)
    m = drafter_module(cfg)
    randomize(m)
    if dt == "bf16":  # computes on the rounded weights; not m.to(), RoPE's inv_freq stays f32
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    d = os.path.join(tmp, name)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(fields, f, indent=2)
    sd = {k: v.to(torch.bfloat16 if dt == "bf16" else torch.float32).contiguous()
          for k, v in m.state_dict().items()}
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    return d, m.eval(), cfg


def test_drafters(binary, dirs):
    import torch
    for i, spec in enumerate(DRAFTERS):
        name, dt, B, layer_ids = spec[0], spec[1], spec[7], spec[8]
        tdir = dirs[DRAFT_TARGET][dt]
        dd, m, cfg = make_drafter(os.path.dirname(tdir), tdir, spec, 30 + i)
        target = load_hf(tdir)
        for n in (2, 13):
            ids = np.random.default_rng(200 + n).integers(0, TOK_SIZE, n).tolist()
            with torch.no_grad():
                hs = target(torch.tensor([ids]), output_hidden_states=True).hidden_states
                # z-lab: hidden_states[l + 1], the output of decoder layer l, rows 0..n-2
                feat = torch.cat([hs[l + 1] for l in layer_ids], dim=-1)[:, :n - 1]
                block = torch.tensor([[ids[-1]] + [TOK_SIZE] * (B - 1)])
                y = m(target.model.embed_tokens(block), feat, torch.arange(n - 1 + B)[None])
                ref = target.lm_head(y)[0, 1:].numpy()
            for kv in ("f32", "f16"):
                try:
                    _, _, got = dump(binary, tdir, ids, kv, draft=dd, block=B)
                except RuntimeError as e:
                    check(False, f"{name}: dump n={n}: {e}")
                    continue
                ok, diff, tol = compare(ref, got, kv)
                check(ok, f"{name} on {DRAFT_TARGET} n={n} kv {kv}: max |diff| {diff:.3g} > tol "
                      f"{tol:.3g} or an argmax differs")
                row(f"{name} n={n} B={B}", dt, "draft", kv, diff, tol, ok)


def torch_ready():
    """torch and transformers importable (set to 2 threads, quiet), else reported missing."""
    try:
        import torch
        import transformers
        torch.set_num_threads(2)
        transformers.utils.logging.disable_progress_bar()
        return True
    except ImportError as e:
        missing(f"torch / transformers ({e})")
        return False


def ready():
    """-> the dflash binary when it and torch / transformers are there, else None
    (reported as missing: a skip, or a failure under CI=true)."""
    binary = find_bin()
    if not binary:
        missing("the dflash binary ($DFLASH_BIN)")
        return None
    return binary if torch_ready() else None


def main():
    t0 = time.time()
    binary = ready()
    if not binary:
        return finish()
    with tempfile.TemporaryDirectory(prefix="test_hf_oracle-") as tmp:
        dirs = {name: make_target(tmp, name, cls, kw, seed) for name, cls, kw, seed in ARCHS}
        print(f"  {'case':26s} {'dtype':5s} {'mode':9s} cache   (tolerance: max|diff| <= TOL * "
              f"max(1, max|reference|), TOL {TOL}; -h: hidden states)", flush=True)
        for name in dirs:
            test_target(binary, name, dirs[name])
        test_drafters(binary, dirs)
        for name in dirs:
            if name.startswith(("laguna", "qwen3moe") + HYBRID):
                test_probe(binary, name, dirs[name])
        test_hybrid_spec(binary, dirs)
    print(f"test_hf_oracle: {time.time() - t0:.1f} s")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
