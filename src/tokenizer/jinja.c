/* jinja.c - a sandboxed interpreter for the Jinja subset that chat templates
 * use, rendering as transformers' apply_chat_template does: jinja2's
 * ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loop
 * controls, plus transformers' tojson, raise_exception, strftime_now and
 * namespace. The oracle is jinja2 itself (tests/test_chat_templates.py).
 *
 * A template is untrusted input. Everything it makes lives in one arena
 * with a byte cap; evaluation counts steps against a budget; parse nesting,
 * evaluation depth and macro calls have depth limits; every string has a
 * length cap; values are JSON data, macros and a fixed set of builtins, so
 * nothing reaches files or host objects. Errors unwind with longjmp to
 * dfl_jinja_render, which frees the arena.
 *
 * Parts: arena and values; JSON in; text out (str, repr, tojson); lexer;
 * parser; evaluation; filters, tests and methods; entry. */
#define _GNU_SOURCE
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "tokenizer/jinja.h"

/* ---- arena and values -------------------------------------------------------------------- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    _Alignas(16) char data[];
} chunk;

enum { T_UNDEF, T_NONE, T_BOOL, T_INT, T_FLOAT, T_STR, T_LIST, T_DICT, T_LOOP, T_MACRO, T_FUNC,
       T_METH };
/* sub-kinds: a tuple or (jinja2's filters return them) a generator of a list; a namespace
 * dict; a Markup string (|safe); an undefined for an unsafe attribute */
enum { SUB_TUPLE = 1, SUB_GEN = 2, SUB_NS = 1, SUB_MARKUP = 1, SUB_UNSAFE = 1 };

typedef struct jv jv;
typedef struct node node;
typedef struct jlist { jv *v; size_t n, cap; } jlist;
typedef struct jdict { jv *k, *v; size_t n, cap; } jdict;
typedef struct jloop { size_t i, n; const jv *items; } jloop;
typedef struct jmeth { jv *obj; const char *name; } jmeth;

/* A value. Strings are byte slices (not NUL-terminated); an undefined keeps
 * the message jinja2 would raise when it is used. */
struct jv {
    uint8_t t, sub;
    size_t n;
    union {
        int64_t i;
        double f;
        const char *s;
        jlist *l;
        jdict *d;
        jloop *lp;
        const node *m;
        jmeth *me;
    } u;
};

typedef struct sb { char *p; size_t n, cap; } sb; /* a growing string */

typedef struct frame {
    struct frame *up;
    jdict vars;
} frame;

typedef struct tok tok;

typedef struct J {
    jmp_buf jb;
    dfl_error *err;
    chunk *ch;
    size_t mem, max_mem, max_out;
    uint64_t steps, max_steps;
    int depth, line, col, in_macro;
    int64_t now;
    tok *toks;
    size_t nt, ti;
    int soft, loops; /* parser: inside an if/conditional (unknown filters are runtime errors); loop depth */
    frame *globals, *fr; /* the render's variables; the innermost scope */
    sb *out;
} J;

enum { MAX_DEPTH = 200, MAX_MACRO_DEPTH = 100, MAX_RANGE = 100000 };

__attribute__((noreturn, format(printf, 2, 3))) static void fail(J *j, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dfl_fail(j->err, DFL_EARG, "chat template line %d col %d: %s", j->line, j->col, msg);
    longjmp(j->jb, 1);
}

static void *alloc(J *j, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!j->ch || j->ch->cap - j->ch->used < n) {
        size_t c = n > 65536 ? n : 65536;
        if (j->mem + c > j->max_mem)
            fail(j, "the template needs more than %zu MiB of memory", j->max_mem >> 20);
        chunk *k = malloc(sizeof *k + c);
        if (!k) fail(j, "out of memory");
        k->next = j->ch, k->used = 0, k->cap = c;
        j->ch = k;
        j->mem += c;
    }
    void *p = j->ch->data + j->ch->used;
    j->ch->used += n;
    return p;
}

static void step(J *j) {
    if (++j->steps > j->max_steps)
        fail(j, "the template ran past its budget of %llu steps", (unsigned long long)j->max_steps);
}

static void sb_put(J *j, sb *b, const char *s, size_t n) {
    if (!n) return;
    if (b->n + n > b->cap) {
        if (b->n + n > j->max_out) fail(j, "text longer than %zu bytes", j->max_out);
        size_t c = b->cap ? b->cap * 2 : 64;
        while (c < b->n + n) c *= 2;
        char *p = alloc(j, c);
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p, b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void sb_puts(J *j, sb *b, const char *s) { sb_put(j, b, s, strlen(s)); }
static void sb_printf(J *j, sb *b, const char *fmt, ...) {
    char t[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    sb_put(j, b, t, (size_t)n < sizeof t ? (size_t)n : sizeof t - 1);
}

static const jv UNDEF = {T_UNDEF, 0, 0, {0}}, NONE = {T_NONE, 0, 0, {0}};
static jv mk_bool(int b) { return (jv){T_BOOL, 0, 0, {.i = !!b}}; }
static jv mk_int(int64_t i) { return (jv){T_INT, 0, 0, {.i = i}}; }
static jv mk_float(double f) { return (jv){T_FLOAT, 0, 0, {.f = f}}; }
static jv mk_str(const char *s, size_t n) { return (jv){T_STR, 0, n, {.s = s}}; }
static jv mk_cstr(const char *s) { return mk_str(s, strlen(s)); }
static jv sb_val(sb *b) { return mk_str(b->p ? b->p : "", b->n); }
static jv str_dup(J *j, const char *s, size_t n) {
    char *p = alloc(j, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return mk_str(p, n);
}
/* An undefined value carrying jinja2's message for when it is used. */
static jv undef_msg(J *j, const char *fmt, const char *a, size_t an, const char *b, size_t bn) {
    char t[300];
    int n = snprintf(t, sizeof t, fmt, (int)(an > 100 ? 100 : an), a, (int)(bn > 100 ? 100 : bn), b);
    jv v = str_dup(j, t, (size_t)n < sizeof t ? (size_t)n : sizeof t - 1);
    v.t = T_UNDEF;
    return v;
}

static jv mk_list(J *j, size_t cap, int tuple) {
    jlist *l = alloc(j, sizeof *l);
    l->n = 0, l->cap = cap;
    l->v = cap ? alloc(j, cap * sizeof(jv)) : NULL;
    return (jv){T_LIST, (uint8_t)tuple, 0, {.l = l}};
}
static void list_push(J *j, jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t c = l->cap ? l->cap * 2 : 4;
        jv *p = alloc(j, c * sizeof(jv));
        if (l->n) memcpy(p, l->v, l->n * sizeof(jv));
        l->v = p, l->cap = c;
    }
    l->v[l->n++] = v;
}
static jv mk_dict(J *j) {
    jdict *d = alloc(j, sizeof *d);
    memset(d, 0, sizeof *d);
    return (jv){T_DICT, 0, 0, {.d = d}};
}

static int eq(const jv *a, const jv *b);

static jv *dict_find(jdict *d, const jv *k) {
    for (size_t i = 0; i < d->n; i++)
        if (eq(&d->k[i], k)) return &d->v[i];
    return NULL;
}
static jv *dict_get(jdict *d, const char *s, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == T_STR && d->k[i].n == n && !memcmp(d->k[i].u.s, s, n)) return &d->v[i];
    return NULL;
}
static void dict_set(J *j, jdict *d, jv k, jv v) {
    jv *p = dict_find(d, &k);
    if (p) {
        *p = v;
        return;
    }
    if (d->n == d->cap) {
        size_t c = d->cap ? d->cap * 2 : 4;
        jv *nk = alloc(j, c * sizeof(jv)), *nv = alloc(j, c * sizeof(jv));
        if (d->n) memcpy(nk, d->k, d->n * sizeof(jv)), memcpy(nv, d->v, d->n * sizeof(jv));
        d->k = nk, d->v = nv, d->cap = c;
    }
    d->k[d->n] = k, d->v[d->n++] = v;
}

static int is_num(const jv *v) { return v->t == T_INT || v->t == T_FLOAT || v->t == T_BOOL; }
static double num(const jv *v) { return v->t == T_FLOAT ? v->u.f : (double)v->u.i; }

static int truthy(const jv *v) {
    switch (v->t) {
    case T_UNDEF: case T_NONE: return 0;
    case T_BOOL: case T_INT: return v->u.i != 0;
    case T_FLOAT: return v->u.f != 0;
    case T_STR: return v->n != 0;
    case T_LIST: return v->sub == SUB_GEN || v->u.l->n != 0;
    case T_DICT: return v->sub == SUB_NS || v->u.d->n != 0;
    default: return 1;
    }
}

static int eq(const jv *a, const jv *b) {
    if (is_num(a) && is_num(b)) {
        if (a->t != T_FLOAT && b->t != T_FLOAT) return a->u.i == b->u.i;
        return num(a) == num(b);
    }
    if (a->t != b->t) return 0;
    switch (a->t) {
    case T_UNDEF: case T_NONE: return 1;
    case T_STR: return a->n == b->n && !memcmp(a->u.s, b->u.s, a->n);
    case T_LIST:
        if (a->sub == SUB_GEN || b->sub == SUB_GEN) return a->u.l == b->u.l;
        if (a->sub != b->sub || a->u.l->n != b->u.l->n) return 0;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!eq(&a->u.l->v[i], &b->u.l->v[i])) return 0;
        return 1;
    case T_DICT:
        if (a->sub || b->sub) return a->u.d == b->u.d;
        if (a->u.d->n != b->u.d->n) return 0;
        for (size_t i = 0; i < a->u.d->n; i++) {
            jv *o = dict_find(b->u.d, &a->u.d->k[i]);
            if (!o || !eq(&a->u.d->v[i], o)) return 0;
        }
        return 1;
    case T_MACRO: return a->u.m == b->u.m;
    default: return a->u.i == b->u.i;
    }
}

static const char *type_name(const jv *v) {
    static const char *const n[] = {"Undefined", "NoneType", "bool", "int", "float", "str",
                                    "list", "dict", "LoopContext", "Macro", "function", "method"};
    if (v->t == T_LIST && v->sub) return v->sub == SUB_TUPLE ? "tuple" : "generator";
    if (v->t == T_DICT && v->sub == SUB_NS) return "Namespace";
    return n[v->t];
}

static void use_undef(J *j, const jv *v) {
    if (v->t == T_UNDEF) fail(j, "%.*s", (int)v->n, v->n ? v->u.s : "undefined value");
}

/* ---- UTF-8 and Python string helpers ----------------------------------------------------- */

static size_t cp_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xc0) != 0x80;
    return c;
}
static size_t cp_len(const char *s, size_t n) { /* bytes of the character at s */
    size_t i = 1;
    while (i < n && ((unsigned char)s[i] & 0xc0) == 0x80) i++;
    return i;
}

/* Length of the whitespace character at s (Python's str.isspace), 0 if none. */
static int ws_len(const char *p, size_t n) {
    const unsigned char *s = (const unsigned char *)p;
    if (!n) return 0;
    if (s[0] == ' ' || (s[0] >= '\t' && s[0] <= '\r') || (s[0] >= 0x1c && s[0] <= 0x1f)) return 1;
    if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2;
    if (n < 3 || (s[0] & 0xf0) != 0xe0) return 0;
    uint32_t cp = (uint32_t)(s[0] & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
    return cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
                   cp == 0x202f || cp == 0x205f || cp == 0x3000
               ? 3
               : 0;
}
/* Whitespace character ending at s+n, its length (0 if none). */
static int ws_len_back(const char *s, size_t n) {
    size_t k = n;
    while (k && ((unsigned char)s[k - 1] & 0xc0) == 0x80) k--;
    if (!k) return 0;
    k--;
    int l = ws_len(s + k, n - k);
    return l && k + (size_t)l == n ? l : 0;
}
/* Whether the character at s (len l) is in chars. */
static int in_chars(const char *s, size_t l, const jv *chars) {
    for (size_t i = 0; i < chars->n;) {
        size_t cl = cp_len(chars->u.s + i, chars->n - i);
        if (cl == l && !memcmp(chars->u.s + i, s, l)) return 1;
        i += cl;
    }
    return 0;
}
/* Python's strip/lstrip/rstrip; chars NULL: whitespace. */
static jv strip(jv s, const jv *chars, int left, int right) {
    const char *p = s.u.s;
    size_t n = s.n;
    while (left && n) {
        size_t l = chars ? cp_len(p, n) : (size_t)ws_len(p, n);
        if (!l || (chars && !in_chars(p, l, chars))) break;
        p += l, n -= l;
    }
    while (right && n) {
        size_t l;
        if (chars) {
            size_t k = n;
            while (k && ((unsigned char)p[k - 1] & 0xc0) == 0x80) k--;
            k = k ? k - 1 : 0;
            l = n - k;
            if (!in_chars(p + k, l, chars)) break;
        } else if (!(l = (size_t)ws_len_back(p, n))) {
            break;
        }
        n -= l;
    }
    return mk_str(p, n);
}

/* ---- JSON in ----------------------------------------------------------------------------- */

typedef struct jsrc { const char *s, *end; int depth; } jsrc;

static void js_ws(jsrc *r) {
    while (r->s < r->end && (*r->s == ' ' || *r->s == '\t' || *r->s == '\n' || *r->s == '\r')) r->s++;
}
static void utf8_put(J *j, sb *b, uint32_t c) {
    char t[4];
    size_t n;
    if (c < 0x80) t[0] = (char)c, n = 1;
    else if (c < 0x800) t[0] = (char)(0xc0 | c >> 6), t[1] = (char)(0x80 | (c & 63)), n = 2;
    else if (c < 0x10000)
        t[0] = (char)(0xe0 | c >> 12), t[1] = (char)(0x80 | (c >> 6 & 63)), t[2] = (char)(0x80 | (c & 63)), n = 3;
    else
        t[0] = (char)(0xf0 | c >> 18), t[1] = (char)(0x80 | (c >> 12 & 63)),
        t[2] = (char)(0x80 | (c >> 6 & 63)), t[3] = (char)(0x80 | (c & 63)), n = 4;
    sb_put(j, b, t, n);
}
static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}
static uint32_t hexn(const char *s, const char *end, int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; i++) {
        int h = s + i < end ? hexval((unsigned char)s[i]) : -1;
        if (h < 0) return UINT32_MAX;
        v = v << 4 | (uint32_t)h;
    }
    return v;
}

static jv js_value(J *j, jsrc *r);

static jv js_string(J *j, jsrc *r) {
    sb b = {0};
    r->s++;
    for (;;) {
        if (r->s >= r->end) fail(j, "JSON input: unterminated string");
        char c = *r->s++;
        if (c == '"') break;
        if (c != '\\') {
            sb_put(j, &b, &c, 1);
            continue;
        }
        if (r->s >= r->end) fail(j, "JSON input: bad escape");
        c = *r->s++;
        const char *m = strchr("\"\"\\\\//b\bf\fn\nr\rt\t", c);
        if (c && m && (m - "\"\"\\\\//b\bf\fn\nr\rt\t") % 2 == 0) {
            sb_put(j, &b, m + 1, 1);
        } else if (c == 'u') {
            uint32_t u = hexn(r->s, r->end, 4);
            if (u == UINT32_MAX) fail(j, "JSON input: bad \\u escape");
            r->s += 4;
            if (u >= 0xd800 && u < 0xdc00 && r->end - r->s >= 6 && r->s[0] == '\\' && r->s[1] == 'u') {
                uint32_t lo = hexn(r->s + 2, r->end, 4);
                if (lo >= 0xdc00 && lo < 0xe000) u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00), r->s += 6;
            }
            utf8_put(j, &b, u);
        } else {
            fail(j, "JSON input: bad escape");
        }
    }
    return sb_val(&b);
}

static jv js_value(J *j, jsrc *r) {
    js_ws(r);
    if (r->s >= r->end) fail(j, "JSON input ends early");
    if (++r->depth > MAX_DEPTH) fail(j, "JSON input nests too deep");
    jv v;
    char c = *r->s;
    if (c == '"') {
        v = js_string(j, r);
    } else if (c == '[' || c == '{') {
        v = c == '[' ? mk_list(j, 0, 0) : mk_dict(j);
        r->s++;
        js_ws(r);
        if (r->s < r->end && *r->s == (c == '[' ? ']' : '}')) {
            r->s++;
        } else {
            for (;;) {
                if (c == '[') {
                    list_push(j, v.u.l, js_value(j, r));
                } else {
                    js_ws(r);
                    if (r->s >= r->end || *r->s != '"') fail(j, "JSON input: expected a key");
                    jv k = js_string(j, r);
                    js_ws(r);
                    if (r->s >= r->end || *r->s++ != ':') fail(j, "JSON input: expected ':'");
                    dict_set(j, v.u.d, k, js_value(j, r));
                }
                js_ws(r);
                if (r->s < r->end && *r->s == ',') {
                    r->s++;
                    continue;
                }
                if (r->s < r->end && *r->s == (c == '[' ? ']' : '}')) {
                    r->s++;
                    break;
                }
                fail(j, "JSON input: expected ',' or a closing bracket");
            }
        }
    } else if (!strncmp(r->s, "true", 4) || !strncmp(r->s, "false", 5)) {
        v = mk_bool(c == 't');
        r->s += c == 't' ? 4 : 5;
    } else if (!strncmp(r->s, "null", 4)) {
        v = NONE;
        r->s += 4;
    } else {
        const char *e = r->s;
        int flt = 0;
        while (e < r->end && strchr("+-0123456789.eE", *e)) flt |= *e == '.' || *e == 'e' || *e == 'E', e++;
        if (e == r->s) fail(j, "JSON input: unexpected '%c'", c);
        char t[64];
        size_t n = (size_t)(e - r->s) < sizeof t - 1 ? (size_t)(e - r->s) : sizeof t - 1;
        memcpy(t, r->s, n);
        t[n] = 0;
        char *te;
        long long i = flt ? 0 : strtoll(t, &te, 10);
        v = flt || *te || i == LLONG_MAX || i == LLONG_MIN ? mk_float(strtod(t, NULL)) : mk_int(i);
        r->s = e;
    }
    r->depth--;
    return v;
}

static jv json_parse(J *j, const char *s) {
    jsrc r = {s, s + strlen(s), 0};
    jv v = js_value(j, &r);
    js_ws(&r);
    if (r.s != r.end) fail(j, "JSON input: text after the value");
    return v;
}

/* ---- text out: str(), repr(), json.dumps() ---------------------------------------------- */

/* Python's repr of a float (the shortest text that reads back the same). */
static void put_float(J *j, sb *b, double f, int json) {
    if (isnan(f)) return sb_puts(j, b, json ? "NaN" : "nan");
    if (isinf(f)) return sb_puts(j, b, f > 0 ? (json ? "Infinity" : "inf") : (json ? "-Infinity" : "-inf"));
    char t[40];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(t, sizeof t, "%.*e", p - 1, f);
        if (strtod(t, NULL) == f) break;
    }
    snprintf(t, sizeof t, "%.*e", p - 1, f);
    char digits[20];
    int nd = 0, neg = t[0] == '-';
    const char *q = t + neg;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int exp = atoi(q + 1), decpt = exp + 1;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg) sb_put(j, b, "-", 1);
    if (decpt > 16 || decpt < -3) { /* d.ddde+XX */
        sb_put(j, b, digits, 1);
        if (nd > 1) sb_put(j, b, ".", 1), sb_put(j, b, digits + 1, (size_t)nd - 1);
        sb_printf(j, b, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (decpt <= 0) {
        sb_put(j, b, "0.", 2);
        for (int i = 0; i < -decpt; i++) sb_put(j, b, "0", 1);
        sb_put(j, b, digits, (size_t)nd);
    } else {
        for (int i = 0; i < decpt; i++) sb_put(j, b, i < nd ? digits + i : "0", 1);
        sb_put(j, b, ".", 1);
        if (nd > decpt) sb_put(j, b, digits + decpt, (size_t)(nd - decpt));
        else sb_put(j, b, "0", 1);
    }
}

static void put_repr(J *j, sb *b, const jv *v);

static void put_str_repr(J *j, sb *b, const jv *v) {
    int sq = memchr(v->u.s, '\'', v->n) != NULL, dq = memchr(v->u.s, '"', v->n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    sb_put(j, b, &q, 1);
    for (size_t i = 0; i < v->n; i++) {
        unsigned char c = (unsigned char)v->u.s[i];
        if (c == '\\' || c == (unsigned char)q) sb_put(j, b, "\\", 1), sb_put(j, b, (char *)&c, 1);
        else if (c == '\n') sb_puts(j, b, "\\n");
        else if (c == '\r') sb_puts(j, b, "\\r");
        else if (c == '\t') sb_puts(j, b, "\\t");
        else if (c < 0x20 || c == 0x7f) sb_printf(j, b, "\\x%02x", c);
        else sb_put(j, b, (char *)&c, 1);
    }
    sb_put(j, b, &q, 1);
}

/* Python's str(): what {{ v }} prints. */
static void put_str(J *j, sb *b, const jv *v) {
    switch (v->t) {
    case T_UNDEF: return;
    case T_STR: return sb_put(j, b, v->u.s, v->n);
    case T_LOOP: return sb_puts(j, b, "<LoopContext>");
    case T_MACRO: return sb_puts(j, b, "<Macro>");
    case T_FUNC: case T_METH: return sb_puts(j, b, "<built-in method>");
    default: return put_repr(j, b, v);
    }
}

static void put_repr(J *j, sb *b, const jv *v) {
    step(j);
    switch (v->t) {
    case T_NONE: sb_puts(j, b, "None"); break;
    case T_BOOL: sb_puts(j, b, v->u.i ? "True" : "False"); break;
    case T_INT: sb_printf(j, b, "%lld", (long long)v->u.i); break;
    case T_FLOAT: put_float(j, b, v->u.f, 0); break;
    case T_STR: put_str_repr(j, b, v); break;
    case T_LIST: {
        if (v->sub == SUB_GEN) return sb_puts(j, b, "<generator object>");
        int tup = v->sub == SUB_TUPLE;
        sb_puts(j, b, tup ? "(" : "[");
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i) sb_puts(j, b, ", ");
            put_repr(j, b, &v->u.l->v[i]);
        }
        sb_puts(j, b, tup ? (v->u.l->n == 1 ? ",)" : ")") : "]");
        break;
    }
    case T_DICT:
        if (v->sub == SUB_NS) sb_puts(j, b, "<Namespace ");
        sb_puts(j, b, "{");
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i) sb_puts(j, b, ", ");
            put_repr(j, b, &v->u.d->k[i]);
            sb_puts(j, b, ": ");
            put_repr(j, b, &v->u.d->v[i]);
        }
        sb_puts(j, b, v->sub == SUB_NS ? "}>" : "}");
        break;
    default: put_str(j, b, v); break;
    }
}

static jv to_str(J *j, const jv *v) {
    if (v->t == T_STR) return *v;
    sb b = {0};
    put_str(j, &b, v);
    return sb_val(&b);
}

typedef struct json_opts { const char *indent; size_t indent_n; int has_indent, sort_keys;
                           jv item_sep, key_sep; } json_opts;

static void json_str(J *j, sb *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    sb_put(j, b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        sb_put(j, b, s + run, i - run);
        run = i + 1;
        const char *e = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                      : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        if (e) {
            sb_puts(j, b, e);
        } else {
            char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            sb_put(j, b, u, 6);
        }
    }
    sb_put(j, b, s + run, n - run);
    sb_put(j, b, "\"", 1);
}

static int cmp(J *j, const jv *a, const jv *b);

static void json_nl(J *j, sb *b, const json_opts *o, int level) {
    sb_put(j, b, "\n", 1);
    for (int i = 0; i < level; i++) sb_put(j, b, o->indent, o->indent_n);
}

static void put_json(J *j, sb *b, const jv *v, const json_opts *o, int level) {
    step(j);
    if (level > MAX_DEPTH) fail(j, "tojson: the value nests too deep");
    switch (v->t) {
    case T_NONE: sb_puts(j, b, "null"); return;
    case T_BOOL: sb_puts(j, b, v->u.i ? "true" : "false"); return;
    case T_INT: sb_printf(j, b, "%lld", (long long)v->u.i); return;
    case T_FLOAT: put_float(j, b, v->u.f, 1); return;
    case T_STR: json_str(j, b, v->u.s, v->n); return;
    case T_LIST: {
        jlist *l = v->u.l;
        if (v->sub == SUB_GEN) break;
        if (!l->n) return sb_puts(j, b, "[]");
        sb_put(j, b, "[", 1);
        for (size_t i = 0; i < l->n; i++) {
            if (i) sb_put(j, b, o->item_sep.u.s, o->item_sep.n);
            if (o->has_indent) json_nl(j, b, o, level + 1);
            put_json(j, b, &l->v[i], o, level + 1);
        }
        if (o->has_indent) json_nl(j, b, o, level);
        sb_put(j, b, "]", 1);
        return;
    }
    case T_DICT: {
        if (v->sub == SUB_NS) break;
        jdict *d = v->u.d;
        if (!d->n) return sb_puts(j, b, "{}");
        size_t *ord = alloc(j, d->n * sizeof *ord);
        for (size_t i = 0; i < d->n; i++) ord[i] = i;
        for (size_t i = 1; o->sort_keys && i < d->n; i++) /* insertion sort: stable, small dicts */
            for (size_t k = i; k && cmp(j, &d->k[ord[k - 1]], &d->k[ord[k]]) > 0; k--) {
                size_t t = ord[k];
                ord[k] = ord[k - 1], ord[k - 1] = t;
            }
        sb_put(j, b, "{", 1);
        for (size_t i = 0; i < d->n; i++) {
            const jv *k = &d->k[ord[i]];
            if (i) sb_put(j, b, o->item_sep.u.s, o->item_sep.n);
            if (o->has_indent) json_nl(j, b, o, level + 1);
            if (k->t == T_STR) {
                json_str(j, b, k->u.s, k->n);
            } else if (k->t == T_NONE || k->t == T_BOOL || k->t == T_INT || k->t == T_FLOAT) {
                sb_put(j, b, "\"", 1);
                put_json(j, b, k, o, level);
                sb_put(j, b, "\"", 1);
            } else {
                fail(j, "keys must be str, int, float, bool or None, not %s", type_name(k));
            }
            sb_put(j, b, o->key_sep.u.s, o->key_sep.n);
            put_json(j, b, &d->v[ord[i]], o, level + 1);
        }
        if (o->has_indent) json_nl(j, b, o, level);
        sb_put(j, b, "}", 1);
        return;
    }
    default: break;
    }
    fail(j, "Object of type %s is not JSON serializable", type_name(v));
}

/* ---- lexer ------------------------------------------------------------------------------- */

enum { K_TEXT, K_VBEG, K_VEND, K_BBEG, K_BEND, K_NAME, K_STR, K_INT, K_FLOAT, K_OP, K_EOF };

struct tok {
    uint8_t k;
    const char *s; /* K_TEXT, K_STR: the text (decoded); K_NAME, K_OP: the source */
    size_t n;
    int64_t i;
    double f;
    int line, col;
};

typedef struct lexer {
    J *j;
    const char *src;
    size_t n, p, lp; /* lp: where line/col were last computed */
    int line, col;
} lexer;

static void lx_at(lexer *x, size_t to) { /* line and column of offset to */
    for (; x->lp < to; x->lp++) {
        if (x->src[x->lp] == '\n') x->line++, x->col = 1;
        else if (((unsigned char)x->src[x->lp] & 0xc0) != 0x80) x->col++;
    }
    x->j->line = x->line, x->j->col = x->col;
}

static tok *lx_push(lexer *x, int k, const char *s, size_t n, size_t at) {
    J *j = x->j;
    if (j->nt % 256 == 0) {
        tok *t = alloc(j, (j->nt + 256) * sizeof(tok));
        if (j->nt) memcpy(t, j->toks, j->nt * sizeof(tok));
        j->toks = t;
    }
    lx_at(x, at);
    tok *t = &j->toks[j->nt++];
    *t = (tok){(uint8_t)k, s, n, 0, 0, x->line, x->col};
    return t;
}

static int is_sp(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static int is_id(char c, int first) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (!first && c >= '0' && c <= '9');
}

/* A string literal, decoded as Python's unicode-escape does. */
static void lx_string(lexer *x) {
    J *j = x->j;
    char q = x->src[x->p];
    size_t at = x->p++;
    sb b = {0};
    for (;;) {
        if (x->p >= x->n) lx_at(x, at), fail(j, "unterminated string");
        char c = x->src[x->p++];
        if (c == q) break;
        if (c != '\\') {
            sb_put(j, &b, &c, 1);
            continue;
        }
        if (x->p >= x->n) continue;
        c = x->src[x->p++];
        uint32_t u;
        int w = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
        const char *m = c ? strchr("n\nt\tr\rb\bf\fv\va\a\\\\''\"\"", c) : NULL;
        if (c == '\n') continue; /* a backslash-newline is a line continuation */
        if (m && (m - "n\nt\tr\rb\bf\fv\va\a\\\\''\"\"") % 2 == 0) {
            sb_put(j, &b, m + 1, 1);
        } else if (c >= '0' && c <= '7') {
            u = (uint32_t)(c - '0');
            for (int k = 0; k < 2 && x->p < x->n && x->src[x->p] >= '0' && x->src[x->p] <= '7'; k++)
                u = u * 8 + (uint32_t)(x->src[x->p++] - '0');
            utf8_put(j, &b, u);
        } else if (w) {
            u = hexn(x->src + x->p, x->src + x->n, w);
            if (u == UINT32_MAX || u > 0x10ffff) lx_at(x, at), fail(j, "bad \\%c escape in a string", c);
            x->p += (size_t)w;
            utf8_put(j, &b, u);
        } else {
            sb_put(j, &b, "\\", 1), sb_put(j, &b, &c, 1);
        }
    }
    lx_push(x, K_STR, b.p ? b.p : "", b.n, at);
}

/* The tokens of one {{ }} or {% %} up to and past its end (whitespace control, trim_blocks). */
static void lx_tag(lexer *x, int block) {
    J *j = x->j;
    int bal = 0;
    for (;;) {
        while (x->p < x->n && is_sp(x->src[x->p])) x->p++;
        if (x->p >= x->n) lx_at(x, x->p), fail(j, "unexpected end of template: a tag is not closed");
        const char *s = x->src + x->p;
        size_t left = x->n - x->p;
        char e = block ? '%' : '}';
        if (!bal) {
            int sign = (s[0] == '-' || s[0] == '+') && left >= 3 && s[1] == e && s[2] == '}';
            if (sign || (left >= 2 && s[0] == e && s[1] == '}')) {
                lx_push(x, block ? K_BEND : K_VEND, s, 0, x->p);
                x->p += sign ? 3 : 2;
                if (s[0] == '-') {
                    while (x->p < x->n && is_sp(x->src[x->p])) x->p++;
                } else if (block && s[0] != '+' && x->p < x->n && x->src[x->p] == '\n') {
                    x->p++; /* trim_blocks */
                }
                return;
            }
        }
        if (is_id(s[0], 1)) {
            size_t k = 1;
            while (k < left && is_id(s[k], 0)) k++;
            lx_push(x, K_NAME, s, k, x->p);
            x->p += k;
        } else if (s[0] >= '0' && s[0] <= '9') {
            char t[64];
            size_t k = 0, m = 0;
            int flt = 0;
            for (; k < left && m < sizeof t - 1; k++) {
                char c = s[k];
                if (c == '_') continue;
                if (c >= '0' && c <= '9') t[m++] = c;
                else if (c == '.' && !flt && k + 1 < left && s[k + 1] >= '0' && s[k + 1] <= '9') t[m++] = c, flt = 1;
                else if ((c == 'e' || c == 'E') && k + 1 < left &&
                         ((s[k + 1] >= '0' && s[k + 1] <= '9') || s[k + 1] == '+' || s[k + 1] == '-'))
                    t[m++] = c, t[m++] = s[++k], flt = 2;
                else break;
            }
            t[m] = 0;
            tok *tk = lx_push(x, flt ? K_FLOAT : K_INT, s, k, x->p);
            if (flt) tk->f = strtod(t, NULL);
            else tk->i = strtoll(t, NULL, 10);
            x->p += k;
        } else if (s[0] == '"' || s[0] == '\'') {
            lx_string(x);
        } else {
            static const char *const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/",
                                              "%", "~", "(", ")", "[", "]", "{", "}", ",", ".", ":",
                                              "|", "=", "<", ">", ";"};
            size_t k = 0;
            for (size_t o = 0; o < sizeof ops / sizeof *ops && !k; o++)
                if (!strncmp(s, ops[o], strlen(ops[o]))) k = strlen(ops[o]);
            if (!k) lx_at(x, x->p), fail(j, "unexpected character '%c'", s[0]);
            if (strchr("([{", s[0])) bal++;
            else if (strchr(")]}", s[0]) && bal) bal--;
            lx_push(x, K_OP, s, k, x->p);
            x->p += k;
        }
    }
}

static int lx_ws_only(const char *s, size_t n) { /* spaces and tabs only, at least one */
    for (size_t i = 0; i < n; i++)
        if (!is_sp(s[i]) || s[i] == '\n') return 0;
    return n > 0;
}

static void lex(J *j, const char *src, size_t n) {
    lexer x = {j, src, n, 0, 0, 1, 1};
    int line_start = 1;
    while (x.p < n) {
        size_t q = x.p;
        int kind = 0;
        for (; q + 1 < n; q++)
            if (src[q] == '{' && (src[q + 1] == '{' || src[q + 1] == '%' || src[q + 1] == '#')) {
                kind = src[q + 1];
                break;
            }
        if (!kind) {
            lx_push(&x, K_TEXT, src + x.p, n - x.p, x.p);
            break;
        }
        char sign = q + 2 < n && (src[q + 2] == '-' || src[q + 2] == '+') ? src[q + 2] : 0;
        size_t te = q;
        if (sign == '-') {
            while (te > x.p && is_sp(src[te - 1])) te--;
        } else if (sign != '+' && kind != '{') { /* lstrip_blocks */
            size_t l = te;
            while (l > x.p && src[l - 1] != '\n') l--;
            if ((l > x.p || line_start) && lx_ws_only(src + l, te - l)) te = l;
        }
        if (te > x.p) lx_push(&x, K_TEXT, src + x.p, te - x.p, x.p);
        x.p = q + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            const char *e = memmem(src + x.p, n - x.p, "#}", 2);
            if (!e) lx_at(&x, q), fail(j, "unclosed comment");
            int strip = e > src + x.p && e[-1] == '-';
            x.p = (size_t)(e - src) + 2;
            if (strip) while (x.p < n && is_sp(src[x.p])) x.p++;
            else if (x.p < n && src[x.p] == '\n') x.p++;
            line_start = src[x.p - 1] == '\n';
            continue;
        }
        size_t first = j->nt;
        lx_push(&x, kind == '{' ? K_VBEG : K_BBEG, src + q, 0, q);
        lx_tag(&x, kind == '%');
        tok *t = &j->toks[first];
        if (kind == '%' && j->nt == first + 3 && t[1].k == K_NAME && t[1].n == 3 && !memcmp(t[1].s, "raw", 3)) {
            /* {% raw %}: text up to {% endraw %} */
            j->nt = first;
            size_t r = x.p;
            for (;;) {
                const char *e = memmem(src + r, n - r, "{%", 2);
                if (!e) lx_at(&x, q), fail(j, "{%% raw %%} without {%% endraw %%}");
                size_t k = (size_t)(e - src) + 2, k0 = k;
                int strip = k < n && src[k] == '-';
                if (k < n && (src[k] == '-' || src[k] == '+')) k++;
                while (k < n && is_sp(src[k])) k++;
                if (n - k >= 6 && !memcmp(src + k, "endraw", 6)) {
                    size_t body_end = (size_t)(e - src);
                    if (strip) while (body_end > x.p && is_sp(src[body_end - 1])) body_end--;
                    lx_push(&x, K_TEXT, src + x.p, body_end - x.p, x.p);
                    x.p = k + 6;
                    size_t before = j->nt;
                    lx_tag(&x, 1);
                    j->nt = before;
                    break;
                }
                r = k0;
            }
        }
        line_start = x.p > 0 && src[x.p - 1] == '\n';
    }
    lx_at(&x, n);
    lx_push(&x, K_EOF, src + n, 0, n);
}

/* ---- parser ------------------------------------------------------------------------------ */

enum {
    /* expressions */
    E_CONST, E_NAME, E_LIST, E_TUPLE, E_DICT, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_KW, E_FILTER,
    E_TEST, E_BIN, E_AND, E_OR, E_NOT, E_NEG, E_POS, E_COND,
    /* statements */
    S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_MACRO, S_FILTER, S_BREAK, S_CONT, S_SEQ,
};
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_POW, OP_CAT, OP_EQ, OP_NE, OP_LT, OP_LE,
       OP_GT, OP_GE, OP_IN, OP_NOTIN };

struct node {
    uint8_t k, op;
    int line, col;
    node *a, *b, *c, *d, *e;
    node **args;
    int nargs;
    jv v;
    node *next; /* statements: the next one */
};

static tok *cur(J *j) { return &j->toks[j->ti]; }
static tok *adv(J *j) {
    tok *t = &j->toks[j->ti];
    if (t->k != K_EOF) j->ti++;
    return t;
}
static int tk_is(const tok *t, int k, const char *s) {
    return t->k == k && t->n == strlen(s) && !memcmp(t->s, s, t->n);
}
static int at_op(J *j, const char *s) { return tk_is(cur(j), K_OP, s); }
static int at_name(J *j, const char *s) { return tk_is(cur(j), K_NAME, s); }

static const char *tok_desc(const tok *t) {
    switch (t->k) {
    case K_VEND: return "end of print statement";
    case K_BEND: return "end of statement block";
    case K_EOF: return "end of template";
    case K_TEXT: return "template data";
    default: return NULL;
    }
}
__attribute__((noreturn)) static void unexpected(J *j, const char *what) {
    tok *t = cur(j);
    j->line = t->line, j->col = t->col;
    const char *d = tok_desc(t);
    if (d) fail(j, "expected %s, got '%s'", what, d);
    fail(j, "expected %s, got '%.*s'", what, (int)(t->n > 40 ? 40 : t->n), t->s);
}
static void expect_op(J *j, const char *s) {
    if (!at_op(j, s)) {
        char w[8];
        snprintf(w, sizeof w, "'%s'", s);
        unexpected(j, w);
    }
    adv(j);
}
static void expect_end(J *j) {
    if (cur(j)->k != K_BEND) unexpected(j, "end of statement block");
    adv(j);
}

static node *mk_node(J *j, int k, const tok *at) {
    node *n = alloc(j, sizeof *n);
    memset(n, 0, sizeof *n);
    n->k = (uint8_t)k;
    n->line = at->line, n->col = at->col;
    return n;
}
static void add_arg(J *j, node *n, node *a) {
    if (!(n->nargs & (n->nargs - 1)) || !n->nargs) {
        node **p = alloc(j, (size_t)(n->nargs ? n->nargs * 2 : 1) * sizeof *p);
        if (n->nargs) memcpy(p, n->args, (size_t)n->nargs * sizeof *p);
        n->args = p;
    }
    n->args[n->nargs++] = a;
}

static node *p_expr(J *j, int no_cond);
static node *p_unary(J *j, int with_filter);
static node *p_primary(J *j);
static node *p_postfix(J *j, node *n);

static void enter(J *j) {
    if (++j->depth > MAX_DEPTH) fail(j, "the template nests deeper than %d", MAX_DEPTH);
}

static const char *const filters[] = {
    "abs", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float",
    "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min",
    "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort",
    "string", "sum", "title", "tojson", "trim", "unique", "upper", "wordcount", "batch", "center",
    "format", "striptags", "truncate", NULL};
static const char *const tests[] = {
    "defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable",
    "sequence", "boolean", "true", "false", "odd", "even", "divisibleby", "eq", "equalto", "==",
    "ne", "!=", "lt", "<", "lessthan", "le", "<=", "gt", ">", "greaterthan", "ge", ">=", "in",
    "callable", "lower", "upper", "sameas", "escaped", "filter", "test", NULL};
static int known(const char *const *names, const char *s, size_t n) {
    for (; *names; names++)
        if (strlen(*names) == n && !memcmp(*names, s, n)) return 1;
    return 0;
}

/* (args, name=value, ...) after the '(' */
static void p_call_args(J *j, node *n) {
    expect_op(j, "(");
    while (!at_op(j, ")")) {
        if (n->nargs) {
            expect_op(j, ",");
            if (at_op(j, ")")) break;
        }
        tok *t = cur(j);
        if (t->k == K_NAME && tk_is(&j->toks[j->ti + 1], K_OP, "=")) {
            node *kw = mk_node(j, E_KW, t);
            kw->v = mk_str(t->s, t->n);
            j->ti += 2;
            kw->a = p_expr(j, 0);
            add_arg(j, n, kw);
        } else {
            add_arg(j, n, p_expr(j, 0));
        }
    }
    adv(j);
}

static node *p_filter(J *j, node *operand) {
    tok *t = adv(j); /* '|' */
    if (cur(j)->k != K_NAME) unexpected(j, "a filter name");
    t = adv(j);
    node *f = mk_node(j, E_FILTER, t);
    f->a = operand;
    f->v = mk_str(t->s, t->n);
    if (!j->soft && !known(filters, t->s, t->n)) fail(j, "No filter named '%.*s'.", (int)t->n, t->s);
    if (at_op(j, "(")) p_call_args(j, f);
    return f;
}

static node *p_filter_expr(J *j, node *n) {
    for (;;) {
        if (at_op(j, "|")) {
            n = p_filter(j, n);
        } else if (at_name(j, "is")) {
            tok *t = adv(j);
            node *te = mk_node(j, E_TEST, t);
            te->a = n;
            if (at_name(j, "not")) adv(j), te->op = 1;
            if (cur(j)->k != K_NAME) unexpected(j, "a test name");
            t = adv(j);
            te->v = mk_str(t->s, t->n);
            if (!j->soft && !known(tests, t->s, t->n)) fail(j, "No test named '%.*s'.", (int)t->n, t->s);
            tok *c = cur(j);
            if (at_op(j, "(")) {
                p_call_args(j, te);
            } else if ((c->k == K_NAME || c->k == K_STR || c->k == K_INT || c->k == K_FLOAT ||
                        at_op(j, "[") || at_op(j, "{")) &&
                       !at_name(j, "else") && !at_name(j, "or") && !at_name(j, "and")) {
                if (at_name(j, "is")) fail(j, "You cannot chain multiple tests with is");
                add_arg(j, te, p_postfix(j, p_primary(j)));
            }
            n = te;
        } else if (at_op(j, "(")) {
            node *c = mk_node(j, E_CALL, cur(j));
            c->a = n;
            p_call_args(j, c);
            n = c;
        } else {
            return n;
        }
    }
}

static node *p_postfix(J *j, node *n) {
    for (;;) {
        tok *t = cur(j);
        if (at_op(j, ".")) {
            adv(j);
            tok *a = adv(j);
            node *g = mk_node(j, a->k == K_INT ? E_ITEM : E_ATTR, t);
            g->a = n;
            if (a->k == K_NAME) {
                g->v = mk_str(a->s, a->n);
            } else if (a->k == K_INT) {
                g->b = mk_node(j, E_CONST, a);
                g->b->v = mk_int(a->i);
            } else {
                j->ti--;
                unexpected(j, "an attribute name");
            }
            n = g;
        } else if (at_op(j, "[")) {
            adv(j);
            node *g = mk_node(j, E_ITEM, t);
            g->a = n;
            node *lo = at_op(j, ":") ? NULL : p_expr(j, 0);
            if (at_op(j, ":")) {
                adv(j);
                g->k = E_SLICE;
                g->b = lo;
                if (!at_op(j, "]") && !at_op(j, ":")) g->c = p_expr(j, 0);
                if (at_op(j, ":")) {
                    adv(j);
                    if (!at_op(j, "]")) g->d = p_expr(j, 0);
                }
            } else {
                g->b = lo;
            }
            expect_op(j, "]");
            n = g;
        } else if (at_op(j, "(")) {
            node *c = mk_node(j, E_CALL, t);
            c->a = n;
            p_call_args(j, c);
            n = c;
        } else {
            return n;
        }
    }
}

static node *p_primary(J *j) {
    enter(j);
    tok *t = cur(j);
    node *n;
    if (t->k == K_NAME) {
        adv(j);
        n = mk_node(j, E_CONST, t);
        if (tk_is(t, K_NAME, "true") || tk_is(t, K_NAME, "True")) n->v = mk_bool(1);
        else if (tk_is(t, K_NAME, "false") || tk_is(t, K_NAME, "False")) n->v = mk_bool(0);
        else if (tk_is(t, K_NAME, "none") || tk_is(t, K_NAME, "None")) n->v = NONE;
        else n->k = E_NAME, n->v = mk_str(t->s, t->n);
    } else if (t->k == K_STR) {
        n = mk_node(j, E_CONST, t);
        sb b = {0};
        while (cur(j)->k == K_STR) sb_put(j, &b, cur(j)->s, cur(j)->n), adv(j);
        n->v = sb_val(&b);
    } else if (t->k == K_INT || t->k == K_FLOAT) {
        adv(j);
        n = mk_node(j, E_CONST, t);
        n->v = t->k == K_INT ? mk_int(t->i) : mk_float(t->f);
    } else if (at_op(j, "(")) {
        adv(j);
        if (at_op(j, ")")) {
            adv(j);
            n = mk_node(j, E_TUPLE, t);
        } else {
            node *first = p_expr(j, 0);
            if (at_op(j, ",")) {
                n = mk_node(j, E_TUPLE, t);
                add_arg(j, n, first);
                while (at_op(j, ",")) {
                    adv(j);
                    if (at_op(j, ")")) break;
                    add_arg(j, n, p_expr(j, 0));
                }
            } else {
                n = first;
            }
            expect_op(j, ")");
        }
    } else if (at_op(j, "[") || at_op(j, "{")) {
        int dict = at_op(j, "{");
        adv(j);
        n = mk_node(j, dict ? E_DICT : E_LIST, t);
        const char *close = dict ? "}" : "]";
        while (!at_op(j, close)) {
            if (n->nargs) {
                expect_op(j, ",");
                if (at_op(j, close)) break;
            }
            add_arg(j, n, p_expr(j, 0));
            if (dict) expect_op(j, ":"), add_arg(j, n, p_expr(j, 0));
        }
        adv(j);
    } else {
        unexpected(j, "an expression");
    }
    j->depth--;
    return n;
}

static node *p_unary(J *j, int with_filter) {
    enter(j);
    tok *t = cur(j);
    node *n;
    if (at_op(j, "-") || at_op(j, "+")) {
        adv(j);
        n = mk_node(j, t->s[0] == '-' ? E_NEG : E_POS, t);
        n->a = p_unary(j, 0);
    } else {
        n = p_primary(j);
    }
    n = p_postfix(j, n);
    if (with_filter) n = p_filter_expr(j, n);
    j->depth--;
    return n;
}

static node *bin(J *j, int op, node *a, node *b, const tok *t) {
    node *n = mk_node(j, E_BIN, t);
    n->op = (uint8_t)op, n->a = a, n->b = b;
    return n;
}

static node *p_pow(J *j) {
    node *n = p_unary(j, 1);
    while (at_op(j, "**")) {
        tok *t = adv(j);
        n = bin(j, OP_POW, n, p_unary(j, 1), t);
    }
    return n;
}
static node *p_math2(J *j) {
    node *n = p_pow(j);
    for (;;) {
        int op = at_op(j, "*") ? OP_MUL : at_op(j, "/") ? OP_DIV : at_op(j, "//") ? OP_FDIV
               : at_op(j, "%") ? OP_MOD : -1;
        if (op < 0) return n;
        tok *t = adv(j);
        n = bin(j, op, n, p_pow(j), t);
    }
}
static node *p_concat(J *j) {
    node *n = p_math2(j);
    while (at_op(j, "~")) {
        tok *t = adv(j);
        n = bin(j, OP_CAT, n, p_math2(j), t);
    }
    return n;
}
static node *p_math1(J *j) {
    node *n = p_concat(j);
    while (at_op(j, "+") || at_op(j, "-")) {
        tok *t = adv(j);
        n = bin(j, t->s[0] == '+' ? OP_ADD : OP_SUB, n, p_concat(j), t);
    }
    return n;
}
static node *p_compare(J *j) {
    node *n = p_math1(j);
    for (;;) {
        static const char *const ops[] = {"==", "!=", "<", "<=", ">", ">="};
        int op = -1;
        for (int i = 0; i < 6; i++)
            if (at_op(j, ops[i])) op = OP_EQ + i;
        tok *t = cur(j);
        if (op >= 0) {
            adv(j);
        } else if (at_name(j, "in")) {
            adv(j), op = OP_IN;
        } else if (at_name(j, "not") && tk_is(&j->toks[j->ti + 1], K_NAME, "in")) {
            j->ti += 2, op = OP_NOTIN;
        } else {
            return n;
        }
        n = bin(j, op, n, p_math1(j), t);
    }
}
static node *p_not(J *j) {
    if (at_name(j, "not")) {
        enter(j);
        tok *t = adv(j);
        node *n = mk_node(j, E_NOT, t);
        n->a = p_not(j);
        j->depth--;
        return n;
    }
    return p_compare(j);
}
/* sub (kw sub)*, left-associative: `and` over `not`, `or` over `and`. */
static node *p_chain(J *j, const char *kw, int kind, node *(*sub)(J *)) {
    node *n = sub(j);
    while (at_name(j, kw)) {
        tok *t = adv(j);
        node *a = mk_node(j, kind, t);
        a->a = n, a->b = sub(j);
        n = a;
    }
    return n;
}
static node *p_and(J *j) { return p_chain(j, "and", E_AND, p_not); }
static node *p_or(J *j) { return p_chain(j, "or", E_OR, p_and); }
static node *p_expr(J *j, int no_cond) {
    enter(j);
    node *n = p_or(j);
    while (!no_cond && at_name(j, "if")) {
        tok *t = adv(j);
        node *c = mk_node(j, E_COND, t);
        int soft = j->soft;
        j->soft = 1;
        c->a = n, c->b = p_or(j);
        if (at_name(j, "else")) adv(j), c->c = p_expr(j, 0);
        j->soft = soft;
        n = c;
    }
    j->depth--;
    return n;
}
/* expr [, expr ...] (a tuple without parentheses) */
static node *p_tuple(J *j, int no_cond) {
    tok *t = cur(j);
    node *n = p_expr(j, no_cond);
    if (!at_op(j, ",")) return n;
    node *tu = mk_node(j, E_TUPLE, t);
    add_arg(j, tu, n);
    while (at_op(j, ",")) {
        adv(j);
        if (cur(j)->k == K_BEND || at_name(j, "in") || at_op(j, "=")) break;
        add_arg(j, tu, p_expr(j, no_cond));
    }
    return tu;
}
/* an assignment target: name, name.attr or name, name, ... */
static node *p_target(J *j, int attr_ok) {
    tok *t = cur(j);
    node *tu = NULL, *n = NULL;
    int paren = at_op(j, "(");
    if (paren) adv(j);
    for (;;) {
        if (cur(j)->k != K_NAME) unexpected(j, "a name");
        tok *nt = adv(j);
        n = mk_node(j, E_NAME, nt);
        n->v = mk_str(nt->s, nt->n);
        if (attr_ok && at_op(j, ".")) {
            adv(j);
            if (cur(j)->k != K_NAME) unexpected(j, "an attribute name");
            tok *a = adv(j);
            node *g = mk_node(j, E_ATTR, a);
            g->a = n, g->v = mk_str(a->s, a->n);
            return g;
        }
        if (!at_op(j, ",")) break;
        adv(j);
        if (!tu) tu = mk_node(j, E_TUPLE, t);
        add_arg(j, tu, n);
    }
    if (tu) add_arg(j, tu, n);
    if (paren) expect_op(j, ")");
    return tu ? tu : n;
}

static node *p_body(J *j, const char *const *stop, const tok *open, const char **which);

static node *p_stmt(J *j, tok *bt) {
    tok *t = cur(j);
    if (t->k != K_NAME) unexpected(j, "a statement name");
    adv(j);
    node *n;
    const char *w;
    int soft = j->soft;
    if (tk_is(t, K_NAME, "if")) {
        n = mk_node(j, S_IF, t);
        j->soft = 1;
        n->a = p_expr(j, 0);
        expect_end(j);
        static const char *const stop[] = {"elif", "else", "endif", NULL};
        node *at = n;
        for (;;) {
            at->b = p_body(j, stop, bt, &w);
            if (!strcmp(w, "elif")) {
                node *e = mk_node(j, S_IF, &j->toks[j->ti - 1]);
                e->a = p_expr(j, 0);
                expect_end(j);
                at->c = e, at = e;
                continue;
            }
            expect_end(j);
            if (!strcmp(w, "else")) {
                static const char *const stop2[] = {"endif", NULL};
                at->c = p_body(j, stop2, bt, &w);
                expect_end(j);
            }
            break;
        }
        j->soft = soft;
    } else if (tk_is(t, K_NAME, "for")) {
        n = mk_node(j, S_FOR, t);
        n->a = p_target(j, 0);
        if (!at_name(j, "in")) unexpected(j, "'in'");
        adv(j);
        n->b = p_tuple(j, 1);
        j->soft = 0;
        if (at_name(j, "if")) adv(j), n->e = p_expr(j, 0);
        if (at_name(j, "recursive")) fail(j, "recursive loops are not supported");
        expect_end(j);
        static const char *const stop[] = {"else", "endfor", NULL};
        j->loops++;
        n->c = p_body(j, stop, bt, &w);
        j->loops--;
        expect_end(j);
        if (!strcmp(w, "else")) {
            static const char *const stop2[] = {"endfor", NULL};
            n->d = p_body(j, stop2, bt, &w);
            expect_end(j);
        }
        j->soft = soft;
    } else if (tk_is(t, K_NAME, "set")) {
        n = mk_node(j, S_SET, t);
        n->a = p_target(j, 1);
        if (at_op(j, "=")) {
            adv(j);
            n->b = p_tuple(j, 0);
            expect_end(j);
        } else {
            if (n->a->k != E_NAME) unexpected(j, "'='");
            node *f = NULL;
            while (at_op(j, "|")) f = p_filter(j, f);
            expect_end(j);
            static const char *const stop[] = {"endset", NULL};
            n->c = p_body(j, stop, bt, &w);
            n->d = f;
            expect_end(j);
        }
    } else if (tk_is(t, K_NAME, "macro")) {
        n = mk_node(j, S_MACRO, t);
        if (cur(j)->k != K_NAME) unexpected(j, "a macro name");
        tok *nt = adv(j);
        n->v = mk_str(nt->s, nt->n);
        expect_op(j, "(");
        while (!at_op(j, ")")) {
            if (n->nargs) expect_op(j, ",");
            if (cur(j)->k != K_NAME) unexpected(j, "a parameter name");
            tok *pt = adv(j);
            node *p = mk_node(j, E_KW, pt);
            p->v = mk_str(pt->s, pt->n);
            if (at_op(j, "=")) adv(j), p->a = p_expr(j, 0);
            add_arg(j, n, p);
        }
        adv(j);
        expect_end(j);
        static const char *const stop[] = {"endmacro", NULL};
        int loops = j->loops;
        j->soft = 0, j->loops = 0;
        n->c = p_body(j, stop, bt, &w);
        j->soft = soft, j->loops = loops;
        if (cur(j)->k == K_NAME) adv(j);
        expect_end(j);
    } else if (tk_is(t, K_NAME, "filter")) {
        n = mk_node(j, S_FILTER, t);
        j->ti--; /* p_filter skips the '|' it expects: here the 'filter' name */
        node *f = p_filter(j, NULL);
        while (at_op(j, "|")) f = p_filter(j, f);
        n->a = f;
        expect_end(j);
        static const char *const stop[] = {"endfilter", NULL};
        n->c = p_body(j, stop, bt, &w);
        expect_end(j);
    } else if (tk_is(t, K_NAME, "break") || tk_is(t, K_NAME, "continue")) {
        if (!j->loops) fail(j, "'%.*s' outside a loop", (int)t->n, t->s);
        n = mk_node(j, t->s[0] == 'b' ? S_BREAK : S_CONT, t);
        expect_end(j);
    } else if (tk_is(t, K_NAME, "generation")) { /* transformers' assistant-mask tag: just its body */
        expect_end(j);
        static const char *const stop[] = {"endgeneration", NULL};
        n = mk_node(j, S_SEQ, t);
        n->c = p_body(j, stop, bt, &w);
        expect_end(j);
    } else {
        j->line = t->line, j->col = t->col;
        fail(j, "Encountered unknown tag '%.*s'.", (int)(t->n > 40 ? 40 : t->n), t->s);
    }
    return n;
}

/* Statements up to one of stop (consumed, named in *which) or the end. */
static node *p_body(J *j, const char *const *stop, const tok *open, const char **which) {
    enter(j);
    node head = {0}, *tail = &head;
    for (;;) {
        tok *t = cur(j);
        node *n = NULL;
        if (t->k == K_EOF) {
            if (stop) {
                j->line = open->line, j->col = open->col;
                const char *const *last = stop;
                while (last[1]) last++;
                fail(j, "unexpected end of template: this block needs {%% %s %%}", *last);
            }
            break;
        }
        if (t->k == K_TEXT) {
            adv(j);
            n = mk_node(j, S_TEXT, t);
            n->v = mk_str(t->s, t->n);
        } else if (t->k == K_VBEG) {
            adv(j);
            n = mk_node(j, S_OUT, t);
            n->a = p_expr(j, 0);
            if (cur(j)->k != K_VEND) unexpected(j, "end of print statement");
            adv(j);
        } else if (t->k == K_BBEG) {
            tok *nm = &j->toks[j->ti + 1];
            for (const char *const *s = stop; s && *s && nm->k == K_NAME; s++)
                if (tk_is(nm, K_NAME, *s)) {
                    j->ti += 2;
                    *which = *s;
                    j->depth--;
                    return head.next;
                }
            if (nm->k == K_NAME && nm->n > 3 && !memcmp(nm->s, "end", 3)) {
                j->line = nm->line, j->col = nm->col;
                fail(j, "unexpected '%.*s'%s%s", (int)(nm->n > 40 ? 40 : nm->n), nm->s,
                     stop ? ", expected " : "", stop ? stop[0] : "");
            }
            adv(j);
            n = p_stmt(j, t);
        } else {
            unexpected(j, "template data or a tag");
        }
        tail->next = n, tail = n;
    }
    j->depth--;
    return head.next;
}

/* ---- evaluation -------------------------------------------------------------------------- */

enum { F_RANGE = 1, F_NAMESPACE, F_RAISE, F_STRFTIME, F_DICT };
static const char *const func_names[] = {"", "range", "namespace", "raise_exception", "strftime_now",
                                         "dict"};

enum { MAX_ARGS = 16 };
typedef struct args {
    int np, nk;
    jv pos[MAX_ARGS], kname[MAX_ARGS], kv[MAX_ARGS];
} args;

static jv eval(J *j, const node *n);
static int exec(J *j, const node *s);
static jv call(J *j, jv f, args *a);
static jv apply_filter(J *j, const node *f, jv v, args *a);
static int apply_test(J *j, const char *name, size_t nl, jv v, args *a);

#define AT(n) (j->line = (n)->line, j->col = (n)->col)
#define STR_IS(v, lit) ((v).n == sizeof(lit) - 1 && !memcmp((v).u.s, lit, sizeof(lit) - 1))

static int name_is(const char *s, size_t n, const char *lit) { return n == strlen(lit) && !memcmp(s, lit, n); }

static void eval_args(J *j, const node *n, int from, args *a) {
    a->np = a->nk = 0;
    for (int i = from; i < n->nargs; i++) {
        const node *x = n->args[i];
        if (a->np + a->nk >= MAX_ARGS) fail(j, "more than %d arguments", MAX_ARGS);
        if (x->k == E_KW) a->kname[a->nk] = x->v, a->kv[a->nk++] = eval(j, x->a);
        else if (a->nk) fail(j, "positional argument follows keyword argument");
        else a->pos[a->np++] = eval(j, x);
    }
}
/* Argument i by position or by name, else dflt. */
static jv arg(args *a, int i, const char *name, jv dflt) {
    if (i >= 0 && i < a->np) return a->pos[i];
    for (int k = 0; name && k < a->nk; k++)
        if (name_is(a->kname[k].u.s, a->kname[k].n, name)) return a->kv[k];
    return dflt;
}

static jv lookup(J *j, const char *s, size_t n) {
    for (frame *f = j->fr; f; f = f->up) {
        jv *v = dict_get(&f->vars, s, n);
        if (v) return *v;
    }
    for (int i = 1; i < (int)(sizeof func_names / sizeof *func_names); i++)
        if (name_is(s, n, func_names[i])) return (jv){T_FUNC, 0, 0, {.i = i}};
    return undef_msg(j, "'%.*s' is undefined%.*s", s, n, "", 0);
}

static jv meth(J *j, jv obj, const char *name) {
    jmeth *m = alloc(j, sizeof *m);
    m->obj = alloc(j, sizeof(jv));
    *m->obj = obj;
    m->name = name;
    return (jv){T_METH, 0, 0, {.me = m}};
}

static const char *const str_methods[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper", "lower",
    "title", "capitalize", "replace", "find", "rfind", "index", "count", "format", "join",
    "splitlines", "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower", "swapcase",
    NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", "copy", NULL};
static const char *const list_methods[] = {"index", "count", "copy", NULL};
/* methods the immutable sandbox refuses */
static const char *const unsafe_methods[] = {"append", "pop", "extend", "insert", "remove", "sort",
                                             "reverse", "clear", "update", "setdefault", "popitem",
                                             NULL};
static const char *find_name(const char *const *names, const char *s, size_t n) {
    for (; *names; names++)
        if (name_is(s, n, *names)) return *names;
    return NULL;
}

static jv getattr(J *j, jv o, const char *s, size_t n) {
    const char *m;
    use_undef(j, &o);
    if (o.t == T_LOOP) {
        jloop *l = o.u.lp;
        int64_t i = (int64_t)l->i, c = (int64_t)l->n;
        if (name_is(s, n, "index")) return mk_int(i + 1);
        if (name_is(s, n, "index0")) return mk_int(i);
        if (name_is(s, n, "revindex")) return mk_int(c - i);
        if (name_is(s, n, "revindex0")) return mk_int(c - i - 1);
        if (name_is(s, n, "first")) return mk_bool(i == 0);
        if (name_is(s, n, "last")) return mk_bool(i == c - 1);
        if (name_is(s, n, "length")) return mk_int(c);
        if (name_is(s, n, "depth")) return mk_int(1);
        if (name_is(s, n, "depth0")) return mk_int(0);
        if (name_is(s, n, "previtem"))
            return i > 0 ? l->items[i - 1] : undef_msg(j, "there is no previous item%.*s%.*s", "", 0, "", 0);
        if (name_is(s, n, "nextitem"))
            return i + 1 < c ? l->items[i + 1] : undef_msg(j, "there is no next item%.*s%.*s", "", 0, "", 0);
        if (name_is(s, n, "cycle")) return meth(j, o, "cycle");
    } else if (o.t == T_DICT && o.sub == SUB_NS) {
        jv *v = dict_get(o.u.d, s, n);
        if (v) return *v;
    } else if (o.t == T_DICT) {
        if ((m = find_name(dict_methods, s, n))) return meth(j, o, m);
        if ((m = find_name(unsafe_methods, s, n))) goto unsafe;
        jv *v = dict_get(o.u.d, s, n);
        if (v) return *v;
    } else if (o.t == T_STR) {
        if ((m = find_name(str_methods, s, n))) return meth(j, o, m);
    } else if (o.t == T_LIST) {
        if ((m = find_name(list_methods, s, n))) return meth(j, o, m);
        if ((m = find_name(unsafe_methods, s, n))) goto unsafe;
    }
    if (n && s[0] == '_') fail(j, "access to attribute '%.*s' is unsafe", (int)n, s);
    return undef_msg(j, "'%.*s object' has no attribute '%.*s'", type_name(&o), strlen(type_name(&o)), s, n);
unsafe:;
    jv u = undef_msg(j, "access to attribute '%.*s' of '%.*s' object is unsafe.", s, n, type_name(&o),
                     strlen(type_name(&o)));
    u.sub = SUB_UNSAFE;
    return u;
}

/* Python's index rules for a sequence of len items; -1 when out of range. */
static int64_t seq_index(const jv *k, size_t len) {
    int64_t i = k->u.i;
    if (i < 0) i += (int64_t)len;
    return i < 0 || i >= (int64_t)len ? -1 : i;
}

/* Byte offsets of each character of a string (n+1 entries). */
static size_t *char_offsets(J *j, jv s, size_t *count) {
    size_t c = cp_count(s.u.s, s.n), *o = alloc(j, (c + 1) * sizeof *o), i = 0, k = 0;
    for (; k < c; k++) o[k] = i, i += cp_len(s.u.s + i, s.n - i);
    o[c] = s.n;
    *count = c;
    return o;
}

static jv getitem(J *j, jv o, jv k) {
    use_undef(j, &o);
    if (o.t == T_DICT && o.sub != SUB_NS) {
        jv *v = dict_find(o.u.d, &k);
        if (v) return *v;
    } else if (o.t == T_LIST && o.sub != SUB_GEN && (k.t == T_INT || k.t == T_BOOL)) {
        int64_t i = seq_index(&k, o.u.l->n);
        if (i >= 0) return o.u.l->v[i];
        return undef_msg(j, "%.*s object has no element %.*s", type_name(&o), strlen(type_name(&o)), "", 0);
    } else if (o.t == T_STR && (k.t == T_INT || k.t == T_BOOL)) {
        size_t c, *off = char_offsets(j, o, &c);
        int64_t i = seq_index(&k, c);
        if (i >= 0) return mk_str(o.u.s + off[i], off[i + 1] - off[i]);
        return undef_msg(j, "str object has no element%.*s%.*s", "", 0, "", 0);
    }
    if (k.t == T_STR) return getattr(j, o, k.u.s, k.n);
    if (o.t == T_NONE || o.t == T_DICT) return undef_msg(j, "'%.*s object' has no such item%.*s",
                                                         type_name(&o), strlen(type_name(&o)), "", 0);
    fail(j, "'%s' object is not subscriptable", type_name(&o));
}

static int64_t slice_part(J *j, const node *n, int64_t dflt) {
    if (!n) return dflt;
    jv v = eval(j, n);
    if (v.t == T_NONE) return dflt;
    if (v.t != T_INT && v.t != T_BOOL) fail(j, "slice indices must be integers or None");
    return v.u.i;
}

static jv slice(J *j, const node *n) {
    jv o = eval(j, n->a);
    use_undef(j, &o);
    size_t len, *off = NULL;
    if (o.t == T_STR) off = char_offsets(j, o, &len);
    else if (o.t == T_LIST) len = o.u.l->n;
    else fail(j, "'%s' object is not subscriptable", type_name(&o));
    int64_t st = slice_part(j, n->d, 1), L = (int64_t)len;
    if (!st) fail(j, "slice step cannot be zero");
    int64_t a = slice_part(j, n->b, st < 0 ? L - 1 : 0), b = slice_part(j, n->c, st < 0 ? -L - 1 : L);
    /* Python's PySlice_AdjustIndices */
    if (a < 0) a = a + L < 0 ? (st < 0 ? -1 : 0) : a + L;
    else if (a >= L) a = st < 0 ? L - 1 : L;
    if (b < 0) b = b + L < 0 ? (st < 0 ? -1 : 0) : b + L;
    else if (b >= L) b = st < 0 ? L - 1 : L;
    AT(n);
    if (o.t == T_STR) {
        sb r = {0};
        for (int64_t i = a; st > 0 ? i < b : i > b; i += st) sb_put(j, &r, o.u.s + off[i], off[i + 1] - off[i]);
        return sb_val(&r);
    }
    jv r = mk_list(j, 0, o.sub);
    for (int64_t i = a; st > 0 ? i < b : i > b; i += st) step(j), list_push(j, r.u.l, o.u.l->v[i]);
    return r;
}

/* The items a for loop (or a filter) walks. */
static jv iterate(J *j, jv v) {
    if (v.t == T_LIST) return v;
    jv r = mk_list(j, 0, 0);
    if (v.t == T_UNDEF) return r;
    if (v.t == T_DICT && v.sub != SUB_NS) {
        for (size_t i = 0; i < v.u.d->n; i++) list_push(j, r.u.l, v.u.d->k[i]);
    } else if (v.t == T_STR) {
        for (size_t i = 0; i < v.n;) {
            size_t l = cp_len(v.u.s + i, v.n - i);
            list_push(j, r.u.l, mk_str(v.u.s + i, l));
            i += l;
        }
    } else {
        fail(j, "'%s' object is not iterable", type_name(&v));
    }
    return r;
}

static int cmp(J *j, const jv *a, const jv *b) {
    if (is_num(a) && is_num(b)) {
        if (a->t != T_FLOAT && b->t != T_FLOAT) return (a->u.i > b->u.i) - (a->u.i < b->u.i);
        return (num(a) > num(b)) - (num(a) < num(b));
    }
    if (a->t == T_STR && b->t == T_STR) {
        int c = memcmp(a->u.s, b->u.s, a->n < b->n ? a->n : b->n);
        return c ? (c > 0) - (c < 0) : (a->n > b->n) - (a->n < b->n);
    }
    if (a->t == T_LIST && b->t == T_LIST && a->sub == b->sub) {
        for (size_t i = 0; i < a->u.l->n && i < b->u.l->n; i++)
            if (!eq(&a->u.l->v[i], &b->u.l->v[i])) return cmp(j, &a->u.l->v[i], &b->u.l->v[i]);
        return (a->u.l->n > b->u.l->n) - (a->u.l->n < b->u.l->n);
    }
    use_undef(j, a);
    use_undef(j, b);
    fail(j, "'<' not supported between instances of '%s' and '%s'", type_name(a), type_name(b));
}

static int contains(J *j, jv hay, jv x) {
    if (hay.t == T_STR) {
        if (x.t != T_STR) fail(j, "'in <string>' requires string as left operand, not %s", type_name(&x));
        return !x.n || memmem(hay.u.s, hay.n, x.u.s, x.n) != NULL;
    }
    if (hay.t == T_LIST) {
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (eq(&hay.u.l->v[i], &x)) return 1;
        return 0;
    }
    if (hay.t == T_DICT && hay.sub != SUB_NS) return dict_find(hay.u.d, &x) != NULL;
    if (hay.t == T_UNDEF) return 0;
    fail(j, "argument of type '%s' is not iterable", type_name(&hay));
}

static jv html_escape(J *j, jv s) {
    sb b = {0};
    for (size_t i = 0; i < s.n; i++) {
        char c = s.u.s[i];
        const char *e = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&#34;"
                      : c == '\'' ? "&#39;" : NULL;
        if (e) sb_puts(j, &b, e);
        else sb_put(j, &b, &c, 1);
    }
    jv r = sb_val(&b);
    r.sub = SUB_MARKUP;
    return r;
}

static jv concat(J *j, jv a, jv b) {
    sb r = {0};
    sb_put(j, &r, a.u.s, a.n);
    sb_put(j, &r, b.u.s, b.n);
    return sb_val(&r);
}

static jv py_percent(J *j, jv fmt, jv a);

__attribute__((noreturn)) static void bad_operands(J *j, const char *op, const jv *a, const jv *b) {
    use_undef(j, a);
    use_undef(j, b);
    fail(j, "unsupported operand type(s) for %s: '%s' and '%s'", op, type_name(a), type_name(b));
}

static jv binop(J *j, int op, jv a, jv b) {
    static const char *const sym[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (op >= OP_EQ && op <= OP_GE) {
        if (op == OP_EQ) return mk_bool(eq(&a, &b));
        if (op == OP_NE) return mk_bool(!eq(&a, &b));
        int c = cmp(j, &a, &b);
        return mk_bool(op == OP_LT ? c < 0 : op == OP_LE ? c <= 0 : op == OP_GT ? c > 0 : c >= 0);
    }
    if (op == OP_IN || op == OP_NOTIN) return mk_bool(contains(j, b, a) ^ (op == OP_NOTIN));
    if (op == OP_CAT) return concat(j, to_str(j, &a), to_str(j, &b));
    if (is_num(&a) && is_num(&b)) {
        int ints = a.t != T_FLOAT && b.t != T_FLOAT;
        int64_t x = a.u.i, y = b.u.i, r;
        double fx = num(&a), fy = num(&b);
        switch (op) {
        case OP_ADD:
            if (ints && !__builtin_add_overflow(x, y, &r)) return mk_int(r);
            return mk_float(fx + fy);
        case OP_SUB:
            if (ints && !__builtin_sub_overflow(x, y, &r)) return mk_int(r);
            return mk_float(fx - fy);
        case OP_MUL:
            if (ints && !__builtin_mul_overflow(x, y, &r)) return mk_int(r);
            return mk_float(fx * fy);
        case OP_DIV:
            if (fy == 0) fail(j, "division by zero");
            return mk_float(fx / fy);
        case OP_FDIV: case OP_MOD:
            if (fy == 0) fail(j, "%s by zero", op == OP_MOD ? "modulo" : "integer division");
            if (ints && !(x == INT64_MIN && y == -1)) {
                int64_t q = x / y, m = x % y;
                if (m && ((m < 0) != (y < 0))) q--, m += y;
                return mk_int(op == OP_FDIV ? q : m);
            } else {
                double m = fmod(fx, fy);
                if (m && ((m < 0) != (fy < 0))) m += fy;
                return mk_float(op == OP_FDIV ? floor(fx / fy) : m);
            }
        case OP_POW:
            if (ints && y >= 0) {
                int64_t p = 1;
                for (int64_t i = 0; i < y; i++)
                    if (__builtin_mul_overflow(p, x, &p)) return mk_float(pow(fx, fy));
                return mk_int(p);
            }
            return mk_float(pow(fx, fy));
        }
    }
    if (op == OP_ADD && a.t == T_STR && b.t == T_STR) {
        if (a.sub == SUB_MARKUP && b.sub != SUB_MARKUP) b = html_escape(j, b);
        else if (b.sub == SUB_MARKUP && a.sub != SUB_MARKUP) a = html_escape(j, a);
        jv r = concat(j, a, b);
        r.sub = a.sub | b.sub;
        return r;
    }
    if (op == OP_ADD && a.t == T_LIST && b.t == T_LIST && a.sub == b.sub) {
        jv r = mk_list(j, a.u.l->n + b.u.l->n, a.sub);
        for (size_t i = 0; i < a.u.l->n; i++) list_push(j, r.u.l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) list_push(j, r.u.l, b.u.l->v[i]);
        return r;
    }
    if (op == OP_MUL && (a.t == T_STR || a.t == T_LIST) && (b.t == T_INT || b.t == T_BOOL)) {
        jv r = a.t == T_STR ? mk_str("", 0) : mk_list(j, 0, a.sub);
        sb s = {0};
        for (int64_t i = 0; i < b.u.i; i++) {
            step(j);
            if (a.t == T_STR) sb_put(j, &s, a.u.s, a.n);
            else for (size_t k = 0; k < a.u.l->n; k++) list_push(j, r.u.l, a.u.l->v[k]);
        }
        return a.t == T_STR ? sb_val(&s) : r;
    }
    if (op == OP_MOD && a.t == T_STR) return py_percent(j, a, b);
    if (op == OP_ADD && a.t == T_STR && b.t != T_UNDEF)
        fail(j, "can only concatenate str (not \"%s\") to str", type_name(&b));
    bad_operands(j, sym[op], &a, &b);
}

static void bind(J *j, const node *t, jv v) {
    if (t->k == E_NAME) return dict_set(j, &j->fr->vars, t->v, v);
    if (v.t == T_STR || (v.t == T_DICT && v.sub != SUB_NS)) v = iterate(j, v);
    if (v.t != T_LIST) fail(j, "cannot unpack non-iterable %s object", type_name(&v));
    if (v.u.l->n != (size_t)t->nargs)
        fail(j, "%s values to unpack (expected %d, got %zu)", v.u.l->n > (size_t)t->nargs ? "too many" : "not enough",
             t->nargs, v.u.l->n);
    for (int i = 0; i < t->nargs; i++) bind(j, t->args[i], v.u.l->v[i]);
}

static jv capture(J *j, const node *body) {
    sb b = {0}, *saved = j->out;
    j->out = &b;
    exec(j, body);
    j->out = saved;
    return sb_val(&b);
}

/* A filter chain whose innermost operand is v (block set, filter block). */
static jv filter_chain(J *j, const node *f, jv v) {
    if (!f) return v;
    v = filter_chain(j, f->a, v);
    args a;
    eval_args(j, f, 0, &a);
    AT(f);
    return apply_filter(j, f, v, &a);
}

static jv eval(J *j, const node *n) {
    step(j);
    AT(n);
    if (++j->depth > MAX_DEPTH * 2) fail(j, "the template nests deeper than %d", MAX_DEPTH * 2);
    jv r, a, b;
    args ar;
    switch (n->k) {
    case E_CONST: r = n->v; break;
    case E_NAME: r = lookup(j, n->v.u.s, n->v.n); break;
    case E_LIST: case E_TUPLE:
        r = mk_list(j, (size_t)n->nargs, n->k == E_TUPLE);
        for (int i = 0; i < n->nargs; i++) list_push(j, r.u.l, eval(j, n->args[i]));
        break;
    case E_DICT:
        r = mk_dict(j);
        for (int i = 0; i + 1 < n->nargs; i += 2) {
            jv k = eval(j, n->args[i]);
            dict_set(j, r.u.d, k, eval(j, n->args[i + 1]));
        }
        break;
    case E_ATTR: a = eval(j, n->a); AT(n); r = getattr(j, a, n->v.u.s, n->v.n); break;
    case E_ITEM: a = eval(j, n->a); b = eval(j, n->b); AT(n); r = getitem(j, a, b); break;
    case E_SLICE: r = slice(j, n); break;
    case E_CALL:
        a = eval(j, n->a);
        eval_args(j, n, 0, &ar);
        AT(n);
        r = call(j, a, &ar);
        break;
    case E_FILTER:
        a = eval(j, n->a);
        eval_args(j, n, 0, &ar);
        AT(n);
        r = apply_filter(j, n, a, &ar);
        break;
    case E_TEST:
        a = eval(j, n->a);
        eval_args(j, n, 0, &ar);
        AT(n);
        r = mk_bool(apply_test(j, n->v.u.s, n->v.n, a, &ar) ^ n->op);
        break;
    case E_BIN: a = eval(j, n->a); b = eval(j, n->b); AT(n); r = binop(j, n->op, a, b); break;
    case E_AND: r = eval(j, n->a); if (truthy(&r)) r = eval(j, n->b); break;
    case E_OR: r = eval(j, n->a); if (!truthy(&r)) r = eval(j, n->b); break;
    case E_NOT: a = eval(j, n->a); r = mk_bool(!truthy(&a)); break;
    case E_NEG: case E_POS:
        a = eval(j, n->a);
        AT(n);
        if (!is_num(&a)) use_undef(j, &a), fail(j, "bad operand type for unary %c: '%s'", n->k == E_NEG ? '-' : '+', type_name(&a));
        if (n->k == E_POS) r = a.t == T_BOOL ? mk_int(a.u.i) : a;
        else r = a.t == T_FLOAT ? mk_float(-a.u.f) : a.u.i == INT64_MIN ? mk_float(9.2233720368547758e18) : mk_int(-a.u.i);
        break;
    case E_COND:
        a = eval(j, n->b);
        r = truthy(&a) ? eval(j, n->a) : n->c ? eval(j, n->c) : UNDEF;
        break;
    default: fail(j, "internal: bad expression node %d", n->k);
    }
    j->depth--;
    return r;
}

static int exec_for(J *j, const node *n) {
    jv it = eval(j, n->b);
    AT(n);
    if (it.t == T_NONE || it.t == T_BOOL || it.t == T_INT || it.t == T_FLOAT)
        fail(j, "'%s' object is not iterable", type_name(&it));
    jv items = iterate(j, it);
    frame fr = {j->fr, {0}};
    j->fr = &fr;
    if (n->e) { /* {% for x in xs if cond %}: loop.* counts what passes */
        jv kept = mk_list(j, 0, 0);
        for (size_t i = 0; i < items.u.l->n; i++) {
            fr.vars.n = 0;
            bind(j, n->a, items.u.l->v[i]);
            jv c = eval(j, n->e);
            if (truthy(&c)) list_push(j, kept.u.l, items.u.l->v[i]);
        }
        items = kept;
    }
    jloop lp = {0, items.u.l->n, items.u.l->v};
    jv loopv = {T_LOOP, 0, 0, {.lp = &lp}};
    for (size_t i = 0; i < items.u.l->n; i++) {
        step(j);
        fr.vars.n = 0; /* a fresh scope per iteration, as jinja2's */
        lp.i = i;
        bind(j, n->a, items.u.l->v[i]);
        dict_set(j, &fr.vars, mk_str("loop", 4), loopv);
        if (exec(j, n->c) == S_BREAK) break;
    }
    j->fr = fr.up;
    if (!items.u.l->n && n->d) return exec(j, n->d);
    return 0;
}

static void exec_set(J *j, const node *n) {
    jv v = n->b ? eval(j, n->b) : filter_chain(j, n->d, capture(j, n->c));
    AT(n);
    if (n->a->k == E_ATTR) {
        jv ns = eval(j, n->a->a);
        AT(n);
        if (ns.t != T_DICT || ns.sub != SUB_NS) fail(j, "cannot assign attribute on non-namespace object");
        if (n->a->v.n && n->a->v.u.s[0] == '_')
            fail(j, "Chat templates cannot store underscore-prefixed attributes on a namespace");
        dict_set(j, ns.u.d, n->a->v, v);
        return;
    }
    bind(j, n->a, v);
}

/* Runs statements; returns S_BREAK or S_CONT when one of them ran, else 0. */
static int exec(J *j, const node *s) {
    if (++j->depth > MAX_DEPTH * 2) fail(j, "the template nests deeper than %d", MAX_DEPTH * 2);
    int rc = 0;
    for (; s && !rc; s = s->next) {
        step(j);
        AT(s);
        switch (s->k) {
        case S_TEXT: sb_put(j, j->out, s->v.u.s, s->v.n); break;
        case S_OUT: {
            jv v = eval(j, s->a);
            AT(s);
            if (v.t == T_STR) sb_put(j, j->out, v.u.s, v.n);
            else put_str(j, j->out, &v);
            break;
        }
        case S_IF: {
            jv c = eval(j, s->a);
            rc = exec(j, truthy(&c) ? s->b : s->c);
            break;
        }
        case S_FOR: rc = exec_for(j, s); break;
        case S_SET: exec_set(j, s); break;
        case S_MACRO: dict_set(j, &j->fr->vars, s->v, (jv){T_MACRO, 0, 0, {.m = s}}); break;
        case S_FILTER: {
            jv v = filter_chain(j, s->a, capture(j, s->c));
            sb_put(j, j->out, v.u.s, v.t == T_STR ? v.n : 0);
            break;
        }
        case S_BREAK: case S_CONT: rc = s->k; break;
        case S_SEQ: rc = exec(j, s->c); break;
        default: fail(j, "internal: bad statement node %d", s->k);
        }
    }
    j->depth--;
    return rc;
}

static jv call_macro(J *j, const node *m, args *a) {
    if (++j->in_macro > MAX_MACRO_DEPTH) fail(j, "macro calls nest deeper than %d", MAX_MACRO_DEPTH);
    if (a->np > m->nargs)
        fail(j, "macro '%.*s' takes not more than %d argument(s)", (int)m->v.n, m->v.u.s, m->nargs);
    for (int k = 0; k < a->nk; k++) {
        int ok = 0;
        for (int i = 0; i < m->nargs; i++) ok |= eq(&a->kname[k], &m->args[i]->v);
        if (!ok) fail(j, "macro '%.*s' takes no keyword argument '%.*s'", (int)m->v.n, m->v.u.s,
                      (int)a->kname[k].n, a->kname[k].u.s);
    }
    frame fr = {j->globals, {0}}, *saved = j->fr;
    j->fr = &fr;
    for (int i = 0; i < m->nargs; i++) {
        const node *p = m->args[i];
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)p->v.n, p->v.u.s);
        jv v = arg(a, i, name, (jv){T_UNDEF, 2, 0, {0}});
        if (v.t == T_UNDEF && v.sub == 2)
            v = p->a ? eval(j, p->a) : undef_msg(j, "'%.*s' is undefined%.*s", p->v.u.s, p->v.n, "", 0);
        dict_set(j, &fr.vars, p->v, v);
    }
    jv r = capture(j, m->c);
    j->fr = saved;
    j->in_macro--;
    return r;
}

static jv call_method(J *j, jv o, const char *name, args *a);

static jv call(J *j, jv f, args *a) {
    if (f.t == T_MACRO) return call_macro(j, f.u.m, a);
    if (f.t == T_METH) return call_method(j, *f.u.me->obj, f.u.me->name, a);
    if (f.t == T_UNDEF) {
        if (f.sub == SUB_UNSAFE) fail(j, "%.*s", (int)f.n, f.u.s);
        use_undef(j, &f);
    }
    if (f.t != T_FUNC) fail(j, "'%s' object is not callable", type_name(&f));
    switch (f.u.i) {
    case F_RANGE: {
        for (int i = 0; i < a->np; i++)
            if (a->pos[i].t != T_INT && a->pos[i].t != T_BOOL) fail(j, "range() takes integers");
        int64_t lo = a->np > 1 ? a->pos[0].u.i : 0, hi = a->np == 1 ? a->pos[0].u.i : a->np > 1 ? a->pos[1].u.i : 0;
        int64_t st = a->np > 2 ? a->pos[2].u.i : 1;
        if (!a->np || a->np > 3) fail(j, "range expected 1 to 3 arguments");
        if (!st) fail(j, "range() arg 3 must not be zero");
        double cnt = st > 0 ? ceil(((double)hi - (double)lo) / (double)st) : ceil(((double)lo - (double)hi) / (double)-st);
        if (cnt > MAX_RANGE)
            fail(j, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", MAX_RANGE);
        jv r = mk_list(j, cnt > 0 ? (size_t)cnt : 0, 0);
        for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) list_push(j, r.u.l, mk_int(i));
        return r;
    }
    case F_NAMESPACE: case F_DICT: {
        jv r = mk_dict(j);
        if (f.u.i == F_NAMESPACE) r.sub = SUB_NS;
        for (int i = 0; i < a->np; i++) {
            jv d = a->pos[i];
            if (d.t != T_DICT) fail(j, "%s() takes a mapping", func_names[f.u.i]);
            for (size_t k = 0; k < d.u.d->n; k++) dict_set(j, r.u.d, d.u.d->k[k], d.u.d->v[k]);
        }
        for (int k = 0; k < a->nk; k++) dict_set(j, r.u.d, a->kname[k], a->kv[k]);
        for (size_t k = 0; r.sub == SUB_NS && k < r.u.d->n; k++)
            if (r.u.d->k[k].t == T_STR && r.u.d->k[k].n && r.u.d->k[k].u.s[0] == '_')
                fail(j, "Chat templates cannot store underscore-prefixed attributes on a namespace");
        return r;
    }
    case F_RAISE: {
        jv m = to_str(j, &a->pos[0]);
        if (!a->np) m = mk_str("", 0);
        dfl_fail(j->err, DFL_EARG, "%.*s", (int)(m.n > 1000 ? 1000 : m.n), m.u.s);
        longjmp(j->jb, 1);
    }
    case F_STRFTIME: {
        jv fmt = arg(a, 0, "format", UNDEF);
        if (fmt.t != T_STR || fmt.n > 200) fail(j, "strftime_now takes a format string");
        char fs[201], t[512];
        memcpy(fs, fmt.u.s, fmt.n);
        fs[fmt.n] = 0;
        time_t now = j->now ? (time_t)j->now : time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(t, sizeof t, fs, &tm);
        return str_dup(j, t, n);
    }
    }
    fail(j, "internal: bad function");
}

/* ---- filters, tests and methods ---------------------------------------------------------- */

static jv need_str(J *j, jv v, const char *what) {
    use_undef(j, &v);
    if (v.t != T_STR) fail(j, "%s: expected a string, got %s", what, type_name(&v));
    return v;
}
static int64_t need_int(J *j, jv v, const char *what) {
    if (v.t != T_INT && v.t != T_BOOL) fail(j, "%s: expected an integer, got %s", what, type_name(&v));
    return v.u.i;
}

static jv case_map(J *j, jv s, int mode) { /* 0 lower, 1 upper, 2 capitalize, 3 title, 4 swapcase */
    char *p = alloc(j, s.n + 1);
    int word_start = 1;
    for (size_t i = 0; i < s.n; i++) {
        char c = s.u.s[i];
        int up = mode == 1 || ((mode == 2 && i == 0) || (mode == 3 && word_start));
        if (mode == 4) up = c >= 'a' && c <= 'z';
        if (up && c >= 'a' && c <= 'z') c = (char)(c - 32);
        else if (!up && c >= 'A' && c <= 'Z') c = (char)(c + 32);
        p[i] = c;
        /* jinja2's title starts a word after whitespace, '-', '(', '{', '[' or '<' */
        word_start = mode == 3 ? (is_sp(c) || strchr("-({[<", c)) && c : 0;
    }
    return mk_str(p, s.n);
}

static jv replace(J *j, jv s, jv old, jv new, int64_t count) {
    sb b = {0};
    size_t i = 0;
    if (!old.n) { /* Python inserts new around every character */
        for (size_t k = 0; k <= s.n && count; count--) {
            step(j);
            sb_put(j, &b, new.u.s, new.n);
            if (k == s.n) {
                i = s.n;
                break;
            }
            size_t l = cp_len(s.u.s + k, s.n - k);
            sb_put(j, &b, s.u.s + k, l);
            i = k += l;
        }
        sb_put(j, &b, s.u.s + i, s.n - i);
        return sb_val(&b);
    }
    for (; count; count--) {
        const char *f = memmem(s.u.s + i, s.n - i, old.u.s, old.n);
        if (!f) break;
        step(j);
        sb_put(j, &b, s.u.s + i, (size_t)(f - s.u.s) - i);
        sb_put(j, &b, new.u.s, new.n);
        i = (size_t)(f - s.u.s) + old.n;
    }
    sb_put(j, &b, s.u.s + i, s.n - i);
    return sb_val(&b);
}

static jv split(J *j, jv s, jv sep, int64_t maxsplit, int right) {
    jv r = mk_list(j, 0, 0);
    if (sep.t == T_NONE || sep.t == T_UNDEF) { /* runs of whitespace, no empty parts */
        size_t i = 0, n = s.n;
        if (right) { /* rsplit: collect from the end */
            jv parts = mk_list(j, 0, 0);
            while (n) {
                int l;
                while (n && (l = ws_len_back(s.u.s, n))) n -= (size_t)l;
                if (!n) break;
                size_t e = n;
                if (!maxsplit) {
                    list_push(j, parts.u.l, mk_str(s.u.s, e));
                    break;
                }
                while (n && !ws_len_back(s.u.s, n)) { /* back over one character */
                    n--;
                    while (n && ((unsigned char)s.u.s[n] & 0xc0) == 0x80) n--;
                }
                list_push(j, parts.u.l, mk_str(s.u.s + n, e - n));
                maxsplit--;
            }
            for (size_t k = parts.u.l->n; k; k--) list_push(j, r.u.l, parts.u.l->v[k - 1]);
            return r;
        }
        for (;;) {
            int l;
            while (i < n && (l = ws_len(s.u.s + i, n - i))) i += (size_t)l;
            if (i >= n) break;
            if (!maxsplit) {
                jv rest = strip(mk_str(s.u.s + i, n - i), NULL, 0, 1);
                list_push(j, r.u.l, rest);
                break;
            }
            size_t st = i;
            while (i < n && !ws_len(s.u.s + i, n - i)) i += cp_len(s.u.s + i, n - i);
            list_push(j, r.u.l, mk_str(s.u.s + st, i - st));
            maxsplit--;
        }
        return r;
    }
    sep = need_str(j, sep, "split");
    if (!sep.n) fail(j, "empty separator");
    if (right) {
        jv parts = mk_list(j, 0, 0);
        size_t e = s.n;
        for (;;) {
            const char *f = NULL;
            if (maxsplit)
                for (size_t k = e >= sep.n ? e - sep.n + 1 : 0; k-- > 0;)
                    if (!memcmp(s.u.s + k, sep.u.s, sep.n)) {
                        f = s.u.s + k;
                        break;
                    }
            if (!f) {
                list_push(j, parts.u.l, mk_str(s.u.s, e));
                break;
            }
            list_push(j, parts.u.l, mk_str(f + sep.n, e - (size_t)(f - s.u.s) - sep.n));
            e = (size_t)(f - s.u.s);
            maxsplit--;
        }
        for (size_t k = parts.u.l->n; k; k--) list_push(j, r.u.l, parts.u.l->v[k - 1]);
        return r;
    }
    size_t i = 0;
    for (;;) {
        step(j);
        const char *f = maxsplit ? memmem(s.u.s + i, s.n - i, sep.u.s, sep.n) : NULL;
        if (!f) {
            list_push(j, r.u.l, mk_str(s.u.s + i, s.n - i));
            break;
        }
        list_push(j, r.u.l, mk_str(s.u.s + i, (size_t)(f - s.u.s) - i));
        i = (size_t)(f - s.u.s) + sep.n;
        maxsplit--;
    }
    return r;
}

/* Python's str % args, for %s %r %d %i %f %x %%. */
static jv py_percent(J *j, jv fmt, jv a) {
    sb b = {0};
    size_t ai = 0;
    int tuple = a.t == T_LIST && a.sub == SUB_TUPLE;
    for (size_t i = 0; i < fmt.n; i++) {
        char c = fmt.u.s[i];
        if (c != '%') {
            sb_put(j, &b, &c, 1);
            continue;
        }
        size_t k = i + 1;
        while (k < fmt.n && strchr("0123456789.-+ #", fmt.u.s[k])) k++;
        if (k >= fmt.n) fail(j, "incomplete format");
        char conv = fmt.u.s[k];
        if (conv == '%') {
            sb_put(j, &b, "%", 1);
            i = k;
            continue;
        }
        jv v = tuple ? (ai < a.u.l->n ? a.u.l->v[ai] : UNDEF) : ai == 0 ? a : UNDEF;
        if (v.t == T_UNDEF && !(tuple ? ai < a.u.l->n : ai == 0)) fail(j, "not enough arguments for format string");
        ai++;
        char spec[24];
        snprintf(spec, sizeof spec, "%%%.*s", (int)(k - i - 1 < 16 ? k - i - 1 : 16), fmt.u.s + i + 1);
        size_t sl = strlen(spec);
        if (conv == 's' || conv == 'r') {
            sb t = {0};
            if (conv == 's') put_str(j, &t, &v);
            else put_repr(j, &t, &v);
            sb_put(j, &b, t.p, t.n);
        } else if ((conv == 'd' || conv == 'i' || conv == 'x') && is_num(&v)) {
            snprintf(spec + sl, sizeof spec - sl, "ll%c", conv == 'i' ? 'd' : conv);
            sb_printf(j, &b, spec, v.t == T_FLOAT ? (long long)v.u.f : (long long)v.u.i);
        } else if ((conv == 'f' || conv == 'e' || conv == 'g') && is_num(&v)) {
            snprintf(spec + sl, sizeof spec - sl, "%c", conv);
            sb_printf(j, &b, spec, num(&v));
        } else {
            fail(j, "unsupported format character '%c' or argument", conv);
        }
        i = k;
    }
    return sb_val(&b);
}

/* Python's str.format with {} {0} {name} fields and !r / !s (no format specs). */
static jv py_format(J *j, jv fmt, args *a) {
    sb b = {0};
    int auto_i = 0;
    for (size_t i = 0; i < fmt.n; i++) {
        char c = fmt.u.s[i];
        if ((c == '{' || c == '}') && i + 1 < fmt.n && fmt.u.s[i + 1] == c) {
            sb_put(j, &b, &c, 1);
            i++;
            continue;
        }
        if (c == '}') fail(j, "Single '}' encountered in format string");
        if (c != '{') {
            sb_put(j, &b, &c, 1);
            continue;
        }
        const char *e = memchr(fmt.u.s + i, '}', fmt.n - i);
        if (!e) fail(j, "Single '{' encountered in format string");
        const char *f = fmt.u.s + i + 1;
        size_t fl = (size_t)(e - f), nl = fl;
        char conv = 's';
        for (size_t k = 0; k < fl; k++)
            if (f[k] == '!' || f[k] == ':') {
                nl = k;
                if (f[k] == ':' && k + 1 < fl) fail(j, "format specs are not supported");
                if (f[k] == '!' && k + 1 < fl) conv = f[k + 1];
                break;
            }
        jv v;
        if (!nl) {
            v = arg(a, auto_i++, NULL, UNDEF);
            if (auto_i > a->np) fail(j, "Replacement index %d out of range", auto_i - 1);
        } else if (f[0] >= '0' && f[0] <= '9') {
            int idx = atoi(f);
            if (idx >= a->np) fail(j, "Replacement index %d out of range", idx);
            v = a->pos[idx];
        } else {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)(nl < 63 ? nl : 63), f);
            v = arg(a, -1, name, UNDEF);
            if (v.t == T_UNDEF) fail(j, "KeyError: '%s'", name);
        }
        sb t = {0};
        if (conv == 'r') put_repr(j, &t, &v);
        else put_str(j, &t, &v);
        sb_put(j, &b, t.p, t.n);
        i = (size_t)(e - fmt.u.s);
    }
    return sb_val(&b);
}

/* An attribute path "a.b.0" of an item, as jinja2's make_attrgetter. */
static jv attr_path(J *j, jv item, jv path) {
    path = need_str(j, path, "attribute");
    size_t i = 0;
    while (i <= path.n) {
        const char *dot = memchr(path.u.s + i, '.', path.n - i);
        size_t e = dot ? (size_t)(dot - path.u.s) : path.n;
        const char *p = path.u.s + i;
        size_t l = e - i, d = 0;
        while (d < l && p[d] >= '0' && p[d] <= '9') d++;
        jv k = d == l && l ? mk_int(strtoll(p, NULL, 10)) : mk_str(p, l);
        item = getitem(j, item, k);
        i = e + 1;
        if (!dot) break;
    }
    return item;
}

static jv lower_if_str(J *j, jv v, int case_sensitive) {
    return v.t == T_STR && !case_sensitive ? case_map(j, v, 0) : v;
}

/* A stable merge sort of vals by keys (both n long). */
static void sort_by(J *j, jv *keys, jv *vals, size_t n, int reverse) {
    if (n < 2) return;
    size_t h = n / 2;
    sort_by(j, keys, vals, h, reverse);
    sort_by(j, keys + h, vals + h, n - h, reverse);
    jv *tk = alloc(j, n * sizeof(jv)), *tv = alloc(j, n * sizeof(jv));
    size_t a = 0, b = h, o = 0;
    while (a < h || b < n) {
        int take_b = a >= h || (b < n && (reverse ? cmp(j, &keys[b], &keys[a]) > 0 : cmp(j, &keys[b], &keys[a]) < 0));
        size_t s = take_b ? b++ : a++;
        tk[o] = keys[s], tv[o++] = vals[s];
    }
    memcpy(keys, tk, n * sizeof(jv));
    memcpy(vals, tv, n * sizeof(jv));
}

static jv sorted(J *j, jv seq, jv attr, int case_sensitive, int reverse) {
    jv items = iterate(j, seq);
    size_t n = items.u.l->n;
    jv r = mk_list(j, n, 0), keys = mk_list(j, n, 0);
    for (size_t i = 0; i < n; i++) {
        jv v = items.u.l->v[i], k = attr.t == T_UNDEF || attr.t == T_NONE ? v : attr_path(j, v, attr);
        list_push(j, r.u.l, v);
        list_push(j, keys.u.l, lower_if_str(j, k, case_sensitive));
    }
    sort_by(j, keys.u.l->v, r.u.l->v, n, reverse);
    return r;
}

static int test_by_name(J *j, jv name, jv v, args *a, int from) {
    args t = {0};
    for (int i = from; i < a->np; i++) t.pos[t.np++] = a->pos[i];
    name = need_str(j, name, "test name");
    return apply_test(j, name.u.s, name.n, v, &t);
}

static jv json_filter(J *j, jv v, args *a) {
    json_opts o = {0};
    jv ind = arg(a, 0, "indent", NONE), seps = arg(a, 1, "separators", NONE);
    jv sk = arg(a, 2, "sort_keys", mk_bool(0)), ea = arg(a, 3, "ensure_ascii", mk_bool(0));
    if (truthy(&ea)) fail(j, "tojson: ensure_ascii=True is not supported");
    o.sort_keys = truthy(&sk);
    if (ind.t == T_INT) {
        char *sp = alloc(j, (size_t)(ind.u.i > 0 ? ind.u.i : 0) + 1);
        for (int64_t i = 0; i < ind.u.i && i < 64; i++) sp[i] = ' ';
        o.indent = sp, o.indent_n = (size_t)(ind.u.i > 0 ? (ind.u.i < 64 ? ind.u.i : 64) : 0), o.has_indent = 1;
    } else if (ind.t == T_STR) {
        o.indent = ind.u.s, o.indent_n = ind.n, o.has_indent = 1;
    } else if (ind.t != T_NONE) {
        fail(j, "tojson: indent must be an integer or a string");
    }
    o.item_sep = mk_cstr(o.has_indent ? "," : ", ");
    o.key_sep = mk_cstr(": ");
    if (seps.t == T_LIST && seps.u.l->n == 2 && seps.u.l->v[0].t == T_STR && seps.u.l->v[1].t == T_STR)
        o.item_sep = seps.u.l->v[0], o.key_sep = seps.u.l->v[1];
    else if (seps.t != T_NONE) fail(j, "tojson: separators must be a pair of strings");
    sb b = {0};
    put_json(j, &b, &v, &o, 0);
    return sb_val(&b);
}

static jv indent(J *j, jv s, args *a) {
    jv w = arg(a, 0, "width", mk_int(4));
    jv fv = arg(a, 1, "first", mk_bool(0)), bv = arg(a, 2, "blank", mk_bool(0));
    int first = truthy(&fv), blank = truthy(&bv);
    sb ind = {0};
    if (w.t == T_STR) sb_put(j, &ind, w.u.s, w.n);
    else for (int64_t i = 0; i < need_int(j, w, "indent") && i < 1024; i++) sb_put(j, &ind, " ", 1);
    sb b = {0};
    if (first) sb_put(j, &b, ind.p, ind.n);
    /* lines as str.splitlines() of s + "\n" */
    size_t i = 0, line = 0;
    while (i < s.n) {
        size_t e = i;
        while (e < s.n && s.u.s[e] != '\n' && s.u.s[e] != '\r' && s.u.s[e] != '\v' && s.u.s[e] != '\f' &&
               !(s.u.s[e] >= 0x1c && s.u.s[e] <= 0x1e))
            e++;
        if (line) {
            sb_put(j, &b, "\n", 1);
            if (blank || e > i) sb_put(j, &b, ind.p, ind.n);
        }
        sb_put(j, &b, s.u.s + i, e - i);
        line++;
        if (e < s.n && s.u.s[e] == '\r' && e + 1 < s.n && s.u.s[e + 1] == '\n') e++;
        i = e + 1;
    }
    return sb_val(&b);
}

static jv apply_filter(J *j, const node *f, jv v, args *a) {
    const char *nm = f->v.u.s;
    size_t nl = f->v.n;
#define IS(lit) name_is(nm, nl, lit)
    if (IS("default") || IS("d")) {
        jv bo = arg(a, 1, "boolean", mk_bool(0));
        if (v.t == T_UNDEF || (truthy(&bo) && !truthy(&v))) return arg(a, 0, "default_value", mk_str("", 0));
        return v;
    }
    if (IS("safe")) {
        v = to_str(j, &v);
        v.sub = SUB_MARKUP;
        return v;
    }
    if (IS("e") || IS("escape")) return v.t == T_STR && v.sub == SUB_MARKUP ? v : html_escape(j, to_str(j, &v));
    if (IS("string")) return to_str(j, &v);
    if (IS("length") || IS("count")) {
        if (v.t == T_STR) return mk_int((int64_t)cp_count(v.u.s, v.n));
        if (v.t == T_LIST && v.sub != SUB_GEN) return mk_int((int64_t)v.u.l->n);
        if (v.t == T_DICT) return mk_int((int64_t)v.u.d->n);
        if (v.t == T_UNDEF) return mk_int(0);
        fail(j, "object of type '%s' has no len()", type_name(&v));
    }
    if (IS("tojson")) return json_filter(j, v, a);
    if (IS("trim")) {
        jv ch = arg(a, 0, "chars", NONE);
        return strip(to_str(j, &v), ch.t == T_STR ? &ch : NULL, 1, 1);
    }
    if (IS("upper") || IS("lower") || IS("capitalize") || IS("title"))
        return case_map(j, to_str(j, &v), IS("lower") ? 0 : IS("upper") ? 1 : IS("capitalize") ? 2 : 3);
    if (IS("replace")) {
        jv c = arg(a, 2, "count", NONE);
        jv old = arg(a, 0, "old", mk_str("", 0)), new = arg(a, 1, "new", mk_str("", 0));
        return replace(j, to_str(j, &v), to_str(j, &old), to_str(j, &new),
                       c.t == T_NONE ? -1 : need_int(j, c, "replace"));
    }
    if (IS("indent")) return indent(j, to_str(j, &v), a);
    if (IS("wordcount")) {
        jv s = to_str(j, &v);
        int64_t c = 0, in = 0;
        for (size_t i = 0; i < s.n; i++) {
            unsigned char ch = (unsigned char)s.u.s[i];
            int w = ch >= 0x80 || (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
            c += w && !in;
            in = w;
        }
        return mk_int(c);
    }
    if (IS("format")) {
        jv t = mk_list(j, (size_t)a->np, SUB_TUPLE);
        for (int i = 0; i < a->np; i++) list_push(j, t.u.l, a->pos[i]);
        return py_percent(j, need_str(j, v, "format"), t);
    }
    if (IS("abs")) {
        if (!is_num(&v)) fail(j, "bad operand type for abs(): '%s'", type_name(&v));
        return v.t == T_FLOAT ? mk_float(fabs(v.u.f)) : mk_int(v.u.i < 0 ? -v.u.i : v.u.i);
    }
    if (IS("int")) {
        jv d = arg(a, 0, "default", mk_int(0));
        if (v.t == T_INT) return v;
        if (v.t == T_BOOL) return mk_int(v.u.i);
        if (v.t == T_FLOAT) return isfinite(v.u.f) ? mk_int((int64_t)v.u.f) : d;
        if (v.t == T_STR) {
            char t[64];
            jv s = strip(v, NULL, 1, 1);
            if (s.n && s.n < sizeof t) {
                memcpy(t, s.u.s, s.n), t[s.n] = 0;
                char *e;
                long long i = strtoll(t, &e, 10);
                if (!*e) return mk_int(i);
                double x = strtod(t, &e);
                if (!*e && isfinite(x)) return mk_int((int64_t)x);
            }
        }
        return d;
    }
    if (IS("float")) {
        jv d = arg(a, 0, "default", mk_float(0));
        if (is_num(&v)) return mk_float(num(&v));
        if (v.t == T_STR && v.n < 64) {
            char t[64], *e;
            memcpy(t, v.u.s, v.n), t[v.n] = 0;
            double x = strtod(t, &e);
            if (v.n && !*e) return mk_float(x);
        }
        return d;
    }
    if (IS("round")) {
        int64_t p = need_int(j, arg(a, 0, "precision", mk_int(0)), "round");
        jv m = arg(a, 1, "method", mk_cstr("common"));
        if (!is_num(&v)) fail(j, "round: expected a number");
        double x = num(&v), s = pow(10, (double)p);
        if (STR_IS(m, "ceil")) return mk_float(ceil(x * s) / s);
        if (STR_IS(m, "floor")) return mk_float(floor(x * s) / s);
        if (v.t != T_FLOAT) return mk_int(v.u.i);
        double r = nearbyint(x * s) / s; /* round half to even, as Python's round */
        return mk_float(r);
    }
    if (IS("first") || IS("last")) {
        jv it = iterate(j, v);
        if (!it.u.l->n) return undef_msg(j, "No %.*s item, sequence was empty.", nm, nl, "", 0);
        return it.u.l->v[IS("first") ? 0 : it.u.l->n - 1];
    }
    if (IS("list")) {
        jv it = iterate(j, v), r = mk_list(j, it.u.l->n, 0);
        for (size_t i = 0; i < it.u.l->n; i++) list_push(j, r.u.l, it.u.l->v[i]);
        return r;
    }
    if (IS("items")) {
        if (v.t == T_UNDEF) return mk_list(j, 0, SUB_GEN);
        if (v.t != T_DICT) fail(j, "Can only get item pairs from a mapping.");
        jv r = mk_list(j, v.u.d->n, SUB_GEN);
        for (size_t i = 0; i < v.u.d->n; i++) {
            jv p = mk_list(j, 2, SUB_TUPLE);
            list_push(j, p.u.l, v.u.d->k[i]);
            list_push(j, p.u.l, v.u.d->v[i]);
            list_push(j, r.u.l, p);
        }
        return r;
    }
    if (IS("dictsort")) {
        if (v.t != T_DICT) fail(j, "dictsort: expected a mapping");
        jv cs = arg(a, 0, "case_sensitive", mk_bool(0)), by = arg(a, 1, "by", mk_cstr("key"));
        jv rv = arg(a, 2, "reverse", mk_bool(0));
        size_t n = v.u.d->n;
        jv r = mk_list(j, n, 0), keys = mk_list(j, n, 0);
        for (size_t i = 0; i < n; i++) {
            jv p = mk_list(j, 2, SUB_TUPLE);
            list_push(j, p.u.l, v.u.d->k[i]);
            list_push(j, p.u.l, v.u.d->v[i]);
            list_push(j, r.u.l, p);
            list_push(j, keys.u.l, lower_if_str(j, STR_IS(by, "value") ? v.u.d->v[i] : v.u.d->k[i], truthy(&cs)));
        }
        sort_by(j, keys.u.l->v, r.u.l->v, n, truthy(&rv));
        return r;
    }
    if (IS("sort")) {
        jv rv = arg(a, 0, "reverse", mk_bool(0)), cs = arg(a, 1, "case_sensitive", mk_bool(0));
        return sorted(j, v, arg(a, 2, "attribute", NONE), truthy(&cs), truthy(&rv));
    }
    if (IS("reverse")) {
        if (v.t == T_STR) {
            size_t c, *off = char_offsets(j, v, &c);
            sb b = {0};
            for (size_t i = c; i; i--) sb_put(j, &b, v.u.s + off[i - 1], off[i] - off[i - 1]);
            return sb_val(&b);
        }
        jv it = iterate(j, v), r = mk_list(j, it.u.l->n, SUB_GEN);
        for (size_t i = it.u.l->n; i; i--) list_push(j, r.u.l, it.u.l->v[i - 1]);
        return r;
    }
    if (IS("join")) {
        jv it = iterate(j, v), d = arg(a, 0, "d", mk_str("", 0)), at = arg(a, 1, "attribute", NONE);
        d = to_str(j, &d);
        sb b = {0};
        for (size_t i = 0; i < it.u.l->n; i++) {
            if (i) sb_put(j, &b, d.u.s, d.n);
            jv x = at.t == T_NONE ? it.u.l->v[i] : attr_path(j, it.u.l->v[i], at);
            put_str(j, &b, &x);
        }
        return sb_val(&b);
    }
    if (IS("unique")) {
        jv it = iterate(j, v), cs = arg(a, 0, "case_sensitive", mk_bool(0)), at = arg(a, 1, "attribute", NONE);
        jv r = mk_list(j, 0, SUB_GEN), seen = mk_list(j, 0, 0);
        for (size_t i = 0; i < it.u.l->n; i++) {
            jv k = lower_if_str(j, at.t == T_NONE ? it.u.l->v[i] : attr_path(j, it.u.l->v[i], at), truthy(&cs));
            if (contains(j, seen, k)) continue;
            list_push(j, seen.u.l, k);
            list_push(j, r.u.l, it.u.l->v[i]);
        }
        return r;
    }
    if (IS("min") || IS("max")) {
        jv cs = arg(a, 0, "case_sensitive", mk_bool(0)), at = arg(a, 1, "attribute", NONE);
        jv s = sorted(j, v, at, truthy(&cs), IS("max"));
        if (!s.u.l->n) return undef_msg(j, "No aggregated item, sequence was empty.%.*s%.*s", "", 0, "", 0);
        return s.u.l->v[0];
    }
    if (IS("sum")) {
        jv it = iterate(j, v), at = arg(a, 0, "attribute", NONE), r = arg(a, 1, "start", mk_int(0));
        for (size_t i = 0; i < it.u.l->n; i++)
            r = binop(j, OP_ADD, r, at.t == T_NONE ? it.u.l->v[i] : attr_path(j, it.u.l->v[i], at));
        return r;
    }
    if (IS("map")) {
        jv it = iterate(j, truthy(&v) ? v : UNDEF), r = mk_list(j, it.u.l->n, SUB_GEN);
        jv at = arg(a, -1, "attribute", UNDEF);
        for (size_t i = 0; i < it.u.l->n; i++) {
            jv x = it.u.l->v[i];
            if (at.t != T_UNDEF) {
                x = attr_path(j, x, at);
                if (x.t == T_UNDEF) x = arg(a, -1, "default", x);
            } else {
                if (a->np < 1) fail(j, "map: needs a filter name or attribute=");
                jv fname = need_str(j, a->pos[0], "map");
                node fake = *f;
                fake.v = fname;
                args rest = {0};
                for (int k = 1; k < a->np; k++) rest.pos[rest.np++] = a->pos[k];
                for (int k = 0; k < a->nk; k++) rest.kname[rest.nk] = a->kname[k], rest.kv[rest.nk++] = a->kv[k];
                if (!known(filters, fname.u.s, fname.n)) fail(j, "No filter named '%.*s'.", (int)fname.n, fname.u.s);
                x = apply_filter(j, &fake, x, &rest);
            }
            list_push(j, r.u.l, x);
        }
        return r;
    }
    if (IS("select") || IS("reject") || IS("selectattr") || IS("rejectattr")) {
        int attr = IS("selectattr") || IS("rejectattr"), want = IS("select") || IS("selectattr");
        jv it = iterate(j, truthy(&v) ? v : UNDEF), r = mk_list(j, 0, SUB_GEN);
        if (attr && a->np < 1) fail(j, "%.*s: needs an attribute", (int)nl, nm);
        for (size_t i = 0; i < it.u.l->n; i++) {
            jv x = attr ? attr_path(j, it.u.l->v[i], a->pos[0]) : it.u.l->v[i];
            int tn = attr ? 1 : 0, ok;
            if (a->np > tn) ok = test_by_name(j, a->pos[tn], x, a, tn + 1);
            else ok = truthy(&x);
            if (ok == want) list_push(j, r.u.l, it.u.l->v[i]);
        }
        return r;
    }
#undef IS
    fail(j, "No filter named '%.*s'.", (int)nl, nm);
}

static int apply_test(J *j, const char *nm, size_t nl, jv v, args *a) {
#define IS(lit) name_is(nm, nl, lit)
    jv x = arg(a, 0, NULL, UNDEF);
    if (IS("defined")) return v.t != T_UNDEF;
    if (IS("undefined")) return v.t == T_UNDEF;
    if (IS("none")) return v.t == T_NONE;
    if (IS("string")) return v.t == T_STR;
    if (IS("number")) return is_num(&v);
    if (IS("integer")) return v.t == T_INT;
    if (IS("float")) return v.t == T_FLOAT;
    if (IS("boolean")) return v.t == T_BOOL;
    if (IS("true")) return v.t == T_BOOL && v.u.i;
    if (IS("false")) return v.t == T_BOOL && !v.u.i;
    if (IS("mapping")) return v.t == T_DICT && v.sub != SUB_NS;
    if (IS("iterable")) return v.t == T_STR || v.t == T_LIST || (v.t == T_DICT && v.sub != SUB_NS) || v.t == T_UNDEF;
    if (IS("sequence")) return v.t == T_STR || v.t == T_LIST || (v.t == T_DICT && v.sub != SUB_NS) || v.t == T_UNDEF;
    if (IS("callable")) return v.t == T_MACRO || v.t == T_FUNC || v.t == T_METH;
    if (IS("escaped")) return v.t == T_STR && v.sub == SUB_MARKUP;
    if (IS("odd") || IS("even")) return (int)((need_int(j, v, "odd/even") & 1) == IS("odd"));
    if (IS("divisibleby")) {
        int64_t d = need_int(j, x, "divisibleby");
        if (!d) fail(j, "integer modulo by zero");
        return need_int(j, v, "divisibleby") % d == 0;
    }
    if (IS("eq") || IS("equalto") || IS("==")) return eq(&v, &x);
    if (IS("ne") || IS("!=")) return !eq(&v, &x);
    if (IS("lt") || IS("<") || IS("lessthan")) return cmp(j, &v, &x) < 0;
    if (IS("le") || IS("<=")) return cmp(j, &v, &x) <= 0;
    if (IS("gt") || IS(">") || IS("greaterthan")) return cmp(j, &v, &x) > 0;
    if (IS("ge") || IS(">=")) return cmp(j, &v, &x) >= 0;
    if (IS("in")) return contains(j, x, v);
    if (IS("sameas")) return v.t == x.t && (v.t == T_NONE || v.t == T_UNDEF || (v.t <= T_INT && v.u.i == x.u.i) ||
                                             (v.t > T_STR && v.u.l == x.u.l));
    if (IS("lower") || IS("upper")) {
        jv s = to_str(j, &v);
        int cased = 0;
        for (size_t i = 0; i < s.n; i++) {
            char c = s.u.s[i];
            if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
                cased = 1;
                if ((c >= 'a' && c <= 'z') != IS("lower")) return 0;
            }
        }
        return cased;
    }
    if (IS("filter")) return v.t == T_STR && known(filters, v.u.s, v.n);
    if (IS("test")) return v.t == T_STR && known(tests, v.u.s, v.n);
#undef IS
    fail(j, "No test named '%.*s'.", (int)nl, nm);
}

static int str_pred(jv s, int (*ok)(int)) {
    if (!s.n) return 0;
    for (size_t i = 0; i < s.n; i++)
        if (!ok((unsigned char)s.u.s[i])) return 0;
    return 1;
}
static int c_digit(int c) { return c >= '0' && c <= '9'; }
static int c_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static int c_alnum(int c) { return c_digit(c) || c_alpha(c); }
static int c_space(int c) { return is_sp((char)c) || (c >= 0x1c && c <= 0x1f); }

static jv call_method(J *j, jv o, const char *name, args *a) {
#define IS(lit) !strcmp(name, lit)
    if (o.t == T_LOOP && IS("cycle")) {
        if (!a->np) fail(j, "no items for cycling given");
        return a->pos[o.u.lp->i % (size_t)a->np];
    }
    if (o.t == T_DICT) {
        jdict *d = o.u.d;
        if (IS("get")) {
            jv key = arg(a, 0, "key", NONE), *v = dict_find(d, &key);
            return v ? *v : arg(a, 1, "default", NONE);
        }
        if (IS("copy")) {
            jv r = mk_dict(j);
            for (size_t i = 0; i < d->n; i++) dict_set(j, r.u.d, d->k[i], d->v[i]);
            return r;
        }
        jv r = mk_list(j, d->n, 0);
        for (size_t i = 0; i < d->n; i++) {
            if (IS("keys")) list_push(j, r.u.l, d->k[i]);
            else if (IS("values")) list_push(j, r.u.l, d->v[i]);
            else {
                jv p = mk_list(j, 2, SUB_TUPLE);
                list_push(j, p.u.l, d->k[i]);
                list_push(j, p.u.l, d->v[i]);
                list_push(j, r.u.l, p);
            }
        }
        return r;
    }
    if (o.t == T_LIST) {
        jv x = arg(a, 0, NULL, UNDEF);
        if (IS("copy")) return iterate(j, o);
        int64_t c = 0;
        for (size_t i = 0; i < o.u.l->n; i++)
            if (eq(&o.u.l->v[i], &x)) {
                if (IS("index")) return mk_int((int64_t)i);
                c++;
            }
        if (IS("index")) fail(j, "value is not in list");
        return mk_int(c);
    }
    /* strings */
    jv none = NONE;
    if (IS("strip") || IS("lstrip") || IS("rstrip")) {
        jv ch = arg(a, 0, "chars", none);
        if (ch.t != T_NONE) ch = need_str(j, ch, name);
        return strip(o, ch.t == T_STR ? &ch : NULL, !IS("rstrip"), !IS("lstrip"));
    }
    if (IS("split") || IS("rsplit")) {
        jv ms = arg(a, 1, "maxsplit", mk_int(-1));
        return split(j, o, arg(a, 0, "sep", none), need_int(j, ms, name), IS("rsplit"));
    }
    if (IS("startswith") || IS("endswith")) {
        jv p = arg(a, 0, NULL, UNDEF);
        jv list = p.t == T_LIST ? p : (jv){0};
        size_t n = p.t == T_LIST ? p.u.l->n : 1;
        for (size_t i = 0; i < n; i++) {
            jv x = need_str(j, list.t == T_LIST ? list.u.l->v[i] : p, name);
            if (x.n <= o.n && !memcmp(IS("startswith") ? o.u.s : o.u.s + o.n - x.n, x.u.s, x.n)) return mk_bool(1);
        }
        return mk_bool(0);
    }
    if (IS("upper") || IS("lower") || IS("capitalize") || IS("swapcase"))
        return case_map(j, o, IS("lower") ? 0 : IS("upper") ? 1 : IS("capitalize") ? 2 : 4);
    if (IS("title")) { /* str.title: a word is a run of letters */
        jv r = case_map(j, o, 0);
        char *p = (char *)r.u.s;
        int prev = 0;
        for (size_t i = 0; i < r.n; i++) {
            int al = c_alpha((unsigned char)p[i]);
            if (al && !prev && p[i] >= 'a') p[i] = (char)(p[i] - 32);
            prev = al;
        }
        return r;
    }
    if (IS("replace")) {
        jv c = arg(a, 2, "count", mk_int(-1));
        return replace(j, o, need_str(j, arg(a, 0, NULL, UNDEF), name), need_str(j, arg(a, 1, NULL, UNDEF), name),
                       need_int(j, c, name));
    }
    if (IS("find") || IS("rfind") || IS("index") || IS("count")) {
        jv x = need_str(j, arg(a, 0, NULL, UNDEF), name);
        int64_t found = -1, c = 0;
        for (size_t i = 0; i + x.n <= o.n; i++)
            if (!memcmp(o.u.s + i, x.u.s, x.n)) {
                if (found < 0 || IS("rfind")) found = (int64_t)cp_count(o.u.s, i);
                c++;
                if (x.n) i += x.n - 1;
                if (!IS("rfind") && !IS("count")) break;
            }
        if (IS("count")) return mk_int(c);
        if (IS("index") && found < 0) fail(j, "substring not found");
        return mk_int(found);
    }
    if (IS("format")) return py_format(j, o, a);
    if (IS("join")) {
        jv it = iterate(j, arg(a, 0, NULL, UNDEF));
        sb b = {0};
        for (size_t i = 0; i < it.u.l->n; i++) {
            if (i) sb_put(j, &b, o.u.s, o.n);
            jv x = need_str(j, it.u.l->v[i], "join");
            sb_put(j, &b, x.u.s, x.n);
        }
        return sb_val(&b);
    }
    if (IS("splitlines")) {
        jv r = mk_list(j, 0, 0);
        size_t i = 0;
        while (i < o.n) {
            size_t e = i;
            while (e < o.n && o.u.s[e] != '\n' && o.u.s[e] != '\r') e++;
            list_push(j, r.u.l, mk_str(o.u.s + i, e - i));
            if (e < o.n && o.u.s[e] == '\r' && e + 1 < o.n && o.u.s[e + 1] == '\n') e++;
            i = e + 1;
        }
        return r;
    }
    if (IS("isdigit")) return mk_bool(str_pred(o, c_digit));
    if (IS("isalpha")) return mk_bool(str_pred(o, c_alpha));
    if (IS("isalnum")) return mk_bool(str_pred(o, c_alnum));
    if (IS("isspace")) return mk_bool(str_pred(o, c_space));
    if (IS("isupper") || IS("islower")) {
        args none_args = {0};
        return mk_bool(apply_test(j, IS("isupper") ? "upper" : "lower", 5, o, &none_args));
    }
#undef IS
    fail(j, "'%s' object has no method '%s'", type_name(&o), name);
}

/* ---- entry ------------------------------------------------------------------------------- */

/* transformers' _alias_reasoning_fields: a message with reasoning under any
 * of its names gets it as "thinking" (first) and "reasoning_content". */
static void alias_reasoning(J *j, jv msgs) {
    static const char *const names[] = {"reasoning_content", "thinking", "reasoning"};
    if (msgs.t != T_LIST) return;
    for (size_t i = 0; i < msgs.u.l->n; i++) {
        jv *m = &msgs.u.l->v[i], *r = NULL;
        if (m->t != T_DICT) continue;
        for (int k = 0; k < 3 && !r; k++) {
            jv *v = dict_get(m->u.d, names[k], strlen(names[k]));
            if (v && v->t != T_NONE) r = v;
        }
        if (!r) continue;
        jv val = *r, d = mk_dict(j);
        dict_set(j, d.u.d, mk_cstr("thinking"), val);
        for (size_t k = 0; k < m->u.d->n; k++) dict_set(j, d.u.d, m->u.d->k[k], m->u.d->v[k]);
        dict_set(j, d.u.d, mk_cstr("reasoning_content"), val);
        *m = d;
    }
}

int dfl_jinja_render(const char *tmpl, size_t n, const dfl_jinja_var *vars, int n_vars,
                     const dfl_jinja_limits *lim, char **out, size_t *out_len, dfl_error *err) {
    J jj = {0}, *j = &jj;
    dfl_jinja_limits l = lim ? *lim : (dfl_jinja_limits){0};
    j->err = err;
    j->max_out = l.max_output ? l.max_output : (size_t)32 << 20;
    j->max_mem = l.max_memory ? l.max_memory : (size_t)256 << 20;
    j->max_steps = l.max_steps ? l.max_steps : 50000000;
    j->now = l.now;
    *out = NULL;
    *out_len = 0;
    int rc = 0;
    if (setjmp(j->jb)) {
        rc = err && err->code ? err->code : DFL_EARG;
        goto done;
    }
    /* jinja2 reads "\r\n" and "\r" as "\n" and drops one trailing newline */
    char *src = alloc(j, n + 1);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (tmpl[i] == '\r') {
            src[m++] = '\n';
            if (i + 1 < n && tmpl[i + 1] == '\n') i++;
        } else {
            src[m++] = tmpl[i];
        }
    }
    if (m && src[m - 1] == '\n') m--;
    src[m] = 0;
    lex(j, src, m);
    j->ti = 0;
    node *body = p_body(j, NULL, NULL, NULL);
    frame globals = {NULL, {0}};
    j->globals = j->fr = &globals;
    for (int i = 0; i < n_vars; i++) {
        j->line = j->col = 0;
        jv v = json_parse(j, vars[i].json ? vars[i].json : "null");
        if (vars[i].name) {
            if (l.chat && !strcmp(vars[i].name, "messages")) alias_reasoning(j, v);
            dict_set(j, &globals.vars, str_dup(j, vars[i].name, strlen(vars[i].name)), v);
        } else if (v.t == T_DICT) {
            for (size_t k = 0; k < v.u.d->n; k++) dict_set(j, &globals.vars, v.u.d->k[k], v.u.d->v[k]);
        } else {
            fail(j, "variables: expected a JSON object");
        }
    }
    sb o = {0};
    j->out = &o;
    j->depth = 0;
    exec(j, body);
    *out = malloc(o.n + 1);
    if (!*out) {
        rc = dfl_fail(err, DFL_ENOMEM, "chat template: out of memory");
        goto done;
    }
    if (o.n) memcpy(*out, o.p, o.n);
    (*out)[o.n] = 0;
    *out_len = o.n;
done:
    while (j->ch) {
        chunk *k = j->ch->next;
        free(j->ch);
        j->ch = k;
    }
    return rc;
}
