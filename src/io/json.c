/* json.c - checked access to untrusted JSON over cJSON.
 *
 * cJSON recurses once per nesting level, so depth is bounded here before it
 * sees the text. JSON null counts as absent: Hugging Face writes None as null
 * and means "use the default". */
#include "io.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

enum { JSON_MAX_DEPTH = 64 };
#define JSON_MAX_BYTES ((size_t)256 << 20)

/* Deepest [ / { nesting outside strings; returns the offset where it first
 * passes max, or -1 when it never does. */
static long too_deep(const char *s, size_t n, int max) {
    int depth = 0, in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > max) return (long)i;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return -1;
}

cJSON *dfl_json_parse(const char *buf, size_t len, const char *name, dfl_error *err) {
    if (!name) name = "json";
    if (len > JSON_MAX_BYTES) {
        dfl_fail(err, DFL_EFORMAT, "%s: %zu bytes of JSON, more than the %zu allowed", name, len,
                 JSON_MAX_BYTES);
        return NULL;
    }
    long at = too_deep(buf, len, JSON_MAX_DEPTH);
    if (at >= 0) {
        dfl_fail(err, DFL_EFORMAT, "%s: JSON nested deeper than %d levels (at byte %ld)", name,
                 JSON_MAX_DEPTH, at);
        return NULL;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    size_t pos = end && end >= buf ? (size_t)(end - buf) : 0;
    if (!j) {
        dfl_fail(err, DFL_EFORMAT, "%s: invalid JSON near byte %zu", name, pos);
        return NULL;
    }
    while (pos < len && strchr(" \t\r\n", buf[pos]) && buf[pos]) pos++;
    if (pos < len) {
        cJSON_Delete(j);
        dfl_fail(err, DFL_EFORMAT, "%s: unexpected bytes after the JSON value at byte %zu", name,
                 pos);
        return NULL;
    }
    return j;
}

cJSON *dfl_json_parse_file(const char *path, size_t max_bytes, dfl_error *err) {
    size_t len;
    char *buf = dfl_read_file(path, max_bytes, &len, err);
    if (!buf) return NULL;
    cJSON *j = dfl_json_parse(buf, len, path, err);
    free(buf);
    return j;
}

/* The value at key, or NULL when o is not an object, key is absent or null. */
static const cJSON *get(const cJSON *o, const char *key) {
    if (!cJSON_IsObject(o)) return NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

int dfl_json_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *out,
                 const char *file, dfl_error *err) {
    const cJSON *v = get(o, key);
    if (!v) return 1;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    /* doubles at +-2^63 no longer compare exactly with int64 bounds: clip first */
    if (!(d == floor(d)) || d < -9.0e18 || d > 9.0e18 || (int64_t)d < lo || (int64_t)d > hi) {
        if (cJSON_IsNumber(v))
            return dfl_fail(err, DFL_EFORMAT,
                            "%s: %s = %.15g (expected an integer in %lld..%lld)", file, key, d,
                            (long long)lo, (long long)hi);
        return dfl_fail(err, DFL_EFORMAT, "%s: %s is not a number (expected an integer in "
                        "%lld..%lld)", file, key, (long long)lo, (long long)hi);
    }
    *out = (int64_t)d;
    return 0;
}

int dfl_json_num(const cJSON *o, const char *key, double lo, double hi, double *out,
                 const char *file, dfl_error *err) {
    const cJSON *v = get(o, key);
    if (!v) return 1;
    if (!cJSON_IsNumber(v))
        return dfl_fail(err, DFL_EFORMAT, "%s: %s is not a number (expected %g..%g)", file, key,
                        lo, hi);
    double d = v->valuedouble;
    if (!isfinite(d) || d < lo || d > hi)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s = %.15g (expected %g..%g)", file, key, d, lo, hi);
    *out = d;
    return 0;
}

int dfl_json_bool(const cJSON *o, const char *key, int *out, const char *file, dfl_error *err) {
    const cJSON *v = get(o, key);
    if (!v) return 1;
    if (!cJSON_IsBool(v))
        return dfl_fail(err, DFL_EFORMAT, "%s: %s is not true or false", file, key);
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return 0;
}

const char *dfl_json_str(const cJSON *o, const char *key) {
    const cJSON *v = get(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
