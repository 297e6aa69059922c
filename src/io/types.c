/* types.c - the named-tensor table helpers. */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_private.h"

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

dfl_tensor *dfl_tensors_push(dfl_tensors *ts, dfl_error *err) {
    dfl_tensor *t = dfl_grow(ts->t, &ts->cap_t, (size_t)ts->n + 1, sizeof *t, "the tensor table",
                             err);
    if (!t) return NULL;
    ts->t = t;
    t = &ts->t[ts->n++];
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

int dfl_tensors_add_map(dfl_tensors *ts, dfl_mapping m, dfl_error *err) {
    dfl_mapping *p = dfl_grow(ts->maps, &ts->cap_maps, (size_t)ts->n_maps + 1, sizeof *p,
                              "the mapping table", err);
    if (!p) {
        munmap(m.addr, m.len);
        return DFL_ENOMEM;
    }
    ts->maps = p;
    ts->maps[ts->n_maps++] = m;
    return 0;
}
