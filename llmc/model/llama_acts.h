/*
 * llama_acts.h: the activations the GPU model keeps from forward for
 * backward, and the scratch buffers backward shares between layers.
 *
 * Per layer (N = B*T tokens, bf16 unless said):
 *   res_in   [N, C]          the layer's input: the embedding, or the previous
 *                            layer's output (res_mid + its MLP branch)
 *   ln_attn  [N, C], rstd_attn [N] fp32    rmsnorm(res_in) * attn_norm
 *   qkv      [N, (H+2KV) D]  q and k after RoPE, v
 *   qk_raw   [N, H+KV, D], qk_rstd [N, H+KV] fp32   (qk_norm, Qwen3) q and k before their norm
 *   att_out  [N, H D], att_stats [B, H, T] fp32 (log-sum-exp per row)
 *   res_mid  [N, C]          res_in + o_proj(att_out)
 *   ln_mlp   [N, C], rstd_mlp [N] fp32     rmsnorm(res_mid) * mlp_norm
 *   gate_up  [N, 2F]         gate_proj and up_proj outputs, side by side
 *   swiglu_out [N, F]        silu(gate) * up
 * then res_final (the last layer's output), ln_final, rstd_final, and branch
 * [N, C]: an o_proj or down_proj output until the next norm adds it to the
 * residual stream.
 *
 * What backward recomputes is not kept: with recompute level 1, ln_attn,
 * ln_mlp and swiglu_out of every layer share one buffer each; with level 2
 * gate_up too. Below level 3 the statistics (rstd, att_stats) and the residual
 * stream are kept: they are small, or needed exactly. Level 3 keeps only each
 * layer's input, res_in (backward runs the layer's forward again, attention
 * included): everything else is one buffer for all layers.
 *
 * Backward scratch, one of each for all layers: d_res [N, C] (the residual
 * stream's gradient), d_ln [N, C], d_att_out [N, H D], d_qkv [N, (H+2KV) D],
 * d_swiglu [N, F], and the rmsnorm weight-gradient partials.
 *
 * Between the end of the forward and the start of the backward, while the
 * classifier computes the loss, nothing reads d_res, d_att_out, d_qkv, d_swiglu
 * or the one-for-all-layers buffers of what backward recomputes (ln_attn,
 * ln_mlp, swiglu_out from level 1, gate_up from level 2): backward writes each
 * before it reads it. They are one allocation, loss_scratch, which the
 * classifier's logits chunk shares (llama_model.h): at least its bytes, so a
 * chunk that fits in them costs no memory of its own (855 MB at Qwen2.5-1.5B's
 * 16 x 1024 tokens, recompute 1).
 */
#ifndef LLMC_LLAMA_ACTS_H
#define LLMC_LLAMA_ACTS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "llmc/common/cuda_common.h"
#include "llmc/model/llama_config.h"
#include "llmc/kernels/bias.h"
#include "llmc/kernels/qk_norm.h"
#include "llmc/kernels/rmsnorm.h"
#include "llmc/common/utils.h"

typedef struct {
    bf16 *res_in, *ln_attn, *qkv, *att_out, *res_mid, *ln_mlp, *gate_up, *swiglu_out;
    float *rstd_attn, *rstd_mlp, *att_stats;
    bf16 *qk_raw;   /* with qk_norm (Qwen3): [N, H + KV, D] the q and k heads before their norm, else NULL */
    float *qk_rstd; /* with qk_norm: [N, H + KV] */
} LayerActs;

#define ACTS_MAX_BUFFERS 32

typedef struct {
    LayerActs *layers; /* [L] */
    bf16 *res_final, *ln_final, *branch;
    float *rstd_final;
    bf16 *d_res, *d_ln, *d_att_out, *d_qkv, *d_swiglu;
    float *norm_scratch; /* the norms' dweight partials, the q, k, v bias's, the q/k norms' */
    void *loss_scratch;  /* what no one reads during the loss (see the top), the logits chunk's too */
    size_t loss_scratch_bytes;
    void *owned[ACTS_MAX_BUFFERS]; /* every device buffer above comes from one of these */
    int n_owned;
} Activations;

static inline void *acts_alloc_(Activations *a, size_t bytes, const char *what)
{
    if (a->n_owned == ACTS_MAX_BUFFERS)
        FAIL("llama_acts.h: more than %d activation buffers; raise ACTS_MAX_BUFFERS", ACTS_MAX_BUFFERS);
    return a->owned[a->n_owned++] = cuda_malloc_named(bytes, what);
}

/* bytes per layer: one buffer per layer, or one that every layer shares when
 * backward recomputes it; *stride is the distance between layers' parts. */
static inline char *acts_per_layer_(Activations *a, int L, size_t bytes, int shared, size_t *stride, const char *what)
{
    *stride = shared ? 0 : bytes;
    return (char *)acts_alloc_(a, bytes * (shared ? 1 : (size_t)L), what);
}
#define ACTS_PER_LAYER(a, L, field, type, n, shared, what)                                                             \
    do {                                                                                                               \
        size_t stride_;                                                                                                \
        char *base_ = acts_per_layer_(a, L, (size_t)(n) * sizeof(type), shared, &stride_, what);                       \
        for (int l_ = 0; l_ < (L); l_++)                                                                               \
            (a)->layers[l_].field = (type *)(base_ + (size_t)l_ * stride_);                                            \
    } while (0)

/* The buffers free during the loss (see the top), carved one after another out of base (256-byte aligned pieces);
 * base NULL: only counts. Returns their bytes. */
static inline size_t acts_loss_scratch_(Activations *a, char *base, const LlamaConfig *c, int64_t N, int recompute)
{
    int64_t C = c->d_model, F = c->ffn_dim;
    int64_t QKV = (int64_t)(c->n_head + 2 * c->n_kv_head) * c->head_dim, HD = (int64_t)c->n_head * c->head_dim;
    struct {
        int wanted;
        int64_t elements;
        bf16 **field;        /* a scratch buffer, or */
        size_t layer_offset; /* a LayerActs field every layer shares */
    } parts[] = {{1, N * C, &a->d_res, 0},
                 {1, N * HD, &a->d_att_out, 0},
                 {1, N * QKV, &a->d_qkv, 0},
                 {1, N * F, &a->d_swiglu, 0},
                 {recompute >= 1, N * C, NULL, offsetof(LayerActs, ln_attn)},
                 {recompute >= 1, N * C, NULL, offsetof(LayerActs, ln_mlp)},
                 {recompute >= 1, N * F, NULL, offsetof(LayerActs, swiglu_out)},
                 {recompute >= 2, N * 2 * F, NULL, offsetof(LayerActs, gate_up)}};
    size_t at = 0;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        if (!parts[i].wanted)
            continue;
        bf16 *p = base ? (bf16 *)(base + at) : NULL;
        if (parts[i].field)
            *parts[i].field = p;
        else
            for (int l = 0; base && l < c->n_layer; l++)
                *(bf16 **)((char *)&a->layers[l] + parts[i].layer_offset) = p;
        at += ((size_t)parts[i].elements * sizeof(bf16) + 255) / 256 * 256;
    }
    return at;
}

/* The bytes of loss_scratch before the logits chunk's share: what llama_build can give the chunk for free. */
static inline size_t acts_loss_scratch_bytes(const LlamaConfig *c, int B, int T, int recompute)
{
    Activations none;
    memset(&none, 0, sizeof(none));
    return acts_loss_scratch_(&none, NULL, c, (int64_t)B * T, recompute);
}

/* The activations of B x T tokens at the recompute level; loss_scratch at least loss_bytes (the logits chunk). */
static inline void acts_build(Activations *a, const LlamaConfig *c, int B, int T, int recompute, size_t loss_bytes)
{
    memset(a, 0, sizeof(*a));
    int L = c->n_layer;
    int64_t N = (int64_t)B * T, C = c->d_model, F = c->ffn_dim;
    int64_t QKV = (int64_t)(c->n_head + 2 * c->n_kv_head) * c->head_dim, HD = (int64_t)c->n_head * c->head_dim;
    a->layers = (LayerActs *)calloc_check((size_t)L, sizeof(LayerActs), "layer activations");
    size_t scratch = acts_loss_scratch_(a, NULL, c, N, recompute);
    a->loss_scratch_bytes = scratch > loss_bytes ? scratch : loss_bytes;
    a->loss_scratch = acts_alloc_(a, a->loss_scratch_bytes, "backward scratch and logits chunk");
    acts_loss_scratch_(a, (char *)a->loss_scratch, c, N, recompute);
    /* the residual stream: layer 0's input, then each layer's output (the last one is res_final) */
    a->layers[0].res_in = (bf16 *)acts_alloc_(a, (size_t)N * C * sizeof(bf16), "embedding output");
    bf16 *outputs = (bf16 *)acts_alloc_(a, (size_t)N * C * L * sizeof(bf16), "residual stream");
    for (int l = 1; l < L; l++)
        a->layers[l].res_in = outputs + (int64_t)(l - 1) * N * C;
    a->res_final = outputs + (int64_t)(L - 1) * N * C;
    int whole = recompute >= 3; /* the layer recomputed from its input */
    ACTS_PER_LAYER(a, L, res_mid, bf16, N * C, whole, "residual stream (mid-layer)");
    ACTS_PER_LAYER(a, L, rstd_attn, float, N, whole, "rmsnorm statistics");
    ACTS_PER_LAYER(a, L, rstd_mlp, float, N, whole, "rmsnorm statistics");
    a->rstd_final = (float *)acts_alloc_(a, (size_t)N * sizeof(float), "rmsnorm statistics");
    if (recompute < 1) { /* else in loss_scratch */
        ACTS_PER_LAYER(a, L, ln_attn, bf16, N * C, 0, "attention norm output");
        ACTS_PER_LAYER(a, L, ln_mlp, bf16, N * C, 0, "MLP norm output");
    }
    ACTS_PER_LAYER(a, L, qkv, bf16, N * QKV, whole, "QKV activations");
    ACTS_PER_LAYER(a, L, att_out, bf16, N * HD, whole, "attention output");
    if (c->qk_norm) {
        int64_t heads = c->n_head + c->n_kv_head;
        ACTS_PER_LAYER(a, L, qk_raw, bf16, N * heads * c->head_dim, whole, "q and k heads before their norm");
        ACTS_PER_LAYER(a, L, qk_rstd, float, N *heads, whole, "q and k norm statistics");
    }
    ACTS_PER_LAYER(a, L, att_stats, float, N * c->n_head, whole, "attention statistics");
    if (recompute < 2)
        ACTS_PER_LAYER(a, L, gate_up, bf16, N * 2 * F, 0, "gate/up activations");
    if (recompute < 1)
        ACTS_PER_LAYER(a, L, swiglu_out, bf16, N * F, 0, "SwiGLU output");
    a->ln_final = (bf16 *)acts_alloc_(a, (size_t)N * C * sizeof(bf16), "final norm output");
    a->branch = (bf16 *)acts_alloc_(a, (size_t)N * C * sizeof(bf16), "residual branch");

    a->d_ln = (bf16 *)acts_alloc_(a, (size_t)N * C * sizeof(bf16), "norm output gradient"); /* the loss writes it */
    /* the norms' dweight partials, and the q, k, v bias's (Qwen2) */
    size_t norm_floats = rmsnorm_backward_scratch_floats((int)N, (int)C);
    size_t bias_floats = c->qkv_bias ? bias_backward_scratch_floats((int)N, (int)QKV) : 0;
    size_t qk_floats = c->qk_norm ? qk_norm_backward_scratch_floats((int)N, c->head_dim) : 0;
    size_t scratch_floats = norm_floats > bias_floats ? norm_floats : bias_floats;
    scratch_floats = scratch_floats > qk_floats ? scratch_floats : qk_floats;
    a->norm_scratch = (float *)acts_alloc_(a, scratch_floats * sizeof(float), "norm and bias backward scratch");
}

static inline void acts_free(Activations *a)
{
    for (int i = 0; i < a->n_owned; i++)
        cuda_free(a->owned[i]);
    free(a->layers);
    memset(a, 0, sizeof(*a));
}

#endif /* LLMC_LLAMA_ACTS_H */
