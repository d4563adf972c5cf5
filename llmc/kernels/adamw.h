/*
 * adamw.h: gradient norm, clip coefficient and the AdamW update, all on the
 * device so that the host never waits inside a step.
 *
 *   global_norm_squared: out[0] = sum_i grad[i]^2 over bf16 gradients, deterministic:
 *     NORM_BLOCKS blocks (a fixed grid, whatever the GPU) each write one partial to
 *     scratch, then one block adds the partials in a fixed order. Squares are summed in
 *     double (fp64 costs nothing next to the memory stream on an H100), block partials
 *     are stored as floats. Scratch: NORM_BLOCKS floats. norm_squared_combine adds
 *     several such sums (one per ZeRO bucket) in a fixed order.
 *   clip_coefficient: coef = max_norm > 0 ? min(1, max_norm / (sqrt(ns) + 1e-6)) : 1, and
 *     NaN when ns is not finite (a NaN or infinite gradient somewhere).
 *   adamw_update: adamw_step.h's AdamW (torch.optim.AdamW's operations in its
 *   order, each one rounded float operation: the bits of the CPU AdamW,
 *   adamw_cpu.h) with g = grad * grad_scale, on the fp32 master
 *   w = master_join(param, master_lo) (llmc/kernels/master_weights.h), then
 *   (param, master_lo) = master_split(w): param is the bf16 weight the GEMMs
 *   read. The scalars come from adamw_scalars (in double, as PyTorch does in
 *   Python, then floats). A grad_scale that is not finite (the clip
 *   coefficient of a non-finite norm) skips the update: nothing is read or
 *   written, so a NaN never reaches the weights or the moments.
 *
 * One launch covers any range [first, first + n) of the flat parameter buffers
 * (all tensors at once, or one rank's ZeRO shard); which elements get weight decay
 * comes from a table of runs (AdamWRuns: sorted run starts, a decay flag each), found
 * by binary search per 4-element vector, so run starts must be multiples of 4.
 *
 * Memory: the norm reads grad once (2 bytes per parameter); the update reads param,
 * master_lo, grad (2 bytes each), m, v (4 each) once and writes param, master_lo,
 * m, v once: 26 bytes per parameter (27 with the change codes of --update-gather
 * delta, delta_codec.h). Pointers must be 16-byte aligned for fp32 and
 * 8-byte aligned for the 16-bit buffers; the last n % 4 elements take a scalar path.
 * 64-bit indices throughout.
 */
#ifndef LLMC_ADAMW_H
#define LLMC_ADAMW_H

#include <math.h>

#include "llmc/common/cuda_common.h"
#include "llmc/common/profile.h"
#include "llmc/kernels/adamw_step.h"
#include "llmc/kernels/delta_codec.h"
#include "llmc/kernels/master_weights.h"

#define NORM_BLOCKS 1024
#define NORM_THREADS 256
#define ADAMW_THREADS 256
/* Enough threads to fill an H100 several times over; more would only add blocks. */
#define ADAMW_MAX_BLOCKS 8192
/* Decay runs held in shared memory: a 126-layer model needs about 255. */
#define ADAMW_MAX_RUNS 1024

__device__ __forceinline__ double warp_sum_double(double x)
{
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

/* block_sum in double; shared must hold 32 doubles. */
__device__ __forceinline__ double block_sum_double(double x, double *shared)
{
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, n_warps = blockDim.x / WARP_SIZE;
    x = warp_sum_double(x);
    __syncthreads();
    if (lane == 0)
        shared[warp] = x;
    __syncthreads();
    x = lane < n_warps ? shared[lane] : 0.0;
    return warp_sum_double(x);
}

__global__ void norm_squared_partial_kernel(float *__restrict__ partials, const bf16 *__restrict__ x, int64_t n)
{
    __shared__ double shared[WARP_SIZE];
    int64_t n8 = n / 8;
    double acc = 0.0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        bf16x8 v = load16_stream(x + i * 8);
        float part = 0.0f; /* 8 squares of bf16 values: exact in fp32 up to the rounding of the sum */
#pragma unroll
        for (int k = 0; k < 8; k++)
            part = fmaf(__bfloat162float(v.v[k]), __bfloat162float(v.v[k]), part);
        acc += (double)part;
    }
    if (blockIdx.x == 0 && threadIdx.x < n - n8 * 8) {
        double t = __bfloat162float(x[n8 * 8 + threadIdx.x]);
        acc += t * t;
    }
    acc = block_sum_double(acc, shared);
    if (threadIdx.x == 0)
        partials[blockIdx.x] = (float)acc;
}

/* out[0] = the sum of partials[0, n), in a fixed order; blockDim.x >= n, a multiple of 32. */
__global__ void norm_squared_final_kernel(float *__restrict__ out, const float *__restrict__ partials, int n)
{
    __shared__ double shared[WARP_SIZE];
    double acc = block_sum_double(threadIdx.x < n ? (double)partials[threadIdx.x] : 0.0, shared);
    if (threadIdx.x == 0)
        out[0] = (float)acc;
}

__global__ void clip_coefficient_kernel(float *__restrict__ coef, const float *__restrict__ norm_squared,
                                        float max_norm)
{
    float ns = norm_squared[0];
    /* a gradient that is not finite gives a coefficient that is not either: AdamW then skips the step */
    coef[0] = !isfinite(ns) ? NAN : max_norm > 0.0f ? fminf(1.0f, max_norm / (sqrtf(ns) + 1e-6f)) : 1.0f;
}

/* Which elements get weight decay: run r covers flat elements [start[r], start[r + 1]),
 * with decay[r] 0 or 1; device arrays of n_runs entries, and the same on the host (for
 * the host's AdamW under --offload, llmc/model/optimizer_offload.h). */
typedef struct {
    int n_runs;
    int64_t *start;
    unsigned char *decay;
    int64_t *host_start;
    unsigned char *host_decay;
} AdamWRuns;

/* The run holding flat element i: the last r with start[r] <= i. */
__device__ __forceinline__ int adamw_run_of(const int64_t *start, int n_runs, int64_t i)
{
    int lo = 0, hi = n_runs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (start[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* One parameter in its split form (bf16 bits and residual), updated in place. */
__device__ __forceinline__ void adamw_split_element(uint16_t *param, int16_t *master_lo, float grad, float *m, float *v,
                                                    float scale, float decay, AdamWScalars s)
{
    float w = adamw_element(master_join(*param, *master_lo), m, v, grad, scale, decay, s);
    master_split(w, param, master_lo);
}

/* Grid-stride over 4-element vectors of [first, first + n); block 0 also takes the n % 4 tail. */
__global__ void __launch_bounds__(ADAMW_THREADS)
    adamw_kernel(bf16 *__restrict__ param, int16_t *__restrict__ master_lo, const bf16 *__restrict__ grad,
                 float *__restrict__ m, float *__restrict__ v, int64_t first, int64_t n, AdamWRuns runs,
                 const float *__restrict__ grad_scale, AdamWScalars s, int8_t *__restrict__ change)
{
    __shared__ int64_t run_start[ADAMW_MAX_RUNS];
    __shared__ float run_decay[ADAMW_MAX_RUNS];
    for (int r = threadIdx.x; r < runs.n_runs; r += blockDim.x) {
        run_start[r] = runs.start[r];
        run_decay[r] = runs.decay[r] ? s.decay : 1.0f;
    }
    __syncthreads();
    float scale = grad_scale[0];
    if (!isfinite(scale)) { /* a non-finite gradient norm: the step is skipped, nothing written but no change */
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; change && i < n;
             i += (int64_t)gridDim.x * blockDim.x)
            change[i] = 0;
        return;
    }
    int64_t n4 = n / 4;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t at = i * 4;
        float decay = run_decay[adamw_run_of(run_start, runs.n_runs, first + at)];
        /* every stream is touched once per step: keep it out of the way in L2 */
        uint2 p = __ldcs(reinterpret_cast<const uint2 *>(param + at)), old = p;
        uint2 lo = __ldcs(reinterpret_cast<const uint2 *>(master_lo + at));
        uint2 g = __ldcs(reinterpret_cast<const uint2 *>(grad + at));
        floatx4 mv = load16_stream(m + at), vv = load16_stream(v + at);
        const bf16 *g16 = reinterpret_cast<const bf16 *>(&g);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            adamw_split_element(reinterpret_cast<uint16_t *>(&p) + k, reinterpret_cast<int16_t *>(&lo) + k,
                                __bfloat162float(g16[k]), &mv.v[k], &vv.v[k], scale, decay, s);
        }
        *reinterpret_cast<uint2 *>(param + at) = p;
        *reinterpret_cast<uint2 *>(master_lo + at) = lo;
        store16(m + at, mv);
        store16(v + at, vv);
        if (change) {
            char4 c;
            const uint16_t *o16 = reinterpret_cast<const uint16_t *>(&old),
                           *p16 = reinterpret_cast<const uint16_t *>(&p);
            c.x = delta_code(o16[0], p16[0]);
            c.y = delta_code(o16[1], p16[1]);
            c.z = delta_code(o16[2], p16[2]);
            c.w = delta_code(o16[3], p16[3]);
            *reinterpret_cast<char4 *>(change + at) = c;
        }
    }
    if (blockIdx.x == 0 && threadIdx.x < n - n4 * 4) {
        int64_t at = n4 * 4 + threadIdx.x;
        float decay = run_decay[adamw_run_of(run_start, runs.n_runs, first + at)];
        uint16_t *bits = reinterpret_cast<uint16_t *>(param + at), old = *bits;
        adamw_split_element(bits, master_lo + at, __bfloat162float(grad[at]), m + at, v + at, scale, decay, s);
        if (change)
            change[at] = delta_code(old, *bits);
    }
}

/* The decay runs on the device, from host arrays: start[n_runs] (ascending, multiples of
 * 4, start[0] = 0) and decay[n_runs]. Adjacent runs with the same flag are merged. */
static inline AdamWRuns adamw_runs_create(const int64_t *start, const unsigned char *decay, int n_runs)
{
    int64_t *merged_start = (int64_t *)malloc_check(sizeof(int64_t) * (n_runs + 1), "AdamW runs");
    unsigned char *merged_decay = (unsigned char *)malloc_check((size_t)n_runs + 1, "AdamW runs");
    int count = 0;
    for (int r = 0; r < n_runs; r++) {
        if (start[r] % 4 != 0 || (r == 0 && start[r] != 0) || (r > 0 && start[r] < start[r - 1]))
            FAIL("adamw_runs_create: run %d starts at %lld; runs must start at 0, ascend and be multiples of 4", r,
                 (long long)start[r]);
        if (count > 0 && merged_decay[count - 1] == (decay[r] != 0))
            continue;
        merged_start[count] = start[r];
        merged_decay[count] = decay[r] != 0;
        count++;
    }
    if (count > ADAMW_MAX_RUNS)
        FAIL("adamw_runs_create: %d decay runs, at most %d fit in shared memory\n  hint: raise ADAMW_MAX_RUNS", count,
             ADAMW_MAX_RUNS);
    AdamWRuns runs;
    runs.n_runs = count;
    runs.start = (int64_t *)cuda_malloc_named(sizeof(int64_t) * count, "AdamW runs");
    runs.decay = (unsigned char *)cuda_malloc_named((size_t)count, "AdamW runs");
    CUDA_CHECK(cudaMemcpy(runs.start, merged_start, sizeof(int64_t) * count, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(runs.decay, merged_decay, (size_t)count, cudaMemcpyHostToDevice));
    runs.host_start = merged_start;
    runs.host_decay = merged_decay;
    return runs;
}

static inline void adamw_runs_free(AdamWRuns *runs)
{
    cuda_free(runs->start);
    cuda_free(runs->decay);
    free(runs->host_start);
    free(runs->host_decay);
    memset(runs, 0, sizeof(*runs));
}

/* scratch: NORM_BLOCKS floats. out[0] = sum of grad[i]^2, the same bits every run. */
static inline void global_norm_squared(float *out, float *scratch, const bf16 *grad, int64_t n, cudaStream_t stream)
{
    if (n < 0 || (uintptr_t)grad % 16 != 0) {
        FAIL("global_norm_squared: n = %lld, grad %p: n must be >= 0 and grad 16-byte aligned", (long long)n,
             (const void *)grad);
    }
    profile_push(PROF_OPTIMIZER, stream);
    norm_squared_partial_kernel<<<NORM_BLOCKS, NORM_THREADS, 0, stream>>>(scratch, grad, n);
    CUDA_CHECK_LAST();
    norm_squared_final_kernel<<<1, NORM_BLOCKS, 0, stream>>>(out, scratch, NORM_BLOCKS);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

/* out[0] = parts[0] + ... + parts[n - 1], the same bits every run: the squared
 * norm of several ranges from each range's (global_norm_squared). n <= NORM_BLOCKS. */
static inline void norm_squared_combine(float *out, const float *parts, int n, cudaStream_t stream)
{
    if (n < 1 || n > NORM_BLOCKS)
        FAIL("norm_squared_combine: %d parts; 1 to %d can be combined", n, NORM_BLOCKS);
    profile_push(PROF_OPTIMIZER, stream);
    norm_squared_final_kernel<<<1, (n + WARP_SIZE - 1) / WARP_SIZE * WARP_SIZE, 0, stream>>>(out, parts, n);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

static inline void clip_coefficient(float *coef, const float *norm_squared, float max_norm, cudaStream_t stream)
{
    profile_push(PROF_OPTIMIZER, stream);
    clip_coefficient_kernel<<<1, 1, 0, stream>>>(coef, norm_squared, max_norm);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

/* Updates flat elements [first, first + n): each pointer points at element `first` of
 * its buffer. s: adamw_scalars of the step. grad_scale: one device float that multiplies
 * the gradient, e.g. the clip coefficient; s.decay applies to the runs marked for it.
 * change: NULL, or [n] where each weight's change of bf16 bits goes as delta_codec.h's
 * one-byte code (all 0 when the step is skipped), 4-byte aligned. */
static inline void adamw_update_change(bf16 *param, int16_t *master_lo, const bf16 *grad, float *m, float *v,
                                       int64_t first, int64_t n, const AdamWRuns *runs, AdamWScalars s,
                                       const float *grad_scale, int8_t *change, cudaStream_t stream)
{
    if (n < 0 || first < 0 || first % 4 != 0)
        FAIL("adamw_update: n = %lld must be >= 0 and first = %lld a multiple of 4", (long long)n, (long long)first);
    if ((uintptr_t)m % 16 || (uintptr_t)v % 16 || (uintptr_t)param % 8 || (uintptr_t)master_lo % 8 ||
        (uintptr_t)grad % 8 || (uintptr_t)change % 4) {
        FAIL("adamw_update: m %p, v %p must be 16-byte aligned, param %p, master_lo %p, grad %p 8-byte aligned and "
             "change %p 4-byte aligned\n  hint: start each range at a multiple of 4 elements of the flat buffers",
             (void *)m, (void *)v, (void *)param, (void *)master_lo, (const void *)grad, (void *)change);
    }
    if (runs->n_runs < 1)
        FAIL("adamw_update: no decay runs (adamw_runs_create)");
    if (n == 0)
        return;
    int64_t blocks = (n / 4 + ADAMW_THREADS - 1) / ADAMW_THREADS;
    if (blocks > ADAMW_MAX_BLOCKS)
        blocks = ADAMW_MAX_BLOCKS;
    if (blocks < 1)
        blocks = 1; /* n < 4: the tail alone */
    profile_push(PROF_OPTIMIZER, stream);
    adamw_kernel<<<(int)blocks, ADAMW_THREADS, 0, stream>>>(param, master_lo, grad, m, v, first, n, *runs, grad_scale,
                                                            s, change);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

static inline void adamw_update(bf16 *param, int16_t *master_lo, const bf16 *grad, float *m, float *v, int64_t first,
                                int64_t n, const AdamWRuns *runs, AdamWScalars s, const float *grad_scale,
                                cudaStream_t stream)
{
    adamw_update_change(param, master_lo, grad, m, v, first, n, runs, s, grad_scale, NULL, stream);
}

#endif /* LLMC_ADAMW_H */
