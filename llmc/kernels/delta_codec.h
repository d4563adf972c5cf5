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
 * Packed, most codes are small: a share travels as a message of
 *   nibbles[n / 2]      each code in [-7, 7] as a 4-bit two's complement nibble
 *                       (weight i in byte i / 2, the low nibble for even i), the
 *                       rest as DELTA_WIDE (-8);
 *   offsets[chunks]     uint32 per chunk of DELTA_CHUNK weights: where its wide
 *                       codes start in the wide stream (padded to 16 bytes);
 *   wide[room]          the codes marked wide, escapes included, in weight order
 * (delta_packed_bytes). delta_wide_offsets counts the wide codes per chunk and
 * scans the counts (the total sizes the wide stream, which all ranks of a
 * gather must agree on); delta_pack writes the message, delta_unpack adds every
 * rank but self's message to the old weights; the escape lists stay as above.
 *
 * Memory: the codes, 1 byte a weight, written by AdamW; delta_escapes reads them
 * and each escaped weight; delta_decode reads the codes of the other ranks' shares
 * and reads and writes their weights (1 + 2 + 2 bytes a weight), then the escapes.
 * Packed: delta_wide_offsets reads the codes, delta_pack reads them again and
 * writes half a byte a weight and the wide codes; delta_unpack reads half a
 * byte, the wide codes and 2 + 2 bytes a weight of the other ranks' shares.
 * How many escape (dev/bench/delta_gather_estimate.py): 0.3-4% at lr 1e-4 to 3e-4;
 * how many are wide: about 17% at lr 3e-4 and weights of std 0.02.
 */
#ifndef LLMC_DELTA_CODEC_H
#define LLMC_DELTA_CODEC_H

#include <stdint.h>

#include <cub/block/block_scan.cuh>

#include "llmc/common/cuda_common.h"

#define DELTA_ESCAPE (-128)
#define DELTA_WIDE (-8)
#define DELTA_PACK_THREADS 256
#define DELTA_PACK_PER_THREAD 16
#define DELTA_CHUNK (DELTA_PACK_THREADS * DELTA_PACK_PER_THREAD)
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

/* Packed messages (see the top): a block of DELTA_PACK_THREADS threads takes a chunk, DELTA_PACK_PER_THREAD weights
 * a thread, and finds where each thread's wide codes go by a scan over the block. */
typedef cub::BlockScan<int, DELTA_PACK_THREADS> DeltaBlockScan;

/* Whether a change code travels in the wide stream rather than as a nibble. */
__host__ __device__ static inline int delta_is_wide(int code)
{
    return code < -7 || code > 7;
}

__host__ __device__ static inline int64_t delta_chunks(int64_t n)
{
    return (n + DELTA_CHUNK - 1) / DELTA_CHUNK;
}

/* Where a packed message of n weights keeps its chunks' offsets and its wide codes, and its size with room for
 * `wide` wide codes; every part 16-byte aligned (n a multiple of 32). */
__host__ __device__ static inline int64_t delta_packed_wide_at(int64_t n)
{
    return n / 2 + (delta_chunks(n) * 4 + 15) / 16 * 16;
}
__host__ __device__ static inline int64_t delta_packed_bytes(int64_t n, int64_t wide)
{
    return delta_packed_wide_at(n) + (wide + 15) / 16 * 16;
}

/* This thread's codes (none past n) into *raw, and how many of them are wide. */
__device__ static inline int delta_load_codes_(const int8_t *codes, int64_t n, int64_t i0, uint4 *raw)
{
    *raw = i0 < n ? *reinterpret_cast<const uint4 *>(codes + i0) : make_uint4(0, 0, 0, 0);
    const int8_t *c = reinterpret_cast<const int8_t *>(raw);
    int wide = 0;
#pragma unroll
    for (int k = 0; k < DELTA_PACK_PER_THREAD; k++)
        wide += delta_is_wide(c[k]);
    return wide;
}

__device__ static inline int64_t delta_first_weight_()
{
    return ((int64_t)blockIdx.x * DELTA_PACK_THREADS + threadIdx.x) * DELTA_PACK_PER_THREAD;
}

__global__ void delta_wide_count_kernel(const int8_t *__restrict__ codes, int64_t n, uint32_t *__restrict__ counts)
{
    __shared__ typename DeltaBlockScan::TempStorage scan;
    uint4 raw;
    int before, total;
    DeltaBlockScan(scan).ExclusiveSum(delta_load_codes_(codes, n, delta_first_weight_(), &raw), before, total);
    if (threadIdx.x == 0)
        counts[blockIdx.x] = (uint32_t)total;
}

/* One block: offsets[chunks], the counts, become their exclusive prefix sums; *total the sum of all. */
__global__ void delta_wide_scan_kernel(uint32_t *offsets, int64_t chunks, unsigned long long *total)
{
    __shared__ typename DeltaBlockScan::TempStorage scan;
    long long carry = 0;
    for (int64_t c0 = 0; c0 < chunks; c0 += DELTA_PACK_THREADS) {
        int64_t c = c0 + threadIdx.x;
        int before, tile;
        DeltaBlockScan(scan).ExclusiveSum(c < chunks ? (int)offsets[c] : 0, before, tile);
        if (c < chunks)
            offsets[c] = (uint32_t)(carry + before);
        carry += tile;
        __syncthreads(); /* the scan's storage is used again */
    }
    if (threadIdx.x == 0)
        *total = (unsigned long long)carry;
}

__global__ void delta_pack_kernel(const int8_t *__restrict__ codes, int64_t n, const uint32_t *__restrict__ offsets,
                                  uint8_t *__restrict__ msg)
{
    __shared__ typename DeltaBlockScan::TempStorage scan;
    int64_t i0 = delta_first_weight_();
    uint4 raw;
    int before, total;
    DeltaBlockScan(scan).ExclusiveSum(delta_load_codes_(codes, n, i0, &raw), before, total);
    if (threadIdx.x == 0)
        reinterpret_cast<uint32_t *>(msg + n / 2)[blockIdx.x] = offsets[blockIdx.x];
    if (i0 >= n)
        return;
    const int8_t *c = reinterpret_cast<const int8_t *>(&raw);
    uint8_t *wide = msg + delta_packed_wide_at(n);
    int64_t w = (int64_t)offsets[blockIdx.x] + before;
    uint2 packed = make_uint2(0, 0);
    uint8_t *nibbles = reinterpret_cast<uint8_t *>(&packed);
#pragma unroll
    for (int k = 0; k < DELTA_PACK_PER_THREAD; k++) {
        int nibble = c[k];
        if (delta_is_wide(c[k])) {
            wide[w++] = (uint8_t)c[k];
            nibble = DELTA_WIDE;
        }
        nibbles[k / 2] |= (uint8_t)((nibble & 0xf) << (k % 2 * 4));
    }
    *reinterpret_cast<uint2 *>(msg + i0 / 2) = packed;
}

/* The nibble of weight k of a thread's eight bytes, sign-extended. */
__device__ static inline int delta_nibble_(const uint8_t *nibbles, int k)
{
    return ((nibbles[k / 2] >> (k % 2 * 4) & 0xf) ^ 8) - 8;
}

/* Block (chunk, r): rank r's message (msgs + r * msg_bytes) added to its share of full, unless r is self. */
__global__ void delta_unpack_kernel(uint16_t *__restrict__ full, const uint8_t *__restrict__ msgs, int64_t msg_bytes,
                                    int64_t share, int self)
{
    __shared__ typename DeltaBlockScan::TempStorage scan;
    int r = blockIdx.y;
    if (r == self) /* the whole block: AdamW's share is new already */
        return;
    const uint8_t *msg = msgs + r * msg_bytes;
    int64_t i0 = delta_first_weight_();
    uint2 packed = i0 < share ? *reinterpret_cast<const uint2 *>(msg + i0 / 2) : make_uint2(0, 0);
    const uint8_t *nibbles = reinterpret_cast<const uint8_t *>(&packed);
    int wide_here = 0, before, total;
#pragma unroll
    for (int k = 0; k < DELTA_PACK_PER_THREAD; k++)
        wide_here += i0 < share && delta_nibble_(nibbles, k) == DELTA_WIDE;
    DeltaBlockScan(scan).ExclusiveSum(wide_here, before, total);
    if (i0 >= share)
        return;
    const int8_t *wide = reinterpret_cast<const int8_t *>(msg + delta_packed_wide_at(share));
    int64_t w = (int64_t) reinterpret_cast<const uint32_t *>(msg + share / 2)[blockIdx.x] + before;
    uint4 *at = reinterpret_cast<uint4 *>(full + r * share + i0);
    uint4 weights[2] = {at[0], at[1]};
    uint16_t *w16 = reinterpret_cast<uint16_t *>(weights);
#pragma unroll
    for (int k = 0; k < DELTA_PACK_PER_THREAD; k++) {
        int d = delta_nibble_(nibbles, k);
        if (d == DELTA_WIDE)
            d = wide[w++];
        if (d != DELTA_ESCAPE) /* an escape's bits come from its list */
            w16[k] = (uint16_t)(w16[k] + d);
    }
    at[0] = weights[0];
    at[1] = weights[1];
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

static inline void delta_escapes_apply_(bf16 *full, const unsigned long long *lists, int64_t stride, int64_t share,
                                        int ranks, int self, cudaStream_t stream)
{
    if (stride > 1) {
        delta_escapes_apply_kernel<<<delta_blocks((stride - 1) * ranks), DELTA_THREADS, 0, stream>>>(
            (uint16_t *)full, lists, stride, share, ranks, self);
        CUDA_CHECK_LAST();
    }
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
    delta_escapes_apply_(full, lists, stride, share, ranks, self, stream);
}

/* The packed form's sizes and alignment (see the top), or a failure naming the caller. */
static inline void delta_packed_check_(const char *who, int64_t n, const void *a, const void *b)
{
    if (n % 32 || n <= 0 || n >= ((int64_t)1 << 32) || (uintptr_t)a % 16 || (uintptr_t)b % 16)
        FAIL("%s: %lld weights (a multiple of 32 below 2^32), pointers %p and %p (16-byte aligned)", who, (long long)n,
             a, b);
}

/* offsets[delta_chunks(n)]: where each chunk of codes[n] starts in a packed message's wide stream; *total (on the
 * device) how many wide codes there are in all. */
static inline void delta_wide_offsets(const int8_t *codes, int64_t n, uint32_t *offsets, unsigned long long *total,
                                      cudaStream_t stream)
{
    delta_packed_check_("delta_wide_offsets", n, codes, offsets);
    delta_wide_count_kernel<<<(unsigned)delta_chunks(n), DELTA_PACK_THREADS, 0, stream>>>(codes, n, offsets);
    CUDA_CHECK_LAST();
    delta_wide_scan_kernel<<<1, DELTA_PACK_THREADS, 0, stream>>>(offsets, delta_chunks(n), total);
    CUDA_CHECK_LAST();
}

/* msg: codes[n] packed (see the top), with the offsets delta_wide_offsets made; msg has delta_packed_bytes(n, wide)
 * bytes for at least these codes' wide ones. */
static inline void delta_pack(const int8_t *codes, int64_t n, const uint32_t *offsets, void *msg, cudaStream_t stream)
{
    delta_packed_check_("delta_pack", n, codes, msg);
    delta_pack_kernel<<<(unsigned)delta_chunks(n), DELTA_PACK_THREADS, 0, stream>>>(codes, n, offsets, (uint8_t *)msg);
    CUDA_CHECK_LAST();
}

/* delta_decode from packed messages: each rank r's but self's share of full[ranks * share] changed by its message
 * (msgs + r * msg_bytes, msg_bytes a multiple of 16) and its escape list (as delta_decode's). */
static inline void delta_unpack(bf16 *full, const void *msgs, int64_t msg_bytes, const unsigned long long *lists,
                                int64_t stride, int64_t share, int ranks, int self, cudaStream_t stream)
{
    delta_packed_check_("delta_unpack", share, full, msgs);
    if (msg_bytes % 16 || msg_bytes < delta_packed_bytes(share, 0) || stride < 1 || ranks > 65535)
        FAIL("delta_unpack: messages of %lld bytes (a multiple of 16, at least %lld), stride %lld (>= 1), %d ranks "
             "(at most 65535)",
             (long long)msg_bytes, (long long)delta_packed_bytes(share, 0), (long long)stride, ranks);
    dim3 grid((unsigned)delta_chunks(share), (unsigned)ranks);
    delta_unpack_kernel<<<grid, DELTA_PACK_THREADS, 0, stream>>>((uint16_t *)full, (const uint8_t *)msgs, msg_bytes,
                                                                 share, self);
    CUDA_CHECK_LAST();
    delta_escapes_apply_(full, lists, stride, share, ranks, self, stream);
}

#endif /* LLMC_DELTA_CODEC_H */
