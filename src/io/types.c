/* types.c - the named-tensor table helpers. */
#define _GNU_SOURCE /* mremap */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
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

enum { HUGE_ALIGN = 2 << 20 };   /* a transparent huge page (x86-64; arm64 with 4 KB pages) */

/* len bytes of anonymous address space mapped prot, starting at a HUGE_ALIGN
 * boundary, or MAP_FAILED. Aligned, a range can be backed by huge pages, and
 * keeps them when dfl_tensors_copy_maps moves a copy onto a file's range. */
static char *reserve_aligned(size_t len, int prot) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), end = (len + pg - 1) / pg * pg;
    size_t span = end + HUGE_ALIGN;
    char *r = mmap(NULL, span, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) return r;
    char *a = (char *)(((uintptr_t)r + HUGE_ALIGN - 1) & ~(uintptr_t)(HUGE_ALIGN - 1));
    if (a > r) munmap(r, (size_t)(a - r));
    if (r + span > a + end) munmap(a + end, (size_t)(r + span - (a + end)));
    return a;
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
    size_t len = (size_t)st.st_size;
    void *r = reserve_aligned(len, PROT_NONE), *a = r;
    if (r != MAP_FAILED && (a = mmap(r, len, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0)) == MAP_FAILED)
        munmap(r, len);
    int e = errno;
    close(fd); /* the mapping stays valid */
    if (a == MAP_FAILED) return dfl_fail(err, DFL_EIO, "%s: mmap failed: %s", path, strerror(e));
    m->addr = a;
    m->len = (size_t)st.st_size;
    return 0;
}

int dfl_tensors_copy_maps(dfl_tensors *ts, dfl_error *err) {
    const char *src = ts->source ? ts->source : "the weights";
    for (int i = 0; i < ts->n_maps; i++) {
        dfl_mapping *m = &ts->maps[i];
        char *a = reserve_aligned(m->len, PROT_READ | PROT_WRITE);
        if (a == MAP_FAILED)
            return dfl_fail(err, DFL_ENOMEM, "%s: no memory for the %zu MB copy --no-mmap makes "
                            "(leave it out to read the file in place)", src, m->len >> 20);
        madvise(a, m->len, MADV_HUGEPAGE);
        memcpy(a, m->addr, m->len);
        mprotect(a, m->len, PROT_READ);
        if (mremap(a, m->len, m->len, MREMAP_MAYMOVE | MREMAP_FIXED, m->addr) == MAP_FAILED) {
            int e = errno;
            munmap(a, m->len);
            return dfl_fail(err, DFL_EIO, "%s: cannot move the copy into place: %s", src,
                            strerror(e));
        }
    }
    return 0;
}

int dfl_tensors_protect(dfl_tensors *ts, const void *p, size_t n, int writable) {
    uintptr_t a = (uintptr_t)p, pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < ts->n_maps; i++) {
        uintptr_t m = (uintptr_t)ts->maps[i].addr;
        if (a < m || a + n > m + ts->maps[i].len) continue;
        uintptr_t lo = a & ~(pg - 1), hi = (a + n + pg - 1) & ~(pg - 1);
        int prot = PROT_READ | (writable ? PROT_WRITE : 0);
        return mprotect((void *)lo, hi - lo, prot) ? -1 : 0;
    }
    return -1;
}

/* The first number that `fmt` reads from file `path`; -1 when none. */
static double read_num(const char *path, const char *fmt) {
    FILE *f = fopen(path, "r");
    char line[128];
    double v = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, fmt, &v) == 1) break;
    if (f) fclose(f);
    return v;
}

/* Bytes this process may still take: MemAvailable of /proc/meminfo (else the
 * free pages), and no more than its cgroup's limit leaves (a container's
 * limit is not in /proc/meminfo, and a copy past it is killed), v2 or v1. */
static double mem_available(void) {
    double kb = read_num("/proc/meminfo", "MemAvailable: %lf kB");
    double v = kb >= 0 ? kb * 1024
                       : (double)sysconf(_SC_AVPHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    double max = read_num("/sys/fs/cgroup/memory.max", "%lf");   /* "max": none */
    double cur = read_num("/sys/fs/cgroup/memory.current", "%lf");
    if (max < 0 && cur < 0) { /* cgroup v1 (older hosts' containers); no limit: a huge one */
        max = read_num("/sys/fs/cgroup/memory/memory.limit_in_bytes", "%lf");
        cur = read_num("/sys/fs/cgroup/memory/memory.usage_in_bytes", "%lf");
    }
    if (max >= 0 && cur >= 0 && max - cur < v) v = max - cur;
    return v;
}

int dfl_tensors_copy_fits(const dfl_tensors *ts) {
    double bytes = 0;
    for (int i = 0; i < ts->n_maps; i++) bytes += (double)ts->maps[i].len;
    return bytes <= 0.5 * mem_available();
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
