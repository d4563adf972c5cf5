/*
 * checkpoint.h: save and resume training: weights, AdamW state, data position.
 *
 * A checkpoint is a directory <dir>/step_<08d>/ (step = optimizer steps done):
 *   model.safetensors  the weights, HF safetensors: u64 little-endian header
 *                      length n, n bytes of JSON header (space padded to a
 *                      multiple of 8), then the data. The header maps each HF
 *                      name (ParamLayout) to {"dtype":"F32","shape":[...],
 *                      "data_offsets":[begin,end]} (bytes, relative to the
 *                      data start), plus "__metadata__":{"format":"pt"}.
 *                      fp32, row-major, in layout order; a tied model has no
 *                      lm_head.weight, as HF writes it. Loads with
 *                      LlamaForCausalLM.from_pretrained(<dir>/step_<08d>).
 *   config.json        HF LlamaConfig of the model.
 *   train_state.bin    what else training needs to continue bit for bit,
 *                      little-endian, CKPT_STATE_HEADER_BYTES of header:
 *                        0  char[8] magic "LLMCKPT\0"   8 u32 version (2)
 *                       12  u32 header bytes (128)      16 u64 step
 *                       24  u64 AdamW step count        32 u64 RNG state
 *                       40  i32 rank   44 i32 world     48 i64 total (layout.total)
 *                       56  i64 number of ranges n      64 i64 moments count
 *                       72  DataLoaderState: u64 epoch, shard, window, seed, layout
 *                      112  zeros to 128
 *                      then the range table, n x (i64 offset, i64 count):
 *                      ascending, not overlapping, adjacent ones merged; then
 *                      AdamW m[count] and v[count], fp32, each the ranges'
 *                      elements of the flat buffers concatenated in table
 *                      order (count = the sum of the ranges' counts).
 *                      One file with the range [0, total) (rank 0 of 1), or
 *                      with ZeRO-sharded optimizer state one file per rank,
 *                      train_state.<rank, 5 digits>.bin, holding whatever
 *                      list of ranges that rank owns (with per-bucket
 *                      sharding one slice of every bucket, interleaved with
 *                      the other ranks'); all files' ranges together tile
 *                      [0, total). A resume of any world size reads, for each
 *                      range it needs, the parts of whichever files hold it.
 *                      Version 1 (still read) had no table: one range, its
 *                      offset at 56 and its count at 64, the moments at 128.
 *   COMPLETE           marker: the checkpoint is whole.
 *
 * Atomicity: everything is written into <dir>/step_<08d>.tmp/ (the staging
 * directory, one name that every rank of a multi-process save can find), each file
 * fsync'ed, the directory renamed to step_<08d>/ (an existing one of that step
 * is moved aside first), then COMPLETE written under a temporary name, fsync'ed
 * and renamed into place, and the directory fsync'ed. A checkpoint without
 * COMPLETE (a write killed midway) is ignored by checkpoint_find_latest; the
 * next save removes it and every leftover *.tmp* directory (never a complete
 * checkpoint), then keeps only the newest K complete checkpoints (K = 0: all).
 *
 * Loading validates everything against the model built from the run's flags:
 * config.json's shape fields, every tensor's dtype/shape/offsets and the file
 * size of model.safetensors, train_state.bin's magic, version and sizes, its
 * range table, and that the ranges of all ranks' files tile [0, total).
 *
 * The *_try functions return 0, or -1 with a message naming the file in err;
 * the plain ones print it and exit(1). Plain C (POSIX); compiles as C++ too.
 */
#ifndef LLMC_CHECKPOINT_H
#define LLMC_CHECKPOINT_H

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "dataloader.h"
#include "llama_config.h"
#include "utils.h"

#define CKPT_STATE_MAGIC "LLMCKPT"
#define CKPT_STATE_VERSION 2 /* 1 (one range per file) is read too */
#define CKPT_STATE_HEADER_BYTES 128
#define CKPT_PATH_MAX 1024

/* Elements [offset, offset + count) of the flat AdamW buffers. */
typedef struct {
    int64_t offset, count;
} CkptRange;

typedef struct {
    uint64_t step;      /* optimizer steps completed */
    uint64_t adam_step; /* AdamW's step count (bias correction) */
    uint64_t rng_state;
    int32_t rank, world; /* which file of how many (the ranges travel beside the state) */
    DataLoaderState data;
} CheckpointState;

/* Whether a run saves after completing steps_done of total_steps: every save_every
 * steps (0: never) and at the end. */
static inline int checkpoint_due(int steps_done, int save_every, int total_steps)
{
    return (save_every > 0 && steps_done % save_every == 0) || steps_done == total_steps;
}

/* The state of a single-process run after `step` optimizer steps (rank 0 of 1);
 * a sharded optimizer sets rank and world per file. */
static inline CheckpointState checkpoint_state(uint64_t step, uint64_t adam_step, uint64_t rng_state)
{
    CheckpointState st;
    memset(&st, 0, sizeof(st));
    st.step = step;
    st.adam_step = adam_step;
    st.rng_state = rng_state;
    st.world = 1;
    return st;
}

#define CKPT_ERR(...)                                                                                                  \
    do {                                                                                                               \
        ckpt_path(err, errlen, __VA_ARGS__);                                                                           \
        goto fail;                                                                                                     \
    } while (0)

/* ------------------------------------------------------------------------- */
/* small helpers                                                              */

static inline void ckpt_put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static inline void ckpt_put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t ckpt_get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static inline uint64_t ckpt_get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* array, with room for one more element after its first n (capacity *cap, doubled when full). */
static inline void *ckpt_grow(void *array, int n, int *cap, size_t element_size, const char *for_path)
{
    if (n < *cap)
        return array;
    *cap = *cap ? 2 * *cap : 16;
    array = realloc(array, (size_t)*cap * element_size);
    if (!array)
        FAIL("out of host memory reading '%s'", for_path);
    return array;
}

/* snprintf for paths: -1 if it did not fit (vsnprintf, so that gcc does not
 * warn about the truncation that the return value reports). */
static inline int ckpt_path(char *out, size_t n, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    int r = vsnprintf(out, n, fmt, args);
    va_end(args);
    return r < 0 || (size_t)r >= n ? -1 : 0;
}

/* mkdir -p */
static inline int ckpt_mkdirs(const char *path)
{
    char buf[CKPT_PATH_MAX];
    ckpt_path(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

static inline int ckpt_fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* Remove a directory and the plain files in it (checkpoints hold nothing else). */
static inline int ckpt_remove_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return -1;
    struct dirent *e;
    char buf[CKPT_PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        ckpt_path(buf, sizeof(buf), "%s/%s", path, e->d_name);
        unlink(buf);
    }
    closedir(d);
    return rmdir(path);
}

static inline int ckpt_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
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
    char buf[CKPT_PATH_MAX];
    ckpt_path(buf, sizeof(buf), "%s/%s/COMPLETE", dir, name);
    return ckpt_exists(buf);
}

/* Write n bytes to a new file, fsync it, close it. */
static inline int ckpt_write_file(const char *path, const void *data, size_t n, char *err, size_t errlen)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        ckpt_path(err, errlen, "cannot create '%s': %s", path, strerror(errno));
        return -1;
    }
    int ok = fwrite(data, 1, n, f) == n && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        ckpt_path(err, errlen, "cannot write '%s': %s\n  hint: is the disk full?", path, strerror(saved));
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* writing                                                                    */

static inline int ckpt_write_safetensors(const char *path, const ParamLayout *layout, const float *params, char *err,
                                         size_t errlen)
{
    size_t cap = 256 + (size_t)layout->n_tensors * 256, len = 0;
    char *hdr = (char *)malloc_check(cap, "safetensors header");
    FILE *f = NULL;
    int saved, ok;
    len += (size_t)snprintf(hdr + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < layout->n_tensors; i++) {
        const ParamTensor *t = &layout->tensors[i];
        long long begin = (long long)t->offset * 4, end = (long long)(t->offset + t->numel) * 4;
        if (t->cols == 1) {
            len += (size_t)snprintf(hdr + len, cap - len,
                                    ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld],"
                                    "\"data_offsets\":[%lld,%lld]}",
                                    t->name, (long long)t->rows, begin, end);
        } else {
            len += (size_t)snprintf(hdr + len, cap - len,
                                    ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],"
                                    "\"data_offsets\":[%lld,%lld]}",
                                    t->name, (long long)t->rows, (long long)t->cols, begin, end);
        }
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8 != 0)
        hdr[len++] = ' ';
    unsigned char n8[8];
    ckpt_put_u64(n8, (uint64_t)len);
    f = fopen(path, "wb");
    if (!f)
        CKPT_ERR("cannot create '%s': %s", path, strerror(errno));
    ok = fwrite(n8, 1, 8, f) == 8 && fwrite(hdr, 1, len, f) == len &&
         fwrite(params, sizeof(float), (size_t)layout->total, f) == (size_t)layout->total && fflush(f) == 0 &&
         fsync(fileno(f)) == 0;
    saved = errno;
    ok = (fclose(f) == 0) && ok;
    f = NULL;
    if (!ok)
        CKPT_ERR("cannot write '%s': %s\n  hint: is the disk full?", path, strerror(saved));
    free(hdr);
    return 0;
fail:
    if (f)
        fclose(f);
    free(hdr);
    return -1;
}

static inline int ckpt_write_config(const char *path, const LlamaConfig *c, char *err, size_t errlen)
{
    char buf[4096], rope[512];
    if (c->rope_scaling_llama3) {
        snprintf(rope, sizeof(rope),
                 "{\"rope_type\": \"llama3\", \"factor\": %g, \"low_freq_factor\": %g, "
                 "\"high_freq_factor\": %g, \"original_max_position_embeddings\": %d",
                 (double)c->rope_factor, (double)c->rope_low_freq_factor, (double)c->rope_high_freq_factor,
                 c->rope_original_max_pos);
    } else {
        snprintf(rope, sizeof(rope), "{\"rope_type\": \"default\"");
    }
    int n = snprintf(buf, sizeof(buf),
                     "{\n"
                     "  \"architectures\": [\"LlamaForCausalLM\"],\n"
                     "  \"model_type\": \"llama\",\n"
                     "  \"vocab_size\": %d,\n"
                     "  \"hidden_size\": %d,\n"
                     "  \"intermediate_size\": %d,\n"
                     "  \"num_hidden_layers\": %d,\n"
                     "  \"num_attention_heads\": %d,\n"
                     "  \"num_key_value_heads\": %d,\n"
                     "  \"head_dim\": %d,\n"
                     "  \"max_position_embeddings\": %d,\n"
                     "  \"rms_norm_eps\": %g,\n"
                     "  \"rope_theta\": %.1f,\n"
                     "  \"rope_scaling\": %s%s,\n"
                     "  \"rope_parameters\": %s, \"rope_theta\": %.1f},\n"
                     "  \"tie_word_embeddings\": %s,\n"
                     "  \"hidden_act\": \"silu\",\n"
                     "  \"attention_bias\": false,\n"
                     "  \"attention_dropout\": 0.0,\n"
                     "  \"mlp_bias\": false,\n"
                     "  \"initializer_range\": %g,\n"
                     "  \"torch_dtype\": \"float32\",\n"
                     "  \"bos_token_id\": 128000,\n"
                     "  \"eos_token_id\": 128001\n"
                     "}\n",
                     c->vocab_size, c->d_model, c->ffn_dim, c->n_layer, c->n_head, c->n_kv_head, c->head_dim,
                     c->max_seq_len, (double)c->norm_eps, (double)c->rope_theta, c->rope_scaling_llama3 ? rope : "null",
                     c->rope_scaling_llama3 ? "}" : "", rope, (double)c->rope_theta,
                     c->tie_embeddings ? "true" : "false", (double)c->init_std);
    if (n < 0 || (size_t)n >= sizeof(buf)) {
        ckpt_path(err, errlen, "config.json for '%s' does not fit its buffer", path);
        return -1;
    }
    return ckpt_write_file(path, buf, (size_t)n, err, errlen);
}

/* The ranges a file is written with: checks that ranges[n_ranges] lie in
 * [0, total] with counts >= 0, ascending without overlap, and writes them to out
 * (room for n_ranges) with the empty ones dropped and adjacent ones
 * (a.offset + a.count == b.offset) merged, *n_out of them. Merging moves no
 * moment: they are concatenated in range order either way. */
static inline int ckpt_merge_ranges(const char *path, const CkptRange *ranges, int n_ranges, int64_t total,
                                    CkptRange *out, int *n_out, char *err, size_t errlen)
{
    int n = 0;
    int64_t end = 0; /* of the last non-empty range */
    for (int i = 0; i < n_ranges; i++) {
        CkptRange r = ranges[i];
        if (r.offset < 0 || r.count < 0 || r.offset > total || r.count > total - r.offset) {
            ckpt_path(err, errlen, "'%s': range %d, [%lld, +%lld), is outside the %lld parameters", path, i,
                      (long long)r.offset, (long long)r.count, (long long)total);
            return -1;
        }
        if (r.count == 0)
            continue;
        if (r.offset < end) {
            ckpt_path(err, errlen,
                      "'%s': range %d, [%lld, +%lld), starts before the end %lld of the range before it "
                      "(the ranges must ascend without overlap)",
                      path, i, (long long)r.offset, (long long)r.count, (long long)end);
            return -1;
        }
        if (n > 0 && out[n - 1].offset + out[n - 1].count == r.offset)
            out[n - 1].count += r.count;
        else
            out[n++] = r;
        end = r.offset + r.count;
    }
    *n_out = n;
    return 0;
}

/* A train_state file of format 2: ranges[n_ranges] as ckpt_merge_ranges leaves
 * them; adam_m, adam_v: their moments concatenated (NULL: zeros). */
static inline int ckpt_write_state(const char *path, const CheckpointState *st, int64_t total, const CkptRange *ranges,
                                   int n_ranges, const float *adam_m, const float *adam_v, char *err, size_t errlen)
{
    unsigned char h[CKPT_STATE_HEADER_BYTES], entry[16];
    FILE *f = NULL;
    int ok, saved;
    int64_t count = 0;
    for (int i = 0; i < n_ranges; i++)
        count += ranges[i].count;
    memset(h, 0, sizeof(h));
    memcpy(h, CKPT_STATE_MAGIC, 8);
    ckpt_put_u32(h + 8, CKPT_STATE_VERSION);
    ckpt_put_u32(h + 12, CKPT_STATE_HEADER_BYTES);
    ckpt_put_u64(h + 16, st->step);
    ckpt_put_u64(h + 24, st->adam_step);
    ckpt_put_u64(h + 32, st->rng_state);
    ckpt_put_u32(h + 40, (uint32_t)st->rank);
    ckpt_put_u32(h + 44, (uint32_t)st->world);
    ckpt_put_u64(h + 48, (uint64_t)total);
    ckpt_put_u64(h + 56, (uint64_t)n_ranges);
    ckpt_put_u64(h + 64, (uint64_t)count);
    ckpt_put_u64(h + 72, st->data.epoch);
    ckpt_put_u64(h + 80, st->data.shard);
    ckpt_put_u64(h + 88, st->data.window);
    ckpt_put_u64(h + 96, st->data.seed);
    ckpt_put_u64(h + 104, st->data.layout);
    f = fopen(path, "wb");
    if (!f)
        CKPT_ERR("cannot create '%s': %s", path, strerror(errno));
    ok = fwrite(h, 1, sizeof(h), f) == sizeof(h);
    for (int i = 0; i < n_ranges && ok; i++) {
        ckpt_put_u64(entry, (uint64_t)ranges[i].offset);
        ckpt_put_u64(entry + 8, (uint64_t)ranges[i].count);
        ok = fwrite(entry, 1, sizeof(entry), f) == sizeof(entry);
    }
    for (int which = 0; which < 2 && ok; which++) {
        const float *src = which == 0 ? adam_m : adam_v;
        if (src) {
            ok = fwrite(src, sizeof(float), (size_t)count, f) == (size_t)count;
        } else { /* no AdamW step yet: zero moments */
            static const float zeros[1024] = {0};
            for (int64_t i = 0; i < count && ok; i += 1024) {
                size_t n = (size_t)(count - i < 1024 ? count - i : 1024);
                ok = fwrite(zeros, sizeof(float), n, f) == n;
            }
        }
    }
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    saved = errno;
    ok = (fclose(f) == 0) && ok;
    f = NULL;
    if (!ok)
        CKPT_ERR("cannot write '%s': %s\n  hint: is the disk full?", path, strerror(saved));
    return 0;
fail:
    if (f)
        fclose(f);
    return -1;
}

/* Removes leftover *.tmp* directories and step dirs without COMPLETE, then all
 * but the newest keep complete checkpoints (keep <= 0: all). */
static inline void ckpt_cleanup(const char *dir, int keep)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    int64_t *steps = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    char buf[CKPT_PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "step_", 5) != 0)
            continue;
        ckpt_path(buf, sizeof(buf), "%s/%s", dir, e->d_name);
        int64_t step = ckpt_parse_step_name(e->d_name);
        if (step < 0) {
            if (strstr(e->d_name, ".tmp") && !ckpt_is_complete(dir, e->d_name))
                ckpt_remove_dir(buf);
            continue;
        }
        if (!ckpt_is_complete(dir, e->d_name)) {
            ckpt_remove_dir(buf);
            continue;
        }
        steps = (int64_t *)ckpt_grow(steps, n, &cap, sizeof(int64_t), dir);
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
            ckpt_path(buf, sizeof(buf), "%s/step_%08lld/COMPLETE", dir, (long long)steps[i]);
            unlink(buf); /* incomplete first, so a crash midway leaves nothing that looks whole */
            ckpt_path(buf, sizeof(buf), "%s/step_%08lld", dir, (long long)steps[i]);
            ckpt_remove_dir(buf);
        }
    }
    free(steps);
}

/* The train_state file of `rank` in checkpoint (or staging) directory ckpt_dir. */
static inline void checkpoint_state_file(char *out, size_t n, const char *ckpt_dir, int rank, int world)
{
    if (world <= 1)
        ckpt_path(out, n, "%s/train_state.bin", ckpt_dir);
    else
        ckpt_path(out, n, "%s/train_state.%05d.bin", ckpt_dir, rank);
}

/* Where a save of `step` writes before it is committed: <dir>/step_<08d>.tmp. */
static inline void checkpoint_staging_path(char *out, size_t n, const char *dir, uint64_t step)
{
    ckpt_path(out, n, "%s/step_%08llu.tmp", dir, (unsigned long long)step);
}

/* Step 1 of a save: creates <dir>/step_<08d>.tmp/ (removing a stale one), whose
 * path goes to staging. In a multi-process save one process does this, then all
 * write their files into it (checkpoint_write_*_try), then one commits. */
static inline int checkpoint_stage_try(const char *dir, uint64_t step, char *staging, size_t staging_len, char *err,
                                       size_t errlen)
{
    if (ckpt_mkdirs(dir) != 0) {
        ckpt_path(err, errlen, "cannot create checkpoint directory '%s': %s", dir, strerror(errno));
        return -1;
    }
    checkpoint_staging_path(staging, staging_len, dir, step);
    if (ckpt_exists(staging))
        ckpt_remove_dir(staging);
    if (mkdir(staging, 0755) != 0) {
        ckpt_path(err, errlen, "cannot create '%s': %s", staging, strerror(errno));
        return -1;
    }
    return 0;
}

/* model.safetensors and config.json into the staging directory; params holds
 * layout->total floats. */
static inline int checkpoint_write_model_try(const char *staging, const LlamaConfig *config, const ParamLayout *layout,
                                             const float *params, char *err, size_t errlen)
{
    char file[CKPT_PATH_MAX + 64];
    ckpt_path(file, sizeof(file), "%s/model.safetensors", staging);
    if (ckpt_write_safetensors(file, layout, params, err, errlen) != 0)
        return -1;
    ckpt_path(file, sizeof(file), "%s/config.json", staging);
    return ckpt_write_config(file, config, err, errlen);
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
    char file[CKPT_PATH_MAX + 64];
    CkptRange *merged;
    int n = 0, rc;
    checkpoint_state_file(file, sizeof(file), staging, state->rank, state->world);
    if (state->world < 1 || state->rank < 0 || state->rank >= state->world) {
        ckpt_path(err, errlen, "'%s': rank %d of %d is impossible", file, state->rank, state->world);
        return -1;
    }
    if (total < 0 || n_ranges < 0 || (n_ranges > 0 && !ranges)) {
        ckpt_path(err, errlen, "'%s': %d ranges of %lld parameters is impossible", file, n_ranges, (long long)total);
        return -1;
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
 * checkpoints (0: all). out_path (may be NULL) receives the directory. */
static inline int checkpoint_commit_try(const char *dir, uint64_t step, int keep, char *out_path, size_t out_len,
                                        char *err, size_t errlen)
{
    char staging[CKPT_PATH_MAX], final_dir[CKPT_PATH_MAX], file[CKPT_PATH_MAX + 64], aside[CKPT_PATH_MAX + 64];
    char marker_tmp[CKPT_PATH_MAX + 64];
    ckpt_path(final_dir, sizeof(final_dir), "%s/step_%08llu", dir, (unsigned long long)step);
    checkpoint_staging_path(staging, sizeof(staging), dir, step);
    ckpt_fsync_path(staging);
    if (ckpt_exists(final_dir)) { /* the same step saved before: move it aside, the cleanup removes it */
        ckpt_path(aside, sizeof(aside), "%s.tmp%ld.old", final_dir, (long)getpid());
        ckpt_path(file, sizeof(file), "%s/COMPLETE", final_dir);
        unlink(file);
        if (rename(final_dir, aside) != 0) {
            ckpt_path(err, errlen, "cannot move the old '%s' aside: %s", final_dir, strerror(errno));
            return -1;
        }
    }
    if (rename(staging, final_dir) != 0) {
        ckpt_path(err, errlen, "cannot rename '%s' to '%s': %s", staging, final_dir, strerror(errno));
        return -1;
    }
    ckpt_fsync_path(dir);
    ckpt_path(marker_tmp, sizeof(marker_tmp), "%s/COMPLETE.tmp", final_dir);
    ckpt_path(file, sizeof(file), "%s/COMPLETE", final_dir);
    char marker[64];
    int mn = snprintf(marker, sizeof(marker), "step %llu\n", (unsigned long long)step);
    if (ckpt_write_file(marker_tmp, marker, (size_t)mn, err, errlen) != 0)
        return -1;
    if (rename(marker_tmp, file) != 0) {
        ckpt_path(err, errlen, "cannot rename '%s' to '%s': %s", marker_tmp, file, strerror(errno));
        return -1;
    }
    ckpt_fsync_path(final_dir);
    ckpt_cleanup(dir, keep);
    if (out_path)
        ckpt_path(out_path, out_len, "%s", final_dir);
    return 0;
}

/* A whole single-process save: <dir>/step_<08d>/ written atomically (see the top
 * of this file). params and adam_m/adam_v hold layout->total floats; adam_m/adam_v
 * may be NULL before the first AdamW step (written as zeros). */
static inline int checkpoint_save_try(const char *dir, const LlamaConfig *config, const ParamLayout *layout,
                                      const float *params, const float *adam_m, const float *adam_v,
                                      const CheckpointState *state, int keep, char *out_path, size_t out_len, char *err,
                                      size_t errlen)
{
    char staging[CKPT_PATH_MAX];
    if (checkpoint_stage_try(dir, state->step, staging, sizeof(staging), err, errlen) != 0)
        return -1;
    if (checkpoint_write_model_try(staging, config, layout, params, err, errlen) != 0)
        return -1;
    CkptRange all = {0, layout->total};
    if (checkpoint_write_state_try(staging, state, layout->total, &all, 1, adam_m, adam_v, err, errlen) != 0)
        return -1;
    return checkpoint_commit_try(dir, state->step, keep, out_path, out_len, err, errlen);
}

static inline void checkpoint_save(const char *dir, const LlamaConfig *config, const ParamLayout *layout,
                                   const float *params, const float *adam_m, const float *adam_v,
                                   const CheckpointState *state, int keep, char *out_path, size_t out_len)
{
    char err[2048];
    if (checkpoint_save_try(dir, config, layout, params, adam_m, adam_v, state, keep, out_path, out_len, err,
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
    ckpt_path(out_path, out_len, "%s/step_%08lld", dir, (long long)best);
    return 0;
}

/* ------------------------------------------------------------------------- */
/* a JSON reader just big enough for safetensors headers and config.json      */

typedef struct {
    const char *s;
    size_t pos, len;
} CkptJson;

static inline void ckj_ws(CkptJson *j)
{
    while (j->pos < j->len &&
           (j->s[j->pos] == ' ' || j->s[j->pos] == '\t' || j->s[j->pos] == '\n' || j->s[j->pos] == '\r'))
        j->pos++;
}

static inline int ckj_expect(CkptJson *j, char ch)
{
    ckj_ws(j);
    if (j->pos >= j->len || j->s[j->pos] != ch)
        return -1;
    j->pos++;
    return 0;
}

/* A string into out (escapes other than \uXXXX decoded; \u kept verbatim). */
static inline int ckj_string(CkptJson *j, char *out, size_t outlen)
{
    if (ckj_expect(j, '"'))
        return -1;
    size_t n = 0;
    while (j->pos < j->len && j->s[j->pos] != '"') {
        char ch = j->s[j->pos++];
        if (ch == '\\') {
            if (j->pos >= j->len)
                return -1;
            ch = j->s[j->pos++];
            if (ch == 'n')
                ch = '\n';
            else if (ch == 't')
                ch = '\t';
        }
        if (out) {
            if (n + 1 >= outlen)
                return -1;
            out[n++] = ch;
        }
    }
    if (j->pos >= j->len)
        return -1;
    j->pos++;
    if (out)
        out[n] = '\0';
    return 0;
}

static inline int ckj_number(CkptJson *j, double *out)
{
    ckj_ws(j);
    char buf[64];
    size_t n = 0;
    while (j->pos < j->len && n + 1 < sizeof(buf) && strchr("+-0123456789.eE", j->s[j->pos]))
        buf[n++] = j->s[j->pos++];
    buf[n] = '\0';
    if (n == 0)
        return -1;
    char *end;
    *out = strtod(buf, &end);
    return *end == '\0' ? 0 : -1;
}

static inline int ckj_skip(CkptJson *j, int depth)
{
    if (depth > 32)
        return -1;
    ckj_ws(j);
    if (j->pos >= j->len)
        return -1;
    char ch = j->s[j->pos];
    if (ch == '"')
        return ckj_string(j, NULL, 0);
    if (ch == '{' || ch == '[') {
        char close = ch == '{' ? '}' : ']';
        j->pos++;
        ckj_ws(j);
        if (j->pos < j->len && j->s[j->pos] == close) {
            j->pos++;
            return 0;
        }
        for (;;) {
            if (ch == '{') {
                if (ckj_string(j, NULL, 0) || ckj_expect(j, ':'))
                    return -1;
            }
            if (ckj_skip(j, depth + 1))
                return -1;
            ckj_ws(j);
            if (j->pos < j->len && j->s[j->pos] == ',') {
                j->pos++;
                continue;
            }
            return ckj_expect(j, close);
        }
    }
    const char *words[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if (j->len - j->pos >= n && memcmp(j->s + j->pos, words[i], n) == 0) {
            j->pos += n;
            return 0;
        }
    }
    double v;
    return ckj_number(j, &v);
}

/* Object iteration: call ckj_expect(j, '{') first; then each call gives 1 with
 * the next key (the cursor at its value), 0 at the closing brace, -1 on junk. */
static inline int ckj_next_key(CkptJson *j, int *first, char *key, size_t keylen)
{
    ckj_ws(j);
    if (j->pos < j->len && j->s[j->pos] == '}') {
        j->pos++;
        return 0;
    }
    if (!*first && ckj_expect(j, ','))
        return -1;
    *first = 0;
    if (ckj_string(j, key, keylen) || ckj_expect(j, ':'))
        return -1;
    return 1;
}

static inline int ckj_int_array(CkptJson *j, int64_t *out, int max, int *n)
{
    *n = 0;
    if (ckj_expect(j, '['))
        return -1;
    ckj_ws(j);
    if (j->pos < j->len && j->s[j->pos] == ']') {
        j->pos++;
        return 0;
    }
    for (;;) {
        double v;
        if (*n >= max || ckj_number(j, &v) || v < 0 || v != (double)(int64_t)v)
            return -1;
        out[(*n)++] = (int64_t)v;
        ckj_ws(j);
        if (j->pos < j->len && j->s[j->pos] == ',') {
            j->pos++;
            continue;
        }
        return ckj_expect(j, ']');
    }
}

/* ------------------------------------------------------------------------- */
/* loading                                                                    */

typedef struct {
    char name[256];
    char dtype[16];
    int ndim;
    int64_t shape[8];
    int64_t begin, end;
} CkptTensorInfo;

/* Read model.safetensors at path into params (layout->total floats), by HF name. */
static inline int checkpoint_load_safetensors_try(const char *path, const ParamLayout *layout, float *params, char *err,
                                                  size_t errlen)
{
    FILE *f = fopen(path, "rb");
    char *hdr = NULL;
    CkptTensorInfo *infos = NULL;
    int n_infos = 0, cap = 0;
    unsigned char n8[8];
    int64_t file_size, data_start, data_len = 0;
    uint64_t hlen;
    CkptJson j;
    int first = 1, rc, result = -1;
    char key[256];
    if (!f)
        CKPT_ERR("cannot open '%s': %s", path, strerror(errno));
    fseeko(f, 0, SEEK_END);
    file_size = (int64_t)ftello(f);
    fseeko(f, 0, SEEK_SET);
    if (file_size < 8 || fread(n8, 1, 8, f) != 8)
        CKPT_ERR("'%s' is too short to be a safetensors file", path);
    hlen = ckpt_get_u64(n8);
    if (hlen < 2 || hlen > (uint64_t)100000000 || (int64_t)hlen > file_size - 8)
        CKPT_ERR("'%s': bad safetensors header length %llu for a file of %lld bytes (truncated or corrupt)", path,
                 (unsigned long long)hlen, (long long)file_size);
    hdr = (char *)malloc_check((size_t)hlen + 1, "safetensors header");
    if (fread(hdr, 1, (size_t)hlen, f) != (size_t)hlen)
        CKPT_ERR("'%s': short read of the header", path);
    hdr[hlen] = '\0';
    data_start = 8 + (int64_t)hlen;
    j.s = hdr;
    j.pos = 0;
    j.len = (size_t)hlen;
    if (ckj_expect(&j, '{'))
        CKPT_ERR("'%s': the safetensors header is not a JSON object (corrupt)", path);
    while ((rc = ckj_next_key(&j, &first, key, sizeof(key))) == 1) {
        if (strcmp(key, "__metadata__") == 0) {
            if (ckj_skip(&j, 0))
                CKPT_ERR("'%s': bad JSON in the header's __metadata__", path);
            continue;
        }
        infos = (CkptTensorInfo *)ckpt_grow(infos, n_infos, &cap, sizeof(CkptTensorInfo), path);
        CkptTensorInfo *t = &infos[n_infos++];
        memset(t, 0, sizeof(*t));
        t->begin = t->end = -1;
        t->ndim = -1;
        snprintf(t->name, sizeof(t->name), "%s", key);
        int tfirst = 1, trc;
        char field[64];
        if (ckj_expect(&j, '{'))
            CKPT_ERR("'%s': tensor '%s' in the header is not an object", path, key);
        while ((trc = ckj_next_key(&j, &tfirst, field, sizeof(field))) == 1) {
            int n;
            int64_t offs[2];
            if (strcmp(field, "dtype") == 0) {
                if (ckj_string(&j, t->dtype, sizeof(t->dtype)))
                    CKPT_ERR("'%s': bad dtype of tensor '%s'", path, key);
            } else if (strcmp(field, "shape") == 0) {
                if (ckj_int_array(&j, t->shape, 8, &n))
                    CKPT_ERR("'%s': bad shape of tensor '%s'", path, key);
                t->ndim = n;
            } else if (strcmp(field, "data_offsets") == 0) {
                if (ckj_int_array(&j, offs, 2, &n) || n != 2 || offs[1] < offs[0])
                    CKPT_ERR("'%s': bad data_offsets of tensor '%s'", path, key);
                t->begin = offs[0];
                t->end = offs[1];
            } else if (ckj_skip(&j, 0)) {
                CKPT_ERR("'%s': bad JSON in tensor '%s'", path, key);
            }
        }
        if (trc < 0)
            CKPT_ERR("'%s': bad JSON in tensor '%s' of the header (corrupt)", path, key);
        if (t->ndim < 0 || t->begin < 0 || t->dtype[0] == '\0')
            CKPT_ERR("'%s': tensor '%s' lacks dtype, shape or data_offsets", path, key);
        if (t->end > data_len)
            data_len = t->end;
    }
    if (rc < 0)
        CKPT_ERR("'%s': the safetensors header is not valid JSON (corrupt)", path);
    if (data_start + data_len != file_size)
        CKPT_ERR("'%s' is %lld bytes but its header describes %lld (truncated or corrupt)", path, (long long)file_size,
                 (long long)(data_start + data_len));
    for (int i = 0; i < layout->n_tensors; i++) {
        const ParamTensor *p = &layout->tensors[i];
        const CkptTensorInfo *t = NULL;
        for (int k = 0; k < n_infos; k++) {
            if (strcmp(infos[k].name, p->name) == 0)
                t = &infos[k];
        }
        if (!t)
            CKPT_ERR("'%s' has no tensor '%s' (does the checkpoint belong to this model?)", path, p->name);
        if (strcmp(t->dtype, "F32") != 0)
            CKPT_ERR("'%s': tensor '%s' is %s, expected F32", path, p->name, t->dtype);
        int want_ndim = p->cols == 1 ? 1 : 2;
        if (t->ndim != want_ndim || t->shape[0] != p->rows || (want_ndim == 2 && t->shape[1] != p->cols)) {
            char got[128] = "";
            for (int d = 0; d < t->ndim && d < 8; d++) {
                size_t l = strlen(got);
                snprintf(got + l, sizeof(got) - l, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
            }
            CKPT_ERR("'%s': tensor '%s' has shape [%s], this model's is [%lld%s%lld] "
                     "(does the checkpoint belong to this model?)",
                     path, p->name, got, (long long)p->rows, want_ndim == 2 ? ", " : "",
                     want_ndim == 2 ? (long long)p->cols : 0LL);
        }
        if (t->end - t->begin != p->numel * 4)
            CKPT_ERR("'%s': tensor '%s' spans %lld bytes, its shape needs %lld", path, p->name,
                     (long long)(t->end - t->begin), (long long)(p->numel * 4));
        if (fseeko(f, (off_t)(data_start + t->begin), SEEK_SET) != 0 ||
            fread(params + p->offset, sizeof(float), (size_t)p->numel, f) != (size_t)p->numel)
            CKPT_ERR("'%s': short read of tensor '%s' (truncated?)", path, p->name);
    }
    result = 0;
fail: /* success comes this way too */
    if (f)
        fclose(f);
    free(hdr);
    free(infos);
    return result;
}

/* Check config.json's shape fields against the model config. */
static inline int checkpoint_check_config_try(const char *path, const LlamaConfig *c, char *err, size_t errlen)
{
    static const char *keys[] = {"vocab_size",        "hidden_size",         "intermediate_size",
                                 "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                 "head_dim",          "tie_word_embeddings"};
    const int nkeys = (int)(sizeof(keys) / sizeof(keys[0]));
    double want[8] = {(double)c->vocab_size, (double)c->d_model,   (double)c->ffn_dim,  (double)c->n_layer,
                      (double)c->n_head,     (double)c->n_kv_head, (double)c->head_dim, (double)c->tie_embeddings};
    double got[8];
    int found[8] = {0};
    char *buf = NULL, key[128];
    int64_t size;
    CkptJson j;
    int first = 1, rc;
    FILE *f = fopen(path, "rb");
    if (!f)
        CKPT_ERR("cannot open '%s': %s", path, strerror(errno));
    fseeko(f, 0, SEEK_END);
    size = (int64_t)ftello(f);
    fseeko(f, 0, SEEK_SET);
    if (size <= 0 || size > 1000000)
        CKPT_ERR("'%s' has an unlikely size of %lld bytes", path, (long long)size);
    buf = (char *)malloc_check((size_t)size + 1, "config.json");
    if (fread(buf, 1, (size_t)size, f) != (size_t)size)
        CKPT_ERR("'%s': short read", path);
    j.s = buf;
    j.pos = 0;
    j.len = (size_t)size;
    if (ckj_expect(&j, '{'))
        CKPT_ERR("'%s' is not a JSON object", path);
    while ((rc = ckj_next_key(&j, &first, key, sizeof(key))) == 1) {
        int idx = -1;
        for (int i = 0; i < nkeys; i++) {
            if (strcmp(key, keys[i]) == 0)
                idx = i;
        }
        if (idx < 0) {
            if (ckj_skip(&j, 0))
                CKPT_ERR("'%s': bad JSON at key '%s'", path, key);
            continue;
        }
        ckj_ws(&j);
        if (idx == nkeys - 1 && j.len - j.pos >= 4 && (memcmp(j.s + j.pos, "true", 4) == 0)) {
            got[idx] = 1.0;
            j.pos += 4;
        } else if (idx == nkeys - 1 && j.len - j.pos >= 5 && memcmp(j.s + j.pos, "false", 5) == 0) {
            got[idx] = 0.0;
            j.pos += 5;
        } else if (ckj_number(&j, &got[idx])) {
            CKPT_ERR("'%s': '%s' is not a number", path, key);
        }
        found[idx] = 1;
    }
    if (rc < 0)
        CKPT_ERR("'%s' is not valid JSON", path);
    for (int i = 0; i < nkeys; i++) {
        if (!found[i])
            CKPT_ERR("'%s' has no '%s'", path, keys[i]);
        if (got[i] != want[i])
            CKPT_ERR("'%s' has %s = %g but this run's model has %g\n"
                     "  hint: resume with the same model flags as the checkpoint",
                     path, keys[i], got[i], want[i]);
    }
    fclose(f);
    free(buf);
    return 0;
fail:
    if (f)
        fclose(f);
    free(buf);
    return -1;
}

/* One train_state file as the loader sees it. */
typedef struct {
    CheckpointState state;
    int64_t n_ranges;  /* entries of ranges */
    int64_t count;     /* moments in the file: the sum of the ranges' counts */
    int64_t data_at;   /* byte offset of m[0]; v[0] is count floats later */
    CkptRange *ranges; /* in file order, the moments of each following the previous' */
} CkptStateFile;

/* Reads and checks the header and range table of the train_state file at path
 * (of version 1 or 2) into *out, whose ranges the caller frees. Every size is
 * checked against the file's before anything is allocated from it. */
static inline int ckpt_read_state(const char *path, int64_t total, CkptStateFile *out, char *err, size_t errlen)
{
    unsigned char h[CKPT_STATE_HEADER_BYTES], entry[16];
    int64_t size, file_total, sum = 0;
    uint32_t version;
    CheckpointState *st = &out->state;
    FILE *f = fopen(path, "rb");
    memset(out, 0, sizeof(*out));
    if (!f)
        CKPT_ERR("cannot open '%s': %s", path, strerror(errno));
    fseeko(f, 0, SEEK_END);
    size = (int64_t)ftello(f);
    fseeko(f, 0, SEEK_SET);
    if (size < CKPT_STATE_HEADER_BYTES || fread(h, 1, sizeof(h), f) != sizeof(h))
        CKPT_ERR("'%s' is too short (%lld bytes) to be a train_state.bin", path, (long long)size);
    if (memcmp(h, CKPT_STATE_MAGIC "\0", 8) != 0)
        CKPT_ERR("'%s' is not a train_state.bin (bad magic)", path);
    version = ckpt_get_u32(h + 8);
    if (version != 1 && version != CKPT_STATE_VERSION)
        CKPT_ERR("'%s' has version %u, this build reads versions 1 to %d", path, version, CKPT_STATE_VERSION);
    if (ckpt_get_u32(h + 12) != CKPT_STATE_HEADER_BYTES)
        CKPT_ERR("'%s' has a header of %u bytes, expected %d (corrupt)", path, ckpt_get_u32(h + 12),
                 CKPT_STATE_HEADER_BYTES);
    st->step = ckpt_get_u64(h + 16);
    st->adam_step = ckpt_get_u64(h + 24);
    st->rng_state = ckpt_get_u64(h + 32);
    st->rank = (int32_t)ckpt_get_u32(h + 40);
    st->world = (int32_t)ckpt_get_u32(h + 44);
    file_total = (int64_t)ckpt_get_u64(h + 48);
    st->data.epoch = ckpt_get_u64(h + 72);
    st->data.shard = ckpt_get_u64(h + 80);
    st->data.window = ckpt_get_u64(h + 88);
    st->data.seed = ckpt_get_u64(h + 96);
    st->data.layout = ckpt_get_u64(h + 104);
    if (file_total != total)
        CKPT_ERR("'%s' holds optimizer state of %lld parameters, this model has %lld", path, (long long)file_total,
                 (long long)total);
    if (st->world < 1 || st->rank < 0 || st->rank >= st->world)
        CKPT_ERR("'%s': rank %d of %d is impossible (corrupt)", path, st->rank, st->world);
    out->count = (int64_t)ckpt_get_u64(h + 64);
    if (version == 1) { /* one range, no table */
        out->n_ranges = 1;
        out->ranges = (CkptRange *)malloc_check(sizeof(CkptRange), "checkpoint ranges");
        out->ranges[0].offset = (int64_t)ckpt_get_u64(h + 56);
        out->ranges[0].count = out->count;
        out->data_at = CKPT_STATE_HEADER_BYTES;
    } else {
        out->n_ranges = (int64_t)ckpt_get_u64(h + 56);
        /* every range holds at least one of the total elements: more is corruption, and a table needs its bytes */
        if (out->n_ranges < 0 || out->n_ranges > total)
            CKPT_ERR("'%s' claims %lld ranges of the %lld parameters (corrupt)", path, (long long)out->n_ranges,
                     (long long)total);
        if (out->n_ranges > (size - CKPT_STATE_HEADER_BYTES) / 16)
            CKPT_ERR("'%s' is %lld bytes, too short for its table of %lld ranges (truncated or corrupt)", path,
                     (long long)size, (long long)out->n_ranges);
        out->ranges = (CkptRange *)malloc_check((size_t)(out->n_ranges > 0 ? out->n_ranges : 1) * sizeof(CkptRange),
                                                "checkpoint ranges");
        for (int64_t i = 0; i < out->n_ranges; i++) {
            if (fread(entry, 1, sizeof(entry), f) != sizeof(entry))
                CKPT_ERR("'%s': short read of the range table", path);
            out->ranges[i].offset = (int64_t)ckpt_get_u64(entry);
            out->ranges[i].count = (int64_t)ckpt_get_u64(entry + 8);
        }
        out->data_at = CKPT_STATE_HEADER_BYTES + 16 * out->n_ranges;
    }
    if (out->count < 0 || out->count > total)
        CKPT_ERR("'%s' claims %lld moments of the %lld parameters (corrupt)", path, (long long)out->count,
                 (long long)total);
    for (int64_t i = 0; i < out->n_ranges; i++) {
        const CkptRange *r = &out->ranges[i];
        if (r->offset < 0 || r->count < 0 || r->offset > total || r->count > total - r->offset)
            CKPT_ERR("'%s': rank %d of %d, range [%lld, +%lld) of %lld parameters is impossible (corrupt)", path,
                     st->rank, st->world, (long long)r->offset, (long long)r->count, (long long)total);
        if (r->count > out->count - sum)
            CKPT_ERR("'%s': its ranges hold more than the %lld moments of its header (corrupt)", path,
                     (long long)out->count);
        sum += r->count;
    }
    if (sum != out->count)
        CKPT_ERR("'%s': its ranges hold %lld moments, its header says %lld (corrupt)", path, (long long)sum,
                 (long long)out->count);
    if (size != out->data_at + 8 * out->count)
        CKPT_ERR("'%s' is %lld bytes, its header describes %lld (truncated or corrupt)", path, (long long)size,
                 (long long)(out->data_at + 8 * out->count));
    fclose(f);
    return 0;
fail:
    if (f)
        fclose(f);
    free(out->ranges);
    out->ranges = NULL;
    return -1;
}

/* A non-empty range of one file: where it lies in the flat buffers and where
 * its moments are in the file (elements after the file's m[0]). */
typedef struct {
    int64_t offset, count, at;
    int file;
} CkptPiece;

/* A copy from a file: n moments from element src of its m (and of its v) to
 * element dst of the caller's m (and v). */
typedef struct {
    int64_t src, dst, n;
    int file;
} CkptRead;

static inline int ckpt_piece_cmp(const void *a, const void *b)
{
    const CkptPiece *x = (const CkptPiece *)a, *y = (const CkptPiece *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : x->file - y->file;
}

static inline int ckpt_read_cmp(const void *a, const void *b)
{
    const CkptRead *x = (const CkptRead *)a, *y = (const CkptRead *)b;
    if (x->file != y->file)
        return x->file - y->file;
    return x->src < y->src ? -1 : x->src > y->src ? 1 : 0;
}

/* The AdamW moments of wanted[n_wanted] (ranges of the flat buffers) into m and
 * v, each the sum of their counts, concatenated in wanted order, from the
 * train_state files of ckpt_dir, whatever world size and ranges wrote them: all
 * files' ranges together must tile [0, total). Wanted ranges may come in any
 * order and overlap; their elements at or past total are zero (ZeRO padding).
 * state receives rank 0's header (step, data position, RNG). */
static inline int checkpoint_load_moments_try(const char *ckpt_dir, int64_t total, const CkptRange *wanted,
                                              int n_wanted, float *m, float *v, CheckpointState *state, char *err,
                                              size_t errlen)
{
    char path[CKPT_PATH_MAX + 64], other[CKPT_PATH_MAX + 64];
    FILE *f = NULL;
    CkptStateFile *files = NULL;
    CkptPiece *pieces = NULL;
    CkptRead *reads = NULL;
    int world = 1, n_files = 0, files_cap = 0, n_reads = 0, reads_cap = 0, result = -1;
    int64_t n_pieces = 0, k = 0, next = 0, dst = 0;
    if (n_wanted < 0 || (n_wanted > 0 && !wanted))
        CKPT_ERR("loading the AdamW moments of '%s': %d wanted ranges is impossible", ckpt_dir, n_wanted);
    for (int i = 0; i < n_wanted; i++) {
        if (wanted[i].offset < 0 || wanted[i].count < 0 || wanted[i].count > INT64_MAX - wanted[i].offset)
            CKPT_ERR("loading the AdamW moments of '%s': wanted range %d, [%lld, +%lld), is impossible", ckpt_dir, i,
                     (long long)wanted[i].offset, (long long)wanted[i].count);
        dst += wanted[i].count;
    }
    if (dst > 0) {
        memset(m, 0, (size_t)dst * sizeof(float));
        memset(v, 0, (size_t)dst * sizeof(float));
    }
    /* which files: train_state.bin alone, or as many per-rank files as rank 0's header says */
    checkpoint_state_file(path, sizeof(path), ckpt_dir, 0, 1);
    if (!ckpt_exists(path)) {
        checkpoint_state_file(path, sizeof(path), ckpt_dir, 0, 2);
        files = (CkptStateFile *)ckpt_grow(files, n_files, &files_cap, sizeof(CkptStateFile), path);
        if (ckpt_read_state(path, total, &files[0], err, errlen) != 0)
            goto fail;
        n_files = 1;
        world = files[0].state.world;
        if (world < 2) /* a file of one rank of one is train_state.bin, which is not there */
            CKPT_ERR("'%s' is named for one rank of several but says it is rank 0 of 1 (corrupt?)", path);
    }
    for (int r = 0; r < world; r++) { /* grown as read: a corrupt world fails at its first missing file */
        checkpoint_state_file(path, sizeof(path), ckpt_dir, r, world);
        if (r == n_files) { /* rank 0's file may have been read above */
            files = (CkptStateFile *)ckpt_grow(files, n_files, &files_cap, sizeof(CkptStateFile), path);
            if (ckpt_read_state(path, total, &files[n_files], err, errlen) != 0)
                goto fail;
            n_files++;
        }
        const CheckpointState *h = &files[r].state;
        if (h->rank != r || h->world != world)
            CKPT_ERR("'%s' is rank %d of %d; expected rank %d of %d (a checkpoint mixed from several runs?)", path,
                     h->rank, h->world, r, world);
        if (h->step != files[0].state.step)
            CKPT_ERR("'%s' is of step %llu, rank 0's file of step %llu (a checkpoint mixed from several runs?)", path,
                     (unsigned long long)h->step, (unsigned long long)files[0].state.step);
        n_pieces += files[r].n_ranges;
    }
    *state = files[0].state;
    /* every file's non-empty ranges, by offset: they must tile [0, total) */
    pieces = (CkptPiece *)malloc_check((size_t)(n_pieces > 0 ? n_pieces : 1) * sizeof(CkptPiece), "checkpoint ranges");
    n_pieces = 0;
    for (int r = 0; r < n_files; r++) {
        int64_t at = 0;
        for (int64_t i = 0; i < files[r].n_ranges; i++) {
            CkptPiece p = {files[r].ranges[i].offset, files[r].ranges[i].count, at, r};
            at += p.count;
            if (p.count > 0)
                pieces[n_pieces++] = p;
        }
    }
    qsort(pieces, (size_t)n_pieces, sizeof(CkptPiece), ckpt_piece_cmp);
    for (k = 0; k < n_pieces; k++) {
        if (pieces[k].offset < next) {
            checkpoint_state_file(path, sizeof(path), ckpt_dir, pieces[k - 1].file, world);
            checkpoint_state_file(other, sizeof(other), ckpt_dir, pieces[k].file, world);
            CKPT_ERR("the train_state files of '%s' overlap: '%s' holds [%lld, +%lld), '%s' holds [%lld, +%lld) "
                     "(a checkpoint mixed from several runs?)",
                     ckpt_dir, path, (long long)pieces[k - 1].offset, (long long)pieces[k - 1].count, other,
                     (long long)pieces[k].offset, (long long)pieces[k].count);
        }
        if (pieces[k].offset > next)
            break;
        next = pieces[k].offset + pieces[k].count;
    }
    if (next != total)
        CKPT_ERR("the train_state files of '%s' leave a gap at element %lld of %lld parameters (a rank's file is "
                 "missing or from another run?)",
                 ckpt_dir, (long long)next, (long long)total);
    /* what each wanted range needs from which file, then each file's reads in file order */
    dst = 0;
    for (int i = 0; i < n_wanted; i++) {
        int64_t lo = wanted[i].offset, hi = wanted[i].offset + wanted[i].count, first = 0, last = n_pieces;
        if (hi > total)
            hi = total;
        while (first < last) { /* the first piece that ends after lo */
            int64_t mid = first + (last - first) / 2;
            if (pieces[mid].offset + pieces[mid].count <= lo)
                first = mid + 1;
            else
                last = mid;
        }
        for (k = first; k < n_pieces && pieces[k].offset < hi; k++) {
            int64_t a = pieces[k].offset > lo ? pieces[k].offset : lo;
            int64_t b = pieces[k].offset + pieces[k].count < hi ? pieces[k].offset + pieces[k].count : hi;
            reads = (CkptRead *)ckpt_grow(reads, n_reads, &reads_cap, sizeof(CkptRead), ckpt_dir);
            reads[n_reads].src = pieces[k].at + (a - pieces[k].offset);
            reads[n_reads].dst = dst + (a - wanted[i].offset);
            reads[n_reads].n = b - a;
            reads[n_reads].file = pieces[k].file;
            n_reads++;
        }
        dst += wanted[i].count;
    }
    qsort(reads, (size_t)n_reads, sizeof(CkptRead), ckpt_read_cmp);
    for (int i = 0; i < n_reads;) {
        int r = reads[i].file, end = i;
        while (end < n_reads && reads[end].file == r)
            end++;
        checkpoint_state_file(path, sizeof(path), ckpt_dir, r, world);
        f = fopen(path, "rb");
        if (!f)
            CKPT_ERR("cannot open '%s': %s", path, strerror(errno));
        for (int which = 0; which < 2; which++) { /* all of m, then all of v: forward through the file */
            for (int j = i; j < end; j++) {
                const CkptRead *c = &reads[j];
                off_t at = (off_t)files[r].data_at + (off_t)(which * files[r].count + c->src) * 4;
                float *to = (which == 0 ? m : v) + c->dst;
                if (fseeko(f, at, SEEK_SET) != 0 || fread(to, sizeof(float), (size_t)c->n, f) != (size_t)c->n)
                    CKPT_ERR("'%s': short read of the AdamW moments (truncated?)", path);
            }
        }
        fclose(f);
        f = NULL;
        i = end;
    }
    result = 0;
fail: /* success comes this way too */
    if (f)
        fclose(f);
    for (int r = 0; r < n_files; r++)
        free(files[r].ranges);
    free(files);
    free(pieces);
    free(reads);
    return result;
}

/* The weights of a complete checkpoint directory into params (layout->total
 * floats), after checking its COMPLETE marker and that config.json is `config`. */
static inline int checkpoint_load_model_try(const char *ckpt_dir, const LlamaConfig *config, const ParamLayout *layout,
                                            float *params, char *err, size_t errlen)
{
    char path[CKPT_PATH_MAX + 64];
    ckpt_path(path, sizeof(path), "%s/COMPLETE", ckpt_dir);
    if (!ckpt_exists(path)) {
        ckpt_path(err, errlen, "'%s' has no COMPLETE marker: the checkpoint was not finished", ckpt_dir);
        return -1;
    }
    ckpt_path(path, sizeof(path), "%s/config.json", ckpt_dir);
    if (checkpoint_check_config_try(path, config, err, errlen) != 0)
        return -1;
    ckpt_path(path, sizeof(path), "%s/model.safetensors", ckpt_dir);
    return checkpoint_load_safetensors_try(path, layout, params, err, errlen);
}

/* Load a whole checkpoint directory (written by checkpoint_save) into a model
 * built with `config`: weights, AdamW moments and the state. A single-process
 * resume takes a single-process checkpoint: one of several ranks is refused. */
static inline int checkpoint_load_try(const char *ckpt_dir, const LlamaConfig *config, const ParamLayout *layout,
                                      float *params, float *adam_m, float *adam_v, CheckpointState *state, char *err,
                                      size_t errlen)
{
    if (checkpoint_load_model_try(ckpt_dir, config, layout, params, err, errlen) != 0)
        return -1;
    CkptRange all = {0, layout->total};
    if (checkpoint_load_moments_try(ckpt_dir, layout->total, &all, 1, adam_m, adam_v, state, err, errlen) != 0)
        return -1;
    if (state->world != 1) {
        ckpt_path(err, errlen,
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

#undef CKPT_ERR

#endif /* LLMC_CHECKPOINT_H */
