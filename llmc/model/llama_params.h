/*
 * llama_params.h: where the model's parameters live on the GPU, and a name
 * for each of them.
 *
 * The bf16 weights and gradients are the flat buffers of ZeRO (llmc/parallel/zero.h):
 * the tensors of llama_param_layout() cut into per-bucket padded ranges (the
 * embedding, each decoder layer, the final norm with an untied lm_head), whole
 * on every rank or this rank's shares, depending on the stage. The fp32 master
 * weight of each parameter is its bf16 weight plus a 16-bit residual
 * (llmc/kernels/master_weights.h); master_lo holds the residuals of the ranges this
 * rank updates, in the order of its optimizer state (zero.state_at). With
 * --offload optimizer (llmc/model/optimizer_offload.h) the master weights of
 * those ranges live whole in host memory instead (host_master, fp32), and
 * master_lo is not allocated.
 *
 * The views (ModelTensors: embedding, layers[l].qkv, ..., lm_head) are
 * resolved once when built: they point where the kernels read each weight and
 * write its gradient, which where zero.h stages a bucket (ZeRO 3's weights,
 * stage 2 and 3 gradients not accumulated locally) is a staging buffer that the
 * bucket's turn in the step fills (a bucket always uses the same one), so the
 * layer code never computes an offset.
 *
 * Memory: weights and gradients 2 bytes each per padded parameter (or per
 * share), residuals 2 bytes per updated parameter (offloaded: 4 bytes of host
 * memory instead); the views are host arrays.
 */
#ifndef LLMC_LLAMA_PARAMS_H
#define LLMC_LLAMA_PARAMS_H

#include <stdint.h>
#include <string.h>

#include "llmc/common/cuda_common.h"
#include "llmc/parallel/distributed.h"
#include "llmc/model/llama_config.h"
#include "llmc/kernels/master_weights.h"
#include "llmc/common/utils.h"
#include "llmc/parallel/zero.h"
#include "llmc/model/param_layout.h"
#include "llmc/model/optimizer_offload.h"

/* One decoder layer's weights (or their gradients). */
typedef struct {
    bf16 *attn_norm; /* [C] input_layernorm */
    bf16 *qkv;       /* [(H + 2 KV) D, C]: q_proj, k_proj and v_proj stacked, one GEMM */
    bf16 *qkv_bias;  /* [(H + 2 KV) D]: their biases stacked (Qwen2), or NULL: none */
    bf16 *qk_norm;   /* [2 D]: q_norm's weight then k_norm's (Qwen3), or NULL: none */
    bf16 *o;         /* [C, H D] o_proj */
    bf16 *mlp_norm;  /* [C] post_attention_layernorm */
    bf16 *gate_up;   /* [2 F, C]: gate_proj and up_proj stacked, one GEMM */
    bf16 *down;      /* [C, F] down_proj */
} LayerTensors;

typedef struct {
    bf16 *embedding;      /* [V, C] */
    LayerTensors *layers; /* [L] */
    bf16 *final_norm;     /* [C] */
    bf16 *lm_head;        /* [V, C]; the embedding itself when tied */
} ModelTensors;

typedef struct {
    const Dist *dist;
    int zero_stage;
    Zero zero;                   /* the flat buffers zero.params and zero.grads, and their collectives */
    int16_t *master_lo;          /* [zero.state_total] the fp32 master weights' residuals, or NULL: */
    float *host_master;          /* offloaded: [zero.state_total] the fp32 master weights, host memory */
    int64_t *tensor_at;          /* [n_tensors] each tensor's first element in the padded buffers */
    ModelTensors weights, grads; /* where the kernels read each weight and write its gradient */
} LlamaParams;

/* The views of one flat buffer (weights or gradients): tensor i of the layout
 * is at bucket_base(b) + its offset inside bucket b. */
static inline void params_resolve_views_(ModelTensors *v, const ParamLayout *layout, bf16 *const *bucket_base,
                                         const int *bucket, const int64_t *in_bucket)
{
#define PARAM_AT(i) (bucket_base[bucket[i]] + in_bucket[i])
    v->embedding = PARAM_AT(0);
    for (int l = 0; l < layout->n_layer; l++) {
        LayerTensors *t = &v->layers[l];
        t->attn_norm = PARAM_AT(param_index_layer(layout, l, LAYER_ATTN_NORM));
        t->qkv = PARAM_AT(param_index_layer(layout, l, LAYER_Q)); /* k_proj and v_proj follow q_proj */
        /* the stacked biases of q, k and v (Qwen2), the stacked norm weights of q and k (Qwen3), or NULL */
        t->qkv_bias =
            param_layer_has(layout, LAYER_Q_BIAS) ? PARAM_AT(param_index_layer(layout, l, LAYER_Q_BIAS)) : NULL;
        t->qk_norm =
            param_layer_has(layout, LAYER_Q_NORM) ? PARAM_AT(param_index_layer(layout, l, LAYER_Q_NORM)) : NULL;
        t->o = PARAM_AT(param_index_layer(layout, l, LAYER_O));
        t->mlp_norm = PARAM_AT(param_index_layer(layout, l, LAYER_MLP_NORM));
        t->gate_up = PARAM_AT(param_index_layer(layout, l, LAYER_GATE)); /* up_proj follows gate_proj */
        t->down = PARAM_AT(param_index_layer(layout, l, LAYER_DOWN));
    }
    v->final_norm = PARAM_AT(param_index_final_norm(layout));
    v->lm_head = PARAM_AT(param_index_lm_head(layout));
#undef PARAM_AT
}

/* Device memory kept free past the model's own buffers when choosing what the
 * memory allows (local gradient accumulation, kept FP8 weight codes): cuBLAS's,
 * cuDNN's and NCCL's workspaces and buffers, which come later. */
#define PARAMS_MEMORY_RESERVE ((size_t)2 << 30)

static inline double gib(size_t bytes)
{
    return bytes / 1073741824.0;
}

/* Whether the gradients go into a full-size buffer (zero.h), given what the options
 * ask and, for ZERO_ACCUM_AUTO, whether the device has room for it: besides the
 * buffers of z, the residuals and AdamW moments (10 bytes per updated parameter,
 * none offloaded) and later_bytes (what the caller allocates after the parameters). */
static inline int params_full_grads(const Zero *z, int offload, size_t later_bytes)
{
    if (z->stage <= 1)
        return 1;
    if (!zero_local_accumulation_possible(z))
        return 0;
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    size_t need = zero_device_bytes(z, 1) +
                  (offload ? 0 : (size_t)z->state_total * (sizeof(int16_t) + 2 * sizeof(float))) + later_bytes +
                  PARAMS_MEMORY_RESERVE;
    if (need <= free_b)
        return 1;
    if (z->opt.accum == ZERO_ACCUM_LOCAL)
        FAIL("--grad-accum local: the full-size gradient buffer (%.2f GiB) and the rest of the model need %.2f GiB, "
             "and %.2f GiB are free\n  hint: --grad-accum sharded reduce-scatters every micro-step instead (%.2f GiB "
             "less), or lower -B / -T",
             gib((size_t)z->plan.padded_total * sizeof(bf16)), gib(need), gib(free_b),
             gib(zero_device_bytes(z, 1) - zero_device_bytes(z, 0)));
    printf("gradients: reduce-scattered every micro-step (accumulating %d micro-steps locally needs %.2f GiB, %.2f "
           "GiB are free)\n",
           z->opt.micro_steps, gib(need), gib(free_b));
    return 0;
}

/* Plans the ZeRO buckets for the ranks of dist under zopt, allocates the weights,
 * gradients and residuals (zeros: the padding must stay zero, and no kernel writes
 * it) or, offloaded (OffloadMode), the host's master weights after checking the
 * host has memory for them and the moments, and resolves the views. later_bytes:
 * what the caller allocates after these (for params_full_grads). */
static inline void params_build(LlamaParams *p, const LlamaConfig *c, const ParamLayout *layout, const Dist *dist,
                                const ZeroOptions *zopt, int offload, size_t later_bytes)
{
    memset(p, 0, sizeof(*p));
    p->dist = dist;
    p->zero_stage = zopt->stage;
    Zero *z = &p->zero;
    zero_configure(z, dist, layout, zopt);
    if (offload)
        offload_check_host_memory(z, dist->machine_ranks);
    zero_allocate(z, params_full_grads(z, offload, later_bytes));
    int64_t n_state = z->state_total;
    if (offload) {
        p->host_master = (float *)calloc((size_t)(n_state ? n_state : 1), sizeof(float));
        if (!p->host_master)
            FAIL("--offload optimizer: could not allocate the master weights on the host (%.2f GiB)",
                 gib((size_t)n_state * sizeof(float)));
    } else {
        p->master_lo =
            (int16_t *)cuda_malloc_named((size_t)n_state * sizeof(int16_t), "fp32 master weights' low halves");
        CUDA_CHECK(cudaMemset(p->master_lo, 0, (size_t)n_state * sizeof(int16_t)));
    }

    /* a tensor's place: its bucket, and its offset there as in the unpadded layout */
    int n = layout->n_tensors, n_buckets = z->plan.n_buckets;
    int *bucket = (int *)malloc_check(sizeof(int) * n, "tensor places");
    int64_t *in_bucket = (int64_t *)malloc_check(sizeof(int64_t) * n, "tensor places");
    p->tensor_at = (int64_t *)malloc_check(sizeof(int64_t) * n, "tensor places");
    for (int i = 0; i < n; i++) {
        const ParamTensor *t = &layout->tensors[i];
        int b = t->bucket;
        bucket[i] = b;
        in_bucket[i] = t->offset - z->plan.buckets[b].offset;
        p->tensor_at[i] = z->plan.buckets[b].padded_offset + in_bucket[i];
    }
    bf16 **weights_base = (bf16 **)malloc_check(sizeof(bf16 *) * n_buckets, "tensor places");
    bf16 **grads_base = (bf16 **)malloc_check(sizeof(bf16 *) * n_buckets, "tensor places");
    for (int b = 0; b < n_buckets; b++) {
        weights_base[b] = zero_bucket_weights(z, b);
        grads_base[b] = zero_bucket_grads(z, b);
    }
    p->weights.layers = (LayerTensors *)malloc_check(sizeof(LayerTensors) * c->n_layer, "layer views");
    p->grads.layers = (LayerTensors *)malloc_check(sizeof(LayerTensors) * c->n_layer, "layer views");
    params_resolve_views_(&p->weights, layout, weights_base, bucket, in_bucket);
    params_resolve_views_(&p->grads, layout, grads_base, bucket, in_bucket);
    free(weights_base);
    free(grads_base);
    free(bucket);
    free(in_bucket);
}

static inline void params_free(LlamaParams *p)
{
    cuda_free(p->master_lo);
    free(p->host_master);
    zero_free(&p->zero);
    free(p->tensor_at);
    free(p->weights.layers);
    free(p->grads.layers);
    memset(p, 0, sizeof(*p));
}

/* Copies the fp32 master weights (host, the layout's total) to the device, split
 * into bf16 weights and residuals; this rank keeps what its stage asks of it. A
 * bucket at a time: the host stages 4 bytes per parameter of the largest bucket,
 * not of the model (the 8B's 32 GB of staging became 2 GB). */
static inline void params_upload_master(LlamaParams *p, const float *host_master)
{
    Zero *z = &p->zero;
    int64_t most = zero_plan_largest_bucket(&z->plan);
    uint16_t *hi = (uint16_t *)malloc_check((size_t)most * sizeof(uint16_t), "bf16 parameter staging");
    int16_t *lo = (int16_t *)malloc_check((size_t)most * sizeof(int16_t), "master residual staging");
    for (int b = 0; b < z->plan.n_buckets; b++) {
        const ZeroBucket *bk = &z->plan.buckets[b];
        const float *bucket = host_master + bk->offset;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < bk->numel; i++)
            master_split(bucket[i], &hi[i], &lo[i]);
        int64_t begin, end;       /* model elements, within the bucket's */
        if (p->zero_stage >= 3) { /* the rank's group share of the weights */
            zero_group_model_range(&z->plan, b, z->position, &begin, &end);
            CUDA_CHECK(cudaMemcpy(z->params + z->group_at[b], hi + (begin - bk->offset),
                                  (size_t)(end - begin) * sizeof(uint16_t), cudaMemcpyHostToDevice));
        } else {
            CUDA_CHECK(cudaMemcpy(zero_bucket_weights(z, b), hi, (size_t)bk->numel * sizeof(uint16_t),
                                  cudaMemcpyHostToDevice));
        }
        zero_update_model_range(&z->plan, p->zero_stage, p->dist->rank, b, &begin, &end);
        if (p->host_master)
            memcpy(p->host_master + z->state_at[b], host_master + begin, (size_t)(end - begin) * sizeof(float));
        else
            CUDA_CHECK(cudaMemcpy(p->master_lo + z->state_at[b], lo + (begin - bk->offset),
                                  (size_t)(end - begin) * sizeof(int16_t), cudaMemcpyHostToDevice));
    }
    zero_shares_written(z); /* what stage 3's slots hold, and its FP8 codes' scales, are of the old weights */
    free(hi);
    free(lo);
}

/* The fp32 master weights joined from the ranks' bf16 weights and residuals (or,
 * offloaded, copied from the host's): [layout->total] floats on rank 0, which
 * frees them; NULL on the others. Every rank calls it, between steps. */
static inline float *params_download_master(LlamaParams *p, const ParamLayout *layout, cudaStream_t s)
{
    int64_t P = layout->total;
    Zero *z = &p->zero;
    if (p->host_master && p->dist->world == 1) { /* this rank updates every range */
        float *master = (float *)malloc_check((size_t)P * sizeof(float), "master weights");
        for (int b = 0; b < z->plan.n_buckets; b++) {
            int64_t begin, end;
            zero_update_model_range(&z->plan, p->zero_stage, p->dist->rank, b, &begin, &end);
            memcpy(master + begin, p->host_master + z->state_at[b], (size_t)(end - begin) * sizeof(float));
        }
        return master;
    }
    int keep = p->dist->rank == 0;
    int64_t most = zero_plan_largest_bucket(&z->plan); /* staging for a bucket at a time, as params_upload_master */
    float *master = keep ? (float *)malloc_check((size_t)P * sizeof(float), "master weights") : NULL;
    uint16_t *hi = keep ? (uint16_t *)malloc_check((size_t)most * sizeof(uint16_t), "bf16 parameter staging") : NULL;
    int16_t *lo = keep ? (int16_t *)malloc_check((size_t)most * sizeof(int16_t), "master residual staging") : NULL;
    /* offloaded: each bucket's residuals split from the host's master weights into a device slot, then gathered */
    int64_t slot = p->host_master ? offload_slot_elements(z) : 0;
    int16_t *share_host =
        slot ? (int16_t *)malloc_check((size_t)slot * sizeof(int16_t), "master residual share") : NULL;
    int16_t *share =
        slot ? (int16_t *)cuda_malloc_named((size_t)slot * sizeof(int16_t), "master residual share") : NULL;
    for (int b = 0; b < z->plan.n_buckets; b++) {
        const ZeroBucket *bk = &z->plan.buckets[b];
        const bf16 *weights;
        const int16_t *residuals;
        if (p->host_master) {
            uint16_t unused;
            for (int64_t i = 0; i < z->update_count[b]; i++)
                master_split(p->host_master[z->state_at[b] + i], &unused, &share_host[i]);
            CUDA_CHECK(
                cudaMemcpy(share, share_host, (size_t)z->update_count[b] * sizeof(int16_t), cudaMemcpyHostToDevice));
        }
        zero_full_bucket(z, b, p->host_master ? share : p->master_lo + z->state_at[b], &weights, &residuals, s);
        if (!keep)
            continue;
        CUDA_CHECK(cudaMemcpy(hi, weights, (size_t)bk->numel * sizeof(uint16_t), cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(lo, residuals, (size_t)bk->numel * sizeof(int16_t), cudaMemcpyDeviceToHost));
        float *bucket = master + bk->offset;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < bk->numel; i++)
            bucket[i] = master_join(hi[i], lo[i]);
    }
    free(share_host);
    cuda_free(share);
    free(hi);
    free(lo);
    return master;
}

#endif /* LLMC_LLAMA_PARAMS_H */
