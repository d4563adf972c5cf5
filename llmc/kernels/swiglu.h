/*
 * swiglu.h: the SwiGLU activation on the fused gate/up projection output
 * gate_up [N, 2F] (row n: F gate values g, then F up values u).
 *
 *   forward:  out[n, f] = silu(g) * u,   silu(g) = g * sig(g),  sig(g) = 1 / (1 + exp(-g))
 *   backward: dg = dout * u * sig * (1 + g * (1 - sig)),   du = dout * silu(g)
 * Backward recomputes sig from gate_up; the activation is never stored.
 * sig uses the fast exp and divide (__expf, __fdividef: a few fp32 ulps, far
 * below the bf16 rounding of the result), which keeps the special-function
 * units from limiting a kernel that should be limited by memory.
 * Loads and stores carry no cache hint: in the per-kernel benchmark (an L2 flush
 * before each run) evict-first loads ran the forward 5% slower than plain ones,
 * and evict-first stores on top did not help (docs/performance.md).
 *
 * Memory: forward reads gate_up once and writes out [N, F] once; backward reads
 * gate_up and dout once and writes dgate_up [N, 2F] once, and, where the forward's
 * out was not kept (recompute, llama_layer.h), writes it again [N, F] from the
 * gate_up it reads anyway: 12 bytes of traffic per element of out instead of
 * the 16 of a separate forward pass and the backward. dgate_up may alias
 * gate_up (in place): each thread reads its g and u before it writes dg and du.
 * F must be a multiple of 8 (16-byte bf16 vectors) and pointers 16-byte aligned.
 * With FP8 (linear.h), the *_amax launchers also fold max |out| (or max
 * |dgate_up|) into amax[0]: the next Linear map's scale, without a pass of its own.
 */
#ifndef LLMC_SWIGLU_H
#define LLMC_SWIGLU_H

#include "llmc/common/cuda_common.h"
#include "llmc/common/profile.h"

/* 16-byte vectors per thread, all loaded before any is used. One block covers a
 * whole row when F/8/SWIGLU_VPT <= 1024 (F <= 16384): 2 in flight per thread
 * measured 2-4% faster than 1 vector per thread on 256-thread blocks, and than 4
 * (dev/cuda/swiglu_check's experiment, H100, docs/performance.md). */
#define SWIGLU_VPT 2
#define SWIGLU_MAX_THREADS 1024

/* silu(g) * u in bf16: one expression for the forward and the backward's recomputation, so that the two agree to
 * the bit. */
__device__ __forceinline__ bf16 swiglu_value(bf16 g, bf16 u)
{
    float gf = __bfloat162float(g);
    return __float2bfloat16_rn(__fdividef(gf, 1.0f + __expf(-gf)) * __bfloat162float(u));
}

/* Eight outputs from eight gate and up values, stored at out; their largest magnitude raised into *m. */
__device__ __forceinline__ void swiglu_store8(bf16 *out, const bf16x8 &g, const bf16x8 &u, float *m)
{
    bf16x8 o;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        o.v[i] = swiglu_value(g.v[i], u.v[i]);
        *m = fmaxf(*m, fabsf(__bfloat162float(o.v[i])));
    }
    store16(out, o);
}

/* Grid (N, row pieces): the row comes from blockIdx.x, so no 64-bit division. */
__global__ void __launch_bounds__(SWIGLU_MAX_THREADS)
    swiglu_forward_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ gate_up, int F, float *amax)
{
    __shared__ float shared[WARP_SIZE];
    float m = 0.0f;
    const bf16 *row = gate_up + (int64_t)blockIdx.x * 2 * F;
    int base = (blockIdx.y * blockDim.x * SWIGLU_VPT + threadIdx.x) * 8;
    bf16x8 g[SWIGLU_VPT], u[SWIGLU_VPT];
#pragma unroll
    for (int k = 0; k < SWIGLU_VPT; k++) {
        int j = base + k * blockDim.x * 8;
        if (j < F) {
            g[k] = load16(row + j);
            u[k] = load16(row + F + j);
        }
    }
#pragma unroll
    for (int k = 0; k < SWIGLU_VPT; k++) {
        int j = base + k * blockDim.x * 8;
        if (j >= F)
            break;
        swiglu_store8(out + (int64_t)blockIdx.x * F + j, g[k], u[k], &m);
    }
    if (amax != NULL)
        block_max_into(amax, m, shared);
}

/* No __restrict__ on gate_up and dgate_up: they may be the same buffer. out: NULL, or where the forward's output
 * goes again (with its amax into out_amax unless NULL). */
__global__ void __launch_bounds__(SWIGLU_MAX_THREADS)
    swiglu_backward_kernel(bf16 *dgate_up, const bf16 *__restrict__ dout, const bf16 *gate_up, int F, float *amax,
                           bf16 *__restrict__ out, float *out_amax)
{
    __shared__ float shared[WARP_SIZE];
    float m = 0.0f, m_out = 0.0f;
    int64_t row = (int64_t)blockIdx.x * 2 * F;
    int base = (blockIdx.y * blockDim.x * SWIGLU_VPT + threadIdx.x) * 8;
    bf16x8 g[SWIGLU_VPT], u[SWIGLU_VPT], d[SWIGLU_VPT];
#pragma unroll
    for (int k = 0; k < SWIGLU_VPT; k++) {
        int j = base + k * blockDim.x * 8;
        if (j < F) {
            g[k] = load16(gate_up + row + j);
            u[k] = load16(gate_up + row + F + j);
            d[k] = load16(dout + (int64_t)blockIdx.x * F + j);
        }
    }
#pragma unroll
    for (int k = 0; k < SWIGLU_VPT; k++) {
        int j = base + k * blockDim.x * 8;
        if (j >= F)
            break;
        bf16x8 dg, du;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float gf = __bfloat162float(g[k].v[i]), uf = __bfloat162float(u[k].v[i]);
            float df = __bfloat162float(d[k].v[i]);
            float sig = __fdividef(1.0f, 1.0f + __expf(-gf));
            dg.v[i] = __float2bfloat16_rn(df * uf * sig * (1.0f + gf * (1.0f - sig)));
            du.v[i] = __float2bfloat16_rn(df * gf * sig);
            m = fmaxf(m, fmaxf(fabsf(__bfloat162float(dg.v[i])), fabsf(__bfloat162float(du.v[i]))));
        }
        if (out != NULL)
            swiglu_store8(out + (int64_t)blockIdx.x * F + j, g[k], u[k], &m_out);
        store16(dgate_up + row + j, dg);
        store16(dgate_up + row + F + j, du);
    }
    if (amax != NULL)
        block_max_into(amax, m, shared);
    if (out_amax != NULL)
        block_max_into(out_amax, m_out, shared);
}

/* Threads per block: the whole row when it fits, in whole warps. */
static inline int swiglu_threads(int F)
{
    int threads = ceil_div(ceil_div(F / 8, SWIGLU_VPT), WARP_SIZE) * WARP_SIZE;
    return threads < SWIGLU_MAX_THREADS ? threads : SWIGLU_MAX_THREADS;
}

static inline dim3 swiglu_grid(int N, int F)
{
    if (N <= 0 || F <= 0 || F % 8 != 0) {
        FAIL("swiglu: N = %d, F = %d unsupported: F must be a positive multiple of 8 (16-byte bf16 vectors)", N, F);
    }
    return dim3(N, ceil_div(F / 8, swiglu_threads(F) * SWIGLU_VPT));
}

/* amax: NULL, or where max |out| goes (zeroed here first; FP8 scales, linear.h) */
static inline void swiglu_forward_amax(bf16 *out, const bf16 *gate_up, int N, int F, float *amax, cudaStream_t stream)
{
    profile_push(PROF_SWIGLU, stream);
    amax_reset(amax, stream);
    swiglu_forward_kernel<<<swiglu_grid(N, F), swiglu_threads(F), 0, stream>>>(out, gate_up, F, amax);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

static inline void swiglu_forward(bf16 *out, const bf16 *gate_up, int N, int F, cudaStream_t stream)
{
    swiglu_forward_amax(out, gate_up, N, F, NULL, stream);
}

/* The backward, and out = the forward's output again (bit-identical to swiglu_forward's), for a caller that did not
 * keep it; out NULL: the backward alone. dgate_up may be gate_up itself; out must not alias either. amax, out_amax:
 * NULL, or where max |dgate_up| and max |out| go (each zeroed here first). */
static inline void swiglu_backward_recompute(bf16 *dgate_up, bf16 *out, const bf16 *dout, const bf16 *gate_up, int N,
                                             int F, float *amax, float *out_amax, cudaStream_t stream)
{
    profile_push(PROF_SWIGLU, stream);
    amax_reset(amax, stream);
    amax_reset(out ? out_amax : NULL, stream);
    swiglu_backward_kernel<<<swiglu_grid(N, F), swiglu_threads(F), 0, stream>>>(dgate_up, dout, gate_up, F, amax, out,
                                                                                out ? out_amax : NULL);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

/* dgate_up may be gate_up itself. amax: NULL, or where max |dgate_up| goes (zeroed here first). */
static inline void swiglu_backward_amax(bf16 *dgate_up, const bf16 *dout, const bf16 *gate_up, int N, int F,
                                        float *amax, cudaStream_t stream)
{
    swiglu_backward_recompute(dgate_up, NULL, dout, gate_up, N, F, amax, NULL, stream);
}

static inline void swiglu_backward(bf16 *dgate_up, const bf16 *dout, const bf16 *gate_up, int N, int F,
                                   cudaStream_t stream)
{
    swiglu_backward_amax(dgate_up, dout, gate_up, N, F, NULL, stream);
}

#endif /* LLMC_SWIGLU_H */
