/* test_batch.c - one forward for many sequences.
 *
 * 1. The seam: rows of several sequences in one dfl_target_forward_rows call
 *    (decode rows, verify blocks, prefill chunks, with drafts rolled back and
 *    run again) give every row the bits of single-row decode, logits and
 *    captured features alike. Random mixes over many seeds, for three weight
 *    types, on the SIMD kernels and on the plain-C twins.
 * 2. The combiner: threads generating at once on their own sessions (their
 *    forwards batched) get, token for token, what each gets alone: classic,
 *    fixed blocks and the adaptive policy, over several seeds.
 * 3. Sliding-window layers (a window of 16; their ring of 80 rows wraps):
 *    all of the above, and speculative output equal to classic over 200
 *    tokens, across the window boundary many times.
 * $DFLASH_BATCH_TARGET and $DFLASH_BATCH_DRAFT run all of it on that pair
 * instead (test_hf_oracle.py: a Qwen3.5 hybrid, whose recurrent states roll
 * back through snapshots, or restart when a rollback reaches further). */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "dflash.h"
#include "api/engine.h"
#include "kernels/kernels.h"
#include "testutil.h"

enum { NSEQ = 6, LEN = 96, CTX = 256, NCAP = 2, MAXG = 240, NTHREAD = 6 };
static const int CAP[NCAP] = {1, 3};

/* Under AddressSanitizer (make check-asan sets ASAN_OPTIONS), and on a pair
 * given by the environment (a second model in another test's time), the
 * same checks run at a smaller scale: fewer seeds and weight types. */
static int small(void) { return getenv("ASAN_OPTIONS") || getenv("DFLASH_BATCH_TARGET"); }

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

/* ---- 1. the seam ---------------------------------------------------------- */

typedef struct ref {
    float *logits;   /* (LEN, vocab) single-row decode, row by row */
    float *feat;     /* (LEN, NCAP*dim) */
} ref;

static void solo(dfl_target *t, const int32_t *tok, ref *r) {
    dfl_kv *kv = dfl_kv_new(t, CTX);
    size_t V = t->c.vocab, fd = (size_t)NCAP * t->c.dim;
    dfl_error err = {0};
    for (int p = 0; p < LEN; p++)
        dfl_target_forward(t, kv, tok + p, 1, 0, r->logits + p * V, CAP, NCAP, r->feat + p * fd,
                           &err);
    dfl_kv_free(kv);
}

/* Runs the NSEQ streams to LEN in random mixed forwards; returns the rows
 * whose logits or features differ from solo decode. */
static int mixed(dfl_target *t, int32_t (*tok)[LEN], ref *refs, uint64_t seed, int *max_seqs) {
    size_t V = t->c.vocab, fd = (size_t)NCAP * t->c.dim;
    dfl_kv *kv[NSEQ];
    float *lg[NSEQ], *ft[NSEQ];
    for (int s = 0; s < NSEQ; s++) {
        kv[s] = dfl_kv_new(t, CTX);
        lg[s] = malloc(t->max_rows * V * sizeof(float));
        ft[s] = malloc(t->max_rows * fd * sizeof(float));
    }
    int bad = 0;
    for (;;) {
        dfl_fwd f[NSEQ];
        int n = 0, rows = 0;
        for (int s = 0; s < NSEQ; s++) {
            int left = LEN - kv[s]->len;
            if (left <= 0 || rng_next(&seed) % 4 == 0) continue;
            int kind = (int)(rng_next(&seed) % 3);   /* decode row, block, prefill chunk */
            int m = kind == 0 ? 1 : kind == 1 ? 2 + (int)(rng_next(&seed) % 15) : t->max_rows;
            if (m > left) m = left;
            if (rows + m > t->batch_rows) continue;
            f[n++] = (dfl_fwd){.kv = kv[s], .tok = tok[s] + kv[s]->len, .n = m, .logits = lg[s],
                               .cap = CAP, .n_cap = NCAP, .feat = ft[s]};
            rows += m;
        }
        if (!n) {
            int done = 1;
            for (int s = 0; s < NSEQ; s++) done &= kv[s]->len >= LEN;
            if (done) break;
            continue;
        }
        if (n > *max_seqs) *max_seqs = n;
        int pos0[NSEQ];
        for (int i = 0; i < n; i++) pos0[i] = f[i].kv->len;
        dfl_ticket_lock(&t->lock);
        dfl_target_forward_rows(t, f, n);
        dfl_ticket_unlock(&t->lock);
        for (int i = 0; i < n; i++) {
            int s = 0;
            while (kv[s] != f[i].kv) s++;
            for (int r = 0; r < f[i].n; r++) {
                int p = pos0[i] + r;
                bad += memcmp(lg[s] + r * V, refs[s].logits + p * V, V * sizeof(float)) != 0 ||
                       memcmp(ft[s] + r * fd, refs[s].feat + p * fd, fd * sizeof(float)) != 0;
            }
            /* a verify that rejected its last drafts: they run again later */
            if (f[i].n > 1 && rng_next(&seed) % 3 == 0)
                dfl_kv_truncate(kv[s], pos0[i] + 1 + (int)(rng_next(&seed) % (f[i].n - 1)));
        }
    }
    for (int s = 0; s < NSEQ; s++) dfl_kv_free(kv[s]), free(lg[s]), free(ft[s]);
    return bad;
}

static void test_seam(dfl_engine *e, const char *dtype) {
    dfl_target *t = e->t;
    size_t V = t->c.vocab, fd = (size_t)NCAP * t->c.dim;
    int32_t tok[NSEQ][LEN];
    ref refs[NSEQ];
    /* The plain-C pass for float weights only: the quantized twins (quant.c,
     * written as the specification) run 200-400x slower than SIMD at several
     * rows, and their batch invariance is test_quant's (every batch size
     * against the twin) and test_isa's (DFLASH_ISA=generic end to end). */
    int passes = strcmp(dtype, "auto") ? 1 : 2;
    for (int pass = 0; pass < passes; pass++) {
        dfl_kernels_force_ref(pass);
        uint64_t s0 = 0x9e3779b97f4a7c15ull + pass;
        for (int s = 0; s < NSEQ; s++) {
            for (int p = 0; p < LEN; p++) tok[s][p] = (int32_t)(rng_next(&s0) % V);
            refs[s].logits = malloc(LEN * V * sizeof(float));
            refs[s].feat = malloc(LEN * fd * sizeof(float));
            solo(t, tok[s], &refs[s]);
        }
        int bad = 0, max_seqs = 0, seeds = small() ? 3 : 12;
        for (int k = 0; k < seeds; k++) bad += mixed(t, tok, refs, 1000 + k * 7919, &max_seqs);
        CHECK(bad == 0, "%s, %s kernels: %d rows of mixed forwards differ from single-row decode",
              dtype, pass ? "plain-C" : "SIMD", bad);
        CHECK(max_seqs >= 4, "%s: the mixes never put 4 sequences in one forward (%d)", dtype,
              max_seqs);
        for (int s = 0; s < NSEQ; s++) free(refs[s].logits), free(refs[s].feat);
    }
    dfl_kernels_force_ref(0);
}

/* ---- 2. the combiner ------------------------------------------------------ */

typedef struct job {
    dfl_engine *e;
    int32_t prompt[16];
    int n_prompt, block, max_tokens;
    int32_t ids[MAXG];
    int kind0; /* DFL_TOKEN_* of the first token */
    int n;
    dfl_stats st;
    int rc;
} job;

static int on_tok(void *ud, const dfl_token_info *ti) {
    job *j = ud;
    if (j->n == 0) j->kind0 = ti->kind;
    if (j->n < MAXG) j->ids[j->n] = ti->id, __atomic_store_n(&j->n, j->n + 1, __ATOMIC_RELEASE);
    return 0;
}

static void *gen(void *arg) {
    job *j = arg;
    dfl_session *s;
    dfl_error err = {0};
    j->n = 0;
    j->rc = dfl_session_new(j->e, &s, &err);
    if (j->rc) return NULL;
    dfl_gen_params p;
    dfl_gen_params_default(&p);
    /* unequal lengths: the others leave mid-run */
    p.max_tokens = j->max_tokens ? j->max_tokens : 96 + (j->block == 1 ? 0 : 3 * j->block);
    p.ignore_eos = 1;
    p.block_size = j->block;
    j->rc = dfl_generate(s, j->prompt, j->n_prompt, &p, on_tok, j, &j->st, &err);
    if (j->rc) fprintf(stderr, "generate: %s\n", err.msg);
    dfl_session_free(s);
    return NULL;
}

/* Speculative decode at every block size equals classic decode, id for id. */
static void test_spec_exact(dfl_engine *e) {
    static const int blocks[] = {2, 4, 8, 16, 0};
    for (int k = 0; k < 3; k++) {
        job ref = {.e = e, .block = 1, .n_prompt = 5 + 3 * k, .max_tokens = 220};
        for (int i = 0; i < ref.n_prompt; i++)
            ref.prompt[i] = (int32_t)((i * 97 + k * 31) % e->t->c.vocab);
        gen(&ref);
        CHECK(ref.rc == 0 && ref.n == 220, "classic: %d tokens", ref.n);
        for (int b = 0; b < 5; b++) {
            job j = ref;
            j.block = blocks[b];
            gen(&j);
            int n = j.n < ref.n ? j.n : ref.n;
            CHECK(j.rc == 0 && n == 220 && !memcmp(j.ids, ref.ids, sizeof(int32_t) * n),
                  "prompt %d, block %d: speculative ids differ from classic", k, blocks[b]);
        }
    }
}

static void test_crowd(dfl_engine *e) {
    static const int blocks[NTHREAD] = {1, 4, 0, 8, 1, 0};
    uint64_t shared = 0;
    for (int seed = 0; seed < (small() ? 1 : 4); seed++) {
        job solo_j[NTHREAD], crowd[NTHREAD];
        uint64_t rs = 0x1234567ull + seed;
        for (int i = 0; i < NTHREAD; i++) {
            job *j = &solo_j[i];
            memset(j, 0, sizeof *j);
            j->e = e;
            j->block = blocks[i];
            j->n_prompt = 3 + (int)(rng_next(&rs) % 12);
            for (int k = 0; k < j->n_prompt; k++)
                j->prompt[k] = (int32_t)(rng_next(&rs) % (uint64_t)e->t->c.vocab);
            crowd[i] = *j;
            gen(j);
        }
        pthread_t th[NTHREAD];
        for (int i = 0; i < NTHREAD; i++) pthread_create(&th[i], NULL, gen, &crowd[i]);
        for (int i = 0; i < NTHREAD; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < NTHREAD; i++) {
            CHECK(crowd[i].rc == 0 && crowd[i].n == solo_j[i].n &&
                      !memcmp(crowd[i].ids, solo_j[i].ids, sizeof(int32_t) * crowd[i].n),
                  "seed %d, block %d: the crowd's %d tokens differ from the solo run's %d", seed,
                  blocks[i], crowd[i].n, solo_j[i].n);
            shared += crowd[i].st.shared_forwards;
        }
    }
    CHECK(shared > 0, "no forward of the crowd carried two sequences: nothing was batched");
    printf("crowd: %llu forwards shared\n", (unsigned long long)shared);
}

/* A forward tells each call how many rows and sequences of others it
 * carried: the loop prices the crowd only from ticks whose others each
 * stepped one row, since a prefill chunk's rows are not tokens. */
typedef struct call {
    dfl_target *t;
    dfl_fwd f;
    int32_t tok[8];
    float *logits;
} call;

static void *call_run(void *arg) {
    call *c = arg;
    dfl_error err = {0};
    c->f.tok = c->tok, c->f.logits = c->logits;
    dfl_target_forward_ex(c->t, &c->f, &err);
    return NULL;
}

static void test_counts(dfl_engine *e) {
    dfl_target *t = e->t;
    int m = t->max_rows < 8 ? t->max_rows : 8, shared = 0;
    call c[2] = {{.t = t, .f.n = 1}, {.t = t, .f.n = m}};
    for (int i = 0; i < 2; i++) {
        c[i].logits = malloc((size_t)m * t->c.vocab * sizeof(float));
        for (int k = 0; k < 8; k++) c[i].tok[k] = (int32_t)(3 + 5 * k + i);
    }
    for (int tries = 0; tries < 20 && !shared; tries++) {
        pthread_t th[2];
        dfl_target_join(t), dfl_target_join(t);
        for (int i = 0; i < 2; i++) {
            c[i].f.kv = dfl_kv_new(t, CTX);
            pthread_create(&th[i], NULL, call_run, &c[i]);
        }
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL), dfl_kv_free(c[i].f.kv);
        dfl_target_leave(t), dfl_target_leave(t);
        shared = c[0].f.others > 0;
    }
    CHECK(shared, "two joined calls never shared a forward");
    CHECK(!shared || (c[0].f.others == m && c[0].f.other_seqs == 1 && c[1].f.others == 1 &&
                      c[1].f.other_seqs == 1),
          "counts of a shared forward: %d rows of %d sequences / %d rows of %d (want %d/1, 1/1)",
          c[0].f.others, c[0].f.other_seqs, c[1].f.others, c[1].f.other_seqs, m);
    for (int i = 0; i < 2; i++) free(c[i].logits);
}

/* A fresh sequence that joins a running one, with no price for the crowd's
 * rows yet (the gate has measured no crowd, the session no crowd's tick),
 * takes a classic step first: judged as if alone by its start-up costs, its
 * first rounds took blocks the crowd paid for. */
static void test_join_classic(dfl_engine *e) {
    job first = {.e = e, .block = 0, .n_prompt = 4, .max_tokens = 200};
    job late = {.e = e, .block = 0, .n_prompt = 6, .max_tokens = 8};
    for (int i = 0; i < 6; i++) first.prompt[i] = (int32_t)(11 + 7 * i), late.prompt[i] = 5 + 3 * i;
    pthread_t th;
    pthread_create(&th, NULL, gen, &first);
    while (__atomic_load_n(&first.n, __ATOMIC_ACQUIRE) < 1 && !first.rc) sched_yield();
    gen(&late);
    int running = __atomic_load_n(&first.n, __ATOMIC_ACQUIRE) < 200;
    pthread_join(th, NULL);
    CHECK(first.rc == 0 && late.rc == 0 && late.n == 8, "join: rc %d / %d, %d tokens", first.rc,
          late.rc, late.n);
    CHECK(!running || late.kind0 == DFL_TOKEN_CLASSIC,
          "a sequence joining a crowd with no price drafted first (token kind %d)", late.kind0);
    CHECK(late.st.shared_forwards > 0, "join: the late sequence shared no forward");
}

/* A drafter pass is charged to a sequence by its rows' share, counted as if
 * every sequence joined to the target had drafted beside it: in a crowd a
 * round drafted alone is not priced at the whole pass, which each slot
 * alone would decline though the crowd drafting together gains. */
static void no_pass(void *ctx, dfl_side_call **cs, int k) { (void)ctx, (void)cs, (void)k; }

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * (fabs(b) + 1e-9); }

static void test_side_charge(dfl_engine *e) {
    dfl_target *t = e->t;
    dfl_side_call c = {.fn = no_pass, .rows = 4};
    dfl_target_join(t);
    dfl_target_side_run(t, &c, t->max_rows);
    CHECK(c.crowd == 1 && c.pass_rows == 4 && near(dfl_side_charge(&c), c.seconds),
          "alone: crowd %d, rows %d, charged %g of %g s", c.crowd, c.pass_rows,
          dfl_side_charge(&c), c.seconds);
    dfl_target_join(t);
    dfl_target_join(t);
    dfl_target_side_run(t, &c, t->max_rows);   /* the others never come: it leads alone */
    CHECK(c.crowd == 3 && c.pass_rows == 4 && near(dfl_side_charge(&c), c.seconds / 3),
          "drafting alone in a crowd of 3: crowd %d, charged %g of %g s", c.crowd,
          dfl_side_charge(&c), c.seconds);
    for (int i = 0; i < 3; i++) dfl_target_leave(t);
    /* a pass the crowd shared: its rows' share of what it carried */
    dfl_side_call shared = {.rows = 4, .pass_rows = 10, .crowd = 2, .seconds = 0.02};
    CHECK(near(dfl_side_charge(&shared), 0.008), "shared pass: charged %g s, not 0.008",
          dfl_side_charge(&shared));
}

static void run_pair(const char *model, const char *draft, const char *name, int n_dtypes) {
    static const char *dtypes[] = {"auto", "q8_0", "q4_1"};
    if (small()) n_dtypes = 1;
    for (int d = 0; d < n_dtypes; d++) {
        dfl_engine_opts o;
        dfl_engine_opts_default(&o);
        o.model_path = model;
        o.draft_path = draft;
        o.dtype = dtypes[d];
        o.n_threads = 2;
        o.ctx_size = CTX;
        o.n_parallel = NTHREAD;
        dfl_engine *e;
        dfl_error err = {0};
        int rc = dfl_engine_load(&o, &e, &err);
        CHECK(rc == 0, "%s, load %s: %s", name, dtypes[d], err.msg);
        if (rc) continue;
        printf("%s, %s\n", name, dtypes[d]);
        test_seam(e, dtypes[d]);
        if (d == 0) test_join_classic(e), test_counts(e), test_side_charge(e);
        if (d != 1) test_crowd(e);
        if (d == 0) test_spec_exact(e);
        dfl_engine_free(e);
    }
}

static void run_model(const char *flags, const char *name, int n_dtypes) {
    const char *dir = test_tmpdir();
    char model[512], draft[512];
    if (test_make_pair(dir, flags, model, draft)) return;
    run_pair(model, draft, name, n_dtypes);
    test_rmdir(dir);
}

int main(void) {
    const char *tm = getenv("DFLASH_BATCH_TARGET"), *dm = getenv("DFLASH_BATCH_DRAFT");
    if (tm && dm) {
        run_pair(tm, dm, tm, 1);
        return test_summary();
    }
    const char *common = "--arch qwen3 --dim 64 --layers 4 --heads 4 --kv-heads 2 --head-dim 16 "
                         "--ffn 192 --vocab 512 --untied --dtype bf16";
    char sliding[512];
    snprintf(sliding, sizeof sliding, "%s --sliding-window 16", common);
    run_model(common, "full attention", 3);
    run_model(sliding, "sliding window 16", 2);
    return test_summary();
}
