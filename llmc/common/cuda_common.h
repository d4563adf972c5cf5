/*
 * cuda_common.h: what every CUDA header here shares: the bf16 type, error
 * checks that print file, line and a hint, a named device allocator whose
 * out-of-memory error says which allocation failed and what to reduce, and
 * 16-byte vector loads and stores.
 *
 * Every CUDA runtime call goes through CUDA_CHECK; every kernel launch is
 * followed by CUDA_CHECK_LAST(), which catches bad launch configurations.
 */
#ifndef LLMC_CUDA_COMMON_H
#define LLMC_CUDA_COMMON_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "llmc/common/utils.h"

typedef __nv_bfloat16 bf16;

#define WARP_SIZE 32

static inline void cuda_check_at(cudaError_t status, const char *what, const char *file, int line)
{
    if (status != cudaSuccess) {
        fail_at(file, line, "CUDA error in %s: %s (%s)\n  hint: %s", what, cudaGetErrorString(status),
                cudaGetErrorName(status),
                status == cudaErrorMemoryAllocation ? "reduce the batch size (-B) or sequence length (-T), "
                                                      "or enable activation recomputation"
                : status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver
                    ? "no usable NVIDIA GPU or driver here; the CPU reference is ./train_llama_ref"
                    : "rerun with CUDA_LAUNCH_BLOCKING=1 to find the failing kernel");
    }
}
#define CUDA_CHECK(call) cuda_check_at((call), #call, __FILE__, __LINE__)
/* After each kernel launch: catches bad launch configurations at once. */
#define CUDA_CHECK_LAST() cuda_check_at(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

static inline int ceil_div(int64_t a, int64_t b)
{
    return (int)((a + b - 1) / b);
}

/* The device memory this program took through cuda_malloc_named and has not
 * given back (by cuda_free), and the largest that total reached. C++17 inline
 * variables: one count for the whole program, whichever translation unit
 * allocates (the attention workspace is allocated in its own). */
typedef struct {
    void *ptr;
    size_t bytes;
} CudaAllocation;
inline CudaAllocation *cuda_allocations = NULL;
inline int cuda_n_allocations = 0, cuda_allocations_cap = 0;
inline size_t cuda_bytes_allocated = 0;
inline size_t cuda_bytes_allocated_peak = 0;

/* cudaMalloc whose failure names the allocation, its size and the free memory. */
static inline void *cuda_malloc_named_at(size_t bytes, const char *what, const char *file, int line)
{
    void *p = NULL;
    cudaError_t status = cudaMalloc(&p, bytes);
    if (status == cudaErrorMemoryAllocation) {
        size_t free_bytes = 0, total_bytes = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_bytes, &total_bytes);
        fail_at(file, line,
                "out of GPU memory allocating %s: %.2f GiB requested, %.2f GiB free of %.2f GiB "
                "(%.2f GiB already held by this program)\n  hint: reduce the batch size (-B) or sequence length (-T), "
                "raise the activation recomputation level (--recompute), or use more GPUs with ZeRO sharding",
                what, bytes / 1073741824.0, free_bytes / 1073741824.0, total_bytes / 1073741824.0,
                cuda_bytes_allocated / 1073741824.0);
    }
    cuda_check_at(status, what, file, line);
    if (cuda_n_allocations == cuda_allocations_cap) {
        cuda_allocations_cap = cuda_allocations_cap ? 2 * cuda_allocations_cap : 256;
        cuda_allocations = (CudaAllocation *)realloc(cuda_allocations, sizeof(CudaAllocation) * cuda_allocations_cap);
        if (!cuda_allocations)
            fail_at(file, line, "out of host memory for the table of GPU allocations");
    }
    cuda_allocations[cuda_n_allocations].ptr = p;
    cuda_allocations[cuda_n_allocations].bytes = bytes;
    cuda_n_allocations++;
    cuda_bytes_allocated += bytes;
    if (cuda_bytes_allocated > cuda_bytes_allocated_peak)
        cuda_bytes_allocated_peak = cuda_bytes_allocated;
    return p;
}
#define cuda_malloc_named(bytes, what) cuda_malloc_named_at(bytes, what, __FILE__, __LINE__)

/* Gives back what cuda_malloc_named took (NULL: nothing). */
static inline void cuda_free_at(void *p, const char *file, int line)
{
    if (!p)
        return;
    int i = cuda_n_allocations - 1; /* most frees undo the latest allocations */
    while (i >= 0 && cuda_allocations[i].ptr != p)
        i--;
    if (i < 0)
        fail_at(file, line, "cuda_free: %p was not allocated by cuda_malloc_named (or freed twice)", p);
    cuda_bytes_allocated -= cuda_allocations[i].bytes;
    cuda_allocations[i] = cuda_allocations[--cuda_n_allocations];
    cuda_check_at(cudaFree(p), "cudaFree", file, line);
}
#define cuda_free(p) cuda_free_at(p, __FILE__, __LINE__)

/* 16 bytes of T, for loads and stores that the hardware does in one instruction. */
template <class T> struct alignas(16) Vec16 {
    static constexpr int size = 16 / sizeof(T);
    T v[16 / sizeof(T)];
};
typedef Vec16<bf16> bf16x8;
typedef Vec16<float> floatx4;

template <class T> __device__ __forceinline__ Vec16<T> load16(const T *address)
{
    Vec16<T> out;
    *reinterpret_cast<int4 *>(out.v) = *reinterpret_cast<const int4 *>(address);
    return out;
}
/* Load that bypasses L1 and is evicted first: for data read exactly once. */
template <class T> __device__ __forceinline__ Vec16<T> load16_stream(const T *address)
{
    Vec16<T> out;
    *reinterpret_cast<int4 *>(out.v) = __ldcs(reinterpret_cast<const int4 *>(address));
    return out;
}
template <class T> __device__ __forceinline__ void store16(T *address, Vec16<T> value)
{
    *reinterpret_cast<int4 *>(address) = *reinterpret_cast<const int4 *>(value.v);
}

/* The two reductions kernels need over a warp or a block. */
enum Reduce { REDUCE_SUM, REDUCE_MAX };

__device__ __forceinline__ float reduce_op(float a, float b, Reduce op)
{
    return op == REDUCE_SUM ? a + b : fmaxf(a, b);
}

__device__ __forceinline__ float warp_reduce(float x, Reduce op)
{
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1)
        x = reduce_op(x, __shfl_xor_sync(0xffffffffu, x, offset), op);
    return x;
}
__device__ __forceinline__ float warp_sum(float x)
{
    return warp_reduce(x, REDUCE_SUM);
}

/* Reduction over a block whose size is a multiple of 32 (at most 1024); every thread gets the result. shared must
 * hold 32 floats. Padding with 0 is neutral for the max too: the max callers reduce magnitudes (>= 0). */
__device__ __forceinline__ float block_reduce(float x, float *shared, Reduce op)
{
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, n_warps = blockDim.x / WARP_SIZE;
    x = warp_reduce(x, op);
    __syncthreads(); /* shared may still be read by a previous call */
    if (lane == 0)
        shared[warp] = x;
    __syncthreads();
    return warp_reduce(lane < n_warps ? shared[lane] : 0.0f, op);
}
__device__ __forceinline__ float block_sum(float x, float *shared)
{
    return block_reduce(x, shared, REDUCE_SUM);
}

/* target[0] = max(target[0], max over the block of x), one atomic per block, for x >= 0 (non-negative floats order
 * as their bits do, so an int atomicMax is a float max). For FP8 scales: the amax of a tensor, taken by the kernel
 * that reads or writes it anyway (linear.h). Block size a multiple of 32; shared must hold 32 floats. */
__device__ __forceinline__ void block_max_into(float *target, float x, float *shared)
{
    x = block_reduce(x, shared, REDUCE_MAX);
    if (threadIdx.x == 0)
        atomicMax((int *)target, __float_as_int(x));
}

/* Zeroes the amax that block_max_into kernels will raise; NULL (no FP8): nothing. */
static inline void amax_reset(float *amax, cudaStream_t stream)
{
    if (amax)
        CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
}

#endif /* LLMC_CUDA_COMMON_H */
