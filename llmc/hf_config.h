/*
 * hf_config.h: HF transformers' config.json of a LlamaConfig: written beside
 * the safetensors weights so that LlamaForCausalLM.from_pretrained loads the
 * directory, and checked against the run's model when a checkpoint is loaded.
 * The *_try functions return 0, or -1 with a message naming the file in err.
 * Plain C (POSIX); compiles as C++ too.
 */
#ifndef LLMC_HF_CONFIG_H
#define LLMC_HF_CONFIG_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileutil.h"
#include "json.h"
#include "llama_config.h"

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

#endif /* LLMC_HF_CONFIG_H */
