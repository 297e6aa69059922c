/* model.h - the target seam: dense Llama / Qwen2 / Qwen3 decoders.
 *
 * A target is loaded once (weights mmap'd or converted at load, scratch sized
 * for batch_rows). A dfl_kv is one sequence's cache. A forward runs rows of
 * one or several sequences, each row tagged with its sequence and position;
 * every row's logits and captured features are bit-identical whatever else
 * shares the call (batch-invariant kernels, attention per sequence), so what
 * one user gets never depends on who else is served.
 *
 * Threads that call dfl_target_forward at once on distinct sequences meet in
 * a combiner: the first becomes the leader, waits until every generating
 * sequence (dfl_target_join) has its rows queued or a short grace passes,
 * and runs all queued rows that fit batch_rows as one forward. */
#ifndef DFL_MODEL_H
#define DFL_MODEL_H

#include "base/base.h"
#include "io/io.h"
#include "kernels/kernels.h"
#include "models/seqstate.h"

enum { ARCH_LLAMA = 0, ARCH_QWEN2, ARCH_QWEN3, ARCH_LAGUNA, ARCH_QWEN35, ARCH_QWEN3_NEXT,
       ARCH_QWEN3_MOE };
/* Qwen3.5 and Qwen3-Next: the gated DeltaNet hybrids (one family, qwen35.c). */
#define DFL_ARCH_HYBRID(a) ((a) == ARCH_QWEN35 || (a) == ARCH_QWEN3_NEXT)
enum { DFL_MAX_LAYERS = 1024, DFL_MAX_EXPERTS = 1024, DFL_MAX_TOPK = 32 };
enum { DFL_MAX_CONV = 64 };   /* the longest gated DeltaNet conv kernel */
enum { DFL_MLP_DENSE = 0, DFL_MLP_MOE = 1 };
/* Output gates on attention heads: softplus(g_proj(x)) per head or per element
 * (Laguna), or sigmoid of a gate that q_proj emits beside each head's query
 * (Qwen3.5 / Qwen3-Next: rows [q | gate] per head). */
enum { DFL_GATE_NONE = 0, DFL_GATE_HEAD = 1, DFL_GATE_ELEMENT = 2, DFL_GATE_Q_SIGMOID = 3 };
enum { DFL_ROUTER_SIGMOID = 0, DFL_ROUTER_SQRTSOFTPLUS = 1 };
enum { ROPE_SCALE_NONE = 0, ROPE_SCALE_LINEAR, ROPE_SCALE_LLAMA3, ROPE_SCALE_YARN };

typedef struct dfl_config {
    int arch;
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab, max_ctx;
    float norm_eps;
    float rope_theta;
    int rope_neox;            /* 1 rotate-half (HF); 0 interleaved (GGUF llama) */
    int rope_scale_type;      /* ROPE_SCALE_* */
    float rope_factor, rope_low_freq, rope_high_freq, rope_beta_fast, rope_beta_slow;
    float rope_attn_factor;
    int rope_orig_ctx;
    int qkv_bias, qk_norm, tied_embed;
    int bos_id, eos_id;       /* -1 when unknown */
    int sliding_window;       /* keys a sliding layer's row attends, itself included; 0: none */
    unsigned char layer_kind[DFL_MAX_LAYERS]; /* DFL_LAYER_* of each layer */
    unsigned char mlp_kind[DFL_MAX_LAYERS];   /* DFL_MLP_* of each layer */
    short layer_heads[DFL_MAX_LAYERS];        /* query heads of each layer (0: n_heads) */
    float rope_partial;       /* fraction of head_dim full-attention layers rotate (0: all) */
    float swa_rope_theta;     /* sliding layers' RoPE when it differs (plain RoPE); 0: same */
    float swa_rope_partial;
    int gating;               /* DFL_GATE_*: softplus gate on each head's output */
    int n_experts, top_k, moe_ffn, shared_ffn;   /* DFL_MLP_MOE layers */
    float routed_scale;       /* routed experts' sum is scaled by this */
    float router_softcap;     /* > 0: router logits = c * tanh(logits / c) */
    int router_func;          /* DFL_ROUTER_*: expert scores from router logits */
    int swa_sinks;            /* sliding layers have a learned sink logit per head */
    int router_softmax;       /* 1: router scores softmax(logits) (Qwen); 0: sigmoid (Laguna) */
    int norm_topk;            /* 1: the chosen scores are divided by their sum */
    int norm_offset;          /* 1: RMSNorm weights are stored as w and applied as 1 + w */
    int mtp_blocks;           /* GGUF blocks after the n_layers run: an MTP head, not run */
    /* gated DeltaNet (DFL_LAYER_RECURRENT) layers: conv kernel, key / value heads and dims */
    int lin_conv, lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim;
} dfl_config;

/* Parses and range-checks a Hugging Face config.json (target models). */
int dfl_config_from_hf(const char *path, dfl_config *c, dfl_error *err);
/* The same from a config.json already in memory (the fuzz target's entry). */
int dfl_config_from_json(const char *buf, size_t len, dfl_config *c, dfl_error *err);
/* The same from a parsed object; arch < 0 reads architectures[0], else forces
 * ARCH_* (for drafters whose config.json names their own class). */
int dfl_config_from_cjson(const struct cJSON *j, const char *file, int arch, dfl_config *c,
                          dfl_error *err);
/* Reads the same from GGUF metadata (llama / qwen2 / qwen3 / laguna). */
int dfl_config_from_gguf(const gguf_file *g, dfl_config *c, dfl_error *err);
/* Cross-field checks shared by both (heads * head_dim, GQA ratio, ranges). */
int dfl_config_validate(const dfl_config *c, const char *src, dfl_error *err);
/* llama.cpp's general.architecture names: "llama", "qwen2", "qwen3", "laguna",
 * "qwen35", "qwen3next", "qwen3moe"; "?" outside. */
const char *dfl_arch_name(int arch);
/* Builds the RoPE table for c (caller frees r->inv_freq); _swa the sliding
 * layers' (swa_rope_*, or the same as full attention's). */
void dfl_rope_init(dfl_rope *r, const dfl_config *c);
void dfl_rope_init_swa(dfl_rope *r, const dfl_config *c);

typedef struct dfl_combiner dfl_combiner;

/* A mixture-of-experts MLP: a sigmoid or sqrt-softplus (Laguna) or softmax (Qwen) router
 * picks top_k experts per row (by score + sel_bias), their SwiGLU outputs
 * weighted by the scores (normalised when norm_topk) times routed_scale,
 * plus a shared expert, scaled by sigmoid(sh_scale x) when it has one. */
typedef struct dfl_moe {
    dfl_mat router;       /* (n_experts, dim) */
    const float *sel_bias;/* (n_experts) e_score_correction_bias, selection only; NULL: none */
    dfl_mat *gate, *up;   /* [n_experts] (moe_ffn, dim) */
    dfl_mat *down;        /* [n_experts] (dim, moe_ffn) */
    dfl_mat sh_gate, sh_up;/* (shared_ffn, dim); rows 0: no shared expert */
    dfl_mat sh_down;      /* (dim, shared_ffn) */
    dfl_mat sh_scale;     /* (1, dim) shared_expert_gate; rows 0: none */
} dfl_moe;

/* A gated DeltaNet mixer. With Kd = k_heads * k_dim, Vd = v_heads * v_dim,
 * C = 2 * Kd + Vd channels, r = v_heads / k_heads. Qwen3.5 has separate
 * projections; Qwen3-Next (grouped) two, whose rows go per key head. */
typedef struct dfl_gdn {
    int grouped;          /* 1: qkv is in_proj_qkvz (Qwen3-Next from Hugging Face) */
    int ba_grouped;       /* 1: b is in_proj_ba / ssm_ba (Qwen3-Next, either source) */
    int out_tiled;        /* 1: out's columns are llama.cpp's tiled value heads (head j of
                             key head k at j * k_heads + k): a GGUF whose block type cannot
                             move a head's columns; the forward writes o in that order */
    dfl_mat qkv;          /* (C, dim) q | k | v before the conv; grouped: (C + Vd, dim),
                             per key head [q (k_dim) | k (k_dim) | v (r v_dim) | z (r v_dim)] */
    dfl_mat z;            /* (Vd, dim) output gate; grouped: rows 0 (in qkv) */
    dfl_mat b, a;         /* (v_heads, dim) beta and decay inputs; ba_grouped: b (2 v_heads, dim),
                             per key head [b (r) | a (r)], a rows 0 */
    dfl_mat out;          /* (dim, Vd) */
    const float *conv;    /* (C, lin_conv) depthwise causal conv taps, oldest input first */
    const float *dt_bias; /* (v_heads) */
    const float *decay;   /* (v_heads) decay rate A = -exp(A_log) */
    const float *norm;    /* (v_dim) gated RMSNorm weight (plain w, no offset) */
} dfl_gdn;

typedef struct dfl_layer {
    int n_heads;      /* query heads of this layer */
    const dfl_rope *rope; /* this layer's RoPE (full-attention or sliding set) */
    dfl_mat wq;       /* (n_heads*hd, dim); DFL_GATE_Q_SIGMOID: (2*n_heads*hd, dim) */
    dfl_mat wk;       /* (n_kv*hd, dim) */
    dfl_mat wv;       /* (n_kv*hd, dim) */
    dfl_mat wo;       /* (dim, n_heads*hd) */
    dfl_mat wg;       /* (n_heads or n_heads*hd, dim) output gate; rows 0: none */
    dfl_mat w_gate;   /* (ffn, dim) dense MLP */
    dfl_mat w_up;     /* (ffn, dim) */
    dfl_mat w_down;   /* (dim, ffn) */
    dfl_moe *moe;     /* MoE MLP instead, or NULL */
    dfl_gdn *gdn;     /* gated DeltaNet mixer instead of attention, or NULL */
    const float *bq, *bk, *bv;        /* (n_heads*hd), (n_kv*hd) x2; qwen2 only */
    const float *attn_norm, *ffn_norm;/* (dim) */
    const float *q_norm, *k_norm;     /* (hd); qwen3 only */
    const float *sinks;   /* (n_heads) sink logits added to the softmax denominator; NULL: none */
} dfl_layer;

typedef struct dfl_target {
    dfl_config c;
    dfl_mat embed;        /* (vocab, dim) token embedding */
    dfl_mat lm_head;      /* (vocab, dim); == embed when tied */
    const float *out_norm;/* (dim) */
    dfl_layer *layers;    /* [n_layers] */
    dfl_rope rope;        /* full-attention layers' */
    dfl_rope rope_swa;    /* sliding layers' (a copy of rope when the same) */
    dfl_tensors ts;       /* file tensors (mappings) */
    gguf_file *gguf;      /* when loaded from GGUF (tokenizer reads it) */
    const char *prefix;   /* HF names of the decoder: "model." or, in a multimodal
                             checkpoint, "model.language_model." */
    int copied;           /* the file's weights were copied into memory (no_mmap) */
    int unpermute;        /* GGUF llama: q/k rows stored interleaved, undone at load */
    void *owned;          /* converted weights / f32 norms, one allocation */
    dfl_pool *pool;
    dfl_ticket lock;      /* one forward at a time: the pool and scratch are shared by
                             every session (the drafter's forwards take it too) */
    int max_rows;         /* rows of one sequence per forward (a prefill chunk) */
    int batch_rows;       /* rows of all sequences per forward (>= max_rows) */
    dfl_combiner *comb;   /* concurrent forwards meet here */
    dfl_type kv_type;     /* element type of every cache made for it */
    uint64_t weight_bytes;/* bytes one decode step reads */
    /* scratch, sized at load for batch_rows (R) */
    float *x;             /* (R, dim) residual */
    float *xn;            /* (R, dim) normed */
    float *q;             /* (R, n_heads*hd) */
    float *k, *v;         /* (R, n_kv*hd) */
    float *att;           /* (R, n_heads*hd) */
    float *h1, *h2;       /* (R, ffn) */
    void *qscratch;       /* quantized activations */
    int *n_keys;          /* (R) */
    float *rope_cs;       /* (R, 2*hd) each row's RoPE cos | sin for both sets, once per forward */
    float *gate;          /* (R, max_heads*hd) output gates */
    float *router;        /* (R, n_experts) router logits */
    float *moe_x, *moe_y; /* (R, dim) rows routed to one expert, and their output */
    int *moe_rows;        /* (R) which rows */
    float *sh_gate;       /* (R) shared-expert gate logits */
    float *moe_w;         /* (R * top_k) each row's expert weights ... */
    int *moe_e;           /* (R * top_k) ... and experts, in ascending expert order */
    uint64_t moe_touched, moe_bytes; /* last forward: experts run, their weight bytes */
    float *qg;            /* (R, 2*max_heads*hd) q_proj rows [q | gate] per head; NULL: none */
    float *lin_x;         /* (R, C) gated DeltaNet: q | k | v, conv input then its output */
    float *lin_z;         /* (R, Vd) output gates */
    float *lin_ba;        /* (R, 2*v_heads) beta inputs, then decay inputs */
    float *lin_o;         /* (R, Vd) recurrence output, then gated-normed */
    float *lin_g;         /* (R, C + Vd) grouped projections before they are split */
    int n_snap;           /* recurrent states kept per sequence besides the live one */
    uint64_t rec_bytes;   /* recurrent state of one sequence, its snapshots included */
    void *tree_k, *tree_v;/* (n_kv, DFL_ATT_BLOCK + max_rows, hd) of kv_type: one tree row's
                             keys past the prefix's whole blocks (dfl_kv_path_keys) */
    int *tree_path;       /* (max_rows) that row's path, root first */
    float *logits;        /* (R - max_rows, vocab) logits of a several-sequence forward,
                             before they go to each caller; NULL when R == max_rows */
} dfl_target;

typedef struct dfl_load_opts {
    const char *dtype;    /* NULL/"auto" keep; else convert matrices to this type */
    int floats_only;      /* convert only f32/f16/bf16 matrices (a drafter's default type
                             beside a quantized target): quantized ones keep theirs */
    const char *kv_type;  /* K/V cache elements: NULL/"f16" or "f32" */
    int max_rows;         /* rows of one sequence per forward (default 64) */
    int batch_rows;       /* rows of all sequences per forward; 0: max_rows */
    int draft_window;     /* drafters: see dfl_engine_opts.draft_window */
    int no_mmap;          /* copy the file's weights into memory (dfl_tensors_copy_maps):
                             1 always, 0 never, -1 when the copy fits (dfl_tensors_copy_fits) */
    int snap_rows;        /* recurrent layers: rows of one forward a sequence can roll back
                             into (the largest verify block); 0: max_rows */
    dfl_pool *pool;
    dfl_progress_fn progress;
    void *progress_ud;
} dfl_load_opts;

/* path: HF folder (config.json + safetensors) or a .gguf file. */
int dfl_target_load(const char *path, const dfl_load_opts *o, dfl_target **out, dfl_error *err);
void dfl_target_free(dfl_target *t);
/* Parameters of what was loaded (matrices, embeddings, norms, biases), for
 * the load summary: whatever the family. */
uint64_t dfl_target_params(const dfl_target *t);

/* A sequence's state for t (seqstate.h), cap positions long. */
dfl_kv *dfl_kv_new(const dfl_target *t, int cap);
/* The most rows a tree forward may have on its sequences (dfl_kv_tree_rows
 * of each, and max_rows): fewer where recurrent layers keep fewer snapshots. */
int dfl_target_tree_rows(const dfl_target *t);
/* Bytes of one sequence's state at cap positions (what dfl_kv_new allocates). */
uint64_t dfl_target_kv_bytes(const dfl_target *t, int cap);

/* One sequence's rows in a forward: tok[i] at position kv->len + i, each row's
 * parent the row before it; or, with parent tags (tree verification), row i
 * continues parent[i] (-1: the committed prefix, an earlier row of the call
 * otherwise) at position kv->len + its depth, and attends the prefix, its
 * ancestors and itself in the order single-row decode of its path would:
 * its logits and features have that decode's bits. Row i's K/V lie in slot
 * kv->len + i either way (dfl_kv_keep_path then compacts a kept path). A
 * tree has at most dfl_kv_tree_rows(kv) rows.
 * logits: when not NULL, rows [logits_from, n) get logits at
 *         logits[(r - logits_from) * vocab].
 * feat:   when n_cap > 0, [n, n_cap*dim]: output of decoder layer cap[j]
 *         (0-based, before the final norm) at columns j*dim. */
typedef struct dfl_fwd {
    dfl_kv *kv;
    const int32_t *tok;   /* (n) */
    const float *embeds;  /* (n, dim) input rows used instead of tok's embeddings (the MTP
                             head's fused rows); NULL: embed tok */
    int n, logits_from;
    float *logits;
    const int *cap;
    int n_cap;
    float *feat;
    const int *parent;    /* (n) parent tags, parent[i] < i; NULL: a chain */
    /* filled by the forward */
    int others;           /* rows of other sequences that shared the call */
    int other_seqs;       /* ... and how many sequences they came from */
    double seconds;       /* the call's time */
} dfl_fwd;

/* Runs f[0..n_seq): distinct sequences, rows in all <= batch_rows, each
 * f[i].n <= max_rows; the caller holds t->lock. No checks: callers check. */
void dfl_target_forward_rows(dfl_target *t, dfl_fwd *f, int n_seq);

/* Runs n rows that continue kv, in chunks of max_rows, each chunk through the
 * combiner (batched with other threads' rows). Returns 0, DFL_ECTX when the
 * cache is full or DFL_EARG for a token outside the vocabulary. The _ex form
 * takes the call as a dfl_fwd and leaves the last chunk's others and seconds
 * in it. */
int dfl_target_forward(dfl_target *t, dfl_kv *kv, const int32_t *tok, int n, int logits_from,
                       float *logits, const int *cap, int n_cap, float *feat, dfl_error *err);
int dfl_target_forward_ex(dfl_target *t, dfl_fwd *f, dfl_error *err);

/* A sequence starts / stops generating: the combiner's leader waits for the
 * rows of joined sequences (up to DFL_GATHER_US) before it runs a forward. */
void dfl_target_join(dfl_target *t);
/* Sequences joined now (generating, or between their rounds). */
int dfl_target_active(dfl_target *t);
dfl_combiner *dfl_combiner_new(int batch_rows);
/* A sequence's side work on the shared machine (its drafter's passes). Calls
 * that sequences make at once run as one pass: fn(ctx, calls, k) with t->lock
 * held, k calls of one fn and ctx whose rows sum to at most max_rows (the
 * drafter reads its weights once for all). A gathering forward leader waits
 * for a sequence in such a pass instead of timing out. */
typedef struct dfl_side_call dfl_side_call;
struct dfl_side_call {
    void (*fn)(void *ctx, dfl_side_call **calls, int k);
    void *ctx;
    int rows;             /* scratch rows the call takes (<= max_rows) */
    /* filled by the combiner */
    int done;
    int pass_rows;        /* rows of every call in the pass that ran it */
    int crowd;            /* sequences joined to the target then */
    double seconds;       /* that pass's time */
};
void dfl_target_side_run(dfl_target *t, dfl_side_call *call, int max_rows);
/* The seconds of its pass a done call's sequence is charged (see batch.c). */
double dfl_side_charge(const dfl_side_call *call);
void dfl_combiner_free(dfl_combiner *c);
void dfl_target_leave(dfl_target *t);
/* Seconds a row adds to a forward: the slope of forwards' times against their
 * rows (0 until forwards of different sizes were seen). B rows joining
 * others' in a forward cost B times it. */
double dfl_target_row_cost(const dfl_target *t);

/* The drafter borrows these. */
void dfl_target_embed(const dfl_target *t, const int32_t *tok, int n, float *out /* (n, dim) */);
/* logits (n, vocab) = lm_head(x (n, dim)); x is already normed. */
void dfl_target_lm_head(dfl_target *t, const float *x, int n, float *logits, void *qscratch);

#endif
