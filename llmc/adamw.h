/*
 * adamw.h: gradient norm, clip coefficient and the AdamW update, all on the
 * device so that the host never waits inside a step.
 *
 *   global_norm_squared: out[0] = sum_i grad[i]^2, deterministic: NORM_BLOCKS blocks
 *     (a fixed grid, whatever the GPU) each write one partial to scratch, then one
 *     block adds the partials in a fixed order. Squares are summed in double (exact
 *     squares of floats; fp64 costs nothing next to the memory stream on an H100),
 *     block partials are stored as floats. Scratch: NORM_BLOCKS floats.
 *   clip_coefficient: coef = max_norm > 0 ? min(1, max_norm / (sqrt(ns) + 1e-6)) : 1.
 *   adamw_update, as torch.optim.AdamW (non-fused) does it, with g = grad * grad_scale:
 *     master *= 1 - lr * wd
 *     m = lerp(m, g, 1 - b1)                   (= b1 m + (1 - b1) g)
 *     v = b2 v + (1 - b2) g^2
 *     master -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
 *     param = bf16(master), round to nearest even
 *   The scalars derived from lr, betas and step are computed on the host in double,
 *   as PyTorch does in Python, then passed as floats.
 *
 * Memory: the norm reads grad once; the update reads master, grad, m, v once and
 * writes master, m, v, param once, 16-byte vectors of 4 elements. Pointers must be
 * 16-byte aligned (tensor offsets in the flat buffers are multiples of 4); n may be
 * anything, the last n % 4 elements take a scalar path. 64-bit indices throughout.
 */
#ifndef LLMC_ADAMW_H
#define LLMC_ADAMW_H

#include <math.h>

#include "cuda_common.h"

#define NORM_BLOCKS 1024
#define NORM_THREADS 256
#define ADAMW_THREADS 256
/* Enough threads to fill an H100 several times over; more would only add blocks. */
#define ADAMW_MAX_BLOCKS 8192

__device__ __forceinline__ double warp_sum_double(double x)
{
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

/* block_sum in double; shared must hold 32 doubles. */
__device__ __forceinline__ double block_sum_double(double x, double *shared)
{
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, n_warps = blockDim.x / WARP_SIZE;
    x = warp_sum_double(x);
    __syncthreads();
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = lane < n_warps ? shared[lane] : 0.0;
    return warp_sum_double(x);
}

__global__ void norm_squared_partial_kernel(float *__restrict__ partials, const float *__restrict__ x, int64_t n)
{
    __shared__ double shared[WARP_SIZE];
    int64_t n4 = n / 4;
    double acc = 0.0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        floatx4 v = load16_stream(x + i * 4);
#pragma unroll
        for (int k = 0; k < 4; k++) acc += (double)v.v[k] * (double)v.v[k];
    }
    if (blockIdx.x == 0 && threadIdx.x < n - n4 * 4) {
        double t = x[n4 * 4 + threadIdx.x];
        acc += t * t;
    }
    acc = block_sum_double(acc, shared);
    if (threadIdx.x == 0) partials[blockIdx.x] = (float)acc;
}

__global__ void norm_squared_final_kernel(float *__restrict__ out, const float *__restrict__ partials)
{
    __shared__ double shared[WARP_SIZE];
    double acc = block_sum_double((double)partials[threadIdx.x], shared);
    if (threadIdx.x == 0) out[0] = (float)acc;
}

__global__ void clip_coefficient_kernel(float *__restrict__ coef, const float *__restrict__ norm_squared,
                                        float max_norm)
{
    coef[0] = max_norm > 0.0f ? fminf(1.0f, max_norm / (sqrtf(norm_squared[0]) + 1e-6f)) : 1.0f;
}

typedef struct {
    float decay;     /* 1 - lr * wd */
    float beta1, beta2;
    float one_minus_beta1, one_minus_beta2;
    float step_size; /* lr / (1 - b1^step) */
    float bc2_sqrt;  /* sqrt(1 - b2^step) */
    float eps;
} AdamWScalars;

__device__ __forceinline__ float adamw_element(float *master, float *m, float *v, float grad, float scale,
                                               AdamWScalars s)
{
    float g = grad * scale;
    float w = *master * s.decay;
    float mm = *m + s.one_minus_beta1 * (g - *m);
    float vv = *v * s.beta2 + s.one_minus_beta2 * (g * g);
    w = w - s.step_size * (mm / (sqrtf(vv) / s.bc2_sqrt + s.eps));
    *master = w;
    *m = mm;
    *v = vv;
    return w;
}

/* Grid-stride over 4-element vectors; block 0 also takes the n % 4 tail. */
__global__ void adamw_kernel(float *__restrict__ master, bf16 *__restrict__ param, const float *__restrict__ grad,
                             float *__restrict__ m, float *__restrict__ v, int64_t n,
                             const float *__restrict__ grad_scale, AdamWScalars s)
{
    float scale = grad_scale[0];
    int64_t n4 = n / 4;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t at = i * 4;
        /* every stream is touched once per step: keep it out of the way in L2 */
        floatx4 w = load16_stream(master + at), g = load16_stream(grad + at);
        floatx4 mv = load16_stream(m + at), vv = load16_stream(v + at);
        __nv_bfloat162 p[2];
#pragma unroll
        for (int k = 0; k < 4; k++) adamw_element(&w.v[k], &mv.v[k], &vv.v[k], g.v[k], scale, s);
        p[0] = __floats2bfloat162_rn(w.v[0], w.v[1]);
        p[1] = __floats2bfloat162_rn(w.v[2], w.v[3]);
        store16(master + at, w);
        store16(m + at, mv);
        store16(v + at, vv);
        *reinterpret_cast<uint2 *>(param + at) = *reinterpret_cast<const uint2 *>(p);
    }
    if (blockIdx.x == 0 && threadIdx.x < n - n4 * 4) {
        int64_t at = n4 * 4 + threadIdx.x;
        param[at] = __float2bfloat16_rn(adamw_element(master + at, m + at, v + at, grad[at], scale, s));
    }
}

/* scratch: NORM_BLOCKS floats. out[0] = sum of grad[i]^2, the same bits every run. */
static inline void global_norm_squared(float *out, float *scratch, const float *grad, int64_t n, cudaStream_t stream)
{
    if (n < 0 || (uintptr_t)grad % 16 != 0) {
        FAIL("global_norm_squared: n = %lld, grad %p: n must be >= 0 and grad 16-byte aligned", (long long)n,
             (const void *)grad);
    }
    norm_squared_partial_kernel<<<NORM_BLOCKS, NORM_THREADS, 0, stream>>>(scratch, grad, n);
    CUDA_CHECK_LAST();
    norm_squared_final_kernel<<<1, NORM_BLOCKS, 0, stream>>>(out, scratch);
    CUDA_CHECK_LAST();
}

static inline void clip_coefficient(float *coef, const float *norm_squared, float max_norm, cudaStream_t stream)
{
    clip_coefficient_kernel<<<1, 1, 0, stream>>>(coef, norm_squared, max_norm);
    CUDA_CHECK_LAST();
}

/* One tensor (weight decay differs per tensor); step counts from 1. grad_scale: one
 * device float that multiplies the gradient, e.g. the clip coefficient. */
static inline void adamw_update(float *master, bf16 *param, const float *grad, float *m, float *v, int64_t n, float lr,
                                float beta1, float beta2, float eps, float weight_decay, const float *grad_scale,
                                int step, cudaStream_t stream)
{
    if (step < 1 || n < 0) FAIL("adamw_update: step %d must count from 1 and n = %lld be >= 0", step, (long long)n);
    if ((uintptr_t)master % 16 || (uintptr_t)grad % 16 || (uintptr_t)m % 16 || (uintptr_t)v % 16 ||
        (uintptr_t)param % 8) {
        FAIL("adamw_update: master %p, grad %p, m %p, v %p must be 16-byte aligned and param %p 8-byte aligned\n"
             "  hint: start each tensor at an offset that is a multiple of 4 elements", (void *)master,
             (const void *)grad, (void *)m, (void *)v, (void *)param);
    }
    if (n == 0) return;
    AdamWScalars s;
    s.decay = (float)(1.0 - (double)lr * (double)weight_decay);
    s.beta1 = beta1;
    s.beta2 = beta2;
    s.one_minus_beta1 = (float)(1.0 - (double)beta1);
    s.one_minus_beta2 = (float)(1.0 - (double)beta2);
    s.step_size = (float)((double)lr / (1.0 - pow((double)beta1, step)));
    s.bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, step));
    s.eps = eps;
    int64_t blocks = (n / 4 + ADAMW_THREADS - 1) / ADAMW_THREADS;
    if (blocks > ADAMW_MAX_BLOCKS) blocks = ADAMW_MAX_BLOCKS;
    if (blocks < 1) blocks = 1; /* n < 4: the tail alone */
    adamw_kernel<<<(int)blocks, ADAMW_THREADS, 0, stream>>>(master, param, grad, m, v, n, grad_scale, s);
    CUDA_CHECK_LAST();
}

#endif /* LLMC_ADAMW_H */
