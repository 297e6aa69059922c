/* test_io.c - GGUF, safetensors and JSON loaders on real and malformed files.
 *
 * Real: stories260K.gguf (checked against the independent llama2.c .bin of
 * the same weights, and rewritten byte for byte by our writer), llama.cpp's
 * Llama-2 vocabulary GGUF. Malformed: files built here byte by byte; each
 * must fail with its own code and a message naming the field or tensor. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "io/io.h"
#include "testutil.h"

/* ---- a byte builder ------------------------------------------------------ */

typedef struct { uint8_t *p; size_t n, cap; } bb;

static void put(bb *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void put_u32(bb *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(bb *b, uint64_t v) { put(b, &v, 8); }
static void put_str(bb *b, const char *s) { put_u64(b, strlen(s)); put(b, s, strlen(s)); }
static void put_pad(bb *b, size_t a) { while (b->n % a) put(b, "", 1); }
static void put_zeros(bb *b, size_t n) { while (n--) put(b, "", 1); }

static void g_head(bb *b, uint32_t ver, uint64_t nt, uint64_t nkv) {
    put(b, "GGUF", 4);
    put_u32(b, ver);
    put_u64(b, nt);
    put_u64(b, nkv);
}
static void g_kv_u32(bb *b, const char *k, uint32_t v) { put_str(b, k); put_u32(b, GGUF_T_U32); put_u32(b, v); }
static void g_kv_str(bb *b, const char *k, const char *v) { put_str(b, k); put_u32(b, GGUF_T_STRING); put_str(b, v); }
static void g_tensor(bb *b, const char *name, int nd, const uint64_t *ne, uint32_t type, uint64_t off) {
    put_str(b, name);
    put_u32(b, nd);
    for (int d = 0; d < nd; d++) put_u64(b, ne[d]);
    put_u32(b, type);
    put_u64(b, off);
}

/* Parses an exact-size copy (so ASan sees any read past the end). */
static int parse_exact(const uint8_t *p, size_t n, gguf_file *g, dfl_error *e) {
    uint8_t *c = malloc(n ? n : 1);
    memcpy(c, p, n);
    int rc = dfl_gguf_parse(c, n, "t.gguf", g, e);
    if (!rc) dfl_gguf_free(g);
    free(c);
    return rc;
}

static void expect_gguf(bb *b, int code, const char *sub, const char *what) {
    gguf_file g;
    dfl_error e = {0};
    int rc = parse_exact(b->p, b->n, &g, &e);
    CHECK(rc == code && strstr(e.msg, sub) && strstr(e.msg, "t.gguf"),
          "%s: rc %d msg '%s' (want %d and '%s')", what, rc, e.msg, code, sub);
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- GGUF: malformed ----------------------------------------------------- */

/* A valid file: one kv, one 2x4 f32 tensor "w". */
static void g_valid(bb *b) {
    uint64_t ne[2] = {4, 2};
    g_head(b, 3, 1, 1);
    g_kv_str(b, "general.architecture", "llama");
    g_tensor(b, "w", 2, ne, 0, 0);
    put_pad(b, 32);
    put_zeros(b, 32);
}

static void test_gguf_malformed(void) {
    bb b = {0};
    uint64_t ne2[2] = {4, 2}, ne1[1] = {32};

    g_valid(&b);
    {
        gguf_file g;
        dfl_error e = {0};
        CHECK(parse_exact(b.p, b.n, &g, &e) == 0, "the valid base file parses: %s", e.msg);
        /* every proper prefix is refused as truncated, never read past */
        int bad = 0;
        for (size_t n = 0; n < b.n; n++) {
            dfl_error e2 = {0};
            int rc = parse_exact(b.p, n, &g, &e2);
            if (rc != DFL_EFORMAT || (!strstr(e2.msg, "truncated") && !strstr(e2.msg, "past") &&
                                      !strstr(e2.msg, "cannot fit")))
                bad++, fprintf(stderr, "prefix %zu: rc %d %s\n", n, rc, e2.msg);
        }
        CHECK(bad == 0, "%d prefixes not refused as truncated", bad);
        free(b.p);
        memset(&b, 0, sizeof b);
    }

    g_valid(&b);
    memcpy(b.p, "GGUX", 4);
    expect_gguf(&b, DFL_EFORMAT, "bad magic", "bad magic");

    g_valid(&b);
    b.p[4] = 1;
    expect_gguf(&b, DFL_EUNSUP, "version 1", "GGUF v1");

    g_head(&b, 3, (uint64_t)1 << 60, 0);
    put_zeros(&b, 64);
    expect_gguf(&b, DFL_EFORMAT, "n_tensors", "absurd n_tensors");

    g_head(&b, 3, 0, (uint64_t)1 << 62);
    put_zeros(&b, 64);
    expect_gguf(&b, DFL_EFORMAT, "n_kv", "absurd n_kv");

    g_head(&b, 3, 0, 1);
    put_u64(&b, 1000); /* key length past EOF */
    put_zeros(&b, 16);
    expect_gguf(&b, DFL_EFORMAT, "kv key", "key length past EOF");

    g_head(&b, 3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, GGUF_T_STRING);
    put_u64(&b, (uint64_t)-2); /* string value length past EOF */
    expect_gguf(&b, DFL_EFORMAT, "string value", "string length past EOF");

    g_head(&b, 3, 0, 1);
    put_str(&b, "tokens");
    put_u32(&b, GGUF_T_ARRAY);
    put_u32(&b, GGUF_T_STRING);
    put_u64(&b, (uint64_t)1 << 40);
    put_zeros(&b, 16);
    expect_gguf(&b, DFL_EFORMAT, "tokens: 1099511627776 strings", "absurd string array");

    g_head(&b, 3, 0, 1);
    put_str(&b, "scores");
    put_u32(&b, GGUF_T_ARRAY);
    put_u32(&b, GGUF_T_F32);
    put_u64(&b, (uint64_t)1 << 62); /* n * 4 would overflow */
    put_zeros(&b, 16);
    expect_gguf(&b, DFL_EFORMAT, "scores", "absurd f32 array");

    g_head(&b, 3, 0, 1);
    put_str(&b, "nest");
    put_u32(&b, GGUF_T_ARRAY);
    put_u32(&b, GGUF_T_ARRAY);
    put_u64(&b, 1);
    put_zeros(&b, 16);
    expect_gguf(&b, DFL_EFORMAT, "nest: nested arrays", "nested array");

    g_head(&b, 3, 0, 1);
    put_str(&b, "odd");
    put_u32(&b, 13);
    put_zeros(&b, 16);
    expect_gguf(&b, DFL_EFORMAT, "odd: unknown value type 13", "unknown value type");

    g_head(&b, 3, 0, 2);
    g_kv_u32(&b, "a.b", 1);
    g_kv_u32(&b, "a.b", 2);
    expect_gguf(&b, DFL_EFORMAT, "a.b appears twice", "duplicate key");

    g_head(&b, 3, 1, 0);
    g_tensor(&b, "blk.0.attn_q.weight", 2, ne2, 0, 64); /* needs 32 bytes at 64 */
    put_pad(&b, 32);
    put_zeros(&b, 64);
    expect_gguf(&b, DFL_EFORMAT, "blk.0.attn_q.weight: bytes [64, +32) run past",
                "tensor past EOF");

    g_head(&b, 3, 1, 0);
    g_tensor(&b, "w", 2, ne2, 0, (uint64_t)-32); /* offset + nbytes would wrap */
    put_pad(&b, 32);
    put_zeros(&b, 32);
    expect_gguf(&b, DFL_EFORMAT, "w: bytes", "wrapping offset");

    g_head(&b, 3, 1, 0);
    g_tensor(&b, "blk.3.ffn_up.weight", 1, ne1, 6 /* Q5_0 */, 0);
    put_pad(&b, 32);
    put_zeros(&b, 64);
    expect_gguf(&b, DFL_EUNSUP, "blk.3.ffn_up.weight: GGUF type id 6", "unsupported type");

    g_head(&b, 3, 2, 0);
    g_tensor(&b, "dup", 1, ne1, 0, 0);
    g_tensor(&b, "dup", 1, ne1, 0, 128);
    put_pad(&b, 32);
    put_zeros(&b, 256);
    expect_gguf(&b, DFL_EFORMAT, "tensor dup appears twice", "duplicate tensor names");

    {
        uint64_t ne5[5] = {1, 1, 1, 1, 1};
        g_head(&b, 3, 1, 0);
        g_tensor(&b, "five", 5, ne5, 0, 0);
        put_zeros(&b, 64);
        expect_gguf(&b, DFL_EFORMAT, "five: n_dims = 5", "5 dims");
    }
    {
        uint64_t ne[2] = {4, 0};
        g_head(&b, 3, 1, 0);
        g_tensor(&b, "zero", 2, ne, 0, 0);
        put_zeros(&b, 64);
        expect_gguf(&b, DFL_EFORMAT, "zero: dimension 1 = 0", "zero dim");
    }
    {
        uint64_t ne[3] = {1 << 30, 1 << 30, 1 << 30};
        g_head(&b, 3, 1, 0);
        g_tensor(&b, "huge", 3, ne, 0, 0);
        put_zeros(&b, 64);
        expect_gguf(&b, DFL_EFORMAT, "huge: dimension 2", "element count overflow");
    }
    {
        uint64_t ne[2] = {33, 1};
        g_head(&b, 3, 1, 0);
        g_tensor(&b, "q", 2, ne, 8 /* Q8_0 */, 0);
        put_pad(&b, 32);
        put_zeros(&b, 64);
        expect_gguf(&b, DFL_EFORMAT, "q: 33 columns is not a multiple of the q8_0 block",
                    "row not a whole block");
    }
    g_head(&b, 3, 1, 1);
    g_kv_u32(&b, "general.alignment", 48);
    g_tensor(&b, "w", 2, ne2, 0, 0);
    put_zeros(&b, 128);
    expect_gguf(&b, DFL_EFORMAT, "general.alignment = 48", "alignment not a power of two");

    g_head(&b, 3, 1, 0);
    g_tensor(&b, "w", 2, ne2, 0, 8);
    put_pad(&b, 32);
    put_zeros(&b, 64);
    expect_gguf(&b, DFL_EFORMAT, "w: offset 8 is not a multiple", "unaligned offset");

    g_head(&b, 3, 1, 0);
    put_u64(&b, 3);
    put(&b, "a\0b", 3);
    put_u32(&b, 1);
    put_u64(&b, 4);
    put_u32(&b, 0);
    put_u64(&b, 0);
    put_pad(&b, 32);
    put_zeros(&b, 32);
    expect_gguf(&b, DFL_EFORMAT, "NUL", "NUL in tensor name");

    /* typed getters: wrong type, out of range, bool not 0/1, absent */
    {
        g_head(&b, 3, 0, 4);
        g_kv_str(&b, "s", "text");
        g_kv_u32(&b, "u", 7);
        put_str(&b, "bad_bool");
        put_u32(&b, GGUF_T_BOOL);
        put(&b, "\2", 1);
        put_str(&b, "neg");
        put_u32(&b, GGUF_T_I32);
        put_u32(&b, (uint32_t)-3);
        gguf_file g;
        dfl_error e = {0};
        int rc = dfl_gguf_parse(b.p, b.n, "t.gguf", &g, &e);
        CHECK(rc == 0, "getter file parses: %s", e.msg);
        uint32_t u = 99;
        float f;
        int bo;
        gguf_str s;
        CHECK(dfl_gguf_u32(&g, "absent", &u, &e) == 1 && u == 99, "absent u32 -> 1, untouched");
        CHECK(dfl_gguf_u32(&g, "s", &u, &e) == DFL_EFORMAT && strstr(e.msg, "s has type 8"),
              "string read as u32: %s", e.msg);
        CHECK(dfl_gguf_u32(&g, "neg", &u, &e) == DFL_EFORMAT && strstr(e.msg, "neg = -3"),
              "negative i32 as u32: %s", e.msg);
        CHECK(dfl_gguf_bool(&g, "bad_bool", &bo, &e) == DFL_EFORMAT && strstr(e.msg, "bad_bool"),
              "bool byte 2 refused: %s", e.msg);
        CHECK(dfl_gguf_f32(&g, "u", &f, &e) == DFL_EFORMAT && strstr(e.msg, "u has type 4"),
              "u32 read as f32: %s", e.msg);
        CHECK(dfl_gguf_str(&g, "s", &s, &e) == 0 && s.len == 4 && !memcmp(s.s, "text", 4),
              "string getter");
        CHECK(dfl_gguf_arr(&g, "s", GGUF_T_STRING, &e) == NULL && strstr(e.msg, "s has type"),
              "string read as array: %s", e.msg);
        CHECK(dfl_gguf_arr(&g, "nope", GGUF_T_STRING, &e) == NULL && strstr(e.msg, "nope"),
              "absent array: %s", e.msg);
        dfl_gguf_free(&g);
        free(b.p);
        memset(&b, 0, sizeof b);
    }
}

/* ---- GGUF: real files ---------------------------------------------------- */

static void test_stories_gguf(void) {
    const char *path = test_asset("stories260K/stories260K.gguf");
    const char *bin = test_asset("stories260K/stories260K.bin");
    if (!path || !bin) return;
    gguf_file g;
    dfl_error e = {0};
    int rc = dfl_gguf_open(path, &g, &e);
    CHECK(rc == 0, "open stories260K.gguf: %s", e.msg);
    if (rc) return;
    CHECK(g.version == 3 && g.tensors.n == 48 && g.alignment == 32, "v%u, %d tensors",
          g.version, g.tensors.n);
    dfl_tensor *emb = dfl_tensors_find(&g.tensors, "token_embd.weight");
    dfl_tensor *wk = dfl_tensors_find(&g.tensors, "blk.0.attn_k.weight");
    dfl_tensor *up = dfl_tensors_find(&g.tensors, "blk.4.ffn_up.weight");
    dfl_tensor *on = dfl_tensors_find(&g.tensors, "output_norm.weight");
    CHECK(emb && emb->type == DFL_F32 && emb->n_dims == 2 && emb->shape[0] == 512 &&
              emb->shape[1] == 64 && emb->nbytes == 512 * 64 * 4,
          "token_embd.weight is f32 [512, 64]");
    CHECK(wk && wk->shape[0] == 32 && wk->shape[1] == 64, "attn_k is [32, 64] (4 kv heads of 8)");
    CHECK(up && up->shape[0] == 172 && up->shape[1] == 64, "ffn_up is [172, 64]");
    CHECK(on && on->n_dims == 1 && on->shape[0] == 64, "output_norm is [64]");
    CHECK(!dfl_tensors_find(&g.tensors, "nope"), "absent tensor -> NULL");
    uint32_t u = 0;
    float eps = 0;
    gguf_str s = {0};
    CHECK(dfl_gguf_u32(&g, "llama.embedding_length", &u, &e) == 0 && u == 64, "embedding_length");
    CHECK(dfl_gguf_u32(&g, "llama.attention.head_count_kv", &u, &e) == 0 && u == 4, "kv heads");
    CHECK(dfl_gguf_f32(&g, "llama.attention.layer_norm_rms_epsilon", &eps, &e) == 0 &&
              eps == 1e-5f, "rms eps");
    CHECK(dfl_gguf_str(&g, "general.architecture", &s, &e) == 0 && s.len == 5 &&
              !memcmp(s.s, "llama", 5), "architecture");
    const gguf_kv *tok = dfl_gguf_arr(&g, "tokenizer.ggml.tokens", GGUF_T_STRING, &e);
    CHECK(tok && tok->arr_n == 512 && tok->strs[1].len == 3 && !memcmp(tok->strs[1].s, "<s>", 3),
          "tokens[1] is <s>");
    const gguf_kv *tt = dfl_gguf_arr(&g, "tokenizer.ggml.token_type", GGUF_T_I32, &e);
    CHECK(tt && dfl_gguf_arr_i64(tt, 0) == 2 && dfl_gguf_arr_i64(tt, 3) == 6,
          "token_type: <unk> is 2 (unknown), byte pieces 6");
    const gguf_kv *sc = dfl_gguf_arr(&g, "tokenizer.ggml.scores", GGUF_T_F32, &e);
    CHECK(sc && sc->arr_n == 512, "scores");

    /* the same weights, from llama2.c's own file: header of 7 int32, then the embedding */
    size_t blen;
    char *b = dfl_read_file(bin, 4 << 20, &blen, &e);
    CHECK(b && emb && memcmp(b + 28, emb->data, emb->nbytes) == 0,
          "token_embd.weight equals the embedding in stories260K.bin");
    free(b);
    dfl_gguf_free(&g);
}

/* Every prefix of a real file is refused (up to the end of the tensor infos,
 * exhaustively; past it, sampled), never read past its end. */
static void test_stories_truncated(void) {
    const char *path = test_asset("stories260K/stories260K.gguf");
    if (!path) return;
    size_t len;
    dfl_error e = {0};
    uint8_t *buf = (uint8_t *)dfl_read_file(path, 4 << 20, &len, &e);
    if (!buf) return;
    gguf_file g;
    int bad = 0;
    for (size_t n = 0; n < len; n += n < 14200 ? 1 : 997) {
        int rc = n < 14200 ? parse_exact(buf, n, &g, &e) : dfl_gguf_parse(buf, n, "t", &g, &e);
        if (rc == 0) dfl_gguf_free(&g);
        if (rc != DFL_EFORMAT) bad++;
    }
    CHECK(bad == 0, "%d prefixes of stories260K.gguf not refused", bad);
    CHECK(dfl_gguf_parse(buf, len, "t", &g, &e) == 0, "the whole file parses");
    dfl_gguf_free(&g);
    free(buf);
}

static void test_vocab_gguf(void) {
    const char *path = test_asset("vectors/llama.cpp/ggml-vocab-llama-spm.gguf");
    if (!path) return;
    gguf_file g;
    dfl_error e = {0};
    int rc = dfl_gguf_open(path, &g, &e);
    CHECK(rc == 0, "open ggml-vocab-llama-spm.gguf: %s", e.msg);
    if (rc) return;
    const gguf_kv *tok = dfl_gguf_arr(&g, "tokenizer.ggml.tokens", GGUF_T_STRING, &e);
    CHECK(g.tensors.n == 0 && tok && tok->arr_n == 32000, "32000 tokens, no tensors");
    CHECK(tok && tok->strs[13].len == 6 && !memcmp(tok->strs[13].s, "<0x0A>", 6),
          "token 13 is <0x0A>");
    int add_bos = 0;
    CHECK(dfl_gguf_bool(&g, "tokenizer.ggml.add_bos_token", &add_bos, &e) == 0 && add_bos == 1,
          "add_bos_token");
    dfl_gguf_free(&g);
}

/* Our writer reproduces llama.cpp's file byte for byte from what we read. */
static void test_gguf_rewrite_stories(const char *tmp) {
    const char *path = test_asset("stories260K/stories260K.gguf");
    if (!path) return;
    gguf_file g;
    dfl_error e = {0};
    if (dfl_gguf_open(path, &g, &e)) return;
    gguf_wkv *w = calloc(g.n_kv, sizeof *w);
    char **owned = calloc(g.n_kv * 2 + 1, sizeof *owned);
    int no = 0;
    for (int i = 0; i < g.n_kv; i++) {
        const gguf_kv *kv = &g.kv[i];
        w[i].key = owned[no++] = strndup(kv->key.s, kv->key.len);
        w[i].type = kv->type;
        w[i].arr_type = kv->arr_type;
        w[i].arr_n = kv->arr_n;
        w[i].val = kv->val;
        if (kv->type == GGUF_T_STRING) {
            gguf_str s;
            dfl_gguf_str(&g, w[i].key, &s, &e);
            w[i].val = owned[no++] = strndup(s.s, s.len);
        } else if (kv->type == GGUF_T_ARRAY && kv->arr_type == GGUF_T_STRING) {
            char **a = calloc(kv->arr_n, sizeof *a);
            for (uint64_t k = 0; k < kv->arr_n; k++) a[k] = strndup(kv->strs[k].s, kv->strs[k].len);
            w[i].val = a;
            owned[no++] = (char *)a;
        }
    }
    char out[512];
    snprintf(out, sizeof out, "%s/rewrite.gguf", tmp);
    int rc = dfl_gguf_write(out, w, (int)g.n_kv, g.tensors.t, g.tensors.n, &e);
    CHECK(rc == 0, "rewrite: %s", e.msg);
    size_t la, lb;
    char *a = dfl_read_file(path, 4 << 20, &la, &e), *b = dfl_read_file(out, 4 << 20, &lb, &e);
    CHECK(a && b && la == lb && memcmp(a, b, la) == 0,
          "rewritten stories260K.gguf is byte-identical to llama.cpp's (%zu vs %zu bytes)", la, lb);
    free(a);
    free(b);
    for (int i = 0; i < g.n_kv; i++)
        if (g.kv[i].type == GGUF_T_ARRAY && g.kv[i].arr_type == GGUF_T_STRING)
            for (uint64_t k = 0; k < g.kv[i].arr_n; k++) free(((char **)w[i].val)[k]);
    for (int i = 0; i < no; i++) free(owned[i]);
    free(owned);
    free(w);
    dfl_gguf_free(&g);
}

/* Writer -> reader: a kv of every type, string arrays, a tensor of every type. */
static void test_gguf_roundtrip(const char *tmp) {
    uint8_t u8 = 200; int8_t i8 = -5; uint16_t u16 = 60000; int16_t i16 = -300;
    uint32_t u32 = 4000000000u; int32_t i32 = -7; float f32 = 1.5f; uint8_t bo = 1;
    uint64_t u64 = (uint64_t)1 << 40; int64_t i64 = -((int64_t)1 << 40); double f64 = 2.25;
    int32_t ai32[3] = {1, -2, 3}; int8_t ai8[2] = {-1, 127}; float af32[2] = {0.5f, -4};
    uint64_t au64[2] = {5, (uint64_t)1 << 50};
    const char *astr[3] = {"a", "", "ccc"};
    gguf_wkv kv[] = {
        {"t.u8", GGUF_T_U8, 0, 0, &u8}, {"t.i8", GGUF_T_I8, 0, 0, &i8},
        {"t.u16", GGUF_T_U16, 0, 0, &u16}, {"t.i16", GGUF_T_I16, 0, 0, &i16},
        {"t.u32", GGUF_T_U32, 0, 0, &u32}, {"t.i32", GGUF_T_I32, 0, 0, &i32},
        {"t.f32", GGUF_T_F32, 0, 0, &f32}, {"t.bool", GGUF_T_BOOL, 0, 0, &bo},
        {"t.str", GGUF_T_STRING, 0, 0, "hello"}, {"t.u64", GGUF_T_U64, 0, 0, &u64},
        {"t.i64", GGUF_T_I64, 0, 0, &i64}, {"t.f64", GGUF_T_F64, 0, 0, &f64},
        {"a.i32", GGUF_T_ARRAY, GGUF_T_I32, 3, ai32}, {"a.i8", GGUF_T_ARRAY, GGUF_T_I8, 2, ai8},
        {"a.f32", GGUF_T_ARRAY, GGUF_T_F32, 2, af32}, {"a.u64", GGUF_T_ARRAY, GGUF_T_U64, 2, au64},
        {"a.str", GGUF_T_ARRAY, GGUF_T_STRING, 3, astr},
    };
    int nkv = sizeof kv / sizeof kv[0];
    /* one tensor per type; shapes outermost first, rows whole blocks */
    int64_t shapes[DFL_NTYPES][2] = {{3, 4}, {2, 8}, {1, 5}, {2, 64}, {1, 32}, {3, 64}, {2, 256},
                                     {1, 512}};
    dfl_tensor t[DFL_NTYPES];
    uint8_t *data[DFL_NTYPES];
    uint32_t seed = 1;
    for (int i = 0; i < DFL_NTYPES; i++) {
        char *name = malloc(32);
        snprintf(name, 32, "tensor.%s", dfl_type_name(i));
        size_t nb = dfl_type_row_bytes(i, shapes[i][1]) * shapes[i][0];
        data[i] = malloc(nb);
        for (size_t k = 0; k < nb; k++) data[i][k] = (uint8_t)((seed = seed * 1664525 + 1013904223) >> 24);
        t[i] = (dfl_tensor){.name = name, .type = i, .n_dims = 2, .shape = {shapes[i][0], shapes[i][1]},
                            .data = data[i], .nbytes = nb};
    }
    t[2].n_dims = 1, t[2].shape[0] = 5, t[2].shape[1] = 0; /* a 1-d tensor too */
    char path[512];
    snprintf(path, sizeof path, "%s/rt.gguf", tmp);
    dfl_error e = {0};
    int rc = dfl_gguf_write(path, kv, nkv, t, DFL_NTYPES, &e);
    CHECK(rc == 0, "write: %s", e.msg);
    gguf_file g;
    rc = dfl_gguf_open(path, &g, &e);
    CHECK(rc == 0, "read back: %s", e.msg);
    if (rc) return;
    CHECK(g.n_kv == nkv && g.tensors.n == DFL_NTYPES, "counts");
    uint32_t u;
    float f;
    int b;
    gguf_str s;
    CHECK(dfl_gguf_u32(&g, "t.u8", &u, &e) == 0 && u == 200, "u8");
    CHECK(dfl_gguf_u32(&g, "t.u16", &u, &e) == 0 && u == 60000, "u16");
    CHECK(dfl_gguf_u32(&g, "t.u32", &u, &e) == 0 && u == 4000000000u, "u32");
    CHECK(dfl_gguf_u32(&g, "t.i8", &u, &e) == DFL_EFORMAT && strstr(e.msg, "t.i8 = -5"),
          "negative i8 refused as u32: %s", e.msg);
    CHECK(dfl_gguf_u32(&g, "t.u64", &u, &e) == DFL_EFORMAT && strstr(e.msg, "t.u64"),
          "2^40 refused as u32");
    CHECK(dfl_gguf_f32(&g, "t.f32", &f, &e) == 0 && f == 1.5f, "f32");
    CHECK(dfl_gguf_f32(&g, "t.f64", &f, &e) == 0 && f == 2.25f, "f64 read as f32");
    CHECK(dfl_gguf_bool(&g, "t.bool", &b, &e) == 0 && b == 1, "bool");
    CHECK(dfl_gguf_str(&g, "t.str", &s, &e) == 0 && s.len == 5 && !memcmp(s.s, "hello", 5), "str");
    const gguf_kv *k;
    k = dfl_gguf_find(&g, "t.i16");
    CHECK(k && k->type == GGUF_T_I16 && dfl_gguf_u32(&g, "t.i16", &u, &e) == DFL_EFORMAT, "i16");
    k = dfl_gguf_find(&g, "t.i64");
    CHECK(k && !memcmp(k->val, &i64, 8), "i64 bytes");
    k = dfl_gguf_arr(&g, "a.i32", GGUF_T_I64, &e); /* any int width via arr_i64 */
    CHECK(k && k->arr_n == 3 && dfl_gguf_arr_i64(k, 0) == 1 && dfl_gguf_arr_i64(k, 1) == -2 &&
              dfl_gguf_arr_i64(k, 2) == 3, "i32 array");
    k = dfl_gguf_arr(&g, "a.i8", GGUF_T_I32, &e);
    CHECK(k && dfl_gguf_arr_i64(k, 0) == -1 && dfl_gguf_arr_i64(k, 1) == 127, "i8 array");
    k = dfl_gguf_arr(&g, "a.u64", GGUF_T_U32, &e);
    CHECK(k && dfl_gguf_arr_i64(k, 1) == (int64_t)1 << 50, "u64 array");
    k = dfl_gguf_arr(&g, "a.f32", GGUF_T_F32, &e);
    CHECK(k && dfl_gguf_arr_f32(k, 0) == 0.5f && dfl_gguf_arr_f32(k, 1) == -4, "f32 array");
    CHECK(dfl_gguf_arr(&g, "a.f32", GGUF_T_I32, &e) == NULL && strstr(e.msg, "a.f32"),
          "float array refused as int");
    k = dfl_gguf_arr(&g, "a.str", GGUF_T_STRING, &e);
    CHECK(k && k->arr_n == 3 && k->strs[0].len == 1 && k->strs[1].len == 0 &&
              k->strs[2].len == 3 && !memcmp(k->strs[2].s, "ccc", 3), "string array");
    for (int i = 0; i < DFL_NTYPES; i++) {
        dfl_tensor *r = dfl_tensors_find(&g.tensors, t[i].name);
        CHECK(r && r->type == t[i].type && r->n_dims == t[i].n_dims && r->nbytes == t[i].nbytes &&
                  r->shape[0] == t[i].shape[0] && r->shape[1] == t[i].shape[1] &&
                  memcmp(r->data, t[i].data, t[i].nbytes) == 0 &&
                  ((const uint8_t *)r->data - (const uint8_t *)g.tensors.maps[0].addr) % 32 == 0,
              "tensor %s round trip", t[i].name);
    }
    dfl_gguf_free(&g);
    for (int i = 0; i < DFL_NTYPES; i++) free(t[i].name), free(data[i]);
}

static void test_types(void) {
    CHECK(dfl_type_row_bytes(DFL_F32, 7) == 28 && dfl_type_row_bytes(DFL_BF16, 3) == 6, "float rows");
    CHECK(dfl_type_row_bytes(DFL_Q8_0, 64) == 68 && dfl_type_row_bytes(DFL_Q4_0, 32) == 18 &&
              dfl_type_row_bytes(DFL_Q4_1, 64) == 40 && dfl_type_row_bytes(DFL_Q4_K, 512) == 288 && dfl_type_row_bytes(DFL_Q6_K, 256) == 210,
          "block rows");
    CHECK(dfl_type_row_bytes(DFL_Q8_0, 33) == 0 && dfl_type_row_bytes(DFL_Q4_K, 128) == 0,
          "partial blocks -> 0");
    for (int t = 0; t < DFL_NTYPES; t++)
        CHECK(dfl_type_from_name(dfl_type_name(t)) == t, "name round trip %d", t);
    CHECK(dfl_type_from_name("q5_0") == -1, "unknown name");
}

/* ---- safetensors ---------------------------------------------------------- */

static void st_build(bb *b, const char *json, size_t data_len) {
    put_u64(b, strlen(json));
    put(b, json, strlen(json));
    put_zeros(b, data_len);
}

static void expect_st_buf(bb *b, int code, const char *sub, const char *what) {
    dfl_tensors ts = {0};
    dfl_error e = {0};
    uint8_t *c = malloc(b->n ? b->n : 1);
    memcpy(c, b->p, b->n);
    int rc = dfl_safetensors_parse(c, b->n, "t.safetensors", &ts, &e);
    CHECK(rc == code && strstr(e.msg, sub) && strstr(e.msg, "t.safetensors"),
          "%s: rc %d msg '%s' (want %d and '%s')", what, rc, e.msg, code, sub);
    CHECK(rc == 0 || ts.n == 0, "%s: failed parse leaves no tensors", what);
    dfl_tensors_free(&ts);
    free(c);
    free(b->p);
    memset(b, 0, sizeof *b);
}

static void expect_st(const char *json, size_t data_len, int code, const char *sub,
                      const char *what) {
    bb b = {0};
    st_build(&b, json, data_len);
    expect_st_buf(&b, code, sub, what);
}

static void test_st_malformed(void) {
    bb b = {0};
    put(&b, "\1\0\0", 3);
    expect_st_buf(&b, DFL_EFORMAT, "truncated", "3-byte file");
    put_u64(&b, 1000);
    put(&b, "{}", 2);
    expect_st_buf(&b, DFL_EFORMAT, "header length 1000 is past the end", "header past EOF");
    put_u64(&b, (uint64_t)1 << 40);
    put(&b, "{}", 2);
    expect_st_buf(&b, DFL_EFORMAT, "header length", "absurd header length");
    expect_st("{\"a\": ", 0, DFL_EFORMAT, "invalid JSON", "invalid JSON");
    expect_st("[1, 2]", 0, DFL_EFORMAT, "not a JSON object", "header not an object");
    {
        char deep[400] = "{\"__metadata__\":";
        for (int i = 0; i < 70; i++) strcat(deep, "[");
        for (int i = 0; i < 70; i++) strcat(deep, "]");
        strcat(deep, "}");
        expect_st(deep, 0, DFL_EFORMAT, "nested deeper than 64", "deep nesting");
    }
    expect_st("{\"x.ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16,
              DFL_EUNSUP, "x.ids: dtype I64 not supported", "I64 dtype");
    expect_st("{\"x\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, DFL_EFORMAT,
              "x: dtype is missing", "numeric dtype");
    expect_st("{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
              DFL_EFORMAT, "x: 6 dimensions", "6-d shape");
    expect_st("{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, DFL_EFORMAT,
              "x: shape[0]", "negative dim");
    expect_st("{\"x\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", 8, DFL_EFORMAT,
              "x: shape[0]", "fractional dim");
    expect_st("{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
              "\"data_offsets\":[0,8]}}", 8, DFL_EFORMAT, "x: shape[1]", "element count overflow");
    expect_st("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, DFL_EFORMAT,
              "x: data_offsets [0, 8] outside the 4-byte data section", "offsets past EOF");
    expect_st("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, DFL_EFORMAT,
              "x: data_offsets", "end before begin");
    expect_st("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,6]}}", 8, DFL_EFORMAT,
              "x: data_offsets span 6 bytes but shape and dtype need 8", "size mismatch");
    expect_st("{\"x\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, DFL_EFORMAT, "x: data_offsets",
              "missing offsets");
    expect_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[6,10]}}", 16, DFL_EFORMAT,
              "tensors a and b overlap", "overlap");
    expect_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, DFL_EFORMAT,
              "tensor a appears twice", "duplicate name");
    expect_st("{\"\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, DFL_EFORMAT,
              "empty name", "empty name");
    /* valid edge cases: a scalar, an empty tensor, metadata skipped */
    {
        dfl_tensors ts = {0};
        dfl_error e = {0};
        st_build(&b, "{\"__metadata__\":{\"format\":\"pt\"},\"s\":{\"dtype\":\"BF16\",\"shape\":[],"
                 "\"data_offsets\":[0,2]},\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],"
                 "\"data_offsets\":[2,2]}}", 2);
        int rc = dfl_safetensors_parse(b.p, b.n, "t", &ts, &e);
        CHECK(rc == 0 && ts.n == 2 && ts.t[0].n_dims == 0 && ts.t[0].nbytes == 2 &&
                  ts.t[1].nbytes == 0, "scalar and empty tensors: %s", e.msg);
        dfl_tensors_free(&ts);
        free(b.p);
        memset(&b, 0, sizeof b);
    }
}

static void write_file(const char *dir, const char *name, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
}

static uint16_t bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)(u >> 16);
}

static void test_st_roundtrip(const char *tmp) {
    float a[2][3] = {{1, -2, 3.5f}, {1e-30f, INFINITY, -0.0f}};
    uint16_t h[4] = {0x3c00, 0x7c00, 0x8001, 0x7e00}; /* 1, inf, -denormal, nan */
    uint16_t bh[2][2][1][2] = {{{{bf16(1.f), bf16(-3.f)}}, {{bf16(0.5f), 0xffc1}}},
                              {{{1, 2}}, {{3, 4}}}};
    float sc = 42;
    dfl_tensor t[4] = {
        {.name = "model.embed_tokens.weight", .type = DFL_F32, .n_dims = 2, .shape = {2, 3},
         .data = a, .nbytes = sizeof a},
        {.name = "h", .type = DFL_F16, .n_dims = 1, .shape = {4}, .data = h, .nbytes = 8},
        {.name = "b4", .type = DFL_BF16, .n_dims = 4, .shape = {2, 2, 1, 2}, .data = bh,
         .nbytes = sizeof bh},
        {.name = "scalar", .type = DFL_F32, .n_dims = 0, .data = &sc, .nbytes = 4},
    };
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    dfl_error e = {0};
    CHECK(dfl_safetensors_write(path, t, 4, &e) == 0, "write: %s", e.msg);
    dfl_tensors ts = {0};
    int rc = dfl_safetensors_open_dir(tmp, &ts, &e);
    CHECK(rc == 0 && ts.n == 4, "open_dir on a single-file folder: %s", e.msg);
    for (int i = 0; i < 4 && !rc; i++) {
        dfl_tensor *r = dfl_tensors_find(&ts, t[i].name);
        int same = r && r->type == t[i].type && r->n_dims == t[i].n_dims &&
                   r->nbytes == t[i].nbytes && memcmp(r->data, t[i].data, t[i].nbytes) == 0;
        for (int d = 0; same && d < t[i].n_dims; d++) same = r->shape[d] == t[i].shape[d];
        CHECK(same, "tensor %s bit-exact round trip", t[i].name);
    }
    dfl_tensors_free(&ts);
    /* quantized types cannot be written to safetensors */
    dfl_tensor q = {.name = "q", .type = DFL_Q8_0, .n_dims = 1, .shape = {32}, .data = a, .nbytes = 34};
    CHECK(dfl_safetensors_write(path, &q, 1, &e) == DFL_EARG && strstr(e.msg, "q"),
          "q8_0 refused by the safetensors writer");
    remove(path);
    rc = dfl_safetensors_open_dir(tmp, &ts, &e);
    CHECK(rc == DFL_EIO && strstr(e.msg, "no model.safetensors"), "empty folder: %s", e.msg);
}

/* A folder with shards s1 (a, b) and s2 (c) and the given index text. */
static const char *shard_dir(const char *index) {
    const char *dir = test_tmpdir();
    float x[4] = {1, 2, 3, 4};
    dfl_tensor t[3] = {
        {.name = "a", .type = DFL_F32, .n_dims = 1, .shape = {2}, .data = x, .nbytes = 8},
        {.name = "b", .type = DFL_F32, .n_dims = 1, .shape = {2}, .data = x + 2, .nbytes = 8},
        {.name = "c", .type = DFL_F32, .n_dims = 2, .shape = {2, 2}, .data = x, .nbytes = 16},
    };
    char p[512];
    dfl_error e;
    snprintf(p, sizeof p, "%s/s1.safetensors", dir);
    dfl_safetensors_write(p, t, 2, &e);
    snprintf(p, sizeof p, "%s/s2.safetensors", dir);
    dfl_safetensors_write(p, t + 2, 1, &e);
    write_file(dir, "model.safetensors.index.json", index);
    return dir;
}

static void expect_dir(const char *index, int code, const char *sub, const char *what) {
    const char *dir = shard_dir(index);
    dfl_tensors ts;
    dfl_error e = {0};
    int rc = dfl_safetensors_open_dir(dir, &ts, &e);
    CHECK(rc == code && (code == 0 || strstr(e.msg, sub)), "%s: rc %d msg '%s' (want %d, '%s')",
          what, rc, e.msg, code, sub);
    if (rc == 0) {
        dfl_tensor *c = dfl_tensors_find(&ts, "c");
        CHECK(ts.n == 3 && ts.n_maps == 2 && c && c->shape[1] == 2 &&
                  ((const float *)c->data)[3] == 4, "sharded folder: 3 tensors from 2 maps");
        dfl_tensors_free(&ts);
    }
    test_rmdir(dir);
}

static void test_st_sharded(void) {
    expect_dir("{\"metadata\":{},\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
               "\"c\":\"s2.safetensors\"}}", 0, "", "valid index");
    expect_dir("{\"weight_map\":{\"a\":\"../s1.safetensors\",\"b\":\"s1.safetensors\","
               "\"c\":\"s2.safetensors\"}}", DFL_EFORMAT, "weight_map[a]: shard must be a plain",
               "shard name with ..");
    expect_dir("{\"weight_map\":{\"a\":\"/etc/passwd\"}}", DFL_EFORMAT, "plain file name",
               "absolute shard path");
    expect_dir("{\"weight_map\":{\"a\":\"..\"}}", DFL_EFORMAT, "plain file name", "shard ..");
    expect_dir("{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
               "\"c\":\"s2.safetensors\",\"d\":\"s2.safetensors\"}}", DFL_EFORMAT,
               "tensor d listed in weight_map is missing from shard s2.safetensors",
               "mapped tensor missing");
    expect_dir("{\"weight_map\":{\"a\":\"s1.safetensors\",\"c\":\"s2.safetensors\"}}",
               DFL_EFORMAT, "tensor b is in shard s1.safetensors but not in weight_map",
               "unmapped tensor");
    expect_dir("{\"weight_map\":{\"a\":\"s2.safetensors\",\"b\":\"s1.safetensors\","
               "\"c\":\"s2.safetensors\"}}", DFL_EFORMAT,
               "tensor a is in shard s1.safetensors but weight_map says s2.safetensors",
               "tensor mapped to another shard");
    expect_dir("{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
               "\"c\":\"s3.safetensors\"}}", DFL_EIO, "s3.safetensors", "missing shard file");
    expect_dir("{\"weight_map\":[1]}", DFL_EFORMAT, "weight_map is missing", "weight_map a list");

    /* the same tensor in two shards */
    const char *dir = test_tmpdir();
    float x[2] = {1, 2};
    dfl_tensor t = {.name = "w", .type = DFL_F32, .n_dims = 1, .shape = {2}, .data = x, .nbytes = 8};
    char p[512];
    dfl_error e = {0};
    snprintf(p, sizeof p, "%s/s1.safetensors", dir);
    dfl_safetensors_write(p, &t, 1, &e);
    snprintf(p, sizeof p, "%s/s2.safetensors", dir);
    dfl_safetensors_write(p, &t, 1, &e);
    write_file(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"w\":\"s1.safetensors\",\"v\":\"s2.safetensors\"}}");
    dfl_tensors ts;
    int rc = dfl_safetensors_open_dir(dir, &ts, &e);
    CHECK(rc == DFL_EFORMAT && strstr(e.msg, "tensor w appears twice"),
          "duplicate across shards: rc %d %s", rc, e.msg);
    test_rmdir(dir);
}

/* ---- JSON ----------------------------------------------------------------- */

static void test_json(void) {
    dfl_error e = {0};
    char buf[512];
    for (int depth = 63; depth <= 65; depth++) {
        int n = 0;
        for (int i = 0; i < depth; i++) buf[n++] = '[';
        for (int i = 0; i < depth; i++) buf[n++] = ']';
        cJSON *j = dfl_json_parse(buf, n, "deep.json", &e);
        CHECK((depth <= 64) == (j != NULL), "depth %d: %s", depth, j ? "ok" : e.msg);
        if (!j) CHECK(strstr(e.msg, "deep.json") && strstr(e.msg, "deeper than 64"), "%s", e.msg);
        cJSON_Delete(j);
    }
    const char *s = "{\"s\": \"[[[[{{{{\\\"[[\", \"n\": [[1]]}";
    cJSON *j = dfl_json_parse(s, strlen(s), "x", &e);
    CHECK(j != NULL, "brackets inside strings do not count: %s", e.msg);
    cJSON_Delete(j);
    CHECK(!dfl_json_parse("{} x", 4, "x", &e) && strstr(e.msg, "after the JSON"), "trailing bytes");
    CHECK(!dfl_json_parse("{\"a\":", 5, "x", &e) && strstr(e.msg, "invalid JSON"), "unfinished");
    j = dfl_json_parse("{}\n", 3, "x", &e);
    CHECK(j != NULL, "trailing newline is fine");
    cJSON_Delete(j);

    s = "{\"i\": 12, \"f\": 1.5, \"big\": 1e300, \"t\": true, \"one\": 1, \"nul\": null, "
        "\"str\": \"v\"}";
    j = dfl_json_parse(s, strlen(s), "c.json", &e);
    int64_t v = -1;
    double d;
    int b = -1;
    CHECK(dfl_json_int(j, "i", 0, 100, &v, "c.json", &e) == 0 && v == 12, "int");
    CHECK(dfl_json_int(j, "i", 0, 10, &v, "c.json", &e) == DFL_EFORMAT &&
              strstr(e.msg, "c.json: i = 12 (expected an integer in 0..10)"), "int range: %s", e.msg);
    CHECK(dfl_json_int(j, "f", 0, 10, &v, "c.json", &e) == DFL_EFORMAT, "1.5 is not an int");
    CHECK(dfl_json_int(j, "big", 0, INT64_MAX, &v, "c.json", &e) == DFL_EFORMAT, "1e300 refused");
    CHECK(dfl_json_int(j, "str", 0, 10, &v, "c.json", &e) == DFL_EFORMAT &&
              strstr(e.msg, "str is not a number"), "string as int");
    v = -1;
    CHECK(dfl_json_int(j, "nul", 0, 10, &v, "c.json", &e) == 1 && v == -1, "null is absent");
    CHECK(dfl_json_int(j, "none", 0, 10, &v, "c.json", &e) == 1, "absent");
    CHECK(dfl_json_num(j, "f", 0, 2, &d, "c.json", &e) == 0 && d == 1.5, "num");
    CHECK(dfl_json_num(j, "f", 2, 3, &d, "c.json", &e) == DFL_EFORMAT && strstr(e.msg, "f = 1.5"),
          "num range");
    CHECK(dfl_json_bool(j, "t", &b, "c.json", &e) == 0 && b == 1, "bool");
    CHECK(dfl_json_bool(j, "one", &b, "c.json", &e) == DFL_EFORMAT && strstr(e.msg, "one"),
          "1 is not a bool");
    CHECK(dfl_json_str(j, "str") && !strcmp(dfl_json_str(j, "str"), "v") && !dfl_json_str(j, "i"),
          "str");
    cJSON_Delete(j);
}

/* serve's default copies the weights only where the copy takes at most half
 * of the memory available: a page fits, an exabyte does not. */
static void test_copy_fits(void) {
    dfl_mapping m = {NULL, 4096};
    dfl_tensors ts = {.maps = &m, .n_maps = 1};
    CHECK(dfl_tensors_copy_fits(&ts), "a 4 KB copy does not fit");
    m.len = (size_t)1 << 60;
    CHECK(!dfl_tensors_copy_fits(&ts), "an exabyte copy fits");
}

int main(void) {
    const char *tmp = test_tmpdir();
    test_types();
    test_gguf_malformed();
    test_stories_gguf();
    test_stories_truncated();
    test_vocab_gguf();
    test_gguf_rewrite_stories(tmp);
    test_gguf_roundtrip(tmp);
    test_st_malformed();
    test_st_roundtrip(tmp);
    test_st_sharded();
    test_json();
    test_copy_fits();
    test_rmdir(tmp);
    return test_summary();
}
