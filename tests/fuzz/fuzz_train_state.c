/*
 * fuzz_train_state.c: libFuzzer target for llmc/formats/train_state.h: the header and
 * range table of train_state files and the loader of AdamW moments that tiles
 * the ranges of all ranks' files. The input is one file (train_state.bin), or
 * two (train_state.00000.bin and .00001.bin, as two ranks of ZeRO write them)
 * where it holds the separator "=NEXTFILE="; the parameter count is taken
 * from the first header when it is small (so that the files' other fields are
 * reached), else 1000. Any files must be refused with a message naming the
 * file or the directory, or give moments whose ranges tile [0, total), and for
 * each file that the loader says it read whole, the checksum of the file
 * (hashed as read); never a crash, an overflow or a read past a file.
 * Build and run: make test-fuzz (tests/fuzz/run.sh).
 */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llmc/formats/train_state.h"
#include "tests/fuzz/fuzz_file.h"

#define SEPARATOR "=NEXTFILE="
#define MAX_TOTAL (1 << 16)

static char dir[64], files[3][128];

static void remove_files(void)
{
    for (int i = 0; i < 3; i++)
        unlink(files[i]);
    rmdir(dir);
}

static void expect_named(const char *err)
{
    if (strstr(err, dir) == NULL)
        abort(); /* every error names the file or its directory */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        snprintf(dir, sizeof(dir), "/tmp/fuzz_train_state_%ld", (long)getpid());
        mkdir(dir, 0700);
        snprintf(files[0], sizeof(files[0]), "%s/train_state.bin", dir);
        snprintf(files[1], sizeof(files[1]), "%s/train_state.00000.bin", dir);
        snprintf(files[2], sizeof(files[2]), "%s/train_state.00001.bin", dir);
        atexit(remove_files);
    }
    for (int i = 0; i < 3; i++)
        unlink(files[i]);
    const uint8_t *split = (const uint8_t *)memmem(data, size, SEPARATOR, strlen(SEPARATOR));
    if (split) {
        fuzz_write_file(files[1], data, (size_t)(split - data));
        size_t rest = size - (size_t)(split - data) - strlen(SEPARATOR);
        fuzz_write_file(files[2], split + strlen(SEPARATOR), rest);
    } else {
        fuzz_write_file(files[0], data, size);
    }
    int64_t total = 1000;
    if (size >= 56) {
        uint64_t t = 0;
        for (int i = 55; i >= 48; i--)
            t = (t << 8) | data[i];
        if (t >= 1 && t <= MAX_TOTAL)
            total = (int64_t)t;
    }
    char err[2048];
    CkptStateFile one;
    if (ckpt_read_state(split ? files[1] : files[0], total, &one, err, sizeof(err)) != 0) {
        expect_named(err);
    } else {
        int64_t sum = 0;
        for (int64_t i = 0; i < one.n_ranges; i++) {
            const CkptRange *r = &one.ranges[i];
            if (r->offset < 0 || r->count < 0 || r->offset + r->count > total)
                abort();
            sum += r->count;
        }
        if (sum != one.count)
            abort();
        free(one.ranges);
    }
    /* all the moments, and an overlapping pair of ranges running past the end (ZeRO padding) */
    CkptRange wanted[3] = {{0, total}, {total / 2, total / 3 + 1}, {total - 1, 5}};
    int64_t count = total + total / 3 + 1 + 5;
    float *m = (float *)malloc((size_t)count * sizeof(float)), *v = (float *)malloc((size_t)count * sizeof(float));
    CheckpointState state;
    CkptStateRead *reads = NULL;
    int n_reads = 0;
    if (checkpoint_load_moments_try(dir, total, wanted, 3, m, v, &state, err, sizeof(err)) != 0) {
        expect_named(err);
    } else {
        for (int k = 0; k < 4; k++) { /* the padding past total is zero */
            if (m[count - 4 + k] != 0.0f || v[count - 4 + k] != 0.0f)
                abort();
        }
    }
    /* all the moments once, in order: every file is read whole, hashed as read */
    if (checkpoint_load_moments_read_try(dir, total, wanted, 1, m, v, &state, &reads, &n_reads, err, sizeof(err)) ==
        0) {
        for (int i = 0; i < n_reads; i++) { /* a file read whole has the file's checksum */
            char path[256];
            FileSum sum;
            snprintf(path, sizeof(path), "%s/%s", dir, reads[i].sum.name);
            if (file_xxh64_try(path, &sum, err, sizeof(err)) != 0 || sum.size != reads[i].sum.size || !reads[i].whole ||
                sum.xxh64 != reads[i].sum.xxh64)
                abort();
        }
        free(reads);
    }
    free(m);
    free(v);
    return 0;
}
