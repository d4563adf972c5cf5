/*
 * rmsnorm.h: RMSNorm forward (plain, and fused with the residual add before it)
 * and backward, over rows of C channels, N = B*T rows.
 *
 *   rstd[n] = 1 / sqrt(mean_c(x[n,c]^2) + eps)           (fp32, saved for backward)
 *   out[n,c] = x[n,c] * rstd[n] * w[c]                    (bf16)
 * Fused: x = residual_out = bf16(residual_in + branch), and the norm is taken of
 * that ROUNDED x: it is what later layers read and what backward recomputes from.
 *
 * Backward, with xhat = x * rstd and g = w * dout:
 *   dx = rstd * (g - xhat * mean_c(g * xhat));  dinp += dx   (residual-stream gradient)
 *   dweight[c] (= or +=) sum_n dout[n,c] * xhat[n,c]   (fp32 sum, bf16 result)
 * dweight is deterministic without float atomics: block b writes the column sums of
 * its RMSNORM_BWD_ROWS rows to scratch[b, :], and a second kernel adds the partials
 * in a fixed order. Scratch: rmsnorm_backward_scratch_floats(N, C) floats.
 *
 * Memory: forward reads x (and branch) once and writes out (and residual_out) once;
 * backward reads dout, x, dinp once and writes dinp once, and, for a caller that did
 * not keep the forward's out (recompute, llama_layer.h), can write out again from the
 * x it reads anyway (rmsnorm_backward_recompute): one write instead of a forward pass's
 * read and write. The weight is re-read from
 * cache. A row lives in registers: RMSNORM_VPT 16-byte vectors per thread, so C must
 * be a multiple of 8 and at most RMSNORM_MAX_C, and pointers 16-byte aligned.
 * With FP8 (linear.h) the forward can also fold max |out| into amax[0] and the
 * backward max |dinp| (the *_amax launchers; amax is zeroed first), which the
 * next Linear map's quantisation needs, at one block reduction per block.
 * The forward's loads carry no cache hint: evict-first loads there measured 1-2%
 * slower in the per-kernel benchmark (docs/performance.md).
 * residual_out may alias residual_in (each element is read before it is written);
 * dinp must not alias dout or inp.
 */
#ifndef LLMC_RMSNORM_H
#define LLMC_RMSNORM_H

#include "llmc/common/cuda_common.h"
#include "llmc/common/profile.h"

/* Vectors of 8 bf16 per thread per row: 2 puts a 4096-wide row on 256 threads, enough
 * warps to hide memory latency. Blocks stay at most 512 threads so that backward may
 * use up to 128 registers (it holds two rows in flight); hence C <= 8192. */
#define RMSNORM_VPT 2
#define RMSNORM_MAX_THREADS 512
#define RMSNORM_MAX_C (RMSNORM_MAX_THREADS * 8 * RMSNORM_VPT)
/* Rows per backward block: more rows mean fewer dweight partials (scratch traffic is
 * 1/RMSNORM_BWD_ROWS of the main traffic), fewer mean fewer warps in flight. */
#define RMSNORM_BWD_ROWS 16
/* The dweight reduction: 32 columns per block, partials split over 16 thread rows. */
#define RMSNORM_REDUCE_Y 16

static inline int rmsnorm_threads(int C)
{
    int threads = ceil_div(C / 8, RMSNORM_VPT);
    return ceil_div(threads, WARP_SIZE) * WARP_SIZE;
}

static inline size_t rmsnorm_backward_scratch_floats(int N, int C)
{
    return (size_t)ceil_div(N, RMSNORM_BWD_ROWS) * (size_t)C;
}

/* x * rstd * w in bf16: one expression for the forward and the backward's recomputation, so that the two agree to
 * the bit. */
__device__ __forceinline__ bf16 rmsnorm_value(float x, float r, bf16 w)
{
    return __float2bfloat16_rn(x * r * __bfloat162float(w));
}

/* One block per row. With branch != NULL, inp is the residual stream and the block
 * first forms residual_out = bf16(inp + branch). */
__global__ void __launch_bounds__(RMSNORM_MAX_THREADS)
    rmsnorm_forward_kernel(bf16 *residual_out, bf16 *__restrict__ out, float *__restrict__ rstd, const bf16 *inp,
                           const bf16 *branch, const bf16 *__restrict__ weight, int C, float eps, float *amax)
{
    __shared__ float shared[WARP_SIZE];
    int64_t row_offset = (int64_t)blockIdx.x * C;
    int vectors = C / 8;
    float x[RMSNORM_VPT][8];
    float sumsq = 0.0f;
#pragma unroll
    for (int k = 0; k < RMSNORM_VPT; k++) {
        int j = threadIdx.x + k * blockDim.x;
        if (j < vectors) {
            int64_t at = row_offset + (int64_t)j * 8;
            bf16x8 a = load16(inp + at);
            if (branch != NULL) {
                bf16x8 b = load16(branch + at);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    a.v[i] = __float2bfloat16_rn(__bfloat162float(a.v[i]) + __bfloat162float(b.v[i]));
                }
                store16(residual_out + at, a);
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                x[k][i] = __bfloat162float(a.v[i]);
                sumsq += x[k][i] * x[k][i];
            }
        }
    }
    sumsq = block_sum(sumsq, shared);
    /* IEEE sqrt and divide, not rsqrtf: rstd is an fp32 result checked to 1e-5 */
    float r = 1.0f / sqrtf(sumsq / (float)C + eps);
    if (threadIdx.x == 0)
        rstd[blockIdx.x] = r;
    float m = 0.0f;
#pragma unroll
    for (int k = 0; k < RMSNORM_VPT; k++) {
        int j = threadIdx.x + k * blockDim.x;
        if (j < vectors) {
            bf16x8 w = load16(weight + j * 8);
            bf16x8 o;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                o.v[i] = rmsnorm_value(x[k][i], r, w.v[i]);
                m = fmaxf(m, fabsf(__bfloat162float(o.v[i])));
            }
            store16(out + row_offset + (int64_t)j * 8, o);
        }
    }
    if (amax != NULL)
        block_max_into(amax, m, shared);
}

/* Block b handles rows [b*RMSNORM_BWD_ROWS, ...), one at a time: the next row's dout
 * and x, and this row's dinp, are in flight while the block reduces. Column sums of
 * dout*xhat stay in registers until the end. out: NULL, or where the forward's output
 * goes again (with its amax into out_amax unless NULL). */
__global__ void __launch_bounds__(RMSNORM_MAX_THREADS)
    rmsnorm_backward_kernel(bf16 *__restrict__ dinp, float *__restrict__ scratch, const bf16 *__restrict__ dout,
                            const bf16 *__restrict__ inp, const bf16 *__restrict__ weight,
                            const float *__restrict__ rstd, int N, int C, float *amax, bf16 *__restrict__ out,
                            float *out_amax)
{
    __shared__ float shared[WARP_SIZE];
    int vectors = C / 8;
    int row0 = blockIdx.x * RMSNORM_BWD_ROWS;
    int rows = min(RMSNORM_BWD_ROWS, N - row0);
    float dw[RMSNORM_VPT][8], m = 0.0f, m_out = 0.0f;
    bf16x8 w[RMSNORM_VPT], d_next[RMSNORM_VPT], x_next[RMSNORM_VPT];
#pragma unroll
    for (int k = 0; k < RMSNORM_VPT; k++) {
        int j = threadIdx.x + k * blockDim.x;
#pragma unroll
        for (int i = 0; i < 8; i++)
            dw[k][i] = 0.0f;
        if (j < vectors) {
            int64_t at = (int64_t)row0 * C + j * 8;
            w[k] = load16(weight + j * 8);
            d_next[k] = load16_stream(dout + at);
            x_next[k] = load16_stream(inp + at);
        }
    }
    for (int r = 0; r < rows; r++) {
        int64_t row_offset = (int64_t)(row0 + r) * C;
        bf16x8 d[RMSNORM_VPT], x[RMSNORM_VPT], g[RMSNORM_VPT];
#pragma unroll
        for (int k = 0; k < RMSNORM_VPT; k++) {
            int j = threadIdx.x + k * blockDim.x;
            d[k] = d_next[k];
            x[k] = x_next[k];
            if (j < vectors) {
                int64_t at = row_offset + (int64_t)j * 8;
                g[k] = load16(dinp + at);
                if (r + 1 < rows) {
                    d_next[k] = load16_stream(dout + at + C);
                    x_next[k] = load16_stream(inp + at + C);
                }
            }
        }
        float rs = rstd[row0 + r];
        float dot = 0.0f;
#pragma unroll
        for (int k = 0; k < RMSNORM_VPT; k++) {
            if (threadIdx.x + k * blockDim.x < vectors) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    float dv = __bfloat162float(d[k].v[i]);
                    float xhat = __bfloat162float(x[k].v[i]) * rs;
                    dot += __bfloat162float(w[k].v[i]) * dv * xhat;
                    dw[k][i] += dv * xhat;
                }
            }
        }
        float mean = block_sum(dot, shared) / (float)C;
#pragma unroll
        for (int k = 0; k < RMSNORM_VPT; k++) {
            int j = threadIdx.x + k * blockDim.x;
            if (j < vectors) {
                bf16x8 o;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    float xhat = __bfloat162float(x[k].v[i]) * rs;
                    float dx = rs * (__bfloat162float(w[k].v[i]) * __bfloat162float(d[k].v[i]) - xhat * mean);
                    o.v[i] = __float2bfloat16_rn(__bfloat162float(g[k].v[i]) + dx);
                    m = fmaxf(m, fabsf(__bfloat162float(o.v[i])));
                }
                store16(dinp + row_offset + (int64_t)j * 8, o);
                if (out != NULL) {
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        o.v[i] = rmsnorm_value(__bfloat162float(x[k].v[i]), rs, w[k].v[i]);
                        m_out = fmaxf(m_out, fabsf(__bfloat162float(o.v[i])));
                    }
                    store16(out + row_offset + (int64_t)j * 8, o);
                }
            }
        }
    }
#pragma unroll
    for (int k = 0; k < RMSNORM_VPT; k++) {
        int j = threadIdx.x + k * blockDim.x;
        if (j < vectors) {
            float *dst = scratch + (int64_t)blockIdx.x * C + (int64_t)j * 8;
            floatx4 lo, hi;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                lo.v[i] = dw[k][i];
                hi.v[i] = dw[k][i + 4];
            }
            store16(dst, lo);
            store16(dst + 4, hi);
        }
    }
    if (amax != NULL)
        block_max_into(amax, m, shared);
    if (out_amax != NULL)
        block_max_into(out_amax, m_out, shared);
}

/* dweight[c] (+)= sum_b scratch[b, c]: thread row y sums partials y, y+16, ... in order,
 * then thread row 0 adds the 16 sums in order. Coalesced: a warp reads 32 columns. */
__global__ void rmsnorm_dweight_reduce_kernel(bf16 *__restrict__ dweight, const float *__restrict__ scratch,
                                              int n_partials, int C, int accumulate)
{
    __shared__ float sums[RMSNORM_REDUCE_Y][WARP_SIZE + 1];
    int c = blockIdx.x * WARP_SIZE + threadIdx.x;
    float s = 0.0f;
    if (c < C) {
#pragma unroll 4
        for (int p = threadIdx.y; p < n_partials; p += RMSNORM_REDUCE_Y)
            s += scratch[(int64_t)p * C + c];
    }
    sums[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float total = 0.0f;
#pragma unroll
        for (int y = 0; y < RMSNORM_REDUCE_Y; y++)
            total += sums[y][threadIdx.x];
        if (accumulate)
            total += __bfloat162float(dweight[c]);
        dweight[c] = __float2bfloat16_rn(total);
    }
}

static inline void rmsnorm_check_size(int N, int C)
{
    if (N <= 0 || C <= 0 || C % 8 != 0 || C > RMSNORM_MAX_C) {
        FAIL("rmsnorm: N = %d, C = %d unsupported: C must be a positive multiple of 8 (16-byte bf16 vectors) "
             "and at most %d (a row is held in the registers of one block)",
             N, C, RMSNORM_MAX_C);
    }
}

/* amax: NULL, or where max |out| goes (zeroed here first) */
static inline void fused_residual_rmsnorm_forward_amax(bf16 *residual_out, bf16 *out, float *rstd,
                                                       const bf16 *residual_in, const bf16 *branch, const bf16 *weight,
                                                       int N, int C, float eps, float *amax, cudaStream_t stream)
{
    rmsnorm_check_size(N, C);
    profile_push(PROF_NORM, stream);
    amax_reset(amax, stream);
    rmsnorm_forward_kernel<<<N, rmsnorm_threads(C), 0, stream>>>(residual_out, out, rstd, residual_in, branch, weight,
                                                                 C, eps, amax);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

static inline void fused_residual_rmsnorm_forward(bf16 *residual_out, bf16 *out, float *rstd, const bf16 *residual_in,
                                                  const bf16 *branch, const bf16 *weight, int N, int C, float eps,
                                                  cudaStream_t stream)
{
    fused_residual_rmsnorm_forward_amax(residual_out, out, rstd, residual_in, branch, weight, N, C, eps, NULL, stream);
}

static inline void rmsnorm_forward_amax(bf16 *out, float *rstd, const bf16 *inp, const bf16 *weight, int N, int C,
                                        float eps, float *amax, cudaStream_t stream)
{
    fused_residual_rmsnorm_forward_amax(NULL, out, rstd, inp, NULL, weight, N, C, eps, amax, stream);
}

static inline void rmsnorm_forward(bf16 *out, float *rstd, const bf16 *inp, const bf16 *weight, int N, int C, float eps,
                                   cudaStream_t stream)
{
    fused_residual_rmsnorm_forward_amax(NULL, out, rstd, inp, NULL, weight, N, C, eps, NULL, stream);
}

/* The backward, and out = the forward's output again (bit-identical to rmsnorm_forward's from the same inp and rstd)
 * for a caller that did not keep it; out NULL: the backward alone. scratch: rmsnorm_backward_scratch_floats(N, C)
 * floats, no initialisation needed. accumulate: add to dweight (later micro-steps) instead of overwriting it.
 * amax, out_amax: NULL, or where max |dinp| and max |out| go (each zeroed here first). out must alias none of the
 * others. */
static inline void rmsnorm_backward_recompute(bf16 *dinp, bf16 *dweight, float *scratch, bf16 *out, const bf16 *dout,
                                              const bf16 *inp, const bf16 *weight, const float *rstd, int N, int C,
                                              int accumulate, float *amax, float *out_amax, cudaStream_t stream)
{
    rmsnorm_check_size(N, C);
    profile_push(PROF_NORM, stream);
    amax_reset(amax, stream);
    amax_reset(out ? out_amax : NULL, stream);
    int n_partials = ceil_div(N, RMSNORM_BWD_ROWS);
    rmsnorm_backward_kernel<<<n_partials, rmsnorm_threads(C), 0, stream>>>(dinp, scratch, dout, inp, weight, rstd, N, C,
                                                                           amax, out, out ? out_amax : NULL);
    CUDA_CHECK_LAST();
    dim3 block(WARP_SIZE, RMSNORM_REDUCE_Y);
    rmsnorm_dweight_reduce_kernel<<<ceil_div(C, WARP_SIZE), block, 0, stream>>>(dweight, scratch, n_partials, C,
                                                                                accumulate);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

/* amax: NULL, or where max |dinp| goes (zeroed here first). */
static inline void rmsnorm_backward_amax(bf16 *dinp, bf16 *dweight, float *scratch, const bf16 *dout, const bf16 *inp,
                                         const bf16 *weight, const float *rstd, int N, int C, int accumulate,
                                         float *amax, cudaStream_t stream)
{
    rmsnorm_backward_recompute(dinp, dweight, scratch, NULL, dout, inp, weight, rstd, N, C, accumulate, amax, NULL,
                               stream);
}

static inline void rmsnorm_backward(bf16 *dinp, bf16 *dweight, float *scratch, const bf16 *dout, const bf16 *inp,
                                    const bf16 *weight, const float *rstd, int N, int C, int accumulate,
                                    cudaStream_t stream)
{
    rmsnorm_backward_amax(dinp, dweight, scratch, dout, inp, weight, rstd, N, C, accumulate, NULL, stream);
}

#endif /* LLMC_RMSNORM_H */
