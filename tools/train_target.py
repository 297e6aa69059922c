#!/usr/bin/env python3
"""train_target.py - trains a tiny Llama from scratch (the built-in default
model) and writes it as a Hugging Face folder that dflash loads.

    tools/train_target.py prepare --corpus F1 F2 ... --sep '\\n%\\n' --holdout 300 --out DATA
    tools/train_target.py train --data DATA --out models/default/target --steps 3000

prepare: splits the corpus files into documents at --sep, drops empty ones
and ones over --max-chars, shuffles them with --seed and writes
DATA/train.txt and DATA/heldout.txt (the last --holdout documents), each
document followed by "<|endoftext|>" (so `dflash capture` reads them as they are).

train: learns a byte-level BPE tokenizer on train.txt (tools/bpe_train.py),
encodes every document as [<|endoftext|>, text, <|endoftext|>] (the token is
BOS, EOS and separator, as the tokenizer config says), packs documents into
rows of --seq-len tokens with attention and positions confined to each
document (so training sees exactly what inference does: every document from
position 0), and trains a Llama (RMSNorm, rotate-half RoPE, SwiGLU, tied
embedding) with AdamW, warm-up and cosine decay, fixed seeds; progress lines
with train / held-out loss; --resume continues from OUT/checkpoint.pt.
The folder: config.json (LlamaForCausalLM), model.safetensors,
tokenizer.json, tokenizer_config.json, generation_config.json, train_log.txt.
"""
import argparse
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

import bpe_train  # noqa: E402
import make_checkpoint  # noqa: E402

EOT = "<|endoftext|>"


# ---- data ------------------------------------------------------------------------

def unescape(s):
    return s.replace("\\n", "\n").replace("\\t", "\t")


def read_docs(paths, sep, max_chars):
    docs = []
    for p in paths:
        with open(p, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for d in text.split(sep):
            d = d.strip()
            if d and len(d) <= max_chars and EOT not in d:
                docs.append(d)
    return docs


def split_docs(docs, seed, holdout):
    order = np.random.default_rng(seed).permutation(len(docs))
    docs = [docs[i] for i in order]
    return docs[:len(docs) - holdout], docs[len(docs) - holdout:]


def write_docs(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(d + "\n" + EOT + "\n")


def load_docs(path):
    with open(path, encoding="utf-8") as f:
        return [d.strip() for d in f.read().split(EOT) if d.strip()]


def pack(docs_ids, L, eot, rng):
    """Documents (each [eot, ..., eot]) in shuffled order, packed greedily into
    rows of L tokens; -> tokens (R, L), doc (R, L) doc number within the row
    (-1 for padding), pos (R, L) position within the document."""
    order = rng.permutation(len(docs_ids))
    rows, cur = [], []
    for i in order:
        d = docs_ids[i][:L]
        if sum(len(x) for x in cur) + len(d) > L:
            rows.append(cur)
            cur = []
        cur.append(d)
    if cur:
        rows.append(cur)
    R = len(rows)
    tok = np.full((R, L), eot, np.int64)
    doc = np.full((R, L), -1, np.int64)
    pos = np.zeros((R, L), np.int64)
    for r, row in enumerate(rows):
        o = 0
        for j, d in enumerate(row):
            tok[r, o:o + len(d)] = d
            doc[r, o:o + len(d)] = j
            pos[r, o:o + len(d)] = np.arange(len(d))
            o += len(d)
    return tok, doc, pos


# ---- model -----------------------------------------------------------------------

def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, inv):
    """x (R, L, heads, hd) at pos (R, L), rotate-half as Hugging Face Llama."""
    ang = pos.to(torch.float32)[..., None] * inv
    cos, sin = ang.cos()[:, :, None], ang.sin()[:, :, None]
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


class Llama(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        D, H, KV, hd, F = c["dim"], c["heads"], c["kv_heads"], c["head_dim"], c["ffn"]
        self.embed = torch.nn.Parameter(torch.randn(c["vocab"], D) * 0.02)     # (V, D), tied
        self.layers = torch.nn.ModuleList()
        for _ in range(c["layers"]):
            m = torch.nn.Module()
            m.attn_norm = torch.nn.Parameter(torch.ones(D))        # (D)
            m.ffn_norm = torch.nn.Parameter(torch.ones(D))         # (D)
            m.q = torch.nn.Linear(D, H * hd, bias=False)            # (H*hd, D)
            m.k = torch.nn.Linear(D, KV * hd, bias=False)           # (KV*hd, D)
            m.v = torch.nn.Linear(D, KV * hd, bias=False)           # (KV*hd, D)
            m.o = torch.nn.Linear(H * hd, D, bias=False)            # (D, H*hd)
            m.gate = torch.nn.Linear(D, F, bias=False)              # (F, D)
            m.up = torch.nn.Linear(D, F, bias=False)                # (F, D)
            m.down = torch.nn.Linear(F, D, bias=False)              # (D, F)
            for lin in (m.q, m.k, m.v, m.gate, m.up):
                torch.nn.init.normal_(lin.weight, std=0.02)
            for lin in (m.o, m.down):   # GPT-2's residual scaling
                torch.nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * c["layers"]))
            self.layers.append(m)
        self.norm = torch.nn.Parameter(torch.ones(D))               # (D)
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        self.register_buffer("inv", inv.to(torch.float32), persistent=False)

    def forward(self, tok, doc, pos):
        """tok/doc/pos (R, L) -> logits (R, L, V); a row attends to earlier rows
        of its own document only."""
        c = self.c
        R, L = tok.shape
        H, KV, hd, eps = c["heads"], c["kv_heads"], c["head_dim"], c["eps"]
        causal = torch.ones(L, L, dtype=torch.bool).tril()
        see = causal & (doc[:, :, None] == doc[:, None, :])                 # (R, L, L)
        bias = torch.zeros(R, 1, L, L).masked_fill(~see[:, None], float("-inf"))
        x = self.embed[tok]
        for m in self.layers:
            h = rmsnorm(x, m.attn_norm, eps)
            q = rope(m.q(h).view(R, L, H, hd), pos, self.inv).transpose(1, 2)   # (R,H,L,hd)
            k = rope(m.k(h).view(R, L, KV, hd), pos, self.inv).transpose(1, 2)
            v = m.v(h).view(R, L, KV, hd).transpose(1, 2)
            if H != KV:
                k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
            a = torch.softmax(q @ k.transpose(-1, -2) * hd ** -0.5 + bias, -1) @ v
            x = x + m.o(a.transpose(1, 2).reshape(R, L, H * hd))
            h = rmsnorm(x, m.ffn_norm, eps)
            x = x + m.down(torch.nn.functional.silu(m.gate(h)) * m.up(h))
        return rmsnorm(x, self.norm, eps) @ self.embed.T

    def hf_tensors(self):
        t = {"model.embed_tokens.weight": self.embed}
        for i, m in enumerate(self.layers):
            p = f"model.layers.{i}."
            t.update({p + "self_attn.q_proj.weight": m.q.weight, p + "self_attn.k_proj.weight":
                      m.k.weight, p + "self_attn.v_proj.weight": m.v.weight,
                      p + "self_attn.o_proj.weight": m.o.weight,
                      p + "mlp.gate_proj.weight": m.gate.weight,
                      p + "mlp.up_proj.weight": m.up.weight, p + "mlp.down_proj.weight":
                      m.down.weight, p + "input_layernorm.weight": m.attn_norm,
                      p + "post_attention_layernorm.weight": m.ffn_norm})
        t["model.norm.weight"] = self.norm
        return {k: v.detach().float().numpy() for k, v in t.items()}


def loss_of(model, tok, doc, pos):
    """Next-token cross-entropy inside documents."""
    logits = model(tok, doc, pos)[:, :-1]
    tgt = tok[:, 1:]
    ok = (doc[:, 1:] == doc[:, :-1]) & (doc[:, 1:] >= 0)
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                           reduction="none")
    return (ce * ok.reshape(-1)).sum() / ok.sum().clamp(min=1)


# ---- commands --------------------------------------------------------------------

def cmd_prepare(a):
    docs = read_docs(a.corpus, unescape(a.sep), a.max_chars)
    train, held = split_docs(docs, a.seed, a.holdout)
    os.makedirs(a.out, exist_ok=True)
    write_docs(os.path.join(a.out, "train.txt"), train)
    write_docs(os.path.join(a.out, "heldout.txt"), held)
    print(f"train_target: {len(docs)} documents: {len(train)} train, {len(held)} held out "
          f"-> {a.out}", file=sys.stderr)


def lr_at(step, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * t)))


def write_folder(out, model, c, eot, dtype):
    s = make_checkpoint.resolve(arch="llama", dim=c["dim"], layers=c["layers"], heads=c["heads"],
                                kv_heads=c["kv_heads"], head_dim=c["head_dim"], ffn=c["ffn"],
                                vocab=c["vocab"], max_ctx=c["max_ctx"], rope_theta=c["rope_theta"],
                                eps=c["eps"], tied=True, dtype=dtype)
    cfg = make_checkpoint.target_config(s, eot, eot)
    make_checkpoint._write_json(os.path.join(out, "config.json"), cfg)
    make_checkpoint._write_json(os.path.join(out, "generation_config.json"),
                                {"bos_token_id": eot, "eos_token_id": eot, "do_sample": False})
    make_checkpoint.save(os.path.join(out, "model.safetensors"), model.hf_tensors(), dtype=dtype)


def cmd_train(a):
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    train_docs = load_docs(os.path.join(a.data, "train.txt"))
    held_docs = load_docs(os.path.join(a.data, "heldout.txt"))
    os.makedirs(a.out, exist_ok=True)
    ckpt = os.path.join(a.out, "checkpoint.pt")
    resume = a.resume and os.path.exists(ckpt)
    if resume:
        merges = bpe_train.read_merges(os.path.join(a.out, "tokenizer.json"))
    else:
        merges = bpe_train.learn(train_docs, a.vocab - 256 - len(bpe_train.SPECIALS))
        bpe_train.write(a.out, merges)
    enc = bpe_train.Encoder(merges)
    eot = enc.eot
    vocab = 256 + len(merges) + len(bpe_train.SPECIALS)
    tr = [[eot] + enc.encode(d) + [eot] for d in train_docs]
    he = [[eot] + enc.encode(d) + [eot] for d in held_docs]
    c = {"dim": a.dim, "layers": a.layers, "heads": a.heads, "kv_heads": a.kv_heads or a.heads,
         "head_dim": a.dim // a.heads, "ffn": a.ffn, "vocab": vocab, "eps": 1e-5,
         "rope_theta": 10000.0, "max_ctx": a.max_ctx}
    model = Llama(c)
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95))
    step, epoch, cursor = 0, 0, 0
    if resume:
        s = torch.load(ckpt)
        model.load_state_dict(s["model"])
        opt.load_state_dict(s["opt"])
        step, epoch, cursor = s["step"], s["epoch"], s["cursor"]
    data = pack(tr, a.seq_len, eot, np.random.default_rng([a.seed, epoch]))
    hd = pack(he, a.seq_len, eot, np.random.default_rng(0))
    hd = tuple(torch.from_numpy(x[:a.eval_rows]) for x in hd)
    log = open(os.path.join(a.out, "train_log.txt"), "a" if resume else "w")

    def say(msg):
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    if not resume:
        ntok = sum(len(x) for x in tr)
        say(f"# train_target.py {' '.join(sys.argv[1:])}")
        say(f"# {len(tr)} train documents ({ntok} tokens), {len(he)} held out; vocab {vocab}; "
            f"{sum(p.numel() for p in model.parameters())} parameters; {json.dumps(c)}; "
            f"torch {torch.__version__}")
    else:
        say(f"# resumed at step {step}")
    t0 = time.time()
    while step < a.steps:
        if cursor + a.batch > len(data[0]):
            epoch, cursor = epoch + 1, 0
            data = pack(tr, a.seq_len, eot, np.random.default_rng([a.seed, epoch]))
        b = tuple(torch.from_numpy(x[cursor:cursor + a.batch]) for x in data)
        cursor += a.batch
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        loss = loss_of(model, *b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % a.log_every == 0 or step == a.steps:
            msg = (f"step {step:6d} epoch {epoch} loss {loss.item():.4f} lr {lr_at(step - 1, a):.2e}"
                   f" {time.time() - t0:.0f}s")
            if step % a.eval_every == 0 or step == a.steps:
                with torch.no_grad():
                    msg += f" | held-out loss {loss_of(model, *hd).item():.4f}"
            say(msg)
        stop = a.stop_at and a.stop_at <= step < a.steps
        if step % a.ckpt_every == 0 or step == a.steps or stop:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                        "epoch": epoch, "cursor": cursor},
                       ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
        if stop:
            say(f"# stopped at step {step} (--stop-at); --resume continues")
            return
    write_folder(a.out, model, c, eot, a.dtype)
    say(f"# wrote {a.out}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="split a corpus into train / held-out documents")
    p.add_argument("--corpus", nargs="+", required=True)
    p.add_argument("--sep", default="\\n%\\n", help="document separator (\\n understood)")
    p.add_argument("--max-chars", type=int, default=1200, help="drop longer documents")
    p.add_argument("--holdout", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    t = sub.add_parser("train", help="tokenizer + model")
    t.add_argument("--data", required=True, help="prepare's output folder")
    t.add_argument("--out", required=True)
    t.add_argument("--vocab", type=int, default=1024)
    t.add_argument("--dim", type=int, default=128)
    t.add_argument("--layers", type=int, default=4)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--kv-heads", type=int)
    t.add_argument("--ffn", type=int, default=352)
    t.add_argument("--seq-len", type=int, default=256)
    t.add_argument("--max-ctx", type=int, default=512, help="max_position_embeddings written")
    t.add_argument("--batch", type=int, default=16, help="rows per step")
    t.add_argument("--steps", type=int, default=3000)
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--warmup", type=int, default=100)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--log-every", type=int, default=50)
    t.add_argument("--eval-every", type=int, default=500)
    t.add_argument("--eval-rows", type=int, default=32)
    t.add_argument("--ckpt-every", type=int, default=500)
    t.add_argument("--resume", action="store_true")
    t.add_argument("--stop-at", type=int)
    t.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    a = ap.parse_args(argv)
    if a.cmd == "prepare":
        cmd_prepare(a)
    else:
        cmd_train(a)


if __name__ == "__main__":
    main()
