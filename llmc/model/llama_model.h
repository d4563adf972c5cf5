/*
 * llama_model.h: the Llama 3 model of train_llama.cu on the GPU: bf16 weights
 * with fp32 master weights, bf16 gradients and fp32 AdamW moments, 14 bytes
 * per parameter divided over the GPUs by ZeRO (llama_params.h,
 * llama_optimizer.h), the activations (llama_acts.h), and one micro-step and
 * optimizer step on them. Gradients are bf16 as in llm.c: each is one
 * fp32-accumulated GEMM or kernel rounded once, plus one rounding per extra
 * logits chunk (lm_head) and per extra micro-step; the first micro-step
 * writes them, later ones add.
 *
 * One micro-step, N = B*T tokens (llama_micro_step):
 *   forward:  embedding -> each layer (llama_layer.h) -> the last residual add
 *             fused with the final rmsnorm
 *   loss:     chunked lm_head + cross-entropy (fused_classifier.h); the N x V
 *             logits never exist at once
 *   backward: the same in reverse, recomputing what --recompute did not keep
 * then, once per optimizer step (llama_update): gradients summed over the GPUs,
 * global norm, clip, AdamW, all on the device.
 *
 * ZeRO's hooks (llmc/parallel/zero.h) sit between layers: bucket b is the embedding
 * (b = 0), layer b - 1, or the final norm (and lm_head); with stage 3 a
 * bucket's weights are gathered just ahead of use, the next layer's while this
 * one computes; in the last micro-step of a step (with stages 2 and 3 reducing
 * every micro-step: in each) a bucket's gradient is summed over the GPUs as soon
 * as backward has finished it, while the layers below compute.
 */
#ifndef LLMC_LLAMA_MODEL_H
#define LLMC_LLAMA_MODEL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/formats/checkpoint.h"
#include "llmc/common/cuda_common.h"
#include "llmc/parallel/distributed.h"
#include "llmc/model/documents.h"
#include "llmc/kernels/embedding.h"
#include "llmc/kernels/fused_classifier.h"
#include "llmc/formats/hf_model.h"
#include "llmc/model/llama_acts.h"
#include "llmc/model/llama_config.h"
#include "llmc/model/llama_layer.h"
#include "llmc/model/llama_optimizer.h"
#include "llmc/model/llama_params.h"
#include "llmc/common/profile.h"
#include "llmc/kernels/rmsnorm.h"
#include "llmc/kernels/rope.h"
#include "llmc/run/schedule.h"
#include "llmc/formats/tensorfile.h"
#include "llmc/common/utils.h"
#include "llmc/parallel/zero.h"
#include "llmc/model/param_layout.h"
#include "llmc/model/linear_shapes.h"

/* How the model runs, besides its shape. */
typedef struct {
    int B, T;                   /* a micro-batch: B sequences of T tokens per GPU */
    int recompute;              /* 0: keep every activation; 1: recompute norms and SwiGLU; 2: also gate/up;
                                   3: keep only each layer's input (llama_acts.h) */
    int max_micro_steps;        /* micro-steps per optimizer step, at most */
    size_t logits_budget_bytes; /* the least memory for one chunk of the classifier's logits (llama_acts.h may give
                                   it more, from buffers free during the loss) */
    const Dist *dist;           /* the ranks, over which ZeRO shards */
    int zero_stage;             /* 0 to 3 (llmc/parallel/zero.h) */
    int fp8;                    /* Fp8Recipe: the layers' Linear maps on FP8 codes (linear.h), or 0 */
    int fp8_weights_made;       /* stages 0-2: the weights' codes made at each use even where keeping them fits */
    int doc_mask;               /* packed documents (llmc/model/documents.h): attention within each document, */
    int doc_bos;                /* which starts at this token; */
    int doc_positions;          /* and RoPE positions restart at each document's start */
    int shard_over_hosts;       /* ZeRO's weights and gradients sharded within each host (zero.h) */
    int grad_accum;             /* ZeroAccum: where stages 2 and 3 accumulate micro-steps */
    int grad_reduce;            /* ZeroSum: how gradients are summed over the ranks */
    int weight_gather;          /* ZeroGather: what stage 3's per-layer gathers move */
    int update_gather;          /* ZeroUpdate: how stages 1 and 2 gather the updated weights */
    int offload;                /* OffloadMode: master weights and AdamW on the host (optimizer_offload.h) */
} LlamaOptions;

/* A micro-batch on the device, and its embedding backward plan (embedding.h),
 * made on the host in a slot per micro-step. */
typedef struct {
    int *tokens, *targets;                        /* [N] */
    int *bucket_token, *bucket_start, *positions; /* the plan on the device */
    int n_buckets;
    int *h_bucket_token, *h_bucket_start, *h_positions; /* pinned host slots, [max_micro_steps] plans */
    int *h_workspace;
    const int *h_tokens; /* the caller's host tokens of the micro-batch set, until its plan is made */
    int micro;           /* the micro-step set, whose plan slot they go to */
    /* with opt.doc_mask: the micro-batch's documents (attention.h's ragged sequences, RoPE positions) */
    AttentionDocs docs;
    int *doc_positions;                                 /* device: [N]; docs holds the lengths and starts */
    int *h_doc_seq_len, *h_doc_start, *h_doc_positions; /* pinned host slots per micro-step, as the plans' */
    int *h_doc_first;                                   /* [N] */
} LlamaBatch;

typedef struct {
    LlamaConfig config;
    ParamLayout layout;
    LlamaOptions opt;
    LayerSpec spec;
    LlamaParams params;
    Optimizer optimizer;
    Activations acts;
    LlamaBatch batch;
    float *freqs_cis;  /* RoPE table [T, D/2, 2] */
    int logits_chunk;  /* rows of the classifier's logits at once */
    bf16 *logits;      /* [logits_chunk, V], in acts.loss_scratch */
    float *losses;     /* [N] per token */
    float *loss_parts; /* [max_micro_steps] each micro-step's summed loss */
    Fp8Scratch fp8;    /* with opt.fp8: the Linear maps' codes */
} Llama;

static inline int64_t llama_tokens(const Llama *m)
{
    return (int64_t)m->opt.B * m->opt.T;
}
static inline int llama_last_bucket(const Llama *m)
{
    return m->params.zero.plan.n_buckets - 1;
}

static inline void llama_batch_build(LlamaBatch *b, int64_t N, int V, int max_micro_steps, int doc_mask)
{
    b->tokens = (int *)cuda_malloc_named((size_t)N * sizeof(int), "tokens");
    b->targets = (int *)cuda_malloc_named((size_t)N * sizeof(int), "targets");
    b->bucket_token = (int *)cuda_malloc_named((size_t)N * sizeof(int), "embedding backward plan");
    b->bucket_start = (int *)cuda_malloc_named((size_t)(N + 1) * sizeof(int), "embedding backward plan");
    b->positions = (int *)cuda_malloc_named((size_t)N * sizeof(int), "embedding backward plan");
    CUDA_CHECK(cudaMallocHost(&b->h_bucket_token, (size_t)N * max_micro_steps * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&b->h_bucket_start, (size_t)(N + 1) * max_micro_steps * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&b->h_positions, (size_t)N * max_micro_steps * sizeof(int)));
    b->h_workspace =
        (int *)malloc_check(embedding_backward_plan_workspace_ints((int)N, V) * sizeof(int), "embedding backward plan");
    if (doc_mask) {
        size_t ends = (size_t)(N + 1) * sizeof(int);
        b->docs.seq_len = (int *)cuda_malloc_named(ends, "packed documents: lengths");
        b->docs.start = (int *)cuda_malloc_named(ends, "packed documents: starts");
        b->doc_positions = (int *)cuda_malloc_named((size_t)N * sizeof(int), "packed documents: RoPE positions");
        b->docs.qkv_offsets = (int *)cuda_malloc_named(ends, "packed documents: qkv offsets");
        b->docs.out_offsets = (int *)cuda_malloc_named(ends, "packed documents: output offsets");
        b->docs.stats_offsets = (int *)cuda_malloc_named(ends, "packed documents: stats offsets");
        CUDA_CHECK(cudaMallocHost(&b->h_doc_seq_len, ends * max_micro_steps));
        CUDA_CHECK(cudaMallocHost(&b->h_doc_start, ends * max_micro_steps));
        CUDA_CHECK(cudaMallocHost(&b->h_doc_positions, (size_t)N * sizeof(int) * max_micro_steps));
        b->h_doc_first = (int *)malloc_check((size_t)N * sizeof(int), "packed documents");
    }
}

static inline void llama_batch_free(LlamaBatch *b)
{
    cuda_free(b->tokens);
    cuda_free(b->targets);
    cuda_free(b->bucket_token);
    cuda_free(b->bucket_start);
    cuda_free(b->positions);
    CUDA_CHECK(cudaFreeHost(b->h_bucket_token));
    CUDA_CHECK(cudaFreeHost(b->h_bucket_start));
    CUDA_CHECK(cudaFreeHost(b->h_positions));
    free(b->h_workspace);
    if (b->h_doc_first != NULL) {
        cuda_free(b->docs.seq_len);
        cuda_free(b->docs.start);
        cuda_free(b->doc_positions);
        cuda_free(b->docs.qkv_offsets);
        cuda_free(b->docs.out_offsets);
        cuda_free(b->docs.stats_offsets);
        CUDA_CHECK(cudaFreeHost(b->h_doc_seq_len));
        CUDA_CHECK(cudaFreeHost(b->h_doc_start));
        CUDA_CHECK(cudaFreeHost(b->h_doc_positions));
        free(b->h_doc_first);
    }
}

/* The Linear maps' W shapes, one slot per layer and map (linear.h); the caller frees. */
static inline LinearShape *llama_linear_shapes(const LlamaConfig *c, int *n_slots)
{
    *n_slots = c->n_layer * LINEAR_MAPS;
    LinearShape *shapes = (LinearShape *)malloc_check((size_t)*n_slots * sizeof(LinearShape), "FP8 Linear shapes");
    for (int l = 0; l < c->n_layer; l++)
        for (int map = 0; map < LINEAR_MAPS; map++)
            shapes[linear_slot(l, map)] = llama_linear_shape(c, map);
    return shapes;
}

/* With opt.fp8: the Linear maps' codes (of the W shapes of every slot; the
 * scratch of one at a time takes scratch_bytes), the weights' (linear.h):
 *   ZeRO 3 per tensor, --weight-gather auto: gathered as codes (zero_fp8.h);
 *   else ZeRO 3: made at each use (its point is not to hold all the weights);
 *   else kept for a step where the memory allows it and opt.fp8_weights_made does not say otherwise, else made at
 *   each use.
 * All three give the same bits. */
static inline void llama_fp8_build(Llama *m, const LinearShape *shapes, int n_slots, size_t scratch_bytes)
{
    Fp8Recipe recipe = (Fp8Recipe)m->opt.fp8;
    Zero *z = &m->params.zero;
    int64_t N = llama_tokens(m);
    Fp8Weights weights = m->opt.zero_stage < 3 && !m->opt.fp8_weights_made ? FP8_WEIGHTS_KEPT : FP8_WEIGHTS_MADE;
    if (weights == FP8_WEIGHTS_KEPT) {
        size_t free_b = 0, total_b = 0, kept = fp8_kept_weight_bytes(recipe, shapes, n_slots);
        CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        if (kept + scratch_bytes + PARAMS_MEMORY_RESERVE > free_b) {
            weights = FP8_WEIGHTS_MADE;
            printf("fp8: the weights' codes are made at each use (keeping them for a step needs %.2f GiB, %.2f GiB "
                   "are free)\n",
                   gib(kept), gib(free_b));
        }
    } else if (m->opt.zero_stage < 3) {
        if (z->dist->rank == 0)
            printf("fp8: the weights' codes are made at each use (--fp8-weights made)\n");
    } else if (m->opt.weight_gather == ZERO_GATHER_AUTO) {
        const char *why = recipe == FP8_TENSOR ? zero_fp8_unsupported(z, &m->layout, shapes)
                                               : "the row and block recipes' codes are not gathered yet";
        if (why && z->dist->rank == 0)
            printf("fp8: ZeRO 3 gathers the layers' weights in bf16 and makes their codes at each use (%s)\n", why);
        if (!why)
            weights = FP8_WEIGHTS_GATHERED;
    }
    fp8_scratch_build(&m->fp8, recipe, N, shapes, n_slots, weights);
    if (weights != FP8_WEIGHTS_GATHERED)
        return;
    zero_fp8_enable(z, &m->layout, shapes);
    for (int s = 2; s < ZERO_SLOTS; s++)
        fp8_gathered_view(&m->fp8, s, z->weight_staging[s], z->fp8->codes[s], zero_slot_elements(z, s), z->fp8->inv);
    if (z->dist->rank == 0)
        printf("fp8: ZeRO 3 gathers the layers' weights as their FP8 codes (%.2f GiB of staging for them)\n",
               gib(zero_fp8_bytes(z)));
}

/* Allocates everything a model of config needs to train as opt says; the
 * weights are zeros until llama_init_random, llama_load_weights or a checkpoint.
 * What the run needs comes first (activations, batch, logits); then the
 * parameters and optimizer state, whose gradients are accumulated locally where
 * the memory allows it (llama_params.h); then the FP8 codes, kept for a step
 * where it still allows it. */
/* 0 if the GPU model computes every option of c, else -1 and which it lacks. */
static inline int llama_gpu_computes(const LlamaConfig *c, char *err, size_t errlen)
{
    if (!c->qk_norm || c->head_dim <= QK_NORM_MAX_D)
        return 0;
    return set_error(err, errlen,
                     "this %s's RMSNorm of q and k per head takes heads of at most %d channels on the GPU, not %d "
                     "(the CPU reference train_llama_ref takes any)",
                     FAMILY_ARCHITECTURE[c->family], QK_NORM_MAX_D, c->head_dim);
}

static inline void llama_build(Llama *m, const LlamaConfig *config, const LlamaOptions *opt)
{
    char why[512];
    if (llama_gpu_computes(config, why, sizeof(why)) != 0)
        FAIL("%s", why);
    memset(m, 0, sizeof(*m));
    m->config = *config;
    m->opt = *opt;
    m->layout = llama_param_layout(config);
    const LlamaConfig *c = config;
    int64_t N = llama_tokens(m), V = c->vocab_size;
    /* the logits chunk lives in what the loss leaves free (llama_acts.h): as large as that is at recompute 1 (the
     * default), or the budget. The same rows at every level, so that the levels' gradients stay bit-identical (the
     * lm_head's gradient is rounded once per chunk); at level 0, with fewer buffers free, it costs their difference. */
    size_t free_at_loss = acts_loss_scratch_bytes(c, opt->B, opt->T, 1);
    m->logits_chunk = fused_classifier_chunk_rows(
        (int)N, (int)V, free_at_loss > opt->logits_budget_bytes ? free_at_loss : opt->logits_budget_bytes);
    acts_build(&m->acts, c, opt->B, opt->T, opt->recompute, (size_t)m->logits_chunk * V * sizeof(bf16));
    m->logits = (bf16 *)m->acts.loss_scratch;
    m->losses = (float *)cuda_malloc_named((size_t)N * sizeof(float), "per-token losses");
    m->loss_parts = (float *)cuda_malloc_named((size_t)opt->max_micro_steps * sizeof(float), "micro-step losses");
    float *table = (float *)malloc_check((size_t)opt->T * c->head_dim * sizeof(float), "RoPE table");
    rope_table_host(table, c, opt->T);
    m->freqs_cis = (float *)cuda_malloc_named((size_t)opt->T * c->head_dim * sizeof(float), "RoPE table");
    CUDA_CHECK(cudaMemcpy(m->freqs_cis, table, (size_t)opt->T * c->head_dim * sizeof(float), cudaMemcpyHostToDevice));
    free(table);
    llama_batch_build(&m->batch, N, (int)V, opt->max_micro_steps, opt->doc_mask);
    ZeroOptions zopt = {.stage = opt->zero_stage,
                        .over_hosts = opt->shard_over_hosts,
                        .accum = opt->grad_accum,
                        .sum = opt->grad_reduce,
                        .gather = opt->weight_gather,
                        .update = opt->update_gather,
                        .micro_steps = opt->max_micro_steps};
    size_t fp8_bytes = 0;
    int n_slots = 0;
    LinearShape *shapes = NULL; /* with FP8: the Linear maps' codes come after the parameters, sized now */
    if (opt->fp8) {
        shapes = llama_linear_shapes(c, &n_slots);
        fp8_bytes = fp8_scratch_bytes_about(N, shapes, n_slots);
        int gathered = opt->zero_stage >= 3 && opt->fp8 == FP8_TENSOR && opt->weight_gather == ZERO_GATHER_AUTO;
        for (int i = 0; gathered && i < m->layout.n_tensors; i++) /* two layers' gathered codes, at most */
            fp8_bytes += m->layout.tensors[i].bucket == 1 ? 2 * (size_t)m->layout.tensors[i].numel : 0;
    }
    params_build(&m->params, c, &m->layout, opt->dist, &zopt, opt->offload, fp8_bytes);
    optimizer_build(&m->optimizer, &m->params, &m->layout);
    if (opt->fp8)
        llama_fp8_build(m, shapes, n_slots, fp8_bytes);
    free(shapes);
    m->spec = layer_spec(c, opt->B, opt->T, opt->recompute, m->freqs_cis, opt->fp8 ? &m->fp8 : NULL);
    if (opt->doc_mask) {
        m->spec.docs = &m->batch.docs;
        m->spec.positions = opt->doc_positions ? m->batch.doc_positions : NULL;
    }
}

static inline void llama_free(Llama *m)
{
    params_free(&m->params);
    optimizer_free(&m->optimizer);
    acts_free(&m->acts);
    llama_batch_free(&m->batch);
    cuda_free(m->losses);
    cuda_free(m->loss_parts);
    cuda_free(m->freqs_cis);
    if (m->opt.fp8)
        fp8_scratch_free(&m->fp8);
    llama_param_layout_free(&m->layout);
    memset(m, 0, sizeof(*m));
}

/* HF's init: normal(0, init_std) for every matrix, ones for the norm weights. */
static inline void llama_init_random(Llama *m, uint64_t seed)
{
    float *host = (float *)malloc_check((size_t)m->layout.total * sizeof(float), "initial weights");
    llama_init_weights_host(host, &m->config, &m->layout, seed);
    params_upload_master(&m->params, host);
    free(host);
}

/* Weights from an HF model directory or a .llmt weights file (hf_model.h),
 * whose config must be the model's. */
static inline void llama_load_weights(Llama *m, const char *path)
{
    HfTokenIds ids;
    LlamaConfig fc = model_config_load(path, &ids);
    if (memcmp(&fc, &m->config, sizeof(fc)) != 0) {
        FAIL("'%s' holds a model of another shape than the one requested\n  hint: pass --init-from alone, "
             "without --preset or shape flags, to take the shape from it",
             path);
    }
    float *host = (float *)malloc_check((size_t)m->layout.total * sizeof(float), "weights");
    model_weights_load(path, &m->layout, host);
    checkpoint_init_from_verify(path, &m->layout, host); /* a checkpoint directory: its files as saved */
    params_upload_master(&m->params, host);
    free(host);
}

/* The documents of micro-batch `micro`'s tokens (opt.doc_mask), found on the host (llmc/model/documents.h) into its
 * slots, for attention and RoPE on the device. */
static inline void llama_set_documents(Llama *m, const int *tokens, int micro, cudaStream_t s)
{
    LlamaBatch *b = &m->batch;
    int B = m->opt.B, T = m->opt.T;
    int64_t N = llama_tokens(m);
    int *seq_len = b->h_doc_seq_len + (int64_t)micro * (N + 1), *start = b->h_doc_start + (int64_t)micro * (N + 1);
    int *pos = b->h_doc_positions + (int64_t)micro * N;
    documents_find(b->h_doc_first, pos, tokens, B, T, m->opt.doc_bos);
    DocumentsShape d = documents_pack(start, seq_len, b->h_doc_first, B, T);
    b->docs.slots = d.slots;
    b->docs.max_len = d.max_len;
    CUDA_CHECK(cudaMemcpyAsync(b->docs.seq_len, seq_len, (size_t)d.slots * sizeof(int), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(b->docs.start, start, (size_t)(d.slots + 1) * sizeof(int), cudaMemcpyHostToDevice, s));
    if (m->opt.doc_positions)
        CUDA_CHECK(cudaMemcpyAsync(b->doc_positions, pos, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, s));
    attention_documents_offsets(&b->docs, m->config.n_head, m->config.n_kv_head, m->config.head_dim, s);
}

/* Copies micro-batch `micro` of the step to the device. Its embedding backward
 * plan is made later, by llama_plan_embedding_backward once the forward pass is
 * queued, so that the host's 0.5 ms of planning (16,384 tokens) overlaps the GPU
 * instead of delaying a step's first kernel; `tokens` must stay valid until then. */
static inline void llama_set_batch(Llama *m, const int *tokens, const int *targets, int micro, cudaStream_t s)
{
    LlamaBatch *b = &m->batch;
    int64_t N = llama_tokens(m);
    b->h_tokens = tokens;
    b->micro = micro;
    CUDA_CHECK(cudaMemcpyAsync(b->tokens, tokens, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(b->targets, targets, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, s));
    if (m->opt.doc_mask)
        llama_set_documents(m, tokens, micro, s);
}

/* The embedding backward plan of the micro-batch set (embedding.h), made on the
 * host into the micro-step's own pinned slot, so no host buffer is reused before
 * the end-of-step sync and nothing here waits for the GPU. */
static inline void llama_plan_embedding_backward(Llama *m, cudaStream_t s)
{
    LlamaBatch *b = &m->batch;
    int64_t N = llama_tokens(m);
    int *bucket_token = b->h_bucket_token + (int64_t)b->micro * N;
    int *bucket_start = b->h_bucket_start + (int64_t)b->micro * (N + 1);
    int *positions = b->h_positions + (int64_t)b->micro * N;
    b->n_buckets = embedding_backward_plan_host(bucket_token, bucket_start, positions, b->h_tokens, (int)N,
                                                m->config.vocab_size, b->h_workspace);
    CUDA_CHECK(
        cudaMemcpyAsync(b->bucket_token, bucket_token, (size_t)b->n_buckets * sizeof(int), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(b->bucket_start, bucket_start, (size_t)(b->n_buckets + 1) * sizeof(int),
                               cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(b->positions, positions, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, s));
}

/* Forward through the final norm (ln_final) of sp->B rows (at most the
 * model's B) of the tokens set; the loss comes from the classifier. */
static inline void llama_forward_rows(Llama *m, const LayerSpec *sp, cudaStream_t s)
{
    const ModelTensors *w = &m->params.weights;
    Activations *acts = &m->acts;
    Zero *z = &m->params.zero;
    int N = sp->N, C = m->config.d_model, L = m->config.n_layer;
    zero_weights_ready(z, 0, s);
    zero_weights_fetch(z, 1);
    embedding_forward(acts->layers[0].res_in, m->batch.tokens, w->embedding, N, C, s);
    for (int l = 0; l < L; l++) {
        zero_weights_ready(z, l + 1, s);
        zero_weights_fetch(z, l + 2); /* the next layer's bucket, or the final norm's */
        layer_forward(sp, &w->layers[l], acts, l, s);
        zero_weights_done(z, l + 1, s);
    }
    zero_weights_ready(z, L + 1, s);
    fused_residual_rmsnorm_forward(acts->res_final, acts->ln_final, acts->rstd_final, acts->layers[L - 1].res_mid,
                                   acts->branch, w->final_norm, N, C, m->config.norm_eps, s);
}

static inline void llama_forward(Llama *m, cudaStream_t s)
{
    llama_forward_rows(m, &m->spec, s);
}

/* Backward from the classifier's d_ln (the gradient of the final norm output).
 * The weight gradients are written, or added to when accumulate (later
 * micro-steps into a full-size gradient buffer); each bucket's gradient is
 * handed to zero.h as soon as it is complete (summed over the GPUs in the last
 * micro-step), and stage 3 gathers the weights of layer l - 1 while layer l
 * computes. */
static inline void llama_backward(Llama *m, int micro, int accumulate, cudaStream_t s)
{
    const ModelTensors *w = &m->params.weights, *g = &m->params.grads;
    Activations *acts = &m->acts;
    Zero *z = &m->params.zero;
    int N = (int)llama_tokens(m), C = m->config.d_model;
    PROFILED(PROF_OTHER, s, CUDA_CHECK(cudaMemsetAsync(acts->d_res, 0, (size_t)N * C * sizeof(bf16), s)));
    /* with FP8 also d_res's amax, for the last layer's down_proj (llama_layer.h) */
    rmsnorm_backward_amax(acts->d_res, g->final_norm, acts->norm_scratch, acts->d_ln, acts->res_final, w->final_norm,
                          acts->rstd_final, N, C, accumulate, fp8_grad_amax(m->spec.fp8), s);
    zero_grads_done(z, llama_last_bucket(m), micro, s);
    for (int l = m->config.n_layer - 1; l >= 0; l--) {
        zero_weights_ready(z, l + 1, s);
        if (l > 0)
            zero_weights_fetch(z, l);
        zero_grads_begin(z, l + 1, s);
        layer_backward(&m->spec, &w->layers[l], &g->layers[l], acts, l, accumulate, s);
        zero_weights_done(z, l + 1, s);
        zero_grads_done(z, l + 1, micro, s);
    }
    /* tied: the classifier already wrote this micro-step's lm_head gradient into the
     * same tensor; untied: rows of tokens not in the batch must start from zero */
    if (!accumulate && !m->config.tie_embeddings)
        PROFILED(PROF_EMBEDDING, s,
                 CUDA_CHECK(cudaMemsetAsync(g->embedding, 0, (size_t)m->config.vocab_size * C * sizeof(bf16), s)));
    embedding_backward(g->embedding, acts->d_res, m->batch.bucket_token, m->batch.bucket_start, m->batch.positions,
                       m->batch.n_buckets, C, s);
    zero_grads_done(z, 0, micro, s);
}

/* Forward, loss and backward of one micro-batch already set with llama_set_batch;
 * micro-step 0 writes the gradients, later ones add to them (where zero.h stages
 * the gradients, each micro-step writes the staging buffers and the
 * reduce-scatter adds). A step is opt.max_micro_steps micro-steps: the last one
 * sums the gradients over the GPUs. The micro-step's summed loss lands in
 * loss_parts[micro]; inv_count is 1 / the targets counted in the whole optimizer
 * step, over all ranks. */
static inline void llama_micro_step(Llama *m, float inv_count, int micro, cudaStream_t s)
{
    const LlamaConfig *c = &m->config;
    const ModelTensors *w = &m->params.weights, *g = &m->params.grads;
    int N = (int)llama_tokens(m);
    int accumulate = m->params.zero.full_grads && micro > 0;
    if (micro == 0) /* a new step: the weights may have changed since the last one */
        fp8_weights_changed(m->spec.fp8);
    llama_forward(m, s);
    /* the head's gradients (lm_head, final norm, a tied embedding) are written from here on */
    zero_grads_begin(&m->params.zero, 0, s);
    zero_grads_begin(&m->params.zero, llama_last_bucket(m), s);
    fused_classifier_forward_backward(m->losses, m->acts.d_ln, g->lm_head, m->logits, m->acts.ln_final, w->lm_head,
                                      m->batch.targets, N, c->d_model, c->vocab_size, m->logits_chunk, inv_count,
                                      accumulate, s);
    loss_sum(m->loss_parts + micro, m->losses, N, s);
    llama_plan_embedding_backward(m, s); /* the host plans while the GPU runs the forward pass */
    llama_backward(m, micro, accumulate, s);
}

/* The summed loss of the current batch into loss_parts[micro], without gradients (evaluation). */
static inline void llama_eval_micro(Llama *m, int micro, cudaStream_t s)
{
    const LlamaConfig *c = &m->config;
    int N = (int)llama_tokens(m);
    fp8_weights_changed(m->spec.fp8); /* evaluations come between steps, after an update */
    llama_forward(m, s);
    fused_classifier_forward(m->losses, m->logits, m->acts.ln_final, m->params.weights.lm_head, m->batch.targets, N,
                             c->d_model, c->vocab_size, m->logits_chunk, s);
    loss_sum(m->loss_parts + micro, m->losses, N, s);
}

/* The logits after tokens[0..n) (0 < n <= T) at its last position, into
 * logits[V] on the host, for samples: one forward of a single row of T tokens,
 * padded with token 0 after n (causal attention keeps the padding out of
 * position n - 1). Uses the batch and activation buffers: call between steps,
 * on every rank. */
static inline void llama_last_logits(Llama *m, const int *tokens, int n, float *logits, cudaStream_t s)
{
    int T = m->opt.T, C = m->config.d_model, V = m->config.vocab_size;
    if (n <= 0 || n > T)
        FAIL("llama_last_logits: %d tokens, the model runs 1 to %d", n, T);
    int *row = (int *)calloc_check((size_t)T, sizeof(int), "sample row");
    memcpy(row, tokens, sizeof(int) * (size_t)n);
    CUDA_CHECK(cudaMemcpyAsync(m->batch.tokens, row, sizeof(int) * (size_t)T, cudaMemcpyHostToDevice, s));
    LayerSpec one = m->spec;
    one.B = 1;
    one.N = T;
    one.docs = NULL; /* the sample is one document from position 0 */
    one.positions = NULL;
    fp8_weights_changed(m->spec.fp8); /* samples come between steps, after an update */
    llama_forward_rows(m, &one, s);
    fused_classifier_logits(m->logits, m->acts.ln_final + (int64_t)(n - 1) * C, m->params.weights.lm_head, 1, C, V, s);
    uint16_t *bits = (uint16_t *)malloc_check(sizeof(uint16_t) * (size_t)V, "sample logits");
    CUDA_CHECK(cudaMemcpyAsync(bits, m->logits, sizeof(uint16_t) * (size_t)V, cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    for (int v = 0; v < V; v++) {
        uint32_t u = (uint32_t)bits[v] << 16;
        memcpy(&logits[v], &u, 4);
    }
    free(bits);
    free(row);
}

/* One optimizer step at learning rate lr after the step's micro-steps (llama_optimizer.h). */
static inline void llama_update(Llama *m, const AdamWConfig *cfg, float lr, cudaStream_t s)
{
    optimizer_step(&m->optimizer, &m->params, cfg, lr, s);
}

#endif /* LLMC_LLAMA_MODEL_H */
