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
 * sums in fp32 (the forward's with fast accumulation, matmul.h), outputs bf16.
 * train_llama_ref --fp8 rounds the same operands
 * the same way. Hopper's FP8 GEMMs take only operands contiguous along the
 * summed dimension, so backward makes the transposed codes of dy, x and W.
 *
 * Memory: with FP8, an Fp8Scratch holds the codes of one Linear at a time
 * (x and its transpose, dy and its transpose: about 2 * N * (widest in +
 * widest out) bytes), 24 floats, and the amax of each Linear's x and W from its
 * forward, which its backward reuses (the same tensors; recomputation
 * reproduces them bit for bit): 2 floats a map (its slot). Each operand is read
 * for its amax once per step, then once per pass that makes codes: dy's two
 * layouts come from one pass. Where the kernel that writes x or dy can fold in
 * its amax (RMSNorm, SwiGLU: their *_amax launchers), the caller says so
 * (amax_ready) and the amax pass goes.
 * The weights change only between optimizer steps, so their codes, both
 * layouts from one pass, are kept from the first forward of a step through its
 * recomputations, backward and later micro-steps (fp8_weights_changed starts
 * over): 2 bytes per weight. Where that memory matters more (ZeRO 3), room for
 * one W's codes instead (4 * largest W bytes), made afresh at each use: a
 * forward and a backward pass over W per micro-step more.
 */
#ifndef LLMC_LINEAR_H
#define LLMC_LINEAR_H

#include "cuda_common.h"
#include "fp8_quantize.h"
#include "matmul.h"

typedef struct {
    uint8_t *x, *x_t; /* [N, in] and [in, N] */
    uint8_t *g, *g_t; /* the output gradient's: [N, out] and [out, N] */
    uint8_t *w, *w_t; /* one W's codes: [out, in] and [in, out] (without the kept codes) */
    float *amax;      /* x, g, w at FP8_X, FP8_G, FP8_W */
    float *inv;       /* their dequantisation scales, at the same offsets */
    float *saved;     /* [slots][2]: each Linear's x and W amax from its forward */
    int n_slots;
    /* The weights' codes kept for a step (NULL: made at each use): */
    uint8_t *w_kept;       /* each slot's W codes then W^T codes, at w_kept_at[slot] */
    int64_t *w_kept_at;    /* host, [slots] */
    float *w_kept_inv;     /* [slots][4]: each slot's W dequantisation scale, 16 bytes apart (see below) */
    unsigned char *w_made; /* host, [slots]: the kept codes are of the current weights */
} Fp8Scratch;

/* Offsets of the three operands' scales, 16 bytes apart: cuBLASLt rejects a scale pointer that is only 4-byte
 * aligned (CUBLAS_STATUS_NOT_SUPPORTED at run time, measured on the H100 with cuBLAS 13.1). */
enum { FP8_X = 0, FP8_G = 4, FP8_W = 8, FP8_SCALE_FLOATS = 12 };

/* Room for the codes of inputs of up to x_elems and output gradients of up to g_elems, and the saved amax of
 * n_slots Linear maps; for the weights, slot_w_elems[slot] (each slot's W size): their codes kept for a step, or
 * slot_w_elems NULL: room for one W of up to w_elems at a time. */
static inline void fp8_scratch_build(Fp8Scratch *q, int64_t x_elems, int64_t g_elems, int64_t w_elems, int n_slots,
                                     const int64_t *slot_w_elems)
{
    memset(q, 0, sizeof(*q));
    q->x = (uint8_t *)cuda_malloc_named((size_t)x_elems, "FP8 codes: Linear inputs");
    q->x_t = (uint8_t *)cuda_malloc_named((size_t)x_elems, "FP8 codes: Linear inputs, transposed");
    q->g = (uint8_t *)cuda_malloc_named((size_t)g_elems, "FP8 codes: output gradients");
    q->g_t = (uint8_t *)cuda_malloc_named((size_t)g_elems, "FP8 codes: output gradients, transposed");
    q->amax = (float *)cuda_malloc_named(2 * FP8_SCALE_FLOATS * sizeof(float), "FP8 scales");
    q->inv = q->amax + FP8_SCALE_FLOATS;
    q->saved = (float *)cuda_malloc_named((size_t)n_slots * 2 * sizeof(float), "FP8 amax of each Linear's forward");
    q->n_slots = n_slots;
    if (!slot_w_elems) {
        q->w = (uint8_t *)cuda_malloc_named((size_t)w_elems, "FP8 codes: weights");
        q->w_t = (uint8_t *)cuda_malloc_named((size_t)w_elems, "FP8 codes: weights, transposed");
        return;
    }
    q->w_kept_at = (int64_t *)malloc_check((size_t)n_slots * sizeof(int64_t), "FP8 kept weight codes");
    q->w_made = (unsigned char *)calloc_check((size_t)n_slots, 1, "FP8 kept weight codes");
    int64_t total = 0;
    for (int i = 0; i < n_slots; i++) {
        q->w_kept_at[i] = total;
        total += 2 * ((slot_w_elems[i] + 15) / 16 * 16); /* each layout 16-byte aligned, as the GEMMs want */
    }
    q->w_kept = (uint8_t *)cuda_malloc_named((size_t)total, "FP8 codes: weights, kept for a step (both layouts)");
    q->w_kept_inv = (float *)cuda_malloc_named((size_t)n_slots * 4 * sizeof(float), "FP8 kept weight scales");
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
    cuda_free(q->w_kept);
    cuda_free(q->w_kept_inv);
    free(q->w_kept_at);
    free(q->w_made);
    memset(q, 0, sizeof(*q));
}

/* The weights may have changed since the kept codes were made (an optimizer step, new weights): the next use of
 * each W makes them again. NULL (no FP8): nothing. */
static inline void fp8_weights_changed(Fp8Scratch *q)
{
    if (q && q->w_made)
        memset(q->w_made, 0, (size_t)q->n_slots);
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

/* One Linear's weight codes for a GEMM. */
typedef struct {
    const uint8_t *codes;
    const float *inv; /* the dequantisation scale */
} Fp8Operand;

/* slot's W [out_dim, in] as E4M3 codes, [out_dim, in] or transposed [in, out_dim], at the scale of W's amax, which
 * the forward (transposed 0) takes and keeps in slot's saved amax for the backward (transposed 1). */
static inline Fp8Operand fp8_weight(Fp8Scratch *q, int slot, const bf16 *w, int out_dim, int in, int transposed,
                                    cudaStream_t s)
{
    float *saved_w = fp8_saved_amax(q, slot) + 1;
    int64_t n = (int64_t)out_dim * in;
    if (q->w_kept) {
        uint8_t *codes = q->w_kept + q->w_kept_at[slot], *codes_t = codes + (n + 15) / 16 * 16;
        float *inv = q->w_kept_inv + 4 * (int64_t)slot;
        if (!q->w_made[slot]) {
            fp8_amax(saved_w, w, n, s);
            fp8_quantize_transposed(codes_t, codes, inv, w, saved_w, out_dim, in, FP8_E4M3, s);
            q->w_made[slot] = 1;
        }
        Fp8Operand op = {transposed ? codes_t : codes, inv};
        return op;
    }
    if (transposed) {
        fp8_quantize_transposed(q->w_t, NULL, q->inv + FP8_W, w, saved_w, out_dim, in, FP8_E4M3, s);
    } else {
        fp8_amax(saved_w, w, n, s);
        fp8_quantize(q->w, q->inv + FP8_W, w, saved_w, n, FP8_E4M3, s);
    }
    Fp8Operand op = {transposed ? q->w_t : q->w, q->inv + FP8_W};
    return op;
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
    Fp8Operand wq = fp8_weight(q, slot, w, out_dim, in, 0, s);
    matmul_fp8(out, q->x, FP8_E4M3, wq.codes, q->inv + FP8_X, wq.inv, N, in, out_dim, 0, 1, s);
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
    Fp8Operand wq = fp8_weight(q, slot, w, out_dim, in, 1, s);
    /* dW[out, in] = g_t[out, N] @ x_t[in, N]^T;  dx[N, in] = g[N, out] @ w_t[in, out]^T */
    matmul_fp8(dweight, q->g_t, FP8_E5M2, q->x_t, q->inv + FP8_G, q->inv + FP8_X, out_dim, N, in, accumulate, 0, s);
    matmul_fp8(dinp, q->g, FP8_E5M2, wq.codes, q->inv + FP8_G, wq.inv, N, out_dim, in, 0, 0, s);
}

#endif /* LLMC_LINEAR_H */
