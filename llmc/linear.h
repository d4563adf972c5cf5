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
 * 2 * N * (widest in + widest out) + 4 * largest W bytes), 24 floats, and the
 * amax of each Linear's x and W from its forward, which its backward reuses
 * (the same tensors; recomputation reproduces them bit for bit): 2 floats a
 * map (its slot). Each operand is read for its amax once per step, then once
 * per pass that makes codes: dy's two layouts come from one pass. Where the
 * kernel that writes x or dy can fold in its amax (RMSNorm, SwiGLU: their
 * *_amax launchers), the caller says so (amax_ready) and the amax pass goes.
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
    float *amax;      /* x, g, w at FP8_X, FP8_G, FP8_W */
    float *inv;       /* their dequantisation scales, at the same offsets */
    float *saved;     /* [slots][2]: each Linear's x and W amax from its forward */
    int n_slots;
} Fp8Scratch;

/* Offsets of the three operands' scales, 16 bytes apart: cuBLASLt rejects a scale pointer that is only 4-byte
 * aligned (CUBLAS_STATUS_NOT_SUPPORTED at run time, measured on the H100 with cuBLAS 13.1). */
enum { FP8_X = 0, FP8_G = 4, FP8_W = 8, FP8_SCALE_FLOATS = 12 };

/* Room for the codes of inputs of up to x_elems, output gradients of up to g_elems, weights of up to w_elems, and
 * the saved amax of n_slots Linear maps. */
static inline void fp8_scratch_build(Fp8Scratch *q, int64_t x_elems, int64_t g_elems, int64_t w_elems, int n_slots)
{
    q->x = (uint8_t *)cuda_malloc_named((size_t)x_elems, "FP8 codes: Linear inputs");
    q->x_t = (uint8_t *)cuda_malloc_named((size_t)x_elems, "FP8 codes: Linear inputs, transposed");
    q->g = (uint8_t *)cuda_malloc_named((size_t)g_elems, "FP8 codes: output gradients");
    q->g_t = (uint8_t *)cuda_malloc_named((size_t)g_elems, "FP8 codes: output gradients, transposed");
    q->w = (uint8_t *)cuda_malloc_named((size_t)w_elems, "FP8 codes: weights");
    q->w_t = (uint8_t *)cuda_malloc_named((size_t)w_elems, "FP8 codes: weights, transposed");
    q->amax = (float *)cuda_malloc_named(2 * FP8_SCALE_FLOATS * sizeof(float), "FP8 scales");
    q->inv = q->amax + FP8_SCALE_FLOATS;
    q->saved = (float *)cuda_malloc_named((size_t)n_slots * 2 * sizeof(float), "FP8 amax of each Linear's forward");
    q->n_slots = n_slots;
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
    cuda_free(q->saved);
    memset(q, 0, sizeof(*q));
}

/* The saved amax of slot's Linear: [0] its input's, [1] its weight's. */
static inline float *fp8_saved_amax(Fp8Scratch *q, int slot)
{
    if (slot < 0 || slot >= q->n_slots)
        FAIL("FP8 Linear slot %d outside the %d built", slot, q->n_slots);
    return q->saved + 2 * (int64_t)slot;
}

/* Where the producer of slot's input puts its amax (NULL without FP8): pass to the *_amax launchers, then call
 * linear_forward with amax_ready. */
static inline float *fp8_input_amax(Fp8Scratch *q, int slot)
{
    return q ? fp8_saved_amax(q, slot) : NULL;
}

/* Where the producer of the next output gradient puts its amax (NULL without FP8): then linear_backward with
 * amax_ready. */
static inline float *fp8_grad_amax(Fp8Scratch *q)
{
    return q ? q->amax + FP8_G : NULL;
}

/* out[N, out_dim] = x[N, in] @ w[out_dim, in]^T; q NULL: bf16 GEMM. slot: which Linear map this is (its saved amax,
 * which the backward of the same slot reads). amax_ready: x's producer wrote fp8_input_amax(q, slot) already. */
static inline void linear_forward(bf16 *out, const bf16 *x, const bf16 *w, int N, int in, int out_dim, Fp8Scratch *q,
                                  int slot, int amax_ready, cudaStream_t s)
{
    if (!q) {
        matmul_forward(out, x, w, N, in, out_dim, s);
        return;
    }
    float *saved = fp8_saved_amax(q, slot);
    if (!amax_ready)
        fp8_amax(saved, x, (int64_t)N * in, s);
    fp8_quantize(q->x, q->inv + FP8_X, x, saved, (int64_t)N * in, FP8_E4M3, s);
    fp8_amax(saved + 1, w, (int64_t)out_dim * in, s);
    fp8_quantize(q->w, q->inv + FP8_W, w, saved + 1, (int64_t)out_dim * in, FP8_E4M3, s);
    matmul_fp8(out, q->x, FP8_E4M3, q->w, q->inv + FP8_X, q->inv + FP8_W, N, in, out_dim, 0, s);
}

/* dweight[out_dim, in] (= or += when accumulate) = dout^T @ x, then dinp[N, in] = dout @ w (not aliasing dout);
 * q NULL: bf16 GEMMs. With FP8, N must be a multiple of 16 (the weight gradient sums over tokens), and x and w
 * must be what slot's last linear_forward saw. amax_ready: dout's producer wrote fp8_grad_amax(q) already. */
static inline void linear_backward(bf16 *dinp, bf16 *dweight, const bf16 *dout, const bf16 *x, const bf16 *w, int N,
                                   int in, int out_dim, int accumulate, Fp8Scratch *q, int slot, int amax_ready,
                                   cudaStream_t s)
{
    if (!q) {
        matmul_backward_weight(dweight, dout, x, N, in, out_dim, accumulate, s);
        matmul_backward_input(dinp, dout, w, N, in, out_dim, s);
        return;
    }
    const float *saved = fp8_saved_amax(q, slot);
    if (!amax_ready)
        fp8_amax(q->amax + FP8_G, dout, (int64_t)N * out_dim, s);
    fp8_quantize_transposed(q->g_t, q->g, q->inv + FP8_G, dout, q->amax + FP8_G, N, out_dim, FP8_E5M2, s);
    fp8_quantize_transposed(q->x_t, NULL, q->inv + FP8_X, x, saved, N, in, FP8_E4M3, s);
    fp8_quantize_transposed(q->w_t, NULL, q->inv + FP8_W, w, saved + 1, out_dim, in, FP8_E4M3, s);
    /* dW[out, in] = g_t[out, N] @ x_t[in, N]^T;  dx[N, in] = g[N, out] @ w_t[in, out]^T */
    matmul_fp8(dweight, q->g_t, FP8_E5M2, q->x_t, q->inv + FP8_G, q->inv + FP8_X, out_dim, N, in, accumulate, s);
    matmul_fp8(dinp, q->g, FP8_E5M2, q->w_t, q->inv + FP8_G, q->inv + FP8_W, N, out_dim, in, 0, s);
}

#endif /* LLMC_LINEAR_H */
