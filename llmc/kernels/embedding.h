/*
 * embedding.h: token embedding lookup and its deterministic backward.
 *
 *   forward:  out[n, :] = wte[tokens[n], :]                 out [N, C] bf16, wte [V, C] bf16
 *   backward: dwte[v, :] += sum_{n : tokens[n] = v} dout[n, :]   (fp32 sum, added to bf16 dwte)
 *
 * Backward uses no float atomics, so it is bit-identical between runs: the host,
 * which has the tokens, groups the positions by token with a counting sort
 * (embedding_backward_plan_host); one thread per 8 channels of a bucket then sums
 * the bucket's dout rows in ascending position order in fp32 and adds the sum to
 * its dwte row. Buckets are distinct tokens, so no two threads touch the same
 * element. Memory: forward reads N rows of wte and writes out once; backward reads
 * dout once and reads and writes each touched dwte row once. C must be a multiple
 * of 8 (16-byte bf16 vectors) and the activation and weight pointers 16-byte aligned.
 */
#ifndef LLMC_EMBEDDING_H
#define LLMC_EMBEDDING_H

#include <string.h>

#include "llmc/common/cuda_common.h"
#include "llmc/common/profile.h"

#define EMBEDDING_THREADS 128
/* dout rows a backward thread has in flight at once; they are still added in order. */
#define EMBEDDING_BATCH 8

/* Grid (N, ceil(C/8 / threads)). */
__global__ void embedding_forward_kernel(bf16 *__restrict__ out, const int *__restrict__ tokens,
                                         const bf16 *__restrict__ wte, int C)
{
    int j = (blockIdx.y * blockDim.x + threadIdx.x) * 8;
    if (j >= C)
        return;
    int token = tokens[blockIdx.x];
    store16(out + (int64_t)blockIdx.x * C + j, load16(wte + (int64_t)token * C + j));
}

/* Grid (n_buckets, ceil(C/8 / threads)). */
__global__ void embedding_backward_kernel(bf16 *__restrict__ dwte, const bf16 *__restrict__ dout,
                                          const int *__restrict__ bucket_token, const int *__restrict__ bucket_start,
                                          const int *__restrict__ positions, int C)
{
    int j = (blockIdx.y * blockDim.x + threadIdx.x) * 8;
    if (j >= C)
        return;
    int begin = bucket_start[blockIdx.x], end = bucket_start[blockIdx.x + 1];
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        acc[i] = 0.0f;
    int p = begin;
    for (; p + EMBEDDING_BATCH <= end; p += EMBEDDING_BATCH) {
        bf16x8 rows[EMBEDDING_BATCH];
#pragma unroll
        for (int k = 0; k < EMBEDDING_BATCH; k++)
            rows[k] = load16_stream(dout + (int64_t)positions[p + k] * C + j);
#pragma unroll
        for (int k = 0; k < EMBEDDING_BATCH; k++) {
#pragma unroll
            for (int i = 0; i < 8; i++)
                acc[i] += __bfloat162float(rows[k].v[i]);
        }
    }
    for (; p < end; p++) {
        bf16x8 row = load16_stream(dout + (int64_t)positions[p] * C + j);
#pragma unroll
        for (int i = 0; i < 8; i++)
            acc[i] += __bfloat162float(row.v[i]);
    }
    bf16 *dst = dwte + (int64_t)bucket_token[blockIdx.x] * C + j;
    bf16x8 row = load16(dst);
#pragma unroll
    for (int i = 0; i < 8; i++)
        row.v[i] = __float2bfloat16_rn(__bfloat162float(row.v[i]) + acc[i]);
    store16(dst, row);
}

static inline void embedding_check_size(int N, int C)
{
    if (N <= 0 || C <= 0 || C % 8 != 0) {
        FAIL("embedding: N = %d, C = %d unsupported: C must be a positive multiple of 8 (16-byte bf16 vectors)", N, C);
    }
}

static inline void embedding_forward(bf16 *out, const int *tokens, const bf16 *wte, int N, int C, cudaStream_t stream)
{
    embedding_check_size(N, C);
    profile_push(PROF_EMBEDDING, stream);
    dim3 grid(N, ceil_div(C / 8, EMBEDDING_THREADS));
    embedding_forward_kernel<<<grid, EMBEDDING_THREADS, 0, stream>>>(out, tokens, wte, C);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

/* Ints of workspace that embedding_backward_plan_host needs. */
static inline size_t embedding_backward_plan_workspace_ints(int N, int vocab_size)
{
    return (size_t)vocab_size + (size_t)N + 1;
}

/*
 * Buckets for embedding_backward from the N tokens: returns n_buckets (the number of
 * distinct tokens) and fills
 *   bucket_token[b]  (at most N ints)   the token of bucket b
 *   bucket_start[b]  (at most N+1 ints) bucket b's positions are positions[bucket_start[b] .. bucket_start[b+1])
 *   positions[N]                        the positions, ascending within each bucket
 * Buckets come largest first (ties by token id) so that the longest sums start first.
 * workspace: embedding_backward_plan_workspace_ints(N, vocab_size) ints, clobbered.
 * O(N + vocab_size); exits naming the position of a token outside [0, vocab_size).
 */
static inline int embedding_backward_plan_host(int *bucket_token, int *bucket_start, int *positions, const int *tokens,
                                               int N, int vocab_size, int *workspace)
{
    int *count = workspace;              /* per token: its count, later its next free slot in positions */
    int *first = workspace + vocab_size; /* per count s: the first bucket of size s */
    memset(count, 0, (size_t)vocab_size * sizeof(int));
    memset(first, 0, ((size_t)N + 1) * sizeof(int));
    for (int n = 0; n < N; n++) {
        if (tokens[n] < 0 || tokens[n] >= vocab_size) {
            FAIL("embedding: token %d at position %d is outside the vocabulary [0, %d)\n"
                 "  hint: the data was tokenized for another vocabulary",
                 tokens[n], n, vocab_size);
        }
        count[tokens[n]]++;
    }
    for (int v = 0; v < vocab_size; v++)
        first[count[v]]++;
    int n_buckets = 0;
    for (int s = N; s >= 1; s--) {
        int buckets_of_size = first[s];
        first[s] = n_buckets;
        n_buckets += buckets_of_size;
    }
    for (int v = 0; v < vocab_size; v++) {
        if (count[v] > 0)
            bucket_token[first[count[v]]++] = v;
    }
    bucket_start[0] = 0;
    for (int b = 0; b < n_buckets; b++) {
        int v = bucket_token[b];
        bucket_start[b + 1] = bucket_start[b] + count[v];
        count[v] = bucket_start[b];
    }
    for (int n = 0; n < N; n++)
        positions[count[tokens[n]]++] = n;
    return n_buckets;
}

/* dwte [V, C] bf16 is accumulated into (rows of tokens not in the batch are left
 * alone); the bucket arrays as embedding_backward_plan_host made them. */
static inline void embedding_backward(bf16 *dwte, const bf16 *dout, const int *bucket_token, const int *bucket_start,
                                      const int *positions, int n_buckets, int C, cudaStream_t stream)
{
    embedding_check_size(n_buckets, C);
    profile_push(PROF_EMBEDDING, stream);
    dim3 grid(n_buckets, ceil_div(C / 8, EMBEDDING_THREADS));
    embedding_backward_kernel<<<grid, EMBEDDING_THREADS, 0, stream>>>(dwte, dout, bucket_token, bucket_start, positions,
                                                                      C);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

#endif /* LLMC_EMBEDDING_H */
