"""mtp_reference.py - a torch reference of the Qwen3.5 / Qwen3-Next MTP head,
written from its published definition (vLLM's qwen3_next_mtp.py,
Qwen3NextMultiTokenPredictor.forward, and the proposer that chains it):

    u_i   = fc(cat([pre_fc_norm_embedding(embed(x_{i+1})),
                    pre_fc_norm_hidden(h_i)], dim=-1))       embedding first
    g_i   = norm(decoder_layer(u_i))                        a full-attention layer, causal
                                                            over the head's own rows
    logits = lm_head(g_i)

h_i is the target's hidden state after its final norm (vLLM's Qwen3NextModel
returns norm(hidden + residual); transformers' last_hidden_state is the same);
the head's row i sits at position i. Drafting after anchor x_n at position n:
row n-1 fuses x_n with h_{n-1}; each next row fuses the previous draft with
the head's own g of the row before.

The decoder layer, its norms and the rotary tables are transformers' own
classes (the target's), built as a full-attention layer 0 and loaded with
mtp.layers.0.*; nothing here reimplements attention or the MLP."""
import copy
import json
import os

import torch
from safetensors import safe_open


def text_model(model):
    """The decoder of a causal LM or of the multimodal class."""
    inner = model.model
    return inner.language_model if hasattr(inner, "language_model") else inner


def load_mtp_tensors(folder):
    """-> {name without its prefix: tensor} of the head, float32."""
    out = {}
    idx = os.path.join(folder, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) \
        else ["model.safetensors"]
    for fn in files:
        with safe_open(os.path.join(folder, fn), "pt") as f:
            for k in f.keys():
                for p in ("model.language_model.mtp.", "model.mtp.", "mtp."):
                    if k.startswith(p):
                        out[k[len(p):]] = f.get_tensor(k).float()
                        break
    return out


def fuse_experts(sd):
    """Per-expert tensors as checkpoints store them (experts.E.{gate,up,down}_proj) into the
    fused parameters transformers' modules hold: gate_up_proj (E, 2 F, H) as
    [gate ; up] per expert (its forward chunks gate, up in that order), down_proj (E, H, F)."""
    n = sum(1 for k in sd if k.startswith("mlp.experts.") and k.endswith(".gate_proj.weight"))
    if not n:
        return sd
    out = {k: v for k, v in sd.items() if not k.startswith("mlp.experts.")}
    e = [f"mlp.experts.{i}." for i in range(n)]
    out["mlp.experts.gate_up_proj"] = torch.stack(
        [torch.cat([sd[p + "gate_proj.weight"], sd[p + "up_proj.weight"]]) for p in e])
    out["mlp.experts.down_proj"] = torch.stack([sd[p + "down_proj.weight"] for p in e])
    return out


class MTPHead(torch.nn.Module):
    def __init__(self, model, folder):
        super().__init__()
        tm = text_model(model)
        cfg = copy.deepcopy(tm.config)
        cfg.layer_types = ["full_attention"] * cfg.num_hidden_layers
        cfg._attn_implementation = "eager"
        w = load_mtp_tensors(folder)
        h = cfg.hidden_size
        self.embed, self.lm_head, self.rotary = tm.embed_tokens, model.lm_head, tm.rotary_emb
        norm_cls = type(tm.norm)
        self.norm_e = norm_cls(h, eps=cfg.rms_norm_eps)
        self.norm_h = norm_cls(h, eps=cfg.rms_norm_eps)
        self.norm = norm_cls(h, eps=cfg.rms_norm_eps)
        self.fc = torch.nn.Linear(2 * h, h, bias=False)
        self.layer = type(tm.layers[0])(cfg, 0)   # layer 0's MLP kind, full attention
        with torch.no_grad():
            self.norm_e.weight.copy_(w["pre_fc_norm_embedding.weight"])
            self.norm_h.weight.copy_(w["pre_fc_norm_hidden.weight"])
            self.norm.weight.copy_(w["norm.weight"])
            self.fc.weight.copy_(w["fc.weight"])
        layer_sd = {k[len("layers.0."):]: v for k, v in w.items() if k.startswith("layers.0.")}
        self.layer.load_state_dict(fuse_experts(layer_sd), strict=True)
        self.float().eval()

    def rows(self, toks, hid):
        """g (n, H) for rows fusing toks (n) with hid (n, H), causal from position 0."""
        n = len(toks)
        e = self.embed(torch.tensor(toks)[None]).float()
        u = self.fc(torch.cat([self.norm_e(e), self.norm_h(hid[None])], dim=-1))
        pos = torch.arange(n)[None]
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        out = self.layer(u, position_embeddings=self.rotary(u, pos), attention_mask=mask,
                         position_ids=pos)
        out = out[0] if isinstance(out, tuple) else out
        return self.norm(out[0])

    @torch.no_grad()
    def chain(self, model, ids, k):
        """-> (logits (k, vocab), drafts (k)) of k drafts after anchor ids[-1], the
        context ids[:-1] run through the target."""
        hs = text_model(model)(input_ids=torch.tensor(ids[:-1])[None]).last_hidden_state[0]
        toks, hid = list(ids[1:]), [hs[i] for i in range(len(ids) - 1)]
        logits, drafts = [], []
        for _ in range(k):
            g = self.rows(toks, torch.stack(hid))[-1]
            lg = self.lm_head(g)
            d = int(lg.argmax())
            logits.append(lg)
            drafts.append(d)
            toks.append(d)
            hid.append(g)
        return torch.stack(logits).numpy(), drafts
