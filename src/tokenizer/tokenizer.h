/* tokenizer.h - tokenizer.json (byte-level BPE, Metaspace BPE with byte
 * fallback) and GGUF vocabularies (llama/SPM, gpt2/BPE), chat templates. */
#ifndef DFL_TOKENIZER_H
#define DFL_TOKENIZER_H

#include "base/base.h"
#include "io/io.h"

typedef struct dfl_tokenizer dfl_tokenizer;

/* The most bytes in one token's text. */
enum { DFL_TOK_MAX_PIECE = 4096 };
/* Length of the UTF-8 sequence starting with byte c (1 for an invalid lead byte). */
int dfl_tok_utf8_len(unsigned char c);

/* dir holds tokenizer.json (+ tokenizer_config.json when present). */
int dfl_tok_load_hf(const char *dir, dfl_tokenizer **out, dfl_error *err);
/* From an open GGUF file's tokenizer.ggml.* metadata. */
int dfl_tok_load_gguf(const gguf_file *g, dfl_tokenizer **out, dfl_error *err);
/* From tokenizer.json text already in memory (fuzz target entry). */
int dfl_tok_load_json(const char *json, size_t len, const char *config_json, size_t config_len,
                      dfl_tokenizer **out, dfl_error *err);
void dfl_tok_free(dfl_tokenizer *t);

int dfl_tok_vocab_size(const dfl_tokenizer *t);
/* Returns the number of ids (may exceed cap; only cap written) or < 0. */
int dfl_tok_encode(const dfl_tokenizer *t, const char *text, size_t len, int add_special,
                   int parse_special, int32_t *ids, int cap, dfl_error *err);
/* Raw bytes of a token as it appears in decoded text (byte-level mapped back,
 * metaspace to space, <0xNN> to the byte). Returns length, < 0 for a bad id.
 * *special is set to 1 for control/special tokens. */
int dfl_tok_piece(const dfl_tokenizer *t, int32_t id, const char **bytes, int *special);
int32_t dfl_tok_bos(const dfl_tokenizer *t);   /* -1 when none */
int32_t dfl_tok_eos(const dfl_tokenizer *t);
int dfl_tok_add_bos(const dfl_tokenizer *t);   /* whether encode adds BOS */
int dfl_tok_strip_leading_space(const dfl_tokenizer *t); /* SPM: decoder strips first space */
int dfl_tok_is_eog(const dfl_tokenizer *t, int32_t id);
const char *dfl_tok_chat_template(const dfl_tokenizer *t); /* NULL when none */
/* tokenizer_config.json's template named "tool_use"; NULL when none */
const char *dfl_tok_chat_template_tool(const dfl_tokenizer *t);

/* Chat rendering (chat.c): a Jinja template (NULL: ChatML) through jinja.c
 * with the variables transformers' apply_chat_template passes. JSON texts:
 * messages an array, tools an array or NULL, kwargs an object or NULL (its
 * members are variables: enable_thinking, ...). now: strftime_now's clock
 * (unix seconds; 0 the real one). Returns bytes needed as snprintf. */
extern const char dfl_chatml_template[];
int dfl_chat_render_vars(const char *template_text, const char *bos, const char *eos,
                         const char *messages_json, const char *tools_json,
                         const char *kwargs_json, int add_generation_prompt, int64_t now,
                         char *out, size_t cap, dfl_error *err);
/* A user's template choice: "chatml", or a Jinja text (what makes it one: a
 * tag); *tmpl is then the text to render. 0, or < 0 for any other name. */
int dfl_chat_forced(const char *force, const char **tmpl, dfl_error *err);
/* The struct API: force "chatml" or a Jinja text overrides template_text. */
int dfl_chat_render_text(const char *template_text, const char *force, const char *bos_text,
                         const char *eos_text, const dfl_chat_msg *msgs, int n,
                         int add_generation_prompt, int enable_thinking, char *out, size_t cap,
                         dfl_error *err);

#endif
