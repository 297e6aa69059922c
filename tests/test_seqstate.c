/* test_seqstate.c - the sequence state by layer kind, without a model:
 * full-attention rows; a sliding ring that wraps many times, whose key view
 * is always the window's positions in order (each row written twice, so any
 * window is one contiguous run); prefix copies, refused once a ring moved
 * past the rows; recurrent snapshots, rolled back by copy within the last
 * forward and restarting beyond it; recurrent prefix copies, exact from the
 * live state or a snapshot, refused (0 rows, the caller prefills) before;
 * a tree's accepted path kept (dfl_kv_keep_path) in full, sliding and
 * recurrent layers, and the tree rows each can take. */
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

/* Every key a row at pos reads is position first + j's, where position q
 * holds what store(q') wrote, q' = src[q]. */
static int keys_from(const dfl_kv *kv, int l, int pos, int first, const int *src) {
    int nk;
    dfl_kv_view v = dfl_kv_keys(kv, l, pos, &nk);
    if (nk != pos + 1 - first) return 0;
    for (int j = 0; j < nk; j++)
        for (int h = 0; h < KVH; h++)
            for (int d = 0; d < HD; d++)
                if (at(kv, &v, j, h, d) != val(src[first + j], h, d)) return 0;
    return 1;
}

/* Every key a row at pos reads in layer l is the right position's. */
static int keys_ok(const dfl_kv *kv, int l, int pos, int want_first) {
    int src[CAP];
    for (int p = 0; p < CAP; p++) src[p] = p;
    return keys_from(kv, l, pos, want_first, src);
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
    /* a verify block rolled back: its rows past len overwrote positions the ring
     * held before it, so a prefix whose window reaches them is refused too */
    dfl_kv *rb = dfl_kv_make(&s, CAP);
    for (int p = 0; p < 30 + ROWS; p++) store(rb, 0, p), store(rb, 1, p);
    rb->len = 30 + ROWS;
    dfl_kv_truncate(rb, 31);
    int n = dfl_kv_copy_prefix(cp, rb, 28);
    CHECK(n == 0 || keys_ok(cp, 1, 27, 23), "a prefix copied after a rollback has wrong keys");
    CHECK(dfl_kv_copy_prefix(cp, rb, 31) == 31 && keys_ok(cp, 1, 30, 26),
          "a prefix after a rollback whose window the ring holds copies");
    dfl_kv_free(rb);
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

/* A tree forward of ROWS rows (parents -1, 0, 0) after each prefix length,
 * path 0 -> 2 kept: in the ring and in full attention alike, position p + 1
 * then holds row 2's K/V (both of the ring's copies: every later window that
 * reads it, wrapped or not, sees it), and the tree rows the ring holds
 * report their room. */
static void test_keep_path(dfl_type type) {
    unsigned char kind[2] = {DFL_LAYER_FULL, DFL_LAYER_SLIDING};
    dfl_kv_shape s = {.n_layers = 2, .n_kv_heads = KVH, .head_dim = HD, .type = type, .kind = kind,
                      .window = WIN, .max_rows = ROWS};
    dfl_kv *kv = dfl_kv_make(&s, CAP);
    CHECK(dfl_kv_tree_rows(kv) == ROWS, "a ring of window + %d rows: trees of %d rows, not %d",
          ROWS, ROWS, dfl_kv_tree_rows(kv));
    int src[CAP], bad = 0, rows[2] = {0, 2};
    for (int p = 0; p + ROWS + WIN < CAP; p++) {
        for (int r = 0; r < ROWS; r++) store(kv, 0, p + r), store(kv, 1, p + r), src[p + r] = p + r;
        kv->len = p + ROWS;
        bad += dfl_kv_keep_path(kv, p, rows, 2) != p + 2;
        src[p + 1] = p + 2;
        for (int q = p + 2; q < p + 1 + WIN; q++) {   /* decode on: windows holding p + 1 */
            store(kv, 0, q), store(kv, 1, q), src[q] = q;
            kv->len = q + 1;
            bad += !keys_from(kv, 0, q, 0, src) + !keys_from(kv, 1, q, q + 1 > WIN ? q + 1 - WIN : 0,
                                                              src);
        }
        kv->len = p + 1;   /* the next tree after one more committed row */
        src[p + 1] = p + 1;
    }
    CHECK(!bad, "%s: %d key views wrong after keeping a path", dfl_type_name(type), bad);
    dfl_kv_free(kv);
}

/* A toy recurrence over a tree: each row's state is its parent's times 8
 * plus its row number + 1, so a state spells the path that made it. */
static void toy_tree(dfl_kv *kv, int l, const int *parent, int n) {
    dfl_kv_begin(kv, n);
    for (int r = 0; r < n; r++) {
        if (parent[r] != r - 1) dfl_kv_branch(kv, l, parent[r]);
        float *st = dfl_kv_rec(kv, l);
        for (int i = 0; i < REC; i++) st[i] = st[i] * 8 + (float)(r + 1);
        if (r + 1 < kv->snap_n) memcpy(dfl_kv_snap(kv, l, r + 1), st, sizeof(float) * REC);
    }
    kv->len += n;
}

/* Recurrent keep_path: the live state is the kept path's (rows 0 -> 1 -> 3,
 * whose state spells 1, 2, 4), a rollback into its leading chain (rows 0,
 * 1) is a snapshot; past a shorter chain (0 -> 2 -> 3) the sequence
 * restarts; a row past the snapshots (a tree of more than dfl_kv_tree_rows
 * rows) is refused. */
static void test_recurrent_tree(void) {
    unsigned char kind[1] = {DFL_LAYER_RECURRENT};
    dfl_kv_shape s = {.n_layers = 1, .kind = kind, .rec_floats = REC, .n_snap = SNAP + 2,
                      .type = DFL_F32};
    dfl_kv *kv = dfl_kv_make(&s, CAP);
    CHECK(dfl_kv_tree_rows(kv) == SNAP + 1, "recurrent: trees of n_snap - 1 rows");
    toy_forward(kv, 0, 2);
    int parent[5] = {-1, 0, 0, 1, -1}, rows[3] = {0, 1, 3};
    toy_tree(kv, 0, parent, 5);
    float root = 2.0f, want = ((root * 8 + 1) * 8 + 2) * 8 + 4;
    CHECK(dfl_kv_snap(kv, 0, 5)[0] == root * 8 + 5, "a second root starts from the forward's start");
    CHECK(dfl_kv_keep_path(kv, 2, rows, 3) == 5 && dfl_kv_rec(kv, 0)[REC - 1] == want,
          "keep_path: live state %g, want %g", dfl_kv_rec(kv, 0)[REC - 1], want);
    CHECK(dfl_kv_truncate(kv, 4) == 4 && dfl_kv_rec(kv, 0)[0] == (root * 8 + 1) * 8 + 2,
          "a rollback into the kept path's leading chain: its snapshot");
    int parent2[5] = {-1, 0, 0, 2, -1}, rows2[3] = {0, 2, 3};
    toy_forward(kv, 0, 1);
    toy_tree(kv, 0, parent2, 5);
    want = ((5.0f * 8 + 1) * 8 + 3) * 8 + 4;
    CHECK(dfl_kv_keep_path(kv, 5, rows2, 3) == 8 && dfl_kv_rec(kv, 0)[0] == want,
          "keep_path 0 -> 2 -> 3: live state %g, want %g", dfl_kv_rec(kv, 0)[0], want);
    CHECK(dfl_kv_truncate(kv, 7) == 0 && dfl_kv_rec(kv, 0)[0] == 0,
          "a rollback past the kept path's leading chain restarts");
    int big[SNAP + 3];
    for (int r = 0; r < SNAP + 3; r++) big[r] = r - 1;
    toy_forward(kv, 0, 1);
    toy_tree(kv, 0, big, SNAP + 3);
    int last[2] = {0, SNAP + 2}, len = kv->len;
    CHECK(dfl_kv_keep_path(kv, 1, last, 2) == -1 && kv->len == len,
          "a row past the snapshots: keep_path refuses, nothing changed");
    dfl_kv_free(kv);
}

int main(void) {
    test_attention(DFL_F32);
    test_attention(DFL_F16);
    test_recurrent();
    test_recurrent_copy();
    test_keep_path(DFL_F32);
    test_keep_path(DFL_F16);
    test_recurrent_tree();
    return test_summary();
}
