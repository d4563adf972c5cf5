/*
 * zero.h: the communication of ZeRO data parallelism, bucket by bucket
 * (llmc/zero_plan.h: the embedding, each decoder layer, then the final norm with
 * an untied lm_head), and where each bucket's weights and gradients live.
 *
 *   stage 0: all-reduce of the whole bf16 gradient after the backward pass.
 *   stage 1: one in-place reduce-scatter per bucket after the backward pass (all
 *            in one grouped launch), leaving each rank the sum of its shares;
 *            after AdamW, one in-place all-gather per bucket of the new weights.
 *   stage 2: the backward pass writes each bucket's gradient into a staging
 *            buffer. When the bucket is complete (an event on the compute
 *            stream) the communication stream reduce-scatters it into the
 *            rank's gradient shard: micro-step 0 writes it, later micro-steps
 *            land in a scratch share and are added (fp32 add, one bf16
 *            rounding). Whoever writes that staging buffer next waits for the
 *            reduce-scatter (an event on the communication stream).
 *   stage 3: the bf16 weights are kept as the rank's shares too. A bucket is
 *            all-gathered into a staging buffer before its first use, the next
 *            layer's gather in flight while the current layer computes, and its
 *            buffer is reused only after the compute stream is done with it.
 *
 * Staging buffers (stages 2 and 3): the first and last buckets have their own
 * and keep them for the whole step: the tied embedding is both the first
 * weight read (embedding) and the last (the classifier), and its gradient is
 * written first (classifier) and completed last (embedding backward). The layer
 * buckets, all the same size, alternate between two, so layer l's collective
 * overlaps layer l -/+ 1's compute. A weight slot remembers which bucket it
 * holds, so the layers gathered at the end of the forward pass serve the start
 * of the backward pass without a second gather, until the weights change.
 *
 * One stream carries every collective of the step, so each rank issues them in
 * the same order, as NCCL requires; events, not device-wide syncs, order it
 * against the compute stream.
 *
 * Memory beyond the rank's shares: stage 2: 2 bytes x (first + last + 2 layer
 * buckets) of gradient staging, plus the largest share as scratch with
 * gradient accumulation; stage 3: as much again for the weights.
 */
#ifndef LLMC_ZERO_H
#define LLMC_ZERO_H

#include "cuda_common.h"
#include "distributed.h"
#include "zero_plan.h"

/* staging slots: the first bucket, the last bucket, two for the layers */
#define ZERO_SLOTS 4
#define ZERO_ADD_THREADS 256
#define ZERO_ADD_MAX_BLOCKS 4096

typedef struct {
    const Dist *dist;
    ZeroPlan plan;
    int stage;
    int64_t *update_at;    /* [n_buckets] first padded element this rank updates (zero_update_range) */
    int64_t *update_count; /* [n_buckets] */
    int64_t *state_at;     /* [n_buckets] where that range starts in the rank's state buffers */
    int64_t state_total;   /* size of the rank's state buffers */
    /* the flat buffers: weights [padded_total], or [state_total] shares with stage 3;
     * gradients [padded_total], or [state_total] shares with stages 2 and 3 */
    bf16 *params, *grads;
    cudaStream_t comm;
    bf16 *grad_staging[ZERO_SLOTS], *weight_staging[ZERO_SLOTS];
    bf16 *sum_scratch; /* stage 2+, with accumulation: a later micro-step's reduced share, before it is added */
    cudaEvent_t grad_written[ZERO_SLOTS], grad_sent[ZERO_SLOTS];
    cudaEvent_t weight_gathered[ZERO_SLOTS], weight_used[ZERO_SLOTS];
    cudaEvent_t comm_done, params_changed;
    int weight_holds[ZERO_SLOTS]; /* bucket gathered into each weight slot, -1: none */
} Zero;

/* acc[i] += x[i], summed in fp32 and rounded once; n a multiple of 8, both 16-byte aligned. */
__global__ void zero_add_kernel(bf16 *__restrict__ acc, const bf16 *__restrict__ x, int64_t n8)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        bf16x8 a = load16(acc + i * 8), b = load16(x + i * 8);
#pragma unroll
        for (int k = 0; k < 8; k++)
            a.v[k] = __float2bfloat16(__bfloat162float(a.v[k]) + __bfloat162float(b.v[k]));
        store16(acc + i * 8, a);
    }
}

static inline int zero_slot(const Zero *z, int b)
{
    return b == 0 ? 0 : b == z->plan.n_buckets - 1 ? 1 : 2 + (b - 1) % 2;
}

/* The padded size of the buckets a slot serves. */
static inline int64_t zero_slot_elements(const Zero *z, int slot)
{
    int b = slot == 0 ? 0 : slot == 1 ? z->plan.n_buckets - 1 : 1;
    return z->plan.buckets[b].padded;
}

/* Plans the buckets and allocates the staging the stage needs for steps of up
 * to max_micro_steps micro-steps (the scratch share only serves the second and
 * later). The caller then allocates z->params and z->grads, sized by
 * zero_params_elements and zero_grads_elements, zeroed (the padding must stay
 * zero). */
static inline void zero_init(Zero *z, const Dist *dist, const LlamaConfig *c, const ParamLayout *layout, int stage,
                             int max_micro_steps)
{
    memset(z, 0, sizeof(*z));
    if (stage < 0 || stage > 3)
        FAIL("ZeRO stage %d: stages are 0, 1, 2 and 3", stage);
    z->dist = dist;
    z->stage = stage;
    z->plan = zero_plan(c, layout, dist->world);
    int n = z->plan.n_buckets;
    z->update_at = (int64_t *)malloc_check(sizeof(int64_t) * n, "ZeRO ranges");
    z->update_count = (int64_t *)malloc_check(sizeof(int64_t) * n, "ZeRO ranges");
    z->state_at = (int64_t *)malloc_check(sizeof(int64_t) * n, "ZeRO ranges");
    for (int b = 0; b < n; b++)
        z->update_count[b] = zero_update_range(&z->plan, stage, dist->rank, b, &z->update_at[b]);
    z->state_total = zero_state_offsets(&z->plan, stage, dist->rank, z->state_at);
    for (int s = 0; s < ZERO_SLOTS; s++)
        z->weight_holds[s] = -1;
    if (stage < 2)
        return;
    CUDA_CHECK(cudaStreamCreateWithFlags(&z->comm, cudaStreamNonBlocking));
    int64_t largest_share = 0;
    for (int b = 0; b < n; b++)
        largest_share = z->plan.buckets[b].shard > largest_share ? z->plan.buckets[b].shard : largest_share;
    if (max_micro_steps > 1)
        z->sum_scratch = (bf16 *)cuda_malloc_named((size_t)largest_share * sizeof(bf16), "ZeRO gradient scratch");
    for (int s = 0; s < ZERO_SLOTS; s++) {
        size_t bytes = (size_t)zero_slot_elements(z, s) * sizeof(bf16);
        /* zeros: the padding past a bucket's tensors is never written and must stay zero */
        z->grad_staging[s] = (bf16 *)cuda_malloc_named(bytes, "ZeRO gradient staging");
        CUDA_CHECK(cudaMemset(z->grad_staging[s], 0, bytes));
        CUDA_CHECK(cudaEventCreateWithFlags(&z->grad_written[s], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&z->grad_sent[s], cudaEventDisableTiming));
        if (stage >= 3) {
            z->weight_staging[s] = (bf16 *)cuda_malloc_named(bytes, "ZeRO weight staging");
            CUDA_CHECK(cudaEventCreateWithFlags(&z->weight_gathered[s], cudaEventDisableTiming));
            CUDA_CHECK(cudaEventCreateWithFlags(&z->weight_used[s], cudaEventDisableTiming));
        }
    }
    CUDA_CHECK(cudaEventCreateWithFlags(&z->comm_done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&z->params_changed, cudaEventDisableTiming));
}

/* Gives back what zero_init took (not z->params and z->grads, which the caller owns). */
static inline void zero_free(Zero *z)
{
    if (z->stage >= 2) {
        for (int s = 0; s < ZERO_SLOTS; s++) {
            cuda_free(z->grad_staging[s]);
            CUDA_CHECK(cudaEventDestroy(z->grad_written[s]));
            CUDA_CHECK(cudaEventDestroy(z->grad_sent[s]));
            if (z->stage >= 3) {
                cuda_free(z->weight_staging[s]);
                CUDA_CHECK(cudaEventDestroy(z->weight_gathered[s]));
                CUDA_CHECK(cudaEventDestroy(z->weight_used[s]));
            }
        }
        cuda_free(z->sum_scratch);
        CUDA_CHECK(cudaEventDestroy(z->comm_done));
        CUDA_CHECK(cudaEventDestroy(z->params_changed));
        CUDA_CHECK(cudaStreamDestroy(z->comm));
    }
    free(z->update_at);
    free(z->update_count);
    free(z->state_at);
    zero_plan_free(&z->plan);
    memset(z, 0, sizeof(*z));
}

/* Sizes of the flat weight and gradient buffers the caller allocates. */
static inline int64_t zero_params_elements(const Zero *z)
{
    return z->stage >= 3 ? z->state_total : z->plan.padded_total;
}
static inline int64_t zero_grads_elements(const Zero *z)
{
    return z->stage >= 2 ? z->state_total : z->plan.padded_total;
}

/* The full weights and gradients of bucket b, where the kernels read and write them. */
static inline bf16 *zero_bucket_weights(const Zero *z, int b)
{
    return z->stage >= 3 ? z->weight_staging[zero_slot(z, b)] : z->params + z->plan.buckets[b].padded_offset;
}
static inline bf16 *zero_bucket_grads(const Zero *z, int b)
{
    return z->stage >= 2 ? z->grad_staging[zero_slot(z, b)] : z->grads + z->plan.buckets[b].padded_offset;
}

/* The part of bucket b that this rank updates, in the flat buffers. */
static inline bf16 *zero_update_weights(const Zero *z, int b)
{
    return z->params + (z->stage >= 3 ? z->state_at[b] : z->update_at[b]);
}
static inline bf16 *zero_update_grads(const Zero *z, int b)
{
    return z->grads + (z->stage >= 2 ? z->state_at[b] : z->update_at[b]);
}

/* Stage 2+: before the compute stream writes bucket b's gradient, the previous
 * reduce-scatter out of the same staging buffer must be done. */
static inline void zero_grads_begin(Zero *z, int b, cudaStream_t compute)
{
    if (z->stage >= 2)
        CUDA_CHECK(cudaStreamWaitEvent(compute, z->grad_sent[zero_slot(z, b)], 0));
}

/* Stage 2+: bucket b's gradient of this micro-step is complete on the compute
 * stream: reduce-scatter it into the rank's share (micro-step 0 writes, later
 * ones add), overlapped with what the compute stream does next. */
static inline void zero_grads_done(Zero *z, int b, int micro, cudaStream_t compute)
{
    if (z->stage < 2)
        return;
    int slot = zero_slot(z, b);
    const ZeroBucket *bk = &z->plan.buckets[b];
    bf16 *share = z->grads + z->state_at[b];
    if (micro > 0 && !z->sum_scratch)
        FAIL("zero_grads_done: micro-step %d, but zero_init was told of one micro-step per step", micro);
    CUDA_CHECK(cudaEventRecord(z->grad_written[slot], compute));
    CUDA_CHECK(cudaStreamWaitEvent(z->comm, z->grad_written[slot], 0));
    dist_reduce_scatter_sum(z->dist, z->grad_staging[slot], micro == 0 ? share : z->sum_scratch, bk->shard, 2, z->comm);
    if (micro > 0) {
        int64_t n8 = bk->shard / 8;
        int blocks = ceil_div(n8, ZERO_ADD_THREADS);
        blocks = blocks < ZERO_ADD_MAX_BLOCKS ? blocks : ZERO_ADD_MAX_BLOCKS;
        zero_add_kernel<<<blocks, ZERO_ADD_THREADS, 0, z->comm>>>(share, z->sum_scratch, n8);
        CUDA_CHECK_LAST();
    }
    CUDA_CHECK(cudaEventRecord(z->grad_sent[slot], z->comm));
}

/* Stage 3: starts gathering bucket b's weights (unless its slot holds them already),
 * once the compute stream is done with the slot's previous bucket. */
static inline void zero_weights_fetch(Zero *z, int b)
{
    int slot = zero_slot(z, b);
    if (z->stage < 3 || z->weight_holds[slot] == b)
        return;
    const ZeroBucket *bk = &z->plan.buckets[b];
    CUDA_CHECK(cudaStreamWaitEvent(z->comm, z->weight_used[slot], 0));
    dist_all_gather(z->dist, z->params + z->state_at[b], z->weight_staging[slot], bk->shard, 2, z->comm);
    CUDA_CHECK(cudaEventRecord(z->weight_gathered[slot], z->comm));
    z->weight_holds[slot] = b;
}

/* Stage 3: the compute stream waits until bucket b's weights are there. */
static inline void zero_weights_ready(Zero *z, int b, cudaStream_t compute)
{
    if (z->stage < 3)
        return;
    zero_weights_fetch(z, b);
    CUDA_CHECK(cudaStreamWaitEvent(compute, z->weight_gathered[zero_slot(z, b)], 0));
}

/* Stage 3: the compute stream has issued its last read of bucket b's weights. */
static inline void zero_weights_done(Zero *z, int b, cudaStream_t compute)
{
    if (z->stage >= 3)
        CUDA_CHECK(cudaEventRecord(z->weight_used[zero_slot(z, b)], compute));
}

/* Outside a step (checkpoints, tests), every rank together: bucket b's full
 * weights and fp32 master residuals on the device, gathered from the ranks'
 * shares as the stage needs (lo_shares: the rank's residuals, in state order).
 * The residuals land in the bucket's gradient buffer, free between steps. */
static inline void zero_full_bucket(Zero *z, int b, const int16_t *lo_shares, const bf16 **weights, const int16_t **lo,
                                    cudaStream_t s)
{
    if (z->stage >= 3) {
        zero_weights_ready(z, b, s);
        zero_weights_done(z, b, s);
    }
    *weights = zero_bucket_weights(z, b);
    if (z->stage == 0) {
        *lo = lo_shares + z->state_at[b];
    } else {
        bf16 *full = zero_bucket_grads(z, b);
        dist_all_gather(z->dist, lo_shares + z->state_at[b], full, z->plan.buckets[b].shard, 2, s);
        *lo = (const int16_t *)full;
    }
    CUDA_CHECK(cudaStreamSynchronize(s));
}

/* After the last micro-step's backward: each rank's update ranges hold the
 * gradient summed over the ranks. */
static inline void zero_reduce_grads(Zero *z, cudaStream_t compute)
{
    const Dist *d = z->dist;
    if (z->stage == 0) {
        dist_all_reduce_sum(d, z->grads, z->plan.padded_total, 2, compute);
    } else if (z->stage == 1) {
        dist_group_begin(d);
        for (int b = 0; b < z->plan.n_buckets; b++)
            dist_reduce_scatter_sum(d, zero_bucket_grads(z, b), zero_update_grads(z, b), z->plan.buckets[b].shard, 2,
                                    compute);
        dist_group_end(d);
    } else {
        CUDA_CHECK(cudaEventRecord(z->comm_done, z->comm));
        CUDA_CHECK(cudaStreamWaitEvent(compute, z->comm_done, 0));
    }
}

/* After AdamW changed this rank's weights: stages 1 and 2 all-gather every
 * bucket's new weights; stage 3 forgets what its slots hold. Later collectives
 * (which read the weight shares and write the gradient shares) wait for it. */
static inline void zero_params_changed(Zero *z, cudaStream_t compute)
{
    const Dist *d = z->dist;
    if (z->stage == 1 || z->stage == 2) {
        dist_group_begin(d);
        for (int b = 0; b < z->plan.n_buckets; b++)
            dist_all_gather(d, zero_update_weights(z, b), zero_bucket_weights(z, b), z->plan.buckets[b].shard, 2,
                            compute);
        dist_group_end(d);
    }
    for (int s = 0; s < ZERO_SLOTS; s++)
        z->weight_holds[s] = -1;
    if (z->stage >= 2) {
        CUDA_CHECK(cudaEventRecord(z->params_changed, compute));
        CUDA_CHECK(cudaStreamWaitEvent(z->comm, z->params_changed, 0));
    }
}

#endif /* LLMC_ZERO_H */
