/*
 * llama_layer.h: one decoder layer of the GPU model, forward and backward,
 * in the kernels of llmc/ (each of which marks itself for the profiler).
 *
 * Forward of layer l, its weights w, its activations a (llama_acts.h):
 *   res_in   = res_mid(l - 1) + branch          the previous layer's MLP residual
 *   ln_attn  = rmsnorm(res_in) * w.attn_norm    add, fused with this norm (layer 0:
 *                                               res_in is the embedding, norm alone)
 *   qkv      = ln_attn @ w.qkv^T, then RoPE on q and k in place
 *   att_out  = causal grouped-query attention(q, k, v)
 *   branch   = att_out @ w.o^T
 *   res_mid  = res_in + branch, ln_mlp = rmsnorm(res_mid) * w.mlp_norm   (one kernel)
 *   gate_up  = ln_mlp @ w.gate_up^T, swiglu_out = silu(gate) * up
 *   branch   = swiglu_out @ w.down^T            added by the next layer or the final norm
 * The four Linear maps (qkv, o, gate_up, down) run in bf16 or FP8 (linear.h).
 * Ending a layer at its last GEMM keeps each layer's kernels on its own weights,
 * so the ZeRO hooks (llama_model.h) sit between layers.
 *
 * Backward takes d_res, the gradient of the layer's output (which is also the
 * gradient of its down_proj output), to the gradient of its input, and writes
 * (or, with accumulate, adds) the weight gradients g. It recomputes what the
 * recompute level did not keep: level 1 the norms' outputs and SwiGLU, level 2
 * also the gate/up GEMM, level 3 the whole forward of the layer from res_in but
 * its down_proj. Recomputed tensors are bit-identical to forward's: the same
 * kernels on the same inputs, or for SwiGLU's and the norms' outputs the same
 * expression inside their backward (swiglu.h, rmsnorm.h), which reads their
 * inputs anyway; the Linear map that reads such an output has its input gradient
 * made before that backward and its weight gradient after. Scratch: d_ln, d_att_out, d_qkv, d_swiglu and the
 * norms' partials; gate_up is overwritten by its own gradient.
 */
#ifndef LLMC_LLAMA_LAYER_H
#define LLMC_LLAMA_LAYER_H

#include "llmc/kernels/attention.h"
#include "llmc/kernels/bias.h"
#include "llmc/kernels/qk_norm.h"
#include "llmc/common/cuda_common.h"
#include "llmc/model/llama_acts.h"
#include "llmc/kernels/linear.h"
#include "llmc/model/llama_params.h"
#include "llmc/kernels/rmsnorm.h"
#include "llmc/kernels/rope.h"
#include "llmc/kernels/swiglu.h"
#include "llmc/model/param_layout.h"
#include "llmc/model/linear_shapes.h"

/* What every layer's kernels need besides its tensors. */
typedef struct {
    int B, T, N; /* N = B * T tokens */
    int C, H, KV, D, F;
    float eps;
    int recompute;             /* 0 to 3 (llama_acts.h) */
    const float *freqs_cis;    /* RoPE table [T, D / 2, 2] */
    Fp8Scratch *fp8;           /* the Linear maps' FP8 codes (linear.h), or NULL: bf16 GEMMs */
    const AttentionDocs *docs; /* packed documents (attention.h), or NULL: one causal sequence per row */
    const int *positions;      /* each token's RoPE position [N], or NULL: its place in its row */
} LayerSpec;

static inline LayerSpec layer_spec(const LlamaConfig *c, int B, int T, int recompute, const float *freqs_cis,
                                   Fp8Scratch *fp8)
{
    LayerSpec sp;
    memset(&sp, 0, sizeof(sp)); /* docs and positions: none unless the caller sets them */
    sp.B = B;
    sp.T = T;
    sp.N = B * T;
    sp.C = c->d_model;
    sp.H = c->n_head;
    sp.KV = c->n_kv_head;
    sp.D = c->head_dim;
    sp.F = c->ffn_dim;
    sp.eps = c->norm_eps;
    sp.recompute = recompute;
    sp.freqs_cis = freqs_cis;
    sp.fp8 = fp8;
    return sp;
}

/* With FP8, each layer's Linear map (LINEAR_QKV..LINEAR_DOWN, linear_shapes.h) has its own slot (linear.h). */
static inline int linear_slot(int layer, int map)
{
    return layer * LINEAR_MAPS + map;
}

static inline int layer_qkv_dim(const LayerSpec *sp)
{
    return (sp->H + 2 * sp->KV) * sp->D;
}

/* The layer's forward from ln_attn to swiglu_out: all but its input norm and its down_proj. With FP8 the norms and
 * SwiGLU write the amax of what they produce for the Linear map that reads it (linear.h); attention's output gets
 * an amax pass inside linear_forward. */
static inline void layer_forward_inner_(const LayerSpec *sp, const LayerTensors *w, Activations *acts, int l,
                                        cudaStream_t s)
{
    LayerActs *a = &acts->layers[l];
    int N = sp->N, C = sp->C, HD = sp->H * sp->D, fp8 = sp->fp8 != NULL;
    linear_forward(a->qkv, a->ln_attn, w->qkv, w->qkv_bias, N, C, layer_qkv_dim(sp), sp->fp8,
                   linear_slot(l, LINEAR_QKV), fp8, s);
    if (w->qk_norm)
        qk_norm_forward(a->qkv, a->qk_raw, a->qk_rstd, w->qk_norm, w->qk_norm + sp->D, N, sp->H, sp->KV, sp->D, sp->eps,
                        s);
    rope_forward(a->qkv, sp->freqs_cis, sp->positions, sp->B, sp->T, sp->H, sp->KV, sp->D, s);
    attention_forward(a->att_out, a->att_stats, a->qkv, sp->B, sp->T, sp->H, sp->KV, sp->D, sp->docs, s);
    linear_forward(acts->branch, a->att_out, w->o, NULL, N, HD, C, sp->fp8, linear_slot(l, LINEAR_O), 0, s);
    fused_residual_rmsnorm_forward_amax(a->res_mid, a->ln_mlp, a->rstd_mlp, a->res_in, acts->branch, w->mlp_norm, N, C,
                                        sp->eps, fp8_input_amax(sp->fp8, linear_slot(l, LINEAR_GATE_UP)), s);
    linear_forward(a->gate_up, a->ln_mlp, w->gate_up, NULL, N, C, 2 * sp->F, sp->fp8, linear_slot(l, LINEAR_GATE_UP),
                   fp8, s);
    swiglu_forward_amax(a->swiglu_out, a->gate_up, N, sp->F, fp8_input_amax(sp->fp8, linear_slot(l, LINEAR_DOWN)), s);
}

/* ln_attn from the layer's input: the first layer's plain norm, later ones' fused with the residual add. */
static inline void layer_input_norm_(const LayerSpec *sp, const LayerTensors *w, Activations *acts, int l,
                                     cudaStream_t s)
{
    LayerActs *a = &acts->layers[l];
    float *amax = fp8_input_amax(sp->fp8, linear_slot(l, LINEAR_QKV));
    if (l == 0)
        rmsnorm_forward_amax(a->ln_attn, a->rstd_attn, a->res_in, w->attn_norm, sp->N, sp->C, sp->eps, amax, s);
    else
        fused_residual_rmsnorm_forward_amax(a->res_in, a->ln_attn, a->rstd_attn, acts->layers[l - 1].res_mid,
                                            acts->branch, w->attn_norm, sp->N, sp->C, sp->eps, amax, s);
}

static inline void layer_forward(const LayerSpec *sp, const LayerTensors *w, Activations *acts, int l, cudaStream_t s)
{
    layer_input_norm_(sp, w, acts, l, s);
    layer_forward_inner_(sp, w, acts, l, s);
    linear_forward(acts->branch, acts->layers[l].swiglu_out, w->down, NULL, sp->N, sp->F, sp->C, sp->fp8,
                   linear_slot(l, LINEAR_DOWN), sp->fp8 != NULL, s);
}

/* From the gradient of the layer's output to that of res_mid, in d_res. With FP8, d_res arrives with its amax in
 * fp8_grad_amax (llama_backward's final norm, or the next layer's input norm backward), and each norm and SwiGLU
 * backward here writes the amax of the gradient it produces. */
static inline void layer_mlp_backward(const LayerSpec *sp, const LayerTensors *w, const LayerTensors *g,
                                      Activations *acts, int l, int accumulate, cudaStream_t s)
{
    LayerActs *a = &acts->layers[l];
    int N = sp->N, C = sp->C, F = sp->F, partly = sp->recompute < 3; /* level 3 recomputed all before */
    int fp8 = sp->fp8 != NULL, gate_up = linear_slot(l, LINEAR_GATE_UP);
    /* level 1 makes ln_mlp again in the norm's backward below; level 2's gate_up GEMM needs it first */
    if (partly && sp->recompute >= 2) {
        rmsnorm_forward_amax(a->ln_mlp, a->rstd_mlp, a->res_mid, w->mlp_norm, N, C, sp->eps,
                             fp8_input_amax(sp->fp8, gate_up), s);
        linear_forward(a->gate_up, a->ln_mlp, w->gate_up, NULL, N, C, 2 * F, sp->fp8, gate_up, fp8, s);
    }
    /* down's input gradient, then SwiGLU's backward (gate_up in place), which also writes swiglu_out again where it
     * was not kept (from the gate_up it reads anyway), or per tensor FP8 straight its x^T codes, then down's weight
     * gradient from it */
    int down = linear_slot(l, LINEAR_DOWN), remake = partly && sp->recompute >= 1;
    linear_backward_input(acts->d_swiglu, acts->d_res, w->down, N, F, C, sp->fp8, down, fp8, s);
    uint8_t *x_t_codes;
    float *x_t_inv;
    const float *x_amax;
    if (remake && linear_x_t_codes(sp->fp8, down, N, F, &x_t_codes, &x_t_inv, &x_amax)) {
        swiglu_backward_codes_t(a->gate_up, acts->d_swiglu, a->gate_up, N, F, fp8_grad_amax(sp->fp8), x_t_codes,
                                x_t_inv, x_amax, s);
        linear_backward_weight(g->down, acts->d_res, NULL, N, F, C, accumulate, sp->fp8, down, s);
    } else {
        swiglu_backward_recompute(a->gate_up, remake ? a->swiglu_out : NULL, acts->d_swiglu, a->gate_up, N, F,
                                  fp8_grad_amax(sp->fp8), fp8_input_amax(sp->fp8, down), s);
        linear_backward_weight(g->down, acts->d_res, a->swiglu_out, N, F, C, accumulate, sp->fp8, down, s);
    }
    linear_backward_input(acts->d_ln, a->gate_up, w->gate_up, N, C, 2 * F, sp->fp8, gate_up, fp8, s);
    rmsnorm_backward_recompute(acts->d_res, g->mlp_norm, acts->norm_scratch,
                               partly && sp->recompute == 1 ? a->ln_mlp : NULL, acts->d_ln, a->res_mid, w->mlp_norm,
                               a->rstd_mlp, N, C, accumulate, fp8_grad_amax(sp->fp8), fp8_input_amax(sp->fp8, gate_up),
                               s);
    linear_backward_weight(g->gate_up, a->gate_up, a->ln_mlp, N, C, 2 * F, accumulate, sp->fp8, gate_up, s);
}

/* From the gradient of res_mid to that of res_in, in d_res (with its amax under FP8, for the previous layer). */
static inline void layer_attention_backward(const LayerSpec *sp, const LayerTensors *w, const LayerTensors *g,
                                            Activations *acts, int l, int accumulate, cudaStream_t s)
{
    LayerActs *a = &acts->layers[l];
    int N = sp->N, C = sp->C, HD = sp->H * sp->D, QKV = layer_qkv_dim(sp), fp8 = sp->fp8 != NULL;
    int qkv = linear_slot(l, LINEAR_QKV);
    linear_backward(acts->d_att_out, g->o, acts->d_res, a->att_out, w->o, N, HD, C, accumulate, sp->fp8,
                    linear_slot(l, LINEAR_O), fp8, s);
    attention_backward(acts->d_qkv, acts->d_att_out, a->qkv, a->att_out, a->att_stats, sp->B, sp->T, sp->H, sp->KV,
                       sp->D, sp->docs, s);
    rope_backward(acts->d_qkv, sp->freqs_cis, sp->positions, sp->B, sp->T, sp->H, sp->KV, sp->D, s);
    if (g->qk_norm)
        qk_norm_backward(acts->d_qkv, g->qk_norm, acts->norm_scratch, a->qk_raw, a->qk_rstd, w->qk_norm,
                         w->qk_norm + sp->D, N, sp->H, sp->KV, sp->D, accumulate, s);
    if (g->qkv_bias)
        bias_backward(g->qkv_bias, acts->norm_scratch, acts->d_qkv, N, QKV, accumulate, s);
    /* d_qkv's amax is a pass of its own: RoPE leaves the values' part untouched, attention is cuDNN's. ln_attn,
     * where not kept (levels 1 and 2; level 3's is still there), is made again by the norm's backward. */
    linear_backward_input(acts->d_ln, acts->d_qkv, w->qkv, N, C, QKV, sp->fp8, qkv, 0, s);
    rmsnorm_backward_recompute(acts->d_res, g->attn_norm, acts->norm_scratch,
                               sp->recompute == 1 || sp->recompute == 2 ? a->ln_attn : NULL, acts->d_ln, a->res_in,
                               w->attn_norm, a->rstd_attn, N, C, accumulate, fp8_grad_amax(sp->fp8),
                               fp8_input_amax(sp->fp8, qkv), s);
    linear_backward_weight(g->qkv, acts->d_qkv, a->ln_attn, N, C, QKV, accumulate, sp->fp8, qkv, s);
}

static inline void layer_backward(const LayerSpec *sp, const LayerTensors *w, const LayerTensors *g, Activations *acts,
                                  int l, int accumulate, cudaStream_t s)
{
    if (sp->recompute >= 3) { /* the layer's forward again, from its kept input */
        LayerActs *a = &acts->layers[l];
        rmsnorm_forward_amax(a->ln_attn, a->rstd_attn, a->res_in, w->attn_norm, sp->N, sp->C, sp->eps,
                             fp8_input_amax(sp->fp8, linear_slot(l, LINEAR_QKV)), s);
        layer_forward_inner_(sp, w, acts, l, s);
    }
    layer_mlp_backward(sp, w, g, acts, l, accumulate, s);
    layer_attention_backward(sp, w, g, acts, l, accumulate, s);
}

#endif /* LLMC_LLAMA_LAYER_H */
