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
 *
 * Memory: forward reads gate_up once and writes out [N, F] once; backward reads
 * gate_up and dout once and writes dgate_up [N, 2F] once. dgate_up may alias
 * gate_up (in place): each thread reads its g and u before it writes dg and du.
 * F must be a multiple of 8 (16-byte bf16 vectors) and pointers 16-byte aligned.
 */
#ifndef LLMC_SWIGLU_H
#define LLMC_SWIGLU_H

#include "cuda_common.h"

#define SWIGLU_THREADS 256

/* Grid (N, ceil(F/8 / threads)): row from blockIdx.x, so no 64-bit division. */
__global__ void swiglu_forward_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ gate_up, int F)
{
    int j = (blockIdx.y * blockDim.x + threadIdx.x) * 8;
    if (j >= F)
        return;
    const bf16 *row = gate_up + (int64_t)blockIdx.x * 2 * F;
    bf16x8 g = load16_stream(row + j), u = load16_stream(row + F + j);
    bf16x8 o;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float gf = __bfloat162float(g.v[i]);
        o.v[i] = __float2bfloat16_rn(__fdividef(gf, 1.0f + __expf(-gf)) * __bfloat162float(u.v[i]));
    }
    store16(out + (int64_t)blockIdx.x * F + j, o);
}

/* No __restrict__ on gate_up and dgate_up: they may be the same buffer. */
__global__ void swiglu_backward_kernel(bf16 *dgate_up, const bf16 *__restrict__ dout, const bf16 *gate_up, int F)
{
    int j = (blockIdx.y * blockDim.x + threadIdx.x) * 8;
    if (j >= F)
        return;
    int64_t row = (int64_t)blockIdx.x * 2 * F;
    bf16x8 g = load16_stream(gate_up + row + j), u = load16_stream(gate_up + row + F + j);
    bf16x8 d = load16_stream(dout + (int64_t)blockIdx.x * F + j);
    bf16x8 dg, du;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float gf = __bfloat162float(g.v[i]), uf = __bfloat162float(u.v[i]), df = __bfloat162float(d.v[i]);
        float sig = __fdividef(1.0f, 1.0f + __expf(-gf));
        dg.v[i] = __float2bfloat16_rn(df * uf * sig * (1.0f + gf * (1.0f - sig)));
        du.v[i] = __float2bfloat16_rn(df * gf * sig);
    }
    store16(dgate_up + row + j, dg);
    store16(dgate_up + row + F + j, du);
}

static inline dim3 swiglu_grid(int N, int F)
{
    if (N <= 0 || F <= 0 || F % 8 != 0) {
        FAIL("swiglu: N = %d, F = %d unsupported: F must be a positive multiple of 8 (16-byte bf16 vectors)", N, F);
    }
    return dim3(N, ceil_div(F / 8, SWIGLU_THREADS));
}

static inline void swiglu_forward(bf16 *out, const bf16 *gate_up, int N, int F, cudaStream_t stream)
{
    swiglu_forward_kernel<<<swiglu_grid(N, F), SWIGLU_THREADS, 0, stream>>>(out, gate_up, F);
    CUDA_CHECK_LAST();
}

/* dgate_up may be gate_up itself. */
static inline void swiglu_backward(bf16 *dgate_up, const bf16 *dout, const bf16 *gate_up, int N, int F,
                                   cudaStream_t stream)
{
    swiglu_backward_kernel<<<swiglu_grid(N, F), SWIGLU_THREADS, 0, stream>>>(dgate_up, dout, gate_up, F);
    CUDA_CHECK_LAST();
}

#endif /* LLMC_SWIGLU_H */
