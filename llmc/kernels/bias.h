/*
 * bias.h: a Linear map's bias (Qwen2's q, k, v projections), forward and backward,
 * over rows of OC channels, N = B*T rows.
 *
 *   forward:  out[n,c] = bf16(out[n,c] + bias[c])           (in place, after the GEMM)
 *   backward: dbias[c] (= or +=) sum_n dout[n,c]            (fp32 sum, bf16 result)
 * The backward is deterministic without float atomics, as rmsnorm.h's dweight: block
 * (x, y) sums rows [y * BIAS_BWD_ROWS, (y + 1) * BIAS_BWD_ROWS) of 8-column vectors
 * into scratch[y, :], and rmsnorm.h's reduction adds the partials in a fixed order.
 * Scratch: bias_backward_scratch_floats(N, OC) floats.
 *
 * Memory: forward reads and writes out once and reads the bias from cache; backward
 * reads dout once and writes 1/BIAS_BWD_ROWS of it in fp32 partials. OC must be a
 * multiple of 8 and the pointers 16-byte aligned.
 */
#ifndef LLMC_BIAS_H
#define LLMC_BIAS_H

#include "llmc/common/cuda_common.h"
#include "llmc/common/profile.h"
#include "llmc/kernels/rmsnorm.h"

/* Rows per backward partial: 1/64 of dout's traffic in fp32 partials. */
#define BIAS_BWD_ROWS 64
#define BIAS_THREADS 256

static inline size_t bias_backward_scratch_floats(int N, int OC)
{
    return (size_t)ceil_div(N, BIAS_BWD_ROWS) * (size_t)OC;
}

/* Grid-stride over the 8-element vectors of out [N, OC]. */
__global__ void bias_forward_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ bias, int64_t n_vectors, int OC)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_vectors;
         i += (int64_t)gridDim.x * blockDim.x) {
        int c = (int)(i % (OC / 8)) * 8;
        bf16x8 x = load16(out + i * 8), b = load16(bias + c);
#pragma unroll
        for (int k = 0; k < 8; k++)
            x.v[k] = __float2bfloat16_rn(__bfloat162float(x.v[k]) + __bfloat162float(b.v[k]));
        store16(out + i * 8, x);
    }
}

/* Thread: 8 columns; block y: BIAS_BWD_ROWS rows, summed in row order. */
__global__ void bias_backward_partial_kernel(float *__restrict__ scratch, const bf16 *__restrict__ dout, int N, int OC)
{
    int c = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (c >= OC)
        return;
    int first = blockIdx.y * BIAS_BWD_ROWS, last = min(N, first + BIAS_BWD_ROWS);
    float sum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int n = first; n < last; n++) {
        bf16x8 d = load16_stream(dout + (int64_t)n * OC + c);
#pragma unroll
        for (int k = 0; k < 8; k++)
            sum[k] += __bfloat162float(d.v[k]);
    }
    float *row = scratch + (int64_t)blockIdx.y * OC + c;
#pragma unroll
    for (int k = 0; k < 8; k++)
        row[k] = sum[k];
}

static inline void bias_check_size(int N, int OC)
{
    if (N <= 0 || OC <= 0 || OC % 8 != 0)
        FAIL("bias: N = %d, OC = %d unsupported: OC must be a positive multiple of 8 (16-byte bf16 vectors)", N, OC);
}

static inline void bias_forward(bf16 *out, const bf16 *bias, int N, int OC, cudaStream_t stream)
{
    bias_check_size(N, OC);
    profile_push(PROF_GEMM, stream);
    int64_t n_vectors = (int64_t)N * (OC / 8);
    int64_t blocks = (n_vectors + BIAS_THREADS - 1) / BIAS_THREADS;
    bias_forward_kernel<<<(int)(blocks < 65536 ? blocks : 65536), BIAS_THREADS, 0, stream>>>(out, bias, n_vectors, OC);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

/* dbias (+)= the column sums of dout [N, OC]; scratch: bias_backward_scratch_floats(N, OC) floats. */
static inline void bias_backward(bf16 *dbias, float *scratch, const bf16 *dout, int N, int OC, int accumulate,
                                 cudaStream_t stream)
{
    bias_check_size(N, OC);
    profile_push(PROF_GEMM, stream);
    int n_partials = ceil_div(N, BIAS_BWD_ROWS);
    dim3 grid(ceil_div(OC / 8, BIAS_THREADS), n_partials);
    bias_backward_partial_kernel<<<grid, BIAS_THREADS, 0, stream>>>(scratch, dout, N, OC);
    CUDA_CHECK_LAST();
    dim3 block(WARP_SIZE, RMSNORM_REDUCE_Y);
    rmsnorm_dweight_reduce_kernel<<<ceil_div(OC, WARP_SIZE), block, 0, stream>>>(dbias, scratch, n_partials, OC,
                                                                                 accumulate);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

#endif /* LLMC_BIAS_H */
