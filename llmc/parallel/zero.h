/*
 * zero.h: the communication of ZeRO data parallelism, bucket by bucket
 * (llmc/parallel/zero_plan.h: the embedding, each decoder layer, then the final norm with
 * an untied lm_head), and where each bucket's weights and gradients live.
 *
 * Groups. Flat (the default), the shard group is every rank and there is no
 * replica group. With ZeroOptions.over_hosts (--shard-over host) the shard group
 * is the ranks of a host (NVLink) and the replica group the ranks at the same
 * position on every host (the network): a sum is reduce-scattered over the shard
 * group, then the group share's sum over the replica group; a gather runs the
 * other way. Weights and gradients are sharded over the shard group, the
 * optimizer state over the world (zero_plan.h's shares) either way.
 *
 * Gradients. The backward pass writes each bucket's gradient into
 *   a full-size buffer (stages 0 and 1, and stages 2 and 3 accumulating several
 *     micro-steps locally, ZERO_ACCUM_LOCAL): micro-steps before the last add to
 *     it (accumulating GEMMs), and in the last one each bucket is summed as soon
 *     as backward completes it, on the communication stream, while the layers
 *     below compute: all-reduced (stage 0) or reduce-scattered in place, which
 *     leaves the rank its share. One reduction per optimizer step.
 *   or a staging buffer (stages 2 and 3 with one micro-step, or reducing every
 *     micro-step, ZERO_ACCUM_SHARDED): each micro-step reduce-scatters each
 *     bucket over the shard group into the rank's group share (micro-step 0
 *     writes it, later ones add: fp32 sums, one bf16 rounding); in the last
 *     micro-step the group share is then reduce-scattered over the replica group.
 * Weights. Stages 0 to 2 keep all of them. After AdamW, stages 1 and 2 all-gather
 * every bucket's new weights on the communication stream, and the next forward
 * pass waits for each bucket only where it first reads it. Stage 3 keeps the
 * rank's group shares: after AdamW they are all-gathered over the replica group,
 * and a bucket is all-gathered over the shard group into a staging buffer before
 * each use, the next layer's in flight while the current layer computes.
 * Sums (ZeroOptions.sum, --grad-reduce): bf16 on NCCL's ring (one rounding per
 * rank added), or in fp32: each chunk of a bucket converted to fp32, summed, and
 * rounded to bf16 once per level (flat: once), or quantized (ZeRO++'s qgZ): each
 * rank's blocks as one-byte codes with an fp32 scale per 128 values
 * (llmc/kernels/block_codec.h, int8 or e4m3; codes and scales one message per
 * destination), exchanged all-to-all, and every rank's codes of this rank's
 * block decoded and summed in fp32 in rank order, rounded to bf16 once per
 * level: half the bytes of bf16 on the wire, at the codec's error per value
 * and level.
 * Stage 3's gathers (ZeroOptions.gather, --weight-gather; ZeRO++'s qwZ): the
 * per-use gather of a bucket over the shard group moves codes too: each rank
 * encodes its group share, the messages (codes and scales) are all-gathered and
 * decoded into the staging slot, so every rank computes with the same decoded
 * weights, its own share's included, while the update keeps the exact ones.
 * The gathers of new weights over the replica group, and those for
 * checkpoints, stay exact.
 * With --fp8 per tensor the layer buckets travel as the very FP8 codes their
 * Linear maps compute with (zero_fp8.h, included at the end): exact.
 * The gather of the new weights after AdamW can move each weight's change
 * instead of its bf16 value (ZeroOptions.update, --update-gather delta; zero_delta.h,
 * included at the end): exact, about half the bytes, or about three eighths
 * where most changes are small enough to travel packed, a nibble a weight.
 *
 * Staging buffers: the first and last buckets have their own and keep them for
 * the whole step: the tied embedding is both the first weight read (embedding)
 * and the last (the classifier), and its gradient is written first (classifier)
 * and completed last (embedding backward). The layer buckets, all the same size,
 * alternate between two, so layer l's collective overlaps layer l -/+ 1's
 * compute. A weight slot remembers which bucket it holds, so the layers gathered
 * at the end of the forward pass serve the start of the backward pass without a
 * second gather, until the weights change.
 *
 * One stream carries every collective of the step, so each rank issues them in
 * the same order, as NCCL requires; events, not device-wide syncs, order it
 * against the compute stream.
 *
 * Memory per rank beyond the optimizer state (P padded parameters, G ranks in a
 * shard group): weights 2 P (stage 3: 2 P / G plus 2 bytes x (first + last + 2
 * layer buckets) of staging); gradients 2 P in a full-size buffer, or 2 P / G
 * plus as much staging as the weights' and, when adding micro-steps in bf16, the
 * largest group share as scratch; --grad-reduce fp32: up to ZERO_FP32_CHUNK
 * floats; --update-gather delta: a byte per weight this rank updates, a byte per
 * weight of the largest bucket, the escape lists (8 bytes per 16 weights this
 * rank updates, and per 16 of the largest bucket's) and the packed form's
 * offsets (4 bytes per 4,096 weights this rank updates); --grad-reduce int8 or
 * e4m3: two message buffers of up to ZERO_CODE_CHUNK x 33 / 32 bytes (stage 3
 * with --weight-gather int8 or e4m3: the first at least a layer slot's
 * messages); an event per bucket.
 */
#ifndef LLMC_ZERO_H
#define LLMC_ZERO_H

#include "llmc/common/cuda_common.h"
#include "llmc/kernels/block_codec.h"
#include "llmc/kernels/delta_codec.h"
#include "llmc/parallel/distributed.h"
#include "llmc/parallel/zero_plan.h"
#include "llmc/model/param_layout.h"

static_assert(ZERO_ALIGN % BLOCK_CODEC_SIZE == 0, "a rank's share must hold whole codec blocks");

/* staging slots: the first bucket, the last bucket, two for the layers */
#define ZERO_SLOTS 4
#define ZERO_THREADS 256
#define ZERO_MAX_BLOCKS 4096
/* fp32 elements summed at once with --grad-reduce fp32 (128 MiB) */
#define ZERO_FP32_CHUNK ((int64_t)32 << 20)
/* elements summed at once by the quantized sums (66 MiB of messages each way): a layer of the 1B (61 M) in one
 * chunk on any number of ranks, so that its sum is three launches */
#define ZERO_CODE_CHUNK ((int64_t)64 << 20)

/* How gradients are summed over the ranks (--grad-reduce bf16|fp32|int8|e4m3, in that order). */
typedef enum { ZERO_SUM_BF16, ZERO_SUM_FP32, ZERO_SUM_INT8, ZERO_SUM_E4M3 } ZeroSum;
/* What stage 3's per-use gathers move (--weight-gather auto|bf16|int8|e4m3, in that order); auto is bf16 here (the
 * model gathers FP8 codes instead where --fp8 allows it: zero_fp8.h). */
typedef enum { ZERO_GATHER_AUTO, ZERO_GATHER_BF16, ZERO_GATHER_INT8, ZERO_GATHER_E4M3 } ZeroGather;

/* How stages 1 and 2 gather the weights AdamW updated (--update-gather bf16|delta, in that order). */
typedef enum { ZERO_UPDATE_BF16, ZERO_UPDATE_DELTA } ZeroUpdate;
/* A share's escape list has room for one escape in this many weights (delta_codec.h). */
#define ZERO_DELTA_ESCAPES 16

/* Where stages 2 and 3 accumulate the micro-steps of a step. */
typedef enum {
    ZERO_ACCUM_AUTO,    /* local where the memory allows it, else sharded */
    ZERO_ACCUM_LOCAL,   /* a full-size gradient buffer, reduced once per step */
    ZERO_ACCUM_SHARDED, /* the rank's group shares, each micro-step reduce-scattered into them */
} ZeroAccum;

typedef struct {
    int stage;       /* 0 to 3 */
    int over_hosts;  /* weights and gradients sharded over each host's ranks (--shard-over host) */
    int accum;       /* ZeroAccum, for stages 2 and 3 with several micro-steps */
    int sum;         /* ZeroSum */
    int gather;      /* ZeroGather: stage 3 only */
    int update;      /* ZeroUpdate: stages 1 and 2, and stage 3 over hosts */
    int micro_steps; /* per optimizer step; the last one reduces */
} ZeroOptions;

typedef struct {
    const Dist *dist;
    ZeroOptions opt;
    int stage;
    const DistGroup *shard, *replica; /* flat: every rank, and this rank alone */
    DistGroup alone;                  /* the flat mode's replica group */
    int position, replica_index;      /* this rank's place in each */
    ZeroPlan plan;
    int full_grads;        /* gradients in a full-size buffer (see the top) */
    int64_t *update_at;    /* [n_buckets] first padded element this rank updates (zero_update_range) */
    int64_t *update_count; /* [n_buckets] */
    int64_t *state_at;     /* [n_buckets] where that range starts in the rank's state buffers */
    int64_t state_total;   /* size of the rank's state buffers */
    int64_t *group_at;     /* [n_buckets] where the rank's group share of each starts in group_total buffers */
    int64_t group_total;
    /* weights [padded_total], or [group_total] group shares with stage 3; gradients
     * [padded_total] with full_grads, else [group_total] group shares */
    bf16 *params, *grads;
    cudaStream_t comm;
    bf16 *grad_staging[ZERO_SLOTS], *weight_staging[ZERO_SLOTS];
    bf16 *sum_scratch; /* staged bf16 sums of later micro-steps, before they are added */
    float *sum32;      /* --grad-reduce fp32: a chunk of every rank's block */
    int64_t sum32_elements;
    uint8_t *codes[2]; /* quantized sums' messages: [0] sent, [1] received, code_bytes each; gathers': [0] */
    int64_t code_bytes[2];
    cudaEvent_t grad_written[ZERO_SLOTS], grad_sent[ZERO_SLOTS];
    cudaEvent_t weight_gathered[ZERO_SLOTS], weight_used[ZERO_SLOTS];
    cudaEvent_t *bucket_gathered;  /* [n_buckets] stages 1 and 2: the bucket's new weights are in place */
    unsigned char *gather_pending; /* [n_buckets] the compute stream has not waited for that yet */
    cudaEvent_t comm_done, params_changed;
    int weight_holds[ZERO_SLOTS]; /* bucket gathered into each weight slot, -1: none */
    struct ZeroFp8 *fp8;          /* stage 3 with --fp8: the layer buckets gathered as codes (zero_fp8.h), or NULL */
    /* --update-gather delta (zero_delta_active): */
    int8_t *change;                   /* [state_total] AdamW's change codes of each update range, at state_at */
    int8_t *change_all;               /* [largest padded bucket] a bucket's codes or packed messages from every rank */
    unsigned long long *escapes;      /* each bucket's escape list (count, then entries) at escape_at[b] */
    unsigned long long *escapes_all;  /* [world x (1 + the largest room)] every rank's list of a bucket */
    int64_t *escape_at;               /* [n_buckets + 1] the last entry: where the last list ends */
    int64_t *escape_room;             /* [n_buckets] */
    uint32_t *wide_offsets;           /* each bucket's chunks' offsets in a packed message, at wide_at[b] */
    int64_t *wide_at;                 /* [n_buckets + 1] */
    unsigned long long *delta_counts; /* [2 n_buckets] each bucket's escapes, then its wide codes: this rank's, */
    unsigned long long *h_delta_counts; /* then the largest over the ranks; and on the host (pinned) */
    int delta_told;                     /* the first step's account was printed */
    double update_bytes; /* --update-gather delta: the last update's gathers, bytes on the wire a weight a rank sent */
} Zero;

struct ZeroFp8;
static inline void zero_fp8_gather(Zero *z, int b, int slot);
static inline void zero_fp8_weights_changed(Zero *z);
static inline void zero_fp8_free(Zero *z);
static inline void zero_delta_counts_(Zero *z);
static inline int64_t zero_gather_changes_(Zero *z, int b, const DistGroup *g, bf16 *dst, int self, int *packed);

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

/* out[r * n + j] = in[r * stride + j] in fp32, for r < blocks and j < n (n = 8 n8): a chunk
 * of each rank's block, side by side as a reduce-scatter takes them. */
__global__ void zero_pack_fp32_kernel(float *__restrict__ out, const bf16 *__restrict__ in, int64_t stride, int64_t n8,
                                      int blocks)
{
    int64_t total = n8 * blocks;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / n8, j = (i % n8) * 8;
        bf16x8 x = load16(in + r * stride + j);
        floatx4 lo, hi;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            lo.v[k] = __bfloat162float(x.v[k]);
            hi.v[k] = __bfloat162float(x.v[k + 4]);
        }
        store16(out + r * n8 * 8 + j, lo);
        store16(out + r * n8 * 8 + j + 4, hi);
    }
}

/* out[j] = x[j], or out[j] + x[j] when add, rounded to bf16 once (j < 8 n8). */
__global__ void zero_unpack_fp32_kernel(bf16 *__restrict__ out, const float *__restrict__ x, int64_t n8, int add)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        floatx4 lo = load16(x + i * 8), hi = load16(x + i * 8 + 4);
        bf16x8 o;
        if (add)
            o = load16(out + i * 8);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            o.v[k] = __float2bfloat16((add ? __bfloat162float(o.v[k]) : 0.0f) + lo.v[k]);
            o.v[k + 4] = __float2bfloat16((add ? __bfloat162float(o.v[k + 4]) : 0.0f) + hi.v[k]);
        }
        store16(out + i * 8, o);
    }
}

static inline int zero_blocks(int64_t work)
{
    int blocks = ceil_div(work, ZERO_THREADS);
    return blocks < 1 ? 1 : blocks < ZERO_MAX_BLOCKS ? blocks : ZERO_MAX_BLOCKS;
}

static inline void zero_add(bf16 *acc, const bf16 *x, int64_t n, cudaStream_t s)
{
    zero_add_kernel<<<zero_blocks(n / 8), ZERO_THREADS, 0, s>>>(acc, x, n / 8);
    CUDA_CHECK_LAST();
}

static inline BlockCodec zero_codec_(int int8)
{
    return int8 ? BLOCK_CODEC_INT8 : BLOCK_CODEC_E4M3;
}

/* zero_sum_scatter quantized (qgZ, see the top), a chunk of every block at a time: the
 * chunks encoded side by side by destination, one message each (codes and scales,
 * block_codec.h), into codes[0] in one launch, exchanged all-to-all into codes[1] in
 * one call, the group's messages of this rank's chunk (its own still in codes[0])
 * decoded and summed in fp32 in rank order, rounded to bf16 once (added to out when
 * add). Three launches a chunk (a launch beside the backward can wait for SMs: an
 * encode or decode measured 0.1-1.5 ms there, against 0.1 after).
 * count and the chunk are multiples of the codec's block (ZERO_ALIGN), so no block
 * straddles two ranks. */
static inline void zero_sum_scatter_codes_(Zero *z, const DistGroup *g, const bf16 *in, int64_t stride, bf16 *out,
                                           int64_t count, int add)
{
    cudaStream_t s = z->comm;
    BlockCodec codec = zero_codec_(z->opt.sum == ZERO_SUM_INT8);
    int64_t chunk = block_codec_message_values(z->code_bytes[1] / g->size);
    if (count % BLOCK_CODEC_SIZE || chunk < BLOCK_CODEC_SIZE)
        FAIL("zero_sum_scatter: %lld elements per rank, in chunks of %lld: the codes need whole blocks of %d",
             (long long)count, (long long)chunk, BLOCK_CODEC_SIZE);
    for (int64_t j0 = 0; j0 < count; j0 += chunk) {
        int64_t n = count - j0 < chunk ? count - j0 : chunk, m = block_codec_message_bytes(n);
        block_encode(z->codes[0], m, in + j0, stride, n, g->size, codec, s);
        dist_all_to_all(g, z->codes[0], z->codes[1], m, s);
        block_decode_sum(out + j0, z->codes[1], m, z->codes[0] + g->rank * m, g->rank, n, g->size, add, codec, s);
    }
}

/* Sums block r of the group's ranks (in + r * stride, count elements) into rank r's
 * out[count]: written, or added to when add. bf16 on NCCL's ring (blocks side by side,
 * stride == count), through fp32 chunks with --grad-reduce fp32, or quantized with
 * int8 or e4m3. On the communication stream; in-place when out is the rank's own block. */
static inline void zero_sum_scatter(Zero *z, const DistGroup *g, const bf16 *in, int64_t stride, bf16 *out,
                                    int64_t count, int add)
{
    cudaStream_t s = z->comm;
    if (g->size > 1 && (z->opt.sum == ZERO_SUM_INT8 || z->opt.sum == ZERO_SUM_E4M3)) {
        zero_sum_scatter_codes_(z, g, in, stride, out, count, add);
        return;
    }
    if (z->opt.sum == ZERO_SUM_FP32) {
        int64_t chunk = z->sum32_elements / g->size / ZERO_ALIGN * ZERO_ALIGN;
        for (int64_t j0 = 0; j0 < count; j0 += chunk) {
            int64_t n = count - j0 < chunk ? count - j0 : chunk;
            zero_pack_fp32_kernel<<<zero_blocks(n / 8 * g->size), ZERO_THREADS, 0, s>>>(z->sum32, in + j0, stride,
                                                                                        n / 8, g->size);
            CUDA_CHECK_LAST();
            float *mine = z->sum32 + (int64_t)g->rank * n;
            dist_reduce_scatter_sum(g, z->sum32, mine, n, 4, s);
            zero_unpack_fp32_kernel<<<zero_blocks(n / 8), ZERO_THREADS, 0, s>>>(out + j0, mine, n / 8, add);
            CUDA_CHECK_LAST();
        }
        return;
    }
    if (stride != count)
        FAIL("zero_sum_scatter: bf16 blocks of %lld elements %lld apart; NCCL takes them side by side",
             (long long)count, (long long)stride);
    if (!add) {
        dist_reduce_scatter_sum(g, in, out, count, 2, s);
        return;
    }
    dist_reduce_scatter_sum(g, in, z->sum_scratch, count, 2, s);
    zero_add(out, z->sum_scratch, count, s);
}

/* buf[count] summed over every rank, in place (stage 0), in bf16 or fp32 chunks. */
static inline void zero_sum_all(Zero *z, bf16 *buf, int64_t count)
{
    const DistGroup *g = &z->dist->all;
    if (g->size == 1)
        return;
    if (z->opt.sum != ZERO_SUM_FP32) { /* the flags allow no quantized sum at stage 0 */
        dist_all_reduce_sum(g, buf, count, 2, z->comm);
        return;
    }
    for (int64_t j0 = 0; j0 < count; j0 += z->sum32_elements) {
        int64_t n = count - j0 < z->sum32_elements ? count - j0 : z->sum32_elements;
        zero_pack_fp32_kernel<<<zero_blocks(n / 8), ZERO_THREADS, 0, z->comm>>>(z->sum32, buf + j0, n, n / 8, 1);
        CUDA_CHECK_LAST();
        dist_all_reduce_sum(g, z->sum32, n, 4, z->comm);
        zero_unpack_fp32_kernel<<<zero_blocks(n / 8), ZERO_THREADS, 0, z->comm>>>(buf + j0, z->sum32, n / 8, 0);
        CUDA_CHECK_LAST();
    }
}

/* Bucket b whole in full[padded] on every rank, from each rank's share (its own at
 * share, which may lie inside full): over the replica group into the group share,
 * then over the shard group. */
static inline void zero_gather_bucket(Zero *z, int b, const bf16 *share, bf16 *full, cudaStream_t s)
{
    const ZeroBucket *bk = &z->plan.buckets[b];
    bf16 *group = full + (int64_t)z->position * bk->group_share;
    dist_all_gather(z->replica, share, group, bk->shard, 2, s);
    dist_all_gather(z->shard, group, full, bk->group_share, 2, s);
}

/* full[count * g->size] from each rank's share[count] through codes (qwZ, see the top):
 * the share encoded into its message's place in codes[0], the messages (codes and
 * scales) all-gathered in one call, all of them decoded; count a multiple of the
 * codec's block. */
static inline void zero_gather_codes_(Zero *z, const DistGroup *g, const bf16 *share, bf16 *full, int64_t count)
{
    cudaStream_t s = z->comm;
    BlockCodec codec = zero_codec_(z->opt.gather == ZERO_GATHER_INT8);
    int64_t m = block_codec_message_bytes(count);
    uint8_t *msgs = z->codes[0];
    if (count % BLOCK_CODEC_SIZE || m * g->size > z->code_bytes[0])
        FAIL("zero_gather_codes_: %d shares of %lld elements: whole blocks of %d, at most %lld bytes of messages",
             g->size, (long long)count, BLOCK_CODEC_SIZE, (long long)z->code_bytes[0]);
    block_encode(msgs + g->rank * m, m, share, 0, count, 1, codec, s);
    dist_all_gather(g, msgs + g->rank * m, msgs, m, 1, s);
    block_decode(full, count, msgs, m, count, g->size, codec, s);
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

/* Plans the buckets and every offset for the ranks of dist under opt; allocates
 * nothing on the device (zero_device_bytes, then zero_allocate, do). */
static inline void zero_configure(Zero *z, const Dist *dist, const ParamLayout *layout, const ZeroOptions *opt)
{
    memset(z, 0, sizeof(*z));
    if (opt->stage < 0 || opt->stage > 3)
        FAIL("ZeRO stage %d: stages are 0, 1, 2 and 3", opt->stage);
    if (opt->micro_steps < 1)
        FAIL("zero_configure: %d micro-steps per step", opt->micro_steps);
    z->dist = dist;
    z->opt = *opt;
    if (z->opt.gather == ZERO_GATHER_AUTO)
        z->opt.gather = ZERO_GATHER_BF16;
    if (opt->update == ZERO_UPDATE_DELTA && (opt->stage == 0 || (opt->stage == 3 && !opt->over_hosts)))
        FAIL("zero_configure: stage %d%s gathers no new weights to send as changes", opt->stage,
             opt->over_hosts ? " over hosts" : "");
    z->stage = opt->stage;
    z->plan = zero_plan(layout, dist->world);
    z->alone.size = 1;
    z->shard = &dist->all;
    z->replica = &z->alone;
    z->position = dist->rank;
    if (opt->over_hosts) {
        char where[96];
        process_groups_describe(&dist->groups, where, sizeof(where));
        if (opt->stage == 0)
            FAIL("--shard-over host needs ZeRO stage 1, 2 or 3 (stage 0 shards nothing)");
        if (dist->groups.per_host == 0)
            FAIL("--shard-over host needs the same number of GPUs on every host; these ranks run on %s (host "
                 "identity from %s)\n  hint: start as many ranks on every host, or set --shard-group N",
                 where, dist->host_source);
        zero_plan_shard_over_hosts(&z->plan, &dist->groups);
        z->shard = &dist->host;
        z->replica = &dist->across;
        z->position = dist->host.rank;
        z->replica_index = dist->across.rank;
    }
    int n = z->plan.n_buckets, rank = dist->rank;
    z->update_at = (int64_t *)malloc_check(sizeof(int64_t) * n, "ZeRO ranges");
    z->update_count = (int64_t *)malloc_check(sizeof(int64_t) * n, "ZeRO ranges");
    z->state_at = (int64_t *)malloc_check(sizeof(int64_t) * n, "ZeRO ranges");
    z->group_at = (int64_t *)malloc_check(sizeof(int64_t) * n, "ZeRO ranges");
    for (int b = 0; b < n; b++) {
        z->update_count[b] = zero_update_range(&z->plan, opt->stage, rank, b, &z->update_at[b]);
        z->group_at[b] = z->group_total;
        z->group_total += z->plan.buckets[b].group_share;
    }
    z->state_total = zero_state_offsets(&z->plan, opt->stage, rank, z->state_at);
    for (int s = 0; s < ZERO_SLOTS; s++)
        z->weight_holds[s] = -1;
    z->escape_at = (int64_t *)malloc_check(sizeof(int64_t) * (n + 1), "ZeRO escape lists");
    z->escape_room = (int64_t *)malloc_check(sizeof(int64_t) * n, "ZeRO escape lists");
    z->wide_at = (int64_t *)malloc_check(sizeof(int64_t) * (n + 1), "ZeRO packed changes");
    z->escape_at[0] = z->wide_at[0] = 0;
    for (int b = 0; b < n; b++) { /* each list and each bucket's offsets 16-byte aligned */
        z->escape_room[b] = z->update_count[b] / ZERO_DELTA_ESCAPES;
        z->escape_at[b + 1] = z->escape_at[b] + (1 + z->escape_room[b] + 1) / 2 * 2;
        z->wide_at[b + 1] = z->wide_at[b] + (delta_chunks(z->update_count[b]) + 3) / 4 * 4;
        const ZeroBucket *bk = &z->plan.buckets[b];
        if (opt->update == ZERO_UPDATE_DELTA && opt->stage <= 2 &&
            z->update_at[b] !=
                bk->padded_offset + (int64_t)z->position * bk->group_share + (int64_t)z->replica_index * bk->shard)
            FAIL("zero_configure: rank %d updates bucket %d at %lld, not at its place in the gather", rank, b,
                 (long long)z->update_at[b]);
    }
}

/* Whether the new weights travel as their changes (--update-gather delta; see the top): where some are gathered. */
static inline int zero_delta_active(const Zero *z)
{
    return z->opt.update == ZERO_UPDATE_DELTA && (z->stage <= 2 ? z->dist->world : z->replica->size) > 1;
}

/* Whether stage 2 or 3 can accumulate locally: the choice to make, given opt.accum. */
static inline int zero_local_accumulation_possible(const Zero *z)
{
    return z->stage >= 2 && z->opt.micro_steps > 1 && z->opt.accum != ZERO_ACCUM_SHARDED;
}

/* What zero_allocate takes, in elements, with gradients in a full-size buffer
 * (forced for stages 0 and 1) or not. */
typedef struct {
    int full_grads;
    int64_t params, grads; /* bf16 */
    int64_t staging;       /* bf16: the slots of the staged gradients, and of stage 3's weights */
    int64_t sum_scratch;   /* bf16: a later micro-step's staged sum, before it is added */
    int64_t sum32;         /* fp32: --grad-reduce fp32's chunk */
    int64_t codes[2];      /* bytes: quantized sums' and gathers' messages (a byte a value, 4 per 128 for scales) */
    int64_t change[2];     /* one byte each: --update-gather delta's codes of this rank and of a bucket's ranks */
    int64_t escapes[2];    /* 8 bytes each: this rank's escape lists, and a bucket's every rank's */
    int64_t wide_offsets;  /* 4 bytes each: the chunks' offsets of this rank's packed changes */
} ZeroSizes;

static inline ZeroSizes zero_sizes_(const Zero *z, int full_grads)
{
    const ZeroPlan *p = &z->plan;
    ZeroSizes n;
    memset(&n, 0, sizeof(n));
    n.full_grads = full_grads || z->stage <= 1;
    n.params = z->stage >= 3 ? z->group_total : p->padded_total;
    n.grads = n.full_grads ? p->padded_total : z->group_total;
    int64_t slots = 0, largest_group_share = 0, largest = 0;
    for (int s = 0; s < ZERO_SLOTS; s++)
        slots += zero_slot_elements(z, s);
    n.staging = (n.full_grads ? 0 : slots) + (z->stage >= 3 ? slots : 0);
    for (int b = 0; b < p->n_buckets; b++) {
        largest_group_share =
            p->buckets[b].group_share > largest_group_share ? p->buckets[b].group_share : largest_group_share;
        largest = p->buckets[b].padded > largest ? p->buckets[b].padded : largest;
    }
    if (z->opt.sum == ZERO_SUM_FP32) {
        n.sum32 = largest < ZERO_FP32_CHUNK ? largest : ZERO_FP32_CHUNK;
    } else {
        if (!n.full_grads && z->opt.micro_steps > 1)
            n.sum_scratch = largest_group_share;
        /* a group's pieces of a chunk, each its own message, padded to 16 bytes */
        int64_t chunk = largest < ZERO_CODE_CHUNK ? largest : ZERO_CODE_CHUNK;
        if (z->opt.sum != ZERO_SUM_BF16 && z->dist->world > 1)
            n.codes[0] = n.codes[1] = block_codec_message_bytes(chunk) + 16 * (int64_t)z->dist->world;
    }
    if (z->stage >= 3 && z->opt.gather != ZERO_GATHER_BF16 && z->shard->size > 1)
        for (int s = 0; s < ZERO_SLOTS; s++) {
            int64_t bytes = block_codec_message_bytes(zero_slot_elements(z, s)) + 16 * (int64_t)z->shard->size;
            n.codes[0] = bytes > n.codes[0] ? bytes : n.codes[0];
        }
    if (zero_delta_active(z)) {
        int64_t room = 0;
        for (int b = 0; b < p->n_buckets; b++)
            room = z->escape_room[b] > room ? z->escape_room[b] : room;
        n.change[0] = z->state_total;
        n.change[1] = largest; /* a packed message is gathered only where it is smaller than the codes */
        n.escapes[0] = z->escape_at[p->n_buckets];
        n.escapes[1] = (int64_t)z->dist->world * (1 + room);
        n.wide_offsets = z->wide_at[p->n_buckets];
    }
    return n;
}

/* The device bytes zero_allocate takes, with gradients in a full-size buffer or not. */
static inline size_t zero_device_bytes(const Zero *z, int full_grads)
{
    ZeroSizes n = zero_sizes_(z, full_grads);
    return (size_t)(n.params + n.grads + n.staging + n.sum_scratch) * sizeof(bf16) + (size_t)n.sum32 * sizeof(float) +
           (size_t)(n.codes[0] + n.codes[1]) + (size_t)(n.change[0] + n.change[1]) +
           (size_t)(n.escapes[0] + n.escapes[1]) * 8 + (size_t)n.wide_offsets * sizeof(uint32_t);
}

/* Allocates the weights and gradients (zeros: the padding must stay zero, and no
 * kernel writes it), the staging and the stream and events, as zero_configure
 * planned; full_grads: see the top (forced for stages 0 and 1). */
static inline void zero_allocate(Zero *z, int full_grads)
{
    int n = z->plan.n_buckets;
    ZeroSizes size = zero_sizes_(z, full_grads);
    z->full_grads = size.full_grads;
    z->params = (bf16 *)cuda_malloc_named((size_t)size.params * sizeof(bf16),
                                          z->stage >= 3 ? "bf16 weight group shares" : "bf16 weights");
    z->grads = (bf16 *)cuda_malloc_named((size_t)size.grads * sizeof(bf16),
                                         z->full_grads ? "bf16 gradients" : "bf16 gradient group shares");
    CUDA_CHECK(cudaMemset(z->params, 0, (size_t)size.params * sizeof(bf16)));
    CUDA_CHECK(cudaMemset(z->grads, 0, (size_t)size.grads * sizeof(bf16)));
    /* The highest priority: the block scheduler then starts the communication stream's kernels (NCCL's, the
     * codecs') as SMs free up, ahead of the compute stream's queued blocks, instead of after the GEMM in flight;
     * the order between the streams is the events', unchanged. */
    int lowest_priority, highest_priority;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest_priority, &highest_priority));
    CUDA_CHECK(cudaStreamCreateWithPriority(&z->comm, cudaStreamNonBlocking, highest_priority));
    CUDA_CHECK(cudaEventCreateWithFlags(&z->comm_done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&z->params_changed, cudaEventDisableTiming));
    z->bucket_gathered = (cudaEvent_t *)malloc_check(sizeof(cudaEvent_t) * n, "ZeRO events");
    z->gather_pending = (unsigned char *)calloc_check((size_t)n, 1, "ZeRO events");
    for (int b = 0; b < n; b++)
        CUDA_CHECK(cudaEventCreateWithFlags(&z->bucket_gathered[b], cudaEventDisableTiming));
    z->sum32_elements = size.sum32;
    if (size.sum32 > 0)
        z->sum32 = (float *)cuda_malloc_named((size_t)size.sum32 * sizeof(float), "fp32 gradient sums");
    if (size.sum_scratch > 0)
        z->sum_scratch = (bf16 *)cuda_malloc_named((size_t)size.sum_scratch * sizeof(bf16), "ZeRO gradient scratch");
    for (int i = 0; i < 2; i++) {
        z->code_bytes[i] = size.codes[i];
        if (size.codes[i] > 0)
            z->codes[i] = (uint8_t *)cuda_malloc_named((size_t)size.codes[i], "ZeRO quantized codes and scales");
    }
    if (size.change[0] > 0) {
        z->change = (int8_t *)cuda_malloc_named((size_t)size.change[0], "ZeRO new weights' change codes");
        z->change_all = (int8_t *)cuda_malloc_named((size_t)size.change[1], "ZeRO new weights' change codes");
        z->escapes = (unsigned long long *)cuda_malloc_named((size_t)size.escapes[0] * 8, "ZeRO escape lists");
        z->escapes_all = (unsigned long long *)cuda_malloc_named((size_t)size.escapes[1] * 8, "ZeRO escape lists");
        z->wide_offsets =
            (uint32_t *)cuda_malloc_named((size_t)size.wide_offsets * sizeof(uint32_t), "ZeRO packed changes' offsets");
        z->delta_counts =
            (unsigned long long *)cuda_malloc_named(sizeof(unsigned long long) * 2 * n, "ZeRO escape and wide counts");
        CUDA_CHECK(cudaMallocHost(&z->h_delta_counts, sizeof(unsigned long long) * 2 * n));
    }
    for (int s = 0; s < ZERO_SLOTS; s++) {
        size_t bytes = (size_t)zero_slot_elements(z, s) * sizeof(bf16);
        CUDA_CHECK(cudaEventCreateWithFlags(&z->grad_written[s], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&z->grad_sent[s], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&z->weight_gathered[s], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&z->weight_used[s], cudaEventDisableTiming));
        if (!z->full_grads) {
            /* zeros: the padding past a bucket's tensors is never written and must stay zero */
            z->grad_staging[s] = (bf16 *)cuda_malloc_named(bytes, "ZeRO gradient staging");
            CUDA_CHECK(cudaMemset(z->grad_staging[s], 0, bytes));
        }
        if (z->stage >= 3)
            z->weight_staging[s] = (bf16 *)cuda_malloc_named(bytes, "ZeRO weight staging");
    }
}

/* Gives back what zero_configure and zero_allocate took. */
static inline void zero_free(Zero *z)
{
    if (z->comm) {
        for (int s = 0; s < ZERO_SLOTS; s++) {
            cuda_free(z->grad_staging[s]);
            cuda_free(z->weight_staging[s]);
            CUDA_CHECK(cudaEventDestroy(z->grad_written[s]));
            CUDA_CHECK(cudaEventDestroy(z->grad_sent[s]));
            CUDA_CHECK(cudaEventDestroy(z->weight_gathered[s]));
            CUDA_CHECK(cudaEventDestroy(z->weight_used[s]));
        }
        for (int b = 0; b < z->plan.n_buckets; b++)
            CUDA_CHECK(cudaEventDestroy(z->bucket_gathered[b]));
        cuda_free(z->params);
        cuda_free(z->grads);
        cuda_free(z->sum_scratch);
        cuda_free(z->sum32);
        for (int i = 0; i < 2; i++)
            cuda_free(z->codes[i]);
        cuda_free(z->change);
        cuda_free(z->change_all);
        cuda_free(z->escapes);
        cuda_free(z->escapes_all);
        cuda_free(z->wide_offsets);
        cuda_free(z->delta_counts);
        if (z->h_delta_counts)
            CUDA_CHECK(cudaFreeHost(z->h_delta_counts));
        CUDA_CHECK(cudaEventDestroy(z->comm_done));
        CUDA_CHECK(cudaEventDestroy(z->params_changed));
        CUDA_CHECK(cudaStreamDestroy(z->comm));
    }
    zero_fp8_free(z);
    free(z->bucket_gathered);
    free(z->gather_pending);
    free(z->update_at);
    free(z->update_count);
    free(z->state_at);
    free(z->group_at);
    free(z->escape_at);
    free(z->escape_room);
    free(z->wide_at);
    zero_plan_free(&z->plan);
    memset(z, 0, sizeof(*z));
}

/* The full weights and gradients of bucket b, where the kernels read and write them. */
static inline bf16 *zero_bucket_weights(const Zero *z, int b)
{
    return z->stage >= 3 ? z->weight_staging[zero_slot(z, b)] : z->params + z->plan.buckets[b].padded_offset;
}
static inline bf16 *zero_bucket_grads(const Zero *z, int b)
{
    return z->full_grads ? z->grads + z->plan.buckets[b].padded_offset : z->grad_staging[zero_slot(z, b)];
}

/* The part of bucket b that this rank updates, in the flat buffers. */
static inline bf16 *zero_update_weights(const Zero *z, int b)
{
    if (z->stage >= 3)
        return z->params + z->group_at[b] + (int64_t)z->replica_index * z->plan.buckets[b].shard;
    return z->params + z->update_at[b];
}
static inline bf16 *zero_update_grads(const Zero *z, int b)
{
    if (!z->full_grads)
        return z->grads + z->group_at[b] + (int64_t)z->replica_index * z->plan.buckets[b].shard;
    return z->grads + z->update_at[b];
}

/* Staged gradients: before the compute stream writes bucket b's gradient, the
 * previous reduce-scatter out of the same staging buffer must be done. */
static inline void zero_grads_begin(Zero *z, int b, cudaStream_t compute)
{
    if (!z->full_grads) /* a profiled step counts the wait as communication (profile.h) */
        PROFILED(PROF_COMM, compute, CUDA_CHECK(cudaStreamWaitEvent(compute, z->grad_sent[zero_slot(z, b)], 0)));
}

/* Bucket b's gradient of micro-step `micro` is complete on the compute stream: sum
 * it as the top says, overlapped with what the compute stream does next. */
static inline void zero_grads_done(Zero *z, int b, int micro, cudaStream_t compute)
{
    int last = micro == z->opt.micro_steps - 1;
    if (micro >= z->opt.micro_steps)
        FAIL("zero_grads_done: micro-step %d of a step of %d", micro, z->opt.micro_steps);
    const ZeroBucket *bk = &z->plan.buckets[b];
    if (z->full_grads) {
        if (!last || z->dist->world == 1)
            return;
        CUDA_CHECK(cudaEventRecord(z->grad_written[0], compute));
        CUDA_CHECK(cudaStreamWaitEvent(z->comm, z->grad_written[0], 0));
        bf16 *full = z->grads + bk->padded_offset, *group = full + (int64_t)z->position * bk->group_share;
        profile_comm_begin(z->comm, "sum", b); /* --profile-step's timeline */
        if (z->stage == 0) {
            zero_sum_all(z, full, bk->padded);
        } else {
            zero_sum_scatter(z, z->shard, full, bk->group_share, group, bk->group_share, 0);
            if (z->replica->size > 1)
                zero_sum_scatter(z, z->replica, group, bk->shard, group + (int64_t)z->replica_index * bk->shard,
                                 bk->shard, 0);
        }
        profile_comm_end(z->comm);
        return;
    }
    int slot = zero_slot(z, b);
    bf16 *group = z->grads + z->group_at[b];
    CUDA_CHECK(cudaEventRecord(z->grad_written[slot], compute));
    CUDA_CHECK(cudaStreamWaitEvent(z->comm, z->grad_written[slot], 0));
    if (last) /* the timeline's marks: the last micro-step's sums */
        profile_comm_begin(z->comm, "sum", b);
    zero_sum_scatter(z, z->shard, z->grad_staging[slot], bk->group_share, group, bk->group_share, micro > 0);
    if (last && z->replica->size > 1)
        zero_sum_scatter(z, z->replica, group, bk->shard, group + (int64_t)z->replica_index * bk->shard, bk->shard, 0);
    if (last)
        profile_comm_end(z->comm);
    CUDA_CHECK(cudaEventRecord(z->grad_sent[slot], z->comm));
}

/* Stage 3: starts gathering bucket b's weights (unless its slot holds them already),
 * once the compute stream is done with the slot's previous bucket; through codes with
 * --weight-gather int8|e4m3, unless exact (checkpoints), which the next use does not
 * take for its own. */
static inline void zero_weights_fetch_(Zero *z, int b, int exact)
{
    int slot = zero_slot(z, b), codes = z->opt.gather != ZERO_GATHER_BF16 && z->shard->size > 1;
    int fp8 = z->fp8 && slot >= 2; /* a layer bucket as FP8 codes: its bf16 W are not in the slot */
    if (z->stage < 3 || (z->weight_holds[slot] == b && !((codes || fp8) && exact)))
        return; /* a slot of decoded weights or codes is not the exact weights */
    const ZeroBucket *bk = &z->plan.buckets[b];
    CUDA_CHECK(cudaStreamWaitEvent(z->comm, z->weight_used[slot], 0));
    if (fp8 && !exact)
        zero_fp8_gather(z, b, slot);
    else if (codes && !exact)
        zero_gather_codes_(z, z->shard, z->params + z->group_at[b], z->weight_staging[slot], bk->group_share);
    else
        dist_all_gather(z->shard, z->params + z->group_at[b], z->weight_staging[slot], bk->group_share, 2, z->comm);
    CUDA_CHECK(cudaEventRecord(z->weight_gathered[slot], z->comm));
    z->weight_holds[slot] = (codes || fp8) && exact ? -1 : b;
}

static inline void zero_weights_fetch(Zero *z, int b)
{
    zero_weights_fetch_(z, b, 0);
}

/* The compute stream waits until bucket b's weights are there: stage 3's gather,
 * or stage 1 and 2's gather of the weights the last update changed. */
static inline void zero_weights_ready(Zero *z, int b, cudaStream_t compute)
{
    if (z->stage >= 3) {
        zero_weights_fetch(z, b);
        PROFILED(PROF_COMM, compute, CUDA_CHECK(cudaStreamWaitEvent(compute, z->weight_gathered[zero_slot(z, b)], 0)));
    } else if (z->gather_pending[b]) {
        PROFILED(PROF_COMM, compute, CUDA_CHECK(cudaStreamWaitEvent(compute, z->bucket_gathered[b], 0)));
        z->gather_pending[b] = 0;
    }
}

/* Stage 3: the compute stream has issued its last read of bucket b's weights. */
static inline void zero_weights_done(Zero *z, int b, cudaStream_t compute)
{
    if (z->stage >= 3)
        CUDA_CHECK(cudaEventRecord(z->weight_used[zero_slot(z, b)], compute));
}

/* Outside a step (checkpoints, tests), every rank together: bucket b's full
 * weights and fp32 master residuals on the device, gathered from the ranks'
 * shares as the stage needs (lo_share: the rank's residuals of bucket b, its
 * update_count[b] elements, on the device).
 * The residuals land in the bucket's gradient buffer, free between steps. All of
 * it on the communication stream, after what s has issued; returns when done. */
static inline void zero_full_bucket(Zero *z, int b, const int16_t *lo_share, const bf16 **weights, const int16_t **lo,
                                    cudaStream_t s)
{
    CUDA_CHECK(cudaEventRecord(z->params_changed, s));
    CUDA_CHECK(cudaStreamWaitEvent(z->comm, z->params_changed, 0));
    zero_weights_fetch_(z, b, 1);
    *weights = zero_bucket_weights(z, b);
    if (z->stage == 0) {
        *lo = lo_share;
    } else {
        bf16 *full = zero_bucket_grads(z, b);
        zero_gather_bucket(z, b, (const bf16 *)lo_share, full, z->comm);
        *lo = (const int16_t *)full;
    }
    CUDA_CHECK(cudaStreamSynchronize(z->comm));
}

/* After the last micro-step's backward: the compute stream waits for the step's
 * sums, after which each rank's update ranges hold the gradient summed over the ranks. */
static inline void zero_grads_reduced(Zero *z, cudaStream_t compute)
{
    CUDA_CHECK(cudaEventRecord(z->comm_done, z->comm));
    CUDA_CHECK(cudaStreamWaitEvent(compute, z->comm_done, 0));
}

/* Stage 3's shares were written (an update, or weights loaded): what the slots hold, and the FP8 codes' scales, are
 * of the old weights. */
static inline void zero_shares_written(Zero *z)
{
    for (int s = 0; s < ZERO_SLOTS; s++)
        z->weight_holds[s] = -1;
    zero_fp8_weights_changed(z);
}

/* Bucket b's new weights to the ranks that read them, on the communication stream: stage 3 the group shares over
 * the replica group, stages 1 and 2 the whole bucket; as their changes where `changes` (*packed set where they went
 * packed), else in bf16. Returns the bytes this rank sent of its updated weights (update_bytes' numerator). */
static inline int64_t zero_gather_new_weights_(Zero *z, int b, int changes, int *packed)
{
    const ZeroBucket *bk = &z->plan.buckets[b];
    int64_t bf16_bytes = 2 * z->update_count[b];
    if (z->stage >= 3) {
        if (changes)
            return zero_gather_changes_(z, b, z->replica, z->params + z->group_at[b], z->replica_index, packed);
        if (z->replica->size > 1)
            dist_all_gather(z->replica, zero_update_weights(z, b), z->params + z->group_at[b], bk->shard, 2, z->comm);
        return bf16_bytes;
    }
    bf16 *full = z->params + bk->padded_offset, *group = full + (int64_t)z->position * bk->group_share;
    if (changes && z->replica->size == 1) /* flat: over all ranks */
        return zero_gather_changes_(z, b, z->shard, full, z->position, packed);
    if (changes) { /* over hosts: the changes across them, then the group shares inside each in bf16 */
        int64_t sent = zero_gather_changes_(z, b, z->replica, group, z->replica_index, packed);
        dist_all_gather(z->shard, group, full, bk->group_share, 2, z->comm);
        return sent;
    }
    zero_gather_bucket(z, b, zero_update_weights(z, b), full, z->comm);
    return bf16_bytes;
}

/* After AdamW changed this rank's weights (on the compute stream): stages 1 and 2
 * gather every bucket's new weights, which the next forward waits for bucket by
 * bucket; stage 3 gathers its group shares over the replica group and forgets
 * what its slots hold. All on the communication stream. */
static inline void zero_params_changed(Zero *z, cudaStream_t compute)
{
    CUDA_CHECK(cudaEventRecord(z->params_changed, compute));
    CUDA_CHECK(cudaStreamWaitEvent(z->comm, z->params_changed, 0));
    zero_shares_written(z);
    if (z->dist->world == 1 || z->stage == 0)
        return;
    int delta = zero_delta_active(z), as_changes = 0, as_packed = 0;
    int64_t sent = 0, weights = 0; /* this rank's, in the gathers that may carry changes (flat, or across hosts) */
    if (delta)
        zero_delta_counts_(z);
    for (int b = 0; b < z->plan.n_buckets; b++) {
        int changes = delta && z->h_delta_counts[b] <= (unsigned long long)z->escape_room[b];
        as_changes += changes;
        weights += z->update_count[b];
        int packed = 0;
        profile_comm_begin(z->comm, "gather", b); /* --profile-step's timeline */
        sent += zero_gather_new_weights_(z, b, changes, &packed);
        profile_comm_end(z->comm);
        as_packed += packed;
        if (z->stage < 3) { /* stage 3 reads its shares through the per-use gathers, later on this stream */
            CUDA_CHECK(cudaEventRecord(z->bucket_gathered[b], z->comm));
            z->gather_pending[b] = 1;
        }
    }
    z->update_bytes = delta ? (double)sent / (double)weights : 0.0;
    if (delta && !z->delta_told) { /* rank 0's, the others' stdout being silent */
        printf("--update-gather delta: the first step gathered %d of %d buckets as their changes (%d of them packed, "
               "a nibble a weight), the rest whole (more escapes than a 1/%d of the share): %.3f bytes a weight\n",
               as_changes, z->plan.n_buckets, as_packed, ZERO_DELTA_ESCAPES, z->update_bytes);
        z->delta_told = 1;
    }
}

#include "llmc/parallel/zero_delta.h"
#include "llmc/parallel/zero_fp8.h"

#endif /* LLMC_ZERO_H */
