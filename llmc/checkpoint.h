/*
 * checkpoint.h: save and resume training: checkpoint directories, written
 * atomically, found and pruned.
 *
 * A checkpoint is a directory <dir>/step_<08d>/ (step = optimizer steps done):
 *   model.safetensors  the fp32 weights, HF names (safetensors.h); loads with
 *                      LlamaForCausalLM.from_pretrained(<dir>/step_<08d>)
 *   config.json        HF LlamaConfig of the model (hf_config.h), and
 *   generation_config.json, tokenizer.model: the rest of an HF model
 *                      directory (hf_model.h), so --init-from takes a checkpoint
 *   train_state.bin    step, AdamW step and moments, data position, RNG, or
 *                      one train_state.<rank>.bin per rank (train_state.h)
 *   COMPLETE           marker: the checkpoint is whole.
 *
 * Atomicity: everything is written into <dir>/step_<08d>.tmp/ (the staging
 * directory, one name that every rank of a multi-process save can find), each file
 * fsync'ed, the directory renamed to step_<08d>/ (an existing one of that step
 * is moved aside first), then COMPLETE written under a temporary name, fsync'ed
 * and renamed into place, and the directory fsync'ed. A checkpoint without
 * COMPLETE (a write killed midway) is ignored by checkpoint_find_latest; the
 * next save removes it and every leftover *.tmp* directory (never a complete
 * checkpoint), then keeps only the newest K complete checkpoints (K = 0: all)
 * of the run that saves (its run id, train_state.h): another run's are left.
 *
 * Loading validates everything against the model built from the run's flags:
 * config.json's shape fields, the weights (safetensors.h) and the optimizer
 * state (train_state.h).
 *
 * The *_try functions return 0, or -1 with a message naming the file in err;
 * the plain ones print it and exit(1). Plain C (POSIX); compiles as C++ too.
 */
#ifndef LLMC_CHECKPOINT_H
#define LLMC_CHECKPOINT_H

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "fileutil.h"
#include "hf_config.h"
#include "hf_model.h"
#include "llama_config.h"
#include "safetensors.h"
#include "train_state.h"
#include "utils.h"

/* Whether a run saves after completing steps_done of total_steps: every save_every
 * steps (0: never) and at the end. */
static inline int checkpoint_due(int steps_done, int save_every, int total_steps)
{
    return (save_every > 0 && steps_done % save_every == 0) || steps_done == total_steps;
}

/* step if name is exactly "step_" followed by digits, else -1 */
static inline int64_t ckpt_parse_step_name(const char *name)
{
    if (strncmp(name, "step_", 5) != 0 || name[5] == '\0')
        return -1;
    int64_t step = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || step > INT64_MAX / 10 - 10)
            return -1;
        step = step * 10 + (*p - '0');
    }
    return step;
}

static inline int ckpt_is_complete(const char *dir, const char *name)
{
    char buf[LLMC_PATH_MAX];
    path_format(buf, sizeof(buf), "%s/%s/COMPLETE", dir, name);
    return path_exists(buf);
}

/* Removes leftover *.tmp* directories and step dirs without COMPLETE, then all
 * but the newest keep complete checkpoints of run run_id (keep <= 0: all). A
 * checkpoint whose state names another run is neither counted nor removed; one
 * without a run id (an older build's) counts as this run's. */
static inline void ckpt_cleanup(const char *dir, int keep, uint64_t run_id)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    int64_t *steps = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    char buf[LLMC_PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "step_", 5) != 0)
            continue;
        path_format(buf, sizeof(buf), "%s/%s", dir, e->d_name);
        int64_t step = ckpt_parse_step_name(e->d_name);
        if (step < 0) {
            if (strstr(e->d_name, ".tmp") && !ckpt_is_complete(dir, e->d_name))
                remove_flat_dir(buf);
            continue;
        }
        if (!ckpt_is_complete(dir, e->d_name)) {
            remove_flat_dir(buf);
            continue;
        }
        uint64_t owner = checkpoint_run_id(buf);
        if (owner != 0 && run_id != 0 && owner != run_id)
            continue;
        steps = (int64_t *)grow_array(steps, n, &cap, sizeof(int64_t), dir);
        steps[n++] = step;
    }
    closedir(d);
    if (keep > 0 && n > keep) {
        /* sort descending, remove the tail */
        for (int i = 1; i < n; i++) {
            int64_t v = steps[i];
            int j = i;
            for (; j > 0 && steps[j - 1] < v; j--)
                steps[j] = steps[j - 1];
            steps[j] = v;
        }
        for (int i = keep; i < n; i++) {
            path_format(buf, sizeof(buf), "%s/step_%08lld/COMPLETE", dir, (long long)steps[i]);
            unlink(buf); /* incomplete first, so a crash midway leaves nothing that looks whole */
            path_format(buf, sizeof(buf), "%s/step_%08lld", dir, (long long)steps[i]);
            remove_flat_dir(buf);
        }
    }
    free(steps);
}

/* Where a save of `step` writes before it is committed: <dir>/step_<08d>.tmp. */
static inline void checkpoint_staging_path(char *out, size_t n, const char *dir, uint64_t step)
{
    path_format(out, n, "%s/step_%08llu.tmp", dir, (unsigned long long)step);
}

/* Step 1 of a save: creates <dir>/step_<08d>.tmp/ (removing a stale one), whose
 * path goes to staging. In a multi-process save one process does this, then all
 * write their files into it (checkpoint_write_*_try), then one commits. */
static inline int checkpoint_stage_try(const char *dir, uint64_t step, char *staging, size_t staging_len, char *err,
                                       size_t errlen)
{
    if (make_dirs(dir) != 0) {
        return set_error(err, errlen, "cannot create checkpoint directory '%s': %s", dir, strerror(errno));
    }
    checkpoint_staging_path(staging, staging_len, dir, step);
    if (path_exists(staging))
        remove_flat_dir(staging);
    if (mkdir(staging, 0755) != 0) {
        return set_error(err, errlen, "cannot create '%s': %s", staging, strerror(errno));
    }
    return 0;
}

/* The model's files into the staging directory: an HF model directory
 * (hf_model.h) with the fp32 weights, params (layout->total floats), so that
 * resuming is exact. */
static inline int checkpoint_write_model_try(const char *staging, uint64_t step, const LlamaConfig *config,
                                             const ParamLayout *layout, const float *params, const HfExtras *extras,
                                             char *err, size_t errlen)
{
    return hf_model_write_try(staging, config, layout, params, 0, (int64_t)step, extras, err, errlen);
}

/* This process's train_state file into the staging directory: the moments of
 * ranges[n_ranges] of the flat AdamW buffers (of total elements), which must lie
 * in [0, total), ascend and not overlap; adam_m and adam_v each hold the sum of
 * their counts, the ranges' moments concatenated in range order (NULL: zeros,
 * before the first AdamW step). Empty ranges are dropped and adjacent ones
 * merged. No range at all is a valid file (a rank that owns nothing). The file
 * is train_state.bin for world 1, else train_state.<rank>.bin. */
static inline int checkpoint_write_state_try(const char *staging, const CheckpointState *state, int64_t total,
                                             const CkptRange *ranges, int n_ranges, const float *adam_m,
                                             const float *adam_v, char *err, size_t errlen)
{
    char file[LLMC_PATH_MAX + 64];
    CkptRange *merged;
    int n = 0, rc;
    checkpoint_state_file(file, sizeof(file), staging, state->rank, state->world);
    if (state->world < 1 || state->rank < 0 || state->rank >= state->world) {
        return set_error(err, errlen, "'%s': rank %d of %d is impossible", file, state->rank, state->world);
    }
    if (total < 0 || n_ranges < 0 || (n_ranges > 0 && !ranges)) {
        return set_error(err, errlen, "'%s': %d ranges of %lld parameters is impossible", file, n_ranges,
                         (long long)total);
    }
    merged = (CkptRange *)malloc_check((size_t)(n_ranges > 0 ? n_ranges : 1) * sizeof(CkptRange), "checkpoint ranges");
    rc = ckpt_merge_ranges(file, ranges, n_ranges, total, merged, &n, err, errlen);
    if (rc == 0)
        rc = ckpt_write_state(file, state, total, merged, n, adam_m, adam_v, err, errlen);
    free(merged);
    return rc;
}

/* Last step of a save, once every file is in the staging directory: fsync, rename
 * to <dir>/step_<08d>/, mark COMPLETE, then keep the newest `keep` complete
 * checkpoints of run run_id (0: all). out_path (may be NULL) receives the
 * directory. */
static inline int checkpoint_commit_try(const char *dir, uint64_t step, uint64_t run_id, int keep, char *out_path,
                                        size_t out_len, char *err, size_t errlen)
{
    char staging[LLMC_PATH_MAX], final_dir[LLMC_PATH_MAX], file[LLMC_PATH_MAX + 64], aside[LLMC_PATH_MAX + 64];
    char marker_tmp[LLMC_PATH_MAX + 64];
    path_format(final_dir, sizeof(final_dir), "%s/step_%08llu", dir, (unsigned long long)step);
    checkpoint_staging_path(staging, sizeof(staging), dir, step);
    fsync_path(staging);
    if (path_exists(final_dir)) { /* the same step saved before: move it aside, the cleanup removes it */
        path_format(aside, sizeof(aside), "%s.tmp%ld.old", final_dir, (long)getpid());
        path_format(file, sizeof(file), "%s/COMPLETE", final_dir);
        unlink(file);
        if (rename(final_dir, aside) != 0) {
            return set_error(err, errlen, "cannot move the old '%s' aside: %s", final_dir, strerror(errno));
        }
    }
    if (rename(staging, final_dir) != 0) {
        return set_error(err, errlen, "cannot rename '%s' to '%s': %s", staging, final_dir, strerror(errno));
    }
    fsync_path(dir);
    path_format(marker_tmp, sizeof(marker_tmp), "%s/COMPLETE.tmp", final_dir);
    path_format(file, sizeof(file), "%s/COMPLETE", final_dir);
    char marker[64];
    int mn = snprintf(marker, sizeof(marker), "step %llu\n", (unsigned long long)step);
    if (write_file_synced(marker_tmp, marker, (size_t)mn, err, errlen) != 0)
        return -1;
    if (rename(marker_tmp, file) != 0) {
        return set_error(err, errlen, "cannot rename '%s' to '%s': %s", marker_tmp, file, strerror(errno));
    }
    fsync_path(final_dir);
    ckpt_cleanup(dir, keep, run_id);
    if (out_path)
        path_format(out_path, out_len, "%s", final_dir);
    return 0;
}

/* A whole single-process save: <dir>/step_<08d>/ written atomically (see the top
 * of this file). params and adam_m/adam_v hold layout->total floats; adam_m/adam_v
 * may be NULL before the first AdamW step (written as zeros). */
static inline int checkpoint_save_try(const char *dir, const LlamaConfig *config, const ParamLayout *layout,
                                      const float *params, const float *adam_m, const float *adam_v,
                                      const HfExtras *extras, const CheckpointState *state, int keep, char *out_path,
                                      size_t out_len, char *err, size_t errlen)
{
    char staging[LLMC_PATH_MAX];
    if (checkpoint_stage_try(dir, state->step, staging, sizeof(staging), err, errlen) != 0)
        return -1;
    CkptRange all = {0, layout->total};
    if (checkpoint_write_model_try(staging, state->step, config, layout, params, extras, err, errlen) != 0 ||
        checkpoint_write_state_try(staging, state, layout->total, &all, 1, adam_m, adam_v, err, errlen) != 0 ||
        checkpoint_commit_try(dir, state->step, state->run_id, keep, out_path, out_len, err, errlen) != 0) {
        if (path_exists(staging)) /* a failed save leaves no staging directory behind */
            remove_flat_dir(staging);
        return -1;
    }
    return 0;
}

static inline void checkpoint_save(const char *dir, const LlamaConfig *config, const ParamLayout *layout,
                                   const float *params, const float *adam_m, const float *adam_v,
                                   const HfExtras *extras, const CheckpointState *state, int keep, char *out_path,
                                   size_t out_len)
{
    char err[2048];
    if (checkpoint_save_try(dir, config, layout, params, adam_m, adam_v, extras, state, keep, out_path, out_len, err,
                            sizeof(err)) != 0) {
        FAIL("saving a checkpoint: %s", err);
    }
}

/* 0 and the newest complete checkpoint's directory in out_path, or -1 if dir
 * holds none (or does not exist). */
static inline int checkpoint_find_latest(const char *dir, char *out_path, size_t out_len)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int64_t best = -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t step = ckpt_parse_step_name(e->d_name);
        if (step > best && ckpt_is_complete(dir, e->d_name))
            best = step;
    }
    closedir(d);
    if (best < 0)
        return -1;
    path_format(out_path, out_len, "%s/step_%08lld", dir, (long long)best);
    return 0;
}

/* The files of one checkpoint belong together: the step of the directory's
 * name, of its COMPLETE marker, of the train state and (where it names one) of
 * the weights' metadata are the same. Checkpoints mixed by hand, or renamed, are
 * refused: a resume would take up another point of the run, and --keep could
 * then delete newer checkpoints. */
static inline int checkpoint_check_step_try(const char *ckpt_dir, uint64_t state_step, int64_t weights_step, char *err,
                                            size_t errlen)
{
    const char *slash = strrchr(ckpt_dir, '/');
    int64_t named = ckpt_parse_step_name(slash ? slash + 1 : ckpt_dir);
    char path[LLMC_PATH_MAX + 64], marker[64] = "";
    path_format(path, sizeof(path), "%s/COMPLETE", ckpt_dir);
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(marker, 1, sizeof(marker) - 1, f) : 0;
    if (f)
        fclose(f);
    marker[got] = '\0';
    unsigned long long complete = 0;
    int has_marker_step = sscanf(marker, "step %llu", &complete) == 1;
    if ((named >= 0 && (uint64_t)named != state_step) || (has_marker_step && complete != state_step) ||
        (weights_step >= 0 && (uint64_t)weights_step != state_step))
        return set_error(err, errlen,
                         "'%s' mixes steps: its name says %lld, COMPLETE %s, the train state %llu and the weights %lld "
                         "(a checkpoint put together from several, or renamed)\n  hint: resume from an untouched "
                         "checkpoint directory",
                         ckpt_dir, (long long)named, has_marker_step ? marker : "nothing",
                         (unsigned long long)state_step, (long long)weights_step);
    return 0;
}

/* Before any work, for --checkpoint-dir dir: a name that fits the paths built
 * from it, a directory (made if missing) where a file can be created, and
 * unless resume, no complete checkpoint of another run in it, whose
 * --keep pruning and --resume would otherwise mix with this run's. */
static inline int checkpoint_dir_check_try(const char *dir, int resume, char *err, size_t errlen)
{
    char probe[LLMC_PATH_MAX + 64], latest[LLMC_PATH_MAX];
    if (!dir[0])
        return set_error(err, errlen, "--checkpoint-dir is empty: name a directory");
    if (strlen(dir) + 40 > LLMC_PATH_MAX)
        return set_error(err, errlen, "--checkpoint-dir '%.60s...' is %zu characters; at most %d fit the paths in it",
                         dir, strlen(dir), LLMC_PATH_MAX - 40);
    if (make_dirs(dir) != 0)
        return set_error(err, errlen, "cannot create --checkpoint-dir '%s': %s", dir, strerror(errno));
    path_format(probe, sizeof(probe), "%s/.write_test.%ld", dir, (long)getpid());
    FILE *f = fopen(probe, "wb");
    if (!f)
        return set_error(err, errlen,
                         "cannot write into --checkpoint-dir '%s': %s\n  hint: check its permissions, "
                         "or choose another directory",
                         dir, strerror(errno));
    fclose(f);
    unlink(probe);
    if (!resume && checkpoint_find_latest(dir, latest, sizeof(latest)) == 0)
        return set_error(err, errlen,
                         "--checkpoint-dir '%s' holds the checkpoints of an earlier run (newest: '%s')\n"
                         "  hint: add --resume to continue that run, or choose another directory (nothing is "
                         "deleted)",
                         dir, latest);
    return 0;
}

/* The weights of a complete checkpoint directory into params (layout->total
 * floats), after checking its COMPLETE marker and that config.json is `config`. */
static inline int checkpoint_load_model_try(const char *ckpt_dir, const LlamaConfig *config, const ParamLayout *layout,
                                            float *params, int64_t *weights_step, char *err, size_t errlen)
{
    char path[LLMC_PATH_MAX + 64];
    path_format(path, sizeof(path), "%s/COMPLETE", ckpt_dir);
    if (!path_exists(path)) {
        return set_error(err, errlen, "'%s' has no COMPLETE marker: the checkpoint was not finished", ckpt_dir);
    }
    path_format(path, sizeof(path), "%s/config.json", ckpt_dir);
    if (hf_config_check_try(path, config, err, errlen) != 0)
        return -1;
    path_format(path, sizeof(path), "%s/model.safetensors", ckpt_dir);
    return safetensors_load_params_try(path, layout, params, weights_step, err, errlen);
}

/* Load a whole checkpoint directory (written by checkpoint_save) into a model
 * built with `config`: weights, AdamW moments and the state. A single-process
 * resume takes a single-process checkpoint: one of several ranks is refused. */
static inline int checkpoint_load_try(const char *ckpt_dir, const LlamaConfig *config, const ParamLayout *layout,
                                      float *params, float *adam_m, float *adam_v, CheckpointState *state, char *err,
                                      size_t errlen)
{
    int64_t weights_step = -1;
    if (checkpoint_load_model_try(ckpt_dir, config, layout, params, &weights_step, err, errlen) != 0)
        return -1;
    CkptRange all = {0, layout->total};
    if (checkpoint_load_moments_try(ckpt_dir, layout->total, &all, 1, adam_m, adam_v, state, err, errlen) != 0)
        return -1;
    if (checkpoint_check_step_try(ckpt_dir, state->step, weights_step, err, errlen) != 0)
        return -1;
    if (state->world != 1) {
        path_format(err, errlen,
                    "'%s' holds the AdamW state of %d ranks; this loader needs the state of one process "
                    "(resume it with train_llama)",
                    ckpt_dir, state->world);
        return -1;
    }
    return 0;
}

static inline void checkpoint_load(const char *ckpt_dir, const LlamaConfig *config, const ParamLayout *layout,
                                   float *params, float *adam_m, float *adam_v, CheckpointState *state)
{
    char err[2048];
    if (checkpoint_load_try(ckpt_dir, config, layout, params, adam_m, adam_v, state, err, sizeof(err)) != 0) {
        FAIL("resuming from a checkpoint: %s", err);
    }
}

#endif /* LLMC_CHECKPOINT_H */
