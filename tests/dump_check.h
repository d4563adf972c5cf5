/*
 * dump_check.h: comparing a trainer with the PyTorch reference dumps of
 * reference/make_reference.py (testdata/NAME.dump.llmt beside the weights
 * NAME.weights.llmt it was made from; docs/tensor_file_format.md), shared by
 * test_llama_ref.c (CPU) and test_llama.cu (GPU): the weights file of a dump,
 * a dump's metadata numbers, and one check of a computed tensor against the
 * dump's (tests/check.h's check_rel). Reads only the files it is given.
 */
#ifndef TESTS_DUMP_CHECK_H
#define TESTS_DUMP_CHECK_H

#include <stdlib.h>
#include <string.h>

#include "llmc/model/llama_config.h"
#include "llmc/formats/llmt_config.h"
#include "llmc/formats/tensorfile.h"
#include "llmc/run/schedule.h"
#include "llmc/common/utils.h"
#include "tests/check.h"

/* The dumps test_llama and test_llama_ref check when given none, besides the packed-documents dump
 * (testdata/packed_docs_gqa.dump.llmt), which each runs after these. */
static const char *const DEFAULT_DUMPS[] = {"testdata/tiny_gqa_tied.dump.llmt",
                                            "testdata/small_mha_untied_rope31.dump.llmt"};
#define N_DEFAULT_DUMPS 2
/* The other model families (llmc/model/llama_config.h): Mistral (Llama's layer), Qwen2 (q, k, v biases) and
 * Qwen3 (q/k norms, head_dim 24 != d_model / n_head). */
static const char *const FAMILY_DUMPS[] = {"testdata/mistral_tiny.dump.llmt", "testdata/qwen2_tiny_bias.dump.llmt",
                                           "testdata/qwen3_tiny_qknorm.dump.llmt"};
#define N_FAMILY_DUMPS 3

/* The weights file that a dump was made from: X.dump.llmt -> X.weights.llmt. */
static inline void dump_weights_path(const char *dump_path, char *out, size_t outlen)
{
    const char *suffix = ".dump.llmt";
    size_t n = strlen(dump_path), k = strlen(suffix);
    if (n < k || strcmp(dump_path + n - k, suffix) != 0)
        FAIL("'%s' does not end in %s, so its weights file cannot be named\n"
             "  hint: pass dumps named like testdata/NAME.dump.llmt",
             dump_path, suffix);
    snprintf(out, outlen, "%.*s.weights.llmt", (int)(n - k), dump_path);
}

static inline double dump_meta_double(const TensorFile *tf, const char *key)
{
    const char *v = tensorfile_meta(tf, key);
    if (v == NULL)
        FAIL("'%s' has no metadata key '%s'; regenerate it with reference/make_reference.py", tf->path, key);
    return strtod(v, NULL);
}

/* The AdamW settings torch stepped the dump with (its optim.* metadata), doubles as torch's. */
static inline AdamWConfig dump_adamw_config(const TensorFile *dump)
{
    AdamWConfig opt = {.lr = dump_meta_double(dump, "optim.lr"),
                       .beta1 = dump_meta_double(dump, "optim.beta1"),
                       .beta2 = dump_meta_double(dump, "optim.beta2"),
                       .eps = dump_meta_double(dump, "optim.eps"),
                       .weight_decay = dump_meta_double(dump, "optim.weight_decay"),
                       .grad_clip = dump_meta_double(dump, "optim.grad_clip")};
    return opt;
}

/* 0 if every config.* key of a (weights file) is in b (a dump, or another
 * weights file) with the same value, else -1 and a message naming the files.
 * The tests check that a dump and the weights file beside it belong together. */
static inline int config_meta_match_try(const TensorFile *a, const TensorFile *b, char *err, size_t errlen)
{
    for (int i = 0; i < LLAMA_CONFIG_N_FIELDS; i++) {
        const char *key = LLAMA_CONFIG_FIELDS[i].key;
        const char *va = tensorfile_meta(a, key), *vb = tensorfile_meta(b, key);
        if (LLAMA_CONFIG_FIELDS[i].optional && va == NULL && vb == NULL)
            continue; /* files from before the field: both Llama's */
        const TensorFile *lacking = va == NULL ? a : vb == NULL ? b : NULL;
        if (lacking) {
            snprintf(err, errlen, "'%s' has no metadata key '%s'; regenerate it with reference/make_reference.py",
                     lacking->path, key);
            return -1;
        }
        /* numbers compare by value, so that 8 and 8.0 agree */
        char *end_a, *end_b;
        double da = strtod(va, &end_a), db = strtod(vb, &end_b);
        int same = strcmp(va, vb) == 0 || (*va && *vb && *end_a == '\0' && *end_b == '\0' && da == db);
        if (!same) {
            snprintf(err, errlen,
                     "'%s' and '%s' disagree on %s ('%s' vs '%s'): they describe different models\n"
                     "  hint: pass the weights file that the dump was made from",
                     a->path, b->path, key, va, vb);
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* the command-line trainer                                                   */
/* got[n] against the dump's tensor `name` within tol; *worst keeps the largest error. */
static inline int check_dump(TensorFile *dump, const char *name, const float *got, int64_t n, double tol, double *worst)
{
    float *ref = tensorfile_load_f32(dump, name, n);
    int ok = check_rel(name, got, ref, n, tol, worst);
    free(ref);
    return ok;
}

#endif /* TESTS_DUMP_CHECK_H */
