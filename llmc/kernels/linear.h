/*
 * linear.h: the GEMMs of one of a layer's Linear maps y = x W^T (x [N, in],
 * W [out, in], row-major) in the precision of the run: bf16 operands
 * (matmul.h), or FP8 operands with --fp8 (issue #15):
 *   forward          y  = q(x) @ q(W)^T (+ b, a bias where the map has one)
 *   backward input   dx = q(dy) @ q(W)              (sums over out)
 *   backward weight  dW (= or +=) q(dy)^T @ q(x)    (sums over the tokens)
 * where q is an operand's FP8 codes times their dequantisation scales, in the
 * blocks of the run's recipe (fp8.h, fp8_quantize.h), which run along the
 * dimension each GEMM sums over:
 *   tensor  one scale per tensor from its current amax; x and W E4M3, dy E5M2
 *           (its range); the forward's x and W rounding serves the backward
 *   row     one per row of each operand as the GEMM sums over it: x's, W's
 *           and dy's rows forward and for dx, W's columns for dx, and the
 *           columns of dy and x (over the tokens) for dW; all E4M3
 *   block   1 x 128 blocks along the summed dimension for x and dy (128 x 1
 *           for dW's), 128 x 128 for W either way; all E4M3
 * Sums in fp32 (per tensor the forward's with fast accumulation: per row it
 * missed fp8_matmul_check's bound), outputs bf16. train_llama_ref
 * --fp8-recipe rounds the same operands the same way. Hopper's FP8 GEMMs take
 * only operands contiguous along the summed dimension, so backward makes the
 * transposed codes of dy, x and W.
 *
 * Memory: with FP8, an Fp8Scratch holds the codes of one Linear at a time
 * (x and its transpose, dy and its transpose: about 2 * N * (widest in +
 * widest out) bytes) and their scales (per tensor 4 bytes; per row 4 per row;
 * per block 4 per 128 codes), room for the column or block amax of one
 * operand, and per tensor the amax of each Linear's x from its forward, which
 * its backward reuses (the same tensor; recomputation reproduces it bit for
 * bit): a float per map (its slot). Each operand is read for its amax, then
 * once per pass that makes codes; dy's two layouts come from one pass per
 * tensor. Where the kernel that writes x or dy can fold in its amax (RMSNorm,
 * SwiGLU: their *_amax launchers), the caller says so (amax_ready) and the
 * amax pass goes (per tensor only: the finer recipes find their blocks' amax
 * in the pass that makes the codes, or in a column pass before it).
 * The weights change only between optimizer steps, so their codes, both
 * layouts, are kept from the first forward of a step through its
 * recomputations, backward and later micro-steps (fp8_weights_changed starts
 * over): 2 bytes per weight and their scales. Where that memory matters more
 * (ZeRO 3), or where the codes do not fit beside the rest (llama_build checks
 * before allocating), room for one W's codes instead, both layouts made afresh
 * at each use: the same bits. Per tensor under ZeRO 3, the weights arrive as
 * their codes (llmc/parallel/zero_fp8.h: each rank quantizes its share, the
 * codes are gathered, at the whole W's scale): the codes are read where ZeRO's
 * staging holds them, and W^T's made by transposing them (fp8_transpose_codes),
 * again the same bits; room for one W^T then.
 */
#ifndef LLMC_LINEAR_H
#define LLMC_LINEAR_H

#include "llmc/common/cuda_common.h"
#include "llmc/kernels/bias.h"
#include "llmc/kernels/fp8_quantize.h"
#include "llmc/kernels/matmul.h"
#include "llmc/model/linear_shapes.h"

/* Where a step's weight codes come from (see the top). */
typedef enum {
    FP8_WEIGHTS_MADE,     /* made at each use from the bf16 W */
    FP8_WEIGHTS_KEPT,     /* made at the first use of a step, kept until the weights change */
    FP8_WEIGHTS_GATHERED, /* per tensor: read from ZeRO 3's gathered codes (fp8_gathered_views) */
} Fp8Weights;
static const char *const FP8_WEIGHTS_NAMES[] = {"made at each use", "kept for a step", "gathered as codes"};

#define FP8_VIEWS 4 /* ZeRO's weight staging slots */

typedef struct {
    Fp8Recipe recipe;
    Fp8Weights weights;
    uint8_t *x, *x_t;                         /* [N, in] and [in, N] */
    uint8_t *g, *g_t;                         /* the output gradient's: [N, out] and [out, N] */
    uint8_t *w, *w_t;                         /* one W's codes: [out, in] and [in, out] (without the kept codes) */
    float *sx, *sx_t, *sg, *sg_t, *sw, *sw_t; /* their dequantisation scales, where the recipe's GEMMs read them */
    float *amax;  /* per tensor: the output gradient's (FP8_G) and a weight's (FP8_W); else a column or block amax */
    float *saved; /* per tensor: [slots], each Linear's x amax from its forward */
    int n_slots;
    /* The weights' codes kept for a step (NULL: made at each use): */
    uint8_t *w_kept;       /* each slot's W codes then W^T codes, at w_kept_at[slot] */
    int64_t *w_kept_at;    /* host, [slots] */
    float *w_kept_s;       /* each slot's W scales then W^T scales, at w_kept_s_at[slot] */
    int64_t *w_kept_s_at;  /* host, [slots][2] */
    unsigned char *w_made; /* host, [slots]: the kept codes are of the current weights */
    LinearShape *shape;    /* host, [slots]: each slot's W shape */
    /* The gathered codes (FP8_WEIGHTS_GATHERED): the code of view_weights[v][i] is view_codes[v][i], i <
     * view_elements[v]; each slot's dequantisation scale at gathered_inv[4 * slot]. */
    const bf16 *view_weights[FP8_VIEWS];
    const uint8_t *view_codes[FP8_VIEWS];
    int64_t view_elements[FP8_VIEWS];
    const float *gathered_inv;
} Fp8Scratch;

enum { FP8_G = 0, FP8_W = 4 }; /* per tensor: Fp8Scratch.amax's two, 16 bytes apart */

/* How many scales operand [R, K] (K summed) has under recipe: one, one per row, one per 1 x 128 block (weights:
 * 128 x 128); rounded up to 4 so that the next operand's start 16-byte aligned, as cuBLASLt wants. */
static inline int64_t fp8_scale_count(Fp8Recipe recipe, int64_t R, int64_t K, int weight)
{
    int64_t n = recipe == FP8_TENSOR ? 1
                : recipe == FP8_ROW  ? R
                : weight             ? (int64_t)ceil_div(R, 128) * fp8_k_blocks_padded(K)
                                     : R * ceil_div(K, 128);
    return (n + 3) / 4 * 4;
}

/* Where each slot's kept weight codes (both layouts, each 16-byte aligned, as GEMMs want) and scales go: at
 * codes_at[slot] and scales_at[slot][2] (either may be NULL); *codes and *scales receive the totals. */
static inline void fp8_kept_layout(Fp8Recipe recipe, const LinearShape *shape, int n_slots, int64_t *codes_at,
                                   int64_t *scales_at, int64_t *codes, int64_t *scales)
{
    *codes = *scales = 0;
    for (int i = 0; i < n_slots; i++) {
        if (codes_at)
            codes_at[i] = *codes;
        *codes += 2 * ((shape[i].in * shape[i].out + 15) / 16 * 16);
        if (scales_at)
            scales_at[2 * i] = *scales;
        *scales += fp8_scale_count(recipe, shape[i].out, shape[i].in, 1);
        if (scales_at)
            scales_at[2 * i + 1] = *scales;
        *scales += fp8_scale_count(recipe, shape[i].in, shape[i].out, 1);
    }
}

/* The device bytes of the weights' codes kept for a step (fp8_scratch_build's keep_weights). */
static inline size_t fp8_kept_weight_bytes(Fp8Recipe recipe, const LinearShape *shape, int n_slots)
{
    int64_t codes, scales;
    fp8_kept_layout(recipe, shape, n_slots, NULL, NULL, &codes, &scales);
    return (size_t)codes + (size_t)scales * sizeof(float);
}

/* The device bytes of fp8_scratch_build's codes of N tokens without kept weight codes, short of the scales (a few
 * per row of an operand at most): x, dy, their transposes and one W's two layouts. */
static inline size_t fp8_scratch_bytes_about(int64_t N, const LinearShape *shape, int n_slots)
{
    LinearExtents e = linear_extents(shape, n_slots);
    return (size_t)(2 * N * (e.widest_in + e.widest_out) + 2 * e.largest_w);
}

/* Room for the codes of N tokens through any of n_slots Linear maps of these W shapes, and their scales; the
 * weights' codes as `weights` says (gathered: per tensor only, then fp8_gathered_views). recipe: FP8_TENSOR, FP8_ROW
 * or FP8_BLOCK. */
static inline void fp8_scratch_build(Fp8Scratch *q, Fp8Recipe recipe, int64_t N, const LinearShape *shape, int n_slots,
                                     Fp8Weights weights)
{
    if (weights == FP8_WEIGHTS_GATHERED && recipe != FP8_TENSOR)
        FAIL("fp8_scratch_build: gathered weight codes are per tensor only, not per %s", FP8_RECIPE_NAMES[recipe]);
    memset(q, 0, sizeof(*q));
    q->recipe = recipe;
    q->weights = weights;
    q->n_slots = n_slots;
    q->shape = (LinearShape *)malloc_check((size_t)n_slots * sizeof(LinearShape), "FP8 Linear shapes");
    memcpy(q->shape, shape, (size_t)n_slots * sizeof(LinearShape));
    LinearExtents e = linear_extents(shape, n_slots);
    int64_t in = e.widest_in, out = e.widest_out, w = e.largest_w, sw = 0, sw_t = 0, amax = 8;
    for (int i = 0; i < n_slots; i++) { /* the most scales of one W, each layout, and of one operand's amax */
        int64_t si = shape[i].in, so = shape[i].out, c = fp8_scale_count(recipe, so, si, 1),
                c_t = fp8_scale_count(recipe, si, so, 1);
        int64_t a = recipe == FP8_BLOCK ? (int64_t)ceil_div(so, 128) * ceil_div(si, 128) : si > so ? si : so;
        sw = c > sw ? c : sw;
        sw_t = c_t > sw_t ? c_t : sw_t;
        amax = a > amax ? a : amax;
    }
    q->x = (uint8_t *)cuda_malloc_named((size_t)(N * in), "FP8 codes: Linear inputs");
    q->x_t = (uint8_t *)cuda_malloc_named((size_t)(N * in), "FP8 codes: Linear inputs, transposed");
    q->g = (uint8_t *)cuda_malloc_named((size_t)(N * out), "FP8 codes: output gradients");
    q->g_t = (uint8_t *)cuda_malloc_named((size_t)(N * out), "FP8 codes: output gradients, transposed");
    int64_t counts[4] = {fp8_scale_count(recipe, N, in, 0), fp8_scale_count(recipe, in, N, 0),
                         fp8_scale_count(recipe, N, out, 0), fp8_scale_count(recipe, out, N, 0)};
    int64_t total = counts[0] + counts[1] + counts[2] + counts[3] + sw + sw_t + amax + n_slots;
    float *f = (float *)cuda_malloc_named((size_t)total * sizeof(float), "FP8 scales and amax");
    q->sx = f, f += counts[0];
    q->sx_t = f, f += counts[1];
    q->sg = f, f += counts[2];
    q->sg_t = f, f += counts[3];
    q->sw = f, f += sw;
    q->sw_t = f, f += sw_t;
    q->amax = f, f += amax;
    q->saved = f;
    if (weights != FP8_WEIGHTS_KEPT) {
        if (weights == FP8_WEIGHTS_MADE)
            q->w = (uint8_t *)cuda_malloc_named((size_t)w, "FP8 codes: weights");
        q->w_t = (uint8_t *)cuda_malloc_named((size_t)w, "FP8 codes: weights, transposed");
        return;
    }
    q->w_kept_at = (int64_t *)malloc_check((size_t)n_slots * sizeof(int64_t), "FP8 kept weight codes");
    q->w_kept_s_at = (int64_t *)malloc_check((size_t)n_slots * 2 * sizeof(int64_t), "FP8 kept weight scales");
    q->w_made = (unsigned char *)calloc_check((size_t)n_slots, 1, "FP8 kept weight codes");
    int64_t codes, scales;
    fp8_kept_layout(recipe, shape, n_slots, q->w_kept_at, q->w_kept_s_at, &codes, &scales);
    q->w_kept = (uint8_t *)cuda_malloc_named((size_t)codes, "FP8 codes: weights, kept for a step (both layouts)");
    q->w_kept_s = (float *)cuda_malloc_named((size_t)scales * sizeof(float), "FP8 kept weight scales");
}

static inline void fp8_scratch_free(Fp8Scratch *q)
{
    cuda_free(q->x);
    cuda_free(q->x_t);
    cuda_free(q->g);
    cuda_free(q->g_t);
    cuda_free(q->w);
    cuda_free(q->w_t);
    cuda_free(q->sx);
    cuda_free(q->w_kept);
    cuda_free(q->w_kept_s);
    free(q->w_kept_at);
    free(q->w_kept_s_at);
    free(q->w_made);
    free(q->shape);
    memset(q, 0, sizeof(*q));
}

/* The weights may have changed since the kept codes were made (an optimizer step, new weights): the next use of
 * each W makes them again. NULL (no FP8): nothing. */
static inline void fp8_weights_changed(Fp8Scratch *q)
{
    if (q && q->w_made)
        memset(q->w_made, 0, (size_t)q->n_slots);
}

/* FP8_WEIGHTS_GATHERED: view v's codes (of n elements) stand for the bf16 weights at `weights`; inv[4 * slot] holds
 * each slot's dequantisation scale (16-byte aligned, as cuBLASLt wants). */
static inline void fp8_gathered_view(Fp8Scratch *q, int v, const bf16 *weights, const uint8_t *codes, int64_t n,
                                     const float *inv)
{
    if (q->weights != FP8_WEIGHTS_GATHERED || v < 0 || v >= FP8_VIEWS)
        FAIL("fp8_gathered_view: view %d of a scratch whose weights are %s", v, FP8_WEIGHTS_NAMES[q->weights]);
    q->view_weights[v] = weights;
    q->view_codes[v] = codes;
    q->view_elements[v] = n;
    q->gathered_inv = inv;
}

/* The gathered codes of W [n] at w. */
static inline const uint8_t *fp8_gathered_codes(const Fp8Scratch *q, const bf16 *w, int64_t n)
{
    for (int v = 0; v < FP8_VIEWS; v++)
        if (q->view_weights[v] && w >= q->view_weights[v] && w + n <= q->view_weights[v] + q->view_elements[v])
            return q->view_codes[v] + (w - q->view_weights[v]);
    FAIL("fp8: a weight at %p is in none of ZeRO's gathered code views", (const void *)w);
    return NULL;
}

static inline void fp8_check_slot(const Fp8Scratch *q, int slot)
{
    if (slot < 0 || slot >= q->n_slots)
        FAIL("FP8 Linear slot %d outside the %d built", slot, q->n_slots);
}

/* Where the producer of slot's input puts its amax: pass to the *_amax launchers, then call linear_forward with
 * amax_ready. NULL without FP8, and with the finer recipes, whose blocks' amax the quantisation finds. */
static inline float *fp8_input_amax(Fp8Scratch *q, int slot)
{
    if (!q || q->recipe != FP8_TENSOR)
        return NULL;
    fp8_check_slot(q, slot);
    return q->saved + slot;
}

/* Where the producer of the next output gradient puts its amax (NULL as for fp8_input_amax): then linear_backward
 * with amax_ready. */
static inline float *fp8_grad_amax(Fp8Scratch *q)
{
    return q && q->recipe == FP8_TENSOR ? q->amax + FP8_G : NULL;
}

/* The output gradient's code format: per tensor E5M2 (one scale must cover the whole tensor's range), else E4M3. */
static inline Fp8Format fp8_grad_format(const Fp8Scratch *q)
{
    return q->recipe == FP8_TENSOR ? FP8_E5M2 : FP8_E4M3;
}

/* One Linear's weight codes for a GEMM. */
typedef struct {
    const uint8_t *codes;
    const float *inv; /* the dequantisation scales */
} Fp8Operand;

/* W [out, in]'s codes in both layouts, codes [out, in] and codes_t [in, out], with their scales. */
static inline void fp8_weight_codes(Fp8Scratch *q, const bf16 *w, int out_dim, int in, uint8_t *codes, float *s,
                                    uint8_t *codes_t, float *s_t, cudaStream_t stream)
{
    switch (q->recipe) {
    case FP8_ROW: /* W's rows forward, its columns (W^T's rows) for dx */
        fp8_quantize_rows(codes, s, w, out_dim, in, 0, FP8_E4M3, stream);
        fp8_amax_blocks(q->amax, w, out_dim, in, 0, stream);
        fp8_quantize_transposed(codes_t, s_t, NULL, NULL, w, q->amax, out_dim, in, FP8_T_COLUMNS, FP8_E4M3, stream);
        break;
    case FP8_BLOCK: /* 128 x 128 blocks serve both layouts */
        fp8_amax_blocks(q->amax, w, out_dim, in, 1, stream);
        fp8_quantize_transposed(codes_t, s_t, codes, s, w, q->amax, out_dim, in, FP8_T_BLOCKS, FP8_E4M3, stream);
        break;
    default:
        fp8_amax(q->amax + FP8_W, w, (int64_t)out_dim * in, stream);
        fp8_quantize_transposed(codes_t, s_t, codes, s, w, q->amax + FP8_W, out_dim, in, FP8_T_TENSOR, FP8_E4M3,
                                stream);
    }
}

/* slot's W [out_dim, in] as E4M3 codes, [out_dim, in] or transposed [in, out_dim]: kept for the step, or made now. */
static inline Fp8Operand fp8_weight(Fp8Scratch *q, int slot, const bf16 *w, int out_dim, int in, int transposed,
                                    cudaStream_t s)
{
    fp8_check_slot(q, slot);
    if (q->shape[slot].out != out_dim || q->shape[slot].in != in)
        FAIL("FP8 Linear slot %d was built for W [%lld, %lld], not [%d, %d]", slot, (long long)q->shape[slot].out,
             (long long)q->shape[slot].in, out_dim, in);
    if (q->weights == FP8_WEIGHTS_GATHERED) { /* one scale: W^T's codes are W's transposed */
        const uint8_t *codes = fp8_gathered_codes(q, w, (int64_t)out_dim * in);
        if (transposed)
            fp8_transpose_codes(q->w_t, codes, out_dim, in, s);
        Fp8Operand op = {transposed ? q->w_t : codes, q->gathered_inv + 4 * slot};
        return op;
    }
    if (!q->w_kept) {
        fp8_weight_codes(q, w, out_dim, in, q->w, q->sw, q->w_t, q->sw_t, s);
        Fp8Operand op = {transposed ? q->w_t : q->w, transposed ? q->sw_t : q->sw};
        return op;
    }
    int64_t n = (int64_t)out_dim * in;
    uint8_t *codes = q->w_kept + q->w_kept_at[slot], *codes_t = codes + (n + 15) / 16 * 16;
    float *sc = q->w_kept_s + q->w_kept_s_at[2 * slot], *sc_t = q->w_kept_s + q->w_kept_s_at[2 * slot + 1];
    if (!q->w_made[slot]) {
        fp8_weight_codes(q, w, out_dim, in, codes, sc, codes_t, sc_t, s);
        q->w_made[slot] = 1;
    }
    Fp8Operand op = {transposed ? codes_t : codes, transposed ? sc_t : sc};
    return op;
}

/* The block recipe's GEMMs want whole 128-blocks along what they sum over: in, out and the tokens multiples of
 * 128 (the trainer says so up front, train_llama.cu). */
static inline void fp8_check_blocks(const Fp8Scratch *q, int N, int in, int out_dim)
{
    if (q->recipe == FP8_BLOCK && (N % 128 || in % 128 || out_dim % 128))
        FAIL("FP8 block scaling needs tokens, in and out multiples of 128; got %d, %d, %d", N, in, out_dim);
}

/* out[N, out_dim] = x[N, in] @ w[out_dim, in]^T (+ bias[out_dim] unless NULL); q NULL: bf16 GEMM. slot: which Linear
 * map this is (its saved amax, which the backward of the same slot reads; its kept weight codes). amax_ready: x's
 * producer wrote fp8_input_amax(q, slot) already. The bias: in the bf16 GEMM's epilogue, before its rounding; with
 * FP8, or a bias not 16-byte aligned (only where a layer's sizes are not multiples of 8), a pass of its own after. */
static inline void linear_forward(bf16 *out, const bf16 *x, const bf16 *w, const bf16 *bias, int N, int in, int out_dim,
                                  Fp8Scratch *q, int slot, int amax_ready, cudaStream_t s)
{
    if (!q) {
        if (bias && matmul_alignment(bias) >= 16) {
            matmul_forward_bias(out, x, w, bias, N, in, out_dim, s);
            return;
        }
        matmul_forward(out, x, w, N, in, out_dim, s);
        if (bias)
            bias_forward(out, bias, N, out_dim, s);
        return;
    }
    fp8_check_blocks(q, N, in, out_dim);
    Fp8Operand wq = fp8_weight(q, slot, w, out_dim, in, 0, s);
    int kind = MATMUL_FP8_FAST;
    if (q->recipe == FP8_TENSOR) {
        float *saved = fp8_input_amax(q, slot);
        if (!amax_ready)
            fp8_amax(saved, x, (int64_t)N * in, s);
        fp8_quantize(q->x, q->sx, x, saved, (int64_t)N * in, FP8_E4M3, s);
    } else {
        fp8_quantize_rows(q->x, q->sx, x, N, in, q->recipe == FP8_BLOCK, FP8_E4M3, s);
        kind = q->recipe == FP8_BLOCK ? MATMUL_FP8_BLOCK : MATMUL_FP8_ROW;
    }
    matmul_fp8(out, q->x, FP8_E4M3, wq.codes, q->sx, wq.inv, N, in, out_dim, 0, kind, s);
    if (bias)
        bias_forward(out, bias, N, out_dim, s);
}

/* The backward in two halves, for a caller that makes x between them (SwiGLU's backward writes the down map's input
 * again, llama_layer.h): linear_backward_input makes dinp[N, in] = dout @ w (not aliasing dout), and with FP8 also
 * dout's codes for the weight gradient; then linear_backward_weight makes dweight[out_dim, in] (= or += when
 * accumulate) = dout^T @ x from those codes. Between the two nothing may quantise through q (dout's codes wait
 * there); writing the amaxes of fp8_grad_amax and fp8_input_amax is fine. q NULL: bf16 GEMMs. With
 * FP8, N must be a multiple of 16 (the weight gradient sums over tokens), and x and w must be what slot's last
 * linear_forward saw. amax_ready: dout's producer wrote fp8_grad_amax(q) already. */
static inline void linear_backward_input(bf16 *dinp, const bf16 *dout, const bf16 *w, int N, int in, int out_dim,
                                         Fp8Scratch *q, int slot, int amax_ready, cudaStream_t s)
{
    if (!q) {
        matmul_backward_input(dinp, dout, w, N, in, out_dim, s);
        return;
    }
    fp8_check_blocks(q, N, in, out_dim);
    Fp8Format gf = fp8_grad_format(q);
    int kind_dx = MATMUL_FP8;
    if (q->recipe == FP8_TENSOR) { /* dy's two layouts from one pass */
        if (!amax_ready)
            fp8_amax(q->amax + FP8_G, dout, (int64_t)N * out_dim, s);
        fp8_quantize_transposed(q->g_t, q->sg_t, q->g, q->sg, dout, q->amax + FP8_G, N, out_dim, FP8_T_TENSOR, gf, s);
    } else if (q->recipe == FP8_ROW) { /* dy's rows for dx; its columns (over the tokens) for dW */
        kind_dx = MATMUL_FP8_ROW;
        fp8_quantize_rows(q->g, q->sg, dout, N, out_dim, 0, gf, s);
        fp8_amax_blocks(q->amax, dout, N, out_dim, 0, s);
        fp8_quantize_transposed(q->g_t, q->sg_t, NULL, NULL, dout, q->amax, N, out_dim, FP8_T_COLUMNS, gf, s);
    } else { /* 1 x 128 blocks of dy for dx; 128 tokens x 1 for dW, found in the transposing tiles */
        kind_dx = MATMUL_FP8_BLOCK;
        fp8_quantize_rows(q->g, q->sg, dout, N, out_dim, 1, gf, s);
        fp8_quantize_transposed(q->g_t, q->sg_t, NULL, NULL, dout, NULL, N, out_dim, FP8_T_COLUMN_BLOCKS, gf, s);
    }
    Fp8Operand wq = fp8_weight(q, slot, w, out_dim, in, 1, s);
    /* dx[N, in] = g[N, out] @ w_t[in, out]^T */
    matmul_fp8(dinp, q->g, gf, wq.codes, q->sg, wq.inv, N, out_dim, in, 0, kind_dx, s);
}

/* Per tensor, where the kernel that makes x can write the weight gradient's x^T codes instead (swiglu.h's
 * swiglu_backward_codes_t, where the backward makes x again): 1 with where they go (*codes_t [in, N], the
 * dequantisation scale *inv_t) and the amax of x's forward their scale comes from; then linear_backward_weight with x
 * NULL. 0 without FP8, for the finer recipes (their scales need x's columns first), and where the shape does not
 * take the transposed codes' 16-byte stores: then the producer writes x and linear_backward_weight quantises it. */
static inline int linear_x_t_codes(Fp8Scratch *q, int slot, int N, int in, uint8_t **codes_t, float **inv_t,
                                   const float **amax)
{
    if (!q || q->recipe != FP8_TENSOR || N % 16 || in % 16 || (uintptr_t)q->x_t % 16)
        return 0;
    *codes_t = q->x_t;
    *inv_t = q->sx_t;
    *amax = fp8_input_amax(q, slot);
    return 1;
}

/* x NULL: its x^T codes are in place already (linear_x_t_codes). */
static inline void linear_backward_weight(bf16 *dweight, const bf16 *dout, const bf16 *x, int N, int in, int out_dim,
                                          int accumulate, Fp8Scratch *q, int slot, cudaStream_t s)
{
    if (!q) {
        matmul_backward_weight(dweight, dout, x, N, in, out_dim, accumulate, s);
        return;
    }
    if (!x && q->recipe != FP8_TENSOR)
        FAIL("linear_backward_weight: x's codes made by its producer exist per tensor only (linear_x_t_codes)");
    Fp8Format gf = fp8_grad_format(q);
    int kind_dw = MATMUL_FP8;
    if (q->recipe == FP8_TENSOR) { /* x at its forward's scale */
        if (x)
            fp8_quantize_transposed(q->x_t, q->sx_t, NULL, NULL, x, fp8_input_amax(q, slot), N, in, FP8_T_TENSOR,
                                    FP8_E4M3, s);
    } else if (q->recipe == FP8_ROW) { /* x's columns, over the tokens */
        kind_dw = MATMUL_FP8_ROW;
        fp8_amax_blocks(q->amax, x, N, in, 0, s);
        fp8_quantize_transposed(q->x_t, q->sx_t, NULL, NULL, x, q->amax, N, in, FP8_T_COLUMNS, FP8_E4M3, s);
    } else {
        kind_dw = MATMUL_FP8_BLOCK_1D;
        fp8_quantize_transposed(q->x_t, q->sx_t, NULL, NULL, x, NULL, N, in, FP8_T_COLUMN_BLOCKS, FP8_E4M3, s);
    }
    /* dW[out, in] = g_t[out, N] @ x_t[in, N]^T */
    matmul_fp8(dweight, q->g_t, gf, q->x_t, q->sg_t, q->sx_t, out_dim, N, in, accumulate, kind_dw, s);
}

/* Both halves, when x is there already. */
static inline void linear_backward(bf16 *dinp, bf16 *dweight, const bf16 *dout, const bf16 *x, const bf16 *w, int N,
                                   int in, int out_dim, int accumulate, Fp8Scratch *q, int slot, int amax_ready,
                                   cudaStream_t s)
{
    linear_backward_input(dinp, dout, w, N, in, out_dim, q, slot, amax_ready, s);
    linear_backward_weight(dweight, dout, x, N, in, out_dim, accumulate, q, slot, s);
}

#endif /* LLMC_LINEAR_H */
