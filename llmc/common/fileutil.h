/*
 * fileutil.h: the small file helpers that the on-disk formats (safetensors,
 * config.json, train_state, checkpoint directories) share: error messages
 * into a caller's buffer, bounded path formatting, little-endian integers, a
 * growable array, mkdir -p, fsync of a path, removal of a flat directory, a
 * write that is fsync'ed before it counts as done, and XXH64, the checksum of
 * checkpoint files (checkpoint.h): computed over the bytes as they are written
 * or read (Xxh64), or by reading a whole file (file_xxh64_try).
 *
 * Functions returning int give 0, or -1 (with a message in err where they
 * take one). Reads and writes only the files and buffers it is given. Plain C
 * (POSIX); compiles as C++ too.
 */
#ifndef LLMC_FILEUTIL_H
#define LLMC_FILEUTIL_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "llmc/common/utils.h"

/* The longest path (with its NUL) that the checkpoint code builds. */
#define LLMC_PATH_MAX 1024

/* Formats a message into err (cut to errlen) and returns -1, so that a failing
 * function can end with `return set_error(err, errlen, "...", ...)`. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static inline int
set_error(char *err, size_t errlen, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(err, errlen, fmt, args);
    va_end(args);
    return -1;
}

/* snprintf for paths: -1 if the result did not fit. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static inline int
path_format(char *out, size_t n, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    int r = vsnprintf(out, n, fmt, args);
    va_end(args);
    return r < 0 || (size_t)r >= n ? -1 : 0;
}

static inline void put_u32le(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static inline void put_u64le(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t get_u32le(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static inline uint64_t get_u64le(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* array, with room for one more element after its first n (capacity *cap, doubled when full). */
static inline void *grow_array(void *array, int n, int *cap, size_t element_size, const char *what)
{
    if (n < *cap)
        return array;
    *cap = *cap ? 2 * *cap : 16;
    array = realloc(array, (size_t)*cap * element_size);
    if (!array)
        FAIL("out of host memory growing %s", what);
    return array;
}

/* mkdir -p */
static inline int make_dirs(const char *path)
{
    char buf[LLMC_PATH_MAX];
    if (path_format(buf, sizeof(buf), "%s", path) != 0) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

static inline int fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* Remove a directory and the plain files in it (checkpoints hold nothing else). */
static inline int remove_flat_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return -1;
    struct dirent *e;
    char buf[LLMC_PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (path_format(buf, sizeof(buf), "%s/%s", path, e->d_name) == 0)
            unlink(buf);
    }
    closedir(d);
    return rmdir(path);
}

static inline int path_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Write n bytes to a new file, fsync it, close it. */
static inline int write_file_synced(const char *path, const void *data, size_t n, char *err, size_t errlen)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return set_error(err, errlen, "cannot create '%s': %s", path, strerror(errno));
    int ok = fwrite(data, 1, n, f) == n && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    ok = (fclose(f) == 0) && ok;
    if (!ok)
        return set_error(err, errlen, "cannot write '%s': %s\n  hint: is the disk full?", path, strerror(saved));
    return 0;
}

/* Opens a regular file for reading and gives its size; NULL with a message
 * naming the file otherwise (a directory or a FIFO is refused, not waited on). */
static inline FILE *open_regular_file(const char *path, int64_t *size, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        set_error(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        set_error(err, errlen, "'%s' is not a regular file", path);
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        set_error(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        return NULL;
    }
    *size = (int64_t)st.st_size;
    return f;
}

/* ---- XXH64 ----
 * xxHash's 64-bit hash (seed 0), as xxhsum -H1 (xxh64sum) prints it, written
 * out from its specification (github.com/Cyan4973/xxHash, doc/xxhash_spec.md):
 * 8 to 20 GB/s on one core, so that hashing a checkpoint costs little beside
 * writing it. Not cryptographic: it catches corruption, edits and mix-ups, not
 * an adversary who can rewrite the manifest too. Streaming: xxh64_init, then
 * xxh64_update with the bytes in order (any split gives the same hash), then
 * xxh64_digest. */
typedef struct {
    uint64_t acc[4];
    uint64_t total;           /* bytes given so far */
    unsigned char stripe[32]; /* a partial stripe, waiting for the rest */
    size_t buffered;
} Xxh64;

#define XXH64_P1 0x9E3779B185EBCA87ull
#define XXH64_P2 0xC2B2AE3D27D4EB4Full
#define XXH64_P3 0x165667B19E3779F9ull
#define XXH64_P4 0x85EBCA77C2B2AE63ull
#define XXH64_P5 0x27D4EB2F165667C5ull

static inline uint64_t xxh64_rotl_(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}
static inline uint64_t xxh64_read64_(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}
static inline uint32_t xxh64_read32_(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}
static inline uint64_t xxh64_round_(uint64_t acc, uint64_t lane)
{
    return xxh64_rotl_(acc + lane * XXH64_P2, 31) * XXH64_P1;
}
static inline uint64_t xxh64_merge_(uint64_t h, uint64_t acc)
{
    return (h ^ xxh64_round_(0, acc)) * XXH64_P1 + XXH64_P4;
}

static inline void xxh64_init(Xxh64 *h)
{
    memset(h, 0, sizeof(*h));
    h->acc[0] = XXH64_P1 + XXH64_P2;
    h->acc[1] = XXH64_P2;
    h->acc[2] = 0;
    h->acc[3] = 0 - XXH64_P1;
}

/* Whole stripes of 32 bytes, n a multiple of 32. */
static inline void xxh64_stripes_(Xxh64 *h, const unsigned char *p, size_t n)
{
    uint64_t a0 = h->acc[0], a1 = h->acc[1], a2 = h->acc[2], a3 = h->acc[3];
    for (const unsigned char *end = p + n; p < end; p += 32) {
        a0 = xxh64_round_(a0, xxh64_read64_(p));
        a1 = xxh64_round_(a1, xxh64_read64_(p + 8));
        a2 = xxh64_round_(a2, xxh64_read64_(p + 16));
        a3 = xxh64_round_(a3, xxh64_read64_(p + 24));
    }
    h->acc[0] = a0;
    h->acc[1] = a1;
    h->acc[2] = a2;
    h->acc[3] = a3;
}

static inline void xxh64_update(Xxh64 *h, const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
    h->total += n;
    if (h->buffered > 0) { /* complete the waiting stripe first */
        size_t take = 32 - h->buffered < n ? 32 - h->buffered : n;
        memcpy(h->stripe + h->buffered, p, take);
        h->buffered += take;
        p += take;
        n -= take;
        if (h->buffered < 32)
            return;
        xxh64_stripes_(h, h->stripe, 32);
        h->buffered = 0;
    }
    size_t whole = n / 32 * 32;
    xxh64_stripes_(h, p, whole);
    memcpy(h->stripe, p + whole, n - whole);
    h->buffered = n - whole;
}

static inline uint64_t xxh64_digest(const Xxh64 *h)
{
    uint64_t v;
    if (h->total >= 32) {
        v = xxh64_rotl_(h->acc[0], 1) + xxh64_rotl_(h->acc[1], 7) + xxh64_rotl_(h->acc[2], 12) +
            xxh64_rotl_(h->acc[3], 18);
        for (int i = 0; i < 4; i++)
            v = xxh64_merge_(v, h->acc[i]);
    } else {
        v = XXH64_P5; /* the seed, 0, plus P5 */
    }
    v += h->total;
    const unsigned char *p = h->stripe, *end = h->stripe + h->buffered;
    for (; end - p >= 8; p += 8)
        v = xxh64_rotl_(v ^ xxh64_round_(0, xxh64_read64_(p)), 27) * XXH64_P1 + XXH64_P4;
    if (end - p >= 4) {
        v = xxh64_rotl_(v ^ (uint64_t)xxh64_read32_(p) * XXH64_P1, 23) * XXH64_P2 + XXH64_P3;
        p += 4;
    }
    for (; p < end; p++)
        v = xxh64_rotl_(v ^ (uint64_t)*p * XXH64_P5, 11) * XXH64_P1;
    v ^= v >> 33;
    v *= XXH64_P2;
    v ^= v >> 29;
    v *= XXH64_P3;
    v ^= v >> 32;
    return v;
}

/* XXH64 of data[0..n). */
static inline uint64_t xxh64(const void *data, size_t n)
{
    Xxh64 h;
    xxh64_init(&h);
    xxh64_update(&h, data, n);
    return xxh64_digest(&h);
}

/* fwrite of n bytes that also feeds them to h (NULL: none); 1 when all were written. */
static inline int fwrite_hashed(const void *data, size_t n, FILE *f, Xxh64 *h)
{
    if (h)
        xxh64_update(h, data, n);
    return fwrite(data, 1, n, f) == n;
}

/* A file's checksum: its name in its directory, its size and its XXH64. */
typedef struct {
    char name[256];
    int64_t size;
    uint64_t xxh64;
} FileSum;

/* sum->name: the file name of path (after its last '/'), cut to fit. */
static inline void file_sum_name(FileSum *sum, const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    size_t n = strlen(name);
    if (n >= sizeof(sum->name))
        n = sizeof(sum->name) - 1;
    memcpy(sum->name, name, n);
    sum->name[n] = '\0';
}

/* *sum of the regular file at path (its name: the part after the last '/'),
 * read whole in blocks of 1 MiB; -1 with a message naming the file. */
static inline int file_xxh64_try(const char *path, FileSum *sum, char *err, size_t errlen)
{
    enum { BLOCK = 1 << 20 };
    FILE *f = open_regular_file(path, &sum->size, err, errlen);
    if (!f)
        return -1;
    file_sum_name(sum, path);
    unsigned char *buf = (unsigned char *)malloc_check(BLOCK, "checksum buffer");
    Xxh64 h;
    xxh64_init(&h);
    int64_t got = 0;
    size_t n;
    while ((n = fread(buf, 1, BLOCK, f)) > 0) {
        xxh64_update(&h, buf, n);
        got += (int64_t)n;
    }
    int bad = ferror(f) || got != sum->size;
    fclose(f);
    free(buf);
    if (bad)
        return set_error(err, errlen, "cannot read '%s' to check its checksum (read %lld of %lld bytes)", path,
                         (long long)got, (long long)sum->size);
    sum->xxh64 = xxh64_digest(&h);
    return 0;
}

/* The whole regular file at path (at most max_bytes) in *text (NUL-terminated,
 * the caller frees) and its length, with its checksum in *sum (NULL: none):
 * one read for both. */
static inline int read_file_hashed_try(const char *path, size_t max_bytes, char **text, size_t *len, FileSum *sum,
                                       char *err, size_t errlen)
{
    int64_t size;
    *text = NULL;
    FILE *f = open_regular_file(path, &size, err, errlen);
    if (!f)
        return -1;
    if ((uint64_t)size > max_bytes) {
        fclose(f);
        return set_error(err, errlen, "'%s' is %lld bytes, more than the %zu expected of it", path, (long long)size,
                         max_bytes);
    }
    char *buf = (char *)malloc_check((size_t)size + 1, "file text");
    size_t got = fread(buf, 1, (size_t)size, f);
    fclose(f);
    if (got != (size_t)size) {
        free(buf);
        return set_error(err, errlen, "short read of '%s'", path);
    }
    buf[size] = '\0';
    if (sum) {
        file_sum_name(sum, path);
        sum->size = size;
        sum->xxh64 = xxh64(buf, (size_t)size);
    }
    *text = buf;
    *len = (size_t)size;
    return 0;
}

#endif /* LLMC_FILEUTIL_H */
