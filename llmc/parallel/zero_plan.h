/*
 * zero_plan.h: how ZeRO sharding splits the flat parameter, gradient and
 * optimizer buffers (model/param_layout.h) across `world` ranks.
 *
 * The flat buffer is cut into the buckets the layout gives its tensors (each
 * tensor's bucket: the embedding, each decoder layer, then the final norm with
 * lm_head if untied), whatever the model: the plan reads nothing else. A bucket is
 * the unit of one reduce-scatter (gradients) and one all-gather (parameters), so
 * a layer's communication can overlap the next layer's compute. Each bucket is
 * padded with zeros to a multiple of world * ZERO_ALIGN elements and cut into
 * `world` equal shares (`shard` elements each), so every rank owns an equal,
 * aligned share of every bucket and no tensor size is ever refused.
 *
 * Which share a rank owns follows the shard groups (llmc/parallel/process_groups.h):
 * flat, the whole world is one shard group and rank r owns share r. With
 * sharding over hosts (H hosts of S ranks), a bucket is first cut into S group
 * shares of H shares each: the rank at position p on host h holds group share p
 * (weights and gradients it shards with its host) and owns share p * H + h of
 * it, which it updates. Either way: rank r owns padded elements
 * [padded_offset + share_of[r] * shard, ... + shard) of bucket b. What a rank
 * updates at each stage (all of every bucket at stage 0, its share otherwise)
 * and where its optimizer state keeps it (the shares back to back) follow from
 * that. Pure arithmetic on the layout; allocates the bucket and share tables only.
 */
#ifndef LLMC_ZERO_PLAN_H
#define LLMC_ZERO_PLAN_H

#include <stdint.h>

#include "llmc/parallel/process_groups.h"
#include "llmc/common/utils.h"
#include "llmc/model/param_layout.h"

/* Elements each share is a multiple of: a whole block of llmc/kernels/block_codec.h
 * (128 values), so a quantized sum or gather never splits one between two ranks; and
 * 512 bytes of fp32, so shards start 16-byte aligned for the vector loads in any dtype. */
#define ZERO_ALIGN 128

typedef struct {
    int64_t offset;        /* first element in the unpadded flat buffer */
    int64_t numel;         /* elements of the model in this bucket */
    int64_t padded_offset; /* first element in the padded flat buffer */
    int64_t padded;        /* numel rounded up to a multiple of world * ZERO_ALIGN */
    int64_t shard;         /* padded / world: what each rank owns */
    int64_t group_share;   /* padded / group_size: what a member of a shard group holds */
} ZeroBucket;

typedef struct {
    int world;
    int group_size; /* ranks of a shard group: the world, or a host's */
    int groups;     /* world / group_size: the replicas of each group share */
    int *share_of;  /* [world] the share each rank owns, in every bucket */
    int n_buckets;
    ZeroBucket *buckets;
    int64_t padded_total; /* size of the padded flat buffers */
} ZeroPlan;

static inline ZeroPlan zero_plan(const ParamLayout *layout, int world)
{
    if (world < 1)
        FAIL("zero_plan: world size %d must be at least 1", world);
    for (int i = 0; i < layout->n_tensors; i++) {
        int b = layout->tensors[i].bucket, before = i ? layout->tensors[i - 1].bucket : 0;
        if (b < before || b > before + 1 || b >= layout->n_buckets || (i == 0 && b != 0))
            FAIL("zero_plan: tensor %d (%s) is in bucket %d after bucket %d of %d; buckets run 0, 1, ... in order", i,
                 layout->tensors[i].name, b, before, layout->n_buckets);
    }
    ZeroPlan plan;
    plan.world = world;
    plan.group_size = world;
    plan.groups = 1;
    plan.share_of = (int *)malloc_check(sizeof(int) * (size_t)world, "ZeRO shares");
    for (int r = 0; r < world; r++)
        plan.share_of[r] = r;
    plan.n_buckets = layout->n_buckets;
    plan.buckets = (ZeroBucket *)calloc_check((size_t)plan.n_buckets, sizeof(ZeroBucket), "ZeRO buckets");
    /* each bucket: the run of tensors the layout puts in it */
    int64_t unit = (int64_t)world * ZERO_ALIGN, padded_offset = 0;
    for (int b = 0, first = 0; b < plan.n_buckets; b++) {
        int last = first;
        while (last < layout->n_tensors && layout->tensors[last].bucket == b)
            last++;
        if (last == first)
            FAIL("zero_plan: bucket %d of %d holds no tensor", b, plan.n_buckets);
        ZeroBucket *z = &plan.buckets[b];
        z->offset = layout->tensors[first].offset;
        z->numel = layout->tensors[last - 1].offset + layout->tensors[last - 1].numel - z->offset;
        z->padded = (z->numel + unit - 1) / unit * unit;
        z->padded_offset = padded_offset;
        z->shard = z->padded / world;
        z->group_share = z->shard; /* flat: the whole world is one shard group */
        padded_offset += z->padded;
        first = last;
    }
    plan.padded_total = padded_offset;
    return plan;
}

/* Shard groups of the hosts of g (each of g->per_host ranks): the rank at position p
 * on host h owns share p * hosts + h, inside group share p (see the top). */
static inline void zero_plan_shard_over_hosts(ZeroPlan *plan, const ProcessGroups *g)
{
    if (g->world != plan->world || g->per_host < 1)
        FAIL("zero_plan_shard_over_hosts: %d ranks in groups of %d, a plan for %d", g->world, g->per_host, plan->world);
    plan->group_size = g->per_host;
    plan->groups = g->hosts;
    for (int r = 0; r < plan->world; r++)
        plan->share_of[r] = g->position_of[r] * g->hosts + g->host_of[r];
    for (int b = 0; b < plan->n_buckets; b++)
        plan->buckets[b].group_share = plan->buckets[b].padded / g->per_host;
}

/* The model elements rank owns in bucket b: [*begin, *end) of the unpadded
 * flat buffer (empty when its share is all padding). */
static inline void zero_owned_range(const ZeroPlan *plan, int b, int rank, int64_t *begin, int64_t *end)
{
    const ZeroBucket *z = &plan->buckets[b];
    int64_t lo = (int64_t)plan->share_of[rank] * z->shard, hi = lo + z->shard;
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
    *at = z->padded_offset + (stage == 0 ? 0 : (int64_t)plan->share_of[rank] * z->shard);
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

/* The most model elements one bucket holds: what a host stages to move the weights a bucket at a time. */
static inline int64_t zero_plan_largest_bucket(const ZeroPlan *plan)
{
    int64_t most = 0;
    for (int b = 0; b < plan->n_buckets; b++)
        most = plan->buckets[b].numel > most ? plan->buckets[b].numel : most;
    return most;
}

/* The model elements of group share p of bucket b: [*begin, *end) of the unpadded
 * flat buffer (empty when it is all padding). */
static inline void zero_group_model_range(const ZeroPlan *plan, int b, int p, int64_t *begin, int64_t *end)
{
    const ZeroBucket *z = &plan->buckets[b];
    int64_t lo = (int64_t)p * z->group_share, hi = lo + z->group_share;
    *begin = z->offset + (lo < z->numel ? lo : z->numel);
    *end = z->offset + (hi < z->numel ? hi : z->numel);
}

static inline void zero_plan_free(ZeroPlan *plan)
{
    free(plan->buckets);
    free(plan->share_of);
    plan->buckets = NULL;
    plan->share_of = NULL;
}

#endif /* LLMC_ZERO_PLAN_H */
