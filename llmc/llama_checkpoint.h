/*
 * llama_checkpoint.h: checkpoints of the GPU model (llama_model.h): every rank
 * saves and loads together; the fp32 master weights are joined on rank 0, each
 * rank writes and reads the AdamW moments of the ranges it updates
 * (llmc/checkpoint.h for the files).
 */
#ifndef LLMC_LLAMA_CHECKPOINT_H
#define LLMC_LLAMA_CHECKPOINT_H

#include "checkpoint.h"
#include "llama_model.h"

static void fail_if_error(int rc, int rank, const char *what, const char *err)
{
    if (rc != 0)
        FAIL("rank %d: %s: %s", rank, what, err);
}

/* The model elements whose optimizer state this rank keeps: one range per bucket,
 * in the order of its state buffers (the caller frees); *count: their total. */
static CkptRange *llama_state_ranges(const Llama *m, int64_t *count)
{
    const Zero *z = &m->zero;
    CkptRange *ranges = (CkptRange *)malloc_check(sizeof(CkptRange) * z->plan.n_buckets, "checkpoint ranges");
    *count = 0;
    for (int b = 0; b < z->plan.n_buckets; b++) {
        int64_t begin, end;
        zero_update_model_range(&z->plan, m->zero_stage, m->dist->rank, b, &begin, &end);
        ranges[b].offset = begin;
        ranges[b].count = end - begin;
        *count += end - begin;
    }
    return ranges;
}

/* Moves the AdamW moments between the state buffers (device, zero.state_total each,
 * padding included) and host arrays holding only the model elements of ranges
 * (llama_state_ranges, total elements), back to back: m, then v. */
static void llama_moments_transfer(Llama *m, const CkptRange *ranges, int64_t total, float *host, int to_device)
{
    const Zero *z = &m->zero;
    for (int which = 0; which < 2; which++) {
        float *device = which == 0 ? m->adam_m : m->adam_v;
        float *at = host + which * total;
        for (int b = 0; b < z->plan.n_buckets; b++) {
            size_t bytes = (size_t)ranges[b].count * sizeof(float);
            if (to_device)
                CUDA_CHECK(cudaMemcpy(device + z->state_at[b], at, bytes, cudaMemcpyHostToDevice));
            else
                CUDA_CHECK(cudaMemcpy(at, device + z->state_at[b], bytes, cudaMemcpyDeviceToHost));
            at += ranges[b].count;
        }
    }
}

/* Writes <dir>/step_<08d>/: rank 0 the fp32 master weights (safetensors) and the
 * config, each rank that keeps optimizer state its train_state file (one file for
 * all with ZeRO 0, one per rank otherwise, holding one range per bucket); rank 0
 * commits once all are written. state: step, AdamW step, RNG and data position. */
static void llama_save_checkpoint(Llama *m, const char *dir, int keep, CheckpointState state, cudaStream_t s)
{
    const Dist *d = m->dist;
    int64_t P = m->layout.total;
    char err[2048], staging[LLMC_PATH_MAX], saved[LLMC_PATH_MAX];
    float *master = llama_download_master(m, s);
    if (d->rank == 0)
        fail_if_error(checkpoint_stage_try(dir, state.step, staging, sizeof(staging), err, sizeof(err)), d->rank,
                      "saving a checkpoint", err);
    dist_sum_host(d, 0.0, s); /* the staging directory exists for everyone */
    checkpoint_staging_path(staging, sizeof(staging), dir, state.step);
    if (d->rank == 0) {
        fail_if_error(checkpoint_write_model_try(staging, &m->config, &m->layout, master, err, sizeof(err)), d->rank,
                      "saving a checkpoint", err);
        free(master);
    }
    if (m->zero_stage >= 1 || d->rank == 0) {
        int64_t count;
        CkptRange *ranges = llama_state_ranges(m, &count);
        state.rank = m->zero_stage >= 1 ? d->rank : 0;
        state.world = m->zero_stage >= 1 ? d->world : 1;
        float *adam = (float *)malloc_check((size_t)2 * (count > 0 ? count : 1) * sizeof(float), "checkpoint moments");
        llama_moments_transfer(m, ranges, count, adam, 0);
        fail_if_error(checkpoint_write_state_try(staging, &state, P, ranges, m->zero.plan.n_buckets, adam, adam + count,
                                                 err, sizeof(err)),
                      d->rank, "saving a checkpoint", err);
        free(adam);
        free(ranges);
    }
    dist_sum_host(d, 0.0, s); /* every file is written */
    if (d->rank == 0) {
        fail_if_error(checkpoint_commit_try(dir, state.step, keep, saved, sizeof(saved), err, sizeof(err)), d->rank,
                      "saving a checkpoint", err);
        printf("saved checkpoint '%s'\n", saved);
    }
    dist_sum_host(d, 0.0, s); /* nobody reads the directory before it is complete */
}

/* Loads checkpoint directory path into the model (weights, this rank's AdamW
 * moments and step); state receives the step, RNG and data position. Works for a
 * checkpoint of any world size and ZeRO stage: the moments are re-sharded. */
static void llama_load_checkpoint(Llama *m, const char *path, CheckpointState *state)
{
    char err[2048];
    int64_t P = m->layout.total;
    int rank = m->dist->rank;
    float *master = (float *)malloc_check((size_t)P * sizeof(float), "checkpoint weights");
    fail_if_error(checkpoint_load_model_try(path, &m->config, &m->layout, master, err, sizeof(err)), rank, "resuming",
                  err);
    llama_upload_params(m, master);
    free(master);
    int64_t count;
    CkptRange *ranges = llama_state_ranges(m, &count);
    float *adam = (float *)malloc_check((size_t)2 * (count > 0 ? count : 1) * sizeof(float), "checkpoint moments");
    fail_if_error(checkpoint_load_moments_try(path, P, ranges, m->zero.plan.n_buckets, adam, adam + count, state, err,
                                              sizeof(err)),
                  rank, "resuming", err);
    llama_moments_transfer(m, ranges, count, adam, 1);
    free(adam);
    free(ranges);
    if (state->adam_step > (uint64_t)INT_MAX || state->step > (uint64_t)INT_MAX)
        FAIL("rank %d: '%s': step %llu is out of range (corrupt?)", rank, path, (unsigned long long)state->step);
    m->adam_step = (int)state->adam_step;
}

static int count_targets(const int *targets, int64_t n)
{
    int count = 0;
    for (int64_t i = 0; i < n; i++)
        count += targets[i] != IGNORE_INDEX;
    return count;
}

#endif /* LLMC_LLAMA_CHECKPOINT_H */
