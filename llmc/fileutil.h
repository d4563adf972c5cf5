/*
 * fileutil.h: the small file helpers that the on-disk formats (safetensors,
 * config.json, train_state, checkpoint directories) share: error messages
 * into a caller's buffer, bounded path formatting, little-endian integers, a
 * growable array, mkdir -p, fsync of a path, removal of a flat directory, and
 * a write that is fsync'ed before it counts as done.
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

#endif /* LLMC_FILEUTIL_H */
