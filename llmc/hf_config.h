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

/* config.json files larger than this are refused (Llama 3's is under 1 KB). */
#define HF_CONFIG_MAX_BYTES 1000000

/* config.json of c at path, fsync'ed. */
static inline int hf_config_write_try(const char *path, const LlamaConfig *c, char *err, size_t errlen)
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
    if (n < 0 || (size_t)n >= sizeof(buf))
        return set_error(err, errlen, "config.json for '%s' does not fit its buffer", path);
    return write_file_synced(path, buf, (size_t)n, err, errlen);
}

/* Checks that config.json at path describes the model c: its shape fields. */
static inline int hf_config_check_try(const char *path, const LlamaConfig *c, char *err, size_t errlen)
{
    static const char *keys[] = {"vocab_size",        "hidden_size",         "intermediate_size",
                                 "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                 "head_dim",          "tie_word_embeddings"};
    double want[] = {(double)c->vocab_size, (double)c->d_model,   (double)c->ffn_dim,  (double)c->n_layer,
                     (double)c->n_head,     (double)c->n_kv_head, (double)c->head_dim, (double)c->tie_embeddings};
    JsonDoc doc;
    if (json_parse_file(&doc, path, HF_CONFIG_MAX_BYTES, err, errlen) != 0)
        return -1;
    const JsonNode *root = json_root(&doc);
    int rc = root->type == JSON_OBJECT ? 0 : set_error(err, errlen, "'%s' is not a JSON object", path);
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]) && rc == 0; i++) {
        const JsonNode *v = json_get(&doc, root, keys[i]);
        double got = !v ? 0.0 : v->type == JSON_TRUE ? 1.0 : v->type == JSON_FALSE ? 0.0 : v->number;
        if (!v)
            rc = set_error(err, errlen, "'%s' has no '%s'", path, keys[i]);
        else if (v->type != JSON_NUMBER && v->type != JSON_TRUE && v->type != JSON_FALSE)
            rc = set_error(err, errlen, "'%s': '%s' is a %s, not a number", path, keys[i], json_type_name(v->type));
        else if (got != want[i])
            rc = set_error(err, errlen,
                           "'%s' has %s = %g but this run's model has %g\n"
                           "  hint: resume with the same model flags as the checkpoint",
                           path, keys[i], got, want[i]);
    }
    json_free(&doc);
    return rc;
}

#endif /* LLMC_HF_CONFIG_H */
