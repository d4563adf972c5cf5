/*
 * linear.h: the GEMMs of one of a layer's Linear maps y = x W^T (x [N, in],
 * W [out, in], row-major) in the precision of the run: bf16 operands
 * (matmul.h), or FP8 operands with --fp8 (issue #15):
 *   forward          y  = (q4(x) @ q4(W)^T) * sx * sw
 *   backward input   dx = (q5(dy) @ q4(W)) * sdy * sw
 *   backward weight  dW (= or +=) (q5(dy)^T @ q4(x)) * sdy * sx
 * where q4 and q5 are a tensor's E4M3 and E5M2 codes at one scale per tensor
 * from its current amax (fp8_quantize.h; inputs and weights E4M3, output
 * gradients E5M2 for their range) and s the matching dequantisation scales;
 * sums in fp32, outputs bf16. train_llama_ref --fp8 rounds the same operands
 * the same way. Hopper's FP8 GEMMs take only operands contiguous along the
 * summed dimension, so backward makes the transposed codes of dy, x and W.
 *
 * Memory: with FP8, an Fp8Scratch holds the codes of one Linear at a time
 * (x and its transpose, dy and its transpose, W and its transpose: about
 * 2 * N * (widest in + widest out) + 4 * largest W bytes) and six floats; each
 * operand is read twice more than in bf16 (its amax, then its codes).
 */
#ifndef LLMC_LINEAR_H
#define LLMC_LINEAR_H

#include "cuda_common.h"
#include "fp8_quantize.h"
#include "matmul.h"

typedef struct {
    uint8_t *x, *x_t; /* [N, in] and [in, N] */
    uint8_t *g, *g_t; /* the output gradient's: [N, out] and [out, N] */
    uint8_t *w, *w_t; /* [out, in] and [in, out] */
    float *amax;      /* [3]: x, g, w */
    float *inv;       /* [3]: their dequantisation scales */
} Fp8Scratch;

enum { FP8_X, FP8_G, FP8_W };

/* Room for the codes of inputs of up to x_elems, output gradients of up to g_elems, weights of up to w_elems. */
static inline void fp8_scratch_build(Fp8Scratch *q, int64_t x_elems, int64_t g_elems, int64_t w_elems)
{
    q->x = (uint8_t *)cuda_malloc_named((size_t)x_elems, "FP8 codes: Linear inputs");
    q->x_t = (uint8_t *)cuda_malloc_named((size_t)x_elems, "FP8 codes: Linear inputs, transposed");
    q->g = (uint8_t *)cuda_malloc_named((size_t)g_elems, "FP8 codes: output gradients");
    q->g_t = (uint8_t *)cuda_malloc_named((size_t)g_elems, "FP8 codes: output gradients, transposed");
    q->w = (uint8_t *)cuda_malloc_named((size_t)w_elems, "FP8 codes: weights");
    q->w_t = (uint8_t *)cuda_malloc_named((size_t)w_elems, "FP8 codes: weights, transposed");
    q->amax = (float *)cuda_malloc_named(6 * sizeof(float), "FP8 scales");
    q->inv = q->amax + 3;
}

static inline void fp8_scratch_free(Fp8Scratch *q)
{
    cuda_free(q->x);
    cuda_free(q->x_t);
    cuda_free(q->g);
    cuda_free(q->g_t);
    cuda_free(q->w);
    cuda_free(q->w_t);
    cuda_free(q->amax);
    memset(q, 0, sizeof(*q));
}

/* out[N, out_dim] = x[N, in] @ w[out_dim, in]^T; q NULL: bf16 GEMM. */
static inline void linear_forward(bf16 *out, const bf16 *x, const bf16 *w, int N, int in, int out_dim, Fp8Scratch *q,
                                  cudaStream_t s)
{
    if (!q) {
        matmul_forward(out, x, w, N, in, out_dim, s);
        return;
    }
    fp8_amax(q->amax + FP8_X, x, (int64_t)N * in, s);
    fp8_quantize(q->x, q->inv + FP8_X, x, q->amax + FP8_X, (int64_t)N * in, FP8_E4M3, s);
    fp8_amax(q->amax + FP8_W, w, (int64_t)out_dim * in, s);
    fp8_quantize(q->w, q->inv + FP8_W, w, q->amax + FP8_W, (int64_t)out_dim * in, FP8_E4M3, s);
    matmul_fp8(out, q->x, FP8_E4M3, q->w, q->inv + FP8_X, q->inv + FP8_W, N, in, out_dim, 0, s);
}

/* dweight[out_dim, in] (= or += when accumulate) = dout^T @ x, then dinp[N, in] = dout @ w (not aliasing dout);
 * q NULL: bf16 GEMMs. With FP8, N must be a multiple of 16 (the weight gradient sums over tokens). */
static inline void linear_backward(bf16 *dinp, bf16 *dweight, const bf16 *dout, const bf16 *x, const bf16 *w, int N,
                                   int in, int out_dim, int accumulate, Fp8Scratch *q, cudaStream_t s)
{
    if (!q) {
        matmul_backward_weight(dweight, dout, x, N, in, out_dim, accumulate, s);
        matmul_backward_input(dinp, dout, w, N, in, out_dim, s);
        return;
    }
    int64_t ng = (int64_t)N * out_dim, nx = (int64_t)N * in, nw = (int64_t)out_dim * in;
    fp8_amax(q->amax + FP8_G, dout, ng, s);
    fp8_quantize(q->g, q->inv + FP8_G, dout, q->amax + FP8_G, ng, FP8_E5M2, s);
    fp8_quantize_transposed(q->g_t, NULL, dout, q->amax + FP8_G, N, out_dim, FP8_E5M2, s);
    fp8_amax(q->amax + FP8_X, x, nx, s);
    fp8_quantize_transposed(q->x_t, q->inv + FP8_X, x, q->amax + FP8_X, N, in, FP8_E4M3, s);
    fp8_amax(q->amax + FP8_W, w, nw, s);
    fp8_quantize_transposed(q->w_t, q->inv + FP8_W, w, q->amax + FP8_W, out_dim, in, FP8_E4M3, s);
    /* dW[out, in] = g_t[out, N] @ x_t[in, N]^T;  dx[N, in] = g[N, out] @ w_t[in, out]^T */
    matmul_fp8(dweight, q->g_t, FP8_E5M2, q->x_t, q->inv + FP8_G, q->inv + FP8_X, out_dim, N, in, accumulate, s);
    matmul_fp8(dinp, q->g, FP8_E5M2, q->w_t, q->inv + FP8_G, q->inv + FP8_W, N, out_dim, in, 0, s);
}

#endif /* LLMC_LINEAR_H */
