/*
 * llama_checkpoint.h: checkpoints of the GPU model (llama_model.h), in the
 * directory format of llmc/formats/checkpoint.h. Every rank calls these together,
 * between steps: rank 0 joins the fp32 master weights (bf16 weights plus
 * residuals, gathered from the ranks' shares) and writes model.safetensors and
 * config.json; each rank that keeps optimizer state writes the AdamW moments
 * of the ranges it updates (one range per bucket; one file for all with ZeRO
 * stage 0, one per rank otherwise); rank 0 commits once all are written.
 * Loading re-shards: a checkpoint of any world size and stage loads into any
 * other.
 *
 * Checksums (checkpoint.h's manifest in COMPLETE): rank 0 hashes the weights as
 * it writes them; each rank that writes a train_state file hashes it as it
 * writes and leaves its line in train_state.<rank>.bin.xxh64 beside it, in the
 * staging directory that all ranks share; rank 0's commit, after the barrier
 * that follows every write, gathers those lines into the manifest (so no rank's
 * file is read again). On a resume each rank checks what it reads whole (the
 * weights, config.json and, with the world and sharding of the save, its own
 * train_state file) and reads to hash the files that no rank read whole of
 * those that fall to it; the ranks then agree, so that all stop when one finds
 * a file that changed.
 *
 * Memory: on rank 0 the master weights on the host (4 bytes per parameter)
 * plus one bucket's bf16 and residual halves while they are joined or split; on every
 * rank its moments (8 bytes per updated parameter). Offloaded (--offload
 * optimizer), the master weights and moments are read from and written to the
 * host's copies.
 */
#ifndef LLMC_LLAMA_CHECKPOINT_H
#define LLMC_LLAMA_CHECKPOINT_H

#include <limits.h>

#include "llmc/formats/checkpoint.h"
#include "llmc/model/llama_model.h"

/* On an error: removes the staging directory (if any, so that a failed save
 * leaves nothing behind), then ends naming the rank. */
static inline void llama_fail_if_error(int rc, int rank, const char *what, const char *err, const char *staging)
{
    if (rc == 0)
        return;
    if (staging && path_exists(staging))
        remove_flat_dir(staging);
    FAIL("rank %d: %s: %s", rank, what, err);
}

/* The model elements whose optimizer state this rank keeps: one range per bucket,
 * in the order of its state buffers (the caller frees); *count: their total. */
static inline CkptRange *llama_state_ranges(const Llama *m, int64_t *count)
{
    const LlamaParams *p = &m->params;
    int n_buckets = p->zero.plan.n_buckets;
    CkptRange *ranges = (CkptRange *)malloc_check(sizeof(CkptRange) * n_buckets, "checkpoint ranges");
    *count = 0;
    for (int b = 0; b < n_buckets; b++) {
        int64_t begin, end;
        zero_update_model_range(&p->zero.plan, p->zero_stage, p->dist->rank, b, &begin, &end);
        ranges[b].offset = begin;
        ranges[b].count = end - begin;
        *count += end - begin;
    }
    return ranges;
}

/* Moves the AdamW moments between the optimizer (zero.state_total each, padding
 * included, on the device or offloaded on the host) and host arrays holding only
 * the model elements of ranges (llama_state_ranges, total elements), back to
 * back: m, then v. */
static inline void llama_moments_transfer(Llama *m, const CkptRange *ranges, int64_t total, float *host,
                                          int to_optimizer)
{
    const Zero *z = &m->params.zero;
    for (int which = 0; which < 2; which++) {
        float *device = which == 0 ? m->optimizer.m : m->optimizer.v;
        float *offloaded = which == 0 ? m->optimizer.host.m : m->optimizer.host.v;
        float *at = host + which * total;
        for (int b = 0; b < z->plan.n_buckets; b++) {
            size_t bytes = (size_t)ranges[b].count * sizeof(float);
            if (offloaded && to_optimizer)
                memcpy(offloaded + z->state_at[b], at, bytes);
            else if (offloaded)
                memcpy(at, offloaded + z->state_at[b], bytes);
            else if (to_optimizer)
                CUDA_CHECK(cudaMemcpy(device + z->state_at[b], at, bytes, cudaMemcpyHostToDevice));
            else
                CUDA_CHECK(cudaMemcpy(at, device + z->state_at[b], bytes, cudaMemcpyDeviceToHost));
            at += ranges[b].count;
        }
    }
}

/* This rank's train_state file (if it keeps optimizer state) into staging,
 * and its checksum line beside it for rank 0's commit. */
static inline void llama_write_state(Llama *m, const char *staging, CheckpointState state)
{
    const Dist *d = m->params.dist;
    char err[2048];
    int64_t count;
    CkptRange *ranges = llama_state_ranges(m, &count);
    state.rank = m->params.zero_stage >= 1 ? d->rank : 0;
    state.world = m->params.zero_stage >= 1 ? d->world : 1;
    float *adam = (float *)malloc_check((size_t)2 * (count > 0 ? count : 1) * sizeof(float), "checkpoint moments");
    llama_moments_transfer(m, ranges, count, adam, 0);
    FileSum sum;
    llama_fail_if_error(checkpoint_write_state_try(staging, &state, m->layout.total, ranges,
                                                   m->params.zero.plan.n_buckets, adam, adam + count, &sum, err,
                                                   sizeof(err)),
                        d->rank, "saving a checkpoint", err, staging);
    llama_fail_if_error(checkpoint_write_sum_try(staging, &sum, err, sizeof(err)), d->rank, "saving a checkpoint", err,
                        staging);
    free(adam);
    free(ranges);
}

/* Writes <dir>/step_<08d>/ (see the top); keep: the newest complete
 * checkpoints to keep (0: all); extras: the ids and tokenizer of its model
 * directory. state: step, AdamW step, RNG and data position. */
static inline void llama_save_checkpoint(Llama *m, const char *dir, int keep, const HfExtras *extras,
                                         CheckpointState state, cudaStream_t s)
{
    const Dist *d = m->params.dist;
    char err[2048], staging[LLMC_PATH_MAX], saved[LLMC_PATH_MAX];
    FileSum weights_sum;
    float *master = params_download_master(&m->params, &m->layout, s);
    if (d->rank == 0)
        llama_fail_if_error(checkpoint_stage_try(dir, state.step, staging, sizeof(staging), err, sizeof(err)), d->rank,
                            "saving a checkpoint", err, NULL);
    dist_sum_host(d, 0.0, s); /* the staging directory exists for everyone */
    checkpoint_staging_path(staging, sizeof(staging), dir, state.step);
    if (d->rank == 0) {
        llama_fail_if_error(checkpoint_write_model_try(staging, state.step, &m->config, &m->layout, master, extras,
                                                       &weights_sum, err, sizeof(err)),
                            d->rank, "saving a checkpoint", err, staging);
        free(master);
    }
    if (m->params.zero_stage >= 1 || d->rank == 0)
        llama_write_state(m, staging, state);
    dist_sum_host(d, 0.0, s); /* every file is written */
    if (d->rank == 0) {
        llama_fail_if_error(checkpoint_commit_try(dir, state.step, state.run_id, keep, &weights_sum, 1, saved,
                                                  sizeof(saved), err, sizeof(err)),
                            d->rank, "saving a checkpoint", err, staging);
        printf("saved checkpoint '%s'\n", saved);
    }
    dist_sum_host(d, 0.0, s); /* nobody reads the directory before it is complete */
}

/* Every rank's verdict on the checkpoint's files (checkpoint_verify_try): all
 * stop when one found a file changed, the others naming how many did. */
static inline void llama_agree_verified(const Dist *d, int rc, const char *path, const char *err)
{
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    double failed = dist_sum_host(d, rc != 0 ? 1.0 : 0.0, s);
    CUDA_CHECK(cudaStreamDestroy(s));
    llama_fail_if_error(rc, d->rank, "resuming", err, NULL);
    if (failed > 0)
        FAIL("rank %d: resuming: %d rank(s) found files of '%s' unlike its manifest (their errors name them)", d->rank,
             (int)failed, path);
}

/* Loads checkpoint directory path into the model (weights, this rank's AdamW
 * moments and step), every file checked against the manifest (see the top);
 * state receives the step, RNG and data position. */
static inline void llama_load_checkpoint(Llama *m, const char *path, CheckpointState *state)
{
    char err[2048];
    int64_t P = m->layout.total;
    const Dist *d = m->params.dist;
    int rank = d->rank;
    float *master = (float *)malloc_check((size_t)P * sizeof(float), "checkpoint weights");
    int64_t weights_step = -1;
    CkptManifest man;
    llama_fail_if_error(
        checkpoint_load_model_try(path, &m->config, &m->layout, master, &weights_step, &man, err, sizeof(err)), rank,
        "resuming", err, NULL);
    if (rank == 0 && !man.has_sums)
        checkpoint_warn_unverified(path);
    params_upload_master(&m->params, master);
    free(master);
    int64_t count;
    CkptRange *ranges = llama_state_ranges(m, &count);
    float *adam = (float *)malloc_check((size_t)2 * (count > 0 ? count : 1) * sizeof(float), "checkpoint moments");
    CkptStateRead *reads = NULL;
    int n_reads = 0;
    llama_fail_if_error(checkpoint_load_moments_read_try(path, P, ranges, m->params.zero.plan.n_buckets, adam,
                                                         adam + count, state, &reads, &n_reads, err, sizeof(err)),
                        rank, "resuming", err, NULL);
    llama_fail_if_error(checkpoint_check_step_try(path, state->step, weights_step, err, sizeof(err)), rank, "resuming",
                        err, NULL);
    int rc = checkpoint_verify_try(path, &man, state, reads, n_reads, rank, d->world, err, sizeof(err));
    llama_agree_verified(d, rc, path, err);
    free(reads);
    checkpoint_manifest_free(&man);
    llama_moments_transfer(m, ranges, count, adam, 1);
    free(adam);
    free(ranges);
    if (state->adam_step > (uint64_t)INT_MAX || state->step > (uint64_t)INT_MAX)
        FAIL("rank %d: '%s': step %llu is out of range (corrupt?)", rank, path, (unsigned long long)state->step);
    m->optimizer.step = (int)state->adam_step;
}

#endif /* LLMC_LLAMA_CHECKPOINT_H */
