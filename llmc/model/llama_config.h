/*
 * llama_config.h: the model's description, and nothing derived from it: the
 * sizes and options in LlamaConfig, the table that names each field once
 * (its .llmt key, its config.json name, its kind and range: what the file
 * readers, the log and the comparison on resume go through), the checks, and
 * the published presets. What follows from a description lives beside it:
 * param_layout.h (every tensor, its offset; init; FLOPs), linear_shapes.h,
 * rope_freqs.h.
 *
 * The model is HF transformers' LlamaForCausalLM: x = embed[tokens]; per block
 *   x = x + o_proj(attn(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))),  n = rmsnorm(x) * w_in
 *   x = x + down_proj(silu(gate_proj(n)) * up_proj(n)),                  n = rmsnorm(x) * w_post
 * then logits = lm_head(rmsnorm(x) * w_final), lm_head tied to embed or not.
 * rmsnorm(x) = x / sqrt(mean(x^2) + eps); attention is causal with n_head query
 * heads sharing n_kv_head key/value heads (grouped-query), scaled by 1/sqrt(head_dim).
 * Reads and writes only its arguments.
 */
#ifndef LLMC_LLAMA_CONFIG_H
#define LLMC_LLAMA_CONFIG_H

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/common/utils.h"

typedef struct {
    int vocab_size;
    int d_model;
    int n_layer;
    int n_head;
    int n_kv_head;
    int head_dim;
    int ffn_dim;
    int max_seq_len;
    float rope_theta;
    int rope_scaling_llama3; /* 0: plain RoPE; 1: Llama 3.1 frequency scaling */
    float rope_factor;
    float rope_low_freq_factor;
    float rope_high_freq_factor;
    int rope_original_max_pos;
    float norm_eps;
    int tie_embeddings;
    float init_std;
    int family;   /* ModelFamily: the HF architecture it reads and writes; what it computes is the options below */
    int qkv_bias; /* q, k and v projections with biases (Qwen2) */
    int qk_norm;  /* an RMSNorm over each head of q and of k, weight [head_dim], before RoPE (Qwen3) */
} LlamaConfig;

/* The HF model families with this layer: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
 * MistralForCausalLM. */
typedef enum { FAMILY_LLAMA, FAMILY_QWEN2, FAMILY_QWEN3, FAMILY_MISTRAL, FAMILY_COUNT } ModelFamily;
static const char *const FAMILY_MODEL_TYPE[FAMILY_COUNT] = {"llama", "qwen2", "qwen3", "mistral"};
static const char *const FAMILY_ARCHITECTURE[FAMILY_COUNT] = {"LlamaForCausalLM", "Qwen2ForCausalLM",
                                                              "Qwen3ForCausalLM", "MistralForCausalLM"};

/* Bounds far above any published Llama, so that every size product of the
 * parameter layout fits an int64 and every count an int. */
#define LLAMA_MAX_VOCAB (1 << 24)
#define LLAMA_MAX_D_MODEL (1 << 16)
#define LLAMA_MAX_FFN (1 << 18)
#define LLAMA_MAX_LAYERS 1024
#define LLAMA_MAX_HEADS 1024
#define LLAMA_MAX_HEAD_DIM 1024
#define LLAMA_MAX_SEQ_LEN (1 << 24)

/* The description of every LlamaConfig field, the one place that names them: the .llmt
 * metadata reader (llmt_config.h), the JSON log, the config.json comparison on resume
 * (hf_config.h) and the tests' printouts go through it.
 *   member:   the field's name in LlamaConfig (and in the tools' printouts)
 *   key:      its .llmt metadata key; without "config." its key in the JSON log
 *   hf_key:   its config.json name, where a config.json holds it
 *   kind:     a whole number in [lo, hi], a float (positive, or non-negative where lo is
 *             0), a 0/1 flag (JSON true/false), the RoPE variant ("none" or "llama3")
 *             or the family (its HF model_type: "llama", "qwen2", ...)
 *   shapes:   whether it changes the model (checked on resume); init_std only draws
 *             the first weights
 *   scaled:   meaningful only with Llama 3.1 RoPE scaling
 *   optional: a .llmt file made before the field existed may lack it: then 0 (Llama's) */
typedef enum { CONFIG_INT, CONFIG_FLOAT, CONFIG_FLAG, CONFIG_ROPE_KIND, CONFIG_FAMILY } ConfigKind;
typedef struct {
    const char *member, *key, *hf_key;
    ConfigKind kind;
    size_t offset;
    double lo, hi;
    int shapes, scaled, optional;
} ConfigField;

// clang-format off
#define LLAMA_FIELD_(member_, hf_key_, kind_, lo_, hi_, shapes_, scaled_) \
    {#member_, "config." #member_, hf_key_, kind_, offsetof(LlamaConfig, member_), lo_, hi_, shapes_, scaled_, 0}
#define LLAMA_OPTION_(member_, hf_key_, kind_, hi_) \
    {#member_, "config." #member_, hf_key_, kind_, offsetof(LlamaConfig, member_), 0, hi_, 1, 0, 1}
// clang-format on
/* In the order the comparison on resume reports the first difference. */
static const ConfigField LLAMA_CONFIG_FIELDS[] = {
    LLAMA_FIELD_(vocab_size, "vocab_size", CONFIG_INT, 1, LLAMA_MAX_VOCAB, 1, 0),
    LLAMA_FIELD_(d_model, "hidden_size", CONFIG_INT, 1, LLAMA_MAX_D_MODEL, 1, 0),
    LLAMA_FIELD_(ffn_dim, "intermediate_size", CONFIG_INT, 1, LLAMA_MAX_FFN, 1, 0),
    LLAMA_FIELD_(n_layer, "num_hidden_layers", CONFIG_INT, 1, LLAMA_MAX_LAYERS, 1, 0),
    LLAMA_FIELD_(n_head, "num_attention_heads", CONFIG_INT, 1, LLAMA_MAX_HEADS, 1, 0),
    LLAMA_FIELD_(n_kv_head, "num_key_value_heads", CONFIG_INT, 1, LLAMA_MAX_HEADS, 1, 0),
    LLAMA_FIELD_(head_dim, "head_dim", CONFIG_INT, 1, LLAMA_MAX_HEAD_DIM, 1, 0),
    LLAMA_FIELD_(tie_embeddings, "tie_word_embeddings", CONFIG_FLAG, 0, 1, 1, 0),
    LLAMA_FIELD_(norm_eps, "rms_norm_eps", CONFIG_FLOAT, 1, 0, 1, 0),
    LLAMA_FIELD_(rope_theta, "rope_theta", CONFIG_FLOAT, 1, 0, 1, 0),
    {"rope_scaling_llama3", "config.rope_scaling", "rope_scaling", CONFIG_ROPE_KIND,
     offsetof(LlamaConfig, rope_scaling_llama3), 0, 1, 1, 0, 0},
    LLAMA_FIELD_(rope_factor, "rope_scaling.factor", CONFIG_FLOAT, 0, 0, 1, 1),
    LLAMA_FIELD_(rope_low_freq_factor, "rope_scaling.low_freq_factor", CONFIG_FLOAT, 0, 0, 1, 1),
    LLAMA_FIELD_(rope_high_freq_factor, "rope_scaling.high_freq_factor", CONFIG_FLOAT, 0, 0, 1, 1),
    LLAMA_FIELD_(rope_original_max_pos, "rope_scaling.original_max_position_embeddings", CONFIG_INT, 0,
                 LLAMA_MAX_SEQ_LEN, 1, 1),
    LLAMA_FIELD_(max_seq_len, "max_position_embeddings", CONFIG_INT, 1, LLAMA_MAX_SEQ_LEN, 1, 0),
    LLAMA_FIELD_(init_std, "initializer_range", CONFIG_FLOAT, 0, 0, 0, 0),
    LLAMA_OPTION_(family, "model_type", CONFIG_FAMILY, FAMILY_COUNT - 1),
    LLAMA_OPTION_(qkv_bias, "attention_bias", CONFIG_FLAG, 1),
    LLAMA_OPTION_(qk_norm, "qk_norm", CONFIG_FLAG, 1),
};
#undef LLAMA_FIELD_
#undef LLAMA_OPTION_
#define LLAMA_CONFIG_N_FIELDS ((int)(sizeof(LLAMA_CONFIG_FIELDS) / sizeof(LLAMA_CONFIG_FIELDS[0])))

/* A field's value: ints and flags as they are, floats widened. */
static inline double config_field_get(const LlamaConfig *c, const ConfigField *f)
{
    const char *at = (const char *)c + f->offset;
    return f->kind == CONFIG_FLOAT ? (double)*(const float *)at : (double)*(const int *)at;
}

static inline void config_field_set(LlamaConfig *c, const ConfigField *f, double v)
{
    char *at = (char *)c + f->offset;
    if (f->kind == CONFIG_FLOAT)
        *(float *)at = (float)v;
    else
        *(int *)at = (int)v;
}

/* The field's value as text: "%.9g" for floats, whole numbers, and flags and the RoPE
 * variant as JSON (true/false, "llama3"/"none") where json, else as 0/1. */
static inline void config_field_format(char *out, size_t size, const LlamaConfig *c, const ConfigField *f, int json)
{
    double v = config_field_get(c, f);
    if (f->kind == CONFIG_FLOAT)
        snprintf(out, size, "%.9g", v);
    else if (json && f->kind == CONFIG_FLAG)
        snprintf(out, size, "%s", v != 0 ? "true" : "false");
    else if (json && f->kind == CONFIG_ROPE_KIND)
        snprintf(out, size, "\"%s\"", v != 0 ? "llama3" : "none");
    else if (f->kind == CONFIG_FAMILY)
        snprintf(out, size, json ? "\"%s\"" : "%s", FAMILY_MODEL_TYPE[(int)v]);
    else
        snprintf(out, size, "%d", (int)v);
}

typedef struct {
    const char *name;
    LlamaConfig config;
} LlamaPreset;

/* Published shapes; the 1B and 3B are tied, the 8B is not. Designated initialisers: a field added to
 * LlamaConfig is zero here until a preset names it, never another field's value. */
#define LLAMA3_ROPE_SCALING(factor_)                                                                                   \
    .rope_theta = 500000.0f, .rope_scaling_llama3 = 1, .rope_factor = (factor_), .rope_low_freq_factor = 1.0f,         \
    .rope_high_freq_factor = 4.0f, .rope_original_max_pos = 8192
static const LlamaPreset LLAMA_PRESETS[] = {
    {"llama3.2-1b",
     {.vocab_size = 128256,
      .d_model = 2048,
      .n_layer = 16,
      .n_head = 32,
      .n_kv_head = 8,
      .head_dim = 64,
      .ffn_dim = 8192,
      .max_seq_len = 131072,
      LLAMA3_ROPE_SCALING(32.0f),
      .norm_eps = 1e-5f,
      .tie_embeddings = 1,
      .init_std = 0.02f}},
    {"llama3.2-3b",
     {.vocab_size = 128256,
      .d_model = 3072,
      .n_layer = 28,
      .n_head = 24,
      .n_kv_head = 8,
      .head_dim = 128,
      .ffn_dim = 8192,
      .max_seq_len = 131072,
      LLAMA3_ROPE_SCALING(32.0f),
      .norm_eps = 1e-5f,
      .tie_embeddings = 1,
      .init_std = 0.02f}},
    {"llama3.1-8b",
     {.vocab_size = 128256,
      .d_model = 4096,
      .n_layer = 32,
      .n_head = 32,
      .n_kv_head = 8,
      .head_dim = 128,
      .ffn_dim = 14336,
      .max_seq_len = 131072,
      LLAMA3_ROPE_SCALING(8.0f),
      .norm_eps = 1e-5f,
      .tie_embeddings = 0,
      .init_std = 0.02f}},
    /* Small shapes for quick runs with the real tokenizer's vocab; nano trains on a CPU in minutes. */
    {"nano",
     {.vocab_size = 128256,
      .d_model = 64,
      .n_layer = 2,
      .n_head = 4,
      .n_kv_head = 2,
      .head_dim = 16,
      .ffn_dim = 176,
      .max_seq_len = 1024,
      .rope_theta = 500000.0f,
      .norm_eps = 1e-5f,
      .tie_embeddings = 1,
      .init_std = 0.02f}},
    {"tiny",
     {.vocab_size = 128256,
      .d_model = 256,
      .n_layer = 4,
      .n_head = 8,
      .n_kv_head = 2,
      .head_dim = 32,
      .ffn_dim = 704,
      .max_seq_len = 2048,
      .rope_theta = 500000.0f,
      .norm_eps = 1e-5f,
      .tie_embeddings = 1,
      .init_std = 0.02f}},
    {"small",
     {.vocab_size = 128256,
      .d_model = 512,
      .n_layer = 8,
      .n_head = 8,
      .n_kv_head = 4,
      .head_dim = 64,
      .ffn_dim = 1408,
      .max_seq_len = 4096,
      .rope_theta = 500000.0f,
      .norm_eps = 1e-5f,
      .tie_embeddings = 1,
      .init_std = 0.02f}},
/* The other families' published shapes (their config.json): the Qwen2.5 ones with q, k, v biases, the Qwen3
 * ones with q/k norms and head_dim 128 (more than d_model / n_head at 0.6B), Mistral 7B v0.3. */
/* the rest of a Qwen shape, in LlamaConfig's order (C++ wants designators in it): its RoPE, norm eps, tying, init,
 * and its family's layer option */
#define QWEN_REST(family_, tied_)                                                                                      \
    .rope_theta = 1000000.0f, .norm_eps = 1e-6f, .tie_embeddings = (tied_), .init_std = 0.02f, .family = (family_),    \
    .qkv_bias = (family_) == FAMILY_QWEN2, .qk_norm = (family_) == FAMILY_QWEN3
    {"qwen2.5-0.5b",
     {.vocab_size = 151936,
      .d_model = 896,
      .n_layer = 24,
      .n_head = 14,
      .n_kv_head = 2,
      .head_dim = 64,
      .ffn_dim = 4864,
      .max_seq_len = 32768,
      QWEN_REST(FAMILY_QWEN2, 1)}},
    {"qwen2.5-1.5b",
     {.vocab_size = 151936,
      .d_model = 1536,
      .n_layer = 28,
      .n_head = 12,
      .n_kv_head = 2,
      .head_dim = 128,
      .ffn_dim = 8960,
      .max_seq_len = 131072,
      QWEN_REST(FAMILY_QWEN2, 1)}},
    {"qwen2.5-7b",
     {.vocab_size = 152064,
      .d_model = 3584,
      .n_layer = 28,
      .n_head = 28,
      .n_kv_head = 4,
      .head_dim = 128,
      .ffn_dim = 18944,
      .max_seq_len = 131072,
      QWEN_REST(FAMILY_QWEN2, 0)}},
    {"qwen3-0.6b",
     {.vocab_size = 151936,
      .d_model = 1024,
      .n_layer = 28,
      .n_head = 16,
      .n_kv_head = 8,
      .head_dim = 128,
      .ffn_dim = 3072,
      .max_seq_len = 40960,
      QWEN_REST(FAMILY_QWEN3, 1)}},
    {"qwen3-1.7b",
     {.vocab_size = 151936,
      .d_model = 2048,
      .n_layer = 28,
      .n_head = 16,
      .n_kv_head = 8,
      .head_dim = 128,
      .ffn_dim = 6144,
      .max_seq_len = 40960,
      QWEN_REST(FAMILY_QWEN3, 1)}},
    {"qwen3-8b",
     {.vocab_size = 151936,
      .d_model = 4096,
      .n_layer = 36,
      .n_head = 32,
      .n_kv_head = 8,
      .head_dim = 128,
      .ffn_dim = 12288,
      .max_seq_len = 40960,
      QWEN_REST(FAMILY_QWEN3, 0)}},
#undef QWEN_REST
    {"mistral-7b-v0.3",
     {.vocab_size = 32768,
      .d_model = 4096,
      .n_layer = 32,
      .n_head = 32,
      .n_kv_head = 8,
      .head_dim = 128,
      .ffn_dim = 14336,
      .max_seq_len = 32768,
      .rope_theta = 1000000.0f,
      .norm_eps = 1e-5f,
      .tie_embeddings = 0,
      .init_std = 0.02f,
      .family = FAMILY_MISTRAL}},
};
#undef LLAMA3_ROPE_SCALING
#define LLAMA_N_PRESETS ((int)(sizeof(LLAMA_PRESETS) / sizeof(LLAMA_PRESETS[0])))

/* 0 and the preset in *out, or -1 if no preset has that name. */
static inline int llama_preset(const char *name, LlamaConfig *out)
{
    for (int i = 0; i < LLAMA_N_PRESETS; i++) {
        if (strcmp(LLAMA_PRESETS[i].name, name) == 0) {
            *out = LLAMA_PRESETS[i].config;
            return 0;
        }
    }
    return -1;
}

/* 0 if the config describes a model this code can build, else -1 and why. */
static inline int llama_config_check(const LlamaConfig *c, char *err, size_t errlen)
{
    if (c->vocab_size <= 0 || c->d_model <= 0 || c->n_layer <= 0 || c->n_head <= 0 || c->n_kv_head <= 0 ||
        c->head_dim <= 0 || c->ffn_dim <= 0 || c->max_seq_len <= 0) {
        snprintf(err, errlen,
                 "every size must be positive (vocab %d, d_model %d, layers %d, heads %d/%d, "
                 "head_dim %d, ffn %d, max_seq_len %d)",
                 c->vocab_size, c->d_model, c->n_layer, c->n_head, c->n_kv_head, c->head_dim, c->ffn_dim,
                 c->max_seq_len);
        return -1;
    }
    if (c->vocab_size > LLAMA_MAX_VOCAB || c->d_model > LLAMA_MAX_D_MODEL || c->n_layer > LLAMA_MAX_LAYERS ||
        c->n_head > LLAMA_MAX_HEADS || c->n_kv_head > LLAMA_MAX_HEADS || c->head_dim > LLAMA_MAX_HEAD_DIM ||
        c->ffn_dim > LLAMA_MAX_FFN || c->max_seq_len > LLAMA_MAX_SEQ_LEN) {
        snprintf(err, errlen,
                 "a size is beyond what this trainer allows (vocab %d <= %d, d_model %d <= %d, layers %d <= %d, "
                 "heads %d/%d <= %d, head_dim %d <= %d, ffn %d <= %d, max_seq_len %d <= %d)",
                 c->vocab_size, LLAMA_MAX_VOCAB, c->d_model, LLAMA_MAX_D_MODEL, c->n_layer, LLAMA_MAX_LAYERS, c->n_head,
                 c->n_kv_head, LLAMA_MAX_HEADS, c->head_dim, LLAMA_MAX_HEAD_DIM, c->ffn_dim, LLAMA_MAX_FFN,
                 c->max_seq_len, LLAMA_MAX_SEQ_LEN);
        return -1;
    }
    if (c->n_head % c->n_kv_head != 0) {
        snprintf(err, errlen, "n_head %d is not a multiple of n_kv_head %d (grouped-query attention needs it)",
                 c->n_head, c->n_kv_head);
        return -1;
    }
    if (c->head_dim % 2 != 0) {
        snprintf(err, errlen, "head_dim %d is odd; RoPE rotates pairs of dimensions", c->head_dim);
        return -1;
    }
    if (!(c->rope_theta > 1.0f) || !(c->norm_eps > 0.0f)) {
        snprintf(err, errlen, "rope_theta %g must exceed 1 and norm_eps %g must be positive", c->rope_theta,
                 c->norm_eps);
        return -1;
    }
    if (c->rope_scaling_llama3 && !(c->rope_factor >= 1.0f && c->rope_high_freq_factor > c->rope_low_freq_factor &&
                                    c->rope_low_freq_factor > 0.0f && c->rope_original_max_pos > 0)) {
        snprintf(err, errlen,
                 "Llama 3.1 rope scaling needs factor >= 1, high_freq_factor > low_freq_factor > 0 "
                 "and original_max_pos > 0 (got %g, %g, %g, %d)",
                 c->rope_factor, c->rope_high_freq_factor, c->rope_low_freq_factor, c->rope_original_max_pos);
        return -1;
    }
    if (c->family < 0 || c->family >= FAMILY_COUNT || (c->qkv_bias != 0 && c->qkv_bias != 1) ||
        (c->qk_norm != 0 && c->qk_norm != 1)) {
        snprintf(err, errlen, "family %d (0 to %d), qkv_bias %d and qk_norm %d (0 or 1) are out of range", c->family,
                 FAMILY_COUNT - 1, c->qkv_bias, c->qk_norm);
        return -1;
    }
    /* each family's HF architecture computes exactly its options: what its config.json says */
    if (c->qkv_bias != (c->family == FAMILY_QWEN2) || c->qk_norm != (c->family == FAMILY_QWEN3)) {
        snprintf(err, errlen, "a %s model has %sq/k/v biases and %sq/k norms, not qkv_bias %d, qk_norm %d",
                 FAMILY_MODEL_TYPE[c->family], c->family == FAMILY_QWEN2 ? "" : "no ",
                 c->family == FAMILY_QWEN3 ? "" : "no ", c->qkv_bias, c->qk_norm);
        return -1;
    }
    return 0;
}

static inline void llama_config_print(const LlamaConfig *c, FILE *out)
{
    fprintf(out, "model: vocab %d, d_model %d, layers %d, heads %d (kv %d, head_dim %d), ffn %d, max_seq_len %d\n",
            c->vocab_size, c->d_model, c->n_layer, c->n_head, c->n_kv_head, c->head_dim, c->ffn_dim, c->max_seq_len);
    if (c->family != FAMILY_LLAMA || c->qkv_bias || c->qk_norm)
        fprintf(out, "       %s%s%s\n", FAMILY_ARCHITECTURE[c->family], c->qkv_bias ? ", q/k/v biases" : "",
                c->qk_norm ? ", q/k RMSNorm per head" : "");
    fprintf(out, "       rope theta %g%s, norm eps %g, %s embeddings\n", c->rope_theta,
            c->rope_scaling_llama3 ? " with Llama 3.1 scaling" : "", c->norm_eps,
            c->tie_embeddings ? "tied" : "untied");
}

#endif /* LLMC_LLAMA_CONFIG_H */
