/*
 * hf_config.h: HF transformers' config.json of a model of this layer (llama,
 * qwen2, qwen3, mistral: llama_config.h's families), both ways.
 *
 * Written (hf_config_write_try) beside the safetensors weights, so that
 * LlamaForCausalLM.from_pretrained loads the directory; with it
 * generation_config.json (the BOS and EOS ids). Read (hf_config_read_try)
 * from any HF Llama directory: hidden_size, intermediate_size,
 * num_hidden_layers, num_attention_heads, num_key_value_heads (absent: the
 * heads), head_dim (absent or null: hidden_size / heads), vocab_size,
 * rms_norm_eps, rope_theta, the rope scaling in both spellings transformers
 * has used (rope_scaling, and rope_parameters with rope_theta inside; types
 * default and llama3 with factor, low_freq_factor, high_freq_factor and
 * original_max_position_embeddings), tie_word_embeddings (absent: false, as
 * LlamaConfig says), max_position_embeddings, initializer_range, and the BOS
 * and EOS ids (an int, a list, or null). What this model cannot compute is
 * refused with the field and its value: another model_type (MoE ones too) or
 * architecture, attention_bias true (but for qwen2, whose q, k, v biases are
 * always there) or mlp_bias true, sliding windows (use_sliding_window true, a
 * Mistral sliding_window, layer_types other than full_attention), a hidden_act other than silu, attention
 * dropout, another rope type, and sizes that are not positive integers within
 * llama_config_check's bounds. A key given twice takes its last value, as
 * Python's json (which transformers uses) reads it (json.h).
 *
 * Floats are written with the fewest digits that read back as the same float
 * (1e-05, 500000.0), so that a config written and read again is the same
 * model; hf_config_check_try compares a checkpoint's config.json with the
 * run's model field by field.
 *
 * The *_try functions return 0, or -1 with a message naming the file in err.
 * Memory: the JSON tree of the file while it is read. Plain C (POSIX);
 * compiles as C++ too.
 */
#ifndef LLMC_HF_CONFIG_H
#define LLMC_HF_CONFIG_H

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/common/fileutil.h"
#include "llmc/formats/json.h"
#include "llmc/model/llama_config.h"

/* config.json files larger than this are refused (Llama 3's is under 1 KB). */
#define HF_CONFIG_MAX_BYTES 1000000
#define HF_MAX_EOS_IDS 8

/* The special token ids a model directory names; -1 / 0: none. */
typedef struct {
    int bos_id;
    int n_eos;
    int eos_ids[HF_MAX_EOS_IDS];
} HfTokenIds;

static inline HfTokenIds hf_token_ids(int bos_id, int eos_id)
{
    HfTokenIds t;
    memset(&t, 0, sizeof(t));
    t.bos_id = bos_id;
    if (eos_id >= 0)
        t.eos_ids[t.n_eos++] = eos_id;
    return t;
}

/* x as JSON with the fewest significant digits (6 to 9) that read back as the
 * same float, as the readers here read it ((float)strtod); point: an integral
 * value gets ".0" (500000.0, as Python writes a float). */
static inline void hf_float_json_(char *out, size_t n, float x, int point)
{
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(out, n, "%.*g", digits, (double)x);
        if ((float)strtod(out, NULL) == x)
            break;
    }
    if (point && !strpbrk(out, ".eEn") && strlen(out) + 3 <= n)
        strcat(out, ".0");
}

/* The EOS ids as JSON: null, one number, or a list. */
static inline void hf_eos_json_(char *out, size_t n, const HfTokenIds *t)
{
    if (t->n_eos == 0) {
        snprintf(out, n, "null");
    } else if (t->n_eos == 1) {
        snprintf(out, n, "%d", t->eos_ids[0]);
    } else {
        size_t len = (size_t)snprintf(out, n, "[");
        for (int i = 0; i < t->n_eos && len < n; i++)
            len += (size_t)snprintf(out + len, n - len, "%s%d", i ? ", " : "", t->eos_ids[i]);
        if (len < n)
            snprintf(out + len, n - len, "]");
    }
}

/* config.json of c at path, fsync'ed; dtype: "float32" or "bfloat16", the weights'. */
static inline int hf_config_write_try(const char *path, const LlamaConfig *c, const HfTokenIds *ids, const char *dtype,
                                      char *err, size_t errlen)
{
    char buf[4096], rope[512], bos[32], eos[128], eps[32], theta[32], factor[32], low[32], high[32];
    snprintf(bos, sizeof(bos), ids->bos_id >= 0 ? "%d" : "null", ids->bos_id);
    hf_eos_json_(eos, sizeof(eos), ids);
    hf_float_json_(eps, sizeof(eps), c->norm_eps, 0);
    hf_float_json_(theta, sizeof(theta), c->rope_theta, 1);
    if (c->rope_scaling_llama3) {
        hf_float_json_(factor, sizeof(factor), c->rope_factor, 0);
        hf_float_json_(low, sizeof(low), c->rope_low_freq_factor, 0);
        hf_float_json_(high, sizeof(high), c->rope_high_freq_factor, 0);
        snprintf(rope, sizeof(rope),
                 "{\"rope_type\": \"llama3\", \"factor\": %s, \"low_freq_factor\": %s, "
                 "\"high_freq_factor\": %s, \"original_max_position_embeddings\": %d",
                 factor, low, high, c->rope_original_max_pos);
    } else {
        snprintf(rope, sizeof(rope), "{\"rope_type\": \"default\"");
    }
    int n = snprintf(buf, sizeof(buf),
                     "{\n"
                     "  \"architectures\": [\"%s\"],\n"
                     "  \"model_type\": \"%s\",\n"
                     "  \"vocab_size\": %d,\n"
                     "  \"hidden_size\": %d,\n"
                     "  \"intermediate_size\": %d,\n"
                     "  \"num_hidden_layers\": %d,\n"
                     "  \"num_attention_heads\": %d,\n"
                     "  \"num_key_value_heads\": %d,\n"
                     "  \"head_dim\": %d,\n"
                     "  \"max_position_embeddings\": %d,\n"
                     "  \"rms_norm_eps\": %s,\n"
                     "  \"rope_theta\": %s,\n"
                     "  \"rope_scaling\": %s%s,\n"
                     "  \"rope_parameters\": %s, \"rope_theta\": %s},\n"
                     "  \"tie_word_embeddings\": %s,\n"
                     "  \"hidden_act\": \"silu\",\n"
                     "  \"attention_bias\": %s,\n"
                     "%s"
                     "  \"attention_dropout\": 0.0,\n"
                     "  \"mlp_bias\": false,\n"
                     "  \"initializer_range\": %g,\n"
                     "  \"torch_dtype\": \"%s\",\n"
                     "  \"bos_token_id\": %s,\n"
                     "  \"eos_token_id\": %s\n"
                     "}\n",
                     FAMILY_ARCHITECTURE[c->family], FAMILY_MODEL_TYPE[c->family], c->vocab_size, c->d_model,
                     c->ffn_dim, c->n_layer, c->n_head, c->n_kv_head, c->head_dim, c->max_seq_len, eps, theta,
                     c->rope_scaling_llama3 ? rope : "null", c->rope_scaling_llama3 ? "}" : "", rope, theta,
                     c->tie_embeddings ? "true" : "false", c->qkv_bias ? "true" : "false",
                     c->family == FAMILY_QWEN2 || c->family == FAMILY_QWEN3 ? "  \"use_sliding_window\": false,\n"
                     : c->family == FAMILY_MISTRAL                          ? "  \"sliding_window\": null,\n"
                                                                            : "",
                     (double)c->init_std, dtype, bos, eos);
    if (n < 0 || (size_t)n >= sizeof(buf))
        return set_error(err, errlen, "config.json for '%s' does not fit its buffer", path);
    return write_file_synced(path, buf, (size_t)n, err, errlen);
}

/* generation_config.json (what transformers' generate reads): the BOS and EOS ids. */
static inline int hf_generation_config_write_try(const char *path, const HfTokenIds *ids, char *err, size_t errlen)
{
    char buf[512], bos[32], eos[128];
    snprintf(bos, sizeof(bos), ids->bos_id >= 0 ? "%d" : "null", ids->bos_id);
    hf_eos_json_(eos, sizeof(eos), ids);
    int n = snprintf(buf, sizeof(buf), "{\n  \"bos_token_id\": %s,\n  \"eos_token_id\": %s\n}\n", bos, eos);
    return write_file_synced(path, buf, (size_t)n, err, errlen);
}

/* One field of config.json, read for hf_config_read_try. */
typedef struct {
    const JsonDoc *doc;
    const JsonNode *root;
    const char *path;
    char *err;
    size_t errlen;
} HfFields;

/* An integer field in [lo, hi]; absent (or null when null_ok): *out = fallback, 1 returned. */
static inline int hf_int_(const HfFields *f, const JsonNode *obj, const char *key, int required, int lo, int hi,
                          int fallback, int *out)
{
    const JsonNode *v = json_get(f->doc, obj, key);
    if (!v || v->type == JSON_NULL) {
        if (required)
            return set_error(f->err, f->errlen, "'%s' has no '%s'", f->path, key);
        *out = fallback;
        return 0;
    }
    /* 8192.0 is an integer too: some writers put floats where ints belong */
    double x = v->type == JSON_NUMBER ? v->number : NAN;
    if (v->type != JSON_NUMBER)
        return set_error(f->err, f->errlen, "'%s': '%s' must be an integer in [%d, %d], not a %s", f->path, key, lo, hi,
                         json_type_name(v->type));
    if (!(x >= lo && x <= hi) || x != floor(x))
        return set_error(f->err, f->errlen, "'%s': '%s' = %g must be an integer in [%d, %d]", f->path, key, x, lo, hi);
    *out = (int)x;
    return 0;
}

/* A positive finite number field; absent: *out = fallback (or an error when required). */
static inline int hf_number_(const HfFields *f, const JsonNode *obj, const char *key, int required, double fallback,
                             float *out)
{
    const JsonNode *v = json_get(f->doc, obj, key);
    if (!v || v->type == JSON_NULL) {
        if (required)
            return set_error(f->err, f->errlen, "'%s' has no '%s'", f->path, key);
        *out = (float)fallback;
        return 0;
    }
    if (v->type != JSON_NUMBER || !(v->number > 0) || !isfinite((float)v->number))
        return set_error(f->err, f->errlen, "'%s': '%s' must be a positive number", f->path, key);
    *out = (float)v->number;
    return 0;
}

/* A boolean field that must be false (or absent) for this model. */
static inline int hf_must_be_false_(const HfFields *f, const char *key, const char *why)
{
    const JsonNode *v = json_get(f->doc, f->root, key);
    if (v && v->type != JSON_FALSE && v->type != JSON_NULL)
        return set_error(f->err, f->errlen, "'%s': %s = %s: %s", f->path, key,
                         v->type == JSON_TRUE ? "true" : json_type_name(v->type), why);
    return 0;
}

/* The rope settings: rope_parameters (transformers 5, rope_theta inside), else
 * rope_scaling beside a top-level rope_theta (default 10000, as LlamaConfig's). */
static inline int hf_rope_(const HfFields *f, LlamaConfig *c)
{
    const JsonNode *params = json_get(f->doc, f->root, "rope_parameters");
    if (params && params->type == JSON_NULL)
        params = NULL;
    if (params && params->type != JSON_OBJECT)
        return set_error(f->err, f->errlen, "'%s': rope_parameters must be an object or null", f->path);
    const JsonNode *scaling = params ? params : json_get(f->doc, f->root, "rope_scaling");
    const char *which = params ? "rope_parameters" : "rope_scaling";
    const JsonNode *theta_in = params && json_get(f->doc, params, "rope_theta") ? params : f->root;
    if (hf_number_(f, theta_in, "rope_theta", 0, 10000.0, &c->rope_theta) != 0)
        return -1;
    float top = 0.0f;
    if (theta_in == params && json_get(f->doc, f->root, "rope_theta")) {
        if (hf_number_(f, f->root, "rope_theta", 1, 0.0, &top) != 0)
            return -1;
        if (top != c->rope_theta)
            return set_error(f->err, f->errlen, "'%s': rope_theta %g and rope_parameters.rope_theta %g disagree",
                             f->path, (double)top, (double)c->rope_theta);
    }
    c->rope_scaling_llama3 = 0;
    if (!scaling || scaling->type == JSON_NULL)
        return 0;
    if (scaling->type != JSON_OBJECT)
        return set_error(f->err, f->errlen, "'%s': %s must be an object or null", f->path, which);
    const JsonNode *type = json_get(f->doc, scaling, "rope_type");
    if (!type)
        type = json_get(f->doc, scaling, "type"); /* the spelling of transformers before 4.45 */
    const char *name = type ? json_string(f->doc, type) : "default";
    if (!name)
        return set_error(f->err, f->errlen, "'%s': %s.rope_type must be a string", f->path, which);
    if (strcmp(name, "default") == 0)
        return 0;
    if (strcmp(name, "llama3") != 0)
        return set_error(f->err, f->errlen,
                         "'%s': %s.rope_type = \"%s\": this trainer computes \"default\" and \"llama3\" RoPE only",
                         f->path, which, name);
    c->rope_scaling_llama3 = 1;
    if (hf_number_(f, scaling, "factor", 1, 0, &c->rope_factor) != 0 ||
        hf_number_(f, scaling, "low_freq_factor", 1, 0, &c->rope_low_freq_factor) != 0 ||
        hf_number_(f, scaling, "high_freq_factor", 1, 0, &c->rope_high_freq_factor) != 0 ||
        hf_int_(f, scaling, "original_max_position_embeddings", 1, 1, LLAMA_MAX_SEQ_LEN, 0,
                &c->rope_original_max_pos) != 0)
        return -1;
    return 0;
}

/* The BOS id and the EOS ids (an int, a list of ints, or null). */
static inline int hf_token_ids_(const HfFields *f, const JsonNode *obj, HfTokenIds *ids)
{
    memset(ids, 0, sizeof(*ids));
    if (hf_int_(f, obj, "bos_token_id", 0, 0, INT32_MAX, -1, &ids->bos_id) != 0)
        return -1;
    const JsonNode *eos = json_get(f->doc, obj, "eos_token_id");
    if (!eos || eos->type == JSON_NULL)
        return 0;
    if (eos->type != JSON_ARRAY) {
        ids->n_eos = 1;
        return hf_int_(f, obj, "eos_token_id", 1, 0, INT32_MAX, -1, &ids->eos_ids[0]);
    }
    for (const JsonNode *e = json_first(f->doc, eos); e; e = json_next(f->doc, e)) {
        if (ids->n_eos == HF_MAX_EOS_IDS || e->type != JSON_NUMBER || !e->is_integer || e->integer < 0 ||
            e->integer > INT32_MAX)
            return set_error(f->err, f->errlen, "'%s': eos_token_id must be at most %d non-negative integers", f->path,
                             HF_MAX_EOS_IDS);
        ids->eos_ids[ids->n_eos++] = (int)e->integer;
    }
    return 0;
}

/* The LlamaConfig and token ids of a parsed config.json; path names it in errors. */
static inline int hf_config_from_json_(const JsonDoc *d, const char *path, LlamaConfig *c, HfTokenIds *ids, char *err,
                                       size_t errlen)
{
    HfFields f = {d, json_root(d), path, err, errlen};
    memset(c, 0, sizeof(*c));
    int rc = f.root->type == JSON_OBJECT ? 0 : set_error(err, errlen, "'%s' is not a JSON object", path);
    const JsonNode *type = rc == 0 ? json_get(d, f.root, "model_type") : NULL;
    const JsonNode *arch = rc == 0 ? json_get(d, f.root, "architectures") : NULL;
    const char *type_name = type ? json_string(d, type) : NULL;
    c->family = -1;
    for (int k = 0; type_name && k < FAMILY_COUNT; k++)
        c->family = strcmp(type_name, FAMILY_MODEL_TYPE[k]) == 0 ? k : c->family;
    if (rc == 0 && c->family < 0)
        rc = set_error(err, errlen,
                       "'%s': model_type is %s%s%s: this trainer computes the dense models llama, qwen2, qwen3 and "
                       "mistral only",
                       path, type_name ? "\"" : "", type_name ? type_name : "missing or not a string",
                       type_name ? "\"" : "");
    for (const JsonNode *a = json_first(d, arch); rc == 0 && a; a = json_next(d, a)) {
        const char *name = json_string(d, a);
        if (!name || (strcmp(name, FAMILY_ARCHITECTURE[c->family]) != 0))
            rc = set_error(err, errlen, "'%s': architectures holds %s%s%s, not %s", path, name ? "\"" : "a ",
                           name ? name : json_type_name(a->type), name ? "\"" : "", FAMILY_ARCHITECTURE[c->family]);
    }
    if (rc == 0) { /* what the family computes besides Llama's layer */
        c->qkv_bias = c->family == FAMILY_QWEN2;
        c->qk_norm = c->family == FAMILY_QWEN3;
    }
    /* sliding-window attention (Mistral v0.1's, Qwen's option) is not computed here */
    if (rc == 0)
        rc = hf_must_be_false_(&f, "use_sliding_window", "sliding-window attention is not supported");
    const JsonNode *window = rc == 0 && c->family == FAMILY_MISTRAL ? json_get(d, f.root, "sliding_window") : NULL;
    if (window && window->type != JSON_NULL)
        rc = set_error(err, errlen,
                       "'%s': sliding_window is set: sliding-window attention is not supported (Mistral "
                       "7B v0.3 has null)",
                       path);
    const JsonNode *layer_types = rc == 0 ? json_get(d, f.root, "layer_types") : NULL;
    for (const JsonNode *t = json_first(d, layer_types); rc == 0 && t; t = json_next(d, t)) {
        if (!json_string(d, t) || strcmp(json_string(d, t), "full_attention") != 0)
            rc = set_error(err, errlen, "'%s': layer_types holds %s: every layer must be full_attention here", path,
                           json_string(d, t) ? json_string(d, t) : json_type_name(t->type));
    }
    const JsonNode *act = rc == 0 ? json_get(d, f.root, "hidden_act") : NULL;
    if (rc == 0 && act && (!json_string(d, act) || strcmp(json_string(d, act), "silu") != 0))
        rc = set_error(err, errlen, "'%s': hidden_act is %s, not \"silu\": the MLP here is SwiGLU", path,
                       json_string(d, act) ? json_string(d, act) : json_type_name(act->type));
    const JsonNode *dropout = rc == 0 ? json_get(d, f.root, "attention_dropout") : NULL;
    if (rc == 0 && dropout && dropout->type != JSON_NULL && !(dropout->type == JSON_NUMBER && dropout->number == 0))
        rc = set_error(err, errlen, "'%s': attention_dropout must be 0: this trainer has no dropout", path);
    if (rc == 0 && c->family != FAMILY_QWEN2) /* Qwen2's q, k, v biases are always there, whatever the key says */
        rc = hf_must_be_false_(&f, "attention_bias", "this model has no biases in q, k, v and o_proj");
    if (rc == 0)
        rc = hf_must_be_false_(&f, "mlp_bias", "this model has no biases in the MLP");
    if (rc == 0)
        rc = hf_int_(&f, f.root, "vocab_size", 1, 1, LLAMA_MAX_VOCAB, 0, &c->vocab_size) ||
                     hf_int_(&f, f.root, "hidden_size", 1, 1, LLAMA_MAX_D_MODEL, 0, &c->d_model) ||
                     hf_int_(&f, f.root, "intermediate_size", 1, 1, LLAMA_MAX_FFN, 0, &c->ffn_dim) ||
                     hf_int_(&f, f.root, "num_hidden_layers", 1, 1, LLAMA_MAX_LAYERS, 0, &c->n_layer) ||
                     hf_int_(&f, f.root, "num_attention_heads", 1, 1, LLAMA_MAX_HEADS, 0, &c->n_head) ||
                     hf_int_(&f, f.root, "max_position_embeddings", 1, 1, LLAMA_MAX_SEQ_LEN, 0, &c->max_seq_len)
                 ? -1
                 : 0;
    if (rc == 0)
        rc = hf_int_(&f, f.root, "num_key_value_heads", 0, 1, LLAMA_MAX_HEADS, c->n_head, &c->n_kv_head) ||
                     hf_int_(&f, f.root, "head_dim", 0, 1, LLAMA_MAX_HEAD_DIM,
                             c->family == FAMILY_QWEN3 ? 128 : c->d_model / c->n_head, &c->head_dim) ||
                     hf_number_(&f, f.root, "rms_norm_eps", 0, 1e-6, &c->norm_eps) ||
                     hf_number_(&f, f.root, "initializer_range", 0, 0.02, &c->init_std) || hf_rope_(&f, c) ||
                     hf_token_ids_(&f, f.root, ids)
                 ? -1
                 : 0;
    const JsonNode *tied = rc == 0 ? json_get(d, f.root, "tie_word_embeddings") : NULL;
    if (rc == 0 && tied && tied->type != JSON_TRUE && tied->type != JSON_FALSE)
        rc = set_error(err, errlen, "'%s': tie_word_embeddings must be true or false", path);
    c->tie_embeddings = tied && tied->type == JSON_TRUE;
    char why[512];
    if (rc == 0 && llama_config_check(c, why, sizeof(why)) != 0)
        rc = set_error(err, errlen, "'%s' describes a model this trainer cannot build: %s", path, why);
    return rc;
}

/* The LlamaConfig and token ids of config.json text[0..len) (see the top). */
static inline int hf_config_parse_try(const char *text, size_t len, const char *path, LlamaConfig *c, HfTokenIds *ids,
                                      char *err, size_t errlen)
{
    JsonDoc doc;
    char why[512];
    if (json_parse(&doc, text, len, why, sizeof(why)) != 0)
        return set_error(err, errlen, "'%s' is not valid JSON: %s", path, why);
    int rc = hf_config_from_json_(&doc, path, c, ids, err, errlen);
    json_free(&doc);
    return rc;
}

/* The LlamaConfig and token ids of the config.json at path (see the top). */
static inline int hf_config_read_try(const char *path, LlamaConfig *c, HfTokenIds *ids, char *err, size_t errlen)
{
    JsonDoc doc;
    if (json_parse_file(&doc, path, HF_CONFIG_MAX_BYTES, err, errlen) != 0)
        return -1;
    int rc = hf_config_from_json_(&doc, path, c, ids, err, errlen);
    json_free(&doc);
    return rc;
}

/* What the model of config.json (got) and the run's (want) have for every
 * field that changes the model (llama_config.h's table, in its order; the
 * rope scaling's parameters only where it is on): 0, or -1 with the first that
 * differs, by its config.json name, and both values. init_std is not one: it
 * only draws the first weights. */
static inline int hf_config_compare_(const char *path, const LlamaConfig *got, const LlamaConfig *want, char *err,
                                     size_t errlen)
{
    for (int i = 0; i < LLAMA_CONFIG_N_FIELDS; i++) {
        const ConfigField *f = &LLAMA_CONFIG_FIELDS[i];
        double g = config_field_get(got, f), w = config_field_get(want, f);
        if (!f->shapes || (f->scaled && !got->rope_scaling_llama3) || g == w)
            continue;
        char a[32], b[32];
        if (f->kind == CONFIG_FLOAT) {
            hf_float_json_(a, sizeof(a), (float)g, 0);
            hf_float_json_(b, sizeof(b), (float)w, 0);
        } else if (f->kind == CONFIG_FLAG || f->kind == CONFIG_ROPE_KIND) {
            const char *off = f->kind == CONFIG_FLAG ? "false" : "none",
                       *on = f->kind == CONFIG_FLAG ? "true" : "llama3";
            snprintf(a, sizeof(a), "%s", g != 0 ? on : off);
            snprintf(b, sizeof(b), "%s", w != 0 ? on : off);
        } else {
            snprintf(a, sizeof(a), "%d", (int)g);
            snprintf(b, sizeof(b), "%d", (int)w);
        }
        return set_error(err, errlen,
                         "'%s' has %s = %s but this run's model has %s\n"
                         "  hint: resume with the model flags the checkpoint was saved with (its config.json)",
                         path, f->hf_key, a, b);
    }
    return 0;
}

/* Checks that the config.json text[0..len) (path names it) describes the model
 * c: every field that changes the model (hf_config_compare_). */
static inline int hf_config_check_text_try(const char *text, size_t len, const char *path, const LlamaConfig *c,
                                           char *err, size_t errlen)
{
    LlamaConfig got;
    HfTokenIds ids;
    if (hf_config_parse_try(text, len, path, &got, &ids, err, errlen) != 0)
        return -1;
    return hf_config_compare_(path, &got, c, err, errlen);
}

/* Checks that config.json at path describes the model c (hf_config_check_text_try). */
static inline int hf_config_check_try(const char *path, const LlamaConfig *c, char *err, size_t errlen)
{
    LlamaConfig got;
    HfTokenIds ids;
    if (hf_config_read_try(path, &got, &ids, err, errlen) != 0)
        return -1;
    return hf_config_compare_(path, &got, c, err, errlen);
}

#endif /* LLMC_HF_CONFIG_H */
