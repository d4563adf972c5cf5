/*
 * block_codec.h: a flat bf16 buffer as one-byte codes and an fp32 scale per
 * block of BLOCK_CODEC_SIZE (128) values, for moving weights and gradients
 * between GPUs in about half the bytes (issue 29: ZeRO++'s quantized weight
 * gather qwZ and quantized gradient reduction qgZ). For block b with amax_b,
 * its values' largest magnitude:
 *
 *   int8  scale_b = amax_b / 127   code_i = rint(x_i / scale_b)   x'_i = code_i * scale_b
 *   e4m3  scale_b = amax_b / 448   code_i = e4m3(x_i / scale_b)   x'_i = float(code_i) * scale_b
 *
 * (rint and e4m3 round to nearest, ties to even; e4m3 saturates: the GPU's
 * conversion instruction, and fp8.h's exact one on the host.) A
 * block of zeros has scale 0 and decodes to zeros; a block holding a value
 * that is not finite gets a NaN scale and decodes to NaNs, so the trainer's
 * non-finite guard still sees it. Error per value: int8 at most half a step,
 * scale_b / 2 = amax_b / 254; e4m3 at most 2^-4 of |x_i| (3 mantissa bits)
 * where x_i / scale_b is normal, else half its smallest step, scale_b x 2^-10;
 * each plus the fp32 roundings of the scale, quotient and product (2^-22 |x_i|).
 * The last block of a buffer may be short. Every operation is IEEE (division,
 * product, round to nearest), so the host functions here give the bits the
 * kernels give (dev/cuda/block_codec_check compares them).
 *
 * On the device, a piece of n values travels as one message: its codes, then
 * its scales from the next 16-byte boundary, block_codec_message_bytes(n) in
 * all, so that one exchange (one NCCL call) moves both and the pieces of
 * several ranks lie side by side, each at a multiple of the message size. The
 * launchers take `pieces` such messages at once (a grid row each).
 *
 * A reduction of several ranks' messages (block_decode_sum) adds their decoded
 * values in fp32 in rank order and rounds the sum to bf16 once (added to the
 * bf16 already there, where asked).
 *
 * Memory: encode reads 2 bytes per value and writes 1, plus 4 per block;
 * decode reads those and writes 2 (bf16); the sum reads 1 + 4/128 per value of
 * each rank and writes 2 (and reads 2 where it adds). The host's reference
 * functions take codes and scales as separate arrays of n and ceil(n / 128).
 */
#ifndef LLMC_BLOCK_CODEC_H
#define LLMC_BLOCK_CODEC_H

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

#include "llmc/common/cuda_common.h"
#include "llmc/kernels/fp8.h"
#include "llmc/kernels/master_weights.h"

#define BLOCK_CODEC_SIZE 128
#define BLOCK_CODEC_WARPS 8 /* blocks per CUDA block: a warp per codec block, 4 values per lane */

typedef enum { BLOCK_CODEC_INT8 = 0, BLOCK_CODEC_E4M3 = 1 } BlockCodec;

__host__ __device__ static inline int64_t block_codec_blocks(int64_t n)
{
    return (n + BLOCK_CODEC_SIZE - 1) / BLOCK_CODEC_SIZE;
}

/* Where a message's scales start, and its size: both multiples of 16 bytes. */
__host__ __device__ static inline int64_t block_codec_scales_at(int64_t n)
{
    return (n + 15) / 16 * 16;
}

__host__ __device__ static inline int64_t block_codec_message_bytes(int64_t n)
{
    return (block_codec_scales_at(n) + block_codec_blocks(n) * 4 + 15) / 16 * 16;
}

/* The most values, in whole blocks, whose message fits in `bytes` (0 if not one block). */
static inline int64_t block_codec_message_values(int64_t bytes)
{
    int64_t n = bytes / (BLOCK_CODEC_SIZE + 4) * BLOCK_CODEC_SIZE; /* 4 bytes of scale a block, before padding */
    while (n > 0 && block_codec_message_bytes(n) > bytes)
        n -= BLOCK_CODEC_SIZE;
    while (block_codec_message_bytes(n + BLOCK_CODEC_SIZE) <= bytes)
        n += BLOCK_CODEC_SIZE;
    return n;
}

/* The largest code's magnitude of a codec. */
__host__ __device__ static inline float block_codec_max(int codec)
{
    return codec == BLOCK_CODEC_E4M3 ? 448.0f : 127.0f;
}

/* The scale of a block from its amax (NaN when a value was not finite). */
__host__ __device__ static inline float block_codec_scale(float amax, int bad, int codec)
{
#ifdef __CUDA_ARCH__
    return bad ? __int_as_float(0x7fc00000) : __fdiv_rn(amax, block_codec_max(codec));
#else
    return bad ? NAN : amax / block_codec_max(codec);
#endif
}

/* One value's code, given its block's scale (finite and not 0). */
__host__ __device__ static inline uint8_t block_codec_encode1(float x, float scale, int codec)
{
#ifdef __CUDA_ARCH__
    float q = __fdiv_rn(x, scale);
    if (codec == BLOCK_CODEC_E4M3)
        return (uint8_t)__nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3);
    int c = __float2int_rn(q);
#else
    float q = x / scale;
    if (codec == BLOCK_CODEC_E4M3)
        return fp8_from_float(q, FP8_E4M3);
    int c = (int)rintf(q);
#endif
    c = c > 127 ? 127 : c < -127 ? -127 : c;
    return (uint8_t)(int8_t)c;
}

/* One value back from its code and its block's scale. */
__host__ __device__ static inline float block_codec_decode1(uint8_t code, float scale, int codec)
{
#ifdef __CUDA_ARCH__
    float v = codec == BLOCK_CODEC_E4M3 ? __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)))
                                        : (float)(int8_t)code;
    return __fmul_rn(v, scale);
#else
    float v = codec == BLOCK_CODEC_E4M3 ? fp8_to_float(code, FP8_E4M3) : (float)(int8_t)code;
    return v * scale;
#endif
}

/* ---- the host's codec, the kernels' reference ---- */

static inline void block_encode_host(uint8_t *codes, float *scales, const uint16_t *x, int64_t n, int codec)
{
    for (int64_t b = 0; b < block_codec_blocks(n); b++) {
        int64_t lo = b * BLOCK_CODEC_SIZE, hi = lo + BLOCK_CODEC_SIZE < n ? lo + BLOCK_CODEC_SIZE : n;
        float amax = 0.0f;
        int bad = 0;
        for (int64_t i = lo; i < hi; i++) {
            float v = master_bits_float((uint32_t)x[i] << 16);
            bad |= !isfinite(v);
            amax = fmaxf(amax, fabsf(v));
        }
        float scale = block_codec_scale(amax, bad, codec);
        scales[b] = scale;
        for (int64_t i = lo; i < hi; i++)
            codes[i] =
                (bad || scale == 0.0f) ? 0 : block_codec_encode1(master_bits_float((uint32_t)x[i] << 16), scale, codec);
    }
}

/* Decoded values as floats (the kernel's bf16 output is their rounding). */
static inline void block_decode_host(float *out, const uint8_t *codes, const float *scales, int64_t n, int codec)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = block_codec_decode1(codes[i], scales[i / BLOCK_CODEC_SIZE], codec);
}

/* ---- kernels ---- */

/* Piece blockIdx.y: values x + y x_stride, its message at msgs + y msg_bytes. A warp per codec block: lane l
 * holds values 4 l .. 4 l + 3 of it (zeros past n). */
__global__ void block_encode_kernel(uint8_t *__restrict__ msgs, int64_t msg_bytes, const bf16 *__restrict__ x,
                                    int64_t x_stride, int64_t n, int codec)
{
    int lane = threadIdx.x % 32;
    int64_t b = (int64_t)blockIdx.x * BLOCK_CODEC_WARPS + threadIdx.x / 32;
    if (b >= block_codec_blocks(n))
        return;
    uint8_t *codes = msgs + blockIdx.y * msg_bytes;
    float *scales = reinterpret_cast<float *>(codes + block_codec_scales_at(n));
    x += blockIdx.y * x_stride;
    int64_t at = b * BLOCK_CODEC_SIZE + 4 * lane;
    float v[4];
    float amax = 0.0f;
    int bad = 0;
    for (int k = 0; k < 4; k++) {
        v[k] = at + k < n ? __bfloat162float(x[at + k]) : 0.0f;
        bad |= !isfinite(v[k]);
        amax = fmaxf(amax, fabsf(v[k]));
    }
    for (int off = 16; off > 0; off /= 2) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
        bad |= __shfl_xor_sync(0xffffffffu, bad, off);
    }
    float scale = block_codec_scale(amax, bad, codec);
    if (lane == 0)
        scales[b] = scale;
    for (int k = 0; k < 4; k++)
        if (at + k < n)
            codes[at + k] = (bad || scale == 0.0f) ? 0 : block_codec_encode1(v[k], scale, codec);
}

/* Piece blockIdx.y: its message at msgs + y msg_bytes, its values to out + y out_stride. */
__global__ void block_decode_kernel(bf16 *__restrict__ out, int64_t out_stride, const uint8_t *__restrict__ msgs,
                                    int64_t msg_bytes, int64_t n, int codec)
{
    const uint8_t *codes = msgs + blockIdx.y * msg_bytes;
    const float *scales = reinterpret_cast<const float *>(codes + block_codec_scales_at(n));
    out += blockIdx.y * out_stride;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(block_codec_decode1(codes[i], scales[i / BLOCK_CODEC_SIZE], codec));
}

/* 8 values a thread: out[i] = bf16((add ? out[i] : 0) + the sum over r of rank r's decoded value i), the sum in fp32
 * from 0 in rank order; rank r's message at msgs + r msg_bytes, rank own's at own_msg. */
__global__ void block_decode_sum_kernel(bf16 *__restrict__ out, const uint8_t *__restrict__ msgs, int64_t msg_bytes,
                                        const uint8_t *__restrict__ own_msg, int own, int64_t n, int ranks, int add,
                                        int codec)
{
    int64_t scales_at = block_codec_scales_at(n);
    for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < n;
         i += (int64_t)gridDim.x * blockDim.x * 8) {
        float sum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (int r = 0; r < ranks; r++) {
            const uint8_t *msg = r == own ? own_msg : msgs + r * msg_bytes;
            uint2 c = *reinterpret_cast<const uint2 *>(msg + i);
            const uint8_t *c8 = reinterpret_cast<const uint8_t *>(&c);
            float scale = reinterpret_cast<const float *>(msg + scales_at)[i / BLOCK_CODEC_SIZE];
#pragma unroll
            for (int k = 0; k < 8; k++)
                sum[k] += block_codec_decode1(c8[k], scale, codec);
        }
        bf16x8 o;
        if (add)
            o = load16(out + i);
#pragma unroll
        for (int k = 0; k < 8; k++)
            o.v[k] = __float2bfloat16((add ? __bfloat162float(o.v[k]) : 0.0f) + sum[k]);
        store16(out + i, o);
    }
}

/* ---- launchers ---- */

static inline void block_codec_check_messages_(const char *who, const void *msgs, int64_t msg_bytes, int64_t n,
                                               int pieces)
{
    if (n < 0 || pieces < 1 || pieces > 65535 || (uintptr_t)msgs % 16 || msg_bytes % 16 ||
        msg_bytes < block_codec_message_bytes(n) ||
        (block_codec_blocks(n) + BLOCK_CODEC_WARPS - 1) / BLOCK_CODEC_WARPS > INT32_MAX)
        FAIL("%s: %d pieces of %lld values, messages of %lld bytes at %p: pieces in [1, 65535], messages 16-byte "
             "aligned, at least block_codec_message_bytes(n) = %lld apart",
             who, pieces, (long long)n, (long long)msg_bytes, msgs, (long long)block_codec_message_bytes(n));
}

/* `pieces` pieces of n values, piece p at x + p x_stride, each encoded into its message at msgs + p msg_bytes. */
static inline void block_encode(uint8_t *msgs, int64_t msg_bytes, const bf16 *x, int64_t x_stride, int64_t n,
                                int pieces, BlockCodec codec, cudaStream_t stream)
{
    block_codec_check_messages_("block_encode", msgs, msg_bytes, n, pieces);
    if (n == 0)
        return;
    int64_t blocks = (block_codec_blocks(n) + BLOCK_CODEC_WARPS - 1) / BLOCK_CODEC_WARPS;
    block_encode_kernel<<<dim3((unsigned)blocks, (unsigned)pieces), 32 * BLOCK_CODEC_WARPS, 0, stream>>>(
        msgs, msg_bytes, x, x_stride, n, (int)codec);
    CUDA_CHECK_LAST();
}

/* The values (bf16, rounded to nearest even) of `pieces` messages at msgs + p msg_bytes, to out + p out_stride. */
static inline void block_decode(bf16 *out, int64_t out_stride, const uint8_t *msgs, int64_t msg_bytes, int64_t n,
                                int pieces, BlockCodec codec, cudaStream_t stream)
{
    block_codec_check_messages_("block_decode", msgs, msg_bytes, n, pieces);
    if (n == 0)
        return;
    int64_t grid = (n + 255) / 256;
    block_decode_kernel<<<dim3((unsigned)(grid > 4096 ? 4096 : grid), (unsigned)pieces), 256, 0, stream>>>(
        out, out_stride, msgs, msg_bytes, n, (int)codec);
    CUDA_CHECK_LAST();
}

/* out[n] (bf16) = the sum of `ranks` ranks' decoded messages, rank r's at msgs + r msg_bytes but rank own's at
 * own_msg (an exchange leaves the caller's own piece where it was encoded), added in fp32 in rank order and rounded
 * once, to the bf16 there where add (see the top). n a multiple of the codec's block, out 16-byte aligned. */
static inline void block_decode_sum(bf16 *out, const uint8_t *msgs, int64_t msg_bytes, const uint8_t *own_msg, int own,
                                    int64_t n, int ranks, int add, BlockCodec codec, cudaStream_t stream)
{
    block_codec_check_messages_("block_decode_sum", msgs, msg_bytes, n, ranks);
    if (n % BLOCK_CODEC_SIZE || (uintptr_t)out % 16 || (uintptr_t)own_msg % 16 || own < 0 || own >= ranks)
        FAIL("block_decode_sum: %lld values (a multiple of %d), out %p and own message %p (16-byte aligned), "
             "own rank %d of %d",
             (long long)n, BLOCK_CODEC_SIZE, (void *)out, (const void *)own_msg, own, ranks);
    if (n == 0)
        return;
    int64_t grid = (n / 8 + 255) / 256;
    block_decode_sum_kernel<<<(int)(grid > 4096 ? 4096 : grid), 256, 0, stream>>>(out, msgs, msg_bytes, own_msg, own, n,
                                                                                  ranks, add, (int)codec);
    CUDA_CHECK_LAST();
}

#endif /* LLMC_BLOCK_CODEC_H */
