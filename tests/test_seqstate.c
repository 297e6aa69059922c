/* test_seqstate.c - the sequence state by layer kind, without a model:
 * full-attention rows; a sliding ring that wraps many times, whose key view
 * is always the window's positions in order (each row written twice, so any
 * window is one contiguous run); prefix copies, refused once a ring moved
 * past the rows; recurrent snapshots, rolled back by copy within the last
 * forward and restarting beyond it; recurrent prefix copies, exact from the
 * live state or a snapshot, refused (0 rows, the caller prefills) before. */
#include <string.h>

#include "models/seqstate.h"
#include "testutil.h"

enum { HD = 4, KVH = 2, KVD = HD * KVH, WIN = 5, ROWS = 3, CAP = 64, REC = 6, SNAP = 4 };

/* The value stored for position p, head h, dim d (exact in f16). */
static float val(int p, int h, int d) { return (float)(p * 16 + h * 4 + d) * 0.25f; }

static void store(dfl_kv *kv, int l, int p) {
    float k[KVD], v[KVD];
    for (int h = 0; h < KVH; h++)
        for (int d = 0; d < HD; d++) k[h * HD + d] = val(p, h, d), v[h * HD + d] = -val(p, h, d);
    dfl_kv_store(kv, l, p, k, v);
}

static float at(const dfl_kv *kv, const dfl_kv_view *v, int key, int h, int d) {
    size_t i = (size_t)h * v->hs + (size_t)key * v->ldk + d;
    if (kv->type == DFL_F32) return ((const float *)v->K)[i];
    return dfl_f16_to_f32(((const uint16_t *)v->K)[i]);
}

/* Every key a row at pos reads in layer l is the right position's. */
static int keys_ok(const dfl_kv *kv, int l, int pos, int want_first) {
    int nk;
    dfl_kv_view v = dfl_kv_keys(kv, l, pos, &nk);
    if (nk != pos + 1 - want_first) return 0;
    for (int j = 0; j < nk; j++)
        for (int h = 0; h < KVH; h++)
            for (int d = 0; d < HD; d++)
                if (at(kv, &v, j, h, d) != val(want_first + j, h, d)) return 0;
    return 1;
}

static void test_attention(dfl_type type) {
    unsigned char kind[2] = {DFL_LAYER_FULL, DFL_LAYER_SLIDING};
    dfl_kv_shape s = {.n_layers = 2, .n_kv_heads = KVH, .head_dim = HD, .type = type, .kind = kind,
                      .window = WIN, .max_rows = ROWS};
    dfl_kv *kv = dfl_kv_make(&s, CAP), *cp = dfl_kv_make(&s, CAP);
    CHECK(kv->layer[1].ring && kv->layer[1].rows == WIN + ROWS && !kv->layer[0].ring,
          "a ring of window + max_rows for the sliding layer only");
    size_t el = type == DFL_F16 ? 2 : 4;
    CHECK(dfl_kv_bytes(&s, CAP) == 2 * (CAP + 2 * (WIN + ROWS)) * KVD * el,
          "dfl_kv_bytes: K and V of every position, and the ring stored twice");
    CHECK(dfl_kv_bytes(&s, WIN + ROWS) == 2 * 2 * (WIN + ROWS) * KVD * el,
          "dfl_kv_bytes: no ring where the context is no longer than it");
    int bad_full = 0, bad_ring = 0;
    for (int p = 0; p < 50; p++) {
        store(kv, 0, p), store(kv, 1, p);
        kv->len = p + 1;
        bad_full += !keys_ok(kv, 0, p, 0);
        bad_ring += !keys_ok(kv, 1, p, p + 1 > WIN ? p + 1 - WIN : 0);
        /* a block of ROWS rows, then all but one rolled back, as a verify does */
        if (p % 7 == 3 && p + ROWS < 50) {
            for (int r = 1; r <= ROWS; r++) store(kv, 0, p + r), store(kv, 1, p + r);
            dfl_kv_truncate(kv, p + 2);
            bad_ring += !keys_ok(kv, 1, p + 1, p + 2 > WIN ? p + 2 - WIN : 0);
            kv->len = p + 1;
        }
    }
    CHECK(!bad_full && !bad_ring, "%s: %d full and %d sliding key views wrong over 50 rows",
          dfl_type_name(type), bad_full, bad_ring);
    /* the last rows the ring still holds copy; older ones are gone */
    CHECK(dfl_kv_copy_prefix(cp, kv, 48) == 48 && keys_ok(cp, 1, 47, 43) && keys_ok(cp, 0, 47, 0),
          "a prefix the ring still holds copies");
    CHECK(dfl_kv_copy_prefix(cp, kv, 20) == 0 && cp->len == 0,
          "a prefix the ring moved past is refused");
    dfl_kv_free(kv), dfl_kv_free(cp);
}

/* A toy recurrence in layer l over n rows: state[i] = row count, written as
 * a layer would. */
static void toy_forward(dfl_kv *kv, int l, int n) {
    int base = kv->len;
    dfl_kv_begin(kv, n);
    for (int r = 0; r < n; r++) {
        float *st = dfl_kv_rec(kv, l);
        for (int i = 0; i < REC; i++) st[i] = (float)(base + r + 1);
        if (r + 1 < kv->snap_n) memcpy(dfl_kv_snap(kv, l, r + 1), st, sizeof(float) * REC);
    }
    kv->len += n;
}

static void test_recurrent(void) {
    unsigned char kind[1] = {DFL_LAYER_RECURRENT};
    dfl_kv_shape s = {.n_layers = 1, .kind = kind, .rec_floats = REC, .n_snap = SNAP,
                      .type = DFL_F32};
    dfl_kv *kv = dfl_kv_make(&s, CAP);
    CHECK(dfl_kv_bytes(&s, CAP) == (1 + SNAP) * REC * sizeof(float),
          "dfl_kv_bytes: the live recurrent state and its snapshots, whatever the context");
    for (int round = 0; round < 3; round++) {
        int n = 3, base = kv->len;
        toy_forward(kv, 0, n);
        int kept = dfl_kv_truncate(kv, base + 1 + round % 2);
        CHECK(kept == base + 1 + round % 2 && dfl_kv_rec(kv, 0)[REC - 1] == (float)kept,
              "round %d: rolled back to %d rows, state %g", round, kept, dfl_kv_rec(kv, 0)[0]);
    }
    int len = kv->len;
    CHECK(dfl_kv_truncate(kv, len - 1) == len - 1, "one row back: still in the snapshots");
    CHECK(dfl_kv_truncate(kv, 0) == 0 && dfl_kv_rec(kv, 0)[0] == 0,
          "further back than any snapshot: the sequence restarts from a zero state");
    dfl_kv_free(kv);
}

static void test_recurrent_copy(void) {
    unsigned char kind[2] = {DFL_LAYER_FULL, DFL_LAYER_RECURRENT};
    dfl_kv_shape s = {.n_layers = 2, .n_kv_heads = KVH, .head_dim = HD, .kind = kind,
                      .rec_floats = REC, .n_snap = SNAP, .type = DFL_F32, .max_rows = ROWS};
    dfl_kv *kv = dfl_kv_make(&s, CAP), *cp = dfl_kv_make(&s, CAP);
    toy_forward(kv, 1, 10);   /* a prefill: snapshots hold rows 0..SNAP-1 of it */
    toy_forward(kv, 1, 3);    /* a verify block: snapshots after 10, 11, 12, 13 rows */
    for (int p = 0; p < kv->len; p++) store(kv, 0, p);
    CHECK(dfl_kv_copy_prefix(cp, kv, 13) == 13 && dfl_kv_rec(cp, 1)[0] == 13.0f &&
          keys_ok(cp, 0, 12, 0), "copy of every row: the live state");
    CHECK(dfl_kv_copy_prefix(cp, kv, 11) == 11 && dfl_kv_rec(cp, 1)[REC - 1] == 11.0f &&
          cp->len == 11 && keys_ok(cp, 0, 10, 0), "copy into the last forward: its snapshot");
    CHECK(dfl_kv_copy_prefix(cp, kv, 9) == 0 && cp->len == 0 && dfl_kv_rec(cp, 1)[0] == 0,
          "copy before the last forward: refused, the copy empty with a zero state");
    dfl_kv_free(kv), dfl_kv_free(cp);
}

int main(void) {
    test_attention(DFL_F32);
    test_attention(DFL_F16);
    test_recurrent();
    test_recurrent_copy();
    return test_summary();
}
