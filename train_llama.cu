/*
 * train_llama.cu: trains a Llama 3 family model (llmc/llama_config.h) on one
 * GPU or several in bf16 with fp32 master weights, bf16 gradients and fp32
 * AdamW moments: 14 bytes per parameter, divided over the GPUs by ZeRO
 * sharding. The fp32 master is the bf16 weights plus a 16-bit residual
 * (llmc/master_weights.h), exact and without a second weight copy. Gradients
 * are bf16 as in llm.c: each is one fp32-accumulated GEMM or kernel rounded
 * once, plus one rounding per extra logits chunk (lm_head) and per extra
 * micro-step; the first micro-step writes them, later ones add.
 *
 * One micro-step, N = B*T tokens:
 *   forward:  embedding -> per layer [rmsnorm -> fused QKV GEMM -> RoPE in place
 *             -> cuDNN causal GQA attention -> o_proj -> fused residual add +
 *             rmsnorm -> fused gate/up GEMM -> SwiGLU -> down_proj -> fused
 *             residual add + next rmsnorm] -> final rmsnorm
 *   loss:     chunked lm_head + cross-entropy; the N x V logits never exist at
 *             once; lm_head's gradient accumulates in fp32 chunk by chunk
 *   backward: the same in reverse; SwiGLU and the norms are recomputed rather
 *             than stored (--recompute 1, the default); --recompute 2 also
 *             recomputes the gate/up GEMM, for long sequences
 * then, once per optimizer step: gradients summed over the GPUs -> global grad
 * norm -> clip coefficient (on the device, no host sync) -> AdamW over each
 * bucket's range that this GPU updates (decay on matrices only).
 *
 * Parameters, gradients and moments are flat buffers with the layout of
 * llama_param_layout(), so q/k/v and gate/up are single fused matrices, cut
 * into per-layer buckets for ZeRO data parallelism (llmc/zero_plan.h, zero.h).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llmc/utils.h"
#include "llmc/cuda_common.h"
#include "llmc/llama_config.h"
#include "llmc/tensorfile.h"
#include "llmc/dataloader.h"
#include "llmc/schedule.h"
#include "llmc/matmul.h"
#include "llmc/attention.h"
#include "llmc/rmsnorm.h"
#include "llmc/rope.h"
#include "llmc/swiglu.h"
#include "llmc/embedding.h"
#include "llmc/fused_classifier.h"
#include "llmc/adamw.h"
#include "llmc/checkpoint.h"
#include "llmc/distributed.h"
#include "llmc/zero.h"
#include "llmc/flags.h"
#include "llmc/profile.h"
#include "llmc/watchdog.h"

#define IGNORE_INDEX (-100)
/* Dense bf16 peak of an H100 SXM, the MFU denominator (PaLM/torchtitan convention). */
#define PEAK_BF16_FLOPS 989e12
/* Largest workspace the deterministic attention backward may take. */
#define DETERMINISTIC_ATTENTION_MAX_BYTES (2.0 * 1073741824.0)

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

/* ------------------------------------------------------------------------- */
/* checkpoints (llmc/checkpoint.h): every rank calls these together           */

static void fail_if_error(int rc, int rank, const char *what, const char *err)
{
    if (rc != 0)
        FAIL("rank %d: %s: %s", rank, what, err);
}

/* The model elements whose optimizer state this rank keeps: one range per bucket,
 * in the order of its state buffers (the caller frees); *count: their total. */
static CkptRange *llama_state_ranges(const Llama *m, int64_t *count)
{
    const Zero *z = &m->zero;
    CkptRange *ranges = (CkptRange *)malloc_check(sizeof(CkptRange) * z->plan.n_buckets, "checkpoint ranges");
    *count = 0;
    for (int b = 0; b < z->plan.n_buckets; b++) {
        int64_t begin, end;
        zero_update_model_range(&z->plan, m->zero_stage, m->dist->rank, b, &begin, &end);
        ranges[b].offset = begin;
        ranges[b].count = end - begin;
        *count += end - begin;
    }
    return ranges;
}

/* Moves the AdamW moments between the state buffers (device, zero.state_total each,
 * padding included) and host arrays holding only the model elements of ranges
 * (llama_state_ranges, total elements), back to back: m, then v. */
static void llama_moments_transfer(Llama *m, const CkptRange *ranges, int64_t total, float *host, int to_device)
{
    const Zero *z = &m->zero;
    for (int which = 0; which < 2; which++) {
        float *device = which == 0 ? m->adam_m : m->adam_v;
        float *at = host + which * total;
        for (int b = 0; b < z->plan.n_buckets; b++) {
            size_t bytes = (size_t)ranges[b].count * sizeof(float);
            if (to_device)
                CUDA_CHECK(cudaMemcpy(device + z->state_at[b], at, bytes, cudaMemcpyHostToDevice));
            else
                CUDA_CHECK(cudaMemcpy(at, device + z->state_at[b], bytes, cudaMemcpyDeviceToHost));
            at += ranges[b].count;
        }
    }
}

/* Writes <dir>/step_<08d>/: rank 0 the fp32 master weights (safetensors) and the
 * config, each rank that keeps optimizer state its train_state file (one file for
 * all with ZeRO 0, one per rank otherwise, holding one range per bucket); rank 0
 * commits once all are written. state: step, AdamW step, RNG and data position. */
static void llama_save_checkpoint(Llama *m, const char *dir, int keep, CheckpointState state, cudaStream_t s)
{
    const Dist *d = m->dist;
    int64_t P = m->layout.total;
    char err[2048], staging[CKPT_PATH_MAX], saved[CKPT_PATH_MAX];
    float *master = llama_download_master(m, s);
    if (d->rank == 0)
        fail_if_error(checkpoint_stage_try(dir, state.step, staging, sizeof(staging), err, sizeof(err)), d->rank,
                      "saving a checkpoint", err);
    dist_sum_host(d, 0.0, s); /* the staging directory exists for everyone */
    checkpoint_staging_path(staging, sizeof(staging), dir, state.step);
    if (d->rank == 0) {
        fail_if_error(checkpoint_write_model_try(staging, &m->config, &m->layout, master, err, sizeof(err)), d->rank,
                      "saving a checkpoint", err);
        free(master);
    }
    if (m->zero_stage >= 1 || d->rank == 0) {
        int64_t count;
        CkptRange *ranges = llama_state_ranges(m, &count);
        state.rank = m->zero_stage >= 1 ? d->rank : 0;
        state.world = m->zero_stage >= 1 ? d->world : 1;
        float *adam = (float *)malloc_check((size_t)2 * (count > 0 ? count : 1) * sizeof(float), "checkpoint moments");
        llama_moments_transfer(m, ranges, count, adam, 0);
        fail_if_error(checkpoint_write_state_try(staging, &state, P, ranges, m->zero.plan.n_buckets, adam, adam + count,
                                                 err, sizeof(err)),
                      d->rank, "saving a checkpoint", err);
        free(adam);
        free(ranges);
    }
    dist_sum_host(d, 0.0, s); /* every file is written */
    if (d->rank == 0) {
        fail_if_error(checkpoint_commit_try(dir, state.step, keep, saved, sizeof(saved), err, sizeof(err)), d->rank,
                      "saving a checkpoint", err);
        printf("saved checkpoint '%s'\n", saved);
    }
    dist_sum_host(d, 0.0, s); /* nobody reads the directory before it is complete */
}

/* Loads checkpoint directory path into the model (weights, this rank's AdamW
 * moments and step); state receives the step, RNG and data position. Works for a
 * checkpoint of any world size and ZeRO stage: the moments are re-sharded. */
static void llama_load_checkpoint(Llama *m, const char *path, CheckpointState *state)
{
    char err[2048];
    int64_t P = m->layout.total;
    int rank = m->dist->rank;
    float *master = (float *)malloc_check((size_t)P * sizeof(float), "checkpoint weights");
    fail_if_error(checkpoint_load_model_try(path, &m->config, &m->layout, master, err, sizeof(err)), rank, "resuming",
                  err);
    llama_upload_params(m, master);
    free(master);
    int64_t count;
    CkptRange *ranges = llama_state_ranges(m, &count);
    float *adam = (float *)malloc_check((size_t)2 * (count > 0 ? count : 1) * sizeof(float), "checkpoint moments");
    fail_if_error(checkpoint_load_moments_try(path, P, ranges, m->zero.plan.n_buckets, adam, adam + count, state, err,
                                              sizeof(err)),
                  rank, "resuming", err);
    llama_moments_transfer(m, ranges, count, adam, 1);
    free(adam);
    free(ranges);
    if (state->adam_step > (uint64_t)INT_MAX || state->step > (uint64_t)INT_MAX)
        FAIL("rank %d: '%s': step %llu is out of range (corrupt?)", rank, path, (unsigned long long)state->step);
    m->adam_step = (int)state->adam_step;
}

static int count_targets(const int *targets, int64_t n)
{
    int count = 0;
    for (int64_t i = 0; i < n; i++)
        count += targets[i] != IGNORE_INDEX;
    return count;
}

#ifndef TESTING
/* ------------------------------------------------------------------------- */
/* the command line program                                                   */

typedef struct {
    const char *train_pattern, *val_pattern, *preset, *init_from, *log_path, *schedule, *rendezvous, *checkpoint_dir;
    int save_every, keep, resume;
    int B, T, steps, warmup, eval_every, eval_batches, recompute, random_data, seed, total_batch, profile_step;
    int zero_stage;
    LaunchFlags launch;
    float rendezvous_timeout, comm_timeout;
    float lr, min_lr_frac, decay_frac, logits_budget_mb;
    AdamWConfig opt;
    LlamaConfig shape; /* explicit overrides; 0 = from the preset */
    int untied;
} Args;

#define F(name, type, field, help) FLAG(name, type, Args, field, help)
static const Flag TRAIN_FLAGS[] = {
    FLAG_SECTION("data"),
    F("--train", FLAG_STRING, train_pattern, "train shards, a glob"),
    F("--val", FLAG_STRING, val_pattern, "val shards, a glob ('' = no evaluation)"),
    F("--random-data", FLAG_SWITCH, random_data, "random tokens instead of shards (benchmarks)"),
    FLAG_SECTION("model"),
    F("--preset", FLAG_STRING, preset, "llama3.2-1b, llama3.2-3b, llama3.1-8b, nano, tiny or small (default tiny)"),
    F("--init-from", FLAG_STRING, init_from, "start from a .llmt weights file (its shape, no preset needed)"),
    F("--vocab", FLAG_INT, shape.vocab_size, "vocabulary size (overrides the preset)"),
    F("--d-model", FLAG_INT, shape.d_model, "hidden size (overrides the preset)"),
    F("--n-layer", FLAG_INT, shape.n_layer, "decoder layers (overrides the preset)"),
    F("--n-head", FLAG_INT, shape.n_head, "query heads (overrides the preset)"),
    F("--n-kv-head", FLAG_INT, shape.n_kv_head, "key/value heads (overrides the preset)"),
    F("--head-dim", FLAG_INT, shape.head_dim, "head size (default d_model / n_head)"),
    F("--ffn-dim", FLAG_INT, shape.ffn_dim, "SwiGLU hidden size (overrides the preset)"),
    F("--untied", FLAG_SWITCH, untied, "untie lm_head from the embedding"),
    FLAG_SECTION("batch"),
    F("-B", FLAG_INT, B, "sequences per micro-batch and GPU"),
    F("-T", FLAG_INT, T, "sequence length"),
    F("--total-batch", FLAG_INT, total_batch,
      "tokens per optimizer step over all GPUs, a multiple of B*T*GPUs "
      "(default B*T*GPUs)"),
    FLAG_SECTION("optimizer"),
    F("--lr", FLAG_FLOAT, lr, "peak learning rate"),
    F("--schedule", FLAG_STRING, schedule, "cosine, linear, constant or wsd"),
    F("--warmup", FLAG_INT, warmup, "warmup steps"),
    F("--min-lr-frac", FLAG_FLOAT, min_lr_frac, "final lr as a fraction of --lr"),
    F("--decay-frac", FLAG_FLOAT, decay_frac, "wsd: fraction of the steps spent decaying"),
    F("--weight-decay", FLAG_FLOAT, opt.weight_decay, "AdamW weight decay, on matrices only"),
    F("--beta1", FLAG_FLOAT, opt.beta1, "AdamW beta1"),
    F("--beta2", FLAG_FLOAT, opt.beta2, "AdamW beta2"),
    F("--eps", FLAG_FLOAT, opt.eps, "AdamW epsilon"),
    F("--grad-clip", FLAG_FLOAT, opt.grad_clip, "max global gradient norm, 0 = off"),
    FLAG_SECTION("run"),
    F("--steps", FLAG_INT, steps, "optimizer steps"),
    F("--eval-every", FLAG_INT, eval_every, "evaluate on the val shards every N steps, 0 = never"),
    F("--eval-batches", FLAG_INT, eval_batches, "val batches per evaluation"),
    F("--recompute", FLAG_INT, recompute,
      "0: store every activation; 1: recompute norms and SwiGLU; 2: also the "
      "gate/up GEMM (least memory)"),
    F("--logits-budget-mb", FLAG_FLOAT, logits_budget_mb, "memory for one chunk of logits"),
    F("--profile-step", FLAG_INT, profile_step, "print where step N's GPU time goes, by kernel class"),
    F("--seed", FLAG_INT, seed, "init and data-order seed"),
    F("--log", FLAG_STRING, log_path, "JSON lines log ('' = none)"),
    FLAG_SECTION("checkpoints"),
    F("--checkpoint-dir", FLAG_STRING, checkpoint_dir,
      "save DIR/step_<08d>/: model.safetensors (fp32, HF names), "
      "config.json, optimizer state; at the end and"),
    F("--save-every", FLAG_INT, save_every, "every N steps (0 = only at the end)"),
    F("--keep", FLAG_INT, keep, "keep the newest K complete checkpoints (0 = all)"),
    F("--resume", FLAG_SWITCH, resume, "continue from the newest complete checkpoint (on any number of GPUs)"),
    FLAG_SECTION("several GPUs (one process per GPU: mpirun, a scheduler, or scripts/launch_multi_gpu.sh)"),
    F("--zero-stage", FLAG_INT, zero_stage,
      "0: all-reduce, every GPU keeps all optimizer state; 1: AdamW state "
      "sharded over the GPUs; 2: gradients too, reduce-scattered per layer during "
      "backward; 3: weights too, gathered per layer just ahead of use"),
    F("--rank", FLAG_INT, launch.rank,
      "this process's rank, when no launcher variable says it (mpirun, "
      "RANK/WORLD_SIZE, Slurm and PMI are read)"),
    F("--world-size", FLAG_INT, launch.world, "number of processes, with --rank"),
    F("--local-rank", FLAG_INT, launch.local_rank, "GPU on this host (default rank % GPUs)"),
    F("--rendezvous", FLAG_STRING, rendezvous,
      "without MPI: tcp://HOST:PORT of rank 0 or file:PATH on a shared "
      "file system (default tcp://$MASTER_ADDR:$MASTER_PORT)"),
    F("--rendezvous-timeout", FLAG_FLOAT, rendezvous_timeout, "seconds to wait for all ranks"),
    F("--comm-timeout", FLAG_FLOAT, comm_timeout,
      "seconds a rank waits without progress (a peer died) before it exits "
      "with an error, 0 = forever"),
};
#undef F
#define N_TRAIN_FLAGS ((int)(sizeof(TRAIN_FLAGS) / sizeof(TRAIN_FLAGS[0])))

static Args default_args(void)
{
    Args a;
    memset(&a, 0, sizeof(a));
    a.train_pattern = "data/shards/corpus_train_*.bin";
    a.val_pattern = "data/shards/corpus_val_*.bin";
    a.log_path = "log/train_llama.jsonl";
    a.schedule = "cosine";
    a.B = 4;
    a.T = 256;
    a.steps = 50;
    a.warmup = 10;
    a.eval_every = 25;
    a.eval_batches = 8;
    a.recompute = 1;
    a.seed = 1337;
    a.lr = 3e-4f;
    a.min_lr_frac = 0.1f;
    a.decay_frac = 0.2f;
    a.logits_budget_mb = 512.0f;
    a.profile_step = -1;
    a.opt.beta1 = 0.9f;
    a.opt.beta2 = 0.95f;
    a.opt.eps = 1e-8f;
    a.opt.weight_decay = 0.1f;
    a.opt.grad_clip = 1.0f;
    a.zero_stage = 1;
    a.keep = 3;
    a.launch.rank = a.launch.world = a.launch.local_rank = -1;
    a.rendezvous_timeout = 300.0f;
    a.comm_timeout = 600.0f;
    return a;
}

static void usage(void)
{
    Args defaults = default_args();
    printf("usage: ./train_llama [flags]\n"
           "Trains a Llama 3 family model on one GPU or several (bf16, fp32 master weights, AdamW).\n\n");
    flags_usage(stdout, TRAIN_FLAGS, N_TRAIN_FLAGS, &defaults);
    printf("  %-22s this text\n", "-h, --help");
    exit(0);
}

static void parse_args(Args *a, int argc, char **argv)
{
    *a = default_args();
    flags_parse(TRAIN_FLAGS, N_TRAIN_FLAGS, argc, argv, a, usage);
    a->opt.lr = a->lr;
    if (a->B <= 0 || a->T <= 0)
        FAIL("-B and -T must be positive (got %d, %d)", a->B, a->T);
    if (a->steps <= 0)
        FAIL("--steps must be positive (got %d)", a->steps);
    if (a->warmup < 0 || a->eval_every < 0 || a->eval_batches <= 0)
        FAIL("--warmup and --eval-every must be >= 0, --eval-batches > 0");
    if (a->recompute < 0 || a->recompute > 2)
        FAIL("--recompute takes 0, 1 or 2 (got %d)", a->recompute);
    if (a->zero_stage < 0 || a->zero_stage > 3)
        FAIL("--zero-stage takes 0, 1, 2 or 3 (got %d)", a->zero_stage);
    if (a->save_every < 0 || a->keep < 0)
        FAIL("--save-every and --keep must be >= 0");
    if ((a->resume || a->save_every > 0) && !a->checkpoint_dir)
        FAIL("--resume and --save-every need --checkpoint-dir DIR");
    if (!(a->rendezvous_timeout > 0))
        FAIL("--rendezvous-timeout must be positive");
    if (!(a->comm_timeout >= 0))
        FAIL("--comm-timeout must be >= 0 seconds (0 = wait forever; got %g)", a->comm_timeout);
    char err[2048];
    if (a->rendezvous && rendezvous_check_spec(a->rendezvous, err, sizeof(err)) != 0)
        FAIL("--rendezvous: %s", err);
    if (!(a->lr > 0) || a->min_lr_frac < 0 || a->min_lr_frac > 1)
        FAIL("--lr must be positive and --min-lr-frac in [0, 1]");
    if (!(a->decay_frac > 0 && a->decay_frac <= 1))
        FAIL("--decay-frac must be in (0, 1]");
    if (!(a->opt.beta1 >= 0 && a->opt.beta1 < 1 && a->opt.beta2 >= 0 && a->opt.beta2 < 1 && a->opt.eps > 0))
        FAIL("AdamW needs 0 <= beta1, beta2 < 1 and eps > 0");
    if (!(a->logits_budget_mb > 0))
        FAIL("--logits-budget-mb must be positive");
    if (a->init_from && (a->preset || a->shape.d_model || a->shape.n_layer || a->shape.vocab_size))
        FAIL("--init-from takes the model shape from the file; drop --preset and the shape flags");
}

static LlamaConfig config_from_args(const Args *a)
{
    LlamaConfig c;
    if (a->init_from) {
        TensorFile tf;
        tensorfile_open(&tf, a->init_from);
        c = llama_config_from_tensorfile(&tf);
        tensorfile_close(&tf);
        return c;
    }
    const char *preset = a->preset ? a->preset : "tiny";
    if (llama_preset(preset, &c) != 0) {
        fprintf(stderr, "error: unknown preset '%s'; known presets:", preset);
        for (int i = 0; i < LLAMA_N_PRESETS; i++)
            fprintf(stderr, " %s", LLAMA_PRESETS[i].name);
        fprintf(stderr, "\n");
        exit(1);
    }
    if (a->shape.vocab_size)
        c.vocab_size = a->shape.vocab_size;
    if (a->shape.d_model)
        c.d_model = a->shape.d_model;
    if (a->shape.n_layer)
        c.n_layer = a->shape.n_layer;
    if (a->shape.n_head)
        c.n_head = a->shape.n_head;
    if (a->shape.n_kv_head)
        c.n_kv_head = a->shape.n_kv_head;
    if (a->shape.ffn_dim)
        c.ffn_dim = a->shape.ffn_dim;
    c.head_dim = a->shape.head_dim ? a->shape.head_dim : c.d_model / c.n_head;
    if (a->untied)
        c.tie_embeddings = 0;
    char err[2048];
    if (llama_config_check(&c, err, sizeof(err)) != 0)
        FAIL("bad model shape: %s", err);
    return c;
}

/* Source of micro-batches: shards through the data loader, or random tokens. */
typedef struct {
    DataLoader loader;
    int random;
    uint64_t rng;
    int vocab, rank, world;
    int *inputs, *targets; /* the random batch */
} BatchSource;

/* This rank's N tokens of the next global batch. Random tokens are drawn for the
 * whole global batch on every rank, so any world size sees the same batches. */
static void batch_next(BatchSource *src, int64_t N, const int **inputs, const int **targets)
{
    if (!src->random) {
        dataloader_next_batch_or_die(&src->loader);
        *inputs = src->loader.inputs;
        *targets = src->loader.targets;
        return;
    }
    for (int pass = 0; pass < 2; pass++) {
        int *out = pass == 0 ? src->inputs : src->targets;
        for (int r = 0; r < src->world; r++) {
            for (int64_t i = 0; i < N; i++) {
                int token = (int)(splitmix64(&src->rng) % (uint64_t)src->vocab);
                if (r == src->rank)
                    out[i] = token;
            }
        }
    }
    *inputs = src->inputs;
    *targets = src->targets;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The profiled step's time per kernel class, to stdout and the log. */
static void print_profile(FILE *log, int step, double wall_ms)
{
    float ms[PROF_CLASSES];
    float busy = profile_end_step(ms);
    printf("profile of step %d: %.1f ms wall\n", step, wall_ms);
    for (int c = 0; c < PROF_CLASSES; c++) {
        printf("  %-28s %8.2f ms %5.1f%%\n", PROFILE_CLASS_NAMES[c], ms[c], 100.0 * ms[c] / wall_ms);
    }
    printf("  %-28s %8.2f ms %5.1f%%\n", "idle (gaps, host, sync)", wall_ms - busy, 100.0 * (wall_ms - busy) / wall_ms);
    if (!log)
        return;
    fprintf(log, "{\"step\": %d, \"profile_ms\": {", step);
    for (int c = 0; c < PROF_CLASSES; c++)
        fprintf(log, "\"%s\": %.4f, ", PROFILE_CLASS_NAMES[c], ms[c]);
    fprintf(log, "\"idle\": %.4f, \"wall\": %.4f}}\n", wall_ms - busy, wall_ms);
}

/* Mean val loss over all ranks' slices of `batches` global batches. */
static float evaluate(Llama *m, DataLoader *val, int batches, cudaStream_t s)
{
    dataloader_reset(val);
    int64_t N = llama_tokens(m);
    double loss_sum_total = 0.0;
    int64_t count = 0;
    float part;
    for (int b = 0; b < batches; b++) {
        dataloader_next_batch_or_die(val);
        llama_set_batch(m, val->inputs, val->targets, 0, s);
        llama_eval_micro(m, 0, s);
        CUDA_CHECK(cudaMemcpyAsync(&part, m->loss_parts, sizeof(float), cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        loss_sum_total += part;
        count += count_targets(val->targets, N);
    }
    loss_sum_total = dist_sum_host(m->dist, loss_sum_total, s);
    double total_count = dist_sum_host(m->dist, (double)count, s);
    return total_count > 0 ? (float)(loss_sum_total / total_count) : NAN;
}

int main(int argc, char **argv)
{
    Args a;
    parse_args(&a, argc, argv);
    /* flags, model and data are all checked before the GPU is touched */
    LlamaConfig config = config_from_args(&a);
    if (config.d_model % 8 != 0 || config.head_dim % 8 != 0 || config.ffn_dim % 8 != 0)
        FAIL("the GPU kernels need d_model, head_dim and ffn_dim to be multiples of 8 (got %d, %d, %d)", config.d_model,
             config.head_dim, config.ffn_dim);
    if (a.T > config.max_seq_len)
        FAIL("-T %d exceeds the model's max_seq_len %d\n  hint: lower -T", a.T, config.max_seq_len);
    LaunchInfo launch = dist_launch_info(&a.launch);
    int rank = launch.rank, world = launch.world;
    int64_t N = (int64_t)a.B * a.T, NW = N * world; /* tokens per micro-step: per GPU, all GPUs */
    int total_batch = a.total_batch ? a.total_batch : (int)NW;
    if (total_batch % NW != 0)
        FAIL("--total-batch %d is not a multiple of B*T*GPUs = %lld\n  hint: pick a multiple, e.g. %lld", total_batch,
             (long long)NW, (long long)NW * ((total_batch + NW - 1) / NW));
    int accum = (int)(total_batch / NW);
    ScheduleKind kind;
    if (schedule_kind_from_name(a.schedule, &kind) != 0)
        FAIL("unknown --schedule '%s' (cosine, linear, constant, wsd)", a.schedule);
    LrSchedule schedule = {kind, a.lr, a.min_lr_frac, a.warmup, a.steps, a.decay_frac};

    BatchSource src;
    memset(&src, 0, sizeof(src));
    src.random = a.random_data;
    src.vocab = config.vocab_size;
    src.rng = (uint64_t)a.seed;
    src.rank = rank;
    src.world = world;
    if (src.random) {
        src.inputs = (int *)malloc_check((size_t)N * sizeof(int), "random batch");
        src.targets = (int *)malloc_check((size_t)N * sizeof(int), "random batch");
    } else {
        dataloader_init_or_die(&src.loader, a.train_pattern, a.B, a.T, rank, world, 1, (uint64_t)a.seed,
                               config.vocab_size);
    }
    int have_val = !src.random && a.val_pattern[0] && a.eval_every > 0;
    DataLoader val;
    if (have_val)
        dataloader_init_eval_or_die(&val, a.val_pattern, a.B, a.T, rank, world, config.vocab_size);

    int device_count = 0;
    cudaError_t status = cudaGetDeviceCount(&device_count);
    if (status != cudaSuccess || device_count == 0) {
        fprintf(stderr,
                "error: no CUDA GPU found (%s)\n  hint: on a machine without a GPU, train with the CPU "
                "reference instead: ./train_llama_ref --help\n",
                cudaGetErrorString(status));
        return 1;
    }
    Dist dist;
    dist_init(&dist, &launch, a.rendezvous, a.rendezvous_timeout);
    /* with peers, a rank that stops hearing from them exits instead of waiting forever */
    Watchdog watchdog;
    watchdog_start(&watchdog, rank, world > 1 ? a.comm_timeout : 0.0, world > 1 ? dist_async_error : NULL, &dist,
                   "startup");
    /* rank 0 speaks for all; the others only report errors */
    int speaker = rank == 0;
    if (!speaker && !freopen("/dev/null", "w", stdout))
        FAIL("rank %d: cannot silence stdout", rank);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dist.local_rank));
    printf("device: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
    if (world > 1)
        printf("ranks: %d (from %s, %s), ZeRO stage %d\n", world, launch.source,
               dist.mpi ? "NCCL id by MPI" : "NCCL id by rendezvous", a.zero_stage);
    llama_config_print(&config, stdout);
    matmul_setup();
    attention_setup();
    /* cuDNN's deterministic backward keeps dP in a B*H*T*T bf16 workspace: take it
     * while that stays small, else the atomic dQ backward, whose sums can differ
     * between runs in the last bits */
    double det_workspace = 2.0 * a.B * config.n_head * (double)a.T * a.T;
    int deterministic = det_workspace <= DETERMINISTIC_ATTENTION_MAX_BYTES;
    attention_set_deterministic(deterministic);
    Llama model;
    llama_build(&model, &config, a.B, a.T, a.recompute, accum, (size_t)(a.logits_budget_mb * 1048576.0), &dist,
                a.zero_stage);
    /* a resume restores weights, AdamW state, step, data position and RNG, so the
     * run continues as if never stopped (the schedule follows the global step) */
    char resume_from[CKPT_PATH_MAX] = "";
    if (a.resume && checkpoint_find_latest(a.checkpoint_dir, resume_from, sizeof(resume_from)) != 0) {
        printf("resume: no complete checkpoint in '%s'; starting fresh\n", a.checkpoint_dir);
        resume_from[0] = '\0';
    }
    int start_step = 0;
    if (resume_from[0]) {
        CheckpointState st;
        llama_load_checkpoint(&model, resume_from, &st);
        start_step = (int)st.step;
        src.rng = st.rng_state;
        if (!src.random)
            dataloader_set_state_or_die(&src.loader, &st.data);
        printf("resumed from '%s' at step %d\n", resume_from, start_step);
    } else if (a.init_from) {
        llama_load_weights(&model, a.init_from);
    } else {
        llama_init_random(&model, (uint64_t)a.seed);
    }
    double flops_per_token = llama_flops_per_token(&config, a.T);
    printf("parameters: %.3f M; batch %d x %d x %d accum x %d GPUs = %d tokens/step; recompute %d; logits chunk %d "
           "rows\n",
           model.layout.total / 1e6, a.B, a.T, accum, world, total_batch, a.recompute, model.logits_chunk);
    printf("data: %s\n", src.random ? "random tokens" : a.train_pattern);
    printf("attention backward: %s\n", deterministic ? "deterministic"
                                                     : "atomic dQ (a deterministic one would need "
                                                       "a workspace over 2 GiB)");

    FILE *log = NULL;
    if (speaker && a.log_path[0]) {
        const char *slash = strrchr(a.log_path, '/');
        if (slash) {
            char dir[1024];
            snprintf(dir, sizeof(dir), "%.*s", (int)(slash - a.log_path), a.log_path);
            char cmd[1100];
            snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", dir);
            if (system(cmd) != 0)
                FAIL("cannot create the log folder '%s'", dir);
        }
        log = fopen_check(a.log_path, "w");
    }

    watchdog_progress(&watchdog, "model ready");
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    /* pinned, so the uploads are truly asynchronous */
    int *step_inputs, *step_targets;
    float *h_parts;
    CUDA_CHECK(cudaMallocHost(&step_inputs, (size_t)N * accum * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&step_targets, (size_t)N * accum * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&h_parts, (size_t)accum * sizeof(float)));
    double tokens_per_s_sum = 0.0;
    int timed_steps = 0;
    for (int step = start_step; step < a.steps; step++) {
        if (have_val && (step % a.eval_every == 0)) {
            float vl = evaluate(&model, &val, a.eval_batches, stream);
            watchdog_progress(&watchdog, "evaluation at step %d", step);
            printf("step %5d | val loss %.4f\n", step, vl);
            if (log)
                fprintf(log, "{\"step\": %d, \"val_loss\": %.6f}\n", step, vl);
        }
        /* all micro-batches first: the loss is averaged over the whole step's targets */
        for (int k = 0; k < accum; k++) {
            const int *in, *tg;
            batch_next(&src, N, &in, &tg);
            memcpy(step_inputs + (int64_t)k * N, in, (size_t)N * sizeof(int));
            memcpy(step_targets + (int64_t)k * N, tg, (size_t)N * sizeof(int));
        }
        /* the loss is the mean over every rank's targets */
        double count = dist_sum_host(&dist, (double)count_targets(step_targets, N * accum), stream);
        float inv_count = count > 0 ? (float)(1.0 / count) : 0.0f;
        float lr = schedule_lr(&schedule, step);
        int profiling = step + 1 == a.profile_step;
        if (profiling)
            profile_begin_step(stream);
        double wall0 = now_seconds();
        for (int k = 0; k < accum; k++) {
            llama_set_batch(&model, step_inputs + (int64_t)k * N, step_targets + (int64_t)k * N, k, stream);
            llama_micro_step(&model, inv_count, k, stream);
        }
        llama_update(&model, &a.opt, lr, stream);
        float norm_sq;
        CUDA_CHECK(
            cudaMemcpyAsync(h_parts, model.loss_parts, (size_t)accum * sizeof(float), cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaMemcpyAsync(&norm_sq, model.grad_norm_sq, sizeof(float), cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        double wall = now_seconds() - wall0;
        double loss = 0.0;
        for (int k = 0; k < accum; k++)
            loss += h_parts[k];
        loss = dist_sum_host(&dist, loss, stream) * inv_count;
        double tokens_per_s = total_batch / wall; /* all GPUs */
        double mfu = tokens_per_s / world * flops_per_token / PEAK_BF16_FLOPS;
        size_t free_b, total_b;
        CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        /* the attention workspace is allocated in its own translation unit, with its own count */
        double peak_gib = (cuda_bytes_allocated_peak + attention_workspace_bytes()) / 1073741824.0;
        double used_gib = (total_b - free_b) / 1073741824.0;
        if (step > 0) {
            tokens_per_s_sum += tokens_per_s;
            timed_steps++;
        }
        printf("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s | MFU %.1f%% | mem %.2f GiB "
               "(device %.2f)\n",
               step + 1, a.steps, loss, lr, sqrt(norm_sq), wall * 1e3, tokens_per_s, 100 * mfu, peak_gib, used_gib);
        if (world > 1)
            printf("           %d GPUs: %.0f tok/s per GPU\n", world, tokens_per_s / world);
        if (profiling)
            print_profile(log, step + 1, wall * 1e3);
        if (!isfinite(loss))
            FAIL("loss is %f at step %d\n  hint: lower --lr or check the data", loss, step + 1);
        watchdog_progress(&watchdog, "step %d", step + 1);
        if (log) {
            fprintf(log,
                    "{\"step\": %d, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, \"ms\": %.3f, "
                    "\"tokens_per_s\": %.1f, \"tokens_per_s_per_gpu\": %.1f, \"gpus\": %d, \"zero_stage\": %d, "
                    "\"mfu\": %.5f, \"peak_mem_gib\": %.4f, \"device_mem_gib\": %.4f}\n",
                    step + 1, loss, lr, sqrt(norm_sq), wall * 1e3, tokens_per_s, tokens_per_s / world, world,
                    a.zero_stage, mfu, peak_gib, used_gib);
            fflush(log);
        }
        if (a.checkpoint_dir && checkpoint_due(step + 1, a.save_every, a.steps)) {
            CheckpointState st = checkpoint_state((uint64_t)(step + 1), (uint64_t)model.adam_step, src.rng);
            if (!src.random)
                dataloader_get_state(&src.loader, &st.data);
            llama_save_checkpoint(&model, a.checkpoint_dir, a.keep, st, stream);
            watchdog_progress(&watchdog, "checkpoint of step %d", step + 1);
        }
    }
    if (have_val) {
        float vl = evaluate(&model, &val, a.eval_batches, stream);
        printf("final val loss %.4f\n", vl);
        if (log)
            fprintf(log, "{\"step\": %d, \"val_loss\": %.6f}\n", a.steps, vl);
    }
    if (timed_steps)
        printf("mean after the first step: %.0f tok/s (%.0f per GPU), MFU %.1f%%\n", tokens_per_s_sum / timed_steps,
               tokens_per_s_sum / timed_steps / world,
               100.0 * tokens_per_s_sum / timed_steps / world * flops_per_token / PEAK_BF16_FLOPS);
    if (log)
        fclose(log);
    attention_teardown();
    matmul_teardown();
    watchdog_stop(&watchdog);
    dist_finalize(&dist);
    return 0;
}
#endif /* TESTING */
