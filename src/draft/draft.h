/* draft.h - the drafter seam: a DFlash block-diffusion drafter (z-lab format,
 * llama.cpp's GGUF "dflash" form, or Poolside's DFlashLagunaForCausalLM) that
 * borrows the target's embedding and lm_head. Context K/V per layer is
 * computed once per committed row and kept (the side store). The native MTP
 * head of a Qwen3.5 / Qwen3-Next checkpoint (mtp.c) is a drafter of its own
 * kind behind the same seam: it chains one token at a time. */
#ifndef DFL_DRAFT_H
#define DFL_DRAFT_H

#include "models/model.h"

/* Which published drafter a checkpoint is: they pair with different targets.
 * DFL_DRAFT_DFLASH2 (DFlash2DraftModel) is z-lab's layer stack with a grouped
 * dynamic conv around each sublayer and a candidate selector (dflash2.c). */
enum { DFL_DRAFT_ZLAB = 0, DFL_DRAFT_LAGUNA = 1, DFL_DRAFT_MTP = 2, DFL_DRAFT_DFLASH2 = 3 };

typedef struct dfl_dlayer {
    dfl_mat wqkv;              /* Laguna: ((n_heads+2*n_kv)*hd, dim) fused, rows q|k|v; wq, wk,
                                  wv are row views of it */
    dfl_mat wq;                /* (n_heads*hd, dim) */
    dfl_mat wk, wv;            /* (n_kv*hd, dim) */
    dfl_mat wg;                /* Laguna: (n_heads or n_heads*hd, dim) softplus output gate;
                                  rows 0: none */
    dfl_mat wo;                /* (dim, n_heads*hd) */
    dfl_mat w_gate, w_up;      /* (ffn, dim) */
    dfl_mat w_down;            /* (dim, ffn) */
    const float *attn_norm, *ffn_norm; /* (dim) */
    const float *q_norm, *k_norm;      /* (hd) */
    /* DFlash2: [0] attention_conv, [1] mlp_conv */
    dfl_mat conv_proj[2];      /* (2*K*G, dim) kernel_projection: a row's dynamic taps, index
                                  side*K*G + t*G + g (K taps, G = dim/group groups) */
    const float *conv_base[2]; /* (2, K, dim) base_kernel: [side][tap][channel] */
} dfl_dlayer;

/* The MTP head (mtp.*): u = fc([norm_e(embed(next token)) ; norm_h(hidden)]),
 * one gated full-attention block with the target's MLP kind, norm, the
 * target's lm_head. Its block runs through the target's own forward, as a
 * one-layer target (view) whose rows come in as u. */
typedef struct dfl_mtp {
    dfl_mat fc;                /* (dim, 2*dim) */
    const float *norm_e;       /* (dim) pre_fc_norm_embedding, 1 + w applied */
    const float *norm_h;       /* (dim) pre_fc_norm_hidden, 1 + w applied */
    const float *norm;         /* (dim) the head's final norm, 1 + w applied */
    dfl_layer layer;           /* mtp.layers.0 */
    dfl_target view;           /* the target with `layer` as its only layer and `norm` as
                                  its final norm; shares the target's scratch and lock */
    void *owned;               /* converted weights and norms */
} dfl_mtp;

typedef struct dfl_drafter {
    int kind;                  /* DFL_DRAFT_* */
    dfl_mtp *mtp;              /* DFL_DRAFT_MTP: the head (every DFlash field below unused
                                  but c, block_size, n_cap, cap, t, max_rows and the
                                  scratch x, xn, ctx, h1, h2, logits, tok, qscratch) */
    dfl_config c;              /* drafter's own dims (dim == target dim) */
    int block_size;            /* trained block size */
    int mask_id;
    int n_cap;                 /* captured target layers */
    int cap[DFL_MAX_CAPTURE_LAYERS]; /* target layer ids, HF convention (output of layer id) */
    dfl_mat fc;                /* (dim, n_cap*target_dim) */
    const float *aux_norm[DFL_MAX_CAPTURE_LAYERS]; /* Laguna: (target_dim) each captured
                                  layer's RMSNorm before fc; NULL: none (z-lab) */
    int ctx_norm;              /* 1: context rows pass each layer's input_layernorm before
                                  its K/V (Laguna); 0: they do not (z-lab) */
    int causal;                /* 1: a full layer's block row sees only the block rows up to
                                  itself (sliding layers always do) */
    int swa;                   /* keys a sliding layer's block row attends, itself included,
                                  counted back from its position over [context ; block]; 0: none */
    uint64_t sliding;          /* bit l: layer l slides (window swa); 0: every layer full */
    const float *hidden_norm;  /* (dim) */
    const float *out_norm;     /* (dim) */
    /* DFlash2 (0 / NULL otherwise) */
    int conv_k, conv_group;    /* conv taps K (1..block_size); channels per group (divides dim) */
    int sel_rank, sel_top_k;   /* selector rank r; candidates K per row (top-K of the head) */
    float sel_mult, sel_cap;   /* unary = cap ? cap*tanh(mult*logit/cap) : mult*logit */
    dfl_mat sel_proj;          /* (r, dim) candidate_selector.hidden_projection */
    dfl_mat sel_pred;          /* (vocab, r) predecessor_codebook A, as stored (f32 of a
                                  152K vocabulary at rank 256 would be 156 MB each): a walk
                                  converts the rows it reads */
    dfl_mat sel_succ;          /* (vocab, r) successor_codebook B, as stored */
    dfl_dlayer *layers;        /* [n_layers] */
    dfl_rope rope;
    dfl_target *t;             /* the target whose embed / lm_head are used */
    dfl_mat head;              /* (vocab, target dim) the lm_head drafts are read from: the
                                  target's, or, for a quantized drafter beside a 16-bit head,
                                  a copy in the drafter's type (a block's rows of a 0.6B
                                  head: 5.7 ms in q8_0 against 12.4 in bf16, Zen 4) */
    dfl_tensors ts;
    gguf_file *gguf;
    void *owned;
    int max_rows;              /* max(block, context chunk) */
    int window;                /* context rows a block attends (0: all); rows older than
                                  any later block's window are never projected */
    /* scratch, (max_rows, ...) each */
    float *x, *xn, *q, *k, *v, *att, *h1, *h2, *ctx; /* per row buffers */
    float *feat_n;             /* (max_rows, n_cap*target_dim) a pass's feature rows: aux-normed
                                  (Laguna) or gathered from several sequences */
    float *gate;               /* (max_rows, n_heads*hd) output gate logits (Laguna) */
    float *logits;             /* (16, vocab) lm_head rows, chunked */
    int32_t *tok;              /* (max_rows) block tokens */
    void *qscratch;
    int *n_keys;
    float *rope_cs;            /* (max_rows, hd) each row's RoPE cos | sin, once per call */
    float *dconv;              /* DFlash2: (max_rows, 2*K*G) a sublayer's dynamic taps */
    float *sel_h;              /* DFlash2: (max_rows, r) P.h of each output row */
    float *sel_unary;          /* DFlash2: (max_rows, top_k) transformed top-K logits */
    int32_t *sel_cand;         /* DFlash2: (max_rows, top_k) their ids, best first */
} dfl_drafter;

/* Per-sequence side store: context K/V per drafter layer, plus B slack rows.
 * Its rows cover positions 0..len-1 with holes: positions older than the
 * window, and stretches skipped while a crowd held the sequence to classic
 * steps (dfl_dstore_skip). The rows stay contiguous, each with its position
 * (K is rotated at that position when stored), and a block's rows follow
 * the last one; a block attends to the rows there are. */
typedef struct dfl_dstore {
    int len, cap;              /* positions covered (the next row's); rows allocated (ctx +
                                  max block) */
    int rows;                  /* context rows stored (<= len) */
    int32_t *pos;              /* (cap) each stored row's position, increasing */
    int lo;                    /* positions below lo were never projected (older than the
                                  window) */
    int window;                /* rows a block reads back (draft_window or a sliding drafter's
                                  window, the tighter) when made; 0: all */
    int n_layers, kv_dim;
    dfl_type type;             /* the target's --kv-type: DFL_F16 (half the memory) or DFL_F32 */
    void *k, *v;               /* (n_layers, cap, kv_dim) of type */
    dfl_kv *mkv;               /* MTP: the head's own cache (one full-attention layer); its
                                  row i fuses token i+1 with the target's hidden state i, so
                                  it holds len - 1 rows (len once a draft fused the anchor) */
    float *hid;                /* MTP: (cap, hid_dim) the target's last layer output per row */
    int hid_dim;               /* MTP: the target's dim */
    double spent;              /* seconds of drafter passes charged to this store: its rows'
                                  share of each (a pass carries several sequences) */
} dfl_dstore;

/* path: a z-lab or Laguna DFlash folder (config.json + safetensors) or a
 * llama.cpp "dflash" GGUF. A Laguna drafter pairs only with a Laguna target,
 * the others only with the dense families. GGUF dflash.target_layers name
 * the INPUT of target layer v (llama.cpp captures layer inputs), i.e. the
 * output of layer v-1: they are stored as HF ids + 1 and cap[] gets v - 1.
 * o->draft_window = W bounds the context a block attends to the last W rows
 * (an approximation, off by default). */
int dfl_drafter_load(const char *path, dfl_target *t, const dfl_load_opts *o,
                     dfl_drafter **out, dfl_error *err);
/* z-lab's rule when target_layer_ids is absent: n_draft ids spread over
 * [1, n_target-3] (one draft layer: n_target/2). Returns n_draft. */
int dfl_dflash_default_layers(int n_target, int n_draft, int *ids);
void dfl_drafter_free(dfl_drafter *d);
/* A hyper-connection target's feature (hc_mult residual streams per row, as
 * DeepSeek-V4 / GLM-5.3 keep them) contracted to the hidden size for a
 * drafter: the mean of the streams, as the DFlash2 ports describe SGLang's
 * hc_contract (UNVERIFIED; no such target is supported yet). x (n, hc, dim)
 * -> y (n, dim); streams summed in order, then divided by hc. */
void dfl_hc_mean(const float *x, int n, int hc, int dim, float *y);
/* The target's own MTP head (--draft-mtp): refuses a target without mtp.*
 * tensors, naming what it looked for. */
int dfl_mtp_load(dfl_target *t, const dfl_load_opts *o, dfl_drafter **out, dfl_error *err);
/* Appends n committed rows: feat (n, dim) the target's last-layer outputs,
 * tok (n) their tokens; fuses every row whose next token is now known. */
int dfl_mtp_add_context(dfl_drafter *d, dfl_dstore *s, const float *feat, const int32_t *tok,
                        int n, dfl_error *err);
/* A store for ctx context rows, of the target's K/V type. */
dfl_dstore *dfl_dstore_new(const dfl_drafter *d, int ctx);
void dfl_dstore_free(dfl_dstore *s);
void dfl_dstore_truncate(dfl_dstore *s, int n_keep);
/* Covers n more positions with no rows: a hole the next blocks attend
 * around (their drafts change, never the output, which the verify decides).
 * A DFlash store only (an MTP store fuses each row with the next). */
int dfl_dstore_skip(dfl_dstore *s, int n, dfl_error *err);
/* dst takes src's first n context rows (n <= src->len); returns the rows it
 * holds (0 when src's window skipped some of them). */
int dfl_dstore_copy_prefix(dfl_dstore *dst, const dfl_dstore *src, int n);

/* Appends n context rows: feat (n, n_cap*target_dim) for positions
 * s->len .. s->len+n-1 -> fc, hidden_norm, per-layer K/V into the store. */
int dfl_drafter_add_context(dfl_drafter *d, dfl_dstore *s, const float *feat, int n,
                            dfl_error *err);
/* One sequence's drafter work in a pass: n context rows for its store, or
 * (B > 0) a block drafted after anchor. Concurrent callers of the calls
 * below are run as one pass through the target's combiner (every matrix and
 * the lm_head read once for all); each row's numbers are those it gets alone. */
typedef struct dfl_dwork {
    dfl_dstore *s;
    const float *feat;         /* context: (n, n_cap*target_dim) for positions s->len .. */
    int n;
    int32_t anchor;            /* block: [anchor, mask x (B-1)] at s->len .. */
    int B, n_out;              /* outputs for the first n_out mask rows (1..B-1) */
    float *logits;             /* (n_out, vocab), or NULL */
    int32_t *draft;            /* (n_out) */
    int skip, row;             /* the pass's: rows the window skips; first scratch row */
} dfl_dwork;

/* Runs w[0..k) (distinct stores; context rows and block rows each at most
 * max_rows in all) as one pass, as the combiner does with concurrent calls. */
int dfl_drafter_pass(dfl_drafter *d, dfl_dwork *w, int k, dfl_error *err);

/* Drafts a block of B rows [anchor, mask x (B-1)] at positions s->len .. ;
 * logits (B-1, vocab) of rows 1..B-1 when not NULL; draft[i] = argmax of row
 * i+1 (B-1 tokens). A DFlash2 drafter's row i holds its selector's scores
 * of the K candidates given draft[i-1] (the anchor for i = 0), -inf
 * elsewhere: the distribution its draft is the argmax of, and the q a
 * sampled round draws from. The store is left at its context length. */
int dfl_drafter_draft(dfl_drafter *d, dfl_dstore *s, int32_t anchor, int B, float *logits,
                      int32_t *draft, dfl_error *err);
/* The same block of B rows, with logits and drafts for its first n_out
 * (1..B-1) mask rows only: a verify of n_out+1 rows drafted from the
 * trained block's full width, as the drafter was trained, for the price of
 * n_out lm_head rows. */
int dfl_drafter_draft_n(dfl_drafter *d, dfl_dstore *s, int32_t anchor, int B, int n_out,
                        float *logits, int32_t *draft, dfl_error *err);

#endif
