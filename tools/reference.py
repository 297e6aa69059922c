#!/usr/bin/env python3
"""reference.py - float64 numpy forward passes written from the published definitions.

Targets: Hugging Face modeling_llama / modeling_qwen2 / modeling_qwen3 (and
Mistral, which is Llama's graph):
    x = embed[ids]
    per layer: h = RMSNorm(x) (input_layernorm)
               q, k, v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)     (biases: qwen2)
               q, k = RMSNorm per head (q_norm, k_norm)                (qwen3, before RoPE)
               q, k = RoPE rotate-half at positions 0..n-1 (inv_freq per rope_scaling)
               causal GQA attention, scale hd^-0.5, query head h uses kv head h // (H/KV)
               x += o_proj(attn);  x += down(silu(gate(RMSNorm(x))) * up(RMSNorm(x)))
    logits = lm_head(RMSNorm(x) with model.norm)
RMSNorm(x) = x / sqrt(mean(x^2) + eps) * w. hidden[i] is the output of decoder
layer i, before the final norm (HF hidden_states[i + 1], except that HF's last
entry is after the final norm).

RoPE scaling follows transformers' modeling_rope_utils: "linear" divides
inv_freq by factor; "llama3" keeps high frequencies, divides low ones by
factor and blends the band between; "yarn" ramps between interpolated and
extrapolated frequencies over the correction range of beta_fast/beta_slow at
original_max_position_embeddings, and scales cos/sin by 0.1 ln(factor) + 1.

Qwen3.5 and Qwen3-Next hybrids (spec/architectures.md section 2; forward_qwen35): every
RMSNorm x_hat * (1 + w) but the DeltaNet's gated one; full-attention layers with
q_proj rows [q | gate] per head, q/k norm, partial rotary, out * sigmoid(gate);
gated DeltaNet layers in the step form: depthwise causal conv (kernel K) then
silu, L2-normalised q/k, q / sqrt(d), beta = sigmoid(b), g = -exp(A_log) *
softplus(a + dt_bias), per value head S = e^g S, S += k (beta (v - S^T k))^T,
o = S^T q, then rmsnorm(o) * w * silu(z) and out_proj.

DFlash drafter: spec/dflash.md section 3 (see draft_forward).

Command line, mirroring `dflash dump` (same file formats):
    reference.py --model DIR --ids 1,2,3 [--capture 0,2] --out logits.bin
                 [--draft DDIR --draft-block B --out-draft d.bin]
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_checkpoint  # noqa: E402  (safetensors reading)


# ---- config -------------------------------------------------------------------

def read_config(d):
    with open(os.path.join(d, "config.json")) as f:
        return json.load(f)


def dims(cfg):
    """The few numbers a forward needs, from a Hugging Face config dict."""
    D, H = cfg["hidden_size"], cfg["num_attention_heads"]
    mt = cfg.get("model_type", "llama")
    return dict(
        arch=mt, dim=D, layers=cfg["num_hidden_layers"], heads=H,
        kv_heads=cfg.get("num_key_value_heads") or H,
        head_dim=cfg.get("head_dim") or D // H,
        ffn=cfg["intermediate_size"], vocab=cfg["vocab_size"],
        eps=float(cfg.get("rms_norm_eps", 1e-6)),
        qkv_bias=mt == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_norm=mt == "qwen3" or cfg.get("architectures", [""])[0] == "DFlashDraftModel",
        tied=bool(cfg.get("tie_word_embeddings", False)),
    )


def rope_params(cfg):
    """-> (inv_freq float64 (head_dim/2,), attention scaling of cos/sin)."""
    dm = dims(cfg)
    hd = dm["head_dim"]
    base = float(cfg.get("rope_theta", 10000.0))
    inv = 1.0 / base ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind in ("default", None):
        return inv, 1.0
    if kind == "linear":
        return inv / float(rs["factor"]), 1.0
    if kind == "llama3":
        factor = float(rs["factor"])
        lo, hi = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old = float(rs["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        out = np.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        blended = (1 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        return np.where(medium, blended, out), 1.0
    if kind == "yarn":
        maxpos = cfg.get("max_position_embeddings")
        orig = rs.get("original_max_position_embeddings") or maxpos
        factor = rs.get("factor")
        if factor is None:
            factor = maxpos / orig
        factor = float(factor)

        def mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        att = rs.get("attention_factor")
        if att is None:
            if rs.get("mscale") and rs.get("mscale_all_dim"):
                att = mscale(factor, rs["mscale"]) / mscale(factor, rs["mscale_all_dim"])
            else:
                att = mscale(factor)
        beta_fast = rs.get("beta_fast") or 32
        beta_slow = rs.get("beta_slow") or 1

        def corr_dim(rot):
            return hd * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if rs.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, hd - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(hd // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extra = 1 - ramp  # 1: keep the original frequency, 0: interpolate
        return inv / factor * (1 - extra) + inv * extra, float(att)
    raise ValueError(f"rope_scaling type {kind!r} not supported by the reference")


# ---- building blocks ------------------------------------------------------------

def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def rope(x, pos, inv, scale, interleaved=False):
    """x: (n, heads, hd) at positions pos (n,). Rotate-half pairs (i, i+hd/2)
    as Hugging Face; interleaved pairs (2i, 2i+1) as Meta / GGUF llama."""
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv[None, :]  # (n, hd/2)
    cos, sin = (np.cos(ang) * scale)[:, None, :], (np.sin(ang) * scale)[:, None, :]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = b * cos + a * sin
        return out
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def attention(q, k, v, causal, q_pos=None, k_pos=None):
    """q (n, H, hd), k/v (m, KV, hd) -> (n, H*hd). Causal: key j visible to query
    i when k_pos[j] <= q_pos[i]."""
    n, H, hd = q.shape
    rep = H // k.shape[1]
    out = np.empty((n, H, hd))
    for h in range(H):
        s = q[:, h, :] @ k[:, h // rep, :].T * hd ** -0.5  # (n, m)
        if causal:
            s = np.where(np.asarray(k_pos)[None, :] <= np.asarray(q_pos)[:, None], s, -np.inf)
        s = s - s.max(axis=1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=1, keepdims=True)
        out[:, h, :] = p @ v[:, h // rep, :]
    return out.reshape(n, H * hd)


# ---- target ---------------------------------------------------------------------

def load(d):
    """-> (config dict, {name: float64 array}) of a Hugging Face folder."""
    cfg = read_config(d)
    w = {k: v.astype(np.float64) for k, v in make_checkpoint.load_dir(d).items()}
    return cfg, w


def gated_deltanet(cfg, W, p, h):
    """One gated DeltaNet mixer over rows h (n, dim) from a zero state, step by step."""
    Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    K = cfg["linear_conv_kernel_dim"]
    n, r = h.shape[0], Hv // Hk
    if p + "in_proj_qkvz.weight" in W:  # Qwen3-Next: per key head [q | k | v | z] and [b | a]
        g = (h @ W[p + "in_proj_qkvz.weight"].T).reshape(n, Hk, 2 * dk + 2 * r * dv)
        q, k, v, z = np.split(g, [dk, 2 * dk, 2 * dk + r * dv], axis=-1)
        mixed = np.concatenate([q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)], axis=1)
        ba = (h @ W[p + "in_proj_ba.weight"].T).reshape(n, Hk, 2 * r)
        b_in, a_in, z = ba[..., :r].reshape(n, Hv), ba[..., r:].reshape(n, Hv), z.reshape(n, -1)
    else:
        mixed = h @ W[p + "in_proj_qkv.weight"].T                  # (n, C)
        b_in, a_in = h @ W[p + "in_proj_b.weight"].T, h @ W[p + "in_proj_a.weight"].T
        z = h @ W[p + "in_proj_z.weight"].T
    w = W[p + "conv1d.weight"][:, 0, :]                           # (C, K)
    pad = np.concatenate([np.zeros((K - 1, mixed.shape[1])), mixed])
    x = silu(np.stack([(pad[t:t + K] * w.T).sum(axis=0) for t in range(n)]))
    q, k = x[:, :Hk * dk].reshape(n, Hk, dk), x[:, Hk * dk:2 * Hk * dk].reshape(n, Hk, dk)
    v = x[:, 2 * Hk * dk:].reshape(n, Hv, dv)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(dk)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    beta = 1 / (1 + np.exp(-b_in))                                 # (n, Hv)
    g = -np.exp(W[p + "A_log"]) * np.logaddexp(0, a_in + W[p + "dt_bias"])   # softplus
    z = z.reshape(n, Hv, dv)
    S, o = np.zeros((Hv, dk, dv)), np.zeros((n, Hv, dv))
    for t in range(n):
        for j in range(Hv):
            kt, qt = k[t, j // r], q[t, j // r]
            S[j] *= np.exp(g[t, j])
            S[j] += np.outer(kt, beta[t, j] * (v[t, j] - S[j].T @ kt))
            o[t, j] = S[j].T @ qt
    o = rmsnorm(o, W[p + "norm.weight"], cfg["rms_norm_eps"]) * silu(z)
    return o.reshape(n, Hv * dv) @ W[p + "out_proj.weight"].T


def mlp(W, p, h):
    """SwiGLU: down(silu(gate h) * up h)."""
    return (silu(h @ W[p + "gate_proj.weight"].T) * (h @ W[p + "up_proj.weight"].T)) @ \
        W[p + "down_proj.weight"].T


def moe(cfg, W, p, h):
    """Qwen MoE: softmax router, top k renormalised, experts one tensor each (as saved) or
    fused, plus the shared expert times sigmoid(shared_expert_gate h)."""
    E, K = cfg["num_experts"], cfg["num_experts_per_tok"]
    logits = h @ W[p + "gate.weight"].T
    prob = np.exp(logits - logits.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    out = np.zeros_like(h)
    for r in range(h.shape[0]):
        top = np.argsort(-prob[r], kind="stable")[:K]
        w = prob[r, top] / prob[r, top].sum() if cfg.get("norm_topk_prob", True) else prob[r, top]
        for e, we in zip(top, w):
            if p + "experts.gate_up_proj" in W:
                gu = W[p + "experts.gate_up_proj"][e] @ h[r]
                I = gu.shape[0] // 2
                out[r] += we * (W[p + "experts.down_proj"][e] @ (silu(gu[:I]) * gu[I:]))
            else:
                out[r] += we * mlp(W, f"{p}experts.{e}.", h[r:r + 1])[0]
    sh = mlp(W, p + "shared_expert.", h)
    if p + "shared_expert_gate.weight" in W:
        sh = sh / (1 + np.exp(-(h @ W[p + "shared_expert_gate.weight"].T)))
    return out + sh


def forward_qwen35(cfg, W, ids):
    """Qwen3.5 dense: -> (logits, hidden) as forward's."""
    cfg = cfg.get("text_config", cfg)
    pre = "model.language_model." if "model.language_model.norm.weight" in W else "model."
    D, H, KV, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], \
        cfg["head_dim"]
    eps, rp = cfg["rms_norm_eps"], cfg.get("rope_parameters") or {}
    rot = int(hd * rp.get("partial_rotary_factor", 0.25))
    inv = 1.0 / rp.get("rope_theta", 10000.0) ** (np.arange(0, rot, 2, dtype=np.float64) / rot)
    norm = lambda x, name: rmsnorm(x, 1 + W[name], eps)  # noqa: E731
    ids = np.asarray(ids, dtype=np.int64)
    n, pos = len(ids), np.arange(len(ids))
    x = W[pre + "embed_tokens.weight"][ids].copy()
    hidden = []
    for i, kind in enumerate(cfg["layer_types"]):
        p = f"{pre}layers.{i}."
        h = norm(x, p + "input_layernorm.weight")
        if kind == "linear_attention":
            x = x + gated_deltanet(cfg, W, p + "linear_attn.", h)
        else:
            qg = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(n, H, 2 * hd)
            q, gate = norm(qg[..., :hd], p + "self_attn.q_norm.weight"), qg[..., hd:]
            k = norm((h @ W[p + "self_attn.k_proj.weight"].T).reshape(n, KV, hd),
                     p + "self_attn.k_norm.weight")
            v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(n, KV, hd)
            q[..., :rot], k[..., :rot] = rope(q[..., :rot], pos, inv, 1.0), \
                rope(k[..., :rot], pos, inv, 1.0)
            att = attention(q, k, v, True, pos, pos) / (1 + np.exp(-gate.reshape(n, H * hd)))
            x = x + att @ W[p + "self_attn.o_proj.weight"].T
        h = norm(x, p + "post_attention_layernorm.weight")
        x = x + (moe(cfg, W, p + "mlp.", h) if p + "mlp.gate.weight" in W else mlp(W, p + "mlp.", h))
        hidden.append(x.copy())
    y = norm(x, pre + "norm.weight")
    head = W["lm_head.weight"] if "lm_head.weight" in W else W[pre + "embed_tokens.weight"]
    return y @ head.T, np.stack(hidden)


def forward(cfg, W, ids, interleaved=False, kv_f16=False):
    """-> (logits (n, vocab), hidden (n_layers, n, dim)) for ids at positions 0..n-1.

    interleaved=True runs Meta/GGUF-llama RoPE (q/k rows permuted); used to
    check a converted file's weights. kv_f16=True rounds K (after RoPE) and V
    to float16 before attention, as an f16 KV cache stores them."""
    if cfg.get("model_type", "").startswith(("qwen3_5", "qwen3_next")):
        return forward_qwen35(cfg, W, ids)
    dm = dims(cfg)
    inv, scale = rope_params(cfg)
    H, KV, hd, eps = dm["heads"], dm["kv_heads"], dm["head_dim"], dm["eps"]
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids)
    pos = np.arange(n)
    x = W["model.embed_tokens.weight"][ids].copy()
    hidden = []
    for i in range(dm["layers"]):
        p = f"model.layers.{i}."
        h = rmsnorm(x, W[p + "input_layernorm.weight"], eps)
        q = h @ W[p + "self_attn.q_proj.weight"].T
        k = h @ W[p + "self_attn.k_proj.weight"].T
        v = h @ W[p + "self_attn.v_proj.weight"].T
        if dm["qkv_bias"]:
            q, k, v = (q + W[p + "self_attn.q_proj.bias"], k + W[p + "self_attn.k_proj.bias"],
                       v + W[p + "self_attn.v_proj.bias"])
        q, k, v = q.reshape(n, H, hd), k.reshape(n, KV, hd), v.reshape(n, KV, hd)
        if dm["qk_norm"]:
            q = rmsnorm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rmsnorm(k, W[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, pos, inv, scale, interleaved), rope(k, pos, inv, scale, interleaved)
        if kv_f16:
            k, v = (a.astype(np.float16).astype(np.float64) for a in (k, v))
        x = x + attention(q, k, v, True, pos, pos) @ W[p + "self_attn.o_proj.weight"].T
        if p + "self_attn.o_proj.bias" in W:  # Llama with attention_bias
            x = x + W[p + "self_attn.o_proj.bias"]
        h = rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps)
        g = silu(h @ W[p + "mlp.gate_proj.weight"].T) * (h @ W[p + "mlp.up_proj.weight"].T)
        x = x + g @ W[p + "mlp.down_proj.weight"].T
        hidden.append(x.copy())
    y = rmsnorm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if dm["tied"] or "lm_head.weight" not in W \
        else W["lm_head.weight"]
    return y @ head.T, np.stack(hidden)


# ---- DFlash drafter ---------------------------------------------------------------

def load_drafter(d):
    """-> (config, weights) with any "model." key prefix stripped."""
    cfg = read_config(d)
    w = {}
    for k, v in make_checkpoint.load_dir(d).items():
        w[k[6:] if k.startswith("model.") else k] = v.astype(np.float64)
    return cfg, w


def draft_forward(dcfg, DW, tcfg, TW, feat, ctx_pos, anchor, start, B):
    """One DFlash draft call (spec section 3). feat: (S, K*D) target features
    (concatenated in target_layer_ids order) of the context rows at positions
    ctx_pos; block [anchor, mask x (B-1)] at positions start..start+B-1.
    -> logits (B-1, vocab) of block rows 1..B-1."""
    dm = dims(dcfg)
    inv, scale = rope_params(dcfg)
    H, KV, hd, eps = dm["heads"], dm["kv_heads"], dm["head_dim"], dm["eps"]
    mask = dcfg["dflash_config"]["mask_token_id"]
    c = rmsnorm(np.asarray(feat, dtype=np.float64) @ DW["fc.weight"].T, DW["hidden_norm.weight"], eps)
    S = c.shape[0]
    embed = TW["model.embed_tokens.weight"]
    x = embed[[anchor] + [mask] * (B - 1)].copy()
    bpos = start + np.arange(B)
    for i in range(dm["layers"]):
        p = f"layers.{i}."
        wq, wk, wv = (DW[p + "self_attn.q_proj.weight"], DW[p + "self_attn.k_proj.weight"],
                      DW[p + "self_attn.v_proj.weight"])
        qn, kn = DW[p + "self_attn.q_norm.weight"], DW[p + "self_attn.k_norm.weight"]
        u = rmsnorm(x, DW[p + "input_layernorm.weight"], eps)
        q = rope(rmsnorm((u @ wq.T).reshape(B, H, hd), qn, eps), bpos, inv, scale)
        kb = rope(rmsnorm((u @ wk.T).reshape(B, KV, hd), kn, eps), bpos, inv, scale)
        vb = (u @ wv.T).reshape(B, KV, hd)
        # the context skips input_layernorm: K/V straight from c
        kc = rope(rmsnorm((c @ wk.T).reshape(S, KV, hd), kn, eps), ctx_pos, inv, scale)
        vc = (c @ wv.T).reshape(S, KV, hd)
        k, v = np.concatenate([kc, kb]), np.concatenate([vc, vb])
        x = x + attention(q, k, v, False) @ DW[p + "self_attn.o_proj.weight"].T  # no mask
        h = rmsnorm(x, DW[p + "post_attention_layernorm.weight"], eps)
        g = silu(h @ DW[p + "mlp.gate_proj.weight"].T) * (h @ DW[p + "mlp.up_proj.weight"].T)
        x = x + g @ DW[p + "mlp.down_proj.weight"].T
    y = rmsnorm(x, DW["norm.weight"], eps)
    tied = dims(tcfg)["tied"] or "lm_head.weight" not in TW
    head = embed if tied else TW["lm_head.weight"]
    return (y @ head.T)[1:]


def dump(model_dir, ids, capture=(), draft_dir=None, block=None, kv_f16=False):
    """What `dflash dump` writes: (logits (n, vocab), feat (n, n_cap, dim) or None,
    draft logits (B-1, vocab) or None). The drafter's context is the features
    of rows 0..n-2, its anchor ids[n-1] at position n-1. kv_f16: the target's
    K/V cache holds float16 (dump's default --kv-type)."""
    cfg, W = load(model_dir)
    logits, hidden = forward(cfg, W, ids, kv_f16=kv_f16)
    feat = np.stack([hidden[j] for j in capture], axis=1) if capture else None
    dl = None
    if draft_dir:
        dcfg, DW = load_drafter(draft_dir)
        B = block or dcfg.get("block_size", 16)
        tl = dcfg["dflash_config"]["target_layer_ids"]
        n = len(ids)
        f = np.concatenate([hidden[j][:n - 1] for j in tl], axis=1)
        dl = draft_forward(dcfg, DW, cfg, W, f, np.arange(n - 1), int(ids[-1]), n - 1, B)
    return logits, feat, dl


def main(argv=None):
    ap = argparse.ArgumentParser(description="numpy float64 reference of `dflash dump`")
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--capture", help="comma-separated layers whose outputs follow the logits")
    ap.add_argument("--out", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--draft-block", type=int)
    ap.add_argument("--out-draft")
    ap.add_argument("--kv-type", choices=("f16", "f32"), default="f16")
    a = ap.parse_args(argv)
    ids = [int(x) for x in a.ids.split(",")]
    cap = [int(x) for x in a.capture.split(",")] if a.capture else []
    logits, feat, dl = dump(a.model, ids, cap, a.draft, a.draft_block, a.kv_type == "f16")
    with open(a.out, "wb") as f:
        f.write(logits.astype("<f4").tobytes())
        if feat is not None:
            f.write(feat.astype("<f4").tobytes())
    if dl is not None and a.out_draft:
        with open(a.out_draft, "wb") as f:
            f.write(dl.astype("<f4").tobytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
