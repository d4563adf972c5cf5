/*
 * llama_config.h: the Llama 3 model spec shared by every trainer: the config
 * struct, the published presets, the flat parameter layout, and the RoPE
 * inverse frequencies.
 *
 * The model is HF transformers' LlamaForCausalLM: x = embed[tokens]; per block
 *   x = x + o_proj(attn(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))),  n = rmsnorm(x) * w_in
 *   x = x + down_proj(silu(gate_proj(n)) * up_proj(n)),                  n = rmsnorm(x) * w_post
 * then logits = lm_head(rmsnorm(x) * w_final), lm_head tied to embed or not.
 * rmsnorm(x) = x / sqrt(mean(x^2) + eps); attention is causal with n_head query
 * heads sharing n_kv_head key/value heads (grouped-query), scaled by 1/sqrt(head_dim).
 *
 * Parameters live in one flat float array, HF names and row-major layouts, in
 * layer order. Within a layer, q, k, v are adjacent (one fused [(H+2KV)*D, C]
 * projection) and so are gate, up (one fused [2F, C] projection): fused GEMMs
 * need no copies, and a layer is one contiguous range that ZeRO can shard.
 * All offsets are int64: a 128K x 4096 embedding alone passes 2^29 elements.
 */
#ifndef LLMC_LLAMA_CONFIG_H
#define LLMC_LLAMA_CONFIG_H

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/formats/tensorfile.h"
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
} LlamaConfig;

/* Bounds far above any published Llama, so that every size product of the
 * parameter layout fits an int64 and every count an int. */
#define LLAMA_MAX_VOCAB (1 << 24)
#define LLAMA_MAX_D_MODEL (1 << 16)
#define LLAMA_MAX_FFN (1 << 18)
#define LLAMA_MAX_LAYERS 1024
#define LLAMA_MAX_HEADS 1024
#define LLAMA_MAX_HEAD_DIM 1024
#define LLAMA_MAX_SEQ_LEN (1 << 24)

/* How many of targets[0..n) count for the loss. */
static inline int64_t count_targets(const int *targets, int64_t n)
{
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++)
        count += targets[i] != IGNORE_INDEX;
    return count;
}

/* Tensors of one decoder layer, in their order in the flat buffer. LAYER_Q is
 * also where the stacked [q; k; v] projection starts, LAYER_GATE where the
 * stacked [gate; up] one does: the GPU model runs each as one GEMM. */
enum {
    LAYER_ATTN_NORM,
    LAYER_Q,
    LAYER_K,
    LAYER_V,
    LAYER_O,
    LAYER_MLP_NORM,
    LAYER_GATE,
    LAYER_UP,
    LAYER_DOWN,
    LAYER_TENSORS
};

typedef struct {
    char name[96];      /* HF name */
    int64_t rows, cols; /* cols == 1 for vectors */
    int64_t numel;
    int64_t offset; /* into the flat parameter array */
    int is_matrix;  /* gets weight decay */
} ParamTensor;

typedef struct {
    int n_tensors;
    ParamTensor *tensors; /* [embed, layer 0 x LAYER_TENSORS, ..., final norm, lm_head if untied] */
    int64_t total;
} ParamLayout;

typedef struct {
    const char *name;
    LlamaConfig config;
} LlamaPreset;

/* Published shapes; the 1B and 3B are tied, the 8B is not. */
static const LlamaPreset LLAMA_PRESETS[] = {
    {"llama3.2-1b",
     {128256, 2048, 16, 32, 8, 64, 8192, 131072, 500000.0f, 1, 32.0f, 1.0f, 4.0f, 8192, 1e-5f, 1, 0.02f}},
    {"llama3.2-3b",
     {128256, 3072, 28, 24, 8, 128, 8192, 131072, 500000.0f, 1, 32.0f, 1.0f, 4.0f, 8192, 1e-5f, 1, 0.02f}},
    {"llama3.1-8b",
     {128256, 4096, 32, 32, 8, 128, 14336, 131072, 500000.0f, 1, 8.0f, 1.0f, 4.0f, 8192, 1e-5f, 0, 0.02f}},
    /* Small shapes for quick runs with the real tokenizer's vocab; nano trains on a CPU in minutes. */
    {"nano", {128256, 64, 2, 4, 2, 16, 176, 1024, 500000.0f, 0, 0.0f, 0.0f, 0.0f, 0, 1e-5f, 1, 0.02f}},
    {"tiny", {128256, 256, 4, 8, 2, 32, 704, 2048, 500000.0f, 0, 0.0f, 0.0f, 0.0f, 0, 1e-5f, 1, 0.02f}},
    {"small", {128256, 512, 8, 8, 4, 64, 1408, 4096, 500000.0f, 0, 0.0f, 0.0f, 0.0f, 0, 1e-5f, 1, 0.02f}},
};
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
    return 0;
}

/* The flat layout of all parameters; free with llama_param_layout_free. */
static inline ParamLayout llama_param_layout(const LlamaConfig *c)
{
    ParamLayout layout;
    layout.n_tensors = 2 + c->n_layer * LAYER_TENSORS + (c->tie_embeddings ? 0 : 1);
    layout.tensors = (ParamTensor *)calloc_check((size_t)layout.n_tensors, sizeof(ParamTensor), "parameter layout");
    int64_t C = c->d_model, V = c->vocab_size, F = c->ffn_dim;
    int64_t QD = (int64_t)c->n_head * c->head_dim, KVD = (int64_t)c->n_kv_head * c->head_dim;
    static const char *layer_names[LAYER_TENSORS] = {"input_layernorm",  "self_attn.q_proj", "self_attn.k_proj",
                                                     "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm",
                                                     "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
    int64_t layer_shapes[LAYER_TENSORS][2] = {{C, 1}, {QD, C}, {KVD, C}, {KVD, C}, {C, QD},
                                              {C, 1}, {F, C},  {F, C},   {C, F}};
    int64_t offset = 0;
    int i = 0;
#define ADD_TENSOR(rows_, cols_, ...)                                                                                  \
    do {                                                                                                               \
        ParamTensor *t = &layout.tensors[i++];                                                                         \
        snprintf(t->name, sizeof(t->name), __VA_ARGS__);                                                               \
        t->rows = (rows_);                                                                                             \
        t->cols = (cols_);                                                                                             \
        t->numel = t->rows * t->cols;                                                                                  \
        t->offset = offset;                                                                                            \
        t->is_matrix = t->cols > 1;                                                                                    \
        offset += t->numel;                                                                                            \
    } while (0)
    ADD_TENSOR(V, C, "model.embed_tokens.weight");
    for (int l = 0; l < c->n_layer; l++) {
        for (int k = 0; k < LAYER_TENSORS; k++) {
            ADD_TENSOR(layer_shapes[k][0], layer_shapes[k][1], "model.layers.%d.%s.weight", l, layer_names[k]);
        }
    }
    ADD_TENSOR(C, 1, "model.norm.weight");
    if (!c->tie_embeddings)
        ADD_TENSOR(V, C, "lm_head.weight");
#undef ADD_TENSOR
    layout.total = offset;
    return layout;
}

static inline void llama_param_layout_free(ParamLayout *layout)
{
    free(layout->tensors);
    layout->tensors = NULL;
}

/* Index into ParamLayout.tensors of one layer's tensor, of the final norm, of lm_head. */
static inline int param_index_layer(int layer, int which)
{
    return 1 + layer * LAYER_TENSORS + which;
}
static inline int param_index_final_norm(const LlamaConfig *c)
{
    return 1 + c->n_layer * LAYER_TENSORS;
}
/* lm_head is the embedding when tied. */
static inline int param_index_lm_head(const LlamaConfig *c)
{
    return c->tie_embeddings ? 0 : 2 + c->n_layer * LAYER_TENSORS;
}

/*
 * RoPE inverse frequencies, head_dim/2 of them, exactly as HF computes them in
 * float32: inv_freq[i] = theta^(-2i/D); with Llama 3.1 scaling, wavelengths
 * 2*pi/inv_freq above original_max_pos/low_freq_factor are divided by factor,
 * those below original_max_pos/high_freq_factor kept, and those between
 * interpolated smoothly.
 */
static inline void llama_rope_inv_freq(const LlamaConfig *c, float *inv_freq)
{
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        float exponent = (float)(2 * i) / (float)c->head_dim;
        float f = 1.0f / powf(c->rope_theta, exponent);
        if (c->rope_scaling_llama3) {
            float old_len = (float)c->rope_original_max_pos;
            float low_wavelen = old_len / c->rope_low_freq_factor;
            float high_wavelen = old_len / c->rope_high_freq_factor;
            float wavelen = 2.0f * (float)M_PI / f;
            if (wavelen > low_wavelen) {
                f = f / c->rope_factor;
            } else if (!(wavelen < high_wavelen)) {
                float smooth = (old_len / wavelen - c->rope_low_freq_factor) /
                               (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1.0f - smooth) * f / c->rope_factor + smooth * f;
            }
        }
        inv_freq[i] = f;
    }
}

/* HF's init into a flat host array of layout->total floats: normal(0, init_std)
 * (Box-Muller) for every matrix, ones for the RMSNorm weights. Each value is a
 * function of (seed, its index) alone, so the loop parallelises (OpenMP where
 * built with it) and every build gives the same weights. Not meant to
 * reproduce torch's random stream. */
static inline void llama_init_weights_host(float *params, const LlamaConfig *c, const ParamLayout *layout,
                                           uint64_t seed)
{
    for (int i = 0; i < layout->n_tensors; i++) {
        const ParamTensor *t = &layout->tensors[i];
        float *p = params + t->offset;
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < t->numel; j++) {
            if (!t->is_matrix) {
                p[j] = 1.0f;
                continue;
            }
            uint64_t state = seed ^ (uint64_t)(t->offset + j) * 0xD1B54A32D192ED03ull;
            double u1 = random_uniform(&state), u2 = random_uniform(&state);
            p[j] = (float)(c->init_std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
        }
    }
}

/* The metadata keys of a .llmt file that hold its LlamaConfig, in the order
 * of llama_config_from_tensorfile (docs/tensor_file_format.md). */
static const char *const LLAMA_CONFIG_META_KEYS[] = {"config.vocab_size",
                                                     "config.d_model",
                                                     "config.n_layer",
                                                     "config.n_head",
                                                     "config.n_kv_head",
                                                     "config.head_dim",
                                                     "config.ffn_dim",
                                                     "config.max_seq_len",
                                                     "config.rope_theta",
                                                     "config.rope_scaling",
                                                     "config.rope_factor",
                                                     "config.rope_low_freq_factor",
                                                     "config.rope_high_freq_factor",
                                                     "config.rope_original_max_pos",
                                                     "config.norm_eps",
                                                     "config.tie_embeddings",
                                                     "config.init_std"};
#define LLAMA_CONFIG_META_N ((int)(sizeof(LLAMA_CONFIG_META_KEYS) / sizeof(LLAMA_CONFIG_META_KEYS[0])))

/* A metadata value of key as a whole number in [lo, hi] (as Python's repr writes
 * it; "8.0" too) into *out, or an error naming the file, the key and the value. */
static inline int llama_meta_int_(const TensorFile *tf, const char *key, const char *v, long lo, long hi, int *out,
                                  char *err, size_t errlen)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || *end || errno || !(x >= lo && x <= hi) || x != floor(x))
        return set_error(err, errlen, "'%s': metadata %s = '%s' is not a whole number in [%ld, %ld] (corrupt?)",
                         tf->path, key, v, lo, hi);
    *out = (int)x;
    return 0;
}

/* A metadata value of key as a finite float (positive unless zero_ok) into *out, or an error naming the file. */
static inline int llama_meta_float_(const TensorFile *tf, const char *key, const char *v, int zero_ok, float *out,
                                    char *err, size_t errlen)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || *end || errno || !isfinite((float)x) || !(x > 0 || (zero_ok && x == 0)))
        return set_error(err, errlen, "'%s': metadata %s = '%s' is not a %s finite number (corrupt?)", tf->path, key, v,
                         zero_ok ? "non-negative" : "positive");
    *out = (float)x;
    return 0;
}

/* The config in a .llmt file's metadata (weights or dump) into *c, or an error
 * naming the file and the key that is missing or out of range. */
static inline int llama_config_from_tensorfile_try(const TensorFile *tf, LlamaConfig *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    const char *const *keys = LLAMA_CONFIG_META_KEYS;
    const char *v[LLAMA_CONFIG_META_N];
    for (int i = 0; i < LLAMA_CONFIG_META_N; i++) {
        v[i] = tensorfile_meta(tf, keys[i]);
        if (!v[i])
            return set_error(err, errlen,
                             "'%s' has no metadata key '%s'; regenerate it with reference/make_reference.py", tf->path,
                             keys[i]);
    }
    if (llama_meta_int_(tf, keys[0], v[0], 1, LLAMA_MAX_VOCAB, &c->vocab_size, err, errlen) ||
        llama_meta_int_(tf, keys[1], v[1], 1, LLAMA_MAX_D_MODEL, &c->d_model, err, errlen) ||
        llama_meta_int_(tf, keys[2], v[2], 1, LLAMA_MAX_LAYERS, &c->n_layer, err, errlen) ||
        llama_meta_int_(tf, keys[3], v[3], 1, LLAMA_MAX_HEADS, &c->n_head, err, errlen) ||
        llama_meta_int_(tf, keys[4], v[4], 1, LLAMA_MAX_HEADS, &c->n_kv_head, err, errlen) ||
        llama_meta_int_(tf, keys[5], v[5], 1, LLAMA_MAX_HEAD_DIM, &c->head_dim, err, errlen) ||
        llama_meta_int_(tf, keys[6], v[6], 1, LLAMA_MAX_FFN, &c->ffn_dim, err, errlen) ||
        llama_meta_int_(tf, keys[7], v[7], 1, LLAMA_MAX_SEQ_LEN, &c->max_seq_len, err, errlen) ||
        llama_meta_float_(tf, keys[8], v[8], 0, &c->rope_theta, err, errlen))
        return -1;
    if (strcmp(v[9], "llama3") == 0)
        c->rope_scaling_llama3 = 1;
    else if (strcmp(v[9], "none") != 0)
        return set_error(err, errlen, "'%s': unknown rope scaling '%s' (known: none, llama3)", tf->path, v[9]);
    if (llama_meta_float_(tf, keys[10], v[10], 1, &c->rope_factor, err, errlen) ||
        llama_meta_float_(tf, keys[11], v[11], 1, &c->rope_low_freq_factor, err, errlen) ||
        llama_meta_float_(tf, keys[12], v[12], 1, &c->rope_high_freq_factor, err, errlen) ||
        llama_meta_int_(tf, keys[13], v[13], 0, LLAMA_MAX_SEQ_LEN, &c->rope_original_max_pos, err, errlen) ||
        llama_meta_float_(tf, keys[14], v[14], 0, &c->norm_eps, err, errlen) ||
        llama_meta_int_(tf, keys[15], v[15], 0, 1, &c->tie_embeddings, err, errlen) ||
        llama_meta_float_(tf, keys[16], v[16], 0, &c->init_std, err, errlen))
        return -1;
    char why[512];
    if (llama_config_check(c, why, sizeof(why)) != 0)
        return set_error(err, errlen, "'%s': bad model config: %s", tf->path, why);
    return 0;
}

/* The same, exiting with the error. */
static inline LlamaConfig llama_config_from_tensorfile(const TensorFile *tf)
{
    LlamaConfig c;
    char err[2048];
    if (llama_config_from_tensorfile_try(tf, &c, err, sizeof(err)) != 0)
        FAIL("%s", err);
    return c;
}

/* A layer's four Linear maps y = x W^T, in this order (with FP8, each layer's map has its own slot, linear.h), and
 * their shapes: W is [out, in]. */
enum { LINEAR_QKV, LINEAR_O, LINEAR_GATE_UP, LINEAR_DOWN, LINEAR_MAPS };
typedef struct {
    int64_t in, out;
} LinearShape;

static inline LinearShape llama_linear_shape(const LlamaConfig *c, int map)
{
    int64_t C = c->d_model, F = c->ffn_dim, HD = (int64_t)c->n_head * c->head_dim;
    int64_t QKV = (int64_t)(c->n_head + 2 * c->n_kv_head) * c->head_dim;
    LinearShape shapes[LINEAR_MAPS] = {{C, QKV}, {HD, C}, {C, 2 * F}, {F, C}};
    return shapes[map];
}

/* What room for the operands of any of n maps of these shapes takes: the widest input and output row, the largest
 * W. */
typedef struct {
    int64_t widest_in, widest_out, largest_w;
} LinearExtents;

static inline LinearExtents linear_extents(const LinearShape *shapes, int n)
{
    LinearExtents e = {0, 0, 0};
    for (int i = 0; i < n; i++) {
        LinearShape s = shapes[i];
        e.widest_in = s.in > e.widest_in ? s.in : e.widest_in;
        e.widest_out = s.out > e.widest_out ? s.out : e.widest_out;
        e.largest_w = s.in * s.out > e.largest_w ? s.in * s.out : e.largest_w;
    }
    return e;
}

/* The extents of a layer's four maps. */
static inline LinearExtents llama_linear_extents(const LlamaConfig *c)
{
    LinearShape shapes[LINEAR_MAPS];
    for (int map = 0; map < LINEAR_MAPS; map++)
        shapes[map] = llama_linear_shape(c, map);
    return linear_extents(shapes, LINEAR_MAPS);
}

/* Whether every input and output dimension of the four maps is a multiple of m (FP8 block scaling: whole 128-blocks
 * along whatever a GEMM sums over). */
static inline int llama_linear_dims_multiple_of(const LlamaConfig *c, int64_t m)
{
    for (int map = 0; map < LINEAR_MAPS; map++) {
        LinearShape s = llama_linear_shape(c, map);
        if (s.in % m != 0 || s.out % m != 0)
            return 0;
    }
    return 1;
}

/* Parameter count, and the PaLM/torchtitan FLOPs per token of one training
 * step: 6 N (N without the embedding, which is a lookup, but with lm_head,
 * tied or not) + 12 L H D T for the attention scores and values. */
static inline double llama_flops_per_token(const LlamaConfig *c, int T)
{
    ParamLayout layout = llama_param_layout(c);
    double n = (double)layout.total - (double)c->vocab_size * c->d_model;
    if (c->tie_embeddings)
        n += (double)c->vocab_size * c->d_model;
    llama_param_layout_free(&layout);
    return 6.0 * n + 12.0 * c->n_layer * c->n_head * c->head_dim * (double)T;
}

static inline void llama_config_print(const LlamaConfig *c, FILE *out)
{
    fprintf(out, "model: vocab %d, d_model %d, layers %d, heads %d (kv %d, head_dim %d), ffn %d, max_seq_len %d\n",
            c->vocab_size, c->d_model, c->n_layer, c->n_head, c->n_kv_head, c->head_dim, c->ffn_dim, c->max_seq_len);
    fprintf(out, "       rope theta %g%s, norm eps %g, %s embeddings\n", c->rope_theta,
            c->rope_scaling_llama3 ? " with Llama 3.1 scaling" : "", c->norm_eps,
            c->tie_embeddings ? "tied" : "untied");
}

#endif /* LLMC_LLAMA_CONFIG_H */
