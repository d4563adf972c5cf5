/*
 * utils.h: checked wrappers around the C library calls that can fail on bad
 * input (fopen, fread, fseek, malloc), so that every failure prints the file,
 * the line, what failed and a hint, then exits non-zero.
 *
 * Reads and writes nothing but what the wrapped call does. Plain C99; also
 * compiles as CUDA/C++.
 */
#ifndef LLMC_UTILS_H
#define LLMC_UTILS_H

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Targets equal to IGNORE_INDEX (HF's -100) count for no loss: padding, masked prompts
 * (the data loader writes it where a shard's loss mask is 0). */
#define IGNORE_INDEX (-100)

/* Print "error: <message>" plus the source location, then exit(1). */
static inline void fail_at(const char *file, int line, const char *fmt, ...)
{
    va_list args;
    fflush(stdout);
    fprintf(stderr, "error: ");
    va_start(args, fmt);
    vfprintf(stderr, fmt, args);
    va_end(args);
    fprintf(stderr, "\n  (at %s:%d)\n", file, line);
    exit(1);
}
#define FAIL(...) fail_at(__FILE__, __LINE__, __VA_ARGS__)

static inline FILE *fopen_check_at(const char *path, const char *mode, const char *file, int line)
{
    FILE *f = fopen(path, mode);
    if (f == NULL) {
        fail_at(file, line, "cannot open '%s' (mode %s): %s\n  hint: check the path and the permissions", path, mode,
                strerror(errno));
    }
    return f;
}
#define fopen_check(path, mode) fopen_check_at(path, mode, __FILE__, __LINE__)

static inline void fread_check_at(void *dst, size_t size, size_t count, FILE *f, const char *what, const char *file,
                                  int line)
{
    size_t got = fread(dst, size, count, f);
    if (got != count) {
        fail_at(file, line,
                "short read of %s: wanted %zu items of %zu bytes, got %zu (%s)\n"
                "  hint: the file is truncated or corrupt; regenerate it",
                what, count, size, got, feof(f) ? "end of file" : strerror(errno));
    }
}
#define fread_check(dst, size, count, f, what) fread_check_at(dst, size, count, f, what, __FILE__, __LINE__)

static inline void fwrite_check_at(const void *src, size_t size, size_t count, FILE *f, const char *what,
                                   const char *file, int line)
{
    if (fwrite(src, size, count, f) != count) {
        fail_at(file, line, "short write of %s: %s\n  hint: is the disk full?", what, strerror(errno));
    }
}
#define fwrite_check(src, size, count, f, what) fwrite_check_at(src, size, count, f, what, __FILE__, __LINE__)

static inline void fseek_check_at(FILE *f, int64_t offset, int whence, const char *file, int line)
{
    if (fseeko(f, (off_t)offset, whence) != 0) {
        fail_at(file, line, "fseek to %lld failed: %s", (long long)offset, strerror(errno));
    }
}
#define fseek_check(f, offset, whence) fseek_check_at(f, offset, whence, __FILE__, __LINE__)

/* Size of an open file in bytes; leaves the position at the start. */
static inline int64_t file_size_check_at(FILE *f, const char *file, int line)
{
    fseek_check_at(f, 0, SEEK_END, file, line);
    int64_t size = (int64_t)ftello(f);
    fseek_check_at(f, 0, SEEK_SET, file, line);
    return size;
}
#define file_size_check(f) file_size_check_at(f, __FILE__, __LINE__)

/* p grown (or shrunk) to bytes, its contents kept, or a new block when p is NULL; out of memory: an error naming
 * what the memory was for. */
static inline void *realloc_check_at(void *p, size_t bytes, const char *what, const char *file, int line)
{
    void *q = realloc(p, bytes);
    if (q == NULL && bytes > 0) {
        fail_at(file, line,
                "out of host memory allocating %zu bytes for %s\n"
                "  hint: reduce the batch size, sequence length or model size",
                bytes, what);
    }
    return q;
}
#define realloc_check(p, bytes, what) realloc_check_at(p, bytes, what, __FILE__, __LINE__)
#define malloc_check(bytes, what) realloc_check_at(NULL, bytes, what, __FILE__, __LINE__)

static inline void *calloc_check_at(size_t count, size_t size, const char *what, const char *file, int line)
{
    void *p = calloc(count, size);
    if (p == NULL && count > 0 && size > 0) {
        fail_at(file, line,
                "out of host memory allocating %zu x %zu bytes for %s\n"
                "  hint: reduce the batch size, sequence length or model size",
                count, size, what);
    }
    return p;
}
#define calloc_check(count, size, what) calloc_check_at(count, size, what, __FILE__, __LINE__)

/* splitmix64: a small, self-contained seeded generator, so that data order and
 * init are the same on every platform and libc. */
static inline uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1): 53 random bits, never exactly 0 so that log() is finite. */
static inline double random_uniform(uint64_t *state)
{
    return ((double)(splitmix64(state) >> 11) + 0.5) / 9007199254740992.0;
}

/* How many of targets[0..n) count for the loss. */
static inline int64_t count_targets(const int *targets, int64_t n)
{
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++)
        count += targets[i] != IGNORE_INDEX;
    return count;
}

#endif /* LLMC_UTILS_H */
