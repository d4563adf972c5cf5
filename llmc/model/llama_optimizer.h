/*
 * llama_optimizer.h: one optimizer step of the GPU model on its ZeRO-placed
 * parameters (llama_params.h), all on the device, the host never waiting:
 *   wait for the gradients' sums over the ranks (zero.h runs them during the
 *   last micro-step's backward), the squared norm of each bucket's share this
 *   rank updates, their sum in a fixed order, summed over the ranks, the clip
 *   coefficient, then AdamW (llmc/kernels/adamw.h: decay on the matrices only) on each
 *   bucket's range, and the new weights shared again (zero_params_changed),
 *   overlapped with the next step's forward pass. With --offload optimizer the
 *   AdamW runs on the host instead (optimizer_offload.h), the only step that
 *   waits for the host.
 *
 * Memory: the AdamW moments m and v, fp32, for the ranges this rank updates
 * (zero.state_total each, 8 bytes per parameter over the ranks; offloaded, in
 * host memory), the decay runs, and a few scalars of scratch.
 */
#ifndef LLMC_LLAMA_OPTIMIZER_H
#define LLMC_LLAMA_OPTIMIZER_H

#include "llmc/kernels/adamw.h"
#include "llmc/common/cuda_common.h"
#include "llmc/model/llama_params.h"
#include "llmc/common/profile.h"
#include "llmc/run/schedule.h"
#include "llmc/model/param_layout.h"
#include "llmc/model/optimizer_offload.h"

typedef struct {
    float *m, *v;          /* [zero.state_total], or NULL when offloaded: */
    HostAdamW host;        /* offloaded (params.host_master): the moments on the host, and the copy slots */
    AdamWRuns decay_runs;  /* weight decay on the matrices, not on the norm weights */
    int step;              /* AdamW steps taken (bias correction) */
    float *bucket_norm_sq; /* [n_buckets] squared norms of this rank's gradient shares */
    float *grad_norm_sq;   /* [1] the global squared gradient norm of the last step */
    float *clip_coef;      /* [1] */
    float *norm_scratch;   /* [NORM_BLOCKS] */
} Optimizer;

/* Zero moments for the ranges params' rank updates, on the device or, when params
 * keeps its master weights on the host (offloaded), there too. */
static inline void optimizer_build(Optimizer *o, const LlamaParams *p, const ParamLayout *layout)
{
    memset(o, 0, sizeof(*o));
    int64_t n = p->zero.state_total;
    if (p->host_master && p->zero.change)
        FAIL("optimizer_build: --update-gather delta needs the GPU's AdamW, which writes the changes; the AdamW of "
             "--offload optimizer runs on the host");
    if (p->host_master) {
        host_adamw_build(&o->host, &p->zero);
    } else {
        o->m = (float *)cuda_malloc_named((size_t)n * sizeof(float), "AdamW first moments");
        o->v = (float *)cuda_malloc_named((size_t)n * sizeof(float), "AdamW second moments");
        CUDA_CHECK(cudaMemset(o->m, 0, (size_t)n * sizeof(float)));
        CUDA_CHECK(cudaMemset(o->v, 0, (size_t)n * sizeof(float)));
    }
    /* AdamW finds the decay flag by the element's place in the padded buffers */
    unsigned char *decay = (unsigned char *)malloc_check((size_t)layout->n_tensors, "AdamW runs");
    for (int i = 0; i < layout->n_tensors; i++)
        decay[i] = (unsigned char)layout->tensors[i].is_matrix;
    o->decay_runs = adamw_runs_create(p->tensor_at, decay, layout->n_tensors);
    free(decay);
    o->grad_norm_sq = (float *)cuda_malloc_named(sizeof(float), "grad norm");
    o->clip_coef = (float *)cuda_malloc_named(sizeof(float), "clip coefficient");
    o->norm_scratch = (float *)cuda_malloc_named(NORM_BLOCKS * sizeof(float), "grad norm scratch");
    o->bucket_norm_sq = (float *)cuda_malloc_named((size_t)p->zero.plan.n_buckets * sizeof(float), "grad norm scratch");
}

static inline void optimizer_free(Optimizer *o)
{
    cuda_free(o->m);
    cuda_free(o->v);
    host_adamw_free(&o->host);
    adamw_runs_free(&o->decay_runs);
    cuda_free(o->grad_norm_sq);
    cuda_free(o->clip_coef);
    cuda_free(o->norm_scratch);
    cuda_free(o->bucket_norm_sq);
    memset(o, 0, sizeof(*o));
}

/* After the last micro-step's backward: one step at learning rate lr (see the top). */
static inline void optimizer_step(Optimizer *o, LlamaParams *p, const AdamWConfig *cfg, float lr, cudaStream_t s)
{
    Zero *z = &p->zero;
    int n_buckets = z->plan.n_buckets;
    o->step++;
    PROFILED(PROF_COMM, s, zero_grads_reduced(z, s));
    for (int b = 0; b < n_buckets; b++)
        global_norm_squared(o->bucket_norm_sq + b, o->norm_scratch, zero_update_grads(z, b), z->update_count[b], s);
    norm_squared_combine(o->grad_norm_sq, o->bucket_norm_sq, n_buckets, s);
    if (p->zero_stage >= 1)
        dist_all_reduce_sum(&p->dist->control, o->grad_norm_sq, 1, 4, s);
    clip_coefficient(o->clip_coef, o->grad_norm_sq, (float)cfg->grad_clip, s);
    AdamWScalars scalars = adamw_scalars(cfg, lr, o->step);
    if (p->host_master) {
        PROFILED(PROF_OPTIMIZER, s,
                 host_adamw_step(&o->host, z, p->host_master, &o->decay_runs, o->clip_coef, scalars, s));
    } else {
        for (int b = 0; b < n_buckets; b++) {
            int64_t at = z->state_at[b];
            adamw_update_change(zero_update_weights(z, b), p->master_lo + at, zero_update_grads(z, b), o->m + at,
                                o->v + at, z->update_at[b], z->update_count[b], &o->decay_runs, scalars, o->clip_coef,
                                zero_change_codes(z, b), s);
        }
    }
    PROFILED(PROF_COMM, s, zero_params_changed(z, s));
}

#endif /* LLMC_LLAMA_OPTIMIZER_H */
