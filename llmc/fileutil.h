/*
 * fileutil.h: the small file helpers that the on-disk formats (safetensors,
 * config.json, train_state, checkpoint directories) share: bounded path
 * formatting, little-endian integers, a growable array, mkdir -p, fsync of a
 * path, removal of a flat directory, and a write that is fsync'ed before it
 * counts as done.
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

#include "utils.h"

#define CKPT_PATH_MAX 1024

#define CKPT_ERR(...)                                                                                                  \
    do {                                                                                                               \
        ckpt_path(err, errlen, __VA_ARGS__);                                                                           \
        goto fail;                                                                                                     \
    } while (0)

static inline void ckpt_put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static inline void ckpt_put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t ckpt_get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static inline uint64_t ckpt_get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* array, with room for one more element after its first n (capacity *cap, doubled when full). */
static inline void *ckpt_grow(void *array, int n, int *cap, size_t element_size, const char *for_path)
{
    if (n < *cap)
        return array;
    *cap = *cap ? 2 * *cap : 16;
    array = realloc(array, (size_t)*cap * element_size);
    if (!array)
        FAIL("out of host memory reading '%s'", for_path);
    return array;
}

/* snprintf for paths: -1 if it did not fit (vsnprintf, so that gcc does not
 * warn about the truncation that the return value reports). */
static inline int ckpt_path(char *out, size_t n, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    int r = vsnprintf(out, n, fmt, args);
    va_end(args);
    return r < 0 || (size_t)r >= n ? -1 : 0;
}

/* mkdir -p */
static inline int ckpt_mkdirs(const char *path)
{
    char buf[CKPT_PATH_MAX];
    ckpt_path(buf, sizeof(buf), "%s", path);
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

static inline int ckpt_fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* Remove a directory and the plain files in it (checkpoints hold nothing else). */
static inline int ckpt_remove_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return -1;
    struct dirent *e;
    char buf[CKPT_PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        ckpt_path(buf, sizeof(buf), "%s/%s", path, e->d_name);
        unlink(buf);
    }
    closedir(d);
    return rmdir(path);
}

static inline int ckpt_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Write n bytes to a new file, fsync it, close it. */
static inline int ckpt_write_file(const char *path, const void *data, size_t n, char *err, size_t errlen)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        ckpt_path(err, errlen, "cannot create '%s': %s", path, strerror(errno));
        return -1;
    }
    int ok = fwrite(data, 1, n, f) == n && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        ckpt_path(err, errlen, "cannot write '%s': %s\n  hint: is the disk full?", path, strerror(saved));
        return -1;
    }
    return 0;
}

#endif /* LLMC_FILEUTIL_H */
