/*
 * hf_model.h: HuggingFace model directories, in and out, as
 * save_pretrained writes them: config.json (hf_config.h), the weights as
 * model.safetensors or as model-0000K-of-0000N.safetensors listed in
 * model.safetensors.index.json ({"weight_map": {tensor name: file name}}),
 * and beside them generation_config.json and the tokenizer. A checkpoint
 * directory of this project is one too.
 *
 * Reading (hf_model_weights_try) checks everything before it reads a byte of
 * data: every file's header (safetensors.h: no hole, no overlap, no tensor
 * past the file), every tensor of the model present with the layout's shape in
 * a dtype it reads (F32, BF16, F16, converted to the fp32 master exactly), an
 * index that names only files in the directory that exist and hold what it
 * says, and no tensor the model has no place for (rotary_emb.inv_freq buffers
 * of old checkpoints aside, and an lm_head.weight of a tied model, which must
 * then equal the embedding). Nothing is half-loaded: an error leaves the
 * caller's buffer unspecified and returns -1 with the file and the tensor.
 * model_weights_load reads either this or a .llmt weights file, refuses
 * non-finite weights, and exits with the reader's message on bad input.
 *
 * Writing (hf_model_write_try): config.json, generation_config.json,
 * model.safetensors in fp32 or bf16, and the tokenizer file the shards were
 * made with, as tokenizer.model with a tokenizer_config.json, when one is given.
 *
 * Memory: every shard's header while reading, one conversion buffer, and for
 * a tied lm_head one tensor more. Plain C (POSIX); compiles as C++ too.
 */
#ifndef LLMC_HF_MODEL_H
#define LLMC_HF_MODEL_H

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "llmc/common/fileutil.h"
#include "llmc/formats/hf_config.h"
#include "llmc/formats/json.h"
#include "llmc/model/llama_config.h"
#include "llmc/formats/llmt_config.h"
#include "llmc/formats/safetensors.h"
#include "llmc/formats/tensorfile.h"
#include "llmc/formats/tokenizer.h"
#include "llmc/model/param_layout.h"

#define HF_INDEX_MAX_BYTES 100000000
#define HF_MAX_SHARDS 4096

/* What a written model directory carries besides the weights and the config. */
typedef struct {
    HfTokenIds ids;             /* BOS and EOS for config.json and generation_config.json */
    const Tokenizer *tokenizer; /* copied in as tokenizer.model, with tokenizer_config.json; NULL: none */
} HfExtras;

static inline int path_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The weight files of dir and, for each tensor of the index, its file (NULL for
 * a single model.safetensors). */
typedef struct {
    int n_files;
    SafetensorsFile files[HF_MAX_SHARDS];
    JsonDoc index; /* the parsed index, when sharded */
} HfWeights;

static inline void hf_weights_close_(HfWeights *w)
{
    for (int i = 0; i < w->n_files; i++)
        safetensors_close(&w->files[i]);
    json_free(&w->index);
    w->n_files = 0;
}

/* A shard name from the index: a plain file name, so the index cannot point outside dir. */
static inline int hf_plain_name_(const char *name)
{
    return name[0] && strchr(name, '/') == NULL && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

/* Opens dir's weight files: model.safetensors, or every file the index names. */
static inline int hf_weights_open_(HfWeights *w, const char *dir, char *err, size_t errlen)
{
    char path[LLMC_PATH_MAX];
    memset(&w->index, 0, sizeof(w->index));
    w->n_files = 0;
    if (path_format(path, sizeof(path), "%s/model.safetensors", dir) != 0)
        return set_error(err, errlen, "the path '%.100s...' is too long", dir);
    if (path_exists(path)) {
        if (safetensors_open(&w->files[0], path, err, errlen) != 0)
            return -1;
        w->n_files = 1;
        return 0;
    }
    path_format(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    if (!path_exists(path))
        return set_error(err, errlen,
                         "'%s' holds neither model.safetensors nor model.safetensors.index.json\n"
                         "  hint: point --init-from at a directory that save_pretrained wrote",
                         dir);
    if (json_parse_file(&w->index, path, HF_INDEX_MAX_BYTES, err, errlen) != 0)
        return -1;
    const JsonNode *map = json_get(&w->index, json_root(&w->index), "weight_map");
    if (!map || map->type != JSON_OBJECT)
        return set_error(err, errlen, "'%s' has no weight_map object", path);
    for (const JsonNode *m = json_first(&w->index, map); m; m = json_next(&w->index, m)) {
        const char *file = json_string(&w->index, m);
        if (!file || !hf_plain_name_(file))
            return set_error(err, errlen, "'%s': tensor '%s' is mapped to %s, not a file name in the directory", path,
                             json_key(&w->index, m), file ? file : "something that is no string");
        int known = 0;
        for (int i = 0; i < w->n_files && !known; i++)
            known = strcmp(strrchr(w->files[i].path, '/') + 1, file) == 0;
        if (known)
            continue;
        if (w->n_files == HF_MAX_SHARDS)
            return set_error(err, errlen, "'%s' names more than %d files", path, HF_MAX_SHARDS);
        char shard[LLMC_PATH_MAX];
        if (path_format(shard, sizeof(shard), "%s/%s", dir, file) != 0)
            return set_error(err, errlen, "'%s': the path of '%s' is too long", path, file);
        if (!path_exists(shard))
            return set_error(err, errlen, "'%s' names '%s' for tensor '%s', but there is no such file", path, file,
                             json_key(&w->index, m));
        if (safetensors_open(&w->files[w->n_files], shard, err, errlen) != 0)
            return -1;
        w->n_files++;
    }
    return 0;
}

/* Where tensor name is: its file and entry; NULL (and an error) if not where it must be. */
static inline const SafetensorsTensor *hf_find_(HfWeights *w, const char *name, SafetensorsFile **in)
{
    const char *file = NULL;
    if (w->index.n_nodes > 0) {
        const JsonNode *at = json_get(&w->index, json_get(&w->index, json_root(&w->index), "weight_map"), name);
        if (!at)
            return NULL;
        file = json_string(&w->index, at);
    }
    for (int i = 0; i < w->n_files; i++) {
        if (file && strcmp(strrchr(w->files[i].path, '/') + 1, file) != 0)
            continue;
        const SafetensorsTensor *t = safetensors_find(&w->files[i], name);
        if (t) {
            *in = &w->files[i];
            return t;
        }
    }
    return NULL;
}

/* A tensor the files hold that the model has no place for: rotary_emb.inv_freq
 * buffers (recomputed here) and a tied model's lm_head.weight aside. */
static inline const char *hf_unknown_tensor_(HfWeights *w, const ParamLayout *layout)
{
    for (int f = 0; f < w->n_files; f++) {
        for (int i = 0; i < w->files[f].n_tensors; i++) {
            const char *name = w->files[f].tensors[i].name;
            int known = strstr(name, "rotary_emb.inv_freq") != NULL || strcmp(name, "lm_head.weight") == 0;
            for (int k = 0; k < layout->n_tensors && !known; k++)
                known = strcmp(layout->tensors[k].name, name) == 0;
            if (!known)
                return name;
        }
    }
    return NULL;
}

/* Checks the files against the layout, then reads every tensor (see the top). */
static inline int hf_weights_read_(HfWeights *w, const char *dir, const ParamLayout *layout, float *params, char *err,
                                   size_t errlen)
{
    const char *unknown = hf_unknown_tensor_(w, layout);
    if (unknown)
        return set_error(err, errlen,
                         "'%s' holds tensor '%s', which this Llama model has no place for (does "
                         "config.json describe these weights?)",
                         dir, unknown);
    const SafetensorsTensor **found =
        (const SafetensorsTensor **)malloc_check(sizeof(*found) * layout->n_tensors, "tensor table");
    SafetensorsFile **in = (SafetensorsFile **)malloc_check(sizeof(*in) * layout->n_tensors, "tensor table");
    int rc = 0;
    for (int i = 0; i < layout->n_tensors && rc == 0; i++) {
        const ParamTensor *p = &layout->tensors[i];
        const SafetensorsTensor *t = found[i] = hf_find_(w, p->name, &in[i]);
        int want_ndim = p->cols == 1 ? 1 : 2;
        if (!t)
            rc = set_error(err, errlen, "'%s' has no tensor '%s' (or its index names a file without it)", dir, p->name);
        else if (t->ndim != want_ndim || t->shape[0] != p->rows || (want_ndim == 2 && t->shape[1] != p->cols))
            rc = set_error(err, errlen,
                           "'%s': tensor '%s' has %d dimensions [%lld, %lld], config.json makes it "
                           "[%lld, %lld]",
                           in[i]->path, p->name, t->ndim, (long long)t->shape[0],
                           (long long)(t->ndim > 1 ? t->shape[1] : 1), (long long)p->rows, (long long)p->cols);
        else if (!safetensors_dtype_readable(t->dtype))
            rc = set_error(err, errlen, "'%s': tensor '%s' is %s; this trainer reads F32, BF16 and F16", in[i]->path,
                           p->name, t->dtype);
    }
    for (int i = 0; i < layout->n_tensors && rc == 0; i++)
        rc = safetensors_read_f32(in[i], found[i], params + layout->tensors[i].offset, err, errlen);
    SafetensorsFile *lm_in;
    const SafetensorsTensor *lm = rc == 0 ? hf_find_(w, "lm_head.weight", &lm_in) : NULL;
    if (lm && layout->n_tensors > 0 && strcmp(layout->tensors[layout->n_tensors - 1].name, "lm_head.weight") != 0) {
        const ParamTensor *e = &layout->tensors[0]; /* tied: lm_head is the embedding */
        float *copy = (float *)malloc_check((size_t)e->numel * sizeof(float), "tied lm_head");
        if (lm->numel != e->numel)
            rc = set_error(err, errlen, "'%s': lm_head.weight has %lld elements, the tied embedding %lld", lm_in->path,
                           (long long)lm->numel, (long long)e->numel);
        else if ((rc = safetensors_read_f32(lm_in, lm, copy, err, errlen)) == 0 &&
                 memcmp(copy, params + e->offset, (size_t)e->numel * sizeof(float)) != 0)
            rc = set_error(err, errlen,
                           "'%s' holds an lm_head.weight unlike the embedding, but config.json says "
                           "tie_word_embeddings: true\n  hint: set it to false to train the two apart",
                           dir);
        free(copy);
    }
    free(found);
    free(in);
    return rc;
}

/* The weights of HF model directory dir into params (layout->total floats). */
static inline int hf_model_weights_try(const char *dir, const ParamLayout *layout, float *params, char *err,
                                       size_t errlen)
{
    HfWeights *w = (HfWeights *)calloc_check(1, sizeof(HfWeights), "weight files");
    int rc = hf_weights_open_(w, dir, err, errlen);
    if (rc == 0)
        rc = hf_weights_read_(w, dir, layout, params, err, errlen);
    hf_weights_close_(w);
    free(w);
    return rc;
}

/* The config of what --init-from names: an HF directory's config.json, or a .llmt file's metadata. */
static inline LlamaConfig model_config_load(const char *path, HfTokenIds *ids)
{
    LlamaConfig c;
    *ids = hf_token_ids(-1, -1);
    if (path_is_dir(path)) {
        char file[LLMC_PATH_MAX], err[2048];
        if (path_format(file, sizeof(file), "%s/config.json", path) != 0)
            FAIL("the path '%.100s...' is too long", path);
        if (hf_config_read_try(file, &c, ids, err, sizeof(err)) != 0)
            FAIL("%s", err);
        return c;
    }
    TensorFile tf;
    tensorfile_open(&tf, path);
    c = llama_config_from_tensorfile(&tf);
    tensorfile_close(&tf);
    return c;
}

/* The weights of an open .llmt weights file into params (layout->total floats),
 * each tensor checked by name and shape, or an error naming the file. */
static inline int llmt_weights_try(TensorFile *tf, const ParamLayout *layout, float *params, char *err, size_t errlen)
{
    if (tf->n_tensors != layout->n_tensors)
        return set_error(err, errlen,
                         "'%s' holds %d tensors but its config's model has %d parameter tensors\n"
                         "  hint: is it a weights file (not a dump)? regenerate it with reference/make_reference.py",
                         tf->path, tf->n_tensors, layout->n_tensors);
    for (int i = 0; i < layout->n_tensors; i++) {
        const ParamTensor *t = &layout->tensors[i];
        const TensorEntry *e = tensorfile_find(tf, t->name);
        int want_ndim = t->cols == 1 ? 1 : 2;
        /* the element count is not enough: a transposed matrix has the same */
        if (e && (e->ndim != want_ndim || e->shape[0] != t->rows || (want_ndim == 2 && e->shape[1] != t->cols)))
            return set_error(err, errlen,
                             "'%s': tensor '%s' has %d dimensions [%lld, %lld], the model's is [%lld, %lld] "
                             "(transposed or from another model?)",
                             tf->path, t->name, e->ndim, (long long)e->shape[0],
                             (long long)(e->ndim > 1 ? e->shape[1] : 1), (long long)t->rows, (long long)t->cols);
        if (tensorfile_read_try(tf, t->name, TF_FLOAT32, t->numel, params + t->offset, err, errlen) != 0)
            return -1;
    }
    return 0;
}

/* The weights of what --init-from names (an HF directory or a .llmt weights
 * file) into params (layout->total floats); exits naming the file on an error. */
/* 0, or -1 naming the first tensor of params that holds a NaN or an infinity, with how many. */
static inline int model_weights_finite_try(const ParamLayout *layout, const float *params, const char *path, char *err,
                                           size_t errlen)
{
    for (int i = 0; i < layout->n_tensors; i++) {
        const ParamTensor *t = &layout->tensors[i];
        int64_t bad = 0, first = -1;
        for (int64_t j = 0; j < t->numel; j++)
            if (!isfinite(params[t->offset + j])) {
                first = first < 0 ? j : first;
                bad++;
            }
        if (bad > 0) {
            snprintf(err, errlen,
                     "'%s': tensor '%s' holds %lld value%s that %s not finite (the first at element %lld)\n  hint: "
                     "the model diverged before it was saved; start from an earlier checkpoint or another model",
                     path, t->name, (long long)bad, bad == 1 ? "" : "s", bad == 1 ? "is" : "are", (long long)first);
            return -1;
        }
    }
    return 0;
}

/* The weights of path (an HF model directory or a .llmt weights file) into params, all
 * finite (a NaN would only show as skipped steps; the NaN guard's tests let one through
 * with LLMC_TEST_ALLOW_NONFINITE=1); exits with the reader's message on bad input. */
static inline void model_weights_load(const char *path, const ParamLayout *layout, float *params)
{
    char err[2048];
    int rc;
    if (path_is_dir(path)) {
        rc = hf_model_weights_try(path, layout, params, err, sizeof(err));
    } else {
        TensorFile tf;
        tensorfile_open(&tf, path);
        rc = llmt_weights_try(&tf, layout, params, err, sizeof(err));
        tensorfile_close(&tf);
    }
    if (rc == 0 && !getenv("LLMC_TEST_ALLOW_NONFINITE"))
        rc = model_weights_finite_try(layout, params, path, err, sizeof(err));
    if (rc != 0)
        FAIL("%s", err);
}

/* tokenizer_config.json beside tokenizer.model: the BOS and EOS names and every
 * special token with its id, with which transformers' AutoTokenizer reads the
 * tiktoken file (checked with transformers 5: ids equal to tiktoken's). */
static inline int hf_tokenizer_config_write_try(const char *path, const Tokenizer *t, int max_length, char *err,
                                                size_t errlen)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return set_error(err, errlen, "cannot create '%s': %s", path, strerror(errno));
    char *bos = tokenizer_decode(t, &t->bos_id, 1), *eos = tokenizer_decode(t, &t->eos_id, 1);
    fprintf(f,
            "{\n  \"bos_token\": \"%s\",\n  \"eos_token\": \"%s\",\n  \"model_max_length\": %d,\n"
            "  \"clean_up_tokenization_spaces\": false,\n  \"added_tokens_decoder\": {",
            bos, eos, max_length);
    for (int id = t->n_ranks; id < t->vocab_size; id++) {
        char *name = tokenizer_decode(t, &id, 1);
        fprintf(f,
                "%s\n    \"%d\": {\"content\": \"%s\", \"special\": true, \"lstrip\": false, \"rstrip\": false, "
                "\"normalized\": false, \"single_word\": false}",
                id > t->n_ranks ? "," : "", id, name);
        free(name);
    }
    fprintf(f, "\n  }\n}\n");
    free(bos);
    free(eos);
    int ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    return ok ? 0 : set_error(err, errlen, "cannot write '%s': %s\n  hint: is the disk full?", path, strerror(errno));
}

/* Copies the file at from to to, fsync'ed. */
static inline int copy_file_synced(const char *from, const char *to, char *err, size_t errlen)
{
    int64_t size;
    FILE *in = open_regular_file(from, &size, err, errlen);
    if (!in)
        return -1;
    char *data = (char *)malloc_check((size_t)size + 1, "file copy");
    int ok = fread(data, 1, (size_t)size, in) == (size_t)size;
    fclose(in);
    int rc = ok ? write_file_synced(to, data, (size_t)size, err, errlen)
                : set_error(err, errlen, "short read of '%s'", from);
    free(data);
    return rc;
}

/* Writes an HF model directory's files into dir (which exists): see the top;
 * step >= 0 goes into the weights' metadata (checkpoints). */
static inline int hf_model_write_try(const char *dir, const LlamaConfig *config, const ParamLayout *layout,
                                     const float *params, int bf16, int64_t step, const HfExtras *extras, char *err,
                                     size_t errlen)
{
    char file[LLMC_PATH_MAX + 64];
    for (int i = 0; i < layout->n_tensors; i++) { /* a NaN is never saved */
        const ParamTensor *t = &layout->tensors[i];
        for (int64_t k = 0; k < t->numel; k++) {
            if (!isfinite(params[t->offset + k]))
                return set_error(err, errlen,
                                 "'%s' not written: tensor '%s' holds a value that is not finite (%g at "
                                 "%lld)",
                                 dir, t->name, (double)params[t->offset + k], (long long)k);
        }
    }
    path_format(file, sizeof(file), "%s/model.safetensors", dir);
    if (safetensors_write_params_try(file, layout, params, bf16, step, err, errlen) != 0)
        return -1;
    path_format(file, sizeof(file), "%s/config.json", dir);
    if (hf_config_write_try(file, config, &extras->ids, bf16 ? "bfloat16" : "float32", err, errlen) != 0)
        return -1;
    path_format(file, sizeof(file), "%s/generation_config.json", dir);
    if (hf_generation_config_write_try(file, &extras->ids, err, errlen) != 0)
        return -1;
    if (!extras->tokenizer)
        return 0;
    path_format(file, sizeof(file), "%s/tokenizer.model", dir);
    if (copy_file_synced(extras->tokenizer->path, file, err, errlen) != 0)
        return -1;
    path_format(file, sizeof(file), "%s/tokenizer_config.json", dir);
    return hf_tokenizer_config_write_try(file, extras->tokenizer, config->max_seq_len, err, errlen);
}

#endif /* LLMC_HF_MODEL_H */
