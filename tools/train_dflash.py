#!/usr/bin/env python3
"""train_dflash.py - trains a DFlash drafter from `dflash capture` output.

    dflash capture -m TARGET --corpus text.txt --generate 256 --layers 1,3 --out /tmp/cap
    tools/train_dflash.py --capture /tmp/cap --out DRAFTER --block-size 8 --layers 2 \\
        --mask-id 0 --steps 3000

The recipe is SpecForge's (spec/dflash.md section 10; docs/training.md):
  - the target is frozen: its token embedding and lm_head (from the capture)
    are used as they are and never trained; its hidden features of the
    captured layers are the drafter's context;
  - per sequence, random anchor positions a; each anchor gets a block
    [token at a, mask x (B-1)] at positions a .. a+B-1;
  - a block row sees the context rows at positions < a (strictly) and all B
    rows of its own block (bidirectional); blocks never see each other;
  - block row k (1..B-1) predicts the token at a+k with cross-entropy,
    optionally weighted exp(-(k-1)/gamma); row 0 (the anchor) has no loss.
AdamW, linear warm-up then cosine decay, fixed seeds; progress lines with
loss, per-position accuracy and the greedy acceptance the batch implies;
resumable checkpoints (--resume). The result is a z-lab drafter folder
(config.json with dflash_config + model.safetensors) that `dflash generate
--draft` loads like any published one.

The drafter forward is spec section 3 (context through fc and hidden_norm,
no input_layernorm on it; per-head q/k RMSNorm before rotate-half RoPE; no
attention mask beyond the one above; final norm; the target's lm_head).
Python API (tests): Drafter, load_capture, make_batch, block_mask,
loss_and_stats, export, load_drafter_dir.
"""
import argparse
import glob
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":
    import fast_blas
    fast_blas.reexec()

import numpy as np  # noqa: E402
import torch  # noqa: E402

import make_checkpoint  # noqa: E402


# ---- the capture ----------------------------------------------------------------

class Capture:
    """dflash capture output, memory-mapped (layout in capture.json)."""

    def __init__(self, d):
        with open(os.path.join(d, "capture.json")) as f:
            self.meta = m = json.load(f)
        if m.get("format") != "dflash-capture" or m.get("version") != 1:
            raise SystemExit(f"train_dflash: {d}/capture.json is not a dflash-capture v1 file")
        self.dir = d
        self.layers = list(m["layers"])
        self.dim, self.vocab = m["dim"], m["vocab"]
        self.tokens = np.fromfile(os.path.join(d, m["files"]["tokens"]), dtype="<i4")
        self.seqs = np.fromfile(os.path.join(d, m["files"]["seqs"]), dtype="<i4").reshape(-1, 3)
        n = len(self.tokens)
        if n != m["n_rows"] or len(self.seqs) != m["n_seqs"]:
            raise SystemExit(f"train_dflash: {d}: tokens/seqs do not match capture.json "
                             "(was the capture interrupted?)")
        self.features = np.memmap(os.path.join(d, m["files"]["features"]), dtype="<f4", mode="r",
                                  shape=(n, len(self.layers), self.dim))
        self.embed = np.fromfile(os.path.join(d, m["files"]["embed"]), dtype="<f4").reshape(
            self.vocab, self.dim)
        lm = m["files"].get("lm_head")
        self.lm_head = self.embed if not lm else np.fromfile(
            os.path.join(d, lm), dtype="<f4").reshape(self.vocab, self.dim)
        self.tied = not lm
        self.n_rows = n


def same_target(p0, p):
    if (p.dim, p.vocab) != (p0.dim, p0.vocab) or not np.array_equal(p.embed, p0.embed):
        raise SystemExit(f"train_dflash: {getattr(p, 'dir', '?')} and "
                         f"{getattr(p0, 'dir', '?')} capture different targets")


class Captures:
    """Several captures of one target read as one: sequences numbered in order;
    the layers are those every part captured."""

    def __init__(self, parts):
        self.parts = parts
        p0 = parts[0]
        for p in parts[1:]:
            same_target(p0, p)
        self.layers = [x for x in p0.layers if all(x in p.layers for p in parts)]
        self.meta, self.dim, self.vocab = p0.meta, p0.dim, p0.vocab
        self.embed, self.lm_head, self.tied = p0.embed, p0.lm_head, p0.tied
        self.index = [(k, i) for k, p in enumerate(parts) for i in range(len(p.seqs))]
        self.seqs = np.concatenate([p.seqs for p in parts])
        self.n_rows = sum(len(p.tokens) for p in parts)

    def add(self, p, layers):
        """Appends a capture of the same target (one finished while training
        ran, see --watch) that holds the layers in use; -> its sequences'
        numbers."""
        same_target(self.parts[0], p)
        if any(x not in p.layers for x in layers):
            raise SystemExit(f"train_dflash: {p.dir} lacks some of layers {layers}")
        k, first = len(self.parts), len(self.seqs)
        self.parts.append(p)
        self.index += [(k, i) for i in range(len(p.seqs))]
        self.seqs = np.concatenate([self.seqs, p.seqs])
        self.n_rows += len(p.tokens)
        return np.arange(first, len(self.seqs))


def load_capture(dirs):
    """One folder or a list of them."""
    if isinstance(dirs, str):
        return Capture(dirs)
    return Captures([Capture(d) for d in dirs])


def seq_rows(cap, i, max_len, layers):
    """Sequence i of a capture: (ids (n,), features (n, len(layers), dim) of those
    target layers, prompt rows), cut to its first max_len rows."""
    if hasattr(cap, "parts"):
        k, i = cap.index[i]
        cap = cap.parts[k]
    a0, n, npr = (int(x) for x in cap.seqs[i])
    n = min(n, max_len)
    cols = [cap.layers.index(x) for x in layers]
    return cap.tokens[a0:a0 + n], cap.features[a0:a0 + n][:, cols], npr


# ---- the drafter ------------------------------------------------------------------

def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, inv_freq):
    """Rotate-half RoPE. x (..., n, heads, hd), pos (..., n) integer positions."""
    ang = pos.to(torch.float32)[..., None] * inv_freq            # (..., n, hd/2)
    cos, sin = ang.cos()[..., None, :], ang.sin()[..., None, :]  # (..., n, 1, hd/2)
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


class Layer(torch.nn.Module):
    def __init__(self, D, H, KV, hd, F):
        super().__init__()
        L = torch.nn.Linear
        self.input_layernorm = torch.nn.Parameter(torch.ones(D))            # (D)
        self.post_attention_layernorm = torch.nn.Parameter(torch.ones(D))   # (D)
        self.q_proj = L(D, H * hd, bias=False)      # (H*hd, D)
        self.k_proj = L(D, KV * hd, bias=False)     # (KV*hd, D)
        self.v_proj = L(D, KV * hd, bias=False)     # (KV*hd, D)
        self.o_proj = L(H * hd, D, bias=False)      # (D, H*hd)
        self.q_norm = torch.nn.Parameter(torch.ones(hd))  # (hd)
        self.k_norm = torch.nn.Parameter(torch.ones(hd))  # (hd)
        self.gate_proj = L(D, F, bias=False)        # (F, D)
        self.up_proj = L(D, F, bias=False)          # (F, D)
        self.down_proj = L(F, D, bias=False)        # (D, F)


class Drafter(torch.nn.Module):
    """DFlashDraftModel (spec section 3); embed / lm_head are the target's,
    passed in frozen."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        D, K = cfg["dim"], len(cfg["target_layer_ids"])
        self.H, self.KV, self.hd = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
        self.eps = cfg["eps"]
        self.fc = torch.nn.Linear(K * D, D, bias=False)          # (D, K*D)
        self.hidden_norm = torch.nn.Parameter(torch.ones(D))     # (D)
        self.layers = torch.nn.ModuleList(
            Layer(D, self.H, self.KV, self.hd, cfg["ffn"]) for _ in range(cfg["layers"]))
        self.norm = torch.nn.Parameter(torch.ones(D))            # (D)
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, self.hd, 2, dtype=torch.float64)
                                           / self.hd))
        self.register_buffer("inv_freq", inv.to(torch.float32), persistent=False)
        for m in self.modules():
            if isinstance(m, torch.nn.Linear):
                torch.nn.init.normal_(m.weight, std=0.02)

    def context(self, feat):
        """feat (S, T, K*D) -> c (S, T, D) = hidden_norm(fc(feat))."""
        return rmsnorm(self.fc(feat), self.hidden_norm, self.eps)

    def attend(self, q, kb, vb, kc, vc, see, see_blk=None):
        """One softmax over [context rows the block may see ; its own B rows],
        computed as two parts so no block ever meets another block's keys.
        q (S,A,B,H,hd), kb/vb (S,A,B,KV,hd), kc/vc (S,T,KV,hd), see (S,1,A*B,T);
        see_blk (S,A,1,1,B): the block's rows that exist (shortened blocks)."""
        S, A, B, H, hd = q.shape
        T, rep = kc.shape[1], self.H // self.KV
        if rep > 1:
            kb, vb = kb.repeat_interleave(rep, 3), vb.repeat_interleave(rep, 3)
            kc, vc = kc.repeat_interleave(rep, 2), vc.repeat_interleave(rep, 2)
        scale = hd ** -0.5
        qc = q.reshape(S, A * B, H, hd).transpose(1, 2)                      # (S, H, N, hd)
        s_ctx = (qc @ kc.permute(0, 2, 3, 1)) * scale                        # (S, H, N, T)
        s_ctx = s_ctx.masked_fill(~see, float("-inf"))
        qb = q.permute(0, 1, 3, 2, 4)                                        # (S, A, H, B, hd)
        s_blk = (qb @ kb.permute(0, 1, 3, 4, 2)) * scale                     # (S, A, H, B, B)
        if see_blk is not None:
            s_blk = s_blk.masked_fill(~see_blk, float("-inf"))
        lse_c = torch.logsumexp(s_ctx, -1).view(S, H, A, B).permute(0, 2, 1, 3)  # (S,A,H,B)
        lse = torch.logaddexp(lse_c, torch.logsumexp(s_blk, -1))             # (S, A, H, B)
        lse_n = lse.permute(0, 2, 1, 3).reshape(S, H, A * B, 1)
        o_ctx = torch.exp(s_ctx - lse_n) @ vc.transpose(1, 2)                # (S, H, N, hd)
        o_blk = torch.exp(s_blk - lse[..., None]) @ vb.permute(0, 1, 3, 2, 4)  # (S,A,H,B,hd)
        return o_ctx.view(S, H, A, B, hd).permute(0, 2, 3, 1, 4) + o_blk.permute(0, 1, 3, 2, 4)

    def forward(self, feat, ids, anchors, embed, lm_head, mask_id, B, blen=None):
        """feat (S, T, K*D) captured features; ids (S, T) tokens; anchors (S, A)
        positions (>= 1); embed / lm_head (V, D) frozen target tables; blen
        (S, A) optional block lengths <= B: a block of blen rows is drafted
        exactly as inference drafts a block of that size (its rows past blen
        do not exist for it; their logits are meaningless).
        -> logits (S, A, B-1, V) of block rows 1..B-1."""
        S, T = ids.shape
        A = anchors.shape[1]
        c = self.context(feat)                                            # (S, T, D)
        tok = torch.full((S, A, B), mask_id, dtype=torch.long)
        tok[:, :, 0] = torch.gather(ids, 1, anchors)
        x = embed[tok]                                                    # (S, A, B, D)
        bpos = anchors[..., None] + torch.arange(B)                       # (S, A, B)
        cpos = torch.arange(T).expand(S, T)                               # (S, T)
        see = block_mask(anchors, T, B).reshape(S, 1, A * B, T)          # (S, 1, A*B, T)
        see_blk = None if blen is None else \
            (torch.arange(B) < blen[..., None])[:, :, None, None, :]      # (S, A, 1, 1, B)
        for ly in self.layers:
            u = rmsnorm(x, ly.input_layernorm, self.eps)
            q = rope(rmsnorm(ly.q_proj(u).view(S, A, B, self.H, self.hd), ly.q_norm, self.eps),
                     bpos, self.inv_freq)
            kb = rope(rmsnorm(ly.k_proj(u).view(S, A, B, self.KV, self.hd), ly.k_norm, self.eps),
                      bpos, self.inv_freq)
            vb = ly.v_proj(u).view(S, A, B, self.KV, self.hd)
            # the context skips input_layernorm (Qwen3 DFlash)
            kc = rope(rmsnorm(ly.k_proj(c).view(S, T, self.KV, self.hd), ly.k_norm, self.eps),
                      cpos, self.inv_freq)
            vc = ly.v_proj(c).view(S, T, self.KV, self.hd)
            o = self.attend(q, kb, vb, kc, vc, see, see_blk)              # (S, A, B, H, hd)
            x = x + ly.o_proj(o.reshape(S, A, B, self.H * self.hd))
            h = rmsnorm(x, ly.post_attention_layernorm, self.eps)
            x = x + ly.down_proj(torch.nn.functional.silu(ly.gate_proj(h)) * ly.up_proj(h))
        y = rmsnorm(x[:, :, 1:], self.norm, self.eps)
        return y @ lm_head.T


def block_mask(anchors, T, B):
    """(S, A, B, T) bool: block row b of anchor a sees context row t iff t < a.
    Together with full visibility inside the block (and no key of any other
    block in the key set) this is SpecForge's mask."""
    t = torch.arange(T)
    return (t[None, None, :] < anchors[..., None]).unsqueeze(2).expand(-1, -1, B, -1)


# ---- batches ----------------------------------------------------------------------

def valid_anchors(n, n_prompt):
    """Anchor positions of one sequence: the target's own tokens (>= n_prompt,
    and >= 1 so the context is never empty) with at least one label after."""
    lo = max(1, n_prompt)
    return np.arange(lo, n - 1)


def make_batch(cap, seq_idx, A, B, rng, max_len, layers, anchors_fixed=None, mix=0.0):
    """-> dict of tensors: feat (S, T, K*D), ids (S, T), anchors (S, A),
    labels (S, A, B-1) (-1 where none), blen (S, A) block lengths: B, or with
    probability mix a length drawn from 2..B-1 (rows past it get no label).
    Sequences longer than max_len are cut to their first max_len rows."""
    rows = [seq_rows(cap, i, max_len, layers) for i in seq_idx]
    S, T = len(rows), max(len(r[0]) for r in rows)
    K, D = len(layers), cap.dim
    feat = np.zeros((S, T, K, D), dtype=np.float32)
    ids = np.zeros((S, T), dtype=np.int64)
    anchors = np.ones((S, A), dtype=np.int64)
    labels = np.full((S, A, B - 1), -1, dtype=np.int64)
    for s, (tk, ft, npr) in enumerate(rows):
        n = len(tk)
        feat[s, :n] = ft
        ids[s, :n] = tk
        if anchors_fixed is not None:
            an = anchors_fixed[s]
        else:
            va = valid_anchors(n, npr)
            if len(va) == 0:
                continue
            an = np.sort(rng.choice(va, size=min(A, len(va)), replace=False))
        anchors[s, :len(an)] = an
        for j, a in enumerate(an):
            k = np.arange(1, B)
            ok = a + k < n
            labels[s, j, ok] = ids[s, a + k[ok]]
    blen = np.full((S, A), B, dtype=np.int64)
    if mix > 0 and B > 2:
        short = rng.random((S, A)) < mix
        blen[short] = rng.integers(2, B, size=int(short.sum()))
        labels[np.arange(1, B)[None, None, :] >= blen[..., None]] = -1
    return {"feat": torch.from_numpy(feat.reshape(S, T, K * D)), "ids": torch.from_numpy(ids),
            "blen": torch.from_numpy(blen),
            "anchors": torch.from_numpy(anchors), "labels": torch.from_numpy(labels)}


def loss_and_stats(logits, labels, gamma):
    """Weighted cross-entropy over block rows 1..B-1 (weight exp(-(k-1)/gamma),
    1 when gamma <= 0) and what greedy verification would accept.
    -> loss, per-position accuracy (B-1), mean accepted prefix over anchors
    whose labels all exist (nan when none)."""
    Bm1 = labels.shape[-1]
    valid = labels >= 0
    k = torch.arange(Bm1, dtype=torch.float32)
    w = torch.exp(-k / gamma) if gamma > 0 else torch.ones(Bm1)
    w = w.expand_as(labels) * valid
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           labels.clamp(min=0).reshape(-1), reduction="none")
    loss = (ce * w.reshape(-1)).sum() / w.sum().clamp(min=1e-9)
    with torch.no_grad():
        hit = (logits.argmax(-1) == labels) & valid
        acc = hit.sum((0, 1)).float() / valid.sum((0, 1)).clamp(min=1).float()
        full = valid.all(-1)
        prefix = hit.long().cumprod(-1).sum(-1).float()
        accepted = prefix[full].mean().item() if full.any() else float("nan")
    return loss, acc, accepted


# ---- training ---------------------------------------------------------------------

def lr_at(step, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (a.min_lr_ratio + (1 - a.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def drafter_cfg(a, cap, layers):
    D = cap.dim
    hd = a.head_dim or D // a.heads
    return {"dim": D, "layers": a.layers, "heads": a.heads, "kv_heads": a.kv_heads or a.heads,
            "head_dim": hd, "ffn": a.ffn or 4 * D, "target_layer_ids": layers,
            "eps": a.eps, "rope_theta": a.rope_theta, "block_size": a.block_size,
            "mask_id": a.mask_id}


def export(model, cap, out, dtype="f32"):
    """Writes the z-lab folder: config.json (via make_checkpoint's drafter
    config) and model.safetensors."""
    cfg = model.cfg
    m = cap.meta
    tc = {"hidden_size": m["dim"], "num_hidden_layers": m["n_layers"],
          "max_position_embeddings": m["max_ctx"], "rms_norm_eps": cfg["eps"],
          "rope_theta": cfg["rope_theta"], "vocab_size": m["vocab"],
          "tie_word_embeddings": cap.tied, "bos_token_id": m.get("bos_id"), "eos_token_id": None}
    d = {"layers": cfg["layers"], "heads": cfg["heads"], "kv_heads": cfg["kv_heads"],
         "head_dim": cfg["head_dim"], "ffn": cfg["ffn"], "block_size": cfg["block_size"],
         "target_layer_ids": cfg["target_layer_ids"], "mask_id": cfg["mask_id"], "dtype": dtype,
         "rope": "none"}
    os.makedirs(out, exist_ok=True)
    zcfg = make_checkpoint.drafter_config(tc, d)
    make_checkpoint._write_json(os.path.join(out, "config.json"), zcfg)
    t = {}
    sd = model.state_dict()
    t["fc.weight"] = sd["fc.weight"]
    t["hidden_norm.weight"] = sd["hidden_norm"]
    for i in range(cfg["layers"]):
        p = f"layers.{i}."
        t[p + "input_layernorm.weight"] = sd[p + "input_layernorm"]
        t[p + "post_attention_layernorm.weight"] = sd[p + "post_attention_layernorm"]
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[p + f"self_attn.{n}.weight"] = sd[p + n + ".weight"]
        t[p + "self_attn.q_norm.weight"] = sd[p + "q_norm"]
        t[p + "self_attn.k_norm.weight"] = sd[p + "k_norm"]
        for n in ("gate_proj", "up_proj", "down_proj"):
            t[p + f"mlp.{n}.weight"] = sd[p + n + ".weight"]
    t["norm.weight"] = sd["norm"]
    make_checkpoint.save(os.path.join(out, "model.safetensors"),
                         {k: v.detach().float().numpy() for k, v in t.items()}, dtype=dtype)
    return zcfg


def load_drafter_dir(d):
    """A z-lab folder written by export -> Drafter (for tests and --init)."""
    with open(os.path.join(d, "config.json")) as f:
        z = json.load(f)
    cfg = {"dim": z["hidden_size"], "layers": z["num_hidden_layers"],
           "heads": z["num_attention_heads"], "kv_heads": z["num_key_value_heads"],
           "head_dim": z["head_dim"], "ffn": z["intermediate_size"],
           "target_layer_ids": z["dflash_config"]["target_layer_ids"], "eps": z["rms_norm_eps"],
           "rope_theta": z["rope_theta"], "block_size": z["block_size"],
           "mask_id": z["dflash_config"]["mask_token_id"]}
    m = Drafter(cfg)
    w = make_checkpoint.load_dir(d)
    sd = {"fc.weight": w["fc.weight"], "hidden_norm": w["hidden_norm.weight"],
          "norm": w["norm.weight"]}
    for i in range(cfg["layers"]):
        p = f"layers.{i}."
        sd[p + "input_layernorm"] = w[p + "input_layernorm.weight"]
        sd[p + "post_attention_layernorm"] = w[p + "post_attention_layernorm.weight"]
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[p + n + ".weight"] = w[p + f"self_attn.{n}.weight"]
        sd[p + "q_norm"] = w[p + "self_attn.q_norm.weight"]
        sd[p + "k_norm"] = w[p + "self_attn.k_norm.weight"]
        for n in ("gate_proj", "up_proj", "down_proj"):
            sd[p + n + ".weight"] = w[p + f"mlp.{n}.weight"]
    m.load_state_dict({k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in sd.items()})
    return m


class Log:
    def __init__(self, path, append):
        self.f = open(path, "a" if append else "w")

    def __call__(self, msg):
        print(msg, flush=True)
        self.f.write(msg + "\n")
        self.f.flush()


def has_anchor(cap, i):
    return cap.seqs[i, 1] - max(1, cap.seqs[i, 2]) >= 2


def split(cap, val_frac, seed):
    """Sequences with at least one anchor, shuffled once by seed: (train, val)."""
    ok = [i for i in range(len(cap.seqs)) if has_anchor(cap, i)]
    rng = np.random.default_rng(seed + 1)
    ok = rng.permutation(ok)
    nv = int(len(ok) * val_frac)
    return ok[nv:], ok[:nv]


def amp(a):
    """--amp bf16: the forward's matrix products in bfloat16 (float32 weights,
    master copy and loss), about 3x faster on CPUs with AVX-512 BF16, where the
    lm_head product over the whole vocabulary is most of a step."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.amp == "bf16")


def evaluate(model, cap, val, a, E, Hd, layers):
    """Fixed anchors (every 4th valid position, up to --anchors per sequence)."""
    model.eval()
    tot, accs, accepts, n = 0.0, [], [], 0
    with torch.no_grad():
        for i in range(0, len(val), a.batch):
            idx = val[i:i + a.batch]
            fixed = []
            for s in idx:
                n_s = min(int(cap.seqs[s, 1]), a.max_len)
                va = valid_anchors(n_s, int(cap.seqs[s, 2]))[::4][:a.anchors]
                fixed.append(va if len(va) else np.array([1]))
            A = max(len(f) for f in fixed)
            b = make_batch(cap, idx, A, a.block_size, None, a.max_len, layers, fixed)
            # anchors padded with 1 beyond a sequence's own list carry no labels
            for s, f in enumerate(fixed):
                b["labels"][s, len(f):] = -1
            with amp(a):
                lg = model(b["feat"], b["ids"], b["anchors"], E, Hd, a.mask_id, a.block_size)
            loss, acc, acc_len = loss_and_stats(lg.float(), b["labels"], a.gamma)
            tot += loss.item()
            accs.append(acc)
            if not math.isnan(acc_len):
                accepts.append(acc_len)
            n += 1
    model.train()
    return tot / max(n, 1), torch.stack(accs).mean(0), float(np.mean(accepts)) if accepts else 0.0


def loss_vocab(cap, which):
    """-> (ids the training softmax always holds, ids it samples negatives
    from), or None for the whole vocabulary. "seen": the ids occurring
    anywhere in the capture, which hold every label; at inference the drafter
    must still rank the others below them, so each step adds a sample of
    them as negatives (without any, a row never trained against can win the
    argmax: test_train shows it)."""
    if which == "all":
        return None
    seen = np.unique(np.concatenate([p.tokens for p in getattr(cap, "parts", [cap])]))
    rest = np.setdiff1d(np.arange(cap.vocab), seen)
    return seen, rest


def step_vocab(Hd, lv, n_neg, rng):
    """-> (lm_head rows of this step's softmax, map from token id to its row)."""
    seen, rest = lv
    neg = rest if len(rest) <= n_neg else np.sort(rng.choice(rest, n_neg, replace=False))
    ids = torch.from_numpy(np.concatenate([seen, neg])).long()
    lut = torch.full((Hd.shape[0],), -1, dtype=torch.long)
    lut[ids] = torch.arange(len(ids))
    return Hd[ids], lut


def watch(cap, pattern, layers, log):
    """Captures matching pattern that finished since the last look (their
    capture.json is written last) join the training sequences: a capture can
    run beside the trainer. -> the new sequence numbers with an anchor."""
    have = {os.path.realpath(p.dir) for p in cap.parts}
    new = []
    for d in sorted(glob.glob(pattern)):
        if os.path.realpath(d) in have or not os.path.exists(os.path.join(d, "capture.json")):
            continue
        try:
            p = Capture(d)
        except (SystemExit, ValueError, OSError):
            continue   # still being written: next time
        seqs = cap.add(p, layers)
        ok = [i for i in seqs if has_anchor(cap, i)]
        log(f"# added {d}: {len(p.seqs)} sequences, {len(p.tokens)} rows")
        new += ok
    return np.array(new, dtype=np.int64)


def save_checkpoint(path, model, opt, step, rng, a, best=-1.0):
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "best": best,
                "np_rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
                "args": vars(a)}, path + ".tmp")
    os.replace(path + ".tmp", path)


def fmt_acc(acc):
    return " ".join(f"{x:.2f}" for x in acc.tolist())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capture", required=True, action="append",
                    help="dflash capture output folder (repeat to train on several)")
    ap.add_argument("--out", required=True, help="drafter folder to write")
    ap.add_argument("--target-layers", help="captured layers to use, e.g. 1,3 (default: all)")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--mask-id", type=int, required=True,
                    help="a token id the target's text never uses (docs/training.md)")
    ap.add_argument("--layers", type=int, default=2, help="drafter layers")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--head-dim", type=int)
    ap.add_argument("--ffn", type=int)
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=16, help="sequences per step")
    ap.add_argument("--anchors", type=int, default=32, help="anchors per sequence")
    ap.add_argument("--max-len", type=int, default=512, help="rows of a sequence used")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--block-mix", type=float, default=0.0,
                    help="fraction of anchors drafted as a shorter block (length uniform in "
                    "2..B-1), so the drafter also serves the smaller blocks an adaptive "
                    "policy picks; 0: every block has B rows (SpecForge)")
    ap.add_argument("--gamma", type=float, default=0.0,
                    help="loss weight exp(-(k-1)/gamma) on block row k; 0: uniform")
    ap.add_argument("--val-frac", type=float, default=0.02)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--ckpt-every", type=int, default=500)
    ap.add_argument("--keep-best", action="store_true",
                    help="write the drafter only when the held-out tau~ improves (the data is "
                         "small enough to overfit: the last step is then not the best)")
    ap.add_argument("--watch", metavar="GLOB",
                    help="capture folders matching GLOB that finish while training runs join "
                         "the training sequences (checked at each eval); the held-out ones stay "
                         "those of --capture")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    ap.add_argument("--stop-at", type=int, help="save a checkpoint and stop after this step "
                    "(continue later with --resume)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: best on a shared machine, see fast_blas.py)")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32", help="exported weights")
    ap.add_argument("--loss-vocab", choices=["all", "seen"], default="all",
                    help="training softmax over the whole vocabulary, or over the ids that occur "
                         "in the capture (no label lies outside them): 2.6x faster steps on "
                         "SmolLM2's 49K vocabulary; evaluation always uses the whole vocabulary")
    ap.add_argument("--loss-negatives", type=int, default=4096,
                    help="with --loss-vocab seen: ids sampled each step from the rest of the "
                         "vocabulary into the softmax, so inference never prefers them")
    ap.add_argument("--amp", choices=["off", "bf16"], default="off",
                    help="bf16: matrix products of the forward in bfloat16 (autocast)")
    a = ap.parse_args(argv)

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    cap = load_capture(a.capture)
    layers = [int(x) for x in a.target_layers.split(",")] if a.target_layers else cap.layers
    missing = [x for x in layers if x not in cap.layers]
    if missing:
        raise SystemExit(f"train_dflash: layers {missing} were not captured (have {cap.layers})")
    if not 0 <= a.mask_id < cap.vocab:
        raise SystemExit(f"train_dflash: --mask-id {a.mask_id} outside 0..{cap.vocab - 1}")
    used = sum(int((p.tokens == a.mask_id).sum()) for p in getattr(cap, "parts", [cap]))
    if used:
        print(f"train_dflash: warning: mask id {a.mask_id} occurs {used} times in the capture",
              file=sys.stderr)
    cfg = drafter_cfg(a, cap, layers)
    model = Drafter(cfg)
    E = torch.from_numpy(np.ascontiguousarray(cap.embed))
    Hd = E if cap.tied else torch.from_numpy(np.ascontiguousarray(cap.lm_head))
    lv = loss_vocab(cap, a.loss_vocab)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    train, val = split(cap, a.val_frac, a.seed)
    rng = np.random.default_rng(a.seed)
    os.makedirs(a.out, exist_ok=True)
    ckpt = os.path.join(a.out, "checkpoint.pt")
    step, best = 0, -1.0   # best: the held-out tau~ - 1 of the drafter written (--keep-best)
    if a.resume and os.path.exists(ckpt):
        s = torch.load(ckpt)
        model.load_state_dict(s["model"])
        opt.load_state_dict(s["opt"])
        step, best = s["step"], s.get("best", -1.0)
        rng.bit_generator.state = s["np_rng"]
        torch.set_rng_state(s["torch_rng"])
    log = Log(os.path.join(a.out, "train_log.txt"), append=a.resume and step > 0)
    if step == 0:
        nparam = sum(p.numel() for p in model.parameters())
        log(f"# train_dflash.py {' '.join(argv if argv is not None else sys.argv[1:])}")
        log(f"# capture {', '.join(a.capture)}: {cap.meta['mode']} mode, {len(cap.seqs)} "
            f"sequences, {cap.n_rows} rows, target {os.path.basename(cap.meta['model'])} "
            f"({cap.meta['n_layers']} layers, dim {cap.dim}, vocab {cap.vocab})")
        if lv is not None:
            log(f"# training softmax over the {len(lv[0])} ids the capture holds (of "
                f"{cap.vocab}) and {min(a.loss_negatives, len(lv[1]))} others sampled each "
                "step; eval lines use the whole vocabulary")
        log(f"# drafter {json.dumps(cfg)}: {nparam} parameters; train {len(train)} / "
            f"val {len(val)} sequences; torch {torch.__version__}, {a.threads} threads")
    else:
        log(f"# resumed at step {step}")
    t0, seen = time.time(), 0
    while step < a.steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        idx = rng.choice(train, size=min(a.batch, len(train)), replace=False)
        b = make_batch(cap, idx, a.anchors, a.block_size, rng, a.max_len, layers,
                       mix=a.block_mix)
        Ht, lut = (Hd, None) if lv is None else step_vocab(Hd, lv, a.loss_negatives, rng)
        with amp(a):
            lg = model(b["feat"], b["ids"], b["anchors"], E, Ht, a.mask_id, a.block_size,
                       b["blen"] if a.block_mix > 0 else None)
        labels = b["labels"] if lut is None else lut[b["labels"].clamp(min=0)].masked_fill(
            b["labels"] < 0, -1)
        loss, acc, acc_len = loss_and_stats(lg.float(), labels, a.gamma)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        seen += int((b["labels"] >= 0).sum())
        if step % a.log_every == 0 or step == a.steps:
            el = time.time() - t0
            log(f"step {step:6d} loss {loss.item():.4f} lr {lr_at(step - 1, a):.2e} gnorm "
                f"{gn.item():.2f} | acc/pos {fmt_acc(acc)} | tau~ {1 + acc_len:.2f} | "
                f"{seen / max(el, 1e-9):.0f} labels/s {el:.0f}s")
        if a.watch and step % a.eval_every == 0:
            new = watch(cap, a.watch, layers, log)
            if len(new):
                train = np.concatenate([train, new])
                lv = loss_vocab(cap, a.loss_vocab)
        if (step % a.eval_every == 0 or step == a.steps) and len(val):
            vl, vacc, vlen = evaluate(model, cap, val, a, E, Hd, layers)
            log(f"eval {step:6d} loss {vl:.4f} | acc/pos {fmt_acc(vacc)} | tau~ {1 + vlen:.2f}")
            if a.keep_best and vlen > best:
                best = vlen
                export(model, cap, a.out, a.dtype)
                log(f"# wrote the drafter of step {step} (best held-out tau~ so far)")
        stop = a.stop_at and a.stop_at <= step < a.steps
        if step % a.ckpt_every == 0 or step == a.steps or stop:
            save_checkpoint(ckpt, model, opt, step, rng, a, best)
            if not a.keep_best:
                export(model, cap, a.out, a.dtype)  # OUT always holds a usable drafter
        if stop:
            log(f"# stopped at step {step} (--stop-at) and wrote the drafter so far; --resume "
                "continues")
            return
    if not a.keep_best or best < 0:   # (no held-out sequences: the last step)
        export(model, cap, a.out, a.dtype)
    log(f"# wrote {a.out} (config.json, model.safetensors)"
        + (f": the drafter of the best held-out tau~ {1 + best:.2f}" if a.keep_best else ""))


if __name__ == "__main__":
    main()
