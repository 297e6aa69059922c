/* tok_impl.h - inside the tokenizer: the tables its files share.
 *
 * One struct serves every kind of vocabulary. Ids index per-token arrays
 * (key, decoded bytes, attributes, SPM score); a hash map finds an id from
 * its key and another finds a merge from a pair of ids. Encoding runs the
 * same pipeline for all kinds:
 *
 *   added tokens split out -> normalizers -> pre-tokenizers -> model per word
 *
 * where the model is BPE by merge rank (tokenizer.json, GGUF "gpt2") or
 * sentencepiece BPE by score (GGUF "llama"). */
#ifndef DFL_TOK_IMPL_H
#define DFL_TOK_IMPL_H

#include <stdint.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/tokenizer.h"

enum { TOK_BPE = 1, TOK_SPM = 2 };

/* Token attributes (bits). */
enum {
    TA_SPECIAL = 1, /* control/unknown: hidden unless asked, matched only with parse_special */
    TA_BYTE = 2,    /* a <0xNN> byte-fallback piece */
    TA_ADDED = 4,   /* an added token: matched in the text before the model runs */
    TA_UNUSED = 8,  /* an id no entry defines */
};

/* Largest id we accept (the most bytes in one token's text: tokenizer.h). */
enum { TOK_MAX_ID = 1 << 24 };

/* Open-addressing map from a byte string to an id; the strings live in the
 * tokenizer's pool (key_off/key_len per id). */
typedef struct tok_slot {
    uint32_t hash;  /* of the key */
    int32_t id;     /* -1 when the slot is empty */
} tok_slot;

typedef struct tok_strmap {
    tok_slot *s;    /* (cap) */
    uint32_t mask;  /* cap - 1, cap a power of two */
} tok_strmap;

/* Map from a pair of ids to the merge that joins them. */
typedef struct tok_merge {
    uint64_t key;   /* (left << 32 | right), UINT64_MAX when empty */
    int32_t rank;   /* lower merges first */
    int32_t id;     /* the joined token */
} tok_merge;

typedef struct tok_pairmap {
    tok_merge *m;   /* (cap) */
    uint32_t mask;
    int n;
} tok_pairmap;

/* A token matched in the raw text before the model runs. */
typedef struct tok_added {
    int32_t id;
    uint32_t off, len;    /* content in the pool (normalized form when normalized) */
    uint8_t lstrip, rstrip, normalized, special, single_word;
} tok_added;

/* Normalizer and pre-tokenizer steps, applied in file order. */
enum { NORM_NFC = 1, NORM_PREPEND, NORM_REPLACE, NORM_NFKC };
typedef struct tok_norm {
    int kind;
    char *a, *b;          /* PREPEND: a; REPLACE: a -> b */
} tok_norm;

enum {
    SPLIT_ISOLATED = 0, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS
};
enum { PRE_SPLIT = 1, PRE_BYTELEVEL_PREFIX, PRE_METASPACE };
typedef struct tok_pre {
    int kind;
    pcre2_code *re;       /* SPLIT */
    int behavior, invert; /* SPLIT */
    char rep[8];          /* METASPACE replacement (UTF-8) */
    int prepend;          /* METASPACE: 0 never, 1 first, 2 always */
    int split;            /* METASPACE: split into words that start with rep */
} tok_pre;

enum { TOK_MAX_NORM = 8, TOK_MAX_PRE = 8, TOK_MAX_EOG = 16 };

struct dfl_tokenizer {
    int model;               /* TOK_BPE or TOK_SPM */
    int byte_level;          /* BPE over GPT-2's 256 byte symbols; keys are raw bytes */
    int byte_fallback;       /* chars missing from the vocab become <0xNN> pieces */
    int ignore_merges;       /* a word found whole in the vocab skips the merges */
    int fuse_unk;            /* consecutive unknowns become one <unk> */
    int add_space_prefix;    /* SPM: a space before the text and after added tokens */
    int rep_split;           /* words may be cut before each rep (see tok_set_rep_split) */
    char rep[8];             /* the character that stands for a space ("▁") */
    int n_vocab;             /* ids are 0 .. n_vocab-1 */

    uint32_t *key_off, *key_len; /* (n_vocab) lookup key in pool: what the model sees */
    uint32_t *dec_off, *dec_len; /* (n_vocab) decoded bytes in pool */
    uint8_t *attr;               /* (n_vocab) TA_* bits */
    float *score;                /* (n_vocab) SPM merge scores; NULL for BPE */
    char *pool;                  /* every string above, back to back */
    size_t pool_len, pool_cap;

    tok_strmap vocab;        /* key -> id, model vocabulary only */
    tok_pairmap merges;      /* (left, right) -> rank, joined id */
    int32_t byte_id[256];    /* symbol for a byte: byte-level char or <0xNN>; -1 none */
    int32_t unk_id, bos_id, eos_id, pad_id;
    int add_bos, add_eos;    /* encode with add_special puts bos_id first, eos_add_id last */
    int32_t eos_add_id;
    int strip_leading_space; /* decoder drops the first piece's leading space */

    tok_norm norm[TOK_MAX_NORM];
    int n_norm;
    tok_pre pre[TOK_MAX_PRE];
    int n_pre;

    tok_added *added;        /* (n_added) by first byte, then longest first */
    int n_added;
    uint8_t added_first[256];/* bit 1: some raw-text token starts with this byte, 2: normalized */
    int32_t added_at[257];   /* tokens starting with byte b: added[added_at[b] .. added_at[b+1]) */

    int32_t eog[TOK_MAX_EOG];
    int n_eog;
    char *chat_template;     /* NULL when none */
    char *chat_template_tool; /* the "tool_use" one of a named list; NULL when none */
    char *source;            /* file name for messages */
};

/* ---- tokenizer.c: tables ---- */
dfl_tokenizer *tok_new(const char *source);
/* Appends bytes to the pool; returns their offset, or -1 when the pool would
 * pass 1 GiB (the caller reports it). */
int64_t tok_pool_add(dfl_tokenizer *t, const void *s, size_t n);
static inline const char *tok_key(const dfl_tokenizer *t, int32_t id) {
    return t->pool + t->key_off[id];
}
/* Sizes the per-id arrays for n ids (all unused). */
void tok_alloc_ids(dfl_tokenizer *t, int n);
uint32_t tok_hash(const void *s, size_t n);
void tok_strmap_init(tok_strmap *m, int n);
void tok_strmap_free(tok_strmap *m);
/* Inserts id under its key (key_off/key_len); keeps the first id on a duplicate key. */
void tok_strmap_put(dfl_tokenizer *t, int32_t id);
int32_t tok_strmap_get(const dfl_tokenizer *t, const char *s, size_t n);
void tok_pairmap_init(tok_pairmap *m, int n);
/* Returns 0, or 1 when the pair already had a merge (the new rank replaces it). */
int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
static inline const tok_merge *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t i = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & m->mask;
    for (;;) {
        const tok_merge *e = &m->m[i];
        if (e->key == key) return e;
        if (e->key == UINT64_MAX) return NULL;
        i = (i + 1) & m->mask;
    }
}
/* Sorts added tokens by first byte, longest first, and indexes them. */
void tok_finish_added(dfl_tokenizer *t);
/* Adds an end-of-generation id (ignores -1 and repeats). */
void tok_add_eog(dfl_tokenizer *t, int32_t id);
/* Marks special added tokens whose text means "end of turn" as EOG. */
void tok_find_eog(dfl_tokenizer *t);
/* Finds an id by its text: added tokens first, then the vocabulary's piece text. */
int32_t tok_find_text(const dfl_tokenizer *t, const char *s);

/* ---- bytes and UTF-8 ---- */
/* GPT-2 byte-level alphabet: byte b is shown as code point tok_bl_cp[b]. */
extern const uint16_t tok_bl_cp[256];
/* Decodes a byte-level string to raw bytes in out (cap >= n); returns the
 * length, or -1 if a char is outside the alphabet or the UTF-8 is bad. */
int tok_bl_decode(const char *s, size_t n, char *out);
/* Offset of the first invalid UTF-8 byte in s, or n when valid. */
size_t tok_utf8_check(const char *s, size_t n);
int tok_utf8_encode(uint32_t cp, char *out);

/* ---- normalize.c ---- */
/* Applies the normalizer steps to s; returns a malloc'd string (length in
 * *out_n), or NULL when no step changes anything (use s itself). */
char *tok_normalize(const dfl_tokenizer *t, const char *s, size_t n, size_t *out_n);
/* NFC of s (malloc'd) or NULL when s is already NFC. */
char *tok_nfc(const char *s, size_t n, size_t *out_n);
/* Whether NFC leaves cp alone whatever surrounds it (see normalize.c). */
int tok_nfc_inert(uint32_t cp);

/* ---- bpe.c: the models ---- */
typedef struct tok_ids {
    int32_t *v;
    int n;
    size_t cap;
} tok_ids;
void tok_ids_push(tok_ids *a, int32_t id);

typedef struct tok_cache tok_cache;
tok_cache *tok_cache_new(size_t text_len);
void tok_cache_free(tok_cache *c);
/* The model on one pre-tokenized word (BPE by rank, or sentencepiece by
 * score with spaces already escaped), appending ids; cache may be NULL. */
void tok_word(const dfl_tokenizer *t, const char *w, size_t n, tok_cache *c, tok_ids *out);
/* Lets tok_word cut long words before each rep that follows another
 * character, when the vocabulary shows this cannot change the result. */
void tok_set_rep_split(dfl_tokenizer *t, const char *rep);

/* ---- pieces of loading shared by tok_hf.c and tok_gguf.c ---- */
/* Compiles a pre-tokenizer regex (UTF, UCP, JIT when available). */
pcre2_code *tok_regex(const char *pattern, size_t len, int literal, const char *what,
                      dfl_error *err);
/* The regexes GGUF names in tokenizer.ggml.pre. */
extern const char *const tok_re_gpt2, *const tok_re_llama3, *const tok_re_qwen2,
    *const tok_re_qwen35;
/* Decoded text of every id from its key: byte-level decode, or metaspace
 * (rep -> ' ') and <0xNN> -> byte. Added tokens decode to their content. */
int tok_build_pieces(dfl_tokenizer *t, int byte_level_decode, const char *rep,
                     dfl_error *err);

#endif
