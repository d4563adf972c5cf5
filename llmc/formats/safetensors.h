/*
 * safetensors.h: weights as HF safetensors files: u64 little-endian header
 * length n, n bytes of JSON header, then the data. The header maps each tensor
 * name to {"dtype": ..., "shape": [...], "data_offsets": [begin, end]} (bytes
 * from the data start), plus an optional "__metadata__" object of strings.
 *
 * Writing (safetensors_write_params_try): the flat fp32 parameters of a
 * ParamLayout, by HF name, "F32", row-major, in layout order, the header
 * space-padded to a multiple of 8 and "__metadata__": {"format": "pt"}; a tied
 * model has no lm_head.weight, as HF writes it.
 *
 * Reading (safetensors_open): the header is checked as the format requires
 * before anything else is read: a JSON object whose tensors have a dtype
 * string, a shape of non-negative integers and data_offsets [begin, end] with
 * end - begin = the shape's elements times the dtype's size (for the dtypes
 * this file knows), no name twice, and the tensors, sorted by offset, tiling
 * the data exactly (no hole, no overlap) up to the end of the file.
 * safetensors_load_params_try then reads every tensor of a ParamLayout into
 * flat fp32 parameters, checking its dtype and shape.
 *
 * The *_try functions and safetensors_open return 0, or -1 with a message
 * naming the file in err. Memory: the header text and one entry per tensor
 * while open; the data is read straight into the caller's buffer.
 * Plain C (POSIX); compiles as C++ too.
 */
#ifndef LLMC_SAFETENSORS_H
#define LLMC_SAFETENSORS_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/common/fileutil.h"
#include "llmc/formats/json.h"
#include "llmc/model/param_layout.h"

/* Headers larger than this are refused (an 8B model's is about 30 KB). */
#define SAFETENSORS_MAX_HEADER ((uint64_t)100000000)
#define SAFETENSORS_MAX_DIMS 8

typedef struct {
    char name[256];
    char dtype[16];
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    int64_t numel;
    int64_t begin, end; /* bytes from the data start */
} SafetensorsTensor;

typedef struct {
    char path[LLMC_PATH_MAX];
    FILE *f;
    int64_t file_size, data_start;
    int n_tensors;
    SafetensorsTensor *tensors;
    int64_t step; /* __metadata__'s "step" (this project's checkpoints write it), -1 if none */
} SafetensorsFile;

/* Bytes per element of a dtype, 0 for a dtype this file does not know. */
static inline int safetensors_dtype_size(const char *dtype)
{
    static const struct {
        const char *name;
        int size;
    } sizes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},     {"I32", 4},
                 {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        if (strcmp(dtype, sizes[i].name) == 0)
            return sizes[i].size;
    }
    return 0;
}

static inline void safetensors_close(SafetensorsFile *sf)
{
    if (sf->f)
        fclose(sf->f);
    free(sf->tensors);
    sf->f = NULL;
    sf->tensors = NULL;
    sf->n_tensors = 0;
}

static inline int safetensors_by_offset_(const void *a, const void *b)
{
    const SafetensorsTensor *x = (const SafetensorsTensor *)a, *y = (const SafetensorsTensor *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

/* One tensor's header entry into t; a message (without the file name) in why otherwise. */
static inline int safetensors_entry_(const JsonDoc *doc, const JsonNode *entry, SafetensorsTensor *t, char *why,
                                     size_t whylen)
{
    const JsonNode *dtype = json_get(doc, entry, "dtype"), *shape = json_get(doc, entry, "shape");
    const JsonNode *offsets = json_get(doc, entry, "data_offsets");
    if (entry->type != JSON_OBJECT || !dtype || !shape || !offsets)
        return set_error(why, whylen, "is not an object with dtype, shape and data_offsets");
    if (dtype->type != JSON_STRING || dtype->len >= (int32_t)sizeof(t->dtype))
        return set_error(why, whylen, "has a dtype that is not a short string");
    snprintf(t->dtype, sizeof(t->dtype), "%s", json_string(doc, dtype));
    if (shape->type != JSON_ARRAY || shape->count > SAFETENSORS_MAX_DIMS)
        return set_error(why, whylen, "has a shape that is not an array of at most %d sizes", SAFETENSORS_MAX_DIMS);
    t->ndim = 0;
    t->numel = 1;
    for (const JsonNode *d = json_first(doc, shape); d; d = json_next(doc, d)) {
        /* sizes below 2^40 and a product below 2^62: no overflow when multiplied by the element size */
        if (d->type != JSON_NUMBER || !d->is_integer || d->integer < 0 || d->integer > ((int64_t)1 << 40))
            return set_error(why, whylen, "has a shape entry that is not an integer in [0, 2^40]");
        t->shape[t->ndim++] = d->integer;
        if (d->integer > 0 && t->numel > (((int64_t)1 << 62) / d->integer))
            return set_error(why, whylen, "has a shape of more than 2^62 elements");
        t->numel *= d->integer;
    }
    const JsonNode *b = json_first(doc, offsets), *e = json_next(doc, b);
    if (offsets->type != JSON_ARRAY || offsets->count != 2 || b->type != JSON_NUMBER || !b->is_integer ||
        e->type != JSON_NUMBER || !e->is_integer || b->integer < 0 || e->integer < b->integer)
        return set_error(why, whylen, "has data_offsets that are not two integers 0 <= begin <= end");
    t->begin = b->integer;
    t->end = e->integer;
    int size = safetensors_dtype_size(t->dtype);
    if (size > 0 && t->end - t->begin != t->numel * size)
        return set_error(why, whylen, "spans %lld bytes, its shape and dtype %s need %lld",
                         (long long)(t->end - t->begin), t->dtype, (long long)(t->numel * size));
    return 0;
}

/* The tensors of a header (the JSON text [0, hlen)), checked, into sf. */
static inline int safetensors_parse_header_(SafetensorsFile *sf, const char *text, uint64_t hlen, char *err,
                                            size_t errlen)
{
    JsonDoc doc;
    char why[512];
    if (json_parse(&doc, text, (size_t)hlen, why, sizeof(why)) != 0)
        return set_error(err, errlen, "'%s': the safetensors header is not valid JSON (%s)", sf->path, why);
    int rc = 0;
    const JsonNode *root = json_root(&doc);
    const char *dup = json_duplicate_key(&doc, root);
    if (root->type != JSON_OBJECT)
        rc = set_error(err, errlen, "'%s': the safetensors header is not a JSON object (corrupt)", sf->path);
    else if (dup)
        rc = set_error(err, errlen, "'%s': the safetensors header names tensor '%s' twice (corrupt)", sf->path, dup);
    if (rc == 0)
        sf->tensors =
            (SafetensorsTensor *)calloc_check((size_t)root->count + 1, sizeof(SafetensorsTensor), "safetensors header");
    for (const JsonNode *m = json_first(&doc, root); m && rc == 0; m = json_next(&doc, m)) {
        const char *name = json_key(&doc, m);
        if (strcmp(name, "__metadata__") == 0) {
            const char *step = json_string(&doc, json_get(&doc, m, "step"));
            char *end;
            if (step && step[0] >= '0' && step[0] <= '9') {
                long long v = strtoll(step, &end, 10);
                sf->step = *end == '\0' && v >= 0 ? v : -1;
            }
            continue;
        }
        SafetensorsTensor *t = &sf->tensors[sf->n_tensors];
        if (strlen(name) >= sizeof(t->name))
            rc = set_error(err, errlen, "'%s': a tensor name of %zu bytes is too long", sf->path, strlen(name));
        else if (safetensors_entry_(&doc, m, t, why, sizeof(why)) != 0)
            rc = set_error(err, errlen, "'%s': tensor '%s' %s (corrupt)", sf->path, name, why);
        else
            snprintf(t->name, sizeof(t->name), "%s", name);
        sf->n_tensors++;
    }
    json_free(&doc);
    return rc;
}

/* Opens the safetensors file at path and checks its header (see the top). */
static inline int safetensors_open(SafetensorsFile *sf, const char *path, char *err, size_t errlen)
{
    memset(sf, 0, sizeof(*sf));
    sf->step = -1;
    if (path_format(sf->path, sizeof(sf->path), "%s", path) != 0)
        return set_error(err, errlen, "the path '%.100s...' is too long", path);
    sf->f = open_regular_file(path, &sf->file_size, err, errlen);
    if (!sf->f)
        return -1;
    unsigned char n8[8];
    if (sf->file_size < 8 || fread(n8, 1, 8, sf->f) != 8) {
        safetensors_close(sf);
        return set_error(err, errlen, "'%s' is too short to be a safetensors file", path);
    }
    uint64_t hlen = get_u64le(n8);
    if (hlen < 2 || hlen > SAFETENSORS_MAX_HEADER || (int64_t)hlen > sf->file_size - 8) {
        safetensors_close(sf);
        return set_error(err, errlen,
                         "'%s': bad safetensors header length %llu for a file of %lld bytes "
                         "(truncated or corrupt)",
                         path, (unsigned long long)hlen, (long long)sf->file_size);
    }
    char *text = (char *)malloc_check((size_t)hlen, "safetensors header");
    int rc = fread(text, 1, (size_t)hlen, sf->f) == (size_t)hlen
                 ? safetensors_parse_header_(sf, text, hlen, err, errlen)
                 : set_error(err, errlen, "'%s': short read of the header", path);
    free(text);
    sf->data_start = 8 + (int64_t)hlen;
    /* the tensors tile the data: sorted by offset, each begins where the last ended */
    int64_t end = 0;
    if (rc == 0) {
        SafetensorsTensor *sorted = (SafetensorsTensor *)malloc_check(
            sizeof(SafetensorsTensor) * (size_t)(sf->n_tensors + 1), "safetensors header");
        memcpy(sorted, sf->tensors, sizeof(SafetensorsTensor) * (size_t)sf->n_tensors);
        qsort(sorted, (size_t)sf->n_tensors, sizeof(SafetensorsTensor), safetensors_by_offset_);
        for (int i = 0; i < sf->n_tensors && rc == 0; i++) {
            if (sorted[i].begin != end)
                rc = set_error(err, errlen,
                               "'%s': tensor '%s' starts at byte %lld of the data, not at %lld where "
                               "the one before it ends (overlapping or with a hole: corrupt)",
                               path, sorted[i].name, (long long)sorted[i].begin, (long long)end);
            end = sorted[i].end;
        }
        free(sorted);
    }
    if (rc == 0 && sf->data_start + end != sf->file_size)
        rc = set_error(err, errlen, "'%s' is %lld bytes but its header describes %lld (truncated or corrupt)", path,
                       (long long)sf->file_size, (long long)(sf->data_start + end));
    if (rc != 0)
        safetensors_close(sf);
    return rc;
}

static inline const SafetensorsTensor *safetensors_find(const SafetensorsFile *sf, const char *name)
{
    for (int i = 0; i < sf->n_tensors; i++) {
        if (strcmp(sf->tensors[i].name, name) == 0)
            return &sf->tensors[i];
    }
    return NULL;
}

/* An IEEE half as a float, exactly (subnormals, infinities and NaN included). */
static inline float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff, bits;
    if (exponent == 31) {
        bits = sign | 0x7f800000u | mantissa << 13;
    } else if (exponent != 0) {
        bits = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
    } else if (mantissa == 0) {
        bits = sign;
    } else { /* subnormal: mantissa * 2^-24, normalised */
        int shifts = 0;
        while (!(mantissa & 0x400)) {
            mantissa <<= 1;
            shifts++;
        }
        bits = sign | (uint32_t)(127 - 14 - shifts) << 23 | (mantissa & 0x3ff) << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* A float as the nearest bf16 (ties to even, NaN kept a NaN), as torch's .to(torch.bfloat16). */
static inline uint16_t float_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Whether safetensors_read_f32 reads this dtype. */
static inline int safetensors_dtype_readable(const char *dtype)
{
    return strcmp(dtype, "F32") == 0 || strcmp(dtype, "BF16") == 0 || strcmp(dtype, "F16") == 0;
}

/* Reads a tensor's numel values into out as floats: F32 as they are, BF16 and
 * F16 converted exactly (every one of their values is a float). */
static inline int safetensors_read_f32(SafetensorsFile *sf, const SafetensorsTensor *t, float *out, char *err,
                                       size_t errlen)
{
    if (!safetensors_dtype_readable(t->dtype))
        return set_error(err, errlen, "'%s': tensor '%s' is %s; this trainer reads F32, BF16 and F16", sf->path,
                         t->name, t->dtype);
    if (fseeko(sf->f, (off_t)(sf->data_start + t->begin), SEEK_SET) != 0)
        return set_error(err, errlen, "'%s': cannot seek to tensor '%s'", sf->path, t->name);
    if (strcmp(t->dtype, "F32") == 0) {
        if (fread(out, sizeof(float), (size_t)t->numel, sf->f) != (size_t)t->numel)
            return set_error(err, errlen, "'%s': short read of tensor '%s' (truncated?)", sf->path, t->name);
        return 0;
    }
    enum { BLOCK = 1 << 20 };
    uint16_t *raw = (uint16_t *)malloc_check(sizeof(uint16_t) * BLOCK, "safetensors read buffer");
    int bf16 = strcmp(t->dtype, "BF16") == 0, rc = 0;
    for (int64_t at = 0; at < t->numel && rc == 0; at += BLOCK) {
        size_t n = (size_t)(t->numel - at < BLOCK ? t->numel - at : BLOCK);
        if (fread(raw, sizeof(uint16_t), n, sf->f) != n) {
            rc = set_error(err, errlen, "'%s': short read of tensor '%s' (truncated?)", sf->path, t->name);
            break;
        }
        for (size_t i = 0; i < n; i++) {
            if (bf16) {
                uint32_t bits = (uint32_t)raw[i] << 16;
                memcpy(&out[at + (int64_t)i], &bits, 4);
            } else {
                out[at + (int64_t)i] = half_to_float(raw[i]);
            }
        }
    }
    free(raw);
    return rc;
}

/* Every tensor of layout from the safetensors file at path into params
 * (layout->total floats), by HF name, with its shape checked; *step (may be
 * NULL): the step its metadata names, -1 if none. */
static inline int safetensors_load_params_try(const char *path, const ParamLayout *layout, float *params, int64_t *step,
                                              char *err, size_t errlen)
{
    SafetensorsFile sf;
    if (safetensors_open(&sf, path, err, errlen) != 0)
        return -1;
    if (step)
        *step = sf.step;
    int rc = 0;
    for (int i = 0; i < layout->n_tensors && rc == 0; i++) {
        const ParamTensor *p = &layout->tensors[i];
        const SafetensorsTensor *t = safetensors_find(&sf, p->name);
        int want_ndim = p->cols == 1 ? 1 : 2;
        if (!t) {
            rc = set_error(err, errlen, "'%s' has no tensor '%s' (does the checkpoint belong to this model?)", path,
                           p->name);
        } else if (t->ndim != want_ndim || t->shape[0] != p->rows || (want_ndim == 2 && t->shape[1] != p->cols)) {
            char got[160] = "";
            for (int d = 0; d < t->ndim; d++)
                snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%lld", d ? ", " : "", (long long)t->shape[d]);
            rc = set_error(err, errlen,
                           "'%s': tensor '%s' has shape [%s], this model's is [%lld%s%lld] "
                           "(does the checkpoint belong to this model?)",
                           path, p->name, got, (long long)p->rows, want_ndim == 2 ? ", " : "",
                           want_ndim == 2 ? (long long)p->cols : 0LL);
        } else {
            rc = safetensors_read_f32(&sf, t, params + p->offset, err, errlen);
        }
    }
    safetensors_close(&sf);
    return rc;
}

/* Writes the flat fp32 parameters of layout (layout->total floats) to path as
 * F32, or as BF16 (rounded to nearest even) when bf16; step >= 0 goes into the
 * metadata (checkpoints); fsync'ed. */
static inline int safetensors_write_params_try(const char *path, const ParamLayout *layout, const float *params,
                                               int bf16, int64_t step, char *err, size_t errlen)
{
    int size = bf16 ? 2 : 4;
    size_t cap = 256 + (size_t)layout->n_tensors * 256, len = 0;
    char *hdr = (char *)malloc_check(cap, "safetensors header");
    char step_json[48] = "";
    if (step >= 0)
        snprintf(step_json, sizeof(step_json), ",\"step\":\"%lld\"", (long long)step);
    len += (size_t)snprintf(hdr + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"%s}", step_json);
    for (int i = 0; i < layout->n_tensors; i++) {
        const ParamTensor *t = &layout->tensors[i];
        char shape[64];
        if (t->cols == 1)
            snprintf(shape, sizeof(shape), "%lld", (long long)t->rows);
        else
            snprintf(shape, sizeof(shape), "%lld,%lld", (long long)t->rows, (long long)t->cols);
        len += (size_t)snprintf(
            hdr + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%lld,%lld]}", t->name,
            bf16 ? "BF16" : "F32", shape, (long long)t->offset * size, (long long)(t->offset + t->numel) * size);
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8 != 0)
        hdr[len++] = ' ';
    unsigned char n8[8];
    put_u64le(n8, (uint64_t)len);
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        return set_error(err, errlen, "cannot create '%s': %s", path, strerror(errno));
    }
    int ok = fwrite(n8, 1, 8, f) == 8 && fwrite(hdr, 1, len, f) == len;
    if (!bf16) {
        ok = ok && fwrite(params, sizeof(float), (size_t)layout->total, f) == (size_t)layout->total;
    } else {
        enum { BLOCK = 1 << 20 };
        uint16_t *out = (uint16_t *)malloc_check(sizeof(uint16_t) * BLOCK, "bf16 export buffer");
        for (int64_t at = 0; at < layout->total && ok; at += BLOCK) {
            size_t n = (size_t)(layout->total - at < BLOCK ? layout->total - at : BLOCK);
            for (size_t i = 0; i < n; i++)
                out[i] = float_to_bf16(params[at + (int64_t)i]);
            ok = fwrite(out, sizeof(uint16_t), n, f) == n;
        }
        free(out);
    }
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    ok = (fclose(f) == 0) && ok;
    free(hdr);
    if (!ok)
        return set_error(err, errlen, "cannot write '%s': %s\n  hint: is the disk full?", path, strerror(saved));
    return 0;
}

#endif /* LLMC_SAFETENSORS_H */
