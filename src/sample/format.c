/* format.c - JSON schema -> byte automaton -> token masks (format.h). */
#include "sample/format.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* ==== the compiled schema ================================================== */

typedef enum {
    N_ANY,      /* any JSON value: its first byte picks one of the N_ANY_* nodes */
    N_OBJECT,   /* listed properties in order */
    N_MAP,      /* any keys; values of node `items` */
    N_ARRAY,
    N_STRING,
    N_NUMBER,
    N_INTEGER,
    N_LITERAL,  /* one of lits (enum, const, true/false/null as JSON text) */
    N_ANYOF,
} nkind;

typedef struct lits {
    int n;
    char *s[DFL_FMT_MAX_LITS];   /* JSON text of each alternative */
    int len[DFL_FMT_MAX_LITS];
} lits;

typedef struct fnode {
    nkind kind;
    int items;          /* array items / map values / -1 */
    int lo, hi;         /* minItems..maxItems, minLength..maxLength (hi -1: none) */
    lits *lit;          /* N_LITERAL values; N_OBJECT keys as JSON strings */
    int *child;         /* N_OBJECT: (lit->n) property nodes; N_ANYOF: (n_child) branches */
    int n_child;
    uint64_t *keys_from;/* N_OBJECT: (lit->n + 1) keys allowed after property i-1 */
    int width;          /* anyOf alternatives this value can be alive as at once */
} fnode;

/* The nodes every schema has, at fixed indices. */
enum { ANY = 0, ANY_MAP, ANY_ARRAY, ANY_STRING, ANY_NUMBER, ANY_WORD, N_FIXED };

struct dfl_format {
    fnode *node;        /* (n_node) */
    int n_node;
    size_t cap;
    int root;
    char prefix[DFL_FMT_MAX_AFFIX], suffix[DFL_FMT_MAX_AFFIX];
    int n_prefix, n_suffix;
    const dfl_fmt_vocab *v;
};

static int add_node(dfl_format *f, nkind kind) {
    if (f->n_node == DFL_FMT_MAX_NODES) return -1;
    f->node = xgrow(f->node, &f->cap, (size_t)f->n_node + 1, sizeof(fnode));
    fnode *n = &f->node[f->n_node];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->items = -1;
    n->hi = -1;
    return f->n_node++;
}

static void lit_add(lits *l, const char *s, size_t n) {
    l->s[l->n] = xmalloc(n + 1);
    memcpy(l->s[l->n], s, n);
    l->s[l->n][n] = 0;
    l->len[l->n++] = (int)n;
}

static void fixed_nodes(dfl_format *f) {
    add_node(f, N_ANY);
    f->node[add_node(f, N_MAP)].items = ANY;
    f->node[add_node(f, N_ARRAY)].items = ANY;
    add_node(f, N_STRING);
    add_node(f, N_NUMBER);
    int w = add_node(f, N_LITERAL);
    f->node[w].lit = xcalloc(1, sizeof(lits));
    lit_add(f->node[w].lit, "true", 4);
    lit_add(f->node[w].lit, "false", 5);
    lit_add(f->node[w].lit, "null", 4);
}

void dfl_fmt_free(dfl_format *f) {
    if (!f) return;
    for (int i = 0; i < f->n_node; i++) {
        fnode *n = &f->node[i];
        if (n->lit)
            for (int k = 0; k < n->lit->n; k++) free(n->lit->s[k]);
        free(n->lit);
        free(n->child);
        free(n->keys_from);
    }
    free(f->node);
    free(f);
}

/* ---- compiling: cJSON schema -> nodes ---------------------------------------- */

typedef struct compiler {
    dfl_format *f;
    const cJSON *root;
    const cJSON *ref_name[DFL_FMT_MAX_NODES / 8];  /* $ref targets compiled so far */
    int ref_node[DFL_FMT_MAX_NODES / 8];
    int n_ref;
    dfl_error *err;
} compiler;

static int compile(compiler *c, const cJSON *s, const char *path, int depth);

static int too_big(compiler *c, const char *path) {
    return dfl_fail(c->err, DFL_EUNSUP, "%s: the schema is too large (more than %d nodes, or "
                    "%d $refs)", path, DFL_FMT_MAX_NODES, DFL_FMT_MAX_NODES / 8);
}

/* Keywords that only annotate, and those we implement. */
static int known_keyword(const char *k) {
    static const char *ok[] = {"type", "properties", "required", "additionalProperties",
                               "items", "minItems", "maxItems", "minLength", "maxLength",
                               "enum", "const", "anyOf", "$ref", "$defs", "definitions",
                               "title", "description", "default", "examples", "$schema",
                               "$id", "$comment", "strict", NULL};
    for (int i = 0; ok[i]; i++)
        if (!strcmp(k, ok[i])) return 1;
    return 0;
}

static int get_count(compiler *c, const cJSON *s, const char *k, int def, const char *path,
                     int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, k);
    *out = def;
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e6 ||
        v->valuedouble != floor(v->valuedouble))
        return dfl_fail(c->err, DFL_EARG, "%s/%s: expected an integer 0..1000000", path, k);
    *out = (int)v->valuedouble;
    return 0;
}

static int literal_node(compiler *c, const cJSON *vals, int n, const char *path) {
    if (n < 1 || n > DFL_FMT_MAX_LITS)
        return dfl_fail(c->err, DFL_EUNSUP, "%s: enum with %d values (1..%d supported)", path, n,
                        DFL_FMT_MAX_LITS);
    int id = add_node(c->f, N_LITERAL);
    if (id < 0) return too_big(c, path);
    lits *l = xcalloc(1, sizeof *l);
    c->f->node[id].lit = l;
    const cJSON *v = vals;
    for (int i = 0; i < n; i++, v = v->next) {
        char *txt = cJSON_PrintUnformatted(v);
        if (!txt) return dfl_fail(c->err, DFL_ENOMEM, "%s: enum value", path);
        size_t len = strlen(txt);
        if (len > DFL_FMT_MAX_LIT) {
            free(txt);
            return dfl_fail(c->err, DFL_EUNSUP, "%s: an enum value longer than %d bytes", path,
                            DFL_FMT_MAX_LIT);
        }
        lit_add(l, txt, len);
        free(txt);
    }
    return id;
}

static int ref_node(compiler *c, const cJSON *s, const char *path, int depth) {
    const char *r = cJSON_GetStringValue(s);
    if (!r) return dfl_fail(c->err, DFL_EARG, "%s/$ref: expected a string", path);
    const cJSON *t = NULL;
    if (!strcmp(r, "#")) t = c->root;
    else if (!strncmp(r, "#/$defs/", 8))
        t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->root, "$defs"),
                                             r + 8);
    else if (!strncmp(r, "#/definitions/", 14))
        t = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(c->root, "definitions"), r + 14);
    if (!t)
        return dfl_fail(c->err, DFL_EUNSUP, "%s/$ref: \"%s\" not found (only #, #/$defs/NAME "
                        "and #/definitions/NAME are supported)", path, r);
    for (int i = 0; i < c->n_ref; i++)
        if (c->ref_name[i] == t) return c->ref_node[i];
    if (c->n_ref == DFL_FMT_MAX_NODES / 8) return too_big(c, path);
    /* a placeholder first, so a recursive schema refers to itself */
    int id = add_node(c->f, N_ANYOF);
    if (id < 0) return too_big(c, path);
    c->ref_name[c->n_ref] = t;
    c->ref_node[c->n_ref++] = id;
    int body = compile(c, t, r, depth + 1);
    if (body < 0) return body;
    fnode *n = &c->f->node[id];   /* a one-branch anyOf: the body */
    n->child = xmalloc(sizeof(int));
    n->child[0] = body;
    n->n_child = 1;
    return id;
}

static int object_node(compiler *c, const cJSON *s, const char *path, int depth) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    int np = props ? cJSON_GetArraySize(props) : 0;
    if (props && !cJSON_IsObject(props))
        return dfl_fail(c->err, DFL_EARG, "%s/properties: expected an object", path);
    if (req && !cJSON_IsArray(req))
        return dfl_fail(c->err, DFL_EARG, "%s/required: expected an array of names", path);
    if (np == 0) {   /* a map: any keys, values of additionalProperties */
        if (!add || cJSON_IsTrue(add)) return ANY_MAP;
        int id = add_node(c->f, N_MAP);
        if (id < 0) return too_big(c, path);
        if (cJSON_IsFalse(add)) {   /* {} only: a map that takes no key */
            c->f->node[id].hi = 0;
            return id;
        }
        char p[256];
        snprintf(p, sizeof p, "%s/additionalProperties", path);
        int v = compile(c, add, p, depth + 1);
        if (v < 0) return v;
        c->f->node[id].items = v;
        return id;
    }
    if (add && !cJSON_IsFalse(add))
        return dfl_fail(c->err, DFL_EUNSUP, "%s: additionalProperties beside properties is not "
                        "supported (use false)", path);
    if (np > DFL_FMT_MAX_LITS)
        return dfl_fail(c->err, DFL_EUNSUP, "%s: %d properties (at most %d)", path, np,
                        DFL_FMT_MAX_LITS);
    int id = add_node(c->f, N_OBJECT);
    if (id < 0) return too_big(c, path);
    lits *l = xcalloc(1, sizeof *l);
    int *ch = xmalloc(sizeof(int) * (size_t)np);
    int required[DFL_FMT_MAX_LITS] = {0};
    c->f->node[id].lit = l;
    c->f->node[id].child = ch;
    int k = 0;
    for (const cJSON *p = props->child; p; p = p->next, k++) {
        cJSON *key = cJSON_CreateString(p->string);
        char *txt = cJSON_PrintUnformatted(key);
        cJSON_Delete(key);
        if (!txt) return dfl_fail(c->err, DFL_ENOMEM, "%s: property name", path);
        size_t len = strlen(txt);
        if (len > DFL_FMT_MAX_LIT) len = DFL_FMT_MAX_LIT;   /* refused below */
        lit_add(l, txt, len);
        free(txt);
        if (l->len[k] == DFL_FMT_MAX_LIT)
            return dfl_fail(c->err, DFL_EUNSUP, "%s: a property name longer than %d bytes", path,
                            DFL_FMT_MAX_LIT - 2);
        for (int j = 0; j < k; j++)
            if (!strcmp(l->s[j], l->s[k]))
                return dfl_fail(c->err, DFL_EARG, "%s: property \"%s\" given twice", path,
                                p->string);
        char pp[256];
        snprintf(pp, sizeof pp, "%s/properties/%s", path, p->string);
        int x = compile(c, p, pp, depth + 1);
        if (x < 0) return x;
        ch = c->f->node[id].child;   /* compile may have moved node[] */
        ch[k] = x;
    }
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        const char *name = cJSON_GetStringValue(r);
        int j = 0;
        for (const cJSON *p = props->child; p && name; p = p->next, j++)
            if (!strcmp(p->string, name)) break;
        if (!name || j == np)
            return dfl_fail(c->err, DFL_EARG, "%s/required: \"%s\" is not among the properties",
                            path, name ? name : "(not a string)");
        required[j] = 1;
    }
    /* Keys come in order; after property i-1 the next may be any up to and
     * including the first required one. */
    uint64_t *from = xmalloc(sizeof(uint64_t) * (size_t)(np + 1));
    for (int i = 0; i <= np; i++) {
        uint64_t m = 0;
        for (int j = i; j < np; j++) {
            m |= 1ull << j;
            if (required[j]) break;
        }
        from[i] = m;
    }
    fnode *n = &c->f->node[id];
    n->keys_from = from;
    n->n_child = np;
    /* '}' may come after property i-1 when none from i on is required */
    n->lo = np;
    for (int j = np - 1; j >= 0 && !required[j]; j--) n->lo = j;
    return id;
}

static int typed_node(compiler *c, const cJSON *s, const char *type, const char *path,
                      int depth) {
    if (!strcmp(type, "object")) return object_node(c, s, path, depth);
    if (!strcmp(type, "boolean")) {
        cJSON *v = cJSON_CreateArray();
        cJSON_AddItemToArray(v, cJSON_CreateTrue());
        cJSON_AddItemToArray(v, cJSON_CreateFalse());
        int id = literal_node(c, v->child, 2, path);
        cJSON_Delete(v);
        return id;
    }
    if (!strcmp(type, "null")) {
        cJSON *v = cJSON_CreateNull();
        int id = literal_node(c, v, 1, path);
        cJSON_Delete(v);
        return id;
    }
    nkind k = !strcmp(type, "array") ? N_ARRAY : !strcmp(type, "string") ? N_STRING
            : !strcmp(type, "number") ? N_NUMBER : !strcmp(type, "integer") ? N_INTEGER : N_ANY;
    if (k == N_ANY)
        return dfl_fail(c->err, DFL_EUNSUP, "%s/type: \"%s\" is not a JSON schema type", path,
                        type);
    int lo, hi, rc;
    const char *klo = k == N_ARRAY ? "minItems" : "minLength";
    const char *khi = k == N_ARRAY ? "maxItems" : "maxLength";
    if ((rc = get_count(c, s, klo, 0, path, &lo)) || (rc = get_count(c, s, khi, -1, path, &hi)))
        return rc;
    if (hi >= 0 && hi < lo)
        return dfl_fail(c->err, DFL_EARG, "%s: %s %d > %s %d", path, klo, lo, khi, hi);
    int items = ANY;
    if (k == N_ARRAY && cJSON_GetObjectItemCaseSensitive(s, "items")) {
        char p[256];
        snprintf(p, sizeof p, "%s/items", path);
        items = compile(c, cJSON_GetObjectItemCaseSensitive(s, "items"), p, depth + 1);
        if (items < 0) return items;
    }
    int id = add_node(c->f, k);
    if (id < 0) return too_big(c, path);
    c->f->node[id].lo = lo;
    c->f->node[id].hi = hi;
    c->f->node[id].items = items;
    return id;
}

/* An anyOf over arr's members: schemas (anyOf), or type names each applied
 * to the rest of s (a list of types). */
static int union_node(compiler *c, const cJSON *s, const cJSON *arr, int types, const char *path,
                      int depth) {
    const char *what = types ? "type" : "anyOf";
    int n = cJSON_GetArraySize(arr);
    if (!cJSON_IsArray(arr) || n < 1 || n > DFL_FMT_MAX_ALT)
        return dfl_fail(c->err, DFL_EUNSUP, "%s/%s: expected an array of 1..%d %s", path, what,
                        DFL_FMT_MAX_ALT, types ? "type names" : "schemas");
    int id = add_node(c->f, N_ANYOF);
    if (id < 0) return too_big(c, path);
    int *ch = xmalloc(sizeof(int) * (size_t)n);
    int k = 0;
    for (const cJSON *b = arr->child; b; b = b->next, k++) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s/%d", path, what, k);
        int x = !types ? compile(c, b, p, depth + 1)
              : cJSON_IsString(b) ? typed_node(c, s, b->valuestring, path, depth)
              : dfl_fail(c->err, DFL_EARG, "%s: expected a type name", p);
        if (x < 0) {
            free(ch);
            return x;
        }
        ch[k] = x;
    }
    c->f->node[id].child = ch;
    c->f->node[id].n_child = n;
    return id;
}

static int compile(compiler *c, const cJSON *s, const char *path, int depth) {
    if (depth > DFL_FMT_MAX_DEPTH * 4)
        return dfl_fail(c->err, DFL_EUNSUP, "%s: the schema nests too deeply", path);
    if (cJSON_IsTrue(s)) return ANY;
    if (!cJSON_IsObject(s))
        return dfl_fail(c->err, DFL_EARG, "%s: expected a schema object", path);
    for (const cJSON *k = s->child; k; k = k->next)
        if (!known_keyword(k->string))
            return dfl_fail(c->err, DFL_EUNSUP, "%s: the keyword \"%s\" is not supported in "
                            "structured output", path, k->string);
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "$ref"))) return ref_node(c, v, path, depth);
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "const"))) {
        cJSON *one = cJSON_Duplicate(v, 1);
        int id = literal_node(c, one, 1, path);
        cJSON_Delete(one);
        return id;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        if (!cJSON_IsArray(v)) return dfl_fail(c->err, DFL_EARG, "%s/enum: expected an array", path);
        return literal_node(c, v->child, cJSON_GetArraySize(v), path);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "anyOf")))
        return union_node(c, s, v, 0, path, depth);
    v = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(v)) return typed_node(c, s, v->valuestring, path, depth);
    if (cJSON_IsArray(v)) return union_node(c, s, v, 1, path, depth);
    if (v) return dfl_fail(c->err, DFL_EARG, "%s/type: expected a string or a list", path);
    if (cJSON_GetObjectItemCaseSensitive(s, "properties")) return object_node(c, s, path, depth);
    return ANY;
}

/* widths: anyOf adds its branches', containers take their widest member's
 * (members come one after another); iterated to a fixed point because
 * $ref may recurse. Saturates past the limit. */
static int widths(dfl_format *f) {
    for (int i = 0; i < f->n_node; i++) f->node[i].width = 1;
    for (int changed = 1, it = 0; changed; it++) {
        changed = 0;
        for (int i = 0; i < f->n_node; i++) {
            fnode *n = &f->node[i];
            int w = 1;
            if (n->kind == N_ANYOF) {
                w = 0;
                for (int k = 0; k < n->n_child; k++) w += f->node[n->child[k]].width;
            } else if (n->kind == N_OBJECT) {
                for (int k = 0; k < n->n_child; k++)
                    if (f->node[n->child[k]].width > w) w = f->node[n->child[k]].width;
            } else if (n->items >= 0) {
                w = f->node[n->items].width;
            }
            if (w > DFL_FMT_MAX_ALT) w = DFL_FMT_MAX_ALT + 1;
            if (w != n->width) n->width = w, changed = 1;
        }
        if (it > f->n_node * (DFL_FMT_MAX_ALT + 2)) break;
    }
    return f->node[f->root].width;
}

/* An anyOf (or $ref) that reaches itself through anyOf branches alone would
 * start a value forever without reading a byte. DFS colours: 1 on the path. */
static int cycle_from(dfl_format *f, int x, uint8_t *col) {
    if (f->node[x].kind != N_ANYOF || col[x] == 2) return 0;
    if (col[x] == 1) return 1;
    col[x] = 1;
    for (int k = 0; k < f->node[x].n_child; k++)
        if (cycle_from(f, f->node[x].child[k], col)) return 1;
    col[x] = 2;
    return 0;
}

static int anyof_cycle(dfl_format *f) {
    uint8_t *col = xcalloc((size_t)f->n_node, 1);
    int bad = 0;
    for (int i = 0; i < f->n_node && !bad; i++) bad = cycle_from(f, i, col);
    free(col);
    return bad;
}

static int affix(char *dst, int *n, const char *src, const char *what, dfl_error *err) {
    size_t len = src ? strlen(src) : 0;
    if (len >= DFL_FMT_MAX_AFFIX)
        return dfl_fail(err, DFL_EARG, "format %s: %zu bytes (at most %d)", what, len,
                        DFL_FMT_MAX_AFFIX - 1);
    if (len) memcpy(dst, src, len);
    *n = (int)len;
    return 0;
}

int dfl_fmt_compile(const char *schema, const char *prefix, const char *suffix,
                    const dfl_fmt_vocab *v, dfl_format **out, dfl_error *err) {
    *out = NULL;
    dfl_format *f = xcalloc(1, sizeof *f);
    f->v = v;
    fixed_nodes(f);
    f->root = ANY_MAP;
    int rc = affix(f->prefix, &f->n_prefix, prefix, "prefix", err);
    if (!rc) rc = affix(f->suffix, &f->n_suffix, suffix, "suffix", err);
    if (!rc && schema) {
        cJSON *s = cJSON_Parse(schema);
        if (!s) rc = dfl_fail(err, DFL_EARG, "the JSON schema is not valid JSON");
        compiler *c = rc ? NULL : xcalloc(1, sizeof *c);
        if (c) {
            *c = (compiler){.f = f, .root = s, .err = err};
            rc = compile(c, s, "#", 0);
            if (rc >= 0) f->root = rc, rc = 0;
            free(c);
        }
        cJSON_Delete(s);
    }
    if (!rc && anyof_cycle(f))
        rc = dfl_fail(err, DFL_EUNSUP, "the schema's anyOf / $ref refer to themselves without a "
                      "value in between");
    if (!rc && widths(f) > DFL_FMT_MAX_ALT)
        rc = dfl_fail(err, DFL_EUNSUP, "the schema can be more than %d of its anyOf branches at "
                      "once (or an anyOf refers to itself)", DFL_FMT_MAX_ALT);
    if (rc) {
        dfl_fmt_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

/* ==== the automaton ========================================================== */

/* Where a frame is inside its value. */
enum {
    P_OPEN,                            /* containers and strings: before the opening byte */
    P_FIRST, P_KEY, P_COLON, P_VALUE, P_NEXT,   /* objects and maps; arrays use FIRST,VALUE,NEXT */
    P_IN, P_ESC, P_HEX, P_UTF8,        /* strings */
    P_SIGN, P_ZERO, P_INT, P_DOT, P_FRAC, P_E, P_ESIGN, P_EXP,  /* numbers (P_OPEN first) */
    P_LIT,                             /* literals and object keys */
};

typedef struct frame {
    int32_t node;
    uint8_t phase;
    uint8_t key;        /* a literal that is an object's key (node: the object) */
    uint8_t aux;        /* hex digits / UTF-8 continuation bytes left */
    uint8_t pad;
    int32_t count;      /* items, characters, number bytes; objects: the current property */
    int32_t off;        /* literals: bytes matched; objects: next property allowed */
    uint64_t mask;      /* literals: alternatives still matching */
} frame;

/* Base phases, below every frame. */
enum { B_PREFIX, B_VALUE, B_SUFFIX };

typedef struct alt {
    uint8_t base, ws, dead, pad;
    int16_t off;        /* prefix / suffix bytes matched */
    int16_t depth;
    frame fr[DFL_FMT_MAX_DEPTH];
} alt;

typedef struct fstate {
    int n;
    alt a[DFL_FMT_MAX_ALT];
} fstate;

#define ALT_HEAD offsetof(alt, fr)

static void alt_copy(alt *d, const alt *s) {
    memcpy(d, s, ALT_HEAD + sizeof(frame) * (size_t)s->depth);
}

static void state_copy(fstate *d, const fstate *s) {
    d->n = s->n;
    for (int i = 0; i < s->n; i++) alt_copy(&d->a[i], &s->a[i]);
}

static void state_init(const dfl_format *f, fstate *s) {
    s->n = 1;
    memset(&s->a[0], 0, ALT_HEAD);
    s->a[0].base = f->n_prefix ? B_PREFIX : B_VALUE;
}

static int is_ws(int c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* Results of one frame's step. */
enum { R_DEAD, R_TAKEN, R_CLOSED, R_ENDED, R_PUSH };
/* TAKEN: consumed; CLOSED: consumed and the frame is complete (pop);
 * ENDED: complete without consuming (pop, feed the byte to the parent);
 * PUSH: a child value starts with this byte (*child: its node). */

/* Whitespace between JSON tokens: one space, or a newline and up to
 * DFL_FMT_MAX_INDENT spaces or tabs (pretty printing), never more: a model
 * that loves blank lines cannot spend its tokens on them. a->ws: 0 none yet,
 * 1 after a space, 2 + n after a newline and n indent bytes. */
static int ws_or(alt *a, int c) {
    if (!is_ws(c)) return 0;
    if (a->ws == 0 && (c == ' ' || c == '\n')) return a->ws = c == ' ' ? 1 : 2, R_TAKEN;
    if (a->ws >= 2 && (c == ' ' || c == '\t') && a->ws < 2 + DFL_FMT_MAX_INDENT)
        return a->ws++, R_TAKEN;
    return R_DEAD;
}

static int step_object(const dfl_format *f, alt *a, frame *fr, int c, int *child) {
    const fnode *n = &f->node[fr->node];
    int map = n->kind == N_MAP;
    int w = ws_or(a, c);
    if (w && fr->phase != P_OPEN) return w;
    switch (fr->phase) {
    case P_OPEN:
        if (c != '{') return R_DEAD;
        fr->phase = P_FIRST;
        return R_TAKEN;
    case P_FIRST:
    case P_KEY:
        if (c == '}' && fr->phase == P_FIRST && (map || fr->off >= n->lo)) return R_CLOSED;
        if (c != '"') return R_DEAD;
        if (map && n->hi == 0) return R_DEAD;
        if (!map && !(n->keys_from[fr->off])) return R_DEAD;
        fr->phase = P_COLON;
        *child = map ? ANY_STRING : -2;   /* -2: this object's key literal */
        return R_PUSH;
    case P_COLON:
        if (c != ':') return R_DEAD;
        fr->phase = P_VALUE;
        return R_TAKEN;
    case P_VALUE:
        fr->phase = P_NEXT;
        *child = map ? n->items : n->child[fr->count];
        return R_PUSH;
    case P_NEXT:
        if (c == '}') return map || fr->off >= n->lo ? R_CLOSED : R_DEAD;
        if (c != ',') return R_DEAD;
        if (!map && !n->keys_from[fr->off]) return R_DEAD;
        fr->phase = P_KEY;
        return R_TAKEN;
    }
    return R_DEAD;
}

static int step_array(const dfl_format *f, alt *a, frame *fr, int c, int *child) {
    const fnode *n = &f->node[fr->node];
    int w = ws_or(a, c);
    if (w && fr->phase != P_OPEN) return w;
    switch (fr->phase) {
    case P_OPEN:
        if (c != '[') return R_DEAD;
        fr->phase = P_FIRST;
        return R_TAKEN;
    case P_FIRST:
        if (c == ']') return fr->count >= n->lo ? R_CLOSED : R_DEAD;
        __attribute__((fallthrough));   /* the first value starts */
    case P_VALUE:
        if (n->hi >= 0 && fr->count >= n->hi) return R_DEAD;
        fr->count++;
        fr->phase = P_NEXT;
        *child = n->items;
        return R_PUSH;
    case P_NEXT:
        if (c == ']') return fr->count >= n->lo ? R_CLOSED : R_DEAD;
        if (c != ',' || (n->hi >= 0 && fr->count >= n->hi)) return R_DEAD;
        fr->phase = P_VALUE;
        return R_TAKEN;
    }
    return R_DEAD;
}

static int hex(int c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int step_string(const dfl_format *f, frame *fr, int c) {
    const fnode *n = &f->node[fr->node];
    if (c == DFL_FMT_END) return R_DEAD;
    switch (fr->phase) {
    case P_OPEN:
        if (c != '"') return R_DEAD;
        fr->phase = P_IN;
        return R_TAKEN;
    case P_ESC:
        if (c == 'u') fr->phase = P_HEX, fr->aux = 4;
        else if (strchr("\"\\/bfnrt", c)) fr->phase = P_IN;
        else return R_DEAD;
        return R_TAKEN;
    case P_HEX:
        if (!hex(c)) return R_DEAD;
        if (--fr->aux == 0) fr->phase = P_IN;
        return R_TAKEN;
    case P_UTF8:
        if (c < 0x80 || c > 0xBF) return R_DEAD;
        if (--fr->aux == 0) fr->phase = P_IN;
        return R_TAKEN;
    }
    /* P_IN: a new character, or the end */
    if (c == '"') return fr->count >= n->lo ? R_CLOSED : R_DEAD;
    if (c < 0x20 || (c >= 0x80 && c < 0xC2) || c > 0xF4) return R_DEAD;
    if (n->hi >= 0 && fr->count >= n->hi) return R_DEAD;
    fr->count++;
    if (c == '\\') fr->phase = P_ESC;
    else if (c >= 0xC2) fr->phase = P_UTF8, fr->aux = c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
    return R_TAKEN;
}

static int step_number(const dfl_format *f, frame *fr, int c) {
    int integer = f->node[fr->node].kind == N_INTEGER;
    int digit = c >= '0' && c <= '9';
    int ph = fr->phase, next = -1;
    switch (ph) {
    case P_OPEN: next = c == '-' ? P_SIGN : c == '0' ? P_ZERO : digit ? P_INT : -1; break;
    case P_SIGN: next = c == '0' ? P_ZERO : digit ? P_INT : -1; break;
    case P_DOT: next = digit ? P_FRAC : -1; break;
    case P_E: next = c == '+' || c == '-' ? P_ESIGN : digit ? P_EXP : -1; break;
    case P_ESIGN: next = digit ? P_EXP : -1; break;
    default:   /* P_ZERO, P_INT, P_FRAC, P_EXP: a number may end here */
        if (digit && ph != P_ZERO) next = ph;
        else if (c == '.' && !integer && (ph == P_ZERO || ph == P_INT)) next = P_DOT;
        else if ((c == 'e' || c == 'E') && !integer && ph != P_EXP) next = P_E;
        else return R_ENDED;
    }
    if (next < 0 || fr->count >= DFL_FMT_MAX_NUM) return R_DEAD;
    fr->phase = (uint8_t)next;
    fr->count++;
    return R_TAKEN;
}

static const lits *frame_lits(const dfl_format *f, const frame *fr) {
    return f->node[fr->node].lit;
}

/* Literals: keep the alternatives whose next byte is c; when none, the
 * literal ends if one of them is complete (its index goes to the parent). */
static int step_literal(const dfl_format *f, frame *fr, int c, int *done) {
    const lits *l = frame_lits(f, fr);
    uint64_t keep = 0;
    *done = -1;
    for (uint64_t m = fr->mask; m; m &= m - 1) {
        int i = __builtin_ctzll(m);
        if (l->len[i] == fr->off) *done = i;
        else if (c != DFL_FMT_END && (unsigned char)l->s[i][fr->off] == c) keep |= 1ull << i;
    }
    if (keep) {
        fr->mask = keep;
        fr->off++;
        return R_TAKEN;
    }
    return *done >= 0 ? R_ENDED : R_DEAD;
}

static int step_base(const dfl_format *f, alt *a, int c, int *child) {
    switch (a->base) {
    case B_PREFIX:
        if (c != (unsigned char)f->prefix[a->off]) return R_DEAD;
        if (++a->off == f->n_prefix) a->base = B_VALUE, a->off = 0;
        return R_TAKEN;
    case B_VALUE:
        if (is_ws(c)) return ws_or(a, c);
        a->base = B_SUFFIX;
        *child = f->root;
        return R_PUSH;
    }
    /* B_SUFFIX */
    if (a->off == f->n_suffix) return c == DFL_FMT_END ? R_TAKEN : R_DEAD;
    if (c != (unsigned char)f->suffix[a->off]) return R_DEAD;
    a->off++;
    return R_TAKEN;
}

static int alt_feed(const dfl_format *f, fstate *s, int ai, int c);

/* Starts a value of node x on alt ai with byte c; anyOf forks the alt. */
static int alt_start(const dfl_format *f, fstate *s, int ai, int x, int c) {
    alt *a = &s->a[ai];
    const fnode *n = &f->node[x];
    if (n->kind == N_ANYOF) {   /* the other branches go on as new alts */
        for (int k = 1; k < n->n_child; k++) {
            if (s->n == DFL_FMT_MAX_ALT) break;   /* cannot happen: widths() bounds it */
            int j = s->n++;
            alt_copy(&s->a[j], a);
            s->a[j].dead = !alt_start(f, s, j, n->child[k], c);
        }
        return alt_start(f, s, ai, n->child[0], c);
    }
    if (n->kind == N_ANY) {
        x = c == '{' ? ANY_MAP : c == '[' ? ANY_ARRAY : c == '"' ? ANY_STRING
          : c == '-' || (c >= '0' && c <= '9') ? ANY_NUMBER : ANY_WORD;
        n = &f->node[x];
    }
    if (a->depth == DFL_FMT_MAX_DEPTH) return 0;
    frame *fr = &a->fr[a->depth++];
    memset(fr, 0, sizeof *fr);
    fr->node = x;
    fr->phase = n->kind == N_LITERAL ? P_LIT : P_OPEN;
    if (n->kind == N_LITERAL) fr->mask = n->lit->n == 64 ? ~0ull : (1ull << n->lit->n) - 1;
    return alt_feed(f, s, ai, c);
}

static int frame_step(const dfl_format *f, alt *a, frame *fr, int c, int *child, int *done) {
    if (fr->phase == P_LIT) return step_literal(f, fr, c, done);
    switch (f->node[fr->node].kind) {
    case N_OBJECT:
    case N_MAP: return c == DFL_FMT_END ? R_DEAD : step_object(f, a, fr, c, child);
    case N_ARRAY: return c == DFL_FMT_END ? R_DEAD : step_array(f, a, fr, c, child);
    case N_STRING: return step_string(f, fr, c);
    default: return step_number(f, fr, c);
    }
}

/* Feeds byte c (or DFL_FMT_END) to alt ai; 0 when the alt dies. */
static int alt_feed(const dfl_format *f, fstate *s, int ai, int c) {
    alt *a = &s->a[ai];
    for (;;) {
        int child = -1, done = -1;
        frame *fr = a->depth ? &a->fr[a->depth - 1] : NULL;
        int r = fr ? frame_step(f, a, fr, c, &child, &done) : step_base(f, a, c, &child);
        if (r != R_PUSH && !is_ws(c) && r != R_ENDED) a->ws = 0;
        switch (r) {
        case R_DEAD: return 0;
        case R_TAKEN: return 1;
        case R_CLOSED: a->depth--; return 1;
        case R_ENDED:
            a->depth--;
            if (fr->key) {   /* the object below learns which property came */
                frame *o = &a->fr[a->depth - 1];
                o->count = done;
                o->off = done + 1;
            }
            continue;
        case R_PUSH:
            if (child == -2) {   /* an object's key: a literal over its names */
                if (a->depth == DFL_FMT_MAX_DEPTH) return 0;
                frame *k = &a->fr[a->depth++];
                memset(k, 0, sizeof *k);
                k->node = fr->node;
                k->phase = P_LIT;
                k->key = 1;
                k->mask = f->node[fr->node].keys_from[fr->off];
                continue;
            }
            return alt_start(f, s, ai, child, c);
        }
    }
}

/* Feeds c to every alt of s in place; 0 when none survives. */
static int state_feed(const dfl_format *f, fstate *s, int c) {
    int n0 = s->n;
    for (int i = 0; i < n0; i++) s->a[i].dead = !alt_feed(f, s, i, c);
    int k = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->a[i].dead) continue;
        if (k != i) alt_copy(&s->a[k], &s->a[i]);
        k++;
    }
    s->n = k;
    return k > 0;
}

static int state_feed_bytes(const dfl_format *f, fstate *s, const char *p, int n) {
    for (int i = 0; i < n; i++)
        if (!state_feed(f, s, (unsigned char)p[i])) return 0;
    return 1;
}

int dfl_fmt_accepts(const dfl_format *f, const char *text, size_t n) {
    fstate *s = xmalloc(sizeof *s);
    state_init(f, s);
    int ok = n <= INT32_MAX && state_feed_bytes(f, s, text, (int)n) &&
             state_feed(f, s, DFL_FMT_END);
    free(s);
    return ok;
}

/* ==== the vocabulary and the mask ================================================ */

static const dfl_fmt_vocab *sort_vocab;   /* qsort has no context argument */

static int cmp_tok(const void *x, const void *y) {
    int a = *(const int32_t *)x, b = *(const int32_t *)y;
    const dfl_fmt_vocab *v = sort_vocab;
    int n = v->len[a] < v->len[b] ? v->len[a] : v->len[b];
    int c = memcmp(v->bytes[a], v->bytes[b], (size_t)n);
    if (c) return c;
    if (v->len[a] != v->len[b]) return v->len[a] - v->len[b];
    return a - b;
}

static pthread_mutex_t sort_mu = PTHREAD_MUTEX_INITIALIZER;

/* lcp[i]: bytes ord[i] shares with ord[i-1]. */
static void prefixes(const dfl_fmt_vocab *v, const int32_t *ord, uint8_t *lcp, int n) {
    for (int i = 0; i < n; i++) {
        int l = 0;
        if (i) {
            int a = ord[i - 1], b = ord[i];
            while (l < v->len[a] && l < v->len[b] && v->bytes[a][l] == v->bytes[b][l]) l++;
        }
        lcp[i] = (uint8_t)l;
    }
}

/* Characters p adds to a JSON string from a character boundary, or 0 when
 * it is not plain content (a quote, backslash or control byte, a byte no
 * UTF-8 character starts with, a broken continuation). It may end inside a
 * character. */
static int plain_chars(const unsigned char *p, int n) {
    int chars = 0;
    for (int i = 0; i < n; chars++) {
        int c = p[i++];
        if (c == '"' || c == '\\' || c < 0x20 || (c >= 0x80 && c < 0xC2) || c > 0xF4) return 0;
        int k = c < 0x80 ? 0 : c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
        for (; k && i < n; k--, i++)
            if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    }
    return chars;
}

dfl_fmt_vocab *dfl_fmt_vocab_new(int n, const char **bytes, int *len, uint8_t *kind) {
    dfl_fmt_vocab *v = xcalloc(1, sizeof *v);
    *v = (dfl_fmt_vocab){.n_vocab = n, .bytes = bytes, .len = len, .kind = kind};
    v->ord = xmalloc(sizeof(int32_t) * (size_t)(n + 1));
    v->lcp = xmalloc((size_t)n + 1);
    v->special = xmalloc(sizeof(int32_t) * (size_t)(n + 1));
    v->eog = xmalloc(sizeof(int32_t) * (size_t)(n + 1));
    for (int i = 0; i < n; i++) {
        if (kind[i] == DFL_FMT_TOK_TEXT && (len[i] < 1 || len[i] > DFL_FMT_MAX_TOKEN))
            kind[i] = DFL_FMT_TOK_NONE;
        if (kind[i] == DFL_FMT_TOK_TEXT) v->ord[v->n_ord++] = i;
        else if (kind[i] == DFL_FMT_TOK_SPECIAL && len[i] > 0 && len[i] <= DFL_FMT_MAX_AFFIX)
            v->special[v->n_special++] = i;
        else if (kind[i] == DFL_FMT_TOK_EOG) v->eog[v->n_eog++] = i;
    }
    pthread_mutex_lock(&sort_mu);
    sort_vocab = v;
    qsort(v->ord, (size_t)v->n_ord, sizeof(int32_t), cmp_tok);
    pthread_mutex_unlock(&sort_mu);
    prefixes(v, v->ord, v->lcp, v->n_ord);
    v->nchars = xcalloc((size_t)n + 1, 1);
    v->plain = xmalloc(sizeof(int32_t) * (size_t)(v->n_ord + 1));
    v->ord2 = xmalloc(sizeof(int32_t) * (size_t)(v->n_ord + 1));
    v->lcp2 = xmalloc((size_t)v->n_ord + 1);
    for (int i = 0; i < v->n_ord; i++) {   /* ord2 keeps the sorted order */
        int id = v->ord[i];
        v->nchars[id] = (uint8_t)plain_chars((const unsigned char *)bytes[id], len[id]);
        if (v->nchars[id]) v->plain[v->n_plain++] = id;
        else v->ord2[v->n_ord2++] = id;
    }
    prefixes(v, v->ord2, v->lcp2, v->n_ord2);
    return v;
}

void dfl_fmt_vocab_free(dfl_fmt_vocab *v) {
    if (!v) return;
    free(v->bytes);
    free(v->len);
    free(v->kind);
    free(v->ord);
    free(v->lcp);
    free(v->special);
    free(v->eog);
    free(v->nchars);
    free(v->plain);
    free(v->ord2);
    free(v->lcp2);
    free(v);
}

struct dfl_fmt_run {
    const dfl_format *f;
    int origin, n_done;   /* the state commit follows tokens origin .. origin+n_done */
    fstate *commit, *row; /* after the committed tokens; after a row's history */
    fstate *walk;         /* (DFL_FMT_MAX_TOKEN + 1) states along a token's bytes */
    uint8_t *ok;          /* (n_vocab) */
};

dfl_fmt_run *dfl_fmt_run_new(const dfl_format *f, int origin) {
    dfl_fmt_run *r = xcalloc(1, sizeof *r);
    r->f = f;
    r->origin = origin;
    r->commit = xmalloc(sizeof(fstate));
    r->row = xmalloc(sizeof(fstate));
    r->walk = xmalloc(sizeof(fstate) * (DFL_FMT_MAX_TOKEN + 1));
    r->ok = xmalloc((size_t)f->v->n_vocab);
    state_init(f, r->commit);
    return r;
}

void dfl_fmt_run_free(dfl_fmt_run *r) {
    if (!r) return;
    free(r->commit);
    free(r->row);
    free(r->walk);
    free(r->ok);
    free(r);
}

/* A generated token moves the state by its bytes; an end-of-generation one ends it. */
static int feed_token(const dfl_format *f, fstate *s, int32_t id) {
    const dfl_fmt_vocab *v = f->v;
    if (id < 0 || id >= v->n_vocab) return s->n = 0;
    if (v->kind[id] == DFL_FMT_TOK_EOG) return state_feed(f, s, DFL_FMT_END);
    return state_feed_bytes(f, s, v->bytes[id], v->len[id]);
}

static void history_state(dfl_fmt_run *r, const int32_t *a, int n_a, const int32_t *b,
                          int n_b) {
    const dfl_format *f = r->f;
    if (r->origin + r->n_done > n_a) {   /* the history is not a continuation: restart */
        state_init(f, r->commit);
        r->n_done = 0;
    }
    for (; r->origin + r->n_done < n_a; r->n_done++)
        if (r->commit->n) feed_token(f, r->commit, a[r->origin + r->n_done]);
    state_copy(r->row, r->commit);
    for (int i = 0; i < n_b && r->row->n; i++)
        if (n_a + i >= r->origin) feed_token(f, r->row, b[i]);
}

/* Marks in r->ok the tokens of ord (sorted, lcp as made by prefixes) whose
 * bytes the state takes: a walk that reuses the states of a shared prefix
 * and skips every token that starts with a refused one. */
static void walk_vocab(dfl_fmt_run *r, const int32_t *ord, const uint8_t *lcp, int n_ord) {
    const dfl_format *f = r->f;
    const dfl_fmt_vocab *v = f->v;
    fstate *st = r->walk;
    state_copy(&st[0], r->row);
    int valid = 0;   /* st[0..valid] hold the states after the current token's first bytes */
    for (int i = 0; i < n_ord; i++) {
        int id = ord[i], n = v->len[id];
        const unsigned char *p = (const unsigned char *)v->bytes[id];
        int l = lcp[i] < valid ? lcp[i] : valid;
        while (l < n) {
            state_copy(&st[l + 1], &st[l]);
            if (!state_feed(f, &st[l + 1], p[l])) break;
            l++;
        }
        valid = l;
        if (l == n) {
            r->ok[id] = 1;
            continue;
        }
        while (i + 1 < n_ord && lcp[i + 1] > l) i++;   /* same refused prefix */
    }
}

/* Inside a string (every alt at a character boundary of one), a plain token
 * fits when its characters do: returns 0 when the state is not such. */
static int plain_tokens(dfl_fmt_run *r) {
    const dfl_format *f = r->f;
    const dfl_fmt_vocab *v = f->v;
    long room = 0;   /* the most characters any alt's string still takes */
    for (int i = 0; i < r->row->n; i++) {
        const alt *a = &r->row->a[i];
        const frame *fr = a->depth ? &a->fr[a->depth - 1] : NULL;
        if (!fr || fr->phase != P_IN || f->node[fr->node].kind != N_STRING) return 0;
        const fnode *n = &f->node[fr->node];
        long left = n->hi < 0 ? 1L << 30 : (long)n->hi - fr->count;
        if (left > room) room = left;
    }
    for (int i = 0; i < v->n_plain; i++)
        if (v->nchars[v->plain[i]] <= room) r->ok[v->plain[i]] = 1;
    return 1;
}

static int in_affix(const dfl_format *f, const fstate *s) {
    for (int i = 0; i < s->n; i++) {
        const alt *a = &s->a[i];
        if (!a->depth && (a->base == B_PREFIX || (a->base == B_SUFFIX && a->off < f->n_suffix)))
            return 1;
    }
    return 0;
}

void dfl_fmt_mask(dfl_fmt_run *r, const int32_t *a, int n_a, const int32_t *b, int n_b,
                  float *row) {
    if (n_a + n_b < r->origin) return;
    const dfl_format *f = r->f;
    const dfl_fmt_vocab *v = f->v;
    history_state(r, a, n_a, b, n_b);
    memset(r->ok, 0, (size_t)v->n_vocab);
    int any = 0;
    if (r->row->n) {
        if (plain_tokens(r)) walk_vocab(r, v->ord2, v->lcp2, v->n_ord2);
        else walk_vocab(r, v->ord, v->lcp, v->n_ord);
        fstate *t = &r->walk[0];
        for (int i = 0; i < v->n_special && in_affix(f, r->row); i++) {
            /* control tokens may spell the prefix or suffix, never the value */
            int id = v->special[i];
            state_copy(t, r->row);
            if (state_feed_bytes(f, t, v->bytes[id], v->len[id])) r->ok[id] = 1;
        }
        state_copy(t, r->row);
        if (state_feed(f, t, DFL_FMT_END))
            for (int i = 0; i < v->n_eog; i++) r->ok[v->eog[i]] = 1;
        for (int i = 0; i < v->n_vocab && !any; i++) any = r->ok[i];
    }
    if (!any)
        for (int i = 0; i < v->n_eog; i++) r->ok[v->eog[i]] = 1;
    for (int i = 0; i < v->n_vocab; i++)
        if (!r->ok[i]) row[i] = -INFINITY;
}
