/*
 * safetensors.h: the weights as HF safetensors: u64 little-endian header
 * length n, n bytes of JSON header (space padded to a multiple of 8), then the
 * data. The header maps each HF name (ParamLayout) to {"dtype":"F32",
 * "shape":[...],"data_offsets":[begin,end]} (bytes, relative to the data
 * start), plus "__metadata__":{"format":"pt"}. Written fp32, row-major, in
 * layout order; a tied model has no lm_head.weight, as HF writes it.
 *
 * Loading checks every tensor's dtype, shape and offsets and the file size.
 * The *_try functions return 0, or -1 with a message naming the file in err.
 * Plain C (POSIX); compiles as C++ too.
 */
#ifndef LLMC_SAFETENSORS_H
#define LLMC_SAFETENSORS_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileutil.h"
#include "json.h"
#include "llama_config.h"

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

#endif /* LLMC_SAFETENSORS_H */
