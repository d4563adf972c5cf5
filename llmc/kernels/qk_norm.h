/*
 * qk_norm.h: Qwen3's RMSNorm of each query and key head, in place in the stacked
 * q, k, v rows before RoPE, forward and backward. N = B*T tokens, each with H query
 * and KV key heads of D channels (the first (H + KV) D of a qkv row of (H + 2 KV) D).
 *
 *   forward, per head x [D] (weight w = wq for query heads, wk for key heads):
 *     raw = x;  rstd = 1 / sqrt(mean(x^2) + eps);  x = bf16(w * (x * rstd))
 *   backward, with dy the gradient of the normed head (RoPE's backward done):
 *     g = w * dy;  dx = rstd * (g - xhat * mean(g * xhat)), xhat = raw * rstd;  dy = dx (in place)
 *     dw[c] (= or +=) sum over the heads of its kind of dy[c] * xhat[c]
 * raw [N, H + KV, D] (bf16) and rstd [N, H + KV] (fp32) are what the forward keeps
 * for the backward. The weight gradient (wq's then wk's, stacked as the layout
 * stacks them: dw [2 D]) is deterministic without atomics: block b sums its
 * QK_NORM_TOKENS tokens' contributions in a fixed order into scratch[b, 2 D], and
 * rmsnorm.h's reduction adds the partials in order. Scratch:
 * qk_norm_backward_scratch_floats(N, D) floats.
 *
 * One warp per head, D / 32 channels a lane (rounded up): D at most QK_NORM_MAX_D. Memory:
 * forward reads the q and k heads once and writes them and raw once; backward reads
 * dy, raw once and writes dy once.
 */
#ifndef LLMC_QK_NORM_H
#define LLMC_QK_NORM_H

#include "llmc/common/cuda_common.h"
#include "llmc/common/profile.h"
#include "llmc/kernels/rmsnorm.h"

#define QK_NORM_MAX_D 256
#define QK_NORM_WARPS 8
/* Tokens per backward block: its warps take the block's heads in turn. */
#define QK_NORM_TOKENS 16

static inline size_t qk_norm_backward_scratch_floats(int N, int D)
{
    return (size_t)ceil_div(N, QK_NORM_TOKENS) * 2 * (size_t)D;
}

/* Warp per (token, head) row of the N (H + KV) rows. */
__global__ void qk_norm_forward_kernel(bf16 *__restrict__ qkv, bf16 *__restrict__ raw, float *__restrict__ rstd,
                                       const bf16 *__restrict__ wq, const bf16 *__restrict__ wk, int N, int H, int KV,
                                       int D, float eps)
{
    int heads = H + KV, lane = threadIdx.x % WARP_SIZE;
    int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP_SIZE;
    if (row >= (int64_t)N * heads)
        return;
    int64_t token = row / heads;
    int h = (int)(row % heads);
    bf16 *x = qkv + token * (int64_t)(H + 2 * KV) * D + (int64_t)h * D;
    const bf16 *w = h < H ? wq : wk;
    float v[QK_NORM_MAX_D / WARP_SIZE];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < QK_NORM_MAX_D / WARP_SIZE; k++) {
        int c = lane + k * WARP_SIZE;
        v[k] = c < D ? __bfloat162float(x[c]) : 0.0f;
        ss += v[k] * v[k];
        if (c < D)
            raw[row * D + c] = x[c];
    }
    ss = warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)D + eps);
    if (lane == 0)
        rstd[row] = r;
#pragma unroll
    for (int k = 0; k < QK_NORM_MAX_D / WARP_SIZE; k++) {
        int c = lane + k * WARP_SIZE;
        if (c < D)
            x[c] = __float2bfloat16_rn(__bfloat162float(w[c]) * (v[k] * r));
    }
}

/* Block b: tokens [b QK_NORM_TOKENS, ...), every head of them; warp i takes the block's heads i, i + warps, ...
 * in order; then the warps' weight-gradient sums are added in warp order into scratch[b]. */
__global__ void __launch_bounds__(QK_NORM_WARPS *WARP_SIZE)
    qk_norm_backward_kernel(bf16 *__restrict__ dqkv, float *__restrict__ scratch, const bf16 *__restrict__ raw,
                            const float *__restrict__ rstd, const bf16 *__restrict__ wq, const bf16 *__restrict__ wk,
                            int N, int H, int KV, int D)
{
    __shared__ float sums[QK_NORM_WARPS][2 * QK_NORM_MAX_D];
    int heads = H + KV, lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    float dwq[QK_NORM_MAX_D / WARP_SIZE], dwk[QK_NORM_MAX_D / WARP_SIZE];
#pragma unroll
    for (int k = 0; k < QK_NORM_MAX_D / WARP_SIZE; k++)
        dwq[k] = dwk[k] = 0.0f;
    int64_t first = (int64_t)blockIdx.x * QK_NORM_TOKENS * heads;
    int64_t last = min((int64_t)N, (int64_t)(blockIdx.x + 1) * QK_NORM_TOKENS) * heads;
    for (int64_t row = first + warp; row < last; row += QK_NORM_WARPS) {
        int64_t token = row / heads;
        int h = (int)(row % heads);
        bf16 *dy = dqkv + token * (int64_t)(H + 2 * KV) * D + (int64_t)h * D;
        const bf16 *x = raw + row * D, *w = h < H ? wq : wk;
        float r = rstd[row], d[QK_NORM_MAX_D / WARP_SIZE], xh[QK_NORM_MAX_D / WARP_SIZE];
        float gx = 0.0f;
#pragma unroll
        for (int k = 0; k < QK_NORM_MAX_D / WARP_SIZE; k++) {
            int c = lane + k * WARP_SIZE;
            d[k] = c < D ? __bfloat162float(dy[c]) : 0.0f;
            xh[k] = c < D ? __bfloat162float(x[c]) * r : 0.0f;
            gx += (c < D ? __bfloat162float(w[c]) : 0.0f) * d[k] * xh[k];
            if (h < H)
                dwq[k] += d[k] * xh[k];
            else
                dwk[k] += d[k] * xh[k];
        }
        float mean_gx = warp_sum(gx) / (float)D;
#pragma unroll
        for (int k = 0; k < QK_NORM_MAX_D / WARP_SIZE; k++) {
            int c = lane + k * WARP_SIZE;
            if (c < D)
                dy[c] = __float2bfloat16_rn(r * (__bfloat162float(w[c]) * d[k] - xh[k] * mean_gx));
        }
    }
#pragma unroll
    for (int k = 0; k < QK_NORM_MAX_D / WARP_SIZE; k++) {
        int c = lane + k * WARP_SIZE;
        if (c < D) {
            sums[warp][c] = dwq[k];
            sums[warp][D + c] = dwk[k];
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < 2 * D; c += blockDim.x) {
        float total = 0.0f;
        for (int i = 0; i < QK_NORM_WARPS; i++)
            total += sums[i][c];
        scratch[(int64_t)blockIdx.x * 2 * D + c] = total;
    }
}

static inline void qk_norm_check_size(int N, int H, int KV, int D)
{
    if (N <= 0 || H <= 0 || KV <= 0 || D <= 0 || D > QK_NORM_MAX_D)
        FAIL("qk_norm: N = %d, H = %d, KV = %d, D = %d unsupported: D (a head) must be at most %d", N, H, KV, D,
             QK_NORM_MAX_D);
}

/* wq, wk: [D] each. raw [N, H + KV, D] and rstd [N, H + KV]: kept for the backward. */
static inline void qk_norm_forward(bf16 *qkv, bf16 *raw, float *rstd, const bf16 *wq, const bf16 *wk, int N, int H,
                                   int KV, int D, float eps, cudaStream_t stream)
{
    qk_norm_check_size(N, H, KV, D);
    profile_push(PROF_NORM, stream);
    int64_t threads = (int64_t)N * (H + KV) * WARP_SIZE;
    int block = QK_NORM_WARPS * WARP_SIZE;
    qk_norm_forward_kernel<<<(int)((threads + block - 1) / block), block, 0, stream>>>(qkv, raw, rstd, wq, wk, N, H, KV,
                                                                                       D, eps);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

/* dqkv's q and k heads: the normed heads' gradient in, the raw heads' out. dw [2 D]: wq's then wk's gradient
 * (stacked, as the layout stacks them). scratch: qk_norm_backward_scratch_floats(N, D) floats. */
static inline void qk_norm_backward(bf16 *dqkv, bf16 *dw, float *scratch, const bf16 *raw, const float *rstd,
                                    const bf16 *wq, const bf16 *wk, int N, int H, int KV, int D, int accumulate,
                                    cudaStream_t stream)
{
    qk_norm_check_size(N, H, KV, D);
    profile_push(PROF_NORM, stream);
    int n_partials = ceil_div(N, QK_NORM_TOKENS);
    qk_norm_backward_kernel<<<n_partials, QK_NORM_WARPS * WARP_SIZE, 0, stream>>>(dqkv, scratch, raw, rstd, wq, wk, N,
                                                                                  H, KV, D);
    CUDA_CHECK_LAST();
    dim3 block(WARP_SIZE, RMSNORM_REDUCE_Y);
    rmsnorm_dweight_reduce_kernel<<<ceil_div(2 * D, WARP_SIZE), block, 0, stream>>>(dw, scratch, n_partials, 2 * D,
                                                                                    accumulate);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

#endif /* LLMC_QK_NORM_H */
