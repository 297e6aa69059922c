/* dflash.h - the one public door into the engine.
 *
 * An engine holds what is loaded once: the target model, an optional DFlash
 * drafter, the tokenizer and a thread pool. A session is one sequence: its KV
 * cache, the drafter's side store and its statistics. The CLI and the server
 * use only this header; they never see tensors. */
#ifndef DFLASH_H
#define DFLASH_H

#include <stddef.h>
#include <stdint.h>

#define DFL_VERSION "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ------------------------------------------------------------ */

enum {
    DFL_OK = 0,
    DFL_EIO = -1,       /* a file could not be opened or read */
    DFL_EFORMAT = -2,   /* a file is malformed (names the field or tensor) */
    DFL_EUNSUP = -3,    /* valid but not supported (architecture, dtype) */
    DFL_ENOMEM = -4,
    DFL_EARG = -5,      /* a bad argument from the caller */
    DFL_ECTX = -6,      /* the context window is full */
    DFL_ECANCEL = -7,   /* the caller's callback asked to stop */
};

typedef struct dfl_error {
    int code;        /* one of DFL_E* (0 when no error) */
    char msg[1024];  /* what went wrong and what to do about it */
} dfl_error;

/* ---- progress ---------------------------------------------------------- */

/* One callback for long operations: what (e.g. "load"), done of total units. */
typedef void (*dfl_progress_fn)(void *ud, const char *what, uint64_t done, uint64_t total);

/* ---- engine ------------------------------------------------------------ */

typedef struct dfl_engine dfl_engine;
typedef struct dfl_session dfl_session;

/* Limits of the API, written once. */
enum {
    DFL_MAX_BLOCK = 512,          /* largest verify block (max_block, block_size) */
    DFL_MAX_TREE = 32,            /* nodes of a draft tree (dfl_gen_params.tree_budget) */
    DFL_MAX_TOP_LOGPROBS = 20,    /* alternatives per token (n_top_logprobs) */
    DFL_MAX_CAPTURE_LAYERS = 64,  /* target layers one capture reads (drafter features) */
    DFL_MAX_PARALLEL = 256,       /* sequences generating at once (dfl_engine_opts.n_parallel) */
};

typedef struct dfl_engine_opts {
    const char *model_path;   /* Hugging Face folder or .gguf file */
    const char *draft_path;   /* DFlash drafter folder or .gguf; NULL for none */
    int draft_mtp;            /* draft with the target's own MTP head (mtp.* of a Qwen3.5 /
                                 Qwen3-Next folder): alone, it is the drafter; with
                                 draft_path, a lane of its own (DFL_LANE_MTP) beside it */
    const char *dtype;        /* convert weights at load: NULL/"auto" keeps the file's */
    const char *kv_type;      /* K/V cache elements: NULL/"f16" (half the memory and the
                                 bytes a long-context step reads) or "f32" */
    int n_threads;            /* 0: all cores */
    int ctx_size;             /* KV cache rows per session; 0: min(model max, 4096) */
    int max_block;            /* largest verify block; 0: drafter block size or 16 */
    int vocab_only;           /* load the tokenizer alone (tokenize / detokenize) */
    int allow_inexact;        /* speculate even when the probe finds the verify path inexact
                                 (output may differ from classic decode); the CLI sets it
                                 from DFLASH_ALLOW_INEXACT=1 */
    int n_parallel;           /* sessions that generate at once (threads calling dfl_generate
                                 on distinct sessions); their rows share forwards. 0: 1 */
    int draft_window;         /* > 0: a draft block attends to the last W context rows only
                                 (an approximation); 0: all. The CLI: DFLASH_DRAFT_WINDOW=W */
    const char *isa;          /* kernel path: NULL/"auto" (the best this CPU has), "generic"
                                 (the plain-C twins), "avx2", "avx512" or "neon" (aarch64 with
                                 dotprod); a path the CPU lacks
                                 is an error. Process-wide: the last engine loaded sets it.
                                 Every path gives the same bits. The CLI: DFLASH_ISA=... */
    int ngram;                /* the n-gram lane too: drafts by prompt lookup (the tokens that
                                 followed the last few tokens' latest earlier occurrence),
                                 with or without a drafter; the policy picks a lane per round */
    int no_mmap;              /* copy the weights file into memory (huge pages where the kernel
                                 has them) instead of reading it in place: a decode step then
                                 misses the TLB less (about 10% faster sustained Q8_0 decode
                                 measured on a Zen 4), for a read of the file at load and its
                                 size in memory. Files used as they are; converted weights
                                 (dtype) are in memory anyway. -1: copy when the copy takes
                                 at most half of the memory available (serve's default) */
    dfl_progress_fn progress;
    void *progress_ud;
    const char *draft_dtype;  /* the drafter's weights at load: a type converts them; "auto"
                                 keeps the file's; NULL follows dtype, and with dtype unset
                                 too a 16-bit or f32 drafter beside a quantized target loads
                                 as q8_0 (its 16-row block then runs on the integer kernels:
                                 1.2x a BF16 drafter's tok/s at tau 3 on a 0.6B Q8_0 target,
                                 Zen 5). Output is the target's either way */
} dfl_engine_opts;

void dfl_engine_opts_default(dfl_engine_opts *o);
/* Switches the kernel path process-wide ("generic", "avx2", "avx512", "neon"; NULL or
 * "auto": the CPU's best), as dfl_engine_opts.isa does at load; dflash bench
 * uses it to time two paths on one engine (every path gives the same bits).
 * Returns 0, or an error when the name is unknown or the CPU lacks the path. */
int dfl_set_isa(const char *isa, dfl_error *err);
int dfl_engine_load(const dfl_engine_opts *o, dfl_engine **out, dfl_error *err);
void dfl_engine_free(dfl_engine *e);

typedef struct dfl_model_info {
    char arch[32];         /* "llama", "qwen2", "qwen3", "laguna", "qwen3_5" */
    char name[128];        /* file or folder name */
    char dtype[16];        /* weight type as loaded */
    char kv_type[8];       /* K/V cache element type: "f16" or "f32" */
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab;
    int ctx_size;          /* per session */
    int max_ctx;           /* model's max_position_embeddings */
    uint64_t weight_bytes; /* bytes read per decoded token (all layers + lm_head) */
    uint64_t rec_state_bytes; /* recurrent layers' state per session, snapshots included */
    uint64_t state_bytes;  /* all of a session's cache at ctx_size: K/V (sliding layers: their
                              ring) and recurrent state */
    int rec_snapshots;     /* recurrent states kept for rollback besides the live one */
    int has_draft;
    int draft_mtp;         /* the drafter is the target's MTP head (one token per step) */
    int mtp_lane;          /* the target's MTP head drafts too, as the mtp lane beside the
                              DFlash drafter (draft_path and draft_mtp both given) */
    char draft_kind[16];   /* "DFlash" (z-lab, Laguna or llama.cpp GGUF), "DFlash2" (with its
                              conv and candidate selector), "MTP"; "" without a drafter */
    int draft_block;       /* drafter's trained block size (MTP: the default max block) */
    int draft_layers;
    int ngram;             /* the n-gram lane is on (dfl_engine_opts.ngram) */
    int n_threads;
    uint64_t n_params;     /* target parameters (matrices, embeddings, norms, biases) */
    char simd[16];         /* kernel path in use: "avx512", "avx2" or "generic" (the plain-C
                              twins) */
    char draft_dtype[16];  /* the DFlash drafter's weight type as loaded; "" without one */
    uint64_t draft_head_bytes; /* the drafter's own copy of the target's lm_head, in
                              draft_dtype (a 16-bit head beside a quantized drafter); 0: it
                              reads the target's */
    int weights_copied;    /* the target's file weights were copied into memory (no_mmap),
                              not read in place */
} dfl_model_info;

void dfl_engine_info(const dfl_engine *e, dfl_model_info *info);
/* Runs now what the first speculative request (a drafter's or the n-gram
 * lane's) would run, so a server's first user does not wait for it: the
 * exactness probe (the verify path against single-row decode, blocks 2 ..
 * the engine's max; about 1.2 s, 0.6B Q8_0, Zen 5) and, when exact, the
 * calibration of the round costs the adaptive policy starts from (about 1 s,
 * 0.6B Q8_0, Zen 4; it holds the engine, so every request starting meanwhile
 * waited for it too). *exact: 1 exact, -1 not (requests then decode
 * classically), 0 nothing speculates. */
int dfl_engine_prepare(dfl_engine *e, int *exact, dfl_error *err);

/* ---- tokenizer --------------------------------------------------------- */

/* Encodes text. add_special: add BOS (and EOS) as the tokenizer config says.
 * parse_special: text like "<|im_start|>" becomes its special token.
 * Returns the number of ids (may exceed cap: then only cap were written), or < 0. */
int dfl_tokenize(const dfl_engine *e, const char *text, size_t len, int add_special,
                 int parse_special, int32_t *ids, int cap, dfl_error *err);

/* Streaming detokenizer: holds back bytes of an incomplete UTF-8 sequence. */
typedef struct dfl_detok {
    const dfl_engine *e;
    int show_special;     /* print special tokens' text */
    int n_pending;
    char pending[8];
    int first;            /* strips the sentencepiece leading space once */
} dfl_detok;

void dfl_detok_init(dfl_detok *d, const dfl_engine *e, int show_special);
/* Appends the complete UTF-8 text of token id to out; returns bytes written, < 0 on error. */
int dfl_detok_push(dfl_detok *d, int32_t id, char *out, size_t cap);
/* Flushes held-back bytes (invalid ones become U+FFFD). */
int dfl_detok_flush(dfl_detok *d, char *out, size_t cap);

int dfl_token_is_eog(const dfl_engine *e, int32_t id); /* EOS, EOT, <|im_end|>... */
int32_t dfl_token_bos(const dfl_engine *e);            /* -1 when none */

/* ---- chat templates ---------------------------------------------------- */

typedef struct dfl_chat_msg {
    const char *role;     /* "system", "user", "assistant" */
    const char *content;
} dfl_chat_msg;

/* Renders messages with the model's Jinja template (ChatML when it has none),
 * or with template_name: "chatml" or a Jinja template's text; returns bytes
 * needed (excluding the NUL), < 0 on error. */
int dfl_chat_render(const dfl_engine *e, const char *template_name, const dfl_chat_msg *msgs,
                    int n, int add_generation_prompt, int enable_thinking, char *out,
                    size_t cap, dfl_error *err);

/* The whole of transformers' apply_chat_template: template_text (NULL: the
 * model's; for a model with a {name, template} list, "tool_use" when tools
 * are given; "chatml"; or a Jinja text) rendered by a sandboxed Jinja interpreter. messages_json is a
 * JSON array of messages (role, content as a string or a list of parts,
 * tool_calls, tool_call_id, name, reasoning_content); tools_json a JSON array
 * or NULL; kwargs_json a JSON object of extra variables (enable_thinking...)
 * or NULL. bos_token and eos_token come from e (none when e is NULL). now:
 * the clock strftime_now reads, unix seconds (0: the real one; a caller that
 * renders twice, to size and then to fill, passes one value to both).
 * Returns bytes needed as snprintf, < 0 on error; a template's
 * raise_exception(msg) gives DFL_EARG with err->msg exactly msg. */
int dfl_chat_render_json(const dfl_engine *e, const char *template_text,
                         const char *messages_json, const char *tools_json,
                         const char *kwargs_json, int add_generation_prompt, int64_t now,
                         char *out, size_t cap, dfl_error *err);
/* The template dfl_chat_render uses for e; *fallback set when the model has
 * none and ChatML stands in. */
const char *dfl_chat_template(const dfl_engine *e, int *fallback);

/* ---- generation -------------------------------------------------------- */

enum { DFL_ACCEPT_EXACT = 0, DFL_ACCEPT_REJECTION = 1, DFL_ACCEPT_TYPICAL = 2 };

typedef struct dfl_gen_params {
    int max_tokens;
    float temperature;      /* 0: greedy */
    int top_k;              /* 0: off */
    float top_p;            /* 1: off */
    float min_p;            /* 0: off */
    float repeat_penalty;   /* 1: off */
    float presence_penalty, frequency_penalty;
    int repeat_last_n;      /* window for penalties; 0: whole sequence */
    const int32_t *bias_ids; const float *bias_vals; int n_bias;  /* logit_bias */
    uint64_t seed;
    int block_size;         /* 0: auto (adaptive); 1: classic decode; N: pin N */
    int tree_budget;        /* draft trees (DDTree): -1 the policy picks chain or a budget
                               (the default), 0 the chain, N trees of N nodes (1..32);
                               greedy or exact-sampled rounds with a drafter, on targets
                               of full-attention layers only (else the chain) */
    int spec_accept;        /* DFL_ACCEPT_* */
    float typical_d;
    const int32_t *stop_ids; int n_stop_ids; /* extra stop tokens */
    int ignore_eos;
    int n_top_logprobs;     /* 0..DFL_MAX_TOP_LOGPROBS: report top-k logprobs per token */
    int no_logprob;         /* 1 (with no top-k): each token's logprob is left 0, saving a
                               pass over the vocabulary per token (~1 ms at 152K entries) */
    /* Benchmarks only (dflash serve --replay-tau): the drafter still runs every round,
     * but its proposals follow replay_ref, this prompt's greedy continuation, and are
     * right as often as a drafter of mean acceptance length replay_tau would be (see
     * dfl_bench_replay). Greedy only; NULL: the drafter's own proposals. */
    const int32_t *replay_ref; int n_replay_ref; double replay_tau;
    const struct dfl_format *format;   /* structured output (dfl_format_new), or NULL */
} dfl_gen_params;

void dfl_gen_params_default(dfl_gen_params *p);

enum { DFL_MAX_POS_STATS = 64 };

/* The proposers a round's drafts may come from: the loaded drafter (DFlash,
 * DFlash2, or an MTP head given alone), the n-gram lane (dfl_engine_opts.ngram)
 * and the target's MTP head when it drafts beside a DFlash drafter (draft_path
 * and draft_mtp both given). */
enum { DFL_LANE_DRAFTER = 0, DFL_LANE_NGRAM = 1, DFL_LANE_MTP = 2, DFL_LANES = 3 };
/* "drafter", "ngram", "mtp": the names stats and /metrics give the lanes. */
const char *dfl_lane_name(int lane);

typedef struct dfl_stats {
    int n_prompt, n_gen;
    int n_cached;                    /* prompt tokens whose cache the session already held */
    double t_prefill, t_decode;      /* seconds */
    double t_draft, t_verify, t_other;
    /* verify rounds; drafts proposed; drafts accepted and committed (a stop inside
     * a round leaves the drafts after it out); tokens the rounds committed */
    uint64_t rounds, proposed, accepted, committed;
    uint64_t pos_proposed[DFL_MAX_POS_STATS], pos_accepted[DFL_MAX_POS_STATS];
    uint64_t classic_steps;          /* single-token decode steps */
    double weight_bytes;             /* bytes read per target forward */
    int exact_checked;               /* probe run: 1 exact, -1 inexact, 0 not run */
    char note[256];                  /* e.g. why speculation was turned off */
    int stop;                        /* DFL_STOP_*: why generation ended */
    int accept_rule;                 /* DFL_ACCEPT_* the rounds used (exact when greedy) */
    uint64_t accepted_lossy;         /* typical: drafts kept by the threshold alone */
    uint64_t resampled;              /* rejection: rounds ended by a residual draw */
    uint64_t shared_forwards;        /* decode forwards that carried other sequences' rows */
    uint64_t shared_rows;            /* those rows, summed over them */
    /* rounds, proposed, accepted and committed by the lane that drafted (DFL_LANE_*) */
    uint64_t lane_rounds[DFL_LANES], lane_proposed[DFL_LANES], lane_accepted[DFL_LANES];
    uint64_t lane_committed[DFL_LANES];
    /* drafter rounds verified as a draft tree (DDTree), the nodes they verified and the
     * drafts they accepted (also counted in rounds, proposed, accepted) */
    uint64_t tree_rounds, tree_nodes, tree_accepted;
} dfl_stats;

/* Why dfl_generate returned 0. The stop token itself (EOS/EOT or one of
 * stop_ids) is committed and passed to the callback as the last token; text
 * printers skip it with dfl_token_is_eog. A callback that returns nonzero
 * ends generation after that token with DFL_STOP_CANCEL; that is not an
 * error (dfl_generate still returns 0). */
enum { DFL_STOP_NONE = 0, DFL_STOP_LENGTH, DFL_STOP_EOS, DFL_STOP_CTX, DFL_STOP_CANCEL };

/* How a committed token was produced (dfl_token_info.kind): a classic decode
 * step (a one-row forward), a draft the target accepted in a verify round, or
 * the round's bonus (the target's own token after the accepted drafts). A
 * round commits DRAFT* BONUS; only the last round of a generation may end
 * without its bonus (the stop token or the caller's stop came first). So, per
 * generation: stats.accepted == DRAFT tokens, stats.committed == DRAFT + BONUS,
 * stats.classic_steps == CLASSIC, stats.rounds == those round groups. */
enum { DFL_TOKEN_CLASSIC = 0, DFL_TOKEN_DRAFT = 1, DFL_TOKEN_BONUS = 2 };

typedef struct dfl_token_info {
    int32_t id;
    float logprob;                    /* of the chosen token */
    int n_top; int32_t top_ids[DFL_MAX_TOP_LOGPROBS]; float top_logprobs[DFL_MAX_TOP_LOGPROBS];
    int kind;                         /* DFL_TOKEN_*: how it was produced */
} dfl_token_info;

/* Called once per committed token, in order; return nonzero to stop. */
typedef int (*dfl_token_fn)(void *ud, const dfl_token_info *tok);

int dfl_session_new(dfl_engine *e, dfl_session **out, dfl_error *err);
void dfl_session_free(dfl_session *s);
/* dst takes the first n tokens of src's sequence (their K/V, the drafter's
 * rows): a prompt that shares them then skips their prefill, with output
 * identical to a cold run (rows are batch invariant). Returns the tokens dst
 * now holds (fewer when src no longer has them, e.g. a sliding window moved
 * past them). src must not be generating meanwhile. */
int dfl_session_copy_prefix(dfl_session *dst, const dfl_session *src, int n);
/* Generates after prompt; the session keeps the longest common prefix of the
 * previous prompt+output so a follow-up turn does not re-prefill it. */
int dfl_generate(dfl_session *s, const int32_t *prompt, int n_prompt, const dfl_gen_params *p,
                 dfl_token_fn cb, void *ud, dfl_stats *st, dfl_error *err);

/* ---- structured output ------------------------------------------------- */

/* A JSON schema compiled for e's vocabulary (docs/server.md lists the subset;
 * any other keyword is refused by name, DFL_EUNSUP). With it in
 * dfl_gen_params.format, generation produces prefix, one JSON value the
 * schema accepts, suffix, then an end-of-generation token -- speculative or
 * not, with identical output. schema NULL: any JSON object; prefix / suffix
 * NULL: none. Immutable once made: requests may share one; it must not
 * outlive e. */
typedef struct dfl_format dfl_format;
int dfl_format_new(dfl_engine *e, const char *schema, const char *prefix, const char *suffix,
                   dfl_format **out, dfl_error *err);
void dfl_format_free(dfl_format *f);
/* 1 when text[0..n) is a complete output the format allows. */
int dfl_format_accepts(const dfl_format *f, const char *text, size_t n);

/* ---- probe ------------------------------------------------------------- */

typedef struct dfl_probe_result {
    int block;
    uint64_t bytes_compared, bytes_differ;
    uint64_t state_bytes_compared, state_bytes_differ; /* recurrent layers' states */
    double max_abs_diff;
    int n_argmax_disagree;
} dfl_probe_result;

/* Runs the same rows as one block and as single-row steps; writes a JSON
 * report to json (may be NULL). Returns 0 when run (exact or not). */
int dfl_probe(dfl_engine *e, const int32_t *prompt, int n_prompt, int block,
              dfl_probe_result *r, char *json, size_t cap, dfl_error *err);

/* The drafter diagnostic (needs a drafter): decodes n_gen tokens after prompt
 * classically (the reference path) and, at every position of that path,
 * drafts a block of `block` rows from the reference prefix, as a shadow that
 * never steers the committed path. Per draft position i (0-based, i.e. block
 * row i+1): hit = draft equals the reference token; prefix = it and all
 * drafts before it do (what greedy verification would accept). */
typedef struct dfl_draft_report {
    int block;
    int n_anchors;                              /* blocks drafted */
    uint64_t pos_tried[DFL_MAX_POS_STATS];      /* anchors whose row i+1 had a reference token */
    uint64_t pos_hit[DFL_MAX_POS_STATS];
    uint64_t pos_prefix[DFL_MAX_POS_STATS];
    double tau;            /* 1 + mean accepted prefix: committed tokens per round */
    /* The rounds greedy speculation with this block makes along the path
     * (chained from the prompt's end, blocks shrunk at the end as the loop
     * does): dfl_generate with the same prompt, block and max_tokens = n_gen
     * reports exactly these as stats.rounds and stats.committed. */
    uint64_t chain_rounds, chain_committed;
} dfl_draft_report;

int dfl_probe_draft(dfl_engine *e, const int32_t *prompt, int n_prompt, int block, int n_gen,
                    dfl_draft_report *r, char *json, size_t cap, dfl_error *err);

/* ---- quantize --------------------------------------------------------- */

typedef struct dfl_quantize_opts {
    const char *in, *out;      /* GGUF files (must differ) */
    const char *type;          /* q8_0, q4_0, q4_1, q4_k, q6_k, f16, bf16 */
    int quantize_embeddings;   /* token_embd too (kept as is otherwise) */
    int n_threads;
    dfl_progress_fn progress;
    void *progress_ud;
} dfl_quantize_opts;

typedef struct dfl_quantize_result {
    int n_tensors, n_converted;
    uint64_t bytes_in, bytes_out;
} dfl_quantize_result;

/* Rewrites a GGUF with its 2-D weight matrices in another type. */
int dfl_quantize_gguf(const dfl_quantize_opts *o, dfl_quantize_result *r, dfl_error *err);

/* ---- debugging and reference tests -------------------------------------- */

/* Runs ids (from position 0, session cache cleared) through the target.
 * logits: (n, vocab) for every row when not NULL. feat: (n, n_cap*dim) hidden
 * states of the layers in cap (output of decoder layer cap[j], before the
 * final norm) when n_cap > 0. */
int dfl_debug_forward(dfl_session *s, const int32_t *ids, int n, const int *cap, int n_cap,
                      float *logits, float *feat, dfl_error *err);
/* After dfl_debug_forward (or earlier steps): feeds ids one row at a time at
 * the next positions, as decode steps do; logits (n, vocab) and feat as there
 * (cap as dfl_debug_forward checked it).
 * The drafter is not fed. */
int dfl_debug_step(dfl_session *s, const int32_t *ids, int n, const int *cap, int n_cap,
                   float *logits, float *feat, dfl_error *err);
/* After dfl_debug_forward of ids[0..n): feeds the drafter the features of rows
 * 0..n-2 as context and drafts a block of B rows anchored on ids[n-1] at
 * position n-1; logits: (B-1, vocab) drafter logits of rows 1..B-1. */
int dfl_debug_draft(dfl_session *s, const int32_t *ids, int n, int B, float *logits,
                    dfl_error *err);

/* ---- drafter training: dflash capture (src/api/capture.c) ------------- */
/* See docs/training.md. */

/* Runs ids[0..n) from position 0 (the session's cache is cleared) and writes
 * feat (n, n_layers*dim): the output of decoder layer layers[j] (0-based,
 * before the final norm) at columns j*dim, bit-identical to what
 * verification captures for the same rows. n <= the engine's ctx_size. */
int dfl_capture_rows(dfl_session *s, const int32_t *ids, int n, const int *layers, int n_layers,
                     float *feat, dfl_error *err);
/* The target's token embedding and lm_head (vocab, dim) each as float32
 * (dequantized); either pointer may be NULL. Tied models give equal tables. */
int dfl_export_embeddings(const dfl_engine *e, float *embed, float *lm_head, dfl_error *err);
/* z-lab's default target layers for a drafter of n_draft layers (what a
 * drafter config without target_layer_ids gets); returns how many. */
int dfl_capture_default_layers(const dfl_engine *e, int n_draft, int *ids);

/* ---- several sessions ------------------------------------------------- */
/* dfl_generate may run on distinct sessions of one engine from several
 * threads at once (dflash serve's slots). Their forwards meet in the target's
 * combiner and run as one batch (a decode row, a verify block or a prefill
 * chunk from each), and every row's result is what it would be alone: a
 * greedy request's output never depends on the others. The functions taking
 * a const dfl_engine * (tokenizer, detokenizer on distinct dfl_detok, chat
 * render, info) are safe from any thread at any time. Set n_parallel in
 * dfl_engine_opts to the number of such threads so batches have room. */

/* ---- benchmarks (src/api/bench.c; dflash bench, docs/benchmarks.md) ---- */

/* This machine's limits on the engine's threads (src/kernels/machine.c):
 * read bandwidth in GB/s (the best of reps sums over a buffer of `bytes`,
 * far larger than the caches; 0, 0: 512 MiB, 5) and f32 FMA peak in
 * GFLOP/s (register-only FMA chains). */
double dfl_bench_read_bw(const dfl_engine *e, size_t bytes, int reps);
double dfl_bench_fma_peak(const dfl_engine *e);
/* FLOPs (2 per multiply-add) of the weight products one row costs through
 * the target, lm_head included, attention excluded. */
double dfl_bench_row_flops(const dfl_engine *e);
/* Mixture-of-experts targets, for the last forward of s's engine: experts run
 * (each distinct expert of each layer once) and the bytes of their weights;
 * a block's extra rows route to more experts, so it reads more than a step.
 * Both 0 for dense models. */
void dfl_bench_moe(const dfl_session *s, uint64_t *experts, uint64_t *bytes);

enum { DFL_BENCH_LOGITS = 1, DFL_BENCH_CAPTURE = 2 };

/* Seconds of one target forward of B rows continuing a cache of ctx rows,
 * the best of reps after one untimed call. flags: DFL_BENCH_LOGITS gives
 * every row logits (a verify block; without it: a prefill chunk), and
 * DFL_BENCH_CAPTURE captures the drafter's layers too (needs a drafter).
 * The session's cache is first filled to ctx rows with placeholder K/V
 * (attention costs the same whatever the values) that no prompt matches,
 * and is left holding them; the next dfl_generate starts afresh. */
int dfl_bench_forward(dfl_session *s, int ctx, int B, int flags, int reps, double *seconds,
                      dfl_error *err);

/* The speculative A/B at a known acceptance: generates max_tokens after
 * prompt (from an empty cache) with a replay drafter -- the real drafter
 * runs every round, so its cost is real, but the tokens it proposes are
 * ref[] (what classic decode generated after prompt with the same sampling
 * parameters, at least max_tokens + the drafter block of them) with accept
 * lengths forced from a profile: P(draft i right | all before right) = p[i],
 * or a flat p giving tau committed tokens per round at the drafter's block
 * size. Sampled runs use the exact rule: a replayed path is one fixed
 * sequence, and only the exact rule turns forced drafts into that path
 * (rejection and typical draw their own, so a profile cannot be imposed). */
typedef struct dfl_bench_replay_opts {
    int block;            /* 1: classic decode (no drafter); N >= 2: pinned; 0: adaptive */
    double tau;           /* flat profile (1: nothing accepted) ... */
    const double *p;      /* ... or per-position probabilities, used when n_p > 0 */
    int n_p;
    uint64_t seed;        /* keys the drawn accept lengths by position */
    int max_tokens;
    int fresh_costs;      /* adaptive: forget learned round costs and calibrate again */
    const dfl_gen_params *sample;   /* NULL: greedy; else temperature, filters, penalties
                                       and seed (spec_accept must be exact) */
} dfl_bench_replay_opts;

typedef struct dfl_bench_replay_result {
    dfl_stats st;         /* the loop's statistics (t_decode, rounds, accepted, ...) */
    uint64_t draft_calls; /* drafter calls */
    uint64_t forced;      /* sum over calls of min(k(pos), B-1): what the profile forced */
    double p_flat;        /* the flat p used (when tau was given) */
    double t_calibrate;   /* seconds spent measuring start-up costs (adaptive) */
    int n_out;            /* tokens generated */
    int matches_ref;      /* 1 when they equal ref[0..n_out) (exactness) */
    double t_round[65];   /* the engine's round-cost table after the run ([B], seconds) */
} dfl_bench_replay_result;

int dfl_bench_replay(dfl_session *s, const int32_t *prompt, int n_prompt, const int32_t *ref,
                     int n_ref, const dfl_bench_replay_opts *o, dfl_bench_replay_result *r,
                     dfl_error *err);

#ifdef __cplusplus
}
#endif
#endif
