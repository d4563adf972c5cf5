/*
 * fused_classifier.h: lm_head + softmax cross-entropy + their backward, in row
 * chunks so that the [N, V] logits never exist at once (Liger's fused linear
 * cross-entropy, with chunks sized from a memory budget instead of Liger's
 * small ones, so that every GEMM stays large enough to run at full speed).
 *
 * For each chunk of rows r (x_r [n, C] bf16, W [V, C] bf16, targets y_r):
 *   logits = x_r @ W^T                                 [n, V] bf16, in the scratch buffer
 *   per row i:  loss_i = logsumexp(logits_i) - logits_i[y_i]          fp32, into losses[N]
 *               dlogits_i = (softmax(logits_i) - onehot(y_i)) * inv_count   bf16, over logits
 *   rows with y_i == IGNORE_INDEX (-100, common/utils.h): loss 0, dlogits 0
 *   dx_r = dlogits @ W                                 [n, C] bf16, overwritten
 *   dW (= or +=) dlogits^T @ x_r                       [V, C] bf16; the first chunk
 *                                                      overwrites unless accumulate
 * inv_count = 1 / (non-ignored targets in the whole optimizer step, all micro-steps), so
 * dW and dx are gradients of the step's mean loss. losses are per row and unscaled.
 *
 * Memory: reads x, W, targets; writes losses and dx; writes or adds into dW; uses the scratch,
 * [chunk, V] bf16 (fused_classifier_chunk_rows sizes it from a byte budget).
 * A target outside [0, V) other than -100 gives a NaN loss: bad data shows in the
 * loss instead of becoming an out-of-bounds read.
 */
#ifndef LLMC_FUSED_CLASSIFIER_H
#define LLMC_FUSED_CLASSIFIER_H

#include <cooperative_groups.h>
#include <cuda_pipeline.h>
#include <float.h>

#include "llmc/common/cuda_common.h"
#include "llmc/common/profile.h"
#include "llmc/kernels/matmul.h"

#define XENT_BLOCK 512

/* (max, sum of exp(v - max)) pairs merge exactly; -FLT_MAX (not -inf) marks "no element yet",
 * so merging two empty pairs gives 0 * exp(0) = 0 instead of NaN. */
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2)
{
    float mx = fmaxf(m, m2);
    s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
    m = mx;
}

/* d loss / d logit_j = (softmax_j - [j == target]) * inv_count; 0 for an ignored row */
__device__ __forceinline__ float xent_grad(float logit, int j, int target, float lse, float inv_count, int ignored)
{
    return ignored ? 0.0f : (__expf(logit - lse) - (j == target ? 1.0f : 0.0f)) * inv_count;
}

/* Eight more logits into a thread's (max, sum) pair: one rescale for the eight. */
__device__ __forceinline__ void lse_add8(float &m, float &s, bf16x8 v)
{
    float f[8], vmax = m;
    for (int k = 0; k < 8; k++) {
        f[k] = __bfloat162float(v.v[k]);
        vmax = fmaxf(vmax, f[k]);
    }
    s *= __expf(m - vmax);
    for (int k = 0; k < 8; k++)
        s += __expf(f[k] - vmax);
    m = vmax;
}

/* The block's (max, sum) pair from every thread's, in a fixed order; every thread gets it. */
__device__ __forceinline__ void lse_block_merge(float &m, float &s, float *shared_m, float *shared_s)
{
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1)
        lse_merge(m, s, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset));
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    if (lane == 0) {
        shared_m[warp] = m;
        shared_s[warp] = s;
    }
    __syncthreads();
    m = lane < (int)(blockDim.x / WARP_SIZE) ? shared_m[lane] : -FLT_MAX;
    s = lane < (int)(blockDim.x / WARP_SIZE) ? shared_s[lane] : 0.0f;
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1)
        lse_merge(m, s, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset));
}

/* Eight gradients over eight logits (column j0 onward). */
__device__ __forceinline__ bf16x8 xent_grad8(bf16x8 v, int j0, int target, float lse, float inv_count, int ignored)
{
    bf16x8 g;
    for (int k = 0; k < 8; k++)
        g.v[k] = __float2bfloat16(xent_grad(__bfloat162float(v.v[k]), j0 + k, target, lse, inv_count, ignored));
    return g;
}

/*
 * The general kernel, for any V: one block per row of the logits chunk. A row starts
 * wherever row * V puts it, so it is split into a scalar head up to the first 16-byte
 * boundary, a body of 8-wide vectors and a scalar tail (V = 1000's rows have no head or
 * tail; V = 777's do). Pass 1 reads the row for its max and sum of exponentials; pass 2
 * reads it again and writes the gradient over it: 3 row-lengths of traffic, since rows
 * of 256 KB and more (Llama 3's, Qwen's) no longer sit in L2 when pass 2 comes back.
 */
template <int WRITE_GRAD>
__global__ void __launch_bounds__(XENT_BLOCK)
    cross_entropy_rows_kernel(float *losses, bf16 *logits, const int *targets, int V, float inv_count)
{
    __shared__ float shared_m[WARP_SIZE], shared_s[WARP_SIZE];
    bf16 *row = logits + (int64_t)blockIdx.x * V;
    int target = targets[blockIdx.x];
    int ignored = target == IGNORE_INDEX;
    int head = (int)(((16 - ((uintptr_t)row & 15)) & 15) / sizeof(bf16));
    head = head < V ? head : V;
    int body_end = head + (V - head) / 8 * 8;

    float target_logit = NAN;
    /* read before pass 2 overwrites the row; the reductions' barriers order it */
    if (threadIdx.x == 0 && target >= 0 && target < V)
        target_logit = __bfloat162float(row[target]);

    float lse = 0.0f;
    if (!ignored) {
        float m = -FLT_MAX, s = 0.0f;
        for (int i = threadIdx.x; i < head; i += blockDim.x)
            lse_merge(m, s, __bfloat162float(row[i]), 1.0f);
        for (int i = body_end + threadIdx.x; i < V; i += blockDim.x)
            lse_merge(m, s, __bfloat162float(row[i]), 1.0f);
        for (int i = head + threadIdx.x * 8; i < body_end; i += blockDim.x * 8)
            lse_add8(m, s, load16(row + i));
        lse_block_merge(m, s, shared_m, shared_s);
        lse = m + logf(s); /* every warp ends with the same block-wide pair */
    }
    if (threadIdx.x == 0)
        losses[blockIdx.x] = ignored ? 0.0f : lse - target_logit;
    if (WRITE_GRAD) {
        for (int i = threadIdx.x; i < head; i += blockDim.x) {
            row[i] = __float2bfloat16(xent_grad(__bfloat162float(row[i]), i, target, lse, inv_count, ignored));
        }
        for (int i = body_end + threadIdx.x; i < V; i += blockDim.x) {
            row[i] = __float2bfloat16(xent_grad(__bfloat162float(row[i]), i, target, lse, inv_count, ignored));
        }
        for (int i = head + threadIdx.x * 8; i < body_end; i += blockDim.x * 8)
            store16(row + i, xent_grad8(load16_stream(row + i), i, target, lse, inv_count, ignored));
    }
}

#define XENT_CLUSTER_BLOCK 512
#define XENT_PIECE_MAX 24000 /* bf16 logits of a row per block: 46.9 KB, within the 48 KB a launch gets unasked */
#define XENT_CLUSTER_MAX 8   /* the cluster size every Hopper GPU runs */

/*
 * Rows of 16-byte multiples (V % 8 == 0: Llama 3's 128,256, Qwen's 151,936), read once:
 * a cluster of blocks per row, each copying its piece of the row into shared memory
 * (asynchronous 16-byte copies, all in flight at once), merging its (max, sum) pair,
 * and reading every block's pair from the cluster's shared memory in rank order (the
 * same order in every block, so all get the same log-sum-exp); the target's logit
 * comes from the block that holds it. The gradient is written from shared memory:
 * 2 row-lengths of traffic instead of 3.
 */
template <int WRITE_GRAD>
__global__ void __launch_bounds__(XENT_CLUSTER_BLOCK)
    cross_entropy_cluster_kernel(float *losses, bf16 *logits, const int *targets, int V, int piece, float inv_count)
{
    namespace cg = cooperative_groups;
    extern __shared__ __align__(16) bf16 part[]; /* [piece]: this block's logits of the row */
    __shared__ float shared_m[WARP_SIZE], shared_s[WARP_SIZE], pair[2];
    cg::cluster_group cluster = cg::this_cluster();
    int rank = (int)cluster.block_rank(), blocks = (int)cluster.num_blocks();
    int64_t r = blockIdx.x / blocks;
    int lo = rank * piece, n = V - lo < piece ? V - lo : piece; /* a multiple of 8 */
    bf16 *row = logits + r * V + lo;
    int target = targets[r];
    int ignored = target == IGNORE_INDEX;
    for (int i = threadIdx.x * 8; i < n; i += blockDim.x * 8)
        __pipeline_memcpy_async(part + i, row + i, 16);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();

    float m = -FLT_MAX, s = 0.0f;
    for (int i = threadIdx.x * 8; i < n; i += blockDim.x * 8)
        lse_add8(m, s, *reinterpret_cast<const bf16x8 *>(part + i));
    lse_block_merge(m, s, shared_m, shared_s);
    if (threadIdx.x == 0) {
        pair[0] = m;
        pair[1] = s;
    }
    cluster.sync(); /* every block's pair and piece are in place */
    float lse = 0.0f;
    if (!ignored) {
        float M = -FLT_MAX, S = 0.0f;
        for (int k = 0; k < blocks; k++) {
            const float *p = cluster.map_shared_rank(pair, k);
            lse_merge(M, S, p[0], p[1]);
        }
        lse = M + logf(S);
    }
    if (rank == 0 && threadIdx.x == 0) {
        float target_logit = NAN;
        if (target >= 0 && target < V)
            target_logit = __bfloat162float(cluster.map_shared_rank(part, target / piece)[target % piece]);
        losses[r] = ignored ? 0.0f : lse - target_logit;
    }
    if (WRITE_GRAD)
        for (int i = threadIdx.x * 8; i < n; i += blockDim.x * 8)
            store16(row + i,
                    xent_grad8(*reinterpret_cast<const bf16x8 *>(part + i), lo + i, target, lse, inv_count, ignored));
    cluster.sync(); /* no block leaves while another may still read its shared memory */
}

/* Blocks per row for the cluster kernel and the logits each holds (*piece, a multiple of 8); 0 where V needs the
 * general kernel (rows not of 16-byte multiples, or longer than a cluster holds). */
static inline int xent_cluster_blocks(int V, int *piece)
{
    if (V % 8 != 0 || V > XENT_CLUSTER_MAX * XENT_PIECE_MAX)
        return 0;
    int blocks = (V + XENT_PIECE_MAX - 1) / XENT_PIECE_MAX;
    *piece = ((V + blocks - 1) / blocks + 7) / 8 * 8;
    return (V + *piece - 1) / *piece; /* every block's piece non-empty */
}

/* Loss per row of logits[rows, V] into losses, and with write_grad the gradient over the logits; general forces
 * the general kernel (for its check and timing). The cluster kernel's 16-byte copies need logits 16-byte aligned,
 * as every caller's scratch from cudaMalloc is. */
static inline void cross_entropy_rows(float *losses, bf16 *logits, const int *targets, int rows, int V, float inv_count,
                                      int write_grad, int general, cudaStream_t stream)
{
    int piece = 0, blocks = general ? 0 : xent_cluster_blocks(V, &piece);
    if (blocks == 0) {
        if (write_grad)
            cross_entropy_rows_kernel<1><<<rows, XENT_BLOCK, 0, stream>>>(losses, logits, targets, V, inv_count);
        else
            cross_entropy_rows_kernel<0><<<rows, XENT_BLOCK, 0, stream>>>(losses, logits, targets, V, inv_count);
        CUDA_CHECK_LAST();
        return;
    }
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = blocks;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3((unsigned)rows * blocks);
    config.blockDim = dim3(XENT_CLUSTER_BLOCK);
    config.dynamicSmemBytes = (size_t)piece * sizeof(bf16);
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
    if (write_grad)
        CUDA_CHECK(
            cudaLaunchKernelEx(&config, cross_entropy_cluster_kernel<1>, losses, logits, targets, V, piece, inv_count));
    else
        CUDA_CHECK(
            cudaLaunchKernelEx(&config, cross_entropy_cluster_kernel<0>, losses, logits, targets, V, piece, inv_count));
    CUDA_CHECK_LAST();
}

/* out[0] = sum of losses[0..N), in a fixed order (one block, fixed strides, fixed tree): reproducible. */
__global__ void __launch_bounds__(1024) loss_sum_kernel(float *out, const float *losses, int N)
{
    __shared__ float shared[WARP_SIZE];
    float s = 0.0f;
    for (int i = threadIdx.x; i < N; i += blockDim.x)
        s += losses[i];
    s = block_sum(s, shared);
    if (threadIdx.x == 0)
        out[0] = s;
}

/* Rows per chunk so that the [chunk, V] bf16 logits fit in budget_bytes: a multiple of 128
 * (whole GEMM tiles) when the budget allows 128 rows, never more than N, at least 1; with as
 * few chunks as the budget allows, of even size, so that the last is not a sliver (16,384 rows
 * in chunks of at most 2,688: 6 of 2,432 and one of 1,792 rows, not 6 of 2,688 and one of 256). */
static inline int fused_classifier_chunk_rows(int N, int V, size_t budget_bytes)
{
    size_t rows = budget_bytes / ((size_t)V * sizeof(bf16));
    if (rows >= (size_t)N)
        return N;
    if (rows >= 128) {
        size_t chunks = ((size_t)N + rows / 128 * 128 - 1) / (rows / 128 * 128);
        rows = ((size_t)N + chunks - 1) / chunks;
        rows = (rows + 127) / 128 * 128; /* still within the budget: chunks was counted with a multiple of 128 */
    }
    return rows < 1 ? 1 : (int)rows;
}

/* logits[rows, V] = x[rows, C] @ W[V, C]^T: the chunk's logits, for tests and inspection. */
static inline void fused_classifier_logits(bf16 *logits, const bf16 *x, const bf16 *W, int rows, int C, int V,
                                           cudaStream_t stream)
{
    matmul_forward(logits, x, W, rows, C, V, stream);
}

static inline void fused_classifier_forward_backward(float *losses, bf16 *dx, bf16 *dW, bf16 *logits_scratch,
                                                     const bf16 *x, const bf16 *W, const int *targets, int N, int C,
                                                     int V, int chunk, float inv_count, int accumulate,
                                                     cudaStream_t stream)
{
    profile_push(PROF_LOSS, stream);
    for (int r = 0; r < N; r += chunk) {
        int n = N - r < chunk ? N - r : chunk;
        const bf16 *x_r = x + (int64_t)r * C;
        matmul_forward(logits_scratch, x_r, W, n, C, V, stream);
        cross_entropy_rows(losses + r, logits_scratch, targets + r, n, V, inv_count, 1, 0, stream);
        matmul_backward_input(dx + (int64_t)r * C, logits_scratch, W, n, C, V, stream);
        matmul_backward_weight(dW, logits_scratch, x_r, n, C, V, accumulate || r > 0, stream);
    }
    profile_pop(stream);
}

/* Evaluation: losses only; the scratch holds each chunk's logits. */
static inline void fused_classifier_forward(float *losses, bf16 *logits_scratch, const bf16 *x, const bf16 *W,
                                            const int *targets, int N, int C, int V, int chunk, cudaStream_t stream)
{
    profile_push(PROF_LOSS, stream);
    for (int r = 0; r < N; r += chunk) {
        int n = N - r < chunk ? N - r : chunk;
        matmul_forward(logits_scratch, x + (int64_t)r * C, W, n, C, V, stream);
        cross_entropy_rows(losses + r, logits_scratch, targets + r, n, V, 0.0f, 0, 0, stream);
    }
    profile_pop(stream);
}

static inline void loss_sum(float *out, const float *losses, int N, cudaStream_t stream)
{
    profile_push(PROF_LOSS, stream);
    loss_sum_kernel<<<1, 1024, 0, stream>>>(out, losses, N);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

#endif /* LLMC_FUSED_CLASSIFIER_H */
