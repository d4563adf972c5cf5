/*
 * fuzz_file.h: for the fuzz targets whose readers take paths: a file of this
 * process under /tmp (removed at exit) and the input written to it; a write
 * that fails aborts, which the fuzzer reports.
 */
#ifndef FUZZ_FILE_H
#define FUZZ_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char fuzz_path_[128];

static void fuzz_remove_path_(void)
{
    unlink(fuzz_path_);
}

/* "/tmp/fuzz_<pid>_<name>", the same on every call of one process. */
static const char *fuzz_file_path(const char *name)
{
    if (!fuzz_path_[0]) {
        snprintf(fuzz_path_, sizeof(fuzz_path_), "/tmp/fuzz_%ld_%s", (long)getpid(), name);
        atexit(fuzz_remove_path_);
    }
    return fuzz_path_;
}

static void fuzz_write_file(const char *path, const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);
}

#endif /* FUZZ_FILE_H */
