/*
 * fp8_quantize.h: bf16 tensors to FP8 codes and their dequantisation scales,
 * for the FP8 GEMMs of matmul.h (issue #15). For a block b of a tensor x (the
 * whole tensor, a row, a 1 x 128 or a 128 x 128 block: fp8.h's recipes):
 *   amax_b    = max |x_i| over the block
 *   scale_b   = fp8_max(format) / amax_b  (1 where amax_b is 0)  (llmc/kernels/fp8.h)
 *   codes_i   = fp8(x_i * scale_b), ties to even, saturating
 *   inv_b     = 1 / scale_b, what the GEMM multiplies its sums by
 * The GEMM sums over K, the dimension along which an operand [R, K] is stored
 * contiguous, so x and its transpose (which the backward GEMMs need: Hopper's
 * FP8 kernels take both operands contiguous along the summed dimension only)
 * have blocks of their own except per tensor and per 128 x 128 block. Where
 * cuBLASLt reads operand [R, K]'s scales (FP8_SCALE_*; measured on the H100,
 * cuBLAS 13.1, by dev/cuda/fp8_matmul_check):
 *   tensor      inv[0]
 *   row         inv[r]                                    (OUTER_VEC_32F)
 *   1 x 128     inv[(k / 128) * R + r]: rows adjacent      (VEC128_32F)
 *   128 x 128   inv[(r / 128) * P + k / 128]               (BLK128x128_32F)
 *               with P = ceil(K / 128) rounded up to a multiple of 4: K blocks adjacent, each row of blocks
 *               16-byte aligned (with P = ceil(K / 128) GEMMs with 3 or 5 K-blocks read wrong scales)
 * The kernels:
 *   fp8_amax                 amax of a whole tensor
 *   fp8_amax_blocks          amax of each column, or of each 128 x 128 block
 *   fp8_quantize             codes at one scale
 *   fp8_quantize_rows        codes and scales per row, or per 1 x 128 block
 *   fp8_quantize_transposed  codes_t[c, r] = fp8(x[r, c] * scale) with the scale of the whole tensor, of column c, of
 *                            column c's 128 rows in the tile (found here), or of the 128 x 128 block; the plain codes
 *                            in the same pass where the two layouts share their scales (tensor, 128 x 128); per
 *                            tensor with sides multiples of 16, a kernel of its own that quantises before the
 *                            transpose, so only code bytes pass through shared memory
 *   fp8_transpose_codes      codes_t[c, r] = codes[r, c], bytes: per tensor the codes of x^T at x's scale
 *   fp8_inv_scales           inv[i * stride] = 1 / scale of amax[i], for amaxes found elsewhere (zero_fp8.h)
 * The codes are the ones llmc/kernels/fp8.h computes on the host, bit for bit (dev/cuda/fp8_matmul_check).
 *
 * Memory: every kernel reads x once with 16-byte loads (x 16-byte aligned,
 * rows a multiple of 8 elements) and writes one byte per code and layout and
 * 4 per scale; fp8_quantize_rows reads a row twice (the second time from L1/L2)
 * when its scale is the whole row's. The amax kernels raise their outputs with
 * float atomic max: fp8_amax one per block, fp8_amax_blocks one per column and
 * 128 rows. The transposed one works through 128 x 32 tiles of floats in shared memory, or per tensor 64 x 64
 * tiles of codes.
 */
#ifndef LLMC_FP8_QUANTIZE_H
#define LLMC_FP8_QUANTIZE_H

#include <cuda_fp8.h>

#include "llmc/common/cuda_common.h"
#include "llmc/kernels/fp8.h"
#include "llmc/common/profile.h"

/* The 128 x 128 scales' K blocks per row of blocks, padded (see above). */
__host__ __device__ static inline int64_t fp8_k_blocks_padded(int64_t K)
{
    return ((K + 127) / 128 + 3) / 4 * 4;
}

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

/* Where fp8_quantize_transposed takes each column's scale in a tile from (see fp8_quantize_transposed). */
typedef enum { FP8_T_TENSOR, FP8_T_COLUMNS, FP8_T_COLUMN_BLOCKS, FP8_T_BLOCKS } Fp8TransposeScales;

/* A tile of 128 rows x 32 columns of x per block: 16-byte loads along the rows into shared memory, transposed; each
 * column's scale; the plain codes (when asked) 8 bytes a thread; each of the tile's 32 output rows as up to 128
 * bytes, 4 codes per thread and store. Edge tiles: rows past R and columns past C are neither read nor written
 * (R % 4 == 0, C % 8 == 0); they count as 0 in a tile's amax. */
#define FP8_T_ROWS 128
#define FP8_T_COLS 32
__global__ void __launch_bounds__(FP8_THREADS)
    fp8_quantize_transposed_kernel(uint8_t *codes_t, float *inv_t, uint8_t *codes, float *inv, const bf16 *x,
                                   const float *amax, int R, int C, Fp8TransposeScales mode, Fp8Format f)
{
    __shared__ __align__(16) float tile[FP8_T_COLS][FP8_T_ROWS + 4]; /* [column][row]; +4 keeps rows 16-byte aligned */
    __shared__ float col_scale[FP8_T_COLS];
    int64_t r0 = (int64_t)blockIdx.y * FP8_T_ROWS, c0 = (int64_t)blockIdx.x * FP8_T_COLS;
    int64_t col_blocks = (C + 127) / 128;
    for (int v = threadIdx.x; v < FP8_T_ROWS * FP8_T_COLS / 8; v += FP8_THREADS) {
        int r = v / (FP8_T_COLS / 8), c = v % (FP8_T_COLS / 8) * 8;
        bf16x8 in = {};
        if (r0 + r < R && c0 + c < C)
            in = load16(x + (r0 + r) * C + c0 + c);
        for (int j = 0; j < 8; j++)
            tile[c + j][r] = __bfloat162float(in.v[j]);
    }
    __syncthreads();
    if (mode == FP8_T_COLUMN_BLOCKS) { /* 8 threads a column, 16 rows each */
        int c = threadIdx.x / 8, part = threadIdx.x % 8;
        float m = 0.0f;
        for (int r = part * 16; r < part * 16 + 16; r++)
            m = fmaxf(m, fabsf(tile[c][r]));
        for (int offset = 4; offset > 0; offset /= 2)
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
        float scale = fp8_scale_from_amax(m, f);
        if (part == 0) {
            col_scale[c] = scale;
            if (c0 + c < C)
                inv_t[(r0 / 128) * C + c0 + c] = 1.0f / scale;
        }
    } else if (threadIdx.x < FP8_T_COLS) {
        int64_t c = c0 + threadIdx.x, block = (r0 / 128) * col_blocks + c / 128;
        float a = mode == FP8_T_TENSOR ? amax[0] : c >= C ? 0.0f : mode == FP8_T_COLUMNS ? amax[c] : amax[block];
        float scale = fp8_scale_from_amax(a, f);
        col_scale[threadIdx.x] = scale;
        int first_tile = blockIdx.x == 0 && blockIdx.y == 0;
        if (mode == FP8_T_TENSOR && first_tile && threadIdx.x == 0) {
            if (inv_t)
                inv_t[0] = 1.0f / scale;
            if (inv)
                inv[0] = 1.0f / scale;
        } else if (mode == FP8_T_COLUMNS && blockIdx.y == 0 && c < C) {
            inv_t[c] = 1.0f / scale;
        } else if (mode == FP8_T_BLOCKS && c < C && c % 128 == 0) { /* the transposed blocks: rows of c, K along r */
            inv_t[(c / 128) * fp8_k_blocks_padded(R) + r0 / 128] = 1.0f / scale;
            if (inv)
                inv[(r0 / 128) * fp8_k_blocks_padded(C) + c / 128] = 1.0f / scale;
        }
    }
    __syncthreads();
    if (codes) {
        for (int v = threadIdx.x; v < FP8_T_ROWS * FP8_T_COLS / 8; v += FP8_THREADS) {
            int r = v / (FP8_T_COLS / 8), c = v % (FP8_T_COLS / 8) * 8;
            if (r0 + r >= R || c0 + c >= C)
                continue;
            uint8_t out[8];
            for (int j = 0; j < 8; j++)
                out[j] = fp8_code(tile[c + j][r] * col_scale[c + j], f);
            *reinterpret_cast<uint2 *>(codes + (r0 + r) * C + c0 + c) = *reinterpret_cast<const uint2 *>(out);
        }
    }
    for (int v = threadIdx.x; v < FP8_T_COLS * FP8_T_ROWS / 4; v += FP8_THREADS) {
        int c = v / (FP8_T_ROWS / 4), r = v % (FP8_T_ROWS / 4) * 4;
        if (r0 + r >= R || c0 + c >= C)
            continue;
        float4 q = *reinterpret_cast<const float4 *>(&tile[c][r]);
        float sc = col_scale[c];
        uint32_t packed = (uint32_t)fp8_code(q.x * sc, f) | (uint32_t)fp8_code(q.y * sc, f) << 8 |
                          (uint32_t)fp8_code(q.z * sc, f) << 16 | (uint32_t)fp8_code(q.w * sc, f) << 24;
        *reinterpret_cast<uint32_t *>(codes_t + (c0 + c) * R + r0 + r) = packed;
    }
}

/* Per tensor the scale is known before a tile is read: a 64 x 64 tile of x per block becomes codes in registers
 * (16-byte loads, the plain codes as 8-byte stores where asked), and only the code bytes pass through shared
 * memory to be written along codes_t's rows in 16-byte stores, as fp8_transpose_codes_kernel does: a quarter of
 * the float tile's shared-memory traffic, 4 bytes of memory traffic an element with the plain codes, 3 without.
 * R and C multiples of 16, so that every 16-byte piece of codes_t is wholly inside or outside. The codes are
 * fp8_quantize_transposed_kernel's bit for bit (the same product and conversion). */
#define FP8_CODES_TILE 64 /* a tile of codes through shared memory: 64 x 64, its rows 68 bytes apart */

/* A block's 64 x 64 tile of codes (rows r0.., columns c0.. of an R x C matrix, tile[row][col], 68-byte rows) written
 * along codes_t's rows [C, R]: thread t writes 16 bytes of codes_t's row c0 + t / 4. FP8_THREADS threads, R and C
 * multiples of 16; the caller has synchronised the block after filling the tile. Shared by the per-tensor transposing
 * quantiser and the kernels that make their output's codes as they write it (swiglu.h). */
__device__ __forceinline__ void fp8_tile_store_transposed(uint8_t *codes_t, const uint8_t (*tile)[FP8_CODES_TILE + 4],
                                                          int64_t r0, int64_t c0, int R, int C)
{
    int c = threadIdx.x / 4, r = threadIdx.x % 4 * 16; /* codes_t's row c0 + c, its bytes r0 + r .. + 15 */
    if (c0 + c < C && r0 + r < R) {
        uint4 out;
        uint8_t *b = reinterpret_cast<uint8_t *>(&out);
        for (int k = 0; k < 16; k++)
            b[k] = tile[r + k][c];
        *reinterpret_cast<uint4 *>(codes_t + (c0 + c) * R + r0 + r) = out;
    }
}

/* Eight codes into a tile's row at col .. col + 7 (col a multiple of 8: 4-byte aligned in the 68-byte rows). */
__device__ __forceinline__ void fp8_tile_put8(uint8_t (*tile)[FP8_CODES_TILE + 4], int row, int col, uint2 packed)
{
    *reinterpret_cast<uint32_t *>(&tile[row][col]) = packed.x;
    *reinterpret_cast<uint32_t *>(&tile[row][col + 4]) = packed.y;
}

__global__ void __launch_bounds__(FP8_THREADS)
    fp8_quantize_transposed_tensor_kernel(uint8_t *codes_t, float *inv_t, uint8_t *codes, float *inv, const bf16 *x,
                                          const float *amax, int R, int C, Fp8Format f)
{
    __shared__ __align__(16)
        uint8_t tile[FP8_CODES_TILE][FP8_CODES_TILE + 4]; /* 68-byte rows, as the codes transpose */
    float scale = fp8_scale_from_amax(amax[0], f);
    int64_t r0 = (int64_t)blockIdx.y * FP8_CODES_TILE, c0 = (int64_t)blockIdx.x * FP8_CODES_TILE;
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
        if (inv_t)
            inv_t[0] = 1.0f / scale;
        if (inv)
            inv[0] = 1.0f / scale;
    }
    for (int v = threadIdx.x; v < FP8_CODES_TILE * FP8_CODES_TILE / 8; v += FP8_THREADS) { /* 2 vectors a thread */
        int row = v / (FP8_CODES_TILE / 8), col = v % (FP8_CODES_TILE / 8) * 8;
        if (r0 + row >= R || c0 + col >= C)
            continue;
        bf16x8 in = load16(x + (r0 + row) * C + c0 + col);
        __align__(8) uint8_t q[8];
        for (int k = 0; k < 8; k++)
            q[k] = fp8_code(__bfloat162float(in.v[k]) * scale, f);
        uint2 packed = *reinterpret_cast<const uint2 *>(q);
        if (codes)
            *reinterpret_cast<uint2 *>(codes + (r0 + row) * C + c0 + col) = packed;
        fp8_tile_put8(tile, row, col, packed);
    }
    __syncthreads();
    fp8_tile_store_transposed(codes_t, tile, r0, c0, R, C);
}

/* A tile of 64 x 64 codes per block through shared memory: 16-byte loads along codes' rows, 16-byte stores along
 * codes_t's (R and C multiples of 16, so every 16-byte piece is wholly inside or outside). The tile's rows are 68
 * bytes apart: a column's bytes then fall in different banks. */
__global__ void __launch_bounds__(FP8_THREADS)
    fp8_transpose_codes_kernel(uint8_t *__restrict__ codes_t, const uint8_t *__restrict__ codes, int R, int C)
{
    __shared__ __align__(16) uint8_t tile[FP8_CODES_TILE][FP8_CODES_TILE + 4];
    int64_t r0 = (int64_t)blockIdx.y * FP8_CODES_TILE, c0 = (int64_t)blockIdx.x * FP8_CODES_TILE;
    int row = threadIdx.x / 4, part = threadIdx.x % 4 * 16; /* 256 threads: 64 rows of 4 x 16 bytes */
    if (r0 + row < R && c0 + part < C) {
        uint4 v = *reinterpret_cast<const uint4 *>(codes + (r0 + row) * C + c0 + part);
        const uint8_t *b = reinterpret_cast<const uint8_t *>(&v);
        for (int k = 0; k < 16; k++)
            tile[row][part + k] = b[k];
    }
    __syncthreads();
    fp8_tile_store_transposed(codes_t, tile, r0, c0, R, C);
}

__global__ void fp8_inv_scales_kernel(float *inv, int stride, const float *amax, int n, Fp8Format f)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        inv[(int64_t)i * stride] = 1.0f / fp8_scale_from_amax(amax[i], f);
}

/* One block per row of x [R, C]: per_128 0: the row's amax (a block reduction), then its codes from a second read of
 * the row; per_128 1: each group of 16 threads takes 128 columns (a 1 x 128 block) and reduces its amax by shuffles.
 * Scales at inv[(c / 128) * R + r] (per row: inv[r]). */
__global__ void __launch_bounds__(FP8_THREADS)
    fp8_quantize_rows_kernel(uint8_t *codes, float *inv, const bf16 *x, int R, int C, int per_128, Fp8Format f)
{
    __shared__ float shared[WARP_SIZE];
    int64_t r = blockIdx.x;
    const bf16 *row = x + r * C;
    uint8_t *out = codes + r * C;
    float scale = 1.0f;
    if (!per_128) {
        float m = 0.0f;
        for (int c = threadIdx.x * 8; c < C; c += FP8_THREADS * 8) {
            bf16x8 v = load16(row + c);
            for (int k = 0; k < 8; k++)
                m = fmaxf(m, fabsf(__bfloat162float(v.v[k])));
        }
        scale = fp8_scale_from_amax(block_reduce(m, shared, REDUCE_MAX), f);
        if (threadIdx.x == 0)
            inv[r] = 1.0f / scale;
    }
    for (int base = 0; base < C; base += FP8_THREADS * 8) { /* uniform over the block: every lane shuffles */
        int c = base + threadIdx.x * 8;
        bf16x8 v = {};
        if (c < C)
            v = load16(row + c);
        if (per_128) {
            float m = 0.0f;
            for (int k = 0; k < 8; k++)
                m = fmaxf(m, fabsf(__bfloat162float(v.v[k])));
            for (int offset = 8; offset > 0; offset /= 2)
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
            scale = fp8_scale_from_amax(m, f);
            if (threadIdx.x % 16 == 0 && c < C)
                inv[(int64_t)(c / 128) * R + r] = 1.0f / scale;
        }
        if (c >= C)
            continue;
        uint8_t q[8];
        for (int k = 0; k < 8; k++)
            q[k] = fp8_code(__bfloat162float(v.v[k]) * scale, f);
        *reinterpret_cast<uint2 *>(out + c) = *reinterpret_cast<const uint2 *>(q);
    }
}

/* A block of 8 warps takes 256 columns (8 per lane) and 128 rows (every 8th per warp); the warps' maxima meet in
 * shared memory; then per column one atomic max into amax[c] (blocks 0), or per 128 columns of a 128-row block one
 * into amax[(r / 128) * ceil(C / 128) + c / 128] (blocks 1). amax zeroed first. */
__global__ void __launch_bounds__(FP8_THREADS)
    fp8_amax_blocks_kernel(float *amax, const bf16 *x, int R, int C, int blocks)
{
    __shared__ float part[FP8_THREADS / WARP_SIZE][FP8_THREADS + 1];
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    int64_t c0 = (int64_t)blockIdx.x * FP8_THREADS, r0 = (int64_t)blockIdx.y * 128, c = c0 + lane * 8;
    float m[8] = {};
    if (c < C)
        for (int64_t r = r0 + warp; r < r0 + 128 && r < R; r += FP8_THREADS / WARP_SIZE) {
            bf16x8 v = load16(x + r * C + c);
            for (int k = 0; k < 8; k++)
                m[k] = fmaxf(m[k], fabsf(__bfloat162float(v.v[k])));
        }
    for (int k = 0; k < 8; k++)
        part[warp][lane * 8 + k] = m[k];
    __syncthreads();
    float col = 0.0f;
    for (int w = 0; w < FP8_THREADS / WARP_SIZE; w++)
        col = fmaxf(col, part[w][threadIdx.x]);
    int64_t mine = c0 + threadIdx.x;
    if (!blocks) {
        if (mine < C)
            atomicMax((int *)(amax + mine), __float_as_int(col));
        return;
    }
    col = warp_reduce(col, REDUCE_MAX); /* 32 columns; 4 warps make a 128-column block */
    if (lane == 0 && mine < C)
        atomicMax((int *)(amax + (r0 / 128) * ((C + 127) / 128) + mine / 128), __float_as_int(col));
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

/* codes_t[C, R] = fp8(x[R, C]^T * scale), the scale of each element's block by mode:
 *   FP8_T_TENSOR         amax[0]; inv_t[0] (and inv[0]) = 1 / scale
 *   FP8_T_COLUMNS        amax[c] (fp8_amax_blocks); inv_t[c]: codes_t's per-row scales
 *   FP8_T_COLUMN_BLOCKS  found here, of column c's 128 rows r / 128; inv_t[(r / 128) * C + c]: codes_t's 1 x 128
 *   FP8_T_BLOCKS         amax[(r / 128) * ceil(C / 128) + c / 128] (fp8_amax_blocks); codes_t's 128 x 128 scales
 *                        at inv_t[(c / 128) * fp8_k_blocks_padded(R) + r / 128], and inv[] those of the plain codes
 *                        at inv[(r / 128) * fp8_k_blocks_padded(C) + c / 128]
 * and codes[R, C] = fp8(x * scale) in the same pass unless codes is NULL (FP8_T_TENSOR and FP8_T_BLOCKS only: the
 * other scales are not the plain codes'). R a multiple of 4, C of 8, x 16-byte, codes_t 4-byte and codes 8-byte
 * aligned. */
static inline void fp8_quantize_transposed(uint8_t *codes_t, float *inv_t, uint8_t *codes, float *inv, const bf16 *x,
                                           const float *amax, int R, int C, Fp8TransposeScales mode, Fp8Format f,
                                           cudaStream_t stream)
{
    if (R <= 0 || C <= 0 || R % 4 != 0 || C % 8 != 0 || (uintptr_t)x % 16 || (uintptr_t)codes_t % 4 ||
        (uintptr_t)codes % 8)
        FAIL("fp8_quantize_transposed: x [%d, %d] needs rows a multiple of 4 and columns of 8, x 16-byte, "
             "codes_t 4-byte and codes 8-byte aligned",
             R, C);
    if (codes && (mode == FP8_T_COLUMNS || mode == FP8_T_COLUMN_BLOCKS))
        FAIL("fp8_quantize_transposed: the plain codes do not share the transposed codes' per-column scales");
    profile_push(PROF_FP8, stream);
    if (mode == FP8_T_TENSOR && R % 16 == 0 && C % 16 == 0 && (uintptr_t)codes_t % 16 == 0) {
        dim3 grid(ceil_div(C, FP8_CODES_TILE), ceil_div(R, FP8_CODES_TILE));
        fp8_quantize_transposed_tensor_kernel<<<grid, FP8_THREADS, 0, stream>>>(codes_t, inv_t, codes, inv, x, amax, R,
                                                                                C, f);
    } else {
        dim3 grid(ceil_div(C, FP8_T_COLS), ceil_div(R, FP8_T_ROWS));
        fp8_quantize_transposed_kernel<<<grid, FP8_THREADS, 0, stream>>>(codes_t, inv_t, codes, inv, x, amax, R, C,
                                                                         mode, f);
    }
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

/* codes_t[C, R] = codes[R, C]^T: per tensor, the codes fp8_quantize_transposed makes of x^T at x's scale. R and C
 * multiples of 16, both 16-byte aligned. */
static inline void fp8_transpose_codes(uint8_t *codes_t, const uint8_t *codes, int R, int C, cudaStream_t stream)
{
    if (R <= 0 || C <= 0 || R % 16 != 0 || C % 16 != 0 || (uintptr_t)codes % 16 || (uintptr_t)codes_t % 16)
        FAIL("fp8_transpose_codes: codes [%d, %d] need rows and columns multiples of 16, both 16-byte aligned", R, C);
    profile_push(PROF_FP8, stream);
    dim3 grid(ceil_div(C, FP8_CODES_TILE), ceil_div(R, FP8_CODES_TILE));
    fp8_transpose_codes_kernel<<<grid, FP8_THREADS, 0, stream>>>(codes_t, codes, R, C);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

/* inv[i * stride] = 1 / fp8_scale_from_amax(amax[i]) for i < n: the dequantisation scales fp8_quantize would write
 * (a stride of 4 keeps each 16-byte aligned, as cuBLASLt wants scale pointers). */
static inline void fp8_inv_scales(float *inv, int stride, const float *amax, int n, Fp8Format f, cudaStream_t stream)
{
    fp8_inv_scales_kernel<<<ceil_div(n, FP8_THREADS), FP8_THREADS, 0, stream>>>(inv, stride, amax, n, f);
    CUDA_CHECK_LAST();
}

/* codes[R, C] = fp8(x * scale) with a scale per row (per_128 0; inv[r]) or per 1 x 128 block (per_128 1; inv[(c /
 * 128) * R + r]). C a multiple of 8, x 16-byte and codes 8-byte aligned. */
static inline void fp8_quantize_rows(uint8_t *codes, float *inv, const bf16 *x, int R, int C, int per_128, Fp8Format f,
                                     cudaStream_t stream)
{
    if (R <= 0 || C <= 0 || C % 8 != 0 || (uintptr_t)x % 16 || (uintptr_t)codes % 8)
        FAIL("fp8_quantize_rows: x [%d, %d] needs columns a multiple of 8, x 16-byte and codes 8-byte aligned", R, C);
    profile_push(PROF_FP8, stream);
    fp8_quantize_rows_kernel<<<R, FP8_THREADS, 0, stream>>>(codes, inv, x, R, C, per_128, f);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

/* amax[c] = max over the rows of |x[r, c]| (blocks 0: C floats), or amax[(r / 128) * ceil(C / 128) + c / 128] = the
 * max over each 128 x 128 block (blocks 1). C a multiple of 8, x 16-byte aligned. */
static inline void fp8_amax_blocks(float *amax, const bf16 *x, int R, int C, int blocks, cudaStream_t stream)
{
    if (R <= 0 || C <= 0 || C % 8 != 0 || (uintptr_t)x % 16)
        FAIL("fp8_amax_blocks: x [%d, %d] needs columns a multiple of 8 and x 16-byte aligned", R, C);
    int64_t n = blocks ? ceil_div(R, 128) * ceil_div(C, 128) : C;
    profile_push(PROF_FP8, stream);
    CUDA_CHECK(cudaMemsetAsync(amax, 0, (size_t)n * sizeof(float), stream));
    dim3 grid(ceil_div(C, FP8_THREADS), ceil_div(R, 128));
    fp8_amax_blocks_kernel<<<grid, FP8_THREADS, 0, stream>>>(amax, x, R, C, blocks);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

#endif /* LLMC_FP8_QUANTIZE_H */
