/*
 * zero_plan.h: how ZeRO sharding splits the flat parameter, gradient and
 * optimizer buffers (llama_param_layout) across `world` ranks.
 *
 * The flat buffer is cut into buckets that follow the model: the embedding,
 * each decoder layer, then the final norm with lm_head (if untied). A bucket is
 * the unit of one reduce-scatter (gradients, stage 2) and one all-gather
 * (parameters, stage 3), so a layer's communication can overlap the next
 * layer's compute. Each bucket is padded with zeros to a multiple of
 * world * ZERO_ALIGN elements, so every rank owns an equal, aligned share of
 * every bucket and no tensor size is ever refused. Rank r owns, in bucket b,
 * padded elements [padded_offset + r * shard, padded_offset + (r + 1) * shard).
 * What a rank updates at each stage (all of every bucket at stage 0, its shares
 * otherwise) and where its optimizer state keeps it (the shares back to back)
 * follow from that. Pure arithmetic on the layout; allocates the bucket table only.
 */
#ifndef LLMC_ZERO_PLAN_H
#define LLMC_ZERO_PLAN_H

#include <stdint.h>

#include "llama_config.h"
#include "utils.h"

/* Elements each share is a multiple of: 256 bytes of fp32, so shards start
 * 16-byte aligned for the vector loads in any dtype used here. */
#define ZERO_ALIGN 64

typedef struct {
    int64_t offset;        /* first element in the unpadded flat buffer */
    int64_t numel;         /* elements of the model in this bucket */
    int64_t padded_offset; /* first element in the padded flat buffer */
    int64_t padded;        /* numel rounded up to a multiple of world * ZERO_ALIGN */
    int64_t shard;         /* padded / world: what each rank owns */
} ZeroBucket;

typedef struct {
    int world;
    int n_buckets;
    ZeroBucket *buckets;
    int64_t padded_total; /* size of the padded flat buffers */
} ZeroPlan;

static inline ZeroPlan zero_plan(const LlamaConfig *c, const ParamLayout *layout, int world)
{
    if (world < 1)
        FAIL("zero_plan: world size %d must be at least 1", world);
    ZeroPlan plan;
    plan.world = world;
    plan.n_buckets = c->n_layer + 2;
    plan.buckets = (ZeroBucket *)calloc_check((size_t)plan.n_buckets, sizeof(ZeroBucket), "ZeRO buckets");
    /* bucket boundaries in tensor indices: [0, 1), each layer's LAYER_TENSORS, then the rest */
    int64_t unit = (int64_t)world * ZERO_ALIGN, padded_offset = 0;
    for (int b = 0; b < plan.n_buckets; b++) {
        int first = b == 0 ? 0 : 1 + (b - 1) * LAYER_TENSORS;
        int last = b == 0 ? 1 : b <= c->n_layer ? first + LAYER_TENSORS : layout->n_tensors;
        ZeroBucket *z = &plan.buckets[b];
        z->offset = layout->tensors[first].offset;
        z->numel = layout->tensors[last - 1].offset + layout->tensors[last - 1].numel - z->offset;
        z->padded = (z->numel + unit - 1) / unit * unit;
        z->padded_offset = padded_offset;
        z->shard = z->padded / world;
        padded_offset += z->padded;
    }
    plan.padded_total = padded_offset;
    return plan;
}

/* The model elements rank owns in bucket b: [*begin, *end) of the unpadded
 * flat buffer (empty when its share is all padding). */
static inline void zero_owned_range(const ZeroPlan *plan, int b, int rank, int64_t *begin, int64_t *end)
{
    const ZeroBucket *z = &plan->buckets[b];
    int64_t lo = (int64_t)rank * z->shard, hi = lo + z->shard;
    if (lo > z->numel)
        lo = z->numel;
    if (hi > z->numel)
        hi = z->numel;
    *begin = z->offset + lo;
    *end = z->offset + hi;
}

/* What `rank` updates in bucket b at ZeRO `stage`: with stage 0 every rank the whole
 * padded bucket, with stages 1 to 3 its own share. Returns the element count; *at
 * receives the first element in the padded flat buffer. */
static inline int64_t zero_update_range(const ZeroPlan *plan, int stage, int rank, int b, int64_t *at)
{
    const ZeroBucket *z = &plan->buckets[b];
    *at = z->padded_offset + (stage == 0 ? 0 : (int64_t)rank * z->shard);
    return stage == 0 ? z->padded : z->shard;
}

/* The model elements of that range: [*begin, *end) of the unpadded flat buffer. */
static inline void zero_update_model_range(const ZeroPlan *plan, int stage, int rank, int b, int64_t *begin,
                                           int64_t *end)
{
    const ZeroBucket *z = &plan->buckets[b];
    if (stage == 0) {
        *begin = z->offset;
        *end = z->offset + z->numel;
    } else {
        zero_owned_range(plan, b, rank, begin, end);
    }
}

/* A rank keeps the optimizer state of its update ranges back to back, bucket after
 * bucket: state_at[b] (n_buckets entries) receives where bucket b's range starts
 * there. Returns the total, the size of the rank's state buffers. */
static inline int64_t zero_state_offsets(const ZeroPlan *plan, int stage, int rank, int64_t *state_at)
{
    int64_t total = 0, at;
    for (int b = 0; b < plan->n_buckets; b++) {
        state_at[b] = total;
        total += zero_update_range(plan, stage, rank, b, &at);
    }
    return total;
}

static inline void zero_plan_free(ZeroPlan *plan)
{
    free(plan->buckets);
    plan->buckets = NULL;
}

#endif /* LLMC_ZERO_PLAN_H */
