/*
 * param_layout.h: every parameter of the model as a tensor of one flat array,
 * derived from its description (llama_config.h): HF names, row-major shapes,
 * offsets (int64: a 128K x 4096 embedding alone passes 2^29 elements) and
 * whether each gets weight decay; what ZeRO's plan, checkpoints, safetensors
 * and the CPU reference read. Also the weights' init and the FLOPs per token,
 * which follow from the layout.
 *
 * Layer order; within a layer, q, k, v are adjacent (one fused [(H+2KV)*D, C]
 * projection) and so are gate, up (one fused [2F, C] projection): fused GEMMs
 * need no copies, and a layer is one contiguous range that ZeRO can shard.
 * Reads only its arguments; the layout's tensors are allocated (free with
 * llama_param_layout_free).
 */
#ifndef LLMC_PARAM_LAYOUT_H
#define LLMC_PARAM_LAYOUT_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/common/utils.h"
#include "llmc/model/llama_config.h"

/* The kinds of tensor a decoder layer may hold, in their order in the flat buffer;
 * a layer holds those its model's options call for (LAYER_Q_BIAS to LAYER_V_BIAS with
 * qkv_bias, LAYER_Q_NORM and LAYER_K_NORM with qk_norm), every layer the same.
 * LAYER_Q is also where the stacked [q; k; v] projection starts, LAYER_Q_BIAS where
 * its stacked bias does, LAYER_GATE where the stacked [gate; up] projection starts:
 * the GPU model runs each as one GEMM. */
enum {
    LAYER_ATTN_NORM,
    LAYER_Q,
    LAYER_K,
    LAYER_V,
    LAYER_Q_BIAS,
    LAYER_K_BIAS,
    LAYER_V_BIAS,
    LAYER_Q_NORM,
    LAYER_K_NORM,
    LAYER_O,
    LAYER_MLP_NORM,
    LAYER_GATE,
    LAYER_UP,
    LAYER_DOWN,
    LAYER_KINDS
};

typedef struct {
    char name[96];      /* HF name */
    int64_t rows, cols; /* cols == 1 for vectors */
    int64_t numel;
    int64_t offset; /* into the flat parameter array */
    int is_matrix;  /* gets weight decay */
    int bucket;     /* ZeRO's unit of sharding and of overlap: 0 the embedding, 1 + l layer l, then the rest */
    int is_bias;    /* a vector HF initialises to zeros (the norms' weights start at ones) */
} ParamTensor;

typedef struct {
    int n_tensors;
    ParamTensor *tensors; /* [embed, layer 0's, ..., final norm, lm_head if untied] */
    int64_t total;
    int n_buckets;               /* the tensors' buckets: 0 to n_buckets - 1, in order */
    int n_layer, per_layer;      /* layers, and the tensors each holds */
    int layer_slot[LAYER_KINDS]; /* where in a layer each kind sits, -1 where the model has none */
    int tied;                    /* lm_head is the embedding */
} ParamLayout;

/* The flat layout of all parameters; free with llama_param_layout_free. */
static inline ParamLayout llama_param_layout(const LlamaConfig *c)
{
    ParamLayout layout;
    memset(&layout, 0, sizeof(layout));
    int64_t C = c->d_model, V = c->vocab_size, F = c->ffn_dim, D = c->head_dim;
    int64_t QD = (int64_t)c->n_head * D, KVD = (int64_t)c->n_kv_head * D;
    static const char *const layer_names[LAYER_KINDS] = {"input_layernorm.weight",
                                                         "self_attn.q_proj.weight",
                                                         "self_attn.k_proj.weight",
                                                         "self_attn.v_proj.weight",
                                                         "self_attn.q_proj.bias",
                                                         "self_attn.k_proj.bias",
                                                         "self_attn.v_proj.bias",
                                                         "self_attn.q_norm.weight",
                                                         "self_attn.k_norm.weight",
                                                         "self_attn.o_proj.weight",
                                                         "post_attention_layernorm.weight",
                                                         "mlp.gate_proj.weight",
                                                         "mlp.up_proj.weight",
                                                         "mlp.down_proj.weight"};
    const int64_t layer_shapes[LAYER_KINDS][2] = {{C, 1}, {QD, C}, {KVD, C}, {KVD, C}, {QD, 1}, {KVD, 1}, {KVD, 1},
                                                  {D, 1}, {D, 1},  {C, QD},  {C, 1},   {F, C},  {F, C},   {C, F}};
    for (int k = 0; k < LAYER_KINDS; k++) {
        int present = k >= LAYER_Q_BIAS && k <= LAYER_V_BIAS   ? c->qkv_bias
                      : k == LAYER_Q_NORM || k == LAYER_K_NORM ? c->qk_norm
                                                               : 1;
        layout.layer_slot[k] = present ? layout.per_layer++ : -1;
    }
    layout.n_layer = c->n_layer;
    layout.tied = c->tie_embeddings;
    layout.n_tensors = 2 + c->n_layer * layout.per_layer + (c->tie_embeddings ? 0 : 1);
    layout.tensors = (ParamTensor *)calloc_check((size_t)layout.n_tensors, sizeof(ParamTensor), "parameter layout");
    int64_t offset = 0;
    int i = 0, bucket = 0;
    /* weight decay on the matrices only: not on the norms' weights, nor on the biases */
#define ADD_TENSOR(rows_, cols_, ...)                                                                                  \
    do {                                                                                                               \
        ParamTensor *t = &layout.tensors[i++];                                                                         \
        snprintf(t->name, sizeof(t->name), __VA_ARGS__);                                                               \
        t->rows = (rows_);                                                                                             \
        t->cols = (cols_);                                                                                             \
        t->numel = t->rows * t->cols;                                                                                  \
        t->offset = offset;                                                                                            \
        t->is_matrix = t->cols > 1;                                                                                    \
        t->bucket = bucket;                                                                                            \
        t->is_bias = strstr(t->name, ".bias") != NULL;                                                                 \
        offset += t->numel;                                                                                            \
    } while (0)
    ADD_TENSOR(V, C, "model.embed_tokens.weight");
    for (int l = 0; l < c->n_layer; l++) {
        bucket = 1 + l;
        for (int k = 0; k < LAYER_KINDS; k++) {
            if (layout.layer_slot[k] >= 0)
                ADD_TENSOR(layer_shapes[k][0], layer_shapes[k][1], "model.layers.%d.%s", l, layer_names[k]);
        }
    }
    bucket = 1 + c->n_layer;
    ADD_TENSOR(C, 1, "model.norm.weight");
    if (!c->tie_embeddings)
        ADD_TENSOR(V, C, "lm_head.weight");
#undef ADD_TENSOR
    layout.total = offset;
    layout.n_buckets = bucket + 1;
    return layout;
}

static inline void llama_param_layout_free(ParamLayout *layout)
{
    free(layout->tensors);
    layout->tensors = NULL;
}

/* Whether the layers hold tensors of this kind. */
static inline int param_layer_has(const ParamLayout *layout, int which)
{
    return layout->layer_slot[which] >= 0;
}

/* Index into ParamLayout.tensors of one layer's tensor (one its layers hold), of the final norm, of lm_head. */
static inline int param_index_layer(const ParamLayout *layout, int layer, int which)
{
    if (!param_layer_has(layout, which))
        FAIL("param_index_layer: the model's layers hold no tensor of kind %d", which);
    return 1 + layer * layout->per_layer + layout->layer_slot[which];
}
static inline int param_index_final_norm(const ParamLayout *layout)
{
    return 1 + layout->n_layer * layout->per_layer;
}
/* lm_head is the embedding when tied. */
static inline int param_index_lm_head(const ParamLayout *layout)
{
    return layout->tied ? 0 : 2 + layout->n_layer * layout->per_layer;
}

/* HF's init into a flat host array of layout->total floats: normal(0, init_std)
 * (Box-Muller) for every matrix, ones for the RMSNorm weights, zeros for the biases. Each value is a
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
                p[j] = t->is_bias ? 0.0f : 1.0f;
                continue;
            }
            uint64_t state = seed ^ (uint64_t)(t->offset + j) * 0xD1B54A32D192ED03ull;
            double u1 = random_uniform(&state), u2 = random_uniform(&state);
            p[j] = (float)(c->init_std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
        }
    }
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

#endif /* LLMC_PARAM_LAYOUT_H */
