/* tokenize.c - the tokenizer's public functions in dflash.h: encode,
 * streaming decode, special ids, chat rendering. They reach the tokenizer
 * through the engine's tok field, so they live in the api layer (in
 * src/tokenizer they reached up into engine.h). */
#include <string.h>

#include "api/engine.h"
#include "tokenizer/tokenizer.h"

static const dfl_tokenizer *tok_of(const dfl_engine *e) { return e ? e->tok : NULL; }

int dfl_tokenize(const dfl_engine *e, const char *text, size_t len, int add_special,
                 int parse_special, int32_t *ids, int cap, dfl_error *err) {
    const dfl_tokenizer *t = tok_of(e);
    if (!t) return dfl_fail(err, DFL_EARG, "tokenize: the engine has no tokenizer");
    return dfl_tok_encode(t, text, len, add_special, parse_special, ids, cap, err);
}

int dfl_token_is_eog(const dfl_engine *e, int32_t id) {
    const dfl_tokenizer *t = tok_of(e);
    return t ? dfl_tok_is_eog(t, id) : 0;
}

int32_t dfl_token_bos(const dfl_engine *e) {
    const dfl_tokenizer *t = tok_of(e);
    return t ? dfl_tok_bos(t) : -1;
}

/* ---- streaming decode ------------------------------------------------------ */

/* Token pieces are byte strings: a character may be split across tokens
 * (byte-level BPE, <0xNN> fallback). The decoder emits only complete UTF-8;
 * the bytes of an unfinished sequence wait in d->pending for the next token.
 * Bytes that can never form a character become U+FFFD, one per maximal
 * invalid subpart, as Hugging Face's from_utf8_lossy. */

/* Length of the valid sequence at s[0..n): > 0 complete, 0 invalid (one
 * U+FFFD for the first k bytes, in *bad), -1 a valid but unfinished prefix. */
static int utf8_step(const unsigned char *s, size_t n, int *bad) {
    unsigned char c = s[0];
    *bad = 1;
    if (c < 0x80) return 1;
    int len = dfl_tok_utf8_len(c);
    if (len == 1) return 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c == 0xe0) lo = 0xa0;
    else if (c == 0xed) hi = 0x9f;
    else if (c == 0xf0) lo = 0x90;
    else if (c == 0xf4) hi = 0x8f;
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return -1;
        unsigned char b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b & 0xc0) != 0x80) {
            *bad = i;
            return 0;
        }
    }
    return len;
}

/* Writes the complete characters of s[0..n) to out; keeps an unfinished tail
 * in pending when hold, else replaces it. Returns bytes written or < 0. */
static int emit(dfl_detok *d, const unsigned char *s, size_t n, int hold, char *out, size_t cap) {
    size_t o = 0, i = 0;
    while (i < n) {
        int bad, l = utf8_step(s + i, n - i, &bad);
        if (l < 0 && hold) {
            d->n_pending = (int)(n - i);
            memcpy(d->pending, s + i, n - i);
            return (int)o;
        }
        const char *src = l > 0 ? (const char *)s + i : "\xef\xbf\xbd";
        size_t len = l > 0 ? (size_t)l : 3;
        if (o + len > cap) return DFL_EARG;
        memcpy(out + o, src, len);
        o += len;
        i += l > 0 ? (size_t)l : l < 0 ? n - i : (size_t)bad;
    }
    d->n_pending = 0;
    return (int)o;
}

void dfl_detok_init(dfl_detok *d, const dfl_engine *e, int show_special) {
    memset(d, 0, sizeof *d);
    d->e = e;
    d->show_special = show_special;
    d->first = 1;
}

int dfl_detok_push(dfl_detok *d, int32_t id, char *out, size_t cap) {
    const dfl_tokenizer *t = tok_of(d->e);
    if (!t || !out) return DFL_EARG;
    const char *p;
    int special, n = dfl_tok_piece(t, id, &p, &special);
    if (n < 0) return n;
    if (special && !d->show_special) return 0;
    /* one space comes off the decoded text's start; an empty piece leaves the
     * next one first, as the text is joined before stripping */
    int was_empty = n == 0;
    if (d->first && n && p[0] == ' ' && dfl_tok_strip_leading_space(t)) {
        p++;
        n--;
    }
    if (!was_empty) d->first = 0;
    if (!d->n_pending) { /* most pieces are ASCII: nothing to check */
        int i = 0;
        while (i < n && !(p[i] & 0x80)) i++;
        if (i == n) {
            if ((size_t)n > cap) return DFL_EARG;
            memcpy(out, p, (size_t)n);
            return n;
        }
    }
    /* pending (< 4 bytes) + the piece, worst case 3 output bytes per input byte */
    unsigned char buf[DFL_TOK_MAX_PIECE + 8];
    size_t m = (size_t)d->n_pending;
    if ((size_t)n > DFL_TOK_MAX_PIECE) return DFL_EARG;
    memcpy(buf, d->pending, m);
    memcpy(buf + m, p, (size_t)n);
    dfl_detok saved = *d;
    int r = emit(d, buf, m + (size_t)n, 1, out, cap);
    if (r < 0) *d = saved; /* out too small: nothing consumed */
    return r;
}

int dfl_detok_flush(dfl_detok *d, char *out, size_t cap) {
    if (!out) return DFL_EARG;
    unsigned char buf[8];
    size_t m = (size_t)d->n_pending;
    memcpy(buf, d->pending, m);
    dfl_detok saved = *d;
    int r = emit(d, buf, m, 0, out, cap);
    if (r < 0) *d = saved;
    return r;
}

/* ---- chat ------------------------------------------------------------------- */

/* The text of a special token (empty when none). */
static void special_text(const dfl_tokenizer *t, int32_t id, char out[DFL_TOK_MAX_PIECE + 1]) {
    const char *p;
    int special, len = t && id >= 0 ? dfl_tok_piece(t, id, &p, &special) : 0;
    if (len > 0) memcpy(out, p, (size_t)len);
    out[len > 0 ? len : 0] = 0;
}

const char *dfl_chat_template(const dfl_engine *e, int *fallback) {
    const dfl_tokenizer *t = tok_of(e);
    const char *tmpl = t ? dfl_tok_chat_template(t) : NULL;
    if (fallback) *fallback = !tmpl;
    return tmpl ? tmpl : dfl_chatml_template;
}

int dfl_chat_render(const dfl_engine *e, const char *template_name, const dfl_chat_msg *msgs,
                    int n, int add_generation_prompt, int enable_thinking, char *out, size_t cap,
                    dfl_error *err) {
    const dfl_tokenizer *t = tok_of(e);
    char bos[DFL_TOK_MAX_PIECE + 1], eos[DFL_TOK_MAX_PIECE + 1];
    special_text(t, t ? dfl_tok_bos(t) : -1, bos);
    special_text(t, t ? dfl_tok_eos(t) : -1, eos);
    return dfl_chat_render_text(dfl_chat_template(e, NULL), template_name, bos, eos, msgs, n,
                                add_generation_prompt, enable_thinking, out, cap, err);
}

int dfl_chat_render_json(const dfl_engine *e, const char *template_text,
                         const char *messages_json, const char *tools_json,
                         const char *kwargs_json, int add_generation_prompt, int64_t now,
                         char *out, size_t cap, dfl_error *err) {
    const dfl_tokenizer *t = tok_of(e);
    char bos[DFL_TOK_MAX_PIECE + 1], eos[DFL_TOK_MAX_PIECE + 1];
    special_text(t, t ? dfl_tok_bos(t) : -1, bos);
    special_text(t, t ? dfl_tok_eos(t) : -1, eos);
    int rc = template_text ? dfl_chat_forced(template_text, &template_text, err) : 0;
    if (rc < 0) return rc;
    if (!template_text) {
        const char *tool = t && tools_json ? dfl_tok_chat_template_tool(t) : NULL;
        template_text = tool ? tool : dfl_chat_template(e, NULL);
    }
    return dfl_chat_render_vars(template_text, t ? bos : NULL, t ? eos : NULL, messages_json,
                                tools_json, kwargs_json, add_generation_prompt, now, out, cap, err);
}
