/*
 * fp8_quantize.h: bf16 tensors to FP8 codes with one scale per tensor, for the
 * FP8 GEMMs of matmul.h (issue #15). For a tensor x of n elements:
 *   amax      = max_i |x_i|                                    (fp8_amax)
 *   scale     = fp8_max(format) / amax  (1 where amax is 0)    (llmc/fp8.h)
 *   codes_i   = fp8(x_i * scale), ties to even, saturating     (fp8_quantize)
 *   inv_scale = 1 / scale, what the GEMM multiplies its sums by
 * and the transposed codes of a row-major [R, C] x, codes_t[c, r] =
 * fp8(x[r, c] * scale) (fp8_quantize_transposed, which can write the plain
 * codes in the same pass), which the backward GEMMs need: Hopper's FP8
 * kernels take both operands contiguous along the summed dimension only. The codes are the ones llmc/fp8.h computes on
 * the host, bit for bit (dev/cuda/fp8_matmul_check).
 *
 * Memory: fp8_amax reads x once (16-byte loads; n a multiple of 8, x 16-byte
 * aligned) and does one float atomic max per block into amax; fp8_quantize
 * reads x and writes n bytes; the transposed one reads x and writes R * C
 * bytes (2 R * C with the plain codes too) through 128 x 32 tiles in shared
 * memory (R a multiple of 4, C of 8).
 */
#ifndef LLMC_FP8_QUANTIZE_H
#define LLMC_FP8_QUANTIZE_H

#include <cuda_fp8.h>

#include "cuda_common.h"
#include "fp8.h"
#include "profile.h"

#define FP8_AMAX_BLOCKS 528 /* 4 per SM of an H100: enough bytes in flight to stream the tensor */
#define FP8_THREADS 256

__device__ __forceinline__ uint8_t fp8_code(float x, Fp8Format f)
{
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, f == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
}

__global__ void __launch_bounds__(FP8_THREADS) fp8_amax_kernel(float *amax, const bf16 *x, int64_t n8)
{
    __shared__ float shared[WARP_SIZE];
    float m = 0.0f;
    for (int64_t i = blockIdx.x * (int64_t)FP8_THREADS + threadIdx.x; i < n8; i += (int64_t)gridDim.x * FP8_THREADS) {
        bf16x8 v = load16(x + i * 8);
        for (int k = 0; k < 8; k++)
            m = fmaxf(m, fabsf(__bfloat162float(v.v[k])));
    }
    block_max_into(amax, m, shared);
}

__global__ void __launch_bounds__(FP8_THREADS)
    fp8_quantize_kernel(uint8_t *codes, float *inv_scale, const bf16 *x, const float *amax, int64_t n8, Fp8Format f)
{
    float scale = fp8_scale_from_amax(*amax, f);
    int64_t i = blockIdx.x * (int64_t)FP8_THREADS + threadIdx.x;
    if (i == 0 && inv_scale)
        *inv_scale = 1.0f / scale;
    if (i >= n8)
        return;
    bf16x8 v = load16(x + i * 8);
    uint8_t out[8];
    for (int k = 0; k < 8; k++)
        out[k] = fp8_code(__bfloat162float(v.v[k]) * scale, f);
    *reinterpret_cast<uint2 *>(codes + i * 8) = *reinterpret_cast<const uint2 *>(out);
}

/* A tile of 128 rows x 32 columns of x per block: 16-byte loads along the rows, scaled into shared memory
 * transposed (and, when codes is not NULL, written as plain codes 8 bytes a thread), then each of the tile's 32
 * output rows written as up to 128 bytes, 4 codes per thread and store.
 * Edge tiles: rows past R and columns past C are neither read nor written (R % 4 == 0, C % 8 == 0). */
#define FP8_T_ROWS 128
#define FP8_T_COLS 32
__global__ void __launch_bounds__(FP8_THREADS)
    fp8_quantize_transposed_kernel(uint8_t *codes_t, uint8_t *codes, float *inv_scale, const bf16 *x, const float *amax,
                                   int R, int C, Fp8Format f)
{
    __shared__ __align__(16) float tile[FP8_T_COLS][FP8_T_ROWS + 4]; /* [column][row]; +4 keeps rows 16-byte aligned */
    float scale = fp8_scale_from_amax(*amax, f);
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && inv_scale)
        *inv_scale = 1.0f / scale;
    int64_t r0 = (int64_t)blockIdx.y * FP8_T_ROWS, c0 = (int64_t)blockIdx.x * FP8_T_COLS;
    for (int v = threadIdx.x; v < FP8_T_ROWS * FP8_T_COLS / 8; v += FP8_THREADS) {
        int r = v / (FP8_T_COLS / 8), c = v % (FP8_T_COLS / 8) * 8;
        if (r0 + r >= R || c0 + c >= C)
            continue;
        bf16x8 in = load16(x + (r0 + r) * C + c0 + c);
        for (int j = 0; j < 8; j++)
            tile[c + j][r] = __bfloat162float(in.v[j]) * scale;
        if (codes) {
            uint8_t out[8];
            for (int j = 0; j < 8; j++)
                out[j] = fp8_code(tile[c + j][r], f);
            *reinterpret_cast<uint2 *>(codes + (r0 + r) * C + c0 + c) = *reinterpret_cast<const uint2 *>(out);
        }
    }
    __syncthreads();
    for (int v = threadIdx.x; v < FP8_T_COLS * FP8_T_ROWS / 4; v += FP8_THREADS) {
        int c = v / (FP8_T_ROWS / 4), r = v % (FP8_T_ROWS / 4) * 4;
        if (r0 + r >= R || c0 + c >= C)
            continue;
        float4 q = *reinterpret_cast<const float4 *>(&tile[c][r]);
        uint32_t packed = (uint32_t)fp8_code(q.x, f) | (uint32_t)fp8_code(q.y, f) << 8 |
                          (uint32_t)fp8_code(q.z, f) << 16 | (uint32_t)fp8_code(q.w, f) << 24;
        *reinterpret_cast<uint32_t *>(codes_t + (c0 + c) * R + r0 + r) = packed;
    }
}

static inline void fp8_check_shape(const char *what, int64_t n, const void *x)
{
    if (n <= 0 || n % 8 != 0 || (uintptr_t)x % 16 != 0)
        FAIL("%s: %lld elements at %p: needs a positive multiple of 8 elements, 16-byte aligned", what, (long long)n,
             x);
}

/* amax[0] = max |x_i| over n elements. */
static inline void fp8_amax(float *amax, const bf16 *x, int64_t n, cudaStream_t stream)
{
    fp8_check_shape("fp8_amax", n, x);
    int64_t n8 = n / 8;
    int blocks = (int)(ceil_div(n8, FP8_THREADS) < FP8_AMAX_BLOCKS ? ceil_div(n8, FP8_THREADS) : FP8_AMAX_BLOCKS);
    profile_push(PROF_FP8, stream);
    amax_reset(amax, stream);
    fp8_amax_kernel<<<blocks, FP8_THREADS, 0, stream>>>(amax, x, n8);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

/* codes = fp8(x * scale) with the scale of amax[0]; inv_scale[0] = 1 / scale (inv_scale may be NULL). */
static inline void fp8_quantize(uint8_t *codes, float *inv_scale, const bf16 *x, const float *amax, int64_t n,
                                Fp8Format f, cudaStream_t stream)
{
    fp8_check_shape("fp8_quantize", n, x);
    profile_push(PROF_FP8, stream);
    fp8_quantize_kernel<<<ceil_div(n / 8, FP8_THREADS), FP8_THREADS, 0, stream>>>(codes, inv_scale, x, amax, n / 8, f);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

/* codes_t[C, R] = fp8(x[R, C]^T * scale) with the scale of amax[0], and codes[R, C] = fp8(x * scale) in the same
 * pass unless codes is NULL; inv_scale[0] = 1 / scale (may be NULL). R a multiple of 4, C of 8, x 16-byte, codes_t
 * 4-byte and codes 8-byte aligned. */
static inline void fp8_quantize_transposed(uint8_t *codes_t, uint8_t *codes, float *inv_scale, const bf16 *x,
                                           const float *amax, int R, int C, Fp8Format f, cudaStream_t stream)
{
    if (R <= 0 || C <= 0 || R % 4 != 0 || C % 8 != 0 || (uintptr_t)x % 16 || (uintptr_t)codes_t % 4 ||
        (uintptr_t)codes % 8)
        FAIL("fp8_quantize_transposed: x [%d, %d] needs rows a multiple of 4 and columns of 8, x 16-byte, "
             "codes_t 4-byte and codes 8-byte aligned",
             R, C);
    profile_push(PROF_FP8, stream);
    dim3 grid(ceil_div(C, FP8_T_COLS), ceil_div(R, FP8_T_ROWS));
    fp8_quantize_transposed_kernel<<<grid, FP8_THREADS, 0, stream>>>(codes_t, codes, inv_scale, x, amax, R, C, f);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

#endif /* LLMC_FP8_QUANTIZE_H */
