/*
 * zero_fp8.h: ZeRO 3's per-use gathers of a decoder layer's weights as the FP8
 * codes its Linear maps compute with (--fp8 per tensor, issue 29), instead of
 * gathering bf16 and quantizing every W at each use: the same codes, half the
 * bytes on the wire, and each rank quantizes only its share.
 *
 * After the weights change, before the next gather (zero_fp8_amax_), each rank
 * takes the amax of its group share's part of every layer's Linear W, and a MAX
 * all-reduce over the shard group makes it the whole W's (a maximum is exact in
 * any order); inv = 1 / scale, as fp8_quantize computes it. Gathering layer
 * bucket b into staging slot k (zero_fp8_gather):
 *   codes[k][i] = e4m3(w_i * scale of W(i)) for i of the rank's share inside a W,
 *     all-gathered in place: one byte per element of the bucket, in the bucket's
 *     layout, so each W's codes lie at its offset as [out, in], as GEMMs read them;
 *   the rest (the norms' weights, biases: n_rest elements of a layer), bf16: the
 *     rank's own in its row of rest[G][n_rest], all-gathered, then copied into
 *     the bf16 staging slot (each from the row of the rank that owns it).
 * The W's bf16 values in the staging slot are left unwritten: linear.h reads
 * the codes through its gathered views and makes W^T's by transposing bytes,
 * the codes of W^T at the same scale. So the bits are those of quantizing the
 * gathered bf16 weights (test_llama; multi_gpu_check.sh modes across ranks).
 *
 * Memory: codes, one byte per element of a layer bucket, for each of the two
 * layer slots; rest G x n_rest bf16 and rest_at n_rest int64 (a layer's norms
 * and biases); amax a float per Linear map of the model, inv four (alignment).
 * Included at the end of zero.h, whose Zero it extends.
 */
#ifndef LLMC_ZERO_FP8_H
#define LLMC_ZERO_FP8_H

#include "llmc/kernels/fp8_quantize.h"
#include "llmc/model/linear_shapes.h"
#include "llmc/model/param_layout.h"

typedef struct {
    int64_t at, n; /* a Linear W's first element in a layer bucket, and its elements */
} ZeroFp8Map;

struct ZeroFp8 {
    ZeroFp8Map maps[LINEAR_MAPS]; /* the same in every layer bucket */
    int64_t n_rest;               /* a layer's elements outside its Linear maps */
    int64_t *rest_at;             /* device [n_rest]: where each sits in a layer bucket */
    bf16 *rest;                   /* device [shard group size][n_rest] */
    int n_slots;                  /* Linear maps of the model: layer l's map m is l * LINEAR_MAPS + m */
    float *amax;                  /* device [n_slots]: each W's amax over the group */
    float *inv;                   /* device [n_slots][4]: 1 / its scale, each 16-byte aligned for cuBLASLt */
    uint8_t *codes[ZERO_SLOTS];   /* the layer staging slots' codes, one byte per element; NULL for the others */
    int stale;                    /* the shares changed since amax was taken */
};

/* Where Linear map `map`'s W (its first tensor: q of the stacked q, k, v; gate of gate, up) starts in a layer
 * bucket. */
static inline int64_t zero_fp8_map_at(const Zero *z, const ParamLayout *layout, int map)
{
    static const int first[LINEAR_MAPS] = {LAYER_Q, LAYER_O, LAYER_GATE, LAYER_DOWN};
    return layout->tensors[param_index_layer(layout, 0, first[map])].offset - z->plan.buckets[1].offset;
}

/* Whether the layer buckets can travel as FP8 codes: NULL if so, else why not. Each W's codes must start 16-byte
 * aligned (GEMM operands) and its sides be multiples of 16 (fp8_transpose_codes). */
static inline const char *zero_fp8_unsupported(const Zero *z, const ParamLayout *layout, const LinearShape *shape)
{
    if (z->stage < 3 || z->plan.n_buckets < 3)
        return "only ZeRO stage 3 gathers weights at each use";
    for (int map = 0; map < LINEAR_MAPS; map++) {
        int64_t at = zero_fp8_map_at(z, layout, map);
        if (at % 16 || shape[map].in % 16 || shape[map].out % 16)
            return "a Linear W's codes would not start 16-byte aligned, or its sides are not multiples of 16";
    }
    return NULL;
}

/* The places of a layer bucket's elements outside f's maps, in order, into rest (when not NULL), from the gaps
 * before, between and after the maps: their count. A layer's norms and biases: a few thousand, where the bucket
 * holds hundreds of millions of elements. */
static inline int64_t zero_fp8_rest_(const struct ZeroFp8 *f, int64_t numel, int64_t *rest)
{
    ZeroFp8Map m[LINEAR_MAPS];
    memcpy(m, f->maps, sizeof(m));
    for (int i = 1; i < LINEAR_MAPS; i++) /* by where they start */
        for (int j = i; j > 0 && m[j].at < m[j - 1].at; j--) {
            ZeroFp8Map t = m[j];
            m[j] = m[j - 1], m[j - 1] = t;
        }
    int64_t n = 0, from = 0;
    for (int i = 0; i <= LINEAR_MAPS; i++) {
        int64_t to = i < LINEAR_MAPS ? m[i].at : numel;
        for (int64_t e = from; e < to; e++, n++)
            if (rest)
                rest[n] = e;
        from = i < LINEAR_MAPS ? m[i].at + m[i].n : numel;
    }
    return n;
}

/* The layer buckets gathered as FP8 codes from now on (zero_fp8_unsupported must have said yes); shape: a layer's
 * four W shapes. Allocates what the top says. */
static inline void zero_fp8_enable(Zero *z, const ParamLayout *layout, const LinearShape *shape)
{
    const ZeroBucket *bk = &z->plan.buckets[1];
    struct ZeroFp8 *f = (struct ZeroFp8 *)calloc_check(1, sizeof(*f), "ZeRO FP8 gathers");
    for (int map = 0; map < LINEAR_MAPS; map++) {
        f->maps[map].at = zero_fp8_map_at(z, layout, map);
        f->maps[map].n = shape[map].in * shape[map].out;
    }
    f->n_rest = zero_fp8_rest_(f, bk->numel, NULL);
    int64_t *rest = (int64_t *)malloc_check((size_t)(f->n_rest ? f->n_rest : 1) * sizeof(int64_t), "ZeRO FP8 gathers");
    zero_fp8_rest_(f, bk->numel, rest);
    f->rest_at = (int64_t *)cuda_malloc_named((size_t)(f->n_rest ? f->n_rest : 1) * sizeof(int64_t),
                                              "ZeRO FP8 gathers: the rest's places");
    CUDA_CHECK(cudaMemcpy(f->rest_at, rest, (size_t)f->n_rest * sizeof(int64_t), cudaMemcpyHostToDevice));
    free(rest);
    f->rest = (bf16 *)cuda_malloc_named((size_t)(z->shard->size * f->n_rest + 8) * sizeof(bf16),
                                        "ZeRO FP8 gathers: the rest");
    f->n_slots = layout->n_layer * LINEAR_MAPS;
    f->inv = (float *)cuda_malloc_named((size_t)5 * f->n_slots * sizeof(float), "ZeRO FP8 gathers: scales");
    f->amax = f->inv + 4 * f->n_slots;
    for (int s = 2; s < ZERO_SLOTS; s++)
        f->codes[s] = (uint8_t *)cuda_malloc_named((size_t)zero_slot_elements(z, s), "ZeRO FP8 gathers: codes");
    f->stale = 1;
    z->fp8 = f;
}

/* The device bytes zero_fp8_enable takes (short of the rest, a few KiB). */
static inline size_t zero_fp8_bytes(const Zero *z)
{
    return z->stage >= 3 && z->plan.n_buckets >= 3 ? (size_t)(ZERO_SLOTS - 2) * (size_t)zero_slot_elements(z, 2) : 0;
}

/* The shares changed: the scales are taken again before the next gather. */
static inline void zero_fp8_weights_changed(Zero *z)
{
    if (z->fp8)
        z->fp8->stale = 1;
}

static inline void zero_fp8_free(Zero *z)
{
    struct ZeroFp8 *f = z->fp8;
    if (!f)
        return;
    cuda_free(f->rest_at);
    cuda_free(f->rest);
    cuda_free(f->inv);
    for (int s = 0; s < ZERO_SLOTS; s++)
        cuda_free(f->codes[s]);
    free(f);
    z->fp8 = NULL;
}

/* The part of layer bucket b's map m in this rank's group share: [*lo, *hi) in the bucket's elements, empty when
 * *lo >= *hi. */
static inline void zero_fp8_part_(const Zero *z, int b, int m, int64_t *lo, int64_t *hi)
{
    int64_t gs = z->plan.buckets[b].group_share, begin = (int64_t)z->position * gs, at = z->fp8->maps[m].at;
    *lo = at > begin ? at : begin;
    *hi = at + z->fp8->maps[m].n < begin + gs ? at + z->fp8->maps[m].n : begin + gs;
}

/* Every W's amax over the shard group, and its inverse scale, on the communication stream. */
static inline void zero_fp8_amax_(Zero *z)
{
    struct ZeroFp8 *f = z->fp8;
    CUDA_CHECK(cudaMemsetAsync(f->amax, 0, (size_t)f->n_slots * sizeof(float), z->comm));
    for (int b = 1; b < z->plan.n_buckets - 1; b++) {
        const bf16 *share = z->params + z->group_at[b];
        int64_t begin = (int64_t)z->position * z->plan.buckets[b].group_share;
        for (int m = 0; m < LINEAR_MAPS; m++) {
            int64_t lo, hi;
            zero_fp8_part_(z, b, m, &lo, &hi);
            if (lo < hi)
                fp8_amax(f->amax + (b - 1) * LINEAR_MAPS + m, share + (lo - begin), hi - lo, z->comm);
        }
    }
    dist_all_reduce_max(z->shard, f->amax, f->n_slots, 4, z->comm);
    fp8_inv_scales(f->inv, 4, f->amax, f->n_slots, FP8_E4M3, z->comm);
    f->stale = 0;
}

/* row[j] = share[rest_at[j] - begin] where the rank's share [begin, begin + count) holds rest element j. */
__global__ void zero_fp8_rest_pack_kernel(bf16 *row, const bf16 *share, const int64_t *rest_at, int64_t n,
                                          int64_t begin, int64_t count)
{
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (int64_t)gridDim.x * blockDim.x) {
        int64_t a = rest_at[j] - begin;
        if (a >= 0 && a < count)
            row[j] = share[a];
    }
}

/* staging[rest_at[j]] = rest[owner][j], owner the rank whose share of group_share elements holds it. */
__global__ void zero_fp8_rest_unpack_kernel(bf16 *staging, const bf16 *rest, const int64_t *rest_at, int64_t n,
                                            int64_t group_share)
{
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (int64_t)gridDim.x * blockDim.x)
        staging[rest_at[j]] = rest[(rest_at[j] / group_share) * n + j];
}

/* Layer bucket b into staging slot `slot` as the top says, on the communication stream. */
static inline void zero_fp8_gather(Zero *z, int b, int slot)
{
    struct ZeroFp8 *f = z->fp8;
    const ZeroBucket *bk = &z->plan.buckets[b];
    cudaStream_t s = z->comm;
    if (f->stale)
        zero_fp8_amax_(z);
    const bf16 *share = z->params + z->group_at[b];
    int64_t gs = bk->group_share, begin = (int64_t)z->position * gs;
    uint8_t *codes = f->codes[slot];
    for (int m = 0; m < LINEAR_MAPS; m++) {
        int64_t lo, hi;
        zero_fp8_part_(z, b, m, &lo, &hi);
        if (lo < hi)
            fp8_quantize(codes + lo, NULL, share + (lo - begin), f->amax + (b - 1) * LINEAR_MAPS + m, hi - lo, FP8_E4M3,
                         s);
    }
    bf16 *row = f->rest + (int64_t)z->position * f->n_rest;
    if (f->n_rest > 0) {
        zero_fp8_rest_pack_kernel<<<zero_blocks(f->n_rest), ZERO_THREADS, 0, s>>>(row, share, f->rest_at, f->n_rest,
                                                                                  begin, gs);
        CUDA_CHECK_LAST();
    }
    dist_all_gather(z->shard, codes + begin, codes, gs, 1, s);
    if (f->n_rest > 0) {
        dist_all_gather(z->shard, row, f->rest, f->n_rest, 2, s);
        zero_fp8_rest_unpack_kernel<<<zero_blocks(f->n_rest), ZERO_THREADS, 0, s>>>(z->weight_staging[slot], f->rest,
                                                                                    f->rest_at, f->n_rest, gs);
        CUDA_CHECK_LAST();
    }
}

#endif /* LLMC_ZERO_FP8_H */
