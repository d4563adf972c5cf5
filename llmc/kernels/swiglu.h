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
 * Per tensor, swiglu_backward_codes_t writes, instead of out, the down map's x^T codes
 * for its weight gradient: codes_t[f, n] = e4m3(out[n, f] * scale), the scale from the
 * forward's max |out| (the recomputed out is the forward's bit for bit), in 64 x 64 tiles
 * through shared memory as fp8_quantize.h's transposing quantiser: 1 byte written per
 * element of out instead of 2, and no pass that reads out back (4 bytes of traffic
 * per element less); the codes are that quantiser's bit for bit.
 */
#ifndef LLMC_SWIGLU_H
#define LLMC_SWIGLU_H

#include "llmc/common/cuda_common.h"
#include "llmc/common/profile.h"
#include "llmc/kernels/fp8_quantize.h"

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

/* dg and du of eight gate, up and output-gradient values; their largest magnitude raised into *m. */
__device__ __forceinline__ void swiglu_grad8(bf16x8 &dg, bf16x8 &du, const bf16x8 &g, const bf16x8 &u, const bf16x8 &d,
                                             float *m)
{
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float gf = __bfloat162float(g.v[i]), uf = __bfloat162float(u.v[i]), df = __bfloat162float(d.v[i]);
        float sig = __fdividef(1.0f, 1.0f + __expf(-gf));
        dg.v[i] = __float2bfloat16_rn(df * uf * sig * (1.0f + gf * (1.0f - sig)));
        du.v[i] = __float2bfloat16_rn(df * gf * sig);
        *m = fmaxf(*m, fmaxf(fabsf(__bfloat162float(dg.v[i])), fabsf(__bfloat162float(du.v[i]))));
    }
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
        swiglu_grad8(dg, du, g[k], u[k], d[k], &m);
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

/* The backward, with the forward's output as the x^T codes of the down map's weight gradient (see the top): a
 * 64 x 64 tile of out per block of FP8_THREADS, rows r0.. (tokens) and columns c0.. (f); N and F multiples of 16.
 * dgate_up may be gate_up (each element is read before it is written, by the same thread). */
__global__ void __launch_bounds__(FP8_THREADS)
    swiglu_backward_codes_t_kernel(bf16 *dgate_up, const bf16 *__restrict__ dout, const bf16 *gate_up, int N, int F,
                                   float *amax, uint8_t *__restrict__ codes_t, float *inv_t, const float *out_amax)
{
    __shared__ __align__(16) uint8_t tile[FP8_CODES_TILE][FP8_CODES_TILE + 4];
    __shared__ float shared[WARP_SIZE];
    float scale = fp8_scale_from_amax(out_amax[0], FP8_E4M3), m = 0.0f;
    int64_t r0 = (int64_t)blockIdx.y * FP8_CODES_TILE, c0 = (int64_t)blockIdx.x * FP8_CODES_TILE;
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
        inv_t[0] = 1.0f / scale;
    /* all of a thread's vectors loaded before any is stored: dgate_up may alias gate_up, so the compiler could not
     * move a later load above an earlier store */
    const int vpt = FP8_CODES_TILE * FP8_CODES_TILE / 8 / FP8_THREADS; /* 2 */
    bf16x8 g[vpt], u[vpt], d[vpt];
#pragma unroll
    for (int k = 0; k < vpt; k++) {
        int v = threadIdx.x + k * FP8_THREADS, row = v / (FP8_CODES_TILE / 8), col = v % (FP8_CODES_TILE / 8) * 8;
        int64_t n = r0 + row, j = c0 + col;
        if (n < N && j < F) {
            g[k] = load16(gate_up + n * 2 * F + j);
            u[k] = load16(gate_up + n * 2 * F + F + j);
            d[k] = load16(dout + n * F + j);
        }
    }
#pragma unroll
    for (int k = 0; k < vpt; k++) {
        int v = threadIdx.x + k * FP8_THREADS, row = v / (FP8_CODES_TILE / 8), col = v % (FP8_CODES_TILE / 8) * 8;
        int64_t n = r0 + row, j = c0 + col;
        if (n >= N || j >= F)
            continue;
        bf16x8 dg, du;
        __align__(8) uint8_t q[8];
#pragma unroll
        for (int i = 0; i < 8; i++)
            q[i] = fp8_code(__bfloat162float(swiglu_value(g[k].v[i], u[k].v[i])) * scale, FP8_E4M3);
        swiglu_grad8(dg, du, g[k], u[k], d[k], &m);
        store16(dgate_up + n * 2 * F + j, dg);
        store16(dgate_up + n * 2 * F + F + j, du);
        fp8_tile_put8(tile, row, col, *reinterpret_cast<const uint2 *>(q));
    }
    __syncthreads();
    fp8_tile_store_transposed(codes_t, tile, r0, c0, N, F);
    if (amax != NULL)
        block_max_into(amax, m, shared);
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

/* The backward (dgate_up may be gate_up itself; amax: NULL, or where max |dgate_up| goes, zeroed here first), and
 * codes_t [F, N] = the E4M3 codes of the forward's output, transposed, at the scale of out_amax (the forward's max
 * |out|, read, not written), with its dequantisation scale in inv_t[0]: linear.h's per-tensor x^T codes for the down
 * map's weight gradient, bit for bit. N and F multiples of 16, codes_t 16-byte aligned. */
static inline void swiglu_backward_codes_t(bf16 *dgate_up, const bf16 *dout, const bf16 *gate_up, int N, int F,
                                           float *amax, uint8_t *codes_t, float *inv_t, const float *out_amax,
                                           cudaStream_t stream)
{
    if (N <= 0 || F <= 0 || N % 16 || F % 16 || (uintptr_t)codes_t % 16)
        FAIL("swiglu_backward_codes_t: N = %d, F = %d: both must be positive multiples of 16 and the codes 16-byte "
             "aligned (16-byte stores of the transposed codes)",
             N, F);
    profile_push(PROF_SWIGLU, stream);
    amax_reset(amax, stream);
    dim3 grid(ceil_div(F, FP8_CODES_TILE), ceil_div(N, FP8_CODES_TILE));
    swiglu_backward_codes_t_kernel<<<grid, FP8_THREADS, 0, stream>>>(dgate_up, dout, gate_up, N, F, amax, codes_t,
                                                                     inv_t, out_amax);
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
