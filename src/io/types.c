/* types.c - the weight type table and the named-tensor table helpers. */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_private.h"

static const struct {
    const char *name;
    int block;          /* elements per block */
    size_t block_bytes; /* bytes per block */
} types[DFL_NTYPES] = {
    [DFL_F32] = {"f32", 1, 4},
    [DFL_F16] = {"f16", 1, 2},
    [DFL_BF16] = {"bf16", 1, 2},
    [DFL_Q8_0] = {"q8_0", 32, 34},   /* f16 d + 32 x int8 */
    [DFL_Q4_0] = {"q4_0", 32, 18},   /* f16 d + 16 bytes of nibbles */
    [DFL_Q4_1] = {"q4_1", 32, 20},   /* f16 d, m + 16 bytes of nibbles */
    [DFL_Q4_K] = {"q4_k", 256, 144}, /* f16 d, dmin + 12 scale bytes + 128 nibble bytes */
    [DFL_Q6_K] = {"q6_k", 256, 210}, /* 128 ql + 64 qh + 16 scales + f16 d */
};

const char *dfl_type_name(dfl_type t) {
    return (unsigned)t < DFL_NTYPES ? types[t].name : "?";
}

int dfl_type_from_name(const char *s) {
    if (!s) return -1;
    for (int i = 0; i < DFL_NTYPES; i++)
        if (strcmp(s, types[i].name) == 0) return i;
    return -1;
}

int dfl_type_block(dfl_type t) {
    return (unsigned)t < DFL_NTYPES ? types[t].block : 0;
}

size_t dfl_type_block_bytes(dfl_type t) {
    return (unsigned)t < DFL_NTYPES ? types[t].block_bytes : 0;
}

size_t dfl_type_row_bytes(dfl_type t, int64_t cols) {
    if ((unsigned)t >= DFL_NTYPES || cols < 0 || cols % types[t].block) return 0;
    uint64_t n;
    if (dfl_mul_ok((uint64_t)(cols / types[t].block), types[t].block_bytes, &n) || n > SIZE_MAX)
        return 0;
    return (size_t)n;
}

void dfl_tensors_free(dfl_tensors *ts) {
    if (!ts) return;
    for (int i = 0; i < ts->n; i++) free(ts->t[i].name);
    free(ts->t);
    for (int i = 0; i < ts->n_maps; i++)
        if (ts->maps[i].addr) munmap(ts->maps[i].addr, ts->maps[i].len);
    free(ts->maps);
    free(ts->source);
    memset(ts, 0, sizeof *ts);
}

dfl_tensor *dfl_tensors_find(dfl_tensors *ts, const char *name) {
    if (!ts || !name) return NULL;
    for (int i = 0; i < ts->n; i++)
        if (strcmp(ts->t[i].name, name) == 0) return &ts->t[i];
    return NULL;
}

/* ---- helpers for the loaders (io_private.h) ----------------------------- */

dfl_tensor *dfl_tensors_push(dfl_tensors *ts) {
    if ((ts->n & (ts->n - 1)) == 0) { /* n is 0 or a power of two: double */
        size_t cap = ts->n ? (size_t)ts->n * 2 : 16;
        dfl_tensor *t = realloc(ts->t, cap * sizeof *t);
        if (!t) {
            fprintf(stderr, "dflash: out of memory growing the tensor table\n");
            exit(1);
        }
        ts->t = t;
    }
    dfl_tensor *t = &ts->t[ts->n++];
    memset(t, 0, sizeof *t);
    return t;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const dfl_tensor *const *)a)->name, (*(const dfl_tensor *const *)b)->name);
}

int dfl_tensors_check_unique(const dfl_tensors *ts, const char *src, dfl_error *err) {
    if (ts->n < 2) return 0;
    const dfl_tensor **p = xmalloc((size_t)ts->n * sizeof *p);
    for (int i = 0; i < ts->n; i++) p[i] = &ts->t[i];
    qsort(p, ts->n, sizeof *p, cmp_name);
    int rc = 0;
    for (int i = 1; i < ts->n && !rc; i++)
        if (strcmp(p[i - 1]->name, p[i]->name) == 0)
            rc = dfl_fail(err, DFL_EFORMAT, "%s: tensor %s appears twice", src, p[i]->name);
    free(p);
    return rc;
}

char *dfl_name_dup(const char *s, size_t len) {
    if (memchr(s, 0, len)) return NULL;
    char *d = xmalloc(len + 1);
    memcpy(d, s, len);
    d[len] = 0;
    return d;
}

int dfl_map_file(const char *path, dfl_mapping *m, dfl_error *err) {
    m->addr = NULL;
    m->len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dfl_fail(err, DFL_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return dfl_fail(err, DFL_EIO, "%s: not a regular file", path);
    }
    if (st.st_size <= 0) {
        close(fd);
        return dfl_fail(err, DFL_EFORMAT, "%s: empty file", path);
    }
    void *a = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping stays valid */
    if (a == MAP_FAILED) return dfl_fail(err, DFL_EIO, "%s: mmap failed: %s", path, strerror(e));
    m->addr = a;
    m->len = (size_t)st.st_size;
    return 0;
}

void dfl_tensors_add_map(dfl_tensors *ts, dfl_mapping m) {
    dfl_mapping *p = realloc(ts->maps, (size_t)(ts->n_maps + 1) * sizeof *p);
    if (!p) {
        fprintf(stderr, "dflash: out of memory growing the mapping table\n");
        exit(1);
    }
    ts->maps = p;
    ts->maps[ts->n_maps++] = m;
}
