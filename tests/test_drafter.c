/* test_drafter.c - the DFlash drafter: loading (z-lab folders and llama.cpp
 * GGUF), every refusal of an untrusted checkpoint, the forward against an
 * independent double-precision reference written here from the spec
 * (context re-projected every call, no side store), incremental context
 * against one combined append (bit for bit), the window, and several
 * sequences' context rows and blocks in one pass against each alone.
 *
 * The target is stories260K (dim 64, 5 layers, vocab 512); the drafter is a
 * random 2-layer one written by this test. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "draft/draft.h"
#include "decode/decode.h"
#include "testutil.h"

enum { DIM = 64, NL = 2, NH = 4, NKV = 2, HD = 16, FFN = 96, NCAP = 2, BLOCK = 8, MASK = 3 };
static const int CAP[NCAP] = {1, 3};
static const double THETA = 10000.0, EPS = 1e-6;

static dfl_target *T;
static dfl_pool *pool;

/* ---- random weights --------------------------------------------------------- */

typedef struct wt {
    char name[96];
    int n_dims;
    int64_t shape[2];
    float *data;
} wt;

static wt W[64];
static int nW;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double uniform(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return ((rng_state >> 11) + 0.5) / 9007199254740992.0;
}

static double gauss(void) { return sqrt(-2 * log(uniform())) * cos(6.283185307179586 * uniform()); }

static float *add_w(const char *name, int rows, int cols, double mean, double std) {
    wt *w = &W[nW++];
    snprintf(w->name, sizeof w->name, "%s", name);
    w->n_dims = cols ? 2 : 1;
    w->shape[0] = rows;
    w->shape[1] = cols;
    size_t n = (size_t)rows * (cols ? cols : 1);
    w->data = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) w->data[i] = (float)(mean + std * gauss());
    return w->data;
}

static const float *find_w(const char *name) {
    for (int i = 0; i < nW; i++)
        if (!strcmp(W[i].name, name)) return W[i].data;
    return NULL;
}

static const float *lw(const char *fmt, int l) {
    char b[96];
    snprintf(b, sizeof b, fmt, l);
    return find_w(b);
}

static void make_weights(void) {
    char b[96];
    add_w("fc.weight", DIM, NCAP * DIM, 0, 1 / sqrt(NCAP * DIM));
    add_w("hidden_norm.weight", DIM, 0, 1, 0.05);
    add_w("norm.weight", DIM, 0, 1, 0.05);
    for (int l = 0; l < NL; l++) {
#define L(fmt) (snprintf(b, sizeof b, fmt, l), b)
        add_w(L("layers.%d.input_layernorm.weight"), DIM, 0, 1, 0.05);
        add_w(L("layers.%d.post_attention_layernorm.weight"), DIM, 0, 1, 0.05);
        add_w(L("layers.%d.self_attn.q_proj.weight"), NH * HD, DIM, 0, 1 / sqrt(DIM));
        add_w(L("layers.%d.self_attn.k_proj.weight"), NKV * HD, DIM, 0, 1 / sqrt(DIM));
        add_w(L("layers.%d.self_attn.v_proj.weight"), NKV * HD, DIM, 0, 1 / sqrt(DIM));
        add_w(L("layers.%d.self_attn.o_proj.weight"), DIM, NH * HD, 0, 1 / sqrt(NH * HD * 2 * NL));
        add_w(L("layers.%d.self_attn.q_norm.weight"), HD, 0, 1, 0.05);
        add_w(L("layers.%d.self_attn.k_norm.weight"), HD, 0, 1, 0.05);
        add_w(L("layers.%d.mlp.gate_proj.weight"), FFN, DIM, 0, 1 / sqrt(DIM));
        add_w(L("layers.%d.mlp.up_proj.weight"), FFN, DIM, 0, 1 / sqrt(DIM));
        add_w(L("layers.%d.mlp.down_proj.weight"), DIM, FFN, 0, 1 / sqrt(FFN * 2 * NL));
#undef L
    }
}

/* ---- writing checkpoints --------------------------------------------------------- */

/* The tensor table with every name given a prefix ("" or "model."). */
static int table(dfl_tensor *t, char names[][128], const char *prefix) {
    for (int i = 0; i < nW; i++) {
        snprintf(names[i], 128, "%.16s%.96s", prefix, W[i].name);
        size_t n = (size_t)W[i].shape[0] * (W[i].n_dims == 2 ? W[i].shape[1] : 1);
        t[i] = (dfl_tensor){.name = names[i], .type = DFL_F32, .n_dims = W[i].n_dims,
                            .shape = {W[i].shape[0], W[i].shape[1]}, .data = W[i].data,
                            .nbytes = n * sizeof(float)};
    }
    return nW;
}

static cJSON *base_config(void) {
    cJSON *j = cJSON_CreateObject();
    const char *arch[] = {"DFlashDraftModel"};
    cJSON_AddItemToObject(j, "architectures", cJSON_CreateStringArray(arch, 1));
    cJSON_AddStringToObject(j, "model_type", "qwen3");
    cJSON_AddNumberToObject(j, "hidden_size", DIM);
    cJSON_AddNumberToObject(j, "num_hidden_layers", NL);
    cJSON_AddNumberToObject(j, "num_attention_heads", NH);
    cJSON_AddNumberToObject(j, "num_key_value_heads", NKV);
    cJSON_AddNumberToObject(j, "head_dim", HD);
    cJSON_AddNumberToObject(j, "intermediate_size", FFN);
    cJSON_AddNumberToObject(j, "vocab_size", 512);
    cJSON_AddNumberToObject(j, "rms_norm_eps", EPS);
    cJSON_AddNumberToObject(j, "rope_theta", THETA);
    cJSON_AddNullToObject(j, "rope_scaling");
    cJSON_AddNumberToObject(j, "max_position_embeddings", 512);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "block_size", BLOCK);
    cJSON_AddNumberToObject(j, "num_target_layers", 5);
    cJSON *dc = cJSON_AddObjectToObject(j, "dflash_config");
    cJSON_AddNumberToObject(dc, "mask_token_id", MASK);
    cJSON_AddItemToObject(dc, "target_layer_ids", cJSON_CreateIntArray(CAP, NCAP));
    return j;
}

static void write_folder(const char *dir, cJSON *cfg, const dfl_tensor *t, int n) {
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    char *s = cJSON_Print(cfg);
    FILE *f = fopen(p, "w");
    fputs(s, f);
    fclose(f);
    free(s);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    dfl_error err = {0};
    if (dfl_safetensors_write(p, t, n, &err)) fprintf(stderr, "write: %s\n", err.msg);
}

static int load(const char *path, dfl_drafter **d, dfl_error *err) {
    dfl_load_opts lo = {.max_rows = 64, .pool = pool};
    memset(err, 0, sizeof *err);
    return dfl_drafter_load(path, T, &lo, d, err);
}

/* A fresh folder holding the base drafter with one change applied. */
typedef void (*mutate_fn)(cJSON *cfg, dfl_tensor *t, int *n, char names[][128]);

static int load_variant(const char *dir, mutate_fn mut, dfl_drafter **d, dfl_error *err) {
    static dfl_tensor t[80];
    static char names[80][128];
    int n = table(t, names, "");
    cJSON *cfg = base_config();
    if (mut) mut(cfg, t, &n, names);
    write_folder(dir, cfg, t, n);
    cJSON_Delete(cfg);
    return load(dir, d, err);
}

/* ---- the refusals ------------------------------------------------------------------ */

static int find_t(dfl_tensor *t, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return i;
    return -1;
}

static void m_dup_prefixed(cJSON *c, dfl_tensor *t, int *n, char names[][128]) {
    (void)c;
    t[*n] = t[find_t(t, *n, "fc.weight")];
    snprintf(names[*n], 128, "model.fc.weight");
    t[*n].name = names[*n];
    (*n)++;
}
static void m_missing(cJSON *c, dfl_tensor *t, int *n, char names[][128]) {
    (void)c, (void)names;
    int i = find_t(t, *n, "layers.1.mlp.up_proj.weight");
    t[i] = t[--*n];
}
static void m_extra(cJSON *c, dfl_tensor *t, int *n, char names[][128]) {
    (void)c;
    t[*n] = t[find_t(t, *n, "norm.weight")];
    snprintf(names[*n], 128, "embed_tokens.weight");
    t[*n].name = names[*n];
    (*n)++;
}
static void m_fc_width(cJSON *c, dfl_tensor *t, int *n, char names[][128]) {
    (void)c, (void)names;
    int i = find_t(t, *n, "fc.weight");
    t[i].shape[0] = DIM * 2, t[i].shape[1] = DIM;   /* same bytes, wrong shape */
}
static void m_q_rows(cJSON *c, dfl_tensor *t, int *n, char names[][128]) {
    (void)c, (void)names;
    int i = find_t(t, *n, "layers.0.self_attn.q_proj.weight");
    t[i].shape[0] = NH * HD / 2, t[i].shape[1] = DIM * 2;
}
static void m_k_width(cJSON *c, dfl_tensor *t, int *n, char names[][128]) {
    (void)c, (void)names;
    int i = find_t(t, *n, "layers.1.self_attn.k_proj.weight");
    t[i].shape[0] = NKV * HD * 2, t[i].shape[1] = DIM / 2;
}
static void m_qnorm_len(cJSON *c, dfl_tensor *t, int *n, char names[][128]) {
    (void)c, (void)names;
    int i = find_t(t, *n, "layers.0.self_attn.q_norm.weight");
    t[i].shape[0] = HD / 2, t[i].nbytes /= 2;
}
static void set_num(cJSON *c, const char *key, double v) {
    cJSON_ReplaceItemInObject(c, key, cJSON_CreateNumber(v));
}
static void m_block1(cJSON *c, dfl_tensor *t, int *n, char nm[][128]) { (void)t, (void)n, (void)nm; set_num(c, "block_size", 1); }
static void m_block513(cJSON *c, dfl_tensor *t, int *n, char nm[][128]) { (void)t, (void)n, (void)nm; set_num(c, "block_size", 513); }
static void m_no_block(cJSON *c, dfl_tensor *t, int *n, char nm[][128]) { (void)t, (void)n, (void)nm; cJSON_DeleteItemFromObject(c, "block_size"); }
static void m_layer_oob(cJSON *c, dfl_tensor *t, int *n, char nm[][128]) {
    (void)t, (void)n, (void)nm;
    int ids[2] = {1, 5};
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(c, "dflash_config"), "target_layer_ids",
                              cJSON_CreateIntArray(ids, 2));
}
static void m_layer_neg(cJSON *c, dfl_tensor *t, int *n, char nm[][128]) {
    (void)t, (void)n, (void)nm;
    int ids[2] = {-1, 3};
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(c, "dflash_config"), "target_layer_ids",
                              cJSON_CreateIntArray(ids, 2));
}
static void m_hidden(cJSON *c, dfl_tensor *t, int *n, char nm[][128]) { (void)t, (void)n, (void)nm; set_num(c, "hidden_size", 32); }
static void m_vocab(cJSON *c, dfl_tensor *t, int *n, char nm[][128]) { (void)t, (void)n, (void)nm; set_num(c, "vocab_size", 1000); }
static void m_mask(cJSON *c, dfl_tensor *t, int *n, char nm[][128]) {
    (void)t, (void)n, (void)nm;
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(c, "dflash_config"), "mask_token_id",
                              cJSON_CreateNumber(512));
}
static void m_no_mask(cJSON *c, dfl_tensor *t, int *n, char nm[][128]) {
    (void)t, (void)n, (void)nm;
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(c, "dflash_config"), "mask_token_id");
}
static void m_arch(cJSON *c, dfl_tensor *t, int *n, char nm[][128]) {
    (void)t, (void)n, (void)nm;
    const char *a[] = {"Qwen3ForCausalLM"};
    cJSON_ReplaceItemInObject(c, "architectures", cJSON_CreateStringArray(a, 1));
}
static void m_no_dc(cJSON *c, dfl_tensor *t, int *n, char nm[][128]) { (void)t, (void)n, (void)nm; cJSON_DeleteItemFromObject(c, "dflash_config"); }
static void m_ntarget(cJSON *c, dfl_tensor *t, int *n, char nm[][128]) { (void)t, (void)n, (void)nm; set_num(c, "num_target_layers", 36); }
static void m_rope_scaling(cJSON *c, dfl_tensor *t, int *n, char nm[][128]) {
    (void)t, (void)n, (void)nm;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "rope_type", "yarn");
    cJSON_ReplaceItemInObject(c, "rope_scaling", r);
}
static void m_sliding(cJSON *c, dfl_tensor *t, int *n, char nm[][128]) {
    (void)t, (void)n, (void)nm;
    const char *lt[] = {"full_attention", "sliding_attention"};
    cJSON_AddItemToObject(c, "layer_types", cJSON_CreateStringArray(lt, 2));
}
static void m_kv_heads(cJSON *c, dfl_tensor *t, int *n, char nm[][128]) { (void)t, (void)n, (void)nm; set_num(c, "num_key_value_heads", 3); }
static void m_bias(cJSON *c, dfl_tensor *t, int *n, char nm[][128]) { (void)t, (void)n, (void)nm; cJSON_AddTrueToObject(c, "attention_bias"); }

static void test_refusals(const char *dir) {
    struct {
        const char *what;
        mutate_fn mut;
        int code;
        const char *says;   /* the message names the field or tensor */
    } cases[] = {
        {"prefixed and unprefixed copies", m_dup_prefixed, DFL_EFORMAT, "fc.weight"},
        {"missing tensor", m_missing, DFL_EFORMAT, "layers.1.mlp.up_proj.weight"},
        {"extra tensor", m_extra, DFL_EFORMAT, "embed_tokens.weight"},
        {"fc input width", m_fc_width, DFL_EFORMAT, "fc.weight"},
        {"q_proj rows", m_q_rows, DFL_EFORMAT, "layers.0.self_attn.q_proj.weight"},
        {"k_proj input width", m_k_width, DFL_EFORMAT, "layers.1.self_attn.k_proj.weight"},
        {"q_norm length", m_qnorm_len, DFL_EFORMAT, "layers.0.self_attn.q_norm.weight"},
        {"block_size 1", m_block1, DFL_EFORMAT, "block_size"},
        {"block_size 513", m_block513, DFL_EFORMAT, "block_size"},
        {"block_size absent", m_no_block, DFL_EFORMAT, "block_size"},
        {"target layer past the target", m_layer_oob, DFL_EFORMAT, "target_layer_ids"},
        {"negative target layer", m_layer_neg, DFL_EFORMAT, "target_layer_ids"},
        {"hidden size vs target", m_hidden, DFL_EFORMAT, "hidden_size"},
        {"vocab vs target", m_vocab, DFL_EFORMAT, "vocab_size"},
        {"mask id outside vocab", m_mask, DFL_EFORMAT, "mask_token_id"},
        {"mask id absent", m_no_mask, DFL_EFORMAT, "mask_token_id"},
        {"architecture", m_arch, DFL_EUNSUP, "architectures"},
        {"no dflash_config", m_no_dc, DFL_EFORMAT, "dflash_config"},
        {"num_target_layers vs target", m_ntarget, DFL_EFORMAT, "num_target_layers"},
        {"rope_scaling", m_rope_scaling, DFL_EUNSUP, "rope_scaling"},
        {"sliding layers, no window", m_sliding, DFL_EFORMAT, "sliding_window is missing"},
        {"heads vs kv heads", m_kv_heads, DFL_EFORMAT, "KV heads"},
        {"attention bias", m_bias, DFL_EUNSUP, "attention_bias"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dfl_drafter *d = NULL;
        dfl_error err;
        int rc = load_variant(dir, cases[i].mut, &d, &err);
        CHECK(rc == cases[i].code && !d && strstr(err.msg, cases[i].says),
              "%s: rc %d (want %d), message: %s", cases[i].what, rc, cases[i].code, err.msg);
        dfl_drafter_free(d);
    }
    dfl_drafter *d = NULL;
    dfl_error err;
    int rc = load("/nonexistent/drafter", &d, &err);
    CHECK(rc == DFL_EIO && !d, "missing folder: %d %s", rc, err.msg);
}

/* ---- the reference forward (double precision, from the spec) ------------------- */

static void rms(double *y, const double *x, const float *w, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i] * x[i];
    double r = 1 / sqrt(s / n + EPS);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

static void mv(double *y, const float *Wm, const double *x, int rows, int cols) {
    for (int o = 0; o < rows; o++) {
        double s = 0;
        for (int i = 0; i < cols; i++) s += (double)Wm[(size_t)o * cols + i] * x[i];
        y[o] = s;
    }
}

static void rope(double *x, int heads, int pos) {
    for (int h = 0; h < heads; h++) {
        double *v = x + h * HD;
        for (int i = 0; i < HD / 2; i++) {
            double f = (float)(1.0 / pow(THETA, 2.0 * i / HD)), a = pos * f;
            double x1 = v[i], x2 = v[i + HD / 2];
            v[i] = x1 * cos(a) - x2 * sin(a);
            v[i + HD / 2] = x2 * cos(a) + x1 * sin(a);
        }
    }
}

static void kv_of(int l, const double *u, int pos, double *k, double *v) {
    mv(k, lw("layers.%d.self_attn.k_proj.weight", l), u, NKV * HD, DIM);
    for (int h = 0; h < NKV; h++) rms(k + h * HD, k + h * HD, lw("layers.%d.self_attn.k_norm.weight", l), HD);
    rope(k, NKV, pos);
    mv(v, lw("layers.%d.self_attn.v_proj.weight", l), u, NKV * HD, DIM);
}

/* Drafter logits (B-1, vocab) for context features F (nctx rows) and anchor
 * at position nctx; only the last `window` context rows are attended when
 * window > 0, and none of rows h0..h1-1 (a hole). Everything is recomputed
 * from scratch. */
static void ref_draft(const float *F, int nctx, int32_t anchor, int B, int window, int h0, int h1,
                      double *out) {
    int vocab = T->c.vocab, kvd = NKV * HD, lo = window && nctx > window ? nctx - window : 0;
    int nk = B;
    for (int r = lo; r < nctx; r++) nk += r < h0 || r >= h1;
    double *c = calloc((size_t)nctx * DIM, sizeof(double)), *f = malloc(NCAP * DIM * sizeof(double));
    double *K = malloc((size_t)nk * kvd * sizeof(double)), *V = malloc((size_t)nk * kvd * sizeof(double));
    double *x = malloc((size_t)B * DIM * sizeof(double)), *u = malloc((size_t)B * DIM * sizeof(double));
    double *q = malloc((size_t)B * NH * HD * sizeof(double)), *att = malloc(NH * HD * sizeof(double));
    double *tmp = malloc((FFN + DIM) * sizeof(double)), *g = malloc(FFN * sizeof(double)),
           *up = malloc(FFN * sizeof(double)), *sc = malloc(nk * sizeof(double));
    float *row = malloc(DIM * sizeof(float));
    for (int r = lo; r < nctx; r++) {
        for (int i = 0; i < NCAP * DIM; i++) f[i] = F[(size_t)r * NCAP * DIM + i];
        mv(c + (size_t)r * DIM, find_w("fc.weight"), f, DIM, NCAP * DIM);
        rms(c + (size_t)r * DIM, c + (size_t)r * DIM, find_w("hidden_norm.weight"), DIM);
    }
    for (int i = 0; i < B; i++) {
        dfl_dequant_row(T->embed.type, T->embed.data + (size_t)(i ? MASK : anchor) * T->embed.row_bytes, row, DIM);
        for (int j = 0; j < DIM; j++) x[i * DIM + j] = row[j];
    }
    for (int l = 0; l < NL; l++) {
        int nc = 0;
        for (int r = lo; r < nctx; r++, nc++) {   /* context: no input_layernorm */
            if (r >= h0 && r < h1) {
                nc--;
                continue;
            }
            kv_of(l, c + (size_t)r * DIM, r, K + (size_t)nc * kvd, V + (size_t)nc * kvd);
        }
        for (int i = 0; i < B; i++) {
            rms(u + i * DIM, x + i * DIM, lw("layers.%d.input_layernorm.weight", l), DIM);
            double *qi = q + (size_t)i * NH * HD;
            mv(qi, lw("layers.%d.self_attn.q_proj.weight", l), u + i * DIM, NH * HD, DIM);
            for (int h = 0; h < NH; h++) rms(qi + h * HD, qi + h * HD, lw("layers.%d.self_attn.q_norm.weight", l), HD);
            rope(qi, NH, nctx + i);
            int kr = nc + i;
            kv_of(l, u + i * DIM, nctx + i, K + (size_t)kr * kvd, V + (size_t)kr * kvd);
        }
        for (int i = 0; i < B; i++) {   /* no mask: every row sees all keys */
            for (int h = 0; h < NH; h++) {
                int kh = h / (NH / NKV);
                double m = -1e300, s = 0;
                for (int k = 0; k < nk; k++) {
                    double d = 0;
                    for (int e = 0; e < HD; e++)
                        d += q[(size_t)i * NH * HD + h * HD + e] * K[(size_t)k * kvd + kh * HD + e];
                    sc[k] = d / sqrt((double)HD);
                    if (sc[k] > m) m = sc[k];
                }
                for (int k = 0; k < nk; k++) s += (sc[k] = exp(sc[k] - m));
                for (int e = 0; e < HD; e++) {
                    double a = 0;
                    for (int k = 0; k < nk; k++) a += sc[k] * V[(size_t)k * kvd + kh * HD + e];
                    att[h * HD + e] = a / s;
                }
            }
            mv(tmp, lw("layers.%d.self_attn.o_proj.weight", l), att, DIM, NH * HD);
            for (int j = 0; j < DIM; j++) x[i * DIM + j] += tmp[j];
        }
        for (int i = 0; i < B; i++) {
            rms(u, x + i * DIM, lw("layers.%d.post_attention_layernorm.weight", l), DIM);
            mv(g, lw("layers.%d.mlp.gate_proj.weight", l), u, FFN, DIM);
            mv(up, lw("layers.%d.mlp.up_proj.weight", l), u, FFN, DIM);
            for (int j = 0; j < FFN; j++) g[j] = g[j] / (1 + exp(-g[j])) * up[j];
            mv(tmp, lw("layers.%d.mlp.down_proj.weight", l), g, DIM, FFN);
            for (int j = 0; j < DIM; j++) x[i * DIM + j] += tmp[j];
        }
    }
    for (int i = 1; i < B; i++) {
        rms(u, x + i * DIM, find_w("norm.weight"), DIM);
        for (int v = 0; v < vocab; v++) {
            dfl_dequant_row(T->lm_head.type, T->lm_head.data + (size_t)v * T->lm_head.row_bytes, row, DIM);
            double s = 0;
            for (int j = 0; j < DIM; j++) s += row[j] * u[j];
            out[(size_t)(i - 1) * vocab + v] = s;
        }
    }
    free(c), free(f), free(K), free(V), free(x), free(u), free(q), free(att), free(tmp), free(g);
    free(up), free(sc), free(row);
}

/* ---- forward tests ------------------------------------------------------------------ */

static float *features(const int32_t *ids, int n) {
    dfl_kv *kv = dfl_kv_new(T, n);
    float *F = dfl_aligned_alloc((size_t)n * NCAP * DIM * sizeof(float));
    dfl_error err = {0};
    int rc = dfl_target_forward(T, kv, ids, n, n, NULL, CAP, NCAP, F, &err);
    CHECK(rc == 0, "features: %s", err.msg);
    dfl_kv_free(kv);
    return F;
}

/* The drafts of store s (context rows 0..nctx-1, rows h0..h1-1 a hole)
 * against the reference, at several block sizes. */
static void check_drafts(dfl_drafter *d, dfl_dstore *s, const float *F, int nctx, int32_t anchor,
                         int window, int h0, int h1) {
    int vocab = T->c.vocab, rc;
    dfl_error err = {0};
    for (int B = 2; B <= BLOCK * 2; B += B < 4 ? 1 : 5) {
        float *lg = malloc((size_t)(B - 1) * vocab * sizeof(float));
        double *want = malloc((size_t)(B - 1) * vocab * sizeof(double));
        int32_t draft[64];
        rc = dfl_drafter_draft(d, s, anchor, B, lg, draft, &err);
        CHECK(rc == 0 && s->len == nctx, "draft B=%d: %s", B, err.msg);
        ref_draft(F, nctx, anchor, B, window, h0, h1, want);
        double maxd = 0, maxv = 0;
        int arg_ok = 1;
        for (int i = 0; i < B - 1; i++) {
            int best = 0;
            for (int v = 0; v < vocab; v++) {
                double a = lg[(size_t)i * vocab + v], b = want[(size_t)i * vocab + v];
                if (fabs(a - b) > maxd) maxd = fabs(a - b);
                if (fabs(b) > maxv) maxv = fabs(b);
                if (b > want[(size_t)i * vocab + best]) best = v;
            }
            arg_ok &= draft[i] == best ||
                      fabs(want[(size_t)i * vocab + best] - want[(size_t)i * vocab + draft[i]]) < 1e-4;
        }
        if (getenv("VERBOSE"))
            fprintf(stderr, "B=%d window=%d hole %d..%d nctx=%d: max diff %g, max logit %g\n", B,
                    window, h0, h1, nctx, maxd, maxv);
        /* an f16 store rounds K/V to 11 bits: the logits move by about that */
        double tol = s->type == DFL_F16 ? 5e-4 : 2e-5;
        CHECK(maxd <= tol * (maxv > 1 ? maxv : 1), "B=%d window=%d hole %d..%d %s store: max "
              "|diff| %g (logits up to %g)", B, window, h0, h1, dfl_type_name(s->type), maxd,
              maxv);
        CHECK(arg_ok, "B=%d window=%d hole %d..%d: drafts are not the reference's argmax", B,
              window, h0, h1);
        free(lg), free(want);
    }
}

static void test_forward(dfl_drafter *d, const float *F, int nctx, int32_t anchor, int window) {
    dfl_dstore *s = dfl_dstore_new(d, 256);
    dfl_error err = {0};
    int rc = dfl_drafter_add_context(d, s, F, nctx, &err);
    CHECK(rc == 0 && s->len == nctx, "add_context: %s", err.msg);
    check_drafts(d, s, F, nctx, anchor, window, 0, 0);
    dfl_dstore_free(s);
}

/* A store with a hole (rows skipped while a crowd held its sequence to
 * classic steps) drafts as the reference does without those rows; a cut
 * inside or before the hole, and a copy of its prefix, keep the mapping of
 * positions to rows: the rows re-added after a cut before the hole draft as
 * if it never was. */
static void test_hole(dfl_drafter *d, const float *F, int nctx, int32_t anchor, int window,
                      int h0, int h1) {
    size_t fr = (size_t)NCAP * DIM;
    dfl_dstore *s = dfl_dstore_new(d, 256), *c = dfl_dstore_new(d, 256);
    dfl_error err = {0};
    int rc = dfl_drafter_add_context(d, s, F, h0, &err);
    if (!rc) rc = dfl_dstore_skip(s, h1 - h0, &err);
    if (!rc) rc = dfl_drafter_add_context(d, s, F + h1 * fr, nctx - h1, &err);
    CHECK(rc == 0 && s->len == nctx, "a store with a hole: %s (len %d)", err.msg, s->len);
    check_drafts(d, s, F, nctx, anchor, window, h0, h1);
    CHECK(dfl_dstore_skip(s, 1000, &err) == DFL_ECTX, "a skip past the store's end: rc 0");
    if (window) {   /* (a windowed store's prefix is never copied: the window skipped rows) */
        dfl_dstore_free(s), dfl_dstore_free(c);
        return;
    }
    CHECK(dfl_dstore_copy_prefix(c, s, nctx) == nctx && c->rows == s->rows,
          "the copy of a holed store holds %d positions, %d rows (of %d)", c->len, c->rows,
          s->rows);
    check_drafts(d, c, F, nctx, anchor, window, h0, h1);
    int mid = (h0 + h1) / 2;   /* a cut inside the hole keeps the rows before it */
    dfl_dstore_truncate(s, mid);
    CHECK(s->len == mid && s->rows == h0, "cut in the hole: %d positions, %d rows", s->len, s->rows);
    rc = dfl_dstore_skip(s, h1 - mid, &err);
    if (!rc) rc = dfl_drafter_add_context(d, s, F + h1 * fr, nctx - h1, &err);
    CHECK(rc == 0 && s->len == nctx, "re-added after a cut in the hole: %s", err.msg);
    check_drafts(d, s, F, nctx, anchor, window, h0, h1);
    dfl_dstore_truncate(s, h0 - 2);   /* before the hole: it is gone */
    rc = dfl_drafter_add_context(d, s, F + (h0 - 2) * fr, nctx - (h0 - 2), &err);
    CHECK(rc == 0 && s->len == nctx && s->rows == nctx, "re-added after a cut before the hole: %s",
          err.msg);
    check_drafts(d, s, F, nctx, anchor, window, 0, 0);
    dfl_dstore_free(s), dfl_dstore_free(c);
}

/* Rows appended over many calls (with drafts in between, which write the
 * store's slack rows) draft exactly like one combined append. */
static void test_incremental(dfl_drafter *d, const float *F, int nctx) {
    int vocab = T->c.vocab, B = BLOCK;
    dfl_dstore *a = dfl_dstore_new(d, 256), *b = dfl_dstore_new(d, 256);
    dfl_error err = {0};
    float *la = malloc((size_t)(B - 1) * vocab * sizeof(float)), *lb = malloc((size_t)(B - 1) * vocab * sizeof(float));
    int32_t da[64], db[64];
    dfl_drafter_add_context(d, a, F, nctx, &err);
    int steps[] = {1, 3, 7, 2, 1, 11, 5};
    for (int off = 0, k = 0; off < nctx; k++) {
        int m = steps[k % 7] < nctx - off ? steps[k % 7] : nctx - off;
        dfl_drafter_add_context(d, b, F + (size_t)off * NCAP * DIM, m, &err);
        off += m;
        dfl_drafter_draft(d, b, 17, B, lb, db, &err);   /* scribbles on the slack rows */
    }
    dfl_drafter_draft(d, a, 42, B, la, da, &err);
    dfl_drafter_draft(d, b, 42, B, lb, db, &err);
    CHECK(!memcmp(la, lb, (size_t)(B - 1) * vocab * sizeof(float)) && !memcmp(da, db, (B - 1) * 4),
          "incremental context (window %d) drafts differently from one append", d->window);
    /* a rollback (truncate) then re-append is the same again */
    dfl_dstore_truncate(b, nctx - 9);
    if (b->len == nctx - 9) {
        dfl_drafter_add_context(d, b, F + (size_t)(nctx - 9) * NCAP * DIM, 9, &err);
        dfl_drafter_draft(d, b, 42, B, lb, db, &err);
        CHECK(!memcmp(la, lb, (size_t)(B - 1) * vocab * sizeof(float)),
              "truncate + re-append drafts differently");
    }
    /* Fewer outputs from the same block: the first rows' logits are the full
     * draft's (lm_head rows are batch invariant), and the block's width is
     * what shapes them, so a cut block drafts differently. */
    for (int n_out = 1; n_out < B - 1; n_out += 3) {
        dfl_drafter_draft_n(d, b, 42, B, n_out, lb, db, &err);
        CHECK(!memcmp(la, lb, (size_t)n_out * vocab * sizeof(float)) &&
              !memcmp(da, db, (size_t)n_out * 4), "draft_n %d of %d differs from the full draft",
              n_out, B - 1);
    }
    dfl_drafter_draft(d, b, 42, 3, lb, db, &err);
    CHECK(memcmp(la, lb, (size_t)2 * vocab * sizeof(float)) != 0,
          "a block of 3 drafts like a block of %d (mask rows should matter)", B);
    CHECK(dfl_drafter_draft_n(d, b, 42, B, 0, lb, db, &err) == DFL_EARG &&
          dfl_drafter_draft_n(d, b, 42, B, B, lb, db, &err) == DFL_EARG,
          "draft_n outputs outside 1..B-1 are refused");
    free(la), free(lb);
    dfl_dstore_free(a), dfl_dstore_free(b);
}

/* ---- several sequences in one pass ------------------------------------------ */

enum { NPASS = 4 };

/* Stores i = 0..NPASS-1 hold the first len[i] context rows of F. */
static void fill(dfl_drafter *d, dfl_dstore **s, const float *F, const int *len) {
    dfl_error err = {0};
    for (int i = 0; i < NPASS; i++) {
        dfl_dstore_truncate(s[i], 0);
        dfl_drafter_add_context(d, s[i], F, len[i], &err);
    }
}

/* A pass carrying several sequences' context rows and blocks (what concurrent
 * sessions get from the combiner) gives each the logits, drafts and store it
 * gets alone, bit for bit: one pass of context works, one of blocks, one of
 * both kinds. */
static void test_pass(dfl_drafter *d, const float *F) {
    static const int len0[NPASS] = {50, 21, 8, 33}, more[NPASS] = {9, 16, 5, 20};
    static const int Bs[NPASS] = {8, 12, 5, 8}, outs[NPASS] = {7, 3, 4, 1};
    int vocab = T->c.vocab, len1[NPASS];
    dfl_dstore *a[NPASS], *b[NPASS];
    float *la[NPASS], *lb[NPASS];
    int32_t da[NPASS][64], db[NPASS][64];
    dfl_error err = {0};
    for (int i = 0; i < NPASS; i++) {
        a[i] = dfl_dstore_new(d, 256), b[i] = dfl_dstore_new(d, 256);
        la[i] = malloc((size_t)64 * vocab * sizeof(float));
        lb[i] = malloc((size_t)64 * vocab * sizeof(float));
        len1[i] = len0[i] + more[i];
    }
    /* alone */
    fill(d, a, F, len1);
    for (int i = 0; i < NPASS; i++)
        dfl_drafter_draft_n(d, a[i], 40 + i, Bs[i], outs[i], la[i], da[i], &err);
    /* context rows of all four in one pass, then their blocks in one */
    fill(d, b, F, len0);
    dfl_dwork w[NPASS];
    for (int i = 0; i < NPASS; i++)
        w[i] = (dfl_dwork){.s = b[i], .feat = F + (size_t)len0[i] * NCAP * DIM, .n = more[i]};
    int rc = dfl_drafter_pass(d, w, NPASS, &err);
    CHECK(rc == 0, "a pass of context works: %s", err.msg);
    for (int i = 0; i < NPASS; i++)
        w[i] = (dfl_dwork){.s = b[i], .anchor = 40 + i, .B = Bs[i], .n_out = outs[i],
                           .logits = lb[i], .draft = db[i]};
    rc = dfl_drafter_pass(d, w, NPASS, &err);
    CHECK(rc == 0, "a pass of blocks: %s", err.msg);
    for (int i = 0; i < NPASS; i++)
        CHECK(b[i]->len == len1[i] && !memcmp(da[i], db[i], sizeof(int32_t) * outs[i]) &&
                  !memcmp(la[i], lb[i], (size_t)outs[i] * vocab * sizeof(float)),
              "window %d, sequence %d: its block drafted with three others differs from alone",
              d->window, i);
    /* both kinds at once: sequence 0 appends while the others draft; its next
     * block then drafts as it does alone */
    fill(d, b, F, len1);
    dfl_dstore_truncate(b[0], 0);   /* (a windowed store cut back would empty itself) */
    dfl_drafter_add_context(d, b[0], F, len0[0], &err);
    w[0] = (dfl_dwork){.s = b[0], .feat = F + (size_t)len0[0] * NCAP * DIM, .n = more[0]};
    rc = dfl_drafter_pass(d, w, NPASS, &err);
    CHECK(rc == 0, "a mixed pass: %s", err.msg);
    dfl_drafter_draft_n(d, b[0], 40, Bs[0], outs[0], lb[0], db[0], &err);
    for (int i = 0; i < NPASS; i++)
        CHECK(!memcmp(da[i], db[i], sizeof(int32_t) * outs[i]) &&
                  !memcmp(la[i], lb[i], (size_t)outs[i] * vocab * sizeof(float)),
              "window %d, sequence %d: a mixed pass drafts differently from alone", d->window, i);
    /* refusals: a shared store, too many rows */
    w[1].s = b[0];
    CHECK(dfl_drafter_pass(d, w, 2, &err) == DFL_EARG, "a pass with one store twice is refused");
    for (int i = 0; i < NPASS; i++)
        w[i] = (dfl_dwork){.s = b[i], .anchor = 1, .B = 20, .n_out = 1, .draft = db[i]};
    CHECK(dfl_drafter_pass(d, w, NPASS, &err) == DFL_EARG, "a pass of 80 block rows is refused");
    for (int i = 0; i < NPASS; i++) {
        dfl_dstore_free(a[i]), dfl_dstore_free(b[i]);
        free(la[i]), free(lb[i]);
    }
}

static void test_default_layers(void) {
    int ids[8];
    int n = dfl_dflash_default_layers(36, 5, ids);
    CHECK(n == 5 && ids[0] == 1 && ids[1] == 9 && ids[2] == 17 && ids[3] == 25 && ids[4] == 33,
          "36 layers, 5 drafter layers: [%d %d %d %d %d]", ids[0], ids[1], ids[2], ids[3], ids[4]);
    n = dfl_dflash_default_layers(36, 1, ids);
    CHECK(n == 1 && ids[0] == 18, "one drafter layer: %d", ids[0]);
    n = dfl_dflash_default_layers(7, 3, ids);   /* 1 + 1.5: Python rounds half to even */
    CHECK(n == 3 && ids[0] == 1 && ids[1] == 2 && ids[2] == 4, "7/3: [%d %d %d]", ids[0], ids[1],
          ids[2]);
    n = dfl_dflash_default_layers(28, 4, ids);   /* 1 + 8i: [1, 9, 17, 25] */
    CHECK(n == 4 && ids[1] == 9 && ids[3] == 25, "28/4: [%d .. %d]", ids[1], ids[3]);
}

/* Without target_layer_ids the z-lab rule picks them: 5 target layers, 2
 * drafter layers -> [1, 2]. */
static void m_no_ids(cJSON *c, dfl_tensor *t, int *n, char nm[][128]) {
    (void)t, (void)n, (void)nm;
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(c, "dflash_config"), "target_layer_ids");
}

/* ---- GGUF ------------------------------------------------------------------------ */

static const char *gguf_name(const char *hf, char *out) {
    static const char *map[][2] = {
        {"hidden_norm.weight", "enc.output_norm.weight"}, {"norm.weight", "output_norm.weight"},
        {"input_layernorm", "attn_norm"}, {"post_attention_layernorm", "ffn_norm"},
        {"self_attn.q_proj", "attn_q"}, {"self_attn.k_proj", "attn_k"},
        {"self_attn.v_proj", "attn_v"}, {"self_attn.o_proj", "attn_output"},
        {"self_attn.q_norm", "attn_q_norm"}, {"self_attn.k_norm", "attn_k_norm"},
        {"mlp.gate_proj", "ffn_gate"}, {"mlp.up_proj", "ffn_up"}, {"mlp.down_proj", "ffn_down"},
    };
    int l;
    char rest[96];
    if (sscanf(hf, "layers.%d.%95s", &l, rest) == 2) {
        for (size_t i = 2; i < sizeof map / sizeof map[0]; i++)
            if (!strncmp(rest, map[i][0], strlen(map[i][0]))) {
                sprintf(out, "blk.%d.%s.weight", l, map[i][1]);
                return out;
            }
    }
    for (int i = 0; i < 2; i++)
        if (!strcmp(hf, map[i][0])) return strcpy(out, map[i][1]);
    return strcpy(out, hf);
}

typedef struct gg_opts {
    const char *arch;
    int32_t layers[NCAP];
    int mask_a, mask_b;      /* dflash.mask_token_id, tokenizer.ggml.mask_token_id (-1: absent) */
    int sliding, dflash2, drop_ffn_up, extra_embd;
    int rope_dims, vocab;    /* dflash.rope.dimension_count, dflash.vocab_size (0: absent) */
} gg_opts;

static int write_gguf(const char *path, const gg_opts *o) {
    static dfl_tensor t[80];
    static char names[80][128];
    int n = table(t, names, "");
    char tmp[128];
    for (int i = 0; i < n; i++) strcpy(names[i], gguf_name(W[i].name, tmp));
    if (o->drop_ffn_up) {
        int i = find_t(t, n, "blk.1.ffn_up.weight");
        t[i] = t[n - 1];
        n--;
    }
    if (o->extra_embd) {
        t[n] = t[find_t(t, n, "output_norm.weight")];
        strcpy(names[n], "token_embd.weight");
        t[n].name = names[n], n++;
    }
    uint32_t u[16] = {DIM, NL, NH, NKV, HD, HD, FFN, BLOCK, 512, DIM};
    float theta = THETA, eps = EPS;
    uint32_t ma = o->mask_a, mb = o->mask_b, one = 1;
    uint8_t pat[NL] = {0, (uint8_t)o->sliding};
    gguf_wkv kv[32] = {
        {"general.architecture", GGUF_T_STRING, 0, 0, o->arch},
        {"dflash.embedding_length", GGUF_T_U32, 0, 0, &u[0]},
        {"dflash.block_count", GGUF_T_U32, 0, 0, &u[1]},
        {"dflash.attention.head_count", GGUF_T_U32, 0, 0, &u[2]},
        {"dflash.attention.head_count_kv", GGUF_T_U32, 0, 0, &u[3]},
        {"dflash.attention.key_length", GGUF_T_U32, 0, 0, &u[4]},
        {"dflash.attention.value_length", GGUF_T_U32, 0, 0, &u[5]},
        {"dflash.feed_forward_length", GGUF_T_U32, 0, 0, &u[6]},
        {"dflash.block_size", GGUF_T_U32, 0, 0, &u[7]},
        {"dflash.context_length", GGUF_T_U32, 0, 0, &u[8]},
        {"dflash.target_hidden_size", GGUF_T_U32, 0, 0, &u[9]},
        {"dflash.rope.freq_base", GGUF_T_F32, 0, 0, &theta},
        {"dflash.attention.layer_norm_rms_epsilon", GGUF_T_F32, 0, 0, &eps},
        {"dflash.target_layers", GGUF_T_ARRAY, GGUF_T_I32, NCAP, o->layers},
        {"dflash.attention.sliding_window_pattern", GGUF_T_ARRAY, GGUF_T_BOOL, NL, pat},
    };
    int nk = 15;
    if (o->mask_a >= 0) kv[nk++] = (gguf_wkv){"dflash.mask_token_id", GGUF_T_U32, 0, 0, &ma};
    if (o->mask_b >= 0)
        kv[nk++] = (gguf_wkv){"tokenizer.ggml.mask_token_id", GGUF_T_U32, 0, 0, &mb};
    if (o->dflash2) kv[nk++] = (gguf_wkv){"dflash.selector_rank", GGUF_T_U32, 0, 0, &one};
    uint32_t rd = o->rope_dims, vs = o->vocab;
    if (rd) kv[nk++] = (gguf_wkv){"dflash.rope.dimension_count", GGUF_T_U32, 0, 0, &rd};
    if (vs) kv[nk++] = (gguf_wkv){"dflash.vocab_size", GGUF_T_U32, 0, 0, &vs};
    dfl_error err = {0};
    int rc = dfl_gguf_write(path, kv, nk, t, n, &err);
    if (rc) fprintf(stderr, "gguf write: %s\n", err.msg);
    return rc;
}

static void test_gguf(const char *dir, dfl_drafter *hf, const float *F, int nctx) {
    char path[512];
    snprintf(path, sizeof path, "%s/drafter.gguf", dir);
    gg_opts base = {"dflash", {CAP[0] + 1, CAP[1] + 1}, MASK, -1, 0, 0, 0, 0, HD, 512};
    write_gguf(path, &base);
    dfl_drafter *d = NULL;
    dfl_error err;
    int rc = load(path, &d, &err);
    CHECK(rc == 0, "gguf drafter: %s", err.msg);
    if (rc) return;
    CHECK(d->n_cap == NCAP && d->cap[0] == CAP[0] && d->cap[1] == CAP[1] && d->block_size == BLOCK &&
          d->mask_id == MASK, "gguf config: cap [%d %d] (GGUF ids are HF ids + 1), block %d, mask %d",
          d->cap[0], d->cap[1], d->block_size, d->mask_id);
    /* the same weights draft the same logits as the folder form, bit for bit */
    int vocab = T->c.vocab, B = BLOCK;
    float *la = malloc((size_t)(B - 1) * vocab * 4), *lb = malloc((size_t)(B - 1) * vocab * 4);
    int32_t da[64], db[64];
    dfl_dstore *sa = dfl_dstore_new(hf, 256), *sb = dfl_dstore_new(d, 256);
    dfl_drafter_add_context(hf, sa, F, nctx, &err);
    dfl_drafter_add_context(d, sb, F, nctx, &err);
    dfl_drafter_draft(hf, sa, 99, B, la, da, &err);
    dfl_drafter_draft(d, sb, 99, B, lb, db, &err);
    CHECK(!memcmp(la, lb, (size_t)(B - 1) * vocab * 4), "GGUF and folder drafters differ");
    free(la), free(lb);
    dfl_dstore_free(sa), dfl_dstore_free(sb);
    dfl_drafter_free(d);

    struct {
        const char *what;
        gg_opts o;
        int code;
        const char *says;
    } cases[] = {
        {"architecture", {"llama", {2, 4}, MASK, -1, 0, 0, 0, 0}, DFL_EUNSUP, "general.architecture"},
        {"layer id 0 (no HF id)", {"dflash", {0, 4}, MASK, -1, 0, 0, 0, 0}, DFL_EFORMAT, "dflash.target_layers"},
        {"layer past the target", {"dflash", {2, 6}, MASK, -1, 0, 0, 0, 0}, DFL_EFORMAT, "target_layer"},
        {"mask ids disagree", {"dflash", {2, 4}, MASK, MASK + 1, 0, 0, 0, 0}, DFL_EFORMAT, "mask_token_id"},
        {"no mask id", {"dflash", {2, 4}, -1, -1, 0, 0, 0, 0}, DFL_EFORMAT, "mask_token_id"},
        {"sliding layers", {"dflash", {2, 4}, MASK, -1, 1, 0, 0, 0}, DFL_EUNSUP, "sliding_window_pattern"},
        /* one DFlash2 key makes a DFlash2 drafter, which needs all four */
        {"DFlash2 keys incomplete", {"dflash", {2, 4}, MASK, -1, 0, 1, 0, 0}, DFL_EFORMAT,
         "dflash.conv_kernel_size is missing"},
        {"missing tensor", {"dflash", {2, 4}, MASK, -1, 0, 0, 1, 0}, DFL_EFORMAT, "blk.1.ffn_up.weight"},
        {"extra tensor", {"dflash", {2, 4}, MASK, -1, 0, 0, 0, 1}, DFL_EFORMAT, "token_embd.weight"},
        {"partial RoPE", {"dflash", {2, 4}, MASK, -1, 0, 0, 0, 0, HD / 2, 0}, DFL_EUNSUP, "dflash.rope.dimension_count"},
        {"vocab vs target", {"dflash", {2, 4}, MASK, -1, 0, 0, 0, 0, 0, 1000}, DFL_EFORMAT, "vocab_size"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_gguf(path, &cases[i].o);
        d = NULL;
        rc = load(path, &d, &err);
        CHECK(rc == cases[i].code && !d && strstr(err.msg, cases[i].says),
              "gguf %s: rc %d (want %d), message: %s", cases[i].what, rc, cases[i].code, err.msg);
        dfl_drafter_free(d);
    }
    /* the runtime's key alone is enough */
    gg_opts only_b = base;
    only_b.mask_a = -1, only_b.mask_b = MASK;
    write_gguf(path, &only_b);
    rc = load(path, &d, &err);
    CHECK(rc == 0 && d->mask_id == MASK, "tokenizer.ggml.mask_token_id alone: %s", err.msg);
    dfl_drafter_free(d);
}

/* ---- greedy invariance with the real drafter in the loop --------------------------- */

enum { CTX = 160 };

typedef struct sink {
    int32_t ids[CTX + 1];
    int n;
} sink;

static int on_tok(void *ud, const dfl_token_info *t) {
    sink *s = ud;
    if (s->n <= CTX) s->ids[s->n++] = t->id;
    return 0;
}

/* Classic greedy by direct target calls, until the cache is full. */
static int classic(const int32_t *prompt, int n, int32_t *out) {
    dfl_kv *kv = dfl_kv_new(T, CTX);
    float *lg = malloc((size_t)T->c.vocab * sizeof(float));
    dfl_error err = {0};
    int32_t seq[CTX + 1];
    memcpy(seq, prompt, n * sizeof(int32_t));
    dfl_target_forward(T, kv, seq, n - 1, n - 1, NULL, NULL, 0, NULL, &err);
    int g = 0;
    for (int p = n - 1; p < CTX; p++) {
        dfl_target_forward(T, kv, seq + p, 1, 0, lg, NULL, 0, NULL, &err);
        seq[p + 1] = out[g++] = dfl_argmax(lg, T->c.vocab);
    }
    dfl_kv_free(kv);
    free(lg);
    return g;
}

/* Wraps the DFlash proposer: every draft the loop asks for is redone from
 * scratch (the committed tokens' features from one fresh target pass, one
 * append into a fresh store) and must match bit for bit, so the side store
 * after any sequence of rounds and rollbacks is the one-append store. */
typedef struct checker {
    dfl_proposer base;
    dfl_dflash_proposer dp;
    const int32_t *hist;   /* the loop's committed tokens */
    int every, calls;      /* redo every n-th draft (each costs a full prefill) */
    int checked, bad;
} checker;

static dfl_proposer *inner(const dfl_proposer *p) { return &((checker *)p)->dp.base; }
static int c_add(dfl_proposer *p, const float *feat, const int32_t *tok, int n,
                 dfl_error *err) {
    return inner(p)->add_context(inner(p), feat, tok, n, err);
}
static void c_trunc(dfl_proposer *p, int n) { inner(p)->truncate(inner(p), n); }
static int c_len(const dfl_proposer *p) { return inner(p)->len(inner(p)); }

static int c_draft(dfl_proposer *p, int32_t anchor, int pos, int B, int32_t *out, float *logits,
                   dfl_error *err) {
    checker *c = (checker *)p;
    int vocab = T->c.vocab;
    if (c->calls++ % c->every) return inner(p)->draft(inner(p), anchor, pos, B, out, logits, err);
    float *live = malloc((size_t)(B - 1) * vocab * 4), *fresh = malloc((size_t)(B - 1) * vocab * 4);
    int rc = inner(p)->draft(inner(p), anchor, pos, B, out, live, err);
    if (logits && !rc) memcpy(logits, live, (size_t)(B - 1) * vocab * 4);
    dfl_dstore *s = dfl_dstore_new(c->dp.d, CTX);
    int32_t again[64];
    if (pos > 0) {
        float *F = features(c->hist, pos);
        dfl_drafter_add_context(c->dp.d, s, F, pos, err);
        free(F);
    }
    dfl_drafter_draft_n(c->dp.d, s, anchor, dfl_dflash_draft_rows(c->dp.d, c->dp.s, B), B - 1,
                        fresh, again, err);
    c->checked++;
    if (memcmp(live, fresh, (size_t)(B - 1) * vocab * 4) || memcmp(out, again, (B - 1) * 4))
        c->bad++;
    dfl_dstore_free(s);
    free(live), free(fresh);
    return rc;
}

static void test_invariance(dfl_drafter *d) {
    int32_t prompt[5] = {1, 403, 407, 261, 378}, want[CTX + 1];
    int nw = classic(prompt, 5, want);
    int blocks[] = {2, 4, 8, 16, 0};
    for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
        dfl_kv *kv = dfl_kv_new(T, CTX);
        dfl_dstore *ds = dfl_dstore_new(d, CTX);
        checker ck = {.every = blocks[bi] == 8 ? 9 : 1 << 30};   /* each check is a prefill */
        dfl_dflash_proposer_init(&ck.dp, d, ds);
        ck.base = ck.dp.base;
        ck.base.add_context = c_add, ck.base.draft = c_draft;
        ck.base.truncate = c_trunc, ck.base.len = c_len;
        ck.base.spent = NULL;   /* (the inner one's would read ck as a DFlash proposer) */
        dfl_seq q = {.t = T, .kv = kv, .hist = calloc(CTX, 4), .max_block = 16, .pr = &ck.base,
                     .logits = malloc((size_t)16 * T->c.vocab * 4),
                     .feat = malloc((size_t)T->max_rows * NCAP * DIM * 4)};
        ck.hist = q.hist;
        dfl_loop_opts o = {.block = blocks[bi], .max_tokens = 1000};
        sink s = {0};
        dfl_stats st = {0};
        dfl_error err = {0};
        int rc = dfl_spec_generate(&q, &o, prompt, 5, on_tok, &s, &st, &err);
        int same = rc == 0 && s.n == nw && !memcmp(s.ids, want, nw * sizeof(int32_t));
        CHECK(same, "block %d: %d tokens (want %d), %s", blocks[bi], s.n, nw, err.msg);
        CHECK(ds->len == kv->len && st.stop == DFL_STOP_CTX, "block %d: store %d, kv %d, stop %d",
              blocks[bi], ds->len, kv->len, st.stop);
        CHECK(blocks[bi] == 0 || st.rounds > 0, "block %d: no speculative rounds", blocks[bi]);
        CHECK(ck.bad == 0 && (blocks[bi] != 8 || ck.checked > 5),
              "block %d: %d of %d live drafts differ from a fresh one-append store", blocks[bi],
              ck.bad, ck.checked);
        free(q.hist), free(q.logits), free(q.feat);
        dfl_dstore_free(ds);
        dfl_kv_free(kv);
    }
}

int main(void) {
    const char *path = test_asset("stories260K/stories260K.gguf");
    if (!path) return test_summary();
    pool = dfl_pool_new(2);
    dfl_load_opts lo = {.max_rows = 64, .pool = pool};
    dfl_error err = {0};
    if (dfl_target_load(path, &lo, &T, &err)) {
        CHECK(0, "target: %s", err.msg);
        return test_summary();
    }
    make_weights();
    const char *dir = test_tmpdir();
    test_default_layers();
    test_refusals(dir);

    dfl_drafter *d = NULL;
    int rc = load_variant(dir, NULL, &d, &err);
    CHECK(rc == 0, "base drafter: %s", err.msg);
    if (rc) return test_summary();
    CHECK(d->n_cap == NCAP && d->cap[0] == 1 && d->cap[1] == 3 && d->block_size == BLOCK &&
          d->mask_id == MASK && d->c.n_layers == NL, "config read back");

    int32_t ids[80];
    for (int i = 0; i < 80; i++) ids[i] = (int32_t)((i * 37 + 1) % 512);
    ids[0] = 1;
    int nctx = 70;
    float *F = features(ids, nctx);
    /* The side store follows the target's --kv-type: f32 checks the drafter's
     * arithmetic tightly, f16 (the default) within its rounding. */
    dfl_type kv_type = T->kv_type;
    T->kv_type = DFL_F32;
    test_forward(d, F, nctx, ids[nctx], 0);
    test_forward(d, F, 1, ids[1], 0);
    T->kv_type = DFL_F16;
    test_forward(d, F, nctx, ids[nctx], 0);
    dfl_dstore *s16 = dfl_dstore_new(d, 256);
    T->kv_type = DFL_F32;
    dfl_dstore *s32 = dfl_dstore_new(d, 256);
    CHECK(s16->type == DFL_F16 && s32->type == DFL_F32, "the store takes the target's K/V type");
    dfl_dstore_free(s16), dfl_dstore_free(s32);
    test_hole(d, F, nctx, ids[nctx], 0, nctx / 3, nctx / 3 + nctx / 4);
    T->kv_type = kv_type;
    test_incremental(d, F, nctx);
    test_pass(d, F);

    /* "model." prefixes are stripped: the same drafter */
    {
        static dfl_tensor t[80];
        static char names[80][128];
        int n = table(t, names, "model.");
        cJSON *cfg = base_config();
        write_folder(dir, cfg, t, n);
        cJSON_Delete(cfg);
        dfl_drafter *p = NULL;
        rc = load(dir, &p, &err);
        CHECK(rc == 0, "model.-prefixed drafter: %s", err.msg);
        if (!rc) test_forward(p, F, nctx, ids[nctx], 0);
        dfl_drafter_free(p);
    }
    /* fallback layer ids */
    {
        dfl_drafter *p = NULL;
        rc = load_variant(dir, m_no_ids, &p, &err);
        CHECK(rc == 0 && p->n_cap == 2 && p->cap[0] == 1 && p->cap[1] == 2,
              "default layer ids: %s", err.msg);
        dfl_drafter_free(p);
    }
    /* a window: blocks attend the last 9 context rows; older rows are never projected */
    d->window = 9;
    test_forward(d, F, nctx, ids[nctx], 9);
    test_hole(d, F, nctx, ids[nctx], 9, nctx - 6, nctx - 3);   /* a hole inside the window */
    test_incremental(d, F, nctx);
    test_pass(d, F);
    d->window = 0;

    test_gguf(dir, d, F, nctx);
    test_invariance(d);
    dfl_drafter_free(d);
    free(F);
    test_rmdir(dir);
    dfl_target_free(T);
    dfl_pool_free(pool);
    return test_summary();
}
