/*
 * llama_model.h: the Llama 3 model of train_llama.cu on the GPU: its buffers
 * (weights, gradients, fp32 master residuals and AdamW state placed by ZeRO,
 * activations, backward scratch), and one micro-step (forward, fused
 * classifier, backward) and optimizer step on them.
 */
#ifndef LLMC_LLAMA_MODEL_H
#define LLMC_LLAMA_MODEL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utils.h"
#include "cuda_common.h"
#include "llama_config.h"
#include "tensorfile.h"
#include "matmul.h"
#include "attention.h"
#include "rmsnorm.h"
#include "rope.h"
#include "swiglu.h"
#include "embedding.h"
#include "fused_classifier.h"
#include "adamw.h"
#include "distributed.h"
#include "zero.h"
#include "profile.h"

#define IGNORE_INDEX (-100)

typedef struct {
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
} AdamWConfig;

typedef struct {
    LlamaConfig config;
    ParamLayout layout;
    int B, T, recompute;
    int logits_chunk;

    /* Data parallel over dist->world ranks, ZeRO stage 0 to 3 (llmc/zero.h). The
     * flat buffers follow the buckets of llmc/zero_plan.h, each padded with zeros
     * so that every rank owns an equal share; a tensor lives in one bucket. Each
     * rank keeps the optimizer state (master_lo, adam_m, adam_v) of the ranges it
     * updates (everything with stage 0, its shares otherwise), back to back. */
    const Dist *dist;
    int zero_stage;
    Zero zero;                 /* the weights and gradients: zero.params, zero.grads */
    int *tensor_bucket;        /* [n_tensors] */
    int64_t *tensor_in_bucket; /* [n_tensors] its first element inside its padded bucket */

    /* the fp32 master weights are (bf16 weights, master_lo); master_lo, adam_m and
     * adam_v hold zero.state_total elements */
    int16_t *master_lo;
    float *adam_m, *adam_v;
    AdamWRuns decay_runs; /* weight decay on the matrices, not on the norm weights */
    int adam_step;

    /* activations kept for backward: per layer, or one shared buffer that
     * backward recomputes into, depending on the recompute level */
    bf16 *embedded;                           /* [N, C]: layer 0's residual input */
    bf16 **res_attn_in;                       /* [L] -> [N, C]: layer input (block_out of layer l-1) */
    bf16 **res_mlp_in;                        /* [L] -> [N, C]: after the attention residual add */
    bf16 *res_final;                          /* [N, C]: last layer's output */
    float *rstd_attn, *rstd_mlp, *rstd_final; /* [L*N], [L*N], [N] */
    bf16 **ln_attn;                           /* [L] -> [N, C] */
    bf16 **ln_mlp;                            /* [L] -> [N, C] */
    bf16 **qkv;                               /* [L] -> [N, (H+2KV)*D], after RoPE */
    bf16 **att_out;                           /* [L] -> [N, H*D] */
    float **att_stats;                        /* [L] -> [B, H, T] */
    bf16 **gate_up;                           /* [L] -> [N, 2F] */
    bf16 **swiglu_out;                        /* [L] -> [N, F] */
    bf16 *ln_final;                           /* [N, C] */
    bf16 *branch;                             /* [N, C]: o_proj / down_proj output before the residual add */

    /* backward scratch, shared by all layers */
    bf16 *d_res;     /* [N, C]: gradient of the residual stream */
    bf16 *d_ln;      /* [N, C] */
    bf16 *d_att_out; /* [N, H*D] */
    bf16 *d_qkv;     /* [N, (H+2KV)*D] */
    bf16 *d_swiglu;  /* [N, F] */
    float *norm_scratch;
    bf16 *logits;                                             /* [logits_chunk, V] */
    float *losses;                                            /* [N] */
    float *loss_parts;                                        /* [max grad accum] per micro-step loss sums */
    float *freqs_cis;                                         /* RoPE table [T, D/2, 2] */
    int *tokens, *targets;                                    /* [N] device */
    int *emb_bucket_token, *emb_bucket_start, *emb_positions; /* embedding backward plan, device */
    int *h_bucket_token, *h_bucket_start, *h_positions;       /* host side, one slot per micro-step */
    int *h_plan_workspace;
    int emb_buckets;
    float *grad_norm_sq, *clip_coef, *norm_reduce_scratch;
    float *bucket_norm_sq; /* [n_buckets] squared norms of this rank's gradient shares */
    int max_accum;
} Llama;

static inline int64_t llama_tokens(const Llama *m)
{
    return (int64_t)m->B * m->T;
}
static inline const ParamTensor *ptensor(const Llama *m, int index)
{
    return &m->layout.tensors[index];
}
/* Where the kernels read a weight and write its gradient; with ZeRO stages 2 and 3
 * a staging buffer that the bucket's turn in the step fills (llmc/zero.h). */
static inline bf16 *pweight(const Llama *m, int index)
{
    return zero_bucket_weights(&m->zero, m->tensor_bucket[index]) + m->tensor_in_bucket[index];
}
static inline bf16 *pgrad(const Llama *m, int index)
{
    return zero_bucket_grads(&m->zero, m->tensor_bucket[index]) + m->tensor_in_bucket[index];
}
static inline int last_bucket(const Llama *m)
{
    return m->zero.plan.n_buckets - 1;
}

static bf16 *alloc_bf16(int64_t n, const char *what)
{
    return (bf16 *)cuda_malloc_named((size_t)n * sizeof(bf16), what);
}
static float *alloc_f32(int64_t n, const char *what)
{
    return (float *)cuda_malloc_named((size_t)n * sizeof(float), what);
}

/* One buffer per layer when stored, or the same shared buffer for every layer
 * when backward recomputes it. */
static bf16 **alloc_per_layer(int L, int64_t n, int shared, const char *what)
{
    bf16 **p = (bf16 **)malloc_check(sizeof(bf16 *) * L, what);
    if (shared) {
        bf16 *one = alloc_bf16(n, what);
        for (int l = 0; l < L; l++)
            p[l] = one;
    } else {
        bf16 *all = alloc_bf16(n * L, what);
        for (int l = 0; l < L; l++)
            p[l] = all + (int64_t)l * n;
    }
    return p;
}

/* Copy the fp32 master weights (host, [layout.total]) to the device, split into
 * bf16 weights and residuals; this rank keeps what its stage asks of it. */
static void llama_upload_params(Llama *m, const float *host_master)
{
    int64_t P = m->layout.total;
    const Zero *z = &m->zero;
    uint16_t *hi = (uint16_t *)malloc_check((size_t)P * sizeof(uint16_t), "bf16 parameter staging");
    int16_t *lo = (int16_t *)malloc_check((size_t)P * sizeof(int16_t), "master residual staging");
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < P; i++)
        master_split(host_master[i], &hi[i], &lo[i]);
    for (int b = 0; b < z->plan.n_buckets; b++) {
        const ZeroBucket *bk = &z->plan.buckets[b];
        int64_t begin, end;
        zero_update_model_range(&z->plan, m->zero_stage, m->dist->rank, b, &begin, &end);
        if (m->zero_stage >= 3)
            CUDA_CHECK(cudaMemcpy(zero_update_weights(z, b), hi + begin, (size_t)(end - begin) * sizeof(uint16_t),
                                  cudaMemcpyHostToDevice));
        else
            CUDA_CHECK(cudaMemcpy(zero_bucket_weights(z, b), hi + bk->offset, (size_t)bk->numel * sizeof(uint16_t),
                                  cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(m->master_lo + z->state_at[b], lo + begin, (size_t)(end - begin) * sizeof(int16_t),
                              cudaMemcpyHostToDevice));
    }
    free(hi);
    free(lo);
}

/* The fp32 master weights joined from the ranks' bf16 weights and residuals:
 * [layout.total] floats on rank 0, which frees them; NULL on the others. Every
 * rank calls it, between steps. */
static float *llama_download_master(Llama *m, cudaStream_t s)
{
    int64_t P = m->layout.total;
    Zero *z = &m->zero;
    int keep = m->dist->rank == 0;
    uint16_t *hi = keep ? (uint16_t *)malloc_check((size_t)P * sizeof(uint16_t), "bf16 parameter staging") : NULL;
    int16_t *lo = keep ? (int16_t *)malloc_check((size_t)P * sizeof(int16_t), "master residual staging") : NULL;
    for (int b = 0; b < z->plan.n_buckets; b++) {
        const ZeroBucket *bk = &z->plan.buckets[b];
        const bf16 *weights;
        const int16_t *residuals;
        zero_full_bucket(z, b, m->master_lo, &weights, &residuals, s);
        if (!keep)
            continue;
        CUDA_CHECK(cudaMemcpy(hi + bk->offset, weights, (size_t)bk->numel * sizeof(uint16_t), cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(lo + bk->offset, residuals, (size_t)bk->numel * sizeof(int16_t), cudaMemcpyDeviceToHost));
    }
    if (!keep)
        return NULL;
    float *master = (float *)malloc_check((size_t)P * sizeof(float), "master weights");
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < P; i++)
        master[i] = master_join(hi[i], lo[i]);
    free(hi);
    free(lo);
    return master;
}

static void llama_build(Llama *m, const LlamaConfig *config, int B, int T, int recompute, int max_accum,
                        size_t logits_budget_bytes, const Dist *dist, int zero_stage)
{
    memset(m, 0, sizeof(*m));
    m->config = *config;
    m->dist = dist;
    m->zero_stage = zero_stage;
    m->layout = llama_param_layout(config);
    m->B = B;
    m->T = T;
    m->recompute = recompute;
    m->max_accum = max_accum;
    const LlamaConfig *c = config;
    int L = c->n_layer;
    int64_t N = (int64_t)B * T, C = c->d_model, F = c->ffn_dim, V = c->vocab_size;
    int64_t QKV = (int64_t)(c->n_head + 2 * c->n_kv_head) * c->head_dim, HD = (int64_t)c->n_head * c->head_dim;

    Zero *z = &m->zero;
    zero_init(z, dist, config, &m->layout, zero_stage, max_accum);
    int n_buckets = z->plan.n_buckets;
    int64_t n_params = zero_params_elements(z), n_grads = zero_grads_elements(z), n_state = z->state_total;
    z->params = alloc_bf16(n_params, zero_stage >= 3 ? "bf16 weight shares" : "bf16 weights");
    z->grads = alloc_bf16(n_grads, zero_stage >= 2 ? "bf16 gradient shares" : "bf16 gradients");
    m->master_lo = (int16_t *)cuda_malloc_named((size_t)n_state * sizeof(int16_t), "fp32 master weights' low halves");
    m->adam_m = alloc_f32(n_state, "AdamW first moments");
    m->adam_v = alloc_f32(n_state, "AdamW second moments");
    /* the padding stays zero: no kernel writes it, and AdamW keeps zeros zero */
    CUDA_CHECK(cudaMemset(z->params, 0, (size_t)n_params * sizeof(bf16)));
    CUDA_CHECK(cudaMemset(z->grads, 0, (size_t)n_grads * sizeof(bf16)));
    CUDA_CHECK(cudaMemset(m->master_lo, 0, (size_t)n_state * sizeof(int16_t)));
    CUDA_CHECK(cudaMemset(m->adam_m, 0, (size_t)n_state * sizeof(float)));
    CUDA_CHECK(cudaMemset(m->adam_v, 0, (size_t)n_state * sizeof(float)));
    /* a tensor's place: its bucket, and its offset there as in the unpadded layout */
    m->tensor_bucket = (int *)malloc_check(sizeof(int) * m->layout.n_tensors, "tensor buckets");
    m->tensor_in_bucket = (int64_t *)malloc_check(sizeof(int64_t) * m->layout.n_tensors, "tensor buckets");
    int64_t *run_start = (int64_t *)malloc_check(sizeof(int64_t) * m->layout.n_tensors, "AdamW runs");
    unsigned char *run_decay = (unsigned char *)malloc_check((size_t)m->layout.n_tensors, "AdamW runs");
    for (int i = 0, b = 0; i < m->layout.n_tensors; i++) {
        const ParamTensor *t = &m->layout.tensors[i];
        while (t->offset >= z->plan.buckets[b].offset + z->plan.buckets[b].numel)
            b++;
        m->tensor_bucket[i] = b;
        m->tensor_in_bucket[i] = t->offset - z->plan.buckets[b].offset;
        /* AdamW finds the decay flag by the element's place in the padded buffers */
        run_start[i] = z->plan.buckets[b].padded_offset + m->tensor_in_bucket[i];
        run_decay[i] = (unsigned char)t->is_matrix;
    }
    m->decay_runs = adamw_runs_create(run_start, run_decay, m->layout.n_tensors);
    free(run_start);
    free(run_decay);

    m->embedded = alloc_bf16(N * C, "embedding output");
    m->res_attn_in = (bf16 **)malloc_check(sizeof(bf16 *) * L, "residual pointers");
    m->res_attn_in[0] = m->embedded;
    bf16 *block_outs = alloc_bf16(N * C * L, "residual stream");
    for (int l = 1; l < L; l++)
        m->res_attn_in[l] = block_outs + (int64_t)(l - 1) * N * C;
    m->res_final = block_outs + (int64_t)(L - 1) * N * C;
    m->res_mlp_in = alloc_per_layer(L, N * C, 0, "residual stream (mid-layer)");
    m->rstd_attn = alloc_f32(N * L, "rmsnorm statistics");
    m->rstd_mlp = alloc_f32(N * L, "rmsnorm statistics");
    m->rstd_final = alloc_f32(N, "rmsnorm statistics");
    m->ln_attn = alloc_per_layer(L, N * C, recompute >= 1, "attention norm output");
    m->ln_mlp = alloc_per_layer(L, N * C, recompute >= 1, "MLP norm output");
    m->qkv = alloc_per_layer(L, N * QKV, 0, "QKV activations");
    m->att_out = alloc_per_layer(L, N * HD, 0, "attention output");
    m->att_stats = (float **)malloc_check(sizeof(float *) * L, "attention statistics pointers");
    float *stats = alloc_f32(N * c->n_head * L, "attention statistics");
    for (int l = 0; l < L; l++)
        m->att_stats[l] = stats + (int64_t)l * N * c->n_head;
    m->gate_up = alloc_per_layer(L, N * 2 * F, recompute >= 2, "gate/up activations");
    m->swiglu_out = alloc_per_layer(L, N * F, recompute >= 1, "SwiGLU output");
    m->ln_final = alloc_bf16(N * C, "final norm output");
    m->branch = alloc_bf16(N * C, "residual branch");

    m->d_res = alloc_bf16(N * C, "residual gradient");
    m->d_ln = alloc_bf16(N * C, "norm output gradient");
    m->d_att_out = alloc_bf16(N * HD, "attention output gradient");
    m->d_qkv = alloc_bf16(N * QKV, "QKV gradient");
    m->d_swiglu = alloc_bf16(N * F, "SwiGLU gradient");
    m->norm_scratch = alloc_f32(rmsnorm_backward_scratch_floats((int)N, (int)C), "rmsnorm backward scratch");
    m->logits_chunk = fused_classifier_chunk_rows((int)N, (int)V, logits_budget_bytes);
    m->logits = alloc_bf16((int64_t)m->logits_chunk * V, "logits chunk");
    m->losses = alloc_f32(N, "per-token losses");
    m->loss_parts = alloc_f32(max_accum, "micro-step losses");

    float *table = (float *)malloc_check((size_t)T * c->head_dim * sizeof(float), "RoPE table");
    rope_table_host(table, c, T);
    m->freqs_cis = alloc_f32((int64_t)T * c->head_dim, "RoPE table");
    CUDA_CHECK(cudaMemcpy(m->freqs_cis, table, (size_t)T * c->head_dim * sizeof(float), cudaMemcpyHostToDevice));
    free(table);

    m->tokens = (int *)cuda_malloc_named((size_t)N * sizeof(int), "tokens");
    m->targets = (int *)cuda_malloc_named((size_t)N * sizeof(int), "targets");
    m->emb_bucket_token = (int *)cuda_malloc_named((size_t)N * sizeof(int), "embedding backward plan");
    m->emb_bucket_start = (int *)cuda_malloc_named((size_t)(N + 1) * sizeof(int), "embedding backward plan");
    m->emb_positions = (int *)cuda_malloc_named((size_t)N * sizeof(int), "embedding backward plan");
    CUDA_CHECK(cudaMallocHost(&m->h_bucket_token, (size_t)N * max_accum * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&m->h_bucket_start, (size_t)(N + 1) * max_accum * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&m->h_positions, (size_t)N * max_accum * sizeof(int)));
    m->h_plan_workspace = (int *)malloc_check(embedding_backward_plan_workspace_ints((int)N, (int)V) * sizeof(int),
                                              "embedding backward plan");
    m->grad_norm_sq = alloc_f32(1, "grad norm");
    m->clip_coef = alloc_f32(1, "clip coefficient");
    m->norm_reduce_scratch = alloc_f32(NORM_BLOCKS, "grad norm scratch");
    m->bucket_norm_sq = alloc_f32(n_buckets, "grad norm scratch");
}

/* HF's init: normal(0, init_std) for every matrix, ones for the norm weights. */
static void llama_init_random(Llama *m, uint64_t seed)
{
    float *host = (float *)malloc_check((size_t)m->layout.total * sizeof(float), "initial weights");
    llama_init_weights_host(host, &m->config, &m->layout, seed);
    llama_upload_params(m, host);
    free(host);
}

/* Weights from a .llmt weights file whose config must match the model's. */
static void llama_load_weights(Llama *m, const char *path)
{
    TensorFile tf;
    tensorfile_open(&tf, path);
    LlamaConfig fc = llama_config_from_tensorfile(&tf);
    if (memcmp(&fc, &m->config, sizeof(fc)) != 0) {
        FAIL("'%s' holds a model of another shape than the one requested\n  hint: pass --init-from alone, "
             "without --preset or shape flags, to take the shape from the file",
             path);
    }
    float *host = (float *)malloc_check((size_t)m->layout.total * sizeof(float), "weights");
    for (int i = 0; i < m->layout.n_tensors; i++) {
        const ParamTensor *t = &m->layout.tensors[i];
        tensorfile_read(&tf, t->name, TF_FLOAT32, t->numel, host + t->offset);
    }
    tensorfile_close(&tf);
    llama_upload_params(m, host);
    free(host);
}

/* Copies micro-batch `micro` of the step to the device and plans its embedding
 * backward. Each micro-batch has its own host plan slot, so no host buffer is
 * reused before the end-of-step sync and nothing here waits for the GPU. */
static void llama_set_batch(Llama *m, const int *tokens, const int *targets, int micro, cudaStream_t stream)
{
    int64_t N = llama_tokens(m);
    int *bucket_token = m->h_bucket_token + (int64_t)micro * N;
    int *bucket_start = m->h_bucket_start + (int64_t)micro * (N + 1);
    int *positions = m->h_positions + (int64_t)micro * N;
    m->emb_buckets = embedding_backward_plan_host(bucket_token, bucket_start, positions, tokens, (int)N,
                                                  m->config.vocab_size, m->h_plan_workspace);
    CUDA_CHECK(cudaMemcpyAsync(m->tokens, tokens, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(m->targets, targets, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(m->emb_bucket_token, bucket_token, (size_t)m->emb_buckets * sizeof(int),
                               cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(m->emb_bucket_start, bucket_start, (size_t)(m->emb_buckets + 1) * sizeof(int),
                               cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(m->emb_positions, positions, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, stream));
}

static void mlp_norm_forward(Llama *m, int l, cudaStream_t s)
{
    const LlamaConfig *c = &m->config;
    PROFILED(PROF_NORM, rmsnorm_forward(m->ln_mlp[l], m->rstd_mlp + (int64_t)l * llama_tokens(m), m->res_mlp_in[l],
                                        pweight(m, param_index_layer(l, LAYER_MLP_NORM)), (int)llama_tokens(m),
                                        c->d_model, c->norm_eps, s));
}

static void attn_norm_forward(Llama *m, int l, cudaStream_t s)
{
    const LlamaConfig *c = &m->config;
    PROFILED(PROF_NORM, rmsnorm_forward(m->ln_attn[l], m->rstd_attn + (int64_t)l * llama_tokens(m), m->res_attn_in[l],
                                        pweight(m, param_index_layer(l, LAYER_ATTN_NORM)), (int)llama_tokens(m),
                                        c->d_model, c->norm_eps, s));
}

static void gate_up_forward(Llama *m, int l, cudaStream_t s)
{
    const LlamaConfig *c = &m->config;
    PROFILED(PROF_GEMM, matmul_forward(m->gate_up[l], m->ln_mlp[l], pweight(m, param_index_layer(l, LAYER_GATE)),
                                       (int)llama_tokens(m), c->d_model, 2 * c->ffn_dim, s));
}

/* Forward through the final norm; the loss comes from the classifier. Bucket b
 * of the weights is the embedding (b = 0), layer b - 1, or the final norm (and
 * lm_head); with ZeRO stage 3 each is gathered just ahead of use, the next
 * layer's while this one computes. */
static void llama_forward(Llama *m, cudaStream_t s)
{
    const LlamaConfig *c = &m->config;
    int N = (int)llama_tokens(m), C = c->d_model, L = c->n_layer, H = c->n_head, KV = c->n_kv_head, D = c->head_dim;
    int QKV = (H + 2 * KV) * D;
    Zero *z = &m->zero;
    zero_weights_ready(z, 0, s);
    zero_weights_fetch(z, 1);
    PROFILED(PROF_EMBEDDING, embedding_forward(m->embedded, m->tokens, pweight(m, 0), N, C, s));
    zero_weights_ready(z, 1, s);
    attn_norm_forward(m, 0, s);
    for (int l = 0; l < L; l++) {
        /* the next layer's bucket (its norm weight ends this layer), or the final norm's */
        int next = l + 2;
        zero_weights_fetch(z, next);
        PROFILED(PROF_GEMM,
                 matmul_forward(m->qkv[l], m->ln_attn[l], pweight(m, param_index_layer(l, LAYER_Q)), N, C, QKV, s));
        PROFILED(PROF_ROPE, rope_forward(m->qkv[l], m->freqs_cis, m->B, m->T, H, KV, D, s));
        PROFILED(PROF_ATTENTION, attention_forward(m->att_out[l], m->att_stats[l], m->qkv[l], m->B, m->T, H, KV, D, s));
        PROFILED(PROF_GEMM,
                 matmul_forward(m->branch, m->att_out[l], pweight(m, param_index_layer(l, LAYER_O)), N, H * D, C, s));
        PROFILED(PROF_NORM, fused_residual_rmsnorm_forward(
                                m->res_mlp_in[l], m->ln_mlp[l], m->rstd_mlp + (int64_t)l * N, m->res_attn_in[l],
                                m->branch, pweight(m, param_index_layer(l, LAYER_MLP_NORM)), N, C, c->norm_eps, s));
        gate_up_forward(m, l, s);
        PROFILED(PROF_SWIGLU, swiglu_forward(m->swiglu_out[l], m->gate_up[l], N, c->ffn_dim, s));
        PROFILED(PROF_GEMM, matmul_forward(m->branch, m->swiglu_out[l], pweight(m, param_index_layer(l, LAYER_DOWN)), N,
                                           c->ffn_dim, C, s));
        int last = l == L - 1;
        bf16 *res_out = last ? m->res_final : m->res_attn_in[l + 1];
        bf16 *norm_out = last ? m->ln_final : m->ln_attn[l + 1];
        float *rstd = last ? m->rstd_final : m->rstd_attn + (int64_t)(l + 1) * N;
        zero_weights_ready(z, next, s);
        const bf16 *norm_w = pweight(m, last ? param_index_final_norm(c) : param_index_layer(l + 1, LAYER_ATTN_NORM));
        PROFILED(PROF_NORM, fused_residual_rmsnorm_forward(res_out, norm_out, rstd, m->res_mlp_in[l], m->branch, norm_w,
                                                           N, C, c->norm_eps, s));
        zero_weights_done(z, l + 1, s);
    }
}

/* Backward from the classifier's d_ln (gradient of the final norm output). The
 * weight gradients are written, or added to when accumulate (later micro-steps
 * with ZeRO 0 and 1). With ZeRO 2 and 3 each bucket's gradient is handed to the
 * reduce-scatter as soon as it is complete, and stage 3 gathers the weights of
 * layer l - 1 while layer l computes. */
static void llama_backward(Llama *m, int micro, int accumulate, cudaStream_t s)
{
    const LlamaConfig *c = &m->config;
    int N = (int)llama_tokens(m), C = c->d_model, L = c->n_layer, H = c->n_head, KV = c->n_kv_head, D = c->head_dim;
    int F = c->ffn_dim, QKV = (H + 2 * KV) * D;
    Zero *z = &m->zero;
    PROFILED(PROF_OTHER, CUDA_CHECK(cudaMemsetAsync(m->d_res, 0, (size_t)N * C * sizeof(bf16), s)));
    int fn = param_index_final_norm(c);
    PROFILED(PROF_NORM, rmsnorm_backward(m->d_res, pgrad(m, fn), m->norm_scratch, m->d_ln, m->res_final, pweight(m, fn),
                                         m->rstd_final, N, C, accumulate, s));
    zero_grads_done(z, last_bucket(m), micro, s);
    for (int l = L - 1; l >= 0; l--) {
        zero_weights_ready(z, l + 1, s);
        if (l > 0)
            zero_weights_fetch(z, l);
        zero_grads_begin(z, l + 1, s);
        /* MLP: d_res is the gradient of the block's output, so also of the down_proj output */
        if (m->recompute >= 1)
            mlp_norm_forward(m, l, s);
        if (m->recompute >= 2)
            gate_up_forward(m, l, s);
        if (m->recompute >= 1)
            swiglu_forward(m->swiglu_out[l], m->gate_up[l], N, F, s);
        int down = param_index_layer(l, LAYER_DOWN), gate = param_index_layer(l, LAYER_GATE);
        PROFILED(PROF_GEMM, matmul_backward_weight(pgrad(m, down), m->d_res, m->swiglu_out[l], N, F, C, accumulate, s));
        PROFILED(PROF_GEMM, matmul_backward_input(m->d_swiglu, m->d_res, pweight(m, down), N, F, C, s));
        PROFILED(PROF_SWIGLU,
                 swiglu_backward(m->gate_up[l], m->d_swiglu, m->gate_up[l], N, F, s)); /* in place: now d gate_up */
        PROFILED(PROF_GEMM,
                 matmul_backward_weight(pgrad(m, gate), m->gate_up[l], m->ln_mlp[l], N, C, 2 * F, accumulate, s));
        PROFILED(PROF_GEMM, matmul_backward_input(m->d_ln, m->gate_up[l], pweight(m, gate), N, C, 2 * F, s));
        int mlp_norm = param_index_layer(l, LAYER_MLP_NORM);
        PROFILED(PROF_NORM, rmsnorm_backward(m->d_res, pgrad(m, mlp_norm), m->norm_scratch, m->d_ln, m->res_mlp_in[l],
                                             pweight(m, mlp_norm), m->rstd_mlp + (int64_t)l * N, N, C, accumulate, s));
        /* attention */
        int o = param_index_layer(l, LAYER_O), q = param_index_layer(l, LAYER_Q);
        PROFILED(PROF_GEMM, matmul_backward_weight(pgrad(m, o), m->d_res, m->att_out[l], N, H * D, C, accumulate, s));
        PROFILED(PROF_GEMM, matmul_backward_input(m->d_att_out, m->d_res, pweight(m, o), N, H * D, C, s));
        PROFILED(PROF_ATTENTION, attention_backward(m->d_qkv, m->d_att_out, m->qkv[l], m->att_out[l], m->att_stats[l],
                                                    m->B, m->T, H, KV, D, s));
        PROFILED(PROF_ROPE, rope_backward(m->d_qkv, m->freqs_cis, m->B, m->T, H, KV, D, s));
        if (m->recompute >= 1)
            attn_norm_forward(m, l, s);
        PROFILED(PROF_GEMM, matmul_backward_weight(pgrad(m, q), m->d_qkv, m->ln_attn[l], N, C, QKV, accumulate, s));
        PROFILED(PROF_GEMM, matmul_backward_input(m->d_ln, m->d_qkv, pweight(m, q), N, C, QKV, s));
        int attn_norm = param_index_layer(l, LAYER_ATTN_NORM);
        PROFILED(PROF_NORM,
                 rmsnorm_backward(m->d_res, pgrad(m, attn_norm), m->norm_scratch, m->d_ln, m->res_attn_in[l],
                                  pweight(m, attn_norm), m->rstd_attn + (int64_t)l * N, N, C, accumulate, s));
        zero_weights_done(z, l + 1, s);
        zero_grads_done(z, l + 1, micro, s);
    }
    /* tied: the classifier already wrote this micro-step's lm_head gradient into the
     * same tensor; untied: rows of tokens not in the batch must start from zero */
    if (!accumulate && !c->tie_embeddings)
        PROFILED(PROF_EMBEDDING,
                 CUDA_CHECK(cudaMemsetAsync(pgrad(m, 0), 0, (size_t)ptensor(m, 0)->numel * sizeof(bf16), s)));
    PROFILED(PROF_EMBEDDING, embedding_backward(pgrad(m, 0), m->d_res, m->emb_bucket_token, m->emb_bucket_start,
                                                m->emb_positions, m->emb_buckets, C, s));
    zero_grads_done(z, 0, micro, s);
}

/* Forward, loss and backward of one micro-batch already set with llama_set_batch;
 * micro-step 0 writes the gradients, later ones add to them (with ZeRO 2 and 3 each
 * micro-step writes the staging buffers and the reduce-scatter adds). The
 * micro-step's summed loss lands in loss_parts[micro]. */
static void llama_micro_step(Llama *m, float inv_count, int micro, cudaStream_t s)
{
    const LlamaConfig *c = &m->config;
    int N = (int)llama_tokens(m);
    int lm = param_index_lm_head(c);
    int accumulate = m->zero_stage < 2 && micro > 0;
    llama_forward(m, s);
    /* the head's gradients (lm_head, final norm, a tied embedding) are written from here on */
    zero_grads_begin(&m->zero, 0, s);
    zero_grads_begin(&m->zero, last_bucket(m), s);
    PROFILED(PROF_LOSS, fused_classifier_forward_backward(m->losses, m->d_ln, pgrad(m, lm), m->logits, m->ln_final,
                                                          pweight(m, lm), m->targets, N, c->d_model, c->vocab_size,
                                                          m->logits_chunk, inv_count, accumulate, s));
    PROFILED(PROF_LOSS, loss_sum(m->loss_parts + micro, m->losses, N, s));
    llama_backward(m, micro, accumulate, s);
}

/* Mean loss of the current batch without gradients (evaluation). */
static void llama_eval_micro(Llama *m, int micro, cudaStream_t s)
{
    const LlamaConfig *c = &m->config;
    int lm = param_index_lm_head(c);
    llama_forward(m, s);
    PROFILED(PROF_LOSS, fused_classifier_forward(m->losses, m->logits, m->ln_final, pweight(m, lm), m->targets,
                                                 (int)llama_tokens(m), c->d_model, c->vocab_size, m->logits_chunk, s));
    PROFILED(PROF_LOSS, loss_sum(m->loss_parts + micro, m->losses, (int)llama_tokens(m), s));
}

/* Sum the gradients over the ranks, clip by the global norm and take one AdamW
 * step on what this rank updates, bucket by bucket; the norm stays on the device.
 *   stage 0: all-reduce the gradients; every rank updates every parameter.
 *   stage 1: reduce-scatter them per bucket, so each rank holds the sum of its
 *            shares; each rank updates its shares; all-gather the new weights.
 *   stage 2: the backward pass already reduce-scattered them; as stage 1 then.
 *   stage 3: as stage 2, and the weights stay sharded (the next forward gathers).
 * Sums run in bf16 on NCCL's ring (one rounding per rank added). */
static void llama_update(Llama *m, const AdamWConfig *opt, float lr, cudaStream_t s)
{
    Zero *z = &m->zero;
    int n_buckets = z->plan.n_buckets;
    m->adam_step++;
    PROFILED(PROF_COMM, zero_reduce_grads(z, s));
    for (int b = 0; b < n_buckets; b++)
        PROFILED(PROF_OPTIMIZER, global_norm_squared(m->bucket_norm_sq + b, m->norm_reduce_scratch,
                                                     zero_update_grads(z, b), z->update_count[b], s));
    PROFILED(PROF_OPTIMIZER, norm_squared_combine(m->grad_norm_sq, m->bucket_norm_sq, n_buckets, s));
    if (m->zero_stage >= 1)
        PROFILED(PROF_COMM, dist_all_reduce_sum(m->dist, m->grad_norm_sq, 1, 4, s));
    PROFILED(PROF_OPTIMIZER, clip_coefficient(m->clip_coef, m->grad_norm_sq, opt->grad_clip, s));
    for (int b = 0; b < n_buckets; b++) {
        int64_t at = z->state_at[b];
        PROFILED(PROF_OPTIMIZER,
                 adamw_update(zero_update_weights(z, b), m->master_lo + at, zero_update_grads(z, b), m->adam_m + at,
                              m->adam_v + at, z->update_at[b], z->update_count[b], &m->decay_runs, lr, opt->beta1,
                              opt->beta2, opt->eps, opt->weight_decay, m->clip_coef, m->adam_step, s));
    }
    PROFILED(PROF_COMM, zero_params_changed(z, s));
}

#endif /* LLMC_LLAMA_MODEL_H */
