/*
 * delta_codec.h: new bf16 weights as their change from the old ones, exactly,
 * for ZeRO 1 and 2's gather of the weights AdamW just updated (zero.h,
 * --update-gather delta): every rank holds the old weights bit for bit, so a
 * rank's share can travel as, per weight, the change of its bf16 bit pattern
 *
 *   d = bits(new) - bits(old)   code = d where -127 <= d <= 127, else DELTA_ESCAPE (-128)
 *
 * in one signed byte, and each escaped weight as an entry (index << 16 | bits(new))
 * of an escape list, 8 bytes. Decoding adds the code to the old bits (mod 2^16:
 * exact, whatever the signs) and writes the escapes' bits: the new weights bit for
 * bit. AdamW makes the codes (adamw.h, where it reads the old weight anyway);
 * delta_escapes lists the escapes from the codes and the new weights. An escape
 * list is entry 0, the count (raised atomically: the entries' order varies from
 * run to run, the decoded weights do not), then up to `capacity` entries; a count
 * above the capacity means the list is short and the share must travel whole.
 *
 * Memory: the codes, 1 byte a weight, written by AdamW; delta_escapes reads them
 * and each escaped weight; delta_decode reads the codes of the other ranks' shares
 * and reads and writes their weights (1 + 2 + 2 bytes a weight), then the escapes.
 * How many escape (dev/bench/delta_gather_estimate.py): 0.3-4% at lr 1e-4 to 3e-4.
 */
#ifndef LLMC_DELTA_CODEC_H
#define LLMC_DELTA_CODEC_H

#include <stdint.h>

#include "llmc/common/cuda_common.h"

#define DELTA_ESCAPE (-128)
#define DELTA_THREADS 256
#define DELTA_MAX_BLOCKS 4096

/* The code of a weight whose bf16 bits went from old_bits to new_bits. */
__host__ __device__ static inline int8_t delta_code(uint16_t old_bits, uint16_t new_bits)
{
    int d = (int)new_bits - (int)old_bits;
    return (int8_t)(d >= -127 && d <= 127 ? d : DELTA_ESCAPE);
}

/* An escape list's entry: the weight's index in its share and its new bits. */
__host__ __device__ static inline unsigned long long delta_escape_entry(int64_t index, uint16_t bits)
{
    return (unsigned long long)index << 16 | bits;
}

__global__ void delta_escapes_kernel(const int8_t *__restrict__ codes, const uint16_t *__restrict__ bits, int64_t n,
                                     unsigned long long *__restrict__ list, int64_t capacity)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        if (codes[i] != DELTA_ESCAPE)
            continue;
        unsigned long long slot = atomicAdd(list, 1ull);
        if ((int64_t)slot < capacity)
            list[1 + slot] = delta_escape_entry(i, bits[i]);
    }
}

/* full[r * share + i] += codes[r * share + i] for every rank r but self, 8 weights a thread (share a multiple of 8). */
__global__ void delta_decode_kernel(uint16_t *__restrict__ full, const int8_t *__restrict__ codes, int64_t share,
                                    int ranks, int self)
{
    int64_t n8 = share / 8 * ranks;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        if (i * 8 / share == self)
            continue;
        uint2 c = *reinterpret_cast<const uint2 *>(codes + i * 8);
        uint4 w = *reinterpret_cast<const uint4 *>(full + i * 8);
        const int8_t *c8 = reinterpret_cast<const int8_t *>(&c);
        uint16_t *w8 = reinterpret_cast<uint16_t *>(&w);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (c8[k] != DELTA_ESCAPE)
                w8[k] = (uint16_t)(w8[k] + c8[k]);
        *reinterpret_cast<uint4 *>(full + i * 8) = w;
    }
}

/* The escapes of every rank but self: lists[r * stride] holds rank r's (count, entries), count <= stride - 1. */
__global__ void delta_escapes_apply_kernel(uint16_t *__restrict__ full, const unsigned long long *__restrict__ lists,
                                           int64_t stride, int64_t share, int ranks, int self)
{
    int64_t n = (stride - 1) * ranks;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int r = (int)(i / (stride - 1));
        int64_t j = i % (stride - 1);
        if (r == self || j >= (int64_t)lists[r * stride])
            continue;
        unsigned long long e = lists[r * stride + 1 + j];
        full[r * share + (int64_t)(e >> 16)] = (uint16_t)(e & 0xffff);
    }
}

static inline int delta_blocks(int64_t work)
{
    int64_t b = (work + DELTA_THREADS - 1) / DELTA_THREADS;
    return (int)(b < 1 ? 1 : b > DELTA_MAX_BLOCKS ? DELTA_MAX_BLOCKS : b);
}

/* list[0] = how many of codes[n] escape, list[1 ..] their entries (the first `capacity` found), from the new
 * weights[n] (bf16). */
static inline void delta_escapes(const int8_t *codes, const bf16 *weights, int64_t n, unsigned long long *list,
                                 int64_t capacity, cudaStream_t stream)
{
    CUDA_CHECK(cudaMemsetAsync(list, 0, sizeof(unsigned long long), stream));
    delta_escapes_kernel<<<delta_blocks(n), DELTA_THREADS, 0, stream>>>(codes, (const uint16_t *)weights, n, list,
                                                                        capacity);
    CUDA_CHECK_LAST();
}

/* full[ranks * share] (bf16) from the old weights there: each rank r's but self's share changed by its codes
 * (codes[ranks * share]) and its escape list (lists + r * stride, each count at most stride - 1). share a multiple
 * of 8; full and codes 16- and 8-byte aligned. */
static inline void delta_decode(bf16 *full, const int8_t *codes, const unsigned long long *lists, int64_t stride,
                                int64_t share, int ranks, int self, cudaStream_t stream)
{
    if (share % 8 || (uintptr_t)full % 16 || (uintptr_t)codes % 8 || stride < 1)
        FAIL("delta_decode: share %lld (a multiple of 8), full %p (16-byte aligned), codes %p (8), stride %lld (>= 1)",
             (long long)share, (void *)full, (const void *)codes, (long long)stride);
    delta_decode_kernel<<<delta_blocks(share / 8 * ranks), DELTA_THREADS, 0, stream>>>((uint16_t *)full, codes, share,
                                                                                       ranks, self);
    CUDA_CHECK_LAST();
    if (stride > 1) {
        delta_escapes_apply_kernel<<<delta_blocks((stride - 1) * ranks), DELTA_THREADS, 0, stream>>>(
            (uint16_t *)full, lists, stride, share, ranks, self);
        CUDA_CHECK_LAST();
    }
}

#endif /* LLMC_DELTA_CODEC_H */
