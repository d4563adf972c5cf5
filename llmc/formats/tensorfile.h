/*
 * tensorfile.h: reader of the .llmt tensor files (docs/tensor_file_format.md)
 * that hold model weights and the PyTorch reference dumps.
 *
 * tensorfile_open() reads and validates the header and the whole index (the
 * metadata strings and the tensor table) into host memory and keeps the FILE
 * open; tensor data is read on demand with tensorfile_read(), straight into
 * the caller's buffer. Every size and offset is 64-bit.
 *
 * The *_try functions return 0 on success and otherwise write a message that
 * names the file into err, so tests can check the error paths; the plain
 * functions print that message and exit(1).
 */
#ifndef LLMC_TENSORFILE_H
#define LLMC_TENSORFILE_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/common/fileutil.h"
#include "llmc/common/utils.h"

#define TENSORFILE_MAGIC "LLMTENS"
#define TENSORFILE_VERSION 1
#define TENSORFILE_MAX_DIMS 8

enum { TF_FLOAT32 = 1, TF_INT32 = 2, TF_BFLOAT16 = 3 };

typedef struct {
    char *name;
    int dtype;
    int ndim;
    int64_t shape[TENSORFILE_MAX_DIMS];
    int64_t numel;
    int64_t offset; /* absolute, in the file */
    int64_t nbytes;
} TensorEntry;

typedef struct {
    char path[1024];
    FILE *file;
    int n_meta;
    char **meta_keys;
    char **meta_values;
    int n_tensors;
    TensorEntry *tensors;
    char *index; /* owns the strings that the pointers above point into */
} TensorFile;

static inline int tensorfile_dtype_size(int dtype)
{
    switch (dtype) {
    case TF_FLOAT32:
        return 4;
    case TF_INT32:
        return 4;
    case TF_BFLOAT16:
        return 2;
    default:
        return 0;
    }
}

static inline uint32_t tf_u32(const char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t tf_u64(const char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Cursor over the index; every take checks that it stays inside the index. */
typedef struct {
    char *data;
    uint64_t pos, end;
} TfCursor;

static inline int tf_take(TfCursor *c, uint64_t n, char **out)
{
    if (c->pos + n > c->end || c->pos + n < c->pos)
        return -1;
    *out = c->data + c->pos;
    c->pos += n;
    return 0;
}

/* Strings in the index are length-prefixed, not terminated: each is moved one
 * byte to the left over its own length prefix and terminated in place. */
static inline int tf_take_string(TfCursor *c, char **out)
{
    char *p;
    if (tf_take(c, 4, &p))
        return -1;
    uint32_t len = tf_u32(p);
    char *s;
    if (tf_take(c, len, &s))
        return -1;
    memmove(p, s, len);
    p[len] = '\0';
    if (strlen(p) != len)
        return -1; /* embedded zero byte */
    *out = p;
    return 0;
}

static inline void tensorfile_close(TensorFile *tf)
{
    if (tf->file)
        fclose(tf->file);
    free(tf->meta_keys);
    free(tf->meta_values);
    free(tf->tensors);
    free(tf->index);
    memset(tf, 0, sizeof(*tf));
}

/* Closes tf, formats the message into err, returns -1. */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static inline int
tf_fail_(TensorFile *tf, char *err, size_t errlen, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(err, errlen, fmt, args);
    va_end(args);
    tensorfile_close(tf);
    return -1;
}

static inline int tf_by_offset_(const void *a, const void *b)
{
    const TensorEntry *x = *(const TensorEntry *const *)a, *y = *(const TensorEntry *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* One tensor entry at the cursor into t; its data must lie in [0, data_bytes), 64-aligned. */
static inline int tf_read_entry_(TfCursor *c, TensorEntry *t, uint64_t data_offset, uint64_t data_bytes,
                                 const char *path, uint32_t i, char *err, size_t errlen)
{
    char *p;
    if (tf_take_string(c, &t->name) || tf_take(c, 8, &p))
        return set_error(err, errlen, "'%s': tensor entry %u runs past the index (corrupt file)", path, i);
    t->dtype = (int)tf_u32(p);
    uint32_t ndim = tf_u32(p + 4);
    if (tensorfile_dtype_size(t->dtype) == 0 || ndim > TENSORFILE_MAX_DIMS)
        return set_error(err, errlen, "'%s': tensor '%s' has unknown dtype %d or %u dimensions", path, t->name,
                         t->dtype, ndim);
    t->ndim = (int)ndim;
    t->numel = 1;
    for (uint32_t d = 0; d < ndim; d++) {
        if (tf_take(c, 8, &p))
            return set_error(err, errlen, "'%s': tensor entry '%s' runs past the index", path, t->name);
        t->shape[d] = (int64_t)tf_u64(p);
        if (t->shape[d] < 0 || (t->shape[d] > 0 && t->numel > INT64_MAX / 8 / t->shape[d]))
            return set_error(err, errlen, "'%s': tensor '%s' has an impossible shape", path, t->name);
        t->numel *= t->shape[d];
    }
    if (tf_take(c, 16, &p))
        return set_error(err, errlen, "'%s': tensor entry '%s' runs past the index", path, t->name);
    uint64_t offset = tf_u64(p), nbytes = tf_u64(p + 8);
    if (nbytes != (uint64_t)t->numel * (uint64_t)tensorfile_dtype_size(t->dtype))
        return set_error(err, errlen, "'%s': tensor '%s' holds %llu bytes but its shape needs %llu", path, t->name,
                         (unsigned long long)nbytes, (unsigned long long)t->numel * tensorfile_dtype_size(t->dtype));
    if (offset > data_bytes || nbytes > data_bytes - offset)
        return set_error(err, errlen, "'%s': tensor '%s' runs past the end of the data (truncated or corrupt)", path,
                         t->name);
    if (offset % 64 != 0)
        return set_error(err, errlen, "'%s': tensor '%s' starts at data byte %llu, not a multiple of 64 (corrupt)",
                         path, t->name, (unsigned long long)offset);
    t->offset = (int64_t)(data_offset + offset);
    t->nbytes = (int64_t)nbytes;
    return 0;
}

/* No two tensors' bytes overlap. */
static inline int tf_check_overlap_(TensorFile *tf, char *err, size_t errlen)
{
    const TensorEntry **sorted =
        (const TensorEntry **)malloc_check(sizeof(TensorEntry *) * (size_t)(tf->n_tensors + 1), "tensor table");
    for (int i = 0; i < tf->n_tensors; i++)
        sorted[i] = &tf->tensors[i];
    qsort(sorted, (size_t)tf->n_tensors, sizeof(TensorEntry *), tf_by_offset_);
    int rc = 0;
    for (int i = 1; i < tf->n_tensors && rc == 0; i++) {
        if (sorted[i - 1]->offset + sorted[i - 1]->nbytes > sorted[i]->offset)
            rc = set_error(err, errlen, "'%s': tensors '%s' and '%s' overlap (corrupt)", tf->path, sorted[i - 1]->name,
                           sorted[i]->name);
    }
    free(sorted);
    return rc;
}

static inline int tensorfile_open_try(TensorFile *tf, const char *path, char *err, size_t errlen)
{
    memset(tf, 0, sizeof(*tf));
    snprintf(tf->path, sizeof(tf->path), "%s", path);
    int64_t size;
    tf->file = open_regular_file(path, &size, err, errlen);
    if (!tf->file)
        return -1;
    uint64_t file_size = (uint64_t)size;
    char header[64];
    static const char zeros[16] = {0};
    if (file_size < 64 || fread(header, 1, 64, tf->file) != 64)
        return tf_fail_(tf, err, errlen, "'%s' is too short (%llu bytes) to be a .llmt tensor file", path,
                        (unsigned long long)file_size);
    if (memcmp(header, TENSORFILE_MAGIC "\0", 8) != 0)
        return tf_fail_(tf, err, errlen, "'%s' is not a .llmt tensor file (bad magic)", path);
    uint32_t version = tf_u32(header + 8);
    if (version != TENSORFILE_VERSION)
        return tf_fail_(tf, err, errlen,
                        "'%s' has format version %u, this build reads version %d; regenerate it with "
                        "reference/make_reference.py",
                        path, version, TENSORFILE_VERSION);
    if (tf_u32(header + 20) != 0 || memcmp(header + 48, zeros, 16) != 0)
        return tf_fail_(tf, err, errlen, "'%s': the reserved bytes of its header are not zero (corrupt?)", path);
    uint32_t n_meta = tf_u32(header + 12), n_tensors = tf_u32(header + 16);
    uint64_t index_bytes = tf_u64(header + 24), data_offset = tf_u64(header + 32), data_bytes = tf_u64(header + 40);
    /* index_bytes first: 64 + index_bytes must not wrap */
    if (index_bytes > file_size - 64 || data_offset < 64 + index_bytes || data_offset % 64 != 0 ||
        data_offset > file_size || data_bytes != file_size - data_offset)
        return tf_fail_(tf, err, errlen,
                        "'%s' is %llu bytes but its header describes an index of %llu and data of %llu bytes at "
                        "%llu (truncated or corrupt)",
                        path, (unsigned long long)file_size, (unsigned long long)index_bytes,
                        (unsigned long long)data_bytes, (unsigned long long)data_offset);
    if (n_meta > (1u << 20) || n_tensors > (1u << 20))
        return tf_fail_(tf, err, errlen, "'%s' claims %u metadata entries and %u tensors (corrupt header)", path,
                        n_meta, n_tensors);
    tf->index = (char *)malloc_check(index_bytes + 1, "tensor file index");
    if (fread(tf->index, 1, index_bytes, tf->file) != index_bytes)
        return tf_fail_(tf, err, errlen, "'%s': short read of the index", path);
    tf->n_meta = (int)n_meta;
    tf->n_tensors = (int)n_tensors;
    tf->meta_keys = (char **)calloc_check(n_meta + 1, sizeof(char *), "tensor file metadata");
    tf->meta_values = (char **)calloc_check(n_meta + 1, sizeof(char *), "tensor file metadata");
    tf->tensors = (TensorEntry *)calloc_check(n_tensors + 1, sizeof(TensorEntry), "tensor file table");
    TfCursor c = {tf->index, 0, index_bytes};
    for (uint32_t i = 0; i < n_meta; i++) {
        if (tf_take_string(&c, &tf->meta_keys[i]) || tf_take_string(&c, &tf->meta_values[i]))
            return tf_fail_(tf, err, errlen, "'%s': metadata entry %u runs past the index (corrupt file)", path, i);
    }
    for (uint32_t i = 0; i < n_tensors; i++) {
        if (tf_read_entry_(&c, &tf->tensors[i], data_offset, data_bytes, path, i, err, errlen) != 0) {
            tensorfile_close(tf);
            return -1;
        }
    }
    if (c.pos != index_bytes)
        return tf_fail_(tf, err, errlen, "'%s': %llu bytes of its index follow the last entry (corrupt)", path,
                        (unsigned long long)(index_bytes - c.pos));
    if (tf_check_overlap_(tf, err, errlen) != 0) {
        tensorfile_close(tf);
        return -1;
    }
    return 0;
}

static inline void tensorfile_open(TensorFile *tf, const char *path)
{
    char err[1536];
    if (tensorfile_open_try(tf, path, err, sizeof(err)) != 0)
        FAIL("%s", err);
}

/* The metadata value for key, or NULL if absent. */
static inline const char *tensorfile_meta(const TensorFile *tf, const char *key)
{
    for (int i = 0; i < tf->n_meta; i++) {
        if (strcmp(tf->meta_keys[i], key) == 0)
            return tf->meta_values[i];
    }
    return NULL;
}

/* The tensor called name, or NULL if absent. */
static inline const TensorEntry *tensorfile_find(const TensorFile *tf, const char *name)
{
    for (int i = 0; i < tf->n_tensors; i++) {
        if (strcmp(tf->tensors[i].name, name) == 0)
            return &tf->tensors[i];
    }
    return NULL;
}

/* Read tensor `name` of the given dtype and element count into dst. */
static inline int tensorfile_read_try(TensorFile *tf, const char *name, int dtype, int64_t numel, void *dst, char *err,
                                      size_t errlen)
{
    const TensorEntry *t = tensorfile_find(tf, name);
    if (!t) {
        snprintf(err, errlen, "'%s' has no tensor '%s'", tf->path, name);
        return -1;
    }
    if (t->dtype != dtype || t->numel != numel) {
        snprintf(err, errlen,
                 "'%s': tensor '%s' is dtype %d with %lld elements, expected dtype %d with %lld "
                 "(does the file belong to this model config?)",
                 tf->path, name, t->dtype, (long long)t->numel, dtype, (long long)numel);
        return -1;
    }
    if (fseeko(tf->file, (off_t)t->offset, SEEK_SET) != 0 ||
        fread(dst, 1, (size_t)t->nbytes, tf->file) != (size_t)t->nbytes) {
        snprintf(err, errlen, "'%s': short read of tensor '%s'", tf->path, name);
        return -1;
    }
    return 0;
}

static inline void tensorfile_read(TensorFile *tf, const char *name, int dtype, int64_t numel, void *dst)
{
    char err[1536];
    if (tensorfile_read_try(tf, name, dtype, numel, dst, err, sizeof(err)) != 0)
        FAIL("%s", err);
}

/* Allocate and read a float32 tensor of numel elements. */
static inline float *tensorfile_load_f32(TensorFile *tf, const char *name, int64_t numel)
{
    float *dst = (float *)malloc_check((size_t)numel * sizeof(float), name);
    tensorfile_read(tf, name, TF_FLOAT32, numel, dst);
    return dst;
}

#endif /* LLMC_TENSORFILE_H */
