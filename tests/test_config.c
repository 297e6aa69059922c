/* test_config.c - model configs from config.json and GGUF metadata; RoPE tables.
 *
 * Each out-of-range or inconsistent field must be refused with a message that
 * names the file and the field. RoPE frequencies are compared against values
 * computed in float64 by a Python transcription of transformers'
 * modeling_rope_utils (_compute_llama3_parameters, _compute_yarn_parameters). */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "models/model.h"
#include "models/weights.h"
#include "testutil.h"

/* Qwen3-0.6B's config.json (trimmed), Llama-3.1-8B's, Qwen2.5-0.5B's. */
static const char *QWEN3 =
    "{\"architectures\":[\"Qwen3ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"bos_token_id\":151643,\"eos_token_id\":151645,\"head_dim\":128,\"hidden_act\":\"silu\","
    "\"hidden_size\":1024,\"initializer_range\":0.02,\"intermediate_size\":3072,"
    "\"max_position_embeddings\":40960,\"max_window_layers\":28,\"model_type\":\"qwen3\","
    "\"num_attention_heads\":16,\"num_hidden_layers\":28,\"num_key_value_heads\":8,"
    "\"rms_norm_eps\":1e-06,\"rope_scaling\":null,\"rope_theta\":1000000,\"sliding_window\":null,"
    "\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\",\"use_cache\":true,"
    "\"use_sliding_window\":false,\"vocab_size\":151936}";
static const char *LLAMA31 =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,\"bos_token_id\":128000,"
    "\"eos_token_id\":[128001,128008,128009],\"hidden_act\":\"silu\",\"hidden_size\":4096,"
    "\"intermediate_size\":14336,\"max_position_embeddings\":131072,\"mlp_bias\":false,"
    "\"model_type\":\"llama\",\"num_attention_heads\":32,\"num_hidden_layers\":32,"
    "\"num_key_value_heads\":8,\"pretraining_tp\":1,\"rms_norm_eps\":1e-05,\"rope_scaling\":"
    "{\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
    "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},\"rope_theta\":500000.0,"
    "\"tie_word_embeddings\":false,\"vocab_size\":128256}";
static const char *QWEN2 =
    "{\"architectures\":[\"Qwen2ForCausalLM\"],\"bos_token_id\":151643,\"eos_token_id\":151643,"
    "\"hidden_act\":\"silu\",\"hidden_size\":896,\"intermediate_size\":4864,"
    "\"max_position_embeddings\":32768,\"num_attention_heads\":14,\"num_hidden_layers\":24,"
    "\"num_key_value_heads\":2,\"rms_norm_eps\":1e-06,\"rope_theta\":1000000.0,"
    "\"sliding_window\":32768,\"tie_word_embeddings\":true,\"use_sliding_window\":false,"
    "\"vocab_size\":151936}";

/* A Qwen3.5 text config (the 9B's shapes, trimmed; transformers 5 writes rope_parameters). */
static const char *QWEN35 =
    "{\"architectures\":[\"Qwen3_5ForCausalLM\"],\"attention_bias\":false,\"head_dim\":256,"
    "\"hidden_act\":\"silu\",\"hidden_size\":4096,\"intermediate_size\":12288,"
    "\"linear_conv_kernel_dim\":4,\"linear_key_head_dim\":128,\"linear_num_key_heads\":16,"
    "\"linear_num_value_heads\":32,\"linear_value_head_dim\":128,"
    "\"max_position_embeddings\":262144,\"model_type\":\"qwen3_5_text\","
    "\"num_attention_heads\":16,\"num_hidden_layers\":32,\"num_key_value_heads\":4,"
    "\"rms_norm_eps\":1e-06,\"rope_parameters\":{\"mrope_interleaved\":true,"
    "\"mrope_section\":[11,11,10],\"partial_rotary_factor\":0.25,\"rope_theta\":10000000,"
    "\"rope_type\":\"default\"},\"tie_word_embeddings\":false,\"vocab_size\":248320,"
    "\"num_experts_per_tok\":8,\"moe_intermediate_size\":512,"
    "\"shared_expert_intermediate_size\":512}";

/* base with key set to the JSON text val (NULL: key removed), parsed as a config. */
static int cfg_with(const char *base, const char *key, const char *val, dfl_config *c,
                    dfl_error *e) {
    cJSON *j = cJSON_Parse(base);
    if (key) {
        cJSON_DeleteItemFromObjectCaseSensitive(j, key);
        if (val) cJSON_AddItemToObject(j, key, cJSON_Parse(val));
    }
    char *s = cJSON_PrintUnformatted(j);
    memset(e, 0, sizeof *e);
    int rc = dfl_config_from_json(s, strlen(s), c, e);
    free(s);
    cJSON_Delete(j);
    return rc;
}

static void expect(const char *base, const char *key, const char *val, int code, const char *sub) {
    dfl_config c;
    dfl_error e;
    int rc = cfg_with(base, key, val, &c, &e);
    CHECK(rc == code && strstr(e.msg, sub) && strstr(e.msg, "config.json"),
          "%s = %s: rc %d msg '%s' (want %d and '%s')", key, val ? val : "(absent)", rc, e.msg,
          code, sub);
}

/* Sliding layers: layer_types, Mistral's sliding_window, Qwen2's use_sliding_window. */
static void test_hf_sliding(void) {
    dfl_config c;
    dfl_error e;
    int rc = cfg_with(QWEN2, "use_sliding_window", "true", &c, &e);
    CHECK(rc == 0 && c.sliding_window == 32768 && c.layer_kind[0] == DFL_LAYER_SLIDING &&
              c.layer_kind[23] == DFL_LAYER_SLIDING, "qwen2 use_sliding_window: %s", e.msg);
    char *s = strdup(QWEN3);
    char *at = strstr(s, "\"sliding_window\":null");
    memcpy(at, "\"sliding_window\":1000", 21);   /* same length: 'null,' -> '1000,' */
    char lt[2048] = "[";
    for (int l = 0; l < 28; l++)
        strcat(lt, l % 4 ? "\"sliding_attention\"," : "\"full_attention\",");
    lt[strlen(lt) - 1] = ']';
    rc = cfg_with(s, "layer_types", lt, &c, &e);
    CHECK(rc == 0 && c.sliding_window == 1000 && c.layer_kind[0] == DFL_LAYER_FULL &&
              c.layer_kind[1] == DFL_LAYER_SLIDING && c.layer_kind[4] == DFL_LAYER_FULL,
          "layer_types: %s", e.msg);
    rc = cfg_with(QWEN3, "layer_types", lt, &c, &e);
    CHECK(rc == DFL_EFORMAT && strstr(e.msg, "no sliding_window"), "window missing: %s", e.msg);
    lt[2] = 'x';
    rc = cfg_with(s, "layer_types", lt, &c, &e);
    CHECK(rc == DFL_EUNSUP && strstr(e.msg, "layer_types[0]"), "unknown layer type: %s", e.msg);
    free(s);
    rc = cfg_with(LLAMA31, "sliding_window", "64", &c, &e);
    CHECK(rc == 0 && c.sliding_window == 0 && c.layer_kind[5] == DFL_LAYER_FULL,
          "llama ignores sliding_window: %s", e.msg);
    rc = cfg_with(LLAMA31, "architectures", "[\"MistralForCausalLM\"]", &c, &e);
    CHECK(rc == 0 && c.sliding_window == 0, "mistral without a window: %s", e.msg);
}

static void test_hf_valid(void) {
    dfl_config c;
    dfl_error e;
    int rc = cfg_with(QWEN3, NULL, NULL, &c, &e);
    CHECK(rc == 0, "qwen3: %s", e.msg);
    CHECK(c.arch == ARCH_QWEN3 && c.n_layers == 28 && c.dim == 1024 && c.n_heads == 16 &&
              c.n_kv_heads == 8 && c.head_dim == 128 && c.ffn_dim == 3072 && c.vocab == 151936 &&
              c.max_ctx == 40960, "qwen3 dims");
    CHECK(c.norm_eps == 1e-6f && c.rope_theta == 1e6f && c.rope_neox == 1 && c.qk_norm == 1 &&
              c.qkv_bias == 0 && c.tied_embed == 1 && c.rope_scale_type == ROPE_SCALE_NONE &&
              c.bos_id == 151643 && c.eos_id == 151645, "qwen3 flags");

    rc = cfg_with(LLAMA31, NULL, NULL, &c, &e);
    CHECK(rc == 0, "llama3.1: %s", e.msg);
    CHECK(c.arch == ARCH_LLAMA && c.head_dim == 128 && c.n_kv_heads == 8 && c.tied_embed == 0 &&
              c.eos_id == 128001 && c.rope_scale_type == ROPE_SCALE_LLAMA3 && c.rope_factor == 8 &&
              c.rope_low_freq == 1 && c.rope_high_freq == 4 && c.rope_orig_ctx == 8192 &&
              c.norm_eps == 1e-5f && c.qk_norm == 0, "llama3.1 fields (eos list -> first)");

    rc = cfg_with(QWEN2, NULL, NULL, &c, &e);
    CHECK(rc == 0 && c.arch == ARCH_QWEN2 && c.qkv_bias == 1 && c.head_dim == 64 &&
              c.n_kv_heads == 2, "qwen2: q/k/v bias, head_dim 896/14: %s", e.msg);

    /* defaults when keys are absent: kv heads = heads, theta 10000, eps 1e-6, untied */
    rc = cfg_with(QWEN2, "num_key_value_heads", NULL, &c, &e);
    CHECK(rc == 0 && c.n_kv_heads == 14, "kv heads default");
    rc = cfg_with(QWEN2, "rope_theta", NULL, &c, &e);
    CHECK(rc == 0 && c.rope_theta == 10000, "theta default");
    rc = cfg_with(QWEN2, "tie_word_embeddings", NULL, &c, &e);
    CHECK(rc == 0 && c.tied_embed == 0, "untied by default");
    rc = cfg_with(QWEN2, "rms_norm_eps", NULL, &c, &e);
    CHECK(rc == 0 && c.norm_eps == 1e-6f, "eps default");
    rc = cfg_with(QWEN3, "eos_token_id", "null", &c, &e);
    CHECK(rc == 0 && c.eos_id == -1, "eos null -> -1");
    rc = cfg_with(QWEN3, "architectures", NULL, &c, &e);
    CHECK(rc == 0 && c.arch == ARCH_QWEN3, "model_type when architectures is absent");
    rc = cfg_with(LLAMA31, "architectures", "[\"MistralForCausalLM\"]", &c, &e);
    CHECK(rc == 0 && c.arch == ARCH_LLAMA, "mistral is llama");
    /* transformers 5 writes rope_parameters (with rope_theta inside) */
    rc = cfg_with(QWEN3, "rope_parameters", "{\"rope_type\":\"default\",\"rope_theta\":5000}", &c,
                  &e);
    CHECK(rc == 0 && c.rope_theta == 5000 && c.rope_scale_type == ROPE_SCALE_NONE,
          "rope_parameters: %s", e.msg);
    rc = cfg_with(QWEN3, "rope_scaling", "{\"type\":\"linear\",\"factor\":2}", &c, &e);
    CHECK(rc == 0 && c.rope_scale_type == ROPE_SCALE_LINEAR && c.rope_factor == 2,
          "legacy \"type\" key");
}

static void test_hf_refused(void) {
    expect(QWEN3, "num_hidden_layers", "0", DFL_EFORMAT, "num_hidden_layers = 0");
    expect(QWEN3, "num_hidden_layers", "1025", DFL_EFORMAT, "num_hidden_layers = 1025 (expected");
    expect(QWEN3, "num_hidden_layers", "2.5", DFL_EFORMAT, "num_hidden_layers = 2.5");
    expect(QWEN3, "num_hidden_layers", "\"28\"", DFL_EFORMAT, "num_hidden_layers is not a number");
    expect(QWEN3, "num_hidden_layers", NULL, DFL_EFORMAT, "num_hidden_layers is missing");
    expect(QWEN3, "hidden_size", "0", DFL_EFORMAT, "hidden_size = 0");
    expect(QWEN3, "hidden_size", "65537", DFL_EFORMAT, "hidden_size = 65537");
    expect(QWEN3, "hidden_size", "1e300", DFL_EFORMAT, "hidden_size");
    expect(QWEN3, "num_attention_heads", "0", DFL_EFORMAT, "num_attention_heads = 0");
    expect(QWEN3, "num_attention_heads", "1025", DFL_EFORMAT, "num_attention_heads = 1025");
    expect(QWEN3, "num_key_value_heads", "0", DFL_EFORMAT, "num_key_value_heads = 0");
    expect(QWEN3, "num_key_value_heads", "32", DFL_EFORMAT, "num_key_value_heads = 32 (expected 1..16)");
    expect(QWEN3, "num_key_value_heads", "3", DFL_EFORMAT,
           "num_attention_heads = 16 is not a multiple of num_key_value_heads = 3");
    expect(QWEN3, "head_dim", "1", DFL_EFORMAT, "head_dim = 1");
    expect(QWEN3, "head_dim", "1026", DFL_EFORMAT, "head_dim = 1026");
    expect(QWEN3, "head_dim", "63", DFL_EFORMAT, "head_dim = 63 (expected an even number");
    expect(LLAMA31, "num_attention_heads", "30", DFL_EFORMAT,
           "hidden_size = 4096 is not a multiple of num_attention_heads = 30");
    expect(QWEN3, "intermediate_size", "0", DFL_EFORMAT, "intermediate_size = 0");
    expect(QWEN3, "intermediate_size", "1048577", DFL_EFORMAT, "intermediate_size = 1048577");
    expect(QWEN3, "vocab_size", "0", DFL_EFORMAT, "vocab_size = 0");
    expect(QWEN3, "vocab_size", "4000001", DFL_EFORMAT, "vocab_size = 4000001");
    expect(QWEN3, "max_position_embeddings", "0", DFL_EFORMAT, "max_position_embeddings = 0");
    expect(QWEN3, "max_position_embeddings", "16777217", DFL_EFORMAT,
           "max_position_embeddings = 16777217");
    expect(QWEN3, "rms_norm_eps", "0", DFL_EFORMAT, "rms_norm_eps = 0 (expected 0 < eps < 1)");
    expect(QWEN3, "rms_norm_eps", "1", DFL_EFORMAT, "rms_norm_eps = 1");
    expect(QWEN3, "rms_norm_eps", "-1e-6", DFL_EFORMAT, "rms_norm_eps");
    expect(QWEN3, "rope_theta", "0", DFL_EFORMAT, "rope_theta = 0");
    expect(QWEN3, "rope_theta", "-5", DFL_EFORMAT, "rope_theta");
    expect(QWEN3, "rope_theta", "1e39", DFL_EFORMAT, "rope_theta");
    expect(QWEN3, "bos_token_id", "151936", DFL_EFORMAT, "bos_token_id = 151936");
    expect(QWEN3, "eos_token_id", "[-1]", DFL_EFORMAT, "eos_token_id is not a token id");
    expect(QWEN3, "tie_word_embeddings", "1", DFL_EFORMAT, "tie_word_embeddings is not true");
    expect(QWEN3, "architectures", "[\"GPT2LMHeadModel\"]", DFL_EUNSUP,
           "architecture GPT2LMHeadModel not supported");
    expect(QWEN2, "architectures", "[]", DFL_EFORMAT, "architectures[0] is missing");
    expect(QWEN3, "hidden_act", "\"gelu\"", DFL_EUNSUP, "hidden_act gelu");
    expect(QWEN3, "attention_bias", "true", DFL_EUNSUP, "attention_bias = true");
    expect(LLAMA31, "mlp_bias", "true", DFL_EUNSUP, "mlp_bias = true");
    expect(QWEN3, "layer_types", "[\"full_attention\"]", DFL_EFORMAT, "layer_types");
    expect(QWEN3, "partial_rotary_factor", "0.5", DFL_EUNSUP, "partial_rotary_factor = 0.5");
    /* rope scaling */
    expect(QWEN3, "rope_scaling", "{\"rope_type\":\"dynamic\",\"factor\":2}", DFL_EUNSUP,
           "rope_scaling type \"dynamic\" not supported");
    expect(QWEN3, "rope_scaling", "{\"rope_type\":\"longrope\"}", DFL_EUNSUP, "\"longrope\"");
    expect(QWEN3, "rope_scaling", "[1]", DFL_EFORMAT, "rope_scaling is not an object");
    expect(QWEN3, "rope_scaling", "{\"rope_type\":\"linear\",\"factor\":0}", DFL_EFORMAT,
           "rope_scaling.factor = 0");
    expect(QWEN3, "rope_scaling", "{\"rope_type\":\"linear\"}", DFL_EFORMAT, "rope_scaling.factor");
    expect(QWEN3, "rope_scaling", "{\"rope_type\":\"linear\",\"factor\":-2}", DFL_EFORMAT,
           "rope_scaling.factor = -2");
    expect(LLAMA31, "rope_scaling",
           "{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":4,\"high_freq_factor\":4,"
           "\"original_max_position_embeddings\":8192}", DFL_EFORMAT,
           "high_freq_factor = 4 must exceed low_freq_factor = 4");
    expect(LLAMA31, "rope_scaling",
           "{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4,"
           "\"original_max_position_embeddings\":0}", DFL_EFORMAT,
           "original_max_position_embeddings = 0");
    expect(QWEN3, "rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":4,\"beta_fast\":-1}",
           DFL_EFORMAT, "rope_scaling.beta_fast = -1");
    expect(QWEN3, "rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":4,\"attention_factor\":0}",
           DFL_EFORMAT, "attention_factor = 0");
    expect(QWEN3, "rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":4,\"rope_theta\":1}",
           DFL_EFORMAT, "rope_theta = 1 (yarn needs > 1)");
    expect(QWEN3, "rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":4,\"truncate\":false}",
           DFL_EUNSUP, "truncate = false");
    /* not JSON, too deep, not an object */
    dfl_config c;
    dfl_error e = {0};
    char deep[300] = "{\"a\":";
    for (int i = 0; i < 80; i++) strcat(deep, "[");
    CHECK(dfl_config_from_json(deep, strlen(deep), &c, &e) == DFL_EFORMAT &&
              strstr(e.msg, "deeper than 64"), "deep nesting: %s", e.msg);
    CHECK(dfl_config_from_json("[]", 2, &c, &e) == DFL_EFORMAT && strstr(e.msg, "JSON object"),
          "not an object: %s", e.msg);
}

/* Qwen3.5: DeltaNet layers by layer_types or full_attention_interval, partial rotary, the
 * multimodal class's text_config; malformed DeltaNet fields refused by name. */
static void test_hf_qwen35(void) {
    dfl_config c;
    dfl_error e;
    int rc = cfg_with(QWEN35, NULL, NULL, &c, &e);
    CHECK(rc == 0 && c.arch == ARCH_QWEN35 && c.layer_kind[0] == DFL_LAYER_RECURRENT &&
              c.layer_kind[3] == DFL_LAYER_FULL && c.layer_kind[31] == DFL_LAYER_FULL &&
              c.layer_kind[30] == DFL_LAYER_RECURRENT && c.rope_partial == 0.25f &&
              c.rope_theta == 1e7f && c.lin_v_heads == 32 && c.lin_k_dim == 128 &&
              c.lin_conv == 4 && c.norm_offset && c.qk_norm && c.gating == DFL_GATE_Q_SIGMOID,
          "qwen3.5 text config: %s", e.msg);
    rc = cfg_with(QWEN35, "full_attention_interval", "2", &c, &e);
    CHECK(rc == 0 && c.layer_kind[1] == DFL_LAYER_FULL && c.layer_kind[2] == DFL_LAYER_RECURRENT,
          "full_attention_interval: %s", e.msg);
    char lt[2048] = "[";
    for (int l = 0; l < 32; l++) strcat(lt, l == 5 ? "\"full_attention\"," : "\"linear_attention\",");
    lt[strlen(lt) - 1] = ']';
    rc = cfg_with(QWEN35, "layer_types", lt, &c, &e);
    CHECK(rc == 0 && c.layer_kind[5] == DFL_LAYER_FULL && c.layer_kind[3] == DFL_LAYER_RECURRENT,
          "layer_types: %s", e.msg);
    expect(QWEN35, "layer_types", "[\"sliding_attention\"]", DFL_EFORMAT, "layer_types");
    char *bad = strdup(lt);
    memcpy(strstr(bad, "linear_attention"), "sliding_attention", 16);
    expect(QWEN35, "layer_types", bad, DFL_EUNSUP, "layer_types[0]");
    free(bad);
    expect(QWEN35, "linear_num_value_heads", "24", DFL_EFORMAT,
           "linear_num_value_heads = 24 is not a multiple of linear_num_key_heads = 16");
    expect(QWEN35, "linear_num_key_heads", "0", DFL_EFORMAT, "linear_num_key_heads = 0");
    expect(QWEN35, "linear_conv_kernel_dim", "0", DFL_EFORMAT, "linear_conv_kernel_dim = 0");
    expect(QWEN35, "linear_conv_kernel_dim", "65", DFL_EFORMAT, "linear_conv_kernel_dim = 65");
    expect(QWEN35, "linear_key_head_dim", "1025", DFL_EFORMAT, "linear_key_head_dim = 1025");
    expect(QWEN35, "linear_value_head_dim", "-1", DFL_EFORMAT, "linear_value_head_dim = -1");
    expect(QWEN35, "attention_bias", "true", DFL_EUNSUP, "attention_bias = true");
    expect(QWEN35, "full_attention_interval", "0", DFL_EFORMAT, "full_attention_interval = 0");
    expect(QWEN35, "partial_rotary_factor", "1.5", DFL_EFORMAT, "partial_rotary_factor");
    lt[strlen(lt) - 4 * strlen("\"linear_attention\",") - 1] = ']';   /* 28 entries */
    expect(QWEN3, "layer_types", lt, DFL_EUNSUP, "layer_types[0] = 'linear_attention'");
    expect(QWEN35, "intermediate_size", NULL, DFL_EFORMAT, "intermediate_size is missing");
    /* Qwen3.5-MoE: every MLP routed, no intermediate_size */
    char moe[4096];
    snprintf(moe, sizeof moe, "%s", QWEN35);
    const char *dense = "\"intermediate_size\":12288,", *sparse = "\"num_experts\":256,        ";
    memcpy(strstr(moe, dense), sparse, strlen(dense));   /* same length */
    rc = cfg_with(moe, "architectures", "[\"Qwen3_5MoeForCausalLM\"]", &c, &e);
    CHECK(rc == 0 && c.n_experts == 256 && c.top_k == 8 && c.router_softmax && c.norm_topk &&
              c.mlp_kind[0] == DFL_MLP_MOE && c.mlp_kind[31] == DFL_MLP_MOE && c.shared_ffn == 512,
          "qwen3.5 moe: %s", e.msg);
    expect(moe, "num_experts_per_tok", "300", DFL_EFORMAT, "num_experts_per_tok = 300");
    expect(moe, "num_experts", "0", DFL_EFORMAT, "num_experts = 0");
    expect(moe, "shared_expert_intermediate_size", NULL, DFL_EFORMAT,
           "shared_expert_intermediate_size is missing");
    /* Qwen3-Next: the MoE fields with mlp_only_layers and decoder_sparse_step */
    cJSON *jn = cJSON_Parse(QWEN35);
    cJSON_ReplaceItemInObject(jn, "architectures", cJSON_Parse("[\"Qwen3NextForCausalLM\"]"));
    cJSON_AddItemToObject(jn, "num_experts", cJSON_CreateNumber(256));
    char *nx = cJSON_PrintUnformatted(jn);
    rc = cfg_with(nx, NULL, NULL, &c, &e);
    CHECK(rc == 0 && c.arch == ARCH_QWEN3_NEXT && c.n_experts == 256 &&
              c.mlp_kind[0] == DFL_MLP_MOE && c.mlp_kind[31] == DFL_MLP_MOE &&
              c.ffn_dim == 12288 && c.norm_topk, "qwen3-next config: %s", e.msg);
    free(nx);
    cJSON_AddItemToObject(jn, "norm_topk_prob", cJSON_CreateFalse());
    cJSON_AddItemToObject(jn, "decoder_sparse_step", cJSON_CreateNumber(2));
    nx = cJSON_PrintUnformatted(jn);
    cJSON_Delete(jn);
    rc = cfg_with(nx, "mlp_only_layers", "[3]", &c, &e);
    CHECK(rc == 0 && !c.norm_topk && c.mlp_kind[0] == DFL_MLP_DENSE &&
              c.mlp_kind[1] == DFL_MLP_MOE && c.mlp_kind[3] == DFL_MLP_DENSE &&
              c.mlp_kind[5] == DFL_MLP_MOE, "qwen3-next sparse layers: %s", e.msg);
    expect(nx, "mlp_only_layers", "[32]", DFL_EFORMAT, "mlp_only_layers[0] is not a layer");
    expect(nx, "mlp_only_layers", "{}", DFL_EFORMAT, "mlp_only_layers is not a list");
    expect(nx, "decoder_sparse_step", "0", DFL_EFORMAT, "decoder_sparse_step = 0");
    expect(nx, "intermediate_size", NULL, DFL_EFORMAT, "layer 0 is dense but intermediate_size");
    free(nx);
    /* Qwen3-MoE: Qwen3 with experts on its sparse layers, no shared expert */
    jn = cJSON_Parse(QWEN3);
    cJSON_ReplaceItemInObject(jn, "architectures", cJSON_Parse("[\"Qwen3MoeForCausalLM\"]"));
    cJSON_AddItemToObject(jn, "num_experts", cJSON_CreateNumber(128));
    cJSON_AddItemToObject(jn, "num_experts_per_tok", cJSON_CreateNumber(8));
    cJSON_AddItemToObject(jn, "moe_intermediate_size", cJSON_CreateNumber(768));
    cJSON_AddItemToObject(jn, "mlp_only_layers", cJSON_Parse("[0, 27]"));
    nx = cJSON_PrintUnformatted(jn);
    cJSON_Delete(jn);
    rc = cfg_with(nx, NULL, NULL, &c, &e);
    CHECK(rc == 0 && c.arch == ARCH_QWEN3_MOE && c.qk_norm && c.n_experts == 128 &&
              c.shared_ffn == 0 && c.router_softmax && c.norm_topk && !c.norm_offset &&
              c.mlp_kind[0] == DFL_MLP_DENSE && c.mlp_kind[1] == DFL_MLP_MOE &&
              c.mlp_kind[27] == DFL_MLP_DENSE, "qwen3-moe config: %s", e.msg);
    expect(nx, "num_experts_per_tok", "129", DFL_EFORMAT, "num_experts_per_tok = 129");
    expect(nx, "moe_intermediate_size", NULL, DFL_EFORMAT, "moe_intermediate_size is missing");
    expect(nx, "mlp_only_layers", "[-1]", DFL_EFORMAT, "mlp_only_layers[0] is not a layer");
    free(nx);
    /* the multimodal class: the text model's fields in text_config, tie at the top */
    char mm[4096];
    snprintf(mm, sizeof mm, "{\"architectures\":[\"Qwen3_5ForConditionalGeneration\"],"
             "\"tie_word_embeddings\":true,\"vision_config\":{\"depth\":27},\"text_config\":%s}",
             QWEN35);
    rc = cfg_with(mm, NULL, NULL, &c, &e);
    CHECK(rc == 0 && c.arch == ARCH_QWEN35 && c.dim == 4096 && c.n_layers == 32 && c.tied_embed &&
              c.layer_kind[0] == DFL_LAYER_RECURRENT, "qwen3.5 multimodal config: %s", e.msg);
    rc = cfg_with(mm, "text_config", "{\"hidden_size\":64}", &c, &e);
    CHECK(rc == DFL_EFORMAT && strstr(e.msg, "num_hidden_layers is missing"),
          "text_config without its fields: %s", e.msg);
}

/* From a file: messages name the path. */
static void test_hf_file(void) {
    const char *dir = test_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":0,"
          "\"num_attention_heads\":8,\"intermediate_size\":172,\"vocab_size\":512}", f);
    fclose(f);
    dfl_config c;
    dfl_error e = {0};
    CHECK(dfl_config_from_hf(path, &c, &e) == DFL_EFORMAT && strstr(e.msg, path) &&
              strstr(e.msg, "num_hidden_layers = 0"), "file error names the path: %s", e.msg);
    snprintf(path, sizeof path, "%s/none.json", dir);
    CHECK(dfl_config_from_hf(path, &c, &e) == DFL_EIO, "missing file -> EIO");
    test_rmdir(dir);
}

/* ---- GGUF metadata ------------------------------------------------------- */

static void test_gguf_stories(void) {
    const char *path = test_asset("stories260K/stories260K.gguf");
    if (!path) return;
    gguf_file g;
    dfl_error e = {0};
    if (dfl_gguf_open(path, &g, &e)) return;
    dfl_config c;
    int rc = dfl_config_from_gguf(&g, &c, &e);
    CHECK(rc == 0, "stories260K config: %s", e.msg);
    /* the llama2.c header of the same model: dim 64, hidden 172, 5 layers, 8 heads, 4 kv, 512 */
    CHECK(c.arch == ARCH_LLAMA && c.dim == 64 && c.ffn_dim == 172 && c.n_layers == 5 &&
              c.n_heads == 8 && c.n_kv_heads == 4 && c.vocab == 512 && c.head_dim == 8,
          "stories260K dims");
    CHECK(c.rope_neox == 0 && c.tied_embed == 0 && c.norm_eps == 1e-5f && c.rope_theta == 10000 &&
              c.bos_id == 1 && c.eos_id == 2 && c.max_ctx == 2048,
          "stories260K: interleaved rope, output.weight present, eps, theta, bos/eos");
    dfl_rope r;
    dfl_rope_init(&r, &c);
    CHECK(r.head_dim == 8 && r.neox == 0 && r.mscale == 1 && r.inv_freq[0] == 1 &&
              fabsf(r.inv_freq[1] - 0.1f) < 1e-8f && fabsf(r.inv_freq[2] - 0.01f) < 1e-9f &&
              fabsf(r.inv_freq[3] - 0.001f) < 1e-10f, "default rope table 10000^(-2i/8)");
    free(r.inv_freq);
    dfl_gguf_free(&g);
}

typedef struct { gguf_wkv kv[32]; int n; uint32_t u[32]; float f[32]; } kvlist;

static void add_u32(kvlist *l, const char *k, uint32_t v) {
    l->u[l->n] = v;
    l->kv[l->n] = (gguf_wkv){k, GGUF_T_U32, 0, 0, &l->u[l->n]};
    l->n++;
}
static void add_f32(kvlist *l, const char *k, float v) {
    l->f[l->n] = v;
    l->kv[l->n] = (gguf_wkv){k, GGUF_T_F32, 0, 0, &l->f[l->n]};
    l->n++;
}
static void add_str(kvlist *l, const char *k, const char *v) {
    l->kv[l->n++] = (gguf_wkv){k, GGUF_T_STRING, 0, 0, v};
}

/* Writes l (minus the key `drop`) and reads the config back. */
static int gguf_cfg(const kvlist *l, const char *drop, dfl_config *c, dfl_error *e) {
    static const char *toks[6] = {"<unk>", "<s>", "</s>", "a", "b", "c"};
    kvlist m = *l;
    int n = 0;
    for (int i = 0; i < l->n; i++)
        if (!drop || strcmp(l->kv[i].key, drop) != 0) {
            m.kv[n] = l->kv[i];
            /* values point into l: keep them */
            n++;
        }
    m.kv[n++] = (gguf_wkv){"tokenizer.ggml.tokens", GGUF_T_ARRAY, GGUF_T_STRING, 6, toks};
    const char *dir = test_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    memset(e, 0, sizeof *e);
    int rc = dfl_gguf_write(path, m.kv, n, NULL, 0, e);
    gguf_file g;
    if (!rc) rc = dfl_gguf_open(path, &g, e);
    if (!rc) {
        rc = dfl_config_from_gguf(&g, c, e);
        dfl_gguf_free(&g);
    }
    test_rmdir(dir);
    return rc;
}

static void qwen3_gguf(kvlist *l) {
    memset(l, 0, sizeof *l);
    add_str(l, "general.architecture", "qwen3");
    add_u32(l, "qwen3.block_count", 2);
    add_u32(l, "qwen3.embedding_length", 64);
    add_u32(l, "qwen3.attention.head_count", 4);
    add_u32(l, "qwen3.attention.head_count_kv", 2);
    add_u32(l, "qwen3.attention.key_length", 32);
    add_u32(l, "qwen3.attention.value_length", 32);
    add_u32(l, "qwen3.feed_forward_length", 128);
    add_u32(l, "qwen3.context_length", 40960);
    add_f32(l, "qwen3.attention.layer_norm_rms_epsilon", 1e-6f);
    add_f32(l, "qwen3.rope.freq_base", 1e6f);
    add_str(l, "qwen3.rope.scaling.type", "yarn");
    add_f32(l, "qwen3.rope.scaling.factor", 4);
    add_u32(l, "qwen3.rope.scaling.original_context_length", 32768);
    add_u32(l, "tokenizer.ggml.bos_token_id", 0xffffffffu);
    add_u32(l, "tokenizer.ggml.eos_token_id", 2);
}

static void test_gguf_meta(void) {
    kvlist l;
    dfl_config c;
    dfl_error e;
    qwen3_gguf(&l);
    int rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == 0, "qwen3 gguf: %s", e.msg);
    CHECK(c.arch == ARCH_QWEN3 && c.n_layers == 2 && c.dim == 64 && c.n_heads == 4 &&
              c.n_kv_heads == 2 && c.head_dim == 32 && c.ffn_dim == 128 && c.vocab == 6 &&
              c.max_ctx == 40960 && c.rope_neox == 1 && c.qk_norm == 1 && c.bos_id == -1 &&
              c.eos_id == 2, "qwen3 gguf dims (vocab from the token list, bos -1 = none)");
    CHECK(c.rope_scale_type == ROPE_SCALE_YARN && c.rope_factor == 4 && c.rope_orig_ctx == 32768 &&
              c.rope_beta_fast == 32 && c.rope_beta_slow == 1 &&
              fabsf(c.rope_attn_factor - (float)(0.1 * log(4.0) + 1)) < 1e-6f, "qwen3 gguf yarn");
    rc = gguf_cfg(&l, "qwen3.attention.head_count_kv", &c, &e);
    CHECK(rc == 0 && c.n_kv_heads == 4, "head_count_kv defaults to head_count");
    rc = gguf_cfg(&l, "qwen3.attention.key_length", &c, &e);
    CHECK(rc == DFL_EUNSUP && strstr(e.msg, "value_length = 32 differs from key_length = 16"),
          "value_length must match: %s", e.msg);
    rc = gguf_cfg(&l, "qwen3.block_count", &c, &e);
    CHECK(rc == DFL_EFORMAT && strstr(e.msg, "qwen3.block_count is missing"), "%s", e.msg);

    qwen3_gguf(&l);
    l.u[4] = 3; /* head_count_kv */
    rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == DFL_EFORMAT && strstr(e.msg, "not a multiple of num_key_value_heads = 3"),
          "GQA mismatch: %s", e.msg);
    qwen3_gguf(&l);
    l.u[1] = 5000; /* block_count */
    rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == DFL_EFORMAT && strstr(e.msg, "qwen3.block_count = 5000 (expected 1..1024)"),
          "%s", e.msg);
    qwen3_gguf(&l);
    l.kv[0].val = "gpt2";
    rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == DFL_EUNSUP && strstr(e.msg, "general.architecture = \"gpt2\" not supported"),
          "%s", e.msg);
    qwen3_gguf(&l);
    l.kv[11].val = "longrope";
    rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == DFL_EUNSUP && strstr(e.msg, "qwen3.rope.scaling.type = \"longrope\""), "%s", e.msg);
    qwen3_gguf(&l);
    add_u32(&l, "qwen3.rope.dimension_count", 16);
    rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == DFL_EUNSUP && strstr(e.msg, "partial RoPE"), "%s", e.msg);
    qwen3_gguf(&l);
    l.f[9] = 0; /* eps */
    rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == DFL_EFORMAT && strstr(e.msg, "rms_norm_eps = 0"), "%s", e.msg);
    qwen3_gguf(&l);
    l.kv[1].type = GGUF_T_F32; /* block_count as a float */
    rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == DFL_EFORMAT && strstr(e.msg, "qwen3.block_count has type 6"), "%s", e.msg);
}

/* Qwen3.5 as llama.cpp writes it (metadata only: every MLP dense without router tensors). */
static void qwen35_gguf(kvlist *l) {
    memset(l, 0, sizeof *l);
    add_str(l, "general.architecture", "qwen35");
    add_u32(l, "qwen35.block_count", 4);
    add_u32(l, "qwen35.embedding_length", 64);
    add_u32(l, "qwen35.attention.head_count", 4);
    add_u32(l, "qwen35.attention.head_count_kv", 2);
    add_u32(l, "qwen35.attention.key_length", 32);
    add_u32(l, "qwen35.attention.value_length", 32);
    add_u32(l, "qwen35.feed_forward_length", 96);
    add_u32(l, "qwen35.context_length", 256);
    add_f32(l, "qwen35.attention.layer_norm_rms_epsilon", 1e-6f);
    add_f32(l, "qwen35.rope.freq_base", 1e7f);
    add_u32(l, "qwen35.rope.dimension_count", 8);   /* [11] */
    add_u32(l, "qwen35.ssm.conv_kernel", 4);
    add_u32(l, "qwen35.ssm.state_size", 16);
    add_u32(l, "qwen35.ssm.group_count", 2);
    add_u32(l, "qwen35.ssm.time_step_rank", 4);     /* [15] */
    add_u32(l, "qwen35.ssm.inner_size", 96);         /* [16] 4 heads of 24 */
    add_u32(l, "qwen35.full_attention_interval", 2); /* [17] */
}

static void test_gguf_hybrid(void) {
    kvlist l;
    dfl_config c;
    dfl_error e;
    qwen35_gguf(&l);
    int rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == 0 && c.arch == ARCH_QWEN35 && c.lin_conv == 4 && c.lin_k_dim == 16 &&
              c.lin_k_heads == 2 && c.lin_v_heads == 4 && c.lin_v_dim == 24 && c.qk_norm &&
              c.gating == DFL_GATE_Q_SIGMOID && c.norm_offset == 0 && c.n_experts == 0,
          "qwen35 gguf: %s", e.msg);
    CHECK(c.layer_kind[0] == DFL_LAYER_RECURRENT && c.layer_kind[1] == DFL_LAYER_FULL &&
              c.layer_kind[2] == DFL_LAYER_RECURRENT && c.layer_kind[3] == DFL_LAYER_FULL,
          "full_attention_interval 2: every second layer full");
    dfl_rope r;
    dfl_rope_init(&r, &c);
    CHECK(r.head_dim == 8 && r.stride == 32, "rope.dimension_count 8 of 32 rotated (%d)",
          r.head_dim);
    free(r.inv_freq);
    add_u32(&l, "qwen35.nextn_predict_layers", 1);   /* a 5th block: the MTP head */
    l.u[1] = 5;
    rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == 0 && c.n_layers == 4 && c.mtp_blocks == 1 && c.layer_kind[3] == DFL_LAYER_FULL,
          "nextn_predict_layers: the last block is not a layer: %s", e.msg);
    l.u[18] = 5;
    rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == DFL_EFORMAT && strstr(e.msg, "qwen35.nextn_predict_layers = 5 (expected 0..4)"),
          "%s", e.msg);
    qwen35_gguf(&l);
    rc = gguf_cfg(&l, "qwen35.full_attention_interval", &c, &e);
    CHECK(rc == 0 && c.layer_kind[3] == DFL_LAYER_FULL && c.layer_kind[1] == DFL_LAYER_RECURRENT,
          "no interval: llama.cpp's 4");
    rc = gguf_cfg(&l, "qwen35.ssm.time_step_rank", &c, &e);
    CHECK(rc == DFL_EFORMAT && strstr(e.msg, "qwen35.ssm.time_step_rank is missing"), "%s",
          e.msg);
    rc = gguf_cfg(&l, "qwen35.feed_forward_length", &c, &e);
    CHECK(rc == DFL_EFORMAT && strstr(e.msg, "qwen35.feed_forward_length is missing"), "%s",
          e.msg);
    l.u[16] = 90;
    rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == DFL_EFORMAT && strstr(e.msg, "qwen35.ssm.inner_size = 90"), "%s", e.msg);
    qwen35_gguf(&l);
    l.u[15] = 3;
    rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == DFL_EFORMAT && strstr(e.msg, "ssm.time_step_rank = 3 value heads"), "%s", e.msg);
    qwen35_gguf(&l);
    l.u[11] = 7;
    rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == DFL_EFORMAT && strstr(e.msg, "qwen35.rope.dimension_count = 7"), "%s", e.msg);
    qwen35_gguf(&l);
    l.u[17] = 0;
    rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == DFL_EFORMAT && strstr(e.msg, "qwen35.full_attention_interval = 0"), "%s", e.msg);
    /* recurrent layers as one bool per layer, and of the wrong length */
    static const uint8_t rec[4] = {1, 1, 0, 1};
    qwen35_gguf(&l);
    l.kv[17] = (gguf_wkv){"qwen35.attention.recurrent_layers", GGUF_T_ARRAY, GGUF_T_BOOL, 4, rec};
    rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == 0 && c.layer_kind[1] == DFL_LAYER_RECURRENT && c.layer_kind[2] == DFL_LAYER_FULL,
          "attention.recurrent_layers: %s", e.msg);
    l.kv[17].arr_n = 3;
    rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == DFL_EFORMAT && strstr(e.msg, "attention.recurrent_layers has 3 entries"), "%s",
          e.msg);
    /* experts named but no router tensor: every layer dense; softmax gating only */
    qwen35_gguf(&l);
    add_u32(&l, "qwen35.expert_count", 4);
    add_u32(&l, "qwen35.expert_used_count", 5);
    rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == DFL_EFORMAT && strstr(e.msg, "qwen35.expert_used_count = 5 (expected 1..4)"),
          "%s", e.msg);
    l.u[19] = 2;
    add_u32(&l, "qwen35.expert_feed_forward_length", 16);
    add_u32(&l, "qwen35.expert_shared_feed_forward_length", 16);
    add_u32(&l, "qwen35.expert_gating_func", 2);
    rc = gguf_cfg(&l, NULL, &c, &e);
    CHECK(rc == DFL_EUNSUP && strstr(e.msg, "qwen35.expert_gating_func = 2 not supported"), "%s",
          e.msg);
}

/* ---- RoPE scaling against transformers' definitions --------------------- */

/* _compute_llama3_parameters(theta 500000, hd 128, factor 8, low 1, high 4, old 8192) */
static const double LLAMA3_REF[64] = {
    1, 0.8146172339, 0.6636012377, 0.5405810046, 0.4403666027, 0.3587302238, 0.2922278226,
    0.2380538205, 0.1939227447, 0.1579728099, 0.1286873734, 0.1048309522, 0.08539710029,
    0.06956594961, 0.05666962145, 0.04616405027, 0.03760603093, 0.03063452089, 0.02495540867,
    0.02032910598, 0.01656044008, 0.01349041989, 0.01098952853, 0.008952259336, 0.007292664737,
    0.005940730376, 0.004839421346, 0.00394227603, 0.003211445995, 0.002166570764,
    0.001371893568, 0.0008567514129, 0.000524846161, 0.0003126937504, 0.0001785078128,
    9.556212354e-05, 7.784655274e-05, 6.341514346e-05, 5.165906875e-05, 4.208236769e-05,
    3.428102196e-05, 2.792591128e-05, 2.27489286e-05, 1.853166929e-05, 1.509621718e-05,
    1.229763868e-05, 1.00178684e-05, 8.160728247e-06, 6.647869871e-06, 5.415469365e-06,
    4.411534675e-06, 3.593712174e-06, 2.92749987e-06, 2.384791846e-06, 1.942692537e-06,
    1.582550821e-06, 1.289173172e-06, 1.050182683e-06, 8.554969126e-07, 6.969025286e-07,
    5.677088101e-07, 4.624653805e-07, 3.76732269e-07, 3.068925989e-07};

/* _compute_yarn_parameters(theta 1e6, hd 128, factor 4, original 32768, beta 32/1) */
static const double YARN_REF[64] = {
    1, 0.8058421878, 0.6493816316, 0.5232991147, 0.4216965034, 0.3398208329, 0.2738419634,
    0.2206734069, 0.177827941, 0.143301257, 0.1154781985, 0.09305720409, 0.07498942093,
    0.06042963902, 0.04869675252, 0.03924189758, 0.0316227766, 0.02548296748, 0.02053525026,
    0.016548171, 0.01333521432, 0.01074607828, 0.008659643234, 0.006978305849, 0.005375321491,
    0.004131738023, 0.003168422575, 0.00242342238, 0.001848276565, 0.001405112482,
    0.001064360981, 0.0008029597275, 0.0006029411765, 0.0004503235755, 0.0003342405457,
    0.0002462584069, 0.0001798411559, 0.0001299314949, 9.262301704e-05, 6.490394321e-05,
    4.445698525e-05, 3.582531426e-05, 2.886954962e-05, 2.326430102e-05, 1.874735523e-05,
    1.510740976e-05, 1.217418813e-05, 9.810474396e-06, 7.90569415e-06, 6.37074187e-06,
    5.133812566e-06, 4.13704275e-06, 3.33380358e-06, 2.686519571e-06, 2.164910808e-06,
    1.744576462e-06, 1.405853313e-06, 1.132895909e-06, 9.129353181e-07, 7.356817941e-07,
    5.928434264e-07, 4.777382437e-07, 3.849816315e-07, 3.102344402e-07};

static int close_rel(const float *got, const double *want, int n, double tol) {
    for (int i = 0; i < n; i++)
        if (fabs(got[i] - want[i]) > tol * fabs(want[i])) {
            fprintf(stderr, "  [%d] %.10g vs %.10g\n", i, got[i], want[i]);
            return 0;
        }
    return 1;
}

static void test_rope(void) {
    dfl_config c;
    dfl_error e;
    dfl_rope r;
    cfg_with(LLAMA31, NULL, NULL, &c, &e);
    dfl_rope_init(&r, &c);
    CHECK(r.head_dim == 128 && r.neox == 1 && r.mscale == 1 &&
              close_rel(r.inv_freq, LLAMA3_REF, 64, 1e-6), "llama3 rope matches transformers");
    free(r.inv_freq);

    cfg_with(QWEN3, "rope_scaling",
             "{\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":32768}",
             &c, &e);
    dfl_rope_init(&r, &c);
    CHECK(close_rel(r.inv_freq, YARN_REF, 64, 1e-6), "yarn rope matches transformers");
    CHECK(fabs(r.mscale - (0.1 * log(4.0) + 1)) < 1e-6, "yarn mscale 0.1 ln(4) + 1 = %g", r.mscale);
    free(r.inv_freq);

    cfg_with(QWEN3, "rope_scaling",
             "{\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":32768,"
             "\"attention_factor\":0.75}", &c, &e);
    dfl_rope_init(&r, &c);
    CHECK(r.mscale == 0.75f, "explicit attention_factor");
    free(r.inv_freq);

    cfg_with(QWEN3, "rope_scaling", "{\"rope_type\":\"linear\",\"factor\":2.0}", &c, &e);
    dfl_rope_init(&r, &c);
    int ok = 1;
    for (int i = 0; i < 64; i++)
        ok &= fabs(r.inv_freq[i] - pow(1e6, -2.0 * i / 128) / 2) <= 1e-6 * pow(1e6, -2.0 * i / 128);
    CHECK(ok && r.mscale == 1, "linear: default / factor");
    free(r.inv_freq);
}

/* A matrix another model bound (a drafter's copy of its target's small
 * lm_head) converted by dfl_w_convert: new type and data, and no longer the
 * f32 transpose of the old data, which dfl_matmul would read instead. */
static void test_w_convert(void) {
    enum { R = 4, C = 64 };
    uint16_t src[R * C];
    float row[C], back[C], panels[1] = {0};
    for (int i = 0; i < R * C; i++) src[i] = dfl_f32_to_bf16(0.01f * (float)(i % 37) - 0.2f);
    dfl_tensors ts = {.source = "test"};
    dfl_weights w = {.ts = &ts, .convert = 1, .type = DFL_Q8_0};
    dfl_mat m = {.type = DFL_BF16, .rows = R, .cols = C, .data = (const uint8_t *)src,
                 .row_bytes = sizeof(uint16_t) * C, .wt = panels};
    dfl_error err = {0};
    CHECK(dfl_w_convert(&w, "head", &m, &err) == 0, "dfl_w_convert: %s", err.msg);
    CHECK(m.type == DFL_Q8_0 && m.data != (const uint8_t *)src, "converted to q8_0, in a copy");
    CHECK(m.wt == NULL, "the old data's f32 transpose is dropped");
    dfl_dequant_row(DFL_BF16, (const uint8_t *)(src + C), row, C);
    dfl_dequant_row(m.type, m.data + m.row_bytes, back, C);
    float worst = 0;
    for (int i = 0; i < C; i++) worst = fmaxf(worst, fabsf(back[i] - row[i]));
    CHECK(worst < 0.01f, "row 1 round-trips through q8_0 (worst error %g)", worst);
    dfl_weights_free_owned(w.owned);
}

int main(void) {
    test_hf_sliding();
    test_hf_valid();
    test_hf_refused();
    test_hf_qwen35();
    test_hf_file();
    test_gguf_stories();
    test_gguf_meta();
    test_gguf_hybrid();
    test_rope();
    test_w_convert();
    return test_summary();
}
