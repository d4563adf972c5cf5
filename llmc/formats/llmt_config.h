/*
 * llmt_config.h: the model's LlamaConfig in a .llmt file's metadata (weights
 * files and reference dumps; docs/tensor_file_format.md), read through
 * llama_config.h's field table: a key "config.<field>" per field, numbers as
 * Python's repr writes them (whole numbers also as "8.0"), the RoPE variant as
 * "none" or "llama3", the family as its HF model_type; the fields added after
 * the first files (family, qkv_bias, qk_norm) may be missing: then Llama's 0.
 * Reads only the file's metadata; writes *c.
 */
#ifndef LLMC_LLMT_CONFIG_H
#define LLMC_LLMT_CONFIG_H

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/common/utils.h"
#include "llmc/formats/tensorfile.h"
#include "llmc/model/llama_config.h"

/* The value v of field f into *c, or an error naming the file, the key and the value. */
static inline int llmt_config_field_(const TensorFile *tf, const ConfigField *f, const char *v, LlamaConfig *c,
                                     char *err, size_t errlen)
{
    if (f->kind == CONFIG_FAMILY) {
        for (int k = 0; k < FAMILY_COUNT; k++) {
            if (strcmp(v, FAMILY_MODEL_TYPE[k]) == 0) {
                config_field_set(c, f, k);
                return 0;
            }
        }
        return set_error(err, errlen, "'%s': unknown model family '%s' (known: llama, qwen2, qwen3, mistral)", tf->path,
                         v);
    }
    if (f->kind == CONFIG_ROPE_KIND) {
        if (strcmp(v, "llama3") != 0 && strcmp(v, "none") != 0)
            return set_error(err, errlen, "'%s': unknown rope scaling '%s' (known: none, llama3)", tf->path, v);
        config_field_set(c, f, strcmp(v, "llama3") == 0);
        return 0;
    }
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    int parsed = *v && !*end && !errno;
    if (f->kind == CONFIG_FLOAT) {
        int zero_ok = f->lo == 0;
        if (!parsed || !isfinite((float)x) || !(x > 0 || (zero_ok && x == 0)))
            return set_error(err, errlen, "'%s': metadata %s = '%s' is not a %s finite number (corrupt?)", tf->path,
                             f->key, v, zero_ok ? "non-negative" : "positive");
    } else if (!parsed || !(x >= f->lo && x <= f->hi) || x != floor(x)) {
        return set_error(err, errlen, "'%s': metadata %s = '%s' is not a whole number in [%ld, %ld] (corrupt?)",
                         tf->path, f->key, v, (long)f->lo, (long)f->hi);
    }
    config_field_set(c, f, x);
    return 0;
}

/* The config in a .llmt file's metadata (weights or dump) into *c, or an error
 * naming the file and the key that is missing or out of range. */
static inline int llama_config_from_tensorfile_try(const TensorFile *tf, LlamaConfig *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    for (int i = 0; i < LLAMA_CONFIG_N_FIELDS; i++) {
        if (!tensorfile_meta(tf, LLAMA_CONFIG_FIELDS[i].key) && !LLAMA_CONFIG_FIELDS[i].optional)
            return set_error(err, errlen,
                             "'%s' has no metadata key '%s'; regenerate it with reference/make_reference.py", tf->path,
                             LLAMA_CONFIG_FIELDS[i].key);
    }
    for (int i = 0; i < LLAMA_CONFIG_N_FIELDS; i++) {
        const ConfigField *f = &LLAMA_CONFIG_FIELDS[i];
        const char *v = tensorfile_meta(tf, f->key);
        if (v != NULL && llmt_config_field_(tf, f, v, c, err, errlen) != 0) /* an optional one missing: 0 */
            return -1;
    }
    char why[512];
    if (llama_config_check(c, why, sizeof(why)) != 0)
        return set_error(err, errlen, "'%s': bad model config: %s", tf->path, why);
    return 0;
}

/* The same, exiting with the error. */
static inline LlamaConfig llama_config_from_tensorfile(const TensorFile *tf)
{
    LlamaConfig c;
    char err[2048];
    if (llama_config_from_tensorfile_try(tf, &c, err, sizeof(err)) != 0)
        FAIL("%s", err);
    return c;
}

#endif /* LLMC_LLMT_CONFIG_H */
